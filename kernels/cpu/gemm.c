/* GEMM y = x w^T on the CPU.
 *
 * Batch invariance: each y[m][n] is computed by the exact sequence of
 * hpd_dot() (8 lanes over k, fixed horizontal sum, ordered tail) whatever the
 * kernel shape that computes it (4x2 for the bulk, 1x4 for leftover rows, 1x1
 * for leftover columns), so a row's result never depends on the batch. */
#include <omp.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

#define NB 32 /* weight rows per tile: a tile of w stays in L2 while x streams */

static inline void finish(float *y, float s, bool accumulate)
{
    *y = accumulate ? *y + s : s;
}

static inline float tail_dot(float s, const float *x, const float *w, uint32_t i, uint32_t k)
{
    for (; i < k; i++)
        s = hpd_fma1(x[i], w[i], s);
    return s;
}

static void kern_4x2(const float *x, uint32_t ldx, const float *w0, const float *w1, uint32_t k,
                     float *y, uint32_t ldy, bool accumulate)
{
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * (size_t)ldx, *x3 = x + 3 * (size_t)ldx;
    hpd_v8_t a00 = hpd_v8_zero(), a01 = hpd_v8_zero(), a10 = hpd_v8_zero(), a11 = hpd_v8_zero();
    hpd_v8_t a20 = hpd_v8_zero(), a21 = hpd_v8_zero(), a30 = hpd_v8_zero(), a31 = hpd_v8_zero();
    uint32_t i = 0;

    for (; i + 8 <= k; i += 8) {
        hpd_v8_t b0 = hpd_v8_load(w0 + i), b1 = hpd_v8_load(w1 + i), xv;
        xv = hpd_v8_load(x0 + i);
        a00 = hpd_v8_fma(xv, b0, a00);
        a01 = hpd_v8_fma(xv, b1, a01);
        xv = hpd_v8_load(x1 + i);
        a10 = hpd_v8_fma(xv, b0, a10);
        a11 = hpd_v8_fma(xv, b1, a11);
        xv = hpd_v8_load(x2 + i);
        a20 = hpd_v8_fma(xv, b0, a20);
        a21 = hpd_v8_fma(xv, b1, a21);
        xv = hpd_v8_load(x3 + i);
        a30 = hpd_v8_fma(xv, b0, a30);
        a31 = hpd_v8_fma(xv, b1, a31);
    }
    finish(y, tail_dot(hpd_v8_hsum(a00), x0, w0, i, k), accumulate);
    finish(y + 1, tail_dot(hpd_v8_hsum(a01), x0, w1, i, k), accumulate);
    finish(y + ldy, tail_dot(hpd_v8_hsum(a10), x1, w0, i, k), accumulate);
    finish(y + ldy + 1, tail_dot(hpd_v8_hsum(a11), x1, w1, i, k), accumulate);
    finish(y + 2 * (size_t)ldy, tail_dot(hpd_v8_hsum(a20), x2, w0, i, k), accumulate);
    finish(y + 2 * (size_t)ldy + 1, tail_dot(hpd_v8_hsum(a21), x2, w1, i, k), accumulate);
    finish(y + 3 * (size_t)ldy, tail_dot(hpd_v8_hsum(a30), x3, w0, i, k), accumulate);
    finish(y + 3 * (size_t)ldy + 1, tail_dot(hpd_v8_hsum(a31), x3, w1, i, k), accumulate);
}

static void kern_1x4(const float *x, const float *w, uint32_t ldw, uint32_t k, float *y,
                     bool accumulate)
{
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * (size_t)ldw, *w3 = w + 3 * (size_t)ldw;
    hpd_v8_t a0 = hpd_v8_zero(), a1 = hpd_v8_zero(), a2 = hpd_v8_zero(), a3 = hpd_v8_zero();
    uint32_t i = 0;

    for (; i + 8 <= k; i += 8) {
        hpd_v8_t xv = hpd_v8_load(x + i);
        a0 = hpd_v8_fma(xv, hpd_v8_load(w0 + i), a0);
        a1 = hpd_v8_fma(xv, hpd_v8_load(w1 + i), a1);
        a2 = hpd_v8_fma(xv, hpd_v8_load(w2 + i), a2);
        a3 = hpd_v8_fma(xv, hpd_v8_load(w3 + i), a3);
    }
    finish(y, tail_dot(hpd_v8_hsum(a0), x, w0, i, k), accumulate);
    finish(y + 1, tail_dot(hpd_v8_hsum(a1), x, w1, i, k), accumulate);
    finish(y + 2, tail_dot(hpd_v8_hsum(a2), x, w2, i, k), accumulate);
    finish(y + 3, tail_dot(hpd_v8_hsum(a3), x, w3, i, k), accumulate);
}

/* One tile: weight rows [n0, n1) against every row of x. */
static void gemm_tile(const hpd_gemm_args_t *a, uint32_t n0, uint32_t n1)
{
    const uint32_t k = a->k;
    uint32_t m = 0;

    for (; m + 4 <= a->m; m += 4) {
        const float *x = a->x + (size_t)m * a->ldx;
        float *y = a->y + (size_t)m * a->ldy;
        uint32_t n = n0;
        for (; n + 2 <= n1; n += 2)
            kern_4x2(x, a->ldx, a->w + (size_t)n * k, a->w + (size_t)(n + 1) * k, k, y + n,
                     a->ldy, a->accumulate);
        for (; n < n1; n++)
            for (uint32_t r = 0; r < 4; r++)
                finish(y + (size_t)r * a->ldy + n,
                       hpd_dot(x + (size_t)r * a->ldx, a->w + (size_t)n * k, k), a->accumulate);
    }
    for (; m < a->m; m++) {
        const float *x = a->x + (size_t)m * a->ldx;
        float *y = a->y + (size_t)m * a->ldy;
        uint32_t n = n0;
        for (; n + 4 <= n1; n += 4)
            kern_1x4(x, a->w + (size_t)n * k, k, k, y + n, a->accumulate);
        for (; n < n1; n++)
            finish(y + n, hpd_dot(x, a->w + (size_t)n * k, k), a->accumulate);
    }
}

hpd_status_t hpd_cpu_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    const uint32_t n_tiles = (a->n + NB - 1) / NB;
    /* threads pay only when there is enough work to split */
    const int threads = (uint64_t)a->m * a->n * a->k >= (1u << 16) ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < n_tiles; t++) {
        uint32_t n0 = t * NB, n1 = n0 + NB < a->n ? n0 + NB : a->n;
        gemm_tile(a, n0, n1);
    }
    return HPD_OK;
}
