// DEPTHWISE_CONV_2D: output channel c reads input channel c / multiplier.  Each invocation
// computes one slice at RM horizontally adjacent output pixels, loading each tap's weights once.
// weights: [S_out][KH][KW] vectors of 4 output channels; window and spacing as for CONV_2D.
// Grid: pixel groups along x, output rows along y, (image, slice) along z.
const RM: i32 = ${RM};
const MULTIPLIER: i32 = ${MULTIPLIER};

fn input_vec(n: i32, y: i32, x: i32, s: i32) -> VA {
  let d = p.src_d;
  if (MULTIPLIER == 1) {
    return VA(src[vidx(d, n, y, x, s)]);
  }
  let c = min((vec4<i32>(s * 4) + vec4<i32>(0, 1, 2, 3)) / MULTIPLIER, vec4<i32>(p.src_c - 1));
  return VA(V(src_lane(lidx(d, n, y, x, c.x)), src_lane(lidx(d, n, y, x, c.y)),
              src_lane(lidx(d, n, y, x, c.z)), src_lane(lidx(d, n, y, x, c.w))));
}

@compute @workgroup_size(WG_X, WG_Y, WG_Z)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let x0 = i32(gid.x) * RM;
  let y = i32(gid.y);
  let n = i32(gid.z) / p.dst_d.z;
  let s = i32(gid.z) % p.dst_d.z;
  if (x0 >= p.dst_d.x || y >= p.dst_d.y || n >= p.dst_d.w) { return; }
  let d = p.src_d;
  var acc: array<VA, RM>;
  for (var ky = 0; ky < p.window.y; ky++) {
    let iy = y * p.window.w - p.spacing.y + ky * p.spacing.w;
    if (iy < 0 || iy >= d.y) { continue; }
    for (var kx = 0; kx < p.window.x; kx++) {
      let w = VA(weights[(s * p.window.y + ky) * p.window.x + kx]);
      for (var r = 0; r < RM; r++) {
        let ix = (x0 + r) * p.window.z - p.spacing.x + kx * p.spacing.z;
        if (ix >= 0 && ix < d.x) {
          acc[r] += input_vec(n, iy, ix, s) * w;
        }
      }
    }
  }
  let bias = bias_at(s);
  for (var r = 0; r < RM; r++) {
    if (x0 + r >= p.dst_d.x) { break; }
    emit(V(acc[r]) + bias, Pos(n, y, x0 + r, s));
  }
}
