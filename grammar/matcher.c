/* The matcher: a set of stacks of frames, each one way the bytes so far can
 * be read, stepped one byte at a time (docs/structured_outputs.md). */
#include <stdlib.h>
#include <string.h>

#include "grammar/internal.h"

/* F_OBJECT states */
enum {
    O_EXPECT = 0, /* '{' */
    O_START,      /* after '{': a key or '}' */
    O_KEY,        /* a key's frame above */
    O_AFTER_KEY,  /* the key separator */
    O_KEY_SEP,    /* inside it (aux: bytes matched) */
    O_BEFORE_VALUE,
    O_VALUE, /* a value's frame above */
    O_AFTER_VALUE,
    O_ITEM_SEP,
    O_BEFORE_KEY,
    O_CLOSED,
};
/* F_ARRAY states (arrays and tuples) */
enum { A_EXPECT = 0, A_START, A_VALUE, A_AFTER, A_SEP, A_BEFORE, A_CLOSED };
/* F_STRING / F_KEY states (S_CHARS = 1 in internal.h) */
enum { ST_EXPECT = 0, ST_ESC = 2, ST_UTF8 = 3, ST_CLOSED = 4, ST_U = 5, ST_KU, ST_LOW1, ST_LOW2 };
/* F_NUMBER states */
enum { N_EXPECT = 0, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

/* UTF-8: the range of the first continuation byte after a lead byte */
enum { U_ANY = 0, U_A0BF, U_809F, U_90BF, U_808F };

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool set_reserve(g_set_t *s, uint32_t frames)
{
    if (s->used + frames <= s->cap)
        return true;
    uint32_t cap = s->cap ? s->cap : 64;
    while (cap < s->used + frames)
        cap *= 2;
    g_frame_t *buf = realloc(s->buf, (size_t)cap * sizeof(*buf));
    if (buf == NULL)
        return false;
    s->buf = buf;
    s->cap = cap;
    return true;
}

static bool emit(g_set_t *out, const g_frame_t *f, uint32_t d)
{
    if (!set_reserve(out, d + 1))
        return false;
    out->buf[out->used] = (g_frame_t){.node = d};
    memcpy(&out->buf[out->used + 1], f, (size_t)d * sizeof(*f));
    out->used += d + 1;
    out->n++;
    return true;
}

bool g_set_copy(g_set_t *dst, const g_set_t *src)
{
    dst->used = dst->n = 0;
    if (!set_reserve(dst, src->used))
        return false;
    memcpy(dst->buf, src->buf, (size_t)src->used * sizeof(*src->buf));
    dst->used = src->used;
    dst->n = src->n;
    return true;
}

void g_set_free(g_set_t *s)
{
    free(s->buf);
    *s = (g_set_t){0};
}

static const g_node_t *resolve(const hpd_grammar_t *g, uint32_t node)
{
    const g_node_t *n = &g->nodes[node];
    for (uint32_t hops = 0; n->kind == G_REF && hops < g->n_nodes; hops++)
        n = &g->nodes[n->target];
    return n;
}

static bool completable(const hpd_grammar_t *g, const g_frame_t *t)
{
    switch (t->kind) {
    case F_OBJECT:
        return t->st == O_CLOSED;
    case F_ARRAY:
        return t->st == A_CLOSED;
    case F_STRING:
    case F_KEY:
        return t->st == ST_CLOSED;
    case F_NUMBER:
        return t->st == N_ZERO || t->st == N_INT || t->st == N_FRAC || t->st == N_EXP;
    case F_LITERAL:
        return t->a == g->lits[t->b].len;
    case F_SEQ:
        return t->a == g->nodes[t->node].n_alts;
    case F_TEXT: {
        const g_node_t *n = &g->nodes[t->node];
        return t->a >= n->min_len && (n->dfa == G_NONE || g->dfas[n->dfa].accept[t->b]);
    }
    default:
        return false;
    }
}

/* A completed child's parent moves on. */
static void child_done(const hpd_grammar_t *g, g_frame_t *p)
{
    if (p->kind == F_OBJECT) {
        if (p->st == O_KEY) {
            p->st = O_AFTER_KEY;
            p->a = p->b == G_NONE ? g->nodes[p->node].n_props : p->b + 1;
        } else {
            p->st = O_AFTER_VALUE;
        }
    } else if (p->kind == F_ARRAY) {
        p->st = A_AFTER;
        p->a++;
    } else if (p->kind == F_SEQ) {
        p->a++;
    }
}

static bool step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out);

