/* UCX data plane (see xfer.h).
 *
 * Who frees what: the context owns its regions and peers. A peer is freed
 * when it has been disconnected (or its context destroyed) and no UCX
 * request that points at it is still in flight (refs). A transfer is owned
 * by its peer until its completion message was sent or it failed; its done
 * callback runs exactly once. */
#include "transport/xfer.h"

#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "xfer"
#define AM_DONE 7  /* active message id of the completion notice */
#define AM_HELLO 8 /* a sender's first message on a new endpoint */
#define AM_BYE 9   /* a sender's last message before it closes an endpoint */

typedef struct {
    uint32_t region;
    uint32_t pad;
    uint64_t offset;
    uint64_t bytes;
} dest_t;

/* The completion notice's header; the destinations follow as data. */
typedef struct {
    uint64_t magic;
    uint64_t sender;
    uint64_t xfer_id;
    uint64_t checksum;
    uint64_t bytes;
    uint32_t n_dests;
    uint32_t pad;
} notice_hdr_t;

#define NOTICE_MAGIC 0x6870642d78667232ull /* "hpd-xfr2": the checksum of pieces */
/* the notice before the checksum of pieces (one XXH3 over the bytes) */
#define NOTICE_MAGIC_V1 0x6870642d78666572ull /* "hpd-xfer" */
#define HELLO_MAGIC 0x6870642d68656c6full  /* "hpd-hello" */
#define BYE_MAGIC 0x6870642d6279652eull    /* "hpd-bye." */

/* The hello's header: who writes from the endpoint it came on. */
typedef struct {
    uint64_t magic;
    uint64_t sender;
} hello_hdr_t;

/* Puts waiting on a backend fence (hpd_xfer_put_after), in order. */
typedef struct pending {
    struct pending *next;
    hpd_backend_t *backend;
    void *fence;
    uint32_t n;
    hpd_xfer_put_t puts[];
} pending_t;

typedef struct xfer {
    struct xfer *next;
    hpd_xfer_peer_t *peer;
    uint64_t id;
    XXH3_state_t *hash;
    dest_t *dests;
    uint32_t n_dests;
    size_t cap_dests;
    notice_hdr_t hdr;
    bool finishing;
    bool ended; /* callback delivered; a UCX request still points here */
    /* puts waiting on fences, first to last; a finish waits for them
     * (flush_wait) before it flushes; a fence that failed is the
     * transfer's error, reported by its finish */
    pending_t *pending, *pending_last;
    uint32_t n_pending;
    bool flush_wait, corrupt;
    hpd_status_t error;
    hpd_xfer_done_cb_t cb;
    void *cb_arg;
    double t_first;         /* first put (or the finish, without puts) */
    double t_finish, due;
    double t_flush; /* its flush was issued (0: not yet) */
    struct event *deadline; /* while finishing, with deadlines on */
} xfer_t;

typedef struct {
    void *base; /* what peers write: the memory itself, or its host mirror */
    size_t len;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    /* a pool in a device backend's memory (hpd_xfer_register_pool) */
    hpd_backend_t *backend;
    void *device; /* the pool; == base when UCX writes it directly */
    bool pinned;  /* base was registered with the backend */
} region_t;

typedef struct {
    uint64_t base, len;
    ucp_rkey_h rkey;
    uint8_t *mapped; /* the region mapped into this process (ucp_rkey_ptr), or NULL */
} remote_region_t;

struct hpd_xfer_peer {
    hpd_xfer_ctx_t *ctx;
    hpd_xfer_peer_t *next;
    ucp_ep_h ep;
    uint64_t node;
    remote_region_t regions[HPD_XFER_MAX_REGIONS];
    uint32_t n_regions;
    xfer_t *xfers;
    uint32_t refs;     /* 1 while connected + one per UCX request in flight */
    uint32_t inflight; /* UCX requests in flight on this peer */
    bool failed, closed;
    bool ep_closed; /* a missed deadline closed the endpoint already */
    hello_hdr_t hello, bye; /* bye: lives while its request does */
    /* what deadlines of transfers to it assume: its link's measured rate
     * and round trip (flush latencies), each 0 until measured; the probe
     * is the flush behind the hello, out since probe_t0 */
    double rate, rtt, probe_t0;
    bool probing;
};

