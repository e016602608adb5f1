/* What each prefill rank sends each decode rank (node/tp_plan.h), for
 * every pair of degrees 1, 2, 4 and 8: each KV head of each decode rank
 * comes from exactly one piece, out of a prefill rank that holds that
 * global head; each float of each decode rank's GDN layer state is written
 * by exactly one run, with the value the whole model's state holds there.
 * The ranks' states are sliced here from a whole state by the shard map
 * (value heads' recurrent rows; the q, k and v segments of the conv state
 * each by its own heads), not by the plan's arithmetic. Degrees a model
 * cannot run at are refused naming the side. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "node/tp_plan.h"
#include "tests/test_helpers.h"

static char root[256];

/* The value of a float of the whole layer state: its index there. */
typedef struct {
    uint32_t nk, nv, dk, dv, kc; /* whole model; kc: the conv state's length */
} dims_t;

/* Rank s's layer state, sliced out of the whole one (values: whole indices + 1). */
static float *slice(const dims_t *m, const hpd_shard_t *s, size_t *n_p)
{
    const uint32_t k0 = s->k_heads.begin, nk = s->k_heads.end - k0;
    const uint32_t v0 = s->v_heads.begin, nv = s->v_heads.end - v0;
    const size_t whole_rec = (size_t)m->nv * m->dk * m->dv;
    const size_t n = (size_t)nv * m->dk * m->dv + ((size_t)2 * nk * m->dk + nv * m->dv) * m->kc;
    float *out = malloc(n * sizeof(float)), *o = out;
    for (size_t i = 0; i < (size_t)nv * m->dk * m->dv; i++) /* rows of its value heads */
        *o++ = (float)((size_t)v0 * m->dk * m->dv + i + 1);
    const size_t seg_start[3] = {0, (size_t)m->nk * m->dk, (size_t)2 * m->nk * m->dk};
    const size_t first[3] = {(size_t)k0 * m->dk, (size_t)k0 * m->dk, (size_t)v0 * m->dv};
    const size_t count[3] = {(size_t)nk * m->dk, (size_t)nk * m->dk, (size_t)nv * m->dv};
    for (int seg = 0; seg < 3; seg++)
        for (size_t ch = 0; ch < count[seg]; ch++)
            for (uint32_t t = 0; t < m->kc; t++)
                *o++ = (float)(whole_rec + (seg_start[seg] + first[seg] + ch) * m->kc + t + 1);
    assert_int_equal(o - out, n);
    *n_p = n;
    return out;
}

static void check_pair(const hpd_model_config_t *c, uint32_t p, uint32_t d)
{
    hpd_tp_plan_t plan;
    hpd_shard_t sp[HPD_TP_MAX], sd[HPD_TP_MAX];
    char why[256];
    const dims_t m = {c->lin_n_k_heads, c->lin_n_v_heads, c->lin_k_dim, c->lin_v_dim,
                      c->conv_kernel - 1};

    assert_int_equal(hpd_tp_plan(c, p, d, &plan, why, sizeof(why)), HPD_OK);
    for (uint32_t r = 0; r < p; r++)
        assert_int_equal(hpd_shard_plan(c, p, r, &sp[r], why, sizeof(why)), HPD_OK);
    for (uint32_t r = 0; r < d; r++)
        assert_int_equal(hpd_shard_plan(c, d, r, &sd[r], why, sizeof(why)), HPD_OK);

    /* KV heads */
    for (uint32_t j = 0; j < d; j++) {
        const uint32_t heads = sd[j].kv_heads.end - sd[j].kv_heads.begin;
        uint32_t got[64] = {0};
        assert_int_equal(heads, plan.dst_kv_heads);
        for (uint32_t x = 0; x < plan.n_kv; x++) {
            const hpd_tp_kv_piece_t *k = &plan.kv[x];
            if (k->dst_rank != j)
                continue;
            const uint32_t i = k->src_rank;
            assert_true(i < p);
            assert_true(k->heads > 0);
            assert_true(k->src_head + k->heads <= sp[i].kv_heads.end - sp[i].kv_heads.begin);
            assert_true(k->dst_head + k->heads <= heads);
            for (uint32_t h = 0; h < k->heads; h++) {
                if (sp[i].kv_heads.begin + k->src_head + h != sd[j].kv_heads.begin + k->dst_head + h)
                    fail_msg("tp %u -> %u: decode rank %u's head %u from prefill rank %u's "
                             "head %u: another head", p, d, j, k->dst_head + h, i,
                             k->src_head + h);
                got[k->dst_head + h]++;
            }
        }
        for (uint32_t h = 0; h < heads; h++)
            if (got[h] != 1)
                fail_msg("tp %u -> %u: decode rank %u's KV head %u written %u times", p, d, j, h,
                         got[h]);
    }

    /* GDN state */
    float *src[HPD_TP_MAX];
    for (uint32_t i = 0; i < p; i++) {
        size_t n;
        src[i] = slice(&m, &sp[i], &n);
        assert_int_equal(n * 4, plan.src_state_bytes);
    }
    for (uint32_t j = 0; j < d; j++) {
        size_t n;
        float *want = slice(&m, &sd[j], &n);
        assert_int_equal(n * 4, plan.dst_state_bytes);
        float *got = calloc(n, sizeof(float));
        uint8_t *times = calloc(n, 1);
        for (uint32_t x = 0; x < plan.n_state; x++) {
            const hpd_tp_state_run_t *r = &plan.state[x];
            if (r->dst_rank != j)
                continue;
            assert_true(r->src_rank < p);
            assert_true(r->bytes % 4 == 0 && r->src_off % 4 == 0 && r->dst_off % 4 == 0);
            assert_true(r->src_off + r->bytes <= plan.src_state_bytes);
            assert_true(r->dst_off + r->bytes <= plan.dst_state_bytes);
            memcpy((uint8_t *)got + r->dst_off, (uint8_t *)src[r->src_rank] + r->src_off,
                   r->bytes);
            for (uint64_t f = r->dst_off / 4; f < (r->dst_off + r->bytes) / 4; f++)
                times[f]++;
        }
        for (size_t f = 0; f < n; f++) {
            if (times[f] != 1)
                fail_msg("tp %u -> %u: decode rank %u's state float %zu written %u times", p, d,
                         j, f, times[f]);
            if (got[f] != want[f])
                fail_msg("tp %u -> %u: decode rank %u's state float %zu is whole float %g, "
                         "expected %g", p, d, j, f, got[f] - 1, want[f] - 1);
        }
        free(want), free(got), free(times);
    }
    for (uint32_t i = 0; i < p; i++)
        free(src[i]);
    if (p == d) /* rank to rank: the whole state in one run each */
        assert_int_equal(plan.n_state, d);
}

