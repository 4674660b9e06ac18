/* Native loops of the CPU kernels, built on first use with the machine's C compiler (see native.py).
 *
 * Two things numpy cannot do fast: a depthwise convolution's multiply-accumulate over
 * filter taps (numpy's einsum runs it with 128-bit vectors), and sharing a product
 * between cores without a Python thread hand-over for every chunk.  Both run on an
 * OpenMP team, whose threads wait spinning between the kernels of a run (briefly: see
 * native.py's SPIN_COUNT), of no more threads than team_limit allows.
 */
#include <math.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float vec __attribute__((vector_size(64)));
#define LANES 16

static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }

/* A float kernel's bias (per column, or NULL) and fused activation, applied to rows just computed:
 * a clamp, or a PReLU with a slope per column (or NULL).  The products and convolutions also add a
 * residual operand (a residual ADD fused in) when their call holds one: ``adds`` and the distance in
 * bytes from each output to its operand are set by the kernel from the call, then the ADD's own
 * activation applies: its clamp (``add_clamp``) or a PReLU after it (``add_slope``, per column). */
typedef struct {
    const float *bias;
    int clamp;
    float low, high;
    const float *slope;
    int add_clamp;
    float add_low, add_high;
    int64_t residual;
    int64_t adds;
    const float *add_slope;
} epilogue;

/* The epilogue ``e`` adding, where ``residual`` is not NULL, that operand (laid out as ``out``). */
static inline epilogue with_residual(const epilogue *e, const float *residual, const float *out)
{
    epilogue part = *e;
    part.adds = residual != NULL;
    part.residual = residual ? (const char *)residual - (const char *)out : 0;
    return part;
}

/* Where a convolution reads and writes: ``images`` inputs of (h, w, c), image_in floats apart; their
 * (oh, ow) outputs, rows out_stride and images image_out floats apart; the filter's window, strides,
 * dilations and top and left padding. */
typedef struct {
    int64_t images, h, w, c, image_in;
    int64_t oh, ow, out_stride, image_out;
    int64_t kh, kw, stride_h, stride_w, dh, dw, top, left;
} geometry;

/* Per-thread scratch on the heap, never on the stack: a window's tap lists are as long as the window
 * (a 1x262144 filter needs megabytes).  One block of ``per_thread`` bytes for each of ``threads``, each
 * starting on a cache line of its own (threads writing their rows into blocks that shared a line ran a
 * 2-thread int8 product no faster than one thread); NULL when out of memory (the caller returns
 * NO_MEMORY, native.py raises). */
enum { DONE = 0, NO_MEMORY = 1 };

static inline size_t in_lines(size_t bytes) { return (bytes + 63) / 64 * 64; }

static char *scratch(int threads, size_t per_thread)
{
    return aligned_alloc(64, (size_t)(threads > 1 ? threads : 1) * in_lines(per_thread ? per_thread : 1));
}

static inline char *own_scratch(char *all, size_t per_thread)
{
    return all + (size_t)omp_get_thread_num() * in_lines(per_thread);
}

/* out = x where x >= 0, else x * slope (x and out may be one array): the product made for every item and
 * picked by a mask, with no branch on the sign.  Written as a branch, the compiler keeps the product inside
 * it (a product it may not make unasked, under -ftrapping-math) and mispredicts on every other item: PReLU
 * over 96x96x16 random values took 787 us that way, over positive ones 101 us. */
typedef float dvec8 __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t dmask8 __attribute__((vector_size(8 * sizeof(float))));
static void scale_negative(const float *x, const float *slope, float *out, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        dvec8 v, s;
        memcpy(&v, x + k, sizeof v);
        memcpy(&s, slope + k, sizeof s);
        dmask8 negative = v < (dvec8){0};
        dmask8 picked = (negative & (dmask8)(v * s)) | (~negative & (dmask8)v);
        memcpy(out + k, &picked, sizeof picked);
    }
    for (; k < n; k++) {
        float v = x[k], scaled = v * slope[k];
        uint32_t bits, kept, negative = -(uint32_t)(v < 0);
        memcpy(&bits, &scaled, sizeof bits);
        memcpy(&kept, &v, sizeof kept);
        bits = (bits & negative) | (kept & ~negative);
        memcpy(out + k, &bits, sizeof bits);
    }
}

/* The most threads a loop's team takes, whatever it was built for: set between runs (native.py's
 * share_cores) to the cores the machine's load leaves this process, so that a loaded machine runs the
 * loops on fewer threads, or on the calling one alone, instead of waiting on threads without a core. */
static volatile int team_limit = 1 << 30;

void set_team_limit(int limit) { team_limit = limit > 1 ? limit : 1; }
int get_team_limit(void) { return team_limit; }

static inline int team_of(int64_t threads) { return threads < team_limit ? (int)threads : team_limit; }

static void finish_rows(float *c, int64_t rows, int64_t n, int64_t ldc, const epilogue *e)
{
    for (int64_t r = 0; r < rows; r++) {
        float *row = c + r * ldc;
        if (e->bias)
            for (int64_t j = 0; j < n; j++)
                row[j] += e->bias[j];
        if (e->clamp)
            for (int64_t j = 0; j < n; j++) {
                float v = row[j] < e->low ? e->low : row[j];
                row[j] = v > e->high ? e->high : v;
            }
        if (e->slope)
            scale_negative(row, e->slope, row, n);
    }
}

/* The taps (ky, kx) of output row oy whose input row falls inside the image, in filter order: for
 * each its column offset kx*dw - left, its offset into the image from the row's first output pixel,
 * and its index ky*kw + kx.  Returns how many. */
static int64_t row_taps(const geometry *g, int64_t oy, int64_t *columns, int64_t *offsets, int64_t *index)
{
    int64_t taps = 0;
    for (int64_t ky = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->stride_h + ky * g->dh - g->top;
        if (iy < 0 || iy >= g->h)
            continue;
        for (int64_t kx = 0; kx < g->kw; kx++) {
            columns[taps] = kx * g->dw - g->left;
            offsets[taps] = (iy * g->w + columns[taps]) * g->c;
            index[taps++] = ky * g->kw + kx;
        }
    }
    return taps;
}

/* Of a row's taps (see row_taps), those inside a row of w input columns for the output pixel whose
 * left-most column is ix0 (its column times the stride): their offsets and indices.  Returns how many. */
static int64_t taps_inside(const int64_t *columns, const int64_t *offsets, const int64_t *index, int64_t taps,
                           int64_t ix0, int64_t w, int64_t *kept_offsets, int64_t *kept_index)
{
    int64_t kept = 0;
    for (int64_t t = 0; t < taps; t++) {
        int64_t ix = ix0 + columns[t];
        if (ix >= 0 && ix < w) {
            kept_offsets[kept] = offsets[t];
            kept_index[kept++] = index[t];
        }
    }
    return kept;
}

/* The output columns [*first, *end) whose filter taps all fall inside a row of w input columns:
 * ox*stride + left-most tap >= 0 and ox*stride + right-most tap < w. */
static void inner_columns(int64_t w, int64_t kw, int64_t stride, int64_t dilation, int64_t left, int64_t ow,
                          int64_t *first, int64_t *end)
{
    int64_t reach = (kw - 1) * dilation;
    int64_t a = (left + stride - 1) / stride, b = w - 1 - reach + left >= 0 ? (w - 1 - reach + left) / stride + 1 : 0;
    a = a < ow ? a : ow;
    b = b < ow ? b : ow;
    *first = a;
    *end = b > a ? b : a;
}

/* out[j] = sum over taps t of x[offsets[t] + j] * weights[t][j % period], for j < n: one output
 * pixel's channels (weights per channel, a period of at least n), or a run of whole pixels along an
 * output row with their channels' weights repeated (a period that is a multiple of 16 and of C,
 * each weight row holding 64 more), so that every group of 64 outputs loads its weights from one
 * place.  Groups of 64, then 16 outputs keep their sums in registers over all taps; the last few
 * outputs are summed again as the last 16 (16 or more in all; fewer go one by one). */
static inline void sum_taps(const float *x, const int64_t *offsets, const float *const *weights, int64_t period,
                            int64_t taps, float *restrict out, int64_t n)
{
    int64_t j = 0, o = 0;  /* o = j % period, kept as j advances */
    for (; j + 4 * LANES <= n; j += 4 * LANES) {
        vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t t = 0; t < taps; t++) {
            const float *in = x + offsets[t] + j, *w = weights[t] + o;
            a0 += load(in) * load(w);
            a1 += load(in + LANES) * load(w + LANES);
            a2 += load(in + 2 * LANES) * load(w + 2 * LANES);
            a3 += load(in + 3 * LANES) * load(w + 3 * LANES);
        }
        store(out + j, a0);
        store(out + j + LANES, a1);
        store(out + j + 2 * LANES, a2);
        store(out + j + 3 * LANES, a3);
        for (o += 4 * LANES; o >= period; o -= period) {}
    }
    for (; j + LANES <= n; j += LANES) {
        vec a = {0};
        for (int64_t t = 0; t < taps; t++)
            a += load(x + offsets[t] + j) * load(weights[t] + o);
        store(out + j, a);
        for (o += LANES; o >= period; o -= period) {}
    }
    if (j < n && n >= LANES) {  /* the last vector, overlapping outputs already summed (same sums) */
        int64_t tail = n - LANES;
        vec a = {0};
        for (int64_t t = 0; t < taps; t++)
            a += load(x + offsets[t] + tail) * load(weights[t] + tail % period);
        store(out + tail, a);
        return;
    }
    for (; j < n; j++) {
        float a = 0;
        for (int64_t t = 0; t < taps; t++)
            a += x[offsets[t] + j] * weights[t][o];
        out[j] = a;
        if (++o == period)
            o = 0;
    }
}

/* The depthwise kernel's pixel groups (depthwise_pixels) for one width of vectors: VEC of LANES floats
 * (with MASK its comparison type), NAME_store applying the epilogue (its bias and slope per channel)
 * in registers, NAME_group summing P output pixels' channels j.. over all taps, each tap's weights
 * loaded once for them. */
#define DW_PIXELS 8
/* Pixels of a group summed by whole filter rows (group_rows): 8 sums with a 5-wide filter's 12 inputs and 5
 * weights fit AVX-512's 32 registers; of AVX2's 16, 4 sums with a 3-wide filter's 6 inputs and 3 weights fit
 * (a 5-wide one's 8 and 5 are one too many). */
#if defined(__AVX512F__)
#define DW_ROW_PIXELS 8
#else
#define DW_ROW_PIXELS 4
#endif
typedef float dvec16 __attribute__((vector_size(16 * sizeof(float))));
typedef int32_t dmask16 __attribute__((vector_size(16 * sizeof(float))));

/* v clamped to [low, high] as clamp_to does (a NaN stays NaN), for each width of vectors. */
static inline dvec8 dw8_clamp(dvec8 v, dvec8 low, dvec8 high)
{
#if defined(__AVX2__)
    return (dvec8)_mm256_min_ps((__m256)high, _mm256_max_ps((__m256)low, (__m256)v));
#else
    v = (dvec8)(((dmask8)low & (v < low)) | ((dmask8)v & ~(v < low)));
    return (dvec8)(((dmask8)high & (v > high)) | ((dmask8)v & ~(v > high)));
#endif
}
#if defined(__AVX512F__)
static inline dvec16 dw16_clamp(dvec16 v, dvec16 low, dvec16 high)
{
    return (dvec16)_mm512_min_ps((__m512)high, _mm512_max_ps((__m512)low, (__m512)v));
}
#endif

/* The channels a whole row's pass over its pixels takes at once (a multiple of 16): a group of 8 pixels of a
 * 3x3 filter then reads 30 input vectors of 512 bytes and 9 of weights, which stay in the first-level cache
 * for the next group.  A group over all the channels of 14x14x384 read 46 KB and 7x7x960 104 KB for each:
 * chains of 20 such layers at 2 threads on the 2-core VM, against LiteRT alternating, 1.15x and 1.18x with
 * all the channels, 1.07-1.10x and 1.11-1.16x in blocks of 64 to 256. */
#define DW_BLOCK 128
/* NAME_whole_row's groups below DW_ROW_PIXELS (4 is DW_ROW_PIXELS itself without AVX-512). */
#if DW_ROW_PIXELS > 4
#define WHOLE_ROW_FOUR(NAME)                                                                                 \
        case 35: NAME##_row_group(4, 3, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;     \
        case 37: NAME##_row_group(4, 5, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;
#else
#define WHOLE_ROW_FOUR(NAME)
#endif
#define WHOLE_ROW_SMALL(NAME)                                                                                \
        WHOLE_ROW_FOUR(NAME)                                                                                 \
        case 11: NAME##_row_group(1, 3, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;     \
        case 19: NAME##_row_group(2, 3, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;     \
        case 27: NAME##_row_group(3, 3, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;     \
        case 13: NAME##_row_group(1, 5, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;     \
        case 21: NAME##_row_group(2, 5, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;     \
        case 29: NAME##_row_group(3, 5, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break;

#define DEPTHWISE_VECTORS(NAME, VEC, MASK, LANES)                                                            \
static inline VEC NAME##_load(const float *p) { VEC v; memcpy(&v, p, sizeof v); return v; }                  \
static inline VEC NAME##_pick(MASK where, VEC yes, VEC no)                                                   \
{                                                                                                            \
    return (VEC)(((MASK)yes & where) | ((MASK)no & ~where));                                                 \
}                                                                                                            \
static inline void NAME##_store(float *out, VEC v, int64_t j, const epilogue *e)                              \
{                                                                                                            \
    if (e->bias)                                                                                             \
        v += NAME##_load(e->bias + j);                                                                       \
    if (e->clamp) {                                                                                          \
        VEC low = (VEC){0} + e->low, high = (VEC){0} + e->high;                                              \
        v = NAME##_clamp(v, low, high);                                                                      \
    }                                                                                                        \
    if (e->slope)                                                                                            \
        v = NAME##_pick(v < (VEC){0}, v * NAME##_load(e->slope + j), v);                                     \
    memcpy(out, &v, sizeof v);                                                                               \
}                                                                                                            \
static inline __attribute__((always_inline)) void NAME##_group(const int P, const float *x,                   \
                                                              const int64_t *offsets,                        \
                                                              const float *const *weights, int64_t taps,     \
                                                              int64_t c, int64_t step, int64_t q, int64_t j, \
                                                              float *out, const epilogue *e)                 \
{                                                                                                            \
    VEC acc[DW_PIXELS];                                                                                      \
    for (int k = 0; k < P; k++)                                                                              \
        acc[k] = (VEC){0};                                                                                   \
    for (int64_t t = 0; t < taps; t++) {                                                                     \
        VEC w = NAME##_load(weights[t] + j);                                                                 \
        const float *in = x + offsets[t] + q * step + j;                                                     \
        for (int k = 0; k < P; k++)                                                                          \
            acc[k] += NAME##_load(in + k * step) * w;                                                        \
    }                                                                                                        \
    for (int k = 0; k < P; k++)                                                                              \
        NAME##_store(out + (q + k) * c + j, acc[k], j, e);                                                   \
}                                                                                                            \
/* NAME_group for a stride and dilation of 1 along the row, the taps whole filter rows of KW: each     \
 * filter row's P + KW - 1 input pixels loaded once for its KW taps (pixel k, tap kx reads input        \
 * k + kx), each tap's weights once; the same sums in the same order as NAME_group.  Of the input       \
 * pixels only in[lo..hi) are in the image (a group at an end of the row), the others read as zeros,    \
 * whose products (by finite weights: see depthwise_rows) add nothing to a sum, so each pixel sums the  \
 * taps it keeps, in order, as a border pixel on its own does. */                                       \
static inline __attribute__((always_inline)) void NAME##_group_rows(const int P, const int KW,                \
                                                                   const float *x, const int64_t *offsets,   \
                                                                   const float *const *weights,              \
                                                                   int64_t taps, int64_t c, int64_t q,       \
                                                                   int64_t j, int lo, int hi, float *out,    \
                                                                   const epilogue *e)                        \
{                                                                                                            \
    VEC acc[DW_PIXELS], in[DW_PIXELS + 4], w[5];                                                             \
    for (int k = 0; k < P; k++)                                                                              \
        acc[k] = (VEC){0};                                                                                   \
    for (int64_t t = 0; t < taps; t += KW) {                                                                 \
        const float *row = x + offsets[t] + q * c + j;                                                       \
        for (int i = 0; i < P + KW - 1; i++)                                                                 \
            in[i] = i >= lo && i < hi ? NAME##_load(row + i * c) : (VEC){0};                                 \
        for (int kx = 0; kx < KW; kx++)                                                                      \
            w[kx] = NAME##_load(weights[t + kx] + j);                                                        \
        for (int kx = 0; kx < KW; kx++)                                                                      \
            for (int k = 0; k < P; k++)                                                                      \
                acc[k] += in[k + kx] * w[kx];                                                                \
    }                                                                                                        \
    for (int k = 0; k < P; k++)                                                                              \
        NAME##_store(out + (q + k) * c + j, acc[k], j, e);                                                   \
}                                                                                                            \
/* A group of P pixels (1-4 or DW_ROW_PIXELS) by filter rows of KW (3 or 5) from pixel q of a row of w      \
 * input columns whose pixel q reads column q - left first, inside the row or at an end of it. */           \
static inline __attribute__((always_inline)) void NAME##_row_group(const int P, const int KW, const float *x,  \
                                    const int64_t *offsets,                                                   \
                                    const float *const *weights, int64_t taps, int64_t c, int64_t q,          \
                                    int64_t w, int64_t left, int64_t j0, int64_t j1, float *out,             \
                                    const epilogue *e)                                                       \
{                                                                                                            \
    int64_t first = q - left, span = P + KW - 1, end = w - first;                                            \
    int lo = first < 0 ? (int)(-first < span ? -first : span) : 0;                                           \
    int hi = end < span ? (int)(end > 0 ? end : 0) : (int)span;                                              \
    if (lo == 0 && hi == span)                                                                               \
        for (int64_t j = j0; j < j1; j += LANES)  /* (bounds as constants: no test left in the loads) */       \
            NAME##_group_rows(P, KW, x, offsets, weights, taps, c, q, j, 0, P + KW - 1, out, e);             \
    else                                                                                                     \
        for (int64_t j = j0; j < j1; j += LANES)                                                             \
            NAME##_group_rows(P, KW, x, offsets, weights, taps, c, q, j, lo, hi, out, e);                    \
}                                                                                                            \
/* A whole output row of ow pixels at a stride and dilation of 1, taps by filter rows of KW: groups of      \
 * DW_ROW_PIXELS, then 4, then the last 1-3 as one group, those at the ends too (one by one with the taps    \
 * they keep, a 7x7 layer's two border pixels of seven took a third of its time). */                        \
static void NAME##_whole_row(const float *x, const int64_t *offsets, const float *const *weights, int64_t taps, \
                             int64_t c, int64_t ow, int64_t w, int64_t left, int64_t j0, int64_t j1, int KW,  \
                             float *out, const epilogue *e)                                                  \
{                                                                                                            \
  for (int64_t b0 = j0; b0 < j1; b0 += DW_BLOCK) {                                                          \
    int64_t b1 = b0 + DW_BLOCK < j1 ? b0 + DW_BLOCK : j1;                                                    \
    for (int64_t q = 0; q < ow;) {                                                                           \
        int64_t rest = ow - q;                                                                               \
        int P = rest >= DW_ROW_PIXELS ? DW_ROW_PIXELS : rest >= 4 ? 4 : (int)rest;                          \
        switch (P * 8 + KW) {                                                                                \
        case DW_ROW_PIXELS * 8 + 3: NAME##_row_group(DW_ROW_PIXELS, 3, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break; \
        case DW_ROW_PIXELS * 8 + 5: NAME##_row_group(DW_ROW_PIXELS, 5, x, offsets, weights, taps, c, q, w, left, b0, b1, out, e); break; \
        WHOLE_ROW_SMALL(NAME)                                                                                \
        }                                                                                                    \
        q += P;                                                                                              \
    }                                                                                                        \
  }                                                                                                          \
}                                                                                                            \
/* Channels j0..j1 of every pixel, a vector at a time: groups of DW_PIXELS, then 4, the last few a group  \
 * of 4 again overlapping pixels already summed (the same sums again, from the input: out is never the   \
 * input), or one by one when fewer than 4 in all.  Each group of pixels takes every vector of channels   \
 * before the next group: the input pixels it reads stay in the first-level cache (a sweep of the whole  \
 * row per vector of channels reread them from the next level, every time). */                           \
static void NAME##_pixels(const float *x, const int64_t *offsets, const float *const *weights,                \
                          int64_t taps, int64_t c, int64_t step, int64_t pixels, int64_t j0, int64_t j1,      \
                          float *out, const epilogue *e)                                                     \
{                                                                                                            \
    int64_t q = 0;                                                                                           \
    for (; q + DW_PIXELS <= pixels; q += DW_PIXELS)                                                          \
        for (int64_t j = j0; j < j1; j += LANES)                                                             \
            NAME##_group(DW_PIXELS, x, offsets, weights, taps, c, step, q, j, out, e);                       \
    for (; q + 4 <= pixels || (q < pixels && pixels >= 4); q += 4) {                                         \
        int64_t at = q + 4 <= pixels ? q : pixels - 4;  /* the last few: overlapping pixels already summed */ \
        for (int64_t j = j0; j < j1; j += LANES)                                                             \
            NAME##_group(4, x, offsets, weights, taps, c, step, at, j, out, e);                              \
        if (at != q)                                                                                         \
            return;                                                                                          \
    }                                                                                                        \
    for (; q < pixels; q++)                                                                                  \
        for (int64_t j = j0; j < j1; j += LANES)                                                             \
            NAME##_group(1, x, offsets, weights, taps, c, step, q, j, out, e);                               \
}

DEPTHWISE_VECTORS(dw8, dvec8, dmask8, 8)
#if defined(__AVX512F__)
DEPTHWISE_VECTORS(dw16, dvec16, dmask16, 16)
#endif

/* out[q * c + j] = sum over taps t of x[offsets[t] + q * step + j] * weights[t][j], for the ``pixels``
 * output pixels q of a run along a row (``step`` floats apart in the input) and channels c0 <= j < c1
 * (c0 a multiple of 16; c1 one too, or c, at least 8), then the epilogue in registers: per vector of
 * channels (16 with AVX-512, then 8, and where c1 is no multiple of 8 the last 8 channels again: the same
 * sums from the input, written over with the same values), groups of pixels keep their sums in registers
 * over all taps.  The sums run over the taps in order, as sum_taps's do. */
