#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/page_pool.h"
#include "cache/slot_pool.h"
#include "common/assert.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "engine"

typedef struct {
    uint64_t id;
    hpd_request_state_t state;
    int32_t *prompt;
    uint32_t n_prompt;
    uint32_t max_tokens;
    hpd_sampling_t sampling;
    int32_t *replay;
    uint32_t n_replay;
    int32_t *out; /* [max_tokens] */
    uint32_t n_out;
    uint32_t n_done;   /* tokens whose KV and state are computed */
    uint32_t slot;     /* 0: none */
    uint32_t n_blocks; /* pages per pack group */
    uint32_t *pages;   /* [n_groups][n_blocks] */
    /* prefix cache */
    hpd_block_hash_t *hashes; /* of the prompt's full blocks */
    hpd_prefix_match_t match; /* locked while the request runs */
    uint32_t ckpt_pos[64];    /* checkpoint positions still to save, ascending */
    uint32_t n_ckpt, next_ckpt;
    uint32_t cached_tokens, cached_host_tokens;
} request_t;

/* One row group of the current forward pass. */
typedef struct {
    request_t *req;
    uint32_t n_tokens;
    bool decode;      /* GDN recurrent step (else chunked prefill) */
    bool wants_logits;
} batch_item_t;

struct hpd_engine {
    hpd_engine_params_t p;
    const hpd_model_config_t *cfg;
    hpd_backend_t *be;
    const hpd_model_t *w;   /* the weights in backend memory: p.model or dev_model */
    hpd_model_t *dev_model; /* a copy on a device backend, owned */
    hpd_page_pool_t *pages;
    hpd_slot_pool_t *slots;
    hpd_prefix_cache_t *cache;
    uint32_t n_groups;
    uint64_t gdn_layer_bytes;

    request_t **reqs; /* by id - 1; NULL once released */
    uint64_t n_reqs;
    size_t cap_reqs;
    request_t **active; /* waiting and running requests, in submit (or start) order */
    uint32_t n_active;
    size_t cap_active;
    uint32_t n_running;

    /* activations, backend memory, R = max_step_tokens rows */
    float *x, *h, *proj, *conv, *g, *beta, *core, *act, *lhid, *logits;
    uint32_t ld_proj, ld_core;
    float *logits_host; /* for the callback when the backend is not host memory */
    /* host-side batch metadata */
    int32_t *ids;
    int32_t *positions;
    batch_item_t *items;
    hpd_seq_t *seqs_all, *seqs_pre, *seqs_dec;
    const uint32_t **bt_all;
    float **st_pre, **st_dec, **cs_pre, **cs_dec;
    hpd_sampling_t *samp;
    uint64_t *samp_pos;
    int32_t *sampled;
    uint32_t *logit_rows; /* batch row of each logits row */
    batch_item_t **logit_items;
    hpd_engine_step_item_t *step_items;

    hpd_engine_stats_t stats;
};

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
}

/* ---------------------------------------------------------------- create */

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
        const size_t b = host[i].floats * sizeof(float);
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

    e->ld_proj = HPD_MAX(HPD_MAX(gdn_rows, attn_rows), 2 * c->intermediate_size);
    e->ld_core = HPD_MAX(c->lin_n_v_heads * c->lin_v_dim, c->n_heads * c->head_dim);
    if ((st = alloc_act(e, &e->x, R * c->hidden_size)) != HPD_OK ||
        (st = alloc_act(e, &e->h, R * c->hidden_size)) != HPD_OK ||
        (st = alloc_act(e, &e->proj, R * e->ld_proj)) != HPD_OK ||
        (st = alloc_act(e, &e->conv, R * c->conv_dim)) != HPD_OK ||
        (st = alloc_act(e, &e->g, R * c->lin_n_v_heads)) != HPD_OK ||
        (st = alloc_act(e, &e->beta, R * c->lin_n_v_heads)) != HPD_OK ||
        (st = alloc_act(e, &e->core, R * e->ld_core)) != HPD_OK ||
        (st = alloc_act(e, &e->act, R * c->intermediate_size)) != HPD_OK ||
        (st = alloc_act(e, &e->lhid, R * c->hidden_size)) != HPD_OK ||
        (st = alloc_act(e, &e->logits, R * c->vocab_size)) != HPD_OK)
        return st;
    e->logits_host = malloc(c->vocab_size * sizeof(float));
    e->ids = malloc(R * sizeof(*e->ids));
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
    e->logit_rows = malloc(B * sizeof(*e->logit_rows));
    e->logit_items = malloc(B * sizeof(*e->logit_items));
    e->step_items = malloc(B * sizeof(*e->step_items));
    if (!e->step_items || !e->logits_host || !e->ids || !e->positions || !e->items || !e->seqs_all ||
        !e->seqs_pre || !e->seqs_dec || !e->bt_all || !e->st_pre || !e->st_dec || !e->cs_pre ||
        !e->cs_dec || !e->samp || !e->samp_pos || !e->sampled || !e->logit_rows ||
        !e->logit_items)
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

