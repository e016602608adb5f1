/* Paged KV store and causal GQA attention on the CPU.
 *
 * The attention walks keys in fixed tiles of HPD_ATTN_TILE tokens with an
 * online softmax; the order depends only on the query position, never on the
 * block size, pack size or page order, nor on the batch. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

static inline float *at(const hpd_view_t *v, uint32_t t, uint32_t h)
{
    return v->p + (size_t)t * v->ld + (size_t)h * v->hs;
}

/* Address of the head_dim row of (kv, absolute token t, head h) of sequence s. */
static inline float *kv_row(const hpd_paged_kv_t *kv, uint32_t s, uint32_t which, uint32_t t,
                            uint32_t h)
{
    const hpd_kv_layout_t *l = kv->layout;
    const uint32_t page = kv->block_tables[s][t / l->block_size];

    return (float *)kv->pool + (size_t)page * hpd_kv_layout_page_elems(l) +
           hpd_kv_layout_row(l, kv->member, which, t % l->block_size, h);
}

hpd_status_t hpd_cpu_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a)
{
    const hpd_kv_layout_t *l = a->kv.layout;
    const size_t bytes = l->head_dim * sizeof(float);

    if (l->dtype != HPD_DTYPE_F32)
        return HPD_ERR_UNSUPPORTED;
    for (uint32_t s = 0; s < a->n_seqs; s++) {
        const hpd_seq_t *seq = &a->seqs[s];
        for (uint32_t i = 0; i < seq->n_tokens; i++) {
            const uint32_t pos = seq->start_pos + i, row = seq->row + i;
            for (uint32_t h = 0; h < l->n_kv_heads; h++) {
                memcpy(kv_row(&a->kv, s, 0, pos, h), at(&a->k, row, h), bytes);
                memcpy(kv_row(&a->kv, s, 1, pos, h), at(&a->v, row, h), bytes);
            }
        }
    }
    return HPD_OK;
}

/* the scores of keys [t0, t1) against q (times scale): each hpd_dot's
 * sequence, four keys at a time so that four chains are in flight */
static void scores(const hpd_attention_args_t *a, uint32_t s, uint32_t kvh, const float *q,
                   uint32_t t0, uint32_t t1, float *sc)
{
    const uint32_t hd = a->kv.layout->head_dim, hd8 = hd / 8 * 8;
    uint32_t t = t0;
    for (; t + 4 <= t1; t += 4) {
        const float *k0 = kv_row(&a->kv, s, 0, t, kvh), *k1 = kv_row(&a->kv, s, 0, t + 1, kvh);
        const float *k2 = kv_row(&a->kv, s, 0, t + 2, kvh), *k3 = kv_row(&a->kv, s, 0, t + 3, kvh);
        hpd_v8_t c0 = hpd_v8_zero(), c1 = hpd_v8_zero(), c2 = hpd_v8_zero(), c3 = hpd_v8_zero();
        for (uint32_t i = 0; i < hd8; i += 8) {
            const hpd_v8_t qv = hpd_v8_load(q + i);
            c0 = hpd_v8_fma(qv, hpd_v8_load(k0 + i), c0);
            c1 = hpd_v8_fma(qv, hpd_v8_load(k1 + i), c1);
            c2 = hpd_v8_fma(qv, hpd_v8_load(k2 + i), c2);
            c3 = hpd_v8_fma(qv, hpd_v8_load(k3 + i), c3);
        }
        float d[4] = {hpd_v8_hsum(c0), hpd_v8_hsum(c1), hpd_v8_hsum(c2), hpd_v8_hsum(c3)};
        const float *kr[4] = {k0, k1, k2, k3};
        for (int r = 0; r < 4; r++) {
            for (uint32_t i = hd8; i < hd; i++)
                d[r] = hpd_fma1(q[i], kr[r][i], d[r]);
            sc[t - t0 + r] = d[r] * a->scale;
        }
    }
    for (; t < t1; t++)
        sc[t - t0] = hpd_dot(q, kv_row(&a->kv, s, 0, t, kvh), hd) * a->scale;
}

/* acc = acc * alpha, then acc += p[t - t0] v[t] for t in [t0, t1) in order
 * (hpd_scale then one hpd_axpy per key), 64 elements of acc held in
 * registers over the keys */
