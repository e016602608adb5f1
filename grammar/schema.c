/* JSON Schema to the grammar's nodes: the keywords of
 * docs/structured_outputs.md, every other one refused by name. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "grammar/internal.h"

#define LOG_COMPONENT "grammar"
#define MAX_NODES 100000
#define MAX_PATH 256

/* Keywords that only describe: ignored. */
static const char *const annotations[] = {
    "title",     "description", "$schema", "$id",      "$comment", "default",
    "examples",  "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions",
};
/* Keywords compiled. */
static const char *const supported[] = {
    "type",  "properties", "required", "additionalProperties", "enum",      "const",
    "items", "minItems",   "maxItems", "anyOf",                "$ref",      "pattern",
    "minLength", "maxLength",
};

typedef struct {
    json_t *schema;
    uint32_t node;
} memo_t;

typedef struct {
    hpd_grammar_t *g;
    json_t *root;
    memo_t *memo;
    uint32_t n_memo, cap_memo;
    char path[MAX_PATH];
    char *err;
    size_t errlen;
    hpd_status_t st;
    uint32_t any, any_object;
} compiler_t;

#define GROW(arr, n, cap)                                                        \
    ((n) < (cap) ||                                                              \
     ((cap) = (cap) ? (cap) * 2 : 16,                                            \
      ((arr) = realloc_or_free((arr), (size_t)(cap) * sizeof(*(arr)))) != NULL))

static void *realloc_or_free(void *p, size_t size)
{
    void *q = realloc(p, size);
    if (q == NULL)
        free(p);
    return q;
}

hpd_grammar_format_t hpd_grammar_format_default(void)
{
    return (hpd_grammar_format_t){.item_separator = ", ", .key_separator = ": "};
}

hpd_grammar_t *g_new(const hpd_grammar_format_t *format)
{
    hpd_grammar_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    g->refs = 1;
    g->after_token = -1;
    g->fmt = format != NULL ? *format : hpd_grammar_format_default();
    const char *item = g->fmt.whitespace_flexible || g->fmt.item_separator == NULL
                           ? ","
                           : g->fmt.item_separator;
    const char *key = g->fmt.whitespace_flexible || g->fmt.key_separator == NULL
                          ? ":"
                          : g->fmt.key_separator;
    snprintf(g->item_sep, sizeof(g->item_sep), "%s", item);
    snprintf(g->key_sep, sizeof(g->key_sep), "%s", key);
    g->fmt.item_separator = g->item_sep;
    g->fmt.key_separator = g->key_sep;
    return g;
}

uint32_t g_add_node(hpd_grammar_t *g, const g_node_t *n)
{
    if (g->n_nodes >= MAX_NODES || !GROW(g->nodes, g->n_nodes, g->cap_nodes))
        return G_NONE;
    g->nodes[g->n_nodes] = *n;
    return g->n_nodes++;
}

uint32_t g_add_lit(hpd_grammar_t *g, const uint8_t *bytes, uint32_t len)
{
    while (g->n_bytes + len > g->cap_bytes) {
        g->cap_bytes = g->cap_bytes ? g->cap_bytes * 2 : 256;
        if ((g->bytes = realloc_or_free(g->bytes, g->cap_bytes)) == NULL)
            return G_NONE;
    }
    if (!GROW(g->lits, g->n_lits, g->cap_lits))
        return G_NONE;
    memcpy(g->bytes + g->n_bytes, bytes, len);
    g->lits[g->n_lits] = (g_lit_t){.off = g->n_bytes, .len = len};
    g->n_bytes += len;
    return g->n_lits++;
}

static uint32_t lit_node(hpd_grammar_t *g, const char *text, size_t len)
{
    const uint32_t l = g_add_lit(g, (const uint8_t *)text, (uint32_t)len);
    return l == G_NONE ? G_NONE : g_add_node(g, &(g_node_t){.kind = G_LITERAL, .lit = l});
}

static uint32_t add_alts(hpd_grammar_t *g, const uint32_t *alts, uint32_t n)
{
    const uint32_t first = g->n_alts;
    for (uint32_t i = 0; i < n; i++) {
        if (!GROW(g->alts, g->n_alts, g->cap_alts))
            return G_NONE;
        g->alts[g->n_alts++] = alts[i];
    }
    return first;
}

static uint32_t anyof_node(hpd_grammar_t *g, const uint32_t *alts, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (alts[i] == G_NONE)
            return G_NONE;
    if (n == 1)
        return alts[0];
    const uint32_t a0 = add_alts(g, alts, n);
    return a0 == G_NONE ? G_NONE : g_add_node(g, &(g_node_t){.kind = G_ANYOF, .alt0 = a0, .n_alts = n});
}

