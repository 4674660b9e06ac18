// ARG_MAX and ARG_MIN: each output lane scans its line of the input along `axis` (n, h, w, c of the
// NHWC view) and keeps the index of the first largest value of sign * input (sign -1: smallest).
// keep = the input's shape with that axis as 1, matched to output lanes through NHWC order.
fn lane_value(element: i32) -> f32 {
  let k = p.keep;
  var at = vec4<i32>(element / (k.y * k.z * k.w), (element / (k.z * k.w)) % k.y, (element / k.w) % k.z,
                     element % k.w);
  var best = 0.0;
  var index = 0;
  for (var i = 0; i < p.length; i++) {
    at[p.axis] = i;
    let value = p.sign * src_lane(lidx(p.src_d, at.x, at.y, at.z, at.w));
    if (i == 0 || value > best) {
      best = value;
      index = i;
    }
  }
  return f32(index);
}
