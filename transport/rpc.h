/* msgpack-RPC over TCP on libevent: connection, server, client
 * (docs/protocol.md). One event loop per thread; nothing here blocks except
 * hpd_rpc_client_create and hpd_rpc_call_sync, which run the loop. */
#ifndef HPD_TRANSPORT_RPC_H
#define HPD_TRANSPORT_RPC_H

#include <event2/event.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/rpc_codec.h"

typedef struct hpd_rpc_conn hpd_rpc_conn_t;
typedef struct hpd_rpc_server hpd_rpc_server_t;
typedef struct hpd_rpc_client hpd_rpc_client_t;

/* A packed msgpack value (params or result) under construction. */
typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} hpd_rpc_buf_t;

void hpd_rpc_buf_init(hpd_rpc_buf_t *buf);
void hpd_rpc_buf_destroy(hpd_rpc_buf_t *buf);

/* ---------------------------------------------------------- connection */

/* on_msg: one decoded message; views valid during the call only.
 * on_close: called once when the connection closes (by either side, on a
 * protocol error or on close()); the connection is freed after it returns
 * unless references remain. */
typedef struct {
    void (*on_msg)(hpd_rpc_conn_t *conn, const hpd_rpc_msg_t *msg, void *arg);
    void (*on_close)(hpd_rpc_conn_t *conn, hpd_status_t why, void *arg);
    void *arg;
    size_t max_message; /* 0: HPD_RPC_DEFAULT_MAX_MESSAGE */
} hpd_rpc_conn_ops_t;

/* Wraps a connected socket (the connection owns it). */
hpd_status_t hpd_rpc_conn_create(struct event_base *base, int fd, const hpd_rpc_conn_ops_t *ops,
                                 hpd_rpc_conn_t **conn_p);

/* Queues bytes already packed as one message. HPD_ERR_IO once closing. */
hpd_status_t hpd_rpc_conn_send(hpd_rpc_conn_t *conn, const void *data, size_t len);

/* Closes, after flushing queued output when flush is set. Safe inside any
 * callback: the connection is freed only after every callback on it has
 * returned and every reference is dropped. */
void hpd_rpc_conn_close(hpd_rpc_conn_t *conn, bool flush);

/* References keep the memory valid (not the socket open) across deferred work. */
void hpd_rpc_conn_ref(hpd_rpc_conn_t *conn);
void hpd_rpc_conn_unref(hpd_rpc_conn_t *conn);
bool hpd_rpc_conn_is_open(const hpd_rpc_conn_t *conn);
/* Whether the peer closed its side already (its end of file waits behind
 * what was read): a request queued by a peer that gave up on it. */
bool hpd_rpc_conn_peer_gone(const hpd_rpc_conn_t *conn);
/* The kernel's retransmission timeout of the connection now (TCP_INFO's
 * tcpi_rto), in seconds; 0 where it is not TCP. */
double hpd_rpc_conn_rto(const hpd_rpc_conn_t *conn);
/* Drops the callbacks: nothing more is delivered to the owner. */
void hpd_rpc_conn_detach(hpd_rpc_conn_t *conn);
void hpd_rpc_conn_set_data(hpd_rpc_conn_t *conn, void *data);
void *hpd_rpc_conn_data(const hpd_rpc_conn_t *conn);
/* A pointer for the application (the server uses conn data itself; handlers
 * of a server's connections use this one). */
void hpd_rpc_conn_set_user(hpd_rpc_conn_t *conn, void *user);
void *hpd_rpc_conn_user(const hpd_rpc_conn_t *conn);

/* Replies and notifications; result/params hold exactly one packed object
 * (NULL packs nil). They are no-ops on a closed connection. */