static uint32_t string_node(hpd_grammar_t *g)
{
    return g_add_node(g, &(g_node_t){.kind = G_STRING, .max_len = UINT32_MAX, .dfa = G_NONE});
}

/* Any JSON value: an object or array of anything, a string, a number,
 * true, false or null. The any-node is made first and filled last: the
 * containers refer to it. */
uint32_t g_any(hpd_grammar_t *g, uint32_t *object_p)
{
    const uint32_t any = g_add_node(g, &(g_node_t){.kind = G_REF});
    if (any == G_NONE)
        return G_NONE;
    const uint32_t object =
        g_add_node(g, &(g_node_t){.kind = G_OBJECT, .additional = any, .names = G_NONE});
    const uint32_t alts[] = {
        object,
        g_add_node(g, &(g_node_t){.kind = G_ARRAY, .items = any, .max_items = UINT32_MAX}),
        string_node(g),
        g_add_node(g, &(g_node_t){.kind = G_NUMBER}),
        lit_node(g, "true", 4),
        lit_node(g, "false", 5),
        lit_node(g, "null", 4),
    };
    const uint32_t a = anyof_node(g, alts, 7);
    if (a == G_NONE)
        return G_NONE;
    g->nodes[any].target = a;
    if (object_p != NULL)
        *object_p = object;
    return any;
}

static bool failf(compiler_t *c, hpd_status_t st, const char *fmt, const char *what)
{
    if (c->st == HPD_OK) {
        c->st = st;
        if (c->err != NULL)
            snprintf(c->err, c->errlen, fmt, c->path[0] ? c->path : "#", what);
    }
    return false;
}

static bool oom(compiler_t *c)
{
    return failf(c, HPD_ERR_NO_MEMORY, "%s: %s", "no memory for the grammar");
}

static bool in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0)
            return true;
    return false;
}

static uint32_t compile(compiler_t *c, json_t *s);

/* Compiles s with path extended by /seg for the time of the call. */
static uint32_t compile_at(compiler_t *c, json_t *s, const char *seg)
{
    const size_t len = strlen(c->path);
    snprintf(c->path + len, sizeof(c->path) - len, "%s/%s", len == 0 ? "#" : "", seg);
    const uint32_t n = compile(c, s);
    c->path[len] = '\0';
    return n;
}

/* A count keyword: a non-negative integer, else def. */
static bool count(compiler_t *c, json_t *s, const char *key, uint32_t def, uint32_t *out)
{
    json_t *v = json_object_get(s, key);
    *out = def;
    if (v == NULL)
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX - 1)
        return failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a non-negative integer", key);
    *out = (uint32_t)json_integer_value(v);
    return true;
}

/* A JSON value's text in the grammar's layout (a const or enum member). */
static uint32_t value_node(compiler_t *c, json_t *v);

static uint32_t string_literal(compiler_t *c, const char *text, size_t len)
{
    json_t *s = json_stringn(text, len);
    char *enc = s != NULL ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    if (enc == NULL) {
        oom(c);
        return G_NONE;
    }
    /* JSON escapes that these strings cannot hold (\u, \/) are refused:
     * such a const could never be produced */
    if (strstr(enc, "\\u") != NULL) {
        free(enc);
        failf(c, HPD_ERR_UNSUPPORTED, "%s: %s", "a const or enum string with a control character");
        return G_NONE;
    }
    const uint32_t n = lit_node(c->g, enc, strlen(enc));
    free(enc);
    return n;
}

static uint32_t value_node(compiler_t *c, json_t *v)
{
    hpd_grammar_t *g = c->g;
    if (json_is_string(v))
        return string_literal(c, json_string_value(v), json_string_length(v));
    if (json_is_object(v)) {
        const uint32_t p0 = g->n_props;
        uint32_t n = 0;
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) {
            const uint32_t name = string_literal(c, key, strlen(key));
            const uint32_t vn = value_node(c, val);
            if (name == G_NONE || vn == G_NONE || !GROW(g->props, g->n_props, g->cap_props))
                return G_NONE;
            g->props[g->n_props++] = (g_prop_t){.name_lit = g->nodes[name].lit, .value = vn, .required = true};
            n++;
        }
        return g_add_node(g, &(g_node_t){.kind = G_OBJECT, .prop0 = p0, .n_props = n,
                                         .additional = G_NONE, .names = G_NONE});
    }
    if (json_is_array(v)) {
        const size_t n = json_array_size(v);
        uint32_t *items = malloc((n + 1) * sizeof(*items));
        if (items == NULL)
            return G_NONE;
        for (size_t i = 0; i < n; i++)
            items[i] = value_node(c, json_array_get(v, i));
        uint32_t a0 = G_NONE;
        bool ok = true;
        for (size_t i = 0; i < n; i++)
            ok = ok && items[i] != G_NONE;
        if (ok)
            a0 = add_alts(g, items, (uint32_t)n);
        free(items);
        return a0 == G_NONE ? G_NONE
                            : g_add_node(g, &(g_node_t){.kind = G_TUPLE, .alt0 = a0, .n_alts = (uint32_t)n});
    }
    char *enc = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (enc == NULL) {
        oom(c);
        return G_NONE;
    }
    const uint32_t n = lit_node(g, enc, strlen(enc));
    free(enc);
    return n;
}

