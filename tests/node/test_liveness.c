/* The liveness pinger (node/liveness.h) against an RPC server on this
 * test's loop, the pinger on its own thread:
 * - nothing is sent before hpd_liveness_set names a node, and nothing
 *   after it names none;
 * - the pings carry the node id and key, authenticate with the node
 *   secret, and keep coming at the period while this thread does other
 *   things (the point of a thread of its own);
 * - a closed connection is made again, and a refused ping is not counted;
 * - stop joins the thread with a ping in flight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "node/liveness.h"
#include "node/proto.h"
#include "tests/test_helpers.h"
#include "transport/rpc.h"

#include "tests/transport/loop.h"

static struct {
    int n;
    uint64_t node_id, key;
    bool refuse, close, hold;
    hpd_rpc_conn_t *held;
    uint32_t held_id;
} seen;

static void m_alive(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_proto_err_t err;
    seen.n++;
    assert_true(hpd_proto_u64(params, "node_id", true, UINT64_MAX, &seen.node_id, &err));
    assert_true(hpd_proto_u64(params, "key", true, UINT64_MAX, &seen.key, &err));
    if (seen.close) {
        seen.close = false;
        hpd_rpc_conn_close(conn, false);
    } else if (seen.hold) {
        seen.held = conn; /* never answered */
        seen.held_id = id;
        hpd_rpc_conn_ref(conn);
    } else if (seen.refuse) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP, "not registered");
    } else {
        hpd_rpc_reply(conn, id, NULL);
    }
}

static const hpd_rpc_method_t methods[] = {{.name = "alive", .fn = m_alive}};

static hpd_rpc_server_t *server_with(const char *token)
{
    hpd_rpc_server_t *s;
    hpd_rpc_server_params_t sp = {.base = base, .host = "127.0.0.1", .token = token,
                                  .methods = methods, .n_methods = 1};
    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    return s;
}

static hpd_rpc_server_t *server_new(void)
{
    hpd_rpc_server_t *s;
    hpd_rpc_server_params_t sp = {.base = base, .host = "127.0.0.1", .token = "secret",
                                  .methods = methods, .n_methods = 1};
    assert_int_equal(hpd_rpc_server_create(&sp, &s), HPD_OK);
    return s;
}

static hpd_liveness_t *pinger(hpd_rpc_server_t *s, const char *token)
{
    hpd_liveness_t *l;
    hpd_liveness_params_t lp = {.host = "127.0.0.1", .port = hpd_rpc_server_port(s),
                                .token = token, .name = "test"};
    assert_int_equal(hpd_liveness_start(&lp, &l), HPD_OK);
    return l;
}

/* Runs the loop for s seconds. */
static void run_for(double s)
{
    const double t0 = hpd_time_now();
    LOOP_UNTIL(hpd_time_now() - t0 > s);
}

static void test_pings_with_id_and_key(void **state)
{
    memset(&seen, 0, sizeof(seen));
    hpd_rpc_server_t *s = server_new();
    hpd_liveness_t *l = pinger(s, "secret");
    run_for(0.2);
    assert_int_equal(seen.n, 0); /* not registered: silent */
    assert_true(hpd_liveness_valid_until(l) == 0);
    const double t_set = hpd_time_now();
    hpd_liveness_set(l, 42, 0xfeedull, 20, 500);
    LOOP_UNTIL(hpd_liveness_answered(l) >= 5);
    /* the lease runs from an answered ping's send time */
    const double v = hpd_liveness_valid_until(l);
    assert_true(v >= t_set + 0.5 && v <= hpd_time_now() + 0.5);
    assert_int_equal(seen.node_id, 42);
    assert_int_equal(seen.key, 0xfeedull);
    /* while this thread is busy (the node's loop in an engine step), the
     * pings queue up at the server and are answered when it runs again */
    const uint64_t before = hpd_liveness_answered(l);
    usleep(300 * 1000);
    LOOP_UNTIL(hpd_liveness_answered(l) > before);
    /* a new registration: new id and key, and its lease starts anew */
    hpd_liveness_set(l, 43, 7, 20, 500);
    assert_true(hpd_liveness_valid_until(l) == 0);
    LOOP_UNTIL(seen.node_id == 43 && seen.key == 7 && hpd_liveness_valid_until(l) > 0);
    /* the coordinator stops answering: the lease stops at the last answer */
    seen.hold = true;
    const double t_hold = hpd_time_now();
    LOOP_UNTIL(seen.held != NULL);
    const double t_wait = hpd_time_now();
    LOOP_UNTIL(hpd_time_now() - t_wait > 0.1);
    assert_true(hpd_liveness_valid_until(l) <= t_hold + 0.5);
    hpd_rpc_reply(seen.held, seen.held_id, NULL); /* answered late: it counts */
    hpd_rpc_conn_unref(seen.held);
    seen.held = NULL;
    seen.hold = false;
    /* no node: the pings stop */
    hpd_liveness_set(l, 0, 0, 0, 0);
    run_for(0.1); /* one in flight may still come */
    const int n = seen.n;
    run_for(0.2);
    assert_int_equal(seen.n, n);
    hpd_liveness_stop(l);
    hpd_rpc_server_destroy(s);
}

