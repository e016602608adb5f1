/* The gated delta rule: chunked (WY/UT) vs recurrent vs a double-precision
 * reference, and bit-identical resumption on the absolute 64-token grid. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/backend.h"
#include "tests/test_helpers.h"

typedef struct {
    uint32_t T, nk, nv, dk, dv;
    float *q, *k, *v, *g, *beta; /* q, k: [T][nk][dk]; v: [T][nv][dv]; g, beta: [T][nv] */
    float *state0;               /* [nv][dk][dv] */
} inputs_t;

static void make_inputs(inputs_t *in, uint32_t T, uint32_t nk, uint32_t nv, uint32_t dk,
                        uint32_t dv, uint64_t seed, float decay_scale)
{
    in->T = T, in->nk = nk, in->nv = nv, in->dk = dk, in->dv = dv;
    in->q = malloc((size_t)T * nk * dk * sizeof(float));
    in->k = malloc((size_t)T * nk * dk * sizeof(float));
    in->v = malloc((size_t)T * nv * dv * sizeof(float));
    in->g = malloc((size_t)T * nv * sizeof(float));
    in->beta = malloc((size_t)T * nv * sizeof(float));
    in->state0 = malloc((size_t)nv * dk * dv * sizeof(float));
    test_fill(in->q, (size_t)T * nk * dk, seed, 1.0f);
    test_fill(in->k, (size_t)T * nk * dk, seed + 1, 1.0f);
    test_fill(in->v, (size_t)T * nv * dv, seed + 2, 1.0f);
    test_fill(in->state0, (size_t)nv * dk * dv, seed + 3, 0.5f);
    /* as the model feeds it: q, k L2-normalised, q scaled by dk^-0.5 */
    for (uint32_t r = 0; r < T * nk; r++) {
        float *q = in->q + (size_t)r * dk, *k = in->k + (size_t)r * dk;
        double sq = 0, sk = 0;
        for (uint32_t d = 0; d < dk; d++)
            sq += q[d] * q[d], sk += k[d] * k[d];
        for (uint32_t d = 0; d < dk; d++) {
            q[d] = (float)(q[d] / sqrt(sq + 1e-6) / sqrt((double)dk));
            k[d] = (float)(k[d] / sqrt(sk + 1e-6));
        }
    }
    for (uint32_t i = 0; i < T * nv; i++) {
        in->g[i] = -decay_scale * test_uniform(seed + 4, i);
        in->beta[i] = 1.0f / (1.0f + expf(-test_gauss(seed + 5, i)));
    }
}

static void free_inputs(inputs_t *in)
{
    free(in->q), free(in->k), free(in->v), free(in->g), free(in->beta), free(in->state0);
}

/* Runs rows [row0, row0 + n) of the inputs as one sequence at start_pos. */
static void run(hpd_backend_t *be, const inputs_t *in, bool chunked, uint32_t row0, uint32_t n,
                uint32_t start_pos, float *state, float *out)
{
    hpd_seq_t seq = {.n_tokens = n, .start_pos = start_pos};
    float *states[1] = {state};
    hpd_gdn_args_t a = {
        .q = {.p = in->q + (size_t)row0 * in->nk * in->dk, .ld = in->nk * in->dk, .hs = in->dk},
        .k = {.p = in->k + (size_t)row0 * in->nk * in->dk, .ld = in->nk * in->dk, .hs = in->dk},
        .v = {.p = in->v + (size_t)row0 * in->nv * in->dv, .ld = in->nv * in->dv, .hs = in->dv},
        .g = in->g + (size_t)row0 * in->nv,
        .beta = in->beta + (size_t)row0 * in->nv,
        .out = {.p = out + (size_t)row0 * in->nv * in->dv, .ld = in->nv * in->dv, .hs = in->dv},
        .nk = in->nk,
        .nv = in->nv,
        .dk = in->dk,
        .dv = in->dv,
        .states = states,
        .seqs = &seq,
        .n_seqs = 1};
    assert_int_equal(chunked ? hpd_gdn_chunked(be, &a) : hpd_gdn_recurrent(be, &a), HPD_OK);
}

