// MediaPipe's MaxPoolingWithArgmax2D: each output lane keeps the first largest input of its window
// clipped to the input (window and spacing as for MAX_POOL_2D), clamped to bounds = (low, high);
// `indices` gets its place in the window, ky * kernel w + kx, plus 0.1 as MediaPipe stores it.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let d = p.src_d;
  let y0 = o.y * p.window.w - p.spacing.y;
  let x0 = o.x * p.window.z - p.spacing.x;
  var best = V(-3.4028235e38);
  var place = V(0.0);
  for (var ky = max(0, -y0); ky < min(p.window.y, d.y - y0); ky++) {
    for (var kx = max(0, -x0); kx < min(p.window.x, d.x - x0); kx++) {
      let v = src_at(vidx(d, o.n, y0 + ky, x0 + kx, o.s));
      let larger = v > best;
      best = select(best, v, larger);
      place = select(place, V(f32(ky * p.window.x + kx)), larger);
    }
  }
  indices_store(vidx(p.indices_d, o.n, o.y, o.x, o.s), mask_tail(place + 0.1, o.s, p.indices_c));
  emit(clamp(best, V(p.bounds.x), V(p.bounds.y)), o);
}
