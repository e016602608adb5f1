/* One answer's text through its stages (coordinator/answer.h), on the
 * committed Qwen3.5 test tokenizer: a thinking chat's answer with a tool
 * call, fed id by id, gives its reasoning, its content and its call apart,
 * in the answer's order, each once; a stop string cuts it; an unknown id
 * gives nothing; without the split and the parser the text is the ids'
 * decode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/answer.h"
#include "tests/test_helpers.h"

static hpd_text_t *text;

static int setup(void **state)
{
    char err[300];
    return hpd_text_load(HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json", &text, err,
                         sizeof(err)) == HPD_OK
               ? 0
               : -1;
}

static int teardown(void **state)
{
    hpd_text_destroy(text);
    return 0;
}

/* What came out, in order: "|R:" reasoning, "|C:" content, "|T:" a call
 * (adjacent pieces of one kind merge: where pieces split is free). */
typedef struct {
    char log[4096];
    size_t n;
    char last;
} got_t;

static void put(got_t *g, char kind, const char *s, size_t len)
{
    assert_true(len > 0); /* never an empty piece */
    if (g->last != kind || kind == 'T')
        g->n += (size_t)snprintf(g->log + g->n, sizeof(g->log) - g->n, "|%c:", kind);
    assert_true(g->n + len < sizeof(g->log));
    memcpy(g->log + g->n, s, len);
    g->n += len;
    g->log[g->n] = '\0';
    g->last = kind;
}

static void on_content(void *arg, const char *piece, size_t len) { put(arg, 'C', piece, len); }
static void on_reasoning(void *arg, const char *piece, size_t len) { put(arg, 'R', piece, len); }
static void on_call(void *arg, uint32_t index, const char *name, const char *arguments)
{
    char s[512];
    const int n = snprintf(s, sizeof(s), "%u %s %s", index, name, arguments);
    put(arg, 'T', s, (size_t)n);
}

static const hpd_answer_ops_t ops = {
    .content = on_content, .reasoning = on_reasoning, .call = on_call};

static int32_t *encode(const char *s, size_t *n_p)
{
    int32_t *ids;
    assert_int_equal(hpd_tokenizer_encode(hpd_text_tokenizer(text), s, strlen(s), &ids, n_p),
                     HPD_OK);
    return ids;
}

/* Feeds s's ids one by one, then finishes (twice: the second gives
 * nothing); the ids fed before a stop in *fed_p. */
static void run(const hpd_answer_params_t *params, const char *s, got_t *g, size_t *fed_p)
{
    size_t n;
    int32_t *ids = encode(s, &n);
    hpd_answer_t a;
    hpd_answer_params_t p = *params;
    p.ops = &ops;
    p.arg = g;
    memset(g, 0, sizeof(*g));
    hpd_answer_init(&a, &p);
    size_t i = 0;
    while (i < n) {
        hpd_status_t st;
        const bool stop = hpd_answer_feed(&a, ids[i++], &st);
        assert_int_equal(st, HPD_OK);
        if (stop)
            break;
    }
    *fed_p = i;
    hpd_answer_finish(&a);
    const size_t before = g->n;
    hpd_answer_finish(&a);
    assert_int_equal(g->n, before);
    hpd_answer_free(&a);
    free(ids);
}

static const char tools[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, "
    "\"days\": {\"type\": \"integer\"}}}}}]";

static void test_thinking_chat_with_a_call(void **state)
{
    json_t *t = json_loads(tools, 0, NULL);
    assert_non_null(t);
    const hpd_answer_params_t p = {.text = text,
                                   .split = true,
                                   .opens_think = true,
                                   .parse_calls = true,
                                   .format = HPD_TOOLCALL_XML,
                                   .tools = t};
    got_t g;
    size_t fed;
    run(&p,
        "The user wants Paris.\n</think>\n\nLet me look.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>",
        &g, &fed);
    /* (reasoning.h and toolcall.h decide the whitespace around the tags) */
    assert_string_equal(g.log, "|R:The user wants Paris.\n|C:\n\nLet me look.\n\n|T:0 get_weather "
                               "{\"city\": \"Paris\", \"days\": 3}");
    /* the prompt did not open the block and the answer does not: all
     * content, the call still parsed */
    hpd_answer_params_t q = p;
    q.opens_think = false;
    run(&q, "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
            "</function>\n</tool_call>",
        &g, &fed);
    assert_string_equal(g.log, "|C:Sure.|T:0 get_weather {\"city\": \"Rome\"}");
    json_decref(t);
}

/* A stop string inside the content ends the answer there: nothing after
 * it, not the call that follows; the ids fed stop at the one that
 * completed it. */
static void test_stop_string_cuts(void **state)
{
    static const char *const stops[] = {"STOP"};
    const hpd_answer_params_t p = {.text = text,
                                   .stops = stops,
                                   .n_stops = 1,
                                   .split = true,
                                   .opens_think = true,
                                   .parse_calls = true,
                                   .format = HPD_TOOLCALL_XML};
    got_t g;
    size_t fed, all;
    free(encode("hm</think>ok then STOP and more<tool_call>\n<function=f>\n</function>\n"
                "</tool_call>",
                &all));
    run(&p,
        "hm</think>ok then STOP and more<tool_call>\n<function=f>\n</function>\n</tool_call>",
        &g, &fed);
    assert_string_equal(g.log, "|R:hm|C:ok then ");
    assert_true(fed < all);
}

/* An answer cut short (max_tokens) gives what each stage held back at
 * its finish: the start of a tag in the reasoning, an unclosed call as
 * content, the start of a stop string. */
static void test_held_back_at_the_end(void **state)
{
    static const char *const stops[] = {"STOP"};
    hpd_answer_params_t p = {.text = text, .split = true, .opens_think = true};
    got_t g;
    size_t fed;
    run(&p, "still thinking about a </thi", &g, &fed);
    assert_string_equal(g.log, "|R:still thinking about a </thi");
    p.parse_calls = true;
    p.format = HPD_TOOLCALL_XML;
    run(&p, "done</think>calling<tool_call>\n<function=f>\n", &g, &fed);
    assert_string_equal(g.log, "|R:done|C:calling<tool_call>\n<function=f>\n");
    p.stops = stops;
    p.n_stops = 1;
    run(&p, "done</think>almost ST", &g, &fed);
    assert_string_equal(g.log, "|R:done|C:almost ST");
}

/* Without the split and the parser, the text is the ids' decode (markers
 * kept), given once. */
static void test_plain_text(void **state)
{
    const char *s = "<think>not a block</think> <tool_call>not a call</tool_call> \xe4\xb8\xad";
    const hpd_answer_params_t p = {.text = text};
    got_t g;
    size_t fed;
    run(&p, s, &g, &fed);
    char want[256];
    snprintf(want, sizeof(want), "|C:%s", s);
    assert_string_equal(g.log, want);
}

static void test_unknown_id(void **state)
{
    got_t g = {0};
    hpd_answer_t a;
    hpd_answer_init(&a, &(hpd_answer_params_t){.text = text, .ops = &ops, .arg = &g});
    hpd_status_t st;
    hpd_answer_feed(&a, (int32_t)hpd_tokenizer_size(hpd_text_tokenizer(text)), &st);
    assert_int_equal(st, HPD_ERR_INVALID_ARG);
    hpd_answer_finish(&a);
    assert_int_equal(g.n, 0);
    hpd_answer_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thinking_chat_with_a_call),
        cmocka_unit_test(test_stop_string_cuts),
        cmocka_unit_test(test_held_back_at_the_end),
        cmocka_unit_test(test_plain_text),
        cmocka_unit_test(test_unknown_id),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
