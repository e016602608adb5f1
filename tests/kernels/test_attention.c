/* Paged attention equals a naive dense attention and the defined sequence of
 * the determinism contract (bit for bit), and its results are bit-identical
 * whatever the block size, pack size and page order. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/simd.h"
#include "tests/test_helpers.h"

enum { NH = 4, NKV = 2, HD = 32, NLAYERS = 3, LAYER = 1 };

typedef struct {
    uint32_t B, P;
    hpd_kv_order_t order;
} layout_case_t;

/* Stores T tokens of K/V (T x NKV x HD) for layer LAYER into a fresh pool of
 * the given layout (pages handed out in a scrambled order), then attends the
 * last Tq tokens as queries. out: [Tq][NH][HD]. */
static void paged_hd(hpd_backend_t *be, layout_case_t lc, uint32_t hd, uint32_t T, uint32_t Tq,
                     const float *k, const float *v, const float *q, float *out)
{
    hpd_kv_layout_t l = {.block_size = lc.B,
                         .pack_size = lc.P,
                         .order = lc.order,
                         .dtype = HPD_DTYPE_F32,
                         .n_layers = NLAYERS,
                         .n_kv_heads = NKV,
                         .head_dim = hd};
    const uint32_t n_blocks = (T + lc.B - 1) / lc.B, n_pages = 3 * n_blocks + 5;
    float *pool = calloc(n_pages * hpd_kv_layout_page_elems(&l), sizeof(float));
    uint32_t *table = malloc(n_blocks * sizeof(uint32_t));
    const uint32_t *tables[1] = {table};

    for (uint32_t i = 0; i < n_blocks; i++)
        table[i] = n_pages - 1 - 3 * i; /* distinct pages, in reverse order */
    hpd_paged_kv_t kv = {
        .layout = &l, .pool = pool, .member = LAYER % lc.P, .block_tables = tables};
    /* prefix as one sequence, then the query rows as a second store */
    hpd_seq_t all = {.n_tokens = T};
    hpd_kv_store_args_t st = {.kv = kv,
                              .k = {.p = (float *)k, .ld = NKV * hd, .hs = hd},
                              .v = {.p = (float *)v, .ld = NKV * hd, .hs = hd},
                              .seqs = &all,
                              .n_seqs = 1};
    assert_int_equal(hpd_kv_store(be, &st), HPD_OK);
    hpd_seq_t qs = {.n_tokens = Tq, .start_pos = T - Tq};
    hpd_attention_args_t a = {.kv = kv,
                              .q = {.p = (float *)q, .ld = NH * hd, .hs = hd},
                              .out = {.p = out, .ld = NH * hd, .hs = hd},
                              .n_heads = NH,
                              .scale = 1.0f / sqrtf((float)hd),
                              .seqs = &qs,
                              .n_seqs = 1};
    assert_int_equal(hpd_attention(be, &a), HPD_OK);
    free(pool);
    free(table);
}

static void paged(hpd_backend_t *be, layout_case_t lc, uint32_t T, uint32_t Tq, const float *k,
                  const float *v, const float *q, float *out)
{
    paged_hd(be, lc, HD, T, Tq, k, v, q, out);
}

static void dense(uint32_t T, uint32_t Tq, const float *k, const float *v, const float *q,
                  float *out)
{
    for (uint32_t i = 0; i < Tq; i++) {
        const uint32_t pos = T - Tq + i;
        for (uint32_t h = 0; h < NH; h++) {
            const uint32_t kh = h / (NH / NKV);
            double s[4096], m = -1e300, sum = 0;
            for (uint32_t t = 0; t <= pos; t++) {
                double d = 0;
                for (uint32_t x = 0; x < HD; x++)
                    d += (double)q[((size_t)i * NH + h) * HD + x] * k[((size_t)t * NKV + kh) * HD + x];
                s[t] = d / sqrt((double)HD);
                m = s[t] > m ? s[t] : m;
            }
            for (uint32_t t = 0; t <= pos; t++)
                sum += (s[t] = exp(s[t] - m));
            for (uint32_t x = 0; x < HD; x++) {
                double o = 0;
                for (uint32_t t = 0; t <= pos; t++)
                    o += s[t] * v[((size_t)t * NKV + kh) * HD + x];
                out[((size_t)i * NH + h) * HD + x] = (float)(o / sum);
            }
        }
    }
}

