/* The CUDA backend's context and what its op files share (docs/kernels.md).
 * Every op enqueues on the context's stream; metadata the args carry in
 * host memory (sequences, state pointers, block tables) is copied into a
 * device scratch buffer first. Deterministic: each output row is reduced in
 * an order fixed by the row alone (fixed block sizes, fixed trees). */
#ifndef HPD_KERNELS_CUDA_OPS_H
#define HPD_KERNELS_CUDA_OPS_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.h"

#define HPD_CUDA_STAGE_SLOTS 8
/* A recorded step (step_begin/step_end) runs as a few graphs, its
 * segments: the first closes after HPD_CUDA_SEG_FIRST ops, the others after
 * HPD_CUDA_SEG_OPS (the GPU starts on a segment while the next is
 * recorded). Executable graphs kept: one per (bucket: the step's rows
 * rounded up to a power of two, segment), the least recently used replaced
 * (a 64-layer model's step has some 28 segments). */
#define HPD_CUDA_SEG_FIRST 8
#define HPD_CUDA_SEG_OPS 32
#define HPD_CUDA_GRAPHS_KEPT 256

typedef struct {
    int device;
    cudaStream_t stream;
    /* metadata staging: a ring of slots, pinned host and device halves */
    void *scratch;
    char *host_stage;
    size_t slot_bytes;
    uint32_t slot;
    cudaEvent_t stage_ev[HPD_CUDA_STAGE_SLOTS];
    size_t smem_optin; /* shared memory a block may opt in to */
    int cc_major;      /* compute capability: tensor-core kernels need 8 or more */
    bool tc_ok;        /* cuda-fast, cuda-bf16: tensor-core GEMMs run (hpd_cuda_tc_init) */
    bool gr_ok;        /* cuda-bf16: the decode GEMM's ring kernel runs (hpd_cuda_ring_init) */
    bool gr_deep_ok;   /* and its deeper ring (hpd_cuda_ring_deep_init) */
    bool wide_ok;      /* the tiled tensor-core GEMM's 128 x 256 blocks run (hpd_cuda_tc_wide_init) */
    uint32_t n_sms;    /* streaming multiprocessors */
    uint32_t gemm_bn;  /* HPD_CUDA_GEMM_BN: 128 or 256 forces the tiled GEMM's blocks, 0 chooses */
    uint32_t gdn_bufs; /* HPD_CUDA_GDN_BUFFERS: 1 or 2 forces cuda-bf16's GDN state buffers */
    cublasHandle_t cublas; /* cuda-fast only: its GEMMs */
    void *work; /* device scratch for ops' intermediates (hpd_cuda_work) */
    size_t work_bytes;
    bool sync_each_op; /* HPD_CUDA_SYNC=1: synchronise and check after every op */
    /* steps recorded as graphs (docs/kernels.md "The decode step"): unless
     * HPD_CUDA_GRAPHS=0, not with HPD_CUDA_SYNC=1 nor cuBLAS */
    bool graphs;
    bool in_step; /* between step_begin and step_end: the stream captures */
    uint32_t step_bucket;
    uint32_t seg, seg_ops; /* the segment being recorded, its ops so far */
    /* the step's metadata: pinned host and device halves; a segment's
     * bytes [seg_start, step_used) are uploaded in one copy before its graph */
    char *arena_host;
    void *arena_dev;
    size_t arena_bytes, step_used, seg_start;
    cudaEvent_t step_done; /* after the last step's last graph: the arena is free */
    struct {
        uint32_t bucket, seg;
        cudaGraphExec_t exec;
        uint64_t used; /* graph_clock at its last launch */
    } graph[HPD_CUDA_GRAPHS_KEPT];
    uint64_t graph_clock;
    /* host memory this backend pinned (host_register), which host_unregister
     * unpins; memory pinned by another (UCX) is not listed */
    void **pinned;
    uint32_t n_pinned, cap_pinned;
} hpd_cuda_ctx_t;

static inline hpd_cuda_ctx_t *hpd_cuda_ctx(hpd_backend_t *b)
{
    return (hpd_cuda_ctx_t *)b->ctx;
}


/* Copies all of an op's metadata arrays, in one call, into the next slot of
 * the staging ring, each at a 256-byte aligned offset. The slot is reserved
 * for their whole size up front: when it is smaller, the ring grows first
 * (after the stream drained), so an op never fails for the size of its
 * metadata. The host arrays are free again on return; the device copies
 * are ordered before the op's launch on the stream. Inside a step
 * (step_begin) the arrays go to the step's arena instead, uploaded with
 * their segment before its graph; an arena too small ends the segment
 * there (it runs), and grows once the stream has drained. */
hpd_status_t hpd_cuda_stage(hpd_backend_t *b, const hpd_cuda_meta_t *arrays, uint32_t n);

#include "kernels/cuda/stage_seqs.h" /* hpd_cuda_stage_seqs */

/* Device scratch of at least `bytes` for an op's intermediates, valid until
 * the next call (grown after the stream has drained what used it; inside a
 * step, the segment recorded so far runs first). */
hpd_status_t hpd_cuda_work(hpd_backend_t *b, size_t bytes, void **dev_p);


