/* The OpenAI-compatible HTTP API (coordinator/openai.h).
 *
 * One call_t per generation request, from its parse to its answer. Who
 * frees it: the sink's done (coordinator/coordinator.h), which comes
 * exactly once, also when the client went away first (the connection's
 * close callback cancels the request, and done then answers nobody). A
 * call never touches its evhttp request after the close callback. */
#include "coordinator/openai.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <utf8proc.h>

#include "common/log.h"
#include "common/sampling.h"
#include "common/util.h"
#include "coordinator/answer.h"
#include "coordinator/chatreq.h"
#include "coordinator/credentials.h"
#include "coordinator/reasoning.h"
#include "coordinator/text.h"
#include "coordinator/toolcall.h"
#include "grammar/grammar.h"
#include "transport/http_guard.h"
#include "transport/rpc_codec.h"

#define LOG_COMPONENT "openai"
#define HTTP_TIMEOUT_S 600 /* an idle connection, or one that sends a request this slowly */
#define COMPLETIONS_DEFAULT_MAX_TOKENS 16 /* OpenAI's */

/* the statuses this server answers with, each counted apart */
static const int statuses[] = {200, 400, 401, 404, 413, 429, 499, 500, 503};
#define N_STATUSES (sizeof(statuses) / sizeof(statuses[0]))

/* connections the guard closed (transport/http_guard.h), by reason: the
 * label and the counter of hpd_http_guard_stats_t */
#define HPD_HTTP_CLOSED(X)                                                                  \
    X(evicted, evicted)                                                                     \
    X(head_timeout, head_timeouts)                                                          \
    X(refused, refused)                                                                     \
    X(rejected, rejected)                                                                   \
    X(revoked, revoked)                                                                     \
    X(accept_error, accept_errors)
#define COUNT(label, field) +1
enum { N_CLOSED = 0 HPD_HTTP_CLOSED(COUNT) };
#undef COUNT

struct hpd_openai {
    hpd_openai_params_t p;
    struct evhttp *http;
    hpd_http_guard_t *guard; /* the key checked before a body is read */
    uint16_t port;
    const hpd_text_t *text; /* the coordinator's */
    char model[256];
    long long created;
    uint64_t next_call;
    /* in the coordinator's registry (docs/operations.md) */
    hpd_metric_t *answered[N_STATUSES + 1]; /* [N_STATUSES]: any other status */
    hpd_metric_t *gone;                      /* clients that left before their answer */
    hpd_metric_t *conns[2];                  /* authenticated, unauthenticated */
    hpd_metric_t *closed[N_CLOSED];          /* by the guard, by reason */
};

typedef struct call call_t;

/* One choice of a call (n of them; one without): its answer as it comes. */
typedef struct {
    call_t *k;
    uint32_t index;
    hpd_answer_t a;        /* its text, reasoning and tool calls (coordinator/answer.h) */
    struct evbuffer *text; /* the answer so far (not streamed) */
    bool bad_token;        /* an id the tokenizer does not know came */
    struct evbuffer *thought; /* a thinking model's reasoning so far (not streamed) */
    /* log probabilities: the entries of the tokens not yet sent (see call) */
    json_t *lp;
    size_t text_offset; /* completions: characters of the tokens so far */
    bool echoed;        /* streamed: the prompt's chunk went out */
    json_t *calls;      /* tools: the calls so far (not streamed) */
    uint32_t n_calls;
} choice_t;

struct call {
    hpd_openai_t *api;
    struct evhttp_request *req;
    struct evhttp_connection *evcon;
    bool chat, stream, include_usage;
    bool gone;        /* evhttp saw the connection close (its close callback) */
    bool detached;    /* ... and left the request to us to free (by finishing it) */
    bool peer_closed; /* the watch saw it (evhttp reads nothing while a reply is due) */
    struct event *watch; /* not streamed: the connection, for its close */
    uint64_t request;
    char id[48];
    long long created;
    uint32_t n_prompt;
    char *stops[HPD_TEXT_MAX_STOPS];
    size_t n_stops;
    /* a chat of a thinking model: its answers split into reasoning and
     * content (coordinator/reasoning.h) */
    bool split;
    /* log probabilities (docs/api.md): a choice's entries of the tokens not
     * yet sent (stream: they go with the next chunk; else all at the end)
     * in the endpoint's form: chat, an array of {token, logprob, bytes,
     * top_logprobs}; completions, {tokens, token_logprobs, top_logprobs,
     * text_offset} */
    bool logprobs;
    uint32_t top_logprobs;
    /* completions' echo: the prompt (its ids, kept for its logprobs) */
    bool echo;
    int32_t *prompt;
    /* vLLM's return_token_ids (not streamed): the prompt's ids and each
     * choice's as the answer has them, beside the text */
    bool return_ids;
    /* tools (docs/api.md, "Tool calls"): the request's, whether the content
     * is parsed for calls (tool_choice other than none) and in which form,
     * whether only the first call counts */
    json_t *tools;
    bool parse_calls, one_call;
    hpd_toolcall_format_t tc_format;
    /* its choices (n; one without) */
    choice_t ch[HPD_MAX_CHOICES];
    uint32_t n_ch;
};

/* ------------------------------------------------------------ replies */

static void reply_json(struct evhttp_request *req, int status, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct evbuffer *out = evbuffer_new();
    if (text == NULL || out == NULL) {
        free(text);
        if (out != NULL)
            evbuffer_free(out);
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json");
    evbuffer_add(out, text, strlen(text));
    evbuffer_add(out, "\n", 1);
    evhttp_send_reply(req, status, NULL, out);
    evbuffer_free(out);
    free(text);
}

static const char *error_type(int status)
{
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return "server_error";
    }
}

/* A message that may hold a client's bytes, cut anywhere by snprintf, as
 * valid UTF-8 (JSON strings must be): each byte that begins no whole
 * character becomes '?'. */
static void utf8_fix(char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        const utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (k > 0) {
            i += (size_t)k;
        } else {
            s[i++] = '?';
        }
    }
}

/* OpenAI's error object. */
static json_t *error_json(int status, const char *param, const char *code, const char *msg)
{
    char text[640], p[96];
    snprintf(text, sizeof(text), "%s", msg);
    snprintf(p, sizeof(p), "%s", param != NULL ? param : "");
    utf8_fix(text);
    utf8_fix(p);
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", text, "type",
                     error_type(status), "param", param != NULL ? p : NULL, "code", code);
}

