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

/* The CPU backend's op: each token as hpd_moe_route_token, the slots as
 * hpd_moe_number; then gather and moe_combine on that routing against
 * their definitions written plainly (the same roundings, in order) */
static void test_op_route_gather_combine(void **state)
{
    enum { T = 37, E = 16, K = 4, LD = 19, D = 70, S = T * K };
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 2};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_create(&bp, &be), HPD_OK);
    static float logits[T * LD], w[S], wref[S], h[T * D], rows[S * D], x[T * D], xref[T * D];
    static float shared[T * D], gate[T * 2];
    static uint32_t ids[S], idsref[S], slots[S], slotsref[S], idx[S], idxref[S];
    static uint32_t first[E + 1], firstref[E + 1];
    for (uint32_t i = 0; i < T * LD; i++)
        logits[i] = 4.0f * (hpd_u32_to_unit(hpd_philox4x32(3, i, 1).v[0]) - 0.5f);
    for (uint32_t i = 0; i < T * D; i++) {
        h[i] = hpd_u32_to_unit(hpd_philox4x32(4, i, 1).v[0]) - 0.5f;
        x[i] = xref[i] = hpd_u32_to_unit(hpd_philox4x32(5, i, 1).v[0]);
        shared[i] = hpd_u32_to_unit(hpd_philox4x32(6, i, 1).v[0]) - 0.5f;
    }
    for (uint32_t i = 0; i < T * 2; i++)
        gate[i] = hpd_u32_to_unit(hpd_philox4x32(7, i, 1).v[0]) - 0.5f;
    const hpd_moe_route_args_t ra = {.logits = logits, .ld = LD, .n_tokens = T, .n_experts = E,
                                     .top_k = K, .norm = true, .ids = ids, .weights = w,
                                     .slots = slots, .idx = idx, .first = first};
    assert_int_equal(hpd_moe_route(be, &ra), HPD_OK);
    for (uint32_t t = 0; t < T; t++)
        hpd_moe_route_token(logits + t * LD, E, K, true, idsref + t * K, wref + t * K);
    hpd_moe_number(idsref, T, K, E, slotsref, idxref, firstref);
    assert_memory_equal(ids, idsref, sizeof(ids));
    assert_memory_equal(w, wref, sizeof(w));
    assert_memory_equal(slots, slotsref, sizeof(slots));
    assert_memory_equal(idx, idxref, sizeof(idx));
    assert_memory_equal(first, firstref, sizeof(first));
    /* gather: slot s takes its token's row */
    const hpd_gather_args_t g = {.src = h, .ld_src = D, .idx_dev = idx, .n = S, .dim = D,
                                 .dst = rows, .ld_dst = D};
    assert_int_equal(hpd_gather(be, &g), HPD_OK);
    for (uint32_t s = 0; s < S; s++)
        assert_memory_equal(rows + s * D, h + idx[s] * D, D * sizeof(float));
    /* combine: x += sum_j w_j * row_j (j in order) + sigmoid(gate) * shared */
    const hpd_moe_combine_args_t c = {.x = x, .ldx = D, .rows = rows, .ld_rows = D,
                                      .slots = slots, .weights = w, .top_k = K,
                                      .shared = shared, .ld_shared = D, .gate = gate + 1,
                                      .ld_gate = 2, .n_tokens = T, .dim = D};
    assert_int_equal(hpd_moe_combine(be, &c), HPD_OK);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (uint32_t j = 0; j < K; j++)
                acc = acc + w[t * K + j] * rows[slots[t * K + j] * D + d];
            acc = acc + hpd_sigmoidf(gate[t * 2 + 1]) * shared[t * D + d];
            xref[t * D + d] = xref[t * D + d] + acc;
        }
    assert_memory_equal(x, xref, sizeof(x));
    hpd_backend_destroy(be);
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
        cmocka_unit_test(test_op_route_gather_combine),
        cmocka_unit_test(test_op_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
