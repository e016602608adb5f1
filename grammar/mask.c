/* The vocabulary as a trie of token bytes, and the mask of the tokens a
 * matcher allows next: a walk of the trie in preorder with one set of
 * stacks per depth, every subtree that no stack survives skipped.
 *
 * Inside a string without a pattern most of the vocabulary is allowed and
 * the walk would visit all of it: there, the "plain" tokens (no '"', no
 * '\', no control byte, whole UTF-8 characters), which such a string takes
 * whatever follows, are allowed from a precomputed list, and only the
 * trie of the other tokens is walked. A tool call's raw text value takes
 * them the same way (none holds its terminator's '\n'). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "grammar/internal.h"

#define LOG_COMPONENT "grammar"

typedef struct {
    uint8_t byte;
    uint16_t depth;   /* bytes from the root (1 for a root's child) */
    int32_t token;    /* the first id ending here, or -1 */
    uint32_t next;    /* the node after this one's subtree */
} trie_node_t;

typedef struct {
    trie_node_t *nodes;
    uint32_t n;
    uint32_t max_depth;
} trie_t;

struct hpd_vocab {
    uint32_t n_tokens;
    uint8_t **bytes;
    uint32_t *lens;
    bool *special;
    bool *marker; /* special, taken by its bytes where forced (hpd_vocab_params_t) */
    int32_t *dup_next; /* the next id with the same bytes, or -1 */
    trie_t all, nonplain, plain;
    /* the plain tokens by ascending character count */
    uint32_t n_plain;
    int32_t *plain_ids;
    uint32_t *plain_chars;
    uint32_t *plain_mask;
    hpd_vocab_tokenize_cb_t tokenize;
    void *tokenize_arg;
    uint32_t max_len; /* the longest token's bytes */
};

#define MAX_FORCED 256

static const hpd_vocab_t *sort_vocab; /* qsort's context (creation only) */

static int cmp_ids(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const uint32_t lx = sort_vocab->lens[x], ly = sort_vocab->lens[y];
    const int c = memcmp(sort_vocab->bytes[x], sort_vocab->bytes[y], lx < ly ? lx : ly);
    if (c != 0)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The trie of ids[0..n) (sorted by bytes) in preorder. */
static bool trie_build(hpd_vocab_t *v, const int32_t *ids, uint32_t n, trie_t *t)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += v->lens[ids[i]];
    t->nodes = malloc((total + 1) * sizeof(*t->nodes));
    if (t->nodes == NULL)
        return false;
    uint32_t path[65536 / 4];
    uint32_t depth = 0, prev = UINT32_MAX;
    t->n = 0;
    t->max_depth = 0;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        const uint8_t *b = v->bytes[id];
        const uint32_t len = v->lens[id];
        if (len >= sizeof(path) / sizeof(path[0]))
            continue;
        uint32_t common = 0;
        if (prev != UINT32_MAX) {
            const uint32_t pl = v->lens[prev];
            while (common < len && common < pl && v->bytes[prev][common] == b[common])
                common++;
        }
        if (common == len && prev != UINT32_MAX && v->lens[prev] == len) {
            /* the same bytes as the previous id */
            v->dup_next[id] = v->dup_next[prev];
            v->dup_next[prev] = id;
            continue;
        }
        while (depth > common)
            t->nodes[path[--depth]].next = t->n;
        for (uint32_t k = common; k < len; k++) {
            t->nodes[t->n] = (trie_node_t){.byte = b[k], .depth = (uint16_t)(k + 1), .token = -1};
            path[depth++] = t->n++;
        }
        t->nodes[path[depth - 1]].token = id;
        if (len > t->max_depth)
            t->max_depth = len;
        prev = (uint32_t)id;
    }
    while (depth > 0)
        t->nodes[path[--depth]].next = t->n;
    return true;
}

