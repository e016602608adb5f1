/* The gated delta rule on the GPU (docs/kernels.md has the math).
 *
 * Recurrent step (decode), per token, in the CPU backend's order:
 *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q,
 * with the state in registers (below).
 *
 * Chunked form (prefill), in two passes over the chunks of the batch, each
 * chunk on its sequence's absolute 64-token grid: first every (chunk, head)
 * at once prepares its UT form; then one block per (sequence, head, 32
 * value columns) walks the sequence's chunks in order with its columns of
 * the state in registers (dk 32, 64, 128, 256) or in shared memory (other
 * dk). Every sum is taken in an order fixed by the shapes (one thread in
 * ascending order, or per warp then the warps in order), so a head's result
 * depends on its own tokens alone, not on the batch, and a sequence resumed
 * at a multiple of 64 gives the same bits. cuda-bf16 runs both passes on
 * tensor cores for dk 64 and 128 (mma.sync, fixed tiles: the same
 * identities), over a bf16 prepared form. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/mma.h"

#define MAX_DK 256

/* One block of 4 warps per (32 value columns, value head, sequence). Lane l
 * owns column j0 + l; warp w owns the state rows [w R, (w + 1) R), R =
 * ceil(dk / 4), held in registers for the whole call: the state is read once
 * and written once however many tokens the sequence brings. Per token the
 * sums over rows (S^T k, S^T q) are each warp's rows in ascending order, then
 * the four warps' partials added in warp order, so a column's value depends
 * on the head's own tokens and state alone. */
#define REC_WARPS 4
#define REC_COLS 32

template <uint32_t RMAX>
__global__ void __launch_bounds__(REC_WARPS * 32)
    gdn_recurrent_kernel(hpd_gdn_args_t a, const hpd_seq_t *seqs, float *const *states)
{
    __shared__ float qs[MAX_DK], ks[MAX_DK];
    __shared__ float part[2][REC_WARPS][REC_COLS];
    const uint32_t tiles = (a.dv + REC_COLS - 1) / REC_COLS;
    const uint32_t tile = blockIdx.x % tiles, h = (blockIdx.x / tiles) % a.nv;
    const uint32_t s = blockIdx.x / tiles / a.nv;
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t dk = a.dk, dv = a.dv, kh = h / (a.nv / a.nk);
    const uint32_t R = (dk + REC_WARPS - 1) / REC_WARPS, x0 = warp * R;
    const uint32_t j = tile * REC_COLS + lane;
    const bool col = j < dv;
    const hpd_seq_t seq = seqs[s];
    if (seq.n_tokens == 0)
        return; /* a sequence without tokens: its state is not touched */
    float *S = states[s] + (size_t)h * dk * dv;
    float st[RMAX];

#pragma unroll
    for (uint32_t r = 0; r < RMAX; r++)
        st[r] = r < R && x0 + r < dk && col ? S[(size_t)(x0 + r) * dv + j] : 0.0f;
    for (uint32_t i = 0; i < seq.n_tokens; i++) {
        const size_t row = seq.row + i;
        for (uint32_t x = threadIdx.x; x < dk; x += blockDim.x) {
            qs[x] = a.q.p[row * a.q.ld + (size_t)kh * a.q.hs + x];
            ks[x] = a.k.p[row * a.k.ld + (size_t)kh * a.k.hs + x];
        }
        const float decay = expf(a.g[row * a.nv + h]), beta = a.beta[row * a.nv + h];
        const float v = col ? a.v.p[row * a.v.ld + (size_t)h * a.v.hs + j] : 0.0f;
        __syncthreads();
        /* S = exp(g) S, then this warp's rows of S^T k */
        float kv = 0.0f;
#pragma unroll
        for (uint32_t r = 0; r < RMAX; r++)
            if (r < R && x0 + r < dk) {
                st[r] = __fmul_rn(st[r], decay);
                kv = fmaf(ks[x0 + r], st[r], kv);
            }
        part[0][warp][lane] = kv;
        __syncthreads();
        kv = part[0][0][lane];
        for (uint32_t w = 1; w < REC_WARPS; w++)
            kv = __fadd_rn(kv, part[0][w][lane]);
        /* u = beta (v - S^T k); S += k u^T; this warp's rows of S^T q */
        const float u = __fmul_rn(__fsub_rn(v, kv), beta);
        float o = 0.0f;
#pragma unroll
        for (uint32_t r = 0; r < RMAX; r++)
            if (r < R && x0 + r < dk) {
                st[r] = fmaf(ks[x0 + r], u, st[r]);
                o = fmaf(qs[x0 + r], st[r], o);
            }
        part[1][warp][lane] = o;
        __syncthreads();
        if (warp == 0 && col) {
            o = part[1][0][lane];
            for (uint32_t w = 1; w < REC_WARPS; w++)
                o = __fadd_rn(o, part[1][w][lane]);
            a.out.p[row * a.out.ld + (size_t)h * a.out.hs + j] = o;
        }
        /* qs, ks and part are rewritten by the next token */
        __syncthreads();
    }
#pragma unroll
    for (uint32_t r = 0; r < RMAX; r++)
        if (r < R && x0 + r < dk && col)
            S[(size_t)(x0 + r) * dv + j] = st[r];
}

hpd_status_t hpd_cuda_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    const hpd_seq_t *seqs;
    float *const *states;
    hpd_status_t st;
    if (a->nk == 0 || a->nv == 0 || a->nv % a->nk != 0 || a->dk == 0 || a->dv == 0) {
        HPD_LOG_ERROR("cuda", "gdn_recurrent: nk %u, nv %u, dk %u, dv %u (expected nonzero, nv a "
                      "multiple of nk)", a->nk, a->nv, a->dk, a->dv);
        return HPD_ERR_INVALID_ARG;
    }
    if (a->dk > MAX_DK)
        return HPD_ERR_UNSUPPORTED;
    if (a->n_seqs == 0)
        return HPD_OK;
    if ((st = hpd_cuda_stage_seqs(b, a->seqs, a->states, a->n_seqs, &seqs, &states)) != HPD_OK)
        return st;
    const uint32_t rows = (a->dk + REC_WARPS - 1) / REC_WARPS;
    const uint64_t blocks = (uint64_t)a->n_seqs * a->nv * ((a->dv + REC_COLS - 1) / REC_COLS);
    if (blocks > INT32_MAX)
        return HPD_ERR_UNSUPPORTED;
    cudaStream_t stream = hpd_cuda_ctx(b)->stream;
    if (rows <= 8)
        gdn_recurrent_kernel<8><<<(uint32_t)blocks, REC_WARPS * 32, 0, stream>>>(*a, seqs, states);
    else if (rows <= 16)
        gdn_recurrent_kernel<16><<<(uint32_t)blocks, REC_WARPS * 32, 0, stream>>>(*a, seqs, states);
    else if (rows <= 32)
        gdn_recurrent_kernel<32><<<(uint32_t)blocks, REC_WARPS * 32, 0, stream>>>(*a, seqs, states);
    else
        gdn_recurrent_kernel<64><<<(uint32_t)blocks, REC_WARPS * 32, 0, stream>>>(*a, seqs, states);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* ---------------------------------------------------------------- chunked */

#define C HPD_GDN_CHUNK
#define CHUNK_THREADS 256
#define STATE_COLS 32
#define PREP_BATCH 8 /* loads in flight per thread when a block stages its inputs */

/* Copies elements first, first + stride, ... below n: load(i) for
 * PREP_BATCH of them, all in flight, then store(i, value) for each. */
template <typename T, typename Load, typename Store>
__device__ static inline void batched_copy(uint32_t n, uint32_t first, uint32_t stride, Load load,
                                           Store store)
{
    for (uint32_t i0 = first; i0 < n; i0 += PREP_BATCH * stride) {
        T v[PREP_BATCH] = {}; /* (all read only where loaded) */
#pragma unroll
        for (uint32_t u = 0; u < PREP_BATCH; u++)
            if (i0 + u * stride < n)
                v[u] = load(i0 + u * stride);
#pragma unroll
        for (uint32_t u = 0; u < PREP_BATCH; u++)
            if (i0 + u * stride < n)
                store(i0 + u * stride, v[u]);
    }
}

/* A chunk of the batch: its sequence's rows [row0, row0 + L), on the
 * sequence's absolute 64-token grid. */
typedef struct {
    uint32_t row0, len;
} chunk_t;

/* A sequence's run of consecutive chunks in one pass, and its state. */
typedef struct {
    float *state;
    uint32_t chunk0, n_chunks;
} segment_t;

/* The prepared form of one (chunk, value head), its parts' byte offsets:
 * W, QE, KE [C][dk], U [C][dv], QK [C][C], exp(gc_last) (16 bytes). W, QE,
 * KE and QK in fp32, or in bf16 where the state pass runs on tensor cores
 * (cuda-bf16: its operands); U and exp(gc_last) in fp32 either way. */
typedef struct {
    size_t w, qe, ke, u, qk, el, bytes;
} prep_layout_t;

