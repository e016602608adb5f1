/* GEMM y = x w^T on the CPU, with w in F32, BF16 or F16.
 *
 * Batch invariance: each y[m][n] is computed by the exact sequence of
 * hpd_dot() (8 lanes over k, fixed horizontal sum, ordered tail) whatever the
 * kernel shape that computes it (4x4 for the bulk of a large batch, 4x2 for
 * small batches and leftover pairs of columns, 1x4 for leftover rows, 1x1
 * for leftover columns), so a row's result never depends on the batch.
 *
 * Weight dtypes: a BF16 or F16 element is widened to fp32 in registers as it
 * is loaded (exactly: both are subsets of fp32), then the same fp32 sequence
 * runs, so BF16 weights give the bits of the same weights stored as F32 while
 * reading half the bytes. One kernel set per dtype, from one macro. */
#include <omp.h>
#include <stdlib.h>

#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/tp_sum.h"
#include "common/log.h"
#include "common/util.h"

#define NB 32 /* weight rows per tile: a tile of w stays in L2 while x streams */

/* The 4x4 kernel holds 24 vectors (16 sums, 4 weight and 4 x vectors): it
 * fits AVX-512's 32 registers, not AVX2's 16, where it would spill; there
 * large batches keep the 4x2 kernel. */
#if defined(__AVX512F__)
#define GEMM_4X4 1
#else
#define GEMM_4X4 0
#endif

static inline void finish(float *y, float s, bool accumulate)
{
    *y = accumulate ? *y + s : s;
}

/* ---- loads of 8 and of 1 weight element, widened to fp32 */

static inline hpd_v8_t load8_f32(const float *p)
{
    return hpd_v8_load(p);
}

static inline float load1_f32(const float *p)
{
    return *p;
}

static inline float load1_bf16(const uint16_t *p)
{
    return hpd_bf16_to_f32(*p);
}

static inline float load1_f16(const uint16_t *p)
{
    return hpd_f16_to_f32(*p);
}

