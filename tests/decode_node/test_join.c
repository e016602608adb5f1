/* A reservation's notice/start join on a decode node (decode_node/join.h),
 * events scripted by hand:
 * - notice then start, and start then notice, each run the request once;
 * - a second start, a start after an expiry, a second notice: refused or
 *   ignored;
 * - a bad transfer fails the reservation;
 * - the expiry frees a reservation whose transfer ended, and fences one
 *   whose transfer did not: its pages wait for the writer's notice, a
 *   cancel, or the backstop;
 * - a cancel frees in every state, and closes the writer's connection
 *   only while its transfer has not ended. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "decode_node/join.h"

static hpd_join_verdict_t ev(hpd_join_t *j, hpd_join_event_t e)
{
    return hpd_join_event(j, e).verdict;
}

static void test_either_order_runs_once(void **state)
{
    hpd_join_t j = {0};
    assert_int_equal(ev(&j, HPD_JOIN_EV_NOTICE), HPD_JOIN_WAIT);
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_RUN);
    assert_int_equal(j.state, HPD_JOIN_RUNNING);
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_REFUSE);  /* started */
    assert_int_equal(ev(&j, HPD_JOIN_EV_NOTICE), HPD_JOIN_IGNORE); /* a second notice */
    assert_int_equal(ev(&j, HPD_JOIN_EV_TIMER), HPD_JOIN_IGNORE);  /* the expiry is off */
    j = (hpd_join_t){0};
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_WAIT);
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_REFUSE); /* twice */
    assert_int_equal(ev(&j, HPD_JOIN_EV_NOTICE), HPD_JOIN_RUN);
    assert_int_equal(j.state, HPD_JOIN_RUNNING);
}

static void test_bad_transfer_fails(void **state)
{
    hpd_join_t j = {0};
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_WAIT);
    assert_int_equal(ev(&j, HPD_JOIN_EV_BAD_NOTICE), HPD_JOIN_FAIL);
}

static void test_expiry_frees_or_fences(void **state)
{
    hpd_join_t j = {0};
    assert_int_equal(ev(&j, HPD_JOIN_EV_NOTICE), HPD_JOIN_WAIT);
    assert_int_equal(ev(&j, HPD_JOIN_EV_TIMER), HPD_JOIN_EXPIRE); /* nothing can land */
    j = (hpd_join_t){0};
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_WAIT);
    assert_int_equal(ev(&j, HPD_JOIN_EV_TIMER), HPD_JOIN_FENCE); /* the writer may still write */
    assert_int_equal(j.state, HPD_JOIN_FENCED);
    assert_int_equal(ev(&j, HPD_JOIN_EV_START), HPD_JOIN_REFUSE);
    /* the writer's notice, good or bad, ends the fence */
    hpd_join_t k = j;
    assert_int_equal(ev(&k, HPD_JOIN_EV_NOTICE), HPD_JOIN_FREE);
    k = j;
    assert_int_equal(ev(&k, HPD_JOIN_EV_BAD_NOTICE), HPD_JOIN_FREE);
    /* no cancel came: the backstop */
    k = j;
    const hpd_join_plan_t p = hpd_join_event(&k, HPD_JOIN_EV_TIMER);
    assert_int_equal(p.verdict, HPD_JOIN_FREE);
    assert_true(p.backstop);
}

static void test_cancel_fences_a_writer_still_writing(void **state)
{
    const hpd_join_state_t fence_states[] = {HPD_JOIN_RESERVED, HPD_JOIN_FENCED};
    for (int i = 0; i < 2; i++) {
        hpd_join_t j = {.state = fence_states[i]};
        hpd_join_plan_t p = hpd_join_event(&j, HPD_JOIN_EV_CANCEL_WRITER);
        assert_int_equal(p.verdict, HPD_JOIN_FREE);
        assert_true(p.close_writer);
        j = (hpd_join_t){.state = fence_states[i]};
        p = hpd_join_event(&j, HPD_JOIN_EV_CANCEL);
        assert_int_equal(p.verdict, HPD_JOIN_FREE);
        assert_false(p.close_writer); /* none named */
    }
    hpd_join_t j = {0};
    ev(&j, HPD_JOIN_EV_NOTICE); /* its transfer ended: nothing to fence */
    hpd_join_plan_t p = hpd_join_event(&j, HPD_JOIN_EV_CANCEL_WRITER);
    assert_int_equal(p.verdict, HPD_JOIN_FREE);
    assert_false(p.close_writer);
    j = (hpd_join_t){0};
    ev(&j, HPD_JOIN_EV_NOTICE);
    ev(&j, HPD_JOIN_EV_START);
    p = hpd_join_event(&j, HPD_JOIN_EV_CANCEL_WRITER);
    assert_int_equal(p.verdict, HPD_JOIN_FREE); /* running: freed too */
    assert_false(p.close_writer);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_either_order_runs_once),
        cmocka_unit_test(test_bad_transfer_fails),
        cmocka_unit_test(test_expiry_frees_or_fences),
        cmocka_unit_test(test_cancel_fences_a_writer_still_writing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
