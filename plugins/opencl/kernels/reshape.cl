// RESHAPE that moves elements between slices: each output lane finds its element by
// its position in NHWC order.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels, int aligned EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int flat = ((n * od.y + y) * od.x + x) * out_channels + s * 4 + l;
    int c = flat % in_channels, rest = flat / in_channels;
    int ix = rest % id.x, iy = (rest / id.x) % id.y, in_n = rest / (id.x * id.y);
    lanes[l] = LOAD1(in, lane_index(id, in_n, iy, ix, c));
  }
  FLT4 v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