static void scale_axpy(const hpd_attention_args_t *a, uint32_t s, uint32_t kvh, float *acc,
                       float alpha, const float *p, uint32_t t0, uint32_t t1)
{
    const uint32_t hd = a->kv.layout->head_dim;
    const hpd_v8_t av = hpd_v8_set1(alpha);
    uint32_t d = 0;
    for (; d + 64 <= hd; d += 64) {
        hpd_v8_t r[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            r[j] = hpd_v8_mul(av, hpd_v8_load(acc + d + 8 * j));
        for (uint32_t t = t0; t < t1; t++) {
            const float *v = kv_row(&a->kv, s, 1, t, kvh) + d;
            const hpd_v8_t pv = hpd_v8_set1(p[t - t0]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                r[j] = hpd_v8_fma(pv, hpd_v8_load(v + 8 * j), r[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            hpd_v8_store(acc + d + 8 * j, r[j]);
    }
    if (d < hd) {
        hpd_scale(acc + d, alpha, hd - d);
        for (uint32_t t = t0; t < t1; t++)
            hpd_axpy(acc + d, p[t - t0], kv_row(&a->kv, s, 1, t, kvh) + d, hd - d);
    }
}

static void attend_one(const hpd_attention_args_t *a, uint32_t s, uint32_t row, uint32_t pos,
                       uint32_t h)
{
    const hpd_kv_layout_t *l = a->kv.layout;
    const uint32_t hd = l->head_dim;
    const uint32_t kvh = h / (a->n_heads / l->n_kv_heads);
    const float *q = at(&a->q, row, h);
    float *out = at(&a->out, row, h);
    float acc[1024];
    float m = -INFINITY, sum = 0.0f;

    memset(acc, 0, hd * sizeof(float));
    for (uint32_t t0 = 0; t0 <= pos; t0 += HPD_ATTN_TILE) {
        const uint32_t t1 = t0 + HPD_ATTN_TILE <= pos + 1 ? t0 + HPD_ATTN_TILE : pos + 1;
        float sc[HPD_ATTN_TILE];
        float tile_max = -INFINITY, m_new, alpha;

        scores(a, s, kvh, q, t0, t1, sc);
        for (uint32_t t = t0; t < t1; t++)
            tile_max = fmaxf(tile_max, sc[t - t0]);
        m_new = fmaxf(m, tile_max);
        alpha = expf(m - m_new);
        sum *= alpha;
        float p[HPD_ATTN_TILE];
        uint32_t t = t0;
        for (; t + 8 <= t1; t += 8) /* the kernels' exp, the same in a lane as alone */
            hpd_v8_store(p + (t - t0),
                         hpd_v8_exp(hpd_v8_add(hpd_v8_load(sc + (t - t0)), hpd_v8_set1(-m_new))));
        for (; t < t1; t++)
            p[t - t0] = hpd_exp1(sc[t - t0] + -m_new);
        for (t = t0; t < t1; t++)
            sum += p[t - t0];
        scale_axpy(a, s, kvh, acc, alpha, p, t0, t1);
        m = m_new;
    }
    const float inv = 1.0f / sum;
    for (uint32_t d = 0; d < hd; d++)
        out[d] = acc[d] * inv;
}

hpd_status_t hpd_cpu_attention(hpd_backend_t *b, const hpd_attention_args_t *a)
{
    const hpd_kv_layout_t *l = a->kv.layout;
    uint32_t n_rows = 0;
    uint32_t(*items)[3];

    if (l->dtype != HPD_DTYPE_F32 || l->head_dim > 1024)
        return HPD_ERR_UNSUPPORTED;
    for (uint32_t s = 0; s < a->n_seqs; s++)
        n_rows += a->seqs[s].n_tokens;
    items = malloc((size_t)n_rows * sizeof(*items));
    if (items == NULL)
        return HPD_ERR_NO_MEMORY;
    /* (sequence, batch row, position) of every query row */
    for (uint32_t s = 0, r = 0; s < a->n_seqs; s++) {
        for (uint32_t i = 0; i < a->seqs[s].n_tokens; i++, r++) {
            items[r][0] = s;
            items[r][1] = a->seqs[s].row + i;
            items[r][2] = a->seqs[s].start_pos + i;
        }
    }
    const uint32_t total = n_rows * a->n_heads;
    const int threads = total > 1 ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
    for (uint32_t w = 0; w < total; w++) {
        const uint32_t r = w / a->n_heads, h = w % a->n_heads;
        attend_one(a, items[r][0], items[r][1], items[r][2], h);
    }
    free(items);
    return HPD_OK;
}