/* A link to a node as the deadlines of transfers to it see it: its last
 * round trip and rate, and how long a probe of a new endpoint that is
 * still out may count as its round trip (probe_cap: doubled each time a
 * pair missed a deadline before its endpoint ever answered, back to the
 * first when one answers). */
typedef struct {
    uint64_t node;
    double rtt, rate, probe_cap;
    double used; /* when last written (hpd_time_now()); 0: a free entry */
} link_t;

struct hpd_xfer_ctx {
    hpd_xfer_params_t p;
    ucp_context_h ucp;
    ucp_worker_h worker;
    ucp_address_t *address;
    size_t address_len;
    int efd;
    struct event *ev, *tick;
    region_t regions[HPD_XFER_MAX_REGIONS];
    uint32_t n_regions;
    hpd_xfer_peer_t *peers;
    hpd_xfer_peer_t *closing; /* disconnected, UCX requests still pending */
    xfer_t *orphans;          /* ended transfers a UCX request still points to */
    hpd_xfer_stats_t st;
    uint32_t n_waiting; /* transfers with puts waiting on fences */
    char tls[128];
    bool cuda;
    bool polling;
    /* the endpoints UCX made here for the senders writing into this
     * context (the completion notices' reply endpoints), by sender */
    struct {
        uint64_t node;
        ucp_ep_h ep;
        void *sentinel; /* a stream receive posted on ep (see watch_writer) */
    } writers[64];
    uint8_t sentinel_byte; /* where sentinels would receive (nothing is sent) */
    uint32_t n_writers;
    /* what this context learned of its links to other nodes: it outlives
     * their endpoints, so that a pair connected again is judged by what
     * it showed before (see link_of) */
    link_t links[64];
};

/* ------------------------------------------------------------ progress */

static void arm_tick_now(hpd_xfer_ctx_t *c);

/* Progress, bounded: a transport retrying towards a dead peer reports
 * progress forever, and the event loop must get its turn (the timer comes
 * back). Then arm the event fd, unless polling. */
