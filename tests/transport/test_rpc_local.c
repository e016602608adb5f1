/* msgpack-RPC in one process, on one event loop (docs/protocol.md): a
 * connection over a socketpair with the test as its raw peer; a server and
 * its clients over 127.0.0.1. Deterministic (no sleeps, no timing margins:
 * "later" is whenever the test releases a held call), and fast.
 *
 * - the connection: framing across writes, replies and notifications on
 *   the wire, each protocol error answered as docs/protocol.md says and
 *   reported through on_close with its reason, close inside a callback,
 *   flushing close, references and detach;
 * - the server: default bind address, the token check (same length, same
 *   first byte, not a string...), what an unauthenticated or open server
 *   answers, the connection limit, the message limit, destroy;
 * - the client: the default call timeout (10 s, read off the call's timer),
 *   timeouts and late replies, replies routed by id in any order, destroy
 *   and server close failing pending calls, notifications, empty params,
 *   a connect that the server never accepts;
 * - allocations (tests/transport/alloc_wrap.h): the k-th of an operation
 *   fails, for every k in turn (calloc, which transport/ allocates its
 *   objects with; msgpack's buffers grow with realloc, and a failed write to
 *   one is not detected by the packer); and what a client's life took is
 *   all given back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/test_helpers.h"
#include "tests/transport/alloc_wrap.h"
#include "tests/transport/loop.h"
#include "transport/rpc.h"

/* A string literal and its length (bytes of msgpack, written out). */
#define LIT(s) s, sizeof(s) - 1

/* ------------------------------------------------------------ a raw peer */

typedef struct {
    int fd;
    uint8_t buf[1 << 21];
    uint8_t last[1 << 21];
    size_t have;
    bool eof;
    msgpack_zone zone;
    msgpack_object obj;
    hpd_rpc_msg_t msg; /* the last message read */
} peer_t;

static peer_t *peer_new(int fd)
{
    peer_t *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    p->fd = fd;
    msgpack_zone_init(&p->zone, 4096);
    return p;
}

static void peer_free(peer_t *p)
{
    if (p->fd >= 0)
        close(p->fd);
    msgpack_zone_destroy(&p->zone);
    free(p);
}

static void peer_send(peer_t *p, const void *data, size_t n)
{
    const uint8_t *c = data;
    while (n > 0) {
        const ssize_t w = send(p->fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
            continue;
        }
        assert_true(w > 0);
        c += w, n -= (size_t)w;
    }
}

static void peer_send_buf(peer_t *p, const hpd_rpc_buf_t *b)
{
    peer_send(p, b->sb.data, b->sb.size);
}

/* Reads what has arrived, without blocking. */
static void peer_pump(peer_t *p)
{
    while (!p->eof && p->have < sizeof(p->buf)) {
        const ssize_t n = recv(p->fd, p->buf + p->have, sizeof(p->buf) - p->have, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            p->eof = true;
        if (n <= 0)
            return;
        p->have += (size_t)n;
    }
}

/* A whole message at the front of the buffer: moved to p->last and decoded
 * into p->msg (views into p->last, valid until the next one). */
static bool peer_take(peer_t *p)
{
    size_t off = 0, off2 = 0;
    char err[160];
    if (p->have == 0)
        return false;
    msgpack_zone_clear(&p->zone);
    const msgpack_unpack_return r =
        msgpack_unpack((const char *)p->buf, p->have, &off, &p->zone, &p->obj);
    if (r == MSGPACK_UNPACK_CONTINUE)
        return false;
    assert_true(r == MSGPACK_UNPACK_SUCCESS || r == MSGPACK_UNPACK_EXTRA_BYTES);
    memcpy(p->last, p->buf, off);
    memmove(p->buf, p->buf + off, p->have - off);
    p->have -= off;
    msgpack_zone_clear(&p->zone);
    assert_int_equal(msgpack_unpack((const char *)p->last, off, &off2, &p->zone, &p->obj),
                     MSGPACK_UNPACK_SUCCESS);
    if (hpd_rpc_decode(&p->obj, &p->msg, err, sizeof(err)) != HPD_OK)
        fail_msg("the peer got a message that is not RPC: %s", err);
    return true;
}

/* Runs the loop until the peer has a message (true) or the connection
 * ended with nothing more (false). */
static bool peer_read(peer_t *p)
{
    for (const double t0 = hpd_time_now();;) {
        peer_pump(p);
        if (peer_take(p))
            return true;
        if (p->eof)
            return false;
        if (hpd_time_now() - t0 > DEADLINE_S)
            fail_msg("the peer got nothing after %.0f s", DEADLINE_S);
        if (event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK) != 0)
            usleep(100);
    }
}

/* Expects an error notification with this code and message, then the end
 * of the connection. */
static void expect_error_notice_and_close(peer_t *p, int64_t code, const char *message)
{
    assert_true(peer_read(p));
    assert_int_equal(p->msg.type, HPD_RPC_NOTIFY);
    assert_true(hpd_rpc_str_eq(p->msg.method, p->msg.method_len, "error"));
    const msgpack_object *c = hpd_rpc_map_get(p->msg.params, "code");
    const msgpack_object *m = hpd_rpc_map_get(p->msg.params, "message");
    assert_non_null(c);
    assert_non_null(m);
    assert_true(c->via.i64 == code);
    if (!hpd_rpc_str_eq(m->via.str.ptr, m->via.str.size, message))
        fail_msg("error message '%.*s', expected '%s'", (int)m->via.str.size, m->via.str.ptr,
                 message);
    assert_false(peer_read(p));
}

/* Expects an error response to id with this code; returns its message in msg. */
static void expect_error_reply(peer_t *p, uint32_t id, int64_t code, char *msg, size_t len)
{
    assert_true(peer_read(p));
    assert_int_equal(p->msg.type, HPD_RPC_RESPONSE);
    assert_int_equal(p->msg.id, id);
    assert_true(p->msg.is_error);
    assert_true(p->msg.error_code == code);
    snprintf(msg, len, "%.*s", (int)p->msg.error_message_len, p->msg.error_message);
}

static void expect_str_reply(peer_t *p, uint32_t id, const char *s)
{
    assert_true(peer_read(p));
    assert_int_equal(p->msg.type, HPD_RPC_RESPONSE);
    assert_int_equal(p->msg.id, id);
    if (p->msg.is_error)
        fail_msg("reply %u is an error: %.*s", id, (int)p->msg.error_message_len,
                 p->msg.error_message);
    assert_int_equal(p->msg.result->type, MSGPACK_OBJECT_STR);
    assert_true(hpd_rpc_str_eq(p->msg.result->via.str.ptr, p->msg.result->via.str.size, s));
}

/* Packs [0, id, method, params] with params from a literal msgpack text. */
static void send_request(peer_t *p, uint32_t id, const char *method, const void *params,
                         size_t n)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, id, method);
    if (params == NULL)
        msgpack_pack_array(&b.pk, 0);
    else
        msgpack_sbuffer_write(&b.sb, params, n);
    peer_send_buf(p, &b);
    hpd_rpc_buf_destroy(&b);
}

/* ------------------------------------------------------------ a connection */

typedef struct {
    int n_msgs;
    hpd_rpc_type_t type[8];
    uint32_t id[8];
    char method[8][HPD_RPC_MAX_METHOD + 1];
    int n_closes;
    hpd_status_t why;
    bool in_msg;             /* on_msg is running */
    bool closed_during_msg;  /* on_close ran inside on_msg */
    bool close_on_msg;       /* on_msg closes the connection */
} rec_t;

static void rec_msg(hpd_rpc_conn_t *conn, const hpd_rpc_msg_t *m, void *arg)
{
    rec_t *r = arg;
    r->in_msg = true;
    if (r->n_msgs < 8) {
        r->type[r->n_msgs] = m->type;
        r->id[r->n_msgs] = m->id;
        snprintf(r->method[r->n_msgs], sizeof(r->method[0]), "%.*s", (int)m->method_len,
                 m->method ? m->method : "");
    }
    r->n_msgs++;
    if (r->close_on_msg)
        hpd_rpc_conn_close(conn, false);
    r->in_msg = false;
}

static void rec_close(hpd_rpc_conn_t *conn, hpd_status_t why, void *arg)
{
    rec_t *r = arg;
    r->n_closes++;
    r->why = why;
    r->closed_during_msg = r->in_msg;
}

/* A connection on one end of a socketpair; the raw peer on the other. */
static hpd_rpc_conn_t *conn_pair(rec_t *r, size_t max_message, peer_t **peer_p)
{
    int sv[2];
    hpd_rpc_conn_t *conn;
    hpd_rpc_conn_ops_t ops = {
        .on_msg = rec_msg, .on_close = rec_close, .arg = r, .max_message = max_message};

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    evutil_make_socket_nonblocking(sv[0]);
    assert_int_equal(hpd_rpc_conn_create(base, sv[0], &ops, &conn), HPD_OK);
    *peer_p = peer_new(sv[1]);
    return conn;
}

/* Messages framed across any split of the stream; what the connection
 * sends is on the wire as the protocol says; a peer's close is on_close
 * with HPD_OK, once; after it nothing more is sent, and a reference keeps
 * the memory. */
