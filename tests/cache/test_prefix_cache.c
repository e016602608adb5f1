/* The prefix cache library on its own: the hit rules (table-driven), the
 * pages and state a hit hands over, host-tier eviction and promotion, and
 * the model salt. Insertions follow the engine's checkpoint plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/prefix_cache.h"
#include "tests/test_helpers.h"

enum { HD = 4, STATE = 64, MAXTOK = 512 };

typedef struct {
    hpd_backend_t *be;
    hpd_page_pool_t *pool;
    hpd_prefix_cache_t *cache;
    hpd_kv_layout_t layout;
} fixture_t;

static void fixture_init(fixture_t *f, uint32_t B, uint32_t n_pages, uint32_t n_ckpt,
                         uint64_t host_bytes, uint32_t every, uint8_t salt)
{
    hpd_backend_params_t bp = {"cpu", 1};
    assert_int_equal(hpd_backend_cpu_create(&bp, &f->be), HPD_OK);
    f->layout = (hpd_kv_layout_t){B, 1, HPD_KV_NHD, HPD_DTYPE_F32, 2, 1, HD};
    hpd_page_pool_params_t pp = {.backend = f->be, .layout = f->layout, .n_pages = n_pages};
    assert_int_equal(hpd_page_pool_create(&pp, &f->pool), HPD_OK);
    hpd_prefix_cache_params_t cp = {f->be, f->pool, STATE, n_ckpt, host_bytes, every, {salt}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &f->cache), HPD_OK);
}

static void fixture_fini(fixture_t *f)
{
    hpd_prefix_cache_destroy(f->cache);
    hpd_page_pool_destroy(f->pool);
    hpd_backend_destroy(f->be);
}

/* A prompt: the first `shared` tokens from stream a, the rest from stream b. */
typedef struct {
    uint32_t a, shared, b, len;
} spec_t;

static void tokens_of(spec_t s, int32_t *t)
{
    for (uint32_t i = 0; i < s.len; i++)
        t[i] = (int32_t)(hpd_philox4x32(i < s.shared ? s.a : s.b, i, 3).v[0] % 1000);
}

/* What a KV row of (token id, position) holds; what a state after n tokens of
 * a prompt holds. Stand-ins for computed values, unique per prefix. */
static float row_value(const int32_t *t, uint32_t pos, uint32_t layer, uint32_t kv, uint32_t d)
{
    return (float)t[pos] * 1000.0f + (float)pos + 0.1f * (float)(layer * 2 + kv) + 0.01f * d;
}

static float *row(fixture_t *f, uint32_t *const *tables, uint32_t layer, uint32_t kv, uint32_t pos)
{
    const uint32_t page = tables[layer][pos / f->layout.block_size];
    return (float *)hpd_page_pool_base(f->pool) + page * hpd_kv_layout_page_elems(&f->layout) +
           hpd_kv_layout_row(&f->layout, 0, kv, pos % f->layout.block_size, 0);
}

typedef struct {
    uint32_t n_blocks;
    uint32_t *pages; /* [2 groups][n_blocks] */
    uint32_t *tables[2];
    hpd_prefix_match_t match;
    hpd_block_hash_t hashes[MAXTOK / 64 + 1];
    int32_t tok[MAXTOK];
    uint32_t cached;
} req_t;

/* Runs a prompt through the cache as the engine does: lookup, attach, "compute"
 * the rest (write rows), insert blocks at each checkpoint position and at the end. */
