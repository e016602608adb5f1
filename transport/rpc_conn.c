/* One msgpack-RPC connection: a bufferevent feeding a msgpack unpacker.
 *
 * Who frees what: the connection holds one reference on itself from create
 * until its close completes (on_close has run and the bufferevent is freed);
 * users may add references. Memory goes when the count reaches zero and no
 * callback of this connection is running. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transport/rpc.h"
#include "transport/rpc_internal.h"

#define LOG_COMPONENT "rpc"

struct hpd_rpc_conn {
    struct bufferevent *bev;
    hpd_rpc_conn_ops_t ops;
    hpd_rpc_scanner_t scanner;
    size_t scanned; /* bytes of the input buffer already scanned */
    uint32_t refs;
    uint32_t in_callback;
    bool closing, closed, close_when_drained;
    hpd_status_t close_reason;
    void *data; /* the owner's (the server keeps its bookkeeping here) */
    void *user; /* the application's */
    /* Messages sent during one turn of the loop go out together at its end:
     * one write for all of them, straight to the socket, where the
     * bufferevent would arm and disarm its write event around each burst
     * (two epoll_ctl calls and a wakeup). What the socket does not take
     * goes to the bufferevent, and what is sent while that waits goes
     * behind it there. */
    struct evbuffer *out;
    struct event *flush_ev;
    bool flush_due;
};

void hpd_rpc_buf_init(hpd_rpc_buf_t *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

void hpd_rpc_buf_destroy(hpd_rpc_buf_t *b)
{
    msgpack_sbuffer_destroy(&b->sb);
}

static void conn_free(hpd_rpc_conn_t *c)
{
    if (c->flush_ev != NULL)
        event_free(c->flush_ev);
    if (c->out != NULL)
        evbuffer_free(c->out);
    free(c);
}

/* The turn's messages to the socket (sendmsg, MSG_NOSIGNAL: a peer gone
 * is an error here, not a SIGPIPE); the rest, and a failed write, to the
 * bufferevent, which writes it when the socket takes more or reports the
 * error through on_event. */
static void flush_out(hpd_rpc_conn_t *c)
{
    c->flush_due = false;
    if (c->bev == NULL || c->out == NULL || evbuffer_get_length(c->out) == 0)
        return;
    const evutil_socket_t fd = bufferevent_getfd(c->bev);
    while (fd >= 0 && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0 &&
           evbuffer_get_length(c->out) > 0) {
        struct evbuffer_iovec vec[64];
        struct iovec iov[64];
        const int n = evbuffer_peek(c->out, -1, NULL, vec, 64);
        for (int i = 0; i < n && i < 64; i++)
            iov[i] = (struct iovec){vec[i].iov_base, vec[i].iov_len};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)(n < 64 ? n : 64)};
        const ssize_t sent = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0)
            break;
        evbuffer_drain(c->out, (size_t)sent);
    }
    if (evbuffer_get_length(c->out) > 0)
        bufferevent_write_buffer(c->bev, c->out);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    flush_out(arg);
}

void hpd_rpc_conn_ref(hpd_rpc_conn_t *c)
{
    c->refs++;
}

void hpd_rpc_conn_unref(hpd_rpc_conn_t *c)
{
    if (--c->refs == 0 && c->in_callback == 0)
        conn_free(c);
}

/* Finishes a close: tells the owner once, frees the socket, drops the
 * connection's own reference. Runs only outside this connection's callbacks. */
static void conn_finish(hpd_rpc_conn_t *c)
{
    if (c->closed)
        return;
    c->closed = true;
    if (c->flush_ev != NULL) {
        event_free(c->flush_ev);
        c->flush_ev = NULL;
    }
    if (c->bev != NULL) {
        bufferevent_free(c->bev);
        c->bev = NULL;
    }
    if (c->ops.on_close != NULL) {
        c->in_callback++;
        c->ops.on_close(c, c->close_reason, c->ops.arg);
        c->in_callback--;
    }
    hpd_rpc_conn_unref(c);
}

/* Leaves a callback: a close requested inside it happens now. */
static void leave(hpd_rpc_conn_t *c)
{
    c->in_callback--;
    if (c->in_callback > 0)
        return;
    if (c->closing && !c->close_when_drained)
        conn_finish(c);
    else if (c->refs == 0)
        conn_free(c);
}