static void depthwise_pixels(const float *x, const int64_t *offsets, const float *const *weights, int64_t taps,
                             int64_t c, int64_t c0, int64_t c1, int64_t step, int64_t pixels,
                             float *out, const epilogue *e)
{
    int64_t wide = c0;
#if defined(__AVX512F__)
    wide = c0 + (c1 - c0) / 16 * 16;
    dw16_pixels(x, offsets, weights, taps, c, step, pixels, c0, wide, out, e);
#endif
    dw8_pixels(x, offsets, weights, taps, c, step, pixels, wide, c1 / 8 * 8, out, e);
    if (c1 % 8)
        dw8_pixels(x, offsets, weights, taps, c, step, pixels, c1 - 8, c1 - 7, out, e);
}

/* A whole output row of depthwise_rows at a stride and dilation of 1 with filters 3 or 5 wide:
 * channels c0..c1 as depthwise_pixels takes them, the pixels as NAME_whole_row groups them, the border pixels
 * in groups with the rest; ``x`` the image, pixel q reading column q - left first. */
static int whole_rows(const geometry *g)
{
    return g->stride_w == 1 && g->dw == 1 && (g->kw == 3 || g->kw == 5);
}

static void depthwise_whole_row(const float *x, const int64_t *offsets, const float *const *weights, int64_t taps,
                                const geometry *g, int64_t c0, int64_t c1, float *out, const epilogue *e)
{
    int64_t c = g->c, wide = c0;
    int kw = (int)g->kw;
#if defined(__AVX512F__)
    wide = c0 + (c1 - c0) / 16 * 16;
    dw16_whole_row(x, offsets, weights, taps, c, g->ow, g->w, g->left, c0, wide, kw, out, e);
#endif
    dw8_whole_row(x, offsets, weights, taps, c, g->ow, g->w, g->left, wide, c1 / 8 * 8, kw, out, e);
    if (c1 % 8)
        dw8_whole_row(x, offsets, weights, taps, c, g->ow, g->w, g->left, c1 - 8, c1 - 7, kw, out, e);
}

/* What a task (one row of one channel block) costs beyond its channels, in channels: the row's tap offsets
 * and border pixels, and the pixels' loop.  Chains of 20 depthwise layers on an H100 host's 16 cores, blocks of
 * 16 channels against whole rows: 56x56x144 1.81 against 1.46 ms, 28x28x192 2.63 against 0.90, 14x14x576 1.96
 * against 0.96, 7x7x960 1.90 against 0.55 (run to run those figures moved by up to 1.5x, these gaps did not). */
#define DEPTHWISE_TASK_CHANNELS 32

/* The channels of each block a depthwise convolution's rows are split into (a multiple of 16; the last block
 * takes what is left over): the width whose busiest thread has the least to compute (as many tasks as a thread
 * takes, times the widest block's channels and DEPTHWISE_TASK_CHANNELS), the widest where two tie.
 * MobileNetV2's 7x7x960 layer on 16 threads, 7 rows as 7 tasks, kept 9 threads idle (its depthwise layers ran
 * 2.1x faster on 16 threads than on 2); 7 rows on 2 threads as 4 and 3 kept one waiting for the other an eighth
 * of the time. */
static int64_t channel_block(int64_t rows, int64_t c, int team)
{
    if (team < 2 || c < 32)
        return c;
    int64_t best = c, least = -1;
    for (int64_t parts = 1; parts <= c / 16; parts++) {
        int64_t block = ((c + parts - 1) / parts + 15) / 16 * 16, blocks = c / block > 1 ? c / block : 1;
        int64_t busiest = (rows * blocks + team - 1) / team * (c - (blocks - 1) * block + DEPTHWISE_TASK_CHANNELS);
        if (least < 0 || busiest < least) {
            least = busiest;
            best = blocks > 1 ? block : c;
        }
    }
    return best;
}

/* A depthwise convolution of (H, W, C) images, read in place: output pixel (oy, ox) sums the
 * taps (ky, kx) that fall inside the image, at input row oy*stride_h + ky*dh - top and column
 * ox*stride_w + kx*dw - left, weighted by weights[ky*kw + kx, c]; then the epilogue (its bias
 * tiled along the output row).  No padded copy of the input: pixels at the borders drop the
 * taps that fall outside.  The pixels with every tap inside are one run along the row: at least 8
 * channels go by depthwise_pixels; fewer, without a column stride, by sum_taps with ``repeated`` the
 * weights as it takes them, with one, pixel by pixel.  With 8 or more the border pixels go by
 * depthwise_pixels too, one at a time over the taps they keep, their epilogue in registers (by sum_taps
 * and a pass of finish_rows they took a third of a 14x14x384 layer's time; 28 channels at a stride of 2
 * pixel by pixel, 11x LiteRT's time).  At a stride and dilation of 1 with filters 3 or 5 wide and ``finite``
 * weights, a row goes whole (depthwise_whole_row): its border pixels in groups with the others, reading the
 * columns outside the image as zeros. */
int depthwise_rows(const float *restrict images, const float *restrict weights, const float *restrict repeated,
                   int64_t period, float *restrict out, const geometry *g, const epilogue *finish, int threads,
                   int finite)
{
    int64_t w = g->w, c = g->c, oh = g->oh, ow = g->ow, kh = g->kh, kw = g->kw, stride_w = g->stride_w;
    int64_t inner0, inner1, window = kh * kw;
    size_t per_thread = (size_t)window * (5 * sizeof(int64_t) + 3 * sizeof(const float *));
    char *all = scratch(threads, per_thread);
    if (!all)
        return NO_MEMORY;
    inner_columns(w, kw, stride_w, g->dw, g->left, ow, &inner0, &inner1);
    int64_t rows = g->images * oh, block = c >= 8 ? channel_block(rows, c, team_of(threads)) : c;
    int64_t blocks = c / block > 1 ? c / block : 1;  /* the last block takes what is left over */
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t task = 0; task < rows * blocks; task++) {
        int64_t r = task / blocks, c0 = task % blocks * block, c1 = task % blocks == blocks - 1 ? c : c0 + block;
        int64_t oy = r % oh;
        const float *x = images + r / oh * g->image_in;
        int64_t *offsets = (int64_t *)own_scratch(all, per_thread), *columns = offsets + window;
        int64_t *index = columns + window, *inside = index + window, *inside_index = inside + window;
        const float **filters = (const float **)(inside_index + window), **repeats = filters + window;
        const float **kept_filters = repeats + window;
        int64_t taps = row_taps(g, oy, columns, offsets, index);
        for (int64_t t = 0; t < taps; t++) {
            repeats[t] = repeated + index[t] * (period + 4 * LANES);
            filters[t] = weights + index[t] * c;
        }
        float *row = out + r / oh * g->image_out + oy * g->out_stride;
        int pixels_finished = c >= 8;
        if (pixels_finished && finite && whole_rows(g)) {
            depthwise_whole_row(x, offsets, filters, taps, g, c0, c1, row, finish);
            continue;
        }
        if (pixels_finished)
            depthwise_pixels(x + inner0 * stride_w * c, offsets, filters, taps, c, c0, c1, stride_w * c, inner1 - inner0,
                             row + inner0 * c, finish);
        else if (stride_w == 1)
            sum_taps(x + inner0 * c, offsets, repeats, period, taps, row + inner0 * c, (inner1 - inner0) * c);
        else
            for (int64_t ox = inner0; ox < inner1; ox++)
                sum_taps(x + ox * stride_w * c, offsets, filters, c, taps, row + ox * c, c);
        for (int64_t ox = 0; ox < ow; ox++) {
            if (ox == inner0 && inner1 > inner0)
                ox = inner1;
            if (ox >= ow)
                break;
            int64_t kept = taps_inside(columns, offsets, index, taps, ox * stride_w, w, inside, inside_index);
            for (int64_t t = 0; t < kept; t++)
                kept_filters[t] = weights + inside_index[t] * c;
            if (pixels_finished)  /* a border pixel as one of the run's, its epilogue in registers too */
                depthwise_pixels(x + ox * stride_w * c, inside, kept_filters, kept, c, c0, c1, 0, 1, row + ox * c, finish);
            else
                sum_taps(x + ox * stride_w * c, inside, kept_filters, c, kept, row + ox * c, c);
        }
        if (!pixels_finished)
            finish_rows(row, 1, ow * c, ow * c, finish);
    }
    free(all);
    return DONE;
}

/* depthwise_rows with its arguments in one struct: kernels build it once and set images and out per
 * run, a one-argument call (each converted argument of a call costs a fraction of a microsecond). */
typedef struct {
    const float *images, *weights, *repeated;
    int64_t period;
    float *out;
    const geometry *where;
    const epilogue *finish;
    int64_t threads, finite;  /* finite: every weight is (whole rows multiply pixels outside the image by zero) */
} depthwise_call;

int depthwise_prepared(const depthwise_call *c)
{
    return depthwise_rows(c->images, c->weights, c->repeated, c->period, c->out, c->where, c->finish, (int)c->threads,
                          (int)c->finite);
}

/* Products against a constant operand packed once into panels of PANEL columns (k rows of PANEL
 * floats each, zero past the last column), the last one half as wide where the columns left fit
 * in that (as native.py's PackedOperand lays them out): register tiles of MR rows by one panel keep their sums over the whole depth,
 * each panel row loaded once for the MR rows (MR_NARROW rows of a panel one vector wide, in products:
 * a projection to 8 or 16 units keeps as many sums going as a wide one).  The vectors are the widest
 * the machine's registers hold two rows of tiles for (AVX-512: 16 floats; else 8). */
#if defined(__AVX512F__)
#define PANEL_LANES 16
#else
#define PANEL_LANES 8
#endif
#define PANEL (2 * PANEL_LANES)
#if defined(__AVX512F__)
#define MR 8  /* 16 sums, 2 panel vectors and the broadcast of 32 registers (MR 6: 1x1 products 1.07-1.19x slower; 12 spills) */
#else
#define MR 6
#endif
#define MR_NARROW (2 * MR)  /* rows of a tile one vector wide: as many sums in registers as a full tile's */
typedef float pvec __attribute__((vector_size(PANEL_LANES * sizeof(float))));

int panel_lanes(void) { return PANEL_LANES; }

typedef int32_t pmask __attribute__((vector_size(PANEL_LANES * sizeof(float))));

static inline pvec pick(pmask where, pvec yes, pvec no) { return (pvec)(((pmask)yes & where) | ((pmask)no & ~where)); }

/* v clamped to [low, high] (a NaN stays NaN), by min and max instructions where the machine has them:
 * a shallow product's epilogue is an eighth of its time. */
static inline pvec clamp_to(pvec v, pvec low, pvec high)
{
#if PANEL_LANES == 16
    return dw16_clamp(v, low, high);
#else
    return dw8_clamp(v, low, high);
#endif
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* AVX2's mask of the lanes below n. */
static inline __m256i lanes_below(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* The first n (1 to PANEL_LANES) floats at p, the rest of the vector zero; and v's first n stored at p:
 * a panel's last columns, masked where the machine has masked moves. */
static inline pvec load_part(const float *p, int64_t n)
{
    pvec v = {0};
    if (n == PANEL_LANES) {
        memcpy(&v, p, sizeof v);
        return v;
    }
#if defined(__AVX512F__)
    return (pvec)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#elif defined(__AVX2__)
    return (pvec)_mm256_maskload_ps(p, lanes_below(n));
#else
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
#endif
}

static inline void store_part(float *p, pvec v, int64_t n)
{
    if (n == PANEL_LANES) {
        memcpy(p, &v, sizeof v);
        return;
    }
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#elif defined(__AVX2__)
    _mm256_maskstore_ps(p, lanes_below(n), (__m256)v);
#else
    memcpy(p, &v, (size_t)n * sizeof(float));
#endif
}

/* Sums of ``rows`` pixels by one panel (``halves`` vectors wide) over taps and channels: pixel r,
 * tap t, channel p reads a[r * row_step + offsets[t] + p * column_step], weighted by the panel's
 * row index[t] * c + p; then the epilogue, and the first ``width`` sums of each pixel go to out
 * (pixels ldc apart).  A plain product is one tap of c = its depth. */
static inline __attribute__((always_inline)) void panel_tile(const int rows, const int halves, const float *a,
                                                            int64_t row_step, const int64_t column_step,
                                                            const int64_t *offsets, const int64_t *index,
                                                            int64_t taps, int64_t c, const float *panel, float *out,
                                                            int64_t ldc, int64_t width, const epilogue *e,
                                                            int64_t tiles)
{
    pvec bias[2] = {{0}, {0}}, slope[2] = {{0}, {0}}, add_slope[2] = {{0}, {0}}, zero = {0};  /* sums start from the bias */
    pvec low = (pvec){0} + e->low, high = (pvec){0} + e->high;
    pvec add_low = (pvec){0} + e->add_low, add_high = (pvec){0} + e->add_high;
    _Pragma("GCC unroll 2") for (int h = 0; h < halves; h++) {
        if (e->bias)
            memcpy(&bias[h], e->bias + h * PANEL_LANES, sizeof bias[h]);
        if (e->slope)
            memcpy(&slope[h], e->slope + h * PANEL_LANES, sizeof slope[h]);
        if (e->add_slope)
            memcpy(&add_slope[h], e->add_slope + h * PANEL_LANES, sizeof add_slope[h]);
    }
  for (int64_t tile = 0; tile < tiles; tile++, a += rows * row_step, out += rows * ldc) {
    pvec acc[MR_NARROW][2];
    _Pragma("GCC unroll 16") for (int r = 0; r < rows; r++) {
        acc[r][0] = bias[0];
        acc[r][1] = bias[1];
    }
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + offsets[t], *pt = panel + index[t] * c * halves * PANEL_LANES;
        for (int64_t p = 0; p < c; p++) {
            pvec b0, b1;
            memcpy(&b0, pt + p * halves * PANEL_LANES, sizeof b0);
            if (halves == 2)
                memcpy(&b1, pt + p * PANEL + PANEL_LANES, sizeof b1);
            _Pragma("GCC unroll 16") for (int r = 0; r < rows; r++) {
                float s = at[r * row_step + p * column_step];
                acc[r][0] += s * b0;
                if (halves == 2)
                    acc[r][1] += s * b1;
            }
        }
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < halves; h++) {
        _Pragma("GCC unroll 16") for (int r = 0; r < rows; r++) {
            pvec v = acc[r][h];
            if (e->clamp)
                v = clamp_to(v, low, high);
            if (e->slope)
                v = pick(v < zero, v * slope[h], v);
            acc[r][h] = v;
        }
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < rows; r++) {
        float *o = out + r * ldc;
        for (int h = 0; h < halves && h * PANEL_LANES < width; h++) {
            int64_t j = h * PANEL_LANES, n = width - j < PANEL_LANES ? width - j : PANEL_LANES;
            pvec v = acc[r][h];
            if (e->adds) {  /* the residual ADD: the operand laid out as out, then the ADD's activation */
                v += load_part((const float *)((const char *)(o + j) + e->residual), n);
                if (e->add_clamp)
                    v = clamp_to(v, add_low, add_high);
                if (e->add_slope)
                    v = pick(v < zero, v * add_slope[h], v);
            }
            store_part(o + j, v, n);
        }
    }
  }
}

/* panel_tile with its row count, panel width and (a step of 1 along a's rows) as constants, so that
 * the sums live in registers. */
static void panel_rows(int rows, const float *a, int64_t row_step, int64_t column_step, const int64_t *offsets,
                       const int64_t *index, int64_t taps, int64_t c, const float *panel, float *out, int64_t ldc,
                       int64_t width, const epilogue *e, int64_t tiles)
{
#define PANEL_TILE(R, H, STEP) \
    panel_tile(R, H, a, row_step, STEP, offsets, index, taps, c, panel, out, ldc, width, e, tiles)
#define PANEL_CASE(R)                                                                        \
    case R:                                                                                  \
        if (width > PANEL_LANES && column_step == 1)                                         \
            PANEL_TILE(R, 2, 1);                                                             \
        else if (width > PANEL_LANES)                                                        \
            PANEL_TILE(R, 2, column_step);                                                   \
        else if (column_step == 1)                                                           \
            PANEL_TILE(R, 1, 1);                                                             \
        else                                                                                 \
            PANEL_TILE(R, 1, column_step);                                                   \
        break;
#define NARROW_CASE(R)                                                                       \
    case R:                                                                                  \
        if (column_step == 1)                                                                \
            PANEL_TILE(R, 1, 1);                                                             \
        else                                                                                 \
            PANEL_TILE(R, 1, column_step);                                                   \
        break;
    switch (rows) {
#if MR == 8
    NARROW_CASE(16) NARROW_CASE(15) NARROW_CASE(14) NARROW_CASE(13) NARROW_CASE(12) NARROW_CASE(11)
    NARROW_CASE(10) NARROW_CASE(9) PANEL_CASE(8) PANEL_CASE(7)
#else
    NARROW_CASE(12) NARROW_CASE(11) NARROW_CASE(10) NARROW_CASE(9) NARROW_CASE(8) NARROW_CASE(7)
#endif
    PANEL_CASE(6) PANEL_CASE(5) PANEL_CASE(4) PANEL_CASE(3) PANEL_CASE(2) PANEL_CASE(1)
    }
#undef NARROW_CASE
#undef PANEL_CASE
#undef PANEL_TILE
}

/* The epilogue of the panel starting at column col. */
static epilogue panel_finish(const epilogue *e, int64_t col)
{
    epilogue part = *e;
    if (part.bias)
        part.bias += col;
    if (part.slope)
        part.slope += col;
    if (part.add_slope)
        part.add_slope += col;
    return part;
}

/* A convolution of (H, W, C) images, read in place: output pixel (oy, ox) unit u sums, over the taps
 * (ky, kx) inside the image and the channels, x[oy*stride_h + ky*dh - top, ox*stride_w + kx*dw - left, k]
 * times the weights of (ky, kx, k) and u, packed into panels as for packed_product; then the
 * epilogue (its bias padded to whole panels), adding ``residual`` (laid out as out) where not NULL.
 * No im2col copy: groups of up to MR pixels (MR_NARROW for units of one vector) with every tap inside
 * keep their sums in registers over all taps and channels; pixels at the borders go one by one with the taps inside. */
int conv_rows(const float *restrict images, const float *restrict packed, int64_t units, float *restrict out,
              const geometry *g, const epilogue *epilogue_in, const float *residual, int threads)
{
    epilogue adding = with_residual(epilogue_in, residual, out);
    const epilogue *finish = &adding;
    int64_t w = g->w, c = g->c, oh = g->oh, ow = g->ow, kh = g->kh, kw = g->kw, stride_w = g->stride_w;
    int64_t depth = kh * kw * c, panels = (units + PANEL - 1) / PANEL, inner0, inner1, window = kh * kw;
    int group = units <= PANEL_LANES ? MR_NARROW : MR;  /* pixels of a tile */
    size_t per_thread = (size_t)window * 5 * sizeof(int64_t);
    char *all = scratch(threads, per_thread);
    if (!all)
        return NO_MEMORY;
    inner_columns(w, kw, stride_w, g->dw, g->left, ow, &inner0, &inner1);
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < g->images * oh; r++) {
        int64_t oy = r % oh;
        const float *x = images + r / oh * g->image_in;
        int64_t *offsets = (int64_t *)own_scratch(all, per_thread), *columns = offsets + window;
        int64_t *index = columns + window, *inside = index + window, *inside_index = inside + window;
        int64_t taps = row_taps(g, oy, columns, offsets, index);
        float *row = out + r / oh * g->image_out + oy * g->out_stride;
        for (int64_t ox = 0; ox < ow;) {
            const int64_t *pixel_offsets = offsets, *pixel_index = index;
            int64_t pixel_taps = taps;
            int pixels = 1;
            if (ox >= inner0 && ox < inner1) {
                pixels = inner1 - ox < group ? (int)(inner1 - ox) : group;
            } else {  /* a border pixel: only the taps inside */
                pixel_taps = taps_inside(columns, offsets, index, taps, ox * stride_w, w, inside, inside_index);
                pixel_offsets = inside;
                pixel_index = inside_index;
            }
            for (int64_t j = 0; j < panels; j++) {
                int64_t col = j * PANEL, width = units - col < PANEL ? units - col : PANEL;
                epilogue part = panel_finish(finish, col);
                panel_rows(pixels, x + ox * stride_w * c, stride_w * c, 1, pixel_offsets, pixel_index, pixel_taps, c,
                           packed + j * PANEL * depth, row + ox * units + col, units, width, &part, 1);
            }
            ox += pixels;
        }
    }
    free(all);
    return DONE;
}

/* conv_rows with its arguments in one struct, as depthwise_call. */
typedef struct {
    const float *images, *packed;
    int64_t units;
    float *out;
    const geometry *where;
    const epilogue *finish;
    int64_t threads;
    const float *residual;
} conv_call;

int conv_prepared(const conv_call *c)
{
    return conv_rows(c->images, c->packed, c->units, c->out, c->where, c->finish, c->residual, (int)c->threads);
}

/* Elementwise kernels over flat arrays, each thread on a share (whole vectors of 16), then the epilogue:
 * binary_flat for operands each of the output's shape or broadcast to it (binary_form), unary_flat for a
 * copy (a bare clamp), hard swish, logistic, GELU or a reciprocal square root. */
enum { ADD = 0, SUB, MUL, MAXIMUM, MINIMUM, DIV, SQUARED_DIFFERENCE };
enum { COPY = 0, HARD_SWISH, LOGISTIC, GELU, GELU_TANH, RSQRT };

typedef int32_t ivec __attribute__((vector_size(sizeof(vec))));

/* e^x lane by lane (Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-7 polynomial in r, 2^n
 * through the exponent bits), within 2 ulp of expf; x clamped to [-88.38, 88.38], where e^x is a
 * normal float (NaN stays NaN). */
static inline vec exp_lanes(vec x)
{
    const vec high = (vec){0} + 88.3762626647949f, low = (vec){0} - 88.3762626647949f;
    ivec above = x > high, below = x < low;
    x = (vec)((above & (ivec)high) | (~above & (ivec)x));
    x = (vec)((below & (ivec)low) | (~below & (ivec)x));
    vec f = x * 1.44269504088896341f + 0.5f;
    vec n = __builtin_convertvector(__builtin_convertvector(f, ivec), vec);
    n += __builtin_convertvector(n > f, vec);  /* truncation made floor: -1 where it went up */
    vec r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vec p = (vec){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
    vec scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* GELU lane by lane: x/2 (1 + erf(x / sqrt 2)), erf as numpy's formulation computes it (Abramowitz & Stegun
 * 7.1.26, within 1.5e-7) but in float32 with exp_lanes; or with ``approximate`` x/2 (1 + tanh(sqrt(2/pi)
 * (x + 0.044715 x^3))), tanh(y) as 1 - 2 / (e^2y + 1).  In float64 numpy, a transformer block's 197 x 64 GELU
 * took 0.15 ms on the 2-core VM, LiteRT's 0.004. */
static inline vec gelu_lanes(vec v, int approximate)
{
    vec inner;
    if (approximate) {
        vec y = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        inner = 1.0f - 2.0f / (exp_lanes(2.0f * y) + 1.0f);
    } else {
        vec z = v * 0.7071067811865476f;
        ivec sign = (ivec)z & (int32_t)0x80000000;
        vec a = (vec)((ivec)z & (int32_t)0x7fffffff);
        vec t = 1.0f / (1.0f + 0.3275911f * a);
        vec poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f
                                                                               + t * 1.061405429f))));
        inner = (vec)((ivec)(1.0f - poly * exp_lanes(-(z * z))) | sign);
    }
    return 0.5f * v * (1.0f + inner);
}

