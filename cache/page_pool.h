/* A pool of KV pages in one layout, allocated through a kernel backend, with
 * a refcount per page so that sequences can share pages. */
#ifndef HPD_CACHE_PAGE_POOL_H
#define HPD_CACHE_PAGE_POOL_H

#include <stdint.h>

#include "common/kv_layout.h"
#include "kernels/backend.h"

typedef struct hpd_page_pool hpd_page_pool_t;

typedef struct {
    hpd_backend_t *backend; /* owns the page memory; must outlive the pool */
    hpd_kv_layout_t layout; /* validated at create */
    uint32_t n_pages;
    /* NULL: the pages are allocated from the backend as pool memory, which
     * peers may write over RDMA (hpd_backend_alloc_pool). Else n_pages pages of
     * memory the caller owns and frees after the pool (e.g. shared memory
     * peers on this host map; hpd_engine_params_t.pool_alloc). */
    void *memory;
} hpd_page_pool_params_t;

/* Allocates n_pages pages of the layout in backend memory (or takes
 * params->memory). */
hpd_status_t hpd_page_pool_create(const hpd_page_pool_params_t *params,
                                  hpd_page_pool_t **pool_p);

/* Frees the memory. Accepts NULL. */
void hpd_page_pool_destroy(hpd_page_pool_t *pool);

/* Takes n free pages (refcount 1 each) into ids[0..n). All or nothing:
 * HPD_ERR_NO_RESOURCE when fewer than n are free; nothing is taken then. */
hpd_status_t hpd_page_pool_alloc(hpd_page_pool_t *pool, uint32_t n, uint32_t *ids);

/* Adds a reference to a page in use. */
void hpd_page_pool_ref(hpd_page_pool_t *pool, uint32_t id);

/* Drops a reference; the page is free again at zero. */
void hpd_page_pool_unref(hpd_page_pool_t *pool, uint32_t id);

uint32_t hpd_page_pool_refcount(const hpd_page_pool_t *pool, uint32_t id);
uint32_t hpd_page_pool_n_free(const hpd_page_pool_t *pool);
uint32_t hpd_page_pool_n_pages(const hpd_page_pool_t *pool);
const hpd_kv_layout_t *hpd_page_pool_layout(const hpd_page_pool_t *pool);

/* Base of the page memory: page i starts at base + i * page_bytes. */
void *hpd_page_pool_base(const hpd_page_pool_t *pool);

#endif
