/* The prefill node's endpoint table (prefill_node/peers.h) with a scripted
 * data plane and job table:
 * - one endpoint per decode node, reused while it works;
 * - a failed endpoint no job holds is disconnected and replaced;
 * - a failed endpoint a job still holds is replaced but kept until that
 *   job is gone (the prefill node once freed it under a running job, which
 *   then put through freed memory: ASan, test_cluster test_failover);
 * - dropping the unused ones, all or only the retired, and a connect that
 *   fails leaving the table as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "prefill_node/peers.h"

typedef struct {
    int made, closed;
    bool failed[16], closed_[16], used[16];
    bool refuse;
} net_t;

/* endpoints are the numbers 1.. as pointers */
static int id_of(const void *peer)
{
    return (int)(uintptr_t)peer;
}

static hpd_status_t fake_connect(void *arg, const void *info, void **peer_p)
{
    net_t *n = arg;
    if (n->refuse)
        return HPD_ERR_INVALID_ARG;
    *peer_p = (void *)(uintptr_t)++n->made;
    return HPD_OK;
}

static void fake_disconnect(void *arg, void *peer)
{
    net_t *n = arg;
    assert_false(n->closed_[id_of(peer)]); /* once */
    assert_false(n->used[id_of(peer)]);    /* never under a job */
    n->closed_[id_of(peer)] = true;
    n->closed++;
}

static bool fake_failed(void *arg, const void *peer)
{
    return ((net_t *)arg)->failed[id_of(peer)];
}

static bool fake_used(void *arg, const void *peer)
{
    return ((net_t *)arg)->used[id_of(peer)];
}

static hpd_peers_t table(net_t *n)
{
    hpd_peers_t t;
    const hpd_peers_ops_t ops = {.connect = fake_connect,
                                 .disconnect = fake_disconnect,
                                 .failed = fake_failed,
                                 .used = fake_used,
                                 .arg = n};
    memset(n, 0, sizeof(*n));
    hpd_peers_init(&t, &ops);
    return t;
}

static void test_reuse_and_replace(void **state)
{
    net_t n;
    hpd_peers_t t = table(&n);
    void *a, *b, *c;
    assert_int_equal(hpd_peers_get(&t, 7, NULL, &a), HPD_OK);
    assert_int_equal(hpd_peers_get(&t, 7, NULL, &b), HPD_OK);
    assert_ptr_equal(a, b); /* one per decode node */
    assert_int_equal(hpd_peers_get(&t, 8, NULL, &c), HPD_OK);
    assert_ptr_not_equal(a, c);
    n.failed[id_of(a)] = true; /* no job holds it: replaced at once */
    assert_int_equal(hpd_peers_get(&t, 7, NULL, &b), HPD_OK);
    assert_ptr_not_equal(a, b);
    assert_true(n.closed_[id_of(a)]);
    assert_false(hpd_peers_any_retired(&t));
    hpd_peers_destroy(&t);
    assert_int_equal(n.closed, 3);
}

static void test_failed_peer_outlives_its_jobs(void **state)
{
    net_t n;
    hpd_peers_t t = table(&n);
    void *a, *b, *again;
    assert_int_equal(hpd_peers_get(&t, 7, NULL, &a), HPD_OK);
    n.used[id_of(a)] = true; /* a job pushes through it */
    n.failed[id_of(a)] = true;
    assert_int_equal(hpd_peers_get(&t, 7, NULL, &b), HPD_OK); /* a new job for node 7 */
    assert_ptr_not_equal(a, b);
    assert_false(n.closed_[id_of(a)]); /* the old job may still put through it */
    assert_true(hpd_peers_any_retired(&t));
    assert_int_equal(hpd_peers_get(&t, 7, NULL, &again), HPD_OK);
    assert_ptr_equal(again, b); /* the retired one is never handed out again */
    hpd_peers_drop_unused(&t, false);
    assert_false(n.closed_[id_of(a)]); /* still held */
    n.used[id_of(a)] = false; /* its job ended */
    hpd_peers_drop_unused(&t, false);
    assert_true(n.closed_[id_of(a)]);
    assert_false(n.closed_[id_of(b)]); /* the working one stays */
    assert_false(hpd_peers_any_retired(&t));
    hpd_peers_destroy(&t);
    assert_true(n.closed_[id_of(b)]);
}

static void test_drop_all_unused_and_refused_connect(void **state)
{
    net_t n;
    hpd_peers_t t = table(&n);
    void *a, *b, *x;
    assert_int_equal(hpd_peers_get(&t, 1, NULL, &a), HPD_OK);
    assert_int_equal(hpd_peers_get(&t, 2, NULL, &b), HPD_OK);
    n.used[id_of(b)] = true;
    hpd_peers_drop_unused(&t, true); /* the coordinator was lost */
    assert_true(n.closed_[id_of(a)]);
    assert_false(n.closed_[id_of(b)]);
    n.refuse = true;
    assert_int_equal(hpd_peers_get(&t, 3, NULL, &x), HPD_ERR_INVALID_ARG);
    assert_int_equal(t.n, 1);
    n.used[id_of(b)] = false;
    hpd_peers_destroy(&t);
    assert_int_equal(n.closed, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_and_replace),
        cmocka_unit_test(test_failed_peer_outlives_its_jobs),
        cmocka_unit_test(test_drop_all_unused_and_refused_connect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
