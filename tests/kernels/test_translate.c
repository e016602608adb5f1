/* Property tests of KV layout translation over random layouts, positions,
 * lengths and layer ranges: exact, round-trips, zero-fills the destination's
 * tail, and writes nothing else. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/backend.h"
#include "tests/test_helpers.h"

typedef struct {
    hpd_kv_layout_t l;
    uint32_t n_pages;
    float *pool;
    uint32_t *ids; /* [groups][blocks] */
    uint32_t blocks;
    const uint32_t *tables[16];
} paged_t;

static uint32_t rnd(uint64_t *s, uint32_t n)
{
    *s += 1;
    return hpd_philox4x32(99, *s, 0).v[0] % n;
}

static void paged_init(paged_t *p, hpd_kv_layout_t l, uint32_t tokens, uint64_t *seed)
{
    const uint32_t groups = hpd_kv_layout_n_groups(&l);
    p->l = l;
    p->blocks = (tokens + l.block_size - 1) / l.block_size;
    p->n_pages = groups * p->blocks + 3;
    p->pool = malloc(p->n_pages * hpd_kv_layout_page_bytes(&l));
    for (size_t i = 0; i < p->n_pages * hpd_kv_layout_page_elems(&l); i++)
        p->pool[i] = NAN; /* anything not written stays NaN */
    /* a random permutation of pages */
    uint32_t *perm = malloc(p->n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < p->n_pages; i++)
        perm[i] = i;
    for (uint32_t i = p->n_pages - 1; i > 0; i--) {
        uint32_t j = rnd(seed, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    p->ids = malloc(groups * p->blocks * sizeof(uint32_t));
    for (uint32_t i = 0; i < groups * p->blocks; i++)
        p->ids[i] = perm[i];
    for (uint32_t g = 0; g < groups; g++)
        p->tables[g] = p->ids + g * p->blocks;
    free(perm);
}

static float *row_of(paged_t *p, uint32_t layer, uint32_t kv, uint32_t pos, uint32_t h)
{
    const uint32_t g = layer / p->l.pack_size, m = layer % p->l.pack_size;
    return p->pool + p->tables[g][pos / p->l.block_size] * hpd_kv_layout_page_elems(&p->l) +
           hpd_kv_layout_row(&p->l, m, kv, pos % p->l.block_size, h);
}

static float value(uint32_t layer, uint32_t kv, uint32_t pos, uint32_t h, uint32_t d)
{
    return (float)(((layer * 2 + kv) * 10000 + pos) * 100 + h * 10 + d);
}

static hpd_kv_layout_t random_layout(uint64_t *s, uint32_t A, uint32_t nkv, uint32_t hd)
{
    const uint32_t Bs[] = {16, 32, 48, 64, 128, 256};
    hpd_kv_layout_t l = {.block_size = Bs[rnd(s, 6)],
                         .pack_size = 1 + rnd(s, A),
                         .order = rnd(s, 2) ? HPD_KV_HND : HPD_KV_NHD,
                         .dtype = HPD_DTYPE_F32,
                         .n_layers = A,
                         .n_kv_heads = nkv,
                         .head_dim = hd};
    return l;
}

/* The destination pool as it must be after a translation of n tokens of
 * layers [l0, l1) to position dpos: those rows hold the source's values, the
 * rows after them up to the end of their page are zero when zero_tail, and
 * every other float (rows before dpos, other layers, pages outside the
 * table, whatever the layout leaves unused) is still the NaN it was. */
/* every row of the n tokens at pos of p: value() of its place */
static void fill_rows(paged_t *p, uint32_t pos, uint32_t n)
{
    for (uint32_t layer = 0; layer < p->l.n_layers; layer++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t h = 0; h < p->l.n_kv_heads; h++)
                    for (uint32_t d = 0; d < p->l.head_dim; d++)
                        row_of(p, layer, kv, pos + i, h)[d] = value(layer, kv, i, h, d);
}

/* dst head h holds src head head0 + h */
static float *expected_pool(paged_t *b, uint32_t l0, uint32_t l1, uint32_t dpos, uint32_t n,
                            bool zero_tail, uint32_t head0, uint32_t heads, uint32_t dst_head)
{
    const size_t elems = b->n_pages * hpd_kv_layout_page_elems(&b->l);
    const uint32_t end = dpos + n;
    const uint32_t page_end = (end + b->l.block_size - 1) / b->l.block_size * b->l.block_size;
    float *want = malloc(elems * sizeof(float)), *saved = b->pool;
    memcpy(want, b->pool, elems * sizeof(float));
    b->pool = want; /* row_of addresses the copy */
    for (uint32_t layer = l0; layer < l1; layer++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t h = dst_head; h < dst_head + heads; h++)
                for (uint32_t d = 0; d < b->l.head_dim; d++) {
                    for (uint32_t i = 0; i < n; i++)
                        row_of(b, layer, kv, dpos + i, h)[d] =
                            value(layer, kv, i, head0 + h - dst_head, d);
                    for (uint32_t p = end; zero_tail && p < page_end; p++)
                        row_of(b, layer, kv, p, h)[d] = 0.0f;
                }
    b->pool = saved;
    return want;
}

/* Random layouts, positions, lengths and layer ranges: the destination pool
 * must equal expected_pool byte for byte (so a write anywhere else, even to
 * memory the layout does not use, fails), and translating back must give
 * the source's rows. */
static void test_random_translations(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    uint64_t s = 0;

    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    for (int iter = 0; iter < 300; iter++) {
        const uint32_t A = 1 + rnd(&s, 5), nkv = 1 + rnd(&s, 3), hd = 1 + rnd(&s, 8);
        const uint32_t n = 1 + rnd(&s, 300), spos = rnd(&s, 100), dpos = rnd(&s, 100);
        /* every other iteration a layer range (n_layers 0 means all) */
        const uint32_t first = iter % 2 ? rnd(&s, A) : 0;
        const uint32_t n_layers = iter % 2 ? 1 + rnd(&s, A - first) : 0;
        const uint32_t l0 = first, l1 = n_layers ? first + n_layers : A;
        const bool zero_tail = iter % 4 != 3;
        paged_t a, b, back;
        paged_init(&a, random_layout(&s, A, nkv, hd), spos + n, &s);
        paged_init(&b, random_layout(&s, A, nkv, hd), dpos + n, &s);
        paged_init(&back, a.l, spos + n, &s);
        fill_rows(&a, spos, n);

        float *want = expected_pool(&b, l0, l1, dpos, n, zero_tail, 0, nkv, 0);
        hpd_kv_translate_args_t t = {
            .src = {.layout = &a.l, .pool = a.pool, .tables = a.tables, .pos = spos},
            .dst = {.layout = &b.l, .pool = b.pool, .tables = b.tables, .pos = dpos},
            .n_tokens = n,
            .zero_tail = zero_tail,
            .first_layer = first,
            .n_layers = n_layers};
        assert_int_equal(hpd_kv_translate(be, &t), HPD_OK);
        const size_t bytes = b.n_pages * hpd_kv_layout_page_bytes(&b.l);
        if (memcmp(b.pool, want, bytes) != 0) {
            const float *got = b.pool;
            size_t i = 0;
            while (memcmp(&got[i], &want[i], sizeof(float)) == 0)
                i++;
            fail_msg("iteration %d (layers %u..%u of %u, %u tokens at %u -> %u, zero_tail %d): "
                     "float %zu of the destination pool is %g, expected %g",
                     iter, l0, l1, A, n, spos, dpos, zero_tail, i, got[i], want[i]);
        }
        free(want);
        /* and back: A -> B -> A is the identity on the tokens of those layers */
        hpd_kv_translate_args_t r = {
            .src = {.layout = &b.l, .pool = b.pool, .tables = b.tables, .pos = dpos},
            .dst = {.layout = &back.l, .pool = back.pool, .tables = back.tables, .pos = spos},
            .n_tokens = n,
            .first_layer = first,
            .n_layers = n_layers};
        assert_int_equal(hpd_kv_translate(be, &r), HPD_OK);
        for (uint32_t layer = l0; layer < l1; layer++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t i = 0; i < n; i++)
                    for (uint32_t h = 0; h < nkv; h++)
                        assert_memory_equal(row_of(&back, layer, kv, spos + i, h),
                                            row_of(&a, layer, kv, spos + i, h), hd * 4);
        free(a.pool), free(a.ids), free(b.pool), free(b.ids), free(back.pool), free(back.ids);
    }
    /* layouts of different shapes are refused */
    hpd_kv_layout_t x = {.block_size = 16,
                         .pack_size = 1,
                         .order = HPD_KV_NHD,
                         .dtype = HPD_DTYPE_F32,
                         .n_layers = 2,
                         .n_kv_heads = 1,
                         .head_dim = 4},
                    y = x;
    y.head_dim = 8;
    float buf[1024];
    uint32_t id = 0;
    const uint32_t *tab[2] = {&id, &id};
    hpd_kv_translate_args_t bad = {.src = {.layout = &x, .pool = buf, .tables = tab},
                                   .dst = {.layout = &y, .pool = buf, .tables = tab},
                                   .n_tokens = 1};
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG);
    /* and so are layer ranges outside the 2 layers */
    bad.dst.layout = &x;
    bad.first_layer = 2;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG);
    bad.first_layer = 1, bad.n_layers = 2;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG);
    bad.first_layer = 1, bad.n_layers = 1;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_OK);

    /* slot copy */
    float s1[10], s2[10];
    test_fill(s1, 10, 3, 1.0f);
    hpd_slot_copy_args_t c = {.dst = s2, .src = s1, .bytes = sizeof(s1)};
    assert_int_equal(hpd_slot_copy(be, &c), HPD_OK);
    assert_memory_equal(s1, s2, sizeof(s1));
    hpd_backend_destroy(be);
}