static void progress_and_arm(hpd_xfer_ctx_t *c)
{
    for (int round = 0; round < 16; round++) {
        for (int i = 0; i < 256 && ucp_worker_progress(c->worker) != 0; i++)
            ;
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
static void arm_tick(hpd_xfer_ctx_t *c)
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

static void drain_all(hpd_xfer_ctx_t *c);

static void on_efd(evutil_socket_t fd, short what, void *arg)
{
    hpd_xfer_ctx_t *c = arg;
    drain_all(c);
    progress_and_arm(c);
    arm_tick(c);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    hpd_xfer_ctx_t *c = arg;
    drain_all(c);
    progress_and_arm(c);
    arm_tick(c);
}

void hpd_xfer_progress(hpd_xfer_ctx_t *c)
{
    drain_all(c);
    progress_and_arm(c);
    arm_tick(c);
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

static void peer_unref(hpd_xfer_peer_t *p)
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
static void drop_pending(xfer_t *x)
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
    drop_pending(x);
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
static void xfer_end(xfer_t *x, hpd_status_t st)
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
static void fail_transfers(hpd_xfer_peer_t *p, hpd_status_t st)
{
    xfer_t *x = p->xfers, *next;
    for (; x != NULL; x = next) {
        next = x->next;
        if (!x->finishing || x->flush_wait) { /* no UCX request points to it */
            xfer_end(x, st);
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
static bool orphan_done(xfer_t *x)
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
static void finish_answered(xfer_t *x, hpd_status_t st)
{
    if (!orphan_done(x))
        xfer_end(x, st);
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
    fail_transfers(p, HPD_ERR_IO);
    if (c->p.on_peer_error != NULL)
        c->p.on_peer_error(c->p.arg, p, HPD_ERR_IO);
}

/* A UCX request that holds a reference on the peer completed. */
static void request_done(void *request, hpd_xfer_peer_t *p)
{
    if (request != NULL)
        ucp_request_free(request);
    p->ctx->st.inflight--;
    p->inflight--;
    peer_unref(p);
}

static void on_put_done(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_peer_t *p = user_data;
    if (status != UCS_OK && !p->failed)
        on_ep_error(p, p->ep, status);
    request_done(request, p);
}

/* Counts a returned status pointer: in flight, done, or failed. */
static hpd_status_t track(hpd_xfer_peer_t *p, ucs_status_ptr_t r)
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
    arm_tick(p->ctx);
    return HPD_OK;
}

/* ------------------------------------------------------------ receiver */

/* Device memory peers write through a host mirror (base) */
static bool mirrored(const region_t *r)
{
    return r->device != NULL && r->device != r->base;
}

/* Pieces a backend hashes in one call: 1 GiB of data, its pieces table
 * within a staging slot, so that however large a transfer (or a peer's
 * notice) no buffer grows with it. */
#define HASH_BATCH_PIECES 16384u

/* Folds the pieces' hashes of spans of backend memory into the checksum, in
 * calls of at most HASH_BATCH_PIECES pieces (a span cut at a piece edge). */
static hpd_status_t hash_backend_spans(hpd_backend_t *be, const hpd_hash_span_t *spans,
                                       uint32_t n, XXH3_state_t *sum)
{
    hpd_hash_span_t batch[64];
    uint64_t *pieces = malloc(HASH_BATCH_PIECES * sizeof(*pieces));
    hpd_status_t st = pieces == NULL ? HPD_ERR_NO_MEMORY : HPD_OK;
    uint32_t nb = 0;
    uint64_t np = 0, done = 0; /* done: bytes of spans[i] already in a batch */

    for (uint32_t i = 0; i < n && st == HPD_OK;) {
        const uint64_t left = spans[i].bytes - done;
        const uint64_t take = HPD_MIN(left, (HASH_BATCH_PIECES - np) * HPD_HASH_PIECE_BYTES);
        if (take > 0) {
            batch[nb++] = (hpd_hash_span_t){(const uint8_t *)spans[i].ptr + done, take};
            np += hpd_hash_n_pieces(take);
            done += take;
        }
        if (done == spans[i].bytes)
            i++, done = 0;
        if (np == HASH_BATCH_PIECES || nb == HPD_ARRAY_SIZE(batch) || (i == n && nb > 0)) {
            st = hpd_backend_hash_pieces(
                be, &(hpd_hash_pieces_args_t){.spans = batch, .n_spans = nb, .out = pieces});
            for (uint64_t k = 0; k < np && st == HPD_OK; k++)
                hpd_hash_fold(sum, pieces[k]);
            nb = 0, np = 0;
        }
    }
    if (st != HPD_OK)
        HPD_LOG_ERROR(LOG_COMPONENT, "hashing %u received ranges in %s memory: %s", n,
                      be->ops->name, hpd_status_str(st));
    free(pieces);
    return st;
}

/* Adds the destinations' bytes to the checksum, piece by piece
 * (common/hash.h): host memory (a device pool's host mirror too) is hashed
 * here; device memory UCX wrote directly is hashed by its backend, on the
 * GPU where it lives, consecutive destinations of one backend together.
 * The destinations were checked against their regions. */
static hpd_status_t hash_dests(const hpd_xfer_ctx_t *c, const dest_t *d, uint32_t n,
                               XXH3_state_t *sum)
{
    hpd_hash_span_t *run = malloc((n ? n : 1) * sizeof(*run));
    hpd_backend_t *run_backend = NULL;
    uint32_t n_run = 0;
    hpd_status_t st = run == NULL ? HPD_ERR_NO_MEMORY : HPD_OK;

    for (uint32_t i = 0; i <= n && st == HPD_OK; i++) {
        dest_t e = {0};
        const region_t *r = NULL;
        bool direct = false;
        if (i < n) {
            memcpy(&e, d + i, sizeof(e));
            r = &c->regions[e.region];
            direct = r->device != NULL && !mirrored(r);
        }
        if (n_run > 0 && (i == n || !direct || r->backend != run_backend)) {
            st = hash_backend_spans(run_backend, run, n_run, sum);
            n_run = 0;
        }
        if (i == n || st != HPD_OK)
            continue;
        const uint8_t *bytes = (const uint8_t *)r->base + e.offset;
        if (direct) {
            run[n_run++] = (hpd_hash_span_t){bytes, e.bytes};
            run_backend = r->backend;
        } else {
            hpd_hash_put(sum, bytes, e.bytes);
        }
    }
    free(run);
    return st;
}

/* Forgets writer i: the endpoint UCX made for it is never touched again
 * (its sentinel, if still posted, completes when the endpoint goes, and
 * finds nothing). */
static void forget_writer(hpd_xfer_ctx_t *c, uint32_t i)
{
    c->writers[i] = c->writers[--c->n_writers];
}

/* A writer's sentinel completed: UCX cancels the receives posted on an
 * endpoint when it fails or closes, before it destroys an endpoint it made
 * (and it does, with no other word: such an endpoint is not the
 * application's), so the writer is forgotten before anything touches the
 * endpoint again. */
static void on_sentinel(void *request, ucs_status_t status, size_t length, void *user_data)
{
    hpd_xfer_ctx_t *c = user_data;
    for (uint32_t i = 0; i < c->n_writers; i++)
        if (c->writers[i].sentinel == request) {
            HPD_LOG_INFO(LOG_COMPONENT, "the connection of node %llu, which wrote here, "
                         "ended (%s)", (unsigned long long)c->writers[i].node,
                         ucs_status_string(status));
            forget_writer(c, i);
            break;
        }
    ucp_request_free(request);
}

/* Posts writer i's sentinel: a stream receive on its endpoint that nothing
 * ever completes but the endpoint's end. Without one (UCX refused it) the
 * writer cannot be watched and is not kept. */
static void watch_writer(hpd_xfer_ctx_t *c, uint32_t i)
{
    size_t len = 0;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_stream = on_sentinel,
                              .user_data = c};
    c->writers[i].sentinel = NULL;
    ucs_status_ptr_t r = ucp_stream_recv_nbx(c->writers[i].ep, &c->sentinel_byte, 1, &len, &rp);
    if (r == NULL || UCS_PTR_IS_ERR(r)) {
        HPD_LOG_WARN(LOG_COMPONENT, "node %llu's connection cannot be watched (%s): it "
                     "cannot be closed from this side", (unsigned long long)c->writers[i].node,
                     r == NULL ? "stream data arrived" : ucs_status_string(UCS_PTR_STATUS(r)));
        forget_writer(c, i);
        return;
    }
    c->writers[i].sentinel = r;
}

/* Remembers the endpoint UCX made here for a sender (the latest one per
 * sender: a sender that connected again writes from the new one), watched
 * by a sentinel. */
static void note_writer(hpd_xfer_ctx_t *c, uint64_t sender, const ucp_am_recv_param_t *param)
{
    uint32_t i = 0;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL)
        return;
    while (i < c->n_writers && c->writers[i].node != sender)
        i++;
    if (i < c->n_writers && c->writers[i].ep == param->reply_ep)
        return; /* known and watched */
    if (i == HPD_ARRAY_SIZE(c->writers)) {
        HPD_LOG_WARN(LOG_COMPONENT, "more than %zu senders write here: node %llu's "
                     "connection cannot be closed from this side", HPD_ARRAY_SIZE(c->writers),
                     (unsigned long long)sender);
        return;
    }
    /* an older endpoint's sentinel stays posted: it completes with that
     * endpoint, and finds nothing */
    c->writers[i].node = sender;
    c->writers[i].ep = param->reply_ep;
    c->n_writers += i == c->n_writers;
    watch_writer(c, i);
}

/* The sender of a hello or a bye (magic) that came eagerly with UCX's
 * endpoint back to it; false for anything else. */
static bool read_marker(const void *header, size_t header_length,
                        const ucp_am_recv_param_t *param, uint64_t magic, uint64_t *sender_p)
{
    hello_hdr_t h;
    if (header_length != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL)
        return false;
    memcpy(&h, header, sizeof(h));
    *sender_p = h.sender;
    return h.magic == magic;
}

static ucs_status_t on_hello(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    uint64_t sender;
    if (read_marker(header, header_length, param, HELLO_MAGIC, &sender))
        note_writer(arg, sender, param);
    return UCS_OK;
}

/* A sender closes its endpoint to here: the endpoint UCX made here for it
 * goes with it (UCX destroys an endpoint it made when its peer closes or
 * fails, UCX 1.22 at once), so it is forgotten now, before the close
 * arrives, and hpd_xfer_close_writer never touches it. A bye from an
 * older endpoint of a sender that connected again leaves the newer one. */
static ucs_status_t on_bye(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param)
{
    hpd_xfer_ctx_t *c = arg;
    uint64_t sender;
    if (!read_marker(header, header_length, param, BYE_MAGIC, &sender))
        return UCS_OK;
    for (uint32_t i = 0; i < c->n_writers; i++)
        if (c->writers[i].node == sender && c->writers[i].ep == param->reply_ep) {
            forget_writer(c, i);
            break;
        }
    return UCS_OK;
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    hpd_xfer_ctx_t *c = arg;
    notice_hdr_t h;
    hpd_xfer_notice_t n;
    XXH3_state_t *state;
    const dest_t *d = data;

    if (header_length != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "completion notice of %zu header bytes dropped",
                      header_length);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if (h.magic == NOTICE_MAGIC)
        note_writer(c, h.sender, param);
    else if (h.magic == NOTICE_MAGIC_V1)
        HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu refused: its notice has the "
                      "checksum of an older release (one XXH3 over the bytes; this node expects "
                      "XXH3 of 64 KiB pieces): run one release across the cluster",
                      (unsigned long long)h.xfer_id, (unsigned long long)h.sender);
    n.sender = h.sender;
    n.xfer_id = h.xfer_id;
    n.bytes = h.bytes;
    n.status = HPD_OK;
    if (h.magic != NOTICE_MAGIC || length != (size_t)h.n_dests * sizeof(dest_t) ||
        (state = XXH3_createState()) == NULL) {
        n.status = HPD_ERR_FORMAT;
    } else {
        uint64_t total = 0, room = 0;
        XXH3_64bits_reset(state);
        for (uint32_t i = 0; i < c->n_regions; i++)
            room += c->regions[i].len;
        for (uint32_t i = 0; i < h.n_dests && n.status == HPD_OK; i++) {
            dest_t e;
            memcpy(&e, d + i, sizeof(e));
            if (e.region >= c->n_regions || e.offset > c->regions[e.region].len ||
                e.bytes > c->regions[e.region].len - e.offset)
                n.status = HPD_ERR_FORMAT;
            total += e.bytes;
            /* a transfer writes each byte once: more than every region
             * holds (destinations repeated to make the receiver hash
             * without end) is refused before anything is read */
            if (n.status == HPD_OK && total > room) {
                HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu refused: its "
                              "destinations add up to more than the %llu bytes of this node's "
                              "regions", (unsigned long long)h.xfer_id,
                              (unsigned long long)h.sender, (unsigned long long)room);
                n.status = HPD_ERR_FORMAT;
            }
        }
        if (n.status == HPD_OK && total == h.bytes && hash_dests(c, d, h.n_dests, state) != HPD_OK)
            n.status = HPD_ERR_IO;
        if (n.status == HPD_OK && (total != h.bytes || XXH3_64bits_digest(state) != h.checksum))
            n.status = HPD_ERR_FORMAT;
        XXH3_freeState(state);
        if (n.status == HPD_OK && c->p.check_dests != NULL) {
            hpd_xfer_dest_t *dests = malloc((h.n_dests ? h.n_dests : 1) * sizeof(*dests));
            if (dests == NULL) {
                n.status = HPD_ERR_NO_MEMORY;
            } else {
                for (uint32_t i = 0; i < h.n_dests; i++) {
                    dest_t e;
                    memcpy(&e, d + i, sizeof(e));
                    dests[i] =
                        (hpd_xfer_dest_t){.region = e.region, .offset = e.offset, .bytes = e.bytes};
                }
                if (!c->p.check_dests(c->p.arg, &n, dests, h.n_dests)) {
                    n.status = HPD_ERR_INVALID_ARG;
                    HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu wrote where it "
                                  "was not allowed to", (unsigned long long)h.xfer_id,
                                  (unsigned long long)h.sender);
                }
                free(dests);
            }
        }
        /* mirrored device pools: the verified bytes move to the device now */
        for (uint32_t i = 0; i < h.n_dests && n.status == HPD_OK; i++) {
            dest_t e;
            memcpy(&e, d + i, sizeof(e));
            const region_t *r = &c->regions[e.region];
            if (mirrored(r) &&
                hpd_backend_from_host(r->backend, (uint8_t *)r->device + e.offset,
                                      (const uint8_t *)r->base + e.offset, e.bytes) != HPD_OK)
                n.status = HPD_ERR_IO;
        }
    }
    if (n.status == HPD_OK)
        c->st.notices_ok++;
    else {
        c->st.notices_bad++;
        if (n.status != HPD_ERR_INVALID_ARG)
            HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu failed its checks: %s",
                          (unsigned long long)h.xfer_id, (unsigned long long)h.sender,
                          hpd_status_str(n.status));
    }
    if (c->p.on_notice != NULL)
        c->p.on_notice(c->p.arg, &n);
    return UCS_OK;
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
                                 .id = AM_DONE, .cb = on_am, .arg = c};
    if ((us = ucp_worker_set_am_recv_handler(c->worker, &hp)) != UCS_OK)
        goto ucx_err;
    hp.id = AM_HELLO;
    hp.cb = on_hello;
    if ((us = ucp_worker_set_am_recv_handler(c->worker, &hp)) != UCS_OK)
        goto ucx_err;
    hp.id = AM_BYE;
    hp.cb = on_bye;
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
    arm_tick(c);
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

