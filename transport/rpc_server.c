/* The msgpack-RPC server: a listener, a method table and authentication.
 *
 * Who frees what: the server owns its listener and a list of its open
 * connections; a connection removes itself from the list in on_close, and is
 * freed by rpc_conn.c once nothing references it. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"
#include "transport/budget.h"
#include "transport/rpc.h"
#include "transport/rpc_internal.h"

#define LOG_COMPONENT "rpc_server"

typedef struct conn_node {
    hpd_rpc_conn_t *conn;
    hpd_rpc_server_t *server;
    bool authed, closing;
    bool has_fd; /* holds a descriptor of the budget */
    uint32_t roles;
    uint64_t credential;
    char who[64];
    struct event *auth_timer; /* until authenticated */
    struct conn_node *prev, *next;
} conn_node_t;

struct hpd_rpc_server {
    hpd_rpc_server_params_t p;
    char *token;
    struct evconnlistener *listener;
    struct event *resume_accept; /* after accept() failed (out of descriptors) */
    hpd_conn_budget_t *budget;   /* the process's, unless the params name one */
    uint16_t port;
    conn_node_t *conns; /* newest first */
    uint32_t n_conns, n_unauthed;
    uint32_t max_conns, max_unauthed;
    hpd_rpc_server_stats_t st;
};

static void set_authed(hpd_rpc_server_t *s, conn_node_t *node, uint32_t roles)
{
    if (node->authed)
        return;
    node->authed = true;
    node->roles = roles;
    s->n_unauthed--;
    if (node->auth_timer != NULL) {
        event_free(node->auth_timer);
        node->auth_timer = NULL;
    }
    hpd_rpc_conn_set_max_message(node->conn, s->p.max_message);
}

/* Constant-time comparison of the presented token. */
static bool token_ok(const char *want, const char *got, uint32_t len)
{
    const size_t n = strlen(want);
    unsigned char diff = (unsigned char)(n != len);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(want[i] ^ (i < len ? got[i] : 0));
    return diff == 0;
}

static void on_msg(hpd_rpc_conn_t *conn, const hpd_rpc_msg_t *msg, void *arg)
{
    hpd_rpc_server_t *s = arg;
    conn_node_t *node = hpd_rpc_conn_data(conn);

    if (msg->type != HPD_RPC_REQUEST) {
        if (msg->type == HPD_RPC_NOTIFY && node->authed) {
            /* a method that takes notifications (one its roles may send);
             * any other is dropped: nothing answers a notification */
            for (size_t i = 0; i < s->p.n_methods; i++) {
                const hpd_rpc_method_t *m = &s->p.methods[i];
                if (m->notification &&
                    hpd_rpc_str_eq(msg->method, msg->method_len, m->name) &&
                    (m->roles == 0 || (m->roles & node->roles) != 0)) {
                    m->fn(conn, 0, msg->params, s->p.arg);
                    break;
                }
            }
            return;
        }
        hpd_rpc_conn_invalid(conn, NULL, "the server takes requests only");
        return;
    }
    if (!node->authed) {
        const msgpack_object *p = msg->params;
        if (hpd_rpc_str_eq(msg->method, msg->method_len, "auth")) {
            const bool shaped = p->type == MSGPACK_OBJECT_ARRAY && p->via.array.size == 1 &&
                                p->via.array.ptr[0].type == MSGPACK_OBJECT_STR;
            uint32_t roles = 0;
            if (s->p.authenticate != NULL) {
                if (shaped)
                    roles = s->p.authenticate(s->p.arg, p->via.array.ptr[0].via.str.ptr,
                                              p->via.array.ptr[0].via.str.size, node->who,
                                              sizeof(node->who), &node->credential);
            } else if (s->token == NULL ||
                       (shaped && token_ok(s->token, p->via.array.ptr[0].via.str.ptr,
                                           p->via.array.ptr[0].via.str.size))) {
                roles = UINT32_MAX;
            }
            if (roles != 0) {
                set_authed(s, node, roles);
                hpd_rpc_buf_t r;
                hpd_rpc_buf_init(&r);
                hpd_rpc_pack_str(&r.pk, "hybridpd");
                hpd_rpc_reply(conn, msg->id, &r);
                hpd_rpc_buf_destroy(&r);
                return;
            }
        }
        if (s->token != NULL || s->p.authenticate != NULL) {
            s->st.auth_failures++;
            HPD_LOG_WARN(LOG_COMPONENT, "connection refused: %s",
                         hpd_rpc_str_eq(msg->method, msg->method_len, "auth")
                             ? "wrong token"
                             : "first request is not auth");
            hpd_rpc_reply_error(conn, msg->id, HPD_RPC_ERR_AUTH,
                                "authentication failed: send [\"auth\", [token]] first with "
                                "the cluster token");
            hpd_rpc_conn_close(conn, true);
            return;
        }
        set_authed(s, node, UINT32_MAX); /* no token configured: open server */
    }
    if (hpd_rpc_str_eq(msg->method, msg->method_len, "ping")) {
        hpd_rpc_buf_t r;
        hpd_rpc_buf_init(&r);
        hpd_rpc_pack_str(&r.pk, "pong");
        hpd_rpc_reply(conn, msg->id, &r);
        hpd_rpc_buf_destroy(&r);
        return;
    }
    for (size_t i = 0; i < s->p.n_methods; i++) {
        const hpd_rpc_method_t *m = &s->p.methods[i];
        if (m->notification || !hpd_rpc_str_eq(msg->method, msg->method_len, m->name))
            continue;
        if (m->roles != 0 && (m->roles & node->roles) == 0) {
            HPD_LOG_WARN(LOG_COMPONENT, "refused '%s' to a connection authenticated as %s",
                         m->name, node->who[0] ? node->who : "a client");
            hpd_rpc_reply_error(conn, msg->id, HPD_RPC_ERR_AUTH,
                                "method '%s' is not allowed with the credential of this "
                                "connection (%s)", m->name,
                                node->who[0] ? node->who : "no role for it");
            return;
        }
        m->fn(conn, msg->id, msg->params, s->p.arg);
        return;
    }
    hpd_rpc_reply_error(conn, msg->id, HPD_RPC_ERR_NO_METHOD, "unknown method '%.*s'",
                        (int)msg->method_len, msg->method);
}

