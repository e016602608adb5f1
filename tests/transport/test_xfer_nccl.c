/* NCCL send/recv between two GPUs in two processes: raw device memory, and
 * a request's KV pages translated on the sender's GPU (B=64,P=1 NHD to
 * B=16,P=4 HND) into scattered pages of the receiver's device pool, which
 * must equal the CPU backend's translation. The pages go as one transfer
 * (one NCCL group) ordered after the backend's stream by an event, with no
 * host synchronisation between the translation (or the receiver's zeroing
 * of its pool) and the transfer. Needs 2 GPUs; skips (exit 77) otherwise. */
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

#include "kernels/backend.h"
#include "tests/test_device.h"
#include "tests/test_helpers.h"
#include "transport/xfer_nccl.h"

enum { BYTES = 64 << 20 };

/* One rank: rank 0 sends a pattern, rank 1 receives and checks it. */
static int rank_main(int rank, const uint8_t *id)
{
    hpd_nccl_params_t p = {.device = rank, .rank = rank, .n_ranks = 2, .id = {0}};
    hpd_nccl_t *n;
    void *dev;
    uint8_t *host = malloc(BYTES);

    memcpy(p.id, id, HPD_NCCL_ID_BYTES);
    if (hpd_nccl_create(&p, &n) != HPD_OK || cudaMalloc(&dev, BYTES) != cudaSuccess)
        return 1;
    for (size_t i = 0; i < BYTES; i++)
        host[i] = (uint8_t)(i * 2654435761u >> 24);
    const hpd_nccl_op_t op = {.buf = dev, .bytes = BYTES, .peer = 1 - rank, .recv = rank == 1};
    if (rank == 0) {
        if (cudaMemcpy(dev, host, BYTES, cudaMemcpyHostToDevice) != cudaSuccess ||
            hpd_nccl_transfer(n, &op, 1, NULL) != HPD_OK || hpd_nccl_sync(n) != HPD_OK)
            return 1;
    } else {
        uint8_t *got = malloc(BYTES);
        if (cudaMemset(dev, 0, BYTES) != cudaSuccess ||
            hpd_nccl_transfer(n, &op, 1, NULL) != HPD_OK || hpd_nccl_sync(n) != HPD_OK ||
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

enum { TOKENS = 150, LAYERS = 4, KVH = 2, HDIM = 64, SPAGES = 3, DPAGES = 10, DPOOL = 16 };
static const hpd_kv_layout_t src_l = {.block_size = 64,
                                      .pack_size = 1,
                                      .order = HPD_KV_NHD,
                                      .dtype = HPD_DTYPE_F32,
                                      .n_layers = LAYERS,
                                      .n_kv_heads = KVH,
                                      .head_dim = HDIM};
static const hpd_kv_layout_t dst_l = {.block_size = 16,
                                      .pack_size = 4,
                                      .order = HPD_KV_HND,
                                      .dtype = HPD_DTYPE_F32,
                                      .n_layers = LAYERS,
                                      .n_kv_heads = KVH,
                                      .head_dim = HDIM};

/* the receiver's page for destination block j (one pack group) */
static uint32_t dst_page(uint32_t j)
{
    return (j * 7 + 3) % DPOOL;
}

/* The source pool (pages g * SPAGES + j, identity tables) and the expected
 * receiver pool (the CPU backend's translation into dst_page()). */
static void kv_reference(float **src_p, float **want_p)
{
    hpd_backend_params_t cp = {.device = "cpu", .n_threads = 1};
    hpd_backend_t *cpu;
    const size_t se = (size_t)LAYERS * SPAGES * hpd_kv_layout_page_elems(&src_l);
    const size_t de = (size_t)DPOOL * hpd_kv_layout_page_elems(&dst_l);
    float *src = malloc(se * sizeof(float)), *want = calloc(de, sizeof(float));
    uint32_t stab[LAYERS][SPAGES], dtab[DPAGES];
    const uint32_t *st[LAYERS], *dt[1] = {dtab};
    test_fill(src, se, 50, 1);
    for (uint32_t g = 0; g < LAYERS; g++) {
        for (uint32_t j = 0; j < SPAGES; j++)
            stab[g][j] = g * SPAGES + j;
        st[g] = stab[g];
    }
    for (uint32_t j = 0; j < DPAGES; j++)
        dtab[j] = dst_page(j);
    hpd_backend_cpu_create(&cp, &cpu);
    hpd_kv_translate_args_t a = {.src = {.layout = &src_l, .pool = src, .tables = st},
                                 .dst = {.layout = &dst_l, .pool = want, .tables = dt},
                                 .n_tokens = TOKENS,
                                 .zero_tail = true};
    if (hpd_kv_translate(cpu, &a) != HPD_OK)
        abort();
    hpd_backend_destroy(cpu);
    *src_p = src;
    *want_p = want;
}

/* Rank 0 translates on its GPU into device staging (dst pages 0..9) and
 * sends page by page; rank 1 receives each page into dst_page(j) of its
 * device pool and compares the pool with the CPU's translation. */
static int kv_rank_main(int rank, const uint8_t *id)
{
    char dev[16];
    hpd_nccl_params_t p = {.device = rank, .rank = rank, .n_ranks = 2, .id = {0}};
    hpd_nccl_t *n;
    hpd_backend_t *gpu;
    float *src, *want;
    const size_t page = hpd_kv_layout_page_bytes(&dst_l);
    const size_t de = (size_t)DPOOL * hpd_kv_layout_page_elems(&dst_l);
    void *pool;

    snprintf(dev, sizeof(dev), "cuda:%d", rank);
    hpd_backend_params_t bp = {.device = dev};
    memcpy(p.id, id, HPD_NCCL_ID_BYTES);
    if (hpd_nccl_create(&p, &n) != HPD_OK || hpd_backend_create(&bp, &gpu) != HPD_OK)
        return 1;
    kv_reference(&src, &want);
    if (rank == 0) {
        const size_t sb = (size_t)LAYERS * SPAGES * hpd_kv_layout_page_bytes(&src_l);
        void *dsrc;
        uint32_t stab[LAYERS][SPAGES], dtab[DPAGES];
        const uint32_t *st[LAYERS], *dt[1] = {dtab};
        for (uint32_t g = 0; g < LAYERS; g++) {
            for (uint32_t j = 0; j < SPAGES; j++)
                stab[g][j] = g * SPAGES + j;
            st[g] = stab[g];
        }
        for (uint32_t j = 0; j < DPAGES; j++)
            dtab[j] = j;
        if (hpd_backend_alloc(gpu, sb, &dsrc) != HPD_OK ||
            hpd_backend_alloc_pool(gpu, DPAGES * page, &pool) != HPD_OK ||
            hpd_backend_from_host(gpu, dsrc, src, sb) != HPD_OK)
            return 1;
        hpd_kv_translate_args_t a = {.src = {.layout = &src_l, .pool = dsrc, .tables = st},
                                     .dst = {.layout = &dst_l, .pool = pool, .tables = dt},
                                     .n_tokens = TOKENS,
                                     .zero_tail = true,
                                     .first_layer = 0};
        hpd_nccl_op_t ops[DPAGES];
        for (uint32_t j = 0; j < DPAGES; j++)
            ops[j] = (hpd_nccl_op_t){.buf = (char *)pool + j * page, .bytes = page, .peer = 1};
        /* no sync: the transfer waits for the translation on the GPU */
        if (hpd_kv_translate(gpu, &a) != HPD_OK ||
            hpd_nccl_transfer(n, ops, DPAGES, hpd_backend_stream(gpu)) != HPD_OK ||
            hpd_nccl_sync(n) != HPD_OK)
            return 1;
        hpd_backend_free(gpu, dsrc);
    } else {
        float *got = malloc(de * sizeof(float));
        hpd_nccl_op_t ops[DPAGES];
        if (hpd_backend_alloc_pool(gpu, de * sizeof(float), &pool) != HPD_OK)
            return 1;
        for (uint32_t j = 0; j < DPAGES; j++)
            ops[j] = (hpd_nccl_op_t){
                .buf = (char *)pool + dst_page(j) * page, .bytes = page, .peer = 0, .recv = true};
        /* no sync: the receives wait for the zeroing on the GPU */
        if (hpd_backend_memset(gpu, pool, 0, de * sizeof(float)) != HPD_OK ||
            hpd_nccl_transfer(n, ops, DPAGES, hpd_backend_stream(gpu)) != HPD_OK ||
            hpd_nccl_sync(n) != HPD_OK ||
            hpd_backend_to_host(gpu, got, pool, de * sizeof(float)) != HPD_OK)
            return 1;
        if (memcmp(got, want, de * sizeof(float)) != 0) {
            fprintf(stderr, "rank 1: received KV pages differ from the CPU translation\n");
            return 1;
        }
        free(got);
    }
    hpd_backend_free_pool(gpu, pool);
    hpd_backend_destroy(gpu);
    hpd_nccl_destroy(n);
    free(src);
    free(want);
    return 0;
}

/* Runs fn as rank 0 and rank 1 in two child processes sharing an NCCL id. */
static void run_ranks(int (*fn)(int rank, const uint8_t *id))
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
            _exit(fn(r, id));
        }
    }
    for (int r = 0; r < 2; r++) {
        int status;
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

static void test_send_recv(void **state)
{
    run_ranks(rank_main);
}

static void test_kv_pages(void **state)
{
    run_ranks(kv_rank_main);
}

int main(void)
{
    /* count devices in a child: CUDA must not be initialised before fork.
     * Fewer than 2 GPUs skips (unless HPD_REQUIRE_GPU=1); a runtime error
     * fails. */
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        const hpd_status_t st = hpd_backend_cuda_count(&n);
        _exit(st == HPD_OK ? (n >= 2 ? 0 : 77) : st == HPD_ERR_NO_DEVICE ? 77 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 1) {
        fprintf(stderr, "test_xfer_nccl: the CUDA runtime failed to count the GPUs\n");
        return 1;
    }
    if (WEXITSTATUS(status) == 77) {
        fprintf(stderr, "test_xfer_nccl: fewer than 2 GPUs%s\n",
                test_require_gpu() ? " (HPD_REQUIRE_GPU=1 forbids skipping)" : ", skipped");
        return test_require_gpu() ? 1 : 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_send_recv),
                                       cmocka_unit_test(test_kv_pages)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
