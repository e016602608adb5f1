/* The CPU backend's memory ops, the pieces' hashes of a transfer's checksum
 * without a hash_pieces op (in place, or read back), and the small ops against straightforward
 * references: norms, RoPE, conv1d (sequence vs step with state), GDN gating,
 * SwiGLU, the attention gate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "kernels/backend.h"
#include "kernels/cpu/simd.h"
#include "tests/test_helpers.h"

static hpd_backend_t *be;

static int setup(void **state)
{
    hpd_backend_params_t p = {.device = "cpu", .n_threads = 2};
    return hpd_backend_cpu_create(&p, &be) == HPD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    hpd_backend_destroy(be);
    return 0;
}

/* The backend's name and memory: allocations aligned to 64 bytes with at
 * least the bytes asked for (0 included), memset, copy (overlapping too),
 * to_host and from_host. */
static void test_memory(void **state)
{
    assert_string_equal(be->ops->name, "cpu");
    assert_true(be->ops->host_memory);
    for (size_t bytes = 0; bytes <= 300; bytes += bytes < 70 ? 1 : 37) {
        uint8_t *p;
        assert_int_equal(hpd_backend_alloc(be, bytes, (void **)&p), HPD_OK);
        assert_int_equal((uintptr_t)p % 64, 0);
        assert_true(malloc_usable_size(p) >= bytes);
        hpd_backend_free(be, p);
    }
    uint8_t *a, *b, host[200];
    assert_int_equal(hpd_backend_alloc(be, 200, (void **)&a), HPD_OK);
    assert_int_equal(hpd_backend_alloc(be, 200, (void **)&b), HPD_OK);
    assert_int_equal(hpd_backend_memset(be, a, 0x5a, 200), HPD_OK);
    for (int i = 0; i < 200; i++)
        assert_int_equal(a[i], 0x5a);
    for (int i = 0; i < 200; i++)
        host[i] = (uint8_t)(i * 7);
    assert_int_equal(hpd_backend_from_host(be, b, host, 200), HPD_OK);
    assert_memory_equal(b, host, 200);
    assert_int_equal(hpd_backend_copy(be, a, b, 100), HPD_OK);
    assert_memory_equal(a, host, 100);
    assert_int_equal(a[100], 0x5a);
    assert_int_equal(hpd_backend_copy(be, b + 10, b, 150), HPD_OK); /* overlapping */
    assert_memory_equal(b + 10, host, 150);
    memset(host, 0, sizeof(host));
    assert_int_equal(hpd_backend_to_host(be, host, a, 200), HPD_OK);
    assert_memory_equal(host, a, 200);
    hpd_backend_free(be, a);
    hpd_backend_free(be, b);
}

static void test_rmsnorm(void **state)
{
    enum { T = 3, NH = 2, D = 40 };
    float x[T * NH * D], w[D], y[T * NH * D], ref[T * NH * D];
    test_fill(x, T * NH * D, 1, 2.0f);
    test_fill(w, D, 2, 0.1f);
    for (int zc = 0; zc < 2; zc++) {
        for (int r = 0; r < T * NH; r++) {
            double ss = 0;
            for (int d = 0; d < D; d++)
                ss += (double)x[r * D + d] * x[r * D + d];
            for (int d = 0; d < D; d++)
                ref[r * D + d] = (float)(x[r * D + d] / sqrt(ss / D + 1e-6) * (zc ? 1.0 + w[d] : w[d]));
        }
        hpd_rmsnorm_args_t a = {.x = {.p = x, .ld = NH * D, .hs = D},
                                .y = {.p = y, .ld = NH * D, .hs = D},
                                .n_tokens = T,
                                .n_heads = NH,
                                .dim = D,
                                .w = w,
                                .eps = 1e-6f,
                                .zero_centred = zc};
        assert_int_equal(hpd_rmsnorm(be, &a), HPD_OK);
        assert_rel_rms_below(y, ref, T * NH * D, 1e-6);
    }
}

