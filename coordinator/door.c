/* A front door apart from the scheduler (coordinator/door.h). A request
 * here: submitted (its `schedule` message packed once, sent to the
 * scheduler that is connected, again to the next one if that one is
 * lost), its tokens assembled as the scheduler (the first) and the decode
 * node (the rest) report them, and ended once the scheduler said so and
 * the tokens are all here. */
#include "coordinator/door.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"
#include "coordinator/choices.h"
#include "node/msg.h"
#include "node/proto.h"
#include "transport/rpc.h"

#define LOG_COMPONENT "door"
#define CALL_MS 30000
#define TICK_MS 1000 /* the scheduler's limits are asked this often */
/* the scheduler said finished: the decode node's last tokens may still be
 * on their way here on another connection */
#define TAIL_MS 5000
/* a request waits this long for a scheduler (a failover) before it fails */
#define PENDING_MS 30000
/* ... and goes to a new one this often at most (a request that takes its
 * schedulers down with it is not sent to every restart) */
#define MAX_RESUBMITS 3
/* connecting to a scheduler blocks the loop this long at most */
#define CONNECT_MS 1000
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define MAX_SCHEDULERS 8

typedef struct dreq {
    hpd_door_t *door;
    uint64_t id; /* this door's, the tag at the scheduler */
    hpd_coord_sink_t sink;
    const void *owner; /* a msgpack client's connection (its cancel by tag, its close) */
    uint64_t tag;
    uint32_t n_ch, max_tokens, n_prompt, top_logprobs;
    hpd_choice_t ch[HPD_MAX_CHOICES];
    hpd_token_logprobs_t *plp; /* [n_prompt - 1] when asked for */
    bool have_plp;
    hpd_rpc_buf_t schedule; /* the message, for each scheduler it goes to */
    bool sent;              /* to the connected scheduler */
    uint32_t resubmits;     /* schedulers lost while it ran */
    double t_submit, t_first, t_pending;
    bool ended; /* the scheduler's end came */
    hpd_msg_ended_t end;
    struct event *tail; /* waits for the last tokens after the scheduler's end */
    struct dreq *next, *prev;
} dreq_t;

struct hpd_door {
    struct event_base *base;
    char *token, address[72];
    hpd_endpoint_t eps[MAX_SCHEDULERS];
    uint32_t n_eps, at;
    hpd_rpc_client_t *sched;
    bool ready;  /* the connected scheduler answered its limits */
    bool rotate; /* the connection is lost or refused us: the next scheduler */
    uint32_t backoff_ms;
    struct event *retry, *tick;
    uint32_t vocab, max_context;
    hpd_u64map_t reqs; /* by id */
    dreq_t *list;
    uint32_t n_open;
    uint64_t next_id;
    void (*ended)(void *arg, const hpd_coord_result_t *res);
    void *ended_arg;
};

typedef struct {
    hpd_door_t *door;
    uint64_t id;
} call_ctx_t;

static void send_schedule(hpd_door_t *d, dreq_t *r);

/* ------------------------------------------------------------ a request's end */

static void dreq_free(hpd_door_t *d, dreq_t *r)
{
    hpd_u64map_del(&d->reqs, r->id);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        d->list = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    d->n_open--;
    if (r->tail != NULL)
        event_free(r->tail);
    hpd_choices_free(r->ch, r->n_ch);
    free(r->plp);
    hpd_rpc_buf_destroy(&r->schedule);
    free(r);
}

