#include "cache/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "prefix_cache"
#define NONE UINT32_MAX
#define B64 HPD_PREFIX_BLOCK
#define MAX_GROUPS 256

enum { TIER_DEVICE = 0, TIER_HOST = 1 };

typedef struct {
    hpd_block_hash_t key;
    uint32_t parent;
    uint32_t depth; /* block index in the token stream */
    uint32_t n_children, n_dev_children;
    uint32_t lock;
    uint64_t lru;
    uint8_t used, tier;
    uint32_t *pages; /* device tier: [n_groups][npp] pages intersecting the block */
    void *host_kv;   /* host tier: the block's 64 tokens, one staging-layout page per group */
    uint32_t ckpt;   /* device checkpoint slot; 0: none */
    void *host_ckpt;
    uint32_t hnext; /* hash chain */
} entry_t;

struct hpd_prefix_cache {
    hpd_prefix_cache_params_t p;
    hpd_kv_layout_t layout;  /* the pool's */
    hpd_kv_layout_t staging; /* B = 64, the pool's P and order: one page per block */
    uint32_t n_groups;
    void *staging_pool; /* n_groups staging pages, backend memory */
    uint32_t staging_ids[MAX_GROUPS];
    uint32_t staged; /* entry whose host KV is in staging, or NONE */
    hpd_slot_pool_t *ckpts;
    entry_t *e;
    uint32_t n_entries, free_head;
    size_t cap_entries;
    uint32_t *buckets;
    uint32_t n_buckets, n_used;
    uint64_t clock;
    hpd_block_hash_t root;
    hpd_prefix_cache_stats_t st;
};

/* ------------------------------------------------------------ geometry */

/* A model without full-attention layers has no pages (no groups, and a
 * layout of block size 0): its entries hold GDN checkpoints only. */
static uint32_t first_page(const hpd_prefix_cache_t *c, uint32_t depth)
{
    return c->n_groups > 0 ? depth * B64 / c->layout.block_size : 0;
}

static uint32_t pages_per_group(const hpd_prefix_cache_t *c, uint32_t depth)
{
    return c->n_groups > 0
               ? (depth * B64 + B64 - 1) / c->layout.block_size - first_page(c, depth) + 1
               : 0;
}

static uint64_t host_kv_bytes(const hpd_prefix_cache_t *c)
{
    return (uint64_t)c->n_groups * hpd_kv_layout_page_bytes(&c->staging);
}

static bool has_state(const hpd_prefix_cache_t *c, const entry_t *e)
{
    return c->p.state_bytes == 0 || e->ckpt != 0 || e->host_ckpt != NULL;
}

/* Per-group table pointers over an entry's page list; positions in these
 * tables start at the entry's first page. */
static void entry_tables(const hpd_prefix_cache_t *c, const entry_t *e, const uint32_t **t)
{
    const uint32_t npp = pages_per_group(c, e->depth);
    for (uint32_t g = 0; g < c->n_groups; g++)
        t[g] = e->pages + (size_t)g * npp;
}

/* ------------------------------------------------------------ hash map */

static uint32_t bucket_of(const hpd_prefix_cache_t *c, const hpd_block_hash_t *k)
{
    uint64_t x;
    memcpy(&x, k->bytes, 8);
    return (uint32_t)(x & (c->n_buckets - 1));
}

static uint32_t find(const hpd_prefix_cache_t *c, const hpd_block_hash_t *k)
{
    for (uint32_t i = c->buckets[bucket_of(c, k)]; i != NONE; i = c->e[i].hnext)
        if (memcmp(c->e[i].key.bytes, k->bytes, 16) == 0)
            return i;
    return NONE;
}

static hpd_status_t rehash(hpd_prefix_cache_t *c, uint32_t n_buckets)
{
    uint32_t *b = malloc(n_buckets * sizeof(*b));
    if (b == NULL)
        return HPD_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < n_buckets; i++)
        b[i] = NONE;
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = n_buckets;
    for (uint32_t i = 0; i < c->n_entries; i++) {
        if (!c->e[i].used)
            continue;
        uint32_t h = bucket_of(c, &c->e[i].key);
        c->e[i].hnext = b[h];
        b[h] = i;
    }
    return HPD_OK;
}

