// Input vector i of a matrix product computed where it is read: the output of a depthwise convolution
// (through its activations, depthwise_steps) at the row's pixel, folded into the 1x1 convolution
// reading it.  The rows are that output's pixels (p.src_d); dw_src is the depthwise convolution's
// input, dw_weights and dw_bias its packed weights and bias; window, spacing and multiplier as in
// depthwise_conv2d.wgsl.  Sums in f32.
fn dw_input(n: i32, y: i32, x: i32, s: i32) -> V {
  let d = p.dw_src_d;
  if (p.multiplier == 1) {
    return dw_src_at(vidx(d, n, y, x, s));
  }
  let c = min((vec4<i32>(s * 4) + vec4<i32>(0, 1, 2, 3)) / p.multiplier, vec4<i32>(p.dw_src_c - 1));
  return V(dw_src_lane(lidx(d, n, y, x, c.x)), dw_src_lane(lidx(d, n, y, x, c.y)),
           dw_src_lane(lidx(d, n, y, x, c.z)), dw_src_lane(lidx(d, n, y, x, c.w)));
}

fn matmul_input(i: i32, image: i32, slice: i32) -> VA {
  let pixel = i % (p.src_d.x * p.src_d.y);
  let y = pixel / p.src_d.x;
  let x = pixel % p.src_d.x;
  let d = p.dw_src_d;
  var acc = dw_bias_at(slice);
  for (var ky = 0; ky < p.window.y; ky++) {
    let iy = y * p.window.w - p.spacing.y + ky * p.spacing.w;
    if (iy < 0 || iy >= d.y) { continue; }
    for (var kx = 0; kx < p.window.x; kx++) {
      let ix = x * p.window.z - p.spacing.x + kx * p.spacing.z;
      if (ix >= 0 && ix < d.x) {
        acc += dw_input(image, iy, ix, slice) * dw_weights_at((slice * p.window.y + ky) * p.window.x + kx);
      }
    }
  }
  return VA(depthwise_steps(acc));
}
