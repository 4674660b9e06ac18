// A partition output the host reads: PHWC4 gathered into NHWC float32, so the mapped bytes
// are the array the host wants.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.src_d);
  let v = src_at(i);
  let first = ((o.n * p.src_d.y + o.y) * p.src_d.x + o.x) * p.src_c + o.s * 4;
  for (var lane = 0; lane < min(4, p.src_c - o.s * 4); lane++) {
    host[first + lane] = v[lane];
  }
}
