/* hpd-coordinator: the node registry, routing, the request state machine,
 * token streaming, cancellation and failover (docs/cluster.md).
 *
 * Nodes register over their own connection and heartbeat on it; the
 * coordinator connects back to each node's RPC server to send commands. A
 * request moves queued -> reserving (decode node reserves a slot and pages)
 * -> prefilling (prefill node computes and pushes) -> decoding (decode node
 * streams tokens) -> done. Each attempt has its own job id; replies and
 * notifications of an older attempt are ignored. A lost node sends its
 * requests back to the queue: they run again from the prompt, replaying the
 * tokens already sent to the client, so the client's stream continues with
 * no token lost or repeated.
 * Who frees what: a request holds a reference on its client's connection
 * until it is answered; node clients are destroyed from a deferred event,
 * never inside their own callbacks. */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cache/prefix_cache.h"
#include "coordinator/credentials.h"
#include "coordinator/routing.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "node/msg.h"
#include "node/proto.h"
#include "transport/http.h"
#include "transport/rpc.h"
#include "transport/xfer.h"

#define LOG_COMPONENT "coordinator"
#define SUMMARY_BYTES 8192
#define PREFILL_TIMEOUT_MS 600000

typedef enum { ROLE_PREFILL, ROLE_DECODE } role_t;

typedef struct node {
    uint64_t id;
    role_t role;
    char name[64], host[64];
    uint16_t port;
    bool alive;
    bool draining; /* the node said it is finishing its work to stop: no new jobs */
    double lease_until;
    uint64_t alive_key;  /* its liveness pings name it (node/liveness.h) */
    double alive_until;  /* 0: it has not pinged (yet) */
    hpd_rpc_client_t *client; /* coordinator -> node */
    hpd_rpc_conn_t *reg_conn; /* node -> coordinator */
    hpd_kv_layout_t layout;
    uint32_t pages, slots, max_context, vocab, max_batch;
    char *xfer_info; /* packed msgpack */
    size_t xfer_info_len;
    /* what the coordinator has handed out */
    uint32_t slots_reserved, pages_reserved; /* decode */
    uint32_t jobs;                           /* prefill */
    uint64_t queued_tokens;
    uint8_t summary[SUMMARY_BYTES];
    bool have_summary;
    char *stats; /* last heartbeat without the summary, packed */
    size_t stats_len;
    struct node *next;
} node_t;

typedef enum { R_QUEUED, R_RESERVING, R_PREFILLING, R_DECODING } rstate_t;

typedef struct req {
    uint64_t id;
    hpd_rpc_conn_t *client;
    uint32_t call_id;
    uint64_t tag;
    bool stream;
    int32_t *prompt;
    uint32_t n_prompt, max_tokens;
    hpd_sampling_t sampling;
    hpd_block_hash_t *hashes;
    int32_t *out;
    uint32_t n_out;
    rstate_t state;
    uint64_t job;
    node_t *pnode, *dnode;
    uint32_t dpages;
    uint32_t attempts;
    uint64_t avoid_decode; /* the decode node of a pair that failed this request */
    bool pair_failed;      /* the current attempt's pair failed (abort_attempt fences) */
    uint64_t lost_writer;  /* the prefill node lost while pushing for this attempt */
    char last_error[160];
    double t_submit, t_queued, t_first;
    uint32_t cached_tokens;
    float prefill_ms, push_ms, exposed_push_ms;
    struct req *next;
} req_t;

typedef struct {
    const char *host;
    uint16_t port;
    const char *port_file;
    const char *token_file;
    uint32_t heartbeat_ms, lease_ms;
    uint32_t liveness_ms; /* a node whose pinger is silent this long is lost; 0: off */
    uint32_t max_requests;
    uint32_t queue_timeout_ms;
    uint32_t max_attempts;
    int32_t metrics_port; /* -1: no HTTP endpoint */
    uint32_t drain_timeout_ms;
    uint32_t max_connections; /* 0: the RPC server's default */
    const char *client_keys_file; /* NULL: the token serves clients too */
} opts_t;

/* docs/operations.md lists these. */
typedef struct {
    hpd_metrics_t *reg;
    hpd_metric_t *ok, *failed, *canceled, *overloaded, *invalid, *retries;
    hpd_metric_t *ttft, *tpot, *duration, *queue_wait;
    hpd_metric_t *prompt_tokens, *generated_tokens, *cached_tokens;
    hpd_metric_t *queued, *running, *nodes_prefill, *nodes_decode, *nodes_draining;
    hpd_metric_t *node_losses, *pair_failures, *uptime;
    hpd_metric_t *conns_authed, *conns_unauthed, *conns_refused, *conns_evicted;
    hpd_metric_t *auth_timeouts, *auth_failures;
} metrics_t;

typedef struct {
    opts_t o;
    struct event_base *base;
    hpd_rpc_server_t *server;
    char *token;
    node_t *nodes;
    node_t *dead; /* waiting for the reaper */
    req_t *reqs;  /* in arrival order */
    uint32_t n_reqs;
    uint64_t next_node, next_req, next_job;
    uint8_t fingerprint[16];
    bool have_fingerprint;
    hpd_block_hash_t root;
    struct event *tick, *reap, *sched, *sig_int, *sig_term, *sig_hup;
    hpd_credentials_t *creds; /* NULL: an open coordinator (no token file) */
    uint64_t finished, failed, canceled, retried, rejected;
    metrics_t m;
    hpd_http_t *http;
    double started;
    bool draining; /* SIGTERM: no new requests; stop once the open ones are done */
    bool drained;  /* the drain ended: nodes were told to shut down */
    struct event *drain_ev;
} coord_t;

static coord_t C;

static void schedule_soon(void);
static void schedule_later(uint32_t ms);
static void requeue(req_t *r, const char *why, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------ helpers */

static node_t *node_by_id(uint64_t id)
{
    for (node_t *n = C.nodes; n != NULL; n = n->next)
        if (n->id == id)
            return n;
    return NULL;
}

static req_t *req_by_job(uint64_t job)
{
    for (req_t *r = C.reqs; r != NULL; r = r->next)
        if (r->job == job)
            return r;
    return NULL;
}

static uint32_t pages_for(const node_t *d, uint32_t tokens)
{
    return hpd_route_pages(&d->layout, tokens);
}

/* A call's context: which attempt it belongs to. */
typedef struct {
    uint64_t job;
    uint64_t node;
    uint64_t prefill; /* a prefill cancel's: the prefill node */
    bool fence;       /* ... whose connection the decode node closes first */
} call_ctx_t;

static call_ctx_t *ctx_new(uint64_t job, uint64_t node)
{
    call_ctx_t *c = malloc(sizeof(*c));
    if (c != NULL)
        *c = (call_ctx_t){.job = job, .node = node};
    return c;
}

static void ignore_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    free(arg);
}

static void send_cancel(node_t *n, uint64_t job, uint64_t writer, hpd_rpc_reply_cb_t cb,
                        void *arg)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_cancel_job, &(hpd_msg_cancel_job_t){.job = job, .writer = writer},
                 &b.pk);
    if (n == NULL || !n->alive || hpd_rpc_call(n->client, "cancel", &b, 30000, cb, arg) != HPD_OK)
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
    call_ctx_t *c = arg; /* node: the decode node */
    const bool fence = c->fence || st != HPD_OK;
    send_cancel(node_by_id(c->node), c->job, fence ? c->prefill : 0, ignore_reply, NULL);
    free(c);
}

/* Undoes the current attempt on the nodes (their work stops, their memory
 * is freed) and in the coordinator's accounting. */
static void abort_attempt(req_t *r)
{
    node_t *d = r->dnode, *p = r->pnode;
    if (d != NULL) {
        d->slots_reserved--;
        d->pages_reserved -= r->dpages;
    }
    if (r->state == R_PREFILLING && p != NULL) {
        p->jobs--;
        p->queued_tokens -= r->n_prompt;
        call_ctx_t *c = ctx_new(r->job, d ? d->id : 0);
        if (c != NULL) {
            c->prefill = p->id;
            c->fence = r->pair_failed;
            send_cancel(p, r->job, 0, on_prefill_canceled, c);
        }
    } else if (d != NULL && r->state != R_QUEUED) {
        /* a prefill node lost while it pushed: its late puts are fenced */
        send_cancel(d, r->job, r->state == R_PREFILLING ? r->lost_writer : 0, ignore_reply,
                    NULL);
    }
    r->pair_failed = false;
    r->lost_writer = 0;
    r->dnode = r->pnode = NULL;
    r->dpages = 0;
    r->job = 0;
    r->state = R_QUEUED;
}

