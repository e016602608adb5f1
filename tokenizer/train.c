/* A byte-level BPE trained on a text sample, written as a tokenizer.json
 * that Hugging Face tokenizers and hpd_tokenizer_load read alike: the
 * tokenizer of hpd-mkmodel's random models (docs/tokenizer.md). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/log.h"
#include "tokenizer/tokenizer.h"

#define LOG_COMPONENT "tokenizer"

/* Qwen3.5's pre-tokenizer regex */
const char hpd_tokenizer_qwen35_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct {
    int32_t *sym; /* token ids */
    uint32_t n;
    uint32_t count;
} word_t;

/* The words of the sample (pieces of the regex), each once with its count. */
static hpd_status_t words_of(const char *text, size_t len, word_t **words_p, uint32_t *n_p)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)hpd_tokenizer_qwen35_regex, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    word_t *words = NULL;
    uint32_t n = 0, cap = 0;
    size_t pos = 0;
    hpd_status_t st = re && md ? HPD_OK : HPD_ERR_INTERNAL;

    while (st == HPD_OK && pos < len &&
           pcre2_match(re, (PCRE2_SPTR)text, len, pos, pos > 0 ? PCRE2_NO_UTF_CHECK : 0, md,
                       NULL) > 0) { /* the text checked once, at the first match */
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        const uint32_t wl = (uint32_t)(ov[1] - ov[0]);
        if (wl == 0)
            break;
        uint32_t i = 0;
        for (; i < n; i++)
            if (words[i].n == wl) {
                uint32_t k = 0;
                while (k < wl && words[i].sym[k] == (uint8_t)text[ov[0] + k])
                    k++;
                if (k == wl)
                    break;
            }
        if (i < n) {
            words[i].count++;
        } else {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                word_t *p = realloc(words, cap * sizeof(*words));
                if (p == NULL) {
                    st = HPD_ERR_NO_MEMORY;
                    break;
                }
                words = p;
            }
            words[n] = (word_t){.sym = malloc(wl * sizeof(int32_t)), .n = wl, .count = 1};
            if (words[n].sym == NULL) {
                st = HPD_ERR_NO_MEMORY;
                break;
            }
            for (uint32_t k = 0; k < wl; k++)
                words[n].sym[k] = (uint8_t)text[ov[0] + k];
            n++;
        }
        pos = ov[1];
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    *words_p = words;
    *n_p = n;
    return st;
}

