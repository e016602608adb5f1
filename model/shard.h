/* Tensor parallelism's shard map (issue 37; docs/tensor_parallel.md): which
 * part of every layer rank r of a node at TP degree N holds, and which KV
 * heads and GDN heads a prefill rank sends to a decode rank when the two
 * sides run different degrees. Pure functions of the model's config: the
 * loader, the engine and the transfer all ask here, so that they agree.
 *
 * - Full attention: query heads split evenly. KV heads split evenly when N
 *   divides them; when N exceeds them (Qwen3-Next and Qwen3.5 have 2), N
 *   must be a multiple of them and rank r holds KV head floor(r * kv / N):
 *   consecutive ranks share a head (0,0,1,1 for 2 heads at TP 4, never
 *   0,1,0,1), and its query heads are that head's group.
 * - GDN: key heads and value heads split evenly (a rank's value heads are
 *   its key heads' groups), with A_log, dt_bias, the gated norm, the
 *   recurrent state by value heads and the conv weights and state per
 *   segment (q | k | v, each split on its own by its heads).
 * - MLP, shared expert and each MoE expert: the intermediate dimension
 *   split evenly (gate and up by rows, down by columns); the router
 *   replicated.
 * - Embedding and LM head: the vocabulary in N contiguous ranges, as even
 *   as the size allows (it need not divide).
 * What must divide and does not is refused, naming the layer and both
 * numbers. */
#ifndef HPD_MODEL_SHARD_H
#define HPD_MODEL_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/config.h"

/* The largest TP degree: the canonical reduction cuts every row-parallel
 * product into this many groups (docs/tensor_parallel.md). */
#define HPD_TP_MAX 8

typedef struct {
    uint32_t begin, end; /* [begin, end) */
} hpd_range_t;

typedef struct {
    uint32_t tp, rank;
    /* the groups of the canonical sum (kernels/tp_sum.h): HPD_TP_GROUPS; tp
     * when the order was traded for speed (hpd_model_load_tp fast: one
     * group a rank, numerics that depend on the degree) */
    uint32_t sum_groups;
    /* full attention */
    hpd_range_t q_heads;
    hpd_range_t kv_heads;  /* one head when replicated */
    bool kv_replicated;    /* other ranks hold this KV head too (tp > KV heads) */
    /* Gated DeltaNet */
    hpd_range_t k_heads, v_heads;
    /* intermediate dimensions: the dense MLP's, the shared expert's, each expert's */
    hpd_range_t mlp, shared, expert;
    /* embedding and LM head rows */
    hpd_range_t vocab;
} hpd_shard_t;

/* Rank `rank`'s shard of model c at TP degree tp. HPD_ERR_INVALID_ARG, why
 * naming the layer and the numbers, when tp is not 1 to HPD_TP_MAX, rank
 * not below tp, or tp does not divide what it must. */
hpd_status_t hpd_shard_plan(const hpd_model_config_t *c, uint32_t tp, uint32_t rank,
                            hpd_shard_t *shard, char *why, size_t why_len);

/* The configuration a rank computes with: c with the heads, the conv
 * channels and the intermediate sizes of shard s (vocab_size stays the
 * whole vocabulary: the logits are gathered across ranks). */
void hpd_shard_config(const hpd_model_config_t *c, const hpd_shard_t *s,
                      hpd_model_config_t *local);

/* The groups of the canonical reduction (kernels/tp_sum.h): group g of n
 * of a row-parallel product over k columns is [g * k / n, (g + 1) * k / n),
 * rounded down (n: HPD_TP_GROUPS, or tp in fast mode). */
hpd_range_t hpd_tp_group(uint32_t k, uint32_t g, uint32_t n);
/* The groups of n rank `rank` of tp holds: [rank * n / tp, (rank + 1) * n / tp). */
hpd_range_t hpd_tp_rank_groups(uint32_t tp, uint32_t rank, uint32_t n);

/* Whether model c can run at TP degree tp (hpd_shard_plan of rank 0). */
bool hpd_shard_tp_ok(const hpd_model_config_t *c, uint32_t tp, char *why, size_t why_len);

/* The KV heads prefill rank p (of tp_p) writes into decode rank d (of tp_d):
 * the heads both hold, each written by exactly one sender, the lowest
 * prefill rank that holds it. Empty (begin == end) when none. Both degrees
 * must be valid for c. */
hpd_range_t hpd_shard_kv_send(const hpd_model_config_t *c, uint32_t tp_p, uint32_t p,
                              uint32_t tp_d, uint32_t d);

/* The same for a GDN layer's value heads (its recurrent state, and the v
 * segment of its conv state) and key heads (the q and k segments). */
hpd_range_t hpd_shard_v_send(const hpd_model_config_t *c, uint32_t tp_p, uint32_t p,
                             uint32_t tp_d, uint32_t d);
hpd_range_t hpd_shard_k_send(const hpd_model_config_t *c, uint32_t tp_p, uint32_t p,
                             uint32_t tp_d, uint32_t d);

#endif