/* The unary op ``kind`` (LOGISTIC as numpy's formulation: 1 / (1 + e^-x); GELU; GELU_TANH) lane by lane. */
static inline vec unary_lanes(int kind, vec v)
{
    return kind == LOGISTIC ? 1.0f / (1.0f + exp_lanes(-v)) : gelu_lanes(v, kind == GELU_TANH);
}

/* The first n (< LANES) floats at p as a vector, its other lanes zero; and the first n lanes of v stored at p: one
 * masked move with AVX-512, else a copy of n floats (a library call: a SOFTMAX row's last few values each took two,
 * 394 rows of 197 in a ViT block's attention). */
static inline vec load_lanes(const float *p, int64_t n)
{
#if defined(__AVX512F__)
    return (vec)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#else
    vec v = {0};
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
#endif
}

static inline void store_lanes(float *p, vec v, int64_t n)
{
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#else
    memcpy(p, &v, (size_t)n * sizeof(float));
#endif
}

/* unary_lanes of n floats at x into out: whole vectors, then the last few as one (its lanes past the end unused). */
static void unary_span(int kind, const float *restrict x, float *restrict out, int64_t n)
{
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        store(out + i, unary_lanes(kind, load(x + i)));
    if (i < n)
        store_lanes(out + i, unary_lanes(kind, load_lanes(x + i, n - i)), n - i);
}

static void share(int64_t n, int64_t unit, int part, int parts, int64_t *lo, int64_t *hi)
{
    int64_t units = (n + unit - 1) / unit;
    *lo = units * part / parts * unit;
    *hi = units * (part + 1) / parts * unit;
    *hi = *hi < n ? *hi : n;
}

/* out[i] = a[i * as] (kind) b[i * bs] for i < n: steps of 1 (a vector of operands) or 0 (one operand for all),
 * constants, so that each case's loop is vectorised. */
static inline __attribute__((always_inline)) void binary_steps(int kind, const float *restrict a, const int as,
                                                               const float *restrict b, const int bs,
                                                               float *restrict out, int64_t n)
{
    switch (kind) {
    case ADD: for (int64_t i = 0; i < n; i++) out[i] = a[i * as] + b[i * bs]; break;
    case SUB: for (int64_t i = 0; i < n; i++) out[i] = a[i * as] - b[i * bs]; break;
    case MUL: for (int64_t i = 0; i < n; i++) out[i] = a[i * as] * b[i * bs]; break;
    case MAXIMUM: for (int64_t i = 0; i < n; i++) out[i] = a[i * as] < b[i * bs] ? b[i * bs] : a[i * as]; break;
    case MINIMUM: for (int64_t i = 0; i < n; i++) out[i] = b[i * bs] < a[i * as] ? b[i * bs] : a[i * as]; break;
    case DIV: for (int64_t i = 0; i < n; i++) out[i] = a[i * as] / b[i * bs]; break;
    default:
        for (int64_t i = 0; i < n; i++) {
            float d = a[i * as] - b[i * bs];
            out[i] = d * d;
        }
        break;
    }
}

static void binary_run(int kind, const float *restrict a, int a_steps, const float *restrict b, int b_steps,
                       float *restrict out, int64_t n)
{
    if (a_steps && b_steps)
        binary_steps(kind, a, 1, b, 1, out, n);
    else if (a_steps)
        binary_steps(kind, a, 1, b, 0, out, n);
    else if (b_steps)
        binary_steps(kind, a, 0, b, 1, out, n);
    else
        binary_steps(kind, a, 0, b, 0, out, n);
}

/* How an operand of binary_flat covers the output viewed as (rows, columns): with the output's own shape,
 * one value per column (a row broadcast down the rows), one value per row (a column broadcast along them),
 * or one value for all. */
enum { WHOLE = 0, PER_COLUMN, PER_ROW, ONE };

/* Where row r of an operand of ``form`` starts, and whether it steps along the row. */
static inline const float *form_row(const float *x, int form, int64_t r, int64_t columns, int *steps)
{
    *steps = form == WHOLE || form == PER_COLUMN;
    return form == WHOLE ? x + r * columns : form == PER_ROW ? x + r : x;
}

void binary_flat(int kind, const float *restrict a, const float *restrict b, float *restrict out, int64_t n,
                 int64_t columns, int a_form, int b_form, const epilogue *finish, int threads)
{
    int flat = (a_form == WHOLE || a_form == ONE) && (b_form == WHOLE || b_form == ONE);
    int rows = !flat || finish->slope;
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int part = 0; part < threads; part++) {
        int64_t lo, hi;
        share(n, rows ? columns : LANES, part, threads, &lo, &hi);
        if (flat && hi > lo)
            binary_run(kind, a_form == WHOLE ? a + lo : a, a_form == WHOLE, b_form == WHOLE ? b + lo : b,
                       b_form == WHOLE, out + lo, hi - lo);
        else
            for (int64_t r = lo / columns; r < hi / columns; r++) {
                int a_steps, b_steps;
                const float *ar = form_row(a, a_form, r, columns, &a_steps), *br = form_row(b, b_form, r, columns, &b_steps);
                binary_run(kind, ar, a_steps, br, b_steps, out + r * columns, columns);
            }
        if (hi > lo && rows)
            finish_rows(out + lo, (hi - lo) / columns, columns, columns, finish);
        else if (hi > lo)
            finish_rows(out + lo, 1, hi - lo, 0, finish);
    }
}

/* binary_flat with its arguments in one struct, as depthwise_call. */
typedef struct {
    int64_t kind;
    const float *a, *b;
    float *out;
    int64_t n, columns, a_form, b_form;
    const epilogue *finish;
    int64_t threads;
} binary_call;

int binary_prepared(const binary_call *c)
{
    binary_flat((int)c->kind, c->a, c->b, c->out, c->n, c->columns, (int)c->a_form, (int)c->b_form, c->finish,
                (int)c->threads);
    return DONE;
}

static void unary_flat(int kind, const float *restrict x, float *restrict out, int64_t n, const epilogue *finish,
                       int threads)
{
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int part = 0; part < threads; part++) {
        int64_t lo, hi;
        share(n, LANES, part, threads, &lo, &hi);
        if (kind == LOGISTIC || kind == GELU || kind == GELU_TANH)
            unary_span(kind, x + lo, out + lo, hi - lo);
        else if (kind == RSQRT)  /* as numpy's formulation: a float32 square root, then its reciprocal */
            for (int64_t i = lo; i < hi; i++)
                out[i] = 1.0f / sqrtf(x[i]);
        else if (kind == HARD_SWISH)
            for (int64_t i = lo; i < hi; i++) {
                float gate = x[i] + 3.0f;
                gate = gate < 0.0f ? 0.0f : gate;
                gate = gate > 6.0f ? 6.0f : gate;
                out[i] = x[i] * gate / 6.0f;
            }
        else if (out != x)
            memcpy(out + lo, x + lo, (hi - lo) * sizeof *out);
        if (hi > lo)
            finish_rows(out + lo, 1, hi - lo, 0, finish);
    }
}

/* A constant pad of the last axis: each of ``rows`` rows of ``columns`` floats gets ``before`` and
 * ``after`` values of ``value`` around it. */
static void pad_rows(const float *restrict x, float *restrict out, int64_t rows, int64_t columns, int64_t before,
                     int64_t after, float value, int threads)
{
    int64_t width = before + columns + after;
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * width;
        for (int64_t j = 0; j < before; j++)
            o[j] = value;
        memcpy(o + before, x + r * columns, columns * sizeof(float));
        for (int64_t j = before + columns; j < width; j++)
            o[j] = value;
    }
}

/* MEAN over the pixels of (pixels, c) images as LiteRT's kernels compute it: per channel one float32 sum over
 * the pixels in order, divided by the count (partial sums in another order drift from LiteRT's over many
 * pixels: 0.5% over a million).  Threads take blocks of MEAN_BLOCK channels, each summed as one vector row;
 * images of fewer channels go several to a block, so that their sums are independent chains (a transformer's
 * MEAN over the last 32 of 197 x 32 values, one image of one channel per row: each row's 32 additions waited
 * on each other, 13 us on the 2-core VM). */
#define MEAN_BLOCK 64
int mean_pixels(const float *restrict x, float *restrict out, int64_t images, int64_t pixels, int64_t c,
                int threads)
{
    int team = team_of(threads);
    int64_t group = c >= MEAN_BLOCK ? 1 : MEAN_BLOCK / c, shared = (images + team - 1) / team;
    group = group < shared ? group : shared;
    group = group > 1 ? group : 1;
    int64_t blocks = (c + MEAN_BLOCK - 1) / MEAN_BLOCK, groups = (images + group - 1) / group, tasks = groups * blocks;
    #pragma omp parallel for num_threads(team) schedule(static) if (team > 1 && tasks > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t first = task / blocks * group, count = images - first < group ? images - first : group;
        int64_t k0 = task % blocks * MEAN_BLOCK, n = c - k0 < MEAN_BLOCK ? c - k0 : MEAN_BLOCK;
        const float *in = x + first * pixels * c + k0;
        float sums[MEAN_BLOCK] = {0};  /* count * n <= MEAN_BLOCK */
        if (n == 1)  /* one value a pixel: the images' chains side by side, no loop over channels */
            for (int64_t p = 0; p < pixels; p++)
                for (int64_t i = 0; i < count; i++)
                    sums[i] += in[(i * pixels + p) * c];
        else
            for (int64_t p = 0; p < pixels; p++)
                for (int64_t i = 0; i < count; i++)
                    for (int64_t k = 0; k < n; k++)
                        sums[i * n + k] += in[(i * pixels + p) * c + k];
        for (int64_t i = 0; i < count; i++)
            for (int64_t k = 0; k < n; k++)
                out[(first + i) * c + k0 + k] = sums[i * n + k] / (float)pixels;
    }
    return DONE;
}

/* RESIZE_BILINEAR of (h, w, c) images to (oh, ow): output row oy blends input rows y0[oy] and y1[oy]
 * by wy[oy], column ox input columns x0[ox] and x1[ox] by wx[ox]; columns first, like the numpy
 * kernel: a + (b - a) * weight. */
static void resize_bilinear(const float *restrict x, int64_t images, int64_t h, int64_t w, int64_t c,
                            const int64_t *restrict y0, const int64_t *restrict y1, const float *restrict wy,
                            const int64_t *restrict x0, const int64_t *restrict x1, const float *restrict wx,
                            float *restrict out, int64_t oh, int64_t ow, int threads)
{
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < images * oh; r++) {
        int64_t image = r / oh, oy = r % oh;
        const float *top = x + (image * h + y0[oy]) * w * c, *bottom = x + (image * h + y1[oy]) * w * c;
        float *row = out + r * ow * c, weight = wy[oy];
        for (int64_t ox = 0; ox < ow; ox++) {
            const float *tl = top + x0[ox] * c, *tr = top + x1[ox] * c;
            const float *bl = bottom + x0[ox] * c, *br = bottom + x1[ox] * c;
            float across = wx[ox], *pixel = row + ox * c;
            for (int64_t k = 0; k < c; k++) {
                float upper = tl[k] + (tr[k] - tl[k]) * across, lower = bl[k] + (br[k] - bl[k]) * across;
                pixel[k] = upper + (lower - upper) * weight;
            }
        }
    }
}

/* MAX_POOL_2D (average 0) or AVERAGE_POOL_2D (average 1, dividing by the taps inside the image) of
 * (h, w, c) images as the geometry says (dilations 1), then the epilogue's clamp; padding is left
 * out, as TFLite does. */
static void pool_rows(const float *restrict images, float *restrict out, const geometry *g, int average,
                      const epilogue *finish, int threads)
{
    int64_t h = g->h, w = g->w, c = g->c, oh = g->oh, ow = g->ow;
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < g->images * oh; r++) {
        int64_t oy = r % oh;
        const float *x = images + r / oh * g->image_in;
        float *row = out + r / oh * g->image_out + oy * g->out_stride;
        int64_t y_lo = oy * g->stride_h - g->top, y_hi = y_lo + g->kh;
        y_lo = y_lo < 0 ? 0 : y_lo;
        y_hi = y_hi > h ? h : y_hi;
        for (int64_t ox = 0; ox < ow; ox++) {
            int64_t x_lo = ox * g->stride_w - g->left, x_hi = x_lo + g->kw;
            x_lo = x_lo < 0 ? 0 : x_lo;
            x_hi = x_hi > w ? w : x_hi;
            float *pixel = row + ox * c;
            int first = 1;
            for (int64_t iy = y_lo; iy < y_hi; iy++)
                for (int64_t ix = x_lo; ix < x_hi; ix++, first = 0) {
                    const float *in = x + (iy * w + ix) * c;
                    if (first)
                        memcpy(pixel, in, c * sizeof *pixel);
                    else if (average)
                        for (int64_t k = 0; k < c; k++)
                            pixel[k] += in[k];
                    else
                        for (int64_t k = 0; k < c; k++)
                            pixel[k] = pixel[k] < in[k] ? in[k] : pixel[k];
                }
            if (first)
                memset(pixel, 0, c * sizeof *pixel);
            else if (average) {
                float count = (float)((y_hi - y_lo) * (x_hi - x_lo));
                for (int64_t k = 0; k < c; k++)
                    pixel[k] /= count;
            }
        }
        finish_rows(row, 1, ow * c, 0, finish);
    }
}

/* A quantized output stage per column (quant_util.Rescale's constants, exact in int64):
 * clamp((acc * multiplier[j] + offset[j] - (acc < tie_below[j] ? tie[j] : 0)) >> shift[j, or 0 for all]),
 * tie arrays NULL where no tie rounds away from zero. */
typedef struct {
    const int64_t *multiplier, *offset, *shift;
    int64_t shifts;  /* whether shift holds one per column */
    const int64_t *tie_below, *tie;
    int64_t low, high;
} requant;

static inline int64_t requantize(int64_t a, int64_t j, const requant *q)
{
    int64_t v = a * q->multiplier[j] + q->offset[j];
    if (q->tie && a < q->tie_below[j])
        v -= q->tie[j];
    v >>= q->shift[q->shifts ? j : 0];
    return v < q->low ? q->low : v > q->high ? q->high : v;
}

/* One row of the output stage on exact integer sums held in floats; one copy per accumulator and output type. */
#define RESCALE_ROW(ACC_T, OUT_T)                                                                          \
    static void rescale_##ACC_T##_##OUT_T(const ACC_T *restrict acc, const requant *q, OUT_T *restrict out,  \
                                          int64_t channels)                                                \
    {                                                                                                      \
        for (int64_t j = 0; j < channels; j++)                                                             \
            out[j] = (OUT_T)requantize((int32_t)acc[j], j, q);                                             \
    }
RESCALE_ROW(float, int8_t)
RESCALE_ROW(float, uint8_t)
RESCALE_ROW(float, int16_t)
RESCALE_ROW(double, int8_t)
RESCALE_ROW(double, uint8_t)
RESCALE_ROW(double, int16_t)

/* A quantized kernel's output stage on exact integer sums held in floats (see quant_util.Rescale), the
 * stage's constants as requant has them; acc float32 (wide 0) or float64 (wide 1), out int8, uint8 or
 * int16 (out_kind 0, 1, 2). */
void rescale_rows(const void *acc, int wide, int64_t acc_stride, const int64_t *multiplier, const int64_t *offset,
                  const int64_t *shift, int shift_per_channel, const int64_t *tie_below, const int64_t *tie,
                  int64_t low, int64_t high, void *out, int out_kind, int64_t out_stride, int64_t rows,
                  int64_t channels, int threads)
{
    requant q = {multiplier, offset, shift, shift_per_channel, tie_below, tie, low, high};
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *a32 = (const float *)acc + r * acc_stride;
        const double *a64 = (const double *)acc + r * acc_stride;
        if (wide && out_kind == 0)
            rescale_double_int8_t(a64, &q, (int8_t *)out + r * out_stride, channels);
        else if (wide && out_kind == 1)
            rescale_double_uint8_t(a64, &q, (uint8_t *)out + r * out_stride, channels);
        else if (wide)
            rescale_double_int16_t(a64, &q, (int16_t *)out + r * out_stride, channels);
        else if (out_kind == 0)
            rescale_float_int8_t(a32, &q, (int8_t *)out + r * out_stride, channels);
        else if (out_kind == 1)
            rescale_float_uint8_t(a32, &q, (uint8_t *)out + r * out_stride, channels);
        else
            rescale_float_int16_t(a32, &q, (int16_t *)out + r * out_stride, channels);
    }
}

/* PReLU with a slope per channel: out = x where x >= 0, else x * slope[c], over rows of channels. */
static void prelu_rows(const float *restrict x, const float *restrict slope, float *restrict out, int64_t rows,
                       int64_t channels, int threads)
{
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * channels;
        float *o = out + r * channels;
        scale_negative(in, slope, o, channels);
    }
}

/* unary_flat, pad_rows, pool_rows, prelu_rows and resize_bilinear with their arguments in one struct each, as
 * depthwise_call: prepared calls, so that they join a partition's batched stretches (run_prepared). */
typedef struct {
    int64_t kind;
    const float *x;
    float *out;
    int64_t n;
    const epilogue *finish;
    int64_t threads;
} unary_call;

int unary_prepared(const unary_call *c)
{
    unary_flat((int)c->kind, c->x, c->out, c->n, c->finish, (int)c->threads);
    return DONE;
}

typedef struct {
    const float *x;
    float *out;
    int64_t rows, columns, before, after;
    float value;
    int64_t threads;
} pad_call;

int pad_prepared(const pad_call *c)
{
    pad_rows(c->x, c->out, c->rows, c->columns, c->before, c->after, c->value, (int)c->threads);
    return DONE;
}

typedef struct {
    const float *x;
    float *out;
    const geometry *where;
    int64_t average;
    const epilogue *finish;
    int64_t threads;
} pool_call;

int pool_prepared(const pool_call *c)
{
    pool_rows(c->x, c->out, c->where, (int)c->average, c->finish, (int)c->threads);
    return DONE;
}

typedef struct {
    const float *x, *slope;
    float *out;
    int64_t rows, channels, threads;
} prelu_call;

int prelu_prepared(const prelu_call *c)
{
    prelu_rows(c->x, c->slope, c->out, c->rows, c->channels, (int)c->threads);
    return DONE;
}

typedef struct {
    const float *x;
    float *out;
    int64_t images, h, w, c;
    const int64_t *y0, *y1;
    const float *wy;
    const int64_t *x0, *x1;
    const float *wx;
    int64_t oh, ow, threads;
} resize_call;

int resize_prepared(const resize_call *c)
{
    resize_bilinear(c->x, c->images, c->h, c->w, c->c, c->y0, c->y1, c->wy, c->x0, c->x1, c->wx, c->out, c->oh,
                    c->ow, (int)c->threads);
    return DONE;
}

/* CBLAS sgemm, row-major, with 64-bit or 32-bit integers (as the BLAS numpy loaded was built). */
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
typedef void (*sgemm32_fn)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t,
                           const float *, int32_t, float, float *, int32_t);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static void sgemm_of(void *fn, int int64, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    int ta = trans_a ? TRANS : NO_TRANS, tb = trans_b ? TRANS : NO_TRANS;
    if (int64)
        ((sgemm64_fn)fn)(ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    else
        ((sgemm32_fn)fn)(ROW_MAJOR, ta, tb, (int32_t)m, (int32_t)n, (int32_t)k, 1.0f, a, (int32_t)lda,
                         b, (int32_t)ldb, 0.0f, c, (int32_t)ldc);
}

static void sgemm(void *fn, int int64, int trans_a, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    sgemm_of(fn, int64, trans_a, 0, m, n, k, a, lda, b, ldb, c, ldc);
}

/* BATCH_MATMUL of contiguous float32 operands: out[i] = a[i] @ b[i] for ``batch`` products of (m x k) by
 * (k x n), each operand transposed where its ``trans`` says (stored k x m, n x k), b the same matrix for all
 * where ``b_step`` is 0; the products, each in bands of rows, shared among ``threads`` (BLAS's sgemm on one
 * thread each).  A transformer's attention products otherwise went through numpy between the batched native
 * calls, on one thread. */
typedef struct {
    const float *a, *b;
    float *out;
    void *sgemm;
    int64_t int64, batch, m, n, k, trans_a, trans_b, b_step, threads;
} batch_product_call;

int batch_product_prepared(const batch_product_call *p)
{
    int64_t m = p->m, n = p->n, k = p->k, team = team_of(p->threads);
    int64_t bands = team > 1 && p->batch < team ? (team + p->batch - 1) / p->batch : 1;
    bands = bands < m ? bands : (m > 0 ? m : 1);
    #pragma omp parallel for num_threads(team) schedule(static) if (team > 1 && p->batch * bands > 1)
    for (int64_t task = 0; task < p->batch * bands; task++) {
        int64_t i = task / bands, r0 = m * (task % bands) / bands, r1 = m * (task % bands + 1) / bands;
        const float *a = p->a + i * m * k, *b = p->b + i * p->b_step;
        if (r1 > r0)
            sgemm_of(p->sgemm, (int)p->int64, (int)p->trans_a, (int)p->trans_b, r1 - r0, n, k,
                     p->trans_a ? a + r0 : a + r0 * k, p->trans_a ? m : k, b, p->trans_b ? k : n,
                     p->out + i * m * n + r0 * n, n);
    }
    return DONE;
}

/* Rows of c one product of a thread's share covers: the share's epilogue then runs while they are
 * in cache (256 KB of them). */
#define BLOCK_FLOATS (1 << 16)

/* c = a @ b (a: m x k, transposed when trans_a; b: k x n; c: m x n), then the epilogue, as
 * products on each thread's share of c's rows, or of its columns (whole vectors of 16) when it
 * has few rows. */
void shared_product(void *fn, int int64, int trans_a, int64_t m, int64_t n, int64_t k, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, const epilogue *finish,
                    int threads)
{
    int by_rows = m >= 16 * threads;
    int64_t extent = by_rows ? m : (n + 15) / 16;
    if (extent < threads)
        threads = (int)extent;
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int part = 0; part < threads; part++) {
        int64_t lo = extent * part / threads, hi = extent * (part + 1) / threads;
        if (by_rows) {
            int64_t step = BLOCK_FLOATS / (n > 0 ? n : 1);
            step = step < 16 ? 16 : step;
            for (int64_t r = lo; r < hi; r += step) {
                int64_t rows = hi - r < step ? hi - r : step;
                sgemm(fn, int64, trans_a, rows, n, k, trans_a ? a + r : a + r * lda, lda, b, ldb, c + r * ldc, ldc);
                finish_rows(c + r * ldc, rows, n, ldc, finish);
            }
        } else {
            int64_t c0 = 16 * lo, c1 = 16 * hi < n ? 16 * hi : n;
            epilogue part = *finish;
            if (part.bias)
                part.bias += c0;
            if (part.slope)
                part.slope += c0;
            sgemm(fn, int64, trans_a, m, c1 - c0, k, a, lda, b + c0, ldb, c + c0, ldc);
            finish_rows(c + c0, m, c1 - c0, ldc, &part);
        }
    }
}

