/* The single-process engine: a model, a kernel backend, a KV page pool and a
 * GDN slot pool; requests run with chunked prefill and one-token decode steps
 * in one continuous batch (docs/architecture.md). */
#ifndef HPD_ENGINE_ENGINE_H
#define HPD_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/kv_layout.h"
#include "common/logprobs.h"
#include "grammar/grammar.h"
#include "cache/prefix_cache.h"
#include "kernels/backend.h"
#include "model/model.h"

typedef struct hpd_engine hpd_engine_t;

/* Called with the logits (host memory, vocab floats) computed for the token
 * at `position` of request `id`, before sampling. For tests and tools. */
typedef void (*hpd_engine_logits_cb_t)(void *arg, uint64_t id, uint32_t position,
                                       const float *logits, uint32_t vocab);

/* One request's rows in a forward step. */
typedef struct {
    uint64_t id;
    uint32_t pos;      /* position of the first token computed in this step */
    uint32_t n_tokens;
    bool prefill;
    bool last_chunk;   /* a prefill chunk that ends the prompt */
} hpd_engine_step_item_t;

/* Called during a step right after layer `layer` ran (before its MLP): the
 * layer's KV rows and GDN state are final for the step's tokens. A prefill
 * node pushes them from here (layerwise). */
typedef void (*hpd_engine_layer_cb_t)(void *arg, uint32_t layer,
                                      const hpd_engine_step_item_t *items, uint32_t n_items);

typedef struct {
    const hpd_model_t *model;   /* borrowed; must outlive the engine */
    hpd_backend_t *backend;     /* borrowed; must outlive the engine */
    hpd_kv_layout_t kv_layout;  /* block_size, pack_size, order; the shape is set from the
                                   model and the dtype is f32 */
    uint32_t max_batch;         /* requests running at once; default 16 */
    uint32_t max_context;       /* prompt + generated tokens; default min(4096, model max) */
    uint32_t prefill_chunk;     /* a multiple of 64; default 256 */
    uint32_t max_step_tokens;   /* rows per forward step; default prefill_chunk + max_batch */
    uint32_t n_pages;           /* 0: enough for max_batch requests of max_context
                                   (twice that with the prefix cache on) */
    uint32_t n_slots;           /* live GDN slots; 0: max_batch */
    /* prefix cache (docs/prefix_cache.md) */
    bool prefix_cache;          /* default true */
    uint32_t n_checkpoints;     /* device checkpoint slots; default 4 * max_batch */
    uint64_t host_cache_bytes;  /* host tier bound; default 512 MiB; 0 disables the tier */
    uint32_t checkpoint_every;  /* checkpoint every N blocks of long prompts; default 16 */
    /* Decode-only steps recorded and run as graphs where the backend can
     * (CUDA: a few graphs per step, kept per batch size, each segment's
     * metadata in one upload); default true. Not with a layer callback, nor
     * for MoE models (routing reads the router's logits on the host
     * mid-step). */
    bool step_graphs;
    hpd_engine_logits_cb_t logits_cb;
    void *logits_cb_arg;
    hpd_engine_layer_cb_t layer_cb;
    void *layer_cb_arg;
    /* When set and the backend's memory is host memory: allocates the page
     * pool and the slot pool (e.g. through UCX, in shared memory that peers
     * on this host map: decode nodes), every rank's at tensor parallelism. The
     * memory must outlive the engine. */
    hpd_status_t (*pool_alloc)(void *arg, size_t bytes, void **memory_p);
    void *pool_alloc_arg;
    /* Tensor parallelism (docs/tensor_parallel.md): with a model that is
     * rank 0 of tp > 1 (hpd_model_load_tp), rank r runs tp_models[r] on
     * tp_backends[r] (tp entries each; [0] is model and backend). The
     * engine is then every rank: its calls are repeated on the others and
     * a step runs them together, one thread each; what the engine answers
     * is rank 0's. Host-memory backends only (CPU ranks): the ranks read
     * each other's buffers. The callbacks run on rank 0 only. */
    const hpd_model_t *const *tp_models;
    hpd_backend_t *const *tp_backends;
    /* The tokenizer's vocabulary (grammar/grammar.h), for requests with a
     * grammar; borrowed, must outlive the engine. NULL: such requests are
     * refused. */
    const hpd_vocab_t *vocab;
} hpd_engine_params_t;

