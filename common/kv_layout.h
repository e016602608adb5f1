/* KV page layout descriptor and page addressing (docs/layouts.md).
 *
 * Full-attention layers are numbered a = 0..A-1 among themselves. Pack group
 * g = a / P, member m = a % P. One page holds P layers x B tokens,
 * layer-major, so one page is one contiguous transfer:
 *   NHD: page[m][kv][t][h][d]      HND: page[m][kv][h][t][d]
 * The addressing helpers are header-only so that every kernel backend
 * computes the same addresses. */
#ifndef HPD_COMMON_KV_LAYOUT_H
#define HPD_COMMON_KV_LAYOUT_H

#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

#include "common/hostdev.h" /* the addressing helpers run in CUDA kernels too */

typedef enum {
    HPD_KV_NHD = 0,
    HPD_KV_HND = 1,
} hpd_kv_order_t;

typedef struct {
    /* the layout proper */
    uint32_t block_size; /* B: tokens per page, a multiple of 16 */
    uint32_t pack_size;  /* P: full-attention layers per page, 1..A */
    hpd_kv_order_t order;
    hpd_dtype_t dtype;
    /* the model's KV shape */
    uint32_t n_layers;   /* A: full-attention layers */
    uint32_t n_kv_heads;
    uint32_t head_dim;
} hpd_kv_layout_t;

/* Number of pack groups, ceil(A / P). */
HPD_HOST_DEVICE static inline uint32_t hpd_kv_layout_n_groups(const hpd_kv_layout_t *l)
{
    return (l->n_layers + l->pack_size - 1) / l->pack_size;
}

/* Elements in one page: P * 2 * B * n_kv_heads * head_dim. */
HPD_HOST_DEVICE static inline uint64_t hpd_kv_layout_page_elems(const hpd_kv_layout_t *l)
{
    return (uint64_t)l->pack_size * 2 * l->block_size * l->n_kv_heads * l->head_dim;
}

static inline uint64_t hpd_kv_layout_page_bytes(const hpd_kv_layout_t *l)
{
    return hpd_kv_layout_page_elems(l) * hpd_dtype_size(l->dtype);
}

/* Element offset, inside a page, of the head_dim row for (member m, kv 0=K
 * 1=V, token t within the page, head h). */
HPD_HOST_DEVICE static inline uint64_t hpd_kv_layout_row(const hpd_kv_layout_t *l, uint32_t m,
                                                         uint32_t kv, uint32_t t, uint32_t h)
{
    const uint64_t B = l->block_size, NH = l->n_kv_heads, D = l->head_dim;
    const uint64_t base = ((uint64_t)m * 2 + kv) * B * NH;

    if (l->order == HPD_KV_NHD)
        return (base + (uint64_t)t * NH + h) * D;
    return (base + (uint64_t)h * B + t) * D;
}

/* Checks B (multiple of 16, at most 4096), P (1..A) and the shape; logs
 * what is wrong with the value and what is allowed. */
hpd_status_t hpd_kv_layout_validate(const hpd_kv_layout_t *layout);

/* Parses "B,P,nhd|hnd" (e.g. "64,1,nhd") into the layout part of *layout_p;
 * the shape fields are left as they are. */
hpd_status_t hpd_kv_layout_parse(const char *text, hpd_kv_layout_t *layout_p);

/* Writes "B=64 P=1 NHD f32" into out. */
void hpd_kv_layout_format(const hpd_kv_layout_t *layout, char *out, uint32_t len);

#endif
