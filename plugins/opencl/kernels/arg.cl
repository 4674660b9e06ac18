// ARG_MAX and ARG_MIN: each output lane scans its line of the input along `axis` (n, h, w, c of
// the NHWC view; `length` values) and keeps the index of the first largest value of sign * input
// (sign = -1: smallest).  keep = the input's shape with that axis as 1, matched to output lanes
// through NHWC order.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels, int4 keep, int axis, int length, float sign EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  float lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int e = ((n * od.y + y) * od.x + x) * out_channels + s * 4 + l;
    int at[4] = {e / (keep.y * keep.z * keep.w), e / (keep.z * keep.w) % keep.y, e / keep.w % keep.z, e % keep.w};
    float best = 0.0f;
    int index = 0;
    for (int i = 0; i < length; ++i) {
      at[axis] = i;
      float value = sign * (float)LOAD1(in, lane_index(id, at[0], at[1], at[2], at[3]));
      if (i == 0 || value > best) {
        best = value;
        index = i;
      }
    }
    lanes[l] = (float)index;
  }
  FLT4 v = TO_FLT4((float4)(lanes[0], lanes[1], lanes[2], lanes[3]));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