static const int64_t ZERO[1] = {0};  /* a plain product's one tap: no offset, the panels' first row */

/* Rows of a that one pass over the panels covers: they stay in cache (128 KB) while every panel
 * reads them. */
#define PASS_FLOATS (1 << 15)

/* One product against a packed operand: c = a @ packed (a: m x k, a[r][p] at a[r * row_step +
 * p * column_step]; c: m x n, rows ldc apart), then the epilogue (its bias padded to whole panels),
 * adding ``residual`` (laid out as c) where not NULL.  Kernels build it once and set a and c (and
 * residual) per run (one argument is a cheaper call). */
typedef struct {
    int64_t m, n, k;
    const float *a;
    int64_t row_step, column_step;
    const float *packed;
    float *c;
    int64_t ldc;
    const epilogue *finish;
    int64_t threads;
    const float *residual;
} product;

/* How a team of ``threads`` splits tiles x panels into row groups x panel groups (*row_groups x
 * *panel_groups = threads): the split whose largest block of (tile, panel) pairs is least, rows before
 * panels where two tie.  49 rows on 2 threads split by rows alone gave one thread 4 tiles of 8 and the other
 * 3, the first an eighth of the op over the second's; 960 columns split by panels gave each 15 of 30.  A split by
 * rows alone is kept unless its block is over 9/8 of the least: the ops of a network then give each thread the
 * same pixels, so it reads the rows it wrote itself; split by panels, each thread read half of its input from
 * the other core (2-core VM, MobileNetV2's 14x14 1x1 convolutions at 2 threads in sequence: 47 us an op by
 * panels, 37-40 by rows, 60 on one thread; the network 3.04 -> 2.89 ms). */
static void team_split(int64_t tiles, int64_t panels, int threads, int *row_groups, int *panel_groups)
{
    int64_t best = -1;
    for (int rows = threads; rows >= 1; rows--) {
        if (threads % rows)
            continue;
        int cols = threads / rows;
        int64_t block = ((tiles + rows - 1) / rows) * ((panels + cols - 1) / cols);
        if (best < 0 || block < best) {
            best = block;
            *row_groups = rows;
            *panel_groups = cols;
        }
    }
    int64_t by_rows = ((tiles + threads - 1) / threads) * panels;
    if (by_rows * 8 <= best * 9) {
        *row_groups = threads;
        *panel_groups = 1;
    }
}

/* The product, with the epilogue on each tile in registers: each thread takes a block of the row tiles
 * and panels (team_split). */
int packed_product(const product *p)
{
    int64_t m = p->m, n = p->n, k = p->k, tiles = (m + MR - 1) / MR, panels = (n + PANEL - 1) / PANEL;
    int threads = tiles * panels > 1 ? team_of(p->threads) : 1, row_groups = 1, panel_groups = 1;
    team_split(tiles, panels, threads, &row_groups, &panel_groups);
    int64_t pass = PASS_FLOATS / (k > 0 ? k : 1) / MR;
    pass = pass < 1 ? 1 : pass;
    epilogue adding = with_residual(p->finish, p->residual, p->c);
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int part = 0; part < threads; part++) {
        int64_t rows_part = part / panel_groups, cols_part = part % panel_groups;
        int64_t t0 = tiles * rows_part / row_groups, t1 = tiles * (rows_part + 1) / row_groups;
        int64_t p0 = panels * cols_part / panel_groups, p1 = panels * (cols_part + 1) / panel_groups;
        for (int64_t first = t0; first < t1; first += pass) {
            int64_t last = first + pass < t1 ? first + pass : t1;
            for (int64_t j = p0; j < p1; j++) {
                int64_t col = j * PANEL, width = n - col < PANEL ? n - col : PANEL;  /* of the panel's columns */
                epilogue part = panel_finish(&adding, col);
                int64_t most = width <= PANEL_LANES ? MR_NARROW : MR, end = last * MR < m ? last * MR : m;
                /* tiles of as even a height as the rows allow (49 rows: 7 of 7, not 6 of 8 and one of 1, whose
                 * sums would wait on each other), each height's tiles in one call */
                int64_t row = first * MR, tiles_here = (end - row + most - 1) / most;
                int64_t low = tiles_here ? (end - row) / tiles_here : 0, taller = tiles_here ? (end - row) % tiles_here : 0;
                if (taller)
                    panel_rows((int)(low + 1), p->a + row * p->row_step, p->row_step, p->column_step, ZERO, ZERO, 1,
                               k, p->packed + j * PANEL * k, p->c + row * p->ldc + col, p->ldc, width, &part, taller);
                row += taller * (low + 1);
                if (row < end)
                    panel_rows((int)low, p->a + row * p->row_step, p->row_step, p->column_step, ZERO, ZERO, 1, k,
                               p->packed + j * PANEL * k, p->c + row * p->ldc + col, p->ldc, width, &part,
                               tiles_here - taller);
            }
        }
    }
    return DONE;
}

/* Integer kernels: int8 x int8 -> int32 sums with TFLite's semantics, requantized per output channel in
 * the same pass (qstage).  A constant operand is packed once (native.py's PackedInt8) into panels of
 * QPANEL columns, its depth in groups of QGROUP (zero past the last): each group the QGROUP consecutive
 * depths of each column in turn; with each column's weight sum (a VNNI product runs on the input
 * biased to unsigned and takes 128 times that sum back).  Sums are exact: the caller folds the input
 * zero point into the stage's biases (less the weight sums times the zero point).  Register tiles of up to
 * QMR rows by one panel, by the widest integer dot product the machine has: AVX-512 VNNI vpdpbusd on
 * groups of 4, AVX2 vpmaddwd on groups of 2 sign-extended to int16 (vpmaddubsw would saturate; the rows
 * are widened once per tile, each pair of depths broadcast against the 16 columns' pairs, so that the
 * sums come out a column a lane, ready for the output stage), else portable C. */
#define QPANEL 16
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QMR 8
#define QGROUP 4
int integer_isa(void) { return 2; }
#if defined(__AVX512VL__)
#define QTILE_REQUANTIZED 1  /* tiles requantized in registers (qtile_requantized) */
#endif
#elif defined(__AVX2__)
#define QMR 4  /* 8 sums, 2 panel vectors and a broadcast value of each row in 16 registers */
#define QGROUP 2
int integer_isa(void) { return 1; }
#else
#define QMR 4
#define QGROUP 4
int integer_isa(void) { return 0; }
#endif
int integer_group(void) { return QGROUP; }

/* An integer kernel's output stage, TFLite's MultiplyByQuantizedMultiplier step by step on each channel
 * j's int32 sum: add bias[j], shift left by left[j], the rounding doubling high multiply by multiplier[j]
 * (floor((x * m + 2**30) / 2**31)), then the rounding right shift by right[j]: x >> right plus one where
 * the bits shifted out (x & mask[j]) exceed threshold[j] (half less one), and one more where away[j]
 * (-1: ties away from zero, gemmlowp's scalar rounding; 0: ties up, the vector loops' and ruy's); add
 * the output zero point, clamp.  Arrays per channel, padded to whole vectors of 16. */
typedef struct {
    const int32_t *bias, *multiplier, *left, *right, *mask, *threshold, *away;
    /* see single_shift: per group of 8 channels the even ones' then the odd ones', as 64-bit lanes */
    const int64_t *nudge, *nudge_away, *wide_multiplier;
    const int32_t *single_right;  /* see single_shift: right - 1 */
    int32_t zero, low, high;
    int32_t shifts_left, rounds_away;  /* whether any channel's left is not 0, any away not 0 */
    /* Whether every channel's steps after the bias are one rounding shift of the 64-bit product p: no left
     * shift and right from 1 to 22.  The rounding of the high multiply, that of the right shift and the zero
     * point then join (floor((floor((p + 2**30) / 2**31) + 2**(r-1)) / 2**r) is floor((p + 2**30 + 2**(30+r))
     * / 2**(31+r))) in nudge[j] = 2**30 + 2**(30+r) + zero * 2**(31+r): the output (before the clamp) is the
     * high half of p + nudge shifted right by r - 1.  Ties away from zero take 2**31 less where p < 0
     * (nudge_away; the high multiply's result is negative there, or rounds to 0 either way). */
    int32_t single_shift;
} qstage;

static inline int32_t qrequantize(int32_t acc, int64_t j, const qstage *q)
{
    int32_t x = (int32_t)((uint32_t)acc + (uint32_t)q->bias[j]);
    x = (int32_t)((uint32_t)x << q->left[j]);
    x = (int32_t)(((int64_t)x * q->multiplier[j] + (1 << 30)) >> 31);
    int32_t threshold = q->threshold[j] + (q->away[j] & (x < 0));
    x = (x >> q->right[j]) + ((x & q->mask[j]) > threshold) + q->zero;
    return x < q->low ? q->low : x > q->high ? q->high : x;
}

#if defined(__AVX2__)
#define QLOAD(a) _mm256_loadu_si256((const __m256i *)((a) + j))
/* p + nudge (4 lanes of single_shift products from ``at``), nudge_away where p < 0 (``away``: the stage rounds
 * some ties away). */
static inline __attribute__((always_inline)) __m256i qnudged(__m256i p, int64_t at, const qstage *q, const int away)
{
    __m256i nudge = _mm256_loadu_si256((const __m256i *)(q->nudge + at));
    if (away)
        nudge = _mm256_castpd_si256(_mm256_blendv_pd(
            _mm256_castsi256_pd(nudge), _mm256_loadu_pd((const double *)(q->nudge_away + at)), _mm256_castsi256_pd(p)));
    return _mm256_add_epi64(p, nudge);
}

/* qrequantize on the 8 channels j..j+7 (j a multiple of 8) of a single_shift stage, the zero point added but
 * not clamped (``away``: as for qnudged). */
static inline __attribute__((always_inline)) __m256i qrequantize8_single(__m256i acc, int64_t j, const qstage *q,
                                                                        const int away)
{
    __m256i x = _mm256_add_epi32(acc, QLOAD(q->bias));
    __m256i even = qnudged(_mm256_mul_epi32(x, QLOAD(q->wide_multiplier)), j, q, away);
    __m256i odd = qnudged(_mm256_mul_epi32(_mm256_srli_epi64(x, 32), QLOAD(q->wide_multiplier + 4)), j + 4, q, away);
    x = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    return _mm256_srav_epi32(x, QLOAD(q->single_right));
}

/* qrequantize on the 8 channels j..j+7 at once. */
static inline __attribute__((always_inline)) __m256i qrequantize8(__m256i acc, int64_t j, const qstage *q)
{
    if (q->single_shift)
        return _mm256_min_epi32(_mm256_max_epi32(q->rounds_away ? qrequantize8_single(acc, j, q, 1)
                                                                : qrequantize8_single(acc, j, q, 0),
                                                 _mm256_set1_epi32(q->low)), _mm256_set1_epi32(q->high));
    __m256i x = _mm256_sllv_epi32(_mm256_add_epi32(acc, QLOAD(q->bias)), QLOAD(q->left));
    __m256i m = QLOAD(q->multiplier), nudge = _mm256_set1_epi64x(1 << 30);
    __m256i even = _mm256_add_epi64(_mm256_mul_epi32(x, m), nudge);
    __m256i odd = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(x, 32), _mm256_srli_epi64(m, 32)), nudge);
    x = _mm256_blend_epi32(_mm256_srli_epi64(even, 31), _mm256_slli_epi64(odd, 1), 0xAA);
    __m256i negative = _mm256_cmpgt_epi32(_mm256_setzero_si256(), x);
    __m256i threshold = _mm256_sub_epi32(QLOAD(q->threshold), _mm256_and_si256(QLOAD(q->away), negative));
    __m256i up = _mm256_cmpgt_epi32(_mm256_and_si256(x, QLOAD(q->mask)), threshold);
    x = _mm256_add_epi32(_mm256_sub_epi32(_mm256_srav_epi32(x, QLOAD(q->right)), up), _mm256_set1_epi32(q->zero));
    return _mm256_min_epi32(_mm256_max_epi32(x, _mm256_set1_epi32(q->low)), _mm256_set1_epi32(q->high));
}
#undef QLOAD

#if defined(__AVX512F__)
/* A qstage's vectors for the 16 channels j..j+15, loaded once for every row of a tile. */
typedef struct {
    __m512i bias, left, multiplier, odd_multiplier, threshold, away, mask, right, zero, low, high;
} qstage16;

static inline __attribute__((always_inline)) qstage16 qstage_at(const qstage *q, int64_t j)
{
#define QLOAD16(a) _mm512_loadu_si512((const void *)((a) + j))
    qstage16 v = {QLOAD16(q->bias), QLOAD16(q->left), QLOAD16(q->multiplier),
                  _mm512_srli_epi64(QLOAD16(q->multiplier), 32), QLOAD16(q->threshold), QLOAD16(q->away),
                  QLOAD16(q->mask), QLOAD16(q->right), _mm512_set1_epi32(q->zero), _mm512_set1_epi32(q->low),
                  _mm512_set1_epi32(q->high)};
    return v;
#undef QLOAD16
}

/* qrequantize on 16 channels at once (qrequantize8's steps, with masks); without ``left`` the left
 * shifts (all 0) are left out, without ``away`` the ties' adjustment (all ties up). */
static inline __attribute__((always_inline)) __m512i qrequantize_steps(__m512i acc, const qstage16 *v,
                                                                      const int left, const int away)
{
    __m512i x = _mm512_add_epi32(acc, v->bias);
    if (left)
        x = _mm512_sllv_epi32(x, v->left);
    __m512i nudge = _mm512_set1_epi64(1 << 30);
    __m512i even = _mm512_add_epi64(_mm512_mul_epi32(x, v->multiplier), nudge);
    __m512i odd = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(x, 32), v->odd_multiplier), nudge);
    x = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 31), _mm512_slli_epi64(odd, 1));
    __m512i threshold = v->threshold;
    if (away) {
        __mmask16 negative = _mm512_cmpgt_epi32_mask(_mm512_setzero_si512(), x);
        threshold = _mm512_mask_sub_epi32(v->threshold, negative, v->threshold, v->away);
    }
    __mmask16 up = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, v->mask), threshold);
    x = _mm512_add_epi32(_mm512_srav_epi32(x, v->right), v->zero);
    x = _mm512_mask_add_epi32(x, up, x, _mm512_set1_epi32(1));
    return _mm512_min_epi32(_mm512_max_epi32(x, v->low), v->high);
}

/* F(..., left, away) with the stage's steps as constants: a call per combination the stage can have, so that
 * loops over many vectors leave out the steps it does not take (see qrequantize_steps). */
#define BY_STAGE(q, F, ...) ((q)->shifts_left ? F(__VA_ARGS__, 1, 1) \
                             : (q)->rounds_away ? F(__VA_ARGS__, 0, 1) : F(__VA_ARGS__, 0, 0))

static inline __attribute__((always_inline)) __m512i qrequantize_with(__m512i acc, const qstage16 *v)
{
    return qrequantize_steps(acc, v, 1, 1);
}

/* qrequantize on the 16 channels j..j+15 at once. */
static inline __attribute__((always_inline)) __m512i qrequantize16(__m512i acc, int64_t j, const qstage *q)
{
    qstage16 v = qstage_at(q, j);
    return qrequantize_with(acc, &v);
}
#endif

/* 16 int32 values (in the int8 range) as 16 bytes in order. */
static inline __m128i narrow16(__m256i a, __m256i b)
{
    __m256i words = _mm256_packs_epi32(a, b);  /* a0-3 b0-3 | a4-7 b4-7 */
    __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    return _mm_shuffle_epi32(bytes, 0xD8);
}

/* The stage's kind for qrequantize_bytes: 0 (steps in turn), 1 (single_shift, ties up), 2 (single_shift, some
 * ties away). */
static inline int qstage_kind(const qstage *q) { return q->single_shift ? 1 + (q->rounds_away != 0) : 0; }

/* The sums s0, s1 of the 16 channels j..j+15 (j a multiple of 8) requantized to bytes (``kind``: the stage's
 * qstage_kind; a single_shift's values are clamped once narrowed: the narrowing saturates to the int8 range). */
static inline __attribute__((always_inline)) __m128i qrequantize_bytes(__m256i s0, __m256i s1, int64_t j,
                                                                      const qstage *q, const int kind)
{
    if (!kind)
        return narrow16(qrequantize8(s0, j, q), qrequantize8(s1, j + 8, q));
    __m128i bytes = narrow16(qrequantize8_single(s0, j, q, kind == 2), qrequantize8_single(s1, j + 8, q, kind == 2));
    return _mm_min_epi8(_mm_max_epi8(bytes, _mm_set1_epi8((char)q->low)), _mm_set1_epi8((char)q->high));
}
#endif

/* out[j] = qrequantize(acc[j], first + j) for j < n. */
static inline void qstore(const int32_t *restrict acc, int64_t first, int64_t n, const qstage *q, int8_t *restrict out)
{
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16) {
        __m512i v = qrequantize16(_mm512_loadu_si512((const void *)(acc + j)), first + j, q);
        _mm_storeu_si128((__m128i *)(out + j), _mm512_cvtepi32_epi8(v));
    }
#endif
#if defined(__AVX2__)
    for (; j + 16 <= n; j += 16) {
        __m256i a = qrequantize8(_mm256_loadu_si256((const __m256i *)(acc + j)), first + j, q);
        __m256i b = qrequantize8(_mm256_loadu_si256((const __m256i *)(acc + j + 8)), first + j + 8, q);
        _mm_storeu_si128((__m128i *)(out + j), narrow16(a, b));
    }
    if (j + 8 <= n) {
        __m256i a = qrequantize8(_mm256_loadu_si256((const __m256i *)(acc + j)), first + j, q);
        _mm_storel_epi64((__m128i *)(out + j), narrow16(a, a));
        j += 8;
    }
#endif
    for (; j < n; j++)
        out[j] = (int8_t)qrequantize(acc[j], first + j, q);
}

#if defined(__AVX2__) && QGROUP == 2
/* Bytes of qrows' scratch for rows of ``depth``: QMR rows widened to int16, of whole pairs. */
static size_t qrows_scratch(int64_t depth) { return (size_t)QMR * ((depth + 1) / 2) * 2 * sizeof(int16_t); }
#define QROWS_MAX QMR
int integer_amx(void) { return 0; }
static void qrows_begin(void) {}
static void qrows_end(void) {}
static int64_t qpanel_groups(int64_t depth) { return (depth + 1) / 2; }

/* The ``rows`` rows a[r] of ``depth`` int8 widened to int16 rows ``stride`` apart, a depth of zero past an odd
 * one's end. */
static void widen_rows(int rows, const int8_t *const *a, int64_t depth, int16_t *wide, int64_t stride)
{
    for (int r = 0; r < rows; r++) {
        const int8_t *src = a[r];
        int16_t *dst = wide + r * stride;
        int64_t k = 0;
        for (; k + 16 <= depth; k += 16)
            _mm256_storeu_si256((__m256i *)(dst + k),
                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(src + k))));
        for (; k < depth; k++)
            dst[k] = src[k];
        if (depth & 1)
            dst[depth] = 0;
    }
}

/* One step of qtile_wide for its row R (where the tile has one): the row's sums s0 (columns 0..7) and s1 (8..15)
 * plus its pair of depths g times the panel's (w0, w1). */
#define QTILE_STEP(R, s0, s1)                                                          \
    if (R < rows) {                                                                    \
        int32_t pair;                                                                  \
        memcpy(&pair, a + (R) * stride + 2 * g, sizeof pair);                          \
        __m256i x = _mm256_set1_epi32(pair);                                           \
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(x, w0));                           \
        if (halves == 2)                                                               \
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(x, w1));                       \
    }

/* The sums of ``rows`` (up to QMR) widened rows (``stride`` apart, ``pairs`` pairs of depths) against the panel
 * of columns col.., its first 8 columns or (``halves`` 2) all 16, requantized in registers (``kind``: see
 * qrequantize_bytes) and the first ``width`` bytes of each row stored.  The sums are named, not an array: gcc
 * copies an array's registers around on every step. */
static inline __attribute__((always_inline)) void qtile_wide(const int rows, const int halves, const int kind,
                                                           const int16_t *a, int64_t stride, int64_t pairs,
                                                           const int8_t *restrict panel, int64_t col, int64_t width,
                                                           const qstage *stage, int8_t *out, int64_t ldc)
{
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00,
            s31 = s00;
    for (int64_t g = 0; g < pairs; g++) {
        const int8_t *w = panel + 32 * g;
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
        __m256i w1 = halves == 2 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16))) : w0;
        QTILE_STEP(0, s00, s01)
        QTILE_STEP(1, s10, s11)
        QTILE_STEP(2, s20, s21)
        QTILE_STEP(3, s30, s31)
    }
    __m256i sums[QMR][2] = {{s00, s01}, {s10, s11}, {s20, s21}, {s30, s31}};
    for (int r = 0; r < rows; r++) {
        __m128i bytes = qrequantize_bytes(sums[r][0], sums[r][halves - 1], col, stage, kind);
        if (width >= 16)
            _mm_storeu_si128((__m128i *)(out + r * ldc + col), bytes);
        else if (width == 8)
            _mm_storel_epi64((__m128i *)(out + r * ldc + col), bytes);
        else {
            int8_t part[16];
            _mm_storeu_si128((__m128i *)part, bytes);
            memcpy(out + r * ldc + col, part, (size_t)width);
        }
    }
}
#undef QTILE_STEP

/* The rows' sums against every panel p0..p1 of ``units`` columns, requantized into out (rows ldc apart); the
 * rows widened into ``wide`` (qrows_scratch bytes) first. */
