/* The prefix cache library on its own: the hit rules (table-driven), the
 * pages and state a hit hands over, host-tier eviction and promotion, the
 * model salt, the eviction order, every stats counter, locks, the
 * checkpoint plan, the router's summary, and the answers to a backend whose
 * copies fail (faulty_backend.h). Insertions follow the engine's checkpoint
 * plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/prefix_cache.h"
#include "tests/cache/faulty_backend.h"
#include "tests/test_helpers.h"

enum { HD = 4, STATE = 64, MAXTOK = 512 };

/* Host bytes of one entry moved to the host tier: its 64 tokens in each of
 * the 2 pack groups (K and V rows of 1 head x HD floats) */
#define HOST_KV (2 * 64 * 2 * HD * sizeof(float))

typedef struct {
    hpd_backend_t *cpu;
    faulty_backend_t fb; /* wraps cpu: what the pool and the cache use */
    hpd_backend_t *be;
    hpd_page_pool_t *pool;
    hpd_prefix_cache_t *cache;
    hpd_kv_layout_t layout;
} fixture_t;

static void fixture_init(fixture_t *f, uint32_t B, uint32_t n_pages, uint32_t n_ckpt,
                         uint64_t host_bytes, uint32_t every, uint8_t salt)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    assert_int_equal(hpd_backend_cpu_create(&bp, &f->cpu), HPD_OK);
    f->be = faulty_backend_init(&f->fb, f->cpu);
    f->layout = (hpd_kv_layout_t){.block_size = B,
                                  .pack_size = 1,
                                  .order = HPD_KV_NHD,
                                  .dtype = HPD_DTYPE_F32,
                                  .n_layers = 2,
                                  .n_kv_heads = 1,
                                  .head_dim = HD};
    hpd_page_pool_params_t pp = {.backend = f->be, .layout = f->layout, .n_pages = n_pages};
    assert_int_equal(hpd_page_pool_create(&pp, &f->pool), HPD_OK);
    hpd_prefix_cache_params_t cp = {.backend = f->be,
                                    .pages = f->pool,
                                    .state_bytes = STATE,
                                    .n_checkpoints = n_ckpt,
                                    .host_bytes = host_bytes,
                                    .checkpoint_every = every,
                                    .salt = {salt}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &f->cache), HPD_OK);
}

static void fixture_fini(fixture_t *f)
{
    hpd_prefix_cache_destroy(f->cache);
    hpd_page_pool_destroy(f->pool);
    assert_int_equal(f->fb.n_live, 0); /* every backend allocation given back */
    hpd_backend_destroy(f->cpu);
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

/* A model without full-attention layers has no page pool: entries hold
 * GDN checkpoints only, and a hit hands over the state of its prefix. */
static void test_no_pages(void **state)
{
    hpd_backend_t *cpu;
    hpd_prefix_cache_t *c;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    assert_int_equal(hpd_backend_cpu_create(&bp, &cpu), HPD_OK);
    hpd_prefix_cache_params_t cp = {.backend = cpu, .state_bytes = STATE, .n_checkpoints = 4};
    assert_int_equal(hpd_prefix_cache_create(&cp, &c), HPD_OK);
    int32_t tok[200];
    hpd_block_hash_t h[3];
    hpd_prefix_match_t m;
    float st[STATE / 4], back[STATE / 4];
    uint32_t *no_tables[1] = {NULL};
    tokens_of((spec_t)P(200), tok);
    for (uint32_t i = 0; i < STATE / 4; i++)
        st[i] = 0.5f * (float)i + 7.0f;
    hpd_prefix_cache_hash(c, tok, 3, h);
    assert_int_equal(hpd_prefix_cache_lookup(c, h, 200, &m), HPD_OK);
    assert_int_equal(m.hit_blocks, 0);
    hpd_prefix_cache_release(c, &m);
    /* 128 tokens computed, their state checkpointed */
    assert_int_equal(hpd_prefix_cache_insert(c, h, 2, (const uint32_t *const *)no_tables, st),
                     HPD_OK);
    assert_int_equal(hpd_prefix_cache_lookup(c, h, 200, &m), HPD_OK);
    assert_int_equal(m.hit_blocks, 2);
    assert_int_equal(hpd_prefix_cache_attach(c, &m, no_tables, back), HPD_OK);
    assert_memory_equal(back, st, sizeof(st));
    hpd_prefix_cache_release(c, &m);
    hpd_prefix_cache_destroy(c);
    hpd_backend_destroy(cpu);
}

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

/* Which entry eviction takes: prompts A and B are cached (B last), one of
 * them is touched by a lookup, then exactly one entry must go: the other
 * one, least recently used. Both ways round, so that neither the most
 * recently used nor the first or last inserted entry passes for the LRU one.
 * One case per place that picks a victim: the device tier, the host tier,
 * the device checkpoint slots. */
static const spec_t evict_a = {11, 0, 11, 65}, evict_b = {12, 0, 12, 65}, evict_c = {13, 0, 13, 65};

static hpd_prefix_cache_stats_t stats_of(fixture_t *f)
{
    hpd_prefix_cache_stats_t st;
    hpd_prefix_cache_stats(f->cache, &st);
    return st;
}

static void test_eviction_order_device(void **state)
{
    for (int touch_b = 0; touch_b < 2; touch_b++) {
        const spec_t kept = touch_b ? evict_b : evict_a, gone = touch_b ? evict_a : evict_b;
        fixture_t f;
        hpd_prefix_cache_stats_t st;
        fixture_init(&f, 64, 16, 4, 0, 0, 3); /* no host tier: evicted entries are dropped */
        cache_prompt(&f, evict_a);
        cache_prompt(&f, evict_b);
        assert_int_equal(hit_of(&f, kept), 1); /* the touch */
        /* one entry (one block: a page in each of the 2 groups) must go */
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2),
                         HPD_OK);
        st = stats_of(&f);
        assert_int_equal(st.evicted_dropped, 1);
        assert_int_equal(st.evicted_to_host, 0);
        assert_int_equal(st.host_dropped, 0);
        assert_int_equal(st.device_entries, 1);
        assert_int_equal(st.host_entries, 0);
        /* the dropped entry's checkpoint went with it */
        assert_int_equal(st.device_checkpoints, 1);
        assert_int_equal(st.checkpoint_bytes, STATE);
        assert_int_equal(st.host_checkpoint_bytes, 0);
        assert_int_equal(st.host_bytes, 0);
        assert_int_equal(st.pages_held, 2);
        assert_int_equal(hit_of(&f, gone), 0);
        assert_int_equal(hit_of(&f, kept), 1);
        fixture_fini(&f);
    }
}

static void test_eviction_order_host(void **state)
{
    /* the host tier holds exactly two entries (KV of 64 tokens in 2 groups
     * of 2 x HD floats, and a checkpoint) */
    const uint64_t entry = HOST_KV + STATE;
    for (int touch_b = 0; touch_b < 2; touch_b++) {
        const spec_t kept = touch_b ? evict_b : evict_a, gone = touch_b ? evict_a : evict_b;
        fixture_t f;
        hpd_prefix_cache_stats_t st;
        fixture_init(&f, 64, 6, 4, 2 * entry, 0, 3);
        cache_prompt(&f, evict_a);
        cache_prompt(&f, evict_b);
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, 6), HPD_OK); /* both to the host */
        st = stats_of(&f);
        assert_int_equal(st.host_entries, 2);
        assert_int_equal(st.host_bytes, 2 * entry);
        assert_int_equal(st.host_checkpoint_bytes, 2 * STATE);
        assert_int_equal(hit_of(&f, kept), 1); /* the touch, in the host tier */
        cache_prompt(&f, evict_c);
        /* C to the host tier: a full tier drops one entry for it */
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, 6), HPD_OK);
        st = stats_of(&f);
        assert_int_equal(st.host_dropped, 1);
        assert_int_equal(st.evicted_dropped, 0);
        assert_int_equal(st.evicted_to_host, 3);
        assert_int_equal(st.host_entries, 2);
        assert_int_equal(st.host_bytes, 2 * entry);
        assert_int_equal(st.host_checkpoint_bytes, 2 * STATE);
        assert_int_equal(hit_of(&f, gone), 0);
        assert_int_equal(hit_of(&f, kept), 1);
        assert_int_equal(hit_of(&f, evict_c), 1);
        fixture_fini(&f);
    }
}

