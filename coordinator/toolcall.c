/* Tool calls in a chat answer's content (coordinator/toolcall.h). */
#define _GNU_SOURCE /* memmem */
#include "coordinator/toolcall.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/chat.h"

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"

void hpd_toolcall_init(hpd_toolcall_t *t, hpd_toolcall_format_t format, const json_t *tools)
{
    *t = (hpd_toolcall_t){.format = format, .tools = tools};
}

void hpd_toolcall_free(hpd_toolcall_t *t)
{
    free(t->buf);
    t->buf = NULL;
}

static bool all_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* Content goes out, but not the whitespace that follows a call (however
 * the text is cut into pieces). */
static void content_out(hpd_toolcall_t *t, const char *s, size_t n,
                        hpd_toolcall_content_cb_t content, void *arg)
{
    while (t->after_call && n > 0 && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r'))
        s++, n--;
    if (n == 0)
        return;
    t->after_call = false;
    content(arg, s, n);
}

static bool buf_add(hpd_toolcall_t *t, const char *s, size_t n)
{
    return hpd_append(&t->buf, &t->len, &t->cap, s, n) == HPD_OK;
}

/* ---- parsing one call */


static void trim(const char **s, size_t *n)
{
    while (*n > 0 && (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r'))
        (*s)++, (*n)--;
    while (*n > 0 && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\n' || (*s)[*n - 1] == '\t' ||
                      (*s)[*n - 1] == '\r'))
        (*n)--;
}

static char *dump(const json_t *v)
{
    char *s = NULL;
    size_t len = 0, cap = 0;
    if (hpd_json_dumps_py(v, &s, &len, &cap) != HPD_OK) {
        free(s);
        return NULL;
    }
    return s;
}

static bool parse_json_call(const char *body, size_t len, char **name_p, char **args_p)
{
    trim(&body, &len);
    json_t *o = json_loadb(body, len, 0, NULL);
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        (args != NULL && !json_is_object(args))) {
        json_decref(o);
        return false;
    }
    json_t *empty = args == NULL ? json_object() : NULL;
    *args_p = dump(args != NULL ? args : empty);
    *name_p = strdup(json_string_value(name));
    json_decref(empty);
    json_decref(o);
    if (*args_p == NULL || *name_p == NULL) {
        free(*args_p);
        free(*name_p);
        return false;
    }
    return true;
}

/* The type names a parameter's schema gives (type: a name or a list). */
static bool schema_allows(const json_t *schema, const char *type)
{
    const json_t *t = json_object_get(schema, "type");
    if (json_is_string(t))
        return strcmp(json_string_value(t), type) == 0;
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x) if (json_is_string(x) && strcmp(json_string_value(x), type) == 0)
        return true;
    return false;
}

/* A parameter's schema from the tools: function name's parameters.properties.key */
static const json_t *param_schema(const json_t *tools, const char *fn, const char *key)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *name = json_object_get(f, "name");
        if (json_is_string(name) && strcmp(json_string_value(name), fn) == 0)
            return json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"),
                                   key);
    }
    return NULL;
}

/* An XML value's JSON (a number's is its text: parse_xml_call): read as
 * the schema's type where it reads so, else a string. */
static json_t *typed_value(const json_t *schema, const char *text, size_t len)
{
    static const char *const typed[] = {"boolean", "null", "object", "array"};
    bool want_json = false;
    for (size_t i = 0; i < sizeof(typed) / sizeof(typed[0]); i++)
        want_json |= schema_allows(schema, typed[i]);
    if (want_json) {
        json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
        if (v != NULL) {
            const bool fits = (json_is_boolean(v) && schema_allows(schema, "boolean")) ||
                              (json_is_null(v) && schema_allows(schema, "null")) ||
                              (json_is_object(v) && schema_allows(schema, "object")) ||
                              (json_is_array(v) && schema_allows(schema, "array"));
            if (fits)
                return v;
            json_decref(v);
        }
    }
    return json_stringn(text, len);
}

static const char *find(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle));
}

/* A JSON number's text (Python keeps integers of any length exactly: the
 * arguments keep the digits as written). */
static bool number_syntax(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n)
        return false;
    if (s[i] == '0')
        i++;
    else if (s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    else
        return false;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return false;
    }
    return i == n;
}