/* Tells r's sink its end and frees r. */
static void finish(hpd_door_t *d, dreq_t *r, hpd_coord_outcome_t outcome, int64_t code,
                   const char *why)
{
    hpd_coord_choice_t chs[HPD_MAX_CHOICES];
    for (uint32_t k = 0; k < r->n_ch; k++)
        if (r->ch[k].stopped)
            snprintf(r->ch[k].finish_reason, sizeof(r->ch[k].finish_reason), "stop");
    hpd_choices_result(r->ch, r->n_ch, chs);
    const double now = hpd_time_now();
    const hpd_msg_ended_t *e = &r->end;
    const hpd_coord_result_t res = {
        .outcome = outcome,
        .code = code,
        .error = why,
        .request = r->id,
        .tokens = r->ch[0].out,
        .logprobs = r->ch[0].lp,
        .prompt_logprobs = r->have_plp ? r->plp : NULL,
        .top_logprobs = r->top_logprobs,
        .n_tokens = r->ch[0].n_out,
        .finish_reason = r->ch[0].finish_reason,
        .choices = chs,
        .n_choices = r->n_ch,
        .prompt_tokens = r->n_prompt,
        .cached_tokens = e->cached_tokens,
        .attempts = e->attempts,
        .ttft_ms = r->t_first > 0 ? (float)((r->t_first - r->t_submit) * 1e3) : 0,
        .total_ms = (float)((now - r->t_submit) * 1e3),
        .prefill_ms = e->prefill_ms,
        .push_ms = e->push_ms,
        .exposed_push_ms = e->exposed_push_ms};
    if (outcome == HPD_COORD_FINISHED)
        HPD_LOG_INFO(LOG_COMPONENT, "request %llu finished: %u tokens (%s), %u attempt(s)",
                     (unsigned long long)r->id, r->ch[0].n_out, r->ch[0].finish_reason,
                     e->attempts);
    else
        HPD_LOG_INFO(LOG_COMPONENT, "request %llu %s: %s", (unsigned long long)r->id,
                     outcome == HPD_COORD_FAILED ? "failed" : "canceled", why);
    r->sink.done(r->sink.arg, &res);
    if (d->ended != NULL)
        d->ended(d->ended_arg, &res);
    dreq_free(d, r);
}

/* The scheduler said how r ended: a failure ends it now; a finish once
 * every choice's last tokens are here too. */
static void check_end(hpd_door_t *d, dreq_t *r)
{
    if (!r->ended)
        return;
    if (r->end.outcome != HPD_COORD_FINISHED) {
        finish(d, r, (hpd_coord_outcome_t)r->end.outcome, -(int64_t)r->end.code,
               r->end.error[0] != '\0' ? r->end.error : "ended by the scheduler");
        return;
    }
    if (hpd_choices_over(r->ch, r->n_ch)) {
        finish(d, r, HPD_COORD_FINISHED, 0, NULL);
        return;
    }
    if (!evtimer_pending(r->tail, NULL)) {
        const struct timeval tv = {TAIL_MS / 1000, (TAIL_MS % 1000) * 1000};
        evtimer_add(r->tail, &tv);
    }
}

static void on_tail(evutil_socket_t fd, short what, void *arg)
{
    dreq_t *r = arg;
    (void)fd;
    (void)what;
    finish(r->door, r, HPD_COORD_FAILED, HPD_RPC_ERR_INTERNAL,
           "the scheduler finished the request but the decode node's last tokens did not "
           "reach this front door");
}

/* unschedule {tag, stop?, choice?} to the scheduler r was sent to. */
static void unschedule(hpd_door_t *d, const dreq_t *r, bool stop, uint32_t k)
{
    if (d->sched == NULL || !r->sent)
        return;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_unschedule, &(hpd_msg_unschedule_t){.tag = r->id, .stop = stop,
                                                              .choice = k},
                 &b.pk);
    (void)hpd_rpc_client_notify(d->sched, "unschedule", &b);
    hpd_rpc_buf_destroy(&b);
}

/* ------------------------------------------------------------ its tokens */

