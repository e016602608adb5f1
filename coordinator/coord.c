/* The coordinator's core (coordinator/coordinator.h, coord_internal.h): a
 * request's life, scheduling, hedging, metrics and the context
 * (docs/cluster.md). The node registry is registry.c; the msgpack front
 * door msgdoor.c.
 *
 * A request's life is the state machine of coordinator/request.h: this file
 * feeds it the events (replies, notifications, node losses, timeouts) and
 * carries out its plans (carry_out). Each attempt has its own job id;
 * replies and notifications of an older attempt are ignored. A lost node
 * sends its requests back to the queue: they run again from the prompt,
 * replaying the tokens already sent to the client, so the client's stream
 * continues with no token lost or repeated.
 * Who frees what: a request holds a reference on its client's connection
 * until it is answered; node clients are destroyed from a deferred event,
 * never inside their own callbacks. */
#include "coordinator/coord_internal.h"
#include "coordinator/door.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/admission.h"
#include "coordinator/msgdoor.h"
#include "grammar/grammar.h"
#include "node/msg.h"

/* A call's context: which attempt it belongs to. */
typedef struct {
    hpd_coord_t *coord;
    uint64_t job;
    uint64_t node;
    uint64_t prefill; /* a prefill cancel's: the prefill node */
    bool fence;       /* ... whose connection the decode node closes first */
} call_ctx_t;

static req_t *req_new(hpd_coord_t *c, const int32_t *prompt, uint32_t n_prompt,
                      uint32_t max_tokens, const int32_t *stop_ids, uint32_t n_stop,
                      uint32_t n_ch, bool logprobs, req_t *after);
static bool attempt_healthy(const req_t *r);
static node_t *pick(hpd_coord_t *c, const req_t *r, bool prefill, uint32_t *pages_p);
static call_ctx_t *ctx_new(hpd_coord_t *c, uint64_t job, uint64_t node);
static void on_reserved(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply);
static void on_prefilled(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply);
static void on_started(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply);
static void add_tokens(req_t *r, uint32_t k, uint32_t index, const int32_t *ids,
                       const hpd_token_logprobs_t *lp, uint32_t n);
static bool all_over(const req_t *r);
static bool all_done(const req_t *r);
static void stream(req_t *r, uint32_t k, uint32_t from);
static bool req_event(hpd_coord_t *c, req_t *r, hpd_req_event_t ev, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool start_hedge(hpd_coord_t *c, req_t *r, const node_t *n);
static bool hedge_tokens(void *arg, uint32_t k, const int32_t *out,
                         const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                         uint32_t *keep_p);
static void hedge_ended(hpd_coord_t *c, req_t *h, bool won, const char *why);
static void reply_finished(hpd_coord_t *c, req_t *r);
static void count_end(hpd_coord_t *c, const hpd_coord_result_t *res, uint32_t generated,
                      double tpot_s);
static uint32_t attempts_of(const req_t *r);
static void tell_end(req_t *r, hpd_coord_outcome_t outcome, int64_t code, const char *why);
static void send_cancel(node_t *n, uint64_t job, uint64_t writer, hpd_rpc_reply_cb_t cb,
                        void *arg);
static void on_prefill_canceled(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply);
static void probes_over(req_t *r);
static void req_free(hpd_coord_t *c, req_t *r);

/* ------------------------------------------------------------ a request arrives */

int64_t hpd_coord_submit(hpd_coord_t *c, const hpd_coord_request_t *q,
                         const hpd_coord_sink_t *sink, uint64_t *id_p, char *err,
                         size_t err_len)
{
    size_t n;
    node_t **map;
    hpd_route_node_t *view;
    req_t *r = NULL;

    if (c->door != NULL)
        return hpd_door_submit(c->door, q, sink, id_p, err, err_len);
    if (q->door != NULL && strlen(q->door) >= sizeof(r->door)) {
        snprintf(err, err_len, "schedule: door is %zu bytes (expected HOST:PORT in fewer than "
                 "%zu)", strlen(q->door), sizeof(r->door));
        return HPD_RPC_ERR_PARAMS;
    }
    if (c->o.leading != NULL && !c->o.leading(c->o.leading_arg)) {
        snprintf(err, err_len, "generate: this coordinator no longer leads; try the leader");
        return HPD_RPC_ERR_NOT_LEADER;
    }
    if (q->top_logprobs > HPD_MAX_TOP_LOGPROBS ||
        (q->top_logprobs > 0 && !q->logprobs && !q->prompt_logprobs)) {
        snprintf(err, err_len, "generate: top_logprobs is %u (expected at most %d, with "
                 "logprobs)", q->top_logprobs, HPD_MAX_TOP_LOGPROBS);
        hpd_metric_inc(c->m.invalid, 1);
        return HPD_RPC_ERR_PARAMS;
    }
    if (q->n > HPD_MAX_CHOICES) {
        snprintf(err, err_len, "generate: n is %u (expected 1 to %d choices)", q->n,
                 HPD_MAX_CHOICES);
        hpd_metric_inc(c->m.invalid, 1);
        return HPD_RPC_ERR_PARAMS;
    }
    if (q->grammar != NULL) { /* refused here, by name, before any node sees it */
        hpd_grammar_t *g;
        char why[256];
        if (hpd_grammar_from_spec(q->grammar, q->grammar_len, &g, why, sizeof(why)) != HPD_OK) {
            snprintf(err, err_len, "generate: %s", why);
            hpd_metric_inc(c->m.invalid, 1);
            return HPD_RPC_ERR_PARAMS;
        }
        hpd_grammar_destroy(g);
    }
    if ((view = hpd_reg_route_view(c, &n, &map)) == NULL) {
        snprintf(err, err_len, "generate: out of memory");
        return HPD_RPC_ERR_INTERNAL;
    }
    /* what admission checks: the values given (an unset one: greedy's) */
    const hpd_sampling_t *sp = &q->sampling;
    const hpd_msg_generate_t g = {.prompt = q->prompt,
                                  .prompt_n = q->n_prompt,
                                  .max_tokens = q->max_tokens,
                                  .temperature = isnan(sp->temperature) ? 0 : sp->temperature,
                                  .top_p = isnan(sp->top_p) ? 1 : sp->top_p,
                                  .top_k = sp->top_k == HPD_TOP_K_UNSET ? 0 : sp->top_k,
                                  .seed = sp->seed,
                                  .stop_token_ids = q->stop_ids,
                                  .stop_token_ids_n = q->n_stop,
                                  .ignore_eos = q->ignore_eos,
                                  .min_tokens = q->min_tokens};
    const hpd_admit_state_t as = {.draining = c->draining,
                                  .open_requests = c->n_reqs,
                                  .max_requests = c->o.max_requests};
    const int64_t code = hpd_admit(view, n, &as, &g, err, err_len);
    (void)map;
    if (code != 0) {
        if (code == HPD_RPC_ERR_OVERLOADED) {
            c->rejected++;
            hpd_metric_inc(c->m.overloaded, 1);
        } else {
            hpd_metric_inc(c->m.invalid, 1);
        }
        return code;
    }
    hpd_token_logprobs_t *plp = NULL;
    char *grammar = NULL;
    const int32_t think_end = q->grammar_after_think && c->text != NULL
                                  ? hpd_tokenizer_id(hpd_text_tokenizer(c->text), "</think>")
                                  : -1;
    if (q->grammar != NULL)
        grammar = q->grammar_after_think && think_end >= 0
                      ? hpd_grammar_spec_after(q->grammar, q->grammar_len, think_end)
                      : strndup(q->grammar, q->grammar_len);
    if ((q->grammar != NULL && grammar == NULL) ||
        (q->prompt_logprobs && (plp = calloc(q->n_prompt, sizeof(*plp))) == NULL) ||
        (r = req_new(c, q->prompt, q->n_prompt, q->max_tokens, q->stop_ids, q->n_stop,
                     HPD_MAX(1u, q->n), q->logprobs, NULL)) == NULL) {
        free(plp);
        free(grammar);
        snprintf(err, err_len, "generate: out of memory");
        return HPD_RPC_ERR_INTERNAL;
    }
    r->ignore_eos = q->ignore_eos;
    r->min_tokens = q->min_tokens;
    r->sampling = q->sampling;
    r->grammar = grammar;
    r->grammar_len = grammar != NULL ? (uint32_t)strlen(grammar) : 0;
    r->plp = plp;
    r->top_logprobs = q->top_logprobs;
    if (c->o.no_generation_defaults) { /* what the client left out: greedy */
        if (isnan(r->sampling.temperature))
            r->sampling.temperature = 0;
        if (isnan(r->sampling.top_p))
            r->sampling.top_p = 1;
        if (r->sampling.top_k == HPD_TOP_K_UNSET)
            r->sampling.top_k = 0;
    }
    /* else the nodes take what is unset from the model (generation_config.json) */
    r->sink = *sink;
    r->owner = q->owner;
    r->tag = q->tag;
    if (q->door != NULL)
        snprintf(r->door, sizeof(r->door), "%s", q->door);
    c->n_reqs++;
    const char *who = q->who != NULL ? q->who : "";
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "accepted: %u prompt tokens, max_tokens %u, %u "
                  "choice(s)%s%s%s", r->n_prompt, r->max_tokens, r->n_ch,
                  q->stream ? ", streaming" : "",
                  strncmp(who, "tenant ", 7) == 0 ? ", " : "",
                  strncmp(who, "tenant ", 7) == 0 ? who : "");
    *id_p = r->id;
    hpd_core_schedule_soon(c);
    return 0;
}

/* A request of n_ch choices with its own copies of the prompt, the stop
 * ids and the prefix hashes, room for its tokens (their logprobs with
 * logprobs), queued at *at; NULL: out of memory. */
