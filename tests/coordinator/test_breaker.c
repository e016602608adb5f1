/* The circuit breaker of a node's pairs (coordinator/breaker.h), on a
 * clock of the test's: out of rotation after failures with enough distinct
 * counterparts, probed after its cooldown, back on a probe's success, out
 * for twice as long on a probe's failure; a window that forgets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/breaker.h"

static void test_needs_distinct_counterparts(void **state)
{
    hpd_breaker_t b = {0};
    /* two prefill nodes usable: failures with one of them only are its
     * problem, not necessarily this node's */
    assert_false(hpd_breaker_failure(&b, 1, 2, 0.0));
    assert_false(hpd_breaker_failure(&b, 1, 2, 0.1));
    assert_false(hpd_breaker_failure(&b, 1, 2, 0.2));
    assert_true(hpd_breaker_usable(&b, 0.3));
    assert_true(hpd_breaker_failure(&b, 2, 2, 0.3)); /* a second one: out */
    assert_int_equal(hpd_breaker_state(&b, 0.4), HPD_BREAKER_OPEN);
    assert_false(hpd_breaker_usable(&b, 0.4));
    assert_int_equal(b.openings, 1);
    /* a single counterpart: two failures with it are enough */
    hpd_breaker_t one = {0};
    assert_false(hpd_breaker_failure(&one, 7, 1, 0.0));
    assert_true(hpd_breaker_failure(&one, 7, 1, 0.5));
    /* no counterpart usable (counted as one) */
    hpd_breaker_t none = {0};
    assert_false(hpd_breaker_failure(&none, 7, 0, 0.0));
    assert_true(hpd_breaker_failure(&none, 7, 0, 0.5));
}

static void test_probe_cycle(void **state)
{
    hpd_breaker_t b = {0};
    hpd_breaker_failure(&b, 1, 1, 10.0);
    assert_true(hpd_breaker_failure(&b, 1, 1, 10.0));
    assert_int_equal(hpd_breaker_state(&b, 10.99), HPD_BREAKER_OPEN); /* 1 s */
    assert_int_equal(hpd_breaker_state(&b, 11.0), HPD_BREAKER_HALF_OPEN);
    assert_true(hpd_breaker_usable(&b, 11.0));
    assert_true(hpd_breaker_placed(&b, 11.0)); /* the probe */
    assert_int_equal(hpd_breaker_state(&b, 11.1), HPD_BREAKER_PROBING);
    assert_false(hpd_breaker_usable(&b, 11.1)); /* one probe at a time */
    /* a probe that ends neither way (its request moved elsewhere) lets the
     * next request probe at once (on c7ba6c2 the slot stayed taken 30 s
     * and every request waiting for the node failed at its 60 s) */
    hpd_breaker_probe_ended(&b);
    assert_int_equal(hpd_breaker_state(&b, 11.2), HPD_BREAKER_HALF_OPEN);
    assert_true(hpd_breaker_placed(&b, 11.2));
    assert_false(hpd_breaker_placed(&b, 11.3)); /* not a second probe */
    /* the probe fails: out for 2 s */
    assert_true(hpd_breaker_failure(&b, 1, 1, 11.5));
    assert_int_equal(hpd_breaker_state(&b, 13.49), HPD_BREAKER_OPEN);
    assert_int_equal(hpd_breaker_state(&b, 13.5), HPD_BREAKER_HALF_OPEN);
    hpd_breaker_placed(&b, 13.5);
    assert_true(hpd_breaker_failure(&b, 1, 1, 13.6)); /* 4 s */
    assert_int_equal(hpd_breaker_state(&b, 17.59), HPD_BREAKER_OPEN);
    hpd_breaker_placed(&b, 17.6);
    assert_true(hpd_breaker_success(&b)); /* back */
    assert_int_equal(hpd_breaker_state(&b, 17.7), HPD_BREAKER_CLOSED);
    assert_int_equal(b.openings, 3);
    /* and its next opening starts from 1 s again */
    hpd_breaker_failure(&b, 1, 1, 20.0);
    assert_true(hpd_breaker_failure(&b, 1, 1, 20.0));
    assert_int_equal(hpd_breaker_state(&b, 21.0), HPD_BREAKER_HALF_OPEN);
    /* work placed while closed is no probe */
    hpd_breaker_t c = {0};
    assert_false(hpd_breaker_placed(&c, 1.0));
    assert_int_equal(hpd_breaker_state(&c, 1.0), HPD_BREAKER_CLOSED);
    /* nor while out */
    hpd_breaker_failure(&c, 1, 1, 2.0);
    hpd_breaker_failure(&c, 1, 1, 2.0);
    assert_false(hpd_breaker_placed(&c, 2.5));
    assert_int_equal(hpd_breaker_state(&c, 3.0), HPD_BREAKER_HALF_OPEN);
}

static void test_cooldown_capped_and_probe_expires(void **state)
{
    hpd_breaker_t b = {0};
    double t = 0;
    hpd_breaker_failure(&b, 1, 1, t);
    hpd_breaker_failure(&b, 1, 1, t);
    for (int i = 0; i < 10; i++) { /* probes that keep failing */
        t = b.open_until;
        hpd_breaker_placed(&b, t);
        hpd_breaker_failure(&b, 1, 1, t);
    }
    assert_true(b.open_until - t == HPD_BREAKER_MAX_COOLDOWN_S);
    /* a probe that never ends frees its slot after HPD_BREAKER_PROBE_S */
    t = b.open_until;
    hpd_breaker_placed(&b, t);
    assert_false(hpd_breaker_usable(&b, t + HPD_BREAKER_PROBE_S - 0.1));
    assert_true(hpd_breaker_usable(&b, t + HPD_BREAKER_PROBE_S));
    /* failures of an attempt placed before it went out do not extend it */
    const double until = b.open_until;
    hpd_breaker_t o = b;
    o.probe_since = 0;
    o.open_until = t + 100;
    assert_false(hpd_breaker_failure(&o, 1, 1, t + 1));
    assert_true(o.open_until == t + 100);
    (void)until;
}

static void test_window_forgets(void **state)
{
    hpd_breaker_t b = {0};
    assert_false(hpd_breaker_failure(&b, 1, 1, 0.0));
    /* the next one comes after the window: it counts alone */
    assert_false(hpd_breaker_failure(&b, 1, 1, HPD_BREAKER_WINDOW_S + 1));
    assert_true(hpd_breaker_failure(&b, 1, 1, HPD_BREAKER_WINDOW_S + 2));
    /* a success in between forgets too */
    hpd_breaker_t c = {0};
    hpd_breaker_failure(&c, 1, 1, 0.0);
    assert_false(hpd_breaker_success(&c)); /* it was in rotation */
    assert_false(hpd_breaker_failure(&c, 1, 1, 0.1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_needs_distinct_counterparts),
        cmocka_unit_test(test_probe_cycle),
        cmocka_unit_test(test_cooldown_capped_and_probe_expires),
        cmocka_unit_test(test_window_forgets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
