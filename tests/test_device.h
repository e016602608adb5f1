/* The device a test that can run on a GPU runs on (header-only). */
#ifndef HPD_TESTS_DEVICE_H
#define HPD_TESTS_DEVICE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

#define TEST_EXIT_SKIP 77 /* ctest's SKIP_RETURN_CODE */

/* Whether HPD_REQUIRE_GPU=1 asks that a GPU test never skip. */
static inline bool test_require_gpu(void)
{
    const char *v = getenv("HPD_REQUIRE_GPU");
    return v != NULL && strcmp(v, "1") == 0;
}

/* Opens HPD_TEST_DEVICE (`dflt` when unset; "cpu" runs a GPU test's checks
 * on the CPU backend, to check the test itself). The test exits 77 (skipped)
 * only when the machine has no GPU at all (or the build no CUDA backend) and
 * HPD_REQUIRE_GPU is not 1; a
 * misspelt device, a GPU index this machine lacks, a driver error or any
 * other failure exits 1 with the reason, so that a GPU test never goes green
 * without running. */
static inline hpd_backend_t *test_open_device(const char *dflt, uint32_t threads,
                                              const char **device_p)
{
    const char *device = getenv("HPD_TEST_DEVICE") ? getenv("HPD_TEST_DEVICE") : dflt;
    hpd_backend_params_t p = {.device = device, .n_threads = threads};
    hpd_backend_t *b = NULL;
    const hpd_status_t st = hpd_backend_create(&p, &b);
    if (st == HPD_ERR_NO_DEVICE && !test_require_gpu()) {
        fprintf(stderr, "device %s: this machine has no GPU: skipped\n", device);
        exit(TEST_EXIT_SKIP);
    }
    if (st == HPD_ERR_UNSUPPORTED && strncmp(device, "cuda", 4) == 0 && !test_require_gpu()) {
        fprintf(stderr, "device %s: this build has no CUDA backend: skipped\n", device);
        exit(TEST_EXIT_SKIP);
    }
    if (st != HPD_OK) {
        fprintf(stderr, "device %s cannot be opened: %s%s\n", device, hpd_status_str(st),
                st == HPD_ERR_NO_DEVICE ? " (HPD_REQUIRE_GPU=1 forbids skipping)" : "");
        exit(1);
    }
    if (device_p != NULL)
        *device_p = device;
    return b;
}

#endif
