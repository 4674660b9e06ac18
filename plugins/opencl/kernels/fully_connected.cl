// FULLY_CONNECTED: every row (all axes but the channels) times the weight matrix.
// Row r is pixel r of the input and of the output, whatever their H x W split.
// weights: [S_out][S_in][4 input lanes] vectors of 4 output channels.
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id,
                          __global const STORAGE* weights, __global const STORAGE* bias,
                          int rows EPILOGUE_PARAMS) {
  int r = get_global_id(0), s = get_global_id(1);
  if (r >= rows || s >= od.z) return;
  int in_plane = id.x * id.y, out_plane = od.x * od.y;
  int src = (r / in_plane) * id.z * in_plane + r % in_plane;
  FLT4 acc = LOAD4(bias, s);
  int w = s * id.z * 4;
  for (int si = 0; si < id.z; ++si, src += in_plane, w += 4) {
    FLT4 v = LOAD4(in, src);
    acc += v.x * LOAD4(weights, w) + v.y * LOAD4(weights, w + 1) + v.z * LOAD4(weights, w + 2) +
           v.w * LOAD4(weights, w + 3);
  }
  int n = r / out_plane, p = r % out_plane, y = p / od.x, x = p % od.x;
  FLT4 v = acc;
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
