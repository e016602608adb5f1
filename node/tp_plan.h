/* What each rank of a prefill node at TP p sends each rank of a decode
 * node at TP d (issue 37; docs/tensor_parallel.md, "Prefill rank to decode
 * rank"): the node's one map from prefill ranks, heads and state rows to
 * decode ranks. Every KV head, GDN value head and key head a decode rank
 * holds comes from exactly one prefill rank that holds it (model/shard.h:
 * hpd_shard_kv_send, hpd_shard_k_send, hpd_shard_v_send).
 *
 * A rank's GDN layer state (engine slots) is its recurrent state [nv][dk][dv]
 * fp32, then its conv state [conv channels][kc - 1] fp32, the channels its
 * q, k and v segments one after the other ([nk*dk | nk*dk | nv*dv], the
 * rank's own heads). So a decode rank's state from one prefill rank is four
 * runs of bytes: the value heads' rows of the recurrent state, and the q, k
 * and v segments' channels of the conv state, each segment on its own. */
#ifndef HPD_NODE_TP_PLAN_H
#define HPD_NODE_TP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/config.h"
#include "model/shard.h"

/* KV heads of prefill rank src_rank, [src_head, src_head + heads) in its
 * numbering, land as heads [dst_head, dst_head + heads) of decode rank
 * dst_rank's pages (kv_translate's src_head, heads, dst_head). */
typedef struct {
    uint32_t src_rank, dst_rank;
    uint32_t src_head, dst_head, heads;
} hpd_tp_kv_piece_t;

/* Bytes [src_off, src_off + bytes) of prefill rank src_rank's state of a
 * GDN layer land at [dst_off, dst_off + bytes) of decode rank dst_rank's. */
typedef struct {
    uint32_t src_rank, dst_rank;
    uint64_t src_off, dst_off, bytes;
} hpd_tp_state_run_t;

typedef struct {
    uint32_t tp_p, tp_d;
    hpd_tp_kv_piece_t kv[HPD_TP_MAX * HPD_TP_MAX];
    uint32_t n_kv;
    hpd_tp_state_run_t state[4 * HPD_TP_MAX * HPD_TP_MAX];
    uint32_t n_state;
    /* per rank: KV heads and a GDN layer's state bytes */
    uint32_t src_kv_heads, dst_kv_heads;
    uint64_t src_state_bytes, dst_state_bytes;
} hpd_tp_plan_t;

/* The plan from TP tp_p to TP tp_d for the whole model c (hpd_model_t.whole).
 * HPD_ERR_INVALID_ARG, why naming the side, the degree and the layer, when
 * the model cannot run at one of the degrees. */
hpd_status_t hpd_tp_plan(const hpd_model_config_t *c, uint32_t tp_p, uint32_t tp_d,
                         hpd_tp_plan_t *plan, char *why, size_t why_len);

#endif
