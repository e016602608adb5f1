/* The staging arena (prefill_node/staging.h): first fit in 64-byte units,
 * exhaustion, and ranges given back in any order merging until the arena
 * is one range again (checked against a byte map of what is handed out). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/rng.h"
#include "prefill_node/staging.h"

static uint32_t n_ranges(const hpd_staging_t *s)
{
    uint32_t n = 0;
    for (const hpd_staging_extent_t *e = s->free_list; e != NULL; e = e->next) {
        if (e->next != NULL) /* sorted and never adjacent */
            assert_true(e->off + e->len < e->next->off);
        n++;
    }
    return n;
}

static void test_first_fit(void **state)
{
    hpd_staging_t s;
    uint64_t a, b, c, d;
    assert_int_equal(hpd_staging_init(&s, 1024), HPD_OK);
    assert_true(hpd_staging_alloc(&s, 1, &a)); /* 64 */
    assert_true(hpd_staging_alloc(&s, 100, &b)); /* 128 */
    assert_true(hpd_staging_alloc(&s, 64, &c));
    assert_int_equal(a, 0);
    assert_int_equal(b, 64);
    assert_int_equal(c, 192);
    assert_int_equal(s.free_bytes, 1024 - 256);
    assert_false(hpd_staging_alloc(&s, 1024 - 255, &d)); /* 832 > 768 */
    assert_true(hpd_staging_alloc(&s, 768, &d));
    assert_int_equal(s.free_bytes, 0);
    assert_false(hpd_staging_alloc(&s, 1, &d));
    /* a hole of 128 at 64: the first range that fits is it */
    assert_int_equal(hpd_staging_free(&s, b, 100), HPD_OK);
    assert_true(hpd_staging_alloc(&s, 64, &d));
    assert_int_equal(d, 64);
    assert_int_equal(hpd_staging_free(&s, d, 64), HPD_OK);
    /* back in the order a, c, then the rest: one range */
    assert_int_equal(hpd_staging_free(&s, a, 1), HPD_OK);
    assert_int_equal(n_ranges(&s), 1); /* 0..192 */
    assert_int_equal(hpd_staging_free(&s, 256, 768), HPD_OK);
    assert_int_equal(n_ranges(&s), 2);
    assert_int_equal(hpd_staging_free(&s, c, 64), HPD_OK); /* fills the gap */
    assert_int_equal(n_ranges(&s), 1);
    assert_int_equal(s.free_bytes, 1024);
    assert_true(hpd_staging_alloc(&s, 1024, &a));
    hpd_staging_destroy(&s);
}

/* Many allocations of random sizes, given back in a random order: no two
 * overlap, free_bytes is exact, and the arena ends as one range. */
static void test_random_order(void **state)
{
    enum { TOTAL = 64 * 1024, N = 200 };
    static uint8_t used[TOTAL];
    hpd_staging_t s;
    uint64_t off[N], len[N];
    bool live[N] = {false};
    assert_int_equal(hpd_staging_init(&s, TOTAL), HPD_OK);
    memset(used, 0, sizeof(used));
    for (uint32_t round = 0; round < 2000; round++) {
        const uint32_t k = hpd_philox4x32(11, round, 0).v[0] % N;
        if (live[k]) {
            assert_int_equal(hpd_staging_free(&s, off[k], len[k]), HPD_OK);
            memset(used + off[k], 0, (len[k] + 63) & ~63ull);
            live[k] = false;
            continue;
        }
        len[k] = 1 + hpd_philox4x32(11, round, 1).v[0] % 2000;
        if (!hpd_staging_alloc(&s, len[k], &off[k]))
            continue;
        assert_true(off[k] % 64 == 0 && off[k] + len[k] <= TOTAL);
        for (uint64_t i = off[k]; i < off[k] + ((len[k] + 63) & ~63ull); i++) {
            assert_int_equal(used[i], 0); /* never handed out twice */
            used[i] = 1;
        }
        live[k] = true;
    }
    uint64_t in_use = 0;
    for (uint32_t i = 0; i < TOTAL; i++)
        in_use += used[i];
    assert_int_equal(s.free_bytes, TOTAL - in_use);
    for (uint32_t k = N; k-- > 0;)
        if (live[k])
            assert_int_equal(hpd_staging_free(&s, off[k], len[k]), HPD_OK);
    assert_int_equal(n_ranges(&s), 1);
    assert_int_equal(s.free_bytes, TOTAL);
    hpd_staging_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_fit),
        cmocka_unit_test(test_random_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
