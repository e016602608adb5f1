/* Tensor parallelism's shard map (model/shard.h). */
#include "model/shard.h"

#include <stdio.h>

#include "kernels/tp_sum.h"

/* Range r of n split into tp contiguous, as-even-as-possible ranges. */
static hpd_range_t even(uint32_t n, uint32_t tp, uint32_t r)
{
    return (hpd_range_t){.begin = (uint32_t)((uint64_t)r * n / tp),
                         .end = (uint32_t)((uint64_t)(r + 1) * n / tp)};
}

static hpd_range_t meet(hpd_range_t a, hpd_range_t b)
{
    hpd_range_t m = {.begin = a.begin > b.begin ? a.begin : b.begin,
                     .end = a.end < b.end ? a.end : b.end};
    if (m.end < m.begin)
        m.end = m.begin;
    return m;
}

/* A split of n that tp must divide; false with why when it does not. */
static bool divides(uint32_t n, uint32_t tp, const char *what, char *why, size_t why_len)
{
    if (n % tp == 0)
        return true;
    snprintf(why, why_len, "tp %u does not divide %s %u", tp, what, n);
    return false;
}

hpd_status_t hpd_shard_plan(const hpd_model_config_t *c, uint32_t tp, uint32_t rank,
                            hpd_shard_t *s, char *why, size_t why_len)
{
    *s = (hpd_shard_t){.tp = tp, .rank = rank, .sum_groups = HPD_TP_GROUPS};
    if (tp < 1 || tp > HPD_TP_MAX) {
        snprintf(why, why_len, "tp %u: expected 1 to %d", tp, HPD_TP_MAX);
        return HPD_ERR_INVALID_ARG;
    }
    if (rank >= tp) {
        snprintf(why, why_len, "rank %u: expected below tp %u", rank, tp);
        return HPD_ERR_INVALID_ARG;
    }
    if (c->n_full_layers > 0) {
        const uint32_t kv = c->n_kv_heads;
        if (!divides(c->n_heads, tp, "the full-attention layers' query heads,", why, why_len))
            return HPD_ERR_INVALID_ARG;
        if (tp <= kv && kv % tp != 0) {
            snprintf(why, why_len, "tp %u does not divide the full-attention layers' KV heads, "
                     "%u", tp, kv);
            return HPD_ERR_INVALID_ARG;
        }
        if (tp > kv && tp % kv != 0) {
            snprintf(why, why_len, "tp %u is above the full-attention layers' %u KV heads and "
                     "not a multiple of them (each KV head's query heads on whole ranks)", tp,
                     kv);
            return HPD_ERR_INVALID_ARG;
        }
        s->q_heads = even(c->n_heads, tp, rank);
        if (tp <= kv) {
            s->kv_heads = even(kv, tp, rank);
        } else {
            const uint32_t h = (uint32_t)((uint64_t)rank * kv / tp); /* never rank % kv */
            s->kv_heads = (hpd_range_t){.begin = h, .end = h + 1};
            s->kv_replicated = true;
        }
    }
    if (c->n_linear_layers > 0) {
        if (!divides(c->lin_n_k_heads, tp, "the GDN layers' key heads,", why, why_len) ||
            !divides(c->lin_n_v_heads, tp, "the GDN layers' value heads,", why, why_len))
            return HPD_ERR_INVALID_ARG;
        s->k_heads = even(c->lin_n_k_heads, tp, rank);
        s->v_heads = even(c->lin_n_v_heads, tp, rank);
    }
    const bool dense = c->n_moe_layers < c->n_layers && c->intermediate_size > 0;
    if (dense) {
        if (!divides(c->intermediate_size, tp, "the dense MLP's intermediate size", why, why_len))
            return HPD_ERR_INVALID_ARG;
        s->mlp = even(c->intermediate_size, tp, rank);
    }
    if (c->n_moe_layers > 0) {
        if (!divides(c->moe_inter, tp, "the experts' intermediate size", why, why_len))
            return HPD_ERR_INVALID_ARG;
        s->expert = even(c->moe_inter, tp, rank);
        if (c->shared_inter > 0) {
            if (!divides(c->shared_inter, tp, "the shared expert's intermediate size", why,
                         why_len))
                return HPD_ERR_INVALID_ARG;
            s->shared = even(c->shared_inter, tp, rank);
        }
    }
    if (HPD_TP_GROUPS % tp != 0) {
        snprintf(why, why_len, "tp %u does not divide the %d groups of the canonical sum "
                 "(expected 1, 2, 4 or 8)", tp, HPD_TP_GROUPS);
        return HPD_ERR_INVALID_ARG;
    }
    s->vocab = even(c->vocab_size, tp, rank);
    return HPD_OK;
}