/* Pushes the value `node` above f[0..d) and steps it by c. */
static bool push_value(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint32_t node, uint8_t c,
                       g_set_t *out)
{
    if (d >= G_MAX_DEPTH)
        return true; /* too deep: no way on */
    f[d] = (g_frame_t){.kind = F_VALUE, .node = node};
    return step(g, f, d + 1, c, out);
}

/* The element node of an array or tuple frame at its item t->a. */
static uint32_t element(const hpd_grammar_t *g, const g_frame_t *t, uint32_t *min_p, uint32_t *max_p)
{
    const g_node_t *n = &g->nodes[t->node];
    if (n->kind == G_TUPLE) {
        *min_p = *max_p = n->n_alts;
        return t->a < n->n_alts ? g->alts[n->alt0 + t->a] : G_NONE;
    }
    *min_p = n->min_items;
    *max_p = n->max_items;
    return n->items;
}

static bool object_may_close(const hpd_grammar_t *g, const g_frame_t *t)
{
    const g_node_t *n = &g->nodes[t->node];
    for (uint32_t j = t->a; j < n->n_props; j++)
        if (g->props[n->prop0 + j].required)
            return false;
    return true;
}

/* A key may still come: a property not yet passed, or an additional one. */
static bool object_may_add(const hpd_grammar_t *g, const g_frame_t *t)
{
    const g_node_t *n = &g->nodes[t->node];
    return t->a < n->n_props || n->additional != G_NONE;
}

/* A key starts (its '"' is c): one stack per key it may be. */
static bool object_keys(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const g_node_t *n = &g->nodes[t->node];
    if (d >= G_MAX_DEPTH)
        return true;
    t->st = O_KEY;
    bool required_left = false;
    for (uint32_t j = t->a; j < n->n_props && !required_left; j++) {
        const g_prop_t *pr = &g->props[n->prop0 + j];
        t->b = j;
        f[d] = (g_frame_t){.kind = F_LITERAL, .a = 1, .b = pr->name_lit};
        if (!emit(out, f, d + 1))
            return false;
        required_left = pr->required;
    }
    if (!required_left && n->additional != G_NONE) {
        t->b = G_NONE;
        /* b: the state in the trie of declared keys (none: no such key) */
        f[d] = (g_frame_t){.kind = F_KEY, .node = t->node, .st = S_CHARS,
                           .b = n->names == G_NONE ? G_NONE : 0};
        if (!emit(out, f, d + 1))
            return false;
    }
    return true;
}

/* A separator byte: into `sep_state` with aux 1, or straight to `after`
 * when the separator is one byte. */
static void sep_begin(g_frame_t *t, const char *sep, uint8_t sep_state, uint8_t after)
{
    t->aux = 1;
    t->st = sep[1] == '\0' ? after : sep_state;
}

static void sep_next(g_frame_t *t, const char *sep, uint8_t after)
{
    t->aux++;
    if (sep[t->aux] == '\0')
        t->st = after;
}

static bool object_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const bool ws = g->fmt.whitespace_flexible && is_ws(c);
    switch (t->st) {
    case O_EXPECT:
        if (c != '{')
            return true;
        t->st = O_START;
        return emit(out, f, d);
    case O_START:
    case O_BEFORE_KEY:
        if (ws)
            return emit(out, f, d);
        if (c == '"')
            return object_keys(g, f, d, out);
        if (c == '}' && t->st == O_START && object_may_close(g, t)) {
            t->st = O_CLOSED;
            return emit(out, f, d);
        }
        return true;
    case O_AFTER_KEY:
        if (ws)
            return emit(out, f, d);
        if ((uint8_t)g->key_sep[0] != c)
            return true;
        sep_begin(t, g->key_sep, O_KEY_SEP, O_BEFORE_VALUE);
        return emit(out, f, d);
    case O_KEY_SEP:
        if ((uint8_t)g->key_sep[t->aux] != c)
            return true;
        sep_next(t, g->key_sep, O_BEFORE_VALUE);
        return emit(out, f, d);
    case O_BEFORE_VALUE: {
        if (ws)
            return emit(out, f, d);
        const g_node_t *n = &g->nodes[t->node];
        const uint32_t v = t->b == G_NONE ? n->additional : g->props[n->prop0 + t->b].value;
        t->st = O_VALUE;
        return push_value(g, f, d, v, c, out);
    }
    case O_AFTER_VALUE:
        if (ws)
            return emit(out, f, d);
        if (c == '}' && object_may_close(g, t)) {
            t->st = O_CLOSED;
            return emit(out, f, d);
        }
        if ((uint8_t)g->item_sep[0] != c || !object_may_add(g, t))
            return true;
        sep_begin(t, g->item_sep, O_ITEM_SEP, O_BEFORE_KEY);
        return emit(out, f, d);
    case O_ITEM_SEP:
        if ((uint8_t)g->item_sep[t->aux] != c)
            return true;
        sep_next(t, g->item_sep, O_BEFORE_KEY);
        return emit(out, f, d);
    default:
        return true;
    }
}