static void test_gated_rmsnorm_and_l2norm(void **state)
{
    enum { T = 2, NH = 3, D = 16 };
    float x[T * NH * D], z[T * NH * D], w[D], y[T * NH * D], ref[T * NH * D];
    test_fill(x, T * NH * D, 3, 1.0f);
    test_fill(z, T * NH * D, 4, 1.0f);
    test_fill(w, D, 5, 1.0f);
    for (int r = 0; r < T * NH; r++) {
        double ss = 0;
        for (int d = 0; d < D; d++)
            ss += (double)x[r * D + d] * x[r * D + d];
        for (int d = 0; d < D; d++) {
            double zz = z[r * D + d];
            ref[r * D + d] = (float)(x[r * D + d] / sqrt(ss / D + 1e-6) * w[d] * zz / (1 + exp(-zz)));
        }
    }
    hpd_gated_rmsnorm_args_t a = {.x = {.p = x, .ld = NH * D, .hs = D},
                                  .z = {.p = z, .ld = NH * D, .hs = D},
                                  .y = {.p = y, .ld = NH * D, .hs = D},
                                  .n_tokens = T,
                                  .n_heads = NH,
                                  .dim = D,
                                  .w = w,
                                  .eps = 1e-6f};
    assert_int_equal(hpd_gated_rmsnorm(be, &a), HPD_OK);
    assert_rel_rms_below(y, ref, T * NH * D, 1e-6);

    for (int r = 0; r < T * NH; r++) {
        double ss = 0;
        for (int d = 0; d < D; d++)
            ss += (double)x[r * D + d] * x[r * D + d];
        for (int d = 0; d < D; d++)
            ref[r * D + d] = (float)(x[r * D + d] / sqrt(ss + 1e-6) * 0.25);
    }
    hpd_l2norm_args_t l = {.x = {.p = x, .ld = NH * D, .hs = D},
                           .n_tokens = T,
                           .n_heads = NH,
                           .dim = D,
                           .eps = 1e-6f,
                           .scale = 0.25f};
    assert_int_equal(hpd_l2norm(be, &l), HPD_OK);
    assert_rel_rms_below(x, ref, T * NH * D, 1e-6);
}

static void test_rope_partial_neox(void **state)
{
    enum { T = 3, NH = 2, D = 32, ROT = 8 };
    float x[T * NH * D], orig[T * NH * D];
    const int32_t pos[T] = {5, 0, 1000}; /* position 0 is the identity: not first */
    test_fill(x, T * NH * D, 6, 1.0f);
    memcpy(orig, x, sizeof(x));
    hpd_rope_args_t a = {.x = {.p = x, .ld = NH * D, .hs = D},
                         .n_tokens = T,
                         .n_heads = NH,
                         .head_dim = D,
                         .rot_dim = ROT,
                         .positions = pos,
                         .theta = 10000.0f};
    assert_int_equal(hpd_rope(be, &a), HPD_OK);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const float *o = orig + (t * NH + h) * D, *r = x + (t * NH + h) * D;
            for (int i = 0; i < ROT / 2; i++) {
                double f = pos[t] * pow(10000.0, -2.0 * i / ROT);
                assert_close(r[i], o[i] * cos(f) - o[i + ROT / 2] * sin(f), 2e-3);
                assert_close(r[i + ROT / 2], o[i + ROT / 2] * cos(f) + o[i] * sin(f), 2e-3);
            }
            /* the dims past rot_dim pass through untouched */
            assert_memory_equal(r + ROT, o + ROT, (D - ROT) * sizeof(float));
        }
}

/* transformers' YaRN inverse frequency of pair i, in float64. */
static double yarn_inv_freq(double theta, int dim, double factor, double low, double span, int i)
{
    const double p = pow(theta, 2.0 * i / dim);
    double ramp = (i - low) / span;
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    const double e = 1 - ramp;
    return 1 / (factor * p) * (1 - e) + 1 / p * e;
}

