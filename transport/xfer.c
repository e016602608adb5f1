/* UCX data plane (see xfer.h).
 *
 * Who frees what: the context owns its regions and peers. A peer is freed
 * when it has been disconnected (or its context destroyed) and no UCX
 * request that points at it is still in flight (refs). A transfer is owned
 * by its peer until its completion message was sent or it failed; its done
 * callback runs exactly once. */
#include "transport/xfer_internal.h"

/* ------------------------------------------------------------ progress */

static void arm_tick_now(hpd_xfer_ctx_t *c);
static void reap_closes(hpd_xfer_ctx_t *c);

/* Progress, bounded: a transport retrying towards a dead peer reports
 * progress forever, and the event loop must get its turn (the timer comes
 * back). Endpoint closes asked for from UCX's callbacks go first, between
 * rounds. Then arm the event fd, unless polling. */
static void progress_and_arm(hpd_xfer_ctx_t *c)
{
    for (int round = 0; round < 16; round++) {
        reap_closes(c);
        for (int i = 0; i < 256 && ucp_worker_progress(c->worker) != 0; i++)
            ;
        if (c->closes_due > 0)
            continue;
        if (c->polling || ucp_worker_arm(c->worker) != UCS_ERR_BUSY)
            return;
    }
    arm_tick_now(c);
}

/* While requests to live peers are in flight UCX is progressed on every turn
 * of the loop (a zero-delay timer; the loop's other events run in between;
 * epoll would round any shorter delay up to a millisecond); when polling, an
 * idle context looks every millisecond for incoming notices. Requests stuck
 * towards a failed or disconnected peer do not keep the context busy. */
void hpd_xfer_arm_tick(hpd_xfer_ctx_t *c)
{
    const struct timeval busy = {0, 0}, idle = {0, 1000};
    bool live = false;

    if (c->tick == NULL || evtimer_pending(c->tick, NULL))
        return;
    live = c->n_waiting > 0; /* fences to look at */
    for (hpd_xfer_peer_t *p = c->peers; p != NULL && !live; p = p->next)
        live = p->inflight > 0 && !p->failed;
    if (live)
        evtimer_add(c->tick, &busy);
    else if (c->polling || c->st.inflight > 0)
        evtimer_add(c->tick, &idle);
}

static void arm_tick_now(hpd_xfer_ctx_t *c)
{
    const struct timeval tv = {0, 1000};
    if (c->tick != NULL && !evtimer_pending(c->tick, NULL))
        evtimer_add(c->tick, &tv);
}

/* True when a UCX_TLS list names no network transport. */
static bool shm_only(const char *tls)
{
    static const char *net[] = {"tcp", "rc", "ud", "dc", "ib", "all", "cuda", "rocm", "gdr"};
    if (tls == NULL)
        return false;
    for (size_t i = 0; i < sizeof(net) / sizeof(net[0]); i++)
        if (strstr(tls, net[i]) != NULL)
            return false;
    return true;
}


static void on_efd(evutil_socket_t fd, short what, void *arg)
{
    hpd_xfer_ctx_t *c = arg;
    hpd_xfer_drain_all(c);
    progress_and_arm(c);
    hpd_xfer_arm_tick(c);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    hpd_xfer_ctx_t *c = arg;
    hpd_xfer_drain_all(c);
    progress_and_arm(c);
    hpd_xfer_arm_tick(c);
}

void hpd_xfer_progress(hpd_xfer_ctx_t *c)
{
    hpd_xfer_drain_all(c);
    progress_and_arm(c);
    hpd_xfer_arm_tick(c);
}

/* ------------------------------------------------------------ peers */

/* Gives the peer's rkeys back: they come from its worker's pool, so this
 * runs before the worker is destroyed. */
static void peer_release_rkeys(hpd_xfer_peer_t *p)
{
    for (uint32_t i = 0; i < p->n_regions; i++)
        if (p->regions[i].rkey != NULL) {
            ucp_rkey_destroy(p->regions[i].rkey);
            p->regions[i].rkey = NULL;
        }
}

static void peer_free(hpd_xfer_peer_t *p)
{
    peer_release_rkeys(p);
    free(p);
}

