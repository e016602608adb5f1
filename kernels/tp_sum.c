/* The canonical order of a row-parallel product's sum (kernels/tp_sum.h). */
#include "kernels/tp_sum.h"

void hpd_tp_partials(const float *x, const float *w, uint32_t k, uint32_t g0, uint32_t g1,
                     float *partials)
{
    const uint32_t n = k / HPD_TP_GROUPS;
    for (uint32_t g = g0; g < g1; g++) {
        const float *xg = x + (uint64_t)(g - g0) * n, *wg = w + (uint64_t)(g - g0) * n;
        float s = 0.0f;
        for (uint32_t i = 0; i < n; i++)
            s += xg[i] * wg[i];
        partials[g - g0] = s;
    }
}

float hpd_tp_combine(const float p[HPD_TP_GROUPS])
{
    return hpd_tp_tree(p, HPD_TP_GROUPS);
}