static void reply_error(struct evhttp_request *req, int status, const char *param,
                        const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void reply_error(struct evhttp_request *req, int status, const char *param,
                        const char *code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    reply_json(req, status, error_json(status, param, code, msg));
}

/* The HTTP status of a refusal or failure from the coordinator. */
static int status_of(const hpd_openai_t *api, int64_t code)
{
    if (code == HPD_RPC_ERR_PARAMS)
        return 400;
    if (code == HPD_RPC_ERR_OVERLOADED)
        return hpd_coord_draining(api->p.coord) ? 503 : 429;
    if (code == HPD_RPC_ERR_NOT_LEADER)
        return 503; /* (a standby leads by now, or soon: try again) */
    return 500;
}

/* ------------------------------------------------------------ requests */

/* The body as JSON (an object), or an answered 400 / 413. */
static json_t *read_body(struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    const size_t len = evbuffer_get_length(in);
    json_error_t jerr;
    if (len > HPD_OPENAI_MAX_BODY) {
        reply_error(req, 413, NULL, NULL, "the body has %zu bytes (at most %u)", len,
                    HPD_OPENAI_MAX_BODY);
        return NULL;
    }
    const char *data = (const char *)evbuffer_pullup(in, -1);
    json_t *j = json_loadb(data != NULL ? data : "", len, 0, &jerr);
    if (j == NULL) {
        reply_error(req, 400, NULL, NULL, "the body is not JSON: %s (line %d, column %d)",
                    jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        reply_error(req, 400, NULL, NULL, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Whether the request carries a client key; else it is answered 401. */
static bool authorized(hpd_openai_t *api, struct evhttp_request *req, char *who, size_t who_len)
{
    const char *h =
        evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    const char *key = "";
    if (h != NULL && strncasecmp(h, "Bearer ", 7) == 0)
        for (key = h + 7; *key == ' '; key++)
            ;
    uint64_t credential;
    if ((hpd_coord_authenticate(api->p.coord, key, strlen(key), who, who_len, &credential) &
         HPD_ROLE_CLIENT) != 0)
        return true;
    reply_error(req, 401, NULL, "invalid_api_key",
                h == NULL ? "no API key: send 'Authorization: Bearer KEY' with a client key"
                          : "the API key is not a client key of this cluster");
    return false;
}

/* A field's problem, answered 400 naming it. */
#define BAD(req, field, ...) (reply_error((req), 400, (field), NULL, __VA_ARGS__), false)

/* A chat request's error (coordinator/chatreq.h): 400 naming the field,
 * or 500 for what was not the client's doing. */
static void reply_chatreq_error(struct evhttp_request *req, const hpd_chatreq_err_t *err)
{
    reply_error(req, err->internal ? 500 : 400, err->param[0] != '\0' ? err->param : NULL, NULL,
                "%s", err->msg);
}

static bool get_number(struct evhttp_request *req, json_t *body, const char *name, double lo,
                       double hi, double *v)
{
    const json_t *x = json_object_get(body, name);
    if (x == NULL || json_is_null(x))
        return true;
    if (!json_is_number(x) || !(json_number_value(x) >= lo && json_number_value(x) <= hi))
        return BAD(req, name, "%s: expected a number in [%g, %g]", name, lo, hi);
    *v = json_number_value(x);
    return true;
}

static bool get_uint(struct evhttp_request *req, json_t *body, const char *name, json_int_t lo,
                     json_int_t hi, json_int_t *v)
{
    const json_t *x = json_object_get(body, name);
    if (x == NULL || json_is_null(x))
        return true;
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return BAD(req, name, "%s: expected an integer in [%lld, %lld]", name, (long long)lo,
                   (long long)hi);
    *v = json_integer_value(x);
    return true;
}

static bool get_bool(struct evhttp_request *req, json_t *body, const char *name, bool *v)
{
    const json_t *x = json_object_get(body, name);
    if (x == NULL || json_is_null(x))
        return true;
    if (!json_is_boolean(x))
        return BAD(req, name, "%s: expected true or false", name);
    *v = json_is_true(x);
    return true;
}

/* What this server does not do is refused by name rather than ignored. */
static bool refuse_unsupported(struct evhttp_request *req, json_t *body)
{
    const json_t *x;
    if ((x = json_object_get(body, "best_of")) != NULL && !json_is_null(x) &&
        !(json_is_integer(x) && json_integer_value(x) == 1))
        return BAD(req, "best_of", "best_of: only 1 is supported");
    if ((x = json_object_get(body, "suffix")) != NULL && !json_is_null(x) &&
        !(json_is_string(x) && json_string_length(x) == 0))
        return BAD(req, "suffix", "suffix is not supported");
    if ((x = json_object_get(body, "functions")) != NULL && !json_is_null(x))
        return BAD(req, "functions", "functions are not supported (use tools)");
    if ((x = json_object_get(body, "logit_bias")) != NULL && !json_is_null(x) &&
        !(json_is_object(x) && json_object_size(x) == 0))
        return BAD(req, "logit_bias", "logit_bias is not supported");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty",
                                            "repetition_penalty"};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(penalties); i++) {
        x = json_object_get(body, penalties[i]);
        const double none = i == 2 ? 1 : 0;
        if (x != NULL && !json_is_null(x) && !(json_is_number(x) && json_number_value(x) == none))
            return BAD(req, penalties[i], "%s is not supported (only %g)", penalties[i], none);
    }
    return true;
}

/* response_format: text (*spec_p NULL), json_object, or json_schema with
 * its schema, as hpd_grammar_from_spec's JSON (malloc'd); the schema
 * compiled here so that what it cannot be is a 400 naming the field. */
static bool get_response_format(struct evhttp_request *req, json_t *body, char **spec_p)
{
    const json_t *x = json_object_get(body, "response_format");
    *spec_p = NULL;
    if (x == NULL || json_is_null(x))
        return true;
    const json_t *t = json_object_get(x, "type");
    const char *type = json_is_object(x) && json_is_string(t) ? json_string_value(t) : "";
    json_t *spec;
    if (strcmp(type, "text") == 0)
        return true;
    if (strcmp(type, "json_object") == 0) {
        spec = json_pack("{s:b}", "json_object", 1);
    } else if (strcmp(type, "json_schema") == 0) {
        json_t *js = json_object_get(x, "json_schema"), *schema = json_object_get(js, "schema");
        if (!json_is_object(js))
            return BAD(req, "response_format", "response_format.json_schema: expected an object "
                       "with the schema");
        if (schema == NULL)
            schema = json_object(); /* OpenAI's default: any JSON */
        else
            json_incref(schema);
        if (!json_is_object(schema) && !json_is_boolean(schema)) {
            json_decref(schema);
            return BAD(req, "response_format", "response_format.json_schema.schema: expected a "
                       "JSON Schema object");
        }
        spec = json_pack("{s:o}", "json_schema", schema);
    } else {
        return BAD(req, "response_format", "response_format.type: expected \"text\", "
                   "\"json_object\" or \"json_schema\"");
    }
    char *text = spec != NULL ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (text == NULL)
        return reply_error(req, 500, NULL, NULL, "out of memory"), false;
    hpd_grammar_t *g;
    char why[256];
    if (hpd_grammar_from_spec(text, strlen(text), &g, why, sizeof(why)) != HPD_OK) {
        free(text);
        return BAD(req, "response_format", "response_format.json_schema.schema: %s", why);
    }
    hpd_grammar_destroy(g);
    *spec_p = text;
    return true;
}


/* tools, tool_choice and parallel_tool_calls (chat): whether the content
 * is parsed for calls, and for "required" or a named function the grammar
 * every answer must be a call of (*spec_p, hpd_grammar_from_spec's
 * tool_call form) */
static bool get_tools(hpd_openai_t *api, struct evhttp_request *req, json_t *body, call_t *k,
                      char **spec_p)
{
    bool parallel = true;
    if (!get_bool(req, body, "parallel_tool_calls", &parallel))
        return false;
    const json_t *tools = json_object_get(body, "tools");
    if (tools != NULL && !json_is_null(tools) && !k->chat)
        return BAD(req, "tools", "tools: only on chat completions");
    hpd_chatreq_tools_t t;
    hpd_chatreq_err_t err;
    const bool ok = hpd_chatreq_tools(api->text, tools, json_object_get(body, "tool_choice"),
                                      parallel, *spec_p != NULL, &t, &err);
    if (!ok) {
        reply_chatreq_error(req, &err);
    } else {
        k->tools = json_incref(t.tools);
        k->parse_calls = t.parse_calls;
        k->one_call = t.one_call;
        k->tc_format = t.format;
        if (t.spec != NULL) {
            *spec_p = t.spec;
            t.spec = NULL;
        }
    }
    hpd_chatreq_tools_free(&t);
    return ok;
}

/* Token ids of a JSON array: each in [0, vocab). */
static bool get_ids(struct evhttp_request *req, const json_t *a, const char *field,
                    uint32_t vocab, int32_t **ids_p, size_t *n_p)
{
    size_t i;
    json_t *v;
    int32_t *ids = malloc((json_array_size(a) + 1) * sizeof(int32_t));
    if (ids == NULL)
        return BAD(req, field, "out of memory");
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= (json_int_t)vocab) {
            free(ids);
            return BAD(req, field, "%s[%zu]: expected a token id in [0, %u)", field, i, vocab);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    *ids_p = ids;
    *n_p = json_array_size(a);
    return true;
}

/* completions' prompt: a string, ids, or a list of one of those */
static bool completion_prompt(hpd_openai_t *api, struct evhttp_request *req, json_t *body,
                              int32_t **ids_p, size_t *n_p)
{
    const json_t *p = json_object_get(body, "prompt");
    const hpd_tokenizer_t *tok = hpd_text_tokenizer(api->text);
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    else if (json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0)))
        return BAD(req, "prompt", "prompt: one prompt per request (a batch of %zu given)",
                   json_array_size(p));
    if (json_is_string(p)) {
        if (hpd_tokenizer_encode(tok, json_string_value(p), json_string_length(p), ids_p, n_p) !=
            HPD_OK)
            return BAD(req, "prompt", "prompt: cannot be encoded");
        return true;
    }
    if (json_is_array(p))
        return get_ids(req, p, "prompt", hpd_tokenizer_size(tok), ids_p, n_p);
    return BAD(req, "prompt", "prompt: expected a string or an array of token ids");
}





/* chat's messages, through the chat format */
static bool chat_prompt(hpd_openai_t *api, struct evhttp_request *req, json_t *body,
                        int32_t **ids_p, size_t *n_p, int *thinking_p)
{
    int thinking = hpd_coord_default_thinking(api->p.coord); /* unless the request says */
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw != NULL && !json_is_null(kw)) {
        const char *key;
        json_t *v;
        if (!json_is_object(kw))
            return BAD(req, "chat_template_kwargs", "chat_template_kwargs: expected an object");
        json_object_foreach((json_t *)kw, key, v) {
            if (strcmp(key, "enable_thinking") != 0 || !json_is_boolean(v))
                return BAD(req, "chat_template_kwargs", "chat_template_kwargs.%s: only "
                           "enable_thinking (true or false) is understood", key);
            thinking = json_is_true(v);
        }
    }
    *thinking_p = thinking;
    hpd_chatreq_err_t err;
    if (!hpd_chatreq_prompt(api->text, json_object_get(body, "messages"),
                            json_object_get(body, "tools"), thinking, ids_p, n_p, &err))
        return reply_chatreq_error(req, &err), false;
    return true;
}

