/* GEMM y = x w^T with bf16 products (device "cpu-bf16"): BF16 weights
 * multiply x rounded to bf16, two products per lane per instruction
 * (VDPBF16PS), accumulated in fp32. This is llama.cpp's arithmetic for BF16
 * weights; it gives up the bits of the fp32 product (and agreement with
 * transformers run in fp32) for about twice the products per cycle.
 *
 * The determinism contract holds within the mode: every y[m][n] is one
 * fixed sequence (hpd_cpu_bf16_dot_ref below) whatever the kernel shape,
 * the batch or the thread count:
 *   - x[m][i] is rounded to bf16 to nearest even; a zero or denormal input
 *     gives a signed zero, and so does one that would round up to FLT_MIN
 *     (round_bf16: as llama.cpp's conversion);
 *   - 8 lanes; lane j adds, in each step of 16 elements starting at s, the
 *     product of elements s+2j+1 then that of s+2j, each as a fused
 *     multiply-add (one rounding to nearest even), a sum below FLT_MIN
 *     flushed to zero and a denormal weight read as zero (VDPBF16PS's order
 *     and its DAZ/FTZ, as measured on this EPYC: test_gemm);
 *   - the fixed horizontal sum (hpd_v8_hsum), then the k % 16 tail element
 *     by element with fused multiply-adds.
 * Where the CPU lacks AVX512_BF16 the same sequence is computed lane by lane
 * (slowly); test_gemm checks the instruction against the scalar sequence
 * bit for bit, since the instruction's rounding order is the one thing here
 * the code cannot choose. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/tp_sum.h"

#define NB 32 /* weight rows per tile, as gemm.c */

/* ---- the scalar sequence */

static inline float ftz(float f)
{
    return fabsf(f) < FLT_MIN ? copysignf(0.0f, f) : f;
}

static inline uint16_t round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: kept, made quiet */
        return (uint16_t)((u >> 16) | 0x40);
    if ((u & 0x7f800000u) == 0) /* zero or denormal: signed zero */
        return (uint16_t)((u >> 16) & 0x8000);
    u += 0x7fffu + ((u >> 16) & 1u); /* to nearest even (may carry to inf) */
    return (uint16_t)(u >> 16);
}

static inline float daz_bf16(uint16_t h)
{
    return (h & 0x7f80) == 0 ? hpd_bf16_to_f32(h & 0x8000) : hpd_bf16_to_f32(h);
}

/* one lane's step: acc + x1 w1, then + x0 w0, each a fused multiply-add
 * (one rounding: a product below FLT_MIN is not rounded on its own, which
 * the instruction does not do either; test_gemm's probe of such products
 * found 3273 of 20000 differing from a product-then-sum) */
static inline float lane_step(float acc, uint16_t x0, uint16_t x1, uint16_t w0, uint16_t w1)
{
    acc = ftz(__builtin_fmaf(daz_bf16(x1), daz_bf16(w1), acc));
    return ftz(__builtin_fmaf(daz_bf16(x0), daz_bf16(w0), acc));
}

/* the tail: fused multiply-adds in order (__builtin_fmaf in every build,
 * a library call where the target has no FMA) */
static inline float tail_bp(float s, const uint16_t *x, const uint16_t *w, uint32_t i, uint32_t k)
{
    for (; i < k; i++)
        s = __builtin_fmaf(hpd_bf16_to_f32(x[i]), hpd_bf16_to_f32(w[i]), s);
    return s;
}

float hpd_cpu_bf16_dot_ref(const uint16_t *x, const uint16_t *w, uint32_t k)
{
    float lane[8] = {0};
    uint32_t i = 0;
    for (; i + 16 <= k; i += 16)
        for (int j = 0; j < 8; j++)
            lane[j] = lane_step(lane[j], x[i + 2 * j], x[i + 2 * j + 1], w[i + 2 * j],
                                w[i + 2 * j + 1]);
    return tail_bp(hpd_v8_hsum(hpd_v8_load(lane)), x, w, i, k);
}

uint16_t hpd_cpu_round_bf16(float f)
{
    return round_bf16(f);
}

/* a row of x rounded: 8 at a time with the same integer steps as
 * round_bf16 (so the bits are the same), the tail one by one */