__host__ __device__ static inline prep_layout_t prep_layout(uint32_t dk, uint32_t dv, bool bf)
{
    const size_t e = bf ? 2 : 4, m = (size_t)C * dk * e, qk = 3 * m + (size_t)C * dv * 4;
    const size_t el = qk + (size_t)C * C * e;
    return prep_layout_t{0, m, 2 * m, 3 * m, qk, el, el + 16};
}

/* out[i][d] = in[i][d] + sum_{j < i} A[i][j] in[j][d] (one fused
 * multiply-add per j, ascending) for the rows i < L and the columns d < n;
 * in (shared) rows ldi apart, out (the prepared form) n apart. Thread
 * (ti, td) takes rows 4 ti.. and columns td + 16 c, 8 columns a pass: each
 * j loads 4 of A and 8 of in for 32 products (one thread per output took
 * 2 loads per product). */
static_assert(C == 64 && CHUNK_THREADS == 256, "16 x 16 threads over a chunk's 64 rows");
__device__ static inline void tri_apply(const float *A, const float *in, uint32_t ldi, float *out,
                                        uint32_t n, uint32_t L, uint32_t tid)
{
    const uint32_t ti = tid / 16, td = tid % 16, i0 = 4 * ti;
    if (i0 >= L)
        return; /* (no barrier below) */
    const uint32_t rows = min(4u, L - i0);
    for (uint32_t c0 = 0; c0 * 16 < n; c0 += 8) {
        float acc[4][8];
#pragma unroll
        for (uint32_t u = 0; u < 4; u++)
#pragma unroll
            for (uint32_t c = 0; c < 8; c++) {
                const uint32_t d = td + 16 * (c0 + c);
                acc[u][c] = u < rows && d < n ? in[(i0 + u) * ldi + d] : 0.0f;
            }
        for (uint32_t j = 0; j + 1 < i0 + rows; j++) { /* j < i for some row i */
            float aj[4], vj[8];
#pragma unroll
            for (uint32_t u = 0; u < 4; u++)
                aj[u] = A[(i0 + u) * C + j]; /* (j >= i: not used) */
#pragma unroll
            for (uint32_t c = 0; c < 8; c++) {
                const uint32_t d = td + 16 * (c0 + c);
                vj[c] = d < n ? in[j * ldi + d] : 0.0f;
            }
#pragma unroll
            for (uint32_t u = 0; u < 4; u++)
                if (j < i0 + u)
#pragma unroll
                    for (uint32_t c = 0; c < 8; c++)
                        acc[u][c] = fmaf(aj[u], vj[c], acc[u][c]);
        }
#pragma unroll
        for (uint32_t u = 0; u < 4; u++)
#pragma unroll
            for (uint32_t c = 0; c < 8; c++) {
                const uint32_t d = td + 16 * (c0 + c);
                if (u < rows && d < n)
                    out[(i0 + u) * n + d] = acc[u][c];
            }
    }
}

/* T = (I - A)^-1 in place, A a chunk's strictly lower C x C matrix in
 * shared memory (rows lda apart; its diagonal and upper triangle are never
 * read), T strictly lower (its unit diagonal implied), in 16 x 16 blocks:
 * the four diagonal blocks by forward substitution (thread 16 b + c takes
 * column c of block b, the rows in turn), then block rows 1, 2, 3 in turn,
 *   Y = A_ij + sum_{j <= k < i} A_ik T_kj,  T_ij = Y + T_ii Y
 * (T_jj's implied diagonal gives the A_ij). Each sum one thread's, in
 * ascending order; 36 barriers where a row-by-row solve takes two a row.
 * Y: 768 floats of shared scratch. Every thread of the block calls it. */
static_assert(C == 64 && CHUNK_THREADS == 256, "four 16 x 16 blocks, 256 threads");
__device__ static inline void ut_solve(float *A, uint32_t lda, float *Y, uint32_t tid)
{
    for (uint32_t r = 1; r < 16; r++) {
        const uint32_t b0 = 16 * (tid / 16), c = tid % 16;
        const bool on = tid < 64 && c < r;
        float acc = 0.0f;
        if (on) { /* (row r's A all read before its T is written) */
            acc = A[(b0 + r) * lda + b0 + c];
            for (uint32_t m = c + 1; m < r; m++)
                acc = fmaf(A[(b0 + r) * lda + b0 + m], A[(b0 + m) * lda + b0 + c], acc);
        }
        __syncthreads();
        if (on)
            A[(b0 + r) * lda + b0 + c] = acc;
        __syncthreads();
    }
    for (uint32_t bi = 1; bi < 4; bi++) {
        for (uint32_t e = tid; e < 256 * bi; e += CHUNK_THREADS) {
            const uint32_t bj = e / 256, r = e / 16 % 16, c = e % 16;
            const float *arow = A + (16 * bi + r) * lda;
            float y = arow[16 * bj + c];
            for (uint32_t m = 16 * bj + c + 1; m < 16 * bi; m++) /* T_jj: rows past c */
                y = fmaf(arow[m], A[m * lda + 16 * bj + c], y);
            Y[e] = y;
        }
        __syncthreads();
        for (uint32_t e = tid; e < 256 * bi; e += CHUNK_THREADS) {
            const uint32_t bj = e / 256, r = e / 16 % 16, c = e % 16;
            const float *trow = A + (16 * bi + r) * lda + 16 * bi;
            float v = Y[e];
            for (uint32_t m = 0; m < r; m++)
                v = fmaf(trow[m], Y[bj * 256 + m * 16 + c], v);
            A[(16 * bi + r) * lda + 16 * bj + c] = v;
        }
        __syncthreads();
    }
}

/* Pass 1, one block per (chunk, value head), all chunks at once: the chunk's
 * cumulative gates gc, the UT system T = (I + A)^-1 with A[i][j] =
 * ((k_i beta_i) . k_j) exp(gc_i - gc_j) (j < i, negated), and from it
 *   W = T (k beta exp(gc)),  U = T (v beta),  QE_i = q_i exp(gc_i),
 *   KE_i = k_i exp(gc_last - gc_i),  QK[i][j] = (q_i . k_j) exp(gc_i - gc_j)
 * (j <= i, else 0). Every sum is taken by one thread in ascending order. */
