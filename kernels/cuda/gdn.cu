/* The gated delta rule on the GPU (docs/kernels.md has the math).
 *
 * Recurrent step (decode): one block per (sequence, value head), one thread
 * per value column j of the state S[dk][dv]; per token, in the CPU
 * backend's order:
 *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
 *
 * Chunked form (prefill): one block per (sequence, value head) walks the
 * sequence's chunks on the absolute 64-token grid; a chunk's q, k, the UT
 * system, u, w and the new values sit in shared memory, the state in its
 * slot. Every sum is taken by one thread in ascending order, so a head's
 * result depends on its own tokens alone, not on the batch. */
#include "kernels/cuda/cuda_ops.h"

#define MAX_DK 256

/* up to 1024 threads (dv <= 1024): the bound keeps the registers within
 * what a block of 1024 may have */
__global__ void __launch_bounds__(1024)
    gdn_recurrent_kernel(hpd_gdn_args_t a, const hpd_seq_t *seqs, float *const *states)
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
    const hpd_seq_t *seqs;
    float *const *states;
    hpd_status_t st;
    if (a->dk > MAX_DK || a->dv > 1024 || a->nk == 0 || a->nv % a->nk != 0)
        return HPD_ERR_UNSUPPORTED;
    if (a->n_seqs == 0)
        return HPD_OK;
    if ((st = hpd_cuda_stage_seqs(b, a->seqs, a->states, a->n_seqs, &seqs, &states)) != HPD_OK)
        return st;
    const uint32_t threads = (a->dv + 31) / 32 * 32;
    gdn_recurrent_kernel<<<a->n_seqs * a->nv, threads, 0, hpd_cuda_ctx(b)->stream>>>(
        *a, seqs, states);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* ---------------------------------------------------------------- chunked */

#define C HPD_GDN_CHUNK
#define CHUNK_THREADS 256

/* floats of dynamic shared memory for dk, dv */
static size_t chunk_smem_floats(uint32_t dk, uint32_t dv)
{
    return 4 * C /* gc, beta, exp(gc), exp(glast - gc) */ + C /* a row of A */ +
           2 * (size_t)C * dk /* q, k */ + (size_t)C * dk /* w */ + (size_t)C * dv /* u, vn */ +
           2 * (size_t)C * C /* A (then T), QK */;
}

