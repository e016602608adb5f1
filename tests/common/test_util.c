/* common/: id list parsing, number parsing, growing arrays, files, time,
 * prompts files, dtype conversion, status strings, the RNG; each allocation
 * failing in turn (tests/common/alloc_hooks.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/dtype.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/util.h"
#include "tests/common/alloc_hooks.h"
#include "tests/common/capture.h"
#include "tests/test_helpers.h"

#include <fcntl.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef TEST_ASAN
/* The out-of-memory cases ask for more than ASan serves: NULL, not a report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

static void test_id_list(void **state)
{
    int32_t *ids, sentinel;
    size_t n;
    char err[128];

    assert_int_equal(hpd_parse_id_list("1,2, 3 ,40", &ids, &n, err, sizeof(err)), HPD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 3);
    assert_int_equal(ids[3], 40);
    free(ids);
    const char *bad[] = {"", " ", "1,,2", "1,-2", "a", "1;2", "3000000000", "1,",
                         "1 2", "2147483648", ",1", "1.5", "1\xe9", "\xe9"};
#ifdef TEST_ALLOC_HOOKS
    const long live = test_alloc_live;
#endif
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        ids = &sentinel;
        assert_int_equal(hpd_parse_id_list(bad[i], &ids, &n, err, sizeof(err)),
                         HPD_ERR_INVALID_ARG);
        assert_true(strlen(err) > 0);
        assert_ptr_equal(ids, &sentinel); /* untouched on failure */
    }
#ifdef TEST_ALLOC_HOOKS
    assert_int_equal(test_alloc_live, live); /* nothing left allocated */
#endif
    /* the message says where the list went wrong */
    assert_int_equal(hpd_parse_id_list("1, 2,x9", &ids, &n, err, sizeof(err)), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "at 'x9'"));
    assert_int_equal(hpd_parse_id_list("1,", &ids, &n, err, sizeof(err)), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "at 'end of list'"));
}

static void test_id_list_long(void **state)
{
    /* many ids (the array grows), the largest one, surrounding spaces */
    char text[1024] = " 0";
    int32_t *ids;
    size_t n, len = strlen(text);
    char err[128];

    for (int i = 1; i < 100; i++)
        len += (size_t)snprintf(text + len, sizeof(text) - len, ",%d", i * 1000);
    snprintf(text + len, sizeof(text) - len, " , 2147483647 ");
    assert_int_equal(hpd_parse_id_list(text, &ids, &n, err, sizeof(err)), HPD_OK);
    assert_int_equal(n, 101);
    for (int i = 0; i < 100; i++)
        assert_int_equal(ids[i], i * 1000);
    assert_int_equal(ids[100], INT32_MAX);
    free(ids);
    assert_int_equal(hpd_parse_id_list("0", &ids, &n, err, sizeof(err)), HPD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 0);
    free(ids);
    /* decimal, whatever the leading zeros */
    assert_int_equal(hpd_parse_id_list("08,010", &ids, &n, err, sizeof(err)), HPD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 8);
    assert_int_equal(ids[1], 10);
    free(ids);
    assert_int_equal(hpd_parse_id_list("0x1", &ids, &n, err, sizeof(err)), HPD_ERR_INVALID_ARG);
    /* the message says what is wrong */
    assert_int_equal(hpd_parse_id_list(" ", &ids, &n, err, sizeof(err)), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "empty"));
}