void hpd_xfer_peer_unref(hpd_xfer_peer_t *p)
{
    if (--p->refs > 0)
        return;
    for (hpd_xfer_peer_t **pp = &p->ctx->closing; *pp != NULL; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    peer_free(p);
}

/* Drops the puts still waiting on fences (their fences given back). */
void hpd_xfer_drop_pending(xfer_t *x)
{
    if (x->pending != NULL)
        x->peer->ctx->n_waiting--;
    for (pending_t *w = x->pending, *next; w != NULL; w = next) {
        next = w->next;
        hpd_backend_fence_release(w->backend, w->fence);
        free(w);
    }
    x->pending = x->pending_last = NULL;
    x->n_pending = 0;
}

static void xfer_free(xfer_t *x)
{
    hpd_xfer_drop_pending(x);
    if (x->deadline != NULL)
        event_free(x->deadline);
    if (x->hash != NULL)
        XXH3_freeState(x->hash);
    free(x->dests);
    free(x);
}

static void xfer_unlink(hpd_xfer_peer_t *p, xfer_t *x)
{
    for (xfer_t **pp = &p->xfers; *pp != NULL; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            p->ctx->st.open_transfers--;
            return;
        }
}

/* Ends a transfer with status: its callback once, then it is gone. */
void hpd_xfer_transfer_end(xfer_t *x, hpd_status_t st)
{
    hpd_xfer_peer_t *p = x->peer;
    xfer_unlink(p, x);
    if (st == HPD_OK)
        p->ctx->st.transfers_finished++;
    else
        p->ctx->st.transfers_failed++;
    if (x->cb != NULL)
        x->cb(x->cb_arg, x->id, st);
    xfer_free(x);
}

/* Ends every transfer of a peer now. One that a UCX request (flush or
 * notice) still points to is kept as an orphan until that request completes
 * or the context goes: UCX cannot cancel requests towards a peer without
 * error handling (shared memory). */
void hpd_xfer_fail_transfers(hpd_xfer_peer_t *p, hpd_status_t st)
{
    xfer_t *x = p->xfers, *next;
    for (; x != NULL; x = next) {
        next = x->next;
        if (!x->finishing || x->flush_wait) { /* no UCX request points to it */
            hpd_xfer_transfer_end(x, st);
            continue;
        }
        xfer_unlink(p, x);
        p->ctx->st.transfers_failed++;
        if (x->deadline != NULL)
            event_del(x->deadline);
        if (x->cb != NULL)
            x->cb(x->cb_arg, x->id, st);
        x->cb = NULL;
        x->ended = true;
        x->next = p->ctx->orphans;
        p->ctx->orphans = x;
    }
}

/* A UCX request on an orphan completed: nothing to tell anyone. */
bool hpd_xfer_orphan_done(xfer_t *x)
{
    if (!x->ended)
        return false;
    for (xfer_t **pp = &x->peer->ctx->orphans; *pp != NULL; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    xfer_free(x);
    return true;
}

/* A finish's UCX call answered at once (done, or refused): the transfer
 * ends with st. Unless UCX reported the endpoint failed inside that call
 * (it runs the error handler from within ucp_ep_flush_nbx or
 * ucp_am_send_nbx): the failure already ended the transfer and listed it
 * as an orphan, and only the orphan goes now. */
void hpd_xfer_finish_answered(xfer_t *x, hpd_status_t st)
{
    if (!hpd_xfer_orphan_done(x))
        hpd_xfer_transfer_end(x, st);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    hpd_xfer_peer_t *p = arg;
    hpd_xfer_ctx_t *c = p->ctx;

    /* once; and not for a peer its owner disconnected (the forced close
     * cancels its requests): its transfers have ended, the owner let it go */
    if (p->failed || p->closed)
        return;
    HPD_LOG_WARN(LOG_COMPONENT, "endpoint to node %llu failed: %s", (unsigned long long)p->node,
                 ucs_status_string(status));
    p->failed = true;
    hpd_xfer_fail_transfers(p, HPD_ERR_IO);
    if (c->p.on_peer_error != NULL)
        c->p.on_peer_error(c->p.arg, p, HPD_ERR_IO);
}

/* A UCX request that holds a reference on the peer completed. */
void hpd_xfer_request_done(void *request, hpd_xfer_peer_t *p)
{
    if (request != NULL)
        ucp_request_free(request);
    p->ctx->st.inflight--;
    p->inflight--;
    hpd_xfer_peer_unref(p);
}

void hpd_xfer_on_put_done(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_peer_t *p = user_data;
    if (status != UCS_OK && !p->failed)
        on_ep_error(p, p->ep, status);
    hpd_xfer_request_done(request, p);
}

/* Counts a returned status pointer: in flight, done, or failed. */
hpd_status_t hpd_xfer_track(hpd_xfer_peer_t *p, ucs_status_ptr_t r)
{
    if (r == NULL)
        return HPD_OK;
    if (UCS_PTR_IS_ERR(r)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "request to node %llu failed: %s",
                      (unsigned long long)p->node, ucs_status_string(UCS_PTR_STATUS(r)));
        return HPD_ERR_IO;
    }
    p->refs++;
    p->inflight++;
    p->ctx->st.inflight++;
    hpd_xfer_arm_tick(p->ctx);
    return HPD_OK;
}

/* ------------------------------------------------------------ context */

hpd_status_t hpd_xfer_create(const hpd_xfer_params_t *params, hpd_xfer_ctx_t **ctx_p)
{
    hpd_xfer_ctx_t *c = calloc(1, sizeof(*c));
    ucp_config_t *config = NULL;
    ucs_status_t us;

    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    c->p = *params;
    c->efd = -1;
    c->polling = params->polling || shm_only(params->tls);
    /* UCX 1.13's tcp transport connects with a blocking connect() by default
     * (UCX_TCP_CONN_NB=n): towards an unreachable peer, ucp_ep_create then
     * stalls this node's whole loop for the kernel's SYN timeout (minutes),
     * every other peer with it. Set before UCX reads its configuration; the
     * environment may still say otherwise. */
    setenv("UCX_TCP_CONN_NB", "y", 0);
    if ((us = ucp_config_read(NULL, NULL, &config)) != UCS_OK)
        goto ucx_err;
    if (params->tls != NULL && (us = ucp_config_modify(config, "TLS", params->tls)) != UCS_OK)
        goto ucx_err;
    if (params->net_devices != NULL &&
        (us = ucp_config_modify(config, "NET_DEVICES", params->net_devices)) != UCS_OK)
        goto ucx_err;
    /* find dead peers within seconds on transports without a connection to lose */
    ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
    ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                       .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP |
                                   UCP_FEATURE_STREAM};
    if ((us = ucp_init(&up, config, &c->ucp)) != UCS_OK)
        goto ucx_err;
    ucp_config_release(config);
    config = NULL;
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(c->ucp, &ca) == UCS_OK)
        c->cuda = (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((us = ucp_worker_create(c->ucp, &wp, &c->worker)) != UCS_OK)
        goto ucx_err;
    if ((us = ucp_worker_get_address(c->worker, &c->address, &c->address_len)) != UCS_OK ||
        (us = ucp_worker_get_efd(c->worker, &c->efd)) != UCS_OK)
        goto ucx_err;
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = AM_DONE, .cb = hpd_xfer_on_am, .arg = c};
    if ((us = ucp_worker_set_am_recv_handler(c->worker, &hp)) != UCS_OK)
        goto ucx_err;
    hp.id = AM_HELLO;
    hp.cb = hpd_xfer_on_hello;
    if ((us = ucp_worker_set_am_recv_handler(c->worker, &hp)) != UCS_OK)
        goto ucx_err;
    hp.id = AM_BYE;
    hp.cb = hpd_xfer_on_bye;
    if ((us = ucp_worker_set_am_recv_handler(c->worker, &hp)) != UCS_OK)
        goto ucx_err;
    snprintf(c->tls, sizeof(c->tls), "%s", params->tls ? params->tls : "default");
    if (params->base != NULL) {
        c->tick = evtimer_new(params->base, on_tick, c);
        if (!c->polling)
            c->ev = event_new(params->base, c->efd, EV_READ | EV_PERSIST, on_efd, c);
        if (c->tick == NULL || (!c->polling && (c->ev == NULL || event_add(c->ev, NULL) != 0))) {
            hpd_xfer_destroy(c);
            return HPD_ERR_NO_MEMORY;
        }
    }
    progress_and_arm(c);
    hpd_xfer_arm_tick(c);
    *ctx_p = c;
    return HPD_OK;