static void run_prompt(fixture_t *f, spec_t s, req_t *r)
{
    const uint32_t B = f->layout.block_size;
    uint32_t plan[64], n_plan, hit_pages;
    float state[STATE / 4];

    memset(r, 0, sizeof(*r));
    tokens_of(s, r->tok);
    r->n_blocks = (s.len + B - 1) / B;
    r->pages = malloc(2 * r->n_blocks * sizeof(uint32_t));
    r->tables[0] = r->pages;
    r->tables[1] = r->pages + r->n_blocks;
    hpd_prefix_cache_hash(f->cache, r->tok, s.len / 64, r->hashes);
    assert_int_equal(hpd_prefix_cache_lookup(f->cache, r->hashes, s.len, &r->match), HPD_OK);
    assert_int_equal(hpd_prefix_cache_attach(f->cache, &r->match, r->tables, state), HPD_OK);
    r->cached = r->match.hit_blocks * 64;
    hit_pages = (r->cached + B - 1) / B;
    /* the hit hands over the rows and the state of exactly this prefix */
    for (uint32_t p = 0; p < r->cached; p++)
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t d = 0; d < HD; d++)
                    assert_true(row(f, r->tables, l, kv, p)[d] == row_value(r->tok, p, l, kv, d));
    if (r->cached > 0)
        for (uint32_t i = 0; i < STATE / 4; i++)
            assert_true(state[i] == (float)r->tok[r->cached - 1] + (float)r->cached + i);
    for (uint32_t j = hit_pages; j < r->n_blocks; j++) {
        uint32_t ids[2];
        if (hpd_page_pool_n_free(f->pool) < 2)
            hpd_prefix_cache_make_room(f->cache, 2);
        assert_int_equal(hpd_page_pool_alloc(f->pool, 2, ids), HPD_OK);
        r->tables[0][j] = ids[0];
        r->tables[1][j] = ids[1];
    }
    n_plan = hpd_prefix_cache_checkpoint_plan(f->cache, &r->match, s.len, r->cached, plan, 64);
    uint32_t done = r->cached;
    for (uint32_t c = 0; c <= n_plan; c++) {
        const uint32_t end = c < n_plan ? plan[c] : s.len;
        for (uint32_t p = done; p < end; p++)
            for (uint32_t l = 0; l < 2; l++)
                for (uint32_t kv = 0; kv < 2; kv++)
                    for (uint32_t d = 0; d < HD; d++)
                        row(f, r->tables, l, kv, p)[d] = row_value(r->tok, p, l, kv, d);
        done = end;
        for (uint32_t i = 0; i < STATE / 4; i++)
            state[i] = (float)r->tok[end - 1] + (float)end + i;
        if (end / 64 > 0)
            assert_int_equal(hpd_prefix_cache_insert(f->cache, r->hashes, end / 64,
                                                     (const uint32_t *const *)r->tables,
                                                     c < n_plan ? state : NULL),
                             HPD_OK);
    }
}

static void end_prompt(fixture_t *f, req_t *r)
{
    for (uint32_t i = 0; i < 2 * r->n_blocks; i++)
        hpd_page_pool_unref(f->pool, r->pages[i]);
    free(r->pages);
    hpd_prefix_cache_release(f->cache, &r->match);
}

static void probe(fixture_t *f, spec_t s, uint32_t *hit, uint32_t *kv)
{
    int32_t tok[MAXTOK];
    hpd_block_hash_t h[MAXTOK / 64 + 1];
    hpd_prefix_match_t m;
    tokens_of(s, tok);
    hpd_prefix_cache_hash(f->cache, tok, s.len / 64, h);
    assert_int_equal(hpd_prefix_cache_lookup(f->cache, h, s.len, &m), HPD_OK);
    *hit = m.hit_blocks;
    *kv = m.kv_blocks;
    hpd_prefix_cache_release(f->cache, &m);
}

#define P(len) {1, 1000, 1, len}
#define MIX(shared, len) {1, shared, 2, len}

static void test_hit_rules(void **state)
{
    static const struct {
        const char *what;
        uint32_t every;
        spec_t inserted[3];
        uint32_t n_inserted;
        spec_t lookup;
        uint32_t hit, kv;
    } rows[] = {
        {"empty cache", 0, {{0}}, 0, P(300), 0, 0},
        {"same prompt: up to its last full block", 0, {P(300)}, 1, P(300), 4, 4},
        {"longer prompt: the checkpoint at 256", 0, {P(300)}, 1, P(400), 4, 4},
        {"the prompt cut at 256: probe stops at 255", 0, {P(300)}, 1, P(256), 0, 3},
        {"diverging at 150: KV for 2 blocks, no state", 0, {P(300)}, 1, MIX(150, 300), 0, 2},
        {"a branch point saved by the second prompt", 0, {P(300), MIX(150, 300)}, 2,
         MIX(140, 300), 2, 2},
        {"every 2 blocks: state at 128", 2, {P(300)}, 1, MIX(200, 300), 2, 3},
        {"every 2 blocks, same prompt", 2, {P(300)}, 1, P(300), 4, 4},
        {"shorter than a block: nothing", 0, {P(50)}, 1, P(50), 0, 0},
        {"exactly one block: never the whole prompt", 0, {P(64)}, 1, P(64), 0, 0},
        {"one block then more", 0, {P(64)}, 1, P(74), 1, 1},
        {"diverging inside the first block", 0, {P(300)}, 1, MIX(30, 300), 0, 0},
        {"exact repeat of a 128-token prompt", 0, {P(128)}, 1, P(128), 0, 1},
        {"repeat plus one token", 0, {P(128)}, 1, P(129), 2, 2},
    };

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const uint32_t Bs[] = {16, 64, 128, 48};
        for (size_t b = 0; b < 4; b++) {
            fixture_t f;
            req_t r[3];
            uint32_t hit, kv;
            fixture_init(&f, Bs[b], 200, 16, 0, rows[i].every, 7);
            for (uint32_t k = 0; k < rows[i].n_inserted; k++)
                run_prompt(&f, rows[i].inserted[k], &r[k]);
            for (uint32_t k = 0; k < rows[i].n_inserted; k++)
                end_prompt(&f, &r[k]);
            probe(&f, rows[i].lookup, &hit, &kv);
            if (hit != rows[i].hit || kv != rows[i].kv)
                print_message("%s (B=%u): hit %u kv %u, expected %u %u\n", rows[i].what, Bs[b],
                              hit, kv, rows[i].hit, rows[i].kv);
            assert_int_equal(hit, rows[i].hit);
            assert_int_equal(kv, rows[i].kv);
            /* and the hit's contents are right (checked inside run_prompt) */
            run_prompt(&f, rows[i].lookup, &r[0]);
            assert_int_equal(r[0].cached, rows[i].hit * 64);
            end_prompt(&f, &r[0]);
            fixture_fini(&f);
        }
    }
}