static void unlink_hash(hpd_prefix_cache_t *c, uint32_t idx)
{
    uint32_t *pp = &c->buckets[bucket_of(c, &c->e[idx].key)];
    while (*pp != idx)
        pp = &c->e[*pp].hnext;
    *pp = c->e[idx].hnext;
}

/* ------------------------------------------------------------ entries */

static hpd_status_t new_entry(hpd_prefix_cache_t *c, const hpd_block_hash_t *key, uint32_t parent,
                              uint32_t depth, uint32_t *idx_p)
{
    uint32_t idx;
    hpd_status_t st;

    if (c->n_used + 1 > c->n_buckets && (st = rehash(c, 2 * c->n_buckets)) != HPD_OK)
        return st;
    if (c->free_head != NONE) {
        idx = c->free_head;
        c->free_head = c->e[idx].hnext;
    } else {
        if (hpd_grow(&c->e, &c->cap_entries, (size_t)c->n_entries + 1, sizeof(*c->e)) != HPD_OK)
            return HPD_ERR_NO_MEMORY;
        idx = c->n_entries++;
    }
    entry_t *e = &c->e[idx];
    memset(e, 0, sizeof(*e));
    e->key = *key;
    e->parent = parent;
    e->depth = depth;
    e->used = 1;
    e->tier = TIER_DEVICE;
    uint32_t h = bucket_of(c, key);
    e->hnext = c->buckets[h];
    c->buckets[h] = idx;
    c->n_used++;
    if (parent != NONE) {
        c->e[parent].n_children++;
        c->e[parent].n_dev_children++;
    }
    *idx_p = idx;
    return HPD_OK;
}

static void release_pages(hpd_prefix_cache_t *c, entry_t *e)
{
    if (e->pages == NULL)
        return;
    const uint32_t n = c->n_groups * pages_per_group(c, e->depth);
    for (uint32_t i = 0; i < n; i++)
        hpd_page_pool_unref(c->p.pages, e->pages[i]);
    free(e->pages);
    e->pages = NULL;
}

static void release_ckpt(hpd_prefix_cache_t *c, entry_t *e)
{
    if (e->ckpt != 0) {
        hpd_slot_pool_unref(c->ckpts, e->ckpt);
        e->ckpt = 0;
        c->st.checkpoint_bytes -= c->p.state_bytes;
    }
    if (e->host_ckpt != NULL) {
        free(e->host_ckpt);
        e->host_ckpt = NULL;
        c->st.host_checkpoint_bytes -= c->p.state_bytes;
        c->st.host_bytes -= c->p.state_bytes;
    }
}

/* Removes a leaf entry and everything it holds. */
static void drop_entry(hpd_prefix_cache_t *c, uint32_t idx)
{
    entry_t *e = &c->e[idx];

    HPD_ASSERT(e->n_children == 0 && e->lock == 0);
    release_pages(c, e);
    release_ckpt(c, e);
    if (e->host_kv != NULL) {
        free(e->host_kv);
        c->st.host_bytes -= host_kv_bytes(c);
    }
    if (e->parent != NONE) {
        c->e[e->parent].n_children--;
        if (e->tier == TIER_DEVICE)
            c->e[e->parent].n_dev_children--;
    }
    unlink_hash(c, idx);
    e->used = 0;
    e->hnext = c->free_head;
    c->free_head = idx;
    c->n_used--;
}

/* Drops an entry together with its descendants (all in the host tier). */
static void drop_subtree(hpd_prefix_cache_t *c, uint32_t idx)
{
    for (uint32_t i = 0; i < c->n_entries && c->e[idx].n_children > 0; i++)
        if (c->e[i].used && c->e[i].parent == idx)
            drop_subtree(c, i);
    if (c->e[idx].tier == TIER_HOST)
        c->st.host_dropped++;
    else
        c->st.evicted_dropped++;
    drop_entry(c, idx);
}

