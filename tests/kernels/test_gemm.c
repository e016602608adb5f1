/* GEMM against a double-precision reference, batch invariance (a row's
 * bits do not depend on how many rows are computed with it), and BF16 / F16
 * weights giving the bits of the same weights stored as F32; the bf16
 * products of device cpu-bf16 against their defined sequence, bit for bit,
 * and against a double-precision reference of the rounded x. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/test_helpers.h"

static hpd_backend_t *cpu(uint32_t threads)
{
    hpd_backend_params_t p = {.device = "cpu", .n_threads = threads};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_cpu_create(&p, &be), HPD_OK);
    return be;
}

static hpd_backend_t *cpu_bf16(uint32_t threads)
{
    hpd_backend_params_t p = {.device = "cpu-bf16", .n_threads = threads};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_create(&p, &be), HPD_OK);
    assert_string_equal(be->ops->name, "cpu-bf16");
    return be;
}

static void test_matches_reference(void **state)
{
    const uint32_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {4, 2, 8}, {9, 33, 100},
                                  {17, 70, 256}, {64, 96, 64}, {5, 1030, 24}};
    hpd_backend_t *be = cpu(2);

    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const uint32_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *x = malloc((size_t)m * k * 4), *w = malloc((size_t)n * k * 4);
        float *y = malloc((size_t)m * n * 4), *ref = malloc((size_t)m * n * 4);
        test_fill(x, (size_t)m * k, 1 + s, 1.0f);
        test_fill(w, (size_t)n * k, 100 + s, 1.0f);
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < n; j++) {
                double acc = 0;
                for (uint32_t t = 0; t < k; t++)
                    acc += (double)x[(size_t)i * k + t] * w[(size_t)j * k + t];
                ref[(size_t)i * n + j] = (float)acc;
            }
        hpd_gemm_args_t a = {.x = x, .ldx = k, .w = w, .y = y, .ldy = n, .m = m, .n = n, .k = k};
        assert_int_equal(hpd_gemm(be, &a), HPD_OK);
        assert_rel_rms_below(y, ref, (size_t)m * n, 1e-6);
        /* accumulate adds onto y */
        a.accumulate = true;
        assert_int_equal(hpd_gemm(be, &a), HPD_OK);
        for (size_t i = 0; i < (size_t)m * n; i++)
            ref[i] *= 2;
        assert_rel_rms_below(y, ref, (size_t)m * n, 1e-6);
        free(x), free(w), free(y), free(ref);
    }
    hpd_backend_destroy(be);
}

static void test_batch_invariant(void **state)
{
    const uint32_t M = 37, N = 77, K = 203; /* M > 16: the large-batch kernel too */
    hpd_backend_t *be1 = cpu(1), *be2 = cpu(2);
    float *x = malloc(M * K * 4), *w = malloc(N * K * 4);
    float *full = malloc(M * N * 4), *part = malloc(M * N * 4);

    test_fill(x, M * K, 7, 1.0f);
    test_fill(w, N * K, 8, 1.0f);
    hpd_gemm_args_t a = {.x = x, .ldx = K, .w = w, .y = full, .ldy = N, .m = M, .n = N, .k = K};
    assert_int_equal(hpd_gemm(be2, &a), HPD_OK);
    /* every sub-batch [r0, r0 + m) reproduces its rows exactly, on 1 or 2 threads */
    for (uint32_t r0 = 0; r0 < M; r0++) {
        for (uint32_t m = 1; r0 + m <= M; m += 3) {
            hpd_gemm_args_t b = {.x = x + (size_t)r0 * K,
                                 .ldx = K,
                                 .w = w,
                                 .y = part,
                                 .ldy = N,
                                 .m = m,
                                 .n = N,
                                 .k = K};
            assert_int_equal(hpd_gemm((m & 1) ? be1 : be2, &b), HPD_OK);
            assert_memory_equal(part, full + (size_t)r0 * N, (size_t)m * N * 4);
        }
    }
    free(x), free(w), free(full), free(part);
    hpd_backend_destroy(be1);
    hpd_backend_destroy(be2);
}

/* Weights in BF16 or F16 are widened exactly as they are read: y has the
 * bits of the same weights widened to F32 first, for every kernel shape
 * (4x2, 1x4, 1x1, tails of k), accumulate or not, on 1 and 2 threads. */
