/* The CPU engine against Hugging Face transformers: hf_reference.json holds,
 * for small random models that hpd-mkmodel regenerates from a seed, what
 * transformers computed (tools/hf_make_reference.py, run by hand). Each model
 * is regenerated from its recorded arguments, run greedy on the recorded
 * prompts, and must give the same tokens and, within a tolerance, the same
 * logits at the last step. The only end-to-end expectation in CI that does
 * not come from this project's own engine. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "model/model.h"
#include "tests/test_helpers.h"

/* transformers and the engine are both fp32 but sum in other orders, and HF
 * runs the chunked delta rule over the whole sequence at every step where
 * the engine decodes with the recurrent step. Measured on the committed
 * reference (15 prompts): rel rms <= 3.9e-6 and max abs / max |logit| <=
 * 2.9e-6; each side is ~1e-6 (<= 2.8e-6) from transformers run in fp64, so
 * that is rounding, not a systematic difference. The bounds give 5x room.
 * For scale: a RoPE theta off by 2x moves the logits by 6e-4 .. 6e-3, a lost
 * decay of the state across 64-token chunks by 5e-3 .. 3e-2; an RMSNorm eps
 * off by 10x (1e-5 for 1e-6, on activations of size ~1) by only 7e-6 .. 3e-5,
 * at the edge of what fp32 can tell apart. */
#define REL_RMS_TOL 2e-5
#define MAX_REL_TOL 2e-5

#define MAX_PROMPTS 16

static json_t *ref;

static int setup(void **state)
{
    json_error_t err;
    ref = json_load_file(HPD_HF_REFERENCE, 0, &err);
    if (ref == NULL) {
        fprintf(stderr, "%s:%d: %s\n", HPD_HF_REFERENCE, err.line, err.text);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    json_decref(ref);
    return 0;
}

static json_t *get(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        fail_msg("%s: missing field '%s'", HPD_HF_REFERENCE, key);
    return v;
}

/* The ints of a JSON array into out (at most cap); returns the count. */
static uint32_t get_ints(json_t *arr, int32_t *out, uint32_t cap)
{
    size_t i;
    json_t *v;
    assert_true(json_is_array(arr) && json_array_size(arr) <= cap);
    json_array_foreach(arr, i, v) {
        assert_true(json_is_integer(v));
        out[i] = (int32_t)json_integer_value(v);
    }
    return (uint32_t)json_array_size(arr);
}

typedef struct {
    uint64_t id;
    uint32_t position; /* of the token whose logits are the last step's */
    float *logits;
    int seen;
} capture_t;

typedef struct {
    capture_t c[MAX_PROMPTS];
    uint32_t n;
} captures_t;

static void keep_last(void *arg, uint64_t id, uint32_t position, const float *logits,
                      uint32_t vocab)
{
    captures_t *cs = arg;
    for (uint32_t i = 0; i < cs->n; i++) {
        if (cs->c[i].id == id && cs->c[i].position == position) {
            memcpy(cs->c[i].logits, logits, vocab * sizeof(float));
            cs->c[i].seen++;
        }
    }
}

/* The largest |got - want| over the largest |want| (a max abs error on the
 * scale of the logits: tied models have logits ~10x larger) and the relative
 * RMS of got - want. False when any value of either is NaN or infinite: the
 * checks must fail on those, and every `<` with a NaN is false (cmocka's
 * assert_float_equal passes on NaN). */
static bool compare(const float *got, const float *want, uint32_t n, double *max_rel_p,
                    double *rel_rms_p, uint32_t *bad_p)
{
    double max_abs = 0, max_want = 0, num = 0, den = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i])) {
            *bad_p = i;
            return false;
        }
        const double d = (double)got[i] - want[i];
        max_abs = fmax(max_abs, fabs(d));
        max_want = fmax(max_want, fabs(want[i]));
        num += d * d;
        den += (double)want[i] * want[i];
    }
    *max_rel_p = max_want > 0 ? max_abs / max_want : max_abs;
    *rel_rms_p = den > 0 ? sqrt(num / den) : sqrt(num);
    return true;
}

