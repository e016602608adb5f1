/* Tensor-core and asynchronous-copy primitives (sm_80 and later), each one
 * PTX instruction; tests/kernels/cuda_host/ has stand-ins with the same
 * semantics.
 *
 * One warp-wide tensor-core product: D (16 x 8, fp32) += A (16 x 16, bf16,
 * row-major) times B (16 x 8, bf16, column-major), mma.sync m16n8k16 (sm_80
 * and later). The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
 * for lane l, g = l / 4, t = l % 4, each 32-bit word two bf16 of adjacent k
 * (the lower k in the low half):
 *   a[0]: row g,     k 2t, 2t+1;   a[1]: row g + 8, k 2t, 2t+1;
 *   a[2]: row g,     k 2t+8, +9;   a[3]: row g + 8, k 2t+8, +9;
 *   b[0]: column g,  k 2t, 2t+1;   b[1]: column g,  k 2t+8, +9;
 *   d[0], d[1]: row g, columns 2t, 2t+1; d[2], d[3]: row g + 8, the same.
 * tests/kernels/cuda_host/ has a stand-in with the same fragments. */
#ifndef HPD_KERNELS_CUDA_MMA_H
#define HPD_KERNELS_CUDA_MMA_H

#include <stdint.h>

__device__ static inline void hpd_mma_bf16_16816(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap(); /* no tensor cores: the caller checks the device first */
#endif
}

/* ldmatrix .x4: four 8x8 matrices of 16-bit elements from shared memory,
 * lane l giving the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte
 * aligned); r[i] of lane l is matrix i's row l / 4, elements 2 (l % 4) and
 * 2 (l % 4) + 1: the mma fragments above. */
__device__ static inline void hpd_ldmatrix_x4(uint32_t r[4], const void *row)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#else
    __trap();
#endif
}

/* ldmatrix .x4 .trans: the same four matrices, each transposed: r[i] of
 * lane l is matrix i's column l / 4, rows 2 (l % 4) (low half) and
 * 2 (l % 4) + 1 (high half): the b fragment of a matrix stored k-major
 * (rows of k, 8 columns of n each). */
__device__ static inline void hpd_ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#else
    __trap();
#endif
}

/* cp.async: 16 bytes from global to shared memory (both 16-byte aligned),
 * of which the first src_bytes are read and the rest zero-filled. The copy
 * lands at some time before the wait for its group. */
__device__ static inline void hpd_cp_async16(void *dst, const void *src, uint32_t src_bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src),
                 "r"(src_bytes)
                 : "memory");
#else
    __trap();
#endif
}

/* Closes the thread's group of copies issued since the last commit. */
__device__ static inline void hpd_cp_async_commit()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/* Waits until at most N of the thread's committed groups are in flight
 * (its own copies only: a barrier makes them visible to the block). */
template <int N> __device__ static inline void hpd_cp_async_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

#endif
