/* The node registry (coordinator/coord_internal.h): registration, leases,
 * liveness pings, heartbeats with the nodes' cache summaries and stats,
 * the breaker's rotation, and what the routing policy sees of the nodes
 * (docs/cluster.md). A node's loss or suspicion is handed to the core,
 * which moves its requests. */
#include "coordinator/coord_internal.h"
#include "coordinator/door.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/assert.h"
#include "common/log.h"
#include "common/util.h"
#include "node/msg.h"
#include "transport/xfer_info.h"

static void on_node_close(void *arg, hpd_status_t why);
static hpd_status_t view_room(hpd_coord_t *c, size_t n);
static void view_add(hpd_coord_t *c, node_t *x);
static void view_remove(hpd_coord_t *c, node_t *x);
static void judge_liveness(hpd_coord_t *c, node_t *n, double now);

/* ------------------------------------------------------------ a node registers */

void hpd_reg_register(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg)
{
    hpd_coord_t *c = arg;
    hpd_proto_err_t err = {{0}};
    hpd_msg_register_t m = {0};
    node_t *n = calloc(1, sizeof(*n));

    if (n == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "out of memory");
        return;
    }
    if (!hpd_msg_unpack(&hpd_msg_register, params, &m, &err))
        goto bad;
    if (c->o.leading != NULL && !c->o.leading(c->o.leading_arg)) {
        /* not a refusal of the node: it tries the next coordinator */
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_NOT_LEADER,
                            "register: this coordinator no longer leads");
        hpd_msg_free(&hpd_msg_register, &m);
        free(n);
        return;
    }
    /* an attempt the node gave up on (queued behind a flood: it closed the
     * connection and tries again on another) is not served: each would
     * replace the one before, the last a dead one */
    if (hpd_rpc_conn_peer_gone(conn)) {
        c->stale_registrations++;
        HPD_LOG_WARN(LOG_COMPONENT, "register: node %.32s gave up this attempt (its connection "
                     "closed): not served", m.name);
        snprintf(err.text, sizeof(err.text), "register: the attempt was given up");
        goto bad;
    }
    /* an attempt the node made before the one registered (a late one) is
     * refused, not served: it would replace the node's live registration */
    for (const node_t *o = c->nodes; o != NULL; o = o->next) {
        if (o->alive && strcmp(o->name, m.name) == 0 && strcmp(o->host, m.host) == 0 &&
            o->port == m.port && m.incarnation != 0 && o->incarnation >= m.incarnation) {
            c->stale_registrations++;
            snprintf(err.text, sizeof(err.text),
                     "register: a stale attempt of node %.32s (incarnation %llu; %llu is "
                     "registered)", m.name, (unsigned long long)m.incarnation,
                     (unsigned long long)o->incarnation);
            HPD_LOG_WARN(LOG_COMPONENT, "%s", err.text);
            goto bad;
        }
    }
    n->incarnation = m.incarnation;
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
    if (c->have_fingerprint && memcmp(c->fingerprint, fp, 16) != 0) {
        snprintf(err.text, sizeof(err.text),
                 "register: node %s serves a different model than the cluster (fingerprint "
                 "differs)",
                 n->name);
        goto bad;
    }
    /* nodes that multiply differently give different tokens for the same
     * request (and a prefill node's pages would not be what the decode node
     * computes): one arithmetic per cluster, that of the nodes alive now
     * (none alive: the newcomer's); a node that names none is fp32 */
    snprintf(n->numerics, sizeof(n->numerics), "%s", m.numerics[0] ? m.numerics : "fp32");
    const node_t *ref = NULL;
    for (const node_t *o = c->nodes; o != NULL && ref == NULL; o = o->next)
        if (o->alive && !(strcmp(o->name, n->name) == 0 && strcmp(o->host, n->host) == 0 &&
                          o->port == port)) /* not its own old registration */
            ref = o;
    if (ref != NULL && strcmp(ref->numerics, n->numerics) != 0) {
        snprintf(err.text, sizeof(err.text),
                 "register: node %.32s computes with %s where the cluster uses %s "
                 "(cpu/cuda: fp32, cpu-bf16: bf16-products, cuda-bf16: bf16-tensor-cores, "
                 "cuda-fast: cublas)",
                 n->name, n->numerics, ref->numerics);
        goto bad;
    }
    /* the shard maps: each the one its degree gives, and of the same heads
     * as the cluster's (the nodes map ranks to ranks from them) */
    n->tp = m.tp > 0 ? m.tp : 1;
    if (m.shard_map_n > 0) {
        hpd_proto_err_t merr;
        if (!hpd_proto_shard_map(m.shard_map, m.shard_map_n, n->tp, n->heads, &merr)) {
            snprintf(err.text, sizeof(err.text), "register: node %.32s's %.200s", n->name,
                     merr.text);
            goto bad;
        }
        n->has_map = true;
        const node_t *mref = NULL;
        for (const node_t *o = c->nodes; o != NULL && mref == NULL; o = o->next)
            if (o->alive && o->has_map && !(strcmp(o->name, n->name) == 0 &&
                                            strcmp(o->host, n->host) == 0 && o->port == port))
                mref = o;
        if (mref != NULL && memcmp(mref->heads, n->heads, sizeof(n->heads)) != 0) {
            snprintf(err.text, sizeof(err.text),
                     "register: node %.32s's shard map (tp %u) covers %u KV heads, %u GDN key "
                     "heads and %u value heads where node %.32s's (tp %u) covers %u, %u and "
                     "%u: their ranks cannot be paired", n->name, n->tp, n->heads[0],
                     n->heads[1], n->heads[2], mref->name, mref->tp, mref->heads[0],
                     mref->heads[1], mref->heads[2]);
            goto bad;
        }
    }
    if (!c->have_fingerprint) {
        memcpy(c->fingerprint, fp, 16);
        hpd_prefix_hash_root(c->fingerprint, &c->root);
        c->have_fingerprint = true;
    }
    hpd_rpc_buf_t ib;
    hpd_rpc_buf_init(&ib);
    msgpack_pack_object(&ib.pk, *info);
    n->xfer_info_len = ib.sb.size;
    n->xfer_info = msgpack_sbuffer_release(&ib.sb);
    hpd_rpc_client_params_t cp = {.base = c->base,
                                  .host = n->host,
                                  .port = (uint16_t)port,
                                  .token = c->token,
                                  .timeout_ms = 30000,
                                  .on_notify = hpd_core_on_node_notify,
                                  .on_close = on_node_close};
    if (hpd_u64map_reserve(&c->node_ids, c->node_ids.n + 1) != HPD_OK ||
        view_room(c, c->view_n + 1) != HPD_OK) {
        snprintf(err.text, sizeof(err.text), "register: out of memory");
        free(n->xfer_info);
        goto bad;
    }
    n->id = ++c->next_node;
    n->port = (uint16_t)port;
    n->coord = c;
    cp.arg = n;
    if (hpd_rpc_client_connect(&cp, &n->client) != HPD_OK) {
        snprintf(err.text, sizeof(err.text), "register: cannot connect back to %s:%u", n->host,
                 port);
        free(n->xfer_info);
        goto bad;
    }
    /* a node registering again (it lost this coordinator, or restarted)
     * replaces its old registration: what that held is re-routed */
    for (node_t *o = c->nodes, *next; o != NULL; o = next) {
        next = o->next;
        if (o->alive && strcmp(o->name, n->name) == 0 && strcmp(o->host, n->host) == 0 &&
            o->port == n->port)
            hpd_reg_node_lost(c, o, "it registered again");
    }
    n->alive = true;
    n->reg_conn = conn;
    hpd_rpc_conn_ref(conn);
    hpd_rpc_conn_set_user(conn, (void *)(uintptr_t)n->id);
    n->lease_until = hpd_time_now() + c->o.lease_ms / 1000.0;
    n->next = c->nodes;
    c->nodes = n;
    (void)hpd_u64map_put(&c->node_ids, n->id, n); /* room was made above */
    view_add(c, n);
    HPD_LOG_INFO(LOG_COMPONENT, "%s node %s (%llu) registered from %s:%u, tp %u, kv layout "
                 "%u,%u,%s, %u pages, %u slots", role, n->name, (unsigned long long)n->id,
                 n->host, port, n->tp,
                 n->layout.block_size, n->layout.pack_size,
                 n->layout.order == HPD_KV_HND ? "hnd" : "nhd", n->pages, n->slots);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    const bool liveness = c->o.liveness_ms > 0 && getrandom(&n->alive_key, sizeof(n->alive_key),
                                                            0) == sizeof(n->alive_key);
    /* judged from now: a node that hangs before its first ping is too */
    if (liveness)
        hpd_alive_start(&n->liveness, hpd_time_now(), HPD_MAX(c->o.liveness_ms / 5, 10u) / 1e3);
    const hpd_msg_registered_t reg = {
        .node_id = n->id,
        .heartbeat_ms = c->o.heartbeat_ms,
        .lease_ms = c->o.lease_ms,
        /* five pings per liveness lease */
        .alive_ms = liveness ? HPD_MAX(c->o.liveness_ms / 5, 10u) : 0,
        .alive_key = liveness ? n->alive_key : 0,
        /* the node fences itself this long after its last answered ping:
         * never later than this coordinator can declare it lost */
        .alive_lease_ms = liveness ? HPD_ALIVE_LOST_WINDOWS * c->o.liveness_ms : 0};
    hpd_msg_pack(&hpd_msg_registered, &reg, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
    hpd_msg_free(&hpd_msg_register, &m);
    hpd_core_schedule_soon(c);
    return;
bad:
    hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
    hpd_msg_free(&hpd_msg_register, &m);
    free(n);
}

