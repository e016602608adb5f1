/* The mixture of experts on the CPU: the routing (kernels/moe_route.h),
 * gathering each expert's rows, and the weighted sum of a token's experts
 * into the residual in a fixed order (backend.h). The experts' products
 * are GEMMs (hpd_gemm_grouped's gemm per expert). */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/moe_route.h"

hpd_status_t hpd_cpu_moe_route(hpd_backend_t *b, const hpd_moe_route_args_t *a)
{
    const hpd_status_t st = hpd_moe_route_check(a);
    if (st != HPD_OK)
        return st;
    const int threads = (uint64_t)a->n_tokens * a->n_experts >= (1u << 16) ? hpd_cpu_threads(b) : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < a->n_tokens; t++)
        hpd_moe_route_token(a->logits + (size_t)t * a->ld, a->n_experts, a->top_k, a->norm,
                            a->ids + (size_t)t * a->top_k, a->weights + (size_t)t * a->top_k);
    hpd_moe_number(a->ids, a->n_tokens, a->top_k, a->n_experts, a->slots, a->idx, a->first);
    return HPD_OK;
}

hpd_status_t hpd_cpu_gather(hpd_backend_t *b, const hpd_gather_args_t *a)
{
    const uint32_t *idx = a->idx_dev != NULL ? a->idx_dev : a->idx; /* both host memory */
    for (uint32_t i = 0; i < a->n; i++)
        memcpy(a->dst + (size_t)i * a->ld_dst, a->src + (size_t)idx[i] * a->ld_src,
               a->dim * sizeof(float));
    return HPD_OK;
}

#define DB 256 /* elements per block of the accumulator */

hpd_status_t hpd_cpu_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a)
{
    const int threads = (uint64_t)a->n_tokens * a->top_k * a->dim >= (1u << 16)
                            ? hpd_cpu_threads(b)
                            : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        float *x = a->x + (size_t)t * a->ldx, acc[DB];
        const uint32_t *slots = a->slots + (size_t)t * a->top_k;
        const float *wt = a->weights + (size_t)t * a->top_k;
        const float sg = a->shared != NULL ? hpd_sigmoidf(a->gate[(size_t)t * a->ld_gate]) : 0;
        for (uint32_t d0 = 0; d0 < a->dim; d0 += DB) {
            const uint32_t n = a->dim - d0 < DB ? a->dim - d0 : DB;
            for (uint32_t d = 0; d < n; d++)
                acc[d] = 0.0f;
            /* each element: its own sequence of roundings, j in order */
            for (uint32_t j = 0; j < a->top_k; j++) {
                const float *row = a->rows + (size_t)slots[j] * a->ld_rows + d0;
                for (uint32_t d = 0; d < n; d++)
                    acc[d] = acc[d] + wt[j] * row[d];
            }
            if (a->shared != NULL) {
                const float *sh = a->shared + (size_t)t * a->ld_shared + d0;
                for (uint32_t d = 0; d < n; d++)
                    acc[d] = acc[d] + sg * sh[d];
            }
            for (uint32_t d = 0; d < n; d++)
                x[d0 + d] = x[d0 + d] + acc[d];
        }
    }
    return HPD_OK;
}
