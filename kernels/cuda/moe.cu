/* The mixture of experts' data movement on the GPU (backend.h): gathering
 * each expert's rows, and the weighted sum of a token's experts into the
 * residual with the CPU's sequence of roundings (product, then sum, j in
 * order; explicit _rn intrinsics so nothing is fused). */
#include "kernels/cuda/cuda_ops.h"

__global__ void gather_kernel(const float *src, uint32_t ld_src, const uint32_t *idx,
                              uint32_t dim, float *dst, uint32_t ld_dst)
{
    const uint32_t i = blockIdx.x;
    const float *s = src + (size_t)idx[i] * ld_src;
    for (uint32_t d = threadIdx.x; d < dim; d += blockDim.x)
        dst[(size_t)i * ld_dst + d] = s[d];
}

hpd_status_t hpd_cuda_gather(hpd_backend_t *b, const hpd_gather_args_t *a)
{
    void *idx;
    hpd_status_t st;
    if (a->n == 0)
        return HPD_OK;
    const hpd_cuda_meta_t m = {.host = a->idx, .bytes = a->n * sizeof(uint32_t), .dev_p = &idx};
    if ((st = hpd_cuda_stage(b, &m, 1)) != HPD_OK)
        return st;
    gather_kernel<<<a->n, 256, 0, hpd_cuda_ctx(b)->stream>>>(
        a->src, a->ld_src, (const uint32_t *)idx, a->dim, a->dst, a->ld_dst);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* One block per token, threads over the elements. */
__global__ void combine_kernel(hpd_moe_combine_args_t a, const uint32_t *slots,
                               const float *weights)
{
    const uint32_t t = blockIdx.x;
    const float sg = a.shared != NULL ? hpd_sigmoidf(a.gate[(size_t)t * a.ld_gate]) : 0.0f;
    for (uint32_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < a.top_k; j++) {
            const uint32_t s = slots[(size_t)t * a.top_k + j];
            acc = __fadd_rn(acc, __fmul_rn(weights[(size_t)t * a.top_k + j],
                                           a.rows[(size_t)s * a.ld_rows + d]));
        }
        if (a.shared != NULL)
            acc = __fadd_rn(acc, __fmul_rn(sg, a.shared[(size_t)t * a.ld_shared + d]));
        float *x = a.x + (size_t)t * a.ldx + d;
        *x = __fadd_rn(*x, acc);
    }
}

hpd_status_t hpd_cuda_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a)
{
    const size_t n = (size_t)a->n_tokens * a->top_k;
    void *slots, *weights;
    hpd_status_t st;
    if (a->n_tokens == 0)
        return HPD_OK;
    const hpd_cuda_meta_t m[] = {
        {.host = a->slots, .bytes = n * sizeof(uint32_t), .dev_p = &slots},
        {.host = a->weights, .bytes = n * sizeof(float), .dev_p = &weights}};
    if ((st = hpd_cuda_stage(b, m, 2)) != HPD_OK)
        return st;
    combine_kernel<<<a->n_tokens, 256, 0, hpd_cuda_ctx(b)->stream>>>(
        *a, (const uint32_t *)slots, (const float *)weights);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
