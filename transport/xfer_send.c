/* The data plane's sender (transport/xfer.h): a transfer's puts, in order
 * behind the fences they wait on, its flush, its completion notice with the
 * checksum of what it put, and its deadline. */
#include "transport/xfer_internal.h"

/* ------------------------------------------------------------ sender */

static xfer_t *xfer_get(hpd_xfer_peer_t *p, uint64_t id, bool create)
{
    for (xfer_t *x = p->xfers; x != NULL; x = x->next)
        if (x->id == id && !x->finishing)
            return x;
    if (!create)
        return NULL;
    xfer_t *x = calloc(1, sizeof(*x));
    if (x == NULL || (x->hash = XXH3_createState()) == NULL) {
        free(x);
        return NULL;
    }
    XXH3_64bits_reset(x->hash);
    x->peer = p;
    x->id = id;
    x->next = p->xfers;
    p->xfers = x;
    p->ctx->st.open_transfers++;
    return x;
}

/* Copies into memory this process does not read back. On x86 the stores
 * are non-temporal: they skip the read of each destination line that a
 * cached store costs, and leave the cache to the source. */
static void copy_out(uint8_t *dst, const uint8_t *src, size_t n)
{
#if defined(__x86_64__)
    const size_t head = HPD_MIN(n, (16 - ((uintptr_t)dst & 15)) & 15);
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; dst += 64, src += 64, n -= 64) {
        const __m128i a = _mm_loadu_si128((const __m128i *)src);
        const __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        const __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
#endif
    memcpy(dst, src, n);
}

/* A put into a mapped region: copied and hashed a piece (64 KiB) at a
 * time, so that the hash reads what the copy has just brought into the
 * cache. */
static void copy_and_hash(uint8_t *dst, const uint8_t *src, size_t n, XXH3_state_t *hash)
{
    for (size_t off = 0; off < n; off += HPD_HASH_PIECE_BYTES) {
        const size_t len = (size_t)hpd_hash_piece_len(n, off);
        copy_out(dst + off, src + off, len);
        hpd_hash_fold(hash, hpd_hash_piece(src + off, len)); /* one piece */
    }
}

static ucp_mem_h local_memh(const hpd_xfer_ctx_t *c, const void *ptr, uint64_t bytes)
{
    for (uint32_t i = 0; i < c->n_regions; i++) {
        const uint8_t *b = c->regions[i].base;
        if ((const uint8_t *)ptr >= b && (const uint8_t *)ptr + bytes <= b + c->regions[i].len)
            return c->regions[i].memh;
    }
    return NULL;
}

/* Whether puts fall inside the peer's regions (named in the log if not). */
static hpd_status_t check_puts(const hpd_xfer_peer_t *p, const hpd_xfer_put_t *puts, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const hpd_xfer_put_t *u = &puts[i];
        if (u->region >= p->n_regions || u->offset > p->regions[u->region].len ||
            u->bytes > p->regions[u->region].len - u->offset) {
            HPD_LOG_ERROR(LOG_COMPONENT,
                          "put of %llu bytes at offset %llu of node %llu's region %u is outside it",
                          (unsigned long long)u->bytes, (unsigned long long)u->offset,
                          (unsigned long long)p->node, u->region);
            return HPD_ERR_INVALID_ARG;
        }
    }
    return HPD_OK;
}

/* Issues checked puts whose local bytes are ready: hashed in order, then
 * copied into a mapped region or put through UCX. */