hpd_status_t hpd_tokenizer_train(const char *path, const char *sample, size_t len,
                                 uint32_t vocab_size, const char *const *specials,
                                 uint32_t n_specials)
{
    const uint32_t n_merges_max = vocab_size - 256 - n_specials;
    word_t *words = NULL;
    uint32_t n_words = 0, n_tok = 256;
    char **tok = NULL; /* byte-level strings of the tokens */
    json_t *vocab = NULL, *merges = NULL, *added = NULL;
    hpd_status_t st;

    if (vocab_size < 256 + n_specials) {
        HPD_LOG_ERROR(LOG_COMPONENT, "a byte-level BPE needs a vocabulary of at least %u tokens "
                      "(256 bytes and %u special), not %u", 256 + n_specials, n_specials,
                      vocab_size);
        return HPD_ERR_INVALID_ARG;
    }
    vocab = json_object();
    merges = json_array();
    added = json_array();
    if ((st = words_of(sample, len, &words, &n_words)) != HPD_OK ||
        (tok = calloc(vocab_size, sizeof(*tok))) == NULL) {
        st = st != HPD_OK ? st : HPD_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t b = 0; b < 256; b++) {
        tok[b] = calloc(5, 1);
        utf8proc_encode_char((utf8proc_int32_t)hpd_tokenizer_byte_char((uint8_t)b),
                             (utf8proc_uint8_t *)tok[b]);
    }
    /* the most frequent adjacent pair, merged everywhere, until the
     * vocabulary is full or no pair repeats; ties to the smallest ids */
    size_t total = 0;
    for (uint32_t w = 0; w < n_words; w++)
        total += words[w].n;
    uint32_t mask = 64;
    while (mask < 2 * total)
        mask *= 2;
    uint64_t *keys = malloc(mask * sizeof(uint64_t));
    uint32_t *counts = malloc(mask * sizeof(uint32_t));
    if (keys == NULL || counts == NULL) {
        free(keys);
        free(counts);
        st = HPD_ERR_NO_MEMORY;
        goto out;
    }
    mask--;
    while (n_tok < 256 + n_merges_max) {
        uint32_t best_a = 0, best_b = 0, best = 1;
        memset(keys, 0, (mask + 1) * sizeof(uint64_t));
        for (uint32_t w = 0; w < n_words; w++)
            for (uint32_t i = 0; i + 1 < words[w].n; i++) {
                const uint32_t a = (uint32_t)words[w].sym[i], b = (uint32_t)words[w].sym[i + 1];
                const uint64_t key = (((uint64_t)a << 32) | b) + 1;
                uint32_t h = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & mask;
                while (keys[h] != 0 && keys[h] != key)
                    h = (h + 1) & mask;
                if (keys[h] == 0) {
                    keys[h] = key;
                    counts[h] = 0;
                }
                counts[h] += words[w].count;
                const uint32_t c = counts[h];
                if (c > best || (c == best && best > 1 && (a < best_a || (a == best_a && b < best_b)))) {
                    best = c;
                    best_a = a;
                    best_b = b;
                }
            }
        if (best < 2)
            break;
        const size_t la = strlen(tok[best_a]), lb = strlen(tok[best_b]);
        if ((tok[n_tok] = malloc(la + lb + 1)) == NULL) {
            free(keys);
            free(counts);
            st = HPD_ERR_NO_MEMORY;
            goto out;
        }
        memcpy(tok[n_tok], tok[best_a], la);
        memcpy(tok[n_tok] + la, tok[best_b], lb + 1);
        json_array_append_new(merges, json_pack("[s,s]", tok[best_a], tok[best_b]));
        for (uint32_t w = 0; w < n_words; w++) {
            uint32_t o = 0;
            for (uint32_t i = 0; i < words[w].n; i++) {
                if (i + 1 < words[w].n && (uint32_t)words[w].sym[i] == best_a &&
                    (uint32_t)words[w].sym[i + 1] == best_b) {
                    words[w].sym[o++] = (int32_t)n_tok;
                    i++;
                } else {
                    words[w].sym[o++] = words[w].sym[i];
                }
            }
            words[w].n = o;
        }
        n_tok++;
    }
    free(keys);
    free(counts);
    for (uint32_t t = 0; t < n_tok; t++)
        json_object_set_new(vocab, tok[t], json_integer(t));
    /* ids the merges did not fill (the sample ran out of repeated pairs):
     * reserved special tokens, as the released vocabularies have, so that
     * every id a model can emit decodes */
    for (uint32_t id = n_tok; id < vocab_size - n_specials; id++) {
        char name[40];
        snprintf(name, sizeof(name), "<|reserved_%u|>", id);
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                               (int)id, "content", name, "single_word", 0,
                                               "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    }
    /* the special tokens take the last ids of the model's vocabulary */
    for (uint32_t s = 0; s < n_specials; s++)
        json_array_append_new(
            added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                             (int)(vocab_size - n_specials + s), "content", specials[s],
                             "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                             "special", 1));
    json_t *pre = json_pack(
        "{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", hpd_tokenizer_qwen35_regex,
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 0);
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s}, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:n, s:n, "
        "s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
        "NFC", "pre_tokenizer", pre, "post_processor", "decoder", "type", "ByteLevel",
        "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "model", "type", "BPE",
        "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
        "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    added = vocab = merges = NULL; /* root owns them */
    if (root == NULL || json_dump_file(root, path, JSON_INDENT(1) | JSON_ENSURE_ASCII) != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot write %s", path);
        st = HPD_ERR_IO;
    }
    json_decref(root);
out:
    for (uint32_t w = 0; w < n_words; w++)
        free(words[w].sym);
    free(words);
    for (uint32_t t = 0; tok != NULL && t < vocab_size; t++)
        free(tok[t]);
    free(tok);
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    return st;
}