static void test_numbers(void **state)
{
    uint64_t v;
    float f;
    assert_int_equal(hpd_parse_u64("42", 0, 100, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(hpd_parse_u64("101", 0, 100, &v), -1);
    assert_int_equal(hpd_parse_u64("-1", 0, 100, &v), -1);
    assert_int_equal(hpd_parse_u64("4x", 0, 100, &v), -1);
    assert_int_equal(hpd_parse_float("0.5", &f), 0);
    assert_true(f == 0.5f);
    assert_int_equal(hpd_parse_float("nan", &f), -1);
    assert_int_equal(hpd_parse_float("1e", &f), -1);
}

static void test_parse_u64(void **state)
{
    uint64_t v;

    /* both bounds are inclusive, the whole range of uint64_t is there */
    assert_int_equal(hpd_parse_u64("7", 7, 7, &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(hpd_parse_u64("0", 0, 0, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(hpd_parse_u64("18446744073709551615", 0, UINT64_MAX, &v), 0);
    assert_true(v == UINT64_MAX);
    /* out of range, past uint64_t, not a whole number: -1, *value_p untouched */
    const struct {
        const char *text;
        uint64_t min, max;
    } bad[] = {
        {"6", 7, 100}, {"8", 0, 7}, {"18446744073709551616", 0, UINT64_MAX},
        {"99999999999999999999999", 0, UINT64_MAX}, {"", 0, UINT64_MAX}, {" 7", 0, 100},
        {"+7", 0, 100}, {"7 ", 0, 100}, {"7\n", 0, 100}, {"0x7", 0, 100}, {"7\xe9", 0, 100},
        {NULL, 0, 100},
    };
    for (size_t i = 0; i < HPD_ARRAY_SIZE(bad); i++) {
        v = 1234;
        assert_int_equal(hpd_parse_u64(bad[i].text, bad[i].min, bad[i].max, &v), -1);
        assert_int_equal(v, 1234);
    }
}

static void test_parse_float(void **state)
{
    float f;

    assert_int_equal(hpd_parse_float("-2.5", &f), 0);
    assert_true(f == -2.5f);
    assert_int_equal(hpd_parse_float("1e3", &f), 0);
    assert_true(f == 1000.0f);
    assert_int_equal(hpd_parse_float("0", &f), 0);
    assert_true(f == 0.0f);
    errno = ERANGE; /* left by an earlier call: not this number's overflow */
    assert_int_equal(hpd_parse_float("0.25", &f), 0);
    assert_true(f == 0.25f);
    /* not a whole finite float, or out of the range of float: -1, *value_p
     * untouched */
    const char *bad[] = {"", " ", "inf", "-inf", "1e39", "-1e39", "1e-50", "0.5x",
                         "0.5 ", "x", NULL};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        f = 7.0f;
        assert_int_equal(hpd_parse_float(bad[i], &f), -1);
        assert_true(f == 7.0f);
    }
}

static void test_grow(void **state)
{
    int *items = NULL;
    size_t cap = 0;

    assert_int_equal(hpd_grow(&items, &cap, 0, sizeof(*items)), HPD_OK);
    assert_int_equal(cap, 0);
    /* doubling from 16, the contents kept */
    assert_int_equal(hpd_grow(&items, &cap, 1, sizeof(*items)), HPD_OK);
    assert_non_null(items);
    assert_int_equal(cap, 16);
    for (int i = 0; i < 16; i++)
        items[i] = 7 * i;
    /* room enough: nothing changes */
    const int *before = items;
    assert_int_equal(hpd_grow(&items, &cap, 16, sizeof(*items)), HPD_OK);
    assert_ptr_equal(items, before);
    assert_int_equal(cap, 16);
    assert_int_equal(hpd_grow(&items, &cap, 17, sizeof(*items)), HPD_OK);
    assert_int_equal(cap, 32);
    for (int i = 16; i < 32; i++)
        items[i] = 7 * i;
    assert_int_equal(hpd_grow(&items, &cap, 100, sizeof(*items)), HPD_OK);
    assert_int_equal(cap, 128);
    for (int i = 0; i < 32; i++)
        assert_int_equal(items[i], 7 * i);
    /* out of memory: nothing changes */
    before = items;
    assert_int_equal(hpd_grow(&items, &cap, (size_t)1 << 40, 1024), HPD_ERR_NO_MEMORY);
    /* sizes whose bytes overflow size_t: refused, nothing touched */
    assert_int_equal(hpd_grow(&items, &cap, SIZE_MAX / 2, 4), HPD_ERR_NO_MEMORY);
    assert_int_equal(hpd_grow(&items, &cap, SIZE_MAX, 1), HPD_ERR_NO_MEMORY);
    assert_ptr_equal(items, before);
    assert_int_equal(cap, 128);
    for (int i = 0; i < 32; i++)
        assert_int_equal(items[i], 7 * i);
    free(items);
}

/* The lowest free file descriptor: a descriptor leaked since the last call
 * shows as a higher one. */
static int lowest_free_fd(void)
{
    const int fd = dup(0);
    assert_true(fd >= 0);
    close(fd);
    return fd;
}

static void test_files(void **state)
{
    const char blob[] = {'a', 0, 'b', '\n', (char)0xff, 'z'};
    char dir[64], path[128], bad[128], *data;
    size_t len;

    test_tmpdir(dir, sizeof(dir), "util");
    snprintf(path, sizeof(path), "%s/blob", dir);
    /* binary data round trip, NUL-terminated */
    assert_int_equal(hpd_write_file(path, blob, sizeof(blob)), HPD_OK);
    assert_int_equal(hpd_read_file(path, &data, &len), HPD_OK);
    assert_int_equal(len, sizeof(blob));
    assert_memory_equal(data, blob, sizeof(blob));
    assert_int_equal(data[len], '\0');
    free(data);
    /* a rewrite truncates */
    assert_int_equal(hpd_write_file(path, "xy", 2), HPD_OK);
    assert_int_equal(hpd_read_file(path, &data, &len), HPD_OK);
    assert_int_equal(len, 2);
    assert_string_equal(data, "xy");
    free(data);
    assert_int_equal(hpd_write_file(path, "", 0), HPD_OK);
    assert_int_equal(hpd_read_file(path, &data, &len), HPD_OK);
    assert_int_equal(len, 0);
    assert_string_equal(data, "");
    free(data);
    /* a missing file, a file in a missing directory: HPD_ERR_IO; a
     * directory: an error; the out-parameters untouched */
    snprintf(bad, sizeof(bad), "%s/missing/file", dir);
    test_capture_t c;
    test_capture_begin(&c); /* the errors are logged */
    const int fd = lowest_free_fd();
    data = dir;
    len = 99;
    const hpd_status_t missing = hpd_read_file(bad, &data, &len);
    const hpd_status_t is_dir = hpd_read_file(dir, &data, &len);
    const hpd_status_t no_dir = hpd_write_file(bad, "x", 1);
    /* a device that takes no byte: the error shows in fwrite or in fclose */
    static char big[1 << 16];
    const hpd_status_t full = hpd_write_file("/dev/full", "x", 1);
    const hpd_status_t full_big = hpd_write_file("/dev/full", big, sizeof(big));
    /* a file that cannot be sized (a pipe, its writer open so that it opens) */
    char fifo[128];
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const int writer = open(fifo, O_RDWR);
    assert_true(writer >= 0);
    const int fd_pipe = lowest_free_fd();
    const hpd_status_t fifo_st = hpd_read_file(fifo, &data, &len);
    const int fd_pipe_after = lowest_free_fd();
    close(writer);
    /* a file shorter than its size says (sysfs): read or refused */
    char *sys = NULL;
    size_t sys_len;
    if (hpd_read_file("/sys/devices/system/cpu/online", &sys, &sys_len) == HPD_OK)
        assert_int_equal(strlen(sys), sys_len);
    free(sys);
    /* no descriptor left open on any path */
    const int fd_after = lowest_free_fd();
    char *logged = test_capture_end(&c, NULL);
    assert_non_null(strstr(logged, "is a directory (expected a file)"));
    free(logged);
    assert_int_equal(missing, HPD_ERR_IO);
    assert_int_equal(is_dir, HPD_ERR_INVALID_ARG); /* not "out of memory" */
    assert_int_equal(no_dir, HPD_ERR_IO);
    assert_int_equal(full, HPD_ERR_IO);
    assert_int_equal(full_big, HPD_ERR_IO);
    assert_int_equal(fifo_st, HPD_ERR_IO);
    assert_ptr_equal(data, dir);
    assert_int_equal(len, 99);
    assert_int_equal(fd_after, fd);
    assert_int_equal(fd_pipe_after, fd_pipe);
    test_rmtree(dir);
}

static void test_out_of_memory(void **state)
{
    /* each allocation in turn fails: HPD_ERR_NO_MEMORY (HPD_ERR_IO when it
     * was the stream's, or success when stdio did without it), the
     * out-parameters untouched, nothing left allocated or open */
#ifndef TEST_ALLOC_HOOKS
    skip();
#else
    char dir[64], path[128];
    char ids[512] = "0";
    test_tmpdir(dir, sizeof(dir), "util");
    snprintf(path, sizeof(path), "%s/prompts", dir);
    for (int i = 1; i < 40; i++)
        snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), ",%d", i);
    char text[sizeof(ids) * 2 + 64];
    snprintf(text, sizeof(text), "1,2\n%s\n", ids);
    for (int i = 0; i < 20; i++)
        strcat(text, "3\n");
    assert_int_equal(hpd_write_file(path, text, strlen(text)), HPD_OK);
    const long live = test_alloc_live;
    const int fd = lowest_free_fd();
    long k;

    for (k = 0;; k++) {
        int32_t *got = NULL;
        size_t n = 99;
        char err[128] = "";
        test_alloc_fail_after(k);
        const hpd_status_t st = hpd_parse_id_list(ids, &got, &n, err, sizeof(err));
        if (!test_alloc_stop()) {
            assert_int_equal(st, HPD_OK);
            assert_int_equal(n, 40);
            free(got);
            break;
        }
        assert_int_equal(st, HPD_ERR_NO_MEMORY);
        assert_true(strlen(err) > 0);
        assert_null(got);
        assert_int_equal(n, 99);
        assert_int_equal(test_alloc_live, live);
    }
    assert_true(k > 1); /* the array grew */
    for (k = 0;; k++) {
        char *data = NULL;
        size_t len = 99;
        test_alloc_fail_after(k);
        const hpd_status_t st = hpd_read_file(path, &data, &len);
        const bool failed = test_alloc_stop();
        if (st == HPD_OK) { /* stdio may do without the allocation */
            assert_string_equal(data, text);
            assert_int_equal(len, strlen(text));
            free(data);
        } else {
            assert_true(failed);
            assert_true(st == HPD_ERR_NO_MEMORY || st == HPD_ERR_IO);
            assert_null(data);
            assert_int_equal(len, 99);
        }
        assert_int_equal(test_alloc_live, live);
        assert_int_equal(lowest_free_fd(), fd);
        if (!failed)
            break;
    }
    for (k = 0;; k++) {
        hpd_prompt_t *prompts = NULL;
        size_t n = 99;
        test_capture_t c;
        test_capture_begin(&c);
        test_alloc_fail_after(k);
        const hpd_status_t st = hpd_read_prompts("hpd-test", path, &prompts, &n);
        const bool failed = test_alloc_stop();
        char *err = test_capture_end(&c, NULL);
        if (st == HPD_OK) {
            assert_int_equal(n, 22);
            assert_int_equal(prompts[1].n, 40);
            for (int i = 0; i < 40; i++)
                assert_int_equal(prompts[1].ids[i], i);
            hpd_prompts_free(prompts, n);
        } else {
            assert_true(failed);
            assert_true(st == HPD_ERR_NO_MEMORY || st == HPD_ERR_IO);
            assert_non_null(strstr(err, "hpd-test: "));
            assert_null(prompts);
            assert_int_equal(n, 99);
        }
        free(err);
        assert_int_equal(test_alloc_live, live);
        assert_int_equal(lowest_free_fd(), fd);
        if (!failed)
            break;
    }
    assert_int_equal(test_alloc_live, live);
    test_rmtree(dir);
#endif
}

static void test_time_now(void **state)
{
    /* seconds on a monotonic clock: a 20 ms sleep reads as at least 20 ms */
    const struct timespec nap = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
    const double t0 = hpd_time_now();
    nanosleep(&nap, NULL);
    const double t1 = hpd_time_now();
    assert_true(t1 - t0 >= 0.0195);
    assert_true(t1 - t0 < 10.0);
}

/* hpd_read_prompts on a file holding text; what it printed in *err_p. */
static hpd_status_t read_prompts(const char *dir, const char *text, hpd_prompt_t **prompts_p,
                                 size_t *n_p, char **err_p)
{
    char path[128];
    test_capture_t c;

    snprintf(path, sizeof(path), "%s/prompts", dir);
    assert_int_equal(hpd_write_file(path, text, strlen(text)), HPD_OK);
    test_capture_begin(&c);
    const hpd_status_t st = hpd_read_prompts("hpd-test", path, prompts_p, n_p);
    *err_p = test_capture_end(&c, NULL);
    return st;
}

static void assert_prompt(const hpd_prompt_t *p, const int32_t *ids, size_t n)
{
    assert_int_equal(p->n, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p->ids[i], ids[i]);
}

static void test_read_prompts(void **state)
{
    hpd_prompt_t *prompts;
    size_t n;
    char dir[64], path[128], *err;

    test_tmpdir(dir, sizeof(dir), "util");
#ifdef TEST_ALLOC_HOOKS
    const long live = test_alloc_live;
#endif
    /* one prompt a line; blank and whitespace-only lines skipped; CRLF */
    assert_int_equal(read_prompts(dir, "1,2,3\n\n   \n\t \r\n 4 , 5\r\n\r\n6\n", &prompts, &n, &err),
                     HPD_OK);
    assert_string_equal(err, "");
    free(err);
    assert_int_equal(n, 3);
    assert_prompt(&prompts[0], (const int32_t[]){1, 2, 3}, 3);
    assert_prompt(&prompts[1], (const int32_t[]){4, 5}, 2);
    assert_prompt(&prompts[2], (const int32_t[]){6}, 1);
    hpd_prompts_free(prompts, n);
    /* a single prompt without a final newline */
    assert_int_equal(read_prompts(dir, "7,8", &prompts, &n, &err), HPD_OK);
    free(err);
    assert_int_equal(n, 1);
    assert_prompt(&prompts[0], (const int32_t[]){7, 8}, 2);
    hpd_prompts_free(prompts, n);
    /* more prompts than the first allocation holds */
    char many[512] = "";
    for (int i = 0; i < 40; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%d,%d\n", i, 100 + i);
    assert_int_equal(read_prompts(dir, many, &prompts, &n, &err), HPD_OK);
    free(err);
    assert_int_equal(n, 40);
    for (int i = 0; i < 40; i++)
        assert_prompt(&prompts[i], (const int32_t[]){i, 100 + i}, 2);
    hpd_prompts_free(prompts, n);

    /* errors: printed after "tool: ", a bad id with its line (empty lines
     * count); the out-parameters untouched */
    prompts = NULL;
    n = 99;
    assert_int_equal(read_prompts(dir, "1\n\n2;3\n4\n", &prompts, &n, &err), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "hpd-test: "));
    assert_non_null(strstr(err, " line 3: "));
    free(err);
    assert_int_equal(read_prompts(dir, "\n  \n\r\n", &prompts, &n, &err), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "hpd-test: "));
    free(err);
    assert_int_equal(read_prompts(dir, "", &prompts, &n, &err), HPD_ERR_INVALID_ARG);
    free(err);
    assert_null(prompts);
    assert_int_equal(n, 99);
    snprintf(path, sizeof(path), "%s/missing", dir);
    test_capture_t c;
    test_capture_begin(&c);
    const hpd_status_t st = hpd_read_prompts("hpd-test", path, &prompts, &n);
    err = test_capture_end(&c, NULL);
    assert_int_equal(st, HPD_ERR_IO);
    assert_non_null(strstr(err, "hpd-test: "));
    free(err);
    assert_null(prompts);
#ifdef TEST_ALLOC_HOOKS
    assert_int_equal(test_alloc_live, live); /* hpd_prompts_free freed all */
#endif
    test_rmtree(dir);
}

static void test_dtypes(void **state)
{
    const float vals[] = {0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 1e-3f};
    uint16_t h;
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        h = hpd_f32_to_bf16(vals[i]);
        assert_close(hpd_bf16_to_f32(h), vals[i], fabsf(vals[i]) / 128 + 1e-30);
        h = hpd_f32_to_f16(vals[i]);
        assert_close(hpd_f16_to_f32(h), vals[i], fabsf(vals[i]) / 1024 + 1e-7);
    }
    /* f16: every one of the 65536 bit patterns converts exactly to f32 and back */
    for (uint32_t i = 0; i < 65536; i++) {
        const float f = hpd_f16_to_f32((uint16_t)i);
        if (f == f) /* NaNs keep being NaN but may change payload */
            assert_int_equal(hpd_f32_to_f16(f), i);
    }
    assert_true(hpd_f16_to_f32(0x3c00) == 1.0f);
    assert_true(hpd_f16_to_f32(0x0001) == 5.9604644775390625e-8f); /* smallest subnormal */
    assert_int_equal(hpd_f32_to_f16(1e6f), 0x7c00);                 /* overflow: inf */
    assert_int_equal(hpd_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);   /* a tie rounds to even */
    assert_int_equal(hpd_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    /* bf16 rounds to nearest even */
    assert_int_equal(hpd_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    hpd_dtype_t d;
    assert_int_equal(hpd_dtype_parse("BF16", &d), 0);
    assert_int_equal(d, HPD_DTYPE_BF16);
    assert_int_equal(hpd_dtype_parse("I64", &d), -1);
    assert_string_equal(hpd_status_str(HPD_ERR_NO_RESOURCE), "resource exhausted");
}

/* Every FP8 E4M3 code against the float64 formula (sign, 4 exponent bits
 * biased by 7, 3 mantissa bits; subnormals; S.1111.111 the only NaN), and
 * the conversion back rounding to nearest even, saturating at 448. */
static void test_f8e4m3(void **state)
{
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        const double mag = e == 0 ? m / 8.0 * ldexp(1, -6) : (1 + m / 8.0) * ldexp(1, e - 7);
        const double want = (b & 0x80) ? -mag : mag;
        const float got = hpd_f8e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            assert_true(isnan(got));
            continue;
        }
        if (!((double)got == want))
            fail_msg("code 0x%02x: %.9g, want %.9g", b, got, want);
        assert_int_equal(hpd_f32_to_f8e4m3(got), b == 0x80 ? 0x80 : b); /* round trip */
    }
    /* halfway between 1 (0x38) and 1.125 (0x39): to the even code; just above: up */
    assert_int_equal(hpd_f32_to_f8e4m3(1.0625f), 0x38);
    assert_int_equal(hpd_f32_to_f8e4m3(1.0626f), 0x39);
    assert_int_equal(hpd_f32_to_f8e4m3(1.1875f), 0x3a); /* 1.125..1.25: even is 1.25 */
    assert_int_equal(hpd_f32_to_f8e4m3(1000.0f), 0x7e);  /* 448 */
    assert_int_equal(hpd_f32_to_f8e4m3(-1000.0f), 0xfe);
    assert_int_equal(hpd_f32_to_f8e4m3(0.0009765625f), 0x00); /* 2^-10: half the least, even */
    assert_int_equal(hpd_f32_to_f8e4m3(0.0029296875f), 0x02); /* 1.5 * 2^-9 to even: 2 */
    assert_int_equal(hpd_f32_to_f8e4m3(0.0153f), 0x08);      /* rounds up to 2^-6 */
    assert_true(isnan(hpd_f8e4m3_to_f32(hpd_f32_to_f8e4m3(NAN))));
}

static void test_dtype_names(void **state)
{
    /* each dtype: its size, its name, and the spellings that parse to it
     * (ours, safetensors', torch's) */
    const struct {
        hpd_dtype_t dtype;
        size_t size;
        const char *name, *aliases[3];
    } types[] = {
        {HPD_DTYPE_F32, 4, "f32", {"F32", "float32", "Float32"}},
        {HPD_DTYPE_F16, 2, "f16", {"F16", "float16", "FLOAT16"}},
        {HPD_DTYPE_BF16, 2, "bf16", {"BF16", "bfloat16", "BFloat16"}},
        {HPD_DTYPE_F8_E4M3, 1, "f8_e4m3", {"F8_E4M3", "float8_e4m3fn", "f8_E4M3"}},
    };
    hpd_dtype_t d;

    for (size_t t = 0; t < HPD_ARRAY_SIZE(types); t++) {
        assert_int_equal(hpd_dtype_size(types[t].dtype), types[t].size);
        assert_string_equal(hpd_dtype_name(types[t].dtype), types[t].name);
        d = (hpd_dtype_t)-1;
        assert_int_equal(hpd_dtype_parse(types[t].name, &d), 0);
        assert_int_equal(d, types[t].dtype);
        for (size_t a = 0; a < 3; a++) {
            d = (hpd_dtype_t)-1;
            assert_int_equal(hpd_dtype_parse(types[t].aliases[a], &d), 0);
            assert_int_equal(d, types[t].dtype);
        }
    }
    /* a value outside the enum (a corrupt file header) still has a name */
    const char *unknown = hpd_dtype_name((hpd_dtype_t)4);
    assert_non_null(unknown);
    assert_true(strlen(unknown) > 0);
    for (size_t t = 0; t < HPD_ARRAY_SIZE(types); t++)
        assert_string_not_equal(unknown, types[t].name);
    const char *bad[] = {"", "f64", "f3", "f320", "float33", "float", "bf", "bf16 ", "int8"};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(bad); i++) {
        d = (hpd_dtype_t)-1;
        assert_int_equal(hpd_dtype_parse(bad[i], &d), -1);
        assert_int_equal(d, (hpd_dtype_t)-1);
    }
}

