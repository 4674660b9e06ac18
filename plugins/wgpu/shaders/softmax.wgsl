// SOFTMAX over channels: one work item per pixel; max, sum and output in f32.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.pixels) { return; }
  let d = p.src_d;
  let plane = d.x * d.y;
  let n = i / plane;
  let y = (i % plane) / d.x;
  let x = i % d.x;
  var top = -3.4e38;
  for (var s = 0; s < d.z; s++) {
    let v = fill_tail(src_at(vidx(d, n, y, x, s)), s, p.src_c, -3.4e38);
    top = max(top, max(max(v.x, v.y), max(v.z, v.w)));
  }
  var total = 0.0;
  for (var s = 0; s < d.z; s++) {
    total += dot(fill_tail(exp((src_at(vidx(d, n, y, x, s)) - top) * p.beta), s, p.src_c, 0.0), V(1.0));
  }
  for (var s = 0; s < d.z; s++) {
    emit(exp((src_at(vidx(d, n, y, x, s)) - top) * p.beta) / total, Pos(n, y, x, s));
  }
}