static void test_half_weights_exact(void **state)
{
    const uint32_t shapes[][3] = {{1, 1, 1},   {3, 5, 7},    {4, 2, 8},   {9, 33, 100},
                                  {13, 77, 203}, {5, 1030, 24}, {2, 64, 1024}};
    const hpd_dtype_t dtypes[] = {HPD_DTYPE_BF16, HPD_DTYPE_F16};
    hpd_backend_t *be1 = cpu(1), *be2 = cpu(2);

    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (size_t d = 0; d < 2; d++) {
            const uint32_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            const size_t nk = (size_t)n * k;
            float *x = malloc((size_t)m * k * 4), *w = malloc(nk * 4);
            float *y16 = malloc((size_t)m * n * 4), *y32 = malloc((size_t)m * n * 4);
            uint16_t *h = malloc(nk * 2);
            test_fill(x, (size_t)m * k, 11 + s, 1.0f);
            test_fill(w, nk, 200 + s, 1.0f);
            hpd_dtype_from_f32(dtypes[d], w, h, nk); /* rounded, then widened back */
            hpd_dtype_to_f32(dtypes[d], h, w, nk);
            for (int acc = 0; acc < 2; acc++) {
                test_fill(y16, (size_t)m * n, 300 + s, 1.0f);
                memcpy(y32, y16, (size_t)m * n * 4);
                hpd_gemm_args_t a = {.x = x, .ldx = k, .w = w, .y = y32, .ldy = n, .m = m,
                                     .n = n, .k = k, .accumulate = acc};
                assert_int_equal(hpd_gemm(be2, &a), HPD_OK);
                a.w = h;
                a.w_dtype = dtypes[d];
                a.y = y16;
                assert_int_equal(hpd_gemm(acc ? be1 : be2, &a), HPD_OK);
                if (memcmp(y16, y32, (size_t)m * n * 4) != 0)
                    fail_msg("%s weights, %ux%ux%u, accumulate %d: not the F32 bits",
                             hpd_dtype_name(dtypes[d]), m, n, k, acc);
            }
            free(x), free(w), free(y16), free(y32), free(h);
        }
    hpd_backend_destroy(be1);
    hpd_backend_destroy(be2);
}

/* FP8 E4M3 weights with block scales, dequantised inside the GEMM: against
 * a float64 reference of q * scale (the block scaling), and bit for bit the
 * F32 GEMM over the weights dequantised in fp32 first (one rounding of
 * q * scale, as transformers), for blocks that do and do not divide k. */
static void test_fp8_weights(void **state)
{
    const uint32_t shapes[][4] = {{1, 40, 96, 32}, {5, 70, 200, 64}, {9, 33, 130, 16},
                                  {4, 64, 512, 128}};
    hpd_backend_t *be = cpu(2);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const uint32_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], B = shapes[s][3];
        const uint32_t ld = (k + B - 1) / B;
        const size_t nk = (size_t)n * k;
        float *x = malloc((size_t)m * k * 4), *w = malloc(nk * 4), *scale = malloc(n * ld * 4);
        float *y8 = malloc((size_t)m * n * 4), *y32 = malloc((size_t)m * n * 4);
        double *ref = malloc((size_t)m * n * sizeof(double));
        float *refl = malloc((size_t)m * n * 4);
        uint8_t *q = malloc(nk);
        test_fill(x, (size_t)m * k, 31 + s, 1.0f);
        test_fill(w, nk, 41 + s, 300.0f);
        test_fill(scale, n * ld, 51 + s, 1.0f);
        for (size_t i = 0; i < n * ld; i++)
            scale[i] = 0.01f + fabsf(scale[i]); /* per row, per column block */
        hpd_dtype_from_f32(HPD_DTYPE_F8_E4M3, w, q, nk);
        for (uint32_t r = 0; r < n; r++)
            for (uint32_t c = 0; c < k; c++)
                w[(size_t)r * k + c] = hpd_f8e4m3_to_f32(q[(size_t)r * k + c]) *
                                       scale[r * ld + c / B];
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < n; j++) {
                double acc = 0;
                for (uint32_t c = 0; c < k; c++)
                    acc += (double)x[(size_t)i * k + c] *
                           ((double)hpd_f8e4m3_to_f32(q[(size_t)j * k + c]) *
                            (double)scale[j * ld + c / B]);
                ref[(size_t)i * n + j] = acc;
                refl[(size_t)i * n + j] = (float)acc;
            }
        hpd_gemm_args_t a = {.x = x, .ldx = k, .w = q, .w_dtype = HPD_DTYPE_F8_E4M3,
                             .w_scale = scale, .w_scale_ld = ld, .w_block = B, .y = y8,
                             .ldy = n, .m = m, .n = n, .k = k};
        assert_int_equal(hpd_gemm(be, &a), HPD_OK);
        assert_rel_rms_below(y8, refl, (size_t)m * n, 1e-6);
        a = (hpd_gemm_args_t){.x = x, .ldx = k, .w = w, .y = y32, .ldy = n, .m = m, .n = n,
                              .k = k};
        assert_int_equal(hpd_gemm(be, &a), HPD_OK);
        if (memcmp(y8, y32, (size_t)m * n * 4) != 0)
            fail_msg("fp8 %ux%ux%u block %u: not the bits of the dequantised F32 GEMM", m, n, k,
                     B);
        free(x), free(w), free(scale), free(y8), free(y32), free(ref), free(refl), free(q);
    }
    /* FP8 without its scales is refused, not read */
    float y = 0;
    const uint8_t one = 0x38;
    hpd_gemm_args_t bad = {.x = &y, .ldx = 1, .w = &one, .w_dtype = HPD_DTYPE_F8_E4M3, .y = &y,
                           .ldy = 1, .m = 1, .n = 1, .k = 1};
    assert_int_equal(hpd_gemm(be, &bad), HPD_ERR_INVALID_ARG);
    /* nor with a block of 0 columns; a block of 1 is a scale per weight */
    const float two = 2.0f;
    bad.w_scale = &two, bad.w_scale_ld = 1, bad.w_block = 0;
    assert_int_equal(hpd_gemm(be, &bad), HPD_ERR_INVALID_ARG);
    float x1 = 3.0f;
    bad.x = &x1, bad.w_block = 1;
    assert_int_equal(hpd_gemm(be, &bad), HPD_OK);
    assert_true(y == 6.0f); /* 3 x (1.0 x 2) */
    hpd_backend_destroy(be);
}

