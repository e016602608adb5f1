/* The Qwen chat format (tokenizer/chat.h): what the family's official
 * templates render for text conversations, written out in C. The strip
 * rules follow Python's (str.strip() for Jinja's trim: Unicode whitespace;
 * strip('\n') and friends: newlines only). */
#define _GNU_SOURCE /* memmem */
#include "tokenizer/chat.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "common/util.h"

const char *hpd_chat_think_name(hpd_chat_think_t t)
{
    switch (t) {
    case HPD_CHAT_THINK_NONE: return "no thinking";
    case HPD_CHAT_THINK_SWITCH: return "thinking switch (off adds an empty think block)";
    case HPD_CHAT_THINK_DEFAULT: return "thinking on by default";
    case HPD_CHAT_THINK_ALWAYS: return "always thinking";
    }
    return "?";
}

/* ------------------------------------------------------------ recognition */

hpd_status_t hpd_chat_format_detect(const char *tmpl, hpd_chat_format_t *fmt, char *err,
                                    size_t err_len)
{
    *fmt = (hpd_chat_format_t){0};
    if (strstr(tmpl, "<|im_start|>") == NULL || strstr(tmpl, "<|im_end|>") == NULL) {
        snprintf(err, err_len, "the model's chat template is not the Qwen chat format (no "
                 "<|im_start|> / <|im_end|> turns); hybridpd builds only that format and does "
                 "not interpret Jinja templates: use /v1/completions with a prompt you format");
        return HPD_ERR_UNSUPPORTED;
    }
    if (strstr(tmpl, "You are Qwen, created by Alibaba Cloud") != NULL) {
        snprintf(err, err_len, "the model's chat template adds Qwen2.5's default system "
                 "message; hybridpd builds the Qwen3 / Qwen3-Next / Qwen3.5 format only");
        return HPD_ERR_UNSUPPORTED;
    }
    /* the generation prompt: what follows the last test of add_generation_prompt */
    const char *tail = NULL;
    for (const char *p = tmpl; (p = strstr(p, "add_generation_prompt")) != NULL; p++)
        tail = p;
    if (tail == NULL) {
        snprintf(err, err_len, "the model's chat template has no generation prompt "
                 "(add_generation_prompt): not a chat model's template");
        return HPD_ERR_UNSUPPORTED;
    }
    const bool has_switch = strstr(tail, "enable_thinking") != NULL;
    /* '<think>\n' as its own output, not the start of '<think>\n\n</think>' */
    const bool opens = strstr(tail, "'<think>\\n'") != NULL || strstr(tail, "\"<think>\\n\"");
    if (has_switch)
        fmt->think = opens ? HPD_CHAT_THINK_DEFAULT : HPD_CHAT_THINK_SWITCH;
    else
        fmt->think = strstr(tail, "<think>") != NULL ? HPD_CHAT_THINK_ALWAYS
                                                     : HPD_CHAT_THINK_NONE;
    /* Qwen3.5's templates trim every content (render_content(...)|trim) */
    fmt->qwen35 = strstr(tmpl, "|trim") != NULL;
    return HPD_OK;
}

hpd_status_t hpd_chat_format_load(const char *model_dir, hpd_chat_format_t *fmt, char *err,
                                  size_t err_len)
{
    char path[4096];
    char *text = NULL;
    size_t len;
    hpd_status_t st;

    /* transformers >= 4.43 may save it apart */
    snprintf(path, sizeof(path), "%s/chat_template.jinja", model_dir);
    if (access(path, F_OK) == 0 && hpd_read_file(path, &text, &len) == HPD_OK) {
        st = hpd_chat_format_detect(text, fmt, err, err_len);
        free(text);
        return st;
    }
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", model_dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    if (cfg == NULL) {
        snprintf(err, err_len, "%s: %s (line %d): no chat template", path, jerr.text,
                 jerr.line);
        return HPD_ERR_UNSUPPORTED;
    }
    const json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_array(t)) { /* [{name, template}, ...]: the "default" one */
        const json_t *named = NULL;
        size_t i;
        json_t *v;
        json_array_foreach(t, i, v)
            if (json_is_string(json_object_get(v, "name")) &&
                strcmp(json_string_value(json_object_get(v, "name")), "default") == 0)
                named = json_object_get(v, "template");
        t = named;
    }
    if (!json_is_string(t)) {
        snprintf(err, err_len, "%s has no chat_template (a base model?): use /v1/completions",
                 path);
        json_decref(cfg);
        return HPD_ERR_UNSUPPORTED;
    }
    st = hpd_chat_format_detect(json_string_value(t), fmt, err, err_len);
    json_decref(cfg);
    return st;
}

