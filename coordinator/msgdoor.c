/* The msgpack front door (coordinator/msgdoor.h), a peer of openai.c: it
 * turns a client's generate call into a coordinator request
 * (hpd_coord_submit) and its answer, or its stream, back into msgpack. */
#include "coordinator/msgdoor.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/answer.h"
#include "coordinator/chatreq.h"
#include "coordinator/coordinator.h"
#include "coordinator/reasoning.h"
#include "coordinator/text.h"
#include "coordinator/toolcall.h"
#include "node/msg.h"
#include "node/proto.h"

#define LOG_COMPONENT "coordinator"

struct rpc_sink;

/* One choice of a msgpack client's request, as text. */
typedef struct {
    struct rpc_sink *s;
    uint32_t index;
    hpd_answer_t a; /* with detokenize: its text (coordinator/answer.h) */
    char *text;     /* the answer's text so far */
    size_t text_len, text_cap;
    char *reasoning; /* a thinking model's chat: its reasoning apart */
    size_t reasoning_len, reasoning_cap;
    bool bad_token;
    json_t *calls; /* tools: the calls so far */
} rpc_choice_t;

/* A msgpack client's request: its generate call is answered at the end,
 * its tokens streamed as notifications when it asked. */
typedef struct rpc_sink {
    hpd_rpc_conn_t *conn; /* a reference held until the end */
    uint32_t call_id;
    uint64_t tag;
    uint64_t call_key; /* random: its tool calls' ids */
    bool stream;
    bool detokenize; /* the answer as text too (out), with the stop strings */
    char *stops[HPD_TEXT_MAX_STOPS];
    size_t n_stops;
    uint32_t top_logprobs; /* the request asked for logprobs with these top ones */
    bool split;            /* a thinking model's chat */
    hpd_chatreq_tools_t tools; /* a chat's tools (coordinator/chatreq.h) */
    rpc_choice_t ch[HPD_MAX_CHOICES];
    uint32_t n_ch;
} rpc_sink_t;

static void rpc_sink_free(rpc_sink_t *s)
{
    for (size_t i = 0; i < s->n_stops; i++)
        free(s->stops[i]);
    for (uint32_t k = 0; k < s->n_ch; k++) {
        if (s->detokenize)
            hpd_answer_free(&s->ch[k].a);
        free(s->ch[k].text);
        free(s->ch[k].reasoning);
        json_decref(s->ch[k].calls);
    }
    hpd_chatreq_tools_free(&s->tools);
    free(s);
}

/* Appends a piece of a choice's content or reasoning. */
static void append(rpc_choice_t *ch, bool reasoning, const char *piece, size_t len)
{
    char **buf = reasoning ? &ch->reasoning : &ch->text;
    size_t *n = reasoning ? &ch->reasoning_len : &ch->text_len;
    size_t *cap = reasoning ? &ch->reasoning_cap : &ch->text_cap;
    if (hpd_grow(buf, cap, *n + len + 1, 1) != HPD_OK) {
        ch->bad_token = true; /* (out of memory: the answer is refused) */
        return;
    }
    memcpy(*buf + *n, piece, len);
    *n += len;
}

static void answer_content(void *arg, const char *piece, size_t len)
{
    append(arg, false, piece, len);
}

static void answer_reasoning(void *arg, const char *piece, size_t len)
{
    append(arg, true, piece, len);
}

/* A whole tool call of a choice's content (docs/api.md, "Tool calls"). */
static void tc_call(void *arg, uint32_t index, const char *name, const char *arguments)
{
    rpc_choice_t *ch = arg;
    char id[96], of[16] = "";
    if (ch->s->tools.one_call && index > 0)
        return;
    if (ch->s->n_ch > 1)
        snprintf(of, sizeof(of), "%u_", ch->index);
    snprintf(id, sizeof(id), "call_%016llx_%s%u", (unsigned long long)ch->s->call_key, of, index);
    if (json_array_append_new(ch->calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                                   "function", "function", "name", name,
                                                   "arguments", arguments)) != 0)
        ch->bad_token = true; /* (out of memory) */
}

static const hpd_answer_ops_t answer_ops = {
    .content = answer_content, .reasoning = answer_reasoning, .call = tc_call};

