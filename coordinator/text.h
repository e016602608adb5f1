/* Text at the coordinator (docs/api.md): the model's tokenizer and chat
 * format, loaded once from the model directory, turn prompts and
 * conversations into token ids before a request is routed (routing stays
 * on ids); generated ids turn back into text as they stream, with stop
 * strings matched on that text across token boundaries. */
#ifndef HPD_COORDINATOR_TEXT_H
#define HPD_COORDINATOR_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

typedef struct hpd_text hpd_text_t; /* (coordinator.h names it struct hpd_text) */

/* Loads DIR's tokenizer.json (required) and its chat template (optional:
 * without one, or with another family's, chat requests are refused with
 * the reason hpd_text_chat gives). */
hpd_status_t hpd_text_load(const char *model_dir, hpd_text_t **text_p, char *err,
                           size_t err_len);
void hpd_text_destroy(hpd_text_t *text);
const hpd_tokenizer_t *hpd_text_tokenizer(const hpd_text_t *text);

/* A conversation's prompt ids (the chat format, then the tokenizer). The
 * messages' text is encoded with special tokens off: "<|im_start|>" in a
 * message is text; only the template's markers are special tokens
 * (hpd_tokenizer_encode_literal).
 * HPD_ERR_INVALID_ARG: a bad message; HPD_ERR_UNSUPPORTED: the model has
 * no chat format of this family; err says which. */
hpd_status_t hpd_text_chat(const hpd_text_t *text, const hpd_chat_msg_t *msgs, size_t n,
                           int enable_thinking, int32_t **ids_p, size_t *n_p, char *err,
                           size_t err_len);

/* Whether the model's chat format has a think block (its answers are
 * split into reasoning and content: coordinator/reasoning.h), and whether
 * the generation prompt opens it for this enable_thinking (1 on, 0 off,
 * -1 the model's default). */
/* hpd_text_chat with the request's tools (a JSON array's text, NULL: none),
 * rendered as the model's template renders them (tokenizer/chat.h). */
hpd_status_t hpd_text_chat_tools(const hpd_text_t *text, const hpd_chat_msg_t *msgs, size_t n,
                                 const char *tools_json, int enable_thinking, int32_t **ids_p,
                                 size_t *n_p, char *err, size_t err_len);

/* Whether the model writes tool calls in Qwen3.5's XML form (else Qwen3's
 * JSON form: coordinator/toolcall.h). */
bool hpd_text_tools_xml(const hpd_text_t *text);

bool hpd_text_chat_thinks(const hpd_text_t *text);
bool hpd_text_chat_opens_think(const hpd_text_t *text, int enable_thinking);

#define HPD_TEXT_MAX_MESSAGES 4096 /* a chat's messages */
#define HPD_TEXT_MAX_STOPS 16
#define HPD_TEXT_MAX_STOP_LEN 256

/* One answer's text as its ids come. Text is held back only while it is
 * the start of a stop string (or of an unfinished character). */
typedef struct {
    const hpd_tokenizer_t *tok;
    hpd_detok_t detok;
    char *buf; /* the text so far */
    size_t len, cap;
    size_t sent; /* bytes of buf given out */
    const char *const *stops;
    size_t stop_len[HPD_TEXT_MAX_STOPS]; /* strlen of each, measured once */
    size_t n_stops, max_stop;
    bool stopped; /* a stop string matched: buf ends before it */
    uint32_t n_ids; /* ids fed (up to the one that completed the stop) */
} hpd_text_out_t;

/* stops (at most HPD_TEXT_MAX_STOPS NUL-terminated strings, kept by the caller) are matched in the
 * text; special tokens are left out of it. */
void hpd_text_out_init(hpd_text_out_t *o, const hpd_tokenizer_t *tok, const char *const *stops,
                       size_t n_stops);
void hpd_text_out_free(hpd_text_out_t *o);

/* Feeds one generated id. *piece_p, *piece_len_p: the text that may be
 * given out now (points into o; valid until the next call). Returns true
 * when a stop string matched: the text ends before it, feed no more.
 * HPD_ERR_INVALID_ARG in *st_p: an id outside the vocabulary. */
bool hpd_text_out_feed(hpd_text_out_t *o, int32_t id, const char **piece_p, size_t *piece_len_p,
                       hpd_status_t *st_p);
/* The end of the answer: what was held back. */
void hpd_text_out_finish(hpd_text_out_t *o, const char **piece_p, size_t *piece_len_p);

#endif
