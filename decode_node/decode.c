/* hpd-decode: holds reservations (a GDN slot and the KV pages of a request)
 * that prefill nodes fill over UCX, then runs the requests in one
 * continuous batch and streams their tokens to the coordinator
 * (docs/cluster.md).
 *
 * A request here: `reserve` creates it (reserved), the transfer's
 * completion notice and the coordinator's `start` (with the first token)
 * may come in either order, and with both it joins the batch (running).
 * Tokens go out as `tokens` notifications on the coordinator's connection
 * after each step; a finished, failed, canceled or expired request is freed
 * at once. Who frees what: a request holds a reference on the connection it
 * streams to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "node/msg.h"
#include "node/node.h"
#include "decode_node/decode.h"
#include "decode_node/join.h"
#include "decode_node/writes.h"
#include "node/proto.h"

#define LOG_COMPONENT "decode"

/* A remote front door (coordinator/door.h) this node streams tokens to:
 * one connection per door, shared by its requests; a closed one is
 * replaced by the next request naming the door and freed once no request
 * holds it. */
typedef struct door_link {
    char addr[72]; /* "HOST:PORT" */
    hpd_rpc_client_t *client; /* NULL: the connection could not start (at failed_at) */
    bool closed;
    double failed_at;
    uint32_t refs;
    struct door_link *next;
} door_link_t;

#define DOOR_CONNECT_MS 1000 /* the connect blocks the loop this long at most */
#define DOOR_RETRY_S 5.0     /* a door that could not be reached is not tried again before */

typedef struct dreq {
    struct decode *owner;
    uint64_t job;
    uint64_t request; /* the coordinator's request id, for logs */
    uint64_t eng_id;
    double t_reserved, t_running;
    uint32_t n_first; /* tokens the request had when it joined the batch */
    uint32_t n_prompt; /* its prompt pages are where the prefill node writes */
    hpd_rpc_conn_t *conn; /* the coordinator's, for notifications */
    /* a remote front door's request: the tokens go there (its id there:
     * door_request); the coordinator hears only how many and the end */
    door_link_t *door;
    uint64_t door_request;
    hpd_join_t join; /* notice and start (decode_node/join.h) */
    uint32_t n_choices;   /* answers from one prompt (1 without) */
    int32_t first[HPD_MAX_CHOICES]; /* each choice's first token, from `start` */
    uint32_t sent[HPD_MAX_CHOICES]; /* a choice's tokens already streamed (the next index) */
    bool ended[HPD_MAX_CHOICES];    /* its last tokens went out */
    bool logprobs;        /* the tokens' log probabilities go with them */
    uint32_t top_logprobs;
    struct event *expiry;
    struct dreq *next;
} dreq_t;

typedef struct decode {
    hpd_node_t *node;
    dreq_t *reqs;
    door_link_t *doors;
    /* each rank's page pool and slot pool (tensor parallelism: one pair a rank) */
    uint32_t tp;
    uint32_t kv_regions[HPD_TP_MAX], slot_regions[HPD_TP_MAX];
    int32_t kv_ids[HPD_TP_MAX], slot_ids[HPD_TP_MAX]; /* the same, as the reply packs them */
    uint64_t reserved, started, finished, failed, canceled, expired, bad_transfers;
    uint64_t fence_backstops; /* fenced pages freed without a cancel */
    uint64_t writers_fenced;  /* writers' connections closed before a cancel's free */
    uint64_t foreign_writes;  /* notices naming memory outside their reservation */
    struct {
        hpd_metric_t *done, *failed, *canceled, *expired, *reserved, *running;
        hpd_metric_t *wait_s, *tpot_s;
    } m;
} decode_t;


static dreq_t *find(decode_t *d, uint64_t job)
{
    for (dreq_t *r = d->reqs; r != NULL; r = r->next)
        if (r->job == job)
            return r;
    return NULL;
}

