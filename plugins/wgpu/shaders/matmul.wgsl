// Matrix product of pixel rows and 4x4 weight blocks: FULLY_CONNECTED and 1x1 CONV_2D with
// stride 1.  A row is one pixel (n, y, x) of the input and of the output, in order; row r of a
// tensor with planes of P = H * W pixels sits in image r / P at pixel r % P.
// weights: [S_out][S_in][input lane] vectors of 4 output channels (pack_conv_weights).
//
// Each invocation computes RM consecutive rows x RN consecutive output slices, reusing every
// input vector RN times and every weight block RM times.  With KT > 1 the KT invocations along
// x split the input slices between them (interleaved, so neighbours read neighbouring weight
// blocks) and add their partial sums in workgroup memory: layers with few pixels and many
// channels then still occupy the whole device.  Grid: row groups along x, slice groups along y,
// the KT parts of a split along z.
const RM: i32 = ${RM};
const RN: i32 = ${RN};
const KT: i32 = ${KT};
const PARTIALS: u32 = select(1u, WG, KT > 1);

var<workgroup> partial: array<array<VA, RM * RN>, PARTIALS>;

@compute @workgroup_size(WG_X, WG_Y, WG_Z)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let kt = i32(gid.z);
  let row0 = i32(gid.x) * RM;
  let slice0 = i32(gid.y) * RN;
  let d = p.src_d;
  let plane = d.x * d.y;
  let slices_out = p.dst_d.z;
  var at: array<i32, RM>;
  var image: array<i32, RM>;
  for (var r = 0; r < RM; r++) {
    let row = min(row0 + r, p.rows - 1);
    image[r] = row / plane;
    at[r] = image[r] * d.z * plane + row % plane;
  }
  var first: array<i32, RN>;  // weight block of each slice's first input slice
  for (var j = 0; j < RN; j++) {
    first[j] = min(slice0 + j, slices_out - 1) * d.z * 4;
  }
  var acc: array<VA, RM * RN>;
  for (var si = kt; si < d.z; si += KT) {
    var x: array<VA, RM>;
    for (var r = 0; r < RM; r++) {
      x[r] = matmul_input(at[r] + si * plane, image[r], si);
    }
    for (var j = 0; j < RN; j++) {
      let block = weight_block(first[j] + si * 4);
      for (var r = 0; r < RM; r++) {
        acc[r * RN + j] += block * x[r];
      }
    }
  }
  if (KT > 1) {
    partial[li] = acc;
    for (var step = KT / 2; step > 0; step /= 2) {
      workgroupBarrier();
      if (kt < step) {
        for (var e = 0; e < RM * RN; e++) {
          partial[li][e] += partial[li + u32(step) * WG_X * WG_Y][e];
        }
      }
    }
    if (kt != 0) { return; }
    acc = partial[li];
  }
  let out_plane = p.dst_d.x * p.dst_d.y;
  for (var r = 0; r < RM; r++) {
    let row = row0 + r;
    if (row >= p.rows) { break; }
    let pixel = row % out_plane;
    let o = Pos(row / out_plane, pixel / p.dst_d.x, pixel % p.dst_d.x, 0);
    for (var j = 0; j < RN; j++) {
      let s = slice0 + j;
      if (s < slices_out) {
        emit(V(acc[r * RN + j]) + bias_at(s), Pos(o.n, o.y, o.x, s));
      }
    }
  }
}