/* Fills params with the defaults (model and backend left NULL). */
void hpd_engine_params_init(hpd_engine_params_t *params);

typedef struct {
    const int32_t *prompt; /* copied */
    uint32_t n_prompt;
    uint32_t max_tokens;
    hpd_sampling_t sampling;
    /* Tokens already generated elsewhere (failover replay): fed as decode
     * steps instead of being sampled; copied. At most max_tokens. */
    const int32_t *replay;
    uint32_t n_replay;
    /* Generation stops after a token of stop_ids (copied; at most
     * HPD_MAX_STOP_IDS), or of the model's end-of-sequence ids unless
     * ignore_eos, once at least min_tokens (<= max_tokens) tokens are out;
     * else after max_tokens. The stop token is the last one returned. */
    const int32_t *stop_ids;
    uint32_t n_stop;
    bool ignore_eos;
    uint32_t min_tokens;
    /* Each generated token's log probability, and the top_logprobs (at
     * most HPD_MAX_TOP_LOGPROBS) most likely tokens' (common/logprobs.h),
     * from the logits the sampler saw (hpd_engine_logprobs) */
    bool logprobs;
    uint32_t top_logprobs;
    /* The prompt's log probabilities too (each prompt token's given the
     * ones before it, with top_logprobs top ones: hpd_engine_prompt_logprobs).
     * Such a request takes no prefix-cache hit (its rows are computed). */
    bool prompt_logprobs;
    /* Structured output (docs/structured_outputs.md): every token sampled is
     * one the grammar allows (the others' logits are -inf before sampling;
     * logprobs are of the logits before that), and once its document is
     * whole only an end token (the model's end-of-sequence ids unless
     * ignore_eos, and stop_ids) is. Replayed tokens and a reserved
     * request's first token are fed to it too. The engine takes a reference
     * (hpd_grammar_retain) for the request's life. NULL: none. */
    hpd_grammar_t *grammar;
    /* Choices (0 or 1: one): n answers from one prefill. Once the prompt is
     * computed, choice c > 0 (seed + c for its sampling) is a request of its
     * own that shares the prompt's full KV pages by reference, holds a copy
     * of the partly filled last one and of the GDN state, and draws its
     * first token from the same logits; it equals a single request with
     * that seed. hpd_engine_choices gives their ids. Not with replay. A
 * choice that ends at its first token (max_tokens 1) takes no pages or
 * state. Reserved: see hpd_engine_start_choices. */
    uint32_t n;
} hpd_request_params_t;

#define HPD_MAX_STOP_IDS 64

/* Why a finished request ended. */
typedef enum {
    HPD_FINISH_NONE = 0, /* not finished (or failed, canceled) */
    HPD_FINISH_STOP,     /* a stop or end-of-sequence token */
    HPD_FINISH_LENGTH,   /* max_tokens */
} hpd_finish_reason_t;

/* The ids of a request's choices (params.n): its own first, then the
 * others' once its first token came (*n_p 1 before). Released with it. */
hpd_status_t hpd_engine_choices(const hpd_engine_t *engine, uint64_t id, const uint64_t **ids_p,
                                uint32_t *n_p);

/* "stop", "length" or "" (none). */
const char *hpd_finish_reason_name(hpd_finish_reason_t reason);

typedef enum {
    HPD_REQ_WAITING = 0,
    HPD_REQ_RUNNING = 1,
    HPD_REQ_FINISHED = 2,
    HPD_REQ_FAILED = 3,
    HPD_REQ_RESERVED = 4, /* holds its pages and slot; runs once started */
} hpd_request_state_t;

/* What an engine with these params would allocate for its pools (params
 * resolved as hpd_engine_create resolves them; the model's weights are not
 * counted), without allocating: for `hpdctl check` and for a node to refuse
 * at start what the host cannot hold. */
typedef struct {
    uint32_t n_pages, n_slots, n_checkpoints, max_context;
    uint64_t kv_pool_bytes, slot_pool_bytes, checkpoint_bytes, host_cache_bytes;
    uint64_t device_bytes; /* kv + slots + checkpoints */
} hpd_engine_plan_t;

/* HPD_ERR_INVALID_ARG with why naming the value and what is allowed (a pack
 * size above the model's full-attention layers, a prefill chunk that is not
 * a multiple of 64, ...). */