static void round_row(uint16_t *dst, const float *src, uint32_t k)
{
    uint32_t i = 0;
#if defined(__AVX2__)
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= k; i += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
        const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(u, inf), _mm256_setzero_si256());
        __m256i r = _mm256_add_epi32(
            u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                _mm256_and_si256(hi, _mm256_set1_epi32(1))));
        r = _mm256_srli_epi32(r, 16);
        r = _mm256_blendv_epi8(r, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), tiny);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
    }
#endif
    for (; i < k; i++)
        dst[i] = round_bf16(src[i]);
}

/* ---- 16 bf16 pairs into 8 fp32 lanes */

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
typedef __m256bh bh16_t;
static inline bh16_t load_bh16(const uint16_t *p)
{
    return (bh16_t)_mm256_loadu_si256((const __m256i *)p);
}
static inline hpd_v8_t dp16(hpd_v8_t acc, bh16_t x, bh16_t w)
{
    return _mm256_dpbf16_ps(acc, x, w);
}
#define IN_REG(v) HPD_IN_REG(v)
#else
typedef struct {
    uint16_t h[16];
} bh16_t;
static inline bh16_t load_bh16(const uint16_t *p)
{
    bh16_t v;
    memcpy(v.h, p, sizeof(v.h));
    return v;
}
static inline hpd_v8_t dp16(hpd_v8_t acc, bh16_t x, bh16_t w)
{
    float l[8];
    hpd_v8_store(l, acc);
    for (int j = 0; j < 8; j++)
        l[j] = lane_step(l[j], x.h[2 * j], x.h[2 * j + 1], w.h[2 * j], w.h[2 * j + 1]);
    return hpd_v8_load(l);
}
#define IN_REG(v) (void)0 /* a struct, not a register */
#endif

bool hpd_cpu_bf16_native(void)
{
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    return true;
#else
    return false;
#endif
}

/* ---- kernels: the shapes of gemm.c over bf16 x (ldx elements per row) */

static inline float dot_bp(const uint16_t *x, const uint16_t *w, uint32_t k)
{
    hpd_v8_t acc = hpd_v8_zero();
    uint32_t i = 0;
    for (; i + 16 <= k; i += 16)
        acc = dp16(acc, load_bh16(x + i), load_bh16(w + i));
    return tail_bp(hpd_v8_hsum(acc), x, w, i, k);
}

static inline void finish(float *y, float s, bool accumulate)
{
    *y = accumulate ? *y + s : s;
}

