#include "node/node.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/options.h"
#include "common/util.h"
#include "node/msg.h"
#include "node/proto.h"
#include "service/service.h"
#include "tokenizer/tokenizer.h"

/* a register call not answered in this long is given up (its connection
 * closed: the coordinator does not serve it late) and made again */
#define REGISTER_TIMEOUT_MS 5000
#define REGISTER_STANDBY_MS 200 /* the most between tries with several coordinators */
#define LOG_COMPONENT "node"

/* ------------------------------------------------------------ options */

/* HOST:PORT, or several comma-separated (a leader and its standbys). */
static bool parse_coordinator(const char *text, void *dst, char *err, size_t len)
{
    hpd_node_opts_t *o = dst;
    if (!hpd_proto_parse_endpoints(text, o->coordinators, HPD_NODE_MAX_COORDINATORS,
                                   &o->n_coordinators, err, len))
        return false;
    o->coordinator_at = 0;
    memcpy(o->coordinator_host, o->coordinators[0].host, sizeof(o->coordinator_host));
    o->coordinator_port = o->coordinators[0].port;
    return true;
}

/* The next coordinator given, after a registration that failed (a standby
 * does not listen; the leader is one of the others). */
static void next_coordinator(hpd_node_opts_t *o)
{
    if (o->n_coordinators < 2)
        return;
    o->coordinator_at = (o->coordinator_at + 1) % o->n_coordinators;
    memcpy(o->coordinator_host, o->coordinators[o->coordinator_at].host,
           sizeof(o->coordinator_host));
    o->coordinator_port = o->coordinators[o->coordinator_at].port;
}

/* The options of a node of `role` (common/options.h has them all). Returns
 * as hpd_opt_parse. */
static int parse_opts(int argc, char **argv, const char *role, hpd_node_opts_t *o)
{
    const bool prefill = strcmp(role, "prefill") == 0;
    hpd_log_level_t level = HPD_LOG_LEVEL_INFO;
    uint64_t host_cache = 0;
    char prog[32], intro[96];
    memset(o, 0, sizeof(*o));
    hpd_engine_params_init(&o->engine);
    snprintf(prog, sizeof(prog), "hpd-%s", role);
    snprintf(intro, sizeof(intro), "usage: %s --coordinator HOST:PORT --model DIR [options]",
             prog);
    const hpd_opt_bind_t common[] = {
        {.name = "coordinator", .dst = o, .required = true, .parse = parse_coordinator},
        {.name = "model", .dst = &o->model_dir, .required = true},
        HPD_OPT_BIND("token-file", &o->token_file),
        HPD_OPT_BIND("name", &o->name),
        HPD_OPT_BIND("host", &o->host),
        HPD_OPT_BIND("port", &o->port),
        HPD_OPT_BIND("device", &o->device),
        HPD_OPT_BIND("threads", &o->threads),
        HPD_OPT_BIND("tp", &o->tp),
        HPD_OPT_BIND("tp-fast", &o->tp_fast),
        HPD_OPT_BIND("kv-layout", &o->engine.kv_layout),
        HPD_OPT_BIND("max-batch", &o->engine.max_batch),
        HPD_OPT_BIND("max-context", &o->engine.max_context),
        HPD_OPT_BIND("prefill-chunk", &o->engine.prefill_chunk),
        HPD_OPT_BIND("kv-pages", &o->engine.n_pages),
        HPD_OPT_BIND("ucx-tls", &o->ucx_tls),
        HPD_OPT_BIND("ucx-dev", &o->ucx_dev),
        HPD_OPT_BIND("connect-timeout-ms", &o->connect_timeout_ms),
        HPD_OPT_BIND("metrics-port", &o->metrics_port),
        HPD_OPT_BIND("drain-timeout-ms", &o->drain_timeout_ms),
        HPD_OPT_BIND("log-level", &level),
    };
    const hpd_opt_bind_t prefill_only[] = {
        HPD_OPT_BIND("no-prefix-cache", &o->engine.prefix_cache),
        HPD_OPT_BIND("checkpoints", &o->engine.n_checkpoints),
        HPD_OPT_BIND("host-cache-mb", &host_cache),
        HPD_OPT_BIND("staging-mb", &o->staging_bytes),
        HPD_OPT_BIND("xfer-deadline-ms", &o->xfer_deadline_ms),
    };
    const hpd_opt_bind_t decode_only[] = {HPD_OPT_BIND("reserve-timeout-ms", &o->reserve_timeout_ms)};
    hpd_opt_bind_t binds[HPD_ARRAY_SIZE(common) + HPD_ARRAY_SIZE(prefill_only)];
    size_t n = 0;
    for (size_t i = 0; i < HPD_ARRAY_SIZE(common); i++)
        binds[n++] = common[i];
    const hpd_opt_bind_t *own = prefill ? prefill_only : decode_only;
    const size_t n_own = prefill ? HPD_ARRAY_SIZE(prefill_only) : HPD_ARRAY_SIZE(decode_only);
    for (size_t i = 0; i < n_own; i++)
        binds[n++] = own[i];
    const int rc = hpd_opt_parse(argc, argv, prog,
                                 prefill ? HPD_OPT_ROLE_PREFILL : HPD_OPT_ROLE_DECODE, intro,
                                 binds, n);
    if (rc != 0)
        return rc;
    hpd_log_set_level(level);
    if (prefill)
        o->engine.host_cache_bytes = host_cache;
    else
        o->engine.prefix_cache = false; /* a decode node holds only reserved requests */
    return 0;
}

