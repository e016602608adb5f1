/* The engine's lifecycle (its pools, weights and buffers; create and
 * destroy) and its queries (usage, stats, memory, the audit). The
 * scheduler is engine/scheduler.c, the forward pass engine/forward.c. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/internal.h"

#define LOG_COMPONENT "engine"

void hpd_engine_params_init(hpd_engine_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->kv_layout.block_size = 64;
    p->kv_layout.pack_size = 1;
    p->kv_layout.order = HPD_KV_NHD;
    p->max_batch = 16;
    p->prefill_chunk = 256;
    p->prefix_cache = true;
    p->host_cache_bytes = 512ull << 20;
    p->checkpoint_every = 16;
    p->step_graphs = true;
}


static void free_weights(hpd_engine_t *e)
{
    hpd_model_tensor_t t[HPD_MODEL_MAX_TENSORS];
    if (e->dev_model == NULL)
        return;
    const uint32_t n = hpd_model_tensors(e->dev_model, t);
    for (uint32_t i = 0; i < n; i++)
        hpd_backend_free(e->be, *t[i].slot);
    free(e->dev_model);
    e->dev_model = NULL;
}

/* The kernels read the weights from backend memory: a device backend gets
 * a copy of every tensor, once. */
static hpd_status_t upload_weights(hpd_engine_t *e)
{
    hpd_model_tensor_t host[HPD_MODEL_MAX_TENSORS], dev[HPD_MODEL_MAX_TENSORS];
    hpd_model_t *d;
    hpd_status_t st = HPD_OK;
    uint64_t bytes = 0;

    e->w = e->p.model;
    if (hpd_backend_host_memory(e->be))
        return HPD_OK;
    if ((d = malloc(sizeof(*d))) == NULL)
        return HPD_ERR_NO_MEMORY;
    *d = *e->p.model;
    const uint32_t n = hpd_model_tensors((hpd_model_t *)e->p.model, host);
    hpd_model_tensors(d, dev);
    for (uint32_t i = 0; i < n; i++)
        *dev[i].slot = NULL;
    e->dev_model = d;
    for (uint32_t i = 0; i < n && st == HPD_OK; i++) {
        const size_t b = host[i].bytes;
        if ((st = hpd_backend_alloc(e->be, b, (void **)dev[i].slot)) == HPD_OK)
            st = hpd_backend_from_host(e->be, *dev[i].slot, *host[i].slot, b);
        bytes += b;
    }
    if (st != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "copying %llu MiB of weights to the %s backend failed: %s",
                      (unsigned long long)(bytes >> 20), e->be->ops->name, hpd_status_str(st));
        free_weights(e);
        return st;
    }
    if (d->config.tie_word_embeddings)
        d->lm_head = d->embed;
    e->w = d;
    HPD_LOG_INFO(LOG_COMPONENT, "weights: %llu MiB copied to the %s backend",
                 (unsigned long long)(bytes >> 20), e->be->ops->name);
    return HPD_OK;
}

static hpd_status_t alloc_act(hpd_engine_t *e, float **p, uint64_t floats)
{
    return hpd_backend_alloc(e->be, floats * sizeof(float), (void **)p);
}