#define DP_ROW4(r, xv)                                                                            \
    (a##r##0 = dp16(a##r##0, xv, b0), a##r##1 = dp16(a##r##1, xv, b1),                           \
     a##r##2 = dp16(a##r##2, xv, b2), a##r##3 = dp16(a##r##3, xv, b3))
#define FINISH_ROW4(r)                                                                            \
    for (int c_ = 0; c_ < 4; c_++) {                                                              \
        const hpd_v8_t acc_[4] = {a##r##0, a##r##1, a##r##2, a##r##3};                            \
        finish(y + r * (size_t)ldy + c_,                                                          \
               tail_bp(hpd_v8_hsum(acc_[c_]), x##r, w0 + c_ * (size_t)k, i, k), accumulate);      \
    }

/* 4 rows of x by 4 rows of w; a small batch (prefetch) streams w from
 * memory: the rows of the next call are prefetched */
static void kern_4x4(const uint16_t *x, uint32_t ldx, const uint16_t *w0, uint32_t k, float *y,
                     uint32_t ldy, bool accumulate, bool prefetch)
{
    const uint16_t *w1 = w0 + k, *w2 = w0 + 2 * (size_t)k, *w3 = w0 + 3 * (size_t)k;
    const uint16_t *x0 = x, *x1 = x + ldx, *x2 = x + 2 * (size_t)ldx, *x3 = x + 3 * (size_t)ldx;
    hpd_v8_t a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33;
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = hpd_v8_zero();
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = hpd_v8_zero();
    uint32_t i = 0;
    for (; i + 16 <= k; i += 16) {
        if (prefetch) {
            HPD_PREFETCH_W(w0 + i + 4 * (size_t)k);
            HPD_PREFETCH_W(w1 + i + 4 * (size_t)k);
            HPD_PREFETCH_W(w2 + i + 4 * (size_t)k);
            HPD_PREFETCH_W(w3 + i + 4 * (size_t)k);
        }
        const bh16_t b0 = load_bh16(w0 + i), b1 = load_bh16(w1 + i);
        const bh16_t b2 = load_bh16(w2 + i), b3 = load_bh16(w3 + i);
        bh16_t v0 = load_bh16(x0 + i), v1 = load_bh16(x1 + i);
        bh16_t v2 = load_bh16(x2 + i), v3 = load_bh16(x3 + i);
        IN_REG(v0);
        IN_REG(v1);
        IN_REG(v2);
        IN_REG(v3);
        DP_ROW4(0, v0);
        DP_ROW4(1, v1);
        DP_ROW4(2, v2);
        DP_ROW4(3, v3);
    }
    FINISH_ROW4(0)
    FINISH_ROW4(1)
    FINISH_ROW4(2)
    FINISH_ROW4(3)
}

/* 1 row of x by 4 rows of w (decode), prefetching the rows of the next
 * call: the four sums (kern_1x4 and gemm_sum's decode kernel share them) */
static inline __attribute__((always_inline)) void sums_1x4(const uint16_t *x,
                                                          const uint16_t *w0, uint32_t k,
                                                          float s[4])
{
    const uint16_t *w1 = w0 + k, *w2 = w0 + 2 * (size_t)k, *w3 = w0 + 3 * (size_t)k;
    hpd_v8_t a0 = hpd_v8_zero(), a1 = hpd_v8_zero(), a2 = hpd_v8_zero(), a3 = hpd_v8_zero();
    uint32_t i = 0;
    for (; i + 16 <= k; i += 16) {
        bh16_t xv = load_bh16(x + i);
        IN_REG(xv);
        /* at i and i + 8 for each 32-byte step: 4 prefetches a line, as the
         * fp32 kernel issues (4 % more than one per step in the GEMV alone) */
        HPD_PREFETCH_W(w0 + i + 4 * (size_t)k);
        HPD_PREFETCH_W(w1 + i + 4 * (size_t)k);
        HPD_PREFETCH_W(w2 + i + 4 * (size_t)k);
        HPD_PREFETCH_W(w3 + i + 4 * (size_t)k);
        HPD_PREFETCH_W(w0 + i + 8 + 4 * (size_t)k);
        HPD_PREFETCH_W(w1 + i + 8 + 4 * (size_t)k);
        HPD_PREFETCH_W(w2 + i + 8 + 4 * (size_t)k);
        HPD_PREFETCH_W(w3 + i + 8 + 4 * (size_t)k);
        a0 = dp16(a0, xv, load_bh16(w0 + i));
        a1 = dp16(a1, xv, load_bh16(w1 + i));
        a2 = dp16(a2, xv, load_bh16(w2 + i));
        a3 = dp16(a3, xv, load_bh16(w3 + i));
    }
    s[0] = tail_bp(hpd_v8_hsum(a0), x, w0, i, k);
    s[1] = tail_bp(hpd_v8_hsum(a1), x, w1, i, k);
    s[2] = tail_bp(hpd_v8_hsum(a2), x, w2, i, k);
    s[3] = tail_bp(hpd_v8_hsum(a3), x, w3, i, k);
}

static void kern_1x4(const uint16_t *x, const uint16_t *w0, uint32_t k, float *y,
                     bool accumulate)
{
    float s[4];
    sums_1x4(x, w0, k, s);
    for (int c = 0; c < 4; c++)
        finish(y + c, s[c], accumulate);
}

/* ---- many rows (prefill): two rows of x per 16-lane register
 *
 * A 512-bit VDPBF16PS computes 16 lanes; lanes 0-7 and 8-15 each compute
 * the 8-lane step above. With x rows m and m+1 side by side in one register
 * (a block of 16 elements of each: "pairs") and the same 16 weights in both
 * halves, lanes 0-7 carry y[m][n]'s sequence and lanes 8-15 y[m+1][n]'s, the
 * same bits as two 256-bit steps at twice the products per instruction. A
 * block of PX pairs (6 rows) by QW weight rows keeps 24 accumulators in
 * registers and loads 3 pairs and 8 weight blocks per 24 instructions. */
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#define PAIRS_NATIVE 1
#define PX 3 /* pairs of x rows per block */
#define QW 8 /* weight rows per block */

/* the pairs of the rows of x: pair p, block b at xp + (p * nb + b) * 32,
 * row 2p's 16 elements then row 2p+1's (zeros past the last row) */
static void pack_pairs(uint16_t *xp, const uint16_t *x, uint32_t m, uint32_t k, uint32_t p0,
                       uint32_t p1)
{
    const uint32_t nb = k / 16;
    for (uint32_t p = p0; p < p1; p++) {
        const uint16_t *r0 = x + (size_t)2 * p * k, *r1 = r0 + k;
        uint16_t *d = xp + (size_t)p * nb * 32;
        for (uint32_t b = 0; b < nb; b++, d += 32) {
            memcpy(d, r0 + 16 * b, 32);
            if (2 * p + 1 < m)
                memcpy(d + 16, r1 + 16 * b, 32);
            else
                memset(d + 16, 0, 32);
        }
    }
}

/* P pairs (2P rows from row 2 p of x) by Q weight rows; rows past m are
 * not written */
static inline __attribute__((always_inline)) void
kern_pairs(const uint16_t *xp, const uint16_t *x, uint32_t m, uint32_t p, int P,
           const uint16_t *w, int Q, uint32_t k, float *y, uint32_t ldy, bool accumulate)
{
    const uint32_t nb = k / 16;
    const uint16_t *xb = xp + (size_t)p * nb * 32;
    __m512 acc[PX][QW];
#pragma GCC unroll 8
    for (int a = 0; a < P; a++)
#pragma GCC unroll 8
        for (int q = 0; q < Q; q++)
            acc[a][q] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m512bh xv[PX];
#pragma GCC unroll 8
        for (int a = 0; a < P; a++)
            xv[a] = (__m512bh)_mm512_loadu_si512(xb + ((size_t)a * nb + b) * 32);
#pragma GCC unroll 8
        for (int q = 0; q < Q; q++) {
            const __m512bh wv = (__m512bh)_mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(w + (size_t)q * k + 16 * b)));
#pragma GCC unroll 8
            for (int a = 0; a < P; a++)
                acc[a][q] = _mm512_dpbf16_ps(acc[a][q], xv[a], wv);
        }
    }
    const uint32_t i = nb * 16;
#pragma GCC unroll 8
    for (int a = 0; a < P; a++)
#pragma GCC unroll 8
        for (int q = 0; q < Q; q++) {
            const uint32_t r = 2 * (p + a);
            const uint16_t *wq = w + (size_t)q * k;
            finish(y + (size_t)r * ldy + q,
                   tail_bp(hpd_v8_hsum(_mm512_castps512_ps256(acc[a][q])), x + (size_t)r * k,
                           wq, i, k),
                   accumulate);
            if (r + 1 < m)
                finish(y + (size_t)(r + 1) * ldy + q,
                       tail_bp(hpd_v8_hsum(_mm512_extractf32x8_ps(acc[a][q], 1)),
                               x + (size_t)(r + 1) * k, wq, i, k),
                       accumulate);
        }
}

#define KERN_PAIRS(P, Q)                                                                          \
    static void kern_p##P##q##Q(const uint16_t *xp, const uint16_t *x, uint32_t m, uint32_t p,    \
                                const uint16_t *w, uint32_t k, float *y, uint32_t ldy,           \
                                bool accumulate)                                                  \
    {                                                                                             \
        kern_pairs(xp, x, m, p, P, w, Q, k, y, ldy, accumulate);                                  \
    }