/* Frees host bytes by dropping LRU unlocked host leaves; false if it cannot. */
static bool host_room(hpd_prefix_cache_t *c, uint64_t bytes, uint32_t keep)
{
    while (c->st.host_bytes + bytes > c->p.host_bytes) {
        uint32_t best = NONE;
        for (uint32_t i = 0; i < c->n_entries; i++) {
            const entry_t *e = &c->e[i];
            if (e->used && e->tier == TIER_HOST && e->lock == 0 && e->n_children == 0 &&
                i != keep && (best == NONE || e->lru < c->e[best].lru))
                best = i;
        }
        if (best == NONE)
            return false;
        c->st.host_dropped++;
        drop_entry(c, best);
    }
    return true;
}

/* Moves a device checkpoint to the host tier, leaving room there for
 * `reserve` more bytes (the entry's KV when it moves too). */
static hpd_status_t ckpt_to_host(hpd_prefix_cache_t *c, uint32_t idx, uint64_t reserve)
{
    entry_t *e = &c->e[idx];
    void *buf;
    hpd_status_t st;

    if (c->p.host_bytes == 0 || !host_room(c, c->p.state_bytes + reserve, idx))
        return HPD_ERR_NO_RESOURCE;
    if ((buf = malloc(c->p.state_bytes)) == NULL)
        return HPD_ERR_NO_MEMORY;
    st = hpd_backend_to_host(c->p.backend, buf, hpd_slot_pool_ptr(c->ckpts, e->ckpt),
                             c->p.state_bytes);
    if (st != HPD_OK) {
        free(buf);
        return st;
    }
    hpd_slot_pool_unref(c->ckpts, e->ckpt);
    e->ckpt = 0;
    e->host_ckpt = buf;
    c->st.checkpoint_bytes -= c->p.state_bytes;
    c->st.host_checkpoint_bytes += c->p.state_bytes;
    c->st.host_bytes += c->p.state_bytes;
    return HPD_OK;
}

/* Moves an entry's KV (and checkpoint) to the host tier: the block's tokens
 * are translated into the staging layout, then copied to host memory. */
static hpd_status_t entry_to_host(hpd_prefix_cache_t *c, uint32_t idx)
{
    entry_t *e = &c->e[idx];
    const uint64_t kv = host_kv_bytes(c);
    const uint32_t *src[MAX_GROUPS], *dst[MAX_GROUPS];
    void *buf;
    hpd_status_t st;

    if (c->p.host_bytes == 0 || !host_room(c, kv, idx))
        return HPD_ERR_NO_RESOURCE;
    if (e->ckpt != 0 && (st = ckpt_to_host(c, idx, kv)) != HPD_OK)
        release_ckpt(c, e); /* no room for the state: keep the KV, lose the checkpoint */
    if ((buf = malloc(kv ? kv : 1)) == NULL)
        return HPD_ERR_NO_MEMORY;
    if (c->n_groups > 0) {
        entry_tables(c, e, src);
        for (uint32_t g = 0; g < c->n_groups; g++)
            dst[g] = &c->staging_ids[g];
        hpd_kv_translate_args_t t = {
            .src = {.layout = &c->layout,
                    .pool = hpd_page_pool_base(c->p.pages),
                    .tables = src,
                    .pos = e->depth * B64 - first_page(c, e->depth) * c->layout.block_size},
            .dst = {.layout = &c->staging, .pool = c->staging_pool, .tables = dst},
            .n_tokens = B64};
        if ((st = hpd_kv_translate(c->p.backend, &t)) != HPD_OK ||
            (st = hpd_backend_to_host(c->p.backend, buf, c->staging_pool, kv)) != HPD_OK) {
            free(buf);
            return st;
        }
        c->staged = NONE;
    }
    release_pages(c, e);
    e->host_kv = buf;
    e->tier = TIER_HOST;
    c->st.host_bytes += kv;
    if (e->parent != NONE)
        c->e[e->parent].n_dev_children--;
    c->st.evicted_to_host++;
    return HPD_OK;
}

