/* KV layout translation and slot copies on the CPU. */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

static inline uint8_t *row_addr(const hpd_kv_span_t *s, uint32_t layer, uint32_t kv, uint32_t pos,
                                uint32_t h, size_t elem)
{
    const hpd_kv_layout_t *l = s->layout;
    const uint32_t g = layer / l->pack_size, m = layer % l->pack_size;
    const uint32_t page = s->tables[g][pos / l->block_size];

    return (uint8_t *)s->pool +
           ((size_t)page * hpd_kv_layout_page_elems(l) +
            hpd_kv_layout_row(l, m, kv, pos % l->block_size, h)) * elem;
}

hpd_status_t hpd_cpu_kv_translate(hpd_backend_t *b, const hpd_kv_translate_args_t *a)
{
    const hpd_kv_layout_t *sl = a->src.layout, *dl = a->dst.layout;
    const size_t elem = hpd_dtype_size(sl->dtype), row = (size_t)sl->head_dim * elem;

    const uint32_t l0 = a->first_layer, l1 = a->n_layers ? l0 + a->n_layers : sl->n_layers;

    if (!hpd_kv_translate_fits(a))
        return HPD_ERR_INVALID_ARG;
    const uint32_t heads = a->heads ? a->heads : dl->n_kv_heads, h0 = a->dst_head;
    for (uint32_t layer = l0; layer < l1; layer++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t i = 0; i < a->n_tokens; i++)
                for (uint32_t h = 0; h < heads; h++)
                    memcpy(row_addr(&a->dst, layer, kv, a->dst.pos + i, h0 + h, elem),
                           row_addr(&a->src, layer, kv, a->src.pos + i, a->src_head + h, elem),
                           row);
    if (a->zero_tail && a->n_tokens > 0) {
        const uint32_t end = a->dst.pos + a->n_tokens;
        const uint32_t page_end = (end + dl->block_size - 1) / dl->block_size * dl->block_size;
        for (uint32_t layer = l0; layer < l1; layer++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t p = end; p < page_end; p++)
                    for (uint32_t h = 0; h < heads; h++)
                        memset(row_addr(&a->dst, layer, kv, p, h0 + h, elem), 0, row);
    }
    return HPD_OK;
}

hpd_status_t hpd_cpu_slot_copy(hpd_backend_t *b, const hpd_slot_copy_args_t *a)
{
    memmove(a->dst, a->src, a->bytes);
    return HPD_OK;
}
