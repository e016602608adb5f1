#include "client/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "common/log.h"
#include "common/util.h"
#include "node/msg.h"
#include "node/proto.h"

#define LOG_COMPONENT "client"

typedef struct pending {
    hpd_client_t *client;
    uint64_t handle;
    hpd_client_token_cb_t on_token;
    hpd_client_done_cb_t on_done;
    void (*on_text)(void *arg, uint64_t handle, const char *piece, size_t len);
    void *text_arg;
    void *arg;
    double t_submit, t_first;
    uint32_t streamed; /* tokens delivered to on_token */
    uint32_t n_choices;
    bool detokenize; /* the answer's text is wanted (an empty one too) */
    /* submitted again after a lost coordinator: the generate as sent, the
     * tokens streamed (a later run must stream the same), the text bytes
     * streamed (a later run's first ones are not streamed again) */
    hpd_rpc_buf_t msg;
    int32_t *seen;
    size_t seen_cap;
    bool seen_lost;        /* no room to keep them: not submitted again */
    uint32_t sends, tries; /* sends: times sent; tries: to connect, failed */
    size_t text_streamed, text_skip;
    bool diverged;         /* a later run streamed other tokens */
    bool canceled;         /* asked to: not submitted again */
    struct event *retry;   /* waiting to be submitted again */
    struct pending *next;
} pending_t;

#define MAX_COORDINATORS 8
#define RESUBMIT_DEFAULT_MS 30000
#define RESUBMIT_FIRST_MS 50 /* the first wait; doubled up to RESUBMIT_MAX_MS */
#define RESUBMIT_MAX_MS 200 /* (a refused connection is cheap: a standby that leads is found soon) */

struct hpd_client {
    hpd_client_params_t p;
    struct event_base *base;
    hpd_rpc_client_t *rpc;
    hpd_rpc_client_params_t rp;
    hpd_endpoint_t coords[MAX_COORDINATORS]; /* copies: the client connects again later */
    uint32_t n_coords, at;                   /* at: the one connected to (or last tried) */
    uint32_t resubmit_ms;                    /* 0: never */
    char *token;
    pending_t *pending;
    uint32_t n_pending;
    uint64_t next_handle;
};

static pending_t *find(hpd_client_t *c, uint64_t handle)
{
    for (pending_t *q = c->pending; q != NULL; q = q->next)
        if (q->handle == handle)
            return q;
    return NULL;
}

/* New tokens of the stream to on_token (and kept, where the request may
 * be submitted again). */
static void stream_tokens(pending_t *q, const int32_t *ids, uint32_t n)
{
    if (q->t_first == 0)
        q->t_first = hpd_time_now();
    if (q->client->resubmit_ms > 0 && !q->seen_lost) {
        if (hpd_grow(&q->seen, &q->seen_cap, q->streamed + n, sizeof(*q->seen)) == HPD_OK)
            memcpy(q->seen + q->streamed, ids, n * sizeof(*ids));
        else
            q->seen_lost = true; /* a later run could not be checked */
    }
    if (q->on_token != NULL)
        q->on_token(q->arg, q->handle, q->streamed, ids, n);
    q->streamed += n;
}

static void on_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    hpd_client_t *c = arg;
    hpd_proto_err_t err;
    hpd_msg_stream_t m = {0};
    pending_t *q;

    if (!hpd_rpc_str_eq(msg->method, msg->method_len, "tokens"))
        return;
    if (!hpd_msg_unpack(&hpd_msg_stream, msg->params, &m, &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "bad tokens notification: %s", err.text);
        return;
    }
    if (m.choice != 0) { /* (choice 0 streams; the others come with the reply) */
        hpd_msg_free(&hpd_msg_stream, &m);
        return;
    }
    /* the coordinator sends every position once, in order; a run after a
     * resubmission sends again what an earlier one streamed */
    if ((q = find(c, m.tag)) != NULL && m.ids_n > 0 && m.index <= q->streamed && !q->diverged) {
        const uint32_t old = q->streamed - m.index < m.ids_n ? q->streamed - m.index : m.ids_n;
        if (old > 0 && (q->seen == NULL ||
                        memcmp(q->seen + m.index, m.ids, old * sizeof(*m.ids)) != 0))
            q->diverged = true;
        else if (old < m.ids_n)
            stream_tokens(q, m.ids + old, m.ids_n - old);
    }
    if (q != NULL && m.text_len > 0 && q->on_text != NULL && !q->diverged) {
        const size_t skip = q->text_skip < m.text_len ? q->text_skip : m.text_len;
        q->text_skip -= skip;
        q->text_streamed += m.text_len - skip;
        if (m.text_len > skip)
            q->on_text(q->text_arg, q->handle, m.text + skip, m.text_len - skip);
    }
    hpd_msg_free(&hpd_msg_stream, &m);
}