static void req_free(req_t *r)
{
    for (req_t **pp = &C.reqs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    C.n_reqs--;
    if (r->client)
        hpd_rpc_conn_unref(r->client);
    free(r->prompt);
    free(r->hashes);
    free(r->out);
    free(r);
    if (C.draining && !C.drained && C.n_reqs == 0) {
        static const struct timeval now = {0, 0};
        evtimer_add(C.drain_ev, &now);
    }
}

static void req_fail(req_t *r, int64_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void req_fail(req_t *r, int64_t code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    abort_attempt(r);
    HPD_LOGR_WARN(LOG_COMPONENT, r->id, "failed: %s", msg);
    hpd_rpc_reply_error(r->client, r->call_id, code, "%s", msg);
    C.failed++;
    hpd_metric_inc(code == HPD_RPC_ERR_OVERLOADED ? C.m.overloaded
                   : code == HPD_RPC_ERR_PARAMS   ? C.m.invalid
                                                  : C.m.failed, 1);
    req_free(r);
    schedule_soon();
}

static void requeue(req_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->last_error, sizeof(r->last_error), fmt, ap);
    va_end(ap);
    abort_attempt(r);
    if (++r->attempts >= C.o.max_attempts) {
        req_fail(r, HPD_RPC_ERR_APP, "gave up after %u attempts; last: %s", r->attempts,
                 r->last_error);
        return;
    }
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "retrying (attempt %u): %s", r->attempts + 1,
                  r->last_error);
    C.retried++;
    hpd_metric_inc(C.m.retries, 1);
    r->t_queued = hpd_time_now();
    schedule_soon();
}

/* Sends tokens [from, n_out) to a streaming client. */
static void stream(req_t *r, uint32_t from)
{
    hpd_rpc_buf_t b;
    if (!r->stream || from >= r->n_out)
        return;
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 3);
    hpd_proto_kv_u64(&b.pk, "tag", r->tag);
    hpd_proto_kv_u64(&b.pk, "index", from);
    hpd_proto_key(&b.pk, "ids");
    hpd_proto_pack_ids(&b.pk, r->out + from, r->n_out - from);
    hpd_rpc_notify(r->client, "tokens", &b);
    hpd_rpc_buf_destroy(&b);
}

static void req_finish(req_t *r)
{
    hpd_rpc_buf_t b;
    const double now = hpd_time_now();
    node_t *d = r->dnode;
    if (d != NULL) { /* the decode node freed it itself */
        d->slots_reserved--;
        d->pages_reserved -= r->dpages;
        r->dnode = NULL;
    }
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 10);
    hpd_proto_key(&b.pk, "prefill_ms");
    msgpack_pack_double(&b.pk, r->prefill_ms);
    hpd_proto_key(&b.pk, "push_ms");
    msgpack_pack_double(&b.pk, r->push_ms);
    hpd_proto_key(&b.pk, "exposed_push_ms");
    msgpack_pack_double(&b.pk, r->exposed_push_ms);
    hpd_proto_kv_u64(&b.pk, "request", r->id);
    hpd_proto_key(&b.pk, "tokens");
    hpd_proto_pack_ids(&b.pk, r->out, r->n_out);
    hpd_proto_kv_u64(&b.pk, "prompt_tokens", r->n_prompt);
    hpd_proto_kv_u64(&b.pk, "cached_tokens", r->cached_tokens);
    hpd_proto_key(&b.pk, "ttft_ms");
    msgpack_pack_double(&b.pk, (r->t_first - r->t_submit) * 1e3);
    hpd_proto_key(&b.pk, "total_ms");
    msgpack_pack_double(&b.pk, (now - r->t_submit) * 1e3);
    hpd_proto_kv_u64(&b.pk, "attempts", r->attempts + 1);
    hpd_rpc_reply(r->client, r->call_id, &b);
    hpd_rpc_buf_destroy(&b);
    const double ttft = r->t_first - r->t_submit, total = now - r->t_submit;
    const double tpot = r->n_out > 1 ? (now - r->t_first) / (r->n_out - 1) : 0;
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "finished: %u tokens, ttft %.1f ms, tpot %.2f ms, "
                  "%u of %u prompt tokens cached, %u attempt(s)", r->n_out, ttft * 1e3,
                  tpot * 1e3, r->cached_tokens, r->n_prompt, r->attempts + 1);
    C.finished++;
    hpd_metric_inc(C.m.ok, 1);
    hpd_metric_observe(C.m.ttft, ttft);
    if (r->n_out > 1)
        hpd_metric_observe(C.m.tpot, tpot);
    hpd_metric_observe(C.m.duration, total);
    hpd_metric_inc(C.m.prompt_tokens, r->n_prompt);
    hpd_metric_inc(C.m.generated_tokens, r->n_out);
    hpd_metric_inc(C.m.cached_tokens, r->cached_tokens);
    req_free(r);
    schedule_soon();
}

/* Appends tokens reported from index `index` on; earlier ones (replayed
 * after a failover) must match what the client already has. */
static void add_tokens(req_t *r, uint32_t index, const int32_t *ids, uint32_t n)
{
    const uint32_t before = r->n_out;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t pos = index + i;
        if (pos < r->n_out) {
            if (r->out[pos] != ids[i])
                HPD_LOGR_ERROR(LOG_COMPONENT, r->id, "token %u is %d after a retry, %d "
                               "before (determinism broken)", pos, ids[i], r->out[pos]);
        } else if (pos == r->n_out && r->n_out < r->max_tokens) {
            r->out[r->n_out++] = ids[i];
        }
    }
    if (before == 0 && r->n_out > 0)
        r->t_first = hpd_time_now();
    stream(r, before);
}

/* ------------------------------------------------------------ routing */

/* The registry as the routing policy sees it (coordinator/routing.h). */
static hpd_route_node_t *route_view(size_t *n_p, node_t ***map_p)
{
    size_t n = 0, i = 0;
    for (node_t *x = C.nodes; x != NULL; x = x->next)
        n++;
    hpd_route_node_t *v = calloc(n ? n : 1, sizeof(*v));
    node_t **map = calloc(n ? n : 1, sizeof(*map));
    if (v == NULL || map == NULL) {
        free(v);
        free(map);
        return NULL;
    }
    for (node_t *x = C.nodes; x != NULL; x = x->next, i++) {
        map[i] = x;
        v[i] = (hpd_route_node_t){.id = x->id,
                                  .prefill = x->role == ROLE_PREFILL,
                                  .usable = x->alive && !x->draining,
                                  .max_context = x->max_context,
                                  .summary = x->have_summary ? x->summary : NULL,
                                  .summary_bytes = SUMMARY_BYTES,
                                  .queued_tokens = x->queued_tokens,
                                  .slots = x->slots,
                                  .slots_reserved = x->slots_reserved,
                                  .pages = x->pages,
                                  .pages_reserved = x->pages_reserved,
                                  .layout = x->layout};
    }
    *n_p = n;
    *map_p = map;
    return v;
}

static node_t *pick(const req_t *r, bool prefill, uint32_t *pages_p)
{
    size_t n;
    node_t **map, *chosen = NULL;
    hpd_route_node_t *v = route_view(&n, &map);
    if (v == NULL)
        return NULL; /* out of memory: the request waits in the queue */
    const hpd_route_req_t rr = {.n_prompt = r->n_prompt,
                                .max_tokens = r->max_tokens,
                                .hashes = r->hashes,
                                .avoid_decode = r->avoid_decode};
    const int i = prefill ? hpd_route_prefill(v, n, &rr) : hpd_route_decode(v, n, &rr, pages_p);
    if (i >= 0)
        chosen = map[i];
    free(v);
    free(map);
    return chosen;
}