static void test_paged_matches_dense_and_layouts(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 2};
    hpd_backend_t *be;
    const uint32_t lengths[] = {1, 15, 16, 33, 100, 257};
    const layout_case_t cases[] = {
        {16, 1, HPD_KV_NHD}, {32, 1, HPD_KV_NHD}, {64, 1, HPD_KV_NHD}, {16, 2, HPD_KV_HND},
        {32, 3, HPD_KV_HND}, {64, 2, HPD_KV_NHD}, {128, 3, HPD_KV_HND}, {48, 1, HPD_KV_HND},
    };

    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    for (size_t li = 0; li < sizeof(lengths) / sizeof(lengths[0]); li++) {
        const uint32_t T = lengths[li], Tq = T < 40 ? T : 40;
        float *k = malloc((size_t)T * NKV * HD * sizeof(float));
        float *v = malloc((size_t)T * NKV * HD * sizeof(float));
        float *q = malloc((size_t)Tq * NH * HD * sizeof(float));
        float *ref = malloc((size_t)Tq * NH * HD * sizeof(float));
        float *first = malloc((size_t)Tq * NH * HD * sizeof(float));
        float *out = malloc((size_t)Tq * NH * HD * sizeof(float));
        test_fill(k, (size_t)T * NKV * HD, 10 + T, 1.0f);
        test_fill(v, (size_t)T * NKV * HD, 20 + T, 1.0f);
        test_fill(q, (size_t)Tq * NH * HD, 30 + T, 1.0f);
        dense(T, Tq, k, v, q, ref);
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            paged(be, cases[c], T, Tq, k, v, q, c == 0 ? first : out);
            if (c == 0) {
                double e = test_rel_rms(first, ref, (size_t)Tq * NH * HD);
                print_message("T=%u: paged vs dense rel rms %.2e\n", T, e);
                assert_true(e < 1e-5);
            } else {
                /* exact equality across block size, pack size and order */
                assert_memory_equal(first, out, (size_t)Tq * NH * HD * sizeof(float));
            }
        }
        free(k), free(v), free(q), free(ref), free(first), free(out);
    }
    hpd_backend_destroy(be);
}

/* Decode (one query per sequence, batched) gives the bits of the prefill row. */
static void test_decode_equals_prefill_row(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 2};
    hpd_backend_t *be;
    const uint32_t T = 90;
    float *k = malloc(T * NKV * HD * sizeof(float)), *v = malloc(T * NKV * HD * sizeof(float));
    float *q = malloc(T * NH * HD * sizeof(float));
    float *pre = malloc(T * NH * HD * sizeof(float)), *dec = malloc(NH * HD * sizeof(float));

    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    test_fill(k, T * NKV * HD, 1, 1.0f);
    test_fill(v, T * NKV * HD, 2, 1.0f);
    test_fill(q, T * NH * HD, 3, 1.0f);
    layout_case_t lc = {32, 1, HPD_KV_NHD};
    paged(be, lc, T, T, k, v, q, pre);
    paged(be, lc, T, 1, k, v, q + (size_t)(T - 1) * NH * HD, dec);
    assert_memory_equal(pre + (size_t)(T - 1) * NH * HD, dec, NH * HD * sizeof(float));
    free(k), free(v), free(q), free(pre), free(dec);
    hpd_backend_destroy(be);
}

