/* The gated delta rule on the CPU: the chunked (WY/UT) form for prefill and
 * the recurrent step for decode (docs/kernels.md has the math).
 *
 * Per value head h with key head h / (nv/nk) and state S[dk][dv]:
 *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
 * Chunks sit on the absolute grid of HPD_GDN_CHUNK positions, so a sequence
 * resumed from a state taken at a multiple of 64 computes exactly the same
 * chunks, bit for bit, as one pass over the whole sequence. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

#define C HPD_GDN_CHUNK

static inline const float *at(const hpd_view_t *v, uint32_t t, uint32_t h)
{
    return v->p + (size_t)t * v->ld + (size_t)h * v->hs;
}

static inline float *at_mut(const hpd_view_t *v, uint32_t t, uint32_t h)
{
    return v->p + (size_t)t * v->ld + (size_t)h * v->hs;
}

static void recurrent_head(const hpd_gdn_args_t *a, const hpd_seq_t *seq, float *S, uint32_t h,
                           float *kv_mem)
{
    const uint32_t dk = a->dk, dv = a->dv, kh = h / (a->nv / a->nk);

    for (uint32_t i = 0; i < seq->n_tokens; i++) {
        const uint32_t row = seq->row + i;
        const float *q = at(&a->q, row, kh), *k = at(&a->k, row, kh), *v = at(&a->v, row, h);
        const float decay = expf(a->g[(size_t)row * a->nv + h]);
        const float beta = a->beta[(size_t)row * a->nv + h];
        float *o = at_mut(&a->out, row, h);

        memset(kv_mem, 0, dv * sizeof(float));
        for (uint32_t x = 0; x < dk; x++) {
            hpd_scale(S + (size_t)x * dv, decay, dv);
            hpd_axpy(kv_mem, k[x], S + (size_t)x * dv, dv);
        }
        for (uint32_t d = 0; d < dv; d++)
            kv_mem[d] = (v[d] - kv_mem[d]) * beta; /* u */
        for (uint32_t x = 0; x < dk; x++)
            hpd_axpy(S + (size_t)x * dv, k[x], kv_mem, dv);
        memset(o, 0, dv * sizeof(float));
        for (uint32_t x = 0; x < dk; x++)
            hpd_axpy(o, q[x], S + (size_t)x * dv, dv);
    }
}

typedef struct {
    float A[C][C]; /* strictly lower: the UT system, then T = (I + L)^-1 */
    float D[C][C]; /* lower: exp(gc_i - gc_j), each computed once */
    float gc[C];   /* cumulative g inside the chunk */
    float eg[C];   /* exp(gc_i) */
    float *kb;     /* [C][dk] k * beta */
    float *kbe;    /* [C][dk] k * beta * exp(gc) */
    float *vb;     /* [C][dv] v * beta */
    float *u;      /* [C][dv] T (v * beta) */
    float *w;      /* [C][dk] T (k * beta * exp(gc)) */
    float *vn;     /* [C][dv] u - w S: the new values */
} chunk_ws_t;

/* One chunk of L rows starting at batch row r0, state S updated in place.
 * The gates (exp(gc_i), exp(gc_i - gc_j)) and the scaled rows (k beta,
 * k beta exp(gc), v beta) are computed once per chunk and the triangular
 * products run as row axpys; every value is the same expression as in the
 * formulas of docs/kernels.md, so only the work is shared. */