hpd_status_t hpd_engine_create(const hpd_engine_params_t *params, hpd_engine_t **engine_p)
{
    hpd_engine_t *e = calloc(1, sizeof(*e));
    hpd_status_t st;

    if (e == NULL)
        return HPD_ERR_NO_MEMORY;
    e->p = *params;
    e->cfg = &params->model->config;
    e->be = params->backend;
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
        hpd_prefix_cache_params_t cp = {e->be, e->pages,
                                        e->gdn_layer_bytes * e->cfg->n_linear_layers,
                                        e->p.n_checkpoints, e->p.host_cache_bytes,
                                        e->p.checkpoint_every, {0}};
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

#define NO_PAGE UINT32_MAX

static void request_free_resources(hpd_engine_t *e, request_t *r)
{
    if (r->pages != NULL) {
        for (uint32_t i = 0; i < e->n_groups * r->n_blocks; i++)
            if (r->pages[i] != NO_PAGE)
                hpd_page_pool_unref(e->pages, r->pages[i]);
        free(r->pages);
        r->pages = NULL;
    }
    if (e->cache != NULL)
        hpd_prefix_cache_release(e->cache, &r->match);
    if (r->slot != 0) {
        hpd_slot_pool_unref(e->slots, r->slot);
        r->slot = 0;
    }
}

static void request_destroy(request_t *r)
{
    if (r == NULL)
        return;
    free(r->prompt);
    free(r->replay);
    free(r->out);
    free(r->hashes);
    free(r);
}

void hpd_engine_destroy(hpd_engine_t *e)
{
    if (e == NULL)
        return;
    for (uint64_t i = 0; i < e->n_reqs; i++) {
        if (e->reqs[i] != NULL) {
            request_free_resources(e, e->reqs[i]);
            request_destroy(e->reqs[i]);
        }
    }
    free(e->reqs);
    free(e->active);
    float *bufs[] = {e->x, e->h, e->proj, e->conv, e->g, e->beta, e->core, e->act, e->lhid,
                     e->logits};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(bufs); i++)
        hpd_backend_free(e->be, bufs[i]);
    free(e->logits_host);
    free(e->ids);
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
    free(e->logit_items);
    free(e->step_items);
    hpd_prefix_cache_destroy(e->cache);
    hpd_page_pool_destroy(e->pages);
    hpd_slot_pool_destroy(e->slots);
    free_weights(e);
    free(e);
}

/* ---------------------------------------------------------------- requests */

static hpd_status_t check_ids(const int32_t *ids, uint32_t n, uint32_t vocab, const char *what)
{
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s token %u is %d (expected 0 to %u, below vocab_size)",
                          what, i, ids[i], vocab - 1);
            return HPD_ERR_INVALID_ARG;
        }
    }
    return HPD_OK;
}

static hpd_status_t validate_request(const hpd_engine_t *e, const hpd_request_params_t *p)
{
    const hpd_sampling_t *s = &p->sampling;
    hpd_status_t st;

    if (p->n_prompt == 0 || p->prompt == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "empty prompt (expected at least one token id)");
        return HPD_ERR_INVALID_ARG;
    }
    if (p->max_tokens == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "max tokens is 0 (expected at least 1)");
        return HPD_ERR_INVALID_ARG;
    }
    if ((uint64_t)p->n_prompt + p->max_tokens > e->p.max_context) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "prompt of %u tokens + %u new tokens exceeds the maximum context of %u",
                      p->n_prompt, p->max_tokens, e->p.max_context);
        return HPD_ERR_INVALID_ARG;
    }
    if (p->n_replay > p->max_tokens) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%u replayed tokens exceed max tokens %u", p->n_replay,
                      p->max_tokens);
        return HPD_ERR_INVALID_ARG;
    }
    if ((st = check_ids(p->prompt, p->n_prompt, e->cfg->vocab_size, "prompt")) != HPD_OK ||
        (st = check_ids(p->replay, p->n_replay, e->cfg->vocab_size, "replayed")) != HPD_OK)
        return st;
    if (!isfinite(s->temperature) || s->temperature < 0.0f) {
        HPD_LOG_ERROR(LOG_COMPONENT, "temperature %g is invalid (expected >= 0; 0 is greedy)",
                      s->temperature);
        return HPD_ERR_INVALID_ARG;
    }
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "top-p %g is invalid (expected in (0, 1])", s->top_p);
        return HPD_ERR_INVALID_ARG;
    }
    return HPD_OK;
}

