// SOFTMAX over the channels of each pixel, in fp32: exp((v - max) * beta) / sum.  GROUP
// items (local dimension 0) share a pixel's slices and combine its max and sum in local
// memory; local dimension 1 picks the pixel.
__kernel __attribute__((reqd_work_group_size(GROUP, REDUCTIONS, 1)))
void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                 int in_channels, float beta EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  __local float4 scratch[REDUCTIONS][GROUP];
  int t = get_local_id(0), pixel = get_global_id(1);
  int x = pixel % od.x, y = pixel / od.x % od.y, n = pixel / (od.x * od.y);
  int slices = n < od.w ? od.z : 0;  // items past the last pixel only help synchronise
  int4 lane = (int4)(0, 1, 2, 3);
  __local float4* mine = scratch[get_local_id(1)];
  float4 peak = (float4)(-INFINITY);
  for (int s = t; s < slices; s += GROUP) {
    float4 v = TO_ACC4(LOAD4(in, vec_index(od, n, y, x, s)));
    peak = max(peak, select((float4)(-INFINITY), v, lane + s * 4 < out_channels));
  }
  mine[t] = peak;
  group_max(mine, t, GROUP);
  peak = mine[0];
  float top = max(max(peak.x, peak.y), max(peak.z, peak.w));
  barrier(CLK_LOCAL_MEM_FENCE);  // everyone has read the max before the sums overwrite it
  float4 total = (float4)(0.0f);
  for (int s = t; s < slices; s += GROUP) {
    float4 e = exp((TO_ACC4(LOAD4(in, vec_index(od, n, y, x, s))) - top) * beta);
    total += select((float4)(0.0f), e, lane + s * 4 < out_channels);
  }
  mine[t] = total;
  group_sum(mine, t, GROUP);
  total = mine[0];
  float sum = total.x + total.y + total.z + total.w;
  for (int s = t; s < slices; s += GROUP) {
    FLT4 v = TO_FLT4(exp((TO_ACC4(LOAD4(in, vec_index(od, n, y, x, s))) - top) * beta) / sum);
    EPILOGUE(v, n, y, x, s);
    STORE_OUT(v, out, od, out_channels, n, y, x, s);
  }
}