/* A closed connection is made again; refused pings are not answered ones;
 * a wrong secret never gets a ping through. */
static void test_reconnects_and_refusals(void **state)
{
    memset(&seen, 0, sizeof(seen));
    hpd_rpc_server_t *s = server_new();
    hpd_liveness_t *l = pinger(s, "secret");
    hpd_liveness_set(l, 1, 2, 10, 500);
    LOOP_UNTIL(hpd_liveness_answered(l) >= 2);
    seen.close = true;
    const uint64_t before = hpd_liveness_answered(l);
    LOOP_UNTIL(!seen.close && hpd_liveness_answered(l) >= before + 2);
    hpd_rpc_server_stats_t st;
    hpd_rpc_server_stats(s, &st);
    assert_int_equal(st.open, 1); /* the old connection went */
    seen.refuse = true;
    const int n = seen.n;
    const uint64_t answered = hpd_liveness_answered(l);
    LOOP_UNTIL(seen.n >= n + 3);
    assert_true(hpd_liveness_answered(l) <= answered + 1); /* one may have been answered */
    hpd_liveness_stop(l);

    memset(&seen, 0, sizeof(seen));
    l = pinger(s, "wrong");
    hpd_liveness_set(l, 1, 2, 10, 500);
    run_for(0.5);
    assert_int_equal(seen.n, 0);
    assert_int_equal(hpd_liveness_answered(l), 0);
    hpd_rpc_server_stats(s, &st);
    assert_true(st.auth_failures <= 6); /* with backoff: 50, 100, 200 ms ... apart */
    hpd_liveness_stop(l);
    hpd_rpc_server_destroy(s);
}

/* Stop with a ping the server never answers: the thread ends anyway. */
static void test_stop_with_a_ping_in_flight(void **state)
{
    memset(&seen, 0, sizeof(seen));
    hpd_rpc_server_t *s = server_new();
    hpd_liveness_t *l = pinger(s, "secret");
    seen.hold = true;
    hpd_liveness_set(l, 5, 6, 10, 500);
    LOOP_UNTIL(seen.held != NULL);
    run_for(0.05);
    assert_int_equal(seen.n, 1); /* one at a time */
    assert_true(hpd_liveness_valid_until(l) == 0); /* never answered */
    hpd_liveness_stop(l);
    hpd_liveness_stop(NULL);
    hpd_rpc_conn_unref(seen.held);
    hpd_rpc_server_destroy(s);
}

/* A cluster without a secret: the pinger presents none. */
static void test_without_a_secret(void **state)
{
    memset(&seen, 0, sizeof(seen));
    hpd_rpc_server_t *s = server_with(NULL);
    hpd_liveness_t *l = pinger(s, NULL);
    hpd_liveness_set(l, 9, 10, 10, 500);
    LOOP_UNTIL(hpd_liveness_answered(l) >= 2);
    assert_int_equal(seen.node_id, 9);
    hpd_liveness_stop(l);
    hpd_rpc_server_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pings_with_id_and_key),
        cmocka_unit_test(test_reconnects_and_refusals),
        cmocka_unit_test(test_stop_with_a_ping_in_flight),
        cmocka_unit_test(test_without_a_secret),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