static bool parse_xml_call(const json_t *tools, const char *body, size_t len, char **name_p,
                           char **args_p)
{
    trim(&body, &len);
    const char *end = body + len;
    if (len < 10 || strncmp(body, "<function=", 10) != 0)
        return false;
    const char *p = body + 10, *gt = find(p, (size_t)(end - p), ">");
    const char *fend = find(p, (size_t)(end - p), "</function>");
    if (gt == NULL || fend == NULL || gt == p || gt > fend)
        return false;
    char *name = strndup(p, (size_t)(gt - p));
    char *out = NULL;
    size_t olen = 0, ocap = 0;
    bool ok = name != NULL && all_space(fend + 11, (size_t)(end - fend - 11)) &&
              hpd_append(&out, &olen, &ocap, "{", 1) == HPD_OK;
    p = gt + 1;
    while (ok) {
        const size_t left = (size_t)(fend - p);
        const char *open = find(p, left, "<parameter=");
        if (open == NULL) {
            ok = all_space(p, left);
            break;
        }
        const char *kgt = find(open, (size_t)(fend - open), ">");
        const char *close = kgt != NULL ? find(kgt, (size_t)(fend - kgt), "</parameter>") : NULL;
        if (!all_space(p, (size_t)(open - p)) || kgt == NULL || close == NULL ||
            kgt == open + 11) {
            ok = false;
            break;
        }
        char *key = strndup(open + 11, (size_t)(kgt - open - 11));
        /* the value: between the newline after > and the one before </parameter> */
        const char *v = kgt + 1;
        size_t vn = (size_t)(close - v);
        if (vn > 0 && *v == '\n')
            v++, vn--;
        if (vn > 0 && v[vn - 1] == '\n')
            vn--;
        const json_t *schema = key != NULL ? param_schema(tools, name, key) : NULL;
        json_t *k = key != NULL ? json_string(key) : NULL;
        ok = k != NULL && (olen == 1 || hpd_append(&out, &olen, &ocap, ", ", 2) == HPD_OK) &&
             hpd_json_dumps_py(k, &out, &olen, &ocap) == HPD_OK &&
             hpd_append(&out, &olen, &ocap, ": ", 2) == HPD_OK;
        json_decref(k);
        const bool integer = schema_allows(schema, "integer") && vn > 0 &&
                             memchr(v, '.', vn) == NULL && memchr(v, 'e', vn) == NULL &&
                             memchr(v, 'E', vn) == NULL;
        if (ok && number_syntax(v, vn) && (integer || schema_allows(schema, "number"))) {
            ok = hpd_append(&out, &olen, &ocap, v, vn) == HPD_OK; /* the digits as written */
        } else if (ok) {
            json_t *val = typed_value(schema, v, vn);
            ok = val != NULL && hpd_json_dumps_py(val, &out, &olen, &ocap) == HPD_OK;
            json_decref(val);
        }
        free(key);
        p = close + 12;
    }
    if (ok && hpd_append(&out, &olen, &ocap, "}", 1) == HPD_OK) {
        *name_p = name;
        *args_p = out;
        return true;
    }
    free(name);
    free(out);
    return false;
}

bool hpd_toolcall_parse(hpd_toolcall_format_t format, const json_t *tools, const char *body,
                        size_t len, char **name_p, char **arguments_p)
{
    return format == HPD_TOOLCALL_JSON ? parse_json_call(body, len, name_p, arguments_p)
                                       : parse_xml_call(tools, body, len, name_p, arguments_p);
}

/* ---- the stream */

/* The call in buf is whole: given as a call, or as content (the text it
 * was) when it does not parse. */
static void call_done(hpd_toolcall_t *t, hpd_toolcall_content_cb_t content,
                      hpd_toolcall_call_cb_t call, void *arg)
{
    char *name, *args;
    if (hpd_toolcall_parse(t->format, t->tools, t->buf, t->len, &name, &args)) {
        call(arg, t->n_calls++, name, args);
        t->after_call = true;
        free(name);
        free(args);
    } else {
        content(arg, OPEN, strlen(OPEN));
        content(arg, t->buf, t->len);
        content(arg, CLOSE, strlen(CLOSE));
    }
    t->inside = false; /* (buf starts over at the next <tool_call>) */
}

void hpd_toolcall_feed(hpd_toolcall_t *t, const char *text, size_t len,
                       hpd_toolcall_content_cb_t content, hpd_toolcall_call_cb_t call, void *arg)
{
    const size_t no = strlen(OPEN), nc = strlen(CLOSE);
    for (size_t i = 0; i < len;) {
        if (t->failed) {
            content(arg, text + i, len - i);
            return;
        }
        if (t->inside) {
            /* until </tool_call>: buffered (the close may straddle pieces) */
            const size_t before = t->len;
            if (!buf_add(t, text + i, len - i)) {
                t->failed = true;
                continue;
            }
            const size_t from = before >= nc ? before - nc + 1 : 0;
            const char *c = find(t->buf + from, t->len - from, CLOSE);
            if (c == NULL)
                return;
            const size_t body = (size_t)(c - t->buf), rest = t->len - body - nc;
            /* what follows the close is fed again */
            char *tail = rest > 0 ? strndup(c + nc, rest) : NULL;
            t->len = body;
            t->buf[body] = '\0';
            call_done(t, content, call, arg);
            if (tail != NULL)
                hpd_toolcall_feed(t, tail, rest, content, call, arg);
            free(tail);
            return;
        }
        /* outside: held bytes and this piece, up to a possible <tool_call> */
        const char c = text[i];
        if (t->n_hold > 0 || c == '<') {
            t->hold[t->n_hold++] = c;
            i++;
            if (strncmp(t->hold, OPEN, t->n_hold) != 0) { /* not the tag: content */
                content_out(t, t->hold, t->n_hold, content, arg);
                t->n_hold = 0;
            } else if (t->n_hold == no) { /* the tag: a call begins */
                t->n_hold = 0;
                t->inside = true;
                t->len = 0;
            }
            continue;
        }
        size_t k = i;
        while (k < len && text[k] != '<')
            k++;
        content_out(t, text + i, k - i, content, arg);
        i = k;
    }
}

void hpd_toolcall_finish(hpd_toolcall_t *t, hpd_toolcall_content_cb_t content,
                         hpd_toolcall_call_cb_t call, void *arg)
{
    (void)call;
    if (t->inside) { /* never closed: what it was */
        content(arg, OPEN, strlen(OPEN));
        if (t->len > 0)
            content(arg, t->buf, t->len);
        t->inside = false;
        t->len = 0;
    }
    content_out(t, t->hold, t->n_hold, content, arg);
    t->n_hold = 0;
}
