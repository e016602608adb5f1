/* Token sampling on the GPU: one block of 1024 threads per row, thread t
 * owning a contiguous run of token ids.
 *
 * Greedy: the first maximum (ties to the lowest id), as the CPU backend.
 * Temperature: the kept set is found without sorting the row. top-k keeps the k
 * largest scaled logits (ties at the threshold to the lowest ids): the
 * threshold, the k-th largest of the order-preserving integer keys of the
 * floats, comes from a radix select, four passes over the row that count
 * the keys by one byte each (a histogram of 256 integer counts in shared
 * memory: integer atomics, so the counts and the result do not depend on
 * the order the threads add in); top-p then keeps the fewest of those,
 * largest first, whose probability mass reaches top_p: when top-k keeps at
 * most NT ids, or the NT largest ids (a radix select) hold top_p's mass,
 * from those ids sorted in shared memory (top_p_sorted: one pass over the
 * row), else by bisection over the keys (32 passes). The draw u (Philox,
 * keyed by (seed, position), from the host) walks the kept probabilities
 * in id order. Every sum has a fixed order (each thread's run in order,
 * then the runs in order), so a row's token depends on its logits and
 * (seed, position) alone. The CPU walks the kept set in sorted order
 * instead: both draw from the same distribution, greedy rows agree exactly,
 * sampled ones in general do not. */
#include <math.h>
#include <stdlib.h>

#include "common/rng.h"
#include "kernels/cuda/cuda_ops.h"

#define NT 1024

typedef struct {
    float inv_t; /* 0: greedy */
    float top_p;
    uint32_t top_k; /* 0: off */
    float u;        /* the row's uniform draw */
} row_params_t;

