/* KV layout translation (translate_kernel in kernels/cuda/translate.cu) on
 * the host stand-in: the CPU backend's bytes, every byte of the destination
 * pool, over layouts that differ in block size, pack size and order, layer
 * ranges, positions off a page's start, the zeroed tail, F32 rows (copied in
 * 32-bit words) and BF16 rows of an odd head_dim (copied byte by byte). The
 * rows the translation does not write keep their bytes. Layouts of another
 * dtype, layer count, KV head count or head_dim, and layer ranges past the
 * layers, are refused with nothing written. It needs no GPU;
 * test_backend_cuda runs the op on one. */
#include "cuda_host_test.h"

/* a pool of pages in a random order, each byte from a seeded draw */
struct pool_t {
    hpd_kv_layout_t l;
    std::vector<uint8_t> bytes;
    std::vector<uint32_t> ids; /* [groups][blocks] */
    std::vector<const uint32_t *> tables;

    pool_t(hpd_kv_layout_t layout, uint32_t tokens, uint32_t seed) : l(layout)
    {
        const uint32_t groups = hpd_kv_layout_n_groups(&l);
        const uint32_t blocks = (tokens + l.block_size - 1) / l.block_size;
        const uint32_t pages = groups * blocks + 2;
        std::mt19937 rng(seed);
        bytes.resize((size_t)pages * hpd_kv_layout_page_bytes(&l));
        for (uint8_t &b : bytes)
            b = (uint8_t)rng();
        std::vector<uint32_t> perm(pages);
        for (uint32_t i = 0; i < pages; i++)
            perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        ids.assign(perm.begin(), perm.begin() + groups * blocks);
        for (uint32_t g = 0; g < groups; g++)
            tables.push_back(ids.data() + (size_t)g * blocks);
    }
    pool_t(const pool_t &) = delete; /* tables point into ids */
    hpd_kv_span_t span(uint32_t pos) { return {&l, bytes.data(), tables.data(), pos}; }
};

struct tr_case {
    uint32_t B_src, P_src, B_dst, P_dst; /* block and pack sizes */
    hpd_kv_order_t o_src, o_dst;
    hpd_dtype_t dtype;
    uint32_t layers, heads, hd, spos, dpos, tokens, first, n_layers;
    bool zero_tail;
    uint32_t src_head, sub_heads; /* some of the heads (0: all) */
    uint32_t dst_heads, dst_head; /* into heads from dst_head of dst_heads (0: sub_heads) */
};

static void translate_case(hpd_backend_t *cpu, const tr_case &c, uint32_t seed)
{
    const hpd_kv_layout_t sl = {.block_size = c.B_src, .pack_size = c.P_src, .order = c.o_src,
                                .dtype = c.dtype, .n_layers = c.layers,
                                .n_kv_heads = c.heads, .head_dim = c.hd};
    hpd_kv_layout_t dl = sl;
    dl.block_size = c.B_dst, dl.pack_size = c.P_dst, dl.order = c.o_dst;
    if (c.sub_heads > 0)
        dl.n_kv_heads = c.dst_heads > 0 ? c.dst_heads : c.sub_heads;
    pool_t src(sl, c.spos + c.tokens, seed);
    /* room for the tail up to the destination's page end; the same seed,
     * the same pool */
    pool_t got(dl, c.dpos + c.tokens + c.B_dst, seed + 1);
    pool_t want(dl, c.dpos + c.tokens + c.B_dst, seed + 1);
    hpd_kv_translate_args_t a = {.src = src.span(c.spos), .dst = got.span(c.dpos),
                                 .n_tokens = c.tokens, .zero_tail = c.zero_tail,
                                 .first_layer = c.first, .n_layers = c.n_layers,
                                 .src_head = c.src_head, .heads = c.sub_heads,
                                 .dst_head = c.dst_head};
    test_emu_t emu;
    check_status("kv_translate", hpd_cuda_kv_translate(&emu.be, &a));
    a.dst = want.span(c.dpos);
    check_status("cpu kv_translate", hpd_kv_translate(cpu, &a));
    hpd_test_checked++;
    size_t i = 0;
    while (i < got.bytes.size() && got.bytes[i] == want.bytes[i])
        i++;
    if (i < got.bytes.size()) {
        fprintf(stderr, "FAIL kv_translate B %u/%u P %u/%u %s %u layers from %u, %u tokens "
                "%u -> %u%s: byte %zu of %zu is %u, the CPU wrote %u\n", c.B_src, c.B_dst,
                c.P_src, c.P_dst, hpd_dtype_name(c.dtype), c.n_layers, c.first, c.tokens,
                c.spos, c.dpos, c.zero_tail ? " zero tail" : "", i, got.bytes.size(),
                got.bytes[i], want.bytes[i]);
        hpd_test_failed++;
    }
}

/* Layouts that differ in more than block size, pack size and order, and
 * layer ranges past the layers: refused (HPD_ERR_INVALID_ARG), as on the
 * CPU, and nothing written. */