static void qrows(int rows, const int8_t *const *a, int64_t depth, const int8_t *packed, const int32_t *sums,
                  int64_t units, int64_t p0, int64_t p1, int8_t *out, int64_t ldc, const qstage *stage, void *wide)
{
    (void)sums;
    int64_t pairs = (depth + 1) / 2, stride = 2 * pairs;
    int single = qstage_kind(stage) == 1;  /* products' stages round ties up: any other takes the steps in turn */
    widen_rows(rows, a, depth, wide, stride);
    for (int64_t p = p0; p < p1; p++) {
        int64_t col = p * QPANEL, width = units - col < QPANEL ? units - col : QPANEL;
        const int8_t *panel = packed + p * 32 * pairs;
#define QTILE_CASE(R, H, S) \
        case R: qtile_wide(R, H, S, wide, stride, pairs, panel, col, width, stage, out, ldc); break;
#define QTILE_ROWS(H, S) \
        switch (rows) { QTILE_CASE(4, H, S) QTILE_CASE(3, H, S) QTILE_CASE(2, H, S) QTILE_CASE(1, H, S) }
        if (width > 8 && single)
            QTILE_ROWS(2, 1)
        else if (width > 8)
            QTILE_ROWS(2, 0)
        else if (single)
            QTILE_ROWS(1, 1)
        else
            QTILE_ROWS(1, 0)
#undef QTILE_ROWS
#undef QTILE_CASE
    }
}
#else
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
/* Intel AMX, where the machine has it and the kernel lets this process use it (integer_amx, asked once as the
 * library loads): products by tiles of 16 rows by 64 depths against 16 depth groups of a panel (its layout is
 * the B operand's of tdpbssd: each row 4 depths of each of 16 columns), summed exactly in int32 as the VNNI path
 * does.  The panels' groups are then padded to whole tiles (integer_panel_groups), and rows go 16 at a time
 * (qrows_block).  XNNPACK, which LiteRT runs, multiplies int8 by AMX there: on a 2-core Xeon VM with AMX its
 * 7x7x320 -> 1280 1x1 convolution took 27.5 us against 156 us by VNNI here. */
#include <sys/syscall.h>
#include <unistd.h>
#define QROWS_MAX 16
static int amx_on;

int integer_amx(void)
{
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: without it the first tile instruction faults */
    static int asked;
    if (!asked) {
        asked = 1;
        amx_on = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    return amx_on;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Before a thread's first qrows of a parallel part: its tiles configured (two panels' sums, the rows, two
 * panels' groups: 16 rows of 64 bytes each). */
static void qrows_begin(void)
{
    if (!amx_on)
        return;
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

static void qrows_end(void)
{
    if (amx_on)
        _tile_release();
}

/* Products of fewer depths go by VNNI: a tile's 64 depths would be mostly zeros (MobileNetV2 int8's
 * 112x112x16 -> 96 1x1 convolution took 750 us by AMX against 442 by VNNI). */
#define AMX_MIN_DEPTH 64
static int by_amx(int64_t depth) { return amx_on && depth >= AMX_MIN_DEPTH; }
static int64_t qpanel_groups(int64_t depth)
{
    return by_amx(depth) ? ((depth + 3) / 4 + 15) / 16 * 16 : (depth + 3) / 4;
}

/* The rows copied into 16 rows of 4 * groups bytes (zero past each row's depth and past the last row), then per
 * panel the tiles' sums stored and requantized. */
static size_t qrows_scratch(int64_t depth)
{
    size_t rows = (size_t)QROWS_MAX * 4 * (size_t)qpanel_groups(depth), sums = 2 * QROWS_MAX * QPANEL * sizeof(int32_t);
    return by_amx(depth) ? rows + sums : 0;
}

/* The stored sums of ``rows`` rows against the panel of columns col.., requantized (the stage's vectors loaded
 * once for the panel, as qtile_requantized does) and the first ``width`` bytes of each row stored. */
static inline void qstore_tile(const int32_t *sums, int rows, int64_t col, int64_t width, const qstage *stage,
                               int8_t *out, int64_t ldc)
{
    qstage16 v = qstage_at(stage, col);
    __mmask16 keep = width >= QPANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << width) - 1);
    if (stage->shifts_left || stage->rounds_away)
        for (int r = 0; r < rows; r++)
            _mm_mask_storeu_epi8(out + r * ldc + col, keep, _mm512_cvtepi32_epi8(
                qrequantize_with(_mm512_loadu_si512((const void *)(sums + r * QPANEL)), &v)));
    else  /* the usual convolution's stage: multipliers below 1, ties up */
        for (int r = 0; r < rows; r++)
            _mm_mask_storeu_epi8(out + r * ldc + col, keep, _mm512_cvtepi32_epi8(
                qrequantize_steps(_mm512_loadu_si512((const void *)(sums + r * QPANEL)), &v, 0, 0)));
}

static void qrows_amx(int rows, const int8_t *const *a, int64_t depth, const int8_t *packed, int64_t units,
                      int64_t p0, int64_t p1, int8_t *out, int64_t ldc, const qstage *stage, void *scratch)
{
    int64_t groups = qpanel_groups(depth), kp = 4 * groups;
    int8_t *rows_copy = (int8_t *)scratch;
    int32_t *sums = (int32_t *)(rows_copy + QROWS_MAX * kp);
    for (int r = 0; r < QROWS_MAX; r++) {
        int64_t kept = r < rows ? depth : 0;
        if (kept)
            memcpy(rows_copy + r * kp, a[r], (size_t)kept);
        memset(rows_copy + r * kp + kept, 0, (size_t)(kp - kept));
    }
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) {  /* two panels at a time: each tile of rows loaded once for both */
        const int8_t *panel = packed + p * 64 * groups;
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t g = 0; g < groups; g += 16) {
            _tile_loadd(2, rows_copy + 4 * g, kp);
            _tile_loadd(3, panel + 64 * g, 64);
            _tile_loadd(4, panel + 64 * (groups + g), 64);
            _tile_dpbssd(0, 2, 3);
            _tile_dpbssd(1, 2, 4);
        }
        _tile_stored(0, sums, QPANEL * sizeof(int32_t));
        _tile_stored(1, sums + QROWS_MAX * QPANEL, QPANEL * sizeof(int32_t));
        for (int h = 0; h < 2; h++) {
            int64_t col = (p + h) * QPANEL, width = units - col < QPANEL ? units - col : QPANEL;
            qstore_tile(sums + h * QROWS_MAX * QPANEL, rows, col, width, stage, out, ldc);
        }
    }
    if (p < p1) {
        int64_t col = p * QPANEL, width = units - col < QPANEL ? units - col : QPANEL;
        const int8_t *panel = packed + p * 64 * groups;
        _tile_zero(0);
        for (int64_t g = 0; g < groups; g += 16) {
            _tile_loadd(2, rows_copy + 4 * g, kp);
            _tile_loadd(3, panel + 64 * g, 64);
            _tile_dpbssd(0, 2, 3);
        }
        _tile_stored(0, sums, QPANEL * sizeof(int32_t));
        qstore_tile(sums, rows, col, width, stage, out, ldc);
    }
}
#else
#define QROWS_MAX QMR
int integer_amx(void) { return 0; }
static void qrows_begin(void) {}
static void qrows_end(void) {}
static int64_t qpanel_groups(int64_t depth) { return (depth + 3) / 4; }
/* qrows needs no scratch here. */
static size_t qrows_scratch(int64_t depth) { (void)depth; return 0; }
#endif

/* The 4 bytes of depths 4g..4g+3 of a row of ``depth``, zero past its end (never read). */
static inline int32_t depth_group(const int8_t *row, int64_t g, int64_t depth)
{
    int32_t v = 0;
    int64_t left = depth - 4 * g;
    if (left >= 4)
        memcpy(&v, row + 4 * g, 4);
    else
        for (int64_t b = 0; b < left; b++)
            v |= (int32_t)(uint8_t)row[4 * g + b] << (8 * b);
    return v;
}

/* acc[r][0..15] = the sums of row a[r] (``depth`` bytes) against one panel, for ``rows`` <= QMR rows
 * (QMR: as many as the registers hold the sums of). */
static inline __attribute__((always_inline)) void qtile_rows(const int rows, const int8_t *const *a, int64_t depth,
                                                           const int8_t *restrict panel, const int32_t *restrict sums,
                                                           int32_t acc[QMR][QPANEL])
{
    int64_t groups = (depth + 3) / 4;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    __m512i s[QMR];
    const __m512i unsigned_bias = _mm512_set1_epi8((char)0x80);
    for (int r = 0; r < rows; r++)
        s[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; g++) {
        __m512i w = _mm512_loadu_si512(panel + 64 * g);
        for (int r = 0; r < rows; r++) {
            __m512i x = _mm512_xor_si512(_mm512_set1_epi32(depth_group(a[r], g, depth)), unsigned_bias);
            s[r] = _mm512_dpbusd_epi32(s[r], x, w);
        }
    }
    __m512i taken = _mm512_slli_epi32(_mm512_loadu_si512(sums), 7);
    for (int r = 0; r < rows; r++)
        _mm512_storeu_si512(acc[r], _mm512_sub_epi32(s[r], taken));
#else
    (void)sums;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < QPANEL; j++)
            acc[r][j] = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *w = panel + 64 * g;
        for (int r = 0; r < rows; r++) {
            int32_t x = depth_group(a[r], g, depth);
            int8_t b[4];
            memcpy(b, &x, 4);
            for (int j = 0; j < QPANEL; j++)
                acc[r][j] += b[0] * w[4 * j] + b[1] * w[4 * j + 1] + b[2] * w[4 * j + 2] + b[3] * w[4 * j + 3];
        }
    }
#endif
}

#if !defined(QTILE_REQUANTIZED)
/* qtile_rows with its row count a constant, so that the sums live in registers. */
static void qtile(int rows, const int8_t *const *a, int64_t depth, const int8_t *restrict panel,
                  const int32_t *restrict sums, int32_t acc[QMR][QPANEL])
{
#define QTILE(R) \
    case R:      \
        qtile_rows(R, a, depth, panel, sums, acc); \
        break;
    switch (rows) {
#if QMR == 8
    QTILE(8) QTILE(7) QTILE(6) QTILE(5) QTILE(4)
#elif QMR == 4
    QTILE(4)
#endif
    QTILE(3) QTILE(2) QTILE(1)
    }
#undef QTILE
}
#endif

#if defined(QTILE_REQUANTIZED)
/* qtile_rows's VNNI sums of ``rows`` rows against the panel of columns col.., requantized in registers
 * (the stage's vectors loaded once for the tile) and the first ``width`` bytes of each row stored. */
static inline __attribute__((always_inline)) void qtile_requantized(const int rows, const int8_t *const *a,
                                                                   int64_t depth, const int8_t *restrict panel,
                                                                   const int32_t *restrict sums, int64_t col,
                                                                   int64_t width, const qstage *stage,
                                                                   int8_t *out, int64_t ldc)
{
    int64_t groups = (depth + 3) / 4;
    __m512i s[QMR];
    const __m512i unsigned_bias = _mm512_set1_epi8((char)0x80);
    for (int r = 0; r < rows; r++)
        s[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; g++) {
        __m512i w = _mm512_loadu_si512(panel + 64 * g);
        for (int r = 0; r < rows; r++) {
            __m512i x = _mm512_xor_si512(_mm512_set1_epi32(depth_group(a[r], g, depth)), unsigned_bias);
            s[r] = _mm512_dpbusd_epi32(s[r], x, w);
        }
    }
    __m512i taken = _mm512_slli_epi32(_mm512_loadu_si512(sums + col), 7);
    qstage16 v = qstage_at(stage, col);
    __mmask16 keep = width >= QPANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << width) - 1);
    if (stage->shifts_left || stage->rounds_away)
        for (int r = 0; r < rows; r++)
            _mm_mask_storeu_epi8(out + r * ldc + col, keep,
                                 _mm512_cvtepi32_epi8(qrequantize_with(_mm512_sub_epi32(s[r], taken), &v)));
    else  /* the usual convolution's stage: multipliers below 1, ties up */
        for (int r = 0; r < rows; r++)
            _mm_mask_storeu_epi8(out + r * ldc + col, keep,
                                 _mm512_cvtepi32_epi8(qrequantize_steps(_mm512_sub_epi32(s[r], taken), &v, 0, 0)));
}
#endif

/* The rows' sums against every panel of ``units`` columns, requantized into out (rows ldc apart). */
static void qrows(int rows, const int8_t *const *a, int64_t depth, const int8_t *packed, const int32_t *sums,
                  int64_t units, int64_t p0, int64_t p1, int8_t *out, int64_t ldc, const qstage *stage, void *wide)
{
    (void)wide;
#if QROWS_MAX > QMR
    if (by_amx(depth)) {
        qrows_amx(rows, a, depth, packed, units, p0, p1, out, ldc, stage, wide);
        return;
    }
#endif
    int64_t panel_bytes = 64 * qpanel_groups(depth);
#if defined(QTILE_REQUANTIZED)
    for (int64_t p = p0; p < p1; p++) {
        int64_t col = p * QPANEL, width = units - col < QPANEL ? units - col : QPANEL;
        const int8_t *panel = packed + p * panel_bytes;
#define QTILE_CASE(R) \
        case R: qtile_requantized(R, a, depth, panel, sums, col, width, stage, out, ldc); break;
        switch (rows) {
        QTILE_CASE(8) QTILE_CASE(7) QTILE_CASE(6) QTILE_CASE(5) QTILE_CASE(4) QTILE_CASE(3) QTILE_CASE(2)
        QTILE_CASE(1)
        }
#undef QTILE_CASE
    }
#else
    int32_t acc[QMR][QPANEL];
    for (int64_t p = p0; p < p1; p++) {
        int64_t col = p * QPANEL, width = units - col < QPANEL ? units - col : QPANEL;
        qtile(rows, a, depth, packed + p * panel_bytes, sums + col, acc);
        for (int r = 0; r < rows; r++)
            qstore(acc[r], col, width, stage, out + r * ldc + col);
    }
#endif
}
#endif

/* How many groups of QGROUP depths a packed panel holds for ``depth`` (native.py's PackedInt8 packs so). */
int64_t integer_panel_groups(int64_t depth) { return qpanel_groups(depth); }

/* How many rows go to qrows at once for a product over ``depth``. */
static int qrows_block(int64_t depth)
{
#if QROWS_MAX > QMR
    if (by_amx(depth))
        return QROWS_MAX;
#else
    (void)depth;
#endif
    return QMR;
}

/* int8 ADD, SUB (kind 0) and MUL (kind 1) of two operands of one shape, flat, as TFLite computes them.
 * ADD and SUB take each operand to a common scale by table (``tables``: for each int8 value, 256 int32,
 * of a, then of b, for the first ``head`` elements, LiteRT's int8 ADD vector loop over whole blocks of
 * 16; then of a and of b for the rest, its scalar loop; SUB's b negated), sum them and take the sums
 * through the output stage, 16 at a time.  MUL multiplies the zero-point-centred operands (less zero_a,
 * zero_b) and takes them through the output stage; its second operand may be one row of ``period``
 * items repeated along the first's rows. */
typedef struct {
    const int8_t *a, *b;
    int8_t *out;
    int64_t n, period, kind, head, zero_a, zero_b;
    const int32_t *tables;
    int64_t head_factors[4];  /* a's factor and offset, b's: the head's formula, (v * factor + offset) >> 31 */
    int64_t head_formula;     /* whether head_factors hold it (else the head's tables alone) */
    const qstage *output;
    int64_t threads;
} qbinary_call;

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* The head formula of 8 int8 values (the low 8 bytes of v) in 64-bit lanes, as int32. */
static inline __m256i qadd_head_term(__m128i v, int64_t factor, int64_t offset)
{
    __m512i x = _mm512_mullo_epi64(_mm512_cvtepi8_epi64(v), _mm512_set1_epi64(factor));
    return _mm512_cvtepi64_epi32(_mm512_srai_epi64(_mm512_add_epi64(x, _mm512_set1_epi64(offset)), 31));
}
#endif

/* ADD or SUB of ``count`` items (at most 16, all in the head or all past it) of a and b into out. */
static inline void qadd_block(const int8_t *a, const int8_t *b, int8_t *out, int64_t count, int head,
                              const qbinary_call *p)
{
    const int32_t *ta = p->tables + (head ? 128 : 2 * 256 + 128), *tb = ta + 256;
    int32_t sums[16];
    int64_t k = 0;
#if defined(__AVX512F__)
    if (count == 16) {  /* both lookups as gathers (the tables' entries for the bytes as signed indices) */
        __m512i ia = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)a));
        __m512i ib = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b));
        _mm512_storeu_si512((void *)sums, _mm512_add_epi32(_mm512_i32gather_epi32(ia, (const void *)ta, 4),
                                                           _mm512_i32gather_epi32(ib, (const void *)tb, 4)));
        k = 16;
    }
#endif
#if defined(__AVX2__)
    for (; k + 8 <= count; k += 8) {
        __m256i ia = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(a + k)));
        __m256i ib = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + k)));
        _mm256_storeu_si256((__m256i *)(sums + k), _mm256_add_epi32(_mm256_i32gather_epi32((const int *)ta, ia, 4),
                                                                    _mm256_i32gather_epi32((const int *)tb, ib, 4)));
    }
#endif
    for (; k < count; k++)
        sums[k] = ta[a[k]] + tb[b[k]];
    qstore(sums, 0, count, p->output, out);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* The head's whole vectors of 16 by its formula, the output stage loaded once (as qmul_vectors). */
static inline __attribute__((always_inline)) int64_t qadd_head_vectors(const int8_t *a, const int8_t *b, int8_t *out,
                                                                       int64_t count, const qbinary_call *p,
                                                                       const int left, const int away)
{
    const int64_t *f = p->head_factors;
    qstage16 stage = qstage_at(p->output, 0);
    int64_t k = 0;
    for (; k + 16 <= count; k += 16) {
        __m128i va = _mm_loadu_si128((const __m128i *)(a + k)), vb = _mm_loadu_si128((const __m128i *)(b + k));
        __m256i low = _mm256_add_epi32(qadd_head_term(va, f[0], f[1]), qadd_head_term(vb, f[2], f[3]));
        __m256i high = _mm256_add_epi32(qadd_head_term(_mm_srli_si128(va, 8), f[0], f[1]),
                                        qadd_head_term(_mm_srli_si128(vb, 8), f[2], f[3]));
        __m512i sums = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
        _mm_storeu_si128((__m128i *)(out + k), _mm512_cvtepi32_epi8(qrequantize_steps(sums, &stage, left, away)));
    }
    return k;
}

#elif defined(__AVX2__)
/* One operand's head formula in 32-bit lanes: (v * factor + offset) >> 31 is the high half of (v << (shift + 1)) *
 * multiplier + 2 * offset where factor is multiplier << shift, multiplier below 2**31 and v << (shift + 1) in
 * int32 (shift below 24); ``usable`` where the factor has that form. */
typedef struct {
    __m256i multiplier, twice_offset;
    __m128i shift;
    int usable;
} qadd_term;

static inline qadd_term qadd_term_of(int64_t factor, int64_t offset)
{
    int64_t shift = 0;
    while (factor >> shift >= (int64_t)1 << 31)
        shift++;
    qadd_term t = {_mm256_set1_epi64x(factor >> shift), _mm256_set1_epi64x(2 * offset), _mm_cvtsi64_si128(shift + 1),
                   factor >= 0 && (factor >> shift << shift) == factor && shift < 24};
    return t;
}

/* The term of 8 int8 values (the low 8 bytes of v), as int32. */
static inline __m256i qadd_term8(__m128i v, const qadd_term *t)
{
    __m256i x = _mm256_sll_epi32(_mm256_cvtepi8_epi32(v), t->shift);
    __m256i even = _mm256_add_epi64(_mm256_mul_epi32(x, t->multiplier), t->twice_offset);
    __m256i odd = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(x, 32), t->multiplier), t->twice_offset);
    return _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/* The head's whole vectors of 16 by its formula where both operands' factors have the form qadd_term needs. */
static inline __attribute__((always_inline)) int64_t qadd_head_vectors(const int8_t *a, const int8_t *b, int8_t *out,
                                                                       int64_t count, const qbinary_call *p,
                                                                       const int kind)
{
    const int64_t *f = p->head_factors;
    qadd_term ta = qadd_term_of(f[0], f[1]), tb = qadd_term_of(f[2], f[3]);
    int64_t k = 0;
    if (!ta.usable || !tb.usable)
        return 0;
    for (; k + 16 <= count; k += 16) {
        __m128i va = _mm_loadu_si128((const __m128i *)(a + k)), vb = _mm_loadu_si128((const __m128i *)(b + k));
        __m256i low = _mm256_add_epi32(qadd_term8(va, &ta), qadd_term8(vb, &tb));
        __m256i high = _mm256_add_epi32(qadd_term8(_mm_srli_si128(va, 8), &ta), qadd_term8(_mm_srli_si128(vb, 8), &tb));
        _mm_storeu_si128((__m128i *)(out + k), qrequantize_bytes(low, high, 0, p->output, kind));
    }
    return k;
}
#endif

/* ADD or SUB of the ``count`` items at flat positions first.. of the operands (a, b and out pointing
 * at item ``first``; out may be a). */
static void qadd_span(const int8_t *a, const int8_t *b, int8_t *out, int64_t first, int64_t count,
                      const qbinary_call *p)
{
    int64_t k = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (p->head_formula && first < p->head) {
        int64_t in_head = p->head - first < count ? p->head - first : count;
        k = BY_STAGE(p->output, qadd_head_vectors, a, b, out, in_head, p);
    }
#elif defined(__AVX2__)
    if (p->head_formula && first < p->head) {
        int64_t in_head = p->head - first < count ? p->head - first : count;
        int kind = qstage_kind(p->output);
        k = kind == 2 ? qadd_head_vectors(a, b, out, in_head, p, 2)
                      : kind ? qadd_head_vectors(a, b, out, in_head, p, 1)
                             : qadd_head_vectors(a, b, out, in_head, p, 0);
    }
#endif
    while (k < count) {
        int64_t i = first + k, head = i < p->head, n = count - k < 16 ? count - k : 16;
        if (head && p->head - i < n)
            n = p->head - i;
        qadd_block(a + k, b + k, out + k, n, (int)head, p);
        k += n;
    }
}

/* out (m x n, rows ldc apart) = requantized a (m x k, rows lda apart) @ a packed operand: each thread
 * takes a share of the row tiles, or of the panels when there are too few tiles to go round; with a
 * residual (ldc == n), each tile's stored part goes through the residual ADD while in cache.  Built
 * once by a kernel, which places a, c (and residual_b) per run. */
typedef struct {
    int64_t m, n, k;
    const int8_t *a;
    int64_t lda;
    const int8_t *packed;
    const int32_t *sums;
    int8_t *c;
    int64_t ldc;
    const qstage *stage;
    int64_t threads;
    const int8_t *residual_b;    /* with residual: the ADD's other operand, (m x n) as c */
    const qbinary_call *residual;  /* NULL, or the residual ADD each stored row goes through (a: c itself) */
} qproduct_call;

