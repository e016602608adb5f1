/* The engine's scheduler: requests (submit, reserve and start, cancel,
 * release), admission (pages, slots and the prefix cache), the batch of a
 * step (decode rows first, then prefill chunks) and the step itself. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/internal.h"

#define LOG_COMPONENT "engine"

void hpd_engine_request_free_resources(hpd_engine_t *e, request_t *r)
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

void hpd_engine_request_destroy(request_t *r)
{
    if (r == NULL)
        return;
    free(r->prompt);
    free(r->replay);
    free(r->stop_ids);
    free(r->out);
    free(r->lp);
    free(r->plp);
    free(r->raw);
    hpd_matcher_destroy(r->matcher);
    hpd_grammar_destroy(r->grammar);
    free(r->hashes);
    free(r);
}

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
    if (p->n_stop > HPD_MAX_STOP_IDS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%u stop token ids (expected at most %d)", p->n_stop,
                      HPD_MAX_STOP_IDS);
        return HPD_ERR_INVALID_ARG;
    }
    if (p->top_logprobs > HPD_MAX_TOP_LOGPROBS ||
        (p->top_logprobs > 0 && !p->logprobs && !p->prompt_logprobs)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "top logprobs %u (expected at most %d, with logprobs)",
                      p->top_logprobs, HPD_MAX_TOP_LOGPROBS);
        return HPD_ERR_INVALID_ARG;
    }
    if (p->min_tokens > p->max_tokens) {
        HPD_LOG_ERROR(LOG_COMPONENT, "min tokens %u exceeds max tokens %u", p->min_tokens,
                      p->max_tokens);
        return HPD_ERR_INVALID_ARG;
    }
    if ((st = check_ids(p->prompt, p->n_prompt, e->cfg->vocab_size, "prompt")) != HPD_OK ||
        (st = check_ids(p->replay, p->n_replay, e->cfg->vocab_size, "replayed")) != HPD_OK ||
        (st = check_ids(p->stop_ids, p->n_stop, e->cfg->vocab_size, "stop")) != HPD_OK)
        return st;
    if (p->n > HPD_MAX_CHOICES || p->n > e->p.max_batch || (p->n > 1 && p->n_replay > 0)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%u choices (expected 1 to %u, this engine's max batch, and "
                      "none with replayed tokens)", p->n, HPD_MIN(HPD_MAX_CHOICES, e->p.max_batch));
        return HPD_ERR_INVALID_ARG;
    }
    if (p->grammar != NULL && e->p.vocab == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "a structured output needs the model's tokenizer "
                      "(tokenizer.json beside the model): none was loaded");
        return HPD_ERR_UNSUPPORTED;
    }
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

/* A request's matcher, its end tokens and, with logprobs, the buffer of
 * its unmasked logits. */
static hpd_status_t grammar_begin(hpd_engine_t *e, request_t *r, const hpd_request_params_t *p)
{
    hpd_status_t st;
    r->grammar = hpd_grammar_retain(p->grammar);
    r->grammar_waits = hpd_grammar_after_token(r->grammar) >= 0;
    if ((st = hpd_matcher_create(r->grammar, &r->matcher)) != HPD_OK)
        return st;
    for (uint32_t i = 0; !p->ignore_eos && i < e->cfg->n_eos && r->n_end < 16; i++)
        r->end_ids[r->n_end++] = e->cfg->eos_ids[i];
    for (uint32_t i = 0; i < p->n_stop; i++)
        r->end_ids[r->n_end++] = p->stop_ids[i];
    if (p->logprobs && (r->raw = malloc(e->cfg->vocab_size * sizeof(float))) == NULL)
        return HPD_ERR_NO_MEMORY;
    return HPD_OK;
}

/* A token came: the grammar takes it, or the request fails (only a
 * replayed or handed-over token can be one it refuses). */
static void grammar_accept(const hpd_engine_t *e, request_t *r, int32_t token)
{
    if (r->matcher == NULL || r->grammar_failed)
        return;
    if (r->grammar_waits) { /* the document starts after this one */
        r->grammar_waits = token != hpd_grammar_after_token(r->grammar);
        return;
    }
    if (hpd_matcher_accept_token(r->matcher, e->p.vocab, token, r->end_ids, r->n_end) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: token %d at output position %u is not one "
                      "its grammar allows", (unsigned long long)r->id, token, r->n_out);
        r->grammar_failed = true;
    }
}