/* YaRN against a float64 reference of transformers' formulas: the ramp
 * between interpolated and extrapolated frequencies and the attention
 * factor on cos and sin; with yarn_factor 0 the rope is the default one,
 * bit for bit. */
static void test_rope_yarn(void **state)
{
    enum { T = 4, NH = 2, D = 64, ROT = 64 };
    float x[T * NH * D], orig[T * NH * D], plain[T * NH * D];
    const int32_t pos[T] = {3, 0, 700, 40000};
    const float theta = 10000.0f, factor = 4.0f, low = 9.0f, span = 14.0f, attn = 1.1386294f;
    test_fill(x, T * NH * D, 16, 1.0f);
    memcpy(orig, x, sizeof(x));
    memcpy(plain, x, sizeof(x));
    hpd_rope_args_t a = {.x = {.p = x, .ld = NH * D, .hs = D},
                         .n_tokens = T,
                         .n_heads = NH,
                         .head_dim = D,
                         .rot_dim = ROT,
                         .positions = pos,
                         .theta = theta,
                         .yarn_factor = factor,
                         .yarn_low = low,
                         .yarn_span = span,
                         .yarn_attention = attn};
    assert_int_equal(hpd_rope(be, &a), HPD_OK);
    for (int i = 0; i < ROT / 2; i++) {
        const double ref = yarn_inv_freq(theta, ROT, factor, low, span, i);
        assert_close(hpd_rope_inv_freq(&a, (uint32_t)i), ref, 2e-6 * ref);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const float *o = orig + (t * NH + h) * D, *r = x + (t * NH + h) * D;
            for (int i = 0; i < ROT / 2; i++) {
                /* the angle from the kernel's fp32 frequency: a float64
                 * frequency would move large positions by many ulps */
                const double f = (double)(float)((float)pos[t] * hpd_rope_inv_freq(&a, (uint32_t)i));
                const double c = cos(f) * attn, sn = sin(f) * attn;
                const double want0 = o[i] * c - o[i + ROT / 2] * sn;
                const double want1 = o[i + ROT / 2] * c + o[i] * sn;
                assert_close(r[i], want0, 1e-5);
                assert_close(r[i + ROT / 2], want1, 1e-5);
            }
        }
    /* the frequencies: low pairs extrapolate (as without YaRN), high ones
     * interpolate (divided by the factor) */
    assert_close(hpd_rope_inv_freq(&a, 0), 1.0, 1e-7);
    assert_close(hpd_rope_inv_freq(&a, ROT / 2 - 1), pow(theta, -(ROT - 2.0) / ROT) / factor,
                 1e-6 * pow(theta, -(ROT - 2.0) / ROT));
    /* yarn_factor 0: the default rope, bit for bit */
    hpd_rope_args_t d = a;
    d.x.p = plain;
    d.yarn_factor = 0;
    assert_int_equal(hpd_rope(be, &d), HPD_OK);
    hpd_rope_args_t ref_args = d;
    ref_args.yarn_low = ref_args.yarn_span = ref_args.yarn_attention = 0;
    float again[T * NH * D];
    memcpy(again, orig, sizeof(orig));
    ref_args.x.p = again;
    assert_int_equal(hpd_rope(be, &ref_args), HPD_OK);
    assert_memory_equal(plain, again, sizeof(plain));
    for (int i = 0; i < ROT / 2; i++)
        assert_true(hpd_rope_inv_freq(&d, (uint32_t)i) ==
                    1.0f / powf(theta, (float)(2 * i) / (float)ROT));
}

/* A sequence through conv1d equals the same tokens one step at a time (a
 * prompt goes 8 channels at a time, a step channel by channel: the same
 * bits), and both equal the causal conv with the state as left history. */
