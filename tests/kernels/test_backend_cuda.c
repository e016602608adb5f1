/* Every op of the CUDA backend against the CPU backend on the same inputs
 * (ggml's test-backend-ops): fp32 relative RMS error below 1e-5 for the
 * element-wise ops, norms, GEMM and attention, 1e-4 for the recurrent and
 * the chunked gated delta rule and conv1d (fla's own tests allow 2e-3 and
 * 5e-3 in bf16); KV stores, translation, copies and greedy sampling exact.
 * Determinism: a row's result is the same bits alone and inside a larger
 * batch, whatever the page layout, and a sequence resumed from a state
 * taken on the 64 grid equals one pass. The cuda-fast variant's GEMM is
 * checked too, the cuda-bf16 device's GEMM on tensor cores (batch-invariant),
 * and the pieces' hashes of a transfer's checksum computed on
 * the device against libxxhash. Exits 77 (skipped) without a GPU. HPD_TEST_DEVICE names the
 * device under test (cuda:0); "cpu" runs the checks against the CPU backend
 * itself, which checks the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>

#include "common/hash.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/test_device.h"
#include "tests/test_helpers.h"

static hpd_backend_t *cpu, *gpu;

/* a device copy of n host floats */
static float *up(const float *host, size_t n)
{
    void *d;
    assert_int_equal(hpd_backend_alloc(gpu, n * sizeof(float), &d), HPD_OK);
    assert_int_equal(hpd_backend_from_host(gpu, d, host, n * sizeof(float)), HPD_OK);
    return d;
}

/* a device copy of n host bytes */
static void *up_bytes(const void *host, size_t n)
{
    void *d;
    assert_int_equal(hpd_backend_alloc(gpu, n, &d), HPD_OK);
    assert_int_equal(hpd_backend_from_host(gpu, d, host, n), HPD_OK);
    return d;
}

static float *down(const float *dev, size_t n)
{
    float *h = malloc(n * sizeof(float));
    assert_int_equal(hpd_backend_to_host(gpu, h, dev, n * sizeof(float)), HPD_OK);
    return h;
}

static float *rnd(size_t n, uint64_t seed, float scale)
{
    float *x = malloc(n * sizeof(float));
    test_fill(x, n, seed, scale);
    return x;
}

static void expect_close(const char *op, const float *got, const float *want, size_t n,
                         double tol)
{
    const double err = test_rel_rms(got, want, n);
    fprintf(stderr, "%-14s rel rms %.3g (tolerance %.0e)\n", op, err, tol);
    assert_true(err < tol);
}

static void test_gemm(void **state)
{
    const uint32_t m = 37, n = 300, k = 200;
    float *x = rnd(m * k, 1, 1), *w = rnd(n * k, 2, 0.1f), *y = rnd(m * n, 3, 1);
    float *ycpu = malloc(m * n * sizeof(float));
    memcpy(ycpu, y, m * n * sizeof(float));
    float *dx = up(x, m * k), *dw = up(w, n * k), *dy = up(y, m * n);
    hpd_gemm_args_t a = {
        .x = x, .ldx = k, .w = w, .y = ycpu, .ldy = n, .m = m, .n = n, .k = k, .accumulate = true};
    assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
    a = (hpd_gemm_args_t){
        .x = dx, .ldx = k, .w = dw, .y = dy, .ldy = n, .m = m, .n = n, .k = k, .accumulate = true};
    assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
    float *got = down(dy, m * n);
    expect_close("gemm", got, ycpu, m * n, 1e-5);
    /* row 5 alone gives the same bits as inside the batch of 37 */
    float *dy1 = up(y + 5 * n, n);
    a = (hpd_gemm_args_t){.x = dx + 5 * k,
                          .ldx = k,
                          .w = dw,
                          .y = dy1,
                          .ldy = n,
                          .m = 1,
                          .n = n,
                          .k = k,
                          .accumulate = true};
    assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
    float *one = down(dy1, n);
    assert_memory_equal(one, got + 5 * n, n * sizeof(float));
    free(x), free(w), free(y), free(ycpu), free(got), free(one);
    hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dw), hpd_backend_free(gpu, dy);
    hpd_backend_free(gpu, dy1);
}

/* BF16 and F16 weights (GEMM) and tables (embed): the device widens them
 * exactly, so its GEMM gives the bits of its own GEMM over the weights
 * widened to F32 first, close to the CPU's; embed rows are exact. */
static void test_half_weights(void **state)
{
    const uint32_t m = 19, n = 130, k = 200, V = 50;
    const hpd_dtype_t dtypes[] = {HPD_DTYPE_BF16, HPD_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        float *x = rnd(m * k, 11, 1), *w = rnd(n * k, 12, 0.1f);
        float *ycpu = malloc(m * n * sizeof(float));
        uint16_t *h = malloc(n * k * 2);
        hpd_dtype_from_f32(dtypes[d], w, h, n * k);
        hpd_dtype_to_f32(dtypes[d], h, w, n * k); /* w: the half weights widened */
        void *dh;
        assert_int_equal(hpd_backend_alloc(gpu, n * k * 2, &dh), HPD_OK);
        assert_int_equal(hpd_backend_from_host(gpu, dh, h, n * k * 2), HPD_OK);
        float *dx = up(x, m * k), *dw = up(w, n * k), *dy = up(x, m * n), *dy32 = up(x, m * n);
        hpd_gemm_args_t a = {.x = x, .ldx = k, .w = h, .w_dtype = dtypes[d], .y = ycpu,
                             .ldy = n, .m = m, .n = n, .k = k};
        assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
        a.x = dx, a.w = dh, a.y = dy;
        assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
        a.w = dw, a.w_dtype = HPD_DTYPE_F32, a.y = dy32;
        assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
        float *got = down(dy, m * n), *got32 = down(dy32, m * n);
        expect_close(dtypes[d] == HPD_DTYPE_BF16 ? "gemm bf16" : "gemm f16", got, ycpu, m * n,
                     1e-5);
        assert_memory_equal(got, got32, m * n * sizeof(float));
        /* embed from a half table (rows of w as the vocabulary) */
        const int32_t ids[4] = {3, 0, 49, 3};
        float *ecpu = malloc(4 * k * sizeof(float)), *de = up(x, 4 * k);
        hpd_embed_args_t e = {.ids = ids, .n = 4, .table = h, .dtype = dtypes[d], .dim = k,
                              .out = ecpu, .ld = k};
        assert_true(V <= n);
        assert_int_equal(hpd_embed(cpu, &e), HPD_OK);
        e.table = dh, e.out = de;
        assert_int_equal(hpd_embed(gpu, &e), HPD_OK);
        float *egot = down(de, 4 * k);
        assert_memory_equal(egot, ecpu, 4 * k * sizeof(float));
        assert_memory_equal(ecpu + k, w, k * sizeof(float)); /* id 0: row 0 widened */
        free(x), free(w), free(ycpu), free(h), free(got), free(got32), free(ecpu), free(egot);
        hpd_backend_free(gpu, dh), hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dw);
        hpd_backend_free(gpu, dy), hpd_backend_free(gpu, dy32), hpd_backend_free(gpu, de);
    }
}

/* FP8 E4M3 weights with block scales: dequantised inside the device GEMM
 * as on the CPU (q * scale, one rounding), so the device gives the bits of
 * its own GEMM over the dequantised weights, close to the CPU's. */
static void test_fp8_gemm(void **state)
{
    const uint32_t m = 11, n = 70, k = 200, B = 64, ld = (k + B - 1) / B;
    float *x = rnd(m * k, 31, 1), *w = rnd(n * k, 32, 300), *scale = rnd(n * ld, 33, 1);
    uint8_t *q = malloc(n * k);
    for (uint32_t i = 0; i < n * ld; i++)
        scale[i] = 0.01f + fabsf(scale[i]);
    hpd_dtype_from_f32(HPD_DTYPE_F8_E4M3, w, q, n * k);
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < k; c++)
            w[r * k + c] = hpd_f8e4m3_to_f32(q[r * k + c]) * scale[r * ld + c / B];
    void *dq;
    assert_int_equal(hpd_backend_alloc(gpu, n * k, &dq), HPD_OK);
    assert_int_equal(hpd_backend_from_host(gpu, dq, q, n * k), HPD_OK);
    float *dx = up(x, m * k), *dw = up(w, n * k), *ds = up(scale, n * ld);
    float *dy = up(x, m * n), *dy32 = up(x, m * n), *ycpu = malloc(m * n * sizeof(float));
    hpd_gemm_args_t a = {.x = x, .ldx = k, .w = q, .w_dtype = HPD_DTYPE_F8_E4M3, .w_scale = scale,
                         .w_scale_ld = ld, .w_block = B, .y = ycpu, .ldy = n, .m = m, .n = n,
                         .k = k};
    assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
    a.x = dx, a.w = dq, a.w_scale = ds, a.y = dy;
    assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
    a = (hpd_gemm_args_t){.x = dx, .ldx = k, .w = dw, .y = dy32, .ldy = n, .m = m, .n = n, .k = k};
    assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
    float *got = down(dy, m * n), *got32 = down(dy32, m * n);
    expect_close("gemm fp8", got, ycpu, m * n, 1e-5);
    assert_memory_equal(got, got32, m * n * sizeof(float));
    free(x), free(w), free(scale), free(q), free(ycpu), free(got), free(got32);
    hpd_backend_free(gpu, dq), hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dw);
    hpd_backend_free(gpu, ds), hpd_backend_free(gpu, dy), hpd_backend_free(gpu, dy32);
}

/* A GEMM row does not depend on its batch (docs/kernels.md, "GEMM"): for
 * each weight dtype, the rows of batches of m = 1 .. 130 (the device's GEMV
 * up to 32 rows, its tiled kernel above) are the bits of the same rows in a
 * batch of 150, and the CPU's within 1e-5. k is not a multiple of the
 * 64-element chunk; 1000 and 4132 leave some dtypes' weight rows off 16-byte
 * alignment (the tiled kernel's case), 1040 aligns FP8's. FP8 blocks of 48
 * columns change scale inside a chunk. x and y are strided, y accumulates. */
static void test_gemm_batch_invariance(void **state)
{
    const uint32_t M = 150, n = 67, B = 48, ldy = n + 5;
    const uint32_t ks[] = {1000, 1040, 4132};
    const uint32_t ms[] = {1, 2, 3, 5, 8, 9, 17, 32, 33, 64, 130};
    const hpd_dtype_t dtypes[] = {HPD_DTYPE_F32, HPD_DTYPE_BF16, HPD_DTYPE_F16,
                                  HPD_DTYPE_F8_E4M3};
    for (size_t d = 0; d < HPD_ARRAY_SIZE(dtypes); d++) {
        const hpd_dtype_t dt = dtypes[d];
        const bool fp8 = dt == HPD_DTYPE_F8_E4M3;
        for (size_t ki = 0; ki < HPD_ARRAY_SIZE(ks); ki++) {
            const uint32_t k = ks[ki], ldx = k + 3, sld = (k + B - 1) / B;
            const size_t wbytes = (size_t)n * k * hpd_dtype_size(dt);
            float *x = rnd((size_t)M * ldx, 41, 1), *w = rnd((size_t)n * k, 42, fp8 ? 300 : 0.1f);
            float *y0 = rnd((size_t)M * ldy, 43, 1), *scale = rnd((size_t)n * sld, 44, 1);
            float *ycpu = malloc((size_t)M * ldy * sizeof(float));
            void *wq = malloc(wbytes), *dwq;
            for (size_t i = 0; i < (size_t)n * sld; i++)
                scale[i] = 0.01f + fabsf(scale[i]);
            hpd_dtype_from_f32(dt, w, wq, (size_t)n * k);
            memcpy(ycpu, y0, (size_t)M * ldy * sizeof(float));
            hpd_gemm_args_t a = {.x = x, .ldx = ldx, .w = wq, .w_dtype = dt,
                                 .w_scale = fp8 ? scale : NULL, .w_scale_ld = fp8 ? sld : 0,
                                 .w_block = fp8 ? B : 0, .y = ycpu, .ldy = ldy, .m = M, .n = n,
                                 .k = k, .accumulate = true};
            assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
            assert_int_equal(hpd_backend_alloc(gpu, wbytes, &dwq), HPD_OK);
            assert_int_equal(hpd_backend_from_host(gpu, dwq, wq, wbytes), HPD_OK);
            float *dx = up(x, (size_t)M * ldx), *ds = up(scale, (size_t)n * sld);
            float *dy = up(y0, (size_t)M * ldy);
            a.x = dx, a.w = dwq, a.w_scale = fp8 ? ds : NULL, a.y = dy;
            assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
            float *big = down(dy, (size_t)M * ldy);
            char name[32];
            snprintf(name, sizeof(name), "gemm %s k=%u", hpd_dtype_name(dt), k);
            expect_close(name, big, ycpu, (size_t)M * ldy, 1e-5);
            for (size_t mi = 0; mi < HPD_ARRAY_SIZE(ms); mi++) {
                const uint32_t m = ms[mi], off = (M - m) / 2;
                float *dys = up(y0 + (size_t)off * ldy, (size_t)m * ldy);
                a.x = dx + (size_t)off * ldx, a.y = dys, a.m = m;
                assert_int_equal(hpd_gemm(gpu, &a), HPD_OK);
                float *got = down(dys, (size_t)m * ldy);
                if (memcmp(got, big + (size_t)off * ldy, (size_t)m * ldy * sizeof(float)) != 0)
                    fail_msg("%s: rows %u..%u alone (m = %u) differ from the batch of %u", name,
                             off, off + m - 1, m, M);
                free(got);
                hpd_backend_free(gpu, dys);
            }
            free(x), free(w), free(y0), free(scale), free(ycpu), free(wq), free(big);
            hpd_backend_free(gpu, dwq), hpd_backend_free(gpu, dx), hpd_backend_free(gpu, ds);
            hpd_backend_free(gpu, dy);
        }
    }
}

/* The mixture of experts' gather and combine against the CPU: exact (the
 * combine's roundings are spelled out in backend.h), and within 1e-6 with
 * a shared expert, whose gate goes through expf. */