static void dreq_free(decode_t *d, dreq_t *r)
{
    for (dreq_t **pp = &d->reqs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    hpd_engine_release(d->node->engine, r->eng_id); /* frees its pages and slot */
    if (r->expiry)
        event_free(r->expiry);
    if (r->conn)
        hpd_rpc_conn_unref(r->conn);
    if (r->door != NULL)
        r->door->refs--;
    free(r);
}

static void on_door_close(void *arg, hpd_status_t why)
{
    door_link_t *l = arg;
    (void)why;
    l->closed = true; /* its client goes once no request holds it */
}

/* The connection to the front door at addr (connected now if there is
 * none open); NULL with err filled when addr is not HOST:PORT or the
 * connection cannot start. Closed links no request holds go here. */
static door_link_t *door_get(decode_t *d, const char *addr, hpd_proto_err_t *err)
{
    door_link_t *found = NULL;
    const double now = hpd_time_now();
    for (door_link_t **pp = &d->doors; *pp != NULL;) {
        door_link_t *l = *pp;
        const bool unreachable = l->client == NULL && now - l->failed_at < DOOR_RETRY_S;
        if (l->closed && l->refs == 0 && !unreachable) {
            *pp = l->next;
            hpd_rpc_client_destroy(l->client);
            free(l);
            continue;
        }
        if ((!l->closed || unreachable) && strcmp(l->addr, addr) == 0)
            found = l;
        pp = &l->next;
    }
    if (found != NULL && found->client == NULL) {
        snprintf(err->text, sizeof(err->text), "reserve: cannot connect to the front door %s "
                 "(tried %.1f s ago)", addr, now - found->failed_at);
        return NULL;
    }
    if (found != NULL)
        return found;
    hpd_endpoint_t ep;
    uint32_t n_ep;
    char why[160];
    door_link_t *l;
    if (!hpd_proto_parse_endpoints(addr, &ep, 1, &n_ep, why, sizeof(why)) || n_ep != 1) {
        snprintf(err->text, sizeof(err->text), "reserve: door is \"%s\" (expected HOST:PORT)",
                 addr);
        return NULL;
    }
    if ((l = calloc(1, sizeof(*l))) == NULL) {
        snprintf(err->text, sizeof(err->text), "reserve: out of memory");
        return NULL;
    }
    snprintf(l->addr, sizeof(l->addr), "%s", addr);
    const hpd_rpc_client_params_t cp = {.base = d->node->base,
                                        .host = ep.host,
                                        .port = ep.port,
                                        .token = d->node->token,
                                        .timeout_ms = DOOR_CONNECT_MS,
                                        .on_close = on_door_close,
                                        .arg = l};
    if (hpd_rpc_client_connect(&cp, &l->client) != HPD_OK) {
        /* remembered: the next reserves naming it are refused at once */
        l->client = NULL;
        l->closed = true;
        l->failed_at = now;
        l->next = d->doors;
        d->doors = l;
        snprintf(err->text, sizeof(err->text), "reserve: cannot connect to the front door %s",
                 addr);
        return NULL;
    }
    HPD_LOG_INFO(LOG_COMPONENT, "%s: streaming to the front door %s", d->node->o.name, addr);
    l->next = d->doors;
    d->doors = l;
    return l;
}

/* tokens {job, index, ids, done, error?, choice?}: ids are choice c's
 * tokens from index on (eng_id its engine request); an error ends every
 * choice. */
static void notify_tokens(decode_t *d, dreq_t *r, uint32_t c, uint64_t eng_id,
                          const int32_t *toks, uint32_t n, bool done, const char *error)
{
    hpd_rpc_buf_t b;
    const uint32_t from = HPD_MIN(r->sent[c], n);
    hpd_msg_tokens_t m = {.job = r->job,
                          .index = from,
                          .ids = toks != NULL ? toks + from : NULL,
                          .ids_n = n - from,
                          .done = done,
                          .choice = c};
    if (error != NULL)
        snprintf(m.error, sizeof(m.error), "%s", error);
    hpd_request_info_t info;
    if (done && error == NULL &&
        hpd_engine_request_info(d->node->engine, eng_id, &info) == HPD_OK)
        snprintf(m.finish_reason, sizeof(m.finish_reason), "%s",
                 hpd_finish_reason_name(info.finish_reason));
    /* the log probabilities of these ids (from index 1: the first is the
     * prefill node's) */
    const hpd_token_logprobs_t *lp;
    uint32_t n_lp;
    uint8_t *wire = NULL;
    if (r->logprobs && m.ids_n > 0 &&
        hpd_engine_logprobs(d->node->engine, eng_id, &lp, &n_lp) == HPD_OK && n_lp >= n &&
        (wire = malloc(hpd_logprobs_wire_bytes(m.ids_n, r->top_logprobs))) != NULL) {
        hpd_logprobs_encode(lp + from, m.ids_n, r->top_logprobs, wire);
        m.logprobs = wire;
        m.logprobs_len = (uint32_t)hpd_logprobs_wire_bytes(m.ids_n, r->top_logprobs);
    }
    hpd_rpc_buf_init(&b);
    if (r->door != NULL && error == NULL) {
        /* the ids to the front door; the coordinator hears only their
         * count, with the last ones (its cost per request stays the same
         * however long the answer) */
        m.job = r->door_request;
        hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
        if (!r->door->closed)
            (void)hpd_rpc_client_notify(r->door->client, "tokens", &b);
        m.job = r->job;
        m.index = n;
        m.ids = NULL;
        m.ids_n = 0;
        m.logprobs = NULL;
        m.logprobs_len = 0;
        hpd_rpc_buf_destroy(&b);
        hpd_rpc_buf_init(&b);
    }
    if (r->door == NULL || error != NULL || done) {
        hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
        hpd_rpc_notify(r->conn, "tokens", &b);
    }
    hpd_rpc_buf_destroy(&b);
    free(wire);
    r->sent[c] = n;
    r->ended[c] = done;
}

static void fail_req(decode_t *d, dreq_t *r, const char *why)
{
    HPD_LOGR_WARN(LOG_COMPONENT, r->request, "%s: job %llu failed: %s", d->node->o.name,
                  (unsigned long long)r->job, why);
    notify_tokens(d, r, 0, r->eng_id, NULL, 0, true, why);
    d->failed++;
    dreq_free(d, r);
}

/* Both halves came (the join answered RUN): the request joins the batch. */
static void run(decode_t *d, dreq_t *r)
{
    hpd_status_t st;
    if ((st = hpd_engine_start_choices(d->node->engine, r->eng_id, r->first, r->n_choices)) !=
        HPD_OK) {
        fail_req(d, r, "the first token does not continue the replayed tokens");
        return;
    }
    event_del(r->expiry);
    r->t_running = hpd_time_now();
    r->n_first = r->sent[0];
    d->started++;
    hpd_node_kick(d->node);
}

/* Streams what each running request's choices added; a request ends once
 * every choice has (a failed one fails it whole). */
static void after_step(hpd_node_t *n)
{
    decode_t *d = n->role_data;
    dreq_t *r = d->reqs;
    while (r != NULL) {
        dreq_t *next = r->next;
        const uint64_t *ids;
        uint32_t n_ids, open = 0, nt0 = 0;
        bool failed = false;
        if (r->join.state != HPD_JOIN_RUNNING ||
            hpd_engine_choices(n->engine, r->eng_id, &ids, &n_ids) != HPD_OK) {
            r = next;
            continue;
        }
        if (r->door != NULL && r->door->closed) {
            /* its tokens would reach nobody: the coordinator runs it again,
             * streaming to the door over a new connection */
            fail_req(d, r, "the connection to its front door closed");
            r = next;
            continue;
        }
        for (uint32_t c = 0; c < n_ids && c < r->n_choices && !failed; c++) {
            const int32_t *toks;
            uint32_t nt;
            hpd_request_state_t st;
            if (r->ended[c] || hpd_engine_result(n->engine, ids[c], &toks, &nt, &st) != HPD_OK)
                continue;
            if (st == HPD_REQ_FAILED)
                failed = true;
            else if (nt > r->sent[c] || st == HPD_REQ_FINISHED)
                notify_tokens(d, r, c, ids[c], toks, nt, st == HPD_REQ_FINISHED, NULL);
            open += !r->ended[c];
            nt0 = c == 0 ? nt : nt0;
        }
        if (failed) {
            fail_req(d, r, "the decode step failed");
        } else if (open == 0) {
            const double t = hpd_time_now() - r->t_running;
            if (nt0 > r->n_first)
                hpd_metric_observe(d->m.tpot_s, t / (nt0 - r->n_first));
            HPD_LOGR_INFO(LOG_COMPONENT, r->request, "%s: job %llu finished: %u tokens%s "
                          "in %.1f ms of decode", n->o.name, (unsigned long long)r->job, nt0,
                          r->n_choices > 1 ? " (its first choice)" : "", t * 1e3);
            d->finished++;
            dreq_free(d, r);
        }
        r = next;
    }
}

/* The longest a fenced reservation holds its pages without the
 * coordinator's cancel (which comes once the prefill node answered its own
 * cancel, or was lost). */
static uint32_t fence_backstop_ms(const decode_t *d)
{
    return HPD_MAX(60000u, d->node->o.reserve_timeout_ms);
}

/* A reservation not started in time. If its transfer already ended, its
 * pages go now. If not, the prefill node may still be writing into them:
 * the request is ended for the coordinator ("reservation expired") but
 * its pages and slot stay held ("fenced") until the coordinator's cancel,
 * which it sends once the prefill node has stopped and flushed its puts
 * (or was lost), so that a late put never lands in a later request's
 * pages. A backstop frees them if no cancel ever comes. */
static void on_expiry(evutil_socket_t fd, short what, void *arg)
{
    dreq_t *r = arg;
    decode_t *d = r->owner;
    const bool had_notice = r->join.have_notice;
    const hpd_join_plan_t p = hpd_join_event(&r->join, HPD_JOIN_EV_TIMER);
    if (p.verdict == HPD_JOIN_FREE) { /* the backstop */
        HPD_LOGR_WARN(LOG_COMPONENT, r->request, "%s: freeing the pages of expired job %llu: "
                      "no cancel came in %u ms", d->node->o.name, (unsigned long long)r->job,
                      fence_backstop_ms(d));
        d->fence_backstops++;
        dreq_free(d, r);
        return;
    }
    if (p.verdict != HPD_JOIN_EXPIRE && p.verdict != HPD_JOIN_FENCE)
        return;
    HPD_LOGR_WARN(LOG_COMPONENT, r->request, "%s: reservation of job %llu expired before it "
                  "started%s", d->node->o.name, (unsigned long long)r->job,
                  had_notice ? "" : "; its pages stay held until its writer has stopped");
    d->expired++;
    notify_tokens(d, r, 0, r->eng_id, NULL, 0, true, "reservation expired");
    if (p.verdict == HPD_JOIN_EXPIRE) {
        dreq_free(d, r);
        return;
    }
    const uint32_t ms = fence_backstop_ms(d);
    const struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(r->expiry, &tv);
}

/* ------------------------------------------------------------ methods */

static void m_reserve(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_node_t *n = arg;
    decode_t *d = n->role_data;
    const uint32_t vocab = n->model->config.vocab_size;
    hpd_proto_err_t err = {{0}};
    hpd_request_params_t rp = {.sampling = n->model->config.gen_sampling}; /* as prefill's */
    hpd_msg_reserve_t q = {0};
    dreq_t *r = NULL;
    hpd_status_t st;

    if (!hpd_msg_unpack(&hpd_msg_reserve, params, &q, &err) ||
        !hpd_msg_ids_below(q.prompt, q.prompt_n, vocab, "reserve: prompt", &err) ||
        !hpd_msg_ids_below(q.replay, q.replay_n, vocab, "reserve: replay", &err) ||
        (q.sampling != NULL && !hpd_proto_sampling(q.sampling, &rp.sampling, &err))) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        goto out;
    }
    const uint64_t job = q.job, request = q.request;
    rp.n_prompt = q.prompt_n;
    rp.max_tokens = q.max_tokens;
    rp.n_replay = q.replay_n;
    rp.stop_ids = q.stop_token_ids;
    rp.n_stop = q.stop_token_ids_n;
    rp.ignore_eos = q.ignore_eos;
    rp.min_tokens = q.min_tokens;
    rp.logprobs = q.logprobs;
    rp.top_logprobs = q.logprobs ? q.top_logprobs : 0;
    rp.n = q.n;
    if (q.grammar != NULL &&
        !hpd_node_grammar(n, q.grammar, q.grammar_len, "reserve", &rp.grammar, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        goto out;
    }
    if (find(d, job) != NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "reserve: job %llu already exists",
                            (unsigned long long)job);
        goto out;
    }
    rp.prompt = q.prompt;
    rp.replay = q.replay;
    if ((r = calloc(1, sizeof(*r))) == NULL ||
        (r->expiry = evtimer_new(n->base, on_expiry, r)) == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "reserve: out of memory");
        goto out;
    }
    r->owner = d;
    st = hpd_engine_reserve(n->engine, &rp, &r->eng_id);
    if (st == HPD_ERR_NO_RESOURCE) {
        uint32_t pu, pt, su, stot;
        hpd_engine_usage(n->engine, &pu, &pt, &su, &stot);
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_OVERLOADED,
                            "reserve: no room for %u + %u tokens%s (%u of %u slots and %u of "
                            "%u pages free)",
                            rp.n_prompt, rp.max_tokens, rp.n > 1 ? " in each choice" : "",
                            stot - su, stot, pt - pu, pt);
        goto out;
    }
    if (st != HPD_OK) {
        char choices[64] = "";
        if (rp.n > 1)
            snprintf(choices, sizeof(choices), ", %u choices (at most %u, the max batch)", rp.n,
                     HPD_MIN(hpd_engine_params(n->engine)->max_batch, HPD_MAX_CHOICES));
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS,
                            "reserve: request refused (%u prompt tokens, %u new%s, max context "
                            "%u)", rp.n_prompt, rp.max_tokens, choices,
                            hpd_engine_params(n->engine)->max_context);
        goto out;
    }
    if (q.door[0] != '\0' && (r->door = door_get(d, q.door, &err)) == NULL) {
        /* not the request's fault: the coordinator tries another decode node */
        hpd_engine_release(n->engine, r->eng_id);
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PEER, "%s", err.text);
        goto out;
    }
    if (r->door != NULL) {
        r->door->refs++;
        r->door_request = q.door_request;
    }
    r->job = job;
    r->request = request;
    r->n_prompt = rp.n_prompt;
    r->logprobs = rp.logprobs;
    r->top_logprobs = rp.top_logprobs;
    r->t_reserved = hpd_time_now();
    r->conn = conn;
    r->n_choices = HPD_MAX(1u, rp.n);
    for (uint32_t c = 0; c < r->n_choices; c++) /* the coordinator has these already */
        r->sent[c] = c == 0 ? HPD_MAX(1u, rp.n_replay) : 1;
    hpd_rpc_conn_ref(conn);
    r->next = d->reqs;
    d->reqs = r;
    d->reserved++;
    struct timeval tv = {n->o.reserve_timeout_ms / 1000, (n->o.reserve_timeout_ms % 1000) * 1000};
    evtimer_add(r->expiry, &tv);

    /* where the prefill node writes: pages of the prompt per group, the slot */
    hpd_engine_kv_t kv;
    hpd_engine_memory_t m;
    hpd_engine_request_kv(n->engine, r->eng_id, &kv);
    hpd_engine_memory(n->engine, &m);
    /* the prompt's pages of each pack group: [[page ids] per group] */
    hpd_rpc_buf_t tables, b;
    hpd_rpc_buf_init(&tables);
    const uint32_t prompt_pages = HPD_DIV_UP(rp.n_prompt, m.layout->block_size);
    msgpack_pack_array(&tables.pk, kv.n_groups);
    for (uint32_t g = 0; g < kv.n_groups; g++) {
        msgpack_pack_array(&tables.pk, prompt_pages);
        for (uint32_t i = 0; i < prompt_pages; i++)
            msgpack_pack_uint32(&tables.pk, kv.tables[g][i]);
    }
    const bool tp = d->tp > 1;
    const hpd_msg_reservation_t res = {.layout = *m.layout,
                                       .tables_raw = tables.sb.data,
                                       .tables_raw_len = (uint32_t)tables.sb.size,
                                       .slot_offset = (uint64_t)kv.slot * m.slot_bytes,
                                       .kv_region = d->kv_regions[0],
                                       .slot_region = d->slot_regions[0],
                                       .tp = tp ? d->tp : 0,
                                       .kv_regions = tp ? d->kv_ids : NULL,
                                       .kv_regions_n = tp ? d->tp : 0,
                                       .slot_regions = tp ? d->slot_ids : NULL,
                                       .slot_regions_n = tp ? d->tp : 0,
                                       .kv_heads = m.layout->n_kv_heads,
                                       .state_bytes = m.layer_state_bytes};
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_reservation, &res, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_buf_destroy(&tables);
    r = NULL;