static void test_conv1d_sequence_vs_steps(void **state)
{
    enum { T = 40, CH = 21, KC = 4 }; /* two blocks of 8 channels and 5 more */
    float x[T * CH], w[CH * KC], y_seq[T * CH], y_step[T * CH];
    float st_seq[CH * (KC - 1)], st_step[CH * (KC - 1)], hist[CH * (KC - 1)];
    test_fill(x, T * CH, 7, 1.0f);
    test_fill(w, CH * KC, 8, 0.5f);
    test_fill(hist, CH * (KC - 1), 9, 1.0f);
    memcpy(st_seq, hist, sizeof(hist));
    memcpy(st_step, hist, sizeof(hist));
    float *s1[1] = {st_seq}, *s2[1] = {st_step};
    hpd_seq_t seq = {.n_tokens = T};
    hpd_conv1d_args_t a = {.x = x,
                           .ldx = CH,
                           .y = y_seq,
                           .ldy = CH,
                           .w = w,
                           .channels = CH,
                           .kc = KC,
                           .states = s1,
                           .seqs = &seq,
                           .n_seqs = 1};
    assert_int_equal(hpd_conv1d(be, &a), HPD_OK);
    for (int t = 0; t < T; t++) {
        hpd_seq_t one = {.n_tokens = 1, .start_pos = (uint32_t)t};
        hpd_conv1d_args_t b = {.x = x + t * CH,
                               .ldx = CH,
                               .y = y_step + t * CH,
                               .ldy = CH,
                               .w = w,
                               .channels = CH,
                               .kc = KC,
                               .states = s2,
                               .seqs = &one,
                               .n_seqs = 1};
        assert_int_equal(hpd_conv1d_step(be, &b), HPD_OK);
    }
    assert_memory_equal(y_seq, y_step, sizeof(y_seq));
    assert_memory_equal(st_seq, st_step, sizeof(st_seq));
    /* kernels of 2 to 16 taps: one tap keeps no history, 17 is past the
     * kernel's window; both are refused */
    for (uint32_t kc = 1; kc <= 17; kc += 16) {
        a.kc = kc;
        assert_int_equal(hpd_conv1d(be, &a), HPD_ERR_UNSUPPORTED);
    }
    for (int c = 0; c < CH; c++) {
        for (int t = 0; t < T; t++) {
            double acc = 0;
            for (int j = 0; j < KC; j++) {
                int src = t - (KC - 1) + j; /* < 0 reads the history */
                double in = src >= 0 ? x[src * CH + c] : hist[c * (KC - 1) + (KC - 1 + src)];
                acc += w[c * KC + j] * in;
            }
            assert_close(y_seq[t * CH + c], acc / (1 + exp(-acc)), 1e-5);
        }
        for (int j = 0; j < KC - 1; j++) /* the state keeps the newest kc-1 inputs */
            assert_true(st_seq[c * (KC - 1) + j] == x[(T - (KC - 1) + j) * CH + c]);
    }
}