static hpd_status_t issue(hpd_xfer_peer_t *p, xfer_t *x, const hpd_xfer_put_t *puts, uint32_t n)
{
    hpd_xfer_ctx_t *c = p->ctx;
    hpd_status_t st;

    if (x->t_first == 0)
        x->t_first = hpd_time_now();
    for (uint32_t i = 0; i < n; i++) {
        const hpd_xfer_put_t *u = &puts[i];
        if (hpd_grow(&x->dests, &x->cap_dests, (size_t)x->n_dests + 1, sizeof(*x->dests)) !=
            HPD_OK)
            return HPD_ERR_NO_MEMORY;
        x->dests[x->n_dests++] = (dest_t){u->region, 0, u->offset, u->bytes};
        x->hdr.bytes += u->bytes;
        if (p->regions[u->region].mapped != NULL) {
            copy_and_hash(p->regions[u->region].mapped + u->offset, u->local, u->bytes, x->hash);
            c->st.puts++;
            c->st.bytes_put += u->bytes;
            c->st.bytes_mapped += u->bytes;
            continue;
        }
        hpd_hash_put(x->hash, u->local, u->bytes);
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                  UCP_OP_ATTR_FIELD_USER_DATA,
                                  .cb.send = hpd_xfer_on_put_done,
                                  .user_data = p};
        ucp_mem_h memh = local_memh(c, u->local, u->bytes);
        if (memh != NULL) {
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            rp.memh = memh;
        }
        st = hpd_xfer_track(p, ucp_put_nbx(p->ep, u->local, u->bytes,
                                  p->regions[u->region].base + u->offset,
                                  p->regions[u->region].rkey, &rp));
        /* an endpoint that failed inside the put ended the transfer: x is
         * gone */
        if (p->failed)
            return HPD_ERR_IO;
        if (st != HPD_OK)
            return st;
        c->st.puts++;
        c->st.bytes_put += u->bytes;
    }
    /* the copies (non-temporal stores among them) are visible before
     * anything this process sends later, the completion notice included */
    atomic_thread_fence(memory_order_seq_cst);
    return HPD_OK;
}

static void start_flush(xfer_t *x);

/* Issues the waiting puts whose fences have passed, in order, up to the
 * first that has not. A fence that failed (the device work behind it) or a
 * put that failed makes the transfer's error and drops what waits: its
 * finish reports the error. A finish that waited goes on once nothing
 * waits. False when x may be gone: the finish went on, or the peer failed
 * meanwhile. */
static bool drain(xfer_t *x)
{
    hpd_xfer_peer_t *p = x->peer;
    while (x->pending != NULL) {
        pending_t *w = x->pending;
        const int q = hpd_backend_fence_query(w->backend, w->fence);
        if (q == 0)
            return true;
        hpd_status_t st = HPD_ERR_INTERNAL; /* the device failed, not the peer */
        if (q > 0) {
            st = issue(p, x, w->puts, w->n);
            if (p->failed)
                return false;
        }
        x->pending = w->next;
        x->n_pending--;
        if (x->pending == NULL) {
            x->pending_last = NULL;
            p->ctx->n_waiting--;
        }
        hpd_backend_fence_release(w->backend, w->fence);
        free(w);
        if (st != HPD_OK) {
            if (q < 0)
                HPD_LOG_ERROR(LOG_COMPONENT,
                              "transfer %llu to node %llu: the device work its puts wait on failed",
                              (unsigned long long)x->id, (unsigned long long)p->node);
            x->error = st;
            hpd_xfer_drop_pending(x);
        }
    }
    if (x->flush_wait) {
        x->flush_wait = false;
        start_flush(x);
        return false;
    }
    return true;
}

/* Every transfer's waiting puts, from the loop. A drain may run callbacks
 * (a transfer's end, a peer's failure) that change the lists: the peer is
 * held meanwhile, and the walk starts over after any change. */
void hpd_xfer_drain_all(hpd_xfer_ctx_t *c)
{
restart:
    if (c->n_waiting == 0)
        return;
    for (hpd_xfer_peer_t *p = c->peers; p != NULL; p = p->next) {
        if (p->failed || p->closed)
            continue;
        for (xfer_t *x = p->xfers; x != NULL; x = x->next) {
            if (x->pending == NULL)
                continue;
            p->refs++;
            const bool alive = drain(x);
            const bool changed = !alive || p->failed || p->closed;
            hpd_xfer_peer_unref(p);
            if (changed)
                goto restart;
        }
    }
}

/* The host stays at most MAX_WAITING batches ahead of the device work a
 * transfer's puts wait on: past that it waits for the oldest fence here
 * (looking every 20 us), so each batch goes out a bounded lag after its
 * fence even while the host enqueues the next layers and turns no loop;
 * the device always has the younger batches' work queued meanwhile. */
#define MAX_WAITING 2