static void test_eviction_order_checkpoints(void **state)
{
    for (int touch_b = 0; touch_b < 2; touch_b++) {
        const spec_t kept = touch_b ? evict_b : evict_a, gone = touch_b ? evict_a : evict_b;
        fixture_t f;
        uint32_t hit, kv;
        hpd_prefix_cache_stats_t st;
        fixture_init(&f, 64, 64, 2, 0, 0, 3); /* two checkpoint slots, plenty of pages */
        cache_prompt(&f, evict_a);
        cache_prompt(&f, evict_b);
        st = stats_of(&f);
        assert_int_equal(st.device_checkpoints, 2);
        assert_int_equal(hit_of(&f, kept), 1); /* the touch */
        cache_prompt(&f, evict_c); /* its checkpoint takes the other one's slot */
        st = stats_of(&f);
        assert_int_equal(st.device_checkpoints, 2);
        assert_int_equal(st.checkpoint_bytes, 2 * STATE);
        assert_int_equal(st.checkpoints_created, 3);
        assert_int_equal(st.device_entries, 3); /* it keeps its KV, without a state */
        assert_int_equal(st.host_checkpoint_bytes, 0);
        assert_int_equal(st.host_bytes, 0);
        probe(&f, gone, &hit, &kv);
        assert_int_equal(hit, 0);
        assert_int_equal(kv, 1);
        assert_int_equal(hit_of(&f, kept), 1);
        assert_int_equal(hit_of(&f, evict_c), 1);
        fixture_fini(&f);
    }
}

/* Every counter of the stats, exactly, through a prompt's life: computed,
 * moved to the host tier, promoted back on a hit, hit on the device, then
 * pushed out of a full host tier by a newer prompt. B = 64: an entry holds
 * one page per group. */
static void test_stats_counters(void **state)
{
    const spec_t p = {21, 0, 21, 130}, p_longer = {21, 0, 21, 140}, q = {22, 0, 22, 130};
    const uint64_t bound = 2 * HOST_KV + STATE; /* two entries' KV, one checkpoint */
    fixture_t f;
    hpd_prefix_cache_stats_t st;
    uint32_t hit, kv;

    fixture_init(&f, 64, 16, 4, bound, 0, 3);
    st = stats_of(&f);
    assert_int_equal(st.lookups, 0);
    assert_int_equal(st.device_entries + st.host_entries + st.pages_held, 0);

    /* 130 tokens: blocks 0 and 1, the state at 128 */
    cache_prompt(&f, p);
    st = stats_of(&f);
    assert_int_equal(st.lookups, 1);
    assert_int_equal(st.lookup_tokens, 130);
    assert_int_equal(st.hit_tokens_device, 0);
    assert_int_equal(st.hit_tokens_host, 0);
    assert_int_equal(st.inserted_blocks, 2);
    assert_int_equal(st.checkpoints_created, 1);
    assert_int_equal(st.checkpoint_bytes, STATE);
    assert_int_equal(st.device_checkpoints, 1);
    assert_int_equal(st.device_entries, 2);
    assert_int_equal(st.host_entries, 0);
    assert_int_equal(st.pages_held, 4);
    assert_int_equal(hpd_page_pool_n_free(f.pool), 12);

    /* both to the host tier, the checkpoint with them */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    st = stats_of(&f);
    assert_int_equal(st.evicted_to_host, 2);
    assert_int_equal(st.evicted_dropped + st.host_dropped, 0);
    assert_int_equal(st.device_entries, 0);
    assert_int_equal(st.host_entries, 2);
    assert_int_equal(st.device_checkpoints, 0);
    assert_int_equal(st.checkpoint_bytes, 0);
    assert_int_equal(st.host_checkpoint_bytes, STATE);
    assert_int_equal(st.host_bytes, bound);
    assert_int_equal(st.pages_held, 0);
    assert_int_equal(hpd_page_pool_n_free(f.pool), 16);

    /* a hit over both: promoted, with the checkpoint back in a device slot */
    cache_prompt(&f, p_longer);
    st = stats_of(&f);
    assert_int_equal(st.lookups, 2);
    assert_int_equal(st.lookup_tokens, 270);
    assert_int_equal(st.hit_tokens_host, 128);
    assert_int_equal(st.hit_tokens_device, 0);
    assert_int_equal(st.promotions, 2);
    assert_int_equal(st.inserted_blocks, 2);
    assert_int_equal(st.checkpoints_created, 1);
    assert_int_equal(st.device_entries, 2);
    assert_int_equal(st.host_entries, 0);
    assert_int_equal(st.device_checkpoints, 1);
    assert_int_equal(st.checkpoint_bytes, STATE);
    assert_int_equal(st.host_checkpoint_bytes, 0);
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(st.pages_held, 4);

    /* the same hit, now on the device */
    cache_prompt(&f, p_longer);
    st = stats_of(&f);
    assert_int_equal(st.lookups, 3);
    assert_int_equal(st.lookup_tokens, 410);
    assert_int_equal(st.hit_tokens_device, 128);
    assert_int_equal(st.hit_tokens_host, 128);
    assert_int_equal(st.promotions, 2);

    /* a second prompt, then everything out: the host tier has room for two
     * entries, so p's blocks (least recent) go first to the host tier and
     * are then dropped, leaf first, to make room for q's */
    cache_prompt(&f, q);
    st = stats_of(&f);
    assert_int_equal(st.inserted_blocks, 4);
    assert_int_equal(st.checkpoints_created, 2);
    assert_int_equal(st.checkpoint_bytes, 2 * STATE);
    assert_int_equal(st.device_entries, 4);
    assert_int_equal(st.pages_held, 8);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    st = stats_of(&f);
    assert_int_equal(st.evicted_to_host, 6);
    assert_int_equal(st.host_dropped, 2);
    assert_int_equal(st.evicted_dropped, 0);
    assert_int_equal(st.host_entries, 2);
    assert_int_equal(st.device_entries, 0);
    assert_int_equal(st.device_checkpoints, 0);
    assert_int_equal(st.checkpoint_bytes, 0);
    assert_int_equal(st.host_checkpoint_bytes, STATE);
    assert_int_equal(st.host_bytes, bound);
    assert_int_equal(st.pages_held, 0);
    probe(&f, p_longer, &hit, &kv);
    assert_int_equal(kv, 0);
    probe(&f, q, &hit, &kv);
    assert_int_equal(hit, 2);
    fixture_fini(&f);
}

/* pages_held counts distinct pages: with B = 128 the two blocks of a
 * 130-token prompt share their first page (one per group). */
static void test_stats_shared_pages(void **state)
{
    fixture_t f;
    fixture_init(&f, 128, 16, 4, 0, 0, 3);
    cache_prompt(&f, (spec_t){21, 0, 21, 130});
    hpd_prefix_cache_stats_t st = stats_of(&f);
    assert_int_equal(st.device_entries, 2);
    assert_int_equal(st.pages_held, 2);
    uint32_t refs[16] = {0};
    hpd_prefix_cache_page_refs(f.cache, refs);
    uint32_t total = 0;
    for (uint32_t i = 0; i < 16; i++) {
        assert_int_equal(refs[i], hpd_page_pool_refcount(f.pool, i));
        total += refs[i];
    }
    assert_int_equal(total, 4); /* each entry references the page of each group */
    fixture_fini(&f);
}