static uint32_t enum_node(compiler_t *c, json_t *s)
{
    json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
    if (k != NULL)
        return value_node(c, k);
    if (!json_is_array(e) || json_array_size(e) == 0) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a non-empty array", "enum");
        return G_NONE;
    }
    const size_t n = json_array_size(e);
    uint32_t *alts = malloc(n * sizeof(*alts));
    if (alts == NULL)
        return G_NONE;
    for (size_t i = 0; i < n; i++)
        alts[i] = value_node(c, json_array_get(e, i));
    const uint32_t node = anyof_node(c->g, alts, (uint32_t)n);
    free(alts);
    return node;
}

/* The trie of an object's keys (their escaped bytes, without quotes). */
static uint32_t names_trie(compiler_t *c, uint32_t p0, uint32_t n)
{
    hpd_grammar_t *g = c->g;
    uint32_t states = 1;
    for (uint32_t i = 0; i < n; i++)
        states += g->lits[g->props[p0 + i].name_lit].len;
    g_ntrie_t t = {.next = calloc((size_t)states * 256, sizeof(uint32_t)),
                   .end = calloc(states, sizeof(bool)), .n_states = 1};
    g_ntrie_t *arr = realloc(g->ntries, (g->n_ntries + 1) * sizeof(*arr));
    if (t.next == NULL || t.end == NULL || arr == NULL) {
        free(t.next);
        free(t.end);
        if (arr != NULL)
            g->ntries = arr;
        oom(c);
        return G_NONE;
    }
    g->ntries = arr;
    for (uint32_t i = 0; i < n; i++) {
        const g_lit_t *l = &g->lits[g->props[p0 + i].name_lit];
        uint32_t s = 0;
        for (uint32_t k = 1; k + 1 < l->len; k++) { /* inside the quotes */
            uint32_t *nx = &t.next[(size_t)s * 256 + g->bytes[l->off + k]];
            if (*nx == 0)
                *nx = t.n_states++;
            s = *nx;
        }
        t.end[s] = true;
    }
    g->ntries[g->n_ntries] = t;
    return g->n_ntries++;
}

static uint32_t object_node(compiler_t *c, json_t *s)
{
    hpd_grammar_t *g = c->g;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props != NULL && !json_is_object(props)) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be an object", "properties");
        return G_NONE;
    }
    if (req != NULL && !json_is_array(req)) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be an array of names", "required");
        return G_NONE;
    }
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r) || json_object_get(props, json_string_value(r)) == NULL) {
            failf(c, HPD_ERR_UNSUPPORTED, "%s: a 'required' name not in 'properties' (%s)",
                  json_is_string(r) ? json_string_value(r) : "not a string");
            return G_NONE;
        }
    }
    /* the properties' nodes first (they may add properties of their own) */
    const size_t n = json_object_size(props);
    uint32_t *values = malloc((n + 1) * sizeof(*values)), *names = malloc((n + 1) * sizeof(*names));
    bool *required = calloc(n + 1, sizeof(*required));
    uint32_t k = 0;
    const char *key;
    json_t *val;
    bool ok = values != NULL && names != NULL && required != NULL;
    json_object_foreach(props, key, val) {
        if (!ok)
            break;
        char seg[MAX_PATH];
        snprintf(seg, sizeof(seg), "properties/%s", key);
        const uint32_t name = string_literal(c, key, strlen(key));
        values[k] = compile_at(c, val, seg);
        names[k] = name == G_NONE ? G_NONE : g->nodes[name].lit;
        json_array_foreach(req, i, r) required[k] |= strcmp(json_string_value(r), key) == 0;
        ok = values[k] != G_NONE && names[k] != G_NONE;
        k++;
    }
    uint32_t additional = G_NONE;
    if (ok && (add == NULL || json_is_true(add)))
        additional = c->any;
    else if (ok && json_is_object(add))
        ok = (additional = compile_at(c, add, "additionalProperties")) != G_NONE;
    else if (ok && !json_is_false(add))
        ok = failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a schema or a boolean",
                   "additionalProperties");
    const uint32_t p0 = g->n_props;
    for (uint32_t j = 0; j < k && ok; j++) {
        if (!GROW(g->props, g->n_props, g->cap_props)) {
            ok = oom(c);
            break;
        }
        g->props[g->n_props++] = (g_prop_t){.name_lit = names[j], .value = values[j], .required = required[j]};
    }
    free(values);
    free(names);
    free(required);
    if (!ok)
        return G_NONE;
    const uint32_t trie = additional != G_NONE && k > 0 ? names_trie(c, p0, k) : G_NONE;
    if (additional != G_NONE && k > 0 && trie == G_NONE)
        return G_NONE;
    return g_add_node(g, &(g_node_t){.kind = G_OBJECT, .prop0 = p0, .n_props = k,
                                     .additional = additional, .names = trie});
}

