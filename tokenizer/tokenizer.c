#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "tokenizer"
#define MAX_SPLITS 4

/* ---- open-addressing maps: strings -> ids, token pairs -> merges */

typedef struct {
    const char *key; /* points into tokens[] */
    uint32_t len;
    int32_t id;
} str_slot_t;

typedef struct {
    uint64_t key; /* (left << 32) | right, + 1 so that 0 is empty */
    uint32_t rank;
    int32_t merged;
} pair_slot_t;

struct hpd_tokenizer {
    char **tokens;     /* [size] byte-level form (vocab) or content (added) */
    uint32_t *tok_len; /* [size] */
    uint8_t *kind;     /* [size]: 0 none, 1 vocabulary, 2 added, 3 added and special */
    uint32_t size;
    str_slot_t *vocab; /* byte-level strings -> ids */
    uint32_t vocab_mask;
    pair_slot_t *merges;
    uint32_t merges_mask;
    bool ignore_merges;
    int32_t byte_id[256];        /* the token of each single byte */
    uint16_t byte_cp[256];       /* GPT-2's bytes_to_unicode */
    int16_t cp_byte[512];        /* its inverse, -1 elsewhere */
    int32_t *added;              /* ids of the added tokens, longest first */
    uint32_t n_added;
    bool added_first[256];       /* the first bytes of added tokens */
    bool nfc;
    pcre2_code *split[MAX_SPLITS]; /* Split pre-tokenizers, Isolated, in order */
    uint32_t n_split;
    bool add_prefix_space;
};

static uint64_t str_hash(const char *s, size_t n)
{
    return XXH3_64bits(s, n);
}

static uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static int32_t vocab_find(const hpd_tokenizer_t *t, const char *s, size_t n)
{
    for (uint32_t i = (uint32_t)str_hash(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const str_slot_t *e = &t->vocab[i];
        if (e->key == NULL)
            return -1;
        if (e->len == n && memcmp(e->key, s, n) == 0)
            return e->id;
    }
}

static void vocab_put(hpd_tokenizer_t *t, const char *s, uint32_t n, int32_t id)
{
    uint32_t i = (uint32_t)str_hash(s, n) & t->vocab_mask;
    while (t->vocab[i].key != NULL) {
        if (t->vocab[i].len == n && memcmp(t->vocab[i].key, s, n) == 0)
            return; /* the first one stays */
        i = (i + 1) & t->vocab_mask;
    }
    t->vocab[i] = (str_slot_t){.key = s, .len = n, .id = id};
}

static const pair_slot_t *merge_find(const hpd_tokenizer_t *t, int32_t a, int32_t b)
{
    const uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (uint32_t i = (uint32_t)pair_hash(key) & t->merges_mask;;
         i = (i + 1) & t->merges_mask) {
        const pair_slot_t *e = &t->merges[i];
        if (e->key == 0)
            return NULL;
        if (e->key == key)
            return e;
    }
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t p = 16;
    while (p < 2 * n)
        p *= 2;
    return p;
}

/* ---- UTF-8 */

/* One character at s with n bytes left: its length (> 0); -k for an
 * ill-formed maximal subpart of k bytes; 0 when the bytes so far begin a
 * character that n cuts short. */
static int utf8_step(const uint8_t *s, size_t n)
{
    const uint8_t b = s[0];
    uint8_t lo = 0x80, hi = 0xbf;
    int len;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        len = 2;
    else if (b == 0xe0)
        len = 3, lo = 0xa0;
    else if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef)
        len = 3;
    else if (b == 0xed)
        len = 3, hi = 0x9f;
    else if (b == 0xf0)
        len = 4, lo = 0x90;
    else if (b >= 0xf1 && b <= 0xf3)
        len = 4;
    else if (b == 0xf4)
        len = 4, hi = 0x8f;
    else
        return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0;
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xbf))
            return -i;
    }
    return len;
}

static const char REPLACEMENT[] = "\xef\xbf\xbd"; /* U+FFFD */

