// TRANSPOSE: input axis j (n, y, x, c of its NHWC view) is output axis axes[j]; each output
// lane reads its element from the input coordinate those axes give.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels, int aligned,
                          int4 axes EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int at[4] = {n, y, x, s * 4 + l};
    lanes[l] = LOAD1(in, lane_index(id, at[axes.x], at[axes.y], at[axes.z], at[axes.w]));
  }
  FLT4 v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
