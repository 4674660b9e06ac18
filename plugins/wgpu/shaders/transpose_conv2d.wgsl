// TRANSPOSE_CONV and Convolution2DTransposeBias, gathered per output pixel: input pixel iy
// contributes to output row y through kernel row ky when iy * stride + ky - pad == y, so only the
// kernel rows ky = (y + pad) mod stride, + stride, ... take part (columns alike).  Each invocation
// computes RN output slices of one pixel, reusing every input vector RN times.
// weights: [S_out][KH][KW][S_in][input lane] as for CONV_2D; window = (kernel w, kernel h,
// stride x, stride y), spacing = (pad x, pad y, 0, 0).
// Grid: columns along x, rows along y, (image, slice group) along z.
const RN: i32 = ${RN};

@compute @workgroup_size(WG_X, WG_Y, WG_Z)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let x = i32(gid.x);
  let y = i32(gid.y);
  let groups = (p.dst_d.z + RN - 1) / RN;
  let n = i32(gid.z) / groups;
  let slice0 = (i32(gid.z) % groups) * RN;
  if (x >= p.dst_d.x || y >= p.dst_d.y || n >= p.dst_d.w) { return; }
  let d = p.src_d;
  let plane = d.x * d.y;
  let taps = p.window.x * p.window.y;
  var first: array<i32, RN>;  // weight block of each slice's first tap and input slice
  for (var j = 0; j < RN; j++) {
    first[j] = min(slice0 + j, p.dst_d.z - 1) * taps * d.z * 4;
  }
  var acc: array<VA, RN>;
  let ty = y + p.spacing.y;
  let tx = x + p.spacing.x;
  for (var ky = ty % p.window.w; ky < p.window.y && ky <= ty; ky += p.window.w) {
    let iy = (ty - ky) / p.window.w;
    if (iy >= d.y) { continue; }
    for (var kx = tx % p.window.z; kx < p.window.x && kx <= tx; kx += p.window.z) {
      let ix = (tx - kx) / p.window.z;
      if (ix >= d.x) { continue; }
      let at = vidx(d, n, iy, ix, 0);
      let tap = (ky * p.window.x + kx) * d.z * 4;
      for (var si = 0; si < d.z; si++) {
        let v = VA(src[at + si * plane]);
        for (var j = 0; j < RN; j++) {
          acc[j] += weight_block(first[j] + tap + si * 4) * v;
        }
      }
    }
  }
  for (var j = 0; j < RN; j++) {
    let s = slice0 + j;
    if (s < p.dst_d.z) {
      emit(V(acc[j]) + bias_at(s), Pos(n, y, x, s));
    }
  }
}
