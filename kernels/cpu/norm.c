/* RMSNorm (zero-centred and plain), gated RMSNorm and L2 norm on the CPU. */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

static inline float *at(const hpd_view_t *v, uint32_t t, uint32_t h)
{
    return v->p + (size_t)t * v->ld + (size_t)h * v->hs;
}

static inline float sum_squares(const float *x, uint32_t n)
{
    return hpd_dot(x, x, n);
}

hpd_status_t hpd_cpu_rmsnorm(hpd_backend_t *b, const hpd_rmsnorm_args_t *a)
{
    const uint32_t rows = a->n_tokens * a->n_heads;
    const int threads = (uint64_t)rows * a->dim >= (1u << 15) ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t r = 0; r < rows; r++) {
        const uint32_t t = r / a->n_heads, h = r % a->n_heads;
        const float *x = at(&a->x, t, h);
        float *y = at(&a->y, t, h);
        const float inv = 1.0f / sqrtf(sum_squares(x, a->dim) / (float)a->dim + a->eps);

        for (uint32_t d = 0; d < a->dim; d++) {
            const float w = a->zero_centred ? 1.0f + a->w[d] : a->w[d];
            y[d] = (x[d] * inv) * w;
        }
    }
    return HPD_OK;
}

hpd_status_t hpd_cpu_gated_rmsnorm(hpd_backend_t *b, const hpd_gated_rmsnorm_args_t *a)
{
    const uint32_t rows = a->n_tokens * a->n_heads;
    const int threads = (uint64_t)rows * a->dim >= (1u << 15) ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t r = 0; r < rows; r++) {
        const uint32_t t = r / a->n_heads, h = r % a->n_heads;
        const float *x = at(&a->x, t, h);
        const float *z = at(&a->z, t, h);
        float *y = at(&a->y, t, h);
        const float inv = 1.0f / sqrtf(sum_squares(x, a->dim) / (float)a->dim + a->eps);

        for (uint32_t d = 0; d < a->dim; d++) {
            const float silu = z[d] / (1.0f + expf(-z[d]));
            y[d] = ((x[d] * inv) * a->w[d]) * silu;
        }
    }
    return HPD_OK;
}

hpd_status_t hpd_cpu_l2norm(hpd_backend_t *b, const hpd_l2norm_args_t *a)
{
    const uint32_t rows = a->n_tokens * a->n_heads;
    const int threads = (uint64_t)rows * a->dim >= (1u << 15) ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(static) num_threads(threads)
    for (uint32_t r = 0; r < rows; r++) {
        float *x = at(&a->x, r / a->n_heads, r % a->n_heads);
        const float inv = 1.0f / sqrtf(sum_squares(x, a->dim) + a->eps);

        for (uint32_t d = 0; d < a->dim; d++)
            x[d] = (x[d] * inv) * a->scale;
    }
    return HPD_OK;
}
