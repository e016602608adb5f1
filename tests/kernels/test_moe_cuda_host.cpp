/* The CUDA mixture-of-experts kernels (kernels/cuda/moe.cu, the grouped
 * GEMMs of gemm.cu), run on the host through tests/kernels/cuda_host/:
 * - the routing against the CPU backend's moe_route: the same ids, slots,
 *   tokens of slots and first slots, and the same weights bit for bit (the
 *   stand-in's expf is the host's; on a GPU test_backend_cuda allows the
 *   GPU's expf its ulps), for 1 to 1024 experts, up to 32 experts a token,
 *   up to 16 tokens (one block) and past (the general path, batches across
 *   the bitmap's 32-token words), ties, with and without renormalisation;
 * - the grouped GEMM (cuda's kernels, cuda-bf16's with and without the
 *   ring) against one GEMM per group of the same kernels, bit for bit, for
 *   F32, BF16 and FP8 weights, groups of 1 to 40 rows (the GEMV's MR, the
 *   decode kernels, also for 40 tokens: a tile of 32 rows), groups of 67
 *   rows on average (the tiled kernels), empty groups, accumulate;
 * - gather and moe_combine reading the routing from device memory. */
#include <vector>

#include "tests/kernels/cuda_host/cuda_host_test.h"

/* A routing of T tokens over E experts, K each, from random logits (flat:
 * all equal, every token ties) through the CPU backend */
struct routing_t {
    std::vector<uint32_t> ids, slots, idx, first;
    std::vector<float> w;
    routing_t(uint32_t T, uint32_t E, uint32_t K)
        : ids(T * K), slots(T * K), idx(T * K), first(E + 1), w(T * K)
    {
    }
    hpd_moe_route_args_t args(const float *logits, uint32_t ld, uint32_t T, uint32_t E,
                              uint32_t K, bool norm)
    {
        return hpd_moe_route_args_t{.logits = logits,
                                    .ld = ld,
                                    .n_tokens = T,
                                    .n_experts = E,
                                    .top_k = K,
                                    .norm = norm,
                                    .ids = ids.data(),
                                    .weights = w.data(),
                                    .slots = slots.data(),
                                    .idx = idx.data(),
                                    .first = first.data()};
    }
};

static void check_route(hpd_backend_t *cpu, uint32_t T, uint32_t E, uint32_t K, bool norm,
                        bool flat, uint32_t seed)
{
    test_emu_t emu;
    const uint32_t ld = E + 3;
    std::vector<float> logits = test_rnd((size_t)T * ld, seed, 2.0f);
    if (flat)
        std::fill(logits.begin(), logits.end(), 0.5f);
    routing_t want(T, E, K), got(T, E, K);
    hpd_moe_route_args_t wa = want.args(logits.data(), ld, T, E, K, norm);
    hpd_moe_route_args_t ga = got.args(logits.data(), ld, T, E, K, norm);
    char what[96];
    snprintf(what, sizeof(what), "route T %u E %u K %u%s%s", T, E, K, norm ? " norm" : "",
             flat ? " ties" : "");
    check_status(what, hpd_moe_route(cpu, &wa));
    check_status(what, hpd_cuda_moe_route(&emu.be, &ga));
    hpd_test_checked++;
    if (got.ids != want.ids || got.slots != want.slots || got.idx != want.idx ||
        got.first != want.first) {
        fprintf(stderr, "FAIL %s: the ids, slots or first slots differ from the CPU's\n", what);
        hpd_test_failed++;
    }
    check_same(what, got.w.data(), want.w.data(), got.w.size());
}

/* x random, the groups of a routing; the grouped op against one GEMM per
 * group (the same kernels, through `one`) */