static hpd_status_t alloc_buffers(hpd_engine_t *e)
{
    const hpd_model_config_t *c = e->cfg;
    const uint64_t R = e->p.max_step_tokens, B = e->p.max_batch;
    const uint32_t gdn_rows = hpd_model_gdn_in_rows(c), attn_rows = hpd_model_attn_qkv_rows(c);
    hpd_status_t st;

    const uint64_t S = R * c->top_k, H = c->hidden_size, Im = c->moe_inter;
    e->ld_proj = HPD_MAX(HPD_MAX(gdn_rows, attn_rows), 2 * c->intermediate_size);
    e->ld_proj = HPD_MAX(e->ld_proj, hpd_model_moe_in_rows(c));
    e->ld_core = HPD_MAX(c->lin_n_v_heads * c->lin_v_dim, c->n_heads * c->head_dim);
    if (c->n_moe_layers > 0) {
        if ((st = alloc_act(e, &e->moe_x, S * H)) != HPD_OK ||
            (st = alloc_act(e, &e->moe_gu, S * 2 * Im)) != HPD_OK ||
            (st = alloc_act(e, &e->moe_act, S * Im)) != HPD_OK ||
            (st = alloc_act(e, &e->moe_out, S * H)) != HPD_OK ||
            (st = alloc_act(e, &e->moe_shared, R * H)) != HPD_OK)
            return st;
        /* the routing, in backend memory (moe_route) */
        const size_t slot_bytes = S * sizeof(uint32_t);
        if ((st = alloc_act(e, &e->moe_w, S)) != HPD_OK ||
            (st = hpd_backend_alloc(e->be, slot_bytes, (void **)&e->moe_ids)) != HPD_OK ||
            (st = hpd_backend_alloc(e->be, slot_bytes, (void **)&e->moe_slots)) != HPD_OK ||
            (st = hpd_backend_alloc(e->be, slot_bytes, (void **)&e->moe_idx)) != HPD_OK ||
            (st = hpd_backend_alloc(e->be, (c->n_experts + 1) * sizeof(uint32_t),
                                    (void **)&e->moe_first)) != HPD_OK)
            return st;
    }
    if ((st = alloc_act(e, &e->x, R * c->hidden_size)) != HPD_OK ||
        (st = alloc_act(e, &e->h, R * c->hidden_size)) != HPD_OK ||
        (st = alloc_act(e, &e->proj, R * e->ld_proj)) != HPD_OK ||
        (st = alloc_act(e, &e->conv, R * c->conv_dim)) != HPD_OK ||
        (st = alloc_act(e, &e->g, R * c->lin_n_v_heads)) != HPD_OK ||
        (st = alloc_act(e, &e->beta, R * c->lin_n_v_heads)) != HPD_OK ||
        (st = alloc_act(e, &e->core, R * e->ld_core)) != HPD_OK ||
        (st = alloc_act(e, &e->act, R * HPD_MAX(c->intermediate_size, c->shared_inter))) !=
            HPD_OK ||
        (st = alloc_act(e, &e->lhid, R * c->hidden_size)) != HPD_OK ||
        (st = alloc_act(e, &e->tp_part, HPD_MAX(R, S) * H)) != HPD_OK ||
        (st = alloc_act(e, &e->tp_scratch[0], HPD_MAX(R, S) * H)) != HPD_OK ||
        (st = alloc_act(e, &e->tp_scratch[1], HPD_MAX(R, S) * H)) != HPD_OK ||
        (st = alloc_act(e, &e->logits, R * c->vocab_size)) != HPD_OK)
        return st;
    e->logits_host = malloc(c->vocab_size * sizeof(float));
    {
        const uint32_t n = e->p.vocab != NULL && hpd_vocab_size(e->p.vocab) > c->vocab_size
                               ? hpd_vocab_size(e->p.vocab)
                               : c->vocab_size;
        e->grammar_mask = malloc(((size_t)n + 31) / 32 * sizeof(uint32_t));
    }
    e->ids = malloc(R * sizeof(*e->ids));
    e->emb_ids = malloc(R * sizeof(*e->emb_ids));
    e->positions = malloc(R * sizeof(*e->positions));
    e->items = malloc(B * sizeof(*e->items));
    e->seqs_all = malloc(B * sizeof(*e->seqs_all));
    e->seqs_pre = malloc(B * sizeof(*e->seqs_pre));
    e->seqs_dec = malloc(B * sizeof(*e->seqs_dec));
    e->bt_all = malloc(B * sizeof(*e->bt_all));
    e->st_pre = malloc(B * sizeof(*e->st_pre));
    e->st_dec = malloc(B * sizeof(*e->st_dec));
    e->cs_pre = malloc(B * sizeof(*e->cs_pre));
    e->cs_dec = malloc(B * sizeof(*e->cs_dec));
    e->samp = malloc(B * sizeof(*e->samp));
    e->samp_pos = malloc(B * sizeof(*e->samp_pos));
    e->sampled = malloc(B * sizeof(*e->sampled));
    e->logit_rows = malloc(R * sizeof(*e->logit_rows));
    e->plp_reqs = malloc(R * sizeof(*e->plp_reqs));
    e->plp_pos = malloc(R * sizeof(*e->plp_pos));
    e->plp_rows = malloc(R * sizeof(*e->plp_rows));
    e->logit_items = malloc(B * sizeof(*e->logit_items));
    e->step_items = malloc(B * sizeof(*e->step_items));
    if (!e->step_items || !e->logits_host || !e->grammar_mask || !e->ids || !e->emb_ids || !e->positions || !e->items || !e->seqs_all ||
        !e->seqs_pre || !e->seqs_dec || !e->bt_all || !e->st_pre || !e->st_dec || !e->cs_pre ||
        !e->cs_dec || !e->samp || !e->samp_pos || !e->sampled || !e->logit_rows ||
        !e->logit_items || !e->plp_reqs || !e->plp_pos || !e->plp_rows)
        return HPD_ERR_NO_MEMORY;
    return HPD_OK;
}

