// MediaPipe's MaxPoolingWithArgmax2D: each output lane keeps the first largest input of its window
// clipped to the input (window = (kernel w, kernel h, stride x, stride y), spacing = (pad x, pad y)),
// clamped to bounds = (low, high); `indices` gets its place in the window, ky * kernel w + kx, plus 0.1
// as MediaPipe stores it (truncating it back is exact).
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels, AT(indices), int4 xd, int indices_channels, int4 window,
                          int4 spacing, float4 bounds EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); BIND(STORAGE, indices);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  int x0 = x * window.z - spacing.x, y0 = y * window.w - spacing.y;
  float4 best = (float4)(-FLT_MAX);
  float4 place = (float4)(0.0f);
  for (int ky = max(0, -y0); ky < min(window.y, id.y - y0); ++ky) {
    for (int kx = max(0, -x0); kx < min(window.x, id.x - x0); ++kx) {
      float4 v = convert_float4(LOAD4(in, vec_index(id, n, y0 + ky, x0 + kx, s)));
      int4 larger = isgreater(v, best);
      best = select(best, v, larger);
      place = select(place, (float4)((float)(ky * window.x + kx)), larger);
    }
  }
  FLT4 v = TO_FLT4(clamp(best, bounds.x, bounds.y));
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
  STORE4(mask_tail(TO_FLT4(place + 0.1f), s, indices_channels), indices, vec_index(xd, n, y, x, s));
}