int qproduct(const qproduct_call *p)
{
    int block = qrows_block(p->k);
    int64_t tiles = (p->m + block - 1) / block, panels = (p->n + QPANEL - 1) / QPANEL;
    int by_rows = tiles >= 2 * p->threads || tiles >= panels;
    int64_t extent = by_rows ? tiles : panels;
    int threads = extent > 1 ? (int)p->threads : 1;
    size_t per_thread = qrows_scratch(p->k);
    char *all = scratch(threads, per_thread);
    if (!all)
        return NO_MEMORY;
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int part = 0; part < threads; part++) {
        int64_t lo = extent * part / threads, hi = extent * (part + 1) / threads;
        int64_t t0 = by_rows ? lo : 0, t1 = by_rows ? hi : tiles, p0 = by_rows ? 0 : lo, p1 = by_rows ? panels : hi;
        char *wide = own_scratch(all, per_thread);
        qrows_begin();
        for (int64_t t = t0; t < t1; t++) {
            int64_t row = t * block;
            int rows = p->m - row < block ? (int)(p->m - row) : block;
            const int8_t *a[QROWS_MAX];
            for (int r = 0; r < rows; r++)
                a[r] = p->a + (row + r) * p->lda;
            qrows(rows, a, p->k, p->packed, p->sums, p->n, p0, p1, p->c + row * p->ldc, p->ldc, p->stage, wide);
            if (p->residual) {
                int64_t c0 = p0 * QPANEL, c1 = p1 * QPANEL < p->n ? p1 * QPANEL : p->n;
                if (c0 == 0 && c1 == p->n) {  /* the tile's rows whole: one contiguous span, in blocks of 16 */
                    int64_t at = row * p->n;
                    qadd_span(p->c + at, p->residual_b + at, p->c + at, at, rows * p->n, p->residual);
                } else
                    for (int r = 0; r < rows; r++) {
                        int64_t at = (row + r) * p->n + c0;
                        qadd_span(p->c + at, p->residual_b + at, p->c + at, at, c1 - c0, p->residual);
                    }
            }
        }
        qrows_end();
    }
    free(all);
    return DONE;
}

/* memcpy of n bytes, short runs (a first convolution's window rows: 3 taps of 3 channels) as two overlapping
 * moves of a fixed size instead of a call. */
static inline void copy_bytes(int8_t *restrict dst, const int8_t *restrict src, int64_t n)
{
    if (n >= 8 && n <= 16) {
        memcpy(dst, src, 8);
        memcpy(dst + n - 8, src + n - 8, 8);
    } else if (n >= 4 && n < 8) {
        memcpy(dst, src, 4);
        memcpy(dst + n - 4, src + n - 4, 4);
    } else
        memcpy(dst, src, (size_t)n);
}

/* A CONV_2D of int8 (h, w, c) images (where: the geometry, in items): groups of up to QMR output pixels
 * of a row copy their windows into per-thread rows of depth kh*kw*c (taps outside the image hold the
 * input zero point, adding nothing once the zero point is folded in), then go against every panel; a
 * residual as for qproduct. */
typedef struct {
    const int8_t *images;
    const int8_t *packed;
    const int32_t *sums;
    int64_t units;
    int8_t *out;
    const geometry *where;
    int64_t zero;
    const qstage *stage;
    int64_t threads;
    const int8_t *residual_b;    /* as qproduct_call's (the output contiguous) */
    const qbinary_call *residual;
} qconv_call;

int qconv(const qconv_call *p)
{
    const geometry *g = p->where;
    int64_t c = g->c, depth = g->kh * g->kw * c, ow = g->ow, oh = g->oh;
    int threads = (int)p->threads, block = qrows_block(depth);
    size_t windows_size = ((size_t)block * depth + 63) & ~(size_t)63, per_thread = windows_size + qrows_scratch(depth);
    char *all = scratch(threads, per_thread);
    if (!all)
        return NO_MEMORY;
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < g->images * oh; r++) {
        int64_t oy = r % oh;
        const int8_t *x = p->images + r / oh * g->image_in;
        int8_t *windows = (int8_t *)own_scratch(all, per_thread);
        int8_t *row = p->out + r / oh * g->image_out + oy * g->out_stride;
        qrows_begin();
        for (int64_t ox = 0; ox < ow; ox += block) {
            int pixels = ow - ox < block ? (int)(ow - ox) : block;
            const int8_t *a[QROWS_MAX];
            for (int q = 0; q < pixels; q++) {
                int8_t *dst = windows + q * depth;
                a[q] = dst;
                for (int64_t ky = 0; ky < g->kh; ky++) {
                    int64_t iy = oy * g->stride_h + ky * g->dh - g->top, ix0 = (ox + q) * g->stride_w - g->left;
                    if (g->dw == 1 && iy >= 0 && iy < g->h && ix0 >= 0 && ix0 + g->kw <= g->w) {
                        copy_bytes(dst, x + (iy * g->w + ix0) * c, g->kw * c);  /* the row's taps are one run */
                        dst += g->kw * c;
                        continue;
                    }
                    for (int64_t kx = 0; kx < g->kw; kx++, dst += c) {
                        int64_t ix = ix0 + kx * g->dw;
                        if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
                            memset(dst, (int)p->zero, c);
                        else
                            copy_bytes(dst, x + (iy * g->w + ix) * c, c);
                    }
                }
            }
            qrows(pixels, a, depth, p->packed, p->sums, p->units, 0, (p->units + QPANEL - 1) / QPANEL,
                  row + ox * p->units, p->units, p->stage, windows + windows_size);
            if (p->residual) {
                int64_t at = (r * ow + ox) * p->units;
                qadd_span(p->out + at, p->residual_b + at, p->out + at, at, pixels * p->units, p->residual);
            }
        }
        qrows_end();
    }
    free(all);
    return DONE;
}

/* An integer DEPTHWISE_CONV_2D (multiplier 1), one loop for both activation widths: int8 images (wide
 * 0) or int16 ones (wide 1), against (kh*kw, c) int16 taps (their zero point taken out).  Output pixel
 * channel j sums (x - zero) * taps[t][j] over the taps t inside the image (TFLite leaves the others
 * out) in int32, exact for the sums the caller bounded (native.py's QDepthwiseCall), 16 channels held
 * in registers over all taps; then requantizes: int8 through ``stage`` (qstage), int16 through
 * ``wide_stage`` (requant, in int64).  Wherever AVX2 is, int8 images go by pairs of taps (paired_row). */
typedef struct {
    const void *images;
    const int16_t *taps;
    void *out;
    const geometry *where;
    int64_t zero, wide;
    const qstage *stage;
    const requant *wide_stage;
    int64_t threads;
    /* int8 with AVX2 (paired_row): the taps in pairs, each channel's two in turn (16 more values past the last
     * pair); the stage's biases less zero times each channel's taps summed; c + 16 bytes of the zero point */
    const int16_t *paired;
    const int32_t *paired_bias;
    const int8_t *zeros;
} qdepthwise_call;

/* The channels a depthwise sum keeps in one register: 16 with AVX-512, else 8. */
#if defined(__AVX512F__)
#define DW_LANES 16
#else
#define DW_LANES 8
#endif
typedef int32_t lanes32 __attribute__((vector_size(DW_LANES * 4)));
typedef int16_t lanes16 __attribute__((vector_size(DW_LANES * 2)));
typedef int8_t lanes8 __attribute__((vector_size(DW_LANES)));

/* DW_LANES int8 or int16 values sign-extended to int32 (the compilers' generic conversion goes through
 * scalars). */
static inline lanes32 widen16(const int16_t *p)
{
#if defined(__AVX512F__)
    return (lanes32)_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__AVX2__)
    return (lanes32)_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    lanes16 v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, lanes32);
#endif
}

static inline lanes32 widen8(const int8_t *p)
{
#if defined(__AVX512F__)
    return (lanes32)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif defined(__AVX2__)
    return (lanes32)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    lanes8 v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, lanes32);
#endif
}

/* DW_PIXEL_GROUP: the most output pixels of a row depthwise_sums sums at once. */
#define DW_PIXEL_GROUP 4

/* sums[j] for one output pixel whose taps inside the image are the input pixels at x + offsets[t]
 * (in items) weighted by taps row index[t]; with ``pixels`` up to DW_PIXEL_GROUP, also sums[q * c + j]
 * for the pixels q ``step`` items further on each (the same taps: each weight vector loaded once for
 * them all). */
static inline __attribute__((always_inline)) void depthwise_sums(const void *x, const int wide, const int pixels,
                                                                  int64_t step, const int64_t *offsets,
                                                                  const int64_t *index, int64_t kept,
                                                                  const int16_t *taps, int64_t c, int32_t zero,
                                                                  int32_t *restrict sums)
{
    const int8_t *x8 = x;
    const int16_t *x16 = x;
    int64_t j = 0;
    for (; j + DW_LANES <= c; j += DW_LANES) {
        lanes32 acc[DW_PIXEL_GROUP];
        for (int q = 0; q < pixels; q++)
            acc[q] = (lanes32){0};
        for (int64_t t = 0; t < kept; t++) {
            lanes32 w = widen16(taps + index[t] * c + j);
            int64_t at = offsets[t] + j;
            for (int q = 0; q < pixels; q++)
                acc[q] += ((wide ? widen16(x16 + at + q * step) : widen8(x8 + at + q * step)) - zero) * w;
        }
        for (int q = 0; q < pixels; q++)
            memcpy(sums + q * c + j, &acc[q], sizeof acc[q]);
    }
    for (; j < c; j++)
        for (int q = 0; q < pixels; q++) {
            int32_t acc = 0;
            for (int64_t t = 0; t < kept; t++) {
                int64_t at = offsets[t] + j + q * step;
                acc += ((wide ? x16[at] : x8[at]) - zero) * taps[index[t] * c + j];
            }
            sums[q * c + j] = acc;
        }
}

/* Output pixel ox of a qdepthwise row from its sums. */
static inline __attribute__((always_inline)) void depthwise_store(const qdepthwise_call *p, const int wide,
                                                                   const int32_t *sums, char *row, int64_t ox)
{
    int64_t c = p->where->c;
    if (wide)
        for (int64_t j = 0; j < c; j++)
            ((int16_t *)row)[ox * c + j] = (int16_t)requantize(sums[j], j, p->wide_stage);
    else
        qstore(sums, 0, c, p->stage, (int8_t *)row + ox * c);
}

/* The sums of ``pixels`` output pixels of a qdepthwise row (as depthwise_sums) stored from ox on. */
static inline __attribute__((always_inline)) void qdepthwise_pixels(const qdepthwise_call *p, const int wide,
                                                                    const char *at, const int pixels, int64_t step,
                                                                    const int64_t *offsets, const int64_t *index,
                                                                    int64_t kept, char *row, int64_t ox,
                                                                    int32_t *sums)
{
    int64_t c = p->where->c;
    int32_t zero = (int32_t)p->zero;
    depthwise_sums(at, wide, pixels, step, offsets, index, kept, p->taps, c, zero, sums);
    for (int q = 0; q < pixels; q++)
        depthwise_store(p, wide, sums + q * c, row, ox + q);
}

/* int8 depthwise convolutions by pairs of taps wherever AVX2 is (AVX-512 machines too: widening each byte to int32
 * and multiplying by vpmulld there took MobileNetV2 int8's depthwise layers 1.54 ms at one thread against 1.22 by
 * pairs, on a 2-core Xeon VM with AVX-512 VNNI). */
#if defined(__AVX2__)
#define DW_PAIRED 1
/* The requantized bytes of the sums s0, s1 of channels j..j+15 (``stage``: see paired_row), the first ``n`` (up
 * to 16) stored at out. */
static inline __attribute__((always_inline)) void paired_store(const qstage *stage, const int kind, __m256i s0,
                                                               __m256i s1, int64_t j, int64_t n, int8_t *out)
{
    __m128i bytes = qrequantize_bytes(s0, s1, j, stage, kind);
    if (n == 16)
        _mm_storeu_si128((__m128i *)out, bytes);
    else if (n == 8)
        _mm_storel_epi64((__m128i *)out, bytes);
    else {
        int8_t part[16];
        _mm_storeu_si128((__m128i *)part, bytes);
        memcpy(out, part, (size_t)n);
    }
}

/* Output pixels of an int8 qdepthwise on AVX2 into ``out``, ``PIXELS`` (1 or 2: the second's sums interleaved with
 * the first's, so that both pixels' dependent steps overlap) ``c`` apart, their taps at at[0..] and at2[0..]
 * (kh * kw, and one more at zeros), ``pairs`` of them (``PAIRS`` when not 0: 3x3 and 5x5 filters' loops
 * unrolled): two taps' bytes interleaved and widened go by vpmaddwd against their weights interleaved alike, 16
 * channels in registers over all the pairs (an odd last tap paired with a zero weight). */
static inline __attribute__((always_inline)) void paired_pixels(const qdepthwise_call *p, const qstage *stage,
                                                                const int kind, const int PAIRS, const int PIXELS,
                                                                const int8_t *const *at, const int8_t *const *at2,
                                                                int64_t pairs, int8_t *out)
{
    int64_t c = p->where->c, j = 0;
    pairs = PAIRS ? PAIRS : pairs;
    for (; j + 16 <= c; j += 16) {
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, u0 = s0, u1 = s0;
        for (int64_t q = 0; q < pairs; q++) {
            const __m256i *w = (const __m256i *)(p->paired + 2 * (q * c + j));
            __m256i w0 = _mm256_loadu_si256(w), w1 = _mm256_loadu_si256(w + 1);
            __m128i a = _mm_loadu_si128((const __m128i *)(at[2 * q] + j));
            __m128i b = _mm_loadu_si128((const __m128i *)(at[2 * q + 1] + j));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b)), w0));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b)), w1));
            if (PIXELS == 2) {
                a = _mm_loadu_si128((const __m128i *)(at2[2 * q] + j));
                b = _mm_loadu_si128((const __m128i *)(at2[2 * q + 1] + j));
                u0 = _mm256_add_epi32(u0, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b)), w0));
                u1 = _mm256_add_epi32(u1, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b)), w1));
            }
        }
        paired_store(stage, kind, s0, s1, j, 16, out + j);
        if (PIXELS == 2)
            paired_store(stage, kind, u0, u1, j, 16, out + c + j);
    }
    for (; j < c; j += 8) {  /* 8 channels, the last fewer (their bytes copied: no reads past the image) */
        int64_t n = c - j < 8 ? c - j : 8;
        for (int px = 0; px < PIXELS; px++) {
            const int8_t *const *taps = px ? at2 : at;
            __m256i s0 = _mm256_setzero_si256();
            for (int64_t q = 0; q < pairs; q++) {
                __m128i a = _mm_setzero_si128(), b = a;
                memcpy(&a, taps[2 * q] + j, (size_t)n);
                memcpy(&b, taps[2 * q + 1] + j, (size_t)n);
                __m256i w = _mm256_loadu_si256((const __m256i *)(p->paired + 2 * (q * c + j)));  /* 16 past the last */
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b)), w));
            }
            paired_store(stage, kind, s0, s0, j, n, out + px * c + j);
        }
    }
}

/* One output row oy of an int8 qdepthwise on AVX2, from ``x`` (its image) into ``row``, by paired_pixels through
 * ``stage`` (p->stage with the zero point's share folded into its biases: QDepthwiseCall's paired_bias; ``kind``:
 * see qrequantize_bytes).  Its taps are listed as pointers (``at``: scratch for 4 * (kh * kw + 1) items), those
 * outside the image at ``zeros`` (c + 16 bytes of the input zero point: zero times the weight, which the biases
 * take back with the inside taps' share).  The pixels whose taps all fall inside the image's columns go two at a
 * time: each tap's pointer moves by a stride along the row (``step``; 0 on input rows outside the image). */
static inline __attribute__((always_inline)) void paired_row(const qdepthwise_call *p, const qstage *stage,
                                                             const int kind, const int PAIRS, const int8_t *x,
                                                             int64_t oy, int8_t *row, const int8_t **at,
                                                             const int8_t *zeros)
{
    const geometry *g = p->where;
    int64_t c = g->c, taps = g->kh * g->kw, pairs = (taps + 1) / 2, inner0, inner1;
    const int8_t **at2 = at + taps + 1, **first = at2 + taps + 1;
    int64_t *step = (int64_t *)(first + taps + 1);
    inner_columns(g->w, g->kw, g->stride_w, g->dw, g->left, g->ow, &inner0, &inner1);
    for (int64_t ky = 0, t = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->stride_h + ky * g->dh - g->top;
        int inside = iy >= 0 && iy < g->h;
        for (int64_t kx = 0; kx < g->kw; kx++, t++) {  /* where the tap reads for pixel inner0 */
            first[t] = inside && inner0 < inner1 ? x + (iy * g->w + inner0 * g->stride_w + kx * g->dw - g->left) * c
                                                 : zeros;
            step[t] = inside ? g->stride_w * c : 0;
        }
    }
    at[taps] = at2[taps] = zeros;
    for (int64_t ox = 0; ox < g->ow; ox++) {
        if (ox >= inner0 && ox + 1 < inner1) {
            for (int64_t t = 0; t < taps; t++) {
                at[t] = first[t] + (ox - inner0) * step[t];
                at2[t] = at[t] + step[t];
            }
            paired_pixels(p, stage, kind, PAIRS, 2, at, at2, pairs, row + ox * c);
            ox++;
            continue;
        }
        for (int64_t ky = 0, t = 0; ky < g->kh; ky++) {
            int64_t iy = oy * g->stride_h + ky * g->dh - g->top;
            for (int64_t kx = 0; kx < g->kw; kx++, t++) {
                int64_t ix = ox * g->stride_w + kx * g->dw - g->left;
                at[t] = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w ? x + (iy * g->w + ix) * c : zeros;
            }
        }
        paired_pixels(p, stage, kind, PAIRS, 1, at, at, pairs, row + ox * c);
    }
}

/* paired_row with its stage's kind and the common filters' pair counts constants. */
static void qdepthwise_paired_row(const qdepthwise_call *p, const qstage *stage, const int8_t *x, int64_t oy,
                                  int8_t *row, const int8_t **at, const int8_t *zeros)
{
    int64_t pairs = (p->where->kh * p->where->kw + 1) / 2;
#define PAIRED_ROW(S) \
    (pairs == 5 ? paired_row(p, stage, S, 5, x, oy, row, at, zeros) \
                : pairs == 13 ? paired_row(p, stage, S, 13, x, oy, row, at, zeros) \
                              : paired_row(p, stage, S, 0, x, oy, row, at, zeros))
    if (qstage_kind(stage) == 1)  /* ties up: a stage rounding some ties away takes the steps in turn */
        PAIRED_ROW(1);
    else
        PAIRED_ROW(0);
#undef PAIRED_ROW
}
#endif

/* One output row oy of qdepthwise from ``x`` (its image) into ``row``; ``list``: scratch for 5 * kh * kw
 * int64, ``sums`` for DW_PIXEL_GROUP * c int32.  The row's taps (those on input rows inside the image)
 * are listed once: pixels with all of them inside the row read them at a shifted base, four (then two)
 * at a time, border pixels keep those inside. */
static inline __attribute__((always_inline)) void qdepthwise_row(const qdepthwise_call *p, const int wide,
                                                                  const char *x, int64_t oy, char *row,
                                                                  int64_t *list, int32_t *sums)
{
    const geometry *g = p->where;
    int64_t c = g->c, window = g->kh * g->kw, size = wide ? 2 : 1, inner0, inner1, step = g->stride_w * c;
    int64_t *offsets = list, *index = list + window, *columns = index + window;
    int64_t *kept_offsets = columns + window, *kept_index = kept_offsets + window;
    int64_t taps = row_taps(g, oy, columns, offsets, index);
    inner_columns(g->w, g->kw, g->stride_w, g->dw, g->left, g->ow, &inner0, &inner1);
    for (int64_t ox = 0; ox < g->ow; ox++) {
        int64_t base = ox * g->stride_w;
        const char *at = x + base * c * size;
        if (ox >= inner0 && ox + 3 < inner1) {
            qdepthwise_pixels(p, wide, at, 4, step, offsets, index, taps, row, ox, sums);
            ox += 3;
        } else if (ox >= inner0 && ox + 1 < inner1) {
            qdepthwise_pixels(p, wide, at, 2, step, offsets, index, taps, row, ox, sums);
            ox += 1;
        } else if (ox >= inner0 && ox < inner1)
            qdepthwise_pixels(p, wide, at, 1, 0, offsets, index, taps, row, ox, sums);
        else
            qdepthwise_pixels(p, wide, at, 1, 0, kept_offsets, kept_index,
                             taps_inside(columns, offsets, index, taps, base, g->w, kept_offsets, kept_index),
                             row, ox, sums);
    }
}

int qdepthwise(const qdepthwise_call *p)
{
    const geometry *g = p->where;
    int64_t oh = g->oh, window = g->kh * g->kw, size = p->wide ? 2 : 1;
    int threads = (int)p->threads;
    /* qdepthwise_row's tap lists (5 * window items) or paired_row's (4 * (window + 1)), and the sums */
    size_t per_thread = (size_t)(window + 1) * 5 * sizeof(int64_t) + DW_PIXEL_GROUP * (size_t)g->c * sizeof(int32_t);
    char *all = scratch(threads, per_thread);
    if (!all)
        return NO_MEMORY;
#if defined(DW_PAIRED)
    qstage folded = p->wide ? (qstage){0} : *p->stage;  /* int8: the zero point's share in its biases (paired_row) */
    folded.bias = p->paired_bias;
#endif
    #pragma omp parallel for num_threads(team_of(threads)) schedule(static) if (team_of(threads) > 1)
    for (int64_t r = 0; r < g->images * oh; r++) {
        const char *x = (const char *)p->images + r / oh * g->image_in * size;
        char *row = (char *)p->out + (r / oh * g->image_out + r % oh * g->out_stride) * size;
        int64_t *list = (int64_t *)own_scratch(all, per_thread);
        int32_t *sums = (int32_t *)(list + 5 * (window + 1));
        if (p->wide)
            qdepthwise_row(p, 1, x, r % oh, row, list, sums);
        else
#if defined(DW_PAIRED)
            qdepthwise_paired_row(p, &folded, (const int8_t *)x, r % oh, (int8_t *)row, (const int8_t **)list,
                                  p->zeros);
#else
            qdepthwise_row(p, 0, x, r % oh, row, list, sums);
#endif
    }
    free(all);
    return DONE;
}

#if defined(__AVX512F__)
/* qmul_span's whole vectors, the output stage's vectors loaded once (its one channel repeated) and its
 * left shifts and ties' adjustment left out where the stage has none (``left``, ``away`` constant). */
static inline __attribute__((always_inline)) int64_t qmul_vectors(const int8_t *a, const int8_t *b, int8_t *out,
                                                                  int64_t count, const qbinary_call *p,
                                                                  const int left, const int away)
{
    __m512i wa = _mm512_set1_epi32((int32_t)p->zero_a), wb = _mm512_set1_epi32((int32_t)p->zero_b);
    qstage16 stage = qstage_at(p->output, 0);
    int64_t k = 0;
    for (; k + 16 <= count; k += 16) {
        __m512i x = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(a + k))), wa);
        __m512i y = _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + k))), wb);
        __m512i v = qrequantize_steps(_mm512_mullo_epi32(x, y), &stage, left, away);
        _mm_storeu_si128((__m128i *)(out + k), _mm512_cvtepi32_epi8(v));
    }
    return k;
}
#endif

