/* The coordinator's parts (coordinator/coordinator.h), inside: the node
 * registry (registry.c: registration, leases, liveness, the nodes'
 * summaries and health) and the core (coord.c: a request's life from its
 * submission to its answer, scheduling, hedging, metrics). The front doors
 * (msgdoor.c, openai.c) use coordinator.h only. */
#ifndef HPD_COORD_INTERNAL_H
#define HPD_COORD_INTERNAL_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/prefix_hash.h"
#include "common/metrics.h"
#include "common/u64map.h"
#include "coordinator/alive.h"
#include "coordinator/breaker.h"
#include "coordinator/choices.h"
#include "coordinator/coordinator.h"
#include "coordinator/credentials.h"
#include "coordinator/request.h"
#include "coordinator/routing.h"
#include "coordinator/text.h"
#include "node/proto.h"
#include "transport/rpc.h"

#define LOG_COMPONENT "coordinator"
#define SUMMARY_BYTES 8192
#define PREFILL_TIMEOUT_MS 600000
#define CALL_TIMEOUT_MS 30000
#define FULL_RETRY_MS 20 /* a decode node that had no room after all: try again after */
#define TICK_MS 100       /* leases, liveness and queue timeouts are checked this often */

typedef enum { ROLE_PREFILL, ROLE_DECODE } role_t;

typedef struct node {
    uint64_t id;
    role_t role;
    char name[64], host[64];
    char numerics[32]; /* its backend's arithmetic (register) */
    uint32_t tp;       /* its tensor-parallel degree (register; 1 without) */
    bool has_map;      /* it sent a shard map: heads are the whole model's */
    uint32_t heads[3]; /* KV, GDN key and GDN value heads its shard map covers */
    uint16_t port;
    uint64_t incarnation; /* of its register call (node.h): a lower one later is stale */
    hpd_breaker_t breaker; /* out of rotation after failed pairs (coordinator/breaker.h) */
    bool alive;
    bool draining; /* the node said it is finishing its work to stop: no new jobs */
    double lease_until;
    uint64_t alive_key;  /* its liveness pings name it (node/liveness.h) */
    hpd_alive_t liveness; /* its pings (coordinator/alive.h), with liveness on */
    bool suspect;         /* its pings stopped for its suspect window: no new work */
    hpd_coord_t *coord;
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
    /* its entry in the context's route view (while registered), kept up to
     * date by hpd_reg_view_sync; watched: its breaker's state changes
     * with time, so the view reads it again at each pick */
    size_t view_idx;
    bool in_view, watched;
    struct node *next;
} node_t;

/* One of a request's answers (n choices from one prompt; one without). */
typedef hpd_choice_t choice_t;

typedef struct req {
    uint64_t id;
    hpd_coord_sink_t sink;
    const void *owner; /* a msgpack client's connection (its cancel by tag, its close) */
    uint64_t tag;
    bool stopped;      /* every choice ended, one by its sink (a stop string): it finishes
                          (those choices as "stop") and the nodes let go of it */
    int32_t *prompt;
    uint32_t n_prompt, max_tokens;
    hpd_sampling_t sampling;
    int32_t *stop_ids; /* [n_stop] */
    uint32_t n_stop, min_tokens;
    bool ignore_eos;
    hpd_block_hash_t *hashes;
    /* its answers: n_ch choices from one prefill (choice c: seed + c), the
     * tokens with their log probabilities when asked for */
    choice_t ch[HPD_MAX_CHOICES];
    uint32_t n_ch;
    uint32_t top_logprobs;
    hpd_token_logprobs_t *plp; /* the prompt's ([n_prompt - 1]; NULL: not asked for) */
    bool have_plp;             /* they came */
    /* a front door of its own process (coordinator/door.h): its
     * "HOST:PORT", where the decode node streams the tokens from the
     * second on (owner is the door's connection, tag its id there);
     * empty: they come here */
    char door[72];
    char *grammar;             /* a structured output's spec (NULL: none), to the nodes */
    uint32_t grammar_len;
    hpd_req_fsm_t fsm;
    uint64_t job;          /* the current attempt's; 0 while queued */
    node_t *pnode, *dnode; /* the current attempt's nodes (NULL: none, or lost) */
    uint32_t dpages;       /* booked on dnode */
    uint64_t avoid_decode; /* the decode node of a pair that failed this request */
    uint64_t lost_writer;  /* the prefill node lost while pushing for this attempt */
    bool probe_p, probe_d; /* this attempt probes its prefill / decode node (breaker.h) */
    /* Hedging: a request whose node went suspect races a copy of itself
     * (its hedge, placed elsewhere, replaying what the client has); both
     * run, the first to finish answers and the other is canceled. A hedge
     * streams into its primary (bit-identical tokens: add_tokens keeps
     * each position once); it is never hedged itself, is not one of the
     * clients' open requests, and ends as soon as its primary does. */
    bool is_hedge;
    struct req *hedge;   /* the primary's running hedge (NULL: none) */
    struct req *primary; /* the hedge's primary (NULL: it ended: cancel the hedge) */
    uint32_t hedges;     /* hedges started for this request (attempts, for the client) */
    bool gave_up;        /* out of attempts while its hedge runs: the hedge is its last */
    bool own_over;       /* its own last attempt failed (counted in fsm.attempts) */
    char last_error[256];
    double t_submit, t_queued, t_first;
    uint32_t cached_tokens;
    float prefill_ms, push_ms, exposed_push_ms;
    struct req *next, *prev;
} req_t;

