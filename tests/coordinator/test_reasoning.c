/* A thinking model's answer split into reasoning and content
 * (coordinator/reasoning.h): recorded answers of both kinds of prompt (the
 * think block opened by the prompt, or by the answer), cut into two and
 * three pieces at every byte and into single bytes, each give the same
 * reasoning and content, with no empty piece, no reasoning after content,
 * and nothing held back that cannot begin a tag. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/reasoning.h"

typedef struct {
    char reasoning[512], content[512];
    size_t nr, nc;
    bool saw_content, bad;
} split_t;

static void emit(void *arg, bool reasoning, const char *text, size_t len)
{
    split_t *s = arg;
    if (len == 0 || (reasoning && s->saw_content))
        s->bad = true; /* an empty piece, or reasoning after content */
    char *to = reasoning ? s->reasoning : s->content;
    size_t *n = reasoning ? &s->nr : &s->nc;
    assert_true(*n + len < sizeof(s->reasoning));
    memcpy(to + *n, text, len);
    *n += len;
    s->saw_content |= !reasoning;
}

/* the answer fed in pieces ending at cuts[0..n_cuts) (increasing) */
static void run(const char *answer, bool opened, const size_t *cuts, size_t n_cuts, split_t *s)
{
    hpd_reasoning_t r;
    memset(s, 0, sizeof(*s));
    hpd_reasoning_init(&r, opened);
    size_t at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        const size_t end = i < n_cuts ? cuts[i] : strlen(answer);
        hpd_reasoning_feed(&r, answer + at, end - at, emit, s);
        at = end;
        /* only what may begin a tag waits: the held bytes start <think>
         * (before the answer decided) or </think> (inside the block) */
        const char *tag = r.state == HPD_REASONING_START ? "<think>" : "</think>";
        if (r.n_hold >= strlen(tag) || memcmp(r.hold, tag, r.n_hold) != 0 ||
            (r.state == HPD_REASONING_CONTENT && r.n_hold > 0))
            s->bad = true;
    }
    hpd_reasoning_finish(&r, emit, s);
}

static void check(const char *answer, bool opened, const char *reasoning, const char *content)
{
    const size_t len = strlen(answer);
    split_t s;
    size_t cuts[512];
    /* whole, then two pieces at every byte, then three */
    run(answer, opened, NULL, 0, &s);
    for (size_t i = 0; i <= len; i++)
        for (size_t j = i; j <= len; j++) {
            cuts[0] = i, cuts[1] = j;
            run(answer, opened, cuts, 2, &s);
            if (s.bad || s.nr != strlen(reasoning) || s.nc != strlen(content) ||
                memcmp(s.reasoning, reasoning, s.nr) != 0 ||
                memcmp(s.content, content, s.nc) != 0)
                fail_msg("'%s' (opened %d) cut at %zu and %zu: reasoning '%.*s', content "
                         "'%.*s' (expected '%s' and '%s')%s", answer, opened, i, j, (int)s.nr,
                         s.reasoning, (int)s.nc, s.content, reasoning, content,
                         s.bad ? "; an empty piece or reasoning after content" : "");
        }
    /* byte by byte */
    for (size_t i = 0; i < len; i++)
        cuts[i] = i + 1;
    run(answer, opened, cuts, len, &s);
    assert_false(s.bad);
    assert_int_equal(s.nr, strlen(reasoning));
    assert_int_equal(s.nc, strlen(content));
    assert_memory_equal(s.reasoning, reasoning, s.nr);
    assert_memory_equal(s.content, content, s.nc);
}

/* Qwen3.5 / Qwen3-Next-Thinking: the prompt ends with "<think>\n" */
static void test_opened_by_the_prompt(void **state)
{
    (void)state;
    check("Let me see.\n2 + 2 = 4\n</think>\n\nThe answer is 4.", true,
          "Let me see.\n2 + 2 = 4\n", "\n\nThe answer is 4.");
    /* cut by max_tokens inside the block, a partial tag at its end */
    check("still thinking </thi", true, "still thinking </thi", "");
    /* what looks like a tag inside, and a second </think> in the content */
    check("a </th b <think> c</think>x</think>y", true, "a </th b <think> c", "x</think>y");
    check("</think>", true, "", "");
    check("</think>only content", true, "", "only content");
    /* multi-byte characters on both sides */
    check("考える…</think>答えは四。", true, "考える…", "答えは四。");
}

/* Qwen3 with thinking on: the answer opens the block itself */
static void test_opened_by_the_answer(void **state)
{
    (void)state;
    check("<think>\nhm\n</think>\n\ndone", false, "\nhm\n", "\n\ndone");
    check("<think></think>x", false, "", "x");
    /* no block: all content, a tag later on included */
    check("Plain answer <think> not a block </think>", false, "",
          "Plain answer <think> not a block </think>");
    check("<thin", false, "", "<thin");
    check("<thinking>", false, "", "<thinking>");
    check(" <think>x</think>", false, "", " <think>x</think>");
    check("<think>never closed", false, "never closed", "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opened_by_the_prompt),
        cmocka_unit_test(test_opened_by_the_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
