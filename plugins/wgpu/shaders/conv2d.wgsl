// CONV_2D: each invocation computes RM horizontally adjacent output pixels x RN output slices,
// so every weight block it loads serves RM pixels and every input vector RN slices.
// weights: [S_out][KH][KW][S_in][input lane] vectors of 4 output channels, as
// delegate.gpu.layout.pack_conv_weights lays them out; window = (kernel w, kernel h,
// stride x, stride y), spacing = (pad x, pad y, dilation x, dilation y).
// Grid: pixel groups along x, output rows along y, (image, slice group) along z.
// The input is read through src_pixel / src_slice (kernels.py): PHWC4, or a partition input in host
// order from the caller's bytes, SRC_SLICES then its slices at compile time.
const RM: i32 = ${RM};
const RN: i32 = ${RN};

@compute @workgroup_size(WG_X, WG_Y, WG_Z)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let x0 = i32(gid.x) * RM;
  let y = i32(gid.y);
  let groups = (p.dst_d.z + RN - 1) / RN;
  let n = i32(gid.z) / groups;
  let slice0 = (i32(gid.z) % groups) * RN;
  if (x0 >= p.dst_d.x || y >= p.dst_d.y || n >= p.dst_d.w) { return; }
  let d = p.src_d;
  let taps = p.window.x * p.window.y;
  var first: array<i32, RN>;  // weight block of each slice's first tap and input slice
  for (var j = 0; j < RN; j++) {
    first[j] = min(slice0 + j, p.dst_d.z - 1) * taps * d.z * 4;
  }
  var acc: array<VA, RM * RN>;
  for (var ky = 0; ky < p.window.y; ky++) {
    let iy = y * p.window.w - p.spacing.y + ky * p.spacing.w;
    if (iy < 0 || iy >= d.y) { continue; }
    for (var kx = 0; kx < p.window.x; kx++) {
      var at: array<i32, RM>;
      var inside: array<bool, RM>;
      for (var r = 0; r < RM; r++) {
        let ix = (x0 + r) * p.window.z - p.spacing.x + kx * p.spacing.z;
        inside[r] = ix >= 0 && ix < d.x;
        at[r] = src_pixel(n, iy, clamp(ix, 0, d.x - 1));
      }
      let tap = (ky * p.window.x + kx) * d.z * 4;
      for (var si = 0; si < ${SRC_SLICES}; si++) {
        var v: array<VA, RM>;
        for (var r = 0; r < RM; r++) {
          v[r] = select(VA(0.0), VA(src_slice(at[r], si)), inside[r]);
        }
        for (var j = 0; j < RN; j++) {
          let block = weight_block(first[j] + tap + si * 4);
          for (var r = 0; r < RM; r++) {
            acc[r * RN + j] += block * v[r];
          }
        }
      }
    }
  }
  for (var r = 0; r < RM; r++) {
    let x = x0 + r;
    if (x >= p.dst_d.x) { break; }
    for (var j = 0; j < RN; j++) {
      let s = slice0 + j;
      if (s < p.dst_d.z) {
        emit(V(acc[r * RN + j]) + bias_at(s), Pos(n, y, x, s));
      }
    }
  }
}