/* gemm_sum (a row-parallel product's groups in one op) against what it
 * stands for: each group's gemm, then the tree's adds as tp_sum and the
 * final add, bit for bit; every weight dtype, 1 to 8 groups of uneven
 * widths, batches that take each kernel shape, with and without
 * accumulate, on 1 and 2 threads; a count of groups that is not a power of
 * two is refused. */
static void test_gemm_sum(void **state)
{
    (void)state;
    static const hpd_dtype_t dts[] = {HPD_DTYPE_F32, HPD_DTYPE_BF16, HPD_DTYPE_F16,
                                      HPD_DTYPE_F8_E4M3};
    static const uint32_t ms[] = {1, 3, 6, 21};
    const uint32_t n = 70, ks[8] = {24, 40, 17, 64, 8, 33, 48, 16}, B = 16;
    for (uint32_t run = 0; run < 4; run++) { /* cpu, cpu-bf16; 1 and 2 threads */
        const uint32_t threads = 1 + run % 2;
        hpd_backend_t *be = run < 2 ? cpu(threads) : cpu_bf16(threads);
        for (size_t d = 0; d < 4; d++)
            for (uint32_t G = 1; G <= 8; G *= 2)
                for (size_t mi = 0; mi < 4; mi++)
                    for (int acc = 0; acc < 2; acc++) {
                        const uint32_t m = ms[mi];
                        uint32_t K = 0;
                        for (uint32_t j = 0; j < G; j++)
                            K += ks[j];
                        float *x = malloc((size_t)m * K * 4), *wf = malloc((size_t)n * K * 4);
                        void *w = malloc((size_t)n * K * 4);
                        float *scale = malloc((size_t)n * K * 4);
                        float *y0 = malloc((size_t)m * n * 4), *got = malloc((size_t)m * n * 4);
                        float *want = malloc((size_t)m * n * 4);
                        float *parts[8];
                        test_fill(x, (size_t)m * K, 7 + d + G, 1.0f);
                        test_fill(wf, (size_t)n * K, 9 + d + G, 3.0f);
                        test_fill(scale, (size_t)n * K, 11 + d, 1.0f);
                        test_fill(y0, (size_t)m * n, 13, 5.0f);
                        hpd_dtype_from_f32(dts[d], wf, w, (size_t)n * K);
                        hpd_gemm_sum_args_t gs = {.n_groups = G, .m = m, .n = n, .y = got,
                                                  .ldy = n, .accumulate = acc};
                        size_t off = 0, soff = 0;
                        uint32_t col = 0;
                        for (uint32_t j = 0; j < G; j++) {
                            const uint32_t sld = (ks[j] + B - 1) / B;
                            gs.g[j] = (hpd_gemm_args_t){
                                .x = x + col, .ldx = K,
                                .w = (char *)w + off * hpd_dtype_size(dts[d]),
                                .w_dtype = dts[d], .k = ks[j]};
                            if (dts[d] == HPD_DTYPE_F8_E4M3) {
                                for (size_t i = 0; i < (size_t)n * sld; i++)
                                    scale[soff + i] = 0.01f + fabsf(scale[soff + i]);
                                gs.g[j].w_scale = scale + soff;
                                gs.g[j].w_scale_ld = sld;
                                gs.g[j].w_block = B;
                            }
                            off += (size_t)n * ks[j];
                            soff += (size_t)n * sld;
                            col += ks[j];
                            parts[j] = malloc((size_t)m * n * 4);
                            hpd_gemm_args_t one = gs.g[j];
                            one.y = parts[j], one.ldy = n, one.m = m, one.n = n;
                            assert_int_equal(hpd_gemm(be, &one), HPD_OK);
                        }
                        memcpy(got, y0, (size_t)m * n * 4);
                        memcpy(want, y0, (size_t)m * n * 4);
                        if (G == 4 && acc) {
                            /* called by one thread of an active parallel
                             * region: OpenMP gives it a team of one,
                             * whatever it asks for */
                            hpd_status_t st = HPD_OK;
                            omp_set_max_active_levels(1);
#pragma omp parallel num_threads(2)
#pragma omp single
                            st = hpd_gemm_sum(be, &gs);
                            assert_int_equal(st, HPD_OK);
                        } else {
                            assert_int_equal(hpd_gemm_sum(be, &gs), HPD_OK);
                        }
                        hpd_tp_sum_args_t ts = {.n_parts = G, .ld_parts = n, .y = want,
                                                .ldy = n, .m = m, .n = n, .accumulate = acc};
                        for (uint32_t j = 0; j < G; j++)
                            ts.parts[j] = parts[j];
                        assert_int_equal(hpd_tp_sum(be, &ts), HPD_OK);
                        if (memcmp(got, want, (size_t)m * n * 4) != 0)
                            fail_msg("gemm_sum on %s, %s, %u groups, m %u, accumulate %d, "
                                     "%u threads: not the bits of its gemms and tp_sum",
                                     be->ops->name, hpd_dtype_name(dts[d]), G, m, acc,
                                     threads);
                        for (uint32_t j = 0; j < G; j++)
                            free(parts[j]);
                        free(x), free(wf), free(w), free(scale), free(y0), free(got),
                            free(want);
                    }
        hpd_gemm_sum_args_t bad = {.n_groups = 3};
        assert_int_equal(hpd_gemm_sum(be, &bad), HPD_ERR_INVALID_ARG);
        hpd_backend_destroy(be);
    }
}