/* The host tier's bound holds whatever moves into it: an entry moved with
 * its checkpoint needs room for both. */
static void test_host_tier_bound(void **state)
{
    const uint64_t bounds[] = {HOST_KV, HOST_KV + STATE, 2 * HOST_KV, 2 * HOST_KV + STATE,
                               2 * HOST_KV + 2 * STATE - 1, 3 * HOST_KV};
    for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++) {
        fixture_t f;
        fixture_init(&f, 64, 8, 4, bounds[i], 0, 3);
        cache_prompt(&f, evict_a);
        cache_prompt(&f, evict_b);
        cache_prompt(&f, evict_c);
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, 8), HPD_OK);
        hpd_prefix_cache_stats_t st = stats_of(&f);
        if (st.host_bytes > bounds[i])
            print_message("bound %llu: %llu host bytes held\n", (unsigned long long)bounds[i],
                          (unsigned long long)st.host_bytes);
        assert_true(st.host_bytes <= bounds[i]);
        assert_int_equal(st.host_bytes,
                         st.host_entries * HOST_KV + st.host_checkpoint_bytes);
        assert_int_equal(st.evicted_to_host + st.evicted_dropped, 3);
        assert_int_equal(st.host_entries, st.evicted_to_host - st.host_dropped);
        fixture_fini(&f);
    }
    /* checkpoints alone (one device slot: each new one pushes the last out) */
    const uint64_t ckpt_bounds[] = {STATE - 1, STATE, 2 * STATE - 1, 2 * STATE};
    for (size_t i = 0; i < sizeof(ckpt_bounds) / sizeof(ckpt_bounds[0]); i++) {
        fixture_t f;
        fixture_init(&f, 64, 16, 1, ckpt_bounds[i], 0, 3);
        cache_prompt(&f, evict_a);
        cache_prompt(&f, evict_b);
        cache_prompt(&f, evict_c);
        hpd_prefix_cache_stats_t st = stats_of(&f);
        assert_true(st.host_bytes <= ckpt_bounds[i]);
        assert_int_equal(st.host_checkpoint_bytes, ckpt_bounds[i] / STATE * STATE);
        assert_int_equal(st.host_bytes, st.host_checkpoint_bytes);
        assert_int_equal(st.device_checkpoints, 1);
        assert_int_equal(st.device_entries, 3);
        fixture_fini(&f);
    }
}

/* A host-tier entry dropped to make room leaves its device parent as it
 * was: without device children, so that it can be evicted in turn. */
static void test_host_drop_under_device_parent(void **state)
{
    const spec_t p = {21, 0, 21, 130}, p_short = {21, 0, 21, 65}, q = {22, 0, 22, 65};
    fixture_t f;
    hpd_prefix_cache_stats_t st;

    fixture_init(&f, 64, 16, 4, HOST_KV + STATE, 0, 3); /* room for one entry */
    cache_prompt(&f, p);                                 /* p0 - p1, the state at 128 */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2),
                     HPD_OK); /* p1 to the host tier */
    cache_prompt(&f, q);
    cache_prompt(&f, p_short); /* p0 gets a state and is now the most recent */
    /* q, least recent, to the host tier: p1 is dropped for room */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2),
                     HPD_OK);
    st = stats_of(&f);
    assert_int_equal(st.host_dropped, 1);
    assert_int_equal(st.host_entries, 1);
    assert_int_equal(st.device_entries, 1);
    assert_int_equal(hit_of(&f, (spec_t){21, 0, 21, 100}), 1);
    /* and p0 can go too */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    st = stats_of(&f);
    assert_int_equal(st.device_entries, 0);
    assert_int_equal(st.pages_held, 0);
    fixture_fini(&f);
}

/* A full host tier drops leaves first: a two-block prompt, both blocks in
 * the host tier (the parent as old as its child), makes room for another
 * entry by dropping its deepest block; its first block's KV stays. */
static void test_host_drops_leaves_first(void **state)
{
    const spec_t p = {31, 0, 31, 129}, q = {32, 0, 32, 65}; /* p: states at 128 */
    fixture_t f;
    uint32_t hit, kv;
    hpd_prefix_cache_stats_t st;

    fixture_init(&f, 64, 16, 4, 2 * HOST_KV + STATE, 0, 3); /* p's two blocks and state */
    cache_prompt(&f, p);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    assert_int_equal(stats_of(&f).host_entries, 2);
    cache_prompt(&f, q);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK); /* q to the host */
    st = stats_of(&f);
    assert_int_equal(st.host_dropped, 1);
    assert_int_equal(st.host_entries, 2);
    probe(&f, p, &hit, &kv);
    assert_int_equal(hit, 0);
    assert_int_equal(kv, 1); /* p's first block, the parent, is still there */
    assert_int_equal(hit_of(&f, q), 1);
    fixture_fini(&f);
}

/* A checkpoint promoted back from the host tier owns its device slot: a
 * checkpoint saved next takes the other slot, and both states come back
 * right on their hits (checked inside run_prompt). */
static void test_promoted_checkpoint_keeps_its_slot(void **state)
{
    fixture_t f;
    hpd_prefix_cache_stats_t st;

    fixture_init(&f, 64, 16, 2, 1 << 20, 0, 3); /* two checkpoint slots */
    cache_prompt(&f, evict_a);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK); /* A to the host */
    assert_int_equal(stats_of(&f).device_checkpoints, 0);
    cache_prompt(&f, evict_a); /* promoted: its state back in a slot */
    cache_prompt(&f, evict_b); /* B's state in the other slot */
    st = stats_of(&f);
    assert_int_equal(st.device_checkpoints, 2);
    assert_int_equal(st.host_checkpoint_bytes, 0);
    cache_prompt(&f, evict_a);
    cache_prompt(&f, evict_b);
    fixture_fini(&f);
}

/* Many one-block prompts (the hash map's buckets hold several each), then
 * the least recently used half evicted: exactly those are gone, every
 * other one is still found. */
static void test_evict_many_lru(void **state)
{
    enum { N = 256 }; /* as many entries as their table holds (ASan: no read past it) */
    fixture_t f;
    int32_t tok[64];
    hpd_block_hash_t h[N];
    uint32_t pages[2], hit, kv;
    const uint32_t *tables[2] = {&pages[0], &pages[1]};
    hpd_prefix_match_t m;
    float st8[STATE / 4] = {0};

    fixture_init(&f, 64, 2 * N, N, 0, 0, 3);
    for (uint32_t i = 0; i < N; i++) {
        tokens_of((spec_t){100 + i, 0, 100 + i, 64}, tok);
        hpd_prefix_cache_hash(f.cache, tok, 1, &h[i]);
        assert_int_equal(hpd_page_pool_alloc(f.pool, 2, pages), HPD_OK);
        assert_int_equal(hpd_prefix_cache_insert(f.cache, &h[i], 1, tables, st8), HPD_OK);
        hpd_page_pool_unref(f.pool, pages[0]);
        hpd_page_pool_unref(f.pool, pages[1]);
    }
    /* touch them in a shuffled order: the LRU order is that one */
    uint32_t order[N];
    for (uint32_t i = 0; i < N; i++)
        order[i] = (i * 7919) % N;
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(hpd_prefix_cache_lookup(f.cache, &h[order[i]], 65, &m), HPD_OK);
        assert_int_equal(m.hit_blocks, 1);
        hpd_prefix_cache_release(f.cache, &m);
    }
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, N), HPD_OK); /* N / 2 entries */
    assert_int_equal(stats_of(&f).evicted_dropped, N / 2);
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(hpd_prefix_cache_lookup(f.cache, &h[order[i]], 65, &m), HPD_OK);
        hit = m.hit_blocks;
        kv = m.kv_blocks;
        hpd_prefix_cache_release(f.cache, &m);
        if (kv != (i >= N / 2))
            print_message("entry touched %u-th: kv %u\n", i, kv);
        assert_int_equal(kv, i >= N / 2);
        assert_int_equal(hit, kv);
    }
    fixture_fini(&f);
}

