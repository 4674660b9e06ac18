// Elementwise ops and chains of them: the first input, broadcast to the output shape,
// goes through the epilogue, which applies the ops themselves.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  emit(broadcast_src(o), o);
}
