/* A request's answers assembled by position (coordinator/choices.h): in
 * order (the core: what comes past the end is dropped) and out of order
 * (a front door: the first token may come after the rest); a position
 * reported twice must match; nothing is written past max_tokens, whatever
 * index a peer sends; a sink's stop keeps the tokens up to it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdint.h>
#include <string.h>

#include "coordinator/choices.h"

static uint32_t add(hpd_choice_t *ch, uint32_t max, uint32_t index, const int32_t *ids,
                    uint32_t n)
{
    uint32_t pos = 0;
    int32_t was = 0, now = 0;
    return hpd_choice_add(ch, max, index, ids, NULL, n, &pos, &was, &now);
}

static void test_in_order_drops_what_comes_early(void **state)
{
    hpd_choice_t ch = {0};
    (void)state;
    assert_int_equal(hpd_choices_alloc(&ch, 1, 8, false, false), HPD_OK);
    const int32_t rest[] = {11, 12, 13}, first[] = {10};
    assert_int_equal(add(&ch, 8, 1, rest, 3), 0);
    assert_int_equal(ch.n_out, 0); /* a gap: dropped */
    assert_int_equal(add(&ch, 8, 0, first, 1), 0);
    assert_int_equal(add(&ch, 8, 1, rest, 3), 0);
    assert_int_equal(ch.n_out, 4);
    assert_int_equal(ch.out[3], 13);
    hpd_choices_free(&ch, 1);
}

static void test_out_of_order_fills_the_gap(void **state)
{
    hpd_choice_t ch = {0};
    (void)state;
    assert_int_equal(hpd_choices_alloc(&ch, 1, 8, false, true), HPD_OK);
    const int32_t rest[] = {11, 12, 13}, more[] = {14}, first[] = {10};
    assert_int_equal(add(&ch, 8, 1, rest, 3), 0);
    assert_int_equal(add(&ch, 8, 4, more, 1), 0);
    assert_int_equal(ch.n_out, 0); /* held until the first comes */
    assert_int_equal(add(&ch, 8, 0, first, 1), 0);
    assert_int_equal(ch.n_out, 5);
    const int32_t want[] = {10, 11, 12, 13, 14};
    assert_memory_equal(ch.out, want, sizeof(want));
    /* a retry's positions again: the same are fine, another is counted */
    const int32_t again[] = {11, 99};
    uint32_t pos = 0;
    int32_t was = 0, now = 0;
    assert_int_equal(hpd_choice_add(&ch, 8, 1, again, NULL, 2, &pos, &was, &now), 1);
    assert_int_equal(pos, 2);
    assert_int_equal(was, 12);
    assert_int_equal(now, 99);
    assert_int_equal(ch.out[2], 12);
    hpd_choices_free(&ch, 1);
}

static void test_nothing_past_max_tokens(void **state)
{
    hpd_choice_t ch[2] = {{0}};
    (void)state;
    for (int ooo = 0; ooo < 2; ooo++) {
        assert_int_equal(hpd_choices_alloc(&ch[ooo], 1, 4, false, ooo), HPD_OK);
        const int32_t ids[] = {1, 2, 3, 4, 5, 6};
        assert_int_equal(add(&ch[ooo], 4, 0, ids, 6), 0);
        assert_int_equal(ch[ooo].n_out, 4);
        /* an index that would wrap past 2^32 back to 0 */
        const int32_t evil[] = {7, 8};
        assert_int_equal(add(&ch[ooo], 4, UINT32_MAX, evil, 2), 0);
        assert_int_equal(ch[ooo].out[0], 1);
        assert_int_equal(ch[ooo].n_out, 4);
    }
    hpd_choices_free(ch, 2);
}

static bool stop_at_two(void *arg, uint32_t k, const int32_t *tokens,
                        const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                        uint32_t *keep_p)
{
    (void)arg;
    (void)k;
    (void)tokens;
    (void)lp;
    (void)from;
    if (n < 3)
        return true;
    *keep_p = 2;
    return false;
}

static void test_a_stop_keeps_what_came_before(void **state)
{
    hpd_choice_t ch[2] = {{0}};
    (void)state;
    assert_int_equal(hpd_choices_alloc(ch, 2, 8, false, true), HPD_OK);
    const hpd_coord_sink_t sink = {.tokens = stop_at_two};
    const int32_t ids[] = {5, 6, 7, 8};
    add(&ch[1], 8, 0, ids, 4);
    assert_true(hpd_choice_stream(&ch[1], &sink, 1, 0));
    assert_true(ch[1].stopped);
    assert_int_equal(ch[1].n_out, 2);
    assert_int_equal(add(&ch[1], 8, 4, ids, 1), 0); /* a stopped choice takes nothing */
    assert_int_equal(ch[1].n_out, 2);
    assert_false(hpd_choices_over(ch, 2));
    ch[0].done = true;
    assert_true(hpd_choices_over(ch, 2));
    assert_false(hpd_choices_done(ch, 2));
    hpd_choices_free(ch, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order_drops_what_comes_early),
        cmocka_unit_test(test_out_of_order_fills_the_gap),
        cmocka_unit_test(test_nothing_past_max_tokens),
        cmocka_unit_test(test_a_stop_keeps_what_came_before),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