/* Validates and records a request (not yet in the active list). */
static hpd_status_t new_request(hpd_engine_t *e, const hpd_request_params_t *p, request_t **r_p)
{
    request_t *r;
    hpd_status_t st;

    if ((st = validate_request(e, p)) != HPD_OK)
        return st;
    if (hpd_grow(&e->reqs, &e->cap_reqs, e->n_reqs + 1, sizeof(*e->reqs)) != HPD_OK ||
        hpd_grow(&e->active, &e->cap_active, (size_t)e->n_active + 1, sizeof(*e->active)) !=
            HPD_OK)
        return HPD_ERR_NO_MEMORY;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return HPD_ERR_NO_MEMORY;
    r->prompt = malloc(p->n_prompt * sizeof(int32_t));
    r->out = malloc(p->max_tokens * sizeof(int32_t));
    r->replay = malloc((p->n_replay + 1) * sizeof(int32_t));
    if (r->prompt == NULL || r->out == NULL || r->replay == NULL) {
        request_destroy(r);
        return HPD_ERR_NO_MEMORY;
    }
    memcpy(r->prompt, p->prompt, p->n_prompt * sizeof(int32_t));
    if (p->n_replay > 0)
        memcpy(r->replay, p->replay, p->n_replay * sizeof(int32_t));
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->sampling = p->sampling;
    r->n_replay = p->n_replay;
    r->state = HPD_REQ_WAITING;
    r->id = e->n_reqs + 1;
    e->reqs[e->n_reqs++] = r;
    *r_p = r;
    return HPD_OK;
}

hpd_status_t hpd_engine_submit(hpd_engine_t *e, const hpd_request_params_t *p, uint64_t *id_p)
{
    request_t *r;
    hpd_status_t st;

    if ((st = new_request(e, p, &r)) != HPD_OK)
        return st;
    e->active[e->n_active++] = r; /* room made by new_request */
    *id_p = r->id;
    return HPD_OK;
}

static request_t *find(const hpd_engine_t *e, uint64_t id)
{
    return id >= 1 && id <= e->n_reqs ? e->reqs[id - 1] : NULL;
}

static void finish(hpd_engine_t *e, request_t *r, hpd_request_state_t state)
{
    if (r->state == HPD_REQ_RUNNING)
        e->n_running--;
    if (r->state == HPD_REQ_WAITING || r->state == HPD_REQ_RUNNING) {
        uint32_t i = 0;
        while (i < e->n_active && e->active[i] != r)
            i++;
        if (i < e->n_active) {
            memmove(e->active + i, e->active + i + 1, (e->n_active - i - 1) * sizeof(*e->active));
            e->n_active--;
        }
    }
    request_free_resources(e, r);
    r->state = state;
}

static void request_tables(const hpd_engine_t *e, const request_t *r, uint32_t **tables)
{
    for (uint32_t g = 0; g < e->n_groups; g++)
        tables[g] = r->pages + (size_t)g * r->n_blocks;
}

/* Pages, with the prefix cache evicting to make room when it can. */
static hpd_status_t take_pages(hpd_engine_t *e, uint32_t n, uint32_t *ids)
{
    if (hpd_page_pool_n_free(e->pages) < n && e->cache != NULL)
        hpd_prefix_cache_make_room(e->cache, n);
    return hpd_page_pool_alloc(e->pages, n, ids);
}

/* Takes a slot and every page the request can need, the prefix hit first,
 * or nothing. */
static hpd_status_t admit(hpd_engine_t *e, request_t *r)
{
    const uint32_t ctx = r->n_prompt + r->max_tokens;
    uint32_t *tables[256], hit_pages = 0;
    hpd_status_t st;

    if (e->pages != NULL) {
        r->n_blocks = HPD_DIV_UP(ctx, e->p.kv_layout.block_size);
        if ((uint64_t)r->n_blocks * e->n_groups > hpd_page_pool_n_pages(e->pages)) {
            HPD_LOG_ERROR(LOG_COMPONENT,
                          "request %llu needs %u kv pages but the pool holds only %u",
                          (unsigned long long)r->id, r->n_blocks * e->n_groups,
                          hpd_page_pool_n_pages(e->pages));
            return HPD_ERR_INVALID_ARG;
        }
        r->pages = malloc((size_t)r->n_blocks * e->n_groups * sizeof(uint32_t));
        if (r->pages == NULL)
            return HPD_ERR_NO_MEMORY;
        for (uint32_t i = 0; i < r->n_blocks * e->n_groups; i++)
            r->pages[i] = NO_PAGE;
        request_tables(e, r, tables);
    }
    if (e->slots != NULL && (st = hpd_slot_pool_alloc(e->slots, &r->slot)) != HPD_OK)
        goto fail;
    if (e->cache != NULL) {
        const uint32_t nb = r->n_prompt / HPD_PREFIX_BLOCK;
        if (r->hashes == NULL && (r->hashes = malloc((nb + 1) * sizeof(*r->hashes))) == NULL) {
            st = HPD_ERR_NO_MEMORY;
            goto fail;
        }
        hpd_prefix_cache_hash(e->cache, r->prompt, nb, r->hashes);
        if ((st = hpd_prefix_cache_lookup(e->cache, r->hashes, r->n_prompt, &r->match)) != HPD_OK)
            goto fail;
        void *state = r->slot ? hpd_slot_pool_ptr(e->slots, r->slot) : NULL;
        if ((st = hpd_prefix_cache_attach(e->cache, &r->match, tables, state)) != HPD_OK)
            goto fail;
        r->cached_tokens = r->match.hit_blocks * HPD_PREFIX_BLOCK;
        r->cached_host_tokens = r->match.host_blocks * HPD_PREFIX_BLOCK;
        if (e->pages != NULL)
            hit_pages = HPD_DIV_UP(r->cached_tokens, e->p.kv_layout.block_size);
        r->n_ckpt = hpd_prefix_cache_checkpoint_plan(e->cache, &r->match, r->n_prompt,
                                                     r->cached_tokens, r->ckpt_pos, 64);
        r->next_ckpt = 0;
        r->n_done = r->cached_tokens;
    }
    if (e->pages != NULL && r->n_blocks > hit_pages) {
        const uint32_t per_group = r->n_blocks - hit_pages;
        uint32_t *ids = malloc((size_t)per_group * e->n_groups * sizeof(uint32_t));
        if (ids == NULL) {
            st = HPD_ERR_NO_MEMORY;
            goto fail;
        }
        if ((st = take_pages(e, per_group * e->n_groups, ids)) != HPD_OK) {
            free(ids);
            goto fail;
        }
        for (uint32_t g = 0; g < e->n_groups; g++)
            memcpy(tables[g] + hit_pages, ids + (size_t)g * per_group,
                   per_group * sizeof(uint32_t));
        free(ids);
    }
    r->state = HPD_REQ_RUNNING;
    e->n_running++;
    return HPD_OK;
fail:
    request_free_resources(e, r);
    r->cached_tokens = r->cached_host_tokens = 0;
    r->n_done = 0;
    return st;
}