/* The recurrence in double precision, straight from the definition. */
static void reference(const inputs_t *in, double *S, float *out)
{
    const uint32_t dk = in->dk, dv = in->dv, r = in->nv / in->nk;
    for (uint32_t t = 0; t < in->T; t++) {
        for (uint32_t h = 0; h < in->nv; h++) {
            const float *q = in->q + ((size_t)t * in->nk + h / r) * dk;
            const float *k = in->k + ((size_t)t * in->nk + h / r) * dk;
            const float *v = in->v + ((size_t)t * in->nv + h) * dv;
            double *s = S + (size_t)h * dk * dv, u[512];
            const double decay = exp((double)in->g[t * in->nv + h]);
            const double beta = in->beta[t * in->nv + h];
            for (uint32_t i = 0; i < dk * dv; i++)
                s[i] *= decay;
            for (uint32_t j = 0; j < dv; j++) {
                double m = 0;
                for (uint32_t i = 0; i < dk; i++)
                    m += s[i * dv + j] * k[i];
                u[j] = beta * (v[j] - m);
            }
            for (uint32_t i = 0; i < dk; i++)
                for (uint32_t j = 0; j < dv; j++)
                    s[i * dv + j] += k[i] * u[j];
            for (uint32_t j = 0; j < dv; j++) {
                double o = 0;
                for (uint32_t i = 0; i < dk; i++)
                    o += s[i * dv + j] * q[i];
                out[((size_t)t * in->nv + h) * dv + j] = (float)o;
            }
        }
    }
}

static hpd_backend_t *cpu(void)
{
    hpd_backend_params_t p = {.device = "cpu", .n_threads = 2};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_cpu_create(&p, &be), HPD_OK);
    return be;
}

static void check_shape(uint32_t T, uint32_t nk, uint32_t nv, uint32_t dk, uint32_t dv,
                        float decay_scale)
{
    hpd_backend_t *be = cpu();
    inputs_t in;
    make_inputs(&in, T, nk, nv, dk, dv, 1000 + T, decay_scale);
    const size_t so = (size_t)T * nv * dv, ss = (size_t)nv * dk * dv;
    float *out_c = calloc(so, sizeof(float)), *out_r = calloc(so, sizeof(float));
    float *out_ref = calloc(so, sizeof(float));
    float *st_c = malloc(ss * sizeof(float)), *st_r = malloc(ss * sizeof(float));
    float *st_ref_f = malloc(ss * sizeof(float));
    double *st_ref = malloc(ss * sizeof(double));

    memcpy(st_c, in.state0, ss * sizeof(float));
    memcpy(st_r, in.state0, ss * sizeof(float));
    for (size_t i = 0; i < ss; i++)
        st_ref[i] = in.state0[i];
    run(be, &in, true, 0, T, 0, st_c, out_c);
    run(be, &in, false, 0, T, 0, st_r, out_r);
    reference(&in, st_ref, out_ref);
    for (size_t i = 0; i < ss; i++)
        st_ref_f[i] = (float)st_ref[i];

    double e_cr = test_rel_rms(out_c, out_r, so), e_sc = test_rel_rms(st_c, st_r, ss);
    double e_rr = test_rel_rms(out_r, out_ref, so), e_cref = test_rel_rms(out_c, out_ref, so);
    print_message("T=%u nk=%u nv=%u dk=%u dv=%u decay<=%g: chunked/recurrent out %.2e state "
                  "%.2e; recurrent/ref %.2e; chunked/ref %.2e\n",
                  T, nk, nv, dk, dv, decay_scale, e_cr, e_sc, e_rr, e_cref);
    assert_true(e_cr < 1e-5);
    assert_true(e_sc < 1e-5);
    assert_true(e_rr < 1e-5);
    assert_true(e_cref < 1e-5);
    assert_rel_rms_below(st_r, st_ref_f, ss, 1e-5);

    free(out_c), free(out_r), free(out_ref), free(st_c), free(st_r), free(st_ref), free(st_ref_f);
    free_inputs(&in);
    hpd_backend_destroy(be);
}

static void test_chunked_matches_recurrent(void **state)
{
    /* lengths that are and are not multiples of 64; r = 1 and 2; dk != dv */
    const uint32_t lengths[] = {1, 17, 63, 64, 65, 130, 200};
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++)
        check_shape(lengths[i], 2, 4, 32, 48, 1.0f);
    check_shape(150, 2, 2, 64, 64, 0.2f);
    check_shape(100, 1, 3, 16, 8, 4.0f); /* strong decay */
}

