/* A host stand-in for kernels/cuda/cuda_ops.h: the cuda_host tests compile
 * kernels/cuda/gemm.cu, gdn.cu and attention.cu with a C++ compiler against
 * it (their launches and `extern __shared__` arrays rewritten by
 * launch.cmake), so the CUDA kernels run without a GPU: each GPU thread a
 * host thread, the blocks of a launch one after another (so __shared__ may
 * be static), __syncthreads a barrier of the whole block. __syncwarp is a
 * barrier of the whole block too, and the warp shuffles a barrier of the
 * warp's 32 lanes around an exchange array (every lane of the warp must
 * take part: a full mask is required). Races between warps are not checked
 * here (a barrier stronger than the GPU's hides them, and host threads
 * interleave differently): test_backend_cuda on a GPU checks them.
 * Dynamic shared memory, metadata staged by hpd_cuda_stage with room only
 * and the work buffer of hpd_cuda_work are filled with NaN (all bits set)
 * before each block / call, so a read of what the kernel did not write
 * shows up. Arithmetic as on the GPU: fmaf exact, no contraction
 * (-ffp-contract=off), round to nearest; expf is the host's, not the GPU's
 * (the tests compare with the CPU within a tolerance, and bit identities
 * between runs of the same kernels). */
#ifndef HPD_TESTS_CUDA_HOST_OPS_H
#define HPD_TESTS_CUDA_HOST_OPS_H

#include <algorithm>
#include <barrier>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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

/* One warp's exchange for the shuffles: a barrier of its lanes. */
struct hpd_emu_warp_t {
    std::barrier<> bar;
    uint64_t xchg[32];
    explicit hpd_emu_warp_t(ptrdiff_t lanes) : bar(lanes) {}
};

inline thread_local dim3 threadIdx, blockIdx;
inline thread_local hpd_emu_warp_t *hpd_emu_warp;
inline thread_local unsigned hpd_emu_lane, hpd_emu_lanes;
inline dim3 blockDim, gridDim;
inline std::barrier<> *hpd_emu_barrier;
inline void *hpd_emu_smem; /* the launch's dynamic shared memory */

static inline void __syncthreads()
{
    hpd_emu_barrier->arrive_and_wait();
}
static inline void __syncwarp()
{
    hpd_emu_barrier->arrive_and_wait();
}

/* Every lane writes its value, then reads lane src's (its own past the
 * warp's last lane, as a partial warp has none there). */
template <typename T> static inline T hpd_emu_exchange(unsigned mask, T v, unsigned src)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value wider than 8 bytes");
    if (mask != 0xffffffffu) {
        fprintf(stderr, "cuda_host: shuffle with mask %#x: only full warps are emulated\n",
                mask);
        abort();
    }
    hpd_emu_warp_t *w = hpd_emu_warp;
    memcpy(&w->xchg[hpd_emu_lane], &v, sizeof(T));
    w->bar.arrive_and_wait();
    T r = v;
    if (src < hpd_emu_lanes)
        memcpy(&r, &w->xchg[src], sizeof(T));
    w->bar.arrive_and_wait(); /* xchg is rewritten by the next shuffle */
    return r;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return hpd_emu_exchange(mask, v, (hpd_emu_lane & ~(width - 1)) + (unsigned)src % width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const unsigned seg = hpd_emu_lane & ~(width - 1);
    return hpd_emu_exchange(mask, v,
                            hpd_emu_lane - seg + delta < (unsigned)width ? hpd_emu_lane + delta
                                                                         : hpd_emu_lane);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    (void)width;
    return hpd_emu_exchange(mask, v, hpd_emu_lane ^ (unsigned)lane_mask);
}

#define __global__ static /* kernels internal: the real ones may link beside */
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
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
/* CUDA's min and max take mixed integer types (min(int, unsigned) is
 * unsigned) */
template <typename A, typename B> static inline std::common_type_t<A, B> min(A a, B b)
{
    using T = std::common_type_t<A, B>;
    return (T)b < (T)a ? (T)b : (T)a;
}
template <typename A, typename B> static inline std::common_type_t<A, B> max(A a, B b)
{
    using T = std::common_type_t<A, B>;
    return (T)a < (T)b ? (T)b : (T)a;
}

typedef int cudaStream_t;
typedef int cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS, CUBLAS_OP_N, CUBLAS_OP_T };
template <typename... A> static inline cublasStatus_t cublasSgemm(A...)
{
    return 1; /* cuda-fast is not emulated */
}

typedef enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 } cudaError_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
static inline cudaError_t cudaGetLastError()
{
    return cudaSuccess; /* a failed launch aborts the test instead */
}
static inline const char *cudaGetErrorString(cudaError_t err)
{
    return err == cudaSuccess ? "no error" : "out of memory";
}
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int)
{
    return cudaSuccess;
}

/* The fields of the real context the kernels' host code reads, and the
 * host buffers standing in for the staging ring and the work buffer (freed
 * by hpd_emu_ctx_free). */
typedef struct {
    int device;
    cudaStream_t stream;
    size_t smem_optin;
    cublasHandle_t cublas;
    void *stage, *work;
    size_t work_bytes;
} hpd_cuda_ctx_t;

/* A context as on an H100 (227 KiB of shared memory per block). */
static inline hpd_cuda_ctx_t hpd_emu_ctx()
{
    hpd_cuda_ctx_t c = {};
    c.smem_optin = 227 * 1024;
    return c;
}

static inline void hpd_emu_ctx_free(hpd_cuda_ctx_t *c)
{
    free(c->stage), free(c->work);
    c->stage = c->work = nullptr, c->work_bytes = 0;
}

