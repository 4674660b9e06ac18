// ONE_HOT: output elements in NHWC order are (outer, d, inner), walk = (depth, inner size); each is
// `on_value` where the index at (outer, inner) of `in` (the float view of the indices) equals d, else `off_value`.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels, int4 walk, float on_value, float off_value EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  float lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int e = ((n * od.y + y) * od.x + x) * out_channels + s * 4 + l;
    int d = (e / walk.y) % walk.x;
    int i = (e / (walk.x * walk.y)) * walk.y + e % walk.y;
    float index = (float)LOAD1(in, lane_index(id, i / (id.y * id.x * in_channels), (i / (id.x * in_channels)) % id.y,
                                              (i / in_channels) % id.x, i % in_channels));
    lanes[l] = index == (float)d ? on_value : off_value;
  }
  FLT4 v = TO_FLT4((float4)(lanes[0], lanes[1], lanes[2], lanes[3]));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