/* Some of the source's heads (tensor parallelism: the heads a prefill rank
 * holds of a decode rank's): heads [src_head, src_head + heads) of the
 * source land as heads [dst_head, dst_head + heads) of the destination,
 * exactly and nowhere else (its other heads keep what they held, the tail
 * too), over random layouts; shapes that do not fit are refused. */
static void test_head_subsets(void **state)
{
    (void)state;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    uint64_t s = 1000;

    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    for (int iter = 0; iter < 200; iter++) {
        const uint32_t A = 1 + rnd(&s, 4), nkv = 2 + rnd(&s, 3), hd = 1 + rnd(&s, 8);
        const uint32_t heads = 1 + rnd(&s, nkv - 1), head0 = rnd(&s, nkv - heads + 1);
        /* every other iteration into some heads of a wider destination */
        const uint32_t nd = heads + (iter % 2 ? rnd(&s, 3) : 0), dst_head = rnd(&s, nd - heads + 1);
        const uint32_t n = 1 + rnd(&s, 200), spos = rnd(&s, 64), dpos = rnd(&s, 64);
        const bool zero_tail = iter % 3 != 2;
        paged_t a, b;
        paged_init(&a, random_layout(&s, A, nkv, hd), spos + n, &s);
        paged_init(&b, random_layout(&s, A, nd, hd), dpos + n, &s);
        fill_rows(&a, spos, n);
        float *want = expected_pool(&b, 0, A, dpos, n, zero_tail, head0, heads, dst_head);
        hpd_kv_translate_args_t t = {
            .src = {.layout = &a.l, .pool = a.pool, .tables = a.tables, .pos = spos},
            .dst = {.layout = &b.l, .pool = b.pool, .tables = b.tables, .pos = dpos},
            .n_tokens = n,
            .zero_tail = zero_tail,
            .src_head = head0,
            .heads = heads,
            .dst_head = dst_head};
        assert_int_equal(hpd_kv_translate(be, &t), HPD_OK);
        if (memcmp(b.pool, want, b.n_pages * hpd_kv_layout_page_bytes(&b.l)) != 0)
            fail_msg("iteration %d: heads %u..%u of %u into %u..%u of %u: the destination is "
                     "not their rows", iter, head0, head0 + heads, nkv, dst_head,
                     dst_head + heads, nd);
        free(want), free(a.pool), free(a.ids), free(b.pool), free(b.ids);
    }
    hpd_kv_layout_t x = {.block_size = 16, .pack_size = 1, .order = HPD_KV_HND,
                         .dtype = HPD_DTYPE_F32, .n_layers = 1, .n_kv_heads = 4, .head_dim = 4},
                    y = x;
    y.n_kv_heads = 2;
    float buf[4096];
    uint32_t id = 0;
    const uint32_t *tab[1] = {&id};
    hpd_kv_translate_args_t bad = {.src = {.layout = &x, .pool = buf, .tables = tab},
                                   .dst = {.layout = &y, .pool = buf + 1024, .tables = tab},
                                   .n_tokens = 1};
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG); /* 4 heads into 2 */
    bad.heads = 2, bad.src_head = 3;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG); /* past the 4 */
    bad.heads = 3, bad.src_head = 0;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG); /* dst has 2 */
    bad.heads = 2, bad.dst_head = 1;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG); /* past dst's 2 */
    bad.heads = 1, bad.dst_head = 2;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG);
    bad.heads = 0, bad.dst_head = 1, bad.dst.layout = &x;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG); /* all, offset */
    bad.dst_head = 0, bad.dst.layout = &y;
    bad.heads = 0, bad.src_head = 1, bad.dst.layout = &x;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_ERR_INVALID_ARG); /* all, offset */
    bad.heads = 2, bad.src_head = 2, bad.dst.layout = &y;
    assert_int_equal(hpd_kv_translate(be, &bad), HPD_OK);
    hpd_backend_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_translations),
        cmocka_unit_test(test_head_subsets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