hpd_status_t hpd_cuda_embed(hpd_backend_t *b, const hpd_embed_args_t *a);
hpd_status_t hpd_cuda_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a);
hpd_status_t hpd_cuda_rmsnorm(hpd_backend_t *b, const hpd_rmsnorm_args_t *a);
/* rmsnorm of q and k, then rope on both, in one launch (norm.cu) */
hpd_status_t hpd_cuda_norm_rope(hpd_backend_t *b, const hpd_norm_rope_args_t *a);
hpd_status_t hpd_cuda_l2norm_gating(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a);
hpd_status_t hpd_cuda_gated_rmsnorm(hpd_backend_t *b, const hpd_gated_rmsnorm_args_t *a);
hpd_status_t hpd_cuda_l2norm(hpd_backend_t *b, const hpd_l2norm_args_t *a);
hpd_status_t hpd_cuda_rope(hpd_backend_t *b, const hpd_rope_args_t *a);
hpd_status_t hpd_cuda_silu_mul(hpd_backend_t *b, const hpd_silu_mul_args_t *a);
hpd_status_t hpd_cuda_sigmoid_mul(hpd_backend_t *b, const hpd_sigmoid_mul_args_t *a);
hpd_status_t hpd_cuda_gdn_gating(hpd_backend_t *b, const hpd_gdn_gating_args_t *a);
hpd_status_t hpd_cuda_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a);
hpd_status_t hpd_cuda_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_gemm_cublas(hpd_backend_t *b, const hpd_gemm_args_t *a);
/* BF16 weights on tensor cores (gemm.cu; cuda-fast's GEMM takes it where
 * it fits) */
hpd_status_t hpd_cuda_gemm_tc(hpd_backend_t *b, const hpd_gemm_args_t *a);
/* the device cuda-bf16's GEMM: BF16 weights on tensor cores for every
 * batch size, batch-invariant (gemm.cu) */
hpd_status_t hpd_cuda_gemm_bf16(hpd_backend_t *b, const hpd_gemm_args_t *a);
/* Whether the tensor-core GEMMs run here: compute capability 8.0 or more
 * and the kernels built from sm_80 PTX or later (a build for older
 * architectures JIT-compiles a body that traps); where they do, their
 * shared memory is opted in (once, at the backend's creation, with the
 * context's GPU current). */
bool hpd_cuda_tc_init(const hpd_cuda_ctx_t *c);
/* Whether the tiled tensor-core GEMM's wide blocks (128 x 256, 166 KiB of
 * shared memory) run here, their shared memory opted in; else every tiled
 * GEMM takes the 128 x 128 blocks, with the same bits. */
bool hpd_cuda_tc_wide_init(const hpd_cuda_ctx_t *c);
/* The split-attention kernels' shared memory opted in, once, at the
 * backend's creation (attention.cu); false when the runtime refused. */
bool hpd_cuda_attention_init(const hpd_cuda_ctx_t *c);
/* Whether cuda-bf16's decode ring kernel runs here: compute capability 8.0
 * or more and its shared memory opted in (once, at the backend's creation);
 * else gemv_tc_kernel takes its GEMMs, with the same bits. */
bool hpd_cuda_ring_init(const hpd_cuda_ctx_t *c);
/* Whether its deeper ring (for GEMMs of at most a block per SM) runs here,
 * its shared memory opted in; else those take the usual ring, with the
 * same bits. */
bool hpd_cuda_ring_deep_init(const hpd_cuda_ctx_t *c);
/* the pieces' hashes of a transfer's checksum (checksum.cu) */
hpd_status_t hpd_cuda_hash_pieces(hpd_backend_t *b, const hpd_hash_pieces_args_t *a);
hpd_status_t hpd_cuda_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a);
hpd_status_t hpd_cuda_attention(hpd_backend_t *b, const hpd_attention_args_t *a);
hpd_status_t hpd_cuda_attention_bf16(hpd_backend_t *b, const hpd_attention_args_t *a);
hpd_status_t hpd_cuda_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a);
/* cuda-bf16's: both passes on tensor cores for dk 64 and 128 (gdn.cu) */
hpd_status_t hpd_cuda_gdn_chunked_bf16(hpd_backend_t *b, const hpd_gdn_args_t *a);
hpd_status_t hpd_cuda_sample(hpd_backend_t *b, const hpd_sample_args_t *a);
hpd_status_t hpd_cuda_kv_translate(hpd_backend_t *b, const hpd_kv_translate_args_t *a);
hpd_status_t hpd_cuda_slot_copy(hpd_backend_t *b, const hpd_slot_copy_args_t *a);
hpd_status_t hpd_cuda_gather(hpd_backend_t *b, const hpd_gather_args_t *a);
hpd_status_t hpd_cuda_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a);
hpd_status_t hpd_cuda_tp_sum(hpd_backend_t *b, const hpd_tp_sum_args_t *a);
hpd_status_t hpd_cuda_moe_route(hpd_backend_t *b, const hpd_moe_route_args_t *a);
/* grouped GEMMs (gemm.cu): cuda's kernels, cuda-bf16's */
hpd_status_t hpd_cuda_gemm_grouped(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a);
hpd_status_t hpd_cuda_gemm_grouped_bf16(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a);

#endif
