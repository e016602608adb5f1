/* The prefill node's staging arena: one registered buffer that pushes
 * translate KV into (docs/cluster.md, "Life of a request"). Ranges are
 * handed out first-fit in 64-byte units and merge with their neighbours
 * when they come back, so that the arena returns to one range when every
 * job ended, whatever their order. A job that does not fit waits. */
#ifndef HPD_PREFILL_NODE_STAGING_H
#define HPD_PREFILL_NODE_STAGING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_staging_extent {
    uint64_t off, len;
    struct hpd_staging_extent *next;
} hpd_staging_extent_t;

typedef struct {
    hpd_staging_extent_t *free_list; /* sorted by offset, never adjacent */
    uint64_t total, free_bytes;
} hpd_staging_t;

hpd_status_t hpd_staging_init(hpd_staging_t *s, uint64_t bytes);
void hpd_staging_destroy(hpd_staging_t *s);

/* len rounded up to 64 bytes; false when no free range holds it. */
bool hpd_staging_alloc(hpd_staging_t *s, uint64_t len, uint64_t *off_p);

/* Gives back what hpd_staging_alloc handed out (off and the same len).
 * HPD_ERR_NO_MEMORY when a range that merges with neither neighbour cannot
 * be listed: those bytes stay out of use (free_bytes says so). */
hpd_status_t hpd_staging_free(hpd_staging_t *s, uint64_t off, uint64_t len);

#endif
