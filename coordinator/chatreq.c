#include "coordinator/chatreq.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

/* A client's error: false, with err naming param. */
static bool bad(hpd_chatreq_err_t *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool bad(hpd_chatreq_err_t *err, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    snprintf(err->param, sizeof(err->param), "%s", param != NULL ? param : "");
    err->internal = false;
    return false;
}

static bool out_of_memory(hpd_chatreq_err_t *err)
{
    bad(err, NULL, "out of memory");
    err->internal = true;
    return false;
}

/* A message's content: a string, or an array of text parts joined
 * (*owned: the joined text, malloc'd). */
static bool message_content(const json_t *c, size_t i, const char **text, char **owned,
                            hpd_chatreq_err_t *err)
{
    char field[64];
    snprintf(field, sizeof(field), "messages[%zu].content", i);
    *owned = NULL;
    if (c == NULL || json_is_null(c)) {
        *text = "";
        return true;
    }
    if (json_is_string(c)) {
        *text = json_string_value(c);
        return true;
    }
    if (!json_is_array(c))
        return bad(err, field, "%s: expected a string or an array of text parts", field);
    size_t k, len = 0;
    json_t *part;
    json_array_foreach(c, k, part) {
        const json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(t))
            return bad(err, field, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts "
                       "are supported", field, k);
        len += json_string_length(t);
    }
    char *s = malloc(len + 1);
    if (s == NULL)
        return out_of_memory(err);
    len = 0;
    json_array_foreach(c, k, part) {
        const json_t *t = json_object_get(part, "text");
        memcpy(s + len, json_string_value(t), json_string_length(t));
        len += json_string_length(t);
    }
    s[len] = '\0';
    *text = *owned = s;
    return true;
}

static bool check_tools(const json_t *tools, hpd_chatreq_err_t *err)
{
    size_t i;
    json_t *t;
    if (!json_is_array(tools))
        return bad(err, "tools", "tools: expected an array of {\"type\": \"function\", "
                   "\"function\": {...}}");
    json_array_foreach(tools, i, t) {
        const json_t *type = json_object_get(t, "type"), *f = json_object_get(t, "function");
        const json_t *name = json_object_get(f, "name"), *params = json_object_get(f, "parameters");
        if (type != NULL && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
            return bad(err, "tools", "tools[%zu].type: only \"function\" is supported", i);
        if (!json_is_object(f) || !json_is_string(name) || json_string_length(name) == 0)
            return bad(err, "tools", "tools[%zu].function.name: expected a non-empty string", i);
        if (params != NULL && !json_is_null(params) && !json_is_object(params))
            return bad(err, "tools", "tools[%zu].function.parameters: expected a JSON Schema "
                       "object", i);
    }
    return true;
}

/* An assistant message's tool_calls into m->calls (owned: arguments given
 * as objects, dumped); their ids onto ids. */
static bool message_calls(const json_t *tc, size_t i, hpd_chat_msg_t *m, char ***owned_p,
                          json_t *ids, hpd_chatreq_err_t *err)
{
    if (tc == NULL || json_is_null(tc))
        return true;
    char field[80];
    snprintf(field, sizeof(field), "messages[%zu].tool_calls", i);
    if (!json_is_array(tc) || strcmp(m->role, "assistant") != 0)
        return bad(err, field, "%s: expected an array, on an assistant message", field);
    const size_t n = json_array_size(tc);
    hpd_chat_call_t *calls = calloc(n + 1, sizeof(*calls));
    char **owned = calloc(n + 1, sizeof(*owned));
    m->calls = calls;
    *owned_p = owned;
    if (calls == NULL || owned == NULL)
        return out_of_memory(err);
    for (size_t k = 0; k < n; k++) {
        const json_t *c = json_array_get(tc, k), *f = json_object_get(c, "function");
        const json_t *id = json_object_get(c, "id"), *name = json_object_get(f, "name");
        const json_t *args = json_object_get(f, "arguments");
        if (!json_is_string(name) || json_string_length(name) == 0)
            return bad(err, field, "%s[%zu].function.name: expected a non-empty string", field,
                       k);
        if (json_is_string(args)) {
            calls[k].arguments = json_string_value(args);
        } else if (json_is_object(args)) {
            calls[k].arguments = owned[k] = json_dumps(args, JSON_COMPACT);
        } else if (args != NULL && !json_is_null(args)) {
            return bad(err, field, "%s[%zu].function.arguments: expected a JSON object's text",
                       field, k);
        }
        calls[k].name = json_string_value(name);
        m->n_calls++;
        if (json_is_string(id))
            json_array_append(ids, (json_t *)id);
    }
    return true;
}

/* A tool message answers an earlier call: its tool_call_id is one of ids. */
static bool check_tool_message(const json_t *m, size_t i, const json_t *ids,
                               hpd_chatreq_err_t *err)
{
    const json_t *id = json_object_get(m, "tool_call_id");
    size_t k;
    json_t *x;
    char field[64];
    snprintf(field, sizeof(field), "messages[%zu].tool_call_id", i);
    if (!json_is_string(id))
        return bad(err, field, "%s: expected the id of an earlier tool call", field);
    json_array_foreach(ids, k, x) if (json_equal(x, id)) return true;
    return bad(err, field, "%s: no earlier tool call has the id '%s'", field,
               json_string_value(id));
}

bool hpd_chatreq_prompt(const hpd_text_t *text, const json_t *msgs, const json_t *tools,
                        int thinking, int32_t **ids_p, size_t *n_p, hpd_chatreq_err_t *err)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0 ||
        json_array_size(msgs) > HPD_TEXT_MAX_MESSAGES)
        return bad(err, "messages", "messages: expected an array of 1 to %d messages",
                   HPD_TEXT_MAX_MESSAGES);
    const size_t n = json_array_size(msgs);
    hpd_chat_msg_t *mv = calloc(n, sizeof(*mv));
    char **owned = calloc(n, sizeof(*owned));
    char ***owned_args = calloc(n, sizeof(*owned_args));
    json_t *ids = json_array();
    char *tools_json = NULL;
    bool ok = mv != NULL && owned != NULL && owned_args != NULL && ids != NULL;
    if (!ok)
        out_of_memory(err);
    if (ok && tools != NULL && !json_is_null(tools) && (ok = check_tools(tools, err)) &&
        json_array_size(tools) > 0 && (tools_json = json_dumps(tools, JSON_COMPACT)) == NULL)
        ok = out_of_memory(err);
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (!json_is_string(role) || (rc != NULL && !json_is_null(rc) && !json_is_string(rc))) {
            char field[64];
            snprintf(field, sizeof(field), "messages[%zu].%s", i,
                     json_is_string(role) ? "reasoning_content" : "role");
            ok = bad(err, field, "%s: expected a string", field);
            break;
        }
        mv[i].role = json_string_value(role);
        mv[i].reasoning = json_is_string(rc) ? json_string_value(rc) : NULL;
        ok = message_content(json_object_get(m, "content"), i, &mv[i].content, &owned[i], err) &&
             message_calls(json_object_get(m, "tool_calls"), i, &mv[i], &owned_args[i], ids,
                           err) &&
             (strcmp(mv[i].role, "tool") != 0 || check_tool_message(m, i, ids, err));
    }
    if (ok) {
        char why[400];
        const hpd_status_t st = hpd_text_chat_tools(text, mv, n, tools_json, thinking, ids_p,
                                                    n_p, why, sizeof(why));
        if (st != HPD_OK)
            ok = bad(err, st == HPD_ERR_INVALID_ARG ? "messages" : NULL, "%s", why);
    }
    for (size_t i = 0; owned != NULL && i < n; i++)
        free(owned[i]);
    for (size_t i = 0; owned_args != NULL && mv != NULL && i < n; i++) {
        for (size_t k = 0; owned_args[i] != NULL && k < mv[i].n_calls + 1; k++)
            free(owned_args[i][k]);
        free(owned_args[i]);
        free((void *)mv[i].calls);
    }
    free(owned_args);
    free(owned);
    free(mv);
    free(tools_json);
    json_decref(ids);
    return ok;
}