static node_t *pick_prefill(const req_t *r)
{
    return pick(r, true, NULL);
}

static node_t *pick_decode(const req_t *r, uint32_t *pages_p)
{
    return pick(r, false, pages_p);
}

static void on_started(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *c = arg;
    req_t *r = req_by_job(c->job);
    if (r != NULL && r->state == R_DECODING && (st != HPD_OK || reply->is_error))
        requeue(r, "decode start failed: %s",
                st != HPD_OK ? hpd_status_str(st) : "refused by the decode node");
    free(c);
}

static void on_prefilled(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *c = arg;
    req_t *r = req_by_job(c->job);
    hpd_proto_err_t err;
    hpd_msg_prefilled_t m = {0};
    free(c);
    if (r == NULL || r->state != R_PREFILLING)
        return; /* an older attempt */
    node_t *p = r->pnode, *d = r->dnode;
    if (st != HPD_OK) {
        requeue(r, "prefill on %s: %s", p->name, hpd_status_str(st));
        return;
    }
    if (reply->is_error) {
        if (reply->error_code == HPD_RPC_ERR_PARAMS) {
            req_fail(r, HPD_RPC_ERR_PARAMS, "%.*s", (int)reply->error_message_len,
                     reply->error_message);
        } else if (reply->error_code == HPD_RPC_ERR_PEER) {
            /* the data path between the two failed (a cut, a stopped
             * decode node, a missed transfer deadline): the next attempt
             * goes to another decode node where there is one */
            HPD_LOGR_WARN(LOG_COMPONENT, r->id, "pair %s -> %s failed: %.*s; the request "
                          "avoids %s", p->name, d->name, (int)reply->error_message_len,
                          reply->error_message, d->name);
            r->avoid_decode = d->id;
            r->pair_failed = true;
            hpd_metric_inc(C.m.pair_failures, 1);
            requeue(r, "prefill on %s: %.*s", p->name, (int)reply->error_message_len,
                    reply->error_message);
        } else
            requeue(r, "prefill on %s: %.*s", p->name, (int)reply->error_message_len,
                    reply->error_message);
        return;
    }
    if (!hpd_msg_unpack(&hpd_msg_prefilled, reply->result, &m, &err)) {
        requeue(r, "prefill on %s: bad reply: %s", p->name, err.text);
        return;
    }
    p->jobs--;
    p->queued_tokens -= r->n_prompt;
    r->cached_tokens = m.cached_tokens;
    r->prefill_ms = m.prefill_ms;
    r->push_ms = m.push_ms;
    r->exposed_push_ms = m.exposed_push_ms;
    const int32_t t = (int32_t)m.first_token;
    add_tokens(r, 0, &t, 1);
    r->state = R_DECODING;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_start,
                 &(hpd_msg_start_t){.job = r->job, .first_token = m.first_token}, &b.pk);
    call_ctx_t *sc = ctx_new(r->job, d->id);
    if (sc == NULL || hpd_rpc_call(d->client, "start", &b, 30000, on_started, sc) != HPD_OK) {
        free(sc);
        requeue(r, "cannot reach decode node %s", d->name);
    }
    hpd_rpc_buf_destroy(&b);
}

static void on_reserved(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    call_ctx_t *c = arg;
    req_t *r = req_by_job(c->job);
    const uint64_t job = c->job;
    free(c);
    if (r == NULL || r->state != R_RESERVING) {
        return; /* an older attempt: abort_attempt already sent the cancel */
    }
    node_t *d = r->dnode;
    if (st != HPD_OK) {
        requeue(r, "reserve on %s: %s", d->name, hpd_status_str(st));
        return;
    }
    if (reply->is_error) {
        if (reply->error_code == HPD_RPC_ERR_OVERLOADED) {
            /* our accounting was ahead of the node's frees: wait in the queue */
            abort_attempt(r);
            schedule_later(20);
        } else {
            req_fail(r, HPD_RPC_ERR_PARAMS, "%.*s", (int)reply->error_message_len,
                     reply->error_message);
        }
        return;
    }
    node_t *p = pick_prefill(r);
    if (p == NULL) {
        requeue(r, "no prefill node can take %u tokens", r->n_prompt);
        return;
    }
    /* the job: the prompt and where its state goes (the decode node's reply) */
    /* checked, then relayed as it came: the prefill node reads it */
    hpd_msg_reservation_t res = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_reservation, reply->result, &res, &err)) {
        requeue(r, "reserve on %s: %s", d->name, err.text);
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
                                      .decode_raw_len = (uint32_t)dest.sb.size};
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_prefill_job, &pj, &b.pk);
    hpd_rpc_buf_destroy(&dest);
    hpd_rpc_buf_destroy(&samp);
    r->pnode = p;
    r->state = R_PREFILLING;
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "job %llu: prefill on %s, decode on %s",
                  (unsigned long long)job, p->name, d->name);
    p->jobs++;
    p->queued_tokens += r->n_prompt;
    call_ctx_t *pc = ctx_new(job, p->id);
    if (pc == NULL ||
        hpd_rpc_call(p->client, "prefill", &b, PREFILL_TIMEOUT_MS, on_prefilled, pc) != HPD_OK) {
        free(pc);
        requeue(r, "cannot reach prefill node %s", p->name);
    }
    hpd_rpc_buf_destroy(&b);
}

/* Places queued requests, first come first served, while decode room lasts. */
/* Whether a live decode node could ever hold r, were its pool empty. False
 * only when decode nodes are registered and none of them could; then
 * *need_p and *largest_p say how many pages r needs on the node whose pool
 * comes closest (*largest_p pages). */
static bool could_ever_place(const req_t *r, uint32_t *need_p, uint32_t *largest_p)
{
    bool any = false;
    uint32_t tokens = r->n_prompt + r->max_tokens;
    *need_p = *largest_p = 0;
    for (node_t *n = C.nodes; n != NULL; n = n->next) {
        if (!n->alive || n->draining || n->role != ROLE_DECODE)
            continue;
        any = true;
        const uint32_t need = pages_for(n, tokens);
        if (n->slots > 0 && n->max_context >= tokens && need <= n->pages)
            return true;
        if (n->max_context >= tokens && n->pages >= *largest_p)
            *need_p = need, *largest_p = n->pages;
    }
    /* none registered: wait for one; none with the context for it (need 0):
     * admission refuses those, by max_context */
    return !any || *need_p == 0;
}

/* Places queued requests in arrival order. A request that fits no decode
 * node now waits, and so does everything behind it (first come, first
 * served); one that no registered decode node could ever hold fails at once
 * instead of holding up the queue until it times out. */
static void schedule(void)
{
    for (req_t *r = C.reqs, *next; r != NULL; r = next) {
        uint32_t pages = 0, largest;
        node_t *d;
        next = r->next;
        if (r->state != R_QUEUED)
            continue;
        if ((d = pick_decode(r, &pages)) == NULL) {
            if (could_ever_place(r, &pages, &largest))
                break;
            req_fail(r, HPD_RPC_ERR_PARAMS,
                     "the request needs %u KV pages for %u prompt + %u new tokens, but the "
                     "largest decode pool holds %u pages",
                     pages, r->n_prompt, r->max_tokens, largest);
            continue;
        }
        bool have_prefill = false;
        for (node_t *n = C.nodes; n != NULL; n = n->next)
            have_prefill |= n->alive && n->role == ROLE_PREFILL;
        if (!have_prefill)
            break;
        r->job = ++C.next_job;
        r->dnode = d;
        r->dpages = pages;
        d->slots_reserved++;
        d->pages_reserved += pages;
        r->state = R_RESERVING;
        hpd_metric_observe(C.m.queue_wait, hpd_time_now() - r->t_queued);
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        msgpack_pack_map(&b.pk, 6);
        hpd_proto_kv_u64(&b.pk, "job", r->job);
        hpd_proto_kv_u64(&b.pk, "request", r->id);
        hpd_proto_key(&b.pk, "prompt");
        hpd_proto_pack_ids(&b.pk, r->prompt, r->n_prompt);
        hpd_proto_kv_u64(&b.pk, "max_tokens", r->max_tokens);
        hpd_proto_key(&b.pk, "sampling");
        hpd_proto_pack_sampling(&b.pk, &r->sampling);
        hpd_proto_key(&b.pk, "replay"); /* what the client already has */
        hpd_proto_pack_ids(&b.pk, r->out, r->n_out);
        call_ctx_t *c = ctx_new(r->job, d->id);
        const hpd_status_t st = c == NULL ? HPD_ERR_NO_MEMORY
                                          : hpd_rpc_call(d->client, "reserve", &b, 30000,
                                                         on_reserved, c);
        hpd_rpc_buf_destroy(&b);
        if (st != HPD_OK) {
            free(c);
            requeue(r, "cannot reach decode node %s", d->name);
            return; /* requeue schedules again */
        }
    }
}