/* Every bit of every token id is part of the key: prompts that differ in
 * one bit of one id never share the block (nor the blocks after it). */
static void test_hash_every_bit(void **state)
{
    fixture_t f;
    int32_t tok[3 * 64], flipped[3 * 64];
    hpd_block_hash_t h[3], hf[3];

    fixture_init(&f, 64, 4, 1, 0, 0, 3);
    for (uint32_t i = 0; i < 3 * 64; i++)
        tok[i] = (int32_t)(i * 7);
    hpd_prefix_cache_hash(f.cache, tok, 3, h);
    const uint32_t positions[] = {64, 64 + 1, 64 + 37, 127};
    for (size_t p = 0; p < sizeof(positions) / sizeof(positions[0]); p++)
        for (uint32_t bit = 0; bit < 32; bit++) {
            memcpy(flipped, tok, sizeof(tok));
            flipped[positions[p]] = (int32_t)((uint32_t)flipped[positions[p]] ^ (1u << bit));
            hpd_prefix_cache_hash(f.cache, flipped, 3, hf);
            assert_memory_equal(hf[0].bytes, h[0].bytes, 16);
            assert_memory_not_equal(hf[1].bytes, h[1].bytes, 16);
            assert_memory_not_equal(hf[2].bytes, h[2].bytes, 16);
        }
    fixture_fini(&f);
}

/* A lookup locks its hit (not the KV-only blocks past it) until released;
 * two lookups lock twice. */
static void test_locks(void **state)
{
    const spec_t p = {31, 0, 31, 300}, p_branch = {31, 150, 32, 300};
    fixture_t f;
    hpd_prefix_match_t m1, m2, m3;
    hpd_block_hash_t h[8], hb[8];
    int32_t tok[300];

    fixture_init(&f, 64, 32, 4, 0, 0, 3);
    cache_prompt(&f, p); /* 4 blocks, the state at 256 */
    const uint32_t free_before = hpd_page_pool_n_free(f.pool);
    tokens_of(p, tok);
    hpd_prefix_cache_hash(f.cache, tok, 4, h);
    tokens_of(p_branch, tok);
    hpd_prefix_cache_hash(f.cache, tok, 4, hb);

    /* a KV-only match (2 blocks, no state) locks nothing */
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, hb, 300, &m3), HPD_OK);
    assert_int_equal(m3.hit_blocks, 0);
    assert_int_equal(m3.kv_blocks, 2);
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, 300, &m1), HPD_OK);
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, 300, &m2), HPD_OK);
    assert_int_equal(m1.hit_blocks, 4);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 32), HPD_ERR_NO_RESOURCE);
    assert_int_equal(hpd_page_pool_n_free(f.pool), free_before);
    hpd_prefix_cache_release(f.cache, &m1);
    assert_null(m1.path);
    assert_int_equal(m1.hit_blocks, 0);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 32), HPD_ERR_NO_RESOURCE);
    assert_int_equal(stats_of(&f).device_entries, 4);
    hpd_prefix_cache_release(f.cache, &m2);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 32), HPD_OK);
    assert_int_equal(stats_of(&f).device_entries, 0);
    assert_int_equal(hpd_page_pool_n_free(f.pool), 32);
    hpd_prefix_cache_release(f.cache, &m3);
    hpd_prefix_cache_release(f.cache, &m3); /* an empty match */

    /* degenerate calls: a prompt of no token finds nothing, even with its
     * (unused) hashes naming cached blocks; a prompt of no block records
     * nothing, state or not */
    cache_prompt(&f, p);
    const hpd_prefix_cache_stats_t before = stats_of(&f);
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, 0, &m1), HPD_OK);
    assert_int_equal(m1.kv_blocks, 0);
    assert_int_equal(m1.hit_blocks, 0);
    hpd_prefix_cache_release(f.cache, &m1);
    uint32_t page[2] = {0, 0};
    const uint32_t *tables[2] = {&page[0], &page[1]};
    float st8[STATE / 4] = {0};
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, 0, tables, st8), HPD_OK);
    const hpd_prefix_cache_stats_t after = stats_of(&f);
    assert_int_equal(after.lookups, before.lookups + 1);
    assert_int_equal(after.inserted_blocks, before.inserted_blocks);
    assert_int_equal(after.checkpoints_created, before.checkpoints_created);
    assert_int_equal(after.device_entries, before.device_entries);
    fixture_fini(&f);
}

/* Destroying the cache gives back every page reference it held (device
 * entries of several prompts, some of them promoted back from the host
 * tier), and every checkpoint and host copy (ASan). */
static void test_destroy_releases(void **state)
{
    fixture_t f;
    fixture_init(&f, 48, 40, 4, 1 << 20, 2, 3);
    cache_prompt(&f, (spec_t){41, 0, 41, 300});
    cache_prompt(&f, (spec_t){41, 200, 42, 400});
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 40), HPD_OK);
    cache_prompt(&f, (spec_t){41, 0, 41, 200}); /* promotes some back */
    cache_prompt(&f, (spec_t){43, 0, 43, 100});
    hpd_prefix_cache_stats_t st = stats_of(&f);
    assert_true(st.device_entries > 0 && st.host_entries > 0);
    assert_true(hpd_page_pool_n_free(f.pool) < 40);
    hpd_prefix_cache_destroy(f.cache);
    f.cache = NULL;
    assert_int_equal(hpd_page_pool_n_free(f.pool), 40);
    for (uint32_t i = 0; i < 40; i++)
        assert_int_equal(hpd_page_pool_refcount(f.pool, i), 0);
    fixture_fini(&f);
}

/* A prompt cycled through the host tier and back, three times: every
 * promoted entry is on the device again (with its checkpoint), and the tree
 * evicts leaf-first as before, so that everything can go again. */
static void test_promotion_round_trips(void **state)
{
    const spec_t p = {51, 0, 51, 200}; /* 3 blocks, the state at 192 */
    fixture_t f;
    hpd_prefix_cache_stats_t st;

    fixture_init(&f, 64, 16, 4, 1 << 20, 0, 3);
    cache_prompt(&f, p);
    for (uint32_t round = 1; round <= 3; round++) {
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
        st = stats_of(&f);
        assert_int_equal(st.host_entries, 3);
        assert_int_equal(st.device_entries, 0);
        assert_int_equal(st.evicted_to_host, 3 * round);
        assert_int_equal(st.host_bytes, 3 * HOST_KV + STATE);
        cache_prompt(&f, p); /* a hit of 3 host blocks; contents checked inside */
        st = stats_of(&f);
        assert_int_equal(st.promotions, 3 * round);
        assert_int_equal(st.hit_tokens_host, 192 * round);
        assert_int_equal(st.host_entries, 0);
        assert_int_equal(st.device_entries, 3);
        assert_int_equal(st.device_checkpoints, 1);
        assert_int_equal(st.host_bytes, 0);
        /* leaf first: one entry's pages out, the deepest block goes */
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2),
                         HPD_OK);
        st = stats_of(&f);
        assert_int_equal(st.host_entries, 1);
        assert_int_equal(st.host_checkpoint_bytes, STATE);
        assert_int_equal(st.device_checkpoints, 0);
    }
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    assert_int_equal(stats_of(&f).device_entries, 0);
    fixture_fini(&f);
}