static void close_ep(hpd_xfer_peer_t *p);

/* Progresses the worker while requests are in flight, for a bounded time. */
static void drain_worker(hpd_xfer_ctx_t *c)
{
    for (int i = 0; i < 100 && c->worker != NULL && c->st.inflight > 0; i++)
        for (int k = 0; k < 256 && ucp_worker_progress(c->worker) != 0; k++)
            ;
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
        next = p->next; /* the close may complete p's last request, and free it */
        if (!p->ep_closed)
            close_ep(p);
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

#define DEADLINE_RTTS 4          /* a deadline allows this many round trips */
#define PROBE_COUNTS_UP_TO_S 1.5 /* a probe still out counts as an RTT this long at most, */
#define PROBE_CAP_MAX_S 6.0      /* or up to this after a pair never answered in time */

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
static link_t *link_of(hpd_xfer_ctx_t *c, uint64_t node)
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
    const link_t *l = link_of(c, p->node);
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
    request_done(request, user_data);
}

/* A moving average of samples (rates, round trips); 0: none yet. */
static double ewma(double avg, double sample)
{
    return avg > 0 ? 0.75 * avg + 0.25 * sample : sample;
}

/* A round trip of the link as the first sample of its RTT: the flush
 * behind the hello completes once the peer acknowledged it (the wireup
 * included: an upper bound, which is what a deadline wants). */
