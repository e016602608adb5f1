/* The chat format of the Qwen3 / Qwen3-Next / Qwen3.5 families
 * (docs/tokenizer.md, "Chat format"), built in:
 *
 *   <|im_start|>system\nSYSTEM<|im_end|>\n
 *   <|im_start|>user\nQUESTION<|im_end|>\n
 *   <|im_start|>assistant\n[<think>\nREASONING\n</think>\n\n]ANSWER<|im_end|>\n
 *   <|im_start|>assistant\n            <- the generation prompt, then
 *       <think>\n                      (Qwen3.5 thinking, the default; Qwen3-Next-Thinking)
 *       <think>\n\n</think>\n\n        (enable_thinking false where the model has the switch)
 *
 * The model's Jinja chat template (tokenizer_config.json's chat_template, or
 * chat_template.jinja) is not interpreted: it is read only to recognise which
 * member of the family it is, and a template that is not this family's is
 * refused by name rather than guessed at. Text parts only: images and videos
 * are refused. Tools, assistant tool calls and tool messages are rendered as
 * each member's template renders them (Qwen3 / Qwen3-Next: JSON inside
 * <tool_call>; Qwen3.5: <function=NAME><parameter=KEY> XML), with the
 * arguments as a mapping (as vLLM passes them) and JSON as Python's
 * json.dumps writes it (Jinja's tojson). */
#ifndef HPD_TOKENIZER_CHAT_H
#define HPD_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

typedef enum {
    HPD_CHAT_THINK_NONE,    /* the generation prompt is the assistant header only (Instruct) */
    HPD_CHAT_THINK_SWITCH,  /* Qwen3: enable_thinking false adds an empty think block */
    HPD_CHAT_THINK_DEFAULT, /* Qwen3.5: opens <think> unless enable_thinking is false */
    HPD_CHAT_THINK_ALWAYS,  /* Qwen3-Next-Thinking: always opens <think> */
} hpd_chat_think_t;

typedef struct {
    hpd_chat_think_t think;
    /* Qwen3.5: message contents are trimmed, a system message after the
     * first is refused, a conversation without a user query is refused, and
     * every assistant turn after the last query gets its think block */
    bool qwen35;
} hpd_chat_format_t;

/* An assistant turn's tool call: the function's name and its arguments, a
 * JSON object's text (the OpenAI API's string). */
typedef struct {
    const char *name;
    const char *arguments;
} hpd_chat_call_t;

typedef struct {
    const char *role;      /* "system", "user", "assistant" or "tool" */
    const char *content;   /* UTF-8, NUL-terminated; NULL: empty */
    const char *reasoning; /* an assistant turn's reasoning_content; NULL: none */
    const hpd_chat_call_t *calls; /* an assistant turn's tool calls */
    size_t n_calls;
} hpd_chat_msg_t;

/* Reads the model directory's chat template and recognises its member of
 * the family. HPD_ERR_UNSUPPORTED with err naming what was found: no
 * template (a base model: use completions), or a template of another
 * family. */
hpd_status_t hpd_chat_format_load(const char *model_dir, hpd_chat_format_t *fmt, char *err,
                                  size_t err_len);

/* The same from the template's text. */
hpd_status_t hpd_chat_format_detect(const char *tmpl, hpd_chat_format_t *fmt, char *err,
                                    size_t err_len);

/* Renders a conversation into *text_p (malloc'd, NUL-terminated, *len_p
 * bytes). enable_thinking: 1 on, 0 off, -1 the model's default.
 * HPD_ERR_INVALID_ARG with err saying which message is wrong (an unknown
 * role, a misplaced system message, no user query where one is needed). */
hpd_status_t hpd_chat_render(const hpd_chat_format_t *fmt, const hpd_chat_msg_t *msgs, size_t n,
                             bool add_generation_prompt, int enable_thinking, char **text_p,
                             size_t *len_p, char *err, size_t err_len);

/* hpd_chat_render, and where the messages' own text (contents and
 * reasoning) lies in the rendered prompt: *ranges_p (malloc'd, sorted,
 * *n_ranges_p of them; none for empty contents), for
 * hpd_tokenizer_encode_literal, so that a special token's text in a
 * message is text and only the template's markers are special tokens. */
hpd_status_t hpd_chat_render_ranges(const hpd_chat_format_t *fmt, const hpd_chat_msg_t *msgs,
                                    size_t n, bool add_generation_prompt, int enable_thinking,
                                    char **text_p, size_t *len_p, hpd_text_range_t **ranges_p,
                                    size_t *n_ranges_p, char *err, size_t err_len);

/* hpd_chat_render_ranges with tools: tools_json is the request's tools, a
 * JSON array's text (each rendered whole, as the template's tojson does);
 * NULL or "[]": none. HPD_ERR_INVALID_ARG also for tools that are not an
 * array, a call without a name or whose arguments are not a JSON object. */
hpd_status_t hpd_chat_render_tools(const hpd_chat_format_t *fmt, const hpd_chat_msg_t *msgs,
                                   size_t n, const char *tools_json, bool add_generation_prompt,
                                   int enable_thinking, char **text_p, size_t *len_p,
                                   hpd_text_range_t **ranges_p, size_t *n_ranges_p, char *err,
                                   size_t err_len);

/* A JSON value as Python's json.dumps(ensure_ascii=False) writes it (", "
 * and ": ", keys in order, floats as repr): Jinja's tojson in transformers.
 * Appended to *out (realloc'd; *len, *cap). */
struct json_t;
hpd_status_t hpd_json_dumps_py(const struct json_t *v, char **out, size_t *len, size_t *cap);

const char *hpd_chat_think_name(hpd_chat_think_t t);

/* The Jinja template hpd-mkmodel writes into its models' tokenizer_config:
 * the Qwen3.5 text format above (thinking on by default), for other tools
 * (transformers' apply_chat_template renders it as hpd_chat_render does,
 * tests/tokenizer/chat_expected.json). */
extern const char hpd_chat_template_qwen35[];

#endif