/* Appends n bytes to a growing, NUL-terminated buffer. */
static hpd_status_t put(char **out, size_t *len, size_t *cap, const void *s, size_t n)
{
    if (hpd_grow(out, cap, *len + n + 1, 1) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = '\0';
    return HPD_OK;
}

/* Valid UTF-8 from s: each ill-formed subpart (a cut-short one at the end
 * too, when final) becomes U+FFFD. Without final, a cut-short character at
 * the end is left out and its bytes counted in *kept_p. */
static hpd_status_t sanitize(const uint8_t *s, size_t n, bool final, char **out, size_t *len,
                             size_t *cap, size_t *kept_p)
{
    size_t i = 0;
    hpd_status_t st = HPD_OK;
    while (i < n && st == HPD_OK) {
        const int k = utf8_step(s + i, n - i);
        if (k > 0) {
            st = put(out, len, cap, s + i, (size_t)k);
            i += (size_t)k;
        } else if (k < 0) {
            st = put(out, len, cap, REPLACEMENT, 3);
            i += (size_t)-k;
        } else if (final) {
            st = put(out, len, cap, REPLACEMENT, 3);
            i = n;
        } else {
            break;
        }
    }
    if (kept_p != NULL)
        *kept_p = n - i;
    return st;
}

/* ---- loading */

uint32_t hpd_tokenizer_byte_char(uint8_t b)
{
    uint32_t n = 0; /* the non-printable bytes before b */
    for (uint32_t x = 0; x < b; x++)
        n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b : 256 + n;
}

static void bytes_to_unicode(hpd_tokenizer_t *t)
{
    for (int c = 0; c < 512; c++)
        t->cp_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        t->byte_cp[b] = (uint16_t)hpd_tokenizer_byte_char((uint8_t)b);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

static const char *type_of(json_t *o)
{
    const char *s = json_string_value(json_object_get(o, "type"));
    return s != NULL ? s : "?";
}

static hpd_status_t add_split(hpd_tokenizer_t *t, const char *origin, const char *pattern)
{
    int err;
    PCRE2_SIZE off;
    if (t->n_split == MAX_SPLITS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: more than %d Split pre-tokenizers", origin,
                      MAX_SPLITS);
        return HPD_ERR_UNSUPPORTED;
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: pre-tokenizer regex does not compile at offset %zu: %s",
                      origin, (size_t)off, (const char *)msg);
        return HPD_ERR_FORMAT;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* where PCRE2 has a JIT; matches the same */
    t->split[t->n_split++] = re;
    return HPD_OK;
}

/* GPT-2's pattern, which ByteLevel applies when use_regex is true */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static hpd_status_t load_pre(hpd_tokenizer_t *t, const char *origin, json_t *p)
{
    hpd_status_t st;
    if (p == NULL || json_is_null(p))
        return HPD_OK;
    if (strcmp(type_of(p), "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            if ((st = load_pre(t, origin, x)) != HPD_OK)
                return st;
        }
        return HPD_OK;
    }
    if (strcmp(type_of(p), "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        const char *regex = json_string_value(json_object_get(pat, "Regex"));
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        if (regex == NULL || behavior == NULL || strcmp(behavior, "Isolated") != 0 ||
            json_is_true(json_object_get(p, "invert"))) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: Split pre-tokenizer with behavior '%s'%s (expected "
                          "a Regex pattern, behavior Isolated, invert false)", origin,
                          behavior ? behavior : "?", regex ? "" : " and no Regex");
            return HPD_ERR_UNSUPPORTED;
        }
        return add_split(t, origin, regex);
    }
    if (strcmp(type_of(p), "ByteLevel") == 0) {
        t->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *re = json_object_get(p, "use_regex");
        return re == NULL || json_is_true(re) ? add_split(t, origin, GPT2_PATTERN) : HPD_OK;
    }
    HPD_LOG_ERROR(LOG_COMPONENT, "%s: pre-tokenizer type '%s' is not supported (expected Split, "
                  "ByteLevel or a Sequence of them)", origin, type_of(p));
    return HPD_ERR_UNSUPPORTED;
}

static hpd_status_t load_normalizer(hpd_tokenizer_t *t, const char *origin, json_t *n)
{
    if (n == NULL || json_is_null(n))
        return HPD_OK;
    if (strcmp(type_of(n), "NFC") == 0) {
        t->nfc = true;
        return HPD_OK;
    }
    if (strcmp(type_of(n), "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            hpd_status_t st = load_normalizer(t, origin, x);
            if (st != HPD_OK)
                return st;
        }
        return HPD_OK;
    }
    HPD_LOG_ERROR(LOG_COMPONENT, "%s: normalizer type '%s' is not supported (expected NFC or "
                  "none)", origin, type_of(n));
    return HPD_ERR_UNSUPPORTED;
}

/* Sets token id to text (owned copy). */
static hpd_status_t set_token(hpd_tokenizer_t *t, const char *origin, int64_t id, const char *s,
                              size_t n, uint8_t kind)
{
    if (id < 0 || id >= t->size) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: token id %lld out of range (0 to %u)", origin,
                      (long long)id, t->size - 1);
        return HPD_ERR_FORMAT;
    }
    char *c = malloc(n + 1);
    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    memcpy(c, s, n);
    c[n] = '\0';
    free(t->tokens[id]);
    t->tokens[id] = c;
    t->tok_len[id] = (uint32_t)n;
    t->kind[id] = kind;
    return HPD_OK;
}