/* docs/operations.md lists these. */
typedef struct {
    hpd_metrics_t *reg;
    hpd_metric_t *ok, *failed, *canceled, *overloaded, *invalid, *retries;
    hpd_metric_t *ttft, *tpot, *duration, *queue_wait;
    hpd_metric_t *prompt_tokens, *generated_tokens, *cached_tokens;
    hpd_metric_t *queued, *running, *nodes_prefill, *nodes_decode, *nodes_draining;
    hpd_metric_t *node_losses, *pair_failures;
    hpd_metric_t *out_of_rotation, *breaker_openings, *suspects, *hedges, *hedge_wins;
    hpd_metric_t *finish_stop, *finish_length;
    hpd_metric_t *conns_authed, *conns_unauthed, *conns_refused, *conns_evicted;
    hpd_metric_t *auth_timeouts, *auth_failures;
} metrics_t;

struct hpd_coord {
    hpd_coord_opts_t o;
    struct event_base *base;
    hpd_rpc_server_t *server;
    char *token;
    node_t *nodes;
    node_t *dead; /* waiting for the reaper */
    req_t *reqs, *reqs_tail; /* in arrival order (a hedge after its primary) */
    uint32_t n_reqs;         /* the clients' (hedges not counted) */
    uint32_t n_all;          /* ... and the hedges */
    hpd_u64map_t node_ids; /* the registered nodes (c->nodes) by id */
    hpd_u64map_t jobs;     /* requests by their current attempt's job id */
    /* the registry as routing sees it (hpd_reg_route_view): an entry per
     * registered node, written when the node changes, not at each pick */
    hpd_route_node_t *view;
    node_t **view_map;
    size_t view_n, view_cap;
    node_t **watched; /* nodes whose breaker's state changes with time */
    size_t n_watched, watched_cap;
    uint64_t next_node, next_req, next_job;
    uint64_t stale_registrations; /* register calls refused as stale (older incarnation) */
    uint8_t fingerprint[16];
    bool have_fingerprint;
    hpd_block_hash_t root;
    struct event *tick, *reap, *sched;
    hpd_credentials_t *creds; /* NULL: an open coordinator (no token file) */
    hpd_text_t *text;         /* NULL: no model directory (token ids only) */
    uint64_t finished, failed, canceled, retried, hedged, rejected;
    metrics_t m;
    bool draining; /* no new requests; open ones go on */
    double last_tick;
    /* a front door's (opts.scheduler): its requests go there
     * (coordinator/door.h); NULL: this is the scheduler */
    struct hpd_door *door;
};

/* ------------------------------------------------------------ remote front doors
 * (doorlink.c: the scheduler's end of coordinator/door.h) */

void hpd_link_schedule(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg);
void hpd_link_unschedule(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                         void *arg);
void hpd_link_limits(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                     void *arg);

/* ------------------------------------------------------------ the registry */

node_t *hpd_reg_node_by_id(hpd_coord_t *c, uint64_t id);
const char *hpd_reg_role_name(const node_t *n);
/* Whether a node takes new work: registered, not draining, not suspect
 * and in rotation. */
bool hpd_reg_node_usable(const node_t *x, double now);
/* Whether some prefill node could take a prompt of n_prompt tokens now. */
bool hpd_reg_prefill_can_take(hpd_coord_t *c, uint32_t n_prompt);
/* The registry as the routing policy sees it (coordinator/routing.h):
 * [*n_p] nodes, map_p[i] the node of entry i; both the context's, valid
 * until the registry changes. Entries are written when their node
 * changes (hpd_reg_view_sync); only nodes whose breaker's state changes
 * with time are read again here. */
hpd_route_node_t *hpd_reg_route_view(hpd_coord_t *c, size_t *n_p, node_t ***map_p);
/* n changed what routing sees of it (its reservations, jobs, breaker,
 * draining, suspicion, summary): its view entry is written again. */
void hpd_reg_view_sync(node_t *n);
/* The view's first room (at the context's creation). */
hpd_status_t hpd_reg_view_init(hpd_coord_t *c);
/* A pair of nodes failed a request, or a probe of theirs succeeded
 * (coordinator/breaker.h). */
void hpd_reg_pair_failed(hpd_coord_t *c, node_t *p, node_t *d, const char *why);
void hpd_reg_pair_ok(node_t *p, node_t *d);
/* A node is lost (its connection closed, its lease or liveness lapsed):
 * out of the registry, its requests run again (hpd_core_node_gone). */
void hpd_reg_node_lost(hpd_coord_t *c, node_t *n, const char *why);
/* Leases and liveness, each tick. */
void hpd_reg_tick(hpd_coord_t *c, double now);
/* Frees the lost nodes (an event: never inside their clients' callbacks). */
void hpd_reg_on_reap(evutil_socket_t fd, short what, void *arg);
/* The nodes' RPC methods, and status. */
void hpd_reg_register(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                      void *arg);
void hpd_reg_alive(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg);
void hpd_reg_heartbeat(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg);
void hpd_reg_status(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg);

/* ------------------------------------------------------------ the core */

/* Looks at the queue on the loop's next turn. */
void hpd_core_schedule_soon(hpd_coord_t *c);
/* A decode node's notification (its tokens, or the end of an attempt). */
void hpd_core_on_node_notify(void *arg, const hpd_rpc_msg_t *msg);
/* What a node's loss and suspicion mean for the requests it holds. */
void hpd_core_node_gone(hpd_coord_t *c, node_t *n);
void hpd_core_node_suspect(hpd_coord_t *c, node_t *n, double now, uint32_t *hedged_p,
                           uint32_t *moved_p);

#endif
