/* Where a request goes: the coordinator's routing policy, apart from its
 * event loop and its registry so that tests can put any cluster state
 * before it (docs/cluster.md, "Life of a request").
 *
 * Prefill: the usable prefill node with the lowest cost, the prompt tokens
 * left after its expected prefix hit (its Bloom summary of cached block
 * keys) plus the tokens already queued there.
 * Decode: the usable decode node with the most free slots among those with
 * a free slot, the context and the pages for the whole request (prompt +
 * max_tokens), avoiding the decode node of a pair that failed the request
 * while another one is usable.
 * Among equals, the one a mix of the request's `start` and the node's id
 * ranks first: with a start that changes with each request (the
 * coordinator gives its id), equal nodes take turns wherever they stand,
 * instead of the lowest index taking every request of a quiet cluster. */
#ifndef HPD_COORDINATOR_ROUTING_H
#define HPD_COORDINATOR_ROUTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/prefix_hash.h"
#include "common/kv_layout.h"

typedef struct {
    uint64_t id;
    bool prefill; /* else decode */
    bool usable;  /* registered, alive and not draining */
    uint32_t max_context;
    uint32_t vocab; /* its model's vocabulary (admission) */
    /* prefill nodes */
    const uint8_t *summary; /* NULL: none yet */
    size_t summary_bytes;
    uint64_t queued_tokens;
    /* decode nodes: what they have and what the coordinator handed out */
    uint32_t slots, slots_reserved;
    uint32_t pages, pages_reserved;
    hpd_kv_layout_t layout;
} hpd_route_node_t;

typedef struct {
    uint32_t n_prompt, max_tokens;
    uint32_t n_choices;             /* answers from one prompt; 0 or 1: one */
    const hpd_block_hash_t *hashes; /* the prompt's full blocks */
    uint64_t avoid_decode;          /* 0: none */
    uint64_t start;                 /* ranks equal nodes (a request counter) */
} hpd_route_req_t;

/* Pages a decode node with this layout needs for tokens (every pack group). */
uint32_t hpd_route_pages(const hpd_kv_layout_t *layout, uint32_t tokens);
/* ... for a request: prompt + max_tokens, and for each choice past the
 * first the blocks past the prompt's full ones (those it shares). */
uint32_t hpd_route_request_pages(const hpd_kv_layout_t *layout, const hpd_route_req_t *req);

/* The index of the chosen node in nodes[0..n), or -1 for none. */
int hpd_route_prefill(const hpd_route_node_t *nodes, size_t n, const hpd_route_req_t *req);
/* ... and the pages it needs in *pages_p. */
int hpd_route_decode(const hpd_route_node_t *nodes, size_t n, const hpd_route_req_t *req,
                     uint32_t *pages_p);

#endif
