/* Page and slot pools: all-or-nothing allocation, refcounts, zeroed slots,
 * the PAD slot, and layout validation. */
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

#include "cache/kv_layout.h"
#include "cache/page_pool.h"
#include "cache/slot_pool.h"

static hpd_backend_t *be;

static int setup(void **state)
{
    hpd_backend_params_t p = {"cpu", 1};
    return hpd_backend_cpu_create(&p, &be) == HPD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    hpd_backend_destroy(be);
    return 0;
}

static void test_layout(void **state)
{
    hpd_kv_layout_t l = {64, 2, HPD_KV_NHD, HPD_DTYPE_F32, 3, 2, 8};
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

static void test_page_pool(void **state)
{
    hpd_page_pool_params_t pp = {
        .backend = be, .layout = {16, 1, HPD_KV_NHD, HPD_DTYPE_F32, 2, 1, 16}, .n_pages = 5};
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
}

/* Pools over memory the caller owns (the decode node's UCX-allocated
 * shared memory): used as given, left to the caller at destroy (ASan would
 * report a double free). */
static void test_pools_over_caller_memory(void **state)
{
    hpd_page_pool_params_t pp = {
        .backend = be, .layout = {16, 1, HPD_KV_NHD, HPD_DTYPE_F32, 2, 1, 16}, .n_pages = 3};
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
    hpd_page_pool_params_t pp = {
        .backend = be, .layout = {16, 1, HPD_KV_NHD, HPD_DTYPE_F32, 1, 1, 16}, .n_pages = 2};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_page_pool),
        cmocka_unit_test(test_slot_pool),
        cmocka_unit_test(test_pools_over_caller_memory),
        cmocka_unit_test(test_debug_catches_misuse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
