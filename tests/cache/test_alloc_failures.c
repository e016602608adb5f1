/* Allocation failures in the cache library. The link wraps malloc, calloc
 * and realloc (tests/CMakeLists.txt), so that an operation can be run with
 * its k-th allocation failing, for every k in turn: it must answer
 * HPD_ERR_NO_MEMORY (or, where its contract lets it go on without what it
 * could not get, succeed) and leave the pools and the cache consistent;
 * the sanitizer build checks that nothing leaks on the way out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/prefix_cache.h"
#include "tests/test_helpers.h"

/* ------------------------------------------------------------ the wrap */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static uint32_t n_allocs; /* allocations since arm() */
static uint32_t fail_at;  /* the one that fails; 0: none */

static bool failing(void)
{
    return fail_at != 0 && ++n_allocs == fail_at;
}

void *__wrap_malloc(size_t n)
{
    return failing() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return failing() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    return failing() ? NULL : __real_realloc(p, n);
}

static void arm(uint32_t k)
{
    n_allocs = 0;
    fail_at = k;
}

/* Disarms; whether the k-th allocation happened (and failed). */
static bool disarm(void)
{
    const bool hit = n_allocs >= fail_at;
    fail_at = 0;
    return hit;
}

/* ------------------------------------------------------------ a cache */

enum { HD = 4, STATE = 64, N_PAGES = 32 };

typedef struct {
    hpd_backend_t *be;
    hpd_page_pool_t *pool;
    hpd_prefix_cache_t *cache;
} fixture_t;

static void fixture_init(fixture_t *f, uint32_t n_ckpt)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    assert_int_equal(hpd_backend_cpu_create(&bp, &f->be), HPD_OK);
    hpd_page_pool_params_t pp = {.backend = f->be,
                                 .layout = {.block_size = 64,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 2,
                                            .n_kv_heads = 1,
                                            .head_dim = HD},
                                 .n_pages = N_PAGES};
    assert_int_equal(hpd_page_pool_create(&pp, &f->pool), HPD_OK);
    hpd_prefix_cache_params_t cp = {.backend = f->be,
                                    .pages = f->pool,
                                    .state_bytes = STATE,
                                    .n_checkpoints = n_ckpt,
                                    .host_bytes = 1 << 20,
                                    .salt = {5}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &f->cache), HPD_OK);
}

static void fixture_fini(fixture_t *f)
{
    hpd_prefix_cache_destroy(f->cache);
    hpd_page_pool_destroy(f->pool);
    hpd_backend_destroy(f->be);
}

/* Every page's refcount is the cache's references plus `held` (the
 * request's); the stats add up. */
static void audit(fixture_t *f, const uint32_t *held)
{
    uint32_t refs[N_PAGES] = {0};
    hpd_prefix_cache_stats_t st;
    hpd_prefix_cache_page_refs(f->cache, refs);
    for (uint32_t i = 0; i < N_PAGES; i++)
        assert_int_equal(refs[i] + (held ? held[i] : 0), hpd_page_pool_refcount(f->pool, i));
    hpd_prefix_cache_stats(f->cache, &st);
    assert_int_equal(st.checkpoint_bytes, (uint64_t)st.device_checkpoints * STATE);
    assert_int_equal(st.host_bytes, (uint64_t)st.host_entries * 2 * 64 * 2 * HD * sizeof(float) +
                                        st.host_checkpoint_bytes);
}

/* A prompt of n_blocks blocks of stream s, computed into fresh pages (one
 * per block and group) and inserted with the state after its last block;
 * the request's pages are given back. */
static void hashes_of(fixture_t *f, uint32_t s, uint32_t n_blocks, hpd_block_hash_t *h)
{
    int32_t *tok = malloc((size_t)n_blocks * 64 * sizeof(int32_t));
    for (uint32_t i = 0; i < n_blocks * 64; i++)
        tok[i] = (int32_t)(s * 1000 + i % 977);
    hpd_prefix_cache_hash(f->cache, tok, n_blocks, h);
    free(tok);
}

static void state_of(uint32_t s, float *state)
{
    for (uint32_t i = 0; i < STATE / 4; i++)
        state[i] = (float)(s * 100 + i);
}

