/* NCCL send/recv between two GPUs in two processes. Needs 2 GPUs; skips
 * (exit 77) otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/xfer_nccl.h"

enum { BYTES = 64 << 20 };

/* One rank: rank 0 sends a pattern, rank 1 receives and checks it. */
static int rank_main(int rank, const uint8_t *id)
{
    hpd_nccl_params_t p = {rank, rank, 2, {0}};
    hpd_nccl_t *n;
    void *dev;
    uint8_t *host = malloc(BYTES);

    memcpy(p.id, id, HPD_NCCL_ID_BYTES);
    if (hpd_nccl_create(&p, &n) != HPD_OK || cudaMalloc(&dev, BYTES) != cudaSuccess)
        return 1;
    for (size_t i = 0; i < BYTES; i++)
        host[i] = (uint8_t)(i * 2654435761u >> 24);
    if (rank == 0) {
        if (cudaMemcpy(dev, host, BYTES, cudaMemcpyHostToDevice) != cudaSuccess ||
            hpd_nccl_send(n, dev, BYTES, 1) != HPD_OK || hpd_nccl_sync(n) != HPD_OK)
            return 1;
    } else {
        uint8_t *got = malloc(BYTES);
        if (cudaMemset(dev, 0, BYTES) != cudaSuccess || hpd_nccl_recv(n, dev, BYTES, 0) != HPD_OK ||
            hpd_nccl_sync(n) != HPD_OK ||
            cudaMemcpy(got, dev, BYTES, cudaMemcpyDeviceToHost) != cudaSuccess ||
            memcmp(got, host, BYTES) != 0)
            return 1;
        free(got);
    }
    cudaFree(dev);
    hpd_nccl_destroy(n);
    free(host);
    return 0;
}

static void test_send_recv(void **state)
{
    int fds[2];
    pid_t pids[2];
    assert_int_equal(pipe(fds), 0);
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            uint8_t id[HPD_NCCL_ID_BYTES];
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (r == 0) {
                if (hpd_nccl_unique_id(id) != HPD_OK)
                    _exit(1);
                for (int k = 0; k < 1; k++)
                    if (write(fds[1], id, sizeof(id)) != sizeof(id))
                        _exit(1);
            } else if (read(fds[0], id, sizeof(id)) != sizeof(id)) {
                _exit(1);
            }
            _exit(rank_main(r, id));
        }
    }
    for (int r = 0; r < 2; r++) {
        int status;
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

int main(void)
{
    /* count devices in a child: CUDA must not be initialised before fork */
    pid_t pid = fork();
    if (pid == 0)
        _exit(hpd_nccl_device_count() >= 2 ? 0 : 77);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("test_xfer_nccl: fewer than 2 GPUs, skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_send_recv)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
