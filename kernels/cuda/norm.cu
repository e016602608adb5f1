/* RMSNorm (zero-centred and plain), gated RMSNorm and L2 norm: one block of
 * HPD_CUDA_ROW_THREADS per (token, head) row; the sum of squares is reduced
 * by a fixed tree, so a row's result does not depend on the batch. */
#include "kernels/cuda/cuda_ops.h"

#define T HPD_CUDA_ROW_THREADS

__device__ static float row_sum_squares(const float *x, uint32_t dim, float *red)
{
    float s = 0.0f;
    for (uint32_t d = threadIdx.x; d < dim; d += T)
        s += x[d] * x[d];
    red[threadIdx.x] = s;
    __syncthreads();
    for (uint32_t step = T / 2; step > 0; step /= 2) {
        if (threadIdx.x < step)
            red[threadIdx.x] += red[threadIdx.x + step];
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();
    return total;
}

__global__ void rmsnorm_kernel(hpd_rmsnorm_args_t a)
{
    __shared__ float red[T];
    const uint32_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    const float *x = a.x.p + (size_t)t * a.x.ld + (size_t)h * a.x.hs;
    float *y = a.y.p + (size_t)t * a.y.ld + (size_t)h * a.y.hs;
    const float inv = 1.0f / sqrtf(row_sum_squares(x, a.dim, red) / (float)a.dim + a.eps);
    for (uint32_t d = threadIdx.x; d < a.dim; d += T) {
        const float w = a.zero_centred ? 1.0f + a.w[d] : a.w[d];
        y[d] = (x[d] * inv) * w;
    }
}

__global__ void gated_rmsnorm_kernel(hpd_gated_rmsnorm_args_t a)
{
    __shared__ float red[T];
    const uint32_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    const float *x = a.x.p + (size_t)t * a.x.ld + (size_t)h * a.x.hs;
    const float *z = a.z.p + (size_t)t * a.z.ld + (size_t)h * a.z.hs;
    float *y = a.y.p + (size_t)t * a.y.ld + (size_t)h * a.y.hs;
    const float inv = 1.0f / sqrtf(row_sum_squares(x, a.dim, red) / (float)a.dim + a.eps);
    for (uint32_t d = threadIdx.x; d < a.dim; d += T) {
        const float silu = z[d] / (1.0f + expf(-z[d]));
        y[d] = ((x[d] * inv) * a.w[d]) * silu;
    }
}

__global__ void l2norm_kernel(hpd_l2norm_args_t a)
{
    __shared__ float red[T];
    const uint32_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    float *x = a.x.p + (size_t)t * a.x.ld + (size_t)h * a.x.hs;
    const float inv = 1.0f / sqrtf(row_sum_squares(x, a.dim, red) + a.eps);
    for (uint32_t d = threadIdx.x; d < a.dim; d += T)
        x[d] = (x[d] * inv) * a.scale;
}

hpd_status_t hpd_cuda_rmsnorm(hpd_backend_t *b, const hpd_rmsnorm_args_t *a)
{
    const uint32_t rows = a->n_tokens * a->n_heads;
    if (rows > 0)
        rmsnorm_kernel<<<rows, T, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

hpd_status_t hpd_cuda_gated_rmsnorm(hpd_backend_t *b, const hpd_gated_rmsnorm_args_t *a)
{
    const uint32_t rows = a->n_tokens * a->n_heads;
    if (rows > 0)
        gated_rmsnorm_kernel<<<rows, T, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

hpd_status_t hpd_cuda_l2norm(hpd_backend_t *b, const hpd_l2norm_args_t *a)
{
    const uint32_t rows = a->n_tokens * a->n_heads;
    if (rows > 0)
        l2norm_kernel<<<rows, T, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