hpd_status_t hpd_engine_plan(const hpd_engine_params_t *params, const hpd_model_config_t *config,
                             hpd_engine_plan_t *plan_p, char *why, size_t why_len);

hpd_status_t hpd_engine_create(const hpd_engine_params_t *params, hpd_engine_t **engine_p);

/* Frees every request and pool. Accepts NULL. */
void hpd_engine_destroy(hpd_engine_t *engine);

/* Queues a request. A bad request (empty prompt, a token id >= vocab, a
 * prompt + max_tokens longer than max_context, bad sampling values) is logged
 * with the value and what was allowed and answered HPD_ERR_INVALID_ARG;
 * nothing else is affected. */
hpd_status_t hpd_engine_submit(hpd_engine_t *engine, const hpd_request_params_t *params,
                               uint64_t *id_p);

/* Runs one step: admits waiting requests, then one forward pass over a chunk
 * of every prefilling request and one token of every decoding request.
 * *n_active_p (may be NULL) gets the number of unfinished requests. */
hpd_status_t hpd_engine_step(hpd_engine_t *engine, uint32_t *n_active_p);

/* Steps until every submitted request has finished or failed. */
hpd_status_t hpd_engine_run(hpd_engine_t *engine);

/* The tokens generated so far (valid until the next step or release). */
hpd_status_t hpd_engine_result(hpd_engine_t *engine, uint64_t id, const int32_t **tokens_p,
                               uint32_t *n_p, hpd_request_state_t *state_p);

/* Stops a request and frees its pages and slot; its tokens stay readable. */
hpd_status_t hpd_engine_cancel(hpd_engine_t *engine, uint64_t id);

/* Forgets a request (cancelling it first if it still runs). */
void hpd_engine_release(hpd_engine_t *engine, uint64_t id);

/* Pages and slots in use, for leak checks and status. */
void hpd_engine_usage(const hpd_engine_t *engine, uint32_t *pages_used_p, uint32_t *pages_total_p,
                      uint32_t *slots_used_p, uint32_t *slots_total_p);

/* The log probabilities of a request's tokens so far (it asked for them:
 * else HPD_ERR_NOT_FOUND): lp[i] is token i's; a token the engine did not
 * sample (a decode side's first token, from the prefill side) has a NaN
 * logprob and no top. Valid until the next step or release. */
hpd_status_t hpd_engine_logprobs(const hpd_engine_t *engine, uint64_t id,
                                 const hpd_token_logprobs_t **lp_p, uint32_t *n_p);

/* The log probabilities of a request's prompt tokens 1 .. n_prompt - 1
 * (prompt_logprobs; *n_p is n_prompt - 1 once its prefill is done, else
 * 0): lp[i] is prompt token i + 1's. HPD_ERR_NOT_FOUND when not asked. */
hpd_status_t hpd_engine_prompt_logprobs(const hpd_engine_t *engine, uint64_t id,
                                        const hpd_token_logprobs_t **lp_p, uint32_t *n_p);

/* What the prefix cache gave a request. */
typedef struct {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;      /* tokens not computed thanks to the prefix cache */
    uint32_t cached_host_tokens; /* of which came from the host tier */
    hpd_finish_reason_t finish_reason;
} hpd_request_info_t;

hpd_status_t hpd_engine_request_info(const hpd_engine_t *engine, uint64_t id,
                                     hpd_request_info_t *info_p);

/* The prefix cache's counters; HPD_ERR_NOT_FOUND when the cache is off. */
hpd_status_t hpd_engine_cache_stats(const hpd_engine_t *engine,
                                    hpd_prefix_cache_stats_t *stats_p);

/* Checks every page's refcount against the references the prefix cache and
 * the unfinished requests hold, and the live slots against the unfinished
 * requests. Returns the number of mismatches (0 when nothing leaked). */
uint32_t hpd_engine_audit(const hpd_engine_t *engine);

/* ------------------------------------------------- disaggregated serving */

/* Decode side: records a request and takes, now or never, a zeroed GDN slot
 * and the KV pages for prompt + max_tokens tokens; the request does not run
 * until hpd_engine_start. Its state and prompt KV are written by a peer into
 * the pages and slot (hpd_engine_request_kv). HPD_ERR_NO_RESOURCE when the
 * pools lack room (nothing is held then), HPD_ERR_INVALID_ARG for a bad
 * request. Needs an engine without the prefix cache. Cancel frees it.
 * Tensor parallelism: every rank reserves the same page ids and slot (in
 * its own pools: hpd_engine_rank), checked here (HPD_ERR_INTERNAL, nothing
 * held, when they differ). */
