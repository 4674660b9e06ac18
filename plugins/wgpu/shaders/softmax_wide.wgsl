// SOFTMAX over many channels: one workgroup per pixel, its invocations striding over the slices
// for the maximum, the sum and the outputs, all in f32.
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let pixel = i32(wid.x + wid.y * groups.x);
  if (pixel >= p.pixels) { return; }
  let d = p.src_d;
  let plane = d.x * d.y;
  let n = pixel / plane;
  let y = (pixel % plane) / d.x;
  let x = pixel % d.x;
  var top = V(-3.4e38);
  for (var s = i32(li); s < d.z; s += i32(WG)) {
    top = max(top, fill_tail(src_at(vidx(d, n, y, x, s)), s, p.src_c, -3.4e38));
  }
  let most = workgroup_reduce(V(max(max(top.x, top.y), max(top.z, top.w))), li, true).x;
  var total = V(0.0);
  for (var s = i32(li); s < d.z; s += i32(WG)) {
    total += fill_tail(exp((src_at(vidx(d, n, y, x, s)) - most) * p.beta), s, p.src_c, 0.0);
  }
  let sum = dot(workgroup_reduce(total, li, false), V(1.0));
  for (var s = i32(li); s < d.z; s += i32(WG)) {
    emit(exp((src_at(vidx(d, n, y, x, s)) - most) * p.beta) / sum, Pos(n, y, x, s));
  }
}