static void test_conn_messages_and_replies(void **state)
{
    rec_t r = {0};
    peer_t *p;
    hpd_rpc_conn_t *conn = conn_pair(&r, 0, &p);
    hpd_rpc_buf_t b;
    int user;

    hpd_rpc_conn_ref(conn);
    assert_true(hpd_rpc_conn_is_open(conn));
    hpd_rpc_conn_set_user(conn, &user);
    hpd_rpc_conn_set_data(conn, &r);
    assert_ptr_equal(hpd_rpc_conn_user(conn), &user);
    assert_ptr_equal(hpd_rpc_conn_data(conn), &r);

    /* two requests in one write, then a notification byte by byte */
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 11, "first");
    msgpack_pack_array(&b.pk, 0);
    hpd_rpc_pack_request(&b.pk, 12, "second");
    msgpack_pack_nil(&b.pk);
    peer_send_buf(p, &b);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(r.n_msgs == 2);
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_notify(&b.pk, "third");
    msgpack_pack_map(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, "k");
    msgpack_pack_uint64(&b.pk, UINT64_MAX);
    for (size_t i = 0; i < b.sb.size; i++) {
        peer_send(p, b.sb.data + i, 1);
        spin(2);
        assert_int_equal(r.n_msgs, i + 1 < b.sb.size ? 2 : 3);
    }
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(r.n_msgs == 3);
    assert_int_equal(r.type[0], HPD_RPC_REQUEST);
    assert_int_equal(r.id[0], 11);
    assert_string_equal(r.method[0], "first");
    assert_int_equal(r.id[1], 12);
    assert_string_equal(r.method[1], "second");
    assert_int_equal(r.type[2], HPD_RPC_NOTIFY);
    assert_string_equal(r.method[2], "third");

    /* replies and notifications: NULL and empty values pack nil */
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_str(&b.pk, "r");
    assert_int_equal(hpd_rpc_reply(conn, 11, &b), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    expect_str_reply(p, 11, "r");
    assert_int_equal(hpd_rpc_reply(conn, 12, NULL), HPD_OK);
    assert_true(peer_read(p));
    assert_int_equal(p->msg.id, 12);
    assert_false(p->msg.is_error);
    assert_int_equal(p->msg.result->type, MSGPACK_OBJECT_NIL);
    char msg[256];
    assert_int_equal(hpd_rpc_reply_error(conn, 13, HPD_RPC_ERR_APP, "bad %s %d", "value", 5),
                     HPD_OK);
    expect_error_reply(p, 13, HPD_RPC_ERR_APP, msg, sizeof(msg));
    assert_string_equal(msg, "bad value 5");
    assert_int_equal(p->msg.result->type, MSGPACK_OBJECT_NIL);
    hpd_rpc_buf_init(&b);
    assert_int_equal(hpd_rpc_notify(conn, "tick", &b), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    assert_true(peer_read(p));
    assert_int_equal(p->msg.type, HPD_RPC_NOTIFY);
    assert_true(hpd_rpc_str_eq(p->msg.method, p->msg.method_len, "tick"));
    assert_int_equal(p->msg.params->type, MSGPACK_OBJECT_NIL);
    /* raw bytes as they are */
    assert_int_equal(hpd_rpc_conn_send(conn, LIT("\x93\x02\xa1x\x07")), HPD_OK);
    assert_true(peer_read(p));
    assert_int_equal(p->msg.params->via.u64, 7);
    assert_int_equal(r.n_closes, 0);

    /* the peer goes: on_close once, HPD_OK */
    shutdown(p->fd, SHUT_WR);
    LOOP_UNTIL(r.n_closes == 1);
    assert_int_equal(r.why, HPD_OK);
    assert_false(hpd_rpc_conn_is_open(conn));
    assert_int_equal(hpd_rpc_conn_send(conn, LIT("\xc0")), HPD_ERR_IO);
    assert_int_equal(hpd_rpc_reply(conn, 1, NULL), HPD_ERR_IO);
    assert_int_equal(hpd_rpc_reply_error(conn, 1, HPD_RPC_ERR_APP, "x"), HPD_ERR_IO);
    assert_int_equal(hpd_rpc_notify(conn, "x", NULL), HPD_ERR_IO);
    hpd_rpc_conn_close(conn, true); /* a no-op now */
    assert_ptr_equal(hpd_rpc_conn_user(conn), &user);
    spin(5);
    assert_int_equal(r.n_closes, 1);
    assert_false(peer_read(p)); /* nothing was sent after the close */
    hpd_rpc_conn_unref(conn);   /* the memory goes here (the sanitizer build checks) */
    peer_free(p);
}

/* Each kind of bad input, as docs/protocol.md's connection rules 3 and 4
 * say: an error response when a request's id can be read (the connection
 * stays), else an error notification and a close, reported to the owner
 * with HPD_ERR_FORMAT. */
static void test_conn_protocol_errors(void **state)
{
    static const struct {
        const char *bytes;
        size_t n;
        size_t max_message;
        int64_t code;
        const char *message;
    } closing[] = {
        {LIT("\xc1"), 0, HPD_RPC_ERR_PARSE, "malformed msgpack (byte 0xc1)"},
        {LIT("\x92\x01\xc1"), 0, HPD_RPC_ERR_PARSE, "malformed msgpack (byte 0xc1)"},
        {LIT("\xa5hello"), 0, HPD_RPC_ERR_INVALID, "message is not an array"},
        {LIT("\xd9\x64"), 64, HPD_RPC_ERR_TOO_LARGE,
         "message declares 100 payload bytes, beyond the limit of 64 bytes"},
        /* an id past 2^32-1 cannot be answered */
        {LIT("\x94\x00\xcf\x00\x00\x00\x01\x00\x00\x00\x00\xa1m\x90"), 0, HPD_RPC_ERR_INVALID,
         "request id must be an integer from 0 to 2^32-1"},
        {LIT("\x94\x00\xcf\x00\x00\x00\x01\x00\x00\x00\x00\x05\x90"), 0, HPD_RPC_ERR_INVALID,
         "request id must be an integer from 0 to 2^32-1"},
        /* a response or a notification that is malformed */
        {LIT("\x94\x01\xa1x\xc0\xc0"), 0, HPD_RPC_ERR_INVALID,
         "response id must be an integer from 0 to 2^32-1"},
        {LIT("\x92\x02\xa1m"), 0, HPD_RPC_ERR_INVALID, "message must start with a type 0, 1 or 2"},
    };
    for (size_t i = 0; i < sizeof(closing) / sizeof(closing[0]); i++) {
        rec_t r = {0};
        peer_t *p;
        hpd_rpc_conn_t *conn = conn_pair(&r, closing[i].max_message, &p);
        (void)conn;
        peer_send(p, closing[i].bytes, closing[i].n);
        print_message("closing case %zu\n", i);
        expect_error_notice_and_close(p, closing[i].code, closing[i].message);
        LOOP_UNTIL(r.n_closes == 1);
        assert_int_equal(r.why, HPD_ERR_FORMAT);
        assert_int_equal(r.n_msgs, 0);
        peer_free(p);
    }

    /* garbage, and the peer gone before the answer can be written: still a
     * protocol error, not an I/O error */
    {
        rec_t r = {0};
        peer_t *p;
        conn_pair(&r, 0, &p);
        peer_send(p, LIT("\xc1"));
        close(p->fd);
        p->fd = -1;
        LOOP_UNTIL(r.n_closes == 1);
        assert_int_equal(r.why, HPD_ERR_FORMAT);
        peer_free(p);
    }

    /* a malformed request with a readable id: an INVALID reply naming the
     * problem, and the connection serves on */
    static const struct {
        const char *bytes;
        size_t n;
        uint32_t id;
        const char *message;
    } answered[] = {
        {LIT("\x94\x00\x07\x05\x90"), 7, "invalid request: request method must be a string of 1 "
                                       "to 64 bytes"},
        {LIT("\x93\x00\xce\xff\xff\xff\xff\xa1m"), UINT32_MAX,
         "invalid request: request must be [0, id, method, params]"},
        {LIT("\x92\x00\x00"), 0, "invalid request: message must start with a type 0, 1 or 2"},
        /* the id is what decides, not what follows it */
        {LIT("\x94\x00\x07\xcf\x00\x00\x00\x01\x00\x00\x00\x00\x90"), 7,
         "invalid request: request method must be a string of 1 to 64 bytes"},
    };
    rec_t r = {0};
    peer_t *p;
    hpd_rpc_conn_t *conn = conn_pair(&r, 0, &p);
    for (size_t i = 0; i < sizeof(answered) / sizeof(answered[0]); i++) {
        char msg[256];
        peer_send(p, answered[i].bytes, answered[i].n);
        expect_error_reply(p, answered[i].id, HPD_RPC_ERR_INVALID, msg, sizeof(msg));
        assert_string_equal(msg, answered[i].message);
    }
    send_request(p, 3, "fine", NULL, 0);
    LOOP_UNTIL(r.n_msgs == 1);
    assert_string_equal(r.method[0], "fine");
    assert_int_equal(r.n_closes, 0);
    assert_true(hpd_rpc_conn_is_open(conn));
    hpd_rpc_conn_close(conn, false); /* outside callbacks: on_close at once */
    assert_int_equal(r.n_closes, 1);
    assert_int_equal(r.why, HPD_OK);
    assert_false(peer_read(p));
    peer_free(p);

    /* [0] has no id to answer, even right after a message that had one
     * (whose objects the next message's unpacking may find in memory) */
    rec_t r2 = {0};
    conn = conn_pair(&r2, 0, &p);
    char msg[256];
    peer_send(p, LIT("\x94\x00\x07\x05\x90"));
    expect_error_reply(p, 7, HPD_RPC_ERR_INVALID, msg, sizeof(msg));
    peer_send(p, LIT("\x91\x00"));
    expect_error_notice_and_close(p, HPD_RPC_ERR_INVALID,
                                  "message must start with a type 0, 1 or 2");
    LOOP_UNTIL(r2.n_closes == 1);
    assert_int_equal(r2.why, HPD_ERR_FORMAT);
    peer_free(p);
}

/* Large messages and many small ones, all in one write: each is framed
 * and delivered, however the input buffer holds them. */
static void test_conn_large_messages(void **state)
{
    rec_t r = {0};
    peer_t *p;
    hpd_rpc_conn_t *conn = conn_pair(&r, 0, &p);
    hpd_rpc_buf_t b;
    static char text[3 << 20];
    static const size_t sizes[] = {(1 << 20) + 3, 5, 700001, 3 << 20, 1, 65537};
    int n = 0;

    (void)conn;
    memset(text, 'q', sizeof(text));
    hpd_rpc_buf_init(&b);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        hpd_rpc_pack_request(&b.pk, (uint32_t)i, i % 2 ? "small" : "large");
        msgpack_pack_str(&b.pk, sizes[i]);
        msgpack_pack_str_body(&b.pk, text, sizes[i]);
        n++;
        for (uint32_t k = 0; k < 50; k++, n++) {
            hpd_rpc_pack_notify(&b.pk, "tick");
            msgpack_pack_uint32(&b.pk, k);
        }
    }
    peer_send_buf(p, &b);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(r.n_msgs == n);
    assert_string_equal(r.method[0], "large");
    assert_int_equal(r.id[0], 0);
    assert_string_equal(r.method[1], "tick");
    spin(5);
    assert_int_equal(r.n_msgs, n);
    assert_int_equal(r.n_closes, 0);
    peer_free(p);
    LOOP_UNTIL(r.n_closes == 1);
}

