/* The coordinator in-process (coordinator/coordinator.h) with scripted
 * peers (tests/coordinator/peers.h): fake prefill and decode nodes on the
 * test's loop, so that a policy costs milliseconds, not a cluster of real
 * processes:
 * - a request's path: reserve, prefill, start, the decode node's tokens;
 * - a decode node's tokens count only for its own jobs: another registered
 *   node cannot add tokens to, end or fail a request it does not hold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <unistd.h>

#include "common/util.h"
#include "coordinator/coordinator.h"
#include "node/msg.h"
#include "tests/test_helpers.h"
#include "transport/rpc.h"
/* after the headers that name a parameter "base" */
#include "tests/transport/loop.h"
#include "tests/coordinator/peers.h"

static void test_one_request(void **state)
{
    peer_t p, d;
    outcome_t o;
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    submit_request(&o, 4);
    LOOP_UNTIL(d.starts == 1);
    assert_int_equal(d.reserves, 1);
    assert_int_equal(p.prefills, 1);
    static const int32_t rest[] = {10, 11, 12};
    peer_tokens(&d, d.jobs[0].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_int_equal(o.n_tokens, 4);
    static const int32_t want[] = {7, 10, 11, 12};
    assert_memory_equal(o.tokens, want, sizeof(want));
    peer_stop(&p);
    peer_stop(&d);
    coord_stop();
}

/* Another decode node's notifications for a job it does not hold change
 * nothing: not its tokens, not its end, not an error. */
static void test_tokens_only_from_its_decode_node(void **state)
{
    peer_t p, d[2];
    outcome_t o;
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d[0], "d0", false);
    peer_start(&d[1], "d1", false);
    submit_request(&o, 4);
    LOOP_UNTIL(d[0].starts + d[1].starts == 1);
    peer_t *own = d[0].starts ? &d[0] : &d[1], *other = d[0].starts ? &d[1] : &d[0];
    const uint64_t job = own->jobs[0].job;
    /* the other node needs a connection from the coordinator to notify on:
     * a second request goes there (the first holds the other's slot) */
    outcome_t o2;
    submit_request(&o2, 4);
    LOOP_UNTIL(other->starts == 1);
    static const int32_t fake[] = {66, 66, 66};
    peer_tokens(other, job, 1, fake, 3, true, NULL);
    peer_tokens(other, job, 1, fake, 1, false, "a failure it made up");
    spin(50);
    assert_false(o.done);
    static const int32_t rest[] = {10, 11, 12};
    peer_tokens(own, job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    static const int32_t want[] = {7, 10, 11, 12};
    assert_int_equal(o.n_tokens, 4);
    assert_memory_equal(o.tokens, want, sizeof(want));
    assert_int_equal(o.attempts, 1);
    peer_tokens(other, other->jobs[0].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o2.done);
    assert_int_equal(o2.outcome, HPD_COORD_FINISHED);
    peer_stop(&p);
    peer_stop(&d[0]);
    peer_stop(&d[1]);
    coord_stop();
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_only_from_its_decode_node, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
