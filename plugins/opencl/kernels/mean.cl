// MEAN over any of W, H and the channels (reduce = (x, y, channels, unused) flags), and
// AVERAGE_POOL_2D whose window is the whole input; accumulated in fp32.  The output keeps
// the reduced axes with size 1.  GROUP items (local dimension 0) compute one output vector
// (local dimension 1 picks it): they share the reduced positions and add their partial sums.
__kernel __attribute__((reqd_work_group_size(GROUP, REDUCTIONS, 1)))
void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                 int in_channels, int4 reduce EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  __local float4 scratch[REDUCTIONS][GROUP];
  int t = get_local_id(0), o = get_global_id(1);
  int x = o % od.x, y = o / od.x % od.y, z = o / (od.x * od.y);
  int s = z % od.z, n = z / od.z;
  bool valid = z < od.z * od.w;
  int ex = reduce.x ? id.x : 1, ey = reduce.y ? id.y : 1, es = reduce.z ? id.z : 1;
  ACC4 sum = (ACC4)(0.0f);
  for (int i = t; valid && i < ex * ey * es; i += GROUP) {
    int ix = reduce.x ? i % ex : x, iy = reduce.y ? i / ex % ey : y, si = reduce.z ? i / (ex * ey) : s;
    sum += TO_ACC4(LOAD4(in, vec_index(id, n, iy, ix, si)));
  }
  __local float4* mine = scratch[get_local_id(1)];
  mine[t] = sum;
  group_sum(mine, t, GROUP);
  if (t > 0 || !valid) return;
  sum = mine[0];
  if (reduce.z) sum = (ACC4)(sum.x + sum.y + sum.z + sum.w, 0.0f, 0.0f, 0.0f);  // padding lanes hold zero
  FLT4 v = TO_FLT4(sum / (float)(ex * ey * (reduce.z ? in_channels : 1)));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
