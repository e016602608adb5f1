/* The data plane: UCX (ucp) RMA puts from prefill nodes into decode nodes'
 * registered page and slot pools (docs/protocol.md, "Data plane").
 *
 * A node maps its pools once (regions), publishes its worker address and the
 * packed rkeys (hpd_xfer_pack_info), and connects to peers from their info.
 * A sender pushes a transfer as a list of puts, possibly group by group as
 * prefill proceeds, then finishes it: the endpoint is flushed (every put has
 * landed) and an active message carries the transfer id, the destinations
 * and an XXH3-64 checksum of the bytes sent, which the receiver verifies
 * before it uses the data. Progress runs from the libevent loop through the
 * worker's event fd. A failed endpoint fails every transfer on it, on both
 * sides, through callbacks.
 *
 * While requests to live peers are in flight the context keeps a zero-delay
 * timer active, so a caller that turns the loop itself uses
 * event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK) (EVLOOP_NONBLOCK alone
 * would not return while the transfer lasts). */
#ifndef HPD_TRANSPORT_XFER_H
#define HPD_TRANSPORT_XFER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "transport/rpc.h"
#include "transport/xfer_info.h"

typedef struct hpd_xfer_ctx hpd_xfer_ctx_t;
typedef struct hpd_xfer_peer hpd_xfer_peer_t;

/* What a receiver learns when a sender finished a transfer. */
typedef struct {
    uint64_t sender;  /* the sender's node id */
    uint64_t xfer_id;
    uint64_t bytes;
    /* HPD_OK: checksum verified; HPD_ERR_FORMAT: mismatch; HPD_ERR_INVALID_ARG:
     * verified, but check_dests refused where it wrote */
    hpd_status_t status;
} hpd_xfer_notice_t;

/* Where a transfer wrote, as its notice names it. */
typedef struct {
    uint32_t region;
    uint64_t offset, bytes;
} hpd_xfer_dest_t;

typedef struct {
    struct event_base *base;
    uint64_t node_id;        /* carried in completion notices */
    const char *tls;         /* UCX_TLS for this context, e.g. "tcp" or "posix,sysv,cma";
                                NULL: the environment's */
    const char *net_devices; /* UCX_NET_DEVICES, e.g. "lo"; NULL: the environment's */
    /* Poll from a 1 ms timer instead of arming the worker's event fd. Forced
     * when the transports are shared memory only: UCX 1.13 can block inside
     * ucp_worker_arm once a shared-memory peer died. */
    bool polling;
    /* Every put goes through ucp_put_nbx, also into a peer's region that is
     * mapped here (by default such a put is a copy; benchmarks and tests
     * measure the other path with this). */
    bool ucx_puts;
    /* Device pools (hpd_xfer_register_pool) are registered as they are even
     * where UCX reports no CUDA support, as where it has it: peers write
     * them directly and the receiver hashes what landed through their
     * backend. For tests, whose backend poses as a device over host memory. */
    bool direct_pools;
    /* receiver: a transfer into this node completed (or failed its checksum) */
    void (*on_notice)(void *arg, const hpd_xfer_notice_t *notice);
    /* either side: an endpoint failed; every transfer on it has failed */
    void (*on_peer_error)(void *arg, hpd_xfer_peer_t *peer, hpd_status_t status);
    /* receiver, optional: whether a verified transfer wrote only where the
     * receiver allowed it (a decode node: the reservation's pages and slot).
     * False turns the notice into HPD_ERR_INVALID_ARG before anything of it
     * is used (a mirrored pool copies nothing to the device). */
    bool (*check_dests)(void *arg, const hpd_xfer_notice_t *notice, const hpd_xfer_dest_t *dests,
                        uint32_t n_dests);
    void *arg;
    /* Sender: a finished transfer that is not acknowledged (flushed and its
     * notice sent) within base + bytes / rate fails its peer with
     * HPD_ERR_TIMEOUT: the endpoint is closed at once (its requests are
     * cancelled; the local bytes are free again), every transfer on it
     * fails, and on_peer_error runs. Both come from the pair (this node and
     * that peer), not from a fixed rate: base is deadline_ms or 4 round
     * trips of the pair, whichever is longer (the round trip: the latency
     * of its flushes, the first the flush behind its hello; while that
     * probe is out, the time it has been out, up to 1.5 s); rate is a
     * quarter of the pair's measured rate (transfers of 64 KiB or more,
     * first put to acknowledgement), before it has one a quarter of the
     * node's link rate, at least min_rate (0: 10 MB/s). A deadline that
     * comes while the pair's figures moved it later is armed again.
     * deadline_ms 0: no deadlines. */
    uint32_t deadline_ms;
    double min_rate;
} hpd_xfer_params_t;