/* gemm_sum over a mixture of experts' rows (first set): each expert's rows
 * against its matrices, the bits of gemm_grouped per group then tp_sum;
 * an expert without rows, and rows past first[n_experts] untouched */
static void test_gemm_sum_experts(void **state)
{
    (void)state;
    enum { E = 3, M = 6, N = 40, B = 8 };
    static const uint32_t first[E + 1] = {0, 2, 2, 5};
    const uint32_t ks[8] = {16, 24, 8, 32, 16, 8, 24, 16};
    static const hpd_dtype_t dts[] = {HPD_DTYPE_BF16, HPD_DTYPE_F8_E4M3};
    for (int dev = 0; dev < 2; dev++) {
    hpd_backend_t *be = dev == 0 ? cpu(2) : cpu_bf16(2);
    for (size_t d = 0; d < 2; d++)
        for (uint32_t G = 2; G <= 8; G *= 4) {
            uint32_t K = 0;
            for (uint32_t j = 0; j < G; j++)
                K += ks[j];
            float *x = malloc((size_t)M * K * 4), *wf = malloc((size_t)E * N * K * 4);
            void *w = malloc((size_t)E * N * K * 4);
            float *scale = malloc((size_t)E * N * K * 4);
            float *got = malloc((size_t)M * N * 4), *want = malloc((size_t)M * N * 4);
            float *parts[8];
            test_fill(x, (size_t)M * K, 21 + G, 1.0f);
            test_fill(wf, (size_t)E * N * K, 23 + d, 3.0f);
            test_fill(scale, (size_t)E * N * K, 25, 1.0f);
            for (size_t i = 0; i < (size_t)E * N * K; i++)
                scale[i] = 0.01f + fabsf(scale[i]);
            test_fill(got, (size_t)M * N, 27, 5.0f);
            memcpy(want, got, (size_t)M * N * 4);
            hpd_dtype_from_f32(dts[d], wf, w, (size_t)E * N * K);
            hpd_gemm_sum_args_t gs = {.n_groups = G, .m = M, .n = N, .y = got, .ldy = N,
                                      .first = first, .n_experts = E};
            size_t off = 0, soff = 0;
            uint32_t col = 0;
            for (uint32_t j = 0; j < G; j++) {
                const uint32_t sld = (ks[j] + B - 1) / B;
                gs.g[j] = (hpd_gemm_args_t){.x = x + col, .ldx = K,
                                            .w = (char *)w + off * hpd_dtype_size(dts[d]),
                                            .w_dtype = dts[d], .k = ks[j]};
                if (dts[d] == HPD_DTYPE_F8_E4M3) {
                    gs.g[j].w_scale = scale + soff;
                    gs.g[j].w_scale_ld = sld;
                    gs.g[j].w_block = B;
                }
                off += (size_t)E * N * ks[j];
                soff += (size_t)E * N * sld;
                col += ks[j];
                parts[j] = calloc((size_t)M * N, 4);
                hpd_gemm_grouped_args_t one = {.g = gs.g[j], .first = first, .n_groups = E,
                                               .max_rows = M};
                one.g.y = parts[j], one.g.ldy = N, one.g.m = first[E], one.g.n = N;
                assert_int_equal(hpd_gemm_grouped(be, &one), HPD_OK);
            }
            assert_int_equal(hpd_gemm_sum(be, &gs), HPD_OK);
            hpd_tp_sum_args_t ts = {.n_parts = G, .ld_parts = N, .y = want, .ldy = N,
                                    .m = first[E], .n = N};
            for (uint32_t j = 0; j < G; j++)
                ts.parts[j] = parts[j];
            assert_int_equal(hpd_tp_sum(be, &ts), HPD_OK);
            if (memcmp(got, want, (size_t)M * N * 4) != 0)
                fail_msg("gemm_sum of experts on %s, %s, %u groups: not the bits of "
                         "gemm_grouped and tp_sum (or a row past the experts' written)",
                         be->ops->name, hpd_dtype_name(dts[d]), G);
            for (uint32_t j = 0; j < G; j++)
                free(parts[j]);
            free(x), free(wf), free(w), free(scale), free(got), free(want);
        }
    hpd_backend_destroy(be);
    }
}