/* ------------------------------------------------------------ answers */

static json_t *usage_json(const call_t *k, uint32_t completion, uint32_t cached)
{
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)k->n_prompt,
                     "completion_tokens", (json_int_t)completion, "total_tokens",
                     (json_int_t)(k->n_prompt + completion), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached);
}

/* ------------------------------------------------------------ logprobs */

/* JSON has no -infinity: a token the model rules out gets vLLM's -9999 */
static json_t *lp_number(float f)
{
    return json_real(isfinite(f) ? f : -9999.0);
}

/* A token's text (U+FFFD where its bytes are not whole characters) and
 * its bytes; false when the id is unknown or out of memory */
static bool token_text(const call_t *k, int32_t id, json_t **text_p, json_t **bytes_p)
{
    const hpd_tokenizer_t *tok = hpd_text_tokenizer(k->api->text);
    char *text = NULL, *raw = NULL;
    size_t len, n_raw;
    if (hpd_tokenizer_decode(tok, &id, 1, false, &text, &len) != HPD_OK ||
        hpd_tokenizer_token_bytes(tok, id, &raw, &n_raw) != HPD_OK) {
        free(text);
        return false;
    }
    *text_p = json_stringn(text, len);
    if (bytes_p != NULL) {
        *bytes_p = json_array();
        for (size_t i = 0; i < n_raw; i++)
            json_array_append_new(*bytes_p, json_integer((uint8_t)raw[i]));
    }
    free(text);
    free(raw);
    return *text_p != NULL;
}

/* The characters of a UTF-8 text (U+FFFD counts one) */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        n += (*c & 0xc0) != 0x80;
    return n;
}