/* A close inside on_msg: the messages behind it are not delivered, and
 * on_close runs once on_msg has returned. */
static void test_conn_close_in_callback(void **state)
{
    rec_t r = {.close_on_msg = true};
    peer_t *p;
    hpd_rpc_conn_t *conn = conn_pair(&r, 0, &p);
    hpd_rpc_buf_t b;

    (void)conn;
    hpd_rpc_buf_init(&b);
    for (uint32_t i = 0; i < 3; i++) {
        hpd_rpc_pack_request(&b.pk, i, "m");
        msgpack_pack_nil(&b.pk);
    }
    peer_send_buf(p, &b);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(r.n_closes == 1);
    assert_int_equal(r.n_msgs, 1);
    assert_false(r.closed_during_msg);
    assert_int_equal(r.why, HPD_OK);
    assert_false(peer_read(p));
    spin(5);
    assert_int_equal(r.n_msgs, 1);
    assert_int_equal(r.n_closes, 1);
    peer_free(p);
}

/* A flushing close writes everything queued before the socket goes; a
 * detached connection tells nobody. */
/* The kernel's retransmission timeout of a TCP connection (what the
 * coordinator widens its liveness windows by): on loopback between Linux's
 * 200 ms floor and its 1 s initial value; 0 on a socket that is not TCP. */
static void test_conn_rto(void **state)
{
    rec_t r = {0};
    peer_t *p;
    hpd_rpc_conn_t *conn = conn_pair(&r, 0, &p);
    assert_true(hpd_rpc_conn_rto(conn) == 0);
    hpd_rpc_conn_close(conn, false);
    peer_free(p);

    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    const int l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(l >= 0 && c >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &len), 0);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const int a = accept(l, NULL, NULL);
    assert_true(a >= 0);
    evutil_make_socket_nonblocking(a);
    hpd_rpc_conn_ops_t ops = {.on_msg = rec_msg, .on_close = rec_close, .arg = &r};
    assert_int_equal(hpd_rpc_conn_create(base, a, &ops, &conn), HPD_OK);
    const double rto = hpd_rpc_conn_rto(conn);
    if (!(rto >= 0.2 && rto <= 1.0))
        fail_msg("loopback RTO %.3f s, not within [0.2, 1] s", rto);
    hpd_rpc_conn_close(conn, false);
    close(c);
    close(l);
}

