/* Pieces of device memory hashed for a transfer's checksum (common/hash.h,
 * docs/protocol.md): XXH3-64, seed 0, of each piece of up to 64 KiB, one
 * warp per piece, the same value libxxhash gives for the same bytes.
 *
 * XXH3 of more than 240 bytes keeps 8 64-bit accumulators over stripes of
 * 64 bytes: stripe s adds, for each word i, word i to accumulator i ^ 1 and
 * lo32(w ^ key) * hi32(w ^ key) to accumulator i (key: the secret's word at
 * byte 8 s + 8 i); after each block of 16 stripes the accumulators are
 * scrambled. Adds modulo 2^64 do not depend on their order, so a warp takes
 * a block's stripes four at a time: lane = 8 g + i handles word i of stripes
 * g, g + 4, g + 8, g + 12, takes its neighbour's word sums by a shuffle, and
 * the four groups' sums meet by shuffles; every lane with the same i then
 * holds the same accumulator. Inputs of at most 240 bytes are hashed by the
 * warp's first lane. */
#include "kernels/cuda/cuda_ops.h"

#include "common/hash.h"

namespace {

constexpr uint32_t STRIPE = 64, BLOCK = 1024, SECRET = 192, WARPS = 4;
constexpr uint64_t P32_1 = 0x9E3779B1u, P32_2 = 0x85EBCA77u, P32_3 = 0xC2B2AE3Du;
constexpr uint64_t P64_1 = 0x9E3779B185EBCA87ull, P64_2 = 0xC2B2AE3D27D4EB4Full,
                   P64_3 = 0x165667B19E3779F9ull, P64_4 = 0x85EBCA77C2B2AE63ull,
                   P64_5 = 0x27D4EB2F165667C5ull;

struct piece_t {
    const uint8_t *p;
    uint64_t bytes;
};

/* little-endian reads at any alignment */
__device__ inline uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = v << 8 | p[b];
    return v;
}
__device__ inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

__device__ inline uint64_t fold(uint64_t a, uint64_t b) /* 128-bit product, halves xor'ed */
{
    return a * b ^ __umul64hi(a, b);
}
__device__ inline uint64_t rotl(uint64_t x, int r)
{
    return x << r | x >> (64 - r);
}
__device__ inline uint64_t bswap(uint64_t x)
{
    uint64_t r = 0;
    for (int b = 0; b < 8; b++)
        r = r << 8 | (x >> (8 * b) & 0xff);
    return r;
}
__device__ inline uint64_t avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ h >> 32;
}
__device__ inline uint64_t avalanche64(uint64_t h) /* XXH64's */
{
    h ^= h >> 33;
    h *= P64_2;
    h ^= h >> 29;
    h *= P64_3;
    return h ^ h >> 32;
}
__device__ inline uint64_t mix16(const uint8_t *in, const uint8_t *sec)
{
    return fold(rd64(in) ^ rd64(sec), rd64(in + 8) ^ rd64(sec + 8));
}

/* XXH3-64 of at most 240 bytes (one thread) */
__device__ uint64_t hash_short(const uint8_t *in, uint32_t len, const uint8_t *sec)
{
    if (len == 0)
        return avalanche64(rd64(sec + 56) ^ rd64(sec + 64));
    if (len <= 3) {
        const uint32_t c = (uint32_t)in[0] << 16 | (uint32_t)in[len >> 1] << 24 | in[len - 1] |
                           len << 8;
        return avalanche64((uint64_t)c ^ (uint64_t)(rd32(sec) ^ rd32(sec + 4)));
    }
    if (len <= 8) {
        const uint64_t x = (uint64_t)rd32(in + len - 4) + ((uint64_t)rd32(in) << 32);
        uint64_t h = x ^ (rd64(sec + 8) ^ rd64(sec + 16));
        h ^= rotl(h, 49) ^ rotl(h, 24);
        h *= 0x9FB21C651E98DF25ull;
        h ^= (h >> 35) + len;
        h *= 0x9FB21C651E98DF25ull;
        return h ^ h >> 28;
    }
    if (len <= 16) {
        const uint64_t lo = rd64(in) ^ (rd64(sec + 24) ^ rd64(sec + 32));
        const uint64_t hi = rd64(in + len - 8) ^ (rd64(sec + 40) ^ rd64(sec + 48));
        return avalanche(len + bswap(lo) + hi + fold(lo, hi));
    }
    uint64_t acc = len * P64_1;
    if (len <= 128) {
        /* pairs of 16 bytes from both ends, inwards */
        const uint32_t pairs = (len - 1) / 32 + 1;
        for (uint32_t r = pairs; r-- > 0;)
            acc += mix16(in + 16 * r, sec + 32 * r) + mix16(in + len - 16 * (r + 1), sec + 32 * r + 16);
        return avalanche(acc);
    }
    for (uint32_t r = 0; r < 8; r++)
        acc += mix16(in + 16 * r, sec + 16 * r);
    acc = avalanche(acc);
    for (uint32_t r = 8; r < len / 16; r++)
        acc += mix16(in + 16 * r, sec + 16 * (r - 8) + 3);
    return avalanche(acc + mix16(in + len - 16, sec + 136 - 17));
}

/* a lane's word of stripe s: 8-byte loads where the piece is aligned */
__device__ inline uint64_t word(const uint8_t *p, bool aligned)
{
    return aligned ? *(const uint64_t *)p : rd64(p);
}

/* What lane (group g, word i) adds to accumulator i for `n` stripes at `base`:
 * its words' products, and its neighbour's (i ^ 1) words. keys[j]: the
 * secret's word i of stripe g + 4 j. */
