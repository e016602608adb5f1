/* A guard in front of an evhttp server: the connection budget
 * (transport/budget.h) and the key check before evhttp reads a byte of a
 * request's body (docs/operations.md, "Connection limits").
 *
 * The guard makes each connection's bufferevent (evhttp_set_bevcb) and
 * reads its bytes before evhttp does: until the connection is admitted,
 * evhttp is not woken for them (a read watermark) until the request's head
 * (request line and headers) is complete and the owner's screen said what
 * to do with it:
 * - HPD_HTTP_ADMIT: the head carries a good key. The connection is
 *   authenticated (its credential kept for hpd_http_guard_close_if) and
 *   evhttp reads it from then on, as it would without the guard;
 * - HPD_HTTP_PUBLIC: this one request passes (a GET of /healthz; it may
 *   carry no body); what else the client sends is dropped and the
 *   connection closes once the answer is out;
 * - HPD_HTTP_REJECT: the guard answers it (status and body from the
 *   screen, `Connection: close`), drops what else comes and closes.
 * A connection that has not been admitted must complete its head within
 * head_timeout_ms, may hold at most max_head bytes, and counts in the
 * process's held bytes; at most max_unauthed of them are open at once,
 * the oldest closed to make room for a newer one once it had 250 ms to
 * send its head (a burst of newer ones may hold up to four times
 * max_unauthed meanwhile; past that the oldest goes at once). A connection
 * the budget has no descriptor for evicts the oldest unauthenticated one,
 * or is answered 503 and closed. An accept() that fails (out of descriptors)
 * pauses the listener for 100 ms with one warning a second, never a busy
 * loop.
 *
 * The guard learns of a connection's end from evhttp's close callback:
 * the owner sets its own through hpd_http_guard_set_closecb, never
 * evhttp_connection_set_closecb. */
#ifndef HPD_TRANSPORT_HTTP_GUARD_H
#define HPD_TRANSPORT_HTTP_GUARD_H

#include <event2/event.h>
#include <event2/http.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transport/budget.h"

typedef struct hpd_http_guard hpd_http_guard_t;

typedef enum { HPD_HTTP_ADMIT, HPD_HTTP_PUBLIC, HPD_HTTP_REJECT } hpd_http_verdict_t;

/* A request's head, as the screen sees it (NUL-terminated copies). */
typedef struct {
    const char *method;
    const char *path;          /* the target without its query */
    const char *authorization; /* the Authorization header's value; NULL: none */
    bool has_body;             /* a Content-Length above 0 or a Transfer-Encoding */
} hpd_http_head_t;

/* What the screen fills in: for REJECT the answer, for ADMIT the
 * credential. */
typedef struct {
    int status;
    const char *content_type; /* NULL: text/plain */
    char body[512];
    uint64_t credential;
} hpd_http_answer_t;

typedef hpd_http_verdict_t (*hpd_http_screen_cb_t)(void *arg, const hpd_http_head_t *head,
                                                   hpd_http_answer_t *answer);

typedef struct {
    struct event_base *base;
    hpd_conn_budget_t *budget; /* NULL: the process's */
    hpd_conn_class_t cls;      /* what its connections take from the budget */
    const char *name;          /* in log lines: "http api", "metrics" */
    uint32_t max_unauthed;     /* 0: 64 */
    uint32_t head_timeout_ms;  /* 0: 5000 */
    size_t max_head;           /* 0: 16 KiB */
    hpd_http_screen_cb_t screen;
    void *arg;
} hpd_http_guard_params_t;

typedef struct {
    uint32_t open, unauthenticated; /* now */
    uint64_t admitted, public_requests, rejected;
    uint64_t evicted;       /* unauthenticated, closed to make room */
    uint64_t head_timeouts; /* a head not complete in head_timeout_ms */
    uint64_t refused;       /* no descriptor in the budget (answered 503) */
    uint64_t accept_errors; /* accept() failed */
    uint64_t revoked;       /* closed by hpd_http_guard_close_if */
    double last_refused;    /* hpd_time_now() of the last refusal or accept error; 0: never */
} hpd_http_guard_stats_t;

/* Puts a guard in front of http (evhttp_set_bevcb): call before it binds. */
hpd_status_t hpd_http_guard_create(struct evhttp *http, const hpd_http_guard_params_t *params,
                                   hpd_http_guard_t **guard_p);

/* Binds http to host:port (0: any free port) with the accept-error pause;
 * *port_p is the port bound. HPD_ERR_IO: the address is taken. */
hpd_status_t hpd_http_guard_bind(hpd_http_guard_t *guard, const char *host, uint16_t port,
                                 uint16_t *port_p);

/* Closes every admitted connection for which pred says so (its credential
 * was revoked), streams too: their evhttp connections are freed from the
 * loop, as at shutdown. Returns how many. */
uint32_t hpd_http_guard_close_if(hpd_http_guard_t *guard,
                                 bool (*pred)(uint64_t credential, void *arg), void *arg);

/* evhttp_connection_set_closecb for a connection of the guard's (cb NULL:
 * none): the guard's own close callback calls it first. */
void hpd_http_guard_set_closecb(hpd_http_guard_t *guard, struct evhttp_connection *evcon,
                                void (*cb)(struct evhttp_connection *evcon, void *arg),
                                void *arg);

void hpd_http_guard_stats(const hpd_http_guard_t *guard, hpd_http_guard_stats_t *stats_p);

/* Call after evhttp_free of its server (which closes every connection).
 * Accepts NULL. */
void hpd_http_guard_destroy(hpd_http_guard_t *guard);

#endif