static uint32_t array_node(compiler_t *c, json_t *s)
{
    uint32_t min, max, items = c->any;
    json_t *it = json_object_get(s, "items");
    if (!count(c, s, "minItems", 0, &min) || !count(c, s, "maxItems", UINT32_MAX, &max))
        return G_NONE;
    if (it != NULL && !json_is_object(it) && !json_is_boolean(it)) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a schema", "items");
        return G_NONE;
    }
    if (it != NULL && (items = compile_at(c, it, "items")) == G_NONE)
        return G_NONE;
    return g_add_node(c->g, &(g_node_t){.kind = G_ARRAY, .items = items, .min_items = min,
                                        .max_items = max});
}

/* A string's minLength, maxLength and pattern (a DFA) into n. */
static bool string_limits(compiler_t *c, json_t *s, g_node_t *n)
{
    json_t *pat = json_object_get(s, "pattern");
    n->dfa = G_NONE;
    if (!count(c, s, "minLength", 0, &n->min_len) ||
        !count(c, s, "maxLength", UINT32_MAX, &n->max_len))
        return false;
    if (pat != NULL) {
        if (!json_is_string(pat)) {
            failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a string", "pattern");
            return false;
        }
        hpd_grammar_t *g = c->g;
        g_dfa_t *d = realloc(g->dfas, (g->n_dfas + 1) * sizeof(*d));
        if (d == NULL) {
            oom(c);
            return false;
        }
        g->dfas = d;
        char msg[256];
        const hpd_status_t st = g_regex_compile(json_string_value(pat), &d[g->n_dfas], msg, sizeof(msg));
        if (st != HPD_OK) {
            failf(c, st, "%s: %s", msg);
            return false;
        }
        n->dfa = g->n_dfas++;
    }
    return true;
}

static uint32_t string_schema(compiler_t *c, json_t *s)
{
    g_node_t n = {.kind = G_STRING};
    return string_limits(c, s, &n) ? g_add_node(c->g, &n) : G_NONE;
}

/* The node of one JSON type name under schema s's keywords. */
static uint32_t typed_node(compiler_t *c, json_t *s, const char *type)
{
    if (strcmp(type, "object") == 0)
        return object_node(c, s);
    if (strcmp(type, "array") == 0)
        return array_node(c, s);
    if (strcmp(type, "string") == 0)
        return string_schema(c, s);
    if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0)
        return g_add_node(c->g, &(g_node_t){.kind = G_NUMBER, .integer = type[0] == 'i'});
    if (strcmp(type, "boolean") == 0) {
        const uint32_t alts[] = {lit_node(c->g, "true", 4), lit_node(c->g, "false", 5)};
        return anyof_node(c->g, alts, 2);
    }
    if (strcmp(type, "null") == 0)
        return lit_node(c->g, "null", 4);
    failf(c, HPD_ERR_INVALID_ARG, "%s: unknown type '%s'", type);
    return G_NONE;
}

/* The $ref's target in this document ("#", "#/$defs/x", any JSON pointer). */
static json_t *resolve_ref(compiler_t *c, const char *ref)
{
    if (ref[0] != '#') {
        failf(c, HPD_ERR_UNSUPPORTED, "%s: $ref '%s' (only refs within the schema)", ref);
        return NULL;
    }
    json_t *at = c->root;
    const char *p = ref + 1;
    while (*p == '/' && at != NULL) {
        p++;
        char seg[MAX_PATH];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof(seg); p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                seg[n++] = *p;
            }
        }
        seg[n] = '\0';
        if (json_is_array(at)) {
            char *end;
            const unsigned long idx = strtoul(seg, &end, 10);
            at = *end == '\0' ? json_array_get(at, idx) : NULL;
        } else {
            at = json_object_get(at, seg);
        }
    }
    if (at == NULL || *p != '\0')
        failf(c, HPD_ERR_INVALID_ARG, "%s: $ref '%s' names nothing in the schema", ref);
    return at;
}

