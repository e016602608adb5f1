/* The CUDA backend: device memory on one GPU, one stream, the ops of
 * kernels/cuda/. Memory comes from the device's stream-ordered pool
 * (cudaMallocAsync), released to it on free; pool memory that peers write
 * over RDMA (alloc_pool) from cudaMalloc. Three variants: "cuda" (the
 * deterministic kernels), "cuda-bf16" (deterministic, BF16 weights on tensor
 * cores) and "cuda-fast" (GEMMs through cuBLAS). */
#include <cuda.h> /* types of the driver call reached through the runtime */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"

static void cuda_destroy(hpd_backend_t *b)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    if (c != NULL) {
        cudaSetDevice(c->device);
        cudaStreamSynchronize(c->stream);
        if (c->scratch != NULL)
            cudaFree(c->scratch);
        if (c->host_stage != NULL)
            cudaFreeHost(c->host_stage);
        for (int i = 0; i < HPD_CUDA_STAGE_SLOTS; i++)
            if (c->stage_ev[i] != NULL)
                cudaEventDestroy(c->stage_ev[i]);
        if (c->work != NULL)
            cudaFree(c->work);
        if (c->arena_dev != NULL)
            cudaFree(c->arena_dev);
        if (c->arena_host != NULL)
            cudaFreeHost(c->arena_host);
        if (c->step_done != NULL)
            cudaEventDestroy(c->step_done);
        for (auto &g : c->graph)
            if (g.exec != NULL)
                cudaGraphExecDestroy(g.exec);
        if (c->cublas != NULL)
            cublasDestroy(c->cublas);
        for (uint32_t i = 0; i < c->n_pinned; i++)
            cudaHostUnregister(c->pinned[i]);
        free(c->pinned);
        cudaGetLastError(); /* what a failed unpin left (memory freed already) */
        cudaStreamDestroy(c->stream);
        free(c);
    }
    free(b);
}

static hpd_status_t cuda_sync(hpd_backend_t *b)
{
    HPD_CUDA_CHECK(cudaSetDevice(hpd_cuda_ctx(b)->device));
    HPD_CUDA_CHECK(cudaStreamSynchronize(hpd_cuda_ctx(b)->stream));
    return HPD_OK;
}

static void *cuda_stream(hpd_backend_t *b)
{
    return hpd_cuda_ctx(b)->stream;
}

/* A fence: an event recorded on the stream after the ops enqueued so far
 * (timing off: a query costs no more than the event needs). */
static hpd_status_t cuda_fence_record(hpd_backend_t *b, void **fence_p)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    cudaEvent_t ev;
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    HPD_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(ev, c->stream);
    if (err != cudaSuccess) {
        HPD_LOG_ERROR("cuda", "cudaEventRecord failed: %s", cudaGetErrorString(err));
        cudaEventDestroy(ev);
        return HPD_ERR_INTERNAL;
    }
    *fence_p = ev;
    return HPD_OK;
}

static int cuda_fence_query(hpd_backend_t *b, void *fence)
{
    cudaSetDevice(hpd_cuda_ctx(b)->device);
    const cudaError_t err = cudaEventQuery((cudaEvent_t)fence);
    if (err == cudaSuccess)
        return 1;
    if (err == cudaErrorNotReady)
        return 0;
    HPD_LOG_ERROR("cuda", "the work before a fence failed: %s", cudaGetErrorString(err));
    return -1;
}

static void cuda_fence_release(hpd_backend_t *b, void *fence)
{
    cudaSetDevice(hpd_cuda_ctx(b)->device);
    cudaEventDestroy((cudaEvent_t)fence);
}

/* Pins host memory and maps it into the device's address space (unified
 * addressing: kernels then use the host pointer itself). Memory pinned
 * already (UCX pins the buffers it allocates when it has CUDA support) is
 * used as it is: CUDA answers cudaErrorHostMemoryAlreadyRegistered, which
 * is no failure here, and unpinning it stays with whoever pinned it. */
