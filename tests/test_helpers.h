/* Helpers shared by the cmocka tests (header-only). */
#ifndef HPD_TESTS_HELPERS_H
#define HPD_TESTS_HELPERS_H

#include <math.h>
#include <stdarg.h>
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

/* sqrt(sum (a-b)^2 / sum b^2) */
static inline double test_rel_rms(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

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
static inline int test_mkmodel(const char *dir, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s --out %s %s", HPD_MKMODEL, dir, extra ? extra : "");
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