__global__ void __launch_bounds__(CHUNK_THREADS)
    gdn_chunk_prep_kernel(hpd_gdn_args_t a, const chunk_t *chunks, char *prep)
{
    extern __shared__ float sm[];
    const uint32_t ci = blockIdx.x / a.nv, h = blockIdx.x % a.nv, tid = threadIdx.x;
    const uint32_t dk = a.dk, dv = a.dv, nv = a.nv, kh = h / (a.nv / a.nk), ld = dk + 1;
    const chunk_t ch = chunks[ci];
    const uint32_t L = ch.len, r0 = ch.row0;
    float *gc = sm, *beta = gc + C, *eg = beta + C, *el = eg + C, *Y = el + C;
    float *qs = Y + 768, *ks = qs + (size_t)C * ld, *A = ks + (size_t)C * ld;
    const prep_layout_t pl = prep_layout(dk, dv, false);
    char *P = prep + (size_t)blockIdx.x * pl.bytes;
    float *W = (float *)(P + pl.w), *QE = (float *)(P + pl.qe), *KE = (float *)(P + pl.ke);
    float *QK = (float *)(P + pl.qk), *U = (float *)(P + pl.u), *EL = (float *)(P + pl.el);

    /* q and k, 8 loads of each in flight per thread */
    batched_copy<float2>(
        L * dk, tid, blockDim.x,
        [&](uint32_t i) {
            const size_t t = r0 + i / dk, x = i % dk;
            return make_float2(a.q.p[t * a.q.ld + (size_t)kh * a.q.hs + x],
                               a.k.p[t * a.k.ld + (size_t)kh * a.k.hs + x]);
        },
        [&](uint32_t i, float2 v) {
            qs[i / dk * ld + i % dk] = v.x;
            ks[i / dk * ld + i % dk] = v.y;
        });
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
        EL[0] = eg[L - 1];
    }
    __syncthreads();
    for (uint32_t p = tid; p < L * dk; p += blockDim.x) {
        const uint32_t i = p / dk, x = p % dk;
        QE[p] = __fmul_rn(qs[i * ld + x], eg[i]);
        KE[p] = __fmul_rn(ks[i * ld + x], el[i]);
    }
    /* QK and A: thread (ti, tj) takes rows i of 4 ti.. and columns j of
     * 4 tj.. (the 16 x 16 tiles of C x C), each x loading 4 q_i, 4 k_i and
     * 4 k_j for 32 products (one thread per output took 3 loads per 2) */
    {
        const uint32_t ti = tid / 16, tj = tid % 16, i0 = 4 * ti, j0 = 4 * tj;
        float dq[4][4] = {}, dkk[4][4] = {};
        if (tj <= ti && i0 < L) { /* else every j > i, or no row */
            for (uint32_t x = 0; x < dk; x++) {
                float qi[4], kbi[4], kj[4];
#pragma unroll
                for (uint32_t u = 0; u < 4; u++) {
                    qi[u] = qs[(i0 + u) * ld + x];
                    kbi[u] = __fmul_rn(ks[(i0 + u) * ld + x], beta[i0 + u]);
                    kj[u] = ks[(j0 + u) * ld + x];
                }
#pragma unroll
                for (uint32_t u = 0; u < 4; u++)
#pragma unroll
                    for (uint32_t v = 0; v < 4; v++) {
                        dq[u][v] = fmaf(qi[u], kj[v], dq[u][v]);
                        dkk[u][v] = fmaf(kbi[u], kj[v], dkk[u][v]);
                    }
            }
        }
#pragma unroll
        for (uint32_t u = 0; u < 4; u++)
#pragma unroll
            for (uint32_t v = 0; v < 4; v++) {
                const uint32_t i = i0 + u, j = j0 + v;
                if (j > i || i >= L) {
                    QK[i * C + j] = 0.0f;
                    continue;
                }
                const float e = expf(gc[i] - gc[j]);
                QK[i * C + j] = __fmul_rn(dq[u][v], e);
                if (j < i)
                    A[i * C + j] = -__fmul_rn(dkk[u][v], e);
            }
    }
    __syncthreads();
    /* q is no longer read: where it fits, its room takes v beta [C][dv];
     * k's takes k beta exp(gc), W's operand (the products computed once,
     * not once per output) */
    const bool vb_shared = dv <= ld;
    float *vb = qs;
    if (vb_shared)
        batched_copy<float>(
            L * dv, tid, blockDim.x,
            [&](uint32_t i) {
                return a.v.p[(size_t)(r0 + i / dv) * a.v.ld + (size_t)h * a.v.hs + i % dv];
            },
            [&](uint32_t i, float v) { vb[i] = __fmul_rn(v, beta[i / dv]); });
    float *kbe = ks;
    for (uint32_t p = tid; p < L * dk; p += blockDim.x) {
        const uint32_t i = p / dk, x = p % dk;
        kbe[i * ld + x] = __fmul_rn(__fmul_rn(ks[i * ld + x], beta[i]), eg[i]);
    }
    __syncthreads(); /* vb and kbe complete */
    ut_solve(A, C, Y, tid); /* T = (I - A)^-1, unit diagonal implied */
    /* U = T (v beta) and W = T (k beta exp(gc)): out[i][d] = in[i][d] +
     * sum_{j < i} A[i][j] in[j][d], j ascending */
    if (vb_shared)
        tri_apply(A, vb, dv, U, dv, L, tid);
    else
        for (uint32_t p = tid; p < L * dv; p += blockDim.x) {
            const uint32_t i = p / dv, d = p % dv;
            const float *v = a.v.p + (size_t)h * a.v.hs + d;
            float acc = __fmul_rn(v[(size_t)(r0 + i) * a.v.ld], beta[i]);
#pragma unroll 4
            for (uint32_t j = 0; j < i; j++)
                acc = fmaf(A[i * C + j], __fmul_rn(v[(size_t)(r0 + j) * a.v.ld], beta[j]), acc);
            U[p] = acc;
        }
    tri_apply(A, kbe, ld, W, dk, L, tid);
}

/* The block of a state pass: blocks go over (sequence run, value head,
 * tile of STATE_COLS value columns), the tile fastest. */
typedef struct {
    uint32_t tile, h;
    segment_t seg;
} state_block_t;

__device__ static inline state_block_t state_block(const hpd_gdn_args_t &a, const segment_t *segs)
{
    const uint32_t tiles = (a.dv + STATE_COLS - 1) / STATE_COLS;
    return state_block_t{blockIdx.x % tiles, (blockIdx.x / tiles) % a.nv,
                         segs[blockIdx.x / tiles / a.nv]};
}

/* Pass 2, one block per (sequence run, value head, 32 value columns),
 * walking the run's chunks in order with its columns of the state in shared
 * memory (lane = column, warps over rows):
 *   VN = U - W S;  o_i = QE_i S + sum_{j <= i} QK[i][j] VN_j;
 *   S = exp(gc_last) S + KE^T VN.
 * Each sum by one thread in ascending order. */
__global__ void __launch_bounds__(CHUNK_THREADS)
    gdn_chunk_state_kernel(hpd_gdn_args_t a, const chunk_t *chunks, const segment_t *segs,
                           const char *prep, uint32_t chunk_base)
{
    extern __shared__ float sm[];
    const state_block_t sb = state_block(a, segs);
    const uint32_t tile = sb.tile, h = sb.h;
    const segment_t seg = sb.seg;
    const uint32_t dk = a.dk, dv = a.dv, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const prep_layout_t pl = prep_layout(dk, dv, false);
    const uint32_t warps = blockDim.x / 32, j = tile * STATE_COLS + lane, sld = STATE_COLS + 1;
    const bool col = j < dv;
    float *S = sm, *VN = S + (size_t)dk * sld, *QK = VN + (size_t)C * sld;
    float *W = QK + C * C, *QE = W + (size_t)C * dk, *KE = QE + (size_t)C * dk;
    float *state = seg.state + (size_t)h * dk * dv;

    for (uint32_t x = warp; x < dk; x += warps)
        S[x * sld + lane] = col ? state[(size_t)x * dv + j] : 0.0f;
    for (uint32_t n = 0; n < seg.n_chunks; n++) {
        const uint32_t ci = seg.chunk0 + n;
        const chunk_t ch = chunks[ci];
        const uint32_t L = ch.len;
        const char *Pc = prep + (size_t)((ci - chunk_base) * a.nv + h) * pl.bytes;
        const float *P = (const float *)Pc; /* W, QE, KE: one array of 3 C rows */
        const float *U = (const float *)(Pc + pl.u), *QKg = (const float *)(Pc + pl.qk);
        const float elast = *(const float *)(Pc + pl.el);
        for (uint32_t p = tid; p < 3 * L * dk; p += blockDim.x) {
            const uint32_t which = p / (L * dk), q = p % (L * dk);
            W[which * C * dk + q] = P[which * (size_t)C * dk + q];
        }
        for (uint32_t p = tid; p < L * C; p += blockDim.x)
            QK[p] = QKg[p];
        for (uint32_t i = warp; i < L; i += warps)
            VN[i * sld + lane] = col ? U[(size_t)i * dv + j] : 0.0f;
        __syncthreads();
        for (uint32_t i = warp; i < L; i += warps) {
            float acc = 0.0f;
            for (uint32_t x = 0; x < dk; x++)
                acc = fmaf(W[i * dk + x], S[x * sld + lane], acc);
            VN[i * sld + lane] = __fsub_rn(VN[i * sld + lane], acc);
        }
        __syncthreads();
        for (uint32_t i = warp; i < L; i += warps) {
            float acc = 0.0f;
            for (uint32_t x = 0; x < dk; x++)
                acc = fmaf(QE[i * dk + x], S[x * sld + lane], acc);
            for (uint32_t t = 0; t <= i; t++)
                acc = fmaf(QK[i * C + t], VN[t * sld + lane], acc);
            if (col)
                a.out.p[(size_t)(ch.row0 + i) * a.out.ld + (size_t)h * a.out.hs + j] = acc;
        }
        __syncthreads(); /* S is read above and rewritten below */
        for (uint32_t x = warp; x < dk; x += warps) {
            float acc = __fmul_rn(S[x * sld + lane], elast);
            for (uint32_t i = 0; i < L; i++)
                acc = fmaf(KE[i * dk + x], VN[i * sld + lane], acc);
            S[x * sld + lane] = acc;
        }
        __syncthreads(); /* the next chunk restages W, QE, KE, QK and VN */
    }
    if (col)
        for (uint32_t x = warp; x < dk; x += warps)
            state[(size_t)x * dv + j] = S[x * sld + lane];
}

/* Pass 2 with the state in registers, for dk a multiple of 32: lane =
 * value column, warp w owns the state rows [w R, (w + 1) R), R = dk / 8.
 * The products over rows (W S, QE S) are each warp's rows in ascending
 * order (W, QE and KE read as 16-byte vectors of the warp's rows), then the
 * 8 warps' partials added in warp order; the state update sums the chunk's
 * tokens in ascending order in each thread. */
#define STATE_WARPS (CHUNK_THREADS / 32)