static void test_moe_ops(void **state)
{
    const uint32_t T = 7, K = 3, D = 300, S = T * K;
    float *src = rnd(T * D, 21, 1), *rows = rnd(S * D, 22, 1), *shared = rnd(T * D, 23, 1);
    float *gate = rnd(T * 2, 24, 2), *x = rnd(T * D, 25, 1), *w = rnd(S, 26, 1);
    uint32_t idx[21], slots[21];
    for (uint32_t i = 0; i < S; i++) {
        idx[i] = (i * 5 + 2) % T;
        slots[i] = (i * 8 + 3) % S;
    }
    float *dsrc = up(src, T * D), *dg = up(rows, S * D), *drows = up(rows, S * D);
    float *dsh = up(shared, T * D), *dgate = up(gate, T * 2), *dx = up(x, T * D);
    float *gcpu = malloc(S * D * sizeof(float)), *xcpu = malloc(T * D * sizeof(float));
    /* the routing's arrays are device memory (moe_route's) */
    uint32_t *didx = up_bytes(idx, sizeof(idx)), *dslots = up_bytes(slots, sizeof(slots));
    float *dw = up(w, S);
    hpd_gather_args_t g = {.src = src, .ld_src = D, .idx = idx, .n = S, .dim = D, .dst = gcpu,
                           .ld_dst = D};
    assert_int_equal(hpd_gather(cpu, &g), HPD_OK);
    g.src = dsrc, g.dst = dg, g.idx = NULL, g.idx_dev = didx;
    assert_int_equal(hpd_gather(gpu, &g), HPD_OK);
    float *got_dev = down(dg, S * D);
    assert_memory_equal(got_dev, gcpu, S * D * sizeof(float));
    free(got_dev);
    g.idx = idx, g.idx_dev = NULL; /* and host indices (the LM head's), staged */
    assert_int_equal(hpd_gather(gpu, &g), HPD_OK);
    float *got = down(dg, S * D);
    assert_memory_equal(got, gcpu, S * D * sizeof(float));
    for (int with_shared = 0; with_shared < 2; with_shared++) {
        memcpy(xcpu, x, T * D * sizeof(float));
        assert_int_equal(hpd_backend_from_host(gpu, dx, x, T * D * sizeof(float)), HPD_OK);
        hpd_moe_combine_args_t c = {.x = xcpu, .ldx = D, .rows = rows, .ld_rows = D,
                                    .slots = slots, .weights = w, .top_k = K,
                                    .shared = with_shared ? shared : NULL, .ld_shared = D,
                                    .gate = gate + 1, .ld_gate = 2, .n_tokens = T, .dim = D};
        assert_int_equal(hpd_moe_combine(cpu, &c), HPD_OK);
        c.x = dx, c.rows = drows, c.shared = with_shared ? dsh : NULL, c.gate = dgate + 1;
        c.slots = dslots, c.weights = dw;
        assert_int_equal(hpd_moe_combine(gpu, &c), HPD_OK);
        float *xg = down(dx, T * D);
        if (with_shared) /* the GPU's expf in the gate's sigmoid may differ by an ulp */
            expect_close("moe combine", xg, xcpu, T * D, 1e-6);
        else
            assert_memory_equal(xg, xcpu, T * D * sizeof(float));
        free(xg);
    }
    free(src), free(rows), free(shared), free(gate), free(x), free(w), free(gcpu), free(xcpu);
    free(got);
    hpd_backend_free(gpu, dsrc), hpd_backend_free(gpu, dg), hpd_backend_free(gpu, drows);
    hpd_backend_free(gpu, dsh), hpd_backend_free(gpu, dgate), hpd_backend_free(gpu, dx);
    hpd_backend_free(gpu, didx), hpd_backend_free(gpu, dslots), hpd_backend_free(gpu, dw);
}

/* A routing of T tokens over E experts, K each, on backend b (its logits
 * and results in b's memory) */
typedef struct {
    uint32_t *ids, *slots, *idx, *first;
    float *w;
} routing_t;

static routing_t route_on(hpd_backend_t *b, const float *logits, uint32_t T, uint32_t E,
                          uint32_t K, bool norm)
{
    routing_t r;
    const size_t S = (size_t)T * K;
    assert_int_equal(hpd_backend_alloc(b, S * 4, (void **)&r.ids), HPD_OK);
    assert_int_equal(hpd_backend_alloc(b, S * 4, (void **)&r.slots), HPD_OK);
    assert_int_equal(hpd_backend_alloc(b, S * 4, (void **)&r.idx), HPD_OK);
    assert_int_equal(hpd_backend_alloc(b, (E + 1) * 4, (void **)&r.first), HPD_OK);
    assert_int_equal(hpd_backend_alloc(b, S * 4, (void **)&r.w), HPD_OK);
    const hpd_moe_route_args_t a = {.logits = logits, .ld = E, .n_tokens = T, .n_experts = E,
                                    .top_k = K, .norm = norm, .ids = r.ids, .weights = r.w,
                                    .slots = r.slots, .idx = r.idx, .first = r.first};
    assert_int_equal(hpd_moe_route(b, &a), HPD_OK);
    return r;
}

static void routing_free(hpd_backend_t *b, routing_t *r)
{
    hpd_backend_free(b, r->ids), hpd_backend_free(b, r->slots), hpd_backend_free(b, r->idx);
    hpd_backend_free(b, r->first), hpd_backend_free(b, r->w);
}

/* moe_route on the device against the CPU's: the same experts, slots,
 * slots' tokens and first slots, the weights within the GPU's expf (exact
 * on the CPU's path); T tokens across the bitmap's 32-token words, Qwen3-Next's
 * 512 experts and 10 a token; the one-block path of up to 16 tokens and the
 * general one the same bits */
static void test_moe_route(void **state)
{
    const struct {
        uint32_t T, E, K;
        bool norm;
    } cases[] = {{1, 64, 8, false}, {33, 512, 10, true}, {70, 1024, 32, true}, {5, 7, 7, false}};
    for (size_t c = 0; c < HPD_ARRAY_SIZE(cases); c++) {
        const uint32_t T = cases[c].T, E = cases[c].E, K = cases[c].K, S = T * K;
        float *logits = rnd((size_t)T * E, 40 + c, 3), *dl = up(logits, (size_t)T * E);
        routing_t want = route_on(cpu, logits, T, E, K, cases[c].norm);
        routing_t got = route_on(gpu, dl, T, E, K, cases[c].norm);
        uint32_t *h = malloc(((size_t)3 * S + E + 1) * 4);
        assert_int_equal(hpd_backend_to_host(gpu, h, got.ids, S * 4), HPD_OK);
        assert_memory_equal(h, want.ids, S * 4);
        assert_int_equal(hpd_backend_to_host(gpu, h, got.slots, S * 4), HPD_OK);
        assert_memory_equal(h, want.slots, S * 4);
        assert_int_equal(hpd_backend_to_host(gpu, h, got.idx, S * 4), HPD_OK);
        assert_memory_equal(h, want.idx, S * 4);
        assert_int_equal(hpd_backend_to_host(gpu, h, got.first, (E + 1) * 4), HPD_OK);
        assert_memory_equal(h, want.first, (E + 1) * 4);
        float *wg = down(got.w, S);
        expect_close("moe route", wg, want.w, S, 1e-6);
        free(wg), free(h), free(logits);
        hpd_backend_free(gpu, dl);
        routing_free(cpu, &want), routing_free(gpu, &got);
    }
    /* a decode step's tokens (at most 16: one block) and the same tokens
     * first in a batch of 40 (the general path): the same experts and
     * weights bit for bit */
    const uint32_t E = 512, K = 10, N = 16;
    float *logits = rnd(40 * E, 49, 3), *dl = up(logits, 40 * E);
    routing_t small = route_on(gpu, dl, N, E, K, true), big = route_on(gpu, dl, 40, E, K, true);
    float *ws = down(small.w, N * K), *wb = down(big.w, N * K);
    assert_memory_equal(ws, wb, N * K * sizeof(float));
    uint32_t is[16 * 10], ib[16 * 10];
    assert_int_equal(hpd_backend_to_host(gpu, is, small.ids, sizeof(is)), HPD_OK);
    assert_int_equal(hpd_backend_to_host(gpu, ib, big.ids, sizeof(ib)), HPD_OK);
    assert_memory_equal(is, ib, sizeof(is));
    free(ws), free(wb), free(logits);
    hpd_backend_free(gpu, dl);
    routing_free(gpu, &small), routing_free(gpu, &big);
}

/* A cuda-bf16 backend on the GPU under test, created with environment
 * variable `env` set to `value` (NULL: none), or NULL (said) where the
 * device under test is not a GPU */
static hpd_backend_t *bf16_device(const char *env, const char *value)
{
    hpd_backend_params_t bp = {.device = "cuda-bf16:0"};
    hpd_backend_t *dev;
    if (hpd_backend_host_memory(gpu)) {
        fprintf(stderr, "device under test is not a GPU: cuda-bf16 not checked\n");
        return NULL;
    }
    if (env != NULL)
        setenv(env, value, 1);
    assert_int_equal(hpd_backend_create(&bp, &dev), HPD_OK);
    if (env != NULL)
        unsetenv(env);
    return dev;
}

/* The grouped GEMM (an MoE layer's experts in one op, the groups' rows read
 * by the device) against one GEMM per group on the same backend, bit for
 * bit: cuda's kernels and cuda-bf16's (BF16 weights on tensor cores), 16
 * experts, from 1 token (decode) to 200 (the tiled kernels; 40 take the
 * decode kernels, 32 rows a tile) */
static void test_gemm_grouped(void **state)
{
    const uint32_t E = 16, K = 4, n = 256, k = 512;
    hpd_backend_t *bf16 = bf16_device(NULL, NULL); /* (NULL: cuda's kernels alone) */
    uint16_t *wb = malloc((size_t)E * n * k * 2);
    float *wf = rnd((size_t)E * n * k, 50, 0.05f);
    for (size_t i = 0; i < (size_t)E * n * k; i++)
        wb[i] = hpd_f32_to_bf16(wf[i]);
    void *dwb = up_bytes(wb, (size_t)E * n * k * 2);
    hpd_backend_t *bes[] = {gpu, bf16};
    const uint32_t tokens[] = {1, 5, 20, 40, 200}; /* 200: 50 rows an expert, the tiled kernels */
    for (uint32_t bi = 0; bi < 2 && bes[bi] != NULL; bi++)
        for (uint32_t ti = 0; ti < HPD_ARRAY_SIZE(tokens); ti++) {
            hpd_backend_t *b = bes[bi];
            const uint32_t T = tokens[ti];
            const uint32_t S = T * K;
            float *logits = rnd((size_t)T * E, 51 + T, 3), *dl = up(logits, (size_t)T * E);
            float *x = rnd((size_t)S * k, 52 + T, 1), *dx = up(x, (size_t)S * k);
            float *dy = up(x, (size_t)S * n), *dy1 = up(x, (size_t)S * n); /* same garbage */
            routing_t r = route_on(b, dl, T, E, K, true);
            const hpd_gemm_args_t g = {.x = dx, .ldx = k, .w = dwb, .w_dtype = HPD_DTYPE_BF16,
                                       .y = dy, .ldy = n, .m = S, .n = n, .k = k};
            const hpd_gemm_grouped_args_t ga = {.g = g, .first = r.first, .n_groups = E,
                                                .max_rows = T};
            assert_int_equal(hpd_gemm_grouped(b, &ga), HPD_OK);
            uint32_t first[17];
            assert_int_equal(hpd_backend_to_host(b, first, r.first, sizeof(first)), HPD_OK);
            assert_int_equal(first[E], S);
            for (uint32_t e = 0; e < E; e++) {
                hpd_gemm_args_t ge = g;
                ge.x = dx + (size_t)first[e] * k, ge.y = dy1 + (size_t)first[e] * n;
                ge.w = (const uint16_t *)dwb + (size_t)e * n * k, ge.m = first[e + 1] - first[e];
                if (ge.m > 0)
                    assert_int_equal(hpd_gemm(b, &ge), HPD_OK);
            }
            assert_int_equal(hpd_backend_sync(b), HPD_OK); /* b's stream, not gpu's */
            float *got = down(dy, (size_t)S * n), *want = down(dy1, (size_t)S * n);
            fprintf(stderr, "%s grouped GEMM, %u tokens: %s\n", b->ops->name, T,
                    memcmp(got, want, (size_t)S * n * 4) == 0 ? "the same bits" : "DIFFERENT");
            assert_memory_equal(got, want, (size_t)S * n * 4);
            free(got), free(want), free(logits), free(x);
            hpd_backend_free(gpu, dl), hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dy);
            hpd_backend_free(gpu, dy1);
            routing_free(b, &r);
        }
    free(wb), free(wf);
    hpd_backend_free(gpu, dwb);
    if (bf16 != NULL)
        hpd_backend_destroy(bf16);
}