static void on_close(void *arg, hpd_status_t why)
{
    (void)arg;
    HPD_LOG_DEBUG(LOG_COMPONENT, "connection to the coordinator closed: %s",
                  hpd_status_str(why));
}

/* Connects to the coordinators from the one at `first` on, taking the
 * first that answers: with auth checked (sync, at the start) or not
 * (inside the loop). A refused token ends the search. */
static hpd_status_t connect_any(hpd_client_t *c, uint32_t first, bool sync)
{
    hpd_status_t st = HPD_ERR_IO;
    for (uint32_t k = 0; k < c->n_coords; k++) {
        const uint32_t i = (first + k) % c->n_coords;
        hpd_rpc_client_t *fresh;
        c->rp.host = c->coords[i].host;
        c->rp.port = c->coords[i].port;
        st = sync ? hpd_rpc_client_create(&c->rp, &fresh) : hpd_rpc_client_connect(&c->rp, &fresh);
        if (st == HPD_OK) {
            hpd_rpc_client_destroy(c->rpc);
            c->rpc = fresh;
            c->at = i;
            c->p.host = c->coords[i].host;
            c->p.port = c->coords[i].port;
            return HPD_OK;
        }
        if (st == HPD_ERR_INVALID_ARG)
            break;
    }
    return st;
}

hpd_status_t hpd_client_create(const hpd_client_params_t *params, hpd_client_t **client_p)
{
    hpd_client_t *c = calloc(1, sizeof(*c));
    hpd_status_t st;
    char why[160];

    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    c->p = *params;
    if (params->coordinators != NULL) {
        if (!hpd_proto_parse_endpoints(params->coordinators, c->coords, MAX_COORDINATORS,
                                       &c->n_coords, why, sizeof(why))) {
            HPD_LOG_ERROR(LOG_COMPONENT, "coordinators '%s': %s", params->coordinators, why);
            free(c);
            return HPD_ERR_INVALID_ARG;
        }
    } else {
        snprintf(c->coords[0].host, sizeof(c->coords[0].host), "%s",
                 params->host ? params->host : "127.0.0.1");
        c->coords[0].port = params->port ? params->port : 7000;
        c->n_coords = 1;
    }
    c->p.coordinators = NULL; /* (not kept) */
    c->resubmit_ms = params->no_resubmit        ? 0
                     : params->resubmit_ms > 0  ? params->resubmit_ms
                     : c->n_coords > 1          ? RESUBMIT_DEFAULT_MS
                                                : 0;
    if (params->token != NULL && (c->token = strdup(params->token)) == NULL) {
        free(c);
        return HPD_ERR_NO_MEMORY;
    }
    c->p.token = c->token;
    if (c->p.timeout_ms == 0)
        c->p.timeout_ms = 600000;
    c->next_handle = 1;
    if ((c->base = event_base_new()) == NULL) {
        free(c->token);
        free(c);
        return HPD_ERR_NO_MEMORY;
    }
    c->rp = (hpd_rpc_client_params_t){.base = c->base,
                                      .token = c->p.token,
                                      .timeout_ms = 10000,
                                      .on_notify = on_notify,
                                      .on_close = on_close,
                                      .arg = c};
    if ((st = connect_any(c, 0, true)) != HPD_OK) {
        event_base_free(c->base);
        free(c->token);
        free(c);
        return st;
    }
    *client_p = c;
    return HPD_OK;
}

