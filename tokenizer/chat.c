/* The Qwen chat format (tokenizer/chat.h): what the family's official
 * templates render for text conversations, written out in C. The strip
 * rules follow Python's (str.strip() for Jinja's trim: Unicode whitespace;
 * strip('\n') and friends: newlines only). */
#define _GNU_SOURCE /* memmem */
#include "tokenizer/chat.h"

#include <jansson.h>
#include <limits.h>
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

/* ------------------------------------------------------------ rendering */

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT } role_t;

static bool role_of(const char *name, role_t *r)
{
    static const char *const names[] = {"system", "user", "assistant"};
    for (int i = 0; i < 3; i++)
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

hpd_status_t hpd_chat_render(const hpd_chat_format_t *f, const hpd_chat_msg_t *msgs, size_t n,
                             bool add_generation_prompt, int enable_thinking, char **text_p,
                             size_t *len_p, char *err, size_t err_len)
{
    return hpd_chat_render_ranges(f, msgs, n, add_generation_prompt, enable_thinking, text_p,
                                  len_p, NULL, NULL, err, err_len);
}

hpd_status_t hpd_chat_render_ranges(const hpd_chat_format_t *f, const hpd_chat_msg_t *msgs,
                                    size_t n, bool add_generation_prompt, int enable_thinking,
                                    char **text_p, size_t *len_p, hpd_text_range_t **ranges_p,
                                    size_t *n_ranges_p, char *err, size_t err_len)
{
    out_t o = {.want_ranges = ranges_p != NULL};
    role_t r;
    size_t last_query = n > 0 ? n - 1 : 0;
    bool have_query = false;

    *text_p = NULL;
    if (n == 0) {
        snprintf(err, err_len, "messages: empty (expected at least one message)");
        return HPD_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++) {
        if (!role_of(msgs[i].role, &r)) {
            snprintf(err, err_len, "messages[%zu].role: '%s' is not supported (expected "
                     "system, user or assistant)", i, msgs[i].role ? msgs[i].role : "");
            return HPD_ERR_INVALID_ARG;
        }
        if (r == R_SYSTEM && i > 0 && f->qwen35) {
            snprintf(err, err_len, "messages[%zu]: a system message must be the first", i);
            return HPD_ERR_INVALID_ARG;
        }
        if (msgs[i].reasoning != NULL && r != R_ASSISTANT) {
            snprintf(err, err_len, "messages[%zu]: reasoning_content is for assistant messages",
                     i);
            return HPD_ERR_INVALID_ARG;
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
        return HPD_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++) {
        role_of(msgs[i].role, &r);
        span_t c = span_of(msgs[i].content);
        if (f->qwen35)
            c = trim(c);
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
    }
    return HPD_OK;
}

const char hpd_chat_template_qwen35[] =
    "{#- the Qwen3.5 chat format for text (hybridpd builds it itself: tokenizer/chat.c) #}\n"
    "{%- set ns = namespace(last_query_index=-1) %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = message.content|trim %}\n"
    "    {%- if message.role == 'user' and not (content.startswith('<tool_response>') and "
    "content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.last_query_index = loop.index0 %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if ns.last_query_index < 0 %}\n"
    "    {{- raise_exception('No user query found in messages.') }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = message.content|trim %}\n"
    "    {%- if message.role == 'system' %}\n"
    "        {%- if not loop.first %}\n"
    "            {{- raise_exception('System message must be at the beginning.') }}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'user' %}\n"
    "        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- elif '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content|trim + "
    "'\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}\n"
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