/* ------------------------------------------------------------ stepping */

static void on_step(evutil_socket_t fd, short what, void *arg)
{
    hpd_node_t *n = arg;
    uint32_t active = 0;
    hpd_status_t st = hpd_engine_step(n->engine, &active);

    if (st != HPD_OK) /* the engine failed the step's requests; the role reports them */
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: engine step failed: %s", n->o.name,
                      hpd_status_str(st));
    if (n->role->after_step != NULL)
        n->role->after_step(n);
    if (active > 0)
        hpd_node_kick(n);
}

bool hpd_node_may_write(hpd_node_t *n)
{
    if (n->liveness == NULL || !n->registered)
        return true;
    /* no ping answered yet for this registration: the coordinator holds
     * no liveness lease on it either (it starts at the first ping) */
    const double until = hpd_liveness_valid_until(n->liveness);
    return until == 0 || hpd_time_now() < until;
}

void hpd_node_kick(hpd_node_t *n)
{
    static const struct timeval now = {0, 0};
    if (!evtimer_pending(n->step_ev, NULL))
        evtimer_add(n->step_ev, &now);
}

/* ------------------------------------------------------------ stats */

static void pack_stats(hpd_node_t *n, msgpack_packer *pk, bool with_summary)
{
    uint32_t pu, pt, su, stot;
    hpd_engine_stats_t es;
    hpd_prefix_cache_stats_t cs;
    hpd_xfer_stats_t xs;
    const bool cache = hpd_engine_cache_stats(n->engine, &cs) == HPD_OK;
    hpd_rpc_buf_t eb, cb, xb, lb;

    hpd_engine_usage(n->engine, &pu, &pt, &su, &stot);
    hpd_engine_stats(n->engine, &es);
    hpd_xfer_stats(n->xfer, &xs);
    hpd_rpc_buf_init(&eb);
    hpd_msg_pack(&hpd_msg_engine_stats,
                 &(hpd_msg_engine_stats_t){.steps = es.steps,
                                           .prefill_tokens = es.prefill_tokens,
                                           .decode_tokens = es.decode_tokens},
                 &eb.pk);
    hpd_rpc_buf_init(&cb);
    hpd_msg_pack(&hpd_msg_cache_stats,
                 &(hpd_msg_cache_stats_t){
                     .lookup_tokens = cache ? cs.lookup_tokens : 0,
                     .hit_tokens_device = cache ? cs.hit_tokens_device : 0,
                     .hit_tokens_host = cache ? cs.hit_tokens_host : 0,
                     .entries = cache ? cs.device_entries + cs.host_entries : 0},
                 &cb.pk);
    hpd_rpc_buf_init(&xb);
    hpd_msg_pack(&hpd_msg_xfer_stats,
                 &(hpd_msg_xfer_stats_t){.bytes_put = xs.bytes_put,
                                         .bytes_mapped = xs.bytes_mapped,
                                         .transfers_finished = xs.transfers_finished,
                                         .transfers_failed = xs.transfers_failed,
                                         .notices_ok = xs.notices_ok,
                                         .notices_bad = xs.notices_bad,
                                         .open_transfers = xs.open_transfers,
                                         .deadlines_missed = xs.deadlines_missed,
                                         .writers_closed = xs.writers_closed,
                                         .link_rate = (float)xs.link_rate},
                 &xb.pk);
    hpd_rpc_buf_init(&lb);
    n->role->pack_load(n, &lb.pk);
    hpd_msg_stats_t m = {.node_id = n->node_id,
                         .draining = n->draining,
                         .uptime_s = (float)(hpd_time_now() - n->started),
                         .pages_used = pu,
                         .pages_total = pt,
                         .slots_used = su,
                         .slots_total = stot,
                         .cache_pages = cache ? cs.pages_held : 0,
                         .audit_errors = hpd_engine_audit(n->engine),
                         .engine_raw = eb.sb.data,
                         .engine_raw_len = (uint32_t)eb.sb.size,
                         .cache_raw = cb.sb.data,
                         .cache_raw_len = (uint32_t)cb.sb.size,
                         .xfer_raw = xb.sb.data,
                         .xfer_raw_len = (uint32_t)xb.sb.size,
                         .load_raw = lb.sb.data,
                         .load_raw_len = (uint32_t)lb.sb.size};
    snprintf(m.role, sizeof(m.role), "%s", n->role->name);
    snprintf(m.name, sizeof(m.name), "%s", n->o.name);
    if (with_summary && n->role->summary != NULL)
        n->role->summary(n, &m.prefix_summary, &m.prefix_summary_len);
    hpd_msg_pack(&hpd_msg_stats, &m, pk);
    hpd_rpc_buf_destroy(&eb);
    hpd_rpc_buf_destroy(&cb);
    hpd_rpc_buf_destroy(&xb);
    hpd_rpc_buf_destroy(&lb);
}

