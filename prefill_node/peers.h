/* The prefill node's endpoints to decode nodes, one per decode node id,
 * shared by the jobs that push there (docs/cluster.md, "Failures"). An
 * endpoint that failed is replaced when a job needs that node again; while
 * older jobs still hold it, it is kept ("retired") and disconnected only
 * after the last of them is gone, never under a job that may still put
 * through it. Pure: the data plane and the job table are reached through
 * hpd_peers_ops_t, so that tests/prefill_node/test_peers.c scripts them. */
#ifndef HPD_PREFILL_NODE_PEERS_H
#define HPD_PREFILL_NODE_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct {
    /* a new endpoint from a decode node's info (opaque here) */
    hpd_status_t (*connect)(void *arg, const void *info, void **peer_p);
    void (*disconnect)(void *arg, void *peer);
    bool (*failed)(void *arg, const void *peer);
    /* whether a job still holds the endpoint */
    bool (*used)(void *arg, const void *peer);
    void *arg;
} hpd_peers_ops_t;

typedef struct {
    uint64_t node;
    void *peer;
    bool retired; /* failed and replaced while jobs still held it */
} hpd_peer_ent_t;

typedef struct {
    hpd_peers_ops_t ops;
    hpd_peer_ent_t *ents;
    size_t n, cap;
} hpd_peers_t;

void hpd_peers_init(hpd_peers_t *t, const hpd_peers_ops_t *ops);
/* Disconnects every endpoint and frees the table. */
void hpd_peers_destroy(hpd_peers_t *t);

/* The endpoint to decode node `node`: the one in use, or a new one from
 * info when there is none or it failed (the failed one is disconnected, or
 * retired while jobs hold it). */
hpd_status_t hpd_peers_get(hpd_peers_t *t, uint64_t node, const void *info, void **peer_p);

/* Disconnects the endpoints no job holds: the retired ones, or with `all`
 * every one. Call it from the loop, never inside a callback of an
 * endpoint. */
void hpd_peers_drop_unused(hpd_peers_t *t, bool all);

/* Whether a retired endpoint waits for its last job. */
bool hpd_peers_any_retired(const hpd_peers_t *t);

#endif
