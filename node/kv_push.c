/* A prefill node's KV push (node/kv_push.h). */
#include "node/kv_push.h"

#include <stdlib.h>

#include "common/util.h"

hpd_status_t hpd_kv_push(hpd_xfer_peer_t *p, uint64_t xfer_id, const hpd_kv_push_args_t *a)
{
    const hpd_kv_layout_t *dl = a->dst_layout;
    const uint32_t B = dl->block_size, groups = hpd_kv_layout_n_groups(dl);
    const uint32_t j0 = a->first_token / B, j1 = HPD_DIV_UP(a->n_tokens, B);
    const uint32_t stride = groups > 0 ? a->staging_pages / groups : 0;
    const uint64_t page_bytes = hpd_kv_layout_page_bytes(dl);
    const uint32_t g0 = a->group == UINT32_MAX ? 0 : a->group;
    const uint32_t g1 = a->group == UINT32_MAX ? groups : a->group + 1;
    const uint32_t *tables[256];
    hpd_status_t st = HPD_OK;

    if (g1 > groups || groups > 256 || j1 > stride || a->n_srcs == 0 || a->first_token % B != 0 ||
        a->first_token >= a->n_tokens || (!a->last && a->n_tokens % B != 0))
        return HPD_ERR_INVALID_ARG;
    uint32_t *ids = malloc((size_t)groups * stride * sizeof(uint32_t));
    hpd_xfer_put_t *puts = malloc((j1 - j0) * sizeof(*puts));
    if (ids == NULL || puts == NULL) {
        free(ids);
        free(puts);
        return HPD_ERR_NO_MEMORY;
    }
    for (uint32_t g = 0; g < groups; g++) {
        for (uint32_t j = 0; j < stride; j++)
            ids[(size_t)g * stride + j] = g * stride + j;
        tables[g] = ids + (size_t)g * stride;
    }
    for (uint32_t g = g0; g < g1 && st == HPD_OK; g++) {
        const uint32_t first = g * dl->pack_size;
        for (uint32_t s = 0; s < a->n_srcs && st == HPD_OK; s++) {
            hpd_kv_span_t src = a->srcs[s].span;
            src.pos = a->first_token;
            const hpd_kv_translate_args_t t = {
                .src = src,
                .dst = {.layout = dl, .pool = a->staging, .tables = tables, .pos = a->first_token},
                .n_tokens = a->n_tokens - a->first_token,
                .zero_tail = a->last,
                .first_layer = first,
                .n_layers = HPD_MIN(dl->pack_size, dl->n_layers - first),
                .src_head = a->srcs[s].src_head,
                .heads = a->srcs[s].heads,
                .dst_head = a->srcs[s].dst_head};
            st = hpd_kv_translate(a->backend, &t);
        }
        /* the NIC reads the staging buffer after the translations landed:
         * the puts wait on a fence after them */
        void *fence;
        if (st != HPD_OK || (st = hpd_backend_fence_record(a->backend, &fence)) != HPD_OK)
            break;
        for (uint32_t j = j0; j < j1; j++)
            puts[j - j0] = (hpd_xfer_put_t){.local = (const uint8_t *)a->staging +
                                                     (uint64_t)tables[g][j] * page_bytes,
                                            .region = a->dst_region,
                                            .offset = (uint64_t)a->dst_tables[g][j] * page_bytes,
                                            .bytes = page_bytes};
        st = hpd_xfer_put_after(p, xfer_id, puts, j1 - j0, a->backend, fence);
    }
    free(ids);
    free(puts);
    return st;
}
