/* Paged KV store and causal GQA attention on the GPU.
 *
 * The host lists every query row of the batch as (sequence, batch row,
 * position) and flattens the sequences' block tables; both are staged to the
 * device. Attention takes the split-KV pass (below: 512-key splits, a KV
 * head's K and V read once for its query heads and for up to 8 prompt rows,
 * on tensor cores for up to 128 (row, head) pairs of a prompt, then a
 * combine pass) where head_dim and the heads allow, else one block
 * of 4 warps per (query row, head) walking keys in tiles of HPD_ATTN_TILE
 * with an online softmax: warp w scores keys w, w+4, ... of a tile
 * (lane-strided sums, then a fixed shuffle tree), and thread d accumulates
 * output dimensions d, d+128, ... over the tile's keys in ascending order.
 * Either way a row's result depends on its position alone, not on the batch
 * or the layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/mma.h"

#define WARPS 4
#define THREADS (WARPS * 32)
#define MAX_HD 1024
#define DIMS_PER_THREAD (MAX_HD / THREADS)

/* A query row: its sequence, batch row, position, and the index of its
 * first split partial (attention's split-KV pass; the splits of a row are
 * consecutive) */
typedef struct {
    uint32_t seq, row, pos, part;
} qrow_t;

/* Split-KV: a row's keys are cut at fixed positions, every SPLIT keys, so a
 * row's splits and their sums depend on its position alone. */
#define SPLIT 512
#define ROW_SPLITS(pos) ((pos) / SPLIT + 1)

typedef struct {
    hpd_kv_layout_t l;
    const float *pool;
    uint32_t member;
    const uint32_t *tables;   /* flattened block tables */
    const uint32_t *table_at; /* per sequence: its first entry in tables */
} dev_kv_t;

__device__ static inline const float *kv_row(const dev_kv_t *kv, uint32_t s, uint32_t which,
                                             uint32_t t, uint32_t h)
{
    const uint32_t page = kv->tables[kv->table_at[s] + t / kv->l.block_size];
    return kv->pool + (size_t)page * hpd_kv_layout_page_elems(&kv->l) +
           hpd_kv_layout_row(&kv->l, kv->member, which, t % kv->l.block_size, h);
}

/* Lists the op's query rows and flattens the block tables (the blocks each
 * sequence's last row reaches; none for a sequence without rows), followed
 * by each sequence's first entry, on the host. */
static hpd_status_t build_batch(const hpd_paged_kv_t *kv, const hpd_seq_t *seqs, uint32_t n_seqs,
                                qrow_t **rows_p, uint32_t *n_rows_p, uint32_t **tables_p,
                                uint32_t *n_entries_p)
{
    const uint32_t B = kv->layout->block_size;
    uint32_t n_rows = 0, n_entries = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        n_rows += seqs[s].n_tokens;
        if (seqs[s].n_tokens > 0)
            n_entries += (seqs[s].start_pos + seqs[s].n_tokens + B - 1) / B;
    }
    qrow_t *rows = (qrow_t *)malloc((size_t)(n_rows ? n_rows : 1) * sizeof(qrow_t));
    uint32_t *tables = (uint32_t *)malloc((size_t)(n_entries + n_seqs + 1) * sizeof(uint32_t));
    if (rows == NULL || tables == NULL) {
        free(rows);
        free(tables);
        return HPD_ERR_NO_MEMORY;
    }
    uint32_t *table_at = tables + n_entries;
    for (uint32_t s = 0, r = 0, e = 0, part = 0; s < n_seqs; s++) {
        const uint32_t nb =
            seqs[s].n_tokens ? (seqs[s].start_pos + seqs[s].n_tokens + B - 1) / B : 0;
        table_at[s] = e;
        for (uint32_t j = 0; j < nb; j++)
            tables[e++] = kv->block_tables[s][j];
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, r++) {
            rows[r] = (qrow_t){s, seqs[s].row + i, seqs[s].start_pos + i, part};
            part += ROW_SPLITS(seqs[s].start_pos + i);
        }
    }
    *rows_p = rows;
    *n_rows_p = n_rows;
    *tables_p = tables;
    *n_entries_p = n_entries;
    return HPD_OK;
}

/* The device view of the paged KV, its tables staged at dtables. */
static dev_kv_t device_kv(const hpd_paged_kv_t *kv, const void *dtables, uint32_t n_entries)
{
    dev_kv_t out;
    out.l = *kv->layout;
    out.pool = (const float *)kv->pool;
    out.member = kv->member;
    out.tables = (const uint32_t *)dtables;
    out.table_at = (const uint32_t *)dtables + n_entries;
    return out;
}

/* ------------------------------------------------------------- kv store */

__global__ void kv_store_kernel(dev_kv_t kv, hpd_view_t k, hpd_view_t v, const qrow_t *rows)
{
    const uint32_t heads = kv.l.n_kv_heads, hd = kv.l.head_dim;
    const qrow_t q = rows[blockIdx.x / heads];
    const uint32_t h = blockIdx.x % heads;
    float *kd = (float *)kv_row(&kv, q.seq, 0, q.pos, h);
    float *vd = (float *)kv_row(&kv, q.seq, 1, q.pos, h);
    const float *ks = k.p + (size_t)q.row * k.ld + (size_t)h * k.hs;
    const float *vs = v.p + (size_t)q.row * v.ld + (size_t)h * v.hs;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        kd[d] = ks[d];
        vd[d] = vs[d];
    }
}