static void m_stats(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_node_t *n = arg;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    pack_stats(n, &b.pk, false);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

/* ------------------------------------------------------------ coordinator */

static void schedule_register(hpd_node_t *n);

/* The coordinator is gone for this node: its connection closed, heartbeats
 * went unanswered, or it no longer knows the node (the lease lapsed, or it
 * restarted). Whatever it handed out is dropped: nobody waits for those
 * answers (it re-routed or failed them when it lost the node, and a
 * restarted coordinator never knew them). The caches stay. The node
 * registers again from the loop. */
static void coordinator_lost(hpd_node_t *n, const char *why)
{
    if (n->shutdown || !n->registered)
        return;
    n->registered = false;
    n->heartbeat_pending = false;
    hpd_liveness_set(n->liveness, 0, 0, 0, 0);
    n->lost_at = hpd_time_now();
    n->reg_attempts = 0;
    event_del(n->hb_ev);
    const uint32_t jobs = n->role->in_flight != NULL ? n->role->in_flight(n) : 0;
    HPD_LOG_WARN(LOG_COMPONENT, "%s: lost the coordinator (%s); dropping its %u jobs and "
                 "registering again", n->o.name, why, jobs);
    if (n->role->drop_jobs != NULL)
        n->role->drop_jobs(n, why);
    schedule_register(n);
}

static void on_heartbeat_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_node_t *n = arg;
    char why[200];
    n->heartbeat_pending = false;
    if (st == HPD_ERR_CANCELED)
        return;
    if (st == HPD_OK && reply->is_error) {
        snprintf(why, sizeof(why), "it refused the heartbeat: %.*s",
                 (int)reply->error_message_len, reply->error_message);
        coordinator_lost(n, why);
    } else if (st == HPD_ERR_TIMEOUT) {
        snprintf(why, sizeof(why), "no heartbeat reply within the lease, %u ms", n->lease_ms);
        coordinator_lost(n, why);
    } else if (st != HPD_OK && st != HPD_ERR_IO) { /* IO: the close says it */
        HPD_LOG_WARN(LOG_COMPONENT, "%s: heartbeat failed: %s", n->o.name, hpd_status_str(st));
    }
}

static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    hpd_node_t *n = arg;
    hpd_rpc_buf_t b;

    if (!n->registered || n->heartbeat_pending || !hpd_rpc_client_is_open(n->coord))
        return;
    hpd_rpc_buf_init(&b);
    pack_stats(n, &b.pk, true);
    /* unanswered for the lease: the coordinator has dropped this node by
     * then, or cannot be reached */
    if (hpd_rpc_call(n->coord, "heartbeat", &b, n->lease_ms, on_heartbeat_reply, n) ==
        HPD_OK)
        n->heartbeat_pending = true;
    hpd_rpc_buf_destroy(&b);
}

static void on_coord_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    hpd_node_t *n = arg;
    if (!hpd_rpc_str_eq(msg->method, msg->method_len, "shutdown"))
        return;
    HPD_LOG_INFO(LOG_COMPONENT, "%s: the coordinator is shutting down the cluster; stopping",
                 n->o.name);
    n->shutdown = true;
    n->exit_code = 0;
    event_base_loopbreak(n->base);
}

static void on_coord_close(void *arg, hpd_status_t why)
{
    hpd_node_t *n = arg;
    char text[120];
    /* an orderly close reads as HPD_OK: say what it was */
    snprintf(text, sizeof(text), "its connection %s",
             why == HPD_OK ? "was closed by the coordinator" : "failed");
    if (why != HPD_OK)
        snprintf(text + strlen(text), sizeof(text) - strlen(text), ": %s", hpd_status_str(why));
    coordinator_lost(n, text);
}

/* The register call's params: who this node is, its pools and its UCX
 * info. */
static hpd_status_t pack_registration(hpd_node_t *n, hpd_rpc_buf_t *b)
{
    const hpd_engine_params_t *ep = hpd_engine_params(n->engine);
    hpd_rpc_buf_t info;
    hpd_status_t st;
    uint32_t pt, stot;

    hpd_engine_usage(n->engine, NULL, &pt, NULL, &stot);
    hpd_rpc_buf_init(&info);
    if ((st = hpd_xfer_pack_info(n->xfer, &info)) != HPD_OK) {
        hpd_rpc_buf_destroy(&info);
        return st;
    }
    hpd_msg_register_t m = {.port = hpd_rpc_server_port(n->server),
                            .fingerprint = n->model->fingerprint,
                            .fingerprint_len = 16,
                            .vocab = n->model->config.vocab_size,
                            .max_context = ep->max_context,
                            .layout = ep->kv_layout,
                            .kv_layers = ep->kv_layout.n_layers,
                            .pages = pt,
                            .slots = stot,
                            .max_batch = ep->max_batch,
                            .xfer_raw = info.sb.data,
                            .xfer_raw_len = (uint32_t)info.sb.size};
    m.incarnation = n->incarnation0 + ++n->reg_seq;
    /* --tp-fast sums in an order that depends on the degree: other numerics */
    const char *numerics = n->backend->ops->numerics ? n->backend->ops->numerics : "fp32";
    if (n->o.tp_fast)
        snprintf(m.numerics, sizeof(m.numerics), "%s+tp%u-fast", numerics, n->o.tp);
    else
        snprintf(m.numerics, sizeof(m.numerics), "%s", numerics);
    /* the shard map: every rank's KV, key and value heads */
    int32_t map[6 * HPD_TP_MAX];
    m.tp = n->o.tp;
    m.shard_map = map;
    m.shard_map_n = 6 * n->o.tp;
    for (uint32_t r = 0; r < n->o.tp; r++) {
        const hpd_shard_t *sh = &n->models[r]->shard;
        const hpd_range_t ranges[3] = {sh->kv_heads, sh->k_heads, sh->v_heads};
        for (uint32_t k = 0; k < 3; k++) {
            map[6 * r + 2 * k] = (int32_t)ranges[k].begin;
            map[6 * r + 2 * k + 1] = (int32_t)ranges[k].end;
        }
    }
    snprintf(m.role, sizeof(m.role), "%s", n->role->name);
    snprintf(m.name, sizeof(m.name), "%s", n->o.name);
    snprintf(m.host, sizeof(m.host), "%s", n->o.host);
    hpd_rpc_buf_init(b);
    hpd_msg_pack(&hpd_msg_register, &m, &b->pk);
    hpd_rpc_buf_destroy(&info);
    return HPD_OK;
}

