/* A Hugging Face tokenizer.json in C (docs/tokenizer.md): byte-level BPE
 * with its vocabulary and merges, the NFC normalizer (utf8proc), the Split
 * pre-tokenizer with the model's regex (PCRE2, UTF and UCP) and ByteLevel,
 * added and special tokens matched before everything else, and the
 * ByteLevel decoder, with an incremental decoder for streaming.
 *
 * Input text is UTF-8; an invalid sequence becomes U+FFFD first, one per
 * maximal ill-formed subpart, as Python's bytes.decode(errors="replace").
 * Anything else a tokenizer.json may hold (another model, normalizer or
 * pre-tokenizer type) is refused by name at load. */
#ifndef HPD_TOKENIZER_TOKENIZER_H
#define HPD_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_tokenizer hpd_tokenizer_t;

/* Loads PATH: a tokenizer.json file, or a model directory holding one.
 * Errors are logged with the file and the field (HPD_ERR_FORMAT,
 * HPD_ERR_UNSUPPORTED, HPD_ERR_IO). */
hpd_status_t hpd_tokenizer_load(const char *path, hpd_tokenizer_t **tok_p);
void hpd_tokenizer_destroy(hpd_tokenizer_t *tok);

/* Ids 0..size-1 (the vocabulary and the added tokens). */
uint32_t hpd_tokenizer_size(const hpd_tokenizer_t *tok);
/* True for an added token marked special (<|im_end|>: never text). */
bool hpd_tokenizer_is_special(const hpd_tokenizer_t *tok, int32_t id);
/* Whether id is a special token that marks the answer's structure for the
 * parsers reading its text: <think>, </think>, <tool_call>, </tool_call>
 * (Qwen3.5's are special; Qwen3's are not). Decoding keeps their text even
 * when it skips special tokens, and a grammar takes them by their text. */
bool hpd_tokenizer_is_marker(const hpd_tokenizer_t *tok, int32_t id);
/* The id of a token's text (an added token's content, or a vocabulary
 * entry in its byte-level form), -1 for none. */
int32_t hpd_tokenizer_id(const hpd_tokenizer_t *tok, const char *token);

/* Encodes len bytes of text into *ids_p (malloc'd, *n_p of them). Added
 * and special tokens anywhere in it are matched (a raw completion prompt:
 * its writer may build a template of their own). */
hpd_status_t hpd_tokenizer_encode(const hpd_tokenizer_t *tok, const char *text, size_t len,
                                  int32_t **ids_p, size_t *n_p);

/* A byte range [begin, end) of a text. */
typedef struct {
    size_t begin, end;
} hpd_text_range_t;

/* The same, where the bytes of the literal ranges (sorted, disjoint) are
 * text from a user, a system prompt or a tool: a special token's text
 * there ("<|im_start|>") is encoded as the characters it is made of, never
 * as the special token, as transformers' split_special_tokens does; added
 * tokens that are not special (<think>, <tool_call>) still match, and the
 * text around the ranges (the chat template's) is encoded as
 * hpd_tokenizer_encode does, so a text without special tokens in its
 * ranges gets the same ids from both. HPD_ERR_INVALID_ARG: ranges out of
 * order or past len. */
hpd_status_t hpd_tokenizer_encode_literal(const hpd_tokenizer_t *tok, const char *text,
                                          size_t len, const hpd_text_range_t *literal,
                                          size_t n_literal, int32_t **ids_p, size_t *n_p);

/* Decodes ids into *text_p (malloc'd, NUL-terminated, *len_p bytes); an id
 * outside the vocabulary is HPD_ERR_INVALID_ARG. Special tokens are left
 * out when skip_special. Bytes that do not form UTF-8 become U+FFFD. */
hpd_status_t hpd_tokenizer_decode(const hpd_tokenizer_t *tok, const int32_t *ids, size_t n,
                                  bool skip_special, char **text_p, size_t *len_p);

/* One token's raw bytes into *bytes_p (malloc'd, *len_p of them): a piece of
 * a UTF-8 character for some byte-level tokens (an API's logprobs give
 * them as "bytes"). HPD_ERR_INVALID_ARG: id outside the vocabulary. */
hpd_status_t hpd_tokenizer_token_bytes(const hpd_tokenizer_t *tok, int32_t id, char **bytes_p,
                                       size_t *len_p);

/* Streaming decode: each call gives the text that one more id completes;
 * bytes of a UTF-8 sequence that is not yet complete wait for the next ids
 * (never a partial character), and the outputs of all the calls, then of
 * hpd_detok_finish, concatenated equal hpd_tokenizer_decode of all the ids. */
typedef struct {
    uint8_t pending[4];
    uint32_t n_pending;
    bool skip_special;
} hpd_detok_t;

/* Appends the text id completes to *out (realloc'd; *len and *cap track
 * it). */
hpd_status_t hpd_detok_next(const hpd_tokenizer_t *tok, hpd_detok_t *d, int32_t id, char **out,
                            size_t *len, size_t *cap);
/* What is still pending (an incomplete sequence at the end: U+FFFD). */
hpd_status_t hpd_detok_finish(hpd_detok_t *d, char **out, size_t *len, size_t *cap);

/* The character GPT-2's byte-level alphabet (bytes_to_unicode) uses for
 * byte b: printable bytes stand for themselves, the others for 256 + their
 * rank among them. */
uint32_t hpd_tokenizer_byte_char(uint8_t b);

/* Trains a byte-level BPE on sample (the most frequent adjacent pair merged
 * until vocab_size - n_specials tokens or no pair repeats; ties to the
 * smallest ids), Qwen3.5's pre-tokenizer regex, NFC, the special tokens on
 * the last ids, and writes it to path as a tokenizer.json that Hugging Face
 * tokenizers reads too (hpd-mkmodel's models). */
hpd_status_t hpd_tokenizer_train(const char *path, const char *sample, size_t len,
                                 uint32_t vocab_size, const char *const *specials,
                                 uint32_t n_specials);

#endif