typedef hpd_status_t (*gemm_fn_t)(hpd_backend_t *, const hpd_gemm_args_t *);
typedef hpd_status_t (*grouped_fn_t)(hpd_backend_t *, const hpd_gemm_grouped_args_t *);
static void check_grouped(hpd_backend_t *cpu, const char *name, grouped_fn_t grouped,
                          gemm_fn_t one, bool ring, hpd_dtype_t dt, uint32_t T, uint32_t E,
                          uint32_t K, bool accumulate, uint32_t seed)
{
    test_emu_t emu;
    emu.ctx.gr_ok = ring;
    const uint32_t n = 40, k = 96, S = T * K, blk = 32;
    const uint32_t sld = (k + blk - 1) / blk;
    const size_t es = hpd_dtype_size(dt);
    /* the groups: a routing of T tokens */
    std::vector<float> logits = test_rnd((size_t)T * E, seed, 2.0f);
    routing_t r(T, E, K);
    hpd_moe_route_args_t ra = r.args(logits.data(), E, T, E, K, true);
    check_status("routing for a grouped GEMM", hpd_moe_route(cpu, &ra));
    /* E matrices [n][k] of dt (finite values of every dtype) and scales */
    std::mt19937 rng(seed);
    std::vector<uint8_t> w((size_t)E * n * k * es);
    for (size_t i = 0; i < (size_t)E * n * k; i++) {
        const float v = std::normal_distribution<float>()(rng);
        if (dt == HPD_DTYPE_F32)
            memcpy(&w[i * 4], &v, 4);
        else if (dt == HPD_DTYPE_BF16) {
            const uint16_t h = hpd_f32_to_bf16(v);
            memcpy(&w[i * 2], &h, 2);
        } else
            w[i] = (uint8_t)(rng() % 0x7e) | (rng() % 2 ? 0x80 : 0); /* no NaN */
    }
    std::vector<float> scales = test_rnd((size_t)E * n * sld, seed + 1, 0.01f);
    std::vector<float> x = test_rnd((size_t)S * k, seed + 2, 1.0f);
    std::vector<float> y0 = test_rnd((size_t)S * n, seed + 3, 1.0f), got = y0, want = y0;
    hpd_gemm_args_t g = {};
    g.x = x.data(), g.ldx = k, g.w = w.data(), g.w_dtype = dt;
    if (dt == HPD_DTYPE_F8_E4M3)
        g.w_scale = scales.data(), g.w_scale_ld = sld, g.w_block = blk;
    g.y = got.data(), g.ldy = n, g.m = S, g.n = n, g.k = k, g.accumulate = accumulate;
    const hpd_gemm_grouped_args_t ga = {.g = g, .first = r.first.data(), .n_groups = E,
                                        .max_rows = T};
    char what[128];
    snprintf(what, sizeof(what), "%s %s grouped, %u tokens x %u of %u experts%s", name,
             hpd_dtype_name(dt), T, K, E, accumulate ? " acc" : "");
    check_status(what, grouped(&emu.be, &ga));
    for (uint32_t e = 0; e < E; e++) {
        const uint32_t r0 = r.first[e], rows = r.first[e + 1] - r0;
        if (rows == 0)
            continue;
        hpd_gemm_args_t ge = g;
        ge.x += (size_t)r0 * k, ge.y = want.data() + (size_t)r0 * n, ge.m = rows;
        ge.w = w.data() + (size_t)e * n * k * es;
        if (ge.w_scale != nullptr)
            ge.w_scale += (size_t)e * n * sld;
        check_status(what, one(&emu.be, &ge));
    }
    check_same(what, got.data(), want.data(), got.size());
}

/* gather and moe_combine with the routing in (stand-in) device memory,
 * against the CPU backend's */
