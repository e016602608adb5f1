/* The prefix cache (docs/prefix_cache.md).
 *
 * The token stream is cut into hash blocks of 64 tokens. Block i's key is
 * h_i = XXH3_128(h_{i-1} || token ids of block i as little-endian u32), with
 * h_{-1} derived from the model fingerprint. An entry (one block) holds
 * references to the KV pages that cover its tokens, in the engine's layout,
 * and optionally a GDN checkpoint: the state after its last token. A lookup
 * returns the longest prefix whose KV is present and that ends at a block
 * with a checkpoint. Unreferenced entries are evicted LRU, leaf-first, to a
 * bounded host tier (or dropped), and promoted back on a hit. */
#ifndef HPD_CACHE_PREFIX_CACHE_H
#define HPD_CACHE_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/page_pool.h"
#include "cache/prefix_hash.h"
#include "cache/slot_pool.h"
#include "kernels/backend.h"

typedef struct hpd_prefix_cache hpd_prefix_cache_t;

typedef struct {
    hpd_backend_t *backend;  /* borrowed */
    hpd_page_pool_t *pages;  /* borrowed: the engine's KV page pool, shared */
    uint64_t state_bytes;    /* one checkpoint: every GDN layer's state */
    uint32_t n_checkpoints;  /* device checkpoint slots (the bound); 0: none */
    uint64_t host_bytes;     /* host tier bound in bytes; 0 disables the tier */
    uint32_t checkpoint_every; /* also checkpoint every N blocks of a prompt; 0: off */
    uint8_t salt[16];        /* the model fingerprint */
} hpd_prefix_cache_params_t;

/* The result of a lookup. Locks the entries of the hit until released. */
typedef struct {
    uint32_t hit_blocks;  /* k: the hit is the first 64 k tokens */
    uint32_t kv_blocks;   /* m >= k: blocks whose KV was found (a branch point when m > k) */
    uint32_t host_blocks; /* hit blocks that sit in the host tier */
    uint32_t *path;       /* entry of each hit block (internal ids) */
} hpd_prefix_match_t;

typedef struct {
    uint64_t lookups;
    uint64_t lookup_tokens;     /* prompt tokens looked up */
    uint64_t hit_tokens_device; /* hit tokens whose entries were on the device */
    uint64_t hit_tokens_host;   /* hit tokens promoted from the host tier */
    uint64_t inserted_blocks;
    uint64_t evicted_to_host;   /* entries moved device -> host */
    uint64_t evicted_dropped;   /* entries dropped from the device tier */
    uint64_t host_dropped;      /* entries dropped from the host tier */
    uint64_t promotions;        /* entries moved host -> device */
    uint64_t checkpoints_created;
    uint64_t checkpoint_bytes;      /* device checkpoint bytes held now */
    uint64_t host_checkpoint_bytes; /* host checkpoint bytes held now */
    uint64_t host_bytes;            /* host tier bytes held now */
    uint32_t device_entries, host_entries;
    uint32_t device_checkpoints;
    uint32_t pages_held; /* distinct pages the cache references */
} hpd_prefix_cache_stats_t;

hpd_status_t hpd_prefix_cache_create(const hpd_prefix_cache_params_t *params,
                                     hpd_prefix_cache_t **cache_p);

/* Drops every entry (page references, checkpoints, host copies). Accepts NULL. */
void hpd_prefix_cache_destroy(hpd_prefix_cache_t *cache);

/* Hashes of the first n_blocks full blocks of tokens into hashes[0..n_blocks). */
void hpd_prefix_cache_hash(const hpd_prefix_cache_t *cache, const int32_t *tokens,
                           uint32_t n_blocks, hpd_block_hash_t *hashes);

/* Looks up a prompt of n tokens (hashes of its full blocks given). Only
 * prompt[:-1] is probed, so at least one token is always computed. Fills
 * *match (path allocated, freed by release) and locks the hit's entries. */
hpd_status_t hpd_prefix_cache_lookup(hpd_prefix_cache_t *cache, const hpd_block_hash_t *hashes,
                                     uint32_t n_tokens, hpd_prefix_match_t *match);

/* Gives a request the hit: fills tables[g][0 .. ceil(64k / B)) with pages
 * holding the first 64 k tokens (shared pages get a reference; a page the
 * request will write past the hit is a private copy; host-tier entries are
 * promoted through fresh pages) and restores the hit's checkpoint into
 * `state` (backend memory, state_bytes). On HPD_ERR_NO_RESOURCE nothing is
 * held. Eviction may run, never on the locked hit. */
hpd_status_t hpd_prefix_cache_attach(hpd_prefix_cache_t *cache, const hpd_prefix_match_t *match,
                                     uint32_t *const *tables, void *state);

/* Unlocks the hit's entries and frees the path. Accepts an empty match. */
void hpd_prefix_cache_release(hpd_prefix_cache_t *cache, hpd_prefix_match_t *match);

/* Records the first n_blocks blocks of a request whose KV is computed: each
 * missing entry is created with references to the request's pages (tables,
 * in the pool's layout), a host-tier entry is promoted onto them. When
 * `state` is not NULL it is the GDN state after block n_blocks - 1, saved as
 * that entry's checkpoint if it has none (evicting an LRU checkpoint to the
 * host tier when the device slots are full; without a slot to spare the
 * entry stays without state). On an error (out of memory, a backend copy
 * failing) the blocks recorded before it stay, the state is not saved. */
hpd_status_t hpd_prefix_cache_insert(hpd_prefix_cache_t *cache, const hpd_block_hash_t *hashes,
                                     uint32_t n_blocks, const uint32_t *const *tables,
                                     const void *state);

/* Evicts unlocked entries, LRU and leaf-first, until the page pool has
 * `pages` free pages. Returns HPD_OK when it has, HPD_ERR_NO_RESOURCE when
 * nothing more can be evicted. */
hpd_status_t hpd_prefix_cache_make_room(hpd_prefix_cache_t *cache, uint32_t pages);

/* The checkpoint positions (multiples of 64) a prompt of n tokens should
 * save, beyond `after`, given its match: the last full block, the branch
 * point of the match, and every N blocks. Writes up to max of them in
 * ascending order; returns how many. */
uint32_t hpd_prefix_cache_checkpoint_plan(const hpd_prefix_cache_t *cache,
                                          const hpd_prefix_match_t *match, uint32_t n_tokens,
                                          uint32_t after, uint32_t *positions, uint32_t max);

void hpd_prefix_cache_stats(const hpd_prefix_cache_t *cache, hpd_prefix_cache_stats_t *stats_p);

/* Adds, for every page id, the references the cache holds on it into
 * counts[0 .. n_pages) (for leak checks). */
void hpd_prefix_cache_page_refs(const hpd_prefix_cache_t *cache, uint32_t *counts);

/* A compact summary of where lookups can hit, for routers: a Bloom filter
 * (4 probes) over the keys of the entries that hold a checkpoint (device or
 * host tier). Clears and fills summary[0 .. bytes); returns the number of
 * keys added. */
uint32_t hpd_prefix_cache_summary(const hpd_prefix_cache_t *cache, uint8_t *summary,
                                  size_t bytes);

#endif
