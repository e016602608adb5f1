/* The coordinator as a library: the node registry, routing, the requests'
 * state machines (coordinator/request.h), token streaming, cancellation and
 * failover (docs/cluster.md). One context per coordinator, on the caller's
 * event loop; hpd-coordinator (coordinator/main.c) is its options and the
 * service shell around it. */
#ifndef HPD_COORDINATOR_COORDINATOR_H
#define HPD_COORDINATOR_COORDINATOR_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/status.h"

typedef struct hpd_coord hpd_coord_t;

typedef struct {
    const char *host;
    uint16_t port;                /* 0: any free port */
    const char *token_file;       /* NULL: an open coordinator */
    const char *client_keys_file; /* NULL: the token serves clients too */
    uint32_t heartbeat_ms, lease_ms;
    uint32_t liveness_ms; /* a node whose pinger is silent this long is lost; 0: off */
    uint32_t max_requests;
    uint32_t queue_timeout_ms;
    uint32_t max_attempts;
    uint32_t max_connections; /* 0: the RPC server's default */
    /* a request without temperature / top_p / top_k samples greedily instead
     * of with the model's generation defaults (which the nodes apply) */
    bool no_generation_defaults;
} hpd_coord_opts_t;

/* Listens and serves from base. On an error, err says what (a credentials
 * file that does not load, a port taken). */
hpd_status_t hpd_coord_create(struct event_base *base, const hpd_coord_opts_t *opts,
                              hpd_coord_t **coord_p, char *err, size_t err_len);
/* Answers every open request with "coordinator shutting down" and frees
 * all. */
void hpd_coord_destroy(hpd_coord_t *coord);

uint16_t hpd_coord_port(const hpd_coord_t *coord);
/* The coordinator's metrics (docs/operations.md), for the service shell. */
hpd_metrics_t *hpd_coord_metrics(hpd_coord_t *coord);
/* Refreshes the gauges (before a scrape). */
void hpd_coord_collect(hpd_coord_t *coord);
/* /healthz: ready while not draining and not refusing connections. */
bool hpd_coord_health(hpd_coord_t *coord, char *msg, size_t len);

/* The drain: new requests are refused ("draining"); open ones go on. */
void hpd_coord_drain(hpd_coord_t *coord);
uint32_t hpd_coord_open_requests(const hpd_coord_t *coord);
/* The end of the drain: requests still open fail (the deadline passed),
 * every node is told to shut down. The notices leave with the next turns
 * of the loop. */
void hpd_coord_end_drain(hpd_coord_t *coord);
/* SIGHUP: the credentials are read again; connections of revoked
 * credentials close. A file that does not load keeps the old ones. */
void hpd_coord_reload(hpd_coord_t *coord);

#endif