static hpd_status_t resolve_params(hpd_engine_params_t *p, const hpd_model_config_t *c)
{
    if (p->max_batch == 0)
        p->max_batch = 16;
    if (p->max_context == 0)
        p->max_context = HPD_MIN(4096u, c->max_position_embeddings);
    if (p->prefill_chunk == 0)
        p->prefill_chunk = 256;
    if (p->prefill_chunk % HPD_GDN_CHUNK != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "prefill chunk %u is not a multiple of %d",
                      p->prefill_chunk, HPD_GDN_CHUNK);
        return HPD_ERR_INVALID_ARG;
    }
    if (p->max_step_tokens == 0)
        p->max_step_tokens = p->prefill_chunk + p->max_batch;
    if (p->max_step_tokens < p->max_batch + HPD_GDN_CHUNK) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "max step tokens %u is below max batch %u + %d (no room for prefill)",
                      p->max_step_tokens, p->max_batch, HPD_GDN_CHUNK);
        return HPD_ERR_INVALID_ARG;
    }
    if (p->n_slots == 0)
        p->n_slots = p->max_batch;
    p->kv_layout.n_layers = c->n_full_layers;
    p->kv_layout.n_kv_heads = c->n_kv_heads;
    p->kv_layout.head_dim = c->head_dim;
    p->kv_layout.dtype = HPD_DTYPE_F32;
    if (p->n_pages == 0 && c->n_full_layers > 0)
        p->n_pages = (p->prefix_cache ? 2 : 1) * p->max_batch *
                     hpd_kv_layout_n_groups(&p->kv_layout) *
                     HPD_DIV_UP(p->max_context, p->kv_layout.block_size);
    if (p->n_checkpoints == 0)
        p->n_checkpoints = 4 * p->max_batch;
    return HPD_OK;
}

