/* msgpack-RPC between processes on 127.0.0.1: a server in a child process,
 * clients here. Authentication, timeouts, deferred replies, and hardening:
 * truncated, oversized, wrongly typed and random messages each get an error
 * or a close while the server keeps serving another client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/test_helpers.h"
#include "transport/rpc.h"

#define TOKEN "s3cret-token"
#define MAX_MSG (1u << 20)

static pid_t server_pid;
static uint16_t port;
static char dir[128], tokfile[256], server_log[256];

typedef struct {
    hpd_rpc_conn_t *conn;
    uint32_t id;
    struct event *timer;
} slow_t;

static void echo(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_object(&b.pk, *params);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static void add(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    if (params->type != MSGPACK_OBJECT_ARRAY || params->via.array.size != 2 ||
        params->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        params->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "add takes [a, b], two integers");
        return;
    }
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_uint64(&b.pk, params->via.array.ptr[0].via.u64 + params->via.array.ptr[1].via.u64);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static void slow_fire(evutil_socket_t fd, short w, void *arg)
{
    slow_t *s = arg;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_str(&b.pk, "late");
    hpd_rpc_reply(s->conn, s->id, &b); /* a no-op if the connection closed meanwhile */
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_conn_unref(s->conn);
    event_free(s->timer);
    free(s);
}

/* Replies 300 ms later, holding a reference on the connection. */
static void slow(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    struct event_base *base = arg;
    slow_t *s = calloc(1, sizeof(*s));
    const struct timeval tv = {0, 300000};
    s->conn = conn;
    s->id = id;
    hpd_rpc_conn_ref(conn);
    s->timer = evtimer_new(base, slow_fire, s);
    evtimer_add(s->timer, &tv);
}

static void on_sigterm(evutil_socket_t sig, short w, void *arg)
{
    event_base_loopbreak(arg);
}

/* The server: serves until SIGTERM, then frees everything and exits 0, so
 * that the sanitizers' leak check runs on it too (exit(), not _exit()). */
static void run_server(int fd)
{
    struct event_base *base = event_base_new();
    char *token;
    hpd_rpc_server_t *srv;
    const hpd_rpc_method_t methods[] = {
        {.name = "echo", .fn = echo}, {.name = "add", .fn = add}, {.name = "slow", .fn = slow}};

    if (hpd_rpc_read_token(tokfile, &token) != HPD_OK)
        _exit(1);
    hpd_rpc_server_params_t p = {.base = base, .host = "127.0.0.1", .token = token,
                                 .methods = methods, .n_methods = 3, .arg = base,
                                 .max_message = MAX_MSG, .max_conns = 64};
    if (hpd_rpc_server_create(&p, &srv) != HPD_OK)
        _exit(1);
    struct event *term = evsignal_new(base, SIGTERM, on_sigterm, base);
    evsignal_add(term, NULL);
    uint16_t got = hpd_rpc_server_port(srv);
    if (write(fd, &got, sizeof(got)) != sizeof(got))
        _exit(1);
    close(fd);
    event_base_dispatch(base);
    hpd_rpc_server_destroy(srv);
    event_free(term);
    event_base_free(base);
    free(token);
    exit(0);
}

static int setup(void **state)
{
    int fds[2];
    test_tmpdir(dir, sizeof(dir), "rpc");
    snprintf(tokfile, sizeof(tokfile), "%s/token", dir);
    snprintf(server_log, sizeof(server_log), "%s/server.log", dir);
    if (hpd_write_file(tokfile, "  " TOKEN "\n", strlen(TOKEN) + 3) != HPD_OK || pipe(fds) != 0)
        return -1;
    server_pid = fork();
    if (server_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        close(fds[0]);
        if (freopen(server_log, "w", stderr) == NULL)
            _exit(1);
        run_server(fds[1]);
    }
    close(fds[1]);
    if (read(fds[0], &port, sizeof(port)) != sizeof(port))
        return -1;
    close(fds[0]);
    return 0;
}

static int teardown(void **state)
{
    if (server_pid > 0) { /* a test failed before test_server_exits_clean */
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
        fprintf(stderr, "server log in %s\n", server_log);
        return 0;
    }
    test_rmtree(dir);
    return 0;
}