static void test_norms_and_elementwise(void **state)
{
    const uint32_t T = 9, H = 4, D = 128, N = T * H * D;
    float *x = rnd(N, 4, 1), *z = rnd(N, 5, 1), *w = rnd(D, 6, 0.5f);
    float *dx = up(x, N), *dz = up(z, N), *dw = up(w, D), *dy = up(x, N);
    float *ycpu = malloc(N * sizeof(float)), *got;
    hpd_view_t vx = {.p = x, .ld = H * D, .hs = D}, vz = {z, H * D, D}, vy = {ycpu, H * D, D};
    hpd_view_t gx = {.p = dx, .ld = H * D, .hs = D}, gz = {dz, H * D, D}, gy = {dy, H * D, D};

    hpd_rmsnorm_args_t rn = {.x = vx,
                             .y = vy,
                             .n_tokens = T,
                             .n_heads = H,
                             .dim = D,
                             .w = w,
                             .eps = 1e-6f,
                             .zero_centred = true};
    assert_int_equal(hpd_rmsnorm(cpu, &rn), HPD_OK);
    rn = (hpd_rmsnorm_args_t){.x = gx,
                              .y = gy,
                              .n_tokens = T,
                              .n_heads = H,
                              .dim = D,
                              .w = dw,
                              .eps = 1e-6f,
                              .zero_centred = true};
    assert_int_equal(hpd_rmsnorm(gpu, &rn), HPD_OK);
    got = down(dy, N);
    expect_close("rmsnorm", got, ycpu, N, 1e-5);
    free(got);

    hpd_gated_rmsnorm_args_t gn = {
        .x = vx, .z = vz, .y = vy, .n_tokens = T, .n_heads = H, .dim = D, .w = w, .eps = 1e-6f};
    assert_int_equal(hpd_gated_rmsnorm(cpu, &gn), HPD_OK);
    gn = (hpd_gated_rmsnorm_args_t){
        .x = gx, .z = gz, .y = gy, .n_tokens = T, .n_heads = H, .dim = D, .w = dw, .eps = 1e-6f};
    assert_int_equal(hpd_gated_rmsnorm(gpu, &gn), HPD_OK);
    got = down(dy, N);
    expect_close("gated_rmsnorm", got, ycpu, N, 1e-5);
    free(got);

    /* in place: l2norm, rope, sigmoid_mul on copies */
    memcpy(ycpu, x, N * sizeof(float));
    assert_int_equal(hpd_backend_from_host(gpu, dy, x, N * sizeof(float)), HPD_OK);
    hpd_l2norm_args_t l2 = {
        .x = vy, .n_tokens = T, .n_heads = H, .dim = D, .eps = 1e-6f, .scale = 0.125f};
    assert_int_equal(hpd_l2norm(cpu, &l2), HPD_OK);
    l2.x = gy;
    assert_int_equal(hpd_l2norm(gpu, &l2), HPD_OK);
    got = down(dy, N);
    expect_close("l2norm", got, ycpu, N, 1e-5);
    free(got);

    int32_t pos[9] = {0, 1, 2, 3, 100, 101, 4000, 4001, 65000};
    hpd_rope_args_t rp = {.x = vy,
                          .n_tokens = T,
                          .n_heads = H,
                          .head_dim = D,
                          .rot_dim = 64,
                          .positions = pos,
                          .theta = 1e7f};
    assert_int_equal(hpd_rope(cpu, &rp), HPD_OK);
    rp.x = gy;
    assert_int_equal(hpd_rope(gpu, &rp), HPD_OK);
    got = down(dy, N);
    expect_close("rope", got, ycpu, N, 1e-5);
    free(got);
    /* YaRN (factor 4, Qwen-like ramp): the same formula on both */
    rp.yarn_factor = 4.0f;
    rp.yarn_low = 9.0f;
    rp.yarn_span = 14.0f;
    rp.yarn_attention = 1.1386294f;
    rp.x = vy;
    assert_int_equal(hpd_rope(cpu, &rp), HPD_OK);
    rp.x = gy;
    assert_int_equal(hpd_rope(gpu, &rp), HPD_OK);
    got = down(dy, N);
    expect_close("rope yarn", got, ycpu, N, 1e-5);
    free(got);

    hpd_sigmoid_mul_args_t sm = {.x = vy, .gate = vz, .n_tokens = T, .n_heads = H, .dim = D};
    assert_int_equal(hpd_sigmoid_mul(cpu, &sm), HPD_OK);
    sm = (hpd_sigmoid_mul_args_t){.x = gy, .gate = gz, .n_tokens = T, .n_heads = H, .dim = D};
    assert_int_equal(hpd_sigmoid_mul(gpu, &sm), HPD_OK);
    got = down(dy, N);
    expect_close("sigmoid_mul", got, ycpu, N, 1e-5);
    free(got);

    /* SwiGLU over [T][2 * inter] */
    const uint32_t inter = H * D / 2;
    hpd_silu_mul_args_t sw = {
        .gu = x, .ldgu = H * D, .out = ycpu, .ldout = inter, .n_tokens = T, .inter = inter};
    assert_int_equal(hpd_silu_mul(cpu, &sw), HPD_OK);
    sw = (hpd_silu_mul_args_t){
        .gu = dx, .ldgu = H * D, .out = dy, .ldout = inter, .n_tokens = T, .inter = inter};
    assert_int_equal(hpd_silu_mul(gpu, &sw), HPD_OK);
    got = down(dy, T * inter);
    expect_close("silu_mul", got, ycpu, T * inter, 1e-5);
    free(got);

    /* embedding: ids in host memory */
    int32_t ids[5] = {3, 0, 7, 7, 1};
    hpd_embed_args_t em = {.ids = ids, .n = 5, .table = x, .dim = D, .out = ycpu, .ld = D};
    assert_int_equal(hpd_embed(cpu, &em), HPD_OK);
    em = (hpd_embed_args_t){.ids = ids, .n = 5, .table = dx, .dim = D, .out = dy, .ld = D};
    assert_int_equal(hpd_embed(gpu, &em), HPD_OK);
    got = down(dy, 5 * D);
    assert_memory_equal(got, ycpu, 5 * D * sizeof(float));
    free(got);

    /* GDN gating */
    const uint32_t nv = 8;
    float *g = malloc(T * nv * sizeof(float)), *beta = malloc(T * nv * sizeof(float));
    hpd_gdn_gating_args_t ga = {.a = x,
                                .b = z,
                                .lda = H * D,
                                .ldb = H * D,
                                .a_log = w,
                                .dt_bias = w + 8,
                                .g = g,
                                .beta = beta,
                                .n_tokens = T,
                                .nv = nv};
    assert_int_equal(hpd_gdn_gating(cpu, &ga), HPD_OK);
    ga = (hpd_gdn_gating_args_t){.a = dx,
                                 .b = dz,
                                 .lda = H * D,
                                 .ldb = H * D,
                                 .a_log = dw,
                                 .dt_bias = dw + 8,
                                 .g = dy,
                                 .beta = dy + T * nv,
                                 .n_tokens = T,
                                 .nv = nv};
    assert_int_equal(hpd_gdn_gating(gpu, &ga), HPD_OK);
    got = down(dy, 2 * T * nv);
    expect_close("gdn_gating g", got, g, T * nv, 1e-5);
    expect_close("gdn_gating b", got + T * nv, beta, T * nv, 1e-5);
    free(got), free(g), free(beta);
    free(x), free(z), free(w), free(ycpu);
    hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dz), hpd_backend_free(gpu, dw);
    hpd_backend_free(gpu, dy);
}

/* RoPE at positions near 2^24, where one ulp of an inverse frequency turns
 * the angle by up to a radian: the device agrees with the CPU only with the
 * same table, which both take from hpd_rope_inv_freq_table (a device powf
 * could differ from the host's by an ulp). Default and YaRN frequencies. */
static void test_rope_tables(void **state)
{
    enum { T = 6, H = 2, D = 128, N = T * H * D };
    int32_t pos[T] = {16777215, 16777000, 16000001, 12345678, 9999999, 7};
    float *x = rnd(N, 47, 1), *xc = malloc(N * sizeof(float)), *dx = up(x, N);
    for (int yarn = 0; yarn < 2; yarn++) {
        memcpy(xc, x, N * sizeof(float));
        assert_int_equal(hpd_backend_from_host(gpu, dx, x, N * sizeof(float)), HPD_OK);
        hpd_rope_args_t rp = {.x = {.p = xc, .ld = H * D, .hs = D},
                              .n_tokens = T,
                              .n_heads = H,
                              .head_dim = D,
                              .rot_dim = D,
                              .positions = pos,
                              .theta = 1e6f,
                              .yarn_factor = yarn ? 4.0f : 0.0f,
                              .yarn_low = 9.0f,
                              .yarn_span = 14.0f,
                              .yarn_attention = 1.1386294f};
        assert_int_equal(hpd_rope(cpu, &rp), HPD_OK);
        rp.x.p = dx;
        assert_int_equal(hpd_rope(gpu, &rp), HPD_OK);
        float *got = down(dx, N);
        expect_close(yarn ? "rope yarn 2^24" : "rope at 2^24", got, xc, N, 1e-5);
        free(got);
    }
    free(x), free(xc);
    hpd_backend_free(gpu, dx);
}

/* Attention's q and k norms with their RoPE in one op (norm_rope): the
 * same bits as rmsnorm, rmsnorm, rope, rope on the device, and within 1e-5
 * of the CPU; Qwen3-Next's shape (16 q heads between their gates, 2 KV
 * heads, head_dim 256, rotary over 64), positions up to 2^24, YaRN. */
static void test_norm_rope(void **state)
{
    enum { T = 6, NH = 16, NKV = 2, D = 256, LD = NH * 2 * D + NKV * D, N = T * LD };
    int32_t pos[T] = {16777215, 16777000, 16000001, 12345678, 9999999, 7};
    float *x = rnd(N, 48, 2), *wq = rnd(D, 49, 0.3f), *wk = rnd(D, 50, 0.3f);
    float *xc = malloc(N * sizeof(float)), *dx = up(x, N), *dwq = up(wq, D), *dwk = up(wk, D);
    for (int yarn = 0; yarn < 2; yarn++) {
        float *outs[2];
        for (int fused = 0; fused < 2; fused++) {
            memcpy(xc, x, N * sizeof(float));
            assert_int_equal(hpd_backend_from_host(gpu, dx, x, N * sizeof(float)), HPD_OK);
            hpd_norm_rope_args_t a = {
                .q = {.x = {.p = xc, .ld = LD, .hs = 2 * D}, .y = {.p = xc, .ld = LD, .hs = 2 * D},
                      .n_tokens = T, .n_heads = NH, .dim = D, .w = wq, .eps = 1e-6f,
                      .zero_centred = true},
                .k = {.x = {.p = xc + NH * 2 * D, .ld = LD, .hs = D},
                      .y = {.p = xc + NH * 2 * D, .ld = LD, .hs = D}, .n_tokens = T,
                      .n_heads = NKV, .dim = D, .w = wk, .eps = 1e-6f, .zero_centred = true},
                .rope = {.rot_dim = 64, .positions = pos, .theta = 1e7f,
                         .yarn_factor = yarn ? 4.0f : 0.0f, .yarn_low = 3.0f, .yarn_span = 9.0f,
                         .yarn_attention = 1.1386294f}};
            assert_int_equal(hpd_norm_rope(cpu, &a), HPD_OK);
            a.q.x.p = a.q.y.p = dx, a.k.x.p = a.k.y.p = dx + NH * 2 * D;
            a.q.w = dwq, a.k.w = dwk;
            assert_int_equal(fused ? hpd_norm_rope(gpu, &a) : hpd_norm_rope_unfused(gpu, &a),
                             HPD_OK);
            outs[fused] = down(dx, N);
            expect_close(fused ? "norm_rope fused" : "norm_rope unfused", outs[fused], xc, N,
                         1e-5);
        }
        assert_memory_equal(outs[0], outs[1], N * sizeof(float));
        free(outs[0]), free(outs[1]);
    }
    free(x), free(xc), free(wq), free(wk);
    hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dwq), hpd_backend_free(gpu, dwk);
}

/* SwiGLU over more rows than a grid's y dimension holds (65535): 66000
 * rows of 8, every one of them computed as on the CPU. */
static void test_silu_mul_many_rows(void **state)
{
    enum { T = 66000, I = 8 };
    float *gu = rnd((size_t)T * 2 * I, 42, 2), *ocpu = malloc((size_t)T * I * sizeof(float));
    float *zero = calloc((size_t)T * I, sizeof(float));
    float *dgu = up(gu, (size_t)T * 2 * I), *dout = up(zero, (size_t)T * I);
    hpd_silu_mul_args_t sw = {.gu = gu, .ldgu = 2 * I, .out = ocpu, .ldout = I, .n_tokens = T,
                              .inter = I};
    assert_int_equal(hpd_silu_mul(cpu, &sw), HPD_OK);
    sw.gu = dgu, sw.out = dout;
    assert_int_equal(hpd_silu_mul(gpu, &sw), HPD_OK);
    float *got = down(dout, (size_t)T * I);
    expect_close("silu_mul 66000", got, ocpu, (size_t)T * I, 1e-5);
    /* the rows past 65535 on their own */
    expect_close("silu_mul tail", got + (size_t)65535 * I, ocpu + (size_t)65535 * I,
                 (size_t)(T - 65535) * I, 1e-5);
    free(gu), free(ocpu), free(zero), free(got);
    hpd_backend_free(gpu, dgu), hpd_backend_free(gpu, dout);
}

/* tp_sum on the GPU: the CPU's bits for 1, 2, 4 and 8 parts, added to y
 * and not (the top of tensor parallelism's canonical sum) */
static void test_tp_sum(void **state)
{
    enum { M = 7, N = 1000 };
    for (uint32_t parts = 1; parts <= 8; parts *= 2)
        for (int acc = 0; acc < 2; acc++) {
            float *host[8], *dev[8];
            float *y = rnd((size_t)M * N, 90, 1), *ycpu = malloc((size_t)M * N * sizeof(float));
            memcpy(ycpu, y, (size_t)M * N * sizeof(float));
            float *dy = up(y, (size_t)M * N);
            hpd_tp_sum_args_t a = {.n_parts = parts, .ld_parts = N, .y = ycpu, .ldy = N, .m = M,
                                   .n = N, .accumulate = acc};
            for (uint32_t i = 0; i < parts; i++) {
                host[i] = rnd((size_t)M * N, 91 + i, 1000);
                dev[i] = up(host[i], (size_t)M * N);
                a.parts[i] = host[i];
            }
            assert_int_equal(hpd_tp_sum(cpu, &a), HPD_OK);
            a.y = dy;
            for (uint32_t i = 0; i < parts; i++)
                a.parts[i] = dev[i];
            assert_int_equal(hpd_tp_sum(gpu, &a), HPD_OK);
            float *got = down(dy, (size_t)M * N);
            if (memcmp(got, ycpu, (size_t)M * N * sizeof(float)) != 0)
                fail_msg("tp_sum of %u parts (accumulate %d): not the CPU's bits", parts, acc);
            for (uint32_t i = 0; i < parts; i++) {
                free(host[i]);
                hpd_backend_free(gpu, dev[i]);
            }
            free(y), free(ycpu), free(got);
            hpd_backend_free(gpu, dy);
        }
}

/* Inputs of the gated delta rule for two sequences on both backends: q, k
 * L2-normalised (q scaled by 1/sqrt(dk)), g = g_top - g_span * u,
 * beta = b_lo + b_span * u, two states of scale s_scale (Sc: the CPU's
 * copy), seeds seed .. seed + 5. g* are the device copies. */
typedef struct {
    uint32_t nk, nv, dk, dv;
    size_t nq, nvv, ns;
    float *q, *k, *v, *g, *beta, *S0, *Sc, *ocpu;
    float *gq, *gk, *gv, *gg, *gb, *gS, *gout;
    float *sc[2], *sg[2];
} gdn_case_t;