/* A request of the context's (linked after `after`, at the end for
 * NULL), with room for its jobs' entry in c->jobs. NULL: out of memory. */
static req_t *req_new(hpd_coord_t *c, const int32_t *prompt, uint32_t n_prompt,
                      uint32_t max_tokens, const int32_t *stop_ids, uint32_t n_stop,
                      uint32_t n_ch, bool logprobs, req_t *after)
{
    if (hpd_u64map_reserve(&c->jobs, c->n_all + 1) != HPD_OK) /* one job each at most */
        return NULL;
    req_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    if (hpd_choices_alloc(r->ch, n_ch, max_tokens, logprobs, false) != HPD_OK ||
        (r->hashes = malloc((n_prompt / HPD_PREFIX_BLOCK + 1) * sizeof(*r->hashes))) == NULL ||
        (r->prompt = malloc(n_prompt * sizeof(int32_t))) == NULL ||
        (n_stop > 0 && (r->stop_ids = malloc(n_stop * sizeof(int32_t))) == NULL)) {
        hpd_choices_free(r->ch, n_ch);
        free(r->hashes);
        free(r->prompt);
        free(r);
        return NULL;
    }
    r->n_ch = n_ch;
    memcpy(r->prompt, prompt, n_prompt * sizeof(int32_t));
    if (n_stop > 0)
        memcpy(r->stop_ids, stop_ids, n_stop * sizeof(int32_t));
    r->n_stop = n_stop;
    r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
    r->fsm = hpd_req_fsm_init();
    hpd_prefix_hash_chain(&c->root, r->prompt, r->n_prompt / HPD_PREFIX_BLOCK, r->hashes);
    r->id = ++c->next_req;
    r->t_submit = r->t_queued = hpd_time_now();
    c->n_all++;
    r->prev = after != NULL ? after : c->reqs_tail;
    r->next = r->prev != NULL ? r->prev->next : NULL;
    if (r->prev != NULL)
        r->prev->next = r;
    else
        c->reqs = r;
    if (r->next != NULL)
        r->next->prev = r;
    else
        c->reqs_tail = r;
    return r;
}

/* r's current attempt is job (0: none), found by it in c->jobs (room for
 * it was made with the request). */
static void set_job(hpd_coord_t *c, req_t *r, uint64_t job)
{
    if (r->job != 0)
        hpd_u64map_del(&c->jobs, r->job);
    r->job = job;
    if (job != 0)
        (void)hpd_u64map_put(&c->jobs, job, r);
}

static req_t *req_by_job(hpd_coord_t *c, uint64_t job)
{
    return hpd_u64map_get(&c->jobs, job);
}

/* ------------------------------------------------------------ scheduling */

/* Places queued requests in arrival order. A request that fits no decode
 * node now waits, and so does everything behind it (first come, first
 * served); one that no registered decode node could ever hold fails at once
 * instead of holding up the queue until it times out. */
static void schedule(hpd_coord_t *c)
{
    for (req_t *r = c->reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->is_hedge && r->primary == NULL) {
            req_event(c, r, HPD_REQ_EV_CANCEL, "the request it raced ended first");
        } else if (r->is_hedge && r->fsm.state == HPD_REQ_QUEUED &&
                   attempt_healthy(r->primary)) {
            r->primary->hedges--; /* it never ran */
            req_event(c, r, HPD_REQ_EV_CANCEL, "not placed before its request's node pinged "
                      "again: the race is off");
        }
    }
    for (req_t *r = c->reqs, *next; r != NULL; r = next) {
        uint32_t pages = 0, largest;
        node_t *d;
        next = r->next;
        if (r->fsm.state != HPD_REQ_QUEUED || r->hedge != NULL)
            continue; /* a primary waits for its hedge */
        if ((d = pick(c, r, false, &pages)) == NULL) {
            size_t n;
            node_t **map;
            hpd_route_node_t *v = hpd_reg_route_view(c, &n, &map);
            const hpd_route_req_t rr = {.n_prompt = r->n_prompt,
                                        .max_tokens = r->max_tokens,
                                        .n_choices = r->n_ch};
            const bool placeable = v == NULL || hpd_admit_placeable(v, n, &rr, &pages, &largest);
            if (placeable)
                break;
            if (pages == 0)
                req_event(c, r, HPD_REQ_EV_REFUSED, "the request's %u choices need as many GDN "
                          "slots, but no decode node has that many", r->n_ch);
            else
                req_event(c, r, HPD_REQ_EV_REFUSED,
                          "the request needs %u KV pages for %u prompt + %u new tokens%s, but "
                          "the largest decode pool holds %u pages",
                          pages, r->n_prompt, r->max_tokens,
                          r->n_ch > 1 ? " in its choices" : "", largest);
            continue;
        }
        /* a prefill node that could take it now, or the request waits */
        if (!hpd_reg_prefill_can_take(c, r->n_prompt))
            break;
        set_job(c, r, ++c->next_job);
        r->own_over = false; /* an attempt of its own again */
        r->dnode = d;
        r->dpages = pages;
        r->probe_d = hpd_breaker_placed(&d->breaker, hpd_time_now());
        d->slots_reserved += r->n_ch;
        d->pages_reserved += pages;
        hpd_reg_view_sync(d);
        req_event(c, r, HPD_REQ_EV_PLACED, "placed on %s", d->name);
        hpd_metric_observe(c->m.queue_wait, hpd_time_now() - r->t_queued);
        hpd_rpc_buf_t b, samp;
        hpd_rpc_buf_init(&samp);
        hpd_proto_pack_sampling(&samp.pk, &r->sampling);
        hpd_rpc_buf_init(&b);
        hpd_msg_reserve_t rm = {.job = r->job,
                                          .request = r->id,
                                          .prompt = r->prompt,
                                          .prompt_n = r->n_prompt,
                                          .max_tokens = r->max_tokens,
                                          .sampling_raw = samp.sb.data,
                                          .sampling_raw_len = (uint32_t)samp.sb.size,
                                          /* what the client already has (choices
                                             are computed again: determinism) */
                                          .replay = r->n_ch > 1 ? NULL : r->ch[0].out,
                                          .replay_n = r->n_ch > 1 ? 0 : r->ch[0].n_out,
                                          .stop_token_ids = r->stop_ids,
                                          .stop_token_ids_n = r->n_stop,
                                          .ignore_eos = r->ignore_eos,
                                          .min_tokens = r->min_tokens,
                                          .logprobs = r->ch[0].lp != NULL,
                                          .top_logprobs = r->top_logprobs,
                                          .grammar = r->grammar,
                                          .grammar_len = r->grammar_len,
                                          .n = r->n_ch > 1 ? r->n_ch : 0,
                                          .door_request = r->door[0] != '\0' ? r->tag : 0};
        snprintf(rm.door, sizeof(rm.door), "%s", r->door);
        hpd_msg_pack(&hpd_msg_reserve, &rm, &b.pk);
        hpd_rpc_buf_destroy(&samp);
        call_ctx_t *x = ctx_new(c, r->job, d->id);
        const hpd_status_t st = x == NULL ? HPD_ERR_NO_MEMORY
                                          : hpd_rpc_call(d->client, "reserve", &b,
                                                         CALL_TIMEOUT_MS, on_reserved, x);
        hpd_rpc_buf_destroy(&b);
        if (st != HPD_OK) {
            free(x);
            req_event(c, r, HPD_REQ_EV_FAILED, "cannot reach decode node %s", d->name);
            return; /* the retry schedules again */
        }
    }
}

/* Whether r's attempt runs on nodes that are all well again (a hedge
 * not placed yet is called off then: it would race r on the same nodes,
 * or next to them). */
static bool attempt_healthy(const req_t *r)
{
    const double now = hpd_time_now();
    return r->fsm.state != HPD_REQ_QUEUED && (r->pnode != NULL || r->dnode != NULL) &&
           (r->pnode == NULL || hpd_reg_node_usable(r->pnode, now)) &&
           (r->dnode == NULL || hpd_reg_node_usable(r->dnode, now));
}

static node_t *pick(hpd_coord_t *c, const req_t *r, bool prefill, uint32_t *pages_p)
{
    size_t n;
    node_t **map, *chosen = NULL;
    hpd_route_node_t *v = hpd_reg_route_view(c, &n, &map);
    if (v == NULL)
        return NULL; /* out of memory: the request waits in the queue */
    const hpd_route_req_t rr = {.n_prompt = r->n_prompt,
                                .max_tokens = r->max_tokens,
                                .n_choices = r->n_ch,
                                .hashes = r->hashes,
                                .avoid_decode = r->avoid_decode,
                                .start = r->id}; /* equal nodes take turns */
    const int i = prefill ? hpd_route_prefill(v, n, &rr) : hpd_route_decode(v, n, &rr, pages_p);
    if (i >= 0)
        chosen = map[i];
    return chosen;
}

static void on_sched(evutil_socket_t fd, short what, void *arg)
{
    schedule(arg);
}

void hpd_core_schedule_soon(hpd_coord_t *c)
{
    static const struct timeval now = {0, 0};
    evtimer_add(c->sched, &now); /* (re)arms it to run at once */
}

static void schedule_later(hpd_coord_t *c, uint32_t ms)
{
    const struct timeval tv = {0, ms * 1000};
    if (!evtimer_pending(c->sched, NULL))
        evtimer_add(c->sched, &tv);
}

/* ------------------------------------------------------------ an attempt */


static call_ctx_t *ctx_new(hpd_coord_t *c, uint64_t job, uint64_t node)
{
    call_ctx_t *x = malloc(sizeof(*x));
    if (x != NULL)
        *x = (call_ctx_t){.coord = c, .job = job, .node = node};
    return x;
}

