/* Page and slot pools: all-or-nothing allocation, refcounts, zeroed slots,
 * the PAD slot, backend memory, the answers to misuse and to a failing
 * backend; layout validation, parsing and formatting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/kv_layout.h"
#include "cache/page_pool.h"
#include "cache/slot_pool.h"
#include "tests/cache/faulty_backend.h"

static hpd_backend_t *be;

static int setup(void **state)
{
    hpd_backend_params_t p = {.device = "cpu", .n_threads = 1};
    return hpd_backend_cpu_create(&p, &be) == HPD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    hpd_backend_destroy(be);
    return 0;
}

static void test_layout(void **state)
{
    hpd_kv_layout_t l = {.block_size = 64,
                         .pack_size = 2,
                         .order = HPD_KV_NHD,
                         .dtype = HPD_DTYPE_F32,
                         .n_layers = 3,
                         .n_kv_heads = 2,
                         .head_dim = 8};
    assert_int_equal(hpd_kv_layout_validate(&l), HPD_OK);
    assert_int_equal(hpd_kv_layout_n_groups(&l), 2);
    assert_int_equal(hpd_kv_layout_page_bytes(&l), 2 * 2 * 64 * 2 * 8 * 4);
    /* NHD: page[m][kv][t][h][d]; HND: page[m][kv][h][t][d] */
    assert_int_equal(hpd_kv_layout_row(&l, 1, 1, 3, 1), (((1 * 2 + 1) * 64 + 3) * 2 + 1) * 8);
    l.order = HPD_KV_HND;
    assert_int_equal(hpd_kv_layout_row(&l, 1, 1, 3, 1), (((1 * 2 + 1) * 2 + 1) * 64 + 3) * 8);
    l.block_size = 24;
    assert_int_equal(hpd_kv_layout_validate(&l), HPD_ERR_INVALID_ARG);
    l.block_size = 16;
    l.pack_size = 4;
    assert_int_equal(hpd_kv_layout_validate(&l), HPD_ERR_INVALID_ARG);
    l.pack_size = 0;
    assert_int_equal(hpd_kv_layout_validate(&l), HPD_ERR_INVALID_ARG);

    hpd_kv_layout_t p = l;
    assert_int_equal(hpd_kv_layout_parse("32,3,hnd", &p), HPD_OK);
    assert_int_equal(p.block_size, 32);
    assert_int_equal(p.pack_size, 3);
    assert_int_equal(p.order, HPD_KV_HND);
    assert_int_equal(hpd_kv_layout_parse("32,3", &p), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_kv_layout_parse("32,x,nhd", &p), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_kv_layout_parse("32,1,abc", &p), HPD_ERR_INVALID_ARG);
}

