// TRANSPOSE_CONV and Convolution2DTransposeBias, written as a gather: output (x, y)
// sums the inputs (ix, iy) with ix * stride - pad + kx == x for the kernel taps kx.
// weights: [S_out][KH][KW][S_in][4 input lanes] vectors of 4 output channels.
// window = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, 0, 0).
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels,
                          AT(weights), AT(bias),
                          int4 window, int4 spacing EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); BIND(const STORAGE, weights); BIND(const STORAGE, bias);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT4 acc = LOAD4(bias, s);
  int plane = id.x * id.y;
  for (int ky = 0; ky < window.y; ++ky) {
    int ty = y + spacing.y - ky;
    if (ty < 0 || ty % window.w != 0 || ty / window.w >= id.y) continue;
    for (int kx = 0; kx < window.x; ++kx) {
      int tx = x + spacing.x - kx;
      if (tx < 0 || tx % window.z != 0 || tx / window.z >= id.x) continue;
      int src = vec_index(id, n, ty / window.w, tx / window.z, 0);
      int w = ((s * window.y + ky) * window.x + kx) * id.z * 4;
      for (int si = 0; si < id.z; ++si, src += plane, w += 4) {
        FLT4 v = LOAD4(in, src);
        acc += v.x * LOAD4(weights, w) + v.y * LOAD4(weights, w + 1) + v.z * LOAD4(weights, w + 2) +
               v.w * LOAD4(weights, w + 3);
      }
    }
  }
  FLT4 v = acc;
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