static void on_sched(evutil_socket_t fd, short what, void *arg)
{
    schedule();
}

static void schedule_soon(void)
{
    static const struct timeval now = {0, 0};
    evtimer_add(C.sched, &now); /* (re)arms it to run at once */
}

static void schedule_later(uint32_t ms)
{
    const struct timeval tv = {0, ms * 1000};
    if (!evtimer_pending(C.sched, NULL))
        evtimer_add(C.sched, &tv);
}

/* ------------------------------------------------------------ nodes */

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    while (C.dead != NULL) {
        node_t *n = C.dead;
        C.dead = n->next;
        hpd_rpc_client_destroy(n->client);
        if (n->reg_conn != NULL)
            hpd_rpc_conn_unref(n->reg_conn);
        free(n->xfer_info);
        free(n->stats);
        free(n);
    }
}

static void node_lost(node_t *n, const char *why)
{
    static const struct timeval now = {0, 0};
    if (!n->alive)
        return;
    HPD_LOG_WARN(LOG_COMPONENT, "%s node %s (%llu) lost: %s", n->role == ROLE_PREFILL ?
                 "prefill" : "decode", n->name, (unsigned long long)n->id, why);
    n->alive = false;
    hpd_metric_inc(C.m.node_losses, 1);
    for (req_t *r = C.reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->dnode != n && r->pnode != n)
            continue;
        /* nothing is sent to the dead node: what it held died with it; the
         * survivor of the pair is told to stop (abort_attempt) */
        if (r->dnode == n) {
            r->dnode = NULL;
            r->dpages = 0;
        }
        if (r->pnode == n) {
            r->pnode = NULL;
            r->lost_writer = n->id;
        }
        requeue(r, "%s node %s lost", n->role == ROLE_PREFILL ? "prefill" : "decode", n->name);
    }
    for (node_t **pp = &C.nodes; *pp != NULL; pp = &(*pp)->next)
        if (*pp == n) {
            *pp = n->next;
            break;
        }
    if (n->reg_conn != NULL)
        hpd_rpc_conn_close(n->reg_conn, false);
    n->next = C.dead;
    C.dead = n;
    evtimer_add(C.reap, &now);
    schedule_soon();
}

static void on_node_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    node_t *n = node_by_id((uint64_t)(uintptr_t)arg);
    hpd_proto_err_t err;
    hpd_msg_tokens_t m = {0};
    const char *error = m.error;
    req_t *r;

    if (n == NULL || !hpd_rpc_str_eq(msg->method, msg->method_len, "tokens"))
        return;
    if (!hpd_msg_unpack(&hpd_msg_tokens, msg->params, &m, &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "bad tokens notification from %s: %s", n->name, err.text);
        return;
    }
    if ((r = req_by_job(m.job)) != NULL && r->state != R_QUEUED && r->dnode == n &&
        error[0] != '\0') {
        /* the decode node ended the attempt (its reservation expired, a bad
         * transfer, a failed step) in whatever state the coordinator holds
         * it. While the prefill node is at it, it is told to stop first and
         * the decode node's cancel follows its answer (abort_attempt): an
         * expired reservation keeps its pages until then, fenced against
         * the prefill node's late puts. Otherwise the node freed it. */
        if (r->state == R_PREFILLING && r->pnode != NULL)
            HPD_LOGR_WARN(LOG_COMPONENT, r->id, "pair %s -> %s failed: %s while the prefill "
                          "pushed; the request avoids %s", r->pnode->name, n->name, error,
                          n->name);
        r->avoid_decode = n->id;
        if (r->state != R_PREFILLING) {
            r->dnode->slots_reserved--;
            r->dnode->pages_reserved -= r->dpages;
            r->dnode = NULL;
        }
        requeue(r, "decode on %s: %s", n->name, error);
    } else if (r != NULL && r->state == R_DECODING && r->dnode == n) {
        add_tokens(r, m.index, m.ids, m.ids_n);
        if (m.done)
            req_finish(r);
    }
    hpd_msg_free(&hpd_msg_tokens, &m);
}

static void on_node_close(void *arg, hpd_status_t why)
{
    node_t *n = node_by_id((uint64_t)(uintptr_t)arg);
    if (n != NULL)
        node_lost(n, "its RPC connection closed");
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    const double now = hpd_time_now();
    for (node_t *n = C.nodes, *next; n != NULL; n = next) {
        next = n->next;
        if (n->lease_until < now) {
            node_lost(n, "lease expired (no heartbeat)");
        } else if (n->alive_until > 0 && n->alive_until < now) {
            char why[120];
            snprintf(why, sizeof(why), "no liveness ping for %u ms: the process is stopped or "
                     "hung", C.o.liveness_ms);
            node_lost(n, why);
        }
    }
    for (req_t *r = C.reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->state == R_QUEUED && now - r->t_queued > C.o.queue_timeout_ms / 1000.0)
            req_fail(r, HPD_RPC_ERR_OVERLOADED,
                     "no node could take the request within %u ms (%s)", C.o.queue_timeout_ms,
                     r->last_error[0] ? r->last_error : "no room or no nodes");
    }
}