template <uint32_t R, bool STAGED>
__global__ void __launch_bounds__(CHUNK_THREADS)
    gdn_chunk_state_reg_kernel(hpd_gdn_args_t a, const chunk_t *chunks, const segment_t *segs,
                               const char *prep, uint32_t chunk_base)
{
    extern __shared__ float sm[];
    const state_block_t sb = state_block(a, segs);
    const uint32_t tile = sb.tile, h = sb.h;
    const segment_t seg = sb.seg;
    const uint32_t dk = a.dk, dv = a.dv, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t j = tile * STATE_COLS + lane, x0 = warp * R;
    const bool col = j < dv;
    const prep_layout_t pl = prep_layout(dk, dv, false);
    float *VN = sm, *QK = VN + C * STATE_COLS, *PART = QK + C * C; /* PART [8][C][32] */
    /* STAGED: this warp's columns of W, QE and KE [3][C][R], copied per chunk
     * with all loads in flight (else each row's loads wait in the loops) */
    float *WS = PART + STATE_WARPS * C * STATE_COLS + (size_t)warp * 3 * C * R;
    float *state = seg.state + (size_t)h * dk * dv;
    float S[R];

#pragma unroll
    for (uint32_t r = 0; r < R; r++)
        S[r] = col ? state[(size_t)(x0 + r) * dv + j] : 0.0f;
    for (uint32_t n = 0; n < seg.n_chunks; n++) {
        const uint32_t ci = seg.chunk0 + n;
        const chunk_t ch = chunks[ci];
        const uint32_t L = ch.len;
        const char *Pc = prep + (size_t)((ci - chunk_base) * a.nv + h) * pl.bytes;
        const float *P = (const float *)Pc; /* W, QE, KE: one array of 3 C rows */
        const float *U = (const float *)(Pc + pl.u), *QKg = (const float *)(Pc + pl.qk);
        const float elast = *(const float *)(Pc + pl.el);
        batched_copy<float>(
            L * C, tid, blockDim.x, [&](uint32_t i) { return QKg[i]; },
            [&](uint32_t i, float v) { QK[i] = v; });
        if (STAGED) {
            /* vector q: array q / (L R4), row q % (L R4) / R4, vector q % R4 */
            const uint32_t R4 = R / 4, LR4 = L * R4;
            batched_copy<float4>(
                3 * LR4, lane, 32,
                [&](uint32_t q) {
                    return *(const float4 *)(P + (size_t)(q / LR4) * C * dk +
                                             (size_t)(q % LR4 / R4) * dk + x0 + 4 * (q % R4));
                },
                [&](uint32_t q, float4 v) {
                    *(float4 *)(WS + ((size_t)(q / LR4) * C + q % LR4 / R4) * R + 4 * (q % R4)) =
                        v;
                });
            __syncwarp();
        }
        /* row i of array arr (0 W, 1 QE, 2 KE), this warp's columns */
        const auto rows4 = [&](uint32_t arr, uint32_t i) {
            return STAGED ? (const float4 *)(WS + ((size_t)arr * C + i) * R)
                          : (const float4 *)(P + (size_t)arr * C * dk + (size_t)i * dk + x0);
        };
        /* this warp's rows of array arr times its columns of S, into PART:
         * RI rows at a time, their sums independent chains (one row's chain
         * of R dependent multiply-adds left a warp waiting on each) */
        const auto rows_times_state = [&](uint32_t arr) {
            constexpr uint32_t RI = 4;
            for (uint32_t i0 = 0; i0 < L; i0 += RI) {
                const uint32_t n = min(RI, L - i0);
                float acc[RI] = {};
#pragma unroll
                for (uint32_t r = 0; r < R / 4; r++)
#pragma unroll
                    for (uint32_t u = 0; u < RI; u++) {
                        if (u >= n)
                            break;
                        const float4 m = rows4(arr, i0 + u)[r];
                        acc[u] = fmaf(m.x, S[4 * r], acc[u]);
                        acc[u] = fmaf(m.y, S[4 * r + 1], acc[u]);
                        acc[u] = fmaf(m.z, S[4 * r + 2], acc[u]);
                        acc[u] = fmaf(m.w, S[4 * r + 3], acc[u]);
                    }
#pragma unroll
                for (uint32_t u = 0; u < RI; u++)
                    if (u < n)
                        PART[(warp * C + i0 + u) * STATE_COLS + lane] = acc[u];
            }
        };
        /* row i, column l of that product: the warps' parts in warp order */
        const auto over_warps = [&](uint32_t i, uint32_t l) {
            float sum = PART[i * STATE_COLS + l];
            for (uint32_t w = 1; w < STATE_WARPS; w++)
                sum = __fadd_rn(sum, PART[(w * C + i) * STATE_COLS + l]);
            return sum;
        };
        rows_times_state(0);
        __syncthreads();
        /* VN = U - W S */
        for (uint32_t p = tid; p < L * STATE_COLS; p += blockDim.x) {
            const uint32_t i = p / STATE_COLS, l = p % STATE_COLS, jj = tile * STATE_COLS + l;
            const float ws = over_warps(i, l);
            VN[p] = jj < dv ? __fsub_rn(U[(size_t)i * dv + jj], ws) : 0.0f;
        }
        __syncthreads();
        rows_times_state(1); /* QE S */
        __syncthreads();
        /* o_i = QE_i S + sum_{t <= i} QK[i][t] VN_t, rows i and i + 8 (the
         * block's next turn) side by side, two independent chains */
        for (uint32_t p = tid; p < L * STATE_COLS; p += 2 * blockDim.x) {
            const uint32_t i = p / STATE_COLS, l = p % STATE_COLS, jj = tile * STATE_COLS + l;
            const uint32_t i2 = (p + blockDim.x) / STATE_COLS;
            const bool two = i2 < L;
            float acc = over_warps(i, l), acc2 = two ? over_warps(i2, l) : 0.0f;
            for (uint32_t t = 0; t <= i; t++) {
                const float vn = VN[t * STATE_COLS + l];
                acc = fmaf(QK[i * C + t], vn, acc);
                if (two)
                    acc2 = fmaf(QK[i2 * C + t], vn, acc2);
            }
            for (uint32_t t = i + 1; two && t <= i2; t++)
                acc2 = fmaf(QK[i2 * C + t], VN[t * STATE_COLS + l], acc2);
            float *out = a.out.p + (size_t)h * a.out.hs + jj;
            if (jj < dv) {
                out[(size_t)(ch.row0 + i) * a.out.ld] = acc;
                if (two)
                    out[(size_t)(ch.row0 + i2) * a.out.ld] = acc2;
            }
        }
        /* S = exp(gc_last) S + KE^T VN (reads VN only: no barrier before) */
#pragma unroll
        for (uint32_t r = 0; r < R; r++)
            S[r] = __fmul_rn(S[r], elast);
        for (uint32_t i = 0; i < L; i++) {
            const float vn = VN[i * STATE_COLS + lane];
            const float4 *k4 = rows4(2, i);
#pragma unroll
            for (uint32_t r = 0; r < R / 4; r++) {
                const float4 k = k4[r];
                S[4 * r] = fmaf(k.x, vn, S[4 * r]);
                S[4 * r + 1] = fmaf(k.y, vn, S[4 * r + 1]);
                S[4 * r + 2] = fmaf(k.z, vn, S[4 * r + 2]);
                S[4 * r + 3] = fmaf(k.w, vn, S[4 * r + 3]);
            }
        }
        __syncthreads(); /* the next chunk rewrites QK, PART and VN */
    }
    if (col)
#pragma unroll
        for (uint32_t r = 0; r < R; r++)
            state[(size_t)(x0 + r) * dv + j] = S[r];
}

/* ---------------------------------- cuda-bf16: pass 1 on tensor cores */

/* This lane's row address for an ldmatrix .x4 of the 16 x 16 block at
 * (r0, c0) of a shared bf16 array with rows ld apart: matrix q (lanes
 * 8 q .. 8 q + 7) at rows r0 + 8 (q & 1), columns c0 + 8 (q >> 1) (down
 * first), or ACROSS first at rows r0 + 8 (q >> 1), columns c0 + 8 (q & 1).
 * As an m16n8k16 operand (PTX ISA): down first, A's a[0..3] from a
 * row-major A, or with .trans two n-tiles' b (r[0..1] the first's) from an
 * array whose rows are k; across first, two n-tiles' b from an array whose
 * rows are n, or with .trans A's a[0..3] from an array whose rows are k. */
template <bool ACROSS>
__device__ static inline const uint16_t *tile_at(const uint16_t *m, uint32_t ld, uint32_t r0,
                                                 uint32_t c0, uint32_t lane)
{
    const uint32_t q = lane / 8, down = ACROSS ? q >> 1 : q & 1, across = ACROSS ? q & 1 : q >> 1;
    return m + (r0 + 8 * down + lane % 8) * ld + c0 + 8 * across;
}

/* d0 += a b[0..1] and d1 += a b[2..3]: one A block times the two n-tiles
 * of one ldmatrix .x4 of B (tile_at) */
__device__ static inline void mma_pair(float d0[4], float d1[4], const uint32_t a[4],
                                       const uint32_t b[4])
{
    hpd_mma_bf16_16816(d0, a, b);
    hpd_mma_bf16_16816(d1, a, b + 2);
}

/* f(nt, hf, i, j) for each pair of this lane's mma accumulators
 * (registers 2 hf and 2 hf + 1 of n-tile nt < NT): their row i = row0 +
 * g + 8 hf and columns j, j + 1, j = col0 + 8 nt + 2 t (g = lane / 4,
 * t = lane % 4) */
