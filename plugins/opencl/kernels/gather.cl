// Data movement where each output lane reads one input element: the variant's define picks
// the mapping from the output coordinate at = (n, y, x, c) (NHWC views) to the input's.
//   MAP_TILE            at modulo the input's sizes
//   MAP_SPACE_TO_DEPTH  channel block (dy * b + dx) of pixel (y, x) is pixel (y * b + dy, x * b + dx); p0.x = b
//   MAP_MIRROR_PAD      p0 = padding ahead of each axis (n, y, x, c); p1.x = 1 for SYMMETRIC, 0 for REFLECT
//   MAP_UNPACK          the input axis p0.x set to p0.y, the others from at (which has one axis fewer)
//   MAP_PACK            the output vectors whose axis p0.x is p0.y, from that input (the coordinate without
//                       the axis); p0.x is not the channel axis, so a vector comes from one input
//   MAP_RESIZE_NEAREST  the input pixel under the output pixel: f0 = input pixels per output pixel (x, y),
//                       p0 = (align_corners, half_pixel_centers), rounding as LiteRT's kernel does
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels, __global const STORAGE* in, int4 id,
                          int in_channels, int4 p0, int4 p1, float4 f0 EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
#if defined(MAP_PACK)
  int here[4] = {n, y, x, s};
  if (here[p0.x] != p0.y) return;
#endif
  int4 size = (int4)(id.w, id.y, id.x, in_channels);
  FLT lanes[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < out_channels; ++l) {
    int4 at = (int4)(n, y, x, s * 4 + l);
#if defined(MAP_TILE)
    int4 src = at % size;
#elif defined(MAP_SPACE_TO_DEPTH)
    int tap = at.w / in_channels;
    int4 src = (int4)(at.x, at.y * p0.x + tap / p0.x, at.z * p0.x + tap % p0.x, at.w % in_channels);
#elif defined(MAP_MIRROR_PAD)
    int4 i = at - p0;
    int4 low = select(i, -i - p1.x, i < 0);
    int4 src = select(low, 2 * size - 2 + p1.x - low, low >= size);
#elif defined(MAP_PACK)
    int c[4] = {at.x, at.y, at.z, at.w};
    int a[4] = {0, 0, 0, 0};
    for (int j = 0, k = 1; j < 4; ++j) if (j != p0.x) a[k++] = c[j];
    int4 src = (int4)(a[0], a[1], a[2], a[3]);
#elif defined(MAP_UNPACK)
    int c[4] = {at.x, at.y, at.z, at.w};
    int a[4];
    for (int j = 0, k = 1; j < 4; ++j) a[j] = j == p0.x ? p0.y : c[k++];
    int4 src = (int4)(a[0], a[1], a[2], a[3]);
#elif defined(MAP_RESIZE_NEAREST)
    float offset = p0.y ? 0.5f : 0.0f;
    float fy = ((float)at.y + offset) * f0.y, fx = ((float)at.z + offset) * f0.x;
    int iy = (int)(p0.x ? round(fy) : floor(fy)), ix = (int)(p0.x ? round(fx) : floor(fx));
    int4 src = (int4)(at.x, max(min(iy, id.y - 1), 0), max(min(ix, id.x - 1), 0), at.w);
#endif
    lanes[l] = LOAD1(in, lane_index(id, src.x, src.y, src.z, src.w));
  }
  FLT4 v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
