// DEPTHWISE_CONV_2D: output channel c filters input channel c / multiplier.  One work item
// computes 4 horizontally adjacent output vectors, sharing each tap vector it loads.  The
// filter size is fixed at compile time (KH x KW), so the taps unroll.
// weights: [S_out][KH][KW] vectors of 4 output channels.
// geometry = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, dilation_x, dilation_y).
#ifndef DEPTHWISE_TAP  // once per program, however many variants of this template it holds
// A tap at column ix of row iy, or zero left or right of the row (reading the edge, times zero).
#define DEPTHWISE_TAP(ix) (depthwise_input(in, id, n, iy, clamp((ix), 0, id.x - 1), s, multiplier, out_channels) * \
                           (FLT)((ix) >= 0 && (ix) < id.x))
#endif

__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels, int multiplier,
                          AT(weights), AT(bias),
                          int4 geometry, int4 spacing EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); BIND(const STORAGE, weights); BIND(const STORAGE, bias);
  int x0 = get_global_id(0) * 4, y = get_global_id(1), z = get_global_id(2);
  if (x0 >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT4 a0 = LOAD4(bias, s), a1 = a0, a2 = a0, a3 = a0;
  int sx = geometry.z, ix0 = x0 * sx - spacing.x, y0 = y * geometry.w - spacing.y;
  for (int ky = 0; ky < KH; ++ky) {
    int iy = y0 + ky * spacing.w;
    if (iy < 0 || iy >= id.y) continue;
    for (int kx = 0; kx < KW; ++kx) {
      int ix = ix0 + kx * spacing.z;
      FLT4 w = LOAD4(weights, (s * KH + ky) * KW + kx);
      a0 += w * DEPTHWISE_TAP(ix);
      a1 += w * DEPTHWISE_TAP(ix + sx);
      a2 += w * DEPTHWISE_TAP(ix + 2 * sx);
      a3 += w * DEPTHWISE_TAP(ix + 3 * sx);
    }
  }
  FLT4 results[4] = {a0, a1, a2, a3};
  for (int i = 0; i < 4 && x0 + i < od.x; ++i) {
    int x = x0 + i;
    FLT4 v = results[i];
    EPILOGUE(v, n, y, x, s);
    STORE_OUT(v, out, od, out_channels, n, y, x, s);
  }
}