template <uint32_t NT, typename F>
__device__ static inline void for_pairs(uint32_t row0, uint32_t col0, uint32_t lane, F f)
{
#pragma unroll
    for (uint32_t nt = 0; nt < NT; nt++)
#pragma unroll
        for (uint32_t hf = 0; hf < 2; hf++)
            f(nt, hf, row0 + lane / 4 + 8 * hf, col0 + 8 * nt + 2 * (lane % 4));
}

/* Shared memory of pass 1 on tensor cores, in bytes from the start: gc,
 * beta, e^gc, e^(gc_last - gc) [4][C], Y [3][16][16] and A / T [C][C + 1]
 * in fp32; q~ (later T~) [C][dk + 8], k~ and (k beta e^gc)~ [C][dk + 8],
 * (v beta)~ [C][dvp + 8] in bf16, dvp = dv rounded up to 16. */
typedef struct {
    size_t y, a, qb, kb, kbeb, vbb, bytes;
    uint32_t ldk, ldvb, dvp;
} tc_prep_smem_t;

__host__ __device__ static inline tc_prep_smem_t tc_prep_smem(uint32_t dk, uint32_t dv)
{
    tc_prep_smem_t s;
    s.ldk = dk + 8, s.dvp = (dv + 15) / 16 * 16, s.ldvb = s.dvp + 8;
    s.y = 4 * C * 4, s.a = s.y + 3 * 16 * 16 * 4;
    s.qb = s.a + (size_t)C * (C + 1) * 4;
    s.qb = (s.qb + 15) / 16 * 16;
    s.kb = s.qb + (size_t)C * s.ldk * 2, s.kbeb = s.kb + (size_t)C * s.ldk * 2;
    s.vbb = s.kbeb + (size_t)C * s.ldk * 2;
    s.bytes = s.vbb + (size_t)C * s.ldvb * 2;
    return s;
}

/* Pass 1 on tensor cores (cuda-bf16, dk = DK of 64 or 128): one block of 8
 * warps per (chunk, value head), writing the bf16 prepared form.
 * - gc as cuda's pass 1 (one thread's sum in row order), e^gc and
 *   e^(gc_last - gc) (so QE = bf16(q e^gc), KE = bf16(k e^(gc_last - gc))
 *   and e^(gc_last) are cuda's values rounded);
 * - q~ K~^T and k~ K~^T by mma over the ten 16 x 16 blocks at or below the
 *   diagonal (a warp's one or two): QK = bf16((q~ . k~) e^(gc_i - gc_j))
 *   for j <= i, and A = -((k~_i . k~_j) beta_i) e^(gc_i - gc_j) for j < i
 *   in fp32;
 * - T = (I - A)^-1 in 16 x 16 blocks, fp32 (ut_solve, as cuda's);
 * - W = kbe + T~ kbe~ and U = vb + T~ vb~ by mma (kbe = k beta e^gc and
 *   vb = v beta in fp32: the identity's part exact; T~ = bf16(T)). */
template <uint32_t DK>
__global__ void __launch_bounds__(CHUNK_THREADS)
    gdn_chunk_prep_tc_kernel(hpd_gdn_args_t a, const chunk_t *chunks, char *prep)
{
    extern __shared__ uint4 smp[];
    char *const sm = (char *)smp;
    const uint32_t ci = blockIdx.x / a.nv, h = blockIdx.x % a.nv, tid = threadIdx.x;
    const uint32_t dv = a.dv, nv = a.nv, kh = h / (a.nv / a.nk);
    const uint32_t lane = tid % 32, w = tid / 32, g = lane / 4, t = lane % 4;
    const chunk_t ch = chunks[ci];
    const uint32_t L = ch.len, r0 = ch.row0;
    const tc_prep_smem_t ss = tc_prep_smem(DK, dv);
    constexpr uint32_t LDK = DK + 8, LDA = C + 1, LDT = C + 8;
    const uint32_t ldvb = ss.ldvb, dvp = ss.dvp;
    float *gc = (float *)sm, *beta = gc + C, *eg = beta + C, *el = eg + C;
    float *Y = (float *)(sm + ss.y), *A = (float *)(sm + ss.a);
    uint16_t *qb = (uint16_t *)(sm + ss.qb), *kb = (uint16_t *)(sm + ss.kb);
    uint16_t *kbeb = (uint16_t *)(sm + ss.kbeb), *vbb = (uint16_t *)(sm + ss.vbb);
    uint16_t *Tb = qb; /* T~ takes q~'s room once the products are done */
    const prep_layout_t pl = prep_layout(DK, dv, true);
    char *P = prep + (size_t)blockIdx.x * pl.bytes;
    uint16_t *W = (uint16_t *)(P + pl.w), *QE = (uint16_t *)(P + pl.qe);
    uint16_t *KE = (uint16_t *)(P + pl.ke), *QK = (uint16_t *)(P + pl.qk);
    float *U = (float *)(P + pl.u);
    const float *qg = a.q.p + (size_t)r0 * a.q.ld + (size_t)kh * a.q.hs;
    const float *kg = a.k.p + (size_t)r0 * a.k.ld + (size_t)kh * a.k.hs;
    const float *vg = a.v.p + (size_t)r0 * a.v.ld + (size_t)h * a.v.hs;

    /* the gates: gc one thread's sum in row order (cuda's) */
    if (tid < L) {
        gc[tid] = a.g[(size_t)(r0 + tid) * nv + h];
        beta[tid] = a.beta[(size_t)(r0 + tid) * nv + h];
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < L; i++)
            gc[i] = acc += gc[i];
        *(float *)(P + pl.el) = expf(acc);
    }
    __syncthreads();
    if (tid < L) {
        eg[tid] = expf(gc[tid]);
        el[tid] = expf(gc[L - 1] - gc[tid]);
    }
    __syncthreads();
    /* q~, k~, (k beta e^gc)~ and QE, KE (rows past L: zero in shared memory,
     * not written to the form): PREP_BATCH elements' loads in flight, then
     * their stores (the form's stores would otherwise hold each next load
     * back: they might alias q and k) */
    for (uint32_t p0 = tid; p0 < C * DK; p0 += PREP_BATCH * CHUNK_THREADS) {
        float qk[PREP_BATCH][2];
#pragma unroll
        for (uint32_t u = 0; u < PREP_BATCH; u++) {
            const uint32_t p = p0 + u * CHUNK_THREADS, i = p / DK, x = p % DK;
            const bool in = p < C * DK && i < L;
            qk[u][0] = in ? qg[(size_t)i * a.q.ld + x] : 0.0f;
            qk[u][1] = in ? kg[(size_t)i * a.k.ld + x] : 0.0f;
        }
#pragma unroll
        for (uint32_t u = 0; u < PREP_BATCH; u++) {
            const uint32_t p = p0 + u * CHUNK_THREADS, i = p / DK, x = p % DK;
            if (p >= C * DK)
                break;
            const bool in = i < L;
            const float qv = qk[u][0], kv = qk[u][1];
            qb[i * LDK + x] = (uint16_t)hpd_bf16_rn(qv);
            kb[i * LDK + x] = (uint16_t)hpd_bf16_rn(kv);
            kbeb[i * LDK + x] =
                (uint16_t)hpd_bf16_rn(in ? __fmul_rn(__fmul_rn(kv, beta[i]), eg[i]) : 0.0f);
            if (in) {
                QE[p] = (uint16_t)hpd_bf16_rn(__fmul_rn(qv, eg[i]));
                KE[p] = (uint16_t)hpd_bf16_rn(__fmul_rn(kv, el[i]));
            }
        }
    }
    /* (v beta)~, columns past dv zero */