static void drop(hpd_client_t *c, pending_t *q)
{
    for (pending_t **pp = &c->pending; *pp != NULL; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    c->n_pending--;
    if (q->retry != NULL)
        event_free(q->retry);
    hpd_rpc_buf_destroy(&q->msg);
    free(q->seen);
    free(q);
}

static void end_unsent(pending_t *q, hpd_status_t st, const char *why);

void hpd_client_destroy(hpd_client_t *c)
{
    if (c == NULL)
        return;
    /* the pending calls fail with HPD_ERR_CANCELED through on_reply; the
     * ones waiting to be submitted again end here */
    hpd_rpc_client_destroy(c->rpc);
    while (c->pending != NULL)
        end_unsent(c->pending, HPD_ERR_CANCELED, "canceled: the client was destroyed");
    event_base_free(c->base);
    free(c->token);
    free(c);
}

/* After the connection was lost (the coordinator restarted, or a failover
 * to a standby): connects again, to the next coordinator that answers
 * (the same one where there is one), without running the loop (this may
 * run inside a callback); the token goes first and the calls queue behind
 * it. */
static hpd_status_t ensure_connected(hpd_client_t *c)
{
    if (hpd_rpc_client_is_open(c->rpc))
        return HPD_OK;
    return connect_any(c, c->at + 1, false);
}

static hpd_status_t status_of_code(int64_t code)
{
    switch (code) {
    case HPD_RPC_ERR_PARAMS:
    case HPD_RPC_ERR_INVALID: return HPD_ERR_INVALID_ARG;
    case HPD_RPC_ERR_OVERLOADED: return HPD_ERR_NO_RESOURCE;
    case HPD_RPC_ERR_AUTH: return HPD_ERR_INVALID_ARG;
    default: return HPD_ERR_INTERNAL;
    }
}

static void free_more(hpd_generate_result_t *r)
{
    for (uint32_t k = 0; r->more != NULL && k < r->n_more; k++) {
        free(r->more[k].tokens);
        free(r->more[k].text);
        free(r->more[k].reasoning);
        free(r->more[k].tool_calls);
        free(r->more[k].logprobs);
    }
    free(r->more);
    r->more = NULL;
    r->n_more = 0;
}

static char *dup_bin(const void *data, uint32_t len)
{
    char *s = data != NULL ? malloc(len + 1) : NULL;
    if (s != NULL) {
        memcpy(s, data, len);
        s[len] = '\0';
    }
    return s;
}

/* n tokens' logprobs from their wire form into *lp_p (malloc'd); false
 * with why (NULL *lp_p: out of memory). */
static bool decode_lp(const void *wire, uint32_t len, uint32_t n, uint32_t top,
                      hpd_token_logprobs_t **lp_p, char *why, size_t why_len)
{
    return (*lp_p = malloc((n + 1) * sizeof(**lp_p))) != NULL &&
           hpd_logprobs_decode(wire, len, n, top, UINT32_MAX, *lp_p, why, why_len);
}

/* An answer's text (NUL-terminated, malloc'd): "" when it has none but is
 * wanted, NULL when neither. */
static char *answer_text(const void *text, uint32_t len, bool wanted)
{
    return text != NULL || wanted ? dup_bin(text != NULL ? text : "", len) : NULL;
}

/* The reply's choices 1 .. n - 1 into r->more; a reply without them (or
 * with others) is a bad reply. */
static void more_choices(const hpd_msg_generated_t *g, uint32_t n, bool q_detok,
                         hpd_generate_result_t *r)
{
    const msgpack_object *a = g->choices;
    char why[200] = "out of memory";
    if (a == NULL || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != n) {
        snprintf(why, sizeof(why), "expected %u choices", n);
        goto bad;
    }
    if ((r->more = calloc(n - 1, sizeof(*r->more))) == NULL)
        goto bad;
    r->n_more = n - 1;
    for (uint32_t k = 1; k < n; k++) {
        hpd_msg_choice_t m = {0};
        hpd_proto_err_t err;
        hpd_generate_choice_t *ch = &r->more[k - 1];
        if (!hpd_msg_unpack(&hpd_msg_choice, &a->via.array.ptr[k], &m, &err) || m.index != k) {
            snprintf(why, sizeof(why), "choice %u: %.180s", k,
                     m.index != k ? "out of order" : err.text);
            hpd_msg_free(&hpd_msg_choice, &m);
            goto bad;
        }
        ch->tokens = (int32_t *)m.tokens; /* ours now */
        ch->n_tokens = m.tokens_n;
        memcpy(ch->finish_reason, m.finish_reason, sizeof(ch->finish_reason));
        ch->text = answer_text(m.text, m.text_len, q_detok);
        ch->text_len = m.text_len;
        ch->reasoning = dup_bin(m.reasoning, m.reasoning_len);
        ch->tool_calls = dup_bin(m.tool_calls, m.tool_calls_len);
        if (m.logprobs != NULL && !decode_lp(m.logprobs, m.logprobs_len, ch->n_tokens,
                                             g->top_logprobs, &ch->logprobs, why, sizeof(why)))
            goto bad;
    }
    return;
bad:
    r->status = HPD_ERR_FORMAT;
    snprintf(r->error, sizeof(r->error), "bad reply: %s", why);
}

/* The end of a request: its done callback, then it is gone. */
static void finish(pending_t *q, hpd_generate_result_t *r)
{
    r->client_total_ms = (hpd_time_now() - q->t_submit) * 1e3;
    r->client_ttft_ms = q->t_first > 0 ? (q->t_first - q->t_submit) * 1e3 : 0;
    r->resubmits = q->sends > 1 ? q->sends - 1 : 0;
    if (q->on_done != NULL)
        q->on_done(q->arg, q->handle, r);
    hpd_generate_result_free(r);
    drop(q->client, q);
}

/* A request ended without a reply (canceled, or no coordinator took it
 * again in time). */
static void end_unsent(pending_t *q, hpd_status_t st, const char *why)
{
    hpd_generate_result_t r;
    memset(&r, 0, sizeof(r));
    r.status = st;
    snprintf(r.error, sizeof(r.error), "%s", why);
    finish(q, &r);
}

static void on_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply);