KERN_PAIRS(3, 8)
KERN_PAIRS(2, 8)
KERN_PAIRS(1, 8)
KERN_PAIRS(3, 1)
KERN_PAIRS(2, 1)
KERN_PAIRS(1, 1)

typedef void (*pairs_fn)(const uint16_t *xp, const uint16_t *x, uint32_t m, uint32_t p,
                         const uint16_t *w, uint32_t k, float *y, uint32_t ldy, bool accumulate);
static const pairs_fn by_q8[3] = {kern_p1q8, kern_p2q8, kern_p3q8};
static const pairs_fn by_q1[3] = {kern_p1q1, kern_p2q1, kern_p3q1};

/* weight rows [n0, n1) against every row of x, in pairs: blocks of 8
 * weight rows, then one at a time; in each, blocks of 3 pairs, then the 2
 * or 1 left */
static void tile_pairs(const uint16_t *xp, const uint16_t *x, uint32_t m, const uint16_t *w,
                       uint32_t k, float *y, uint32_t ldy, bool accumulate, uint32_t n0,
                       uint32_t n1)
{
    const uint32_t np = (m + 1) / 2;
    for (uint32_t n = n0; n < n1;) {
        const pairs_fn *kern = n + QW <= n1 ? by_q8 : by_q1;
        const uint16_t *wn = w + (size_t)n * k;
        uint32_t p = 0;
        for (; p + 3 <= np; p += 3)
            kern[2](xp, x, m, p, wn, k, y + n, ldy, accumulate);
        if (np > p)
            kern[np - p - 1](xp, x, m, p, wn, k, y + n, ldy, accumulate);
        n += kern == by_q8 ? QW : 1;
    }
}
#else
#define PAIRS_NATIVE 0
#endif

