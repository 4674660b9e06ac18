// CUMSUM: each output lane sums its line of the input along `axis` (n, h, w, c of the NHWC view;
// `length` values) up to itself, in fp32: from the start, or from the end with reverse = 1, and
// without itself with exclusive = 1.
fn lane_value(element: i32) -> f32 {
  let d = p.dst_d;
  var at = vec4<i32>(element / (d.y * d.x * p.dst_c), (element / (d.x * p.dst_c)) % d.y, (element / p.dst_c) % d.x,
                     element % p.dst_c);
  let here = at[p.axis];
  let first = select(0, here + p.exclusive, p.reverse == 1);
  let last = select(here + 1 - p.exclusive, p.length, p.reverse == 1);
  var sum = 0.0;
  for (var i = first; i < last; i++) {
    at[p.axis] = select(i, first + last - 1 - i, p.reverse == 1);
    sum += src_lane(lidx(p.src_d, at.x, at.y, at.z, at.w));
  }
  return sum;
}
