/* String patterns: the regular subset of ECMA-262 regexes that JSON Schema
 * uses, compiled to a Thompson NFA over UTF-8 bytes and then to a DFA
 * (docs/structured_outputs.md lists the subset). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "grammar/internal.h"

#define NFA_MAX 32768
#define DFA_MAX 4096
#define REPEAT_MAX 100
#define DFA_WORK 100000000 /* ~0.1 s of subset construction */

typedef struct {
    uint32_t set[8]; /* the bytes of the edge to .next */
    int32_t next;
    int32_t eps[2];
} nstate_t;

typedef struct {
    nstate_t *s;
    uint32_t n;
    size_t cap;
    const char *p; /* the pattern */
    size_t len, pos;
    char *err;
    size_t errlen;
    bool failed;
    uint32_t depth; /* groups open (a hostile pattern must not exhaust the stack) */
} nfa_t;

typedef struct {
    int32_t start, end;
} frag_t;

static bool fail(nfa_t *a, const char *what)
{
    if (!a->failed && a->err != NULL)
        snprintf(a->err, a->errlen, "pattern \"%.40s%s\": %s at offset %zu is not supported", a->p,
                 a->len > 40 ? "..." : "", what, a->pos);
    a->failed = true;
    return false;
}

static int32_t new_state(nfa_t *a)
{
    if (a->n >= NFA_MAX) {
        fail(a, "a pattern this large");
        return -1;
    }
    if (hpd_grow(&a->s, &a->cap, a->n + 1, sizeof(*a->s)) != HPD_OK) { /* as the pattern needs */
        fail(a, "a pattern this large (no memory)");
        return -1;
    }
    a->s[a->n] = (nstate_t){.next = -1, .eps = {-1, -1}};
    return (int32_t)a->n++;
}

static void add_eps(nfa_t *a, int32_t from, int32_t to)
{
    nstate_t *s = &a->s[from];
    s->eps[s->eps[0] < 0 ? 0 : 1] = to;
}

static void set_add(uint32_t *set, unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++)
        set[c / 32] |= 1u << (c % 32);
}

/* A fragment taking one byte of set. */
static frag_t byte_frag(nfa_t *a, const uint32_t *set)
{
    const int32_t s = new_state(a), e = new_state(a);
    if (s < 0 || e < 0)
        return (frag_t){-1, -1};
    memcpy(a->s[s].set, set, sizeof(a->s[s].set));
    a->s[s].next = e;
    return (frag_t){s, e};
}

static frag_t concat(nfa_t *a, frag_t x, frag_t y)
{
    if (x.start < 0)
        return y;
    add_eps(a, x.end, y.start);
    return (frag_t){x.start, y.end};
}

static frag_t alternate(nfa_t *a, frag_t x, frag_t y)
{
    const int32_t s = new_state(a), e = new_state(a);
    if (s < 0 || e < 0)
        return (frag_t){-1, -1};
    add_eps(a, s, x.start);
    add_eps(a, s, y.start);
    add_eps(a, x.end, e);
    add_eps(a, y.end, e);
    return (frag_t){s, e};
}

/* An empty fragment (one state). */
static frag_t empty(nfa_t *a)
{
    const int32_t s = new_state(a);
    return (frag_t){s, s};
}

/* A set of code points as sorted, disjoint ranges. */
#define CLASS_MAX 128
typedef struct {
    uint32_t lo[CLASS_MAX], hi[CLASS_MAX];
    uint32_t n;
} cls_t;

static bool cls_add(nfa_t *a, cls_t *c, uint32_t lo, uint32_t hi)
{
    if (c->n >= CLASS_MAX)
        return fail(a, "a character class this large");
    c->lo[c->n] = lo;
    c->hi[c->n++] = hi;
    return true;
}

