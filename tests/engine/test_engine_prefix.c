/* The engine with the prefix cache: tokens bit-identical to the cache off
 * over a workload of shared prefixes, across layouts, under page, checkpoint
 * and host-tier pressure; hit lengths as the rules say; nothing leaked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "tests/engine/fixture.h"

#define MODEL "--hidden 128 --layers 9 --full-interval 3 --intermediate 256 --vocab 512 " \
              "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "    \
              "--lin-k-dim 32 --lin-v-dim 32 --seed 21"

/* system prompt `sys` cut at `shared` tokens, then a user turn of stream `user` */
typedef struct {
    uint32_t sys, shared, user, len, max_tokens;
    hpd_sampling_t s;
} req_t;

static const uint32_t sys_len[] = {0, 300, 90, 700};
#define G {0, 1, 0, 0}
static const req_t work[] = {
    {1, 300, 10, 340, 12, G},                 /* 0: S1 + a */
    {1, 300, 11, 325, 10, G},                 /* 1: S1 + b: branch inside block 4 */
    {1, 30, 12, 100, 8, G},                   /* 2: branch inside the first block */
    {1, 100, 13, 180, 8, G},                  /* 3: branch inside block 1 */
    {1, 128, 14, 200, 8, G},                  /* 4: branch on a block boundary */
    {1, 300, 10, 340, 12, G},                 /* 5: exact repeat of 0 */
    {2, 90, 15, 130, 9, G},                   /* 6: another system prompt */
    {1, 20, 16, 20, 7, G},                    /* 7: shorter than a block */
    {1, 300, 10, 340, 12, {0.9f, 0.9f, 0, 5}}, /* 8: repeat of 0, sampled */
    {3, 700, 17, 720, 6, G},                  /* 9: long prompt (every-N checkpoints) */
    {3, 500, 18, 560, 6, {1.1f, 1, 30, 6}},   /* 10: diverges at 500 */
    {3, 700, 17, 720, 6, G},                  /* 11: exact repeat of 9 */
    {1, 300, 11, 325, 10, G},                 /* 12: repeat of 1 (its branch point now saved) */
    {1, 64, 19, 64, 5, G},                    /* 13: exactly one block */
};
#define N_WORK (sizeof(work) / sizeof(work[0]))

static void prompt_of(const req_t *r, int32_t *p)
{
    for (uint32_t i = 0; i < r->len; i++) {
        const uint64_t stream = i < r->shared && i < sys_len[r->sys] ? r->sys : 100 + r->user;
        p[i] = (int32_t)(hpd_philox4x32(stream, i, 2).v[0] % 512);
    }
}

static int setup(void **state)
{
    return engine_fixture_setup("prefix", MODEL);
}

static int teardown(void **state) { return engine_fixture_teardown(); }

static void base_params(hpd_engine_params_t *ep)
{
    hpd_engine_params_init(ep);
    ep->model = model;
    ep->backend = be;
    ep->max_context = 1024;
    ep->checkpoint_every = 4;
}

typedef struct {
    int32_t tokens[N_WORK][16];
    uint32_t cached[N_WORK], cached_host[N_WORK];
    hpd_prefix_cache_stats_t stats;
} outcome_t;

