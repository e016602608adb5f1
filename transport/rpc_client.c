/* The msgpack-RPC client: pending calls keyed by id, each with a timer.
 *
 * Who frees what: the client owns its connection (one reference) and its
 * pending calls; a call is freed after its callback ran (reply, timeout or
 * close). */
#include <arpa/inet.h>
#include <netdb.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "transport/rpc.h"
#include "transport/rpc_internal.h"

#define LOG_COMPONENT "rpc_client"

typedef struct call {
    hpd_rpc_client_t *client;
    uint32_t id;
    hpd_rpc_reply_cb_t cb;
    void *arg;
    struct event *timer;
    struct call *next;
} call_t;

struct hpd_rpc_client {
    hpd_rpc_client_params_t p;
    hpd_rpc_conn_t *conn;
    call_t *calls;
    uint32_t next_id;
    bool open;
    bool refused; /* the server refused the token */
};

static call_t *take_call(hpd_rpc_client_t *c, uint32_t id)
{
    for (call_t **pp = &c->calls; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            call_t *call = *pp;
            *pp = call->next;
            return call;
        }
    }
    return NULL;
}

static void finish_call(call_t *call, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    event_free(call->timer);
    call->cb(call->arg, st, reply);
    free(call);
}

static void on_msg(hpd_rpc_conn_t *conn, const hpd_rpc_msg_t *msg, void *arg)
{
    hpd_rpc_client_t *c = arg;

    if (msg->type == HPD_RPC_RESPONSE) {
        call_t *call = take_call(c, msg->id);
        if (call != NULL)
            finish_call(call, HPD_OK, msg);
        else
            HPD_LOG_DEBUG(LOG_COMPONENT, "reply to unknown or expired call %u", msg->id);
        return;
    }
    if (msg->type == HPD_RPC_NOTIFY) {
        if (c->p.on_notify != NULL)
            c->p.on_notify(c->p.arg, msg);
        return;
    }
    hpd_rpc_conn_invalid(conn, NULL, "the client takes responses and notifications only");
}

static void fail_all(hpd_rpc_client_t *c, hpd_status_t st)
{
    while (c->calls != NULL) {
        call_t *call = c->calls;
        c->calls = call->next;
        finish_call(call, st, NULL);
    }
}

static void on_close(hpd_rpc_conn_t *conn, hpd_status_t why, void *arg)
{
    hpd_rpc_client_t *c = arg;

    c->open = false;
    fail_all(c, HPD_ERR_IO);
    if (c->p.on_close != NULL)
        c->p.on_close(c->p.arg, why);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    call_t *call = arg;
    call_t *mine = take_call(call->client, call->id);

    if (mine != NULL)
        finish_call(mine, HPD_ERR_TIMEOUT, NULL);
}

hpd_status_t hpd_rpc_call(hpd_rpc_client_t *c, const char *method, const hpd_rpc_buf_t *params,
                          uint32_t timeout_ms, hpd_rpc_reply_cb_t cb, void *arg)
{
    hpd_rpc_buf_t b;
    call_t *call;
    hpd_status_t st;
    const uint32_t ms = timeout_ms ? timeout_ms : (c->p.timeout_ms ? c->p.timeout_ms : 10000);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    if (!c->open)
        return HPD_ERR_IO;
    if ((call = calloc(1, sizeof(*call))) == NULL)
        return HPD_ERR_NO_MEMORY;
    call->client = c;
    call->id = c->next_id++;
    call->cb = cb;
    call->arg = arg;
    call->timer = evtimer_new(c->p.base, on_timeout, call);
    if (call->timer == NULL) {
        free(call);
        return HPD_ERR_NO_MEMORY;
    }
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, call->id, method);
    if (params == NULL || params->sb.size == 0)
        msgpack_pack_array(&b.pk, 0);
    else
        msgpack_sbuffer_write(&b.sb, params->sb.data, params->sb.size);
    st = hpd_rpc_conn_send(c->conn, b.sb.data, b.sb.size);
    hpd_rpc_buf_destroy(&b);
    if (st != HPD_OK) {
        event_free(call->timer);
        free(call);
        return st;
    }
    evtimer_add(call->timer, &tv);
    call->next = c->calls;
    c->calls = call;
    return HPD_OK;
}