static void on_node_close(void *arg, hpd_status_t why)
{
    node_t *n = arg;
    hpd_reg_node_lost(n->coord, n, "its RPC connection closed");
}

/* ------------------------------------------------------------ it stays: heartbeats, liveness pings, leases */

void hpd_reg_heartbeat(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                        void *arg)
{
    hpd_coord_t *c = arg;
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
    if ((n = hpd_reg_node_by_id(c, node_id)) == NULL || !n->alive) {
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
    n->lease_until = hpd_time_now() + c->o.lease_ms / 1000.0;
    const bool draining = m.draining;
    if (draining != n->draining) {
        n->draining = draining;
        hpd_reg_view_sync(n);
        HPD_LOG_INFO(LOG_COMPONENT, "%s node %s %s", n->role == ROLE_PREFILL ? "prefill" : "decode",
                     n->name, draining ? "is draining: no new work goes there" : "serves again");
        if (!draining)
            hpd_core_schedule_soon(c);
    }
    if (m.prefix_summary_len == SUMMARY_BYTES) {
        memcpy(n->summary, m.prefix_summary, SUMMARY_BYTES);
        if (!n->have_summary) {
            n->have_summary = true;
            hpd_reg_view_sync(n);
        }
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

/* A liveness ping, from the node's pinger thread on a connection of its
 * own: the key from the registration proves it is that node's. */
void hpd_reg_alive(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_coord_t *c = arg;
    hpd_proto_err_t err = {{0}};
    hpd_msg_alive_t m = {0};
    node_t *n;

    if (!hpd_msg_unpack(&hpd_msg_alive, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        return;
    }
    if ((n = hpd_reg_node_by_id(c, m.node_id)) == NULL || !n->alive || n->alive_key == 0 ||
        n->alive_key != m.key) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP,
                            "alive: node %llu is not registered with that key",
                            (unsigned long long)m.node_id);
        return;
    }
    hpd_alive_link(&n->liveness, hpd_rpc_conn_rto(conn));
    hpd_alive_ping(&n->liveness, hpd_time_now());
    if (n->suspect) {
        n->suspect = false;
        hpd_reg_view_sync(n);
        HPD_LOG_INFO(LOG_COMPONENT, "%s node %s pings again: it takes work again",
                     hpd_reg_role_name(n), n->name);
        hpd_core_schedule_soon(c);
    }
    hpd_rpc_reply(conn, id, NULL);
}

/* Leases and liveness, each tick. */
void hpd_reg_tick(hpd_coord_t *c, double now)
{
    for (node_t *n = c->nodes, *next; n != NULL; n = next) {
        next = n->next;
        if (n->lease_until < now) {
            hpd_reg_node_lost(c, n, "lease expired (no heartbeat)");
        } else if (c->o.liveness_ms > 0 && n->alive_key != 0) {
            judge_liveness(c, n, now);
        }
    }
}

/* A node's pings (coordinator/alive.h): silent for its suspect window, it
 * gets no new work and what it holds runs again elsewhere (its attempts
 * there are canceled; it may resume); silent for its lost window (longer,
 * and wider for a node whose pings come irregularly), it is lost. */
static void judge_liveness(hpd_coord_t *c, node_t *n, double now)
{
    const double window = c->o.liveness_ms / 1000.0, cap = c->o.lease_ms / 1000.0;
    const hpd_alive_verdict_t v = hpd_alive_judge(&n->liveness, now, window, cap);
    if (v == HPD_ALIVE_LOST) {
        char why[160];
        snprintf(why, sizeof(why), "no liveness ping for %.0f ms (its window %.0f ms, from "
                 "its pings' intervals): the process is stopped or hung",
                 (now - n->liveness.last) * 1e3,
                 hpd_alive_lost_after(&n->liveness, window, cap) * 1e3);
        hpd_reg_node_lost(c, n, why);
        return;
    }
    if (v != HPD_ALIVE_SUSPECT || n->suspect)
        return;
    n->suspect = true;
    hpd_reg_view_sync(n);
    hpd_metric_inc(c->m.suspects, 1);
    uint32_t hedged = 0, moved = 0;
    hpd_core_node_suspect(c, n, now, &hedged, &moved);
    HPD_LOG_WARN(LOG_COMPONENT, "%s node %s suspect: no liveness ping for %.0f ms (its window "
                 "%.0f ms); no new work goes there, %u of its requests raced elsewhere "
                 "(hedged), %u run again; lost after %.0f ms", hpd_reg_role_name(n), n->name,
                 (now - n->liveness.last) * 1e3,
                 hpd_alive_suspect_after(&n->liveness, window, cap) * 1e3, hedged, moved,
                 hpd_alive_lost_after(&n->liveness, window, cap) * 1e3);
    hpd_core_schedule_soon(c);
}

/* ------------------------------------------------------------ it goes */

void hpd_reg_node_lost(hpd_coord_t *c, node_t *n, const char *why)
{
    static const struct timeval now = {0, 0};
    if (!n->alive)
        return;
    HPD_LOG_WARN(LOG_COMPONENT, "%s node %s (%llu) lost: %s", hpd_reg_role_name(n), n->name,
                 (unsigned long long)n->id, why);
    n->alive = false;
    hpd_metric_inc(c->m.node_losses, 1);
    hpd_core_node_gone(c, n);
    for (node_t **pp = &c->nodes; *pp != NULL; pp = &(*pp)->next)
        if (*pp == n) {
            *pp = n->next;
            break;
        }
    hpd_u64map_del(&c->node_ids, n->id);
    view_remove(c, n);
    if (n->reg_conn != NULL)
        hpd_rpc_conn_close(n->reg_conn, false);
    n->next = c->dead;
    c->dead = n;
    evtimer_add(c->reap, &now);
    hpd_core_schedule_soon(c);
}

void hpd_reg_on_reap(evutil_socket_t fd, short what, void *arg)
{
    hpd_coord_t *c = arg;
    while (c->dead != NULL) {
        node_t *n = c->dead;
        c->dead = n->next;
        hpd_rpc_client_destroy(n->client);
        if (n->reg_conn != NULL)
            hpd_rpc_conn_unref(n->reg_conn);
        free(n->xfer_info);
        free(n->stats);
        free(n);
    }
}

/* ------------------------------------------------------------ what the scheduler sees */

node_t *hpd_reg_node_by_id(hpd_coord_t *c, uint64_t id)
{
    return hpd_u64map_get(&c->node_ids, id);
}

const char *hpd_reg_role_name(const node_t *n)
{
    return n->role == ROLE_PREFILL ? "prefill" : "decode";
}

/* Whether a node takes new work: registered, not draining, not suspect
 * and in rotation. */
bool hpd_reg_node_usable(const node_t *x, double now)
{
    return x->alive && !x->draining && !x->suspect && hpd_breaker_usable(&x->breaker, now);
}

/* Whether some prefill node could take a prompt of n_prompt tokens now
 * (hpd_route_prefill's choice without its prefix-cache costing). */
bool hpd_reg_prefill_can_take(hpd_coord_t *c, uint32_t n_prompt)
{
    size_t n;
    node_t **map;
    const hpd_route_node_t *v = hpd_reg_route_view(c, &n, &map);
    for (size_t i = 0; i < n; i++)
        if (v[i].prefill && v[i].usable && v[i].max_context > n_prompt)
            return true;
    return false;
}

/* ------------------------------------------------------------ the route view */

static bool time_dependent(const node_t *x)
{
    return x->breaker.open_until != 0 || x->breaker.probe_since != 0;
}

static void view_fill(hpd_coord_t *c, const node_t *x, double now)
{
    c->view[x->view_idx] = (hpd_route_node_t){.id = x->id,
                                              .prefill = x->role == ROLE_PREFILL,
                                              .usable = hpd_reg_node_usable(x, now),
                                              .max_context = x->max_context,
                                              .vocab = x->vocab,
                                              .summary = x->have_summary ? x->summary : NULL,
                                              .summary_bytes = SUMMARY_BYTES,
                                              .queued_tokens = x->queued_tokens,
                                              .slots = x->slots,
                                              .slots_reserved = x->slots_reserved,
                                              .pages = x->pages,
                                              .pages_reserved = x->pages_reserved,
                                              .layout = x->layout};
}

static hpd_status_t view_room(hpd_coord_t *c, size_t n)
{
    if (n <= c->view_cap)
        return HPD_OK;
    const size_t cap = HPD_MAX(2 * c->view_cap, n);
    hpd_route_node_t *v = realloc(c->view, cap * sizeof(*v));
    if (v == NULL)
        return HPD_ERR_NO_MEMORY;
    c->view = v;
    node_t **map = realloc(c->view_map, cap * sizeof(*map));
    node_t **w = map != NULL ? realloc(c->watched, cap * sizeof(*w)) : NULL;
    if (map != NULL)
        c->view_map = map;
    if (w == NULL)
        return HPD_ERR_NO_MEMORY;
    c->watched = w;
    c->view_cap = c->watched_cap = cap;
    return HPD_OK;
}

hpd_status_t hpd_reg_view_init(hpd_coord_t *c)
{
    return view_room(c, 16);
}

void hpd_reg_view_sync(node_t *x)
{
    hpd_coord_t *c = x->coord;
    if (!x->in_view)
        return;
    view_fill(c, x, hpd_time_now());
    if (time_dependent(x) && !x->watched) { /* (room: one slot a node) */
        c->watched[c->n_watched++] = x;
        x->watched = true;
    }
}

/* A registered node's entry, first: the view keeps the registry's order
 * (the newest node first, which routing prefers among equals). Room was
 * made with view_room; registrations are rare, so the shift is cheap. */
static void view_add(hpd_coord_t *c, node_t *x)
{
    memmove(c->view + 1, c->view, c->view_n * sizeof(*c->view));
    memmove(c->view_map + 1, c->view_map, c->view_n * sizeof(*c->view_map));
    c->view_n++;
    for (size_t i = 1; i < c->view_n; i++)
        c->view_map[i]->view_idx = i;
    x->view_idx = 0;
    c->view_map[0] = x;
    x->in_view = true;
    hpd_reg_view_sync(x);
}

static void unwatch(hpd_coord_t *c, size_t i)
{
    c->watched[i]->watched = false;
    c->watched[i] = c->watched[--c->n_watched];
}

/* A lost node's entry goes; the rest keep their order. */
static void view_remove(hpd_coord_t *c, node_t *x)
{
    if (!x->in_view)
        return;
    const size_t at = x->view_idx;
    memmove(c->view + at, c->view + at + 1, (c->view_n - at - 1) * sizeof(*c->view));
    memmove(c->view_map + at, c->view_map + at + 1, (c->view_n - at - 1) * sizeof(*c->view_map));
    c->view_n--;
    for (size_t i = at; i < c->view_n; i++)
        c->view_map[i]->view_idx = i;
    x->in_view = false;
    for (size_t i = 0; x->watched && i < c->n_watched; i++)
        if (c->watched[i] == x)
            unwatch(c, i);
}

#ifdef HPD_DEBUG
/* Debug builds: every entry is what its node says now (a change without
 * its hpd_reg_view_sync would route on stale books). */
static void view_check(hpd_coord_t *c, double now)
{
    for (size_t i = 0; i < c->view_n; i++) {
        const node_t *x = c->view_map[i];
        const hpd_route_node_t *e = &c->view[i];
        HPD_ASSERT_ALWAYS(x->view_idx == i && x->in_view && e->id == x->id);
        HPD_ASSERT_ALWAYS(e->usable == hpd_reg_node_usable(x, now) || time_dependent(x));
        HPD_ASSERT_ALWAYS(e->slots_reserved == x->slots_reserved &&
                          e->pages_reserved == x->pages_reserved &&
                          e->queued_tokens == x->queued_tokens &&
                          (e->summary != NULL) == x->have_summary);
    }
}
#endif

hpd_route_node_t *hpd_reg_route_view(hpd_coord_t *c, size_t *n_p, node_t ***map_p)
{
    const double now = hpd_time_now();
    for (size_t i = c->n_watched; i-- > 0;) {
        node_t *x = c->watched[i];
        view_fill(c, x, now);
        if (!time_dependent(x))
            unwatch(c, i);
    }
#ifdef HPD_DEBUG
    view_check(c, now);
#endif
    *n_p = c->view_n;
    *map_p = c->view_map;
    return c->view;
}

void hpd_coord_limits(const hpd_coord_t *c, uint32_t *vocab_p, uint32_t *max_context_p)
{
    uint32_t vocab = 0, ctx = 0;
    if (c->door != NULL) { /* its scheduler's */
        hpd_door_limits(c->door, vocab_p, max_context_p);
        return;
    }
    for (const node_t *n = c->nodes; n != NULL; n = n->next) {
        if (!n->alive || n->draining)
            continue;
        if (vocab == 0 || n->vocab < vocab)
            vocab = n->vocab;
        if (n->role == ROLE_DECODE && n->max_context > ctx)
            ctx = n->max_context;
    }
    *vocab_p = vocab;
    *max_context_p = ctx;
}

/* ------------------------------------------------------------ sick peers (coordinator/breaker.h) */

static uint32_t usable_of(const hpd_coord_t *c, role_t role)
{
    uint32_t k = 0;
    for (const node_t *n = c->nodes; n != NULL; n = n->next)
        k += n->alive && !n->draining && n->role == role;
    return k;
}

/* A failed pair counts against both of its nodes (coordinator/breaker.h):
 * a node that fails with several counterparts goes out of rotation. */
void hpd_reg_pair_failed(hpd_coord_t *c, node_t *p, node_t *d, const char *why)
{
    const double now = hpd_time_now();
    node_t *both[2] = {d, p};
    for (int i = 0; i < 2; i++) {
        node_t *n = both[i], *other = both[1 - i];
        if (n == NULL)
            continue;
        const uint32_t others = usable_of(c, n->role == ROLE_PREFILL ? ROLE_DECODE : ROLE_PREFILL);
        const bool opened =
            hpd_breaker_failure(&n->breaker, other != NULL ? other->id : 0, others, now);
        hpd_reg_view_sync(n);
        if (!opened)
            continue;
        hpd_metric_inc(c->m.breaker_openings, 1);
        HPD_LOG_WARN(LOG_COMPONENT, "%s node %s out of rotation for %.1f s after %u failed "
                     "pairs (the last: %s); then one request probes it", hpd_reg_role_name(n),
                     n->name, n->breaker.open_until - now,
                     n->breaker.failures ? n->breaker.failures : 1, why);
    }
}

void hpd_reg_pair_ok(node_t *p, node_t *d)
{
    node_t *both[2] = {p, d};
    for (int i = 0; i < 2; i++) {
        if (both[i] == NULL)
            continue;
        if (hpd_breaker_success(&both[i]->breaker))
            HPD_LOG_INFO(LOG_COMPONENT, "%s node %s back in rotation: a probe succeeded",
                         hpd_reg_role_name(both[i]), both[i]->name);
        hpd_reg_view_sync(both[i]);
    }
}

/* ------------------------------------------------------------ status */

/* What a client key may see is the cluster's shape and load; where the
 * nodes listen is for node credentials only. */
void hpd_reg_status(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_coord_t *c = arg;
    const bool addresses = (hpd_rpc_conn_roles(conn) & HPD_ROLE_NODE) != 0;
    hpd_rpc_buf_t b;
    uint32_t n_nodes = 0, queued = 0;
    for (node_t *n = c->nodes; n != NULL; n = n->next)
        n_nodes++;
    for (req_t *r = c->reqs; r != NULL; r = r->next)
        queued += !r->is_hedge && r->fsm.state == HPD_REQ_QUEUED;
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 2);
    hpd_proto_key(&b.pk, "nodes");
    msgpack_pack_array(&b.pk, n_nodes);
    for (node_t *n = c->nodes; n != NULL; n = n->next) {
        msgpack_pack_map(&b.pk, addresses ? 10 : 9);
        hpd_proto_kv_u64(&b.pk, "id", n->id);
        hpd_proto_kv_u64(&b.pk, "tp", n->tp);
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
    msgpack_pack_map(&b.pk, 8);
    hpd_proto_kv_u64(&b.pk, "active", c->n_reqs);
    hpd_proto_kv_u64(&b.pk, "queued", queued);
    hpd_proto_kv_u64(&b.pk, "finished", c->finished);
    hpd_proto_kv_u64(&b.pk, "failed", c->failed);
    hpd_proto_kv_u64(&b.pk, "canceled", c->canceled);
    hpd_proto_kv_u64(&b.pk, "retried", c->retried);
    hpd_proto_kv_u64(&b.pk, "hedged", c->hedged);
    hpd_proto_kv_u64(&b.pk, "rejected", c->rejected);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}
