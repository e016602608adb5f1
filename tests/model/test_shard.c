/* The tensor-parallel shard map (model/shard.h) on the released shapes:
 * every split covers its dimension once, in contiguous ranges; KV heads
 * replicated in groups (0,0,1,1), each rank's query heads inside its KV
 * head's group; what a degree cannot split is refused by layer and
 * numbers; and between a prefill and a decode node of any two degrees,
 * every KV, key and value head a decode rank holds is written by exactly
 * one prefill rank that holds it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "model/shard.h"

/* Qwen3-Next-80B-A3B's shapes (config.json): 48 layers, a full-attention
 * layer every 4th, every layer MoE. */
static hpd_model_config_t next80b(void)
{
    hpd_model_config_t c = {0};
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.n_layers = 48;
    c.n_full_layers = 12;
    c.n_linear_layers = 36;
    c.n_heads = 16;
    c.n_kv_heads = 2;
    c.head_dim = 256;
    c.lin_n_k_heads = 16;
    c.lin_n_v_heads = 32;
    c.lin_k_dim = 128;
    c.lin_v_dim = 128;
    c.n_experts = 512;
    c.n_moe_layers = 48;
    c.moe_inter = 512;
    c.shared_inter = 512;
    return c;
}

static void assert_covers(const hpd_range_t *r, uint32_t tp, uint32_t n)
{
    uint32_t at = 0;
    for (uint32_t i = 0; i < tp; i++) {
        assert_int_equal(r[i].begin, at);
        assert_true(r[i].end > r[i].begin);
        at = r[i].end;
    }
    assert_int_equal(at, n);
}

static void test_splits(void **state)
{
    const hpd_model_config_t c = next80b();
    char why[160];
    for (uint32_t tp = 1; tp <= HPD_TP_MAX; tp *= 2) {
        hpd_range_t q[HPD_TP_MAX], k[HPD_TP_MAX], v[HPD_TP_MAX], e[HPD_TP_MAX], sh[HPD_TP_MAX],
            vo[HPD_TP_MAX];
        for (uint32_t r = 0; r < tp; r++) {
            hpd_shard_t s;
            if (hpd_shard_plan(&c, tp, r, &s, why, sizeof(why)) != HPD_OK)
                fail_msg("tp %u rank %u: %s", tp, r, why);
            q[r] = s.q_heads;
            k[r] = s.k_heads;
            v[r] = s.v_heads;
            e[r] = s.expert;
            sh[r] = s.shared;
            vo[r] = s.vocab;
            /* KV heads: split while there are enough, then one each, in groups */
            assert_int_equal(s.kv_replicated, tp > 2);
            if (tp <= 2) {
                assert_int_equal(s.kv_heads.begin, r * 2 / tp);
                assert_int_equal(s.kv_heads.end, (r + 1) * 2 / tp);
            } else {
                assert_int_equal(s.kv_heads.begin, r * 2 / tp); /* 0,0,1,1 at TP 4 */
                assert_int_equal(s.kv_heads.end, s.kv_heads.begin + 1);
            }
            /* its query heads belong to its KV heads' groups of 8 */
            assert_true(s.q_heads.begin / 8 >= s.kv_heads.begin);
            assert_true((s.q_heads.end - 1) / 8 < s.kv_heads.end);
            /* its value heads are its key heads' groups of 2 */
            assert_int_equal(s.v_heads.begin, 2 * s.k_heads.begin);
            assert_int_equal(s.v_heads.end, 2 * s.k_heads.end);
            assert_int_equal(s.mlp.begin, s.mlp.end); /* no dense layer */
        }
        assert_covers(q, tp, 16);
        assert_covers(k, tp, 16);
        assert_covers(v, tp, 32);
        assert_covers(e, tp, 512);
        assert_covers(sh, tp, 512);
        assert_covers(vo, tp, 151936);
    }
    /* TP 4's KV heads, never 0,1,0,1 */
    hpd_shard_t s;
    static const uint32_t want[4] = {0, 0, 1, 1};
    for (uint32_t r = 0; r < 4; r++) {
        assert_int_equal(hpd_shard_plan(&c, 4, r, &s, why, sizeof(why)), HPD_OK);
        assert_int_equal(s.kv_heads.begin, want[r]);
    }
    /* a vocabulary that does not divide: contiguous ranges all the same */
    hpd_model_config_t odd = c;
    odd.vocab_size = 1001;
    hpd_range_t vo[4];
    for (uint32_t r = 0; r < 4; r++) {
        assert_int_equal(hpd_shard_plan(&odd, 4, r, &s, why, sizeof(why)), HPD_OK);
        vo[r] = s.vocab;
    }
    assert_covers(vo, 4, 1001);
}

static void refused(const hpd_model_config_t *c, uint32_t tp, uint32_t rank, const char *want)
{
    hpd_shard_t s;
    char why[160] = "";
    assert_int_equal(hpd_shard_plan(c, tp, rank, &s, why, sizeof(why)), HPD_ERR_INVALID_ARG);
    assert_string_equal(why, want);
    if (rank == 0)
        assert_false(hpd_shard_tp_ok(c, tp, why, sizeof(why)));
}

