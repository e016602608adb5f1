/* The CUDA paged KV store and attention (kernels/cuda/attention.cu), run on
 * the host through tests/kernels/cuda_host/, against the CPU backend (the
 * pools bit for bit, attention's relative RMS below 3e-5, NaN failing), with
 * test_backend_cuda's identities: the same bits in 3 page layouts (block
 * sizes 64, 16 and 32, NHD and HND, pack sizes 1, 4 and 2) and for a
 * sequence's rows alone as in the batch. The split-KV pass (split and
 * combine kernels) over 150 rows of prefill (head_dim 64, one split), and
 * with 8 query heads per KV head, head_dim 128 and rows of 1100 keys (three
 * 512-key splits) and of 511 to 513 (across a split's end); the per-row
 * kernel (warp shuffles) with head_dim 66, 40 rows of prefill and rows of
 * 530 keys; cuda-bf16's split pass on tensor cores (bf16 q, k, v and
 * probabilities: relative RMS below 1e-2 against the CPU's fp32, the same
 * identities bit for bit), head_dim 32, 64, 128 and 256, a prompt's blocks
 * of 3 to 128 rows with and without the op's bf16 copy of K and V; and for
 * both passes a sequence's first, middle and last rows alone (a decode
 * row's block) against the same rows in the batch, bit for bit. Outputs go
 * to heads and rows with gaps between them, which no kernel may write. The
 * emulation runs a block's threads in a fixed order and a
 * warp's __syncwarp as a barrier of the whole block, so races between warps
 * are not caught here; test_backend_cuda on a GPU checks them. */
#include "cuda_host_test.h"

/* Pages of one layer in a layout, their tables scattered and descending
 * (as test_backend_cuda's), the pool 16-byte aligned as the split-KV pass
 * needs. */
struct paged_t {
    hpd_kv_layout_t l;
    std::vector<uint32_t> tables[2];
    const uint32_t *ctables[2];
    size_t elems;
    std::vector<float4> cpu_pool, emu_pool;

    paged_t(uint32_t B, uint32_t P, hpd_kv_order_t order, const uint32_t lens[2],
            uint32_t n_kv_heads, uint32_t head_dim)
    {
        l = hpd_kv_layout_t{.block_size = B,
                            .pack_size = P,
                            .order = order,
                            .dtype = HPD_DTYPE_F32,
                            .n_layers = 4,
                            .n_kv_heads = n_kv_heads,
                            .head_dim = head_dim};
        uint32_t pages = 0;
        for (int s = 0; s < 2; s++)
            pages += (lens[s] + B - 1) / B;
        pages = pages * 2 + 3;
        elems = pages * hpd_kv_layout_page_elems(&l);
        cpu_pool.assign(elems / 4 + 1, float4{});
        emu_pool = cpu_pool;
        for (uint32_t s = 0, next = pages - 1; s < 2; s++) {
            for (uint32_t j = 0; j < (lens[s] + B - 1) / B; j++, next -= 2)
                tables[s].push_back(next);
            ctables[s] = tables[s].data();
        }
    }
};