void hpd_door_tokens(hpd_door_t *d, const msgpack_object *params)
{
    hpd_msg_tokens_t m = {0};
    hpd_proto_err_t err;
    hpd_token_logprobs_t *lp = NULL;
    char why[200] = "out of memory";
    dreq_t *r;
    const uint32_t vocab = d->vocab > 0 ? d->vocab : INT32_MAX;

    if (!hpd_msg_unpack(&hpd_msg_tokens, params, &m, &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "bad tokens notification: %s", err.text);
        return;
    }
    if ((r = hpd_u64map_get(&d->reqs, m.job)) == NULL || m.error[0] != '\0' ||
        m.choice >= r->n_ch)
        goto out; /* one that ended here, or the scheduler's business */
    hpd_choice_t *ch = &r->ch[m.choice];
    if (!hpd_msg_ids_below(m.ids, m.ids_n, vocab, "tokens: ids", &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "request %llu: tokens ignored: %s",
                     (unsigned long long)r->id, err.text);
        goto out;
    }
    if (ch->lp != NULL && m.ids_n > 0 &&
        ((lp = malloc(m.ids_n * sizeof(*lp))) == NULL ||
         !hpd_logprobs_decode(m.logprobs, m.logprobs_len, m.ids_n, r->top_logprobs, vocab, lp,
                              why, sizeof(why)))) {
        HPD_LOG_WARN(LOG_COMPONENT, "request %llu: tokens ignored: %s",
                     (unsigned long long)r->id, why);
        goto out;
    }
    if (r->plp != NULL && !r->have_plp && m.prompt_logprobs_len > 0) {
        if (hpd_logprobs_decode(m.prompt_logprobs, m.prompt_logprobs_len, r->n_prompt - 1,
                                r->top_logprobs, vocab, r->plp, why, sizeof(why)))
            r->have_plp = true;
        else
            HPD_LOG_WARN(LOG_COMPONENT, "request %llu: prompt logprobs ignored: %s",
                         (unsigned long long)r->id, why);
    }
    const uint32_t before = ch->n_out;
    uint32_t pos;
    int32_t was, now;
    if (hpd_choice_add(ch, r->max_tokens, m.index, m.ids, lp, m.ids_n, &pos, &was, &now) > 0)
        HPD_LOG_ERROR(LOG_COMPONENT, "request %llu: choice %u: token %u is %d after a retry, "
                      "%d before (determinism broken)", (unsigned long long)r->id, m.choice,
                      pos, now, was);
    if (r->t_first == 0 && ch->n_out > 0)
        r->t_first = hpd_time_now();
    if (hpd_choice_stream(ch, &r->sink, m.choice, before))
        unschedule(d, r, true, m.choice); /* a stop string: the scheduler lets it go */
    /* the last tokens: the choice is done once none before them is
     * missing (the first may come after them; a lost notice leaves a gap,
     * and the tail wait fails the request) */
    if (m.done && ch->end_at == 0) {
        ch->end_at = (uint32_t)HPD_MIN((uint64_t)m.index + m.ids_n, (uint64_t)r->max_tokens);
        ch->end_at = HPD_MAX(1u, ch->end_at);
        snprintf(ch->finish_reason, sizeof(ch->finish_reason), "%s", m.finish_reason);
    }
    if (!ch->done && ch->end_at > 0 && (ch->n_out >= ch->end_at || ch->n_out == r->max_tokens))
        ch->done = true;
    check_end(d, r);
out:
    free(lp);
    hpd_msg_free(&hpd_msg_tokens, &m);
}

static void on_ended(hpd_door_t *d, const msgpack_object *params)
{
    hpd_msg_ended_t m = {0};
    hpd_proto_err_t err;
    dreq_t *r;
    if (!hpd_msg_unpack(&hpd_msg_ended, params, &m, &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "bad ended notification: %s", err.text);
        return;
    }
    if ((r = hpd_u64map_get(&d->reqs, m.tag)) == NULL)
        return;
    r->ended = true;
    r->end = m;
    check_end(d, r);
}

static void on_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    hpd_door_t *d = arg;
    if (hpd_rpc_str_eq(msg->method, msg->method_len, "tokens"))
        hpd_door_tokens(d, msg->params);
    else if (hpd_rpc_str_eq(msg->method, msg->method_len, "ended"))
        on_ended(d, msg->params);
}

