#include "cache/prefix_hash.h"

#include <string.h>

#include "common/hash.h"

#define B64 HPD_PREFIX_BLOCK

void hpd_prefix_hash_root(const uint8_t salt[16], hpd_block_hash_t *root_p)
{
    /* h_{-1}: the model fingerprint, hashed, so two models never share entries */
    XXH128_hash_t h = XXH3_128bits_withSeed(salt, 16, 0x68706463 /* "hpdc" */);
    XXH128_canonicalFromHash((XXH128_canonical_t *)root_p->bytes, h);
}

void hpd_prefix_hash_chain(const hpd_block_hash_t *root, const int32_t *tokens,
                           uint32_t n_blocks, hpd_block_hash_t *hashes)
{
    /* h_{i-1} (16 bytes) || the block's ids as little-endian u32 */
    uint8_t buf[16 + 4 * B64];
    const hpd_block_hash_t *prev = root;

    for (uint32_t i = 0; i < n_blocks; i++) {
        memcpy(buf, prev->bytes, 16);
        for (uint32_t t = 0; t < B64; t++) {
            const uint32_t v = (uint32_t)tokens[(size_t)i * B64 + t];
            uint8_t *b = buf + 16 + 4 * t;
            b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)(v >> 16);
            b[3] = (uint8_t)(v >> 24);
        }
        XXH128_canonicalFromHash((XXH128_canonical_t *)hashes[i].bytes,
                                 XXH3_128bits(buf, sizeof(buf)));
        prev = &hashes[i];
    }
}

/* Bloom filter probes: four 32-bit words of the (already uniform) key. */
static void bloom_bits(const hpd_block_hash_t *k, uint32_t n_bits, uint32_t bits[4])
{
    for (int i = 0; i < 4; i++) {
        uint32_t w;
        memcpy(&w, k->bytes + 4 * i, 4);
        bits[i] = w % n_bits;
    }
}

void hpd_prefix_summary_add(uint8_t *summary, size_t bytes, const hpd_block_hash_t *key)
{
    uint32_t b[4];
    bloom_bits(key, (uint32_t)(bytes * 8), b);
    for (int i = 0; i < 4; i++)
        summary[b[i] / 8] |= (uint8_t)(1u << (b[i] % 8));
}

bool hpd_prefix_summary_test(const uint8_t *summary, size_t bytes, const hpd_block_hash_t *key)
{
    uint32_t b[4];
    if (bytes == 0)
        return false;
    bloom_bits(key, (uint32_t)(bytes * 8), b);
    for (int i = 0; i < 4; i++)
        if (!(summary[b[i] / 8] & (1u << (b[i] % 8))))
            return false;
    return true;
}

uint32_t hpd_prefix_summary_match(const uint8_t *summary, size_t bytes,
                                  const hpd_block_hash_t *hashes, uint32_t n_tokens)
{
    /* like the lookup: only prompt[:-1] can hit */
    uint32_t k = n_tokens > 0 ? (n_tokens - 1) / B64 : 0;
    while (k > 0 && !hpd_prefix_summary_test(summary, bytes, &hashes[k - 1]))
        k--;
    return k;
}