hpd_status_t hpd_cuda_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a)
{
    qrow_t *rows;
    uint32_t *tables, n_rows, n_entries;
    void *drows, *dtables;
    hpd_status_t st;

    if (a->kv.layout->dtype != HPD_DTYPE_F32)
        return HPD_ERR_UNSUPPORTED;
    if ((st = build_batch(&a->kv, a->seqs, a->n_seqs, &rows, &n_rows, &tables, &n_entries)) !=
        HPD_OK)
        return st;
    const hpd_cuda_meta_t m[] = {
        {.host = rows, .bytes = n_rows * sizeof(qrow_t), .dev_p = &drows},
        {.host = tables, .bytes = (n_entries + a->n_seqs) * sizeof(uint32_t), .dev_p = &dtables}};
    st = n_rows > 0 ? hpd_cuda_stage(b, m, 2) : HPD_OK;
    free(rows);
    free(tables);
    if (st != HPD_OK || n_rows == 0)
        return st;
    kv_store_kernel<<<n_rows * a->kv.layout->n_kv_heads, 64, 0, hpd_cuda_ctx(b)->stream>>>(
        device_kv(&a->kv, dtables, n_entries), a->k, a->v, (const qrow_t *)drows);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* ------------------------------------------------------------ attention */

/* The warp's sum, in a fixed order, the same value in every lane. */
__device__ static inline float warp_sum(float x)
{
    for (int o = 16; o > 0; o /= 2)
        x += __shfl_down_sync(0xffffffffu, x, o);
    return __shfl_sync(0xffffffffu, x, 0);
}

__global__ void attention_kernel(dev_kv_t kv, hpd_view_t qv, hpd_view_t ov, uint32_t n_heads,
                                 float scale, const qrow_t *rows)
{
    __shared__ float qs[MAX_HD];
    __shared__ float sc[HPD_ATTN_TILE];
    const uint32_t hd = kv.l.head_dim, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const qrow_t r = rows[blockIdx.x / n_heads];
    const uint32_t h = blockIdx.x % n_heads, kvh = h / (n_heads / kv.l.n_kv_heads);
    const float *q = qv.p + (size_t)r.row * qv.ld + (size_t)h * qv.hs;
    float acc[DIMS_PER_THREAD];
    float m = -INFINITY, sum = 0.0f;

    for (uint32_t d = tid; d < hd; d += THREADS)
        qs[d] = q[d];
#pragma unroll
    for (uint32_t i = 0; i < DIMS_PER_THREAD; i++)
        acc[i] = 0.0f;
    __syncthreads();
    for (uint32_t t0 = 0; t0 <= r.pos; t0 += HPD_ATTN_TILE) {
        const uint32_t t1 = min(t0 + HPD_ATTN_TILE, r.pos + 1);
        for (uint32_t t = t0 + warp; t < t1; t += WARPS) {
            const float *k = kv_row(&kv, r.seq, 0, t, kvh);
            float s = 0.0f;
            for (uint32_t d = lane; d < hd; d += 32)
                s += qs[d] * k[d];
            s = warp_sum(s);
            if (lane == 0)
                sc[t - t0] = s * scale;
        }
        __syncthreads();
        float tile_max = -INFINITY;
        for (uint32_t t = t0; t < t1; t++)
            tile_max = fmaxf(tile_max, sc[t - t0]);
        const float m_new = fmaxf(m, tile_max), alpha = expf(m - m_new);
        sum *= alpha;
#pragma unroll
        for (uint32_t i = 0; i < DIMS_PER_THREAD; i++)
            acc[i] *= alpha;
        for (uint32_t t = t0; t < t1; t++) {
            const float p = expf(sc[t - t0] - m_new);
            const float *v = kv_row(&kv, r.seq, 1, t, kvh);
            sum += p;
#pragma unroll
            for (uint32_t i = 0; i < DIMS_PER_THREAD; i++)
                if (tid + i * THREADS < hd)
                    acc[i] += p * v[tid + i * THREADS];
        }
        m = m_new;
        __syncthreads(); /* sc is rewritten by the next tile */
    }
    const float inv = 1.0f / sum;
    float *o = ov.p + (size_t)r.row * ov.ld + (size_t)h * ov.hs;
#pragma unroll
    for (uint32_t i = 0; i < DIMS_PER_THREAD; i++)
        if (tid + i * THREADS < hd)
            o[tid + i * THREADS] = acc[i] * inv;
}

/* ------------------------------------------------------- split-KV pass */

#define KT 32      /* keys per tile: one per lane */
#define GMAX 16    /* query heads per KV head */
#define SPLIT_HD 256
#define RT_GROUP 8 /* query rows per block in a prefill (heads per KV head <= 8) */

/* A block's query rows: consecutive rows of one sequence at consecutive
 * positions, [first, first + count) of the launch's rows; conv: the first
 * tile of their sequence in the op's bf16 copy of K and V (a prompt's block
 * on tensor cores). */
typedef struct {
    uint32_t first, count, conv;
} row_group_t;

/* Loads this thread's vectors (NT threads) of a tile of n4 16-byte vectors
 * (rows of hd4) into registers, every load issued before any is used. */
template <uint32_t NT>
__device__ static inline void tile_load(float4 *vr, const float *const *rowp, uint32_t n4,
                                        uint32_t hd4)
{
#pragma unroll
    for (uint32_t u = 0; u < KT * SPLIT_HD / 4 / NT; u++) {
        const uint32_t i = threadIdx.x + u * NT;
        if (i < n4)
            vr[u] = ((const float4 *)rowp[i / hd4])[i % hd4];
    }
}

/* Stores what tile_load loaded into the shared tile (row stride ld). */
template <uint32_t NT>
__device__ static inline void tile_store(float *tile, uint32_t ld, const float4 *vr, uint32_t n4,
                                         uint32_t hd4)
{
#pragma unroll
    for (uint32_t u = 0; u < KT * SPLIT_HD / 4 / NT; u++) {
        const uint32_t i = threadIdx.x + u * NT;
        if (i < n4)
            ((float4 *)(tile + (i / hd4) * ld))[i % hd4] = vr[u];
    }
}

/* Copies a tile of n4 16-byte vectors (rows of hd4, from the row pointers
 * rowp) into the shared tile (row stride ld) by cp.async: the copies go on
 * while the block works on the tile before (hpd_cp_async_commit and _wait
 * around it). */
template <uint32_t NT>
__device__ static inline void tile_copy_async(float *tile, uint32_t ld, const float *const *rowp,
                                              uint32_t n4, uint32_t hd4)
{
    for (uint32_t i = threadIdx.x; i < n4; i += NT)
        hpd_cp_async16(tile + (i / hd4) * ld + (i % hd4) * 4, rowp[i / hd4] + (i % hd4) * 4, 16);
}

/* A split block's keys: from t_begin (its split's first) to t_stop (its
 * highest row's last, within the split); the rows' sequence is last's. */
typedef struct {
    qrow_t last;
    uint32_t t_begin, t_stop;
} split_span_t;

__device__ static inline split_span_t split_span(const qrow_t *rows, row_group_t grp)
{
    const qrow_t last = rows[grp.first + grp.count - 1]; /* the block's highest position */
    const uint32_t t_begin = blockIdx.y * SPLIT;
    return split_span_t{last, t_begin, min(t_begin + SPLIT, last.pos + 1)};
}

/* A split block's start: its keys' K and V page rows looked up once, and
 * each of its query rows' end of keys in the split. */
template <uint32_t NT>
__device__ static inline void split_rows(const dev_kv_t &kv, const qrow_t *rows,
                                         row_group_t grp, uint32_t kvh, const split_span_t &sp,
                                         const float **krow, const float **vrow, uint32_t *tend)
{
    for (uint32_t t = sp.t_begin + threadIdx.x; t < sp.t_stop; t += NT) {
        krow[t - sp.t_begin] = kv_row(&kv, sp.last.seq, 0, t, kvh);
        vrow[t - sp.t_begin] = kv_row(&kv, sp.last.seq, 1, t, kvh);
    }
    if (threadIdx.x < grp.count)
        tend[threadIdx.x] = min(sp.t_begin + SPLIT, rows[grp.first + threadIdx.x].pos + 1);
}

/* A row of one split (a position below SPLIT) needs no combine: the split
 * kernels write its output with the combine pass's operations for one
 * split (M = m, so expf(m - M) = 1): out = fmaf(o, 1, 0) (1 / fmaf(l, 1,
 * 0)), the same bits, without the partials' trip through memory. */
__device__ static inline float one_split_inv(float l)
{
    return 1.0f / fmaf(l, 1.0f, 0.0f);
}
__device__ static inline float one_split_out(float o, float inv)
{
    return __fmul_rn(fmaf(o, 1.0f, 0.0f), inv);
}

/* Pairs (query row, head) a block may hold: RT rows of up to GMAX heads
 * alone, of up to 8 in groups. */
#define PAIRS(RT) ((RT) == 1 ? GMAX : (RT) * (GMAX / 2))

/* One block of NT threads per (group of RT query rows, KV head, split of
 * SPLIT keys): the KV head's K and V rows of the split are read once for
 * every query head of its group and every row of the block (one row in a
 * decode step, up to RT consecutive rows of a prompt). Per tile of KT keys
 * (the split's page rows looked up once; every load of a tile in flight at
 * once, V's during K's scores), for each pair (row, head) and each key the
 * row may see: lane l scores key l (ascending dimensions, fused
 * multiply-adds), the pair's thread keeps its running max and sum and turns
 * the scores into probabilities, and thread t accumulates dimension t (and
 * t + NT) over the keys in order. A pair's arithmetic is the same whatever
 * the block's rows, so a row's result depends on its position alone. The
 * split's unnormalised output, max and sum go to the scratch; the combine
 * pass merges a row's splits in ascending order. */
template <uint32_t RT, uint32_t NT>
__global__ void __launch_bounds__(NT, RT == 1 ? 2 : 1) /* decode: two blocks per SM */
    attention_split_kernel(dev_kv_t kv, hpd_view_t qv, uint32_t n_heads, float scale,
                           const qrow_t *rows, const row_group_t *groups, uint32_t part_base,
                           float *o_part, float *ml_part, hpd_view_t ov)
{
    constexpr uint32_t NW = NT / 32, P = PAIRS(RT), PPW = P / NW, DPTN = SPLIT_HD / NT;
    extern __shared__ float4 sm4[];
    const row_group_t grp = groups[blockIdx.x];
    const uint32_t hd = kv.l.head_dim, G = n_heads / kv.l.n_kv_heads, kvh = blockIdx.z;
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32, ld = hd + 4;
    const split_span_t sp = split_span(rows, grp);
    if (sp.t_begin > sp.last.pos)
        return; /* none of the rows reaches this split: the whole block leaves */
    const uint32_t t_begin = sp.t_begin, t_stop = sp.t_stop, n_pairs = grp.count * G;
    const float **krow = (const float **)sm4, **vrow = krow + SPLIT; /* [SPLIT] each */
    float *qs = (float *)(vrow + SPLIT);   /* [RT * G][ld] */
    float *kvs = qs + (size_t)RT * G * ld; /* [2][KT][ld]: a tile's K, then its V */
    float *ps = kvs + (size_t)2 * KT * ld; /* [P][KT]: scores, then probabilities */
    float *alpha = ps + P * KT;            /* [P] */
    uint32_t *nkp = (uint32_t *)(alpha + P); /* [P]: keys of this tile the pair sees */
    uint32_t *tend = nkp + P;                /* [RT]: a row's end of keys in the split */
    float m = -INFINITY, l = 0.0f; /* thread p < n_pairs: pair p's */
    float acc[P][DPTN];
    float4 vr[KT * SPLIT_HD / 4 / NT]; /* the next V tile, loaded while K's scores are computed */

    split_rows<NT>(kv, rows, grp, kvh, sp, krow, vrow, tend);
    for (uint32_t i = tid; i < n_pairs * hd; i += NT) {
        const uint32_t pr = i / hd, d = i % hd;
        qs[pr * ld + d] = qv.p[(size_t)rows[grp.first + pr / G].row * qv.ld +
                               (size_t)(kvh * G + pr % G) * qv.hs + d];
    }
#pragma unroll
    for (uint32_t pr = 0; pr < P; pr++)
#pragma unroll
        for (uint32_t k = 0; k < DPTN; k++)
            acc[pr][k] = 0.0f;
    const uint32_t hd4 = hd / 4;
    __syncthreads(); /* row pointers and ends set */
    tile_copy_async<NT>(kvs, ld, krow, min(KT, t_stop - t_begin) * hd4, hd4);
    hpd_cp_async_commit();
    for (uint32_t t0 = t_begin, it = 0; t0 < t_stop; t0 += KT, it++) {
        const uint32_t nk = min(KT, t_stop - t0), n4 = nk * hd4;
        /* this tile's K, copied during the last tile's work; the next
         * tile's K goes to the other buffer, which held the last tile's V */
        float *cur = kvs + (size_t)(it % 2) * KT * ld;
        float *nxt = kvs + (size_t)(1 - it % 2) * KT * ld;
        hpd_cp_async_wait<0>();
        __syncthreads(); /* every thread's copies of K landed; the last tile's V and ps read */
        if (t0 + KT < t_stop)
            tile_copy_async<NT>(nxt, ld, krow + (t0 + KT - t_begin),
                                min(KT, t_stop - t0 - KT) * hd4, hd4);
        hpd_cp_async_commit();
        tile_load<NT>(vr, vrow + (t0 - t_begin), n4, hd4); /* in flight during the scores */
        if (lane < nk) {
            /* the warp's pairs at once: each k vector loaded once for all of
             * them, their sums independent chains (each the same as alone;
             * a pair past the block's reads the last pair's q, unstored) */
            const float4 *k4 = (const float4 *)(cur + lane * ld);
            const float4 *q4 = (const float4 *)qs;
            float s[PPW];
            uint32_t qo[PPW]; /* the pairs' q rows, in float4 */
#pragma unroll
            for (uint32_t j = 0; j < PPW; j++) {
                s[j] = 0.0f;
                qo[j] = min(warp + j * NW, n_pairs - 1) * (ld / 4);
            }
            for (uint32_t c = 0; c < hd4; c++) {
                const float4 kk = k4[c];
#pragma unroll
                for (uint32_t j = 0; j < PPW; j++) {
                    const float4 qq = q4[qo[j] + c];
                    s[j] = fmaf(qq.x, kk.x, s[j]);
                    s[j] = fmaf(qq.y, kk.y, s[j]);
                    s[j] = fmaf(qq.z, kk.z, s[j]);
                    s[j] = fmaf(qq.w, kk.w, s[j]);
                }
            }
#pragma unroll
            for (uint32_t j = 0; j < PPW; j++) {
                const uint32_t pr = warp + j * NW;
                if (pr < n_pairs && t0 + lane < tend[pr / G])
                    ps[pr * KT + lane] = __fmul_rn(s[j], scale);
            }
        }
        __syncthreads(); /* scores written, K no longer read */
        if (tid < n_pairs) {
            const uint32_t te = tend[tid / G], nkr = t0 < te ? min(KT, te - t0) : 0;
            if (nkr > 0) {
                float tmax = -INFINITY;
                for (uint32_t t = 0; t < nkr; t++)
                    tmax = fmaxf(tmax, ps[tid * KT + t]);
                const float m_new = fmaxf(m, tmax), al = expf(m - m_new);
                l = __fmul_rn(l, al);
                for (uint32_t t = 0; t < nkr; t++) {
                    const float p = expf(ps[tid * KT + t] - m_new);
                    ps[tid * KT + t] = p;
                    l = __fadd_rn(l, p);
                }
                m = m_new;
                alpha[tid] = al;
            }
            nkp[tid] = nkr;
        }
        tile_store<NT>(cur, ld, vr, n4, hd4); /* V over this tile's K, read out above */
        __syncthreads();
#pragma unroll
        for (uint32_t pr = 0; pr < P; pr++)
            if (pr < n_pairs && nkp[pr] > 0)
#pragma unroll
                for (uint32_t k = 0; k < DPTN; k++)
                    acc[pr][k] = __fmul_rn(acc[pr][k], alpha[pr]);
        /* four keys' probabilities in one load where the pair sees all four
         * (every pair of a row alone, which sees the whole tile), the same
         * products in the same order; a prompt's pair then takes its last
         * keys one at a time */
        uint32_t t = 0;
        for (; t + 4 <= nk; t += 4) {
#pragma unroll
            for (uint32_t k = 0; k < DPTN; k++) {
                const uint32_t d = tid + k * NT;
                if (d < hd) {
                    const float v0 = cur[t * ld + d], v1 = cur[(t + 1) * ld + d];
                    const float v2 = cur[(t + 2) * ld + d], v3 = cur[(t + 3) * ld + d];
#pragma unroll
                    for (uint32_t pr = 0; pr < P; pr++)
                        if (pr < n_pairs && (RT == 1 || t + 4 <= nkp[pr])) {
                            const float4 p4 = *(const float4 *)(ps + pr * KT + t);
                            float x = fmaf(p4.x, v0, acc[pr][k]);
                            x = fmaf(p4.y, v1, x);
                            x = fmaf(p4.z, v2, x);
                            acc[pr][k] = fmaf(p4.w, v3, x);
                        } else if (pr < n_pairs) {
                            for (uint32_t u = t; u < nkp[pr]; u++)
                                acc[pr][k] = fmaf(ps[pr * KT + u], cur[u * ld + d], acc[pr][k]);
                        }
                }
            }
        }
        for (; t < nk; t++) {
#pragma unroll
            for (uint32_t k = 0; k < DPTN; k++) {
                const uint32_t d = tid + k * NT;
                if (d < hd) {
                    const float v = cur[t * ld + d];
#pragma unroll
                    for (uint32_t pr = 0; pr < P; pr++)
                        if (pr < n_pairs && (RT == 1 || t < nkp[pr]))
                            acc[pr][k] = fmaf(ps[pr * KT + t], v, acc[pr][k]);
                }
            }
        }
    }
    /* the rows that reach this split write their partials, a row of one
     * split its output (each pair's 1 / sum through alpha) */
    __syncthreads(); /* alpha read */
    if (tid < n_pairs)
        alpha[tid] = one_split_inv(l);
    __syncthreads();
#pragma unroll
    for (uint32_t pr = 0; pr < P; pr++)
        if (pr < n_pairs) {
            const qrow_t r = rows[grp.first + pr / G];
            if (r.pos < t_begin)
                continue; /* the row does not reach this split */
            const bool one = r.pos < SPLIT;
            const size_t at = (size_t)(r.part - part_base + blockIdx.y) * n_heads + kvh * G +
                              pr % G;
            float *o = one ? ov.p + (size_t)r.row * ov.ld + (size_t)(kvh * G + pr % G) * ov.hs
                           : o_part + at * hd;
            const float inv = alpha[pr];
#pragma unroll
            for (uint32_t k = 0; k < DPTN; k++)
                if (tid + k * NT < hd)
                    o[tid + k * NT] = one ? one_split_out(acc[pr][k], inv) : acc[pr][k];
            if (!one && tid == pr) {
                ml_part[at * 2] = m;
                ml_part[at * 2 + 1] = l;
            }
        }
}

/* ------------------------------------------- split-KV on tensor cores */

#define TC_PAIRS 128    /* pairs (row, head) of a prompt's block: 8 warps of 16 */
#ifndef TC_COPY_BYTES /* a test may set a smaller bound, to read the pool */
#define TC_COPY_BYTES ((size_t)256 << 20) /* the most the bf16 copy of K and V may take */
#endif

/* A 32-key tile of a sequence's K and V to copy in bf16 for the prompt
 * blocks (kv_bf16_kernel); tile i of the copy is the op's i-th. */
typedef struct {
    uint32_t seq, t0, n_keys; /* n_keys: the sequence's keys, zeros past them */
} copy_tile_t;

/* The bf16 copy: per KV head and tile, K's rows [KT][hd], then V's (a
 * tile of 2 KT hd bf16); n_all tiles per head. */
typedef struct {
    const uint16_t *p;
    uint32_t n_all;
} kv_copy_t;

/* One block per (tile, KV head): K and V rounded to bf16 as the decode
 * blocks round them (hpd_bf16_rn). */
__global__ void kv_bf16_kernel(dev_kv_t kv, const copy_tile_t *tiles, uint32_t n_all,
                               uint16_t *out)
{
    const copy_tile_t ct = tiles[blockIdx.x];
    const uint32_t hd = kv.l.head_dim, half = hd / 2, kvh = blockIdx.y;
    uint16_t *ko = out + ((size_t)kvh * n_all + blockIdx.x) * 2 * KT * hd, *vo = ko + KT * hd;
    for (uint32_t i = threadIdx.x; i < KT * half; i += blockDim.x) {
        const uint32_t key = i / half, d = 2 * (i % half), t = ct.t0 + key;
        float2 kk = make_float2(0.0f, 0.0f), vv = kk;
        if (t < ct.n_keys) {
            kk = *(const float2 *)(kv_row(&kv, ct.seq, 0, t, kvh) + d);
            vv = *(const float2 *)(kv_row(&kv, ct.seq, 1, t, kvh) + d);
        }
        *(uint32_t *)(ko + key * hd + d) = hpd_bf16x2(kk.x, kk.y);
        *(uint32_t *)(vo + key * hd + d) = hpd_bf16x2(vv.x, vv.y);
    }
}

/* A prompt block's tile of the bf16 copy (2 KT hd bf16 at src) into shared
 * memory by cp.async: K's rows at ks, V's at vs (each [KT][hd + 8]);
 * committed as one group. */
template <uint32_t NT>
__device__ static inline void tc_copy_tile(uint16_t *ks, uint16_t *vs, const uint16_t *src,
                                           uint32_t hd)
{
    const uint32_t kc = hd / 8, ldh = hd + 8; /* 16-byte pieces of a row */
    for (uint32_t c = threadIdx.x; c < 2 * KT * kc; c += NT) {
        const uint32_t r = c / kc % KT, at = r * ldh + c % kc * 8;
        hpd_cp_async16(c < KT * kc ? ks + at : vs + at, src + c * 8, 16);
    }
    hpd_cp_async_commit();
}

/* A tile from the pool: the nk keys' K and V (page rows krow, vrow)
 * rounded to bf16, their rows at ks and vs, zeros past nk. A
 * thread's loads are issued LB pairs at a time before their stores (a store
 * waiting on each load before the next was issued left one in flight). */
template <uint32_t NT, uint32_t LB>
__device__ static inline void tc_load_tile(uint16_t *ks, uint16_t *vs, const float *const *krow,
                                           const float *const *vrow, uint32_t nk, uint32_t hd)
{
    const uint32_t half = hd / 2, ldh = hd + 8;
    for (uint32_t i0 = threadIdx.x; i0 < KT * half; i0 += LB * NT) {
        float2 kk[LB], vv[LB];
#pragma unroll
        for (uint32_t u = 0; u < LB; u++) {
            const uint32_t i = i0 + u * NT, key = i / half, d = 2 * (i % half);
            kk[u] = vv[u] = make_float2(0.0f, 0.0f);
            if (i < KT * half && key < nk) {
                kk[u] = *(const float2 *)(krow[key] + d);
                vv[u] = *(const float2 *)(vrow[key] + d);
            }
        }
#pragma unroll
        for (uint32_t u = 0; u < LB; u++) {
            const uint32_t i = i0 + u * NT, key = i / half, d = 2 * (i % half);
            if (i < KT * half) {
                *(uint32_t *)(ks + key * ldh + d) = hpd_bf16x2(kk[u].x, kk[u].y);
                *(uint32_t *)(vs + key * ldh + d) = hpd_bf16x2(vv[u].x, vv[u].y);
            }
        }
    }
}

/* A block's pairs (row, head), m-tiles of 16 pairs per warp: MT tiles of
 * pairs, each warp of a tile taking every DW-th 8 dimensions of the output.
 * <1, 4>: a decode row (up to 16 heads), 4 warps; <8, 1>: a prompt's block of
 * up to TC_PAIRS pairs, 8 warps, its K and V from the op's bf16 copy (COPY)
 * or, where the op has none, from the pool. */
#define TC_P(MT) ((MT) * 16)

/* The split pass of device cuda-bf16 on tensor cores (FlashAttention-2's
 * register layout), the same blocks, splits, partials and combine pass as
 * attention_split_kernel: q, k and v rounded to bf16. Warp w holds m-tile
 * w / DW of the block's pairs (16 pairs) and the output's 8-dimension tiles
 * w % DW, w % DW + DW, ... Per tile of KT keys: the scores S = Q K^T of
 * its 16 pairs by mma.sync over head_dim in steps of 16 (an element of S is
 * its pair's q row against its key's k row alone; every warp of the m-tile
 * computes them), scaled; each pair's max over the keys it may see by a
 * quad's shuffles, its probabilities expf(s - m) (zero past its keys), their
 * sum (each lane's 8 in key order, then lanes xor 1, xor 2) added to its
 * running sum times the correction, all fp32; the output tiles scaled by
 * the correction, then + P V by mma.sync in two steps of 16 keys, P rounded
 * to bf16 from the registers that hold it. A pair's arithmetic depends on
 * its own q, keys and position alone: a row gives the same bits in a decode
 * block or in a prompt's block of many rows, in any batch. A decode block
 * rounds its K and V to bf16 as it loads them from the pool; a prompt's
 * block copies them from the op's bf16 copy (kv_bf16_kernel), the next tile
 * by cp.async while it works on this one, or where there is no copy loads
 * them from the pool as a decode block does. */
template <uint32_t MT, uint32_t DW, bool COPY>
__global__ void __launch_bounds__(MT * DW * 32)
    attention_split_tc_kernel(dev_kv_t kv, hpd_view_t qv, uint32_t n_heads, float scale,
                              const qrow_t *rows, const row_group_t *groups, uint32_t part_base,
                              float *o_part, float *ml_part, kv_copy_t kvc, hpd_view_t ov)
{
    constexpr uint32_t NT = MT * DW * 32, P = TC_P(MT), MAXN = SPLIT_HD / 8 / DW;
    constexpr uint32_t NBUF = COPY ? 2 : 1; /* the copy's tiles double-buffered */
    static_assert(!COPY || MT > 1, "decode blocks read the pool");
    static_assert(DW == 1 || DW == 4, "a decode block's 4 warps score a tile of 8 keys each");
    extern __shared__ float4 sm4[];
    const row_group_t grp = groups[blockIdx.x];
    const uint32_t hd = kv.l.head_dim, G = n_heads / kv.l.n_kv_heads, kvh = blockIdx.z;
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const uint32_t mt = warp / DW, dw = warp % DW, ldh = hd + 8, half = hd / 2, n_dt = hd / 8;
    const split_span_t sp = split_span(rows, grp);
    if (sp.t_begin > sp.last.pos)
        return; /* none of the rows reaches this split: the whole block leaves */
    const uint32_t t_begin = sp.t_begin, t_stop = sp.t_stop, n_pairs = grp.count * G;
    const float **krow = (const float **)sm4, **vrow = krow + (COPY ? 0 : SPLIT);
    uint32_t *tend = (uint32_t *)(vrow + (COPY ? 0 : SPLIT)); /* [P]: a row's end of keys */
    uint16_t *qs = (uint16_t *)(tend + P);                     /* [P][ldh] */
    uint16_t *ks = qs + (size_t)P * ldh;                       /* [NBUF][KT][ldh] */
    uint16_t *vs = ks + (size_t)NBUF * KT * ldh;               /* [NBUF][KT][ldh] */
    float *ss = (float *)(vs + (size_t)NBUF * KT * ldh);       /* [16][KT]: a decode's S */
    const uint16_t *src = COPY ? kvc.p + ((size_t)kvh * kvc.n_all + grp.conv + t_begin / KT) *
                                             2 * KT * hd
                               : nullptr;

    if (COPY) {
        for (uint32_t i = tid; i < grp.count; i += NT)
            tend[i] = min(t_begin + SPLIT, rows[grp.first + i].pos + 1);
        tc_copy_tile<NT>(ks, vs, src, hd);
    } else
        split_rows<NT>(kv, rows, grp, kvh, sp, krow, vrow, tend);
    for (uint32_t i = tid; i < P * half; i += NT) {
        const uint32_t pr = i / half, d = 2 * (i % half);
        uint32_t w = 0;
        if (pr < n_pairs) {
            const float *q = qv.p + (size_t)rows[grp.first + pr / G].row * qv.ld +
                             (size_t)(kvh * G + pr % G) * qv.hs + d;
            w = hpd_bf16x2(q[0], q[1]);
        }
        *(uint32_t *)(qs + pr * ldh + d) = w;
    }
    __syncthreads(); /* ends, pointers and q set */
    const uint32_t pr0 = mt * 16 + g, pr1 = pr0 + 8; /* this lane's pairs */
    const uint32_t te[2] = {pr0 < n_pairs ? tend[pr0 / G] : 0, pr1 < n_pairs ? tend[pr1 / G] : 0};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float acc[MAXN][4];
#pragma unroll
    for (uint32_t j = 0; j < MAXN; j++)
#pragma unroll
        for (uint32_t r = 0; r < 4; r++)
            acc[j][r] = 0.0f;
    /* ldmatrix rows: Q's a fragments (rows lane % 8 + 8 (lane / 8 % 2), dims
     * + 8 (lane / 16)), K's b fragments of two 8-key tiles (keys lane % 8 + 8
     * (lane / 16), dims + 8 (lane / 8 % 2)), V's of 32 keys x 8 dimensions
     * transposed by ldmatrix .trans (key lane) */
    const uint16_t *qa = qs + (mt * 16 + lane % 8 + 8 * (lane / 8 % 2)) * ldh + 8 * (lane / 16);
    const uint32_t ka = (lane % 8 + 8 * (lane / 16)) * ldh + 8 * (lane / 8 % 2);
    const uint32_t va = lane * ldh;
    for (uint32_t i = 0, t0 = t_begin; t0 < t_stop; i++, t0 += KT) {
        const uint16_t *kb = ks, *vb = vs;
        if (COPY) {
            hpd_cp_async_wait<0>();
            __syncthreads(); /* tile i landed for every thread; tile i - 1's buffer read */
            kb += (i % 2) * KT * ldh, vb += (i % 2) * KT * ldh;
            if (t0 + KT < t_stop)
                tc_copy_tile<NT>(ks + (i + 1) % 2 * KT * ldh, vs + (i + 1) % 2 * KT * ldh,
                                 src + (size_t)(i + 1) * 2 * KT * hd, hd);
        } else {
            __syncthreads(); /* the last tile read */
            /* 4 loads in flight in a prompt's block, whose registers would
             * otherwise spill */
            tc_load_tile<NT, MT == 1 ? 8 : 4>(ks, vs, krow + (t0 - t_begin),
                                              vrow + (t0 - t_begin), min(KT, t_stop - t0), hd);
            __syncthreads();
        }
        /* scores: 16 pairs x 4 tiles of 8 keys */
        float s[4][4];
#pragma unroll
        for (uint32_t n = 0; n < 4; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if (DW == 1)
            for (uint32_t d0 = 0; d0 < hd; d0 += 16) {
                uint32_t a[4], b0[4], b1[4];
                hpd_ldmatrix_x4(a, qa + d0);
                hpd_ldmatrix_x4(b0, kb + ka + d0);
                hpd_ldmatrix_x4(b1, kb + ka + 16 * ldh + d0);
                hpd_mma_bf16_16816(s[0], a, b0);
                hpd_mma_bf16_16816(s[1], a, b0 + 2);
                hpd_mma_bf16_16816(s[2], a, b1);
                hpd_mma_bf16_16816(s[3], a, b1 + 2);
            }
        else { /* a decode block: warp dw scores keys 8 dw to 8 dw + 7 (the same
                * products), and every warp reads the 16 x 32 scores back */
            const uint16_t *kd = kb + (8 * dw + lane % 8) * ldh + 8 * (lane / 8 % 2);
            for (uint32_t d0 = 0; d0 < hd; d0 += 16) {
                uint32_t a[4], b[4];
                hpd_ldmatrix_x4(a, qa + d0);
                hpd_ldmatrix_x4(b, kd + d0); /* lanes 16-31 repeat 0-15's rows */
                hpd_mma_bf16_16816(s[0], a, b);
            }
#pragma unroll
            for (uint32_t r = 0; r < 4; r++)
                ss[(g + 8 * (r / 2)) * KT + 8 * dw + 2 * t4 + r % 2] = s[0][r];
            __syncthreads();
#pragma unroll
            for (uint32_t n = 0; n < 4; n++)
#pragma unroll
                for (uint32_t r = 0; r < 4; r++)
                    s[n][r] = ss[(g + 8 * (r / 2)) * KT + 8 * n + 2 * t4 + r % 2];
        }
        /* the pairs' softmax: element (n, 2 r + c) is pair pr_r, key t0 + 8 n
         * + 2 t4 + c */
        float al[2];
#pragma unroll
        for (uint32_t r = 0; r < 2; r++) {
            float tmax = -INFINITY;
#pragma unroll
            for (uint32_t n = 0; n < 4; n++)
#pragma unroll
                for (uint32_t c = 0; c < 2; c++) {
                    s[n][2 * r + c] = __fmul_rn(s[n][2 * r + c], scale);
                    if (t0 + 8 * n + 2 * t4 + c < te[r])
                        tmax = fmaxf(tmax, s[n][2 * r + c]);
                }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
            const bool sees = t0 < te[r]; /* else its output stays as it is */
            const float mn = sees ? fmaxf(m[r], tmax) : m[r];
            al[r] = sees ? expf(m[r] - mn) : 1.0f;
            float ts = 0.0f;
#pragma unroll
            for (uint32_t n = 0; n < 4; n++)
#pragma unroll
                for (uint32_t c = 0; c < 2; c++) {
                    const float p = t0 + 8 * n + 2 * t4 + c < te[r]
                                        ? expf(s[n][2 * r + c] - mn)
                                        : 0.0f;
                    s[n][2 * r + c] = p;
                    ts = __fadd_rn(ts, p);
                }
            ts = __fadd_rn(ts, __shfl_xor_sync(0xffffffffu, ts, 1));
            ts = __fadd_rn(ts, __shfl_xor_sync(0xffffffffu, ts, 2));
            if (sees)
                l[r] = __fadd_rn(__fmul_rn(l[r], al[r]), ts), m[r] = mn;
        }
        /* P as the a fragments of two 16-key steps: S's c fragments of key
         * tiles 2 k and 2 k + 1 */
        uint32_t pa[2][4];
#pragma unroll
        for (uint32_t k = 0; k < 2; k++) {
            pa[k][0] = hpd_bf16x2(s[2 * k][0], s[2 * k][1]);
            pa[k][1] = hpd_bf16x2(s[2 * k][2], s[2 * k][3]);
            pa[k][2] = hpd_bf16x2(s[2 * k + 1][0], s[2 * k + 1][1]);
            pa[k][3] = hpd_bf16x2(s[2 * k + 1][2], s[2 * k + 1][3]);
        }
#pragma unroll
        for (uint32_t j = 0; j < MAXN; j++) {
            const uint32_t dt = dw + j * DW;
            if (dt >= n_dt)
                break;
            uint32_t bv[4];
            hpd_ldmatrix_x4_trans(bv, vb + va + dt * 8);
            acc[j][0] = __fmul_rn(acc[j][0], al[0]), acc[j][1] = __fmul_rn(acc[j][1], al[0]);
            acc[j][2] = __fmul_rn(acc[j][2], al[1]), acc[j][3] = __fmul_rn(acc[j][3], al[1]);
            hpd_mma_bf16_16816(acc[j], pa[0], bv);
            hpd_mma_bf16_16816(acc[j], pa[1], bv + 2);
        }
    }
    /* the rows that reach this split write their partials, a row of one
     * split its output */
    const float inv[2] = {one_split_inv(l[0]), one_split_inv(l[1])};
#pragma unroll
    for (uint32_t j = 0; j < MAXN; j++) {
        const uint32_t dt = dw + j * DW;
        if (dt >= n_dt)
            break;
#pragma unroll
        for (uint32_t r = 0; r < 4; r++) {
            const uint32_t pr = r < 2 ? pr0 : pr1, d = dt * 8 + 2 * t4 + r % 2;
            if (pr < n_pairs) {
                const qrow_t q = rows[grp.first + pr / G];
                if (q.pos < t_begin)
                    continue; /* the row does not reach this split */
                if (q.pos < SPLIT)
                    ov.p[(size_t)q.row * ov.ld + (size_t)(kvh * G + pr % G) * ov.hs + d] =
                        one_split_out(acc[j][r], inv[r / 2]);
                else {
                    const size_t at = (size_t)(q.part - part_base + blockIdx.y) * n_heads +
                                      kvh * G + pr % G;
                    o_part[at * hd + d] = acc[j][r];
                }
            }
        }
    }
    if (dw == 0 && t4 == 0)
        for (uint32_t r = 0; r < 2; r++) {
            const uint32_t pr = r ? pr1 : pr0;
            if (pr < n_pairs) {
                const qrow_t q = rows[grp.first + pr / G];
                if (q.pos >= SPLIT && q.pos >= t_begin) {
                    const size_t at = (size_t)(q.part - part_base + blockIdx.y) * n_heads +
                                      kvh * G + pr % G;
                    ml_part[at * 2] = m[r];
                    ml_part[at * 2 + 1] = l[r];
                }
            }
        }
}

/* One block per (query row, head): the row's splits merged in ascending
 * order, out = sum_s o_s exp(m_s - M) / sum_s l_s exp(m_s - M) (a row of
 * one split was written by its split kernel: one_split_out). */
__global__ void attention_combine_kernel(hpd_view_t ov, uint32_t n_heads, uint32_t hd,
                                         const qrow_t *rows, uint32_t part_base,
                                         const float *o_part, const float *ml_part)
{
    const qrow_t r = rows[blockIdx.x / n_heads];
    const uint32_t h = blockIdx.x % n_heads, n = ROW_SPLITS(r.pos);
    if (n == 1)
        return;
    const size_t p0 = (size_t)(r.part - part_base) * n_heads + h;
    float M = -INFINITY, L = 0.0f;
    for (uint32_t s = 0; s < n; s++)
        M = fmaxf(M, ml_part[(p0 + (size_t)s * n_heads) * 2]);
    for (uint32_t s = 0; s < n; s++) {
        const float *ml = ml_part + (p0 + (size_t)s * n_heads) * 2;
        L = fmaf(ml[1], expf(ml[0] - M), L);
    }
    const float inv = 1.0f / L;
    float *o = ov.p + (size_t)r.row * ov.ld + (size_t)h * ov.hs;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t s = 0; s < n; s++) {
            const size_t p = p0 + (size_t)s * n_heads;
            acc = fmaf(o_part[p * hd + d], expf(ml_part[p * 2] - M), acc);
        }
        o[d] = __fmul_rn(acc, inv);
    }
}

