/* HPD_HOST_DEVICE marks header helpers that also compile into CUDA kernels
 * (layout addressing, the counter-based RNG). */
#ifndef HPD_COMMON_HOSTDEV_H
#define HPD_COMMON_HOSTDEV_H

#ifdef __CUDACC__
#define HPD_HOST_DEVICE __host__ __device__
#else
#define HPD_HOST_DEVICE
#endif

#endif
