/* The msgpack-RPC server: a listener, a method table and authentication.
 *
 * Who frees what: the server owns its listener and a list of its open
 * connections; a connection removes itself from the list in on_close, and is
 * freed by rpc_conn.c once nothing references it. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"
#include "transport/rpc.h"
#include "transport/rpc_internal.h"

#define LOG_COMPONENT "rpc_server"

typedef struct conn_node {
    hpd_rpc_conn_t *conn;
    bool authed;
    struct conn_node *prev, *next;
} conn_node_t;

struct hpd_rpc_server {
    hpd_rpc_server_params_t p;
    char *token;
    struct evconnlistener *listener;
    uint16_t port;
    conn_node_t *conns;
    uint32_t n_conns;
};

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
        if (msg->type == HPD_RPC_NOTIFY && node->authed)
            return; /* notifications to the server carry nothing it acts on yet */
        hpd_rpc_conn_invalid(conn, NULL, "the server takes requests only");
        return;
    }
    if (!node->authed) {
        const msgpack_object *p = msg->params;
        if (hpd_rpc_str_eq(msg->method, msg->method_len, "auth")) {
            const bool ok = s->token == NULL ||
                            (p->type == MSGPACK_OBJECT_ARRAY && p->via.array.size == 1 &&
                             p->via.array.ptr[0].type == MSGPACK_OBJECT_STR &&
                             token_ok(s->token, p->via.array.ptr[0].via.str.ptr,
                                      p->via.array.ptr[0].via.str.size));
            if (ok) {
                node->authed = true;
                hpd_rpc_buf_t r;
                hpd_rpc_buf_init(&r);
                hpd_rpc_pack_str(&r.pk, "hybridpd");
                hpd_rpc_reply(conn, msg->id, &r);
                hpd_rpc_buf_destroy(&r);
                return;
            }
        }
        if (s->token != NULL) {
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
        node->authed = true; /* no token configured: open server */
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
        if (hpd_rpc_str_eq(msg->method, msg->method_len, s->p.methods[i].name)) {
            s->p.methods[i].fn(conn, msg->id, msg->params, s->p.arg);
            return;
        }
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

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr,
                      int len, void *arg)
{
    hpd_rpc_server_t *s = arg;
    const uint32_t max = s->p.max_conns ? s->p.max_conns : 1024;
    hpd_rpc_conn_ops_t ops = {on_msg, on_close, s, s->p.max_message};
    conn_node_t *node;

    if (s->n_conns >= max || (node = calloc(1, sizeof(*node))) == NULL) {
        HPD_LOG_WARN(LOG_COMPONENT, "refusing a connection: %u open (limit %u)", s->n_conns, max);
        evutil_closesocket(fd);
        return;
    }
    if (hpd_rpc_conn_create(s->p.base, fd, &ops, &node->conn) != HPD_OK) {
        evutil_closesocket(fd);
        free(node);
        return;
    }
    hpd_rpc_conn_set_data(node->conn, node);
    node->next = s->conns;
    if (s->conns)
        s->conns->prev = node;
    s->conns = node;
    s->n_conns++;
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
    s->listener = evconnlistener_new_bind(params->base, on_accept, s,
                                          LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128,
                                          (struct sockaddr *)&sin, sizeof(sin));
    if (s->listener == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot listen on %s:%u: %s",
                      params->host ? params->host : "127.0.0.1", params->port, strerror(errno));
        free(s->token);
        free(s);
        return HPD_ERR_IO;
    }
    getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&sin, &slen);
    s->port = ntohs(sin.sin_port);
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
        free(n);
    }
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