static void test_gating_silu_sigmoid_embed(void **state)
{
    enum { T = 2, NV = 3, I = 21 }; /* silu: two vectors of 8 and a tail */
    float a[T * NV], b[T * NV], alog[NV], dtb[NV], g[T * NV], beta[T * NV];
    test_fill(a, T * NV, 10, 3.0f);
    test_fill(b, T * NV, 11, 1.0f);
    test_fill(alog, NV, 12, 1.0f);
    test_fill(dtb, NV, 13, 1.0f);
    a[0] = 30.0f; /* softplus past its linear threshold */
    hpd_gdn_gating_args_t ga = {.a = a,
                                .b = b,
                                .lda = NV,
                                .ldb = NV,
                                .a_log = alog,
                                .dt_bias = dtb,
                                .g = g,
                                .beta = beta,
                                .n_tokens = T,
                                .nv = NV};
    assert_int_equal(hpd_gdn_gating(be, &ga), HPD_OK);
    for (int i = 0; i < T * NV; i++) {
        const double x = a[i] + dtb[i % NV], sp = x > 20 ? x : log1p(exp(x));
        const double want = -exp(alog[i % NV]) * sp;
        assert_close(g[i], want, 1e-4 * fabs(want) + 1e-6);
        assert_close(beta[i], 1 / (1 + exp(-b[i])), 1e-6);
    }

    float gu[T * 2 * I], out[T * I];
    test_fill(gu, T * 2 * I, 14, 2.0f);
    hpd_silu_mul_args_t sa = {
        .gu = gu, .ldgu = 2 * I, .out = out, .ldout = I, .n_tokens = T, .inter = I};
    assert_int_equal(hpd_silu_mul(be, &sa), HPD_OK);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            double gg = gu[t * 2 * I + i];
            assert_close(out[t * I + i], gg / (1 + exp(-gg)) * gu[t * 2 * I + I + i], 1e-5);
        }

    float x[T * 4], gate[T * 8], x0[T * 4];
    test_fill(x, T * 4, 15, 1.0f);
    test_fill(gate, T * 8, 16, 1.0f);
    memcpy(x0, x, sizeof(x));
    hpd_sigmoid_mul_args_t sm = {.x = {.p = x, .ld = 4, .hs = 2},
                                 .gate = {.p = gate + 2, .ld = 8, .hs = 4},
                                 .n_tokens = T,
                                 .n_heads = 2,
                                 .dim = 2};
    assert_int_equal(hpd_sigmoid_mul(be, &sm), HPD_OK);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 2; d++)
                assert_close(x[t * 4 + h * 2 + d],
                                   x0[t * 4 + h * 2 + d] / (1 + exp(-gate[t * 8 + 2 + h * 4 + d])),
                                   1e-6);

    /* and heads of 19: two vectors and a tail, over threads */
    enum { ST = 600, SH = 3, SD = 19 }; /* 34200 elements: over the threads' threshold */
    float *sx = malloc(ST * SH * SD * 4), *sx0 = malloc(ST * SH * SD * 4);
    float *sg = malloc(ST * SH * SD * 4);
    test_fill(sx, ST * SH * SD, 18, 1.0f);
    test_fill(sg, ST * SH * SD, 19, 4.0f);
    memcpy(sx0, sx, ST * SH * SD * 4);
    hpd_sigmoid_mul_args_t big = {.x = {.p = sx, .ld = SH * SD, .hs = SD},
                                  .gate = {.p = sg, .ld = SH * SD, .hs = SD},
                                  .n_tokens = ST,
                                  .n_heads = SH,
                                  .dim = SD};
    assert_int_equal(hpd_sigmoid_mul(be, &big), HPD_OK);
    for (int i = 0; i < ST * SH * SD; i++)
        assert_close(sx[i], sx0[i] / (1 + exp(-(double)sg[i])), 1e-6);
    /* a NaN gate gives NaN, in a vector lane and in the tail */
    sg[5] = NAN, sg[18] = NAN;
    assert_int_equal(hpd_sigmoid_mul(be, &big), HPD_OK);
    assert_true(isnan(sx[5]) && isnan(sx[18]) && !isnan(sx[4]));
    free(sx), free(sx0), free(sg);

    float table[6 * 3], emb[2 * 4];
    const int32_t ids[2] = {5, 1};
    test_fill(table, 18, 17, 1.0f);
    hpd_embed_args_t ea = {.ids = ids, .n = 2, .table = table, .dim = 3, .out = emb, .ld = 4};
    assert_int_equal(hpd_embed(be, &ea), HPD_OK);
    assert_memory_equal(emb, table + 15, 12);
    assert_memory_equal(emb + 4, table + 3, 12);
}

/* The kernels' exp: within 2 ulp of exp over its range (float64), the
 * vector form bit for bit the scalar one in every lane, the clamps at both
 * ends, a NaN kept (a NaN gate must not let x through as if it were 1). */