/* Code points of a plain token, or 0 when it is not plain. */
static uint32_t plain_chars(const uint8_t *b, uint32_t len)
{
    uint32_t chars = 0;
    for (uint32_t i = 0; i < len;) {
        const uint8_t c = b[i];
        uint32_t n;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\' || c == 0x7f)
                return 0;
            n = 0;
        } else if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            lo = c == 0xe0 ? 0xa0 : 0x80;
            hi = c == 0xed ? 0x9f : 0xbf;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            lo = c == 0xf0 ? 0x90 : 0x80;
            hi = c == 0xf4 ? 0x8f : 0xbf;
        } else {
            return 0;
        }
        if (i + 1 + n > len)
            return 0;
        for (uint32_t k = 1; k <= n; k++) {
            const uint8_t cc = b[i + k];
            if (cc < (k == 1 ? lo : 0x80) || cc > (k == 1 ? hi : 0xbf))
                return 0;
        }
        i += 1 + n;
        chars++;
    }
    return chars;
}

static int cmp_plain(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

hpd_status_t hpd_vocab_create(const hpd_vocab_params_t *p, hpd_vocab_t **v_p)
{
    hpd_vocab_t *v = calloc(1, sizeof(*v));
    const uint32_t n = p->n_tokens, words = (n + 31) / 32;
    int32_t *ids = malloc((n + 1) * sizeof(*ids));
    int32_t *np_ids = malloc((n + 1) * sizeof(*np_ids));
    uint64_t *plain = malloc((n + 1) * sizeof(*plain));
    if (v == NULL || ids == NULL || np_ids == NULL || plain == NULL)
        goto err_alloc;
    v->n_tokens = n;
    v->tokenize = p->tokenize;
    v->tokenize_arg = p->tokenize_arg;
    v->bytes = calloc(n + 1, sizeof(*v->bytes));
    v->lens = calloc(n + 1, sizeof(*v->lens));
    v->special = calloc(n + 1, sizeof(*v->special));
    v->marker = calloc(n + 1, sizeof(*v->marker));
    v->dup_next = malloc((n + 1) * sizeof(*v->dup_next));
    v->plain_mask = calloc(words + 1, sizeof(*v->plain_mask));
    if (!v->bytes || !v->lens || !v->special || !v->marker || !v->dup_next || !v->plain_mask)
        goto err_alloc;
    uint32_t n_ids = 0, n_np = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->dup_next[i] = -1;
        v->special[i] = p->special != NULL && p->special[i];
        v->marker[i] = v->special[i] && p->marker != NULL && p->marker[i];
        if (p->bytes[i] == NULL || p->lens[i] == 0 || (v->special[i] && !v->marker[i]))
            continue;
        if ((v->bytes[i] = malloc(p->lens[i])) == NULL)
            goto err_alloc;
        memcpy(v->bytes[i], p->bytes[i], p->lens[i]);
        v->lens[i] = p->lens[i];
        if (v->marker[i])
            continue; /* its bytes for accept_token, kept out of the tries */
        if (v->lens[i] > v->max_len)
            v->max_len = v->lens[i];
        ids[n_ids++] = (int32_t)i;
        const uint32_t chars = plain_chars(v->bytes[i], v->lens[i]);
        if (chars == 0) {
            np_ids[n_np++] = (int32_t)i;
        } else {
            plain[v->n_plain++] = (uint64_t)chars << 32 | i;
            v->plain_mask[i / 32] |= 1u << (i % 32);
        }
    }
    sort_vocab = v;
    qsort(ids, n_ids, sizeof(*ids), cmp_ids);
    qsort(np_ids, n_np, sizeof(*np_ids), cmp_ids);
    qsort(plain, v->n_plain, sizeof(*plain), cmp_plain);
    if (!trie_build(v, ids, n_ids, &v->all))
        goto err_alloc;
    /* the duplicates are linked already: the second trie only cuts */
    int32_t *saved = malloc((n + 1) * sizeof(*saved));
    if (saved == NULL)
        goto err_alloc;
    memcpy(saved, v->dup_next, n * sizeof(*saved));
    bool ok = trie_build(v, np_ids, n_np, &v->nonplain);
    uint32_t n_pl = 0;
    for (uint32_t i = 0; i < n_ids; i++)
        if (v->plain_mask[ids[i] / 32] >> (ids[i] % 32) & 1)
            np_ids[n_pl++] = ids[i]; /* ids is sorted by bytes already */
    ok = ok && trie_build(v, np_ids, n_pl, &v->plain);
    memcpy(v->dup_next, saved, n * sizeof(*saved));
    free(saved);
    if (!ok)
        goto err_alloc;
    v->plain_ids = malloc((v->n_plain + 1) * sizeof(*v->plain_ids));
    v->plain_chars = malloc((v->n_plain + 1) * sizeof(*v->plain_chars));
    if (v->plain_ids == NULL || v->plain_chars == NULL)
        goto err_alloc;
    for (uint32_t i = 0; i < v->n_plain; i++) {
        v->plain_ids[i] = (int32_t)(uint32_t)plain[i];
        v->plain_chars[i] = (uint32_t)(plain[i] >> 32);
    }
    free(ids);
    free(np_ids);
    free(plain);
    *v_p = v;
    return HPD_OK;

err_alloc:
    free(ids);
    free(np_ids);
    free(plain);
    hpd_vocab_destroy(v);
    HPD_LOG_ERROR(LOG_COMPONENT, "no memory for a vocabulary of %u tokens", n);
    return HPD_ERR_NO_MEMORY;
}

