/* The grammar engine against llguidance: every document of the corpus
 * (tests/grammar/corpus.json, tools/grammar_fixture.py) judged alike, and
 * the same tokens allowed at every position of the recorded ones; the
 * schemas outside the subset refused by name. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/util.h"
#include "grammar/grammar.h"
#include "tests/test_helpers.h"
#include "tokenizer/tokenizer.h"

static json_t *load_corpus(void)
{
    json_error_t je;
    json_t *c = json_load_file(HPD_GRAMMAR_CORPUS, 0, &je);
    if (c == NULL)
        fail_msg("%s: %s", HPD_GRAMMAR_CORPUS, je.text);
    return c;
}

static hpd_grammar_t *compile_case(json_t *cs)
{
    hpd_grammar_format_t fmt = hpd_grammar_format_default();
    fmt.whitespace_flexible = strcmp(json_string_value(json_object_get(cs, "format")), "flexible") == 0;
    char *text = json_dumps(json_object_get(cs, "schema"), JSON_ENCODE_ANY);
    hpd_grammar_t *g = NULL;
    char err[256];
    const hpd_status_t st = hpd_grammar_from_schema(text, strlen(text), &fmt, &g, err, sizeof(err));
    if (st != HPD_OK)
        fail_msg("%s: %s", text, err);
    free(text);
    return g;
}

/* Every document: accepted and whole exactly when llguidance says so. */
static void test_corpus(void **state)
{
    json_t *corpus = load_corpus();
    size_t i, j, checked = 0;
    json_t *cs, *d;
    json_array_foreach(json_object_get(corpus, "cases"), i, cs) {
        hpd_grammar_t *g = compile_case(cs);
        json_array_foreach(json_object_get(cs, "docs"), j, d) {
            hpd_matcher_t *m;
            assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
            const char *doc = json_string_value(json_object_get(d, "doc"));
            const bool valid = hpd_matcher_accept_bytes(m, (const uint8_t *)doc, strlen(doc));
            const bool whole = valid && hpd_matcher_can_end(m);
            if (valid != json_is_true(json_object_get(d, "valid")) ||
                whole != json_is_true(json_object_get(d, "whole"))) {
                char *s = json_dumps(json_object_get(cs, "schema"), JSON_ENCODE_ANY);
                fail_msg("%s (%s) %s: valid %d whole %d, llguidance %d %d", s,
                         json_string_value(json_object_get(cs, "format")), doc, valid, whole,
                         json_is_true(json_object_get(d, "valid")),
                         json_is_true(json_object_get(d, "whole")));
            }
            hpd_matcher_destroy(m);
            checked++;
        }
        hpd_grammar_destroy(g);
    }
    assert_true(checked > 250);
    json_decref(corpus);
}

static void hex_mask(const char *hex, uint32_t *mask, uint32_t words)
{
    for (uint32_t w = 0; w < words; w++) {
        uint32_t v = 0;
        for (int b = 0; b < 4; b++) {
            unsigned byte;
            sscanf(hex + (w * 4 + b) * 2, "%2x", &byte);
            v |= (uint32_t)byte << (8 * b);
        }
        mask[w] = v;
    }
}