/* completions' logprobs: {tokens, token_logprobs, top_logprobs, text_offset}, empty */
static json_t *completion_lp_new(void)
{
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* Token id's entry onto completions' arrays at *offset (advanced past its
 * characters); lp NULL: none (an echoed prompt's first token: null). */
static bool completion_lp_add(const call_t *k, json_t *all, int32_t id,
                              const hpd_token_logprobs_t *lp, size_t *offset)
{
    json_t *text, *top = lp != NULL ? json_object() : json_null();
    if (!token_text(k, id, &text, NULL)) {
        json_decref(top);
        return false;
    }
    for (uint32_t j = 0; lp != NULL && j < lp->n_top; j++) {
        json_t *t;
        if (token_text(k, lp->top_ids[j], &t, NULL)) {
            json_object_set_new(top, json_string_value(t), lp_number(lp->top_logprobs[j]));
            json_decref(t);
        }
    }
    json_array_append_new(json_object_get(all, "tokens"), text);
    json_array_append_new(json_object_get(all, "token_logprobs"),
                          lp != NULL ? lp_number(lp->logprob) : json_null());
    json_array_append_new(json_object_get(all, "top_logprobs"), top);
    json_array_append_new(json_object_get(all, "text_offset"), json_integer((json_int_t)*offset));
    *offset += utf8_chars(json_string_value(text));
    return true;
}

/* {token, logprob, bytes} of one token */
static json_t *chat_lp_entry(const call_t *k, int32_t id, float logprob)
{
    json_t *text, *bytes;
    if (!token_text(k, id, &text, &bytes))
        return NULL;
    return json_pack("{s:o, s:o, s:o}", "token", text, "logprob", lp_number(logprob), "bytes",
                     bytes);
}

/* The entries of generated token id (its logprobs lp) onto c->lp. */
static bool add_lp(choice_t *c, int32_t id, const hpd_token_logprobs_t *lp)
{
    const call_t *k = c->k;
    if (c->lp == NULL && (c->lp = k->chat ? json_array() : completion_lp_new()) == NULL)
        return false;
    if (k->chat) {
        json_t *e = chat_lp_entry(k, id, lp->logprob), *top = json_array();
        for (uint32_t j = 0; e != NULL && j < lp->n_top; j++)
            json_array_append_new(top, chat_lp_entry(k, lp->top_ids[j], lp->top_logprobs[j]));
        if (e == NULL) {
            json_decref(top);
            return false;
        }
        json_object_set_new(e, "top_logprobs", top);
        return json_array_append_new(c->lp, e) == 0;
    }
    return completion_lp_add(k, c->lp, id, lp, &c->text_offset);
}

/* The characters of a token's text (U+FFFD counts one) */
static size_t token_chars(const call_t *k, int32_t id)
{
    json_t *t;
    if (!token_text(k, id, &t, NULL))
        return 0;
    const size_t n = utf8_chars(json_string_value(t));
    json_decref(t);
    return n;
}

/* completions' echo with logprobs: the prompt's entries before the
 * answer's (its first token has none: null), offsets from 0 */
static bool prepend_prompt_lp(choice_t *c, const hpd_token_logprobs_t *plp)
{
    const call_t *k = c->k;
    json_t *all = completion_lp_new();
    size_t offset = 0;
    for (uint32_t i = 0; all != NULL && i < k->n_prompt; i++)
        if (!completion_lp_add(k, all, k->prompt[i], i > 0 ? &plp[i - 1] : NULL, &offset)) {
            json_decref(all);
            return false;
        }
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs",
                                       "text_offset"};
    for (size_t i = 0; all != NULL && c->lp != NULL && i < 4; i++)
        json_array_extend(json_object_get(all, keys[i]), json_object_get(c->lp, keys[i]));
    json_decref(c->lp);
    c->lp = all;
    return all != NULL;
}

/* The entries so far, as a choice's logprobs (taken: c->lp starts over);
 * null when none were asked for. */
static json_t *take_lp(choice_t *c)
{
    const call_t *k = c->k;
    if (!k->logprobs)
        return json_null();
    json_t *lp = c->lp;
    c->lp = NULL;
    if (lp == NULL) /* none yet: an empty list */
        lp = k->chat ? json_array() : completion_lp_new();
    return k->chat ? json_pack("{s:o, s:n}", "content", lp, "refusal") : lp;
}

/* A chat's reasoning under both names it goes by (reasoning_content,
 * and reasoning, the newer one): the text, or null. */
static void set_reasoning(json_t *o, const char *text, size_t len)
{
    json_object_set_new(o, "reasoning_content", text != NULL ? json_stringn(text, len)
                                                             : json_null());
    json_object_set_new(o, "reasoning", text != NULL ? json_stringn(text, len) : json_null());
}

/* One choice: a chunk's delta (stream: text is content, or reasoning when
 * thought) or the whole message (thought: its reasoning, NULL for none). */
static json_t *choice_json(choice_t *c, const char *text, size_t len, const char *finish,
                           bool first, bool thought, const char *reasoning, size_t reasoning_len)
{
    const call_t *k = c->k;
    const json_int_t index = c->index;
    json_t *t = json_stringn(text, len);
    json_t *fr = finish != NULL ? json_string(finish) : json_null();
    /* the first chunk (the role) carries none */
    json_t *lp = first ? json_null() : take_lp(c);
    if (!k->chat)
        return json_pack("{s:I, s:o, s:o, s:o}", "index", index, "text", t, "logprobs", lp,
                         "finish_reason", fr);
    if (!k->stream) {
        json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", t);
        if (k->split)
            set_reasoning(m, reasoning, reasoning_len);
        return json_pack("{s:I, s:o, s:o, s:o}", "index", index, "message", m, "logprobs", lp,
                         "finish_reason", fr);
    }
    json_t *delta;
    if (first) {
        delta = json_pack("{s:s, s:o}", "role", "assistant", "content", t);
    } else if (finish != NULL && len == 0) {
        json_decref(t);
        delta = json_object();
    } else if (thought) {
        json_decref(t);
        delta = json_object();
        set_reasoning(delta, text, len);
    } else {
        delta = json_pack("{s:o}", "content", t);
    }
    return json_pack("{s:I, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs", lp,
                     "finish_reason", fr);
}

static json_t *ids_json(const int32_t *ids, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *envelope(const call_t *k, json_t *choices)
{
    const char *object = k->chat ? (k->stream ? "chat.completion.chunk" : "chat.completion")
                                 : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", k->id, "object", object, "created",
                     (json_int_t)k->created, "model", k->api->model, "choices", choices);
}

/* One server-sent event: j (taken), or the end (j NULL and done). An
 * event that cannot be written (out of memory) is left out. */
static void send_event(call_t *k, json_t *j, bool done)
{
    char *text = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    struct evbuffer *b = evbuffer_new();
    if (b != NULL && (text != NULL || done)) {
        if (text != NULL)
            evbuffer_add_printf(b, "data: %s\n\n", text);
        else
            evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(k->req, b);
    }
    if (b != NULL)
        evbuffer_free(b);
    free(text);
}

static void stream_piece(choice_t *c, const char *piece, size_t len, bool first, bool thought)
{
    if (len == 0 && !first) /* (its tokens' logprobs wait for the next piece) */
        return;
    send_event(c->k, envelope(c->k, json_pack("[o]", choice_json(c, piece, len, NULL, first,
                                                                 thought, NULL, 0))),
               false);
}

/* A piece of a choice's answer as it goes out: reasoning or content. */
static void out_piece(choice_t *c, bool thought, const char *piece, size_t len)
{
    const call_t *k = c->k;
    if (k->stream && !k->gone)
        stream_piece(c, piece, len, false, thought);
    else if (!k->stream)
        evbuffer_add(thought ? c->thought : c->text, piece, len);
}

/* A whole tool call: streamed as two deltas (its id and name, then its
 * arguments), or kept for the message. */
static void tc_call(void *arg, uint32_t index, const char *name, const char *arguments)
{
    choice_t *c = arg;
    call_t *k = c->k;
    char id[96], of[16] = "";
    if (k->one_call && index > 0) /* parallel_tool_calls false: the first only */
        return;
    if (k->n_ch > 1) /* each choice's calls their own ids */
        snprintf(of, sizeof(of), "%u_", c->index);
    snprintf(id, sizeof(id), "call_%s_%s%u", strchr(k->id, '-') ? strchr(k->id, '-') + 1 : k->id,
             of, index);
    c->n_calls++;
    if (!k->stream) {
        json_array_append_new(c->calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                                  "function", "function", "name", name,
                                                  "arguments", arguments));
        return;
    }
    if (k->gone)
        return;
    json_t *first = json_pack("{s:[{s:I, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index",
                              (json_int_t)index, "id", id, "type", "function", "function", "name",
                              name, "arguments", "");
    json_t *args = json_pack("{s:[{s:I, s:{s:s}}]}", "tool_calls", "index", (json_int_t)index,
                             "function", "arguments", arguments);
    for (int i = 0; i < 2; i++)
        send_event(k, envelope(k, json_pack("[{s:I, s:o, s:o, s:n}]", "index",
                                            (json_int_t)c->index, "delta",
                                            i == 0 ? first : args, "logprobs",
                                            i == 0 ? json_null() : take_lp(c), "finish_reason")),
                   false);
}

static void answer_content(void *arg, const char *piece, size_t len)
{
    out_piece(arg, false, piece, len);
}

static void answer_reasoning(void *arg, const char *piece, size_t len)
{
    out_piece(arg, true, piece, len);
}

static const hpd_answer_ops_t answer_ops = {
    .content = answer_content, .reasoning = answer_reasoning, .call = tc_call};

static void call_free(call_t *k)
{
    if (k->watch != NULL)
        event_free(k->watch);
    for (size_t i = 0; i < k->n_stops; i++)
        free(k->stops[i]);
    for (uint32_t i = 0; i < k->n_ch; i++) {
        choice_t *c = &k->ch[i];
        hpd_answer_free(&c->a);
        if (c->text != NULL)
            evbuffer_free(c->text);
        if (c->thought != NULL)
            evbuffer_free(c->thought);
        json_decref(c->lp);
        json_decref(c->calls);
    }
    json_decref(k->tools);
    free(k->prompt);
    free(k);
}

/* Streamed echo: the prompt's text (and its logprobs) as the first chunk,
 * when the first token came (with it the prefill's answer). */
static void stream_echo(choice_t *c)
{
    const call_t *k = c->k;
    char *text = NULL;
    size_t len = 0;
    c->echoed = true;
    if (k->logprobs) {
        const hpd_token_logprobs_t *plp = hpd_coord_prompt_logprobs(k->api->p.coord, k->request);
        if (plp != NULL)
            prepend_prompt_lp(c, plp);
    }
    if (hpd_tokenizer_decode(hpd_text_tokenizer(k->api->text), k->prompt, k->n_prompt, false,
                             &text, &len) == HPD_OK)
        stream_piece(c, text, len, false, false);
    free(text);
}

