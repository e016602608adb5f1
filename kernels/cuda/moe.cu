/* The mixture of experts on the GPU (backend.h): the routing, gathering
 * each expert's rows, and the weighted sum of a token's experts into the
 * residual with the CPU's sequence of roundings (product, then sum, j in
 * order; explicit _rn intrinsics so nothing is fused). The routing's
 * results stay in device memory for gather, gemm_grouped (gemm.cu) and
 * moe_combine: no op of an MoE layer waits for the host.
 *
 * The routing, in three launches after a memset:
 *   route_kernel: a warp per token runs the router of kernels/moe_route.h:
 *     the max of the logits (exact in any order), p_i = expf(l_i - max) in
 *     shared memory, their sum by lane 0 in ascending i (the CPU's order),
 *     p_i / sum, then top_k rounds of a warp argmax (the largest p, ties to
 *     the lowest id, as the CPU's strict >), the renormalisation summed in
 *     the order selected and the ids sorted ascending by lane 0; each
 *     (token, expert) sets bit t % 32 of word t / 32 of its expert's row of
 *     a hit bitmap [experts][words] (an integer OR: the same bits in any
 *     order);
 *   count_kernel: a thread per expert counts its hits word by word (the
 *     running count before each word kept), a block scan of the counts
 *     gives first[];
 *   slot_kernel: a thread per (token, expert): its slot is its expert's
 *     first + the hits of earlier tokens (the count before its word + the
 *     bits below it in its word): expert by expert, tokens in order, as
 *     hpd_moe_number numbers them on the CPU.
 * Integers throughout but the router's own arithmetic, so the slots are the
 * same on every run and in every batch; the weights differ from the CPU's
 * only where the GPU's expf does. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/block_scan.h"
#include "kernels/moe_route.h"

#define ROUTE_WARPS 4
#define EXPERT_THREADS 1024 /* the count kernel's block: HPD_MAX_EXPERTS */
static_assert(HPD_MAX_EXPERTS <= EXPERT_THREADS, "a thread per expert");
static_assert(HPD_MAX_EXPERTS % 256 == 0,
              "route_small_kernel's threads count whole runs of experts");

/* a warp's candidate: p and id (UINT32_MAX: none); the larger p wins, a tie
 * (or a NaN) the lower id */
__device__ static inline void best_of(float &p, uint32_t &id, float q, uint32_t qid)
{
    if (qid == UINT32_MAX)
        return;
    if (id == UINT32_MAX || q > p || (!(p > q) && qid < id))
        p = q, id = qid;
}

/* Token t's routing by one warp (every lane calls it): p, ids and w are
 * the warp's shared scratch (E probabilities, top_k ids and weights); ids
 * and w end sorted by ascending id. */