ucx_err:
    HPD_LOG_ERROR(LOG_COMPONENT, "ucx initialisation (TLS=%s) failed: %s",
                  params->tls ? params->tls : "default", ucs_status_string(us));
    if (config != NULL)
        ucp_config_release(config);
    hpd_xfer_destroy(c);
    return HPD_ERR_IO;
}


/* Progresses the worker while requests are in flight or closes wait, for
 * a bounded time. */
static void drain_worker(hpd_xfer_ctx_t *c)
{
    for (int i = 0; i < 100 && c->worker != NULL; i++) {
        reap_closes(c);
        if (c->st.inflight == 0)
            break;
        for (int k = 0; k < 256 && ucp_worker_progress(c->worker) != 0; k++)
            ;
    }
}

void hpd_xfer_destroy(hpd_xfer_ctx_t *c)
{
    if (c == NULL)
        return;
    while (c->peers != NULL)
        hpd_xfer_disconnect(c->peers);
    /* let the byes go out, then close what a bye still holds open (UCX
     * cannot destroy a worker with an endpoint mid-flush), and let the
     * forced closes and cancelled requests complete */
    drain_worker(c);
    for (hpd_xfer_peer_t *p = c->closing, *next; p != NULL; p = next) {
        next = p->next;
        hpd_xfer_close_ep(p); /* issued by the drain below */
    }
    drain_worker(c);
    /* peers whose close never completed are freed below, after the worker;
     * their rkeys belong to the worker's pool and go now */
    for (hpd_xfer_peer_t *p = c->closing; p != NULL; p = p->next)
        peer_release_rkeys(p);
    if (c->ev != NULL)
        event_free(c->ev);
    if (c->tick != NULL)
        event_free(c->tick);
    for (uint32_t i = 0; i < c->n_regions; i++) {
        if (c->regions[i].pinned)
            hpd_backend_host_unregister(c->regions[i].backend, c->regions[i].base);
        ucp_rkey_buffer_release(c->regions[i].rkey_buf);
        ucp_mem_unmap(c->ucp, c->regions[i].memh);
    }
    if (c->address != NULL)
        ucp_worker_release_address(c->worker, c->address);
    if (c->worker != NULL)
        ucp_worker_destroy(c->worker);
    /* what requests UCX never completed still pointed at */
    while (c->orphans != NULL) {
        xfer_t *x = c->orphans;
        c->orphans = x->next;
        xfer_free(x);
    }
    while (c->closing != NULL) {
        hpd_xfer_peer_t *p = c->closing;
        c->closing = p->next;
        peer_free(p);
    }
    if (c->ucp != NULL)
        ucp_cleanup(c->ucp);
    free(c);
}