static bool on_tokens(void *arg, uint32_t choice, const int32_t *tokens,
                      const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                      uint32_t *keep_p)
{
    call_t *k = arg;
    if (choice >= k->n_ch)
        return false;
    choice_t *c = &k->ch[choice];
    if (k->echo && k->stream && !c->echoed && !k->gone)
        stream_echo(c);
    for (uint32_t i = from; i < n; i++) {
        *keep_p = i + 1;
        hpd_status_t st;
        /* the logprobs first: the piece's chunk carries them */
        if (lp != NULL && !add_lp(c, tokens[i], &lp[i])) {
            c->bad_token = true;
            return false;
        }
        const bool stop = hpd_answer_feed(&c->a, tokens[i], &st);
        if (st != HPD_OK) {
            c->bad_token = true;
            return false;
        }
        if (stop)
            return false;
    }
    return true;
}

static void on_close(struct evhttp_connection *evcon, void *arg);

static void on_done(void *arg, const hpd_coord_result_t *res)
{
    call_t *k = arg;
    bool bad = false;
    for (uint32_t i = 0; i < k->n_ch; i++)
        bad |= k->ch[i].bad_token;
    if (!k->gone)
        hpd_http_guard_set_closecb(k->api->guard, k->evcon, NULL, NULL);
    if (k->gone) {
        /* canceled for it: nobody to answer, but a request evhttp detached
         * from its closed connection is freed only by finishing it */
        if (k->detached && k->stream)
            evhttp_send_reply_end(k->req);
        else if (k->detached)
            evhttp_send_error(k->req, 499, NULL);
    } else if (res->outcome == HPD_COORD_FINISHED && !bad) {
        uint32_t completion = 0;
        json_t *choices = json_array();
        const char *finish0 = "";
        for (uint32_t i = 0; i < k->n_ch && i < res->n_choices; i++) {
            choice_t *c = &k->ch[i];
            hpd_answer_finish(&c->a);
            const char *finish = c->a.out.stopped ? "stop" : res->choices[i].finish_reason;
            if (c->n_calls > 0 && strcmp(finish, "stop") == 0)
                finish = "tool_calls";
            finish0 = i == 0 ? finish : finish0;
            completion += c->a.out.stopped ? c->a.out.n_ids : res->choices[i].n_tokens;
            if (k->stream) {
                send_event(k, envelope(k, json_pack("[o]", choice_json(c, "", 0, finish, false,
                                                                       false, NULL, 0))),
                           false);
                continue;
            }
            /* echo: the prompt's text first (and its logprobs) */
            if (k->echo) {
                char *ptext = NULL;
                size_t plen = 0;
                if (hpd_tokenizer_decode(hpd_text_tokenizer(k->api->text), k->prompt,
                                         k->n_prompt, false, &ptext, &plen) == HPD_OK)
                    evbuffer_prepend(c->text, ptext, plen);
                free(ptext);
                if (k->logprobs && res->prompt_logprobs != NULL)
                    prepend_prompt_lp(c, res->prompt_logprobs);
            }
            const size_t n = evbuffer_get_length(c->text);
            const char *all = (const char *)evbuffer_pullup(c->text, -1);
            const size_t nr = c->thought != NULL ? evbuffer_get_length(c->thought) : 0;
            const char *thought = nr > 0 ? (const char *)evbuffer_pullup(c->thought, -1) : NULL;
            json_t *choice = choice_json(c, all != NULL ? all : "", n, finish, false, false,
                                         thought, nr);
            if (k->chat && c->n_calls > 0) { /* the calls; content null when only space */
                json_t *m = json_object_get(choice, "message");
                size_t cn = n;
                while (cn > 0 && strchr(" \n\t\r", all[cn - 1]) != NULL)
                    cn--;
                json_object_set_new(m, "content", cn > 0 ? json_stringn(all, cn) : json_null());
                json_object_set(m, "tool_calls", c->calls);
            }
            if (k->return_ids) { /* the answer's ids (to a stop string's end), vLLM's names */
                const uint32_t nt = c->a.out.stopped ? c->a.out.n_ids : res->choices[i].n_tokens;
                json_object_set_new(choice, "token_ids", ids_json(res->choices[i].tokens, nt));
                if (!k->chat)
                    json_object_set_new(choice, "prompt_token_ids",
                                        ids_json(k->prompt, k->n_prompt));
            }
            json_array_append_new(choices, choice);
        }
        if (k->stream) {
            json_decref(choices);
            if (k->include_usage) {
                json_t *u = envelope(k, json_array());
                json_object_set_new(u, "usage", usage_json(k, completion, res->cached_tokens));
                send_event(k, u, false);
            }
            send_event(k, NULL, true);
            evhttp_send_reply_end(k->req);
        } else {
            json_t *j = envelope(k, choices);
            json_object_set_new(j, "usage", usage_json(k, completion, res->cached_tokens));
            if (k->return_ids && k->chat)
                json_object_set_new(j, "prompt_token_ids", ids_json(k->prompt, k->n_prompt));
            reply_json(k->req, 200, j);
        }
        HPD_LOGR_INFO(LOG_COMPONENT, res->request, "%s %s: %u tokens (%s)%s", k->id,
                      k->chat ? "chat" : "completion", completion, finish0,
                      k->n_ch > 1 ? " in its choices, the first's reason" : "");
    } else {
        int status = 500;
        char msg[600];
        if (k->peer_closed) /* answered to let evhttp free the connection */
            snprintf(msg, sizeof(msg), "the client went away"), status = 499;
        else if (bad)
            snprintf(msg, sizeof(msg), "the model generated a token the tokenizer does not "
                     "know (tokenizer.json and the model's vocabulary disagree)");
        else if (res->outcome == HPD_COORD_CANCELED)
            snprintf(msg, sizeof(msg), "canceled: %s", res->error), status = 503;
        else
            snprintf(msg, sizeof(msg), "%s", res->error), status = status_of(k->api, res->code);
        if (k->stream) {
            send_event(k, error_json(status, NULL, NULL, msg), false);
            send_event(k, NULL, true);
            evhttp_send_reply_end(k->req);
        } else {
            reply_json(k->req, status, error_json(status, NULL, NULL, msg));
        }
    }
    call_free(k);
}

/* The client went away: its request is canceled on every node (done then
 * frees the call). */
static void on_close(struct evhttp_connection *evcon, void *arg)
{
    call_t *k = arg;
    k->gone = true;
    hpd_metric_inc(k->api->gone, 1);
    /* a connection that failed (end of file, a timeout) hands the request
     * over; one freed at shutdown frees it itself */
    k->detached = evhttp_request_get_connection(k->req) == NULL;
    HPD_LOGR_INFO(LOG_COMPONENT, k->request, "%s: the HTTP client went away", k->id);
    hpd_coord_cancel(k->api->p.coord, k->request, "the HTTP client went away");
}

/* evhttp does not read from a connection whose reply is due, so it would
 * not see a non-streaming client leave: the call watches the socket itself.
 * End of file (or an error) there cancels the request; bytes (a pipelined
 * request) end the watch. */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    call_t *k = arg;
    char b;
    const ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    event_del(k->watch);
    if (n > 0)
        return;
    k->peer_closed = true;
    hpd_metric_inc(k->api->gone, 1);
    HPD_LOGR_INFO(LOG_COMPONENT, k->request, "%s: the HTTP client went away", k->id);
    hpd_coord_cancel(k->api->p.coord, k->request, "the HTTP client went away");
}

