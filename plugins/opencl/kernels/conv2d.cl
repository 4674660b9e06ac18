// CONV_2D: one work item computes 4 horizontally adjacent output vectors (x0..x0+3, y,
// slice s of image n), so each weight vector it loads serves four outputs.
// weights: [S_out][KH][KW][S_in][4 input lanes] vectors of 4 output channels.
// geometry = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, dilation_x, dilation_y).
// With HOST_INPUT the input is the partition's, read in host order from the caller's bytes (no
// conversion kernel before this one; see host_vector in the prelude).
#ifndef CONV_TAP  // once per program, however many variants of this template it holds
#define CONV_TAP(acc, v, w0, w1, w2, w3) acc += (v).x * (w0) + (v).y * (w1) + (v).z * (w2) + (v).w * (w3)
#endif
#if defined(HOST_INPUT)  // HOST_CHANNELS channels: the slice loop and each read's lanes unroll
#define CONV_INPUT AT(in), int4 id, int in_channels, float4 dequant
#define CONV_INPUT_BIND BIND(const HOST_INPUT, in)
#define CONV_READ(row, c) HOST_READ(HOST_INPUT)(in, id, HOST_CHANNELS, dequant, n, iy, c, si)
#define CONV_SLICES ((HOST_CHANNELS + 3) / 4)
#else
#define CONV_INPUT AT(in), int4 id, int in_channels
#define CONV_INPUT_BIND BIND(const STORAGE, in)
#define CONV_READ(row, c) LOAD4(in, (row) + (c))
#define CONV_SLICES id.z
#endif

__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, CONV_INPUT, AT(weights), AT(bias),
                          int4 geometry, int4 spacing EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); CONV_INPUT_BIND; BIND(const STORAGE, weights); BIND(const STORAGE, bias);
  int x0 = get_global_id(0) * 4, y = get_global_id(1), z = get_global_id(2);
  if (x0 >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT4 a0 = LOAD4(bias, s), a1 = a0, a2 = a0, a3 = a0;
  int plane = id.x * id.y, sx = geometry.z;
  int ix0 = x0 * sx - spacing.x, y0 = y * geometry.w - spacing.y;
  for (int ky = 0; ky < geometry.y; ++ky) {
    int iy = y0 + ky * spacing.w;
    if (iy < 0 || iy >= id.y) continue;
    for (int kx = 0; kx < geometry.x; ++kx) {
      int ix = ix0 + kx * spacing.z;
      // Taps outside the image read a clamped column and are multiplied by zero.
      FLT m0 = ix >= 0 && ix < id.x, m1 = ix + sx >= 0 && ix + sx < id.x;
      FLT m2 = ix + 2 * sx >= 0 && ix + 2 * sx < id.x, m3 = ix + 3 * sx >= 0 && ix + 3 * sx < id.x;
      int c0 = clamp(ix, 0, id.x - 1), c1 = clamp(ix + sx, 0, id.x - 1);
      int c2 = clamp(ix + 2 * sx, 0, id.x - 1), c3 = clamp(ix + 3 * sx, 0, id.x - 1);
      int row = vec_index(id, n, iy, 0, 0);
      int w = ((s * geometry.y + ky) * geometry.x + kx) * id.z * 4;
      for (int si = 0; si < CONV_SLICES; ++si, row += plane, w += 4) {
        FLT4 w0 = LOAD4(weights, w), w1 = LOAD4(weights, w + 1), w2 = LOAD4(weights, w + 2),
             w3 = LOAD4(weights, w + 3);
        CONV_TAP(a0, CONV_READ(row, c0) * m0, w0, w1, w2, w3);
        CONV_TAP(a1, CONV_READ(row, c1) * m1, w0, w1, w2, w3);
        CONV_TAP(a2, CONV_READ(row, c2) * m2, w0, w1, w2, w3);
        CONV_TAP(a3, CONV_READ(row, c3) * m3, w0, w1, w2, w3);
      }
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
#undef CONV_INPUT
#undef CONV_INPUT_BIND
#undef CONV_READ
#undef CONV_SLICES