/* The weights the engine got are those transformers ran: the float64 sum and
 * sum of squares of every weight (the fused layouts only reorder them) match
 * those of the files. A mismatch is either a changed hpd-mkmodel (regenerate
 * the reference) or a loader that converts or maps a tensor wrongly. */
static void check_weights(hpd_model_t *m, json_t *want, const char *name)
{
    hpd_model_tensor_t t[HPD_MODEL_MAX_TENSORS];
    const uint32_t n = hpd_model_tensors(m, t);
    double sum = 0, sum_sq = 0;
    uint64_t count = 0;

    for (uint32_t i = 0; i < n; i++) {
        if (t[i].is_scale)
            continue; /* folded into its matrix: the files' sums are of q * scale too */
        for (uint64_t e = 0; e < t[i].elements; e++) {
            const float x = hpd_model_tensor_value(m, &t[i], e);
            sum += x;
            sum_sq += (double)x * x;
        }
        count += t[i].elements;
    }
    const double want_sum = json_number_value(get(want, "sum"));
    const double want_sq = json_number_value(get(want, "sum_sq"));
    /* float64 sums of ~1e6 values in another order differ by ~1e-10; one
     * weight changed by one bf16 ulp moves them by ~1e-4 or more */
    if ((json_int_t)count != json_integer_value(get(want, "count")) ||
        !(fabs(sum - want_sum) <= 1e-6) || !(fabs(sum_sq - want_sq) <= 1e-9 * want_sq))
        fail_msg("%s: the loaded weights (count %" PRIu64 ", sum %.12g, sum_sq %.12g) "
                 "are not those transformers ran (count %" JSON_INTEGER_FORMAT
                 ", sum %.12g, sum_sq %.12g): the loader maps or converts a tensor wrongly, "
                 "or hpd-mkmodel changed (then regenerate with tools/hf_make_reference.py)",
                 name, count, sum, sum_sq, json_integer_value(get(want, "count")), want_sum,
                 want_sq);
}

/* The prompts again at TP tp with CPU ranks (hpd_model_load_tp): the same
 * tokens as transformers and the last-step logits of TP 1 (one), bit for
 * bit: so the check against transformers holds at every degree. */