/* ------------------------------------------------------------ strings */

typedef struct {
    const char *p;
    size_t n;
} span_t;

static span_t span_of(const char *s)
{
    return (span_t){s != NULL ? s : "", s != NULL ? strlen(s) : 0};
}

/* Python's str.isspace: category Zs, or bidi class WS, B or S. */
static bool py_space(utf8proc_int32_t c)
{
    const utf8proc_property_t *pr = utf8proc_get_property(c);
    return pr->category == UTF8PROC_CATEGORY_ZS || pr->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           pr->bidi_class == UTF8PROC_BIDI_CLASS_B || pr->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

/* str.strip(): Unicode whitespace at both ends. */
static span_t trim(span_t s)
{
    utf8proc_int32_t c;
    while (s.n > 0) {
        const utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s.p, (utf8proc_ssize_t)s.n, &c);
        if (k <= 0 || !py_space(c))
            break;
        s.p += k;
        s.n -= (size_t)k;
    }
    while (s.n > 0) {
        size_t b = s.n - 1; /* the start of the last character */
        while (b > 0 && ((unsigned char)s.p[b] & 0xC0) == 0x80)
            b--;
        const utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s.p + b, (utf8proc_ssize_t)(s.n - b), &c);
        if (k <= 0 || !py_space(c))
            break;
        s.n = b;
    }
    return s;
}