static inline hpd_cuda_ctx_t *hpd_cuda_ctx(hpd_backend_t *b)
{
    return (hpd_cuda_ctx_t *)b->ctx;
}

#define HPD_CUDA_CHECK(call)                                                           \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            HPD_LOG_ERROR("cuda", "%s failed: %s", #call, cudaGetErrorString(err_));   \
            return err_ == cudaErrorMemoryAllocation ? HPD_ERR_NO_MEMORY : HPD_ERR_INTERNAL; \
        }                                                                              \
    } while (0)

#define HPD_CUDA_LAUNCHED() HPD_CUDA_CHECK(cudaGetLastError())

typedef struct {
    const void *host;
    size_t bytes;
    void **dev_p;
} hpd_cuda_meta_t;

/* The staging and work buffers are host memory here; static, so that they
 * do not collide with the real ones (cuda_backend.cu) where the test links
 * the CUDA backend too. */

/* An op's metadata arrays copied into one buffer, each at a 256-byte
 * aligned offset, valid until the next call (the kernels ran before it);
 * room-only arrays filled with NaN. */
static inline hpd_status_t hpd_cuda_stage(hpd_backend_t *b, const hpd_cuda_meta_t *arrays,
                                          uint32_t n)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += (arrays[i].bytes + 255) & ~(size_t)255;
    free(c->stage);
    if ((c->stage = aligned_alloc(256, total ? total : 256)) == nullptr)
        return HPD_ERR_NO_MEMORY;
    char *d = (char *)c->stage;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (arrays[i].host != nullptr && arrays[i].bytes > 0)
            memcpy(d + off, arrays[i].host, arrays[i].bytes);
        else
            memset(d + off, 0xff, arrays[i].bytes);
        *arrays[i].dev_p = d + off;
        off += (arrays[i].bytes + 255) & ~(size_t)255;
    }
    return HPD_OK;
}

static inline hpd_status_t hpd_cuda_stage_seqs(hpd_backend_t *b, const hpd_seq_t *seqs,
                                               float *const *states, uint32_t n_seqs,
                                               const hpd_seq_t **dseqs_p,
                                               float *const **dstates_p)
{
    void *ds, *dst;
    const hpd_cuda_meta_t m[] = {
        {.host = seqs, .bytes = n_seqs * sizeof(hpd_seq_t), .dev_p = &ds},
        {.host = states, .bytes = n_seqs * sizeof(float *), .dev_p = &dst}};
    const hpd_status_t st = hpd_cuda_stage(b, m, 2);
    if (st != HPD_OK)
        return st;
    *dseqs_p = (const hpd_seq_t *)ds;
    *dstates_p = (float *const *)dst;
    return HPD_OK;
}

/* A growing host buffer, filled with NaN on every call: an op must write
 * what it reads of it. */
static inline hpd_status_t hpd_cuda_work(hpd_backend_t *b, size_t bytes, void **dev_p)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    if (bytes > c->work_bytes) {
        free(c->work);
        c->work_bytes = 0;
        if ((c->work = aligned_alloc(256, (bytes + 255) & ~(size_t)255)) == nullptr)
            return HPD_ERR_NO_MEMORY;
        c->work_bytes = bytes;
    }
    memset(c->work, 0xff, bytes);
    *dev_p = c->work;
    return HPD_OK;
}

/* kernel<<<grid, block, smem, stream>>>(args) becomes
 * hpd_emu_launcher(grid, block, smem, stream, [](auto... as) { kernel(as...); })(args):
 * one host thread per thread of a block, which run the blocks in turn. */
template <typename F> struct hpd_emu_launch_t {
    dim3 grid, block;
    size_t smem;
    F kernel;
    template <typename... A> void operator()(A... args)
    {
        const unsigned nt = block.x * block.y * block.z;
        std::vector<std::unique_ptr<hpd_emu_warp_t>> warps;
        for (unsigned w = 0; w * 32 < nt; w++)
            warps.emplace_back(new hpd_emu_warp_t(std::min(32u, nt - w * 32)));
        std::vector<float4> dyn(smem / sizeof(float4) + 1);
        auto poison = [&]() noexcept { memset(dyn.data(), 0xff, dyn.size() * sizeof(float4)); };
        poison();
        std::barrier<> bar(nt);
        std::barrier<decltype(poison)> block_end(nt, poison);
        std::vector<std::thread> threads;
        gridDim = grid, blockDim = block, hpd_emu_barrier = &bar, hpd_emu_smem = dyn.data();
        for (unsigned t = 0; t < nt; t++)
            threads.emplace_back([&, t] {
                threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                hpd_emu_warp = warps[t / 32].get();
                hpd_emu_lane = t % 32, hpd_emu_lanes = std::min(32u, nt - t / 32 * 32);
                for (unsigned bz = 0; bz < grid.z; bz++)
                    for (unsigned by = 0; by < grid.y; by++)
                        for (unsigned bx = 0; bx < grid.x; bx++) {
                            blockIdx = dim3(bx, by, bz);
                            kernel(args...);
                            /* the block's shared memory is free: poisoned
                             * for the next */
                            block_end.arrive_and_wait();
                        }
            });
        for (std::thread &th : threads)
            th.join();
    }
};

template <typename F>
static hpd_emu_launch_t<F> hpd_emu_launcher(dim3 grid, dim3 block, size_t smem, cudaStream_t,
                                            F f)
{
    return hpd_emu_launch_t<F>{grid, block, smem, f};
}

hpd_status_t hpd_cuda_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cuda_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a);
hpd_status_t hpd_cuda_attention(hpd_backend_t *b, const hpd_attention_args_t *a);

#endif
