/* The canonical order of a row-parallel product's sum (issue 37;
 * docs/tensor_parallel.md, "The canonical reduction"): the same bits at
 * every TP degree.
 *
 * A sum over K (a row-parallel product's inner dimension, which TP splits
 * across ranks) is cut into HPD_TP_GROUPS contiguous groups, group g
 * [g * K / 8, (g + 1) * K / 8) rounded down (hpd_tp_group). Each group is
 * summed in one fixed sequence: here in index order in fp32, from 0; in
 * the engine, the GEMM kernel's own sequence over the group's columns.
 * The 8 partials are combined by one fixed binary tree,
 * ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). At TP N a rank holds
 * groups [r * 8 / N, (r + 1) * 8 / N) of K and computes their partials;
 * the partials of every rank are gathered (never summed by a collective
 * whose order depends on message sizes) and every rank combines all 8
 * with the same tree: TP 1's bits at TP 1, 2, 4 and 8. */
#ifndef HPD_KERNELS_TP_SUM_H
#define HPD_KERNELS_TP_SUM_H

#include <stdint.h>

#include "common/hostdev.h"

#define HPD_TP_GROUPS 8

/* n values (1, 2, 4 or 8) combined by the fixed pairwise tree: the adds of
 * one level, left to right, then the next level. Every backend's tp_sum op
 * and the engine's group sums meet in this order. */
static inline HPD_HOST_DEVICE float hpd_tp_tree(const float *p, uint32_t n)
{
    float a[HPD_TP_GROUPS];
    for (uint32_t i = 0; i < n; i++)
        a[i] = p[i];
    for (uint32_t w = n; w > 1; w /= 2)
        for (uint32_t i = 0; i < w / 2; i++)
            a[i] = a[2 * i] + a[2 * i + 1];
    return a[0];
}

/* The partials of groups [g0, g1) of the dot product of x and w, each K/8
 * long: x and w point at group g0's first element (a rank's own slice),
 * partials[g - g0] receives group g's sum. k is the whole K. */
void hpd_tp_partials(const float *x, const float *w, uint32_t k, uint32_t g0, uint32_t g1,
                     float *partials);

/* The 8 partials combined by the fixed tree. */
float hpd_tp_combine(const float partials[HPD_TP_GROUPS]);

#endif