/* stop: a string or a list of strings */
static bool get_stops(struct evhttp_request *req, json_t *body, call_t *k)
{
    const json_t *s = json_object_get(body, "stop");
    json_t *one = NULL;
    if (s == NULL || json_is_null(s))
        return true;
    if (json_is_string(s))
        s = one = json_pack("[O]", s);
    if (!json_is_array(s) || json_array_size(s) > HPD_TEXT_MAX_STOPS) {
        json_decref(one);
        return BAD(req, "stop", "stop: expected a string or a list of at most %d strings",
                   HPD_TEXT_MAX_STOPS);
    }
    size_t i;
    json_t *v;
    json_array_foreach(s, i, v) {
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            json_string_length(v) > HPD_TEXT_MAX_STOP_LEN ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            json_decref(one);
            return BAD(req, "stop", "stop[%zu]: expected a string of 1 to %d bytes", i,
                       HPD_TEXT_MAX_STOP_LEN);
        }
        if ((k->stops[k->n_stops] = strdup(json_string_value(v))) == NULL) {
            json_decref(one);
            reply_error(req, 500, NULL, NULL, "out of memory");
            return false;
        }
        k->n_stops++;
    }
    json_decref(one);
    return true;
}

static void new_id(call_t *k, const char *prefix)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != sizeof(r))
        r = (uint64_t)time(NULL);
    snprintf(k->id, sizeof(k->id), "%s-%016llx%06llx", prefix, (unsigned long long)r,
             (unsigned long long)(++k->api->next_call & 0xffffff));
}

/* Log probabilities: chat's logprobs (true or false) and top_logprobs (0
 * to 20, with logprobs); completions' logprobs (0 to 20: the top ones). */
static bool get_logprobs(struct evhttp_request *req, json_t *body, call_t *k)
{
    json_int_t top = -1;
    if (!k->chat) {
        if (!get_uint(req, body, "logprobs", 0, HPD_MAX_TOP_LOGPROBS, &top) ||
            !get_bool(req, body, "echo", &k->echo))
            return false;
        k->logprobs = top >= 0;
        k->top_logprobs = top >= 0 ? (uint32_t)top : 0;
        return true;
    }
    const json_t *echo = json_object_get(body, "echo");
    if (echo != NULL && json_is_true(echo))
        return BAD(req, "echo", "echo: completions only");
    if (!get_bool(req, body, "logprobs", &k->logprobs) ||
        !get_uint(req, body, "top_logprobs", 0, HPD_MAX_TOP_LOGPROBS, &top))
        return false;
    if (top > 0 && !k->logprobs)
        return BAD(req, "top_logprobs", "top_logprobs: only with logprobs: true");
    k->top_logprobs = top > 0 ? (uint32_t)top : 0;
    return true;
}

/* POST /v1/completions and /v1/chat/completions */
static void generate(hpd_openai_t *api, struct evhttp_request *req, bool chat)
{
    char who[128];
    json_t *body;
    int32_t *prompt = NULL, *stop_ids = NULL;
    char *grammar = NULL;
    size_t n_prompt = 0, n_stop_ids = 0;
    call_t *k = NULL;

    if (!authorized(api, req, who, sizeof(who)) || (body = read_body(req)) == NULL)
        return;
    const json_t *model = json_object_get(body, "model");
    if (model != NULL && !json_is_null(model) &&
        (!json_is_string(model) || strcmp(json_string_value(model), api->model) != 0)) {
        reply_error(req, 404, "model", "model_not_found", "The model '%s' does not exist "
                    "(this cluster serves '%s')",
                    json_is_string(model) ? json_string_value(model) : "?", api->model);
        goto out;
    }
    if ((k = calloc(1, sizeof(*k))) == NULL) {
        reply_error(req, 500, NULL, NULL, "out of memory");
        goto out;
    }
    k->api = api;
    k->chat = chat;
    double temperature = NAN, top_p = NAN;
    json_int_t top_k = -2, seed = 0, max_tokens = -1, min_tokens = 0, n = 1;
    bool ignore_eos = false;
    if (!refuse_unsupported(req, body) || !get_bool(req, body, "stream", &k->stream) ||
        !get_uint(req, body, "n", 1, HPD_MAX_CHOICES, &n) ||
        !get_number(req, body, "temperature", 0, 1e6, &temperature) ||
        !get_number(req, body, "top_p", 1e-9, 1, &top_p) ||
        !get_uint(req, body, "top_k", -1, HPD_TOP_K_UNSET - 1, &top_k) ||
        !get_uint(req, body, "seed", 0, INT64_MAX, &seed) ||
        !get_uint(req, body, "max_tokens", 1, UINT32_MAX >> 1, &max_tokens) ||
        (chat && /* chat's newer name wins */
         !get_uint(req, body, "max_completion_tokens", 1, UINT32_MAX >> 1, &max_tokens)) ||
        !get_uint(req, body, "min_tokens", 0, UINT32_MAX >> 1, &min_tokens) ||
        !get_bool(req, body, "ignore_eos", &ignore_eos) || !get_stops(req, body, k) ||
        !get_logprobs(req, body, k) || !get_response_format(req, body, &grammar) ||
        !get_tools(api, req, body, k, &grammar) ||
        !get_bool(req, body, "return_token_ids", &k->return_ids))
        goto out;
    if (k->return_ids && k->stream) {
        reply_error(req, 400, "return_token_ids", NULL,
                    "return_token_ids: not with stream (the ids come in the answer)");
        goto out;
    }
    const json_t *so = json_object_get(body, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so)) {
            reply_error(req, 400, "stream_options", NULL, "stream_options: expected an object");
            goto out;
        }
        if (!k->stream) {
            reply_error(req, 400, "stream_options", NULL, "stream_options: only with stream");
            goto out;
        }
        if (!get_bool(req, (json_t *)so, "include_usage", &k->include_usage))
            goto out;
    }
    const json_t *sti = json_object_get(body, "stop_token_ids");
    if (sti != NULL && !json_is_null(sti) &&
        (!json_is_array(sti) ||
         !get_ids(req, sti, "stop_token_ids", hpd_tokenizer_size(hpd_text_tokenizer(api->text)),
                  &stop_ids, &n_stop_ids)))
        goto out;
    k->n_ch = (uint32_t)n;
    int thinking = -1;
    if (!(chat ? chat_prompt(api, req, body, &prompt, &n_prompt, &thinking)
               : completion_prompt(api, req, body, &prompt, &n_prompt)))
        goto out;
    /* a thinking model's chat: reasoning apart from content */
    k->split = chat && hpd_text_chat_thinks(api->text);
    if (max_tokens < 0) {
        uint32_t vocab, ctx;
        hpd_coord_limits(api->p.coord, &vocab, &ctx);
        max_tokens = !chat                 ? COMPLETIONS_DEFAULT_MAX_TOKENS
                     : ctx > n_prompt + 1 ? (json_int_t)(ctx - n_prompt)
                                           : 1; /* the rest of the context */
    }
    k->req = req;
    k->evcon = evhttp_request_get_connection(req);
    k->created = (long long)time(NULL);
    k->n_prompt = (uint32_t)n_prompt;
    if (k->echo || k->return_ids) { /* its ids, for its text and logprobs at the end */
        if ((k->prompt = malloc(n_prompt * sizeof(int32_t))) == NULL) {
            reply_error(req, 500, NULL, NULL, "out of memory");
            goto out;
        }
        memcpy(k->prompt, prompt, n_prompt * sizeof(int32_t));
        for (size_t i = 0; k->logprobs && i < n_prompt; i++) /* the answer's offsets after */
            k->ch[0].text_offset += token_chars(k, prompt[i]);
    }
    new_id(k, chat ? "chatcmpl" : "cmpl");
    for (uint32_t i = 0; i < k->n_ch; i++) { /* each choice's answer as it comes */
        choice_t *c = &k->ch[i];
        c->k = k;
        c->index = i;
        c->text_offset = k->ch[0].text_offset;
        hpd_answer_init(&c->a, &(hpd_answer_params_t){
                                   .text = api->text,
                                   .stops = (const char *const *)k->stops,
                                   .n_stops = k->n_stops,
                                   .split = k->split,
                                   .opens_think = hpd_text_chat_opens_think(api->text, thinking),
                                   .parse_calls = k->parse_calls,
                                   .format = k->tc_format,
                                   .tools = k->tools,
                                   .ops = &answer_ops,
                                   .arg = c});
        if (k->parse_calls)
            c->calls = json_array();
        if (!k->stream && ((c->text = evbuffer_new()) == NULL ||
                           (k->split && (c->thought = evbuffer_new()) == NULL))) {
            reply_error(req, 500, NULL, NULL, "out of memory");
            goto out;
        }
    }
    const hpd_coord_request_t q = {
        .prompt = prompt,
        .n_prompt = (uint32_t)n_prompt,
        .max_tokens = (uint32_t)max_tokens,
        .sampling = {.temperature = (float)temperature,
                     .top_p = (float)top_p,
                     .top_k = top_k == -2   ? HPD_TOP_K_UNSET
                              : top_k == -1 ? 0 /* vLLM's "all" */
                                            : (uint32_t)top_k,
                     .seed = (uint64_t)seed},
        .stop_ids = stop_ids,
        .n_stop = (uint32_t)n_stop_ids,
        .min_tokens = (uint32_t)min_tokens,
        .ignore_eos = ignore_eos,
        .who = who,
        .stream = k->stream,
        .logprobs = k->logprobs,
        .top_logprobs = k->top_logprobs,
        .prompt_logprobs = k->echo && k->logprobs,
        .grammar = grammar,
        .grammar_len = grammar != NULL ? strlen(grammar) : 0,
        .grammar_after_think = k->split && k->ch[0].a.rs.state == HPD_REASONING_INSIDE,
        .n = k->n_ch};
    const hpd_coord_sink_t sink = {.tokens = on_tokens, .done = on_done, .arg = k};
    char err[400];
    const int64_t code = hpd_coord_submit(api->p.coord, &q, &sink, &k->request, err, sizeof(err));
    if (code != 0) {
        const char *msg = strncmp(err, "generate: ", 10) == 0 ? err + 10 : err;
        reply_error(req, status_of(api, code), NULL,
                    code == HPD_RPC_ERR_OVERLOADED    ? "overloaded"
                    : code == HPD_RPC_ERR_NOT_LEADER ? "not_leader"
                                                     : NULL,
                    "%s", msg);
        goto out;
    }
    if (k->stream) {
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "Content-Type", "text/event-stream");
        evhttp_add_header(h, "Cache-Control", "no-cache");
        evhttp_send_reply_start(req, 200, "OK");
        for (uint32_t i = 0; chat && i < k->n_ch; i++)
            stream_piece(&k->ch[i], "", 0, true, false);
    }
    hpd_http_guard_set_closecb(api->guard, k->evcon, on_close, k);
    if (!k->stream) {
        const evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(k->evcon));
        if (fd >= 0 && (k->watch = event_new(api->p.base, fd, EV_READ | EV_PERSIST, on_readable,
                                             k)) != NULL)
            event_add(k->watch, NULL);
    }
    k = NULL; /* the sink's now */
