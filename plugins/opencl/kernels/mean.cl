// MEAN over any of W, H and the channels (reduce = (x, y, channels, unused) flags),
// accumulated in fp32.  The output has the reduced axes kept with size 1.
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id, int in_channels, int4 reduce EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  int x_begin = reduce.x ? 0 : x, x_end = reduce.x ? id.x : x + 1;
  int y_begin = reduce.y ? 0 : y, y_end = reduce.y ? id.y : y + 1;
  int s_begin = reduce.z ? 0 : s, s_end = reduce.z ? id.z : s + 1;
  ACC4 sum = (ACC4)(0.0f);
  for (int si = s_begin; si < s_end; ++si)
    for (int iy = y_begin; iy < y_end; ++iy)
      for (int ix = x_begin; ix < x_end; ++ix) sum += TO_ACC4(LOAD4(in, vec_index(id, n, iy, ix, si)));
  float count = (float)((x_end - x_begin) * (y_end - y_begin) * (reduce.z ? in_channels : 1));
  if (reduce.z) sum = (ACC4)(sum.x + sum.y + sum.z + sum.w, 0.0f, 0.0f, 0.0f);
  FLT4 v = TO_FLT4(sum / count);
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