hpd_status_t hpd_rpc_reply(hpd_rpc_conn_t *conn, uint32_t id, const hpd_rpc_buf_t *result);
hpd_status_t hpd_rpc_reply_error(hpd_rpc_conn_t *conn, uint32_t id, int64_t code,
                                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
hpd_status_t hpd_rpc_notify(hpd_rpc_conn_t *conn, const char *method,
                            const hpd_rpc_buf_t *params);

/* ---------------------------------------------------------- server */

/* A method handler. It answers with hpd_rpc_reply*() now or later (holding a
 * reference on conn); it never writes to the socket itself. */
typedef void (*hpd_rpc_handler_t)(hpd_rpc_conn_t *conn, uint32_t id,
                                  const msgpack_object *params, void *arg);

typedef struct {
    const char *name;
    hpd_rpc_handler_t fn;
    /* the roles (bits the application defines, given at authentication)
     * that may call it; 0: any authenticated connection */
    uint32_t roles;
    /* it takes notifications (hpd_rpc_client_notify; id is 0 and nothing
     * answers), not calls; a notification no method takes is dropped */
    bool notification;
} hpd_rpc_method_t;

/* Decides what a presented token may do: the roles it grants (0: refused)
 * and, in who, a name for logs and errors (a tenant, "node"); *credential_p
 * identifies the credential (e.g. a hash of the key) for
 * hpd_rpc_server_close_if. */
typedef uint32_t (*hpd_rpc_auth_cb_t)(void *arg, const char *token, size_t len, char *who,
                                      size_t who_len, uint64_t *credential_p);

typedef struct {
    struct event_base *base;
    const char *host;   /* address to bind, e.g. "127.0.0.1" */
    uint16_t port;      /* 0: any free port (see hpd_rpc_server_port) */
    const char *token;  /* shared secret; NULL: no authentication */
    const hpd_rpc_method_t *methods;
    size_t n_methods;
    void *arg;          /* passed to handlers */
    size_t max_message; /* 0: HPD_RPC_DEFAULT_MAX_MESSAGE */
    uint32_t max_conns; /* 0: the budget's; a connection beyond it is closed at once */
    /* the descriptors every listener of the process shares
     * (transport/budget.h); NULL: the process's */
    struct hpd_conn_budget *budget;
    /* optional: a connection closed (after its handlers' replies are moot) */
    void (*on_disconnect)(hpd_rpc_conn_t *conn, void *arg);
    /* Connections that have not authenticated yet are bounded apart, so
     * that idle or slow sockets cannot lock out clients and nodes: at most
     * max_unauthed (0: 64, or half of max_conns when less) at once (the
     * oldest is closed to make room for a new one, also when max_conns
     * connections are open: only authenticated ones make the server refuse
     * a connection), each closed after auth_timeout_ms (0: 5000) without a
     * successful auth, and none may send a message above max_auth_message
     * bytes (0: 4096) before it authenticates. */
    uint32_t max_unauthed;
    uint32_t auth_timeout_ms;
    size_t max_auth_message;
    /* optional: replaces the token check (token is then not used); called
     * with arg. Without it a connection that presents token (or any, when
     * token is NULL) gets every role. */
    hpd_rpc_auth_cb_t authenticate;
} hpd_rpc_server_params_t;

typedef struct {
    uint32_t open, unauthenticated; /* now */
    uint32_t max_conns;             /* the limit in force */
    uint64_t refused;       /* closed at accept: max_conns open */
    uint64_t evicted;       /* unauthenticated, closed to make room for a newer one */
    uint64_t auth_timeouts; /* unauthenticated for auth_timeout_ms */
    uint64_t auth_failures; /* a wrong token, or a first request other than auth */
    double last_refused;    /* hpd_time_now() of the last refusal; 0: never */
} hpd_rpc_server_stats_t;

void hpd_rpc_server_stats(const hpd_rpc_server_t *server, hpd_rpc_server_stats_t *stats_p);

/* What a server's connection authenticated as: its roles (0 before
 * authentication), its name (never NULL) and its credential. */
uint32_t hpd_rpc_conn_roles(const hpd_rpc_conn_t *conn);
const char *hpd_rpc_conn_who(const hpd_rpc_conn_t *conn);
uint64_t hpd_rpc_conn_credential(const hpd_rpc_conn_t *conn);

/* Closes every authenticated connection for which pred says so (e.g. its
 * credential was revoked). Not to be called from a handler of the server's
 * own connections. Returns how many it closed. */
uint32_t hpd_rpc_server_close_if(hpd_rpc_server_t *server,
                                 bool (*pred)(const hpd_rpc_conn_t *conn, void *arg), void *arg);

hpd_status_t hpd_rpc_server_create(const hpd_rpc_server_params_t *params,
                                   hpd_rpc_server_t **server_p);

/* Closes the listener and every connection. Accepts NULL. Not to be called
 * from a handler or callback of the server's own connections. */
void hpd_rpc_server_destroy(hpd_rpc_server_t *server);

uint16_t hpd_rpc_server_port(const hpd_rpc_server_t *server);

/* Reads a token file: its first line, without surrounding white space. */
hpd_status_t hpd_rpc_read_token(const char *path, char **token_p);

/* ---------------------------------------------------------- client */

/* reply is NULL when status is not HPD_OK (timeout, connection closed). */
typedef void (*hpd_rpc_reply_cb_t)(void *arg, hpd_status_t status, const hpd_rpc_msg_t *reply);

typedef struct {
    struct event_base *base;
    const char *host;
    uint16_t port;
    const char *token;      /* presented at connect when not NULL */
    uint32_t timeout_ms;    /* default per-call timeout; 0: 10 s */
    size_t max_message;
    void (*on_notify)(void *arg, const hpd_rpc_msg_t *msg);
    void (*on_close)(void *arg, hpd_status_t why);
    void *arg;
} hpd_rpc_client_params_t;

/* Connects and authenticates, running the loop until done or failed
 * (HPD_ERR_IO: no connection; HPD_ERR_INVALID_ARG: token refused). */
hpd_status_t hpd_rpc_client_create(const hpd_rpc_client_params_t *params,
                                   hpd_rpc_client_t **client_p);

/* The same without running the loop (for code already inside it): the TCP
 * connect is made now, the token is sent as the first call and calls may
 * follow at once; a refused token closes the connection (on_close runs and
 * the queued calls fail). */
hpd_status_t hpd_rpc_client_connect(const hpd_rpc_client_params_t *params,
                                    hpd_rpc_client_t **client_p);

/* A notification to the server (a method of its that takes them):
 * nothing answers it. HPD_ERR_IO: the connection is closed. */
hpd_status_t hpd_rpc_client_notify(hpd_rpc_client_t *client, const char *method,
                                   const hpd_rpc_buf_t *params);

/* Fails pending calls with HPD_ERR_CANCELED and closes. Accepts NULL. */
void hpd_rpc_client_destroy(hpd_rpc_client_t *client);

/* Sends a request; cb runs once with the reply, a timeout or a close.
 * timeout_ms 0 uses the client's default. */
hpd_status_t hpd_rpc_call(hpd_rpc_client_t *client, const char *method,
                          const hpd_rpc_buf_t *params, uint32_t timeout_ms,
                          hpd_rpc_reply_cb_t cb, void *arg);

/* A reply kept beyond its callback. */
typedef struct {
    hpd_status_t status;  /* HPD_OK, HPD_ERR_TIMEOUT, HPD_ERR_IO (closed) */
    bool is_error;        /* the server answered with an error object */
    int64_t error_code;
    char error_message[256];
    msgpack_zone zone;
    msgpack_object result; /* strings point into raw (msgpack-c is zero-copy) */
    char *raw;
} hpd_rpc_result_t;

/* The blocking form: runs the loop until the reply, timeout or close.
 * Returns result->status; free with hpd_rpc_result_destroy. */
hpd_status_t hpd_rpc_call_sync(hpd_rpc_client_t *client, const char *method,
                               const hpd_rpc_buf_t *params, uint32_t timeout_ms,
                               hpd_rpc_result_t *result);
void hpd_rpc_result_destroy(hpd_rpc_result_t *result);

bool hpd_rpc_client_is_open(const hpd_rpc_client_t *client);
/* The server refused the token (a connect's auth answered with an error). */
bool hpd_rpc_client_refused(const hpd_rpc_client_t *client);

#endif