static void chunk_head(const hpd_gdn_args_t *a, uint32_t r0, uint32_t L, float *S, uint32_t h,
                       chunk_ws_t *ws)
{
    const uint32_t dk = a->dk, dv = a->dv, nv = a->nv, kh = h / (a->nv / a->nk);
    float acc = 0.0f;

    for (uint32_t i = 0; i < L; i++) {
        const float beta = a->beta[(size_t)(r0 + i) * nv + h];
        const float *k = at(&a->k, r0 + i, kh), *v = at(&a->v, r0 + i, h);
        acc += a->g[(size_t)(r0 + i) * nv + h];
        ws->gc[i] = acc;
        ws->eg[i] = expf(acc);
        for (uint32_t x = 0; x < dk; x++) {
            ws->kb[(size_t)i * dk + x] = k[x] * beta;
            ws->kbe[(size_t)i * dk + x] = ws->kb[(size_t)i * dk + x] * ws->eg[i];
        }
        for (uint32_t d = 0; d < dv; d++)
            ws->vb[(size_t)i * dv + d] = v[d] * beta;
    }
    for (uint32_t i = 0; i < L; i++)
        for (uint32_t j = 0; j <= i; j++)
            ws->D[i][j] = expf(ws->gc[i] - ws->gc[j]);
    /* A[i][j] = -(kb_i . k_j) exp(gc_i - gc_j), j < i; then forward
     * substitution row by row: A[i][j] += sum_{j<m<i} A_orig[i][m] A[m][j]. */
    for (uint32_t i = 0; i < L; i++) {
        float row[C];
        for (uint32_t j = 0; j < i; j++)
            row[j] = -hpd_dot(ws->kb + (size_t)i * dk, at(&a->k, r0 + j, kh), dk) * ws->D[i][j];
        for (uint32_t j = 0; j < i; j++) {
            float s = row[j];
            for (uint32_t m = j + 1; m < i; m++)
                s = hpd_fma1(row[m], ws->A[m][j], s);
            ws->A[i][j] = s;
        }
    }
    /* u = T (v beta), w = T (k beta exp(gc)), T unit lower triangular */
    for (uint32_t i = 0; i < L; i++) {
        float *u = ws->u + (size_t)i * dv, *w = ws->w + (size_t)i * dk;
        memcpy(u, ws->vb + (size_t)i * dv, dv * sizeof(float));
        memcpy(w, ws->kbe + (size_t)i * dk, dk * sizeof(float));
        for (uint32_t j = 0; j < i; j++) {
            hpd_axpy(u, ws->A[i][j], ws->vb + (size_t)j * dv, dv);
            hpd_axpy(w, ws->A[i][j], ws->kbe + (size_t)j * dk, dk);
        }
    }
    /* v_new = u - w S */
    for (uint32_t i = 0; i < L; i++) {
        float *vn = ws->vn + (size_t)i * dv;
        const float *w = ws->w + (size_t)i * dk;
        memset(vn, 0, dv * sizeof(float));
        for (uint32_t x = 0; x < dk; x++)
            hpd_axpy(vn, w[x], S + (size_t)x * dv, dv);
        for (uint32_t d = 0; d < dv; d++)
            vn[d] = ws->u[(size_t)i * dv + d] - vn[d];
    }
    /* o_i = (q_i exp(gc_i)) S + sum_{j<=i} (q_i . k_j) exp(gc_i - gc_j) v_new_j */
    for (uint32_t i = 0; i < L; i++) {
        const float *q = at(&a->q, r0 + i, kh);
        float *o = at_mut(&a->out, r0 + i, h);
        const float egi = ws->eg[i];

        memset(o, 0, dv * sizeof(float));
        for (uint32_t x = 0; x < dk; x++)
            hpd_axpy(o, q[x] * egi, S + (size_t)x * dv, dv);
        for (uint32_t j = 0; j <= i; j++) {
            const float s = hpd_dot(q, at(&a->k, r0 + j, kh), dk) * ws->D[i][j];
            hpd_axpy(o, s, ws->vn + (size_t)j * dv, dv);
        }
    }
    /* S = exp(gc_last) S + sum_i (k_i exp(gc_last - gc_i)) v_new_i^T */
    const float elast = ws->eg[L - 1];
    for (uint32_t x = 0; x < dk; x++)
        hpd_scale(S + (size_t)x * dv, elast, dv);
    for (uint32_t i = 0; i < L; i++) {
        const float *k = at(&a->k, r0 + i, kh);
        const float e = ws->D[L - 1][i];
        for (uint32_t x = 0; x < dk; x++)
            hpd_axpy(S + (size_t)x * dv, k[x] * e, ws->vn + (size_t)i * dv, dv);
    }
}

static void chunked_head(const hpd_gdn_args_t *a, const hpd_seq_t *seq, float *S, uint32_t h,
                         chunk_ws_t *ws)
{
    uint32_t done = 0;

    while (done < seq->n_tokens) {
        const uint32_t pos = seq->start_pos + done;
        const uint32_t to_boundary = C - pos % C;
        const uint32_t L = to_boundary < seq->n_tokens - done ? to_boundary : seq->n_tokens - done;
        chunk_head(a, seq->row + done, L, S, h, ws);
        done += L;
    }
}

static hpd_status_t run_heads(hpd_backend_t *b, const hpd_gdn_args_t *a, bool chunked)
{
    const uint32_t total = a->n_seqs * a->nv;
    const size_t ws_floats = (size_t)C * (3 * a->dk + 3 * a->dv);
    hpd_status_t st = HPD_OK;

    if (a->nk == 0 || a->nv % a->nk != 0)
        return HPD_ERR_INVALID_ARG;
#pragma omp parallel num_threads(total > 1 ? hpd_cpu_threads(b) : 1)
    {
        chunk_ws_t *ws = malloc(sizeof(*ws));
        float *buf = malloc(ws_floats * sizeof(float));

        if (ws == NULL || buf == NULL) {
#pragma omp atomic write
            st = HPD_ERR_NO_MEMORY;
        } else {
            ws->kb = buf;
            ws->w = buf + (size_t)C * a->dk;
            ws->kbe = buf + (size_t)2 * C * a->dk;
            ws->u = buf + (size_t)3 * C * a->dk;
            ws->vn = ws->u + (size_t)C * a->dv;
            ws->vb = ws->vn + (size_t)C * a->dv;
        }
#pragma omp for schedule(dynamic, 1)
        for (uint32_t t = 0; t < total; t++) {
            const uint32_t s = t / a->nv, h = t % a->nv;
            float *S = a->states[s] + (size_t)h * a->dk * a->dv;
            if (ws == NULL || buf == NULL)
                continue;
            if (chunked)
                chunked_head(a, &a->seqs[s], S, h, ws);
            else
                recurrent_head(a, &a->seqs[s], S, h, ws->u);
        }
        free(buf);
        free(ws);
    }
    return st;
}

hpd_status_t hpd_cpu_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    return run_heads(b, a, true);
}

hpd_status_t hpd_cpu_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    return run_heads(b, a, false);
}
