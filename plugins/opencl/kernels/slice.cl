// STRIDED_SLICE and PAD as one affine gather: output coordinate o reads input
// coordinate begin + o * step on each axis (x, y, channel, n); coordinates outside
// the input read zero (PAD's value).
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id, int in_channels,
                          int4 begin, int4 step EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  int ix = begin.x + x * step.x, iy = begin.y + y * step.y, in_n = begin.w + n * step.w;
  FLT4 v = (FLT4)(0);
  if (ix >= 0 && ix < id.x && iy >= 0 && iy < id.y && in_n >= 0 && in_n < id.w) {
    int c0 = begin.z + s * 4 * step.z;
    if (step.z == 1 && (c0 & 3) == 0 && c0 >= 0 && c0 + 4 <= id.z * 4) {
      v = LOAD4(in, vec_index(id, in_n, iy, ix, c0 >> 2));
    } else {
      FLT lanes[4] = {0, 0, 0, 0};
      for (int l = 0; l < 4; ++l) {
        int c = c0 + l * step.z;
        if (c >= 0 && c < in_channels) lanes[l] = LOAD1(in, lane_index(id, in_n, iy, ix, c));
      }
      v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
    }
  }
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
