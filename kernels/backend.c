#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/log.h"
#include "kernels/moe_route.h"

hpd_status_t hpd_backend_create(const hpd_backend_params_t *params, hpd_backend_t **backend_p)
{
    const char *device = params->device ? params->device : "cpu";

    if (strcmp(device, "cpu") == 0 || strcmp(device, "cpu-bf16") == 0)
        return hpd_backend_cpu_create(params, backend_p);
    if (strncmp(device, "cuda", 4) == 0) {
#ifdef HPD_HAVE_CUDA
        return hpd_backend_cuda_create(params, backend_p);
#else
        HPD_LOG_ERROR("backend", "device '%s': this build has no CUDA backend", device);
        return HPD_ERR_UNSUPPORTED;
#endif
    }
    HPD_LOG_ERROR("backend", "device '%s' is unknown (expected cpu, cpu-bf16, cuda[:N], "
                  "cuda-bf16[:N] or cuda-fast[:N])",
                  device);
    return HPD_ERR_INVALID_ARG;
}

hpd_status_t hpd_backend_create_ranks(const hpd_backend_params_t *params, uint32_t tp,
                                      hpd_backend_t **backends)
{
    hpd_backend_params_t bp = *params;
    hpd_status_t st = HPD_OK;
    if (tp > 1) {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        const uint32_t all = bp.n_threads > 0 ? bp.n_threads : (uint32_t)(cores > 0 ? cores : 1);
        bp.n_threads = all / tp > 0 ? all / tp : 1;
    }
    for (uint32_t r = 0; r < tp && st == HPD_OK; r++)
        if ((st = hpd_backend_create(&bp, &backends[r])) != HPD_OK)
            for (uint32_t k = 0; k < r; k++) {
                hpd_backend_destroy(backends[k]);
                backends[k] = NULL;
            }
    return st;
}

void hpd_backend_destroy(hpd_backend_t *backend)
{
    if (backend != NULL)
        backend->ops->destroy(backend);
}

float hpd_rope_inv_freq(const hpd_rope_args_t *a, uint32_t i)
{
    const float p = powf(a->theta, (float)(2 * i) / (float)a->rot_dim);
    if (!(a->yarn_factor > 0.0f))
        return 1.0f / p;
    float ramp = ((float)i - a->yarn_low) / a->yarn_span;
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    const float e = 1.0f - ramp;
    /* four roundings, no fused multiply-add (-ffp-contract=off): as torch's
     * elementwise ops */
    const float interp = 1.0f / (a->yarn_factor * p), extrap = 1.0f / p;
    return interp * (1.0f - e) + extrap * e;
}

void hpd_rope_inv_freq_table(const hpd_rope_args_t *a, float *inv_freq)
{
    for (uint32_t i = 0; i < a->rot_dim / 2; i++)
        inv_freq[i] = hpd_rope_inv_freq(a, i);
}

hpd_status_t hpd_backend_hash_pieces(hpd_backend_t *b, const hpd_hash_pieces_args_t *a)
{
    if (b->ops->hash_pieces != NULL)
        return b->ops->hash_pieces(b, a);
    const bool host = hpd_backend_host_memory(b);
    uint8_t *tmp = NULL;
    uint64_t k = 0;
    for (uint32_t i = 0; i < a->n_spans; i++) {
        const uint8_t *p = a->spans[i].ptr;
        for (uint64_t off = 0; off < a->spans[i].bytes; off += HPD_HASH_PIECE_BYTES) {
            const uint64_t len = hpd_hash_piece_len(a->spans[i].bytes, off);
            const uint8_t *piece = p + off;
            if (!host) {
                hpd_status_t st;
                if (tmp == NULL && (tmp = malloc(HPD_HASH_PIECE_BYTES)) == NULL)
                    return HPD_ERR_NO_MEMORY;
                if ((st = hpd_backend_to_host(b, tmp, piece, len)) != HPD_OK) {
                    free(tmp);
                    return st;
                }
                piece = tmp;
            }
            a->out[k++] = hpd_hash_piece(piece, len);
        }
    }
    free(tmp);
    return HPD_OK;
}

