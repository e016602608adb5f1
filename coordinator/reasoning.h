/* A thinking model's answer split into its reasoning and its content
 * (docs/api.md, "Reasoning"), as the text streams: the reasoning is what
 * stands between <think> and </think>, the content what follows; the tags
 * themselves are in neither.
 * - When the prompt opened the think block (Qwen3.5 with thinking on,
 *   Qwen3-Next-Thinking), the answer starts inside it.
 * - Otherwise (Qwen3's switch, thinking on) an answer that begins with
 *   <think> opens it; one that does not is all content.
 * - An answer that never closes the block (cut by max_tokens) is all
 *   reasoning.
 * Text that may be the start of a tag is held back until the next piece
 * tells. Pure: tests/coordinator/test_reasoning.c splits recorded answers
 * at every byte. */
#ifndef HPD_COORDINATOR_REASONING_H
#define HPD_COORDINATOR_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

typedef enum {
    HPD_REASONING_START,   /* nothing decided: the answer may open <think> */
    HPD_REASONING_INSIDE,  /* in the think block */
    HPD_REASONING_CONTENT, /* after it, or never in one */
} hpd_reasoning_state_t;

typedef struct {
    hpd_reasoning_state_t state;
    char hold[8]; /* bytes that may start a tag */
    size_t n_hold;
} hpd_reasoning_t;

/* One piece of the split: reasoning or content (never empty). */
typedef void (*hpd_reasoning_emit_t)(void *arg, bool reasoning, const char *text, size_t len);

/* opened: the prompt ended with the block's <think>. */
void hpd_reasoning_init(hpd_reasoning_t *r, bool opened);

/* Feeds the next piece of the answer's text; emits what is decided. */
void hpd_reasoning_feed(hpd_reasoning_t *r, const char *text, size_t len,
                        hpd_reasoning_emit_t emit, void *arg);

/* The end of the answer: what was held back goes out as what it stood in. */
void hpd_reasoning_finish(hpd_reasoning_t *r, hpd_reasoning_emit_t emit, void *arg);

#endif