static bool array_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const bool ws = g->fmt.whitespace_flexible && is_ws(c);
    uint32_t min, max;
    const uint32_t el = element(g, t, &min, &max);
    switch (t->st) {
    case A_EXPECT:
        if (c != '[')
            return true;
        t->st = A_START;
        return emit(out, f, d);
    case A_START:
    case A_AFTER:
        if (ws)
            return emit(out, f, d);
        if (c == ']' && t->a >= min) {
            t->st = A_CLOSED;
            return emit(out, f, d);
        }
        if (t->st == A_START) {
            if (t->a >= max || el == G_NONE)
                return true;
            t->st = A_VALUE;
            return push_value(g, f, d, el, c, out);
        }
        if ((uint8_t)g->item_sep[0] != c || t->a >= max)
            return true;
        sep_begin(t, g->item_sep, A_SEP, A_BEFORE);
        return emit(out, f, d);
    case A_SEP:
        if ((uint8_t)g->item_sep[t->aux] != c)
            return true;
        sep_next(t, g->item_sep, A_BEFORE);
        return emit(out, f, d);
    case A_BEFORE:
        if (ws)
            return emit(out, f, d);
        if (el == G_NONE)
            return true;
        t->st = A_VALUE;
        return push_value(g, f, d, el, c, out);
    default:
        return true;
    }
}

/* The byte an escape letter stands for, or -1 for one JSON strings here do
 * not allow (\u and \/ are refused, as llguidance does by default). */
static int unescape(uint8_t c)
{
    switch (c) {
    case '"':
        return '"';
    case '\\':
        return '\\';
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    default:
        return -1;
    }
}

/* Some escape's byte is allowed by the string's pattern: a letter's, or a
 * control character's (\u0000-\u001f, \u007f). */
static bool escape_possible(const hpd_grammar_t *g, const g_frame_t *t)
{
    static const char letters[] = "\"\\bfnrt";
    const g_node_t *n = &g->nodes[t->node];
    if (n->dfa == G_NONE)
        return true;
    const int32_t *tr = &g->dfas[n->dfa].trans[(size_t)t->b * 256];
    for (const char *l = letters; *l; l++)
        if (tr[(uint8_t)unescape((uint8_t)*l)] >= 0)
            return true;
    for (unsigned c = 0; c < 0x20; c++)
        if (tr[c] >= 0)
            return true;
    return tr[0x7f] >= 0;
}

static bool string_feed(const hpd_grammar_t *g, g_frame_t *t, uint8_t byte);
static int hex_digit(uint8_t c);

/* \uXXXX in a key that must differ from an object's declared ones: any
 * code unit, a high surrogate followed by \u and a low one, never a lone
 * surrogate (llguidance's rule there). aux: digits so far (bits 0-1), a
 * low surrogate expected (bit 2); a: the digits' value. */
static bool key_unicode_step(const hpd_grammar_t *g, g_frame_t *t, uint8_t c)
{
    const int h = hex_digit(c);
    const unsigned k = t->aux & 3, low = t->aux & 4;
    if (h < 0 || (k == 0 && low && h != 0xd) || (k == 1 && low && h < 0xc) ||
        (k == 1 && !low && t->a == 0xd && h >= 0xc) || !string_feed(g, t, c))
        return false;
    t->a = t->a << 4 | (uint32_t)h;
    if (k < 3) {
        t->aux = (uint16_t)((k + 1) | low);
        return true;
    }
    t->st = !low && t->a >= 0xd800 && t->a <= 0xdbff ? ST_LOW1 : S_CHARS;
    t->aux = 0;
    return true;
}