static void ignore_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    free(arg);
}

/* Carries out what the state machine decided for r after an event; `why`
 * says what happened (logs, the client's error). Returns false when r is
 * gone (answered and freed). */
static bool carry_out(hpd_coord_t *c, req_t *r, hpd_req_plan_t p, const char *why)
{
    node_t *d = r->dnode, *pn = r->pnode;
    if (p.verdict == HPD_REQ_IGNORE)
        return true;
    if (p.avoid_decode && d != NULL)
        r->avoid_decode = d->id;
    if (p.pair_failure)
        hpd_metric_inc(c->m.pair_failures, 1);
    if (p.unbook_decode && d != NULL) {
        d->slots_reserved -= r->n_ch;
        d->pages_reserved -= r->dpages;
        hpd_reg_view_sync(d);
    }
    if (p.unbook_prefill && pn != NULL) {
        pn->jobs--;
        pn->queued_tokens -= r->n_prompt;
        hpd_reg_view_sync(pn);
    }
    if (p.cancel_prefill && pn != NULL) {
        call_ctx_t *x = ctx_new(c, r->job, p.cancel_decode && d != NULL ? d->id : 0);
        if (x != NULL) {
            x->prefill = pn->id;
            x->fence = p.fence_writer;
            send_cancel(pn, r->job, 0, on_prefill_canceled, x);
        }
    } else if (p.cancel_decode && d != NULL) {
        send_cancel(d, r->job, p.fence_writer ? r->lost_writer : 0, ignore_reply, NULL);
    }
    if (r->fsm.state == HPD_REQ_DECODING) {
        probes_over(r); /* the pair worked (hpd_reg_pair_ok) */
        r->pnode = NULL; /* the prefill node is done with it */
    }
    if (r->fsm.state == HPD_REQ_QUEUED) { /* the attempt is over */
        probes_over(r);
        r->dnode = r->pnode = NULL;
        r->dpages = 0;
        set_job(c, r, 0);
        r->lost_writer = 0;
    }
    if (p.verdict == HPD_REQ_FAIL && p.gave_up && r->hedge != NULL) {
        /* out of attempts, but its hedge still runs: that is its last */
        r->gave_up = r->own_over = true;
        snprintf(r->last_error, sizeof(r->last_error), "%s", why);
        HPD_LOGR_INFO(LOG_COMPONENT, r->id, "attempt %u failed (%s); its hedge is its last",
                      r->fsm.attempts, why);
        return true;
    }
    if (r->is_hedge && (p.verdict == HPD_REQ_FAIL || p.verdict == HPD_REQ_FINISH ||
                        p.verdict == HPD_REQ_CANCELED)) {
        hedge_ended(c, r, p.verdict == HPD_REQ_FINISH || (p.verdict == HPD_REQ_CANCELED &&
                                                          r->stopped), why);
        req_free(c, r);
        hpd_core_schedule_soon(c);
        return false;
    }
    switch (p.verdict) {
    case HPD_REQ_IGNORE:
    case HPD_REQ_GO_ON: return true;
    case HPD_REQ_WAIT:
        schedule_later(c, FULL_RETRY_MS);
        return true;
    case HPD_REQ_RETRY:
        snprintf(r->last_error, sizeof(r->last_error), "%s", why);
        HPD_LOGR_INFO(LOG_COMPONENT, r->id, "retrying (attempt %u): %s", r->fsm.attempts + 1,
                      why);
        c->retried++;
        hpd_metric_inc(c->m.retries, 1);
        r->t_queued = hpd_time_now();
        hpd_core_schedule_soon(c);
        return true;
    case HPD_REQ_FAIL: {
        char msg[320];
        r->own_over |= p.gave_up;
        if (p.gave_up)
            snprintf(msg, sizeof(msg), "gave up after %u attempts; last: %s", attempts_of(r),
                     why);
        else
            snprintf(msg, sizeof(msg), "%s", why);
        HPD_LOGR_WARN(LOG_COMPONENT, r->id, "failed: %s", msg);
        tell_end(r, HPD_COORD_FAILED, p.code, msg);
        count_end(c, &(hpd_coord_result_t){.outcome = HPD_COORD_FAILED, .code = p.code}, 0, 0);
        break;
    }
    case HPD_REQ_FINISH: reply_finished(c, r); break;
    case HPD_REQ_CANCELED:
        if (r->stopped) { /* by its sink: a stop string, the end of a normal answer */
            for (uint32_t k = 0; k < r->n_ch; k++)
                if (r->ch[k].stopped)
                    snprintf(r->ch[k].finish_reason, sizeof(r->ch[k].finish_reason), "stop");
            reply_finished(c, r);
            break;
        }
        tell_end(r, HPD_COORD_CANCELED, 0, why);
        HPD_LOGR_INFO(LOG_COMPONENT, r->id, "canceled: %s", why);
        count_end(c, &(hpd_coord_result_t){.outcome = HPD_COORD_CANCELED}, 0, 0);
        break;
    }
    req_free(c, r);
    hpd_core_schedule_soon(c);
    return false;
}

/* The prefill job: the prompt and where its state goes (the decode node's
 * reservation, checked, then relayed as it came: the prefill node reads
 * it). */
static void on_reserved(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *x = arg;
    hpd_coord_t *c = x->coord;
    req_t *r = req_by_job(c, x->job);
    const uint64_t job = x->job;
    free(x);
    if (r == NULL || r->fsm.state != HPD_REQ_RESERVING)
        return; /* an older attempt: its abort already sent the cancel */
    node_t *d = r->dnode;
    if (st != HPD_OK) {
        req_event(c, r, HPD_REQ_EV_FAILED, "reserve on %s: %s", d->name, hpd_status_str(st));
        return;
    }
    if (reply->is_error && reply->error_code == HPD_RPC_ERR_PEER) {
        /* it cannot reach the request's front door: another decode node */
        r->avoid_decode = d->id;
        req_event(c, r, HPD_REQ_EV_FAILED, "reserve on %s: %.*s", d->name,
                  (int)reply->error_message_len, reply->error_message);
        return;
    }
    if (reply->is_error) {
        /* our accounting was ahead of the node's frees: wait in the queue */
        req_event(c, r, reply->error_code == HPD_RPC_ERR_OVERLOADED ? HPD_REQ_EV_FULL
                                                                     : HPD_REQ_EV_REFUSED,
                  "%.*s", (int)reply->error_message_len, reply->error_message);
        return;
    }
    node_t *p = pick(c, r, true, NULL);
    if (p == NULL) {
        /* none usable now (suspect, out of rotation, draining, gone since
         * the placement): back to the queue, not a failed attempt */
        req_event(c, r, HPD_REQ_EV_FULL, "no prefill node can take %u tokens now", r->n_prompt);
        return;
    }
    /* checked (relayed as it came: only its validity is wanted here) */
    hpd_msg_reservation_t res = {0};
    hpd_proto_err_t err;
    const bool valid = hpd_msg_unpack(&hpd_msg_reservation, reply->result, &res, &err);
    hpd_msg_free(&hpd_msg_reservation, &res);
    if (!valid) {
        req_event(c, r, HPD_REQ_EV_FAILED, "reserve on %s: %s", d->name, err.text);
        return;
    }
    hpd_rpc_buf_t dest, samp, b;
    hpd_rpc_buf_init(&dest);
    hpd_msg_pack(&hpd_msg_destination,
                 &(hpd_msg_destination_t){.node = d->id,
                                          .xfer_raw = d->xfer_info,
                                          .xfer_raw_len = (uint32_t)d->xfer_info_len,
                                          .reservation = reply->result},
                 &dest.pk);
    hpd_rpc_buf_init(&samp);
    hpd_proto_pack_sampling(&samp.pk, &r->sampling);
    const hpd_msg_prefill_job_t pj = {.job = job,
                                      .request = r->id,
                                      .prompt = r->prompt,
                                      .prompt_n = r->n_prompt,
                                      .sampling_raw = samp.sb.data,
                                      .sampling_raw_len = (uint32_t)samp.sb.size,
                                      .decode_raw = dest.sb.data,
                                      .decode_raw_len = (uint32_t)dest.sb.size,
                                      .logprobs = r->ch[0].lp != NULL,
                                      .top_logprobs = r->top_logprobs,
                                      .prompt_logprobs = r->plp != NULL,
                                      .grammar = r->grammar,
                                      .grammar_len = r->grammar_len,
                                      .n = r->n_ch > 1 ? r->n_ch : 0};
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_prefill_job, &pj, &b.pk);
    hpd_rpc_buf_destroy(&dest);
    hpd_rpc_buf_destroy(&samp);
    r->pnode = p;
    r->probe_p = hpd_breaker_placed(&p->breaker, hpd_time_now());
    p->jobs++;
    p->queued_tokens += r->n_prompt;
    hpd_reg_view_sync(p);
    req_event(c, r, HPD_REQ_EV_RESERVED, "reserved on %s", d->name);
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "job %llu: prefill on %s, decode on %s",
                  (unsigned long long)job, p->name, d->name);
    call_ctx_t *pc = ctx_new(c, job, p->id);
    const hpd_status_t pst = pc == NULL ? HPD_ERR_NO_MEMORY
                                        : hpd_rpc_call(p->client, "prefill", &b,
                                                       PREFILL_TIMEOUT_MS, on_prefilled, pc);
    hpd_rpc_buf_destroy(&b);
    if (pst != HPD_OK) {
        free(pc);
        req_event(c, r, HPD_REQ_EV_FAILED, "cannot reach prefill node %s", p->name);
    }
}