hpd_status_t hpd_xfer_create(const hpd_xfer_params_t *params, hpd_xfer_ctx_t **ctx_p);

/* Closes every peer (their transfers fail) and unmaps the regions. */
void hpd_xfer_destroy(hpd_xfer_ctx_t *ctx);

/* Sets the node id carried in notices and the packed info (a node learns
 * its id when it registers, after its context exists). */
void hpd_xfer_set_node_id(hpd_xfer_ctx_t *ctx, uint64_t node_id);

/* True when UCX can register CUDA memory directly (else GPU memory is staged
 * through pinned host buffers). */
bool hpd_xfer_cuda_supported(const hpd_xfer_ctx_t *ctx);

/* The transports UCX selected, for logs ("tcp/lo" style names). */
const char *hpd_xfer_tls(const hpd_xfer_ctx_t *ctx);

/* Maps [base, base + len) once (a page pool, a slot pool, a staging buffer).
 * Region ids are 0, 1, ... in registration order. Memory already mapped
 * from base (hpd_xfer_alloc's, say) keeps its region id. */
hpd_status_t hpd_xfer_register(hpd_xfer_ctx_t *ctx, void *base, size_t len, uint32_t *region_p);

/* Allocates len bytes through UCX and maps them as a region: with shared
 * memory transports (posix, sysv) a peer on this host maps it too, and its
 * puts into it become copies (no UCX request; see hpd_xfer_stats_t
 * bytes_mapped). *base_p is freed by hpd_xfer_destroy. */
hpd_status_t hpd_xfer_alloc(hpd_xfer_ctx_t *ctx, size_t len, void **base_p, uint32_t *region_p);

/* hpd_xfer_alloc, then pinned for a device backend (hpd_backend_host_register)
 * so that its kernels and copies reach it: a sender's staging buffer. */
hpd_status_t hpd_xfer_alloc_pinned(hpd_xfer_ctx_t *ctx, hpd_backend_t *backend, size_t len,
                                   void **base_p, uint32_t *region_p);

/* Maps a pool of backend memory (a receiver's page or slot pool). Host
 * memory is registered as it is. Device memory is registered directly when
 * UCX supports CUDA memory, and the receiver reads the received bytes back
 * to verify them; otherwise peers write a pinned host mirror of the pool,
 * and the bytes of a transfer move from the mirror into the pool once its
 * checksum verified, before on_notice runs. Offsets are the pool's either
 * way. */
hpd_status_t hpd_xfer_register_pool(hpd_xfer_ctx_t *ctx, hpd_backend_t *backend, void *pool,
                                    size_t len, uint32_t *region_p);

/* Packs {"node": id, "address": bin, "regions": [[base, len, rkey bin], ...]}
 * as one msgpack value into buf. */
hpd_status_t hpd_xfer_pack_info(const hpd_xfer_ctx_t *ctx, hpd_rpc_buf_t *buf);


/* Connects to a peer from its packed info (endpoint created once, rkeys
 * unpacked once). An info hpd_xfer_check_info refuses is refused with
 * HPD_ERR_FORMAT. */
hpd_status_t hpd_xfer_connect(hpd_xfer_ctx_t *ctx, const msgpack_object *info,
                              hpd_xfer_peer_t **peer_p);

/* Closes the endpoint; open transfers fail. */
void hpd_xfer_disconnect(hpd_xfer_peer_t *peer);

uint64_t hpd_xfer_peer_node(const hpd_xfer_peer_t *peer);
bool hpd_xfer_peer_failed(const hpd_xfer_peer_t *peer);
/* What deadlines to the peer assume: the pair's round trip and rate, 0
 * until measured (hpd_xfer_params_t.deadline_ms). */
void hpd_xfer_peer_link(const hpd_xfer_peer_t *peer, double *rtt_s_p, double *rate_p);
/* How long a new endpoint to node may take to answer (its first flush)
 * before transfers on it are late: 6 s, doubled each time one to node
 * missed a deadline without ever answering (up to 24 s), 6 s again once
 * one answers. What the pair showed (round trip, rate) also outlives its
 * endpoints: a pair connected again starts from it. */