/* The register call's outcome: on success the node has its new id and
 * heartbeats run; else why says what failed (the caller logs it). */
static hpd_status_t registration_done(hpd_node_t *n, hpd_status_t st, const hpd_rpc_msg_t *reply,
                                      char *why, size_t why_len)
{
    hpd_proto_err_t err;
    if (st == HPD_OK && reply->is_error) {
        snprintf(why, why_len, "it refused the registration: %.*s",
                 (int)reply->error_message_len, reply->error_message);
        return HPD_ERR_INVALID_ARG;
    }
    if (st != HPD_OK) {
        snprintf(why, why_len, "%s", st == HPD_ERR_TIMEOUT ? "no answer to register in time"
                                     : st == HPD_ERR_IO ? "no connection (refused, unreachable "
                                                          "or closed)"
                                                        : hpd_status_str(st));
        return st;
    }
    hpd_msg_registered_t reg = {.heartbeat_ms = 500};
    if (!hpd_msg_unpack(&hpd_msg_registered, reply->result, &reg, &err)) {
        snprintf(why, why_len, "a bad registration reply: %.160s", err.text);
        return HPD_ERR_FORMAT;
    }
    n->node_id = reg.node_id;
    n->heartbeat_ms = reg.heartbeat_ms ? reg.heartbeat_ms : 500;
    n->lease_ms = reg.lease_ms > n->heartbeat_ms ? reg.lease_ms : 10 * n->heartbeat_ms;
    n->registered = true;
    n->registrations++;
    hpd_xfer_set_node_id(n->xfer, n->node_id);
    /* a coordinator that asks for liveness pings gets them from the
     * pinger thread (its connection is made on the first) */
    if (n->liveness != NULL && n->liveness_at != n->o.coordinator_at) {
        /* registered with another coordinator (the standby that leads now):
         * the pings go there */
        hpd_liveness_stop(n->liveness);
        n->liveness = NULL;
    }
    if (reg.alive_ms > 0 && n->liveness == NULL) {
        n->liveness_at = n->o.coordinator_at;
        hpd_liveness_params_t lp = {.host = n->o.coordinator_host,
                                    .port = n->o.coordinator_port,
                                    .token = n->token,
                                    .name = n->o.name};
        if (hpd_liveness_start(&lp, &n->liveness) != HPD_OK)
            HPD_LOG_WARN(LOG_COMPONENT, "%s: cannot start the liveness thread; the "
                         "coordinator detects a stopped node by its lease only", n->o.name);
    }
    hpd_liveness_set(n->liveness, reg.alive_ms > 0 ? reg.node_id : 0, reg.alive_key,
                     reg.alive_ms, reg.alive_lease_ms ? reg.alive_lease_ms : 5 * reg.alive_ms);
    const struct timeval tv = {n->heartbeat_ms / 1000, (n->heartbeat_ms % 1000) * 1000};
    event_add(n->hb_ev, &tv);
    return HPD_OK;
}

static hpd_rpc_client_params_t coordinator_params(hpd_node_t *n)
{
    return (hpd_rpc_client_params_t){.base = n->base,
                                     .host = n->o.coordinator_host,
                                     .port = n->o.coordinator_port,
                                     .token = n->token,
                                     .timeout_ms = 5000,
                                     .on_notify = on_coord_notify,
                                     .on_close = on_coord_close,
                                     .arg = n};
}

/* A try that failed: said at the first tries and then now and then (a
 * coordinator down for hours must not fill the log), and on /healthz. */
static void register_failed(hpd_node_t *n, const char *why)
{
    const uint32_t t = n->reg_attempts;
    snprintf(n->reg_error, sizeof(n->reg_error), "%s", why);
    if (t <= 3 || (t & (t - 1)) == 0 || t % 30 == 0)
        HPD_LOG_WARN(LOG_COMPONENT, "%s: cannot register with the coordinator at %s:%u: %s; "
                     "trying again (try %u, %.1f s since %s)", n->o.name, n->o.coordinator_host,
                     n->o.coordinator_port, why, t, hpd_time_now() - n->lost_at,
                     n->registrations == 0 ? "the start" : "the loss");
    next_coordinator(&n->o); /* the next try goes to the next one given */
}

