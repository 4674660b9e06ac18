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
//   MAP_PAD             at - before (fill outside the input)
//   MAP_SLICE           output elements in NHWC order walk the slice (length per axis) from start by step
//   MAP_SPACE_TO_BATCH  output image b is block offset b / N (row offset, column offset) of input image b % N,
//                       padded by `before` (rows, columns); block = (rows, columns)
//   MAP_BATCH_TO_SPACE  pixel (y, x) + before of image n is pixel (y / block, x / block) of input image
//                       ((y % block.x) * block.y + x % block.y) * N + n
//   MAP_CONCAT          input k holds the range [end_{k-1}, end_k) of axis `axis`
//   MAP_PACK            axis `axis` of the output names the input; its coordinate there is at without the axis
//   MAP_TAKE            output elements in NHWC order are (outer, k, inner); the input's is (outer, table[k], inner),
//                       walk = (indices, inner size, axis length)
// The mappings reading several inputs (in, in1, in2 ...: GATHER_INPUTS, their arguments) set `input`, and
// GATHER_SELECT points `from`, `fd` and `fc` at that input's buffer, dims and channels.  With GATHER_VIEWS
// each input also has a view `fv` (N, H, W, C): the mapping's coordinate is in the view, an input as a
// folded reshape's output sees it, and names the element of the same NHWC order in the input's storage.
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
#define MAP_PARAMS , int4 before, float fill
#elif defined(MAP_SLICE)
#define MAP_PARAMS , int4 start, int4 step, int4 length
#elif defined(MAP_SPACE_TO_BATCH) || defined(MAP_BATCH_TO_SPACE)
#define MAP_PARAMS , int4 block, int4 before
#elif defined(MAP_CONCAT)
#define MAP_PARAMS , int axis CONCAT_ENDS
#elif defined(MAP_PACK)
#define MAP_PARAMS , int axis
#elif defined(MAP_TAKE)
#define MAP_PARAMS , int4 walk, AT(table)
#define MAP_BIND BIND(const STORAGE, table)
#endif
#if !defined(MAP_BIND)
#define MAP_BIND
#endif
#if !defined(GATHER_INPUTS)
#define GATHER_INPUTS
#define GATHER_SELECT
#endif
#if defined(GATHER_VIEWS)
#define GATHER_VIEW , int4 in_v
#else
#define GATHER_VIEW
#endif

__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                          int in_channels GATHER_VIEW GATHER_INPUTS, int aligned MAP_PARAMS EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); MAP_BIND;
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
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
#elif defined(MAP_SPACE_TO_BATCH)
    int offset = at.x / size.x;
    int4 src = (int4)(at.x % size.x, at.y * block.x + offset / block.y - before.x,
                      at.z * block.y + offset % block.y - before.y, at.w);
#elif defined(MAP_BATCH_TO_SPACE)
    int py = at.y + before.x, px = at.z + before.y;
    int4 src = (int4)(((py % block.x) * block.y + px % block.y) * od.w + at.x, py / block.x, px / block.y, at.w);
#elif defined(MAP_CONCAT)
    int c[4] = {at.x, at.y, at.z, at.w};
    int input = 0, start = 0;
    CONCAT_FIND
    c[axis] -= start;
    int4 src = (int4)(c[0], c[1], c[2], c[3]);
#elif defined(MAP_PACK)
    int c[4] = {at.x, at.y, at.z, at.w};
    int a[4] = {0, 0, 0, 0};
    for (int j = 0, k = 1; j < 4; ++j) if (j != axis) a[k++] = c[j];
    int input = c[axis];
    int4 src = (int4)(a[0], a[1], a[2], a[3]);
#elif defined(MAP_TAKE)
    int flat = ((at.x * od.y + at.y) * od.x + at.z) * out_channels + at.w;
    int row = (int)LOAD1(table, (flat / walk.y) % walk.x);
    int e = ((flat / (walk.y * walk.x)) * walk.z + row) * walk.y + flat % walk.y;
    int4 src = (int4)(e / (size.y * size.z * size.w), (e / (size.z * size.w)) % size.y, (e / size.w) % size.z,
                      e % size.w);
    if (row < 0 || row >= walk.z) src = (int4)(-1);
#endif
    __global const STORAGE* from = in;
    int4 fd = id;
    int fc = in_channels;
#if defined(GATHER_VIEWS)
    int4 fv = in_v;
    GATHER_SELECT
    int inside = all(src >= 0) && all(src < fv);
    int flat = ((src.x * fv.y + src.y) * fv.z + src.z) * fv.w + src.w;
    src = (int4)(flat / (fd.y * fd.x * fc), flat / (fd.x * fc) % fd.y, flat / fc % fd.x, flat % fc);
#else
    GATHER_SELECT
    int4 bound = (int4)(fd.w, fd.y, fd.x, fc);
    int inside = all(src >= 0) && all(src < bound);
#endif
#if defined(MAP_PAD)
    if (!inside) {
      v = (FLT4)((FLT)fill);
      lanes[l] = (FLT)fill;
    }
#endif
    if (aligned) {
      if (inside) v = LOAD4(from, vec_index(fd, src.x, src.y, src.z, src.w >> 2));
    } else if (inside) {
      lanes[l] = LOAD1(from, lane_index(fd, src.x, src.y, src.z, src.w));
    }
  }
  if (!aligned) v = (FLT4)(lanes[0], lanes[1], lanes[2], lanes[3]);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
#undef MAP_PARAMS
#undef MAP_BIND
#undef GATHER_INPUTS
#undef GATHER_SELECT
#undef GATHER_VIEW