static void cache_prompt(fixture_t *f, uint32_t s, uint32_t n_blocks)
{
    hpd_block_hash_t h[8];
    uint32_t pages[2][8];
    const uint32_t *tables[2] = {pages[0], pages[1]};
    float state[STATE / 4];
    hashes_of(f, s, n_blocks, h);
    state_of(s, state);
    assert_int_equal(hpd_prefix_cache_make_room(f->cache, 2 * n_blocks), HPD_OK);
    assert_int_equal(hpd_page_pool_alloc(f->pool, n_blocks, pages[0]), HPD_OK);
    assert_int_equal(hpd_page_pool_alloc(f->pool, n_blocks, pages[1]), HPD_OK);
    assert_int_equal(hpd_prefix_cache_insert(f->cache, h, n_blocks, tables, state), HPD_OK);
    for (uint32_t b = 0; b < n_blocks; b++) {
        hpd_page_pool_unref(f->pool, pages[0][b]);
        hpd_page_pool_unref(f->pool, pages[1][b]);
    }
}

static uint32_t hit_of(fixture_t *f, uint32_t s, uint32_t n_blocks)
{
    hpd_block_hash_t h[8];
    hpd_prefix_match_t m;
    hashes_of(f, s, n_blocks, h);
    assert_int_equal(hpd_prefix_cache_lookup(f->cache, h, n_blocks * 64 + 1, &m), HPD_OK);
    const uint32_t hit = m.hit_blocks;
    hpd_prefix_cache_release(f->cache, &m);
    return hit;
}

/* ------------------------------------------------------------ the tests */

static void test_create(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 64,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 2,
                                            .n_kv_heads = 1,
                                            .head_dim = HD},
                                 .n_pages = 4};
    hpd_slot_pool_params_t sp = {.backend = be, .n_slots = 3, .slot_bytes = STATE};
    uint32_t k, ids[4], slot;

    for (k = 1;; k++) {
        hpd_page_pool_t *pool = NULL;
        arm(k);
        const hpd_status_t st = hpd_page_pool_create(&pp, &pool);
        if (!disarm()) {
            assert_int_equal(st, HPD_OK);
            assert_int_equal(hpd_page_pool_alloc(pool, 4, ids), HPD_OK);
            hpd_page_pool_destroy(pool);
            break;
        }
        assert_int_equal(st, HPD_ERR_NO_MEMORY);
        assert_null(pool);
    }
    assert_true(k > 2); /* its own struct, the free list, the refcounts */

    for (k = 1;; k++) {
        hpd_slot_pool_t *pool = NULL;
        arm(k);
        const hpd_status_t st = hpd_slot_pool_create(&sp, &pool);
        if (!disarm()) {
            assert_int_equal(st, HPD_OK);
            for (uint32_t i = 0; i < 3; i++)
                assert_int_equal(hpd_slot_pool_alloc(pool, &slot), HPD_OK);
            for (uint32_t i = 1; i <= 3; i++)
                assert_int_equal(hpd_slot_pool_refcount(pool, i), 1);
            hpd_slot_pool_destroy(pool);
            break;
        }
        assert_int_equal(st, HPD_ERR_NO_MEMORY);
        assert_null(pool);
    }
    assert_true(k > 2);

    hpd_page_pool_t *pages;
    assert_int_equal(hpd_page_pool_create(&pp, &pages), HPD_OK);
    hpd_prefix_cache_params_t cp = {.backend = be,
                                    .pages = pages,
                                    .state_bytes = STATE,
                                    .n_checkpoints = 2,
                                    .host_bytes = 1 << 20,
                                    .salt = {5}};
    for (k = 1;; k++) {
        hpd_prefix_cache_t *cache = NULL;
        arm(k);
        const hpd_status_t st = hpd_prefix_cache_create(&cp, &cache);
        if (!disarm()) {
            assert_int_equal(st, HPD_OK);
            hpd_prefix_cache_destroy(cache);
            break;
        }
        assert_int_equal(st, HPD_ERR_NO_MEMORY);
        assert_null(cache);
    }
    assert_true(k > 3);
    assert_int_equal(hpd_page_pool_n_free(pages), 4);
    hpd_page_pool_destroy(pages);
    hpd_backend_destroy(be);
}

/* An insert of more blocks than the entry table and the hash map first
 * hold (they grow): at any failing allocation, HPD_ERR_NO_MEMORY; the
 * blocks recorded before it stay, correctly referenced; the same insert
 * then completes. */
