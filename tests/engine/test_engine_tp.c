/* Tensor parallelism in the engine (issue 37; docs/tensor_parallel.md):
 * CPU ranks, each with its shard (hpd_model_load_tp), give the bits of
 * TP 1 at TP 2, 4 and 8: every token and every logit of a batch of
 * requests (greedy and sampled, prompts over several prefill chunks, a
 * prefix-cache hit, a cancel mid-generation), on a dense model with a
 * vocabulary TP does not divide, a mixture of experts, an FP8 release and
 * Qwen3.5's naming with fused experts. Also: each rank's shard holds the
 * slices of TP 1's weights the shard map names (the conv weights per
 * segment, KV heads replicated in groups); degrees a model cannot run at
 * are refused by name; a step that fails on one rank fails on every rank
 * and the engine serves the next request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "common/hash.h"
#include "engine/engine.h"
#include "kernels/tp_sum.h"
#include "tests/test_helpers.h"

/* 8 query heads over 2 KV heads, 8 GDN key heads: every degree to 8 */
#define TP_MODEL                                                                          \
    "--hidden 128 --layers 4 --full-interval 2 --intermediate 256 --vocab 1001 "          \
    "--heads 8 --kv-heads 2 --head-dim 32 --lin-k-heads 8 --lin-v-heads 16 "              \
    "--lin-k-dim 16 --lin-v-dim 16 --seed 5"
#define MOE " --experts 8 --experts-per-tok 2 --moe-intermediate 64 --shared-intermediate 64"

static char root[256];

#define N_REQ 4
#define MAX_TOKENS 8
#define MAX_LOGITS 64

/* what a run produced: each request's tokens, and the hash of each logits
 * row in the order the engine gave them */
typedef struct {
    int32_t tokens[N_REQ + 1][MAX_TOKENS];
    uint32_t n_tokens[N_REQ + 1];
    uint32_t cached[N_REQ + 1];
    uint64_t logits[MAX_LOGITS];
    uint32_t n_logits;
    uint64_t logprobs; /* hash of request 1's log probabilities (20 top ones a token) */
} run_t;

static void keep_logits(void *arg, uint64_t id, uint32_t position, const float *logits,
                        uint32_t vocab)
{
    run_t *r = arg;
    assert_true(r->n_logits < MAX_LOGITS);
    r->logits[r->n_logits++] = XXH3_64bits_withSeed(logits, vocab * sizeof(float),
                                                    id * 100000 + position);
}

typedef struct {
    hpd_model_t *models[HPD_TP_MAX];
    hpd_backend_t *backends[HPD_TP_MAX];
    hpd_engine_t *engine;
    uint32_t tp;
} ranks_t;

static hpd_status_t ranks_open(ranks_t *k, const char *dir, uint32_t tp, run_t *out,
                               const hpd_backend_ops_t *ops1)
{
    hpd_engine_params_t ep;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_status_t st;

    memset(k, 0, sizeof(*k));
    k->tp = tp;
    if ((st = hpd_model_load_tp(dir, tp, false, k->models)) != HPD_OK)
        return st;
    for (uint32_t r = 0; r < tp; r++) {
        assert_int_equal(hpd_backend_cpu_create(&bp, &k->backends[r]), HPD_OK);
        if (r == 1 && ops1 != NULL)
            k->backends[r]->ops = ops1;
    }
    hpd_engine_params_init(&ep);
    ep.model = k->models[0];
    ep.backend = k->backends[0];
    ep.tp_models = (const hpd_model_t *const *)k->models;
    ep.tp_backends = k->backends;
    ep.max_batch = 4;
    ep.prefill_chunk = 64;
    ep.max_context = 512;
    ep.logits_cb = keep_logits;
    ep.logits_cb_arg = out;
    return hpd_engine_create(&ep, &k->engine);
}

static void ranks_close(ranks_t *k)
{
    hpd_engine_destroy(k->engine);
    for (uint32_t r = 0; r < k->tp; r++) {
        hpd_backend_destroy(k->backends[r]);
        hpd_model_destroy(k->models[r]);
    }
}

static uint64_t submit(hpd_engine_t *e, const int32_t *prompt, uint32_t n, uint64_t seed)
{
    hpd_request_params_t p = {.prompt = prompt,
                              .n_prompt = n,
                              .max_tokens = MAX_TOKENS,
                              .sampling = {.temperature = seed ? 0.9f : 0.0f,
                                           .top_p = seed ? 0.95f : 1.0f,
                                           .top_k = seed ? 50 : 0,
                                           .seed = seed},
                              .ignore_eos = true,
                              .logprobs = seed == 1234,
                              .top_logprobs = seed == 1234 ? 20 : 0};
    uint64_t id;
    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
    return id;
}

