/* The CUDA gated delta rule's kernels (kernels/cuda/gdn.cu), run on the host
 * through tests/kernels/cuda_host/, against the CPU backend (relative RMS
 * below 1e-4, NaN failing), with test_backend_cuda's identities: the
 * recurrent rule gives a sequence the same bits alone, in a batch and token
 * by token; the chunked rule the same bits alone, in a batch and resumed at
 * a multiple of 64. Shapes: the recurrent state in registers for dk 256,
 * 128, 64 and 32 (each a size of its register array), dv 80 and 40 partial
 * column tiles; the chunked rule's state pass in registers (dk 128 and 64)
 * and in shared memory (dk 48, dv 40); cuda-bf16's chunked rule on tensor
 * cores (dk 128 and 64) within 5e-3 of the CPU, 8e-3 with correlated keys
 * (which also check cuda's UT system far from I + A). The emulation runs a block's threads
 * in a fixed order and a warp's __syncwarp as a barrier of the whole block,
 * so races between warps are not caught here; test_backend_cuda on a GPU
 * checks them. */
#include "cuda_host_test.h"
extern "C" {
#include "kernels/cpu/cpu_ops.h" /* hpd_cpu_round_bf16: the CPU's rounding, not the kernels' */
}

/* Inputs of the rule for a batch of T rows: q, k L2-normalised (q scaled by
 * 1/sqrt(dk)) by the CPU backend, g < 0, beta in (0, 1), two states. With
 * corr, a head's keys share a direction (k = corr c + noise before the
 * norm), as a model's keys do: k_i . k_j near corr^2 / (1 + corr^2), so
 * the UT system's products of many terms weigh in (random keys of 128 dims
 * are nearly orthogonal, T nearly I + A). */
struct gdn_case_t {
    uint32_t nk, nv, dk, dv, T;
    size_t ns; /* floats of one sequence's state */
    std::vector<float> q, k, v, g, beta, S0;

    gdn_case_t(hpd_backend_t *cpu, uint32_t T_, uint32_t nk_, uint32_t nv_, uint32_t dk_,
               uint32_t dv_, uint32_t seed, float corr = 0.0f)
        : nk(nk_), nv(nv_), dk(dk_), dv(dv_), T(T_), ns((size_t)nv_ * dk_ * dv_)
    {
        q = test_rnd((size_t)T * nk * dk, seed, 1), k = test_rnd((size_t)T * nk * dk, seed + 1, 1);
        if (corr != 0.0f) { /* noise and direction of norms near 1 and corr */
            const float rs = 1.0f / sqrtf((float)dk);
            const std::vector<float> dir = test_rnd((size_t)nk * dk, seed + 6, corr * rs);
            for (size_t i = 0; i < k.size(); i++)
                k[i] = k[i] * rs + dir[i % ((size_t)nk * dk)];
        }
        v = test_rnd((size_t)T * nv * dv, seed + 2, 1), S0 = test_rnd(2 * ns, seed + 5, 0.05f);
        std::mt19937 rng(seed + 3);
        std::uniform_real_distribution<float> u;
        for (uint32_t i = 0; i < T * nv; i++) {
            g.push_back(-0.02f - 0.2f * u(rng));
            beta.push_back(0.1f + 0.8f * u(rng));
        }
        hpd_l2norm_args_t l2 = {.x = {.p = q.data(), .ld = nk * dk, .hs = dk},
                                .n_tokens = T,
                                .n_heads = nk,
                                .dim = dk,
                                .eps = 1e-6f,
                                .scale = 1.0f / sqrtf((float)dk)};
        check_status("l2norm of q", hpd_l2norm(cpu, &l2));
        l2.x.p = k.data(), l2.scale = 1.0f;
        check_status("l2norm of k", hpd_l2norm(cpu, &l2));
    }

