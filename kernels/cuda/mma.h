/* One warp-wide tensor-core product: D (16 x 8, fp32) += A (16 x 16, bf16,
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

#endif