static int hex_digit(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* \uXXXX: only a control character's (U+0000-U+001F, U+007F), as
 * llguidance allows by default; aux counts the digits, then holds the
 * third. */
static bool unicode_escape_step(const hpd_grammar_t *g, g_frame_t *t, uint8_t c)
{
    const int h = hex_digit(c);
    const unsigned k = t->aux & 3;
    if (h < 0)
        return false;
    if (k < 2) {
        if (h != 0)
            return false;
        t->aux = (uint16_t)(k + 1);
        return t->kind != F_KEY || string_feed(g, t, c);
    }
    if (k == 2) {
        if (h != 0 && h != 1 && h != 7)
            return false;
        t->aux = (uint16_t)(3 | h << 2);
        return t->kind != F_KEY || string_feed(g, t, c);
    }
    const int hi = t->aux >> 2;
    if (hi == 7 && h != 0xf)
        return false;
    t->st = S_CHARS;
    t->aux = 0;
    return string_feed(g, t, t->kind == F_KEY ? c : (uint8_t)(hi << 4 | h));
}

/* Feeds a decoded byte to a string's pattern DFA (b: its state), or a raw
 * byte to a key's trie of declared names (b: its state, G_NONE once it
 * left every name). */
static bool string_feed(const hpd_grammar_t *g, g_frame_t *t, uint8_t byte)
{
    if (t->kind == F_KEY) {
        if (t->b != G_NONE) {
            const g_ntrie_t *nt = &g->ntries[g->nodes[t->node].names];
            const uint32_t nx = nt->next[(size_t)t->b * 256 + byte];
            t->b = nx != 0 ? nx : G_NONE;
        }
        return true;
    }
    const g_node_t *n = &g->nodes[t->node];
    if (n->dfa == G_NONE)
        return true;
    const int32_t nx = g->dfas[n->dfa].trans[(size_t)t->b * 256 + byte];
    if (nx < 0)
        return false;
    t->b = (uint32_t)nx;
    return true;
}

/* A character starts: counted against maxLength. */
static bool string_char(const hpd_grammar_t *g, g_frame_t *t)
{
    t->a++;
    return t->kind == F_KEY || t->a <= g->nodes[t->node].max_len;
}

static bool string_close_ok(const hpd_grammar_t *g, const g_frame_t *t)
{
    if (t->kind == F_KEY) {
        if (t->b == G_NONE)
            return true;
        return !g->ntries[g->nodes[t->node].names].end[t->b];
    }
    const g_node_t *n = &g->nodes[t->node];
    return t->a >= n->min_len && (n->dfa == G_NONE || g->dfas[n->dfa].accept[t->b]);
}

int g_string_advance(const hpd_grammar_t *g, g_frame_t *t, uint8_t c)
{
    const bool key = t->kind == F_KEY;
    switch (t->st) {
    case S_CHARS:
        if (c == '"') {
            if (!string_close_ok(g, t))
                return G_ADV_REJECT;
            t->st = ST_CLOSED;
            return G_ADV_CLOSE;
        }
        if (c == '\\') {
            if (!string_char(g, t) || (key && !string_feed(g, t, c)) ||
                (!key && !escape_possible(g, t)))
                return G_ADV_REJECT;
            t->st = ST_ESC;
            return G_ADV_OK;
        }
        if (c < 0x20 || c == 0x7f)
            return G_ADV_REJECT;
        if (c < 0x80) {
            if (!string_char(g, t) || !string_feed(g, t, c))
                return G_ADV_REJECT;
            return G_ADV_OK;
        }
        /* a UTF-8 lead byte: no overlongs (C0, C1, E0 80-9F, F0 80-8F),
         * no surrogates (ED A0-BF), nothing past U+10FFFF */
        if (c < 0xc2 || c > 0xf4)
            return G_ADV_REJECT;
        if (!string_char(g, t) || !string_feed(g, t, c))
            return G_ADV_REJECT;
        t->st = ST_UTF8;
        if (c < 0xe0)
            t->aux = 1 | U_ANY << 2;
        else if (c < 0xf0)
            t->aux = 2 | (c == 0xe0 ? U_A0BF : c == 0xed ? U_809F : U_ANY) << 2;
        else
            t->aux = 3 | (c == 0xf0 ? U_90BF : c == 0xf4 ? U_808F : U_ANY) << 2;
        return G_ADV_OK;
    case ST_UTF8: {
        const unsigned range = t->aux >> 2;
        const uint8_t lo = range == U_A0BF ? 0xa0 : range == U_90BF ? 0x90 : 0x80;
        const uint8_t hi = range == U_809F ? 0x9f : range == U_808F ? 0x8f : 0xbf;
        if (c < lo || c > hi || !string_feed(g, t, c))
            return G_ADV_REJECT;
        const unsigned left = (t->aux & 3) - 1;
        t->aux = (uint16_t)left;
        if (left == 0)
            t->st = S_CHARS;
        return G_ADV_OK;
    }
    case ST_U:
        if (!unicode_escape_step(g, t, c))
            return G_ADV_REJECT;
        return G_ADV_OK;
    case ST_KU:
        if (!key_unicode_step(g, t, c))
            return G_ADV_REJECT;
        return G_ADV_OK;
    case ST_LOW1:
    case ST_LOW2:
        if (c != (t->st == ST_LOW1 ? '\\' : 'u') || !string_feed(g, t, c))
            return G_ADV_REJECT;
        t->st = t->st == ST_LOW1 ? ST_LOW2 : ST_KU;
        t->aux = t->st == ST_KU ? 4 : 0;
        t->a = 0;
        return G_ADV_OK;
    case ST_ESC: {
        if (c == 'u') {
            if (key && !string_feed(g, t, c))
                return G_ADV_REJECT;
            /* a key beside declared ones takes any code unit */
            t->st = key && g->nodes[t->node].names != G_NONE ? ST_KU : ST_U;
            t->aux = 0;
            if (t->st == ST_KU)
                t->a = 0; /* the code unit's value (a key counts no characters) */
            return G_ADV_OK;
        }
        const int u = unescape(c);
        if (u < 0 || !string_feed(g, t, key ? c : (uint8_t)u))
            return G_ADV_REJECT;
        t->st = S_CHARS;
        return G_ADV_OK;
    }
    default:
        return G_ADV_REJECT;
    }
}

static bool string_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    if (t->st == ST_EXPECT) {
        if (c != '"')
            return true;
        t->st = S_CHARS;
        return emit(out, f, d);
    }
    return g_string_advance(g, t, c) == G_ADV_REJECT || emit(out, f, d);
}

