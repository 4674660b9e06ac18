// Data movement: every output element is copied from the input element that the variant's
// mapping (MAP_<name>, one per kit template) names for the output coordinate at = (n, y, x, c),
// both in NHWC views; coordinates outside the input read zero.  With aligned = 1 the mapping
// moves whole vectors (channel offsets are multiples of 4), so a work item copies one.
//   MAP_TILE            at modulo the input's sizes
//   MAP_SPACE_TO_DEPTH  channel block (dy * b + dx) of pixel (y, x) is pixel (y * b + dy, x * b + dx)
//   MAP_MIRROR_PAD      mirrored back into the input without the edge (REFLECT) or with it (symmetric = 1)
//   MAP_RESIZE_NEAREST  the input pixel under the output pixel: scale = input pixels per output pixel (x, y),
//                       rounding as LiteRT's kernel does
//   MAP_UNPACK          the input axis `axis` set to `index`, the others from at (which has one axis fewer)
//   MAP_PAD             at - before (zeros outside the input)
//   MAP_SLICE           output elements in NHWC order walk the slice (length per axis) from start by step
//   MAP_PACK_PART       the output vectors whose axis `axis` is `index`, from that input (the coordinate
//                       without the axis); `axis` is not the channel axis, so a vector comes from one input
#if defined(MAP_TILE)
#define MAP_PARAMS
#elif defined(MAP_SPACE_TO_DEPTH)
#define MAP_PARAMS , int block
#elif defined(MAP_MIRROR_PAD)
#define MAP_PARAMS , int4 before, int symmetric
#elif defined(MAP_RESIZE_NEAREST)
#define MAP_PARAMS , float4 scale, int align, int half_pixel
#elif defined(MAP_UNPACK)
#define MAP_PARAMS , int axis, int index
#elif defined(MAP_PAD)
#define MAP_PARAMS , int4 before
#elif defined(MAP_SLICE)
#define MAP_PARAMS , int4 start, int4 step, int4 length
#elif defined(MAP_PACK_PART)
#define MAP_PARAMS , int axis, int index
#endif

__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels, __global const STORAGE* in, int4 id,
                          int in_channels, int aligned MAP_PARAMS EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
#if defined(MAP_PACK_PART)
  int here[4] = {n, y, x, s};
  if (here[axis] != index) return;
#endif
  int4 size = (int4)(id.w, id.y, id.x, in_channels);
  FLT lanes[4] = {0, 0, 0, 0};
  FLT4 v = (FLT4)(0);
  int count = aligned ? 1 : min(4, out_channels - s * 4);
  for (int l = 0; l < count; ++l) {
    int4 at = (int4)(n, y, x, s * 4 + l);
#if defined(MAP_TILE)
    int4 src = at % size;
#elif defined(MAP_SPACE_TO_DEPTH)
    int tap = at.w / in_channels;
    int4 src = (int4)(at.x, at.y * block + tap / block, at.z * block + tap % block, at.w % in_channels);
#elif defined(MAP_MIRROR_PAD)
    int4 i = at - before;
    int4 low = select(i, -i - symmetric, i < 0);
    int4 src = select(low, 2 * size - 2 + symmetric - low, low >= size);
#elif defined(MAP_RESIZE_NEAREST)
    float offset = half_pixel ? 0.5f : 0.0f;
    float fy = ((float)at.y + offset) * scale.y, fx = ((float)at.z + offset) * scale.x;
    int iy = (int)(align ? round(fy) : floor(fy)), ix = (int)(align ? round(fx) : floor(fx));
    int4 src = (int4)(at.x, max(min(iy, id.y - 1), 0), max(min(ix, id.x - 1), 0), at.w);
#elif defined(MAP_UNPACK)
    int c[4] = {at.x, at.y, at.z, at.w};
    int a[4];
    for (int j = 0, k = 1; j < 4; ++j) a[j] = j == axis ? index : c[k++];
    int4 src = (int4)(a[0], a[1], a[2], a[3]);
#elif defined(MAP_PAD)
    int4 src = at - before;
#elif defined(MAP_SLICE)
    int flat = ((at.x * od.y + at.y) * od.x + at.z) * out_channels + at.w;
    int4 walked = (int4)(flat / (length.y * length.z * length.w), (flat / (length.z * length.w)) % length.y,
                         (flat / length.w) % length.z, flat % length.w);
    int4 src = start + walked * step;
#elif defined(MAP_PACK_PART)
    int c[4] = {at.x, at.y, at.z, at.w};
    int a[4] = {0, 0, 0, 0};
    for (int j = 0, k = 1; j < 4; ++j) if (j != axis) a[k++] = c[j];
    int4 src = (int4)(a[0], a[1], a[2], a[3]);
#endif
    int inside = all(src >= 0) && all(src < size);
    if (aligned) {
      if (inside) v = LOAD4(in, vec_index(id, src.x, src.y, src.z, src.w >> 2));
    } else if (inside) {
      lanes[l] = LOAD1(in, lane_index(id, src.x, src.y, src.z, src.w));
    }
  }
  if (!aligned) v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE4(mask_tail(v, s, out_channels), out, vec_index(od, n, y, x, s));
}
#undef MAP_PARAMS