__device__ static void route_token(const hpd_moe_route_args_t &a, uint32_t t, float *p,
                                   uint32_t *ids, float *w, uint32_t lane)
{
    const uint32_t E = a.n_experts, K = a.top_k;
    const float *l = a.logits + (size_t)t * a.ld;
    float max = -INFINITY;
    for (uint32_t i = lane; i < E; i += 32)
        max = l[i] > max ? l[i] : max;
    for (uint32_t o = 16; o > 0; o /= 2) {
        const float v = __shfl_xor_sync(0xffffffffu, max, o);
        max = v > max ? v : max;
    }
    for (uint32_t i = lane; i < E; i += 32)
        p[i] = expf(__fsub_rn(l[i], max));
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (uint32_t i = 0; i < E; i++)
            sum = __fadd_rn(sum, p[i]);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    __syncwarp(); /* lane 0 has read every p (a shuffle orders no memory) */
    for (uint32_t i = lane; i < E; i += 32)
        p[i] = __fdiv_rn(p[i], sum);
    __syncwarp();
    /* top_k rounds; lane L's experts L, L + 32, ... (at most 32: a mask) */
    uint32_t taken = 0;
    for (uint32_t j = 0; j < K; j++) {
        float bp = 0.0f;
        uint32_t bid = UINT32_MAX;
        for (uint32_t i = lane, b = 0; i < E; i += 32, b++)
            if (!(taken >> b & 1u))
                best_of(bp, bid, p[i], i);
        for (uint32_t o = 16; o > 0; o /= 2) {
            const float q = __shfl_xor_sync(0xffffffffu, bp, o);
            const uint32_t qid = __shfl_xor_sync(0xffffffffu, bid, o);
            best_of(bp, bid, q, qid);
        }
        if (bid % 32 == lane)
            taken |= 1u << (bid / 32);
        if (lane == 0)
            ids[j] = bid, w[j] = bp;
    }
    __syncwarp();
    if (lane == 0) {
        if (a.norm) {
            float s = 0.0f;
            for (uint32_t j = 0; j < K; j++)
                s = __fadd_rn(s, w[j]);
            for (uint32_t j = 0; j < K; j++)
                w[j] = __fdiv_rn(w[j], s);
        }
        for (uint32_t j = 1; j < K; j++) { /* ascending ids */
            const uint32_t id = ids[j];
            const float wj = w[j];
            uint32_t i = j;
            for (; i > 0 && ids[i - 1] > id; i--)
                ids[i] = ids[i - 1], w[i] = w[i - 1];
            ids[i] = id, w[i] = wj;
        }
    }
    __syncwarp();
}

/* A warp per token; a warp past the tokens computes the last token's
 * routing and writes nothing (no early exit: the host stand-in's __syncwarp
 * waits for the whole block). */
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    route_kernel(hpd_moe_route_args_t a, uint32_t *hits, uint32_t words)
{
    __shared__ float ps[ROUTE_WARPS][HPD_MAX_EXPERTS];
    __shared__ float sel_w[ROUTE_WARPS][HPD_MAX_TOPK];
    __shared__ uint32_t sel_id[ROUTE_WARPS][HPD_MAX_TOPK];
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, K = a.top_k;
    const uint32_t t_warp = blockIdx.x * ROUTE_WARPS + warp;
    const bool live = t_warp < a.n_tokens;
    const uint32_t t = live ? t_warp : a.n_tokens - 1;
    const uint32_t *ids = sel_id[warp];
    route_token(a, t, ps[warp], sel_id[warp], sel_w[warp], lane);
    for (uint32_t j = lane; j < K && live; j += 32) {
        a.ids[(size_t)t * K + j] = ids[j];
        a.weights[(size_t)t * K + j] = sel_w[warp][j];
        atomicOr(&hits[(size_t)ids[j] * words + t / 32], 1u << (t % 32));
    }
}

/* The whole routing of at most SMALL_TOKENS tokens (a decode step of a
 * small batch) in one block of SMALL_WARPS warps, one launch where the
 * general path takes three and a memset: the warps route the tokens in
 * turns with route_token (the same bits), the bitmap is one word per expert
 * in shared memory, thread u counts experts 4u .. 4u + 3 and a block scan
 * gives the first slots, then a thread per (token, expert) its slot. Each
 * turn costs a token's serial sum over the experts (lane 0), where the
 * general path routes every token at once: two turns at most (not yet
 * timed on a GPU: moe_layer's lines will say). */
