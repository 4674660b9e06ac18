// DEPTHWISE_CONV_2D: output channel c filters input channel c / multiplier.  One work item
// computes 4 horizontally adjacent output vectors, sharing each weight vector it loads.
// weights: [S_out][KH][KW] vectors of 4 output channels.
// geometry = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, dilation_x, dilation_y).

#ifndef DEPTHWISE_INPUT  // once per program, however many variants of this template it holds
#define DEPTHWISE_INPUT
// The input vector feeding output slice s at (n, iy, ix), or zero outside the row.
inline FLT4 depthwise_input(__global const STORAGE* in, int4 id, int n, int iy, int ix, int s, int multiplier,
                            int out_channels) {
  if (ix < 0 || ix >= id.x) return (FLT4)(0);
  if (multiplier == 1) return LOAD4(in, vec_index(id, n, iy, ix, s));
  int last = out_channels - 1, c = s * 4;  // gather the input channel of each output lane
  return (FLT4)(LOAD1(in, lane_index(id, n, iy, ix, min(c, last) / multiplier)),
                LOAD1(in, lane_index(id, n, iy, ix, min(c + 1, last) / multiplier)),
                LOAD1(in, lane_index(id, n, iy, ix, min(c + 2, last) / multiplier)),
                LOAD1(in, lane_index(id, n, iy, ix, min(c + 3, last) / multiplier)));
}
#endif

__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id, int multiplier,
                          __global const STORAGE* weights, __global const STORAGE* bias,
                          int4 geometry, int4 spacing EPILOGUE_PARAMS) {
  int x0 = get_global_id(0) * 4, y = get_global_id(1), z = get_global_id(2);
  if (x0 >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT4 a0 = LOAD4(bias, s), a1 = a0, a2 = a0, a3 = a0;
  int sx = geometry.z, ix0 = x0 * sx - spacing.x, y0 = y * geometry.w - spacing.y;
  for (int ky = 0; ky < geometry.y; ++ky) {
    int iy = y0 + ky * spacing.w;
    if (iy < 0 || iy >= id.y) continue;
    for (int kx = 0; kx < geometry.x; ++kx) {
      int ix = ix0 + kx * spacing.z;
      FLT4 w = LOAD4(weights, (s * geometry.y + ky) * geometry.x + kx);
      a0 += w * depthwise_input(in, id, n, iy, ix, s, multiplier, out_channels);
      a1 += w * depthwise_input(in, id, n, iy, ix + sx, s, multiplier, out_channels);
      a2 += w * depthwise_input(in, id, n, iy, ix + 2 * sx, s, multiplier, out_channels);
      a3 += w * depthwise_input(in, id, n, iy, ix + 3 * sx, s, multiplier, out_channels);
    }
  }
  FLT4 results[4] = {a0, a1, a2, a3};
  for (int i = 0; i < 4 && x0 + i < od.x; ++i) {
    int x = x0 + i;
    FLT4 v = results[i];
    EPILOGUE(v, n, y, x, s);
    STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
  }
}
