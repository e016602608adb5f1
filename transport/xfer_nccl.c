#include "transport/xfer_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define LOG_COMPONENT "nccl"

struct hpd_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready; /* recorded on a producer's stream, waited on by ours */
    int device;
};

#define CUDA_OK(call, what)                                                                  \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            HPD_LOG_ERROR(LOG_COMPONENT, "%s failed: %s", what, cudaGetErrorString(e_));     \
            return HPD_ERR_IO;                                                               \
        }                                                                                    \
    } while (0)

#define NCCL_OK(call, what)                                                                  \
    do {                                                                                     \
        ncclResult_t r_ = (call);                                                            \
        if (r_ != ncclSuccess) {                                                             \
            HPD_LOG_ERROR(LOG_COMPONENT, "%s failed: %s", what, ncclGetErrorString(r_));     \
            return HPD_ERR_IO;                                                               \
        }                                                                                    \
    } while (0)

hpd_status_t hpd_nccl_unique_id(uint8_t id[HPD_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    NCCL_OK(ncclGetUniqueId(&u), "ncclGetUniqueId");
    memcpy(id, u.internal, HPD_NCCL_ID_BYTES);
    return HPD_OK;
}

hpd_status_t hpd_nccl_create(const hpd_nccl_params_t *p, hpd_nccl_t **nccl_p)
{
    hpd_nccl_t *n = calloc(1, sizeof(*n));
    ncclUniqueId u;

    if (n == NULL)
        return HPD_ERR_NO_MEMORY;
    n->device = p->device;
    memcpy(u.internal, p->id, HPD_NCCL_ID_BYTES);
    if (cudaSetDevice(p->device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess) {
        HPD_LOG_ERROR(LOG_COMPONENT, "device %d: cannot create a stream", p->device);
        free(n);
        return HPD_ERR_IO;
    }
    if (cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming) != cudaSuccess) {
        HPD_LOG_ERROR(LOG_COMPONENT, "device %d: cannot create an event: %s", p->device,
                      cudaGetErrorString(cudaGetLastError()));
        cudaStreamDestroy(n->stream);
        free(n);
        return HPD_ERR_IO;
    }
    ncclResult_t r = ncclCommInitRank(&n->comm, p->n_ranks, u, p->rank);
    if (r != ncclSuccess) {
        HPD_LOG_ERROR(LOG_COMPONENT, "rank %d of %d on device %d: %s", p->rank, p->n_ranks,
                      p->device, ncclGetErrorString(r));
        cudaEventDestroy(n->ready);
        cudaStreamDestroy(n->stream);
        free(n);
        return HPD_ERR_IO;
    }
    *nccl_p = n;
    return HPD_OK;
}

void hpd_nccl_destroy(hpd_nccl_t *n)
{
    if (n == NULL)
        return;
    ncclCommDestroy(n->comm);
    cudaEventDestroy(n->ready);
    cudaStreamDestroy(n->stream);
    free(n);
}

hpd_status_t hpd_nccl_transfer(hpd_nccl_t *n, const hpd_nccl_op_t *ops, uint32_t n_ops,
                               void *after_stream)
{
    CUDA_OK(cudaSetDevice(n->device), "cudaSetDevice");
    if (after_stream != NULL) {
        /* the producer's work so far, then ours: no host synchronisation */
        CUDA_OK(cudaEventRecord(n->ready, (cudaStream_t)after_stream),
                "cudaEventRecord on the producer's stream");
        CUDA_OK(cudaStreamWaitEvent(n->stream, n->ready, 0), "cudaStreamWaitEvent");
    }
    NCCL_OK(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    uint32_t i = 0;
    for (; i < n_ops && r == ncclSuccess; i++)
        r = ops[i].recv ? ncclRecv(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, n->comm,
                                   n->stream)
                        : ncclSend(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, n->comm,
                                   n->stream);
    /* the group is closed whatever failed inside it */
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s %u of %u (%zu bytes, peer %d) failed: %s",
                      ops[i - 1].recv ? "ncclRecv" : "ncclSend", i - 1, n_ops,
                      ops[i - 1].bytes, ops[i - 1].peer, ncclGetErrorString(r));
        return HPD_ERR_IO;
    }
    NCCL_OK(end, "ncclGroupEnd");
    return HPD_OK;
}

hpd_status_t hpd_nccl_sync(hpd_nccl_t *n)
{
    CUDA_OK(cudaStreamSynchronize(n->stream), "cudaStreamSynchronize");
    return HPD_OK;
}