/* ------------------------------------------------------------ the scheduler */

static void arm_retry(hpd_door_t *d, uint32_t ms)
{
    const struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(d->retry, &tv);
}

static void on_sched_close(void *arg, hpd_status_t why)
{
    hpd_door_t *d = arg;
    (void)why;
    d->rotate = true; /* the client is destroyed outside its own callbacks */
    arm_retry(d, 0);
}

static void on_limits(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_door_t *d = arg;
    hpd_msg_limits_t m = {0};
    hpd_proto_err_t err;
    if (st != HPD_OK || reply->is_error || !hpd_msg_unpack(&hpd_msg_limits, reply->result, &m,
                                                            &err))
        return; /* a closed connection rotates; a refusal too (on_scheduled) */
    d->vocab = m.vocab;
    d->max_context = m.max_context;
    /* requests go while it has decode nodes (after a restart they
     * register again first; meanwhile new ones wait, for 30 s) */
    if (m.max_context == 0)
        d->ready = false;
    if (!d->ready && m.max_context > 0) {
        d->ready = true;
        d->backoff_ms = BACKOFF_MIN_MS;
        HPD_LOG_INFO(LOG_COMPONENT, "scheduler %s:%u answers", d->eps[d->at].host,
                     d->eps[d->at].port);
        for (dreq_t *r = d->list; r != NULL; r = r->next)
            if (!r->sent)
                send_schedule(d, r);
    }
}

static void ask_limits(hpd_door_t *d)
{
    if (d->sched != NULL && !d->rotate)
        (void)hpd_rpc_call(d->sched, "limits", NULL, CALL_MS, on_limits, d);
}

/* Drops a lost scheduler (its requests wait to go to the next) and
 * connects to the next one. */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    hpd_door_t *d = arg;
    (void)fd;
    (void)what;
    if (d->sched != NULL && d->rotate) {
        HPD_LOG_WARN(LOG_COMPONENT, "scheduler %s:%u lost; %u open request(s) wait for the "
                     "next", d->eps[d->at].host, d->eps[d->at].port, d->n_open);
        const double now = hpd_time_now();
        for (dreq_t *r = d->list, *next; r != NULL; r = next) {
            next = r->next;
            if (!r->sent || r->ended)
                continue; /* not there yet, or its end came (its last tokens may follow) */
            r->sent = false;
            r->t_pending = now;
            if (hpd_choices_over(r->ch, r->n_ch)) /* all here: its end is not needed */
                finish(d, r, HPD_COORD_FINISHED, 0, NULL);
            else if (++r->resubmits > MAX_RESUBMITS)
                finish(d, r, HPD_COORD_FAILED, HPD_RPC_ERR_INTERNAL,
                       "its scheduler was lost while it ran, more than 3 times");
        }
        hpd_rpc_client_t *old = d->sched;
        d->sched = NULL;
        d->ready = false;
        hpd_rpc_client_destroy(old); /* its calls fail: on_scheduled sees them unsent */
        d->at = (d->at + 1) % d->n_eps;
        d->rotate = false;
        arm_retry(d, d->backoff_ms);
        d->backoff_ms = HPD_MIN(d->backoff_ms * 2, BACKOFF_MAX_MS);
        return;
    }
    if (d->sched != NULL)
        return;
    const hpd_endpoint_t *e = &d->eps[d->at];
    const hpd_rpc_client_params_t cp = {.base = d->base,
                                        .host = e->host,
                                        .port = e->port,
                                        .token = d->token,
                                        .timeout_ms = CONNECT_MS, /* (calls give their own) */
                                        .on_notify = on_notify,
                                        .on_close = on_sched_close,
                                        .arg = d};
    if (hpd_rpc_client_connect(&cp, &d->sched) != HPD_OK) {
        d->sched = NULL;
        d->at = (d->at + 1) % d->n_eps;
        arm_retry(d, d->backoff_ms);
        d->backoff_ms = HPD_MIN(d->backoff_ms * 2, BACKOFF_MAX_MS);
        return;
    }
    ask_limits(d);
}

