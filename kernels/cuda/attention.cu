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

typedef struct {
    uint32_t seq, row, pos;
} qrow_t;

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
                                const qrow_t **rows_p, uint32_t *n_rows_p)
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
    for (uint32_t s = 0, r = 0, e = 0; s < n_seqs; s++) {
        const uint32_t nb = (seqs[s].start_pos + seqs[s].n_tokens + B - 1) / B;
        table_at[s] = e;
        for (uint32_t j = 0; j < nb; j++)
            tables[e++] = kv->block_tables[s][j];
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, r++)
            rows[r] = (qrow_t){s, seqs[s].row + i, seqs[s].start_pos + i};
    }
    void *drows, *dtables;
    const hpd_cuda_meta_t m[] = {
        {.host = rows, .bytes = n_rows * sizeof(qrow_t), .dev_p = &drows},
        {.host = tables, .bytes = (n_entries + n_seqs) * sizeof(uint32_t), .dev_p = &dtables}};
    const hpd_status_t st = hpd_cuda_stage(b, m, 2);
    free(rows);
    free(tables);
    if (st != HPD_OK)
        return st;
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
    if ((st = stage_batch(b, &a->kv, a->seqs, a->n_seqs, &kv, &rows, &n_rows)) != HPD_OK)
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

hpd_status_t hpd_cuda_attention(hpd_backend_t *b, const hpd_attention_args_t *a)
{
    const hpd_kv_layout_t *l = a->kv.layout;
    dev_kv_t kv;
    const qrow_t *rows;
    uint32_t n_rows;
    hpd_status_t st;

    if (l->dtype != HPD_DTYPE_F32 || l->head_dim > MAX_HD || l->n_kv_heads == 0 ||
        a->n_heads % l->n_kv_heads != 0)
        return HPD_ERR_UNSUPPORTED;
    if ((st = stage_batch(b, &a->kv, a->seqs, a->n_seqs, &kv, &rows, &n_rows)) != HPD_OK)
        return st;
    if (n_rows == 0)
        return HPD_OK;
    attention_kernel<<<n_rows * a->n_heads, THREADS, 0, hpd_cuda_ctx(b)->stream>>>(
        kv, a->q, a->out, a->n_heads, a->scale, rows);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}