#if defined(__AVX2__) && defined(__FMA__)
static inline hpd_v8_t load8_bf16(const uint16_t *p)
{
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
#else
static inline hpd_v8_t load8_bf16(const uint16_t *p)
{
    float f[8];
    for (int i = 0; i < 8; i++)
        f[i] = hpd_bf16_to_f32(p[i]);
    return hpd_v8_load(f);
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static inline hpd_v8_t load8_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#else
static inline hpd_v8_t load8_f16(const uint16_t *p)
{
    float f[8];
    for (int i = 0; i < 8; i++)
        f[i] = hpd_f16_to_f32(p[i]);
    return hpd_v8_load(f);
}
#endif

/* The 4x4 kernel's row r: x row r against the four weight vectors b0..b3,
 * and its four results. */
#define FMA_ROW4(r, xv)                                                                           \
    (a##r##0 = hpd_v8_fma(xv, b0, a##r##0), a##r##1 = hpd_v8_fma(xv, b1, a##r##1),                \
     a##r##2 = hpd_v8_fma(xv, b2, a##r##2), a##r##3 = hpd_v8_fma(xv, b3, a##r##3))
#define FINISH_ROW4(SFX, r)                                                                       \
    {                                                                                             \
        float s_[4];                                                                              \
        hpd_v8_hsum4(a##r##0, a##r##1, a##r##2, a##r##3, s_);                                     \
        for (int c_ = 0; c_ < 4; c_++)                                                            \
            finish(y + r * (size_t)ldy + c_, tail_##SFX(s_[c_], x##r, w0 + c_ * (size_t)k, i, k), \
                   accumulate);                                                                   \
    }

/* The kernels for weights of element type WT, loaded by load8_SFX/load1_SFX. */
#define GEMM_KERNELS(SFX, WT)                                                                    \
    static inline float tail_##SFX(float s, const float *x, const WT *w, uint32_t i, uint32_t k) \
    {                                                                                            \
        for (; i < k; i++)                                                                       \
            s = hpd_fma1(x[i], load1_##SFX(w + i), s);                                           \
        return s;                                                                                \
    }                                                                                            \
                                                                                                 \
    /* hpd_dot with w widened as it is read */                                                   \
    static inline float dot_##SFX(const float *x, const WT *w, uint32_t k)                      \
    {                                                                                            \
        hpd_v8_t acc = hpd_v8_zero();                                                            \
        uint32_t i = 0;                                                                          \
        for (; i + 8 <= k; i += 8)                                                               \
            acc = hpd_v8_fma(hpd_v8_load(x + i), load8_##SFX(w + i), acc);                       \
        return tail_##SFX(hpd_v8_hsum(acc), x, w, i, k);                                         \
    }                                                                                            \
                                                                                                 \
    static void kern_4x2_##SFX(const float *x, uint32_t ldx, const WT *w0, const WT *w1,        \
                               uint32_t k, float *y, uint32_t ldy, bool accumulate,              \
                               bool prefetch)                                                    \
    {                                                                                            \
        const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * (size_t)ldx;                           \
        const float *x3 = x + 3 * (size_t)ldx;                                                   \
        hpd_v8_t a00 = hpd_v8_zero(), a01 = hpd_v8_zero(), a10 = hpd_v8_zero();                  \
        hpd_v8_t a11 = hpd_v8_zero(), a20 = hpd_v8_zero(), a21 = hpd_v8_zero();                  \
        hpd_v8_t a30 = hpd_v8_zero(), a31 = hpd_v8_zero();                                       \
        uint32_t i = 0;                                                                          \
        for (; i + 8 <= k; i += 8) {                                                             \
            if (prefetch) { /* a few rows of x: w streams from memory */                         \
                HPD_PREFETCH_W(w0 + i + 4 * (size_t)k); /* two calls ahead */                        \
                HPD_PREFETCH_W(w1 + i + 4 * (size_t)k);                                              \
            }                                                                                    \
            hpd_v8_t b0 = load8_##SFX(w0 + i), b1 = load8_##SFX(w1 + i), xv;                     \
            xv = hpd_v8_load(x0 + i);                                                            \
            HPD_IN_REG(xv); /* each x vector loaded once */                                          \
            a00 = hpd_v8_fma(xv, b0, a00);                                                       \
            a01 = hpd_v8_fma(xv, b1, a01);                                                       \
            xv = hpd_v8_load(x1 + i);                                                            \
            HPD_IN_REG(xv);                                                                          \
            a10 = hpd_v8_fma(xv, b0, a10);                                                       \
            a11 = hpd_v8_fma(xv, b1, a11);                                                       \
            xv = hpd_v8_load(x2 + i);                                                            \
            HPD_IN_REG(xv);                                                                          \
            a20 = hpd_v8_fma(xv, b0, a20);                                                       \
            a21 = hpd_v8_fma(xv, b1, a21);                                                       \
            xv = hpd_v8_load(x3 + i);                                                            \
            HPD_IN_REG(xv);                                                                          \
            a30 = hpd_v8_fma(xv, b0, a30);                                                       \
            a31 = hpd_v8_fma(xv, b1, a31);                                                       \
        }                                                                                        \
        finish(y, tail_##SFX(hpd_v8_hsum(a00), x0, w0, i, k), accumulate);                       \
        finish(y + 1, tail_##SFX(hpd_v8_hsum(a01), x0, w1, i, k), accumulate);                   \
        finish(y + ldy, tail_##SFX(hpd_v8_hsum(a10), x1, w0, i, k), accumulate);                 \
        finish(y + ldy + 1, tail_##SFX(hpd_v8_hsum(a11), x1, w1, i, k), accumulate);             \
        finish(y + 2 * (size_t)ldy, tail_##SFX(hpd_v8_hsum(a20), x2, w0, i, k), accumulate);     \
        finish(y + 2 * (size_t)ldy + 1, tail_##SFX(hpd_v8_hsum(a21), x2, w1, i, k), accumulate); \
        finish(y + 3 * (size_t)ldy, tail_##SFX(hpd_v8_hsum(a30), x3, w0, i, k), accumulate);     \
        finish(y + 3 * (size_t)ldy + 1, tail_##SFX(hpd_v8_hsum(a31), x3, w1, i, k), accumulate); \
    }                                                                                            \
                                                                                                 \
    /* large batches: 4 rows of x by 4 of w, each weight vector widened once */                \
    static void kern_4x4_##SFX(const float *x, uint32_t ldx, const WT *w0, uint32_t k, float *y, \
                               uint32_t ldy, bool accumulate)                                    \
    {                                                                                            \
        const WT *w1 = w0 + k, *w2 = w0 + 2 * (size_t)k, *w3 = w0 + 3 * (size_t)k;              \
        const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * (size_t)ldx;                           \
        const float *x3 = x + 3 * (size_t)ldx;                                                   \
        hpd_v8_t a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33; \
        a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = hpd_v8_zero();                           \
        a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = hpd_v8_zero();                           \
        uint32_t i = 0;                                                                          \
        for (; i + 8 <= k; i += 8) {                                                             \
            const hpd_v8_t b0 = load8_##SFX(w0 + i), b1 = load8_##SFX(w1 + i);                   \
            const hpd_v8_t b2 = load8_##SFX(w2 + i), b3 = load8_##SFX(w3 + i);                   \
            hpd_v8_t v0 = hpd_v8_load(x0 + i), v1 = hpd_v8_load(x1 + i);                         \
            hpd_v8_t v2 = hpd_v8_load(x2 + i), v3 = hpd_v8_load(x3 + i);                         \
            HPD_IN_REG(v0);                                                                          \
            HPD_IN_REG(v1);                                                                          \
            HPD_IN_REG(v2);                                                                          \
            HPD_IN_REG(v3);                                                                          \
            FMA_ROW4(0, v0);                                                                     \
            FMA_ROW4(1, v1);                                                                     \
            FMA_ROW4(2, v2);                                                                     \
            FMA_ROW4(3, v3);                                                                     \
        }                                                                                        \
        FINISH_ROW4(SFX, 0)                                                                      \
        FINISH_ROW4(SFX, 1)                                                                      \
        FINISH_ROW4(SFX, 2)                                                                      \
        FINISH_ROW4(SFX, 3)                                                                      \
    }                                                                                            \
                                                                                                 \
    /* the four sums of x against weight rows w, w + ldw, .. (k long):   \
     * hpd_dot's sequence for each */                                                            \
    static inline __attribute__((always_inline)) void sums_1x4_##SFX(                           \
        const float *x, const WT *w, uint32_t ldw, uint32_t k,                                  \
                                      float s[4])                                                \
    {                                                                                            \
        const WT *w0 = w, *w1 = w + ldw, *w2 = w + 2 * (size_t)ldw, *w3 = w + 3 * (size_t)ldw;   \
        hpd_v8_t a0 = hpd_v8_zero(), a1 = hpd_v8_zero(), a2 = hpd_v8_zero();                     \
        hpd_v8_t a3 = hpd_v8_zero();                                                             \
        uint32_t i = 0;                                                                          \
        for (; i + 8 <= k; i += 8) {                                                             \
            hpd_v8_t xv = hpd_v8_load(x + i);                                                    \
            /* the rows of the next call (short rows wait on memory otherwise) */               \
            HPD_PREFETCH_W(w0 + i + 4 * (size_t)ldw);                                            \
            HPD_PREFETCH_W(w1 + i + 4 * (size_t)ldw);                                            \
            HPD_PREFETCH_W(w2 + i + 4 * (size_t)ldw);                                            \
            HPD_PREFETCH_W(w3 + i + 4 * (size_t)ldw);                                            \
            a0 = hpd_v8_fma(xv, load8_##SFX(w0 + i), a0);                                        \
            a1 = hpd_v8_fma(xv, load8_##SFX(w1 + i), a1);                                        \
            a2 = hpd_v8_fma(xv, load8_##SFX(w2 + i), a2);                                        \
            a3 = hpd_v8_fma(xv, load8_##SFX(w3 + i), a3);                                        \
        }                                                                                        \
        hpd_v8_hsum4(a0, a1, a2, a3, s); /* hpd_v8_hsum of each, at once */                      \
        s[0] = tail_##SFX(s[0], x, w0, i, k);                                                    \
        s[1] = tail_##SFX(s[1], x, w1, i, k);                                                    \
        s[2] = tail_##SFX(s[2], x, w2, i, k);                                                    \
        s[3] = tail_##SFX(s[3], x, w3, i, k);                                                    \
    }                                                                                            \
                                                                                                 \
    static void kern_1x4_##SFX(const float *x, const WT *w, uint32_t ldw, uint32_t k, float *y,  \
                               bool accumulate)                                                  \
    {                                                                                            \
        float s_[4];                                                                             \
        sums_1x4_##SFX(x, w, ldw, k, s_);                                                        \
        for (int c = 0; c < 4; c++)                                                              \
            finish(y + c, s_[c], accumulate);                                                    \
    }                                                                                            \
                                                                                                 \
    /* One tile: weight rows [n0, n1) against every row of x. */                                 \
    static void gemm_tile_##SFX(const hpd_gemm_args_t *a, uint32_t n0, uint32_t n1)             \
    {                                                                                            \
        const uint32_t k = a->k;                                                                 \
        const WT *w = (const WT *)a->w;                                                          \
        uint32_t m = 0;                                                                          \
        for (; m + 4 <= a->m; m += 4) {                                                          \
            const float *x = a->x + (size_t)m * a->ldx;                                          \
            float *y = a->y + (size_t)m * a->ldy;                                                \
            uint32_t n = n0;                                                                     \
            if (GEMM_4X4 && a->m > 16) /* else 4x2, which prefetches w */                                    \
                for (; n + 4 <= n1; n += 4)                                                      \
                    kern_4x4_##SFX(x, a->ldx, w + (size_t)n * k, k, y + n, a->ldy,               \
                                   a->accumulate);                                               \
            for (; n + 2 <= n1; n += 2)                                                          \
                kern_4x2_##SFX(x, a->ldx, w + (size_t)n * k, w + (size_t)(n + 1) * k, k, y + n,  \
                               a->ldy, a->accumulate, a->m <= 16);                               \
            for (; n < n1; n++)                                                                  \
                for (uint32_t r = 0; r < 4; r++)                                                 \
                    finish(y + (size_t)r * a->ldy + n,                                           \
                           dot_##SFX(x + (size_t)r * a->ldx, w + (size_t)n * k, k),              \
                           a->accumulate);                                                       \
        }                                                                                        \
        for (; m < a->m; m++) {                                                                  \
            const float *x = a->x + (size_t)m * a->ldx;                                          \
            float *y = a->y + (size_t)m * a->ldy;                                                \
            uint32_t n = n0;                                                                     \
            for (; n + 4 <= n1; n += 4)                                                          \
                kern_1x4_##SFX(x, w + (size_t)n * k, k, k, y + n, a->accumulate);                \
            for (; n < n1; n++)                                                                  \
                finish(y + n, dot_##SFX(x, w + (size_t)n * k, k), a->accumulate);                \
        }                                                                                        \
    }

GEMM_KERNELS(f32, float)
GEMM_KERNELS(bf16, uint16_t)
GEMM_KERNELS(f16, uint16_t)

/* A row-parallel product's groups for a few rows of x (decode), in one
 * kernel: four weight rows of every group in turn, each group's four sums
 * as kern_1x4 makes them (8 lanes over the group's columns, the fixed
 * horizontal sum, the tail), kept in registers and stack, then added by
 * the tree and finished into y: no buffer, no second pass. rows[j] is
 * group j's first of the four weight rows, x[j] its columns of x. */
#define GEMM_SUM_KERNELS(SFX, WT)                                                                \
    static void kern_1x4_sum_##SFX(const float *const *x, const WT *const *rows,                 \
                                   const uint32_t *ks, uint32_t G, float *y, bool accumulate)    \
    {                                                                                            \
        float part[4][HPD_TP_GROUPS];                                                            \
        for (uint32_t j = 0; j < G; j++) { /* each group's four sums, kern_1x4's */              \
            float s_[4];                                                                         \
            sums_1x4_##SFX(x[j], rows[j], ks[j], ks[j], s_);                                     \
            for (int c = 0; c < 4; c++)                                                          \
                part[c][j] = s_[c];                                                              \
        }                                                                                        \
        for (int c = 0; c < 4; c++)                                                              \
            finish(y + c, hpd_tp_tree(part[c], G), accumulate);                                  \
    }                                                                                            \
                                                                                                 \
    /* weight rows [n0, n1) of every group against the few rows of x */                          \
    static void sum_rows_##SFX(const hpd_gemm_sum_args_t *a, uint32_t n0, uint32_t n1)           \
    {                                                                                            \
        const uint32_t G = a->n_groups;                                                          \
        uint32_t ks[HPD_TP_GROUPS];                                                              \
        for (uint32_t j = 0; j < G; j++)                                                         \
            ks[j] = a->g[j].k;                                                                   \
        for (uint32_t r = 0; r < a->m; r++) {                                                    \
            const float *x[HPD_TP_GROUPS];                                                       \
            const WT *rows[HPD_TP_GROUPS];                                                       \
            float *y = a->y + (size_t)r * a->ldy;                                                \
            for (uint32_t j = 0; j < G; j++)                                                     \
                x[j] = a->g[j].x + (size_t)r * a->g[j].ldx;                                      \
            uint32_t n = n0;                                                                     \
            for (; n + 4 <= n1; n += 4) {                                                        \
                for (uint32_t j = 0; j < G; j++)                                                 \
                    rows[j] = (const WT *)a->g[j].w + (size_t)n * ks[j];                          \
                kern_1x4_sum_##SFX(x, rows, ks, G, y + n, a->accumulate);                        \
            }                                                                                    \
            for (; n < n1; n++) {                                                                \
                float part[HPD_TP_GROUPS];                                                       \
                for (uint32_t j = 0; j < G; j++)                                                 \
                    part[j] = dot_##SFX(x[j], (const WT *)a->g[j].w + (size_t)n * ks[j], ks[j]); \
                finish(y + n, hpd_tp_tree(part, G), a->accumulate);                              \
            }                                                                                    \
        }                                                                                        \
    }

GEMM_SUM_KERNELS(f32, float)
GEMM_SUM_KERNELS(bf16, uint16_t)
GEMM_SUM_KERNELS(f16, uint16_t)

/* FP8 weights: each thread dequantises a tile of NB weight rows into its own
 * fp32 buffer (q * scale, one rounding, as transformers' dequantisation),
 * which the F32 kernels then read; x streams past the tile as for the other
 * dtypes, so every row of w is dequantised once per call and the model
 * holds no fp32 copy. */
static void gemm_tile_f8(const hpd_gemm_args_t *a, uint32_t n0, uint32_t n1, float *buf)
{
    const uint8_t *q = (const uint8_t *)a->w;
    for (uint32_t n = n0; n < n1; n++) {
        const float *scale = a->w_scale + (size_t)n * a->w_scale_ld;
        float *dst = buf + (size_t)(n - n0) * a->k;
        for (uint32_t c = 0; c < a->k; c++)
            dst[c] = hpd_f8e4m3_to_f32(q[(size_t)n * a->k + c]) * scale[c / a->w_block];
    }
    hpd_gemm_args_t t = *a;
    t.w = buf;
    t.w_dtype = HPD_DTYPE_F32;
    t.y = a->y + n0;
    gemm_tile_f32(&t, 0, n1 - n0);
}

hpd_status_t hpd_cpu_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    const uint32_t n_tiles = (a->n + NB - 1) / NB;
    /* threads pay only when there is enough work to split */
    const int threads = (uint64_t)a->m * a->n * a->k >= (1u << 16) ? hpd_cpu_threads(b) : 1;
    void (*tile)(const hpd_gemm_args_t *, uint32_t, uint32_t);

    switch (a->w_dtype) {
    case HPD_DTYPE_F32: tile = gemm_tile_f32; break;
    case HPD_DTYPE_BF16: tile = gemm_tile_bf16; break;
    case HPD_DTYPE_F16: tile = gemm_tile_f16; break;
    case HPD_DTYPE_F8_E4M3: {
        hpd_cpu_ctx_t *c = b->ctx;
        const size_t need = (size_t)threads * NB * a->k;
        if (a->w_scale == NULL || a->w_block == 0)
            return HPD_ERR_INVALID_ARG;
        if (c->f8_floats < need) {
            float *p = realloc(c->f8_tiles, need * sizeof(float));
            if (p == NULL)
                return HPD_ERR_NO_MEMORY;
            c->f8_tiles = p;
            c->f8_floats = need;
        }
#pragma omp parallel for schedule(static) num_threads(threads)
        for (uint32_t t = 0; t < n_tiles; t++) {
            uint32_t n0 = t * NB, n1 = n0 + NB < a->n ? n0 + NB : a->n;
            gemm_tile_f8(a, n0, n1, c->f8_tiles + (size_t)omp_get_thread_num() * NB * a->k);
        }
        return HPD_OK;
    }
    default: return HPD_ERR_UNSUPPORTED;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < n_tiles; t++) {
        uint32_t n0 = t * NB, n1 = n0 + NB < a->n ? n0 + NB : a->n;
        tile(a, n0, n1);
    }
    return HPD_OK;
}

/* The tile function of a weight dtype (FP8: gemm_tile_f8, apart). */
static void (*tile_fn(hpd_dtype_t dtype))(const hpd_gemm_args_t *, uint32_t, uint32_t)
{
    switch (dtype) {
    case HPD_DTYPE_F32: return gemm_tile_f32;
    case HPD_DTYPE_BF16: return gemm_tile_bf16;
    case HPD_DTYPE_F16: return gemm_tile_f16;
    default: return NULL;
    }
}

/* A row-parallel product's groups in one pass (backend.h gemm_sum): each
 * thread takes a run of weight rows, and for each group in turn streams
 * that group's rows of the run (a contiguous block of the group's matrix,
 * as a GEMM of the group alone would) into its buffer with the tile
 * functions gemm uses (so each product has gemm's bits); then it adds the
 * groups by the tree into y. One parallel region where the groups one by
 * one took 8 GEMMs and 3 tp_sum passes. */
static hpd_status_t gemm_sum_dense(hpd_backend_t *b, const hpd_gemm_sum_args_t *a);

hpd_status_t hpd_cpu_gemm_sum_experts(hpd_backend_t *b, const hpd_gemm_sum_args_t *a,
                                      hpd_status_t (*dense)(hpd_backend_t *,
                                                            const hpd_gemm_sum_args_t *))
{
    hpd_status_t st = HPD_OK;
    if (a->first[a->n_experts] > a->m)
        return HPD_ERR_INVALID_ARG;
    for (uint32_t x = 0; x < a->n_experts && st == HPD_OK; x++) {
        const uint32_t r0 = a->first[x], r1 = a->first[x + 1];
        if (r1 <= r0)
            continue;
        if (r1 > a->m)
            return HPD_ERR_INVALID_ARG;
        hpd_gemm_sum_args_t e = *a;
        e.first = NULL;
        e.m = r1 - r0;
        e.y = a->y + (size_t)r0 * a->ldy;
        for (uint32_t j = 0; j < a->n_groups; j++) {
            const hpd_gemm_args_t *g = &a->g[j];
            const size_t mat = (size_t)a->n * g->k;
            e.g[j].x = g->x + (size_t)r0 * g->ldx;
            e.g[j].w = (const char *)g->w + x * mat * hpd_dtype_size(g->w_dtype);
            if (g->w_scale != NULL)
                e.g[j].w_scale = g->w_scale + (size_t)x * a->n * g->w_scale_ld;
        }
        st = dense(b, &e);
    }
    return st;
}

hpd_status_t hpd_cpu_gemm_sum(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    return a->first != NULL ? hpd_cpu_gemm_sum_experts(b, a, gemm_sum_dense)
                            : gemm_sum_dense(b, a);
}

static hpd_status_t gemm_sum_dense(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    hpd_cpu_ctx_t *c = b->ctx;
    const uint32_t G = a->n_groups;
    uint64_t work = 0;
    uint32_t max_k = 0;

    if (G < 1 || G > HPD_TP_GROUPS || (G & (G - 1)) != 0) {
        HPD_LOG_ERROR("cpu", "gemm_sum of %u groups (expected 1, 2, 4 or 8)", G);
        return HPD_ERR_INVALID_ARG;
    }
    for (uint32_t j = 0; j < G; j++) {
        const hpd_dtype_t dt = a->g[j].w_dtype;
        if (dt != HPD_DTYPE_F8_E4M3 ? tile_fn(dt) == NULL
                                    : a->g[j].w_scale == NULL || a->g[j].w_block == 0)
            return HPD_ERR_UNSUPPORTED;
        work += (uint64_t)a->m * a->n * a->g[j].k;
        if (dt == HPD_DTYPE_F8_E4M3 && a->g[j].k > max_k)
            max_k = a->g[j].k;
    }
    const int threads = work >= (1u << 16) ? hpd_cpu_threads(b) : 1;
    /* a few rows of x (decode), every group of one dtype, not FP8: the
     * groups' sums in registers, straight into y */
    void (*rows_fn)(const hpd_gemm_sum_args_t *, uint32_t, uint32_t) = NULL;
    bool one_dtype = true;
    for (uint32_t j = 1; j < G; j++)
        one_dtype &= a->g[j].w_dtype == a->g[0].w_dtype;
    if (a->m < 4 && one_dtype)
        rows_fn = a->g[0].w_dtype == HPD_DTYPE_F32    ? sum_rows_f32
                  : a->g[0].w_dtype == HPD_DTYPE_BF16 ? sum_rows_bf16
                  : a->g[0].w_dtype == HPD_DTYPE_F16  ? sum_rows_f16
                                                      : NULL;
    if (rows_fn != NULL) {
        const uint32_t n_tiles = (a->n + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (uint32_t t = 0; t < n_tiles; t++)
            rows_fn(a, t * NB, HPD_MIN(t * NB + NB, a->n));
        return HPD_OK;
    }
    /* room for the runs of any team up to `threads` (OpenMP may give fewer) */
    const size_t need = (size_t)G * a->m * (a->n + 4 * (size_t)threads);
    if (c->sum_floats < need) {
        float *p = realloc(c->sum_tiles, need * sizeof(float));
        if (p == NULL)
            return HPD_ERR_NO_MEMORY;
        c->sum_tiles = p;
        c->sum_floats = need;
    }
    if (max_k > 0 && c->f8_floats < (size_t)threads * NB * max_k) {
        float *p = realloc(c->f8_tiles, (size_t)threads * NB * max_k * sizeof(float));
        if (p == NULL)
            return HPD_ERR_NO_MEMORY;
        c->f8_tiles = p;
        c->f8_floats = (size_t)threads * NB * max_k;
    }
#pragma omp parallel num_threads(threads)
    {
        /* each thread's run of weight rows, a multiple of 4 (the kernels'
         * step), from the team it got */
        const uint32_t team = (uint32_t)omp_get_num_threads();
        const uint32_t run = (a->n + 4 * team - 1) / (4 * team) * 4;
        const size_t part = (size_t)a->m * run;
        const int tid = omp_get_thread_num();
        const uint32_t n0 = HPD_MIN((uint32_t)tid * run, a->n);
        const uint32_t n1 = HPD_MIN(n0 + run, a->n);
        float *P = c->sum_tiles + (size_t)tid * G * part;
        for (uint32_t j = 0; j < G && n0 < n1; j++) {
            hpd_gemm_args_t g = a->g[j];
            g.m = a->m;
            g.n = a->n;
            g.y = P + j * part - n0; /* the run's columns at 0 .. run */
            g.ldy = run;
            g.accumulate = false;
            /* tiles of NB rows, as gemm takes them: a tile of w stays in L1
             * while x streams (FP8: dequantised a tile at a time) */
            for (uint32_t t0 = n0; t0 < n1; t0 += NB) {
                if (g.w_dtype == HPD_DTYPE_F8_E4M3)
                    gemm_tile_f8(&g, t0, HPD_MIN(t0 + NB, n1),
                                 c->f8_tiles + (size_t)tid * NB * max_k);
                else
                    tile_fn(g.w_dtype)(&g, t0, HPD_MIN(t0 + NB, n1));
            }
        }
        /* hpd_tp_tree level by level, in place over whole rows (the same
         * pairs, so the same roundings; loops the compiler vectorises) */
        const uint32_t w = n1 > n0 ? n1 - n0 : 0;
        for (uint32_t r = 0; r < a->m; r++) {
            for (uint32_t step = 1; step < G; step *= 2)
                for (uint32_t j = 0; j + step < G; j += 2 * step) {
                    float *restrict dst = P + j * part + (size_t)r * run;
                    const float *restrict src = P + (j + step) * part + (size_t)r * run;
                    for (uint32_t i = 0; i < w; i++)
                        dst[i] = dst[i] + src[i];
                }
            float *restrict y = a->y + (size_t)r * a->ldy + n0;
            const float *restrict s = P + (size_t)r * run;
            if (a->accumulate)
                for (uint32_t i = 0; i < w; i++)
                    y[i] = y[i] + s[i];
            else
                for (uint32_t i = 0; i < w; i++)
                    y[i] = s[i];
        }
    }
    return HPD_OK;
}