static hpd_status_t cuda_host_register(hpd_backend_t *b, void *ptr, size_t bytes)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    if (c->n_pinned == c->cap_pinned) {
        const uint32_t cap = c->cap_pinned ? 2 * c->cap_pinned : 8;
        void **p = (void **)realloc(c->pinned, cap * sizeof(*p));
        if (p == NULL)
            return HPD_ERR_NO_MEMORY;
        c->pinned = p;
        c->cap_pinned = cap;
    }
    const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterMapped);
    if (err == cudaErrorHostMemoryAlreadyRegistered) {
        cudaGetLastError(); /* cleared, or the next launch check would report it */
        /* pinned by this backend before: one more user, unpinned with the last */
        for (uint32_t i = 0; i < c->n_pinned; i++)
            if (c->pinned[i] == ptr) {
                c->pinned[c->n_pinned++] = ptr;
                return HPD_OK;
            }
        /* pinned by someone else (UCX pins the buffers it allocates): the
         * whole range must be, not only its start */
        cudaPointerAttributes last;
        if (bytes > 0 &&
            (cudaPointerGetAttributes(&last, (const char *)ptr + bytes - 1) != cudaSuccess ||
             last.type != cudaMemoryTypeHost)) {
            cudaGetLastError();
            HPD_LOG_ERROR("cuda", "host memory at %p (%zu bytes) is only partly pinned already: "
                          "its last byte is not (expected a range pinned whole, or not at all)",
                          ptr, bytes);
            return HPD_ERR_INVALID_ARG;
        }
        HPD_LOG_INFO("cuda", "host memory at %p (%zu bytes) is pinned already by another user "
                     "(e.g. UCX): used as it is, left pinned at unregister", ptr, bytes);
        return HPD_OK;
    }
    if (err != cudaSuccess) {
        HPD_LOG_ERROR("cuda", "pinning %zu bytes of host memory at %p for GPU %d failed: %s",
                      bytes, ptr, c->device, cudaGetErrorString(err));
        return err == cudaErrorMemoryAllocation ? HPD_ERR_NO_MEMORY : HPD_ERR_INTERNAL;
    }
    c->pinned[c->n_pinned++] = ptr;
    return HPD_OK;
}

/* Unpins memory that cuda_host_register pinned, when its last user lets it
 * go; memory it found pinned by someone else is left as it is. */
static void cuda_host_unregister(hpd_backend_t *b, void *ptr)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    for (uint32_t i = 0; i < c->n_pinned; i++)
        if (c->pinned[i] == ptr) {
            c->pinned[i] = c->pinned[--c->n_pinned];
            for (uint32_t j = 0; j < c->n_pinned; j++)
                if (c->pinned[j] == ptr)
                    return; /* another user of this backend still has it */
            cudaSetDevice(c->device);
            if (cudaHostUnregister(ptr) != cudaSuccess)
                HPD_LOG_WARN("cuda", "unpinning host memory at %p failed: %s", ptr,
                             cudaGetErrorString(cudaGetLastError()));
            return;
        }
}

static hpd_status_t cuda_alloc(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, bytes ? (bytes + 255) & ~(size_t)255 : 256, c->stream);
    if (err != cudaSuccess) {
        HPD_LOG_ERROR("cuda", "allocation of %zu bytes on GPU %d failed: %s", bytes, c->device,
                      cudaGetErrorString(err));
        return HPD_ERR_NO_MEMORY;
    }
    /* callers may touch it from another stream (UCX, NCCL): settle it */
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    *ptr_p = p;
    return HPD_OK;
}

static void cuda_free(hpd_backend_t *b, void *ptr)
{
    cudaSetDevice(hpd_cuda_ctx(b)->device);
    cudaFreeAsync(ptr, hpd_cuda_ctx(b)->stream);
}

/* Sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on an allocation, as NVIDIA advises
 * for GPUDirect RDMA buffers (synchronous copies to it are then ordered
 * with a NIC's writes). The driver call is reached through the runtime, so
 * the build links no libcuda. Without it the memory still works: a failure
 * is a warning. */
static void set_sync_memops(hpd_cuda_ctx_t *c, void *p)
{
    typedef CUresult (*set_attr_fn)(const void *, CUpointer_attribute, CUdeviceptr);
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuPointerSetAttribute", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == NULL) {
        HPD_LOG_WARN("cuda", "GPU %d: the driver's cuPointerSetAttribute cannot be found (%s): "
                     "pool memory without SYNC_MEMOPS", c->device,
                     cudaGetErrorString(cudaGetLastError()));
        return;
    }
    const unsigned int one = 1;
    const CUresult r = ((set_attr_fn)fn)(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                          (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS)
        HPD_LOG_WARN("cuda", "GPU %d: setting SYNC_MEMOPS on pool memory at %p failed: "
                     "CUresult %d", c->device, p, (int)r);
}

/* Pool memory (backend.h alloc_pool): plain cudaMalloc, which GPUDirect
 * RDMA can register (memory of the stream-ordered pool cannot), with
 * SYNC_MEMOPS set. cudaMalloc is synchronous: the memory is settled for
 * any stream or NIC on return. */
static hpd_status_t cuda_alloc_pool(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    void *p = NULL;
    const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 256);
    if (err != cudaSuccess) {
        HPD_LOG_ERROR("cuda", "pool allocation of %zu bytes on GPU %d failed: %s", bytes,
                      c->device, cudaGetErrorString(err));
        return HPD_ERR_NO_MEMORY;
    }
    set_sync_memops(c, p);
    *ptr_p = p;
    return HPD_OK;
}

/* cudaFree waits for the device's work, so no op still touches it. */
static void cuda_free_pool(hpd_backend_t *b, void *ptr)
{
    cudaSetDevice(hpd_cuda_ctx(b)->device);
    cudaFree(ptr);
}

static hpd_status_t cuda_memset(hpd_backend_t *b, void *ptr, int value, size_t bytes)
{
    HPD_CUDA_CHECK(cudaSetDevice(hpd_cuda_ctx(b)->device));
    HPD_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, hpd_cuda_ctx(b)->stream));
    return HPD_OK;
}