/* The checkpoint plan, table-driven: the last full block, the branch point
 * of the match, every N blocks; ascending, each once, past `after`, at most
 * `max` of them. */
static void test_checkpoint_plan(void **state)
{
    static const struct {
        uint32_t every, n_tokens, kv_blocks, hit_blocks, after, max;
        uint32_t n, want[8];
    } rows[] = {
        {0, 300, 0, 0, 0, 8, 1, {256}},
        {0, 256, 0, 0, 0, 8, 1, {256}},
        {0, 63, 0, 0, 0, 8, 0, {0}},
        {0, 64, 0, 0, 0, 8, 1, {64}},
        {0, 300, 0, 0, 256, 8, 0, {0}},
        {0, 300, 0, 0, 255, 8, 1, {256}},
        {2, 300, 0, 0, 0, 8, 2, {128, 256}},       /* 256 twice: once */
        {2, 256, 0, 0, 0, 8, 2, {128, 256}},
        {2, 257, 0, 0, 0, 8, 2, {128, 256}},
        {1, 200, 0, 0, 64, 8, 2, {128, 192}},
        {1, 200, 0, 0, 0, 2, 2, {64, 128}},        /* at most max */
        {2, 300, 0, 0, 0, 1, 1, {128}},
        {2, 300, 0, 0, 0, 0, 0, {0}},
        {0, 300, 3, 1, 64, 8, 2, {192, 256}},      /* the branch point */
        {0, 300, 4, 2, 128, 8, 1, {256}},          /* the branch point is the last block */
        {0, 300, 3, 3, 192, 8, 1, {256}},          /* no branch point */
        {0, 400, 2, 0, 0, 8, 2, {128, 384}},
        {4, 1000, 5, 2, 128, 8, 5, {256, 320, 512, 768, 960}},
        {3, 130, 0, 0, 0, 8, 1, {128}},            /* every 3 blocks is past the prompt */
        /* more positions than the plan keeps (4096): the first ones */
        {1, 5000 * 64 + 1, 0, 0, 0, 8, 8, {64, 128, 192, 256, 320, 384, 448, 512}},
        {1, 5000 * 64 + 1, 0, 0, 4000 * 64, 2, 2, {4001 * 64, 4002 * 64}},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        fixture_t f;
        uint32_t pos[16];
        hpd_prefix_match_t m = {.hit_blocks = rows[i].hit_blocks,
                                .kv_blocks = rows[i].kv_blocks};
        fixture_init(&f, 64, 4, 2, 0, rows[i].every, 3);
        for (uint32_t k = 0; k < 16; k++)
            pos[k] = 12345;
        const uint32_t n = hpd_prefix_cache_checkpoint_plan(f.cache, &m, rows[i].n_tokens,
                                                            rows[i].after, pos, rows[i].max);
        if (n != rows[i].n)
            print_message("row %zu: %u positions, expected %u\n", i, n, rows[i].n);
        assert_int_equal(n, rows[i].n);
        for (uint32_t k = 0; k < n; k++)
            assert_int_equal(pos[k], rows[i].want[k]);
        assert_int_equal(pos[rows[i].max], 12345); /* nothing written past max */
        if (rows[i].kv_blocks == 0) /* no match at all: the same plan */
            assert_int_equal(hpd_prefix_cache_checkpoint_plan(f.cache, NULL, rows[i].n_tokens,
                                                              rows[i].after, pos, rows[i].max),
                             n);
        fixture_fini(&f);
    }
}

/* The summary's format (docs/cluster.md): each key sets the bits given by
 * its four 32-bit words modulo the number of bits, and nothing else; the
 * summary holds the keys of the entries with a state, device or host. */
static void expect_bits(const hpd_block_hash_t *keys, uint32_t n_keys, size_t bytes,
                        uint8_t *want)
{
    memset(want, 0, bytes);
    for (uint32_t k = 0; k < n_keys; k++)
        for (int i = 0; i < 4; i++) {
            uint32_t w;
            memcpy(&w, keys[k].bytes + 4 * i, 4);
            w %= (uint32_t)(bytes * 8);
            want[w / 8] |= (uint8_t)(1u << (w % 8));
        }
}

static void test_summary_format(void **state)
{
    const size_t sizes[] = {8192, 1000, 7, 1};
    hpd_block_hash_t keys[4];
    uint8_t sum[8192], want[8192];

    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 16; b++)
            keys[k].bytes[b] = (uint8_t)(0x9d * (k + 1) + 0x35 * b + (b * b << (k + 1)));
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        const size_t bytes = sizes[s];
        memset(sum, 0, bytes);
        hpd_prefix_summary_add(sum, bytes, &keys[0]);
        hpd_prefix_summary_add(sum, bytes, &keys[1]);
        expect_bits(keys, 2, bytes, want);
        assert_memory_equal(sum, want, bytes);
        assert_true(hpd_prefix_summary_test(sum, bytes, &keys[0]));
        assert_true(hpd_prefix_summary_test(sum, bytes, &keys[1]));
        /* a key is in only when all four of its bits are */
        expect_bits(&keys[2], 1, bytes, want);
        bool all = true;
        for (size_t i = 0; i < bytes; i++)
            all = all && (want[i] & ~sum[i]) == 0;
        assert_int_equal(hpd_prefix_summary_test(sum, bytes, &keys[2]), all);
        /* every one of a key's bits is needed */
        expect_bits(keys, 1, bytes, want);
        for (size_t i = 0; i < bytes * 8; i++) {
            if (!(want[i / 8] & (1u << (i % 8))))
                continue;
            memcpy(sum, want, bytes);
            sum[i / 8] &= (uint8_t)~(1u << (i % 8));
            assert_false(hpd_prefix_summary_test(sum, bytes, &keys[0]));
        }
    }
    /* an empty summary holds nothing; a summary of 0 bytes neither */
    memset(sum, 0, sizeof(sum));
    assert_false(hpd_prefix_summary_test(sum, sizeof(sum), &keys[0]));
    memset(sum, 0xff, sizeof(sum));
    assert_true(hpd_prefix_summary_test(sum, sizeof(sum), &keys[0]));
    assert_false(hpd_prefix_summary_test(sum, 0, &keys[0]));
    /* the expected hit: the deepest block in the summary, within prompt[:-1] */
    const hpd_block_hash_t chain[4] = {keys[0], keys[1], keys[2], keys[3]};
    memset(sum, 0, sizeof(sum));
    hpd_prefix_summary_add(sum, sizeof(sum), &keys[1]);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 300), 2);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 129), 2);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 128), 0);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 0), 0);
    hpd_prefix_summary_add(sum, sizeof(sum), &keys[0]);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 128), 1);
    hpd_prefix_summary_add(sum, sizeof(sum), &keys[3]);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 257), 4);
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), chain, 256), 2);
}

/* hpd_prefix_cache_summary: the keys of the entries that hold a state, on
 * the device or in the host tier; not the KV-only ones; the count it
 * returns. */
