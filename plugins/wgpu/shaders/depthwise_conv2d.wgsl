// DEPTHWISE_CONV_2D: output channel c reads input channel c / multiplier.
// weights: [S_out][KH][KW] vectors of 4 output channels; window and spacing as for CONV_2D.
fn input_vec(n: i32, y: i32, x: i32, s: i32) -> V {
  let d = p.src_d;
  if (p.multiplier == 1) {
    return src_at(vidx(d, n, y, x, s));
  }
  let c = min((vec4<i32>(s * 4) + vec4<i32>(0, 1, 2, 3)) / p.multiplier, vec4<i32>(p.src_c - 1));
  return V(src_lane(lidx(d, n, y, x, c.x)), src_lane(lidx(d, n, y, x, c.y)),
           src_lane(lidx(d, n, y, x, c.z)), src_lane(lidx(d, n, y, x, c.w)));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let d = p.src_d;
  let y0 = o.y * p.window.w - p.spacing.y;
  let x0 = o.x * p.window.z - p.spacing.x;
  var acc = bias_at(o.s);
  for (var ky = 0; ky < p.window.y; ky++) {
    let iy = y0 + ky * p.spacing.w;
    if (iy < 0 || iy >= d.y) { continue; }
    for (var kx = 0; kx < p.window.x; kx++) {
      let ix = x0 + kx * p.spacing.z;
      if (ix < 0 || ix >= d.x) { continue; }
      acc += input_vec(o.n, iy, ix, o.s) * weights_at((o.s * p.window.y + ky) * p.window.x + kx);
    }
  }
  emit(acc, o);
}