/* Refuses keywords outside the supported and ignored ones, and siblings
 * of $ref / anyOf (an intersection this compiler does not make). */
static bool check_keywords(compiler_t *c, json_t *s)
{
    const char *key;
    json_t *v;
    const bool ref = json_object_get(s, "$ref") != NULL, anyof = json_object_get(s, "anyOf") != NULL;
    json_object_foreach(s, key, v) {
        if (in_list(key, annotations, sizeof(annotations) / sizeof(*annotations)))
            continue;
        if (!in_list(key, supported, sizeof(supported) / sizeof(*supported)))
            return failf(c, HPD_ERR_UNSUPPORTED, "%s: keyword '%s' is not supported", key);
        if ((ref && strcmp(key, "$ref") != 0) || (anyof && strcmp(key, "anyOf") != 0))
            return failf(c, HPD_ERR_UNSUPPORTED, "%s: keyword '%s' beside $ref or anyOf is not supported",
                         key);
    }
    return true;
}

static uint32_t compile(compiler_t *c, json_t *s)
{
    if (json_is_true(s))
        return c->any;
    if (!json_is_object(s)) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: %s", json_is_false(s) ? "the schema false allows nothing"
                                                                 : "a schema must be an object");
        return G_NONE;
    }
    for (uint32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].schema == s)
            return c->memo[i].node;
    if (!check_keywords(c, s))
        return G_NONE;
    /* a placeholder that $refs back to s find, filled below */
    const uint32_t self = g_add_node(c->g, &(g_node_t){.kind = G_REF});
    if (self == G_NONE || !GROW(c->memo, c->n_memo, c->cap_memo)) {
        oom(c);
        return G_NONE;
    }
    c->memo[c->n_memo++] = (memo_t){.schema = s, .node = self};

    json_t *ref = json_object_get(s, "$ref"), *anyof = json_object_get(s, "anyOf");
    json_t *type = json_object_get(s, "type");
    uint32_t node = G_NONE;
    if (ref != NULL) {
        json_t *target = json_is_string(ref) ? resolve_ref(c, json_string_value(ref)) : NULL;
        if (!json_is_string(ref))
            failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a string", "$ref");
        if (target != NULL)
            node = compile_at(c, target, json_string_value(ref));
    } else if (anyof != NULL) {
        const size_t n = json_array_size(anyof);
        uint32_t *alts = n > 0 ? malloc(n * sizeof(*alts)) : NULL;
        if (n == 0)
            failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a non-empty array", "anyOf");
        for (size_t i = 0; alts != NULL && i < n; i++) {
            char seg[32];
            snprintf(seg, sizeof(seg), "anyOf/%zu", i);
            alts[i] = compile_at(c, json_array_get(anyof, i), seg);
        }
        if (alts != NULL)
            node = anyof_node(c->g, alts, (uint32_t)n);
        free(alts);
    } else if (json_object_get(s, "enum") != NULL || json_object_get(s, "const") != NULL) {
        node = enum_node(c, s);
    } else if (json_is_string(type)) {
        node = typed_node(c, s, json_string_value(type));
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        const size_t n = json_array_size(type);
        uint32_t alts[8];
        for (size_t i = 0; i < n && i < 8; i++) {
            json_t *t = json_array_get(type, i);
            alts[i] = json_is_string(t) ? typed_node(c, s, json_string_value(t)) : G_NONE;
        }
        if (n > 8)
            failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' lists more than 8 types", "type");
        else
            node = anyof_node(c->g, alts, (uint32_t)n);
    } else if (type != NULL) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: '%s' must be a type name or an array of them", "type");
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
               json_object_get(s, "additionalProperties")) {
        node = object_node(c, s);
    } else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
               json_object_get(s, "maxItems")) {
        node = array_node(c, s);
    } else if (json_object_get(s, "pattern") || json_object_get(s, "minLength") ||
               json_object_get(s, "maxLength")) {
        node = string_schema(c, s);
    } else {
        node = c->any;
    }
    if (node == G_NONE) {
        if (c->st == HPD_OK)
            oom(c);
        return G_NONE;
    }
    c->g->nodes[self].target = node;
    return self;
}

hpd_grammar_t *hpd_grammar_retain(hpd_grammar_t *g)
{
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

/* ------------------------------------------------------------ tool calls */

static uint32_t lit_text(compiler_t *c, const char *a, const char *b, const char *z)
{
    char buf[1024];
    const int n = snprintf(buf, sizeof(buf), "%s%s%s", a, b, z);
    if (n < 0 || (size_t)n >= sizeof(buf)) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: %s", "a tool's name or parameter is too long");
        return G_NONE;
    }
    return lit_node(c->g, buf, (size_t)n);
}