/* Every value validate accepts and refuses, field by field. */
static void test_layout_validate_bounds(void **state)
{
    const hpd_kv_layout_t ok = {.block_size = 64,
                                .pack_size = 2,
                                .order = HPD_KV_NHD,
                                .dtype = HPD_DTYPE_F32,
                                .n_layers = 3,
                                .n_kv_heads = 2,
                                .head_dim = 8};
    static const struct {
        const char *what;
        uint32_t B, P, order, A, heads, dim;
        hpd_status_t want;
    } rows[] = {
        {"nhd", 64, 2, HPD_KV_NHD, 3, 2, 8, HPD_OK},
        {"hnd", 64, 2, HPD_KV_HND, 3, 2, 8, HPD_OK},
        {"an order neither nhd nor hnd", 64, 2, 2, 3, 2, 8, HPD_ERR_INVALID_ARG},
        {"the smallest block", 16, 1, HPD_KV_NHD, 3, 2, 8, HPD_OK},
        {"the largest block", 4096, 1, HPD_KV_HND, 3, 2, 8, HPD_OK},
        {"a block past the largest", 4112, 1, HPD_KV_NHD, 3, 2, 8, HPD_ERR_INVALID_ARG},
        {"an empty block", 0, 1, HPD_KV_NHD, 3, 2, 8, HPD_ERR_INVALID_ARG},
        {"a block of 8", 8, 1, HPD_KV_NHD, 3, 2, 8, HPD_ERR_INVALID_ARG},
        {"every layer in one page", 64, 3, HPD_KV_NHD, 3, 2, 8, HPD_OK},
        {"a pack past the layers", 64, 4, HPD_KV_NHD, 3, 2, 8, HPD_ERR_INVALID_ARG},
        {"no full-attention layer", 64, 1, HPD_KV_NHD, 0, 2, 8, HPD_ERR_INVALID_ARG},
        {"no kv head", 64, 1, HPD_KV_NHD, 3, 0, 8, HPD_ERR_INVALID_ARG},
        {"an empty head", 64, 1, HPD_KV_NHD, 3, 2, 0, HPD_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        hpd_kv_layout_t l = ok;
        l.block_size = rows[i].B;
        l.pack_size = rows[i].P;
        l.order = (hpd_kv_order_t)rows[i].order;
        l.n_layers = rows[i].A;
        l.n_kv_heads = rows[i].heads;
        l.head_dim = rows[i].dim;
        if (hpd_kv_layout_validate(&l) != rows[i].want)
            print_message("%s: expected %s\n", rows[i].what, hpd_status_str(rows[i].want));
        assert_int_equal(hpd_kv_layout_validate(&l), rows[i].want);
    }
}

/* parse sets the layout part (either order, any case) and leaves the shape;
 * a text it refuses leaves *layout_p as it was. format writes it back. */
static void test_layout_parse_format(void **state)
{
    static const struct {
        const char *text;
        hpd_status_t want;
        uint32_t B, P;
        hpd_kv_order_t order;
    } rows[] = {
        {"64,1,nhd", HPD_OK, 64, 1, HPD_KV_NHD},
        {"16,2,NHD", HPD_OK, 16, 2, HPD_KV_NHD},
        {"4096,3,hnd", HPD_OK, 4096, 3, HPD_KV_HND},
        {"128,1,HnD", HPD_OK, 128, 1, HPD_KV_HND},
        {"0,1,nhd", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"64,0,nhd", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"8192,1,nhd", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"64,1,nhd,x", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"64,1,", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"64,1,xyz", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"64,1,nhdx", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        {"", HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
        /* 64 characters, longer than any layout needs: refused */
        {"0000000000000000000000000000000000000000000000000000000064,1,nhd",
         HPD_ERR_INVALID_ARG, 0, 0, HPD_KV_NHD},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const hpd_kv_layout_t before = {.block_size = 48,
                                        .pack_size = 5,
                                        .order = HPD_KV_HND,
                                        .dtype = HPD_DTYPE_BF16,
                                        .n_layers = 7,
                                        .n_kv_heads = 3,
                                        .head_dim = 16};
        hpd_kv_layout_t l = before;
        assert_int_equal(hpd_kv_layout_parse(rows[i].text, &l), rows[i].want);
        if (rows[i].want != HPD_OK) {
            assert_memory_equal(&l, &before, sizeof(l));
            continue;
        }
        assert_int_equal(l.block_size, rows[i].B);
        assert_int_equal(l.pack_size, rows[i].P);
        assert_int_equal(l.order, rows[i].order);
        assert_int_equal(l.dtype, before.dtype);
        assert_int_equal(l.n_layers, before.n_layers);
        assert_int_equal(l.n_kv_heads, before.n_kv_heads);
        assert_int_equal(l.head_dim, before.head_dim);
    }

    char out[64];
    const hpd_kv_layout_t a = {.block_size = 64,
                               .pack_size = 1,
                               .order = HPD_KV_NHD,
                               .dtype = HPD_DTYPE_F32,
                               .n_layers = 2,
                               .n_kv_heads = 1,
                               .head_dim = 4};
    const hpd_kv_layout_t b = {.block_size = 32,
                               .pack_size = 3,
                               .order = HPD_KV_HND,
                               .dtype = HPD_DTYPE_BF16,
                               .n_layers = 3,
                               .n_kv_heads = 1,
                               .head_dim = 4};
    hpd_kv_layout_format(&a, out, sizeof(out));
    assert_string_equal(out, "B=64 P=1 NHD f32");
    hpd_kv_layout_format(&b, out, sizeof(out));
    assert_string_equal(out, "B=32 P=3 HND bf16");
}

static void test_page_pool(void **state)
{
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 16,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 2,
                                            .n_kv_heads = 1,
                                            .head_dim = 16},
                                 .n_pages = 5};
    hpd_page_pool_t *pool;
    uint32_t ids[6];

    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    assert_int_equal(hpd_page_pool_alloc(pool, 3, ids), HPD_OK);
    assert_int_equal(hpd_page_pool_n_free(pool), 2);
    /* all or nothing */
    assert_int_equal(hpd_page_pool_alloc(pool, 3, ids + 3), HPD_ERR_NO_RESOURCE);
    assert_int_equal(hpd_page_pool_n_free(pool), 2);
    hpd_page_pool_ref(pool, ids[0]);
    assert_int_equal(hpd_page_pool_refcount(pool, ids[0]), 2);
    hpd_page_pool_unref(pool, ids[0]);
    assert_int_equal(hpd_page_pool_n_free(pool), 2); /* still referenced */
    for (int i = 0; i < 3; i++)
        hpd_page_pool_unref(pool, ids[i]);
    assert_int_equal(hpd_page_pool_n_free(pool), 5);
    assert_int_equal(hpd_page_pool_alloc(pool, 5, ids), HPD_OK);
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            assert_int_not_equal(ids[i], ids[j]);
    hpd_page_pool_destroy(pool);
    pp.n_pages = 0;
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_ERR_INVALID_ARG);
    pp.n_pages = 5;
    pp.layout.block_size = 24;
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_ERR_INVALID_ARG);
}

