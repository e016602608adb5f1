/* The coordinator as a library: the node registry, routing, the requests'
 * state machines (coordinator/request.h), token streaming, cancellation and
 * failover (docs/cluster.md). One context per coordinator, on the caller's
 * event loop; hpd-coordinator (coordinator/main.c) is its options and the
 * service shell around it. */
#ifndef HPD_COORDINATOR_COORDINATOR_H
#define HPD_COORDINATOR_COORDINATOR_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/logprobs.h"

#include "common/metrics.h"
#include "common/sampling.h"
#include "common/status.h"

typedef struct hpd_coord hpd_coord_t;

typedef struct {
    const char *host;
    uint16_t port;                /* 0: any free port */
    const char *token_file;       /* NULL: an open coordinator */
    const char *client_keys_file; /* NULL: no client keys (the node secret is never one) */
    uint32_t heartbeat_ms, lease_ms;
    uint32_t liveness_ms; /* a node whose pinger is silent this long is lost; 0: off */
    uint32_t max_requests;
    uint32_t queue_timeout_ms;
    uint32_t max_attempts;
    uint32_t max_connections; /* 0: the RPC server's default */
    /* a request without temperature / top_p / top_k samples greedily instead
     * of with the model's generation defaults (which the nodes apply) */
    bool no_generation_defaults;
    /* a chat's thinking where its request does not say: 0 the model's
     * default, 1 on, 2 off (generate's thinking) */
    uint32_t default_thinking;
    /* the model directory: its tokenizer.json and chat template make requests
     * as text and chats possible (coordinator/text.h); NULL: token ids only */
    const char *model_dir;
    /* a coordinator elected through etcd (coordinator/election.h): whether
     * it still leads; while it does not, it takes no registration and no
     * request (NULL: always) */
    bool (*leading)(void *arg);
    void *leading_arg;
    /* a front door (coordinator/door.h): "HOST:PORT[,HOST:PORT...]", the
     * scheduler (a leader and its standbys) its requests go to; its doors
     * stay here (tokenization, detokenization, stop strings, streaming) and
     * decode nodes stream the tokens to it. NULL: the whole coordinator */
    const char *scheduler;
    /* a front door: the host decode nodes reach it at (NULL: host) */
    const char *advertise;
} hpd_coord_opts_t;

/* Listens and serves from base. On an error, err says what (a credentials
 * file that does not load, a port taken). */
hpd_status_t hpd_coord_create(struct event_base *base, const hpd_coord_opts_t *opts,
                              hpd_coord_t **coord_p, char *err, size_t err_len);
/* Answers every open request with "coordinator shutting down" and frees
 * all. */
void hpd_coord_destroy(hpd_coord_t *coord);

uint16_t hpd_coord_port(const hpd_coord_t *coord);
/* The prompt's log probabilities of a request that asked for them, once its
 * prefill answered (prompt tokens 1.., prompt_tokens - 1 of them); NULL
 * before, or for an unknown request. For a sink's first tokens. */
const hpd_token_logprobs_t *hpd_coord_prompt_logprobs(const hpd_coord_t *coord,
                                                      uint64_t request);
/* A chat's enable_thinking where its request does not say (the HTTP
 * door's too): 1 on, 0 off, -1 the model's default (opts.default_thinking) */
int hpd_coord_default_thinking(const hpd_coord_t *coord);
/* The model's tokenizer and chat format (NULL without opts.model_dir). */
struct hpd_text;
const struct hpd_text *hpd_coord_text(const hpd_coord_t *coord);
/* The coordinator's metrics (docs/operations.md), for the service shell. */
hpd_metrics_t *hpd_coord_metrics(hpd_coord_t *coord);
/* ------------------------------------------------------------ requests
 * A request submitted from inside the process: the msgpack clients'
 * generate goes this way, and so does the HTTP front door
 * (coordinator/openai.h). */
typedef struct {
    const int32_t *prompt; /* copied */
    uint32_t n_prompt, max_tokens;
    /* NAN temperature / top_p, HPD_TOP_K_UNSET: the model's
     * generation_config.json values (greedy with no_generation_defaults) */
    hpd_sampling_t sampling;
    const int32_t *stop_ids; /* copied */
    uint32_t n_stop, min_tokens;
    bool ignore_eos;
    const char *who; /* who sent it, for the log ("tenant NAME"; NULL: nobody named) */
    bool stream;     /* its client streams (for the log) */
    /* a msgpack client's connection and its tag for the request: its
     * cancel by tag and its close find the request (NULL: none) */
    const void *owner;
    uint64_t tag;
    /* each token's log probability and its top_logprobs (<= 20) most
     * likely tokens' (common/logprobs.h) */
    bool logprobs;
    uint32_t top_logprobs;
    /* the prompt's too: tokens 1 .. n_prompt - 1, each given those before */
    bool prompt_logprobs;
    /* a structured output: hpd_grammar_from_spec's JSON (copied; checked
     * here, compiled by the nodes); NULL: none */
    const char *grammar;
    size_t grammar_len;
    /* the prompt opened a thinking model's think block: the document starts
     * after its </think> (the reasoning before it is free) */
    bool grammar_after_think;
    /* choices: n answers from one prefill (choice c: the seed + c), each
     * streamed and ended apart (the sink's choice index); 0 or 1: one. At
     * most HPD_MAX_CHOICES. */
    uint32_t n;
    /* a remote front door's request (its owner the door's connection, tag
     * its id there): "HOST:PORT" where the decode node streams the tokens
     * after the first; the sink then hears only the first tokens and the
     * end. NULL: every token comes through here */
    const char *door;
} hpd_coord_request_t;