/* Calls [from, ..) of a choice as a JSON array's text (malloc'd; NULL:
 * none). */
static char *calls_text(const rpc_choice_t *ch, size_t from)
{
    if (ch->calls == NULL || json_array_size(ch->calls) <= from)
        return NULL;
    json_t *a = json_array();
    for (size_t i = from; i < json_array_size(ch->calls); i++)
        json_array_append(a, json_array_get(ch->calls, i));
    char *text = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return text;
}

static bool rpc_tokens(void *arg, uint32_t k, const int32_t *out, const hpd_token_logprobs_t *lp,
                       uint32_t from, uint32_t n, uint32_t *keep_p)
{
    rpc_sink_t *s = arg;
    rpc_choice_t *ch = &s->ch[k];
    hpd_rpc_buf_t b;
    const size_t text_before = ch->text_len, reasoning_before = ch->reasoning_len;
    const size_t calls_before = ch->calls != NULL ? json_array_size(ch->calls) : 0;
    bool more = true;
    uint32_t upto = n;
    for (uint32_t i = from; s->detokenize && i < n && more; i++) {
        hpd_status_t st;
        more = !hpd_answer_feed(&ch->a, out[i], &st);
        if (st != HPD_OK || ch->bad_token) {
            ch->bad_token = true;
            more = false;
        }
        upto = i + 1;
    }
    if (s->stream) {
        /* the ids' log probabilities, when asked for */
        uint32_t wire_len;
        uint8_t *wire = hpd_logprobs_wire(lp != NULL ? lp + from : NULL, upto - from,
                                          s->top_logprobs, &wire_len);
        char *calls = calls_text(ch, calls_before);
        hpd_rpc_buf_init(&b);
        hpd_msg_pack(&hpd_msg_stream,
                     &(hpd_msg_stream_t){
                         .tag = s->tag,
                         .index = from,
                         .ids = out + from,
                         .ids_n = upto - from,
                         .text = ch->text + text_before,
                         .text_len = (uint32_t)(ch->text_len - text_before),
                         .reasoning = ch->reasoning + reasoning_before,
                         .reasoning_len = (uint32_t)(ch->reasoning_len - reasoning_before),
                         .logprobs = wire,
                         .logprobs_len = wire_len,
                         .choice = k,
                         .tool_calls = calls,
                         .tool_calls_len = calls != NULL ? (uint32_t)strlen(calls) : 0},
                     &b.pk);
        hpd_rpc_notify(s->conn, "tokens", &b);
        hpd_rpc_buf_destroy(&b);
        free(wire);
        free(calls);
    }
    *keep_p = upto;
    return more;
}

/* A choice's finish reason: tool_calls when it stopped after a call. */
static const char *finish_of(const rpc_choice_t *ch, const char *finish)
{
    return ch->calls != NULL && json_array_size(ch->calls) > 0 && strcmp(finish, "stop") == 0
               ? "tool_calls"
               : finish;
}

/* The reply's choices (n > 1): one map each, packed into b. */
static void pack_choices(rpc_sink_t *s, const hpd_coord_result_t *res, hpd_rpc_buf_t *b)
{
    msgpack_pack_array(&b->pk, res->n_choices);
    for (uint32_t k = 0; k < res->n_choices; k++) {
        const hpd_coord_choice_t *rc = &res->choices[k];
        const rpc_choice_t *ch = &s->ch[k];
        hpd_msg_choice_t m = {.index = k,
                              .tokens = rc->tokens,
                              .tokens_n = rc->n_tokens,
                              .text = ch->text,
                              .text_len = (uint32_t)ch->text_len,
                              .reasoning = ch->reasoning,
                              .reasoning_len = (uint32_t)ch->reasoning_len};
        snprintf(m.finish_reason, sizeof(m.finish_reason), "%s",
                 finish_of(ch, rc->finish_reason));
        uint8_t *wire = hpd_logprobs_wire(rc->logprobs, rc->n_tokens, res->top_logprobs,
                                      &m.logprobs_len);
        char *calls = calls_text(ch, 0);
        m.logprobs = wire;
        m.tool_calls = calls;
        m.tool_calls_len = calls != NULL ? (uint32_t)strlen(calls) : 0;
        hpd_msg_pack(&hpd_msg_choice, &m, &b->pk);
        free(wire);
        free(calls);
    }
}