static span_t lstrip_nl(span_t s)
{
    while (s.n > 0 && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}

static span_t rstrip_nl(span_t s)
{
    while (s.n > 0 && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

static const char *find(span_t s, const char *needle)
{
    return memmem(s.p, s.n, needle, strlen(needle));
}

static const char *find_last(span_t s, const char *needle)
{
    const size_t k = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + k <= s.n && memcmp(s.p + i, needle, k) == 0)
            return s.p + i;
    return NULL;
}

static bool starts_ends(span_t s, const char *a, const char *b)
{
    const size_t na = strlen(a), nb = strlen(b);
    return s.n >= na && s.n >= nb && memcmp(s.p, a, na) == 0 &&
           memcmp(s.p + s.n - nb, b, nb) == 0;
}

typedef struct {
    char *p;
    size_t n, cap;
    bool failed;
    hpd_text_range_t *ranges; /* the messages' own text (NULL: not wanted) */
    size_t n_ranges, cap_ranges;
    bool want_ranges;
} out_t;

static void put(out_t *o, span_t s)
{
    if (o->failed || hpd_grow(&o->p, &o->cap, o->n + s.n + 1, 1) != HPD_OK) {
        o->failed = true;
        return;
    }
    memcpy(o->p + o->n, s.p, s.n);
    o->n += s.n;
    o->p[o->n] = '\0';
}

static void puts_(out_t *o, const char *s)
{
    put(o, span_of(s));
}

/* A message's own text: put, and its range kept. */
static void put_text(out_t *o, span_t s)
{
    const size_t begin = o->n;
    put(o, s);
    if (!o->want_ranges || o->failed || s.n == 0)
        return;
    if (o->n_ranges > 0 && o->ranges[o->n_ranges - 1].end == begin) {
        o->ranges[o->n_ranges - 1].end = o->n; /* one range for adjacent pieces */
        return;
    }
    if (hpd_grow(&o->ranges, &o->cap_ranges, o->n_ranges + 1, sizeof(*o->ranges)) != HPD_OK) {
        o->failed = true;
        return;
    }
    o->ranges[o->n_ranges++] = (hpd_text_range_t){.begin = begin, .end = o->n};
}

/* ------------------------------------------------------------ Python's JSON */

/* repr(float): the shortest digits that read back, fixed notation for
 * exponents -4..15 (".0" when integral), else d.ddde+XX */
static void py_float(double d, char *buf, size_t size)
{
    char tmp[40];
    if (isnan(d) || isinf(d)) {
        snprintf(buf, size, "%s", isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
        return;
    }
    int p = 1;
    for (; p < 17; p++) {
        snprintf(tmp, sizeof(tmp), "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    snprintf(tmp, sizeof(tmp), "%.*e", p - 1, d);
    char digits[24];
    size_t nd = 0;
    const char *q = tmp;
    const bool neg = *q == '-';
    q += neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    digits[nd] = '\0';
    const int e = atoi(q + 1);
    char *o = buf;
    const char *end = buf + size - 1;
    if (neg && o < end)
        *o++ = '-';
    if (e >= -4 && e < 16) {
        if (e < 0) {
            o += snprintf(o, (size_t)(end - o) + 1, "0.");
            for (int k = 0; k < -e - 1 && o < end; k++)
                *o++ = '0';
            o += snprintf(o, (size_t)(end - o) + 1, "%s", digits);
        } else {
            for (int k = 0; k <= e && o < end; k++)
                *o++ = k < (int)nd ? digits[k] : '0';
            if (o < end)
                *o++ = '.';
            if ((int)nd > e + 1)
                o += snprintf(o, (size_t)(end - o) + 1, "%s", digits + e + 1);
            else if (o < end)
                *o++ = '0';
        }
        *o = '\0';
        return;
    }
    o += snprintf(o, (size_t)(end - o) + 1, "%c", digits[0]);
    if (nd > 1)
        o += snprintf(o, (size_t)(end - o) + 1, ".%s", digits + 1);
    snprintf(o, (size_t)(end - o) + 1, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
}

static hpd_status_t py_string(const char *s, size_t n, char **out, size_t *len, size_t *cap)
{
    hpd_status_t st = hpd_append(out, len, cap, "\"", 1);
    for (size_t i = 0; i < n && st == HPD_OK; i++) {
        const unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", c);
                e = esc;
            }
        }
        st = e != NULL ? hpd_append(out, len, cap, e, strlen(e)) : hpd_append(out, len, cap, (const char *)&s[i], 1);
    }
    return st == HPD_OK ? hpd_append(out, len, cap, "\"", 1) : st;
}

hpd_status_t hpd_json_dumps_py(const json_t *v, char **out, size_t *len, size_t *cap)
{
    char num[64];
    hpd_status_t st = HPD_OK;
    size_t i;
    const char *key;
    json_t *x;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        bool first = true;
        st = hpd_append(out, len, cap, "{", 1);
        json_object_foreach((json_t *)v, key, x) {
            if (st == HPD_OK && !first)
                st = hpd_append(out, len, cap, ", ", 2);
            first = false;
            if (st == HPD_OK)
                st = py_string(key, strlen(key), out, len, cap);
            if (st == HPD_OK)
                st = hpd_append(out, len, cap, ": ", 2);
            if (st == HPD_OK)
                st = hpd_json_dumps_py(x, out, len, cap);
        }
        return st == HPD_OK ? hpd_append(out, len, cap, "}", 1) : st;
    }
    case JSON_ARRAY:
        st = hpd_append(out, len, cap, "[", 1);
        json_array_foreach((json_t *)v, i, x) {
            if (st == HPD_OK && i > 0)
                st = hpd_append(out, len, cap, ", ", 2);
            if (st == HPD_OK)
                st = hpd_json_dumps_py(x, out, len, cap);
        }
        return st == HPD_OK ? hpd_append(out, len, cap, "]", 1) : st;
    case JSON_STRING:
        return py_string(json_string_value(v), json_string_length(v), out, len, cap);
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return hpd_append(out, len, cap, num, strlen(num));
    case JSON_REAL:
        py_float(json_real_value(v), num, sizeof(num));
        return hpd_append(out, len, cap, num, strlen(num));
    case JSON_TRUE:
        return hpd_append(out, len, cap, "true", 4);
    case JSON_FALSE:
        return hpd_append(out, len, cap, "false", 5);
    default:
        return hpd_append(out, len, cap, "null", 4);
    }
}

/* Jinja's `value | string` of a JSON scalar (Python's str()). */
static hpd_status_t py_str(const json_t *v, char **out, size_t *len, size_t *cap)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return hpd_append(out, len, cap, json_string_value(v), json_string_length(v));
    case JSON_TRUE:
        return hpd_append(out, len, cap, "True", 4);
    case JSON_FALSE:
        return hpd_append(out, len, cap, "False", 5);
    case JSON_NULL:
        return hpd_append(out, len, cap, "None", 4);
    default:
        return hpd_json_dumps_py(v, out, len, cap);
    }
}

