#include "client/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    struct pending *next;
} pending_t;

struct hpd_client {
    hpd_client_params_t p;
    struct event_base *base;
    hpd_rpc_client_t *rpc;
    hpd_rpc_client_params_t rp;
    char host[256]; /* copies: the client connects again later */
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
    if ((q = find(c, m.tag)) != NULL && m.ids_n > 0) {
        if (q->t_first == 0)
            q->t_first = hpd_time_now();
        /* the coordinator sends every position once, in order */
        if (m.index == q->streamed && q->on_token != NULL)
            q->on_token(q->arg, q->handle, m.index, m.ids, m.ids_n);
        if (m.index == q->streamed)
            q->streamed += m.ids_n;
    }
    if (q != NULL && m.text_len > 0 && q->on_text != NULL)
        q->on_text(q->text_arg, q->handle, m.text, m.text_len);
    hpd_msg_free(&hpd_msg_stream, &m);
}

static void on_close(void *arg, hpd_status_t why)
{
    (void)arg;
    HPD_LOG_DEBUG(LOG_COMPONENT, "connection to the coordinator closed: %s",
                  hpd_status_str(why));
}

hpd_status_t hpd_client_create(const hpd_client_params_t *params, hpd_client_t **client_p)
{
    hpd_client_t *c = calloc(1, sizeof(*c));
    hpd_status_t st;

    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    c->p = *params;
    snprintf(c->host, sizeof(c->host), "%s", params->host ? params->host : "127.0.0.1");
    c->p.host = c->host;
    if (params->token != NULL && (c->token = strdup(params->token)) == NULL) {
        free(c);
        return HPD_ERR_NO_MEMORY;
    }
    c->p.token = c->token;
    if (c->p.port == 0)
        c->p.port = 7000;
    if (c->p.timeout_ms == 0)
        c->p.timeout_ms = 600000;
    c->next_handle = 1;
    if ((c->base = event_base_new()) == NULL) {
        free(c->token);
        free(c);
        return HPD_ERR_NO_MEMORY;
    }
    c->rp = (hpd_rpc_client_params_t){.base = c->base,
                                      .host = c->p.host,
                                      .port = c->p.port,
                                      .token = c->p.token,
                                      .timeout_ms = 10000,
                                      .on_notify = on_notify,
                                      .on_close = on_close,
                                      .arg = c};
    if ((st = hpd_rpc_client_create(&c->rp, &c->rpc)) != HPD_OK) {
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
    free(q);
}

void hpd_client_destroy(hpd_client_t *c)
{
    if (c == NULL)
        return;
    /* the pending calls fail with HPD_ERR_CANCELED through on_reply */
    hpd_rpc_client_destroy(c->rpc);
    event_base_free(c->base);
    free(c->token);
    free(c);
}

/* After the connection was lost (the coordinator restarted, or a failover
 * to a standby behind the same address): connects again, without running
 * the loop (this may run inside a callback); the token goes first and the
 * calls queue behind it. */
static hpd_status_t ensure_connected(hpd_client_t *c)
{
    if (hpd_rpc_client_is_open(c->rpc))
        return HPD_OK;
    hpd_rpc_client_t *fresh;
    const hpd_status_t st = hpd_rpc_client_connect(&c->rp, &fresh);
    if (st != HPD_OK)
        return st;
    hpd_rpc_client_destroy(c->rpc);
    c->rpc = fresh;
    return HPD_OK;
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

static void on_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    pending_t *q = arg;
    hpd_client_t *c = q->client;
    hpd_generate_result_t r;
    hpd_msg_generated_t g = {0};
    hpd_proto_err_t err;

    memset(&r, 0, sizeof(r));
    r.status = st;
    r.client_total_ms = (hpd_time_now() - q->t_submit) * 1e3;
    r.client_ttft_ms = q->t_first > 0 ? (q->t_first - q->t_submit) * 1e3 : 0;
    if (st == HPD_ERR_IO) {
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
        /* tokens the stream did not deliver yet (a non-streaming request) */
        if (q->on_token != NULL && q->streamed < r.n_tokens)
            q->on_token(q->arg, q->handle, q->streamed, r.tokens + q->streamed,
                        r.n_tokens - q->streamed);
    }
    if (q->on_done != NULL)
        q->on_done(q->arg, q->handle, &r);
    free(r.tokens);
    free(r.text);
    free(r.reasoning);
    free(r.tool_calls);
    free(r.logprobs);
    free(r.prompt_logprobs);
    free_more(&r);
    drop(c, q);
}

hpd_status_t hpd_client_submit(hpd_client_t *c, const hpd_generate_params_t *p,
                               hpd_client_token_cb_t on_token, hpd_client_done_cb_t on_done,
                               void *arg, uint64_t *handle_p)
{
    pending_t *q = calloc(1, sizeof(*q));
    hpd_rpc_buf_t b;
    hpd_status_t st;

    if (q == NULL)
        return HPD_ERR_NO_MEMORY;
    if ((st = ensure_connected(c)) != HPD_OK) {
        free(q);
        return st;
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
    hpd_rpc_buf_init(&b);
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
                     &b.pk);
    hpd_rpc_buf_destroy(&msgs);
    hpd_rpc_buf_destroy(&stops);
    st = hpd_rpc_call(c->rpc, "generate", &b, c->p.timeout_ms, on_reply, q);
    hpd_rpc_buf_destroy(&b);
    if (st != HPD_OK) {
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