static void same_at_tp(const char *dir, uint32_t tp, json_t *prompts, const captures_t *one,
                       const char *name)
{
    hpd_model_t *ms[4] = {0};
    hpd_backend_t *bs[4] = {0};
    hpd_engine_t *e = NULL;
    hpd_engine_params_t ep;
    captures_t caps = {.n = one->n};
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};

    assert_int_equal(hpd_model_load_tp(dir, tp, false, ms), HPD_OK);
    const uint32_t vocab = ms[0]->config.vocab_size;
    for (uint32_t r = 0; r < tp; r++)
        assert_int_equal(hpd_backend_cpu_create(&bp, &bs[r]), HPD_OK);
    hpd_engine_params_init(&ep);
    ep.model = ms[0];
    ep.backend = bs[0];
    ep.tp_models = (const hpd_model_t *const *)ms;
    ep.tp_backends = bs;
    ep.logits_cb = keep_last;
    ep.logits_cb_arg = &caps;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_OK);
    int32_t want[MAX_PROMPTS][64];
    uint32_t n_want[MAX_PROMPTS];
    for (uint32_t p = 0; p < caps.n; p++) {
        json_t *pr = json_array_get(prompts, p);
        int32_t prompt[1024];
        const uint32_t n_prompt = get_ints(get(pr, "prompt"), prompt, 1024);
        n_want[p] = get_ints(get(pr, "tokens"), want[p], 64);
        hpd_request_params_t rp = {.prompt = prompt, .n_prompt = n_prompt,
                                   .max_tokens = n_want[p],
                                   .sampling = {.temperature = 0, .top_p = 1}};
        caps.c[p].position = one->c[p].position;
        assert_non_null(caps.c[p].logits = malloc(vocab * sizeof(float)));
        assert_int_equal(hpd_engine_submit(e, &rp, &caps.c[p].id), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    for (uint32_t p = 0; p < caps.n; p++) {
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t rs;
        assert_int_equal(hpd_engine_result(e, caps.c[p].id, &toks, &n, &rs), HPD_OK);
        assert_int_equal(rs, HPD_REQ_FINISHED);
        if (n != n_want[p] || memcmp(toks, want[p], n * sizeof(int32_t)) != 0)
            fail_msg("%s at tp %u, prompt %u: the tokens are not transformers'", name, tp, p);
        assert_int_equal(caps.c[p].seen, 1);
        if (memcmp(caps.c[p].logits, one->c[p].logits, vocab * sizeof(float)) != 0)
            fail_msg("%s at tp %u, prompt %u: the last-step logits are not tp 1's bits", name,
                     tp, p);
        free(caps.c[p].logits);
    }
    print_message("%s: tp %u gives tp 1's tokens and logits\n", name, tp);
    hpd_engine_destroy(e);
    for (uint32_t r = 0; r < tp; r++) {
        hpd_backend_destroy(bs[r]);
        hpd_model_destroy(ms[r]);
    }
}

static void run_case(void **state)
{
    json_t *c = *state;
    const char *name = json_string_value(get(c, "name"));
    const char *args = json_string_value(get(c, "mkmodel_args"));
    json_t *prompts = get(c, "prompts");
    char root[256], dir[512];
    hpd_model_t *m = NULL;
    hpd_backend_t *be = NULL;
    hpd_engine_t *e = NULL;
    hpd_engine_params_t ep;
    captures_t caps = {.n = (uint32_t)json_array_size(prompts)};
    int32_t want_toks[MAX_PROMPTS][64];
    uint32_t n_want[MAX_PROMPTS];

    assert_non_null(name);
    assert_non_null(args);
    assert_true(caps.n > 0 && caps.n <= MAX_PROMPTS);
    test_tmpdir(root, sizeof(root), "hfref");
    snprintf(dir, sizeof(dir), "%s/model", root);
    const int mk = test_mkmodel(dir, args);
    const hpd_status_t st = mk == 0 ? hpd_model_load(dir, &m) : HPD_ERR_IO;
    assert_int_equal(mk, 0);
    assert_int_equal(st, HPD_OK);
    check_weights(m, get(c, "weights"), name);

    const uint32_t vocab = m->config.vocab_size;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    hpd_engine_params_init(&ep);
    ep.model = m;
    ep.backend = be;
    ep.logits_cb = keep_last;
    ep.logits_cb_arg = &caps;
    assert_int_equal(hpd_engine_create(&ep, &e), HPD_OK);

    /* all prompts in one batch, as a server runs them */
    for (uint32_t p = 0; p < caps.n; p++) {
        json_t *pr = json_array_get(prompts, p);
        int32_t prompt[1024];
        const uint32_t n_prompt = get_ints(get(pr, "prompt"), prompt, 1024);
        n_want[p] = get_ints(get(pr, "tokens"), want_toks[p], 64);
        assert_true(n_prompt > 0 && n_want[p] > 0);
        assert_int_equal(json_array_size(get(pr, "last_logits")), vocab);
        hpd_request_params_t rp = {.prompt = prompt, .n_prompt = n_prompt,
                                   .max_tokens = n_want[p],
                                   .sampling = {.temperature = 0, .top_p = 1}};
        /* the last step computes the logits of the token before the last one generated */
        caps.c[p].position = n_prompt + n_want[p] - 2;
        assert_non_null(caps.c[p].logits = malloc(vocab * sizeof(float)));
        assert_int_equal(hpd_engine_submit(e, &rp, &caps.c[p].id), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(e), HPD_OK);

    for (uint32_t p = 0; p < caps.n; p++) {
        json_t *pr = json_array_get(prompts, p);
        const uint32_t n_prompt = (uint32_t)json_array_size(get(pr, "prompt"));
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t rs;

        assert_int_equal(hpd_engine_result(e, caps.c[p].id, &toks, &n, &rs), HPD_OK);
        assert_int_equal(rs, HPD_REQ_FINISHED);
        assert_int_equal(n, n_want[p]);
        for (uint32_t i = 0; i < n; i++)
            if (toks[i] != want_toks[p][i])
                fail_msg("%s, prompt of %u: greedy token %u is %d, transformers gave %d "
                         "(margin %.3g)",
                         name, n_prompt, i, toks[i], want_toks[p][i],
                         json_number_value(json_array_get(get(pr, "margins"), i)));
        assert_int_equal(caps.c[p].seen, 1);

        float want[4096];
        size_t i;
        json_t *v;
        assert_true(vocab <= 4096);
        json_array_foreach(get(pr, "last_logits"), i, v) {
            assert_true(json_is_number(v));
            want[i] = (float)json_number_value(v);
        }
        double max_rel, rel_rms;
        uint32_t bad;
        if (!compare(caps.c[p].logits, want, vocab, &max_rel, &rel_rms, &bad))
            fail_msg("%s, prompt of %u: logit %u is not finite (engine %g, transformers %g)",
                     name, n_prompt, bad, caps.c[p].logits[bad], want[bad]);
        print_message("%s, prompt of %u: %u tokens agree; last-step logits: max abs / max "
                      "|logit| %.2e, rel rms %.2e\n", name, n_prompt, n, max_rel, rel_rms);
        if (!(rel_rms <= REL_RMS_TOL && max_rel <= MAX_REL_TOL))
            fail_msg("%s, prompt of %u: last-step logits differ from transformers': max abs / "
                     "max |logit| %.3e (tolerance %.1e), rel rms %.3e (tolerance %.1e)",
                     name, n_prompt, max_rel, MAX_REL_TOL, rel_rms, REL_RMS_TOL);
    }
    assert_int_equal(hpd_engine_audit(e), 0);
    /* every TP degree the model takes, on CPU ranks */
    uint32_t degrees = 0;
    for (uint32_t tp = 2; tp <= 4; tp *= 2) {
        char why[200];
        if (hpd_shard_tp_ok(&m->config, tp, why, sizeof(why))) {
            same_at_tp(dir, tp, prompts, &caps, name);
            degrees++;
        }
    }
    assert_true(degrees > 0); /* each case runs at TP 2 at least */
    test_rmtree(root);
    for (uint32_t p = 0; p < caps.n; p++)
        free(caps.c[p].logits);
    hpd_engine_destroy(e);
    hpd_backend_destroy(be);
    hpd_model_destroy(m);
}

/* The reference covers both families and the three namings (Qwen3-Next's
 * grouped in_proj_qkvz/ba, Qwen3.5's split projections, and the multimodal
 * wrapper's model.language_model prefix), and a low-precision dtype on disk;
 * a regenerated file that lost one fails here. */
static void test_coverage(void **state)
{
    static const char *const needed[] = {"--arch qwen3_next", "--arch qwen3_5_text",
                                         "--arch qwen3_5 ", "--dtype bf16", "--dtype f32",
                                         "--tie"};
    json_t *cases = get(ref, "cases");

    for (size_t k = 0; k < sizeof(needed) / sizeof(needed[0]); k++) {
        bool found = false;
        size_t i;
        json_t *c;
        json_array_foreach(cases, i, c) {
            char args[1024];
            /* a trailing space so "--arch qwen3_5 " does not match qwen3_5_text */
            snprintf(args, sizeof(args), "%s ", json_string_value(get(c, "mkmodel_args")));
            found |= strstr(args, needed[k]) != NULL;
        }
        if (!found)
            fail_msg("%s: no case with %s", HPD_HF_REFERENCE, needed[k]);
    }
}

int main(void)
{
    enum { MAX_CASES = 32 };
    struct CMUnitTest tests[MAX_CASES + 1];
    json_t *c;
    size_t i, n = 0;

    if (setup(NULL) != 0)
        return 1;
    tests[n++] = (struct CMUnitTest){.name = "coverage", .test_func = test_coverage};
    json_array_foreach(json_object_get(ref, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        if (n == MAX_CASES + 1 || name == NULL) {
            fprintf(stderr, "%s: case %zu: no name, or more than %d cases\n",
                    HPD_HF_REFERENCE, i, MAX_CASES);
            teardown(NULL);
            return 1;
        }
        /* one test per case, named by it, so a failure says which model */
        tests[n++] = (struct CMUnitTest){.name = name, .test_func = run_case,
                                         .initial_state = c};
    }
    int rc = _cmocka_run_group_tests("hf_reference", tests, n, NULL, NULL);
    teardown(NULL);
    return rc;
}
