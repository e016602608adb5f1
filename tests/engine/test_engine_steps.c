/* The engine's recorded steps (hpd_engine_forward_step, engine parameter
 * step_graphs) against a backend that records them: the CPU backend's ops
 * behind a table whose step_begin / step_end keep count, and whose calls
 * that wait for the device (sync, to_host, from_host, fence_record, alloc,
 * host_register) count as violations inside a step, as a CUDA stream
 * capture would refuse them. Checked: every decode-only step is recorded
 * (its bucket its row count) and no other, for a dense and for an MoE model
 * (whose routing stays in backend memory: moe_route, gemm_grouped); none
 * with step_graphs off or with a layer callback (a prefill node's push
 * records fences); the same tokens as without; a backend that declines runs
 * the steps as they come; an op that fails inside a step fails the step
 * once, without running it again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "tests/engine/fixture.h"

#define N_REQ 3
#define MAX_TOKENS 6

static struct {
    hpd_backend_ops_t ops;    /* the CPU backend's, with the overrides below */
    const hpd_backend_ops_t *cpu;
    bool in_step, decline;
    uint32_t begins, ends, ends_not_run, violations, ops_in_steps;
    uint32_t bucket_rows_mismatch, last_bucket;
    int fail_gemm_in_step; /* > 0: the Nth GEMM inside a step fails */
    uint32_t gemms_in_steps;
} rec;

static hpd_status_t rec_step_begin(hpd_backend_t *b, uint32_t bucket)
{
    (void)b;
    if (rec.decline)
        return HPD_ERR_UNSUPPORTED;
    assert_false(rec.in_step); /* never nested */
    rec.in_step = true;
    rec.begins++;
    rec.last_bucket = bucket;
    return HPD_OK;
}

static hpd_status_t rec_step_end(hpd_backend_t *b, bool run, bool *ran_p)
{
    (void)b;
    assert_true(rec.in_step);
    rec.in_step = false;
    rec.ends++;
    rec.ends_not_run += !run;
    *ran_p = run;
    return HPD_OK;
}

/* what waits for the device: a violation inside a step */
#define REC_WAITS(name, sig, args)                                                         \
    static hpd_status_t rec_##name sig                                                     \
    {                                                                                      \
        rec.violations += rec.in_step;                                                     \
        return rec.cpu->name args;                                                         \
    }
REC_WAITS(to_host, (hpd_backend_t *b, void *h, const void *s, size_t n), (b, h, s, n))
REC_WAITS(from_host, (hpd_backend_t *b, void *d, const void *h, size_t n), (b, d, h, n))
REC_WAITS(alloc, (hpd_backend_t *b, size_t n, void **p), (b, n, p))

static hpd_status_t rec_sync(hpd_backend_t *b)
{
    rec.violations += rec.in_step;
    return rec.cpu->sync != NULL ? rec.cpu->sync(b) : HPD_OK;
}

static hpd_status_t rec_fence_record(hpd_backend_t *b, void **fence_p)
{
    rec.violations += rec.in_step;
    *fence_p = NULL;
    return rec.cpu->fence_record != NULL ? rec.cpu->fence_record(b, fence_p) : HPD_OK;
}

static hpd_status_t rec_host_register(hpd_backend_t *b, void *p, size_t n)
{
    rec.violations += rec.in_step;
    return rec.cpu->host_register != NULL ? rec.cpu->host_register(b, p, n) : HPD_OK;
}

static hpd_status_t rec_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    if (rec.in_step) {
        rec.ops_in_steps++;
        if (++rec.gemms_in_steps == (uint32_t)rec.fail_gemm_in_step)
            return HPD_ERR_INTERNAL;
    }
    return rec.cpu->gemm(b, a);
}

/* the step's first op: its rows are the bucket's */
static hpd_status_t rec_embed(hpd_backend_t *b, const hpd_embed_args_t *a)
{
    if (rec.in_step && a->n != rec.last_bucket)
        rec.bucket_rows_mismatch++;
    return rec.cpu->embed(b, a);
}

static hpd_backend_t rec_be;

/* The recording backend says its memory is not the host's (as a GPU's), so
 * that the engine must not read what the ops wrote; its grouped GEMM reads
 * first itself (it is host memory underneath), a recorded GEMM per group. */
static hpd_status_t rec_gemm_grouped(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a)
{
    hpd_backend_ops_t host_ops = rec.ops;
    host_ops.host_memory = true;
    host_ops.gemm_grouped = NULL;
    hpd_backend_t host = {.ops = &host_ops, .ctx = b->ctx};
    return hpd_gemm_grouped(&host, a);
}