static void gdn_case_init(gdn_case_t *c, uint32_t T, uint32_t nk, uint32_t nv, uint32_t dk,
                          uint32_t dv, uint64_t seed, float g_top, float g_span, float b_lo,
                          float b_span, float s_scale)
{
    *c = (gdn_case_t){.nk = nk, .nv = nv, .dk = dk, .dv = dv, .nq = (size_t)T * nk * dk,
                      .nvv = (size_t)T * nv * dv, .ns = (size_t)nv * dk * dv};
    c->q = rnd(c->nq, seed, 1), c->k = rnd(c->nq, seed + 1, 1), c->v = rnd(c->nvv, seed + 2, 1);
    c->g = malloc(T * nv * sizeof(float)), c->beta = malloc(T * nv * sizeof(float));
    for (uint32_t i = 0; i < T * nv; i++) {
        c->g[i] = g_top - g_span * test_uniform(seed + 3, i);
        c->beta[i] = b_lo + b_span * test_uniform(seed + 4, i);
    }
    hpd_l2norm_args_t l2 = {.x = {.p = c->q, .ld = nk * dk, .hs = dk},
                            .n_tokens = T,
                            .n_heads = nk,
                            .dim = dk,
                            .eps = 1e-6f,
                            .scale = 1.0f / sqrtf((float)dk)};
    hpd_l2norm(cpu, &l2);
    l2 = (hpd_l2norm_args_t){.x = {.p = c->k, .ld = nk * dk, .hs = dk},
                             .n_tokens = T,
                             .n_heads = nk,
                             .dim = dk,
                             .eps = 1e-6f,
                             .scale = 1.0f};
    hpd_l2norm(cpu, &l2);
    c->S0 = rnd(2 * c->ns, seed + 5, s_scale), c->Sc = malloc(2 * c->ns * sizeof(float));
    c->ocpu = malloc(c->nvv * sizeof(float));
    memcpy(c->Sc, c->S0, 2 * c->ns * sizeof(float));
    c->gq = up(c->q, c->nq), c->gk = up(c->k, c->nq), c->gv = up(c->v, c->nvv);
    c->gg = up(c->g, T * nv), c->gb = up(c->beta, T * nv), c->gS = up(c->S0, 2 * c->ns);
    c->gout = up(c->v, c->nvv);
    c->sc[0] = c->Sc, c->sc[1] = c->Sc + c->ns, c->sg[0] = c->gS, c->sg[1] = c->gS + c->ns;
}

/* the args over the CPU's or the GPU's copies */
static hpd_gdn_args_t gdn_args(gdn_case_t *c, bool on_gpu, const hpd_seq_t *seqs, uint32_t n)
{
    const uint32_t qs = c->nk * c->dk, vs = c->nv * c->dv;
    if (on_gpu)
        return (hpd_gdn_args_t){.q = {.p = c->gq, .ld = qs, .hs = c->dk},
                                .k = {.p = c->gk, .ld = qs, .hs = c->dk},
                                .v = {.p = c->gv, .ld = vs, .hs = c->dv},
                                .g = c->gg,
                                .beta = c->gb,
                                .out = {.p = c->gout, .ld = vs, .hs = c->dv},
                                .nk = c->nk,
                                .nv = c->nv,
                                .dk = c->dk,
                                .dv = c->dv,
                                .states = c->sg,
                                .seqs = seqs,
                                .n_seqs = n};
    return (hpd_gdn_args_t){.q = {.p = c->q, .ld = qs, .hs = c->dk},
                            .k = {.p = c->k, .ld = qs, .hs = c->dk},
                            .v = {.p = c->v, .ld = vs, .hs = c->dv},
                            .g = c->g,
                            .beta = c->beta,
                            .out = {.p = c->ocpu, .ld = vs, .hs = c->dv},
                            .nk = c->nk,
                            .nv = c->nv,
                            .dk = c->dk,
                            .dv = c->dv,
                            .states = c->sc,
                            .seqs = seqs,
                            .n_seqs = n};
}

static void gdn_case_free(gdn_case_t *c)
{
    float *host[] = {c->q, c->k, c->v, c->g, c->beta, c->S0, c->Sc, c->ocpu};
    float *dev[] = {c->gq, c->gk, c->gv, c->gg, c->gb, c->gS, c->gout};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        hpd_backend_free(gpu, dev[i]);
}

/* conv1d and the recurrent rule over two sequences with their own states */
static void test_conv_and_gdn(void **state)
{
    const uint32_t C = 96, KC = 4, T = 11, nk = 2, nv = 4, dk = 64, dv = 64;
    hpd_seq_t seqs[2] = {{.n_tokens = 7, .start_pos = 100},
                         {.row = 7, .n_tokens = 4, .start_pos = 3}};
    float *x = rnd(T * C, 7, 1), *w = rnd(C * KC, 8, 0.5f);
    float *st0 = rnd(2 * C * (KC - 1), 9, 1), *ycpu = malloc(T * C * sizeof(float));
    float *stc = malloc(2 * C * (KC - 1) * sizeof(float));
    memcpy(stc, st0, 2 * C * (KC - 1) * sizeof(float));
    float *dx = up(x, T * C), *dw = up(w, C * KC), *dst = up(st0, 2 * C * (KC - 1));
    float *dy = up(x, T * C);
    float *cs[2] = {stc, stc + C * (KC - 1)}, *gs[2] = {dst, dst + C * (KC - 1)};
    hpd_conv1d_args_t cv = {.x = x,
                            .ldx = C,
                            .y = ycpu,
                            .ldy = C,
                            .w = w,
                            .channels = C,
                            .kc = KC,
                            .states = cs,
                            .seqs = seqs,
                            .n_seqs = 2};
    assert_int_equal(hpd_conv1d(cpu, &cv), HPD_OK);
    cv = (hpd_conv1d_args_t){.x = dx,
                             .ldx = C,
                             .y = dy,
                             .ldy = C,
                             .w = dw,
                             .channels = C,
                             .kc = KC,
                             .states = gs,
                             .seqs = seqs,
                             .n_seqs = 2};
    assert_int_equal(hpd_conv1d(gpu, &cv), HPD_OK);
    float *got = down(dy, T * C), *gst = down(dst, 2 * C * (KC - 1));
    expect_close("conv1d", got, ycpu, T * C, 1e-4);
    expect_close("conv1d state", gst, stc, 2 * C * (KC - 1), 1e-6);
    free(got), free(gst);

    /* the recurrent rule: q, k L2-normalised, g < 0, beta in (0, 1) */
    gdn_case_t c;
    gdn_case_init(&c, T, nk, nv, dk, dv, 10, -0.05f, 0.1f, 0.2f, 0.6f, 0.1f);
    hpd_gdn_args_t ga = gdn_args(&c, false, seqs, 2);
    assert_int_equal(hpd_gdn_recurrent(cpu, &ga), HPD_OK);
    ga = gdn_args(&c, true, seqs, 2);
    assert_int_equal(hpd_gdn_recurrent(gpu, &ga), HPD_OK);
    got = down(c.gout, c.nvv);
    float *gS = down(c.gS, 2 * c.ns);
    expect_close("gdn_recurrent", got, c.ocpu, c.nvv, 1e-4);
    expect_close("gdn state", gS, c.Sc, 2 * c.ns, 1e-4);
    free(got), free(gS);
    gdn_case_free(&c);
    free(x), free(w), free(st0), free(ycpu), free(stc);
    float *dev[] = {dx, dw, dst, dy};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        hpd_backend_free(gpu, dev[i]);
}

/* The recurrent rule with the state held in registers: dk 128 (rows split
 * over the warps) and dv 80 (a partial column tile). Near the CPU; a
 * sequence's outputs and state are the same bits alone or in a batch, and in
 * one call of 9 tokens or 9 calls of one. */
static void test_gdn_recurrent_identity(void **state)
{
    enum { NK = 2, NV = 4, DK = 128, DV = 80, T = 14 };
    hpd_seq_t seqs[2] = {{.n_tokens = 5, .start_pos = 70}, {.row = 5, .n_tokens = 9}};
    gdn_case_t c;
    gdn_case_init(&c, T, NK, NV, DK, DV, 50, -0.02f, 0.3f, 0.1f, 0.8f, 0.1f);
    const size_t ns = c.ns, vs = (size_t)NV * DV;
    hpd_gdn_args_t ga = gdn_args(&c, false, seqs, 2);
    assert_int_equal(hpd_gdn_recurrent(cpu, &ga), HPD_OK);
    hpd_gdn_args_t gg = gdn_args(&c, true, seqs, 2);
    assert_int_equal(hpd_gdn_recurrent(gpu, &gg), HPD_OK);
    float *batch = down(c.gout, c.nvv), *batch_S = down(c.gS, 2 * ns);
    expect_close("gdn_recurrent dk128", batch, c.ocpu, c.nvv, 1e-4);
    expect_close("gdn_recurrent dk128 state", batch_S, c.Sc, 2 * ns, 1e-4);

    /* sequence 1 alone, in one call, then token by token */
    float *one_S = up(c.S0 + ns, ns);
    float *sone[1] = {one_S};
    gg.states = sone;
    gg.n_seqs = 1;
    gg.seqs = &seqs[1];
    assert_int_equal(hpd_backend_memset(gpu, c.gout, 0, c.nvv * sizeof(float)), HPD_OK);
    assert_int_equal(hpd_gdn_recurrent(gpu, &gg), HPD_OK);
    float *alone = down(c.gout, c.nvv), *alone_S = down(one_S, ns);
    assert_memory_equal(alone + 5 * vs, batch + 5 * vs, 9 * vs * sizeof(float));
    assert_memory_equal(alone_S, batch_S + ns, ns * sizeof(float));
    assert_int_equal(hpd_backend_from_host(gpu, one_S, c.S0 + ns, ns * sizeof(float)), HPD_OK);
    assert_int_equal(hpd_backend_memset(gpu, c.gout, 0, c.nvv * sizeof(float)), HPD_OK);
    for (uint32_t i = 0; i < 9; i++) {
        const hpd_seq_t step = {.row = 5 + i, .n_tokens = 1, .start_pos = i};
        gg.seqs = &step;
        assert_int_equal(hpd_gdn_recurrent(gpu, &gg), HPD_OK);
    }
    float *steps = down(c.gout, c.nvv), *steps_S = down(one_S, ns);
    assert_memory_equal(steps + 5 * vs, batch + 5 * vs, 9 * vs * sizeof(float));
    assert_memory_equal(steps_S, batch_S + ns, ns * sizeof(float));
    fprintf(stderr, "gdn_recurrent: alone, in a batch and token by token give the same bits\n");
    free(batch), free(batch_S), free(alone), free(alone_S), free(steps), free(steps_S);
    hpd_backend_free(gpu, one_S);
    gdn_case_free(&c);
}

/* translation between layouts and slot copies: exact */
static void test_translate_and_copy(void **state)
{
    hpd_kv_layout_t sl = {.block_size = 64,
                          .pack_size = 1,
                          .order = HPD_KV_NHD,
                          .dtype = HPD_DTYPE_F32,
                          .n_layers = 4,
                          .n_kv_heads = 2,
                          .head_dim = 32};
    hpd_kv_layout_t dl = {.block_size = 16,
                          .pack_size = 4,
                          .order = HPD_KV_HND,
                          .dtype = HPD_DTYPE_F32,
                          .n_layers = 4,
                          .n_kv_heads = 2,
                          .head_dim = 32};
    const uint32_t tokens = 150, spages = 4 * 3, dpages = 1 * 10;
    const size_t se = spages * hpd_kv_layout_page_elems(&sl), de = dpages * hpd_kv_layout_page_elems(&dl);
    float *src = rnd(se, 16, 1), *dcpu = rnd(de, 17, 1);
    float *dsrc = up(src, se), *ddst = up(dcpu, de);
    uint32_t stab[4][3], dtab[1][10];
    const uint32_t *st[4], *dt[1];
    for (uint32_t g = 0; g < 4; g++) {
        for (uint32_t j = 0; j < 3; j++)
            stab[g][j] = (g * 3 + j) * 5 % spages; /* a permutation */
        st[g] = stab[g];
    }
    for (uint32_t j = 0; j < 10; j++)
        dtab[0][j] = (j * 3 + 1) % dpages;
    dt[0] = dtab[0];
    hpd_kv_translate_args_t a = {.src = {.layout = &sl, .pool = src, .tables = st},
                                 .dst = {.layout = &dl, .pool = dcpu, .tables = dt},
                                 .n_tokens = tokens,
                                 .zero_tail = true};
    assert_int_equal(hpd_kv_translate(cpu, &a), HPD_OK);
    a.src.pool = dsrc;
    a.dst.pool = ddst;
    assert_int_equal(hpd_kv_translate(gpu, &a), HPD_OK);
    float *got = down(ddst, de);
    assert_memory_equal(got, dcpu, de * sizeof(float));
    free(got);
    /* one layer range, starting mid-sequence (a layerwise push of a chunk) */
    a = (hpd_kv_translate_args_t){.src = {.layout = &sl, .pool = src, .tables = st, .pos = 64},
                                  .dst = {.layout = &dl, .pool = dcpu, .tables = dt, .pos = 64},
                                  .n_tokens = 64,
                                  .first_layer = 2,
                                  .n_layers = 1};
    assert_int_equal(hpd_kv_translate(cpu, &a), HPD_OK);
    a.src.pool = dsrc;
    a.dst.pool = ddst;
    assert_int_equal(hpd_kv_translate(gpu, &a), HPD_OK);
    got = down(ddst, de);
    assert_memory_equal(got, dcpu, de * sizeof(float));
    free(got);
    hpd_slot_copy_args_t sc = {.dst = ddst, .src = dsrc, .bytes = 1000 * sizeof(float)};
    assert_int_equal(hpd_slot_copy(gpu, &sc), HPD_OK);
    got = down(ddst, 1000);
    assert_memory_equal(got, src, 1000 * sizeof(float));
    free(got), free(src), free(dcpu);
    hpd_backend_free(gpu, dsrc), hpd_backend_free(gpu, ddst);
}

/* paged KV of one layer in a given layout, on both backends */
typedef struct {
    hpd_kv_layout_t l;
    uint32_t *tables[2];
    const uint32_t *ctables[2];
    float *cpu_pool, *gpu_pool;
    size_t elems;
} paged_t;

static void paged_init(paged_t *pg, uint32_t B, uint32_t P, hpd_kv_order_t order,
                       const uint32_t *lens, uint32_t n_kv_heads, uint32_t head_dim)
{
    pg->l = (hpd_kv_layout_t){.block_size = B,
                              .pack_size = P,
                              .order = order,
                              .dtype = HPD_DTYPE_F32,
                              .n_layers = 4,
                              .n_kv_heads = n_kv_heads,
                              .head_dim = head_dim};
    uint32_t pages = 0;
    for (int s = 0; s < 2; s++)
        pages += (lens[s] + B - 1) / B;
    pages = pages * 2 + 3;
    pg->elems = pages * hpd_kv_layout_page_elems(&pg->l);
    pg->cpu_pool = calloc(pg->elems, sizeof(float));
    pg->gpu_pool = up(pg->cpu_pool, pg->elems);
    for (uint32_t s = 0, next = pages - 1; s < 2; s++) {
        const uint32_t nb = (lens[s] + B - 1) / B;
        pg->tables[s] = malloc(nb * sizeof(uint32_t));
        for (uint32_t j = 0; j < nb; j++, next -= 2)
            pg->tables[s][j] = next; /* scattered, descending */
        pg->ctables[s] = pg->tables[s];
    }
}

