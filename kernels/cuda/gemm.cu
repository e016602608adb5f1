/* GEMM y = (acc ? y : 0) + x w^T, deterministic: each output sums k in
 * ascending order in one thread, so its value depends on its row and column
 * alone (not on m, the batch). 64x64 tiles, 16x16 threads, 4x4 outputs per
 * thread, k in steps of 16 through shared memory. No cuBLAS. Weights in F32,
 * BF16 or F16, widened to fp32 exactly as they are staged. */
#include "kernels/cuda/cuda_ops.h"

__device__ static inline float widen(float w)
{
    return w;
}

/* BF16 and F16 weights are read as their 16-bit patterns */
struct bf16_t {
    uint16_t bits;
};
struct f16_t {
    uint16_t bits;
};

__device__ static inline float widen(bf16_t w)
{
    return __uint_as_float((uint32_t)w.bits << 16);
}

__device__ static inline float widen(f16_t w)
{
    return __half2float(__ushort_as_half(w.bits));
}

/* FP8 E4M3 (no infinities; S.1111.111 is NaN), exact */
struct f8_t {
    uint8_t bits;
};

__device__ static inline float widen(f8_t w)
{
    const uint32_t b = w.bits, sign = (b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 7u;
    if (exp == 0xfu && mant == 7u)
        return __uint_as_float(sign | 0x7fc00000u);
    if (exp != 0)
        return __uint_as_float(sign | ((exp + 120u) << 23) | (mant << 20));
    const float f = __fmul_rn((float)mant, 0.001953125f);
    return sign ? -f : f;
}

/* The FP8 scales (unused for the other dtypes). */
struct wscale_t {
    const float *scale;
    uint32_t ld, block;
};

/* element (row n, column c) of w, in fp32 */
template <typename WT>
__device__ static inline float weight(const WT *w, uint32_t n, uint32_t c, uint32_t k,
                                      wscale_t ws)
{
    return widen(w[(size_t)n * k + c]);
}

template <>
__device__ inline float weight<f8_t>(const f8_t *w, uint32_t n, uint32_t c, uint32_t k,
                                     wscale_t ws)
{
    return __fmul_rn(widen(w[(size_t)n * k + c]), ws.scale[(size_t)n * ws.ld + c / ws.block]);
}

#define TM 64
#define TN 64
#define TK 16

template <typename WT>
__global__ void gemm_kernel(const float *__restrict__ x, uint32_t ldx,
                            const WT *__restrict__ w, wscale_t wsc, float *__restrict__ y,
                            uint32_t ldy, uint32_t m, uint32_t n, uint32_t k, bool accumulate)
{
    __shared__ float xs[TK][TM + 1];
    __shared__ float ws[TK][TN + 1];
    const uint32_t tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    const uint32_t row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
    float acc[4][4] = {{0}};

    for (uint32_t k0 = 0; k0 < k; k0 += TK) {
        /* 256 threads load 64x16 of x and of w, 4 elements each */
        for (uint32_t i = tid; i < TM * TK; i += 256) {
            const uint32_t r = i / TK, kk = i % TK;
            const uint32_t gr = row0 + r, gk = k0 + kk;
            xs[kk][r] = gr < m && gk < k ? x[(size_t)gr * ldx + gk] : 0.0f;
            const uint32_t gc = col0 + r;
            ws[kk][r] = gc < n && gk < k ? weight(w, gc, gk, k, wsc) : 0.0f;
        }
        __syncthreads();
        for (uint32_t kk = 0; kk < TK; kk++)
            for (uint32_t i = 0; i < 4; i++)
                for (uint32_t j = 0; j < 4; j++)
                    acc[i][j] += xs[kk][ty * 4 + i] * ws[kk][tx * 4 + j];
        __syncthreads();
    }
    for (uint32_t i = 0; i < 4; i++) {
        const uint32_t r = row0 + ty * 4 + i;
        for (uint32_t j = 0; j < 4; j++) {
            const uint32_t c = col0 + tx * 4 + j;
            if (r < m && c < n) {
                float *out = y + (size_t)r * ldy + c;
                *out = accumulate ? *out + acc[i][j] : acc[i][j];
            }
        }
    }
}

hpd_status_t hpd_cuda_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    if (a->m == 0 || a->n == 0)
        return HPD_OK;
    const dim3 grid((a->n + TN - 1) / TN, (a->m + TM - 1) / TM), block(16, 16);
    cudaStream_t s = hpd_cuda_ctx(b)->stream;
    const wscale_t wsc = {a->w_scale, a->w_scale_ld, a->w_block};
    switch (a->w_dtype) {
    case HPD_DTYPE_F32:
        gemm_kernel<<<grid, block, 0, s>>>(a->x, a->ldx, (const float *)a->w, wsc, a->y, a->ldy,
                                           a->m, a->n, a->k, a->accumulate);
        break;
    case HPD_DTYPE_BF16:
        gemm_kernel<<<grid, block, 0, s>>>(a->x, a->ldx, (const bf16_t *)a->w, wsc, a->y, a->ldy,
                                           a->m, a->n, a->k, a->accumulate);
        break;
    case HPD_DTYPE_F16:
        gemm_kernel<<<grid, block, 0, s>>>(a->x, a->ldx, (const f16_t *)a->w, wsc, a->y, a->ldy,
                                           a->m, a->n, a->k, a->accumulate);
        break;
    case HPD_DTYPE_F8_E4M3:
        if (a->w_scale == NULL || a->w_block == 0)
            return HPD_ERR_INVALID_ARG;
        gemm_kernel<<<grid, block, 0, s>>>(a->x, a->ldx, (const f8_t *)a->w, wsc, a->y, a->ldy,
                                           a->m, a->n, a->k, a->accumulate);
        break;
    default:
        return HPD_ERR_UNSUPPORTED;
    }
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* The fast mode (device cuda-fast): cuBLAS SGEMM in fp32 (default math: no TF32).
 * Its kernels and split-K choices depend on m, so a row's bits depend on
 * the batch: not the deterministic contract of DESIGN.md section 4. Row-major
 * y = x w^T is column-major y^T = w^T-as-stored times x^T-as-stored. */
hpd_status_t hpd_cuda_gemm_cublas(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    const float alpha = 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
    if (a->m == 0 || a->n == 0)
        return HPD_OK;
    if (a->w_dtype != HPD_DTYPE_F32) /* cuBLAS has no fp32 x bf16 product: the kernel above */
        return hpd_cuda_gemm(b, a);
    const cublasStatus_t cs = cublasSgemm(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->n,
                                          (int)a->m, (int)a->k, &alpha, (const float *)a->w,
                                          (int)a->k, a->x,
                                          (int)a->ldx, &beta, a->y, (int)a->ldy);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        HPD_LOG_ERROR("cuda", "cublasSgemm %ux%ux%u failed: status %d", a->m, a->n, a->k,
                      (int)cs);
        return HPD_ERR_INTERNAL;
    }
    return HPD_OK;
}