out:
    if (r != NULL) {
        if (r->expiry)
            event_free(r->expiry);
        free(r);
    }
    hpd_grammar_destroy(rp.grammar); /* the engine holds its own reference */
    hpd_msg_free(&hpd_msg_reserve, &q);
}

/* Checks a start's first tokens against r (NULL: no such job) into r->first;
 * false with err filled. */
static bool start_tokens(const hpd_node_t *n, dreq_t *r, const hpd_msg_start_t *m,
                         hpd_proto_err_t *err)
{
    const uint32_t vocab = n->model->config.vocab_size, n_ch = r != NULL ? r->n_choices : 1;
    if (n_ch > 1 && (m->first_tokens_n != n_ch || m->first_tokens[0] != (int32_t)m->first_token)) {
        snprintf(err->text, sizeof(err->text), "start: first_tokens has %u ids (expected %u, "
                 "one per choice, the first equal to first_token)", m->first_tokens_n, n_ch);
        return false;
    }
    for (uint32_t c = 0; c < n_ch; c++) {
        const int32_t t = c == 0 ? (int32_t)m->first_token : m->first_tokens[c];
        if ((uint32_t)t >= vocab) {
            if (c == 0)
                snprintf(err->text, sizeof(err->text), "start: first_token %d is not a token id "
                         "(vocabulary %u)", t, vocab);
            else
                snprintf(err->text, sizeof(err->text), "start: first_tokens[%u] is %d, not a "
                         "token id (vocabulary %u)", c, t, vocab);
            return false;
        }
        if (r != NULL)
            r->first[c] = t;
    }
    return true;
}