static void paged_free(paged_t *pg)
{
    free(pg->cpu_pool);
    hpd_backend_free(gpu, pg->gpu_pool);
    free(pg->tables[0]);
    free(pg->tables[1]);
}

/* Two sequences: 150 tokens of prefill (positions 0..149) and one decode
 * row at position 77 whose first 77 tokens were stored before. */
static double attention_tol; /* set: the tolerance against the CPU (cuda-bf16's) */

static void attention_case(uint32_t NH, uint32_t NKV, uint32_t HD, uint32_t T0, uint32_t T1)
{
    const uint32_t ROWS = T0 + 1;
    const uint32_t lens[2] = {T0, T1};
    const size_t kvn = (size_t)(T0 + T1) * NKV * HD, qn = (size_t)ROWS * NH * HD;
    float *k = rnd(kvn, 20, 1), *v = rnd(kvn, 21, 1), *q = rnd(qn, 22, 1);
    float *dk = up(k, kvn), *dv = up(v, kvn), *dq = up(q, qn), *dout = up(q, qn);
    float *ocpu = malloc(qn * sizeof(float)), *first = NULL;
    const struct {
        uint32_t B, P;
        hpd_kv_order_t o;
    } layouts[] = {{64, 1, HPD_KV_NHD}, {16, 4, HPD_KV_HND}, {32, 2, HPD_KV_NHD}};

    for (size_t li = 0; li < 3; li++) {
        paged_t pg;
        paged_init(&pg, layouts[li].B, layouts[li].P, layouts[li].o, lens, NKV, HD);
        /* store: sequence 0's 150 rows, then sequence 1's 78 rows (rows
         * 150.. of k, v), as two sequences of one batch */
        hpd_seq_t st_seqs[2] = {{.n_tokens = T0}, {.row = T0, .n_tokens = T1}};
        hpd_paged_kv_t kc = {.layout = &pg.l,
                             .pool = pg.cpu_pool,
                             .member = 1 % pg.l.pack_size,
                             .block_tables = pg.ctables};
        hpd_paged_kv_t kg = {.layout = &pg.l,
                             .pool = pg.gpu_pool,
                             .member = 1 % pg.l.pack_size,
                             .block_tables = pg.ctables};
        hpd_kv_store_args_t ks = {.kv = kc,
                                  .k = {.p = k, .ld = NKV * HD, .hs = HD},
                                  .v = {.p = v, .ld = NKV * HD, .hs = HD},
                                  .seqs = st_seqs,
                                  .n_seqs = 2};
        assert_int_equal(hpd_kv_store(cpu, &ks), HPD_OK);
        ks = (hpd_kv_store_args_t){.kv = kg,
                                   .k = {.p = dk, .ld = NKV * HD, .hs = HD},
                                   .v = {.p = dv, .ld = NKV * HD, .hs = HD},
                                   .seqs = st_seqs,
                                   .n_seqs = 2};
        assert_int_equal(hpd_kv_store(gpu, &ks), HPD_OK);
        float *pool = down(pg.gpu_pool, pg.elems);
        assert_memory_equal(pool, pg.cpu_pool, pg.elems * sizeof(float));
        free(pool);

        /* attention: the 150 prefill rows, then the decode row (q row 150) */
        hpd_seq_t at_seqs[2] = {{.n_tokens = T0}, {.row = T0, .n_tokens = 1, .start_pos = T1 - 1}};
        hpd_attention_args_t at = {.kv = kc,
                                   .q = {.p = q, .ld = NH * HD, .hs = HD},
                                   .out = {.p = ocpu, .ld = NH * HD, .hs = HD},
                                   .n_heads = NH,
                                   .scale = 0.125f,
                                   .seqs = at_seqs,
                                   .n_seqs = 2};
        assert_int_equal(hpd_attention(cpu, &at), HPD_OK);
        at = (hpd_attention_args_t){.kv = kg,
                                    .q = {.p = dq, .ld = NH * HD, .hs = HD},
                                    .out = {.p = dout, .ld = NH * HD, .hs = HD},
                                    .n_heads = NH,
                                    .scale = 0.125f,
                                    .seqs = at_seqs,
                                    .n_seqs = 2};
        assert_int_equal(hpd_attention(gpu, &at), HPD_OK);
        float *got = down(dout, qn);
        expect_close("attention", got, ocpu, qn,
                     attention_tol > 0 ? attention_tol : T0 > 512 ? 3e-5 : 1e-5);
        /* the same bits in every layout */
        if (first == NULL)
            first = got;
        else {
            assert_memory_equal(got, first, qn * sizeof(float));
            free(got);
        }
        /* the decode row alone gives the same bits as inside the batch */
        at.seqs = &at_seqs[1];
        at.kv.block_tables = &pg.ctables[1];
        at.n_seqs = 1;
        assert_int_equal(hpd_backend_memset(gpu, dout, 0, qn * sizeof(float)), HPD_OK);
        assert_int_equal(hpd_attention(gpu, &at), HPD_OK);
        float *one = down(dout + (size_t)T0 * NH * HD, NH * HD);
        assert_memory_equal(one, first + (size_t)T0 * NH * HD, NH * HD * sizeof(float));
        free(one);
        /* prompt rows alone (a decode row's block each) give the bits they
         * had in the prompt's blocks: the first, a middle and the last */
        const uint32_t pick[3] = {0, T0 / 2, T0 - 1};
        for (int i = 0; i < 3; i++) {
            const hpd_seq_t alone = {.row = pick[i], .n_tokens = 1, .start_pos = pick[i]};
            at.seqs = &alone;
            at.kv.block_tables = &pg.ctables[0];
            assert_int_equal(hpd_attention(gpu, &at), HPD_OK);
            float *row = down(dout + (size_t)pick[i] * NH * HD, NH * HD);
            assert_memory_equal(row, first + (size_t)pick[i] * NH * HD, NH * HD * sizeof(float));
            free(row);
        }
        paged_free(&pg);
    }
    fprintf(stderr, "attention %u heads / %u KV heads, head_dim %u, %u + %u keys: the same bits "
            "in 3 layouts, and for rows alone as in the batch\n", NH, NKV, HD, T0, T1);
    free(first), free(k), free(v), free(q), free(ocpu);
    hpd_backend_free(gpu, dk), hpd_backend_free(gpu, dv), hpd_backend_free(gpu, dq);
    hpd_backend_free(gpu, dout);
}

/* Short rows (one split of the split-KV pass); rows of 1300 and 1100 keys
 * (three splits of 512, a group of 8 query heads per KV head); a head_dim
 * that is not a multiple of 4 (the per-row kernel). */
static void test_kv_store_and_attention(void **state)
{
    attention_case(8, 2, 64, 150, 78);
    attention_case(16, 2, 128, 1300, 1100);
    attention_case(4, 2, 66, 40, 530);
}

/* cuda-bf16's attention on tensor cores (bf16 q, k, v and probabilities):
 * within 1e-2 relative RMS of the CPU's fp32, the same bits in 3 layouts and
 * for the decode row alone as in a batch with 150 (or 1300) prompt rows;
 * head_dim 64, 128 and Qwen3-Next's 256 */
static void test_bf16_attention(void **state)
{
    hpd_backend_t *dev = bf16_device(NULL, NULL), *saved = gpu;
    if (dev == NULL)
        return;
    gpu = dev, attention_tol = 1e-2;
    attention_case(8, 2, 64, 150, 78);
    attention_case(16, 2, 128, 1300, 1100);
    attention_case(16, 2, 256, 600, 40);
    gpu = saved, attention_tol = 0;
    hpd_backend_destroy(dev);
}

/* One layer of one KV head in NHD pages of block_size, F32 */
static hpd_kv_layout_t one_head_layout(uint32_t block_size, uint32_t head_dim)
{
    return (hpd_kv_layout_t){.block_size = block_size,
                             .pack_size = 1,
                             .order = HPD_KV_NHD,
                             .dtype = HPD_DTYPE_F32,
                             .n_layers = 1,
                             .n_kv_heads = 1,
                             .head_dim = head_dim};
}

/* Block tables beyond a staging slot (1 MiB at first): 128 sequences of
 * 2100 tokens at block size 1 (the ops take any block size) carry 1.08 MB
 * of tables after 1.5 KB of query rows. An op reserves its whole metadata
 * up front and the ring grows to hold it; the old ring checked only an
 * op's first array against the slot, and these ops failed. The tables
 * repeat 64 shared pages; each sequence's last position has a page of its
 * own, which kv_store writes and attention reads with the rest. Values
 * near 1 keep the sums over 2100 keys free of cancellation. */
static void test_large_metadata(void **state)
{
    enum { S = 128, L = 2100, HD = 8, SHARED = 64, POOL = SHARED + S };
    const hpd_kv_layout_t l = one_head_layout(1, HD);
    const size_t elems = (size_t)POOL * hpd_kv_layout_page_elems(&l), n = (size_t)S * HD;
    float *pool = rnd(elems, 43, 0.25f), *k = rnd(n, 44, 0.25f), *v = rnd(n, 45, 0.25f);
    float *q = rnd(n, 46, 1), *ocpu = malloc(n * sizeof(float));
    for (size_t i = 0; i < elems; i++)
        pool[i] += 1.0f;
    for (size_t i = 0; i < n; i++)
        k[i] += 1.0f, v[i] += 1.0f;
    float *dpool = up(pool, elems), *dk = up(k, n), *dv = up(v, n), *dq = up(q, n);
    float *dout = up(q, n);
    uint32_t *tables = malloc((size_t)S * L * sizeof(uint32_t));
    const uint32_t *bt[S];
    hpd_seq_t seqs[S];
    for (uint32_t s = 0; s < S; s++) {
        for (uint32_t j = 0; j + 1 < L; j++)
            tables[(size_t)s * L + j] = (s * 7 + j * 13) % SHARED;
        tables[(size_t)s * L + L - 1] = SHARED + s;
        bt[s] = tables + (size_t)s * L;
        seqs[s] = (hpd_seq_t){.row = s, .n_tokens = 1, .start_pos = L - 1};
    }
    assert_true((size_t)S * L * sizeof(uint32_t) > (1u << 20));

    hpd_paged_kv_t kc = {.layout = &l, .pool = pool, .member = 0, .block_tables = bt};
    hpd_paged_kv_t kg = {.layout = &l, .pool = dpool, .member = 0, .block_tables = bt};
    hpd_kv_store_args_t ks = {.kv = kc,
                              .k = {.p = k, .ld = HD, .hs = HD},
                              .v = {.p = v, .ld = HD, .hs = HD},
                              .seqs = seqs,
                              .n_seqs = S};
    assert_int_equal(hpd_kv_store(cpu, &ks), HPD_OK);
    ks.kv = kg, ks.k.p = dk, ks.v.p = dv;
    assert_int_equal(hpd_kv_store(gpu, &ks), HPD_OK);
    float *got_pool = down(dpool, elems);
    assert_memory_equal(got_pool, pool, elems * sizeof(float));

    hpd_attention_args_t at = {.kv = kc,
                               .q = {.p = q, .ld = HD, .hs = HD},
                               .out = {.p = ocpu, .ld = HD, .hs = HD},
                               .n_heads = 1,
                               .scale = 0.35355339f,
                               .seqs = seqs,
                               .n_seqs = S};
    assert_int_equal(hpd_attention(cpu, &at), HPD_OK);
    at.kv = kg, at.q.p = dq, at.out.p = dout;
    assert_int_equal(hpd_attention(gpu, &at), HPD_OK);
    float *got = down(dout, n);
    expect_close("attention, 1 MB of tables", got, ocpu, n, 1e-5);
    free(pool), free(k), free(v), free(q), free(ocpu), free(tables), free(got_pool), free(got);
    float *dev[] = {dpool, dk, dv, dq, dout};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        hpd_backend_free(gpu, dev[i]);
}

/* One recorded step: mid = src[i1], then dst = mid[i2] (the second reads
 * what the first wrote), n rows of D floats, the index arrays metadata. */
static hpd_status_t step_gathers(uint32_t bucket, bool run, bool *ran, const float *src,
                                 float *mid, float *dst, const uint32_t *i1, const uint32_t *i2,
                                 uint32_t n, uint32_t D)
{
    hpd_status_t st = hpd_backend_step_begin(gpu, bucket);
    if (st != HPD_OK)
        return st;
    const hpd_gather_args_t a = {.src = src, .ld_src = D, .idx = i1, .n = n, .dim = D,
                                 .dst = mid, .ld_dst = D};
    const hpd_gather_args_t b = {.src = mid, .ld_src = D, .idx = i2, .n = n, .dim = D,
                                 .dst = dst, .ld_dst = D};
    assert_int_equal(hpd_gather(gpu, &a), HPD_OK);
    assert_int_equal(hpd_gather(gpu, &b), HPD_OK);
    return hpd_backend_step_end(gpu, run, ran);
}

/* dst (n rows of D on the device) equals src[i1[i2[r]]], or all `fill` */
static void expect_gathered(const float *dst, const float *src, const uint32_t *i1,
                            const uint32_t *i2, uint32_t n, uint32_t D, const float *fill)
{
    float *got = down(dst, (size_t)n * D);
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t d = 0; d < D; d++) {
            const float want = fill ? *fill : src[(size_t)i1[i2[r]] * D + d];
            if (memcmp(&got[(size_t)r * D + d], &want, sizeof(float)) != 0)
                fail_msg("row %u [%u]: %g, expected %g", r, d, got[(size_t)r * D + d], want);
        }
    free(got);
}

/* Steps recorded as graphs (docs/kernels.md "The decode step"): a recorded
 * step runs what it recorded, with its metadata; the same bucket again with
 * other metadata runs with the new (the kept graph updated, the upload
 * made); steps of 12 buckets, then the first again; a step of 100 chained
 * gathers (four segments, each run while the next is recorded); a step
 * whose metadata outgrows the arena (its segment runs, the arena grows, the
 * step goes on), at its first op and at its last; run false runs nothing of
 * a one-segment step; eight steps enqueued behind a long GEMM, each with
 * its own metadata, without a wait (the arena is rewritten only after the
 * last step's copies).
 */
/* A step whose first op grows the work buffer (a fresh backend's
 * attention over two 512-key splits): the segment ends before any kernel
 * was recorded, and the op's metadata, staged just before, must go up all
 * the same (it did not: the kernels read the arena's stale bytes). Twice,
 * at two positions, against the op run outside a step. */