void hpd_xfer_set_node_id(hpd_xfer_ctx_t *c, uint64_t node_id)
{
    c->p.node_id = node_id;
}

bool hpd_xfer_cuda_supported(const hpd_xfer_ctx_t *c)
{
    return c->cuda;
}

const char *hpd_xfer_tls(const hpd_xfer_ctx_t *c)
{
    return c->tls;
}

hpd_status_t hpd_xfer_register(hpd_xfer_ctx_t *c, void *base, size_t len, uint32_t *region_p)
{
    region_t *r;
    ucs_status_t us;

    /* memory this context allocated (hpd_xfer_alloc) is a region already */
    for (uint32_t i = 0; i < c->n_regions; i++)
        if (c->regions[i].base == base && len <= c->regions[i].len) {
            *region_p = i;
            return HPD_OK;
        }
    if (c->n_regions == HPD_XFER_MAX_REGIONS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "more than %d registered regions", HPD_XFER_MAX_REGIONS);
        return HPD_ERR_NO_RESOURCE;
    }
    r = &c->regions[c->n_regions];
    memset(r, 0, sizeof(*r));
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = base, .length = len};
    if ((us = ucp_mem_map(c->ucp, &mp, &r->memh)) != UCS_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "registration of %zu bytes failed: %s", len,
                      ucs_status_string(us));
        return HPD_ERR_IO;
    }
    if ((us = ucp_rkey_pack(c->ucp, r->memh, &r->rkey_buf, &r->rkey_len)) != UCS_OK) {
        ucp_mem_unmap(c->ucp, r->memh);
        HPD_LOG_ERROR(LOG_COMPONENT, "rkey pack failed: %s", ucs_status_string(us));
        return HPD_ERR_IO;
    }
    r->base = base;
    r->len = len;
    *region_p = c->n_regions++;
    return HPD_OK;
}