typedef struct {
    const uint16_t *x; /* [m][k], rounded */
    const uint16_t *w;
    float *y;
    uint32_t ldy, m, k;
    bool accumulate;
} job_t;

/* weight rows [n0, n1) against every row of x: 4x4 blocks, then the rows
 * of x left one by one (1x4) */
static void tile(const job_t *j, uint32_t n0, uint32_t n1)
{
    const uint32_t k = j->k;
    uint32_t m = 0;
    for (; m + 4 <= j->m; m += 4) {
        const uint16_t *x = j->x + (size_t)m * k;
        float *y = j->y + (size_t)m * j->ldy;
        uint32_t n = n0;
        for (; n + 4 <= n1; n += 4)
            kern_4x4(x, k, j->w + (size_t)n * k, k, y + n, j->ldy, j->accumulate,
                     j->m <= 16);
        for (; n < n1; n++)
            for (uint32_t r = 0; r < 4; r++)
                finish(y + (size_t)r * j->ldy + n,
                       dot_bp(x + (size_t)r * k, j->w + (size_t)n * k, k), j->accumulate);
    }
    for (; m < j->m; m++) {
        const uint16_t *x = j->x + (size_t)m * k;
        float *y = j->y + (size_t)m * j->ldy;
        uint32_t n = n0;
        for (; n + 4 <= n1; n += 4)
            kern_1x4(x, j->w + (size_t)n * k, k, y + n, j->accumulate);
        for (; n < n1; n++)
            finish(y + n, dot_bp(x, j->w + (size_t)n * k, k), j->accumulate);
    }
}

hpd_status_t hpd_cpu_gemm_bf16_products(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    hpd_cpu_ctx_t *c = b->ctx;
    const uint32_t n_tiles = (a->n + NB - 1) / NB;
    const int threads = (uint64_t)a->m * a->n * a->k >= (1u << 16) ? hpd_cpu_threads(b) : 1;
    /* a few rows (decode): every thread rounds all of x into its own copy
     * and goes on without waiting for the others; many rows (prefill): the
     * threads round a share each, then wait for the whole */
    const bool private_x = a->m <= 16;
    /* many rows: the pairs of the rounded rows after them (kern_pairs) */
    const bool pairs = PAIRS_NATIVE && !private_x;
    const size_t pairs_at = (size_t)a->m * a->k;
    const size_t need = (size_t)a->m * a->k * (private_x ? (size_t)threads : 1) +
                        (pairs ? (size_t)(a->m + 1) / 2 * (a->k / 16) * 32 : 0);

    if (c->xb_elems < need) {
        uint16_t *p = realloc(c->xb, need * sizeof(uint16_t));
        if (p == NULL) {
            HPD_LOG_ERROR("cpu", "gemm: %zu bytes for x in bf16 cannot be allocated",
                          need * sizeof(uint16_t));
            return HPD_ERR_NO_MEMORY;
        }
        c->xb = p;
        c->xb_elems = need;
    }
#pragma omp parallel num_threads(threads)
    {
        job_t j = {.x = c->xb, .w = a->w, .y = a->y, .ldy = a->ldy, .m = a->m, .k = a->k,
                   .accumulate = a->accumulate};
        if (private_x) {
            uint16_t *mine = c->xb + (size_t)omp_get_thread_num() * a->m * a->k;
            for (uint32_t r = 0; r < a->m; r++)
                round_row(mine + (size_t)r * a->k, a->x + (size_t)r * a->ldx, a->k);
            j.x = mine;
        } else {
#pragma omp for schedule(static)
            for (uint32_t r = 0; r < a->m; r++)
                round_row(c->xb + (size_t)r * a->k, a->x + (size_t)r * a->ldx, a->k);
        }
#if PAIRS_NATIVE
        if (pairs) {
            const uint32_t np = (a->m + 1) / 2;
#pragma omp for schedule(static)
            for (uint32_t p = 0; p < np; p++)
                pack_pairs(c->xb + pairs_at, c->xb, a->m, a->k, p, p + 1);
#pragma omp for schedule(static)
            for (uint32_t t = 0; t < n_tiles; t++) {
                uint32_t n0 = t * NB, n1 = n0 + NB < a->n ? n0 + NB : a->n;
                tile_pairs(c->xb + pairs_at, c->xb, a->m, a->w, a->k, a->y, a->ldy,
                           a->accumulate, n0, n1);
            }
        } else
#endif
#pragma omp for schedule(static)
        for (uint32_t t = 0; t < n_tiles; t++) {
            uint32_t n0 = t * NB, n1 = n0 + NB < a->n ? n0 + NB : a->n;
            tile(&j, n0, n1);
        }
    }
    return HPD_OK;
}