/* The workload: three requests at once (a prompt of 150 tokens: three
 * prefill chunks; a sampled one; one canceled after three steps), then one
 * that shares the long prompt's first 128 tokens (a prefix-cache hit). */
static void workload(const char *dir, uint32_t tp, run_t *out)
{
    int32_t p[200];
    ranks_t k;
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < 200; i++)
        p[i] = (int32_t)((i * 37 + 11) % 1000);
    assert_int_equal(ranks_open(&k, dir, tp, out, NULL), HPD_OK);
    uint64_t ids[N_REQ + 1];
    ids[0] = submit(k.engine, p, 150, 0);
    ids[1] = submit(k.engine, p + 3, 20, 1234);
    ids[2] = submit(k.engine, p + 9, 30, 77);
    for (int s = 0; s < 3; s++)
        assert_int_equal(hpd_engine_step(k.engine, NULL), HPD_OK);
    assert_int_equal(hpd_engine_cancel(k.engine, ids[2]), HPD_OK);
    assert_int_equal(hpd_engine_run(k.engine), HPD_OK);
    int32_t q[140];
    memcpy(q, p, 128 * sizeof(int32_t));
    for (uint32_t i = 128; i < 140; i++)
        q[i] = (int32_t)i;
    ids[3] = submit(k.engine, q, 140, 5);
    assert_int_equal(hpd_engine_run(k.engine), HPD_OK);
    for (uint32_t i = 0; i < N_REQ; i++) {
        const int32_t *t;
        hpd_request_state_t state;
        hpd_request_info_t info;
        assert_int_equal(hpd_engine_result(k.engine, ids[i], &t, &out->n_tokens[i], &state),
                         HPD_OK);
        assert_int_equal(state, i == 2 ? HPD_REQ_FAILED : HPD_REQ_FINISHED);
        memcpy(out->tokens[i], t, out->n_tokens[i] * sizeof(int32_t));
        assert_int_equal(hpd_engine_request_info(k.engine, ids[i], &info), HPD_OK);
        out->cached[i] = info.cached_tokens;
    }
    assert_true(out->cached[3] >= 64); /* the hit happened */
    const hpd_token_logprobs_t *lp;
    uint32_t n_lp;
    assert_int_equal(hpd_engine_logprobs(k.engine, ids[1], &lp, &n_lp), HPD_OK);
    assert_int_equal(n_lp, out->n_tokens[1]);
    out->logprobs = XXH3_64bits(lp, n_lp * sizeof(*lp));
    assert_int_equal(hpd_engine_audit(k.engine), 0);
    ranks_close(&k);
}

static void same_bits(const char *name, const char *args)
{
    char dir[512];
    run_t one, got;
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    assert_int_equal(test_mkmodel(dir, args), 0);
    workload(dir, 1, &one);
    for (uint32_t tp = 2; tp <= HPD_TP_MAX; tp *= 2) {
        workload(dir, tp, &got);
        for (uint32_t i = 0; i < N_REQ; i++) {
            assert_int_equal(got.n_tokens[i], one.n_tokens[i]);
            assert_int_equal(got.cached[i], one.cached[i]);
            if (memcmp(got.tokens[i], one.tokens[i], one.n_tokens[i] * sizeof(int32_t)) != 0)
                fail_msg("%s at tp %u: request %u's tokens differ from tp 1's", name, tp, i);
        }
        if (got.logprobs != one.logprobs)
            fail_msg("%s at tp %u: request 1's logprobs differ from tp 1's", name, tp);
        assert_int_equal(got.n_logits, one.n_logits);
        for (uint32_t i = 0; i < one.n_logits; i++)
            if (got.logits[i] != one.logits[i])
                fail_msg("%s at tp %u: logits row %u differs from tp 1's", name, tp, i);
    }
}

static void test_dense(void **state)
{
    (void)state;
    same_bits("dense", TP_MODEL);
}

static void test_moe(void **state)
{
    (void)state;
    same_bits("moe", TP_MODEL MOE);
}

static void test_fp8(void **state)
{
    (void)state; /* blocks of 24: groups of the canonical sum start inside them */
    same_bits("fp8", TP_MODEL MOE " --fp8 24 --mlp-only-layers 1");
}

static void test_qwen35(void **state)
{
    (void)state;
    same_bits("q35", TP_MODEL " --arch qwen3_5_moe --experts 8 --fused-experts --dtype f32");
}