static void admit_waiting(hpd_engine_t *e)
{
    for (uint32_t i = 0; i < e->n_active && e->n_running < e->p.max_batch; i++) {
        request_t *r = e->active[i];
        hpd_status_t st;

        if (r->state != HPD_REQ_WAITING)
            continue;
        st = admit(e, r);
        if (st == HPD_ERR_NO_RESOURCE)
            break; /* first come, first served: wait for frees */
        if (st != HPD_OK) {
            finish(e, r, HPD_REQ_FAILED); /* removes it from the active list */
            i--;
        }
    }
}

/* ---------------------------------------------------------------- forward */

typedef struct {
    uint32_t rows;
    uint32_t n_items, n_pre, n_dec, n_logits;
} batch_t;

static float *slot_layer(hpd_engine_t *e, const request_t *r, uint32_t gdn_index)
{
    return (float *)((uint8_t *)hpd_slot_pool_ptr(e->slots, r->slot) +
                     gdn_index * e->gdn_layer_bytes);
}

static hpd_status_t gdn_layer(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, nk = c->lin_n_k_heads;
    const uint32_t nv = c->lin_n_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const uint32_t gi = c->kind_index[l], zoff = c->conv_dim, boff = zoff + nv * dv;
    const uint64_t rec_floats = (uint64_t)nv * dk * dv;
    hpd_status_t st;

    for (uint32_t i = 0, np = 0, nd = 0; i < bt->n_items; i++) {
        float *state = slot_layer(e, e->items[i].req, gi);
        if (e->items[i].decode) {
            e->st_dec[nd] = state;
            e->cs_dec[nd++] = state + rec_floats;
        } else {
            e->st_pre[np] = state;
            e->cs_pre[np++] = state + rec_floats;
        }
    }
    hpd_rmsnorm_args_t norm = {{e->x, H, 0}, {e->h, H, 0}, R, 1, H, w->input_norm,
                               c->rms_norm_eps, true};
    hpd_gemm_args_t proj = {e->h, H, w->gdn_in, e->proj, e->ld_proj, R,
                            hpd_model_gdn_in_rows(c), H, false};
    if ((st = hpd_rmsnorm(e->be, &norm)) != HPD_OK || (st = hpd_gemm(e->be, &proj)) != HPD_OK)
        return st;

    hpd_conv1d_args_t conv = {e->proj, e->ld_proj, e->conv, c->conv_dim, w->gdn_conv,
                              c->conv_dim, c->conv_kernel, e->cs_pre, e->seqs_pre, bt->n_pre};
    if (bt->n_pre > 0 && (st = hpd_conv1d(e->be, &conv)) != HPD_OK)
        return st;
    conv.states = e->cs_dec;
    conv.seqs = e->seqs_dec;
    conv.n_seqs = bt->n_dec;
    if (bt->n_dec > 0 && (st = hpd_conv1d_step(e->be, &conv)) != HPD_OK)
        return st;

    hpd_view_t q = {e->conv, c->conv_dim, dk};
    hpd_view_t k = {e->conv + nk * dk, c->conv_dim, dk};
    hpd_view_t v = {e->conv + 2 * nk * dk, c->conv_dim, dv};
    hpd_l2norm_args_t qn = {q, R, nk, dk, 1e-6f, 1.0f / sqrtf((float)dk)};
    hpd_l2norm_args_t kn = {k, R, nk, dk, 1e-6f, 1.0f};
    hpd_gdn_gating_args_t gate = {e->proj + boff + nv, e->proj + boff, e->ld_proj, e->ld_proj,
                                  w->gdn_a_log, w->gdn_dt_bias, e->g, e->beta, R, nv};
    if ((st = hpd_l2norm(e->be, &qn)) != HPD_OK || (st = hpd_l2norm(e->be, &kn)) != HPD_OK ||
        (st = hpd_gdn_gating(e->be, &gate)) != HPD_OK)
        return st;

    hpd_view_t out = {e->core, e->ld_core, dv};
    hpd_gdn_args_t gdn = {q, k, v, e->g, e->beta, out, nk, nv, dk, dv,
                          e->st_pre, e->seqs_pre, bt->n_pre};
    if (bt->n_pre > 0 && (st = hpd_gdn_chunked(e->be, &gdn)) != HPD_OK)
        return st;
    gdn.states = e->st_dec;
    gdn.seqs = e->seqs_dec;
    gdn.n_seqs = bt->n_dec;
    if (bt->n_dec > 0 && (st = hpd_gdn_recurrent(e->be, &gdn)) != HPD_OK)
        return st;

    hpd_gated_rmsnorm_args_t gn = {out, {e->proj + zoff, e->ld_proj, dv}, out, R, nv, dv,
                                   w->gdn_norm, c->rms_norm_eps};
    hpd_gemm_args_t o = {e->core, e->ld_core, w->gdn_out, e->x, H, R, H, nv * dv, true};
    if ((st = hpd_gated_rmsnorm(e->be, &gn)) != HPD_OK || (st = hpd_gemm(e->be, &o)) != HPD_OK)
        return st;
    return HPD_OK;
}

