/* The map from 64-bit keys (common/u64map.h) against a plain array of what
 * it should hold: random puts, replacements and deletes over keys that
 * collide (sequential ids, as the coordinator's are) and that wrap around
 * the table's end; every key read back after every step of a sample. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/u64map.h"

#define KEYS 3000

static uint64_t next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void check_all(const hpd_u64map_t *m, const uint64_t *keys, void *const *want)
{
    size_t n = 0;
    for (int i = 0; i < KEYS; i++) {
        assert_ptr_equal(hpd_u64map_get(m, keys[i]), want[i]);
        n += want[i] != NULL;
    }
    assert_int_equal(m->n, n);
}

static void test_against_an_array(void **state)
{
    static uint64_t keys[KEYS];
    static void *want[KEYS];
    static char vals[KEYS];
    hpd_u64map_t m;
    hpd_u64map_init(&m);
    for (int i = 0; i < KEYS; i++) /* half sequential, half spread */
        keys[i] = i % 2 ? ((uint64_t)1 << 50) + (uint64_t)i : (uint64_t)i * 0x100000001ull + 7;
    uint64_t x = 42;
    for (int step = 0; step < 60000; step++) {
        const int i = (int)(next(&x) % KEYS);
        if (next(&x) % 3 == 0) {
            assert_ptr_equal(hpd_u64map_del(&m, keys[i]), want[i]);
            want[i] = NULL;
        } else {
            void *v = &vals[next(&x) % KEYS];
            assert_int_equal(hpd_u64map_put(&m, keys[i], v), HPD_OK);
            want[i] = v;
        }
        if (step % 1000 == 0)
            check_all(&m, keys, want);
    }
    check_all(&m, keys, want);
    /* everything out again, in another order */
    for (int i = KEYS - 1; i >= 0; i--) {
        assert_ptr_equal(hpd_u64map_del(&m, keys[i]), want[i]);
        want[i] = NULL;
    }
    check_all(&m, keys, want);
    hpd_u64map_free(&m);
}

/* A run of colliding keys that wraps past the table's last slot, taken
 * out in every order of its first four: what the shift leaves behind is
 * still found. */
static void test_wraparound(void **state)
{
    uint64_t at_end[6];
    int n = 0;
    hpd_u64map_t probe = {0};
    int a;
    for (uint64_t k = 1; n < 6; k++) { /* keys whose home is one of the last two slots */
        assert_int_equal(hpd_u64map_put(&probe, k, &a), HPD_OK);
        size_t i = 0;
        while (probe.slots[i].key != k)
            i++;
        if (i >= probe.cap - 2)
            at_end[n++] = k;
        hpd_u64map_del(&probe, k);
    }
    const size_t cap = probe.cap;
    hpd_u64map_free(&probe);
    static const int orders[4][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}};
    for (int o = 0; o < 4; o++) {
        hpd_u64map_t m = {0};
        for (int i = 0; i < 6; i++)
            assert_int_equal(hpd_u64map_put(&m, at_end[i], &at_end[i]), HPD_OK);
        assert_int_equal(m.cap, cap);
        assert_true(m.slots[0].key != 0); /* the run wrapped */
        for (int d = 0; d < 4; d++) {
            assert_ptr_equal(hpd_u64map_del(&m, at_end[orders[o][d]]), &at_end[orders[o][d]]);
            for (int i = 0; i < 6; i++) {
                bool gone = false;
                for (int e = 0; e <= d; e++)
                    gone |= orders[o][e] == i;
                assert_ptr_equal(hpd_u64map_get(&m, at_end[i]), gone ? NULL : &at_end[i]);
            }
        }
        hpd_u64map_free(&m);
    }
}

static void test_edges(void **state)
{
    hpd_u64map_t m = {0};
    int a;
    assert_null(hpd_u64map_get(&m, 5));
    assert_null(hpd_u64map_del(&m, 5));
    assert_int_equal(hpd_u64map_put(&m, 0, &a), HPD_ERR_INVALID_ARG);
    assert_null(hpd_u64map_get(&m, 0));
    assert_int_equal(hpd_u64map_put(&m, UINT64_MAX, &a), HPD_OK);
    assert_ptr_equal(hpd_u64map_get(&m, UINT64_MAX), &a);
    assert_int_equal(m.n, 1);
    hpd_u64map_free(&m);
    hpd_u64map_free(&m); /* twice: nothing */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_an_array),
        cmocka_unit_test(test_wraparound),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