static hpd_status_t load_merges(hpd_tokenizer_t *t, const char *origin, json_t *merges)
{
    const size_t n = json_array_size(merges);
    json_t *m;
    size_t r;
    char buf[1024];

    t->merges_mask = pow2_at_least(n) - 1;
    if ((t->merges = calloc(t->merges_mask + 1, sizeof(*t->merges))) == NULL)
        return HPD_ERR_NO_MEMORY;
    json_array_foreach(merges, r, m)
    {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) { /* "a b" */
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (sp == NULL)
                goto bad;
            a = s, la = (size_t)(sp - s), b = sp + 1, lb = strlen(sp + 1);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), la = strlen(a);
            b = json_string_value(json_array_get(m, 1)), lb = strlen(b);
        } else {
            goto bad;
        }
        const int32_t ia = vocab_find(t, a, la), ib = vocab_find(t, b, lb);
        if (la + lb >= sizeof(buf) || ia < 0 || ib < 0)
            goto bad;
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        const int32_t im = vocab_find(t, buf, la + lb);
        if (im < 0)
            goto bad;
        const uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
        uint32_t i = (uint32_t)pair_hash(key) & t->merges_mask;
        while (t->merges[i].key != 0 && t->merges[i].key != key)
            i = (i + 1) & t->merges_mask;
        if (t->merges[i].key == 0) /* the first (lowest rank) one counts */
            t->merges[i] = (pair_slot_t){.key = key, .rank = (uint32_t)r, .merged = im};
    }
    return HPD_OK;
bad:
    HPD_LOG_ERROR(LOG_COMPONENT, "%s: merge %zu is not two vocabulary tokens whose concatenation "
                  "is one", origin, r);
    return HPD_ERR_FORMAT;
}

