// BATCH_MATMUL: output lane (batches n, y; row x; column c of the NHWC view) is the sum over the
// depth of a[row, k] * b[k, column], in fp32; batches broadcast (coordinates modulo each input's
// batch sizes).  axes = (a's row axis, a's depth axis, b's depth axis, b's column axis).
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(a), int4 ad,
                          int a_channels, AT(b), int4 bd, int b_channels, int4 axes,
                          int depth EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, a); BIND(const STORAGE, b);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  float lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int ia[4] = {n % ad.w, y % ad.y, 0, 0}, ib[4] = {n % bd.w, y % bd.y, 0, 0};
    ia[axes.x] = x;
    ib[axes.w] = s * 4 + l;
    float total = 0.0f;
    for (int k = 0; k < depth; ++k) {
      ia[axes.y] = k;
      ib[axes.z] = k;
      total += (float)LOAD1(a, lane_index(ad, ia[0], ia[1], ia[2], ia[3])) *
               (float)LOAD1(b, lane_index(bd, ib[0], ib[1], ib[2], ib[3]));
    }
    lanes[l] = total;
  }
  FLT4 v = TO_FLT4((float4)(lanes[0], lanes[1], lanes[2], lanes[3]));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