static hpd_status_t cuda_copy(hpd_backend_t *b, void *dst, const void *src, size_t bytes)
{
    HPD_CUDA_CHECK(cudaSetDevice(hpd_cuda_ctx(b)->device));
    HPD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                   hpd_cuda_ctx(b)->stream));
    return HPD_OK;
}

/* Host copies are synchronous: the host buffer is usable on return. */
static hpd_status_t cuda_to_host(hpd_backend_t *b, void *host, const void *src, size_t bytes)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    HPD_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return HPD_OK;
}

static hpd_status_t cuda_from_host(hpd_backend_t *b, void *dst, const void *host, size_t bytes)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    HPD_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->stream));
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return HPD_OK;
}

/* The size a buffer of `have` bytes grows to for `need`: doubled from
 * `have` (from `first` when empty) until it holds them. */
static size_t grown(size_t have, size_t first, size_t need)
{
    size_t want = have ? have : first;
    while (want < need)
        want *= 2;
    return want;
}

/* An op's metadata arrays copied to host memory h, each at a 256-byte
 * aligned offset, their addresses at d (the device copy of h) returned;
 * room-only arrays are left as they are. */
static void stage_arrays(const hpd_cuda_meta_t *arrays, uint32_t n, char *h, char *d)
{
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (arrays[i].host != NULL && arrays[i].bytes > 0)
            memcpy(h + off, arrays[i].host, arrays[i].bytes);
        *arrays[i].dev_p = d + off;
        off += (arrays[i].bytes + 255) & ~(size_t)255;
    }
}

/* Metadata memory, device and pinned host halves of `bytes` each, in place
 * of the old ones (nothing may use those any more). */
static hpd_status_t halves_realloc(void **dev, char **host, size_t bytes)
{
    if (*dev != NULL)
        cudaFree(*dev);
    if (*host != NULL)
        cudaFreeHost(*host);
    *dev = NULL;
    *host = NULL;
    HPD_CUDA_CHECK(cudaMalloc(dev, bytes));
    HPD_CUDA_CHECK(cudaMallocHost((void **)host, bytes));
    return HPD_OK;
}

/* (Re)allocates the staging ring with slots of slot_bytes. */
static hpd_status_t ring_alloc(hpd_cuda_ctx_t *c, size_t slot_bytes)
{
    hpd_status_t st;
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    c->slot_bytes = 0;
    if ((st = halves_realloc(&c->scratch, &c->host_stage, slot_bytes * HPD_CUDA_STAGE_SLOTS)) !=
        HPD_OK)
        return st;
    for (int i = 0; i < HPD_CUDA_STAGE_SLOTS; i++)
        if (c->stage_ev[i] == NULL)
            HPD_CUDA_CHECK(cudaEventCreateWithFlags(&c->stage_ev[i], cudaEventDisableTiming));
    c->slot_bytes = slot_bytes;
    return HPD_OK;
}

/* Inside a step (defined with the steps, below): room for `bytes` more of
 * metadata, the segment recorded so far run first; the end of the
 * segment's capture (run: it runs) and the start of the next's. */
static hpd_status_t step_arena_room(hpd_cuda_ctx_t *c, size_t bytes);
static hpd_status_t seg_end(hpd_cuda_ctx_t *c, bool run);
static hpd_status_t seg_begin(hpd_cuda_ctx_t *c);

/* Metadata travels through a ring of slots, one per op: the host copy goes
 * to the slot's pinned half, then one asynchronous copy to its device half.
 * Before an op reuses a slot it waits for the event recorded after the
 * copy of the op that used it HPD_CUDA_STAGE_SLOTS ops earlier, so that up
 * to that many ops stay in flight. */
hpd_status_t hpd_cuda_stage(hpd_backend_t *b, const hpd_cuda_meta_t *arrays, uint32_t n)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    size_t total = 0;
    hpd_status_t st;

    for (uint32_t i = 0; i < n; i++)
        total += (arrays[i].bytes + 255) & ~(size_t)255;
    if (c->in_step) {
        if (c->step_used + total > c->arena_bytes &&
            (st = step_arena_room(c, total)) != HPD_OK)
            return st;
        stage_arrays(arrays, n, c->arena_host + c->step_used,
                     (char *)c->arena_dev + c->step_used);
        c->step_used += total;
        return HPD_OK;
    }
    if ((c->slot_bytes < total || c->slot_bytes == 0) &&
        (st = ring_alloc(c, grown(c->slot_bytes, 1u << 20, total))) != HPD_OK)
        return st; /* logged where CUDA failed */
    c->slot = (c->slot + 1) % HPD_CUDA_STAGE_SLOTS;
    HPD_CUDA_CHECK(cudaEventSynchronize(c->stage_ev[c->slot]));
    char *h = c->host_stage + c->slot * c->slot_bytes;
    char *d = (char *)c->scratch + c->slot * c->slot_bytes;
    stage_arrays(arrays, n, h, d);
    if (total > 0)
        HPD_CUDA_CHECK(cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, c->stream));
    HPD_CUDA_CHECK(cudaEventRecord(c->stage_ev[c->slot], c->stream));
    return HPD_OK;
}