hpd_status_t hpd_xfer_alloc(hpd_xfer_ctx_t *c, size_t len, void **base_p, uint32_t *region_p)
{
    region_t *r;
    ucs_status_t us;
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};

    if (c->n_regions == HPD_XFER_MAX_REGIONS)
        return HPD_ERR_NO_RESOURCE;
    r = &c->regions[c->n_regions];
    memset(r, 0, sizeof(*r));
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                             UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                               .length = len, .flags = UCP_MEM_MAP_ALLOCATE};
    if ((us = ucp_mem_map(c->ucp, &mp, &r->memh)) != UCS_OK ||
        (us = ucp_mem_query(r->memh, &attr)) != UCS_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "ucx allocation of %zu bytes failed: %s", len,
                      ucs_status_string(us));
        return HPD_ERR_NO_MEMORY;
    }
    if ((us = ucp_rkey_pack(c->ucp, r->memh, &r->rkey_buf, &r->rkey_len)) != UCS_OK) {
        ucp_mem_unmap(c->ucp, r->memh);
        return HPD_ERR_IO;
    }
    r->base = attr.address;
    r->len = len;
    *base_p = attr.address;
    *region_p = c->n_regions++;
    return HPD_OK;
}

hpd_status_t hpd_xfer_alloc_pinned(hpd_xfer_ctx_t *c, hpd_backend_t *backend, size_t len,
                                   void **base_p, uint32_t *region_p)
{
    hpd_status_t st = hpd_xfer_alloc(c, len, base_p, region_p);
    if (st != HPD_OK || hpd_backend_host_memory(backend))
        return st;
    region_t *r = &c->regions[*region_p];
    if ((st = hpd_backend_host_register(backend, r->base, len)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "pinning %zu bytes for the %s backend failed: %s", len,
                      backend->ops->name, hpd_status_str(st));
        return st; /* the region stays mapped until destroy */
    }
    r->backend = backend;
    r->pinned = true;
    return HPD_OK;
}

hpd_status_t hpd_xfer_register_pool(hpd_xfer_ctx_t *c, hpd_backend_t *backend, void *pool,
                                    size_t len, uint32_t *region_p)
{
    hpd_status_t st;
    void *mirror;

    if (hpd_backend_host_memory(backend))
        return hpd_xfer_register(c, pool, len, region_p);
    if (c->cuda || c->p.direct_pools) {
        if ((st = hpd_xfer_register(c, pool, len, region_p)) != HPD_OK)
            return st;
        c->regions[*region_p].backend = backend;
        c->regions[*region_p].device = pool;
        return HPD_OK;
    }
    /* UCX cannot write device memory: peers write a pinned host mirror */
    if ((st = hpd_xfer_alloc_pinned(c, backend, len, &mirror, region_p)) != HPD_OK)
        return st;
    c->regions[*region_p].device = pool;
    HPD_LOG_INFO(LOG_COMPONENT, "region %u: %zu bytes of %s memory, received through a pinned "
                 "host mirror (UCX has no CUDA support here)", *region_p, len, backend->ops->name);
    return HPD_OK;
}

hpd_status_t hpd_xfer_pack_info(const hpd_xfer_ctx_t *c, hpd_rpc_buf_t *b)
{
    msgpack_pack_map(&b->pk, 3);
    hpd_rpc_pack_str(&b->pk, "node");
    msgpack_pack_uint64(&b->pk, c->p.node_id);
    hpd_rpc_pack_str(&b->pk, "address");
    msgpack_pack_bin(&b->pk, c->address_len);
    msgpack_pack_bin_body(&b->pk, c->address, c->address_len);
    hpd_rpc_pack_str(&b->pk, "regions");
    msgpack_pack_array(&b->pk, c->n_regions);
    for (uint32_t i = 0; i < c->n_regions; i++) {
        msgpack_pack_array(&b->pk, 3);
        msgpack_pack_uint64(&b->pk, (uint64_t)(uintptr_t)c->regions[i].base);
        msgpack_pack_uint64(&b->pk, c->regions[i].len);
        msgpack_pack_bin(&b->pk, c->regions[i].rkey_len);
        msgpack_pack_bin_body(&b->pk, c->regions[i].rkey_buf, c->regions[i].rkey_len);
    }
    return HPD_OK;
}