/* At every position of the recorded documents, the same allowed tokens. */
static void test_masks(void **state)
{
    json_t *corpus = load_corpus();
    hpd_tokenizer_t *tok;
    hpd_vocab_t *v;
    assert_int_equal(hpd_tokenizer_load(HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json", &tok), HPD_OK);
    assert_int_equal(hpd_vocab_from_tokenizer(tok, &v), HPD_OK);
    const uint32_t n_vocab = (uint32_t)json_integer_value(json_object_get(corpus, "n_vocab"));
    assert_int_equal(hpd_vocab_size(v), n_vocab);
    const int32_t eos = (int32_t)json_integer_value(json_object_get(corpus, "eos"));
    const uint32_t words = (n_vocab + 31) / 32;
    uint32_t *ours = calloc(words, 4), *theirs = calloc(words, 4);
    size_t i, j, k, positions = 0;
    json_t *cs, *d, *hex;
    json_array_foreach(json_object_get(corpus, "cases"), i, cs) {
        hpd_grammar_t *g = compile_case(cs);
        json_array_foreach(json_object_get(cs, "docs"), j, d) {
            json_t *masks = json_object_get(d, "masks"), *ids = json_object_get(d, "ids");
            if (masks == NULL)
                continue;
            hpd_matcher_t *m;
            assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
            json_array_foreach(masks, k, hex) {
                hex_mask(json_string_value(hex), theirs, words);
                assert_int_equal(hpd_matcher_mask(m, v, &eos, 1, ours), HPD_OK);
                for (uint32_t w = 0; w < words; w++)
                    if (ours[w] != theirs[w]) {
                        const uint32_t diff = ours[w] ^ theirs[w];
                        const uint32_t id = w * 32 + (uint32_t)__builtin_ctz(diff);
                        char *b;
                        size_t len;
                        hpd_tokenizer_token_bytes(tok, (int32_t)id, &b, &len);
                        fail_msg("%s (%s) doc %s position %zu: token %u '%.*s' %s by us only",
                                 json_dumps(json_object_get(cs, "schema"), JSON_ENCODE_ANY),
                                 json_string_value(json_object_get(cs, "format")),
                                 json_string_value(json_object_get(d, "doc")), k, id, (int)len, b,
                                 ours[w] >> (id % 32) & 1 ? "allowed" : "refused");
                    }
                positions++;
                if (k < json_array_size(ids))
                    assert_int_equal(hpd_matcher_accept_token(
                                         m, v, (int32_t)json_integer_value(json_array_get(ids, k)),
                                         &eos, 1),
                                     HPD_OK);
            }
            hpd_matcher_destroy(m);
        }
        hpd_grammar_destroy(g);
    }
    assert_true(positions > 100);
    free(ours);
    free(theirs);
    hpd_vocab_destroy(v);
    hpd_tokenizer_destroy(tok);
    json_decref(corpus);
}

/* Inside a tool call's raw string value (Qwen3.5's XML form), where no
 * byte is forced, the mask is the tokens that continue the call, token by
 * token: the shortcut for plain tokens in free text agrees with the
 * matcher, in the value, after a piece of the terminator or a false start
 * of it, and in a value held to a pattern. */
static void test_text_masks(void **state)
{
    hpd_tokenizer_t *tok;
    hpd_vocab_t *v;
    assert_int_equal(hpd_tokenizer_load(HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json", &tok), HPD_OK);
    assert_int_equal(hpd_vocab_from_tokenizer(tok, &v), HPD_OK);
    const uint32_t n = hpd_vocab_size(v), words = (n + 31) / 32;
    uint32_t *mask = calloc(words, 4);
    static const char *const specs[] = {
        "{\"tool_call\": {\"format\": \"xml\", \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"s\": "
        "{\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}}, \"required\": [\"s\"]}}}]}}",
        "{\"tool_call\": {\"format\": \"xml\", \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"s\": "
        "{\"type\": \"string\", \"pattern\": \"^[a-z ]+$\", \"maxLength\": 6}}}}}]}}",
    };
    static const char *const prefixes[] = {
        "<tool_call>\n<function=f>\n<parameter=s>\n",
        "<tool_call>\n<function=f>\n<parameter=s>\nab",
        "<tool_call>\n<function=f>\n<parameter=s>\nab\n",
        "<tool_call>\n<function=f>\n<parameter=s>\nab\n</par",
        "<tool_call>\n<function=f>\n<parameter=s>\nab\n</x",
    };
    uint32_t checked = 0;
    for (size_t si = 0; si < 2; si++) {
        hpd_grammar_t *g;
        char err[256];
        if (hpd_grammar_from_spec(specs[si], strlen(specs[si]), &g, err, sizeof(err)) != HPD_OK)
            fail_msg("%s", err);
        for (size_t pi = 0; pi < sizeof(prefixes) / sizeof(prefixes[0]); pi++) {
            hpd_matcher_t *m;
            assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
            const bool live = hpd_matcher_accept_bytes(m, (const uint8_t *)prefixes[pi],
                                                       strlen(prefixes[pi]));
            if (!live || (si == 1 && pi >= 2)) { /* the pattern refuses '\n' in the value:
                                                     what is left is forced, spelled as the
                                                     tokenizer spells it (test_masks) */
                hpd_matcher_destroy(m);
                continue;
            }
            assert_int_equal(hpd_matcher_mask(m, v, NULL, 0, mask), HPD_OK);
            hpd_matcher_destroy(m);
            for (uint32_t id = 0; id < n; id++) {
                if (hpd_tokenizer_is_marker(tok, (int32_t)id)) { /* offered only where forced */
                    assert_false(mask[id / 32] >> (id % 32) & 1);
                    continue;
                }
                hpd_matcher_t *one;
                assert_int_equal(hpd_matcher_create(g, &one), HPD_OK);
                assert_true(hpd_matcher_accept_bytes(one, (const uint8_t *)prefixes[pi],
                                                     strlen(prefixes[pi])));
                const bool ok = hpd_matcher_accept_token(one, v, (int32_t)id, NULL, 0) == HPD_OK;
                hpd_matcher_destroy(one);
                if (ok != (bool)(mask[id / 32] >> (id % 32) & 1)) {
                    char *b;
                    size_t len;
                    hpd_tokenizer_token_bytes(tok, (int32_t)id, &b, &len);
                    fail_msg("spec %zu after [%s]: token %u '%.*s' is %s by the mask, %s by the "
                             "matcher", si, prefixes[pi], id, (int)len, b,
                             ok ? "refused" : "allowed", ok ? "taken" : "refused");
                }
            }
            checked++;
        }
        hpd_grammar_destroy(g);
    }
    assert_int_equal(checked, 7);
    free(mask);
    hpd_vocab_destroy(v);
    hpd_tokenizer_destroy(tok);
}

/* Qwen3.5's <tool_call> and </tool_call> are special tokens, which the
 * model writes its calls with: a required call's mask offers them where
 * the literal is forced (the tokenizer spells it so), the matcher takes
 * them by their text, and no JSON string or free text offers them; the
 * text of a </think> marker is kept when specials are skipped, an
 * <|im_end|>'s is not. */
static void test_markers(void **state)
{
    char *text, path[320], dir[256];
    size_t len;
    assert_int_equal(hpd_read_file(HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json", &text, &len),
                     HPD_OK);
    json_t *j = json_loadb(text, len, 0, NULL);
    free(text);
    assert_non_null(j);
    json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab"), *x;
    json_int_t next = 0;
    const char *k;
    size_t i;
    json_object_foreach(vocab, k, x) next = json_integer_value(x) >= next ? json_integer_value(x) + 1 : next;
    json_array_foreach(json_object_get(j, "added_tokens"), i, x)
        next = json_integer_value(json_object_get(x, "id")) >= next
                   ? json_integer_value(json_object_get(x, "id")) + 1
                   : next;
    const json_int_t open_id = next, close_id = next + 1;
    static const char *const marks[] = {"<tool_call>", "</tool_call>"};
    for (int m = 0; m < 2; m++)
        json_array_append_new(json_object_get(j, "added_tokens"),
                              json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", open_id + m,
                                        "content", marks[m], "single_word", 0, "lstrip", 0,
                                        "rstrip", 0, "normalized", 0, "special", 1));
    test_tmpdir(dir, sizeof(dir), "markers");
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(j, path, 0), 0);
    json_decref(j);
    hpd_tokenizer_t *tok;
    hpd_vocab_t *v;
    assert_int_equal(hpd_tokenizer_load(path, &tok), HPD_OK);
    assert_true(hpd_tokenizer_is_special(tok, (int32_t)open_id));
    assert_true(hpd_tokenizer_is_marker(tok, (int32_t)open_id));
    assert_false(hpd_tokenizer_is_marker(tok, hpd_tokenizer_id(tok, "<|im_end|>")));
    assert_int_equal(hpd_vocab_from_tokenizer(tok, &v), HPD_OK);
    const uint32_t words = (hpd_vocab_size(v) + 31) / 32;
    uint32_t *mask = calloc(words, 4);
    /* a required call: the call opens with the marker, closes with the other */
    static const char spec[] =
        "{\"tool_call\": {\"format\": \"xml\", \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"s\": "
        "{\"type\": \"string\"}}, \"required\": [\"s\"]}}}]}}";
    hpd_grammar_t *g;
    hpd_matcher_t *mt;
    assert_int_equal(hpd_grammar_from_spec(spec, sizeof(spec) - 1, &g, NULL, 0), HPD_OK);
    assert_int_equal(hpd_matcher_create(g, &mt), HPD_OK);
    assert_int_equal(hpd_matcher_mask(mt, v, NULL, 0, mask), HPD_OK);
    assert_true(mask[open_id / 32] >> (open_id % 32) & 1);
    assert_int_equal(hpd_matcher_accept_token(mt, v, (int32_t)open_id, NULL, 0), HPD_OK);
    static const char body[] = "\n<function=f>\n<parameter=s>\nab\n</parameter>\n</function>\n";
    assert_true(hpd_matcher_accept_bytes(mt, (const uint8_t *)body, sizeof(body) - 1));
    assert_int_equal(hpd_matcher_mask(mt, v, NULL, 0, mask), HPD_OK);
    assert_true(mask[close_id / 32] >> (close_id % 32) & 1);
    assert_int_equal(hpd_matcher_accept_token(mt, v, (int32_t)close_id, NULL, 0), HPD_OK);
    assert_true(hpd_matcher_can_end(mt));
    hpd_matcher_destroy(mt);
    /* never inside free text or a JSON string */
    assert_int_equal(hpd_matcher_create(g, &mt), HPD_OK);
    static const char in_value[] = "<tool_call>\n<function=f>\n<parameter=s>\nab";
    assert_true(hpd_matcher_accept_bytes(mt, (const uint8_t *)in_value, sizeof(in_value) - 1));
    assert_int_equal(hpd_matcher_mask(mt, v, NULL, 0, mask), HPD_OK);
    assert_false(mask[open_id / 32] >> (open_id % 32) & 1);
    hpd_matcher_destroy(mt);
    hpd_grammar_destroy(g);
    static const char str[] = "{\"json_schema\": {\"type\": \"string\"}}";
    assert_int_equal(hpd_grammar_from_spec(str, sizeof(str) - 1, &g, NULL, 0), HPD_OK);
    assert_int_equal(hpd_matcher_create(g, &mt), HPD_OK);
    assert_true(hpd_matcher_accept_bytes(mt, (const uint8_t *)"\"a", 2));
    assert_int_equal(hpd_matcher_mask(mt, v, NULL, 0, mask), HPD_OK);
    assert_false(mask[open_id / 32] >> (open_id % 32) & 1);
    assert_int_equal(hpd_matcher_accept_token(mt, v, (int32_t)open_id, NULL, 0), HPD_OK);
    hpd_matcher_destroy(mt);
    hpd_grammar_destroy(g);
    /* decoding with specials skipped keeps a marker's text */
    const int32_t ids[] = {hpd_tokenizer_id(tok, "</think>"), hpd_tokenizer_id(tok, "<|im_end|>")};
    char *out;
    size_t n;
    assert_int_equal(hpd_tokenizer_decode(tok, ids, 2, true, &out, &n), HPD_OK);
    assert_string_equal(out, "</think>");
    free(out);
    free(mask);
    hpd_vocab_destroy(v);
    hpd_tokenizer_destroy(tok);
    test_rmtree(dir);
}

/* Outside the subset, or malformed: refused, the message naming the
 * keyword or the value and where it is. */
static void test_refusals(void **state)
{
    static const struct {
        const char *schema, *msg;
        hpd_status_t st;
    } cases[] = {
        {"{\"type\": \"integer\", \"minimum\": 3}", "#: keyword 'minimum' is not supported",
         HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"format\": \"email\"}}}",
         "#/properties/a: keyword 'format' is not supported", HPD_ERR_UNSUPPORTED},
        {"{\"oneOf\": [{\"type\": \"string\"}]}", "keyword 'oneOf'", HPD_ERR_UNSUPPORTED},
        {"{\"allOf\": [{\"type\": \"string\"}]}", "keyword 'allOf'", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"array\", \"prefixItems\": []}", "keyword 'prefixItems'", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"strin\"}", "unknown type 'strin'", HPD_ERR_INVALID_ARG},
        {"{\"$ref\": \"#/$defs/missing\"}", "$ref '#/$defs/missing' names nothing", HPD_ERR_INVALID_ARG},
        {"{\"$ref\": \"http://x/y.json\"}", "only refs within the schema", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"string\", \"pattern\": \"(?=a)b\"}", "a group of this kind", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"string\", \"pattern\": \"\\\\bword\"}", "this escape", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"string\", \"pattern\": \"(a)\\\\1\"}", "this escape", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"string\", \"pattern\": \"a{1000}\"}", "repetition count", HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"string\", \"minLength\": -1}", "'minLength' must be a non-negative integer",
         HPD_ERR_INVALID_ARG},
        {"{\"type\": \"object\", \"required\": [\"x\"]}", "'required' name not in 'properties' (x)",
         HPD_ERR_UNSUPPORTED},
        {"{\"anyOf\": [{\"type\": \"string\"}], \"type\": \"string\"}", "keyword 'type' beside $ref or anyOf",
         HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"items\": {\"not\": {}}}}}",
         "#/properties/a/items: keyword 'not'", HPD_ERR_UNSUPPORTED},
        {"false", "allows nothing", HPD_ERR_INVALID_ARG},
        {"{\"type\": ", "not JSON", HPD_ERR_INVALID_ARG},
        {"{\"enum\": []}", "'enum' must be a non-empty array", HPD_ERR_INVALID_ARG},
        /* hostile patterns: refused, not followed into the stack or the DFA */
        {"{\"type\": \"string\", \"pattern\": \"^(a|b)*a(a|b){20}$\"}", "needs over 4096 DFA states",
         HPD_ERR_UNSUPPORTED},
        {"{\"type\": \"string\", \"pattern\": \"^((a{100}){100}){100}$\"}", "a pattern this large",
         HPD_ERR_UNSUPPORTED},
    };
    /* 20,000 nested groups */
    char *deep = malloc(40100);
    size_t dn = (size_t)sprintf(deep, "{\"type\": \"string\", \"pattern\": \"");
    for (int i = 0; i < 20000; i++)
        deep[dn++] = '(';
    deep[dn++] = 'a';
    for (int i = 0; i < 20000; i++)
        deep[dn++] = ')';
    dn += (size_t)sprintf(deep + dn, "\"}");
    hpd_grammar_t *dg = NULL;
    char derr[256];
    assert_int_equal(hpd_grammar_from_schema(deep, dn, NULL, &dg, derr, sizeof(derr)),
                     HPD_ERR_UNSUPPORTED);
    assert_non_null(strstr(derr, "groups nested deeper than 64"));
    free(deep);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hpd_grammar_t *g = NULL;
        char err[256];
        const hpd_status_t st =
            hpd_grammar_from_schema(cases[i].schema, strlen(cases[i].schema), NULL, &g, err, sizeof(err));
        if (st != cases[i].st || strstr(err, cases[i].msg) == NULL)
            fail_msg("%s: status %d, message '%s' (expected %d with '%s')", cases[i].schema, st, err,
                     cases[i].st, cases[i].msg);
        assert_null(g);
    }
}

/* A schema that refers to itself without consuming a byte matches
 * nothing, and does not loop. */
static void test_self_reference(void **state)
{
    static const char *const schemas[] = {"{\"$ref\": \"#\"}",
                                          "{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}"};
    for (size_t i = 0; i < 2; i++) {
        hpd_grammar_t *g;
        hpd_matcher_t *m;
        assert_int_equal(hpd_grammar_from_schema(schemas[i], strlen(schemas[i]), NULL, &g, NULL, 0),
                         HPD_OK);
        assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
        assert_int_equal(hpd_matcher_accept_bytes(m, (const uint8_t *)"null", 4), i == 1);
        hpd_matcher_destroy(m);
        hpd_grammar_destroy(g);
    }
}

/* json_object: any object, nested to the depth limit and no further. */
static void test_json_object(void **state)
{
    hpd_grammar_t *g;
    hpd_matcher_t *m;
    assert_int_equal(hpd_grammar_json_object(NULL, &g), HPD_OK);
    assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
    assert_false(hpd_matcher_accept_bytes(m, (const uint8_t *)"[]", 2));
    const char *doc = "{\"a\": [1, {\"b\": null}], \"c\": \"x\"}";
    assert_true(hpd_matcher_accept_bytes(m, (const uint8_t *)doc, strlen(doc)));
    assert_true(hpd_matcher_can_end(m));
    assert_true(hpd_matcher_must_end(m));
    hpd_matcher_destroy(m);
    /* a refused byte leaves the matcher where it was */
    assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
    assert_true(hpd_matcher_accept_bytes(m, (const uint8_t *)"{\"a\": ", 6));
    assert_false(hpd_matcher_accept_bytes(m, (const uint8_t *)"}", 1));
    assert_true(hpd_matcher_accept_bytes(m, (const uint8_t *)"1}", 2));
    assert_true(hpd_matcher_can_end(m));
    hpd_matcher_destroy(m);
    /* 200 nested arrays: past the stack's depth */
    char deep[512];
    memset(deep, 0, sizeof(deep));
    strcpy(deep, "{\"a\": ");
    memset(deep + 6, '[', 200);
    assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
    assert_false(hpd_matcher_accept_bytes(m, (const uint8_t *)deep, strlen(deep)));
    assert_true(hpd_matcher_accept_bytes(m, (const uint8_t *)deep, 100));
    hpd_matcher_destroy(m);
    hpd_grammar_destroy(g);
}

/* accepted bytes and whole: the spec's grammar on doc */
static void judge(const char *spec, const char *doc, bool valid, bool whole)
{
    hpd_grammar_t *g;
    hpd_matcher_t *m;
    char err[256];
    if (hpd_grammar_from_spec(spec, strlen(spec), &g, err, sizeof(err)) != HPD_OK)
        fail_msg("%s: %s", spec, err);
    assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
    const bool ok = hpd_matcher_accept_bytes(m, (const uint8_t *)doc, strlen(doc));
    if (ok != valid || (ok && hpd_matcher_can_end(m) != whole))
        fail_msg("%s on [%s]: valid %d whole %d (expected %d %d)", spec, doc, ok,
                 ok && hpd_matcher_can_end(m), valid, whole);
    hpd_matcher_destroy(m);
    hpd_grammar_destroy(g);
}

/* Specs (the cluster's grammar field): json_schema, json_object, the
 * layout, after_token; tool calls in both forms (a string value is text
 * that cannot hold its terminator); refs into arrays; the end of a
 * document a later stack holds; a whole document that may still grow. */
static void test_specs(void **state)
{
    judge("{\"json_object\": true}", "{\"a\": [1]}", true, true);
    judge("{\"json_object\": true, \"whitespace_flexible\": true}", "{ \"a\" :\n[1] }", true, true);
    judge("{\"json_object\": true}", "{ \"a\": 1}", false, false);
    judge("{\"json_schema\": {\"anyOf\": [{\"type\": \"integer\"}, {\"$ref\": \"#/anyOf/0\"}]}}", "5",
          true, true);
    judge("{\"json_schema\": {\"$defs\": {\"l\": [{\"type\": \"integer\"}, {\"type\": \"boolean\"}]}, "
          "\"$ref\": \"#/$defs/l/1\"}}", "true", true, true);
    judge("{\"json_schema\": {\"enum\": [12, 1]}}", "1", true, true); /* the second stack ends */
    judge("{\"json_schema\": {\"enum\": [12, 1]}}", "12", true, true);
    static const char tools[] =
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"s\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}, "
        "\"e\": {\"enum\": [\"x\", \"y\"]}}, \"required\": [\"s\"]}}}, {\"type\": \"function\", "
        "\"function\": {\"name\": \"g\"}}]";
    char xml[1024], json[1024];
    snprintf(xml, sizeof(xml), "{\"tool_call\": {\"format\": \"xml\", \"tools\": %s}}", tools);
    snprintf(json, sizeof(json), "{\"tool_call\": {\"format\": \"json\", \"tools\": %s}}", tools);
    judge(xml, "<tool_call>\n<function=f>\n<parameter=s>\nline one\n</param\n</parameter>\n"
               "<parameter=e>\ny\n</parameter>\n</function>\n</tool_call>", true, true);
    judge(xml, "<tool_call>\n<function=f>\n<parameter=s>\na\n</parameter>\n<parameter=n>\n-3\n"
               "</parameter>\n</function>\n</tool_call>", true, true);
    judge(xml, "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n", false, false);
    judge(xml, "<tool_call>\n<function=f>\n<parameter=s>\na\n</parameter>\n<parameter=e>\nz",
          false, false);
    judge(xml, "<tool_call>\n<function=g>\n</function>\n</tool_call>", true, true);
    judge(xml, "<tool_call>\n<function=h>", false, false);
    judge(json, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"a\", \"n\": 2}}\n</tool_call>",
          true, true);
    judge(json, "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"any\": [true]}}\n</tool_call>", true,
          true);
    judge(json, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 2}}", false, false);
    /* Qwen3.5's raw string values keep their schema's pattern and length */
    static const char xmlpat[] =
        "{\"tool_call\": {\"format\": \"xml\", \"tools\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"p\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"c\": {\"type\": \"string\", \"pattern\": \"^[a-z]+$\", "
        "\"maxLength\": 3}, \"d\": {\"type\": \"string\", \"minLength\": 2}}, "
        "\"required\": [\"c\", \"d\"]}}}]}}";
    judge(xmlpat, "<tool_call>\n<function=p>\n<parameter=c>\nab\n</parameter>\n<parameter=d>\n"
                  "\u00e9\u00e9\n</parameter>\n</function>\n</tool_call>", true, true);
    judge(xmlpat, "<tool_call>\n<function=p>\n<parameter=c>\nabcd", false, false);
    judge(xmlpat, "<tool_call>\n<function=p>\n<parameter=c>\na1", false, false);
    judge(xmlpat, "<tool_call>\n<function=p>\n<parameter=c>\n\n</parameter>", false, false);
    judge(xmlpat, "<tool_call>\n<function=p>\n<parameter=c>\nab\n</parameter>\n<parameter=d>\n"
                  "\u00e9\n</parameter>", false, false);
    /* a $ref in a tool's parameters names a place in them */
    static const char reftool[] =
        "{\"tool_call\": {\"format\": \"json\", \"tools\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"r\", \"parameters\": {\"$defs\": {\"h\": {\"type\": "
        "\"boolean\"}}, \"type\": \"object\", \"properties\": {\"b\": {\"$ref\": "
        "\"#/$defs/h\"}}, \"required\": [\"b\"], \"additionalProperties\": false}}}]}}";
    judge(reftool, "<tool_call>\n{\"name\": \"r\", \"arguments\": {\"b\": true}}\n</tool_call>",
          true, true);
    judge(reftool, "<tool_call>\n{\"name\": \"r\", \"arguments\": {\"b\": 1", false, false);
    /* after_token */
    const char *obj = "{\"json_object\": true}";
    char *after = hpd_grammar_spec_after(obj, strlen(obj), 77);
    assert_non_null(after);
    hpd_grammar_t *g;
    assert_int_equal(hpd_grammar_from_spec(after, strlen(after), &g, NULL, 0), HPD_OK);
    assert_int_equal(hpd_grammar_after_token(g), 77);
    hpd_grammar_destroy(g);
    free(after);
    const char *plain = "{\"json_object\": true}";
    assert_int_equal(hpd_grammar_from_spec(plain, strlen(plain), &g, NULL, 0), HPD_OK);
    assert_int_equal(hpd_grammar_after_token(g), -1);
    hpd_grammar_destroy(g);
    /* a whole number may still grow; a closed object may not */
    hpd_matcher_t *m;
    const char *num = "{\"json_schema\": {\"type\": \"integer\"}}";
    assert_int_equal(hpd_grammar_from_spec(num, strlen(num), &g, NULL, 0), HPD_OK);
    assert_int_equal(hpd_matcher_create(g, &m), HPD_OK);
    assert_true(hpd_matcher_accept_bytes(m, (const uint8_t *)"12", 2));
    assert_true(hpd_matcher_can_end(m));
    assert_false(hpd_matcher_must_end(m));
    hpd_matcher_destroy(m);
    hpd_grammar_destroy(g);
    /* bad specs and types, by name */
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"{\"json_object\": false}", "expected {\"json_schema\""},
        {"{\"json_schema\": {}, \"json_object\": true}", "expected {\"json_schema\""},
        {"{\"json_object\": true, \"after_token\": -1}", "after_token"},
        {"{\"json_schema\": {\"type\": \"any\"}}", "unknown type 'any'"},
        {"{\"tool_call\": {\"format\": \"yaml\", \"tools\": []}}", "tool_call.format"},
        {"{\"tool_call\": {\"format\": \"xml\", \"tools\": []}}", "1 to 256 tools"},
        {"{\"tool_call\": {\"format\": \"json\", \"tools\": [{\"function\": {}}]}}",
         "a tool without a function name"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        g = NULL;
        assert_int_not_equal(hpd_grammar_from_spec(bad[i].spec, strlen(bad[i].spec), &g, err,
                                                   sizeof(err)),
                             HPD_OK);
        if (strstr(err, bad[i].msg) == NULL)
            fail_msg("%s: '%s' does not say '%s'", bad[i].spec, err, bad[i].msg);
        assert_null(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus),       cmocka_unit_test(test_masks),
        cmocka_unit_test(test_text_masks),
        cmocka_unit_test(test_markers),
        cmocka_unit_test(test_refusals),     cmocka_unit_test(test_self_reference),
        cmocka_unit_test(test_json_object),   cmocka_unit_test(test_specs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