static void on_prefilled(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *x = arg;
    hpd_coord_t *c = x->coord;
    req_t *r = req_by_job(c, x->job);
    hpd_proto_err_t err;
    hpd_msg_prefilled_t m = {0};
    free(x);
    if (r == NULL || r->fsm.state != HPD_REQ_PREFILLING)
        return; /* an older attempt */
    node_t *p = r->pnode, *d = r->dnode;
    if (st != HPD_OK) {
        req_event(c, r, HPD_REQ_EV_FAILED, "prefill on %s: %s", p->name, hpd_status_str(st));
        return;
    }
    if (reply->is_error) {
        const int len = (int)reply->error_message_len;
        const char *text = reply->error_message;
        if (reply->error_code == HPD_RPC_ERR_PARAMS) {
            req_event(c, r, HPD_REQ_EV_REFUSED, "%.*s", len, text);
        } else if (reply->error_code == HPD_RPC_ERR_PEER) {
            /* the data path between the two failed (a cut, a stopped
             * decode node, a missed transfer deadline): the next attempt
             * goes to another decode node where there is one */
            HPD_LOGR_WARN(LOG_COMPONENT, r->id, "pair %s -> %s failed: %.*s; the request "
                          "avoids %s", p->name, d != NULL ? d->name : "?", len, text,
                          d != NULL ? d->name : "?");
            hpd_reg_pair_failed(c, p, d, "the prefill node could not put into the decode node");
            req_event(c, r, HPD_REQ_EV_PAIR_FAILED, "prefill on %s: %.*s", p->name, len, text);
        } else {
            /* a job the prefill node failed counts against it (and its pair) */
            if (reply->error_code != HPD_RPC_ERR_OVERLOADED)
                hpd_reg_pair_failed(c, p, d, "the prefill job failed");
            req_event(c, r, HPD_REQ_EV_FAILED, "prefill on %s: %.*s", p->name, len, text);
        }
        return;
    }
    if (!hpd_msg_unpack(&hpd_msg_prefilled, reply->result, &m, &err)) {
        req_event(c, r, HPD_REQ_EV_FAILED, "prefill on %s: bad reply: %s", p->name, err.text);
        return;
    }
    hpd_reg_pair_ok(p, d);
    if (!req_event(c, r, HPD_REQ_EV_PREFILLED, "prefilled on %s", p->name))
        goto out;
    r->cached_tokens = m.cached_tokens;
    r->prefill_ms = m.prefill_ms;
    r->push_ms = m.push_ms;
    r->exposed_push_ms = m.exposed_push_ms;
    /* each choice's first token (one without), with its logprobs */
    int32_t first[HPD_MAX_CHOICES] = {(int32_t)m.first_token};
    hpd_token_logprobs_t lp0[HPD_MAX_CHOICES];
    const bool has_lp = r->ch[0].lp != NULL;
    char why[200];
    if (r->n_ch > 1 && (m.first_tokens_n != r->n_ch || m.first_tokens[0] != first[0] ||
                        !hpd_msg_ids_below(m.first_tokens, m.first_tokens_n, p->vocab,
                                           "first_tokens", &err))) {
        req_event(c, r, HPD_REQ_EV_FAILED, "prefill on %s: bad reply: first_tokens has %u ids "
                  "below the vocabulary (expected %u, the first equal to first_token)", p->name,
                  m.first_tokens_n, r->n_ch);
        goto out;
    }
    for (uint32_t k = 1; k < r->n_ch; k++)
        first[k] = m.first_tokens[k];
    if (has_lp && !hpd_logprobs_decode(m.logprobs, m.logprobs_len, r->n_ch, r->top_logprobs,
                                       p->vocab, lp0, why, sizeof(why))) {
        req_event(c, r, HPD_REQ_EV_FAILED, "prefill on %s: bad reply: %s", p->name, why);
        goto out;
    }
    if (r->plp != NULL && !r->have_plp) { /* (a retry's are the same) */
        if (!hpd_logprobs_decode(m.prompt_logprobs, m.prompt_logprobs_len, r->n_prompt - 1,
                                 r->top_logprobs, p->vocab, r->plp, why, sizeof(why))) {
            req_event(c, r, HPD_REQ_EV_FAILED, "prefill on %s: bad reply: prompt %s", p->name,
                      why);
            goto out;
        }
        r->have_plp = true;
    }
    for (uint32_t k = 0; k < r->n_ch; k++)
        add_tokens(r, k, 0, &first[k], has_lp ? &lp0[k] : NULL, 1);
    if (r->stopped) {
        req_event(c, r, HPD_REQ_EV_CANCEL, "its first tokens ended it (a stop string)");
        goto out;
    }
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_start,
                 &(hpd_msg_start_t){.job = r->job,
                                    .first_token = m.first_token,
                                    .first_tokens = r->n_ch > 1 ? first : NULL,
                                    .first_tokens_n = r->n_ch > 1 ? r->n_ch : 0},
                 &b.pk);
    call_ctx_t *sc = ctx_new(c, r->job, d->id);
    const hpd_status_t sst = sc == NULL ? HPD_ERR_NO_MEMORY
                                        : hpd_rpc_call(d->client, "start", &b, CALL_TIMEOUT_MS,
                                                       on_started, sc);
    hpd_rpc_buf_destroy(&b);
    if (sst != HPD_OK) {
        free(sc);
        req_event(c, r, HPD_REQ_EV_FAILED, "cannot reach decode node %s", d->name);
    }
out:
    hpd_msg_free(&hpd_msg_prefilled, &m);
}

static void on_started(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *x = arg;
    req_t *r = req_by_job(x->coord, x->job);
    if (r != NULL && r->fsm.state == HPD_REQ_DECODING && (st != HPD_OK || reply->is_error))
        req_event(x->coord, r, HPD_REQ_EV_FAILED, "decode start failed: %s",
                  st != HPD_OK ? hpd_status_str(st) : "refused by the decode node");
    free(x);
}

/* ------------------------------------------------------------ its tokens */

/* A node's notification (the RPC client's arg is the node: the client is
 * destroyed before the node is freed; a lost node's are ignored). */
void hpd_core_on_node_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    node_t *n = arg;
    hpd_coord_t *c = n->coord;
    hpd_proto_err_t err;
    hpd_msg_tokens_t m = {0};
    req_t *r;

    if (!n->alive || !hpd_rpc_str_eq(msg->method, msg->method_len, "tokens"))
        return;
    if (!hpd_msg_unpack(&hpd_msg_tokens, msg->params, &m, &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "bad tokens notification from %s: %s", n->name, err.text);
        return;
    }
    if ((r = req_by_job(c, m.job)) == NULL || r->dnode != n) {
        /* an older attempt's, or not this node's */
    } else if (m.error[0] != '\0') {
        /* the decode node ended the attempt (its reservation expired, a bad
         * transfer, a failed step) in whatever state the request is. While
         * the prefill node is at it, it is told to stop first and the
         * decode node's cancel follows its answer: an expired reservation
         * keeps its pages until then, fenced against the prefill node's
         * late puts. Otherwise the node freed it. */
        if (r->fsm.state == HPD_REQ_PREFILLING && r->pnode != NULL)
            HPD_LOGR_WARN(LOG_COMPONENT, r->id, "pair %s -> %s failed: %s while the prefill "
                          "pushed; the request avoids %s", r->pnode->name, n->name, m.error,
                          n->name);
        req_event(c, r, HPD_REQ_EV_DECODE_ENDED, "decode on %s: %s", n->name, m.error);
    } else if (m.choice >= r->n_ch) {
        HPD_LOGR_WARN(LOG_COMPONENT, r->id, "tokens of choice %u from %s ignored: the request "
                      "has %u", m.choice, n->name, r->n_ch);
    } else if (r->fsm.state == HPD_REQ_DECODING) {
        hpd_token_logprobs_t *lp = NULL;
        choice_t *ch = &r->ch[m.choice];
        char why[200] = "out of memory";
        if (ch->lp != NULL && m.ids_n > 0 &&
            ((lp = malloc(m.ids_n * sizeof(*lp))) == NULL ||
             !hpd_logprobs_decode(m.logprobs, m.logprobs_len, m.ids_n, r->top_logprobs,
                                  n->vocab, lp, why, sizeof(why)))) {
            free(lp);
            req_event(c, r, HPD_REQ_EV_FAILED, "decode on %s: bad tokens: %s", n->name, why);
            hpd_msg_free(&hpd_msg_tokens, &m);
            return;
        }
        add_tokens(r, m.choice, m.index, m.ids, lp, m.ids_n);
        free(lp);
        if (r->door[0] != '\0') /* the rest went to the front door: their count */
            ch->n_elsewhere = (uint32_t)HPD_MAX(
                (uint64_t)ch->n_elsewhere, HPD_MIN((uint64_t)m.index + m.ids_n, r->max_tokens));
        if (m.done && !ch->done) {
            ch->done = true;
            snprintf(ch->finish_reason, sizeof(ch->finish_reason), "%s",
                     ch->stopped ? "stop" : m.finish_reason);
        }
        if (all_done(r)) {
            req_event(c, r, HPD_REQ_EV_DONE, "done");
        } else if (all_over(r)) { /* the rest stopped by the sink: the node lets go */
            r->stopped = true;
            req_event(c, r, HPD_REQ_EV_CANCEL, "its client stopped it (a stop string)");
        }
    }
    hpd_msg_free(&hpd_msg_tokens, &m);
}

/* Appends choice k's tokens reported from index `index` on; earlier ones
 * (replayed or computed again after a failover) must match what the client
 * already has. */
