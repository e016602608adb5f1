/* Tool calls in a chat answer's content, parsed as it streams
 * (docs/api.md, "Tool calls"): the Qwen3 / Qwen3-Next form,
 *
 *   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
 *
 * and the Qwen3.5 form,
 *
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
 *   </function>\n</tool_call>
 *
 * whose values are text, converted to the types the tool's parameter
 * schema gives (a string stays a string; integer, number, boolean, null,
 * object and array are read as JSON, a value that does not read so stays
 * a string). Text outside the calls is content; text that may be the start
 * of <tool_call> is held back until it is known; a call's text is held
 * until its </tool_call>, then given whole (its name and its arguments, as
 * JSON text written as Python's json.dumps). A call that does not parse,
 * or that never closes, is content. Whitespace between and after calls is
 * dropped. */
#ifndef HPD_COORDINATOR_TOOLCALL_H
#define HPD_COORDINATOR_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    HPD_TOOLCALL_JSON, /* Qwen3, Qwen3-Next */
    HPD_TOOLCALL_XML,  /* Qwen3.5 */
} hpd_toolcall_format_t;

typedef struct {
    hpd_toolcall_format_t format;
    const json_t *tools; /* the request's tools (borrowed), for the XML values' types */
    char hold[16];       /* bytes that may start <tool_call> */
    size_t n_hold;
    bool inside; /* in a call: buf holds its text after <tool_call> */
    char *buf;
    size_t len, cap;
    bool after_call; /* a call came: whitespace is dropped */
    uint32_t n_calls;
    bool failed; /* out of memory: what came is content */
} hpd_toolcall_t;

typedef void (*hpd_toolcall_content_cb_t)(void *arg, const char *text, size_t len);
/* a whole call: its index (0, 1, ...), name and arguments (JSON text) */
typedef void (*hpd_toolcall_call_cb_t)(void *arg, uint32_t index, const char *name,
                                       const char *arguments);

void hpd_toolcall_init(hpd_toolcall_t *t, hpd_toolcall_format_t format, const json_t *tools);
void hpd_toolcall_feed(hpd_toolcall_t *t, const char *text, size_t len,
                       hpd_toolcall_content_cb_t content, hpd_toolcall_call_cb_t call, void *arg);
/* The end of the answer: what is held back goes out (an unclosed call as
 * content). */
void hpd_toolcall_finish(hpd_toolcall_t *t, hpd_toolcall_content_cb_t content,
                         hpd_toolcall_call_cb_t call, void *arg);
void hpd_toolcall_free(hpd_toolcall_t *t);

/* A call's text between <tool_call> and </tool_call>: its name and
 * arguments (malloc'd), or false when it is not a call of the format. */
bool hpd_toolcall_parse(hpd_toolcall_format_t format, const json_t *tools, const char *body,
                        size_t len, char **name_p, char **arguments_p);

#endif
