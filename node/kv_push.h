/* A prefill node's KV push (issue 37: the one place that maps a sender's
 * KV, its layout and, with tensor parallelism, its ranks' heads, onto a
 * receiver's; the data plane, transport/xfer.h, moves bytes): the KV is
 * translated on the sender's backend into a registered staging buffer in
 * the receiver's layout, then put page by page. Moved here from
 * transport/xfer.c. */
#ifndef HPD_NODE_KV_PUSH_H
#define HPD_NODE_KV_PUSH_H

#include "kernels/backend.h"
#include "transport/xfer.h"

/* Where a push's KV comes from: a sender's pool (span.pos is ignored:
 * token t sits at position t), and, with tensor parallelism, which of its
 * KV heads go to which heads of the destination (kv_translate's src_head,
 * heads and dst_head; heads 0: all of them, the same count both sides). */
typedef struct {
    hpd_kv_span_t span;
    uint32_t src_head, heads, dst_head;
} hpd_kv_push_src_t;

/* Pushes tokens [first_token, n_tokens) of KV, translated at the sender
 * (on its backend; the puts wait on a fence after the translation, not the
 * host on the backend) into the receiver's layout: the tokens of
 * destination pack group `group` (or all groups when group is UINT32_MAX)
 * are translated from every source into the registered staging buffer
 * (dst layout pages; page j of group g at staging page g * (staging_pages /
 * n_groups) + j), then put one page per destination page into dst_region at
 * dst_tables[g][j] * page_bytes. The sources together must write every
 * head of the destination's pages (several sources: a decode rank's heads
 * held by several prefill ranks, gathered into whole pages). first_token
 * must start a destination page. With last set the final page's tail is
 * zero-filled; without it n_tokens must end a destination page (a sender
 * pushing chunk by chunk sends whole pages until the last). */
typedef struct {
    hpd_backend_t *backend;
    const hpd_kv_push_src_t *srcs;
    uint32_t n_srcs;
    uint32_t first_token, n_tokens;
    bool last;
    const hpd_kv_layout_t *dst_layout;
    uint32_t dst_region;
    const uint32_t *const *dst_tables;
    void *staging;          /* registered; n_groups * ceil(n / B) dst pages at least */
    uint32_t staging_pages;
    uint32_t group;
} hpd_kv_push_args_t;

hpd_status_t hpd_kv_push(hpd_xfer_peer_t *peer, uint64_t xfer_id, const hpd_kv_push_args_t *args);

#endif