/* Logits row i of a request with a grammar: every token it does not allow
 * set to -inf (the row before kept for its logprobs). */
static hpd_status_t grammar_mask_row(hpd_engine_t *e, request_t *r, uint32_t i)
{
    const uint32_t V = e->cfg->vocab_size;
    float *row = e->logits + (size_t)i * V;
    /* the row itself where the backend's memory is the host's, else a copy
     * written back */
    const bool direct = hpd_backend_host_memory(e->be);
    float *host = direct ? row : e->logits_host;
    hpd_status_t st;
    if (!direct && (st = hpd_backend_to_host(e->be, host, row, V * sizeof(float))) != HPD_OK)
        return st;
    if (r->raw != NULL) {
        memcpy(r->raw, host, V * sizeof(float));
        r->raw_fresh = true;
    }
    memset(e->grammar_mask, 0, (V + 31) / 32 * sizeof(uint32_t));
    if ((st = hpd_matcher_mask(r->matcher, e->p.vocab, r->end_ids, r->n_end, e->grammar_mask)) !=
        HPD_OK)
        return st;
    bool any = false;
    for (uint32_t t = 0; t < V; t++) {
        if (!(e->grammar_mask[t / 32] >> (t % 32) & 1))
            host[t] = -INFINITY;
        else
            any = true;
    }
    if (!any) {
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: its grammar allows no token at output "
                      "position %u", (unsigned long long)r->id, r->n_out);
        r->grammar_failed = true;
    }
    return direct ? HPD_OK : hpd_backend_from_host(e->be, row, host, V * sizeof(float));
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
    r->stop_ids = malloc((p->n_stop + 1) * sizeof(int32_t));
    if (p->logprobs)
        r->lp = calloc(p->max_tokens, sizeof(*r->lp));
    if (p->prompt_logprobs)
        r->plp = calloc(p->n_prompt, sizeof(*r->plp));
    r->top_logprobs = p->top_logprobs;
    if (r->prompt == NULL || r->out == NULL || r->replay == NULL || r->stop_ids == NULL ||
        (p->logprobs && r->lp == NULL) || (p->prompt_logprobs && r->plp == NULL)) {
        hpd_engine_request_destroy(r);
        return HPD_ERR_NO_MEMORY;
    }
    memcpy(r->prompt, p->prompt, p->n_prompt * sizeof(int32_t));
    if (p->n_replay > 0)
        memcpy(r->replay, p->replay, p->n_replay * sizeof(int32_t));
    if (p->n_stop > 0)
        memcpy(r->stop_ids, p->stop_ids, p->n_stop * sizeof(int32_t));
    r->n_stop = p->n_stop;
    r->ignore_eos = p->ignore_eos;
    r->min_tokens = p->min_tokens;
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->sampling = p->sampling;
    r->n_replay = p->n_replay;
    r->n_choices = p->n > 1 ? p->n : 1;
    if (p->grammar != NULL && (st = grammar_begin(e, r, p)) != HPD_OK) {
        hpd_engine_request_destroy(r);
        return st;
    }
    r->state = HPD_REQ_WAITING;
    r->id = e->n_reqs + 1;
    r->choice_ids[0] = r->id;
    e->reqs[e->n_reqs++] = r;
    *r_p = r;
    return HPD_OK;
}

static hpd_status_t submit_rank(hpd_engine_t *e, const hpd_request_params_t *p, uint64_t *id_p)
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
    e->n_running -= r->held; /* places for choices never forked */
    r->held = 0;
    if (r->state == HPD_REQ_WAITING || r->state == HPD_REQ_RUNNING) {
        uint32_t i = 0;
        while (i < e->n_active && e->active[i] != r)
            i++;
        if (i < e->n_active) {
            memmove(e->active + i, e->active + i + 1, (e->n_active - i - 1) * sizeof(*e->active));
            e->n_active--;
        }
    }
    hpd_engine_request_free_resources(e, r);
    r->state = state;
}

const char *hpd_finish_reason_name(hpd_finish_reason_t reason)
{
    return reason == HPD_FINISH_STOP ? "stop" : reason == HPD_FINISH_LENGTH ? "length" : "";
}

static bool in(const int32_t *ids, uint32_t n, int32_t t)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == t)
            return true;
    return false;
}

/* After a token was added: the request ends on a stop token (once
 * min_tokens are out) or at max_tokens. */
