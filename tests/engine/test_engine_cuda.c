/* The engine on the GPU (label gpu; exits 77 without one), on a small
 * random model with both layer kinds:
 * - against the CPU engine: how many greedy tokens agree (printed; most
 *   must), and the first tokens' logits within fp32 error;
 * - bit-identical to itself across page layouts, batch compositions (one
 *   request at a time vs all at once with a mixed prefill/decode batch),
 *   prefix-cache hits, and seeded sampling.
 * HPD_TEST_DEVICE names the device under test (cuda:0); "cpu" runs the
 * same checks on the CPU backend, which checks the test itself; "cpu-bf16"
 * checks the bf16 products' determinism, with HPD_TEST_LOGIT_TOL (1e-4) and
 * HPD_TEST_MIN_AGREE (0.9) set for an arithmetic that is not fp32's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/test_device.h"
#include "tests/test_helpers.h"

#define SMALL "--hidden 256 --layers 8 --full-interval 2 --intermediate 512 --vocab 1024 " \
              "--heads 4 --kv-heads 2 --head-dim 64 --lin-k-heads 2 --lin-v-heads 4 "     \
              "--lin-k-dim 64 --lin-v-dim 64 --seed 17 --arch qwen3_next"
#define N_REQ 12
#define MAX_TOKENS 24
#define VOCAB 1024

static char root[256];
static hpd_model_t *model;
static hpd_backend_t *cpu, *gpu;
static int32_t prompts[N_REQ][400];
static uint32_t lens[N_REQ];

static int setup(void **state)
{
    char dir[512];
    hpd_backend_params_t cp = {.device = "cpu"};
    test_tmpdir(root, sizeof(root), "engine-cuda");
    snprintf(dir, sizeof(dir), "%s/model", root);
    if (test_mkmodel(dir, SMALL) != 0 || hpd_model_load(dir, &model) != HPD_OK ||
        hpd_backend_create(&cp, &cpu) != HPD_OK)
        return -1;
    /* half the prompts share a 192-token prefix: prefix-cache hits */
    for (uint32_t r = 0; r < N_REQ; r++) {
        lens[r] = 70 + 27 * r;
        for (uint32_t i = 0; i < lens[r]; i++) {
            const uint64_t seed = (r % 2 == 0 && i < 192) ? 1000 : 2000 + r;
            prompts[r][i] = (int32_t)(hpd_philox4x32(seed, i, 3).v[0] % VOCAB);
        }
    }
    return 0;
}

static int teardown(void **state)
{
    hpd_model_destroy(model);
    hpd_backend_destroy(cpu);
    hpd_backend_destroy(gpu);
    test_rmtree(root);
    return 0;
}

typedef struct {
    uint32_t B, P;
    hpd_kv_order_t order;
    bool prefix_cache;
    bool one_at_a_time;
    hpd_sampling_t sampling;
} run_cfg_t;

static bool no_graphs;                /* runs with decode steps op by op (step_graphs false) */
static hpd_engine_stats_t last_stats; /* the last run's */

/* first-token logits of each request, for the CPU comparison */
typedef struct {
    float logits[N_REQ][VOCAB];
    uint64_t ids[N_REQ];
} first_logits_t;

static void capture(void *arg, uint64_t id, uint32_t position, const float *logits,
                    uint32_t vocab)
{
    first_logits_t *f = arg;
    for (uint32_t r = 0; r < N_REQ; r++)
        if (f->ids[r] == id && position == lens[r] - 1)
            memcpy(f->logits[r], logits, vocab * sizeof(float));
}

