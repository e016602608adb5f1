/* Liveness pings from a thread of their own (docs/cluster.md, "Detecting a
 * stopped node").
 *
 * A node's heartbeats run on its event loop, between engine steps, so a
 * long step delays them and the coordinator's lease must be long. This
 * thread does nothing but ping: it has its own loop and its own
 * authenticated connection to the coordinator, and calls
 * `alive {node_id, key}` every period. It stops only when the whole process
 * stops (SIGSTOP, a debugger, a frozen VM, swapping to death), which is
 * what the coordinator's short liveness lease detects; a wedged event loop
 * is the heartbeat lease's business. The key, handed out with the node id
 * at registration, ties the pings to the registration that asked for them
 * (another connection holding the node secret cannot keep a stopped node
 * alive by guessing its id). */
#ifndef HPD_NODE_LIVENESS_H
#define HPD_NODE_LIVENESS_H

#include <stdint.h>

#include "common/status.h"

typedef struct hpd_liveness hpd_liveness_t;

typedef struct {
    const char *host; /* the coordinator */
    uint16_t port;
    const char *token; /* the node secret; NULL: none */
    const char *name;  /* for logs */
} hpd_liveness_params_t;

/* Starts the thread (it pings nothing until hpd_liveness_set). The
 * strings are copied. */
hpd_status_t hpd_liveness_start(const hpd_liveness_params_t *params, hpd_liveness_t **l_p);

/* Pings as node_id with key every period_ms; node_id 0 or period_ms 0:
 * stop pinging (the node is not registered). lease_ms: the coordinator's
 * liveness lease (hpd_liveness_valid_until). Any thread. */
void hpd_liveness_set(hpd_liveness_t *l, uint64_t node_id, uint64_t key, uint32_t period_ms,
                      uint32_t lease_ms);

/* Until when (an hpd_time_now() value) the coordinator surely still holds
 * this node alive: the send time of the last ping it answered plus the
 * lease (it counts the lease from the ping's arrival, later). 0 before the
 * first answer for the current registration. A node past it may have been
 * declared lost and must not write into other nodes' memory until a ping
 * is answered again (a lease-based self-fence: a process that was stopped
 * and resumes learns it before it writes). Any thread. */
double hpd_liveness_valid_until(hpd_liveness_t *l);

/* Pings answered with success so far. Any thread. */
uint64_t hpd_liveness_answered(hpd_liveness_t *l);

/* Stops and joins the thread. Accepts NULL. */
void hpd_liveness_stop(hpd_liveness_t *l);

#endif