static void m_start(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_node_t *n = arg;
    decode_t *d = n->role_data;
    hpd_proto_err_t err;
    hpd_msg_start_t m = {0};
    dreq_t *r;

    if (!hpd_msg_unpack(&hpd_msg_start, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        goto out;
    }
    r = find(d, m.job);
    const bool waits = r != NULL && r->join.state == HPD_JOIN_RESERVED && !r->join.have_start;
    if (!start_tokens(n, waits ? r : NULL, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        goto out;
    }
    hpd_join_plan_t p = {.verdict = HPD_JOIN_REFUSE};
    if (r != NULL)
        p = hpd_join_event(&r->join, HPD_JOIN_EV_START);
    if (p.verdict == HPD_JOIN_REFUSE) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS,
                            "start: job %llu is not reserved here (expired, canceled or started)",
                            (unsigned long long)m.job);
        goto out;
    }
    hpd_rpc_reply(conn, id, NULL);
    if (p.verdict == HPD_JOIN_RUN)
        run(d, r);
out:
    hpd_msg_free(&hpd_msg_start, &m);
}

static void m_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_node_t *n = arg;
    decode_t *d = n->role_data;
    hpd_proto_err_t err;
    hpd_msg_cancel_job_t m = {0};
    dreq_t *r;

    if (!hpd_msg_unpack(&hpd_msg_cancel_job, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        return;
    }
    if ((r = find(d, m.job)) != NULL) {
        /* its writer failed or was lost before its transfer ended: its
         * connection closes first, so that no put of it still under way
         * lands in these pages once they serve another request */
        const hpd_join_plan_t p = hpd_join_event(&r->join, m.writer != 0
                                                               ? HPD_JOIN_EV_CANCEL_WRITER
                                                               : HPD_JOIN_EV_CANCEL);
        if (p.close_writer) {
            const hpd_status_t cst = hpd_xfer_close_writer(n->xfer, m.writer);
            if (cst == HPD_OK)
                HPD_LOGR_INFO(LOG_COMPONENT, r->request, "%s: job %llu: closed the connection "
                              "of its writer, node %llu: its late puts cannot land", n->o.name,
                              (unsigned long long)m.job, (unsigned long long)m.writer);
            d->writers_fenced += cst == HPD_OK;
        }
        HPD_LOGR_INFO(LOG_COMPONENT, r->request, "%s: job %llu canceled", n->o.name,
                      (unsigned long long)m.job);
        d->canceled++;
        dreq_free(d, r);
    }
    hpd_rpc_reply(conn, id, NULL);
}

