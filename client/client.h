/* The client library: generate requests to a hpd coordinator, blocking or
 * streaming, several at once (docs/cluster.md). A client owns its event
 * loop; use it from one thread. */
#ifndef HPD_CLIENT_CLIENT_H
#define HPD_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/logprobs.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "transport/rpc.h"

typedef struct hpd_client hpd_client_t;

typedef struct {
    const char *host;     /* coordinator address; default 127.0.0.1 */
    uint16_t port;        /* default 7000 */
    /* or a leader and its standbys, "HOST:PORT,HOST:PORT,..." (host and
     * port are then not read): the client talks to the one that answers,
     * and after a lost connection to the next that does (a standby does
     * not listen until it leads; docs/operations.md) */
    const char *coordinators;
    const char *token;    /* shared secret or NULL */
    uint32_t timeout_ms;  /* per request, from submit to the last token; default 600000 */
    /* A request whose coordinator was lost (its connection closed, or it
     * stepped down) is submitted again, to whichever coordinator answers,
     * until resubmit_ms after its first submission: a generate is
     * idempotent, its tokens a function of its parameters (the seed
     * included, docs/determinism.md). Tokens already streamed are not
     * streamed again; a run that gave other ones ends the request with
     * HPD_ERR_INTERNAL. 0: 30000 with more than one coordinator, never with
     * one (the request then ends with HPD_ERR_IO); no_resubmit: never. */
    uint32_t resubmit_ms;
    bool no_resubmit;
} hpd_client_params_t;

typedef struct {
    const int32_t *prompt;
    uint32_t n_prompt;
    uint32_t max_tokens;
    /* fields set to hpd_sampling_unset()'s values are not sent: the model's
     * generation defaults apply (greedy where it has none or the cluster
     * runs with --no-generation-defaults) */
    hpd_sampling_t sampling;
    /* stop after a token of stop_ids, or of the model's end-of-sequence ids
     * unless ignore_eos, once min_tokens are out (engine/engine.h) */
    const int32_t *stop_ids;
    uint32_t n_stop;
    bool ignore_eos;
    uint32_t min_tokens;
    /* instead of prompt: text, or a chat of n_messages (roles[i]: system,
     * user or assistant; contents[i]), tokenized by the coordinator
     * (docs/api.md); thinking: 0 the model's default, 1 on, 2 off */
    const char *text;
    const char *const *roles, *const *contents;
    uint32_t n_messages, thinking;
    /* the answer as text too (result.text; streamed: on_text), ending
     * before the first of the stop strings */
    bool detokenize;
    const char *const *stops;
    uint32_t n_stops;
    void (*on_text)(void *text_arg, uint64_t handle, const char *piece, size_t len);
    void *text_arg;
    /* each token's log probability and its top_logprobs (<= 20) most likely
     * tokens' (result.logprobs) */
    bool logprobs;
    uint32_t top_logprobs;
    bool prompt_logprobs; /* the prompt's too (result.prompt_logprobs) */
    /* a structured output: {"json_schema": SCHEMA} or {"json_object": true}
     * (docs/structured_outputs.md); NULL: none */
    const char *grammar;
    /* a chat's tools (docs/api.md, "Tool calls"): OpenAI's tools array and
     * tool_choice ("\"required\"", or {"type": "function", ...}) as JSON
     * text; single_tool_call: parallel_tool_calls false. The calls come in
     * result.tool_calls. NULL: none. */
    const char *tools, *tool_choice;
    bool single_tool_call;
    /* choices: n answers from one prefill (choice c: the seed + c); 0 or 1:
     * one. The result's fields are choice 0's, the others in result.more;
     * on_token and on_text stream choice 0's. */
    uint32_t n;
} hpd_generate_params_t;

/* One more answer of a request of n choices. */
typedef struct {
    int32_t *tokens; /* malloc'd */
    uint32_t n_tokens;
    char finish_reason[16]; /* "stop", "length" or "tool_calls" */
    char *text, *reasoning, *tool_calls; /* as the result's (malloc'd or NULL) */
    size_t text_len;
    hpd_token_logprobs_t *logprobs; /* asked for: n_tokens of them (malloc'd) */
} hpd_generate_choice_t;

