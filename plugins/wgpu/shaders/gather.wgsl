// Data movement (RESHAPE, PAD, STRIDED_SLICE, CONCATENATION, DEPTH_TO_SPACE): every output
// element is copied from the input element `source` names (input -1: a zero).  Coordinates
// are (n, y, x, c) in each tensor's NHWC view.  With aligned = 1 the mapping moves whole
// slices (channel offsets are multiples of 4), so a work item copies one vector.
struct Src { input: i32, at: vec4<i32> }

// Position of an output element in NHWC order.
fn flat_index(at: vec4<i32>) -> i32 {
  return ((at.x * p.dst_d.y + at.y) * p.dst_d.x + at.z) * p.dst_c + at.w;
}

$MAP

$READ

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  if (p.aligned == 1) {
    emit(read_vec(source(vec4<i32>(o.n, o.y, o.x, o.s * 4))), o);
    return;
  }
  var v = V(0.0);
  for (var lane = 0; lane < min(4, p.dst_c - o.s * 4); lane++) {
    v[lane] = read_lane(source(vec4<i32>(o.n, o.y, o.x, o.s * 4 + lane)));
  }
  emit(v, o);
}
