/* The prefix hash chain and the Bloom summary of it (docs/prefix_cache.md):
 * what a router computes and matches without a cache (the coordinator
 * links this alone, not the cache nor the kernels).
 *
 * The token stream is cut into hash blocks of 64 tokens. Block i's key is
 * h_i = XXH3_128(h_{i-1} || token ids of block i as little-endian u32), with
 * h_{-1} derived from the model fingerprint. */
#ifndef HPD_CACHE_PREFIX_HASH_H
#define HPD_CACHE_PREFIX_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HPD_PREFIX_BLOCK 64

typedef struct {
    uint8_t bytes[16];
} hpd_block_hash_t;

/* h_{-1} from a model fingerprint. */
void hpd_prefix_hash_root(const uint8_t salt[16], hpd_block_hash_t *root_p);

/* The chain h_0 .. h_{n_blocks-1} of the first n_blocks full blocks of
 * tokens, from h_{-1} = root (what a router computes without a cache). */
void hpd_prefix_hash_chain(const hpd_block_hash_t *root, const int32_t *tokens,
                           uint32_t n_blocks, hpd_block_hash_t *hashes);

/* A Bloom filter of block keys over summary[0 .. bytes): 4 probes, the four
 * 32-bit words of each key modulo the bits. */
void hpd_prefix_summary_add(uint8_t *summary, size_t bytes, const hpd_block_hash_t *key);
bool hpd_prefix_summary_test(const uint8_t *summary, size_t bytes, const hpd_block_hash_t *key);

/* The expected hit of a prompt of n_tokens (hashes of its full blocks) in
 * blocks: the longest prefix whose last block is in the summary (false
 * positives of the filter can overestimate it). */
uint32_t hpd_prefix_summary_match(const uint8_t *summary, size_t bytes,
                                  const hpd_block_hash_t *hashes, uint32_t n_tokens);

#endif