/* The CPU attention computes, per query row and head, the defined sequence
 * of the determinism contract: key tiles of HPD_ATTN_TILE; per tile the
 * scores as hpd_dot times scale, the running max, acc scaled by exp(m -
 * m_new), the exps, their sum in key order, one hpd_axpy per key in order;
 * the output acc / sum. Written here with the scalar primitives of simd.h,
 * it must give the kernel's bits for head dims with and without a 64-wide
 * part and an 8-wide tail. */
static void reference_row(const float *q, const float *k, const float *v, uint32_t hd,
                          uint32_t stride, uint32_t pos, float scale, float *out)
{
    float acc[1024] = {0}, m = -INFINITY, sum = 0.0f;
    for (uint32_t t0 = 0; t0 <= pos; t0 += HPD_ATTN_TILE) {
        const uint32_t t1 = t0 + HPD_ATTN_TILE <= pos + 1 ? t0 + HPD_ATTN_TILE : pos + 1;
        float sc[HPD_ATTN_TILE], tile_max = -INFINITY;
        for (uint32_t t = t0; t < t1; t++) {
            sc[t - t0] = hpd_dot(q, k + (size_t)t * stride, hd) * scale;
            tile_max = fmaxf(tile_max, sc[t - t0]);
        }
        const float m_new = fmaxf(m, tile_max), alpha = expf(m - m_new);
        hpd_scale(acc, alpha, hd);
        sum *= alpha;
        for (uint32_t t = t0; t < t1; t++) {
            const float p = hpd_exp1(sc[t - t0] + -m_new);
            sum += p;
            hpd_axpy(acc, p, v + (size_t)t * stride, hd);
        }
        m = m_new;
    }
    const float inv = 1.0f / sum;
    for (uint32_t d = 0; d < hd; d++)
        out[d] = acc[d] * inv;
}

static void test_defined_sequence(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 2};
    hpd_backend_t *be;
    const uint32_t hds[] = {128, 100, 72, 8, 5}, T = 75, Tq = 43;
    layout_case_t lc = {16, 2, HPD_KV_HND};

    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    for (size_t c = 0; c < sizeof(hds) / sizeof(hds[0]); c++) {
        const uint32_t hd = hds[c];
        float *k = malloc((size_t)T * NKV * hd * sizeof(float));
        float *v = malloc((size_t)T * NKV * hd * sizeof(float));
        float *q = malloc((size_t)Tq * NH * hd * sizeof(float));
        float *out = malloc((size_t)Tq * NH * hd * sizeof(float)), want[1024];
        test_fill(k, (size_t)T * NKV * hd, 70 + c, 3.0f);
        test_fill(v, (size_t)T * NKV * hd, 80 + c, 1.0f);
        test_fill(q, (size_t)Tq * NH * hd, 90 + c, 3.0f);
        paged_hd(be, lc, hd, T, Tq, k, v, q, out);
        for (uint32_t i = 0; i < Tq; i++)
            for (uint32_t h = 0; h < NH; h++) {
                const uint32_t kh = h / (NH / NKV);
                reference_row(q + ((size_t)i * NH + h) * hd, k + (size_t)kh * hd,
                              v + (size_t)kh * hd, hd, NKV * hd, T - Tq + i,
                              1.0f / sqrtf((float)hd), want);
                const float *got = out + ((size_t)i * NH + h) * hd;
                for (uint32_t d = 0; d < hd; d++)
                    if (memcmp(&got[d], &want[d], sizeof(float)) != 0)
                        fail_msg("head dim %u, row %u, head %u, element %u: %a, the sequence gives %a",
                                 hd, i, h, d, got[d], want[d]);
            }
        free(k), free(v), free(q), free(out);
    }
    hpd_backend_destroy(be);
}

/* What the CPU kernel supports: f32 and head_dim up to 1024. At 1024 one
 * token attends to itself, so the output is its value row exactly; 1025 and
 * a bf16 cache are refused. */
