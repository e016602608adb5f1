/* The CUDA GEMM's kernels (kernels/cuda/gemm.cu), run on the host through
 * tests/kernels/cuda_host/, against the canonical summation order written
 * out plainly (docs/kernels.md, "The GEMM's order"): every row of every
 * batch size, through the GEMV (m <= 32, weight rows 16-byte aligned) and
 * the tiled kernel, for F32, BF16, F16 and FP8 weights (blocks of 48
 * columns: the scale changes inside a chunk), at k below, at and past the
 * 64-element chunk, bit for bit. It needs no GPU, so every build checks the
 * order; test_backend_cuda checks the same on a GPU. */
#include <cstdio>
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
                std::vector<float> got(y0.begin() + (size_t)off * ldy,
                                       y0.begin() + (size_t)(off + m) * ldy);
                a.x = x.data() + (size_t)off * ldx, a.y = got.data(), a.m = m;
                checked++;
                if (hpd_cuda_gemm(&be, &a) != HPD_OK ||
                    memcmp(got.data(), want.data() + (size_t)off * ldy, got.size() * 4) != 0) {
                    fprintf(stderr, "gemm %s k=%u: rows %u..%u (m = %u) differ from the "
                            "canonical order\n", hpd_dtype_name(dt), k, off, off + m - 1, m);
                    failed++;
                }
            }
        }
    printf("%d GEMMs checked, %d differ\n", checked, failed);
    return failed != 0;
}
