/* Eight-lane float vectors for the CPU kernels. The multiply-add is explicit
 * (fused when the target has FMA, two roundings otherwise) and the build
 * turns off floating-point contraction, so every kernel that reduces through
 * these helpers gets one fixed sequence of roundings per output element. */
#ifndef HPD_KERNELS_CPU_SIMD_H
#define HPD_KERNELS_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 hpd_v8_t;
static inline hpd_v8_t hpd_v8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void hpd_v8_store(float *p, hpd_v8_t v) { _mm256_storeu_ps(p, v); }
static inline hpd_v8_t hpd_v8_zero(void) { return _mm256_setzero_ps(); }
static inline hpd_v8_t hpd_v8_set1(float x) { return _mm256_set1_ps(x); }
static inline hpd_v8_t hpd_v8_fma(hpd_v8_t a, hpd_v8_t b, hpd_v8_t c)
{
    return _mm256_fmadd_ps(a, b, c);
}
static inline hpd_v8_t hpd_v8_mul(hpd_v8_t a, hpd_v8_t b) { return _mm256_mul_ps(a, b); }
static inline hpd_v8_t hpd_v8_add(hpd_v8_t a, hpd_v8_t b) { return _mm256_add_ps(a, b); }
static inline hpd_v8_t hpd_v8_div(hpd_v8_t a, hpd_v8_t b) { return _mm256_div_ps(a, b); }
static inline hpd_v8_t hpd_v8_sub(hpd_v8_t a, hpd_v8_t b) { return _mm256_sub_ps(a, b); }
static inline float hpd_fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
typedef float hpd_v8_t __attribute__((vector_size(32)));
static inline hpd_v8_t hpd_v8_load(const float *p)
{
    hpd_v8_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}
static inline void hpd_v8_store(float *p, hpd_v8_t v) { memcpy(p, &v, sizeof(v)); }
static inline hpd_v8_t hpd_v8_zero(void) { return (hpd_v8_t){0}; }
static inline hpd_v8_t hpd_v8_set1(float x) { return (hpd_v8_t){x, x, x, x, x, x, x, x}; }
static inline hpd_v8_t hpd_v8_fma(hpd_v8_t a, hpd_v8_t b, hpd_v8_t c) { return a * b + c; }
static inline hpd_v8_t hpd_v8_mul(hpd_v8_t a, hpd_v8_t b) { return a * b; }
static inline hpd_v8_t hpd_v8_add(hpd_v8_t a, hpd_v8_t b) { return a + b; }
static inline hpd_v8_t hpd_v8_div(hpd_v8_t a, hpd_v8_t b) { return a / b; }
static inline hpd_v8_t hpd_v8_sub(hpd_v8_t a, hpd_v8_t b) { return a - b; }
static inline float hpd_fma1(float a, float b, float c) { return a * b + c; }
#endif

/* Software prefetch of weights that stream from memory, into L2 only
 * (locality 1): prefetching them into L1 as well (the default, locality 3)
 * evicts the x rows and the lines about to be read, and held batch-1 decode
 * on hidden-1024 rows to ~21 GB/s where L2 reaches ~32 on the same 2 threads
 * (an EPYC with AVX-512; the kernels/cpu GEMV measured alone). */
#define HPD_PREFETCH_W(p) __builtin_prefetch((p), 0, 1)

/* Holds a vector v in a register: without it GCC folds each use of an x
 * vector into its FMA as a memory operand, 13 loads per 16 FMAs where 4
 * suffice, and the loads, not the FMAs, set the pace (the 512-row BF16 GEMM
 * ran at 0.55 of the FMA peak, 0.75 with the x vectors held). No effect on
 * results. */
#if defined(__AVX2__)
#define HPD_IN_REG(v) __asm__("" : "+v"(v))
#else
#define HPD_IN_REG(v) (void)0
#endif