static hpd_status_t wait_lag(xfer_t *x)
{
    while (x->n_pending > MAX_WAITING) {
        const pending_t *w = x->pending;
        if (hpd_backend_fence_query(w->backend, w->fence) == 0) {
            const struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (!drain(x))
            return HPD_ERR_IO; /* not finishing: only a failed peer ends it here */
        if (x->error != HPD_OK)
            return x->error;
    }
    return HPD_OK;
}

hpd_status_t hpd_xfer_put_after(hpd_xfer_peer_t *p, uint64_t xfer_id, const hpd_xfer_put_t *puts,
                                uint32_t n, hpd_backend_t *backend, void *fence)
{
    xfer_t *x;
    hpd_status_t st = HPD_OK;

    if (backend == NULL)
        fence = NULL; /* no backend, no fence */
    if (p->failed || p->closed)
        st = HPD_ERR_IO;
    else if ((st = check_puts(p, puts, n)) == HPD_OK &&
             (x = xfer_get(p, xfer_id, true)) == NULL)
        st = HPD_ERR_NO_MEMORY;
    if (st != HPD_OK) {
        if (backend != NULL)
            hpd_backend_fence_release(backend, fence);
        return st;
    }
    if (x->error != HPD_OK) {
        if (backend != NULL)
            hpd_backend_fence_release(backend, fence);
        return x->error;
    }
    /* what waits already goes first (the bytes are hashed in put order) */
    if (x->pending != NULL && (!drain(x) || x->error != HPD_OK)) {
        /* not finishing: drain ended it only if the peer failed */
        if (backend != NULL)
            hpd_backend_fence_release(backend, fence);
        return p->failed ? HPD_ERR_IO : x->error;
    }
    const int q = backend != NULL ? hpd_backend_fence_query(backend, fence) : 1;
    if (x->pending == NULL && q != 0) {
        if (backend != NULL)
            hpd_backend_fence_release(backend, fence);
        if (q < 0) {
            HPD_LOG_ERROR(LOG_COMPONENT,
                          "transfer %llu to node %llu: the device work its puts wait on failed",
                          (unsigned long long)xfer_id, (unsigned long long)p->node);
            return x->error = HPD_ERR_INTERNAL;
        }
        return issue(p, x, puts, n);
    }
    pending_t *w = malloc(sizeof(*w) + (size_t)n * sizeof(*puts));
    if (w == NULL) {
        hpd_backend_fence_release(backend, fence);
        return HPD_ERR_NO_MEMORY;
    }
    *w = (pending_t){.backend = backend, .fence = fence, .n = n};
    memcpy(w->puts, puts, (size_t)n * sizeof(*puts));
    if (x->pending == NULL) {
        x->pending = w;
        p->ctx->n_waiting++;
        hpd_xfer_arm_tick(p->ctx); /* the loop looks at the fence on every turn */
    } else {
        x->pending_last->next = w;
    }
    x->pending_last = w;
    x->n_pending++;
    return wait_lag(x);
}

hpd_status_t hpd_xfer_put(hpd_xfer_peer_t *p, uint64_t xfer_id, const hpd_xfer_put_t *puts,
                          uint32_t n)
{
    return hpd_xfer_put_after(p, xfer_id, puts, n, NULL, NULL);
}

static void on_notice_sent(void *request, ucs_status_t status, void *user_data)
{
    xfer_t *x = user_data;
    hpd_xfer_peer_t *p = x->peer;
    if (!hpd_xfer_orphan_done(x))
        hpd_xfer_transfer_end(x, status == UCS_OK ? HPD_OK : HPD_ERR_IO);
    hpd_xfer_request_done(request, p);
}

static void send_notice(xfer_t *x)
{
    hpd_xfer_peer_t *p = x->peer;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
                              .cb.send = on_notice_sent,
                              .user_data = x};
    ucs_status_ptr_t r;

    if (p->failed || p->closed) {
        hpd_xfer_finish_answered(x, HPD_ERR_IO);
        return;
    }
    r = ucp_am_send_nbx(p->ep, AM_DONE, &x->hdr, sizeof(x->hdr), x->dests,
                        (size_t)x->n_dests * sizeof(dest_t), &rp);
    if (r == NULL)
        hpd_xfer_finish_answered(x, HPD_OK);
    else if (hpd_xfer_track(p, r) != HPD_OK)
        hpd_xfer_finish_answered(x, HPD_ERR_IO);
}

/* ------------------------------------------------------------ deadlines */

#define RATE_SAMPLE_BYTES (1ull << 20)

#define PAIR_RATE_SAMPLE_BYTES (64u << 10)

/* The rate a deadline of a transfer to p assumes: a quarter of the pair's
 * measured rate; before the pair has one, a quarter of the node's link rate
 * (over every peer), at least min_rate (a link nothing was measured on). */