static void fail_and_close(hpd_rpc_conn_t *c, hpd_status_t why, int64_t code, const char *what)
{
    hpd_rpc_buf_t b;

    /* a last word for the peer, then close once it is written */
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_notify(&b.pk, "error");
    msgpack_pack_map(&b.pk, 2);
    hpd_rpc_pack_str(&b.pk, "code");
    msgpack_pack_int64(&b.pk, code);
    hpd_rpc_pack_str(&b.pk, "message");
    hpd_rpc_pack_str(&b.pk, what);
    hpd_rpc_conn_send(c, b.sb.data, b.sb.size);
    hpd_rpc_buf_destroy(&b);
    c->close_reason = why;
    hpd_rpc_conn_close(c, true);
}

/* Unpacks and delivers one complete, scanned message of len bytes. */
static void deliver(hpd_rpc_conn_t *c, struct evbuffer *in, size_t len)
{
    const char *data = (const char *)evbuffer_pullup(in, (ssize_t)len);
    msgpack_zone zone;
    msgpack_object obj;
    hpd_rpc_msg_t msg;
    char err[160];
    size_t off = 0;

    msgpack_zone_init(&zone, 4096);
    if (data == NULL || msgpack_unpack(data, len, &off, &zone, &obj) != MSGPACK_UNPACK_SUCCESS) {
        fail_and_close(c, HPD_ERR_FORMAT, HPD_RPC_ERR_PARSE, "malformed msgpack");
    } else if (hpd_rpc_decode(&obj, &msg, err, sizeof(err)) != HPD_OK) {
        hpd_rpc_conn_invalid(c, &obj, err);
    } else if (c->ops.on_msg != NULL) {
        c->ops.on_msg(c, &msg, c->ops.arg);
    }
    msgpack_zone_destroy(&zone);
    if (c->bev != NULL)
        evbuffer_drain(in, len);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    hpd_rpc_conn_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    const size_t max = c->ops.max_message ? c->ops.max_message : HPD_RPC_DEFAULT_MAX_MESSAGE;
    char err[160];

    c->in_callback++;
    while (!c->closing && evbuffer_get_length(in) > c->scanned) {
        struct evbuffer_ptr pos;
        struct evbuffer_iovec vec[16];
        bool complete = false;
        size_t used = 0;

        evbuffer_ptr_set(in, &pos, c->scanned, EVBUFFER_PTR_SET);
        const int n_vec = evbuffer_peek(in, -1, &pos, vec, 16);
        for (int v = 0; v < n_vec && !complete; v++) {
            if (hpd_rpc_scan(&c->scanner, vec[v].iov_base, vec[v].iov_len, max, &used,
                             &complete, err, sizeof(err)) != HPD_OK) {
                fail_and_close(c, HPD_ERR_FORMAT, c->scanner.error_code, err);
                break;
            }
            c->scanned += used;
        }
        if (c->closing || !complete)
            break;
        const size_t len = c->scanned;
        hpd_rpc_scanner_reset(&c->scanner);
        c->scanned = 0;
        deliver(c, in, len);
    }
    leave(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    hpd_rpc_conn_t *c = arg;

    if (c->closing && c->close_when_drained &&
        evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        c->close_when_drained = false;
        c->in_callback++;
        leave(c);
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    hpd_rpc_conn_t *c = arg;

    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
        c->in_callback++;
        if (!c->closing)
            c->close_reason = (what & BEV_EVENT_EOF) ? HPD_OK : HPD_ERR_IO;
        c->closing = true;
        c->close_when_drained = false;
        leave(c);
    }
}

hpd_status_t hpd_rpc_conn_create(struct event_base *base, int fd, const hpd_rpc_conn_ops_t *ops,
                                 hpd_rpc_conn_t **conn_p)
{
    hpd_rpc_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    hpd_rpc_scanner_reset(&c->scanner);
    c->ops = *ops;
    c->refs = 1;
    c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->out = evbuffer_new();
    c->flush_ev = event_new(base, -1, 0, on_flush, c);
    if (c->bev == NULL || c->out == NULL || c->flush_ev == NULL) {
        if (c->bev != NULL)
            bufferevent_free(c->bev);
        conn_free(c);
        return HPD_ERR_IO;
    }
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    *conn_p = c;
    return HPD_OK;
}

hpd_status_t hpd_rpc_conn_send(hpd_rpc_conn_t *c, const void *data, size_t len)
{
    if (c->closed || c->bev == NULL)
        return HPD_ERR_IO;
    /* behind what already waits for the socket, or with this turn's */
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
        return bufferevent_write(c->bev, data, len) == 0 ? HPD_OK : HPD_ERR_IO;
    if (evbuffer_add(c->out, data, len) != 0)
        return HPD_ERR_IO;
    if (!c->flush_due) {
        c->flush_due = true;
        event_active(c->flush_ev, EV_READ, 0); /* (not a timer: nothing waits) */
    }
    return HPD_OK;
}

void hpd_rpc_conn_close(hpd_rpc_conn_t *c, bool flush)
{
    if (c->closing || c->closed)
        return;
    c->closing = true;
    bufferevent_disable(c->bev, EV_READ);
    if (flush)
        flush_out(c);
    if (flush && evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
        /* on_write finishes it; a peer that never reads gets 5 s */
        const struct timeval tv = {5, 0};
        c->close_when_drained = true;
        bufferevent_set_timeouts(c->bev, NULL, &tv);
        return;
    }
    if (c->in_callback == 0)
        conn_finish(c);
}

void hpd_rpc_conn_detach(hpd_rpc_conn_t *c)
{
    c->ops.on_msg = NULL;
    c->ops.on_close = NULL;
    c->ops.arg = NULL;
}

bool hpd_rpc_conn_is_open(const hpd_rpc_conn_t *c)
{
    return !c->closing && !c->closed;
}

bool hpd_rpc_conn_peer_gone(const hpd_rpc_conn_t *c)
{
    char b;
    if (c->closing || c->closed)
        return true;
    /* what the kernel holds past the bytes read so far ends with the
     * peer's end of file when it closed (unread bytes before it: not yet) */
    const evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd < 0)
        return false;
    const ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

double hpd_rpc_conn_rto(const hpd_rpc_conn_t *c)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    const evutil_socket_t fd = c->closed ? -1 : bufferevent_getfd(c->bev);
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_rto) + sizeof(ti.tcpi_rto))
        return 0;
    return ti.tcpi_rto / 1e6;
}