static uint32_t seq_node(hpd_grammar_t *g, const uint32_t *parts, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (parts[i] == G_NONE)
            return G_NONE;
    const uint32_t a0 = add_alts(g, parts, n);
    return a0 == G_NONE ? G_NONE : g_add_node(g, &(g_node_t){.kind = G_SEQ, .alt0 = a0, .n_alts = n});
}

/* An XML parameter's value: text for a string (a string enum: one of its
 * texts), else the JSON value of its schema. */
static uint32_t xml_value(compiler_t *c, json_t *schema, const char *path)
{
    const json_t *type = json_object_get(schema, "type"), *e = json_object_get(schema, "enum");
    if (json_is_array(e) && json_array_size(e) > 0) {
        bool strings = true;
        size_t i;
        json_t *v;
        json_array_foreach(e, i, v) strings &= json_is_string(v);
        if (strings) {
            uint32_t alts[64];
            const size_t n = json_array_size(e) < 64 ? json_array_size(e) : 64;
            for (i = 0; i < n; i++) {
                json_t *s = json_array_get(e, i);
                alts[i] = lit_node(c->g, json_string_value(s), json_string_length(s));
            }
            return anyof_node(c->g, alts, (uint32_t)n);
        }
    }
    if (json_is_string(type) && strcmp(json_string_value(type), "string") == 0) {
        /* the value's text as it is (the template writes a string raw),
         * held to the string's length and pattern */
        g_node_t n = {.kind = G_TEXT};
        n.lit = g_add_lit(c->g, (const uint8_t *)"\n</parameter>", 13);
        const size_t len = strlen(c->path);
        snprintf(c->path + len, sizeof(c->path) - len, "%s/%s", len == 0 ? "#" : "", path);
        const bool ok = n.lit != G_NONE && check_keywords(c, schema) &&
                        string_limits(c, schema, &n);
        c->path[len] = '\0';
        return ok ? g_add_node(c->g, &n) : G_NONE;
    }
    return compile_at(c, schema, path);
}

static uint32_t tool_call_at(compiler_t *c, json_t *tool, bool xml, size_t index);

/* One tool's call, as the format writes it; a $ref in its parameters
 * names a place in them ("#" is the parameters' schema, as a request
 * validator reading the function's schema alone resolves it). */
static uint32_t tool_call_node(compiler_t *c, json_t *tool, bool xml, size_t index)
{
    json_t *const root = c->root;
    c->root = json_object_get(json_object_get(tool, "function"), "parameters");
    const uint32_t node = tool_call_at(c, tool, xml, index);
    c->root = root;
    return node;
}

static uint32_t tool_call_at(compiler_t *c, json_t *tool, bool xml, size_t index)
{
    json_t *f = json_object_get(tool, "function"), *name = json_object_get(f, "name");
    json_t *params = json_object_get(f, "parameters");
    char path[64];
    snprintf(path, sizeof(path), "tools/%zu/function/parameters", index);
    if (!json_is_string(name) || json_string_length(name) == 0) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: %s", "a tool without a function name");
        return G_NONE;
    }
    if (!xml) {
        char *quoted = json_dumps(name, JSON_ENCODE_ANY);
        const uint32_t head = quoted != NULL ? lit_text(c, "<tool_call>\n{\"name\": ", quoted,
                                                        ", \"arguments\": ")
                                             : G_NONE;
        free(quoted);
        json_t *any = params == NULL || json_is_null(params) ? json_pack("{s:s}", "type", "object") : NULL;
        const uint32_t args = compile_at(c, any != NULL ? any : params, path);
        json_decref(any);
        const uint32_t parts[] = {head, args, lit_text(c, "}\n</tool_call>", "", "")};
        return seq_node(c->g, parts, 3);
    }
    uint32_t parts[66];
    uint32_t n = 0;
    parts[n++] = lit_text(c, "<tool_call>\n<function=", json_string_value(name), ">\n");
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    const char *key;
    json_t *ps;
    json_object_foreach(props, key, ps) {
        if (n >= 64) {
            failf(c, HPD_ERR_UNSUPPORTED, "%s: %s", "a tool with more than 63 parameters");
            return G_NONE;
        }
        char ppath[320];
        snprintf(ppath, sizeof(ppath), "%s/properties/%s", path, key);
        const uint32_t block[] = {lit_text(c, "<parameter=", key, ">\n"), xml_value(c, ps, ppath),
                                  lit_text(c, "\n</parameter>\n", "", "")};
        uint32_t part = seq_node(c->g, block, 3);
        bool required = false;
        size_t i;
        json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && strcmp(json_string_value(r), key) == 0;
        if (!required && part != G_NONE) { /* or left out */
            const uint32_t alts[] = {part, lit_node(c->g, "", 0)};
            part = anyof_node(c->g, alts, 2);
        }
        parts[n++] = part;
    }
    parts[n++] = lit_text(c, "</function>\n</tool_call>", "", "");
    return seq_node(c->g, parts, n);
}