/* rows [begin, begin + n) of part 0 of a fused matrix, in bytes */
static const void *fused_row(const hpd_fused_t *f, uint64_t cols, uint64_t row)
{
    assert_int_equal(f->n, 1);
    return (const char *)f->part[0].p + row * cols * hpd_dtype_size(f->part[0].dtype);
}

/* Each rank's shard holds the slices of TP 1's weights the map names. */
static void test_shards_are_slices(void **state)
{
    (void)state;
    char dir[512];
    hpd_model_t *full, *m[4];
    snprintf(dir, sizeof(dir), "%s/slices", root);
    assert_int_equal(test_mkmodel(dir, TP_MODEL MOE), 0);
    assert_int_equal(hpd_model_load(dir, &full), HPD_OK);
    assert_int_equal(hpd_model_load_tp(dir, 4, false, m), HPD_OK);
    const hpd_model_config_t *c = &full->config;
    const uint64_t H = c->hidden_size, hd = c->head_dim, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const uint64_t kc = c->conv_kernel, es = hpd_dtype_size(full->layers[0].gdn_in.part[0].dtype);
    for (uint32_t r = 0; r < 4; r++) {
        const hpd_model_config_t *lc = &m[r]->config;
        const hpd_layer_weights_t *fg = &full->layers[0], *g = &m[r]->layers[0];
        assert_int_equal(lc->n_heads, 2);
        assert_int_equal(lc->n_kv_heads, 1);
        assert_int_equal(lc->lin_n_k_heads, 2);
        assert_int_equal(lc->conv_dim, 2 * 2 * dk + 4 * dv);
        assert_int_equal(lc->vocab_size, c->vocab_size);
        /* conv weights: the q, k and v segments each of this rank's heads */
        const uint64_t kb = 2 * r, vb = 4 * r, nk = c->lin_n_k_heads;
        assert_memory_equal(g->gdn_conv, fg->gdn_conv + kb * dk * kc, 2 * dk * kc * 4);
        assert_memory_equal(g->gdn_conv + 2 * dk * kc, fg->gdn_conv + (nk + kb) * dk * kc,
                            2 * dk * kc * 4);
        assert_memory_equal(g->gdn_conv + 4 * dk * kc, fg->gdn_conv + (2 * nk * dk + vb * dv) * kc,
                            4 * dv * kc * 4);
        assert_memory_equal(g->gdn_a_log, fg->gdn_a_log + vb, 4 * 4);
        /* GDN input projection: the q rows of its key heads, the z rows of its value heads */
        assert_memory_equal(fused_row(&g->gdn_in, H, 0), fused_row(&fg->gdn_in, H, kb * dk),
                            2 * dk * H * es);
        assert_memory_equal(fused_row(&g->gdn_in, H, lc->conv_dim),
                            fused_row(&fg->gdn_in, H, c->conv_dim + vb * dv), 4 * dv * H * es);
        /* attention: its two query heads, KV head r / 2 (0,0,1,1) */
        const hpd_layer_weights_t *fa = &full->layers[1], *a = &m[r]->layers[1];
        assert_memory_equal(fused_row(&a->attn_qkv, H, 0),
                            fused_row(&fa->attn_qkv, H, 2 * r * 2 * hd), 2 * 2 * hd * H * es);
        assert_memory_equal(fused_row(&a->attn_qkv, H, 2 * 2 * hd),
                            fused_row(&fa->attn_qkv, H, c->n_heads * 2 * hd + (r / 2) * hd),
                            hd * H * es);
        /* a row-parallel matrix: its two groups are TP 1's groups 2r and 2r + 1 */
        for (uint32_t gi = 2 * r; gi < 2 * r + 2; gi++) {
            uint32_t col, k, col1, k1;
            const hpd_weight_t v = hpd_model_group(&a->attn_o, H, c->n_heads * hd, &m[r]->shard, gi,
                                                   &col, &k);
            const hpd_weight_t v1 = hpd_model_group(&fa->attn_o, H, c->n_heads * hd, &full->shard, gi,
                                                    &col1, &k1);
            assert_int_equal(k, k1);
            assert_int_equal(col, col1 - 2 * r * k);
            assert_memory_equal(v.p, v1.p, H * k * hpd_dtype_size(v.dtype));
        }
        /* the embedding: its quarter of the vocabulary (1001 does not divide) */
        const uint64_t v0 = (uint64_t)r * c->vocab_size / 4;
        assert_int_equal(m[r]->shard.vocab.begin, v0);
        assert_memory_equal(m[r]->embed.p,
                            (const char *)full->embed.p + v0 * H * hpd_dtype_size(full->embed.dtype),
                            (m[r]->shard.vocab.end - v0) * H * hpd_dtype_size(full->embed.dtype));
        assert_memory_equal(m[r]->fingerprint, full->fingerprint, 16);
    }
    for (uint32_t r = 0; r < 4; r++)
        hpd_model_destroy(m[r]);
    hpd_model_destroy(full);
}