static void m_register(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg)
{
    hpd_proto_err_t err = {{0}};
    hpd_msg_register_t m = {0};
    node_t *n = calloc(1, sizeof(*n));

    if (n == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "out of memory");
        return;
    }
    if (!hpd_msg_unpack(&hpd_msg_register, params, &m, &err))
        goto bad;
    const char *role = m.role;
    const void *fp = m.fingerprint;
    const uint32_t fp_len = m.fingerprint_len, port = m.port;
    const msgpack_object *info = m.xfer;
    memcpy(n->name, m.name, sizeof(n->name));
    memcpy(n->host, m.host, sizeof(n->host));
    n->vocab = m.vocab;
    n->max_context = m.max_context;
    n->layout = m.layout;
    n->layout.n_layers = m.kv_layers;
    n->pages = m.pages;
    n->slots = m.slots;
    n->max_batch = m.max_batch;
    if (strcmp(role, "prefill") == 0) {
        n->role = ROLE_PREFILL;
    } else if (strcmp(role, "decode") == 0) {
        n->role = ROLE_DECODE;
    } else {
        snprintf(err.text, sizeof(err.text),
                 "register: role is '%s' (expected prefill or decode)", role);
        goto bad;
    }
    if (fp_len != 16) {
        snprintf(err.text, sizeof(err.text), "register: fingerprint has %u bytes (expected 16)",
                 fp_len);
        goto bad;
    }
    /* a UCX address or region other nodes could not use (or that would
     * abort them) is refused here, before any node sees it */
    char why[200];
    if (hpd_xfer_check_info(info, why, sizeof(why)) != HPD_OK) {
        snprintf(err.text, sizeof(err.text), "register: xfer: %s", why);
        goto bad;
    }
    if (C.have_fingerprint && memcmp(C.fingerprint, fp, 16) != 0) {
        snprintf(err.text, sizeof(err.text),
                 "register: node %s serves a different model than the cluster (fingerprint "
                 "differs)",
                 n->name);
        goto bad;
    }
    if (!C.have_fingerprint) {
        memcpy(C.fingerprint, fp, 16);
        hpd_prefix_hash_root(C.fingerprint, &C.root);
        C.have_fingerprint = true;
    }
    hpd_rpc_buf_t ib;
    hpd_rpc_buf_init(&ib);
    msgpack_pack_object(&ib.pk, *info);
    n->xfer_info_len = ib.sb.size;
    n->xfer_info = msgpack_sbuffer_release(&ib.sb);
    hpd_rpc_client_params_t cp = {.base = C.base,
                                  .host = n->host,
                                  .port = (uint16_t)port,
                                  .token = C.token,
                                  .timeout_ms = 30000,
                                  .on_notify = on_node_notify,
                                  .on_close = on_node_close};
    n->id = ++C.next_node;
    n->port = (uint16_t)port;
    cp.arg = (void *)(uintptr_t)n->id;
    if (hpd_rpc_client_connect(&cp, &n->client) != HPD_OK) {
        snprintf(err.text, sizeof(err.text), "register: cannot connect back to %s:%u", n->host,
                 port);
        free(n->xfer_info);
        goto bad;
    }
    /* a node registering again (it lost this coordinator, or restarted)
     * replaces its old registration: what that held is re-routed */
    for (node_t *o = C.nodes, *next; o != NULL; o = next) {
        next = o->next;
        if (o->alive && strcmp(o->name, n->name) == 0 && strcmp(o->host, n->host) == 0 &&
            o->port == n->port)
            node_lost(o, "it registered again");
    }
    n->alive = true;
    n->reg_conn = conn;
    hpd_rpc_conn_ref(conn);
    hpd_rpc_conn_set_user(conn, (void *)(uintptr_t)n->id);
    n->lease_until = hpd_time_now() + C.o.lease_ms / 1000.0;
    n->next = C.nodes;
    C.nodes = n;
    HPD_LOG_INFO(LOG_COMPONENT, "%s node %s (%llu) registered from %s:%u, kv layout %u,%u,%s, "
                 "%u pages, %u slots", role, n->name, (unsigned long long)n->id, n->host, port,
                 n->layout.block_size, n->layout.pack_size,
                 n->layout.order == HPD_KV_HND ? "hnd" : "nhd", n->pages, n->slots);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    const bool liveness = C.o.liveness_ms > 0 && getrandom(&n->alive_key, sizeof(n->alive_key),
                                                            0) == sizeof(n->alive_key);
    const hpd_msg_registered_t reg = {
        .node_id = n->id,
        .heartbeat_ms = C.o.heartbeat_ms,
        .lease_ms = C.o.lease_ms,
        /* five pings per liveness lease */
        .alive_ms = liveness ? HPD_MAX(C.o.liveness_ms / 5, 10u) : 0,
        .alive_key = liveness ? n->alive_key : 0,
        .alive_lease_ms = liveness ? C.o.liveness_ms : 0};
    hpd_msg_pack(&hpd_msg_registered, &reg, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
    schedule_soon();
    return;
bad:
    hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
    free(n);
}

/* A liveness ping, from the node's pinger thread on a connection of its
 * own: the key from the registration proves it is that node's. */
static void m_alive(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_proto_err_t err = {{0}};
    hpd_msg_alive_t m = {0};
    node_t *n;

    if (!hpd_msg_unpack(&hpd_msg_alive, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        return;
    }
    if ((n = node_by_id(m.node_id)) == NULL || !n->alive || n->alive_key == 0 ||
        n->alive_key != m.key) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP,
                            "alive: node %llu is not registered with that key",
                            (unsigned long long)m.node_id);
        return;
    }
    n->alive_until = hpd_time_now() + C.o.liveness_ms / 1000.0;
    hpd_rpc_reply(conn, id, NULL);
}

static void m_heartbeat(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                        void *arg)
{
    hpd_proto_err_t err = {{0}};
    hpd_msg_stats_t m = {0};
    uint64_t node_id;
    node_t *n;

    /* whose it is first: a heartbeat counts only from the connection that
     * registered that node; then the whole stats map is checked */
    if (!hpd_proto_u64(params, "node_id", true, UINT64_MAX, &node_id, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "heartbeat: %s", err.text);
        return;
    }
    if ((n = node_by_id(node_id)) == NULL || !n->alive) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP,
                            "heartbeat: node %llu is not registered (lease lapsed?)",
                            (unsigned long long)node_id);
        return;
    }
    if (n->reg_conn != conn) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP, "heartbeat: node %llu registered on "
                            "another connection; a node's heartbeats come on the connection "
                            "that registered it", (unsigned long long)node_id);
        return;
    }
    if (!hpd_msg_unpack(&hpd_msg_stats, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "heartbeat: %s", err.text);
        return;
    }
    n->lease_until = hpd_time_now() + C.o.lease_ms / 1000.0;
    const bool draining = m.draining;
    if (draining != n->draining) {
        n->draining = draining;
        HPD_LOG_INFO(LOG_COMPONENT, "%s node %s %s", n->role == ROLE_PREFILL ? "prefill" : "decode",
                     n->name, draining ? "is draining: no new work goes there" : "serves again");
        if (!draining)
            schedule_soon();
    }
    if (m.prefix_summary_len == SUMMARY_BYTES) {
        memcpy(n->summary, m.prefix_summary, SUMMARY_BYTES);
        n->have_summary = true;
    }
    /* keep the rest for status */
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    uint32_t keep = 0;
    for (uint32_t i = 0; i < params->via.map.size; i++)
        keep += !hpd_rpc_str_eq(params->via.map.ptr[i].key.via.str.ptr,
                                params->via.map.ptr[i].key.via.str.size, "prefix_summary");
    msgpack_pack_map(&b.pk, keep);
    for (uint32_t i = 0; i < params->via.map.size; i++) {
        const msgpack_object_kv *kv = &params->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR &&
            hpd_rpc_str_eq(kv->key.via.str.ptr, kv->key.via.str.size, "prefix_summary"))
            continue;
        msgpack_pack_object(&b.pk, kv->key);
        msgpack_pack_object(&b.pk, kv->val);
    }
    free(n->stats);
    n->stats_len = b.sb.size;
    n->stats = msgpack_sbuffer_release(&b.sb);
    hpd_rpc_reply(conn, id, NULL);
}

/* ------------------------------------------------------------ clients */