typedef enum {
    HPD_COORD_FINISHED, /* all its tokens came (or the sink stopped it: "stop") */
    HPD_COORD_FAILED,   /* code and error say why */
    HPD_COORD_CANCELED, /* hpd_coord_cancel, or its client went away */
} hpd_coord_outcome_t;

/* One choice's answer. */
typedef struct {
    const int32_t *tokens;
    const hpd_token_logprobs_t *logprobs; /* [n_tokens] when asked for; else NULL */
    uint32_t n_tokens;
    const char *finish_reason; /* FINISHED: "stop" or "length" */
} hpd_coord_choice_t;

typedef struct {
    hpd_coord_outcome_t outcome;
    int64_t code;      /* FAILED: the RPC error code (transport/rpc.h) */
    const char *error; /* FAILED, CANCELED: why */
    uint64_t request;
    const int32_t *tokens;
    const hpd_token_logprobs_t *logprobs; /* [n_tokens] when asked for; else NULL */
    const hpd_token_logprobs_t *prompt_logprobs; /* [prompt_tokens - 1] when asked for */
    uint32_t n_tokens, top_logprobs;
    const char *finish_reason; /* FINISHED: "stop" or "length" */
    uint32_t prompt_tokens, cached_tokens, attempts;
    float ttft_ms, total_ms, prefill_ms, push_ms, exposed_push_ms;
    /* every choice (the fields above are choice 0's) */
    const hpd_coord_choice_t *choices;
    uint32_t n_choices;
} hpd_coord_result_t;

/* Where a request's tokens and its end go. Neither callback may cancel
 * its own request (hpd_coord_cancel): tokens ends it by returning false,
 * and done comes at its end. */
typedef struct {
    /* choice k's tokens[from, n) are new (in order; a failover's replay is
     * not repeated), with their logprobs[from, n) when asked for (else
     * NULL). Returning false ends the choice here (a stop string) with its
     * first *keep_p tokens (from < *keep_p <= n): it finishes as "stop",
     * and once every choice has ended the nodes free what they hold. NULL:
     * only the end is wanted. */
    bool (*tokens)(void *arg, uint32_t k, const int32_t *tokens,
                   const hpd_token_logprobs_t *logprobs, uint32_t from, uint32_t n,
                   uint32_t *keep_p);
    /* the end, exactly once; the request is gone when it returns */
    void (*done)(void *arg, const hpd_coord_result_t *res);
    void *arg;
} hpd_coord_sink_t;

/* Admits and queues a request. Returns 0 with *id_p set; the sink hears
 * the rest. Else the RPC error code (HPD_RPC_ERR_PARAMS: invalid,
 * HPD_RPC_ERR_OVERLOADED: no room, no nodes or draining) with why in err;
 * the sink is not called. */
int64_t hpd_coord_submit(hpd_coord_t *coord, const hpd_coord_request_t *req,
                         const hpd_coord_sink_t *sink, uint64_t *id_p, char *err,
                         size_t err_len);
/* Cancels a request on every node: its sink's done (CANCELED, why) comes
 * before this returns. False: no such request (it ended). */
bool hpd_coord_cancel(hpd_coord_t *coord, uint64_t id, const char *why);
/* Cancels the request its owner (hpd_coord_request_t) tagged so; false:
 * none open. */
bool hpd_coord_cancel_tagged(hpd_coord_t *coord, const void *owner, uint64_t tag,
                             const char *why);
/* Ends choice k of the request its owner tagged so, as a sink's stop
 * would (a remote front door's stop string); false: none open. */
bool hpd_coord_stop_tagged(hpd_coord_t *coord, const void *owner, uint64_t tag, uint32_t k);
/* Cancels every request of owner (its connection closed). */
void hpd_coord_cancel_owned(hpd_coord_t *coord, const void *owner, const char *why);
/* Counts a request a front door refused as malformed
 * (hpd_requests_total{outcome="invalid"}). */
void hpd_coord_count_invalid(hpd_coord_t *coord);
bool hpd_coord_draining(const hpd_coord_t *coord);
/* The roles (coordinator/credentials.h) a presented client key or node
 * secret grants, as the RPC server checks them (all on an open
 * coordinator); who names it (the tenant). Read at each call, so a key
 * removed by a reload is refused from then on. */
uint32_t hpd_coord_authenticate(hpd_coord_t *coord, const char *token, size_t len, char *who,
                                size_t who_len, uint64_t *credential_p);
/* Whether the credential (from hpd_coord_authenticate) still grants role:
 * after a reload a revoked key does not (always true on an open
 * coordinator). */
bool hpd_coord_grants(const hpd_coord_t *coord, uint64_t credential, uint32_t role);
/* The smallest vocabulary and the largest context of the usable nodes (0
 * while none is registered). */
void hpd_coord_limits(const hpd_coord_t *coord, uint32_t *vocab_p, uint32_t *max_context_p);

/* Refreshes the gauges (before a scrape). */
void hpd_coord_collect(hpd_coord_t *coord);
/* /healthz: ready while not draining and not refusing connections. */
bool hpd_coord_health(hpd_coord_t *coord, char *msg, size_t len);

/* The drain: new requests are refused ("draining"); open ones go on. */
void hpd_coord_drain(hpd_coord_t *coord);
uint32_t hpd_coord_open_requests(const hpd_coord_t *coord);
/* The end of the drain: requests still open fail (the deadline passed);
 * with stop_nodes every node is told to shut down (the notices leave with
 * the next turns of the loop), else the nodes stay up and register again
 * with the next coordinator (a restart). */
void hpd_coord_end_drain(hpd_coord_t *coord, bool stop_nodes);
/* SIGHUP: the credentials are read again; connections of revoked
 * credentials close. A file that does not load keeps the old ones. */
void hpd_coord_reload(hpd_coord_t *coord);

#endif
