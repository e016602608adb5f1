/* The fused norms of kernels/cuda/norm.cu: attention's q/k norms with
 * their rotary embedding, and the gated delta rule's q/k L2 norms with its
 * gates (l2norm_gating_kernel, against l2norm and gdn_gating likewise).
 * Attention's fused q/k norms and rotary embedding (norm_rope_kernel in
 * kernels/cuda/norm.cu), run on the host through tests/kernels/cuda_host/:
 * the same bits as the unfused kernels (rmsnorm_kernel twice, rope_kernel
 * twice, elementwise.cu), and within 1e-6 relative RMS of the CPU backend's
 * four ops. Qwen3-Next's shape (16 q heads and 2 KV heads of 256, partial
 * rotary over 64 dims), full rotary with YaRN, plain weights, views with
 * gaps between heads (q interleaved with its gate), out of place, and
 * positions near 2^24. It needs no GPU; test_backend_cuda runs the fused op
 * on one. */
#include "cuda_host_test.h"

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

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();
    norm_rope_case(cpu, {16, 2, 256, 64, 5, true, false, true});
    norm_rope_case(cpu, {4, 4, 128, 128, 3, true, true, false});
    norm_rope_case(cpu, {2, 1, 64, 32, 4, false, false, false});
    l2norm_gating_case(cpu, 16, 32, 128, 5); /* Qwen3-Next's */
    l2norm_gating_case(cpu, 2, 6, 64, 3);
    hpd_backend_destroy(cpu);
    return test_report("test_norm_cuda_host", t0);
}