static void m_generate(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg)
{
    hpd_proto_err_t err = {{0}};
    uint32_t vocab = UINT32_MAX, max_ctx = 0;
    bool have_p = false, have_d = false;
    req_t *r;

    if (C.draining) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_OVERLOADED,
                            "generate: the coordinator is shutting down (draining)");
        C.rejected++;
        hpd_metric_inc(C.m.overloaded, 1);
        return;
    }
    for (node_t *n = C.nodes; n != NULL; n = n->next) {
        if (!n->alive || n->draining)
            continue;
        vocab = HPD_MIN(vocab, n->vocab);
        if (n->role == ROLE_DECODE)
            max_ctx = HPD_MAX(max_ctx, n->max_context);
        have_p |= n->role == ROLE_PREFILL;
        have_d |= n->role == ROLE_DECODE;
    }
    if (!have_p || !have_d) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_OVERLOADED,
                            "generate: no %s node is registered", !have_p ? "prefill" : "decode");
        C.rejected++;
        hpd_metric_inc(C.m.overloaded, 1);
        return;
    }
    if (C.n_reqs >= C.o.max_requests) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_OVERLOADED,
                            "generate: overloaded: %u requests in flight (limit %u)", C.n_reqs,
                            C.o.max_requests);
        C.rejected++;
        hpd_metric_inc(C.m.overloaded, 1);
        return;
    }
    if ((r = calloc(1, sizeof(*r))) == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "out of memory");
        return;
    }
    r->max_tokens = 16;
    r->sampling = (hpd_sampling_t){0, 1, 0, 0};
    if (!hpd_proto_ids(params, "prompt", true, vocab, &r->prompt, &r->n_prompt, &err) ||
        !hpd_proto_u32(params, "max_tokens", false, UINT32_MAX, &r->max_tokens, &err) ||
        !hpd_proto_sampling(params, &r->sampling, &err) ||
        !hpd_proto_bool(params, "stream", false, &r->stream, &err) ||
        !hpd_proto_u64(params, "tag", false, UINT64_MAX, &r->tag, &err))
        goto bad;
    if (r->n_prompt == 0) {
        snprintf(err.text, sizeof(err.text), "prompt is empty (expected at least one token id)");
        goto bad;
    }
    if (r->max_tokens == 0 || (uint64_t)r->n_prompt + r->max_tokens > max_ctx) {
        snprintf(err.text, sizeof(err.text),
                 "prompt of %u tokens + max_tokens %u must be at most %u (the largest decode "
                 "context) with max_tokens >= 1", r->n_prompt, r->max_tokens, max_ctx);
        goto bad;
    }
    if (!(r->sampling.temperature >= 0) || !(r->sampling.top_p > 0 && r->sampling.top_p <= 1)) {
        snprintf(err.text, sizeof(err.text),
                 "temperature %g / top_p %g invalid (expected temperature >= 0, top_p in (0, 1])",
                 r->sampling.temperature, r->sampling.top_p);
        goto bad;
    }
    if ((r->out = malloc(r->max_tokens * sizeof(int32_t))) == NULL ||
        (r->hashes = malloc((r->n_prompt / HPD_PREFIX_BLOCK + 1) * sizeof(*r->hashes))) == NULL) {
        snprintf(err.text, sizeof(err.text), "out of memory");
        goto bad;
    }
    hpd_prefix_hash_chain(&C.root, r->prompt, r->n_prompt / HPD_PREFIX_BLOCK, r->hashes);
    r->id = ++C.next_req;
    r->client = conn;
    r->call_id = id;
    hpd_rpc_conn_ref(conn);
    r->t_submit = r->t_queued = hpd_time_now();
    req_t **tail = &C.reqs;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = r;
    C.n_reqs++;
    const char *who = hpd_rpc_conn_who(conn);
    HPD_LOGR_INFO(LOG_COMPONENT, r->id, "accepted: %u prompt tokens, max_tokens %u%s%s%s",
                  r->n_prompt, r->max_tokens, r->stream ? ", streaming" : "",
                  strncmp(who, "tenant ", 7) == 0 ? ", " : "",
                  strncmp(who, "tenant ", 7) == 0 ? who : "");
    schedule_soon();
    return;
bad:
    hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "generate: %s", err.text);
    hpd_metric_inc(C.m.invalid, 1);
    free(r->prompt);
    free(r->out);
    free(r->hashes);
    free(r);
}

static void m_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_proto_err_t err;
    uint64_t tag;
    bool found = false;

    if (!hpd_proto_u64(params, "tag", true, UINT64_MAX, &tag, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "cancel: %s", err.text);
        return;
    }
    for (req_t *r = C.reqs; r != NULL; r = r->next) {
        if (r->client == conn && r->tag == tag) {
            abort_attempt(r);
            hpd_rpc_reply_error(r->client, r->call_id, HPD_RPC_ERR_APP, "canceled");
            HPD_LOGR_INFO(LOG_COMPONENT, r->id, "canceled by the client");
            C.canceled++;
            hpd_metric_inc(C.m.canceled, 1);
            req_free(r);
            found = true;
            break;
        }
    }
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 1);
    hpd_proto_key(&b.pk, "canceled");
    if (found)
        msgpack_pack_true(&b.pk);
    else
        msgpack_pack_false(&b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
    schedule_soon();
}

/* What a client key may see is the cluster's shape and load; where the
 * nodes listen is for node credentials only. */
static void m_status(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    const bool addresses = (hpd_rpc_conn_roles(conn) & HPD_ROLE_NODE) != 0;
    hpd_rpc_buf_t b;
    uint32_t n_nodes = 0, queued = 0;
    for (node_t *n = C.nodes; n != NULL; n = n->next)
        n_nodes++;
    for (req_t *r = C.reqs; r != NULL; r = r->next)
        queued += r->state == R_QUEUED;
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 2);
    hpd_proto_key(&b.pk, "nodes");
    msgpack_pack_array(&b.pk, n_nodes);
    for (node_t *n = C.nodes; n != NULL; n = n->next) {
        msgpack_pack_map(&b.pk, addresses ? 9 : 8);
        hpd_proto_kv_u64(&b.pk, "id", n->id);
        hpd_proto_key(&b.pk, "draining");
        if (n->draining)
            msgpack_pack_true(&b.pk);
        else
            msgpack_pack_false(&b.pk);
        hpd_proto_key(&b.pk, "role");
        hpd_rpc_pack_str(&b.pk, n->role == ROLE_PREFILL ? "prefill" : "decode");
        hpd_proto_key(&b.pk, "name");
        hpd_rpc_pack_str(&b.pk, n->name);
        if (addresses) {
            char addr[96];
            snprintf(addr, sizeof(addr), "%s:%u", n->host, n->port);
            hpd_proto_key(&b.pk, "address");
            hpd_rpc_pack_str(&b.pk, addr);
        }
        hpd_proto_key(&b.pk, "layout");
        hpd_proto_pack_layout(&b.pk, &n->layout);
        hpd_proto_kv_u64(&b.pk, "reserved_slots", n->slots_reserved);
        hpd_proto_kv_u64(&b.pk, "jobs", n->jobs);
        hpd_proto_key(&b.pk, "stats");
        if (n->stats != NULL)
            msgpack_sbuffer_write(&b.sb, n->stats, n->stats_len);
        else
            msgpack_pack_nil(&b.pk);
    }
    hpd_proto_key(&b.pk, "requests");
    msgpack_pack_map(&b.pk, 7);
    hpd_proto_kv_u64(&b.pk, "active", C.n_reqs);
    hpd_proto_kv_u64(&b.pk, "queued", queued);
    hpd_proto_kv_u64(&b.pk, "finished", C.finished);
    hpd_proto_kv_u64(&b.pk, "failed", C.failed);
    hpd_proto_kv_u64(&b.pk, "canceled", C.canceled);
    hpd_proto_kv_u64(&b.pk, "retried", C.retried);
    hpd_proto_kv_u64(&b.pk, "rejected", C.rejected);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