__device__ inline uint64_t stripes(const uint8_t *base, uint32_t n, uint32_t g, uint32_t i,
                                   const uint64_t keys[4], bool aligned)
{
    uint64_t prod = 0, sum = 0;
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        const uint32_t s = g + 4 * j;
        if (s < n) {
            const uint64_t w = word(base + s * STRIPE + 8 * i, aligned), k = w ^ keys[j];
            sum += w;
            prod += (k & 0xffffffffu) * (k >> 32);
        }
    }
    uint64_t part = prod + __shfl_xor_sync(0xffffffffu, sum, 1);
    part += __shfl_xor_sync(0xffffffffu, part, 8);
    return part + __shfl_xor_sync(0xffffffffu, part, 16);
}

/* XXH3-64 of more than 240 bytes, by a whole warp; lane 0's result counts */
__device__ uint64_t hash_long(const uint8_t *in, uint64_t len, const uint8_t *sec, uint32_t lane)
{
    const uint32_t i = lane & 7, g = lane >> 3;
    const bool aligned = ((uintptr_t)in & 7) == 0;
    /* the initial accumulators, selected (an indexed array would live in
     * local memory) */
    uint64_t acc = i == 0 ? P32_3 : i == 1 ? P64_1 : i == 2 ? P64_2 : i == 3 ? P64_3
                 : i == 4 ? P64_4 : i == 5 ? P32_2 : i == 6 ? P64_5 : P32_1;
    uint64_t keys[4];
    for (uint32_t j = 0; j < 4; j++)
        keys[j] = rd64(sec + 8 * (g + 4 * j) + 8 * i);
    const uint64_t scramble = rd64(sec + SECRET - STRIPE + 8 * i);
    const uint64_t n_blocks = (len - 1) / BLOCK;
    for (uint64_t b = 0; b < n_blocks; b++) {
        acc += stripes(in + b * BLOCK, BLOCK / STRIPE, g, i, keys, aligned);
        acc = ((acc ^ acc >> 47) ^ scramble) * P32_1;
    }
    const uint32_t rest = (uint32_t)(((len - 1) - BLOCK * n_blocks) / STRIPE);
    acc += stripes(in + n_blocks * BLOCK, rest, g, i, keys, aligned);
    /* the last stripe, with its own key, by group 0 alone */
    const uint64_t last_key[4] = {rd64(sec + SECRET - STRIPE - 7 + 8 * i), 0, 0, 0};
    acc += stripes(in + len - STRIPE, g == 0 ? 1 : 0, 0, i, last_key,
                   ((uintptr_t)(in + len) & 7) == 0);
    /* merge: lanes 0, 2, 4, 6 fold their pair; lane 0 sums the four */
    const uint64_t next = __shfl_down_sync(0xffffffffu, acc, 1);
    uint64_t m = fold(acc ^ rd64(sec + 11 + 8 * i), next ^ rd64(sec + 11 + 8 * i + 8));
    m += __shfl_down_sync(0xffffffffu, m, 2);
    m += __shfl_down_sync(0xffffffffu, m, 4);
    return avalanche(len * P64_1 + m);
}

__global__ void __launch_bounds__(WARPS * 32)
    hash_pieces_kernel(const piece_t *pieces, uint32_t n, const uint8_t *secret, uint64_t *out)
{
    const uint32_t w = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= n)
        return; /* the whole warp */
    const piece_t pc = pieces[w];
    uint64_t h = 0;
    if (pc.bytes > 240)
        h = hash_long(pc.p, pc.bytes, secret, lane);
    else if (lane == 0)
        h = hash_short(pc.p, (uint32_t)pc.bytes, secret);
    if (lane == 0)
        out[w] = h;
}

} // namespace

hpd_status_t hpd_cuda_hash_pieces(hpd_backend_t *b, const hpd_hash_pieces_args_t *a)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    uint64_t n = 0;
    for (uint32_t s = 0; s < a->n_spans; s++)
        n += hpd_hash_n_pieces(a->spans[s].bytes);
    if (n == 0)
        return HPD_OK;
    if (n > UINT32_MAX / WARPS)
        return HPD_ERR_INVALID_ARG;
    piece_t *pieces = (piece_t *)malloc(n * sizeof(*pieces));
    if (pieces == NULL)
        return HPD_ERR_NO_MEMORY;
    uint64_t k = 0;
    for (uint32_t s = 0; s < a->n_spans; s++)
        for (uint64_t off = 0; off < a->spans[s].bytes; off += HPD_HASH_PIECE_BYTES)
            pieces[k++] = {(const uint8_t *)a->spans[s].ptr + off,
                           hpd_hash_piece_len(a->spans[s].bytes, off)};
    /* libxxhash's default secret: the one its seed 0 derives */
    uint8_t secret[SECRET];
    XXH3_generateSecret_fromSeed(secret, 0);
    void *dpieces, *dsecret, *dout;
    const hpd_cuda_meta_t m[] = {{.host = pieces, .bytes = n * sizeof(*pieces), .dev_p = &dpieces},
                                 {.host = secret, .bytes = SECRET, .dev_p = &dsecret},
                                 {.host = NULL, .bytes = n * sizeof(uint64_t), .dev_p = &dout}};
    hpd_status_t st = hpd_cuda_stage(b, m, 3);
    free(pieces);
    if (st != HPD_OK)
        return st;
    hash_pieces_kernel<<<(uint32_t)((n + WARPS - 1) / WARPS), WARPS * 32, 0, c->stream>>>(
        (const piece_t *)dpieces, (uint32_t)n, (const uint8_t *)dsecret, (uint64_t *)dout);
    HPD_CUDA_LAUNCHED();
    HPD_CUDA_CHECK(cudaMemcpyAsync(a->out, dout, n * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                   c->stream));
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return HPD_OK;
}