void hpd_vocab_destroy(hpd_vocab_t *v)
{
    if (v == NULL)
        return;
    for (uint32_t i = 0; v->bytes != NULL && i < v->n_tokens; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->special);
    free(v->marker);
    free(v->dup_next);
    free(v->all.nodes);
    free(v->nonplain.nodes);
    free(v->plain.nodes);
    free(v->plain_ids);
    free(v->plain_chars);
    free(v->plain_mask);
    free(v);
}

uint32_t hpd_vocab_size(const hpd_vocab_t *v)
{
    return v->n_tokens;
}

static void set_token(const hpd_vocab_t *v, int32_t id, uint32_t *mask)
{
    for (; id >= 0; id = v->dup_next[id])
        mask[id / 32] |= 1u << (id % 32);
}

/* Walks the nodes [begin, end) of trie t (a subtree below depth base, or
 * the whole trie with base 0) from the set root: each token whose bytes
 * past base some stack takes is set in mask; with found_p, the walk stops
 * at the first such token instead. */
static hpd_status_t walk(hpd_matcher_t *m, const hpd_vocab_t *v, const trie_t *t, uint32_t begin,
                         uint32_t end, uint32_t base, const g_set_t *root, uint32_t *mask,
                         bool *found_p)
{

    const uint32_t levels = t->max_depth + 1;
    if (m->n_levels < levels) {
        g_set_t *l = realloc(m->levels, levels * sizeof(*l));
        if (l == NULL)
            return HPD_ERR_NO_MEMORY;
        memset(l + m->n_levels, 0, (levels - m->n_levels) * sizeof(*l));
        m->levels = l;
        m->n_levels = levels;
    }
    for (uint32_t i = begin; i < end;) {
        const trie_node_t *nd = &t->nodes[i];
        const uint32_t depth = nd->depth - base;
        const g_set_t *from = depth == 1 ? root : &m->levels[depth - 1];
        g_set_t *to = &m->levels[depth];
        if (!g_set_step(m->g, from, nd->byte, to))
            return HPD_ERR_NO_MEMORY;
        if (to->n == 0) {
            i = nd->next;
            continue;
        }
        if (nd->token >= 0) {
            if (found_p != NULL) {
                *found_p = true;
                return HPD_OK;
            }
            set_token(v, nd->token, mask);
        }
        i++;
    }
    return HPD_OK;
}

/* The walk of trie t when the matcher's one stack is inside a string: the
 * string's frame alone is stepped per node (g_string_advance, no set); a
 * closing quote hands its node's subtree, from the stack with the string
 * as it was before the quote, to the general walk. */
static hpd_status_t walk_string(hpd_matcher_t *m, const hpd_vocab_t *v, const trie_t *t,
                                uint32_t *mask)
{
    const g_set_t *root = &m->cur;
    const uint32_t d = root->buf[0].node;
    if (m->n_sframes < t->max_depth + 1) {
        g_frame_t *f = realloc(m->sframes, (t->max_depth + 1) * sizeof(*f));
        if (f == NULL)
            return HPD_ERR_NO_MEMORY;
        m->sframes = f;
        m->n_sframes = t->max_depth + 1;
    }
    g_frame_t *fr = m->sframes;
    fr[0] = root->buf[d];
    hpd_status_t st;
    for (uint32_t i = 0; i < t->n;) {
        const trie_node_t *nd = &t->nodes[i];
        g_frame_t f = fr[nd->depth - 1];
        const int r = g_string_advance(m->g, &f, nd->byte);
        if (r == G_ADV_OK) {
            fr[nd->depth] = f;
            if (nd->token >= 0)
                set_token(v, nd->token, mask);
            i++;
            continue;
        }
        if (r == G_ADV_CLOSE) {
            if (!g_set_copy(&m->handoff, root))
                return HPD_ERR_NO_MEMORY;
            m->handoff.buf[d] = fr[nd->depth - 1];
            if ((st = walk(m, v, t, i, nd->next, nd->depth - 1, &m->handoff, mask, NULL)) != HPD_OK)
                return st;
        }
        i = nd->next;
    }
    return HPD_OK;
}

