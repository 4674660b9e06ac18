// CONV_2D: one work item per output vector (4 output channels at one pixel).
// weights: [S_out][KH][KW][S_in][input lane] vectors of 4 output channels, as
// delegate.gpu.layout.pack_conv_weights lays them out; window = (kernel w, kernel h,
// stride x, stride y), spacing = (pad x, pad y, dilation x, dilation y).
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let d = p.src_d;
  let plane = d.x * d.y;
  let y0 = o.y * p.window.w - p.spacing.y;
  let x0 = o.x * p.window.z - p.spacing.x;
  var acc = bias_at(o.s);
  for (var ky = 0; ky < p.window.y; ky++) {
    let iy = y0 + ky * p.spacing.w;
    if (iy < 0 || iy >= d.y) { continue; }
    for (var kx = 0; kx < p.window.x; kx++) {
      let ix = x0 + kx * p.spacing.z;
      if (ix < 0 || ix >= d.x) { continue; }
      var at = vidx(d, o.n, iy, ix, 0);
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