static void rec_reset(void)
{
    const hpd_backend_ops_t *cpu = be->ops;
    memset(&rec, 0, sizeof(rec));
    rec.cpu = cpu;
    rec.ops = *cpu;
    rec.ops.name = "cpu-recording";
    rec.ops.step_begin = rec_step_begin;
    rec.ops.step_end = rec_step_end;
    rec.ops.sync = rec_sync;
    rec.ops.to_host = rec_to_host;
    rec.ops.from_host = rec_from_host;
    rec.ops.alloc = rec_alloc;
    rec.ops.fence_record = rec_fence_record;
    rec.ops.host_register = rec_host_register;
    rec.ops.gemm = rec_gemm;
    rec.ops.embed = rec_embed;
    rec.ops.host_memory = false;
    rec.ops.gemm_grouped = rec_gemm_grouped;
    rec_be = (hpd_backend_t){.ops = &rec.ops, .ctx = be->ctx};
}

static int setup(void **state)
{
    (void)state;
    return engine_fixture_setup("engine-steps", ENGINE_TEST_SMALL);
}

static int teardown(void **state)
{
    (void)state;
    return engine_fixture_teardown();
}

static void layer_cb(void *arg, uint32_t layer, const hpd_engine_step_item_t *items, uint32_t n)
{
    (void)arg, (void)layer, (void)items, (void)n;
}

typedef struct {
    hpd_model_t *model;
    bool graphs, with_layer_cb, one_at_a_time;
    bool may_fail; /* a step may fail (hpd_engine_run then says so) */
} run_t;

/* N_REQ requests of 20 + 9 r tokens; their tokens into out, the stats into
 * *stats_p; each request's final state into states */
static void run(const run_t *r, int32_t out[N_REQ][MAX_TOKENS], hpd_engine_stats_t *stats_p,
                hpd_request_state_t states[N_REQ])
{
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    uint64_t ids[N_REQ];
    hpd_engine_params_init(&ep);
    ep.model = r->model;
    ep.backend = &rec_be;
    ep.max_context = 256;
    ep.prefill_chunk = 64;
    ep.prefix_cache = false;
    ep.step_graphs = r->graphs;
    if (r->with_layer_cb)
        ep.layer_cb = layer_cb;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_OK);
    for (uint32_t q = 0; q < N_REQ; q++) {
        int32_t prompt[64];
        const uint32_t n = 20 + 9 * q;
        for (uint32_t i = 0; i < n; i++)
            prompt[i] = (int32_t)((q * 131 + i * 17) % 512);
        hpd_request_params_t rp = {
            .prompt = prompt, .n_prompt = n, .max_tokens = MAX_TOKENS, .sampling = {.top_p = 1}};
        assert_int_equal(hpd_engine_submit(e, &rp, &ids[q]), HPD_OK);
        if (r->one_at_a_time) {
            const hpd_status_t rs = hpd_engine_run(e);
            assert_true(rs == HPD_OK || r->may_fail);
        }
    }
    const hpd_status_t rs = hpd_engine_run(e);
    assert_true(rs == HPD_OK || r->may_fail);
    for (uint32_t q = 0; q < N_REQ; q++) {
        const int32_t *toks;
        uint32_t n = 0;
        assert_int_equal(hpd_engine_result(e, ids[q], &toks, &n, &states[q]), HPD_OK);
        memset(out[q], 0xff, sizeof(out[q]));
        if (states[q] == HPD_REQ_FINISHED) {
            assert_int_equal(n, MAX_TOKENS);
            memcpy(out[q], toks, sizeof(out[q]));
        }
    }
    hpd_engine_stats(e, stats_p);
    hpd_engine_destroy(e);
}

