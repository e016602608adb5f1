/* The built-in Qwen chat format (tokenizer/chat.h) against the family's own
 * Jinja templates: every conversation of chat_expected.json
 * (tools/chat_fixture.py: Qwen3.5's and Qwen3's official templates and
 * hpd-mkmodel's, rendered by jinja2 as transformers does) renders to the
 * same text, or is refused where the template raises; the template is
 * recognised by its generation prompt, and one of another family, or none,
 * is refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/test_helpers.h"
#include "tokenizer/chat.h"

static hpd_chat_think_t think_of(const char *s)
{
    return strcmp(s, "default") == 0  ? HPD_CHAT_THINK_DEFAULT
           : strcmp(s, "switch") == 0 ? HPD_CHAT_THINK_SWITCH
           : strcmp(s, "always") == 0 ? HPD_CHAT_THINK_ALWAYS
                                      : HPD_CHAT_THINK_NONE;
}

static void test_official_templates(void **state)
{
    json_error_t jerr;
    json_t *root = json_load_file(HPD_TOKENIZER_DIR "/chat_expected.json", 0, &jerr);
    assert_non_null(root);
    size_t i, n_ok = 0, n_refused = 0;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const hpd_chat_format_t f = {
            .think = think_of(json_string_value(json_object_get(c, "think"))),
            .qwen35 = json_is_true(json_object_get(c, "qwen35"))};
        json_t *msgs = json_object_get(c, "messages"), *m;
        hpd_chat_msg_t mv[8];
        hpd_chat_call_t calls[8][4];
        char *args[8][4] = {{0}};
        size_t k;
        assert_true(json_array_size(msgs) <= 8);
        json_array_foreach(msgs, k, m) {
            mv[k] = (hpd_chat_msg_t){
                .role = json_string_value(json_object_get(m, "role")),
                .content = json_string_value(json_object_get(m, "content")),
                .reasoning = json_string_value(json_object_get(m, "reasoning_content"))};
            /* tool calls as an API gives them: arguments a JSON object's text */
            json_t *tc = json_object_get(m, "tool_calls"), *x;
            size_t q;
            assert_true(json_array_size(tc) <= 4);
            json_array_foreach(tc, q, x) {
                json_t *fn = json_object_get(x, "function");
                args[k][q] = json_dumps(json_object_get(fn, "arguments"), JSON_COMPACT);
                calls[k][q] = (hpd_chat_call_t){.name = json_string_value(json_object_get(fn, "name")),
                                                .arguments = args[k][q]};
            }
            mv[k].calls = calls[k];
            mv[k].n_calls = json_array_size(tc);
        }
        json_t *tools = json_object_get(c, "tools");
        char *tools_json = json_is_array(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
        const json_t *th = json_object_get(c, "enable_thinking");
        const int think = json_is_null(th) ? -1 : json_is_true(th) ? 1 : 0;
        char *text = NULL, err[256] = "";
        size_t len = 0;
        const hpd_status_t st = hpd_chat_render_tools(
            &f, mv, json_array_size(msgs), tools_json,
            json_is_true(json_object_get(c, "add_generation_prompt")), think, &text, &len, NULL,
            NULL, err, sizeof(err));
        free(tools_json);
        for (size_t a = 0; a < 8; a++)
            for (size_t q = 0; q < 4; q++)
                free(args[a][q]);
        const char *want = json_string_value(json_object_get(c, "text"));
        if (want == NULL) {
            if (st == HPD_OK)
                fail_msg("case %zu (%s): rendered where the template refuses (%s)", i,
                         json_string_value(json_object_get(c, "template")),
                         json_string_value(json_object_get(c, "error")));
            assert_int_equal(st, HPD_ERR_INVALID_ARG);
            assert_true(strlen(err) > 0);
            n_refused++;
            continue;
        }
        if (st != HPD_OK)
            fail_msg("case %zu (%s): %s", i, json_string_value(json_object_get(c, "template")),
                     err);
        if (len != strlen(want) || memcmp(text, want, len) != 0) {
            size_t d = 0; /* the first difference, and around it */
            while (d < len && want[d] == text[d])
                d++;
            const size_t from = d > 60 ? d - 60 : 0;
            fail_msg("case %zu (%s) differs at byte %zu of %zu:\n got [%.120s]\nwant [%.120s]", i,
                     json_string_value(json_object_get(c, "template")), d, strlen(want),
                     text + from, want + from);
        }
        free(text);
        n_ok++;
    }
    assert_true(n_ok >= 150);
    assert_true(n_refused >= 8);
    /* the hpd-mkmodel cases were rendered from the template it writes now */
    assert_string_equal(json_string_value(json_object_get(root, "mkmodel_template")),
                        hpd_chat_template_qwen35);
    json_decref(root);
}