    hpd_gdn_args_t args(float *out, float *const *states, const hpd_seq_t *seqs, uint32_t n)
    {
        const uint32_t qs = nk * dk, vs = nv * dv;
        return hpd_gdn_args_t{.q = {.p = q.data(), .ld = qs, .hs = dk},
                              .k = {.p = k.data(), .ld = qs, .hs = dk},
                              .v = {.p = v.data(), .ld = vs, .hs = dv},
                              .g = g.data(),
                              .beta = beta.data(),
                              .out = {.p = out, .ld = vs, .hs = dv},
                              .nk = nk,
                              .nv = nv,
                              .dk = dk,
                              .dv = dv,
                              .states = states,
                              .seqs = seqs,
                              .n_seqs = n};
    }
};

typedef hpd_status_t (*gdn_op_t)(hpd_backend_t *, const hpd_gdn_args_t *);

/* The rule over seqs[0..1] (sequence 1 starting at position 0) on the CPU
 * and emulated, compared (relative RMS below tol); then sequence 1 alone,
 * and in the calls `parts` (rows and positions of its pieces in order), the
 * same bits as in the batch. smem_optin: the emulated GPU's shared memory
 * per block (0: an H100's). */
static void gdn_case(hpd_backend_t *cpu, const char *name, gdn_op_t cpu_op, gdn_op_t emu_op,
                     gdn_case_t &c, const hpd_seq_t seqs[2], const std::vector<hpd_seq_t> &parts,
                     double tol = 1e-4, size_t smem_optin = 0)
{
    test_emu_t emu;
    if (smem_optin != 0)
        emu.ctx.smem_optin = smem_optin;
    const size_t ns = c.ns, vs = (size_t)c.nv * c.dv, nvv = (size_t)c.T * vs;
    const size_t off = (size_t)seqs[1].row * vs, n1 = (size_t)seqs[1].n_tokens * vs;
    std::vector<float> Sc(c.S0), Se(c.S0), ocpu(nvv, 0.0f), oemu(nvv, 0.0f);
    float *sc[2] = {Sc.data(), Sc.data() + ns}, *se[2] = {Se.data(), Se.data() + ns};
    char what[128];

    hpd_gdn_args_t a = c.args(ocpu.data(), sc, seqs, 2);
    check_status(name, cpu_op(cpu, &a));
    a = c.args(oemu.data(), se, seqs, 2);
    check_status(name, emu_op(&emu.be, &a));
    snprintf(what, sizeof(what), "%s dk %u dv %u", name, c.dk, c.dv);
    check_close(what, oemu.data(), ocpu.data(), nvv, tol);
    snprintf(what, sizeof(what), "%s dk %u dv %u state", name, c.dk, c.dv);
    check_close(what, Se.data(), Sc.data(), 2 * ns, tol);

    /* sequence 1 alone in one call, then in its parts */
    std::vector<float> one(c.S0.begin() + ns, c.S0.end()), o(nvv, 0.0f);
    float *sone[1] = {one.data()};
    a = c.args(o.data(), sone, &seqs[1], 1);
    check_status(name, emu_op(&emu.be, &a));
    snprintf(what, sizeof(what), "%s dk %u: alone vs in the batch", name, c.dk);
    check_same(what, o.data() + off, oemu.data() + off, n1);
    check_same(what, one.data(), Se.data() + ns, ns);
    std::copy(c.S0.begin() + ns, c.S0.end(), one.begin());
    std::fill(o.begin(), o.end(), 0.0f);
    for (const hpd_seq_t &p : parts) {
        a = c.args(o.data(), sone, &p, 1);
        check_status(name, emu_op(&emu.be, &a));
    }
    snprintf(what, sizeof(what), "%s dk %u: %zu calls vs one", name, c.dk, parts.size());
    check_same(what, o.data() + off, oemu.data() + off, n1);
    check_same(what, one.data(), Se.data() + ns, ns);
}

