/* Tool calls parsed from a chat answer's content (coordinator/toolcall.h):
 * recorded answers in both forms give the same calls and content however
 * they are cut into pieces (at every byte, two pieces; and byte by byte);
 * XML values take their parameters' types; a call that does not parse or
 * never closes is content. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coordinator/toolcall.h"

typedef struct {
    char content[2048];
    size_t n_content;
    char calls[2048]; /* "name(args);" each */
    size_t n_calls_text;
    uint32_t n_calls;
} got_t;

static void on_content(void *arg, const char *text, size_t len)
{
    got_t *g = arg;
    assert_true(g->n_content + len < sizeof(g->content));
    memcpy(g->content + g->n_content, text, len);
    g->n_content += len;
    g->content[g->n_content] = '\0';
}

static void on_call(void *arg, uint32_t index, const char *name, const char *args)
{
    got_t *g = arg;
    assert_int_equal(index, g->n_calls);
    g->n_calls++;
    g->n_calls_text += (size_t)snprintf(g->calls + g->n_calls_text,
                                        sizeof(g->calls) - g->n_calls_text, "%s(%s);", name, args);
}

static got_t run(hpd_toolcall_format_t f, const json_t *tools, const char *text,
                 const size_t *cuts, size_t n_cuts)
{
    got_t g = {0};
    hpd_toolcall_t t;
    hpd_toolcall_init(&t, f, tools);
    size_t from = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        const size_t to = i < n_cuts ? cuts[i] : strlen(text);
        hpd_toolcall_feed(&t, text + from, to - from, on_content, on_call, &g);
        from = to;
    }
    hpd_toolcall_finish(&t, on_content, on_call, &g);
    hpd_toolcall_free(&t);
    return g;
}

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}, \"ratio\": {\"type\": \"number\"}, \"metric\": {\"type\": "
    "\"boolean\"}, \"opts\": {\"type\": \"object\"}, \"tags\": {\"type\": \"array\"}, \"code\": "
    "{\"type\": \"string\"}, \"nothing\": {\"type\": [\"null\", \"integer\"]}}}}}]";