void hpd_rpc_conn_set_data(hpd_rpc_conn_t *c, void *data)
{
    c->data = data;
}

void *hpd_rpc_conn_data(const hpd_rpc_conn_t *c)
{
    return c->data;
}

void hpd_rpc_conn_set_user(hpd_rpc_conn_t *c, void *user)
{
    c->user = user;
}

void *hpd_rpc_conn_user(const hpd_rpc_conn_t *c)
{
    return c->user;
}

static hpd_status_t send_buf(hpd_rpc_conn_t *c, hpd_rpc_buf_t *b)
{
    hpd_status_t st = hpd_rpc_conn_is_open(c) ? hpd_rpc_conn_send(c, b->sb.data, b->sb.size)
                                              : HPD_ERR_IO;
    hpd_rpc_buf_destroy(b);
    return st;
}

static void append(hpd_rpc_buf_t *b, const hpd_rpc_buf_t *value)
{
    if (value == NULL || value->sb.size == 0)
        msgpack_pack_nil(&b->pk);
    else
        msgpack_sbuffer_write(&b->sb, value->sb.data, value->sb.size);
}

hpd_status_t hpd_rpc_reply(hpd_rpc_conn_t *c, uint32_t id, const hpd_rpc_buf_t *result)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_response_ok(&b.pk, id);
    append(&b, result);
    return send_buf(c, &b);
}

hpd_status_t hpd_rpc_reply_error(hpd_rpc_conn_t *c, uint32_t id, int64_t code, const char *fmt,
                                 ...)
{
    char msg[512];
    va_list ap;
    hpd_rpc_buf_t b;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_response_error(&b.pk, id, code, msg);
    return send_buf(c, &b);
}

hpd_status_t hpd_rpc_notify(hpd_rpc_conn_t *c, const char *method, const hpd_rpc_buf_t *params)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_notify(&b.pk, method);
    append(&b, params);
    return send_buf(c, &b);
}

void hpd_rpc_conn_set_max_message(hpd_rpc_conn_t *c, size_t max_message)
{
    c->ops.max_message = max_message;
}

void hpd_rpc_conn_invalid(hpd_rpc_conn_t *c, const msgpack_object *obj, const char *why)
{
    /* a request whose id can be read gets an error reply; anything else
     * closes the connection */
    if (obj != NULL && obj->type == MSGPACK_OBJECT_ARRAY && obj->via.array.size >= 2 &&
        obj->via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        obj->via.array.ptr[0].via.u64 == HPD_RPC_REQUEST &&
        obj->via.array.ptr[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        obj->via.array.ptr[1].via.u64 <= UINT32_MAX) {
        hpd_rpc_reply_error(c, (uint32_t)obj->via.array.ptr[1].via.u64, HPD_RPC_ERR_INVALID,
                            "invalid request: %s", why);
        return;
    }
    HPD_LOG_INFO(LOG_COMPONENT, "closing a connection after an invalid message: %s", why);
    fail_and_close(c, HPD_ERR_FORMAT, HPD_RPC_ERR_INVALID, why);
}