/* MUL of ``count`` items of a and b into out (the output stage's arrays hold its one channel repeated). */
#if defined(__AVX2__)
/* MUL of the whole blocks of 16 of ``count`` items: the zero-point-centred operands as int16, their products'
 * low and high halves interleaved into int32 (the items' groups of 4 taken in the order 0, 2, 1, 3, so that the
 * products come out in order), then the output stage (``kind``: see qrequantize_bytes).  Returns how many. */
static inline __attribute__((always_inline)) int64_t qmul_sixteens(const int8_t *a, const int8_t *b, int8_t *out,
                                                                   int64_t count, const qbinary_call *p,
                                                                   const int kind)
{
    __m256i za = _mm256_set1_epi16((int16_t)p->zero_a), zb = _mm256_set1_epi16((int16_t)p->zero_b);
    int64_t k = 0;
    for (; k + 16 <= count; k += 16) {
        __m128i va = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(a + k)), 0xD8);
        __m128i vb = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(b + k)), 0xD8);
        __m256i x = _mm256_sub_epi16(_mm256_cvtepi8_epi16(va), za), y = _mm256_sub_epi16(_mm256_cvtepi8_epi16(vb), zb);
        __m256i low = _mm256_mullo_epi16(x, y), high = _mm256_mulhi_epi16(x, y);
        _mm_storeu_si128((__m128i *)(out + k), qrequantize_bytes(_mm256_unpacklo_epi16(low, high),
                                                                 _mm256_unpackhi_epi16(low, high), 0, p->output, kind));
    }
    return k;
}
#endif

static void qmul_span(const int8_t *a, const int8_t *b, int8_t *out, int64_t count, const qbinary_call *p)
{
    int64_t k = 0;
    int32_t zero_a = (int32_t)p->zero_a, zero_b = (int32_t)p->zero_b;
#if defined(__AVX512F__)
    k = BY_STAGE(p->output, qmul_vectors, a, b, out, count, p);
#endif
#if defined(__AVX2__)
    int kind = qstage_kind(p->output);
    k += kind == 2 ? qmul_sixteens(a + k, b + k, out + k, count - k, p, 2)
                   : kind ? qmul_sixteens(a + k, b + k, out + k, count - k, p, 1)
                          : qmul_sixteens(a + k, b + k, out + k, count - k, p, 0);
#endif
    for (; k < count; k++)
        out[k] = (int8_t)qrequantize((a[k] - zero_a) * (b[k] - zero_b), 0, p->output);
}

int qbinary(const qbinary_call *p)
{
    int64_t n = p->n, parts = (n + 4095) / 4096, period = p->period;
    if (p->kind == 1) {
        /* a row operand (period < n) repeated into pieces of whole rows of about 4096 items, so that short rows
         * (a squeeze-excitation's channel scales) run through the vector loop as long spans */
        int by_rows = period < n;
        int64_t rows = by_rows && period < 4096 ? (4096 + period - 1) / period : 1;
        int64_t size = by_rows ? period * rows : 4096, pieces = (n + size - 1) / size;
        int8_t repeated[2 * 4096];  /* rows > 1 only where period < 4096: size < 4096 + period */
        for (int64_t r = 0; r < rows && rows > 1; r++)
            memcpy(repeated + r * period, p->b, (size_t)period);
        const int8_t *row = rows > 1 ? repeated : p->b;
        #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
        for (int64_t piece = 0; piece < pieces; piece++) {
            int64_t first = piece * size, count = first + size < n ? size : n - first;
            qmul_span(p->a + first, by_rows ? row : p->b + first, p->out + first, count, p);
        }
        return DONE;
    }
    #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
    for (int64_t part = 0; part < parts; part++) {
        int64_t first = part * 4096, end = first + 4096 < n ? first + 4096 : n;
        qadd_span(p->a + first, p->b + first, p->out + first, first, end - first, p);
    }
    return DONE;
}

/* MAX_POOL_2D (average 0) or AVERAGE_POOL_2D (average 1) of int8 (h, w, c) images as the geometry says,
 * over the taps inside the image: the largest, or the sum divided by their count rounding half away from
 * zero; then the clamp to [low, high]. */
typedef struct {
    const int8_t *images;
    int8_t *out;
    const geometry *where;
    int64_t average, low, high, threads;
} qpool_call;

int qpool(const qpool_call *p)
{
    const geometry *g = p->where;
    int64_t h = g->h, w = g->w, c = g->c, oh = g->oh, ow = g->ow;
    size_t per_thread = (size_t)c * sizeof(int32_t);
    char *all = scratch((int)p->threads, per_thread);
    if (!all)
        return NO_MEMORY;
    #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
    for (int64_t r = 0; r < g->images * oh; r++) {
        int64_t oy = r % oh;
        const int8_t *x = p->images + r / oh * g->image_in;
        int8_t *row = p->out + r / oh * g->image_out + oy * g->out_stride;
        int32_t *restrict acc = (int32_t *)own_scratch(all, per_thread);
        int64_t y_lo = oy * g->stride_h - g->top, y_hi = y_lo + g->kh;
        y_lo = y_lo < 0 ? 0 : y_lo;
        y_hi = y_hi > h ? h : y_hi;
        for (int64_t ox = 0; ox < ow; ox++) {
            int64_t x_lo = ox * g->stride_w - g->left, x_hi = x_lo + g->kw;
            x_lo = x_lo < 0 ? 0 : x_lo;
            x_hi = x_hi > w ? w : x_hi;
            int32_t count = (int32_t)((y_hi - y_lo) * (x_hi - x_lo));
            for (int64_t k = 0; k < c; k++)
                acc[k] = p->average ? 0 : -128;
            for (int64_t iy = y_lo; iy < y_hi; iy++)
                for (int64_t ix = x_lo; ix < x_hi; ix++) {
                    const int8_t *restrict in = x + (iy * w + ix) * c;
                    if (p->average)
                        for (int64_t k = 0; k < c; k++)
                            acc[k] += in[k];
                    else
                        for (int64_t k = 0; k < c; k++)
                            acc[k] = acc[k] < in[k] ? in[k] : acc[k];
                }
            int8_t *pixel = row + ox * c;
            for (int64_t k = 0; k < c; k++) {
                int32_t v = acc[k];
                if (p->average)
                    v = count ? (v > 0 ? v + count / 2 : v - count / 2) / count : 0;
                pixel[k] = (int8_t)(v < p->low ? p->low : v > p->high ? p->high : v);
            }
        }
    }
    free(all);
    return DONE;
}

/* 16-bit activations with int8 weights (the converter's 16x8 quantization): int16 x int8 products summed
 * exactly in int64 (int32 over runs of 256, each at most 2**30), requantized in int64 (requant: folded
 * as quant_util.Rescale does, or TFLite's 64-bit reference rescale) into int16.  Weights as stored,
 * (units, depth) rows; the input zero point folded into the stage's offsets as for int8. */
static int64_t dot16(const int16_t *restrict x, const int8_t *restrict w, int64_t depth)
{
    int64_t total = 0;
    for (int64_t first = 0; first < depth; first += 256) {
        int64_t end = first + 256 < depth ? first + 256 : depth;
        int32_t part = 0;
        for (int64_t k = first; k < end; k++)
            part += x[k] * w[k];
        total += part;
    }
    return total;
}

/* out (m x n) = requantized a (m x k) @ weights (n x k).T; or, with a geometry, a CONV_2D of (h, w, c)
 * images whose pixels' windows are copied into per-thread rows first (taps outside the image holding the
 * input zero point). */
typedef struct {
    int64_t m, n, k;
    const int16_t *a;
    const int8_t *weights;
    int16_t *out;
    const geometry *where;
    int64_t zero;
    const requant *stage;
    int64_t threads;
} wide_call;

static void wide_row(const int16_t *x, const wide_call *p, int16_t *out)
{
    for (int64_t u = 0; u < p->n; u++)
        out[u] = (int16_t)requantize(dot16(x, p->weights + u * p->k, p->k), u, p->stage);
}

int wide_product(const wide_call *p)
{
    #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
    for (int64_t r = 0; r < p->m; r++)
        wide_row(p->a + r * p->k, p, p->out + r * p->n);
    return DONE;
}

int wide_conv(const wide_call *p)
{
    const geometry *g = p->where;
    int64_t c = g->c, depth = p->k, oh = g->oh;
    size_t per_thread = (size_t)depth * sizeof(int16_t);
    char *all = scratch((int)p->threads, per_thread);
    if (!all)
        return NO_MEMORY;
    #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
    for (int64_t r = 0; r < g->images * oh; r++) {
        int64_t oy = r % oh;
        const int16_t *x = p->a + r / oh * g->image_in;
        int16_t *window = (int16_t *)own_scratch(all, per_thread);
        for (int64_t ox = 0; ox < g->ow; ox++) {
            int16_t *dst = window;
            for (int64_t ky = 0; ky < g->kh; ky++) {
                int64_t iy = oy * g->stride_h + ky * g->dh - g->top;
                for (int64_t kx = 0; kx < g->kw; kx++, dst += c) {
                    int64_t ix = ox * g->stride_w + kx * g->dw - g->left;
                    if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
                        for (int64_t k = 0; k < c; k++)
                            dst[k] = (int16_t)p->zero;
                    else
                        memcpy(dst, x + (iy * g->w + ix) * c, c * sizeof *dst);
                }
            }
            wide_row(window, p, p->out + r / oh * g->image_out + oy * g->out_stride + ox * p->n);
        }
    }
    free(all);
    return DONE;
}

/* mean_pixels with its arguments in one struct, as depthwise_call. */
typedef struct {
    const float *x;
    float *out;
    int64_t images, pixels, c, threads;
} mean_call;

int mean_prepared(const mean_call *m)
{
    return mean_pixels(m->x, m->out, m->images, m->pixels, m->c, (int)m->threads);
}

/* A float SOFTMAX over rows of ``depth``, in numpy's formulation's steps: e = exp(beta * (x - row max))
 * (beta applied only when not 1, e by exp_lanes), the row's e summed, each e divided by the sum; the rows
 * shared among ``threads``.  With expf a lane at a time, a transformer block's attention SOFTMAX of
 * 2 x 197 x 197 took 0.39 ms on the 2-core VM, LiteRT's 0.02. */
typedef struct {
    const float *x;
    float *out;
    int64_t rows, depth;
    float beta;
    int64_t threads;
} softmax_call;

static void softmax_row(const float *restrict x, float *restrict out, int64_t depth, float beta)
{
    vec tops = (vec){0} + x[0];
    int64_t k = 0;
    for (; k + LANES <= depth; k += LANES) {
        vec v = load(x + k);
        tops = (vec)(((ivec)v & (ivec)(v > tops)) | ((ivec)tops & ~(ivec)(v > tops)));
    }
    float top = tops[0];
    for (int i = 1; i < LANES; i++)
        top = tops[i] > top ? tops[i] : top;
    for (; k < depth; k++)
        top = x[k] > top ? x[k] : top;
    vec sums = {0}, shift = (vec){0} + top;
    for (k = 0; k + LANES <= depth; k += LANES) {
        vec v = load(x + k) - shift;
        vec e = exp_lanes(beta != 1.0f ? v * beta : v);
        store(out + k, e);
        sums += e;
    }
    float sum = 0;
    for (int i = 0; i < LANES; i++)
        sum += sums[i];
    if (k < depth) {  /* the last few, a vector of them (the lanes past the row unused) */
        vec v = load_lanes(x + k, depth - k) - shift;
        vec e = exp_lanes(beta != 1.0f ? v * beta : v);
        store_lanes(out + k, e, depth - k);
        for (int64_t i = 0; i < depth - k; i++)
            sum += e[i];
    }
    for (k = 0; k < depth; k++)
        out[k] /= sum;
}

int softmax_prepared(const softmax_call *p)
{
    int team = p->rows > 1 ? team_of(p->threads) : 1;
    #pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
    for (int64_t r = 0; r < p->rows; r++)
        softmax_row(p->x + r * p->depth, p->out + r * p->depth, p->depth, p->beta);
    return DONE;
}

/* A copy of ``bytes`` bytes: RESHAPE and its kin (the same values in another shape) as a prepared call. */
typedef struct {
    const void *x;
    void *out;
    int64_t bytes;
} copy_call;

int copy_prepared(const copy_call *c)
{
    memcpy(c->out, c->x, (size_t)c->bytes);
    return DONE;
}

/* TRANSPOSE: out (contiguous, of ``shape``, ``rank`` axes up to TRANSPOSE_AXES) from x's items, out's axis k
 * stepping ``step[k]`` items through x; ``item`` bytes an item (1, 2, 4 or 8).  Where out's second last axis
 * is x's last (a matrix transposed: attention's scores; 4-byte items only, native.py's TransposeCall), blocks
 * of 8 x 8 transposed in registers (transpose8x8), the ragged edges item by item; else each out row a gather
 * at one step.  Blocks of 8 rows of out, or rows, are shared among ``threads``.  A 2 x 197 x 197 float
 * transpose on the 2-core VM took 40-43 us on one thread item by item in tiles, numpy's copy 22-24. */
#define TRANSPOSE_AXES 6
typedef struct {
    const void *x;
    void *out;
    int64_t rank, item;
    int64_t shape[TRANSPOSE_AXES], step[TRANSPOSE_AXES];
    int64_t threads;
} transpose_call;

/* Where item ``index`` of out's first ``axes`` axes (in order) starts in x. */
static int64_t transpose_start(const transpose_call *p, int64_t axes, int64_t index)
{
    int64_t at = 0;
    for (int64_t k = axes - 1; k >= 0; k--) {
        at += index % p->shape[k] * p->step[k];
        index /= p->shape[k];
    }
    return at;
}

typedef uint32_t u32x8 __attribute__((vector_size(8 * sizeof(uint32_t))));

/* dst row k = column k of the 8 x 8 block at src (rows ``from`` items apart), dst rows ``to`` apart: pairs of
 * rows interleaved, then pairs of pairs, then halves. */
static inline void transpose8x8(const uint32_t *src, int64_t from, uint32_t *dst, int64_t to)
{
    u32x8 r[8], t[8];
    for (int i = 0; i < 8; i++)
        memcpy(&r[i], src + i * from, sizeof r[i]);
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], (u32x8){0, 8, 1, 9, 4, 12, 5, 13});
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], (u32x8){2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = __builtin_shuffle(t[i], t[i + 2], (u32x8){0, 1, 8, 9, 4, 5, 12, 13});
        r[i + 1] = __builtin_shuffle(t[i], t[i + 2], (u32x8){2, 3, 10, 11, 6, 7, 14, 15});
        r[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], (u32x8){0, 1, 8, 9, 4, 5, 12, 13});
        r[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], (u32x8){2, 3, 10, 11, 6, 7, 14, 15});
    }
    for (int k = 0; k < 4; k++) {
        u32x8 low = __builtin_shuffle(r[k], r[k + 4], (u32x8){0, 1, 2, 3, 8, 9, 10, 11});
        u32x8 high = __builtin_shuffle(r[k], r[k + 4], (u32x8){4, 5, 6, 7, 12, 13, 14, 15});
        memcpy(dst + k * to, &low, sizeof low);
        memcpy(dst + (k + 4) * to, &high, sizeof high);
    }
}

#define TRANSPOSE_ROW(T)                                                                                     \
    do {                                                                                                     \
        const T *from = (const T *)p->x + transpose_start(p, rank - 1, r);                                   \
        T *to = (T *)p->out + r * columns;                                                                   \
        for (int64_t j = 0; j < columns; j++)                                                                \
            to[j] = from[j * last];                                                                          \
    } while (0)

int transpose_prepared(const transpose_call *p)
{
    int64_t rank = p->rank, columns = p->shape[rank - 1], last = p->step[rank - 1], rows = 1;
    for (int64_t k = 0; k < rank - 1; k++)
        rows *= p->shape[k];
    int team = rows * columns >= 4096 ? team_of(p->threads) : 1;
    if (rank >= 2 && p->step[rank - 2] == 1 && last != 1 && p->item == 4) {
        int64_t height = p->shape[rank - 2], matrices = height ? rows / height : 0, bands = (height + 7) / 8;
        #pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
        for (int64_t task = 0; task < matrices * bands; task++) {
            int64_t matrix = task / bands, i0 = task % bands * 8, in = height - i0 < 8 ? height - i0 : 8;
            const uint32_t *from = (const uint32_t *)p->x + transpose_start(p, rank - 2, matrix) + i0;
            uint32_t *to = (uint32_t *)p->out + (matrix * height + i0) * columns;
            int64_t j = 0;
            if (in == 8)
                for (; j + 8 <= columns; j += 8)
                    transpose8x8(from + j * last, last, to + j, columns);
            for (int64_t i = 0; i < in; i++)  /* the ragged edges: out[i][j] = x row j, item i */
                for (int64_t jj = j; jj < columns; jj++)
                    to[i * columns + jj] = from[jj * last + i];
        }
        return DONE;
    }
    #pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
    for (int64_t r = 0; r < rows; r++) {
        switch (p->item) {
        case 1: TRANSPOSE_ROW(uint8_t); break;
        case 2: TRANSPOSE_ROW(uint16_t); break;
        case 4: TRANSPOSE_ROW(uint32_t); break;
        default: TRANSPOSE_ROW(uint64_t); break;
        }
    }
    return DONE;
}

/* A partition's consecutive prepared calls on buffers fixed at compile time, run as one call (native.py's
 * batched_steps): calls[i] by kernels[i] in turn; the first status other than DONE ends it. */
typedef int (*prepared_kernel)(const void *);

int run_prepared(const prepared_kernel *kernels, const void *const *calls, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int status = kernels[i](calls[i]);
        if (status != DONE)
            return status;
    }
    return DONE;
}

/* run_prepared with each call's duration in ``seconds[i]`` (a profiled run: the per-op times of the
 * batched stretch that really runs, not of a Python call per op, which costs more than many kernels). */
int run_prepared_timed(const prepared_kernel *kernels, const void *const *calls, int64_t n, double *seconds)
{
    struct timespec before, after;
    for (int64_t i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &before);
        int status = kernels[i](calls[i]);
        clock_gettime(CLOCK_MONOTONIC, &after);
        seconds[i] = (double)(after.tv_sec - before.tv_sec) + 1e-9 * (double)(after.tv_nsec - before.tv_nsec);
        if (status != DONE)
            return status;
    }
    return DONE;
}

/* An int8 SOFTMAX over rows of ``depth`` as LiteRT's table kernel computes it, in float32 operation by
 * operation: e = table[row max - x] (exp of the scaled distance), the row's e summed in order, p = e *
 * (1 / (sum * scale)), rounded half away from zero (floor(p + 0.5): p >= 0), plus the zero point,
 * clamped.  Nothing may fuse p's product with the rounding's addition (one rounding, not LiteRT's two). */
typedef struct {
    const int8_t *x;
    int8_t *out;
    int64_t rows, depth;
    const float *table;
    float scale;
    int32_t zero, low, high;
} qsoftmax_call;

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
int qsoftmax(const qsoftmax_call *p)
{
    for (int64_t r = 0; r < p->rows; r++) {
        const int8_t *x = p->x + r * p->depth;
        int8_t *out = p->out + r * p->depth;
        int32_t top = x[0];
        for (int64_t i = 1; i < p->depth; i++)
            top = x[i] > top ? x[i] : top;
        float total = 0.0f;
        for (int64_t i = 0; i < p->depth; i++)
            total += p->table[top - x[i]];
        float inverse = 1.0f / (total * p->scale);
        for (int64_t i = 0; i < p->depth; i++) {
            float probability = p->table[top - x[i]] * inverse, rounded = probability + 0.5f;
            /* floor by truncation (rounded >= 0); from 1024 on the clamp gives high whatever the zero point */
            int32_t q = rounded < 1024.0f ? (int32_t)rounded + p->zero : p->high;
            out[i] = (int8_t)(q < p->low ? p->low : q > p->high ? p->high : q);
        }
    }
    return DONE;
}
#pragma GCC pop_options

/* float32 -> int8, uint8 or int16 QUANTIZE as LiteRT's kernel computes it: the first ``whole`` values as its
 * vector loop does (times the float32 reciprocal, ties to even), the rest as its scalar tail (divided in
 * double, ties away from zero); each converted to int32 as x86 converts (NaN and values outside int32: its
 * least value), the zero point added with wrap-around, then clamped to [low, high]. */
typedef struct {
    const float *x;
    void *out;
    int64_t n, whole;
    float reciprocal;
    double divisor;
    int64_t zero, low, high, bytes, threads;
} quantize_call;

/* no product and sum fused into one rounding: LiteRT rounds the product to float32 first */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
static inline int32_t quantized_value(float rounded, int32_t zero, int32_t low, int32_t high)
{
    /* NaN fails both comparisons: int32's least value, as the conversion gives */
    int32_t q = rounded >= -2147483648.0f && rounded < 2147483648.0f ? (int32_t)rounded : INT32_MIN;
    int32_t sum = (int32_t)((uint32_t)q + (uint32_t)zero);
    return sum < low ? low : sum > high ? high : sum;
}

static inline float rounded_to_even(float v)
{
    /* adding and taking off 1.5 * 2^23 rounds to an integer in the current (nearest-even) mode; values
     * that large, infinities and NaN are left as they are */
    float magic = 12582912.0f, r = (v + magic) - magic;
    return fabsf(v) < 8388608.0f ? r : v;
}

int quantize_prepared(const quantize_call *c)
{
    int32_t zero = (int32_t)c->zero, low = (int32_t)c->low, high = (int32_t)c->high;
    int64_t n = c->n, whole = c->whole < c->n ? c->whole : c->n, bytes = c->bytes;
    const float *restrict x = c->x;
    float reciprocal = c->reciprocal;
    int threads = team_of(c->threads);
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int part = 0; part < threads; part++) {
        int64_t lo, hi;
        share(whole, LANES, part, threads, &lo, &hi);
        if (bytes == 1) {
            uint8_t *restrict out = (uint8_t *)c->out;
            for (int64_t i = lo; i < hi; i++)
                out[i] = (uint8_t)quantized_value(rounded_to_even(x[i] * reciprocal), zero, low, high);
        } else {
            int16_t *restrict out = (int16_t *)c->out;
            for (int64_t i = lo; i < hi; i++)
                out[i] = (int16_t)quantized_value(rounded_to_even(x[i] * reciprocal), zero, low, high);
        }
    }
    for (int64_t i = whole; i < n; i++) {
        double v = round((double)x[i] / c->divisor);
        int32_t q = v >= -2147483648.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
        int32_t sum = (int32_t)((uint32_t)q + (uint32_t)zero);
        sum = sum < low ? low : sum > high ? high : sum;
        if (c->bytes == 1)
            ((uint8_t *)c->out)[i] = (uint8_t)sum;
        else
            ((int16_t *)c->out)[i] = (int16_t)sum;
    }
    return DONE;
}
#pragma GCC pop_options