/* Resuming from the state at a multiple of 64 gives bit-identical outputs and
 * final state to one pass; so does splitting the run at any multiple of 64. */
static void test_resume_bit_identical(void **state)
{
    hpd_backend_t *be = cpu();
    inputs_t in;
    const uint32_t T = 211, nk = 2, nv = 4, dk = 32, dv = 32;
    make_inputs(&in, T, nk, nv, dk, dv, 77, 1.0f);
    const size_t so = (size_t)T * nv * dv, ss = (size_t)nv * dk * dv;
    float *out1 = calloc(so, sizeof(float)), *out2 = calloc(so, sizeof(float));
    float *s1 = malloc(ss * sizeof(float)), *s2 = malloc(ss * sizeof(float));

    memcpy(s1, in.state0, ss * sizeof(float));
    run(be, &in, true, 0, T, 0, s1, out1);
    const uint32_t splits[][3] = {{64, 128, 0}, {128, 0, 0}, {64, 192, 0}};
    for (size_t c = 0; c < 3; c++) {
        uint32_t pos = 0;
        memcpy(s2, in.state0, ss * sizeof(float));
        memset(out2, 0, so * sizeof(float));
        for (size_t i = 0; i <= 2; i++) {
            uint32_t end = (i < 2 && splits[c][i] != 0) ? splits[c][i] : T;
            if (end <= pos)
                continue;
            run(be, &in, true, pos, end - pos, pos, s2, out2);
            pos = end;
        }
        assert_memory_equal(out1, out2, so * sizeof(float));
        assert_memory_equal(s1, s2, ss * sizeof(float));
    }
    free(out1), free(out2), free(s1), free(s2);
    free_inputs(&in);
    hpd_backend_destroy(be);
}

/* A batch of sequences gives each sequence the bits it gets alone. */
static void test_batch_invariant(void **state)
{
    hpd_backend_t *be = cpu();
    inputs_t in;
    const uint32_t T = 150, nk = 2, nv = 4, dk = 32, dv = 16;
    make_inputs(&in, T, nk, nv, dk, dv, 5, 1.0f);
    const size_t so = (size_t)T * nv * dv, ss = (size_t)nv * dk * dv;
    float *alone = calloc(so, sizeof(float)), *batch = calloc(so, sizeof(float));
    float *sa[2], *sb[2];
    const hpd_seq_t seqs[2] = {{.n_tokens = 70}, {.row = 70, .n_tokens = 80, .start_pos = 64}};

    for (int i = 0; i < 2; i++) {
        sa[i] = malloc(ss * sizeof(float));
        sb[i] = malloc(ss * sizeof(float));
        memcpy(sa[i], in.state0, ss * sizeof(float));
        memcpy(sb[i], in.state0, ss * sizeof(float));
        run(be, &in, true, seqs[i].row, seqs[i].n_tokens, seqs[i].start_pos, sa[i], alone);
    }
    hpd_gdn_args_t a = {.q = {.p = in.q, .ld = nk * dk, .hs = dk},
                        .k = {.p = in.k, .ld = nk * dk, .hs = dk},
                        .v = {.p = in.v, .ld = nv * dv, .hs = dv},
                        .g = in.g,
                        .beta = in.beta,
                        .out = {.p = batch, .ld = nv * dv, .hs = dv},
                        .nk = nk,
                        .nv = nv,
                        .dk = dk,
                        .dv = dv,
                        .states = sb,
                        .seqs = seqs,
                        .n_seqs = 2};
    assert_int_equal(hpd_gdn_chunked(be, &a), HPD_OK);
    assert_memory_equal(alone, batch, so * sizeof(float));
    for (int i = 0; i < 2; i++) {
        assert_memory_equal(sa[i], sb[i], ss * sizeof(float));
        free(sa[i]), free(sb[i]);
    }
    free(alone), free(batch);
    free_inputs(&in);
    hpd_backend_destroy(be);
}

/* The rule is linear in (v, S): zero values from a zero state give exactly
 * zero outputs and a zero state, in both forms (no term may start from
 * anything but zero). */