static void rpc_done(void *arg, const hpd_coord_result_t *res)
{
    rpc_sink_t *s = arg;
    bool bad = false;
    for (uint32_t k = 0; k < s->n_ch; k++)
        bad |= s->ch[k].bad_token;
    if (res->outcome == HPD_COORD_FINISHED && bad) {
        hpd_rpc_reply_error(s->conn, s->call_id, HPD_RPC_ERR_INTERNAL, "generate: the model "
                            "made a token its tokenizer does not know (or out of memory)");
    } else if (res->outcome == HPD_COORD_FINISHED) {
        for (uint32_t k = 0; k < s->n_ch && s->detokenize; k++) {
            hpd_answer_finish(&s->ch[k].a);
        }
        const rpc_choice_t *c0 = &s->ch[0];
        hpd_msg_generated_t g = {.request = res->request,
                                 .tokens = res->tokens,
                                 .tokens_n = res->n_tokens,
                                 .text = c0->text,
                                 .text_len = (uint32_t)c0->text_len,
                                 .reasoning = c0->reasoning,
                                 .reasoning_len = (uint32_t)c0->reasoning_len,
                                 .prompt_tokens = res->prompt_tokens,
                                 .cached_tokens = res->cached_tokens,
                                 .attempts = res->attempts,
                                 .ttft_ms = res->ttft_ms,
                                 .total_ms = res->total_ms,
                                 .prefill_ms = res->prefill_ms,
                                 .push_ms = res->push_ms,
                                 .exposed_push_ms = res->exposed_push_ms};
        snprintf(g.finish_reason, sizeof(g.finish_reason), "%s",
                 finish_of(c0, res->finish_reason));
        char *calls = calls_text(c0, 0);
        g.tool_calls = calls;
        g.tool_calls_len = calls != NULL ? (uint32_t)strlen(calls) : 0;
        uint8_t *wire = NULL, *pwire = NULL;
        if (res->prompt_logprobs != NULL && res->prompt_tokens > 1) {
            pwire = hpd_logprobs_wire(res->prompt_logprobs, res->prompt_tokens - 1,
                                  res->top_logprobs, &g.prompt_logprobs_len);
            g.prompt_logprobs = pwire;
            g.top_logprobs = res->top_logprobs;
        }
        if ((wire = hpd_logprobs_wire(res->logprobs, res->n_tokens, res->top_logprobs,
                                  &g.logprobs_len)) != NULL) {
            g.logprobs = wire;
            g.top_logprobs = res->top_logprobs;
        }
        hpd_rpc_buf_t b, chs;
        hpd_rpc_buf_init(&chs);
        if (res->n_choices > 1) {
            pack_choices(s, res, &chs);
            g.choices_raw = chs.sb.data;
            g.choices_raw_len = (uint32_t)chs.sb.size;
        }
        hpd_rpc_buf_init(&b);
        hpd_msg_pack(&hpd_msg_generated, &g, &b.pk);
        hpd_rpc_reply(s->conn, s->call_id, &b);
        hpd_rpc_buf_destroy(&b);
        hpd_rpc_buf_destroy(&chs);
        free(wire);
        free(pwire);
        free(calls);
    } else if (res->outcome == HPD_COORD_FAILED) {
        hpd_rpc_reply_error(s->conn, s->call_id, res->code, "%s", res->error);
    } else { /* a closed connection is not answered (nothing is sent) */
        hpd_rpc_reply_error(s->conn, s->call_id, HPD_RPC_ERR_APP, "canceled");
    }
    hpd_rpc_conn_unref(s->conn);
    rpc_sink_free(s);
}

/* A msgpack chat's messages as coordinator/chatreq.h takes them (JSON):
 * role, content, reasoning_content and tool_call_id strings; tool_calls
 * the text of a JSON array (OpenAI's calls). NULL with err set. */
