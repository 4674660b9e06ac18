// Two 1x1 convolutions of one pixel per image, the first's result (after hidden_steps, its
// activations) kept in workgroup memory for the second: the bottleneck of a squeeze-and-excitation
// block in one dispatch.  One workgroup per image; invocations take output slices in turn.
// weights: both layers' 4x4 blocks (pack_conv_weights), the second's from block p.second;
// bias: both layers' biases, the second's after the first's HIDDEN slices.
const HIDDEN: i32 = ${HIDDEN};

var<workgroup> hidden: array<VA, HIDDEN>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let n = i32(wid.x);
  let d = p.src_d;
  for (var s = i32(li); s < HIDDEN; s += i32(WG)) {
    var acc = VA(0.0);
    for (var si = 0; si < d.z; si++) {
      acc += weight_block((s * d.z + si) * 4) * VA(src[vidx(d, n, 0, 0, si)]);
    }
    hidden[s] = VA(mask_tail(hidden_steps(V(acc) + bias_at(s)), s, p.hidden_c));
  }
  workgroupBarrier();
  for (var s = i32(li); s < p.dst_d.z; s += i32(WG)) {
    var acc = VA(0.0);
    for (var si = 0; si < HIDDEN; si++) {
      acc += weight_block(p.second + (s * HIDDEN + si) * 4) * hidden[si];
    }
    emit(V(acc) + bias_at(HIDDEN + s), Pos(n, 0, 0, s));
  }
}
