/* The GDN slot pool: slot s holds, for every GDN layer in order, the
 * recurrent state [nv][dk][dv] fp32 then the conv state [conv_dim][kc-1].
 * Slot 0 is a zeroed PAD sentinel; real slots are 1..N. A slot is zeroed when
 * handed out, and refcounted. */
#ifndef HPD_CACHE_SLOT_POOL_H
#define HPD_CACHE_SLOT_POOL_H

#include <stdint.h>

#include "kernels/backend.h"

typedef struct hpd_slot_pool hpd_slot_pool_t;

typedef struct {
    hpd_backend_t *backend; /* owns the memory; must outlive the pool */
    uint32_t n_slots;       /* real slots, not counting PAD */
    uint64_t slot_bytes;
    /* NULL: allocated from the backend as pool memory, which peers may
     * write over RDMA (hpd_backend_alloc_pool). Else (n_slots + 1) * slot_bytes of
     * memory the caller owns and frees after the pool. */
    void *memory;
} hpd_slot_pool_params_t;

hpd_status_t hpd_slot_pool_create(const hpd_slot_pool_params_t *params,
                                  hpd_slot_pool_t **pool_p);

/* Accepts NULL. */
void hpd_slot_pool_destroy(hpd_slot_pool_t *pool);

/* Takes a free slot, zeroed, refcount 1. HPD_ERR_NO_RESOURCE when none. */
hpd_status_t hpd_slot_pool_alloc(hpd_slot_pool_t *pool, uint32_t *slot_p);

void hpd_slot_pool_ref(hpd_slot_pool_t *pool, uint32_t slot);

/* Drops a reference; the slot is free again at zero. */
void hpd_slot_pool_unref(hpd_slot_pool_t *pool, uint32_t slot);

uint32_t hpd_slot_pool_refcount(const hpd_slot_pool_t *pool, uint32_t slot);
uint32_t hpd_slot_pool_n_free(const hpd_slot_pool_t *pool);
uint32_t hpd_slot_pool_n_slots(const hpd_slot_pool_t *pool);
uint64_t hpd_slot_pool_slot_bytes(const hpd_slot_pool_t *pool);

/* Backend memory of a slot (slot 0 is PAD). */
void *hpd_slot_pool_ptr(const hpd_slot_pool_t *pool, uint32_t slot);

#endif