#pragma unroll 4
    for (uint32_t p = tid; p < C * dvp; p += CHUNK_THREADS) {
        const uint32_t i = p / dvp, d = p % dvp;
        const float vb = i < L && d < dv ? __fmul_rn(vg[(size_t)i * a.v.ld + d], beta[i]) : 0.0f;
        vbb[i * ldvb + d] = (uint16_t)hpd_bf16_rn(vb);
    }
    __syncthreads();

    /* q~ K~^T and k~ K~^T: the blocks (mt, np) at or below the diagonal,
     * warp w taking blocks w and w + 8; warps 2..7 write QK's six blocks
     * above it as zero */
    {
        for (uint32_t unit = w; unit < 10; unit += 8) { /* (0,0), (1,0), (1,1), (2,0) .. */
            const uint32_t mt = (unit >= 1) + (unit >= 3) + (unit >= 6);
            const uint32_t np = unit - mt * (mt + 1) / 2;
            float sq[2][4] = {}, sk[2][4] = {};
#pragma unroll
            for (uint32_t kk = 0; kk < DK / 16; kk++) {
                uint32_t aq[4], ak[4], bk[4];
                hpd_ldmatrix_x4(aq, tile_at<false>(qb, LDK, 16 * mt, 16 * kk, lane));
                hpd_ldmatrix_x4(ak, tile_at<false>(kb, LDK, 16 * mt, 16 * kk, lane));
                hpd_ldmatrix_x4(bk, tile_at<true>(kb, LDK, 16 * np, 16 * kk, lane));
                mma_pair(sq[0], sq[1], aq, bk);
                mma_pair(sk[0], sk[1], ak, bk);
            }
            for_pairs<2>(16 * mt, 16 * np, lane, [&](uint32_t nt, uint32_t hf, uint32_t i,
                                                      uint32_t j) {
                float qk[2];
#pragma unroll
                for (uint32_t c = 0; c < 2; c++) {
                    const bool on = j + c <= i && i < L;
                    const float e = on ? expf(gc[i] - gc[j + c]) : 0.0f;
                    qk[c] = on ? __fmul_rn(sq[nt][2 * hf + c], e) : 0.0f;
                    A[i * LDA + j + c] =
                        on && j + c < i
                            ? -__fmul_rn(__fmul_rn(sk[nt][2 * hf + c], beta[i]), e)
                            : 0.0f;
                }
                *(uint32_t *)(QK + i * C + j) = hpd_bf16x2(qk[0], qk[1]);
            });
        }
        if (w >= 2) { /* the blocks above the diagonal: (0,1..3), (1,2..3), (2,3) */
            const uint32_t k = w - 2, mt = (k >= 3) + (k >= 5);
            const uint32_t np = k + mt + 1 - (mt == 0 ? 0 : mt == 1 ? 3 : 5);
            for (uint32_t e = lane; e < 16 * 8; e += 32) /* 16 rows of 8 words */
                *(uint32_t *)(QK + (16 * mt + e / 8) * C + 16 * np + 2 * (e % 8)) = 0;
        }
    }
    __syncthreads();

    ut_solve(A, LDA, Y, tid); /* T = (I - A)^-1 */
    /* T~: T's strictly lower part in bf16, zero elsewhere */
    for (uint32_t p = tid; p < C * C / 2; p += CHUNK_THREADS) {
        const uint32_t i = p / (C / 2), j = 2 * (p % (C / 2));
        *(uint32_t *)(Tb + i * LDT + j) = hpd_bf16x2(j < i ? A[i * LDA + j] : 0.0f,
                                                     j + 1 < i ? A[i * LDA + j + 1] : 0.0f);
    }
    __syncthreads();

    /* W = kbe + T~ kbe~ and U = vb + T~ vb~: units of (m-tile, 16 columns),
     * W's DK / 16 column pairs then U's dvp / 16; unit u is pair u / 4 and
     * m-tile (u + u / 8) % 4, so that a warp's units (u = w + 8 k) vary in
     * m-tile (the products run over k-tiles 0..m-tile, T~ being lower) */
    const uint32_t pw = DK / 16, n_units = 4 * (pw + dvp / 16);
    for (uint32_t u = w; u < n_units; u += 8) {
        const uint32_t pair = u / 4, mt = (u + u / 8) % 4, wpart = pair < pw;
        const uint32_t n0 = 16 * (wpart ? pair : pair - pw);
        const uint16_t *bsrc = wpart ? kbeb : vbb;
        const uint32_t ldb = wpart ? LDK : ldvb;
        float acc[2][4];
#pragma unroll
        for (uint32_t nt = 0; nt < 2; nt++)
#pragma unroll
            for (uint32_t r = 0; r < 4; r++) {
                const uint32_t i = 16 * mt + g + 8 * (r / 2), x = n0 + 8 * nt + 2 * t + r % 2;
                float v = 0.0f;
                if (i < L && wpart)
                    v = __fmul_rn(__fmul_rn(kg[(size_t)i * a.k.ld + x], beta[i]), eg[i]);
                else if (i < L && x < dv)
                    v = __fmul_rn(vg[(size_t)i * a.v.ld + x], beta[i]);
                acc[nt][r] = v;
            }
        for (uint32_t kk = 0; kk <= mt; kk++) {
            uint32_t at[4], b[4];
            hpd_ldmatrix_x4(at, tile_at<false>(Tb, LDT, 16 * mt, 16 * kk, lane));
            hpd_ldmatrix_x4_trans(b, tile_at<false>(bsrc, ldb, 16 * kk, n0, lane));
            mma_pair(acc[0], acc[1], at, b);
        }
        for_pairs<2>(16 * mt, n0, lane, [&](uint32_t nt, uint32_t hf, uint32_t i, uint32_t x) {
            if (i >= L)
                return;
            if (wpart) {
                *(uint32_t *)(W + i * DK + x) = hpd_bf16x2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
                return;
            }
            float *ud = U + (size_t)i * dv + x;
            if (dv % 2 == 0 && x + 1 < dv) /* (8-byte aligned) */
                *(float2 *)ud = make_float2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
            else if (x < dv) {
                ud[0] = acc[nt][2 * hf];
                if (x + 1 < dv)
                    ud[1] = acc[nt][2 * hf + 1];
            }
        });
    }
}

/* ------------------------------ cuda-bf16: the state pass on tensor cores */

/* Pass 2 on tensor cores (cuda-bf16) for dk = DK of 64 or 128, over the
 * bf16 prepared form: one block of 8 warps per (sequence run, value head,
 * 32 value columns), as above. The state's columns stay in fp32
 * accumulator fragments: at dk 128 warp w holds state rows [16 w, 16 w +
 * 16), all 4 column tiles; at dk 64 rows [16 (w % 4), +16), column tiles
 * 2 (w / 4) and + 1. Per chunk, with S~ = bf16(S) and VN~ = bf16(VN), each
 * product an mma (m16n8k16: bf16 operands, fp32 sums, k in ascending
 * order):
 *   VN = U - W S~;  o = QE S~ + QK VN~;  S = exp(gc_last) S + KE^T VN~,
 * warp w taking rows [16 (w % 4), +16) of VN and o, column tiles 2 (w / 4)
 * and + 1 (QK's blocks above the diagonal are zero and skipped: which
 * blocks follows the rows alone). Which warp computes an element does not
 * change its operations. The next chunk's W, QE, KE and QK come by
 * cp.async into a second buffer while this chunk's are used (one buffer
 * where two do not fit: the same sums). */
#define TC_STATE_WARPS 8
template <uint32_t DK> struct tc_state_smem {
    static constexpr uint32_t LDK = DK + 8, LDC = C + 8, LDV = STATE_COLS + 8; /* bf16 rows */
    static constexpr size_t BUF = 3 * (size_t)C * LDK + (size_t)C * LDC; /* one chunk's */
};

/* shared bytes of the tensor-core state pass: one or two chunk buffers, S~
 * and VN~ */
template <uint32_t DK> static size_t tc_state_bytes(bool two)
{
    typedef tc_state_smem<DK> SM;
    return ((two ? 2 : 1) * SM::BUF + (size_t)(DK + C) * SM::LDV) * 2;
}

