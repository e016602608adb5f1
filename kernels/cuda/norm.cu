/* RMSNorm (zero-centred and plain), gated RMSNorm and L2 norm: one block of
 * HPD_CUDA_ROW_THREADS per (token, head) row; the sum of squares is reduced
 * by a fixed tree, so a row's result does not depend on the batch. And
 * attention's q and k norms fused with their rotary embedding (norm_rope):
 * the same arithmetic as rmsnorm_kernel then rope_kernel, in one launch. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gating.h"
#include "kernels/cuda/rope.h"

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

/* RMSNorm of row (t, h) of a, element d of it to out(d, value): the one
 * arithmetic of rmsnorm_kernel and norm_rope_kernel */
template <typename Out>
__device__ static inline void rms_row(const hpd_rmsnorm_args_t &a, uint32_t t, uint32_t h,
                                      float *red, Out out)
{
    const float *x = a.x.p + (size_t)t * a.x.ld + (size_t)h * a.x.hs;
    const float inv = 1.0f / sqrtf(row_sum_squares(x, a.dim, red) / (float)a.dim + a.eps);
    for (uint32_t d = threadIdx.x; d < a.dim; d += T) {
        const float w = a.zero_centred ? 1.0f + a.w[d] : a.w[d];
        out(d, (x[d] * inv) * w);
    }
}

__global__ void rmsnorm_kernel(hpd_rmsnorm_args_t a)
{
    __shared__ float red[T];
    const uint32_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    float *y = a.y.p + (size_t)t * a.y.ld + (size_t)h * a.y.hs;
    rms_row(a, t, h, red, [&](uint32_t d, float v) { y[d] = v; });
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

#define NR_MAX_DIM 1024 /* head_dim the fused kernel holds in shared memory */

/* One block per (token, head) of q's heads then k's: the row normalised
 * as rmsnorm_kernel does it, kept in shared memory, then its rotary pairs
 * turned as rope_kernel does (rope.h) and the rest copied. */
__global__ void norm_rope_kernel(hpd_norm_rope_args_t a, const int32_t *positions,
                                 const float *inv_freq)
{
    __shared__ float red[T];
    __shared__ float ys[NR_MAX_DIM];
    const uint32_t nq = a.q.n_heads, heads = nq + a.k.n_heads;
    const uint32_t t = blockIdx.x / heads, hh = blockIdx.x % heads, h = hh < nq ? hh : hh - nq;
    const hpd_rmsnorm_args_t &n = hh < nq ? a.q : a.k;
    float *y = n.y.p + (size_t)t * n.y.ld + (size_t)h * n.y.hs;
    rms_row(n, t, h, red, [&](uint32_t d, float v) { ys[d] = v; });
    __syncthreads(); /* the whole row normalised (x and y may be one) */
    const uint32_t half = a.rope.rot_dim / 2;
    const float pos = (float)positions[t];
    for (uint32_t i = threadIdx.x; i < half; i += T)
        hpd_rope_pair(ys[i], ys[i + half], pos, inv_freq[i], a.rope, &y[i], &y[i + half]);
    for (uint32_t d = 2 * half + threadIdx.x; d < n.dim; d += T)
        y[d] = ys[d];
}

hpd_status_t hpd_cuda_norm_rope(hpd_backend_t *b, const hpd_norm_rope_args_t *a)
{
    const uint32_t half = a->rope.rot_dim / 2, rows = a->q.n_tokens * (a->q.n_heads + a->k.n_heads);
    float inv_freq[HPD_ROPE_MAX_HALF];
    void *pos, *freq;
    hpd_status_t st;
    if (half > HPD_ROPE_MAX_HALF || a->q.dim != a->k.dim || a->q.dim > NR_MAX_DIM ||
        a->rope.rot_dim > a->q.dim || a->q.n_tokens != a->k.n_tokens)
        return hpd_norm_rope_unfused(b, a); /* the same bits, in four launches */
    if (rows == 0)
        return HPD_OK;
    hpd_rope_inv_freq_table(&a->rope, inv_freq);
    const hpd_cuda_meta_t m[] = {
        {.host = a->rope.positions, .bytes = a->q.n_tokens * sizeof(int32_t), .dev_p = &pos},
        {.host = inv_freq, .bytes = half * sizeof(float), .dev_p = &freq}};
    if ((st = hpd_cuda_stage(b, m, 2)) != HPD_OK)
        return st;
    norm_rope_kernel<<<rows, T, 0, hpd_cuda_ctx(b)->stream>>>(*a, (const int32_t *)pos,
                                                              (const float *)freq);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* One block per (token, head) of q's heads then k's, normalised as
 * l2norm_kernel does; then one block per token computing its gates as
 * gdn_gating_kernel does (gating.h). */
__global__ void l2norm_gating_kernel(hpd_l2norm_gating_args_t a)
{
    __shared__ float red[T];
    const uint32_t nq = a.q.n_heads, heads = nq + a.k.n_heads, norm_rows = a.q.n_tokens * heads;
    if (blockIdx.x >= norm_rows) {
        for (uint32_t h = threadIdx.x; h < a.gate.nv; h += T)
            hpd_gdn_gate(a.gate, blockIdx.x - norm_rows, h);
        return; /* the whole block */
    }
    const uint32_t t = blockIdx.x / heads, hh = blockIdx.x % heads, h = hh < nq ? hh : hh - nq;
    const hpd_l2norm_args_t &n = hh < nq ? a.q : a.k;
    float *x = n.x.p + (size_t)t * n.x.ld + (size_t)h * n.x.hs;
    const float inv = 1.0f / sqrtf(row_sum_squares(x, n.dim, red) + n.eps);
    for (uint32_t d = threadIdx.x; d < n.dim; d += T)
        x[d] = (x[d] * inv) * n.scale;
}

hpd_status_t hpd_cuda_l2norm_gating(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a)
{
    if (a->q.n_tokens != a->k.n_tokens || a->q.n_tokens != a->gate.n_tokens)
        return hpd_l2norm_gating_unfused(b, a);
    const uint32_t rows = a->q.n_tokens * (a->q.n_heads + a->k.n_heads + 1);
    if (a->q.n_tokens > 0)
        l2norm_gating_kernel<<<rows, T, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
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