static double deadline_rate(const hpd_xfer_peer_t *p)
{
    const hpd_xfer_ctx_t *c = p->ctx;
    if (p->rate > 0)
        return HPD_MAX(p->rate / 4, 1e5);
    const double floor = c->p.min_rate > 0 ? c->p.min_rate : 10e6;
    return HPD_MAX(c->st.link_rate / 4, floor);
}

/* The fixed part of a deadline: deadline_ms, or DEADLINE_RTTS round trips
 * of the pair when longer. A probe still out makes the round trip at least
 * as long as it has been out, up to hpd_xfer_probe_cap (a slow link shows itself
 * before a first transfer completes on it; one that never answers fails
 * in time). */
static double deadline_base(const hpd_xfer_peer_t *p)
{
    double rtt = p->rtt;
    if (p->probing)
        rtt = HPD_MAX(rtt, HPD_MIN(hpd_time_now() - p->probe_t0, hpd_xfer_probe_cap(p->ctx, p->node)));
    return HPD_MAX(p->ctx->p.deadline_ms / 1e3, DEADLINE_RTTS * rtt);
}

static double deadline_s(const xfer_t *x)
{
    return deadline_base(x->peer) + (double)x->hdr.bytes / deadline_rate(x->peer);
}

/* A transfer missed its deadline: the pair is taken as failed. The
 * endpoint closes now, so that nothing more of this peer's queued puts
 * reaches the wire and the local bytes are free; the owner hears of it as
 * of any failed endpoint. */
static void arm_deadline(xfer_t *x);

/* The deadline timer fires at due (hpd_time_now()'s clock). */
static void set_due(xfer_t *x, double due)
{
    const double left = HPD_MAX(due - hpd_time_now(), 0.0);
    const uint64_t us = (uint64_t)(left * 1e6);
    const struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    x->due = due;
    evtimer_add(x->deadline, &tv);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    xfer_t *x = arg;
    hpd_xfer_peer_t *p = x->peer;
    hpd_xfer_ctx_t *c = p->ctx;

    if (p->failed || p->closed)
        return;
    /* a timer that fires more than 100 ms after it was due says this
     * process did not run (stopped, starved): the peer may not be late, and the
     * transfer gets its deadline again from now */
    if (hpd_time_now() - x->due > 0.1) {
        HPD_LOG_DEBUG(LOG_COMPONENT, "transfer %llu: the deadline timer fired %.0f ms late; "
                      "this process did not run, the deadline starts again",
                      (unsigned long long)x->id, (hpd_time_now() - x->due) * 1e3);
        arm_deadline(x);
        return;
    }
    /* what the pair showed meanwhile (its probe still out, a slower round
     * trip) may move the deadline */
    const double due = x->t_finish + deadline_s(x);
    if (due > hpd_time_now() + 0.001) {
        set_due(x, due);
        return;
    }
    HPD_LOG_WARN(LOG_COMPONENT, "transfer %llu to node %llu missed its deadline: %llu bytes "
                 "not acknowledged %.0f ms after the finish (%.0f ms + the bytes at %.1f MB/s; "
                 "the pair's round trip %.0f ms, rate %.1f MB/s); the endpoint is closed",
                 (unsigned long long)x->id, (unsigned long long)p->node,
                 (unsigned long long)x->hdr.bytes, (hpd_time_now() - x->t_finish) * 1e3,
                 deadline_base(p) * 1e3, deadline_rate(p) / 1e6, p->rtt * 1e3, p->rate / 1e6);
    c->st.deadlines_missed++;
    if (p->probing) {
        /* the endpoint never answered: a link slower to connect than the
         * allowance, or none at all; the next endpoint to this node gets
         * twice as long (TCP's backoff of its handshake, in spirit) */
        link_t *l = hpd_xfer_link_of(c, p->node);
        l->probe_cap = HPD_MIN(2 * l->probe_cap, PROBE_CAP_MAX_S);
        HPD_LOG_INFO(LOG_COMPONENT, "node %llu never answered on this endpoint; the next one "
                     "may take %.0f ms to answer before its transfers are late",
                     (unsigned long long)p->node, DEADLINE_RTTS * l->probe_cap * 1e3);
    }
    p->failed = true;
    p->refs++; /* the callbacks below may disconnect it */
    hpd_xfer_fail_transfers(p, HPD_ERR_TIMEOUT); /* x becomes an orphan */
    hpd_xfer_close_ep(p); /* cancels the flush: the orphan goes */
    if (!p->closed && c->p.on_peer_error != NULL)
        c->p.on_peer_error(c->p.arg, p, HPD_ERR_TIMEOUT);
    hpd_xfer_peer_unref(p);
}

