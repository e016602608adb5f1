/* What the cuda_host tests of the gated delta rule and attention share: the
 * CPU backend as the reference, a stand-in CUDA backend whose ops run the
 * emulated kernels, inputs, and the comparisons (each failure counted and
 * named; main returns whether any failed). */
#ifndef HPD_TESTS_CUDA_HOST_TEST_H
#define HPD_TESTS_CUDA_HOST_TEST_H

#include <chrono>
#include <random>

#include "kernels/cuda/cuda_ops.h"

static int hpd_test_failed, hpd_test_checked;

/* The CPU backend (the reference); exits when it cannot be made. */
static hpd_backend_t *test_cpu_backend()
{
    hpd_backend_params_t p = {};
    p.device = "cpu";
    hpd_backend_t *cpu;
    if (hpd_backend_create(&p, &cpu) != HPD_OK) {
        fprintf(stderr, "the CPU backend could not be made\n");
        exit(1);
    }
    return cpu;
}

/* The emulated CUDA backend: ops are called as hpd_cuda_<op>(&be, args). */
struct test_emu_t {
    hpd_cuda_ctx_t ctx = hpd_emu_ctx();
    hpd_backend_t be = {nullptr, &ctx};
    ~test_emu_t() { hpd_emu_ctx_free(&ctx); }
};

[[maybe_unused]] static std::vector<float> test_rnd(size_t n, uint32_t seed, float scale)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> x(n);
    for (float &v : x)
        v = scale * normal(rng);
    return x;
}

/* sqrt(sum (got - want)^2 / sum want^2), +inf when any element of either is
 * NaN or infinite, so that a NaN fails `< tol`. */
static double test_rel_rms(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(got[i]) || !std::isfinite(want[i]))
            return INFINITY;
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

[[maybe_unused]] static void check_status(const char *what, hpd_status_t st)
{
    hpd_test_checked++;
    if (st != HPD_OK) {
        fprintf(stderr, "FAIL %s: %s\n", what, hpd_status_str(st));
        hpd_test_failed++;
    }
}

[[maybe_unused]] static void check_close(const char *what, const float *got, const float *want,
                                         size_t n, double tol)
{
    const double err = test_rel_rms(got, want, n);
    hpd_test_checked++;
    fprintf(stderr, "%s %-36s rel rms %.3g (tolerance %.0e)\n", err < tol ? "ok  " : "FAIL",
            what, err, tol);
    if (!(err < tol))
        hpd_test_failed++;
}

[[maybe_unused]] static void check_same(const char *what, const float *got, const float *want,
                                        size_t n)
{
    hpd_test_checked++;
    size_t i = 0;
    while (i < n && memcmp(got + i, want + i, sizeof(float)) == 0)
        i++;
    if (i == n)
        return;
    fprintf(stderr, "FAIL %s: element %zu of %zu is %.9g, expected the bits of %.9g\n", what,
            i, n, got[i], want[i]);
    hpd_test_failed++;
}

static int test_report(const char *name, std::chrono::steady_clock::time_point t0)
{
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%s: %d checks, %d failed (%.1f s)\n", name, hpd_test_checked, hpd_test_failed, s);
    return hpd_test_failed != 0;
}

#endif