/* ------------------------------------------------------------ rendering */

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT, R_TOOL } role_t;

static bool role_of(const char *name, role_t *r)
{
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < 4; i++)
        if (name != NULL && strcmp(name, names[i]) == 0) {
            *r = (role_t)i;
            return true;
        }
    return false;
}

/* An assistant turn: its reasoning and its answer, split as the templates
 * do (the reasoning field, else the text around the last </think>). */
static void assistant_parts(const hpd_chat_format_t *f, const hpd_chat_msg_t *m, span_t *content,
                            span_t *reasoning)
{
    span_t c = span_of(m->content);
    if (f->qwen35)
        c = trim(c);
    *reasoning = span_of("");
    if (m->reasoning != NULL) {
        *reasoning = span_of(m->reasoning);
    } else if (find(c, "</think>") != NULL) {
        const char *first = find(c, "</think>"), *last = find_last(c, "</think>");
        span_t r = rstrip_nl((span_t){c.p, (size_t)(first - c.p)});
        const char *open = find_last(r, "<think>");
        if (open != NULL)
            r = (span_t){open + 7, r.n - (size_t)(open + 7 - r.p)};
        *reasoning = lstrip_nl(r);
        c = lstrip_nl((span_t){last + 8, c.n - (size_t)(last + 8 - c.p)});
    }
    *content = c;
}

static const char QWEN3_TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char QWEN3_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
static const char QWEN35_TOOLS_HEAD[] =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char QWEN35_TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

/* Puts text that is JSON written as Python writes it (kept as template
 * text: a tool's definition is the request's, not a message's). */
static void put_py(out_t *o, const json_t *v)
{
    char *s = NULL;
    size_t len = 0, cap = 0;
    if (hpd_json_dumps_py(v, &s, &len, &cap) != HPD_OK) {
        o->failed = true;
        return;
    }
    put(o, (span_t){s, len});
    free(s);
}

/* The tools block: Qwen3's system message with the tools (the first system
 * message's text before them), or Qwen3.5's (after them). */
static void put_tools(out_t *o, const hpd_chat_format_t *f, const json_t *tools, span_t system,
                      bool has_system)
{
    size_t i;
    json_t *t;
    if (f->qwen35) {
        puts_(o, QWEN35_TOOLS_HEAD);
    } else {
        puts_(o, "<|im_start|>system\n");
        if (has_system) {
            put_text(o, system);
            puts_(o, "\n\n");
        }
        puts_(o, QWEN3_TOOLS_HEAD);
    }
    json_array_foreach(tools, i, t) {
        puts_(o, "\n");
        put_py(o, t);
    }
    if (f->qwen35) {
        puts_(o, QWEN35_TOOLS_TAIL);
        if (has_system && system.n > 0) {
            puts_(o, "\n\n");
            put_text(o, system);
        }
        puts_(o, "<|im_end|>\n");
    } else {
        puts_(o, QWEN3_TOOLS_TAIL);
    }
}