/* Sorted, overlapping and touching ranges merged. */
static void cls_norm(cls_t *c)
{
    for (uint32_t i = 1; i < c->n; i++)
        for (uint32_t j = i; j > 0 && c->lo[j - 1] > c->lo[j]; j--) {
            const uint32_t l = c->lo[j], h = c->hi[j];
            c->lo[j] = c->lo[j - 1];
            c->hi[j] = c->hi[j - 1];
            c->lo[j - 1] = l;
            c->hi[j - 1] = h;
        }
    uint32_t w = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        if (w > 0 && c->lo[i] <= c->hi[w - 1] + 1) {
            if (c->hi[i] > c->hi[w - 1])
                c->hi[w - 1] = c->hi[i];
            continue;
        }
        c->lo[w] = c->lo[i];
        c->hi[w++] = c->hi[i];
    }
    c->n = w;
}

/* Every code point not in c. */
static bool cls_negate(nfa_t *a, cls_t *c)
{
    cls_t out = {0};
    uint32_t next = 0;
    cls_norm(c);
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->lo[i] > next && !cls_add(a, &out, next, c->lo[i] - 1))
            return false;
        next = c->hi[i] + 1;
    }
    if (next <= 0x10ffff && !cls_add(a, &out, next, 0x10ffff))
        return false;
    *c = out;
    return true;
}

/* ECMA-262's \d, \w, \s (ASCII digits and word characters; Unicode white
 * space and line terminators), negated for \D \W \S. */
static bool class_escape(nfa_t *a, char e, cls_t *c)
{
    static const uint32_t space[][2] = {{0x09, 0x0d},     {0x20, 0x20},     {0x85, 0x85},
                                        {0xa0, 0xa0},     {0x1680, 0x1680}, {0x2000, 0x200a},
                                        {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f},
                                        {0x3000, 0x3000}};
    cls_t s = {0};
    switch (e | 0x20) {
    case 'd':
        cls_add(a, &s, '0', '9');
        break;
    case 'w':
        cls_add(a, &s, '0', '9');
        cls_add(a, &s, 'A', 'Z');
        cls_add(a, &s, '_', '_');
        cls_add(a, &s, 'a', 'z');
        break;
    case 's':
        for (size_t i = 0; i < sizeof(space) / sizeof(space[0]); i++)
            cls_add(a, &s, space[i][0], space[i][1]);
        break;
    default:
        return false;
    }
    if (e >= 'A' && e <= 'Z' && !cls_negate(a, &s))
        return false;
    for (uint32_t i = 0; i < s.n; i++)
        if (!cls_add(a, c, s.lo[i], s.hi[i]))
            return false;
    return true;
}