/* Every second: the limits again; requests that waited too long for a
 * scheduler fail. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    hpd_door_t *d = arg;
    (void)fd;
    (void)what;
    ask_limits(d);
    const double now = hpd_time_now();
    for (dreq_t *r = d->list, *next; r != NULL; r = next) {
        next = r->next;
        if (!r->sent && now - r->t_pending > PENDING_MS / 1e3)
            finish(d, r, HPD_COORD_FAILED, HPD_RPC_ERR_OVERLOADED,
                   "no scheduler answered this front door in 30 s");
    }
}

static void on_scheduled(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *x = arg;
    hpd_door_t *d = x->door;
    dreq_t *r = hpd_u64map_get(&d->reqs, x->id);
    free(x);
    if (r == NULL || !r->sent)
        return; /* it ended, or waits for the next scheduler */
    if (st == HPD_ERR_TIMEOUT) {
        unschedule(d, r, false, 0);
        finish(d, r, HPD_COORD_FAILED, HPD_RPC_ERR_TIMEOUT,
               "the scheduler did not take the request in 30 s");
        return;
    }
    if (st != HPD_OK) { /* the connection closed: the next scheduler takes it */
        r->sent = false;
        r->t_pending = hpd_time_now();
        return;
    }
    if (reply->is_error && reply->error_code == HPD_RPC_ERR_NOT_LEADER) {
        r->sent = false; /* a standby now: the next one may lead */
        r->t_pending = hpd_time_now();
        if (!d->rotate) {
            d->rotate = true;
            arm_retry(d, 0);
        }
        return;
    }
    if (reply->is_error) {
        char why[512];
        snprintf(why, sizeof(why), "%.*s", (int)reply->error_message_len,
                 reply->error_message);
        finish(d, r, HPD_COORD_FAILED, reply->error_code, why);
        return;
    }
    /* the choices stopped before this scheduler had it */
    for (uint32_t k = 0; k < r->n_ch; k++)
        if (r->ch[k].stopped)
            unschedule(d, r, true, k);
}

static void send_schedule(hpd_door_t *d, dreq_t *r)
{
    call_ctx_t *x;
    if (d->sched == NULL || !d->ready || d->rotate || (x = malloc(sizeof(*x))) == NULL)
        return;
    *x = (call_ctx_t){.door = d, .id = r->id};
    /* already packed: the buffer goes out as the call's params */
    if (hpd_rpc_call(d->sched, "schedule", &r->schedule, CALL_MS, on_scheduled, x) != HPD_OK) {
        free(x);
        return;
    }
    r->sent = true;
}

/* ------------------------------------------------------------ requests */