hpd_status_t hpd_engine_plan(const hpd_engine_params_t *params, const hpd_model_config_t *c,
                             hpd_engine_plan_t *plan_p, char *why, size_t why_len)
{
    hpd_engine_params_t p = *params;
    memset(plan_p, 0, sizeof(*plan_p));
    if (p.prefill_chunk != 0 && p.prefill_chunk % HPD_GDN_CHUNK != 0) {
        snprintf(why, why_len, "prefill chunk %u is not a multiple of %d", p.prefill_chunk,
                 HPD_GDN_CHUNK);
        return HPD_ERR_INVALID_ARG;
    }
    if (resolve_params(&p, c) != HPD_OK) {
        snprintf(why, why_len, "max step tokens %u is below max batch %u + %d",
                 p.max_step_tokens, p.max_batch, HPD_GDN_CHUNK);
        return HPD_ERR_INVALID_ARG;
    }
    if (c->n_full_layers > 0 && p.kv_layout.pack_size > c->n_full_layers) {
        snprintf(why, why_len, "kv pack size %u is above the model's %u full-attention layers",
                 p.kv_layout.pack_size, c->n_full_layers);
        return HPD_ERR_INVALID_ARG;
    }
    if (c->n_full_layers > 0 && hpd_kv_layout_validate(&p.kv_layout) != HPD_OK) {
        snprintf(why, why_len, "kv layout %u,%u is invalid (block: a multiple of 16 from 16 to "
                 "4096; pack: 1 to %u)", p.kv_layout.block_size, p.kv_layout.pack_size,
                 c->n_full_layers);
        return HPD_ERR_INVALID_ARG;
    }
    const uint64_t slot_bytes = hpd_model_config_gdn_layer_bytes(c) * c->n_linear_layers;
    plan_p->n_pages = p.n_pages;
    plan_p->n_slots = p.n_slots;
    plan_p->n_checkpoints = p.prefix_cache ? p.n_checkpoints : 0;
    plan_p->max_context = p.max_context;
    plan_p->kv_pool_bytes =
        c->n_full_layers > 0 ? (uint64_t)p.n_pages * hpd_kv_layout_page_bytes(&p.kv_layout) : 0;
    plan_p->slot_pool_bytes = c->n_linear_layers > 0 ? (uint64_t)(p.n_slots + 1) * slot_bytes : 0;
    plan_p->checkpoint_bytes = (uint64_t)plan_p->n_checkpoints * slot_bytes;
    plan_p->host_cache_bytes = p.prefix_cache ? p.host_cache_bytes : 0;
    plan_p->device_bytes =
        plan_p->kv_pool_bytes + plan_p->slot_pool_bytes + plan_p->checkpoint_bytes;
    return HPD_OK;
}

/* A pool's memory from params.pool_alloc, or NULL: the backend's. */
static hpd_status_t pool_memory(hpd_engine_t *e, size_t bytes, void **memory_p)
{
    *memory_p = NULL;
    if (e->p.pool_alloc == NULL || !hpd_backend_host_memory(e->be))
        return HPD_OK;
    hpd_status_t st = e->p.pool_alloc(e->p.pool_alloc_arg, bytes, memory_p);
    if (st != HPD_OK)
        HPD_LOG_ERROR(LOG_COMPONENT, "allocating a pool of %zu bytes failed: %s", bytes,
                      hpd_status_str(st));
    return st;
}

/* One rank's engine (the whole engine at TP 1). */
static hpd_status_t create_rank(const hpd_engine_params_t *params, hpd_tp_group_t *group,
                                hpd_engine_t **engine_p)
{
    hpd_engine_t *e = calloc(1, sizeof(*e));
    hpd_status_t st;

    if (e == NULL)
        return HPD_ERR_NO_MEMORY;
    e->p = *params;
    e->cfg = &params->model->config;
    e->be = params->backend;
    e->tp = HPD_MAX(params->model->shard.tp, 1u);
    e->rank = params->model->shard.rank;
    e->group = group;
    for (uint32_t r = 0; r < e->tp; r++) /* every rank's embedding rows */
        e->vocab[r] = (e->tp > 1 ? params->tp_models[r] : params->model)->shard.vocab;
    if ((st = resolve_params(&e->p, e->cfg)) != HPD_OK || (st = upload_weights(e)) != HPD_OK)
        goto err;
    e->gdn_layer_bytes = hpd_model_config_gdn_layer_bytes(e->cfg);
    if (e->cfg->n_full_layers > 0) {
        hpd_page_pool_params_t pp = {.backend = e->be, .layout = e->p.kv_layout,
                                     .n_pages = e->p.n_pages};
        if ((st = pool_memory(e, (size_t)pp.n_pages * hpd_kv_layout_page_bytes(&pp.layout),
                              &pp.memory)) != HPD_OK ||
            (st = hpd_page_pool_create(&pp, &e->pages)) != HPD_OK)
            goto err;
        e->n_groups = hpd_kv_layout_n_groups(&e->p.kv_layout);
    }
    if (e->cfg->n_linear_layers > 0) {
        hpd_slot_pool_params_t sp = {.backend = e->be, .n_slots = e->p.n_slots,
                                     .slot_bytes = e->gdn_layer_bytes * e->cfg->n_linear_layers};
        if ((st = pool_memory(e, (size_t)(sp.n_slots + 1) * sp.slot_bytes, &sp.memory)) !=
                HPD_OK ||
            (st = hpd_slot_pool_create(&sp, &e->slots)) != HPD_OK)
            goto err;
    }
    if (e->p.prefix_cache) {
        hpd_prefix_cache_params_t cp = {.backend = e->be,
                                        .pages = e->pages,
                                        .state_bytes = e->gdn_layer_bytes * e->cfg->n_linear_layers,
                                        .n_checkpoints = e->p.n_checkpoints,
                                        .host_bytes = e->p.host_cache_bytes,
                                        .checkpoint_every = e->p.checkpoint_every};
        memcpy(cp.salt, e->p.model->fingerprint, 16);
        if ((st = hpd_prefix_cache_create(&cp, &e->cache)) != HPD_OK)
            goto err;
    }
    if ((st = alloc_buffers(e)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "activation buffers for %u rows: %s", e->p.max_step_tokens,
                      hpd_status_str(st));
        goto err;
    }
    *engine_p = e;
    return HPD_OK;
err:
    hpd_engine_destroy(e);
    return st;
}