static void test_insert(void **state)
{
    enum { N = 1100 };
    hpd_block_hash_t *h = malloc(N * sizeof(*h));
    uint32_t *table = malloc(N * sizeof(uint32_t)), page[2], held[N_PAGES] = {0};
    const uint32_t *tables[2] = {table, table};
    float st8[STATE / 4];
    uint32_t k;

    state_of(7, st8);
    for (k = 1;; k++) {
        fixture_t f;
        fixture_init(&f, 2);
        if (k == 1)
            hashes_of(&f, 7, N, h);
        assert_int_equal(hpd_page_pool_alloc(f.pool, 2, page), HPD_OK);
        for (uint32_t i = 0; i < N; i++)
            table[i] = page[i % 2];
        held[page[0]] = held[page[1]] = 1;
        arm(k);
        hpd_status_t st = hpd_prefix_cache_insert(f.cache, h, N, tables, st8);
        const bool hit = disarm();
        audit(&f, held);
        if (hit)
            assert_int_equal(st, HPD_ERR_NO_MEMORY);
        else
            assert_int_equal(st, HPD_OK);
        if (k % 97 == 1 || k + 2 >= N) {
            /* what was recorded can be evicted (to the host tier) */
            hpd_page_pool_unref(f.pool, page[0]);
            hpd_page_pool_unref(f.pool, page[1]);
            held[page[0]] = held[page[1]] = 0;
            assert_int_equal(hpd_prefix_cache_make_room(f.cache, N_PAGES), HPD_OK);
            audit(&f, held);
            assert_int_equal(hpd_page_pool_alloc(f.pool, 2, page), HPD_OK);
            for (uint32_t i = 0; i < N; i++)
                table[i] = page[i % 2];
            held[page[0]] = held[page[1]] = 1;
        }
        assert_int_equal(hpd_prefix_cache_insert(f.cache, h, N, tables, st8), HPD_OK);
        audit(&f, held);
        hpd_prefix_match_t m;
        assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, N * 64 + 1, &m), HPD_OK);
        assert_int_equal(m.hit_blocks, N);
        hpd_prefix_cache_release(f.cache, &m);
        hpd_page_pool_unref(f.pool, page[0]);
        hpd_page_pool_unref(f.pool, page[1]);
        held[page[0]] = held[page[1]] = 0;
        fixture_fini(&f);
        if (!hit)
            break;
    }
    assert_true(k > N); /* an entry's page list each, and more */
    free(h);
    free(table);
}

/* A lookup that cannot allocate its path: HPD_ERR_NO_MEMORY, an empty
 * match, nothing locked. */
static void test_lookup(void **state)
{
    fixture_t f;
    hpd_block_hash_t h[4];
    hpd_prefix_match_t m;

    fixture_init(&f, 2);
    cache_prompt(&f, 3, 3);
    hashes_of(&f, 3, 3, h);
    arm(1);
    const hpd_status_t st = hpd_prefix_cache_lookup(f.cache, h, 3 * 64 + 1, &m);
    assert_true(disarm());
    assert_int_equal(st, HPD_ERR_NO_MEMORY);
    assert_int_equal(m.hit_blocks, 0);
    assert_int_equal(m.kv_blocks, 0);
    assert_null(m.path);
    hpd_prefix_cache_release(f.cache, &m);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, N_PAGES), HPD_OK); /* unlocked */
    fixture_fini(&f);
}

/* Moving entries to the host tier needs host memory: when it cannot be
 * had, the entry is dropped (or its checkpoint lost) instead, and
 * make_room still frees the pages. */
static void test_make_room(void **state)
{
    uint32_t k;
    for (k = 1;; k++) {
        fixture_t f;
        fixture_init(&f, 2);
        cache_prompt(&f, 3, 3);
        cache_prompt(&f, 4, 2);
        arm(k);
        const hpd_status_t st = hpd_prefix_cache_make_room(f.cache, N_PAGES);
        const bool hit = disarm();
        assert_int_equal(st, HPD_OK);
        audit(&f, NULL);
        hpd_prefix_cache_stats_t s;
        hpd_prefix_cache_stats(f.cache, &s);
        assert_int_equal(s.device_entries, 0);
        assert_int_equal(s.evicted_to_host + s.evicted_dropped, 5);
        if (!hit) {
            assert_int_equal(s.host_entries, 5);
            assert_int_equal(s.host_checkpoint_bytes, 2 * STATE);
        }
        fixture_fini(&f);
        if (!hit)
            break;
    }
    assert_true(k > 5);
}