/* ---- a row-parallel product's groups in one op (backend.h gemm_sum)
 *
 * A few rows of x (decode) and BF16 weights in every group, no experts:
 * one parallel region; each thread rounds every group's columns of x into
 * its own copy, then for each 4 weight rows takes every group's four sums
 * as kern_1x4 makes them and adds them by the tree into y (the bits of the
 * G gemms and the tree's adds the engine would make; a row's sums do not
 * depend on the kernel shape: see the contract above). Anything else: the
 * G gemms into a buffer, then the tree, as the engine would. */
/* group j's product into out (ldo), added to what it holds or not */
static hpd_status_t group_gemm(hpd_backend_t *b, const hpd_gemm_sum_args_t *a, uint32_t j,
                               float *out, uint32_t ldo, bool accumulate)
{
    hpd_gemm_args_t g = a->g[j];
    g.m = a->m;
    g.n = a->n;
    g.y = out;
    g.ldy = ldo;
    g.accumulate = accumulate;
    return g.w_dtype == HPD_DTYPE_BF16 ? hpd_cpu_gemm_bf16_products(b, &g) : hpd_cpu_gemm(b, &g);
}

/* out[r][c] += right[r][c] (the tree's add of two halves) */
static void add_into(hpd_backend_t *b, float *out, uint32_t ldo, const float *right,
                     uint32_t m, uint32_t n)
{
#pragma omp parallel for schedule(static) num_threads((size_t)m * n >= (1u << 14) ? hpd_cpu_threads(b) : 1)
    for (uint32_t r = 0; r < m; r++)
        for (uint32_t c = 0; c < n; c++)
            out[(size_t)r * ldo + c] += right[(size_t)r * n + c];
}

/* groups [g0, g1) into out: a pair as one gemm then the other added in
 * its finish (p0 + p1), larger subtrees as their halves added; scratch
 * level `level` on holds the right halves (the engine's rowpar_tree) */
static hpd_status_t sum_tree(hpd_backend_t *b, const hpd_gemm_sum_args_t *a, uint32_t g0,
                             uint32_t g1, float *out, uint32_t ldo, float *scratch,
                             uint32_t level)
{
    hpd_status_t st;
    if (g1 - g0 <= 2) {
        st = group_gemm(b, a, g0, out, ldo, false);
        return st != HPD_OK || g1 - g0 == 1 ? st : group_gemm(b, a, g0 + 1, out, ldo, true);
    }
    const uint32_t mid = (g0 + g1) / 2;
    float *right = scratch + (size_t)level * a->m * a->n;
    if ((st = sum_tree(b, a, g0, mid, out, ldo, scratch, level + 1)) != HPD_OK ||
        (st = sum_tree(b, a, mid, g1, right, a->n, scratch, level + 1)) != HPD_OK)
        return st;
    add_into(b, out, ldo, right, a->m, a->n);
    return HPD_OK;
}

