// The product of matmul.cl for at most 4 rows (a batch-1 FULLY_CONNECTED, a 1x1 convolution
// of one pixel): too few rows to tile, so the sum over the input vectors is what is spread.
// Work group g computes output slice g of all ROWS rows: item t adds input vectors t,
// t + GROUP, ... (reading the weights in order across the group) and the group adds the
// items' partial sums in local memory.  Same arguments and weight layout as matmul.cl.

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(weights),
                 AT(bias), int rows, int depth, int in_plane, int out_plane,
                 AT(in) EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, weights); BIND(const STORAGE, bias); BIND(const STORAGE, in);
  __local ACC4 partial[ROWS][GROUP];
  int t = get_local_id(0), s = get_group_id(0);
  int base[ROWS];
  ACC4 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    base[r] = (r / in_plane) * depth * in_plane + r % in_plane;
    acc[r] = (ACC4)(0.0f);
  }
  for (int k = t; k < depth; k += GROUP) {
    int w = (s * depth + k) * 4;
    ACC4 w0 = TO_ACC4(LOAD4(weights, w)), w1 = TO_ACC4(LOAD4(weights, w + 1));
    ACC4 w2 = TO_ACC4(LOAD4(weights, w + 2)), w3 = TO_ACC4(LOAD4(weights, w + 3));
    for (int r = 0; r < ROWS; ++r) {
      ACC4 v = TO_ACC4(LOAD4(in, base[r] + k * in_plane));
      acc[r] += v.x * w0 + v.y * w1 + v.z * w2 + v.w * w3;
    }
  }
  for (int r = 0; r < ROWS; ++r) partial[r][t] = acc[r];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int half_size = GROUP / 2; half_size > 0; half_size /= 2) {
    if (t < half_size) {
      for (int r = 0; r < ROWS; ++r) partial[r][t] += partial[r][t + half_size];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int r = t; r < ROWS; r += GROUP) {
    int n = r / out_plane, p = r % out_plane, y = p / od.x, x = p % od.x;
    FLT4 v = TO_FLT4(partial[r][0]) + LOAD4(bias, s);
    EPILOGUE(v, n, y, x, s);
    STORE_OUT(v, out, od, out_channels, n, y, x, s);
  }
}
