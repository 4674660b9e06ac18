// MediaPipe's MaxUnpooling2D as a gather: each output lane takes the value of the last input pixel (in
// row-major order) whose window holds it and whose index (truncated) is its place there, ky * kernel w + kx;
// zero where none is.  window = (kernel w, kernel h, stride x, stride y), spacing = (pad x, pad y).
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let w = p.window;
  let py = o.y + p.spacing.y;
  let px = o.x + p.spacing.x;
  let y_first = select(0, (py - w.y + w.w) / w.w, py >= w.y);
  let x_first = select(0, (px - w.x + w.z) / w.z, px >= w.x);
  let y_last = min(py / w.w, p.src_d.y - 1);
  let x_last = min(px / w.z, p.src_d.x - 1);
  var v = V(0.0);
  for (var iy = y_first; iy <= y_last; iy++) {
    for (var ix = x_first; ix <= x_last; ix++) {
      let place = vec4<i32>(indices_at(vidx(p.indices_d, o.n, iy, ix, o.s)));
      let hit = place == vec4<i32>((py - iy * w.w) * w.x + px - ix * w.z);
      v = select(v, src_at(vidx(p.src_d, o.n, iy, ix, o.s)), hit);
    }
  }
  emit(v, o);
}