out:
    if (k != NULL)
        call_free(k);
    free(prompt);
    free(stop_ids);
    free(grammar);
    json_decref(body);
}

/* ------------------------------------------------------------ the rest */

static json_t *model_json(const hpd_openai_t *api)
{
    uint32_t vocab, ctx;
    hpd_coord_limits(api->p.coord, &vocab, &ctx);
    return json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", api->model, "object", "model",
                     "created", (json_int_t)api->created, "owned_by", "hybridpd",
                     "max_model_len", (json_int_t)ctx);
}

/* POST /tokenize: {prompt} or {messages}; POST /detokenize: {tokens} */
static void tokenize(hpd_openai_t *api, struct evhttp_request *req, bool encode)
{
    char who[128];
    json_t *body;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!authorized(api, req, who, sizeof(who)) || (body = read_body(req)) == NULL)
        return;
    const hpd_tokenizer_t *tok = hpd_text_tokenizer(api->text);
    if (encode) {
        const bool chat = json_object_get(body, "messages") != NULL;
        int thinking;
        if (chat ? chat_prompt(api, req, body, &ids, &n, &thinking)
                 : completion_prompt(api, req, body, &ids, &n)) {
            uint32_t vocab, ctx;
            hpd_coord_limits(api->p.coord, &vocab, &ctx);
            json_t *a = json_array();
            for (size_t i = 0; i < n; i++)
                json_array_append_new(a, json_integer(ids[i]));
            reply_json(req, 200, json_pack("{s:I, s:I, s:o}", "count", (json_int_t)n,
                                           "max_model_len", (json_int_t)ctx, "tokens", a));
        }
    } else {
        const json_t *t = json_object_get(body, "tokens");
        char *text = NULL;
        size_t len;
        if (!json_is_array(t)) {
            reply_error(req, 400, "tokens", NULL, "tokens: expected an array of token ids");
        } else if (get_ids(req, t, "tokens", hpd_tokenizer_size(tok), &ids, &n)) {
            if (hpd_tokenizer_decode(tok, ids, n, false, &text, &len) != HPD_OK)
                reply_error(req, 500, NULL, NULL, "cannot decode");
            else
                reply_json(req, 200, json_pack("{s:s%}", "prompt", text, len));
            free(text);
        }
    }
    free(ids);
    json_decref(body);
}

/* An answer was written (evhttp does not call this when the write failed:
 * those clients are counted as gone). */
static void on_complete(struct evhttp_request *req, void *arg)
{
    hpd_openai_t *api = arg;
    const int status = evhttp_request_get_response_code(req);
    size_t i = 0;
    while (i < N_STATUSES && statuses[i] != status)
        i++;
    hpd_metric_inc(api->answered[i], 1);
}

/* The guard's screen (transport/http_guard.h): a request's head, before
 * evhttp reads its body. A client key admits the connection; /health is
 * open; anything else is answered 401 here, its body never buffered. */
static hpd_http_verdict_t screen(void *arg, const hpd_http_head_t *head, hpd_http_answer_t *a)
{
    hpd_openai_t *api = arg;
    char who[128];
    const char *key = "";
    if (strcmp(head->method, "GET") == 0 && strcmp(head->path, "/health") == 0)
        return HPD_HTTP_PUBLIC;
    if (head->authorization != NULL && strncasecmp(head->authorization, "Bearer ", 7) == 0)
        for (key = head->authorization + 7; *key == ' '; key++)
            ;
    if ((hpd_coord_authenticate(api->p.coord, key, strlen(key), who, sizeof(who),
                                &a->credential) &
         HPD_ROLE_CLIENT) != 0)
        return HPD_HTTP_ADMIT;
    json_t *j = error_json(401, NULL, "invalid_api_key",
                           head->authorization == NULL
                               ? "no API key: send 'Authorization: Bearer KEY' with a client key"
                               : "the API key is not a client key of this cluster");
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    a->status = 401;
    a->content_type = "application/json";
    snprintf(a->body, sizeof(a->body), "%s\n", text != NULL ? text : "{}");
    free(text);
    hpd_metric_inc(api->answered[2], 1); /* statuses[2] is 401 */
    return HPD_HTTP_REJECT;
}