/* The ranks' models must be one checkpoint's shards, in rank order, on
 * backends whose memory the ranks can read across (host memory). */
static hpd_status_t check_ranks(const hpd_engine_params_t *p, uint32_t tp)
{
    if (p->tp_models == NULL || p->tp_backends == NULL || p->tp_models[0] != p->model ||
        p->tp_backends[0] != p->backend) {
        HPD_LOG_ERROR(LOG_COMPONENT, "the model is rank 0 of tp %u: the engine needs every "
                      "rank's model and backend (tp_models, tp_backends)", tp);
        return HPD_ERR_INVALID_ARG;
    }
    for (uint32_t r = 0; r < tp; r++) {
        const hpd_model_t *m = p->tp_models[r];
        if (m == NULL || m->shard.tp != tp || m->shard.rank != r ||
            m->shard.sum_groups != p->model->shard.sum_groups ||
            memcmp(m->fingerprint, p->model->fingerprint, 16) != 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "tp rank %u's model is not rank %u of tp %u of the same "
                          "checkpoint", r, r, tp);
            return HPD_ERR_INVALID_ARG;
        }
        if (p->tp_backends[r] == NULL || !hpd_backend_host_memory(p->tp_backends[r])) {
            HPD_LOG_ERROR(LOG_COMPONENT, "tp rank %u's backend is %s: tensor parallelism runs "
                          "CPU ranks only (across GPUs, through NCCL, it is not built yet)", r,
                          p->tp_backends[r] != NULL ? p->tp_backends[r]->ops->name : "missing");
            return HPD_ERR_UNSUPPORTED;
        }
    }
    return HPD_OK;
}

hpd_status_t hpd_engine_create(const hpd_engine_params_t *params, hpd_engine_t **engine_p)
{
    const uint32_t tp = HPD_MAX(params->model->shard.tp, 1u);
    hpd_tp_group_t *group = NULL;
    hpd_engine_t *e = NULL;
    hpd_status_t st;

    if (tp == 1)
        return create_rank(params, NULL, engine_p);
    if (params->model->shard.rank != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "the engine's model is rank %u of tp %u (expected rank 0)",
                      params->model->shard.rank, tp);
        return HPD_ERR_INVALID_ARG;
    }
    if ((st = check_ranks(params, tp)) != HPD_OK ||
        (st = hpd_tp_group_create(tp, &group)) != HPD_OK)
        return st;
    /* the host tier's bound is the node's: each rank holds the same share
     * of it (the same entries fit on every rank: they stay in lockstep) */
    hpd_engine_params_t p0 = *params;
    p0.host_cache_bytes = params->host_cache_bytes / tp;
    if ((st = create_rank(&p0, group, &e)) != HPD_OK) {
        hpd_tp_group_destroy(group);
        return st;
    }
    e->owns_ranks = true; /* from here its destroy frees the peers and the group */
    for (uint32_t r = 1; r < tp && st == HPD_OK; r++) {
        hpd_engine_params_t pp = p0;
        pp.model = params->tp_models[r];
        pp.backend = params->tp_backends[r];
        pp.tp_backends = NULL;
        pp.logits_cb = NULL;
        pp.layer_cb = NULL;
        if ((st = create_rank(&pp, group, &e->peers[r])) == HPD_OK)
            st = hpd_tp_worker_create(&e->workers[r]);
    }
    if (st != HPD_OK) {
        hpd_engine_destroy(e);
        return st;
    }
    *engine_p = e;
    return HPD_OK;
}