static uint32_t len(hpd_range_t r)
{
    return r.end - r.begin;
}

void hpd_shard_config(const hpd_model_config_t *c, const hpd_shard_t *s,
                      hpd_model_config_t *local)
{
    *local = *c;
    if (s->tp <= 1)
        return;
    if (c->n_full_layers > 0) {
        local->n_heads = len(s->q_heads);
        local->n_kv_heads = len(s->kv_heads);
    }
    if (c->n_linear_layers > 0) {
        local->lin_n_k_heads = len(s->k_heads);
        local->lin_n_v_heads = len(s->v_heads);
        local->conv_dim = 2 * local->lin_n_k_heads * c->lin_k_dim +
                          local->lin_n_v_heads * c->lin_v_dim;
    }
    if (len(s->mlp) > 0)
        local->intermediate_size = len(s->mlp);
    if (len(s->expert) > 0)
        local->moe_inter = len(s->expert);
    if (len(s->shared) > 0)
        local->shared_inter = len(s->shared);
}

hpd_range_t hpd_tp_group(uint32_t k, uint32_t g, uint32_t n)
{
    return (hpd_range_t){.begin = (uint32_t)((uint64_t)g * k / n),
                         .end = (uint32_t)((uint64_t)(g + 1) * k / n)};
}

hpd_range_t hpd_tp_rank_groups(uint32_t tp, uint32_t rank, uint32_t n)
{
    return (hpd_range_t){.begin = rank * n / tp, .end = (rank + 1) * n / tp};
}

bool hpd_shard_tp_ok(const hpd_model_config_t *c, uint32_t tp, char *why, size_t why_len)
{
    hpd_shard_t s;
    return hpd_shard_plan(c, tp, 0, &s, why, why_len) == HPD_OK;
}

/* The shard of a valid degree (the caller checked it). */
static hpd_shard_t plan(const hpd_model_config_t *c, uint32_t tp, uint32_t rank)
{
    hpd_shard_t s;
    char why[160];
    if (hpd_shard_plan(c, tp, rank, &s, why, sizeof(why)) != HPD_OK)
        s = (hpd_shard_t){.tp = tp, .rank = rank};
    return s;
}

hpd_range_t hpd_shard_kv_send(const hpd_model_config_t *c, uint32_t tp_p, uint32_t p,
                              uint32_t tp_d, uint32_t d)
{
    const hpd_shard_t sp = plan(c, tp_p, p), sd = plan(c, tp_d, d);
    const hpd_range_t m = meet(sp.kv_heads, sd.kv_heads);
    /* a head several prefill ranks hold goes from the lowest of them: the
     * first rank of its group, head * tp / kv */
    if (sp.kv_replicated && m.begin < m.end &&
        (uint64_t)m.begin * tp_p / c->n_kv_heads != p)
        return (hpd_range_t){.begin = m.begin, .end = m.begin};
    return m;
}

hpd_range_t hpd_shard_v_send(const hpd_model_config_t *c, uint32_t tp_p, uint32_t p,
                             uint32_t tp_d, uint32_t d)
{
    return meet(plan(c, tp_p, p).v_heads, plan(c, tp_d, d).v_heads);
}

hpd_range_t hpd_shard_k_send(const hpd_model_config_t *c, uint32_t tp_p, uint32_t p,
                             uint32_t tp_d, uint32_t d)
{
    return meet(plan(c, tp_p, p).k_heads, plan(c, tp_d, d).k_heads);
}