/* random bf16 weights with a few denormals, zeros and large values: the
 * cases where flushing and rounding order show */
static void fill_bf16(uint16_t *h, float *f, size_t n, uint64_t seed)
{
    test_fill(f, n, seed, 1.0f);
    for (size_t i = 0; i < n; i++) {
        if (i % 97 == 5)
            f[i] = 1e-39f * (i % 2 ? 1 : -1); /* denormal */
        else if (i % 89 == 7)
            f[i] *= 1e30f;
        else if (i % 83 == 3)
            f[i] = 0;
    }
    hpd_dtype_from_f32(HPD_DTYPE_BF16, f, h, n);
}

/* cpu-bf16: each y[m][n] is hpd_cpu_bf16_dot_ref over x rounded to bf16,
 * bit for bit, for every kernel shape (4x4 with and without prefetch, 1x4, 1x1, tails
 * of k; past 16 rows the pairs of rows in 512-bit registers: blocks of 3, 2
 * and 1 pairs by 8 and 1 weight rows, an odd last row), accumulate or not, on
 * 1 and 2 threads. On a CPU with AVX512_BF16
 * this checks that VDPBF16PS rounds as the defined sequence does. */
static void test_bf16_products_sequence(void **state)
{
    const uint32_t shapes[][3] = {{1, 1, 1},    {1, 9, 16},    {3, 5, 37},   {4, 8, 64},
                                  {17, 70, 256}, {37, 13, 203}, {5, 1030, 24}, {1, 64, 1024},
                                  {22, 41, 100}};
    hpd_backend_t *be1 = cpu_bf16(1), *be2 = cpu_bf16(2);

    printf("bf16 products: %s\n", hpd_cpu_bf16_native() ? "VDPBF16PS" : "emulated");
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const uint32_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        const uint32_t ldx = k + 3, ldy = n + 2; /* rows with gaps */
        float *x = malloc((size_t)m * ldx * 4), *wf = malloc((size_t)n * k * 4);
        float *y = malloc((size_t)m * ldy * 4), *y0 = malloc((size_t)m * ldy * 4);
        uint16_t *w = malloc((size_t)n * k * 2), *xb = malloc((size_t)k * 2);
        test_fill(x, (size_t)m * ldx, 40 + s, 1.0f);
        for (size_t i = 0; i < (size_t)m * ldx; i += 101)
            x[i] = 3e-39f; /* a denormal activation: flushed */
        if (m >= 3) /* row 2: tiny activations, products and sums near FLT_MIN */
            for (size_t i = 0; i < k; i++)
                x[2 * ldx + i] = ldexpf(x[2 * ldx + i], -63);
        fill_bf16(w, wf, (size_t)n * k, 50 + s);
        if (n >= 2) /* weight row 1 tiny too: row 2 x row 1 sums products below FLT_MIN */
            for (size_t i = 0; i < k; i++)
                w[k + i] = hpd_cpu_round_bf16(ldexpf(wf[k + i] == 0 ? 1.0f : wf[k + i], -63));
        for (int acc = 0; acc < 2; acc++) {
            test_fill(y0, (size_t)m * ldy, 60 + s, 1.0f);
            memcpy(y, y0, (size_t)m * ldy * 4);
            hpd_gemm_args_t a = {.x = x, .ldx = ldx, .w = w, .w_dtype = HPD_DTYPE_BF16, .y = y,
                                 .ldy = ldy, .m = m, .n = n, .k = k, .accumulate = acc};
            assert_int_equal(hpd_gemm(acc ? be1 : be2, &a), HPD_OK);
            for (uint32_t r = 0; r < m; r++) {
                for (uint32_t i = 0; i < k; i++)
                    xb[i] = hpd_cpu_round_bf16(x[(size_t)r * ldx + i]);
                for (uint32_t c = 0; c < ldy; c++) {
                    float want = c < n ? hpd_cpu_bf16_dot_ref(xb, w + (size_t)c * k, k) : 0;
                    want = acc || c >= n ? y0[(size_t)r * ldy + c] + want : want;
                    const float got = y[(size_t)r * ldy + c]; /* the gaps untouched */
                    if (memcmp(&got, &want, 4) != 0)
                        fail_msg("%ux%ux%u, accumulate %d, y[%u][%u] = %a, the sequence gives %a",
                                 m, n, k, acc, r, c, got, want);
                }
            }
        }
        free(x), free(wf), free(y), free(y0), free(w), free(xb);
    }
    hpd_backend_destroy(be1);
    hpd_backend_destroy(be2);
}