static void end_if_done(hpd_engine_t *e, request_t *r)
{
    const int32_t t = r->out[r->n_out - 1];
    const bool eos = !r->ignore_eos && in(e->cfg->eos_ids, e->cfg->n_eos, t);
    /* a grammar's whole document that nothing extends, with no end token
     * to force: it ends here */
    const bool whole = r->matcher != NULL && r->n_end == 0 && !r->grammar_waits &&
                       hpd_matcher_must_end(r->matcher);
    if ((r->n_out >= r->min_tokens && (eos || in(r->stop_ids, r->n_stop, t))) || whole) {
        r->finish_reason = HPD_FINISH_STOP;
        finish(e, r, HPD_REQ_FINISHED);
    } else if (r->n_out == r->max_tokens) {
        r->finish_reason = HPD_FINISH_LENGTH;
        finish(e, r, HPD_REQ_FINISHED);
    }
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
        /* a request that wants its prompt's logprobs computes every row */
        if ((st = hpd_prefix_cache_lookup(e->cache, r->hashes, r->plp != NULL ? 0 : r->n_prompt,
                                          &r->match)) != HPD_OK)
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
    r->held = r->n_choices - 1; /* its choices' places in the batch */
    e->n_running += r->held;
    return HPD_OK;
fail:
    hpd_engine_request_free_resources(e, r);
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
        if (e->n_running + r->n_choices > e->p.max_batch)
            break; /* its choices need places too */
        st = admit(e, r);
        if (st == HPD_ERR_NO_RESOURCE)
            break; /* first come, first served: wait for frees */
        if (st != HPD_OK) {
            finish(e, r, HPD_REQ_FAILED); /* removes it from the active list */
            i--;
        }
    }
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
            hpd_seq_t seq = {.row = bt->rows, .n_tokens = n, .start_pos = r->n_done};
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
            /* the prompt's rows whose next token is a prompt token */
            for (uint32_t t = 0; r->plp != NULL && !decode && t < n; t++)
                if (r->n_done + t + 1 < r->n_prompt) {
                    e->plp_reqs[bt->n_plp] = r;
                    e->plp_rows[bt->n_plp] = bt->rows + t;
                    e->plp_pos[bt->n_plp++] = r->n_done + t;
                }
            bt->rows += n;
            bt->n_items++;
        }
    }
    /* the prompt rows' logits come after the sampled rows' */
    for (uint32_t j = 0; j < bt->n_plp; j++)
        e->logit_rows[bt->n_logits + j] = e->plp_rows[j];
}

/* Choice c of request r: a request of its own, seed + c for its sampling. */
static hpd_status_t choice_new(hpd_engine_t *e, request_t *r, uint32_t c, request_t **ch_p)
{
    hpd_request_params_t p = {.prompt = r->prompt, .n_prompt = r->n_prompt,
                              .max_tokens = r->max_tokens, .sampling = r->sampling,
                              .stop_ids = r->stop_ids, .n_stop = r->n_stop,
                              .ignore_eos = r->ignore_eos, .min_tokens = r->min_tokens,
                              .logprobs = r->lp != NULL, .top_logprobs = r->top_logprobs,
                              .grammar = r->grammar};
    p.sampling.seed = r->sampling.seed + c;
    hpd_status_t st = new_request(e, &p, ch_p);
    if (st == HPD_OK)
        r->choice_ids[c] = (*ch_p)->id;
    return st;
}

/* What choice ch of r holds alone: the pages of the blocks past the
 * prompt's full ones (those are r's, shared at choice_join: NO_PAGE until
 * then) and a GDN slot. */
static hpd_status_t choice_take(hpd_engine_t *e, const request_t *r, request_t *ch)
{
    hpd_status_t st;
    if (e->pages != NULL) {
        const uint32_t full = r->n_prompt / e->p.kv_layout.block_size;
        const uint32_t per_group = r->n_blocks - full, own = per_group * e->n_groups;
        uint32_t *ids = malloc((own + 1) * sizeof(uint32_t));
        ch->n_blocks = r->n_blocks;
        ch->pages = malloc((size_t)r->n_blocks * e->n_groups * sizeof(uint32_t));
        if (ids == NULL || ch->pages == NULL) {
            free(ids);
            return HPD_ERR_NO_MEMORY;
        }
        for (uint32_t k = 0; k < r->n_blocks * e->n_groups; k++)
            ch->pages[k] = NO_PAGE;
        if ((st = take_pages(e, own, ids)) != HPD_OK) {
            free(ids);
            return st;
        }
        for (uint32_t g = 0; g < e->n_groups; g++)
            memcpy(ch->pages + (size_t)g * r->n_blocks + full, ids + (size_t)g * per_group,
                   per_group * sizeof(uint32_t));
        free(ids);
    }
    if (e->slots != NULL)
        return hpd_slot_pool_alloc(e->slots, &ch->slot);
    return HPD_OK;
}