static const hpd_rpc_method_t methods[] = {
    {.name = "reserve", .fn = m_reserve},
    {.name = "start", .fn = m_start},
    {.name = "cancel", .fn = m_cancel},
};

/* ------------------------------------------------------------ role */

/* A transfer may have written only into its reservation's prompt pages and
 * slot (decode_node/writes.c); one for no reservation here may have written
 * nowhere. */
static bool check_dests(hpd_node_t *n, const hpd_xfer_notice_t *notice,
                        const hpd_xfer_dest_t *dests, uint32_t n_dests)
{
    decode_t *d = n->role_data;
    dreq_t *r = find(d, notice->xfer_id);
    hpd_engine_kv_t kv;
    hpd_engine_memory_t m;
    char why[200];
    if (r == NULL || hpd_engine_request_kv(n->engine, r->eng_id, &kv) != HPD_OK) {
        snprintf(why, sizeof(why), "it names no reservation here");
    } else {
        hpd_engine_memory(n->engine, &m);
        const hpd_reservation_span_t span = {
            .kv_regions = d->kv_regions,
            .slot_regions = d->slot_regions,
            .n_ranks = d->tp,
            .page_bytes = hpd_kv_layout_page_bytes(m.layout),
            .tables = kv.tables,
            .n_groups = kv.n_groups,
            .n_pages = HPD_DIV_UP(r->n_prompt, m.layout->block_size),
            .slot_offset = (uint64_t)kv.slot * m.slot_bytes,
            .slot_bytes = m.slot_bytes};
        if (hpd_reservation_allows(&span, dests, n_dests, why, sizeof(why)))
            return true;
    }
    d->foreign_writes++;
    HPD_LOG_ERROR(LOG_COMPONENT, "%s: transfer %llu from node %llu refused: %s", n->o.name,
                  (unsigned long long)notice->xfer_id, (unsigned long long)notice->sender, why);
    return false;
}

