// SOFTMAX over the channels of one pixel, in fp32: exp((v - max) * beta) / sum.
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, float beta EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), n = get_global_id(2);
  if (x >= od.x || y >= od.y || n >= od.w) return;
  int4 lane = (int4)(0, 1, 2, 3);
  float4 peak = (float4)(-INFINITY);
  for (int s = 0; s < od.z; ++s) {
    float4 v = TO_ACC4(LOAD4(in, vec_index(od, n, y, x, s)));
    peak = max(peak, select((float4)(-INFINITY), v, lane + s * 4 < out_channels));
  }
  float top = max(max(peak.x, peak.y), max(peak.z, peak.w));
  float4 total = (float4)(0.0f);
  for (int s = 0; s < od.z; ++s) {
    float4 e = exp((TO_ACC4(LOAD4(in, vec_index(od, n, y, x, s))) - top) * beta);
    total += select((float4)(0.0f), e, lane + s * 4 < out_channels);
  }
  float sum = total.x + total.y + total.z + total.w;
  for (int s = 0; s < od.z; ++s) {
    FLT4 v = TO_FLT4(exp((TO_ACC4(LOAD4(in, vec_index(od, n, y, x, s))) - top) * beta) / sum);
    EPILOGUE(v, n, y, x, s);
    STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
  }
}