/* cpu-bf16, the one place the instruction's rounding shows: a pair whose
 * product falls below FLT_MIN from normal operands, added to a sum just above
 * it. VDPBF16PS adds such a product in one rounding with the sum (a fused
 * multiply-add), which the defined sequence does: a product rounded on its
 * own first gave another sum in 3273 of these 20000 probes. */
static void test_bf16_products_tiny(void **state)
{
    hpd_backend_t *be = cpu_bf16(1);
    uint32_t bad = 0;
    for (uint32_t trial = 0; trial < 20000; trial++) {
        const uint32_t r = trial * 2654435761u;
        float x[16] = {0}, y;
        uint16_t w[16] = {0}, xb[16];
        x[1] = ldexpf(1.0f + (r & 0x7f) / 128.0f, -63); /* x1 w1 ~ 2^-125: normal */
        w[1] = hpd_cpu_round_bf16(ldexpf(1.0f + ((r >> 7) & 0x7f) / 128.0f, -62));
        x[0] = ldexpf(1.0f + ((r >> 14) & 0x7f) / 128.0f, -70) * ((r >> 30) & 1 ? -1 : 1);
        w[0] = hpd_cpu_round_bf16(ldexpf(1.0f + ((r >> 21) & 0x7f) / 128.0f, -71)); /* ~2^-141 */
        for (int i = 0; i < 16; i++)
            xb[i] = hpd_cpu_round_bf16(x[i]);
        hpd_gemm_args_t a = {.x = x, .ldx = 16, .w = w, .w_dtype = HPD_DTYPE_BF16, .y = &y,
                             .ldy = 1, .m = 1, .n = 1, .k = 16};
        assert_int_equal(hpd_gemm(be, &a), HPD_OK);
        const float want = hpd_cpu_bf16_dot_ref(xb, w, 16);
        bad += memcmp(&y, &want, 4) != 0;
    }
    if (bad != 0)
        fail_msg("%u of 20000 sums near FLT_MIN differ from the defined sequence", bad);
    hpd_backend_destroy(be);
}