static bool number_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const bool integer = g->nodes[t->node].integer;
    const bool digit = c >= '0' && c <= '9';
    uint8_t next;
    switch (t->st) {
    case N_EXPECT:
    case N_MINUS:
        if (c == '-' && t->st == N_EXPECT)
            next = N_MINUS;
        else if (c == '0')
            next = N_ZERO;
        else if (digit)
            next = N_INT;
        else
            return true;
        break;
    case N_ZERO:
    case N_INT:
        if (digit && t->st == N_INT)
            next = N_INT;
        else if (c == '.' && !integer)
            next = N_DOT;
        else if ((c == 'e' || c == 'E') && !integer)
            next = N_E;
        else
            return true;
        break;
    case N_DOT:
        if (!digit)
            return true;
        next = N_FRAC;
        break;
    case N_FRAC:
        if (digit)
            next = N_FRAC;
        else if (c == 'e' || c == 'E')
            next = N_E;
        else
            return true;
        break;
    case N_E:
        if (c == '+' || c == '-')
            next = N_ESIGN;
        else if (digit)
            next = N_EXP;
        else
            return true;
        break;
    case N_ESIGN:
    case N_EXP:
        if (!digit)
            return true;
        next = N_EXP;
        break;
    default:
        return true;
    }
    t->st = next;
    return emit(out, f, d);
}

static bool literal_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const g_lit_t *l = &g->lits[t->b];
    if (t->a >= l->len || g->bytes[l->off + t->a] != c)
        return true;
    t->a++;
    return emit(out, f, d);
}

/* A sequence: its next part begins with c. */
static bool seq_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    const g_frame_t *t = &f[d - 1];
    const g_node_t *n = &g->nodes[t->node];
    if (t->a >= n->n_alts)
        return true;
    return push_value(g, f, d, g->alts[n->alt0 + t->a], c, out);
}

/* Text that must not contain the terminator: a holds how much of it the
 * text ends with (KMP), and a byte that would complete it is refused. */
