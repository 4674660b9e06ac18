// DEPTHWISE_CONV_2D: output channel c filters input channel c / multiplier.
// weights: [S_out][KH][KW] vectors of 4 output channels.
// geometry = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, dilation_x, dilation_y).
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id, int multiplier,
                          __global const STORAGE* weights, __global const STORAGE* bias,
                          int4 geometry, int4 spacing EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT4 acc = LOAD4(bias, s);
  int x0 = x * geometry.z - spacing.x, y0 = y * geometry.w - spacing.y;
  int c = s * 4;
  for (int ky = 0; ky < geometry.y; ++ky) {
    int iy = y0 + ky * spacing.w;
    if (iy < 0 || iy >= id.y) continue;
    for (int kx = 0; kx < geometry.x; ++kx) {
      int ix = x0 + kx * spacing.z;
      if (ix < 0 || ix >= id.x) continue;
      FLT4 v;
      if (multiplier == 1) {
        v = LOAD4(in, vec_index(id, n, iy, ix, s));
      } else {  // gather the input channel of each output lane
        int last = out_channels - 1;
        v = (FLT4)(LOAD1(in, lane_index(id, n, iy, ix, min(c, last) / multiplier)),
                   LOAD1(in, lane_index(id, n, iy, ix, min(c + 1, last) / multiplier)),
                   LOAD1(in, lane_index(id, n, iy, ix, min(c + 2, last) / multiplier)),
                   LOAD1(in, lane_index(id, n, iy, ix, min(c + 3, last) / multiplier)));
      }
      acc += v * LOAD4(weights, (s * geometry.y + ky) * geometry.x + kx);
    }
  }
  FLT4 v = acc;
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