static void test_step_work_growth(void **state)
{
    enum { HD = 64, B = 64, KEYS = 600, PAGES = (KEYS + B - 1) / B, NH = 4 };
    hpd_backend_params_t bp = {.device = "cuda:0"};
    hpd_backend_t *fresh;
    bool ran = false;
    if (hpd_backend_host_memory(gpu)) {
        print_message("device under test is not a GPU: nothing to check\n");
        return;
    }
    assert_int_equal(hpd_backend_create(&bp, &fresh), HPD_OK);
    if (hpd_backend_step_begin(fresh, 0) == HPD_ERR_UNSUPPORTED) {
        print_message("%s records no steps: nothing to check\n", fresh->ops->name);
        hpd_backend_destroy(fresh);
        return;
    }
    assert_int_equal(hpd_backend_step_end(fresh, false, &ran), HPD_OK);
    const hpd_kv_layout_t l = one_head_layout(B, HD);
    const size_t elems = (size_t)PAGES * hpd_kv_layout_page_elems(&l);
    float *pool = rnd(elems, 71, 1), *q = rnd(NH * HD, 72, 1);
    float *dpool = up(pool, elems), *dq = up(q, NH * HD), *dout = up(q, NH * HD);
    float *dref = up(q, NH * HD);
    uint32_t table[PAGES];
    for (uint32_t i = 0; i < PAGES; i++)
        table[i] = PAGES - 1 - i;
    const uint32_t *tables[1] = {table};
    for (int round = 0; round < 2; round++) {
        const hpd_seq_t seq = {.row = 0, .n_tokens = 1, .start_pos = round ? 550 : KEYS - 1};
        hpd_attention_args_t a = {
            .kv = {.layout = &l, .pool = dpool, .member = 0, .block_tables = tables},
            .q = {.p = dq, .ld = NH * HD, .hs = HD},
            .out = {.p = dout, .ld = NH * HD, .hs = HD},
            .n_heads = NH,
            .scale = 0.125f,
            .seqs = &seq,
            .n_seqs = 1};
        assert_int_equal(hpd_backend_step_begin(fresh, 1), HPD_OK);
        assert_int_equal(hpd_attention(fresh, &a), HPD_OK);
        assert_int_equal(hpd_backend_step_end(fresh, true, &ran), HPD_OK);
        assert_true(ran);
        a.out.p = dref;
        assert_int_equal(hpd_attention(fresh, &a), HPD_OK);
        assert_int_equal(hpd_backend_sync(fresh), HPD_OK);
        float *got = down(dout, NH * HD), *want = down(dref, NH * HD);
        if (memcmp(got, want, NH * HD * sizeof(float)) != 0)
            fail_msg("round %d: attention recorded first in a step differs from the op alone",
                     round);
        free(got), free(want);
    }
    hpd_backend_destroy(fresh);
    free(pool), free(q);
    hpd_backend_free(gpu, dpool), hpd_backend_free(gpu, dq), hpd_backend_free(gpu, dout);
    hpd_backend_free(gpu, dref);
}

static void test_step_graph(void **state)
{
    enum { T = 64, D = 8, BIG = 24000, Q = 8 };
    bool ran = false;
    if (hpd_backend_step_begin(gpu, 0) == HPD_ERR_UNSUPPORTED) {
        print_message("%s records no steps: nothing to check\n", gpu->ops->name);
        return;
    }
    assert_int_equal(hpd_backend_step_end(gpu, false, &ran), HPD_OK);
    assert_false(ran);
    float *src = rnd((size_t)BIG * D, 51, 1), nan_fill;
    memset(&nan_fill, 0xff, sizeof(nan_fill));
    float *dsrc = up(src, (size_t)BIG * D);
    void *dmid, *ddst;
    assert_int_equal(hpd_backend_alloc(gpu, (size_t)BIG * D * sizeof(float), &dmid), HPD_OK);
    assert_int_equal(hpd_backend_alloc(gpu, (size_t)BIG * D * sizeof(float), &ddst), HPD_OK);
    uint32_t *i1 = malloc(BIG * sizeof(uint32_t)), *i2 = malloc(BIG * sizeof(uint32_t));

    for (uint32_t round = 0; round < 14; round++) {
        const uint32_t n = T - round, bucket = round < 12 ? round % 12 : round - 12;
        for (uint32_t r = 0; r < n; r++)
            i1[r] = (r * 7 + round * 3) % BIG, i2[r] = (r * 5 + round) % n;
        assert_int_equal(step_gathers(bucket, true, &ran, dsrc, dmid, ddst, i1, i2, n, D),
                         HPD_OK);
        assert_true(ran);
        expect_gathered(ddst, src, i1, i2, n, D, NULL);
    }
    /* 100 gathers in one step, each reading the last one's rows: x_{i+1} =
     * x_i[perm], alternating between mid and dst */
    uint32_t perm[T];
    for (uint32_t r = 0; r < T; r++)
        perm[r] = (r * 37 + 11) % T;
    assert_int_equal(hpd_backend_copy(gpu, dmid, dsrc, (size_t)T * D * sizeof(float)), HPD_OK);
    assert_int_equal(hpd_backend_step_begin(gpu, 7), HPD_OK);
    for (int i = 0; i < 100; i++) {
        const hpd_gather_args_t a = {.src = i % 2 ? ddst : dmid, .ld_src = D, .idx = perm, .n = T,
                                     .dim = D, .dst = i % 2 ? dmid : ddst, .ld_dst = D};
        assert_int_equal(hpd_gather(gpu, &a), HPD_OK);
    }
    assert_int_equal(hpd_backend_step_end(gpu, true, &ran), HPD_OK);
    assert_true(ran);
    {
        uint32_t at[T]; /* row r of x_100 is row at[r] of src */
        for (uint32_t r = 0; r < T; r++) {
            at[r] = r;
            for (int i = 0; i < 100; i++)
                at[r] = perm[at[r]];
        }
        uint32_t ident[T];
        for (uint32_t r = 0; r < T; r++)
            ident[r] = r;
        expect_gathered(dmid, src, at, ident, T, D, NULL);
    }
    /* metadata of 2 x 96 KB: more than the arena holds at first */
    for (uint32_t r = 0; r < BIG; r++)
        i1[r] = (r * 11 + 5) % BIG, i2[r] = (r * 13 + 1) % BIG;
    assert_int_equal(step_gathers(20, true, &ran, dsrc, dmid, ddst, i1, i2, BIG, D), HPD_OK);
    assert_true(ran);
    expect_gathered(ddst, src, i1, i2, BIG, D, NULL);
    /* the step's last op outgrows the arena (1.2 MB of indices): the segment
     * it opens midway runs too */
    {
        enum { HUGE = 300000 };
        uint32_t *h1 = malloc(HUGE * sizeof(uint32_t)), *hid = malloc(HUGE * sizeof(uint32_t));
        void *dh;
        for (uint32_t r = 0; r < HUGE; r++)
            h1[r] = (r * 7 + 3) % BIG, hid[r] = r;
        assert_int_equal(hpd_backend_alloc(gpu, (size_t)HUGE * D * sizeof(float), &dh), HPD_OK);
        assert_int_equal(hpd_backend_step_begin(gpu, 21), HPD_OK);
        const hpd_gather_args_t small = {.src = dsrc, .ld_src = D, .idx = i1, .n = T, .dim = D,
                                         .dst = dmid, .ld_dst = D};
        const hpd_gather_args_t huge = {.src = dsrc, .ld_src = D, .idx = h1, .n = HUGE, .dim = D,
                                        .dst = dh, .ld_dst = D};
        assert_int_equal(hpd_gather(gpu, &small), HPD_OK);
        assert_int_equal(hpd_gather(gpu, &huge), HPD_OK);
        assert_int_equal(hpd_backend_step_end(gpu, true, &ran), HPD_OK);
        assert_true(ran);
        expect_gathered(dh, src, h1, hid, HUGE, D, NULL);
        hpd_backend_free(gpu, dh);
        free(h1), free(hid);
    }
    assert_int_equal(hpd_backend_memset(gpu, ddst, 0xff, (size_t)BIG * D * sizeof(float)),
                     HPD_OK);
    assert_int_equal(step_gathers(1, false, &ran, dsrc, dmid, ddst, i1, i2, T, D), HPD_OK);
    assert_false(ran);
    expect_gathered(ddst, src, i1, i2, T, D, &nan_fill);

    /* behind a GEMM of some milliseconds, Q steps without a wait: each
     * step's metadata must reach the device before the host reuses it */
    enum { M = 4096, K = 4096 };
    float *w = rnd((size_t)M * K, 52, 0.02f), *dw = up(w, (size_t)M * K);
    float *dx = up(w, (size_t)M * K), *dy;
    assert_int_equal(hpd_backend_alloc(gpu, (size_t)M * M * sizeof(float), (void **)&dy), HPD_OK);
    const hpd_gemm_args_t g = {.x = dx, .ldx = K, .w = dw, .y = dy, .ldy = M, .m = M, .n = M,
                               .k = K};
    assert_int_equal(hpd_gemm(gpu, &g), HPD_OK);
    uint32_t *j1 = malloc((size_t)Q * T * sizeof(uint32_t)), *j2 = malloc((size_t)Q * T * 4);
    for (uint32_t q = 0; q < Q; q++) {
        for (uint32_t r = 0; r < T; r++)
            j1[q * T + r] = (r * 3 + q * 17) % BIG, j2[q * T + r] = (r * 9 + q) % T;
        assert_int_equal(step_gathers(3, true, &ran, dsrc, (float *)dmid + (size_t)q * T * D,
                                      (float *)ddst + (size_t)q * T * D, j1 + q * T, j2 + q * T,
                                      T, D),
                         HPD_OK);
        assert_true(ran);
        memset(j1 + q * T, 0, T * sizeof(uint32_t)); /* the host's copy is free again */
    }
    for (uint32_t q = 0; q < Q; q++) {
        for (uint32_t r = 0; r < T; r++)
            j1[q * T + r] = (r * 3 + q * 17) % BIG;
        expect_gathered((float *)ddst + (size_t)q * T * D, src, j1 + q * T, j2 + q * T, T, D,
                        NULL);
    }
    free(src), free(i1), free(i2), free(w), free(j1), free(j2);
    hpd_backend_free(gpu, dsrc), hpd_backend_free(gpu, dmid), hpd_backend_free(gpu, ddst);
    hpd_backend_free(gpu, dw), hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dy);
}

/* The chunked rule on `gpu` against the CPU backend's (relative RMS below
 * tol), over two sequences that start off the 64 grid; then one sequence
 * computed in one pass equals the same sequence computed as two calls split
 * at a multiple of 64, and alone equals inside the batch. */
static void gdn_chunked_case(uint32_t dk, uint32_t dv, double tol)
{
    enum { NK = 2, NV = 4, T = 300 };
    hpd_seq_t seqs[2] = {{.n_tokens = 200, .start_pos = 40}, {.row = 200, .n_tokens = 100}};
    gdn_case_t c;
    gdn_case_init(&c, T, NK, NV, dk, dv, 30, -0.02f, 0.2f, 0.1f, 0.8f, 0.05f);
    const size_t nvv = c.nvv, ns = c.ns;
    hpd_gdn_args_t ga = gdn_args(&c, false, seqs, 2);
    assert_int_equal(hpd_gdn_chunked(cpu, &ga), HPD_OK);
    hpd_gdn_args_t gg = gdn_args(&c, true, seqs, 2);
    assert_int_equal(hpd_gdn_chunked(gpu, &gg), HPD_OK);
    float *got = down(c.gout, nvv), *gS = down(c.gS, 2 * ns);
    expect_close("gdn_chunked", got, c.ocpu, nvv, tol);
    expect_close("gdn_chunked S", gS, c.Sc, 2 * ns, tol);

    /* sequence 1 (positions 0..99) alone, in one call and split at 64 */
    hpd_seq_t whole = {.row = 200, .n_tokens = 100}, a = {200, 64, 0}, b = {264, 36, 64};
    float *one_S = up(c.S0 + ns, ns);
    float *sone[1] = {one_S};
    gg.states = sone;
    gg.seqs = &whole;
    gg.n_seqs = 1;
    assert_int_equal(hpd_backend_memset(gpu, c.gout, 0, nvv * sizeof(float)), HPD_OK);
    assert_int_equal(hpd_gdn_chunked(gpu, &gg), HPD_OK);
    float *alone = down(c.gout, nvv), *alone_S = down(one_S, ns);
    const size_t off = (size_t)200 * NV * dv, n1 = (size_t)100 * NV * dv;
    assert_memory_equal(alone + off, got + off, n1 * sizeof(float));
    assert_memory_equal(alone_S, gS + ns, ns * sizeof(float));
    assert_int_equal(hpd_backend_from_host(gpu, one_S, c.S0 + ns, ns * sizeof(float)), HPD_OK);
    gg.seqs = &a;
    assert_int_equal(hpd_gdn_chunked(gpu, &gg), HPD_OK);
    gg.seqs = &b;
    assert_int_equal(hpd_gdn_chunked(gpu, &gg), HPD_OK);
    float *split = down(c.gout, nvv), *split_S = down(one_S, ns);
    assert_memory_equal(split + off, got + off, n1 * sizeof(float));
    assert_memory_equal(split_S, gS + ns, ns * sizeof(float));
    fprintf(stderr, "gdn_chunked on %s, dk %u: alone, in a batch and resumed at 64 give the "
            "same bits\n", gpu->ops->name, dk);
    free(got), free(gS), free(alone), free(alone_S), free(split), free(split_S);
    hpd_backend_free(gpu, one_S);
    gdn_case_free(&c);
}

static void test_gdn_chunked(void **state)
{
    gdn_chunked_case(128, 128, 1e-4);
}

/* cuda-bf16's chunked rule: the state pass on tensor cores (bf16 operands,
 * fp32 state) for dk 128 and 64 (dv 40: a partial column tile), in fp32 for
 * dk 96; within 5e-3 of the CPU's fp32 (fla's own bf16 tolerance), the
 * same bits alone, in a batch and resumed at 64; with the pass's chunk
 * buffers as chosen (two here: few blocks) and with one
 * (HPD_CUDA_GDN_BUFFERS=1) */
static void test_bf16_gdn_chunked(void **state)
{
    hpd_backend_t *saved = gpu;
    for (int one = 0; one < 2; one++) {
        hpd_backend_t *dev = bf16_device(one ? "HPD_CUDA_GDN_BUFFERS" : NULL, "1");
        if (dev == NULL)
            return;
        gpu = dev;
        gdn_chunked_case(128, 128, 5e-3);
        gdn_chunked_case(64, 40, 5e-3);
        if (!one)
            gdn_chunked_case(96, 64, 1e-4);
        gpu = saved;
        hpd_backend_destroy(dev);
    }
}