static void test_dtype_arrays(void **state)
{
    /* n elements to and from each dtype, through unaligned buffers: element i
     * is the scalar conversion of value i, and nothing past n is written */
    enum { N = 37 };
    const hpd_dtype_t types[] = {HPD_DTYPE_F32, HPD_DTYPE_F16, HPD_DTYPE_BF16};
    float src[N], back[N + 1];
    unsigned char buf[1 + 4 * N + 8];

    test_fill(src, N, 5, 3.0f);
    src[0] = 1.0f;
    src[1] = -0.0f;
    src[2] = 65536.0f; /* f16 inf */
    for (size_t t = 0; t < HPD_ARRAY_SIZE(types); t++) {
        const size_t size = hpd_dtype_size(types[t]);
        memset(buf, 0xa5, sizeof(buf));
        hpd_dtype_from_f32(types[t], src, buf + 1, N);
        assert_int_equal(buf[0], 0xa5);
        for (size_t i = 1 + size * N; i < sizeof(buf); i++)
            assert_int_equal(buf[i], 0xa5);
        memset(back, 0xff, sizeof(back)); /* NaN: nothing left from the last dtype */
        back[N] = 42.0f;
        hpd_dtype_to_f32(types[t], buf + 1, back, N);
        assert_true(back[N] == 42.0f);
        for (size_t i = 0; i < N; i++) {
            uint16_t h;
            float want = src[i];
            memcpy(&h, buf + 1 + size * i, sizeof(h));
            if (types[t] == HPD_DTYPE_F16) {
                assert_int_equal(h, hpd_f32_to_f16(src[i]));
                want = hpd_f16_to_f32(h);
            } else if (types[t] == HPD_DTYPE_BF16) {
                assert_int_equal(h, hpd_f32_to_bf16(src[i]));
                want = hpd_bf16_to_f32(h);
            } else {
                assert_memory_equal(buf + 1 + size * i, &src[i], sizeof(float));
            }
            assert_memory_equal(&back[i], &want, sizeof(float));
        }
    }
}