static json_t *messages_json(const msgpack_object *m, char *err, size_t err_len)
{
    static const char *const keys[] = {"role", "content", "reasoning_content", "tool_call_id",
                                       "tool_calls"};
    if (m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size == 0 ||
        m->via.array.size > HPD_TEXT_MAX_MESSAGES) {
        snprintf(err, err_len, "generate: messages: expected an array of 1 to %d maps",
                 HPD_TEXT_MAX_MESSAGES);
        return NULL;
    }
    json_t *out = json_array();
    for (uint32_t i = 0; out != NULL && i < m->via.array.size; i++) {
        json_t *o = json_object();
        json_array_append_new(out, o);
        for (size_t k = 0; o != NULL && k < HPD_ARRAY_SIZE(keys); k++) {
            const msgpack_object *v = hpd_rpc_map_get(&m->via.array.ptr[i], keys[k]);
            json_t *x = NULL;
            json_error_t je;
            if (v == NULL && k == 0) {
                snprintf(err, err_len, "generate: messages[%u].role: missing", i);
                goto bad;
            }
            if (v == NULL || v->type == MSGPACK_OBJECT_NIL)
                continue; /* no content is empty */
            if (v->type != MSGPACK_OBJECT_STR && (k < 4 || v->type != MSGPACK_OBJECT_BIN)) {
                snprintf(err, err_len, "generate: messages[%u].%s: expected a string%s", i,
                         keys[k], k == 4 ? " (a JSON array's text)" : "");
                goto bad;
            }
            if (k < 4 && (x = json_stringn(v->via.str.ptr, v->via.str.size)) == NULL) {
                snprintf(err, err_len, "generate: messages[%u].%s: not UTF-8", i, keys[k]);
                goto bad;
            }
            if (k == 4 && (x = json_loadb(v->via.bin.ptr, v->via.bin.size, 0, &je)) == NULL) {
                snprintf(err, err_len, "generate: messages[%u].tool_calls: not JSON (%s)", i,
                         je.text);
                goto bad;
            }
            json_object_set_new(o, keys[k], x);
        }
    }
    if (out == NULL)
        snprintf(err, err_len, "generate: out of memory");
    return out;
bad:
    json_decref(out);
    return NULL;
}

/* A generate's prompt given as text or as a chat: its ids (the model's
 * tokenizer and chat format). False with err when it cannot be. */
static bool text_prompt(hpd_coord_t *c, const hpd_msg_generate_t *g, const json_t *tools,
                        int32_t **ids_p, size_t *n_p, char *err, size_t err_len)
{
    if (hpd_coord_text(c) == NULL) {
        snprintf(err, err_len, "generate: a prompt as text or messages needs the "
                 "coordinator's model (--model): send token ids");
        return false;
    }
    if (g->prompt_n > 0 || (g->text_len > 0 && g->messages != NULL)) {
        snprintf(err, err_len, "generate: give one of prompt, text and messages");
        return false;
    }
    if (g->text_len > 0) {
        if (hpd_tokenizer_encode(hpd_text_tokenizer(hpd_coord_text(c)), g->text, g->text_len, ids_p,
                                 n_p) == HPD_OK)
            return true;
        snprintf(err, err_len, "generate: text: cannot be encoded");
        return false;
    }
    json_t *msgs = messages_json(g->messages, err, err_len);
    bool ok = msgs != NULL;
    if (ok) {
        hpd_chatreq_err_t e;
        const int thinking = g->thinking == 0 ? hpd_coord_default_thinking(c) : g->thinking == 1;
        ok = hpd_chatreq_prompt(hpd_coord_text(c), msgs, tools, thinking, ids_p, n_p, &e);
        if (!ok)
            snprintf(err, err_len, "generate: %.200s", e.msg);
    }
    json_decref(msgs);
    return ok;
}

/* The stop strings of a detokenizing generate, copied into s. */
static bool stop_strings(const hpd_msg_generate_t *g, rpc_sink_t *s, char *err, size_t err_len)
{
    if (g->stop == NULL)
        return true;
    const msgpack_object *o = g->stop;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > HPD_TEXT_MAX_STOPS) {
        snprintf(err, err_len, "generate: stop: expected at most %d strings", HPD_TEXT_MAX_STOPS);
        return false;
    }
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *v = &o->via.array.ptr[i];
        if (v->type != MSGPACK_OBJECT_STR || v->via.str.size == 0 ||
            v->via.str.size > HPD_TEXT_MAX_STOP_LEN ||
            memchr(v->via.str.ptr, 0, v->via.str.size) != NULL) {
            snprintf(err, err_len, "generate: stop[%u]: expected a string of 1 to %d bytes", i,
                     HPD_TEXT_MAX_STOP_LEN);
            return false;
        }
        if ((s->stops[s->n_stops] = strndup(v->via.str.ptr, v->via.str.size)) == NULL) {
            snprintf(err, err_len, "generate: out of memory");
            return false;
        }
        s->n_stops++;
    }
    return true;
}

