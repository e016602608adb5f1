/* Embedding, RoPE, SwiGLU, the attention gate and GDN gating on the GPU.
 * Token ids and positions live in host memory (the engine's metadata) and
 * are staged to the device first. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gating.h"
#include "kernels/cuda/rope.h"
#include "kernels/tp_sum.h"

/* The table in F32, BF16 or F16, widened exactly. */
__global__ void embed_kernel(const int32_t *ids, uint32_t n, const void *table,
                             hpd_dtype_t dtype, uint32_t dim, float *out, uint32_t ld)
{
    const uint32_t i = blockIdx.x;
    const size_t row = (size_t)ids[i] * dim;
    for (uint32_t d = threadIdx.x; d < dim; d += blockDim.x) {
        float v;
        if (dtype == HPD_DTYPE_F32) {
            v = ((const float *)table)[row + d];
        } else {
            const uint16_t h = ((const uint16_t *)table)[row + d];
            v = dtype == HPD_DTYPE_BF16 ? __uint_as_float((uint32_t)h << 16)
                                        : __half2float(__ushort_as_half(h));
        }
        out[(size_t)i * ld + d] = v;
    }
}

hpd_status_t hpd_cuda_embed(hpd_backend_t *b, const hpd_embed_args_t *a)
{
    void *ids;
    hpd_status_t st;
    if (a->n == 0)
        return HPD_OK;
    const hpd_cuda_meta_t m = {.host = a->ids, .bytes = a->n * sizeof(int32_t), .dev_p = &ids};
    if ((st = hpd_cuda_stage(b, &m, 1)) != HPD_OK)
        return st;
    embed_kernel<<<a->n, 256, 0, hpd_cuda_ctx(b)->stream>>>((const int32_t *)ids, a->n, a->table,
                                                            a->dtype, a->dim, a->out, a->ld);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* One block per token; the inverse frequencies are the host's table
 * (hpd_rope_inv_freq_table), the CPU backend's bits. */
__global__ void rope_kernel(hpd_rope_args_t a, const int32_t *positions, const float *inv_freq)
{
    const uint32_t t = blockIdx.x, half = a.rot_dim / 2;
    const float pos = (float)positions[t];
    for (uint32_t e = threadIdx.x; e < a.n_heads * half; e += blockDim.x) {
        const uint32_t h = e / half, i = e % half;
        float *x = a.x.p + (size_t)t * a.x.ld + (size_t)h * a.x.hs;
        hpd_rope_pair(x[i], x[i + half], pos, inv_freq[i], a, &x[i], &x[i + half]);
    }
}

hpd_status_t hpd_cuda_rope(hpd_backend_t *b, const hpd_rope_args_t *a)
{
    const uint32_t half = a->rot_dim / 2;
    float inv_freq[HPD_ROPE_MAX_HALF];
    void *pos, *freq;
    hpd_status_t st;
    if (half > HPD_ROPE_MAX_HALF)
        return HPD_ERR_UNSUPPORTED;
    if (a->n_tokens == 0)
        return HPD_OK;
    hpd_rope_inv_freq_table(a, inv_freq);
    const hpd_cuda_meta_t m[] = {
        {.host = a->positions, .bytes = a->n_tokens * sizeof(int32_t), .dev_p = &pos},
        {.host = inv_freq, .bytes = half * sizeof(float), .dev_p = &freq}};
    if ((st = hpd_cuda_stage(b, m, 2)) != HPD_OK)
        return st;
    rope_kernel<<<a->n_tokens, 128, 0, hpd_cuda_ctx(b)->stream>>>(*a, (const int32_t *)pos,
                                                                  (const float *)freq);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* A grid-stride walk over every (token, element), so any token count
 * works (a grid's y and z stop at 65535). */
__global__ void silu_mul_kernel(hpd_silu_mul_args_t a)
{
    const size_t n = (size_t)a.n_tokens * a.inter, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const size_t t = e / a.inter, i = e % a.inter;
        const float g = a.gu[t * a.ldgu + i], u = a.gu[t * a.ldgu + a.inter + i];
        a.out[t * a.ldout + i] = (g / (1.0f + expf(-g))) * u;
    }
}

hpd_status_t hpd_cuda_silu_mul(hpd_backend_t *b, const hpd_silu_mul_args_t *a)
{
    const size_t n = (size_t)a->n_tokens * a->inter, blocks = (n + 255) / 256;
    const uint32_t grid = (uint32_t)(blocks < 65536 ? blocks : 65536);
    if (n == 0)
        return HPD_OK;
    silu_mul_kernel<<<grid, 256, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

__global__ void sigmoid_mul_kernel(hpd_sigmoid_mul_args_t a)
{
    const uint32_t t = blockIdx.x;
    for (uint32_t e = threadIdx.x; e < a.n_heads * a.dim; e += blockDim.x) {
        const uint32_t h = e / a.dim, d = e % a.dim;
        float *x = a.x.p + (size_t)t * a.x.ld + (size_t)h * a.x.hs + d;
        const float g = a.gate.p[(size_t)t * a.gate.ld + (size_t)h * a.gate.hs + d];
        *x = *x * (1.0f / (1.0f + expf(-g)));
    }
}

hpd_status_t hpd_cuda_sigmoid_mul(hpd_backend_t *b, const hpd_sigmoid_mul_args_t *a)
{
    if (a->n_tokens > 0)
        sigmoid_mul_kernel<<<a->n_tokens, 256, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

__global__ void gdn_gating_kernel(hpd_gdn_gating_args_t a)
{
    for (uint32_t h = threadIdx.x; h < a.nv; h += blockDim.x)
        hpd_gdn_gate(a, blockIdx.x, h);
}

hpd_status_t hpd_cuda_gdn_gating(hpd_backend_t *b, const hpd_gdn_gating_args_t *a)
{
    if (a->n_tokens > 0)
        gdn_gating_kernel<<<a->n_tokens, 64, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* One block per row, threads over the columns: the fixed tree of
 * hpd_tp_tree (adds only: nothing for nvcc to contract) */
__global__ void tp_sum_kernel(hpd_tp_sum_args_t a)
{
    const uint32_t r = blockIdx.x;
    for (uint32_t c = threadIdx.x; c < a.n; c += blockDim.x) {
        float v[HPD_TP_GROUPS];
        for (uint32_t i = 0; i < a.n_parts; i++)
            v[i] = a.parts[i][(size_t)r * a.ld_parts + c];
        const float s = hpd_tp_tree(v, a.n_parts);
        float *y = a.y + (size_t)r * a.ldy + c;
        *y = a.accumulate ? __fadd_rn(*y, s) : s;
    }
}

hpd_status_t hpd_cuda_tp_sum(hpd_backend_t *b, const hpd_tp_sum_args_t *a)
{
    if (a->n_parts < 1 || a->n_parts > HPD_TP_GROUPS || (a->n_parts & (a->n_parts - 1)) != 0) {
        HPD_LOG_ERROR("cuda", "tp_sum of %u parts (expected 1, 2, 4 or 8)", a->n_parts);
        return HPD_ERR_INVALID_ARG;
    }
    if (a->m > 0 && a->n > 0)
        tp_sum_kernel<<<a->m, 256, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