static void on_register_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_node_t *n = arg;
    char why[200];
    n->registering = false;
    if (st == HPD_ERR_CANCELED) /* the node is stopping */
        return;
    const bool first = n->registrations == 0;
    /* (a coordinator that no longer leads refuses no node: the next one
     * given may lead) */
    const bool refused = (st == HPD_OK && reply->is_error &&
                          reply->error_code != HPD_RPC_ERR_NOT_LEADER) ||
                         (n->coord != NULL && hpd_rpc_client_refused(n->coord));
    if (!refused && registration_done(n, st, reply, why, sizeof(why)) == HPD_OK) {
        if (first)
            HPD_LOG_INFO(LOG_COMPONENT, "%s: %s node %llu serving on %s:%u (kv layout %u,%u,%s; "
                         "ucx %s)%s", n->o.name, n->role->name, (unsigned long long)n->node_id,
                         n->o.host, hpd_rpc_server_port(n->server),
                         hpd_engine_params(n->engine)->kv_layout.block_size,
                         hpd_engine_params(n->engine)->kv_layout.pack_size,
                         hpd_engine_params(n->engine)->kv_layout.order == HPD_KV_HND ? "hnd"
                                                                                    : "nhd",
                         hpd_xfer_tls(n->xfer), n->reg_attempts > 1 ? " after retries" : "");
        else
            HPD_LOG_WARN(LOG_COMPONENT, "%s: registered again as node %llu, %.1f s after the "
                         "loss (try %u)", n->o.name, (unsigned long long)n->node_id,
                         hpd_time_now() - n->lost_at, n->reg_attempts);
        return;
    }
    if (refused) {
        if (st == HPD_OK && reply->is_error)
            registration_done(n, st, reply, why, sizeof(why));
        else
            snprintf(why, sizeof(why), "it refused the node secret (--token-file)");
        /* a node the coordinator will not take (wrong secret, another
         * model, other numerics) does not become one by trying again */
        if (first) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: the coordinator at %s:%u refused this node: %s",
                          n->o.name, n->o.coordinator_host, n->o.coordinator_port, why);
            n->exit_code = 1;
            event_base_loopbreak(n->base);
            return;
        }
    }
    register_failed(n, why);
    schedule_register(n);
}

/* Registers, from the loop: at the start, and after the loss of the
 * coordinator. One try at a time, at once, then 100 ms after a failure,
 * doubling to 2 s between tries, for ever unless --connect-timeout-ms
 * bounds the first registration (then the node exits 3). */
static void on_register(evutil_socket_t fd, short what, void *arg)
{
    hpd_node_t *n = arg;
    const hpd_rpc_client_params_t cp = coordinator_params(n);
    hpd_rpc_buf_t b;

    if (n->registered || n->registering || n->shutdown)
        return;
    if (n->draining) /* the drain check stops the node: nothing is in flight */
        return;
    if (n->registrations == 0 && n->o.connect_timeout_ms > 0 &&
        hpd_time_now() - n->lost_at > n->o.connect_timeout_ms / 1000.0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: giving up: no registration with the coordinator at "
                      "%s:%u in %u ms (--connect-timeout-ms; 0 keeps trying); the last try: %s",
                      n->o.name, n->o.coordinator_host, n->o.coordinator_port,
                      n->o.connect_timeout_ms, n->reg_error[0] ? n->reg_error : "none");
        n->exit_code = 3;
        event_base_loopbreak(n->base);
        return;
    }
    hpd_rpc_client_destroy(n->coord);
    n->coord = NULL;
    n->reg_attempts++;
    if (hpd_rpc_client_connect(&cp, &n->coord) != HPD_OK) {
        register_failed(n, "no connection (cannot open a socket)");
        schedule_register(n);
        return;
    }
    if (pack_registration(n, &b) != HPD_OK) {
        register_failed(n, "cannot pack the registration");
        schedule_register(n);
        return;
    }
    /* a refused token closes the connection and fails this call */
    if (hpd_rpc_call(n->coord, "register", &b, REGISTER_TIMEOUT_MS, on_register_reply, n) ==
        HPD_OK)
        n->registering = true;
    else
        schedule_register(n);
    hpd_rpc_buf_destroy(&b);
}

static void schedule_register(hpd_node_t *n)
{
    /* with standbys given, one of them leads within a lease of the loss:
     * tried often (a refused connection is cheap), so that service comes
     * back as soon as it leads */
    const uint32_t most = n->o.n_coordinators > 1 ? REGISTER_STANDBY_MS : 2000u;
    const uint32_t shift = HPD_MIN(n->reg_attempts > 0 ? n->reg_attempts - 1 : 0, 5u);
    const uint32_t ms = HPD_MIN(100u << shift, most);
    const struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(n->reg_ev, &tv);
}

/* ------------------------------------------------------------ life cycle */

static bool on_check_dests(void *arg, const hpd_xfer_notice_t *notice,
                           const hpd_xfer_dest_t *dests, uint32_t n_dests)
{
    hpd_node_t *n = arg;
    if (n->role_data == NULL)
        return false; /* the role did not start: nothing is used */
    return n->role->check_dests == NULL || n->role->check_dests(n, notice, dests, n_dests);
}

static void on_notice(void *arg, const hpd_xfer_notice_t *notice)
{
    hpd_node_t *n = arg;
    if (n->role_data != NULL && n->role->on_notice != NULL)
        n->role->on_notice(n, notice);
}

static void on_peer_error(void *arg, hpd_xfer_peer_t *peer, hpd_status_t status)
{
    hpd_node_t *n = arg;
    if (n->role_data != NULL && n->role->on_peer_error != NULL)
        n->role->on_peer_error(n, peer, status);
}

/* The service shell's first signal: heartbeats say the node drains and the
 * coordinator sends no new work; the shell stops the node once in_flight
 * is 0. A node not registered stops at once. */