static void on_notice(hpd_node_t *n, const hpd_xfer_notice_t *notice)
{
    decode_t *d = n->role_data;
    dreq_t *r = find(d, notice->xfer_id);
    if (r == NULL) {
        HPD_LOG_DEBUG(LOG_COMPONENT, "%s: transfer %llu from node %llu for no reservation",
                      n->o.name, (unsigned long long)notice->xfer_id,
                      (unsigned long long)notice->sender);
        return;
    }
    const hpd_join_plan_t p = hpd_join_event(&r->join, notice->status == HPD_OK
                                                           ? HPD_JOIN_EV_NOTICE
                                                           : HPD_JOIN_EV_BAD_NOTICE);
    switch (p.verdict) {
    case HPD_JOIN_FREE: /* fenced: the writer has flushed, nothing more can land */
        HPD_LOGR_INFO(LOG_COMPONENT, r->request, "%s: the transfer of expired job %llu ended; "
                      "its pages are free", n->o.name, (unsigned long long)r->job);
        dreq_free(d, r);
        break;
    case HPD_JOIN_FAIL:
        d->bad_transfers++;
        fail_req(d, r, notice->status == HPD_ERR_INVALID_ARG
                           ? "transfer wrote outside its reservation"
                           : "transfer checksum mismatch");
        break;
    case HPD_JOIN_WAIT:
    case HPD_JOIN_RUN:
        hpd_metric_observe(d->m.wait_s, hpd_time_now() - r->t_reserved);
        if (p.verdict == HPD_JOIN_RUN)
            run(d, r);
        break;
    default: break; /* a second notice: ignored */
    }
}