static void check_gather_combine(hpd_backend_t *cpu)
{
    test_emu_t emu;
    const uint32_t T = 37, E = 9, K = 3, D = 70, S = T * K;
    std::vector<float> logits = test_rnd((size_t)T * E, 11, 2.0f);
    routing_t r(T, E, K);
    hpd_moe_route_args_t ra = r.args(logits.data(), E, T, E, K, true);
    check_status("routing", hpd_cuda_moe_route(&emu.be, &ra));
    std::vector<float> h = test_rnd((size_t)T * D, 12, 1.0f), gw(S * D), gc(S * D);
    const hpd_gather_args_t gcpu = {.src = h.data(), .ld_src = D, .idx = r.idx.data(), .n = S,
                                    .dim = D, .dst = gc.data(), .ld_dst = D};
    hpd_gather_args_t gemu = gcpu;
    gemu.dst = gw.data(), gemu.idx = nullptr, gemu.idx_dev = r.idx.data();
    check_status("gather", hpd_gather(cpu, &gcpu));
    check_status("gather", hpd_cuda_gather(&emu.be, &gemu));
    check_same("gather", gw.data(), gc.data(), gw.size());
    std::vector<float> shared = test_rnd((size_t)T * D, 13, 1.0f), gate = test_rnd(T, 14, 1.0f);
    std::vector<float> xc = test_rnd((size_t)T * D, 15, 1.0f), xg = xc;
    hpd_moe_combine_args_t c = {.x = xc.data(),
                                .ldx = D,
                                .rows = gc.data(),
                                .ld_rows = D,
                                .slots = r.slots.data(),
                                .weights = r.w.data(),
                                .top_k = K,
                                .shared = shared.data(),
                                .ld_shared = D,
                                .gate = gate.data(),
                                .ld_gate = 1,
                                .n_tokens = T,
                                .dim = D};
    check_status("moe_combine", hpd_moe_combine(cpu, &c));
    c.x = xg.data();
    check_status("moe_combine", hpd_cuda_moe_combine(&emu.be, &c));
    /* the CPU's combine: the same roundings, no contraction */
    check_same("moe_combine", xg.data(), xc.data(), xg.size());
}

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();
    uint32_t seed = 1;
    for (bool norm : {true, false}) {
        check_route(cpu, 1, 4, 2, norm, false, seed++);
        check_route(cpu, 70, 64, 8, norm, false, seed++);   /* 3 words of tokens */
        check_route(cpu, 33, 512, 10, norm, false, seed++); /* Qwen3-Next's */
        check_route(cpu, 5, 1024, 32, norm, false, seed++); /* the bounds */
        check_route(cpu, 9, 1, 1, norm, false, seed++);
        check_route(cpu, 16, 1024, 32, norm, false, seed++); /* the one-block path's most */
        check_route(cpu, 17, 100, 4, norm, false, seed++);   /* the general path's fewest */
        check_route(cpu, 40, 20, 6, norm, true, seed++); /* every token ties */
    }
    /* an argument the kernels cannot take: refused, nothing written */
    {
        test_emu_t emu;
        routing_t r(1, 4, 4);
        float logits[4] = {0, 1, 2, 3};
        hpd_moe_route_args_t a = r.args(logits, 4, 1, 4, 5, true);
        hpd_test_checked++;
        if (hpd_cuda_moe_route(&emu.be, &a) != HPD_ERR_INVALID_ARG) {
            fprintf(stderr, "FAIL route: top_k 5 of 4 experts accepted\n");
            hpd_test_failed++;
        }
    }
    for (hpd_dtype_t dt : {HPD_DTYPE_F32, HPD_DTYPE_BF16, HPD_DTYPE_F8_E4M3})
        for (uint32_t T : {1u, 3u, 8u, 20u, 40u}) {
            const bool acc = T % 2 == 1;
            check_grouped(cpu, "cuda", hpd_cuda_gemm_grouped, hpd_cuda_gemm, false, dt, T, 6, 2,
                          acc, seed++);
            for (bool ring : {true, false})
                check_grouped(cpu, ring ? "cuda-bf16" : "cuda-bf16 no ring",
                              hpd_cuda_gemm_grouped_bf16, hpd_cuda_gemm_bf16, ring, dt, T, 6, 2,
                              acc, seed++);
        }
    /* groups of 67 rows on average: the tiled kernels (fewer on average
     * take the decode kernels, 32 rows a tile, as 40 tokens of 6 experts) */
    for (hpd_dtype_t dt : {HPD_DTYPE_BF16, HPD_DTYPE_F8_E4M3}) {
        check_grouped(cpu, "cuda", hpd_cuda_gemm_grouped, hpd_cuda_gemm, false, dt, 100, 3, 2,
                      true, seed++);
        check_grouped(cpu, "cuda-bf16", hpd_cuda_gemm_grouped_bf16, hpd_cuda_gemm_bf16, true, dt,
                      100, 3, 2, false, seed++);
    }
    /* many groups, most of them empty (the plan's blocks past its tiles) */
    check_grouped(cpu, "cuda", hpd_cuda_gemm_grouped, hpd_cuda_gemm, false, HPD_DTYPE_BF16, 3, 300,
                  4, false, seed++);
    check_grouped(cpu, "cuda-bf16", hpd_cuda_gemm_grouped_bf16, hpd_cuda_gemm_bf16, true,
                  HPD_DTYPE_BF16, 3, 300, 4, false, seed++);
    check_gather_combine(cpu);
    hpd_backend_destroy(cpu);
    return test_report("test_moe_cuda_host", t0);
}