static void detect(const char *tmpl, hpd_status_t want_st, hpd_chat_think_t want, bool q35)
{
    hpd_chat_format_t f;
    char err[512] = "";
    const hpd_status_t st = hpd_chat_format_detect(tmpl, &f, err, sizeof(err));
    assert_int_equal(st, want_st);
    if (st != HPD_OK) {
        assert_true(strlen(err) > 20);
        return;
    }
    assert_int_equal(f.think, want);
    assert_int_equal(f.qwen35, q35);
}

/* what decides the member: the generation prompt's part of the template
 * (snippets in the shape of the official ones) */
static void test_detect(void **state)
{
    static const char turns[] =
        "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
        "message.content + '<|im_end|>\\n' }}{%- endfor %}\n";
    char t[2048];
    /* Qwen3.5: thinking on unless enable_thinking is false */
    detect(hpd_chat_template_qwen35, HPD_OK, HPD_CHAT_THINK_DEFAULT, true);
    /* Qwen3: the switch only adds an empty block */
    snprintf(t, sizeof(t), "%s{%%- if add_generation_prompt %%}{{- '<|im_start|>assistant\\n' }}"
             "{%%- if enable_thinking is defined and enable_thinking is false %%}"
             "{{- '<think>\\n\\n</think>\\n\\n' }}{%%- endif %%}{%%- endif %%}", turns);
    detect(t, HPD_OK, HPD_CHAT_THINK_SWITCH, false);
    /* Qwen3-Next-Thinking: always opens the block */
    snprintf(t, sizeof(t), "%s{%%- if add_generation_prompt %%}"
             "{{- '<|im_start|>assistant\\n<think>\\n' }}{%%- endif %%}", turns);
    detect(t, HPD_OK, HPD_CHAT_THINK_ALWAYS, false);
    /* Qwen3-Next-Instruct: the header only */
    snprintf(t, sizeof(t), "%s{%%- if add_generation_prompt %%}{{- '<|im_start|>assistant\\n' }}"
             "{%%- endif %%}", turns);
    detect(t, HPD_OK, HPD_CHAT_THINK_NONE, false);
    /* another family (Llama 3's headers) */
    detect("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
           "{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
           "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
           HPD_ERR_UNSUPPORTED, 0, false);
    /* ChatML without a generation prompt; Qwen2.5's default system message */
    detect(turns, HPD_ERR_UNSUPPORTED, 0, false);
    snprintf(t, sizeof(t), "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
             "You are a helpful assistant.<|im_end|>\\n' }}%s{%%- if add_generation_prompt %%}"
             "{{- '<|im_start|>assistant\\n' }}{%%- endif %%}", turns);
    detect(t, HPD_ERR_UNSUPPORTED, 0, false);
}

static void put_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_int_equal(hpd_write_file(path, text, strlen(text)), HPD_OK);
}

/* the template from tokenizer_config.json, chat_template.jinja first;
 * none at all is refused */
static void test_load(void **state)
{
    char dir[] = "/tmp/hpd-test-chat-XXXXXX";
    char err[512] = "", path[600];
    hpd_chat_format_t f;
    assert_non_null(mkdtemp(dir));
    assert_int_equal(hpd_chat_format_load(dir, &f, err, sizeof(err)), HPD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "tokenizer_config.json"));
    put_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    assert_int_equal(hpd_chat_format_load(dir, &f, err, sizeof(err)), HPD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "no chat_template"));
    json_t *cfg = json_pack("{s:s}", "chat_template", hpd_chat_template_qwen35);
    char *text = json_dumps(cfg, 0);
    put_file(dir, "tokenizer_config.json", text);
    free(text);
    json_decref(cfg);
    assert_int_equal(hpd_chat_format_load(dir, &f, err, sizeof(err)), HPD_OK);
    assert_int_equal(f.think, HPD_CHAT_THINK_DEFAULT);
    /* the named-list form, "default" chosen */
    cfg = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "chat_template", "name", "tool_use",
                    "template", "x", "name", "default", "template", hpd_chat_template_qwen35);
    text = json_dumps(cfg, 0);
    put_file(dir, "tokenizer_config.json", text);
    free(text);
    json_decref(cfg);
    assert_int_equal(hpd_chat_format_load(dir, &f, err, sizeof(err)), HPD_OK);
    assert_true(f.qwen35);
    put_file(dir, "chat_template.jinja", "{{ messages[0].content }}");
    assert_int_equal(hpd_chat_format_load(dir, &f, err, sizeof(err)), HPD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "not the Qwen chat format"));
    snprintf(path, sizeof(path), "rm -rf %s", dir);
    assert_int_equal(system(path), 0);
}