/* Monotone map of floats to unsigned integers (-inf lowest). */
__device__ static inline uint32_t fkey(float f)
{
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__device__ static inline float unkey(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

/* A block-wide reduction in a fixed tree (the same order every time);
 * every thread gets the result. */
template <typename T, typename Op>
__device__ static T block_reduce(T v, T *red, Op op)
{
    red[threadIdx.x] = v;
    __syncthreads();
    for (uint32_t s = NT / 2; s > 0; s /= 2) {
        if (threadIdx.x < s)
            red[threadIdx.x] = op(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    const T r = red[0];
    __syncthreads();
    return r;
}

struct add_op {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};
struct min_op {
    __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return min(a, b); }
};
/* ids: the larger logit wins, then the lower id (ids >= vocab: none). The
 * tree meets runs out of id order (step s pairs slot t with slot t + s,
 * and slot t may already hold a higher run's id), so an equal value must
 * compare the ids, not keep the left operand. */
struct argmax_op {
    const float *x;
    uint32_t vocab;
    __device__ uint32_t operator()(uint32_t a, uint32_t b) const
    {
        return b < vocab && (a >= vocab || x[b] > x[a] || (x[b] == x[a] && b < a)) ? b : a;
    }
};

/* The kept set: key > tau, or key == tau among the first `need` such ids. */
typedef struct {
    uint32_t tau, need;
} kept_t;

/* One thread's run of a row: ids [i0, i1), scaled by inv_t. */
typedef struct {
    const float *x;
    uint32_t i0, i1;
    float inv_t;
} run_t;

/* Walks the kept ids of a run in order; eq is the number of ids equal to
 * tau in the runs before. */
#define FOR_KEPT(r, kept, eq, xs, i)                                           \
    for (uint32_t i = (r).i0, eq_ = (eq); i < (r).i1; i++)                     \
        if (float xs = (r).x[i] * (r).inv_t; fkey(xs) > (kept).tau ||          \
                                             (fkey(xs) == (kept).tau && eq_++ < (kept).need))

/* The k-th largest key of the row (1 <= k <= vocab) and how many ids equal
 * to it the k largest take (ties to the lowest ids: the caller keeps the
 * first `need` of them): the key is fixed a byte at a time, from the top,
 * by counting the keys that agree with it so far by their next byte. */
__device__ static kept_t radix_select(const run_t *r, uint32_t k, uint32_t *hist,
                                      uint32_t *shared_digit)
{
    uint32_t prefix = 0, mask = 0, left = k; /* left: of the k, still to place */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint32_t b = threadIdx.x; b < 256; b += NT)
            hist[b] = 0;
        __syncthreads();
        for (uint32_t i = r->i0; i < r->i1; i++) {
            const uint32_t key = fkey(r->x[i] * r->inv_t);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            /* from the largest byte down: the k-th largest has this byte
             * when the keys above it leave fewer than `left` */
            uint32_t b = 255;
            while (hist[b] < left) {
                left -= hist[b];
                b--;
            }
            shared_digit[0] = b;
            shared_digit[1] = left;
        }
        __syncthreads();
        prefix |= shared_digit[0] << shift;
        mask |= 255u << shift;
        left = shared_digit[1];
        __syncthreads(); /* hist and shared_digit are rewritten next */
    }
    return kept_t{prefix, left};
}

/* Every thread's count of ids equal to tau in the runs before its own. */
__device__ static void eq_prefix(const run_t *r, uint32_t tau, uint32_t *red, uint32_t *before)
{
    uint32_t n = 0;
    for (uint32_t i = r->i0; i < r->i1; i++)
        n += fkey(r->x[i] * r->inv_t) == tau;
    red[threadIdx.x] = n;
    __syncthreads();
    if (threadIdx.x == 0)
        for (uint32_t t = 0, acc = 0; t < NT; t++) {
            before[t] = acc;
            acc += red[t];
        }
    __syncthreads();
}

/* top-p over a kept set of at most NT ids (top_k <= NT): the ids gathered
 * in id order, sorted largest first (ties to the lowest id; a bitonic sort
 * in shared memory, the same network every time), their masses added in
 * that order by one thread up to top_p * total: the new threshold and how
 * many ids at it the set takes (the lowest). One pass over the row where
 * the bisection below takes 32. */
__device__ static kept_t top_p_sorted(const run_t *r, kept_t kept, uint32_t eq, float mx,
                                      float target, uint32_t *cnt, uint32_t *skey,
                                      uint32_t *sid, bool *reached_p)
{
    __shared__ uint32_t n_kept, result[3];
    uint32_t n = 0;
    FOR_KEPT(*r, kept, eq, xs, i)
    {
        (void)xs;
        n++;
    }
    cnt[threadIdx.x] = n;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t acc = 0;
        for (uint32_t t = 0; t < NT; t++) {
            const uint32_t c = cnt[t];
            cnt[t] = acc;
            acc += c;
        }
        n_kept = acc;
    }
    __syncthreads();
    uint32_t at = cnt[threadIdx.x];
    FOR_KEPT(*r, kept, eq, xs, i)
    {
        skey[at] = fkey(xs);
        sid[at++] = i;
    }
    uint32_t P = 1;
    while (P < n_kept)
        P *= 2;
    for (uint32_t i = n_kept + threadIdx.x; i < P; i += NT)
        skey[i] = 0, sid[i] = 0xffffffffu; /* after every id */
    __syncthreads();
    for (uint32_t k = 2; k <= P; k *= 2)
        for (uint32_t j = k / 2; j > 0; j /= 2) {
            for (uint32_t i = threadIdx.x; i < P; i += NT) {
                const uint32_t o = i ^ j;
                if (o <= i)
                    continue;
                /* o goes first: a larger key, or the same key and a lower id */
                const bool o_first = skey[o] > skey[i] || (skey[o] == skey[i] && sid[o] < sid[i]);
                if (((i & k) == 0) == o_first) {
                    const uint32_t tk = skey[i], ti = sid[i];
                    skey[i] = skey[o], sid[i] = sid[o];
                    skey[o] = tk, sid[o] = ti;
                }
            }
            __syncthreads();
        }
    if (threadIdx.x == 0) {
        float cum = 0.0f;
        uint32_t c = 0;
        bool reached = false;
        for (; c + 1 < n_kept; c++) {
            cum += expf(unkey(skey[c]) - mx);
            if ((reached = cum >= target))
                break;
        }
        if (!reached) /* c is the last: does its mass reach the target? */
            reached = cum + expf(unkey(skey[c]) - mx) >= target;
        uint32_t need = 0;
        for (uint32_t t = 0; t <= c; t++)
            need += skey[t] == skey[c];
        result[0] = skey[c];
        result[1] = need;
        result[2] = reached;
    }
    __syncthreads();
    const kept_t out = {result[0], result[1]};
    *reached_p = result[2] != 0;
    __syncthreads();
    return out;
}