/* Grows the work buffer to at least `bytes` (doubling from 1 MiB), after
 * the stream drained what used it. */
static hpd_status_t work_grow(hpd_cuda_ctx_t *c, size_t bytes)
{
    const size_t want = grown(c->work_bytes, 1u << 20, bytes);
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (c->work != NULL)
        cudaFree(c->work);
    c->work = NULL;
    c->work_bytes = 0;
    const cudaError_t err = cudaMalloc(&c->work, want);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* not left for the next launch's check to find */
        c->work = NULL;
        HPD_LOG_ERROR("cuda", "scratch of %zu bytes on GPU %d: %s", want, c->device,
                      cudaGetErrorString(err));
        return HPD_ERR_NO_MEMORY;
    }
    c->work_bytes = want;
    return HPD_OK;
}

hpd_status_t hpd_cuda_work(hpd_backend_t *b, size_t bytes, void **dev_p)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    hpd_status_t st;
    if (bytes > c->work_bytes) {
        /* inside a step the stream captures: what it recorded runs first,
         * the buffer grows once the stream has drained, and the recording
         * goes on */
        const bool step = c->in_step;
        if (step && (st = seg_end(c, true)) != HPD_OK)
            return st;
        st = work_grow(c, bytes);
        /* the recording goes on whether or not the buffer grew (a caller
         * may go on with less) */
        const hpd_status_t rec = step ? seg_begin(c) : HPD_OK;
        if (st != HPD_OK || (st = rec) != HPD_OK)
            return st;
    }
    *dev_p = c->work;
    return HPD_OK;
}

/* The executable graph of this step's segment: the one kept for (bucket,
 * segment), updated in place to the graph just recorded (kernel arguments,
 * grids and metadata addresses may change; when the update is refused, as
 * for another sequence of kernels, it is made again), else a new one in the
 * least recently used entry. */
static hpd_status_t seg_exec(hpd_cuda_ctx_t *c, cudaGraph_t g, cudaGraphExec_t *exec_p)
{
    uint32_t at = HPD_CUDA_GRAPHS_KEPT;
    for (uint32_t i = 0; i < HPD_CUDA_GRAPHS_KEPT && at == HPD_CUDA_GRAPHS_KEPT; i++)
        if (c->graph[i].exec != NULL && c->graph[i].bucket == c->step_bucket &&
            c->graph[i].seg == c->seg) {
            cudaGraphExecUpdateResultInfo info;
            if (cudaGraphExecUpdate(c->graph[i].exec, g, &info) == cudaSuccess) {
                c->graph[i].used = ++c->graph_clock;
                *exec_p = c->graph[i].exec;
                return HPD_OK;
            }
            cudaGetLastError(); /* refused: made again in its entry */
            at = i;
        }
    for (uint32_t i = 0; i < HPD_CUDA_GRAPHS_KEPT && at == HPD_CUDA_GRAPHS_KEPT; i++)
        if (c->graph[i].exec == NULL)
            at = i;
    if (at == HPD_CUDA_GRAPHS_KEPT) { /* all kept: the least recently used goes */
        at = 0;
        for (uint32_t i = 1; i < HPD_CUDA_GRAPHS_KEPT; i++)
            if (c->graph[i].used < c->graph[at].used)
                at = i;
    }
    if (c->graph[at].exec != NULL)
        cudaGraphExecDestroy(c->graph[at].exec);
    c->graph[at].exec = NULL;
    HPD_CUDA_CHECK(cudaGraphInstantiate(&c->graph[at].exec, g, 0));
    c->graph[at].bucket = c->step_bucket;
    c->graph[at].seg = c->seg;
    c->graph[at].used = ++c->graph_clock;
    *exec_p = c->graph[at].exec;
    return HPD_OK;
}

/* Ends the capture of the current segment; run: its metadata [seg_start,
 * step_used) uploaded in one copy, then its graph, on the stream. A capture
 * the runtime invalidated (an op made a call that capture does not allow: a
 * defect of this backend) fails the step, and steps are no longer recorded. */