static void add_tokens(req_t *r, uint32_t k, uint32_t index, const int32_t *ids,
                       const hpd_token_logprobs_t *lp, uint32_t n)
{
    choice_t *ch = &r->ch[k];
    const uint32_t before = ch->n_out;
    uint32_t pos;
    int32_t was, now;
    if (hpd_choice_add(ch, r->max_tokens, index, ids, lp, n, &pos, &was, &now) > 0)
        HPD_LOGR_ERROR(LOG_COMPONENT, r->id, "choice %u: token %u is %d after a retry, "
                       "%d before (determinism broken)", k, pos, now, was);
    if (r->t_first == 0 && ch->n_out > 0)
        r->t_first = hpd_time_now();
    stream(r, k, before);
}

static bool all_over(const req_t *r)
{
    return hpd_choices_over(r->ch, r->n_ch);
}

static bool all_done(const req_t *r)
{
    return hpd_choices_done(r->ch, r->n_ch);
}

/* Gives the sink choice k's tokens [from, n_out); it may stop the choice
 * there (a stop string). */
static void stream(req_t *r, uint32_t k, uint32_t from)
{
    if (hpd_choice_stream(&r->ch[k], &r->sink, k, from))
        r->stopped = all_over(r);
}

/* ------------------------------------------------------------ events: failures, losses, timeouts, hedges */

/* Feeds r an event; the rest as carry_out. */
static bool req_event(hpd_coord_t *c, req_t *r, hpd_req_event_t ev, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return carry_out(c, r, hpd_req_fsm_event(&r->fsm, ev, c->o.max_attempts), why);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    hpd_coord_t *c = arg;
    const double now = hpd_time_now();
    /* A tick this late means the loop was busy (a long prompt tokenized, a
     * stopped process): the nodes' pings and heartbeats of that time may
     * wait unread in their sockets, so nobody is judged on this tick; the
     * next one, after the loop has read them, does. */
    const double since = now - c->last_tick;
    const bool late = c->last_tick > 0 && since > 3 * TICK_MS / 1000.0;
    c->last_tick = now;
    if (late)
        HPD_LOG_DEBUG(LOG_COMPONENT, "the loop was busy for %.0f ms: node checks wait a tick",
                      since * 1e3);
    if (!late)
        hpd_reg_tick(c, now);
    bool waiting = false;
    for (req_t *r = c->reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->fsm.state == HPD_REQ_QUEUED && r->hedge == NULL &&
            now - r->t_queued > c->o.queue_timeout_ms / 1000.0)
            req_event(c, r, HPD_REQ_EV_TIMEOUT, "no node could take the request within %u ms "
                      "(%s)", c->o.queue_timeout_ms,
                      r->last_error[0] ? r->last_error : "no room or no nodes");
        else
            waiting |= r->fsm.state == HPD_REQ_QUEUED;
    }
    /* a node out of rotation comes back by time (its cooldown): the queue
     * is looked at again each tick while something waits */
    if (waiting)
        hpd_core_schedule_soon(c);
}

/* A node was lost: nothing is sent to it, what it held died with it; the
 * survivor of each of its pairs is told to stop, and its requests run
 * again. */
void hpd_core_node_gone(hpd_coord_t *c, node_t *n)
{
    for (req_t *r = c->reqs, *next; r != NULL; r = next) {
        next = r->next;
        /* nothing is sent to the dead node: what it held died with it; the
         * survivor of the pair is told to stop */
        if (r->dnode == n) {
            r->dnode = NULL;
            r->dpages = 0;
            req_event(c, r, HPD_REQ_EV_DECODE_LOST, "decode node %s lost", n->name);
        } else if (r->pnode == n) {
            r->pnode = NULL;
            r->lost_writer = n->id;
            req_event(c, r, HPD_REQ_EV_PREFILL_LOST, "prefill node %s lost", n->name);
        }
    }
}

/* A node went suspect: each request it holds races a hedge elsewhere, or
 * (a hedge itself, or out of memory) runs again elsewhere. */
void hpd_core_node_suspect(hpd_coord_t *c, node_t *n, double now, uint32_t *hedged_p,
                           uint32_t *moved_p)
{
    for (req_t *r = c->reqs, *next; r != NULL; r = next) {
        next = r->next; /* before a hedge is queued behind r */
        if ((r->dnode != n && r->pnode != n) || r->fsm.state == HPD_REQ_QUEUED ||
            r->hedge != NULL || r->stopped)
            continue;
        if (!r->is_hedge && start_hedge(c, r, n)) {
            (*hedged_p)++;
            continue;
        }
        /* a hedge (or out of memory): runs again elsewhere */
        (*moved_p)++;
        req_event(c, r, HPD_REQ_EV_FAILED, "%s node %s is suspect (no liveness ping for "
                  "%.0f ms): the request runs again elsewhere", hpd_reg_role_name(n), n->name,
                  (now - n->liveness.last) * 1e3);
    }
}

/* Races r, whose attempt is on the suspect node n, with a copy of it
 * placed elsewhere (right behind r in the queue, so with r's turn),
 * replaying the tokens the client has. False: out of memory, or a request
 * still waiting for its prompt's logprobs. */
static bool start_hedge(hpd_coord_t *c, req_t *r, const node_t *n)
{
    if (r->plp != NULL && !r->have_plp)
        return false; /* its prompt's logprobs come with its own prefill: it runs again */
    if (r->n_ch > 1)
        return false; /* its choices run again (a hedge replays one answer) */
    req_t *h = req_new(c, r->prompt, r->n_prompt, r->max_tokens, r->stop_ids, r->n_stop, 1,
                       r->ch[0].lp != NULL, r);
    if (h == NULL)
        return false;
    h->is_hedge = true;
    h->primary = r;
    h->sink = (hpd_coord_sink_t){.tokens = hedge_tokens, .arg = h};
    h->sampling = r->sampling;
    h->ignore_eos = r->ignore_eos;
    h->min_tokens = r->min_tokens;
    memcpy(h->ch[0].out, r->ch[0].out, r->ch[0].n_out * sizeof(int32_t));
    h->ch[0].n_out = r->ch[0].n_out;
    if (r->ch[0].lp != NULL)
        memcpy(h->ch[0].lp, r->ch[0].lp, r->ch[0].n_out * sizeof(*r->ch[0].lp));
    h->top_logprobs = r->top_logprobs;
    memcpy(h->door, r->door, sizeof(h->door)); /* it streams to its primary's door too */
    h->tag = r->tag;
    h->avoid_decode = n->role == ROLE_DECODE ? n->id : r->avoid_decode;
    r->hedge = h;
    r->hedges++;
    c->hedged++;
    hpd_metric_inc(c->m.hedges, 1);
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "hedged: its %s node %s is suspect; request %llu "
                  "races it elsewhere from token %u, the first to finish answers",
                  hpd_reg_role_name(n), n->name,
                  (unsigned long long)h->id, r->ch[0].n_out);
    return true;
}

/* A hedge's tokens go to its primary (whose sink may stop both); only
 * requests of one choice are hedged. */
static bool hedge_tokens(void *arg, uint32_t k, const int32_t *out,
                         const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                         uint32_t *keep_p)
{
    req_t *h = arg, *r = h->primary;
    *keep_p = n;
    if (r == NULL)
        return false; /* its primary ended: it is canceled */
    add_tokens(r, k, from, out + from, lp != NULL ? lp + from : NULL, n - from);
    return !r->ch[k].stopped;
}

/* Hedge h ended (won: it finished first, its tokens are its primary's):
 * the primary finishes with them, or goes on alone (placed again where
 * it waited in the queue; failed where it had no attempts left). */
static void hedge_ended(hpd_coord_t *c, req_t *h, bool won, const char *why)
{
    req_t *r = h->primary;
    if (r == NULL)
        return; /* its primary ended first */
    r->hedge = NULL;
    h->primary = NULL;
    r->own_over |= r->fsm.state == HPD_REQ_QUEUED; /* it waited for the hedge */
    if (won) {
        hpd_metric_inc(c->m.hedge_wins, 1);
        snprintf(r->ch[0].finish_reason, sizeof(r->ch[0].finish_reason), "%s",
                 h->ch[0].stopped ? "stop" : h->ch[0].finish_reason);
        r->ch[0].n_elsewhere = HPD_MAX(r->ch[0].n_elsewhere, h->ch[0].n_elsewhere);
        r->cached_tokens = h->cached_tokens;
        r->prefill_ms = h->prefill_ms;
        r->push_ms = h->push_ms;
        r->exposed_push_ms = h->exposed_push_ms;
        req_event(c, r, HPD_REQ_EV_HEDGE_WON, "its hedge (request %llu) finished first",
                  (unsigned long long)h->id);
        return;
    }
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "its hedge (request %llu) ended: %s",
                  (unsigned long long)h->id, why);
    if (r->gave_up) {
        carry_out(c, r, (hpd_req_plan_t){.verdict = HPD_REQ_FAIL, .code = HPD_RPC_ERR_APP,
                                          .gave_up = true}, why);
        return;
    }
    r->t_queued = hpd_time_now(); /* its queue timeout starts now, if it waited */
    hpd_core_schedule_soon(c);
}

/* ------------------------------------------------------------ its end */