/* cpu-bf16: a NaN in x stays a NaN through its rounding to bf16, whatever
 * its payload (rounded as a number, 0x7fffffff would carry into -0 and
 * 0x7f800001 into infinity), in the scalar rounding and the rows' vector
 * one, so its row's outputs are NaN */
static void test_bf16_nan_rows(void **state)
{
    hpd_backend_t *be = cpu_bf16(1);
    const uint32_t nans[] = {0x7fffffffu, 0x7f800001u, 0xffc00000u};
    enum { M = 3, N = 5, K = 32 };
    for (uint32_t c = 0; c < 3; c++) { /* the scalar rounding (a row's tail, the weights') */
        float f;
        memcpy(&f, &nans[c], 4);
        const uint16_t b = hpd_cpu_round_bf16(f);
        if (!((b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0))
            fail_msg("NaN %#x rounds to bf16 %#x, not a NaN", nans[c], b);
    }
    float x[M * K], y[M * N];
    uint16_t w[N * K];
    for (uint32_t i = 0; i < N * K; i++)
        w[i] = hpd_cpu_round_bf16(0.25f + 0.01f * (float)(i % 7));
    for (uint32_t c = 0; c < 3; c++) {
        for (uint32_t i = 0; i < M * K; i++)
            x[i] = 0.5f;
        memcpy(&x[1 * K + 7], &nans[c], 4); /* row 1 */
        hpd_gemm_args_t a = {.x = x, .ldx = K, .w = w, .w_dtype = HPD_DTYPE_BF16, .y = y,
                             .ldy = N, .m = M, .n = N, .k = K};
        assert_int_equal(hpd_gemm(be, &a), HPD_OK);
        for (uint32_t n = 0; n < N; n++) {
            if (!isnan(y[1 * N + n]))
                fail_msg("NaN %#x in row 1: output %u is %g", nans[c], n, y[1 * N + n]);
            assert_true(isfinite(y[0 * N + n]) && isfinite(y[2 * N + n]));
        }
    }
    hpd_backend_destroy(be);
}

/* cpu-bf16: against a float64 reference of x rounded to bf16 times w (the
 * products the mode defines), within fp32 accumulation error; x rounded to
 * nearest even (ties too); weights other than BF16 keep the fp32 GEMM's bits;
 * rows are batch invariant as in fp32. */
static void test_bf16_products_values(void **state)
{
    const uint32_t M = 37, N = 45, K = 300;
    hpd_backend_t *be = cpu_bf16(2), *fp = cpu(2);
    float *x = malloc(M * K * 4), *wf = malloc(N * K * 4), *y = malloc(M * N * 4);
    float *ref = malloc(M * N * 4), *part = malloc(M * N * 4);
    uint16_t *w = malloc(N * K * 2);

    test_fill(x, M * K, 70, 1.0f);
    test_fill(wf, N * K, 71, 0.1f);
    hpd_dtype_from_f32(HPD_DTYPE_BF16, wf, w, N * K);
    hpd_gemm_args_t a = {.x = x, .ldx = K, .w = w, .w_dtype = HPD_DTYPE_BF16, .y = y, .ldy = N,
                         .m = M, .n = N, .k = K};
    assert_int_equal(hpd_gemm(be, &a), HPD_OK);
    for (uint32_t r = 0; r < M; r++)
        for (uint32_t c = 0; c < N; c++) {
            double d = 0;
            for (uint32_t i = 0; i < K; i++)
                d += (double)hpd_bf16_to_f32(hpd_cpu_round_bf16(x[r * K + i])) *
                     hpd_bf16_to_f32(w[c * K + i]);
            ref[r * N + c] = (float)d;
        }
    assert_true(test_rel_rms(y, ref, M * N) < 1e-6);
    /* and not the fp32 products: the rounding of x shows */
    hpd_gemm_args_t f = a;
    f.y = part;
    assert_int_equal(hpd_gemm(fp, &f), HPD_OK);
    assert_true(test_rel_rms(y, part, M * N) > 1e-4);

    /* rounding: ties to even, carries, signs, NaN stays NaN */
    assert_int_equal(hpd_cpu_round_bf16(1.0f), 0x3f80);
    assert_int_equal(hpd_cpu_round_bf16(1.00390625f), 0x3f80);  /* tie, to even */
    assert_int_equal(hpd_cpu_round_bf16(1.01171875f), 0x3f82);  /* tie, to even (up) */
    assert_int_equal(hpd_cpu_round_bf16(nextafterf(1.00390625f, 2)), 0x3f81); /* above */
    assert_int_equal(hpd_cpu_round_bf16(-2.0f), 0xc000);
    assert_int_equal(hpd_cpu_round_bf16(-1e-39f), 0x8000);
    assert_true((hpd_cpu_round_bf16(NAN) & 0x7fc0) == 0x7fc0);
    /* the GEMM's own rounding of x (8 at a time, then a tail) is
     * hpd_cpu_round_bf16: x times the identity gives the rounded x back */
    {
        enum { NI = 43 };
        float xi[NI], yi[NI];
        uint16_t eye[NI * NI];
        for (uint32_t i = 0; i < NI; i++) {
            uint32_t bits = (uint32_t)(test_gauss(90, i) * 1e9f) ^ 0x3f000000u;
            bits = (bits & 0x807fffffu) | ((0x30u + i) << 23); /* normal, 2^-79..2^-37 */
            memcpy(&xi[i], &bits, 4);
        }
        xi[3] = 1.00390625f, xi[4] = 1.01171875f, xi[5] = -1e-39f, xi[40] = 1.00390625f;
        for (uint32_t r = 0; r < NI; r++)
            for (uint32_t c = 0; c < NI; c++)
                eye[r * NI + c] = r == c ? 0x3f80 : 0;
        hpd_gemm_args_t e = {.x = xi, .ldx = NI, .w = eye, .w_dtype = HPD_DTYPE_BF16, .y = yi,
                             .ldy = NI, .m = 1, .n = NI, .k = NI};
        assert_int_equal(hpd_gemm(be, &e), HPD_OK);
        for (uint32_t i = 0; i < NI; i++) {
            const float want = hpd_bf16_to_f32(hpd_cpu_round_bf16(xi[i]));
            /* (a sum from +0 cannot show a -0: zeros compare as numbers) */
            if (want == 0 ? yi[i] != 0 : memcmp(&yi[i], &want, 4) != 0)
                fail_msg("x[%u] = %a rounded in the GEMM to %a, expected %a", i, xi[i], yi[i],
                         want);
        }
    }

    /* F32 weights on cpu-bf16: the fp32 GEMM, bit for bit */
    hpd_gemm_args_t g = {.x = x, .ldx = K, .w = wf, .y = y, .ldy = N, .m = M, .n = N, .k = K};
    assert_int_equal(hpd_gemm(be, &g), HPD_OK);
    g.y = part;
    assert_int_equal(hpd_gemm(fp, &g), HPD_OK);
    assert_memory_equal(y, part, M * N * 4);

    /* batch invariance: every sub-batch reproduces its rows */
    assert_int_equal(hpd_gemm(be, &a), HPD_OK);
    for (uint32_t r0 = 0; r0 < M; r0 += 5)
        for (uint32_t m = 1; r0 + m <= M; m += 7) {
            hpd_gemm_args_t b = a;
            b.x = x + r0 * K;
            b.y = part;
            b.m = m;
            assert_int_equal(hpd_gemm(be, &b), HPD_OK);
            assert_memory_equal(part, y + r0 * N, m * N * 4);
        }
    hpd_backend_destroy(be);
    hpd_backend_destroy(fp);
    free(x), free(wf), free(y), free(ref), free(part), free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_batch_invariant),
        cmocka_unit_test(test_half_weights_exact),
        cmocka_unit_test(test_fp8_weights),
        cmocka_unit_test(test_gemm_sum),
        cmocka_unit_test(test_gemm_sum_experts),
        cmocka_unit_test(test_bf16_products_sequence),
        cmocka_unit_test(test_bf16_products_tiny),
        cmocka_unit_test(test_bf16_nan_rows),
        cmocka_unit_test(test_bf16_products_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