/* What a page pool reports about itself, and its answers at the edges:
 * taking nothing, a page id past the pool. */
static void test_page_pool_accessors(void **state)
{
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 32,
                                            .pack_size = 2,
                                            .order = HPD_KV_HND,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 3,
                                            .n_kv_heads = 2,
                                            .head_dim = 8},
                                 .n_pages = 4};
    hpd_page_pool_t *pool;
    uint32_t ids[4];

    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    assert_int_equal(hpd_page_pool_n_pages(pool), 4);
    assert_int_equal(hpd_page_pool_n_free(pool), 4);
    assert_memory_equal(hpd_page_pool_layout(pool), &pp.layout, sizeof(pp.layout));
    assert_non_null(hpd_page_pool_base(pool));
    assert_int_equal(hpd_page_pool_alloc(pool, 0, ids), HPD_OK);
    assert_int_equal(hpd_page_pool_n_free(pool), 4);
    assert_int_equal(hpd_page_pool_alloc(pool, 4, ids), HPD_OK);
    assert_int_equal(hpd_page_pool_n_free(pool), 0);
    assert_int_equal(hpd_page_pool_alloc(pool, 1, ids), HPD_ERR_NO_RESOURCE);
    for (int i = 0; i < 4; i++) {
        assert_true(ids[i] < 4);
        assert_int_equal(hpd_page_pool_refcount(pool, ids[i]), 1);
    }
    assert_int_equal(hpd_page_pool_refcount(pool, 4), 0);
    assert_int_equal(hpd_page_pool_refcount(pool, UINT32_MAX), 0);
    /* every page is usable memory of page_bytes: write them all, read back */
    const uint64_t pb = hpd_kv_layout_page_bytes(&pp.layout);
    uint8_t *base = hpd_page_pool_base(pool);
    for (int i = 0; i < 4; i++)
        memset(base + ids[i] * pb, i + 1, pb);
    for (int i = 0; i < 4; i++)
        assert_int_equal(base[ids[i] * pb + pb - 1], i + 1);
    for (int i = 0; i < 4; i++)
        hpd_page_pool_unref(pool, ids[i]);
    assert_int_equal(hpd_page_pool_n_free(pool), 4);
    hpd_page_pool_destroy(pool);
    hpd_page_pool_destroy(NULL);
}

/* Pools over memory the caller owns (the decode node's UCX-allocated
 * shared memory): used as given, left to the caller at destroy (ASan would
 * report a double free). */