/* A region the peer allocated through UCX in shared memory can be mapped
 * here: puts into it become copies. UCX unpacks a shared-memory key only
 * for a peer on this host. Without CUDA support in UCX only: there a key
 * could stand for device memory. */
static void map_region(const hpd_xfer_ctx_t *c, hpd_xfer_peer_t *p, uint32_t i)
{
    void *local;
    if (c->p.ucx_puts || c->cuda ||
        ucp_rkey_ptr(p->regions[i].rkey, p->regions[i].base, &local) != UCS_OK)
        return;
    p->regions[i].mapped = local;
    HPD_LOG_DEBUG(LOG_COMPONENT, "node %llu's region %u (%llu bytes) is mapped here",
                  (unsigned long long)p->node, i, (unsigned long long)p->regions[i].len);
}

static void send_hello(hpd_xfer_peer_t *p);
static void probe_rtt(hpd_xfer_peer_t *p);

/* What this context knows of its link to node, or NULL. */
static const link_t *link_find(const hpd_xfer_ctx_t *c, uint64_t node)
{
    for (size_t i = 0; i < HPD_ARRAY_SIZE(c->links); i++)
        if (c->links[i].used > 0 && c->links[i].node == node)
            return &c->links[i];
    return NULL;
}

/* The same, to be written: made when missing (the entry written least
 * recently given up). */
link_t *hpd_xfer_link_of(hpd_xfer_ctx_t *c, uint64_t node)
{
    link_t *l = (link_t *)link_find(c, node);
    if (l == NULL) {
        l = &c->links[0];
        for (size_t i = 1; i < HPD_ARRAY_SIZE(c->links); i++)
            if (c->links[i].used < l->used)
                l = &c->links[i];
        *l = (link_t){.node = node, .probe_cap = PROBE_COUNTS_UP_TO_S};
    }
    l->used = hpd_time_now();
    return l;
}

hpd_status_t hpd_xfer_connect(hpd_xfer_ctx_t *c, const msgpack_object *info,
                              hpd_xfer_peer_t **peer_p)
{
    const msgpack_object *node = hpd_rpc_map_get(info, "node");
    const msgpack_object *addr = hpd_rpc_map_get(info, "address");
    const msgpack_object *regs = hpd_rpc_map_get(info, "regions");
    hpd_xfer_peer_t *p;
    ucs_status_t us;
    char why[200];

    if (hpd_xfer_check_info(info, why, sizeof(why)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "peer info refused: %s", why);
        return HPD_ERR_FORMAT;
    }
    if ((p = calloc(1, sizeof(*p))) == NULL)
        return HPD_ERR_NO_MEMORY;
    p->ctx = c;
    p->node = node->via.u64;
    p->refs = 1;
    /* a pair connected again starts from what it showed before */
    const link_t *l = hpd_xfer_link_of(c, p->node);
    p->rtt = l->rtt;
    p->rate = l->rate;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = (const ucp_address_t *)addr->via.bin.ptr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {on_ep_error, p}};
    us = ucp_ep_create(c->worker, &ep, &p->ep);
    if (us == UCS_ERR_UNREACHABLE) {
        /* shared-memory transports cannot report a dead peer: without UCX's
         * error handling, the control-plane link's loss disconnects the peer */
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        us = ucp_ep_create(c->worker, &ep, &p->ep);
        if (us == UCS_OK)
            HPD_LOG_INFO(LOG_COMPONENT, "node %llu: no transport with peer failure detection; "
                                        "relying on the control plane",
                         (unsigned long long)p->node);
    }
    if (us != UCS_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "endpoint to node %llu: %s", (unsigned long long)p->node,
                      ucs_status_string(us));
        free(p);
        return HPD_ERR_IO;
    }
    for (uint32_t i = 0; i < regs->via.array.size; i++) {
        const msgpack_object *r = &regs->via.array.ptr[i];
        if (ucp_ep_rkey_unpack(p->ep, r->via.array.ptr[2].via.bin.ptr, &p->regions[i].rkey) !=
            UCS_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "peer %llu: region %u is malformed",
                          (unsigned long long)p->node, i);
            p->n_regions = i;
            p->next = c->peers;
            c->peers = p;
            hpd_xfer_disconnect(p);
            return HPD_ERR_FORMAT;
        }
        p->regions[i].base = r->via.array.ptr[0].via.u64;
        p->regions[i].len = r->via.array.ptr[1].via.u64;
        p->n_regions = i + 1;
        map_region(c, p, i);
    }
    p->next = c->peers;
    c->peers = p;
    send_hello(p);
    probe_rtt(p);
    progress_and_arm(c);
    *peer_p = p;
    return HPD_OK;
}