/* Submits the request again, on the connection there is or a new one; while
 * no coordinator answers, waits longer each time, until resubmit_ms after
 * the first submission. */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    pending_t *q = arg;
    hpd_client_t *c = q->client;
    if (ensure_connected(c) == HPD_OK &&
        hpd_rpc_call(c->rpc, "generate", &q->msg, c->p.timeout_ms, on_reply, q) == HPD_OK) {
        q->sends++;
        HPD_LOG_DEBUG(LOG_COMPONENT, "request %llu submitted again to %s:%u (%u tokens streamed)",
                      (unsigned long long)q->handle, c->p.host, c->p.port, q->streamed);
        return;
    }
    const double waited_ms = (hpd_time_now() - q->t_submit) * 1e3;
    if (waited_ms >= c->resubmit_ms) {
        char why[200];
        snprintf(why, sizeof(why), "the connection to the coordinator was lost and none of the "
                 "%u coordinators took the request again within %u ms", c->n_coords,
                 c->resubmit_ms);
        end_unsent(q, HPD_ERR_IO, why);
        return;
    }
    unsigned ms = RESUBMIT_FIRST_MS;
    for (uint32_t k = 0; k < q->tries && ms < RESUBMIT_MAX_MS; k++)
        ms *= 2;
    q->tries++;
    const struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(q->retry, &tv);
}

/* A reply that lost its coordinator (the connection, or the coordinator
 * stepped down) is submitted again where the client may. */
static bool resubmitted(pending_t *q, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_client_t *c = q->client;
    const bool lost = st == HPD_ERR_IO ||
                      (st == HPD_OK && reply->is_error && reply->error_code == HPD_RPC_ERR_NOT_LEADER);
    if (!lost || c->resubmit_ms == 0 || q->diverged || q->canceled || q->seen_lost ||
        (hpd_time_now() - q->t_submit) * 1e3 >= c->resubmit_ms)
        return false;
    if (q->retry == NULL && (q->retry = evtimer_new(c->base, on_retry, q)) == NULL)
        return false;
    q->text_skip = q->text_streamed; /* the next run's text starts again */
    const struct timeval tv = {0, RESUBMIT_FIRST_MS * 1000};
    evtimer_add(q->retry, &tv);
    return true;
}