static void test_summary_contents(void **state)
{
    const spec_t p = {61, 0, 61, 300}, q = {62, 0, 62, 65};
    fixture_t f;
    hpd_block_hash_t hp[4], hq[1];
    int32_t tok[300];
    uint8_t sum[1000], want[1000];

    fixture_init(&f, 64, 32, 4, 1 << 20, 0, 3);
    tokens_of(p, tok);
    hpd_prefix_cache_hash(f.cache, tok, 4, hp);
    tokens_of(q, tok);
    hpd_prefix_cache_hash(f.cache, tok, 1, hq);
    memset(sum, 0xff, sizeof(sum));
    assert_int_equal(hpd_prefix_cache_summary(f.cache, sum, sizeof(sum)), 0);
    memset(want, 0, sizeof(want));
    assert_memory_equal(sum, want, sizeof(sum));

    cache_prompt(&f, p); /* 4 blocks, the state at 256 only */
    assert_int_equal(hpd_prefix_cache_summary(f.cache, sum, sizeof(sum)), 1);
    expect_bits(&hp[3], 1, sizeof(sum), want);
    assert_memory_equal(sum, want, sizeof(sum));
    assert_int_equal(hpd_prefix_summary_match(sum, sizeof(sum), hp, 300), 4);

    cache_prompt(&f, q);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 32), HPD_OK); /* all to the host */
    assert_int_equal(stats_of(&f).host_entries, 5);
    assert_int_equal(hpd_prefix_cache_summary(f.cache, sum, sizeof(sum)), 2);
    const hpd_block_hash_t keys[2] = {hp[3], hq[0]};
    expect_bits(keys, 2, sizeof(sum), want);
    assert_memory_equal(sum, want, sizeof(sum));
    fixture_fini(&f);

    /* a cache without GDN state: every entry can hit */
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *be;
    hpd_page_pool_t *pool;
    hpd_prefix_cache_t *cache;
    uint32_t pages[2][5];
    const uint32_t *tables[2] = {pages[0], pages[1]};
    assert_int_equal(hpd_backend_cpu_create(&bp, &be), HPD_OK);
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 64,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 2,
                                            .n_kv_heads = 1,
                                            .head_dim = HD},
                                 .n_pages = 10};
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    hpd_prefix_cache_params_t cp = {.backend = be, .pages = pool, .salt = {3}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_OK);
    assert_int_equal(hpd_page_pool_alloc(pool, 5, pages[0]), HPD_OK);
    assert_int_equal(hpd_page_pool_alloc(pool, 5, pages[1]), HPD_OK);
    tokens_of(p, tok);
    hpd_prefix_cache_hash(cache, tok, 4, hp);
    assert_int_equal(hpd_prefix_cache_insert(cache, hp, 4, tables, NULL), HPD_OK);
    assert_int_equal(hpd_prefix_cache_summary(cache, sum, sizeof(sum)), 4);
    expect_bits(hp, 4, sizeof(sum), want);
    assert_memory_equal(sum, want, sizeof(sum));
    hpd_prefix_match_t m;
    assert_int_equal(hpd_prefix_cache_lookup(cache, hp, 300, &m), HPD_OK);
    assert_int_equal(m.hit_blocks, 4);
    hpd_prefix_cache_release(cache, &m);
    hpd_prefix_cache_destroy(cache);
    for (uint32_t i = 0; i < 5; i++) {
        hpd_page_pool_unref(pool, pages[0][i]);
        hpd_page_pool_unref(pool, pages[1][i]);
    }
    hpd_page_pool_destroy(pool);
    hpd_backend_destroy(be);
}

/* Far more entries than the hash map starts with (1024 buckets): every one
 * is found again, and they all go leaf-first when their pages are needed. */
static void test_many_entries(void **state)
{
    enum { N = 3000 };
    fixture_t f;
    int32_t *tok = malloc((size_t)N * 64 * sizeof(int32_t));
    hpd_block_hash_t *h = malloc((N + 1) * sizeof(*h));
    uint32_t *table = malloc(N * sizeof(uint32_t)), page[2];
    const uint32_t *tables[2] = {table, table};
    hpd_prefix_match_t m;

    fixture_init(&f, 64, 4, 4, 0, 0, 3);
    for (size_t i = 0; i < (size_t)N * 64; i++)
        tok[i] = (int32_t)(i % 997);
    hpd_prefix_cache_hash(f.cache, tok, N, h);
    /* every block's KV on one page (both groups): the values do not matter */
    assert_int_equal(hpd_page_pool_alloc(f.pool, 1, page), HPD_OK);
    for (uint32_t i = 0; i < N; i++)
        table[i] = page[0];
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, N, tables, NULL), HPD_OK);
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, N / 2, tables, NULL), HPD_OK);
    hpd_page_pool_unref(f.pool, page[0]);
    assert_int_equal(hpd_page_pool_refcount(f.pool, page[0]), 2 * N);
    hpd_prefix_cache_stats_t st = stats_of(&f);
    assert_int_equal(st.inserted_blocks, N);
    assert_int_equal(st.device_entries, N);
    assert_int_equal(st.pages_held, 1);
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, N * 64 + 1, &m), HPD_OK);
    assert_int_equal(m.kv_blocks, N);
    assert_int_equal(m.hit_blocks, 0); /* no state anywhere */
    hpd_prefix_cache_release(f.cache, &m);
    /* a prompt diverging in its last block */
    tok[(N - 1) * 64] = 5000;
    hpd_prefix_cache_hash(f.cache, tok, N, h);
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, N * 64 + 1, &m), HPD_OK);
    assert_int_equal(m.kv_blocks, N - 1);
    hpd_prefix_cache_release(f.cache, &m);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 4), HPD_OK);
    st = stats_of(&f);
    assert_int_equal(st.device_entries, 0);
    assert_int_equal(st.evicted_dropped, N);
    /* the map still works after emptying: the blocks come back */
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(hpd_page_pool_alloc(f.pool, 1, &page[i]), HPD_OK);
    for (uint32_t i = 0; i < N; i++)
        table[i] = page[i % 2];
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, 100, tables, NULL), HPD_OK);
    assert_int_equal(stats_of(&f).device_entries, 100);
    assert_int_equal(stats_of(&f).pages_held, 2);
    assert_int_equal(hpd_prefix_cache_lookup(f.cache, h, 100 * 64, &m), HPD_OK);
    assert_int_equal(m.kv_blocks, 99);
    hpd_prefix_cache_release(f.cache, &m);
    hpd_page_pool_unref(f.pool, page[0]);
    hpd_page_pool_unref(f.pool, page[1]);
    fixture_fini(&f);
    free(tok);
    free(h);
    free(table);
}

/* A request's side of a hit done by hand: lookup and attach into fresh
 * tables (3 pages per group); the status of attach. */
typedef struct {
    uint32_t pages[2][8];
    uint32_t *tables[2];
    hpd_prefix_match_t m;
    float state[STATE / 4];
} hand_req_t;

static hpd_status_t hand_attach(fixture_t *f, spec_t s, hand_req_t *r)
{
    int32_t tok[MAXTOK];
    hpd_block_hash_t h[MAXTOK / 64 + 1];
    memset(r, 0, sizeof(*r));
    r->tables[0] = r->pages[0];
    r->tables[1] = r->pages[1];
    tokens_of(s, tok);
    hpd_prefix_cache_hash(f->cache, tok, s.len / 64, h);
    assert_int_equal(hpd_prefix_cache_lookup(f->cache, h, s.len, &r->m), HPD_OK);
    return hpd_prefix_cache_attach(f->cache, &r->m, r->tables, r->state);
}

/* What each page is referenced by, to compare before and after. */
static void snapshot_refs(fixture_t *f, uint32_t *refs)
{
    for (uint32_t i = 0; i < hpd_page_pool_n_pages(f->pool); i++)
        refs[i] = hpd_page_pool_refcount(f->pool, i);
}

/* The backend fails to copy an entry out to the host: the entry is dropped
 * as if the host tier had no room, together with its host-tier children;
 * a checkpoint that cannot move out is lost, its entry stays. */
