/* The norms of kernels/cuda/norm.cu and the element-wise ops of
 * elementwise.cu on the host stand-in: rmsnorm, gated_rmsnorm, embed,
 * silu_mul and sigmoid_mul against the CPU backend; attention's fused q/k
 * norms with their rotary embedding, and the gated delta rule's q/k L2
 * norms with its gates (l2norm_gating_kernel, against l2norm and gdn_gating
 * likewise).
 * Attention's fused q/k norms and rotary embedding (norm_rope_kernel in
 * kernels/cuda/norm.cu), run on the host through tests/kernels/cuda_host/:
 * the same bits as the unfused kernels (rmsnorm_kernel twice, rope_kernel
 * twice, elementwise.cu), and within 1e-6 relative RMS of the CPU backend's
 * four ops. Qwen3-Next's shape (16 q heads and 2 KV heads of 256, partial
 * rotary over 64 dims), full rotary with YaRN, plain weights, views with
 * gaps between heads (q interleaved with its gate), out of place, and
 * positions near 2^24. It needs no GPU; test_backend_cuda runs the fused op
 * on one. Also tp_sum_kernel, the top of tensor parallelism's canonical
 * sum, against the CPU bit for bit. */
#include "cuda_host_test.h"
#include "kernels/tp_sum.h"

struct nr_case {
    uint32_t nh, nkv, hd, rot, tokens;
    bool zero_centred, yarn, in_place;
};

static void norm_rope_case(hpd_backend_t *cpu, const nr_case &c)
{
    test_emu_t emu;
    /* q heads interleaved with gates (stride 2 hd), as the engine's
     * projection lays them out; k after them */
    const uint32_t ld = c.nh * 2 * c.hd + c.nkv * c.hd;
    std::vector<float> proj = test_rnd((size_t)c.tokens * ld, 31, 3), out(proj.size(), 0.0f);
    std::vector<float> wq = test_rnd(c.hd, 32, 0.5f), wk = test_rnd(c.hd, 33, 0.5f);
    std::vector<int32_t> pos(c.tokens);
    for (uint32_t t = 0; t < c.tokens; t++)
        pos[t] = t % 2 ? (int32_t)(16777200 + t) : (int32_t)(t * 37);
    const auto args = [&](float *dst) {
        hpd_view_t q = {.p = proj.data(), .ld = ld, .hs = 2 * c.hd};
        hpd_view_t k = {.p = proj.data() + c.nh * 2 * c.hd, .ld = ld, .hs = c.hd};
        hpd_view_t qy = q, ky = k;
        if (!c.in_place)
            qy.p = dst, ky.p = dst + c.nh * 2 * c.hd;
        hpd_norm_rope_args_t a = {};
        a.q = {.x = q, .y = qy, .n_tokens = c.tokens, .n_heads = c.nh, .dim = c.hd,
               .w = wq.data(), .eps = 1e-6f, .zero_centred = c.zero_centred};
        a.k = {.x = k, .y = ky, .n_tokens = c.tokens, .n_heads = c.nkv, .dim = c.hd,
               .w = wk.data(), .eps = 1e-6f, .zero_centred = c.zero_centred};
        a.rope.rot_dim = c.rot, a.rope.positions = pos.data(), a.rope.theta = 10000000.0f;
        if (c.yarn)
            a.rope.yarn_factor = 4.0f, a.rope.yarn_low = 3.0f, a.rope.yarn_span = 20.0f,
            a.rope.yarn_attention = 1.1386f;
        return a;
    };
    const std::vector<float> in = proj;
    /* fused */
    hpd_norm_rope_args_t a = args(out.data());
    check_status("norm_rope", hpd_cuda_norm_rope(&emu.be, &a));
    std::vector<float> fused = c.in_place ? proj : out;
    /* unfused: rmsnorm, rmsnorm, rope, rope */
    proj = in, out.assign(out.size(), 0.0f);
    a = args(out.data());
    hpd_rope_args_t qr = a.rope, kr = a.rope;
    qr.x = a.q.y, qr.n_tokens = c.tokens, qr.n_heads = c.nh, qr.head_dim = c.hd;
    kr.x = a.k.y, kr.n_tokens = c.tokens, kr.n_heads = c.nkv, kr.head_dim = c.hd;
    check_status("rmsnorm q", hpd_cuda_rmsnorm(&emu.be, &a.q));
    check_status("rmsnorm k", hpd_cuda_rmsnorm(&emu.be, &a.k));
    check_status("rope q", hpd_cuda_rope(&emu.be, &qr));
    check_status("rope k", hpd_cuda_rope(&emu.be, &kr));
    const std::vector<float> sep = c.in_place ? proj : out;
    /* the CPU's four ops */
    proj = in, out.assign(out.size(), 0.0f);
    a = args(out.data());
    check_status("cpu norm_rope", hpd_norm_rope(cpu, &a));
    const std::vector<float> want = c.in_place ? proj : out;
    char what[160];
    snprintf(what, sizeof(what), "norm_rope %u/%u heads hd %u rot %u%s%s%s: the unfused bits",
             c.nh, c.nkv, c.hd, c.rot, c.zero_centred ? " zero-centred" : "",
             c.yarn ? " yarn" : "", c.in_place ? " in place" : "");
    check_same(what, fused.data(), sep.data(), fused.size());
    snprintf(what, sizeof(what), "norm_rope %u/%u heads hd %u rot %u%s: against the CPU", c.nh,
             c.nkv, c.hd, c.rot, c.yarn ? " yarn" : "");
    check_close(what, fused.data(), want.data(), fused.size(), 1e-6);
}