/* Evicts one unlocked device entry with no device children, LRU first. */
static bool evict_one(hpd_prefix_cache_t *c)
{
    uint32_t best = NONE;

    for (uint32_t i = 0; i < c->n_entries; i++) {
        const entry_t *e = &c->e[i];
        if (e->used && e->tier == TIER_DEVICE && e->lock == 0 && e->n_dev_children == 0 &&
            (best == NONE || e->lru < c->e[best].lru))
            best = i;
    }
    if (best == NONE)
        return false;
    if (entry_to_host(c, best) != HPD_OK)
        drop_subtree(c, best);
    return true;
}

hpd_status_t hpd_prefix_cache_make_room(hpd_prefix_cache_t *c, uint32_t pages)
{
    if (c->p.pages == NULL)
        return pages == 0 ? HPD_OK : HPD_ERR_NO_RESOURCE;
    while (hpd_page_pool_n_free(c->p.pages) < pages)
        if (!evict_one(c))
            return HPD_ERR_NO_RESOURCE;
    return HPD_OK;
}

/* A device checkpoint slot, evicting the LRU unlocked checkpoint (to the
 * host tier if it has room) when all are taken. */
static hpd_status_t ckpt_alloc(hpd_prefix_cache_t *c, uint32_t *slot_p)
{
    hpd_status_t st;

    if (c->ckpts == NULL)
        return HPD_ERR_NO_RESOURCE;
    /* eviction answers a full pool only; a backend error is passed up */
    while ((st = hpd_slot_pool_alloc(c->ckpts, slot_p)) == HPD_ERR_NO_RESOURCE) {
        uint32_t best = NONE;
        for (uint32_t i = 0; i < c->n_entries; i++) {
            const entry_t *e = &c->e[i];
            if (e->used && e->ckpt != 0 && e->lock == 0 &&
                (best == NONE || e->lru < c->e[best].lru))
                best = i;
        }
        if (best == NONE)
            return HPD_ERR_NO_RESOURCE;
        if (ckpt_to_host(c, best, 0) != HPD_OK)
            release_ckpt(c, &c->e[best]);
    }
    return st;
}

/* ------------------------------------------------------------ public */

hpd_status_t hpd_prefix_cache_create(const hpd_prefix_cache_params_t *params,
                                     hpd_prefix_cache_t **cache_p)
{
    hpd_prefix_cache_t *c = calloc(1, sizeof(*c));
    hpd_status_t st;

    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    c->p = *params;
    c->staged = NONE;
    c->free_head = NONE;
    if (params->pages != NULL) {
        c->layout = *hpd_page_pool_layout(params->pages);
        c->staging = c->layout;
        c->staging.block_size = B64;
        c->n_groups = hpd_kv_layout_n_groups(&c->layout);
        if (c->n_groups > MAX_GROUPS) {
            st = HPD_ERR_UNSUPPORTED;
            goto err;
        }
        st = hpd_backend_alloc(params->backend, host_kv_bytes(c), &c->staging_pool);
        if (st != HPD_OK)
            goto err;
        for (uint32_t g = 0; g < c->n_groups; g++)
            c->staging_ids[g] = g;
    }
    if (params->state_bytes > 0 && params->n_checkpoints > 0) {
        hpd_slot_pool_params_t sp = {.backend = params->backend,
                                     .n_slots = params->n_checkpoints,
                                     .slot_bytes = params->state_bytes};
        if ((st = hpd_slot_pool_create(&sp, &c->ckpts)) != HPD_OK)
            goto err;
    }
    if ((st = rehash(c, 1024)) != HPD_OK)
        goto err;
    hpd_prefix_hash_root(params->salt, &c->root);
    *cache_p = c;
    return HPD_OK;
err:
    hpd_prefix_cache_destroy(c);
    return st;
}