static hpd_status_t attn_layer(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads;
    const uint32_t hd = c->head_dim, a = c->kind_index[l];
    const uint32_t P = e->p.kv_layout.pack_size, group = a / P;
    hpd_status_t st;

    for (uint32_t i = 0; i < bt->n_items; i++) {
        const request_t *r = e->items[i].req;
        e->bt_all[i] = r->pages + (size_t)group * r->n_blocks;
    }
    hpd_rmsnorm_args_t norm = {{e->x, H, 0}, {e->h, H, 0}, R, 1, H, w->input_norm,
                               c->rms_norm_eps, true};
    hpd_gemm_args_t proj = {e->h, H, w->attn_qkv, e->proj, e->ld_proj, R,
                            hpd_model_attn_qkv_rows(c), H, false};
    if ((st = hpd_rmsnorm(e->be, &norm)) != HPD_OK || (st = hpd_gemm(e->be, &proj)) != HPD_OK)
        return st;

    hpd_view_t q = {e->proj, e->ld_proj, 2 * hd};
    hpd_view_t gate = {e->proj + hd, e->ld_proj, 2 * hd};
    hpd_view_t k = {e->proj + nh * 2 * hd, e->ld_proj, hd};
    hpd_view_t v = {e->proj + nh * 2 * hd + nkv * hd, e->ld_proj, hd};
    hpd_rmsnorm_args_t qn = {q, q, R, nh, hd, w->q_norm, c->rms_norm_eps, true};
    hpd_rmsnorm_args_t kn = {k, k, R, nkv, hd, w->k_norm, c->rms_norm_eps, true};
    hpd_rope_args_t qr = {q, R, nh, hd, c->rot_dim, e->positions, c->rope_theta};
    hpd_rope_args_t kr = {k, R, nkv, hd, c->rot_dim, e->positions, c->rope_theta};
    if ((st = hpd_rmsnorm(e->be, &qn)) != HPD_OK || (st = hpd_rmsnorm(e->be, &kn)) != HPD_OK ||
        (st = hpd_rope(e->be, &qr)) != HPD_OK || (st = hpd_rope(e->be, &kr)) != HPD_OK)
        return st;

    hpd_paged_kv_t kv = {&e->p.kv_layout, hpd_page_pool_base(e->pages), a % P, e->bt_all};
    hpd_kv_store_args_t store = {kv, k, v, e->seqs_all, bt->n_items};
    hpd_view_t out = {e->core, e->ld_core, hd};
    hpd_attention_args_t att = {kv, q, out, nh, 1.0f / sqrtf((float)hd), e->seqs_all,
                                bt->n_items};
    hpd_sigmoid_mul_args_t sg = {out, gate, R, nh, hd};
    hpd_gemm_args_t o = {e->core, e->ld_core, w->attn_o, e->x, H, R, H, nh * hd, true};
    if ((st = hpd_kv_store(e->be, &store)) != HPD_OK ||
        (st = hpd_attention(e->be, &att)) != HPD_OK ||
        (st = hpd_sigmoid_mul(e->be, &sg)) != HPD_OK || (st = hpd_gemm(e->be, &o)) != HPD_OK)
        return st;
    return HPD_OK;
}

static hpd_status_t mlp(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, I = c->intermediate_size;
    hpd_status_t st;

    hpd_rmsnorm_args_t norm = {{e->x, H, 0}, {e->h, H, 0}, R, 1, H, w->post_norm,
                               c->rms_norm_eps, true};
    hpd_gemm_args_t up = {e->h, H, w->mlp_gate_up, e->proj, e->ld_proj, R, 2 * I, H, false};
    hpd_silu_mul_args_t act = {e->proj, e->ld_proj, e->act, I, R, I};
    hpd_gemm_args_t down = {e->act, I, w->mlp_down, e->x, H, R, H, I, true};
    if ((st = hpd_rmsnorm(e->be, &norm)) != HPD_OK || (st = hpd_gemm(e->be, &up)) != HPD_OK ||
        (st = hpd_silu_mul(e->be, &act)) != HPD_OK || (st = hpd_gemm(e->be, &down)) != HPD_OK)
        return st;
    return HPD_OK;
}

