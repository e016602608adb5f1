/* Paged KV store and causal GQA attention on the GPU.
 *
 * The host lists every query row of the batch as (sequence, batch row,
 * position) and flattens the sequences' block tables; both are staged to the
 * device. Attention runs one block of 4 warps per (query row, head) and
 * walks keys in fixed tiles of HPD_ATTN_TILE with an online softmax, as the
 * CPU backend does: warp w scores keys w, w+4, ... of a tile (lane-strided
 * sums, then a fixed shuffle tree), and thread d accumulates output
 * dimensions d, d+128, ... over the tile's keys in ascending order. A row's
 * result depends on its position alone, not on the batch or the layout. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_ops.h"

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

/* Stages the query rows and the block tables (the blocks each sequence's
 * last row reaches). */
static hpd_status_t stage_batch(hpd_backend_t *b, const hpd_paged_kv_t *kv,
                                const hpd_seq_t *seqs, uint32_t n_seqs, dev_kv_t *out,
                                const qrow_t **rows_p, uint32_t *n_rows_p, qrow_t **host_rows_p)
{
    const uint32_t B = kv->layout->block_size;
    uint32_t n_rows = 0, n_entries = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        n_rows += seqs[s].n_tokens;
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
        const uint32_t nb = (seqs[s].start_pos + seqs[s].n_tokens + B - 1) / B;
        table_at[s] = e;
        for (uint32_t j = 0; j < nb; j++)
            tables[e++] = kv->block_tables[s][j];
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, r++) {
            rows[r] = (qrow_t){s, seqs[s].row + i, seqs[s].start_pos + i, part};
            part += ROW_SPLITS(seqs[s].start_pos + i);
        }
    }
    void *drows, *dtables;
    const hpd_cuda_meta_t m[] = {
        {.host = rows, .bytes = n_rows * sizeof(qrow_t), .dev_p = &drows},
        {.host = tables, .bytes = (n_entries + n_seqs) * sizeof(uint32_t), .dev_p = &dtables}};
    const hpd_status_t st = hpd_cuda_stage(b, m, 2);
    free(tables);
    if (st != HPD_OK || host_rows_p == NULL)
        free(rows);
    if (st != HPD_OK)
        return st;
    if (host_rows_p != NULL)
        *host_rows_p = rows;
    out->l = *kv->layout;
    out->pool = (const float *)kv->pool;
    out->member = kv->member;
    out->tables = (const uint32_t *)dtables;
    out->table_at = (const uint32_t *)dtables + n_entries;
    *rows_p = (const qrow_t *)drows;
    *n_rows_p = n_rows;
    return HPD_OK;
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
    dev_kv_t kv;
    const qrow_t *rows;
    uint32_t n_rows;
    hpd_status_t st;

    if (a->kv.layout->dtype != HPD_DTYPE_F32)
        return HPD_ERR_UNSUPPORTED;
    if ((st = stage_batch(b, &a->kv, a->seqs, a->n_seqs, &kv, &rows, &n_rows, NULL)) != HPD_OK)
        return st;
    if (n_rows == 0)
        return HPD_OK;
    kv_store_kernel<<<n_rows * a->kv.layout->n_kv_heads, 64, 0, hpd_cuda_ctx(b)->stream>>>(
        kv, a->k, a->v, rows);
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

#define KT 32     /* keys per tile: one per lane */
#define GMAX 16   /* query heads per KV head */
#define HPT (GMAX / WARPS)
#define SPLIT_HD 256
#define DPT (SPLIT_HD / THREADS)

/* 16-byte vectors per thread in a tile of KT rows of head_dim <= SPLIT_HD */
#define TILE_VECS (KT * SPLIT_HD / 4 / THREADS)

/* Loads this thread's vectors of a tile of n4 vectors (rows of hd4) into
 * registers, every load issued before any is used. */
