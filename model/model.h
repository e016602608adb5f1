/* A loaded model: its configuration and weights in the engine's fused
 * layout (both Hugging Face namings load into the same layout). Weight
 * matrices keep the checkpoint's dtype (F32, BF16 or F16; F32 where the
 * tensors fused into one differ); vectors (norms, the convolution, A_log,
 * dt_bias) are fp32. */
#ifndef HPD_MODEL_MODEL_H
#define HPD_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"
#include "model/config.h"
#include "model/shard.h"

/* A projection fused from several checkpoint tensors (q|k|v, gate|up, ...):
 * one matrix of their rows when their dtypes agree, else a run of parts,
 * each of consecutive rows in its own dtype (an FP8 release's bf16 router
 * beside its FP8 shared expert), so nothing is widened to fp32. */
#define HPD_MAX_PARTS 4
typedef struct {
    uint32_t n;                     /* parts */
    uint32_t rows[HPD_MAX_PARTS];   /* rows of each part, in order */
    hpd_weight_t part[HPD_MAX_PARTS];
} hpd_fused_t;

/* Weight matrices are row-major [out][in], as Hugging Face stores Linear.
 *
 * A rank's model (hpd_model_load_tp) holds its shard (model/shard.h):
 * config is the rank's (its heads, conv channels and intermediate sizes;
 * vocab_size the whole vocabulary), embed and lm_head its vocabulary rows.
 *
 * Row-parallel matrices (the products TP reduces across ranks: attn_o,
 * gdn_out, mlp_down, shared_down, moe_down) are stored group by group for
 * the canonical sum (kernels/tp_sum.h): the rank's groups g of the whole
 * K (hpd_tp_group), each a [rows][group's columns] matrix after the one
 * before, FP8 scales likewise [rows][its blocks] (hpd_model_group). At TP 1
 * the 8 groups hold the whole matrix. */
typedef struct {
    float *input_norm; /* [H] zero-centred RMSNorm weight */
    float *post_norm;  /* [H] */
    hpd_fused_t mlp_gate_up;  /* [2*I][H]: gate rows then up rows (dense MLP) */
    hpd_weight_t mlp_down;    /* [H][I], row-parallel */
    /* mixture of experts (layer_moe), E experts of Im, a shared one of Is */
    hpd_fused_t moe_in;       /* [E + 1 + 2*Is][H]: router, shared gate, shared gate|up
                                 (Is = 0: the router's E rows) */
    hpd_weight_t moe_gate_up; /* [E][2*Im][H]: per expert gate rows then up rows */
    hpd_weight_t moe_down;    /* [E][H][Im], row-parallel: group g is [E][H][Im group g] */
    hpd_weight_t shared_down; /* [H][Is], row-parallel */
    /* full attention (layer_full) */
    hpd_fused_t attn_qkv;  /* [nh*2*hd + 2*nkv*hd][H]: per head [q|gate], then k, then v */
    hpd_weight_t attn_o;   /* [H][nh*hd], row-parallel */
    float *q_norm;   /* [hd] */
    float *k_norm;   /* [hd] */
    /* Gated DeltaNet (!layer_full) */
    hpd_fused_t gdn_in;       /* [conv_dim + nv*dv + 2*nv][H]: q|k|v, z, b, a */
    float *gdn_conv;    /* [conv_dim][kc] */
    float *gdn_a_log;   /* [nv] */
    float *gdn_dt_bias; /* [nv] */
    float *gdn_norm;    /* [dv] plain (not zero-centred) RMSNorm weight */
    hpd_weight_t gdn_out;     /* [H][nv*dv], row-parallel */
} hpd_layer_weights_t;

typedef struct {
    hpd_model_config_t config; /* the rank's (above) */
    hpd_model_config_t whole;  /* the whole model's (config at tp 1): a node's shard map */
    hpd_shard_t shard;         /* tp 1: everything */
    hpd_weight_t embed;      /* [V][H] */
    float *final_norm; /* [H] */
    hpd_weight_t lm_head;    /* [V][H]; == embed when tied */
    hpd_layer_weights_t layers[HPD_MAX_LAYERS];
    uint8_t fingerprint[16]; /* XXH3-128 of config.json and every tensor */
    /* tensors of the checkpoint that text generation does not use, skipped
     * (logged once): the vision tower (model.visual.*) and the MTP head (mtp.*) */
    uint32_t skipped_visual, skipped_mtp;
    uint64_t n_params;
    uint64_t weight_bytes; /* resident bytes of every tensor (a tied head counted once) */
} hpd_model_t;

/* A tensor of a model: where its pointer sits (a matrix's hpd_weight_t.p or
 * a vector's float *), its dtype and its size. */
typedef struct {
    void **slot;
    hpd_dtype_t dtype;
    uint64_t elements, bytes;
    const hpd_weight_t *matrix; /* a matrix's weight (its cols below); NULL for vectors */
    uint64_t rows, cols;
    uint32_t k_full; /* a row-parallel matrix: the whole K, its groups' (else 0) */
    bool is_scale; /* an FP8 matrix's scales (the entry after it) */
} hpd_model_tensor_t;

#define HPD_MODEL_MAX_TENSORS (4 + 20 * HPD_MAX_LAYERS)

/* Lists every tensor of m (lm_head only when it is not tied to embed), in a
 * fixed order, into out (HPD_MODEL_MAX_TENSORS entries). Returns the count.
 * Slots of tensors not loaded (yet) hold NULL. */
uint32_t hpd_model_tensors(hpd_model_t *m, hpd_model_tensor_t *out);

/* Element e of tensor t of m, in fp32 (an FP8 one times its scale). */
float hpd_model_tensor_value(const hpd_model_t *m, const hpd_model_tensor_t *t, uint64_t e);

/* Group g of a row-parallel matrix w of `rows` rows over k_full columns,
 * as the rank of shard s stores it (g among its groups): a [rows][*k_p]
 * matrix whose columns start at column *col_p of the rank's part of x. */
hpd_weight_t hpd_model_group(const hpd_weight_t *w, uint64_t rows, uint32_t k_full,
                             const hpd_shard_t *s, uint32_t g, uint32_t *col_p, uint32_t *k_p);

/* Loads DIR (config.json + safetensors). Any missing tensor, wrong shape,
 * unsupported dtype or bad file is logged, naming the file, the tensor and
 * what was expected, and returned as an error. */
hpd_status_t hpd_model_load(const char *model_dir, hpd_model_t **model_p);

/* Loads the tp shards of DIR into models[0 .. tp) (model/shard.h), each
 * with only its part of every tensor; the files are opened and hashed
 * once. A degree the model cannot run at is refused (HPD_ERR_INVALID_ARG)
 * naming the layer and the numbers. fast: the row-parallel matrices in one
 * group a rank instead of the canonical sum's 8 (one GEMM a product; the
 * numerics then depend on tp: hpd-run --tp-fast). */
hpd_status_t hpd_model_load_tp(const char *model_dir, uint32_t tp, bool fast,
                               hpd_model_t **models);

/* Frees the weights. Accepts NULL. */
void hpd_model_destroy(hpd_model_t *model);

/* Hex form of the fingerprint (33 bytes with the NUL). */
void hpd_model_fingerprint_hex(const hpd_model_t *model, char out[33]);

/* Rows of the fused GDN input projection, of the attention projection and
 * of a MoE layer's input projection (router, shared gate and expert). */
uint32_t hpd_model_gdn_in_rows(const hpd_model_config_t *config);
uint32_t hpd_model_moe_in_rows(const hpd_model_config_t *config);
uint32_t hpd_model_attn_qkv_rows(const hpd_model_config_t *config);

#endif
