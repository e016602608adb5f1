/* Structured outputs: a JSON Schema compiled to a grammar, a matcher that
 * follows a document byte by byte, and the token mask it allows next over a
 * tokenizer's vocabulary (docs/structured_outputs.md).
 *
 * The grammar is a graph of JSON value nodes (object, array, string,
 * number, literal, any-of); the matcher's state is a set of stacks of
 * frames, one stack per way the bytes so far can still be read (any-of
 * alternatives, an object's candidate keys); the mask walks a trie of the
 * vocabulary's token bytes against that set, cutting every subtree no stack
 * survives. */
#ifndef HPD_GRAMMAR_GRAMMAR_H
#define HPD_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_grammar hpd_grammar_t;
typedef struct hpd_matcher hpd_matcher_t;
typedef struct hpd_vocab hpd_vocab_t;

/* How a document may be laid out (llguidance's JSON options, with which the
 * masks are compared: bench/grammar.sh). */
typedef struct {
    /* any JSON whitespace between the tokens inside the document (not
     * before or after it), with "," and ":" as separators; else none but
     * the separators' own */
    bool whitespace_flexible;
    /* without whitespace_flexible: between items and members, and between
     * a key and its value (each at most 7 bytes) */
    const char *item_separator;
    const char *key_separator;
} hpd_grammar_format_t;

/* The default: no free whitespace, ", " and ": " (Python's json.dumps). */
hpd_grammar_format_t hpd_grammar_format_default(void);

/* Compiles a JSON Schema (UTF-8 JSON text of len bytes) into *g_p. A schema
 * with a keyword outside the supported set (docs/structured_outputs.md), a
 * malformed one or an unresolvable $ref is refused with
 * HPD_ERR_INVALID_ARG or HPD_ERR_UNSUPPORTED and err (errlen bytes, may be
 * NULL) names the keyword and where it is ("#/properties/age: keyword
 * 'minimum' is not supported"). */
hpd_status_t hpd_grammar_from_schema(const char *schema, size_t len,
                                     const hpd_grammar_format_t *format, hpd_grammar_t **g_p,
                                     char *err, size_t errlen);

/* A structured output as the cluster's messages carry it (docs/protocol.md,
 * the grammar field): UTF-8 JSON {"json_schema": SCHEMA} or
 * {"json_object": true}, with "whitespace_flexible": true for
 * llguidance's flexible layout, and "after_token": ID when the document
 * starts only after that token (a thinking model's </think>: the reasoning
 * before it is free). Refused as hpd_grammar_from_schema refuses, err
 * naming what. */
hpd_status_t hpd_grammar_from_spec(const char *spec, size_t len, hpd_grammar_t **g_p, char *err,
                                   size_t errlen);

/* spec (len bytes) with its after_token set to token: malloc'd, NULL on
 * no memory or a spec that is not a JSON object. */
char *hpd_grammar_spec_after(const char *spec, size_t len, int32_t token);

/* Any JSON object (response_format {"type": "json_object"}). */
hpd_status_t hpd_grammar_json_object(const hpd_grammar_format_t *format, hpd_grammar_t **g_p);

/* Grammars are shared (a request's ranks, a node and its engine): retain
 * takes a reference, destroy drops one and frees the grammar with the
 * last. */
hpd_grammar_t *hpd_grammar_retain(hpd_grammar_t *g);
void hpd_grammar_destroy(hpd_grammar_t *g);

/* The token after which the document starts (any tokens before it), or -1:
 * from the first token. */
int32_t hpd_grammar_after_token(const hpd_grammar_t *g);

/* A matcher at the start of a document of g (which must outlive it). */
hpd_status_t hpd_matcher_create(const hpd_grammar_t *g, hpd_matcher_t **m_p);
void hpd_matcher_destroy(hpd_matcher_t *m);

/* Advances over n bytes: false (and the matcher unchanged) when they do not
 * continue a document of the grammar. */
bool hpd_matcher_accept_bytes(hpd_matcher_t *m, const uint8_t *bytes, size_t n);

/* True when the bytes so far are a whole document. */
bool hpd_matcher_can_end(const hpd_matcher_t *m);

/* True when no byte can follow (a whole document that nothing extends). */
bool hpd_matcher_must_end(const hpd_matcher_t *m);

/* Tokenizes n bytes into *ids_p (malloc'd, *n_p ids) as the model's
 * tokenizer would (a whole text). */
typedef hpd_status_t (*hpd_vocab_tokenize_cb_t)(void *arg, const uint8_t *bytes, size_t n,
                                                int32_t **ids_p, size_t *n_p);

/* The vocabulary of a tokenizer: each token id's bytes (copied), with the
 * ids that are special (never text: only an end id may be allowed). With
 * tokenize, bytes the grammar forces are allowed only as the tokenizer
 * spells them (llguidance's canonical forcing: docs/structured_outputs.md);
 * without, any tokens that spell them are. */
typedef struct {
    uint32_t n_tokens;
    const uint8_t *const *bytes; /* [n_tokens], NULL for an id without bytes */
    const uint32_t *lens;        /* [n_tokens] */
    const bool *special;         /* [n_tokens] or NULL */
    /* [n_tokens] or NULL: special tokens a grammar takes by their bytes
     * where it forces them (and the tokenizer spells those bytes so), as
     * Qwen3.5's <tool_call>; never allowed anywhere else */
    const bool *marker;
    hpd_vocab_tokenize_cb_t tokenize;
    void *tokenize_arg;
} hpd_vocab_params_t;

hpd_status_t hpd_vocab_create(const hpd_vocab_params_t *p, hpd_vocab_t **v_p);

/* The vocabulary of a tokenizer (its added tokens marked special are
 * special; its markers, hpd_tokenizer_is_marker, are markers). */
struct hpd_tokenizer;
hpd_status_t hpd_vocab_from_tokenizer(const struct hpd_tokenizer *tok, hpd_vocab_t **v_p);
void hpd_vocab_destroy(hpd_vocab_t *v);
uint32_t hpd_vocab_size(const hpd_vocab_t *v);

/* The tokens allowed next as a bitmask (bit i of word i/32; (n_tokens+31)/32
 * words): the tokens whose bytes continue the document, and end_ids when
 * the document so far is whole. */
hpd_status_t hpd_matcher_mask(hpd_matcher_t *m, const hpd_vocab_t *v, const int32_t *end_ids,
                              uint32_t n_end, uint32_t *mask);

/* Advances over one token: an end id ends the document (only when whole);
 * any other id's bytes are accepted. HPD_ERR_INVALID_ARG (the matcher
 * unchanged) when the grammar does not allow it. */
hpd_status_t hpd_matcher_accept_token(hpd_matcher_t *m, const hpd_vocab_t *v, int32_t id,
                                      const int32_t *end_ids, uint32_t n_end);

/* True once an end id was accepted. */
bool hpd_matcher_ended(const hpd_matcher_t *m);

#endif
