// Global pooling: the mean (MEAN over rows and columns, AVERAGE_POOL_2D) or the maximum
// (MAX_POOL_2D) of every pixel of an image.  One workgroup per output vector (slice along x,
// image along y), its invocations striding over the pixels with whole vectors, in f32.
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let s = i32(wid.x);
  let n = i32(wid.y);
  let d = p.src_d;
  let plane = d.x * d.y;
  let first = vidx(d, n, 0, 0, s);
  let is_max = p.is_max == 1;
  var acc = V(select(0.0, -3.4e38, is_max));
  for (var i = i32(li); i < plane; i += i32(WG)) {
    acc = combine(acc, src_at(first + i), is_max);
  }
  let total = workgroup_reduce(acc, li, is_max);
  if (li == 0u) {
    emit(select(total / f32(plane), total, is_max), Pos(n, 0, 0, s));
  }
}
