/* One budget of descriptors and bytes per process, shared by every listener
 * of the process (the RPC server, the HTTP API, the metrics endpoint), so
 * that no listener can starve the others or the process's own outgoing
 * connections (docs/operations.md, "Connection limits").
 *
 * - Descriptors: of the soft RLIMIT_NOFILE, keep_fds are left for what is
 *   not a served connection (the node connections the coordinator opens,
 *   UCX, files, the pinger). Listeners share the rest; its last
 *   operator_fds go only to HPD_CONN_OPERATOR connections (/healthz and
 *   /metrics), so an operator can always look in.
 * - Bytes: what connections that have not authenticated yet hold buffered
 *   (an HTTP request's headers before its key is checked) is bounded
 *   across the process by max_held_bytes.
 *
 * A listener takes a descriptor before it keeps a connection and gives it
 * back when the connection closes; what it does when the budget says no
 * (evict one of its own unauthenticated connections, or refuse) is its
 * own policy. Thread-safe: listeners of several loops may share one. */
#ifndef HPD_TRANSPORT_BUDGET_H
#define HPD_TRANSPORT_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_conn_budget hpd_conn_budget_t;

typedef enum {
    HPD_CONN_SERVE = 0, /* a served connection: RPC, the HTTP API */
    HPD_CONN_OPERATOR,  /* /metrics and /healthz: may use the operator's reserve */
} hpd_conn_class_t;

typedef struct {
    uint32_t fd_limit;     /* 0: the soft RLIMIT_NOFILE (65536 at most) */
    uint32_t keep_fds;     /* 0: max(64, fd_limit / 8), at most fd_limit / 2 */
    uint32_t operator_fds; /* 0: 8 (of the listeners' share) */
    size_t max_held_bytes; /* 0: 16 MiB */
} hpd_conn_budget_params_t;

typedef struct {
    uint32_t fd_limit, listeners; /* the limit, and the listeners' share of it */
    uint32_t used, operator_used; /* descriptors held by listeners now */
    size_t held, max_held;        /* bytes held before authentication now, and the cap */
    uint64_t refused;             /* takes refused */
    uint64_t held_refused;        /* holds refused */
} hpd_conn_budget_stats_t;

hpd_status_t hpd_conn_budget_create(const hpd_conn_budget_params_t *params,
                                    hpd_conn_budget_t **budget_p);
/* Accepts NULL. Not for the process's budget. */
void hpd_conn_budget_destroy(hpd_conn_budget_t *budget);

/* The process's budget, made from the defaults on first use (never freed).
 * Listeners created with no budget of their own use it. */
hpd_conn_budget_t *hpd_conn_budget_process(void);

/* One descriptor for a connection of class cls: false when the class's
 * share is used up (the caller evicts or refuses). */
bool hpd_conn_budget_take(hpd_conn_budget_t *budget, hpd_conn_class_t cls);
void hpd_conn_budget_give(hpd_conn_budget_t *budget, hpd_conn_class_t cls);

/* bytes more held by a connection not yet authenticated: false (nothing
 * taken) when that would pass max_held_bytes. unhold gives them back. */
bool hpd_conn_budget_hold(hpd_conn_budget_t *budget, size_t bytes);
void hpd_conn_budget_unhold(hpd_conn_budget_t *budget, size_t bytes);

void hpd_conn_budget_stats(hpd_conn_budget_t *budget, hpd_conn_budget_stats_t *stats_p);

#endif
