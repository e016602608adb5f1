#include "decode_node/writes.h"

#include <stdio.h>

static bool own_page(const hpd_reservation_span_t *s, uint64_t page)
{
    for (uint32_t g = 0; g < s->n_groups; g++)
        for (uint32_t i = 0; i < s->n_pages; i++)
            if (s->tables[g][i] == page)
                return true;
    return false;
}

bool hpd_reservation_allows(const hpd_reservation_span_t *s, const hpd_xfer_dest_t *dests,
                            uint32_t n_dests, char *why, size_t why_len)
{
    for (uint32_t i = 0; i < n_dests; i++) {
        const hpd_xfer_dest_t *d = &dests[i];
        bool ok = false, kv = false, slot = false;
        for (uint32_t r = 0; r < s->n_ranks; r++) {
            kv |= d->region == s->kv_regions[r];
            slot |= d->region == s->slot_regions[r];
        }
        if (kv && s->page_bytes > 0) {
            /* within one page the reservation holds */
            const uint64_t page = d->offset / s->page_bytes;
            ok = d->bytes > 0 && d->offset % s->page_bytes + d->bytes <= s->page_bytes &&
                 own_page(s, page);
        } else if (slot && s->slot_bytes > 0) {
            ok = d->offset >= s->slot_offset && d->bytes > 0 &&
                 d->offset - s->slot_offset <= s->slot_bytes &&
                 d->bytes <= s->slot_bytes - (d->offset - s->slot_offset);
        }
        if (!ok) {
            if (why != NULL)
                snprintf(why, why_len, "destination %u (%llu bytes at offset %llu of region %u) "
                         "is outside the reservation", i, (unsigned long long)d->bytes,
                         (unsigned long long)d->offset, d->region);
            return false;
        }
    }
    return true;
}