static void metrics_init(decode_t *d, hpd_metrics_t *r)
{
    static const char jobs[] = "Decode jobs ended, by outcome.";
    static const char state[] = "Decode jobs by state.";
    d->m.done = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs, "outcome=\"ok\"");
    d->m.failed = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs,
                                  "outcome=\"failed\"");
    d->m.canceled = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs,
                                    "outcome=\"canceled\"");
    d->m.expired = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs,
                                   "outcome=\"expired\"");
    d->m.reserved = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_jobs", state,
                                    "state=\"reserved\"");
    d->m.running = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_jobs", state, "state=\"running\"");
    d->m.wait_s = hpd_metrics_histogram(r, "hpd_xfer_wait_seconds",
                                        "Time from a reservation to its transfer's verified "
                                        "completion notice.", NULL, hpd_metrics_latency_bounds,
                                        hpd_metrics_n_latency_bounds);
    d->m.tpot_s = hpd_metrics_histogram(r, "hpd_tpot_seconds",
                                        "Mean decode time per token, per finished job.", NULL,
                                        hpd_metrics_tpot_bounds, hpd_metrics_n_tpot_bounds);
}

/* Requests held: reserved (waiting for their transfer and start) and running. */
static void count_reqs(const decode_t *d, uint32_t *reserved_p, uint32_t *running_p,
                       uint32_t *fenced_p)
{
    uint32_t reserved = 0, running = 0, fenced = 0;
    for (const dreq_t *r = d != NULL ? d->reqs : NULL; r != NULL; r = r->next) {
        reserved += r->join.state == HPD_JOIN_RESERVED;
        running += r->join.state == HPD_JOIN_RUNNING;
        fenced += r->join.state == HPD_JOIN_FENCED;
    }
    *reserved_p = reserved;
    *running_p = running;
    if (fenced_p != NULL)
        *fenced_p = fenced;
}

static void collect(hpd_node_t *n)
{
    decode_t *d = n->role_data;
    uint32_t reserved, running;
    count_reqs(d, &reserved, &running, NULL);
    hpd_metric_set(d->m.done, (double)d->finished);
    hpd_metric_set(d->m.failed, (double)d->failed);
    hpd_metric_set(d->m.canceled, (double)d->canceled);
    hpd_metric_set(d->m.expired, (double)d->expired);
    hpd_metric_set(d->m.reserved, reserved);
    hpd_metric_set(d->m.running, running);
}

static uint32_t in_flight(hpd_node_t *n)
{
    uint32_t reserved, running;
    count_reqs(n->role_data, &reserved, &running, NULL);
    return reserved + running;
}