double hpd_xfer_answer_allowance(const hpd_xfer_ctx_t *ctx, uint64_t node);

/* One put: bytes from local memory to (remote region, offset). */
typedef struct {
    const void *local;
    uint32_t region;
    uint64_t offset;
    uint64_t bytes;
} hpd_xfer_put_t;

/* Adds puts to transfer xfer_id (opened on first use). The local bytes must
 * stay unchanged until the transfer finishes. HPD_ERR_IO on a failed peer;
 * HPD_ERR_INVALID_ARG when a put falls outside the remote region. Behind
 * puts that wait on a fence (hpd_xfer_put_after) they wait too, in order;
 * else a mapped region's copy is done when this returns. */
hpd_status_t hpd_xfer_put(hpd_xfer_peer_t *peer, uint64_t xfer_id, const hpd_xfer_put_t *puts,
                          uint32_t n);

/* hpd_xfer_put for local bytes that a backend's ops, enqueued before
 * `fence` (hpd_backend_fence_record), are still writing: the puts wait, in
 * order behind the transfer's earlier ones, until the fence has passed,
 * looked at on every turn of the loop and at the transfer's next put or
 * finish. The host does not wait on the device for a layer, only when
 * more than two batches of a transfer wait: then this call waits for the
 * oldest, so each goes out a bounded lag after its fence while the host
 * enqueues further layers and turns no loop. The transport takes the fence
 * on every call, accepted or refused (given back once passed, refused, or
 * when the transfer ends); a NULL fence (or backend) is passed already.
 * Work behind a fence that failed fails the transfer with
 * HPD_ERR_INTERNAL (this node's device, not the peer): its later puts
 * return it and its finish reports it. */
hpd_status_t hpd_xfer_put_after(hpd_xfer_peer_t *peer, uint64_t xfer_id,
                                const hpd_xfer_put_t *puts, uint32_t n, hpd_backend_t *backend,
                                void *fence);

/* Ends a transfer: once no put waits on a fence, flush, then the
 * completion message. cb (may be NULL) runs once: HPD_OK when the message
 * was delivered to the wire, an error when the peer failed first
 * (HPD_ERR_TIMEOUT: it missed its deadline, see hpd_xfer_params_t.deadline_ms,
 * counted from the flush: the device work the puts waited on is not the
 * peer's time) or this node's device failed (HPD_ERR_INTERNAL).
 * corrupt_for_test sends a wrong checksum (fault injection for tests). */
typedef void (*hpd_xfer_done_cb_t)(void *arg, uint64_t xfer_id, hpd_status_t status);
hpd_status_t hpd_xfer_finish(hpd_xfer_peer_t *peer, uint64_t xfer_id, hpd_xfer_done_cb_t cb,
                             void *arg, bool corrupt_for_test);

/* Receiver: closes the connection a sender's puts arrive on (the endpoint
 * UCX made here for it, learned from the hello a sender sends first on
 * every new endpoint, and from its notices), so that nothing it still has
 * queued, in UCX or in its kernel's socket buffers, lands here: the
 * sender's endpoint fails. HPD_ERR_NOT_FOUND when that sender never spoke
 * here (it cannot have written either). Not a fence for a sender that
 * writes a region it mapped (shared memory on one host: its puts are
 * copies, see hpd_xfer_alloc). */
hpd_status_t hpd_xfer_close_writer(hpd_xfer_ctx_t *ctx, uint64_t node);

/* Drives UCX until nothing more progresses (the event loop does this by
 * itself; for code that waits outside the loop). */
void hpd_xfer_progress(hpd_xfer_ctx_t *ctx);

typedef struct {
    uint64_t puts, bytes_put;
    uint64_t bytes_mapped; /* of bytes_put, copied into a peer's region mapped here */
    uint64_t transfers_finished, transfers_failed;
    uint64_t notices_ok, notices_bad;
    uint32_t inflight; /* UCX requests not yet completed (towards a dead
                          shared-memory peer they may stay until destroy) */
    uint32_t open_transfers; /* transfers whose callback has not run */
    uint64_t deadlines_missed;
    uint32_t writers;        /* receiver: senders whose connection it can close */
    uint64_t writers_closed; /* hpd_xfer_close_writer */
    double link_rate; /* bytes/s measured (0: not yet), see deadline_ms */
} hpd_xfer_stats_t;

void hpd_xfer_stats(const hpd_xfer_ctx_t *ctx, hpd_xfer_stats_t *stats_p);

#endif