/* Choice ch takes r's prompt as its own: r's full prompt pages by
 * reference, copies of the page the prompt ends in and of the GDN state. */
static hpd_status_t choice_join(hpd_engine_t *e, const request_t *r, request_t *ch)
{
    hpd_status_t st;
    if (e->pages != NULL) {
        const uint32_t B = e->p.kv_layout.block_size, full = r->n_prompt / B;
        const uint64_t pb = hpd_kv_layout_page_bytes(&e->p.kv_layout);
        char *base = hpd_page_pool_base(e->pages);
        for (uint32_t g = 0; g < e->n_groups; g++) {
            const uint32_t *pt = r->pages + (size_t)g * r->n_blocks;
            uint32_t *ct = ch->pages + (size_t)g * r->n_blocks;
            for (uint32_t b = 0; b < full; b++) {
                hpd_page_pool_ref(e->pages, pt[b]);
                ct[b] = pt[b];
            }
            if (r->n_prompt % B != 0 && full < r->n_blocks &&
                (st = hpd_backend_copy(e->be, base + (size_t)ct[full] * pb,
                                       base + (size_t)pt[full] * pb, pb)) != HPD_OK)
                return st;
        }
    }
    if (e->slots != NULL) {
        const hpd_slot_copy_args_t ca = {.dst = hpd_slot_pool_ptr(e->slots, ch->slot),
                                         .src = hpd_slot_pool_ptr(e->slots, r->slot),
                                         .bytes = hpd_slot_pool_slot_bytes(e->slots)};
        return hpd_slot_copy(e->be, &ca);
    }
    return HPD_OK;
}

/* Choice ch, its prompt in place, joins the batch with its first token. */
static void choice_run(hpd_engine_t *e, request_t *ch, int32_t tok)
{
    ch->n_done = ch->n_prompt;
    ch->out[0] = tok;
    grammar_accept(e, ch, tok);
    ch->n_out = 1;
    ch->state = HPD_REQ_RUNNING;
    e->n_running++;
    e->active[e->n_active++] = ch;
    if (ch->grammar_failed)
        finish(e, ch, HPD_REQ_FAILED);
    else
        end_if_done(e, ch);
}

/* Choice c of request r, forked once r's prompt is computed: it draws its
 * first token from r's logits row i (raw: the row before a grammar's mask,
 * on the host, for its logprobs; NULL: the row is). One that ends at its
 * first token (max_tokens 1: a prefill node's) needs no pages or state. */