static hpd_status_t load_json(hpd_tokenizer_t *t, const char *origin, json_t *root)
{
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    json_t *decoder = json_object_get(root, "decoder"), *v;
    const char *key;
    size_t i;
    hpd_status_t st;

    if (!json_is_object(model) || strcmp(type_of(model), "BPE") != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: model type '%s' is not supported (expected BPE)", origin,
                      json_is_object(model) ? type_of(model) : "none");
        return HPD_ERR_UNSUPPORTED;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: model has no vocab object or merges list", origin);
        return HPD_ERR_FORMAT;
    }
    json_t *dropout = json_object_get(model, "dropout");
    json_t *prefix = json_object_get(model, "continuing_subword_prefix");
    json_t *suffix = json_object_get(model, "end_of_word_suffix");
    if ((dropout != NULL && !json_is_null(dropout)) || json_is_true(json_object_get(model, "byte_fallback")) ||
        (prefix != NULL && !json_is_null(prefix) && json_string_length(prefix) > 0) ||
        (suffix != NULL && !json_is_null(suffix) && json_string_length(suffix) > 0)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: BPE with dropout, byte_fallback or subword affixes is "
                      "not supported (expected byte-level BPE)", origin);
        return HPD_ERR_UNSUPPORTED;
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    /* the size: one past the largest id of the vocabulary and the added tokens */
    json_int_t max_id = -1;
    json_object_foreach(vocab, key, v) max_id = json_integer_value(v) > max_id ? json_integer_value(v) : max_id;
    json_array_foreach(added, i, v)
    {
        const json_int_t id = json_integer_value(json_object_get(v, "id"));
        max_id = id > max_id ? id : max_id;
    }
    if (max_id < 0 || max_id >= INT32_MAX) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: no token ids", origin);
        return HPD_ERR_FORMAT;
    }
    t->size = (uint32_t)max_id + 1;
    t->tokens = calloc(t->size, sizeof(*t->tokens));
    t->tok_len = calloc(t->size, sizeof(*t->tok_len));
    t->kind = calloc(t->size, 1);
    t->vocab_mask = pow2_at_least(t->size) - 1;
    t->vocab = calloc(t->vocab_mask + 1, sizeof(*t->vocab));
    if (!t->tokens || !t->tok_len || !t->kind || !t->vocab)
        return HPD_ERR_NO_MEMORY;
    json_object_foreach(vocab, key, v)
    {
        if (!json_is_integer(v)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: vocab entry '%s' is not an id", origin, key);
            return HPD_ERR_FORMAT;
        }
        if ((st = set_token(t, origin, json_integer_value(v), key, strlen(key), 1)) != HPD_OK)
            return st;
    }
    bytes_to_unicode(t);
    for (uint32_t id = 0; id < t->size; id++) {
        if (t->kind[id] != 1)
            continue;
        /* byte-level: every character stands for a byte */
        const uint8_t *c = (const uint8_t *)t->tokens[id];
        utf8proc_int32_t cp;
        for (size_t x = 0; x < t->tok_len[id];) {
            const utf8proc_ssize_t k = utf8proc_iterate(c + x, t->tok_len[id] - x, &cp);
            if (k <= 0 || cp >= 512 || t->cp_byte[cp] < 0) {
                HPD_LOG_ERROR(LOG_COMPONENT, "%s: vocab token %u '%s' has a character outside the "
                              "byte-level alphabet (expected a byte-level BPE)", origin, id,
                              t->tokens[id]);
                return HPD_ERR_UNSUPPORTED;
            }
            x += (size_t)k;
        }
        vocab_put(t, t->tokens[id], t->tok_len[id], (int32_t)id);
    }
    if ((st = load_merges(t, origin, merges)) != HPD_OK)
        return st;
    /* added tokens: matched in the text before anything else */
    t->added = calloc(json_array_size(added) + 1, sizeof(*t->added));
    if (t->added == NULL)
        return HPD_ERR_NO_MEMORY;
    json_array_foreach(added, i, v)
    {
        const char *content = json_string_value(json_object_get(v, "content"));
        json_t *id = json_object_get(v, "id");
        if (content == NULL || !json_is_integer(id) || content[0] == '\0') {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: added token %zu has no content or id", origin, i);
            return HPD_ERR_FORMAT;
        }
        const uint8_t kind = json_is_true(json_object_get(v, "special")) ? 3 : 2;
        if ((st = set_token(t, origin, json_integer_value(id), content, strlen(content), kind)) !=
            HPD_OK)
            return st;
        t->added[t->n_added++] = (int32_t)json_integer_value(id);
        t->added_first[(uint8_t)content[0]] = true;
    }
    /* longest first: at one position the longest added token wins */
    for (uint32_t a = 1; a < t->n_added; a++)
        for (uint32_t b = a; b > 0 && t->tok_len[t->added[b]] > t->tok_len[t->added[b - 1]]; b--) {
            const int32_t x = t->added[b];
            t->added[b] = t->added[b - 1];
            t->added[b - 1] = x;
        }
    for (int b = 0; b < 256; b++) {
        char u[4];
        const utf8proc_ssize_t n = utf8proc_encode_char(t->byte_cp[b], (utf8proc_uint8_t *)u);
        if ((t->byte_id[b] = vocab_find(t, u, (size_t)n)) < 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: byte 0x%02x has no token (expected a byte-level "
                          "BPE vocabulary with all 256 bytes)", origin, b);
            return HPD_ERR_UNSUPPORTED;
        }
    }
    if ((st = load_normalizer(t, origin, json_object_get(root, "normalizer"))) != HPD_OK ||
        (st = load_pre(t, origin, json_object_get(root, "pre_tokenizer"))) != HPD_OK)
        return st;
    if (decoder != NULL && !json_is_null(decoder) && strcmp(type_of(decoder), "ByteLevel") != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: decoder type '%s' is not supported (expected ByteLevel)",
                      origin, type_of(decoder));
        return HPD_ERR_UNSUPPORTED;
    }
    return HPD_OK;
}

hpd_status_t hpd_tokenizer_load(const char *path, hpd_tokenizer_t **tok_p)
{
    char file[4096];
    struct stat sb;
    char *text;
    size_t len;
    json_error_t jerr;
    hpd_status_t st;

    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof(file), "%s/tokenizer.json", path);
    else
        snprintf(file, sizeof(file), "%s", path);
    if ((st = hpd_read_file(file, &text, &len)) != HPD_OK)
        return st;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!json_is_object(root)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: line %d: not a JSON object: %s", file, jerr.line,
                      jerr.text);
        json_decref(root);
        return HPD_ERR_FORMAT;
    }
    hpd_tokenizer_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        json_decref(root);
        return HPD_ERR_NO_MEMORY;
    }
    st = load_json(t, file, root);
    json_decref(root);
    if (st != HPD_OK) {
        hpd_tokenizer_destroy(t);
        return st;
    }
    *tok_p = t;
    return HPD_OK;
}

