/* Rounding fp32 to bf16 on the device, as the CPU backend's
 * hpd_cpu_round_bf16 does (to nearest, ties to even; a NaN stays a quiet
 * NaN): the tensor-core kernels' operands. Plain integer arithmetic, so
 * the host stand-in (tests/kernels/cuda_host/) compiles the same lines. */
#ifndef HPD_KERNELS_CUDA_BF16_H
#define HPD_KERNELS_CUDA_BF16_H

#include <stdint.h>

__device__ static inline uint32_t hpd_bf16_rn(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u; /* NaN, quiet */
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

/* two bf16 in one word, lo in the low half (an mma fragment's pair) */
__device__ static inline uint32_t hpd_bf16x2(float lo, float hi)
{
    return hpd_bf16_rn(lo) | hpd_bf16_rn(hi) << 16;
}

#endif