static void test_conn_flush_and_detach(void **state)
{
    rec_t r = {0};
    peer_t *p;
    hpd_rpc_conn_t *conn = conn_pair(&r, 0, &p);
    hpd_rpc_buf_t b;
    static char big[1 << 20];

    memset(big, 'z', sizeof(big));
    hpd_rpc_buf_init(&b);
    msgpack_pack_str(&b.pk, sizeof(big));
    msgpack_pack_str_body(&b.pk, big, sizeof(big));
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(hpd_rpc_reply(conn, i, &b), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_conn_close(conn, true);
    assert_false(hpd_rpc_conn_is_open(conn));
    for (uint32_t i = 0; i < 3; i++) {
        assert_true(peer_read(p));
        assert_int_equal(p->msg.id, i);
        assert_int_equal(p->msg.result->via.str.size, sizeof(big));
    }
    assert_false(peer_read(p));
    LOOP_UNTIL(r.n_closes == 1);
    assert_int_equal(r.why, HPD_OK);
    peer_free(p);

    /* detached: no callback, also not for the close */
    rec_t r2 = {0};
    conn = conn_pair(&r2, 0, &p);
    hpd_rpc_conn_detach(conn);
    send_request(p, 1, "m", NULL, 0);
    shutdown(p->fd, SHUT_WR);
    assert_false(peer_read(p));
    spin(5);
    assert_int_equal(r2.n_msgs, 0);
    assert_int_equal(r2.n_closes, 0);
    peer_free(p);
}

/* ------------------------------------------------------------ a server */

#define TOKEN "s3cret-token"

typedef struct {
    hpd_rpc_conn_t *conn;
    uint32_t id;
    uint64_t tag;
} held_t;

typedef struct {
    held_t held[16];
    int n_held;
    int n_disconnects;
    hpd_rpc_conn_t *last_disconnect;
} app_t;

static app_t app;

static void m_echo(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_buf_t b;
    assert_ptr_equal(arg, &app);
    hpd_rpc_buf_init(&b);
    msgpack_pack_object(&b.pk, *params);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

/* Keeps the call (and a reference) until the test answers it. */
static void m_hold(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    assert_true(app.n_held < 16);
    held_t *h = &app.held[app.n_held++];
    h->conn = conn;
    h->id = id;
    h->tag = params->type == MSGPACK_OBJECT_ARRAY && params->via.array.size > 0
                 ? params->via.array.ptr[0].via.u64
                 : 0;
    hpd_rpc_conn_ref(conn);
}

/* A notification to the caller, then the reply. */
static void m_sub(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_object(&b.pk, *params);
    hpd_rpc_notify(conn, "update", &b);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_reply(conn, id, NULL);
}

/* Closes the caller's connection without a reply. */
static void m_bye(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_conn_close(conn, false);
}

/* Sends the caller a request, which a client does not take. */
static void m_ask(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_conn_send(conn, LIT("\x94\x00\x09\xa1q\x90"));
}

/* The same, with params that look like a request themselves. */
static void m_ask2(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_conn_send(conn, LIT("\x94\x00\x09\xa1q\x92\x00\x03"));
}

/* "add" and "add2": names that share a prefix */
static void m_add(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_str(&b.pk, "add");
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static void m_add2(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_str(&b.pk, "add2");
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static void on_disconnect(hpd_rpc_conn_t *conn, void *arg)
{
    assert_ptr_equal(arg, &app);
    app.n_disconnects++;
    app.last_disconnect = conn;
}

static const hpd_rpc_method_t methods[] = {
    {.name = "echo", .fn = m_echo}, {.name = "hold", .fn = m_hold}, {.name = "sub", .fn = m_sub},
    {.name = "bye", .fn = m_bye},   {.name = "ask", .fn = m_ask},   {.name = "add", .fn = m_add},
    {.name = "add2", .fn = m_add2}, {.name = "ask2", .fn = m_ask2},
};

static hpd_rpc_server_t *server_new(const char *token, uint32_t max_conns, size_t max_message)
{
    hpd_rpc_server_t *s;
    hpd_rpc_server_params_t sp = {.base = base,
                                  .host = "127.0.0.1",
                                  .token = token,
                                  .methods = methods,
                                  .n_methods = sizeof(methods) / sizeof(methods[0]),
                                  .arg = &app,
                                  .max_message = max_message,
                                  .max_conns = max_conns,
                                  .on_disconnect = on_disconnect};
    memset(&app, 0, sizeof(app));
    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    assert_int_not_equal(hpd_rpc_server_port(s), 0);
    return s;
}

/* Answers held call i with its tag as the result. */
static void release(int i)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_uint64(&b.pk, app.held[i].tag);
    hpd_rpc_reply(app.held[i].conn, app.held[i].id, &b);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_conn_unref(app.held[i].conn);
    app.held[i].conn = NULL;
}

static void release_all(void)
{
    for (int i = 0; i < app.n_held; i++)
        if (app.held[i].conn != NULL)
            release(i);
}

static int raw_socket(uint16_t port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    return fd;
}

static peer_t *raw_peer(hpd_rpc_server_t *s)
{
    return peer_new(raw_socket(hpd_rpc_server_port(s)));
}

static hpd_rpc_client_params_t client_params(hpd_rpc_server_t *s, const char *token)
{
    return (hpd_rpc_client_params_t){.base = base,
                                     .host = "127.0.0.1",
                                     .port = hpd_rpc_server_port(s),
                                     .token = token,
                                     .timeout_ms = 5000};
}

static hpd_status_t client_new(hpd_rpc_server_t *s, const char *token, hpd_rpc_client_t **c)
{
    hpd_rpc_client_params_t cp = client_params(s, token);
    return hpd_rpc_client_create(&cp, c);
}

static void ping_ok(hpd_rpc_client_t *c)
{
    hpd_rpc_result_t r;
    assert_int_equal(hpd_rpc_call_sync(c, "ping", NULL, 0, &r), HPD_OK);
    assert_false(r.is_error);
    assert_int_equal(r.result.type, MSGPACK_OBJECT_STR);
    assert_true(hpd_rpc_str_eq(r.result.via.str.ptr, r.result.via.str.size, "pong"));
    hpd_rpc_result_destroy(&r);
}

/* The bind address defaults to 127.0.0.1 (also the client's host); an
 * address that is not IPv4 and a port in use are refused. */
static void test_server_bind(void **state)
{
    hpd_rpc_server_t *s, *s2;
    hpd_rpc_client_t *c;
    hpd_rpc_server_params_t sp = {.base = base, .methods = methods, .n_methods = 1};

    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    const uint16_t port = hpd_rpc_server_port(s);
    assert_int_not_equal(port, 0);
    hpd_rpc_client_params_t cp = {.base = base, .port = port, .timeout_ms = 20000};
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    assert_true(hpd_rpc_client_is_open(c));
    ping_ok(c);
    hpd_rpc_client_destroy(c);

    sp.host = "localhost";
    assert_int_equal(hpd_rpc_server_create(&sp, &s2), HPD_ERR_INVALID_ARG);
    sp.host = "127.0.0.1";
    sp.port = port;
    assert_int_equal(hpd_rpc_server_create(&sp, &s2), HPD_ERR_IO);
    hpd_rpc_server_destroy(s);
    hpd_rpc_server_destroy(NULL);
}

/* The token: only the whole string, as a string, in [token]. */
static void test_server_auth(void **state)
{
    hpd_rpc_server_t *s = server_new(TOKEN, 0, 0);
    hpd_rpc_client_t *c;
    char msg[256];

    static const char *wrong[] = {
        "s3cret-tokeX", /* same length, same first byte */
        "X3cret-token", /* same length, another first byte */
        "s3cret-toke",  "s3cret-token2", "", "S3CRET-TOKEN",
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++)
        assert_int_equal(client_new(s, wrong[i], &c), HPD_ERR_INVALID_ARG);
    assert_int_equal(client_new(s, NULL, &c), HPD_ERR_INVALID_ARG);
    assert_int_equal(client_new(s, TOKEN, &c), HPD_OK);
    ping_ok(c);
    hpd_rpc_client_destroy(c);

    /* the right bytes in the wrong shape: an AUTH error, then the close */
    static const struct {
        const char *params;
        size_t n;
    } shapes[] = {
        {LIT("\x91\xc4\x0c" TOKEN)},         /* [bin] */
        {LIT("\xac" TOKEN)},                 /* a bare string */
        {LIT("\x92\xac" TOKEN "\xac" TOKEN)}, /* [token, token] */
        {LIT("\x91\x05")},                    /* [5] */
        {LIT("\x81\xa1t\xac" TOKEN)},        /* {"t": token} */
        {LIT("\x81\xac" TOKEN "\xc0")},      /* {token: nil} */
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        peer_t *p = raw_peer(s);
        send_request(p, 1, "auth", shapes[i].params, shapes[i].n);
        expect_error_reply(p, 1, HPD_RPC_ERR_AUTH, msg, sizeof(msg));
        assert_non_null(strstr(msg, "authentication failed"));
        assert_false(peer_read(p));
        peer_free(p);
    }

    /* another first request, a notification, a response: refused likewise */
    peer_t *p = raw_peer(s);
    send_request(p, 4, "ping", NULL, 0);
    expect_error_reply(p, 4, HPD_RPC_ERR_AUTH, msg, sizeof(msg));
    assert_false(peer_read(p));
    peer_free(p);
    p = raw_peer(s);
    peer_send(p, LIT("\x93\x02\xa4ping\x90"));
    expect_error_notice_and_close(p, HPD_RPC_ERR_INVALID, "the server takes requests only");
    peer_free(p);

    /* authenticated: "hybridpd" (the token in any string format); a
     * notification is ignored, a response is refused with a close */
    p = raw_peer(s);
    send_request(p, 1, "auth", LIT("\x91\xd9\x0c" TOKEN));
    expect_str_reply(p, 1, "hybridpd");
    peer_send(p, LIT("\x93\x02\xa4ping\x90"));
    send_request(p, 2, "ping", NULL, 0);
    expect_str_reply(p, 2, "pong");
    peer_send(p, LIT("\x94\x01\x02\xc0\xc0"));
    expect_error_notice_and_close(p, HPD_RPC_ERR_INVALID, "the server takes requests only");
    peer_free(p);
    /* likewise when what the message carries looks like a request: a
     * response with result [0, 7], a notification with params [0, 9] */
    p = raw_peer(s);
    send_request(p, 1, "auth", LIT("\x91\xac" TOKEN));
    expect_str_reply(p, 1, "hybridpd");
    peer_send(p, LIT("\x94\x01\x02\xc0\x92\x00\x07"));
    expect_error_notice_and_close(p, HPD_RPC_ERR_INVALID, "the server takes requests only");
    peer_free(p);
    p = raw_peer(s);
    peer_send(p, LIT("\x93\x02\xa1m\x92\x00\x09"));
    expect_error_notice_and_close(p, HPD_RPC_ERR_INVALID, "the server takes requests only");
    peer_free(p);
    LOOP_UNTIL(app.n_disconnects == 19);
    hpd_rpc_server_destroy(s);

    /* an open server (no token) takes any auth first, and serves without */
    s = server_new(NULL, 0, 0);
    p = raw_peer(s);
    send_request(p, 8, "ping", NULL, 0);
    expect_str_reply(p, 8, "pong");
    peer_free(p);
    p = raw_peer(s);
    send_request(p, 9, "auth", LIT("\x91\xa5other"));
    expect_str_reply(p, 9, "hybridpd");
    send_request(p, 10, "ping", NULL, 0);
    expect_str_reply(p, 10, "pong");
    peer_free(p);
    p = raw_peer(s);
    send_request(p, 1, "auth", LIT("\x90"));
    expect_str_reply(p, 1, "hybridpd");
    peer_free(p);
    hpd_rpc_server_destroy(s);
}

/* Dispatch by the whole method name; an unknown method is named. */
static void test_server_methods(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    peer_t *p = raw_peer(s);
    char msg[256];

    send_request(p, 1, "add", NULL, 0);
    expect_str_reply(p, 1, "add");
    send_request(p, 2, "add2", NULL, 0);
    expect_str_reply(p, 2, "add2");
    send_request(p, 3, "ad", NULL, 0);
    expect_error_reply(p, 3, HPD_RPC_ERR_NO_METHOD, msg, sizeof(msg));
    assert_string_equal(msg, "unknown method 'ad'");
    send_request(p, 4, "add22", NULL, 0);
    expect_error_reply(p, 4, HPD_RPC_ERR_NO_METHOD, msg, sizeof(msg));
    assert_string_equal(msg, "unknown method 'add22'");
    send_request(p, 5, "echo", LIT("\x92\x01\xa1x"));
    assert_true(peer_read(p));
    assert_int_equal(p->msg.id, 5);
    assert_int_equal(p->msg.result->via.array.size, 2);
    assert_true(hpd_rpc_str_eq(p->msg.result->via.array.ptr[1].via.str.ptr, 1, "x"));
    peer_free(p);
    hpd_rpc_server_destroy(s);
}

static void server_stats(hpd_rpc_server_t *s, hpd_rpc_server_stats_t *st)
{
    hpd_rpc_server_stats(s, st);
}

/* Whether the peer's socket was closed by the server (EOF), without
 * blocking. */
static bool peer_closed(peer_t *p)
{
    peer_pump(p);
    return p->eof;
}

/* Connections that never authenticate cannot lock anyone out: at most
 * max_unauthed at once (the oldest goes for a new one), each closed after
 * auth_timeout_ms, none may send more than max_auth_message bytes before
 * authenticating; authenticated connections are not touched; the server
 * counts each kind of closing. */
static void test_server_unauthenticated(void **state)
{
    hpd_rpc_server_t *s;
    hpd_rpc_server_params_t sp = {.base = base,
                                  .host = "127.0.0.1",
                                  .token = TOKEN,
                                  .methods = methods,
                                  .n_methods = sizeof(methods) / sizeof(methods[0]),
                                  .arg = &app,
                                  .max_unauthed = 3,
                                  .auth_timeout_ms = 300,
                                  .max_auth_message = 100};
    hpd_rpc_server_stats_t st;
    peer_t *idle[6];
    hpd_rpc_client_t *c;

    memset(&app, 0, sizeof(app));
    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    for (int i = 0; i < 6; i++) {
        idle[i] = raw_peer(s);
        /* one at a time: which is the oldest is then known */
        LOOP_UNTIL((server_stats(s, &st), st.open == (uint32_t)HPD_MIN(i + 1, 3)) &&
                   st.evicted == (uint64_t)HPD_MAX(i - 2, 0));
    }
    assert_int_equal(st.unauthenticated, 3);
    for (int i = 0; i < 3; i++)
        LOOP_UNTIL(peer_closed(idle[i])); /* the three oldest went */
    for (int i = 3; i < 6; i++)
        assert_false(peer_closed(idle[i]));

    /* a client still gets in (one more idle socket goes), and stays */
    assert_int_equal(client_new(s, TOKEN, &c), HPD_OK);
    ping_ok(c);
    server_stats(s, &st);
    assert_int_equal(st.evicted, 4);
    LOOP_UNTIL(peer_closed(idle[3]));

    /* the rest time out; the client does not */
    LOOP_UNTIL(peer_closed(idle[4]) && peer_closed(idle[5]));
    server_stats(s, &st);
    assert_int_equal(st.auth_timeouts, 2);
    assert_int_equal(st.unauthenticated, 0);
    assert_int_equal(st.open, 1);
    assert_int_equal(st.refused, 0);
    ping_ok(c);

    /* before auth, 100 bytes at most; after it, the usual limit */
    peer_t *big = raw_peer(s);
    hpd_rpc_buf_t b;
    char text[200];
    memset(text, 'a', sizeof(text));
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 1, "auth");
    msgpack_pack_array(&b.pk, 1);
    msgpack_pack_str(&b.pk, sizeof(text));
    msgpack_pack_str_body(&b.pk, text, sizeof(text));
    peer_send_buf(big, &b);
    hpd_rpc_buf_destroy(&b);
    expect_error_notice_and_close(big, HPD_RPC_ERR_TOO_LARGE,
                                  "message declares 200 payload bytes, beyond the limit of 100 "
                                  "bytes");
    peer_free(big);
    hpd_rpc_result_t r;
    hpd_rpc_buf_init(&b);
    msgpack_pack_str(&b.pk, sizeof(text));
    msgpack_pack_str_body(&b.pk, text, sizeof(text));
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &b, 0, &r), HPD_OK);
    assert_false(r.is_error);
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&b);

    /* a wrong token is counted */
    hpd_rpc_client_t *bad;
    assert_int_equal(client_new(s, "wrong-token-of-same-len", &bad), HPD_ERR_INVALID_ARG);
    LOOP_UNTIL((server_stats(s, &st), st.unauthenticated == 0));
    assert_int_equal(st.auth_failures, 1);
    for (int i = 0; i < 6; i++)
        peer_free(idle[i]);
    hpd_rpc_client_destroy(c);
    LOOP_UNTIL((server_stats(s, &st), st.open == 0));
    hpd_rpc_server_destroy(s);
}