static void test_pools_over_caller_memory(void **state)
{
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 16,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 2,
                                            .n_kv_heads = 1,
                                            .head_dim = 16},
                                 .n_pages = 3};
    const size_t page_bytes = hpd_kv_layout_page_bytes(&pp.layout);
    uint8_t *pages = malloc(3 * page_bytes), *slots = malloc(3 * 64);
    hpd_page_pool_t *pool;
    hpd_slot_pool_t *spool;
    uint32_t ids[3], slot;

    pp.memory = pages;
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    assert_ptr_equal(hpd_page_pool_base(pool), pages);
    assert_int_equal(hpd_page_pool_alloc(pool, 3, ids), HPD_OK);
    hpd_page_pool_destroy(pool);

    memset(slots, 0xab, 3 * 64);
    hpd_slot_pool_params_t sp = {.backend = be, .n_slots = 2, .slot_bytes = 64, .memory = slots};
    assert_int_equal(hpd_slot_pool_create(&sp, &spool), HPD_OK);
    assert_ptr_equal(hpd_slot_pool_ptr(spool, 0), slots);
    const uint8_t zero[64] = {0};
    assert_memory_equal(slots, zero, 64); /* PAD zeroed in the caller's memory */
    assert_int_equal(hpd_slot_pool_alloc(spool, &slot), HPD_OK);
    assert_memory_equal(hpd_slot_pool_ptr(spool, slot), zero, 64);
    hpd_slot_pool_destroy(spool);
    free(pages);
    free(slots);
}

static void test_slot_pool(void **state)
{
    hpd_slot_pool_params_t sp = {.backend = be, .n_slots = 2, .slot_bytes = 64};
    hpd_slot_pool_t *pool;
    uint32_t a, b, c;

    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_OK);
    const uint8_t zero[64] = {0};
    assert_memory_equal(hpd_slot_pool_ptr(pool, 0), zero, 64); /* PAD */
    assert_int_equal(hpd_slot_pool_alloc(pool, &a), HPD_OK);
    assert_int_equal(hpd_slot_pool_alloc(pool, &b), HPD_OK);
    assert_true(a >= 1 && a <= 2 && b >= 1 && b <= 2 && a != b);
    assert_int_equal(hpd_slot_pool_alloc(pool, &c), HPD_ERR_NO_RESOURCE);
    memset(hpd_slot_pool_ptr(pool, a), 0xab, 64);
    hpd_slot_pool_unref(pool, a);
    assert_int_equal(hpd_slot_pool_alloc(pool, &c), HPD_OK);
    assert_int_equal(c, a);
    assert_memory_equal(hpd_slot_pool_ptr(pool, c), zero, 64); /* zeroed when handed out */
    hpd_slot_pool_ref(pool, c);
    assert_int_equal(hpd_slot_pool_refcount(pool, c), 2);
    hpd_slot_pool_unref(pool, c);
    hpd_slot_pool_unref(pool, c);
    hpd_slot_pool_unref(pool, b);
    assert_int_equal(hpd_slot_pool_n_free(pool), 2);
    assert_memory_equal(hpd_slot_pool_ptr(pool, 0), zero, 64);
    hpd_slot_pool_destroy(pool);
    hpd_slot_pool_destroy(NULL);
}

/* What a slot pool reports about itself, and the sizes it refuses. */
static void test_slot_pool_accessors(void **state)
{
    hpd_slot_pool_params_t sp = {.backend = be, .n_slots = 3, .slot_bytes = 48};
    hpd_slot_pool_t *pool;
    uint32_t s[3];

    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_OK);
    assert_int_equal(hpd_slot_pool_n_slots(pool), 3);
    assert_int_equal(hpd_slot_pool_slot_bytes(pool), 48);
    assert_int_equal(hpd_slot_pool_n_free(pool), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(hpd_slot_pool_alloc(pool, &s[i]), HPD_OK);
        assert_true(s[i] >= 1 && s[i] <= 3);
        assert_int_equal(hpd_slot_pool_refcount(pool, s[i]), 1);
        assert_int_equal(hpd_slot_pool_n_free(pool), 2 - i);
    }
    assert_true(s[0] != s[1] && s[1] != s[2] && s[0] != s[2]);
    /* PAD is never handed out nor referenced; ids past the pool read 0 */
    assert_int_equal(hpd_slot_pool_refcount(pool, 0), 0);
    assert_int_equal(hpd_slot_pool_refcount(pool, 4), 0);
    assert_int_equal(hpd_slot_pool_refcount(pool, UINT32_MAX), 0);
    /* slot s is the s-th slot_bytes of the memory: slots do not overlap */
    for (uint32_t i = 1; i <= 3; i++)
        assert_ptr_equal(hpd_slot_pool_ptr(pool, i),
                         (uint8_t *)hpd_slot_pool_ptr(pool, 0) + i * 48);
    for (int i = 0; i < 3; i++)
        hpd_slot_pool_unref(pool, s[i]);
    assert_int_equal(hpd_slot_pool_n_free(pool), 3);
    hpd_slot_pool_destroy(pool);

    sp.n_slots = 0;
    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_ERR_INVALID_ARG);
    sp.n_slots = 3;
    sp.slot_bytes = 0;
    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_ERR_INVALID_ARG);
}

