/* The single-process engine: a model, a kernel backend, a KV page pool and a
 * GDN slot pool; requests run with chunked prefill and one-token decode steps
 * in one continuous batch (docs/architecture.md). */
#ifndef HPD_ENGINE_ENGINE_H
#define HPD_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/kv_layout.h"
#include "cache/prefix_cache.h"
#include "kernels/backend.h"
#include "model/model.h"

typedef struct hpd_engine hpd_engine_t;

/* Called with the logits (host memory, vocab floats) computed for the token
 * at `position` of request `id`, before sampling. For tests and tools. */
typedef void (*hpd_engine_logits_cb_t)(void *arg, uint64_t id, uint32_t position,
                                       const float *logits, uint32_t vocab);

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
    hpd_engine_logits_cb_t logits_cb;
    void *logits_cb_arg;
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
} hpd_request_params_t;

typedef enum {
    HPD_REQ_WAITING = 0,
    HPD_REQ_RUNNING = 1,
    HPD_REQ_FINISHED = 2,
    HPD_REQ_FAILED = 3,
} hpd_request_state_t;

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

/* What the prefix cache gave a request. */
typedef struct {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;      /* tokens not computed thanks to the prefix cache */
    uint32_t cached_host_tokens; /* of which came from the host tier */
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

/* Counters since create. */
typedef struct {
    uint64_t steps;
    uint64_t prefill_tokens;
    uint64_t decode_tokens;
    double prefill_seconds; /* time in steps that had prefill rows */
    double decode_seconds;  /* time in steps that had only decode rows */
} hpd_engine_stats_t;

void hpd_engine_stats(const hpd_engine_t *engine, hpd_engine_stats_t *stats_p);

/* The effective parameters (defaults resolved). */
const hpd_engine_params_t *hpd_engine_params(const hpd_engine_t *engine);

#endif
