/* A host stand-in for kernels/cuda/cuda_ops.h: the cuda_host tests compile
 * kernels/cuda/'s kernels (gemm.cu, gdn.cu, attention.cu and the others
 * named in tests/CMakeLists.txt) with a C++ compiler against
 * it (their launches and `extern __shared__` arrays rewritten by
 * launch.cmake), so the CUDA kernels run without a GPU. The blocks of a
 * launch run one after another (so __shared__ may be static), the threads
 * of a block as fibers on the launching host thread, each until
 * it waits at a barrier: __syncthreads and __syncwarp wait for the whole
 * block, a warp shuffle for its warp's 32 lanes (exchanging values through
 * an array; a full mask is required). A barrier that can never open (a
 * __syncthreads or shuffle in divergent code) stops the test with a
 * message. The threads run in a fixed order and __syncwarp waits for the
 * whole block, so races between warps are not caught here: test_backend_cuda
 * on a GPU checks them. Dynamic shared memory, metadata staged by
 * hpd_cuda_stage with room only and the work buffer of hpd_cuda_work are
 * filled with NaN (all bits set) before each block / call, so a read of
 * what the kernel did not write shows up. Arithmetic as on the GPU: fmaf
 * exact, no contraction (-ffp-contract=off), round to nearest; expf is the
 * host's, not the GPU's (the tests compare with the CPU within a tolerance,
 * and runs of the same kernels with each other bit for bit). */
#ifndef HPD_TESTS_CUDA_HOST_OPS_H
#define HPD_TESTS_CUDA_HOST_OPS_H

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

extern "C" {
#include "common/dtype.h"
#include "common/log.h"
#include "kernels/backend.h"
}

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y)
{
    return float2{x, y};
}
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return uint4{a, b, c, d};
}

/* A fiber's saved context, made to start at entry on a stack of its own,
 * and the switch from one to another. On x86-64 the switch is the SysV
 * callee-saved registers pushed and the stack pointer swapped (glibc's
 * swapcontext makes a system call each time, which dominated the tests'
 * time; this switch does not keep a CET shadow stack, which Linux leaves
 * off unless asked); elsewhere ucontext. One launch runs at a time. */
#if defined(__x86_64__)
typedef struct {
    void *sp;
} hpd_emu_uctx_t;

extern "C" void hpd_emu_switch(void **save_sp, void *sp);
/* weak: every file that includes this header defines it, the link keeps one */
asm(".pushsection .text\n"
    ".weak hpd_emu_switch\n"
    ".type hpd_emu_switch, @function\n"
    "hpd_emu_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size hpd_emu_switch, .-hpd_emu_switch\n"
    ".popsection\n");

static inline void hpd_emu_uctx_make(hpd_emu_uctx_t *c, char *stack, size_t bytes,
                                     void (*entry)())
{
    void **sp = (void **)((uintptr_t)(stack + bytes) & ~(uintptr_t)15);
    *--sp = nullptr;                         /* entry's return address: it never returns */
    *--sp = reinterpret_cast<void *>(entry); /* where the first switch returns to */
    for (int i = 0; i < 6; i++)
        *--sp = nullptr; /* rbp, rbx, r12 to r15 */
    c->sp = sp;
}
static inline void hpd_emu_uctx_swap(hpd_emu_uctx_t *from, hpd_emu_uctx_t *to)
{
    hpd_emu_switch(&from->sp, to->sp);
}
#else
#include <ucontext.h>

typedef struct {
    ucontext_t uc;
} hpd_emu_uctx_t;

static inline void hpd_emu_uctx_make(hpd_emu_uctx_t *c, char *stack, size_t bytes,
                                     void (*entry)())
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
static inline void hpd_emu_uctx_swap(hpd_emu_uctx_t *from, hpd_emu_uctx_t *to)
{
    swapcontext(&from->uc, &to->uc);
}
#endif

/* The block being run: its threads as fibers on the launching host thread,
 * fiber `cur` running. */
enum { HPD_EMU_RUN, HPD_EMU_AT_BLOCK, HPD_EMU_AT_WARP, HPD_EMU_DONE };
/* a cp.async copy issued and not yet landed: its bytes as read at issue
 * (global memory does not change under a kernel here) */