hpd_status_t hpd_rpc_client_notify(hpd_rpc_client_t *c, const char *method,
                                   const hpd_rpc_buf_t *params)
{
    if (!c->open)
        return HPD_ERR_IO;
    return hpd_rpc_notify(c->conn, method, params);
}

static void keep_result(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_rpc_result_t *r = arg;

    r->status = st;
    if (st == HPD_ERR_IO)
        r->status = HPD_ERR_IO;
    if (reply == NULL)
        return;
    if (reply->is_error) {
        r->is_error = true;
        r->error_code = reply->error_code;
        snprintf(r->error_message, sizeof(r->error_message), "%.*s",
                 (int)reply->error_message_len, reply->error_message);
        return;
    }
    /* a deep copy of the result into the result's own zone */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t off = 0;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *reply->result);
    const size_t size = sb.size;
    r->raw = msgpack_sbuffer_release(&sb); /* the result's strings live here */
    if (msgpack_unpack(r->raw, size, &off, &r->zone, &r->result) != MSGPACK_UNPACK_SUCCESS)
        r->status = HPD_ERR_NO_MEMORY;
}

typedef struct {
    hpd_rpc_result_t *r;
    bool done;
} sync_t;

static void sync_done(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    sync_t *s = arg;
    keep_result(s->r, st, reply);
    s->done = true;
}

hpd_status_t hpd_rpc_call_sync(hpd_rpc_client_t *c, const char *method,
                               const hpd_rpc_buf_t *params, uint32_t timeout_ms,
                               hpd_rpc_result_t *r)
{
    sync_t s = {r, false};
    hpd_status_t st;

    memset(r, 0, sizeof(*r));
    msgpack_zone_init(&r->zone, 1024);
    r->result.type = MSGPACK_OBJECT_NIL;
    if ((st = hpd_rpc_call(c, method, params, timeout_ms, sync_done, &s)) != HPD_OK) {
        r->status = st;
        return st;
    }
    while (!s.done)
        if (event_base_loop(c->p.base, EVLOOP_ONCE) < 0)
            break;
    if (!s.done) {
        r->status = HPD_ERR_IO;
        call_t *call = take_call(c, c->next_id - 1);
        if (call != NULL) {
            event_free(call->timer);
            free(call);
        }
    }
    return r->status;
}

void hpd_rpc_result_destroy(hpd_rpc_result_t *r)
{
    msgpack_zone_destroy(&r->zone);
    free(r->raw);
    r->raw = NULL;
}

/* A blocking TCP connect with a timeout; -1 on failure. host is an IPv4
 * address or a name (resolved here: a Kubernetes service, a hostname). */
static int dial(const char *host, uint16_t port, uint32_t timeout_ms)
{
    struct addrinfo hints, *res = NULL;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    char service[8];
    int fd, one = 1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(service, sizeof(service), "%u", port);
    if (getaddrinfo(host, service, &hints, &res) != 0 || res == NULL)
        return -1;
    if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0) {
        freeaddrinfo(res);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        freeaddrinfo(res);
        close(fd);
        return -1;
    }
    freeaddrinfo(res);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    evutil_make_socket_nonblocking(fd);
    return fd;
}

