// MediaPipe's MaxUnpooling2D as a gather: each output lane takes the value of the last input pixel (in
// row-major order) whose window holds it and whose index (truncated) is its place there, ky * kernel w + kx;
// zero where none is.  window = (kernel w, kernel h, stride x, stride y), spacing = (pad x, pad y).
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels, AT(indices), int4 xd, int indices_channels,
                          int4 window, int4 spacing EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); BIND(const STORAGE, indices);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  int py = y + spacing.y, px = x + spacing.x;
  int y_first = py >= window.y ? (py - window.y + window.w) / window.w : 0;
  int x_first = px >= window.x ? (px - window.x + window.z) / window.z : 0;
  int y_last = min(py / window.w, id.y - 1), x_last = min(px / window.z, id.x - 1);
  float4 v = (float4)(0.0f);
  for (int iy = y_first; iy <= y_last; ++iy) {
    for (int ix = x_first; ix <= x_last; ++ix) {
      int4 place = convert_int4_rtz(convert_float4(LOAD4(indices, vec_index(xd, n, iy, ix, s))));
      int4 hit = place == (int4)((py - iy * window.w) * window.x + px - ix * window.z);
      v = select(v, convert_float4(LOAD4(in, vec_index(id, n, iy, ix, s))), hit);
    }
  }
  FLT4 r = TO_FLT4(v);
  EPILOGUE(r, n, y, x, s);
  STORE_OUT(r, out, od, out_channels, n, y, x, s);
}