static void sample_rtt(hpd_xfer_peer_t *p, double seconds)
{
    p->rtt = ewma(p->rtt, seconds);
    link_of(p->ctx, p->node)->rtt = p->rtt;
}

/* The probe of a new endpoint came back: the pair answers, and a later new
 * endpoint to it gets the first allowance again. */
static void probe_answered(hpd_xfer_peer_t *p)
{
    sample_rtt(p, hpd_time_now() - p->probe_t0);
    link_of(p->ctx, p->node)->probe_cap = PROBE_COUNTS_UP_TO_S;
}

static void on_probe_flushed(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_peer_t *p = user_data;
    if (status == UCS_OK && p->probing)
        probe_answered(p);
    p->probing = false;
    request_done(request, p);
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
        (void)track(p, r);
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
    return track(p, ucp_am_send_nbx(p->ep, am_id, h, sizeof(*h), NULL, 0, &rp));
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
    request_done(request, user_data);
}

static void on_bye_flushed(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_peer_t *p = user_data;
    if (!p->ep_closed)
        close_ep(p);
    request_done(request, p);
}

/* Says goodbye to a healthy receiver (on_bye) and closes the endpoint once
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
    (void)track(p, r);
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
    fail_transfers(p, HPD_ERR_CANCELED);
    p->next = c->closing;
    c->closing = p;
    if (!p->ep_closed && (p->failed || !send_bye(p)))
        close_ep(p);
    peer_unref(p); /* the connection's reference */
}