#define SMALL_WARPS 8
#define SMALL_TOKENS 16 /* at most 32: a word of the bitmap */
#define SMALL_PER (HPD_MAX_EXPERTS / (SMALL_WARPS * 32)) /* experts a thread counts */
__global__ void __launch_bounds__(SMALL_WARPS * 32) route_small_kernel(hpd_moe_route_args_t a)
{
    __shared__ float ps[SMALL_WARPS][HPD_MAX_EXPERTS];
    __shared__ float sel_w[SMALL_WARPS][HPD_MAX_TOPK];
    __shared__ uint32_t sel_id[SMALL_WARPS][HPD_MAX_TOPK];
    __shared__ uint32_t hits[HPD_MAX_EXPERTS], firsts[HPD_MAX_EXPERTS];
    __shared__ uint32_t scan[2][SMALL_WARPS * 32];
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, K = a.top_k;
    const uint32_t E = a.n_experts;
    for (uint32_t x = tid; x < E; x += SMALL_WARPS * 32)
        hits[x] = 0;
    __syncthreads();
    for (uint32_t t0 = 0; t0 < a.n_tokens; t0 += SMALL_WARPS) {
        const bool live = t0 + warp < a.n_tokens;
        const uint32_t t = live ? t0 + warp : a.n_tokens - 1;
        route_token(a, t, ps[warp], sel_id[warp], sel_w[warp], lane);
        for (uint32_t j = lane; j < K && live; j += 32) {
            a.ids[(size_t)t * K + j] = sel_id[warp][j];
            a.weights[(size_t)t * K + j] = sel_w[warp][j];
            atomicOr(&hits[sel_id[warp][j]], 1u << t);
        }
        __syncwarp(); /* sel_* are rewritten by the next turn */
    }
    __syncthreads();
    uint32_t counts[SMALL_PER], mine = 0;
#pragma unroll
    for (uint32_t u = 0; u < SMALL_PER; u++) {
        const uint32_t x = tid * SMALL_PER + u;
        counts[u] = x < E ? __popc(hits[x]) : 0u;
        mine += counts[u];
    }
    uint32_t total;
    uint32_t at = hpd_block_scan<SMALL_WARPS * 32>(mine, scan, &total) - mine;
#pragma unroll
    for (uint32_t u = 0; u < SMALL_PER; u++) {
        const uint32_t x = tid * SMALL_PER + u;
        if (x < E) {
            firsts[x] = at;
            at += counts[u];
            a.first[x + 1] = at;
        }
    }
    if (tid == 0)
        a.first[0] = 0;
    __syncthreads(); /* firsts, and the ids written above */
    for (uint32_t i = tid; i < a.n_tokens * K; i += SMALL_WARPS * 32) {
        const uint32_t t = i / K, x = a.ids[i];
        const uint32_t slot = firsts[x] + __popc(hits[x] & ((1u << t) - 1u));
        a.slots[i] = slot;
        a.idx[slot] = t;
    }
}

__global__ void __launch_bounds__(EXPERT_THREADS)
    count_kernel(const uint32_t *hits, uint32_t *before, uint32_t words, uint32_t n_experts,
                 uint32_t *first)
{
    __shared__ uint32_t scan[2][EXPERT_THREADS];
    const uint32_t x = threadIdx.x;
    uint32_t run = 0;
    if (x < n_experts)
        for (uint32_t v = 0; v < words; v++) {
            before[(size_t)x * words + v] = run;
            run += __popc(hits[(size_t)x * words + v]);
        }
    uint32_t total;
    const uint32_t incl = hpd_block_scan<EXPERT_THREADS>(run, scan, &total);
    if (x < n_experts)
        first[x + 1] = incl;
    if (x == 0)
        first[0] = 0;
}

__global__ void slot_kernel(hpd_moe_route_args_t a, const uint32_t *hits, const uint32_t *before,
                            uint32_t words)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (uint64_t)a.n_tokens * a.top_k)
        return;
    const uint32_t t = (uint32_t)(i / a.top_k), x = a.ids[i];
    const size_t word = (size_t)x * words + t / 32;
    const uint32_t slot =
        a.first[x] + before[word] + __popc(hits[word] & ((1u << (t % 32)) - 1u));
    a.slots[i] = slot;
    a.idx[slot] = t;
}