static void test_host_copy_failure(void **state)
{
    const spec_t p = {71, 0, 71, 130}; /* blocks 0 and 1, the state at 128 */
    fixture_t f;
    hpd_prefix_cache_stats_t st;
    uint32_t hit, kv;

    for (int translate = 0; translate < 2; translate++) {
        fixture_init(&f, 64, 16, 4, 1 << 20, 0, 3);
        cache_prompt(&f, p);
        /* block 1 (the leaf) to the host tier */
        assert_int_equal(
            hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2), HPD_OK);
        assert_int_equal(stats_of(&f).host_entries, 1);
        if (translate)
            f.fb.fail_translate = true;
        else
            f.fb.fail_to_host = true;
        assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
        st = stats_of(&f);
        assert_int_equal(st.evicted_to_host, 1);
        assert_int_equal(st.evicted_dropped, 1);
        assert_int_equal(st.host_dropped, 1);
        assert_int_equal(st.device_entries + st.host_entries, 0);
        assert_int_equal(st.host_bytes, 0);
        assert_int_equal(st.host_checkpoint_bytes, 0);
        assert_int_equal(st.pages_held, 0);
        assert_int_equal(hpd_page_pool_n_free(f.pool), 16);
        probe(&f, p, &hit, &kv);
        assert_int_equal(kv, 0);
        fixture_fini(&f);
    }

    /* the same after two dropped entries freed their ids: the prompt's
     * blocks reuse them, the child before its parent in the entry table */
    fixture_init(&f, 64, 16, 4, 1 << 20, 0, 3);
    cache_prompt(&f, evict_a);
    cache_prompt(&f, evict_b);
    f.fb.fail_to_host = true;
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK); /* a, then b */
    f.fb.fail_to_host = false;
    assert_int_equal(stats_of(&f).evicted_dropped, 2);
    cache_prompt(&f, p);
    assert_int_equal(
        hpd_prefix_cache_make_room(f.cache, hpd_page_pool_n_free(f.pool) + 2), HPD_OK);
    assert_int_equal(stats_of(&f).host_entries, 1);
    f.fb.fail_to_host = true;
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    st = stats_of(&f);
    assert_int_equal(st.host_dropped, 1);
    assert_int_equal(st.evicted_dropped, 3);
    assert_int_equal(st.device_entries + st.host_entries, 0);
    assert_int_equal(st.host_bytes, 0);
    probe(&f, p, &hit, &kv);
    assert_int_equal(kv, 0);
    fixture_fini(&f);

    /* one checkpoint slot: B's checkpoint pushes A's out, which cannot be
     * copied to the host tier */
    fixture_init(&f, 64, 16, 1, 1 << 20, 0, 3);
    cache_prompt(&f, evict_a);
    f.fb.fail_to_host = true;
    cache_prompt(&f, evict_b);
    st = stats_of(&f);
    assert_int_equal(st.checkpoints_created, 2);
    assert_int_equal(st.device_checkpoints, 1);
    assert_int_equal(st.checkpoint_bytes, STATE);
    assert_int_equal(st.host_checkpoint_bytes, 0);
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(st.device_entries, 2);
    probe(&f, evict_a, &hit, &kv);
    assert_int_equal(hit, 0);
    assert_int_equal(kv, 1);
    assert_int_equal(hit_of(&f, evict_b), 1);
    fixture_fini(&f);
}

/* The backend fails a copy that attach needs (a block from the host tier, a
 * checkpoint from the host tier, a page straddling the hit's end): attach
 * says so and the request holds nothing; the cache is as it was, and the
 * same hit attaches once the backend works again. */
static void test_attach_copy_failure(void **state)
{
    const spec_t p = {81, 0, 81, 130}, p_longer = {81, 0, 81, 140};
    fixture_t f;
    hand_req_t r;
    uint32_t before[32], after[32];
    int32_t tok[MAXTOK];

    /* the hit's blocks in the host tier */
    fixture_init(&f, 64, 16, 4, 1 << 20, 0, 3);
    cache_prompt(&f, p);
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    f.fb.fail_from_host = true;
    snapshot_refs(&f, before);
    assert_int_equal(hand_attach(&f, p_longer, &r), HPD_ERR_INTERNAL);
    assert_int_equal(r.m.hit_blocks, 2);
    assert_int_equal(r.m.host_blocks, 2);
    snapshot_refs(&f, after);
    assert_memory_equal(after, before, 16 * sizeof(uint32_t));
    assert_int_equal(stats_of(&f).host_entries, 2);
    assert_int_equal(stats_of(&f).promotions, 0);
    hpd_prefix_cache_release(f.cache, &r.m);
    f.fb.fail_from_host = false;
    cache_prompt(&f, p_longer); /* contents checked inside */
    assert_int_equal(stats_of(&f).promotions, 2);
    fixture_fini(&f);

    /* KV on the device, the checkpoint in the host tier (one slot, taken
     * by the next prompt's) */
    fixture_init(&f, 64, 16, 1, 1 << 20, 0, 3);
    cache_prompt(&f, evict_a);
    cache_prompt(&f, evict_b);
    assert_int_equal(stats_of(&f).host_checkpoint_bytes, STATE);
    f.fb.fail_from_host = true;
    snapshot_refs(&f, before);
    assert_int_equal(hand_attach(&f, (spec_t){11, 0, 11, 100}, &r), HPD_ERR_INTERNAL);
    assert_int_equal(r.m.hit_blocks, 1);
    assert_int_equal(r.m.host_blocks, 0);
    snapshot_refs(&f, after);
    assert_memory_equal(after, before, 16 * sizeof(uint32_t));
    hpd_prefix_cache_release(f.cache, &r.m);
    f.fb.fail_from_host = false;
    assert_int_equal(hand_attach(&f, (spec_t){11, 0, 11, 100}, &r), HPD_OK);
    tokens_of(evict_a, tok);
    for (uint32_t i = 0; i < STATE / 4; i++)
        assert_true(r.state[i] == (float)tok[63] + 64.0f + (float)i);
    hpd_page_pool_unref(f.pool, r.pages[0][0]);
    hpd_page_pool_unref(f.pool, r.pages[1][0]);
    hpd_prefix_cache_release(f.cache, &r.m);
    fixture_fini(&f);

    /* B = 48: the page over tokens 48..95 straddles the hit's end (64) and
     * is a private copy */
    fixture_init(&f, 48, 16, 4, 0, 0, 3);
    cache_prompt(&f, evict_a);
    f.fb.fail_translate = true;
    snapshot_refs(&f, before);
    assert_int_equal(hand_attach(&f, (spec_t){11, 0, 11, 100}, &r), HPD_ERR_INTERNAL);
    snapshot_refs(&f, after);
    assert_memory_equal(after, before, 16 * sizeof(uint32_t));
    hpd_prefix_cache_release(f.cache, &r.m);
    f.fb.fail_translate = false;
    cache_prompt(&f, (spec_t){11, 0, 11, 100});
    fixture_fini(&f);
}

/* The checkpoint slot pool cannot zero a slot (a failing backend memset):
 * insert keeps the block without a state and says why; a hit over a
 * host-tier checkpoint leaves it there and still restores it. */
