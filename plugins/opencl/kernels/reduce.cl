// SUM, MEAN, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY and REDUCE_ALL over any axes: each output
// lane combines its region in fp32 (REDUCE_INIT(first), REDUCE(total, value), REDUCE_FINISH(total, count)
// from delegate.gpu.dialect).
// keep = the output shape with the reduced axes kept as 1 (n, h, w, c); reduce = 1 for each reduced
// axis, else 0.  Lanes are matched to keep through their position in NHWC order.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels, int4 keep, int4 reduce EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  float lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int e = ((n * od.y + y) * od.x + x) * out_channels + s * 4 + l;
    int4 at = (int4)(e / (keep.y * keep.z * keep.w), e / (keep.z * keep.w) % keep.y, e / keep.w % keep.z, e % keep.w);
    int4 first = select(at, (int4)(0), reduce != 0);
    int4 last = select(at + 1, (int4)(id.w, id.y, id.x, in_channels), reduce != 0);
    float total = REDUCE_INIT((float)LOAD1(in, lane_index(id, first.x, first.y, first.z, first.w)));
    for (int a = first.x; a < last.x; ++a)
      for (int b = first.y; b < last.y; ++b)
        for (int c = first.z; c < last.z; ++c)
          for (int d = first.w; d < last.w; ++d) {
            float value = (float)LOAD1(in, lane_index(id, a, b, c, d));
            total = REDUCE(total, value);
          }
    float count = (float)((last.x - first.x) * (last.y - first.y) * (last.z - first.z) * (last.w - first.w));
    lanes[l] = REDUCE_FINISH(total, count);
  }
  FLT4 v = TO_FLT4((float4)(lanes[0], lanes[1], lanes[2], lanes[3]));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
