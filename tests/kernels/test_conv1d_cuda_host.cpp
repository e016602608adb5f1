/* The gated delta rule's causal depthwise conv1d with SiLU
 * (conv1d_kernel in kernels/cuda/conv1d.cu) on the host stand-in, against
 * the CPU backend within 1e-6: a batch of a prompt, a continued prompt and
 * decode rows (one token), each sequence with its own rolling state, the
 * outputs and the states after the call; channels past a block's 128, input
 * and output rows with gaps, kernel widths 4 (Qwen3-Next's) and 2. The
 * state of a sequence of no tokens stays as it was. It needs no GPU;
 * test_backend_cuda runs the op on one. */
#include "cuda_host_test.h"

static void conv1d_case(hpd_backend_t *cpu, uint32_t channels, uint32_t kc)
{
    const hpd_seq_t seqs[] = {{.row = 0, .n_tokens = 9, .start_pos = 0},
                              {.row = 9, .n_tokens = 1, .start_pos = 40},
                              {.row = 10, .n_tokens = 0, .start_pos = 3},
                              {.row = 10, .n_tokens = 5, .start_pos = 17},
                              {.row = 15, .n_tokens = 1, .start_pos = 2}};
    const uint32_t n_seqs = 5, rows = 16, ldx = channels + 9, ldy = channels + 3;
    const uint32_t hist = kc - 1;
    const std::vector<float> x = test_rnd((size_t)rows * ldx, 81, 2);
    const std::vector<float> w = test_rnd((size_t)channels * kc, 82, 0.7f);
    const std::vector<float> st0 = test_rnd((size_t)n_seqs * channels * hist, 83, 1);
    const std::vector<float> y0 = test_rnd((size_t)rows * ldy, 84, 1);
    std::vector<float> out[2], st[2];
    for (int way = 0; way < 2; way++) { /* the stand-in, the CPU */
        std::vector<float> y = y0, s = st0;
        float *states[5];
        for (uint32_t i = 0; i < n_seqs; i++)
            states[i] = s.data() + (size_t)i * channels * hist;
        const hpd_conv1d_args_t a = {.x = x.data(), .ldx = ldx, .y = y.data(), .ldy = ldy,
                                     .w = w.data(), .channels = channels, .kc = kc,
                                     .states = states, .seqs = seqs, .n_seqs = n_seqs};
        test_emu_t emu;
        check_status(way ? "cpu conv1d" : "conv1d",
                     way ? hpd_conv1d(cpu, &a) : hpd_cuda_conv1d(&emu.be, &a));
        out[way] = y, st[way] = s;
    }
    char what[96];
    snprintf(what, sizeof(what), "conv1d %u channels kc %u: outputs", channels, kc);
    check_close(what, out[0].data(), out[1].data(), out[0].size(), 1e-6);
    snprintf(what, sizeof(what), "conv1d %u channels kc %u: states", channels, kc);
    check_same(what, st[0].data(), st[1].data(), st[0].size());
}

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();
    conv1d_case(cpu, 300, 4);
    conv1d_case(cpu, 64, 2);
    hpd_backend_destroy(cpu);
    return test_report("test_conv1d_cuda_host", t0);
}