static hpd_status_t client_open(const hpd_rpc_client_params_t *params, hpd_rpc_client_t **c_p)
{
    hpd_rpc_client_t *c = calloc(1, sizeof(*c));
    hpd_rpc_conn_ops_t ops;
    hpd_status_t st;
    int fd;

    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    c->p = *params;
    c->next_id = 1;
    fd = dial(params->host ? params->host : "127.0.0.1", params->port,
              params->timeout_ms ? params->timeout_ms : 10000);
    if (fd < 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot connect to %s:%u: %s",
                      params->host ? params->host : "127.0.0.1", params->port, strerror(errno));
        free(c);
        return HPD_ERR_IO;
    }
    ops = (hpd_rpc_conn_ops_t){
        .on_msg = on_msg, .on_close = on_close, .arg = c, .max_message = params->max_message};
    if ((st = hpd_rpc_conn_create(params->base, fd, &ops, &c->conn)) != HPD_OK) {
        close(fd);
        free(c);
        return st;
    }
    hpd_rpc_conn_ref(c->conn); /* the client's own, dropped in destroy */
    c->open = true;
    *c_p = c;
    return HPD_OK;
}

static void pack_auth(hpd_rpc_buf_t *b, const char *token)
{
    hpd_rpc_buf_init(b);
    msgpack_pack_array(&b->pk, 1);
    hpd_rpc_pack_str(&b->pk, token ? token : "");
}

hpd_status_t hpd_rpc_client_create(const hpd_rpc_client_params_t *params,
                                   hpd_rpc_client_t **client_p)
{
    hpd_rpc_client_t *c;
    hpd_rpc_result_t r;
    hpd_rpc_buf_t b;
    hpd_status_t st;

    if ((st = client_open(params, &c)) != HPD_OK)
        return st;
    pack_auth(&b, params->token);
    st = hpd_rpc_call_sync(c, "auth", &b, 0, &r);
    hpd_rpc_buf_destroy(&b);
    if (st == HPD_OK && r.is_error) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s:%u refused the connection: %s",
                      params->host ? params->host : "127.0.0.1", params->port, r.error_message);
        st = HPD_ERR_INVALID_ARG;
    } else if (st != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s:%u: no answer to auth: %s",
                      params->host ? params->host : "127.0.0.1", params->port,
                      hpd_status_str(st));
    }
    hpd_rpc_result_destroy(&r);
    if (st != HPD_OK) {
        hpd_rpc_client_destroy(c);
        return st;
    }
    *client_p = c;
    return HPD_OK;
}

static void on_auth_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_rpc_client_t *c = arg;

    if ((st == HPD_OK && !reply->is_error) || st == HPD_ERR_CANCELED) /* ok, or destroyed */
        return;
    if (st == HPD_OK) {
        c->refused = true;
        HPD_LOG_ERROR(LOG_COMPONENT, "%s:%u refused the connection: %.*s",
                      c->p.host ? c->p.host : "127.0.0.1", c->p.port,
                      (int)reply->error_message_len, reply->error_message);
    }
    /* the server closes after a refused token; calls queued behind the auth
     * fail with the close */
    if (c->open)
        hpd_rpc_conn_close(c->conn, false);
}

hpd_status_t hpd_rpc_client_connect(const hpd_rpc_client_params_t *params,
                                    hpd_rpc_client_t **client_p)
{
    hpd_rpc_client_t *c;
    hpd_rpc_buf_t b;
    hpd_status_t st;

    if ((st = client_open(params, &c)) != HPD_OK)
        return st;
    pack_auth(&b, params->token);
    st = hpd_rpc_call(c, "auth", &b, 0, on_auth_reply, c);
    hpd_rpc_buf_destroy(&b);
    if (st != HPD_OK) {
        hpd_rpc_client_destroy(c);
        return st;
    }
    *client_p = c;
    return HPD_OK;
}

void hpd_rpc_client_destroy(hpd_rpc_client_t *c)
{
    if (c == NULL)
        return;
    fail_all(c, HPD_ERR_CANCELED);
    hpd_rpc_conn_detach(c->conn);
    hpd_rpc_conn_close(c->conn, false);
    hpd_rpc_conn_unref(c->conn);
    free(c);
}

bool hpd_rpc_client_refused(const hpd_rpc_client_t *c)
{
    return c->refused;
}

bool hpd_rpc_client_is_open(const hpd_rpc_client_t *c)
{
    return c->open;
}