static uint32_t roles_auth(void *arg, const char *token, size_t len, char *who, size_t who_len,
                           uint64_t *cred)
{
    if (len == 12 && memcmp(token, "client-token", 12) == 0) {
        snprintf(who, who_len, "tenant t1");
        *cred = 1;
        return 1;
    }
    if (len == 10 && memcmp(token, "node-token", 10) == 0) {
        snprintf(who, who_len, "node");
        *cred = 2;
        return 2;
    }
    return 0;
}

static bool is_credential_1(const hpd_rpc_conn_t *conn, void *arg)
{
    return hpd_rpc_conn_credential(conn) == 1;
}

/* An authenticate callback decides the roles; a method limited to roles a
 * connection lacks is refused with an AUTH error naming the credential,
 * and the connection stays open; close_if closes the connections of one
 * credential and leaves the rest. */
static void test_server_roles(void **state)
{
    static const hpd_rpc_method_t limited[] = {{.name = "echo", .fn = m_echo},
                                               {.name = "add", .fn = m_add, .roles = 2}};
    hpd_rpc_server_params_t sp = {.base = base, .host = "127.0.0.1", .methods = limited,
                                  .n_methods = 2, .arg = &app, .authenticate = roles_auth,
                                  .on_disconnect = on_disconnect};
    hpd_rpc_server_t *s;
    hpd_rpc_client_t *client, *node, *nobody;
    hpd_rpc_result_t r;
    hpd_rpc_buf_t b;
    memset(&app, 0, sizeof(app));
    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    assert_int_equal(client_new(s, "client-token", &client), HPD_OK);
    assert_int_equal(client_new(s, "node-token", &node), HPD_OK);
    assert_int_equal(client_new(s, "other-token", &nobody), HPD_ERR_INVALID_ARG);
    for (int who = 0; who < 2; who++) {
        hpd_rpc_buf_init(&b);
        msgpack_pack_array(&b.pk, 2);
        msgpack_pack_int(&b.pk, 2);
        msgpack_pack_int(&b.pk, 3);
        assert_int_equal(hpd_rpc_call_sync(who ? node : client, "add", &b, 0, &r), HPD_OK);
        hpd_rpc_buf_destroy(&b);
        if (who == 0) {
            assert_true(r.is_error);
            assert_int_equal(r.error_code, HPD_RPC_ERR_AUTH);
            assert_string_equal(r.error_message, "method 'add' is not allowed with the "
                                                 "credential of this connection (tenant t1)");
        } else {
            assert_false(r.is_error);
        }
        hpd_rpc_result_destroy(&r);
    }
    ping_ok(client); /* still open */
    assert_int_equal(hpd_rpc_server_close_if(s, is_credential_1, NULL), 1);
    LOOP_UNTIL(!hpd_rpc_client_is_open(client));
    ping_ok(node);
    hpd_rpc_client_destroy(client);
    hpd_rpc_client_destroy(node);
    LOOP_UNTIL(app.n_disconnects == 3);
    hpd_rpc_server_destroy(s);
}

static struct rlimit nofile; /* the limit test_server_out_of_descriptors lowers */

static int restore_nofile(void **state)
{
    if (nofile.rlim_cur != 0)
        setrlimit(RLIMIT_NOFILE, &nofile);
    return 0;
}

/* accept() failing for want of descriptors pauses accepting (instead of
 * spinning on the pending connection) and counts a refusal; once
 * descriptors are free the pending connection is accepted and served. */
static void test_server_out_of_descriptors(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_server_stats_t st;
    struct rlimit low;
    peer_t *p = raw_peer(s); /* connected in the kernel, not yet accepted */
    const int lowest = dup(0); /* every descriptor below it is in use */
    assert_true(lowest > 0);
    close(lowest);
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &nofile), 0);
    low = nofile;
    low.rlim_cur = (rlim_t)lowest;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    LOOP_UNTIL((server_stats(s, &st), st.refused >= 1));
    assert_int_equal(st.open, 0);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &nofile), 0);
    LOOP_UNTIL((server_stats(s, &st), st.open == 1));
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 7, "ping");
    msgpack_pack_array(&b.pk, 0);
    peer_send_buf(p, &b);
    hpd_rpc_buf_destroy(&b);
    assert_true(peer_read(p));
    assert_int_equal(p->msg.type, HPD_RPC_RESPONSE);
    assert_int_equal(p->msg.id, 7);
    peer_free(p);
    LOOP_UNTIL((server_stats(s, &st), st.open == 0));
    hpd_rpc_server_destroy(s);
}

/* max_conns: a connection beyond it is closed at once, the others are
 * served, and a closed one frees its place (on_disconnect once each). */
static void test_server_limits(void **state)
{
    hpd_rpc_server_t *s = server_new(TOKEN, 2, 256);
    hpd_rpc_client_t *a, *b, *c;
    hpd_rpc_result_t r;

    assert_int_equal(client_new(s, TOKEN, &a), HPD_OK);
    assert_int_equal(client_new(s, TOKEN, &b), HPD_OK);
    assert_int_equal(client_new(s, TOKEN, &c), HPD_ERR_IO);
    ping_ok(a);
    ping_ok(b);
    assert_int_equal(app.n_disconnects, 0);
    hpd_rpc_client_destroy(b);
    LOOP_UNTIL(app.n_disconnects == 1);
    assert_int_equal(client_new(s, TOKEN, &c), HPD_OK);
    ping_ok(c);
    ping_ok(a);

    /* max_message: 256 bytes in all */
    hpd_rpc_buf_t big;
    char text[300];
    memset(text, 'a', sizeof(text));
    hpd_rpc_buf_init(&big);
    msgpack_pack_str(&big.pk, 200);
    msgpack_pack_str_body(&big.pk, text, 200);
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &big, 0, &r), HPD_OK);
    assert_int_equal(r.result.via.str.size, 200);
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&big);
    hpd_rpc_buf_init(&big);
    msgpack_pack_str(&big.pk, 260);
    msgpack_pack_str_body(&big.pk, text, 260);
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &big, 0, &r), HPD_ERR_IO);
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&big);
    assert_false(hpd_rpc_client_is_open(c));
    LOOP_UNTIL(app.n_disconnects == 2);
    ping_ok(a);
    hpd_rpc_client_destroy(c);
    hpd_rpc_client_destroy(a);
    LOOP_UNTIL(app.n_disconnects == 3);
    hpd_rpc_server_destroy(s);

    /* 0: the default limit (1024), more than these three */
    s = server_new(NULL, 0, 0);
    assert_int_equal(client_new(s, NULL, &a), HPD_OK);
    assert_int_equal(client_new(s, NULL, &b), HPD_OK);
    assert_int_equal(client_new(s, NULL, &c), HPD_OK);
    ping_ok(c);
    hpd_rpc_client_destroy(a);
    hpd_rpc_client_destroy(b);
    hpd_rpc_client_destroy(c);
    LOOP_UNTIL(app.n_disconnects == 3);
    hpd_rpc_server_destroy(s);
}

typedef struct {
    int n_closes;
    hpd_status_t why;
    int n_notes;
    char note_method[32];
    uint64_t note_value;
    bool reply_seen_at_note; /* the reply had come when the notification did */
    int n_replies;
} client_rec_t;

static void crec_close(void *arg, hpd_status_t why)
{
    client_rec_t *r = arg;
    r->n_closes++;
    r->why = why;
}

static void crec_notify(void *arg, const hpd_rpc_msg_t *m)
{
    client_rec_t *r = arg;
    r->n_notes++;
    snprintf(r->note_method, sizeof(r->note_method), "%.*s", (int)m->method_len, m->method);
    r->note_value = m->params->type == MSGPACK_OBJECT_ARRAY ? m->params->via.array.ptr[0].via.u64
                                                            : 0;
    r->reply_seen_at_note = r->n_replies > 0;
}

/* Destroying the server closes its connections: the clients see the close
 * and their pending calls fail. */
static void test_server_destroy_closes(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    client_rec_t rec = {0};
    hpd_rpc_client_params_t cp = client_params(s, NULL);
    hpd_rpc_client_t *c;
    hpd_rpc_result_t r;

    cp.on_close = crec_close;
    cp.arg = &rec;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    ping_ok(c);
    hpd_rpc_server_destroy(s);
    LOOP_UNTIL(rec.n_closes == 1);
    assert_int_equal(rec.why, HPD_OK);
    assert_false(hpd_rpc_client_is_open(c));
    assert_int_equal(hpd_rpc_call_sync(c, "ping", NULL, 0, &r), HPD_ERR_IO);
    hpd_rpc_result_destroy(&r);
    hpd_rpc_client_destroy(c);
    assert_int_equal(rec.n_closes, 1);
}