static hpd_status_t seg_end(hpd_cuda_ctx_t *c, bool run)
{
    cudaGraph_t g = NULL;
    const cudaError_t err = cudaStreamEndCapture(c->stream, &g);
    c->in_step = false;
    if (err != cudaSuccess || g == NULL) {
        HPD_LOG_ERROR("cuda", "GPU %d: recording a step's segment %u failed (%s): the step "
                      "fails, and steps run op by op from now on", c->device, c->seg,
                      cudaGetErrorString(err));
        if (g != NULL)
            cudaGraphDestroy(g);
        cudaGetLastError();
        c->graphs = false;
        return HPD_ERR_INTERNAL;
    }
    hpd_status_t st = HPD_OK;
    cudaGraphExec_t exec = NULL;
    size_t nodes = 0; /* (an op that opened the segment midway counted in the last one) */
    if (cudaGraphGetNodes(g, NULL, &nodes) != cudaSuccess) {
        cudaGetLastError();
        nodes = 1; /* launched: an empty graph runs too */
    }
    if (run && nodes > 0)
        st = seg_exec(c, g, &exec);
    /* the segment's metadata goes up even where it recorded no kernel: an
     * op that staged its metadata and then had the segment end (to grow
     * the work buffer) launches its kernels in the next segment */
    if (run && st == HPD_OK) {
        const cudaError_t e2 =
            c->step_used > c->seg_start
                ? cudaMemcpyAsync((char *)c->arena_dev + c->seg_start,
                                  c->arena_host + c->seg_start, c->step_used - c->seg_start,
                                  cudaMemcpyHostToDevice, c->stream)
                : cudaSuccess;
        const cudaError_t e3 =
            e2 == cudaSuccess && nodes > 0 ? cudaGraphLaunch(exec, c->stream) : e2;
        if (e3 != cudaSuccess) {
            HPD_LOG_ERROR("cuda", "GPU %d: launching a step's segment %u failed: %s", c->device,
                          c->seg, cudaGetErrorString(e3));
            st = HPD_ERR_INTERNAL;
        }
    }
    if (st != HPD_OK) /* logged; the steps after this one run op by op */
        c->graphs = false;
    cudaGraphDestroy(g);
    c->seg++;
    c->seg_ops = 0;
    c->seg_start = c->step_used;
    return st;
}

static hpd_status_t seg_begin(hpd_cuda_ctx_t *c)
{
    HPD_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->in_step = true;
    return HPD_OK;
}

/* (Re)allocates the arena with at least `bytes` (doubling from 64 KiB); the
 * stream has drained: no copy or graph uses it. */
static hpd_status_t arena_grow(hpd_cuda_ctx_t *c, size_t bytes)
{
    const size_t want = grown(c->arena_bytes, 64u << 10, bytes);
    hpd_status_t st;
    c->arena_bytes = 0;
    if ((st = halves_realloc(&c->arena_dev, &c->arena_host, want)) != HPD_OK)
        return st;
    c->arena_bytes = want;
    return HPD_OK;
}

/* The arena is full: the segment recorded so far runs, the stream drains
 * (every segment of the step has copied and used its bytes), and the
 * arena, grown to twice what the step had used and this op's, starts over. */
static hpd_status_t step_arena_room(hpd_cuda_ctx_t *c, size_t bytes)
{
    hpd_status_t st = seg_end(c, true);
    if (st != HPD_OK)
        return st;
    HPD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if ((st = arena_grow(c, 2 * (c->step_used + bytes))) != HPD_OK)
        return st;
    c->step_used = c->seg_start = 0;
    return seg_begin(c);
}

/* A step recorded: the stream captures (this thread may make no call that
 * waits) in segments, ops stage their metadata in the arena. The arena is
 * rewritten only once the last step's segments have copied and used it. */
static hpd_status_t cuda_step_begin(hpd_backend_t *b, uint32_t bucket)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    hpd_status_t st;
    if (!c->graphs || c->in_step)
        return HPD_ERR_UNSUPPORTED;
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    if (c->step_done == NULL)
        HPD_CUDA_CHECK(cudaEventCreateWithFlags(&c->step_done, cudaEventDisableTiming));
    HPD_CUDA_CHECK(cudaEventSynchronize(c->step_done));
    if (c->arena_bytes == 0 && (st = arena_grow(c, 0)) != HPD_OK)
        return st;
    /* rows rounded up to a power of two: a handful of buckets whatever the
     * batch, each with the same sequence of kernels, mostly (an update
     * changes the rest) */
    uint32_t b2 = 1;
    while (b2 < bucket && b2 < (1u << 31))
        b2 *= 2;
    c->step_bucket = b2;
    c->seg = c->seg_ops = 0;
    c->step_used = c->seg_start = 0;
    return seg_begin(c);
}

/* Ends the step: its last segment runs (run), or is discarded (the ops that
 * recorded it failed; the segments before it ran). */
static hpd_status_t cuda_step_end(hpd_backend_t *b, bool run, bool *ran_p)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    *ran_p = false;
    HPD_CUDA_CHECK(cudaSetDevice(c->device));
    /* !in_step: a segment failed (logged), and so did the op that ended it */
    const hpd_status_t st = c->in_step ? seg_end(c, run) : run ? HPD_ERR_INTERNAL : HPD_OK;
    /* after whatever of the step was enqueued, failed or not: the next step
     * rewrites the arena only once it ran */
    HPD_CUDA_CHECK(cudaEventRecord(c->step_done, c->stream));
    *ran_p = st == HPD_OK && run;
    return st;
}

/* At an op's entry inside a step: the segment closes after its share of ops
 * (the first after HPD_CUDA_SEG_FIRST, so that the GPU starts early), and
 * runs while the next is recorded. */