static bool text_step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const g_node_t *n = &g->nodes[t->node];
    const g_lit_t *l = &g->lits[n->lit];
    const uint8_t *term = g->bytes + l->off;
    uint32_t m = t->st; /* the terminator's bytes the text ends with */
    for (;;) {
        if (term[m] == c) {
            m++;
            break;
        }
        if (m == 0)
            break;
        /* the longest proper border of term[0..m) */
        uint32_t b = m - 1;
        while (b > 0 && memcmp(term, term + m - b, b) != 0)
            b--;
        m = b;
    }
    if (m == l->len)
        return true; /* the text cannot hold its terminator */
    /* c is the value's: a character counted at its first byte, and the
     * pattern's DFA (a: characters, b: its state) */
    if ((c & 0xc0) != 0x80 && ++t->a > n->max_len)
        return true;
    if (n->dfa != G_NONE) {
        const int32_t nx = g->dfas[n->dfa].trans[(size_t)t->b * 256 + c];
        if (nx < 0)
            return true;
        t->b = (uint32_t)nx;
    }
    t->st = (uint8_t)m;
    return emit(out, f, d);
}

/* The concrete frame a value node starts as. */
static g_frame_t start_frame(const hpd_grammar_t *g, uint32_t node)
{
    const g_node_t *n = resolve(g, node);
    const uint32_t id = (uint32_t)(n - g->nodes);
    switch (n->kind) {
    case G_OBJECT:
        return (g_frame_t){.kind = F_OBJECT, .node = id};
    case G_ARRAY:
    case G_TUPLE:
        return (g_frame_t){.kind = F_ARRAY, .node = id};
    case G_STRING:
        return (g_frame_t){.kind = F_STRING, .node = id};
    case G_NUMBER:
        return (g_frame_t){.kind = F_NUMBER, .node = id};
    case G_LITERAL:
        return (g_frame_t){.kind = F_LITERAL, .node = id, .b = n->lit};
    case G_SEQ:
        return (g_frame_t){.kind = F_SEQ, .node = id};
    case G_TEXT:
        return (g_frame_t){.kind = F_TEXT, .node = id};
    default: /* a $ref that leads only to itself: nothing matches */
        return (g_frame_t){.kind = F_DEAD, .node = id};
    }
}

/* Steps the stack f[0..d) by c, emitting every stack that results. f is
 * the caller's scratch: it is as it was on return. */
static bool step(const hpd_grammar_t *g, g_frame_t *f, uint32_t d, uint8_t c, g_set_t *out)
{
    g_frame_t *t = &f[d - 1];
    const g_frame_t saved = *t;
    bool ok = true;

    if (t->kind == F_VALUE) {
        const g_node_t *n = resolve(g, t->node);
        if (n->kind == G_ANYOF) {
            /* aux counts the any-ofs entered without a byte: a cycle of
             * them (anyOf with a $ref to itself) matches nothing */
            for (uint32_t i = 0; i < n->n_alts && ok && saved.aux < G_MAX_DEPTH; i++) {
                const uint32_t alt = g->alts[n->alt0 + i];
                if (!(g->first[alt][c / 32] >> (c % 32) & 1))
                    continue; /* c cannot start it */
                *t = (g_frame_t){.kind = F_VALUE, .node = alt, .aux = (uint16_t)(saved.aux + 1)};
                ok = step(g, f, d, c, out);
            }
            *t = saved;
            return ok;
        }
        *t = start_frame(g, t->node);
        ok = step(g, f, d, c, out);
        *t = saved;
        return ok;
    }
    switch (t->kind) {
    case F_OBJECT:
        ok = object_step(g, f, d, c, out);
        break;
    case F_ARRAY:
        ok = array_step(g, f, d, c, out);
        break;
    case F_STRING:
    case F_KEY:
        ok = string_step(g, f, d, c, out);
        break;
    case F_NUMBER:
        ok = number_step(g, f, d, c, out);
        break;
    case F_LITERAL:
        ok = literal_step(g, f, d, c, out);
        break;
    case F_SEQ:
        ok = seq_step(g, f, d, c, out);
        break;
    case F_TEXT:
        ok = text_step(g, f, d, c, out);
        break;
    default:
        break;
    }
    *t = saved;
    /* or the frame is whole, and the byte is its parent's */
    if (ok && d > 1 && completable(g, t)) {
        g_frame_t *p = &f[d - 2];
        const g_frame_t psaved = *p;
        child_done(g, p);
        ok = step(g, f, d - 1, c, out);
        *p = psaved;
    }
    return ok;
}

/* Drops stacks equal to an earlier one (any-of alternatives that read the
 * bytes alike). */
