/* The service shell every daemon runs in (the coordinator, prefill and
 * decode nodes): signals, the drain, and /metrics and /healthz, on the
 * process's event loop (docs/operations.md, "Stopping").
 *
 * The first SIGTERM or SIGINT drains: the role is told (drain), stops
 * taking work, and the shell polls in_flight until it reaches 0 or
 * drain_timeout_ms passes, then calls drained (the role ends the loop, after
 * what it still has to say). SIGUSR1 drains the same way for a restart
 * (hpd_service_restarting: the coordinator then leaves its nodes up). A
 * second signal, or a role that cannot drain (drain returns false), ends
 * the loop at once. SIGHUP calls reload when the role has one. The shell adds hpd_uptime_seconds to the role's
 * metrics. */
#ifndef HPD_SERVICE_SERVICE_H
#define HPD_SERVICE_SERVICE_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/status.h"

typedef struct hpd_service hpd_service_t;

typedef struct {
    struct event_base *base;
    const char *name;        /* in log lines: "coordinator", a node's name */
    const char *host;        /* the HTTP endpoint's address */
    int32_t metrics_port;    /* -1: no HTTP endpoint; 0: any free port */
    hpd_metrics_t *metrics;  /* the role's registry (owned by the role) */
    uint32_t drain_timeout_ms;
    void *arg;               /* passed to every callback */
    /* refresh the role's gauges before a scrape (optional) */
    void (*collect)(void *arg);
    /* /healthz: true answers 200, false 503; msg is the body (required) */
    bool (*health)(void *arg, char *msg, size_t len);
    /* the first signal: stop taking work; false: the role cannot drain now
     * and the loop ends at once (optional: without it, the loop ends) */
    bool (*drain)(void *arg);
    /* work not yet answered; the drain ends at 0 (optional: 0) */
    uint32_t (*in_flight)(void *arg);
    /* the drain is over, `left` jobs still open (the deadline passed);
     * optional: without it the loop ends at once */
    void (*drained)(void *arg, uint32_t left);
    /* SIGHUP (optional: SIGHUP is then left alone) */
    void (*reload)(void *arg);
} hpd_service_params_t;

/* Arms the signals and binds the HTTP endpoint (HPD_ERR_IO: the port is
 * taken; the error names it). */
hpd_status_t hpd_service_create(const hpd_service_params_t *params, hpd_service_t **svc_p);
/* The HTTP endpoint's port, 0 without one. */
uint16_t hpd_service_http_port(const hpd_service_t *svc);
bool hpd_service_draining(const hpd_service_t *svc);
/* The drain came from SIGUSR1: the process is to be started again. */
bool hpd_service_restarting(const hpd_service_t *svc);
/* Starts the drain as the first signal would (tests, the coordinator's
 * shutdown notice). */
void hpd_service_drain(hpd_service_t *svc);
void hpd_service_destroy(hpd_service_t *svc);

#endif