static void on_marker_sent(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_request_done(request, user_data);
}

/* A moving average of samples (rates, round trips); 0: none yet. */
double hpd_xfer_ewma(double avg, double sample)
{
    return avg > 0 ? 0.75 * avg + 0.25 * sample : sample;
}

/* A round trip of the link as the first sample of its RTT: the flush
 * behind the hello completes once the peer acknowledged it (the wireup
 * included: an upper bound, which is what a deadline wants). */
void hpd_xfer_sample_rtt(hpd_xfer_peer_t *p, double seconds)
{
    p->rtt = hpd_xfer_ewma(p->rtt, seconds);
    hpd_xfer_link_of(p->ctx, p->node)->rtt = p->rtt;
}

/* The probe of a new endpoint came back: the pair answers, and a later new
 * endpoint to it gets the first allowance again. */
static void probe_answered(hpd_xfer_peer_t *p)
{
    hpd_xfer_sample_rtt(p, hpd_time_now() - p->probe_t0);
    hpd_xfer_link_of(p->ctx, p->node)->probe_cap = PROBE_COUNTS_UP_TO_S;
}

static void on_probe_flushed(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_peer_t *p = user_data;
    if (status == UCS_OK && p->probing)
        probe_answered(p);
    p->probing = false;
    hpd_xfer_request_done(request, p);
}

static void probe_rtt(hpd_xfer_peer_t *p)
{
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.send = on_probe_flushed,
                              .user_data = p};
    p->probe_t0 = hpd_time_now();
    p->probing = true;
    ucs_status_ptr_t r = ucp_ep_flush_nbx(p->ep, &rp);
    if (r == NULL) {
        probe_answered(p);
        p->probing = false;
    } else if (UCS_PTR_IS_ERR(r)) {
        p->probing = false;
    } else {
        (void)hpd_xfer_track(p, r);
    }
}

/* Sends a hello or a bye: {magic, this node}, eager, asking UCX for the
 * endpoint back to here. h lives in p while the request does. */
static hpd_status_t send_marker(hpd_xfer_peer_t *p, unsigned am_id, hello_hdr_t *h,
                                uint64_t magic)
{
    *h = (hello_hdr_t){magic, p->ctx->p.node_id};
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
                              .cb.send = on_marker_sent,
                              .user_data = p};
    return hpd_xfer_track(p, ucp_am_send_nbx(p->ep, am_id, h, sizeof(*h), NULL, 0, &rp));
}

/* Tells the receiver who writes from this endpoint, asking UCX for the
 * endpoint back to here (the receiver may close it: hpd_xfer_close_writer).
 * Sent before any put; a failure shows as the endpoint's. */
static void send_hello(hpd_xfer_peer_t *p)
{
    (void)send_marker(p, AM_HELLO, &p->hello, HELLO_MAGIC);
}

static void on_close_done(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_request_done(request, user_data);
}

static void on_bye_flushed(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_peer_t *p = user_data;
    hpd_xfer_close_ep(p);
    hpd_xfer_request_done(request, p);
}

/* Says goodbye to a healthy receiver (hpd_xfer_on_bye) and closes the endpoint once
 * the flush behind the bye completed: a forced close at once could cancel
 * the bye, and the receiver would keep an endpoint UCX then destroys.
 * False where the bye could not be sent: the caller closes at once. */
