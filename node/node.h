/* What a prefill node and a decode node share: options, the model, the
 * engine and its stepping from the event loop, the UCX context, the RPC
 * server, registration with the coordinator and heartbeats
 * (docs/cluster.md). A role (prefill_node/, decode_node/) adds its methods
 * and its per-step work through hpd_node_role_t. One thread, one loop. */
#ifndef HPD_NODE_NODE_H
#define HPD_NODE_NODE_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/metrics.h"
#include "engine/engine.h"
#include "node/proto.h"
#include "node/liveness.h"
#include "transport/http.h"
#include "transport/rpc.h"
#include "transport/xfer.h"

typedef struct hpd_node hpd_node_t;

#define HPD_NODE_MAX_COORDINATORS 8

typedef struct {
    /* the coordinator registered with (or tried next): one of the
     * coordinators given (a leader and its standbys, docs/cluster.md); a
     * registration that fails tries the next */
    char coordinator_host[64];
    uint16_t coordinator_port;
    hpd_endpoint_t coordinators[HPD_NODE_MAX_COORDINATORS];
    uint32_t n_coordinators, coordinator_at;
    const char *token_file;
    const char *model_dir;
    const char *name;
    const char *host;      /* address this node binds and announces */
    uint16_t port;         /* 0: any free port */
    const char *device;    /* "cpu" */
    uint32_t threads;
    uint32_t tp;           /* tensor-parallel ranks (CPU ranks; 0 or 1: none) */
    bool tp_fast;          /* hpd_model_load_tp's fast: other numerics */
    const char *ucx_tls;   /* default "tcp" */
    const char *ucx_dev;   /* default "lo" */
    hpd_engine_params_t engine;
    uint64_t staging_bytes;      /* prefill: the registered staging arena */
    uint32_t reserve_timeout_ms; /* decode: an unstarted reservation expires */
    uint32_t connect_timeout_ms; /* how long to retry reaching the coordinator */
    int32_t metrics_port;        /* HTTP /metrics and /healthz on host; -1: none */
    uint32_t drain_timeout_ms;   /* SIGTERM: work in flight may finish this long */
    uint32_t xfer_deadline_ms;   /* prefill: hpd_xfer_params_t.deadline_ms */
} hpd_node_opts_t;

typedef struct {
    const char *name; /* "prefill" or "decode" */
    const hpd_rpc_method_t *methods;
    size_t n_methods;
    /* peers write the engine's pools: in host memory they are allocated
     * through UCX (hpd_xfer_alloc), so that peers on this host with shared
     * memory transports map them and copy instead of putting */
    bool peers_write_pools;
    /* after the engine and the UCX context exist, before registration:
     * allocate the role's state and map its memory */
    hpd_status_t (*init)(hpd_node_t *node);
    /* packs one map of the role's load for heartbeats and stats */
    void (*pack_load)(hpd_node_t *node, msgpack_packer *pk);
    /* optional: the prefix summary heartbeats carry (*len_p 0: none) */
    void (*summary)(hpd_node_t *node, const void **data_p, uint32_t *len_p);
    /* after every engine step */
    void (*after_step)(hpd_node_t *node);
    void (*on_notice)(hpd_node_t *node, const hpd_xfer_notice_t *notice);
    /* optional: whether a verified transfer wrote only where allowed
     * (hpd_xfer_params_t.check_dests) */
    bool (*check_dests)(hpd_node_t *node, const hpd_xfer_notice_t *notice,
                        const hpd_xfer_dest_t *dests, uint32_t n_dests);
    void (*on_peer_error)(hpd_node_t *node, hpd_xfer_peer_t *peer, hpd_status_t status);
    /* the coordinator is gone (node.c: coordinator_lost): end every job it
     * gave, since nobody waits for their answers (it re-routed or failed
     * them), give back their pages and slots, and forget what is named by
     * its ids (a restarted coordinator hands out new ones) */
    void (*drop_jobs)(hpd_node_t *node, const char *why);
    void (*fini)(hpd_node_t *node);
    /* jobs not yet answered (a draining node stops when this reaches 0) */
    uint32_t (*in_flight)(hpd_node_t *node);
    /* optional: refresh the role's gauges before a scrape (the role
     * registers its metrics in node->metrics from init) */
    void (*collect)(hpd_node_t *node);
} hpd_node_role_t;

