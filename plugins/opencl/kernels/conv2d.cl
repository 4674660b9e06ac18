// CONV_2D: one work item per output vector (x, y, slice s of image n).
// weights: [S_out][KH][KW][S_in][4 input lanes] vectors of 4 output channels.
// geometry = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, dilation_x, dilation_y).
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id,
                          __global const STORAGE* weights, __global const STORAGE* bias,
                          int4 geometry, int4 spacing EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT4 acc = LOAD4(bias, s);
  int plane = id.x * id.y;
  int x0 = x * geometry.z - spacing.x, y0 = y * geometry.w - spacing.y;
  for (int ky = 0; ky < geometry.y; ++ky) {
    int iy = y0 + ky * spacing.w;
    if (iy < 0 || iy >= id.y) continue;
    for (int kx = 0; kx < geometry.x; ++kx) {
      int ix = x0 + kx * spacing.z;
      if (ix < 0 || ix >= id.x) continue;
      int src = vec_index(id, n, iy, ix, 0);
      int w = ((s * geometry.y + ky) * geometry.x + kx) * id.z * 4;
      for (int si = 0; si < id.z; ++si, src += plane, w += 4) {
        FLT4 v = LOAD4(in, src);
        acc += v.x * LOAD4(weights, w) + v.y * LOAD4(weights, w + 1) + v.z * LOAD4(weights, w + 2) +
               v.w * LOAD4(weights, w + 3);
      }
    }
  }
  FLT4 v = acc;
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
