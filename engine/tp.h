/* The ranks of a tensor-parallel engine inside one process (issue 37;
 * docs/tensor_parallel.md): a group that meets at barriers and shares
 * buffers, and one worker thread per rank past rank 0.
 *
 * Every rank runs the same scheduler on the same calls (rank 0's caller
 * makes them, engine.c repeats them on the others), so their batches
 * agree; each forward pass meets the others only where the model's math
 * needs every shard: the embedding rows, each row-parallel product's
 * canonical sum, and the logits. Those meetings go through the group:
 * a rank publishes a pointer to its part and gets every rank's, after a
 * barrier; a second barrier tells it the others are done reading.
 * Today's ranks are CPU ranks whose buffers are host memory, read
 * directly (NCCL across GPUs is not built).
 *
 * A rank whose step fails aborts the group: every barrier then answers
 * HPD_ERR_INTERNAL at once, so no rank waits for one that will not come. */
#ifndef HPD_ENGINE_TP_H
#define HPD_ENGINE_TP_H

#include <stdint.h>

#include "common/status.h"

typedef struct hpd_tp_group hpd_tp_group_t;

/* A group of n ranks (1 to HPD_TP_MAX; else HPD_ERR_INVALID_ARG). */
hpd_status_t hpd_tp_group_create(uint32_t n, hpd_tp_group_t **group_p);
/* Frees a group no rank is inside. Accepts NULL. */
void hpd_tp_group_destroy(hpd_tp_group_t *group);

/* Waits until every rank has arrived. HPD_ERR_INTERNAL once the group is
 * aborted (before or while waiting). */
hpd_status_t hpd_tp_group_barrier(hpd_tp_group_t *group);

/* Aborts the group: every barrier fails until hpd_tp_group_reset. */
void hpd_tp_group_abort(hpd_tp_group_t *group);
/* Makes an aborted group meet again; only while no rank is inside it. */
void hpd_tp_group_reset(hpd_tp_group_t *group);

/* Publishes rank's pointer and, once every rank has published, fills
 * all[0 .. n) with theirs. The caller reads them, then calls
 * hpd_tp_group_barrier before writing into its own part again. */
hpd_status_t hpd_tp_group_share(hpd_tp_group_t *group, uint32_t rank, const void *mine,
                          const void **all);

/* A worker thread that runs one job at a time for a rank. */
typedef struct hpd_tp_worker hpd_tp_worker_t;

hpd_status_t hpd_tp_worker_create(hpd_tp_worker_t **worker_p);
/* Stops and joins the thread. Accepts NULL. */
void hpd_tp_worker_destroy(hpd_tp_worker_t *worker);
/* Starts fn(arg) on the worker (the one before must have been waited for). */
void hpd_tp_worker_post(hpd_tp_worker_t *worker, hpd_status_t (*fn)(void *arg), void *arg);
/* Waits for the posted job and returns its status. */
hpd_status_t hpd_tp_worker_wait(hpd_tp_worker_t *worker);

#endif