hpd_status_t hpd_norm_rope(hpd_backend_t *b, const hpd_norm_rope_args_t *a)
{
    return b->ops->norm_rope != NULL ? b->ops->norm_rope(b, a) : hpd_norm_rope_unfused(b, a);
}

hpd_status_t hpd_norm_rope_unfused(hpd_backend_t *b, const hpd_norm_rope_args_t *a)
{
    hpd_rope_args_t qr = a->rope, kr = a->rope;
    qr.x = a->q.y, qr.n_tokens = a->q.n_tokens, qr.n_heads = a->q.n_heads, qr.head_dim = a->q.dim;
    kr.x = a->k.y, kr.n_tokens = a->k.n_tokens, kr.n_heads = a->k.n_heads, kr.head_dim = a->k.dim;
    hpd_status_t st;
    if ((st = hpd_rmsnorm(b, &a->q)) != HPD_OK || (st = hpd_rmsnorm(b, &a->k)) != HPD_OK ||
        (st = hpd_rope(b, &qr)) != HPD_OK)
        return st;
    return hpd_rope(b, &kr);
}

hpd_status_t hpd_l2norm_gating(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a)
{
    return b->ops->l2norm_gating != NULL ? b->ops->l2norm_gating(b, a)
                                         : hpd_l2norm_gating_unfused(b, a);
}

hpd_status_t hpd_l2norm_gating_unfused(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a)
{
    hpd_status_t st;
    if ((st = hpd_l2norm(b, &a->q)) != HPD_OK || (st = hpd_l2norm(b, &a->k)) != HPD_OK)
        return st;
    return hpd_gdn_gating(b, &a->gate);
}

hpd_status_t hpd_moe_route_check(const hpd_moe_route_args_t *a)
{
    if (a->n_experts == 0 || a->n_experts > HPD_MAX_EXPERTS || a->top_k == 0 ||
        a->top_k > a->n_experts || a->top_k > HPD_MAX_TOPK || a->ld < a->n_experts) {
        HPD_LOG_ERROR("backend",
                      "moe_route of %u experts (1 to %u), %u a token (1 to %u, at most the "
                      "experts), rows of %u logits (at least the experts)",
                      a->n_experts, HPD_MAX_EXPERTS, a->top_k, HPD_MAX_TOPK, a->ld);
        return HPD_ERR_INVALID_ARG;
    }
    return HPD_OK;
}

hpd_status_t hpd_gemm_grouped(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a)
{
    if (a->g.m > 0 && (a->n_groups == 0 || a->n_groups > HPD_MAX_EXPERTS || a->max_rows == 0)) {
        HPD_LOG_ERROR("backend",
                      "grouped GEMM of %u rows in %u groups (1 to %u), at most %u rows a group "
                      "(1 or more)",
                      a->g.m, a->n_groups, HPD_MAX_EXPERTS, a->max_rows);
        return HPD_ERR_INVALID_ARG;
    }
    if (b->ops->gemm_grouped != NULL)
        return b->ops->gemm_grouped(b, a);
    const size_t first_bytes = ((size_t)a->n_groups + 1) * sizeof(uint32_t);
    const uint32_t *first = a->first;
    uint32_t *copy = NULL;
    hpd_status_t st = HPD_OK;
    if (!hpd_backend_host_memory(b)) {
        if ((copy = malloc(first_bytes)) == NULL)
            return HPD_ERR_NO_MEMORY;
        if ((st = hpd_backend_to_host(b, copy, a->first, first_bytes)) != HPD_OK) {
            free(copy);
            return st;
        }
        first = copy;
    }
    const size_t w_bytes = (size_t)a->g.n * a->g.k * hpd_dtype_size(a->g.w_dtype);
    for (uint32_t x = 0; x < a->n_groups && st == HPD_OK; x++) {
        const uint32_t r0 = first[x], rows = first[x + 1] - first[x];
        if (rows == 0)
            continue;
        hpd_gemm_args_t g = a->g;
        g.x += (size_t)r0 * g.ldx;
        g.y += (size_t)r0 * g.ldy;
        g.w = (const char *)g.w + x * w_bytes;
        if (g.w_scale != NULL)
            g.w_scale += (size_t)x * g.n * g.w_scale_ld;
        g.m = rows;
        st = hpd_gemm(b, &g);
    }
    free(copy);
    return st;
}
