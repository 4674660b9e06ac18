// TRANSPOSE_CONV and Convolution2DTransposeBias, gathered per output vector: input pixel iy
// contributes to output row y through kernel row ky when iy * stride + ky - pad == y.
// weights: [S_out][KH][KW][S_in][input lane] as for CONV_2D; window = (kernel w, kernel h,
// stride x, stride y), spacing = (pad x, pad y, 0, 0).
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let d = p.src_d;
  let plane = d.x * d.y;
  var acc = bias_at(o.s);
  for (var ky = 0; ky < p.window.y; ky++) {
    let ty = o.y + p.spacing.y - ky;
    if (ty < 0 || ty % p.window.w != 0 || ty / p.window.w >= d.y) { continue; }
    for (var kx = 0; kx < p.window.x; kx++) {
      let tx = o.x + p.spacing.x - kx;
      if (tx < 0 || tx % p.window.z != 0 || tx / p.window.z >= d.x) { continue; }
      var at = vidx(d, o.n, ty / p.window.w, tx / p.window.z, 0);
      var w = ((o.s * p.window.y + ky) * p.window.x + kx) * d.z * 4;
      for (var si = 0; si < d.z; si++) {
        let v = src_at(at);
        acc += v.x * weights_at(w) + v.y * weights_at(w + 1) + v.z * weights_at(w + 2) + v.w * weights_at(w + 3);
        at += plane;
        w += 4;
      }
    }
  }
  emit(acc, o);
}