/* The gated delta rule's q and k L2 norms and gates in one launch
 * (l2norm_gating_kernel): the bits of l2norm, l2norm, gdn_gating, and the
 * CPU's within 1e-6. */
static void l2norm_gating_case(hpd_backend_t *cpu, uint32_t nk, uint32_t nv, uint32_t dk,
                               uint32_t tokens)
{
    test_emu_t emu;
    const uint32_t ld = 2 * nk * dk + 2 * nv; /* q, k, then a and b of the projection */
    std::vector<float> proj = test_rnd((size_t)tokens * ld, 41, 2);
    std::vector<float> a_log = test_rnd(nv, 42, 1), dt_bias = test_rnd(nv, 43, 1);
    for (uint32_t i = 0; i < tokens; i++) /* a softplus past its threshold of 20 */
        proj[(size_t)i * ld + 2 * nk * dk] = 25.0f;
    std::vector<float> out[3];
    for (int way = 0; way < 3; way++) { /* fused, unfused, the CPU */
        std::vector<float> x = proj, g((size_t)tokens * nv), beta((size_t)tokens * nv);
        hpd_l2norm_gating_args_t a = {};
        a.q = {.x = {.p = x.data(), .ld = ld, .hs = dk}, .n_tokens = tokens, .n_heads = nk,
               .dim = dk, .eps = 1e-6f, .scale = 0.125f};
        a.k = {.x = {.p = x.data() + nk * dk, .ld = ld, .hs = dk}, .n_tokens = tokens,
               .n_heads = nk, .dim = dk, .eps = 1e-6f, .scale = 1.0f};
        a.gate = {.a = x.data() + 2 * nk * dk, .b = x.data() + 2 * nk * dk + nv, .lda = ld,
                  .ldb = ld, .a_log = a_log.data(), .dt_bias = dt_bias.data(), .g = g.data(),
                  .beta = beta.data(), .n_tokens = tokens, .nv = nv};
        if (way == 0)
            check_status("l2norm_gating", hpd_cuda_l2norm_gating(&emu.be, &a));
        else if (way == 1) {
            check_status("l2norm q", hpd_cuda_l2norm(&emu.be, &a.q));
            check_status("l2norm k", hpd_cuda_l2norm(&emu.be, &a.k));
            check_status("gdn_gating", hpd_cuda_gdn_gating(&emu.be, &a.gate));
        } else
            check_status("cpu l2norm_gating", hpd_l2norm_gating(cpu, &a));
        out[way] = x;
        out[way].insert(out[way].end(), g.begin(), g.end());
        out[way].insert(out[way].end(), beta.begin(), beta.end());
    }
    char what[128];
    snprintf(what, sizeof(what), "l2norm_gating %u/%u heads dk %u: the unfused bits", nk, nv, dk);
    check_same(what, out[0].data(), out[1].data(), out[0].size());
    snprintf(what, sizeof(what), "l2norm_gating %u/%u heads dk %u: against the CPU", nk, nv, dk);
    check_close(what, out[0].data(), out[2].data(), out[0].size(), 1e-6);
}

/* The unfused norms alone against the CPU's: rmsnorm (plain and
 * zero-centred) and gated_rmsnorm over rows of views with gaps, dims under,
 * at and over a block's 256 threads and off a multiple of 32. The other
 * cells of y stay as they were. */
