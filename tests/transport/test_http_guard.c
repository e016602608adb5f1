/* The guard in front of evhttp (transport/http_guard.h) and the process's
 * connection budget (transport/budget.h), in one process on one loop, with
 * raw sockets as clients:
 * - a request without a good key is answered 401 from its head, before a
 *   byte of its (8 MiB) body is sent; with a key evhttp gets the body;
 * - a public request passes once: the connection closes after its answer,
 *   and a request pipelined behind it is refused;
 * - unauthenticated connections: at most max_unauthed, the oldest closed
 *   first; a head must come within head_timeout_ms (a byte now and then
 *   does not extend it); a head above max_head is answered 431;
 * - the budget: served connections stop at their share (503) while the
 *   operator's reserve still takes /healthz; bytes held before
 *   authentication are capped across connections and given back;
 * - close_if closes the admitted connections of one credential only;
 * - accept() failing (out of descriptors) pauses the listener: a handful
 *   of failures a second, not a busy loop, and it accepts again after. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/test_helpers.h"
#include "tests/transport/loop.h"
#include "transport/budget.h"
#include "transport/http_guard.h"

/* ------------------------------------------------------------ server */

typedef struct {
    struct evhttp *http;
    hpd_http_guard_t *guard;
    hpd_conn_budget_t *budget;
    uint16_t port;
    uint32_t handled;   /* requests evhttp handed to the handler */
    size_t last_body;   /* the body length of the last one */
} server_t;

static void on_request(struct evhttp_request *req, void *arg)
{
    server_t *s = arg;
    struct evbuffer *out = evbuffer_new();
    s->handled++;
    s->last_body = evbuffer_get_length(evhttp_request_get_input_buffer(req));
    evbuffer_add_printf(out, "got %zu\n", s->last_body);
    evhttp_send_reply(req, 200, "OK", out);
    evbuffer_free(out);
}

/* "Bearer good1" and "Bearer good2" admit (credentials 1 and 2); GET
 * /healthz is public; the rest is answered 401. */
static hpd_http_verdict_t screen(void *arg, const hpd_http_head_t *h, hpd_http_answer_t *a)
{
    if (strcmp(h->method, "GET") == 0 && strcmp(h->path, "/healthz") == 0)
        return HPD_HTTP_PUBLIC;
    if (h->authorization != NULL && strncmp(h->authorization, "Bearer good", 11) == 0 &&
        (h->authorization[11] == '1' || h->authorization[11] == '2') &&
        h->authorization[12] == '\0') {
        a->credential = (uint64_t)(h->authorization[11] - '0');
        return HPD_HTTP_ADMIT;
    }
    a->status = 401;
    snprintf(a->body, sizeof(a->body), "no key\n");
    return HPD_HTTP_REJECT;
}

static void server_start(server_t *s, const hpd_http_guard_params_t *extra)
{
    hpd_http_guard_params_t gp = extra != NULL ? *extra : (hpd_http_guard_params_t){0};
    *s = (server_t){.budget = gp.budget};
    gp.base = base;
    gp.screen = screen;
    gp.arg = NULL;
    gp.name = "test";
    assert_non_null(s->http = evhttp_new(base));
    evhttp_set_gencb(s->http, on_request, s);
    assert_int_equal(hpd_http_guard_create(s->http, &gp, &s->guard), HPD_OK);
    assert_int_equal(hpd_http_guard_bind(s->guard, "127.0.0.1", 0, &s->port), HPD_OK);
}

static void server_stop(server_t *s)
{
    evhttp_free(s->http);
    hpd_http_guard_destroy(s->guard);
}

/* ------------------------------------------------------------ clients */

typedef struct {
    int fd;
    char in[1 << 16];
    size_t have;
    bool eof;
} cli_t;

