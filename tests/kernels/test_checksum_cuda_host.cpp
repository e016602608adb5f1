/* The CUDA checksum kernel (kernels/cuda/checksum.cu), run on the host
 * through tests/kernels/cuda_host/, against libxxhash: every piece's hash
 * must be XXH3_64bits of the same bytes. Every length of XXH3's short forms
 * (0-240) and the long form around its stripe and block edges, pieces at
 * every alignment, spans cut into pieces of 64 KiB with a shorter last one,
 * and empty spans (no piece) between others. A mismatch is named with its
 * length and alignment; main returns whether any failed. It needs no GPU;
 * test_backend_cuda runs the kernel on one. */
#include <cstdio>
#include <random>
#include <vector>

#include "common/hash.h"
#include "kernels/cuda/cuda_ops.h"

static int failed, checked;

/* Hashes the spans in one call and checks every piece. */
static void check(hpd_backend_t *be, const std::vector<hpd_hash_span_t> &spans, const char *what)
{
    uint64_t n = 0;
    for (const hpd_hash_span_t &s : spans)
        n += hpd_hash_n_pieces(s.bytes);
    std::vector<uint64_t> out(n + 1, 0x5a5a5a5a5a5a5a5aull);
    hpd_hash_pieces_args_t a = {spans.data(), (uint32_t)spans.size(), out.data()};
    if (hpd_cuda_hash_pieces(be, &a) != HPD_OK) {
        fprintf(stderr, "%s: hpd_cuda_hash_pieces failed\n", what);
        failed++;
        return;
    }
    uint64_t k = 0;
    for (const hpd_hash_span_t &s : spans)
        for (uint64_t off = 0; off < s.bytes; off += HPD_HASH_PIECE_BYTES, k++) {
            const uint64_t len = std::min(HPD_HASH_PIECE_BYTES, s.bytes - off);
            const uint8_t *p = (const uint8_t *)s.ptr + off;
            const uint64_t want = XXH3_64bits(p, len);
            checked++;
            if (out[k] != want) {
                failed++;
                fprintf(stderr, "%s: piece of %llu bytes at alignment %u: %016llx, libxxhash "
                        "gives %016llx\n", what, (unsigned long long)len,
                        (unsigned)((uintptr_t)p % 8), (unsigned long long)out[k],
                        (unsigned long long)want);
            }
        }
    if (out[n] != 0x5a5a5a5a5a5a5a5aull) {
        failed++;
        fprintf(stderr, "%s: written past the %llu pieces\n", what, (unsigned long long)n);
    }
}

int main()
{
    hpd_cuda_ctx_t ctx = hpd_emu_ctx();
    hpd_backend_t be = {nullptr, &ctx};
    std::mt19937 rng(11);
    std::vector<uint8_t> buf(600000);
    for (uint8_t &v : buf)
        v = (uint8_t)rng();
    uint8_t *base = buf.data() + (8 - (uintptr_t)buf.data() % 8) % 8; /* 8-byte aligned */

    /* every short length and the first long ones, at alignments 0 and 3,
     * all in one call (one warp each) */
    std::vector<hpd_hash_span_t> spans;
    for (uint64_t len = 0; len <= 400; len++)
        spans.push_back({base + 1000 * (len % 7) + (len % 2 ? 3 : 0), len});
    check(&be, spans, "lengths 0-400");

    /* the long form's edges: stripes, blocks of 1024, the last stripe
     * overlapping the last partial block, at every alignment */
    spans.clear();
    static const uint64_t edges[] = {960,  1023, 1024, 1025, 1087, 1088, 1089, 2047,
                                     2048, 2049, 3000, 4096, 9999, 65535, 65536};
    for (uint32_t al = 0; al < 8; al++)
        for (uint64_t len : edges)
            spans.push_back({base + 70000 + al, len});
    check(&be, spans, "block edges");

    /* spans of several pieces (64 KiB, the last shorter), empty spans between */
    spans = {{base, 65537}, {base + 5, 0}, {base + 8, 200000}, {base + 1, 131072},
             {base + 300000, 0}, {base + 300003, 299997}};
    check(&be, spans, "spans of pieces");

    /* a span in an op of its own, and an op with nothing to hash */
    check(&be, {{base + 16, 4097}}, "one span");
    check(&be, {}, "no span");

    hpd_emu_ctx_free(&ctx);
    printf("%d pieces checked against libxxhash, %d wrong\n", checked, failed);
    return failed != 0;
}