/* Probability mass (unnormalised, max mx) of the kept ids with key >= from. */
__device__ static float kept_mass(const run_t *r, kept_t kept, uint32_t eq, float mx,
                                  uint32_t from, float *red)
{
    float m = 0.0f;
    FOR_KEPT(*r, kept, eq, xs, i)
    {
        if (fkey(xs) >= from)
            m += expf(xs - mx);
    }
    return block_reduce(m, red, add_op());
}

__global__ void __launch_bounds__(NT, 2) /* two rows an SM */
    sample_kernel(const float *logits, uint32_t ld, uint32_t vocab, const row_params_t *params,
                  int32_t *out)
{
    __shared__ float redf[NT];
    __shared__ uint32_t redu[NT];
    __shared__ uint32_t eq_before[NT]; /* ids equal to tau in the runs before */
    __shared__ float mass_before[NT];
    __shared__ uint32_t sort_key[NT], sort_id[NT]; /* top_p_sorted */
    const row_params_t p = params[blockIdx.x];
    const float *x = logits + (size_t)blockIdx.x * ld;
    const uint32_t tid = threadIdx.x, per = (vocab + NT - 1) / NT;
    const uint32_t i0 = min(tid * per, vocab), i1 = min(i0 + per, vocab);
    const run_t run = {x, i0, i1, p.inv_t};

    if (p.inv_t == 0.0f) {
        /* argmax: the larger value wins, then the lower id */
        uint32_t best = i0;
        for (uint32_t i = i0 + 1; i < i1; i++)
            if (x[i] > x[best])
                best = i;
        best = block_reduce(best, redu, argmax_op{x, vocab});
        if (tid == 0)
            out[blockIdx.x] = (int32_t)best;
        return;
    }

    /* the largest scaled logit */
    float mx = -INFINITY;
    for (uint32_t i = i0; i < i1; i++)
        mx = fmaxf(mx, x[i] * p.inv_t);
    mx = block_reduce(mx, redf, max_op());

    kept_t kept = {0, vocab};
    if (p.top_k > 0 && p.top_k < vocab)
        kept = radix_select(&run, p.top_k, redu, eq_before);
    eq_prefix(&run, kept.tau, redu, eq_before);
    float total = kept_mass(&run, kept, eq_before[tid], mx, 0, redf);
    /* top-p among at most NT candidates, sorted (a few passes over the
     * row): top-k's set when it is that small, else the NT largest of the
     * row when their mass reaches top_p's (they are the largest of top-k's
     * set too, and the top-p set is among them: an LLM's nucleus mostly is);
     * else the bisection below (32 passes) */
    bool sorted = false;
    if (p.top_p < 1.0f) {
        const float target = p.top_p * total;
        const uint32_t n_kept = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
        kept_t cand = kept;
        bool fits = n_kept <= NT;
        if (!fits) {
            cand = radix_select(&run, NT, redu, eq_before);
            eq_prefix(&run, cand.tau, redu, eq_before);
            fits = kept_mass(&run, cand, eq_before[tid], mx, 0, redf) >= target;
        }
        if (fits) {
            bool reached;
            const kept_t set = top_p_sorted(&run, cand, eq_before[tid], mx, target, redu,
                                            sort_key, sort_id, &reached);
            /* the NT largest fell short in the sorted sum (the tree's said
             * they reach it: a rounding apart): the bisection over all of
             * top-k's; a set of at most NT ids is whole either way */
            sorted = reached || n_kept <= NT;
            if (sorted)
                kept = set;
        }
        eq_prefix(&run, kept.tau, redu, eq_before); /* the set's own, for either way */
        if (sorted)
            total = kept_mass(&run, kept, eq_before[tid], mx, 0, redf);
    }
    if (p.top_p < 1.0f && !sorted) {
        /* the largest tau' with mass(key >= tau') >= top_p * total */
        const float target = p.top_p * total;
        uint32_t lo = kept.tau, hi = 0xffffffffu;
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo) / 2 + 1;
            if (kept_mass(&run, kept, eq_before[tid], mx, mid, redf) >= target)
                lo = mid;
            else
                hi = mid - 1;
        }
        /* lo == tau: top-k's set already ends where top-p would */
        if (lo > kept.tau) {
            /* the keys above lo, then as many ids at lo (lowest first) as
             * it takes to reach the mass */
            const float above = kept_mass(&run, kept, eq_before[tid], mx, lo + 1, redf);
            const float each = expf(unkey(lo) - mx);
            uint32_t n = 0;
            for (uint32_t i = i0; i < i1; i++)
                n += fkey(x[i] * p.inv_t) == lo;
            const uint32_t have = block_reduce(n, redu, add_op());
            uint32_t need = each > 0.0f ? (uint32_t)ceilf((target - above) / each) : have;
            kept.tau = lo;
            kept.need = max(1u, min(need, have));
            eq_prefix(&run, kept.tau, redu, eq_before);
            total = kept_mass(&run, kept, eq_before[tid], mx, 0, redf);
        }
    }

    /* the draw: u * total along the kept probabilities in id order */
    float mine = 0.0f;
    FOR_KEPT(run, kept, eq_before[tid], xs, i)
    {
        mine += expf(xs - mx);
    }
    redf[tid] = mine;
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (uint32_t t = 0; t < NT; t++) {
            mass_before[t] = acc;
            acc += redf[t];
        }
    }
    __syncthreads();
    const float target = p.u * total, before = mass_before[tid];
    const bool owns = mine > 0.0f && target >= before && target < before + mine;
    int32_t drawn = -1, last = -1;
    float cum = before;
    FOR_KEPT(run, kept, eq_before[tid], xs, i)
    {
        last = (int32_t)i;
        cum += expf(xs - mx);
        if (drawn < 0 && target < cum)
            drawn = (int32_t)i;
    }
    /* the first run that holds the target draws (its own walk's rounding
     * may end just short: then its last kept id); a target past every run
     * takes the highest kept id */
    const uint32_t owner = block_reduce(owns ? tid : (uint32_t)NT, redu, min_op());
    if (owner < NT) {
        if (tid == owner)
            out[blockIdx.x] = drawn >= 0 ? drawn : last;
        return;
    }
    const uint32_t highest = block_reduce((uint32_t)(last + 1), redu, max_op());
    if (tid == 0)
        out[blockIdx.x] = (int32_t)highest - 1;
}