static void on_close(hpd_rpc_conn_t *conn, hpd_status_t why, void *arg)
{
    hpd_rpc_server_t *s = arg;
    conn_node_t *node = hpd_rpc_conn_data(conn);

    if (s->p.on_disconnect != NULL)
        s->p.on_disconnect(conn, s->p.arg);
    if (!node->authed)
        s->n_unauthed--;
    if (node->has_fd)
        hpd_conn_budget_give(s->budget, HPD_CONN_SERVE);
    if (node->auth_timer != NULL)
        event_free(node->auth_timer);
    if (node->prev)
        node->prev->next = node->next;
    else
        s->conns = node->next;
    if (node->next)
        node->next->prev = node->prev;
    s->n_conns--;
    free(node);
    hpd_rpc_conn_set_data(conn, NULL);
}

static void on_auth_timeout(evutil_socket_t fd, short what, void *arg)
{
    conn_node_t *node = arg;
    hpd_rpc_server_t *s = node->server;
    s->st.auth_timeouts++;
    HPD_LOG_DEBUG(LOG_COMPONENT, "closing a connection that did not authenticate in %u ms",
                  s->p.auth_timeout_ms ? s->p.auth_timeout_ms : 5000);
    hpd_rpc_conn_close(node->conn, false); /* on_close frees node */
}

/* Closes the oldest connection that has not authenticated (false: none). */
static bool evict_unauthed(hpd_rpc_server_t *s)
{
    conn_node_t *oldest = NULL;
    for (conn_node_t *n = s->conns; n != NULL; n = n->next)
        if (!n->authed)
            oldest = n;
    if (oldest == NULL)
        return false;
    s->st.evicted++;
    HPD_LOG_DEBUG(LOG_COMPONENT, "%u connections have not authenticated (limit %u): closing "
                  "the oldest", s->n_unauthed, s->max_unauthed);
    hpd_rpc_conn_close(oldest->conn, false);
    return true;
}

