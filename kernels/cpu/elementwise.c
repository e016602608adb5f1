/* Embedding, RoPE, SwiGLU, the attention gate and GDN gating on the CPU. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/tp_sum.h"
#include "common/log.h"

static inline float *at(const hpd_view_t *v, uint32_t t, uint32_t h)
{
    return v->p + (size_t)t * v->ld + (size_t)h * v->hs;
}

hpd_status_t hpd_cpu_embed(hpd_backend_t *b, const hpd_embed_args_t *a)
{
    const size_t row = (size_t)a->dim * hpd_dtype_size(a->dtype);
    for (uint32_t i = 0; i < a->n; i++)
        hpd_dtype_to_f32(a->dtype, (const char *)a->table + (size_t)a->ids[i] * row,
                         a->out + (size_t)i * a->ld, a->dim);
    return HPD_OK;
}

hpd_status_t hpd_cpu_rope(hpd_backend_t *b, const hpd_rope_args_t *a)
{
    const uint32_t half = a->rot_dim / 2;
    float inv_freq[HPD_ROPE_MAX_HALF];

    if (half > HPD_ROPE_MAX_HALF)
        return HPD_ERR_UNSUPPORTED;
    /* as Hugging Face computes it, in fp32: the table the CUDA backend uses
     * too (backend.h) */
    hpd_rope_inv_freq_table(a, inv_freq);
    const bool yarn = a->yarn_factor > 0.0f;
    const int threads = (uint64_t)a->n_tokens * a->n_heads * half >= (1u << 14)
                            ? hpd_cpu_threads(b)
                            : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        float cs[HPD_ROPE_MAX_HALF], sn[HPD_ROPE_MAX_HALF];
        const float pos = (float)a->positions[t];

        for (uint32_t i = 0; i < half; i++) {
            const float f = pos * inv_freq[i];
            cs[i] = yarn ? cosf(f) * a->yarn_attention : cosf(f);
            sn[i] = yarn ? sinf(f) * a->yarn_attention : sinf(f);
        }
        for (uint32_t h = 0; h < a->n_heads; h++) {
            float *x = at(&a->x, t, h);
            for (uint32_t i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * cs[i] - x2 * sn[i];
                x[i + half] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
    return HPD_OK;
}

hpd_status_t hpd_cpu_silu_mul(hpd_backend_t *b, const hpd_silu_mul_args_t *a)
{
    const int threads =
        (uint64_t)a->n_tokens * a->inter >= (1u << 15) ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        const float *g = a->gu + (size_t)t * a->ldgu, *u = g + a->inter;
        float *o = a->out + (size_t)t * a->ldout;
        uint32_t i = 0;
        for (; i + 8 <= a->inter; i += 8) /* each lane as the tail's hpd_silu1 */
            hpd_v8_store(o + i, hpd_v8_mul(hpd_v8_silu(hpd_v8_load(g + i)), hpd_v8_load(u + i)));
        for (; i < a->inter; i++)
            o[i] = hpd_silu1(g[i]) * u[i];
    }
    return HPD_OK;
}

hpd_status_t hpd_cpu_sigmoid_mul(hpd_backend_t *b, const hpd_sigmoid_mul_args_t *a)
{
    const int threads = (uint64_t)a->n_tokens * a->n_heads * a->dim >= (1u << 15)
                            ? hpd_cpu_threads(b)
                            : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        for (uint32_t h = 0; h < a->n_heads; h++) {
            float *x = at(&a->x, t, h);
            const float *g = at(&a->gate, t, h);
            uint32_t d = 0;
            for (; d + 8 <= a->dim; d += 8) /* each lane as the tail's hpd_sigmoid1 */
                hpd_v8_store(x + d,
                             hpd_v8_mul(hpd_v8_load(x + d), hpd_v8_sigmoid(hpd_v8_load(g + d))));
            for (; d < a->dim; d++)
                x[d] = x[d] * hpd_sigmoid1(g[d]);
        }
    }
    return HPD_OK;
}

static inline float softplus(float x)
{
    /* PyTorch's softplus: linear above a threshold of 20 */
    return x > 20.0f ? x : log1pf(expf(x));
}

hpd_status_t hpd_cpu_gdn_gating(hpd_backend_t *b, const hpd_gdn_gating_args_t *a)
{
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        for (uint32_t h = 0; h < a->nv; h++) {
            const float av = a->a[(size_t)t * a->lda + h];
            const float bv = a->b[(size_t)t * a->ldb + h];
            a->g[(size_t)t * a->nv + h] = -expf(a->a_log[h]) * softplus(av + a->dt_bias[h]);
            a->beta[(size_t)t * a->nv + h] = 1.0f / (1.0f + expf(-bv));
        }
    }
    return HPD_OK;
}

/* y = (acc ? y + s : s) for one row, s the tree of n parts written out
 * (the same pairs and roundings as hpd_tp_tree: adds only, which the
 * compiler neither contracts nor reorders), so that it vectorises */
static void tp_sum_row(float *y, const float *const *p, size_t off, uint32_t n,
                       uint32_t n_parts, bool acc)
{
    const float *p0 = p[0] + off, *p1 = n_parts > 1 ? p[1] + off : NULL;
    const float *p2 = n_parts > 2 ? p[2] + off : NULL;
    const float *p3 = n_parts > 2 ? p[3] + off : NULL;
    const float *p4 = n_parts > 4 ? p[4] + off : NULL;
    const float *p5 = n_parts > 4 ? p[5] + off : NULL;
    const float *p6 = n_parts > 4 ? p[6] + off : NULL;
    const float *p7 = n_parts > 4 ? p[7] + off : NULL;
#define TP_SUM_LOOP(expr)                                                                       \
    do {                                                                                        \
        if (acc)                                                                                \
            for (uint32_t c = 0; c < n; c++)                                                    \
                y[c] = y[c] + (expr);                                                           \
        else                                                                                    \
            for (uint32_t c = 0; c < n; c++)                                                    \
                y[c] = (expr);                                                                  \
    } while (0)
    switch (n_parts) {
    case 1: TP_SUM_LOOP(p0[c]); break;
    case 2: TP_SUM_LOOP(p0[c] + p1[c]); break;
    case 4: TP_SUM_LOOP((p0[c] + p1[c]) + (p2[c] + p3[c])); break;
    default:
        TP_SUM_LOOP(((p0[c] + p1[c]) + (p2[c] + p3[c])) + ((p4[c] + p5[c]) + (p6[c] + p7[c])));
        break;
    }
#undef TP_SUM_LOOP
}

hpd_status_t hpd_cpu_tp_sum(hpd_backend_t *b, const hpd_tp_sum_args_t *a)
{
    if (a->n_parts < 1 || a->n_parts > HPD_TP_GROUPS || (a->n_parts & (a->n_parts - 1)) != 0) {
        HPD_LOG_ERROR("cpu", "tp_sum of %u parts (expected 1, 2, 4 or 8)", a->n_parts);
        return HPD_ERR_INVALID_ARG;
    }
    /* y may be a part: each element is read before it is written */
    const int threads = (uint64_t)a->m * a->n * a->n_parts >= (1u << 16) ? hpd_cpu_threads(b) : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t r = 0; r < a->m; r++)
        tp_sum_row(a->y + (size_t)r * a->ldy, a->parts, (size_t)r * a->ld_parts, a->n,
                   a->n_parts, a->accumulate);
    return HPD_OK;
}
