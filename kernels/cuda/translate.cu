/* KV layout translation and slot copies on the GPU: one block per (layer,
 * K/V, token, head) row, copying the row's bytes in 32-bit words (bytes
 * when the row is not a multiple of 4). The block tables are staged from
 * host memory: for each pack group, the pages covering the span. */
#include <stdlib.h>

#include "kernels/cuda/cuda_ops.h"

typedef struct {
    hpd_kv_layout_t l;
    char *pool;
    const uint32_t *pages; /* [groups][n_blocks], from block first_block */
    uint32_t first_block, n_blocks, pos;
} span_t;

__device__ static char *row_addr(const span_t *s, uint32_t layer, uint32_t kv, uint32_t pos,
                                 uint32_t h, size_t elem)
{
    const uint32_t g = layer / s->l.pack_size, m = layer % s->l.pack_size;
    const uint32_t page = s->pages[(size_t)g * s->n_blocks + pos / s->l.block_size -
                                   s->first_block];
    return s->pool + ((size_t)page * hpd_kv_layout_page_elems(&s->l) +
                      hpd_kv_layout_row(&s->l, m, kv, pos % s->l.block_size, h)) * elem;
}

/* rows: [layers][2][tokens][heads]; tail rows (zero) follow when n_tail */
__global__ void translate_kernel(span_t src, span_t dst, uint32_t l0, uint32_t n_tokens,
                                 uint32_t n_tail, size_t elem, uint32_t row_bytes,
                                 uint32_t src_head, uint32_t heads, uint32_t dst_head)
{
    /* src heads [src_head, src_head + heads) to dst heads [dst_head, ...) */
    const uint32_t per_layer_copy = 2 * n_tokens * heads, per_layer_tail = 2 * n_tail * heads;
    uint32_t r = blockIdx.x;
    const uint32_t per_layer = per_layer_copy + per_layer_tail;
    const uint32_t layer = l0 + r / per_layer;
    r %= per_layer;
    if (r < per_layer_copy) {
        const uint32_t kv = r / (n_tokens * heads), t = (r / heads) % n_tokens, h = r % heads;
        const char *from = row_addr(&src, layer, kv, src.pos + t, src_head + h, elem);
        char *to = row_addr(&dst, layer, kv, dst.pos + t, dst_head + h, elem);
        if (row_bytes % 4 == 0)
            for (uint32_t i = threadIdx.x; i < row_bytes / 4; i += blockDim.x)
                ((uint32_t *)to)[i] = ((const uint32_t *)from)[i];
        else
            for (uint32_t i = threadIdx.x; i < row_bytes; i += blockDim.x)
                to[i] = from[i];
    } else {
        r -= per_layer_copy;
        const uint32_t kv = r / (n_tail * heads), t = (r / heads) % n_tail, h = r % heads;
        char *to = row_addr(&dst, layer, kv, dst.pos + n_tokens + t, dst_head + h, elem);
        for (uint32_t i = threadIdx.x; i < row_bytes; i += blockDim.x)
            to[i] = 0;
    }
}

/* A span's fields and, in a host array the caller frees, the pages of
 * every group covering [pos, end) (NULL when out of memory). */
static uint32_t *flatten_span(const hpd_kv_span_t *s, uint32_t end, span_t *out,
                              size_t *bytes_p)
{
    const hpd_kv_layout_t *l = s->layout;
    const uint32_t groups = hpd_kv_layout_n_groups(l);
    out->l = *l;
    out->pool = (char *)s->pool;
    out->pos = s->pos;
    out->first_block = s->pos / l->block_size;
    out->n_blocks = (end + l->block_size - 1) / l->block_size - out->first_block;
    *bytes_p = (size_t)groups * out->n_blocks * sizeof(uint32_t);
    uint32_t *flat = (uint32_t *)malloc(*bytes_p ? *bytes_p : 1);
    if (flat == NULL)
        return NULL;
    for (uint32_t g = 0; g < groups; g++)
        for (uint32_t j = 0; j < out->n_blocks; j++)
            flat[(size_t)g * out->n_blocks + j] = s->tables[g][out->first_block + j];
    return flat;
}

hpd_status_t hpd_cuda_kv_translate(hpd_backend_t *b, const hpd_kv_translate_args_t *a)
{
    const hpd_kv_layout_t *sl = a->src.layout, *dl = a->dst.layout;
    const size_t elem = hpd_dtype_size(sl->dtype);
    const uint32_t l0 = a->first_layer, l1 = a->n_layers ? l0 + a->n_layers : sl->n_layers;
    span_t src, dst;
    hpd_status_t st;

    if (!hpd_kv_translate_fits(a))
        return HPD_ERR_INVALID_ARG;
    if (a->n_tokens == 0)
        return HPD_OK;
    const uint32_t end = a->dst.pos + a->n_tokens;
    const uint32_t page_end = (end + dl->block_size - 1) / dl->block_size * dl->block_size;
    const uint32_t n_tail = a->zero_tail ? page_end - end : 0;
    size_t src_bytes, dst_bytes;
    void *src_pages, *dst_pages;
    uint32_t *sf = flatten_span(&a->src, a->src.pos + a->n_tokens, &src, &src_bytes);
    uint32_t *df = flatten_span(&a->dst, end + n_tail, &dst, &dst_bytes);
    if (sf == NULL || df == NULL) {
        free(sf);
        free(df);
        return HPD_ERR_NO_MEMORY;
    }
    const hpd_cuda_meta_t m[] = {{.host = sf, .bytes = src_bytes, .dev_p = &src_pages},
                                 {.host = df, .bytes = dst_bytes, .dev_p = &dst_pages}};
    st = hpd_cuda_stage(b, m, 2);
    free(sf);
    free(df);
    if (st != HPD_OK)
        return st;
    src.pages = (const uint32_t *)src_pages;
    dst.pages = (const uint32_t *)dst_pages;
    const uint32_t heads = a->heads ? a->heads : dl->n_kv_heads;
    const uint64_t rows = (uint64_t)(l1 - l0) * 2 * (a->n_tokens + n_tail) * heads;
    if (rows > INT32_MAX) {
        HPD_LOG_ERROR("cuda", "kv_translate: %llu rows exceed a launch (at most %d); translate "
                      "fewer tokens per call", (unsigned long long)rows, INT32_MAX);
        return HPD_ERR_UNSUPPORTED;
    }
    translate_kernel<<<(uint32_t)rows, 64, 0, hpd_cuda_ctx(b)->stream>>>(
        src, dst, l0, a->n_tokens, n_tail, elem, (uint32_t)(sl->head_dim * elem), a->src_head, heads,
        a->dst_head);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

hpd_status_t hpd_cuda_slot_copy(hpd_backend_t *b, const hpd_slot_copy_args_t *a)
{
    HPD_CUDA_CHECK(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDefault,
                                   hpd_cuda_ctx(b)->stream));
    return HPD_OK;
}
