// RESIZE_BILINEAR with TFLite's source coordinates: src = dst * scale, or
// (dst + 0.5) * scale - 0.5 with half-pixel centers; the lower neighbour is clamped
// at 0 and the upper one at the last row/column.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels, float4 scale,
                          int half_pixel EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  float offset = half_pixel ? 0.5f : 0.0f;
  float fx = ((float)x + offset) * scale.x - offset, fy = ((float)y + offset) * scale.y - offset;
  int x0 = max((int)floor(fx), 0), y0 = max((int)floor(fy), 0);
  int x1 = min((int)ceil(fx), id.x - 1), y1 = min((int)ceil(fy), id.y - 1);
  float dx = fx - (float)x0, dy = fy - (float)y0;
  ACC4 top = TO_ACC4(LOAD4(in, vec_index(id, n, y0, x0, s))) * (1.0f - dx) +
             TO_ACC4(LOAD4(in, vec_index(id, n, y0, x1, s))) * dx;
  ACC4 bottom = TO_ACC4(LOAD4(in, vec_index(id, n, y1, x0, s))) * (1.0f - dx) +
                TO_ACC4(LOAD4(in, vec_index(id, n, y1, x1, s))) * dx;
  FLT4 v = TO_FLT4(top * (1.0f - dy) + bottom * dy);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