template <uint32_t DK>
__global__ void __launch_bounds__(TC_STATE_WARPS * 32, 1) /* (without the 1, ptxas spilt) */
    gdn_chunk_state_tc_kernel(hpd_gdn_args_t a, const chunk_t *chunks, const segment_t *segs,
                              const char *prep, uint32_t chunk_base, bool two)
{
    typedef tc_state_smem<DK> SM;
    constexpr uint32_t LDK = SM::LDK, LDC = SM::LDC, LDV = SM::LDV, PK = DK / 8;
    /* the state's m-tiles, and the column tiles a warp holds of one */
    constexpr uint32_t SMT = DK / 16, SNT = 4 * SMT / TC_STATE_WARPS;
    static_assert(TC_STATE_WARPS == 8 && (DK == 64 || DK == 128), "the warps' tiles");
    extern __shared__ uint4 sm16[]; /* (16-byte aligned: cp.async, ldmatrix) */
    uint16_t *const smb = (uint16_t *)sm16;
    const state_block_t sb = state_block(a, segs);
    const segment_t seg = sb.seg;
    const uint32_t h = sb.h, col0 = sb.tile * STATE_COLS, dv = a.dv, tid = threadIdx.x;
    const uint32_t lane = tid % 32, w = tid / 32, g = lane / 4, t = lane % 4;
    /* this warp's rows of VN and o (m0) and their column tiles' pair (vp);
     * its state rows (xs) and first column tile (sn0) */
    const uint32_t m0 = 16 * (w % 4), vp = w / 4, xs = 16 * (w % SMT), sn0 = w / SMT * SNT;
    const prep_layout_t pl = prep_layout(DK, dv, true);
    uint16_t *Sb = smb + (two ? 2 : 1) * SM::BUF, *VNb = Sb + DK * LDV;
    float *state = seg.state + (size_t)h * DK * dv;
    const auto chunk_prep = [&](uint32_t n) {
        return prep + (size_t)((seg.chunk0 + n - chunk_base) * a.nv + h) * pl.bytes;
    };
    /* chunk n's W, QE, KE (its rows; the others zero) and QK into buffer bi */
    const auto fetch = [&](uint32_t n, uint32_t bi) {
        const char *P = chunk_prep(n);
        const uint32_t L = chunks[seg.chunk0 + n].len;
        uint16_t *dst = smb + bi * SM::BUF;
        for (uint32_t p = tid; p < 3 * C * PK; p += blockDim.x) {
            const uint32_t arr = p / (C * PK), r = p / PK % C, x = p % PK;
            hpd_cp_async16(dst + (arr * C + r) * LDK + 8 * x,
                           P + ((size_t)arr * C + r) * DK * 2 + 16 * x, r < L ? 16 : 0);
        }
        for (uint32_t p = tid; p < C * C / 8; p += blockDim.x)
            hpd_cp_async16(dst + 3 * C * LDK + p / 8 * LDC + 8 * (p % 8),
                           P + pl.qk + (size_t)p * 16, 16);
        hpd_cp_async_commit();
    };
    /* the element of fragment (tile nt, register r): its row (+ the
     * tile's first) and its state column */
    const auto frag_row = [&](uint32_t r) { return g + 8 * (r / 2); };
    const auto frag_col = [&](uint32_t nt, uint32_t r) { return col0 + 8 * nt + 2 * t + r % 2; };
    /* S~ of this warp's fragments to shared memory */
    float S[SNT][4] = {};
    const auto store_s = [&]() {
        for_pairs<SNT>(xs, 8 * sn0, lane, [&](uint32_t nt, uint32_t hf, uint32_t x, uint32_t j) {
            *(uint32_t *)(Sb + x * LDV + j) = hpd_bf16x2(S[nt][2 * hf], S[nt][2 * hf + 1]);
        });
    };
    /* B fragments of tiles 2 np, 2 np + 1 from a k-major array (S~, VN~) */
    const auto b_frags = [&](uint32_t b[4], const uint16_t *m, uint32_t k0, uint32_t np) {
        hpd_ldmatrix_x4_trans(b, tile_at<false>(m, LDV, k0, 16 * np, lane));
    };
    /* this lane's elements of the state's columns: f(nt, r, row, column) */
    const auto state_elems = [&](auto f) {
#pragma unroll
        for (uint32_t nt = 0; nt < SNT; nt++)
#pragma unroll
            for (uint32_t r = 0; r < 4; r++)
                f(nt, r, xs + frag_row(r), frag_col(sn0 + nt, r));
    };

    fetch(0, 0);
    state_elems([&](uint32_t nt, uint32_t r, uint32_t x, uint32_t j) {
        S[nt][r] = j < dv ? state[(size_t)x * dv + j] : 0.0f;
    });
    store_s();
    for (uint32_t n = 0; n < seg.n_chunks; n++) {
        /* this chunk's U (the elements of this lane's fragments; rows past
         * its end and columns past dv 0) and exp(gc_last) from global
         * memory, their loads in flight across the wait */
        const chunk_t ch = chunks[seg.chunk0 + n];
        const char *P = chunk_prep(n);
        const float *U = (const float *)(P + pl.u);
        const float elast = *(const float *)(P + pl.el);
        float u[2][4];
#pragma unroll
        for (uint32_t nt = 0; nt < 2; nt++)
#pragma unroll
            for (uint32_t r = 0; r < 4; r++) {
                const uint32_t i = m0 + frag_row(r), j = frag_col(2 * vp + nt, r);
                u[nt][r] = i < ch.len && j < dv ? U[(size_t)i * dv + j] : 0.0f;
            }
        if (two) { /* the next chunk's operands on their way (or an empty group) */
            if (n + 1 < seg.n_chunks)
                fetch(n + 1, (n + 1) % 2);
            else
                hpd_cp_async_commit();
            hpd_cp_async_wait<1>();
        } else {
            if (n > 0)
                fetch(n, 0);
            hpd_cp_async_wait<0>();
        }
        __syncthreads(); /* chunk n's operands and S~ in shared memory */
        const uint16_t *W = smb + (two ? n % 2 : 0) * SM::BUF, *QE = W + C * LDK;
        const uint16_t *KE = QE + C * LDK, *QK = KE + C * LDK;
        float ws[2][4] = {}, o[2][4] = {};
        /* W S~ and QE S~, sharing S~'s fragments */
#pragma unroll 2
        for (uint32_t kk = 0; kk < DK / 16; kk++) {
            uint32_t aw[4], aq[4], bs[4];
            const uint16_t *at = tile_at<false>(W, LDK, m0, 16 * kk, lane);
            hpd_ldmatrix_x4(aw, at);
            hpd_ldmatrix_x4(aq, at + (QE - W)); /* (the same block of QE) */
            b_frags(bs, Sb, 16 * kk, vp);
            mma_pair(ws[0], ws[1], aw, bs);
            mma_pair(o[0], o[1], aq, bs);
        }
        /* VN = U - W S~, to shared memory as VN~ */
        for_pairs<2>(m0, 16 * vp, lane, [&](uint32_t nt, uint32_t hf, uint32_t i, uint32_t j) {
            *(uint32_t *)(VNb + i * LDV + j) =
                hpd_bf16x2(__fsub_rn(u[nt][2 * hf], ws[nt][2 * hf]),
                           __fsub_rn(u[nt][2 * hf + 1], ws[nt][2 * hf + 1]));
        });
        __syncthreads(); /* VN~ whole; S~ read by every warp */
        /* o += QK VN~, the blocks of columns at or left of this warp's rows */
        for (uint32_t kk = 0; 16 * kk <= m0; kk++) {
            uint32_t aqk[4], bv[4];
            hpd_ldmatrix_x4(aqk, tile_at<false>(QK, LDC, m0, 16 * kk, lane));
            b_frags(bv, VNb, 16 * kk, vp);
            mma_pair(o[0], o[1], aqk, bv);
        }
        float *out = a.out.p + (size_t)h * a.out.hs;
#pragma unroll
        for (uint32_t nt = 0; nt < 2; nt++)
#pragma unroll
            for (uint32_t r = 0; r < 4; r++) {
                const uint32_t i = m0 + frag_row(r), j = frag_col(2 * vp + nt, r);
                if (i < ch.len && j < dv)
                    out[(size_t)(ch.row0 + i) * a.out.ld + j] = o[nt][r];
            }
        /* S = exp(gc_last) S + KE^T VN~ (KE read transposed) */
        state_elems([&](uint32_t nt, uint32_t r, uint32_t, uint32_t) {
            S[nt][r] = __fmul_rn(S[nt][r], elast);
        });
#pragma unroll
        for (uint32_t kk = 0; kk < C / 16; kk++) {
            uint32_t ak[4];
            hpd_ldmatrix_x4_trans(ak, tile_at<true>(KE, LDK, 16 * kk, xs, lane));
#pragma unroll
            for (uint32_t p = 0; p < SNT / 2; p++) {
                uint32_t bv[4];
                b_frags(bv, VNb, 16 * kk, sn0 / 2 + p);
                mma_pair(S[2 * p], S[2 * p + 1], ak, bv);
            }
        }
        store_s();       /* (S~ is not read again before the barrier) */
        __syncthreads(); /* S~ whole; VN~ and this chunk's buffer free */
    }
    state_elems([&](uint32_t nt, uint32_t r, uint32_t x, uint32_t j) {
        if (j < dv)
            state[(size_t)x * dv + j] = S[nt][r];
    });
}

/* Pass 2 in registers for these dk (the form, and so the bits, follow dk
 * alone, never the GPU's shared memory); shared memory for the others. */
static bool state_in_registers(uint32_t dk)
{
    return dk == 32 || dk == 64 || dk == 128 || dk == 256;
}

/* Shared memory of pass 2: the register form (plus the staged W, QE and KE),
 * and the shared form. */
static size_t state_reg_smem(bool staged, uint32_t dk)
{
    return ((size_t)C * STATE_COLS + (size_t)C * C + (size_t)STATE_WARPS * C * STATE_COLS +
            (staged ? (size_t)3 * C * dk : 0)) * sizeof(float);
}

static size_t state_shared_smem(uint32_t dk)
{
    return ((size_t)(dk + C) * (STATE_COLS + 1) + (size_t)C * C + 3 * (size_t)C * dk) *
           sizeof(float);
}

/* Launches pass 2 in the form dk takes, staging W, QE and KE through shared
 * memory where that fits too (the same sums either way). */
