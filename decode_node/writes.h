/* Where a prefill node may write for one reservation of a decode node: the
 * reservation's prompt pages (whole pages, in a KV region) and its GDN
 * slot (in a slot region), of any of its ranks. A completion notice that names anything else
 * is refused (issue 16: the receiver never trusts a notice that names
 * memory outside the reservation). Pure: unit-tested in
 * tests/decode_node/test_writes.c. */
#ifndef HPD_DECODE_NODE_WRITES_H
#define HPD_DECODE_NODE_WRITES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/xfer.h"

typedef struct {
    /* each rank's page pool and slot pool (tensor parallelism: a rank's
     * pages and slot are the reservation's on every rank, at the same
     * offsets in its own regions) */
    const uint32_t *kv_regions, *slot_regions;
    uint32_t n_ranks;
    uint64_t page_bytes;
    const uint32_t *const *tables; /* page ids per pack group */
    uint32_t n_groups, n_pages;    /* prompt pages per group */
    uint64_t slot_offset, slot_bytes;
} hpd_reservation_span_t;

/* True when every destination lies inside the reservation; otherwise false
 * with why (may be NULL) naming the first one that does not. */
bool hpd_reservation_allows(const hpd_reservation_span_t *span, const hpd_xfer_dest_t *dests,
                            uint32_t n_dests, char *why, size_t why_len);

#endif