static void refuse(hpd_rpc_server_t *s, evutil_socket_t fd, const char *why)
{
    /* one line a second at most: a flood must not flood the log too */
    if (hpd_time_now() - s->st.last_refused >= 1.0)
        HPD_LOG_WARN(LOG_COMPONENT, "refusing connections: %s (%llu refused so far)", why,
                     (unsigned long long)s->st.refused + 1);
    s->st.refused++;
    s->st.last_refused = hpd_time_now();
    evutil_closesocket(fd);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr,
                      int len, void *arg)
{
    hpd_rpc_server_t *s = arg;
    const size_t max = s->p.max_message ? s->p.max_message : HPD_RPC_DEFAULT_MAX_MESSAGE;
    const size_t before_auth = s->p.max_auth_message ? s->p.max_auth_message : 4096;
    const bool auth = s->token != NULL || s->p.authenticate != NULL;
    hpd_rpc_conn_ops_t ops = {.on_msg = on_msg,
                              .on_close = on_close,
                              .arg = s,
                              .max_message = auth ? HPD_MIN(max, before_auth) : max};
    const uint32_t timeout_ms = s->p.auth_timeout_ms ? s->p.auth_timeout_ms : 5000;
    const struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    conn_node_t *node;

    /* room first from connections that have not authenticated */
    if (s->n_unauthed > 0 && (s->n_unauthed >= s->max_unauthed || s->n_conns >= s->max_conns))
        evict_unauthed(s);
    if (s->n_conns >= s->max_conns) {
        char why[96];
        snprintf(why, sizeof(why), "%u authenticated connections open (limit %u)", s->n_conns,
                 s->max_conns);
        refuse(s, fd, why);
        return;
    }
    /* the process's descriptors are shared with its other listeners */
    bool has_fd = hpd_conn_budget_take(s->budget, HPD_CONN_SERVE);
    if (!has_fd && evict_unauthed(s))
        has_fd = hpd_conn_budget_take(s->budget, HPD_CONN_SERVE);
    if (!has_fd) {
        refuse(s, fd, "the process's connection budget is used up");
        return;
    }
    if ((node = calloc(1, sizeof(*node))) == NULL) {
        hpd_conn_budget_give(s->budget, HPD_CONN_SERVE);
        refuse(s, fd, "out of memory");
        return;
    }
    node->server = s;
    node->has_fd = true;
    if ((node->auth_timer = evtimer_new(s->p.base, on_auth_timeout, node)) == NULL ||
        hpd_rpc_conn_create(s->p.base, fd, &ops, &node->conn) != HPD_OK) {
        if (node->auth_timer != NULL)
            event_free(node->auth_timer);
        hpd_conn_budget_give(s->budget, HPD_CONN_SERVE);
        evutil_closesocket(fd);
        free(node);
        return;
    }
    evtimer_add(node->auth_timer, &tv);
    hpd_rpc_conn_set_data(node->conn, node);
    node->next = s->conns;
    if (s->conns)
        s->conns->prev = node;
    s->conns = node;
    s->n_conns++;
    s->n_unauthed++;
}

static void on_resume_accept(evutil_socket_t fd, short what, void *arg)
{
    hpd_rpc_server_t *s = arg;
    evconnlistener_enable(s->listener);
}

/* accept() failed: out of file descriptors, most likely. Accepting again at
 * once would spin (the pending connection stays): pause 100 ms. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    hpd_rpc_server_t *s = arg;
    static const struct timeval pause = {0, 100 * 1000};
    const int err = EVUTIL_SOCKET_ERROR();
    if (hpd_time_now() - s->st.last_refused >= 1.0)
        HPD_LOG_WARN(LOG_COMPONENT, "accept failed: %s; pausing new connections for 100 ms",
                     evutil_socket_error_to_string(err));
    s->st.refused++;
    s->st.last_refused = hpd_time_now();
    evconnlistener_disable(l);
    evtimer_add(s->resume_accept, &pause);
}

uint32_t hpd_rpc_conn_roles(const hpd_rpc_conn_t *conn)
{
    const conn_node_t *node = hpd_rpc_conn_data(conn);
    return node != NULL && node->authed ? node->roles : 0;
}

const char *hpd_rpc_conn_who(const hpd_rpc_conn_t *conn)
{
    const conn_node_t *node = hpd_rpc_conn_data(conn);
    return node != NULL ? node->who : "";
}

uint64_t hpd_rpc_conn_credential(const hpd_rpc_conn_t *conn)
{
    const conn_node_t *node = hpd_rpc_conn_data(conn);
    return node != NULL ? node->credential : 0;
}

uint32_t hpd_rpc_server_close_if(hpd_rpc_server_t *s,
                                 bool (*pred)(const hpd_rpc_conn_t *conn, void *arg), void *arg)
{
    uint32_t n = 0;
    /* on_close unlinks a node: restart the walk after each close */
    for (bool again = true; again;) {
        again = false;
        for (conn_node_t *node = s->conns; node != NULL; node = node->next) {
            if (node->authed && !node->closing && pred(node->conn, arg)) {
                node->closing = true;
                hpd_rpc_conn_close(node->conn, true);
                n++;
                again = true;
                break;
            }
        }
    }
    return n;
}