/* A call of one of tools (an array), in Qwen3's JSON form or Qwen3.5's XML. */
static uint32_t tool_calls_node(compiler_t *c, json_t *tools, bool xml)
{
    const size_t n = json_array_size(tools);
    if (!json_is_array(tools) || n == 0 || n > 256) {
        failf(c, HPD_ERR_INVALID_ARG, "%s: %s", "tool_call.tools: expected 1 to 256 tools");
        return G_NONE;
    }
    uint32_t alts[256];
    for (size_t i = 0; i < n; i++)
        if ((alts[i] = tool_call_node(c, json_array_get(tools, i), xml, i)) == G_NONE)
            return G_NONE;
    return anyof_node(c->g, alts, (uint32_t)n);
}

/* ------------------------------------------------------------ first bytes */

static void first_of(hpd_grammar_t *g, uint32_t node, uint8_t *state)
{
    uint32_t *f = g->first[node];
    if (state[node] == 2)
        return;
    if (state[node] == 1) { /* a cycle without a byte: anything */
        memset(f, 0xff, 8 * sizeof(uint32_t));
        return;
    }
    state[node] = 1;
    const g_node_t *n = &g->nodes[node];
    memset(f, 0, 8 * sizeof(uint32_t));
    switch (n->kind) {
    case G_REF:
        first_of(g, n->target, state);
        memcpy(f, g->first[n->target], 8 * sizeof(uint32_t));
        break;
    case G_ANYOF:
        for (uint32_t i = 0; i < n->n_alts; i++) {
            const uint32_t a = g->alts[n->alt0 + i];
            first_of(g, a, state);
            for (int w = 0; w < 8; w++)
                f[w] |= g->first[a][w];
        }
        break;
    case G_OBJECT:
        f['{' / 32] |= 1u << ('{' % 32);
        break;
    case G_ARRAY:
    case G_TUPLE:
        f['[' / 32] |= 1u << ('[' % 32);
        break;
    case G_STRING:
        f['"' / 32] |= 1u << ('"' % 32);
        break;
    case G_NUMBER:
        for (int c = '0'; c <= '9'; c++)
            f[c / 32] |= 1u << (c % 32);
        f['-' / 32] |= 1u << ('-' % 32);
        break;
    case G_LITERAL:
        if (g->lits[n->lit].len > 0) {
            const uint8_t c = g->bytes[g->lits[n->lit].off];
            f[c / 32] |= 1u << (c % 32);
        } else {
            memset(f, 0xff, 8 * sizeof(uint32_t));
        }
        break;
    default: /* a sequence or text may be empty at its start: anything */
        memset(f, 0xff, 8 * sizeof(uint32_t));
        break;
    }
    state[node] = 2;
}

bool g_first_bytes(hpd_grammar_t *g)
{
    uint8_t *state = calloc(g->n_nodes + 1, 1);
    g->first = calloc(g->n_nodes + 1, sizeof(*g->first));
    if (state == NULL || g->first == NULL) {
        free(state);
        return false;
    }
    for (uint32_t i = 0; i < g->n_nodes; i++)
        first_of(g, i, state);
    free(state);
    return true;
}

