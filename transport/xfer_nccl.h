/* NCCL send/recv between GPUs: the second data-plane backend, for
 * GPU-to-GPU moves of KV pages and GDN state where NCCL has a path
 * (NVLink, PCIe P2P, IB with GPUDirect). Built whenever CUDA is found. */
#ifndef HPD_TRANSPORT_XFER_NCCL_H
#define HPD_TRANSPORT_XFER_NCCL_H

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

/* Queue a send or a receive of device memory on the communicator's stream;
 * sends and receives between a pair of ranks must match in order and size. */
hpd_status_t hpd_nccl_send(hpd_nccl_t *nccl, const void *dev, size_t bytes, int peer);
hpd_status_t hpd_nccl_recv(hpd_nccl_t *nccl, void *dev, size_t bytes, int peer);

/* Waits for everything queued. */
hpd_status_t hpd_nccl_sync(hpd_nccl_t *nccl);

#endif
