/* The CPU backend's ops, shared between its files. */
#ifndef HPD_KERNELS_CPU_OPS_H
#define HPD_KERNELS_CPU_OPS_H

#include "kernels/backend.h"

typedef struct {
    int n_threads;
    /* the GEMM's FP8 dequantisation tiles, one per thread (grown on demand) */
    float *f8_tiles;
    size_t f8_floats;
    /* gemm_sum's group products of a tile, one set per thread (grown on
     * demand) */
    float *sum_tiles;
    size_t sum_floats;
    /* device cpu-bf16 (gemm_bf16.c): x's rows rounded to bf16 (grown on
     * demand) */
    uint16_t *xb;
    size_t xb_elems;
} hpd_cpu_ctx_t;

static inline int hpd_cpu_threads(hpd_backend_t *b)
{
    return ((hpd_cpu_ctx_t *)b->ctx)->n_threads;
}

hpd_status_t hpd_cpu_embed(hpd_backend_t *b, const hpd_embed_args_t *a);
hpd_status_t hpd_cpu_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cpu_gemm_sum(hpd_backend_t *b, const hpd_gemm_sum_args_t *a);
/* gemm_sum's experts' form (first set): each expert's rows against its
 * matrices, one dense gemm_sum (dense) each; rows of no expert untouched */
hpd_status_t hpd_cpu_gemm_sum_experts(hpd_backend_t *b, const hpd_gemm_sum_args_t *a,
                                      hpd_status_t (*dense)(hpd_backend_t *,
                                                            const hpd_gemm_sum_args_t *));
/* bf16 products (gemm_bf16.c): the GEMM of device cpu-bf16 for BF16
 * weights; the scalar sequence of one of its outputs, over x already
 * rounded (hpd_cpu_round_bf16), which the kernels reproduce bit for bit;
 * whether this build uses the VDPBF16PS instruction (else the sequence lane
 * by lane) */
hpd_status_t hpd_cpu_gemm_bf16_products(hpd_backend_t *b, const hpd_gemm_args_t *a);
/* gemm_sum for device cpu-bf16: its gemm's products (bf16 products for
 * BF16 weights), the groups added by the tree */
hpd_status_t hpd_cpu_gemm_sum_bf16_products(hpd_backend_t *b, const hpd_gemm_sum_args_t *a);
float hpd_cpu_bf16_dot_ref(const uint16_t *x, const uint16_t *w, uint32_t k);
uint16_t hpd_cpu_round_bf16(float f);
bool hpd_cpu_bf16_native(void);
hpd_status_t hpd_cpu_rmsnorm(hpd_backend_t *b, const hpd_rmsnorm_args_t *a);
hpd_status_t hpd_cpu_gated_rmsnorm(hpd_backend_t *b, const hpd_gated_rmsnorm_args_t *a);
hpd_status_t hpd_cpu_l2norm(hpd_backend_t *b, const hpd_l2norm_args_t *a);
hpd_status_t hpd_cpu_rope(hpd_backend_t *b, const hpd_rope_args_t *a);
hpd_status_t hpd_cpu_silu_mul(hpd_backend_t *b, const hpd_silu_mul_args_t *a);
hpd_status_t hpd_cpu_sigmoid_mul(hpd_backend_t *b, const hpd_sigmoid_mul_args_t *a);
hpd_status_t hpd_cpu_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a);
hpd_status_t hpd_cpu_attention(hpd_backend_t *b, const hpd_attention_args_t *a);
hpd_status_t hpd_cpu_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a);
hpd_status_t hpd_cpu_gdn_gating(hpd_backend_t *b, const hpd_gdn_gating_args_t *a);
hpd_status_t hpd_cpu_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cpu_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cpu_sample(hpd_backend_t *b, const hpd_sample_args_t *a);
hpd_status_t hpd_cpu_kv_translate(hpd_backend_t *b, const hpd_kv_translate_args_t *a);
hpd_status_t hpd_cpu_slot_copy(hpd_backend_t *b, const hpd_slot_copy_args_t *a);
hpd_status_t hpd_cpu_gather(hpd_backend_t *b, const hpd_gather_args_t *a);
hpd_status_t hpd_cpu_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a);
hpd_status_t hpd_cpu_tp_sum(hpd_backend_t *b, const hpd_tp_sum_args_t *a);
hpd_status_t hpd_cpu_moe_route(hpd_backend_t *b, const hpd_moe_route_args_t *a);

#endif