static void test_head_dim_limit(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    for (uint32_t hd = 1024; hd <= 1025; hd++) {
        hpd_kv_layout_t l = {.block_size = 16,
                             .pack_size = 1,
                             .order = HPD_KV_NHD,
                             .dtype = HPD_DTYPE_F32,
                             .n_layers = 1,
                             .n_kv_heads = 1,
                             .head_dim = hd};
        float *pool = calloc(hpd_kv_layout_page_elems(&l), sizeof(float));
        float *k = malloc(hd * sizeof(float)), *v = malloc(hd * sizeof(float));
        float *q = malloc(hd * sizeof(float)), *out = malloc(hd * sizeof(float));
        const uint32_t page = 0, *tables[1] = {&page};
        test_fill(k, hd, 1, 1.0f);
        test_fill(v, hd, 2, 1.0f);
        test_fill(q, hd, 3, 1.0f);
        hpd_paged_kv_t kv = {.layout = &l, .pool = pool, .block_tables = tables};
        hpd_seq_t one = {.n_tokens = 1};
        hpd_kv_store_args_t st = {.kv = kv,
                                  .k = {.p = k, .ld = hd, .hs = hd},
                                  .v = {.p = v, .ld = hd, .hs = hd},
                                  .seqs = &one,
                                  .n_seqs = 1};
        assert_int_equal(hpd_kv_store(be, &st), HPD_OK);
        hpd_attention_args_t a = {.kv = kv,
                                  .q = {.p = q, .ld = hd, .hs = hd},
                                  .out = {.p = out, .ld = hd, .hs = hd},
                                  .n_heads = 1,
                                  .scale = 0.03f,
                                  .seqs = &one,
                                  .n_seqs = 1};
        if (hd == 1024) {
            assert_int_equal(hpd_attention(be, &a), HPD_OK);
            assert_memory_equal(out, v, hd * sizeof(float));
            l.dtype = HPD_DTYPE_BF16;
        }
        assert_int_equal(hpd_attention(be, &a), HPD_ERR_UNSUPPORTED);
        free(pool), free(k), free(v), free(q), free(out);
    }
    hpd_backend_destroy(be);
}

/* The two-sequence tests' KV: one layer, pages of 16 NHD rows */
static hpd_kv_layout_t one_layer_layout(void)
{
    return (hpd_kv_layout_t){.block_size = 16,
                             .pack_size = 1,
                             .order = HPD_KV_NHD,
                             .dtype = HPD_DTYPE_F32,
                             .n_layers = 1,
                             .n_kv_heads = NKV,
                             .head_dim = HD};
}

/* One store of two sequences writes what two stores of one sequence each
 * write (the second sequence's rows at its own positions and pages). */
static void test_store_two_sequences(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    hpd_kv_layout_t l = one_layer_layout();
    const size_t pool_floats = 8 * hpd_kv_layout_page_elems(&l);
    float *one = calloc(pool_floats, sizeof(float)), *two = calloc(pool_floats, sizeof(float));
    float k[40 * NKV * HD], v[40 * NKV * HD];
    const uint32_t t0[2] = {5, 1}, t1[2] = {3, 7}; /* sequence s's pages */
    const uint32_t *tables[2] = {t0, t1};
    const hpd_seq_t seqs[2] = {{.n_tokens = 20}, {.row = 20, .n_tokens = 20, .start_pos = 10}};
    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    test_fill(k, 40 * NKV * HD, 1, 1.0f);
    test_fill(v, 40 * NKV * HD, 2, 1.0f);
    for (int s = 0; s < 2; s++) {
        hpd_paged_kv_t kv = {.layout = &l, .pool = one, .block_tables = &tables[s]};
        hpd_kv_store_args_t st = {.kv = kv,
                                  .k = {.p = k, .ld = NKV * HD, .hs = HD},
                                  .v = {.p = v, .ld = NKV * HD, .hs = HD},
                                  .seqs = &seqs[s],
                                  .n_seqs = 1};
        assert_int_equal(hpd_kv_store(be, &st), HPD_OK);
    }
    hpd_paged_kv_t kv = {.layout = &l, .pool = two, .block_tables = tables};
    hpd_kv_store_args_t st = {.kv = kv,
                              .k = {.p = k, .ld = NKV * HD, .hs = HD},
                              .v = {.p = v, .ld = NKV * HD, .hs = HD},
                              .seqs = seqs,
                              .n_seqs = 2};
    assert_int_equal(hpd_kv_store(be, &st), HPD_OK);
    assert_memory_equal(one, two, pool_floats * sizeof(float));
    /* and the second sequence did land: its first row is in page 3 at offset 10 */
    assert_memory_equal(two + 3 * hpd_kv_layout_page_elems(&l) + hpd_kv_layout_row(&l, 0, 0, 10, 0),
                        k + 20 * NKV * HD, HD * sizeof(float));
    free(one), free(two);
    hpd_backend_destroy(be);
}

