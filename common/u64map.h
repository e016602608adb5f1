/* A map from non-zero 64-bit keys (node ids, job ids) to pointers: open
 * addressing with linear probing and backward-shift deletion (no
 * tombstones), at most half full. For the coordinator's lookups by id,
 * which ran over lists of every node or request per message. */
#ifndef HPD_COMMON_U64MAP_H
#define HPD_COMMON_U64MAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct {
    uint64_t key; /* 0: empty */
    void *val;
} hpd_u64map_slot_t;

typedef struct {
    hpd_u64map_slot_t *slots;
    size_t cap; /* a power of two, or 0 before the first put */
    size_t n;
} hpd_u64map_t;

/* An empty map ({0} is one too). */
void hpd_u64map_init(hpd_u64map_t *m);
void hpd_u64map_free(hpd_u64map_t *m);

/* key's value, NULL when absent (or key 0). */
void *hpd_u64map_get(const hpd_u64map_t *m, uint64_t key);
/* Sets key (non-zero) to val, replacing its value. HPD_ERR_NO_MEMORY:
 * nothing changed; HPD_ERR_INVALID_ARG: key 0. */
hpd_status_t hpd_u64map_put(hpd_u64map_t *m, uint64_t key, void *val);
/* Makes room for count keys in all: puts up to that many never allocate
 * (HPD_ERR_NO_MEMORY: nothing changed). */
hpd_status_t hpd_u64map_reserve(hpd_u64map_t *m, size_t count);
/* Removes key; its value, NULL when it was absent. */
void *hpd_u64map_del(hpd_u64map_t *m, uint64_t key);

#endif