static hpd_status_t fork_choice(hpd_engine_t *e, request_t *r, uint32_t i, uint32_t c,
                                const float *raw)
{
    const uint32_t V = e->cfg->vocab_size;
    request_t *ch;
    hpd_status_t st = choice_new(e, r, c, &ch);
    if (st != HPD_OK)
        return st;
    r->held--;
    e->n_running--; /* the place it held is its own now (choice_run) or given back */
    const uint64_t pos = r->n_prompt;
    int32_t tok;
    hpd_sample_args_t sa = {.logits = e->logits + (size_t)i * V, .ld = V, .n_rows = 1,
                            .vocab = V, .params = &ch->sampling, .positions = &pos, .out = &tok};
    if ((st = hpd_sample(e->be, &sa)) != HPD_OK)
        goto fail;
    if (r->max_tokens > 1 &&
        ((st = choice_take(e, r, ch)) != HPD_OK || (st = choice_join(e, r, ch)) != HPD_OK))
        goto fail;
    if (ch->lp != NULL && e->rank == 0) {
        if (raw == NULL &&
            (st = hpd_backend_to_host(e->be, e->logits_host, e->logits + (size_t)i * V,
                                      V * sizeof(float))) != HPD_OK)
            goto fail;
        hpd_logprobs_compute(raw != NULL ? raw : e->logits_host, V, tok, ch->top_logprobs,
                             &ch->lp[0]);
    }
    choice_run(e, ch, tok);
    return HPD_OK;
fail:
    HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: choice %u could not start: %s",
                  (unsigned long long)r->id, c, hpd_status_str(st));
    finish(e, ch, HPD_REQ_FAILED);
    return HPD_OK; /* the other choices go on */
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
    for (uint32_t i = 0; i < bt->n_logits; i++) {
        request_t *r = e->logit_items[i]->req;
        if (r->matcher != NULL && r->n_out >= r->n_replay && !r->grammar_failed &&
            !r->grammar_waits &&
            (st = grammar_mask_row(e, r, i)) != HPD_OK)
            return st;
    }
    hpd_sample_args_t sa = {.logits = e->logits,
                            .ld = V,
                            .n_rows = bt->n_logits,
                            .vocab = V,
                            .params = e->samp,
                            .positions = e->samp_pos,
                            .out = e->sampled};
    if (bt->n_logits > 0 && (st = hpd_sample(e->be, &sa)) != HPD_OK)
        return st;
    /* the prompt rows' (their logits after the sampled rows'), rank 0's */
    for (uint32_t j = 0; j < bt->n_plp && e->rank == 0; j++) {
        request_t *r = e->plp_reqs[j];
        const uint32_t pos = e->plp_pos[j];
        if ((st = hpd_backend_to_host(e->be, e->logits_host,
                                      e->logits + (size_t)(bt->n_logits + j) * V,
                                      V * sizeof(float))) != HPD_OK)
            return st;
        hpd_logprobs_compute(e->logits_host, V, r->prompt[pos + 1], r->top_logprobs,
                             &r->plp[pos]);
    }
    for (uint32_t i = 0; i < bt->n_logits; i++) {
        request_t *r = e->logit_items[i]->req;
        r->out[r->n_out] = r->n_out < r->n_replay ? r->replay[r->n_out] : e->sampled[i];
        /* from the logits the sampler saw (before a grammar's mask); rank
         * 0's, which has them whole */
        if (r->lp != NULL && e->rank == 0) {
            const bool raw = r->raw_fresh;
            if (!raw && (st = hpd_backend_to_host(e->be, e->logits_host, e->logits + (size_t)i * V,
                                                  V * sizeof(float))) != HPD_OK)
                return st;
            hpd_logprobs_compute(raw ? r->raw : e->logits_host, V, r->out[r->n_out],
                                 r->top_logprobs, &r->lp[r->n_out]);
        }
        /* a request of several choices: the others start from this row */
        for (uint32_t c = 1; r->n_out == 0 && c < r->n_choices; c++)
            if ((st = fork_choice(e, r, i, c, r->raw_fresh ? r->raw : NULL)) != HPD_OK)
                return st;
        r->n_forked = r->n_out == 0 ? r->n_choices : r->n_forked;
        r->raw_fresh = false;
        grammar_accept(e, r, r->out[r->n_out]);
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

static hpd_status_t step_rank(hpd_engine_t *e, uint32_t *n_active_p)
{
    batch_t bt;
    hpd_status_t st = HPD_OK;
    double t0;

    admit_waiting(e);
    build_batch(e, &bt);
    /* TP: the ranks compare their batches at every step, an empty one too
     * (a rank that holds requests the others do not would wait for them
     * at its first meeting) */
    if (e->tp > 1 && (st = hpd_engine_tp_check(e, &bt)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "step of %u rows refused: %s", bt.rows, hpd_status_str(st));
        for (uint32_t i = 0; i < bt.n_items; i++)
            finish(e, e->items[i].req, HPD_REQ_FAILED);
        if (n_active_p != NULL)
            *n_active_p = e->n_active;
        return st;
    }
    if (bt.n_items > 0) {
        const double meet0 = e->tp_meet_seconds;
        t0 = hpd_time_now();
        st = hpd_engine_forward_step(e, &bt);
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
                if (e->items[i].wants_logits && r->grammar_failed)
                    finish(e, r, HPD_REQ_FAILED);
                else if (e->items[i].wants_logits) /* it got a token */
                    end_if_done(e, r);
            }
        }
        e->stats.steps++;
        e->stats.prefill_tokens += bt.rows - bt.n_dec;
        e->stats.decode_tokens += bt.n_dec;
        if (bt.n_pre > 0) {
            e->stats.prefill_seconds += hpd_time_now() - t0;
            e->stats.tp_prefill_seconds += e->tp_meet_seconds - meet0;
        } else {
            e->stats.decode_seconds += hpd_time_now() - t0;
            e->stats.decode_steps++;
            e->stats.tp_decode_seconds += e->tp_meet_seconds - meet0;
        }
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

static hpd_status_t cancel_rank(hpd_engine_t *e, uint64_t id)
{
    request_t *r = find(e, id);

    if (r == NULL)
        return HPD_ERR_NOT_FOUND;
    if (r->state == HPD_REQ_RESERVED) /* its choices are reserved with it */
        for (uint32_t c = 1; c < r->n_forked; c++) {
            request_t *ch = find(e, r->choice_ids[c]);
            if (ch != NULL && ch->state == HPD_REQ_RESERVED)
                finish(e, ch, HPD_REQ_FAILED);
        }
    if (r->state == HPD_REQ_WAITING || r->state == HPD_REQ_RUNNING ||
        r->state == HPD_REQ_RESERVED)
        finish(e, r, HPD_REQ_FAILED);
    return HPD_OK;
}

hpd_status_t hpd_engine_choices(const hpd_engine_t *e, uint64_t id, const uint64_t **ids_p,
                                uint32_t *n_p)
{
    const request_t *r = find(e, id);
    if (r == NULL)
        return HPD_ERR_NOT_FOUND;
    *ids_p = r->choice_ids;
    *n_p = r->n_forked > 0 ? r->n_forked : 1;
    return HPD_OK;
}

static void release_rank(hpd_engine_t *e, uint64_t id)
{
    request_t *r = find(e, id);

    if (r == NULL)
        return;
    for (uint32_t c = 1; c < r->n_forked; c++) /* its choices go with it */
        if (r->choice_ids[c] != 0 && r->choice_ids[c] != id)
            release_rank(e, r->choice_ids[c]);
    cancel_rank(e, id);
    hpd_engine_request_destroy(r);
    e->reqs[id - 1] = NULL;
}

hpd_status_t hpd_engine_prompt_logprobs(const hpd_engine_t *e, uint64_t id,
                                        const hpd_token_logprobs_t **lp_p, uint32_t *n_p)
{
    const request_t *r = find(e, id);
    if (r == NULL || r->plp == NULL)
        return HPD_ERR_NOT_FOUND;
    *lp_p = r->plp;
    *n_p = r->n_done >= r->n_prompt ? r->n_prompt - 1 : 0;
    return HPD_OK;
}

hpd_status_t hpd_engine_logprobs(const hpd_engine_t *e, uint64_t id,
                                 const hpd_token_logprobs_t **lp_p, uint32_t *n_p)
{
    const request_t *r = find(e, id);
    if (r == NULL || r->lp == NULL)
        return HPD_ERR_NOT_FOUND;
    *lp_p = r->lp;
    *n_p = r->n_out;
    return HPD_OK;
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
    info->finish_reason = r->finish_reason;
    return HPD_OK;
}

static void unadd_rank(hpd_engine_t *e, uint64_t id);

static hpd_status_t reserve_rank(hpd_engine_t *e, const hpd_request_params_t *p, uint64_t *id_p)
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
        hpd_engine_request_destroy(r);
        return st;
    }
    /* admit() counted it (and its choices) as running; they run only once
     * started */
    e->n_running -= 1 + r->held;
    r->held = 0;
    r->state = HPD_REQ_RESERVED;
    /* its choices' own pages and slots, now or never */
    for (uint32_t c = 1; c < r->n_choices; c++) {
        request_t *ch;
        if ((st = choice_new(e, r, c, &ch)) == HPD_OK) {
            ch->state = HPD_REQ_RESERVED;
            r->n_forked = c + 1;
            st = choice_take(e, r, ch);
        }
        if (st != HPD_OK) {
            unadd_rank(e, r->id); /* and the choices taken */
            return st;
        }
    }
    /* a peer writes the slot next, maybe straight into device memory: the
     * zeroing of the slot must have landed (a device backend runs it
     * asynchronously) */
    if ((st = hpd_backend_sync(e->be)) != HPD_OK) {
        release_rank(e, r->id);
        return st;
    }
    *id_p = r->id;
    return HPD_OK;
}