static void run(hpd_backend_t *be, const run_cfg_t *c, int32_t out[N_REQ][MAX_TOKENS],
                first_logits_t *f, uint32_t *cached_p)
{
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    uint64_t ids[N_REQ];
    uint32_t cached = 0;

    hpd_engine_params_init(&ep);
    ep.model = model;
    ep.backend = be;
    ep.kv_layout.block_size = c->B;
    ep.kv_layout.pack_size = c->P;
    ep.kv_layout.order = c->order;
    ep.prefix_cache = c->prefix_cache;
    ep.max_context = 1024;
    ep.prefill_chunk = 128;
    ep.step_graphs = !no_graphs;
    if (f != NULL) {
        ep.logits_cb = capture;
        ep.logits_cb_arg = f;
    }
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_OK);
    for (uint32_t r = 0; r < N_REQ; r++) {
        hpd_request_params_t rp = {.prompt = prompts[r],
                                   .n_prompt = lens[r],
                                   .max_tokens = MAX_TOKENS,
                                   .sampling = c->sampling};
        rp.sampling.seed += r;
        assert_int_equal(hpd_engine_submit(e, &rp, &ids[r]), HPD_OK);
        if (f != NULL)
            f->ids[r] = ids[r];
        if (c->one_at_a_time)
            assert_int_equal(hpd_engine_run(e), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    for (uint32_t r = 0; r < N_REQ; r++) {
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t st;
        hpd_request_info_t info;
        assert_int_equal(hpd_engine_result(e, ids[r], &toks, &n, &st), HPD_OK);
        assert_int_equal(st, HPD_REQ_FINISHED);
        assert_int_equal(n, MAX_TOKENS);
        memcpy(out[r], toks, sizeof(out[r]));
        hpd_engine_request_info(e, ids[r], &info);
        cached += info.cached_tokens;
    }
    assert_int_equal(hpd_engine_audit(e), 0);
    hpd_engine_stats(e, &last_stats);
    hpd_engine_destroy(e);
    if (cached_p != NULL)
        *cached_p = cached;
}

static void test_gpu_vs_cpu(void **state)
{
    static int32_t tc[N_REQ][MAX_TOKENS], tg[N_REQ][MAX_TOKENS];
    static first_logits_t fc, fg;
    const run_cfg_t c = {64, 1, HPD_KV_NHD, false, false, {0, 1, 0, 0}};
    uint32_t agree = 0, agree_prefix = 0;
    const char *tol_s = getenv("HPD_TEST_LOGIT_TOL"), *agree_s = getenv("HPD_TEST_MIN_AGREE");
    const double tol = tol_s ? atof(tol_s) : 1e-4, min_agree = agree_s ? atof(agree_s) : 0.9;

    run(cpu, &c, tc, &fc, NULL);
    run(gpu, &c, tg, &fg, NULL);
    for (uint32_t r = 0; r < N_REQ; r++) {
        bool same = true;
        for (uint32_t t = 0; t < MAX_TOKENS; t++) {
            agree += tc[r][t] == tg[r][t];
            same = same && tc[r][t] == tg[r][t];
            agree_prefix += same;
        }
        const double err = test_rel_rms(fg.logits[r], fc.logits[r], VOCAB);
        print_message("request %u: first-token logits rel rms %.2e\n", r, err);
        assert_true(err < tol);
    }
    print_message("greedy tokens, device vs CPU engine: %u of %u agree (%u before the first "
                  "divergence)\n", agree, N_REQ * MAX_TOKENS, agree_prefix);
    assert_true(agree >= min_agree * N_REQ * MAX_TOKENS);
}

static void test_gpu_bit_identical(void **state)
{
    static int32_t ref[N_REQ][MAX_TOKENS], got[N_REQ][MAX_TOKENS];
    const hpd_sampling_t greedy = {.top_p = 1}, seeded = {0.8f, 0.9f, 40, 7};
    const run_cfg_t cases[] = {
        {64, 1, HPD_KV_NHD, false, true, greedy}, /* the reference: alone, no cache */
        {64, 1, HPD_KV_NHD, false, false, greedy},
        {16, 4, HPD_KV_HND, false, false, greedy},
        {32, 2, HPD_KV_NHD, true, false, greedy},
        {16, 1, HPD_KV_HND, true, true, greedy},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t cached;
        run(gpu, &cases[i], i == 0 ? ref : got, NULL, &cached);
        if (i > 0)
            assert_memory_equal(got, ref, sizeof(ref));
        print_message("B=%u P=%u %s, prefix cache %s, %s: identical (%u prompt tokens cached)\n",
                      cases[i].B, cases[i].P, cases[i].order == HPD_KV_NHD ? "nhd" : "hnd",
                      cases[i].prefix_cache ? "on" : "off",
                      cases[i].one_at_a_time ? "one at a time" : "all at once", cached);
        if (cases[i].prefix_cache && cases[i].one_at_a_time)
            assert_true(cached > 0);
    }
    /* seeded sampling: two layouts and batchings, the same tokens */
    run_cfg_t a = {64, 1, HPD_KV_NHD, false, true, seeded}, b = {16, 4, HPD_KV_HND, true, false,
                                                                 seeded};
    run(gpu, &a, ref, NULL, NULL);
    run(gpu, &b, got, NULL, NULL);
    assert_memory_equal(got, ref, sizeof(ref));
    print_message("seeded sampling: identical across layouts, batches and prefix hits\n");
}

/* Whether the backend records steps now (CUDA, not with HPD_CUDA_GRAPHS=0
 * or HPD_CUDA_SYNC=1): a step begun and ended without running */
static bool records_steps(hpd_backend_t *be)
{
    bool ran;
    if (hpd_backend_step_begin(be, 1) != HPD_OK)
        return false;
    assert_int_equal(hpd_backend_step_end(be, false, &ran), HPD_OK);
    return true;
}

/* Decode steps recorded as CUDA graphs (a metadata upload per segment) give
 * the tokens of the same steps run op by op: batches of one request and of
 * many, greedy and seeded; on a backend that records steps, every
 * decode-only step was recorded. */
static void test_gpu_step_graphs(void **state)
{
    static int32_t ref[N_REQ][MAX_TOKENS], got[N_REQ][MAX_TOKENS];
    const hpd_sampling_t greedy = {.top_p = 1}, seeded = {0.8f, 0.9f, 40, 7};
    const run_cfg_t cases[] = {
        {64, 1, HPD_KV_NHD, false, true, greedy},
        {16, 4, HPD_KV_HND, true, false, seeded},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const run_cfg_t c = cases[i];
        no_graphs = true;
        run(gpu, &c, ref, NULL, NULL);
        const hpd_engine_stats_t off = last_stats;
        no_graphs = false;
        run(gpu, &c, got, NULL, NULL);
        const hpd_engine_stats_t on = last_stats;
        assert_memory_equal(got, ref, sizeof(ref));
        print_message("%s, %s: identical with steps recorded (%llu of %llu decode steps "
                      "recorded)\n", c.one_at_a_time ? "one at a time" : "all at once",
                      i == 0 ? "greedy" : "seeded", (unsigned long long)on.graph_steps,
                      (unsigned long long)on.decode_steps);
        assert_int_equal(off.graph_steps, 0);
        assert_int_equal(on.steps, off.steps);
        if (records_steps(gpu)) { /* every decode-only step */
            assert_true(on.decode_steps > 0);
            assert_int_equal(on.graph_steps, on.decode_steps);
        }
    }
}

int main(void)
{
    /* recorded steps (the default, said whatever the environment): every
     * run of this test records its decode steps but test_gpu_step_graphs'
     * reference */
    setenv("HPD_CUDA_GRAPHS", "1", 1);
    gpu = test_open_device("cuda:0", 0, NULL);
    if (strcmp(gpu->ops->name, "cpu-bf16") == 0 && !hpd_cpu_bf16_native()) {
        /* lane by lane this engine run would take many minutes; test_gemm
         * checks the emulated sequence itself */
        fprintf(stderr, "cpu-bf16 is emulated on this CPU (no AVX512_BF16): skipped\n");
        return TEST_EXIT_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_vs_cpu),
        cmocka_unit_test(test_gpu_bit_identical),
        cmocka_unit_test(test_gpu_step_graphs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
