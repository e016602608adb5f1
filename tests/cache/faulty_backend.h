/* A backend that forwards the memory and copy ops the cache uses to a real
 * one, fails the ones a test names and counts the allocations not freed yet
 * (header-only): for the answers of the pools and the prefix cache when the
 * device fails them, and for leaks of backend memory in any build. */
#ifndef HPD_TESTS_CACHE_FAULTY_BACKEND_H
#define HPD_TESTS_CACHE_FAULTY_BACKEND_H

#include <stdbool.h>

#include "kernels/backend.h"

typedef struct {
    hpd_backend_t base; /* what the code under test is given */
    hpd_backend_ops_t ops;
    hpd_backend_t *inner; /* borrowed */
    /* while set, every call of the op answers HPD_ERR_INTERNAL */
    bool fail_alloc, fail_memset, fail_to_host, fail_from_host, fail_translate, fail_slot_copy;
    /* allocations made and not yet freed; n_pool_live: of them, pool memory
     * (alloc_pool, freed with free_pool) */
    int32_t n_live, n_pool_live;
} faulty_backend_t;

static inline faulty_backend_t *faulty_of(hpd_backend_t *b)
{
    return (faulty_backend_t *)b->ctx;
}

static inline hpd_status_t faulty_alloc(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    faulty_backend_t *f = faulty_of(b);
    hpd_status_t st = f->fail_alloc ? HPD_ERR_INTERNAL : hpd_backend_alloc(f->inner, bytes, ptr_p);
    f->n_live += st == HPD_OK;
    return st;
}

static inline void faulty_free(hpd_backend_t *b, void *ptr)
{
    faulty_of(b)->n_live--;
    hpd_backend_free(faulty_of(b)->inner, ptr);
}

static inline hpd_status_t faulty_alloc_pool(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    faulty_backend_t *f = faulty_of(b);
    hpd_status_t st =
        f->fail_alloc ? HPD_ERR_INTERNAL : hpd_backend_alloc_pool(f->inner, bytes, ptr_p);
    f->n_live += st == HPD_OK;
    f->n_pool_live += st == HPD_OK;
    return st;
}

static inline void faulty_free_pool(hpd_backend_t *b, void *ptr)
{
    faulty_of(b)->n_live--;
    faulty_of(b)->n_pool_live--;
    hpd_backend_free_pool(faulty_of(b)->inner, ptr);
}

static inline hpd_status_t faulty_memset(hpd_backend_t *b, void *ptr, int value, size_t bytes)
{
    faulty_backend_t *f = faulty_of(b);
    return f->fail_memset ? HPD_ERR_INTERNAL : hpd_backend_memset(f->inner, ptr, value, bytes);
}

static inline hpd_status_t faulty_copy(hpd_backend_t *b, void *dst, const void *src,
                                       size_t bytes)
{
    return hpd_backend_copy(faulty_of(b)->inner, dst, src, bytes);
}

static inline hpd_status_t faulty_to_host(hpd_backend_t *b, void *host, const void *src,
                                          size_t bytes)
{
    faulty_backend_t *f = faulty_of(b);
    return f->fail_to_host ? HPD_ERR_INTERNAL : hpd_backend_to_host(f->inner, host, src, bytes);
}

static inline hpd_status_t faulty_from_host(hpd_backend_t *b, void *dst, const void *host,
                                            size_t bytes)
{
    faulty_backend_t *f = faulty_of(b);
    return f->fail_from_host ? HPD_ERR_INTERNAL
                             : hpd_backend_from_host(f->inner, dst, host, bytes);
}

static inline hpd_status_t faulty_translate(hpd_backend_t *b,
                                            const hpd_kv_translate_args_t *args)
{
    faulty_backend_t *f = faulty_of(b);
    return f->fail_translate ? HPD_ERR_INTERNAL : hpd_kv_translate(f->inner, args);
}

static inline hpd_status_t faulty_slot_copy(hpd_backend_t *b,
                                            const hpd_slot_copy_args_t *args)
{
    faulty_backend_t *f = faulty_of(b);
    return f->fail_slot_copy ? HPD_ERR_INTERNAL : hpd_slot_copy(f->inner, args);
}

/* Wraps inner (which must outlive f); nothing fails until a flag is set.
 * Ops other than these are left NULL (HPD_ERR_UNSUPPORTED), and f is not
 * destroyed through hpd_backend_destroy. */
static inline hpd_backend_t *faulty_backend_init(faulty_backend_t *f, hpd_backend_t *inner)
{
    *f = (faulty_backend_t){.inner = inner};
    f->ops = (hpd_backend_ops_t){
        .name = "faulty",
        .host_memory = inner->ops->host_memory,
        .alloc = faulty_alloc,
        .free = faulty_free,
        .alloc_pool = faulty_alloc_pool,
        .free_pool = faulty_free_pool,
        .memset = faulty_memset,
        .copy = faulty_copy,
        .to_host = faulty_to_host,
        .from_host = faulty_from_host,
        .kv_translate = faulty_translate,
        .slot_copy = faulty_slot_copy,
    };
    f->base = (hpd_backend_t){.ops = &f->ops, .ctx = f};
    return &f->base;
}

#endif