void hpd_engine_destroy(hpd_engine_t *e)
{
    if (e == NULL)
        return;
    if (e->owns_ranks) {
        for (uint32_t r = 1; r < e->tp; r++) {
            hpd_tp_worker_destroy(e->workers[r]);
            hpd_engine_destroy(e->peers[r]);
        }
        hpd_tp_group_destroy(e->group);
    }
    for (uint64_t i = 0; i < e->n_reqs; i++) {
        if (e->reqs[i] != NULL) {
            hpd_engine_request_free_resources(e, e->reqs[i]);
            hpd_engine_request_destroy(e->reqs[i]);
        }
    }
    free(e->reqs);
    free(e->active);
    float *bufs[] = {e->x,    e->h,      e->proj,   e->conv,    e->g,
                     e->beta, e->core,   e->act,    e->lhid,    e->logits,
                     e->moe_x, e->moe_gu, e->moe_act, e->moe_out, e->moe_shared, e->moe_w,
                     e->tp_part, e->tp_scratch[0], e->tp_scratch[1]};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(bufs); i++)
        hpd_backend_free(e->be, bufs[i]);
    uint32_t *routing[] = {e->moe_ids, e->moe_slots, e->moe_idx, e->moe_first};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(routing); i++)
        hpd_backend_free(e->be, routing[i]);
    free(e->logits_host);
    free(e->grammar_mask);
    free(e->ids);
    free(e->emb_ids);
    free(e->positions);
    free(e->items);
    free(e->seqs_all);
    free(e->seqs_pre);
    free(e->seqs_dec);
    free(e->bt_all);
    free(e->st_pre);
    free(e->st_dec);
    free(e->cs_pre);
    free(e->cs_dec);
    free(e->samp);
    free(e->samp_pos);
    free(e->sampled);
    free(e->logit_rows);
    free(e->plp_reqs);
    free(e->plp_pos);
    free(e->plp_rows);
    free(e->logit_items);
    free(e->step_items);
    hpd_prefix_cache_destroy(e->cache);
    hpd_page_pool_destroy(e->pages);
    hpd_slot_pool_destroy(e->slots);
    free_weights(e);
    free(e);
}

void hpd_engine_usage(const hpd_engine_t *e, uint32_t *pages_used_p, uint32_t *pages_total_p,
                      uint32_t *slots_used_p, uint32_t *slots_total_p)
{
    const uint32_t pt = e->pages ? hpd_page_pool_n_pages(e->pages) : 0;
    const uint32_t st = e->slots ? hpd_slot_pool_n_slots(e->slots) : 0;

    if (pages_used_p)
        *pages_used_p = pt - (e->pages ? hpd_page_pool_n_free(e->pages) : 0);
    if (pages_total_p)
        *pages_total_p = pt;
    if (slots_used_p)
        *slots_used_p = st - (e->slots ? hpd_slot_pool_n_free(e->slots) : 0);
    if (slots_total_p)
        *slots_total_p = st;
}

hpd_status_t hpd_engine_cache_stats(const hpd_engine_t *e, hpd_prefix_cache_stats_t *stats_p)
{
    if (e->cache == NULL)
        return HPD_ERR_NOT_FOUND;
    hpd_prefix_cache_stats(e->cache, stats_p);
    return HPD_OK;
}