hpd_status_t hpd_cuda_sample(hpd_backend_t *b, const hpd_sample_args_t *a)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    void *dparams, *dout;
    hpd_status_t st;

    if (a->n_rows == 0)
        return HPD_OK;
    if (a->vocab == 0)
        return HPD_ERR_INVALID_ARG;
    row_params_t *rp = (row_params_t *)malloc(a->n_rows * sizeof(*rp));
    if (rp == NULL)
        return HPD_ERR_NO_MEMORY;
    for (uint32_t r = 0; r < a->n_rows; r++) {
        const hpd_sampling_t *s = &a->params[r];
        const bool greedy = s->temperature <= 0.0f;
        rp[r] = (row_params_t){greedy ? 0.0f : 1.0f / s->temperature, s->top_p, s->top_k,
                               greedy ? 0.0f : hpd_rng_uniform(s->seed, a->positions[r])};
    }
    /* the parameters, and room for the tokens */
    const hpd_cuda_meta_t m[] = {
        {.host = rp, .bytes = a->n_rows * sizeof(*rp), .dev_p = &dparams},
        {.host = NULL, .bytes = a->n_rows * sizeof(int32_t), .dev_p = &dout}};
    st = hpd_cuda_stage(b, m, 2);
    free(rp);
    if (st != HPD_OK)
        return st;
    sample_kernel<<<a->n_rows, NT, 0, c->stream>>>(a->logits, a->ld, a->vocab,
                                                   (const row_params_t *)dparams,
                                                   (int32_t *)dout);
    HPD_CUDA_LAUNCHED();
    HPD_CUDA_CHECK(cudaMemcpyAsync(a->out, dout, a->n_rows * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, c->stream));
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return HPD_OK;
}
