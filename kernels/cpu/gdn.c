/* The gated delta rule on the CPU: the chunked (WY/UT) form for prefill and
 * the recurrent step for decode (docs/kernels.md has the math).
 *
 * Per value head h with key head h / (nv/nk) and state S[dk][dv]:
 *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
 * Chunks sit on the absolute grid of HPD_GDN_CHUNK positions, so a sequence
 * resumed from a state taken at a multiple of 64 computes exactly the same
 * chunks, bit for bit, as one pass over the whole sequence. */
#include <math.h>
#include <stdbool.h>
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

/* ---- small products inside a chunk: C[i][n] += sum_k A[i][k] B[k][n],
 * k ascending, one FMA each, rows of C held in registers 4 x 16 at a time
 * (the row axpys they replace loaded and stored C at every k) */

static void mm_4x16(float *c, size_t ldc, const float *a, size_t lda, const float *b,
                    size_t ldb, uint32_t K)
{
    float *c1 = c + ldc, *c2 = c + 2 * ldc, *c3 = c + 3 * ldc;
    hpd_v8_t c00 = hpd_v8_load(c), c01 = hpd_v8_load(c + 8);
    hpd_v8_t c10 = hpd_v8_load(c1), c11 = hpd_v8_load(c1 + 8);
    hpd_v8_t c20 = hpd_v8_load(c2), c21 = hpd_v8_load(c2 + 8);
    hpd_v8_t c30 = hpd_v8_load(c3), c31 = hpd_v8_load(c3 + 8);
    for (uint32_t k = 0; k < K; k++) {
        const hpd_v8_t b0 = hpd_v8_load(b + k * ldb), b1 = hpd_v8_load(b + k * ldb + 8);
        hpd_v8_t x = hpd_v8_set1(a[k]);
        c00 = hpd_v8_fma(x, b0, c00), c01 = hpd_v8_fma(x, b1, c01);
        x = hpd_v8_set1(a[lda + k]);
        c10 = hpd_v8_fma(x, b0, c10), c11 = hpd_v8_fma(x, b1, c11);
        x = hpd_v8_set1(a[2 * lda + k]);
        c20 = hpd_v8_fma(x, b0, c20), c21 = hpd_v8_fma(x, b1, c21);
        x = hpd_v8_set1(a[3 * lda + k]);
        c30 = hpd_v8_fma(x, b0, c30), c31 = hpd_v8_fma(x, b1, c31);
    }
    hpd_v8_store(c, c00), hpd_v8_store(c + 8, c01);
    hpd_v8_store(c1, c10), hpd_v8_store(c1 + 8, c11);
    hpd_v8_store(c2, c20), hpd_v8_store(c2 + 8, c21);
    hpd_v8_store(c3, c30), hpd_v8_store(c3 + 8, c31);
}

static void mm_1x16(float *c, const float *a, const float *b, size_t ldb, uint32_t K)
{
    hpd_v8_t c0 = hpd_v8_load(c), c1 = hpd_v8_load(c + 8);
    for (uint32_t k = 0; k < K; k++) {
        const hpd_v8_t x = hpd_v8_set1(a[k]);
        c0 = hpd_v8_fma(x, hpd_v8_load(b + k * ldb), c0);
        c1 = hpd_v8_fma(x, hpd_v8_load(b + k * ldb + 8), c1);
    }
    hpd_v8_store(c, c0), hpd_v8_store(c + 8, c1);
}

/* lower: a is lower triangular (a[i][k] = 0 for k > i): row i reads k <= i
 * only (a block of 4 rows up to its last row's), so an Inf or NaN of a
 * later row of b cannot reach an earlier row of c */
static void mm_acc(float *c, size_t ldc, const float *a, size_t lda, const float *b, size_t ldb,
                   uint32_t M, uint32_t N, uint32_t K, bool lower)
{
#define KMAX(last) (lower && (last) + 1 < K ? (last) + 1 : K)
    uint32_t n = 0;
    for (; n + 16 <= N; n += 16) {
        uint32_t i = 0;
        for (; i + 4 <= M; i += 4)
            mm_4x16(c + i * ldc + n, ldc, a + i * lda, lda, b + n, ldb, KMAX(i + 3));
        for (; i < M; i++)
            mm_1x16(c + i * ldc + n, a + i * lda, b + n, ldb, KMAX(i));
    }
    for (; n < N; n++) /* columns left over (head dims not a multiple of 16) */
        for (uint32_t i = 0; i < M; i++) {
            float v = c[i * ldc + n];
            for (uint32_t k = 0; k < KMAX(i); k++)
                v = hpd_fma1(a[i * lda + k], b[k * ldb + n], v);
            c[i * ldc + n] = v;
        }
#undef KMAX
}