static void load(const char *name, const char *args, hpd_model_config_t *c)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    assert_int_equal(test_mkmodel(dir, args), 0);
    assert_int_equal(hpd_model_config_load(dir, c), HPD_OK);
}

/* 2 KV heads (replicated from TP 4), 8 key heads over 16 value heads */
static void test_every_pair(void **state)
{
    (void)state;
    hpd_model_config_t c;
    load("kv2", "--hidden 64 --layers 4 --full-interval 2 --intermediate 64 --vocab 100 "
                "--heads 8 --kv-heads 2 --head-dim 16 --lin-k-heads 8 --lin-v-heads 16 "
                "--lin-k-dim 8 --lin-v-dim 4 --seed 1", &c);
    for (uint32_t p = 1; p <= HPD_TP_MAX; p *= 2)
        for (uint32_t d = 1; d <= HPD_TP_MAX; d *= 2)
            check_pair(&c, p, d);
}

/* 8 KV heads: split at every degree; value heads as many as key heads */
static void test_split_heads(void **state)
{
    (void)state;
    hpd_model_config_t c;
    load("kv8", "--hidden 64 --layers 3 --full-interval 3 --intermediate 64 --vocab 100 "
                "--heads 8 --kv-heads 8 --head-dim 16 --lin-k-heads 8 --lin-v-heads 8 "
                "--lin-k-dim 4 --lin-v-dim 8 --seed 2", &c);
    for (uint32_t p = 1; p <= HPD_TP_MAX; p *= 2)
        for (uint32_t d = 1; d <= HPD_TP_MAX; d *= 2)
            check_pair(&c, p, d);
}

static void test_refused(void **state)
{
    (void)state;
    hpd_model_config_t c;
    hpd_tp_plan_t plan;
    char why[256];
    load("kv2b", "--hidden 64 --layers 4 --full-interval 2 --intermediate 64 --vocab 100 "
                 "--heads 4 --kv-heads 2 --head-dim 16 --lin-k-heads 4 --lin-v-heads 8 "
                 "--lin-k-dim 8 --lin-v-dim 4 --seed 1", &c);
    assert_int_equal(hpd_tp_plan(&c, 2, 8, &plan, why, sizeof(why)), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(why, "the decode side at tp 8"));
    assert_int_equal(hpd_tp_plan(&c, 3, 1, &plan, why, sizeof(why)), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(why, "the prefill side at tp 3"));
    assert_int_equal(hpd_tp_plan(&c, 16, 1, &plan, why, sizeof(why)), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_tp_plan(&c, 4, 2, &plan, why, sizeof(why)), HPD_OK);
}

int main(void)
{
    test_tmpdir(root, sizeof(root), "tp_plan");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_pair),
        cmocka_unit_test(test_split_heads),
        cmocka_unit_test(test_refused),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0)
        test_rmtree(root);
    return rc;
}