static void test_read_token(void **state)
{
    char dir[128], path[256], *tok;
    test_tmpdir(dir, sizeof(dir), "rpc-local");
    snprintf(path, sizeof(path), "%s/token", dir);

    static const struct {
        const char *text;
        const char *token;
    } cases[] = {
        {"abc", "abc"},
        {"  abc \t\r\nsecond line\n", "abc"},
        {"\n\n  a b c\n", "a b c"},
        {"abc\r", "abc"},
        {"a\tb c\n", "a\tb c"},     /* white space inside stays */
        {"abc\rdef\n", "abc"},      /* a line ends at \r too */
        {"\f\vabc\f\v\n", "abc"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(hpd_write_file(path, cases[i].text, strlen(cases[i].text)), HPD_OK);
        assert_int_equal(hpd_rpc_read_token(path, &tok), HPD_OK);
        assert_string_equal(tok, cases[i].token);
        free(tok);
    }
    assert_int_equal(hpd_write_file(path, " \t\n\n", 4), HPD_OK);
    assert_int_equal(hpd_rpc_read_token(path, &tok), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_write_file(path, "", 0), HPD_OK);
    assert_int_equal(hpd_rpc_read_token(path, &tok), HPD_ERR_INVALID_ARG);
    snprintf(path, sizeof(path), "%s/missing", dir);
    assert_int_not_equal(hpd_rpc_read_token(path, &tok), HPD_OK);
    test_rmtree(dir);
}

/* ------------------------------------------------------------ a client */

typedef struct {
    int n;
    hpd_status_t status;
    bool had_reply;
    uint64_t value;
    bool is_error;
} cb_rec_t;

static void on_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    cb_rec_t *r = arg;
    r->n++;
    r->status = st;
    r->had_reply = reply != NULL;
    if (reply != NULL) {
        r->is_error = reply->is_error;
        r->value = reply->result->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? reply->result->via.u64
                                                                           : UINT64_MAX;
    }
}

/* event_add (libevent, linked with --wrap): the timeout each event was
 * last added with, so that a test reads a timer's period exactly rather
 * than what is left of it (which a loaded core shortens). */
int __real_event_add(struct event *ev, const struct timeval *tv);
static struct {
    const struct event *ev;
    struct timeval tv;
} added[64];

int __wrap_event_add(struct event *ev, const struct timeval *tv)
{
    if (tv != NULL) {
        int free_slot = -1;
        for (int i = 0; i < 64; i++) {
            if (added[i].ev == ev) {
                added[i].tv = *tv;
                return __real_event_add(ev, tv);
            }
            if (free_slot < 0 && added[i].ev == NULL)
                free_slot = i;
        }
        if (free_slot < 0)
            free_slot = 0; /* the oldest entries go */
        added[free_slot].ev = ev;
        added[free_slot].tv = *tv;
    }
    return __real_event_add(ev, tv);
}

static int find_timer(const struct event_base *b, const struct event *ev, void *arg)
{
    const struct event **found = arg;
    if (event_get_fd(ev) == -1 && event_pending(ev, EV_TIMEOUT, NULL)) {
        if (*found != NULL)
            fail_msg("more than one timer pending");
        *found = ev;
    }
    return 0;
}

/* Fails unless the one timer pending (the call's) was set to want_ms. */
static void expect_call_timer(uint32_t want_ms, const char *what)
{
    const struct event *ev = NULL;
    event_base_foreach_event(base, find_timer, &ev);
    if (ev == NULL)
        fail_msg("%s: no timer pending", what);
    for (int i = 0; i < 64; i++)
        if (added[i].ev == ev) {
            const struct timeval *tv = &added[i].tv;
            if (tv->tv_sec != (time_t)(want_ms / 1000) ||
                tv->tv_usec != (suseconds_t)(want_ms % 1000) * 1000)
                fail_msg("%s times out in %ld s %ld us, not %u ms", what, (long)tv->tv_sec,
                         (long)tv->tv_usec, want_ms);
            return;
        }
    fail_msg("%s: its timer was not added through event_add", what);
}

/* The call's timeout: its own, else the client's, else 10 s. */
static void test_client_timeouts(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_params_t cp = client_params(s, NULL);
    hpd_rpc_client_t *c;
    cb_rec_t r = {0};

    cp.timeout_ms = 0;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    ping_ok(c);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 0, on_reply, &r), HPD_OK);
    expect_call_timer(10000, "a call with no timeout on a client with none");
    LOOP_UNTIL(app.n_held == 1);
    release(0);
    LOOP_UNTIL(r.n == 1);
    assert_int_equal(r.status, HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 2500, on_reply, &r), HPD_OK);
    expect_call_timer(2500, "a call of 2500 ms");
    LOOP_UNTIL(app.n_held == 2);
    release(1);
    LOOP_UNTIL(r.n == 2);
    hpd_rpc_client_destroy(c);

    cp.timeout_ms = 3500;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 0, on_reply, &r), HPD_OK);
    expect_call_timer(3500, "a call on a client of 3500 ms");
    LOOP_UNTIL(app.n_held == 3);
    release(2);
    LOOP_UNTIL(r.n == 3);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 1200, on_reply, &r), HPD_OK);
    expect_call_timer(1200, "a call of 1200 ms on a client of 3500 ms");
    LOOP_UNTIL(app.n_held == 4);
    release(3);
    LOOP_UNTIL(r.n == 4);

    /* a call that times out: its callback once, without a reply; the late
     * reply is dropped and the connection serves on */
    cb_rec_t t = {0};
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 1, on_reply, &t), HPD_OK);
    LOOP_UNTIL(t.n == 1);
    assert_int_equal(t.status, HPD_ERR_TIMEOUT);
    assert_false(t.had_reply);
    LOOP_UNTIL(app.n_held == 5);
    release(4);
    ping_ok(c);
    spin(5);
    assert_int_equal(t.n, 1);
    hpd_rpc_result_t res;
    assert_int_equal(hpd_rpc_call_sync(c, "hold", NULL, 1, &res), HPD_ERR_TIMEOUT);
    assert_int_equal(res.status, HPD_ERR_TIMEOUT);
    assert_false(res.is_error);
    assert_int_equal(res.result.type, MSGPACK_OBJECT_NIL);
    hpd_rpc_result_destroy(&res);
    LOOP_UNTIL(app.n_held == 6);
    release(5);
    ping_ok(c);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

/* Replies find their calls by id, in whatever order they come; a second
 * reply to an id is dropped. */
static void test_client_routing(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_t *c;
    cb_rec_t r[4] = {{0}};
    hpd_rpc_buf_t b;

    assert_int_equal(client_new(s, NULL, &c), HPD_OK);
    for (uint64_t i = 0; i < 4; i++) {
        hpd_rpc_buf_init(&b);
        msgpack_pack_array(&b.pk, 1);
        msgpack_pack_uint64(&b.pk, 100 + i);
        assert_int_equal(hpd_rpc_call(c, "hold", &b, 0, on_reply, &r[i]), HPD_OK);
        hpd_rpc_buf_destroy(&b);
    }
    LOOP_UNTIL(app.n_held == 4);
    static const int order[4] = {2, 0, 3, 1};
    bool released[4] = {false};
    for (int k = 0; k < 4; k++) {
        const int i = order[k];
        const uint32_t id = app.held[i].id;
        hpd_rpc_conn_t *conn = app.held[i].conn;
        hpd_rpc_conn_ref(conn);
        release(i);
        LOOP_UNTIL(r[i].n == 1);
        assert_int_equal(r[i].status, HPD_OK);
        assert_false(r[i].is_error);
        assert_int_equal(r[i].value, 100 + i);
        released[i] = true;
        for (int j = 0; j < 4; j++)
            assert_int_equal(r[j].n, released[j] ? 1 : 0);
        /* the same id again: nobody hears of it */
        hpd_rpc_buf_init(&b);
        msgpack_pack_uint64(&b.pk, 999);
        hpd_rpc_reply(conn, id, &b);
        hpd_rpc_buf_destroy(&b);
        hpd_rpc_conn_unref(conn);
    }
    ping_ok(c);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r[i].n, 1);
        assert_int_equal(r[i].value, 100 + i);
    }

    /* errors come back as they were sent */
    hpd_rpc_result_t res;
    assert_int_equal(hpd_rpc_call_sync(c, "nope", NULL, 0, &res), HPD_OK);
    assert_true(res.is_error);
    assert_int_equal(res.error_code, HPD_RPC_ERR_NO_METHOD);
    assert_string_equal(res.error_message, "unknown method 'nope'");
    hpd_rpc_result_destroy(&res);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

/* The sockets of this process connected to port: how many, and how many of
 * them have TCP_NODELAY. */
static void sockets_to(uint16_t port, int *n_p, int *nodelay_p)
{
    *n_p = *nodelay_p = 0;
    for (int fd = 0; fd < 1024; fd++) {
        struct sockaddr_in peer;
        socklen_t len = sizeof(peer);
        int on = 0;
        socklen_t olen = sizeof(on);
        if (getpeername(fd, (struct sockaddr *)&peer, &len) != 0 || peer.sin_family != AF_INET ||
            ntohs(peer.sin_port) != port)
            continue;
        ++*n_p;
        if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &olen) == 0 && on)
            ++*nodelay_p;
    }
}

/* Params: NULL and an empty buffer are both []; a value goes as it is.
 * The client's socket has TCP_NODELAY: a call is one small write, which
 * Nagle's algorithm would hold back behind an unanswered one. */
static void test_client_params(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_t *c;
    hpd_rpc_result_t res;
    hpd_rpc_buf_t b;
    int n, nodelay;

    assert_int_equal(client_new(s, NULL, &c), HPD_OK);
    sockets_to(hpd_rpc_server_port(s), &n, &nodelay);
    assert_int_equal(n, 1);
    assert_int_equal(nodelay, 1);
    assert_int_equal(hpd_rpc_call_sync(c, "echo", NULL, 0, &res), HPD_OK);
    assert_int_equal(res.result.type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(res.result.via.array.size, 0);
    hpd_rpc_result_destroy(&res);
    hpd_rpc_buf_init(&b);
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &b, 0, &res), HPD_OK);
    assert_int_equal(res.result.type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(res.result.via.array.size, 0);
    hpd_rpc_result_destroy(&res);
    msgpack_pack_map(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, "k");
    hpd_rpc_pack_str(&b.pk, "v");
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &b, 0, &res), HPD_OK);
    const msgpack_object *v = hpd_rpc_map_get(&res.result, "k");
    assert_non_null(v);
    assert_true(hpd_rpc_str_eq(v->via.str.ptr, v->via.str.size, "v"));
    hpd_rpc_buf_destroy(&b);
    /* the result outlives the loop's later turns (a copy of its own) */
    ping_ok(c);
    assert_true(hpd_rpc_str_eq(v->via.str.ptr, v->via.str.size, "v"));
    hpd_rpc_result_destroy(&res);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