static hpd_status_t start_rank(hpd_engine_t *e, uint64_t id, const int32_t *first,
                               uint32_t n_first)
{
    request_t *r = find(e, id);
    hpd_status_t st;

    if (r == NULL || r->state != HPD_REQ_RESERVED)
        return HPD_ERR_NOT_FOUND;
    if (n_first != r->n_choices) {
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: %u first tokens for %u choices",
                      (unsigned long long)id, n_first, r->n_choices);
        return HPD_ERR_INVALID_ARG;
    }
    for (uint32_t c = 0; c < n_first; c++)
        if (first[c] < 0 || (uint32_t)first[c] >= e->cfg->vocab_size) {
            HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: first token %d is outside the "
                          "vocabulary (0 to %u)", (unsigned long long)id, first[c],
                          e->cfg->vocab_size - 1);
            return HPD_ERR_INVALID_ARG;
        }
    if (r->n_replay > 0 && r->replay[0] != first[0]) {
        /* the prefill node and the earlier decode disagree: determinism broke */
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: first token %d differs from the replayed %d",
                      (unsigned long long)id, first[0], r->replay[0]);
        return HPD_ERR_INVALID_ARG;
    }
    if (hpd_grow(&e->active, &e->cap_active, (size_t)e->n_active + n_first,
                 sizeof(*e->active)) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    if (r->matcher != NULL) {
        grammar_accept(e, r, first[0]);
        if (r->grammar_failed)
            return HPD_ERR_INVALID_ARG;
    }
    /* the choices copy the prompt's state before any step changes it */
    for (uint32_t c = 1; c < r->n_forked; c++) {
        request_t *ch = find(e, r->choice_ids[c]);
        if (ch == NULL || ch->state != HPD_REQ_RESERVED)
            continue; /* canceled on its own */
        if ((st = choice_join(e, r, ch)) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: choice %u could not start: %s",
                          (unsigned long long)id, c, hpd_status_str(st));
            finish(e, ch, HPD_REQ_FAILED);
            continue;
        }
        if (ch->lp != NULL) /* sampled by the prefill side, which has its logprobs */
            ch->lp[0] = (hpd_token_logprobs_t){.logprob = NAN};
        choice_run(e, ch, first[c]);
    }
    r->n_done = r->n_prompt;
    r->out[0] = first[0];
    if (r->lp != NULL)
        r->lp[0] = (hpd_token_logprobs_t){.logprob = NAN};
    r->n_out = 1;
    r->state = HPD_REQ_RUNNING;
    e->n_running++;
    e->active[e->n_active++] = r;
    end_if_done(e, r);
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

