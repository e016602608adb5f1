/* One (token, value head) of the gated delta rule's gates, as
 * gdn_gating_kernel (elementwise.cu) and the fused l2norm_gating_kernel
 * (norm.cu) compute it: g = -exp(A_log) * softplus(a + dt_bias),
 * beta = sigmoid(b). */
#ifndef HPD_KERNELS_CUDA_GATING_H
#define HPD_KERNELS_CUDA_GATING_H

__device__ static inline float hpd_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x)); /* PyTorch's threshold */
}

__device__ static inline void hpd_gdn_gate(const hpd_gdn_gating_args_t &a, uint32_t t, uint32_t h)
{
    const float av = a.a[(size_t)t * a.lda + h], bv = a.b[(size_t)t * a.ldb + h];
    a.g[(size_t)t * a.nv + h] = __fmul_rn(-expf(a.a_log[h]), hpd_softplus(av + a.dt_bias[h]));
    a.beta[(size_t)t * a.nv + h] = 1.0f / (1.0f + expf(-bv));
}

#endif