/* An assistant turn's tool calls, after its content c. */
static bool put_calls(out_t *o, const hpd_chat_format_t *f, const hpd_chat_msg_t *m, span_t c,
                      size_t index, char *err, size_t err_len)
{
    for (size_t k = 0; k < m->n_calls; k++) {
        const hpd_chat_call_t *call = &m->calls[k];
        json_t *args = call->arguments != NULL ? json_loads(call->arguments, 0, NULL) : json_object();
        if (call->name == NULL || call->name[0] == '\0' || !json_is_object(args)) {
            json_decref(args);
            snprintf(err, err_len, "messages[%zu].tool_calls[%zu]: %s", index, k,
                     call->name == NULL || call->name[0] == '\0'
                         ? "function.name is missing"
                         : "function.arguments is not a JSON object");
            return false;
        }
        if (f->qwen35) {
            puts_(o, k > 0 ? "\n<tool_call>\n<function=" : trim(c).n > 0 ? "\n\n<tool_call>\n<function="
                                                                         : "<tool_call>\n<function=");
            put_text(o, span_of(call->name));
            puts_(o, ">\n");
            const char *key;
            json_t *v;
            json_object_foreach(args, key, v) {
                puts_(o, "<parameter=");
                put_text(o, span_of(key));
                puts_(o, ">\n");
                char *s = NULL;
                size_t len = 0, cap = 0;
                const hpd_status_t st = json_is_object(v) || json_is_array(v)
                                            ? hpd_json_dumps_py(v, &s, &len, &cap)
                                            : py_str(v, &s, &len, &cap);
                if (st != HPD_OK)
                    o->failed = true;
                else
                    put_text(o, (span_t){s, len});
                free(s);
                puts_(o, "\n</parameter>\n");
            }
            puts_(o, "</function>\n</tool_call>");
        } else {
            if (k > 0 || c.n > 0)
                puts_(o, "\n");
            puts_(o, "<tool_call>\n{\"name\": \"");
            put_text(o, span_of(call->name));
            puts_(o, "\", \"arguments\": ");
            char *s = NULL;
            size_t len = 0, cap = 0;
            if (hpd_json_dumps_py(args, &s, &len, &cap) != HPD_OK)
                o->failed = true;
            else
                put_text(o, (span_t){s, len});
            free(s);
            puts_(o, "}\n</tool_call>");
        }
        json_decref(args);
    }
    return true;
}

hpd_status_t hpd_chat_render(const hpd_chat_format_t *f, const hpd_chat_msg_t *msgs, size_t n,
                             bool add_generation_prompt, int enable_thinking, char **text_p,
                             size_t *len_p, char *err, size_t err_len)
{
    return hpd_chat_render_tools(f, msgs, n, NULL, add_generation_prompt, enable_thinking, text_p,
                                 len_p, NULL, NULL, err, err_len);
}

hpd_status_t hpd_chat_render_ranges(const hpd_chat_format_t *f, const hpd_chat_msg_t *msgs,
                                    size_t n, bool add_generation_prompt, int enable_thinking,
                                    char **text_p, size_t *len_p, hpd_text_range_t **ranges_p,
                                    size_t *n_ranges_p, char *err, size_t err_len)
{
    return hpd_chat_render_tools(f, msgs, n, NULL, add_generation_prompt, enable_thinking, text_p,
                                 len_p, ranges_p, n_ranges_p, err, err_len);
}