__global__ void gdn_chunked_kernel(hpd_gdn_args_t a, const hpd_seq_t *seqs,
                                   float *const *states)
{
    extern __shared__ float sm[];
    const uint32_t s = blockIdx.x / a.nv, h = blockIdx.x % a.nv, tid = threadIdx.x;
    const uint32_t dk = a.dk, dv = a.dv, nv = a.nv, kh = h / (a.nv / a.nk);
    const hpd_seq_t seq = seqs[s];
    float *S = states[s] + (size_t)h * dk * dv;
    float *gc = sm, *beta = gc + C, *eg = beta + C, *el = eg + C, *row = el + C;
    float *qs = row + C, *ks = qs + (size_t)C * dk, *w = ks + (size_t)C * dk;
    float *u = w + (size_t)C * dk, *A = u + (size_t)C * dv, *QK = A + C * C;

    for (uint32_t done = 0; done < seq.n_tokens;) {
        const uint32_t pos = seq.start_pos + done;
        const uint32_t L = min(C - pos % C, seq.n_tokens - done);
        const uint32_t r0 = seq.row + done;

        for (uint32_t i = tid; i < L * dk; i += blockDim.x) {
            const uint32_t t = i / dk, x = i % dk;
            qs[i] = a.q.p[(size_t)(r0 + t) * a.q.ld + (size_t)kh * a.q.hs + x];
            ks[i] = a.k.p[(size_t)(r0 + t) * a.k.ld + (size_t)kh * a.k.hs + x];
        }
        if (tid == 0) {
            float acc = 0.0f;
            for (uint32_t i = 0; i < L; i++) {
                acc += a.g[(size_t)(r0 + i) * nv + h];
                gc[i] = acc;
                beta[i] = a.beta[(size_t)(r0 + i) * nv + h];
                eg[i] = expf(acc);
            }
            for (uint32_t i = 0; i < L; i++)
                el[i] = expf(gc[L - 1] - gc[i]);
        }
        __syncthreads();
        /* A[i][j] = -((k_i beta_i) . k_j) exp(gc_i - gc_j), j < i;
         * QK[i][j] = (q_i . k_j) exp(gc_i - gc_j), j <= i */
        for (uint32_t p = tid; p < L * L; p += blockDim.x) {
            const uint32_t i = p / L, j = p % L;
            if (j > i)
                continue;
            const float e = expf(gc[i] - gc[j]);
            float dq = 0.0f, dkk = 0.0f;
            for (uint32_t x = 0; x < dk; x++) {
                dq += qs[i * dk + x] * ks[j * dk + x];
                dkk += (ks[i * dk + x] * beta[i]) * ks[j * dk + x];
            }
            QK[i * C + j] = dq * e;
            if (j < i)
                A[i * C + j] = -dkk * e;
        }
        __syncthreads();
        /* forward substitution, row by row: T = (I + L)^-1, unit diagonal */
        for (uint32_t i = 1; i < L; i++) {
            if (tid < i)
                row[tid] = A[i * C + tid];
            __syncthreads();
            if (tid < i) {
                float acc = row[tid];
                for (uint32_t m = tid + 1; m < i; m++)
                    acc = fmaf(row[m], A[m * C + tid], acc);
                A[i * C + tid] = acc;
            }
            __syncthreads();
        }
        /* u = T (v beta), w = T (k beta exp(gc)) */
        for (uint32_t p = tid; p < L * (dv + dk); p += blockDim.x) {
            if (p < L * dv) {
                const uint32_t i = p / dv, d = p % dv;
                const float *v = a.v.p + (size_t)h * a.v.hs + d;
                float acc = v[(size_t)(r0 + i) * a.v.ld] * beta[i];
                for (uint32_t j = 0; j < i; j++)
                    acc = fmaf(A[i * C + j], v[(size_t)(r0 + j) * a.v.ld] * beta[j], acc);
                u[p] = acc;
            } else {
                const uint32_t q = p - L * dv, i = q / dk, x = q % dk;
                float acc = (ks[i * dk + x] * beta[i]) * eg[i];
                for (uint32_t j = 0; j < i; j++)
                    acc = fmaf(A[i * C + j], (ks[j * dk + x] * beta[j]) * eg[j], acc);
                w[q] = acc;
            }
        }
        __syncthreads();
        /* new values: vn = u - w S */
        for (uint32_t p = tid; p < L * dv; p += blockDim.x) {
            const uint32_t i = p / dv, d = p % dv;
            float acc = 0.0f;
            for (uint32_t x = 0; x < dk; x++)
                acc += w[i * dk + x] * S[(size_t)x * dv + d];
            u[p] -= acc;
        }
        __syncthreads();
        /* o_i = (q_i exp(gc_i)) S + sum_{j <= i} QK[i][j] vn_j */
        for (uint32_t p = tid; p < L * dv; p += blockDim.x) {
            const uint32_t i = p / dv, d = p % dv;
            float acc = 0.0f;
            for (uint32_t x = 0; x < dk; x++)
                acc += (qs[i * dk + x] * eg[i]) * S[(size_t)x * dv + d];
            for (uint32_t j = 0; j <= i; j++)
                acc += QK[i * C + j] * u[j * dv + d];
            a.out.p[(size_t)(r0 + i) * a.out.ld + (size_t)h * a.out.hs + d] = acc;
        }
        __syncthreads();
        /* S = exp(gc_last) S + sum_i (k_i exp(gc_last - gc_i)) vn_i^T */
        const float elast = eg[L - 1];
        for (uint32_t p = tid; p < dk * dv; p += blockDim.x) {
            const uint32_t x = p / dv, d = p % dv;
            float acc = S[p] * elast;
            for (uint32_t i = 0; i < L; i++)
                acc = fmaf(ks[i * dk + x] * el[i], u[i * dv + d], acc);
            S[p] = acc;
        }
        __syncthreads();
        done += L;
    }
}

hpd_status_t hpd_cuda_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    const hpd_seq_t *seqs;
    float *const *states;
    hpd_status_t st;

    if (a->nk == 0 || a->nv % a->nk != 0)
        return HPD_ERR_INVALID_ARG;
    const size_t smem = chunk_smem_floats(a->dk, a->dv) * sizeof(float);
    if (smem > c->smem_optin) {
        HPD_LOG_ERROR("cuda", "gdn_chunked: dk %u, dv %u need %zu bytes of shared memory, GPU %d "
                      "has %zu per block", a->dk, a->dv, smem, c->device, c->smem_optin);
        return HPD_ERR_UNSUPPORTED;
    }
    if (a->n_seqs == 0)
        return HPD_OK;
    if ((st = hpd_cuda_stage_seqs(b, a->seqs, a->states, a->n_seqs, &seqs, &states)) != HPD_OK)
        return st;
    HPD_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunked_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    gdn_chunked_kernel<<<a->n_seqs * a->nv, CHUNK_THREADS, smem, c->stream>>>(
        *a, seqs, states);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