/* A backend whose memset fails: the slot pool cannot zero PAD at create, nor
 * a slot when handing it out; it says so, and takes nothing. */
static void test_slot_pool_memset_failure(void **state)
{
    faulty_backend_t fb;
    hpd_slot_pool_params_t sp = {.backend = faulty_backend_init(&fb, be), .n_slots = 2,
                                 .slot_bytes = 64};
    hpd_slot_pool_t *pool = NULL;
    uint32_t a = 0, b, c;

    fb.fail_memset = true;
    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_ERR_INTERNAL);
    assert_null(pool);
    uint8_t *mem = malloc(3 * 64);
    sp.memory = mem;
    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_ERR_INTERNAL);
    assert_null(pool);
    free(mem);
    sp.memory = NULL;

    fb.fail_memset = false;
    assert_int_equal(hpd_slot_pool_create(&sp, &pool), HPD_OK);
    fb.fail_memset = true;
    assert_int_equal(hpd_slot_pool_alloc(pool, &a), HPD_ERR_INTERNAL);
    assert_int_equal(a, 0); /* the out-parameter is left alone */
    assert_int_equal(hpd_slot_pool_n_free(pool), 2);
    assert_int_equal(hpd_slot_pool_refcount(pool, 1), 0);
    assert_int_equal(hpd_slot_pool_refcount(pool, 2), 0);
    /* both slots are still there once the backend works again */
    fb.fail_memset = false;
    assert_int_equal(hpd_slot_pool_alloc(pool, &b), HPD_OK);
    assert_int_equal(hpd_slot_pool_alloc(pool, &c), HPD_OK);
    assert_true(b != c);
    assert_int_equal(hpd_slot_pool_n_free(pool), 0);
    hpd_slot_pool_destroy(pool);
}

/* The pools take their memory from the backend, as pool memory (which
 * peers may write over RDMA: alloc_pool), and give it back at destroy
 * (free_pool); memory the caller passes is never freed through the
 * backend; a failed allocation is answered, with nothing left allocated. */
static void test_pools_backend_memory(void **state)
{
    faulty_backend_t fb;
    hpd_backend_t *fbe = faulty_backend_init(&fb, be);
    hpd_page_pool_params_t pp = {.backend = fbe,
                                 .layout = {.block_size = 16,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 2,
                                            .n_kv_heads = 1,
                                            .head_dim = 16},
                                 .n_pages = 3};
    hpd_slot_pool_params_t sp = {.backend = fbe, .n_slots = 2, .slot_bytes = 64};
    hpd_page_pool_t *pool = NULL;
    hpd_slot_pool_t *spool = NULL;

    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    assert_int_equal(hpd_slot_pool_create(&sp, &spool), HPD_OK);
    assert_int_equal(fb.n_live, 2);
    assert_int_equal(fb.n_pool_live, 2);
    hpd_page_pool_destroy(pool);
    hpd_slot_pool_destroy(spool);
    assert_int_equal(fb.n_live, 0);
    assert_int_equal(fb.n_pool_live, 0);

    uint8_t *mem = malloc(3 * hpd_kv_layout_page_bytes(&pp.layout));
    pp.memory = sp.memory = mem;
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    assert_int_equal(hpd_slot_pool_create(&sp, &spool), HPD_OK);
    hpd_page_pool_destroy(pool);
    hpd_slot_pool_destroy(spool);
    assert_int_equal(fb.n_live, 0); /* and no free of mem either (else negative) */
    free(mem);

    pp.memory = sp.memory = NULL;
    pool = NULL;
    spool = NULL;
    fb.fail_alloc = true;
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_ERR_INTERNAL);
    assert_int_equal(hpd_slot_pool_create(&sp, &spool), HPD_ERR_INTERNAL);
    assert_null(pool);
    assert_null(spool);
    assert_int_equal(fb.n_live, 0);
}

