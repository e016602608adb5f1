/* The inclusive sum of one uint32_t per thread over a block of N threads
 * (Hillis-Steele through two shared buffers `scan[2][N]`; every thread of
 * the block must call it): integers, so the order of the adds does not
 * matter. Used by moe.cu's count of the experts' slots and gemm.cu's plan
 * of a grouped GEMM's tiles. Sets *total to the block's sum. */
#ifndef HPD_KERNELS_CUDA_BLOCK_SCAN_H
#define HPD_KERNELS_CUDA_BLOCK_SCAN_H

template <uint32_t N>
__device__ static inline uint32_t hpd_block_scan(uint32_t v, uint32_t (*scan)[N], uint32_t *total)
{
    const uint32_t x = threadIdx.x;
    uint32_t cur = 0;
    scan[0][x] = v;
    __syncthreads();
    for (uint32_t o = 1; o < N; o *= 2) {
        scan[cur ^ 1][x] = scan[cur][x] + (x >= o ? scan[cur][x - o] : 0u);
        cur ^= 1;
        __syncthreads();
    }
    *total = scan[cur][N - 1];
    return scan[cur][x];
}

#endif