/* The plain tokens a string's pattern DFA takes from state q (a plain
 * token is whole characters without quote, escape or control byte: inside
 * a string only the pattern can refuse it), as a mask: a walk of the plain
 * trie on the DFA's table alone, kept per (DFA, state) for the matcher's
 * next visits. */
static const uint32_t *dfa_plain_mask(hpd_matcher_t *m, const hpd_vocab_t *v, uint32_t dfa,
                                      uint32_t q)
{
    const uint32_t words = (v->n_tokens + 31) / 32;
    for (uint32_t i = 0; i < m->n_dcache; i++)
        if (m->dcache[i].dfa == dfa && m->dcache[i].state == q)
            return m->dcache[i].mask;
    if (m->n_dcache == G_DFA_CACHE) { /* full: the oldest goes */
        free(m->dcache[0].mask);
        memmove(m->dcache, m->dcache + 1, (G_DFA_CACHE - 1) * sizeof(*m->dcache));
        m->n_dcache--;
    }
    uint32_t *mask = calloc(words, sizeof(*mask));
    const trie_t *t = &v->plain;
    int32_t *states = malloc((t->max_depth + 1) * sizeof(*states));
    if (mask == NULL || states == NULL) {
        free(mask);
        free(states);
        return NULL;
    }
    const int32_t *trans = m->g->dfas[dfa].trans;
    states[0] = (int32_t)q;
    for (uint32_t i = 0; i < t->n;) {
        const trie_node_t *nd = &t->nodes[i];
        const int32_t s = trans[(size_t)states[nd->depth - 1] * 256 + nd->byte];
        if (s < 0) {
            i = nd->next;
            continue;
        }
        states[nd->depth] = s;
        if (nd->token >= 0)
            set_token(v, nd->token, mask);
        i++;
    }
    free(states);
    m->dcache[m->n_dcache++] = (g_dcache_t){.dfa = dfa, .state = q, .mask = mask};
    return mask;
}

/* The node of trie t spelling bytes[0..n), or UINT32_MAX. */
static uint32_t trie_find(const trie_t *t, const uint8_t *bytes, uint32_t n)
{
    uint32_t begin = 0, end = t->n, at = UINT32_MAX;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t j = begin;
        while (j < end && t->nodes[j].byte != bytes[k])
            j = t->nodes[j].next;
        if (j >= end)
            return UINT32_MAX;
        at = j;
        begin = j + 1;
        end = t->nodes[j].next;
    }
    return at;
}

/* The bytes every continuation of the document starts with (none once it
 * may end here), at most MAX_FORCED; m->forced is the set after them. */
static hpd_status_t forced_bytes(hpd_matcher_t *m, uint8_t *forced, uint32_t *n_p)
{
    uint32_t n = 0;
    if (!g_set_copy(&m->forced, &m->cur))
        return HPD_ERR_NO_MEMORY;
    static uint8_t order[256];
    static int ordered; /* (set once; any thread sets the same) */
    if (!__atomic_load_n(&ordered, __ATOMIC_ACQUIRE)) {
        /* the bytes JSON documents use most first: a second byte that
         * fits, and so no forcing, is found in a few steps */
        static const char common[] = "\" ,:{}[]0123456789-.etrufalsnabcdghijkmopqvwxyz"
                                     "ABCDEFGHIJKLMNOPQRSTUVWXYZ_<>/=\n";
        bool seen[256] = {0};
        uint32_t k = 0;
        for (const char *p = common; *p; p++)
            if (!seen[(uint8_t)*p]) {
                seen[(uint8_t)*p] = true;
                order[k++] = (uint8_t)*p;
            }
        for (unsigned c = 0; c < 256; c++)
            if (!seen[c])
                order[k++] = (uint8_t)c;
        __atomic_store_n(&ordered, 1, __ATOMIC_RELEASE);
    }
    while (n < MAX_FORCED && !g_set_can_end(m->g, &m->forced)) {
        int only = -1;
        for (unsigned k = 0; k < 256; k++) {
            const uint8_t c = order[k];
            if (!g_set_step(m->g, &m->forced, (uint8_t)c, &m->tmp))
                return HPD_ERR_NO_MEMORY;
            if (m->tmp.n == 0)
                continue;
            if (only >= 0) {
                only = -2;
                break;
            }
            only = (int)c;
        }
        if (only < 0)
            break;
        if (!g_set_step(m->g, &m->forced, (uint8_t)only, &m->tmp))
            return HPD_ERR_NO_MEMORY;
        const g_set_t t = m->forced;
        m->forced = m->tmp;
        m->tmp = t;
        forced[n++] = (uint8_t)only;
    }
    *n_p = n;
    return HPD_OK;
}