static void test_refusals(void **state)
{
    hpd_model_config_t c = next80b();
    refused(&c, 0, 0, "tp 0: expected 1 to 8");
    refused(&c, 9, 0, "tp 9: expected 1 to 8");
    refused(&c, 4, 4, "rank 4: expected below tp 4");
    refused(&c, 3, 0, "tp 3 does not divide the full-attention layers' query heads, 16");
    /* everything divides but the canonical sum's 8 groups */
    hpd_model_config_t six = c;
    six.n_heads = six.n_kv_heads = six.lin_n_k_heads = 6;
    six.lin_n_v_heads = 12;
    six.moe_inter = six.shared_inter = 6 * 64;
    refused(&six, 6, 0, "tp 6 does not divide the 8 groups of the canonical sum (expected 1, 2, "
                        "4 or 8)");
    /* 12 query heads over 4 KV heads at TP 6: above the KV heads, not a multiple */
    hpd_model_config_t a = c;
    a.n_heads = 12;
    a.n_kv_heads = 4;
    refused(&a, 6, 0, "tp 6 is above the full-attention layers' 4 KV heads and not a multiple "
                      "of them (each KV head's query heads on whole ranks)");
    a.n_kv_heads = 6;
    refused(&a, 4, 0, "tp 4 does not divide the full-attention layers' KV heads, 6");
    hpd_model_config_t g = c;
    g.lin_n_k_heads = 12;
    g.lin_n_v_heads = 24;
    refused(&g, 8, 0, "tp 8 does not divide the GDN layers' key heads, 12");
    g.lin_n_k_heads = 16;
    g.lin_n_v_heads = 20;
    refused(&g, 8, 0, "tp 8 does not divide the GDN layers' value heads, 20");
    hpd_model_config_t m = c;
    m.moe_inter = 100;
    refused(&m, 8, 0, "tp 8 does not divide the experts' intermediate size 100");
    m.moe_inter = 512;
    m.shared_inter = 36;
    refused(&m, 8, 0, "tp 8 does not divide the shared expert's intermediate size 36");
    hpd_model_config_t d = c; /* a dense model: every layer an MLP */
    d.n_moe_layers = 0;
    d.n_experts = 0;
    d.intermediate_size = 5004;
    refused(&d, 8, 0, "tp 8 does not divide the dense MLP's intermediate size 5004");
    assert_true(hpd_shard_tp_ok(&d, 4, (char[160]){0}, 160));
    /* a model of GDN layers only: attention's heads are not asked */
    hpd_model_config_t l = c;
    l.n_full_layers = 0;
    l.n_heads = 3;
    assert_true(hpd_shard_tp_ok(&l, 8, (char[160]){0}, 160));
}

/* Between any two degrees, each head a decode rank holds comes from exactly
 * one prefill rank, which holds it. */
static void test_prefill_to_decode(void **state)
{
    const hpd_model_config_t c = next80b();
    char why[160];
    for (uint32_t tp_p = 1; tp_p <= HPD_TP_MAX; tp_p *= 2)
        for (uint32_t tp_d = 1; tp_d <= HPD_TP_MAX; tp_d *= 2)
            for (uint32_t d = 0; d < tp_d; d++) {
                hpd_shard_t sd;
                assert_int_equal(hpd_shard_plan(&c, tp_d, d, &sd, why, sizeof(why)), HPD_OK);
                uint32_t kv[2] = {0}, k[16] = {0}, v[32] = {0};
                for (uint32_t p = 0; p < tp_p; p++) {
                    hpd_shard_t sp;
                    assert_int_equal(hpd_shard_plan(&c, tp_p, p, &sp, why, sizeof(why)), HPD_OK);
                    const hpd_range_t a = hpd_shard_kv_send(&c, tp_p, p, tp_d, d),
                                      b = hpd_shard_k_send(&c, tp_p, p, tp_d, d),
                                      e = hpd_shard_v_send(&c, tp_p, p, tp_d, d);
                    for (uint32_t h = a.begin; h < a.end; h++) {
                        assert_true(h >= sp.kv_heads.begin && h < sp.kv_heads.end);
                        kv[h]++;
                    }
                    for (uint32_t h = b.begin; h < b.end; h++)
                        k[h]++;
                    for (uint32_t h = e.begin; h < e.end; h++)
                        v[h]++;
                }
                for (uint32_t h = 0; h < 2; h++)
                    if (kv[h] != (h >= sd.kv_heads.begin && h < sd.kv_heads.end))
                        fail_msg("P TP %u -> D TP %u, decode rank %u: KV head %u written %u "
                                 "times", tp_p, tp_d, d, h, kv[h]);
                for (uint32_t h = 0; h < 16; h++)
                    assert_int_equal(k[h], h >= sd.k_heads.begin && h < sd.k_heads.end);
                for (uint32_t h = 0; h < 32; h++)
                    assert_int_equal(v[h], h >= sd.v_heads.begin && h < sd.v_heads.end);
            }
    /* the worked examples (docs/tensor_parallel.md): P TP 4 -> D TP 1,
     * heads 0 and 1 from prefill ranks 0 and 2; P TP 1 -> D TP 4, head 0
     * to decode ranks 0 and 1, head 1 to 2 and 3 */
    static const uint32_t from4[4][2] = {{0, 1}, {0, 0}, {1, 2}, {1, 1}}; /* empty: {h, h} */
    for (uint32_t p = 0; p < 4; p++) {
        const hpd_range_t r = hpd_shard_kv_send(&c, 4, p, 1, 0);
        assert_int_equal(r.begin, from4[p][0]);
        assert_int_equal(r.end, from4[p][1]);
    }
    for (uint32_t d = 0; d < 4; d++) {
        const hpd_range_t r = hpd_shard_kv_send(&c, 1, 0, 4, d);
        assert_int_equal(r.begin, d / 2);
        assert_int_equal(r.end, d / 2 + 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_prefill_to_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
