/* A host stand-in for kernels/cuda/cuda_ops.h: test_gemm_cuda_host compiles
 * kernels/cuda/gemm.cu with a C++ compiler against it (its launches
 * rewritten by launch.cmake), so the CUDA GEMM's kernels run without a GPU:
 * each GPU thread a host thread, the blocks of a launch one after another
 * (so __shared__ may be static), __syncthreads and __syncwarp both a barrier
 * of the whole block (stronger than a warp's: races between warps are not
 * checked here, test_backend_cuda on a GPU checks them). Arithmetic as on
 * the GPU: fmaf exact, no contraction (-ffp-contract=off), round to nearest. */
#ifndef HPD_TESTS_CUDA_HOST_OPS_H
#define HPD_TESTS_CUDA_HOST_OPS_H

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

extern "C" {
#include "common/dtype.h"
#include "common/log.h"
#include "kernels/backend.h"
}

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return uint4{a, b, c, d};
}

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<> *hpd_emu_barrier;

static inline void __syncthreads()
{
    hpd_emu_barrier->arrive_and_wait();
}
static inline void __syncwarp()
{
    hpd_emu_barrier->arrive_and_wait();
}

#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct __half {
    uint16_t bits;
};
static inline __half __ushort_as_half(uint16_t u)
{
    return __half{u};
}
static inline float __half2float(__half h)
{
    return hpd_f16_to_f32(h.bits);
}
template <typename T> static inline T __ldcg(const T *p)
{
    return *p;
}
using std::min;

typedef int cudaStream_t;
typedef int cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS, CUBLAS_OP_N, CUBLAS_OP_T };
template <typename... A> static inline cublasStatus_t cublasSgemm(A...)
{
    return 1; /* cuda-fast is not emulated */
}

typedef struct {
    cudaStream_t stream;
    cublasHandle_t cublas;
} hpd_cuda_ctx_t;

static inline hpd_cuda_ctx_t *hpd_cuda_ctx(hpd_backend_t *b)
{
    return (hpd_cuda_ctx_t *)b->ctx;
}

#define HPD_CUDA_LAUNCHED() \
    do {                     \
    } while (0)

/* kernel<<<grid, block, 0, s>>>(args) becomes
 * hpd_emu_launcher(grid, block, [](auto... as) { kernel(as...); })(args) */
template <typename F> struct hpd_emu_launch_t {
    dim3 grid, block;
    F kernel;
    template <typename... A> void operator()(A... args)
    {
        const unsigned nt = block.x * block.y * block.z;
        std::barrier<> bar(nt);
        std::vector<std::thread> threads;
        gridDim = grid, blockDim = block, hpd_emu_barrier = &bar;
        for (unsigned t = 0; t < nt; t++)
            threads.emplace_back([&, t] {
                threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                for (unsigned bz = 0; bz < grid.z; bz++)
                    for (unsigned by = 0; by < grid.y; by++)
                        for (unsigned bx = 0; bx < grid.x; bx++) {
                            blockIdx = dim3(bx, by, bz);
                            kernel(args...);
                            bar.arrive_and_wait(); /* the block's shared memory is free */
                        }
            });
        for (std::thread &th : threads)
            th.join();
    }
};

template <typename F> static hpd_emu_launch_t<F> hpd_emu_launcher(dim3 grid, dim3 block, F f)
{
    return hpd_emu_launch_t<F>{grid, block, f};
}

hpd_status_t hpd_cuda_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a);

#endif