/* A dynamic-range ("hybrid") FULLY_CONNECTED as numpy's formulation (hybrid.py) computes it: each row of x
 * quantized to int8 (symmetric: max|x| / 127; asymmetric: [min(x, 0), max(x, 0)] over 255 steps in double, the
 * zero point nudged from the nearer end, halves away from zero), its integer sums against each unit's int8
 * weights, then float32(sum) * (row scale * unit scale) + bias, clamped to [low, high].  The weights come
 * transposed (depth x units, int16), so that a row's sums go HYBRID_UNITS units at a time along vectors (a
 * dot product per unit, 32 deep, spent more on its horizontal sum than on its products: 197 x 32 -> 32 took
 * 36 us on two threads).  A row holding a value that is not finite is left to numpy's formulation: the call
 * returns NOT_FINITE before writing anything. */
#define HYBRID_UNITS 64
enum { NOT_FINITE = 2 };
/* no product and sum fused into one rounding: numpy's formulation rounds each to float32 */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
typedef struct {
    const float *x;
    float *out;
    const int16_t *weights;
    const float *scales, *bias;
    int64_t rows, depth, units, asymmetric;
    float low, high;
    int64_t threads;
} hybrid_fc_call;

/* round_half_away(v) clamped to [low, high] (bounds within +-200), as int32: floor(|v| + 0.5) in float32 taken by
 * truncation (|v| + 0.5 >= 0), at most 200 first (anything larger clamps alike), its sign v's; branch-free, so that
 * a row's loop is vectorised. */
static inline int32_t half_away_clamped(float v, int32_t low, int32_t high)
{
    float a = fabsf(v) + 0.5f;
    int32_t m = (int32_t)(a < 200.0f ? a : 200.0f), q = v < 0.0f ? -m : m;
    return q < low ? low : q > high ? high : q;
}

static inline double half_away_double(double v)
{
    double r = floor(fabs(v) + 0.5);
    return v < 0.0 ? -r : r;
}

/* Row ``x`` (``depth`` values) quantized into q, less its zero point; returns its float32 scale. */
static float hybrid_row(const float *restrict x, int64_t depth, int asymmetric, int32_t *restrict q)
{
    vec lows = {0}, highs = {0};  /* the least and greatest value and 0, by vectors (the values are finite) */
    int64_t k = 0;
    for (; k + LANES <= depth; k += LANES) {
        vec v = load(x + k);
        lows = (vec)(((ivec)v & (ivec)(v < lows)) | ((ivec)lows & ~(ivec)(v < lows)));
        highs = (vec)(((ivec)v & (ivec)(v > highs)) | ((ivec)highs & ~(ivec)(v > highs)));
    }
    float low = 0.0f, high = 0.0f;
    for (int i = 0; i < LANES; i++) {
        low = lows[i] < low ? lows[i] : low;
        high = highs[i] > high ? highs[i] : high;
    }
    for (; k < depth; k++) {
        low = x[k] < low ? x[k] : low;
        high = x[k] > high ? x[k] : high;
    }
    if (low == high) {
        for (int64_t i = 0; i < depth; i++)
            q[i] = 0;
        return 1.0f;
    }
    if (!asymmetric) {
        float reach = -low > high ? -low : high, inverse = 127.0f / reach;
        for (int64_t i = 0; i < depth; i++)
            q[i] = half_away_clamped(x[i] * inverse, -127, 127);
        return reach / 127.0f;
    }
    double lo = low, hi = high, step64 = (hi - lo) / 255.0;
    double from_min = -128.0 - lo / step64, from_max = 127.0 - hi / step64;
    double zero_at = 128.0 + fabs(lo / step64) < 127.0 + fabs(hi / step64) ? from_min : from_max;
    int32_t zero = zero_at <= -128.0 ? -128 : zero_at >= 127.0 ? 127 : (int32_t)half_away_double(zero_at);
    float step = (float)step64, inverse = 1.0f / step, zero_f = (float)zero;
    for (int64_t i = 0; i < depth; i++)
        q[i] = half_away_clamped(zero_f + x[i] * inverse, -128, 127) - zero;
    return step;
}

int hybrid_fc_prepared(const hybrid_fc_call *p)
{
    int64_t depth = p->depth, units = p->units;
    int not_finite = 0;  /* x - x is 0 for a finite x, NaN for an infinite or NaN one (a loop that vectorises) */
    for (int64_t i = 0; i < p->rows * depth; i++)
        not_finite |= !(p->x[i] - p->x[i] == 0.0f);
    if (not_finite)
        return NOT_FINITE;
    int team = team_of(p->threads);
    size_t per_thread = (size_t)depth * sizeof(int32_t);
    char *all = scratch(team, per_thread);
    if (!all)
        return NO_MEMORY;
    #pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
    for (int64_t r = 0; r < p->rows; r++) {
        int32_t *q = (int32_t *)own_scratch(all, per_thread);
        float step = hybrid_row(p->x + r * depth, depth, (int)p->asymmetric, q);
        float *out = p->out + r * units;
        for (int64_t u0 = 0; u0 < units; u0 += HYBRID_UNITS) {
            int64_t un = units - u0 < HYBRID_UNITS ? units - u0 : HYBRID_UNITS;
            int32_t sums[HYBRID_UNITS] = {0};
            for (int64_t i = 0; i < depth; i++) {
                const int16_t *w = p->weights + i * units + u0;
                int32_t qi = q[i];
                for (int64_t u = 0; u < un; u++)
                    sums[u] += qi * (int32_t)w[u];
            }
            for (int64_t u = 0; u < un; u++) {
                float scale = step * p->scales[u0 + u], value = (float)sums[u] * scale;
                if (p->bias)
                    value += p->bias[u0 + u];
                out[u0 + u] = value < p->low ? p->low : value > p->high ? p->high : value;
            }
        }
    }
    free(all);
    return DONE;
}
#pragma GCC pop_options

/* An int8 or uint8 op through its 256-entry table, or (``wide``) an int16 op through its 65536-entry one of
 * 16-bit items: the item's bits, the top one flipped for a signed type (the table starts at the type's
 * minimum), index the table. */
typedef struct {
    const uint8_t *x;
    uint8_t *out;
    int64_t n;
    const uint8_t *table;
    int64_t flip, threads, wide;
} lookup_call;

static int qlookup_wide(const lookup_call *p)
{
    const uint16_t *x = (const uint16_t *)p->x, *table = (const uint16_t *)p->table, flip = (uint16_t)p->flip;
    uint16_t *out = (uint16_t *)p->out;
    int64_t parts = (p->n + 4095) / 4096;
    #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
    for (int64_t part = 0; part < parts; part++) {
        int64_t end = (part + 1) * 4096 < p->n ? (part + 1) * 4096 : p->n;
        for (int64_t i = part * 4096; i < end; i++)
            out[i] = table[x[i] ^ flip];
    }
    return DONE;
}

int qlookup(const lookup_call *p)
{
    if (p->wide)
        return qlookup_wide(p);
    int64_t parts = (p->n + 4095) / 4096;
    uint8_t flip = (uint8_t)p->flip;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
    /* 64 bytes at a time: two 128-entry byte permutes, the index's top bit picking between them */
    __m512i quarter[4], flips = _mm512_set1_epi8((char)flip);
    for (int q = 0; q < 4; q++)
        quarter[q] = _mm512_loadu_si512((const void *)(p->table + 64 * q));
#elif defined(__AVX2__)
    /* 32 bytes at a time: the table as 16 rows of 16 entries, each row a byte shuffle by the index's low
     * nibble, kept where the high nibble names the row (a byte at a time ran 6x LiteRT's table on AVX2) */
    __m256i rows[16], flips = _mm256_set1_epi8((char)flip), nibble = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < 16; r++)
        rows[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p->table + 16 * r)));
#endif
    #pragma omp parallel for num_threads(team_of(p->threads)) schedule(static) if (team_of(p->threads) > 1)
    for (int64_t part = 0; part < parts; part++) {
        int64_t i = part * 4096, end = (part + 1) * 4096 < p->n ? (part + 1) * 4096 : p->n;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
        for (; i + 64 <= end; i += 64) {
            __m512i index = _mm512_xor_si512(_mm512_loadu_si512((const void *)(p->x + i)), flips);
            __m512i low = _mm512_permutex2var_epi8(quarter[0], index, quarter[1]);
            __m512i high = _mm512_permutex2var_epi8(quarter[2], index, quarter[3]);
            _mm512_storeu_si512((void *)(p->out + i), _mm512_mask_blend_epi8(_mm512_movepi8_mask(index), low, high));
        }
#elif defined(__AVX2__)
        for (; i + 32 <= end; i += 32) {
            __m256i index = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p->x + i)), flips);
            __m256i low = _mm256_and_si256(index, nibble);
            __m256i high = _mm256_and_si256(_mm256_srli_epi16(index, 4), nibble);
            __m256i y = _mm256_setzero_si256();
            for (int r = 0; r < 16; r++)
                y = _mm256_blendv_epi8(y, _mm256_shuffle_epi8(rows[r], low),
                                       _mm256_cmpeq_epi8(high, _mm256_set1_epi8((char)r)));
            _mm256_storeu_si256((__m256i *)(p->out + i), y);
        }
#endif
        for (; i < end; i++)
            p->out[i] = p->table[p->x[i] ^ flip];
    }
    return DONE;
}

/* MEAN of int8 (images, pixels, c) over the pixels: each channel's int32 sum through the output stage. */
typedef struct {
    const int8_t *x;
    int8_t *out;
    int64_t images, pixels, c;
    const qstage *stage;
} qmean_call;

int qmean(const qmean_call *p)
{
    int32_t *acc = malloc((size_t)(p->c > 0 ? p->c : 1) * sizeof *acc);
    if (!acc)
        return NO_MEMORY;
    for (int64_t image = 0; image < p->images; image++) {
        const int8_t *x = p->x + image * p->pixels * p->c;
        memset(acc, 0, (size_t)p->c * sizeof *acc);
        int64_t first = 0;
#if defined(__AVX512F__)
        for (; first + 16 <= p->c; first += 16) {  /* 16 channels summed in registers, 4 pixels apart */
            __m512i sums[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                               _mm512_setzero_si512()};
            int64_t q = 0;
            for (; q + 4 <= p->pixels; q += 4)
                for (int u = 0; u < 4; u++)
                    sums[u] = _mm512_add_epi32(sums[u], _mm512_cvtepi8_epi32(
                        _mm_loadu_si128((const __m128i *)(x + (q + u) * p->c + first))));
            for (; q < p->pixels; q++)
                sums[0] = _mm512_add_epi32(sums[0], _mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(x + q * p->c + first))));
            _mm512_storeu_si512((void *)(acc + first), _mm512_add_epi32(_mm512_add_epi32(sums[0], sums[1]),
                                                                        _mm512_add_epi32(sums[2], sums[3])));
        }
#endif
#if defined(__AVX2__)
        for (; first + 8 <= p->c; first += 8) {  /* 8 channels summed in registers, 4 pixels apart */
            __m256i sums[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                               _mm256_setzero_si256()};
            int64_t q = 0;
            for (; q + 4 <= p->pixels; q += 4)
                for (int u = 0; u < 4; u++)
                    sums[u] = _mm256_add_epi32(sums[u], _mm256_cvtepi8_epi32(
                        _mm_loadl_epi64((const __m128i *)(x + (q + u) * p->c + first))));
            for (; q < p->pixels; q++)
                sums[0] = _mm256_add_epi32(sums[0], _mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(x + q * p->c + first))));
            _mm256_storeu_si256((__m256i *)(acc + first), _mm256_add_epi32(_mm256_add_epi32(sums[0], sums[1]),
                                                                           _mm256_add_epi32(sums[2], sums[3])));
        }
#endif
        for (int64_t q = 0; q < p->pixels && first < p->c; q++)
            for (int64_t k = first; k < p->c; k++)
                acc[k] += x[q * p->c + k];
        qstore(acc, 0, p->c, p->stage, p->out + image * p->c);
    }
    free(acc);
    return DONE;
}

/* The integer LSTM ("8x8_16": int8 activations and weights, int16 cell state) over a whole sequence, step
 * by step as quant_lstm.py computes it (LiteRT's portable tensor_utils, rounding for rounding), in int64
 * with numpy's wrap-around where a product could leave it.  Gate 0 (input) has no weights with CIFG;
 * gates without peepholes or layer norm have NULL there.  Scratch: 6 x batch x n_cell int64. */
typedef struct {
    const int8_t *w_in, *w_rec;        /* n_cell x n_input, n_cell x n_output */
    const int64_t *bias_in, *bias_rec;  /* n_cell each, zero points folded in */
    int64_t m_in, s_in, m_rec, s_rec;
    const int64_t *peephole;            /* n_cell, or NULL */
    int64_t m_peep, s_peep;
    const int64_t *norm, *norm_bias;    /* n_cell each, or NULL: no layer norm */
    int64_t m_norm, s_norm, variance_guard;
    const int16_t *table;               /* 65536 entries: the gate's squash, indexed by value + 32768 */
} qlstm_gate;

typedef struct {
    const int8_t *x;
    int8_t *h;   /* output state, batch x n_output, updated in place */
    int16_t *c;  /* cell state, batch x n_cell, updated in place */
    int8_t *y;
    int64_t steps, batch, n_input, n_cell, n_output;
    int64_t x_step, x_row, y_step, y_row;  /* strides in items */
    int64_t rows_together;  /* the peephole walks the rows of a step as one flat array (time major) */
    qlstm_gate gates[4];    /* input, forget, cell, output */
    int64_t cell_shift;     /* 30 + the cell state's exponent */
    int64_t cell_bound;
    const int16_t *tanh_cell;  /* NULL: the input gate stands in for tanh(cell) */
    int64_t hidden_zp, m_hidden, s_hidden;
    const int8_t *projection;  /* n_output x n_cell, or NULL */
    const int64_t *projection_bias;
    int64_t m_proj, s_proj, proj_bound, state_zp;
    int64_t *scratch;
} qlstm_call;

static inline int64_t wrapped_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static inline int64_t wrapped_shl(int64_t a, int64_t s) { return (int64_t)((uint64_t)a << (s & 63)); }
static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }
static inline int64_t wrap_to16(int64_t x) { return (int64_t)(int16_t)(uint16_t)(uint64_t)x; }
static inline int64_t wrap_to32(int64_t x) { return (int64_t)(int32_t)(uint32_t)(uint64_t)x; }

static inline int64_t high_mul32(int64_t a, int64_t b)
{
    if (a == INT32_MIN && b == INT32_MIN)
        return INT32_MAX;
    return (int64_t)((uint64_t)wrapped_mul(a, b) + (1u << 30)) >> 31;
}

static inline int64_t divide_by_pot(int64_t x, int64_t e)
{
    if (e <= 0)
        return x;
    return (int64_t)((uint64_t)x + ((uint64_t)1 << (e - 1)) - (uint64_t)(x < 0)) >> e;
}

static inline int64_t by_multiplier(int64_t x, int64_t m, int64_t s)
{
    return divide_by_pot(high_mul32(wrapped_shl(x, s > 0 ? s : 0), m), s < 0 ? -s : 0);
}

static inline int64_t c_div(int64_t a, int64_t b) { return a / b; }  /* C's division: toward zero */

static inline int64_t times_pot_clamped(int64_t a, int64_t e)
{
    return clamp64(wrapped_shl(a, e), INT32_MIN, INT32_MAX);
}

/* LiteRT's fixed-point 1/sqrt(v) as (Q31 significand, exponent): quantized.py's inverse_sqrt. */
static void inverse_sqrt1(int64_t value, int64_t *significand, int64_t *exponent)
{
    if (value <= 1) {
        *significand = INT32_MAX;
        *exponent = 0;
        return;
    }
    int64_t v = value, shift = 11;
    while (v >= (1 << 29)) {
        v /= 4;
        shift++;
    }
    int64_t bits = 64 - __builtin_clzll((unsigned long long)v);  /* frexp's exponent */
    int64_t pairs = (31 - bits) / 2 - 1;
    shift -= pairs;
    v = wrapped_shl(v, 2 * pairs);
    int64_t half = divide_by_pot(v >> 1, 1), x = 1 << 28;
    for (int i = 0; i < 5; i++) {
        int64_t cube = times_pot_clamped(high_mul32(high_mul32(x, x), x), 6);
        x = times_pot_clamped(high_mul32((1 << 28) + (1 << 27), x) - high_mul32(half, cube), 3);
    }
    x = high_mul32(x, 1518500250);
    if (shift < 0) {
        x = wrapped_shl(x, -shift);
        shift = 0;
    }
    *significand = x;
    *exponent = -shift;
}

/* One gate for every row of a step: the squashed int16 values into out (batch x n_cell). */
static void qlstm_gate_values(const qlstm_call *p, const qlstm_gate *g, const int8_t *x, const int8_t *h,
                              const int64_t *c, int64_t *out)
{
    int64_t nc = p->n_cell;
    for (int64_t r = 0; r < p->batch; r++) {
        const int8_t *xr = x + r * p->x_row, *hr = h + r * p->n_output;
        int64_t *gate = out + r * nc;
        for (int64_t j = 0; j < nc; j++) {
            int64_t in = g->bias_in[j], rec = g->bias_rec[j];
            const int8_t *wi = g->w_in + j * p->n_input, *wr = g->w_rec + j * p->n_output;
            for (int64_t k = 0; k < p->n_input; k++)
                in += (int64_t)xr[k] * wi[k];
            for (int64_t k = 0; k < p->n_output; k++)
                rec += (int64_t)hr[k] * wr[k];
            /* LiteRT's sums are int32: past its range they wrap */
            int64_t v = clamp64(by_multiplier(wrap_to32(in), g->m_in, g->s_in), -32768, 32767);
            gate[j] = clamp64(v + by_multiplier(wrap_to32(rec), g->m_rec, g->s_rec), -32768, 32767);
        }
    }
    if (g->peephole) {
        int64_t rows = p->rows_together ? 1 : p->batch;
        int64_t n = p->rows_together ? p->batch * p->n_output : p->n_output;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++) {
                int64_t at = r * nc + i;
                int64_t product = by_multiplier(wrapped_mul(g->peephole[i % p->n_output], c[at]), g->m_peep, g->s_peep);
                out[at] = clamp64(out[at] + product, -32768, 32767);
            }
    }
    for (int64_t r = 0; r < p->batch; r++) {
        int64_t *gate = out + r * nc;
        if (g->norm) {
            int64_t sum = 0, squares = 0;
            for (int64_t j = 0; j < nc; j++) {
                sum += gate[j];
                squares += gate[j] * gate[j];
            }
            int64_t mean = c_div(sum * 1024, nc);
            int64_t variance = c_div(wrapped_mul(squares, (1 << 20) / nc) - mean * mean, 1 << 20);
            if (variance < 1)
                variance = g->variance_guard;
            int64_t inv_m, inv_s;
            inverse_sqrt1(variance, &inv_m, &inv_s);
            int64_t shift = g->s_norm + 12;
            for (int64_t j = 0; j < nc; j++) {
                int64_t rescaled = by_multiplier(1024 * gate[j] - mean, inv_m, inv_s);
                int64_t weighted = wrap_to32(wrapped_mul(rescaled, g->norm[j]) + g->norm_bias[j]);
                int64_t rounded = c_div(weighted > 0 ? weighted + 512 : weighted - 512, 1024);
                int64_t s = shift;
                if (s > 0) {
                    rounded = wrap_to32(wrapped_shl(rounded, s));
                    s = 0;
                }
                gate[j] = clamp64(by_multiplier(rounded, g->m_norm, s), -32768, 32767);
            }
        }
        for (int64_t j = 0; j < nc; j++)
            gate[j] = g->table[gate[j] + 32768];
    }
}

int qlstm(const qlstm_call *p)
{
    int64_t cells = p->batch * p->n_cell;
    int64_t *forget = p->scratch, *update = forget + cells, *input = update + cells, *output = input + cells;
    int64_t *c = output + cells, *hidden = c + cells;
    int8_t *h = p->h;
    for (int64_t i = 0; i < cells; i++)
        c[i] = p->c[i];
    for (int64_t t = 0; t < p->steps; t++) {
        const int8_t *x = p->x + t * p->x_step;
        qlstm_gate_values(p, &p->gates[1], x, h, c, forget);
        qlstm_gate_values(p, &p->gates[2], x, h, c, update);
        if (p->gates[0].w_in)
            qlstm_gate_values(p, &p->gates[0], x, h, c, input);
        else
            for (int64_t i = 0; i < cells; i++)
                input[i] = 32767 - forget[i];
        for (int64_t i = 0; i < cells; i++) {
            int64_t kept = wrap_to16(divide_by_pot(forget[i] * c[i], 15));
            int64_t v = clamp64(kept + wrap_to16(divide_by_pot(input[i] * update[i], p->cell_shift)), -32768, 32767);
            c[i] = p->cell_bound > 0 ? clamp64(v, -p->cell_bound, p->cell_bound) : v;
        }
        qlstm_gate_values(p, &p->gates[3], x, h, c, output);
        for (int64_t i = 0; i < cells; i++) {
            int64_t product = output[i] * (p->tanh_cell ? p->tanh_cell[c[i] + 32768] : input[i]);
            int64_t scaled = by_multiplier(product, p->m_hidden, p->s_hidden);
            int64_t centred = p->projection ? scaled - p->hidden_zp : scaled + p->hidden_zp;
            hidden[i] = clamp64(centred, -128, 127);
        }
        for (int64_t r = 0; r < p->batch; r++) {
            int8_t *y = p->y + t * p->y_step + r * p->y_row;
            for (int64_t j = 0; j < p->n_output; j++) {
                int64_t v;
                if (p->projection) {
                    int64_t acc = p->projection_bias[j];
                    const int8_t *w = p->projection + j * p->n_cell;
                    for (int64_t k = 0; k < p->n_cell; k++)
                        acc += hidden[r * p->n_cell + k] * w[k];
                    v = clamp64(by_multiplier(wrap_to32(acc), p->m_proj, p->s_proj) + p->state_zp, -128, 127);
                    if (p->proj_bound > 0)
                        v = clamp64(v, -p->proj_bound, p->proj_bound);
                } else {
                    v = hidden[r * p->n_cell + j];
                }
                y[j] = (int8_t)v;
            }
        }
        for (int64_t r = 0; r < p->batch; r++)  /* the step's output is the next step's state */
            for (int64_t j = 0; j < p->n_output; j++)
                h[r * p->n_output + j] = p->y[t * p->y_step + r * p->y_row + j];
    }
    for (int64_t i = 0; i < cells; i++)
        p->c[i] = (int16_t)c[i];
    return DONE;
}