static hpd_status_t connect_client(struct event_base *base, const char *token,
                                   hpd_rpc_client_t **c)
{
    hpd_rpc_client_params_t p = {.base = base, .host = "127.0.0.1", .port = port,
                                 .token = token, .timeout_ms = 2000, .max_message = MAX_MSG};
    return hpd_rpc_client_create(&p, c);
}

static void ping_ok(hpd_rpc_client_t *c)
{
    hpd_rpc_result_t r;
    assert_int_equal(hpd_rpc_call_sync(c, "ping", NULL, 2000, &r), HPD_OK);
    assert_false(r.is_error);
    assert_int_equal(r.result.type, MSGPACK_OBJECT_STR);
    hpd_rpc_result_destroy(&r);
}

static void test_auth_and_calls(void **state)
{
    struct event_base *base = event_base_new();
    hpd_rpc_client_t *c;
    hpd_rpc_result_t r;

    assert_int_equal(connect_client(base, "wrong", &c), HPD_ERR_INVALID_ARG);
    assert_int_equal(connect_client(base, NULL, &c), HPD_ERR_INVALID_ARG);
    assert_int_equal(connect_client(base, TOKEN, &c), HPD_OK);
    ping_ok(c);

    /* echo of a nested value */
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 2);
    hpd_rpc_pack_str(&b.pk, "ids");
    msgpack_pack_array(&b.pk, 3);
    msgpack_pack_int(&b.pk, 1), msgpack_pack_int(&b.pk, 2), msgpack_pack_int(&b.pk, 3);
    hpd_rpc_pack_str(&b.pk, "t");
    msgpack_pack_double(&b.pk, 0.5);
    assert_int_equal(hpd_rpc_call_sync(c, "echo", &b, 0, &r), HPD_OK);
    assert_int_equal(hpd_rpc_map_get(&r.result, "ids")->via.array.size, 3);
    assert_true(hpd_rpc_map_get(&r.result, "t")->via.f64 == 0.5);
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&b);

    /* errors travel as {code, message} */
    hpd_rpc_buf_init(&b);
    msgpack_pack_array(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, "x");
    assert_int_equal(hpd_rpc_call_sync(c, "add", &b, 0, &r), HPD_OK);
    assert_true(r.is_error);
    assert_int_equal(r.error_code, HPD_RPC_ERR_PARAMS);
    hpd_rpc_result_destroy(&r);
    assert_int_equal(hpd_rpc_call_sync(c, "frobnicate", &b, 0, &r), HPD_OK);
    assert_int_equal(r.error_code, HPD_RPC_ERR_NO_METHOD);
    assert_non_null(strstr(r.error_message, "frobnicate"));
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&b);

    /* a per-call timeout; the late reply is dropped and the connection lives */
    assert_int_equal(hpd_rpc_call_sync(c, "slow", NULL, 100, &r), HPD_ERR_TIMEOUT);
    hpd_rpc_result_destroy(&r);
    assert_int_equal(hpd_rpc_call_sync(c, "slow", NULL, 2000, &r), HPD_OK);
    assert_int_equal(r.result.type, MSGPACK_OBJECT_STR);
    hpd_rpc_result_destroy(&r);
    ping_ok(c);
    hpd_rpc_client_destroy(c);

    /* the non-blocking connect: calls right behind the token; a wrong token
     * fails them with the close */
    hpd_rpc_client_params_t p = {.base = base, .host = "127.0.0.1", .port = port,
                                 .token = TOKEN, .timeout_ms = 2000, .max_message = MAX_MSG};
    assert_int_equal(hpd_rpc_client_connect(&p, &c), HPD_OK);
    ping_ok(c);
    hpd_rpc_client_destroy(c);
    p.token = "wrong";
    assert_int_equal(hpd_rpc_client_connect(&p, &c), HPD_OK);
    assert_int_equal(hpd_rpc_call_sync(c, "ping", NULL, 2000, &r), HPD_ERR_IO);
    hpd_rpc_result_destroy(&r);
    assert_false(hpd_rpc_client_is_open(c));
    hpd_rpc_client_destroy(c);
    event_base_free(base);
}