static void norms_case(hpd_backend_t *cpu, uint32_t heads, uint32_t dim, uint32_t tokens)
{
    const uint32_t ld = heads * (dim + 3) + 5; /* heads dim + 3 apart, a row 5 more */
    const std::vector<float> x = test_rnd((size_t)tokens * ld, 51, 2);
    const std::vector<float> z = test_rnd((size_t)tokens * ld, 52, 3);
    const std::vector<float> w = test_rnd(dim, 53, 0.5f), y0 = test_rnd(x.size(), 54, 1);
    const hpd_view_t xv = {.p = const_cast<float *>(x.data()), .ld = ld, .hs = dim + 3};
    const hpd_view_t zv = {.p = const_cast<float *>(z.data()), .ld = ld, .hs = dim + 3};
    for (int zc = 0; zc < 2; zc++) {
        std::vector<float> got = y0, want = y0;
        hpd_rmsnorm_args_t a = {.x = xv, .y = {.p = got.data(), .ld = ld, .hs = dim + 3},
                                .n_tokens = tokens, .n_heads = heads, .dim = dim,
                                .w = w.data(), .eps = 1e-6f, .zero_centred = zc == 1};
        test_emu_t emu;
        check_status("rmsnorm", hpd_cuda_rmsnorm(&emu.be, &a));
        a.y.p = want.data();
        check_status("cpu rmsnorm", hpd_rmsnorm(cpu, &a));
        char what[96];
        snprintf(what, sizeof(what), "rmsnorm%s %u heads of %u", zc ? " zero-centred" : "",
                 heads, dim);
        check_close(what, got.data(), want.data(), got.size(), 1e-6);
    }
    std::vector<float> got = y0, want = y0;
    hpd_gated_rmsnorm_args_t g = {.x = xv, .z = zv,
                                  .y = {.p = got.data(), .ld = ld, .hs = dim + 3},
                                  .n_tokens = tokens, .n_heads = heads, .dim = dim,
                                  .w = w.data(), .eps = 1e-6f};
    test_emu_t emu;
    check_status("gated_rmsnorm", hpd_cuda_gated_rmsnorm(&emu.be, &g));
    g.y.p = want.data();
    check_status("cpu gated_rmsnorm", hpd_gated_rmsnorm(cpu, &g));
    char what[96];
    snprintf(what, sizeof(what), "gated_rmsnorm %u heads of %u", heads, dim);
    check_close(what, got.data(), want.data(), got.size(), 1e-6);
}

/* Embedding rows from F32, BF16 and F16 tables: the CPU's bits (each
 * widened exactly), into rows ld apart; the first and last ids, repeats. */
static void embed_case(hpd_backend_t *cpu)
{
    const uint32_t vocab = 300, dim = 260, ld = 270; /* dim over a block's 256 threads */
    const std::vector<int32_t> ids = {0, 299, 17, 17, 150, 42, 298};
    const std::vector<float> f = test_rnd((size_t)vocab * dim, 61, 4);
    std::vector<uint16_t> h(f.size());
    for (int dt = 0; dt < 3; dt++) {
        const hpd_dtype_t dtype = dt == 0 ? HPD_DTYPE_F32 : dt == 1 ? HPD_DTYPE_BF16 : HPD_DTYPE_F16;
        for (size_t i = 0; i < f.size(); i++) { /* bf16 by truncation, f16 with its exponent */
            uint32_t u;
            memcpy(&u, &f[i], 4);
            h[i] = dt == 1 ? (uint16_t)(u >> 16)
                           : (uint16_t)(((u >> 16) & 0x8000u) | (0x3c00u + (u >> 13 & 0x3ffu) +
                                                                 (uint32_t)(i % 13) * 0x400u));
            if (dt == 2 && i % 97 == 0) /* subnormal halves */
                h[i] = (uint16_t)(1 + i % 0x3ff);
        }
        const std::vector<float> y0 = test_rnd((size_t)ids.size() * ld, 62, 1);
        std::vector<float> got = y0, want = y0;
        hpd_embed_args_t a = {.ids = ids.data(), .n = (uint32_t)ids.size(),
                              .table = dt == 0 ? (const void *)f.data() : (const void *)h.data(),
                              .dtype = dtype, .dim = dim, .out = got.data(), .ld = ld};
        test_emu_t emu;
        check_status("embed", hpd_cuda_embed(&emu.be, &a));
        a.out = want.data();
        check_status("cpu embed", hpd_embed(cpu, &a));
        char what[64];
        snprintf(what, sizeof(what), "embed from a %s table", hpd_dtype_name(dtype));
        check_same(what, got.data(), want.data(), got.size());
    }
}

/* SwiGLU against the CPU, rows with gaps */
static void silu_mul_case(hpd_backend_t *cpu, uint32_t tokens, uint32_t inter)
{
    const uint32_t ldgu = 2 * inter + 8, ldout = inter + 4;
    const std::vector<float> gu = test_rnd((size_t)tokens * ldgu, 71, 3);
    const std::vector<float> y0 = test_rnd((size_t)tokens * ldout, 72, 1);
    std::vector<float> got = y0, want = y0;
    hpd_silu_mul_args_t s = {.gu = gu.data(), .ldgu = ldgu, .out = got.data(), .ldout = ldout,
                             .n_tokens = tokens, .inter = inter};
    test_emu_t emu;
    check_status("silu_mul", hpd_cuda_silu_mul(&emu.be, &s));
    s.out = want.data();
    check_status("cpu silu_mul", hpd_silu_mul(cpu, &s));
    char what[96];
    snprintf(what, sizeof(what), "silu_mul %u tokens of %u", tokens, inter);
    check_close(what, got.data(), want.data(), got.size(), 1e-6);
}