static void arm_deadline(xfer_t *x)
{
    hpd_xfer_ctx_t *c = x->peer->ctx;
    if (c->p.deadline_ms == 0 || c->p.base == NULL)
        return;
    if (x->deadline == NULL && (x->deadline = evtimer_new(c->p.base, on_deadline, x)) == NULL)
        return; /* out of memory: this transfer goes without */
    /* the puts went out while the sender computed; what is left of them
     * is at most the whole transfer */
    x->t_finish = hpd_time_now();
    set_due(x, x->t_finish + deadline_s(x));
}

/* Every put landed: the link rate is sampled, then the notice goes. */
static void flushed(xfer_t *x)
{
    hpd_xfer_peer_t *p = x->peer;
    hpd_xfer_ctx_t *c = p->ctx;
    const double now = hpd_time_now(), dt = now - x->t_first;
    const double sample = dt > 0 ? (double)x->hdr.bytes / dt : 0;
    if (x->hdr.bytes >= RATE_SAMPLE_BYTES && dt > 0)
        c->st.link_rate = hpd_xfer_ewma(c->st.link_rate, sample);
    /* the pair's own: its rate, and the flush's latency as a round trip
     * (with what was still queued: an upper bound) */
    if (x->hdr.bytes >= PAIR_RATE_SAMPLE_BYTES && dt > 0) {
        p->rate = hpd_xfer_ewma(p->rate, sample);
        hpd_xfer_link_of(c, p->node)->rate = p->rate;
    }
    if (x->t_flush > 0 && now >= x->t_flush)
        hpd_xfer_sample_rtt(p, now - x->t_flush);
    send_notice(x);
}

static void on_flushed(void *request, ucs_status_t status, void *user_data)
{
    xfer_t *x = user_data;
    hpd_xfer_peer_t *p = x->peer;

    if (hpd_xfer_orphan_done(x))
        ;
    else if (status == UCS_OK)
        flushed(x);
    else
        hpd_xfer_transfer_end(x, HPD_ERR_IO);
    hpd_xfer_request_done(request, p);
}

/* Every put issued: the endpoint is flushed, then the notice goes (or
 * the transfer ends with the error a fence or a put left). */
static void start_flush(xfer_t *x)
{
    hpd_xfer_peer_t *p = x->peer;
    ucs_status_ptr_t r;

    if (x->error != HPD_OK) {
        hpd_xfer_transfer_end(x, x->error);
        return;
    }
    x->hdr.checksum = XXH3_64bits_digest(x->hash) ^ (x->corrupt ? 1 : 0);
    x->hdr.n_dests = x->n_dests;
    if (x->t_first == 0) /* no puts */
        x->t_first = hpd_time_now();
    /* from here the peer answers for the time: every byte is on its way
     * (the device work the puts waited on is not the peer's) */
    arm_deadline(x);
    x->t_flush = hpd_time_now();
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.send = on_flushed,
                              .user_data = x};
    /* every put of this endpoint lands before the notice is sent */
    r = ucp_ep_flush_nbx(p->ep, &rp);
    if (r == NULL) {
        if (!hpd_xfer_orphan_done(x)) /* the endpoint did not fail inside the flush */
            flushed(x);
    } else if (hpd_xfer_track(p, r) != HPD_OK) {
        hpd_xfer_finish_answered(x, HPD_ERR_IO);
    }
}

hpd_status_t hpd_xfer_finish(hpd_xfer_peer_t *p, uint64_t xfer_id, hpd_xfer_done_cb_t cb,
                             void *arg, bool corrupt_for_test)
{
    xfer_t *x;

    if (p->failed || p->closed)
        return HPD_ERR_IO;
    if ((x = xfer_get(p, xfer_id, true)) == NULL)
        return HPD_ERR_NO_MEMORY;
    x->cb = cb;
    x->cb_arg = arg;
    x->finishing = true;
    x->corrupt = corrupt_for_test;
    x->hdr.magic = NOTICE_MAGIC;
    x->hdr.sender = p->ctx->p.node_id;
    x->hdr.xfer_id = xfer_id;
    x->flush_wait = true;
    drain(x); /* flushes now when nothing waits */
    return HPD_OK;
}
