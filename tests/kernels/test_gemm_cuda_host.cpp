/* The CUDA GEMM's kernels (kernels/cuda/gemm.cu), run on the host through
 * tests/kernels/cuda_host/, against the canonical summation order written
 * out plainly (docs/kernels.md, "The GEMM's order"): every row of every
 * batch size, through the GEMV (m <= 32, weight rows 16-byte aligned) and
 * the tiled kernel, for F32, BF16, F16 and FP8 weights (blocks of 48
 * columns: the scale changes inside a chunk), at k below, at and past the
 * 64-element chunk, bit for bit. It needs no GPU, so every build checks the
 * order; test_backend_cuda checks the same on a GPU. */
#include <cstdio>
#include <initializer_list>
#include <random>

#include "kernels/cuda/cuda_ops.h"

/* w[row][col] widened as docs/kernels.md says */
static float weight_ref(hpd_dtype_t dt, const void *w, uint32_t k, const float *scale,
                        uint32_t sld, uint32_t block, uint32_t row, uint32_t col)
{
    const size_t i = (size_t)row * k + col;
    switch (dt) {
    case HPD_DTYPE_F32:
        return ((const float *)w)[i];
    case HPD_DTYPE_BF16:
        return hpd_bf16_to_f32(((const uint16_t *)w)[i]);
    case HPD_DTYPE_F16:
        return hpd_f16_to_f32(((const uint16_t *)w)[i]);
    default:
        return hpd_f8e4m3_to_f32(((const uint8_t *)w)[i]) * scale[(size_t)row * sld + col / block];
    }
}

/* y[r][c] += the chunked sum: fmaf chains of 64 from 0, partials in order */
static void gemm_ref(const hpd_gemm_args_t *a)
{
    for (uint32_t r = 0; r < a->m; r++)
        for (uint32_t c = 0; c < a->n; c++) {
            float total = 0.0f;
            for (uint32_t j0 = 0; j0 < a->k; j0 += 64) {
                float part = 0.0f;
                for (uint32_t e = j0; e < std::min(a->k, j0 + 64); e++)
                    part = fmaf(a->x[(size_t)r * a->ldx + e],
                                weight_ref(a->w_dtype, a->w, a->k, a->w_scale, a->w_scale_ld,
                                           a->w_block, c, e),
                                part);
                total = total + part;
            }
            float *out = a->y + (size_t)r * a->ldy + c;
            *out = a->accumulate ? *out + total : total;
        }
}

/* x rounded to bf16, to nearest even */
static float bf16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* A tensor-core GEMM (BF16 weights) through the stand-in's mma, whose
 * fragments follow the PTX ISA's layout: every output within a bound of a
 * float64 reference of x rounded to bf16 times w (a row of ties checks the
 * rounding: to even, not truncated), accumulate and the gaps of y kept; and
 * the first `subs` rows alone equal the same rows in a batch of up to 130
 * bit for bit (on the stand-in; test_backend_cuda checks that on a GPU):
 * hpd_cuda_gemm_tc (cuda-fast: the tiled kernel for every m) with rows 1
 * and 65, hpd_cuda_gemm_bf16 (cuda-bf16: the GEMV up to 32 rows, the tiled
 * kernel past) across that boundary, and there x off 16-byte alignment too.
 * Returns the cases that failed. */