/* Runs the workload `rounds` times, `batch` requests admitted at a time. */
static void run(hpd_engine_params_t *ep, uint32_t batch, int rounds, outcome_t *o)
{
    hpd_engine_t *e;
    int32_t prompt[1024];

    ep->max_batch = batch;
    assert_int_equal(hpd_engine_create(ep, &e), HPD_OK);
    for (int round = 0; round < rounds; round++) {
        uint64_t ids[N_WORK];
        for (size_t i = 0; i < N_WORK; i++) {
            prompt_of(&work[i], prompt);
            hpd_request_params_t rp = {.prompt = prompt,
                                       .n_prompt = work[i].len,
                                       .max_tokens = work[i].max_tokens,
                                       .sampling = work[i].s,
                                       .replay = NULL};
            assert_int_equal(hpd_engine_submit(e, &rp, &ids[i]), HPD_OK);
        }
        assert_int_equal(hpd_engine_run(e), HPD_OK);
        for (size_t i = 0; i < N_WORK; i++) {
            const int32_t *t;
            uint32_t n;
            hpd_request_state_t st;
            hpd_request_info_t info;
            assert_int_equal(hpd_engine_result(e, ids[i], &t, &n, &st), HPD_OK);
            assert_int_equal(st, HPD_REQ_FINISHED);
            assert_int_equal(n, work[i].max_tokens);
            memcpy(o->tokens[i], t, n * sizeof(int32_t));
            assert_int_equal(hpd_engine_request_info(e, ids[i], &info), HPD_OK);
            o->cached[i] = info.cached_tokens;
            o->cached_host[i] = info.cached_host_tokens;
            hpd_engine_release(e, ids[i]);
        }
        /* nothing leaked: every reference left is the cache's */
        assert_int_equal(hpd_engine_audit(e), 0);
    }
    if (hpd_engine_cache_stats(e, &o->stats) != HPD_OK)
        memset(&o->stats, 0, sizeof(o->stats));
    hpd_engine_destroy(e);
}

static outcome_t ref;

static void assert_same_tokens(const outcome_t *o)
{
    for (size_t i = 0; i < N_WORK; i++)
        assert_memory_equal(o->tokens[i], ref.tokens[i], work[i].max_tokens * sizeof(int32_t));
}

static void test_cache_on_equals_off_and_hit_lengths(void **state)
{
    hpd_engine_params_t ep;
    outcome_t o;

    base_params(&ep);
    ep.prefix_cache = false;
    run(&ep, 16, 1, &ref);
    for (size_t i = 0; i < N_WORK; i++)
        assert_int_equal(ref.cached[i], 0);

    base_params(&ep);
    run(&ep, 1, 1, &o); /* one at a time: every earlier prompt is in the cache */
    assert_same_tokens(&o);
    /* the rules, request by request (checkpoints every 4 blocks) */
    const uint32_t fixed[N_WORK] = {
        0,   /* 0: cold */
        256, /* 1: shares 300 with 0; state at 256 (every 4 blocks) */
        0,   /* 2: diverges inside block 0 */
        0,   /* 3: KV of block 0 but no state at 64: saves it as its branch point */
        64,  /* 4: the state at 64 saved by 3 */
        320, /* 5: exact repeat: up to the last full block */
        0,   /* 6: other system prompt */
        0,   /* 7: shorter than a block */
        320, /* 8: repeat, sampled */
        0,   /* 9: cold long prompt */
        256, /* 10: shares 500 with 9: states at 256 and 512 (every 4), 512 > 500 */
        704, /* 11: exact repeat: last full block */
        320, /* 12: repeat of 1: its own last full block (320) */
        0,   /* 13: exactly one block: the probe stops at 63 */
    };
    for (size_t i = 0; i < N_WORK; i++)
        if (o.cached[i] != fixed[i])
            print_message("request %zu: cached %u, expected %u\n", i, o.cached[i], fixed[i]);
    for (size_t i = 0; i < N_WORK; i++)
        assert_int_equal(o.cached[i], fixed[i]);
    assert_true(o.stats.hit_tokens_device > 0);

    run(&ep, 4, 2, &o); /* several at a time, twice */
    assert_same_tokens(&o);
}

static void test_layouts(void **state)
{
    const uint32_t Bs[] = {16, 64, 128}, Ps[] = {1, 2, 3};
    hpd_engine_params_t ep;
    outcome_t o;

    for (size_t b = 0; b < 3; b++)
        for (size_t p = 0; p < 3; p++)
            for (int order = 0; order < 2; order++) {
                base_params(&ep);
                ep.kv_layout.block_size = Bs[b];
                ep.kv_layout.pack_size = Ps[p];
                ep.kv_layout.order = order ? HPD_KV_HND : HPD_KV_NHD;
                run(&ep, 2, 1, &o);
                assert_same_tokens(&o);
            }
}