/* cuda-bf16's chunked rule (dk 64 and 128: both passes on tensor cores) in
 * double, rounded where its kernels round: gc, e^gc, e^(gc_last - gc) and
 * the decays in float as the kernels take them; q~, k~, QK, QE, KE, W,
 * (k beta e^gc)~, (v beta)~ and T~ to bf16 (each from its float value), U
 * and VN to float; per chunk S~ and VN~ to bf16. The kernels' mma sums (in
 * double on the stand-in, in fp32 on a GPU) and its blocked solve differ
 * from this in the last bits of the float values only, so the emulated
 * kernels are held to it far tighter than to the CPU's fp32 rule: an error
 * in the roundings themselves (a bf16 taken from the wrong value, a decay
 * off by an ulp's worth) shows here and hides in the 5e-3 against fp32. */
static float bf16_of(double x)
{
    return hpd_bf16_to_f32(hpd_cpu_round_bf16((float)x));
}

static hpd_status_t bf16_chunked_ref(hpd_backend_t *, const hpd_gdn_args_t *a)
{
    const uint32_t dk = a->dk, dv = a->dv, nv = a->nv, C = 64;
    std::vector<double> S((size_t)dk * dv), T(C * C), A(C * C), QK(C * C);
    std::vector<float> qb(C * dk), kb(C * dk), kbe(C * dk), kbeb(C * dk), W(C * dk), QE(C * dk),
        KE(C * dk), vb(C * dv), vbb(C * dv), U(C * dv), Sb((size_t)dk * dv), VNb(C * dv);
    for (uint32_t s = 0; s < a->n_seqs; s++)
        for (uint32_t h = 0; h < nv; h++) {
            const uint32_t kh = h / (nv / a->nk);
            float *st = a->states[s] + (size_t)h * dk * dv;
            std::copy(st, st + (size_t)dk * dv, S.begin());
            for (uint32_t done = 0; done < a->seqs[s].n_tokens;) {
                const uint32_t pos = a->seqs[s].start_pos + done, r0 = a->seqs[s].row + done;
                const uint32_t L = std::min(C - pos % C, a->seqs[s].n_tokens - done);
                done += L;
                const auto q = [&](uint32_t i, uint32_t x) {
                    return a->q.p[(size_t)(r0 + i) * a->q.ld + (size_t)kh * a->q.hs + x];
                };
                const auto k = [&](uint32_t i, uint32_t x) {
                    return a->k.p[(size_t)(r0 + i) * a->k.ld + (size_t)kh * a->k.hs + x];
                };
                const auto v = [&](uint32_t i, uint32_t d) {
                    return a->v.p[(size_t)(r0 + i) * a->v.ld + (size_t)h * a->v.hs + d];
                };
                float gc[64], eg[64], el[64], beta[64], acc = 0.0f;
                for (uint32_t i = 0; i < L; i++) {
                    gc[i] = acc += a->g[(size_t)(r0 + i) * nv + h];
                    beta[i] = a->beta[(size_t)(r0 + i) * nv + h];
                }
                for (uint32_t i = 0; i < L; i++)
                    eg[i] = expf(gc[i]), el[i] = expf(gc[L - 1] - gc[i]);
                const float elast = expf(gc[L - 1]);
                for (uint32_t i = 0; i < L; i++)
                    for (uint32_t x = 0; x < dk; x++) {
                        const size_t p = (size_t)i * dk + x;
                        qb[p] = bf16_of(q(i, x)), kb[p] = bf16_of(k(i, x));
                        kbe[p] = k(i, x) * beta[i] * eg[i]; /* (float products) */
                        kbeb[p] = bf16_of(kbe[p]);
                        QE[p] = bf16_of(q(i, x) * eg[i]), KE[p] = bf16_of(k(i, x) * el[i]);
                    }
                for (uint32_t i = 0; i < L; i++)
                    for (uint32_t d = 0; d < dv; d++)
                        vb[i * dv + d] = v(i, d) * beta[i], vbb[i * dv + d] = bf16_of(vb[i * dv + d]);
                /* QK, A, and T = (I - A)^-1 (strictly lower) */
                for (uint32_t i = 0; i < L; i++)
                    for (uint32_t j = 0; j <= i; j++) {
                        double dq = 0, dkk = 0;
                        for (uint32_t x = 0; x < dk; x++) {
                            dq += (double)qb[i * dk + x] * kb[j * dk + x];
                            dkk += (double)kb[i * dk + x] * kb[j * dk + x];
                        }
                        const float e = expf(gc[i] - gc[j]);
                        QK[i * C + j] = bf16_of((float)dq * e);
                        A[i * C + j] = -((float)dkk * beta[i] * e);
                    }
                for (uint32_t i = 0; i < L; i++)
                    for (uint32_t j = 0; j < i; j++) {
                        double t = A[i * C + j];
                        for (uint32_t m = j + 1; m < i; m++)
                            t += A[i * C + m] * T[m * C + j];
                        T[i * C + j] = t;
                    }
                /* W = kbe + T~ kbe~, U = vb + T~ vb~ */
                for (uint32_t i = 0; i < L; i++) {
                    for (uint32_t x = 0; x < dk; x++) {
                        double w = kbe[i * dk + x];
                        for (uint32_t j = 0; j < i; j++)
                            w += (double)bf16_of(T[i * C + j]) * kbeb[j * dk + x];
                        W[i * dk + x] = bf16_of(w);
                    }
                    for (uint32_t d = 0; d < dv; d++) {
                        double u = vb[i * dv + d];
                        for (uint32_t j = 0; j < i; j++)
                            u += (double)bf16_of(T[i * C + j]) * vbb[j * dv + d];
                        U[i * dv + d] = (float)u;
                    }
                }
                /* the state pass: VN~, o, S */
                for (size_t p = 0; p < (size_t)dk * dv; p++)
                    Sb[p] = bf16_of(S[p]);
                for (uint32_t i = 0; i < L; i++)
                    for (uint32_t d = 0; d < dv; d++) {
                        double ws = 0;
                        for (uint32_t x = 0; x < dk; x++)
                            ws += (double)W[i * dk + x] * Sb[(size_t)x * dv + d];
                        VNb[i * dv + d] = bf16_of(U[i * dv + d] - (float)ws);
                    }
                for (uint32_t i = 0; i < L; i++)
                    for (uint32_t d = 0; d < dv; d++) {
                        double o = 0;
                        for (uint32_t x = 0; x < dk; x++)
                            o += (double)QE[i * dk + x] * Sb[(size_t)x * dv + d];
                        for (uint32_t j = 0; j <= i; j++)
                            o += QK[i * C + j] * VNb[j * dv + d];
                        a->out.p[(size_t)(r0 + i) * a->out.ld + (size_t)h * a->out.hs + d] =
                            (float)o;
                    }
                for (uint32_t x = 0; x < dk; x++)
                    for (uint32_t d = 0; d < dv; d++) {
                        double sv = (float)S[(size_t)x * dv + d] * elast;
                        for (uint32_t i = 0; i < L; i++)
                            sv += (double)KE[i * dk + x] * VNb[i * dv + d];
                        S[(size_t)x * dv + d] = (float)sv; /* (the kernel's state is fp32) */
                    }
            }
            std::copy(S.begin(), S.end(), st);
        }
    return HPD_OK;
}

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();

    /* recurrent: sequence 1 (rows 5..68) alone, in the batch, token by token */
    const hpd_seq_t rseqs[2] = {{.row = 0, .n_tokens = 5, .start_pos = 70},
                                {.row = 5, .n_tokens = 64, .start_pos = 0}};
    std::vector<hpd_seq_t> steps;
    for (uint32_t i = 0; i < 64; i++)
        steps.push_back(hpd_seq_t{.row = 5 + i, .n_tokens = 1, .start_pos = i});
    static const uint32_t rshapes[][4] = {{2, 4, 128, 80}, {2, 4, 64, 64}, {1, 2, 32, 32},
                                          {1, 2, 256, 40}};
    for (const auto &sh : rshapes) {
        gdn_case_t c(cpu, 69, sh[0], sh[1], sh[2], sh[3], 50 + sh[2]);
        gdn_case(cpu, "gdn_recurrent", hpd_gdn_recurrent, hpd_cuda_gdn_recurrent, c, rseqs, steps);
    }

    /* chunked: sequence 0 off the 64 grid; sequence 1 (rows 200..299) alone,
     * in the batch, and resumed at position 64 */
    const hpd_seq_t cseqs[2] = {{.row = 0, .n_tokens = 200, .start_pos = 40},
                                {.row = 200, .n_tokens = 100, .start_pos = 0}};
    const std::vector<hpd_seq_t> halves = {{.row = 200, .n_tokens = 64, .start_pos = 0},
                                           {.row = 264, .n_tokens = 36, .start_pos = 64}};
    /* dk 128 and 64: the register state pass staged through shared memory;
     * 256: in registers without the staging (it does not fit); 96 and 48:
     * the shared-memory state pass; dv 160 over dk 64: pass 1's v beta
     * read from global memory (it does not fit q's room) */
    static const uint32_t cshapes[][4] = {{2, 4, 128, 128}, {2, 4, 64, 64}, {1, 2, 256, 40},
                                          {1, 2, 96, 80},   {1, 2, 48, 40}, {1, 2, 64, 160}};
    for (const auto &sh : cshapes) {
        gdn_case_t c(cpu, 300, sh[0], sh[1], sh[2], sh[3], 30 + sh[2]);
        gdn_case(cpu, "gdn_chunked", hpd_gdn_chunked, hpd_cuda_gdn_chunked, c, cseqs, halves);
    }
    { /* and with correlated keys (the UT system far from I + A) */
        gdn_case_t c(cpu, 300, 2, 4, 128, 128, 31, 2.0f);
        gdn_case(cpu, "gdn_chunked", hpd_gdn_chunked, hpd_cuda_gdn_chunked, c, cseqs, halves);
    }
    /* cuda-bf16's: both passes on tensor cores for dk 128 and 64 (dv 40: a
     * partial column tile; 100 KiB of shared memory: one chunk buffer, not
     * two), cuda's fp32 passes for dk 48; against the CPU's fp32 within
     * 5e-3 (fla's own bf16 tolerance; the stand-in measures 3.3e-3), 8e-3
     * with correlated keys (5.2e-3); and within 1e-4 of bf16_chunked_ref,
     * the same rule in double rounded where the kernels round */
    static const uint32_t bshapes[][6] = {{2, 4, 128, 128, 0, 0}, {2, 4, 128, 128, 0, 2},
                                          {2, 4, 64, 64, 0, 2},   {1, 2, 128, 40, 0, 0},
                                          {2, 4, 128, 128, 100, 0}, {1, 2, 48, 40, 0, 2},
                                          {1, 2, 64, 160, 0, 0}};
    for (const auto &sh : bshapes) {
        gdn_case_t c(cpu, 300, sh[0], sh[1], sh[2], sh[3], 70 + sh[2], (float)sh[5]);
        gdn_case(cpu, "gdn_chunked_bf16", hpd_gdn_chunked, hpd_cuda_gdn_chunked_bf16, c, cseqs,
                 halves, sh[5] != 0 ? 8e-3 : 5e-3, (size_t)sh[4] * 1024);
        if ((sh[2] == 64 || sh[2] == 128) && sh[4] == 0) /* (measured 5e-7 .. 1.4e-5) */
            gdn_case(cpu, "gdn_chunked_bf16 vs its roundings", bf16_chunked_ref,
                     hpd_cuda_gdn_chunked_bf16, c, cseqs, halves, 1e-4);
    }
    hpd_backend_destroy(cpu);
    return test_report("test_gdn_cuda_host", t0);
}