__device__ static inline void tile_load(float4 *vr, const float *const *rowp, uint32_t n4,
                                        uint32_t hd4)
{
#pragma unroll
    for (uint32_t u = 0; u < TILE_VECS; u++) {
        const uint32_t i = threadIdx.x + u * THREADS;
        if (i < n4)
            vr[u] = ((const float4 *)rowp[i / hd4])[i % hd4];
    }
}

/* Stores what tile_load loaded into the shared tile (row stride ld). */
__device__ static inline void tile_store(float *tile, uint32_t ld, const float4 *vr, uint32_t n4,
                                         uint32_t hd4)
{
#pragma unroll
    for (uint32_t u = 0; u < TILE_VECS; u++) {
        const uint32_t i = threadIdx.x + u * THREADS;
        if (i < n4)
            ((float4 *)(tile + (i / hd4) * ld))[i % hd4] = vr[u];
    }
}

/* One block of 4 warps per (query row, KV head, split of SPLIT keys): the
 * KV head's K and V rows are read once for its whole group of G query
 * heads. Per tile of KT keys (their page rows looked up once): lane l scores
 * key l against heads w, w + 4, ... (ascending dimensions, fused
 * multiply-adds); thread g < G keeps head g's running max and sum and turns
 * the tile's scores into probabilities; thread t accumulates dimensions t
 * and t + 128 of every head over the tile's keys in ascending order. The
 * split's unnormalised output, max and sum go to the scratch; the combine
 * pass merges a row's splits in ascending order. */
