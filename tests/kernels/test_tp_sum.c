/* The canonical reduction (kernels/tp_sum.h): a dot product split across
 * N ranks (each holding only its slice of K), its partials gathered and
 * combined, gives TP 1's bits at N = 2, 4, 8, where summing each rank's
 * slice and then the ranks, in order, does not; the order itself is the
 * documented one (in-group index order, the fixed tree), checked on values
 * where any other order rounds differently; NaN propagates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/tp_sum.h"

enum { K = 4096 };

static void fill(float *v, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        v[i] = (float)(hpd_philox4x32(seed, i, 0).v[0] % 2000001) / 1e6f - 1.0f;
}

/* The product at TP n: rank r gets only its slice of x and w. */
static float at_tp(const float *x, const float *w, uint32_t n)
{
    float gathered[HPD_TP_GROUPS];
    for (uint32_t r = 0; r < n; r++) {
        const uint32_t g0 = r * HPD_TP_GROUPS / n, g1 = (r + 1) * HPD_TP_GROUPS / n;
        const uint32_t from = r * K / n, len = K / n;
        float *xs = malloc(len * sizeof(float)), *ws = malloc(len * sizeof(float));
        memcpy(xs, x + from, len * sizeof(float));
        memcpy(ws, w + from, len * sizeof(float));
        hpd_tp_partials(xs, ws, K, g0, g1, gathered + g0);
        free(xs);
        free(ws);
    }
    return hpd_tp_combine(gathered);
}

/* What a ring all-reduce of per-rank sums amounts to at best: each rank
 * sums its slice in order, then the ranks in order. */
static float naive_tp(const float *x, const float *w, uint32_t n)
{
    float total = 0.0f;
    for (uint32_t r = 0; r < n; r++) {
        float s = 0.0f;
        for (uint32_t i = r * K / n; i < (r + 1) * K / n; i++)
            s += x[i] * w[i];
        total += s;
    }
    return total;
}

static void test_same_bits_at_every_degree(void **state)
{
    static float x[K], w[K];
    uint32_t naive_differs = 0;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        fill(x, K, seed);
        fill(w, K, 1000 + seed);
        const float one = at_tp(x, w, 1);
        double exact = 0, mag = 0;
        for (uint32_t i = 0; i < K; i++) {
            exact += (double)x[i] * w[i];
            mag += fabs((double)x[i] * w[i]);
        }
        if (!(fabs(one - exact) <= 1e-5 * mag))
            fail_msg("seed %llu: %.9g, exactly %.9g", (unsigned long long)seed, one, exact);
        for (uint32_t n = 2; n <= HPD_TP_GROUPS; n *= 2) {
            const float got = at_tp(x, w, n);
            if (memcmp(&got, &one, sizeof(float)) != 0)
                fail_msg("seed %llu, TP %u: %.9g, TP 1 %.9g", (unsigned long long)seed, n, got,
                         one);
        }
        naive_differs += naive_tp(x, w, 2) != naive_tp(x, w, 1) ||
                         naive_tp(x, w, 4) != naive_tp(x, w, 1);
    }
    /* the reason for all this: the plain order changes with the degree */
    assert_true(naive_differs > 10);
    print_message("rank-ordered sums differ from TP 1's in %u of 50 products\n", naive_differs);
}

static void test_the_order(void **state)
{
    /* the tree: ((1e8 + 1) + (-1e8 + 1)) + 0 rounds to 0; summed left to
     * right the same values give 1 */
    const float p[HPD_TP_GROUPS] = {1e8f, 1.0f, -1e8f, 1.0f, 0, 0, 0, 0};
    assert_true(hpd_tp_combine(p) == 0.0f);
    const float q[HPD_TP_GROUPS] = {0, 0, 0, 0, 1.0f, 1e8f, 1.0f, -1e8f};
    assert_true(hpd_tp_combine(q) == 0.0f);
    /* within a group, index order: 1e8 + 1 - 1e8 + 1 = 1 (backwards: 0) */
    float x[HPD_TP_GROUPS * 4] = {0}, w[HPD_TP_GROUPS * 4], out[HPD_TP_GROUPS];
    const float g[4] = {1e8f, 1.0f, -1e8f, 1.0f};
    for (uint32_t i = 0; i < HPD_TP_GROUPS * 4; i++) {
        x[i] = g[i % 4];
        w[i] = 1.0f;
    }
    hpd_tp_partials(x, w, HPD_TP_GROUPS * 4, 0, HPD_TP_GROUPS, out);
    for (uint32_t i = 0; i < HPD_TP_GROUPS; i++)
        assert_true(out[i] == 1.0f);
    /* a rank's own groups land in its own slots */
    hpd_tp_partials(x + 8, w + 8, HPD_TP_GROUPS * 4, 2, 4, out);
    assert_true(out[0] == 1.0f && out[1] == 1.0f);
}

static void test_nan(void **state)
{
    static float x[K], w[K];
    fill(x, K, 7);
    fill(w, K, 8);
    x[K - 1] = NAN;
    for (uint32_t n = 1; n <= HPD_TP_GROUPS; n *= 2)
        assert_true(isnan(at_tp(x, w, n)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_at_every_degree),
        cmocka_unit_test(test_the_order),
        cmocka_unit_test(test_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