/* Final norm and LM head over the rows that need logits. */
static hpd_status_t lm_head(hpd_engine_t *e, const batch_t *bt)
{
    const hpd_model_config_t *c = e->cfg;
    const uint32_t H = c->hidden_size, n = bt->n_logits;
    hpd_status_t st;

    for (uint32_t i = 0; i < n; i++) {
        st = hpd_backend_copy(e->be, e->lhid + (size_t)i * H,
                              e->x + (size_t)e->logit_rows[i] * H, H * sizeof(float));
        if (st != HPD_OK)
            return st;
    }
    hpd_rmsnorm_args_t norm = {{e->lhid, H, 0}, {e->lhid, H, 0}, n, 1, H,
                               e->w->final_norm, c->rms_norm_eps, true};
    hpd_gemm_args_t head = {e->lhid, H, e->w->lm_head, e->logits, c->vocab_size, n,
                            c->vocab_size, H, false};
    if ((st = hpd_rmsnorm(e->be, &norm)) != HPD_OK || (st = hpd_gemm(e->be, &head)) != HPD_OK)
        return st;
    return HPD_OK;
}

static hpd_status_t forward(hpd_engine_t *e, const batch_t *bt)
{
    const hpd_model_config_t *c = e->cfg;
    hpd_status_t st;

    hpd_embed_args_t emb = {e->ids, bt->rows, e->w->embed, c->hidden_size, e->x,
                            c->hidden_size};
    if ((st = hpd_embed(e->be, &emb)) != HPD_OK)
        return st;
    if (e->p.layer_cb != NULL)
        for (uint32_t i = 0; i < bt->n_items; i++) {
            const batch_item_t *it = &e->items[i];
            e->step_items[i] = (hpd_engine_step_item_t){
                it->req->id, it->req->n_done, it->n_tokens, !it->decode,
                !it->decode && it->req->n_done + it->n_tokens == it->req->n_prompt};
        }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        st = c->layer_full[l] ? attn_layer(e, bt, l) : gdn_layer(e, bt, l);
        if (st != HPD_OK)
            return st;
        /* this layer's KV rows and GDN states are final for the step's tokens */
        if (e->p.layer_cb != NULL)
            e->p.layer_cb(e->p.layer_cb_arg, l, e->step_items, bt->n_items);
        if ((st = mlp(e, bt, l)) != HPD_OK)
            return st;
    }
    return bt->n_logits > 0 ? lm_head(e, bt) : HPD_OK;
}

/* Lays out this step's rows: decoding requests first (one row each), then
 * prefill chunks while the row budget lasts. A prefill chunk ends on a
 * multiple of 64 unless it ends the prompt. */
static void build_batch(hpd_engine_t *e, batch_t *bt)
{
    const uint32_t budget = e->p.max_step_tokens;
    memset(bt, 0, sizeof(*bt));

    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < e->n_active; i++) {
            request_t *r = e->active[i];
            batch_item_t *it;
            uint32_t n;
            bool decode;

            if (r->state != HPD_REQ_RUNNING)
                continue;
            decode = r->n_done >= r->n_prompt;
            if (decode != (pass == 0))
                continue;
            if (decode) {
                n = 1;
            } else {
                const uint32_t left = r->n_prompt - r->n_done;
                const uint32_t room = budget - bt->rows;
                n = HPD_MIN(left, e->p.prefill_chunk);
                /* a chunk ends where a checkpoint is to be saved */
                if (r->next_ckpt < r->n_ckpt)
                    n = HPD_MIN(n, r->ckpt_pos[r->next_ckpt] - r->n_done);
                if (n > room)
                    n = room / HPD_GDN_CHUNK * HPD_GDN_CHUNK;
                if (n == 0)
                    continue;
            }
            it = &e->items[bt->n_items];
            it->req = r;
            it->n_tokens = n;
            it->decode = decode;
            it->wants_logits = decode || r->n_done + n == r->n_prompt;
            hpd_seq_t seq = {bt->rows, n, r->n_done};
            e->seqs_all[bt->n_items] = seq;
            for (uint32_t t = 0; t < n; t++) {
                const uint32_t pos = r->n_done + t;
                e->ids[bt->rows + t] =
                    pos < r->n_prompt ? r->prompt[pos] : r->out[pos - r->n_prompt];
                e->positions[bt->rows + t] = (int32_t)pos;
            }
            if (decode)
                e->seqs_dec[bt->n_dec++] = seq;
            else
                e->seqs_pre[bt->n_pre++] = seq;
            if (it->wants_logits) {
                e->logit_rows[bt->n_logits] = bt->rows + n - 1;
                e->logit_items[bt->n_logits++] = it;
            }
            bt->rows += n;
            bt->n_items++;
        }
    }
}

