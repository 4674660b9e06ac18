// MAX_POOL_2D and AVERAGE_POOL_2D; the average counts only the window cells inside the
// input, as TFLite does.  window and spacing as for CONV_2D (dilation 1).
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let d = p.src_d;
  let y0 = o.y * p.window.w - p.spacing.y;
  let x0 = o.x * p.window.z - p.spacing.x;
  let is_max = p.is_max == 1;
  var acc = V(select(0.0, -3.4e38, is_max));
  var cells = 0;
  for (var iy = max(y0, 0); iy < min(y0 + p.window.y, d.y); iy++) {
    for (var ix = max(x0, 0); ix < min(x0 + p.window.x, d.x); ix++) {
      let v = src_at(vidx(d, o.n, iy, ix, o.s));
      acc = select(acc + v, max(acc, v), is_max);
      cells++;
    }
  }
  emit(select(acc / f32(max(cells, 1)), acc, is_max), o);
}
