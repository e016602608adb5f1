/* A map from 64-bit keys to pointers (common/u64map.h). */
#include "common/u64map.h"

#include <stdbool.h>
#include <stdlib.h>

static size_t home(uint64_t key, size_t cap)
{
    /* splitmix64's finalizer: ids are sequential, their low bits alike */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (size_t)key & (cap - 1);
}

void hpd_u64map_init(hpd_u64map_t *m)
{
    *m = (hpd_u64map_t){0};
}

void hpd_u64map_free(hpd_u64map_t *m)
{
    free(m->slots);
    *m = (hpd_u64map_t){0};
}

static hpd_u64map_slot_t *find(const hpd_u64map_t *m, uint64_t key)
{
    if (m->cap == 0 || key == 0)
        return NULL;
    for (size_t i = home(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key)
            return &m->slots[i];
        if (m->slots[i].key == 0)
            return NULL;
    }
}

void *hpd_u64map_get(const hpd_u64map_t *m, uint64_t key)
{
    const hpd_u64map_slot_t *s = find(m, key);
    return s != NULL ? s->val : NULL;
}

static void insert(hpd_u64map_slot_t *slots, size_t cap, uint64_t key, void *val)
{
    size_t i = home(key, cap);
    while (slots[i].key != 0 && slots[i].key != key)
        i = (i + 1) & (cap - 1);
    slots[i] = (hpd_u64map_slot_t){.key = key, .val = val};
}

hpd_status_t hpd_u64map_reserve(hpd_u64map_t *m, size_t count)
{
    if (2 * count <= m->cap)
        return HPD_OK;
    size_t cap = m->cap ? m->cap : 64;
    while (2 * count > cap)
        cap *= 2;
    hpd_u64map_slot_t *fresh = calloc(cap, sizeof(*fresh));
    if (fresh == NULL)
        return HPD_ERR_NO_MEMORY;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != 0)
            insert(fresh, cap, m->slots[i].key, m->slots[i].val);
    free(m->slots);
    m->slots = fresh;
    m->cap = cap;
    return HPD_OK;
}

hpd_status_t hpd_u64map_put(hpd_u64map_t *m, uint64_t key, void *val)
{
    if (key == 0)
        return HPD_ERR_INVALID_ARG;
    hpd_u64map_slot_t *s = find(m, key);
    if (s != NULL) {
        s->val = val;
        return HPD_OK;
    }
    const hpd_status_t st = hpd_u64map_reserve(m, m->n + 1);
    if (st != HPD_OK)
        return st;
    insert(m->slots, m->cap, key, val);
    m->n++;
    return HPD_OK;
}

void *hpd_u64map_del(hpd_u64map_t *m, uint64_t key)
{
    hpd_u64map_slot_t *s = find(m, key);
    if (s == NULL)
        return NULL;
    void *val = s->val;
    /* backward shift: each later entry of the run whose home lies at or
     * before the hole moves into it */
    size_t hole = (size_t)(s - m->slots);
    for (size_t j = (hole + 1) & (m->cap - 1); m->slots[j].key != 0; j = (j + 1) & (m->cap - 1)) {
        const size_t h = home(m->slots[j].key, m->cap);
        /* h cyclically in (hole, j]: it stays */
        const bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
        if (!stays) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole] = (hpd_u64map_slot_t){0};
    m->n--;
    return val;
}