static bool drain(void *arg)
{
    hpd_node_t *n = arg;
    if (!n->registered)
        return false;
    n->draining = true;
    on_heartbeat(-1, 0, n); /* tell the coordinator now */
    return true;
}

static uint32_t in_flight(void *arg)
{
    hpd_node_t *n = arg;
    return n->role->in_flight != NULL ? n->role->in_flight(n) : 0;
}

/* ------------------------------------------------------------ metrics */

bool hpd_node_grammar(hpd_node_t *n, const char *spec, uint32_t len, const char *what,
                      hpd_grammar_t **g_p, hpd_proto_err_t *err)
{
    char why[200];
    if (n->vocab == NULL) {
        snprintf(err->text, sizeof(err->text), "%s: grammar: this node's model has no "
                 "tokenizer.json: structured outputs are refused", what);
        return false;
    }
    if (hpd_grammar_from_spec(spec, len, g_p, why, sizeof(why)) != HPD_OK) {
        snprintf(err->text, sizeof(err->text), "%s: %s", what, why);
        return false;
    }
    return true;
}

/* The model's tokenizer.json as the vocabulary of structured outputs; a
 * model without one serves everything else. */
static void load_vocab(hpd_node_t *n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer.json", n->o.model_dir);
    if (access(path, R_OK) != 0) {
        HPD_LOG_INFO(LOG_COMPONENT, "%s: no tokenizer.json in %s: structured outputs are refused",
                     n->o.name, n->o.model_dir);
        return;
    }
    if (hpd_tokenizer_load(path, &n->tokenizer) != HPD_OK ||
        hpd_vocab_from_tokenizer(n->tokenizer, &n->vocab) != HPD_OK) {
        HPD_LOG_WARN(LOG_COMPONENT, "%s: %s cannot be read: structured outputs are refused",
                     n->o.name, path);
        hpd_tokenizer_destroy(n->tokenizer);
        n->tokenizer = NULL;
    }
}

static hpd_status_t metrics_init(hpd_node_t *n)
{
    hpd_node_metrics_t *m = &n->m;
    hpd_metrics_t *r;
    hpd_status_t st = hpd_metrics_create(&n->metrics);
    static const char hits[] = "Prompt tokens served from the prefix cache, by tier.";
    static const char xfers[] = "KV/state transfers sent, by outcome.";
    static const char notices[] = "Transfer completion notices received, by checksum outcome.";
    if (st != HPD_OK)
        return st;
    r = n->metrics;
    m->registered = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_registered",
                                    "1 while registered with the coordinator.", NULL);
    m->draining = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_draining",
                                  "1 while finishing its work to stop.", NULL);
    m->pages_used = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_kv_pages_used",
                                    "KV pages in use (requests and the prefix cache).", NULL);
    m->pages_total = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_kv_pages_total",
                                     "KV pages in the pool.", NULL);
    m->slots_used = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_slots_used",
                                    "GDN state slots in use.", NULL);
    m->slots_total = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_slots_total",
                                     "GDN state slots in the pool.", NULL);
    m->steps = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_engine_steps_total",
                               "Engine steps (one batch each).", NULL);
    m->prefill_tokens = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_engine_prefill_tokens_total",
                                        "Prompt tokens computed (not served from cache).", NULL);
    m->decode_tokens = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_engine_decode_tokens_total",
                                       "Tokens produced by decode steps.", NULL);
    m->lookup_tokens = hpd_metrics_add(r, HPD_METRIC_COUNTER,
                                       "hpd_prefix_cache_lookup_tokens_total",
                                       "Prompt tokens looked up in the prefix cache.", NULL);
    m->hit_device = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_prefix_cache_hit_tokens_total",
                                    hits, "tier=\"device\"");
    m->hit_host = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_prefix_cache_hit_tokens_total",
                                  hits, "tier=\"host\"");
    m->cache_pages = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_prefix_cache_pages",
                                     "KV pages held by the prefix cache.", NULL);
    m->xfer_bytes = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_xfer_bytes_total",
                                    "Bytes put to peers (KV pages and GDN state).", NULL);
    m->xfer_bytes_mapped =
        hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_xfer_bytes_mapped_total",
                        "Of the bytes put, those copied into a peer's memory mapped here.", NULL);
    m->xfer_ok = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_xfer_transfers_total", xfers,
                                 "outcome=\"ok\"");
    m->xfer_failed = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_xfer_transfers_total", xfers,
                                     "outcome=\"failed\"");
    m->notices_ok = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_xfer_notices_total", notices,
                                    "outcome=\"ok\"");
    m->notices_bad = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_xfer_notices_total", notices,
                                     "outcome=\"bad_checksum\"");
    m->xfer_open = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_xfer_open_transfers",
                                   "Transfers started and not yet finished.", NULL);
    return HPD_OK;
}