static bool revoked(uint64_t credential, void *arg)
{
    const hpd_openai_t *api = arg;
    return !hpd_coord_grants(api->p.coord, credential, HPD_ROLE_CLIENT);
}

void hpd_openai_collect(hpd_openai_t *api)
{
    hpd_http_guard_stats_t st;
    hpd_http_guard_stats(api->guard, &st);
    hpd_metric_set(api->conns[0], st.open - st.unauthenticated);
    hpd_metric_set(api->conns[1], st.unauthenticated);
    size_t i = 0;
#define SET(label, field) hpd_metric_set(api->closed[i++], (double)st.field);
    HPD_HTTP_CLOSED(SET)
#undef SET
}

uint32_t hpd_openai_reload(hpd_openai_t *api)
{
    return hpd_http_guard_close_if(api->guard, revoked, api);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    hpd_openai_t *api = arg;
    evhttp_request_set_on_complete_cb(req, on_complete, api);
    const char *uri = evhttp_request_get_uri(req);
    const enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    char path[512], who[128];
    const size_t plen = strcspn(uri, "?");
    snprintf(path, sizeof(path), "%.*s", (int)(plen < sizeof(path) ? plen : sizeof(path) - 1),
             uri);
    const bool post = cmd == EVHTTP_REQ_POST, get = cmd == EVHTTP_REQ_GET;
    if (post && strcmp(path, "/v1/completions") == 0) {
        generate(api, req, false);
    } else if (post && strcmp(path, "/v1/chat/completions") == 0) {
        generate(api, req, true);
    } else if (post && strcmp(path, "/tokenize") == 0) {
        tokenize(api, req, true);
    } else if (post && strcmp(path, "/detokenize") == 0) {
        tokenize(api, req, false);
    } else if (get && strcmp(path, "/v1/models") == 0) {
        if (authorized(api, req, who, sizeof(who)))
            reply_json(req, 200, json_pack("{s:s, s:[o]}", "object", "list", "data",
                                           model_json(api)));
    } else if (get && strncmp(path, "/v1/models/", 11) == 0) {
        if (!authorized(api, req, who, sizeof(who)))
            return;
        if (strcmp(path + 11, api->model) == 0)
            reply_json(req, 200, model_json(api));
        else
            reply_error(req, 404, "model", "model_not_found", "The model '%s' does not exist",
                        path + 11);
    } else if (get && strcmp(path, "/health") == 0) {
        const bool ok = !hpd_coord_draining(api->p.coord);
        reply_json(req, ok ? 200 : 503, json_pack("{s:s}", "status", ok ? "ok" : "draining"));
    } else {
        reply_error(req, 404, NULL, "not_found", "%s %s: no such endpoint (POST "
                    "/v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET "
                    "/v1/models)", post ? "POST" : get ? "GET" : "?", path);
    }
}

hpd_status_t hpd_openai_create(const hpd_openai_params_t *p, hpd_openai_t **api_p, char *err,
                               size_t err_len)
{
    hpd_openai_t *api = calloc(1, sizeof(*api));
    hpd_status_t st;
    *api_p = NULL;
    if (api == NULL)
        return HPD_ERR_NO_MEMORY;
    api->p = *p;
    api->created = (long long)time(NULL);
    if (p->model_name != NULL && p->model_name[0] != '\0') {
        snprintf(api->model, sizeof(api->model), "%s", p->model_name);
    } else { /* the directory's last part */
        size_t len = strlen(p->model_dir);
        while (len > 1 && p->model_dir[len - 1] == '/')
            len--;
        size_t b = len;
        while (b > 0 && p->model_dir[b - 1] != '/')
            b--;
        snprintf(api->model, sizeof(api->model), "%.*s", (int)(len - b), p->model_dir + b);
    }
    st = HPD_ERR_NO_MEMORY;
    hpd_metrics_t *reg = hpd_coord_metrics(p->coord);
    static const char help[] = "HTTP API answers written, by status.";
    for (size_t i = 0; i <= N_STATUSES; i++) {
        char labels[32];
        if (i < N_STATUSES)
            snprintf(labels, sizeof(labels), "status=\"%d\"", statuses[i]);
        else
            snprintf(labels, sizeof(labels), "status=\"other\"");
        if ((api->answered[i] = hpd_metrics_add(reg, HPD_METRIC_COUNTER,
                                                "hpd_http_responses_total", help, labels)) ==
            NULL)
            goto fail;
    }
    if ((api->gone = hpd_metrics_add(reg, HPD_METRIC_COUNTER, "hpd_http_client_gone_total",
                                     "HTTP clients that closed their connection before their "
                                     "answer (the request was canceled).", NULL)) == NULL)
        goto fail;
    static const char conn_help[] = "open HTTP API connections, by state.";
    static const char closed_help[] = "HTTP API connections closed or refused by the server "
                                      "before they were admitted, and admitted ones closed "
                                      "because their key was revoked, by reason.";
    if ((api->conns[0] = hpd_metrics_add(reg, HPD_METRIC_GAUGE, "hpd_http_connections",
                                         conn_help, "state=\"authenticated\"")) == NULL ||
        (api->conns[1] = hpd_metrics_add(reg, HPD_METRIC_GAUGE, "hpd_http_connections",
                                         conn_help, "state=\"unauthenticated\"")) == NULL)
        goto fail;
    size_t ci = 0;
#define ADD(label, field)                                                                   \
    if ((api->closed[ci++] = hpd_metrics_add(reg, HPD_METRIC_COUNTER,                       \
                                             "hpd_http_connections_closed_total",           \
                                             closed_help, "reason=\"" #label "\"")) == NULL) \
        goto fail;
    HPD_HTTP_CLOSED(ADD)
#undef ADD
    if ((api->text = hpd_coord_text(p->coord)) == NULL) {
        snprintf(err, err_len, "the HTTP API needs the coordinator's model directory (--model)");
        st = HPD_ERR_INVALID_ARG;
        goto fail;
    }
    st = HPD_ERR_NO_MEMORY;
    if ((api->http = evhttp_new(p->base)) == NULL)
        goto fail;
    evhttp_set_allowed_methods(api->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_max_headers_size(api->http, 64u << 10);
    evhttp_set_max_body_size(api->http, HPD_OPENAI_MAX_BODY + 1);
    evhttp_set_timeout(api->http, HTTP_TIMEOUT_S);
    evhttp_set_gencb(api->http, on_request, api);
    const hpd_http_guard_params_t gp = {.base = p->base,
                                        .budget = p->budget,
                                        .cls = HPD_CONN_SERVE,
                                        .name = "http api",
                                        .max_head = 64u << 10,
                                        .screen = screen,
                                        .arg = api};
    if (hpd_http_guard_create(api->http, &gp, &api->guard) != HPD_OK)
        goto fail;
    if (hpd_http_guard_bind(api->guard, p->host, p->port, &api->port) != HPD_OK) {
        snprintf(err, err_len, "the HTTP API cannot listen on %s:%u (taken?)", p->host, p->port);
        st = HPD_ERR_IO;
        goto fail;
    }
    *api_p = api;
    return HPD_OK;
fail:
    hpd_openai_destroy(api);
    return st;
}

uint16_t hpd_openai_port(const hpd_openai_t *api)
{
    return api->port;
}

const char *hpd_openai_model(const hpd_openai_t *api)
{
    return api->model;
}

void hpd_openai_destroy(hpd_openai_t *api)
{
    if (api == NULL)
        return;
    if (api->http != NULL)
        evhttp_free(api->http);
    hpd_http_guard_destroy(api->guard);
    free(api);
}