/* Destroy fails every pending call with HPD_ERR_CANCELED, once, and closes
 * the connection (the server sees it go). */
static void test_client_destroy(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_t *c;
    cb_rec_t r[3] = {{0}};
    client_rec_t rec = {0};
    hpd_rpc_client_params_t cp = client_params(s, NULL);

    cp.on_close = crec_close;
    cp.arg = &rec;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(hpd_rpc_call(c, "hold", NULL, 0, on_reply, &r[i]), HPD_OK);
    LOOP_UNTIL(app.n_held == 3);
    hpd_rpc_client_destroy(c);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].n, 1);
        assert_int_equal(r[i].status, HPD_ERR_CANCELED);
        assert_false(r[i].had_reply);
    }
    LOOP_UNTIL(app.n_disconnects == 1);
    assert_int_equal(rec.n_closes, 0); /* the owner destroyed it: no callback */
    release_all();                     /* replies to a closed connection are dropped */
    spin(5);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r[i].n, 1);
    hpd_rpc_client_destroy(NULL);
    hpd_rpc_server_destroy(s);
}

/* The server closing the connection fails the pending calls with
 * HPD_ERR_IO and tells the owner; new calls fail at once. */
static void test_client_server_closes(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_t *c;
    cb_rec_t held = {0}, bye = {0}, after = {0};
    client_rec_t rec = {0};
    hpd_rpc_client_params_t cp = client_params(s, NULL);

    cp.on_close = crec_close;
    cp.arg = &rec;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 0, on_reply, &held), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "bye", NULL, 0, on_reply, &bye), HPD_OK);
    LOOP_UNTIL(rec.n_closes == 1);
    assert_int_equal(rec.why, HPD_OK);
    assert_int_equal(held.n, 1);
    assert_int_equal(held.status, HPD_ERR_IO);
    assert_false(held.had_reply);
    assert_int_equal(bye.n, 1);
    assert_int_equal(bye.status, HPD_ERR_IO);
    assert_false(hpd_rpc_client_is_open(c));
    assert_int_equal(hpd_rpc_call(c, "ping", NULL, 0, on_reply, &after), HPD_ERR_IO);
    spin(5);
    assert_int_equal(after.n, 0);
    hpd_rpc_client_destroy(c);
    assert_int_equal(held.n, 1);
    release_all();
    LOOP_UNTIL(app.n_disconnects == 1);

    /* a request from the server is a protocol error: the client closes */
    client_rec_t rec2 = {0};
    cb_rec_t ask = {0};
    cp.arg = &rec2;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "ask", NULL, 0, on_reply, &ask), HPD_OK);
    LOOP_UNTIL(rec2.n_closes == 1);
    assert_int_equal(rec2.why, HPD_ERR_FORMAT);
    assert_int_equal(ask.status, HPD_ERR_IO);
    LOOP_UNTIL(app.n_disconnects == 2);
    hpd_rpc_client_destroy(c);
    client_rec_t rec3 = {0};
    memset(&ask, 0, sizeof(ask));
    cp.arg = &rec3;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "ask2", NULL, 0, on_reply, &ask), HPD_OK);
    LOOP_UNTIL(rec3.n_closes == 1);
    assert_int_equal(rec3.why, HPD_ERR_FORMAT);
    assert_int_equal(ask.status, HPD_ERR_IO);
    LOOP_UNTIL(app.n_disconnects == 3);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

/* Notifications reach on_notify, in order with the replies. */
static void test_client_notifications(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_t *c;
    client_rec_t rec = {0};
    hpd_rpc_client_params_t cp = client_params(s, NULL);
    hpd_rpc_buf_t b;
    cb_rec_t r = {0};

    cp.on_notify = crec_notify;
    cp.arg = &rec;
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    hpd_rpc_buf_init(&b);
    msgpack_pack_array(&b.pk, 1);
    msgpack_pack_uint64(&b.pk, 77);
    assert_int_equal(hpd_rpc_call(c, "sub", &b, 0, on_reply, &r), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(r.n == 1);
    assert_int_equal(rec.n_notes, 1);
    assert_string_equal(rec.note_method, "update");
    assert_int_equal(rec.note_value, 77);
    assert_int_equal(r.status, HPD_OK);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

/* The non-blocking connect: calls may follow the token at once; a refused
 * token closes the connection and fails them. */
static void test_client_connect(void **state)
{
    hpd_rpc_server_t *s = server_new(TOKEN, 0, 0);
    hpd_rpc_client_t *c;
    client_rec_t rec = {0};
    cb_rec_t r = {0};
    hpd_rpc_client_params_t cp = client_params(s, TOKEN);

    cp.on_close = crec_close;
    cp.arg = &rec;
    assert_int_equal(hpd_rpc_client_connect(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "echo", NULL, 0, on_reply, &r), HPD_OK);
    LOOP_UNTIL(r.n == 1);
    assert_int_equal(r.status, HPD_OK);
    assert_false(r.is_error);
    hpd_rpc_client_destroy(c);
    assert_int_equal(rec.n_closes, 0);

    cp.token = "wrong";
    memset(&r, 0, sizeof(r));
    assert_int_equal(hpd_rpc_client_connect(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "echo", NULL, 0, on_reply, &r), HPD_OK);
    LOOP_UNTIL(rec.n_closes == 1);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.status, HPD_ERR_IO);
    assert_false(hpd_rpc_client_is_open(c));
    hpd_rpc_client_destroy(c);
    LOOP_UNTIL(app.n_disconnects == 2);
    hpd_rpc_server_destroy(s);
}

static volatile sig_atomic_t guard_fired;

static void on_guard(int sig)
{
    guard_fired = 1;
}

/* Connecting to nothing, or to a listener that never accepts (its queue
 * full: the kernel drops the SYN), fails with HPD_ERR_IO within the
 * client's timeout. A 10 s alarm interrupts a connect that waits for the
 * kernel's own timeout (minutes) instead. */
static void test_client_no_server(void **state)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t slen = sizeof(sin);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    hpd_rpc_client_t *c;

    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    assert_int_equal(bind(l, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sin, &slen), 0);
    const uint16_t port = ntohs(sin.sin_port);
    hpd_rpc_client_params_t cp = {.base = base, .port = port, .timeout_ms = 200};
    /* bound, not listening: refused */
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_ERR_IO);
    assert_int_equal(hpd_rpc_client_connect(&cp, &c), HPD_ERR_IO);

    /* listening with a queue of one, which a first connection fills */
    assert_int_equal(listen(l, 0), 0);
    const int first = raw_socket(port);
    struct sigaction sa = {.sa_handler = on_guard}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, &old); /* no SA_RESTART: connect returns EINTR */
    guard_fired = 0;
    struct itimerval guard = {.it_value = {10, 0}}, off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &guard, NULL);
    const hpd_status_t st = hpd_rpc_client_create(&cp, &c);
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    assert_int_equal(st, HPD_ERR_IO);
    assert_false(guard_fired);
    close(first);
    close(l);
}


/* A connection the peer resets is closed with HPD_ERR_IO (a clean end of
 * stream is HPD_OK); the client's host may be a name. */
static void test_client_reset(void **state)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t slen = sizeof(sin);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    hpd_rpc_client_t *c;
    client_rec_t rec = {0};
    cb_rec_t r = {0};

    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    assert_int_equal(bind(l, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(l, 4), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sin, &slen), 0);
    hpd_rpc_client_params_t cp = {.base = base, .host = "localhost", .port = ntohs(sin.sin_port),
                                  .timeout_ms = 5000, .on_close = crec_close, .arg = &rec};
    assert_int_equal(hpd_rpc_client_connect(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call(c, "ping", NULL, 0, on_reply, &r), HPD_OK);
    const int fd = accept(l, NULL, NULL);
    assert_true(fd >= 0);
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd); /* an RST */
    LOOP_UNTIL(rec.n_closes == 1);
    assert_int_equal(rec.why, HPD_ERR_IO);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.status, HPD_ERR_IO);
    hpd_rpc_client_destroy(c);
    close(l);
}

/* Connections come and go in any order: the server keeps count (the limit
 * admits as many again) and closes the rest when destroyed. */
static void test_server_connection_list(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 4, 0);
    hpd_rpc_client_t *c[8];
    client_rec_t rec[8] = {{0}};

    for (int i = 0; i < 4; i++) {
        hpd_rpc_client_params_t cp = client_params(s, NULL);
        cp.on_close = crec_close;
        cp.arg = &rec[i];
        assert_int_equal(hpd_rpc_client_create(&cp, &c[i]), HPD_OK);
    }
    assert_int_equal(client_new(s, NULL, &c[4]), HPD_ERR_IO);
    /* the newest, a middle one, the oldest */
    static const int order[3] = {3, 1, 0};
    for (int k = 0; k < 3; k++) {
        hpd_rpc_client_destroy(c[order[k]]);
        LOOP_UNTIL(app.n_disconnects == k + 1);
        ping_ok(c[2]);
    }
    for (int i = 4; i < 7; i++) {
        hpd_rpc_client_params_t cp = client_params(s, NULL);
        cp.on_close = crec_close;
        cp.arg = &rec[i];
        assert_int_equal(hpd_rpc_client_create(&cp, &c[i]), HPD_OK);
        ping_ok(c[i]);
    }
    assert_int_equal(client_new(s, NULL, &c[7]), HPD_ERR_IO);
    hpd_rpc_client_destroy(c[5]);
    LOOP_UNTIL(app.n_disconnects == 4);
    hpd_rpc_server_destroy(s);
    const int open[3] = {2, 4, 6};
    for (int k = 0; k < 3; k++) {
        LOOP_UNTIL(rec[open[k]].n_closes == 1);
        assert_false(hpd_rpc_client_is_open(c[open[k]]));
        hpd_rpc_client_destroy(c[open[k]]);
    }
    assert_int_equal(app.n_disconnects, 4); /* destroy tells no one */
}