static hpd_status_t step_op(hpd_cuda_ctx_t *c)
{
    if (!c->in_step)
        return HPD_OK;
    if (c->seg_ops >= (c->seg == 0 ? HPD_CUDA_SEG_FIRST : HPD_CUDA_SEG_OPS)) {
        hpd_status_t st = seg_end(c, true);
        if (st != HPD_OK || (st = seg_begin(c)) != HPD_OK)
            return st;
    }
    c->seg_ops++;
    return HPD_OK;
}

/* Every op enters here: the context's GPU made current (a process may
 * drive several, and each op runs on the calling thread), and with
 * HPD_CUDA_SYNC=1 the stream synchronised and checked after the op, so that
 * an asynchronous fault names the op that caused it (docs/testing.md). */
static hpd_status_t op_done(hpd_backend_t *b, const char *op, hpd_status_t st)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    if (st != HPD_OK || !c->sync_each_op)
        return st;
    const cudaError_t err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess) {
        HPD_LOG_ERROR("cuda", "op %s on GPU %d failed: %s", op, c->device,
                      cudaGetErrorString(err));
        return HPD_ERR_INTERNAL;
    }
    return HPD_OK;
}

#define HPD_CUDA_ENTRY(op, args_t)                                                     \
    static hpd_status_t entry_##op(hpd_backend_t *b, const args_t *a)                  \
    {                                                                                  \
        HPD_CUDA_CHECK(cudaSetDevice(hpd_cuda_ctx(b)->device));                        \
        const hpd_status_t st = step_op(hpd_cuda_ctx(b));                              \
        return st != HPD_OK ? st : op_done(b, #op, hpd_cuda_##op(b, a));               \
    }
HPD_CUDA_ENTRY(embed, hpd_embed_args_t)
HPD_CUDA_ENTRY(gemm, hpd_gemm_args_t)
HPD_CUDA_ENTRY(rmsnorm, hpd_rmsnorm_args_t)
HPD_CUDA_ENTRY(gated_rmsnorm, hpd_gated_rmsnorm_args_t)
HPD_CUDA_ENTRY(l2norm, hpd_l2norm_args_t)
HPD_CUDA_ENTRY(rope, hpd_rope_args_t)
HPD_CUDA_ENTRY(silu_mul, hpd_silu_mul_args_t)
HPD_CUDA_ENTRY(sigmoid_mul, hpd_sigmoid_mul_args_t)
HPD_CUDA_ENTRY(kv_store, hpd_kv_store_args_t)
HPD_CUDA_ENTRY(attention, hpd_attention_args_t)
HPD_CUDA_ENTRY(conv1d, hpd_conv1d_args_t)
HPD_CUDA_ENTRY(gdn_gating, hpd_gdn_gating_args_t)
HPD_CUDA_ENTRY(gdn_chunked, hpd_gdn_args_t)
HPD_CUDA_ENTRY(gdn_recurrent, hpd_gdn_args_t)
HPD_CUDA_ENTRY(sample, hpd_sample_args_t)
HPD_CUDA_ENTRY(kv_translate, hpd_kv_translate_args_t)
HPD_CUDA_ENTRY(slot_copy, hpd_slot_copy_args_t)
HPD_CUDA_ENTRY(gather, hpd_gather_args_t)
HPD_CUDA_ENTRY(moe_combine, hpd_moe_combine_args_t)
HPD_CUDA_ENTRY(tp_sum, hpd_tp_sum_args_t)
HPD_CUDA_ENTRY(moe_route, hpd_moe_route_args_t)
HPD_CUDA_ENTRY(gemm_grouped, hpd_gemm_grouped_args_t)
HPD_CUDA_ENTRY(gemm_grouped_bf16, hpd_gemm_grouped_args_t)
HPD_CUDA_ENTRY(hash_pieces, hpd_hash_pieces_args_t)
HPD_CUDA_ENTRY(norm_rope, hpd_norm_rope_args_t)
HPD_CUDA_ENTRY(l2norm_gating, hpd_l2norm_gating_args_t)
HPD_CUDA_ENTRY(gemm_cublas, hpd_gemm_args_t)
HPD_CUDA_ENTRY(gemm_bf16, hpd_gemm_args_t)
HPD_CUDA_ENTRY(attention_bf16, hpd_attention_args_t)
HPD_CUDA_ENTRY(gdn_chunked_bf16, hpd_gdn_args_t)

/* The devices differ in their GEMMs, attention and chunked GDN (and so in
 * their numerics) alone; cuda-fast has no grouped GEMM (hpd_gemm_grouped
 * calls its GEMM per group). */
static constexpr hpd_backend_ops_t cuda_ops_with(
    const char *name, const char *numerics, decltype(hpd_backend_ops_t::gemm) gemm,
    decltype(hpd_backend_ops_t::gemm_grouped) grouped,
    decltype(hpd_backend_ops_t::attention) attention = entry_attention,
    decltype(hpd_backend_ops_t::gdn_chunked) gdn_chunked = entry_gdn_chunked)
{
    return hpd_backend_ops_t{
        .name = name,
        .numerics = numerics,
        .host_memory = false,
        .destroy = cuda_destroy,
        .sync = cuda_sync,
        .stream = cuda_stream,
        .fence_record = cuda_fence_record,
        .fence_query = cuda_fence_query,
        .fence_release = cuda_fence_release,
        .host_register = cuda_host_register,
        .host_unregister = cuda_host_unregister,
        .alloc = cuda_alloc,
        .free = cuda_free,
        .alloc_pool = cuda_alloc_pool,
        .free_pool = cuda_free_pool,
        .memset = cuda_memset,
        .copy = cuda_copy,
        .to_host = cuda_to_host,
        .from_host = cuda_from_host,
        .embed = entry_embed,
        .gemm = gemm,
        .rmsnorm = entry_rmsnorm,
        .gated_rmsnorm = entry_gated_rmsnorm,
        .l2norm = entry_l2norm,
        .rope = entry_rope,
        .silu_mul = entry_silu_mul,
        .sigmoid_mul = entry_sigmoid_mul,
        .kv_store = entry_kv_store,
        .attention = attention,
        .conv1d = entry_conv1d,
        .conv1d_step = entry_conv1d,
        .gdn_gating = entry_gdn_gating,
        .gdn_chunked = gdn_chunked,
        .gdn_recurrent = entry_gdn_recurrent,
        .sample = entry_sample,
        .kv_translate = entry_kv_translate,
        .slot_copy = entry_slot_copy,
        .gather = entry_gather,
        .moe_combine = entry_moe_combine,
        .moe_route = entry_moe_route,
        .tp_sum = entry_tp_sum,
        .gemm_grouped = grouped,
        .l2norm_gating = entry_l2norm_gating,
        .norm_rope = entry_norm_rope,
        .hash_pieces = entry_hash_pieces,
        .step_begin = cuda_step_begin,
        .step_end = cuda_step_end,
    };
}

static constexpr hpd_backend_ops_t cuda_ops =
    cuda_ops_with("cuda", "fp32", entry_gemm, entry_gemm_grouped);
static constexpr hpd_backend_ops_t cuda_fast_ops =
    cuda_ops_with("cuda-fast", "cublas", entry_gemm_cublas, nullptr);
/* deterministic and batch-invariant, on tensor cores: BF16 weights for every
 * batch size (activations rounded to bf16), attention's products (q, k, v
 * and the probabilities rounded to bf16), the chunked GDN's products (their
 * operands rounded to bf16) for dk 64 and 128 */
static constexpr hpd_backend_ops_t cuda_bf16_ops =
    cuda_ops_with("cuda-bf16", "bf16-tensor-cores", entry_gemm_bf16, entry_gemm_grouped_bf16,
                  entry_attention_bf16, entry_gdn_chunked_bf16);
/* cuda-fast where BF16 weights go to tensor cores (activations rounded to
 * bf16): other numerics than on a GPU without them */
static constexpr hpd_backend_ops_t cuda_fast_tc_ops =
    cuda_ops_with("cuda-fast", "cublas-bf16-tensor-cores", entry_gemm_cublas, nullptr);

extern "C" hpd_status_t hpd_backend_cuda_count(int *count_p)
{
    int count = 0, driver = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    /* No GPU here at all: none visible, or no driver installed (the runtime
     * then says "insufficient driver" and the driver version reads 0). A
     * driver too old for the runtime, or any other error, is a real failure. */
    if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0) ||
        (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
         driver == 0))
        return HPD_ERR_NO_DEVICE;
    if (err != cudaSuccess) {
        cudaDriverGetVersion(&driver);
        HPD_LOG_ERROR("cuda", "cudaGetDeviceCount failed: %s (driver version %d)",
                      cudaGetErrorString(err), driver);
        return HPD_ERR_INTERNAL;
    }
    *count_p = count;
    return HPD_OK;
}

