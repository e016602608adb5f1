/* What the data plane's files share: transport/xfer.c (the context, its
 * regions and peers, UCX's progress, the links' figures), xfer_send.c (a
 * sender's transfers: puts, flushes, completion notices, deadlines) and
 * xfer_recv.c (a receiver's notices, checksums and writers). Not a public
 * header: nothing outside transport/ includes it. */
#ifndef HPD_TRANSPORT_XFER_INTERNAL_H
#define HPD_TRANSPORT_XFER_INTERNAL_H

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
    bool ep_closed; /* its close was asked for (a bye flushed, a deadline missed) */
    bool close_due; /* ... and waits for a turn of the loop outside UCX's callbacks */
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
    uint32_t closes_due;      /* peers whose endpoint close waits (close_due) */
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

/* deadlines (xfer_send.c) and the links' figures (xfer.c) */
#define DEADLINE_RTTS 4          /* a deadline allows this many round trips */
#define PROBE_COUNTS_UP_TO_S 1.5 /* a probe still out counts as an RTT this long at most, */
#define PROBE_CAP_MAX_S 6.0      /* or up to this after a pair never answered in time */

/* ---- xfer.c: progress, peers, links */
void hpd_xfer_arm_tick(hpd_xfer_ctx_t *c);
/* a peer's reference dropped (freed at the last) */
void hpd_xfer_peer_unref(hpd_xfer_peer_t *p);
/* a transfer's puts waiting on fences given back */
void hpd_xfer_drop_pending(xfer_t *x);
/* a transfer ended with st: its callback runs, it leaves its peer */
void hpd_xfer_transfer_end(xfer_t *x, hpd_status_t st);
/* every transfer on p failed with st */
void hpd_xfer_fail_transfers(hpd_xfer_peer_t *p, hpd_status_t st);
bool hpd_xfer_orphan_done(xfer_t *x);
void hpd_xfer_finish_answered(xfer_t *x, hpd_status_t st);
/* a UCX request on p completed */
void hpd_xfer_request_done(void *request, hpd_xfer_peer_t *p);
void hpd_xfer_on_put_done(void *request, ucs_status_t status, void *user_data);
/* a UCX request on p, counted while in flight */
hpd_status_t hpd_xfer_track(hpd_xfer_peer_t *p, ucs_status_ptr_t r);
link_t *hpd_xfer_link_of(hpd_xfer_ctx_t *c, uint64_t node);
double hpd_xfer_ewma(double avg, double sample);
void hpd_xfer_sample_rtt(hpd_xfer_peer_t *p, double seconds);
void hpd_xfer_close_ep(hpd_xfer_peer_t *p);
double hpd_xfer_probe_cap(const hpd_xfer_ctx_t *c, uint64_t node);

/* ---- xfer_send.c */
/* transfers whose puts wait on fences, pushed as far as they go */
void hpd_xfer_drain_all(hpd_xfer_ctx_t *c);

/* ---- xfer_recv.c: the active messages a context receives */
ucs_status_t hpd_xfer_on_hello(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param);
ucs_status_t hpd_xfer_on_bye(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param);
ucs_status_t hpd_xfer_on_am(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param);

#endif