static void dedup(g_set_t *s)
{
    if (s->n < 2)
        return;
    uint32_t w = 0, n = 0;
    for (uint32_t r = 0; r < s->used;) {
        const uint32_t len = s->buf[r].node + 1;
        bool dup = false;
        for (uint32_t q = 0; q < w && !dup;) {
            const uint32_t qlen = s->buf[q].node + 1;
            dup = qlen == len && memcmp(&s->buf[q], &s->buf[r], len * sizeof(g_frame_t)) == 0;
            q += qlen;
        }
        if (!dup) {
            memmove(&s->buf[w], &s->buf[r], len * sizeof(g_frame_t));
            w += len;
            n++;
        }
        r += len;
    }
    s->used = w;
    s->n = n;
}

bool g_set_step(const hpd_grammar_t *g, const g_set_t *in, uint8_t byte, g_set_t *out)
{
    g_frame_t scratch[G_MAX_DEPTH + 1];
    out->n = out->used = 0;
    for (uint32_t r = 0; r < in->used;) {
        const uint32_t d = in->buf[r].node;
        memcpy(scratch, &in->buf[r + 1], (size_t)d * sizeof(g_frame_t));
        if (!step(g, scratch, d, byte, out))
            return false;
        r += d + 1;
    }
    dedup(out);
    return true;
}

bool g_set_can_end(const hpd_grammar_t *g, const g_set_t *s)
{
    g_frame_t f[G_MAX_DEPTH + 1];
    for (uint32_t r = 0; r < s->used;) {
        uint32_t d = s->buf[r].node;
        memcpy(f, &s->buf[r + 1], (size_t)d * sizeof(*f));
        r += d + 1;
        /* whole frames pop, their parents move on (a sequence's last part) */
        while (d > 1 && completable(g, &f[d - 1])) {
            child_done(g, &f[d - 2]);
            d--;
        }
        if (d == 1 && completable(g, &f[0]))
            return true;
    }
    return false;
}

hpd_status_t hpd_matcher_create(const hpd_grammar_t *g, hpd_matcher_t **m_p)
{
    hpd_matcher_t *m = calloc(1, sizeof(*m));
    const g_frame_t root = {.kind = F_VALUE, .node = g->root};
    if (m == NULL || !emit(&m->cur, &root, 1)) {
        free(m);
        return HPD_ERR_NO_MEMORY;
    }
    m->g = g;
    *m_p = m;
    return HPD_OK;
}

void hpd_matcher_destroy(hpd_matcher_t *m)
{
    if (m == NULL)
        return;
    g_set_free(&m->cur);
    g_set_free(&m->tmp);
    g_set_free(&m->next);
    g_set_free(&m->forced);
    g_set_free(&m->handoff);
    for (uint32_t i = 0; i < m->n_dcache; i++)
        free(m->dcache[i].mask);
    free(m->sframes);
    for (uint32_t i = 0; i < m->n_levels; i++)
        g_set_free(&m->levels[i]);
    free(m->levels);
    free(m);
}

bool hpd_matcher_accept_bytes(hpd_matcher_t *m, const uint8_t *bytes, size_t n)
{
    /* cur -> tmp -> next -> tmp ...: cur is left as it was unless every
     * byte is taken, then the last set becomes it (no allocation a token) */
    if (m->ended)
        return false;
    if (n == 0)
        return true;
    const g_set_t *from = &m->cur;
    g_set_t *to = &m->tmp;
    for (size_t i = 0; i < n; i++) {
        if (!g_set_step(m->g, from, bytes[i], to) || to->n == 0)
            return false;
        from = to;
        to = to == &m->tmp ? &m->next : &m->tmp;
    }
    g_set_t *last = (g_set_t *)from, t = m->cur;
    m->cur = *last;
    *last = t;
    return true;
}

bool hpd_matcher_can_end(const hpd_matcher_t *m)
{
    return !m->ended && g_set_can_end(m->g, &m->cur);
}

bool hpd_matcher_must_end(const hpd_matcher_t *m)
{
    if (!hpd_matcher_can_end(m))
        return false;
    g_set_t out = {0};
    bool more = false;
    for (unsigned c = 0; c < 256 && !more; c++)
        more = g_set_step(m->g, &m->cur, (uint8_t)c, &out) && out.n > 0;
    g_set_free(&out);
    return !more;
}

bool hpd_matcher_ended(const hpd_matcher_t *m)
{
    return m->ended;
}
