/* The grammar's nodes, the regex DFAs of string patterns and the matcher's
 * frames: shared by schema.c, regex.c, matcher.c and mask.c. */
#ifndef HPD_GRAMMAR_INTERNAL_H
#define HPD_GRAMMAR_INTERNAL_H

#include "grammar/grammar.h"

#define G_NONE UINT32_MAX
#define G_MAX_DEPTH 128     /* frames on one stack: deeper documents are refused */
#define G_MAX_SEP 7

typedef enum {
    G_REF,     /* another node (a $ref, resolved): .target */
    G_ANYOF,   /* .alts[0..n_alts) */
    G_OBJECT,  /* .props[0..n_props) in order, then .additional (G_NONE: none) */
    G_ARRAY,   /* .items, min_items..max_items */
    G_TUPLE,   /* exactly .alts[0..n_alts) (a const array) */
    G_STRING,  /* min_len..max_len characters, .dfa (G_NONE: any) */
    G_NUMBER,  /* .integer: no fraction or exponent */
    G_LITERAL, /* exactly lit[0..lit_len) (true, false, null, a const) */
    G_SEQ,     /* .alts[0..n_alts) one after the other (a tool call's parts) */
    G_TEXT,    /* text that does not contain literal .lit (a tool call's string value),
                  min_len..max_len characters, .dfa (G_NONE: any) */
} g_kind_t;

typedef struct {
    uint32_t name_lit; /* the key with its quotes, as a literal */
    uint32_t value;
    bool required;
} g_prop_t;

typedef struct {
    g_kind_t kind;
    uint32_t target;               /* G_REF */
    uint32_t alt0, n_alts;         /* G_ANYOF, G_TUPLE: into g->alts */
    uint32_t prop0, n_props;       /* G_OBJECT: into g->props */
    uint32_t additional;           /* G_OBJECT */
    uint32_t names;                /* G_OBJECT: the keys' trie (into g->ntrie), G_NONE if no props */
    uint32_t items;                /* G_ARRAY */
    uint32_t min_items, max_items; /* G_ARRAY */
    uint32_t min_len, max_len;     /* G_STRING, G_TEXT */
    uint32_t dfa;                  /* G_STRING, G_TEXT */
    bool integer;                  /* G_NUMBER */
    uint32_t lit;                  /* G_LITERAL: into g->lits */
} g_node_t;

typedef struct {
    uint32_t off, len; /* into g->bytes */
} g_lit_t;

/* A byte DFA: trans[state * 256 + byte] is the next state or -1. */
typedef struct {
    uint32_t n_states;
    int32_t *trans;
    bool *accept;
} g_dfa_t;

/* A trie of an object's key bytes (without quotes): next[state*256+b],
 * 0 = no edge (state 0 is the root and never a target); end[state]: a key
 * ends here. */
typedef struct {
    uint32_t n_states;
    uint32_t *next;
    bool *end;
} g_ntrie_t;

struct hpd_grammar {
    int refs; /* atomic */
    int32_t after_token; /* -1: none */
    hpd_grammar_format_t fmt;
    char item_sep[G_MAX_SEP + 1], key_sep[G_MAX_SEP + 1];
    uint32_t root;
    g_node_t *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *alts;
    uint32_t n_alts, cap_alts;
    g_prop_t *props;
    uint32_t n_props, cap_props;
    g_lit_t *lits;
    uint32_t n_lits, cap_lits;
    uint8_t *bytes;
    uint32_t n_bytes, cap_bytes;
    g_dfa_t *dfas;
    uint32_t n_dfas;
    g_ntrie_t *ntries;
    uint32_t n_ntries;
    /* per node, the bytes its values may start with (all for one that may
     * be empty): an any-of tries only the alternatives a byte can start */
    uint32_t (*first)[8];
};

/* Fills g->first (after the last node is added); false on no memory. */
bool g_first_bytes(hpd_grammar_t *g);

/* A frame of a matcher's stack (16 bytes: stacks are copied per byte). */
typedef struct {
    uint32_t node;
    uint8_t kind; /* f_kind_t */
    uint8_t st;   /* the frame's state */
    uint16_t aux; /* a separator's position, UTF-8 continuation bytes */
    uint32_t a;   /* items so far, next property, literal position, characters */
    uint32_t b;   /* the chosen key, a DFA or key-trie state */
} g_frame_t;

/* A set of stacks, packed: n stacks, each its depth then its frames. */
typedef struct {
    uint32_t n;
    uint32_t used, cap; /* in frames (a depth takes one frame's room) */
    g_frame_t *buf;
} g_set_t;

/* The frames of any string (what the mask's shortcut for plain tokens
 * needs to recognise). */
enum { F_VALUE = 0, F_OBJECT, F_ARRAY, F_STRING, F_KEY, F_NUMBER, F_LITERAL, F_DEAD, F_SEQ, F_TEXT };
enum { S_CHARS = 1 }; /* F_STRING / F_KEY: inside, at a character boundary */

/* Grammar building (schema.c) */
uint32_t g_add_node(hpd_grammar_t *g, const g_node_t *n);
uint32_t g_add_lit(hpd_grammar_t *g, const uint8_t *bytes, uint32_t len);
hpd_grammar_t *g_new(const hpd_grammar_format_t *format);
/* the node of any JSON value (built once per grammar), and in *object_p
 * (may be NULL) its alternative of any object */
uint32_t g_any(hpd_grammar_t *g, uint32_t *object_p);

/* Regexes (regex.c): a pattern compiled to a DFA over the string's decoded
 * UTF-8 bytes, unanchored unless it starts with ^ / ends with $.
 * HPD_ERR_UNSUPPORTED with err naming what is not in the subset. */
hpd_status_t g_regex_compile(const char *pattern, g_dfa_t *dfa, char *err, size_t errlen);
void g_dfa_free(g_dfa_t *dfa);

/* The matcher's step (matcher.c): the stacks of in after one byte, into
 * out (cleared first). False on no memory. */
bool g_set_step(const hpd_grammar_t *g, const g_set_t *in, uint8_t byte, g_set_t *out);
bool g_set_copy(g_set_t *dst, const g_set_t *src);
bool g_set_can_end(const hpd_grammar_t *g, const g_set_t *s);

/* A string or key frame inside its quotes (st not ST_EXPECT) after byte c:
 * refused, still inside, or closed by it (the frame updated unless
 * refused). What the mask's walk of a string steps without a set. */
enum { G_ADV_REJECT = 0, G_ADV_OK, G_ADV_CLOSE };
int g_string_advance(const hpd_grammar_t *g, g_frame_t *t, uint8_t c);
/* F_STRING / F_KEY states before the opening quote and after the closing one */
enum { S_EXPECT = 0, S_CLOSED = 4 };
void g_set_free(g_set_t *s);

/* A pattern DFA state's mask of plain tokens (mask.c). */
#define G_DFA_CACHE 16
typedef struct {
    uint32_t dfa, state;
    uint32_t *mask;
} g_dcache_t;

struct hpd_matcher {
    const hpd_grammar_t *g;
    g_set_t cur, tmp;
    g_set_t next;   /* accept_bytes' second set (the two alternate) */
    g_set_t forced; /* after the forced bytes (mask.c) */
    bool ended;
    /* the mask's per-depth sets (mask.c), and its per-depth string frames
     * and the stack a closing quote hands on */
    g_set_t *levels;
    uint32_t n_levels;
    g_frame_t *sframes;
    uint32_t n_sframes;
    g_set_t handoff;
    g_dcache_t dcache[G_DFA_CACHE];
    uint32_t n_dcache;
};

#endif