void hpd_tokenizer_destroy(hpd_tokenizer_t *t)
{
    if (t == NULL)
        return;
    for (uint32_t i = 0; t->tokens != NULL && i < t->size; i++)
        free(t->tokens[i]);
    for (uint32_t i = 0; i < t->n_split; i++)
        pcre2_code_free(t->split[i]);
    free(t->tokens);
    free(t->tok_len);
    free(t->kind);
    free(t->vocab);
    free(t->merges);
    free(t->added);
    free(t);
}

uint32_t hpd_tokenizer_size(const hpd_tokenizer_t *t)
{
    return t->size;
}

bool hpd_tokenizer_is_special(const hpd_tokenizer_t *t, int32_t id)
{
    return id >= 0 && (uint32_t)id < t->size && t->kind[id] == 3;
}

bool hpd_tokenizer_is_marker(const hpd_tokenizer_t *t, int32_t id)
{
    static const char *const markers[] = {"<think>", "</think>", "<tool_call>", "</tool_call>"};
    if (!hpd_tokenizer_is_special(t, id))
        return false;
    for (size_t i = 0; i < sizeof(markers) / sizeof(markers[0]); i++)
        if (t->tok_len[id] == strlen(markers[i]) &&
            memcmp(t->tokens[id], markers[i], t->tok_len[id]) == 0)
            return true;
    return false;
}

int32_t hpd_tokenizer_id(const hpd_tokenizer_t *t, const char *token)
{
    for (uint32_t i = 0; i < t->n_added; i++)
        if (strcmp(t->tokens[t->added[i]], token) == 0)
            return t->added[i];
    return vocab_find(t, token, strlen(token));
}

/* ---- encoding */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} ids_t;