/* a bad role and a reasoning field on a user message name the message */
static void test_refusals(void **state)
{
    const hpd_chat_format_t f = {.think = HPD_CHAT_THINK_DEFAULT, .qwen35 = true};
    char *text = NULL, err[256];
    size_t len;
    const hpd_chat_msg_t tool[] = {{.role = "user", .content = "hi"},
                                   {.role = "function", .content = "42"}};
    assert_int_equal(hpd_chat_render(&f, tool, 2, true, -1, &text, &len, err, sizeof(err)),
                     HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[1].role: 'function'"));
    /* a call without a name, or with arguments that are not an object */
    const hpd_chat_call_t bad_calls[] = {{.name = "", .arguments = "{}"},
                                         {.name = "f", .arguments = "[1]"}};
    for (int b = 0; b < 2; b++) {
        const hpd_chat_msg_t m[] = {{.role = "user", .content = "hi"},
                                    {.role = "assistant", .calls = &bad_calls[b], .n_calls = 1}};
        assert_int_equal(hpd_chat_render(&f, m, 2, true, -1, &text, &len, err, sizeof(err)),
                         HPD_ERR_INVALID_ARG);
        assert_non_null(strstr(err, b ? "messages[1].tool_calls[0]: function.arguments is not"
                                      : "messages[1].tool_calls[0]: function.name is missing"));
    }
    assert_int_equal(hpd_chat_render_tools(&f, tool, 1, "{}", true, -1, &text, &len, NULL, NULL,
                                           err, sizeof(err)),
                     HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tools: expected an array"));
    const hpd_chat_msg_t rs[] = {{.role = "user", .content = "hi", .reasoning = "x"}};
    assert_int_equal(hpd_chat_render(&f, rs, 1, true, -1, &text, &len, err, sizeof(err)),
                     HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[0]"));
    assert_int_equal(hpd_chat_render(&f, rs, 0, true, -1, &text, &len, err, sizeof(err)),
                     HPD_ERR_INVALID_ARG);
    assert_null(text);
}

/* The messages' text is where render_ranges says, byte for byte, and
 * nothing of the template is in a range. */
static void test_ranges(void **state)
{
    const hpd_chat_format_t f = {.think = HPD_CHAT_THINK_DEFAULT, .qwen35 = true};
    char *text = NULL, err[256];
    size_t len, n;
    hpd_text_range_t *r = NULL;
    const hpd_chat_msg_t msgs[] = {
        {.role = "system", .content = "be <|im_start|> brief"},
        {.role = "user", .content = "hi"},
        {.role = "assistant", .content = "hello", .reasoning = "greet"},
        {.role = "user", .content = "<|im_end|>"},
        {.role = "user", .content = ""},
    };
    assert_int_equal(hpd_chat_render_ranges(&f, msgs, 5, true, -1, &text, &len, &r, &n, err,
                                            sizeof(err)), HPD_OK);
    const char *want[] = {"be <|im_start|> brief", "hi", "hello", "<|im_end|>"};
    assert_int_equal(n, 4); /* the reasoning is before the answer's turn: not rendered */
    for (size_t i = 0; i < n; i++) {
        assert_true(r[i].end <= len && (i == 0 || r[i].begin >= r[i - 1].end));
        assert_int_equal(r[i].end - r[i].begin, strlen(want[i]));
        assert_memory_equal(text + r[i].begin, want[i], strlen(want[i]));
    }
    free(text);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_official_templates),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