static void on_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    pending_t *q = arg;
    hpd_generate_result_t r;
    hpd_msg_generated_t g = {0};
    hpd_proto_err_t err;

    if (resubmitted(q, st, reply))
        return;
    memset(&r, 0, sizeof(r));
    r.status = st;
    if (q->diverged) {
        r.status = HPD_ERR_INTERNAL;
        snprintf(r.error, sizeof(r.error), "the request, submitted again after its coordinator "
                 "was lost, streamed other tokens than its first run did (the cluster broke its "
                 "determinism: docs/determinism.md)");
    } else if (st == HPD_ERR_IO) {
        snprintf(r.error, sizeof(r.error), "the connection to the coordinator was lost before "
                 "the request finished (it may or may not have run); submitting it again is "
                 "safe");
    } else if (st != HPD_OK) {
        snprintf(r.error, sizeof(r.error), "%s", hpd_status_str(st));
    } else if (reply->is_error) {
        snprintf(r.error, sizeof(r.error), "%.*s", (int)reply->error_message_len,
                 reply->error_message);
        r.status = strcmp(r.error, "canceled") == 0 ? HPD_ERR_CANCELED
                                                    : status_of_code(reply->error_code);
    } else if (!hpd_msg_unpack(&hpd_msg_generated, reply->result, &g, &err)) {
        r.status = HPD_ERR_FORMAT;
        snprintf(r.error, sizeof(r.error), "bad reply: %.200s", err.text);
    } else {
        r.tokens = (int32_t *)g.tokens; /* the result owns them now */
        r.n_tokens = g.tokens_n;
        r.prompt_tokens = g.prompt_tokens;
        r.cached_tokens = g.cached_tokens;
        r.attempts = g.attempts;
        r.ttft_ms = g.ttft_ms;
        r.total_ms = g.total_ms;
        r.prefill_ms = g.prefill_ms;
        r.push_ms = g.push_ms;
        r.exposed_push_ms = g.exposed_push_ms;
        memcpy(r.finish_reason, g.finish_reason, sizeof(r.finish_reason));
        char why[200];
        if (g.logprobs != NULL && !decode_lp(g.logprobs, g.logprobs_len, r.n_tokens,
                                             g.top_logprobs, &r.logprobs, why, sizeof(why))) {
            r.status = HPD_ERR_FORMAT;
            snprintf(r.error, sizeof(r.error), "bad reply: %s",
                     r.logprobs == NULL ? "out of memory" : why);
        }
        if (r.status == HPD_OK && g.prompt_logprobs != NULL &&
            (r.prompt_tokens < 2 ||
             !decode_lp(g.prompt_logprobs, g.prompt_logprobs_len, r.prompt_tokens - 1,
                        g.top_logprobs, &r.prompt_logprobs, why, sizeof(why)))) {
            r.status = HPD_ERR_FORMAT;
            snprintf(r.error, sizeof(r.error), "bad reply: prompt %s",
                     r.prompt_logprobs == NULL ? "logprobs missing or out of memory" : why);
        }
        /* (an answer that is all reasoning or calls has no text: an empty one) */
        r.text = answer_text(g.text, g.text_len, g.reasoning != NULL || q->detokenize);
        if (r.text != NULL)
            r.text_len = g.text_len;
        r.tool_calls = dup_bin(g.tool_calls, g.tool_calls_len);
        r.reasoning = dup_bin(g.reasoning, g.reasoning_len);
        if (r.status == HPD_OK && q->n_choices > 1)
            more_choices(&g, q->n_choices, q->detokenize, &r);
        /* a run after a resubmission answers what the first streamed */
        if (r.status == HPD_OK && q->streamed > 0 && q->sends > 1 &&
            (r.n_tokens < q->streamed || q->seen == NULL ||
             memcmp(r.tokens, q->seen, q->streamed * sizeof(*r.tokens)) != 0)) {
            r.status = HPD_ERR_INTERNAL;
            snprintf(r.error, sizeof(r.error), "the request, submitted again after its "
                     "coordinator was lost, answered other tokens than its first run streamed");
        }
        /* tokens the stream did not deliver yet (a non-streaming request) */
        if (r.status == HPD_OK && q->on_token != NULL && q->streamed < r.n_tokens)
            q->on_token(q->arg, q->handle, q->streamed, r.tokens + q->streamed,
                        r.n_tokens - q->streamed);
    }
    finish(q, &r);
}