/* ---- tensor parallelism (engine/tp.h): rank 0's calls, repeated on the
 * other ranks in the same order, keep their schedulers in lockstep. A call
 * rank 0 refused is not repeated. One that a peer refuses where rank 0
 * accepted (only memory can run out on one rank alone) is undone on every
 * rank that took it and answered with the peer's status: the ranks hold
 * the same requests again. */

static void refused_by_peer(uint32_t r, const char *what, hpd_status_t st)
{
    HPD_LOG_ERROR(LOG_COMPONENT, "tp rank %u refused %s that rank 0 took (%s): undone on every "
                  "rank", r, what, hpd_status_str(st));
}

/* Undoes the request a rank just added: released, and its id given back
 * so that the rank numbers its next request as the others do. */
static void unadd_rank(hpd_engine_t *e, uint64_t id)
{
    release_rank(e, id); /* and its reserved choices, numbered right after it */
    if (e->n_reqs >= id)
        e->n_reqs = id - 1;
}

/* submit and reserve: the same id on every rank, or the request nowhere */
static hpd_status_t add_everywhere(hpd_engine_t *e, const hpd_request_params_t *p,
                                   uint64_t *id_p, bool reserve, const char *what)
{
    hpd_status_t (*add)(hpd_engine_t *, const hpd_request_params_t *, uint64_t *) =
        reserve ? reserve_rank : submit_rank;
    uint64_t id;
    hpd_status_t st = add(e, p, &id);
    uint32_t r = 1;
    for (; r < e->tp && e->rank == 0 && st == HPD_OK; r++) {
        uint64_t pid = 0;
        if ((st = add(e->peers[r], p, &pid)) == HPD_OK && pid != id) {
            unadd_rank(e->peers[r], pid);
            st = HPD_ERR_INTERNAL;
        }
        if (st != HPD_OK) {
            refused_by_peer(r, what, st);
            for (uint32_t k = 0; k < r; k++)
                unadd_rank(k == 0 ? e : e->peers[k], id);
        }
    }
    if (st == HPD_OK)
        *id_p = id;
    return st;
}