static void cli_open(cli_t *c, uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memset(c, 0, sizeof(*c));
    assert_true((c->fd = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(fcntl(c->fd, F_SETFL, O_NONBLOCK), 0);
}

static void cli_close(cli_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static void cli_send(cli_t *c, const char *text)
{
    const size_t len = strlen(text);
    assert_int_equal(send(c->fd, text, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Reads what is there; true once the server closed (or reset) it. */
static bool cli_poll(cli_t *c)
{
    for (;;) {
        const ssize_t n = recv(c->fd, c->in + c->have, sizeof(c->in) - 1 - c->have, 0);
        if (n > 0) {
            c->have += (size_t)n;
            c->in[c->have] = '\0';
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            c->eof = true;
        return c->eof;
    }
}

static bool cli_has(cli_t *c, const char *text)
{
    cli_poll(c);
    return strstr(c->in, text) != NULL;
}

/* The loop runs until the client closed or holds text (10 s at most: a
 * guard that waits for a body it never gets fails here, not at the
 * suite's deadline). */
#define WAIT_FOR(cond)                                                                      \
    do {                                                                                    \
        const double t0_ = hpd_time_now();                                                  \
        while (!(cond)) {                                                                   \
            if (hpd_time_now() - t0_ > 10.0)                                                \
                fail_msg("no '%s' after 10 s", #cond);                                      \
            if (event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK) != 0)                  \
                usleep(200);                                                                \
        }                                                                                   \
    } while (0)

static const char big_head[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                               "Content-Type: application/json\r\nContent-Length: 8388608\r\n";

/* ------------------------------------------------------------ tests */

static void test_key_checked_before_body(void **state)
{
    server_t s;
    cli_t c;
    server_start(&s, NULL);
    /* no key, then a wrong one: 401 with nothing of the body sent */
    for (int i = 0; i < 2; i++) {
        /* in pieces, each read by the server apart: evhttp must not see
         * the head's lines as they come */
        cli_open(&c, s.port);
        cli_send(&c, "POST /v1/completions HTTP/1.1\r\n");
        spin(20);
        cli_send(&c, big_head + strlen("POST /v1/completions HTTP/1.1\r\n"));
        spin(20);
        cli_send(&c, i == 0 ? "\r\n" : "Authorization: Bearer bad\r\n\r\n");
        WAIT_FOR(cli_has(&c, "no key") && cli_poll(&c));
        assert_non_null(strstr(c.in, "HTTP/1.1 401 Unauthorized\r\n"));
        assert_non_null(strstr(c.in, "Connection: close\r\n"));
        cli_close(&c);
    }
    assert_int_equal(s.handled, 0);
    /* with a key, evhttp reads the body */
    cli_open(&c, s.port);
    cli_send(&c, "POST /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good1\r\n"
                 "Content-Length: 100\r\n\r\n");
    char body[101];
    memset(body, 'a', 100);
    body[100] = '\0';
    cli_send(&c, body);
    WAIT_FOR(cli_has(&c, "got 100"));
    assert_int_equal(s.handled, 1);
    /* the connection is authenticated: a second request passes too */
    cli_send(&c, "GET /y HTTP/1.1\r\nHost: x\r\n\r\n");
    WAIT_FOR(s.handled == 2 && cli_has(&c, "got 0"));
    hpd_http_guard_stats_t st;
    hpd_http_guard_stats(s.guard, &st);
    assert_int_equal(st.rejected, 2);
    assert_int_equal(st.admitted, 1);
    cli_close(&c);
    hpd_conn_budget_stats_t bs;
    hpd_conn_budget_stats(hpd_conn_budget_process(), &bs);
    assert_int_equal(bs.held, 0);
    server_stop(&s);
}

static void test_public_once(void **state)
{
    server_t s;
    cli_t c;
    server_start(&s, NULL);
    cli_open(&c, s.port);
    cli_send(&c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    WAIT_FOR(cli_has(&c, "got 0") && cli_poll(&c)); /* answered, then closed */
    assert_int_equal(s.handled, 1);
    cli_close(&c);
    /* a request pipelined behind a public one is not let through */
    cli_open(&c, s.port);
    cli_send(&c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nPOST /x HTTP/1.1\r\n"
                 "Content-Length: 5\r\n\r\nhello");
    WAIT_FOR(cli_poll(&c));
    assert_non_null(strstr(c.in, "HTTP/1.1 400"));
    assert_int_equal(s.handled, 1);
    cli_close(&c);
    /* a body is never public */
    cli_open(&c, s.port);
    cli_send(&c, "GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
    WAIT_FOR(cli_poll(&c));
    assert_non_null(strstr(c.in, "HTTP/1.1 413"));
    assert_int_equal(s.handled, 1);
    cli_close(&c);
    server_stop(&s);
}

/* Runs the loop for at least `s` seconds. */
static void run_for(double s)
{
    const double t0 = hpd_time_now();
    while (hpd_time_now() - t0 < s) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(200);
    }
}

static void test_unauthed_oldest_first(void **state)
{
    enum { MAX = 8, N = MAX + 5 };
    const hpd_http_guard_params_t gp = {.max_unauthed = MAX};
    server_t s;
    cli_t c[N + 1];
    hpd_http_guard_stats_t st;
    server_start(&s, &gp);
    const double t0 = hpd_time_now();
    for (int i = 0; i <= MAX; i++) {
        cli_open(&c[i], s.port);
        WAIT_FOR((hpd_http_guard_stats(s.guard, &st), st.open == (uint32_t)i + 1));
    }
    /* a burst: the waiting ones had no time to send a head, so none is
     * evicted for the newcomer (checked when this machine got here within
     * the grace) */
    hpd_http_guard_stats(s.guard, &st);
    if (hpd_time_now() - t0 < 0.2) {
        assert_int_equal(st.evicted, 0);
        assert_int_equal(st.unauthenticated, MAX + 1);
    }
    /* once they had their time, the oldest go first */
    run_for(0.3);
    for (int i = MAX + 1; i < N; i++) {
        cli_open(&c[i], s.port);
        WAIT_FOR((hpd_http_guard_stats(s.guard, &st), st.open + st.evicted == (uint32_t)i + 1));
    }
    /* a client with a key gets in (one more idle one goes) */
    run_for(0.3);
    cli_open(&c[N], s.port);
    cli_send(&c[N], "GET /z HTTP/1.1\r\nAuthorization: Bearer good2\r\n\r\n");
    WAIT_FOR(cli_has(&c[N], "got 0"));
    hpd_http_guard_stats(s.guard, &st);
    assert_int_equal(st.unauthenticated, MAX - 1);
    /* the evicted are the oldest: a prefix of the order they came in */
    const uint32_t evicted = (uint32_t)st.evicted;
    assert_true(evicted >= N - MAX);
    for (uint32_t i = 0; i < evicted; i++)
        WAIT_FOR(cli_poll(&c[i]));
    spin(50);
    for (int i = (int)evicted; i <= N; i++)
        assert_false(cli_poll(&c[i]));
    for (int i = 0; i <= N; i++)
        cli_close(&c[i]);
    server_stop(&s);
}

/* A burst far past the limit, one accept for all of it: the connection in
 * its middle whose head was already there is served; the idle ones past
 * four times the limit go, oldest first. */
static void test_burst_keeps_ready_heads(void **state)
{
    enum { MAX = 4, N = 40, GOOD = 20 };
    const hpd_http_guard_params_t gp = {.max_unauthed = MAX};
    server_t s;
    cli_t c[N];
    server_start(&s, &gp);
    for (int i = 0; i < N; i++) {
        cli_open(&c[i], s.port);
        if (i == GOOD)
            cli_send(&c[i], "GET /z HTTP/1.1\r\nAuthorization: Bearer good1\r\n\r\n");
    }
    WAIT_FOR(cli_has(&c[GOOD], "got 0"));
    hpd_http_guard_stats_t st;
    hpd_http_guard_stats(s.guard, &st);
    assert_true(st.unauthenticated <= 4 * MAX);
    assert_int_equal(st.admitted, 1);
    for (int i = 0; i < N; i++)
        cli_close(&c[i]);
    server_stop(&s);
}

static void test_head_deadline_and_size(void **state)
{
    const hpd_http_guard_params_t gp = {.head_timeout_ms = 300, .max_head = 1024};
    server_t s;
    cli_t idle, slow, big;
    server_start(&s, &gp);
    cli_open(&idle, s.port);
    cli_open(&slow, s.port);
    /* a byte now and then does not extend the deadline */
    const double t0 = hpd_time_now();
    double last = 0;
    while (!cli_poll(&slow)) {
        if (hpd_time_now() - t0 > 10.0)
            fail_msg("a slow head was not closed in 10 s");
        if (hpd_time_now() - last > 0.05) {
            send(slow.fd, "G", 1, MSG_NOSIGNAL);
            last = hpd_time_now();
        }
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(200);
    }
    WAIT_FOR(cli_poll(&idle));
    hpd_http_guard_stats_t st;
    hpd_http_guard_stats(s.guard, &st);
    assert_int_equal(st.head_timeouts, 2);
    /* a head above max_head */
    cli_open(&big, s.port);
    char line[1200];
    memset(line, 'x', sizeof(line) - 1);
    line[sizeof(line) - 1] = '\0';
    cli_send(&big, "GET / HTTP/1.1\r\nX-Pad: ");
    cli_send(&big, line);
    WAIT_FOR(cli_poll(&big));
    assert_non_null(strstr(big.in, "HTTP/1.1 431"));
    assert_int_equal(s.handled, 0);
    cli_close(&idle);
    cli_close(&slow);
    cli_close(&big);
    server_stop(&s);
}

static void test_budget_and_operator_reserve(void **state)
{
    /* 20 descriptors for listeners, 4 of them the operator's */
    const hpd_conn_budget_params_t bp = {.fd_limit = 40, .keep_fds = 20, .operator_fds = 4};
    hpd_conn_budget_t *b;
    assert_int_equal(hpd_conn_budget_create(&bp, &b), HPD_OK);
    const hpd_http_guard_params_t api = {.budget = b, .cls = HPD_CONN_SERVE};
    const hpd_http_guard_params_t ops = {.budget = b, .cls = HPD_CONN_OPERATOR};
    server_t s, m;
    cli_t c[17], h;
    server_start(&s, &api);
    server_start(&m, &ops);
    for (int i = 0; i < 16; i++) {
        cli_open(&c[i], s.port);
        cli_send(&c[i], "GET /a HTTP/1.1\r\nAuthorization: Bearer good1\r\n\r\n");
        WAIT_FOR(cli_has(&c[i], "got 0"));
    }
    hpd_conn_budget_stats_t bs;
    hpd_conn_budget_stats(b, &bs);
    assert_int_equal(bs.used, 16);
    cli_open(&c[16], s.port);
    WAIT_FOR(cli_poll(&c[16]));
    assert_non_null(strstr(c[16].in, "HTTP/1.1 503"));
    /* the operator still looks in */
    cli_open(&h, m.port);
    cli_send(&h, "GET /healthz HTTP/1.1\r\n\r\n");
    WAIT_FOR(cli_has(&h, "got 0"));
    hpd_conn_budget_stats(b, &bs);
    assert_int_equal(bs.operator_used, 1);
    for (int i = 0; i < 17; i++)
        cli_close(&c[i]);
    cli_close(&h);
    WAIT_FOR((hpd_conn_budget_stats(b, &bs), bs.used == 0));
    server_stop(&s);
    server_stop(&m);
    hpd_conn_budget_destroy(b);
}

static void test_held_bytes_capped(void **state)
{
    const hpd_conn_budget_params_t bp = {.max_held_bytes = 8 << 10};
    hpd_conn_budget_t *b;
    assert_int_equal(hpd_conn_budget_create(&bp, &b), HPD_OK);
    const hpd_http_guard_params_t gp = {.budget = b};
    server_t s;
    cli_t c[3];
    char pad[4096 + 1];
    memset(pad, 'p', 4096 - 64);
    pad[4096 - 64] = '\0';
    server_start(&s, &gp);
    hpd_conn_budget_stats_t bs;
    for (int i = 0; i < 3; i++) {
        cli_open(&c[i], s.port);
        cli_send(&c[i], "GET / HTTP/1.1\r\nX-Pad: ");
        cli_send(&c[i], pad);
        if (i < 2)
            WAIT_FOR((hpd_conn_budget_stats(b, &bs), bs.held > (size_t)(i * 4000 + 3000)));
    }
    WAIT_FOR(cli_poll(&c[2]));
    assert_non_null(strstr(c[2].in, "HTTP/1.1 503"));
    assert_false(cli_poll(&c[0]));
    for (int i = 0; i < 3; i++)
        cli_close(&c[i]);
    WAIT_FOR((hpd_conn_budget_stats(b, &bs), bs.held == 0 && bs.used == 0));
    server_stop(&s);
    hpd_conn_budget_destroy(b);
}

static bool is_one(uint64_t credential, void *arg)
{
    return credential == 1;
}

static void test_close_if(void **state)
{
    server_t s;
    cli_t one, two;
    server_start(&s, NULL);
    cli_open(&one, s.port);
    cli_open(&two, s.port);
    cli_send(&one, "GET /a HTTP/1.1\r\nAuthorization: Bearer good1\r\n\r\n");
    cli_send(&two, "GET /a HTTP/1.1\r\nAuthorization: Bearer good2\r\n\r\n");
    WAIT_FOR(cli_has(&one, "got 0") && cli_has(&two, "got 0"));
    assert_int_equal(hpd_http_guard_close_if(s.guard, is_one, NULL), 1);
    WAIT_FOR(cli_poll(&one));
    spin(20);
    cli_send(&two, "GET /b HTTP/1.1\r\n\r\n");
    WAIT_FOR(s.handled == 3);
    assert_false(cli_poll(&two));
    cli_close(&one);
    cli_close(&two);
    server_stop(&s);
}

static void test_accept_error_pauses(void **state)
{
    server_t s;
    struct rlimit old, low;
    server_start(&s, NULL);
    /* a child holds the clients: this process runs out of descriptors */
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cli_t c[64];
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* ends with a test that failed */
        for (int i = 0; i < 64; i++)
            cli_open(&c[i], s.port);
        (void)!write(ready[1], "x", 1);
        pause();
        _exit(0);
    }
    int open_fds = 0;
    for (int fd = 0; fd < 4096; fd++)
        open_fds += fcntl(fd, F_GETFD) != -1;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)open_fds + 4;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    char x;
    close(ready[1]);
    assert_int_equal(read(ready[0], &x, 1), 1);
    const double t0 = hpd_time_now();
    while (hpd_time_now() - t0 < 1.0) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(100);
    }
    hpd_http_guard_stats_t st;
    hpd_http_guard_stats(s.guard, &st);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    /* paused 100 ms after each failure: about ten a second, never a spin */
    assert_true(st.accept_errors >= 1);
    assert_true(st.accept_errors <= 30);
    /* with descriptors again, the rest are taken */
    WAIT_FOR((hpd_http_guard_stats(s.guard, &st), st.open + st.evicted >= 64));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(ready[0]);
    server_stop(&s);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_key_checked_before_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_public_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unauthed_oldest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_burst_keeps_ready_heads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_deadline_and_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_and_operator_reserve, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_bytes_capped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_if, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accept_error_pauses, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