static void metrics_collect(void *arg)
{
    hpd_node_t *n = arg;
    hpd_node_metrics_t *m = &n->m;
    uint32_t pu, pt, su, stot;
    hpd_engine_stats_t es;
    hpd_prefix_cache_stats_t cs;
    hpd_xfer_stats_t xs;

    hpd_engine_usage(n->engine, &pu, &pt, &su, &stot);
    hpd_engine_stats(n->engine, &es);
    hpd_xfer_stats(n->xfer, &xs);
    hpd_metric_set(m->registered, n->registered);
    hpd_metric_set(m->draining, n->draining);
    hpd_metric_set(m->pages_used, pu);
    hpd_metric_set(m->pages_total, pt);
    hpd_metric_set(m->slots_used, su);
    hpd_metric_set(m->slots_total, stot);
    hpd_metric_set(m->steps, (double)es.steps);
    hpd_metric_set(m->prefill_tokens, (double)es.prefill_tokens);
    hpd_metric_set(m->decode_tokens, (double)es.decode_tokens);
    if (hpd_engine_cache_stats(n->engine, &cs) == HPD_OK) {
        hpd_metric_set(m->lookup_tokens, (double)cs.lookup_tokens);
        hpd_metric_set(m->hit_device, (double)cs.hit_tokens_device);
        hpd_metric_set(m->hit_host, (double)cs.hit_tokens_host);
        hpd_metric_set(m->cache_pages, (double)cs.pages_held);
    }
    hpd_metric_set(m->xfer_bytes, (double)xs.bytes_put);
    hpd_metric_set(m->xfer_bytes_mapped, (double)xs.bytes_mapped);
    hpd_metric_set(m->xfer_ok, (double)(xs.transfers_finished - xs.transfers_failed));
    hpd_metric_set(m->xfer_failed, (double)xs.transfers_failed);
    hpd_metric_set(m->notices_ok, (double)xs.notices_ok);
    hpd_metric_set(m->notices_bad, (double)xs.notices_bad);
    hpd_metric_set(m->xfer_open, (double)xs.open_transfers);
    if (n->role->collect != NULL)
        n->role->collect(n);
}

/* Ready when registered and not draining. */
static bool health(void *arg, char *msg, size_t len)
{
    hpd_node_t *n = arg;
    const uint32_t jobs = n->role->in_flight != NULL ? n->role->in_flight(n) : 0;
    if (!n->registered && n->registrations > 0) {
        snprintf(msg, len, "registering: %s node %s lost the coordinator %.1f s ago (%u tries%s%s)",
                 n->role->name, n->o.name, hpd_time_now() - n->lost_at, n->reg_attempts,
                 n->reg_error[0] ? "; the last: " : "", n->reg_error);
        return false;
    }
    if (!n->registered && n->reg_error[0] != '\0') {
        snprintf(msg, len, "registering: %s node %s cannot reach the coordinator at %s:%u for "
                 "%.1f s (%u tries; the last: %s)", n->role->name, n->o.name,
                 n->o.coordinator_host, n->o.coordinator_port, hpd_time_now() - n->lost_at,
                 n->reg_attempts, n->reg_error);
        return false;
    }
    const char *state = !n->registered ? "registering" : n->draining ? "draining" : "ok";
    snprintf(msg, len, "%s: %s node %s, id %llu, %u jobs in flight", state, n->role->name,
             n->o.name, (unsigned long long)n->node_id, jobs);
    return n->registered && !n->draining;
}

static void node_destroy(hpd_node_t *n)
{
    hpd_liveness_stop(n->liveness);
    if (n->role->fini != NULL)
        n->role->fini(n);
    if (n->step_ev)
        event_free(n->step_ev);
    if (n->hb_ev)
        event_free(n->hb_ev);
    if (n->reg_ev)
        event_free(n->reg_ev);
    hpd_service_destroy(n->service);
    hpd_metrics_destroy(n->metrics);
    hpd_rpc_client_destroy(n->coord);
    hpd_rpc_server_destroy(n->server);
    hpd_engine_destroy(n->engine);
    hpd_vocab_destroy(n->vocab);
    hpd_tokenizer_destroy(n->tokenizer);
    hpd_xfer_destroy(n->xfer);
    for (uint32_t r = 0; r < HPD_TP_MAX; r++) {
        hpd_backend_destroy(n->backends[r]);
        hpd_model_destroy(n->models[r]);
    }
    free(n->role_data); /* the role's state, emptied by its fini */
    n->role_data = NULL;
    free(n->token);
    if (n->base)
        event_base_free(n->base);
}

/* The engine's pools, mapped as UCX regions (the role's init finds them
 * registered already). */
static hpd_status_t pool_alloc(void *arg, size_t bytes, void **memory_p)
{
    hpd_node_t *n = arg;
    uint32_t region;
    return hpd_xfer_alloc(n->xfer, bytes, memory_p, &region);
}