/* Runs fn in a child; true when the child died of SIGABRT. */
static bool aborts(void (*fn)(void))
{
    pid_t pid = fork();
    int status;
    if (pid == 0) {
        /* a child of a sanitized build must not report the abort as an error */
        fclose(stderr);
        fn();
        _exit(0);
    }
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

/* A pool of two with one page (slot) taken and given back: its id. */
static uint32_t freed_page(hpd_page_pool_t **pool)
{
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 16,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 1,
                                            .n_kv_heads = 1,
                                            .head_dim = 16},
                                 .n_pages = 2};
    uint32_t id;
    hpd_page_pool_create(&pp, pool);
    hpd_page_pool_alloc(*pool, 1, &id);
    hpd_page_pool_unref(*pool, id);
    return id;
}

static uint32_t freed_slot(hpd_slot_pool_t **pool)
{
    hpd_slot_pool_params_t sp = {.backend = be, .n_slots = 2, .slot_bytes = 64};
    uint32_t s;
    hpd_slot_pool_create(&sp, pool);
    hpd_slot_pool_alloc(*pool, &s);
    hpd_slot_pool_unref(*pool, s);
    return s;
}

static void page_double_free(void)
{
    hpd_page_pool_t *pool;
    const uint32_t id = freed_page(&pool);
    hpd_page_pool_unref(pool, id);
}

static void page_use_after_free(void)
{
    hpd_page_pool_t *pool;
    const uint32_t id = freed_page(&pool);
    hpd_page_pool_ref(pool, id);
}

static void slot_double_free(void)
{
    hpd_slot_pool_t *pool;
    const uint32_t s = freed_slot(&pool);
    hpd_slot_pool_unref(pool, s);
}

static void slot_use_after_free(void)
{
    hpd_slot_pool_t *pool;
    const uint32_t s = freed_slot(&pool);
    hpd_slot_pool_ref(pool, s);
}

static hpd_page_pool_t *page_pool_of_2(void)
{
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 16,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 1,
                                            .n_kv_heads = 1,
                                            .head_dim = 16},
                                 .n_pages = 2};
    hpd_page_pool_t *pool;
    uint32_t ids[2];
    hpd_page_pool_create(&pp, &pool);
    hpd_page_pool_alloc(pool, 2, ids);
    return pool;
}

static hpd_slot_pool_t *slot_pool_of_2(void)
{
    hpd_slot_pool_params_t sp = {.backend = be, .n_slots = 2, .slot_bytes = 64};
    hpd_slot_pool_t *pool;
    uint32_t s;
    hpd_slot_pool_create(&sp, &pool);
    hpd_slot_pool_alloc(pool, &s);
    hpd_slot_pool_alloc(pool, &s);
    return pool;
}

static void page_ref_past_end(void)
{
    hpd_page_pool_ref(page_pool_of_2(), 2);
}

static void page_unref_past_end(void)
{
    hpd_page_pool_unref(page_pool_of_2(), 2);
}

static void slot_ref_past_end(void)
{
    hpd_slot_pool_ref(slot_pool_of_2(), 3);
}

static void slot_unref_past_end(void)
{
    hpd_slot_pool_unref(slot_pool_of_2(), 3);
}

static void page_ref_far_past_end(void)
{
    hpd_page_pool_ref(page_pool_of_2(), 3);
}

static void page_unref_far_past_end(void)
{
    hpd_page_pool_unref(page_pool_of_2(), 3);
}