static void test_salt_separates_models(void **state)
{
    fixture_t f1, f2;
    req_t r;
    uint32_t hit, kv;
    fixture_init(&f1, 64, 64, 4, 0, 0, 1);
    fixture_init(&f2, 64, 64, 4, 0, 0, 2);
    run_prompt(&f1, (spec_t)P(300), &r);
    end_prompt(&f1, &r);
    run_prompt(&f2, (spec_t)P(300), &r);
    end_prompt(&f2, &r);
    hpd_block_hash_t h1[4], h2[4];
    int32_t tok[300];
    tokens_of((spec_t)P(300), tok);
    hpd_prefix_cache_hash(f1.cache, tok, 4, h1);
    hpd_prefix_cache_hash(f2.cache, tok, 4, h2);
    assert_memory_not_equal(h1[0].bytes, h2[0].bytes, 16);
    probe(&f1, (spec_t)P(300), &hit, &kv);
    assert_int_equal(hit, 4);
    fixture_fini(&f1);
    fixture_fini(&f2);
}

/* The router's summary: the free hash chain equals the cache's, and the
 * summary's expected hit equals what a lookup finds. */
static void test_summary(void **state)
{
    fixture_t f;
    req_t r;
    uint8_t sum[1024];
    fixture_init(&f, 64, 64, 8, 0, 2, 1);
    run_prompt(&f, (spec_t)P(300), &r);
    end_prompt(&f, &r);
    assert_true(hpd_prefix_cache_summary(f.cache, sum, sizeof(sum)) >= 2);
    const uint8_t salt[16] = {1};
    hpd_block_hash_t root, h1[8], h2[8];
    int32_t tok[MAXTOK];
    static const spec_t probes[] = {P(300), P(500), MIX(150, 300), MIX(20, 300), P(64), P(129)};
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        uint32_t hit, kv;
        tokens_of(probes[i], tok);
        hpd_prefix_hash_root(salt, &root);
        hpd_prefix_hash_chain(&root, tok, probes[i].len / 64, h1);
        hpd_prefix_cache_hash(f.cache, tok, probes[i].len / 64, h2);
        assert_memory_equal(h1, h2, probes[i].len / 64 * sizeof(h1[0]));
        probe(&f, probes[i], &hit, &kv);
        assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), h1, probes[i].len), hit);
    }
    /* an empty summary expects nothing */
    memset(sum, 0, sizeof(sum));
    tokens_of((spec_t)P(300), tok);
    hpd_prefix_hash_chain(&root, tok, 4, h1);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), h1, 300), 0);
    fixture_fini(&f);
}

/* A pool too small for two prompts: the first moves to the host tier and is
 * promoted back, with the same rows and state, on the next hit. Then a host
 * tier too small for it: entries are dropped, lookups stay correct. */
static void test_host_tier(void **state)
{
    const uint32_t Bs[] = {16, 64, 128};
    for (size_t b = 0; b < 3; b++) {
        for (int small_host = 0; small_host < 2; small_host++) {
            fixture_t f;
            req_t r;
            hpd_prefix_cache_stats_t st;
            const uint32_t B = Bs[b], pages = 2 * ((320 + B - 1) / B + 1);
            fixture_init(&f, B, pages, 2, small_host ? 3 * 2 * 64 * 2 * HD * 4 : 1 << 20, 2, 9);
            run_prompt(&f, (spec_t)P(320), &r);
            end_prompt(&f, &r);
            run_prompt(&f, (spec_t){5, 0, 5, 320}, &r); /* evicts the first */
            end_prompt(&f, &r);
            hpd_prefix_cache_stats(f.cache, &st);
            assert_true(st.evicted_to_host + st.evicted_dropped > 0);
            run_prompt(&f, (spec_t)P(330), &r); /* contents checked inside */
            hpd_prefix_cache_stats(f.cache, &st);
            if (!small_host) {
                assert_int_equal(r.cached, 320);
                assert_true(st.hit_tokens_host > 0);
                assert_true(st.promotions > 0);
            }
            end_prompt(&f, &r);
            /* the cache's references are all that is left */
            uint32_t *refs = calloc(pages, sizeof(uint32_t));
            hpd_prefix_cache_page_refs(f.cache, refs);
            for (uint32_t i = 0; i < pages; i++)
                assert_int_equal(refs[i], hpd_page_pool_refcount(f.pool, i));
            free(refs);
            fixture_fini(&f);
        }
    }
}