static void test_zero_values_give_zero(void **state)
{
    hpd_backend_t *be = cpu();
    inputs_t in;
    const uint32_t T = 130, nk = 2, nv = 2, dk = 16, dv = 16;
    make_inputs(&in, T, nk, nv, dk, dv, 9, 1.0f);
    const size_t so = (size_t)T * nv * dv, ss = (size_t)nv * dk * dv;
    memset(in.v, 0, so * sizeof(float));
    float *out = malloc(so * sizeof(float)), *st = malloc(ss * sizeof(float));
    for (int chunked = 0; chunked < 2; chunked++) {
        memset(st, 0, ss * sizeof(float));
        memset(out, 0xff, so * sizeof(float)); /* NaN: every output must be written */
        run(be, &in, chunked, 0, T, 0, st, out);
        for (size_t i = 0; i < so; i++)
            if (!(out[i] == 0.0f))
                fail_msg("chunked %d: output %zu is %g, expected 0", chunked, i, out[i]);
        for (size_t i = 0; i < ss; i++)
            if (!(st[i] == 0.0f))
                fail_msg("chunked %d: state %zu is %g, expected 0", chunked, i, st[i]);
    }
    free(out), free(st);
    free_inputs(&in);
    hpd_backend_destroy(be);
}

/* Causal inside a chunk: a NaN in token 40's value leaves the outputs of
 * tokens 0..39 (the same chunk's earlier rows) exactly as without it. */
static void test_causal_within_chunk(void **state)
{
    hpd_backend_t *be = cpu();
    inputs_t in;
    const uint32_t T = 60, nk = 1, nv = 2, dk = 32, dv = 32;
    make_inputs(&in, T, nk, nv, dk, dv, 11, 1.0f);
    const size_t so = (size_t)T * nv * dv, ss = (size_t)nv * dk * dv, early = 40 * nv * dv;
    float *o1 = malloc(so * sizeof(float)), *o2 = malloc(so * sizeof(float));
    float *st = malloc(ss * sizeof(float));
    memset(st, 0, ss * sizeof(float));
    run(be, &in, true, 0, T, 0, st, o1);
    in.v[(size_t)40 * nv * dv + 3] = NAN;
    memset(st, 0, ss * sizeof(float));
    run(be, &in, true, 0, T, 0, st, o2);
    assert_memory_equal(o1, o2, early * sizeof(float));
    assert_true(isnan(o2[early + 3]));
    free(o1), free(o2), free(st);
    free_inputs(&in);
    hpd_backend_destroy(be);
}

/* Value heads must share key heads evenly: nv = 3 over nk = 2 is refused by
 * both forms, as is nk = 0. */
static void test_bad_head_counts(void **state)
{
    hpd_backend_t *be = cpu();
    inputs_t in;
    make_inputs(&in, 4, 2, 3, 8, 8, 1, 1.0f);
    float out[4 * 3 * 8], st[3 * 8 * 8] = {0}, *states[1] = {st};
    hpd_seq_t seq = {.n_tokens = 4};
    hpd_gdn_args_t a = {.q = {.p = in.q, .ld = 2 * 8, .hs = 8},
                        .k = {.p = in.k, .ld = 2 * 8, .hs = 8},
                        .v = {.p = in.v, .ld = 3 * 8, .hs = 8},
                        .g = in.g,
                        .beta = in.beta,
                        .out = {.p = out, .ld = 3 * 8, .hs = 8},
                        .nk = 2,
                        .nv = 3,
                        .dk = 8,
                        .dv = 8,
                        .states = states,
                        .seqs = &seq,
                        .n_seqs = 1};
    for (uint32_t nk = 0; nk <= 2; nk += 2) {
        a.nk = nk;
        assert_int_equal(hpd_gdn_chunked(be, &a), HPD_ERR_INVALID_ARG);
        assert_int_equal(hpd_gdn_recurrent(be, &a), HPD_ERR_INVALID_ARG);
    }
    free_inputs(&in);
    hpd_backend_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_head_counts),
        cmocka_unit_test(test_zero_values_give_zero),
        cmocka_unit_test(test_causal_within_chunk),
        cmocka_unit_test(test_chunked_matches_recurrent),
        cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_batch_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