static void m_long_error(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                         void *arg)
{
    char text[600];
    memset(text, 'e', sizeof(text) - 1);
    text[sizeof(text) - 1] = 0;
    hpd_rpc_reply_error(conn, id, -7, "%s", text);
}

/* An error reply keeps its code and as much of its message as fits: the
 * server's 511 bytes, the sync result's 255. */
static void test_long_error(void **state)
{
    hpd_rpc_server_t *s;
    const hpd_rpc_method_t ms[] = {{.name = "err", .fn = m_long_error}};
    hpd_rpc_server_params_t sp = {.base = base, .methods = ms, .n_methods = 1};
    hpd_rpc_client_t *c;
    hpd_rpc_result_t res;

    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    peer_t *p = peer_new(raw_socket(hpd_rpc_server_port(s)));
    char msg[1024];
    send_request(p, 1, "err", NULL, 0);
    expect_error_reply(p, 1, -7, msg, sizeof(msg));
    assert_int_equal(strlen(msg), 511);
    peer_free(p);
    hpd_rpc_client_params_t cp = {.base = base, .port = hpd_rpc_server_port(s),
                                  .timeout_ms = 5000};
    assert_int_equal(hpd_rpc_client_create(&cp, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call_sync(c, "err", NULL, 0, &res), HPD_OK);
    assert_true(res.is_error);
    assert_int_equal(res.error_code, -7);
    assert_int_equal(strlen(res.error_message), 255);
    assert_true(res.error_message[0] == 'e' && res.error_message[254] == 'e');
    assert_int_equal(res.result.type, MSGPACK_OBJECT_NIL);
    hpd_rpc_result_destroy(&res);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

/* What a client's life takes, here and in the server, is all given back:
 * calls answered, refused, timed out and cancelled, the connection's
 * close on both sides. */
static void test_client_memory_returned(void **state)
{
    hpd_rpc_server_t *s = server_new(TOKEN, 0, 0);
    hpd_rpc_client_t *c;
    hpd_rpc_result_t res;
    hpd_rpc_buf_t b;
    cb_rec_t t = {0}, h = {0};

    track();
    assert_int_equal(client_new(s, TOKEN, &c), HPD_OK);
    hpd_rpc_buf_init(&b);
    msgpack_pack_array(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, "value");
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &b, 0, &res), HPD_OK);
    hpd_rpc_result_destroy(&res);
    hpd_rpc_buf_destroy(&b);
    assert_int_equal(hpd_rpc_call_sync(c, "nope", NULL, 0, &res), HPD_OK);
    assert_true(res.is_error);
    hpd_rpc_result_destroy(&res);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 1, on_reply, &t), HPD_OK);
    LOOP_UNTIL(t.n == 1 && app.n_held == 1);
    release(0); /* a late reply */
    ping_ok(c);
    assert_int_equal(hpd_rpc_call(c, "hold", NULL, 0, on_reply, &h), HPD_OK);
    LOOP_UNTIL(app.n_held == 2);
    hpd_rpc_client_destroy(c);
    assert_int_equal(h.status, HPD_ERR_CANCELED);
    LOOP_UNTIL(app.n_disconnects == 1);
    release(1); /* to a closed connection: dropped */
    /* a refused token: the server's close */
    assert_int_equal(client_new(s, "wrong", &c), HPD_ERR_INVALID_ARG);
    LOOP_UNTIL(app.n_disconnects == 2);
    const size_t live = live_blocks();
    untrack();
    if (live != 0)
        fail_msg("%zu blocks allocated during the client's life are still there", live);
    hpd_rpc_server_destroy(s);
}

/* ------------------------------------------------------------ allocation failures */

/* The server refuses a connection whose bookkeeping it cannot allocate,
 * and serves on with its counts right (max_conns 1 still admits one). */
static void test_alloc_failures_server(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 1, 0);
    hpd_rpc_client_t *c;
    uint32_t k;

    for (k = 1;; k++) {
        peer_t *p = raw_peer(s);
        send_request(p, 1, "ping", NULL, 0); /* accepted (or not) in the loop, below */
        arm(k, ALLOC_CALLOC);
        const bool answered = peer_read(p);
        const bool hit = disarm();
        assert_true(answered != hit);
        if (answered)
            assert_int_equal(p->msg.id, 1);
        peer_free(p);
        if (!hit)
            break;
        assert_int_equal(app.n_disconnects, 0);
    }
    assert_true(k > 2); /* the node and the connection */
    LOOP_UNTIL(app.n_disconnects == 1);
    assert_int_equal(client_new(s, NULL, &c), HPD_OK);
    ping_ok(c);
    hpd_rpc_client_destroy(c);
    LOOP_UNTIL(app.n_disconnects == 2);
    hpd_rpc_server_destroy(s);

    hpd_rpc_server_params_t sp = {.base = base, .host = "127.0.0.1"};
    arm(1, ALLOC_CALLOC);
    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_ERR_NO_MEMORY);
    assert_true(disarm());
}

/* A client that cannot allocate says HPD_ERR_NO_MEMORY and leaves nothing
 * behind (the sanitizer build checks); a call that cannot is refused
 * without its callback, and the client serves on. */
static void test_alloc_failures_client(void **state)
{
    hpd_rpc_server_t *s = server_new(NULL, 0, 0);
    hpd_rpc_client_t *c;
    hpd_rpc_client_params_t cp = client_params(s, NULL);
    cb_rec_t r = {0};
    uint32_t k;
    int refused = 0;

    for (k = 1;; k++) {
        spin(3); /* the server accepts what an earlier round left queued */
        arm(k, ALLOC_CALLOC);
        const hpd_status_t st = hpd_rpc_client_create(&cp, &c);
        const bool hit = disarm();
        if (!hit) {
            assert_int_equal(st, HPD_OK);
            break;
        }
        /* the client's own allocations fail it with HPD_ERR_NO_MEMORY; the
         * server's (same process) refuse the connection: HPD_ERR_IO */
        if (st == HPD_ERR_NO_MEMORY)
            refused++;
        else
            assert_int_equal(st, HPD_ERR_IO);
    }
    assert_true(refused >= 3); /* the client, its connection, the auth call */
    ping_ok(c);

    /* the non-blocking connect: its own allocations only (the server's
     * come later, in the loop) */
    for (k = 1;; k++) {
        hpd_rpc_client_t *c2;
        spin(3);
        arm(k, ALLOC_CALLOC);
        const hpd_status_t st = hpd_rpc_client_connect(&cp, &c2);
        const bool hit = disarm();
        if (!hit) {
            assert_int_equal(st, HPD_OK);
            hpd_rpc_client_destroy(c2);
            break;
        }
        assert_int_equal(st, HPD_ERR_NO_MEMORY);
    }
    assert_true(k > 3);
    for (k = 1;; k++) {
        arm(k, ALLOC_CALLOC);
        const hpd_status_t st = hpd_rpc_call(c, "echo", NULL, 0, on_reply, &r);
        const bool hit = disarm();
        if (!hit) {
            assert_int_equal(st, HPD_OK);
            break;
        }
        if (st == HPD_OK) {
            LOOP_UNTIL(r.n == 1);
            r.n = 0;
        } else {
            assert_int_equal(st, HPD_ERR_NO_MEMORY);
            spin(3);
            assert_int_equal(r.n, 0);
        }
    }
    LOOP_UNTIL(r.n == 1);
    assert_int_equal(r.status, HPD_OK);
    hpd_rpc_client_destroy(c);
    hpd_rpc_server_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conn_messages_and_replies),
        cmocka_unit_test(test_conn_protocol_errors),
        cmocka_unit_test(test_conn_large_messages),
        cmocka_unit_test(test_conn_close_in_callback),
        cmocka_unit_test(test_conn_flush_and_detach),
        cmocka_unit_test(test_conn_rto),
        cmocka_unit_test(test_server_bind),
        cmocka_unit_test(test_server_auth),
        cmocka_unit_test(test_server_methods),
        cmocka_unit_test(test_server_limits),
        cmocka_unit_test(test_server_unauthenticated),
        cmocka_unit_test(test_server_roles),
        cmocka_unit_test_teardown(test_server_out_of_descriptors, restore_nofile),
        cmocka_unit_test(test_server_destroy_closes),
        cmocka_unit_test(test_read_token),
        cmocka_unit_test(test_client_timeouts),
        cmocka_unit_test(test_client_routing),
        cmocka_unit_test(test_client_params),
        cmocka_unit_test(test_client_destroy),
        cmocka_unit_test(test_client_server_closes),
        cmocka_unit_test(test_client_notifications),
        cmocka_unit_test(test_client_connect),
        cmocka_unit_test(test_client_no_server),
        cmocka_unit_test(test_client_reset),
        cmocka_unit_test(test_server_connection_list),
        cmocka_unit_test(test_long_error),
        cmocka_unit_test(test_client_memory_returned),
        cmocka_unit_test(test_alloc_failures_server),
        cmocka_unit_test(test_alloc_failures_client),
    };
    signal(SIGPIPE, SIG_IGN); /* a write to a closed socket is an error, as in the nodes */
    return cmocka_run_group_tests(tests, setup, teardown);
}