static void test_decode_steps_recorded(void **state)
{
    (void)state;
    static int32_t ref[N_REQ][MAX_TOKENS], got[N_REQ][MAX_TOKENS];
    hpd_request_state_t st[N_REQ];
    hpd_engine_stats_t s_off, s_on;
    for (int alone = 0; alone < 2; alone++) {
        rec_reset();
        run(&(run_t){.model = model, .one_at_a_time = alone}, ref, &s_off, st);
        assert_int_equal(rec.begins, 0);
        assert_int_equal(s_off.graph_steps, 0);
        rec_reset();
        run(&(run_t){.model = model, .graphs = true, .one_at_a_time = alone}, got, &s_on, st);
        assert_memory_equal(got, ref, sizeof(ref));
        print_message("%s: %u of %llu steps recorded, %llu decode-only; %u GEMMs inside them\n",
                      alone ? "one at a time" : "all at once", rec.begins,
                      (unsigned long long)s_on.steps, (unsigned long long)s_on.decode_steps,
                      rec.ops_in_steps);
        assert_true(s_on.decode_steps > 0);
        assert_int_equal(rec.begins, s_on.decode_steps);
        assert_int_equal(rec.ends, rec.begins);
        assert_int_equal(rec.ends_not_run, 0);
        assert_int_equal(s_on.graph_steps, s_on.decode_steps);
        assert_int_equal(rec.violations, 0);
        assert_int_equal(rec.bucket_rows_mismatch, 0);
        assert_true(rec.ops_in_steps > 0);
        if (alone) /* the last step decodes the last request alone */
            assert_int_equal(rec.last_bucket, 1);
    }
}

static void test_not_recorded(void **state)
{
    (void)state;
    static int32_t ref[N_REQ][MAX_TOKENS], got[N_REQ][MAX_TOKENS];
    hpd_request_state_t st[N_REQ];
    hpd_engine_stats_t s;
    /* a layer callback: the steps run as they come */
    rec_reset();
    run(&(run_t){.model = model, .graphs = true, .with_layer_cb = true}, got, &s, st);
    assert_int_equal(rec.begins, 0);
    assert_int_equal(s.graph_steps, 0);
    assert_int_equal(rec.violations, 0);
    /* a backend that declines: the same tokens, nothing recorded */
    rec_reset();
    run(&(run_t){.model = model}, ref, &s, st);
    rec_reset();
    rec.decline = true;
    run(&(run_t){.model = model, .graphs = true}, got, &s, st);
    assert_memory_equal(got, ref, sizeof(ref));
    assert_int_equal(s.graph_steps, 0);
    assert_int_equal(rec.ends, 0);
}

/* An MoE model's decode steps are recorded too: its routing and expert
 * GEMMs never wait for the host inside them (a to_host of the router's
 * logits would count as a violation), with the same tokens as without */
static void test_moe_steps_recorded(void **state)
{
    (void)state;
    static int32_t ref[N_REQ][MAX_TOKENS], got[N_REQ][MAX_TOKENS];
    hpd_request_state_t st[N_REQ];
    hpd_engine_stats_t s_off, s_on;
    char dir[512];
    hpd_model_t *moe;
    snprintf(dir, sizeof(dir), "%s/moe", root);
    assert_int_equal(test_mkmodel(dir, ENGINE_TEST_SMALL " --experts 4 --experts-per-tok 2"), 0);
    assert_int_equal(hpd_model_load(dir, &moe), HPD_OK);
    rec_reset();
    run(&(run_t){.model = moe}, ref, &s_off, st);
    rec_reset();
    run(&(run_t){.model = moe, .graphs = true}, got, &s_on, st);
    assert_memory_equal(got, ref, sizeof(ref));
    assert_true(s_on.decode_steps > 0);
    assert_int_equal(rec.begins, s_on.decode_steps);
    assert_int_equal(s_on.graph_steps, s_on.decode_steps);
    assert_int_equal(rec.violations, 0);
    hpd_model_destroy(moe);
}

/* an op that fails inside a recorded step: step_end(run = false) once, the
 * step's requests fail, and the step is not run again (its GEMMs would be
 * counted twice) */
static void test_failed_op_in_step(void **state)
{
    (void)state;
    int32_t out[N_REQ][MAX_TOKENS];
    hpd_request_state_t st[N_REQ];
    hpd_engine_stats_t s;
    rec_reset();
    rec.fail_gemm_in_step = 3; /* in the first recorded step */
    run(&(run_t){.model = model, .graphs = true, .one_at_a_time = true, .may_fail = true}, out,
        &s, st);
    assert_int_equal(rec.ends_not_run, 1);
    assert_int_equal(st[0], HPD_REQ_FAILED); /* the first request was decoding alone */
    assert_int_equal(st[1], HPD_REQ_FINISHED);
    assert_int_equal(st[2], HPD_REQ_FINISHED);
    assert_int_equal(s.graph_steps + 1, rec.begins);
    /* the failed step's GEMMs: 3 (the third failed), none again outside */
    assert_int_equal(rec.violations, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_steps_recorded),
        cmocka_unit_test(test_not_recorded),
        cmocka_unit_test(test_moe_steps_recorded),
        cmocka_unit_test(test_failed_op_in_step),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