/* How many of the last tokens of ids[0..n) another spelling may replace
 * once more bytes follow: the longest suffix of the last 4 tokens' bytes
 * (at most the longest token's length) that a longer token starts with,
 * its further bytes allowed after the forced ones (llguidance's
 * chop_tokens). */
static hpd_status_t chop_tokens(hpd_matcher_t *m, const hpd_vocab_t *v, const int32_t *ids,
                                size_t n, size_t *chop_p)
{
    uint8_t suff[4 * 1024];
    uint32_t len = 0;
    const size_t first = n > 4 ? n - 4 : 0;
    *chop_p = 0;
    for (size_t i = first; i < n; i++) {
        const uint32_t l = v->lens[ids[i]];
        if (len + l > sizeof(suff))
            return HPD_OK;
        memcpy(suff + len, v->bytes[ids[i]], l);
        len += l;
    }
    const uint32_t from = len > v->max_len ? len - v->max_len : 0;
    for (uint32_t idx = from; idx < len; idx++) {
        const uint32_t node = trie_find(&v->all, suff + idx, len - idx);
        if (node == UINT32_MAX)
            continue;
        bool found = false;
        const trie_node_t *nd = &v->all.nodes[node];
        hpd_status_t st = walk(m, v, &v->all, node + 1, nd->next, nd->depth, &m->forced, NULL, &found);
        if (st != HPD_OK)
            return st;
        if (!found)
            continue;
        uint32_t cum = 0;
        for (size_t c = 1; c <= n; c++) {
            cum += v->lens[ids[n - c]];
            if (cum >= len - idx) {
                *chop_p = c;
                return HPD_OK;
            }
        }
        *chop_p = n;
        return HPD_OK;
    }
    return HPD_OK;
}

/* The length of the longest prefix of b[0..n) that is whole UTF-8. */
static uint32_t utf8_whole(const uint8_t *b, uint32_t n)
{
    uint32_t i = 0;
    while (i < n) {
        const uint8_t c = b[i];
        const uint32_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        if (i + len > n)
            break;
        i += len;
    }
    return i;
}

/* Forced bytes as the tokenizer spells them: the whole characters by the
 * tokenizer, a trailing piece of one by the longest tokens (llguidance's
 * tokenize_bytes_prefix). */
static hpd_status_t tokenize_prefix(const hpd_vocab_t *v, const uint8_t *b, uint32_t n,
                                    int32_t **ids_p, size_t *n_p)
{
    const uint32_t whole = utf8_whole(b, n);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    hpd_status_t st;
    if (whole > 0 && (st = v->tokenize(v->tokenize_arg, b, whole, &ids, &n_ids)) != HPD_OK)
        return st;
    int32_t *all = realloc(ids, (n_ids + (n - whole) + 1) * sizeof(*all));
    if (all == NULL) {
        free(ids);
        return HPD_ERR_NO_MEMORY;
    }
    for (uint32_t i = whole; i < n;) {
        uint32_t best_len = 0;
        int32_t best = -1;
        for (uint32_t k = 1; i + k <= n; k++) {
            const uint32_t node = trie_find(&v->all, b + i, k);
            if (node == UINT32_MAX)
                break;
            if (v->all.nodes[node].token >= 0) {
                best = v->all.nodes[node].token;
                best_len = k;
            }
        }
        if (best < 0)
            break; /* no token spells this byte: the spelling stops short */
        all[n_ids++] = best;
        i += best_len;
    }
    *ids_p = all;
    *n_p = n_ids;
    return HPD_OK;
}