/* ---- raw sockets for hardening */

static int raw_connect(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return; /* the server may already have closed */
        c += w, n -= (size_t)w;
    }
}

/* Logs in with `token`; returns whether the server accepted it (a success
 * response to request 1), after reading exactly that response. */
static bool raw_login(int fd, const char *token)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 1, "auth");
    msgpack_pack_array(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, token);
    raw_send(fd, b.sb.data, b.sb.size);
    hpd_rpc_buf_destroy(&b);

    char buf[4096];
    size_t have = 0;
    struct pollfd p = {fd, POLLIN, 0};
    while (have < sizeof(buf) && poll(&p, 1, 5000) > 0) {
        const ssize_t n = recv(fd, buf + have, sizeof(buf) - have, 0);
        if (n <= 0)
            return false;
        have += (size_t)n;
        msgpack_zone z;
        msgpack_object o;
        hpd_rpc_msg_t m;
        char err[128];
        size_t off = 0;
        msgpack_zone_init(&z, 1024);
        if (msgpack_unpack(buf, have, &off, &z, &o) >= MSGPACK_UNPACK_EXTRA_BYTES) {
            const bool ok = hpd_rpc_decode(&o, &m, err, sizeof(err)) == HPD_OK &&
                            m.type == HPD_RPC_RESPONSE && m.id == 1 && !m.is_error;
            msgpack_zone_destroy(&z);
            return ok && off == have; /* nothing else was sent after the reply */
        }
        msgpack_zone_destroy(&z);
    }
    return false;
}

/* Logs in with the right token; fails the test unless that succeeded, so a
 * hostile input below is judged on an authenticated connection. */
static void raw_auth(int fd)
{
    assert_true(raw_login(fd, TOKEN));
}

/* What the server did within 2 s: 'e' an error reply or notification,
 * 'c' a close, 'r' some other reply, 't' nothing. */
static char outcome(int fd)
{
    char buf[65536];
    size_t have = 0;
    struct pollfd p = {fd, POLLIN, 0};
    for (;;) {
        if (poll(&p, 1, 2000) <= 0)
            return have ? 'r' : 't';
        ssize_t n = recv(fd, buf + have, sizeof(buf) - have, 0);
        if (n <= 0)
            return have ? 'e' : 'c'; /* a close after the error notification counts as error */
        have += (size_t)n;
        msgpack_zone z;
        msgpack_object o;
        hpd_rpc_msg_t m;
        char err[128];
        msgpack_zone_init(&z, 1024);
        size_t off = 0;
        if (msgpack_unpack(buf, have, &off, &z, &o) >= MSGPACK_UNPACK_EXTRA_BYTES &&
            hpd_rpc_decode(&o, &m, err, sizeof(err)) == HPD_OK) {
            const bool error = (m.type == HPD_RPC_RESPONSE && m.is_error) ||
                               (m.type == HPD_RPC_NOTIFY &&
                                hpd_rpc_str_eq(m.method, m.method_len, "error"));
            msgpack_zone_destroy(&z);
            return error ? 'e' : 'r';
        }
        msgpack_zone_destroy(&z);
    }
}

static void test_hardening(void **state)
{
    struct event_base *base = event_base_new();
    hpd_rpc_client_t *good;
    assert_int_equal(connect_client(base, TOKEN, &good), HPD_OK);

    /* the login the cases below rely on: the right token is accepted, a wrong
     * one is not (it gets the same error and close as the hostile inputs) */
    int fd = raw_connect();
    assert_false(raw_login(fd, "wrong"));
    close(fd);

    /* not authenticated: an error and a close */
    fd = raw_connect();
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 5, "ping");
    msgpack_pack_array(&b.pk, 0);
    raw_send(fd, b.sb.data, b.sb.size);
    hpd_rpc_buf_destroy(&b);
    assert_int_equal(outcome(fd), 'e');
    close(fd);
    ping_ok(good);

    /* wrongly typed messages, after auth */