typedef struct {
    float A[C][C];  /* strictly lower: the UT system, then T = (I + L)^-1; zero above */
    float P[C][C];  /* (k_i beta . k_j), then (q_i . k_j) exp(gc_i - gc_j) for j <= i */
    float D[C][C];  /* lower: exp(gc_i - gc_j), each computed once */
    float gc[C];    /* cumulative g inside the chunk */
    float eg[C];    /* exp(gc_i) */
    float *kb;      /* [C][dk] k * beta */
    float *kbe;     /* [C][dk] k * beta * exp(gc) */
    float *qe;      /* [C][dk] q * exp(gc) */
    float *kt;      /* [dk][C] k transposed */
    float *kte;     /* [dk][C] k * exp(gc_last - gc_i), transposed */
    float *vb;      /* [C][dv] v * beta */
    float *u;       /* [C][dv] T (v * beta) */
    float *w;       /* [C][dk] T (k * beta * exp(gc)) */
    float *vn;      /* [C][dv] u - w S: the new values */
} chunk_ws_t;

/* floats of a chunk_ws_t's buffers */
static size_t ws_floats(uint32_t dk, uint32_t dv)
{
    return (size_t)C * (6 * dk + 3 * dv);
}

static void ws_carve(chunk_ws_t *ws, float *buf, uint32_t dk, uint32_t dv)
{
    float **dks[] = {&ws->kb, &ws->kbe, &ws->qe, &ws->kt, &ws->kte, &ws->w};
    float **dvs[] = {&ws->vb, &ws->u, &ws->vn};
    for (int i = 0; i < 6; i++, buf += (size_t)C * dk)
        *dks[i] = buf;
    for (int i = 0; i < 3; i++, buf += (size_t)C * dv)
        *dvs[i] = buf;
}

/* One chunk of L rows starting at batch row r0, state S updated in place.
 * The gates (exp(gc_i), exp(gc_i - gc_j)) and the scaled rows are computed
 * once per chunk; every product is a small matrix product (mm_acc) with the
 * formulas of docs/kernels.md: K K^T and Q K^T, the triangular solve row by
 * row, u and w as T times the scaled rows, v_new = u - w S, the output
 * (Q e^gc) S + (Q K^T o D) v_new, the state e^gc_last S + (K e^(gc_last - gc))^T v_new. */