/* Forced bytes are allowed only as the tokenizer spells them: the first
 * token of their spelling, or, when another spelling may yet replace all
 * of it, the tokens that agree with them (a piece of them, or them and a
 * valid continuation) (*done_p false: no forced bytes, the full mask is to
 * be computed). */
static hpd_status_t mask_forced(hpd_matcher_t *m, const hpd_vocab_t *v, uint32_t *mask, bool *done_p)
{
    uint8_t forced[MAX_FORCED];
    uint32_t n;
    int32_t *ids = NULL;
    size_t n_ids, chop;
    hpd_status_t st;
    *done_p = false;
    if ((st = forced_bytes(m, forced, &n)) != HPD_OK || n == 0)
        return st;
    if ((st = tokenize_prefix(v, forced, n, &ids, &n_ids)) != HPD_OK)
        return st;
    st = n_ids > 0 ? chop_tokens(m, v, ids, n_ids, &chop) : HPD_OK;
    if (st == HPD_OK && n_ids > chop) {
        set_token(v, ids[0], mask);
        *done_p = true;
    } else if (st == HPD_OK && n_ids > 0) {
        /* the tokens along the forced bytes, and those past them that
         * continue validly */
        uint32_t node = UINT32_MAX;
        for (uint32_t k = 1; k <= n; k++) {
            if ((node = trie_find(&v->all, forced, k)) == UINT32_MAX)
                break;
            if (v->all.nodes[node].token >= 0)
                set_token(v, v->all.nodes[node].token, mask);
        }
        if (node != UINT32_MAX) {
            const trie_node_t *nd = &v->all.nodes[node];
            st = walk(m, v, &v->all, node + 1, nd->next, nd->depth, &m->forced, mask, NULL);
        }
        *done_p = true;
    }
    free(ids);
    return st;
}

/* The plain tokens of at most `left` characters set in mask (which holds
 * no plain token yet): all of them, less the few longer ones (the list is
 * by ascending length). */
static void plain_upto(const hpd_vocab_t *v, uint32_t left, uint32_t *mask)
{
    const uint32_t words = (v->n_tokens + 31) / 32;
    for (uint32_t w = 0; w < words; w++)
        mask[w] |= v->plain_mask[w];
    for (uint32_t i = v->n_plain; i-- > 0 && v->plain_chars[i] > left;)
        for (int32_t id = v->plain_ids[i]; id >= 0; id = v->dup_next[id])
            mask[id / 32] &= ~(1u << (id % 32));
}

/* Some stack of s is inside a string at a character boundary that takes
 * every plain token (a key, or a string with no pattern and no maxLength),
 * or in a tool call's raw text with no such limits, not inside its
 * terminator (which starts with '\n': no plain token holds one, so none
 * can complete it). */
static bool text_top(const hpd_grammar_t *g, const g_frame_t *f, uint32_t d, g_frame_t *t_p);

static bool in_free_string(const hpd_grammar_t *g, const g_set_t *s)
{
    for (uint32_t r = 0; r < s->used;) {
        const uint32_t d = s->buf[r].node;
        g_frame_t tt;
        const g_frame_t *t = text_top(g, &s->buf[r + 1], d, &tt) ? &tt : &s->buf[r + d];
        const g_node_t *n = &g->nodes[t->node];
        const bool free_limits = n->dfa == G_NONE && n->max_len == UINT32_MAX;
        if ((t->st == S_CHARS && (t->kind == F_KEY || (t->kind == F_STRING && free_limits))) ||
            (t->kind == F_TEXT && t->st == 0 && free_limits &&
             g->bytes[g->lits[n->lit].off] == '\n'))
            return true;
        r += d + 1;
    }
    return false;
}

/* The raw text frame the stack f[0..d) is in, or is about to start: its
 * top, or the next element of the sequence below a literal the last byte
 * completed (frames move on with the next byte): in *t_p. */