bool hpd_chatreq_tools(const hpd_text_t *text, const json_t *tools, const json_t *choice,
                       bool parallel, bool have_format, hpd_chatreq_tools_t *t,
                       hpd_chatreq_err_t *err)
{
    const bool have = json_is_array(tools) && json_array_size(tools) > 0;
    memset(t, 0, sizeof(*t));
    t->one_call = !parallel;
    if (tools != NULL && !json_is_null(tools) && !check_tools(tools, err))
        return false;
    const char *mode = choice == NULL || json_is_null(choice) ? (have ? "auto" : "none")
                       : json_is_string(choice) ? json_string_value(choice)
                                                : "function";
    const json_t *named = json_object_get(json_object_get(choice, "function"), "name");
    if (strcmp(mode, "none") != 0 && strcmp(mode, "auto") != 0 && strcmp(mode, "required") != 0 &&
        !(strcmp(mode, "function") == 0 && json_is_object(choice) && json_is_string(named)))
        return bad(err, "tool_choice", "tool_choice: expected \"none\", \"auto\", "
                   "\"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (strcmp(mode, "none") != 0 && !have)
        return bad(err, "tool_choice", "tool_choice: %s without tools", mode);
    if (!have || strcmp(mode, "none") == 0)
        return true;
    t->tools = json_incref((json_t *)tools);
    t->parse_calls = true;
    t->format = hpd_text_tools_xml(text) ? HPD_TOOLCALL_XML : HPD_TOOLCALL_JSON;
    if (strcmp(mode, "auto") == 0)
        return true;
    if (have_format)
        return bad(err, "tool_choice", "tool_choice: %s cannot be combined with response_format",
                   strcmp(mode, "required") == 0 ? "\"required\"" : "a named function");
    json_t *allowed = json_array();
    size_t i;
    json_t *x;
    json_array_foreach(tools, i, x) {
        const json_t *name = json_object_get(json_object_get(x, "function"), "name");
        if (strcmp(mode, "required") == 0 || json_equal(name, named))
            json_array_append(allowed, x);
    }
    if (json_array_size(allowed) == 0) {
        json_decref(allowed);
        return bad(err, "tool_choice", "tool_choice.function.name: no tool is named '%s'",
                   json_string_value(named));
    }
    json_t *spec = json_pack("{s:{s:s, s:o}}", "tool_call", "format",
                             t->format == HPD_TOOLCALL_XML ? "xml" : "json", "tools", allowed);
    t->spec = spec != NULL ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    hpd_grammar_t *g;
    char why[256];
    if (t->spec == NULL)
        return out_of_memory(err);
    if (hpd_grammar_from_spec(t->spec, strlen(t->spec), &g, why, sizeof(why)) != HPD_OK)
        return bad(err, "tools", "tools: %s", why);
    hpd_grammar_destroy(g);
    return true;
}

void hpd_chatreq_tools_free(hpd_chatreq_tools_t *t)
{
    json_decref(t->tools);
    free(t->spec);
    memset(t, 0, sizeof(*t));
}