hpd_status_t hpd_engine_reserve(hpd_engine_t *engine, const hpd_request_params_t *params,
                                uint64_t *id_p);

/* Starts a reserved request whose prompt has been computed elsewhere: it
 * joins the batch in its decode phase with first_token (sampled by the
 * prefill side) as its first output token. */
hpd_status_t hpd_engine_start(hpd_engine_t *engine, uint64_t id, int32_t first_token);

/* The same for a request of n choices (params.n; n is 1 without): choice c
 * starts with first[c]. A reservation of several choices takes, for each
 * choice past the first, its own pages (those past the prompt's full
 * blocks) and GDN slot at once; at the start each shares the prompt's full
 * pages by reference and copies the page the prompt ends in and the GDN
 * state the peer wrote (hpd_engine_choices gives their ids). Canceling
 * the reservation cancels its choices. */
hpd_status_t hpd_engine_start_choices(hpd_engine_t *engine, uint64_t id, const int32_t *first,
                                      uint32_t n);

#define HPD_ENGINE_MAX_GROUPS 256

/* Where a running or reserved request's KV and GDN state live. */
typedef struct {
    const uint32_t *tables[HPD_ENGINE_MAX_GROUPS]; /* page ids per pack group */
    uint32_t n_groups, n_blocks;
    void *state;   /* the request's GDN slot (backend memory); NULL without GDN layers */
    uint32_t slot;
} hpd_engine_kv_t;

hpd_status_t hpd_engine_request_kv(const hpd_engine_t *engine, uint64_t id, hpd_engine_kv_t *kv_p);

/* The pools' memory, for a transport to map once. */
typedef struct {
    const hpd_kv_layout_t *layout;
    void *kv_pool; /* page p at kv_pool + p * page_bytes */
    uint64_t kv_pool_bytes;
    void *slot_pool; /* slot s at slot_pool + s * slot_bytes; slot 0 is PAD */
    uint64_t slot_pool_bytes, slot_bytes;
    uint64_t layer_state_bytes; /* GDN layer i's state at i * layer_state_bytes in a slot */
} hpd_engine_memory_t;

void hpd_engine_memory(const hpd_engine_t *engine, hpd_engine_memory_t *memory_p);

/* Tensor parallelism: the degree (1 without), and rank `rank`'s engine (0:
 * engine itself; NULL past the degree), for what is per rank: its pools
 * (hpd_engine_memory: its layout holds its KV heads, its slots its GDN
 * heads) and a request's KV and state in them (hpd_engine_request_kv: the
 * page ids and slot are every rank's, the state pointer the rank's). Only
 * those two may be called on a rank past 0. */
uint32_t hpd_engine_tp(const hpd_engine_t *engine);
const hpd_engine_t *hpd_engine_rank(const hpd_engine_t *engine, uint32_t rank);

/* Replaces the layer callback (for owners created before the engine). */
void hpd_engine_set_layer_cb(hpd_engine_t *engine, hpd_engine_layer_cb_t cb, void *arg);

/* The prefix cache's summary for routers (hpd_prefix_cache_summary); all
 * zero when the cache is off. Returns the number of keys. */
uint32_t hpd_engine_prefix_summary(const hpd_engine_t *engine, uint8_t *summary, size_t bytes);

/* Counters since create. */
typedef struct {
    uint64_t steps;
    uint64_t prefill_tokens;
    uint64_t decode_tokens;
    double prefill_seconds; /* time in steps that had prefill rows */
    double decode_seconds;  /* time in steps that had only decode rows */
    uint64_t decode_steps;  /* steps that had only decode rows */
    uint64_t graph_steps;   /* steps recorded and run as graphs (step_graphs) */
    /* tensor parallelism: rank 0's time at the ranks' meetings (from
     * publishing its part to the barrier after the cross-rank sum or
     * gather: waiting for the others included), in prefill and in
     * decode-only steps */
    double tp_prefill_seconds, tp_decode_seconds;
} hpd_engine_stats_t;

void hpd_engine_stats(const hpd_engine_t *engine, hpd_engine_stats_t *stats_p);

/* The effective parameters (defaults resolved). */
const hpd_engine_params_t *hpd_engine_params(const hpd_engine_t *engine);

#endif
