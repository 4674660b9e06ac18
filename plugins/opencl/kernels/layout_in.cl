// A partition input arrives as the caller's NHWC array (float32, or with HOST_INPUT a quantized
// input's integers, dequantized here with `dequant`), uploaded as is; this moves it into PHWC4
// storage on the device (zero padding lanes, half when stored so).
#if defined(HOST_INPUT)
#define LAYOUT_IN_T HOST_INPUT
#define LAYOUT_IN_DEQUANT , float4 dequant
#define LAYOUT_IN_Q dequant
#else
#define LAYOUT_IN_T float
#define LAYOUT_IN_DEQUANT
#define LAYOUT_IN_Q (float4)(1.0f, 0.0f, 0.0f, 0.0f)
#endif
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in) LAYOUT_IN_DEQUANT) {
  BIND(STORAGE, out); BIND(const LAYOUT_IN_T, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  STORE4(HOST_READ(LAYOUT_IN_T)(in, od, out_channels, LAYOUT_IN_Q, n, y, x, s), out, vec_index(od, n, y, x, s));
}
#undef LAYOUT_IN_T
#undef LAYOUT_IN_DEQUANT
#undef LAYOUT_IN_Q