/* A prompt run to its end: its blocks stay in the cache. */
static void cache_prompt(fixture_t *f, spec_t s)
{
    req_t r;
    run_prompt(f, s, &r);
    end_prompt(f, &r);
}

static uint32_t hit_of(fixture_t *f, spec_t s)
{
    uint32_t hit, kv;
    probe(f, s, &hit, &kv);
    return hit;
}

/* Which entry eviction takes: prompts A and B are cached (B last), A is
 * touched by a lookup, then exactly one entry must go. Least recently used
 * is B; a cache that evicted the most recently used (or the first inserted)
 * would take A. One case per place that picks a victim: the device tier,
 * the host tier, the device checkpoint slots. */
static const spec_t evict_a = {11, 0, 11, 65}, evict_b = {12, 0, 12, 65}, evict_c = {13, 0, 13, 65};

static void test_eviction_order_device(void **state)
{
    fixture_t f;
    hpd_prefix_cache_stats_t st;
    fixture_init(&f, 64, 16, 4, 0, 0, 3); /* no host tier: evicted entries are dropped */
    cache_prompt(&f, evict_a);
    cache_prompt(&f, evict_b);
    assert_int_equal(hit_of(&f, evict_a), 1); /* the touch */
    /* one entry (one block: a page in each of the 2 groups) must go */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2),
                     HPD_OK);
    hpd_prefix_cache_stats(f.cache, &st);
    assert_int_equal(st.evicted_dropped, 1);
    assert_int_equal(st.device_entries, 1);
    assert_int_equal(hit_of(&f, evict_b), 0);
    assert_int_equal(hit_of(&f, evict_a), 1);
    fixture_fini(&f);
}

static void test_eviction_order_host(void **state)
{
    fixture_t f;
    hpd_prefix_cache_stats_t st;
    /* the host tier holds exactly two entries (KV of 64 tokens in 2 groups
     * of 2 x HD floats, and a checkpoint) */
    const uint64_t entry = 2 * 64 * 2 * HD * sizeof(float) + STATE;
    fixture_init(&f, 64, 6, 4, 2 * entry, 0, 3);
    cache_prompt(&f, evict_a);
    cache_prompt(&f, evict_b);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 6), HPD_OK); /* both to the host */
    hpd_prefix_cache_stats(f.cache, &st);
    assert_int_equal(st.host_entries, 2);
    assert_int_equal(st.host_bytes, 2 * entry);
    assert_int_equal(hit_of(&f, evict_a), 1); /* the touch, in the host tier */
    cache_prompt(&f, evict_c);
    /* C to the host tier: a full tier drops one entry for it */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 6), HPD_OK);
    hpd_prefix_cache_stats(f.cache, &st);
    assert_int_equal(st.host_dropped, 1);
    assert_int_equal(st.host_entries, 2);
    assert_int_equal(hit_of(&f, evict_b), 0);
    assert_int_equal(hit_of(&f, evict_a), 1);
    assert_int_equal(hit_of(&f, evict_c), 1);
    fixture_fini(&f);
}

static void test_eviction_order_checkpoints(void **state)
{
    fixture_t f;
    uint32_t hit, kv;
    hpd_prefix_cache_stats_t st;
    fixture_init(&f, 64, 64, 2, 0, 0, 3); /* two checkpoint slots, plenty of pages */
    cache_prompt(&f, evict_a);
    cache_prompt(&f, evict_b);
    hpd_prefix_cache_stats(f.cache, &st);
    assert_int_equal(st.device_checkpoints, 2);
    assert_int_equal(hit_of(&f, evict_a), 1); /* the touch */
    cache_prompt(&f, evict_c); /* its checkpoint takes B's slot */
    hpd_prefix_cache_stats(f.cache, &st);
    assert_int_equal(st.device_checkpoints, 2);
    assert_int_equal(st.device_entries, 3); /* B keeps its KV, without a state */
    probe(&f, evict_b, &hit, &kv);
    assert_int_equal(hit, 0);
    assert_int_equal(kv, 1);
    assert_int_equal(hit_of(&f, evict_a), 1);
    assert_int_equal(hit_of(&f, evict_c), 1);
    fixture_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_rules),
        cmocka_unit_test(test_salt_separates_models),
        cmocka_unit_test(test_host_tier),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_eviction_order_device),
        cmocka_unit_test(test_eviction_order_host),
        cmocka_unit_test(test_eviction_order_checkpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
