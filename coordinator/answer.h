/* One answer's text as its ids stream, the same for both front doors
 * (msgdoor.c, openai.c): the ids become text (coordinator/text.h: stop
 * strings, held-back characters), a thinking model's text is split into
 * reasoning and content (reasoning.h), and a chat with tools has its
 * content parsed for tool calls (toolcall.h). What comes out goes to the
 * door through its ops, in the answer's order; the door only formats it. */
#ifndef HPD_COORDINATOR_ANSWER_H
#define HPD_COORDINATOR_ANSWER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "coordinator/reasoning.h"
#include "coordinator/text.h"
#include "coordinator/toolcall.h"

/* What an answer gives out (never an empty piece). */
typedef struct {
    void (*content)(void *arg, const char *piece, size_t len);
    void (*reasoning)(void *arg, const char *piece, size_t len);
    /* a whole tool call: its index (0, 1, ...), name and arguments (JSON text) */
    void (*call)(void *arg, uint32_t index, const char *name, const char *arguments);
} hpd_answer_ops_t;

typedef struct {
    const hpd_text_t *text;
    const char *const *stops; /* kept by the caller (hpd_text_out_init) */
    size_t n_stops;
    bool split;       /* a thinking model's chat: reasoning apart */
    bool opens_think; /* ... whose prompt opened the think block */
    bool parse_calls; /* a chat with tools: calls out of the content */
    hpd_toolcall_format_t format;
    const json_t *tools; /* borrowed, for the calls' argument types */
    const hpd_answer_ops_t *ops;
    void *arg;
} hpd_answer_params_t;

typedef struct {
    hpd_answer_params_t p;
    hpd_text_out_t out; /* out.stopped, out.n_ids: where a stop string ended it */
    hpd_reasoning_t rs;
    hpd_toolcall_t tc;
} hpd_answer_t;

void hpd_answer_init(hpd_answer_t *a, const hpd_answer_params_t *params);
void hpd_answer_free(hpd_answer_t *a);

/* Feeds one generated id; what it completes goes out through the ops.
 * Returns true when a stop string matched (feed no more).
 * HPD_ERR_INVALID_ARG in *st_p: an id outside the vocabulary (nothing
 * went out). */
bool hpd_answer_feed(hpd_answer_t *a, int32_t id, hpd_status_t *st_p);

/* The end of the answer: what each stage held back goes out (a second
 * call gives nothing). */
void hpd_answer_finish(hpd_answer_t *a);

#endif