/* Degrees a model cannot run at, and ranks that do not fit together. */
static void test_refusals(void **state)
{
    (void)state;
    char dir[512];
    hpd_model_t *m[HPD_TP_MAX] = {0};
    snprintf(dir, sizeof(dir), "%s/narrow", root);
    assert_int_equal(test_mkmodel(dir, "--hidden 128 --layers 4 --full-interval 2 "
                                       "--heads 4 --kv-heads 2 --lin-k-heads 2 --lin-v-heads 4 "
                                       "--head-dim 32 --lin-k-dim 16 --lin-v-dim 16"), 0);
    assert_int_equal(hpd_model_load_tp(dir, 3, false, m), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_model_load_tp(dir, 4, false, m), HPD_ERR_INVALID_ARG); /* 2 GDN key heads */
    assert_null(m[0]); /* untouched on failure */
    assert_int_equal(hpd_model_load_tp(dir, 2, false, m), HPD_OK);
    hpd_backend_t *b;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    assert_int_equal(hpd_backend_cpu_create(&bp, &b), HPD_OK);
    hpd_engine_params_t ep;
    hpd_engine_t *e = NULL;
    hpd_engine_params_init(&ep);
    ep.model = m[0];
    ep.backend = b;
    /* rank 0 of 2 without the other rank */
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_ERR_INVALID_ARG);
    /* the ranks swapped */
    hpd_backend_t *bs[2] = {b, b};
    const hpd_model_t *swapped[2] = {m[0], m[0]};
    ep.tp_models = swapped;
    ep.tp_backends = bs;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_ERR_INVALID_ARG);
    /* rank 1 as the engine's model */
    ep.model = m[1];
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_ERR_INVALID_ARG);
    assert_null(e);
    /* rank 0's own parameters refused, after the group was made (freed once) */
    hpd_backend_t *b2;
    assert_int_equal(hpd_backend_cpu_create(&bp, &b2), HPD_OK);
    hpd_backend_t *both[2] = {b, b2};
    const hpd_model_t *ranks[2] = {m[0], m[1]};
    ep.model = m[0];
    ep.tp_models = ranks;
    ep.tp_backends = both;
    ep.prefill_chunk = 100;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_ERR_INVALID_ARG);
    assert_null(e);
    /* a reservation: the same pages and slot on every rank, in each rank's
     * own pools, whose layout holds the rank's KV heads */
    ep.prefill_chunk = 64;
    ep.prefix_cache = false;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_OK);
    assert_int_equal(hpd_engine_tp(e), 2);
    assert_ptr_equal(hpd_engine_rank(e, 0), e);
    assert_null(hpd_engine_rank(e, 2));
    const int32_t prompt[3] = {1, 2, 3};
    hpd_request_params_t rp = {
        .prompt = prompt, .n_prompt = 3, .max_tokens = 2, .sampling = {.top_p = 1}};
    uint64_t id = 77, id2;
    assert_int_equal(hpd_engine_reserve(e, &rp, &id), HPD_OK);
    assert_int_equal(hpd_engine_reserve(e, &rp, &id2), HPD_OK);
    for (uint32_t r = 0; r < 2; r++) {
        hpd_engine_kv_t k0, kr;
        hpd_engine_memory_t m0, mr;
        const hpd_engine_t *rank = hpd_engine_rank(e, r);
        assert_non_null(rank);
        assert_int_equal(hpd_engine_request_kv(e, id2, &k0), HPD_OK);
        assert_int_equal(hpd_engine_request_kv(rank, id2, &kr), HPD_OK);
        hpd_engine_memory(e, &m0);
        hpd_engine_memory(rank, &mr);
        assert_int_equal(mr.layout->n_kv_heads, 1); /* 2 KV heads over 2 ranks */
        assert_int_equal(kr.slot, k0.slot);
        assert_int_equal(kr.n_groups, k0.n_groups);
        for (uint32_t g = 0; g < k0.n_groups; g++)
            assert_memory_equal(kr.tables[g], k0.tables[g], k0.n_blocks * sizeof(uint32_t));
        assert_true(r == 0 || (mr.kv_pool != m0.kv_pool && mr.slot_pool != m0.slot_pool));
        assert_ptr_equal(kr.state, (uint8_t *)mr.slot_pool + kr.slot * mr.slot_bytes);
    }
    hpd_engine_release(e, id);
    hpd_engine_release(e, id2);
    assert_int_equal(hpd_engine_audit(e), 0);
    /* steps with nothing to do still meet, and end */
    uint32_t active = 1;
    assert_int_equal(hpd_engine_step(e, &active), HPD_OK);
    assert_int_equal(active, 0);
    hpd_engine_destroy(e);
    hpd_backend_destroy(b2);
    assert_int_equal(hpd_model_load_tp(dir, 0, false, m), HPD_ERR_INVALID_ARG);
    hpd_backend_destroy(b);
    hpd_model_destroy(m[0]);
    hpd_model_destroy(m[1]);
}

