// SELECT and SELECT_V2: input a where the condition holds, else input b; each input is broadcast
// to the output by taking coordinates modulo its sizes (NHWC views).
#ifndef SELECT_LANE_DEFINED  // once per program, however many variants include this template
#define SELECT_LANE_DEFINED
inline int select_lane(int4 d, int channels, int4 at) {
  int4 b = at % (int4)(d.w, d.y, d.x, channels);
  return lane_index(d, b.x, b.y, b.z, b.w);
}
#endif

__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(cond), int4 cd, int cond_channels,
                          AT(a), int4 ad, int a_channels,
                          AT(b), int4 bd, int b_channels, int aligned EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, cond); BIND(const STORAGE, a); BIND(const STORAGE, b);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int4 at = (int4)(n, y, x, s * 4 + l);
    lanes[l] = LOAD1(cond, select_lane(cd, cond_channels, at)) != 0 ? LOAD1(a, select_lane(ad, a_channels, at))
                                                                     : LOAD1(b, select_lane(bd, b_channels, at));
  }
  FLT4 v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