static void test_status_str(void **state)
{
    /* every status: the description of HPD_STATUS_MAP, lowercase; anything
     * else: "unknown status" */
#define CHECK_STATUS(name, value, text)                         \
    assert_int_equal(name, value);                              \
    assert_string_equal(hpd_status_str(name), text);            \
    for (const char *p = hpd_status_str(name); *p; p++)         \
        assert_false(*p >= 'A' && *p <= 'Z');
    HPD_STATUS_MAP(CHECK_STATUS)
#undef CHECK_STATUS
    assert_string_equal(hpd_status_str((hpd_status_t)2), "unknown status");
    assert_string_equal(hpd_status_str((hpd_status_t)-100), "unknown status");
}

static void test_rng(void **state)
{
    /* a pure function of (seed, counter), spread over [0, 1) */
    double mean = 0;
    assert_true(hpd_rng_uniform(1, 2) == hpd_rng_uniform(1, 2));
    assert_true(hpd_rng_uniform(1, 2) != hpd_rng_uniform(1, 3));
    assert_true(hpd_rng_uniform(1, 2) != hpd_rng_uniform(2, 2));
    for (int i = 0; i < 10000; i++) {
        float u = hpd_rng_uniform(7, (uint64_t)i);
        assert_true(u >= 0.0f && u < 1.0f);
        mean += u;
    }
    assert_close(mean / 10000, 0.5, 0.02);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_list),
        cmocka_unit_test(test_id_list_long),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_parse_u64),
        cmocka_unit_test(test_parse_float),
        cmocka_unit_test(test_grow),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_time_now),
        cmocka_unit_test(test_read_prompts),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_f8e4m3),
        cmocka_unit_test(test_dtype_names),
        cmocka_unit_test(test_dtype_arrays),
        cmocka_unit_test(test_status_str),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
