/* A chat request as both front doors take it (docs/api.md): the messages
 * (OpenAI's shape, as JSON: the msgpack door turns its maps into the same)
 * checked and put in the model's chat format with the request's tools,
 * and tools / tool_choice / parallel_tool_calls turned into what the
 * answer needs: whether its content is parsed for calls, and for
 * "required" or a named function the grammar every answer must follow.
 * Errors a client caused name the field (param) and what was expected. */
#ifndef HPD_COORDINATOR_CHATREQ_H
#define HPD_COORDINATOR_CHATREQ_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/text.h"
#include "coordinator/toolcall.h"

typedef struct {
    char param[80]; /* the request field it is about ("" for none) */
    char msg[400];  /* "FIELD: what was expected" */
    bool internal;  /* out of memory or the like: not the client's doing */
} hpd_chatreq_err_t;

/* The prompt ids (malloc'd) of messages (a JSON array of 1 to
 * HPD_TEXT_MAX_MESSAGES {role, content, reasoning_content?, tool_calls?,
 * tool_call_id?}; content a string or text parts) with tools (a JSON array,
 * or NULL / null / []: none). An assistant message's tool_calls
 * ({id, function: {name, arguments}}, arguments a JSON object or its text)
 * are rendered back, and a tool message's tool_call_id must be an earlier
 * call's id. thinking: 1 on, 0 off, -1 the model's default. */
bool hpd_chatreq_prompt(const hpd_text_t *text, const json_t *messages, const json_t *tools,
                        int thinking, int32_t **ids_p, size_t *n_p, hpd_chatreq_err_t *err);

/* What the request's tools ask of the answer. */
typedef struct {
    bool parse_calls;  /* its content is parsed for calls (tool_choice other than none) */
    bool one_call;     /* parallel_tool_calls false: the first call only */
    hpd_toolcall_format_t format;
    json_t *tools;     /* a reference to the request's tools (NULL: none) */
    char *spec;        /* required or named: hpd_grammar_from_spec's tool_call JSON (malloc'd) */
} hpd_chatreq_tools_t;

/* tools (array or NULL/null), tool_choice ("none", "auto", "required",
 * {"type": "function", "function": {"name"}}; NULL/null: auto with tools,
 * none without) and parallel_tool_calls into *t (free it with
 * hpd_chatreq_tools_free, also after an error). have_format: the request
 * has a response_format already (a required or named call cannot be
 * combined with it). */
bool hpd_chatreq_tools(const hpd_text_t *text, const json_t *tools, const json_t *tool_choice,
                       bool parallel, bool have_format, hpd_chatreq_tools_t *t,
                       hpd_chatreq_err_t *err);
void hpd_chatreq_tools_free(hpd_chatreq_tools_t *t);

#endif