/* Horizontal sum in a fixed pairwise order. */
static inline float hpd_v8_hsum(hpd_v8_t v)
{
    float l[8];
    hpd_v8_store(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* hpd_v8_hsum of four vectors at once, the same adds in the same pairs
 * (float addition is commutative: a + b and b + a are the same bits): the
 * first level of each vector's tree by one horizontal add of two vectors,
 * the second by another, the third as the halves added. */
static inline void hpd_v8_hsum4(hpd_v8_t a, hpd_v8_t b, hpd_v8_t c, hpd_v8_t d, float out[4])
{
#if defined(__AVX2__) && defined(__FMA__)
    /* [a01 a23 b01 b23 | a45 a67 b45 b67] and the same of c, d */
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    /* [a0123 b0123 c0123 d0123 | a4567 b4567 c4567 d4567] */
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
#else
    out[0] = hpd_v8_hsum(a);
    out[1] = hpd_v8_hsum(b);
    out[2] = hpd_v8_hsum(c);
    out[3] = hpd_v8_hsum(d);
#endif
}

/* The one dot product of the CPU backend: 8-lane partial sums over k in
 * steps of 8, the fixed horizontal sum, then the tail in order. Every kernel
 * shape in gemm.c reproduces exactly this sequence per element. */
static inline float hpd_dot(const float *x, const float *w, uint32_t k)
{
    hpd_v8_t acc = hpd_v8_zero();
    uint32_t i = 0;
    float s;

    for (; i + 8 <= k; i += 8)
        acc = hpd_v8_fma(hpd_v8_load(x + i), hpd_v8_load(w + i), acc);
    s = hpd_v8_hsum(acc);
    for (; i < k; i++)
        s = hpd_fma1(x[i], w[i], s);
    return s;
}

/* y[0..n) += a * x[0..n) */
static inline void hpd_axpy(float *y, float a, const float *x, uint32_t n)
{
    hpd_v8_t av = hpd_v8_set1(a);
    uint32_t i = 0;

    for (; i + 8 <= n; i += 8)
        hpd_v8_store(y + i, hpd_v8_fma(av, hpd_v8_load(x + i), hpd_v8_load(y + i)));
    for (; i < n; i++)
        y[i] = hpd_fma1(a, x[i], y[i]);
}

/* y[0..n) *= a */
static inline void hpd_scale(float *y, float a, uint32_t n)
{
    hpd_v8_t av = hpd_v8_set1(a);
    uint32_t i = 0;

    for (; i + 8 <= n; i += 8)
        hpd_v8_store(y + i, hpd_v8_mul(av, hpd_v8_load(y + i)));
    for (; i < n; i++)
        y[i] = a * y[i];
}

/* exp(x) in fp32 for 8 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a
 * degree-5 polynomial in r, times 2^n; 1.01 ulp from exp at worst over the
 * range, test_exp holds it to 2), x clamped to [-87.3365, 88] (results
 * 1.2e-38 .. 1.7e38); a NaN stays NaN.
 * hpd_exp1 is the same sequence for one value, bit for bit. The CPU kernels
 * call these where libm's expf per element cost a few % of a prefill. */
#define HPD_EXP_LO -87.3365f
#define HPD_EXP_HI 88.0f
#define HPD_EXP_POLY(P, R) /* Cephes expf's minimax coefficients */                            \
    P = HPD_FMA(P, R, 1.3981999507e-3f), P = HPD_FMA(P, R, 8.3334519073e-3f),                  \
    P = HPD_FMA(P, R, 4.1665795894e-2f), P = HPD_FMA(P, R, 1.6666665459e-1f),                  \
    P = HPD_FMA(P, R, 5.0000001201e-1f)

static inline float hpd_exp1(float x)
{
#define HPD_FMA(a, b, c) hpd_fma1(a, b, c)
    if (x != x)
        return x; /* NaN stays NaN */
    x = x > HPD_EXP_LO ? x : HPD_EXP_LO;
    x = x < HPD_EXP_HI ? x : HPD_EXP_HI;
    const float fx = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = hpd_fma1(-fx, 0.693359375f, x);
    r = hpd_fma1(-fx, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    HPD_EXP_POLY(p, r);
    const float y = hpd_fma1(p, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)fx + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
#undef HPD_FMA
}

#if defined(__AVX2__) && defined(__FMA__)
static inline hpd_v8_t hpd_v8_exp(hpd_v8_t x)
{
#define HPD_FMA(a, b, c) _mm256_fmadd_ps(a, b, _mm256_set1_ps(c))
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), x0 = x;
    x = _mm256_max_ps(x, _mm256_set1_ps(HPD_EXP_LO));
    x = _mm256_min_ps(x, _mm256_set1_ps(HPD_EXP_HI));
    const __m256 fx = _mm256_floor_ps(_mm256_add_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    HPD_EXP_POLY(p, r);
    const __m256 y =
        _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
    return _mm256_blendv_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23))), x0,
                            nan); /* NaN stays NaN */
#undef HPD_FMA
}
#else
static inline hpd_v8_t hpd_v8_exp(hpd_v8_t x)
{
    float l[8];
    hpd_v8_store(l, x);
    for (int i = 0; i < 8; i++)
        l[i] = hpd_exp1(l[i]);
    return hpd_v8_load(l);
}
#endif


/* SiLU x / (1 + exp(-x)) and the sigmoid 1 / (1 + exp(-x)) with the
 * kernels' exp: a vector lane and the scalar form give the same bits. */
static inline float hpd_silu1(float x)
{
    return x / (1.0f + hpd_exp1(-x));
}

static inline float hpd_sigmoid1(float x)
{
    return 1.0f / (1.0f + hpd_exp1(-x));
}

static inline hpd_v8_t hpd_v8_silu(hpd_v8_t x)
{
    const hpd_v8_t e = hpd_v8_exp(hpd_v8_mul(x, hpd_v8_set1(-1.0f)));
    return hpd_v8_div(x, hpd_v8_add(hpd_v8_set1(1.0f), e));
}

static inline hpd_v8_t hpd_v8_sigmoid(hpd_v8_t x)
{
    const hpd_v8_t one = hpd_v8_set1(1.0f);
    return hpd_v8_div(one, hpd_v8_add(one, hpd_v8_exp(hpd_v8_mul(x, hpd_v8_set1(-1.0f)))));
}

#endif