int64_t hpd_door_submit(hpd_door_t *d, const hpd_coord_request_t *q, const hpd_coord_sink_t *sink,
                        uint64_t *id_p, char *err, size_t err_len)
{
    const uint32_t n_ch = HPD_MAX(1u, q->n);
    if (q->n > HPD_MAX_CHOICES) {
        snprintf(err, err_len, "generate: n is %u (expected 1 to %d choices)", q->n,
                 HPD_MAX_CHOICES);
        return HPD_RPC_ERR_PARAMS;
    }
    if (d->max_context == 0) {
        snprintf(err, err_len, "generate: %s", d->ready ? "no decode node is registered"
                                                        : "no scheduler answers this front "
                                                          "door");
        return HPD_RPC_ERR_OVERLOADED;
    }
    if (q->max_tokens > d->max_context) { /* (the scheduler's admission says the rest) */
        snprintf(err, err_len, "generate: max_tokens %u is more than the largest context, %u "
                 "tokens", q->max_tokens, d->max_context);
        return HPD_RPC_ERR_PARAMS;
    }
    if (q->who != NULL && strlen(q->who) >= sizeof(((hpd_msg_schedule_t *)0)->who)) {
        snprintf(err, err_len, "generate: the client's name is too long");
        return HPD_RPC_ERR_PARAMS;
    }
    dreq_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        goto oom;
    hpd_rpc_buf_init(&r->schedule);
    r->door = d;
    r->id = ++d->next_id;
    r->n_ch = n_ch;
    r->max_tokens = q->max_tokens;
    r->n_prompt = q->n_prompt;
    r->top_logprobs = q->top_logprobs;
    r->sink = *sink;
    r->owner = q->owner;
    r->tag = q->tag;
    r->t_submit = r->t_pending = hpd_time_now();
    if (hpd_choices_alloc(r->ch, n_ch, r->max_tokens, q->logprobs, true) != HPD_OK ||
        (q->prompt_logprobs && q->n_prompt > 1 &&
         (r->plp = calloc(q->n_prompt - 1, sizeof(*r->plp))) == NULL) ||
        (r->tail = evtimer_new(d->base, on_tail, r)) == NULL ||
        hpd_u64map_put(&d->reqs, r->id, r) != HPD_OK) {
        if (r->tail != NULL)
            event_free(r->tail);
        hpd_choices_free(r->ch, n_ch);
        free(r->plp);
        hpd_rpc_buf_destroy(&r->schedule);
        free(r);
        goto oom;
    }
    hpd_rpc_buf_t samp;
    hpd_rpc_buf_init(&samp);
    hpd_proto_pack_sampling(&samp.pk, &q->sampling);
    hpd_msg_schedule_t m = {.tag = r->id,
                            .prompt = q->prompt,
                            .prompt_n = q->n_prompt,
                            .max_tokens = q->max_tokens,
                            .sampling_raw = samp.sb.data,
                            .sampling_raw_len = (uint32_t)samp.sb.size,
                            .stop_token_ids = q->stop_ids,
                            .stop_token_ids_n = q->n_stop,
                            .ignore_eos = q->ignore_eos,
                            .min_tokens = q->min_tokens,
                            .logprobs = q->logprobs,
                            .top_logprobs = q->top_logprobs,
                            .prompt_logprobs = q->prompt_logprobs,
                            .grammar = q->grammar,
                            .grammar_len = (uint32_t)q->grammar_len,
                            .grammar_after_think = q->grammar_after_think,
                            .n = q->n,
                            .stream = q->stream};
    snprintf(m.door, sizeof(m.door), "%s", d->address);
    snprintf(m.who, sizeof(m.who), "%s", q->who != NULL ? q->who : "");
    hpd_msg_pack_all(&hpd_msg_schedule, &m, &r->schedule.pk);
    hpd_rpc_buf_destroy(&samp);
    r->next = d->list;
    if (d->list != NULL)
        d->list->prev = r;
    d->list = r;
    d->n_open++;
    send_schedule(d, r); /* or once a scheduler answers */
    *id_p = r->id;
    return 0;
oom:
    snprintf(err, err_len, "generate: out of memory");
    return HPD_RPC_ERR_INTERNAL;
}

bool hpd_door_cancel(hpd_door_t *d, uint64_t id, const char *why)
{
    dreq_t *r = hpd_u64map_get(&d->reqs, id);
    if (r == NULL)
        return false;
    unschedule(d, r, false, 0);
    finish(d, r, HPD_COORD_CANCELED, 0, why);
    return true;
}

bool hpd_door_cancel_tagged(hpd_door_t *d, const void *owner, uint64_t tag, const char *why)
{
    for (dreq_t *r = d->list; r != NULL; r = r->next)
        if (r->owner == owner && r->tag == tag)
            return hpd_door_cancel(d, r->id, why);
    return false;
}