/* The metrics every node exports (docs/operations.md). */
typedef struct {
    hpd_metric_t *registered, *draining;
    hpd_metric_t *pages_used, *pages_total, *slots_used, *slots_total;
    hpd_metric_t *steps, *prefill_tokens, *decode_tokens;
    hpd_metric_t *lookup_tokens, *hit_device, *hit_host, *cache_pages;
    hpd_metric_t *xfer_bytes, *xfer_bytes_mapped, *xfer_ok, *xfer_failed;
    hpd_metric_t *notices_ok, *notices_bad, *xfer_open;
} hpd_node_metrics_t;

struct hpd_node {
    hpd_node_opts_t o;
    const hpd_node_role_t *role;
    void *role_data; /* the role's state (its init allocates it, node_destroy frees it) */
    struct event_base *base;
    hpd_model_t *model;     /* rank 0's (models[0]) */
    hpd_backend_t *backend; /* rank 0's (backends[0]) */
    hpd_model_t *models[HPD_TP_MAX];     /* every rank's (tensor parallelism) */
    hpd_backend_t *backends[HPD_TP_MAX];
    hpd_engine_t *engine;
    /* the model's tokenizer and its vocabulary, for structured outputs
     * (NULL without a tokenizer.json: such requests are refused) */
    struct hpd_tokenizer *tokenizer;
    hpd_vocab_t *vocab;
    hpd_xfer_ctx_t *xfer;
    hpd_rpc_server_t *server;
    hpd_rpc_client_t *coord;
    hpd_liveness_t *liveness; /* pings from a thread of its own (node/liveness.h) */
    uint32_t liveness_at;     /* ... to the coordinator of this index */
    char *token;
    uint64_t node_id;      /* the coordinator's id for this node (new at each registration) */
    uint32_t heartbeat_ms, lease_ms; /* from the registration */
    bool heartbeat_pending;
    bool registered;       /* false from the loss of the coordinator until registered again */
    bool registering;      /* a register call is out */
    uint32_t reg_attempts; /* since the start or the loss */
    double lost_at;        /* the loss of the coordinator (at start: the start) */
    uint64_t registrations;
    /* each register call's incarnation: the milliseconds since 2020 at the
     * start times 2^20, plus the calls made so far, so that a later call
     * (of this process or of a restart) has a larger one and the
     * coordinator refuses an older one that reaches it late */
    uint64_t incarnation0, reg_seq;
    char reg_error[200]; /* why the last register call failed */
    struct event *step_ev, *hb_ev, *reg_ev;
    double started;
    bool draining;  /* SIGTERM: no new work, stop when in_flight() is 0 */
    bool shutdown;  /* the coordinator said to stop */
    int exit_code;
    hpd_metrics_t *metrics;
    hpd_node_metrics_t m;
    struct hpd_service *service; /* signals, the drain, /metrics, /healthz */
};

/* Parses the command line, builds the node, registers and serves until a
 * signal or the coordinator's shutdown notice. When the coordinator is lost
 * (its connection closes, a heartbeat goes unanswered for the lease, or it no
 * longer knows the node) the node drops the coordinator's jobs, keeps its
 * caches, and registers again with backoff (100 ms doubling to 2 s) until
 * it succeeds or is stopped.
 * The first SIGTERM/SIGINT drains: heartbeats say so, the coordinator sends
 * no new work, and the node stops when its jobs are done (or after
 * --drain-timeout-ms); a second signal stops it at once. Returns the
 * process exit status: 0 after a signal or a shutdown notice, 2 for bad
 * options, 3 when the coordinator could not be reached at start
 * (--connect-timeout-ms), 1 for any other failure. */
int hpd_node_main(int argc, char **argv, const hpd_node_role_t *role);

/* Whether the node may write into other nodes' memory now: true unless
 * liveness pings are on, the coordinator answered one for this
 * registration, and the last it answered is older than its liveness lease
 * (the node may have been declared lost while it was stopped;
 * hpd_liveness_valid_until). Before the first answer the coordinator holds
 * no liveness lease on the node either. */
bool hpd_node_may_write(hpd_node_t *node);

/* Runs an engine step soon (from the loop); the node keeps stepping while
 * the engine has active requests. */
void hpd_node_kick(hpd_node_t *node);

/* A job's structured output (a message's grammar field, len bytes of
 * hpd_grammar_from_spec's JSON) compiled for this node's vocabulary into
 * *g_p; false with err naming what is wrong (what: the message's name),
 * or that this node has no tokenizer. */
bool hpd_node_grammar(hpd_node_t *node, const char *spec, uint32_t len, const char *what,
                      hpd_grammar_t **g_p, hpd_proto_err_t *err);

#endif