/* Many rows, or weights not all BF16: the gemms of the tree, straight into
 * y unless y is accumulated into (then into a buffer, added at the end). */
static hpd_status_t sum_by_gemms(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    hpd_cpu_ctx_t *c = b->ctx;
    const size_t mn = (size_t)a->m * a->n; /* 3 levels + the total */
    if (hpd_grow(&c->sum_tiles, &c->sum_floats, mn * 4, sizeof(float)) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    float *total = a->accumulate ? c->sum_tiles + 3 * mn : a->y;
    const uint32_t ldt = a->accumulate ? a->n : a->ldy;
    const hpd_status_t st = sum_tree(b, a, 0, a->n_groups, total, ldt, c->sum_tiles, 0);
    if (st == HPD_OK && a->accumulate)
        add_into(b, a->y, a->ldy, total, a->m, a->n);
    return st;
}

static hpd_status_t sum_dense(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    hpd_cpu_ctx_t *c = b->ctx;
    const uint32_t G = a->n_groups;
    bool bf16 = true;
    uint32_t ks[HPD_TP_GROUPS], at[HPD_TP_GROUPS + 1] = {0};
    uint64_t work = 0;
    for (uint32_t j = 0; j < G; j++) {
        bf16 &= a->g[j].w_dtype == HPD_DTYPE_BF16;
        ks[j] = a->g[j].k;
        at[j + 1] = at[j] + ks[j]; /* group j's columns in a rounded row */
        work += (uint64_t)a->m * a->n * ks[j];
    }
    if (!bf16 || a->m >= 4)
        return sum_by_gemms(b, a);
    const int threads = work >= (1u << 16) ? hpd_cpu_threads(b) : 1;
    const size_t row = at[G];
    if (hpd_grow(&c->xb, &c->xb_elems, (size_t)threads * a->m * row, sizeof(uint16_t)) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    const uint32_t n_tiles = (a->n + NB - 1) / NB;
#pragma omp parallel num_threads(threads)
    {
        uint16_t *mine = c->xb + (size_t)omp_get_thread_num() * a->m * row;
        for (uint32_t r = 0; r < a->m; r++)
            for (uint32_t j = 0; j < G; j++)
                round_row(mine + r * row + at[j], a->g[j].x + (size_t)r * a->g[j].ldx, ks[j]);
#pragma omp for schedule(static)
        for (uint32_t t = 0; t < n_tiles; t++) {
            const uint32_t n0 = t * NB, n1 = HPD_MIN(n0 + NB, a->n);
            for (uint32_t r = 0; r < a->m; r++) {
                const uint16_t *x = mine + r * row;
                float *y = a->y + (size_t)r * a->ldy;
                uint32_t n = n0;
                for (; n + 4 <= n1; n += 4) {
                    float part[4][HPD_TP_GROUPS];
                    for (uint32_t j = 0; j < G; j++) {
                        float s4[4];
                        sums_1x4(x + at[j], (const uint16_t *)a->g[j].w + (size_t)n * ks[j],
                                 ks[j], s4);
                        for (int q = 0; q < 4; q++)
                            part[q][j] = s4[q];
                    }
                    for (int q = 0; q < 4; q++)
                        finish(y + n + q, hpd_tp_tree(part[q], G), a->accumulate);
                }
                for (; n < n1; n++) {
                    float part[HPD_TP_GROUPS];
                    for (uint32_t j = 0; j < G; j++)
                        part[j] = dot_bp(x + at[j],
                                         (const uint16_t *)a->g[j].w + (size_t)n * ks[j], ks[j]);
                    finish(y + n, hpd_tp_tree(part, G), a->accumulate);
                }
            }
        }
    }
    return HPD_OK;
}

hpd_status_t hpd_cpu_gemm_sum_bf16_products(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    const uint32_t G = a->n_groups;
    if (G < 1 || G > HPD_TP_GROUPS || (G & (G - 1)) != 0) {
        HPD_LOG_ERROR("cpu", "gemm_sum of %u groups (expected 1, 2, 4 or 8)", G);
        return HPD_ERR_INVALID_ARG;
    }
    return a->first != NULL ? hpd_cpu_gemm_sum_experts(b, a, sum_dense) : sum_dense(b, a);
}
