// BATCH_MATMUL: output lane (batches n, y; row x; column c of the NHWC view) is the sum over the
// depth of a[row, k] * b[k, column], in f32; batches broadcast (coordinates modulo each input's
// batch sizes).  axes = (a's row axis, a's depth axis, b's depth axis, b's column axis).
fn lane_value(element: i32) -> f32 {
  let rest = element / p.dst_c;
  let at = vec4<i32>(rest / (p.dst_d.x * p.dst_d.y), (rest / p.dst_d.x) % p.dst_d.y, rest % p.dst_d.x,
                     element % p.dst_c);
  var ia = vec4<i32>(at.x % p.a_d.w, at.y % p.a_d.y, 0, 0);
  var ib = vec4<i32>(at.x % p.b_d.w, at.y % p.b_d.y, 0, 0);
  ia[p.axes.x] = at.z;
  ib[p.axes.w] = at.w;
  var total = 0.0;
  for (var k = 0; k < p.depth; k++) {
    ia[p.axes.y] = k;
    ib[p.axes.z] = k;
    total += a_lane(lidx(p.a_d, ia.x, ia.y, ia.z, ia.w)) * b_lane(lidx(p.b_d, ib.x, ib.y, ib.z, ib.w));
  }
  return total;
}