static void test_exp(void **state)
{
    double worst = 0;
    for (int i = 0; i <= 400000; i++) {
        float x[8];
        for (int l = 0; l < 8; l++)
            x[l] = -87.3f + (87.3f + 88.0f) * (float)(i * 8 + l) / (400001.0f * 8);
        float v[8];
        hpd_v8_store(v, hpd_v8_exp(hpd_v8_load(x)));
        for (int l = 0; l < 8; l++) {
            const float s = hpd_exp1(x[l]);
            if (memcmp(&s, &v[l], 4) != 0)
                fail_msg("exp(%a): vector %a, scalar %a", x[l], v[l], s);
            const double want = exp((double)x[l]);
            const double ulps = fabs(s - want) / (ldexp(1.0, ilogb(want) - 23));
            worst = ulps > worst || isnan(ulps) ? ulps : worst;
        }
    }
    print_message("exp: worst error %.2f ulp\n", worst);
    assert_true(worst <= 2.0);
    assert_true(hpd_exp1(0.0f) == 1.0f);
    assert_true(hpd_exp1(-1000.0f) == hpd_exp1(-87.3365f) && hpd_exp1(-1000.0f) > 0);
    assert_true(hpd_exp1(1000.0f) == hpd_exp1(88.0f) && isfinite(hpd_exp1(1000.0f)));
    assert_true(isnan(hpd_exp1(NAN)));
    const float odd[8] = {NAN, -1000, 1000, 0, -0.0f, 88.0f, -87.3365f, 1e-30f};
    float v[8];
    hpd_v8_store(v, hpd_v8_exp(hpd_v8_load(odd)));
    for (int l = 0; l < 8; l++) {
        const float s = hpd_exp1(odd[l]);
        assert_memory_equal(&s, &v[l], 4);
    }
    assert_true(isnan(v[0]));
}

/* hpd_backend_hash_pieces without a hash_pieces op: host memory hashed in
 * place, a device's read back piece by piece; both give each 64 KiB piece's
 * XXH3-64 (the last shorter), span after span, empty spans none. */
static int reads_back;
static hpd_status_t counting_to_host(hpd_backend_t *b, void *host, const void *src, size_t n)
{
    reads_back++;
    memcpy(host, src, n);
    return HPD_OK;
}

static void test_hash_pieces_fallback(void **state)
{
    enum { N = 300000 };
    uint8_t *buf = malloc(N);
    for (uint32_t i = 0; i < N; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    const hpd_hash_span_t spans[] = {{buf + 3, 140000}, {buf, 0}, {buf + 7, 100}, {buf, 65536}};
    uint64_t want[5], got[6];
    const uint64_t lens[] = {65536, 65536, 140000 - 131072, 100, 65536};
    const uint8_t *at[] = {buf + 3, buf + 3 + 65536, buf + 3 + 131072, buf + 7, buf};
    for (int k = 0; k < 5; k++)
        want[k] = XXH3_64bits(at[k], lens[k]);

    hpd_backend_ops_t dev = *be->ops;
    dev.name = "posing-device";
    dev.host_memory = false;
    dev.hash_pieces = NULL;
    dev.to_host = counting_to_host;
    hpd_backend_t posing = {&dev, be->ctx};
    hpd_backend_t *backends[] = {be, &posing};
    for (int b = 0; b < 2; b++) {
        memset(got, 0x5a, sizeof(got));
        reads_back = 0;
        hpd_hash_pieces_args_t a = {spans, 4, got};
        assert_int_equal(hpd_backend_hash_pieces(backends[b], &a), HPD_OK);
        for (int k = 0; k < 5; k++)
            assert_true(got[k] == want[k]);
        assert_true(got[5] == 0x5a5a5a5a5a5a5a5aull);
        assert_int_equal(reads_back, b == 0 ? 0 : 5);
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_hash_pieces_fallback),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_gated_rmsnorm_and_l2norm),
        cmocka_unit_test(test_rope_partial_neox),
        cmocka_unit_test(test_rope_yarn),
        cmocka_unit_test(test_conv1d_sequence_vs_steps),
        cmocka_unit_test(test_gating_silu_sigmoid_embed),
        cmocka_unit_test(test_exp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
