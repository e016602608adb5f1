/* The engine end to end on a small random model: prefill vs decode logits,
 * repeatability, batch invariance, layouts, namings, bad requests and pool
 * pressure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include <jansson.h>

#include "engine/engine.h"
#include "grammar/grammar.h"
#include "tests/engine/fixture.h"
#include "tokenizer/tokenizer.h"

static int setup(void **state)
{
    return engine_fixture_setup("engine", ENGINE_TEST_SMALL " --arch qwen3_next");
}

static int teardown(void **state) { return engine_fixture_teardown(); }

static void prompt_of(int32_t *p, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)(hpd_philox4x32(seed, i, 1).v[0] % 512);
}

static hpd_engine_t *engine_with(hpd_engine_params_t *ep, const hpd_model_t *m)
{
    hpd_engine_t *e;
    ep->model = m;
    ep->backend = be;
    assert_int_equal(hpd_engine_create(ep, &e), HPD_OK);
    return e;
}

static hpd_engine_t *engine_default(void)
{
    hpd_engine_params_t ep;
    hpd_engine_params_init(&ep);
    return engine_with(&ep, model);
}

typedef struct {
    uint32_t position;
    float logits[512];
    int seen;
} capture_t;

static void capture(void *arg, uint64_t id, uint32_t position, const float *logits,
                    uint32_t vocab)
{
    capture_t *c = arg;
    if (position == c->position) {
        memcpy(c->logits, logits, vocab * sizeof(float));
        c->seen++;
    }
}

/* Logits at the last position: one prefill over the whole sequence vs a
 * prefill of a prefix and decode steps (replayed tokens) over the rest. */