static void reply_finished(hpd_coord_t *c, req_t *r)
{
    const double now = hpd_time_now();
    const choice_t *c0 = &r->ch[0];
    /* (a door's request stopped before its first token came here: none) */
    const double ttft = r->t_first > 0 ? r->t_first - r->t_submit : 0, total = now - r->t_submit;
    /* a remote door's choices: the tokens the decode node counted */
    const uint32_t n0 = HPD_MAX(c0->n_out, c0->n_elsewhere);
    const double tpot = n0 > 1 && r->t_first > 0 ? (now - r->t_first) / (n0 - 1) : 0;
    hpd_coord_choice_t chs[HPD_MAX_CHOICES];
    uint32_t generated = 0;
    hpd_choices_result(r->ch, r->n_ch, chs);
    for (uint32_t k = 0; k < r->n_ch; k++)
        generated += HPD_MAX(r->ch[k].n_out, r->ch[k].n_elsewhere);
    const hpd_coord_result_t res = {.outcome = HPD_COORD_FINISHED,
                                    .request = r->id,
                                    .tokens = c0->out,
                                    .logprobs = c0->lp,
                                    .prompt_logprobs = r->have_plp ? r->plp : NULL,
                                    .top_logprobs = r->top_logprobs,
                                    .n_tokens = c0->n_out,
                                    .finish_reason = c0->finish_reason,
                                    .choices = chs,
                                    .n_choices = r->n_ch,
                                    .prompt_tokens = r->n_prompt,
                                    .cached_tokens = r->cached_tokens,
                                    .attempts = attempts_of(r),
                                    .ttft_ms = (float)(ttft * 1e3),
                                    .total_ms = (float)(total * 1e3),
                                    .prefill_ms = r->prefill_ms,
                                    .push_ms = r->push_ms,
                                    .exposed_push_ms = r->exposed_push_ms};
    r->sink.done(r->sink.arg, &res);
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "finished: %u tokens (%s)%s, ttft %.1f ms, tpot %.2f "
                  "ms, %u of %u prompt tokens cached, %u attempt(s)", n0,
                  c0->finish_reason, r->n_ch > 1 ? " in its first choice" : "", ttft * 1e3,
                  tpot * 1e3, r->cached_tokens, r->n_prompt, attempts_of(r));
    count_end(c, &res, generated, tpot);
}

/* A request's end in the metrics (docs/operations.md), the core's own
 * and a front door's alike: its outcome, and for a finished one its
 * times (TTFT where its first token came, TPOT where tpot_s > 0), tokens
 * (generated: every choice's) and finish reasons. */
static void count_end(hpd_coord_t *c, const hpd_coord_result_t *res, uint32_t generated,
                      double tpot_s)
{
    if (res->outcome == HPD_COORD_CANCELED) {
        c->canceled++;
        hpd_metric_inc(c->m.canceled, 1);
        return;
    }
    if (res->outcome == HPD_COORD_FAILED) {
        c->failed++;
        hpd_metric_inc(res->code == HPD_RPC_ERR_OVERLOADED ? c->m.overloaded
                       : res->code == HPD_RPC_ERR_PARAMS   ? c->m.invalid
                                                           : c->m.failed, 1);
        return;
    }
    for (uint32_t k = 0; k < res->n_choices; k++) {
        if (strcmp(res->choices[k].finish_reason, "stop") == 0)
            hpd_metric_inc(c->m.finish_stop, 1);
        else if (strcmp(res->choices[k].finish_reason, "length") == 0)
            hpd_metric_inc(c->m.finish_length, 1);
    }
    c->finished++;
    hpd_metric_inc(c->m.ok, 1);
    if (res->ttft_ms > 0)
        hpd_metric_observe(c->m.ttft, res->ttft_ms / 1e3);
    if (tpot_s > 0)
        hpd_metric_observe(c->m.tpot, tpot_s);
    hpd_metric_observe(c->m.duration, res->total_ms / 1e3);
    hpd_metric_inc(c->m.prompt_tokens, res->prompt_tokens);
    hpd_metric_inc(c->m.generated_tokens, generated);
    hpd_metric_inc(c->m.cached_tokens, res->cached_tokens);
}

/* Its attempts, for the client and the log: the failed ones, the last
 * (unless it failed too) and its hedges. */
static uint32_t attempts_of(const req_t *r)
{
    return r->fsm.attempts + !r->own_over + r->hedges;
}

static void tell_end(req_t *r, hpd_coord_outcome_t outcome, int64_t code, const char *why)
{
    hpd_coord_choice_t chs[HPD_MAX_CHOICES];
    hpd_choices_result(r->ch, r->n_ch, chs);
    const hpd_coord_result_t res = {.outcome = outcome,
                                    .code = code,
                                    .error = why,
                                    .request = r->id,
                                    .tokens = r->ch[0].out,
                                    .logprobs = r->ch[0].lp,
                                    .top_logprobs = r->top_logprobs,
                                    .n_tokens = r->ch[0].n_out,
                                    .choices = chs,
                                    .n_choices = r->n_ch,
                                    .prompt_tokens = r->n_prompt,
                                    .cached_tokens = r->cached_tokens,
                                    .attempts = attempts_of(r)};
    r->sink.done(r->sink.arg, &res);
}

static void send_cancel(node_t *n, uint64_t job, uint64_t writer, hpd_rpc_reply_cb_t cb,
                        void *arg)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_cancel_job, &(hpd_msg_cancel_job_t){.job = job, .writer = writer},
                 &b.pk);
    if (n == NULL || !n->alive ||
        hpd_rpc_call(n->client, "cancel", &b, CALL_TIMEOUT_MS, cb, arg) != HPD_OK)
        cb(arg, HPD_ERR_IO, NULL);
    hpd_rpc_buf_destroy(&b);
}

/* The decode side is freed only after the prefill side stopped writing:
 * it answered its cancel (its puts landed, or its endpoint was closed).
 * Where the pair failed, or the prefill node could not answer, puts may
 * still be on their way: the decode node closes that prefill node's
 * connection before it reuses the memory. */
static void on_prefill_canceled(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *x = arg; /* node: the decode node, 0 for none */
    const bool fence = x->fence || st != HPD_OK;
    if (x->node != 0)
        send_cancel(hpd_reg_node_by_id(x->coord, x->node), x->job, fence ? x->prefill : 0,
                    ignore_reply, NULL);
    free(x);
}

/* The attempt's probes are over: the pair's outcome (hpd_reg_pair_ok,
 * hpd_reg_pair_failed) said how they went, or nothing did (the attempt canceled,
 * moved off a suspect node) and the next request may probe. */
static void probes_over(req_t *r)
{
    if (r->probe_p && r->pnode != NULL) {
        hpd_breaker_probe_ended(&r->pnode->breaker);
        hpd_reg_view_sync(r->pnode);
    }
    if (r->probe_d && r->dnode != NULL) {
        hpd_breaker_probe_ended(&r->dnode->breaker);
        hpd_reg_view_sync(r->dnode);
    }
    r->probe_p = r->probe_d = false;
}

static void req_free(hpd_coord_t *c, req_t *r)
{
    probes_over(r);
    if (r->hedge != NULL) /* the race is over: carry_out's schedule() cancels the hedge */
        r->hedge->primary = NULL;
    if (r->primary != NULL)
        r->primary->hedge = NULL;
    set_job(c, r, 0);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        c->reqs = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        c->reqs_tail = r->prev;
    c->n_reqs -= !r->is_hedge;
    c->n_all--;
    free(r->prompt);
    free(r->stop_ids);
    free(r->hashes);
    hpd_choices_free(r->ch, r->n_ch);
    free(r->plp);
    free(r->grammar);
    free(r);
}

/* ------------------------------------------------------------ clients */

bool hpd_coord_cancel(hpd_coord_t *c, uint64_t id, const char *why)
{
    if (c->door != NULL)
        return hpd_door_cancel(c->door, id, why);
    for (req_t *r = c->reqs; r != NULL; r = r->next)
        if (r->id == id && !r->is_hedge) {
            req_event(c, r, HPD_REQ_EV_CANCEL, "%s", why);
            return true;
        }
    return false;
}

bool hpd_coord_cancel_tagged(hpd_coord_t *c, const void *owner, uint64_t tag, const char *why)
{
    if (c->door != NULL)
        return hpd_door_cancel_tagged(c->door, owner, tag, why);
    for (req_t *r = c->reqs; r != NULL; r = r->next)
        if (r->owner == owner && r->tag == tag && !r->is_hedge) {
            req_event(c, r, HPD_REQ_EV_CANCEL, "%s", why);
            return true;
        }
    return false;
}

bool hpd_coord_stop_tagged(hpd_coord_t *c, const void *owner, uint64_t tag, uint32_t k)
{
    for (req_t *r = c->reqs; r != NULL; r = r->next) {
        if (r->owner != owner || r->tag != tag || r->is_hedge)
            continue;
        if (k >= r->n_ch || r->ch[k].stopped)
            return true;
        r->ch[k].stopped = true;
        if ((r->stopped = all_over(r)))
            req_event(c, r, HPD_REQ_EV_CANCEL, "its front door stopped it (a stop string)");
        return true;
    }
    return false;
}

void hpd_coord_cancel_owned(hpd_coord_t *c, const void *owner, const char *why)
{
    if (c->door != NULL) {
        hpd_door_cancel_owned(c->door, owner, why);
        return;
    }
    for (req_t *r = c->reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->owner == owner && !r->is_hedge)
            req_event(c, r, HPD_REQ_EV_CANCEL, "%s", why);
    }
}

void hpd_coord_count_invalid(hpd_coord_t *c)
{
    hpd_metric_inc(c->m.invalid, 1);
}

const hpd_token_logprobs_t *hpd_coord_prompt_logprobs(const hpd_coord_t *c, uint64_t request)
{
    if (c->door != NULL)
        return hpd_door_prompt_logprobs(c->door, request);
    for (const req_t *r = c->reqs; r != NULL; r = r->next)
        if (r->id == request && !r->is_hedge)
            return r->have_plp ? r->plp : NULL;
    return NULL;
}

int hpd_coord_default_thinking(const hpd_coord_t *c)
{
    return c->o.default_thinking == 0 ? -1 : c->o.default_thinking == 1;
}