/* Few pages: entries move to the host tier and come back on a hit. */
static void test_host_tier_round_trip(void **state)
{
    hpd_engine_params_t ep;
    outcome_t o;
    const uint32_t Bs[] = {16, 64, 128};

    for (size_t b = 0; b < 3; b++) {
        base_params(&ep);
        ep.kv_layout.block_size = Bs[b];
        /* room for the two longest requests at once, little for the cache */
        ep.n_pages = 3 * 2 * ((726 + Bs[b] - 1) / Bs[b]) + 3;
        ep.n_checkpoints = 4;
        run(&ep, 2, 2, &o);
        print_message("B=%u: to host %llu, dropped %llu, host hits %llu, promotions %llu\n",
                      Bs[b], (unsigned long long)o.stats.evicted_to_host,
                      (unsigned long long)o.stats.evicted_dropped,
                      (unsigned long long)o.stats.hit_tokens_host,
                      (unsigned long long)o.stats.promotions);
        assert_same_tokens(&o);
        assert_true(o.stats.evicted_to_host > 0);
        assert_true(o.stats.hit_tokens_host > 0);
        assert_true(o.stats.promotions > 0);
        uint32_t from_host = 0;
        for (size_t i = 0; i < N_WORK; i++)
            from_host += o.cached_host[i];
        assert_true(from_host > 0);
    }
}

/* A host tier smaller than the shared prefixes, few checkpoint slots, no host
 * tier at all: results stay the same. */
static void test_pressure(void **state)
{
    hpd_engine_params_t ep;
    outcome_t o;

    base_params(&ep);
    ep.n_pages = 3 * 2 * 12 + 6;
    ep.kv_layout.block_size = 64;
    ep.host_cache_bytes = 200 * 1024; /* a few blocks and checkpoints */
    ep.n_checkpoints = 2;
    run(&ep, 2, 2, &o);
    assert_same_tokens(&o);
    assert_true(o.stats.host_dropped + o.stats.evicted_dropped > 0);

    base_params(&ep);
    ep.n_pages = 3 * 2 * 12 + 6;
    ep.host_cache_bytes = 0;
    ep.n_checkpoints = 1;
    run(&ep, 2, 2, &o);
    assert_same_tokens(&o);
    assert_int_equal(o.stats.evicted_to_host, 0);
}

/* Cancels at every stage leave only the cache's references. */
static void test_cancel_with_cache(void **state)
{
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    int32_t prompt[1024];

    base_params(&ep);
    ep.prefill_chunk = 64;
    ep.max_batch = 4;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_OK);
    for (int step_before_cancel = 0; step_before_cancel < 12; step_before_cancel++) {
        uint64_t ids[N_WORK];
        for (size_t i = 0; i < N_WORK; i++) {
            prompt_of(&work[i], prompt);
            hpd_request_params_t rp = {.prompt = prompt,
                                       .n_prompt = work[i].len,
                                       .max_tokens = work[i].max_tokens,
                                       .sampling = work[i].s,
                                       .replay = NULL};
            assert_int_equal(hpd_engine_submit(e, &rp, &ids[i]), HPD_OK);
        }
        for (int s = 0; s < step_before_cancel; s++)
            assert_int_equal(hpd_engine_step(e, NULL), HPD_OK);
        for (size_t i = 0; i < N_WORK; i += 2)
            assert_int_equal(hpd_engine_cancel(e, ids[i]), HPD_OK);
        assert_int_equal(hpd_engine_run(e), HPD_OK);
        for (size_t i = 1; i < N_WORK; i += 2) {
            const int32_t *t;
            uint32_t n;
            hpd_engine_result(e, ids[i], &t, &n, NULL);
            assert_memory_equal(t, ref.tokens[i], work[i].max_tokens * sizeof(int32_t));
        }
        for (size_t i = 0; i < N_WORK; i++)
            hpd_engine_release(e, ids[i]);
        assert_int_equal(hpd_engine_audit(e), 0);
    }
    hpd_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_on_equals_off_and_hit_lengths),
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_host_tier_round_trip),
        cmocka_unit_test(test_pressure),
        cmocka_unit_test(test_cancel_with_cache),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