static void test_prefill_equals_prefill_plus_decode(void **state)
{
    enum { N = 150 };
    int32_t seq[N];
    const uint32_t splits[] = {1, 63, 64, 100, 149};
    capture_t whole = {.position = N - 1}, part = {.position = N - 1};
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    uint64_t id;

    prompt_of(seq, N, 1);
    hpd_engine_params_init(&ep);
    ep.logits_cb = capture;
    ep.logits_cb_arg = &whole;
    e = engine_with(&ep, model);
    hpd_request_params_t rp = {
        .prompt = seq, .n_prompt = N, .max_tokens = 1, .sampling = {.top_p = 1}};
    assert_int_equal(hpd_engine_submit(e, &rp, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(whole.seen, 1);
    hpd_engine_destroy(e);

    for (size_t s = 0; s < sizeof(splits) / sizeof(splits[0]); s++) {
        const uint32_t k = splits[s];
        part.seen = 0;
        ep.logits_cb_arg = &part;
        e = engine_with(&ep, model);
        hpd_request_params_t pr = {.prompt = seq,
                                   .n_prompt = k,
                                   .max_tokens = N - k + 1,
                                   .sampling = {.top_p = 1},
                                   .replay = seq + k,
                                   .n_replay = N - k};
        assert_int_equal(hpd_engine_submit(e, &pr, &id), HPD_OK);
        assert_int_equal(hpd_engine_run(e), HPD_OK);
        assert_int_equal(part.seen, 1);
        double err = test_rel_rms(part.logits, whole.logits, 512);
        print_message("prefill %u + decode %u: logits rel rms %.2e\n", k, N - k, err);
        assert_true(err < 1e-4);
        /* the replayed tokens come out as the generated ones */
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t st;
        assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
        assert_int_equal(st, HPD_REQ_FINISHED);
        assert_int_equal(n, N - k + 1);
        assert_memory_equal(toks, seq + k, (N - k) * sizeof(int32_t));
        hpd_engine_destroy(e);
    }
}

typedef struct {
    uint32_t len, max_tokens;
    hpd_sampling_t s;
} req_t;

static const req_t reqs[] = {
    {5, 20, {0, 1, 0, 0}},        {64, 12, {0.9f, 0.95f, 0, 3}}, {130, 16, {0, 1, 0, 0}},
    {1, 25, {1.2f, 1, 40, 8}},    {200, 8, {0.7f, 0.8f, 10, 9}}, {77, 30, {0, 1, 0, 0}},
};
#define N_REQS (sizeof(reqs) / sizeof(reqs[0]))

static void run_alone(const hpd_model_t *m, hpd_engine_params_t *ep, size_t i, int32_t *out)
{
    int32_t prompt[256];
    uint64_t id;
    const int32_t *toks;
    uint32_t n;
    hpd_request_state_t st;
    hpd_engine_t *e = engine_with(ep, m);

    prompt_of(prompt, reqs[i].len, 100 + i);
    hpd_request_params_t rp = {.prompt = prompt,
                               .n_prompt = reqs[i].len,
                               .max_tokens = reqs[i].max_tokens,
                               .sampling = reqs[i].s};
    assert_int_equal(hpd_engine_submit(e, &rp, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FINISHED);
    assert_int_equal(n, reqs[i].max_tokens);
    memcpy(out, toks, n * sizeof(int32_t));
    hpd_engine_destroy(e);
}

/* Submits every request of reqs[] (prompt i seeded 100 + i). */
static void submit_reqs(hpd_engine_t *e, uint64_t ids[N_REQS])
{
    int32_t prompt[256];
    for (size_t i = 0; i < N_REQS; i++) {
        prompt_of(prompt, reqs[i].len, 100 + i);
        hpd_request_params_t rp = {.prompt = prompt,
                                   .n_prompt = reqs[i].len,
                                   .max_tokens = reqs[i].max_tokens,
                                   .sampling = reqs[i].s};
        assert_int_equal(hpd_engine_submit(e, &rp, &ids[i]), HPD_OK);
    }
}

/* The tokens of every request of reqs[], each finished with all its
 * max_tokens; out[i] holds nothing but them (the rest is -1, never an
 * earlier round's tokens). */
static void collect_reqs(hpd_engine_t *e, const uint64_t ids[N_REQS], int32_t out[][32])
{
    for (size_t i = 0; i < N_REQS; i++) {
        const int32_t *toks;
        uint32_t n = 0;
        hpd_request_state_t st;
        memset(out[i], 0xff, sizeof(out[i]));
        assert_int_equal(hpd_engine_result(e, ids[i], &toks, &n, &st), HPD_OK);
        assert_int_equal(st, HPD_REQ_FINISHED);
        assert_int_equal(n, reqs[i].max_tokens);
        memcpy(out[i], toks, n * sizeof(int32_t));
    }
}

/* Nothing leaked: every page in use is one the prefix cache holds (none
 * without the cache), no slot is live, and the audit finds no mismatch. */
static void assert_only_cache_holds(hpd_engine_t *e)
{
    uint32_t pages_used, slots_used;
    hpd_prefix_cache_stats_t cs = {0};
    hpd_engine_usage(e, &pages_used, NULL, &slots_used, NULL);
    if (hpd_engine_cache_stats(e, &cs) == HPD_OK)
        assert_true(cs.pages_held > 0); /* every test here caches something */
    assert_int_equal(pages_used, cs.pages_held);
    assert_int_equal(slots_used, 0);
    assert_int_equal(hpd_engine_audit(e), 0);
}

static void run_batch(hpd_engine_params_t *ep, int32_t out[][32])
{
    uint64_t ids[N_REQS];
    hpd_engine_t *e = engine_with(ep, model);

    submit_reqs(e, ids);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    collect_reqs(e, ids, out);
    for (size_t i = 0; i < N_REQS; i++)
        hpd_engine_release(e, ids[i]);
    assert_only_cache_holds(e);
    hpd_engine_destroy(e);
}

static void test_repeatable_and_batch_invariant(void **state)
{
    int32_t alone[N_REQS][32], again[32], batch[N_REQS][32];
    hpd_engine_params_t ep;
    int distinct = 0;

    hpd_engine_params_init(&ep);
    for (size_t i = 0; i < N_REQS; i++) {
        run_alone(model, &ep, i, alone[i]);
        run_alone(model, &ep, i, again);
        assert_memory_equal(alone[i], again, reqs[i].max_tokens * sizeof(int32_t));
    }
    /* greedy output is not one token repeated */
    for (uint32_t t = 1; t < reqs[5].max_tokens; t++)
        distinct += alone[5][t] != alone[5][0];
    assert_true(distinct > 5);

    /* everything at once, then with a tight step budget that interleaves
     * prefill chunks with decode steps, then one request at a time */
    const uint32_t budgets[][3] = {{16, 256, 0}, {4, 64, 68}, {1, 128, 0}};
    for (size_t b = 0; b < 3; b++) {
        hpd_engine_params_init(&ep);
        ep.max_batch = budgets[b][0];
        ep.prefill_chunk = budgets[b][1];
        ep.max_step_tokens = budgets[b][2];
        run_batch(&ep, batch);
        for (size_t i = 0; i < N_REQS; i++)
            assert_memory_equal(alone[i], batch[i], reqs[i].max_tokens * sizeof(int32_t));
    }
}

static void test_layouts_and_namings(void **state)
{
    int32_t ref[N_REQS][32], got[N_REQS][32];
    const struct {
        uint32_t B, P;
        hpd_kv_order_t o;
    } layouts[] = {{16, 1, HPD_KV_NHD}, {32, 2, HPD_KV_HND}, {128, 1, HPD_KV_HND},
                   {64, 2, HPD_KV_NHD}};
    hpd_engine_params_t ep;

    hpd_engine_params_init(&ep);
    run_batch(&ep, ref);
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
        hpd_engine_params_init(&ep);
        ep.kv_layout.block_size = layouts[l].B;
        ep.kv_layout.pack_size = layouts[l].P;
        ep.kv_layout.order = layouts[l].o;
        run_batch(&ep, got);
        for (size_t i = 0; i < N_REQS; i++)
            assert_memory_equal(ref[i], got[i], reqs[i].max_tokens * sizeof(int32_t));
    }

    /* the same random model written with the Qwen3.5 naming */
    const char *archs[] = {"qwen3_5_text", "qwen3_5"};
    for (size_t a = 0; a < 2; a++) {
        char dir[512], args[1024];
        hpd_model_t *other;
        snprintf(dir, sizeof(dir), "%s/%s", root, archs[a]);
        snprintf(args, sizeof(args), ENGINE_TEST_SMALL " --arch %s", archs[a]);
        assert_int_equal(test_mkmodel(dir, args), 0);
        assert_int_equal(hpd_model_load(dir, &other), HPD_OK);
        hpd_engine_params_init(&ep);
        for (size_t i = 0; i < N_REQS; i++) {
            run_alone(other, &ep, i, got[i]);
            assert_memory_equal(ref[i], got[i], reqs[i].max_tokens * sizeof(int32_t));
        }
        hpd_model_destroy(other);
    }
}

static void test_bad_requests(void **state)
{
    hpd_engine_t *e = engine_default();
    int32_t ok[3] = {1, 2, 3}, bad_id[3] = {1, 512, 3}, neg[2] = {4, -1};
    int32_t *long_prompt = calloc(5000, sizeof(int32_t));
    uint64_t id;
    const hpd_sampling_t g = {.top_p = 1};
    const hpd_request_params_t cases[] = {
        {.prompt = ok, .max_tokens = 4, .sampling = g}, /* empty prompt */
        {.prompt = bad_id, .n_prompt = 3, .max_tokens = 4, .sampling = g}, /* id >= vocab */
        {.prompt = neg, .n_prompt = 2, .max_tokens = 4, .sampling = g}, /* negative id */
        /* beyond max context */
        {.prompt = long_prompt, .n_prompt = 5000, .max_tokens = 4, .sampling = g},
        {.prompt = ok, .n_prompt = 3, .sampling = g}, /* no tokens asked */
        {.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = {.temperature = 0.5f}},
        /* negative temperature */
        {.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = {.temperature = -1, .top_p = 1}},
        /* more replay than max tokens (valid ids: only the count is wrong) */
        {.prompt = ok, .n_prompt = 3, .max_tokens = 2, .sampling = g, .replay = ok,
         .n_replay = 3},
        /* a stop id >= vocab */
        {.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = g, .stop_ids = bad_id,
         .n_stop = 3},
        /* more stop ids than allowed */
        {.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = g, .stop_ids = long_prompt,
         .n_stop = HPD_MAX_STOP_IDS + 1},
        /* min_tokens above max_tokens */
        {.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = g, .min_tokens = 5},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(hpd_engine_submit(e, &cases[i], &id), HPD_ERR_INVALID_ARG);
    /* and the engine still serves */
    hpd_request_params_t good = {.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = g};
    const int32_t *toks;
    uint32_t n;
    assert_int_equal(hpd_engine_submit(e, &good, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, NULL), HPD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(hpd_engine_result(e, 999, &toks, &n, NULL), HPD_ERR_NOT_FOUND);
    free(long_prompt);
    hpd_engine_destroy(e);
}

/* Runs one request alone and with two others in the batch; both runs must
 * give the same tokens; returns them in out (n_p) and the finish reason. */
static hpd_finish_reason_t run_stopping(hpd_engine_t *e, hpd_request_params_t p, int32_t *out,
                                        uint32_t *n_p)
{
    hpd_finish_reason_t reason = HPD_FINISH_NONE;
    for (int round = 0; round < 2; round++) {
        int32_t other[7];
        uint64_t id, o1, o2;
        prompt_of(other, 7, 99);
        const hpd_request_params_t q = {.prompt = other, .n_prompt = 7, .max_tokens = 9,
                                        .sampling = {.top_p = 1}};
        if (round == 1)
            assert_int_equal(hpd_engine_submit(e, &q, &o1), HPD_OK);
        assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
        if (round == 1)
            assert_int_equal(hpd_engine_submit(e, &q, &o2), HPD_OK);
        assert_int_equal(hpd_engine_run(e), HPD_OK);
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t st;
        hpd_request_info_t info;
        assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
        assert_int_equal(st, HPD_REQ_FINISHED);
        assert_int_equal(hpd_engine_request_info(e, id, &info), HPD_OK);
        if (round == 0) {
            memcpy(out, toks, n * sizeof(int32_t));
            *n_p = n;
            reason = info.finish_reason;
        } else {
            assert_int_equal(n, *n_p);
            assert_memory_equal(toks, out, n * sizeof(int32_t));
            assert_int_equal(info.finish_reason, reason);
            hpd_engine_release(e, o1);
            hpd_engine_release(e, o2);
        }
        hpd_engine_release(e, id);
    }
    return reason;
}

/* Stop tokens: a request's stop ids, the model's end-of-sequence ids
 * (unless ignore_eos), min_tokens, and the finish reason; the stop token is
 * the last one returned, and the tokens before it are those of a run
 * without stops. */
static void test_stop_tokens(void **state)
{
    int32_t prompt[11], full[16], got[16];
    uint32_t n_full, n, first, second = 16;
    prompt_of(prompt, 11, 5);
    hpd_engine_t *e = engine_default();
    const hpd_request_params_t base = {.prompt = prompt, .n_prompt = 11, .max_tokens = 16,
                                       .sampling = {.top_p = 1}};
    assert_int_equal(run_stopping(e, base, full, &n_full), HPD_FINISH_LENGTH);
    assert_int_equal(n_full, 16);
    /* stop at the token of position 5: the first position holding it ends */
    const int32_t stop = full[5];
    for (first = 0; full[first] != stop; first++)
        ;
    for (uint32_t i = first + 1; i < 16 && second == 16; i++)
        if (full[i] == stop)
            second = i;
    hpd_request_params_t p = base;
    p.stop_ids = &stop;
    p.n_stop = 1;
    assert_int_equal(run_stopping(e, p, got, &n), HPD_FINISH_STOP);
    assert_int_equal(n, first + 1);
    assert_memory_equal(got, full, n * sizeof(int32_t));
    /* min_tokens past it: the next occurrence, or max_tokens */
    p.min_tokens = first + 2;
    assert_int_equal(run_stopping(e, p, got, &n),
                     second < 16 ? HPD_FINISH_STOP : HPD_FINISH_LENGTH);
    assert_int_equal(n, second < 16 ? second + 1 : 16);
    assert_memory_equal(got, full, n * sizeof(int32_t));
    hpd_engine_destroy(e);

    /* the model's end-of-sequence id does the same, unless ignore_eos */
    hpd_model_config_t saved = model->config;
    model->config.n_eos = 2;
    model->config.eos_ids[0] = 511 == stop ? 510 : 511;
    model->config.eos_ids[1] = stop;
    e = engine_default();
    assert_int_equal(run_stopping(e, base, got, &n), HPD_FINISH_STOP);
    assert_int_equal(n, first + 1);
    p = base;
    p.ignore_eos = true;
    assert_int_equal(run_stopping(e, p, got, &n), HPD_FINISH_LENGTH);
    assert_int_equal(n, 16);
    assert_memory_equal(got, full, n * sizeof(int32_t));
    hpd_engine_destroy(e);
    model->config = saved;
}

/* every logits row the engine gives each of two requests (ids 1 and 2), in order */
typedef struct {
    float rows[12][512];
    uint32_t n;
} rows_t;

static void keep_rows(void *arg, uint64_t id, uint32_t position, const float *logits,
                      uint32_t vocab)
{
    rows_t *r = (rows_t *)arg + (id - 1);
    if (id >= 1 && id <= 2 && r->n < 12) /* (later requests are not looked at) */
        memcpy(r->rows[r->n++], logits, vocab * sizeof(float));
}

/* Log probabilities: each token's is the log-softmax of the logits it was
 * sampled from (common/logprobs.h, bit for bit), the top ones the largest
 * logits in order, greedy's token the first of them; a request without
 * them has none; more than 20 top ones are refused. */
static void test_logprobs(void **state)
{
    int32_t prompt[40];
    prompt_of(prompt, 40, 9);
    static rows_t all[2];
    hpd_engine_params_t ep;
    hpd_engine_params_init(&ep);
    ep.logits_cb = keep_rows;
    ep.logits_cb_arg = all;
    hpd_engine_t *e = engine_with(&ep, model);
    /* a greedy request with 5 top ones and a sampled one with 20, in one batch */
    uint64_t ids[2];
    for (int sampled = 0; sampled < 2; sampled++) {
        hpd_request_params_t p = {.prompt = prompt + sampled, .n_prompt = 39, .max_tokens = 12,
                                  .sampling = {.top_p = 1}, .ignore_eos = true,
                                  .logprobs = true, .top_logprobs = sampled ? 20 : 5};
        if (sampled)
            p.sampling = (hpd_sampling_t){.temperature = 0.9f, .top_p = 0.9f, .top_k = 30,
                                          .seed = 3};
        assert_int_equal(hpd_engine_submit(e, &p, &ids[sampled]), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    for (int sampled = 0; sampled < 2; sampled++) {
        const uint64_t id = ids[sampled];
        const rows_t *rows = &all[id - 1];
        const uint32_t top = sampled ? 20 : 5;
        const int32_t *toks;
        uint32_t n, n_lp;
        hpd_request_state_t st;
        const hpd_token_logprobs_t *lp;
        assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
        assert_int_equal(hpd_engine_logprobs(e, id, &lp, &n_lp), HPD_OK);
        assert_int_equal(n_lp, 12);
        assert_int_equal(rows->n, 12);
        for (uint32_t t = 0; t < 12; t++) {
            hpd_token_logprobs_t want;
            hpd_logprobs_compute(rows->rows[t], 512, toks[t], top, &want);
            if (memcmp(&lp[t].logprob, &want.logprob, 4) != 0 || lp[t].n_top != want.n_top ||
                memcmp(lp[t].top_ids, want.top_ids, want.n_top * 4) != 0 ||
                memcmp(lp[t].top_logprobs, want.top_logprobs, want.n_top * 4) != 0)
                fail_msg("token %u: logprobs are not the log-softmax of its logits", t);
            assert_true(lp[t].logprob <= 0.0f);
            for (uint32_t k = 0; k < want.n_top; k++) {
                const int32_t id_k = lp[t].top_ids[k];
                /* the top ones: no larger logit left out, in order */
                for (uint32_t v = 0; v < 512; v++) {
                    bool in = false;
                    for (uint32_t q = 0; q <= k; q++)
                        in |= lp[t].top_ids[q] == (int32_t)v;
                    assert_true(in || rows->rows[t][v] < rows->rows[t][id_k] ||
                                (rows->rows[t][v] == rows->rows[t][id_k] && (int32_t)v > id_k));
                }
            }
            if (!sampled)
                assert_int_equal(lp[t].top_ids[0], toks[t]);
            /* the log-softmax, within rounding of a float reference */
            double z = 0;
            for (uint32_t v = 0; v < 512; v++)
                z += exp((double)rows->rows[t][v]);
            const double ref = (double)rows->rows[t][toks[t]] - log(z);
            assert_true(fabs(lp[t].logprob - ref) < 1e-4);
        }
        hpd_engine_release(e, id);
    }
    /* the prompt's: token t + 1's given tokens 0..t, as the logits of a
     * request of those tokens alone give them (every row computed: no
     * prefix-cache hit) */
    {
        hpd_request_params_t p = {.prompt = prompt, .n_prompt = 24, .max_tokens = 1,
                                  .sampling = {.top_p = 1}, .logprobs = true, .top_logprobs = 4,
                                  .prompt_logprobs = true};
        uint64_t id;
        const hpd_token_logprobs_t *plp;
        uint32_t n_plp;
        assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
        assert_int_equal(hpd_engine_prompt_logprobs(e, id, &plp, &n_plp), HPD_OK);
        assert_int_equal(n_plp, 0); /* not yet */
        assert_int_equal(hpd_engine_run(e), HPD_OK);
        assert_int_equal(hpd_engine_prompt_logprobs(e, id, &plp, &n_plp), HPD_OK);
        assert_int_equal(n_plp, 23);
        for (uint32_t t = 0; t + 1 < 24; t++) {
            static rows_t one;
            hpd_engine_params_t ep1;
            hpd_engine_params_init(&ep1);
            ep1.logits_cb = keep_rows;
            ep1.logits_cb_arg = &one;
            one.n = 0;
            hpd_engine_t *e1 = engine_with(&ep1, model);
            hpd_request_params_t q = {.prompt = prompt, .n_prompt = t + 1, .max_tokens = 1,
                                      .sampling = {.top_p = 1}};
            uint64_t id1;
            assert_int_equal(hpd_engine_submit(e1, &q, &id1), HPD_OK);
            assert_int_equal(hpd_engine_run(e1), HPD_OK);
            assert_int_equal(one.n, 1);
            hpd_token_logprobs_t want = {0};
            hpd_logprobs_compute(one.rows[0], 512, prompt[t + 1], 4, &want);
            if (memcmp(&plp[t], &want, sizeof(want)) != 0) /* (zeros past the top 4 both) */
                fail_msg("prompt token %u's logprobs are not those of the logits after the "
                         "%u tokens before it", t + 1, t + 1);
            hpd_engine_destroy(e1);
        }
        hpd_engine_release(e, id);
    }
    /* none asked for: none; more than 20: refused */
    hpd_request_params_t p = {.prompt = prompt, .n_prompt = 40, .max_tokens = 2,
                              .sampling = {.top_p = 1}};
    uint64_t id;
    const hpd_token_logprobs_t *lp;
    uint32_t n_lp;
    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_logprobs(e, id, &lp, &n_lp), HPD_ERR_NOT_FOUND);
    p.logprobs = true;
    p.top_logprobs = 21;
    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_ERR_INVALID_ARG);
    hpd_engine_destroy(e);
}

/* A pool that fits one request at a time: requests wait, all finish with the
 * same tokens, one that can never fit fails alone, nothing leaks. */
/* The test model's tokenizer and its vocabulary (structured outputs). */
static void load_vocab(hpd_tokenizer_t **tok_p, hpd_vocab_t **v_p)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/model", root);
    assert_int_equal(hpd_tokenizer_load(path, tok_p), HPD_OK);
    assert_int_equal(hpd_vocab_from_tokenizer(*tok_p, v_p), HPD_OK);
}

/* Runs one request with grammar g (and logprobs) to the end: its tokens. */
static uint32_t run_structured(hpd_engine_t *e, hpd_grammar_t *g, hpd_sampling_t s,
                               const int32_t *prompt, int32_t *out, uint32_t max_tokens,
                               hpd_request_state_t *state_p)
{
    uint64_t id;
    const int32_t *toks;
    uint32_t n;
    hpd_request_params_t p = {.prompt = prompt, .n_prompt = 20, .max_tokens = max_tokens,
                              .sampling = s, .grammar = g, .logprobs = true, .top_logprobs = 3};
    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, state_p), HPD_OK);
    memcpy(out, toks, n * sizeof(int32_t));
    hpd_engine_release(e, id);
    return n;
}

static int first_byte(const hpd_tokenizer_t *tok, int32_t id)
{
    char *b;
    size_t len;
    assert_int_equal(hpd_tokenizer_token_bytes(tok, id, &b, &len), HPD_OK);
    const int c = len > 0 ? (unsigned char)b[0] : -1;
    free(b);
    return c;
}

/* The bytes of tokens out[0..n) (an end id left out), NUL-terminated. */
static char *doc_of(const hpd_tokenizer_t *tok, const int32_t *out, uint32_t n, size_t *len_p)
{
    char *doc = malloc(n * 64 + 1);
    size_t len = 0;
    for (uint32_t i = 0; i < n; i++) {
        char *b;
        size_t bl;
        if (hpd_tokenizer_is_special(tok, out[i]))
            continue;
        assert_int_equal(hpd_tokenizer_token_bytes(tok, out[i], &b, &bl), HPD_OK);
        memcpy(doc + len, b, bl);
        len += bl;
        free(b);
    }
    doc[len] = '\0';
    *len_p = len;
    return doc;
}

/* Structured outputs: every output of a random model under 12 schemas x 3
 * seeds (and greedy) is a whole document of its schema that JSON parses,
 * repeatable; logprobs are those of the logits before the mask; a grammar
 * with an after token leaves the tokens before it free; a reserved
 * request's first token is checked against it; an engine without a
 * vocabulary refuses a grammar. */
static void test_structured_outputs(void **state)
{
    static const char *const schemas[] = {
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": "
        "\"string\", \"maxLength\": 8}}, \"required\": [\"a\", \"b\"], \"additionalProperties\": false}",
        "{\"type\": \"array\", \"items\": {\"enum\": [\"red\", \"green\", 7, null]}, \"minItems\": 1, "
        "\"maxItems\": 4}",
        "{\"type\": \"boolean\"}",
        "{\"type\": \"string\", \"pattern\": \"^[a-c]{2,5}-[0-9]+$\", \"maxLength\": 10}",
        "{\"anyOf\": [{\"type\": \"null\"}, {\"type\": \"number\"}]}",
        "{\"$defs\": {\"n\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, "
        "\"k\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/n\"}, \"maxItems\": 1}}, "
        "\"required\": [\"v\"], \"additionalProperties\": false}}, \"$ref\": \"#/$defs/n\"}",
        "{\"const\": {\"x\": [1, \"y\"]}}",
        "{\"type\": \"object\", \"properties\": {\"t\": {\"enum\": [\"a\", \"b\"]}}, "
        "\"additionalProperties\": {\"type\": \"boolean\"}, \"maxProperties\": 3}",
        "{\"type\": \"integer\"}",
        "{\"type\": [\"string\", \"null\"], \"maxLength\": 3}",
        "{\"type\": \"object\", \"properties\": {\"p\": {\"type\": \"string\", \"pattern\": "
        "\"^\\\\d{3}$\"}}, \"required\": [\"p\"], \"additionalProperties\": false}",
        "{\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}, "
        "\"maxItems\": 2}, \"maxItems\": 2}",
    };
    hpd_tokenizer_t *tok;
    hpd_vocab_t *v;
    load_vocab(&tok, &v);
    static rows_t all[2];
    hpd_engine_params_t ep;
    hpd_engine_params_init(&ep);
    ep.vocab = v;
    hpd_engine_t *e = engine_with(&ep, model);
    int32_t prompt[20], out[2][200];
    prompt_of(prompt, 20, 5);
    uint32_t whole = 0, runs = 0;
    for (size_t i = 0; i < sizeof(schemas) / sizeof(schemas[0]); i++) {
        hpd_grammar_t *g;
        char err[256];
        const hpd_status_t cst =
            hpd_grammar_from_schema(schemas[i], strlen(schemas[i]), NULL, &g, err, sizeof(err));
        if (i == 7) { /* maxProperties: refused by name */
            assert_int_equal(cst, HPD_ERR_UNSUPPORTED);
            assert_non_null(strstr(err, "maxProperties"));
            continue;
        }
        assert_int_equal(cst, HPD_OK);
        for (uint64_t seed = 0; seed < 4; seed++) {
            const hpd_sampling_t s = {.temperature = seed == 0 ? 0 : 1.0f, .top_p = 1, .seed = seed};
            hpd_request_state_t st[2];
            uint32_t n[2];
            for (int k = 0; k < 2; k++)
                n[k] = run_structured(e, g, s, prompt, out[k], 200, &st[k]);
            assert_int_equal(st[0], HPD_REQ_FINISHED);
            assert_int_equal(n[0], n[1]); /* the same request, the same tokens */
            assert_memory_equal(out[0], out[1], n[0] * sizeof(int32_t));
            size_t len;
            char *doc = doc_of(tok, out[0], n[0], &len);
            hpd_matcher_t *m;
            assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
            if (!hpd_matcher_accept_bytes(m, (const uint8_t *)doc, len))
                fail_msg("schema %zu seed %llu: '%s' is not of the grammar", i,
                         (unsigned long long)seed, doc);
            runs++;
            if (n[0] < 200) { /* it ended: a whole document, and JSON */
                json_error_t je;
                json_t *j = json_loadb(doc, len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
                if (!hpd_matcher_can_end(m) || j == NULL)
                    fail_msg("schema %zu seed %llu: '%s' ended unfinished", i,
                             (unsigned long long)seed, doc);
                json_decref(j);
                whole++;
            }
            hpd_matcher_destroy(m);
            free(doc);
        }
        hpd_grammar_destroy(g);
    }
    assert_true(whole >= runs * 3 / 4);

    /* logprobs: of the logits before the mask (the callback sees them) */
    hpd_engine_destroy(e);
    ep.logits_cb = keep_rows;
    ep.logits_cb_arg = all;
    e = engine_with(&ep, model);
    hpd_grammar_t *g;
    const char *spec = "{\"json_object\": true}";
    assert_int_equal(hpd_grammar_from_spec(spec, strlen(spec), &g, NULL, 0), HPD_OK);
    hpd_request_state_t st;
    uint64_t id;
    hpd_request_params_t p = {.prompt = prompt, .n_prompt = 20, .max_tokens = 12,
                              .sampling = {.top_p = 1}, .grammar = g, .logprobs = true,
                              .top_logprobs = 4, .ignore_eos = true};
    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    const int32_t *toks;
    const hpd_token_logprobs_t *lp;
    uint32_t n, n_lp;
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
    assert_int_equal(hpd_engine_logprobs(e, id, &lp, &n_lp), HPD_OK);
    assert_int_equal(n_lp, n);
    for (uint32_t t = 0; t < n; t++) {
        hpd_token_logprobs_t want;
        hpd_logprobs_compute(all[id - 1].rows[t], 512, toks[t], 4, &want);
        if (memcmp(&lp[t].logprob, &want.logprob, 4) != 0 ||
            memcmp(lp[t].top_ids, want.top_ids, want.n_top * 4) != 0)
            fail_msg("token %u: logprobs are not those of the unmasked logits", t);
    }
    assert_true(first_byte(tok, toks[0]) == '{'); /* forced */
    hpd_engine_release(e, id);
    hpd_grammar_destroy(g);
    hpd_engine_destroy(e);
    ep.logits_cb = NULL;
    ep.prefix_cache = false; /* (reservations below) */
    e = engine_with(&ep, model);

    /* an after token: the tokens up to it are the unconstrained ones */
    int32_t free_out[200], after_out[200];
    hpd_request_params_t fp = {.prompt = prompt, .n_prompt = 20, .max_tokens = 3,
                               .sampling = {.top_p = 1}, .ignore_eos = true};
    assert_int_equal(hpd_engine_submit(e, &fp, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
    memcpy(free_out, toks, 3 * sizeof(int32_t));
    hpd_engine_release(e, id);
    char *after = hpd_grammar_spec_after(spec, strlen(spec), free_out[2]);
    assert_non_null(after);
    assert_int_equal(hpd_grammar_from_spec(after, strlen(after), &g, NULL, 0), HPD_OK);
    free(after);
    n = run_structured(e, g, (hpd_sampling_t){.top_p = 1}, prompt, after_out, 40, &st);
    assert_true(n > 4);
    assert_memory_equal(after_out, free_out, 3 * sizeof(int32_t));
    assert_true(first_byte(tok, after_out[3]) == '{');

    /* a reserved request's first token: one the grammar refuses fails */
    hpd_request_params_t rp = {.prompt = prompt, .n_prompt = 20, .max_tokens = 8,
                               .sampling = {.top_p = 1}, .grammar = g};
    hpd_grammar_destroy(g);
    const char *obj = "{\"json_object\": true}";
    assert_int_equal(hpd_grammar_from_spec(obj, strlen(obj), &g, NULL, 0), HPD_OK);
    rp.grammar = g;
    assert_int_equal(hpd_engine_reserve(e, &rp, &id), HPD_OK);
    assert_int_equal(hpd_engine_start(e, id, hpd_tokenizer_id(tok, "a")), HPD_ERR_INVALID_ARG);
    hpd_engine_release(e, id);
    assert_int_equal(hpd_engine_reserve(e, &rp, &id), HPD_OK);
    assert_int_equal(hpd_engine_start(e, id, hpd_tokenizer_id(tok, "{")), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FINISHED);
    hpd_engine_release(e, id);
    hpd_engine_destroy(e);

    /* no vocabulary: refused */
    ep.vocab = NULL;
    e = engine_with(&ep, model);
    assert_int_equal(hpd_engine_submit(e, &rp, &id), HPD_ERR_UNSUPPORTED);
    hpd_engine_destroy(e);
    hpd_grammar_destroy(g);
    hpd_vocab_destroy(v);
    hpd_tokenizer_destroy(tok);
}

/* One request's tokens (and logprobs' logprob values) for a seed. */
static uint32_t run_one(hpd_engine_t *e, const int32_t *prompt, uint32_t n_prompt, uint64_t seed,
                        float temp, hpd_grammar_t *g, int32_t *out, float *lps)
{
    uint64_t id;
    const int32_t *toks;
    const hpd_token_logprobs_t *lp;
    uint32_t n, n_lp;
    hpd_request_state_t st;
    hpd_request_params_t p = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = 10,
                              .sampling = {.temperature = temp, .top_p = 1, .seed = seed},
                              .ignore_eos = true, .logprobs = true, .grammar = g};
    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    assert_int_equal(hpd_engine_result(e, id, &toks, &n, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FINISHED);
    assert_int_equal(hpd_engine_logprobs(e, id, &lp, &n_lp), HPD_OK);
    memcpy(out, toks, n * sizeof(int32_t));
    for (uint32_t t = 0; t < n; t++)
        lps[t] = lp[t].logprob;
    hpd_engine_release(e, id);
    return n;
}

/* n choices from one prefill: greedy, each is the single answer; seeded,
 * choice c is the single request with seed + c, its logprobs too, with a
 * grammar or without, whether the prompt ends inside a KV block or on its
 * edge, with the prefix cache holding the prompt's blocks or not; every
 * page and slot comes back; too many choices, or choices with replayed
 * tokens, are refused. */
static void test_choices(void **state)
{
    hpd_tokenizer_t *tok;
    hpd_vocab_t *v;
    load_vocab(&tok, &v);
    const char *spec = "{\"json_object\": true}";
    hpd_grammar_t *g;
    assert_int_equal(hpd_grammar_from_spec(spec, strlen(spec), &g, NULL, 0), HPD_OK);
    for (int cache = 0; cache < 2; cache++) {
        hpd_engine_params_t ep;
        hpd_engine_params_init(&ep);
        ep.vocab = v;
        ep.prefix_cache = cache;
        hpd_engine_t *e = engine_with(&ep, model);
        uint32_t pu0, pt, su0, stot;
        hpd_engine_usage(e, &pu0, &pt, &su0, &stot);
        static const uint32_t lens[] = {26, 64, 130};
        for (size_t li = 0; li < 3; li++) {
            int32_t prompt[130];
            prompt_of(prompt, lens[li], 40 + li);
            for (int with_g = 0; with_g < 2; with_g++) {
                for (int sampled = 0; sampled < 2; sampled++) {
                    const uint32_t n_ch = 4;
                    const float temp = sampled ? 1.0f : 0.0f;
                    int32_t want[HPD_MAX_CHOICES][16];
                    float want_lp[HPD_MAX_CHOICES][16];
                    uint32_t want_n[HPD_MAX_CHOICES];
                    for (uint32_t c = 0; c < n_ch; c++)
                        want_n[c] = run_one(e, prompt, lens[li], 5 + (sampled ? c : 0), temp,
                                            with_g ? g : NULL, want[c], want_lp[c]);
                    uint64_t id;
                    hpd_request_params_t p = {.prompt = prompt, .n_prompt = lens[li],
                                              .max_tokens = 10,
                                              .sampling = {.temperature = temp, .top_p = 1,
                                                           .seed = 5},
                                              .ignore_eos = true, .logprobs = true,
                                              .grammar = with_g ? g : NULL, .n = n_ch};
                    assert_int_equal(hpd_engine_submit(e, &p, &id), HPD_OK);
                    assert_int_equal(hpd_engine_run(e), HPD_OK);
                    const uint64_t *ids;
                    uint32_t n_ids;
                    assert_int_equal(hpd_engine_choices(e, id, &ids, &n_ids), HPD_OK);
                    assert_int_equal(n_ids, n_ch);
                    assert_int_equal(ids[0], id);
                    for (uint32_t c = 0; c < n_ch; c++) {
                        const int32_t *toks;
                        const hpd_token_logprobs_t *lp;
                        uint32_t n, n_lp;
                        hpd_request_state_t st;
                        assert_int_equal(hpd_engine_result(e, ids[c], &toks, &n, &st), HPD_OK);
                        assert_int_equal(st, HPD_REQ_FINISHED);
                        assert_int_equal(hpd_engine_logprobs(e, ids[c], &lp, &n_lp), HPD_OK);
                        if (n != want_n[c] || memcmp(toks, want[c], n * sizeof(int32_t)) != 0)
                            fail_msg("prompt %u grammar %d sampled %d cache %d: choice %u is not "
                                     "the single request with seed %u", lens[li], with_g,
                                     sampled, cache, c, 5 + (sampled ? c : 0));
                        for (uint32_t t = 0; t < n; t++)
                            if (memcmp(&lp[t].logprob, &want_lp[c][t], 4) != 0)
                                fail_msg("choice %u token %u: logprob %.9g, the single's %.9g",
                                         c, t, lp[t].logprob, want_lp[c][t]);
                    }
                    hpd_engine_release(e, id); /* the choices with it */
                }
            }
        }
        uint32_t pu, su;
        hpd_engine_usage(e, &pu, &pt, &su, &stot);
        if (!cache) /* (a cache keeps the prompts' blocks) */
            assert_int_equal(pu, pu0);
        assert_int_equal(su, su0);
        /* refused: more choices than the batch, choices with a replay */
        uint64_t id;
        int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        const int32_t rep = 3;
        hpd_request_params_t bad = {.prompt = prompt, .n_prompt = 8, .max_tokens = 4,
                                    .sampling = {.top_p = 1}, .n = 17};
        assert_int_equal(hpd_engine_submit(e, &bad, &id), HPD_ERR_INVALID_ARG);
        bad.n = 2;
        bad.replay = &rep;
        bad.n_replay = 1;
        assert_int_equal(hpd_engine_submit(e, &bad, &id), HPD_ERR_INVALID_ARG);
        hpd_engine_destroy(e);
    }
    hpd_grammar_destroy(g);
    hpd_vocab_destroy(v);
    hpd_tokenizer_destroy(tok);
}

static void test_pool_pressure_and_cancel(void **state)
{
    int32_t ref[N_REQS][32], got[N_REQS][32], prompt[256];
    hpd_engine_params_t ep;
    uint64_t ids[N_REQS], big, victim;

    hpd_engine_params_init(&ep);
    run_batch(&ep, ref);
    hpd_engine_params_init(&ep);
    ep.kv_layout.block_size = 16;
    ep.n_pages = 2 * 14; /* 2 groups x 14 blocks: the longest request (208 tokens) alone */
    ep.n_slots = 2;
    hpd_engine_t *e = engine_with(&ep, model);
    submit_reqs(e, ids);
    prompt_of(prompt, 250, 5);
    hpd_request_params_t huge = {
        .prompt = prompt, .n_prompt = 250, .max_tokens = 10, .sampling = {.top_p = 1}};
    assert_int_equal(hpd_engine_submit(e, &huge, &big), HPD_OK);
    hpd_request_params_t cancelled = {
        .prompt = prompt, .n_prompt = 100, .max_tokens = 20, .sampling = {.top_p = 1}};
    assert_int_equal(hpd_engine_submit(e, &cancelled, &victim), HPD_OK);
    assert_int_equal(hpd_engine_step(e, NULL), HPD_OK);
    assert_int_equal(hpd_engine_cancel(e, victim), HPD_OK);
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    collect_reqs(e, ids, got);
    for (size_t i = 0; i < N_REQS; i++) {
        assert_memory_equal(ref[i], got[i], reqs[i].max_tokens * sizeof(int32_t));
        hpd_engine_release(e, ids[i]);
    }
    hpd_request_state_t st;
    assert_int_equal(hpd_engine_result(e, big, NULL, NULL, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FAILED);
    assert_int_equal(hpd_engine_result(e, victim, NULL, NULL, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FAILED);
    hpd_engine_release(e, big);
    hpd_engine_release(e, victim);
    assert_only_cache_holds(e);
    hpd_engine_destroy(e);
}

/* The defaults engine.h documents, and what an engine would allocate
 * (hpd_engine_plan, which `hpdctl check` and a node at start read): the
 * pools of the engine then created are those bytes (the slot pool one slot
 * more than n_slots: slot 0 is PAD; the checkpoints a slot each); with the
 * prefix cache off no checkpoints and no host tier; a pack size above the
 * model's full-attention layers refused saying so. */
static void test_defaults_and_plan(void **state)
{
    hpd_engine_params_t ep;
    hpd_engine_params_init(&ep);
    assert_int_equal(ep.max_batch, 16);
    assert_int_equal(ep.prefill_chunk, 256);
    assert_int_equal(ep.checkpoint_every, 16);
    assert_int_equal(ep.host_cache_bytes, 512ull << 20);
    assert_true(ep.prefix_cache && ep.step_graphs);
    ep.n_pages = 100;
    ep.n_slots = 7;
    ep.n_checkpoints = 3;
    hpd_engine_plan_t plan;
    char why[200];
    assert_int_equal(hpd_engine_plan(&ep, &model->config, &plan, why, sizeof(why)), HPD_OK);
    hpd_engine_t *e = engine_with(&ep, model);
    hpd_engine_memory_t mem;
    hpd_engine_memory(e, &mem);
    assert_int_equal(plan.n_slots, 7);
    assert_int_equal(plan.n_pages, 100);
    assert_int_equal(plan.kv_pool_bytes, mem.kv_pool_bytes);
    assert_int_equal(plan.slot_pool_bytes, mem.slot_pool_bytes);
    assert_int_equal(mem.slot_pool_bytes, 8 * mem.slot_bytes);
    assert_int_equal(plan.checkpoint_bytes, 3 * mem.slot_bytes);
    assert_int_equal(plan.device_bytes,
                     plan.kv_pool_bytes + plan.slot_pool_bytes + plan.checkpoint_bytes);
    assert_int_equal(plan.host_cache_bytes, 512ull << 20);
    hpd_engine_destroy(e);
    ep.prefix_cache = false;
    assert_int_equal(hpd_engine_plan(&ep, &model->config, &plan, why, sizeof(why)), HPD_OK);
    assert_int_equal(plan.n_checkpoints, 0);
    assert_int_equal(plan.checkpoint_bytes + plan.host_cache_bytes, 0);
    ep.kv_layout.pack_size = 3; /* the model has 2 full-attention layers */
    assert_int_equal(hpd_engine_plan(&ep, &model->config, &plan, why, sizeof(why)),
                     HPD_ERR_INVALID_ARG);
    assert_string_equal(why, "kv pack size 3 is above the model's 2 full-attention layers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_equals_prefill_plus_decode),
        cmocka_unit_test(test_repeatable_and_batch_invariant),
        cmocka_unit_test(test_layouts_and_namings),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_defaults_and_plan),
        cmocka_unit_test(test_stop_tokens),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_structured_outputs),
        cmocka_unit_test(test_choices),
        cmocka_unit_test(test_pool_pressure_and_cancel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
