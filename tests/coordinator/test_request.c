/* The request state machine (coordinator/request.h), events scripted by
 * hand:
 * - the happy path and what each step books and gives back;
 * - events of another state (late replies, a prefill node lost after its
 *   job was done) change nothing;
 * - node losses, a failed pair, the decode node ending the attempt, a full
 *   decode node, refusals, cancels, queue timeouts and the shutdown: which
 *   node is told to stop, in which order, and when the writer is fenced;
 * - max_attempts failed attempts give up;
 * - a hedge that finished first stops the attempt it raced;
 * - random event sequences never leak a booking, never give one back twice,
 *   never cancel on a node that holds nothing, and always end queued. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/request.h"
#include "transport/rpc.h"

#define MAX_ATTEMPTS 4

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static hpd_req_plan_t ev(hpd_req_fsm_t *f, hpd_req_event_t e)
{
    return hpd_req_fsm_event(f, e, MAX_ATTEMPTS);
}

/* A request brought to state s by the happy path. */
static hpd_req_fsm_t at(hpd_req_state_t s)
{
    hpd_req_fsm_t f = hpd_req_fsm_init();
    if (s >= HPD_REQ_RESERVING)
        ev(&f, HPD_REQ_EV_PLACED);
    if (s >= HPD_REQ_PREFILLING)
        ev(&f, HPD_REQ_EV_RESERVED);
    if (s >= HPD_REQ_DECODING)
        ev(&f, HPD_REQ_EV_PREFILLED);
    assert_int_equal(f.state, s);
    return f;
}

static void test_happy_path(void **state)
{
    hpd_req_fsm_t f = hpd_req_fsm_init();
    hpd_req_plan_t p = ev(&f, HPD_REQ_EV_PLACED);
    assert_int_equal(p.verdict, HPD_REQ_GO_ON);
    assert_int_equal(f.state, HPD_REQ_RESERVING);
    assert_true(f.on_decode);
    p = ev(&f, HPD_REQ_EV_RESERVED);
    assert_int_equal(p.verdict, HPD_REQ_GO_ON);
    assert_true(f.on_prefill);
    p = ev(&f, HPD_REQ_EV_PREFILLED);
    assert_int_equal(p.verdict, HPD_REQ_GO_ON);
    assert_true(p.unbook_prefill);
    assert_false(p.unbook_decode || p.cancel_prefill || p.cancel_decode);
    assert_int_equal(f.state, HPD_REQ_DECODING);
    p = ev(&f, HPD_REQ_EV_DONE);
    assert_int_equal(p.verdict, HPD_REQ_FINISH);
    assert_true(p.unbook_decode);   /* the decode node freed it itself: */
    assert_false(p.cancel_decode);  /* no cancel */
    assert_false(p.cancel_prefill);
    assert_int_equal(f.attempts, 0);
}

