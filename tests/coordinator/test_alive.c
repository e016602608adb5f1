/* The liveness judge (coordinator/alive.h) on a clock of the test's: a
 * node pinging steadily is suspect and lost on the configured window; one
 * starved of CPU for 400 ms now and then (or pinging over a slow, lossy
 * link) widens its windows and is never declared lost, yet a stop of 5 s
 * after that is noticed (suspect) in under a second; pings over a link
 * with a long retransmission timeout get windows that allow for it; a
 * node that never pings after registering is judged from the
 * registration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "coordinator/alive.h"

#define WINDOW 0.5 /* --liveness-ms 500 */
#define LEASE 10.0 /* --lease-ms 10000 */

static hpd_alive_verdict_t judge(const hpd_alive_t *a, double now)
{
    return hpd_alive_judge(a, now, WINDOW, LEASE);
}

static void test_steady(void **state)
{
    hpd_alive_t a;
    hpd_alive_start(&a, 0, 0.1);
    double t = 0;
    for (int i = 0; i < 100; i++)
        hpd_alive_ping(&a, t += 0.1);
    assert_int_equal(judge(&a, t + 0.45), HPD_ALIVE_OK);
    assert_int_equal(judge(&a, t + 0.55), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, t + 1.95), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, t + 2.05), HPD_ALIVE_LOST); /* 4 windows at least */
    /* a ping clears a suspicion */
    hpd_alive_ping(&a, t + 0.7);
    assert_int_equal(judge(&a, t + 0.75), HPD_ALIVE_OK);
}

/* Stopped 400 ms about every second (pings 100 ms apart otherwise), then
 * stopped for good: never lost while starved, suspect within a second of
 * the last ping once stopped, lost within 2 s. */
static void test_starved_then_stopped(void **state)
{
    hpd_alive_t a;
    double t = 0;
    hpd_alive_start(&a, 0, 0.1);
    srand(3);
    for (int i = 0; i < 600; i++) {
        const double gap = i % 8 == 7 ? 0.4 + 0.1 * (rand() % 3) : 0.1;
        /* judged every 10 ms during the gap, as the coordinator's tick */
        for (double u = 0.01; u < gap; u += 0.01)
            assert_int_not_equal(judge(&a, t + u), HPD_ALIVE_LOST);
        hpd_alive_ping(&a, t += gap);
    }
    const double suspect = hpd_alive_suspect_after(&a, WINDOW, LEASE);
    const double lost = hpd_alive_lost_after(&a, WINDOW, LEASE);
    assert_true(suspect > 0.6); /* wider than the configured window */
    assert_true(suspect < 1.0); /* still a stop is noticed in under a second */
    assert_true(lost <= 2.0);
    assert_int_equal(judge(&a, t + 0.99), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, t + 2.01), HPD_ALIVE_LOST);
}

/* Pings over a slow, lossy link: 100 ms apart, and now and then a
 * retransmission holds them for 0.6 to 1.5 s: never lost. */
static void test_lossy_link(void **state)
{
    hpd_alive_t a;
    double t = 0;
    hpd_alive_start(&a, 0, 0.1);
    srand(5);
    for (int i = 0; i < 2000; i++) {
        const double gap = rand() % 20 == 0 ? 0.6 + 0.1 * (rand() % 10) : 0.1;
        for (double u = 0.01; u < gap; u += 0.01)
            assert_int_not_equal(judge(&a, t + u), HPD_ALIVE_LOST);
        hpd_alive_ping(&a, t += gap);
    }
    assert_true(hpd_alive_lost_after(&a, WINDOW, LEASE) <= LEASE);
}

/* Pings over a link whose retransmission timeout is known (the kernel's,
 * 0.8 s: a 400 ms round trip with losses): a ping one retransmission late
 * is not suspect, one two retransmissions late (3 RTOs, 2.5 s: the cause of
 * a healthy node declared lost on c7ba6c2's CI, 2033 ms silent against a
 * 2000 ms window) is not lost, a stop is lost once two retransmissions
 * would have come (7 RTOs). On a LAN's RTO (its 200 ms floor) the windows
 * are the configured ones. */
static void test_retransmissions(void **state)
{
    hpd_alive_t a, lan;
    double t = 0;
    hpd_alive_start(&a, 0, 0.1);
    hpd_alive_start(&lan, 0, 0.1);
    for (int i = 0; i < 100; i++) {
        hpd_alive_link(&a, 0.8);
        hpd_alive_ping(&a, t += 0.1);
        hpd_alive_link(&lan, 0.204);
        hpd_alive_ping(&lan, t);
    }
    assert_int_equal(judge(&a, t + 0.1 + 0.8 - 0.01), HPD_ALIVE_OK);
    assert_int_equal(judge(&a, t + 0.1 + 0.8 + 0.05), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, t + 0.1 + 3 * 0.8), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, t + 0.1 + 7 * 0.8 - 0.01), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, t + 0.1 + 7 * 0.8 + 0.05), HPD_ALIVE_LOST);
    assert_int_equal(judge(&lan, t + 0.45), HPD_ALIVE_OK);
    assert_int_equal(judge(&lan, t + 0.55), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&lan, t + 2.05), HPD_ALIVE_LOST);
    /* a larger RTO counts at once, a smaller one a tenth of the way down
     * each sample; an unknown one (not TCP) changes nothing */
    hpd_alive_link(&lan, 1.0);
    assert_true(lan.rto == 1.0);
    hpd_alive_link(&lan, 0.2);
    assert_true(lan.rto > 0.91 && lan.rto < 0.93);
    hpd_alive_link(&lan, 0);
    assert_true(lan.rto > 0.91 && lan.rto < 0.93);
    hpd_alive_link(&lan, NAN); /* nothing a kernel says, and no poison either */
    assert_true(lan.rto > 0.91 && lan.rto < 0.93);
    /* never past the lease */
    hpd_alive_link(&lan, 5.0);
    assert_true(hpd_alive_lost_after(&lan, WINDOW, LEASE) == LEASE);
}

static void test_from_registration(void **state)
{
    hpd_alive_t a;
    hpd_alive_start(&a, 100.0, 0.1); /* registered at 100 s, no ping since */
    assert_int_equal(judge(&a, 100.4), HPD_ALIVE_OK);
    assert_int_equal(judge(&a, 100.6), HPD_ALIVE_SUSPECT);
    assert_int_equal(judge(&a, 102.1), HPD_ALIVE_LOST);
    /* the cap: never past the lease */
    hpd_alive_t w;
    hpd_alive_start(&w, 0, 0.1);
    for (int i = 1; i <= 20; i++)
        hpd_alive_ping(&w, 30.0 * i); /* absurd intervals */
    assert_true(hpd_alive_lost_after(&w, WINDOW, LEASE) == LEASE);
    /* a ping from before the last one changes nothing */
    hpd_alive_t b = a;
    hpd_alive_ping(&b, 99.0);
    assert_true(b.last == a.last && b.mean == a.mean && b.pings == a.pings);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady),
        cmocka_unit_test(test_starved_then_stopped),
        cmocka_unit_test(test_lossy_link),
        cmocka_unit_test(test_retransmissions),
        cmocka_unit_test(test_from_registration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
