/* What the CUDA backend's op files share that needs no CUDA header of its
 * own (the macros name the runtime's cudaError_t, cudaGetErrorString ...
 * where they are used): included by cuda_ops.h, and by the host stand-in
 * for it (tests/kernels/cuda_host/), so that both keep one definition. */
#ifndef HPD_KERNELS_CUDA_COMMON_H
#define HPD_KERNELS_CUDA_COMMON_H

#include <stddef.h>

extern "C" {
#include "common/log.h"
#include "kernels/backend.h"
}

/* Threads of the row kernels (norms): one fixed reduction tree */
#define HPD_CUDA_ROW_THREADS 256

/* Wraps a CUDA error at the boundary: logged once with what failed. */
#define HPD_CUDA_CHECK(call)                                                           \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            HPD_LOG_ERROR("cuda", "%s failed: %s", #call, cudaGetErrorString(err_));   \
            return err_ == cudaErrorMemoryAllocation ? HPD_ERR_NO_MEMORY : HPD_ERR_INTERNAL; \
        }                                                                              \
    } while (0)

/* A kernel launch's error, then HPD_OK. */
#define HPD_CUDA_LAUNCHED() HPD_CUDA_CHECK(cudaGetLastError())

/* One metadata array of an op: host memory to copy (NULL: room only, its
 * bytes undefined, for an output), its size, and where its device address
 * goes. */
typedef struct {
    const void *host;
    size_t bytes;
    void **dev_p;
} hpd_cuda_meta_t;

#endif
