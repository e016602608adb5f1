/* What each prefill rank sends each decode rank (node/tp_plan.h). */
#include "node/tp_plan.h"

#include <stdio.h>
#include <string.h>

/* A rank's GDN layer state, in floats: where its recurrent state ends (the
 * conv state's start) and where each conv segment starts. */
typedef struct {
    uint64_t conv, seg_k, seg_v;
} state_map_t;

static state_map_t state_map(const hpd_model_config_t *c, const hpd_shard_t *s)
{
    const uint64_t nk = s->k_heads.end - s->k_heads.begin;
    const uint64_t nv = s->v_heads.end - s->v_heads.begin;
    const uint64_t kc = c->conv_kernel - 1;
    return (state_map_t){.conv = nv * c->lin_k_dim * c->lin_v_dim,
                         .seg_k = nk * c->lin_k_dim * kc,
                         .seg_v = 2 * nk * c->lin_k_dim * kc};
}

static void add_run(hpd_tp_plan_t *p, uint32_t i, uint32_t j, uint64_t src, uint64_t dst,
                    uint64_t floats)
{
    hpd_tp_state_run_t *last = p->n_state > 0 ? &p->state[p->n_state - 1] : NULL;
    if (floats == 0)
        return;
    if (last != NULL && last->src_rank == i && last->dst_rank == j &&
        last->src_off + last->bytes == 4 * src && last->dst_off + last->bytes == 4 * dst) {
        last->bytes += 4 * floats; /* one run where the two sides are contiguous */
        return;
    }
    p->state[p->n_state++] = (hpd_tp_state_run_t){
        .src_rank = i, .dst_rank = j, .src_off = 4 * src, .dst_off = 4 * dst, .bytes = 4 * floats};
}

hpd_status_t hpd_tp_plan(const hpd_model_config_t *c, uint32_t tp_p, uint32_t tp_d,
                         hpd_tp_plan_t *p, char *why, size_t why_len)
{
    hpd_shard_t sp[HPD_TP_MAX], sd[HPD_TP_MAX];
    char what[200];

    memset(p, 0, sizeof(*p));
    p->tp_p = tp_p;
    p->tp_d = tp_d;
    for (uint32_t side = 0; side < 2; side++) {
        const uint32_t tp = side ? tp_d : tp_p;
        /* rank 0's plan refuses a degree out of range before a rank past
         * the arrays is planned */
        for (uint32_t r = 0; r < (tp > 0 ? tp : 1); r++)
            if (hpd_shard_plan(c, tp, r, side ? &sd[r] : &sp[r], what, sizeof(what)) !=
                HPD_OK) {
                snprintf(why, why_len, "the %s side at tp %u: %s", side ? "decode" : "prefill",
                         tp, what);
                return HPD_ERR_INVALID_ARG;
            }
    }
    const uint64_t dk = c->lin_k_dim, dv = c->lin_v_dim, kc = c->conv_kernel - 1;
    /* (without full-attention layers nothing is split: a rank's layout
     * keeps the model's count, and no page is sent) */
    p->src_kv_heads = c->n_full_layers ? sp[0].kv_heads.end - sp[0].kv_heads.begin : c->n_kv_heads;
    p->dst_kv_heads = c->n_full_layers ? sd[0].kv_heads.end - sd[0].kv_heads.begin : c->n_kv_heads;
    for (uint32_t side = 0; side < 2; side++) {
        const hpd_shard_t *s = side ? &sd[0] : &sp[0];
        const state_map_t m = state_map(c, s);
        const uint64_t bytes =
            4 * (m.conv + (m.seg_v + (uint64_t)(s->v_heads.end - s->v_heads.begin) * dv * kc));
        *(side ? &p->dst_state_bytes : &p->src_state_bytes) = c->n_linear_layers ? bytes : 0;
    }
    for (uint32_t j = 0; j < tp_d; j++) {
        const state_map_t md = state_map(c, &sd[j]);
        for (uint32_t i = 0; i < tp_p; i++) {
            const state_map_t ms = state_map(c, &sp[i]);
            const hpd_range_t kv = hpd_shard_kv_send(c, tp_p, i, tp_d, j);
            if (c->n_full_layers > 0 && kv.end > kv.begin)
                p->kv[p->n_kv++] = (hpd_tp_kv_piece_t){
                    .src_rank = i,
                    .dst_rank = j,
                    .src_head = kv.begin - sp[i].kv_heads.begin,
                    .dst_head = kv.begin - sd[j].kv_heads.begin,
                    .heads = kv.end - kv.begin};
            if (c->n_linear_layers == 0)
                continue;
            /* in the state's order (runs that meet on both sides merge: one
             * run at equal degrees): the value heads' recurrent rows, the
             * key heads' q and k channels, the value heads' v channels */
            const hpd_range_t v = hpd_shard_v_send(c, tp_p, i, tp_d, j);
            const uint64_t vs = v.begin - sp[i].v_heads.begin, vd = v.begin - sd[j].v_heads.begin;
            const uint64_t nv = v.end - v.begin;
            const hpd_range_t k = hpd_shard_k_send(c, tp_p, i, tp_d, j);
            const uint64_t ks = k.begin - sp[i].k_heads.begin, kd = k.begin - sd[j].k_heads.begin;
            const uint64_t nk = k.end - k.begin;
            add_run(p, i, j, vs * dk * dv, vd * dk * dv, nv * dk * dv);
            add_run(p, i, j, ms.conv + ks * dk * kc, md.conv + kd * dk * kc, nk * dk * kc);
            add_run(p, i, j, ms.conv + ms.seg_k + ks * dk * kc, md.conv + md.seg_k + kd * dk * kc,
                    nk * dk * kc);
            add_run(p, i, j, ms.conv + ms.seg_v + vs * dv * kc, md.conv + md.seg_v + vd * dv * kc,
                    nv * dv * kc);
        }
    }
    return HPD_OK;
}