/* The attention gate against the CPU: q heads of 64 interleaved with their
 * gates, as the projection lays them out */
static void sigmoid_mul_case(hpd_backend_t *cpu, uint32_t tokens)
{
    const uint32_t heads = 6, dim = 64, ld = heads * 2 * dim + 7;
    const std::vector<float> x = test_rnd((size_t)tokens * ld, 73, 2);
    std::vector<float> gx = x, wx = x;
    hpd_sigmoid_mul_args_t m = {.x = {.p = gx.data(), .ld = ld, .hs = 2 * dim},
                                .gate = {.p = gx.data() + dim, .ld = ld, .hs = 2 * dim},
                                .n_tokens = tokens, .n_heads = heads, .dim = dim};
    test_emu_t emu;
    check_status("sigmoid_mul", hpd_cuda_sigmoid_mul(&emu.be, &m));
    m.x.p = wx.data(), m.gate.p = wx.data() + dim;
    check_status("cpu sigmoid_mul", hpd_sigmoid_mul(cpu, &m));
    char what[96];
    snprintf(what, sizeof(what), "sigmoid_mul %u tokens, %u heads of %u", tokens, heads, dim);
    check_close(what, gx.data(), wx.data(), gx.size(), 1e-6);
}

/* The top of the canonical sum (tp_sum_kernel): the CPU's bits for 1, 2,
 * 4 and 8 parts, accumulated and not, y among the parts; 3 parts refused */
static void tp_sum_case(hpd_backend_t *cpu, uint32_t n_parts, bool accumulate)
{
    const uint32_t m = 5, n = 300, ld = 304;
    std::vector<std::vector<float>> parts;
    for (uint32_t i = 0; i < n_parts; i++)
        parts.push_back(test_rnd((size_t)m * ld, 80 + i, 1e3f));
    const std::vector<float> y0 = test_rnd((size_t)m * ld, 79, 1);
    std::vector<float> got = y0, want = y0;
    hpd_tp_sum_args_t a = {.n_parts = n_parts, .ld_parts = ld, .y = got.data(), .ldy = ld,
                           .m = m, .n = n, .accumulate = accumulate};
    for (uint32_t i = 0; i < n_parts; i++)
        a.parts[i] = parts[i].data();
    test_emu_t emu;
    check_status("tp_sum", hpd_cuda_tp_sum(&emu.be, &a));
    a.y = want.data();
    check_status("cpu tp_sum", hpd_tp_sum(cpu, &a));
    char what[64];
    snprintf(what, sizeof(what), "tp_sum of %u parts%s", n_parts, accumulate ? ", added" : "");
    check_same(what, got.data(), want.data(), got.size());
    a.n_parts = 3;
    hpd_test_checked++;
    if (hpd_cuda_tp_sum(&emu.be, &a) != HPD_ERR_INVALID_ARG) {
        fprintf(stderr, "FAIL tp_sum of 3 parts was not refused\n");
        hpd_test_failed++;
    }
}

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();
    norm_rope_case(cpu, {16, 2, 256, 64, 5, true, false, true});
    norm_rope_case(cpu, {4, 4, 128, 128, 3, true, true, false});
    norm_rope_case(cpu, {2, 1, 64, 32, 4, false, false, false});
    l2norm_gating_case(cpu, 16, 32, 128, 5); /* Qwen3-Next's */
    l2norm_gating_case(cpu, 2, 6, 64, 3);
    norms_case(cpu, 1, 2048, 3); /* a hidden row */
    norms_case(cpu, 4, 128, 5);  /* the gated delta rule's heads */
    norms_case(cpu, 3, 72, 2);
    embed_case(cpu);
    silu_mul_case(cpu, 5, 200);
    /* 16.8 M elements: more than the grid's 65536 blocks of 256 threads
     * take in one round of its grid-stride walk */
    silu_mul_case(cpu, 4100, 4100);
    sigmoid_mul_case(cpu, 5);
    for (uint32_t parts = 1; parts <= HPD_TP_GROUPS; parts *= 2) {
        tp_sum_case(cpu, parts, false);
        tp_sum_case(cpu, parts, true);
    }
    hpd_backend_destroy(cpu);
    return test_report("test_norm_cuda_host", t0);
}