/* Scratch the split pass may use at once: rows are taken in groups whose
 * partials fit (a single row always goes). */
#ifndef SPLIT_SCRATCH_BYTES /* a test may set a smaller bound, to take many launches */
#define SPLIT_SCRATCH_BYTES ((size_t)64 << 20)
#endif

/* Shared memory of the split kernel for RT rows of G heads of head_dim hd. */
static size_t split_smem(uint32_t RT, uint32_t G, uint32_t hd)
{
    const size_t P = PAIRS(RT);
    return ((size_t)(RT * G + 2 * KT) * (hd + 4) + P * KT + P) * sizeof(float) +
           (P + RT) * sizeof(uint32_t) + 2 * SPLIT * sizeof(float *);
}

/* Shared memory of the tensor-core split kernel <MT, MT == 1 ? 4 : 1, copy>
 * for head_dim hd. */
static size_t split_tc_smem(uint32_t MT, uint32_t hd, bool copy)
{
    const size_t P = TC_P(MT), nbuf = copy ? 2 : 1;
    return (copy ? 0 : 2 * SPLIT * sizeof(float *)) + (MT > 1 ? 0 : 16 * KT * sizeof(float)) +
           P * sizeof(uint32_t) +
           (P * (hd + 8) + nbuf * 2 * (size_t)KT * (hd + 8)) *
               sizeof(uint16_t);
}