hpd_status_t hpd_chat_render_tools(const hpd_chat_format_t *f, const hpd_chat_msg_t *msgs,
                                   size_t n, const char *tools_json, bool add_generation_prompt,
                                   int enable_thinking, char **text_p, size_t *len_p,
                                   hpd_text_range_t **ranges_p, size_t *n_ranges_p, char *err,
                                   size_t err_len)
{
    out_t o = {.want_ranges = ranges_p != NULL};
    role_t r;
    size_t last_query = n > 0 ? n - 1 : 0;
    bool have_query = false;
    json_t *tools = NULL;

    *text_p = NULL;
    if (n == 0) {
        snprintf(err, err_len, "messages: empty (expected at least one message)");
        return HPD_ERR_INVALID_ARG;
    }
    if (tools_json != NULL) {
        tools = json_loads(tools_json, 0, NULL);
        if (!json_is_array(tools)) {
            json_decref(tools);
            snprintf(err, err_len, "tools: expected an array");
            return HPD_ERR_INVALID_ARG;
        }
        if (json_array_size(tools) == 0) {
            json_decref(tools);
            tools = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!role_of(msgs[i].role, &r)) {
            snprintf(err, err_len, "messages[%zu].role: '%s' is not supported (expected "
                     "system, user, assistant or tool)", i, msgs[i].role ? msgs[i].role : "");
            goto bad;
        }
        if (r == R_SYSTEM && i > 0 && f->qwen35) {
            snprintf(err, err_len, "messages[%zu]: a system message must be the first", i);
            goto bad;
        }
        if (msgs[i].reasoning != NULL && r != R_ASSISTANT) {
            snprintf(err, err_len, "messages[%zu]: reasoning_content is for assistant messages",
                     i);
            goto bad;
        }
        if (msgs[i].n_calls > 0 && r != R_ASSISTANT) {
            snprintf(err, err_len, "messages[%zu]: tool_calls are for assistant messages", i);
            goto bad;
        }
    }
    /* the last user message that is not a tool response */
    for (size_t i = n; i-- > 0;) {
        span_t c = span_of(msgs[i].content);
        if (f->qwen35)
            c = trim(c);
        role_of(msgs[i].role, &r);
        if (r == R_USER && !starts_ends(c, "<tool_response>", "</tool_response>")) {
            last_query = i;
            have_query = true;
            break;
        }
    }
    if (f->qwen35 && !have_query) {
        snprintf(err, err_len, "messages: no user message (this model's format needs one)");
        goto bad;
    }
    role_of(msgs[0].role, &r);
    const bool first_system = r == R_SYSTEM;
    if (tools != NULL) {
        span_t c = span_of(msgs[0].content);
        put_tools(&o, f, tools, f->qwen35 ? trim(c) : c, first_system);
    }
    for (size_t i = 0; i < n; i++) {
        role_of(msgs[i].role, &r);
        span_t c = span_of(msgs[i].content);
        if (f->qwen35)
            c = trim(c);
        if (r == R_SYSTEM && i == 0 && tools != NULL)
            continue; /* in the tools block */
        if (r == R_TOOL) {
            role_t prev = R_USER, next = R_USER;
            if (i > 0)
                role_of(msgs[i - 1].role, &prev);
            if (i + 1 < n)
                role_of(msgs[i + 1].role, &next);
            if ((i == 0 && !f->qwen35) || (i > 0 && prev != R_TOOL))
                puts_(&o, "<|im_start|>user");
            puts_(&o, "\n<tool_response>\n");
            put_text(&o, c);
            puts_(&o, "\n</tool_response>");
            if (i + 1 == n || next != R_TOOL)
                puts_(&o, "<|im_end|>\n");
            continue;
        }
        if (r == R_SYSTEM || r == R_USER) {
            puts_(&o, r == R_SYSTEM ? "<|im_start|>system\n" : "<|im_start|>user\n");
            put_text(&o, c);
            puts_(&o, "<|im_end|>\n");
            continue;
        }
        span_t reasoning;
        assistant_parts(f, &msgs[i], &c, &reasoning);
        puts_(&o, "<|im_start|>assistant\n");
        if (f->qwen35) {
            reasoning = trim(reasoning);
            if (i > last_query) {
                puts_(&o, "<think>\n");
                put_text(&o, reasoning);
                puts_(&o, "\n</think>\n\n");
            }
            put_text(&o, c);
        } else if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
            puts_(&o, "<think>\n");
            put_text(&o, rstrip_nl(lstrip_nl(reasoning)));
            puts_(&o, "\n</think>\n\n");
            put_text(&o, lstrip_nl(c));
        } else {
            put_text(&o, c);
        }
        if (!put_calls(&o, f, &msgs[i], c, i, err, err_len))
            goto bad;
        puts_(&o, "<|im_end|>\n");
    }
    if (add_generation_prompt) {
        puts_(&o, "<|im_start|>assistant\n");
        switch (f->think) {
        case HPD_CHAT_THINK_NONE: break;
        case HPD_CHAT_THINK_ALWAYS: puts_(&o, "<think>\n"); break;
        case HPD_CHAT_THINK_SWITCH:
            if (enable_thinking == 0)
                puts_(&o, "<think>\n\n</think>\n\n");
            break;
        case HPD_CHAT_THINK_DEFAULT:
            puts_(&o, enable_thinking == 0 ? "<think>\n\n</think>\n\n" : "<think>\n");
            break;
        }
    }
    puts_(&o, "");
    json_decref(tools);
    if (o.failed) {
        free(o.p);
        free(o.ranges);
        snprintf(err, err_len, "out of memory");
        return HPD_ERR_NO_MEMORY;
    }
    *text_p = o.p;
    *len_p = o.n;
    if (ranges_p != NULL) {
        *ranges_p = o.ranges;
        *n_ranges_p = o.n_ranges;
    } else {
        free(o.ranges);
    }
    return HPD_OK;
