/* String patterns: the regular subset of ECMA-262 regexes that JSON Schema
 * uses, compiled to a Thompson NFA over UTF-8 bytes and then to a DFA
 * (docs/structured_outputs.md lists the subset). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/internal.h"

#define NFA_MAX 4096
#define DFA_MAX 4096
#define REPEAT_MAX 100

typedef struct {
    uint32_t set[8]; /* the bytes of the edge to .next */
    int32_t next;
    int32_t eps[2];
} nstate_t;

typedef struct {
    nstate_t *s;
    uint32_t n;
    const char *p; /* the pattern */
    size_t len, pos;
    char *err;
    size_t errlen;
    bool failed;
} nfa_t;

typedef struct {
    int32_t start, end;
} frag_t;

static bool fail(nfa_t *a, const char *what)
{
    if (!a->failed && a->err != NULL)
        snprintf(a->err, a->errlen, "pattern \"%s\": %s at offset %zu is not supported", a->p, what,
                 a->pos);
    a->failed = true;
    return false;
}

static int32_t new_state(nfa_t *a)
{
    if (a->n >= NFA_MAX) {
        fail(a, "a pattern this large");
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

/* Any character but those of the ASCII set `except`: ASCII bytes outside
 * it, or a whole multi-byte UTF-8 sequence (the string's frame has checked
 * its validity). */
static frag_t any_char(nfa_t *a, const uint32_t *except)
{
    uint32_t ascii[8] = {0}, cont[8] = {0}, l2[8] = {0}, l3[8] = {0}, l4[8] = {0};
    for (unsigned c = 0; c < 0x80; c++)
        if (!(except[c / 32] >> (c % 32) & 1))
            set_add(ascii, c, c);
    set_add(cont, 0x80, 0xbf);
    set_add(l2, 0xc2, 0xdf);
    set_add(l3, 0xe0, 0xef);
    set_add(l4, 0xf0, 0xf4);
    frag_t f = byte_frag(a, ascii);
    frag_t two = concat(a, byte_frag(a, l2), byte_frag(a, cont));
    frag_t three = concat(a, byte_frag(a, l3), concat(a, byte_frag(a, cont), byte_frag(a, cont)));
    frag_t four = concat(a, byte_frag(a, l4),
                         concat(a, byte_frag(a, cont), concat(a, byte_frag(a, cont), byte_frag(a, cont))));
    if (a->failed)
        return (frag_t){-1, -1};
    return alternate(a, alternate(a, f, two), alternate(a, three, four));
}

/* The ASCII set of a class escape (\d \w \s), negated for \D \W \S. */
static bool class_escape(char c, uint32_t *set, bool *neg_p)
{
    uint32_t s[8] = {0};
    switch (c | 0x20) {
    case 'd':
        set_add(s, '0', '9');
        break;
    case 'w':
        set_add(s, '0', '9');
        set_add(s, 'a', 'z');
        set_add(s, 'A', 'Z');
        set_add(s, '_', '_');
        break;
    case 's':
        set_add(s, ' ', ' ');
        set_add(s, '\t', '\r'); /* \t \n \v \f \r */
        break;
    default:
        return false;
    }
    *neg_p = c >= 'A' && c <= 'Z';
    for (int i = 0; i < 8; i++)
        set[i] |= s[i];
    return true;
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

static frag_t parse_alt(nfa_t *a);

/* [...]: ASCII members only. */
static frag_t parse_class(nfa_t *a)
{
    uint32_t set[8] = {0};
    bool neg = false;
    a->pos++; /* '[' */
    if (a->pos < a->len && a->p[a->pos] == '^') {
        neg = true;
        a->pos++;
    }
    bool first = true;
    while (a->pos < a->len && (a->p[a->pos] != ']' || first)) {
        first = false;
        int lo;
        unsigned char c = (unsigned char)a->p[a->pos];
        if (c >= 0x80) {
            fail(a, "a non-ASCII character in a class");
            return (frag_t){-1, -1};
        }
        if (c == '\\') {
            a->pos++;
            const char e = a->pos < a->len ? a->p[a->pos] : '\0';
            bool eneg = false;
            uint32_t es[8] = {0};
            if (class_escape(e, es, &eneg)) {
                if (eneg) {
                    fail(a, "a negated class escape inside a class");
                    return (frag_t){-1, -1};
                }
                for (int i = 0; i < 8; i++)
                    set[i] |= es[i];
                a->pos++;
                continue;
            }
            if ((lo = literal_escape(e)) < 0) {
                fail(a, "this escape");
                return (frag_t){-1, -1};
            }
        } else {
            lo = c;
        }
        a->pos++;
        int hi = lo;
        if (a->pos + 1 < a->len && a->p[a->pos] == '-' && a->p[a->pos + 1] != ']') {
            a->pos++;
            unsigned char h = (unsigned char)a->p[a->pos];
            if (h == '\\') {
                a->pos++;
                h = (unsigned char)(a->pos < a->len ? literal_escape(a->p[a->pos]) : -1);
            }
            if (h >= 0x80 || (int)h < lo) {
                fail(a, "this class range");
                return (frag_t){-1, -1};
            }
            hi = h;
            a->pos++;
        }
        set_add(set, (unsigned)lo, (unsigned)hi);
    }
    if (a->pos >= a->len) {
        fail(a, "an unterminated class");
        return (frag_t){-1, -1};
    }
    a->pos++; /* ']' */
    if (neg)
        return any_char(a, set);
    return byte_frag(a, set);
}

static frag_t parse_atom(nfa_t *a)
{
    const unsigned char c = (unsigned char)a->p[a->pos];
    uint32_t set[8] = {0};
    if (c == '(') {
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
        return f;
    }
    if (c == '[')
        return parse_class(a);
    if (c == '.') {
        a->pos++;
        set_add(set, '\n', '\n');
        set_add(set, '\r', '\r');
        return any_char(a, set);
    }
    if (c == '\\') {
        a->pos++;
        const char e = a->pos < a->len ? a->p[a->pos] : '\0';
        bool neg = false;
        if (class_escape(e, set, &neg)) {
            a->pos++;
            return neg ? any_char(a, set) : byte_frag(a, set);
        }
        const int l = literal_escape(e);
        if (l < 0) {
            fail(a, "this escape");
            return (frag_t){-1, -1};
        }
        a->pos++;
        set_add(set, (unsigned)l, (unsigned)l);
        return byte_frag(a, set);
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

hpd_status_t g_regex_compile(const char *pattern, g_dfa_t *dfa, char *err, size_t errlen)
{
    nfa_t a = {.p = pattern, .len = strlen(pattern), .err = err, .errlen = errlen};
    hpd_status_t st = HPD_ERR_NO_MEMORY;
    dstates_t d = {0};
    int32_t *stack = NULL;
    uint64_t *cur = NULL;
    *dfa = (g_dfa_t){0};
    if ((a.s = malloc(NFA_MAX * sizeof(*a.s))) == NULL)
        return HPD_ERR_NO_MEMORY;
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
    for (uint32_t q = 0; q < d.n; q++) {
        for (unsigned c = 0; c < 256; c++) {
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
                        snprintf(err, errlen, "pattern \"%s\" needs over %d DFA states", pattern,
                                 DFA_MAX);
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
    int32_t *shrunk = realloc(dfa->trans, (size_t)d.n * 256 * sizeof(*shrunk));
    if (shrunk != NULL)
        dfa->trans = shrunk;
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