/* Samples (or replays) the next token of every request that got logits. */
static hpd_status_t emit_tokens(hpd_engine_t *e, const batch_t *bt)
{
    const uint32_t V = e->cfg->vocab_size;
    hpd_status_t st;

    for (uint32_t i = 0; i < bt->n_logits; i++) {
        const request_t *r = e->logit_items[i]->req;
        e->samp[i] = r->sampling;
        e->samp_pos[i] = r->n_prompt + r->n_out; /* position of the token drawn */
        if (e->p.logits_cb != NULL) {
            if ((st = hpd_backend_to_host(e->be, e->logits_host, e->logits + (size_t)i * V,
                                          V * sizeof(float))) != HPD_OK)
                return st;
            e->p.logits_cb(e->p.logits_cb_arg, r->id, r->n_prompt + r->n_out - 1,
                           e->logits_host, V);
        }
    }
    hpd_sample_args_t sa = {e->logits, V, bt->n_logits, V, e->samp, e->samp_pos, e->sampled};
    if (bt->n_logits > 0 && (st = hpd_sample(e->be, &sa)) != HPD_OK)
        return st;
    for (uint32_t i = 0; i < bt->n_logits; i++) {
        request_t *r = e->logit_items[i]->req;
        r->out[r->n_out] = r->n_out < r->n_replay ? r->replay[r->n_out] : e->sampled[i];
        r->n_out++;
    }
    return HPD_OK;
}

/* Records the blocks a prefill chunk completed, with the GDN state when the
 * chunk ended on a checkpoint position. */
static void cache_prefill_progress(hpd_engine_t *e, request_t *r)
{
    const uint32_t blocks = HPD_MIN(r->n_done, r->n_prompt) / HPD_PREFIX_BLOCK;
    const void *state = NULL;
    uint32_t *tables[256];
    hpd_status_t st;

    if (r->next_ckpt < r->n_ckpt && r->ckpt_pos[r->next_ckpt] == r->n_done) {
        r->next_ckpt++;
        if (r->slot != 0)
            state = hpd_slot_pool_ptr(e->slots, r->slot);
    }
    if (blocks == 0)
        return;
    request_tables(e, r, tables);
    st = hpd_prefix_cache_insert(e->cache, r->hashes, blocks, (const uint32_t *const *)tables,
                                 state);
    if (st != HPD_OK) /* the cache only loses an entry; the request goes on */
        HPD_LOG_WARN(LOG_COMPONENT, "request %llu: prefix cache insert failed: %s",
                     (unsigned long long)r->id, hpd_status_str(st));
}

hpd_status_t hpd_engine_step(hpd_engine_t *e, uint32_t *n_active_p)
{
    batch_t bt;
    hpd_status_t st = HPD_OK;
    double t0;

    admit_waiting(e);
    build_batch(e, &bt);
    if (bt.n_items > 0) {
        t0 = hpd_time_now();
        st = forward(e, &bt);
        if (st == HPD_OK)
            st = emit_tokens(e, &bt);
        if (st != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "forward step of %u rows failed: %s", bt.rows,
                          hpd_status_str(st));
            for (uint32_t i = 0; i < bt.n_items; i++)
                finish(e, e->items[i].req, HPD_REQ_FAILED);
        } else {
            for (uint32_t i = 0; i < bt.n_items; i++) {
                request_t *r = e->items[i].req;
                r->n_done += e->items[i].n_tokens;
                if (!e->items[i].decode && e->cache != NULL)
                    cache_prefill_progress(e, r);
                if (r->n_out == r->max_tokens)
                    finish(e, r, HPD_REQ_FINISHED);
            }
        }
        e->stats.steps++;
        e->stats.prefill_tokens += bt.rows - bt.n_dec;
        e->stats.decode_tokens += bt.n_dec;
        if (bt.n_pre > 0)
            e->stats.prefill_seconds += hpd_time_now() - t0;
        else
            e->stats.decode_seconds += hpd_time_now() - t0;
    }
    if (n_active_p != NULL)
        *n_active_p = e->n_active;
    return st;
}

hpd_status_t hpd_engine_run(hpd_engine_t *e)
{
    uint32_t active = 1;
    hpd_status_t st;

    while (active > 0)
        if ((st = hpd_engine_step(e, &active)) != HPD_OK)
            return st;
    return HPD_OK;
}

hpd_status_t hpd_engine_result(hpd_engine_t *e, uint64_t id, const int32_t **tokens_p,
                               uint32_t *n_p, hpd_request_state_t *state_p)
{
    const request_t *r = find(e, id);

    if (r == NULL)
        return HPD_ERR_NOT_FOUND;
    if (tokens_p != NULL)
        *tokens_p = r->out;
    if (n_p != NULL)
        *n_p = r->n_out;
    if (state_p != NULL)
        *state_p = r->state;
    return HPD_OK;
}

