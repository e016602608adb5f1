#include "cache/page_pool.h"

#include <stdlib.h>

#include "common/assert.h"
#include "common/log.h"

struct hpd_page_pool {
    hpd_backend_t *backend;
    hpd_kv_layout_t layout;
    void *base;
    uint32_t n_pages;
    uint32_t n_free;
    uint32_t *free_ids; /* stack of free page ids */
    uint32_t *refs;
    bool owned; /* allocated from the backend, freed with the pool */
};

hpd_status_t hpd_page_pool_create(const hpd_page_pool_params_t *params,
                                  hpd_page_pool_t **pool_p)
{
    hpd_page_pool_t *pool;
    hpd_status_t st;

    if ((st = hpd_kv_layout_validate(&params->layout)) != HPD_OK)
        return st;
    if (params->n_pages == 0) {
        HPD_LOG_ERROR("page_pool", "page pool of 0 pages (expected at least 1)");
        return HPD_ERR_INVALID_ARG;
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return HPD_ERR_NO_MEMORY;
    pool->backend = params->backend;
    pool->layout = params->layout;
    pool->n_pages = params->n_pages;
    pool->free_ids = malloc(params->n_pages * sizeof(uint32_t));
    pool->refs = calloc(params->n_pages, sizeof(uint32_t));
    if (pool->free_ids == NULL || pool->refs == NULL) {
        st = HPD_ERR_NO_MEMORY;
        goto err;
    }
    pool->owned = params->memory == NULL;
    if (!pool->owned)
        pool->base = params->memory;
    else if ((st = hpd_backend_alloc_pool(params->backend,
                                          (size_t)params->n_pages *
                                              hpd_kv_layout_page_bytes(&params->layout),
                                          &pool->base)) != HPD_OK) {
        HPD_LOG_ERROR("page_pool", "allocation of %u pages of %llu bytes failed: %s",
                      params->n_pages,
                      (unsigned long long)hpd_kv_layout_page_bytes(&params->layout),
                      hpd_status_str(st));
        goto err;
    }
    /* lowest ids on top of the stack */
    for (uint32_t i = 0; i < params->n_pages; i++)
        pool->free_ids[i] = params->n_pages - 1 - i;
    pool->n_free = params->n_pages;
    *pool_p = pool;
    return HPD_OK;
err:
    free(pool->free_ids);
    free(pool->refs);
    free(pool);
    return st;
}

void hpd_page_pool_destroy(hpd_page_pool_t *pool)
{
    if (pool == NULL)
        return;
    if (pool->owned)
        hpd_backend_free_pool(pool->backend, pool->base);
    free(pool->free_ids);
    free(pool->refs);
    free(pool);
}

hpd_status_t hpd_page_pool_alloc(hpd_page_pool_t *pool, uint32_t n, uint32_t *ids)
{
    if (n > pool->n_free)
        return HPD_ERR_NO_RESOURCE;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t id = pool->free_ids[--pool->n_free];
        HPD_ASSERT(pool->refs[id] == 0);
        pool->refs[id] = 1;
        ids[i] = id;
    }
    return HPD_OK;
}

void hpd_page_pool_ref(hpd_page_pool_t *pool, uint32_t id)
{
    HPD_ASSERT_ALWAYS(id < pool->n_pages);
    HPD_ASSERT(pool->refs[id] > 0); /* a reference to a free page is a use after free */
    pool->refs[id]++;
}

void hpd_page_pool_unref(hpd_page_pool_t *pool, uint32_t id)
{
    HPD_ASSERT_ALWAYS(id < pool->n_pages);
    HPD_ASSERT(pool->refs[id] > 0); /* double free */
    if (pool->refs[id] == 0)
        return;
    if (--pool->refs[id] == 0)
        pool->free_ids[pool->n_free++] = id;
}

uint32_t hpd_page_pool_refcount(const hpd_page_pool_t *pool, uint32_t id)
{
    return id < pool->n_pages ? pool->refs[id] : 0;
}

uint32_t hpd_page_pool_n_free(const hpd_page_pool_t *pool)
{
    return pool->n_free;
}

uint32_t hpd_page_pool_n_pages(const hpd_page_pool_t *pool)
{
    return pool->n_pages;
}

const hpd_kv_layout_t *hpd_page_pool_layout(const hpd_page_pool_t *pool)
{
    return &pool->layout;
}

void *hpd_page_pool_base(const hpd_page_pool_t *pool)
{
    return pool->base;
}