void hpd_prefix_cache_destroy(hpd_prefix_cache_t *c)
{
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < c->n_entries; i++) {
        entry_t *e = &c->e[i];
        if (!e->used)
            continue;
        release_pages(c, e);
        if (e->ckpt != 0)
            hpd_slot_pool_unref(c->ckpts, e->ckpt);
        free(e->host_ckpt);
        free(e->host_kv);
    }
    free(c->e);
    free(c->buckets);
    if (c->staging_pool != NULL)
        hpd_backend_free(c->p.backend, c->staging_pool);
    hpd_slot_pool_destroy(c->ckpts);
    free(c);
}

void hpd_prefix_cache_hash(const hpd_prefix_cache_t *c, const int32_t *tokens,
                           uint32_t n_blocks, hpd_block_hash_t *hashes)
{
    hpd_prefix_hash_chain(&c->root, tokens, n_blocks, hashes);
}

uint32_t hpd_prefix_cache_summary(const hpd_prefix_cache_t *c, uint8_t *summary, size_t bytes)
{
    uint32_t n = 0;
    memset(summary, 0, bytes);
    for (uint32_t i = 0; i < c->n_entries; i++) {
        const entry_t *e = &c->e[i];
        if (!e->used || !has_state(c, e))
            continue;
        hpd_prefix_summary_add(summary, bytes, &e->key);
        n++;
    }
    return n;
}

hpd_status_t hpd_prefix_cache_lookup(hpd_prefix_cache_t *c, const hpd_block_hash_t *hashes,
                                     uint32_t n_tokens, hpd_prefix_match_t *m)
{
    const uint32_t nb = n_tokens > 0 ? (n_tokens - 1) / B64 : 0;

    memset(m, 0, sizeof(*m));
    c->st.lookups++;
    c->st.lookup_tokens += n_tokens;
    if (nb == 0)
        return HPD_OK;
    if ((m->path = malloc(nb * sizeof(uint32_t))) == NULL)
        return HPD_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < nb; i++) {
        const uint32_t idx = find(c, &hashes[i]);
        if (idx == NONE)
            break;
        m->path[i] = idx;
        m->kv_blocks = i + 1;
        if (has_state(c, &c->e[idx]))
            m->hit_blocks = i + 1;
    }
    c->clock++;
    for (uint32_t i = 0; i < m->hit_blocks; i++) {
        entry_t *e = &c->e[m->path[i]];
        e->lock++;
        e->lru = c->clock;
        m->host_blocks += e->tier == TIER_HOST;
    }
    c->st.hit_tokens_device += (uint64_t)(m->hit_blocks - m->host_blocks) * B64;
    c->st.hit_tokens_host += (uint64_t)m->host_blocks * B64;
    return HPD_OK;
}

void hpd_prefix_cache_release(hpd_prefix_cache_t *c, hpd_prefix_match_t *m)
{
    for (uint32_t i = 0; i < m->hit_blocks; i++) {
        HPD_ASSERT(c->e[m->path[i]].lock > 0);
        c->e[m->path[i]].lock--;
    }
    free(m->path);
    memset(m, 0, sizeof(*m));
}

