/* Causal depthwise conv1d + SiLU with a rolling conv state: one thread per
 * (sequence, channel) walks the sequence's tokens in order, as the CPU
 * backend does. The step form (decode) is the same with one token. */
#include "kernels/cuda/cuda_ops.h"

#define MAX_KC 16

__global__ void conv1d_kernel(hpd_conv1d_args_t a, const hpd_seq_t *seqs, float *const *states)
{
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    const uint32_t kc = a.kc, hist = a.kc - 1;
    if (c >= a.channels)
        return;
    const hpd_seq_t seq = seqs[s];
    const float *w = a.w + (size_t)c * kc;
    float *st = states[s] + (size_t)c * hist;
    float win[MAX_KC]; /* the last kc inputs, oldest first */
    for (uint32_t j = 0; j < hist; j++)
        win[j] = st[j];
    for (uint32_t i = 0; i < seq.n_tokens; i++) {
        const uint32_t row = seq.row + i;
        float acc = 0.0f;
        win[hist] = a.x[(size_t)row * a.ldx + c];
        for (uint32_t j = 0; j < kc; j++)
            acc += w[j] * win[j];
        a.y[(size_t)row * a.ldy + c] = acc / (1.0f + expf(-acc));
        for (uint32_t j = 0; j < hist; j++)
            win[j] = win[j + 1];
    }
    for (uint32_t j = 0; j < hist; j++)
        st[j] = win[j];
}

hpd_status_t hpd_cuda_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a)
{
    const hpd_seq_t *seqs;
    float *const *states;
    hpd_status_t st;
    if (a->kc < 2 || a->kc > MAX_KC)
        return HPD_ERR_UNSUPPORTED;
    if (a->n_seqs == 0)
        return HPD_OK;
    if ((st = hpd_cuda_stage_seqs(b, a->seqs, a->states, a->n_seqs, &seqs, &states)) != HPD_OK)
        return st;
    const dim3 grid((a->channels + 127) / 128, a->n_seqs);
    conv1d_kernel<<<grid, 128, 0, hpd_cuda_ctx(b)->stream>>>(*a, seqs, states);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
