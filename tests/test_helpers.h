/* Helpers shared by the cmocka tests (header-only). */
#ifndef HPD_TESTS_HELPERS_H
#define HPD_TESTS_HELPERS_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rng.h"

/* Deterministic normal numbers for test inputs. */
static inline float test_gauss(uint64_t seed, uint64_t i)
{
    hpd_philox_out_t r = hpd_philox4x32(seed, i, 0x7e57);
    float u1 = ((float)(r.v[0] >> 8) + 0.5f) / 16777216.0f;
    float u2 = (float)(r.v[1] >> 8) / 16777216.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static inline float test_uniform(uint64_t seed, uint64_t i)
{
    return hpd_u32_to_unit(hpd_philox4x32(seed, i, 0x0417).v[2]);
}

static inline void test_fill(float *x, size_t n, uint64_t seed, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * test_gauss(seed, i);
}

/* sqrt(sum (a-b)^2 / sum b^2); +inf when any element of either is NaN or
 * infinite, so that `test_rel_rms(...) < tol` fails on them. */
static inline double test_rel_rms(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Whether got is finite and within tol of want. cmocka 1.1's
 * assert_float_equal passes when either side is NaN; every float comparison
 * in the tests goes through this instead. */
static inline bool test_close(double got, double want, double tol)
{
    return isfinite(got) && isfinite(want) && fabs(got - want) <= tol;
}

/* Fails the test (naming both expressions and values) unless got is finite
 * and within tol of want. Needs cmocka.h included first. */
#define assert_close(got, want, tol)                                                          \
    do {                                                                                      \
        const double got_ = (got), want_ = (want), tol_ = (tol);                              \
        if (!test_close(got_, want_, tol_))                                                   \
            fail_msg("%s = %.9g, expected %s = %.9g within %.3g", #got, got_, #want, want_,   \
                     tol_);                                                                   \
    } while (0)

/* Fails unless the relative RMS error of a against b is below tol (and
 * every element is finite). */
#define assert_rel_rms_below(a, b, n, tol)                                                    \
    do {                                                                                      \
        const double err_ = test_rel_rms((a), (b), (n)), tol_ = (tol);                        \
        if (!(err_ < tol_))                                                                   \
            fail_msg("relative RMS of %s against %s is %.3g, expected below %.3g", #a, #b,    \
                     err_, tol_);                                                             \
    } while (0)

/* A fresh temporary directory (created). */
static inline void test_tmpdir(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "/tmp/hpd-test-%s-XXXXXX", tag);
    if (mkdtemp(out) == NULL) {
        perror("mkdtemp");
        abort();
    }
}

/* Runs hpd-mkmodel --out dir with extra arguments; returns its exit status. */
/* hpd-mkmodel --out dir extra, and HPD_TEST_MODEL_EXTRA when set: ctest
 * runs some tests a second time on a mixture-of-experts model that way
 * (tests/CMakeLists.txt). */
static inline int test_mkmodel(const char *dir, const char *extra)
{
    char cmd[4096];
    const char *env = getenv("HPD_TEST_MODEL_EXTRA");
    snprintf(cmd, sizeof(cmd), "%s --out %s %s %s", HPD_MKMODEL, dir, extra ? extra : "",
             env ? env : "");
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static inline void test_rmtree(const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

#endif
