// MEAN over the rows and columns of one image (global average pooling): one workgroup per
// output slice, its invocations striding over the pixels with whole vectors, summed in f32.
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let s = i32(wid.x);
  let d = p.src_d;
  let plane = d.x * d.y;
  var total = V(0.0);
  for (var i = i32(li); i < plane; i += i32(WG)) {
    total += src_at(s * plane + i);
  }
  let sum = workgroup_reduce(total, li, false);
  if (li == 0u) {
    emit(sum / f32(plane), Pos(0, 0, 0, s));
  }
}
