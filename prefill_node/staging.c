#include "prefill_node/staging.h"

#include <stdlib.h>

static uint64_t round64(uint64_t len)
{
    return (len + 63) & ~63ull;
}

hpd_status_t hpd_staging_init(hpd_staging_t *s, uint64_t bytes)
{
    *s = (hpd_staging_t){.total = bytes, .free_bytes = bytes};
    if (bytes == 0)
        return HPD_OK;
    if ((s->free_list = malloc(sizeof(*s->free_list))) == NULL)
        return HPD_ERR_NO_MEMORY;
    *s->free_list = (hpd_staging_extent_t){.len = bytes};
    return HPD_OK;
}

void hpd_staging_destroy(hpd_staging_t *s)
{
    while (s->free_list != NULL) {
        hpd_staging_extent_t *e = s->free_list;
        s->free_list = e->next;
        free(e);
    }
    s->free_bytes = 0;
}

bool hpd_staging_alloc(hpd_staging_t *s, uint64_t len, uint64_t *off_p)
{
    len = round64(len);
    for (hpd_staging_extent_t **pp = &s->free_list; *pp != NULL; pp = &(*pp)->next) {
        hpd_staging_extent_t *e = *pp;
        if (e->len < len)
            continue;
        *off_p = e->off;
        e->off += len;
        e->len -= len;
        if (e->len == 0) {
            *pp = e->next;
            free(e);
        }
        s->free_bytes -= len;
        return true;
    }
    return false;
}

hpd_status_t hpd_staging_free(hpd_staging_t *s, uint64_t off, uint64_t len)
{
    hpd_staging_extent_t **pp = &s->free_list, *prev = NULL, *e;
    len = round64(len);
    while (*pp != NULL && (*pp)->off < off) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    const bool after_prev = prev != NULL && prev->off + prev->len == off;
    const bool before_next = *pp != NULL && off + len == (*pp)->off;
    if (after_prev && before_next) { /* fills the gap: prev takes next in */
        e = *pp;
        prev->len += len + e->len;
        prev->next = e->next;
        free(e);
    } else if (after_prev) {
        prev->len += len;
    } else if (before_next) {
        (*pp)->off = off;
        (*pp)->len += len;
    } else {
        if ((e = malloc(sizeof(*e))) == NULL)
            return HPD_ERR_NO_MEMORY;
        *e = (hpd_staging_extent_t){.off = off, .len = len, .next = *pp};
        *pp = e;
    }
    s->free_bytes += len;
    return HPD_OK;
}