static const struct {
    hpd_toolcall_format_t f;
    const char *text, *content, *calls;
} cases[] = {
    {HPD_TOOLCALL_JSON,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
     "</tool_call>",
     "", "get_weather({\"city\": \"Paris\", \"days\": 2});"},
    {HPD_TOOLCALL_JSON,
     "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Z\\u00fcrich \\\"old\\\" \xe6\x9d\xb1\", \"opts\": {\"a\": [1, {\"b\": null}]}}}\n"
     "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>\n",
     "Let me look.\n\n",
     "get_weather({\"city\": \"Z\xc3\xbcrich \\\"old\\\" \xe6\x9d\xb1\", \"opts\": {\"a\": [1, "
     "{\"b\": null}]}});search({});"},
    /* not a call: content, whole */
    {HPD_TOOLCALL_JSON, "a <tool> b <tool_call>\n{\"nam\": 1}\n</tool_call> c",
     "a <tool> b <tool_call>\n{\"nam\": 1}\n</tool_call> c", ""},
    /* never closed */
    {HPD_TOOLCALL_JSON, "x<tool_call>\n{\"name\": \"f\"", "x<tool_call>\n{\"name\": \"f\"", ""},
    {HPD_TOOLCALL_JSON, "x<tool_call>y", "x<tool_call>y", ""},
    /* no arguments: an empty object; text after a call is content, space is not */
    {HPD_TOOLCALL_JSON, "<tool_call>\n{\"name\": \"ping\"}\n</tool_call>\n \nand more\n",
     "and more\n", "ping({});"},
    /* an empty call, and arguments that are not an object: content */
    {HPD_TOOLCALL_JSON, "<tool_call>\n \n</tool_call>", "<tool_call>\n \n</tool_call>", ""},
    {HPD_TOOLCALL_JSON, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
     "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", ""},
    {HPD_TOOLCALL_XML,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "", "get_weather({\"city\": \"Paris\", \"days\": 3});"},
    /* types from the schema; multi-line strings; unknown parameters as strings */
    {HPD_TOOLCALL_XML,
     "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\"\n"
     "second line\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=metric>\n"
     "true\n</parameter>\n<parameter=opts>\n{\"k\": [1, 2]}\n</parameter>\n<parameter=tags>\n"
     "not json\n</parameter>\n<parameter=code>\n42\n</parameter>\n<parameter=extra>\n7\n"
     "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
     "<parameter=days>\nsoon\n</parameter>\n</function>\n</tool_call>",
     "I will check.\n\n",
     "get_weather({\"city\": \"New \\\"York\\\"\\nsecond line\", \"ratio\": 0.5, \"metric\": true, "
     "\"opts\": {\"k\": [1, 2]}, \"tags\": \"not json\", \"code\": \"42\", \"extra\": \"7\"});"
     "get_weather({\"days\": \"soon\"});"},
    /* integers of any length keep their digits; a fraction is no integer */
    {HPD_TOOLCALL_XML,
     "<tool_call>\n<function=get_weather>\n<parameter=days>\n123456789012345678901234567890\n"
     "</parameter>\n<parameter=ratio>\n-1.5e3\n</parameter>\n<parameter=opts>\n[1]\n</parameter>\n"
     "</function>\n</tool_call><tool_call>\n<function=get_weather>\n<parameter=days>\n2.5\n"
     "</parameter>\n</function>\n</tool_call>",
     "", "get_weather({\"days\": 123456789012345678901234567890, \"ratio\": -1.5e3, \"opts\": \"[1]\"});"
         "get_weather({\"days\": \"2.5\"});"},
    /* text between parameters, or after the function: no call */
    {HPD_TOOLCALL_XML,
     "<tool_call>\n<function=f>\nnoise<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=f>\nnoise<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>", ""},
    {HPD_TOOLCALL_XML, "<tool_call>\n<function=f>\n</function>\nx</tool_call>",
     "<tool_call>\n<function=f>\n</function>\nx</tool_call>", ""},
    /* null where the schema allows it */
    {HPD_TOOLCALL_XML,
     "<tool_call>\n<function=get_weather>\n<parameter=nothing>\nnull\n</parameter>\n"
     "<parameter=city>\nnull\n</parameter>\n</function>\n</tool_call>",
     "", "get_weather({\"nothing\": null, \"city\": \"null\"});"},
    /* a malformed XML call: content */
    {HPD_TOOLCALL_XML, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
     "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", ""},
    {HPD_TOOLCALL_XML, "plain answer with < and <tool_ but no call", "plain answer with < and "
     "<tool_ but no call", ""},
};

static void test_every_cut(void **state)
{
    json_t *tools = json_loads(TOOLS, 0, NULL);
    assert_non_null(tools);
    size_t checked = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const size_t n = strlen(cases[c].text);
        for (size_t cut = 0; cut <= n; cut++) {
            got_t g = run(cases[c].f, tools, cases[c].text, &cut, 1);
            if (strcmp(g.content, cases[c].content) != 0 || strcmp(g.calls, cases[c].calls) != 0)
                fail_msg("case %zu cut at %zu: content [%s] calls [%s]\nwant [%s] [%s]", c, cut,
                         g.content, g.calls, cases[c].content, cases[c].calls);
            checked++;
        }
        size_t *every = malloc((n + 1) * sizeof(*every));
        for (size_t i = 0; i < n; i++)
            every[i] = i;
        got_t g = run(cases[c].f, tools, cases[c].text, every, n);
        free(every);
        assert_string_equal(g.content, cases[c].content);
        assert_string_equal(g.calls, cases[c].calls);
    }
    assert_true(checked > 1000);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_cut)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
