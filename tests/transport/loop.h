/* One libevent loop for the in-process transport tests (header-only; one
 * test binary includes it once, after cmocka.h). Nothing waits on a clock:
 * a deadline only turns a hang into a failure that says what was awaited,
 * and it is generous, for two loaded cores under a sanitizer. */
#ifndef HPD_TESTS_TRANSPORT_LOOP_H
#define HPD_TESTS_TRANSPORT_LOOP_H

#include <event2/event.h>
#include <unistd.h>

#include "common/util.h"

static struct event_base *base;

#define DEADLINE_S 120.0

/* Runs the loop (without blocking) until cond holds; `also` runs each
 * round. Fails the test at the deadline. */
#define PROGRESS_UNTIL(cond, also)                                                          \
    do {                                                                                    \
        const double t0_ = hpd_time_now();                                                  \
        while (!(cond)) {                                                                   \
            if (hpd_time_now() - t0_ > DEADLINE_S)                                          \
                fail_msg("no '%s' after %.0f s", #cond, DEADLINE_S);                        \
            const int idle_ = event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);          \
            also;                                                                           \
            if (idle_ != 0)                                                                 \
                usleep(100);                                                                \
        }                                                                                   \
    } while (0)

#define LOOP_UNTIL(cond) PROGRESS_UNTIL(cond, (void)0)

/* A few turns of the loop, for "nothing more happens" checks. */
static inline void spin(int turns)
{
    for (int i = 0; i < turns; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(100);
    }
}

static int setup(void **state)
{
    base = event_base_new();
    return base == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    event_base_free(base);
    return 0;
}

#endif