static void translate_refused(hpd_backend_t *cpu)
{
    const hpd_kv_layout_t sl = {.block_size = 16, .pack_size = 2, .order = HPD_KV_NHD,
                                .dtype = HPD_DTYPE_F32, .n_layers = 4, .n_kv_heads = 2,
                                .head_dim = 8};
    for (int bad = 0; bad < 6; bad++) {
        hpd_kv_layout_t dl = sl;
        uint32_t first = 0, n_layers = 0;
        const char *what[] = {"dtype", "layer count", "KV heads", "head_dim",
                              "layers past the last", "an empty layer range"};
        if (bad == 0)
            dl.dtype = HPD_DTYPE_BF16;
        else if (bad == 1)
            dl.n_layers = 5;
        else if (bad == 2)
            dl.n_kv_heads = 1;
        else if (bad == 3)
            dl.head_dim = 16;
        else if (bad == 4)
            first = 2, n_layers = 3;
        else
            first = 4;
        pool_t src(sl, 20, 90), dst(dl, 20, 91);
        const std::vector<uint8_t> before = dst.bytes;
        const hpd_kv_translate_args_t a = {.src = src.span(0), .dst = dst.span(0),
                                           .n_tokens = 20, .zero_tail = true,
                                           .first_layer = first, .n_layers = n_layers};
        test_emu_t emu;
        const hpd_status_t got = hpd_cuda_kv_translate(&emu.be, &a);
        const hpd_status_t want = hpd_kv_translate(cpu, &a);
        hpd_test_checked++;
        if (got != HPD_ERR_INVALID_ARG || want != HPD_ERR_INVALID_ARG || dst.bytes != before) {
            fprintf(stderr, "FAIL kv_translate with another %s: %s (the CPU: %s), %s\n",
                    what[bad], hpd_status_str(got), hpd_status_str(want),
                    dst.bytes != before ? "written" : "nothing written");
            hpd_test_failed++;
        }
    }
}

/* a slot copy: the bytes, nothing past them */
static void slot_copy_case()
{
    std::vector<uint8_t> from(1000), to(1003, 0xab);
    for (size_t i = 0; i < from.size(); i++)
        from[i] = (uint8_t)(i * 7 + 1);
    const hpd_slot_copy_args_t a = {.dst = to.data(), .src = from.data(), .bytes = 999};
    test_emu_t emu;
    check_status("slot_copy", hpd_cuda_slot_copy(&emu.be, &a));
    hpd_test_checked++;
    if (memcmp(to.data(), from.data(), 999) != 0 || to[999] != 0xab || to[1002] != 0xab) {
        fprintf(stderr, "FAIL slot_copy: not the 999 bytes alone\n");
        hpd_test_failed++;
    }
}

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();
    const hpd_kv_order_t N = HPD_KV_NHD, H = HPD_KV_HND;
    const hpd_dtype_t F32 = HPD_DTYPE_F32, BF16 = HPD_DTYPE_BF16;
    const tr_case cases[] = {
        /* Qwen3-Next's 12 attention layers, 2 KV heads of 256: a prefill
         * node's pack of 1 to a decode node's pack of 4, whole prompt */
        {64, 1, 16, 4, N, H, F32, 12, 2, 256, 0, 0, 100, 0, 0, true},
        /* one pack group pushed alone, into the middle of a page */
        {16, 4, 32, 3, H, N, F32, 12, 2, 64, 5, 37, 40, 4, 4, true},
        /* no tail, positions off both pages' starts, BF16 rows of 6 bytes */
        {48, 2, 16, 1, N, N, BF16, 5, 3, 3, 7, 9, 30, 1, 3, false},
        {16, 3, 128, 2, H, H, BF16, 6, 1, 3, 0, 120, 9, 0, 0, true},
        /* BF16 rows of a multiple of 4 bytes: the word copy */
        {32, 2, 32, 6, N, H, BF16, 6, 4, 64, 31, 1, 33, 0, 0, true},
        /* tensor parallelism: heads 2 and 3 of 4 (a decode rank's of a
         * prefill rank's), and head 3 alone, into layouts of those heads */
        {64, 1, 16, 4, N, H, F32, 12, 4, 64, 0, 0, 100, 0, 0, true, 2, 2},
        {16, 2, 32, 1, H, N, BF16, 4, 4, 6, 3, 5, 40, 1, 2, false, 3, 1},
        /* a prefill rank's head 1 as head 1 of a decode rank's 2 (P 2 ->
         * D 1), the tail of that head only */
        {64, 1, 16, 4, N, H, F32, 12, 2, 64, 0, 0, 100, 0, 0, true, 1, 1, 2, 1},
        {16, 2, 32, 1, H, N, BF16, 4, 4, 6, 3, 5, 40, 1, 2, true, 0, 2, 4, 2},
    };
    uint32_t seed = 1;
    for (const tr_case &c : cases)
        translate_case(cpu, c, seed += 2);
    translate_refused(cpu);
    slot_copy_case();
    hpd_backend_destroy(cpu);
    return test_report("test_translate_cuda_host", t0);
}