/* Copies the tokens [t0, t1) of hit entry idx into the request's pages. */
static hpd_status_t fill_from_entry(hpd_prefix_cache_t *c, uint32_t idx, uint32_t t0, uint32_t t1,
                                    uint32_t *const *tables)
{
    entry_t *e = &c->e[idx];
    const uint32_t *src[MAX_GROUPS];
    hpd_kv_translate_args_t t = {.dst = {.layout = &c->layout,
                                         .pool = hpd_page_pool_base(c->p.pages),
                                         .tables = (const uint32_t *const *)tables,
                                         .pos = t0},
                                 .n_tokens = t1 - t0};
    hpd_status_t st;

    if (e->tier == TIER_DEVICE) {
        entry_tables(c, e, src);
        t.src = (hpd_kv_span_t){.layout = &c->layout,
                                .pool = hpd_page_pool_base(c->p.pages),
                                .tables = src,
                                .pos = t0 - first_page(c, e->depth) * c->layout.block_size};
    } else {
        if (c->staged != idx) {
            st = hpd_backend_from_host(c->p.backend, c->staging_pool, e->host_kv,
                                       host_kv_bytes(c));
            if (st != HPD_OK)
                return st;
            c->staged = idx;
        }
        for (uint32_t g = 0; g < c->n_groups; g++)
            src[g] = &c->staging_ids[g];
        t.src = (hpd_kv_span_t){.layout = &c->staging,
                                .pool = c->staging_pool,
                                .tables = src,
                                .pos = t0 - e->depth * B64};
    }
    return hpd_kv_translate(c->p.backend, &t);
}

/* Makes an entry reference the request's pages over its tokens; an entry in
 * the host tier is thereby promoted back to the device (its host KV goes;
 * its checkpoint stays where it is). */
static hpd_status_t adopt_pages(hpd_prefix_cache_t *c, uint32_t idx,
                                const uint32_t *const *tables)
{
    entry_t *e = &c->e[idx];
    const uint32_t npp = pages_per_group(c, e->depth), f = first_page(c, e->depth);
    uint32_t *pages = malloc((size_t)(c->n_groups * npp + 1) * sizeof(uint32_t));

    if (pages == NULL)
        return HPD_ERR_NO_MEMORY;
    for (uint32_t g = 0; g < c->n_groups; g++)
        for (uint32_t j = 0; j < npp; j++) {
            pages[g * npp + j] = tables[g][f + j];
            hpd_page_pool_ref(c->p.pages, tables[g][f + j]);
        }
    e->pages = pages;
    if (e->tier == TIER_HOST) {
        free(e->host_kv);
        e->host_kv = NULL;
        if (c->staged == idx)
            c->staged = NONE;
        c->st.host_bytes -= host_kv_bytes(c);
        e->tier = TIER_DEVICE;
        if (e->parent != NONE)
            c->e[e->parent].n_dev_children++;
        c->st.promotions++;
    }
    return HPD_OK;
}

/* Host-tier entries of a hit move back onto the request's pages. */
static void promote_path(hpd_prefix_cache_t *c, const hpd_prefix_match_t *m,
                         const uint32_t *const *tables)
{
    for (uint32_t i = 0; i < m->hit_blocks; i++) {
        entry_t *e = &c->e[m->path[i]];

        if (e->tier != TIER_HOST)
            continue;
        if (adopt_pages(c, m->path[i], tables) != HPD_OK)
            continue; /* stays in the host tier */
        e = &c->e[m->path[i]];
        /* its checkpoint comes back too when a device slot can be had */
        uint32_t slot;
        if (e->host_ckpt != NULL && ckpt_alloc(c, &slot) == HPD_OK) {
            if (hpd_backend_from_host(c->p.backend, hpd_slot_pool_ptr(c->ckpts, slot),
                                      e->host_ckpt, c->p.state_bytes) == HPD_OK) {
                free(e->host_ckpt);
                e->host_ckpt = NULL;
                e->ckpt = slot;
                c->st.host_checkpoint_bytes -= c->p.state_bytes;
                c->st.host_bytes -= c->p.state_bytes;
                c->st.checkpoint_bytes += c->p.state_bytes;
            } else {
                hpd_slot_pool_unref(c->ckpts, slot);
            }
        }
    }
}