void hpd_door_cancel_owned(hpd_door_t *d, const void *owner, const char *why)
{
    for (dreq_t *r = d->list, *next; r != NULL; r = next) {
        next = r->next;
        if (r->owner == owner)
            hpd_door_cancel(d, r->id, why);
    }
}

const hpd_token_logprobs_t *hpd_door_prompt_logprobs(const hpd_door_t *d, uint64_t id)
{
    const dreq_t *r = hpd_u64map_get(&d->reqs, id);
    return r != NULL && r->have_plp ? r->plp : NULL;
}

void hpd_door_limits(const hpd_door_t *d, uint32_t *vocab_p, uint32_t *max_context_p)
{
    *vocab_p = d->vocab;
    *max_context_p = d->max_context;
}

uint32_t hpd_door_open_requests(const hpd_door_t *d)
{
    return d->n_open;
}

bool hpd_door_health(const hpd_door_t *d, char *msg, size_t len)
{
    const hpd_endpoint_t *e = &d->eps[d->at];
    if (!d->ready) {
        snprintf(msg, len, "front door: no scheduler answers (trying %s:%u), %u open "
                 "requests", e->host, e->port, d->n_open);
        return false;
    }
    snprintf(msg, len, "ok: front door of scheduler %s:%u, %u open requests", e->host, e->port,
             d->n_open);
    return true;
}

void hpd_door_end_all(hpd_door_t *d, const char *why)
{
    while (d->list != NULL) {
        unschedule(d, d->list, false, 0);
        finish(d, d->list, HPD_COORD_FAILED, HPD_RPC_ERR_OVERLOADED, why);
    }
}

/* ------------------------------------------------------------ the door */

hpd_status_t hpd_door_create(const hpd_door_params_t *p, hpd_door_t **door_p, char *err,
                             size_t err_len)
{
    hpd_door_t *d = calloc(1, sizeof(*d));
    *door_p = NULL;
    if (d == NULL) {
        snprintf(err, err_len, "out of memory");
        return HPD_ERR_NO_MEMORY;
    }
    d->base = p->base;
    d->ended = p->ended;
    d->ended_arg = p->arg;
    hpd_u64map_init(&d->reqs);
    d->backoff_ms = BACKOFF_MIN_MS;
    snprintf(d->address, sizeof(d->address), "%s", p->address);
    if (!hpd_proto_parse_endpoints(p->schedulers, d->eps, MAX_SCHEDULERS, &d->n_eps, err,
                                   err_len) ||
        d->n_eps == 0) {
        if (d->n_eps == 0 && err[0] == '\0')
            snprintf(err, err_len, "--scheduler: expected HOST:PORT[,HOST:PORT...]");
        hpd_door_destroy(d);
        return HPD_ERR_INVALID_ARG;
    }
    if ((p->token != NULL && (d->token = strdup(p->token)) == NULL) ||
        (d->retry = evtimer_new(p->base, on_retry, d)) == NULL ||
        (d->tick = event_new(p->base, -1, EV_PERSIST, on_tick, d)) == NULL) {
        snprintf(err, err_len, "out of memory");
        hpd_door_destroy(d);
        return HPD_ERR_NO_MEMORY;
    }
    const struct timeval tick = {TICK_MS / 1000, (TICK_MS % 1000) * 1000};
    event_add(d->tick, &tick);
    arm_retry(d, 0);
    HPD_LOG_INFO(LOG_COMPONENT, "front door at %s for scheduler(s) %s", d->address,
                 p->schedulers);
    *door_p = d;
    return HPD_OK;
}

void hpd_door_destroy(hpd_door_t *d)
{
    if (d == NULL)
        return;
    hpd_door_end_all(d, "front door shutting down");
    hpd_rpc_client_destroy(d->sched);
    if (d->retry != NULL)
        event_free(d->retry);
    if (d->tick != NULL)
        event_free(d->tick);
    hpd_u64map_free(&d->reqs);
    free(d->token);
    free(d);
}
