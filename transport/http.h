/* The operations endpoint of every process: /metrics (Prometheus text) and
 * /healthz over HTTP, served by libevent's evhttp on the process's own loop;
 * and a small blocking GET for hpdctl and the tests (docs/operations.md). */
#ifndef HPD_TRANSPORT_HTTP_H
#define HPD_TRANSPORT_HTTP_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/status.h"
#include "transport/budget.h"

typedef struct hpd_http hpd_http_t;

typedef struct {
    struct event_base *base;
    const char *host;       /* address to bind */
    uint16_t port;          /* 0: any free port (see hpd_http_port) */
    hpd_metrics_t *metrics; /* rendered by GET /metrics; owned by the caller */
    /* optional: refresh gauges just before a scrape */
    void (*collect)(void *arg);
    /* GET /healthz: true answers 200, false 503; the body is msg (one line) */
    bool (*health)(void *arg, char *msg, size_t len);
    void *arg;
    hpd_conn_budget_t *budget; /* NULL: the process's (transport/budget.h) */
} hpd_http_params_t;

/* What the server reads of one request: headers beyond HPD_HTTP_MAX_HEADERS
 * bytes or a body beyond HPD_HTTP_MAX_BODY are refused (the connection is
 * answered with an error or closed), never buffered. A guard
 * (transport/http_guard.h) stands in front: connections count in the
 * process's budget as the operator's (HPD_CONN_OPERATOR), at most 16 wait
 * for a request at once, each request head must come within 5 s, and
 * anything but a GET without a body is answered before evhttp sees it. */
#define HPD_HTTP_MAX_HEADERS (16u << 10)
#define HPD_HTTP_MAX_BODY (64u << 10)

/* Binds and serves GET /metrics and /healthz from params->base (HPD_ERR_IO:
 * the port is taken). */
hpd_status_t hpd_http_create(const hpd_http_params_t *params, hpd_http_t **http_p);
uint16_t hpd_http_port(const hpd_http_t *http);
void hpd_http_destroy(hpd_http_t *http);

/* GET http://host:port/path on a private loop, waiting at most timeout_ms.
 * On HPD_OK *code_p is the HTTP status and *body_p the malloc'd,
 * NUL-terminated body (may be NULL when not wanted). HPD_ERR_IO: no
 * connection or no answer; HPD_ERR_TIMEOUT. */
hpd_status_t hpd_http_get(const char *host, uint16_t port, const char *path, uint32_t timeout_ms,
                          int *code_p, char **body_p);

#endif