bool hpd_coord_draining(const hpd_coord_t *c)
{
    return c->draining;
}

/* A client's connection closed: its requests go; a node's: the node is lost. */
static void on_disconnect(hpd_rpc_conn_t *conn, void *arg)
{
    hpd_coord_t *c = arg;
    const uint64_t node_id = (uint64_t)(uintptr_t)hpd_rpc_conn_user(conn);
    if (node_id != 0) {
        node_t *n = hpd_reg_node_by_id(c, node_id);
        if (n != NULL)
            hpd_reg_node_lost(c, n, "its registration connection closed");
        return;
    }
    hpd_coord_cancel_owned(c, conn, "the client disconnected");
}

/* ------------------------------------------------------------ metrics */

static hpd_status_t metrics_init(metrics_t *m)
{
    const double *lat = hpd_metrics_latency_bounds;
    const uint32_t nl = hpd_metrics_n_latency_bounds;
    static const char req_help[] = "Generate requests answered, by outcome.";
    hpd_status_t st = hpd_metrics_create(&m->reg);
    if (st != HPD_OK)
        return st;
    m->ok = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_requests_total", req_help,
                            "outcome=\"ok\"");
    m->failed = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_requests_total", req_help,
                                "outcome=\"failed\"");
    m->canceled = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_requests_total", req_help,
                                  "outcome=\"canceled\"");
    m->overloaded = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_requests_total", req_help,
                                    "outcome=\"overloaded\"");
    m->invalid = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_requests_total", req_help,
                                 "outcome=\"invalid\"");
    m->retries = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_request_retries_total",
                                 "Attempts started again after a node failed.", NULL);
    m->ttft = hpd_metrics_histogram(m->reg, "hpd_ttft_seconds",
                                    "Time from submit to the first token, finished requests.",
                                    NULL, lat, nl);
    m->tpot = hpd_metrics_histogram(m->reg, "hpd_tpot_seconds",
                                    "Mean time per output token after the first, per request.",
                                    NULL, hpd_metrics_tpot_bounds,
                                    hpd_metrics_n_tpot_bounds);
    m->duration = hpd_metrics_histogram(m->reg, "hpd_request_duration_seconds",
                                        "Time from submit to the last token.", NULL, lat, nl);
    m->queue_wait = hpd_metrics_histogram(m->reg, "hpd_queue_wait_seconds",
                                          "Time a request waited in the queue per attempt.",
                                          NULL, lat, nl);
    m->prompt_tokens = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_prompt_tokens_total",
                                       "Prompt tokens of finished requests.", NULL);
    m->generated_tokens = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                          "hpd_generated_tokens_total",
                                          "Tokens returned by finished requests.", NULL);
    m->cached_tokens = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                       "hpd_prefix_cache_hit_tokens_total",
                                       "Prompt tokens of finished requests served from a "
                                       "prefill node's prefix cache.", NULL);
    m->queued = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_requests_queued",
                                "Requests waiting for a decode reservation.", NULL);
    m->running = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_requests_running",
                                 "Requests placed on nodes (reserving, prefilling, decoding).",
                                 NULL);
    m->nodes_prefill = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_nodes",
                                       "Registered nodes by role.", "role=\"prefill\"");
    m->nodes_decode = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_nodes",
                                      "Registered nodes by role.", "role=\"decode\"");
    m->nodes_draining = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_nodes_draining",
                                        "Registered nodes that are draining.", NULL);
    m->node_losses = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_node_losses_total",
                                     "Nodes lost (connection closed or lease expired).", NULL);
    static const char finish_help[] = "Finished requests by why they ended: a stop or "
                                      "end-of-sequence token, or max_tokens.";
    m->finish_stop = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_finish_total",
                                     finish_help, "reason=\"stop\"");
    m->finish_length = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_finish_total",
                                       finish_help, "reason=\"length\"");
    m->out_of_rotation = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_nodes_out_of_rotation",
                                         "Nodes that take no new work after failed pairs, "
                                         "until a probe succeeds.", NULL);
    m->breaker_openings = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                          "hpd_nodes_taken_out_total",
                                          "Times a node was taken out of rotation after "
                                          "failed pairs.", NULL);
    m->suspects = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_node_suspects_total",
                                  "Times a node's liveness pings stopped for its suspect "
                                  "window (its requests were raced elsewhere).", NULL);
    m->hedges = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_request_hedges_total",
                                "Requests raced by a copy elsewhere because a node that held "
                                "them went suspect.", NULL);
    m->hedge_wins = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                    "hpd_request_hedge_wins_total",
                                    "Hedges that finished before the attempt they raced.",
                                    NULL);
    if (m->out_of_rotation == NULL || m->breaker_openings == NULL || m->suspects == NULL ||
        m->hedges == NULL || m->hedge_wins == NULL)
        return HPD_ERR_NO_MEMORY;
    m->pair_failures = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_pair_failures_total",
                                       "Prefill jobs whose transfer to the decode node failed "
                                       "(the request went to another decode node).", NULL);
    static const char conn_help[] = "Open RPC connections (clients and nodes).";
    m->conns_authed = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_rpc_connections",
                                      conn_help, "state=\"authenticated\"");
    m->conns_unauthed = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_rpc_connections",
                                        conn_help, "state=\"unauthenticated\"");
    static const char closed_help[] = "RPC connections closed by the server before they "
                                      "authenticated, by reason.";
    m->conns_refused = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                       "hpd_rpc_connections_closed_total", closed_help,
                                       "reason=\"limit\"");
    m->conns_evicted = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                       "hpd_rpc_connections_closed_total", closed_help,
                                       "reason=\"evicted\"");
    m->auth_timeouts = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                       "hpd_rpc_connections_closed_total", closed_help,
                                       "reason=\"auth_timeout\"");
    m->auth_failures = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER,
                                       "hpd_rpc_connections_closed_total", closed_help,
                                       "reason=\"auth_failed\"");
    return HPD_OK;
}

void hpd_coord_collect(hpd_coord_t *c)
{
    uint32_t queued = 0, prefill = 0, decode = 0, draining = 0;
    for (req_t *r = c->reqs; r != NULL; r = r->next)
        queued += !r->is_hedge && r->fsm.state == HPD_REQ_QUEUED;
    for (node_t *n = c->nodes; n != NULL; n = n->next) {
        prefill += n->alive && n->role == ROLE_PREFILL;
        decode += n->alive && n->role == ROLE_DECODE;
        draining += n->alive && n->draining;
    }
    hpd_metric_set(c->m.queued, queued);
    hpd_metric_set(c->m.running, c->n_reqs - queued);
    hpd_metric_set(c->m.nodes_prefill, prefill);
    hpd_metric_set(c->m.nodes_decode, decode);
    hpd_metric_set(c->m.nodes_draining, draining);
    uint32_t out = 0;
    const double now = hpd_time_now();
    for (node_t *n = c->nodes; n != NULL; n = n->next)
        out += n->alive && !hpd_breaker_usable(&n->breaker, now);
    hpd_metric_set(c->m.out_of_rotation, out);
    hpd_rpc_server_stats_t rs;
    hpd_rpc_server_stats(c->server, &rs);
    hpd_metric_set(c->m.conns_authed, rs.open - rs.unauthenticated);
    hpd_metric_set(c->m.conns_unauthed, rs.unauthenticated);
    hpd_metric_set(c->m.conns_refused, (double)rs.refused);
    hpd_metric_set(c->m.conns_evicted, (double)rs.evicted);
    hpd_metric_set(c->m.auth_timeouts, (double)rs.auth_timeouts);
    hpd_metric_set(c->m.auth_failures, (double)rs.auth_failures);
}

/* ------------------------------------------------------------ the context */

/* Ready while not draining; the body says what the coordinator has. */
bool hpd_coord_health(hpd_coord_t *c, char *msg, size_t len)
{
    if (c->door != NULL) {
        const bool up = hpd_door_health(c->door, msg, len);
        return up && !c->draining;
    }
    uint32_t prefill = 0, decode = 0;
    for (node_t *n = c->nodes; n != NULL; n = n->next) {
        prefill += n->alive && !n->draining && n->role == ROLE_PREFILL;
        decode += n->alive && !n->draining && n->role == ROLE_DECODE;
    }
    /* connections turned away now or in the last 10 s: clients and nodes
     * may be locked out */
    hpd_rpc_server_stats_t rs;
    hpd_rpc_server_stats(c->server, &rs);
    if (rs.last_refused > 0 && hpd_time_now() - rs.last_refused < 10.0) {
        snprintf(msg, len, "refusing connections: %u open (limit %u), %llu refused, the last "
                 "%.1f s ago", rs.open, rs.max_conns, (unsigned long long)rs.refused,
                 hpd_time_now() - rs.last_refused);
        return false;
    }
    snprintf(msg, len, "%s: %u prefill and %u decode nodes, %u open requests",
             c->draining ? "draining" : "ok", prefill, decode, c->n_reqs);
    return !c->draining;
}

static uint32_t authenticate(void *arg, const char *token, size_t len, char *who, size_t who_len,
                             uint64_t *credential_p)
{
    hpd_coord_t *c = arg;
    return hpd_credentials_check(c->creds, token, len, who, who_len, credential_p);
}

uint32_t hpd_coord_authenticate(hpd_coord_t *c, const char *token, size_t len, char *who,
                                size_t who_len, uint64_t *credential_p)
{
    *credential_p = 0;
    if (c->creds == NULL) {
        snprintf(who, who_len, "anyone (an open coordinator)");
        return HPD_ROLE_CLIENT | HPD_ROLE_NODE;
    }
    return hpd_credentials_check(c->creds, token, len, who, who_len, credential_p);
}