/* Greedy rows equal the CPU's argmax (ties to the lowest id); sampled rows
 * are deterministic, alone or in a batch, stay inside top-k and top-p, and
 * top_k = 1 is greedy. */
static void test_sample(void **state)
{
    enum { V = 50000, R = 6 };
    float *logits = rnd((size_t)V * R, 40, 3);
    logits[123] = logits[4567] = 50.0f; /* a tie in row 0: 123 wins */
    logits[5 * (size_t)V + 999] = 40.0f; /* row 5 is peaked: top_p 0.05 keeps 999 alone */
    float *dl = up(logits, (size_t)V * R);
    hpd_sampling_t params[R] = {{.top_p = 1, .seed = 1},
                                {.top_p = 1, .seed = 2},
                                {.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 3},
                                {.temperature = 1.0f, .top_p = 1, .seed = 4},
                                {.temperature = 0.7f, .top_p = 1, .top_k = 1, .seed = 5},
                                {.temperature = 1.2f, .top_p = 0.05f, .seed = 6}};
    uint64_t pos[R] = {10, 11, 12, 13, 14, 15};
    int32_t want[R], got[R], again[R];
    hpd_sample_args_t a = {.logits = logits,
                           .ld = V,
                           .n_rows = R,
                           .vocab = V,
                           .params = params,
                           .positions = pos,
                           .out = want};
    assert_int_equal(hpd_sample(cpu, &a), HPD_OK);
    a = (hpd_sample_args_t){.logits = dl,
                            .ld = V,
                            .n_rows = R,
                            .vocab = V,
                            .params = params,
                            .positions = pos,
                            .out = got};
    assert_int_equal(hpd_sample(gpu, &a), HPD_OK);
    assert_int_equal(got[0], 123);
    assert_int_equal(got[0], want[0]);
    assert_int_equal(got[1], want[1]);
    assert_int_equal(got[4], want[4]); /* top_k 1 */
    assert_int_equal(got[5], 999);
    assert_int_equal(want[5], 999);
    a.out = again;
    assert_int_equal(hpd_sample(gpu, &a), HPD_OK);
    assert_memory_equal(again, got, sizeof(got));
    /* row 2 alone */
    int32_t alone;
    a = (hpd_sample_args_t){.logits = dl + 2 * (size_t)V,
                            .ld = V,
                            .n_rows = 1,
                            .vocab = V,
                            .params = &params[2],
                            .positions = &pos[2],
                            .out = &alone};
    assert_int_equal(hpd_sample(gpu, &a), HPD_OK);
    assert_int_equal(alone, got[2]);
    /* inside the kept sets: rank of the token among the row's logits */
    for (int r = 2; r < R; r++) {
        const float *x = logits + (size_t)r * V, mine = x[got[r]];
        uint32_t above = 0;
        for (uint32_t i = 0; i < V; i++)
            above += x[i] > mine;
        if (r == 2)
            assert_true(above < 40);
        if (r == 4 || r == 5) /* top_k 1; top_p 0.05 of a peaked row */
            assert_int_equal(above, 0);
        fprintf(stderr, "sample row %d: token %d (cpu %d), %u logits above it\n", r, got[r],
                want[r], above);
    }
    free(logits);
    hpd_backend_free(gpu, dl);

    /* 8 logits 0..7 at temperature 1, drawn at 4000 positions (one logits
     * row read by every draw: ld 0): each token's count is within 5 sigma
     * of 4000 softmax(i) */
    enum { D = 4000 };
    float small[8];
    double z = 0;
    for (int i = 0; i < 8; i++)
        z += exp(small[i] = (float)i);
    float *ds = up(small, 8);
    hpd_sampling_t *sp = malloc(D * sizeof(*sp));
    uint64_t *sps = malloc(D * sizeof(*sps));
    int32_t *tok = malloc(D * sizeof(*tok));
    for (int i = 0; i < D; i++) {
        sp[i] = (hpd_sampling_t){.temperature = 1.0f, .top_p = 1.0f, .seed = 99};
        sps[i] = (uint64_t)i;
    }
    a = (hpd_sample_args_t){
        .logits = ds, .n_rows = D, .vocab = 8, .params = sp, .positions = sps, .out = tok};
    assert_int_equal(hpd_sample(gpu, &a), HPD_OK);
    uint32_t count[8] = {0};
    for (int i = 0; i < D; i++) {
        assert_true(tok[i] >= 0 && tok[i] < 8);
        count[tok[i]]++;
    }
    for (int i = 0; i < 8; i++) {
        const double p = exp(i) / z, mean = D * p, sd = sqrt(D * p * (1 - p));
        fprintf(stderr, "token %d: drawn %u times, expected %.1f\n", i, count[i], mean);
        assert_true(fabs(count[i] - mean) <= 5 * sd + 1);
    }
    free(sp), free(sps), free(tok);
    hpd_backend_free(gpu, ds);
}

/* Greedy ties go to the lowest id, as on the CPU, also where the device's
 * block reduction meets the tied ids out of order: with 1024 ids, one per
 * thread, the tree (step s pairs slot t with slot t + s) carries 900 into
 * the left operand before it meets 5, and likewise 1000 before 3 and 512
 * before 1; keeping the left operand on a tie gave the higher id. */
static void test_greedy_ties(void **state)
{
    enum { V = 1024, R = 3 };
    static const uint32_t tie[R][2] = {{5, 900}, {1000, 3}, {512, 1}};
    float *logits = rnd((size_t)V * R, 41, 1);
    for (int r = 0; r < R; r++)
        logits[r * V + tie[r][0]] = logits[r * V + tie[r][1]] = 50.0f;
    float *dl = up(logits, (size_t)V * R);
    hpd_sampling_t params[R] = {{.top_p = 1}, {.top_p = 1}, {.top_p = 1}};
    uint64_t pos[R] = {0, 1, 2};
    int32_t want[R], got[R];
    hpd_sample_args_t a = {.logits = logits, .ld = V, .n_rows = R, .vocab = V,
                           .params = params, .positions = pos, .out = want};
    assert_int_equal(hpd_sample(cpu, &a), HPD_OK);
    a.logits = dl, a.out = got;
    assert_int_equal(hpd_sample(gpu, &a), HPD_OK);
    for (int r = 0; r < R; r++) {
        const int32_t lowest = (int32_t)(tie[r][0] < tie[r][1] ? tie[r][0] : tie[r][1]);
        if (want[r] != lowest || got[r] != lowest)
            fail_msg("row %d: ids %u and %u tie; greedy gave %d (cpu %d), expected %d", r,
                     tie[r][0], tie[r][1], got[r], want[r], lowest);
    }
    free(logits);
    hpd_backend_free(gpu, dl);
}

/* The pieces' hashes of device memory (a receiver's pages, hashed where
 * they landed) equal libxxhash's XXH3-64 of the same bytes: the short and
 * long forms, spans of several 64 KiB pieces, unaligned starts, empty
 * spans; 600 spans of one page each in one call, as a transfer's pages. */
static void test_hash_pieces(void **state)
{
    enum { N = 1 << 21, MANY = 600 };
    uint8_t *host = malloc(N), *dev;
    for (uint32_t i = 0; i < N; i++)
        host[i] = (uint8_t)((i * 2654435761u) >> 11);
    assert_int_equal(hpd_backend_alloc(gpu, N, (void **)&dev), HPD_OK);
    assert_int_equal(hpd_backend_from_host(gpu, dev, host, N), HPD_OK);
    static const uint64_t lens[] = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025,
                                    4096, 65535, 65536, 65537, 200001, 1 << 20};
    enum { L = sizeof(lens) / sizeof(lens[0]) };
    hpd_hash_span_t *spans = malloc(MANY * sizeof(*spans));
    uint64_t *got = malloc(MANY * 20 * sizeof(uint64_t));
    uint32_t n = 0;
    for (uint32_t al = 0; al < 8; al += 3)
        for (uint32_t l = 0; l < L; l++)
            spans[n++] = (hpd_hash_span_t){dev + 4096 * l + al, lens[l]};
    for (int round = 0; round < 2; round++) {
        uint64_t k = 0;
        hpd_hash_pieces_args_t a = {spans, n, got};
        assert_int_equal(hpd_backend_hash_pieces(gpu, &a), HPD_OK);
        for (uint32_t i = 0; i < n; i++)
            for (uint64_t off = 0; off < spans[i].bytes; off += HPD_HASH_PIECE_BYTES, k++) {
                const uint64_t len = HPD_MIN(HPD_HASH_PIECE_BYTES, spans[i].bytes - off);
                const uint64_t want =
                    XXH3_64bits(host + ((const uint8_t *)spans[i].ptr - dev) + off, len);
                if (got[k] != want)
                    fail_msg("span %u (%llu bytes at +%td): piece at %llu: %016llx, libxxhash "
                             "%016llx", i, (unsigned long long)spans[i].bytes,
                             (const uint8_t *)spans[i].ptr - dev, (unsigned long long)off,
                             (unsigned long long)got[k], (unsigned long long)want);
            }
        /* then a transfer's worth of 16 KiB pages */
        n = 0;
        for (uint32_t i = 0; i < MANY; i++)
            spans[n++] = (hpd_hash_span_t){dev + (uint64_t)(i * 7919 % 120) * 16384, 16384};
    }
    free(host);
    free(spans);
    free(got);
    hpd_backend_free(gpu, dev);
}

/* host_register of memory pinned already (UCX pins the buffers it
 * allocates) succeeds, leaves no CUDA error behind for the next op's launch
 * check, and the memory is usable; host_unregister then leaves it pinned
 * (its owner unpins it). Memory the backend pinned itself it unpins. */
static void test_host_register(void **state)
{
    enum { N = 1 << 16 };
    const size_t bytes = N * sizeof(float);
    unsigned int flags;
    if (hpd_backend_host_memory(gpu)) {
        fprintf(stderr, "device under test is not a GPU: host_register not checked\n");
        return;
    }
    float *theirs = aligned_alloc(4096, bytes), *mine = aligned_alloc(4096, bytes);
    float *x = rnd(N, 48, 1), *dx = up(x, N);
    assert_int_equal(cudaHostRegister(theirs, bytes, cudaHostRegisterMapped), cudaSuccess);
    assert_int_equal(hpd_backend_host_register(gpu, theirs, bytes), HPD_OK);
    /* the next op's launch check sees no error; then a copy into the memory */
    hpd_silu_mul_args_t sw = {.gu = dx, .ldgu = 2, .out = dx + N / 2, .ldout = 1,
                              .n_tokens = 16, .inter = 1};
    assert_int_equal(hpd_silu_mul(gpu, &sw), HPD_OK);
    assert_int_equal(hpd_backend_copy(gpu, theirs, dx, bytes), HPD_OK);
    assert_int_equal(hpd_backend_sync(gpu), HPD_OK);
    float *want = down(dx, N);
    assert_memory_equal(theirs, want, bytes);
    hpd_backend_host_unregister(gpu, theirs);
    assert_int_equal(cudaHostGetFlags(&flags, theirs), cudaSuccess); /* still pinned */
    assert_int_equal(cudaHostUnregister(theirs), cudaSuccess);

    /* memory the backend pins for two users stays pinned until the second
     * lets it go */
    assert_int_equal(hpd_backend_host_register(gpu, mine, bytes), HPD_OK);
    assert_int_equal(hpd_backend_host_register(gpu, mine, bytes), HPD_OK);
    assert_int_equal(cudaHostGetFlags(&flags, mine), cudaSuccess);
    hpd_backend_host_unregister(gpu, mine);
    assert_int_equal(cudaHostGetFlags(&flags, mine), cudaSuccess); /* one user left */
    hpd_backend_host_unregister(gpu, mine);
    assert_int_not_equal(cudaHostGetFlags(&flags, mine), cudaSuccess); /* unpinned */
    cudaGetLastError(); /* the error just expected */

    /* a range pinned only in part by someone else is refused */
    float *part = aligned_alloc(4096, 2 * bytes);
    assert_int_equal(cudaHostRegister(part, bytes, cudaHostRegisterMapped), cudaSuccess);
    assert_int_not_equal(hpd_backend_host_register(gpu, part, 2 * bytes), HPD_OK);
    cudaGetLastError(); /* whatever the runtime answered for the overlap */
    assert_int_equal(cudaHostUnregister(part), cudaSuccess);
    free(theirs), free(mine), free(part), free(x), free(want);
    hpd_backend_free(gpu, dx);
}

/* Pool memory (alloc_pool: the page and slot pools, which peers write over
 * RDMA) holds what is copied in as any device memory, and on a GPU comes
 * from cudaMalloc, not from the stream-ordered pool (whose memory GPUDirect
 * RDMA cannot register): the driver names no mempool for it, where it does
 * for alloc's memory, and SYNC_MEMOPS is set on it. */
static void test_pool_memory(void **state)
{
    enum { N = 4096 };
    float *x = rnd(N, 49, 1), *dp, *da;
    assert_int_equal(hpd_backend_alloc_pool(gpu, N * sizeof(float), (void **)&dp), HPD_OK);
    assert_int_equal(hpd_backend_from_host(gpu, dp, x, N * sizeof(float)), HPD_OK);
    float *got = down(dp, N);
    assert_memory_equal(got, x, N * sizeof(float));
    assert_int_equal(hpd_backend_alloc(gpu, N * sizeof(float), (void **)&da), HPD_OK);
    if (!hpd_backend_host_memory(gpu)) {
        typedef CUresult (*get_attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult found;
        assert_int_equal(cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000,
                                                          cudaEnableDefault, &found),
                         cudaSuccess);
        assert_int_equal(found, cudaDriverEntryPointSuccess);
        const get_attr_fn get = (get_attr_fn)fn;
        CUmemoryPool of_pool = (CUmemoryPool)1, of_alloc = NULL;
        /* booleans: written as an int or narrower, read here from zeroed 8 bytes */
        unsigned long long sync = 0, rdma = 0;
        assert_int_equal(get(&of_pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                             (CUdeviceptr)(uintptr_t)dp), CUDA_SUCCESS);
        assert_int_equal(get(&of_alloc, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                             (CUdeviceptr)(uintptr_t)da), CUDA_SUCCESS);
        assert_int_equal(get(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)dp),
                         CUDA_SUCCESS);
        get(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, (CUdeviceptr)(uintptr_t)dp);
        fprintf(stderr, "pool memory: mempool %p (alloc's: %p), sync_memops %llu, "
                "GPUDirect RDMA capable %llu\n", (void *)of_pool, (void *)of_alloc, sync, rdma);
        if (of_pool != NULL)
            fail_msg("pool memory comes from a stream-ordered mempool (%p), expected cudaMalloc",
                     (void *)of_pool);
        if (of_alloc == NULL)
            fail_msg("alloc's memory names no mempool: the check above cannot tell them apart");
        if (sync != 1)
            fail_msg("pool memory has SYNC_MEMOPS %llu, expected 1 (the backend's log says why)",
                     sync);
    }
    free(x), free(got);
    hpd_backend_free_pool(gpu, dp);
    hpd_backend_free(gpu, da);
}

