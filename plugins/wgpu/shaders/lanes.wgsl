// One thread per output vector: each of its (up to) four lanes is the `lane_value` of its element, which
// the kernel defines.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let first = ((o.n * p.dst_d.y + o.y) * p.dst_d.x + o.x) * p.dst_c + o.s * 4;
  var v = V(0.0);
  for (var lane = 0; lane < min(4, p.dst_c - o.s * 4); lane++) {
    v[lane] = lane_value(first + lane);
  }
  emit(v, o);
}
