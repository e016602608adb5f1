/* The CPU backend: host memory and the ops of kernels/cpu/. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cpu/cpu_ops.h"

static void cpu_destroy(hpd_backend_t *b)
{
    free(((hpd_cpu_ctx_t *)b->ctx)->f8_tiles);
    free(((hpd_cpu_ctx_t *)b->ctx)->sum_tiles);
    free(((hpd_cpu_ctx_t *)b->ctx)->xb);
    free(b->ctx);
    free(b);
}

static hpd_status_t cpu_alloc(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    void *p = NULL;

    /* 64-byte alignment: cache lines, and any vector width we use */
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) & ~(size_t)63 : 64) != 0) {
        HPD_LOG_ERROR("cpu", "allocation of %zu bytes failed", bytes);
        return HPD_ERR_NO_MEMORY;
    }
    *ptr_p = p;
    return HPD_OK;
}

static void cpu_free(hpd_backend_t *b, void *ptr)
{
    free(ptr);
}

static hpd_status_t cpu_memset(hpd_backend_t *b, void *ptr, int value, size_t bytes)
{
    memset(ptr, value, bytes);
    return HPD_OK;
}

static hpd_status_t cpu_copy(hpd_backend_t *b, void *dst, const void *src, size_t bytes)
{
    memmove(dst, src, bytes);
    return HPD_OK;
}

static hpd_status_t cpu_bf16_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    return a->w_dtype == HPD_DTYPE_BF16 ? hpd_cpu_gemm_bf16_products(b, a) : hpd_cpu_gemm(b, a);
}

#define CPU_OPS(name_, numerics_, gemm_, gemm_sum_)                                             \
    {                                                                                           \
        .name = name_, .numerics = numerics_, .host_memory = true, .destroy = cpu_destroy,      \
        .alloc = cpu_alloc, .free = cpu_free, .memset = cpu_memset, .copy = cpu_copy,           \
        .to_host = cpu_copy, .from_host = cpu_copy, .embed = hpd_cpu_embed, .gemm = gemm_,      \
        .rmsnorm = hpd_cpu_rmsnorm, .gated_rmsnorm = hpd_cpu_gated_rmsnorm,                     \
        .l2norm = hpd_cpu_l2norm, .rope = hpd_cpu_rope, .silu_mul = hpd_cpu_silu_mul,           \
        .sigmoid_mul = hpd_cpu_sigmoid_mul, .kv_store = hpd_cpu_kv_store,                       \
        .attention = hpd_cpu_attention, .conv1d = hpd_cpu_conv1d,                               \
        .conv1d_step = hpd_cpu_conv1d, .gdn_gating = hpd_cpu_gdn_gating,                        \
        .gdn_chunked = hpd_cpu_gdn_chunked, .gdn_recurrent = hpd_cpu_gdn_recurrent,             \
        .sample = hpd_cpu_sample, .kv_translate = hpd_cpu_kv_translate,                         \
        .slot_copy = hpd_cpu_slot_copy, .gather = hpd_cpu_gather,                               \
        .moe_combine = hpd_cpu_moe_combine, .moe_route = hpd_cpu_moe_route,                     \
        .tp_sum = hpd_cpu_tp_sum, .gemm_sum = gemm_sum_,                                        \
    }

static const hpd_backend_ops_t cpu_ops = CPU_OPS("cpu", "fp32", hpd_cpu_gemm, hpd_cpu_gemm_sum);
/* bf16 products: a build without AVX512_BF16 computes the same sequence
 * lane by lane; whether the instruction rounds as that sequence does is
 * checked by test_gemm on machines that have it, so the two are named
 * apart and a cluster does not mix them */
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
static const hpd_backend_ops_t cpu_bf16_ops =
    CPU_OPS("cpu-bf16", "bf16-products", cpu_bf16_gemm, hpd_cpu_gemm_sum_bf16_products);
#else
static const hpd_backend_ops_t cpu_bf16_ops =
    CPU_OPS("cpu-bf16", "bf16-products-emulated", cpu_bf16_gemm,
            hpd_cpu_gemm_sum_bf16_products);
#endif


hpd_status_t hpd_backend_cpu_create(const hpd_backend_params_t *params,
                                    hpd_backend_t **backend_p)
{
    hpd_backend_t *b = calloc(1, sizeof(*b));
    hpd_cpu_ctx_t *ctx = calloc(1, sizeof(*ctx));

    if (b == NULL || ctx == NULL) {
        free(b);
        free(ctx);
        return HPD_ERR_NO_MEMORY;
    }
    ctx->n_threads = params->n_threads ? (int)params->n_threads : omp_get_num_procs();
    const bool bf16 = params->device != NULL && strcmp(params->device, "cpu-bf16") == 0;
    b->ops = bf16 ? &cpu_bf16_ops : &cpu_ops;
    b->ctx = ctx;
    *backend_p = b;
    return HPD_OK;
}