/* A chat's tools (tools, tool_choice, single_tool_call) into s->tools;
 * with them the answer is decoded, its content parsed for calls unless
 * tool_choice is none. */
/* A chat's tools (OpenAI's array as JSON text) read once, for the prompt
 * and the answer (*tools_p NULL: none). */
static bool tools_json(const hpd_msg_generate_t *g, json_t **tools_p, char *err, size_t err_len)
{
    json_error_t je;
    *tools_p = NULL;
    if (g->tools == NULL && g->tool_choice == NULL)
        return true;
    if (g->messages == NULL) {
        snprintf(err, err_len, "generate: tools: only with messages (a chat)");
        return false;
    }
    if (g->tools != NULL && (*tools_p = json_loadb(g->tools, g->tools_len, 0, &je)) == NULL) {
        snprintf(err, err_len, "generate: tools: not JSON (%s)", je.text);
        return false;
    }
    return true;
}

static bool chat_tools(hpd_coord_t *c, const hpd_msg_generate_t *g, const json_t *tools,
                       rpc_sink_t *s, char *err, size_t err_len)
{
    if (g->tools == NULL && g->tool_choice == NULL)
        return true;
    json_error_t je;
    json_t *choice = NULL;
    hpd_chatreq_err_t e;
    bool ok = false;
    if (g->tool_choice != NULL && (choice = json_loadb(g->tool_choice, g->tool_choice_len,
                                                       JSON_DECODE_ANY, &je)) == NULL)
        snprintf(err, err_len, "generate: tool_choice: not JSON (%s)", je.text);
    else if (!(ok = hpd_chatreq_tools(hpd_coord_text(c), tools, choice, !g->single_tool_call,
                                      g->grammar != NULL, &s->tools, &e)))
        snprintf(err, err_len, "generate: %.200s", e.msg);
    json_decref(choice);
    s->detokenize = true; /* a chat with tools is answered in text (calls apart) */
    return ok;
}