__global__ void __launch_bounds__(THREADS)
    attention_split_kernel(dev_kv_t kv, hpd_view_t qv, uint32_t n_heads, float scale,
                           const qrow_t *rows, uint32_t part_base, float *o_part,
                           float *ml_part)
{
    extern __shared__ float4 sm4[];
    const uint32_t hd = kv.l.head_dim, G = n_heads / kv.l.n_kv_heads, kvh = blockIdx.z;
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32, ld = hd + 4;
    const qrow_t r = rows[blockIdx.x];
    const uint32_t t_begin = blockIdx.y * SPLIT;
    if (t_begin > r.pos)
        return; /* the row has fewer splits: the whole block leaves */
    const uint32_t t_end = min(t_begin + SPLIT, r.pos + 1);
    float *qs = (float *)sm4;            /* [G][ld] */
    float *kvs = qs + (size_t)G * ld;    /* [KT][ld]: K, then V */
    float *ps = kvs + (size_t)KT * ld;   /* [G][KT]: scores, then probabilities */
    float *alpha = ps + G * KT;          /* [GMAX] */
    const float **krow = (const float **)(alpha + GMAX), **vrow = krow + SPLIT; /* [SPLIT] */
    float m = -INFINITY, l = 0.0f; /* thread g < G: head g's */
    float acc[GMAX][DPT];
    float4 vr[TILE_VECS]; /* the next V tile, loaded while K's scores are computed */

    /* the split's page rows, looked up once (their loads all in flight) */
    for (uint32_t t = t_begin + tid; t < t_end; t += THREADS) {
        krow[t - t_begin] = kv_row(&kv, r.seq, 0, t, kvh);
        vrow[t - t_begin] = kv_row(&kv, r.seq, 1, t, kvh);
    }
    for (uint32_t i = tid; i < G * hd; i += THREADS) {
        const uint32_t g = i / hd, d = i % hd;
        qs[g * ld + d] = qv.p[(size_t)r.row * qv.ld + (size_t)(kvh * G + g) * qv.hs + d];
    }
#pragma unroll
    for (uint32_t g = 0; g < GMAX; g++)
#pragma unroll
        for (uint32_t k = 0; k < DPT; k++)
            acc[g][k] = 0.0f;
    const uint32_t hd4 = hd / 4;
    for (uint32_t t0 = t_begin; t0 < t_end; t0 += KT) {
        const uint32_t nk = min(KT, t_end - t0), n4 = nk * hd4;
        __syncthreads(); /* row pointers set; the last tile's V and ps read */
        tile_load(vr, krow + (t0 - t_begin), n4, hd4);
        tile_store(kvs, ld, vr, n4, hd4);
        __syncthreads();
        tile_load(vr, vrow + (t0 - t_begin), n4, hd4); /* in flight during the scores */
        if (lane < nk) {
            const float4 *k4 = (const float4 *)(kvs + lane * ld);
#pragma unroll
            for (uint32_t j = 0; j < HPT; j++) {
                const uint32_t g = warp + j * WARPS;
                if (g < G) {
                    const float4 *q4 = (const float4 *)(qs + g * ld);
                    float s = 0.0f;
                    for (uint32_t c = 0; c < hd4; c++) {
                        const float4 kk = k4[c], qq = q4[c];
                        s = fmaf(qq.x, kk.x, s);
                        s = fmaf(qq.y, kk.y, s);
                        s = fmaf(qq.z, kk.z, s);
                        s = fmaf(qq.w, kk.w, s);
                    }
                    ps[g * KT + lane] = __fmul_rn(s, scale);
                }
            }
        }
        __syncthreads(); /* scores written, K no longer read */
        if (tid < G) {
            float tmax = -INFINITY;
            for (uint32_t t = 0; t < nk; t++)
                tmax = fmaxf(tmax, ps[tid * KT + t]);
            const float m_new = fmaxf(m, tmax), al = expf(m - m_new);
            l = __fmul_rn(l, al);
            for (uint32_t t = 0; t < nk; t++) {
                const float p = expf(ps[tid * KT + t] - m_new);
                ps[tid * KT + t] = p;
                l = __fadd_rn(l, p);
            }
            m = m_new;
            alpha[tid] = al;
        }
        tile_store(kvs, ld, vr, n4, hd4);
        __syncthreads();
#pragma unroll
        for (uint32_t g = 0; g < GMAX; g++)
            if (g < G)
#pragma unroll
                for (uint32_t k = 0; k < DPT; k++)
                    acc[g][k] = __fmul_rn(acc[g][k], alpha[g]);
        for (uint32_t t = 0; t < nk; t++) {
#pragma unroll
            for (uint32_t k = 0; k < DPT; k++) {
                const uint32_t d = tid + k * THREADS;
                if (d < hd) {
                    const float v = kvs[t * ld + d];
#pragma unroll
                    for (uint32_t g = 0; g < GMAX; g++)
                        if (g < G)
                            acc[g][k] = fmaf(ps[g * KT + t], v, acc[g][k]);
                }
            }
        }
    }
    const size_t p = (size_t)(r.part - part_base + blockIdx.y) * n_heads + kvh * G;
#pragma unroll
    for (uint32_t g = 0; g < GMAX; g++)
        if (g < G)
#pragma unroll
            for (uint32_t k = 0; k < DPT; k++)
                if (tid + k * THREADS < hd)
                    o_part[(p + g) * hd + tid + k * THREADS] = acc[g][k];
    if (tid < G) {
        ml_part[(p + tid) * 2] = m;
        ml_part[(p + tid) * 2 + 1] = l;
    }
}

/* One block per (query row, head): the row's splits merged in ascending
 * order, out = sum_s o_s exp(m_s - M) / sum_s l_s exp(m_s - M). */