/* A hit over host-tier entries, one checkpoint slot held by another
 * prompt: attach allocates for its bookkeeping, the promotions and the
 * checkpoint it moves out of the slot. At any failing allocation it either
 * answers HPD_ERR_NO_MEMORY holding nothing, or goes on (an entry that
 * cannot be promoted stays in the host tier) with the right state. */
static void test_attach(void **state)
{
    uint32_t k, n_ok = 0, n_failed = 0;
    for (k = 1;; k++) {
        fixture_t f;
        hpd_block_hash_t h[4];
        hpd_prefix_match_t m;
        uint32_t pages[2][4], held[N_PAGES] = {0}, before[N_PAGES];
        uint32_t *tables[2] = {pages[0], pages[1]};
        float got[STATE / 4], want[STATE / 4];

        fixture_init(&f, 1);
        cache_prompt(&f, 3, 3);
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, N_PAGES), HPD_OK);
        cache_prompt(&f, 4, 1); /* takes the slot */
        hashes_of(&f, 3, 3, h);
        assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, 3 * 64 + 1, &m), HPD_OK);
        assert_int_equal(m.host_blocks, 3);
        for (uint32_t i = 0; i < N_PAGES; i++)
            before[i] = hpd_page_pool_refcount(f.pool, i);
        arm(k);
        const hpd_status_t st = hpd_prefix_cache_attach(f.cache, &m, tables, got);
        const bool hit = disarm();
        if (st == HPD_OK) {
            state_of(3, want);
            assert_memory_equal(got, want, STATE);
            for (uint32_t b = 0; b < 3; b++)
                held[pages[0][b]] = held[pages[1][b]] = 1;
            audit(&f, held);
            for (uint32_t b = 0; b < 3; b++) {
                hpd_page_pool_unref(f.pool, pages[0][b]);
                hpd_page_pool_unref(f.pool, pages[1][b]);
            }
            n_ok++;
        } else {
            assert_int_equal(st, HPD_ERR_NO_MEMORY);
            assert_true(hit);
            audit(&f, NULL);
            for (uint32_t i = 0; i < N_PAGES; i++)
                assert_int_equal(hpd_page_pool_refcount(f.pool, i), before[i]);
            n_failed++;
        }
        hpd_prefix_cache_release(f.cache, &m);
        /* the next request for it shares the pages of the entries that are
         * on the device (promoted or not, one page per block and group) and
         * gets copies of the others */
        hpd_prefix_cache_stats_t s;
        hpd_prefix_cache_stats(f.cache, &s);
        const uint32_t n_dev = s.device_entries - 1; /* not the other prompt's */
        for (uint32_t i = 0; i < N_PAGES; i++)
            before[i] = hpd_page_pool_refcount(f.pool, i);
        assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, 3 * 64 + 1, &m), HPD_OK);
        assert_int_equal(m.host_blocks, 3 - n_dev);
        assert_int_equal(hpd_prefix_cache_attach(f.cache, &m, tables, got), HPD_OK);
        uint32_t shared = 0;
        for (uint32_t b = 0; b < 3; b++)
            for (uint32_t g = 0; g < 2; g++) {
                shared += before[pages[g][b]] > 0;
                hpd_page_pool_unref(f.pool, pages[g][b]);
            }
        assert_int_equal(shared, 2 * n_dev);
        hpd_prefix_cache_release(f.cache, &m);
        /* whatever happened, the prompt still hits, and everything can go */
        assert_int_equal(hit_of(&f, 3, 3), 3);
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, N_PAGES), HPD_OK);
        audit(&f, NULL);
        fixture_fini(&f);
        if (!hit)
            break;
    }
    assert_true(n_failed > 0 && n_ok > 1);
}

/* stats counts the pages it holds in a scratch array: without it, the
 * rest of the stats are still right. */
static void test_stats(void **state)
{
    fixture_t f;
    hpd_prefix_cache_stats_t s;
    fixture_init(&f, 2);
    cache_prompt(&f, 3, 3);
    arm(1);
    hpd_prefix_cache_stats(f.cache, &s);
    disarm();
    assert_int_equal(s.device_entries, 3);
    assert_int_equal(s.device_checkpoints, 1);
    assert_int_equal(s.inserted_blocks, 3);
    hpd_prefix_cache_stats(f.cache, &s);
    assert_int_equal(s.pages_held, 6);
    fixture_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_insert),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_make_room),
        cmocka_unit_test(test_attach),
        cmocka_unit_test(test_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