int hpd_node_main(int argc, char **argv, const hpd_node_role_t *role)
{
    hpd_node_t *n = calloc(1, sizeof(*n)); /* reached from callbacks as their arg */
    char name[96];
    hpd_status_t st;
    hpd_rpc_method_t methods[32];
    size_t n_methods = 0;

    if (n == NULL)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    n->role = role;
    n->exit_code = 1;
    n->started = hpd_time_now();
    const int prc = parse_opts(argc, argv, role->name, &n->o);
    if (prc != 0) {
        free(n);
        return prc > 0 ? 0 : 2;
    }
    if (n->o.name == NULL) {
        snprintf(name, sizeof(name), "%s-%d", role->name, (int)getpid());
        n->o.name = name;
    }
    if (n->o.token_file != NULL && hpd_rpc_read_token(n->o.token_file, &n->token) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: cannot read the token file %s", n->o.name,
                      n->o.token_file);
        n->exit_code = 2;
        goto out;
    }
    n->o.tp = HPD_MAX(n->o.tp, 1u);
    /* each rank its shard (a degree the model cannot run at is refused,
     * naming the layer and the numbers) */
    if ((st = hpd_model_load_tp(n->o.model_dir, n->o.tp, n->o.tp_fast, n->models)) != HPD_OK) {
        n->exit_code = st == HPD_ERR_IO || st == HPD_ERR_INVALID_ARG ? 2 : 1;
        goto out;
    }
    n->model = n->models[0];
    hpd_backend_params_t bp = {.device = n->o.device, .n_threads = n->o.threads};
    if ((st = hpd_backend_create_ranks(&bp, n->o.tp, n->backends)) != HPD_OK) {
        n->exit_code = 2;
        goto out;
    }
    n->backend = n->backends[0];
    if ((n->base = event_base_new()) == NULL)
        goto out;
    hpd_xfer_params_t xp = {.base = n->base,
                            .node_id = (uint64_t)getpid(), /* the registered id, below */
                            .tls = n->o.ucx_tls,
                            .net_devices = n->o.ucx_dev,
                            .on_notice = on_notice,
                            .check_dests = on_check_dests,
                            .on_peer_error = on_peer_error,
                            .arg = n,
                            .deadline_ms = n->o.xfer_deadline_ms};
    if ((st = hpd_xfer_create(&xp, &n->xfer)) != HPD_OK)
        goto out;
    load_vocab(n);
    n->o.engine.vocab = n->vocab;
    n->o.engine.model = n->model;
    n->o.engine.backend = n->backend;
    n->o.engine.tp_models = (const hpd_model_t *const *)n->models;
    n->o.engine.tp_backends = n->backends;
    if (role->peers_write_pools) {
        n->o.engine.pool_alloc = pool_alloc;
        n->o.engine.pool_alloc_arg = n;
    }
    /* what the host cannot hold is refused here, with the sizes, rather
     * than allocated and found out later */
    hpd_engine_plan_t plan;
    char why[300];
    if (hpd_engine_plan(&n->o.engine, &n->model->config, &plan, why, sizeof(why)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: %s", n->o.name, why);
        n->exit_code = 2;
        goto out;
    }
    const uint64_t avail = hpd_mem_available();
    if (hpd_backend_host_memory(n->backend) && avail > 0 && plan.device_bytes > avail) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: the pools need %.2f GiB (%u KV pages for max context "
                      "%u, %u state slots, %u checkpoints) and this host has %.2f GiB "
                      "available: lower --max-context, --max-batch or --kv-pages",
                      n->o.name, plan.device_bytes / 1073741824.0, plan.n_pages,
                      plan.max_context, plan.n_slots, plan.n_checkpoints, avail / 1073741824.0);
        n->exit_code = 2;
        goto out;
    }
    if ((st = hpd_engine_create(&n->o.engine, &n->engine)) != HPD_OK) {
        /* bad parameters, or ranks on a device they cannot run on yet */
        n->exit_code = st == HPD_ERR_INVALID_ARG || st == HPD_ERR_UNSUPPORTED ? 2 : 1;
        goto out;
    }
    if (metrics_init(n) != HPD_OK)
        goto out;
    if (role->init != NULL && (st = role->init(n)) != HPD_OK)
        goto out;
    methods[n_methods++] = (hpd_rpc_method_t){.name = "stats", .fn = m_stats};
    for (size_t i = 0; i < role->n_methods && n_methods < 32; i++)
        methods[n_methods++] = role->methods[i];
    hpd_rpc_server_params_t sp = {.base = n->base, .host = n->o.host, .port = n->o.port,
                                  .token = n->token, .methods = methods,
                                  .n_methods = n_methods, .arg = n};
    if ((st = hpd_rpc_server_create(&sp, &n->server)) != HPD_OK)
        goto out;
    n->step_ev = evtimer_new(n->base, on_step, n);
    n->hb_ev = event_new(n->base, -1, EV_PERSIST, on_heartbeat, n);
    n->reg_ev = evtimer_new(n->base, on_register, n);
    if (!n->step_ev || !n->hb_ev || !n->reg_ev)
        goto out;
    /* before registering: probes see "registering" */
    const hpd_service_params_t svp = {.base = n->base,
                                      .name = n->o.name,
                                      .host = n->o.host,
                                      .metrics_port = n->o.metrics_port,
                                      .metrics = n->metrics,
                                      .drain_timeout_ms = n->o.drain_timeout_ms,
                                      .arg = n,
                                      .collect = metrics_collect,
                                      .health = health,
                                      .drain = drain,
                                      .in_flight = in_flight};
    if ((st = hpd_service_create(&svp, &n->service)) != HPD_OK) {
        n->exit_code = st == HPD_ERR_IO ? 2 : 1;
        goto out;
    }
    if (n->o.metrics_port >= 0) /* the port chosen for --metrics-port 0 too */
        HPD_LOG_INFO(LOG_COMPONENT, "%s: metrics and health on http port %u", n->o.name,
                     hpd_service_http_port(n->service));
    /* registers from the loop (the coordinator may still be starting, or
     * be down: the node keeps trying, serving /healthz and signals) */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    const int64_t ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000 - 1577836800000;
    n->incarnation0 = ms > 0 ? (uint64_t)ms << 20 : 0;
    n->lost_at = hpd_time_now();
    n->exit_code = 0;
    on_register(-1, 0, n);
    event_base_dispatch(n->base);
out:
    const int rc = n->exit_code;
    node_destroy(n);
    free(n);
    return rc;
}
