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
static inline float hpd_fma1(float a, float b, float c) { return a * b + c; }
#endif

/* Horizontal sum in a fixed pairwise order. */
static inline float hpd_v8_hsum(hpd_v8_t v)
{
    float l[8];
    hpd_v8_store(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
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

#endif