/* Two sequences in one call give each the bits it gets alone: every key
 * row comes from its own sequence's pages (20 and 37 keys: tiles of four
 * keys and a tail) */
static void test_two_sequences_as_alone(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    hpd_kv_layout_t l = one_layer_layout();
    enum { T0 = 20, T1 = 37, ROWS = T0 + T1, Q0 = 3, Q1 = 5 };
    const size_t pool_floats = 12 * hpd_kv_layout_page_elems(&l);
    float *pool = calloc(pool_floats, sizeof(float));
    static float k[ROWS * NKV * HD], v[ROWS * NKV * HD], q[(Q0 + Q1) * NH * HD];
    static float both[(Q0 + Q1) * NH * HD], alone[(Q0 + Q1) * NH * HD];
    const uint32_t t0[2] = {9, 2}, t1[3] = {4, 11, 0}; /* sequence s's pages */
    const uint32_t *tables[2] = {t0, t1};
    const hpd_seq_t kvs[2] = {{.n_tokens = T0}, {.row = T0, .n_tokens = T1}};
    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    test_fill(k, ROWS * NKV * HD, 11, 1.0f);
    test_fill(v, ROWS * NKV * HD, 12, 1.0f);
    test_fill(q, (Q0 + Q1) * NH * HD, 13, 1.0f);
    hpd_paged_kv_t kv = {.layout = &l, .pool = pool, .block_tables = tables};
    hpd_kv_store_args_t st = {.kv = kv,
                              .k = {.p = k, .ld = NKV * HD, .hs = HD},
                              .v = {.p = v, .ld = NKV * HD, .hs = HD},
                              .seqs = kvs,
                              .n_seqs = 2};
    assert_int_equal(hpd_kv_store(be, &st), HPD_OK);
    /* the last Q0 and Q1 positions of each sequence as queries */
    const hpd_seq_t qs[2] = {{.n_tokens = Q0, .start_pos = T0 - Q0},
                             {.row = Q0, .n_tokens = Q1, .start_pos = T1 - Q1}};
    hpd_attention_args_t a = {.kv = kv,
                              .q = {.p = q, .ld = NH * HD, .hs = HD},
                              .out = {.p = both, .ld = NH * HD, .hs = HD},
                              .n_heads = NH,
                              .scale = 1.0f / sqrtf((float)HD),
                              .seqs = qs,
                              .n_seqs = 2};
    assert_int_equal(hpd_attention(be, &a), HPD_OK);
    for (int s = 0; s < 2; s++) {
        a.kv.block_tables = &tables[s], a.seqs = &qs[s], a.n_seqs = 1, a.out.p = alone;
        assert_int_equal(hpd_attention(be, &a), HPD_OK);
    }
    assert_memory_equal(both, alone, sizeof(both));
    free(pool);
    hpd_backend_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_two_sequences),
        cmocka_unit_test(test_two_sequences_as_alone),
        cmocka_unit_test(test_head_dim_limit),
        cmocka_unit_test(test_paged_matches_dense_and_layouts),
        cmocka_unit_test(test_decode_equals_prefill_row),
        cmocka_unit_test(test_defined_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