/* rank 1's backend: its 10th GEMM (gemm or gemm_sum) fails, in the first step */
static hpd_backend_ops_t failing;
static const hpd_backend_ops_t *cpu_ops;
static int gemms_left;

static hpd_status_t failing_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    if (--gemms_left == 0)
        return HPD_ERR_INTERNAL;
    return cpu_ops->gemm(b, a);
}

static hpd_status_t failing_gemm_sum(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    if (--gemms_left == 0)
        return HPD_ERR_INTERNAL;
    return cpu_ops->gemm_sum(b, a);
}

/* A model in root/name and a CPU backend whose ops `failing` starts from
 * (the caller overrides some, for rank 1) */
static void failing_setup(const char *name, char *dir, size_t len, hpd_backend_t **probe_p)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    snprintf(dir, len, "%s/%s", root, name);
    assert_int_equal(test_mkmodel(dir, TP_MODEL), 0);
    assert_int_equal(hpd_backend_cpu_create(&bp, probe_p), HPD_OK);
    cpu_ops = (*probe_p)->ops;
    failing = *cpu_ops;
}

static hpd_status_t failing_alloc(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    (void)b, (void)bytes, (void)ptr_p;
    return HPD_ERR_NO_MEMORY;
}

/* A rank past 0 that cannot be built (its backend has no memory): the
 * engine is refused with that status, and what was built is freed (the
 * sanitizer build checks that nothing leaks or is freed twice). */
static void test_peer_not_built(void **state)
{
    (void)state;
    char dir[512];
    run_t out = {0};
    ranks_t k;
    hpd_backend_t *probe;
    failing_setup("nomem", dir, sizeof(dir), &probe);
    failing.alloc = failing_alloc;
    failing.alloc_pool = NULL;
    assert_int_equal(ranks_open(&k, dir, 4, &out, &failing), HPD_ERR_NO_MEMORY);
    assert_null(k.engine);
    ranks_close(&k);
    hpd_backend_destroy(probe);
}

/* A step that fails on one rank fails on every rank (none waits for the
 * one that stopped), its requests end failed, and the next request runs. */
static void test_rank_failure(void **state)
{
    (void)state;
    char dir[512];
    run_t out = {0};
    ranks_t k;
    hpd_backend_t *probe;
    failing_setup("fail", dir, sizeof(dir), &probe);
    failing.gemm = failing_gemm;
    failing.gemm_sum = failing_gemm_sum;
    gemms_left = 10;
    assert_int_equal(ranks_open(&k, dir, 2, &out, &failing), HPD_OK);
    const int32_t p[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const uint64_t a = submit(k.engine, p, 12, 0);
    assert_int_not_equal(hpd_engine_step(k.engine, NULL), HPD_OK);
    const int32_t *t;
    uint32_t n;
    hpd_request_state_t st;
    assert_int_equal(hpd_engine_result(k.engine, a, &t, &n, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FAILED);
    const uint64_t b = submit(k.engine, p, 12, 0);
    assert_int_equal(hpd_engine_run(k.engine), HPD_OK);
    assert_int_equal(hpd_engine_result(k.engine, b, &t, &n, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FINISHED);
    assert_int_equal(n, MAX_TOKENS);
    assert_int_equal(hpd_engine_audit(k.engine), 0);
    ranks_close(&k);
    hpd_backend_destroy(probe);
}

static int setup(void **state)
{
    (void)state;
    test_tmpdir(root, sizeof(root), "engine-tp");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_rmtree(root);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_qwen35),
        cmocka_unit_test(test_shards_are_slices),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rank_failure),
        cmocka_unit_test(test_peer_not_built),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