bad:
    json_decref(tools);
    free(o.p);
    free(o.ranges);
    return HPD_ERR_INVALID_ARG;
}

const char hpd_chat_template_qwen35[] =
    "{#- the Qwen3.5 chat format for text and tools (hybridpd builds it itself: tokenizer/chat.c) #}\n"
    "{%- if tools and tools is iterable and tools is not mapping %}\n"
    "    {{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- '\\n' }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n<parameter=example_parameter_2>\\nThis is the value for the second parameter\\nthat can span\\nmultiple lines\\n</parameter>\\n</function>\\n</tool_call>\\n\\n<IMPORTANT>\\nReminder:\\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\\n- Required parameters MUST be specified\\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\\n</IMPORTANT>' }}\n"
    "    {%- if messages[0].role == 'system' and (messages[0].content or '')|trim %}\n"
    "        {{- '\\n\\n' + (messages[0].content or '')|trim }}\n"
    "    {%- endif %}\n"
    "    {{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(last_query_index=-1) %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = (message.content or '')|trim %}\n"
    "    {%- if message.role == 'user' and not (content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.last_query_index = loop.index0 %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if ns.last_query_index < 0 %}\n"
    "    {{- raise_exception('No user query found in messages.') }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = (message.content or '')|trim %}\n"
    "    {%- if message.role == 'system' %}\n"
    "        {%- if not loop.first %}\n"
    "            {{- raise_exception('System message must be at the beginning.') }}\n"
    "        {%- endif %}\n"
    "        {%- if not tools %}\n"
    "            {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == 'user' %}\n"
    "        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- elif '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content|trim + '\\n</think>\\n\\n' + content }}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>assistant\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if tool_call.function is defined %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {%- if not loop.first %}\n"
    "                    {{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}\n"
    "                {%- elif content|trim %}\n"
    "                    {{- '\\n\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}\n"
    "                {%- else %}\n"
    "                    {{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.arguments is defined %}\n"
    "                    {%- for args_name, args_value in tool_call.arguments|items %}\n"
    "                        {{- '<parameter=' + args_name + '>\\n' }}\n"
    "                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}\n"
    "                        {{- args_value }}\n"
    "                        {{- '\\n</parameter>\\n' }}\n"
    "                    {%- endfor %}\n"
    "                {%- endif %}\n"
    "                {{- '</function>\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.previtem and loop.previtem.role != 'tool' %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or loop.nextitem.role != 'tool' %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Unexpected message role.') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<think>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n";