static hpd_status_t push(ids_t *v, int32_t id)
{
    if (hpd_grow(&v->ids, &v->cap, v->n + 1, sizeof(int32_t)) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    v->ids[v->n++] = id;
    return HPD_OK;
}

/* A long pre-token's merges in O(n log n): the candidate pairs in a heap
 * ordered by (rank, position of the left symbol), each checked when it is
 * taken (its symbols may have merged since), as tokenizers' word.rs does.
 * The same merges as the pass-by-pass search below: the lowest rank first,
 * the leftmost of equal ranks. sym[i] is the symbol starting at byte i. */
typedef struct {
    uint32_t rank, pos;
} cand_t;

static bool cand_less(cand_t a, cand_t b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(cand_t *h, size_t *n, cand_t c)
{
    size_t i = (*n)++;
    for (; i > 0 && cand_less(c, h[(i - 1) / 2]); i = (i - 1) / 2)
        h[i] = h[(i - 1) / 2];
    h[i] = c;
}

static cand_t heap_pop(cand_t *h, size_t *n)
{
    const cand_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c]))
            c++;
        if (!cand_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static hpd_status_t bpe_heap(const hpd_tokenizer_t *t, size_t n, int32_t *sym, ids_t *out)
{
    uint32_t *next = malloc(n * sizeof(uint32_t)), *prev = malloc(n * sizeof(uint32_t));
    cand_t *heap = malloc(2 * n * sizeof(cand_t)); /* n - 1 pairs, then 2 per merge */
    size_t nh = 0;
    hpd_status_t st = HPD_OK;
    if (next == NULL || prev == NULL || heap == NULL) {
        st = HPD_ERR_NO_MEMORY;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        next[i] = (uint32_t)(i + 1); /* n: none */
        prev[i] = i > 0 ? (uint32_t)(i - 1) : UINT32_MAX;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const pair_slot_t *p = merge_find(t, sym[i], sym[i + 1]);
        if (p != NULL)
            heap_push(heap, &nh, (cand_t){p->rank, (uint32_t)i});
    }
    while (nh > 0) {
        const cand_t c = heap_pop(heap, &nh);
        const uint32_t a = c.pos, b = next[a];
        if (sym[a] < 0 || b >= n)
            continue; /* merged into its left neighbour, or last */
        const pair_slot_t *p = merge_find(t, sym[a], sym[b]);
        if (p == NULL || p->rank != c.rank)
            continue; /* the pair changed since */
        sym[a] = p->merged;
        sym[b] = -1;
        next[a] = next[b];
        if (next[a] < n)
            prev[next[a]] = a;
        if (prev[a] != UINT32_MAX && (p = merge_find(t, sym[prev[a]], sym[a])) != NULL)
            heap_push(heap, &nh, (cand_t){p->rank, prev[a]});
        if (next[a] < n && (p = merge_find(t, sym[a], sym[next[a]])) != NULL)
            heap_push(heap, &nh, (cand_t){p->rank, a});
    }
    for (size_t i = 0; i < n && st == HPD_OK; i = next[i])
        st = push(out, sym[i]);
out:
    free(next);
    free(prev);
    free(heap);
    return st;
}

/* Pre-tokens longer than this merge through the heap; shorter ones by
 * passes, which is faster for them (no allocation). */
#define BPE_HEAP_BYTES 48

/* Byte-level BPE of one pre-token: its bytes become tokens, then the
 * lowest-ranked adjacent pair is merged (the leftmost of equal ranks) until
 * no pair has a merge, as tokenizers' BPE does. */
static hpd_status_t bpe(const hpd_tokenizer_t *t, const uint8_t *s, size_t n, ids_t *out,
                        int32_t *sym)
{
    size_t m = n;
    if (t->ignore_merges) { /* the whole word, when the vocabulary has it */
        char buf[1024];
        size_t bl = 0;
        for (size_t i = 0; i < n && bl + 4 < sizeof(buf); i++)
            bl += (size_t)utf8proc_encode_char(t->byte_cp[s[i]], (utf8proc_uint8_t *)buf + bl);
        const int32_t id = bl < sizeof(buf) - 4 ? vocab_find(t, buf, bl) : -1;
        if (id >= 0)
            return push(out, id);
    }
    for (size_t i = 0; i < n; i++)
        sym[i] = t->byte_id[s[i]];
    if (n > BPE_HEAP_BYTES)
        return bpe_heap(t, n, sym, out);
    for (;;) {
        uint32_t best = UINT32_MAX;
        size_t at = 0;
        int32_t merged = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            const pair_slot_t *p = merge_find(t, sym[i], sym[i + 1]);
            if (p != NULL && p->rank < best) {
                best = p->rank;
                at = i;
                merged = p->merged;
            }
        }
        if (merged < 0)
            break;
        sym[at] = merged;
        memmove(sym + at + 1, sym + at + 2, (m - at - 2) * sizeof(int32_t));
        m--;
    }
    for (size_t i = 0; i < m; i++) {
        hpd_status_t st = push(out, sym[i]);
        if (st != HPD_OK)
            return st;
    }
    return HPD_OK;
}

/* The pieces of s after Split number k (Isolated: each match and each gap
 * between matches), down to BPE after the last split. */
