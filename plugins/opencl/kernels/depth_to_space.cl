// DEPTH_TO_SPACE: output (x, y, c) comes from input (x / b, y / b) at channel
// ((y % b) * b + x % b) * C_out + c.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels, int aligned,
                          int block EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  int base = ((y % block) * block + x % block) * out_channels;
  FLT lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    lanes[l] = LOAD1(in, lane_index(id, n, y / block, x / block, base + s * 4 + l));
  }
  FLT4 v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