hpd_status_t hpd_engine_cancel(hpd_engine_t *e, uint64_t id)
{
    request_t *r = find(e, id);

    if (r == NULL)
        return HPD_ERR_NOT_FOUND;
    if (r->state == HPD_REQ_WAITING || r->state == HPD_REQ_RUNNING ||
        r->state == HPD_REQ_RESERVED)
        finish(e, r, HPD_REQ_FAILED);
    return HPD_OK;
}

void hpd_engine_release(hpd_engine_t *e, uint64_t id)
{
    request_t *r = find(e, id);

    if (r == NULL)
        return;
    hpd_engine_cancel(e, id);
    request_destroy(r);
    e->reqs[id - 1] = NULL;
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

hpd_status_t hpd_engine_request_info(const hpd_engine_t *e, uint64_t id,
                                     hpd_request_info_t *info)
{
    const request_t *r = find(e, id);

    if (r == NULL)
        return HPD_ERR_NOT_FOUND;
    info->prompt_tokens = r->n_prompt;
    info->cached_tokens = r->cached_tokens;
    info->cached_host_tokens = r->cached_host_tokens;
    return HPD_OK;
}

hpd_status_t hpd_engine_cache_stats(const hpd_engine_t *e, hpd_prefix_cache_stats_t *stats_p)
{
    if (e->cache == NULL)
        return HPD_ERR_NOT_FOUND;
    hpd_prefix_cache_stats(e->cache, stats_p);
    return HPD_OK;
}

uint32_t hpd_engine_audit(const hpd_engine_t *e)
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

void hpd_engine_stats(const hpd_engine_t *e, hpd_engine_stats_t *stats_p)
{
    *stats_p = e->stats;
}

const hpd_engine_params_t *hpd_engine_params(const hpd_engine_t *e)
{
    return &e->p;
}

/* ---------------------------------------------------------------- disaggregation */

hpd_status_t hpd_engine_reserve(hpd_engine_t *e, const hpd_request_params_t *p, uint64_t *id_p)
{
    request_t *r;
    hpd_status_t st;

    if (e->cache != NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "reservations need an engine without the prefix cache");
        return HPD_ERR_INVALID_ARG;
    }
    if ((st = new_request(e, p, &r)) != HPD_OK)
        return st;
    if ((st = admit(e, r)) != HPD_OK) {
        /* admit() left nothing held; the request is forgotten */
        e->reqs[--e->n_reqs] = NULL;
        request_destroy(r);
        return st;
    }
    /* admit() counted it as running; it runs only once started */
    e->n_running--;
    r->state = HPD_REQ_RESERVED;
    /* a peer writes the slot next, maybe straight into device memory: the
     * zeroing of the slot must have landed (a device backend runs it
     * asynchronously) */
    if ((st = hpd_backend_sync(e->be)) != HPD_OK) {
        hpd_engine_release(e, r->id);
        return st;
    }
    *id_p = r->id;
    return HPD_OK;
}

hpd_status_t hpd_engine_start(hpd_engine_t *e, uint64_t id, int32_t first_token)
{
    request_t *r = find(e, id);

    if (r == NULL || r->state != HPD_REQ_RESERVED)
        return HPD_ERR_NOT_FOUND;
    if (first_token < 0 || (uint32_t)first_token >= e->cfg->vocab_size) {
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: first token %d is outside the vocabulary "
                      "(0 to %u)", (unsigned long long)id, first_token, e->cfg->vocab_size - 1);
        return HPD_ERR_INVALID_ARG;
    }
    if (r->n_replay > 0 && r->replay[0] != first_token) {
        /* the prefill node and the earlier decode disagree: determinism broke */
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: first token %d differs from the replayed %d",
                      (unsigned long long)id, first_token, r->replay[0]);
        return HPD_ERR_INVALID_ARG;
    }
    if (hpd_grow(&e->active, &e->cap_active, (size_t)e->n_active + 1, sizeof(*e->active)) !=
        HPD_OK)
        return HPD_ERR_NO_MEMORY;
    r->n_done = r->n_prompt;
    r->out[0] = first_token;
    r->n_out = 1;
    r->state = HPD_REQ_RUNNING;
    e->n_running++;
    e->active[e->n_active++] = r;
    if (r->n_out == r->max_tokens)
        finish(e, r, HPD_REQ_FINISHED);
    return HPD_OK;
}

hpd_status_t hpd_engine_request_kv(const hpd_engine_t *e, uint64_t id, hpd_engine_kv_t *kv)
{
    const request_t *r = find(e, id);

    if (r == NULL || (r->state != HPD_REQ_RUNNING && r->state != HPD_REQ_RESERVED))
        return HPD_ERR_NOT_FOUND;
    memset(kv, 0, sizeof(*kv));
    kv->n_groups = e->n_groups;
    kv->n_blocks = r->n_blocks;
    for (uint32_t g = 0; g < e->n_groups && g < HPD_ENGINE_MAX_GROUPS; g++)
        kv->tables[g] = r->pages + (size_t)g * r->n_blocks;
    kv->state = r->slot != 0 ? hpd_slot_pool_ptr(e->slots, r->slot) : NULL;
    kv->slot = r->slot;
    return HPD_OK;
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
