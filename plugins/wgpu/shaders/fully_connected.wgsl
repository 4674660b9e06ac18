// FULLY_CONNECTED: one work item per (row, output slice); rows are the pixels of the input
// and output in order.  weights: [S_out][S_in][input lane] vectors of 4 output channels.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let row = (o.n * p.dst_d.y + o.y) * p.dst_d.x + o.x;
  let d = p.src_d;
  let plane = d.x * d.y;
  var at = vidx(d, row / plane, (row % plane) / d.x, row % d.x, 0);
  var w = o.s * d.z * 4;
  var acc = bias_at(o.s);
  for (var si = 0; si < d.z; si++) {
    let v = src_at(at);
    acc += v.x * weights_at(w) + v.y * weights_at(w + 1) + v.z * weights_at(w + 2) + v.w * weights_at(w + 3);
    at += plane;
    w += 4;
  }
  emit(acc, o);
}