hpd_status_t hpd_client_submit(hpd_client_t *c, const hpd_generate_params_t *p,
                               hpd_client_token_cb_t on_token, hpd_client_done_cb_t on_done,
                               void *arg, uint64_t *handle_p)
{
    pending_t *q = calloc(1, sizeof(*q));
    hpd_status_t st;

    if (q == NULL)
        return HPD_ERR_NO_MEMORY;
    /* no coordinator answers: an error, or (resubmitting) later */
    const hpd_status_t connected = ensure_connected(c);
    if (connected != HPD_OK && (c->resubmit_ms == 0 || connected == HPD_ERR_INVALID_ARG)) {
        free(q);
        return connected;
    }
    *q = (pending_t){.client = c,
                     .handle = c->next_handle++,
                     .on_token = on_token,
                     .on_done = on_done,
                     .on_text = p->on_text,
                     .text_arg = p->text_arg,
                     .arg = arg,
                     .t_submit = hpd_time_now(),
                     .n_choices = p->n,
                     .detokenize = p->detokenize || p->n_stops > 0 || p->tools != NULL};
    /* a chat's messages and the stop strings, packed apart */
    hpd_rpc_buf_t msgs, stops;
    hpd_rpc_buf_init(&msgs);
    hpd_rpc_buf_init(&stops);
    msgpack_pack_array(&msgs.pk, p->n_messages);
    for (uint32_t i = 0; i < p->n_messages; i++) {
        msgpack_pack_map(&msgs.pk, 2);
        hpd_proto_key(&msgs.pk, "role");
        hpd_rpc_pack_str(&msgs.pk, p->roles[i]);
        hpd_proto_key(&msgs.pk, "content");
        hpd_rpc_pack_str(&msgs.pk, p->contents[i]);
    }
    msgpack_pack_array(&stops.pk, p->n_stops);
    for (uint32_t i = 0; i < p->n_stops; i++)
        hpd_rpc_pack_str(&stops.pk, p->stops[i]);
    hpd_rpc_buf_init(&q->msg);
    /* every value, zeros too: the coordinator judges them */
    hpd_msg_pack_all(&hpd_msg_generate,
                     &(hpd_msg_generate_t){.prompt = p->prompt,
                                           .prompt_n = p->n_prompt,
                                           .max_tokens = p->max_tokens,
                                           .temperature = p->sampling.temperature,
                                           .top_p = p->sampling.top_p,
                                           .top_k = p->sampling.top_k,
                                           .seed = p->sampling.seed,
                                           .stream = on_token != NULL || p->on_text != NULL,
                                           .tag = q->handle,
                                           .stop_token_ids = p->stop_ids,
                                           .stop_token_ids_n = p->n_stop,
                                           .ignore_eos = p->ignore_eos,
                                           .min_tokens = p->min_tokens,
                                           .text = p->text,
                                           .text_len = p->text ? (uint32_t)strlen(p->text) : 0,
                                           .messages_raw = p->n_messages ? msgs.sb.data : NULL,
                                           .messages_raw_len = (uint32_t)msgs.sb.size,
                                           .thinking = p->thinking,
                                           .detokenize = p->detokenize,
                                           .stop_raw = p->n_stops ? stops.sb.data : NULL,
                                           .stop_raw_len = (uint32_t)stops.sb.size,
                                           .logprobs = p->logprobs,
                                           .top_logprobs = p->top_logprobs,
                                           .prompt_logprobs = p->prompt_logprobs,
                                           .grammar = p->grammar,
                                           .grammar_len = p->grammar ? (uint32_t)strlen(p->grammar) : 0,
                                           .n = p->n,
                                           .tools = p->tools,
                                           .tools_len = p->tools ? (uint32_t)strlen(p->tools) : 0,
                                           .tool_choice = p->tool_choice,
                                           .tool_choice_len = p->tool_choice
                                                                  ? (uint32_t)strlen(p->tool_choice)
                                                                  : 0,
                                           .single_tool_call = p->single_tool_call},
                     &q->msg.pk);
    hpd_rpc_buf_destroy(&msgs);
    hpd_rpc_buf_destroy(&stops);
    if (connected == HPD_OK) {
        st = hpd_rpc_call(c->rpc, "generate", &q->msg, c->p.timeout_ms, on_reply, q);
        q->sends = st == HPD_OK;
    } else { /* sent once a coordinator answers */
        q->retry = evtimer_new(c->base, on_retry, q);
        const struct timeval tv = {0, RESUBMIT_FIRST_MS * 1000};
        st = q->retry != NULL && evtimer_add(q->retry, &tv) == 0 ? HPD_OK : HPD_ERR_NO_MEMORY;
    }
    if (st != HPD_OK || c->resubmit_ms == 0) { /* (kept only to be sent again) */
        hpd_rpc_buf_destroy(&q->msg);
        memset(&q->msg, 0, sizeof(q->msg));
    }
    if (st != HPD_OK) {
        if (q->retry != NULL)
            event_free(q->retry);
        free(q);
        return st;
    }
    q->next = c->pending;
    c->pending = q;
    c->n_pending++;
    if (handle_p != NULL)
        *handle_p = q->handle;
    return HPD_OK;
}

