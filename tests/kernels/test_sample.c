/* Sampling: greedy, determinism of the counter-based draws, top-k, top-p and
 * the distribution of temperature sampling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/backend.h"
#include "tests/test_helpers.h"

enum { V = 50 };
static hpd_backend_t *be;
static float logits[V];

static int setup(void **state)
{
    hpd_backend_params_t p = {.device = "cpu", .n_threads = 1};
    test_fill(logits, V, 42, 1.5f);
    return hpd_backend_cpu_create(&p, &be) == HPD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    hpd_backend_destroy(be);
    return 0;
}

static int32_t draw(hpd_sampling_t s, uint64_t pos)
{
    int32_t tok = -1;
    hpd_sample_args_t a = {.logits = logits,
                           .ld = V,
                           .n_rows = 1,
                           .vocab = V,
                           .params = &s,
                           .positions = &pos,
                           .out = &tok};
    assert_int_equal(hpd_sample(be, &a), HPD_OK);
    assert_true(tok >= 0 && tok < V);
    return tok;
}

static int argmax(void)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

static void test_greedy_and_top_k_1(void **state)
{
    hpd_sampling_t greedy = {.top_p = 1}, k1 = {1.0f, 1, 1, 9};
    assert_int_equal(draw(greedy, 3), argmax());
    for (uint64_t pos = 0; pos < 20; pos++)
        assert_int_equal(draw(k1, pos), argmax());
}

static void test_deterministic_by_seed_and_position(void **state)
{
    hpd_sampling_t s = {.temperature = 1.0f, .top_p = 0.9f, .top_k = 20, .seed = 1234};
    int differs_by_pos = 0, differs_by_seed = 0;
    for (uint64_t pos = 0; pos < 50; pos++) {
        assert_int_equal(draw(s, pos), draw(s, pos));
        differs_by_pos += draw(s, pos) != draw(s, pos + 1);
        hpd_sampling_t t = s;
        t.seed++;
        differs_by_seed += draw(s, pos) != draw(t, pos);
    }
    assert_true(differs_by_pos > 10);
    assert_true(differs_by_seed > 10);
    /* rows of a batch draw as they do alone */
    float two[2 * V];
    memcpy(two, logits, sizeof(logits));
    memcpy(two + V, logits, sizeof(logits));
    hpd_sampling_t ps[2] = {s, {.temperature = 0.7f, .top_p = 1, .seed = 5}};
    uint64_t pos[2] = {7, 8};
    int32_t out[2];
    hpd_sample_args_t a = {.logits = two,
                           .ld = V,
                           .n_rows = 2,
                           .vocab = V,
                           .params = ps,
                           .positions = pos,
                           .out = out};
    assert_int_equal(hpd_sample(be, &a), HPD_OK);
    assert_int_equal(out[0], draw(ps[0], 7));
    assert_int_equal(out[1], draw(ps[1], 8));
}

static void test_top_k_and_top_p_restrict(void **state)
{
    int order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 0; i < V; i++) /* indices by descending logit */
        for (int j = i + 1; j < V; j++)
            if (logits[order[j]] > logits[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    hpd_sampling_t k5 = {.temperature = 2.0f, .top_p = 1, .top_k = 5, .seed = 1};
    for (uint64_t pos = 0; pos < 300; pos++) {
        int32_t tok = draw(k5, pos), ok = 0;
        for (int i = 0; i < 5; i++)
            ok |= tok == order[i];
        assert_true(ok);
    }
    /* nucleus: the smallest prefix of sorted probabilities reaching top_p */
    double p[V], sum = 0, mx = logits[order[0]];
    for (int i = 0; i < V; i++)
        sum += (p[i] = exp(logits[order[i]] - mx));
    int keep = 0;
    for (double cum = 0; keep < V && cum < 0.5 * sum;)
        cum += p[keep++];
    hpd_sampling_t tp = {.temperature = 1.0f, .top_p = 0.5f, .seed = 2};
    for (uint64_t pos = 0; pos < 300; pos++) {
        int32_t tok = draw(tp, pos), ok = 0;
        for (int i = 0; i < keep; i++)
            ok |= tok == order[i];
        assert_true(ok);
    }
}

/* Frequencies over many positions follow softmax(logits / T). */
static void test_temperature_distribution(void **state)
{
    enum { N = 40000 };
    hpd_sampling_t s = {.temperature = 0.8f, .top_p = 1, .seed = 99};
    int count[V] = {0};
    double p[V], sum = 0, mx = -1e30;
    for (int i = 0; i < V; i++)
        mx = logits[i] / 0.8 > mx ? logits[i] / 0.8 : mx;
    for (int i = 0; i < V; i++)
        sum += (p[i] = exp(logits[i] / 0.8 - mx));
    for (uint64_t pos = 0; pos < N; pos++)
        count[draw(s, pos)]++;
    for (int i = 0; i < V; i++) {
        double expect = N * p[i] / sum, sd = sqrt(expect) + 1;
        assert_true(fabs(count[i] - expect) < 5 * sd);
    }
}

/* The draw's boundary rule: token i is drawn when cum_{i-1} <= u * total <
 * cum_i. Two equally likely tokens and a position whose draw u is exactly
 * 0.5 (found by search: u takes 2^24 values) land on the boundary: token 1. */
static void test_draw_on_a_boundary(void **state)
{
    const uint64_t seed = 3;
    uint64_t pos = 0;
    while (hpd_rng_uniform(seed, pos) != 0.5f)
        pos++;
    const float two[2] = {0.25f, 0.25f};
    const hpd_sampling_t s = {.temperature = 1.0f, .top_p = 1.0f, .seed = seed};
    int32_t tok = -1;
    hpd_sample_args_t a = {.logits = two,
                           .ld = 2,
                           .n_rows = 1,
                           .vocab = 2,
                           .params = &s,
                           .positions = &pos,
                           .out = &tok};
    assert_int_equal(hpd_sample(be, &a), HPD_OK);
    assert_int_equal(tok, 1);
    /* and just below it, token 0 */
    pos = 0;
    while (hpd_rng_uniform(seed, pos) >= 0.5f)
        pos++;
    assert_int_equal(hpd_sample(be, &a), HPD_OK);
    assert_int_equal(tok, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draw_on_a_boundary),
        cmocka_unit_test(test_greedy_and_top_k_1),
        cmocka_unit_test(test_deterministic_by_seed_and_position),
        cmocka_unit_test(test_top_k_and_top_p_restrict),
        cmocka_unit_test(test_temperature_distribution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