/* A launch of the fp32 split kernel */
template <uint32_t RT, uint32_t NT>
static hpd_status_t split_launch(hpd_cuda_ctx_t *c, dim3 grid, size_t smem,
                                 const hpd_attention_args_t *a, const dev_kv_t *kv,
                                 const qrow_t *rows, const row_group_t *groups, uint32_t base,
                                 float *o_part, float *ml_part)
{
    (void)smem; /* opted in at the backend's creation: hpd_cuda_attention_init */
    attention_split_kernel<RT, NT><<<grid, NT, smem, c->stream>>>(
        *kv, a->q, a->n_heads, a->scale, rows, groups, base, o_part, ml_part, a->out);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* A launch of the tensor-core split kernel <MT, DW, COPY> */
template <uint32_t MT, uint32_t DW, bool COPY>
static hpd_status_t split_tc_launch(hpd_cuda_ctx_t *c, dim3 grid, const hpd_attention_args_t *a,
                                    const dev_kv_t *kv, const qrow_t *rows,
                                    const row_group_t *groups, uint32_t base, float *o_part,
                                    float *ml_part, kv_copy_t kvc)
{
    /* (opted in at the backend's creation: hpd_cuda_attention_init) */
    const size_t smem = split_tc_smem(MT, a->kv.layout->head_dim, COPY);
    attention_split_tc_kernel<MT, DW, COPY><<<grid, MT * DW * 32, smem, c->stream>>>(
        *kv, a->q, a->n_heads, a->scale, rows, groups, base, o_part, ml_part, kvc, a->out);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

/* The split kernels may use up to all the shared memory a block may opt in
 * to (split_smem, split_tc_smem check their shapes against it): set once,
 * with the context's GPU current, not per launch (a decode step's launches
 * are recorded into CUDA graphs). */
bool hpd_cuda_attention_init(const hpd_cuda_ctx_t *c)
{
    const int smem = (int)c->smem_optin;
    const auto optin = [smem](auto kernel) {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
               cudaSuccess;
    };
    bool ok = optin(attention_split_kernel<1, 256>) &&
              optin(attention_split_kernel<RT_GROUP, 256>);
    if (c->cc_major >= 8) /* the tensor-core kernels' bodies trap before sm_80 */
        ok = ok && optin(attention_split_tc_kernel<1, 4, false>) &&
             optin(attention_split_tc_kernel<8, 1, true>) &&
             optin(attention_split_tc_kernel<8, 1, false>);
    return ok;
}

/* A launch of the split pass: rows [r0, r1) of the op, whose partials fit
 * the scratch, in blocks groups[g0, g0 + n_groups), the n_multi of more
 * than one row first. */
typedef struct {
    uint32_t r0, r1, g0, n_groups, n_multi, max_splits, widest;
} split_range_t;

/* Cuts the op's rows into launches and blocks of up to group_rows
 * consecutive rows of a sequence (on the host). groups holds 2 n_rows
 * entries (the second half a scratch), ranges n_rows; returns the number of
 * ranges. */
static uint32_t split_plan(const qrow_t *hrows, uint32_t n_rows, size_t per_part,
                           uint32_t group_rows, row_group_t *groups, split_range_t *ranges)
{
    uint32_t n_ranges = 0, n_groups = 0;
    row_group_t *tmp = groups + n_rows;
    for (uint32_t r0 = 0; r0 < n_rows;) {
        const uint32_t base = hrows[r0].part;
        uint32_t r1 = r0 + 1, max_splits = ROW_SPLITS(hrows[r0].pos);
        while (r1 < n_rows &&
               (hrows[r1].part + ROW_SPLITS(hrows[r1].pos) - base) * per_part <=
                   SPLIT_SCRATCH_BYTES) {
            max_splits = max(max_splits, ROW_SPLITS(hrows[r1].pos));
            r1++;
        }
        split_range_t *rg = &ranges[n_ranges++];
        *rg = (split_range_t){r0, r1, n_groups, 0, 0, max_splits, 1};
        for (uint32_t r = r0; r < r1; r++) {
            row_group_t *g = rg->n_groups ? &groups[n_groups - 1] : NULL;
            if (g != NULL && g->count < group_rows && hrows[r].seq == hrows[r - 1].seq &&
                hrows[r].pos == hrows[r - 1].pos + 1) {
                g->count++;
                rg->widest = max(rg->widest, g->count);
            } else {
                groups[n_groups++] = (row_group_t){r - r0, 1, 0};
                rg->n_groups++;
            }
        }
        /* the groups of more than one row first (a stable partition) */
        uint32_t n = 0;
        for (uint32_t i = rg->g0; i < n_groups; i++)
            if (groups[i].count > 1)
                tmp[n++] = groups[i];
        rg->n_multi = n;
        for (uint32_t i = rg->g0; i < n_groups; i++)
            if (groups[i].count == 1)
                tmp[n++] = groups[i];
        memcpy(groups + rg->g0, tmp, (size_t)n * sizeof(row_group_t));
        r0 = r1;
    }
    return n_ranges;
}

/* The bf16 copy of K and V that the prompt blocks on tensor cores read:
 * each sequence that has one, its keys up to its last row in tiles of KT,
 * numbered as the sequences are first met; sets the blocks' conv. conv_at
 * holds n_seqs entries. Returns the tiles (NULL with *n_all 0 where there
 * are none, or where the copy would take more than TC_COPY_BYTES: then the
 * prompt's blocks read the pool). */
static hpd_status_t copy_plan(const hpd_attention_args_t *a, const qrow_t *hrows,
                              uint32_t *conv_at, row_group_t *groups,
                              const split_range_t *ranges, uint32_t n_ranges,
                              copy_tile_t **tiles_p, uint32_t *n_all_p)
{
    const hpd_kv_layout_t *l = a->kv.layout;
    size_t n_all = 0;
    *tiles_p = NULL, *n_all_p = 0;
    for (uint32_t s = 0; s < a->n_seqs; s++)
        conv_at[s] = UINT32_MAX;
    for (uint32_t i = 0; i < n_ranges; i++)
        for (uint32_t j = 0; j < ranges[i].n_multi; j++) {
            const uint32_t s = hrows[ranges[i].r0 + groups[ranges[i].g0 + j].first].seq;
            if (conv_at[s] == UINT32_MAX) {
                conv_at[s] = n_all < UINT32_MAX ? (uint32_t)n_all : UINT32_MAX - 1;
                n_all += (a->seqs[s].start_pos + a->seqs[s].n_tokens + KT - 1) / KT;
            }
            groups[ranges[i].g0 + j].conv = conv_at[s];
        }
    if (n_all == 0 || n_all * l->n_kv_heads * 4 * KT * l->head_dim > TC_COPY_BYTES)
        return HPD_OK;
    copy_tile_t *tiles = (copy_tile_t *)malloc(n_all * sizeof(copy_tile_t));
    if (tiles == NULL)
        return HPD_ERR_NO_MEMORY;
    for (uint32_t s = 0; s < a->n_seqs; s++)
        if (conv_at[s] != UINT32_MAX) {
            const uint32_t n_keys = a->seqs[s].start_pos + a->seqs[s].n_tokens;
            for (uint32_t t = 0; t * KT < n_keys; t++)
                tiles[conv_at[s] + t] = (copy_tile_t){s, t * KT, n_keys};
        }
    *tiles_p = tiles, *n_all_p = (uint32_t)n_all;
    return HPD_OK;
}

/* The split pass over rows staged at drows, groups at dgroups; on tensor
 * cores, first the bf16 copy of the n_all tiles staged at dtiles. */
static hpd_status_t attention_split(hpd_backend_t *b, const hpd_attention_args_t *a,
                                    const dev_kv_t *kv, const qrow_t *drows, const qrow_t *hrows,
                                    const row_group_t *dgroups, const split_range_t *ranges,
                                    uint32_t n_ranges, bool tc, const copy_tile_t *dtiles,
                                    uint32_t n_all)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    const hpd_kv_layout_t *l = a->kv.layout;
    const uint32_t hd = l->head_dim, G = a->n_heads / l->n_kv_heads;
    const size_t per_part = (size_t)a->n_heads * (hd + 2) * sizeof(float);
    size_t copy_bytes = (size_t)n_all * l->n_kv_heads * 4 * KT * hd, most = 0;
    for (uint32_t i = 0; i < n_ranges; i++) {
        const split_range_t *rg = &ranges[i];
        if (rg->max_splits > 65535 || l->n_kv_heads > 65535) {
            HPD_LOG_ERROR("cuda", "attention: %u splits of %u keys or %u KV heads exceed a grid "
                          "dimension (65535)", rg->max_splits, SPLIT, l->n_kv_heads);
            return HPD_ERR_UNSUPPORTED;
        }
        const uint32_t last = rg->r1 - 1;
        const size_t bytes =
            (hrows[last].part + ROW_SPLITS(hrows[last].pos) - hrows[rg->r0].part) * per_part;
        most = bytes > most ? bytes : most;
    }
    /* one buffer for the op: the bf16 copy, then a launch's partials; where
     * the GPU has no room for the copy, the prompt's blocks read the pool */
    void *work;
    hpd_status_t st = hpd_cuda_work(b, copy_bytes + most, &work);
    if (st == HPD_ERR_NO_MEMORY && copy_bytes > 0) {
        HPD_LOG_WARN("cuda", "attention: no room for a bf16 copy of %zu bytes of K and V; the "
                     "prompt's blocks read the pool instead", copy_bytes);
        n_all = 0, copy_bytes = 0;
        st = hpd_cuda_work(b, most, &work);
    }
    if (st != HPD_OK)
        return st;
    const kv_copy_t kvc = {(const uint16_t *)work, n_all};
    if (n_all > 0) {
        const dim3 grid(n_all, l->n_kv_heads);
        kv_bf16_kernel<<<grid, 256, 0, c->stream>>>(*kv, dtiles, n_all, (uint16_t *)work);
        HPD_CUDA_LAUNCHED();
    }
    for (uint32_t i = 0; i < n_ranges && st == HPD_OK; i++) {
        const split_range_t *rg = &ranges[i];
        const uint32_t base = hrows[rg->r0].part;
        const size_t parts = hrows[rg->r1 - 1].part + ROW_SPLITS(hrows[rg->r1 - 1].pos) - base;
        float *o_part = (float *)((char *)work + copy_bytes);
        float *ml_part = o_part + parts * a->n_heads * hd;
        const qrow_t *rw = drows + rg->r0;
        const row_group_t *gr = dgroups + rg->g0;
        const uint32_t n_one = rg->n_groups - rg->n_multi;
        if (tc) { /* a prompt's blocks, then the rows alone */
            const dim3 gm(rg->n_multi, rg->max_splits, l->n_kv_heads);
            if (rg->n_multi > 0)
                st = n_all > 0 ? split_tc_launch<8, 1, true>(c, gm, a, kv, rw, gr, base, o_part,
                                                             ml_part, kvc)
                               : split_tc_launch<8, 1, false>(c, gm, a, kv, rw, gr, base, o_part,
                                                              ml_part, kvc);
            if (st == HPD_OK && n_one > 0)
                st = split_tc_launch<1, 4, false>(c, dim3(n_one, rg->max_splits, l->n_kv_heads),
                                                  a, kv, rw, gr + rg->n_multi, base, o_part,
                                                  ml_part, kvc);
        } else {
            const dim3 grid(rg->n_groups, rg->max_splits, l->n_kv_heads);
            st = rg->widest > 1 ? split_launch<RT_GROUP, 256>(c, grid,
                                                              split_smem(RT_GROUP, G, hd), a,
                                                              kv, rw, gr, base, o_part, ml_part)
                                : split_launch<1, 256>(c, grid, split_smem(1, G, hd), a, kv, rw,
                                                       gr, base, o_part, ml_part);
        }
        if (st != HPD_OK)
            return st;
        attention_combine_kernel<<<(rg->r1 - rg->r0) * a->n_heads, THREADS, 0, c->stream>>>(
            a->out, a->n_heads, hd, rw, base, o_part, ml_part);
        HPD_CUDA_LAUNCHED();
    }
    return st;
}

/* tc: the split pass on tensor cores (cuda-bf16) where head_dim is a
 * multiple of 16 and its tiles fit */
static hpd_status_t attention(hpd_backend_t *b, const hpd_attention_args_t *a, bool tc)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    const hpd_kv_layout_t *l = a->kv.layout;
    qrow_t *rows;
    uint32_t *tables, n_rows, n_entries;
    hpd_status_t st;

    if (l->dtype != HPD_DTYPE_F32 || l->head_dim > MAX_HD || l->n_kv_heads == 0 ||
        a->n_heads == 0 || a->n_heads % l->n_kv_heads != 0)
        return HPD_ERR_UNSUPPORTED;
    if ((st = build_batch(&a->kv, a->seqs, a->n_seqs, &rows, &n_rows, &tables, &n_entries)) !=
        HPD_OK)
        return st;
    if (n_rows == 0) {
        free(rows), free(tables);
        return HPD_OK;
    }
    /* out may not overlap q: split blocks write short rows' outputs while
     * other blocks still read q */
    uint32_t last_row = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        last_row = rows[r].row > last_row ? rows[r].row : last_row;
    const uintptr_t q0 = (uintptr_t)a->q.p, o0 = (uintptr_t)a->out.p;
    const uintptr_t q1 = q0 + ((size_t)last_row * a->q.ld + (size_t)a->n_heads * a->q.hs) * 4;
    const uintptr_t o1 = o0 + ((size_t)last_row * a->out.ld + (size_t)a->n_heads * a->out.hs) * 4;
    if (o0 < q1 && q0 < o1) {
        HPD_LOG_ERROR("cuda", "attention: out [%#zx, %#zx) overlaps q [%#zx, %#zx)", (size_t)o0,
                      (size_t)o1, (size_t)q0, (size_t)q1);
        free(rows), free(tables);
        return HPD_ERR_INVALID_ARG;
    }
    /* the split-KV pass where its tiles fit (16-byte rows, head_dim <= 256, at
     * most 16 query heads per KV head); its launches and blocks are planned
     * here and staged with the rows and tables in one slot of the ring, which
     * later ops cannot reuse before these launches have read it */
    const uint32_t hd = l->head_dim, G = a->n_heads / l->n_kv_heads;
    const bool split = hd % 4 == 0 && hd <= SPLIT_HD && G <= GMAX &&
                       split_smem(1, G, hd) <= c->smem_optin;
    if (split && ((uintptr_t)a->kv.pool & 15) != 0) {
        HPD_LOG_ERROR("cuda", "attention: the KV pool at %p is not 16-byte aligned",
                      a->kv.pool);
        free(rows), free(tables);
        return HPD_ERR_INVALID_ARG;
    }
    row_group_t *groups = NULL;
    split_range_t *ranges = NULL;
    copy_tile_t *tiles = NULL;
    uint32_t *conv_at = NULL;
    uint32_t n_groups = 0, n_ranges = 0, n_all = 0;
    if (split) {
        groups = (row_group_t *)malloc((size_t)n_rows * 2 * sizeof(row_group_t));
        ranges = (split_range_t *)malloc((size_t)n_rows * sizeof(split_range_t));
        conv_at = (uint32_t *)malloc((size_t)a->n_seqs * sizeof(uint32_t));
        if (groups == NULL || ranges == NULL || conv_at == NULL) {
            free(rows), free(tables), free(groups), free(ranges), free(conv_at);
            return HPD_ERR_NO_MEMORY;
        }
        /* rows in blocks of a prompt's consecutive rows where the kernel fits:
         * TC_PAIRS pairs on tensor cores, RT_GROUP rows in fp32 */
        const size_t per_part = (size_t)a->n_heads * (hd + 2) * sizeof(float);
        tc = tc && hd % 16 == 0 && split_tc_smem(1, hd, false) <= c->smem_optin;
        uint32_t group_rows = 1;
        if (tc && split_tc_smem(8, hd, true) <= c->smem_optin &&
            split_tc_smem(8, hd, false) <= c->smem_optin)
            group_rows = TC_PAIRS / G;
        else if (!tc && G <= GMAX / 2 && split_smem(RT_GROUP, G, hd) <= c->smem_optin)
            group_rows = RT_GROUP;
        n_ranges = split_plan(rows, n_rows, per_part, group_rows, groups, ranges);
        if (tc)
            st = copy_plan(a, rows, conv_at, groups, ranges, n_ranges, &tiles, &n_all);
        n_groups = ranges[n_ranges - 1].g0 + ranges[n_ranges - 1].n_groups;
    }
    void *drows, *dtables, *dgroups = NULL, *dtiles = NULL;
    const hpd_cuda_meta_t m[] = {
        {.host = rows, .bytes = n_rows * sizeof(qrow_t), .dev_p = &drows},
        {.host = tables, .bytes = (n_entries + a->n_seqs) * sizeof(uint32_t), .dev_p = &dtables},
        {.host = groups, .bytes = n_groups * sizeof(row_group_t), .dev_p = &dgroups},
        {.host = tiles, .bytes = n_all * sizeof(copy_tile_t), .dev_p = &dtiles}};
    if (st == HPD_OK)
        st = hpd_cuda_stage(b, m, split ? (n_all > 0 ? 4 : 3) : 2);
    if (st == HPD_OK) {
        const dev_kv_t kv = device_kv(&a->kv, dtables, n_entries);
        if (split)
            st = attention_split(b, a, &kv, (const qrow_t *)drows, rows,
                                 (const row_group_t *)dgroups, ranges, n_ranges, tc,
                                 (const copy_tile_t *)dtiles, n_all);
        else {
            attention_kernel<<<n_rows * a->n_heads, THREADS, 0, c->stream>>>(
                kv, a->q, a->out, a->n_heads, a->scale, (const qrow_t *)drows);
            if (cudaGetLastError() != cudaSuccess) {
                HPD_LOG_ERROR("cuda", "attention launch failed");
                st = HPD_ERR_INTERNAL;
            }
        }
    }
    free(rows), free(tables), free(groups), free(ranges), free(conv_at), free(tiles);
    return st;
}

hpd_status_t hpd_cuda_attention(hpd_backend_t *b, const hpd_attention_args_t *a)
{
    return attention(b, a, false);
}

/* cuda-bf16: q, k, v and the probabilities rounded to bf16, products on
 * tensor cores, where head_dim is a multiple of 16 (the fp32 kernels
 * otherwise: the choice depends on the shapes alone) */
hpd_status_t hpd_cuda_attention_bf16(hpd_backend_t *b, const hpd_attention_args_t *a)
{
    return attention(b, a, true);
}