hpd_status_t hpd_prefix_cache_attach(hpd_prefix_cache_t *c, const hpd_prefix_match_t *m,
                                     uint32_t *const *tables, void *state)
{
    const uint32_t L = m->hit_blocks * B64, B = c->layout.block_size;
    const uint32_t n_pages = c->n_groups > 0 ? HPD_DIV_UP(L, B) : 0;
    uint32_t fresh = 0, placed = 0;
    hpd_status_t st = HPD_OK;

    if (m->hit_blocks == 0)
        return HPD_OK;
    /* page j can be shared when the hit covers it whole and every entry
     * over it is on the device; else the request gets a private copy */
    bool *share = malloc((n_pages + 1) * sizeof(bool));
    if (share == NULL)
        return HPD_ERR_NO_MEMORY;
    for (uint32_t j = 0; j < n_pages; j++) {
        const uint32_t t0 = j * B, t1 = HPD_MIN((j + 1) * B, L);
        share[j] = (j + 1) * B <= L;
        for (uint32_t b = t0 / B64; b <= (t1 - 1) / B64 && share[j]; b++)
            share[j] = c->e[m->path[b]].tier == TIER_DEVICE;
        fresh += !share[j];
    }
    if ((st = hpd_prefix_cache_make_room(c, fresh * c->n_groups)) != HPD_OK)
        goto out;
    for (uint32_t j = 0; j < n_pages; j++, placed++) {
        const uint32_t t0 = j * B, t1 = HPD_MIN((j + 1) * B, L);
        if (share[j]) {
            /* the deepest entry over the page wrote (or copied) all of it */
            const entry_t *e = &c->e[m->path[(t1 - 1) / B64]];
            const uint32_t npp = pages_per_group(c, e->depth), f = first_page(c, e->depth);
            for (uint32_t g = 0; g < c->n_groups; g++) {
                tables[g][j] = e->pages[g * npp + (j - f)];
                hpd_page_pool_ref(c->p.pages, tables[g][j]);
            }
            continue;
        }
        uint32_t ids[MAX_GROUPS];
        if ((st = hpd_page_pool_alloc(c->p.pages, c->n_groups, ids)) != HPD_OK)
            goto out;
        for (uint32_t g = 0; g < c->n_groups; g++)
            tables[g][j] = ids[g];
        for (uint32_t b = t0 / B64; b <= (t1 - 1) / B64; b++) {
            st = fill_from_entry(c, m->path[b], HPD_MAX(t0, b * B64), HPD_MIN(t1, (b + 1) * B64),
                                 tables);
            if (st != HPD_OK) {
                placed++;
                goto out;
            }
        }
    }
    promote_path(c, m, (const uint32_t *const *)tables);
    const entry_t *last = &c->e[m->path[m->hit_blocks - 1]];
    if (c->p.state_bytes > 0) {
        if (last->ckpt != 0) {
            hpd_slot_copy_args_t cp = {.dst = state,
                                       .src = hpd_slot_pool_ptr(c->ckpts, last->ckpt),
                                       .bytes = c->p.state_bytes};
            st = hpd_slot_copy(c->p.backend, &cp);
        } else {
            st = hpd_backend_from_host(c->p.backend, state, last->host_ckpt, c->p.state_bytes);
        }
    }
out:
    if (st != HPD_OK)
        for (uint32_t j = 0; j < placed; j++)
            for (uint32_t g = 0; g < c->n_groups; g++)
                hpd_page_pool_unref(c->p.pages, tables[g][j]);
    free(share);
    return st;
}

