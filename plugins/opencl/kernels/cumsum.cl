// CUMSUM: each output lane sums its line of the input along `axis` (n, h, w, c of the NHWC view;
// `length` values) up to itself, in fp32: from the start, or from the end with reverse = 1, and
// without itself with exclusive = 1.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels, int axis, int length, int exclusive, int reverse EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  float lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int at[4] = {n, y, x, s * 4 + l};
    int here = at[axis];
    int first = reverse ? here + exclusive : 0, last = reverse ? length : here + 1 - exclusive;
    float sum = 0.0f;
    for (int i = first; i < last; ++i) {
      at[axis] = reverse ? first + last - 1 - i : i;
      sum += (float)LOAD1(in, lane_index(id, at[0], at[1], at[2], at[3]));
    }
    lanes[l] = sum;
  }
  FLT4 v = TO_FLT4((float4)(lanes[0], lanes[1], lanes[2], lanes[3]));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