/* Maps rank r's page pool and slot pool (regions, in that order). A model
 * without full-attention layers has no page pool: its region is a few
 * bytes of host memory no reservation lets a writer reach (UCX maps no
 * NULL). */
static hpd_status_t map_rank(decode_t *d, uint32_t r)
{
    hpd_node_t *n = d->node;
    const hpd_engine_t *rank = hpd_engine_rank(n->engine, r);
    hpd_engine_memory_t m, m0;
    void *empty;
    hpd_status_t st;

    hpd_engine_memory(rank, &m);
    hpd_engine_memory(n->engine, &m0);
    /* a reservation's page ids and slot offset are every rank's */
    if (m.kv_pool_bytes != m0.kv_pool_bytes || m.slot_bytes != m0.slot_bytes) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tp rank %u's pools differ in size from rank 0's",
                      n->o.name, r);
        return HPD_ERR_INTERNAL;
    }
    if (m.kv_pool == NULL)
        st = hpd_xfer_alloc(n->xfer, 64, &empty, &d->kv_regions[r]);
    else
        st = hpd_xfer_register_pool(n->xfer, n->backend, m.kv_pool, m.kv_pool_bytes,
                                    &d->kv_regions[r]);
    if (st == HPD_OK)
        st = hpd_xfer_register_pool(n->xfer, n->backend, m.slot_pool,
                                    HPD_MAX(m.slot_pool_bytes, 64), &d->slot_regions[r]);
    d->kv_ids[r] = (int32_t)d->kv_regions[r];
    d->slot_ids[r] = (int32_t)d->slot_regions[r];
    return st;
}

static hpd_status_t init(hpd_node_t *n)
{
    decode_t *d = calloc(1, sizeof(*d));
    hpd_status_t st = HPD_OK;

    if (d == NULL)
        return HPD_ERR_NO_MEMORY;
    d->node = n;
    n->role_data = d;
    metrics_init(d, n->metrics);
    d->tp = hpd_engine_tp(n->engine);
    for (uint32_t r = 0; r < d->tp && st == HPD_OK; r++)
        if ((st = map_rank(d, r)) != HPD_OK)
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: cannot map tp rank %u's pools: %s", n->o.name, r,
                          hpd_status_str(st));
    return st;
}

static void pack_load(hpd_node_t *n, msgpack_packer *pk)
{
    decode_t *d = n->role_data;
    uint32_t reserved, running;
    uint32_t fenced;
    count_reqs(d, &reserved, &running, &fenced);
    const hpd_msg_decode_load_t load = {.reserved = reserved,
                                        .fenced = fenced, /* expired, held for a late writer */
                                        .fence_backstops = d->fence_backstops,
                                        .writers_fenced = d->writers_fenced,
                                        .running = running,
                                        .started = d->started,
                                        .finished = d->finished,
                                        .failed = d->failed,
                                        .canceled = d->canceled,
                                        .expired = d->expired,
                                        .bad_transfers = d->bad_transfers,
                                        .foreign_writes = d->foreign_writes};
    hpd_msg_pack(&hpd_msg_decode_load, &load, pk);
}

/* The coordinator is gone: no one waits for these requests' tokens; their
 * pages and slots come free. */
static void drop_jobs(hpd_node_t *n, const char *why)
{
    decode_t *d = n->role_data;
    while (d->reqs != NULL) {
        dreq_t *r = d->reqs;
        HPD_LOGR_INFO(LOG_COMPONENT, r->request, "%s: job %llu dropped: the coordinator was "
                      "lost", n->o.name, (unsigned long long)r->job);
        d->canceled++;
        dreq_free(d, r);
    }
}

static void fini(hpd_node_t *n)
{
    decode_t *d = n->role_data;
    if (d == NULL)
        return;
    while (d->reqs != NULL)
        dreq_free(d, d->reqs);
    while (d->doors != NULL) {
        door_link_t *l = d->doors;
        d->doors = l->next;
        hpd_rpc_client_destroy(l->client);
        free(l);
    }
    /* d itself goes with the node (node_destroy) */
}

const hpd_node_role_t hpd_decode_role = {
    .name = "decode",
    .peers_write_pools = true,
    .methods = methods,
    .n_methods = sizeof(methods) / sizeof(methods[0]),
    .init = init,
    .pack_load = pack_load,
    .after_step = after_step,
    .on_notice = on_notice,
    .check_dests = check_dests,
    .drop_jobs = drop_jobs,
    .fini = fini,
    .in_flight = in_flight,
    .collect = collect,
};
