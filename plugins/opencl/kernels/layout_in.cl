// A partition input arrives as the caller's NHWC float32 array, uploaded as is; this
// moves it into PHWC4 storage on the device (zero padding lanes, half when stored so).
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels, __global const float* in) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z, c = s * 4;
  __global const float* src = in + ((n * od.y + y) * od.x + x) * out_channels + c;
  float4 v;
  if (c + 4 <= out_channels) {
    v = vload4(0, src);
  } else {
    int left = out_channels - c;
    v = (float4)(src[0], left > 1 ? src[1] : 0.0f, left > 2 ? src[2] : 0.0f, 0.0f);
  }
  STORE4(TO_FLT4(v), out, vec_index(od, n, y, x, s));
}
