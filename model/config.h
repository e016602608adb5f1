/* Model configuration read from a Hugging Face config.json. */
#ifndef HPD_MODEL_CONFIG_H
#define HPD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"
#include "kernels/moe_route.h" /* HPD_MAX_EXPERTS, HPD_MAX_TOPK */

#define HPD_MAX_LAYERS 256
#define HPD_MAX_EOS 8 /* end-of-sequence ids a model may declare */

typedef enum {
    HPD_ARCH_QWEN3_NEXT = 0,   /* model_type "qwen3_next" */
    HPD_ARCH_QWEN3_5_TEXT = 1, /* model_type "qwen3_5_text" */
    HPD_ARCH_QWEN3_5 = 2,      /* model_type "qwen3_5" with a nested text_config */
} hpd_model_arch_t;
/* qwen3_5_moe_text and qwen3_5_moe (Qwen3.5-MoE) are QWEN3_5_TEXT and
 * QWEN3_5 with moe_family set: every layer's MLP is a mixture of experts. */

typedef struct {
    hpd_model_arch_t arch;
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size; /* the dense MLP's (0 when every layer is MoE) */
    uint32_t n_layers;
    /* mixture of experts (Qwen3-Next; Qwen3.5-MoE): a layer's MLP is a
     * router over n_experts experts of moe_inter, top_k of them per token
     * (weights renormalised when norm_topk), plus a shared expert of
     * shared_inter gated by sigmoid(shared_expert_gate) (0: none) */
    bool moe_family; /* model_type qwen3_5_moe or qwen3_5_moe_text */
    uint32_t n_experts, top_k, moe_inter, shared_inter;
    bool norm_topk;
    bool layer_moe[HPD_MAX_LAYERS];
    uint32_t n_moe_layers;
    /* quantization_config {quant_method: fp8, weight_block_size: [rows,
     * cols]}: F8_E4M3 weights with weight_scale_inv per block; 0: none */
    uint32_t fp8_block_rows, fp8_block_cols;
    bool layer_full[HPD_MAX_LAYERS]; /* true: gated full attention; false: GDN */
    /* gated full attention */
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t rot_dim; /* head_dim * partial_rotary_factor, even */
    float rope_theta;
    float partial_rotary_factor;
    /* YaRN (rope_type "yarn"), as transformers' _compute_yarn_parameters:
     * the scale factor (0: no YaRN), the ramp's start and width over the
     * rotary pairs (from beta_fast / beta_slow and
     * original_max_position_embeddings) and the attention factor that
     * scales cos and sin */
    float yarn_factor, yarn_low, yarn_span, yarn_attention;
    /* as read, resolved into the above once the rotary dimension is known */
    double yarn_raw_factor, yarn_beta_fast, yarn_beta_slow, yarn_raw_attention;
    double yarn_mscale, yarn_mscale_all_dim;
    uint32_t yarn_original_max_pos;
    bool yarn, yarn_truncate;
    float rms_norm_eps;
    /* Gated DeltaNet */
    uint32_t lin_n_k_heads;
    uint32_t lin_n_v_heads;
    uint32_t lin_k_dim;
    uint32_t lin_v_dim;
    uint32_t conv_kernel;
    bool tie_word_embeddings;
    /* end-of-sequence ids: generation_config.json's eos_token_id where the
     * directory has one, else config.json's (an int or a list); 0 ids: none */
    uint32_t n_eos;
    int32_t eos_ids[HPD_MAX_EOS];
    /* generation_config.json's sampling defaults for a request that does not
     * set them (temperature, top_p, top_k; do_sample false: greedy); greedy
     * values where it is silent or absent */
    hpd_sampling_t gen_sampling;
    uint32_t max_position_embeddings;
    /* derived */
    uint32_t n_full_layers;   /* A: full-attention layers */
    uint32_t n_linear_layers; /* GDN layers */
    uint32_t kind_index[HPD_MAX_LAYERS]; /* index of layer i among the layers of its kind */
    uint32_t conv_dim;        /* 2 * nk * dk + nv * dv */
} hpd_model_config_t;

/* Parses config.json text. `origin` names the file in error messages. Errors
 * (malformed JSON, a missing or ill-typed field, a MoE model, an unsupported
 * rope type) are logged with the field and what was expected, and return
 * HPD_ERR_FORMAT or HPD_ERR_UNSUPPORTED. */
hpd_status_t hpd_model_config_parse(const char *json_text, const char *origin,
                                    hpd_model_config_t *config_p);

/* Reads and parses DIR/config.json. */
hpd_status_t hpd_model_config_load(const char *model_dir, hpd_model_config_t *config_p);

/* Name of an architecture as it appears in model_type. */
const char *hpd_model_arch_name(hpd_model_arch_t arch);

/* Bytes of one GDN layer's state in a slot: recurrent [nv][dk][dv] fp32 then
 * conv state [conv_dim][kc-1] fp32. */
uint64_t hpd_model_config_gdn_layer_bytes(const hpd_model_config_t *config);

#endif
