/* The mixture-of-experts router (kernels/moe_route.h) against a float64 reference
 * of transformers' softmax / top-k / renormalisation, with ties going to the
 * lowest expert id and the experts returned in ascending id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/moe_route.h"

static void test_against_float64(void **state)
{
    enum { E = 64, K = 8 };
    for (uint64_t seed = 1; seed <= 50; seed++)
        for (int norm = 0; norm < 2; norm++) {
            float logits[E], w[K];
            uint32_t ids[K];
            double p[E], max = -INFINITY, sum = 0;
            for (uint32_t i = 0; i < E; i++) {
                logits[i] = 8.0f * (hpd_u32_to_unit(hpd_philox4x32(seed, i, 9).v[0]) - 0.5f);
                max = fmax(max, logits[i]);
            }
            for (uint32_t i = 0; i < E; i++)
                sum += p[i] = exp((double)logits[i] - max);
            hpd_moe_route_token(logits, E, K, norm, ids, w);
            /* the K largest, ascending ids */
            double top = 0;
            for (uint32_t j = 0; j < K; j++) {
                if (j > 0)
                    assert_true(ids[j] > ids[j - 1]);
                uint32_t larger = 0;
                for (uint32_t i = 0; i < E; i++)
                    larger += p[i] > p[ids[j]];
                assert_true(larger < K);
                top += p[ids[j]];
            }
            for (uint32_t j = 0; j < K; j++) {
                const double want = p[ids[j]] / (norm ? top : sum);
                if (!(fabs(w[j] - want) <= 1e-6 * want))
                    fail_msg("seed %llu norm %d: weight %u %.9g, want %.9g",
                             (unsigned long long)seed, norm, j, w[j], want);
            }
        }
}

static void test_ties_lowest_id(void **state)
{
    const float flat[8] = {0};
    const float some[6] = {1, 5, 5, 0, 5, 5};
    uint32_t ids[4];
    float w[4];
    hpd_moe_route_token(flat, 8, 3, true, ids, w);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 2);
    for (int j = 0; j < 3; j++)
        assert_true(fabsf(w[j] - 1.0f / 3.0f) <= 1e-7f);
    hpd_moe_route_token(flat, 8, 3, false, ids, w);
    assert_true(w[0] == 0.125f && w[1] == 0.125f && w[2] == 0.125f);
    hpd_moe_route_token(some, 6, 3, true, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 4);
    /* all of them: every id once */
    hpd_moe_route_token(some, 6, 4, true, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[3], 5);
}

/* The batch's slots expert by expert, tokens in order within an expert */
static void test_numbering(void **state)
{
    enum { T = 5, K = 2, E = 6 };
    const uint32_t ids[T * K] = {0, 3, 3, 5, 0, 3, 1, 5, 3, 4};
    uint32_t slots[T * K], idx[T * K], first[E + 1];
    hpd_moe_number(ids, T, K, E, slots, idx, first);
    /* expert 0: tokens 0, 2; 1: 3; 2: none; 3: 0, 1, 2, 4; 4: 4; 5: 1, 3 */
    const uint32_t want_first[E + 1] = {0, 2, 3, 3, 7, 8, 10};
    const uint32_t want_idx[T * K] = {0, 2, 3, 0, 1, 2, 4, 4, 1, 3};
    for (uint32_t x = 0; x <= E; x++)
        assert_int_equal(first[x], want_first[x]);
    for (uint32_t s = 0; s < T * K; s++)
        assert_int_equal(idx[s], want_idx[s]);
    for (uint32_t i = 0; i < T * K; i++) { /* each (token, expert) its own slot */
        assert_int_equal(idx[slots[i]], i / K);
        assert_true(slots[i] >= first[ids[i]] && slots[i] < first[ids[i] + 1]);
    }
}

/* The backends' op refuses what its kernels cannot take, naming it, and
 * writes nothing */
static void test_op_refuses(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu"};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_create(&bp, &be), HPD_OK);
    float logits[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint32_t ids[40], slots[40], idx[40], first[2000];
    float w[40];
    const struct {
        uint32_t ld, E, K;
    } bad[] = {{8, 0, 1}, {8, 4, 5}, {2000, 1025, 2}, {8, 8, 33}, {3, 4, 2}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(ids, 0xee, sizeof(ids));
        const hpd_moe_route_args_t a = {.logits = logits, .ld = bad[i].ld, .n_tokens = 1,
                                        .n_experts = bad[i].E, .top_k = bad[i].K, .ids = ids,
                                        .weights = w, .slots = slots, .idx = idx, .first = first};
        assert_int_equal(hpd_moe_route(be, &a), HPD_ERR_INVALID_ARG);
        assert_int_equal(ids[0], 0xeeeeeeeeu);
    }
    /* and a grouped GEMM without groups or rows a group */
    hpd_gemm_grouped_args_t g = {.g = {.m = 4, .n = 1, .k = 1}, .first = first, .n_groups = 0,
                                 .max_rows = 4};
    assert_int_equal(hpd_gemm_grouped(be, &g), HPD_ERR_INVALID_ARG);
    g.n_groups = 2, g.max_rows = 0;
    assert_int_equal(hpd_gemm_grouped(be, &g), HPD_ERR_INVALID_ARG);
    hpd_backend_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_float64),
        cmocka_unit_test(test_ties_lowest_id),
        cmocka_unit_test(test_numbering),
        cmocka_unit_test(test_op_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