static void test_checkpoint_slot_failure(void **state)
{
    const spec_t a_longer = {11, 0, 11, 100};
    fixture_t f;
    hand_req_t r;
    hpd_prefix_cache_stats_t st;
    hpd_block_hash_t h[1];
    int32_t tok[MAXTOK];
    uint32_t hit, kv;
    float saved[STATE / 4];

    fixture_init(&f, 64, 16, 2, 1 << 20, 0, 3);
    tokens_of(evict_a, tok);
    hpd_prefix_cache_hash(f.cache, tok, 1, h);
    for (uint32_t i = 0; i < STATE / 4; i++)
        saved[i] = (float)tok[63] + 64.0f + (float)i;
    assert_int_equal(hpd_page_pool_alloc(f.pool, 1, r.pages[0]), HPD_OK);
    assert_int_equal(hpd_page_pool_alloc(f.pool, 1, r.pages[1]), HPD_OK);
    const uint32_t *tables[2] = {r.pages[0], r.pages[1]};
    for (uint32_t p = 0; p < 64; p++)
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t kvi = 0; kvi < 2; kvi++)
                for (uint32_t d = 0; d < HD; d++)
                    row(&f, (uint32_t *const *)tables, l, kvi, p)[d] =
                        row_value(tok, p, l, kvi, d);
    f.fb.fail_memset = true;
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, 1, tables, saved), HPD_ERR_INTERNAL);
    st = stats_of(&f);
    assert_int_equal(st.device_entries, 1);
    assert_int_equal(st.device_checkpoints, 0);
    assert_int_equal(st.checkpoints_created, 0);
    assert_int_equal(st.checkpoint_bytes, 0);
    probe(&f, a_longer, &hit, &kv);
    assert_int_equal(hit, 0);
    assert_int_equal(kv, 1);
    f.fb.fail_memset = false;
    /* the state cannot be copied into the slot: the same answer */
    f.fb.fail_slot_copy = true;
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, 1, tables, saved), HPD_ERR_INTERNAL);
    st = stats_of(&f);
    assert_int_equal(st.device_checkpoints, 0);
    assert_int_equal(st.checkpoints_created, 0);
    assert_int_equal(st.checkpoint_bytes, 0);
    assert_int_equal(hit_of(&f, a_longer), 0);
    f.fb.fail_slot_copy = false;
    assert_int_equal(hpd_prefix_cache_insert(f.cache, h, 1, tables, saved), HPD_OK);
    hpd_page_pool_unref(f.pool, r.pages[0][0]);
    hpd_page_pool_unref(f.pool, r.pages[1][0]);
    assert_int_equal(stats_of(&f).checkpoints_created, 1);
    assert_int_equal(hit_of(&f, a_longer), 1);

    /* to the host tier, then promoted while no slot can be zeroed */
    assert_int_equal(hpd_prefix_cache_make_room(f.cache, 16), HPD_OK);
    assert_int_equal(stats_of(&f).host_checkpoint_bytes, STATE);
    f.fb.fail_memset = true;
    assert_int_equal(hand_attach(&f, a_longer, &r), HPD_OK);
    for (uint32_t i = 0; i < STATE / 4; i++)
        assert_true(r.state[i] == saved[i]);
    st = stats_of(&f);
    assert_int_equal(st.promotions, 1);
    assert_int_equal(st.device_entries, 1);
    assert_int_equal(st.device_checkpoints, 0);
    assert_int_equal(st.host_checkpoint_bytes, STATE);
    assert_int_equal(st.host_bytes, STATE);
    hpd_page_pool_unref(f.pool, r.pages[0][0]);
    hpd_page_pool_unref(f.pool, r.pages[1][0]);
    hpd_prefix_cache_release(f.cache, &r.m);
    f.fb.fail_memset = false;
    cache_prompt(&f, a_longer); /* the state, from the host tier: checked inside */
    fixture_fini(&f);
}

/* create's answers: more pack groups than a cache supports, and a backend
 * that cannot allocate the staging pages or zero the checkpoint slots; each
 * leaves nothing allocated. A cache over no page pool holds no pages. */
static void test_create_failures(void **state)
{
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *cpu;
    faulty_backend_t fb;
    hpd_page_pool_t *pool;
    hpd_prefix_cache_t *cache = NULL;

    assert_int_equal(hpd_backend_cpu_create(&bp, &cpu), HPD_OK);
    hpd_backend_t *be = faulty_backend_init(&fb, cpu);
    hpd_page_pool_params_t pp = {.backend = be,
                                 .layout = {.block_size = 16,
                                            .pack_size = 1,
                                            .order = HPD_KV_NHD,
                                            .dtype = HPD_DTYPE_F32,
                                            .n_layers = 257,
                                            .n_kv_heads = 1,
                                            .head_dim = 4},
                                 .n_pages = 1};
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    hpd_prefix_cache_params_t cp = {
        .backend = be, .pages = pool, .state_bytes = STATE, .n_checkpoints = 4, .salt = {3}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_ERR_UNSUPPORTED);
    assert_null(cache);
    hpd_page_pool_destroy(pool);
    pp.layout.pack_size = 2; /* 129 groups */
    assert_int_equal(hpd_page_pool_create(&pp, &pool), HPD_OK);
    cp.pages = pool;
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_OK);
    hpd_prefix_cache_destroy(cache);
    cache = NULL;
    assert_int_equal(fb.n_live, 1);

    fb.fail_alloc = true;
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_ERR_INTERNAL);
    assert_null(cache);
    cp.n_checkpoints = 0; /* the staging pages alone */
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_ERR_INTERNAL);
    assert_null(cache);
    cp.n_checkpoints = 4;
    fb.fail_alloc = false;
    fb.fail_memset = true;
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_ERR_INTERNAL);
    assert_null(cache);
    assert_int_equal(fb.n_live, 1);
    fb.fail_memset = false;
    hpd_prefix_cache_destroy(NULL);

    /* a state but no checkpoint slot, or slots but no state: both fine */
    cp = (hpd_prefix_cache_params_t){
        .backend = be, .pages = pool, .state_bytes = STATE, .salt = {3}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_OK);
    hpd_prefix_cache_destroy(cache);
    cp = (hpd_prefix_cache_params_t){.backend = be, .pages = pool, .n_checkpoints = 4, .salt = {3}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_OK);
    hpd_prefix_cache_destroy(cache);
    cache = NULL;

    /* no page pool, no state */
    cp = (hpd_prefix_cache_params_t){.backend = be, .salt = {3}};
    assert_int_equal(hpd_prefix_cache_create(&cp, &cache), HPD_OK);
    assert_int_equal(hpd_prefix_cache_make_room(cache, 0), HPD_OK);
    assert_int_equal(hpd_prefix_cache_make_room(cache, 1), HPD_ERR_NO_RESOURCE);
    hpd_prefix_cache_stats_t st;
    hpd_prefix_cache_stats(cache, &st);
    assert_int_equal(st.pages_held, 0);
    hpd_prefix_cache_destroy(cache);
    assert_int_equal(fb.n_live, 1);
    hpd_page_pool_destroy(pool);
    assert_int_equal(fb.n_live, 0);
    hpd_backend_destroy(cpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_rules),
        cmocka_unit_test(test_no_pages),
        cmocka_unit_test(test_salt_separates_models),
        cmocka_unit_test(test_host_tier),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_eviction_order_device),
        cmocka_unit_test(test_eviction_order_host),
        cmocka_unit_test(test_eviction_order_checkpoints),
        cmocka_unit_test(test_stats_counters),
        cmocka_unit_test(test_stats_shared_pages),
        cmocka_unit_test(test_host_tier_bound),
        cmocka_unit_test(test_host_drop_under_device_parent),
        cmocka_unit_test(test_hash_every_bit),
        cmocka_unit_test(test_host_drops_leaves_first),
        cmocka_unit_test(test_promoted_checkpoint_keeps_its_slot),
        cmocka_unit_test(test_evict_many_lru),
        cmocka_unit_test(test_locks),
        cmocka_unit_test(test_destroy_releases),
        cmocka_unit_test(test_promotion_round_trips),
        cmocka_unit_test(test_checkpoint_plan),
        cmocka_unit_test(test_summary_format),
        cmocka_unit_test(test_summary_contents),
        cmocka_unit_test(test_many_entries),
        cmocka_unit_test(test_host_copy_failure),
        cmocka_unit_test(test_attach_copy_failure),
        cmocka_unit_test(test_checkpoint_slot_failure),
        cmocka_unit_test(test_create_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