static hpd_status_t split_and_bpe(const hpd_tokenizer_t *t, uint32_t k, const char *s, size_t n,
                                  ids_t *out, int32_t *sym, pcre2_match_data *md)
{
    if (n == 0)
        return HPD_OK;
    if (k == t->n_split)
        return bpe(t, (const uint8_t *)s, n, out, sym);
    size_t pos = 0, gap = 0;
    hpd_status_t st = HPD_OK;
    while (pos <= n && st == HPD_OK) {
        /* s is valid UTF-8 (sanitized, then NFC) and pos on a character:
         * without NO_UTF_CHECK, PCRE2 checks all of s again at every match,
         * quadratic in the text (1 MB without a special token took 33 s) */
        const int rc = pcre2_match(t->split[k], (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md,
                                   NULL);
        if (rc < 0)
            break;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { /* an empty match: move on a character */
            pos = ov[0] + 1;
            while (pos < n && ((uint8_t)s[pos] & 0xc0) == 0x80)
                pos++;
            continue;
        }
        if ((st = split_and_bpe(t, k + 1, s + gap, ov[0] - gap, out, sym, md)) == HPD_OK)
            st = split_and_bpe(t, k + 1, s + ov[0], ov[1] - ov[0], out, sym, md);
        gap = pos = ov[1];
    }
    return st == HPD_OK ? split_and_bpe(t, k + 1, s + gap, n - gap, out, sym, md) : st;
}

/* Text between added tokens: normalised, pre-tokenised, BPE. */
static hpd_status_t encode_plain(const hpd_tokenizer_t *t, const char *s, size_t n, bool first,
                                 ids_t *out, pcre2_match_data *md)
{
    char *norm = NULL;
    const char *p = s;
    size_t pn = n;
    hpd_status_t st;
    if (n == 0)
        return HPD_OK;
    if (t->nfc) {
        /* NFC of exactly n bytes: a NUL (U+0000) is a character like any
         * other, not the end of the text (utf8proc_NFC stops at it) */
        utf8proc_uint8_t *z;
        const utf8proc_ssize_t zn = utf8proc_map((const utf8proc_uint8_t *)s,
                                                 (utf8proc_ssize_t)n, &z,
                                                 UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (zn < 0)
            return zn == UTF8PROC_ERROR_NOMEM ? HPD_ERR_NO_MEMORY : HPD_ERR_INTERNAL;
        norm = (char *)z;
        p = norm;
        pn = (size_t)zn;
    }
    char *spaced = NULL;
    if (t->add_prefix_space && first && p[0] != ' ') {
        if ((spaced = malloc(pn + 2)) == NULL) {
            free(norm);
            return HPD_ERR_NO_MEMORY;
        }
        spaced[0] = ' ';
        memcpy(spaced + 1, p, pn + 1);
        p = spaced;
        pn++;
    }
    int32_t *sym = malloc((pn + 1) * sizeof(int32_t));
    st = sym == NULL ? HPD_ERR_NO_MEMORY : split_and_bpe(t, 0, p, pn, out, sym, md);
    free(sym);
    free(spaced);
    free(norm);
    return st;
}

hpd_status_t hpd_tokenizer_encode_literal(const hpd_tokenizer_t *t, const char *text,
                                          size_t len, const hpd_text_range_t *lit,
                                          size_t n_lit, int32_t **ids_p, size_t *n_p)
{
    char *s = NULL;
    size_t n = 0, cap = 0;
    ids_t out = {0};
    hpd_status_t st = HPD_OK;
    hpd_text_range_t *at = NULL; /* the literal ranges, in the sanitized text's offsets */
    pcre2_match_data *md = NULL;

    for (size_t r = 0; r < n_lit; r++) {
        if (lit[r].begin > lit[r].end || lit[r].end > len ||
            (r > 0 && lit[r].begin < lit[r - 1].end)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "encode: literal range %zu [%zu, %zu) is out of order "
                          "or past the text's %zu bytes", r, lit[r].begin, lit[r].end, len);
            return HPD_ERR_INVALID_ARG;
        }
    }
    if (n_lit > 0 && (at = malloc(n_lit * sizeof(*at))) == NULL)
        return HPD_ERR_NO_MEMORY;
    /* invalid UTF-8 becomes U+FFFD piece by piece, so that the ranges move
     * with their bytes (a range's edge is never inside a character) */
    size_t from = 0;
    for (size_t r = 0; r <= n_lit && st == HPD_OK; r++) {
        const size_t b = r < n_lit ? lit[r].begin : len;
        st = sanitize((const uint8_t *)text + from, b - from, true, &s, &n, &cap, NULL);
        if (r == n_lit || st != HPD_OK)
            break;
        at[r].begin = n;
        st = sanitize((const uint8_t *)text + b, lit[r].end - b, true, &s, &n, &cap, NULL);
        at[r].end = n;
        from = lit[r].end;
    }
    if (st == HPD_OK && (md = pcre2_match_data_create(4, NULL)) == NULL)
        st = HPD_ERR_NO_MEMORY;
    size_t start = 0, i = 0, r = 0;
    while (st == HPD_OK && i < n) {
        int32_t hit = -1;
        while (r < n_lit && at[r].end <= i)
            r++;
        for (uint32_t a = 0; t->added_first[(uint8_t)s[i]] && a < t->n_added; a++) {
            const int32_t id = t->added[a];
            if (t->tok_len[id] <= n - i && memcmp(s + i, t->tokens[id], t->tok_len[id]) == 0) {
                hit = id; /* the longest, the list being longest first */
                break;
            }
        }
        /* a special token touching a literal range is text */
        if (hit >= 0 && t->kind[hit] == 3 && r < n_lit && at[r].begin < i + t->tok_len[hit])
            hit = -1;
        if (hit < 0) {
            i++;
            continue;
        }
        if ((st = encode_plain(t, s + start, i - start, start == 0, &out, md)) == HPD_OK)
            st = push(&out, hit);
        i += t->tok_len[hit];
        start = i;
    }
    if (st == HPD_OK)
        st = encode_plain(t, s + start, n - start, start == 0, &out, md);
    pcre2_match_data_free(md);
    free(s);
    free(at);
    if (st != HPD_OK) {
        free(out.ids);
        return st;
    }
    *ids_p = out.ids;
    *n_p = out.n;
    return HPD_OK;
}

hpd_status_t hpd_tokenizer_encode(const hpd_tokenizer_t *t, const char *text, size_t len,
                                  int32_t **ids_p, size_t *n_p)
{
    return hpd_tokenizer_encode_literal(t, text, len, NULL, 0, ids_p, n_p);
}

/* ---- decoding */

/* The bytes of one token: an added token's content as it is, a vocabulary
 * token's characters through the byte map. */
static hpd_status_t token_bytes(const hpd_tokenizer_t *t, int32_t id, char **out, size_t *len,
                                size_t *cap)
{
    if (id < 0 || (uint32_t)id >= t->size || t->kind[id] == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "decode: token id %d is not in the vocabulary (0 to %u)", id,
                      t->size - 1);
        return HPD_ERR_INVALID_ARG;
    }
    if (t->kind[id] >= 2)
        return put(out, len, cap, t->tokens[id], t->tok_len[id]);
    const uint8_t *s = (const uint8_t *)t->tokens[id];
    utf8proc_int32_t cp;
    for (size_t i = 0; i < t->tok_len[id];) {
        const utf8proc_ssize_t k = utf8proc_iterate(s + i, t->tok_len[id] - i, &cp);
        if (k <= 0)
            return HPD_ERR_INTERNAL; /* checked at load: vocabulary strings come from JSON */
        const uint8_t b = (uint8_t)t->cp_byte[cp]; /* checked at load */
        hpd_status_t st = put(out, len, cap, &b, 1);
        if (st != HPD_OK)
            return st;
        i += (size_t)k;
    }
    return HPD_OK;
}

