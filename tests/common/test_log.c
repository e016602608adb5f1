/* common/log: the line format, the level filter, level names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "tests/common/capture.h"

static int64_t ms_of(const struct timespec *ts)
{
    return (int64_t)ts->tv_sec * 1000 + ts->tv_nsec / 1000000;
}

/* Checks that line starts with a UTC time to the millisecond within
 * [t0, t1], then `rest` up to its newline; returns the next line. */
static const char *check_line(const char *line, const struct timespec *t0,
                              const struct timespec *t1, const char *rest)
{
    struct tm tm = {0};
    int ms = -1, end = 0;

    assert_int_equal(sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &tm.tm_year, &tm.tm_mon,
                            &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms, &end),
                     7);
    assert_int_equal(end, 24); /* every field zero-padded */
    assert_in_range(ms, 0, 999);
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const int64_t at = (int64_t)timegm(&tm) * 1000 + ms;
    assert_in_range(at, ms_of(t0), ms_of(t1));
    const char *nl = strchr(line, '\n');
    assert_non_null(nl);
    assert_int_equal(nl + 1 - (line + end), strlen(rest));
    assert_memory_equal(line + end, rest, strlen(rest));
    return nl + 1;
}

static void test_line_format(void **state)
{
    /* "<UTC time> <level> <component> req=<request or ->: <message>" */
    const hpd_log_level_t saved = hpd_log_level;
    struct timespec t0, t1;
    test_capture_t c;

    hpd_log_set_level(HPD_LOG_LEVEL_DEBUG);
    clock_gettime(CLOCK_REALTIME, &t0);
    test_capture_begin(&c);
    HPD_LOGR_WARN("coordinator", 42, "finished, %d tokens", 24);
    HPD_LOG_INFO("node", "up");
    HPD_LOGR_ERROR("decode", UINT64_MAX, "lost %s", "it");
    HPD_LOGR_DEBUG("prefill", 1, "step");
    char *text = test_capture_end(&c, NULL);
    clock_gettime(CLOCK_REALTIME, &t1);
    hpd_log_set_level(saved);

    const char *l = check_line(text, &t0, &t1, " warn  coordinator req=42: finished, 24 tokens\n");
    l = check_line(l, &t0, &t1, " info  node req=-: up\n");
    l = check_line(l, &t0, &t1, " error decode req=18446744073709551615: lost it\n");
    l = check_line(l, &t0, &t1, " debug prefill req=1: step\n");
    assert_string_equal(l, "");
    free(text);
}

static int calls;

static int count_call(void)
{
    return ++calls;
}

static void test_level_filter(void **state)
{
    /* messages above the level are dropped before their arguments are
     * evaluated; the level and those below it are written */
    const hpd_log_level_t saved = hpd_log_level;
    struct timespec t0, t1;
    test_capture_t c;

    calls = 0;
    clock_gettime(CLOCK_REALTIME, &t0);
    test_capture_begin(&c);
    hpd_log_set_level(HPD_LOG_LEVEL_WARN);
    HPD_LOG_DEBUG("t", "%d", count_call());
    HPD_LOG_INFO("t", "%d", count_call());
    HPD_LOG_WARN("t", "%d", count_call());
    HPD_LOG_ERROR("t", "%d", count_call());
    hpd_log_set_level(HPD_LOG_LEVEL_ERROR);
    HPD_LOGR_WARN("t", 5, "%d", count_call());
    HPD_LOGR_ERROR("t", 5, "%d", count_call());
    hpd_log_set_level(HPD_LOG_LEVEL_DEBUG);
    HPD_LOG_DEBUG("t", "%d", count_call());
    char *text = test_capture_end(&c, NULL);
    clock_gettime(CLOCK_REALTIME, &t1);
    hpd_log_set_level(saved);

    assert_int_equal(calls, 4);
    const char *l = check_line(text, &t0, &t1, " warn  t req=-: 1\n");
    l = check_line(l, &t0, &t1, " error t req=-: 2\n");
    l = check_line(l, &t0, &t1, " error t req=5: 3\n");
    l = check_line(l, &t0, &t1, " debug t req=-: 4\n");
    assert_string_equal(l, "");
    free(text);
}

static void test_long_lines(void **state)
{
    /* a line longer than the buffer is cut, and still ends with its newline:
     * a long message, then a long component */
    const hpd_log_level_t saved = hpd_log_level;
    char msg[3000], comp[1500], want[3100];
    struct timespec t0, t1;
    test_capture_t c;

    memset(msg, 'm', sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    memset(comp, 'c', sizeof(comp) - 1);
    comp[sizeof(comp) - 1] = '\0';
    hpd_log_set_level(HPD_LOG_LEVEL_WARN);
    clock_gettime(CLOCK_REALTIME, &t0);
    test_capture_begin(&c);
    HPD_LOG_ERROR("t", "%s", msg);
    HPD_LOG_WARN("t", "next");
    HPD_LOG_ERROR(comp, "%s", "lost");
    HPD_LOG_WARN("t", "last");
    char *text = test_capture_end(&c, NULL);
    clock_gettime(CLOCK_REALTIME, &t1);
    hpd_log_set_level(saved);

    /* each cut line: a prefix of what it would have been, then '\n' */
    const char *l = text;
    for (int i = 0; i < 2; i++) {
        snprintf(want, sizeof(want), i == 0 ? " error t req=-: %s" : " error %s req=-: lost",
                 i == 0 ? msg : comp);
        const char *nl = strchr(l, '\n');
        assert_non_null(nl);
        assert_int_equal(nl - l + 1, HPD_LOG_MAX_LINE); /* cut to the most a line holds */
        assert_true(nl - l < 24 + (ptrdiff_t)strlen(want));
        snprintf(want + (nl - l - 24), sizeof(want) - (size_t)(nl - l - 24), "\n");
        l = check_line(l, &t0, &t1, want);
        l = check_line(l, &t0, &t1, i == 0 ? " warn  t req=-: next\n" : " warn  t req=-: last\n");
    }
    assert_string_equal(l, "");
    free(text);
}

static void test_level_parse(void **state)
{
    assert_int_equal(hpd_log_level_parse("error"), HPD_LOG_LEVEL_ERROR);
    assert_int_equal(hpd_log_level_parse("warn"), HPD_LOG_LEVEL_WARN);
    assert_int_equal(hpd_log_level_parse("info"), HPD_LOG_LEVEL_INFO);
    assert_int_equal(hpd_log_level_parse("debug"), HPD_LOG_LEVEL_DEBUG);
    const char *bad[] = {"", "warning", "err", "trace", "debug2", "fatal"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(hpd_log_level_parse(bad[i]), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_format),
        cmocka_unit_test(test_level_filter),
        cmocka_unit_test(test_long_lines),
        cmocka_unit_test(test_level_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