hpd_status_t hpd_engine_submit(hpd_engine_t *e, const hpd_request_params_t *p, uint64_t *id_p)
{
    return add_everywhere(e, p, id_p, false, "a submit");
}

/* Whether rank `peer` holds request id in the pages and slot rank 0 holds
 * it in (the ranks allocate in lockstep; a peer writing into one rank's
 * pages from another's table would corrupt it silently). */
static bool same_memory(const hpd_engine_t *e, const hpd_engine_t *peer, uint64_t id)
{
    const request_t *a = find(e, id), *b = find(peer, id);
    if (a == NULL || b == NULL || a->slot != b->slot || a->n_blocks != b->n_blocks ||
        a->n_forked != b->n_forked ||
        (e->n_groups > 0 &&
         memcmp(a->pages, b->pages, (size_t)e->n_groups * a->n_blocks * sizeof(uint32_t)) != 0))
        return false;
    for (uint32_t c = 1; c < a->n_forked; c++) /* its reserved choices' */
        if (a->choice_ids[c] == id || !same_memory(e, peer, a->choice_ids[c]))
            return false;
    return true;
}

hpd_status_t hpd_engine_reserve(hpd_engine_t *e, const hpd_request_params_t *p, uint64_t *id_p)
{
    uint64_t id;
    hpd_status_t st = add_everywhere(e, p, &id, true, "a reserve");
    for (uint32_t r = 1; r < e->tp && e->rank == 0 && st == HPD_OK; r++)
        if (!same_memory(e, e->peers[r], id)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "tp rank %u holds reservation %llu in other pages or "
                          "another slot than rank 0: refused on every rank", r,
                          (unsigned long long)id);
            for (uint32_t k = 0; k < e->tp; k++)
                unadd_rank(k == 0 ? e : e->peers[k], id);
            st = HPD_ERR_INTERNAL;
        }
    if (st == HPD_OK)
        *id_p = id;
    return st;
}

hpd_status_t hpd_engine_start(hpd_engine_t *e, uint64_t id, int32_t first_token)
{
    return hpd_engine_start_choices(e, id, &first_token, 1);
}

hpd_status_t hpd_engine_start_choices(hpd_engine_t *e, uint64_t id, const int32_t *first,
                                      uint32_t n)
{
    hpd_status_t st = start_rank(e, id, first, n);
    for (uint32_t r = 1; r < e->tp && e->rank == 0 && st == HPD_OK; r++)
        if ((st = start_rank(e->peers[r], id, first, n)) != HPD_OK) {
            refused_by_peer(r, "a start", st);
            for (uint32_t k = 0; k < e->tp; k++)
                cancel_rank(k == 0 ? e : e->peers[k], id);
        }
    return st;
}

hpd_status_t hpd_engine_cancel(hpd_engine_t *e, uint64_t id)
{
    const hpd_status_t st = cancel_rank(e, id);
    for (uint32_t r = 1; r < e->tp && e->rank == 0; r++)
        cancel_rank(e->peers[r], id);
    return st;
}

void hpd_engine_release(hpd_engine_t *e, uint64_t id)
{
    release_rank(e, id);
    for (uint32_t r = 1; r < e->tp && e->rank == 0; r++)
        release_rank(e->peers[r], id);
}

static hpd_status_t step_peer(void *arg)
{
    return step_rank(arg, NULL);
}

hpd_status_t hpd_engine_step(hpd_engine_t *e, uint32_t *n_active_p)
{
    if (e->tp == 1 || e->rank != 0)
        return step_rank(e, n_active_p);
    for (uint32_t r = 1; r < e->tp; r++)
        hpd_tp_worker_post(e->workers[r], step_peer, e->peers[r]);
    hpd_status_t st = step_rank(e, n_active_p);
    for (uint32_t r = 1; r < e->tp; r++) {
        const hpd_status_t pst = hpd_tp_worker_wait(e->workers[r]);
        if (st == HPD_OK)
            st = pst;
    }
    /* every rank is back: a step one of them failed (and the others
     * stopped at its abort) leaves the group ready for the next */
    hpd_tp_group_reset(e->group);
    return st;
}