struct hpd_emu_copy_t {
    void *dst;
    uint8_t bytes[16];
};
struct hpd_emu_fiber_t {
    hpd_emu_uctx_t ctx;
    int state;
    /* the thread's cp.async copies in flight, and where each committed
     * group ends among them */
    std::vector<hpd_emu_copy_t> copies;
    std::vector<size_t> groups;
};
struct hpd_emu_block_t {
    hpd_emu_uctx_t sched;
    std::vector<hpd_emu_fiber_t> fibers;
    unsigned nt, cur;
    void (*body)(void *);
    void *arg;
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;
inline hpd_emu_block_t *hpd_emu_blk;
inline uint64_t hpd_emu_xchg[1024]; /* a shuffle's values, by thread */
inline void *hpd_emu_smem;          /* the launch's dynamic shared memory */

/* The running thread waits at a barrier: back to the scheduler. */
static inline void hpd_emu_wait(int at)
{
    hpd_emu_fiber_t *f = &hpd_emu_blk->fibers[hpd_emu_blk->cur];
    f->state = at;
    hpd_emu_uctx_swap(&f->ctx, &hpd_emu_blk->sched);
}

static inline void __syncthreads()
{
    hpd_emu_wait(HPD_EMU_AT_BLOCK);
}
static inline void __syncwarp()
{
    hpd_emu_wait(HPD_EMU_AT_BLOCK);
}

/* Every lane writes its value, waits for its warp, then reads lane src's
 * (its own past the block's last thread, as a partial warp has none). */
template <typename T> static inline T hpd_emu_exchange(unsigned mask, T v, unsigned src)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value wider than 8 bytes");
    if (mask != 0xffffffffu) {
        fprintf(stderr, "cuda_host: shuffle with mask %#x: only full warps are emulated\n",
                mask);
        abort();
    }
    const unsigned tid = hpd_emu_blk->cur, w0 = tid / 32 * 32;
    memcpy(&hpd_emu_xchg[tid], &v, sizeof(T));
    hpd_emu_wait(HPD_EMU_AT_WARP);
    T r = v;
    if (w0 + src < hpd_emu_blk->nt)
        memcpy(&r, &hpd_emu_xchg[w0 + src], sizeof(T));
    hpd_emu_wait(HPD_EMU_AT_WARP); /* the values are rewritten by the next shuffle */
    return r;
}
static inline unsigned hpd_emu_lane()
{
    return hpd_emu_blk->cur % 32;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return hpd_emu_exchange(mask, v, (hpd_emu_lane() & ~(width - 1)) + (unsigned)src % width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const unsigned lane = hpd_emu_lane(), seg = lane & ~(width - 1);
    return hpd_emu_exchange(mask, v, lane - seg + delta < (unsigned)width ? lane + delta : lane);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    (void)width;
    return hpd_emu_exchange(mask, v, hpd_emu_lane() ^ (unsigned)lane_mask);
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
static inline float4 make_float4(float x, float y, float z, float w)
{
    return float4{x, y, z, w};
}
static inline uint64_t __umul64hi(uint64_t a, uint64_t b)
{
    return (uint64_t)((unsigned __int128)a * b >> 64);
}
static inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* the fibers of a block run one at a time: an add is atomic */
static inline uint32_t atomicAdd(uint32_t *p, uint32_t v)
{
    const uint32_t old = *p;
    *p = old + v;
    return old;
}
static inline uint32_t atomicOr(uint32_t *p, uint32_t v)
{
    const uint32_t old = *p;
    *p = old | v;
    return old;
}
static inline uint32_t __popc(uint32_t v)
{
    return (uint32_t)__builtin_popcount(v);
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
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
/* launches run to completion when made: copies are plain, streams idle */
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDefault = 4 };
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind,
                                          cudaStream_t)
{
    memcpy(dst, src, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t)
{
    memset(dst, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t)
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
    int cc_major;
    bool tc_ok;
    bool gr_ok;
    bool gr_deep_ok;
    bool wide_ok;
    uint32_t n_sms, gemm_bn, gdn_bufs;
    cublasHandle_t cublas;
    /* the staging ring: an op's metadata stays valid for the next 7 ops'
     * staging, as in the real ring of HPD_CUDA_STAGE_SLOTS slots */
    void *stage[8], *work;
    size_t stage_bytes[8];
    uint32_t slot;
    size_t work_bytes;
} hpd_cuda_ctx_t;

/* A context as on an H100 (227 KiB of shared memory per block). */
static inline hpd_cuda_ctx_t hpd_emu_ctx()
{
    hpd_cuda_ctx_t c = {};
    c.smem_optin = 227 * 1024;
    c.cc_major = 9;
    c.wide_ok = true;
    c.n_sms = 132;
    return c;
}

static inline void hpd_emu_ctx_free(hpd_cuda_ctx_t *c)
{
    for (void *&st : c->stage)
        free(st), st = nullptr;
    free(c->work);
    c->work = nullptr, c->work_bytes = 0;
}

static inline hpd_cuda_ctx_t *hpd_cuda_ctx(hpd_backend_t *b)
{
    return (hpd_cuda_ctx_t *)b->ctx;
}

#include "kernels/cuda/cuda_common.h" /* the real one: CHECK, LAUNCHED, meta */

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
    /* the slot's earlier contents are overwritten with NaN first, so that an
     * op reading metadata staged 8 stagings ago reads garbage, as it would
     * on the GPU */
    c->slot = (c->slot + 1) % 8;
    if (c->stage[c->slot] != nullptr)
        memset(c->stage[c->slot], 0xff, c->stage_bytes[c->slot]);
    free(c->stage[c->slot]);
    c->stage_bytes[c->slot] = total ? total : 256;
    if ((c->stage[c->slot] = aligned_alloc(256, c->stage_bytes[c->slot])) == nullptr)
        return HPD_ERR_NO_MEMORY;
    char *d = (char *)c->stage[c->slot];
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

#include "kernels/cuda/stage_seqs.h" /* the real one, over the stand-in's staging */

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

static inline void hpd_emu_fiber_main()
{
    hpd_emu_blk->body(hpd_emu_blk->arg);
    hpd_emu_wait(HPD_EMU_DONE); /* never resumed */
    abort();
}

/* Runs one block: every runnable thread in turn until it waits or ends,
 * then opens the barriers all of whose threads wait (__syncthreads: the
 * block's; a shuffle: the warp's), until every thread has ended. A barrier
 * that cannot open (threads at different barriers, or some ended while
 * others wait) stops the test: on the GPU it hangs or is undefined. */
static inline void hpd_emu_run_block(hpd_emu_block_t *b, char *stacks, size_t stack_bytes)
{
    const unsigned nt = b->nt;
    for (unsigned t = 0; t < nt; t++) {
        hpd_emu_uctx_make(&b->fibers[t].ctx, stacks + t * stack_bytes, stack_bytes,
                          hpd_emu_fiber_main);
        b->fibers[t].state = HPD_EMU_RUN;
        b->fibers[t].copies.clear();
        b->fibers[t].groups.clear();
    }
    for (;;) {
        for (unsigned t = 0; t < nt; t++)
            if (b->fibers[t].state == HPD_EMU_RUN) {
                b->cur = t;
                threadIdx = dim3(t % blockDim.x, t / blockDim.x % blockDim.y,
                                 t / (blockDim.x * blockDim.y));
                hpd_emu_uctx_swap(&b->sched, &b->fibers[t].ctx);
            }
        unsigned done = 0, at_block = 0, opened = 0;
        for (const hpd_emu_fiber_t &f : b->fibers)
            done += f.state == HPD_EMU_DONE, at_block += f.state == HPD_EMU_AT_BLOCK;
        if (done == nt)
            return;
        if (at_block == nt)
            for (hpd_emu_fiber_t &f : b->fibers)
                f.state = HPD_EMU_RUN, opened++;
        for (unsigned w0 = 0; w0 < nt && opened == 0; w0 += 32) {
            unsigned n = 0;
            for (unsigned t = w0; t < std::min(nt, w0 + 32); t++)
                n += b->fibers[t].state == HPD_EMU_AT_WARP;
            if (n == std::min(nt, w0 + 32) - w0) {
                for (unsigned t = w0; t < w0 + n; t++)
                    b->fibers[t].state = HPD_EMU_RUN;
                opened += n;
            }
        }
        if (opened == 0) {
            fprintf(stderr, "cuda_host: block (%u, %u, %u) of %u threads cannot go on: %u wait "
                    "at __syncthreads, %u at warp shuffles (not all of their warp), %u have "
                    "ended\n", blockIdx.x, blockIdx.y, blockIdx.z, nt, at_block,
                    nt - at_block - done, done);
            abort();
        }
    }
}

/* kernel<<<grid, block, smem, stream>>>(args) becomes
 * hpd_emu_launcher(grid, block, smem, stream, [](auto... as) { kernel(as...); })(args):
 * the blocks one after another, each block's threads as fibers. */
template <typename F> struct hpd_emu_launch_t {
    dim3 grid, block;
    size_t smem;
    F kernel;
    template <typename... A> void operator()(A... args)
    {
        static const size_t stack_bytes = 256 << 10;
        auto body = [&]() { kernel(args...); };
        hpd_emu_block_t b;
        b.nt = block.x * block.y * block.z;
        b.fibers.resize(b.nt);
        b.body = [](void *p) { (*(decltype(body) *)p)(); };
        b.arg = &body;
        if (b.nt == 0 || b.nt > 1024) {
            fprintf(stderr, "cuda_host: a launch of %u threads per block\n", b.nt);
            abort();
        }
        void *stacks = mmap(nullptr, b.nt * stack_bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (stacks == MAP_FAILED) {
            fprintf(stderr, "cuda_host: no memory for %u stacks\n", b.nt);
            abort();
        }
        /* exactly the launch's bytes (rounded up to 16): a kernel that
         * indexes past them is caught by the ASan build */
        std::vector<float4> dyn(std::max<size_t>(1, (smem + sizeof(float4) - 1) / sizeof(float4)));
        gridDim = grid, blockDim = block, hpd_emu_smem = dyn.data(), hpd_emu_blk = &b;
        for (unsigned bz = 0; bz < grid.z; bz++)
            for (unsigned by = 0; by < grid.y; by++)
                for (unsigned bx = 0; bx < grid.x; bx++) {
                    blockIdx = dim3(bx, by, bz);
                    memset(dyn.data(), 0xff, dyn.size() * sizeof(float4));
                    hpd_emu_run_block(&b, (char *)stacks, stack_bytes);
                }
        hpd_emu_blk = nullptr;
        munmap(stacks, b.nt * stack_bytes);
    }
};

template <typename F>
static hpd_emu_launch_t<F> hpd_emu_launcher(dim3 grid, dim3 block, size_t smem, cudaStream_t,
                                            F f)
{
    return hpd_emu_launch_t<F>{grid, block, smem, f};
}

hpd_status_t hpd_cuda_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cuda_gemm_tc(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cuda_gemm_cublas(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cuda_gemm_bf16(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cuda_gemm_grouped(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a);
hpd_status_t hpd_cuda_gemm_grouped_bf16(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a);
hpd_status_t hpd_cuda_moe_route(hpd_backend_t *b, const hpd_moe_route_args_t *a);
hpd_status_t hpd_cuda_gather(hpd_backend_t *b, const hpd_gather_args_t *a);
hpd_status_t hpd_cuda_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a);
hpd_status_t hpd_cuda_tp_sum(hpd_backend_t *b, const hpd_tp_sum_args_t *a);
struct cudaFuncAttributes {
    int ptxVersion, binaryVersion;
};
template <typename F> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F)
{
    a->ptxVersion = a->binaryVersion = 90; /* as on an H100 */
    return cudaSuccess;
}
hpd_status_t hpd_cuda_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_gdn_chunked_bf16(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a);
hpd_status_t hpd_cuda_attention(hpd_backend_t *b, const hpd_attention_args_t *a);
hpd_status_t hpd_cuda_attention_bf16(hpd_backend_t *b, const hpd_attention_args_t *a);
hpd_status_t hpd_cuda_sample(hpd_backend_t *b, const hpd_sample_args_t *a);
hpd_status_t hpd_cuda_rmsnorm(hpd_backend_t *b, const hpd_rmsnorm_args_t *a);
hpd_status_t hpd_cuda_gated_rmsnorm(hpd_backend_t *b, const hpd_gated_rmsnorm_args_t *a);
hpd_status_t hpd_cuda_embed(hpd_backend_t *b, const hpd_embed_args_t *a);
hpd_status_t hpd_cuda_silu_mul(hpd_backend_t *b, const hpd_silu_mul_args_t *a);
hpd_status_t hpd_cuda_sigmoid_mul(hpd_backend_t *b, const hpd_sigmoid_mul_args_t *a);
hpd_status_t hpd_cuda_rope(hpd_backend_t *b, const hpd_rope_args_t *a);
hpd_status_t hpd_cuda_norm_rope(hpd_backend_t *b, const hpd_norm_rope_args_t *a);
hpd_status_t hpd_cuda_l2norm_gating(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a);
hpd_status_t hpd_cuda_l2norm(hpd_backend_t *b, const hpd_l2norm_args_t *a);
hpd_status_t hpd_cuda_gdn_gating(hpd_backend_t *b, const hpd_gdn_gating_args_t *a);
hpd_status_t hpd_cuda_hash_pieces(hpd_backend_t *b, const hpd_hash_pieces_args_t *a);
hpd_status_t hpd_cuda_kv_translate(hpd_backend_t *b, const hpd_kv_translate_args_t *a);
hpd_status_t hpd_cuda_slot_copy(hpd_backend_t *b, const hpd_slot_copy_args_t *a);
hpd_status_t hpd_cuda_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a);

#endif