hpd_status_t hpd_prefix_cache_insert(hpd_prefix_cache_t *c, const hpd_block_hash_t *hashes,
                                     uint32_t n_blocks, const uint32_t *const *tables,
                                     const void *state)
{
    uint32_t parent = NONE, idx = NONE;
    hpd_status_t st;

    c->clock++;
    for (uint32_t i = 0; i < n_blocks; i++, parent = idx) {
        bool created = false;
        idx = find(c, &hashes[i]);
        if (idx == NONE) {
            if ((st = new_entry(c, &hashes[i], parent, i, &idx)) != HPD_OK)
                return st;
            created = true;
        }
        entry_t *e = &c->e[idx];
        e->lru = c->clock;
        if (e->tier == TIER_DEVICE && e->pages != NULL)
            continue;
        /* new, or in the host tier: reference the request's pages */
        if ((st = adopt_pages(c, idx, tables)) != HPD_OK) {
            if (created)
                drop_entry(c, idx); /* a device entry must hold its pages */
            return st;
        }
        c->st.inserted_blocks += created;
    }
    if (state == NULL || idx == NONE || c->p.state_bytes == 0)
        return HPD_OK;
    entry_t *last = &c->e[idx];
    uint32_t slot;
    if (last->ckpt != 0 || last->host_ckpt != NULL)
        return HPD_OK;
    last->lock++; /* keep the new checkpoint's own entry out of the eviction */
    st = ckpt_alloc(c, &slot);
    last = &c->e[idx];
    last->lock--;
    if (st == HPD_ERR_NO_RESOURCE)
        return HPD_OK; /* no slot to spare: the entry stays without state */
    if (st != HPD_OK)
        return st; /* the entry stays without state too */
    hpd_slot_copy_args_t cp = {
        .dst = hpd_slot_pool_ptr(c->ckpts, slot), .src = state, .bytes = c->p.state_bytes};
    if ((st = hpd_slot_copy(c->p.backend, &cp)) != HPD_OK) {
        hpd_slot_pool_unref(c->ckpts, slot);
        return st;
    }
    last->ckpt = slot;
    c->st.checkpoints_created++;
    c->st.checkpoint_bytes += c->p.state_bytes;
    return HPD_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

uint32_t hpd_prefix_cache_checkpoint_plan(const hpd_prefix_cache_t *c,
                                          const hpd_prefix_match_t *m, uint32_t n_tokens,
                                          uint32_t after, uint32_t *positions, uint32_t max)
{
    uint32_t n = 0, all[4096];
    const uint32_t last = n_tokens / B64 * B64;

    if (last > 0)
        all[n++] = last;
    if (m != NULL && m->kv_blocks > m->hit_blocks)
        all[n++] = m->kv_blocks * B64; /* branch point */
    if (c->p.checkpoint_every > 0)
        for (uint32_t p = c->p.checkpoint_every * B64; p < n_tokens && n < 4096;
             p += c->p.checkpoint_every * B64)
            all[n++] = p;
    qsort(all, n, sizeof(uint32_t), cmp_u32);
    uint32_t out = 0;
    for (uint32_t i = 0; i < n && out < max; i++)
        if (all[i] > after && all[i] <= n_tokens && (out == 0 || positions[out - 1] != all[i]))
            positions[out++] = all[i];
    return out;
}

void hpd_prefix_cache_stats(const hpd_prefix_cache_t *c, hpd_prefix_cache_stats_t *s)
{
    *s = c->st;
    s->device_entries = s->host_entries = s->device_checkpoints = s->pages_held = 0;
    for (uint32_t i = 0; i < c->n_entries; i++) {
        if (!c->e[i].used)
            continue;
        s->device_entries += c->e[i].tier == TIER_DEVICE;
        s->host_entries += c->e[i].tier == TIER_HOST;
        s->device_checkpoints += c->e[i].ckpt != 0;
    }
    if (c->p.pages != NULL) {
        const uint32_t np = hpd_page_pool_n_pages(c->p.pages);
        uint32_t *counts = calloc(np, sizeof(uint32_t));
        if (counts != NULL) {
            hpd_prefix_cache_page_refs(c, counts);
            for (uint32_t i = 0; i < np; i++)
                s->pages_held += counts[i] > 0;
            free(counts);
        }
    }
}

void hpd_prefix_cache_page_refs(const hpd_prefix_cache_t *c, uint32_t *counts)
{
    for (uint32_t i = 0; i < c->n_entries; i++) {
        const entry_t *e = &c->e[i];
        if (!e->used || e->pages == NULL)
            continue;
        const uint32_t n = c->n_groups * pages_per_group(c, e->depth);
        for (uint32_t j = 0; j < n; j++)
            counts[e->pages[j]]++;
    }
}