static void test_events_of_another_state_are_ignored(void **state)
{
    static const struct {
        hpd_req_state_t s;
        hpd_req_event_t e;
    } cases[] = {
        {HPD_REQ_QUEUED, HPD_REQ_EV_RESERVED},     {HPD_REQ_QUEUED, HPD_REQ_EV_PREFILLED},
        {HPD_REQ_QUEUED, HPD_REQ_EV_DONE},         {HPD_REQ_QUEUED, HPD_REQ_EV_FAILED},
        {HPD_REQ_QUEUED, HPD_REQ_EV_DECODE_ENDED}, {HPD_REQ_QUEUED, HPD_REQ_EV_FULL},
        {HPD_REQ_RESERVING, HPD_REQ_EV_PLACED},    {HPD_REQ_RESERVING, HPD_REQ_EV_PREFILLED},
        {HPD_REQ_RESERVING, HPD_REQ_EV_DONE},      {HPD_REQ_RESERVING, HPD_REQ_EV_TIMEOUT},
        {HPD_REQ_RESERVING, HPD_REQ_EV_PAIR_FAILED}, {HPD_REQ_RESERVING, HPD_REQ_EV_PREFILL_LOST},
        {HPD_REQ_PREFILLING, HPD_REQ_EV_RESERVED}, {HPD_REQ_PREFILLING, HPD_REQ_EV_FULL},
        {HPD_REQ_PREFILLING, HPD_REQ_EV_DONE},     {HPD_REQ_DECODING, HPD_REQ_EV_PREFILLED},
        /* once prefilled, the decode node has all it needs */
        {HPD_REQ_DECODING, HPD_REQ_EV_PREFILL_LOST}, {HPD_REQ_DECODING, HPD_REQ_EV_PAIR_FAILED},
        {HPD_REQ_DECODING, HPD_REQ_EV_REFUSED},    {HPD_REQ_DECODING, HPD_REQ_EV_TIMEOUT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hpd_req_fsm_t f = at(cases[i].s);
        const hpd_req_fsm_t before = f;
        const hpd_req_plan_t p = ev(&f, cases[i].e);
        assert_int_equal(p.verdict, HPD_REQ_IGNORE);
        assert_memory_equal(&f, &before, sizeof(f));
        assert_false(p.unbook_decode || p.unbook_prefill || p.cancel_prefill || p.cancel_decode);
    }
}

static void test_prefill_lost_while_pushing_fences_it(void **state)
{
    hpd_req_fsm_t f = at(HPD_REQ_PREFILLING);
    const hpd_req_plan_t p = ev(&f, HPD_REQ_EV_PREFILL_LOST);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_false(p.cancel_prefill);  /* it is gone */
    assert_false(p.unbook_prefill);  /* and its books with it */
    assert_true(p.cancel_decode);
    assert_true(p.fence_writer);     /* its puts may still be queued */
    assert_true(p.unbook_decode);
    assert_false(p.avoid_decode);
    assert_int_equal(f.state, HPD_REQ_QUEUED);
    assert_int_equal(f.attempts, 1);
    assert_false(f.on_decode || f.on_prefill || f.writer_lost || f.pair_failed);
}

static void test_decode_lost(void **state)
{
    hpd_req_fsm_t f = at(HPD_REQ_PREFILLING);
    hpd_req_plan_t p = ev(&f, HPD_REQ_EV_DECODE_LOST);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_true(p.cancel_prefill); /* the survivor stops */
    assert_true(p.unbook_prefill);
    assert_false(p.cancel_decode || p.unbook_decode);
    f = at(HPD_REQ_DECODING);
    p = ev(&f, HPD_REQ_EV_DECODE_LOST);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_false(p.cancel_prefill || p.cancel_decode || p.unbook_decode || p.unbook_prefill);
    f = at(HPD_REQ_RESERVING);
    p = ev(&f, HPD_REQ_EV_DECODE_LOST);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_false(p.cancel_decode);
}

static void test_pair_failed(void **state)
{
    hpd_req_fsm_t f = at(HPD_REQ_PREFILLING);
    const hpd_req_plan_t p = ev(&f, HPD_REQ_EV_PAIR_FAILED);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_true(p.avoid_decode);
    assert_true(p.pair_failure);
    assert_true(p.cancel_prefill); /* first the prefill node stops, */
    assert_true(p.cancel_decode);  /* then the decode node frees, */
    assert_true(p.fence_writer);   /* closing the writer's connection first */
    assert_true(p.unbook_prefill && p.unbook_decode);
}

static void test_decode_ended(void **state)
{
    /* while the prefill node pushes: its pages wait for its answer */
    hpd_req_fsm_t f = at(HPD_REQ_PREFILLING);
    hpd_req_plan_t p = ev(&f, HPD_REQ_EV_DECODE_ENDED);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_true(p.avoid_decode);
    assert_true(p.cancel_prefill && p.cancel_decode);
    assert_false(p.fence_writer);
    /* decoding: the node freed it itself */
    f = at(HPD_REQ_DECODING);
    p = ev(&f, HPD_REQ_EV_DECODE_ENDED);
    assert_int_equal(p.verdict, HPD_REQ_RETRY);
    assert_true(p.avoid_decode && p.unbook_decode);
    assert_false(p.cancel_decode || p.cancel_prefill);
    f = at(HPD_REQ_RESERVING);
    p = ev(&f, HPD_REQ_EV_DECODE_ENDED);
    assert_true(p.unbook_decode);
    assert_false(p.cancel_decode);
}

static void test_full_waits_without_counting(void **state)
{
    hpd_req_fsm_t f = at(HPD_REQ_RESERVING);
    const hpd_req_plan_t p = ev(&f, HPD_REQ_EV_FULL);
    assert_int_equal(p.verdict, HPD_REQ_WAIT);
    assert_int_equal(f.attempts, 0);
    assert_true(p.unbook_decode && p.cancel_decode);
    assert_int_equal(f.state, HPD_REQ_QUEUED);
}

static void test_gives_up_after_max_attempts(void **state)
{
    hpd_req_fsm_t f = hpd_req_fsm_init();
    for (uint32_t i = 1; i <= MAX_ATTEMPTS; i++) {
        ev(&f, HPD_REQ_EV_PLACED);
        const hpd_req_plan_t p = ev(&f, HPD_REQ_EV_FAILED);
        assert_int_equal(f.attempts, i);
        if (i < MAX_ATTEMPTS) {
            assert_int_equal(p.verdict, HPD_REQ_RETRY);
        } else {
            assert_int_equal(p.verdict, HPD_REQ_FAIL);
            assert_true(p.gave_up);
            assert_int_equal(p.code, HPD_RPC_ERR_APP);
            assert_true(p.cancel_decode); /* the last attempt is undone too */
        }
    }
}

static void test_refusals_timeouts_cancels_shutdown(void **state)
{
    hpd_req_fsm_t f = hpd_req_fsm_init();
    hpd_req_plan_t p = ev(&f, HPD_REQ_EV_REFUSED); /* no node could ever hold it */
    assert_int_equal(p.verdict, HPD_REQ_FAIL);
    assert_int_equal(p.code, HPD_RPC_ERR_PARAMS);
    assert_false(p.gave_up);
    f = at(HPD_REQ_PREFILLING);
    p = ev(&f, HPD_REQ_EV_REFUSED);
    assert_int_equal(p.code, HPD_RPC_ERR_PARAMS);
    assert_true(p.cancel_prefill && p.cancel_decode);
    f = hpd_req_fsm_init();
    p = ev(&f, HPD_REQ_EV_TIMEOUT);
    assert_int_equal(p.verdict, HPD_REQ_FAIL);
    assert_int_equal(p.code, HPD_RPC_ERR_OVERLOADED);
    /* a cancel in each state stops what holds the request */
    f = hpd_req_fsm_init();
    p = ev(&f, HPD_REQ_EV_CANCEL);
    assert_int_equal(p.verdict, HPD_REQ_CANCELED);
    assert_false(p.cancel_decode || p.cancel_prefill || p.unbook_decode);
    f = at(HPD_REQ_RESERVING);
    p = ev(&f, HPD_REQ_EV_CANCEL);
    assert_true(p.cancel_decode && p.unbook_decode);
    assert_false(p.cancel_prefill);
    f = at(HPD_REQ_PREFILLING);
    p = ev(&f, HPD_REQ_EV_CANCEL);
    assert_true(p.cancel_prefill && p.cancel_decode);
    assert_false(p.fence_writer); /* the prefill node answers first */
    f = at(HPD_REQ_DECODING);
    p = ev(&f, HPD_REQ_EV_CANCEL);
    assert_true(p.cancel_decode && p.unbook_decode);
    assert_false(p.cancel_prefill || p.unbook_prefill);
    f = at(HPD_REQ_DECODING);
    p = ev(&f, HPD_REQ_EV_SHUTDOWN);
    assert_int_equal(p.verdict, HPD_REQ_FAIL);
    assert_int_equal(p.code, HPD_RPC_ERR_APP);
    assert_true(p.cancel_decode);
}

/* Its hedge finished first: in each state the attempt stops as for a
 * cancel (the prefill node first, then the decode node), and the request
 * finishes; a failed attempt is not counted. */
static void test_hedge_won(void **state)
{
    hpd_req_fsm_t f = hpd_req_fsm_init();
    hpd_req_plan_t p = ev(&f, HPD_REQ_EV_HEDGE_WON); /* queued, waiting for its hedge */
    assert_int_equal(p.verdict, HPD_REQ_FINISH);
    assert_false(p.cancel_decode || p.cancel_prefill || p.unbook_decode || p.unbook_prefill);
    f = at(HPD_REQ_RESERVING);
    p = ev(&f, HPD_REQ_EV_HEDGE_WON);
    assert_int_equal(p.verdict, HPD_REQ_FINISH);
    assert_true(p.cancel_decode && p.unbook_decode);
    assert_false(p.cancel_prefill);
    f = at(HPD_REQ_PREFILLING);
    p = ev(&f, HPD_REQ_EV_HEDGE_WON);
    assert_int_equal(p.verdict, HPD_REQ_FINISH);
    assert_true(p.cancel_prefill && p.unbook_prefill && p.cancel_decode && p.unbook_decode);
    assert_false(p.fence_writer);
    f = at(HPD_REQ_DECODING);
    p = ev(&f, HPD_REQ_EV_HEDGE_WON);
    assert_int_equal(p.verdict, HPD_REQ_FINISH);
    assert_true(p.cancel_decode && p.unbook_decode);
    assert_false(p.cancel_prefill || p.unbook_prefill || p.gave_up);
    assert_int_equal(f.attempts, 0);
    assert_int_equal(f.state, HPD_REQ_QUEUED);
    assert_false(f.on_decode || f.on_prefill);
}

/* Random event sequences, with the bookings kept as the coordinator keeps
 * them: nothing is given back twice or leaked, no cancel goes to a node
 * that holds nothing, and a request that ends holds nothing. */
static void test_random_sequences_keep_the_books(void **state)
{
    uint64_t rng = 20261123;
    uint32_t ended = 0;
    for (int run = 0; run < 20000; run++) {
        hpd_req_fsm_t f = hpd_req_fsm_init();
        int dbook = 0, pbook = 0;
        for (int step = 0; step < 64; step++) {
            const hpd_req_event_t e = (hpd_req_event_t)(splitmix(&rng) % (HPD_REQ_EV_HEDGE_WON + 1));
            const bool had_d = f.on_decode, had_p = f.on_prefill;
            if (e == HPD_REQ_EV_DECODE_LOST && f.on_decode && f.state != HPD_REQ_QUEUED)
                dbook = 0; /* the node's books went with it */
            if (e == HPD_REQ_EV_PREFILL_LOST && f.state == HPD_REQ_PREFILLING)
                pbook = 0;
            const hpd_req_plan_t p = ev(&f, e);
            if (p.verdict == HPD_REQ_GO_ON && e == HPD_REQ_EV_PLACED)
                dbook++;
            if (p.verdict == HPD_REQ_GO_ON && e == HPD_REQ_EV_RESERVED)
                pbook++;
            if (p.unbook_decode)
                dbook--;
            if (p.unbook_prefill)
                pbook--;
            assert_true(dbook == 0 || dbook == 1);
            assert_true(pbook == 0 || pbook == 1);
            assert_int_equal(dbook, f.on_decode);
            assert_int_equal(pbook, f.on_prefill);
            if (p.cancel_prefill)
                assert_true(had_p);
            if (p.cancel_decode)
                assert_true(had_d);
            if (p.fence_writer)
                assert_true(p.cancel_decode);
            if (p.verdict == HPD_REQ_FAIL || p.verdict == HPD_REQ_FINISH ||
                p.verdict == HPD_REQ_CANCELED) {
                assert_int_equal(f.state, HPD_REQ_QUEUED);
                assert_false(f.on_decode || f.on_prefill);
                ended++;
                break;
            }
            assert_true(f.attempts < MAX_ATTEMPTS);
        }
    }
    assert_true(ended > 10000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_happy_path),
        cmocka_unit_test(test_events_of_another_state_are_ignored),
        cmocka_unit_test(test_prefill_lost_while_pushing_fences_it),
        cmocka_unit_test(test_decode_lost),
        cmocka_unit_test(test_pair_failed),
        cmocka_unit_test(test_decode_ended),
        cmocka_unit_test(test_full_waits_without_counting),
        cmocka_unit_test(test_gives_up_after_max_attempts),
        cmocka_unit_test(test_refusals_timeouts_cancels_shutdown),
        cmocka_unit_test(test_hedge_won),
        cmocka_unit_test(test_random_sequences_keep_the_books),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