__global__ void attention_combine_kernel(hpd_view_t ov, uint32_t n_heads, uint32_t hd,
                                         const qrow_t *rows, uint32_t part_base,
                                         const float *o_part, const float *ml_part)
{
    const qrow_t r = rows[blockIdx.x / n_heads];
    const uint32_t h = blockIdx.x % n_heads, n = ROW_SPLITS(r.pos);
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
#define SPLIT_SCRATCH_BYTES ((size_t)64 << 20)

static hpd_status_t attention_split(hpd_backend_t *b, const hpd_attention_args_t *a,
                                    const dev_kv_t *kv, const qrow_t *rows, const qrow_t *hrows,
                                    uint32_t n_rows)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    const hpd_kv_layout_t *l = a->kv.layout;
    const uint32_t hd = l->head_dim, G = a->n_heads / l->n_kv_heads;
    const size_t per_part = (size_t)a->n_heads * (hd + 2) * sizeof(float);
    const size_t smem = ((size_t)(G + KT) * (hd + 4) + (size_t)G * KT + GMAX) * sizeof(float) +
                        2 * SPLIT * sizeof(float *);
    if (smem > c->smem_optin)
        return HPD_ERR_UNSUPPORTED;
    if (smem > 48 * 1024)
        HPD_CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem));
    for (uint32_t r0 = 0; r0 < n_rows;) {
        /* rows [r0, r1): their partials within the scratch bound */
        const uint32_t base = hrows[r0].part;
        uint32_t r1 = r0 + 1, max_splits = ROW_SPLITS(hrows[r0].pos);
        while (r1 < n_rows &&
               (hrows[r1].part + ROW_SPLITS(hrows[r1].pos) - base) * per_part <=
                   SPLIT_SCRATCH_BYTES) {
            max_splits = max(max_splits, ROW_SPLITS(hrows[r1].pos));
            r1++;
        }
        const size_t parts = hrows[r1 - 1].part + ROW_SPLITS(hrows[r1 - 1].pos) - base;
        void *work;
        hpd_status_t st = hpd_cuda_work(b, parts * per_part, &work);
        if (st != HPD_OK)
            return st;
        float *o_part = (float *)work, *ml_part = o_part + parts * a->n_heads * hd;
        if (max_splits > 65535 || l->n_kv_heads > 65535)
            return HPD_ERR_UNSUPPORTED;
        const dim3 grid(r1 - r0, max_splits, l->n_kv_heads);
        attention_split_kernel<<<grid, THREADS, smem, c->stream>>>(
            *kv, a->q, a->n_heads, a->scale, rows + r0, base, o_part, ml_part);
        HPD_CUDA_LAUNCHED();
        attention_combine_kernel<<<(r1 - r0) * a->n_heads, THREADS, 0, c->stream>>>(
            a->out, a->n_heads, hd, rows + r0, base, o_part, ml_part);
        HPD_CUDA_LAUNCHED();
        r0 = r1;
    }
    return HPD_OK;
}

hpd_status_t hpd_cuda_attention(hpd_backend_t *b, const hpd_attention_args_t *a)
{
    const hpd_kv_layout_t *l = a->kv.layout;
    dev_kv_t kv;
    const qrow_t *rows;
    qrow_t *hrows = NULL;
    uint32_t n_rows;
    hpd_status_t st;

    if (l->dtype != HPD_DTYPE_F32 || l->head_dim > MAX_HD || l->n_kv_heads == 0 ||
        a->n_heads % l->n_kv_heads != 0)
        return HPD_ERR_UNSUPPORTED;
    if ((st = stage_batch(b, &a->kv, a->seqs, a->n_seqs, &kv, &rows, &n_rows, &hrows)) != HPD_OK)
        return st;
    if (n_rows == 0) {
        free(hrows);
        return HPD_OK;
    }
    /* the split-KV pass where its tiles fit: 16-byte rows, head_dim <= 256,
     * at most 16 query heads per KV head */
    const uint32_t G = a->n_heads / l->n_kv_heads;
    if (l->head_dim % 4 == 0 && l->head_dim <= SPLIT_HD && G <= GMAX &&
        ((uintptr_t)a->kv.pool & 15) == 0) {
        st = attention_split(b, a, &kv, rows, hrows, n_rows);
        free(hrows);
        return st;
    }
    free(hrows);
    attention_kernel<<<n_rows * a->n_heads, THREADS, 0, hpd_cuda_ctx(b)->stream>>>(
        kv, a->q, a->out, a->n_heads, a->scale, rows);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