static void chunk_head(const hpd_gdn_args_t *a, uint32_t r0, uint32_t L, float *S, uint32_t h,
                       chunk_ws_t *ws)
{
    const uint32_t dk = a->dk, dv = a->dv, nv = a->nv, kh = h / (a->nv / a->nk);
    float acc = 0.0f;

    for (uint32_t i = 0; i < L; i++) {
        const float beta = a->beta[(size_t)(r0 + i) * nv + h];
        const float *k = at(&a->k, r0 + i, kh), *v = at(&a->v, r0 + i, h);
        const float *q = at(&a->q, r0 + i, kh);
        acc += a->g[(size_t)(r0 + i) * nv + h];
        ws->gc[i] = acc;
        ws->eg[i] = expf(acc);
        for (uint32_t x = 0; x < dk; x++) {
            ws->kb[(size_t)i * dk + x] = k[x] * beta;
            ws->kbe[(size_t)i * dk + x] = ws->kb[(size_t)i * dk + x] * ws->eg[i];
            ws->qe[(size_t)i * dk + x] = q[x] * ws->eg[i];
            ws->kt[(size_t)x * C + i] = k[x];
        }
        for (uint32_t d = 0; d < dv; d++)
            ws->vb[(size_t)i * dv + d] = v[d] * beta;
    }
    for (uint32_t i = 0; i < L; i++) { /* the kernels' exp, a lane as alone */
        const hpd_v8_t gi = hpd_v8_set1(ws->gc[i]);
        uint32_t j = 0;
        for (; j + 8 <= i + 1; j += 8)
            hpd_v8_store(&ws->D[i][j], hpd_v8_exp(hpd_v8_sub(gi, hpd_v8_load(ws->gc + j))));
        for (; j <= i; j++)
            ws->D[i][j] = hpd_exp1(ws->gc[i] - ws->gc[j]);
    }

    /* A[i][j] = -(kb_i . k_j) exp(gc_i - gc_j), j < i; then forward
     * substitution row by row: A[i][j] += sum_{j<m<i} A_orig[i][m] A[m][j]. */
    memset(ws->P, 0, sizeof(ws->P));
    mm_acc(&ws->P[0][0], C, ws->kb, dk, ws->kt, C, L, L, dk, false);
    memset(ws->A, 0, sizeof(ws->A));
    for (uint32_t i = 0; i < L; i++) {
        float row[C];
        for (uint32_t j = 0; j < i; j++)
            row[j] = -ws->P[i][j] * ws->D[i][j];
        for (uint32_t j = 0; j < i; j++) {
            float s = row[j];
            for (uint32_t m = j + 1; m < i; m++)
                s = hpd_fma1(row[m], ws->A[m][j], s);
            ws->A[i][j] = s;
        }
    }
    /* u = T (v beta), w = T (k beta exp(gc)), T unit lower triangular */
    memcpy(ws->u, ws->vb, (size_t)L * dv * sizeof(float));
    memcpy(ws->w, ws->kbe, (size_t)L * dk * sizeof(float));
    mm_acc(ws->u, dv, &ws->A[0][0], C, ws->vb, dv, L, dv, L, true);
    mm_acc(ws->w, dk, &ws->A[0][0], C, ws->kbe, dk, L, dk, L, true);
    /* v_new = u - w S */
    memset(ws->vn, 0, (size_t)L * dv * sizeof(float));
    mm_acc(ws->vn, dv, ws->w, dk, S, dv, L, dv, dk, false);
    for (size_t e = 0; e < (size_t)L * dv; e++)
        ws->vn[e] = ws->u[e] - ws->vn[e];
    /* o = (q exp(gc)) S + P v_new, P[i][j] = (q_i . k_j) exp(gc_i - gc_j), j <= i */
    memset(ws->P, 0, sizeof(ws->P));
    mm_acc(&ws->P[0][0], C, at(&a->q, r0, kh), a->q.ld, ws->kt, C, L, L, dk, false);
    for (uint32_t i = 0; i < L; i++) {
        for (uint32_t j = 0; j <= i; j++)
            ws->P[i][j] *= ws->D[i][j];
        for (uint32_t j = i + 1; j < L; j++)
            ws->P[i][j] = 0.0f;
    }
    float *o = at_mut(&a->out, r0, h);
    for (uint32_t i = 0; i < L; i++)
        memset(o + (size_t)i * a->out.ld, 0, dv * sizeof(float));
    mm_acc(o, a->out.ld, ws->qe, dk, S, dv, L, dv, dk, false);
    mm_acc(o, a->out.ld, &ws->P[0][0], C, ws->vn, dv, L, dv, L, true);
    /* S = exp(gc_last) S + sum_i (k_i exp(gc_last - gc_i)) v_new_i^T */
    const float elast = ws->eg[L - 1];
    for (uint32_t x = 0; x < dk; x++) {
        hpd_scale(S + (size_t)x * dv, elast, dv);
        for (uint32_t i = 0; i < L; i++)
            ws->kte[(size_t)x * C + i] = ws->kt[(size_t)x * C + i] * ws->D[L - 1][i];
    }
    mm_acc(S, dv, ws->kte, C, ws->vn, dv, dk, dv, L, false);
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
    hpd_status_t st = HPD_OK;

    if (a->nk == 0 || a->nv % a->nk != 0)
        return HPD_ERR_INVALID_ARG;
#pragma omp parallel num_threads(total > 1 ? hpd_cpu_threads(b) : 1)
    {
        chunk_ws_t *ws = malloc(sizeof(*ws));
        float *buf = malloc(ws_floats(a->dk, a->dv) * sizeof(float));

        if (ws == NULL || buf == NULL) {
#pragma omp atomic write
            st = HPD_ERR_NO_MEMORY;
        } else {
            ws_carve(ws, buf, a->dk, a->dv);
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