static cudaError_t launch_state_pass(hpd_cuda_ctx_t *c, const hpd_gdn_args_t *a, uint32_t blocks,
                                     const chunk_t *chunks, const segment_t *segs,
                                     const char *prep, uint32_t base)
{
#define HPD_STATE_REG(R, ST)                                                                \
    {                                                                                       \
        const size_t sm = state_reg_smem(ST, 8 * (R));                                      \
        const cudaError_t e = cudaFuncSetAttribute(                                         \
            gdn_chunk_state_reg_kernel<R, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
            (int)sm);                                                                       \
        if (e != cudaSuccess)                                                               \
            return e;                                                                       \
        gdn_chunk_state_reg_kernel<R, ST><<<blocks, CHUNK_THREADS, sm, c->stream>>>(        \
            *a, chunks, segs, prep, base);                                                  \
        return cudaGetLastError();                                                          \
    }
#define HPD_STATE_REG_CASE(R)                                                               \
    case 8 * (R):                                                                           \
        if (state_reg_smem(true, a->dk) <= c->smem_optin)                                   \
            HPD_STATE_REG(R, true)                                                          \
        HPD_STATE_REG(R, false)
    switch (a->dk) {
        HPD_STATE_REG_CASE(4)
        HPD_STATE_REG_CASE(8)
        HPD_STATE_REG_CASE(16)
        HPD_STATE_REG_CASE(32)
    default:
        break;
    }
#undef HPD_STATE_REG_CASE
#undef HPD_STATE_REG
    const size_t sm = state_shared_smem(a->dk);
    const cudaError_t e = cudaFuncSetAttribute(gdn_chunk_state_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    if (e != cudaSuccess)
        return e;
    gdn_chunk_state_kernel<<<blocks, CHUNK_THREADS, sm, c->stream>>>(*a, chunks, segs, prep,
                                                                     base);
    return cudaGetLastError();
}

/* cuda-bf16's state pass takes tensor cores for these dk (the form, and so
 * the bits, follow dk alone); the fp32 passes take the others. */
static bool state_on_tensor_cores(uint32_t dk)
{
    return dk == 64 || dk == 128;
}

/* tc_state_bytes for dk 64 or 128 */
static size_t tc_state_bytes_dk(uint32_t dk, bool two)
{
    return dk == 64 ? tc_state_bytes<64>(two) : tc_state_bytes<128>(two);
}

/* Shared memory of the tensor-core state pass for `blocks` blocks: two
 * chunk buffers (*two) where they fit and the blocks are at most one per SM
 * (at dk 128 two buffers leave room for one block per SM, one buffer for
 * two: past n_sms blocks, two blocks' warps hide each other's loads), else
 * one; HPD_CUDA_GDN_BUFFERS (c->gdn_bufs: 1 or 2) forces the choice where
 * it fits. The same sums either way. */
static size_t tc_state_smem_bytes(const hpd_cuda_ctx_t *c, uint32_t dk, uint32_t blocks,
                                  bool *two)
{
    const size_t b2 = tc_state_bytes_dk(dk, true);
    *two = b2 <= c->smem_optin &&
           (c->gdn_bufs == 2 || (c->gdn_bufs == 0 && blocks <= c->n_sms));
    return *two ? b2 : tc_state_bytes_dk(dk, false);
}

static cudaError_t launch_tc_state_pass(hpd_cuda_ctx_t *c, const hpd_gdn_args_t *a,
                                        uint32_t blocks, const chunk_t *chunks,
                                        const segment_t *segs, const char *prep, uint32_t base)
{
    bool two;
    const size_t sm = tc_state_smem_bytes(c, a->dk, blocks, &two);
    const auto launch = [&](auto kernel) {
        const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess)
            return e;
        kernel<<<blocks, TC_STATE_WARPS * 32, sm, c->stream>>>(*a, chunks, segs, prep, base, two);
        return cudaGetLastError();
    };
    return a->dk == 64 ? launch(gdn_chunk_state_tc_kernel<64>)
                       : launch(gdn_chunk_state_tc_kernel<128>);
}

#ifndef PREP_SCRATCH_BYTES /* a test may set a smaller bound, to take many passes */
#define PREP_SCRATCH_BYTES ((size_t)512 << 20)
#endif

/* The chunked rule: the fp32 passes (cuda), or with bf16 (cuda-bf16) the
 * tensor-core state pass where dk takes it. */
static hpd_status_t gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a, bool bf16)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    if (a->nk == 0 || a->nv == 0 || a->nv % a->nk != 0 || a->dk == 0 || a->dv == 0) {
        HPD_LOG_ERROR("cuda", "gdn_chunked: nk %u, nv %u, dk %u, dv %u (expected nonzero, nv a "
                      "multiple of nk)", a->nk, a->nv, a->dk, a->dv);
        return HPD_ERR_INVALID_ARG;
    }
    const bool tc = bf16 && state_on_tensor_cores(a->dk);
    const size_t smem1 = tc ? tc_prep_smem(a->dk, a->dv).bytes
                            : (4 * C + 768 + 2 * (size_t)C * (a->dk + 1) + (size_t)C * C) * 4;
    /* (the tensor-core pass needs one chunk buffer at least) */
    const size_t smem2 = tc ? tc_state_bytes_dk(a->dk, false)
                         : state_in_registers(a->dk) ? state_reg_smem(false, a->dk)
                                                     : state_shared_smem(a->dk);
    if (smem1 > c->smem_optin || smem2 > c->smem_optin) {
        HPD_LOG_ERROR("cuda", "gdn_chunked: dk %u, dv %u need %zu bytes of shared memory, GPU %d "
                      "has %zu per block", a->dk, a->dv, smem1 > smem2 ? smem1 : smem2,
                      c->device, c->smem_optin);
        return HPD_ERR_UNSUPPORTED;
    }
    if (a->n_seqs == 0)
        return HPD_OK;
    /* the batch's chunks on each sequence's absolute grid */
    uint32_t n_chunks = 0;
    for (uint32_t s = 0; s < a->n_seqs; s++) {
        const hpd_seq_t q = a->seqs[s];
        if (q.n_tokens > 0)
            n_chunks += (q.start_pos % C + q.n_tokens + C - 1) / C;
    }
    if (n_chunks == 0)
        return HPD_OK;
    chunk_t *chunks = (chunk_t *)malloc(n_chunks * sizeof(chunk_t));
    segment_t *segs = (segment_t *)malloc((n_chunks + a->n_seqs) * sizeof(segment_t));
    uint32_t *seq_of = (uint32_t *)malloc(n_chunks * sizeof(uint32_t));
    if (chunks == NULL || segs == NULL || seq_of == NULL) {
        free(chunks), free(segs), free(seq_of);
        return HPD_ERR_NO_MEMORY;
    }
    for (uint32_t s = 0, n = 0; s < a->n_seqs; s++)
        for (uint32_t done = 0; done < a->seqs[s].n_tokens;) {
            const uint32_t pos = a->seqs[s].start_pos + done;
            const uint32_t L = min(C - pos % C, a->seqs[s].n_tokens - done);
            chunks[n] = (chunk_t){a->seqs[s].row + done, L};
            seq_of[n++] = s;
            done += L;
        }
    const size_t per_chunk = (size_t)a->nv * prep_layout(a->dk, a->dv, tc).bytes;
    const uint32_t tiles = (a->dv + STATE_COLS - 1) / STATE_COLS;
    hpd_status_t st = HPD_OK;
    const auto prep_kernel = !tc         ? gdn_chunk_prep_kernel
                             : a->dk == 64 ? gdn_chunk_prep_tc_kernel<64>
                                           : gdn_chunk_prep_tc_kernel<128>;
    cudaError_t err =
        cudaFuncSetAttribute(prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem1);
    /* passes over runs of chunks whose prepared form fits the scratch */
    for (uint32_t c0 = 0; err == cudaSuccess && st == HPD_OK && c0 < n_chunks;) {
        uint32_t c1 = c0 + 1;
        while (c1 < n_chunks && (size_t)(c1 + 1 - c0) * per_chunk <= PREP_SCRATCH_BYTES)
            c1++;
        uint32_t n_segs = 0;
        for (uint32_t n = c0; n < c1; n++) {
            if (n == c0 || seq_of[n] != seq_of[n - 1])
                segs[n_segs++] = (segment_t){a->states[seq_of[n]], n, 0};
            segs[n_segs - 1].n_chunks++;
        }
        void *work, *dchunks, *dsegs;
        const hpd_cuda_meta_t m[] = {
            {.host = chunks, .bytes = n_chunks * sizeof(chunk_t), .dev_p = &dchunks},
            {.host = segs, .bytes = n_segs * sizeof(segment_t), .dev_p = &dsegs}};
        if ((st = hpd_cuda_work(b, (c1 - c0) * per_chunk, &work)) != HPD_OK ||
            (st = hpd_cuda_stage(b, m, 2)) != HPD_OK)
            break;
        const uint32_t prep_blocks = (c1 - c0) * a->nv, state_blocks = n_segs * a->nv * tiles;
        prep_kernel<<<prep_blocks, CHUNK_THREADS, smem1, c->stream>>>(
            *a, (const chunk_t *)dchunks + c0, (char *)work);
        if ((err = cudaGetLastError()) != cudaSuccess)
            break;
        err = (tc ? launch_tc_state_pass : launch_state_pass)(
            c, a, state_blocks, (const chunk_t *)dchunks, (const segment_t *)dsegs,
            (const char *)work, c0);
        if (err != cudaSuccess)
            break;
        c0 = c1;
    }
    free(chunks), free(segs), free(seq_of);
    if (err != cudaSuccess) {
        HPD_LOG_ERROR("cuda", "gdn_chunked on GPU %d: %s", c->device, cudaGetErrorString(err));
        st = HPD_ERR_INTERNAL;
    }
    return st;
}

hpd_status_t hpd_cuda_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    return gdn_chunked(b, a, false);
}

hpd_status_t hpd_cuda_gdn_chunked_bf16(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    return gdn_chunked(b, a, true);
}