void hpd_rpc_server_stats(const hpd_rpc_server_t *s, hpd_rpc_server_stats_t *st_p)
{
    *st_p = s->st;
    st_p->open = s->n_conns;
    st_p->unauthenticated = s->n_unauthed;
    st_p->max_conns = s->max_conns;
}

hpd_status_t hpd_rpc_server_create(const hpd_rpc_server_params_t *params,
                                   hpd_rpc_server_t **server_p)
{
    hpd_rpc_server_t *s = calloc(1, sizeof(*s));
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);

    if (s == NULL)
        return HPD_ERR_NO_MEMORY;
    s->p = *params;
    if (params->token != NULL && (s->token = strdup(params->token)) == NULL) {
        free(s);
        return HPD_ERR_NO_MEMORY;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(params->port);
    if (inet_pton(AF_INET, params->host ? params->host : "127.0.0.1", &sin.sin_addr) != 1) {
        HPD_LOG_ERROR(LOG_COMPONENT, "bind address '%s' is not an IPv4 address",
                      params->host ? params->host : "");
        free(s->token);
        free(s);
        return HPD_ERR_INVALID_ARG;
    }
    /* not inherited by the processes a test or a tool starts */
    s->listener = evconnlistener_new_bind(params->base, on_accept, s,
                                          LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                              LEV_OPT_CLOSE_ON_EXEC,
                                          4096 /* capped by net.core.somaxconn */,
                                          (struct sockaddr *)&sin, sizeof(sin));
    if (s->listener == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot listen on %s:%u: %s",
                      params->host ? params->host : "127.0.0.1", params->port, strerror(errno));
        free(s->token);
        free(s);
        return HPD_ERR_IO;
    }
    if ((s->resume_accept = evtimer_new(params->base, on_resume_accept, s)) == NULL) {
        evconnlistener_free(s->listener);
        free(s->token);
        free(s);
        return HPD_ERR_NO_MEMORY;
    }
    evconnlistener_set_error_cb(s->listener, on_accept_error);
    getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&sin, &slen);
    s->port = ntohs(sin.sin_port);
    /* descriptors come from the process's budget (transport/budget.h),
     * which keeps room for the rest of the process; max_conns bounds this
     * listener alone on top of it */
    s->budget = params->budget != NULL ? params->budget : hpd_conn_budget_process();
    hpd_conn_budget_stats_t bs;
    hpd_conn_budget_stats(s->budget, &bs);
    s->max_conns = params->max_conns ? params->max_conns : bs.listeners;
    /* half the room at most, so that idle sockets never fill it */
    s->max_unauthed = params->max_unauthed ? params->max_unauthed
                                           : HPD_MAX(1u, HPD_MIN(64u, s->max_conns / 2));
    *server_p = s;
    return HPD_OK;
}

void hpd_rpc_server_destroy(hpd_rpc_server_t *s)
{
    if (s == NULL)
        return;
    evconnlistener_free(s->listener);
    /* on_close unlinks and frees each node; not to be called from a handler */
    for (conn_node_t *n = s->conns, *next; n != NULL; n = next) {
        next = n->next;
        hpd_rpc_conn_detach(n->conn);
        hpd_rpc_conn_close(n->conn, false);
        if (n->has_fd)
            hpd_conn_budget_give(s->budget, HPD_CONN_SERVE);
        if (n->auth_timer != NULL)
            event_free(n->auth_timer);
        free(n);
    }
    if (s->resume_accept != NULL)
        event_free(s->resume_accept);
    free(s->token);
    free(s);
}

uint16_t hpd_rpc_server_port(const hpd_rpc_server_t *s)
{
    return s->port;
}

hpd_status_t hpd_rpc_read_token(const char *path, char **token_p)
{
    char *data, *b, *e;
    size_t len;
    hpd_status_t st = hpd_read_file(path, &data, &len);

    if (st != HPD_OK)
        return st;
    for (b = data; *b && isspace((unsigned char)*b); b++)
        ;
    for (e = b; *e && *e != '\n' && *e != '\r'; e++)
        ;
    while (e > b && isspace((unsigned char)e[-1]))
        e--;
    if (e == b) {
        HPD_LOG_ERROR(LOG_COMPONENT, "token file %s is empty", path);
        free(data);
        return HPD_ERR_INVALID_ARG;
    }
    *e = '\0';
    memmove(data, b, (size_t)(e - b) + 1);
    *token_p = data;
    return HPD_OK;
}