static bool text_top(const hpd_grammar_t *g, const g_frame_t *f, uint32_t d, g_frame_t *t_p)
{
    const g_frame_t *top = &f[d - 1], *seq = top;
    uint32_t next = top->a;
    if (top->kind == F_TEXT) {
        *t_p = *top;
        return true;
    }
    if (top->kind == F_LITERAL && d >= 2 && top->a == g->lits[top->b].len) {
        seq = &f[d - 2];
        next = seq->a + 1;
    }
    if (seq->kind != F_SEQ || next >= g->nodes[seq->node].n_alts)
        return false;
    const uint32_t id = g->alts[g->nodes[seq->node].alt0 + next];
    if (g->nodes[id].kind != G_TEXT)
        return false;
    *t_p = (g_frame_t){.kind = F_TEXT, .node = id};
    return true;
}

hpd_status_t hpd_matcher_mask(hpd_matcher_t *m, const hpd_vocab_t *v, const int32_t *end_ids,
                              uint32_t n_end, uint32_t *mask)
{
    const uint32_t words = (v->n_tokens + 31) / 32;
    memset(mask, 0, words * sizeof(*mask));
    if (m->ended)
        return HPD_OK;
    bool done = false;
    hpd_status_t st = v->tokenize != NULL ? mask_forced(m, v, mask, &done) : HPD_OK;
    if (st != HPD_OK || done)
        return st;
    const g_frame_t *top = &m->cur.buf[m->cur.buf[0].node];
    const bool one_string = m->cur.n == 1 && (top->kind == F_STRING || top->kind == F_KEY) &&
                            top->st != S_EXPECT && top->st != S_CLOSED;
    g_frame_t tt;
    const bool one_text = m->cur.n == 1 &&
                          text_top(m->g, &m->cur.buf[1], m->cur.buf[0].node, &tt) && tt.st == 0 &&
                          m->g->bytes[m->g->lits[m->g->nodes[tt.node].lit].off] == '\n';
    const trie_t *t = &v->all;
    if (in_free_string(m->g, &m->cur)) {
        memcpy(mask, v->plain_mask, words * sizeof(*mask));
        t = &v->nonplain;
    } else if ((one_string && top->kind == F_STRING && top->st == S_CHARS) || one_text) {
        /* the one stack is in a bounded or a patterned string, or raw text
         * (no plain token holds its terminator's '\n'): the plain tokens of
         * at most the characters left, that the DFA takes */
        if (one_text)
            top = &tt;
        const g_node_t *n = &m->g->nodes[top->node];
        const uint32_t *pm = n->dfa != G_NONE ? dfa_plain_mask(m, v, n->dfa, top->b) : NULL;
        if (n->dfa != G_NONE && pm == NULL)
            return HPD_ERR_NO_MEMORY;
        if (n->max_len == UINT32_MAX) {
            for (uint32_t w = 0; w < words; w++)
                mask[w] |= pm[w];
        } else {
            plain_upto(v, n->max_len - top->a, mask);
            for (uint32_t w = 0; pm != NULL && w < words; w++)
                mask[w] &= pm[w] | ~v->plain_mask[w];
        }
        t = &v->nonplain;
    }
    if ((st = one_string ? walk_string(m, v, t, mask) : walk(m, v, t, 0, t->n, 0, &m->cur, mask, NULL)) !=
        HPD_OK)
        return st;
    if (g_set_can_end(m->g, &m->cur))
        for (uint32_t i = 0; i < n_end; i++)
            if (end_ids[i] >= 0 && (uint32_t)end_ids[i] < v->n_tokens)
                mask[end_ids[i] / 32] |= 1u << (end_ids[i] % 32);
    return HPD_OK;
}

hpd_status_t hpd_matcher_accept_token(hpd_matcher_t *m, const hpd_vocab_t *v, int32_t id,
                                      const int32_t *end_ids, uint32_t n_end)
{
    if (id < 0 || (uint32_t)id >= v->n_tokens || m->ended)
        return HPD_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n_end; i++)
        if (end_ids[i] == id) {
            if (!g_set_can_end(m->g, &m->cur))
                return HPD_ERR_INVALID_ARG;
            m->ended = true;
            return HPD_OK;
        }
    if ((v->special[id] && !v->marker[id]) || v->lens[id] == 0 ||
        !hpd_matcher_accept_bytes(m, v->bytes[id], v->lens[id]))
        return HPD_ERR_INVALID_ARG;
    return HPD_OK;
}