extern "C" hpd_status_t hpd_backend_cuda_create(const hpd_backend_params_t *params,
                                                hpd_backend_t **backend_p)
{
    const char *dev = params->device ? params->device : "cuda";
    const bool fast = strncmp(dev, "cuda-fast", 9) == 0, bf16 = strncmp(dev, "cuda-bf16", 9) == 0;
    const char *rest = dev + (fast || bf16 ? 9 : 4);
    int id = 0, count = 0;
    if (strncmp(dev, "cuda", 4) != 0 || (*rest != '\0' && *rest != ':')) {
        HPD_LOG_ERROR("cuda", "device '%s' is invalid (expected cuda[:N], cuda-bf16[:N] or "
                      "cuda-fast[:N])", dev);
        return HPD_ERR_INVALID_ARG;
    }
    if (*rest == ':') {
        char *end;
        long v = strtol(rest + 1, &end, 10);
        if (*end != '\0' || end == rest + 1 || v < 0 || v > 255) {
            HPD_LOG_ERROR("cuda", "device '%s' is invalid (expected cuda[:N], cuda-bf16[:N] "
                          "or cuda-fast[:N], N a GPU index)", dev);
            return HPD_ERR_INVALID_ARG;
        }
        id = (int)v;
    }
    const hpd_status_t st = hpd_backend_cuda_count(&count);
    if (st != HPD_OK) {
        HPD_LOG_ERROR("cuda", "device '%s': %s", dev,
                      st == HPD_ERR_NO_DEVICE ? "this machine has no CUDA GPU"
                                              : "the CUDA runtime cannot count the GPUs");
        return st;
    }
    if (id >= count) {
        HPD_LOG_ERROR("cuda", "device '%s': this machine has %d GPU(s) (expected cuda:0 to "
                      "cuda:%d)", dev, count, count - 1);
        return HPD_ERR_INVALID_ARG;
    }
    hpd_backend_t *b = (hpd_backend_t *)calloc(1, sizeof(*b));
    hpd_cuda_ctx_t *c = (hpd_cuda_ctx_t *)calloc(1, sizeof(*c));
    if (b == NULL || c == NULL) {
        free(b);
        free(c);
        return HPD_ERR_NO_MEMORY;
    }
    c->device = id;
    int smem = 0;
    if (cudaSetDevice(id) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, id) !=
            cudaSuccess) {
        HPD_LOG_ERROR("cuda", "cannot open GPU %d: %s", id, cudaGetErrorString(cudaGetLastError()));
        if (c->stream != NULL)
            cudaStreamDestroy(c->stream);
        free(b);
        free(c);
        return HPD_ERR_INTERNAL;
    }
    c->smem_optin = (size_t)smem;
    if (cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, id) !=
        cudaSuccess)
        c->cc_major = 0; /* no tensor-core kernels */
    int sms = 0;
    c->n_sms = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, id) == cudaSuccess
                   ? (uint32_t)sms
                   : 1;
    /* HPD_CUDA_GEMM_BN=128 or 256: the tiled GEMM's blocks (how it runs,
     * not what it computes); else chosen by shape */
    const char *bn_env = getenv("HPD_CUDA_GEMM_BN");
    c->gemm_bn = bn_env != NULL && strcmp(bn_env, "128") == 0   ? 128
                 : bn_env != NULL && strcmp(bn_env, "256") == 0 ? 256
                                                                : 0;
    /* HPD_CUDA_GDN_BUFFERS=1 or 2: cuda-bf16's chunked GDN state pass's
     * chunk buffers (how it runs, not what it computes); else chosen */
    const char *gb_env = getenv("HPD_CUDA_GDN_BUFFERS");
    c->gdn_bufs = gb_env != NULL && strcmp(gb_env, "1") == 0   ? 1
                  : gb_env != NULL && strcmp(gb_env, "2") == 0 ? 2
                                                               : 0;
    const char *sync_env = getenv("HPD_CUDA_SYNC");
    c->sync_each_op = sync_env != NULL && strcmp(sync_env, "1") == 0;
    if (fast && (cublasCreate(&c->cublas) != CUBLAS_STATUS_SUCCESS ||
                 cublasSetStream(c->cublas, c->stream) != CUBLAS_STATUS_SUCCESS ||
                 cublasSetMathMode(c->cublas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)) {
        HPD_LOG_ERROR("cuda", "cannot create a cuBLAS handle on GPU %d", id);
        b->ctx = c;
        cuda_destroy(b);
        return HPD_ERR_INTERNAL;
    }
    /* steps as graphs unless HPD_CUDA_GRAPHS=0 (the H100 run of
     * docs/benchmarks.md: every GPU test passed with them, decode 1.02-1.09x
     * as fast); not where every op waits (HPD_CUDA_SYNC), nor with cuBLAS
     * (its workspace is not set up for capture here) */
    const char *graphs_env = getenv("HPD_CUDA_GRAPHS");
    const bool graphs_off = graphs_env != NULL && strcmp(graphs_env, "0") == 0;
    c->graphs = !c->sync_each_op && !fast && !graphs_off;
    c->tc_ok = (fast || bf16) && hpd_cuda_tc_init(c);
    c->gr_ok = bf16 && c->tc_ok && hpd_cuda_ring_init(c);
    c->gr_deep_ok = c->gr_ok && hpd_cuda_ring_deep_init(c);
    c->wide_ok = c->tc_ok && hpd_cuda_tc_wide_init(c);
    if (!hpd_cuda_attention_init(c))
        HPD_LOG_WARN("cuda", "GPU %d: the split-attention kernels' shared memory could not be "
                     "opted in (%s): attention launches past 48 KiB will fail", id,
                     cudaGetErrorString(cudaGetLastError()));
    if (bf16 && !c->tc_ok) {
        HPD_LOG_ERROR("cuda", "device '%s' needs tensor cores: compute capability 8.0 or later "
                      "and kernels built for sm_80 or later; GPU %d has compute capability "
                      "%d.x (device cuda computes with fp32 products instead)", dev, id,
                      c->cc_major);
        b->ctx = c;
        cuda_destroy(b);
        return HPD_ERR_UNSUPPORTED;
    }
    b->ops = bf16 ? &cuda_bf16_ops : !fast ? &cuda_ops : c->tc_ok ? &cuda_fast_tc_ops
                                                                  : &cuda_fast_ops;
    b->ctx = c;
    *backend_p = b;
    return HPD_OK;
}