/* A client's connection closed: its requests go; a node's: the node is lost. */
static void on_disconnect(hpd_rpc_conn_t *conn, void *arg)
{
    const uint64_t node_id = (uint64_t)(uintptr_t)hpd_rpc_conn_user(conn);
    if (node_id != 0) {
        node_t *n = node_by_id(node_id);
        if (n != NULL)
            node_lost(n, "its registration connection closed");
        return;
    }
    for (req_t *r = C.reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->client == conn) {
            abort_attempt(r);
            HPD_LOGR_INFO(LOG_COMPONENT, r->id, "canceled: the client disconnected");
            C.canceled++;
            hpd_metric_inc(C.m.canceled, 1);
            req_free(r);
        }
    }
    schedule_soon();
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hpd-coordinator [options]\n"
            "  --host ADDR            address to bind (127.0.0.1)\n"
            "  --port N               port, 0 = any free port (7000)\n"
            "  --port-file F          write the bound port to F once listening\n"
            "  --token-file F         the node secret (first line); also the client key\n"
            "                         without --client-keys-file\n"
            "  --client-keys-file F   client API keys, one per line: KEY [TENANT]; read\n"
            "                         again on SIGHUP (a removed key's connections close)\n"
            "  --heartbeat-ms N       node heartbeat period (500)\n"
            "  --lease-ms N           a node silent this long is lost; more than the\n"
            "                         longest engine step (10000)\n"
            "  --liveness-ms N        a node whose pinger thread is silent this long is\n"
            "                         lost (stopped or hung process); 0 = off (500)\n"
            "  --max-requests N       requests in flight before 'overloaded' (256)\n"
            "  --queue-timeout-ms N   a request no node can take fails after (60000)\n"
            "  --max-attempts N       attempts per request across failures (4)\n"
            "  --metrics-port N       serve /metrics and /healthz over HTTP on --host\n"
            "  --drain-timeout-ms N   on SIGTERM, open requests may finish this long (30000)\n"
            "  --max-connections N    open RPC connections, clients and nodes; half at most\n"
            "                         unauthenticated (1024, or what the fd limit allows)\n"
            "  --log-level L          error|warn|info|debug (info)\n");
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    enum { O_HOST = 256, O_PORT, O_PORTFILE, O_TOKEN, O_HB, O_LEASE, O_MAXREQ, O_QTIMEOUT,
           O_ATTEMPTS, O_LOG, O_METRICS, O_DRAIN, O_MAXCONN, O_KEYS, O_LIVENESS, O_HELP };
    static const struct option longopts[] = {
        {"host", 1, 0, O_HOST}, {"port", 1, 0, O_PORT}, {"port-file", 1, 0, O_PORTFILE},
        {"token-file", 1, 0, O_TOKEN}, {"heartbeat-ms", 1, 0, O_HB}, {"lease-ms", 1, 0, O_LEASE},
        {"max-requests", 1, 0, O_MAXREQ}, {"queue-timeout-ms", 1, 0, O_QTIMEOUT},
        {"max-attempts", 1, 0, O_ATTEMPTS}, {"log-level", 1, 0, O_LOG},
        {"metrics-port", 1, 0, O_METRICS}, {"drain-timeout-ms", 1, 0, O_DRAIN},
        {"max-connections", 1, 0, O_MAXCONN}, {"client-keys-file", 1, 0, O_KEYS},
        {"liveness-ms", 1, 0, O_LIVENESS},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    struct {
        int opt;
        const char *flag;
        uint64_t min, max;
        uint32_t *dst;
    } nums[] = {{O_HB, "--heartbeat-ms", 10, 60000, &o->heartbeat_ms},
                {O_LEASE, "--lease-ms", 30, 600000, &o->lease_ms},
                {O_LIVENESS, "--liveness-ms", 0, 600000, &o->liveness_ms},
                {O_MAXREQ, "--max-requests", 1, 1u << 24, &o->max_requests},
                {O_QTIMEOUT, "--queue-timeout-ms", 1, UINT32_MAX, &o->queue_timeout_ms},
                {O_ATTEMPTS, "--max-attempts", 1, 100, &o->max_attempts},
                {O_DRAIN, "--drain-timeout-ms", 0, UINT32_MAX, &o->drain_timeout_ms},
                {O_MAXCONN, "--max-connections", 4, 1u << 20, &o->max_connections}};
    uint64_t v;
    int c, lvl;

    *o = (opts_t){.host = "127.0.0.1",
                  .port = 7000,
                  .heartbeat_ms = 500,
                  .lease_ms = 10000,
                  .liveness_ms = 500,
                  .max_requests = 256,
                  .queue_timeout_ms = 60000,
                  .max_attempts = 4,
                  .metrics_port = -1,
                  .drain_timeout_ms = 30000};
    hpd_log_set_level(HPD_LOG_LEVEL_INFO);
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool done = false;
        for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
            if (nums[i].opt != c)
                continue;
            if (hpd_parse_u64(optarg, nums[i].min, nums[i].max, &v) != 0) {
                fprintf(stderr, "%s: '%s' is invalid (expected an integer from %llu to %llu)\n",
                        nums[i].flag, optarg, (unsigned long long)nums[i].min,
                        (unsigned long long)nums[i].max);
                return -1;
            }
            *nums[i].dst = (uint32_t)v;
            done = true;
        }
        if (done)
            continue;
        switch (c) {
        case O_HOST: o->host = optarg; break;
        case O_PORT:
            if (hpd_parse_u64(optarg, 0, 65535, &v) != 0) {
                fprintf(stderr, "--port: '%s' is invalid (expected 0 to 65535)\n", optarg);
                return -1;
            }
            o->port = (uint16_t)v;
            break;
        case O_METRICS:
            if (hpd_parse_u64(optarg, 0, 65535, &v) != 0) {
                fprintf(stderr, "--metrics-port: '%s' is invalid (expected 0 to 65535)\n",
                        optarg);
                return -1;
            }
            o->metrics_port = (int32_t)v;
            break;
        case O_PORTFILE: o->port_file = optarg; break;
        case O_TOKEN: o->token_file = optarg; break;
        case O_KEYS: o->client_keys_file = optarg; break;
        case O_LOG:
            if ((lvl = hpd_log_level_parse(optarg)) < 0) {
                fprintf(stderr, "--log-level: '%s' is invalid (expected error, warn, info or "
                                "debug)\n", optarg);
                return -1;
            }
            hpd_log_set_level((hpd_log_level_t)lvl);
            break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->client_keys_file != NULL && o->token_file == NULL) {
        fprintf(stderr, "--client-keys-file needs --token-file (the node secret)\n");
        return -1;
    }
    if (o->lease_ms <= o->heartbeat_ms) {
        fprintf(stderr, "--lease-ms %u must exceed --heartbeat-ms %u\n", o->lease_ms,
                o->heartbeat_ms);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ shutdown */

/* The end of a drain: nodes are told to stop (they exit 0), then the loop
 * ends once those notices are flushed. */
static void on_drained(evutil_socket_t fd, short what, void *arg)
{
    static const struct timeval flush = {0, 200 * 1000};
    C.drained = true;
    while (C.reqs != NULL) { /* the deadline passed */
        req_t *r = C.reqs;
        HPD_LOGR_WARN(LOG_COMPONENT, r->id, "failed: the drain deadline passed");
        abort_attempt(r);
        hpd_rpc_reply_error(r->client, r->call_id, HPD_RPC_ERR_APP,
                            "coordinator shutting down (drain deadline passed)");
        C.failed++;
        hpd_metric_inc(C.m.failed, 1);
        req_free(r);
    }
    for (node_t *n = C.nodes; n != NULL; n = n->next)
        if (n->alive && n->reg_conn != NULL)
            hpd_rpc_notify(n->reg_conn, "shutdown", NULL);
    HPD_LOG_INFO(LOG_COMPONENT, "drained: nodes told to shut down, stopping");
    event_base_loopexit(C.base, &flush);
}

/* First SIGTERM or SIGINT: drain (refuse new requests, let open ones
 * finish within --drain-timeout-ms); a second one stops at once. */
static uint32_t authenticate(void *arg, const char *token, size_t len, char *who, size_t who_len,
                             uint64_t *credential_p)
{
    return hpd_credentials_check(C.creds, token, len, who, who_len, credential_p);
}

static bool revoked(const hpd_rpc_conn_t *conn, void *arg)
{
    return !hpd_credentials_grants(C.creds, hpd_rpc_conn_credential(conn),
                                   hpd_rpc_conn_roles(conn));
}

/* SIGHUP: the credentials are read again; connections whose credential no
 * longer grants their role are closed (their requests fail like a
 * client's disconnect). A file that does not load keeps the old ones. */
static void on_reload(evutil_socket_t sig, short what, void *arg)
{
    char err[400];
    hpd_credentials_t *fresh;
    if (C.creds == NULL) {
        HPD_LOG_WARN(LOG_COMPONENT, "SIGHUP: no credentials to read again (no --token-file)");
        return;
    }
    if (hpd_credentials_load(C.o.token_file, C.o.client_keys_file, &fresh, err, sizeof(err)) !=
        HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "SIGHUP: keeping the credentials in force: %s", err);
        return;
    }
    hpd_credentials_destroy(C.creds);
    C.creds = fresh;
    const uint32_t closed = hpd_rpc_server_close_if(C.server, revoked, NULL);
    HPD_LOG_INFO(LOG_COMPONENT, "SIGHUP: credentials read again: %zu client keys; %u "
                 "connections of revoked credentials closed", hpd_credentials_n_keys(C.creds),
                 closed);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    if (C.draining) {
        HPD_LOG_INFO(LOG_COMPONENT, "signal %d again, stopping now", (int)sig);
        event_base_loopbreak(C.base);
        return;
    }
    C.draining = true;
    HPD_LOG_INFO(LOG_COMPONENT, "signal %d: draining %u open requests (deadline %u ms)", (int)sig,
                 C.n_reqs, C.o.drain_timeout_ms);
    const struct timeval deadline = {C.o.drain_timeout_ms / 1000,
                                     (C.o.drain_timeout_ms % 1000) * 1000};
    static const struct timeval now = {0, 0};
    evtimer_add(C.drain_ev, C.n_reqs == 0 ? &now : &deadline);
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
    m->pair_failures = hpd_metrics_add(m->reg, HPD_METRIC_COUNTER, "hpd_pair_failures_total",
                                       "Prefill jobs whose transfer to the decode node failed "
                                       "(the request went to another decode node).", NULL);
    m->uptime = hpd_metrics_add(m->reg, HPD_METRIC_GAUGE, "hpd_uptime_seconds",
                                "Seconds since the process started.", NULL);
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

static void metrics_collect(void *arg)
{
    uint32_t queued = 0, prefill = 0, decode = 0, draining = 0;
    for (req_t *r = C.reqs; r != NULL; r = r->next)
        queued += r->state == R_QUEUED;
    for (node_t *n = C.nodes; n != NULL; n = n->next) {
        prefill += n->alive && n->role == ROLE_PREFILL;
        decode += n->alive && n->role == ROLE_DECODE;
        draining += n->alive && n->draining;
    }
    hpd_metric_set(C.m.queued, queued);
    hpd_metric_set(C.m.running, C.n_reqs - queued);
    hpd_metric_set(C.m.nodes_prefill, prefill);
    hpd_metric_set(C.m.nodes_decode, decode);
    hpd_metric_set(C.m.nodes_draining, draining);
    hpd_metric_set(C.m.uptime, hpd_time_now() - C.started);
    hpd_rpc_server_stats_t rs;
    hpd_rpc_server_stats(C.server, &rs);
    hpd_metric_set(C.m.conns_authed, rs.open - rs.unauthenticated);
    hpd_metric_set(C.m.conns_unauthed, rs.unauthenticated);
    hpd_metric_set(C.m.conns_refused, (double)rs.refused);
    hpd_metric_set(C.m.conns_evicted, (double)rs.evicted);
    hpd_metric_set(C.m.auth_timeouts, (double)rs.auth_timeouts);
    hpd_metric_set(C.m.auth_failures, (double)rs.auth_failures);
}

/* Ready while not draining; the body says what the coordinator has. */
static bool health(void *arg, char *msg, size_t len)
{
    uint32_t prefill = 0, decode = 0;
    for (node_t *n = C.nodes; n != NULL; n = n->next) {
        prefill += n->alive && !n->draining && n->role == ROLE_PREFILL;
        decode += n->alive && !n->draining && n->role == ROLE_DECODE;
    }
    /* connections turned away now or in the last 10 s: clients and nodes
     * may be locked out */
    hpd_rpc_server_stats_t rs;
    hpd_rpc_server_stats(C.server, &rs);
    if (rs.last_refused > 0 && hpd_time_now() - rs.last_refused < 10.0) {
        snprintf(msg, len, "refusing connections: %u open (limit %u), %llu refused, the last "
                 "%.1f s ago", rs.open, rs.max_conns, (unsigned long long)rs.refused,
                 hpd_time_now() - rs.last_refused);
        return false;
    }
    snprintf(msg, len, "%s: %u prefill and %u decode nodes, %u open requests",
             C.draining ? "draining" : "ok", prefill, decode, C.n_reqs);
    return !C.draining;
}

int main(int argc, char **argv)
{
    static const hpd_rpc_method_t methods[] = {
        {"register", m_register, HPD_ROLE_NODE},
        {"heartbeat", m_heartbeat, HPD_ROLE_NODE},
        {"alive", m_alive, HPD_ROLE_NODE},
        {"generate", m_generate, HPD_ROLE_CLIENT},
        {"cancel", m_cancel, HPD_ROLE_CLIENT},
        {"status", m_status, HPD_ROLE_CLIENT | HPD_ROLE_NODE},
    };
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    C.started = hpd_time_now();
    if (parse_opts(argc, argv, &C.o) != 0)
        return 2;
    if (C.o.token_file != NULL) {
        char err[400];
        if (hpd_rpc_read_token(C.o.token_file, &C.token) != HPD_OK ||
            hpd_credentials_load(C.o.token_file, C.o.client_keys_file, &C.creds, err,
                                 sizeof(err)) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s", C.token == NULL
                                                  ? "cannot read the token file"
                                                  : err);
            free(C.token);
            return 2;
        }
    }
    if ((C.base = event_base_new()) == NULL || metrics_init(&C.m) != HPD_OK)
        return 1;
    hpd_rpc_server_params_t sp = {.base = C.base, .host = C.o.host, .port = C.o.port,
                                  .token = C.token, .methods = methods,
                                  .n_methods = sizeof(methods) / sizeof(methods[0]),
                                  .on_disconnect = on_disconnect,
                                  .max_conns = C.o.max_connections,
                                  .authenticate = C.creds != NULL ? authenticate : NULL};
    if (hpd_rpc_server_create(&sp, &C.server) != HPD_OK)
        goto out;
    if (C.o.port_file != NULL) {
        char text[16];
        const int len = snprintf(text, sizeof(text), "%u\n", hpd_rpc_server_port(C.server));
        if (hpd_write_file(C.o.port_file, text, (size_t)len) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "cannot write the port file %s", C.o.port_file);
            goto out;
        }
    }
    /* Node and job ids are new across restarts: they start at the
     * milliseconds since 2020 times 2^14, so that a node still holding work
     * of a coordinator that died (a late transfer notice, an endpoint named
     * by a node id) never takes it for work of this one. Below 2^53. */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    const int64_t ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000 - 1577836800000;
    C.next_node = C.next_job = ms > 0 ? (uint64_t)ms << 14 : 0;
    C.tick = event_new(C.base, -1, EV_PERSIST, on_tick, NULL);
    C.reap = evtimer_new(C.base, on_reap, NULL);
    C.sched = evtimer_new(C.base, on_sched, NULL);
    C.drain_ev = evtimer_new(C.base, on_drained, NULL);
    if (C.o.metrics_port >= 0) {
        hpd_http_params_t hp = {.base = C.base,
                                .host = C.o.host,
                                .port = (uint16_t)C.o.metrics_port,
                                .metrics = C.m.reg,
                                .collect = metrics_collect,
                                .health = health};
        if (hpd_http_create(&hp, &C.http) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "--metrics-port %d: cannot listen on %s",
                          C.o.metrics_port, C.o.host);
            rc = 2;
            goto out;
        }
    }
    C.sig_int = evsignal_new(C.base, SIGINT, on_signal, NULL);
    C.sig_term = evsignal_new(C.base, SIGTERM, on_signal, NULL);
    C.sig_hup = evsignal_new(C.base, SIGHUP, on_reload, NULL);
    evsignal_add(C.sig_hup, NULL);
    struct timeval tick = {0, 100 * 1000};
    event_add(C.tick, &tick);
    evsignal_add(C.sig_int, NULL);
    evsignal_add(C.sig_term, NULL);
    if (C.http != NULL)
        HPD_LOG_INFO(LOG_COMPONENT, "listening on %s:%u, metrics and health on http port %u",
                     C.o.host, hpd_rpc_server_port(C.server), hpd_http_port(C.http));
    else
        HPD_LOG_INFO(LOG_COMPONENT, "listening on %s:%u", C.o.host,
                     hpd_rpc_server_port(C.server));
    event_base_dispatch(C.base);
    rc = 0;
out:
    while (C.reqs != NULL) {
        hpd_rpc_reply_error(C.reqs->client, C.reqs->call_id, HPD_RPC_ERR_APP,
                            "coordinator shutting down");
        req_free(C.reqs);
    }
    while (C.nodes != NULL) {
        node_t *n = C.nodes;
        C.nodes = n->next;
        n->next = C.dead;
        C.dead = n;
    }
    on_reap(-1, 0, NULL);
    hpd_rpc_server_destroy(C.server);
    hpd_http_destroy(C.http);
    hpd_metrics_destroy(C.m.reg);
    struct event *evs[] = {C.drain_ev, C.tick, C.reap, C.sched, C.sig_int, C.sig_term, C.sig_hup};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(evs); i++)
        if (evs[i] != NULL)
            event_free(evs[i]);
    free(C.token);
    hpd_credentials_destroy(C.creds);
    event_base_free(C.base);
    return rc;
}