/* Closes the endpoint at once: UCX cancels its requests (their callbacks
 * run with an error), and the peer is held until the close completed. */
static void close_ep(hpd_xfer_peer_t *p)
{
    hpd_xfer_ctx_t *c = p->ctx;
    p->ep_closed = true;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE,
                              .cb.send = on_close_done,
                              .user_data = p};
    p->refs++; /* the forced close may complete p's last request (a bye's flush) */
    ucs_status_ptr_t r = ucp_ep_close_nbx(p->ep, &rp);
    if (r != NULL && !UCS_PTR_IS_ERR(r)) {
        p->refs++;
        p->inflight++;
        c->st.inflight++;
        arm_tick(c);
    }
    peer_unref(p);
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
static double probe_cap(const hpd_xfer_ctx_t *c, uint64_t node)
{
    const link_t *l = link_find(c, node);
    return l != NULL ? l->probe_cap : PROBE_COUNTS_UP_TO_S;
}

double hpd_xfer_answer_allowance(const hpd_xfer_ctx_t *c, uint64_t node)
{
    return DEADLINE_RTTS * probe_cap(c, node);
}

bool hpd_xfer_peer_failed(const hpd_xfer_peer_t *p)
{
    return p->failed;
}

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
                                  .cb.send = on_put_done,
                                  .user_data = p};
        ucp_mem_h memh = local_memh(c, u->local, u->bytes);
        if (memh != NULL) {
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            rp.memh = memh;
        }
        st = track(p, ucp_put_nbx(p->ep, u->local, u->bytes,
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
            drop_pending(x);
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
static void drain_all(hpd_xfer_ctx_t *c)
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
            peer_unref(p);
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
        arm_tick(p->ctx); /* the loop looks at the fence on every turn */
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

hpd_status_t hpd_xfer_push_kv(hpd_xfer_peer_t *p, uint64_t xfer_id, const hpd_xfer_kv_args_t *a)
{
    const hpd_kv_layout_t *dl = a->dst_layout;
    const uint32_t B = dl->block_size, groups = hpd_kv_layout_n_groups(dl);
    const uint32_t j0 = a->first_token / B, j1 = HPD_DIV_UP(a->n_tokens, B);
    const uint32_t stride = groups > 0 ? a->staging_pages / groups : 0;
    const uint64_t page_bytes = hpd_kv_layout_page_bytes(dl);
    const uint32_t g0 = a->group == UINT32_MAX ? 0 : a->group;
    const uint32_t g1 = a->group == UINT32_MAX ? groups : a->group + 1;
    const uint32_t *tables[256];
    hpd_status_t st = HPD_OK;

    if (g1 > groups || groups > 256 || j1 > stride || a->first_token % B != 0 ||
        a->first_token >= a->n_tokens || (!a->last && a->n_tokens % B != 0))
        return HPD_ERR_INVALID_ARG;
    uint32_t *ids = malloc((size_t)groups * stride * sizeof(uint32_t));
    hpd_xfer_put_t *puts = malloc((j1 - j0) * sizeof(*puts));
    if (ids == NULL || puts == NULL) {
        free(ids);
        free(puts);
        return HPD_ERR_NO_MEMORY;
    }
    for (uint32_t g = 0; g < groups; g++) {
        for (uint32_t j = 0; j < stride; j++)
            ids[(size_t)g * stride + j] = g * stride + j;
        tables[g] = ids + (size_t)g * stride;
    }
    for (uint32_t g = g0; g < g1 && st == HPD_OK; g++) {
        const uint32_t first = g * dl->pack_size;
        hpd_kv_span_t src = a->src;
        src.pos = a->first_token;
        hpd_kv_translate_args_t t = {
            .src = src,
            .dst = {.layout = dl, .pool = a->staging, .tables = tables, .pos = a->first_token},
            .n_tokens = a->n_tokens - a->first_token,
            .zero_tail = a->last,
            .first_layer = first,
            .n_layers = HPD_MIN(dl->pack_size, dl->n_layers - first)};
        /* the NIC reads the staging buffer after the translation landed:
         * the puts wait on a fence after it */
        void *fence;
        if ((st = hpd_kv_translate(a->backend, &t)) != HPD_OK ||
            (st = hpd_backend_fence_record(a->backend, &fence)) != HPD_OK)
            break;
        for (uint32_t j = j0; j < j1; j++)
            puts[j - j0] = (hpd_xfer_put_t){.local = (const uint8_t *)a->staging +
                                                     (uint64_t)tables[g][j] * page_bytes,
                                            .region = a->dst_region,
                                            .offset = (uint64_t)a->dst_tables[g][j] * page_bytes,
                                            .bytes = page_bytes};
        st = hpd_xfer_put_after(p, xfer_id, puts, j1 - j0, a->backend, fence);
    }
    free(ids);
    free(puts);
    return st;
}

static void on_notice_sent(void *request, ucs_status_t status, void *user_data)
{
    xfer_t *x = user_data;
    hpd_xfer_peer_t *p = x->peer;
    if (!orphan_done(x))
        xfer_end(x, status == UCS_OK ? HPD_OK : HPD_ERR_IO);
    request_done(request, p);
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
        finish_answered(x, HPD_ERR_IO);
        return;
    }
    r = ucp_am_send_nbx(p->ep, AM_DONE, &x->hdr, sizeof(x->hdr), x->dests,
                        (size_t)x->n_dests * sizeof(dest_t), &rp);
    if (r == NULL)
        finish_answered(x, HPD_OK);
    else if (track(p, r) != HPD_OK)
        finish_answered(x, HPD_ERR_IO);
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
 * as long as it has been out, up to probe_cap (a slow link shows itself
 * before a first transfer completes on it; one that never answers fails
 * in time). */
static double deadline_base(const hpd_xfer_peer_t *p)
{
    double rtt = p->rtt;
    if (p->probing)
        rtt = HPD_MAX(rtt, HPD_MIN(hpd_time_now() - p->probe_t0, probe_cap(p->ctx, p->node)));
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
        link_t *l = link_of(c, p->node);
        l->probe_cap = HPD_MIN(2 * l->probe_cap, PROBE_CAP_MAX_S);
        HPD_LOG_INFO(LOG_COMPONENT, "node %llu never answered on this endpoint; the next one "
                     "may take %.0f ms to answer before its transfers are late",
                     (unsigned long long)p->node, DEADLINE_RTTS * l->probe_cap * 1e3);
    }
    p->failed = true;
    p->refs++; /* the callbacks below may disconnect it */
    fail_transfers(p, HPD_ERR_TIMEOUT); /* x becomes an orphan */
    if (!p->ep_closed)
        close_ep(p); /* cancels the flush: the orphan goes */
    if (!p->closed && c->p.on_peer_error != NULL)
        c->p.on_peer_error(c->p.arg, p, HPD_ERR_TIMEOUT);
    peer_unref(p);
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
        c->st.link_rate = ewma(c->st.link_rate, sample);
    /* the pair's own: its rate, and the flush's latency as a round trip
     * (with what was still queued: an upper bound) */
    if (x->hdr.bytes >= PAIR_RATE_SAMPLE_BYTES && dt > 0) {
        p->rate = ewma(p->rate, sample);
        link_of(c, p->node)->rate = p->rate;
    }
    if (x->t_flush > 0 && now >= x->t_flush)
        sample_rtt(p, now - x->t_flush);
    send_notice(x);
}

static void on_flushed(void *request, ucs_status_t status, void *user_data)
{
    xfer_t *x = user_data;
    hpd_xfer_peer_t *p = x->peer;

    if (orphan_done(x))
        ;
    else if (status == UCS_OK)
        flushed(x);
    else
        xfer_end(x, HPD_ERR_IO);
    request_done(request, p);
}

/* Every put issued: the endpoint is flushed, then the notice goes (or
 * the transfer ends with the error a fence or a put left). */
static void start_flush(xfer_t *x)
{
    hpd_xfer_peer_t *p = x->peer;
    ucs_status_ptr_t r;

    if (x->error != HPD_OK) {
        xfer_end(x, x->error);
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
        if (!orphan_done(x)) /* the endpoint did not fail inside the flush */
            flushed(x);
    } else if (track(p, r) != HPD_OK) {
        finish_answered(x, HPD_ERR_IO);
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

void hpd_xfer_stats(const hpd_xfer_ctx_t *c, hpd_xfer_stats_t *stats_p)
{
    *stats_p = c->st;
    stats_p->writers = c->n_writers;
}

static void on_writer_closed(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_ctx_t *c = user_data;
    if (request != NULL)
        ucp_request_free(request);
    c->st.inflight--;
}

hpd_status_t hpd_xfer_close_writer(hpd_xfer_ctx_t *c, uint64_t node)
{
    for (uint32_t i = 0; i < c->n_writers; i++) {
        if (c->writers[i].node != node)
            continue;
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                  UCP_OP_ATTR_FIELD_USER_DATA |
                                                  UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE,
                                  .cb.send = on_writer_closed,
                                  .user_data = c};
        HPD_LOG_INFO(LOG_COMPONENT, "closing the connection of node %llu, which wrote here: "
                     "nothing it still sends lands", (unsigned long long)node);
        /* forgotten first: the close completes its sentinel, maybe at once */
        const ucp_ep_h ep = c->writers[i].ep;
        forget_writer(c, i);
        ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
        if (r != NULL && !UCS_PTR_IS_ERR(r))
            c->st.inflight++;
        c->st.writers_closed++;
        return HPD_OK;
    }
    return HPD_ERR_NOT_FOUND;
}
