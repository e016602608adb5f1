/* XXH3. Where libxxhash has its runtime-dispatched entry points (x86), they
 * replace the plain ones: AVX2 when the CPU has it, twice the default SSE2
 * path on cached data, which is what a transfer's checksum reads. The
 * hashes are the same either way.
 *
 * A transfer's checksum (docs/protocol.md) is a hash of pieces: each put's
 * bytes cut into pieces of HPD_HASH_PIECE_BYTES (the last one shorter),
 * each piece hashed alone with XXH3-64 (seed 0), and the pieces' hashes,
 * as little-endian u64 in put order, hashed with XXH3-64. The pieces are
 * independent, so a GPU hashes the pages it received in parallel (one warp
 * per piece, kernels/cuda/checksum.cu) and the host folds 8 bytes per 64 KiB. */
#ifndef HPD_COMMON_HASH_H
#define HPD_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret_fromSeed */
#include <xxhash.h>
#ifdef HPD_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#define HPD_HASH_PIECE_BYTES ((uint64_t)64 << 10)

/* The number of pieces of a put of `bytes` (none for an empty one). */
static inline uint64_t hpd_hash_n_pieces(uint64_t bytes)
{
    return (bytes + HPD_HASH_PIECE_BYTES - 1) / HPD_HASH_PIECE_BYTES;
}

/* The bytes of the piece at offset off (a multiple of the piece size) of a
 * put of `bytes`. */
static inline uint64_t hpd_hash_piece_len(uint64_t bytes, uint64_t off)
{
    return bytes - off < HPD_HASH_PIECE_BYTES ? bytes - off : HPD_HASH_PIECE_BYTES;
}

/* Adds one piece's hash to a checksum. */
static inline void hpd_hash_fold(XXH3_state_t *sum, uint64_t piece_hash)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(piece_hash >> (8 * i));
    XXH3_64bits_update(sum, le, sizeof(le));
}

/* One piece's hash. */
static inline uint64_t hpd_hash_piece(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* Adds a put's bytes (host memory) to a checksum, piece by piece. */
static inline void hpd_hash_put(XXH3_state_t *sum, const void *p, uint64_t n)
{
    for (uint64_t off = 0; off < n; off += HPD_HASH_PIECE_BYTES)
        hpd_hash_fold(sum, hpd_hash_piece((const uint8_t *)p + off, hpd_hash_piece_len(n, off)));
}

#endif