static void ignore(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
}

hpd_status_t hpd_client_cancel(hpd_client_t *c, uint64_t handle)
{
    hpd_rpc_buf_t b;
    hpd_status_t st;
    pending_t *q = find(c, handle);
    if (q != NULL) {
        q->canceled = true; /* not submitted again */
        if (q->retry != NULL && evtimer_pending(q->retry, NULL)) {
            end_unsent(q, HPD_ERR_CANCELED, "canceled");
            return HPD_OK;
        }
    }
    if (!hpd_rpc_client_is_open(c->rpc))
        return HPD_ERR_IO; /* its request failed with the connection */
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_cancel_request, &(hpd_msg_cancel_request_t){.tag = handle}, &b.pk);
    st = hpd_rpc_call(c->rpc, "cancel", &b, 0, ignore, NULL);
    hpd_rpc_buf_destroy(&b);
    return st;
}

uint32_t hpd_client_pending(const hpd_client_t *c)
{
    return c->n_pending;
}

void hpd_client_poll(hpd_client_t *c, uint32_t timeout_ms)
{
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    event_base_loopexit(c->base, &tv);
    event_base_loop(c->base, EVLOOP_ONCE);
}

hpd_status_t hpd_client_run(hpd_client_t *c)
{
    while (c->n_pending > 0)
        if (event_base_loop(c->base, EVLOOP_ONCE) < 0)
            return HPD_ERR_IO;
    return HPD_OK;
}

typedef struct {
    hpd_generate_result_t *out;
    hpd_client_token_cb_t on_token;
    void *arg;
} sync_t;

static void sync_done(void *arg, uint64_t handle, hpd_generate_result_t *r)
{
    sync_t *s = arg;
    *s->out = *r;
    r->tokens = NULL; /* ours now */
    r->text = NULL;
    r->reasoning = NULL;
    r->tool_calls = NULL;
    r->logprobs = NULL;
    r->prompt_logprobs = NULL;
    r->more = NULL;
}

static void sync_token(void *arg, uint64_t handle, uint32_t index, const int32_t *ids,
                       uint32_t n)
{
    sync_t *s = arg;
    s->on_token(s->arg, handle, index, ids, n);
}

hpd_status_t hpd_client_generate(hpd_client_t *c, const hpd_generate_params_t *p,
                                 hpd_client_token_cb_t on_token, void *arg,
                                 hpd_generate_result_t *result)
{
    sync_t s = {result, on_token, arg};
    uint64_t handle;
    hpd_status_t st;

    memset(result, 0, sizeof(*result));
    st = hpd_client_submit(c, p, on_token ? sync_token : NULL, sync_done, &s, &handle);
    if (st != HPD_OK) {
        result->status = st;
        snprintf(result->error, sizeof(result->error), "%s", hpd_status_str(st));
        return st;
    }
    while (find(c, handle) != NULL)
        if (event_base_loop(c->base, EVLOOP_ONCE) < 0)
            return HPD_ERR_IO;
    return result->status;
}

void hpd_generate_result_free(hpd_generate_result_t *r)
{
    free(r->tokens);
    r->tokens = NULL;
    free(r->text);
    r->text = NULL;
    free(r->reasoning);
    r->reasoning = NULL;
    free(r->tool_calls);
    r->tool_calls = NULL;
    free(r->logprobs);
    r->logprobs = NULL;
    free(r->prompt_logprobs);
    r->prompt_logprobs = NULL;
    free_more(r);
}

hpd_status_t hpd_client_status(hpd_client_t *c, hpd_rpc_result_t *r)
{
    /* idempotent: once more on a new connection when the old one is gone */
    memset(r, 0, sizeof(*r)); /* destroyable whatever happens */
    msgpack_zone_init(&r->zone, 64);
    r->result.type = MSGPACK_OBJECT_NIL;
    hpd_status_t st = ensure_connected(c);
    if (st != HPD_OK)
        r->status = st;
    if (st == HPD_OK) {
        hpd_rpc_result_destroy(r);
        st = hpd_rpc_call_sync(c->rpc, "status", NULL, 10000, r);
    }
    if (st == HPD_ERR_IO) {
        hpd_rpc_result_destroy(r);
        if ((st = ensure_connected(c)) == HPD_OK)
            st = hpd_rpc_call_sync(c->rpc, "status", NULL, 10000, r);
    }
    return st;
}