static bool send_bye(hpd_xfer_peer_t *p)
{
    if (send_marker(p, AM_BYE, &p->bye, BYE_MAGIC) != HPD_OK)
        return false;
    ucp_request_param_t fp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.send = on_bye_flushed,
                              .user_data = p};
    ucs_status_ptr_t r = ucp_ep_flush_nbx(p->ep, &fp);
    if (r == NULL || UCS_PTR_IS_ERR(r))
        return false;
    (void)hpd_xfer_track(p, r);
    return true;
}

void hpd_xfer_disconnect(hpd_xfer_peer_t *p)
{
    hpd_xfer_ctx_t *c = p->ctx;

    for (hpd_xfer_peer_t **pp = &c->peers; *pp != NULL; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    p->closed = true;
    hpd_xfer_fail_transfers(p, HPD_ERR_CANCELED);
    p->next = c->closing;
    c->closing = p;
    if (!p->ep_closed && (p->failed || !send_bye(p)))
        hpd_xfer_close_ep(p);
    hpd_xfer_peer_unref(p); /* the connection's reference */
}

/* Asks for the endpoint's forced close: UCX cancels its requests (their
 * callbacks run with an error), and the peer is held until the close
 * completed. The close itself waits for the next turn of progress: this is
 * often called from a UCX callback (a bye's flush that failed), and UCX 1.13
 * runs those while it sets the endpoint failed; an endpoint closed then is
 * freed under it, and it goes on to use the freed memory (an assertion
 * `signal.tid == ucs_get_tid()` in wireup_ep.c, or worse). */
void hpd_xfer_close_ep(hpd_xfer_peer_t *p)
{
    if (p->ep_closed)
        return;
    p->ep_closed = true;
    p->close_due = true;
    p->refs++; /* held until the close is issued */
    p->ctx->closes_due++;
    arm_tick_now(p->ctx);
}

static void issue_close(hpd_xfer_peer_t *p)
{
    hpd_xfer_ctx_t *c = p->ctx;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE,
                              .cb.send = on_close_done,
                              .user_data = p};
    p->close_due = false;
    c->closes_due--;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p->ep, &rp);
    if (r != NULL && !UCS_PTR_IS_ERR(r)) {
        p->refs++;
        p->inflight++;
        c->st.inflight++;
        hpd_xfer_arm_tick(c);
    }
    hpd_xfer_peer_unref(p); /* the close may have completed p's last request */
}

static hpd_xfer_peer_t *close_due_in(hpd_xfer_peer_t *list)
{
    for (hpd_xfer_peer_t *p = list; p != NULL; p = p->next)
        if (p->close_due)
            return p;
    return NULL;
}

/* Issues the closes asked for; never from within a UCX callback. */
static void reap_closes(hpd_xfer_ctx_t *c)
{
    while (c->closes_due > 0) {
        hpd_xfer_peer_t *p = close_due_in(c->closing);
        if (p == NULL)
            p = close_due_in(c->peers);
        if (p == NULL)
            break;
        issue_close(p); /* may free p and change the lists: look again */
    }
}

uint64_t hpd_xfer_peer_node(const hpd_xfer_peer_t *p)
{
    return p->node;
}

void hpd_xfer_peer_link(const hpd_xfer_peer_t *p, double *rtt_s_p, double *rate_p)
{
    *rtt_s_p = p->rtt;
    *rate_p = p->rate;
}

/* How long a probe of a new endpoint to node, still out, may count as
 * the pair's round trip. */
double hpd_xfer_probe_cap(const hpd_xfer_ctx_t *c, uint64_t node)
{
    const link_t *l = link_find(c, node);
    return l != NULL ? l->probe_cap : PROBE_COUNTS_UP_TO_S;
}

double hpd_xfer_answer_allowance(const hpd_xfer_ctx_t *c, uint64_t node)
{
    return DEADLINE_RTTS * hpd_xfer_probe_cap(c, node);
}

bool hpd_xfer_peer_failed(const hpd_xfer_peer_t *p)
{
    return p->failed;
}

void hpd_xfer_stats(const hpd_xfer_ctx_t *c, hpd_xfer_stats_t *stats_p)
{
    *stats_p = c->st;
    stats_p->writers = c->n_writers;
}