bool hpd_coord_grants(const hpd_coord_t *c, uint64_t credential, uint32_t role)
{
    return c->creds == NULL || hpd_credentials_grants(c->creds, credential, role);
}

static bool revoked(const hpd_rpc_conn_t *conn, void *arg)
{
    hpd_coord_t *c = arg;
    return !hpd_credentials_grants(c->creds, hpd_rpc_conn_credential(conn),
                                   hpd_rpc_conn_roles(conn));
}

void hpd_coord_reload(hpd_coord_t *c)
{
    char err[400];
    hpd_credentials_t *fresh;
    if (c->creds == NULL) {
        HPD_LOG_WARN(LOG_COMPONENT, "SIGHUP: no credentials to read again (no --token-file)");
        return;
    }
    if (hpd_credentials_load(c->o.token_file, c->o.client_keys_file, &fresh, err, sizeof(err)) !=
        HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "SIGHUP: keeping the credentials in force: %s", err);
        return;
    }
    hpd_credentials_destroy(c->creds);
    c->creds = fresh;
    const uint32_t closed = hpd_rpc_server_close_if(c->server, revoked, c);
    HPD_LOG_INFO(LOG_COMPONENT, "SIGHUP: credentials read again: %zu client keys; %u "
                 "connections of revoked credentials closed", hpd_credentials_n_keys(c->creds),
                 closed);
}

void hpd_coord_drain(hpd_coord_t *c)
{
    c->draining = true;
}

uint32_t hpd_coord_open_requests(const hpd_coord_t *c)
{
    return c->door != NULL ? hpd_door_open_requests(c->door) : c->n_reqs;
}

void hpd_coord_end_drain(hpd_coord_t *c, bool stop_nodes)
{
    c->draining = true;
    if (c->door != NULL)
        hpd_door_end_all(c->door, "front door shutting down (drain deadline passed)");
    while (c->reqs != NULL) /* the deadline passed */
        req_event(c, c->reqs, HPD_REQ_EV_SHUTDOWN, "coordinator shutting down (drain deadline "
                  "passed)");
    if (!stop_nodes) {
        HPD_LOG_INFO(LOG_COMPONENT, "drained for a restart: the nodes stay up");
        return;
    }
    for (node_t *n = c->nodes; n != NULL; n = n->next)
        if (n->alive && n->reg_conn != NULL)
            hpd_rpc_notify(n->reg_conn, "shutdown", NULL);
    HPD_LOG_INFO(LOG_COMPONENT, "drained: nodes told to shut down");
}

uint16_t hpd_coord_port(const hpd_coord_t *c)
{
    return hpd_rpc_server_port(c->server);
}

hpd_metrics_t *hpd_coord_metrics(hpd_coord_t *c)
{
    return c->m.reg;
}

/* A front door's request ended: its metrics, as the core counts its own
 * (docs/operations.md). */
static void door_ended(void *arg, const hpd_coord_result_t *res)
{
    uint32_t generated = 0;
    for (uint32_t k = 0; k < res->n_choices; k++)
        generated += res->choices[k].n_tokens;
    const double tpot = res->n_tokens > 1 && res->ttft_ms > 0
                            ? (res->total_ms - res->ttft_ms) / 1e3 / (res->n_tokens - 1)
                            : 0;
    count_end(arg, res, generated, tpot);
}

/* A front door's: tokens a decode node streams (coordinator/door.h). */
static void door_tokens(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                        void *arg)
{
    hpd_coord_t *c = arg;
    (void)conn;
    (void)id;
    hpd_door_tokens(c->door, params);
}

hpd_status_t hpd_coord_create(struct event_base *base, const hpd_coord_opts_t *o,
                              hpd_coord_t **coord_p, char *err, size_t err_len)
{
    static const hpd_rpc_method_t methods[] = {
        {.name = "register", .fn = hpd_reg_register, .roles = HPD_ROLE_NODE},
        {.name = "heartbeat", .fn = hpd_reg_heartbeat, .roles = HPD_ROLE_NODE},
        {.name = "alive", .fn = hpd_reg_alive, .roles = HPD_ROLE_NODE},
        {.name = "generate", .fn = hpd_msgdoor_generate, .roles = HPD_ROLE_CLIENT},
        {.name = "cancel", .fn = hpd_msgdoor_cancel, .roles = HPD_ROLE_CLIENT},
        {.name = "status", .fn = hpd_reg_status, .roles = HPD_ROLE_CLIENT | HPD_ROLE_NODE},
        /* remote front doors (coordinator/door.h) present the node secret */
        {.name = "schedule", .fn = hpd_link_schedule, .roles = HPD_ROLE_NODE},
        {.name = "unschedule", .fn = hpd_link_unschedule, .roles = HPD_ROLE_NODE,
         .notification = true},
        {.name = "limits", .fn = hpd_link_limits, .roles = HPD_ROLE_NODE},
    };
    /* a front door's: its clients' calls and the decode nodes' tokens */
    static const hpd_rpc_method_t door_methods[] = {
        {.name = "generate", .fn = hpd_msgdoor_generate, .roles = HPD_ROLE_CLIENT},
        {.name = "cancel", .fn = hpd_msgdoor_cancel, .roles = HPD_ROLE_CLIENT},
        {.name = "tokens", .fn = door_tokens, .roles = HPD_ROLE_NODE, .notification = true},
    };
    const bool door = o->scheduler != NULL;
    hpd_status_t st;
    hpd_coord_t *c = calloc(1, sizeof(*c));
    *coord_p = NULL;
    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    c->o = *o;
    c->base = base;
    if (o->token_file != NULL) {
        if ((st = hpd_rpc_read_token(o->token_file, &c->token)) != HPD_OK) {
            snprintf(err, err_len, "cannot read the token file %s", o->token_file);
            goto fail;
        }
        if ((st = hpd_credentials_load(o->token_file, o->client_keys_file, &c->creds, err,
                                       err_len)) != HPD_OK)
            goto fail;
    }
    if (o->model_dir != NULL && (st = hpd_text_load(o->model_dir, &c->text, err, err_len)) !=
                                    HPD_OK)
        goto fail;
    if ((st = metrics_init(&c->m)) != HPD_OK || (st = hpd_reg_view_init(c)) != HPD_OK) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    /* Node and job ids are new across restarts: they start at the
     * milliseconds since 2020 times 2^14, so that a node still holding work
     * of a coordinator that died (a late transfer notice, an endpoint named
     * by a node id) never takes it for work of this one. Below 2^53. */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    const int64_t ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000 - 1577836800000;
    c->next_node = c->next_job = ms > 0 ? (uint64_t)ms << 14 : 0;
    c->tick = event_new(base, -1, EV_PERSIST, on_tick, c);
    c->reap = evtimer_new(base, hpd_reg_on_reap, c);
    c->sched = evtimer_new(base, on_sched, c);
    if (c->tick == NULL || c->reap == NULL || c->sched == NULL) {
        st = HPD_ERR_NO_MEMORY;
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    const hpd_rpc_server_params_t sp = {.base = base,
                                        .host = o->host,
                                        .port = o->port,
                                        .token = c->token,
                                        .methods = door ? door_methods : methods,
                                        .n_methods = door ? HPD_ARRAY_SIZE(door_methods)
                                                          : HPD_ARRAY_SIZE(methods),
                                        .arg = c,
                                        .on_disconnect = on_disconnect,
                                        .max_conns = o->max_connections,
                                        .authenticate = c->creds != NULL ? authenticate : NULL};
    if ((st = hpd_rpc_server_create(&sp, &c->server)) != HPD_OK) {
        snprintf(err, err_len, "cannot listen on %s:%u (%s)", o->host, o->port,
                 hpd_status_str(st));
        goto fail;
    }
    if (door) {
        char at[80];
        snprintf(at, sizeof(at), "%s:%u", o->advertise != NULL ? o->advertise : o->host,
                 hpd_rpc_server_port(c->server));
        const hpd_door_params_t dp = {.base = base,
                                      .schedulers = o->scheduler,
                                      .token = c->token,
                                      .address = at,
                                      .ended = door_ended,
                                      .arg = c};
        if ((st = hpd_door_create(&dp, &c->door, err, err_len)) != HPD_OK)
            goto fail;
    }
    static const struct timeval tick = {0, TICK_MS * 1000};
    event_add(c->tick, &tick);
    *coord_p = c;
    return HPD_OK;
fail:
    hpd_coord_destroy(c);
    return st;
}

void hpd_coord_destroy(hpd_coord_t *c)
{
    if (c == NULL)
        return;
    hpd_door_destroy(c->door); /* its open requests end ("shutting down") */
    while (c->reqs != NULL)
        req_event(c, c->reqs, HPD_REQ_EV_SHUTDOWN, "coordinator shutting down");
    while (c->nodes != NULL) {
        node_t *n = c->nodes;
        c->nodes = n->next;
        n->next = c->dead;
        c->dead = n;
    }
    hpd_reg_on_reap(-1, 0, c);
    hpd_rpc_server_destroy(c->server);
    hpd_metrics_destroy(c->m.reg);
    struct event *evs[] = {c->tick, c->reap, c->sched};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(evs); i++)
        if (evs[i] != NULL)
            event_free(evs[i]);
    free(c->token);
    hpd_credentials_destroy(c->creds);
    hpd_text_destroy(c->text);
    hpd_u64map_free(&c->node_ids);
    hpd_u64map_free(&c->jobs);
    free(c->view);
    free(c->view_map);
    free(c->watched);
    free(c);
}

const struct hpd_text *hpd_coord_text(const hpd_coord_t *c)
{
    return c->text;
}
