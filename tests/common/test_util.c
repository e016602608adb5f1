/* common/: id list parsing, number parsing, dtype conversion, the RNG. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/dtype.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/util.h"
#include "tests/test_helpers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_id_list(void **state)
{
    int32_t *ids;
    size_t n;
    char err[128];

    assert_int_equal(hpd_parse_id_list("1,2, 3 ,40", &ids, &n, err, sizeof(err)), HPD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[3], 40);
    free(ids);
    const char *bad[] = {"", " ", "1,,2", "1,-2", "a", "1;2", "3000000000", "1,"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        assert_int_equal(hpd_parse_id_list(bad[i], &ids, &n, err, sizeof(err)),
                         HPD_ERR_INVALID_ARG);
        assert_true(strlen(err) > 0);
    }
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
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
