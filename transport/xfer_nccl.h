/* NCCL send/recv between GPUs: the second data-plane backend, for
 * GPU-to-GPU moves of KV pages and GDN state where NCCL has a path
 * (NVLink, PCIe P2P, IB with GPUDirect). Built whenever CUDA is found. */
#ifndef HPD_TRANSPORT_XFER_NCCL_H
#define HPD_TRANSPORT_XFER_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HPD_NCCL_ID_BYTES 128

typedef struct hpd_nccl hpd_nccl_t;

typedef struct {
    int device;  /* CUDA device of this rank */
    int rank;
    int n_ranks;
    uint8_t id[HPD_NCCL_ID_BYTES]; /* from hpd_nccl_unique_id on one rank, shared out of band */
} hpd_nccl_params_t;

/* A fresh communicator id (ncclGetUniqueId), to share with the other ranks. */
hpd_status_t hpd_nccl_unique_id(uint8_t id[HPD_NCCL_ID_BYTES]);

/* Joins the communicator (blocks until every rank joined) with a stream of
 * its own on params->device. */
hpd_status_t hpd_nccl_create(const hpd_nccl_params_t *params, hpd_nccl_t **nccl_p);

void hpd_nccl_destroy(hpd_nccl_t *nccl);

/* One buffer of a transfer: a send reads it, a receive writes it. */
typedef struct {
    void *buf; /* device memory of the communicator's GPU */
    size_t bytes;
    int peer;
    bool recv; /* false: a send */
} hpd_nccl_op_t;

/* Queues one transfer on the communicator's stream: its sends and receives
 * as one NCCL group (ncclGroupStart / ncclGroupEnd), ordered after
 * everything queued so far on after_stream, a cudaStream_t of the same GPU
 * (the stream of the backend whose ops wrote what is sent, or last used
 * what is received: hpd_backend_stream), through an event the NCCL stream
 * waits on; NULL: no ordering (the caller synchronised). Sends and
 * receives between a pair of ranks must match in order and size. The
 * buffers are busy until hpd_nccl_sync returns. */
hpd_status_t hpd_nccl_transfer(hpd_nccl_t *nccl, const hpd_nccl_op_t *ops, uint32_t n_ops,
                               void *after_stream);

/* Waits for everything queued. */
hpd_status_t hpd_nccl_sync(hpd_nccl_t *nccl);

#endif