typedef struct {
    hpd_status_t status;   /* HPD_OK, or why not (HPD_ERR_INVALID_ARG: the request was refused
                              as malformed; HPD_ERR_NO_RESOURCE: overloaded; HPD_ERR_CANCELED;
                              HPD_ERR_TIMEOUT; HPD_ERR_IO: connection lost; HPD_ERR_INTERNAL) */
    char error[256];       /* the coordinator's message when status is not HPD_OK */
    int32_t *tokens;       /* malloc'd */
    uint32_t n_tokens;
    uint32_t prompt_tokens, cached_tokens, attempts;
    uint32_t resubmits;    /* times this client submitted it again (a lost coordinator) */
    char finish_reason[16];   /* "stop" (a stop or end-of-sequence token), "length", or
                                 "tool_calls" (a chat with tools that called one) */
    char *text;               /* detokenize: the answer (malloc'd, NUL-terminated) */
    char *reasoning;          /* a thinking model's chat: its reasoning apart (or NULL) */
    char *tool_calls;         /* a chat with tools: its calls, OpenAI's JSON array (or NULL) */
    hpd_token_logprobs_t *logprobs; /* asked for: n_tokens of them (malloc'd) */
    hpd_token_logprobs_t *prompt_logprobs; /* prompt tokens 1..: prompt_tokens - 1 of them */
    size_t text_len;
    double ttft_ms, total_ms; /* measured by the coordinator */
    double prefill_ms;        /* the prefill node's compute (last attempt) */
    double push_ms;           /* its transfer, first put to completion */
    double exposed_push_ms;   /* the part of the transfer after the compute ended */
    double client_ttft_ms, client_total_ms; /* measured here (first streamed token) */
    hpd_generate_choice_t *more; /* n > 1: choices 1 .. n - 1 (malloc'd, n_more of them) */
    uint32_t n_more;
} hpd_generate_result_t;

/* Streamed tokens: ids are the tokens from position index on. */
typedef void (*hpd_client_token_cb_t)(void *arg, uint64_t handle, uint32_t index,
                                      const int32_t *ids, uint32_t n);
/* The end of a request; result is valid during the call (take ownership of
 * result->tokens, text, logprobs, prompt_logprobs or more by setting it to
 * NULL). */
typedef void (*hpd_client_done_cb_t)(void *arg, uint64_t handle, hpd_generate_result_t *result);

/* Connects and authenticates (HPD_ERR_IO: unreachable; HPD_ERR_INVALID_ARG:
 * token refused). */
hpd_status_t hpd_client_create(const hpd_client_params_t *params, hpd_client_t **client_p);

/* Closes the connection: the coordinator cancels every request still open.
 * Pending done callbacks run with HPD_ERR_CANCELED. Accepts NULL. */
void hpd_client_destroy(hpd_client_t *client);

/* Sends a request; on_token (may be NULL: no streaming) runs as tokens
 * arrive and on_done once, from hpd_client_run*. When the connection to
 * the coordinator is lost, the requests in flight are submitted again as
 * params.resubmit_ms says, or end with HPD_ERR_IO and an error saying they
 * may be submitted again; the next submit or status connects again
 * (status is also retried once on a new connection). */
hpd_status_t hpd_client_submit(hpd_client_t *client, const hpd_generate_params_t *params,
                               hpd_client_token_cb_t on_token, hpd_client_done_cb_t on_done,
                               void *arg, uint64_t *handle_p);

/* Asks the coordinator to cancel a request (its done callback then runs
 * with HPD_ERR_CANCELED). */
hpd_status_t hpd_client_cancel(hpd_client_t *client, uint64_t handle);

/* Runs the loop until no request is pending. */
hpd_status_t hpd_client_run(hpd_client_t *client);
/* Runs the loop once, waiting at most timeout_ms for something to happen. */
void hpd_client_poll(hpd_client_t *client, uint32_t timeout_ms);
uint32_t hpd_client_pending(const hpd_client_t *client);

/* The blocking form: submits, runs until done and fills *result (free with
 * hpd_generate_result_free). on_token may be NULL. Returns result->status. */
hpd_status_t hpd_client_generate(hpd_client_t *client, const hpd_generate_params_t *params,
                                 hpd_client_token_cb_t on_token, void *arg,
                                 hpd_generate_result_t *result);
void hpd_generate_result_free(hpd_generate_result_t *result);

/* The coordinator's status (nodes, load, pools, cache counters, request
 * counts) as a msgpack map in result->result. */
hpd_status_t hpd_client_status(hpd_client_t *client, hpd_rpc_result_t *result);

#endif