static uint32_t utf8_encode(uint32_t cp, uint8_t *b)
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xc0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xe0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        b[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    b[0] = (uint8_t)(0xf0 | cp >> 18);
    b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
    b[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* The UTF-8 byte sequences of the code points [lo, hi] (no surrogates, one
 * length) as alternatives added to *f: split until each byte position is
 * one range (the utf8-ranges construction). */
static void utf8_range(nfa_t *a, uint32_t lo, uint32_t hi, frag_t *f)
{
    static const uint32_t ends[] = {0x7f, 0x7ff, 0xffff};
    for (int i = 0; i < 3; i++)
        if (lo <= ends[i] && hi > ends[i]) {
            utf8_range(a, lo, ends[i], f);
            utf8_range(a, ends[i] + 1, hi, f);
            return;
        }
    uint8_t bl[4], bh[4];
    const uint32_t n = utf8_encode(lo, bl);
    utf8_encode(hi, bh);
    for (uint32_t k = 1; k < n; k++) {
        const uint32_t m = (1u << (6 * k)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(a, lo, lo | m, f);
                utf8_range(a, (lo | m) + 1, hi, f);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(a, lo, (hi & ~m) - 1, f);
                utf8_range(a, hi & ~m, hi, f);
                return;
            }
        }
    }
    frag_t seq = {-1, -1};
    for (uint32_t k = 0; k < n && !a->failed; k++) {
        uint32_t set[8] = {0};
        set_add(set, bl[k], bh[k]);
        seq = concat(a, seq, byte_frag(a, set));
    }
    if (!a->failed)
        *f = f->start < 0 ? seq : alternate(a, *f, seq);
}

/* A fragment taking one character of c. */
static frag_t cls_frag(nfa_t *a, cls_t *c)
{
    frag_t f = {-1, -1};
    cls_norm(c);
    for (uint32_t i = 0; i < c->n && !a->failed; i++) {
        uint32_t lo = c->lo[i], hi = c->hi[i];
        if (lo <= 0xdfff && hi >= 0xd800) { /* no surrogates */
            if (lo < 0xd800)
                utf8_range(a, lo, 0xd7ff, &f);
            lo = 0xe000;
        }
        if (lo <= hi && hi <= 0x10ffff)
            utf8_range(a, lo, hi, &f);
    }
    if (f.start < 0 && !a->failed)
        fail(a, "an empty character class");
    return a->failed ? (frag_t){-1, -1} : f;
}

/* The byte of a single-character escape, or -1. */
static int literal_escape(char c)
{
    static const char punct[] = "\\/.-^$|()[]{}*+?\"";
    switch (c) {
    case 'n':
        return '\n';
    case 't':
        return '\t';
    case 'r':
        return '\r';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    default:
        return c != '\0' && strchr(punct, c) != NULL ? c : -1;
    }
}

/* The next code point of the pattern (UTF-8), or -1. */
static int32_t next_cp(nfa_t *a)
{
    const unsigned char c = (unsigned char)a->p[a->pos];
    const uint32_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (a->pos + n > a->len)
        return -1;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (uint32_t k = 1; k < n; k++)
        cp = cp << 6 | ((unsigned char)a->p[a->pos + k] & 0x3f);
    a->pos += n;
    return (int32_t)cp;
}

/* One member's code point inside a class (an escape or a character), or
 * -1 when it was a class escape (added to c). */
static int32_t class_member(nfa_t *a, cls_t *c, bool *ok_p)
{
    *ok_p = true;
    if (a->p[a->pos] != '\\')
        return next_cp(a);
    a->pos++;
    const char e = a->pos < a->len ? a->p[a->pos] : '\0';
    if (class_escape(a, e, c)) {
        a->pos++;
        return -1;
    }
    const int l = literal_escape(e);
    if (l < 0) {
        *ok_p = fail(a, "this escape");
        return -1;
    }
    a->pos++;
    return l;
}

/* [...] */
static frag_t parse_class(nfa_t *a)
{
    cls_t c = {0};
    bool neg = false, ok = true;
    a->pos++; /* '[' */
    if (a->pos < a->len && a->p[a->pos] == '^') {
        neg = true;
        a->pos++;
    }
    bool first = true;
    while (ok && a->pos < a->len && (a->p[a->pos] != ']' || first)) {
        first = false;
        const int32_t lo = class_member(a, &c, &ok);
        if (!ok || lo < 0)
            continue;
        int32_t hi = lo;
        if (a->pos + 1 < a->len && a->p[a->pos] == '-' && a->p[a->pos + 1] != ']') {
            a->pos++;
            hi = class_member(a, &c, &ok);
            if (ok && hi < lo) {
                fail(a, "this class range");
                return (frag_t){-1, -1};
            }
        }
        ok = ok && cls_add(a, &c, (uint32_t)lo, (uint32_t)hi);
    }
    if (a->failed)
        return (frag_t){-1, -1};
    if (a->pos >= a->len) {
        fail(a, "an unterminated class");
        return (frag_t){-1, -1};
    }
    a->pos++; /* ']' */
    if (neg && !cls_negate(a, &c))
        return (frag_t){-1, -1};
    return cls_frag(a, &c);
}

static frag_t parse_alt(nfa_t *a);

static frag_t parse_atom(nfa_t *a)
{
    const unsigned char c = (unsigned char)a->p[a->pos];
    uint32_t set[8] = {0};
    if (c == '(') {
        if (++a->depth > 64) {
            fail(a, "groups nested deeper than 64");
            return (frag_t){-1, -1};
        }
        a->pos++;
        if (a->pos + 1 < a->len && a->p[a->pos] == '?') {
            if (a->p[a->pos + 1] != ':') {
                fail(a, "a group of this kind");
                return (frag_t){-1, -1};
            }
            a->pos += 2;
        }
        frag_t f = parse_alt(a);
        if (a->failed)
            return f;
        if (a->pos >= a->len || a->p[a->pos] != ')') {
            fail(a, "an unclosed group");
            return (frag_t){-1, -1};
        }
        a->pos++;
        a->depth--;
        return f;
    }
    if (c == '[')
        return parse_class(a);
    if (c == '.') { /* any character but a newline (as llguidance's regexes) */
        cls_t cl = {0};
        a->pos++;
        cls_add(a, &cl, '\n', '\n');
        if (!cls_negate(a, &cl))
            return (frag_t){-1, -1};
        return cls_frag(a, &cl);
    }
    if (c == '\\') {
        cls_t cl = {0};
        bool ok;
        const int32_t l = class_member(a, &cl, &ok);
        if (!ok)
            return (frag_t){-1, -1};
        if (l >= 0 && !cls_add(a, &cl, (uint32_t)l, (uint32_t)l))
            return (frag_t){-1, -1};
        return cls_frag(a, &cl);
    }
    if (c == '^' || c == '$' || c == ')' || c == '*' || c == '+' || c == '?' || c == '{' ||
        c == '|') {
        fail(a, c == '^' || c == '$' ? "an anchor inside the pattern" : "this character here");
        return (frag_t){-1, -1};
    }
    /* a literal character: its UTF-8 bytes */
    size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    frag_t f = {-1, -1};
    for (size_t i = 0; i < n && a->pos < a->len; i++, a->pos++) {
        memset(set, 0, sizeof(set));
        const unsigned char b = (unsigned char)a->p[a->pos];
        set_add(set, b, b);
        f = concat(a, f, byte_frag(a, set));
    }
    return f;
}

/* {m}, {m,}, {m,n}: false when the text at pos is not one. */
static bool parse_braces(nfa_t *a, unsigned *min_p, unsigned *max_p)
{
    size_t p = a->pos + 1;
    unsigned m = 0, n;
    if (p >= a->len || a->p[p] < '0' || a->p[p] > '9')
        return false;
    while (p < a->len && a->p[p] >= '0' && a->p[p] <= '9' && m <= REPEAT_MAX)
        m = m * 10 + (unsigned)(a->p[p++] - '0');
    n = m;
    if (p < a->len && a->p[p] == ',') {
        p++;
        n = UINT32_MAX;
        if (p < a->len && a->p[p] >= '0' && a->p[p] <= '9')
            for (n = 0; p < a->len && a->p[p] >= '0' && a->p[p] <= '9' && n <= REPEAT_MAX;)
                n = n * 10 + (unsigned)(a->p[p++] - '0');
    }
    if (p >= a->len || a->p[p] != '}')
        return false;
    a->pos = p + 1;
    *min_p = m;
    *max_p = n;
    return true;
}

/* An atom and its quantifier: the atom is parsed again for each copy. */
static frag_t parse_repeat(nfa_t *a)
{
    const size_t at = a->pos;
    frag_t f = parse_atom(a);
    if (a->failed || a->pos >= a->len)
        return f;
    const size_t after = a->pos;
    unsigned min, max;
    const char q = a->p[a->pos];
    if (q == '*' || q == '+' || q == '?') {
        min = q == '+' ? 1 : 0;
        max = q == '?' ? 1 : UINT32_MAX;
        a->pos++;
    } else if (q != '{' || !parse_braces(a, &min, &max)) {
        return f;
    }
    if (a->pos < a->len && a->p[a->pos] == '?') {
        fail(a, "a lazy quantifier");
        return (frag_t){-1, -1};
    }
    if (min > REPEAT_MAX || (max != UINT32_MAX && (max > REPEAT_MAX || max < min))) {
        fail(a, "a repetition count over 100 or out of order");
        return (frag_t){-1, -1};
    }
    const size_t end = a->pos;
    frag_t out = {-1, -1};
    /* min copies, then max - min optional ones (or one starred) */
    for (unsigned i = 0; i < min && !a->failed; i++) {
        frag_t copy = f;
        if (i > 0) {
            a->pos = at;
            copy = parse_atom(a);
        }
        out = concat(a, out, copy);
    }
    const unsigned opt = max == UINT32_MAX ? 1 : max - min;
    for (unsigned i = 0; i < opt && !a->failed; i++) {
        frag_t copy = f;
        if (min > 0 || i > 0) {
            a->pos = at;
            copy = parse_atom(a);
        }
        if (a->failed)
            break;
        const int32_t s = new_state(a), e = new_state(a);
        if (s < 0 || e < 0)
            break;
        add_eps(a, s, copy.start);
        add_eps(a, s, e);
        add_eps(a, copy.end, e);
        if (max == UINT32_MAX)
            add_eps(a, copy.end, copy.start);
        out = concat(a, out, (frag_t){s, e});
    }
    (void)after;
    a->pos = end;
    return out.start < 0 ? empty(a) : out;
}

static frag_t parse_seq(nfa_t *a)
{
    frag_t f = {-1, -1};
    while (!a->failed && a->pos < a->len && a->p[a->pos] != '|' && a->p[a->pos] != ')') {
        if (a->p[a->pos] == '$' && a->pos + 1 == a->len)
            break;
        f = concat(a, f, parse_repeat(a));
    }
    return f.start < 0 && !a->failed ? empty(a) : f;
}

static frag_t parse_alt(nfa_t *a)
{
    frag_t f = parse_seq(a);
    while (!a->failed && a->pos < a->len && a->p[a->pos] == '|') {
        a->pos++;
        f = alternate(a, f, parse_seq(a));
    }
    return f;
}

/* Any bytes: the unanchored ends. */
static frag_t any_bytes(nfa_t *a)
{
    uint32_t all[8];
    memset(all, 0xff, sizeof(all));
    const int32_t s = new_state(a);
    if (s < 0)
        return (frag_t){-1, -1};
    memcpy(a->s[s].set, all, sizeof(all));
    a->s[s].next = s;
    return (frag_t){s, s};
}

typedef struct {
    uint32_t words;
    uint64_t *sets; /* [n][words] */
    uint32_t n;
} dstates_t;

static void closure(const nfa_t *a, uint64_t *set, int32_t *stack)
{
    uint32_t top = 0;
    for (uint32_t i = 0; i < a->n; i++)
        if (set[i / 64] >> (i % 64) & 1)
            stack[top++] = (int32_t)i;
    while (top > 0) {
        const nstate_t *s = &a->s[stack[--top]];
        for (int k = 0; k < 2; k++) {
            const int32_t e = s->eps[k];
            if (e >= 0 && !(set[e / 64] >> (e % 64) & 1)) {
                set[e / 64] |= 1ull << (e % 64);
                stack[top++] = e;
            }
        }
    }
}

static int32_t find_or_add(dstates_t *d, const uint64_t *set)
{
    for (uint32_t i = 0; i < d->n; i++)
        if (memcmp(&d->sets[(size_t)i * d->words], set, d->words * 8) == 0)
            return (int32_t)i;
    if (d->n >= DFA_MAX)
        return -2;
    memcpy(&d->sets[(size_t)d->n * d->words], set, d->words * 8);
    return (int32_t)d->n++;
}

/* Merges equivalent states (Moore's refinement: by acceptance, then by
 * the blocks of their successors until no block splits), so that a
 * pattern's states are as few as its language needs: the mask's per-state
 * cache then hits whenever the language left is the same. */
static bool same_signature(const g_dfa_t *dfa, const uint32_t *block, uint32_t q, uint32_t r)
{
    if (block[q] != block[r])
        return false;
    for (unsigned c = 0; c < 256; c++) {
        const int32_t x = dfa->trans[(size_t)q * 256 + c], y = dfa->trans[(size_t)r * 256 + c];
        if ((x < 0) != (y < 0) || (x >= 0 && block[x] != block[y]))
            return false;
    }
    return true;
}

static uint64_t signature_hash(const g_dfa_t *dfa, const uint32_t *block, uint32_t q)
{
    uint64_t h = 1469598103934665603ull ^ block[q];
    for (unsigned c = 0; c < 256; c++) {
        const int32_t x = dfa->trans[(size_t)q * 256 + c];
        h = (h ^ (x < 0 ? 0xffffffffu : block[x])) * 1099511628211ull;
    }
    return h;
}

static bool minimize(g_dfa_t *dfa)
{
    const uint32_t n = dfa->n_states, slots = 2 * n + 1;
    uint32_t *block = malloc(n * sizeof(*block)), *next = malloc(n * sizeof(*next));
    uint32_t *owner = malloc(n * sizeof(*owner)), *table = malloc(slots * sizeof(*table));
    int32_t *trans = NULL;
    bool *acc = NULL, ok = false;
    if (block == NULL || next == NULL || owner == NULL || table == NULL)
        goto out;
    for (uint32_t q = 0; q < n; q++)
        block[q] = dfa->accept[q];
    uint32_t n_blocks = 0, prev = 0;
    for (;;) {
        /* a state's new block: that of the first state with the same
         * block and the same successors' blocks (a hash table of them) */
        n_blocks = 0;
        memset(table, 0xff, slots * sizeof(*table));
        for (uint32_t q = 0; q < n; q++) {
            uint64_t h = signature_hash(dfa, block, q) % slots;
            while (table[h] != UINT32_MAX && !same_signature(dfa, block, q, owner[table[h]]))
                h = (h + 1) % slots;
            if (table[h] == UINT32_MAX) {
                table[h] = n_blocks;
                owner[n_blocks++] = q;
            }
            next[q] = table[h];
        }
        memcpy(block, next, n * sizeof(*block));
        if (n_blocks == prev)
            break;
        prev = n_blocks;
    }
    /* state 0 (the start) is the owner of block 0 */
    trans = malloc((size_t)n_blocks * 256 * sizeof(*trans));
    acc = malloc(n_blocks * sizeof(*acc));
    if (trans == NULL || acc == NULL)
        goto out;
    for (uint32_t k = 0; k < n_blocks; k++) {
        const uint32_t r = owner[k];
        acc[k] = dfa->accept[r];
        for (unsigned c = 0; c < 256; c++) {
            const int32_t x = dfa->trans[(size_t)r * 256 + c];
            trans[(size_t)k * 256 + c] = x < 0 ? -1 : (int32_t)block[x];
        }
    }
    free(dfa->trans);
    free(dfa->accept);
    dfa->trans = trans;
    dfa->accept = acc;
    dfa->n_states = n_blocks;
    trans = NULL;
    acc = NULL;
    ok = true;
out:
    free(trans);
    free(acc);
    free(block);
    free(next);
    free(owner);
    free(table);
    return ok;
}

hpd_status_t g_regex_compile(const char *pattern, g_dfa_t *dfa, char *err, size_t errlen)
{
    nfa_t a = {.p = pattern, .len = strlen(pattern), .err = err, .errlen = errlen};
    hpd_status_t st = HPD_ERR_NO_MEMORY;
    dstates_t d = {0};
    int32_t *stack = NULL;
    uint64_t *cur = NULL;
    *dfa = (g_dfa_t){0};
    const bool head = a.len > 0 && pattern[0] == '^';
    const bool tail = a.len > 0 && pattern[a.len - 1] == '$' &&
                      (a.len < 2 || pattern[a.len - 2] != '\\');
    a.pos = head;
    frag_t f = head ? empty(&a) : any_bytes(&a);
    f = concat(&a, f, parse_alt(&a));
    if (!a.failed && a.pos < a.len && !(tail && a.pos == a.len - 1))
        fail(&a, "an unmatched ')'");
    if (!a.failed && !tail)
        f = concat(&a, f, any_bytes(&a));
    if (a.failed) {
        st = HPD_ERR_UNSUPPORTED;
        goto out;
    }
    const int32_t accept = f.end;
    d.words = (a.n + 63) / 64;
    d.sets = calloc((size_t)DFA_MAX * d.words, 8);
    stack = malloc(a.n * 2 * sizeof(*stack) + 64);
    cur = calloc(d.words, 8);
    dfa->trans = malloc((size_t)DFA_MAX * 256 * sizeof(*dfa->trans));
    if (d.sets == NULL || stack == NULL || cur == NULL || dfa->trans == NULL)
        goto out;
    cur[f.start / 64] |= 1ull << (f.start % 64);
    closure(&a, cur, stack);
    find_or_add(&d, cur);
    /* bytes that every edge takes alike share one column's work */
    uint64_t work = 0;
    uint8_t rep[256];
    int16_t cls_of[256];
    unsigned n_cls = 0;
    for (unsigned c = 0; c < 256; c++) {
        cls_of[c] = -1;
        for (unsigned r = 0; r < n_cls && cls_of[c] < 0; r++) {
            bool same = true;
            for (uint32_t i = 0; i < a.n && same; i++)
                same = (a.s[i].set[c / 32] >> (c % 32) & 1) == (a.s[i].set[rep[r] / 32] >> (rep[r] % 32) & 1);
            if (same)
                cls_of[c] = (int16_t)r;
        }
        if (cls_of[c] < 0) {
            cls_of[c] = (int16_t)n_cls;
            rep[n_cls++] = (uint8_t)c;
        }
    }
    for (uint32_t q = 0; q < d.n; q++) {
        for (unsigned c = 0; c < 256; c++) {
            if (cls_of[c] != (int16_t)c && rep[cls_of[c]] != c) {
                dfa->trans[(size_t)q * 256 + c] = dfa->trans[(size_t)q * 256 + rep[cls_of[c]]];
                continue;
            }
            /* a budget of NFA states visited: a pattern whose DFA would
             * take long to build is refused, not built on the event loop */
            if ((work += a.n) > DFA_WORK) {
                if (err != NULL)
                    snprintf(err, errlen, "pattern \"%.40s%s\" is too complex to compile (over %d "
                             "NFA state visits)", pattern, a.len > 40 ? "..." : "", DFA_WORK);
                st = HPD_ERR_UNSUPPORTED;
                goto out;
            }
            memset(cur, 0, d.words * 8);
            bool any = false;
            const uint64_t *from = &d.sets[(size_t)q * d.words];
            for (uint32_t i = 0; i < a.n; i++)
                if ((from[i / 64] >> (i % 64) & 1) && a.s[i].next >= 0 &&
                    (a.s[i].set[c / 32] >> (c % 32) & 1)) {
                    cur[a.s[i].next / 64] |= 1ull << (a.s[i].next % 64);
                    any = true;
                }
            int32_t to = -1;
            if (any) {
                closure(&a, cur, stack);
                if ((to = find_or_add(&d, cur)) == -2) {
                    if (err != NULL)
                        snprintf(err, errlen, "pattern \"%.40s%s\" needs over %d DFA states",
                                 pattern, a.len > 40 ? "..." : "", DFA_MAX);
                    st = HPD_ERR_UNSUPPORTED;
                    goto out;
                }
            }
            dfa->trans[(size_t)q * 256 + c] = to;
        }
    }
    dfa->n_states = d.n;
    dfa->accept = calloc(d.n, sizeof(*dfa->accept));
    if (dfa->accept == NULL)
        goto out;
    for (uint32_t q = 0; q < d.n; q++)
        dfa->accept[q] = d.sets[(size_t)q * d.words + accept / 64] >> (accept % 64) & 1;
    if (!minimize(dfa))
        goto out;
    st = HPD_OK;
out:
    if (st != HPD_OK)
        g_dfa_free(dfa);
    free(a.s);
    free(d.sets);
    free(stack);
    free(cur);
    return st;
}

void g_dfa_free(g_dfa_t *dfa)
{
    free(dfa->trans);
    free(dfa->accept);
    *dfa = (g_dfa_t){0};
}
