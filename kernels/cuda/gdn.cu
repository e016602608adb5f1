/* The gated delta rule's recurrent step on the GPU: one block per
 * (sequence, value head), one thread per value column j of the state
 * S[dk][dv]; per token, in the CPU backend's order:
 *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
 * Each column's sums run over x in ascending order in one thread, so the
 * result does not depend on the batch. */
#include "kernels/cuda/cuda_ops.h"

#define MAX_DK 256

__global__ void gdn_recurrent_kernel(hpd_gdn_args_t a, const hpd_seq_t *seqs,
                                     float *const *states)
{
    __shared__ float qs[MAX_DK], ks[MAX_DK];
    const uint32_t s = blockIdx.x / a.nv, h = blockIdx.x % a.nv, j = threadIdx.x;
    const uint32_t dk = a.dk, dv = a.dv, kh = h / (a.nv / a.nk);
    const hpd_seq_t seq = seqs[s];
    float *S = states[s] + (size_t)h * dk * dv;

    for (uint32_t i = 0; i < seq.n_tokens; i++) {
        const uint32_t row = seq.row + i;
        for (uint32_t x = j; x < dk; x += blockDim.x) {
            qs[x] = a.q.p[(size_t)row * a.q.ld + (size_t)kh * a.q.hs + x];
            ks[x] = a.k.p[(size_t)row * a.k.ld + (size_t)kh * a.k.hs + x];
        }
        __syncthreads();
        if (j < dv) {
            const float decay = expf(a.g[(size_t)row * a.nv + h]);
            const float beta = a.beta[(size_t)row * a.nv + h];
            float kv = 0.0f;
            for (uint32_t x = 0; x < dk; x++) {
                const float v = S[(size_t)x * dv + j] * decay;
                S[(size_t)x * dv + j] = v;
                kv += ks[x] * v;
            }
            const float u = (a.v.p[(size_t)row * a.v.ld + (size_t)h * a.v.hs + j] - kv) * beta;
            float o = 0.0f;
            for (uint32_t x = 0; x < dk; x++) {
                const float v = S[(size_t)x * dv + j] + ks[x] * u;
                S[(size_t)x * dv + j] = v;
            }
            for (uint32_t x = 0; x < dk; x++)
                o += qs[x] * S[(size_t)x * dv + j];
            a.out.p[(size_t)row * a.out.ld + (size_t)h * a.out.hs + j] = o;
        }
        __syncthreads();
    }
}

hpd_status_t hpd_cuda_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    size_t off = 0;
    void *seqs, *states;
    hpd_status_t st;
    if (a->dk > MAX_DK || a->dv > 1024 || a->nk == 0 || a->nv % a->nk != 0)
        return HPD_ERR_UNSUPPORTED;
    if (a->n_seqs == 0)
        return HPD_OK;
    if ((st = hpd_cuda_stage(b, a->seqs, a->n_seqs * sizeof(hpd_seq_t), &off, &seqs)) != HPD_OK ||
        (st = hpd_cuda_stage(b, a->states, a->n_seqs * sizeof(float *), &off, &states)) != HPD_OK)
        return st;
    const uint32_t threads = (a->dv + 31) / 32 * 32;
    gdn_recurrent_kernel<<<a->n_seqs * a->nv, threads, 0, hpd_cuda_ctx(b)->stream>>>(
        *a, (const hpd_seq_t *)seqs, (float *const *)states);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