static void slot_unref_far_past_end(void)
{
    hpd_slot_pool_unref(slot_pool_of_2(), 4);
}

static void slot_ref_far_past_end(void)
{
    hpd_slot_pool_ref(slot_pool_of_2(), 4);
}

static void slot_ref_pad(void)
{
    hpd_slot_pool_ref(slot_pool_of_2(), 0);
}

static void slot_unref_pad(void)
{
    hpd_slot_pool_unref(slot_pool_of_2(), 0);
}

/* An id past the pool (or PAD) must never reach ref or unref: every build
 * aborts rather than write outside the refcounts. */
static void test_bad_ids_abort(void **state)
{
    assert_true(aborts(page_ref_past_end));
    assert_true(aborts(page_unref_past_end));
    assert_true(aborts(page_ref_far_past_end));
    assert_true(aborts(slot_ref_far_past_end));
    assert_true(aborts(page_unref_far_past_end));
    assert_true(aborts(slot_unref_far_past_end));
    assert_true(aborts(slot_ref_past_end));
    assert_true(aborts(slot_unref_past_end));
    assert_true(aborts(slot_ref_pad));
    assert_true(aborts(slot_unref_pad));
}

/* Debug builds (HPD_DEBUG, the sanitizer pass of scripts/test.sh) catch
 * double frees and uses after free; release builds leave the refcount alone. */
static void test_debug_catches_misuse(void **state)
{
#ifdef HPD_DEBUG
    assert_true(aborts(page_double_free));
    assert_true(aborts(page_use_after_free));
    assert_true(aborts(slot_double_free));
    assert_true(aborts(slot_use_after_free));
#else
    print_message("release build: the debug checks are compiled out\n");
    (void)aborts;
    (void)page_double_free, (void)page_use_after_free;
    (void)slot_double_free, (void)slot_use_after_free;
#endif
}

/* Release builds answer a double free by leaving the refcount at 0: the
 * page (slot) stays free once, so it is handed out once. */
static void test_release_ignores_double_free(void **state)
{
#ifdef HPD_DEBUG
    print_message("debug build: a double free aborts (test_debug_catches_misuse)\n");
#else
    hpd_page_pool_t *pool;
    const uint32_t id = freed_page(&pool);
    uint32_t ids[2], more;
    hpd_page_pool_unref(pool, id);
    assert_int_equal(hpd_page_pool_refcount(pool, id), 0);
    assert_int_equal(hpd_page_pool_n_free(pool), 2);
    assert_int_equal(hpd_page_pool_alloc(pool, 2, ids), HPD_OK);
    assert_int_not_equal(ids[0], ids[1]);
    assert_int_equal(hpd_page_pool_alloc(pool, 1, &more), HPD_ERR_NO_RESOURCE);
    hpd_page_pool_destroy(pool);

    hpd_slot_pool_t *spool;
    const uint32_t s = freed_slot(&spool);
    uint32_t a, b, c;
    hpd_slot_pool_unref(spool, s);
    assert_int_equal(hpd_slot_pool_refcount(spool, s), 0);
    assert_int_equal(hpd_slot_pool_n_free(spool), 2);
    assert_int_equal(hpd_slot_pool_alloc(spool, &a), HPD_OK);
    assert_int_equal(hpd_slot_pool_alloc(spool, &b), HPD_OK);
    assert_int_not_equal(a, b);
    assert_int_equal(hpd_slot_pool_alloc(spool, &c), HPD_ERR_NO_RESOURCE);
    hpd_slot_pool_destroy(spool);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_layout_validate_bounds),
        cmocka_unit_test(test_layout_parse_format),
        cmocka_unit_test(test_page_pool),
        cmocka_unit_test(test_page_pool_accessors),
        cmocka_unit_test(test_slot_pool),
        cmocka_unit_test(test_slot_pool_accessors),
        cmocka_unit_test(test_slot_pool_memset_failure),
        cmocka_unit_test(test_pools_over_caller_memory),
        cmocka_unit_test(test_pools_backend_memory),
        cmocka_unit_test(test_bad_ids_abort),
        cmocka_unit_test(test_debug_catches_misuse),
        cmocka_unit_test(test_release_ignores_double_free),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