void hpd_msgdoor_generate(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg)
{
    hpd_coord_t *c = arg;
    hpd_proto_err_t err = {{0}};
    hpd_msg_generate_t g = {.max_tokens = 16, .top_p = 1}; /* the defaults: greedy */
    rpc_sink_t *s = NULL;
    uint64_t req_id;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char why[sizeof(err.text)];

    if (!hpd_msg_unpack(&hpd_msg_generate, params, &g, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text); /* "generate: ..." */
        hpd_coord_count_invalid(c);
        return;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "generate: out of memory");
        hpd_msg_free(&hpd_msg_generate, &g);
        return;
    }
    *s = (rpc_sink_t){.conn = conn,
                      .call_id = id,
                      .tag = g.tag,
                      .stream = g.stream,
                      .detokenize = g.detokenize || g.stop != NULL,
                      .top_logprobs = g.top_logprobs};
    bool ok = true;
    if (s->detokenize && hpd_coord_text(c) == NULL) {
        snprintf(why, sizeof(why), "generate: detokenize and stop need the coordinator's "
                 "model (--model)");
        ok = false;
    }
    json_t *tools = NULL;
    ok = ok && tools_json(&g, &tools, why, sizeof(why)) &&
         ((g.text_len == 0 && g.messages == NULL) ||
          text_prompt(c, &g, tools, &ids, &n_ids, why, sizeof(why))) &&
         stop_strings(&g, s, why, sizeof(why)) && chat_tools(c, &g, tools, s, why, sizeof(why));
    json_decref(tools);
    if (!ok) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", why);
        hpd_coord_count_invalid(c);
        hpd_msg_free(&hpd_msg_generate, &g);
        rpc_sink_free(s);
        free(ids);
        return;
    }
    s->n_ch = HPD_MIN(HPD_MAX(1u, g.n), (uint32_t)HPD_MAX_CHOICES); /* (submit checks n) */
    if (getrandom(&s->call_key, sizeof(s->call_key), 0) != sizeof(s->call_key))
        s->call_key = (uint64_t)(hpd_time_now() * 1e6) ^ id;
    for (uint32_t k = 0; k < s->n_ch; k++) {
        s->ch[k].s = s;
        s->ch[k].index = k;
        if (s->tools.parse_calls)
            s->ch[k].calls = json_array();
    }
    /* a thinking model's chat: the reasoning apart */
    const hpd_text_t *text = hpd_coord_text(c);
    const int thinking = g.thinking == 0 ? hpd_coord_default_thinking(c) : g.thinking == 1;
    s->split = s->detokenize && g.messages != NULL && hpd_text_chat_thinks(text);
    for (uint32_t k = 0; k < s->n_ch && s->detokenize; k++)
        hpd_answer_init(&s->ch[k].a,
                        &(hpd_answer_params_t){.text = text,
                                               .stops = (const char *const *)s->stops,
                                               .n_stops = s->n_stops,
                                               .split = s->split,
                                               .opens_think = hpd_text_chat_opens_think(text,
                                                                                        thinking),
                                               .parse_calls = s->tools.parse_calls,
                                               .format = s->tools.format,
                                               .tools = s->tools.tools,
                                               .ops = &answer_ops,
                                               .arg = &s->ch[k]});
    hpd_coord_request_t q = {.prompt = ids != NULL ? ids : g.prompt,
                             .n_prompt = ids != NULL ? (uint32_t)n_ids : g.prompt_n,
                             .max_tokens = g.max_tokens,
                             .sampling = {.temperature = g.temperature,
                                          .top_p = g.top_p,
                                          .top_k = g.top_k,
                                          .seed = g.seed},
                             .stop_ids = g.stop_token_ids,
                             .n_stop = g.stop_token_ids_n,
                             .min_tokens = g.min_tokens,
                             .ignore_eos = g.ignore_eos,
                             .who = hpd_rpc_conn_who(conn),
                             .stream = g.stream,
                             .owner = conn,
                             .tag = g.tag,
                             .grammar = s->tools.spec != NULL ? s->tools.spec : g.grammar,
                             .grammar_len = s->tools.spec != NULL ? strlen(s->tools.spec)
                                                                  : g.grammar_len,
                             .grammar_after_think = s->detokenize && s->split &&
                                                    s->ch[0].a.rs.state == HPD_REASONING_INSIDE,
                             .logprobs = g.logprobs,
                             .top_logprobs = g.top_logprobs,
                             .prompt_logprobs = g.prompt_logprobs,
                             .n = g.n};
    /* what the client left out: the model's defaults (see submit) */
    if (hpd_rpc_map_get(params, "temperature") == NULL)
        q.sampling.temperature = NAN;
    if (hpd_rpc_map_get(params, "top_p") == NULL)
        q.sampling.top_p = NAN;
    if (hpd_rpc_map_get(params, "top_k") == NULL)
        q.sampling.top_k = HPD_TOP_K_UNSET;
    const hpd_coord_sink_t sink = {.tokens = g.stream || s->detokenize ? rpc_tokens : NULL,
                                   .done = rpc_done,
                                   .arg = s};
    const int64_t code = hpd_coord_submit(c, &q, &sink, &req_id, why, sizeof(why));
    hpd_msg_free(&hpd_msg_generate, &g);
    free(ids);
    if (code != 0) {
        hpd_rpc_reply_error(conn, id, code, "%s", why);
        rpc_sink_free(s);
        return;
    }
    hpd_rpc_conn_ref(conn);
}

void hpd_msgdoor_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_coord_t *c = arg;
    hpd_proto_err_t err;
    hpd_msg_cancel_request_t m = {0};

    if (!hpd_msg_unpack(&hpd_msg_cancel_request, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        return;
    }
    /* answers the request's generate call "canceled" */
    const bool found = hpd_coord_cancel_tagged(c, conn, m.tag, "by the client");
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_canceled, &(hpd_msg_canceled_t){.canceled = found}, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}
