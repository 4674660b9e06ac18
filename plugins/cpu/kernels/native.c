/* Native loops of the CPU kernels, built on first use with the machine's C compiler (see native.py).
 *
 * Two things numpy cannot do fast: a depthwise convolution's multiply-accumulate over
 * filter taps (numpy's einsum runs it with 128-bit vectors), and sharing a product
 * between cores without a Python thread hand-over for every chunk.  Both run on an
 * OpenMP team, whose threads wait spinning between the kernels of a run.
 */
#include <stdint.h>
#include <string.h>

typedef float vec __attribute__((vector_size(64)));
#define LANES 16

static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }

/* A float kernel's bias (per column, or NULL) and fused clamp, applied to rows just computed. */
typedef struct {
    const float *bias;
    int clamp;
    float low, high;
} epilogue;

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
    }
}

/* out[r, j] = sum over taps t of src[starts[r] + offsets[t] + j] * filt[t, j], then the epilogue
 * (its bias per j), for rows r and j < width; out's rows are out_stride apart.  Each group of 64
 * outputs keeps its sums in registers over all taps. */
void tap_sum(const float *restrict src, const int64_t *restrict starts, const int64_t *restrict offsets,
             const float *restrict filt, int64_t taps, float *restrict out, int64_t out_stride,
             int64_t rows, int64_t width, const epilogue *finish, int threads)
{
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; r++) {
        float *restrict row = out + r * out_stride;
        const float *base = src + starts[r];
        int64_t j = 0;
        for (; j + 4 * LANES <= width; j += 4 * LANES) {
            vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t t = 0; t < taps; t++) {
                const float *x = base + offsets[t] + j, *w = filt + t * width + j;
                a0 += load(x) * load(w);
                a1 += load(x + LANES) * load(w + LANES);
                a2 += load(x + 2 * LANES) * load(w + 2 * LANES);
                a3 += load(x + 3 * LANES) * load(w + 3 * LANES);
            }
            store(row + j, a0);
            store(row + j + LANES, a1);
            store(row + j + 2 * LANES, a2);
            store(row + j + 3 * LANES, a3);
        }
        for (; j + LANES <= width; j += LANES) {
            vec a = {0};
            for (int64_t t = 0; t < taps; t++)
                a += load(base + offsets[t] + j) * load(filt + t * width + j);
            store(row + j, a);
        }
        for (; j < width; j++) {
            float a = 0;
            for (int64_t t = 0; t < taps; t++)
                a += base[offsets[t] + j] * filt[t * width + j];
            row[j] = a;
        }
        finish_rows(row, 1, width, width, finish);
    }
}

/* CBLAS sgemm, row-major, with 64-bit or 32-bit integers (as the BLAS numpy loaded was built). */
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
typedef void (*sgemm32_fn)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t,
                           const float *, int32_t, float, float *, int32_t);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static void sgemm(void *fn, int int64, int trans_a, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    int ta = trans_a ? TRANS : NO_TRANS;
    if (int64)
        ((sgemm64_fn)fn)(ROW_MAJOR, ta, NO_TRANS, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    else
        ((sgemm32_fn)fn)(ROW_MAJOR, ta, NO_TRANS, (int32_t)m, (int32_t)n, (int32_t)k, 1.0f, a, (int32_t)lda,
                         b, (int32_t)ldb, 0.0f, c, (int32_t)ldc);
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
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
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
            sgemm(fn, int64, trans_a, m, c1 - c0, k, a, lda, b + c0, ldb, c + c0, ldc);
            finish_rows(c + c0, m, c1 - c0, ldc, &part);
        }
    }
}