hpd_status_t hpd_tokenizer_token_bytes(const hpd_tokenizer_t *t, int32_t id, char **bytes_p,
                                       size_t *len_p)
{
    char *out = NULL;
    size_t len = 0, cap = 0;
    const hpd_status_t st = token_bytes(t, id, &out, &len, &cap);
    if (st != HPD_OK) {
        free(out);
        return st;
    }
    *bytes_p = out;
    *len_p = len;
    return HPD_OK;
}

hpd_status_t hpd_detok_next(const hpd_tokenizer_t *t, hpd_detok_t *d, int32_t id, char **out,
                            size_t *len, size_t *cap)
{
    char *raw = NULL;
    size_t rn = 0, rc = 0, kept;
    hpd_status_t st;

    if (d->skip_special && id >= 0 && (uint32_t)id < t->size && t->kind[id] == 3 &&
        !hpd_tokenizer_is_marker(t, id))
        return HPD_OK;
    if ((st = put(&raw, &rn, &rc, d->pending, d->n_pending)) != HPD_OK ||
        (st = token_bytes(t, id, &raw, &rn, &rc)) != HPD_OK ||
        (st = sanitize((const uint8_t *)raw, rn, false, out, len, cap, &kept)) != HPD_OK) {
        free(raw);
        return st;
    }
    /* a character cut short at the end waits (at most 3 bytes) */
    memcpy(d->pending, raw + rn - kept, kept);
    d->n_pending = (uint32_t)kept;
    free(raw);
    if (*out == NULL)
        return put(out, len, cap, "", 0);
    return HPD_OK;
}

hpd_status_t hpd_detok_finish(hpd_detok_t *d, char **out, size_t *len, size_t *cap)
{
    hpd_status_t st = sanitize(d->pending, d->n_pending, true, out, len, cap, NULL);
    d->n_pending = 0;
    if (st == HPD_OK && *out == NULL)
        st = put(out, len, cap, "", 0);
    return st;
}

hpd_status_t hpd_tokenizer_decode(const hpd_tokenizer_t *t, const int32_t *ids, size_t n,
                                  bool skip_special, char **text_p, size_t *len_p)
{
    hpd_detok_t d = {.skip_special = skip_special};
    char *out = NULL;
    size_t len = 0, cap = 0;
    hpd_status_t st = HPD_OK;
    for (size_t i = 0; i < n && st == HPD_OK; i++)
        st = hpd_detok_next(t, &d, ids[i], &out, &len, &cap);
    if (st == HPD_OK)
        st = hpd_detok_finish(&d, &out, &len, &cap);
    if (st != HPD_OK) {
        free(out);
        return st;
    }
    *text_p = out;
    *len_p = len;
    return HPD_OK;
}
