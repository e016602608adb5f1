/* What the engine's files share (engine/engine.c: the lifecycle and the
 * queries; engine/scheduler.c: requests, admission, batches and the step;
 * engine/forward.c: the forward pass of the hybrid model family). Not a
 * public header: nothing outside engine/ includes it. */
#ifndef HPD_ENGINE_INTERNAL_H
#define HPD_ENGINE_INTERNAL_H

#include "engine/engine.h"

#include "cache/page_pool.h"
#include "cache/slot_pool.h"
#include "engine/tp.h"
#include "model/shard.h"

/* a page table entry that holds no page (yet) */
#define NO_PAGE UINT32_MAX

typedef struct {
    uint64_t id;
    hpd_request_state_t state;
    int32_t *prompt;
    uint32_t n_prompt;
    uint32_t max_tokens;
    hpd_sampling_t sampling;
    int32_t *replay;
    uint32_t n_replay;
    int32_t *stop_ids; /* [n_stop] */
    uint32_t n_stop;
    bool ignore_eos;
    uint32_t min_tokens;
    hpd_finish_reason_t finish_reason;
    int32_t *out; /* [max_tokens] */
    uint32_t n_out;
    hpd_token_logprobs_t *lp; /* [max_tokens] when asked for (rank 0 fills it) */
    uint32_t top_logprobs;
    hpd_token_logprobs_t *plp; /* [n_prompt - 1]: prompt tokens 1.. (prompt_logprobs) */
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
    /* structured output: the grammar, its matcher, the tokens that end the
     * document, the row's logits before the mask (for logprobs) */
    hpd_grammar_t *grammar;
    hpd_matcher_t *matcher;
    int32_t end_ids[HPD_MAX_STOP_IDS + 16];
    uint32_t n_end;
    float *raw;
    bool grammar_failed; /* a token the grammar refuses came (a replay) */
    bool grammar_waits;  /* for the grammar's after token: no mask until it came */
    bool raw_fresh;      /* raw holds this step's row (it was masked) */
    /* choices (params.n): ids[0] is this request's, the others its
     * choices' once forked; batch places held for them until then */
    uint32_t n_choices, n_forked, held;
    uint64_t choice_ids[HPD_MAX_CHOICES];
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
    uint32_t *grammar_mask; /* a row's allowed tokens (structured outputs) */
    /* mixture of experts, S = R * top_k slots (a token's row per expert it
     * routes to, grouped by expert): backend memory */
    float *moe_x, *moe_gu, *moe_act, *moe_out, *moe_shared;
    /* the routing (moe_route), backend memory too: each token's experts
     * (ascending) and weights, its slots, each slot's token, each expert's
     * first slot */
    float *moe_w;
    uint32_t *moe_ids, *moe_slots, *moe_idx, *moe_first;
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
    uint32_t *logit_rows; /* batch row of each logits row ([R]: sampled ones, then prompt ones) */
    batch_item_t **logit_items;
    request_t **plp_reqs; /* [R] prompt logprob rows: the request, and the position */
    uint32_t *plp_pos;    /* whose logits they are (they give token pos + 1's) */
    uint32_t *plp_rows;   /* and their batch rows */
    hpd_engine_step_item_t *step_items;

    hpd_engine_stats_t stats;

    /* tensor parallelism (engine/tp.h): this engine is rank `rank` of tp;
     * rank 0 owns the others and their workers (peers[r], workers[r], r >= 1) */
    uint32_t tp, rank;
    hpd_tp_group_t *group;
    bool owns_ranks; /* rank 0 of a TP engine once made: peers, workers, group */
    uint64_t tp_sig[2]; /* this step's batch, as the lockstep check shares it */
    hpd_engine_t *peers[HPD_TP_MAX];
    hpd_tp_worker_t *workers[HPD_TP_MAX];
    hpd_range_t vocab[HPD_TP_MAX]; /* each rank's embedding and LM head rows */
    /* the canonical sum of row-parallel products (forward.c rowpar):
     * this rank's subtree sum and two levels of scratch, max(R, S) x H */
    float *tp_part, *tp_scratch[2];
    double tp_meet_seconds; /* at the meetings since create (stats) */
    int32_t *emb_ids; /* the batch's tokens this rank embeds, within its rows, [R] */
};

typedef struct {
    uint32_t rows;
    uint32_t n_items, n_pre, n_dec, n_logits;
    /* rows whose logits give a prompt token's log probabilities (after the
     * n_logits sampled ones in logit_rows; plp_items, plp_pos) */
    uint32_t n_plp;
} batch_t;

/* The forward pass of one batch (engine/forward.c): embeddings, every
 * layer (GDN or gated attention, then the MLP; the layer callback after
 * each), and the logits of the rows that need them. */
hpd_status_t hpd_engine_forward(hpd_engine_t *e, const batch_t *bt);
/* The forward pass of a step, recorded whole and run as one where it can
 * (hpd_engine_params_t step_graphs), else hpd_engine_forward. */
hpd_status_t hpd_engine_forward_step(hpd_engine_t *e, const batch_t *bt);
/* TP: the ranks compare this step's batch (also an empty one) before any
 * computes with it; a difference (a bug) fails the step on every rank. */
hpd_status_t hpd_engine_tp_check(hpd_engine_t *e, const batch_t *bt);

/* Gives back a request's pages and slot (engine/scheduler.c). */
void hpd_engine_request_free_resources(hpd_engine_t *e, request_t *r);
/* Frees a request's memory (after its resources went back). */
void hpd_engine_request_destroy(request_t *r);

#endif