hpd_status_t hpd_cuda_moe_route(hpd_backend_t *b, const hpd_moe_route_args_t *a)
{
    cudaStream_t s = hpd_cuda_ctx(b)->stream;
    void *work;
    hpd_status_t st;
    if ((st = hpd_moe_route_check(a)) != HPD_OK)
        return st;
    if (a->n_tokens <= SMALL_TOKENS) {
        route_small_kernel<<<1, SMALL_WARPS * 32, 0, s>>>(*a);
        HPD_CUDA_LAUNCHED();
        return HPD_OK;
    }
    const uint32_t words = (a->n_tokens + 31) / 32;
    const size_t map = (size_t)a->n_experts * words * sizeof(uint32_t);
    if ((st = hpd_cuda_work(b, 2 * map, &work)) != HPD_OK)
        return st;
    uint32_t *hits = (uint32_t *)work, *before = hits + map / sizeof(uint32_t);
    if (a->n_tokens > 0) {
        HPD_CUDA_CHECK(cudaMemsetAsync(hits, 0, map, s));
        const uint32_t blocks = (a->n_tokens + ROUTE_WARPS - 1) / ROUTE_WARPS;
        route_kernel<<<blocks, ROUTE_WARPS * 32, 0, s>>>(*a, hits, words);
        HPD_CUDA_LAUNCHED();
    }
    count_kernel<<<1, EXPERT_THREADS, 0, s>>>(hits, before, words, a->n_experts, a->first);
    HPD_CUDA_LAUNCHED();
    const uint64_t n = (uint64_t)a->n_tokens * a->top_k;
    if (n > 0) {
        slot_kernel<<<(uint32_t)((n + 255) / 256), 256, 0, s>>>(*a, hits, before, words);
        HPD_CUDA_LAUNCHED();
    }
    return HPD_OK;
}

__global__ void gather_kernel(const float *src, uint32_t ld_src, const uint32_t *idx,
                              uint32_t dim, float *dst, uint32_t ld_dst)
{
    const uint32_t i = blockIdx.x;
    const float *s = src + (size_t)idx[i] * ld_src;
    for (uint32_t d = threadIdx.x; d < dim; d += blockDim.x)
        dst[(size_t)i * ld_dst + d] = s[d];
}

hpd_status_t hpd_cuda_gather(hpd_backend_t *b, const hpd_gather_args_t *a)
{
    const void *idx = a->idx_dev;
    hpd_status_t st;
    if (a->n == 0)
        return HPD_OK;
    if (idx == NULL) { /* host indices (the LM head's rows): staged with the op */
        void *staged;
        const hpd_cuda_meta_t m = {.host = a->idx, .bytes = a->n * sizeof(uint32_t),
                                   .dev_p = &staged};
        if ((st = hpd_cuda_stage(b, &m, 1)) != HPD_OK)
            return st;
        idx = staged;
    }
    gather_kernel<<<a->n, 256, 0, hpd_cuda_ctx(b)->stream>>>(a->src, a->ld_src,
                                                              (const uint32_t *)idx, a->dim,
                                                              a->dst, a->ld_dst);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* One block per token, threads over the elements. */
__global__ void combine_kernel(hpd_moe_combine_args_t a)
{
    const uint32_t t = blockIdx.x;
    const float sg = a.shared != NULL ? hpd_sigmoidf(a.gate[(size_t)t * a.ld_gate]) : 0.0f;
    for (uint32_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < a.top_k; j++) {
            const uint32_t s = a.slots[(size_t)t * a.top_k + j];
            acc = __fadd_rn(acc, __fmul_rn(a.weights[(size_t)t * a.top_k + j],
                                           a.rows[(size_t)s * a.ld_rows + d]));
        }
        if (a.shared != NULL)
            acc = __fadd_rn(acc, __fmul_rn(sg, a.shared[(size_t)t * a.ld_shared + d]));
        float *x = a.x + (size_t)t * a.ldx + d;
        *x = __fadd_rn(*x, acc);
    }
}

hpd_status_t hpd_cuda_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a)
{
    if (a->n_tokens == 0)
        return HPD_OK;
    combine_kernel<<<a->n_tokens, 256, 0, hpd_cuda_ctx(b)->stream>>>(*a);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
