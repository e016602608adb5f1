#include "cache/slot_pool.h"

#include <stdlib.h>

#include "common/assert.h"
#include "common/log.h"

struct hpd_slot_pool {
    hpd_backend_t *backend;
    uint64_t slot_bytes;
    uint32_t n_slots;
    uint32_t n_free;
    uint32_t *free_ids;
    uint32_t *refs; /* [n_slots + 1]; refs[0] stays 0 */
    uint8_t *base;
    bool owned; /* allocated from the backend, freed with the pool */
};

hpd_status_t hpd_slot_pool_create(const hpd_slot_pool_params_t *params,
                                  hpd_slot_pool_t **pool_p)
{
    hpd_slot_pool_t *pool;
    hpd_status_t st;
    const size_t total = (size_t)(params->n_slots + 1) * params->slot_bytes;

    if (params->n_slots == 0 || params->slot_bytes == 0) {
        HPD_LOG_ERROR("slot_pool", "slot pool of %u slots x %llu bytes (expected both > 0)",
                      params->n_slots, (unsigned long long)params->slot_bytes);
        return HPD_ERR_INVALID_ARG;
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return HPD_ERR_NO_MEMORY;
    pool->backend = params->backend;
    pool->slot_bytes = params->slot_bytes;
    pool->n_slots = params->n_slots;
    pool->free_ids = malloc(params->n_slots * sizeof(uint32_t));
    pool->refs = calloc(params->n_slots + 1, sizeof(uint32_t));
    if (pool->free_ids == NULL || pool->refs == NULL) {
        st = HPD_ERR_NO_MEMORY;
        goto err;
    }
    pool->owned = params->memory == NULL;
    if (!pool->owned)
        pool->base = params->memory;
    else if ((st = hpd_backend_alloc_pool(params->backend, total, (void **)&pool->base)) !=
             HPD_OK) {
        HPD_LOG_ERROR("slot_pool", "allocation of %u slots of %llu bytes failed: %s",
                      params->n_slots, (unsigned long long)params->slot_bytes,
                      hpd_status_str(st));
        goto err;
    }
    /* PAD must read as zeros; other slots are zeroed when handed out */
    if ((st = hpd_backend_memset(params->backend, pool->base, 0, params->slot_bytes)) != HPD_OK) {
        if (pool->owned)
            hpd_backend_free_pool(params->backend, pool->base);
        goto err;
    }
    for (uint32_t i = 0; i < params->n_slots; i++)
        pool->free_ids[i] = params->n_slots - i;
    pool->n_free = params->n_slots;
    *pool_p = pool;
    return HPD_OK;
err:
    free(pool->free_ids);
    free(pool->refs);
    free(pool);
    return st;
}

void hpd_slot_pool_destroy(hpd_slot_pool_t *pool)
{
    if (pool == NULL)
        return;
    if (pool->owned)
        hpd_backend_free_pool(pool->backend, pool->base);
    free(pool->free_ids);
    free(pool->refs);
    free(pool);
}

hpd_status_t hpd_slot_pool_alloc(hpd_slot_pool_t *pool, uint32_t *slot_p)
{
    uint32_t slot;
    hpd_status_t st;

    if (pool->n_free == 0)
        return HPD_ERR_NO_RESOURCE;
    slot = pool->free_ids[pool->n_free - 1];
    st = hpd_backend_memset(pool->backend, hpd_slot_pool_ptr(pool, slot), 0, pool->slot_bytes);
    if (st != HPD_OK)
        return st;
    pool->n_free--;
    HPD_ASSERT(pool->refs[slot] == 0);
    pool->refs[slot] = 1;
    *slot_p = slot;
    return HPD_OK;
}

void hpd_slot_pool_ref(hpd_slot_pool_t *pool, uint32_t slot)
{
    HPD_ASSERT_ALWAYS(slot >= 1 && slot <= pool->n_slots);
    HPD_ASSERT(pool->refs[slot] > 0); /* use after free */
    pool->refs[slot]++;
}

void hpd_slot_pool_unref(hpd_slot_pool_t *pool, uint32_t slot)
{
    HPD_ASSERT_ALWAYS(slot >= 1 && slot <= pool->n_slots);
    HPD_ASSERT(pool->refs[slot] > 0); /* double free */
    if (pool->refs[slot] == 0)
        return;
    if (--pool->refs[slot] == 0)
        pool->free_ids[pool->n_free++] = slot;
}

uint32_t hpd_slot_pool_refcount(const hpd_slot_pool_t *pool, uint32_t slot)
{
    return slot <= pool->n_slots ? pool->refs[slot] : 0;
}

uint32_t hpd_slot_pool_n_free(const hpd_slot_pool_t *pool)
{
    return pool->n_free;
}

uint32_t hpd_slot_pool_n_slots(const hpd_slot_pool_t *pool)
{
    return pool->n_slots;
}

uint64_t hpd_slot_pool_slot_bytes(const hpd_slot_pool_t *pool)
{
    return pool->slot_bytes;
}

void *hpd_slot_pool_ptr(const hpd_slot_pool_t *pool, uint32_t slot)
{
    return pool->base + (size_t)slot * pool->slot_bytes;
}