typedef hpd_status_t (*gemm_fn_t)(hpd_backend_t *, const hpd_gemm_args_t *);
static int check_tensor_cores(hpd_backend_t *be, int *checked, const char *what, gemm_fn_t gemm,
                              std::initializer_list<uint32_t> subs, bool unaligned_x,
                              hpd_dtype_t dt = HPD_DTYPE_BF16, uint32_t max_m = UINT32_MAX)
{
    /* FP8: blocks of 24 columns (a scale change inside a step of 16), each
     * weight dequantised to bf16(q * scale) */
    const bool fp8 = dt == HPD_DTYPE_F8_E4M3;
    const uint32_t block = 24;
    /* k of 1 to 9 tiles of 32 (the ring of 3 wraps), m and n past a block;
     * the decode kernel's rings of 32, 16 and 8 slots of 64 k wrapping (k
     * 2112, 1088; 1048: k % 16 == 8 keeps FP8 on gemv_tc_kernel), its rows alone against
     * the tiled kernel's batch of 40 */
    static const uint32_t shapes[][3] = {{1, 8, 16},     {5, 130, 40},   {64, 128, 32},
                                         {65, 200, 104}, {130, 33, 136}, {3, 257, 8},
                                         {129, 20, 264}, {40, 70, 200},  {40, 16, 1088},
                                         {5, 40, 1048},  {20, 9, 1088},  {5, 24, 2112}};
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    int failed = 0;
    for (const auto &sh : shapes) {
        const uint32_t M = sh[0], n = sh[1], k = sh[2], ldx = k + 4, ldy = n + 3;
        if (M > max_m)
            continue;
        std::vector<float4> xs(((size_t)M * ldx + 3) / 4); /* 16-byte aligned */
        float *x = (float *)xs.data();
        std::vector<float> wf((size_t)n * k), y0((size_t)M * ldy), got;
        for (size_t i = 0; i < (size_t)M * ldx; i++)
            x[i] = normal(rng);
        if (M > 2) /* row 2: halfway between two bf16 (ties to even) */
            for (uint32_t i = 0; i < k; i++)
                x[2 * ldx + i] = i % 2 ? 1.00390625f : -1.01171875f;
        for (float &v : wf)
            v = normal(rng) * (fp8 ? 100.0f : 1.0f);
        for (float &v : y0)
            v = normal(rng);
        const uint32_t sld = (k + block - 1) / block;
        std::vector<float> scale((size_t)n * sld), wref((size_t)n * k);
        for (float &v : scale)
            v = 0.001f + 0.02f * std::fabs(normal(rng));
        std::vector<float4> wq(((size_t)n * k * 2 + 15) / 16);
        hpd_dtype_from_f32(dt, wf.data(), wq.data(), (size_t)n * k);
        for (size_t i = 0; i < (size_t)n * k; i++) /* the weights the kernels multiply */
            wref[i] = fp8 ? bf16_rn(hpd_f8e4m3_to_f32(((const uint8_t *)wq.data())[i]) *
                                    scale[i / k * sld + i % k / block])
                          : hpd_bf16_to_f32(((const uint16_t *)wq.data())[i]);
        const auto args = [&](hpd_gemm_args_t &a) {
            a.w = wq.data(), a.w_dtype = dt;
            if (fp8)
                a.w_scale = scale.data(), a.w_scale_ld = sld, a.w_block = block;
        };
        for (int acc = 0; acc < 2; acc++) {
            got = y0;
            hpd_gemm_args_t a = {};
            a.x = x, a.ldx = ldx, a.y = got.data();
            a.ldy = ldy, a.m = M, a.n = n, a.k = k, a.accumulate = acc;
            args(a);
            (*checked)++;
            if (gemm(be, &a) != HPD_OK) {
                failed++;
                continue;
            }
            int bad = 0;
            for (uint32_t r = 0; r < M && bad < 3; r++)
                for (uint32_t c = 0; c < ldy; c++) {
                    double ref = 0, mag = 0;
                    for (uint32_t e = 0; c < n && e < k; e++) {
                        const double p =
                            (double)bf16_rn(x[(size_t)r * ldx + e]) * wref[(size_t)c * k + e];
                        ref += p, mag += std::fabs(p);
                    }
                    const double base = acc || c >= n ? y0[(size_t)r * ldy + c] : 0.0;
                    const double want = base + ref;
                    const double tol = 4e-6 * (k / 16 + 1) * (mag + std::fabs(base)) + 1e-30;
                    const float g = got[(size_t)r * ldy + c];
                    if (!(std::fabs(g - want) <= tol)) { /* NaN fails */
                        fprintf(stderr, "%s %ux%ux%u acc %d: y[%u][%u] = %.9g, want "
                                        "%.9g (within %.3g)\n",
                                what, M, n, k, acc, r, c, g, want, tol);
                        bad++;
                    }
                }
            failed += bad > 0;
        }
        /* batch invariance: the first m rows alone */
        std::vector<float> full(y0);
        hpd_gemm_args_t a = {};
        a.x = x, a.ldx = ldx, a.ldy = ldy;
        a.n = n, a.k = k, a.y = full.data(), a.m = M;
        args(a);
        if (gemm(be, &a) != HPD_OK) {
            failed++;
            continue;
        }
        for (uint32_t m : subs) {
            if (m >= M)
                continue;
            std::vector<float> part(y0.begin(), y0.begin() + (size_t)m * ldy);
            a.y = part.data(), a.m = m;
            (*checked)++;
            if (gemm(be, &a) != HPD_OK || memcmp(part.data(), full.data(), part.size() * 4) != 0) {
                fprintf(stderr, "%s %ux%u: the first %u rows alone differ from the batch of "
                                "%u\n",
                        what, n, k, m, M);
                failed++;
            }
        }
        if (unaligned_x) { /* x one float off 16-byte alignment, rows of ldx + 1 */
            std::vector<float> xu((size_t)M * (ldx + 1) + 1), out(y0);
            for (uint32_t r = 0; r < M; r++)
                memcpy(&xu[1 + (size_t)r * (ldx + 1)], x + (size_t)r * ldx, k * sizeof(float));
            a.x = xu.data() + 1, a.ldx = ldx + 1, a.y = out.data(), a.m = M;
            (*checked)++;
            if (gemm(be, &a) != HPD_OK || memcmp(out.data(), full.data(), out.size() * 4) != 0) {
                fprintf(stderr, "%s %ux%ux%u: x off alignment differs\n", what, M, n, k);
                failed++;
            }
        }
    }
    return failed;
}