#define MSG(lit) {lit, sizeof(lit) - 1}
    const struct {
        const char *p;
        size_t n;
    } typed[] = {
        MSG("\x94\x00\xa1x\xa1m\x90"),          /* [0, "x", "m", []]: id not an integer */
        MSG("\x94\x00\x01\x05\x90"),            /* [0, 1, 5, []]: method not a string */
        MSG("\x92\x07\x01"),                    /* [7, 1] */
        MSG("\xa5hello"),                       /* "hello" */
        MSG("\x94\x01\x01\xa3" "bad" "\xc0"),   /* a response with a bad error object */
        MSG("\x93\x00\x01\xa1m"),               /* [0, 1, "m"]: 3 elements */
        MSG("\x94\x00\xce\xff\xff\xff\xff\xa1m\x90"), /* fine id 2^32-1, unknown method */
    };
    for (size_t i = 0; i < sizeof(typed) / sizeof(typed[0]); i++) {
        fd = raw_connect();
        raw_auth(fd);
        raw_send(fd, typed[i].p, typed[i].n);
        char o = outcome(fd);
        if (o != 'e' && o != 'c')
            print_message("typed message %zu: outcome %c\n", i, o);
        assert_true(o == 'e' || o == 'c');
        close(fd);
        ping_ok(good);
    }

    /* truncated: half a message then a close */
    fd = raw_connect();
    raw_auth(fd);
    raw_send(fd, "\x94\x00\x02\xa4pi", 6);
    close(fd);
    ping_ok(good);

    /* oversized: a str32 header announcing 64 MiB, then bytes past the limit */
    fd = raw_connect();
    raw_auth(fd);
    char *big = calloc(1, MAX_MSG + 4096);
    memcpy(big, "\x94\x00\x03\xa4" "ping" "\xdb\x04\x00\x00\x00", 13);
    raw_send(fd, big, MAX_MSG + 4096);
    char o = outcome(fd);
    if (o != 'e' && o != 'c')
        print_message("oversized: outcome %c\n", o);
    assert_true(o == 'e' || o == 'c');
    free(big);
    close(fd);
    ping_ok(good);

    /* random bytes and random msgpack-ish messages */
    for (int i = 0; i < 200; i++) {
        char junk[256];
        const size_t n = 1 + hpd_philox4x32(42, (uint64_t)i, 0).v[0] % sizeof(junk);
        for (size_t k = 0; k < n; k++)
            junk[k] = (char)hpd_philox4x32(43, (uint64_t)i * 1000 + k, 0).v[0];
        if (i % 2)
            junk[0] = (char)0x94; /* looks like a 4-array */
        fd = raw_connect();
        raw_auth(fd);
        raw_send(fd, junk, n);
        shutdown(fd, SHUT_WR);
        o = outcome(fd);
        assert_true(o == 'e' || o == 'c' || o == 'r'); /* never a hang */
        close(fd);
        if (i % 20 == 0)
            ping_ok(good);
    }
    ping_ok(good);
    /* the server process is alive and well */
    assert_int_equal(kill(server_pid, 0), 0);
    hpd_rpc_client_destroy(good);
    event_base_free(base);
}

/* The server, stopped with SIGTERM after all of the above, exits 0 within
 * 10 s and its log holds no sanitizer report. */
static void test_server_exits_clean(void **state)
{
    int status = 0;
    pid_t got = 0;
    char *log;
    size_t len;
    assert_int_equal(kill(server_pid, SIGTERM), 0);
    for (int i = 0; i < 1000 && (got = waitpid(server_pid, &status, WNOHANG)) == 0; i++)
        usleep(10 * 1000);
    assert_int_equal(got, server_pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    server_pid = 0;
    assert_int_equal(hpd_read_file(server_log, &log, &len), HPD_OK);
    const bool clean = strstr(log, "Sanitizer") == NULL && strstr(log, "runtime error") == NULL;
    if (!clean)
        print_message("server log:\n%s\n", log);
    free(log);
    assert_true(clean);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_and_calls),
        cmocka_unit_test(test_hardening),
        cmocka_unit_test(test_server_exits_clean),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