static uint32_t audit_rank(const hpd_engine_t *e)
{
    uint32_t bad = 0, live = 0;

    if (e->pages != NULL) {
        const uint32_t np = hpd_page_pool_n_pages(e->pages);
        uint32_t *want = calloc(np, sizeof(uint32_t));
        if (want == NULL)
            return UINT32_MAX;
        if (e->cache != NULL)
            hpd_prefix_cache_page_refs(e->cache, want);
        for (uint64_t i = 0; i < e->n_reqs; i++) {
            const request_t *r = e->reqs[i];
            if (r == NULL || r->pages == NULL)
                continue;
            for (uint32_t j = 0; j < e->n_groups * r->n_blocks; j++)
                if (r->pages[j] != NO_PAGE)
                    want[r->pages[j]]++;
        }
        for (uint32_t i = 0; i < np; i++)
            if (hpd_page_pool_refcount(e->pages, i) != want[i]) {
                HPD_LOG_ERROR(LOG_COMPONENT, "page %u has %u references, expected %u", i,
                              hpd_page_pool_refcount(e->pages, i), want[i]);
                bad++;
            }
        free(want);
    }
    if (e->slots != NULL) {
        for (uint64_t i = 0; i < e->n_reqs; i++)
            live += e->reqs[i] != NULL && e->reqs[i]->slot != 0;
        const uint32_t used = hpd_slot_pool_n_slots(e->slots) - hpd_slot_pool_n_free(e->slots);
        if (used != live) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%u live slots in use, %u requests hold one", used, live);
            bad++;
        }
    }
    return bad;
}

uint32_t hpd_engine_audit(const hpd_engine_t *e)
{
    uint32_t bad = audit_rank(e);
    for (uint32_t r = 1; r < e->tp && e->owns_ranks; r++) {
        const uint32_t b = audit_rank(e->peers[r]);
        bad = b > UINT32_MAX - bad ? UINT32_MAX : bad + b;
    }
    return bad;
}

void hpd_engine_stats(const hpd_engine_t *e, hpd_engine_stats_t *stats_p)
{
    *stats_p = e->stats;
}

const hpd_engine_params_t *hpd_engine_params(const hpd_engine_t *e)
{
    return &e->p;
}

void hpd_engine_memory(const hpd_engine_t *e, hpd_engine_memory_t *m)
{
    memset(m, 0, sizeof(*m));
    m->layout = &e->p.kv_layout;
    if (e->pages != NULL) {
        m->kv_pool = hpd_page_pool_base(e->pages);
        m->kv_pool_bytes =
            (uint64_t)hpd_page_pool_n_pages(e->pages) * hpd_kv_layout_page_bytes(&e->p.kv_layout);
    }
    if (e->slots != NULL) {
        m->slot_pool = hpd_slot_pool_ptr(e->slots, 0);
        m->slot_bytes = hpd_slot_pool_slot_bytes(e->slots);
        m->slot_pool_bytes = (uint64_t)(hpd_slot_pool_n_slots(e->slots) + 1) * m->slot_bytes;
    }
    m->layer_state_bytes = e->gdn_layer_bytes;
}

uint32_t hpd_engine_tp(const hpd_engine_t *e)
{
    return e->tp;
}

const hpd_engine_t *hpd_engine_rank(const hpd_engine_t *e, uint32_t rank)
{
    if (rank == 0)
        return e;
    return rank < e->tp && e->owns_ranks ? e->peers[rank] : NULL;
}

void hpd_engine_set_layer_cb(hpd_engine_t *e, hpd_engine_layer_cb_t cb, void *arg)
{
    e->p.layer_cb = cb;
    e->p.layer_cb_arg = arg;
}

uint32_t hpd_engine_prefix_summary(const hpd_engine_t *e, uint8_t *summary, size_t bytes)
{
    if (e->cache == NULL) {
        memset(summary, 0, bytes);
        return 0;
    }
    return hpd_prefix_cache_summary(e->cache, summary, bytes);
}