int main()
{
    static const hpd_dtype_t dtypes[] = {HPD_DTYPE_F32, HPD_DTYPE_BF16, HPD_DTYPE_F16,
                                         HPD_DTYPE_F8_E4M3};
    /* 100: BF16 / F16 / FP8 rows off 16-byte alignment (the tiled kernel) */
    static const uint32_t ks[] = {16, 64, 100, 1000, 1040, 2112, 4132};
    /* 65 .. 140: the tiled kernel's second half of rows and a second row
     * tile; n = 150 (k of 16, 64, 100, 1040): its second half of columns and a second
     * column tile */
    static const uint32_t ms[] = {1, 2, 3, 5, 8, 9, 17, 32, 33, 40, 65, 140};
    const uint32_t M = 140, block = 48;
    hpd_cuda_ctx_t ctx = {};
    hpd_backend_t be = {nullptr, &ctx};
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    int checked = 0, failed = 0;
    const struct {
        const char *name;
        gemm_fn_t fn;
    } ops[] = {{"gemm", hpd_cuda_gemm}, {"cuda-fast gemm", hpd_cuda_gemm_cublas}};

    for (hpd_dtype_t dt : dtypes)
        for (uint32_t k : ks) {
            const uint32_t n = k <= 100 || k == 1040 ? 150 : 19;
            const uint32_t ldx = k + 3, ldy = n + 5, sld = (k + block - 1) / block;
            const bool fp8 = dt == HPD_DTYPE_F8_E4M3;
            std::vector<float> x((size_t)M * ldx), wf((size_t)n * k), y0((size_t)M * ldy);
            std::vector<float> scale((size_t)n * sld);
            for (float &v : x)
                v = normal(rng);
            for (float &v : wf)
                v = normal(rng) * (fp8 ? 300.0f : 0.1f);
            for (float &v : y0)
                v = normal(rng);
            for (float &v : scale)
                v = 0.01f + std::fabs(normal(rng));
            for (size_t i = 0; i < 5; i++)
                x[i * 7] = -0.0f;
            std::vector<float4> wq(((size_t)n * k * hpd_dtype_size(dt) + 15) / 16); /* aligned */
            hpd_dtype_from_f32(dt, wf.data(), wq.data(), (size_t)n * k);
            hpd_gemm_args_t a = {};
            a.x = x.data(), a.ldx = ldx, a.w = wq.data(), a.w_dtype = dt;
            a.w_scale = fp8 ? scale.data() : nullptr, a.w_scale_ld = fp8 ? sld : 0;
            a.w_block = fp8 ? block : 0, a.ldy = ldy, a.n = n, a.k = k, a.accumulate = true;
            std::vector<float> want(y0);
            a.y = want.data(), a.m = M;
            gemm_ref(&a);
            for (uint32_t m : ms) {
                if (m > 40 && k > 1040)
                    continue; /* the long k of the GEMV cases: 40 rows cover the tiled kernel */
                const uint32_t off = (M - m) / 2;
                a.x = x.data() + (size_t)off * ldx, a.m = m;
                /* cuda's GEMM; cuda-fast's for weights other than F32 (cuBLAS
                 * has no fp32 x bf16 product), where tensor cores do not take
                 * them, runs the same kernels */
                for (const auto &op : ops) {
                    if (op.fn == hpd_cuda_gemm_cublas && dt == HPD_DTYPE_F32)
                        continue;
                    std::vector<float> got(y0.begin() + (size_t)off * ldy,
                                           y0.begin() + (size_t)(off + m) * ldy);
                    a.y = got.data();
                    checked++;
                    if (op.fn(&be, &a) != HPD_OK ||
                        memcmp(got.data(), want.data() + (size_t)off * ldy, got.size() * 4) != 0) {
                        fprintf(stderr, "%s %s k=%u: rows %u..%u (m = %u) differ from the "
                                "canonical order\n", op.name, hpd_dtype_name(dt), k, off,
                                off + m - 1, m);
                        failed++;
                    }
                }
            }
        }
    { /* cuda-fast's F32 weights go to cuBLAS, which the stand-in does not
       * have (every call fails): the failure is the op's, not a silent success */
        std::vector<float> x(4 * 16, 1.0f), w(8 * 16, 1.0f), y(4 * 8, 0.0f);
        hpd_gemm_args_t a = {};
        a.x = x.data(), a.ldx = 16, a.w = w.data(), a.w_dtype = HPD_DTYPE_F32;
        a.y = y.data(), a.ldy = 8, a.m = 4, a.n = 8, a.k = 16;
        checked++;
        if (hpd_cuda_gemm_cublas(&be, &a) != HPD_ERR_INTERNAL) {
            fprintf(stderr, "cuda-fast gemm: a failed cublasSgemm was not reported\n");
            failed++;
        }
    }
    printf("%d GEMMs checked, %d differ\n", checked, failed);
    int tc_checked = 0;
    int tc_failed = check_tensor_cores(&be, &tc_checked, "tensor cores", hpd_cuda_gemm_tc,
                                       {1u, 65u}, false);
    /* cuda-bf16's decode GEMM: the ring kernel (its three variants: m up to
     * 4, 16, 32), then gemv_tc_kernel where the ring's shared memory could
     * not be opted in (the shapes of 40 rows at most: the tiled kernel's
     * larger batches are the ring pass's) */
    for (int ring = 1; ring >= 0; ring--) {
        ctx.gr_ok = ring;
        const uint32_t max_m = ring ? UINT32_MAX : 40;
        tc_failed += check_tensor_cores(&be, &tc_checked, ring ? "cuda-bf16" : "cuda-bf16 no ring",
                                        hpd_cuda_gemm_bf16,
                                        {1u, 2u, 4u, 5u, 16u, 17u, 32u, 33u, 65u}, true,
                                        HPD_DTYPE_BF16, max_m);
        tc_failed += check_tensor_cores(&be, &tc_checked,
                                        ring ? "cuda-bf16 fp8" : "cuda-bf16 fp8 no ring",
                                        hpd_cuda_gemm_bf16, {1u, 4u, 5u, 17u, 32u, 33u, 65u}, true,
                                        HPD_DTYPE_F8_E4M3, max_m);
    }
    /* the tiled kernel's wide blocks (128 x 256, k tiles of 64; chosen by
     * shape on a GPU, forced here): every check again, so its rows equal
     * the GEMV's rows alone bit for bit as the narrow blocks' do */
    ctx.gr_ok = true, ctx.wide_ok = true, ctx.gemm_bn = 256;
    /* and the decode kernel's deeper ring (taken where the GEMM has at most
     * a block per SM: here every one) */
    ctx.gr_deep_ok = true, ctx.n_sms = 1u << 30;
    tc_failed += check_tensor_cores(&be, &tc_checked, "cuda-bf16 wide", hpd_cuda_gemm_bf16,
                                    {1u, 17u, 32u, 33u}, true, HPD_DTYPE_BF16);
    tc_failed += check_tensor_cores(&be, &tc_checked, "cuda-bf16 fp8 wide", hpd_cuda_gemm_bf16,
                                    {1u, 17u, 32u, 33u}, true, HPD_DTYPE_F8_E4M3);
    printf("tensor cores: %d GEMMs checked, %d failed\n", tc_checked, tc_failed);
    hpd_emu_ctx_free(&ctx);
    return failed != 0 || tc_failed != 0;
}
