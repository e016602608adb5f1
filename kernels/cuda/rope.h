/* One rotary pair (i, i + half) of a head at position pos, as rope_kernel
 * (elementwise.cu) and the fused norm_rope_kernel (norm.cu) compute it:
 * roundings spelt out, so that nvcc's contraction cannot make the two
 * differ (and no fused multiply-add, as on the CPU). */
#ifndef HPD_KERNELS_CUDA_ROPE_H
#define HPD_KERNELS_CUDA_ROPE_H

__device__ static inline void hpd_rope_pair(float x1, float x2, float pos, float inv_freq,
                                            const hpd_rope_args_t &a, float *lo, float *hi)
{
    const float f = __fmul_rn(pos, inv_freq);
    const bool yarn = a.yarn_factor > 0.0f;
    const float cs = yarn ? __fmul_rn(cosf(f), a.yarn_attention) : cosf(f);
    const float sn = yarn ? __fmul_rn(sinf(f), a.yarn_attention) : sinf(f);
    *lo = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
    *hi = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
}

#endif
