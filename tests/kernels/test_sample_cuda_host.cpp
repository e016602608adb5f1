/* The CUDA sampler (kernels/cuda/sample.cu), run on the host through
 * tests/kernels/cuda_host/, against its definition worked out in double
 * precision: greedy rows take the first maximum (ties to the lowest id);
 * sampled rows keep the top_k largest scaled logits (ties at the threshold
 * to the lowest ids), then the fewest of those, largest first (ties to the
 * lowest ids), whose probability mass reaches top_p, and draw u (Philox,
 * keyed by seed and position) along the kept probabilities in id order.
 * Rows whose draw or top-p cut falls within 1e-4 of the mass of a boundary
 * (where fp32 sums may round either way) are left out; the rest must give
 * the reference's token exactly. Vocabularies below and above the block's
 * 1024 threads, logits with ties, every combination of the parameters, and
 * nearly flat rows whose top-p set is more than 1024 ids (the bisection;
 * other rows' sets are among their 1024 largest, sorted). It
 * needs no GPU; test_backend_cuda checks the sampler against the CPU's on
 * one. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/rng.h"
#include "kernels/cuda/cuda_ops.h"

static uint32_t key_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

/* the token the definition gives, or -1 when the row is too close to a
 * boundary to say */
static int reference(const std::vector<float> &x, const hpd_sampling_t &s, float u)
{
    const uint32_t V = (uint32_t)x.size();
    if (s.temperature <= 0.0f)
        return (int)(std::max_element(x.begin(), x.end()) - x.begin()); /* the first maximum */
    const float inv_t = 1.0f / s.temperature;
    std::vector<float> xs(V);
    std::vector<uint32_t> order(V);
    for (uint32_t i = 0; i < V; i++)
        xs[i] = x[i] * inv_t, order[i] = i;
    /* largest first, ties to the lowest id */
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return key_of(xs[a]) > key_of(xs[b]); });
    const double mx = xs[order[0]];
    uint32_t n_kept = s.top_k > 0 && s.top_k < V ? s.top_k : V;
    double total = 0;
    for (uint32_t r = 0; r < n_kept; r++)
        total += std::exp((double)xs[order[r]] - mx);
    if (s.top_p < 1.0f) {
        const double target = (double)s.top_p * total;
        double mass = 0;
        uint32_t r = 0;
        while (r < n_kept && mass < target)
            mass += std::exp((double)xs[order[r++]] - mx);
        /* where the cut falls at a tie, the kernel's fp32 count of the ids
         * it takes may differ by one: close calls are left out */
        for (uint32_t q = r > 0 ? r - 1 : 0; q <= r && q < n_kept; q++) {
            double before = 0;
            for (uint32_t t = 0; t < q; t++)
                before += std::exp((double)xs[order[t]] - mx);
            if (std::fabs(before - target) < 1e-4 * total)
                return -1;
        }
        n_kept = std::max(r, 1u);
        total = mass;
    }
    std::vector<uint32_t> kept(order.begin(), order.begin() + n_kept);
    std::sort(kept.begin(), kept.end()); /* the draw walks ids in order */
    const double target = (double)u * total;
    double cum = 0;
    for (uint32_t id : kept) {
        const double p = std::exp((double)xs[id] - mx);
        if (std::fabs(cum - target) < 1e-4 * total || std::fabs(cum + p - target) < 1e-4 * total)
            return -1; /* near an edge */
        if (target < cum + p)
            return (int)id;
        cum += p;
    }
    return (int)kept.back();
}

int main()
{
    static const uint32_t vocabs[] = {151, 700, 5000};
    static const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f};
    static const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
    hpd_cuda_ctx_t ctx = {};
    hpd_backend_t be = {nullptr, &ctx};
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    int checked = 0, skipped = 0, failed = 0;

    for (uint32_t V : vocabs) {
        const uint32_t top_ks[] = {0, 1, 5, 50, V - 1, V + 3};
        const uint32_t rows = 64;
        std::vector<float> logits((size_t)rows * V);
        std::vector<hpd_sampling_t> params(rows);
        std::vector<uint64_t> pos(rows);
        std::vector<int32_t> out(rows, -7);
        for (uint32_t r = 0; r < rows; r++) {
            float *x = &logits[(size_t)r * V];
            /* every 8th row nearly flat: past 1024 ids, top-p's nucleus is
             * more than the block's NT largest (the bisection) */
            const float scale = r % 8 == 7 ? 0.02f : 3.0f;
            for (uint32_t i = 0; i < V; i++) {
                float v = scale * normal(rng);
                if (r % 2 == 1 && r % 8 != 7)
                    v = std::round(v); /* ties, at the top-k threshold too */
                x[i] = v;
            }
            if (r % 4 == 3) { /* the maximum three times: in one thread's run and in others */
                const uint32_t m = (uint32_t)(std::max_element(x, x + V) - x);
                x[(m + 1) % V] = x[(m + V / 2) % V] = x[m];
            }
            params[r] = {temps[rng() % 4], top_ps[rng() % 4], top_ks[rng() % 6], rng()};
            if (r % 8 == 5) /* top-k alone, where the ties at its threshold decide */
                params[r].top_p = 1.0f, params[r].top_k = r % 16 == 5 ? 5 : 50;
            if (r % 8 == 7) /* top-p alone, or past NT ids of top-k */
                params[r].temperature = 1.0f, params[r].top_p = 0.9f,
                params[r].top_k = r % 16 == 7 ? 0 : 2000;
            pos[r] = rng() % 100000;
        }
        hpd_sample_args_t a = {logits.data(), V, rows, V, params.data(), pos.data(), out.data()};
        if (hpd_cuda_sample(&be, &a) != HPD_OK) {
            fprintf(stderr, "vocab %u: hpd_cuda_sample failed\n", V);
            return 1;
        }
        for (uint32_t r = 0; r < rows; r++) {
            const std::vector<float> x(logits.begin() + (size_t)r * V,
                                       logits.begin() + (size_t)(r + 1) * V);
            const float u = params[r].temperature <= 0.0f
                                ? 0.0f
                                : hpd_rng_uniform(params[r].seed, pos[r]);
            const int want = reference(x, params[r], u);
            if (want < 0) {
                skipped++;
                continue;
            }
            checked++;
            if (out[r] != want) {
                failed++;
                fprintf(stderr,
                        "vocab %u row %u (t %g, top_p %g, top_k %u, u %.6f): token %d, the "
                        "definition gives %d\n",
                        V, r, params[r].temperature, params[r].top_p, params[r].top_k, u, out[r],
                        want);
            }
        }
    }
    hpd_emu_ctx_free(&ctx);
    printf("sampler: %d rows checked, %d close calls left out, %d wrong\n", checked, skipped,
           failed);
    return failed == 0 && checked >= 150 ? 0 : 1;
}