/* cuda-fast: cuBLAS GEMM agrees with the CPU within fp32 error */
static void test_fast_gemm(void **state)
{
    hpd_backend_params_t fp = {.device = "cuda-fast:0"};
    hpd_backend_t *fast;
    if (hpd_backend_host_memory(gpu)) {
        fprintf(stderr, "device under test is not a GPU: cuda-fast not checked\n");
        return;
    }
    assert_int_equal(hpd_backend_create(&fp, &fast), HPD_OK);
    assert_string_equal(fast->ops->name, "cuda-fast");
    const uint32_t m = 37, n = 300, k = 200;
    float *x = rnd(m * k, 1, 1), *w = rnd(n * k, 2, 0.1f), *ycpu = calloc(m * n, sizeof(float));
    float *dx = up(x, m * k), *dw = up(w, n * k), *dy = up(ycpu, m * n);
    hpd_gemm_args_t a = {.x = x, .ldx = k, .w = w, .y = ycpu, .ldy = n, .m = m, .n = n, .k = k};
    assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
    a = (hpd_gemm_args_t){.x = dx, .ldx = k, .w = dw, .y = dy, .ldy = n, .m = m, .n = n, .k = k};
    assert_int_equal(hpd_gemm(fast, &a), HPD_OK);
    assert_int_equal(hpd_backend_sync(fast), HPD_OK);
    float *got = down(dy, m * n);
    expect_close("gemm cublas", got, ycpu, m * n, 1e-5);
    free(x), free(w), free(ycpu), free(got);
    hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dw), hpd_backend_free(gpu, dy);
    hpd_backend_destroy(fast);
}

/* cuda-fast with BF16 weights past 32 rows: tensor cores, x rounded to
 * bf16 (to nearest even); against the CPU's fp32 GEMM of the rounded x
 * times the same weights (fp32 error only), y's gaps kept; and rows alone
 * (33 and more) equal the same rows in a batch of 150, bit for bit. */
static void test_fast_gemm_tensor_cores(void **state)
{
    hpd_backend_params_t fp = {.device = "cuda-fast:0"};
    hpd_backend_t *fast;
    if (hpd_backend_host_memory(gpu)) {
        fprintf(stderr, "device under test is not a GPU: tensor cores not checked\n");
        return;
    }
    assert_int_equal(hpd_backend_create(&fp, &fast), HPD_OK);
    if (strcmp(fast->ops->numerics, "cublas-bf16-tensor-cores") != 0) {
        fprintf(stderr, "cuda-fast has no tensor-core GEMM here (numerics %s): not checked\n",
                fast->ops->numerics);
        hpd_backend_destroy(fast);
        return;
    }
    const uint32_t M = 150, n = 300, k = 264, ldx = k + 4, ldy = n + 3;
    float *x = rnd((size_t)M * ldx, 51, 1), *w = rnd((size_t)n * k, 52, 0.1f);
    float *y0 = rnd((size_t)M * ldy, 53, 1), *xr = malloc((size_t)M * ldx * sizeof(float));
    float *ycpu = malloc((size_t)M * ldy * sizeof(float));
    uint16_t *wq = malloc((size_t)n * k * 2);
    void *dw;
    hpd_dtype_from_f32(HPD_DTYPE_BF16, w, wq, (size_t)n * k);
    for (size_t i = 0; i < (size_t)M * ldx; i++)
        xr[i] = hpd_bf16_to_f32(hpd_cpu_round_bf16(x[i]));
    memcpy(ycpu, y0, (size_t)M * ldy * sizeof(float));
    hpd_gemm_args_t a = {.x = xr, .ldx = ldx, .w = wq, .w_dtype = HPD_DTYPE_BF16, .y = ycpu,
                         .ldy = ldy, .m = M, .n = n, .k = k};
    assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
    assert_int_equal(hpd_backend_alloc(gpu, (size_t)n * k * 2, &dw), HPD_OK);
    assert_int_equal(hpd_backend_from_host(gpu, dw, wq, (size_t)n * k * 2), HPD_OK);
    float *dx = up(x, (size_t)M * ldx), *dy = up(y0, (size_t)M * ldy);
    a.x = dx, a.w = dw, a.y = dy;
    assert_int_equal(hpd_gemm(fast, &a), HPD_OK);
    assert_int_equal(hpd_backend_sync(fast), HPD_OK);
    float *full = down(dy, (size_t)M * ldy);
    expect_close("gemm tensor cores", full, ycpu, (size_t)M * ldy, 1e-5);
    for (uint32_t r = 0; r < M; r++) /* the gaps of y kept */
        for (uint32_t c = n; c < ldy; c++)
            assert_true(full[(size_t)r * ldy + c] == y0[(size_t)r * ldy + c]);
    const uint32_t ms[] = {33, 64, 65, 130};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(ms); i++) {
        float *dp = up(y0, (size_t)ms[i] * ldy);
        a.y = dp, a.m = ms[i];
        assert_int_equal(hpd_gemm(fast, &a), HPD_OK);
        assert_int_equal(hpd_backend_sync(fast), HPD_OK);
        float *part = down(dp, (size_t)ms[i] * ldy);
        if (memcmp(part, full, (size_t)ms[i] * ldy * sizeof(float)) != 0)
            fail_msg("tensor cores: the first %u rows alone differ from the batch of %u", ms[i],
                     M);
        free(part);
        hpd_backend_free(gpu, dp);
    }
    free(x), free(w), free(y0), free(xr), free(ycpu), free(wq), free(full);
    hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dy), hpd_backend_free(gpu, dw);
    hpd_backend_destroy(fast);
}

/* cuda-bf16: BF16 weights, and FP8 ones dequantised to bf16(q * scale), on
 * tensor cores for every batch size, x rounded to bf16; against the CPU's
 * fp32 GEMM of the rounded x and those weights (fp32 error only),
 * y's gaps kept; rows alone (m = 1 .. 40, through the decode kernel up to
 * 32, and 64, 130) equal the same rows in a batch of 150 (the tiled kernel)
 * bit for bit, with x rows off 16-byte alignment, at k of 1000 and 264
 * (half a step of 16 past the last whole one) and 2048. */
static void test_bf16_device(void **state)
{
    hpd_backend_t *dev = bf16_device(NULL, NULL);
    if (dev == NULL)
        return;
    assert_string_equal(dev->ops->numerics, "bf16-tensor-cores");
    /* the tiled kernel's wide blocks, forced (a GEMM of this size takes the
     * narrow ones: its wide blocks would not fill the GPU) */
    hpd_backend_t *wide = bf16_device("HPD_CUDA_GEMM_BN", "256");
    const uint32_t M = 150, n = 300, ks[] = {1000, 264, 2048}, B = 128;
    for (int fp8 = 0; fp8 < 2; fp8++)
        for (size_t ki = 0; ki < HPD_ARRAY_SIZE(ks); ki++) {
            const uint32_t k = ks[ki], ldx = k + 3, ldy = n + 3, sld = (k + B - 1) / B;
            float *x = rnd((size_t)M * ldx, 61, 1), *w = rnd((size_t)n * k, 62, fp8 ? 300 : 0.1f);
            float *y0 = rnd((size_t)M * ldy, 63, 1), *xr = malloc((size_t)M * ldx * sizeof(float));
            float *ycpu = malloc((size_t)M * ldy * sizeof(float)), *scale = rnd((size_t)n * sld, 64, 1);
            uint8_t *wq = malloc((size_t)n * k * 2);
            uint16_t *wref = malloc((size_t)n * k * 2);
            void *dw, *ds = NULL;
            for (size_t i = 0; i < (size_t)n * sld; i++)
                scale[i] = 0.0005f + 0.001f * fabsf(scale[i]);
            /* the weights as the tensor cores take them: BF16, or FP8
             * dequantised to bf16(q * scale) */
            hpd_dtype_from_f32(fp8 ? HPD_DTYPE_F8_E4M3 : HPD_DTYPE_BF16, w, wq, (size_t)n * k);
            for (size_t i = 0; i < (size_t)n * k; i++)
                wref[i] = fp8 ? hpd_cpu_round_bf16(hpd_f8e4m3_to_f32(wq[i]) *
                                                   scale[i / k * sld + i % k / B])
                              : ((const uint16_t *)wq)[i];
            for (size_t i = 0; i < (size_t)M * ldx; i++)
                xr[i] = hpd_bf16_to_f32(hpd_cpu_round_bf16(x[i]));
            memcpy(ycpu, y0, (size_t)M * ldy * sizeof(float));
            hpd_gemm_args_t a = {.x = xr, .ldx = ldx, .w = wref, .w_dtype = HPD_DTYPE_BF16,
                                 .y = ycpu, .ldy = ldy, .m = M, .n = n, .k = k,
                                 .accumulate = true};
            assert_int_equal(hpd_gemm(cpu, &a), HPD_OK);
            const size_t wbytes = (size_t)n * k * (fp8 ? 1 : 2);
            assert_int_equal(hpd_backend_alloc(dev, wbytes, &dw), HPD_OK);
            assert_int_equal(hpd_backend_from_host(dev, dw, wq, wbytes), HPD_OK);
            float *dx = up(x, (size_t)M * ldx), *dy = up(y0, (size_t)M * ldy);
            a.x = dx, a.w = dw, a.y = dy;
            if (fp8) {
                ds = up(scale, (size_t)n * sld);
                a.w_dtype = HPD_DTYPE_F8_E4M3, a.w_scale = ds, a.w_scale_ld = sld, a.w_block = B;
            }
            assert_int_equal(hpd_gemm(dev, &a), HPD_OK);
            assert_int_equal(hpd_backend_sync(dev), HPD_OK);
            float *full = down(dy, (size_t)M * ldy);
            char name[40];
            snprintf(name, sizeof(name), "cuda-bf16 %s k=%u", fp8 ? "fp8" : "bf16", k);
            expect_close(name, full, ycpu, (size_t)M * ldy, 1e-5);
            for (uint32_t r = 0; r < M; r++) /* the gaps of y kept */
                for (uint32_t c = n; c < ldy; c++)
                    assert_true(full[(size_t)r * ldy + c] == y0[(size_t)r * ldy + c]);
            float *dwy = up(y0, (size_t)M * ldy);
            a.y = dwy;
            assert_int_equal(hpd_gemm(wide, &a), HPD_OK);
            assert_int_equal(hpd_backend_sync(wide), HPD_OK);
            float *wy = down(dwy, (size_t)M * ldy);
            if (memcmp(wy, full, (size_t)M * ldy * sizeof(float)) != 0)
                fail_msg("%s: the wide blocks' batch of %u differs from the narrow blocks'", name,
                         M);
            free(wy);
            hpd_backend_free(gpu, dwy);
            static const uint32_t big[] = {64, 130};
            for (uint32_t i = 0; i < 40 + HPD_ARRAY_SIZE(big); i++) {
                const uint32_t m = i < 40 ? i + 1 : big[i - 40];
                const uint32_t off = (M - m) / 2; /* x rows at an odd stride: off alignment */
                float *dp = up(y0 + (size_t)off * ldy, (size_t)m * ldy);
                a.x = dx + (size_t)off * ldx, a.y = dp, a.m = m;
                assert_int_equal(hpd_gemm(dev, &a), HPD_OK);
                assert_int_equal(hpd_backend_sync(dev), HPD_OK);
                float *part = down(dp, (size_t)m * ldy);
                if (memcmp(part, full + (size_t)off * ldy, (size_t)m * ldy * sizeof(float)) != 0)
                    fail_msg("%s: rows %u..%u alone (m = %u) differ from the batch of %u", name,
                             off, off + m - 1, m, M);
                free(part);
                hpd_backend_free(gpu, dp);
            }
            free(x), free(w), free(y0), free(xr), free(ycpu), free(wq), free(wref), free(full);
            free(scale);
            hpd_backend_free(gpu, dx), hpd_backend_free(gpu, dy), hpd_backend_free(dev, dw);
            if (ds != NULL)
                hpd_backend_free(gpu, ds);
        }
    hpd_backend_destroy(wide);
    hpd_backend_destroy(dev);
}

int main(void)
{
    hpd_backend_params_t cp = {.device = "cpu", .n_threads = 1};
    /* HPD_TEST_ONLY=PATTERN runs the matching cases only (scripts/gpu-check.sh
     * runs racecheck case by case: the whole binary takes it too long) */
    if (getenv("HPD_TEST_ONLY") != NULL)
        cmocka_set_test_filter(getenv("HPD_TEST_ONLY"));
    /* recorded steps (test_step_graph), whatever the environment */
    setenv("HPD_CUDA_GRAPHS", "1", 1);
    gpu = test_open_device("cuda:0", 0, NULL);
    if (hpd_backend_create(&cp, &cpu) != HPD_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_half_weights),
        cmocka_unit_test(test_fp8_gemm),
        cmocka_unit_test(test_gemm_batch_invariance),
        cmocka_unit_test(test_moe_ops),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_gemm_grouped),
        cmocka_unit_test(test_norms_and_elementwise),
        cmocka_unit_test(test_rope_tables),
        cmocka_unit_test(test_norm_rope),
        cmocka_unit_test(test_silu_mul_many_rows),
        cmocka_unit_test(test_tp_sum),
        cmocka_unit_test(test_conv_and_gdn),
        cmocka_unit_test(test_gdn_recurrent_identity),
        cmocka_unit_test(test_translate_and_copy),
        cmocka_unit_test(test_kv_store_and_attention),
        cmocka_unit_test(test_large_metadata),
        cmocka_unit_test(test_step_graph),
        cmocka_unit_test(test_step_work_growth),
        cmocka_unit_test(test_gdn_chunked),
        cmocka_unit_test(test_bf16_gdn_chunked),
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_greedy_ties),
        cmocka_unit_test(test_hash_pieces),
        cmocka_unit_test(test_host_register),
        cmocka_unit_test(test_pool_memory),
        cmocka_unit_test(test_fast_gemm),
        cmocka_unit_test(test_fast_gemm_tensor_cores),
        cmocka_unit_test(test_bf16_device),
        cmocka_unit_test(test_bf16_attention),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    hpd_backend_destroy(gpu);
    hpd_backend_destroy(cpu);
    return rc;
}