void hpd_grammar_destroy(hpd_grammar_t *g)
{
    if (g == NULL || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    for (uint32_t i = 0; i < g->n_dfas; i++)
        g_dfa_free(&g->dfas[i]);
    for (uint32_t i = 0; i < g->n_ntries; i++) {
        free(g->ntries[i].next);
        free(g->ntries[i].end);
    }
    free(g->dfas);
    free(g->first);
    free(g->ntries);
    free(g->nodes);
    free(g->alts);
    free(g->props);
    free(g->lits);
    free(g->bytes);
    free(g);
}

hpd_status_t hpd_grammar_from_schema(const char *schema, size_t len,
                                     const hpd_grammar_format_t *format, hpd_grammar_t **g_p,
                                     char *err, size_t errlen)
{
    json_error_t je;
    compiler_t c = {.err = err, .errlen = errlen};
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    c.root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (c.root == NULL) {
        if (err != NULL)
            snprintf(err, errlen, "the schema is not JSON: %s at line %d column %d", je.text,
                     je.line, je.column);
        return HPD_ERR_INVALID_ARG;
    }
    if ((c.g = g_new(format)) == NULL || (c.any = g_any(c.g, NULL)) == G_NONE) {
        oom(&c);
    } else {
        c.g->root = compile(&c, c.root);
        if (c.g->root == G_NONE && c.st == HPD_OK)
            oom(&c);
        if (c.st == HPD_OK && !g_first_bytes(c.g))
            oom(&c);
    }
    json_decref(c.root);
    free(c.memo);
    if (c.st != HPD_OK) {
        hpd_grammar_destroy(c.g);
        return c.st;
    }
    *g_p = c.g;
    return HPD_OK;
}

hpd_status_t hpd_grammar_from_spec(const char *spec, size_t len, hpd_grammar_t **g_p, char *err,
                                   size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(spec, len, 0, &je);
    hpd_grammar_format_t fmt = hpd_grammar_format_default();
    hpd_status_t st = HPD_ERR_INVALID_ARG;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    json_t *schema = json_object_get(root, "json_schema"), *obj = json_object_get(root, "json_object");
    json_t *tc = json_object_get(root, "tool_call");
    if (tc != NULL && schema == NULL && obj == NULL) { /* a call of one of the tools */
        const json_t *fmt_name = json_object_get(tc, "format");
        compiler_t c = {.err = err, .errlen = errlen, .root = json_object_get(tc, "tools")};
        json_t *after_tc = json_object_get(root, "after_token");
        if ((c.g = g_new(&fmt)) == NULL || (c.any = g_any(c.g, NULL)) == G_NONE) {
            oom(&c);
        } else if (!json_is_string(fmt_name) ||
                   (strcmp(json_string_value(fmt_name), "xml") != 0 &&
                    strcmp(json_string_value(fmt_name), "json") != 0)) {
            failf(&c, HPD_ERR_INVALID_ARG, "%s: %s", "tool_call.format: expected xml or json");
        } else {
            c.g->root = tool_calls_node(&c, c.root, strcmp(json_string_value(fmt_name), "xml") == 0);
            if (c.g->root == G_NONE && c.st == HPD_OK)
                oom(&c);
        }
        if (c.st == HPD_OK && json_is_integer(after_tc))
            c.g->after_token = (int32_t)json_integer_value(after_tc);
        if (c.st == HPD_OK && !g_first_bytes(c.g))
            oom(&c);
        free(c.memo);
        json_decref(root);
        if (c.st != HPD_OK) {
            hpd_grammar_destroy(c.g);
            return c.st;
        }
        *g_p = c.g;
        return HPD_OK;
    }
    json_t *flex = json_object_get(root, "whitespace_flexible");
    json_t *after = json_object_get(root, "after_token");
    if (root == NULL || !json_is_object(root) || (schema == NULL) == (obj == NULL) ||
        (obj != NULL && !json_is_true(obj)) || (flex != NULL && !json_is_boolean(flex)) ||
        (after != NULL && (!json_is_integer(after) || json_integer_value(after) < 0 ||
                           json_integer_value(after) > INT32_MAX))) {
        if (err != NULL)
            snprintf(err, errlen, "grammar: expected {\"json_schema\": SCHEMA} or "
                     "{\"json_object\": true}, with an optional boolean whitespace_flexible "
                     "and token id after_token");
        json_decref(root);
        return HPD_ERR_INVALID_ARG;
    }
    fmt.whitespace_flexible = json_is_true(flex);
    if (obj != NULL) {
        st = hpd_grammar_json_object(&fmt, g_p);
    } else {
        char *text = json_dumps(schema, JSON_ENCODE_ANY | JSON_COMPACT);
        st = text == NULL ? HPD_ERR_NO_MEMORY
                          : hpd_grammar_from_schema(text, strlen(text), &fmt, g_p, err, errlen);
        free(text);
    }
    if (st == HPD_OK && after != NULL)
        (*g_p)->after_token = (int32_t)json_integer_value(after);
    json_decref(root);
    return st;
}

char *hpd_grammar_spec_after(const char *spec, size_t len, int32_t token)
{
    json_t *root = json_loadb(spec, len, 0, NULL);
    char *out = NULL;
    if (json_is_object(root) && json_object_set_new(root, "after_token", json_integer(token)) == 0)
        out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}

int32_t hpd_grammar_after_token(const hpd_grammar_t *g)
{
    return g->after_token;
}

hpd_status_t hpd_grammar_json_object(const hpd_grammar_format_t *format, hpd_grammar_t **g_p)
{
    hpd_grammar_t *g = g_new(format);
    if (g == NULL || g_any(g, &g->root) == G_NONE || !g_first_bytes(g)) {
        hpd_grammar_destroy(g);
        return HPD_ERR_NO_MEMORY;
    }
    *g_p = g;
    return HPD_OK;
}
