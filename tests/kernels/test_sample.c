/* Sampling: greedy, determinism of the counter-based draws, top-k, top-p and
 * the distribution of temperature sampling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <math.h>

#include "common/rng.h"
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

/* The sampler's definition written plainly: with top-k or top-p every id
 * sorted by qsort (descending logit, ties by ascending id, -0 equal to +0;
 * else in id order), the mass summed in that order, top-k then top-p's
 * prefix, the draw along it. */
typedef struct {
    float x;
    uint32_t id;
} ref_cand_t;

static int ref_cmp(const void *pa, const void *pb)
{
    const ref_cand_t *a = pa, *b = pb;
    if (a->x != b->x)
        return a->x > b->x ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

static int32_t ref_sample(const float *x, uint32_t vocab, const hpd_sampling_t *p, uint64_t pos)
{
    ref_cand_t *c = malloc(vocab * sizeof(*c));
    const float inv_t = 1.0f / p->temperature;
    float max = -INFINITY, total = 0.0f, cum = 0.0f;
    uint32_t n = vocab;
    for (uint32_t i = 0; i < vocab; i++)
        c[i] = (ref_cand_t){.x = x[i] * inv_t, .id = i};
    if ((p->top_k > 0 && p->top_k < vocab) || p->top_p < 1.0f) /* else in id order */
        qsort(c, vocab, sizeof(*c), ref_cmp);
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;
    for (uint32_t i = 0; i < n; i++)
        max = fmaxf(max, c[i].x);
    for (uint32_t i = 0; i < n; i++)
        total += c[i].x = expf(c[i].x - max);
    if (p->top_p < 1.0f) {
        float kept = 0.0f;
        uint32_t keep = 0;
        while (keep < n && (keep == 0 || kept < p->top_p * total))
            kept += c[keep++].x;
        n = keep, total = kept;
    }
    const float target = hpd_rng_uniform(p->seed, pos) * total;
    int32_t tok = (int32_t)c[n - 1].id;
    for (uint32_t i = 0; i < n; i++) {
        cum += c[i].x;
        if (target < cum) {
            tok = (int32_t)c[i].id;
            break;
        }
    }
    free(c);
    return tok;
}

/* The CPU sampler (a radix sort) gives the definition's token bit for bit:
 * 3000 and 151936 ids, logits with many ties and zeros of both signs, top-k
 * and top-p alone and together */
static void test_same_as_definition(void **state)
{
    const uint32_t vocabs[] = {3000, 151936};
    const float top_ps[] = {1.0f, 0.95f, 0.5f};
    const uint32_t top_ks[] = {0, 1, 7, 2999};
    for (size_t vi = 0; vi < 2; vi++) {
        const uint32_t vocab = vocabs[vi];
        float *x = malloc(vocab * sizeof(float));
        for (uint32_t row = 0; row < (vi == 0 ? 24u : 4u); row++) {
            test_fill(x, vocab, 100 + row, 2.0f);
            for (uint32_t i = 0; i < vocab; i++) {
                if (row % 2 == 1)
                    x[i] = roundf(x[i] * 2.0f) / 2.0f; /* ties */
                if (i % 97 == 3)
                    x[i] = i % 2 ? -0.0f : 0.0f;
            }
            const hpd_sampling_t s = {.temperature = row % 3 == 0 ? 0.7f : 1.2f,
                                      .top_p = top_ps[row % 3],
                                      .top_k = top_ks[row / 3 % 4],
                                      .seed = row};
            const uint64_t pos = 1000 + row;
            int32_t got = -1;
            const hpd_sample_args_t a = {.logits = x, .ld = vocab, .n_rows = 1, .vocab = vocab,
                                         .params = &s, .positions = &pos, .out = &got};
            assert_int_equal(hpd_sample(be, &a), HPD_OK);
            const int32_t want = ref_sample(x, vocab, &s, pos);
            if (got != want)
                fail_msg("vocab %u row %u (t %g, top_p %g, top_k %u): token %d, the definition "
                         "gives %d", vocab, row, s.temperature, s.top_p, s.top_k, got, want);
        }
        free(x);
    }
    /* all equal, zeros of both signs: the ids in ascending order, whatever
     * the sign (a sort that put +0 before -0 draws another id) */
    float z[64];
    for (uint32_t i = 0; i < 64; i++)
        z[i] = i % 2 ? -0.0f : 0.0f;
    for (uint64_t pos = 0; pos < 16; pos++) {
        const hpd_sampling_t s = {.temperature = 1.0f, .top_p = 0.99f, .seed = 5};
        int32_t got = -1;
        const hpd_sample_args_t a = {.logits = z, .ld = 64, .n_rows = 1, .vocab = 64,
                                     .params = &s, .positions = &pos, .out = &got};
        assert_int_equal(hpd_sample(be, &a), HPD_OK);
        assert_int_equal(got, ref_sample(z, 64, &s, pos));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draw_on_a_boundary),
        cmocka_unit_test(test_greedy_and_top_k_1),
        cmocka_unit_test(test_deterministic_by_seed_and_position),
        cmocka_unit_test(test_top_k_and_top_p_restrict),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_same_as_definition),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