/* Sequence s holds lens[s] keys and queries its last nq[s] positions. */
static void attention_case(hpd_backend_t *cpu, uint32_t NH, uint32_t NKV, uint32_t HD,
                           const uint32_t lens[2], const uint32_t nq[2], bool bf16 = false)
{
    /* cuda-bf16: q, k, v and the probabilities in bf16, against the CPU's fp32 */
    auto run = bf16 ? hpd_cuda_attention_bf16 : hpd_cuda_attention;
    const double tol = bf16 ? 1e-2 : 3e-5;
    const char *mode = bf16 ? "cuda-bf16 " : "";
    test_emu_t emu;
    const size_t kvn = (size_t)(lens[0] + lens[1]) * NKV * HD;
    const size_t rows = nq[0] + nq[1], qn = rows * NH * HD;
    /* out's heads 3 floats apart and its rows 5 more: gaps nothing may
     * write, holding GAP (too small to move a relative RMS) */
    const uint32_t OHS = HD + 3, OLD = NH * OHS + 5;
    const size_t on = rows * OLD, row1 = (size_t)nq[0] * OLD;
    const float GAP = 1e-30f;
    const auto is_gap = [&](size_t e) { return e % OLD >= NH * OHS || e % OLD % OHS >= HD; };
    std::vector<float> out0(on, 0.0f);
    for (size_t e = 0; e < on; e++)
        if (is_gap(e))
            out0[e] = GAP;
    const auto gaps_untouched = [&](const std::vector<float> &o) {
        for (size_t e = 0; e < on; e++)
            if (is_gap(e) && o[e] != GAP)
                return false;
        return true;
    };
    std::vector<float> k = test_rnd(kvn, 20, 1), v = test_rnd(kvn, 21, 1);
    std::vector<float> q = test_rnd(qn, 22, 1), first;
    static const struct {
        uint32_t B, P;
        hpd_kv_order_t o;
    } layouts[] = {{64, 1, HPD_KV_NHD}, {16, 4, HPD_KV_HND}, {32, 2, HPD_KV_NHD}};
    char what[160];

    for (const auto &lo : layouts) {
        paged_t pg(lo.B, lo.P, lo.o, lens, NKV, HD);
        const hpd_seq_t st_seqs[2] = {{.row = 0, .n_tokens = lens[0], .start_pos = 0},
                                      {.row = lens[0], .n_tokens = lens[1], .start_pos = 0}};
        hpd_paged_kv_t kc = {.layout = &pg.l,
                             .pool = pg.cpu_pool.data(),
                             .member = 1 % pg.l.pack_size,
                             .block_tables = pg.ctables};
        hpd_paged_kv_t ke = kc;
        ke.pool = pg.emu_pool.data();
        hpd_kv_store_args_t ks = {.kv = kc,
                                  .k = {.p = k.data(), .ld = NKV * HD, .hs = HD},
                                  .v = {.p = v.data(), .ld = NKV * HD, .hs = HD},
                                  .seqs = st_seqs,
                                  .n_seqs = 2};
        check_status("kv_store", hpd_kv_store(cpu, &ks));
        ks.kv = ke;
        check_status("kv_store", hpd_cuda_kv_store(&emu.be, &ks));
        snprintf(what, sizeof(what), "kv_store B %u P %u: the CPU's pool", lo.B, lo.P);
        check_same(what, (const float *)pg.emu_pool.data(), (const float *)pg.cpu_pool.data(),
                   pg.elems);

        const hpd_seq_t at_seqs[2] = {
            {.row = 0, .n_tokens = nq[0], .start_pos = lens[0] - nq[0]},
            {.row = nq[0], .n_tokens = nq[1], .start_pos = lens[1] - nq[1]}};
        std::vector<float> ocpu = out0, oemu = out0;
        hpd_attention_args_t at = {.kv = kc,
                                   .q = {.p = q.data(), .ld = NH * HD, .hs = HD},
                                   .out = {.p = ocpu.data(), .ld = OLD, .hs = OHS},
                                   .n_heads = NH,
                                   .scale = 0.125f,
                                   .seqs = at_seqs,
                                   .n_seqs = 2};
        check_status("attention", hpd_attention(cpu, &at));
        at.kv = ke, at.out.p = oemu.data();
        check_status("attention", run(&emu.be, &at));
        snprintf(what, sizeof(what), "%sattention %u/%u heads hd %u B %u P %u", mode, NH, NKV,
                 HD, lo.B, lo.P);
        check_close(what, oemu.data(), ocpu.data(), on, tol);
        hpd_test_checked++;
        if (!gaps_untouched(oemu)) {
            fprintf(stderr, "FAIL %s: written between heads or rows\n", what);
            hpd_test_failed++;
        }
        if (first.empty())
            first = oemu;
        snprintf(what, sizeof(what), "%sattention hd %u B %u P %u: the first layout's bits",
                 mode, HD, lo.B, lo.P);
        check_same(what, oemu.data(), first.data(), on);
        /* sequence 1's rows alone */
        std::vector<float> one = out0;
        at.seqs = &at_seqs[1], at.kv.block_tables = &pg.ctables[1], at.n_seqs = 1;
        at.out.p = one.data();
        check_status("attention", run(&emu.be, &at));
        snprintf(what, sizeof(what), "%sattention hd %u B %u P %u: alone vs in the batch", mode,
                 HD, lo.B, lo.P);
        check_same(what, one.data() + row1, first.data() + row1, on - row1);
        if (&lo != layouts)
            continue;
        /* a sequence's first, middle and last rows one at a time (a decode
         * row's block; in the batch they were in a prompt's blocks) */
        for (uint32_t s = 0; s < 2; s++)
            for (uint32_t i : {0u, nq[s] / 2, nq[s] - 1}) {
                const size_t row = (s ? nq[0] : 0) + i, at_row = row * OLD;
                const hpd_seq_t alone = {
                    .row = (uint32_t)row, .n_tokens = 1, .start_pos = lens[s] - nq[s] + i};
                at.seqs = &alone, at.kv.block_tables = &pg.ctables[s], at.n_seqs = 1;
                check_status("attention", run(&emu.be, &at));
                snprintf(what, sizeof(what), "%sattention hd %u: row %zu (position %u) alone",
                         mode, HD, row, alone.start_pos);
                check_same(what, one.data() + at_row, first.data() + at_row, OLD);
            }
    }
}

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    hpd_backend_t *cpu = test_cpu_backend();
    /* split-KV, one split: 150 rows of prefill and a decode row */
    const uint32_t lens64[2] = {150, 78}, nq64[2] = {150, 1};
    attention_case(cpu, 8, 2, 64, lens64, nq64);
    /* split-KV: rows at 1094..1099 (3 splits), 510..512 (1 and 2 splits) */
    const uint32_t lens[2] = {1100, 513}, nq[2] = {6, 3};
    attention_case(cpu, 16, 2, 128, lens, nq);
    /* the per-row kernel: head_dim not a multiple of 4 */
    const uint32_t lens66[2] = {40, 530}, nq66[2] = {40, 2};
    attention_case(cpu, 4, 2, 66, lens66, nq66);
    /* cuda-bf16's split pass on tensor cores: the same cases, and head_dim
     * 256 with 8 heads per KV head (Qwen3-Next's), rows in blocks of 8 */
    attention_case(cpu, 8, 2, 64, lens64, nq64, true);
    attention_case(cpu, 16, 2, 128, lens, nq, true);
    const uint32_t lens256[2] = {530, 20}, nq256[2] = {11, 1};
    attention_case(cpu, 16, 2, 256, lens256, nq256, true);
    /* a prompt's blocks of 16 rows across a split's end (positions 506 to
     * 529); of 8 rows (16 heads per KV head); of 128 rows (one head) */
    const uint32_t lens_x[2] = {530, 20}, nq_x[2] = {24, 20};
    attention_case(cpu, 16, 2, 128, lens_x, nq_x, true);
    attention_case(cpu, 16, 1, 64, lens_x, nq_x, true);
    const uint32_t lens_m[2] = {200, 3}, nq_m[2] = {150, 3};
    attention_case(cpu, 2, 2, 32, lens_m, nq_m, true);
    /* out over q: refused (split blocks write short rows while others read
     * q), nothing written */
    {
        test_emu_t emu;
        const uint32_t lens1[2] = {8, 0};
        paged_t pg(16, 1, HPD_KV_NHD, lens1, 1, 16);
        std::vector<float> q = test_rnd(4 * 16, 5, 1), q0 = q;
        const hpd_seq_t seq = {.row = 0, .n_tokens = 4, .start_pos = 4};
        hpd_attention_args_t at = {
            .kv = {.layout = &pg.l, .pool = pg.emu_pool.data(), .block_tables = pg.ctables},
            .q = {.p = q.data(), .ld = 16, .hs = 16},
            .out = {.p = q.data() + 8, .ld = 16, .hs = 16},
            .n_heads = 1,
            .scale = 0.25f,
            .seqs = &seq,
            .n_seqs = 1};
        hpd_test_checked++;
        if (hpd_cuda_attention_bf16(&emu.be, &at) != HPD_ERR_INVALID_ARG || q != q0) {
            fprintf(stderr, "FAIL attention with out over q: not refused, or q written\n");
            hpd_test_failed++;
        }
    }
    hpd_backend_destroy(cpu);
    return test_report("test_attention_cuda_host", t0);
}
