/* The kernel backend: an ops table plus a context (docs/kernels.md).
 *
 * Every op takes one args struct (pointers, shapes, strides, block tables),
 * so adding a field does not change every signature. Tensors in args
 * (activations, weights, pools, states) are backend memory; the metadata
 * arrays (token ids, positions, sequences, per-sequence state pointers,
 * block tables, sampling parameters) are host memory, which a device
 * backend stages itself. Optional ops may be NULL;
 * the inline wrappers then answer HPD_ERR_UNSUPPORTED.
 *
 * Determinism: every op computes each output row with a reduction order that
 * depends neither on the other rows of the batch nor on the page layout. */
#ifndef HPD_KERNELS_BACKEND_H
#define HPD_KERNELS_BACKEND_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/hostdev.h"
#include "common/kv_layout.h"
#include "common/sampling.h"
#include "common/status.h"

typedef struct hpd_backend hpd_backend_t;

/* A strided [tokens][heads][dim] view: element (t, h, d) is p[t*ld + h*hs + d]. */
typedef struct {
    float *p;
    uint32_t ld; /* elements between tokens */
    uint32_t hs; /* elements between heads */
} hpd_view_t;

/* One sequence of a batch: its rows in the batch activations and where they
 * sit in the sequence. */
typedef struct {
    uint32_t row;       /* first row in the batch */
    uint32_t n_tokens;  /* rows this step */
    uint32_t start_pos; /* absolute position of the first row */
} hpd_seq_t;

typedef struct {
    const int32_t *ids; /* n token ids, each < vocab (checked by the caller) */
    uint32_t n;
    const void *table; /* [vocab][dim] of dtype (F32, BF16 or F16) */
    hpd_dtype_t dtype;
    uint32_t dim;
    float *out; /* [n][ld] */
    uint32_t ld;
} hpd_embed_args_t;

/* y[m][n] = (accumulate ? y[m][n] : 0) + sum_k x[m][k] * w[n][k], each w
 * element widened to fp32 exactly (so BF16 or F16 weights give the bits of
 * the same weights stored as F32) and the sum in fp32; except on device
 * cpu-bf16, where BF16 weights multiply x rounded to bf16 (docs/kernels.md) */
typedef struct {
    const float *x;
    uint32_t ldx;
    const void *w; /* [n][k] row-major, leading dimension k, of w_dtype */
    hpd_dtype_t w_dtype; /* F32 (0), BF16, F16 or F8_E4M3 */
    /* F8_E4M3: w[n][c] is dequantised as q * w_scale[n * w_scale_ld + c / w_block]
     * (hpd_weight_t), inside the GEMM */
    const float *w_scale;
    uint32_t w_scale_ld, w_block;
    float *y;
    uint32_t ldy;
    uint32_t m, n, k;
    bool accumulate;
} hpd_gemm_args_t;

/* The weight fields of a GEMM's args from a model matrix (hpd_weight_t),
 * inside a designated initializer. */
#define HPD_GEMM_WEIGHT(wt)                                                                     \
    .w = (wt).p, .w_dtype = (wt).dtype, .w_scale = (wt).scale, .w_scale_ld = (wt).scale_ld,     \
    .w_block = (wt).block

/* RMSNorm of every (token, head) row of dim elements:
 * y = x * rsqrt(mean(x^2) + eps) * (zero_centred ? 1 + w : w). In place is allowed. */
typedef struct {
    hpd_view_t x, y;
    uint32_t n_tokens, n_heads, dim;
    const float *w;
    float eps;
    bool zero_centred;
} hpd_rmsnorm_args_t;

/* Gated RMSNorm (GDN output): y = x * rsqrt(mean(x^2)+eps) * w * silu(z). */
typedef struct {
    hpd_view_t x, z, y;
    uint32_t n_tokens, n_heads, dim;
    const float *w;
    float eps;
} hpd_gated_rmsnorm_args_t;

/* L2 normalisation in place, then a scale: x = x * rsqrt(sum(x^2) + eps) * scale. */
typedef struct {
    hpd_view_t x;
    uint32_t n_tokens, n_heads, dim;
    float eps, scale;
} hpd_l2norm_args_t;

/* NeoX rotary embedding in place on the first rot_dim dims of each head,
 * with inv_freq[i] = 1 / theta^(2i / rot_dim) in fp32 as transformers
 * computes it. YaRN (yarn_factor > 0): with p = theta^(2i / rot_dim) and
 * e = 1 - clamp((i - yarn_low) / yarn_span, 0, 1),
 * inv_freq[i] = (1 / (yarn_factor * p)) * (1 - e) + (1 / p) * e, and cos and
 * sin are multiplied by yarn_attention (model/config.h resolves the four).
 * Every backend takes its inverse frequencies from one host function,
 * hpd_rope_inv_freq_table, so that they are the same bits everywhere. */
typedef struct {
    hpd_view_t x;
    uint32_t n_tokens, n_heads, head_dim, rot_dim;
    const int32_t *positions; /* per token */
    float theta;
    float yarn_factor, yarn_low, yarn_span, yarn_attention;
} hpd_rope_args_t;

/* Attention's q and k norms and their rotary embedding in one op: the same
 * as rmsnorm(q), rmsnorm(k), then rope on q.y and k.y (rope.x, n_tokens
 * and n_heads are taken from them, rope.head_dim is q.dim), the same bits
 * on a backend whether fused or not. */
typedef struct {
    hpd_rmsnorm_args_t q, k; /* q.dim == k.dim, q.n_tokens == k.n_tokens */
    hpd_rope_args_t rope;
} hpd_norm_rope_args_t;

/* The largest rot_dim / 2 the backends take. */
#define HPD_ROPE_MAX_HALF 512

/* inv_freq[i] of a rope, computed on the host (kernels/backend.c, with the
 * build's C flags: no fused multiply-add). */
float hpd_rope_inv_freq(const hpd_rope_args_t *a, uint32_t i);

/* The rot_dim / 2 inverse frequencies of a rope into inv_freq: the one
 * table both backends use (the CUDA backend stages it with the positions;
 * a device powf could differ from the host's by an ulp, which at a large
 * position turns the angle by up to a radian). */
void hpd_rope_inv_freq_table(const hpd_rope_args_t *a, float *inv_freq);

/* out[t][i] = silu(gu[t][i]) * gu[t][inter + i] (SwiGLU) */
typedef struct {
    const float *gu;
    uint32_t ldgu;
    float *out;
    uint32_t ldout;
    uint32_t n_tokens, inter;
} hpd_silu_mul_args_t;

/* dst[i] = src[idx[i]] for n rows of dim floats: the LM head gathers the
 * rows that need logits (idx host memory, staged by a device backend); a
 * mixture of experts gathers each expert's rows together (idx_dev: backend
 * memory, moe_route's, read where the op runs; when set, idx is not
 * read). */
typedef struct {
    const float *src;
    uint32_t ld_src;
    const uint32_t *idx;
    const uint32_t *idx_dev;
    uint32_t n, dim;
    float *dst;
    uint32_t ld_dst;
} hpd_gather_args_t;

/* A mixture of experts' output added to the residual, per token t and
 * element d, with a fixed sequence of fp32 roundings (as transformers):
 *   acc = 0; for j < top_k: acc = acc + weights[t][j] * rows[slots[t][j]][d]
 *   (the product rounded, then the sum; j in the order given: the engine
 *   gives experts in ascending id), then with a shared expert
 *   acc = acc + sigmoid(gate[t]) * shared[t][d]; finally x[t][d] += acc.
 * slots and weights are backend memory (moe_route's), [n_tokens][top_k]. */
typedef struct {
    float *x;
    uint32_t ldx;
    const float *rows;
    uint32_t ld_rows;
    const uint32_t *slots;
    const float *weights;
    uint32_t top_k;
    const float *shared; /* [n_tokens][ld_shared]; NULL: no shared expert */
    uint32_t ld_shared;
    const float *gate; /* the shared expert's gate logit of token t at gate[t * ld_gate] */
    uint32_t ld_gate;
    uint32_t n_tokens, dim;
} hpd_moe_combine_args_t;

/* A mixture of experts' routing of a batch, in backend memory, for gather,
 * gemm_grouped and moe_combine: no step of it waits for the host. Token t's
 * experts (the router of kernels/moe_route.h on logits[t * ld], the first
 * n_experts of the row) are ids[t * top_k + j], ascending, with their
 * weights beside; the slots (token, expert) are numbered expert by expert,
 * tokens in order (hpd_moe_number): first[x] is expert x's first slot
 * (first[n_experts] = n_tokens * top_k), idx[slot] its token and
 * slots[t * top_k + j] the slot of (t, ids[t * top_k + j]). */
typedef struct {
    const float *logits;
    uint32_t ld;
    uint32_t n_tokens, n_experts, top_k; /* n_experts <= HPD_MAX_EXPERTS, top_k <= n_experts */
    bool norm;
    uint32_t *ids;  /* [n_tokens][top_k] */
    float *weights; /* [n_tokens][top_k] */
    uint32_t *slots; /* [n_tokens][top_k] */
    uint32_t *idx;   /* [n_tokens * top_k] */
    uint32_t *first; /* [n_experts + 1] */
} hpd_moe_route_args_t;

/* Groups of rows, each times its own matrix, in one op (a mixture of
 * experts' expert GEMMs): rows first[x] .. first[x + 1] - 1 of g.x and g.y
 * take matrix x of g.w, which holds n_groups matrices [n][k] one after
 * another (FP8: scales [n_groups][n][w_scale_ld]). Each row has the bits
 * gemm gives it. g.m is every group's rows (first[n_groups]); first
 * (backend memory, moe_route's) is read where the op runs, so a device
 * backend's op does not wait for the host; max_rows bounds a group's
 * rows (a token hits an expert once: the batch's tokens). */
typedef struct {
    hpd_gemm_args_t g; /* g.w, g.w_scale: group 0's */
    const uint32_t *first;
    uint32_t n_groups, max_rows;
} hpd_gemm_grouped_args_t;

/* The top of a row-parallel product's canonical sum (kernels/tp_sum.h):
 * y = (accumulate ? y + s : s) with s the n_parts parts (1, 2, 4 or 8
 * [m][n] matrices) combined by the fixed pairwise tree, p0 at n_parts 1,
 * p0 + p1 at 2, (p0 + p1) + (p2 + p3) at 4, and so on, each add one fp32
 * rounding. The parts are backend memory; at TP N they are the ranks'
 * subtree sums, at TP 1 the halves of the group tree. y may be a part. */
typedef struct {
    const float *parts[8];
    uint32_t n_parts;
    uint32_t ld_parts;
    float *y;
    uint32_t ldy;
    uint32_t m, n;
    bool accumulate;
} hpd_tp_sum_args_t;

/* A row-parallel product's groups in one op: y = (accumulate ? y + s : s),
 * s the n_groups (1, 2, 4 or 8) products g[j] (each one gemm's args: its
 * x, its matrix, its k; m and n the same for all; their y, ldy and
 * accumulate ignored) combined by hpd_tp_tree. The bits of the gemm and
 * tp_sum calls it stands for (each group's product in the gemm op's
 * sequence, the tree's adds in fp32), in one pass over the output.
 * With first set (a mixture of experts' down projection, as
 * gemm_grouped): rows first[x] .. first[x + 1] - 1 take expert x's
 * matrices, each g[j].w holding n_experts of them one after another (FP8:
 * their scales likewise); first is backend memory.
 * Optional: the engine makes those calls without it. */
typedef struct {
    hpd_gemm_args_t g[8];
    uint32_t n_groups;
    uint32_t m, n;
    float *y;
    uint32_t ldy;
    bool accumulate;
    const uint32_t *first;
    uint32_t n_experts;
} hpd_gemm_sum_args_t;

/* Pieces of backend memory to hash for a transfer's checksum (common/hash.h):
 * span i is cut into hpd_hash_n_pieces(spans[i].bytes) pieces of
 * HPD_HASH_PIECE_BYTES, the last shorter, and out (host memory) takes each
 * piece's XXH3-64, span by span in order. Synchronous: out is written on
 * return. */
typedef struct {
    const void *ptr;
    uint64_t bytes;
} hpd_hash_span_t;

typedef struct {
    const hpd_hash_span_t *spans; /* host array */
    uint32_t n_spans;
    uint64_t *out; /* host memory */
} hpd_hash_pieces_args_t;

/* x(t, h, d) *= sigmoid(gate(t, h, d)) (attention output gate) */
typedef struct {
    hpd_view_t x, gate;
    uint32_t n_tokens, n_heads, dim;
} hpd_sigmoid_mul_args_t;

/* Paged KV for one full-attention layer of a batch. */
typedef struct {
    const hpd_kv_layout_t *layout;
    void *pool;                          /* base of the page pool */
    uint32_t member;                     /* m = a % P */
    const uint32_t *const *block_tables; /* per sequence: the pages of this layer's group */
} hpd_paged_kv_t;

/* Write K and V rows of the batch into their pages. */
typedef struct {
    hpd_paged_kv_t kv;
    hpd_view_t k, v; /* [tokens][n_kv_heads][head_dim] */
    const hpd_seq_t *seqs;
    uint32_t n_seqs;
} hpd_kv_store_args_t;

/* Causal GQA attention over paged KV: query row i of a sequence at position
 * p = start_pos + i attends to keys 0..p with online softmax, the keys cut at
 * positions fixed by p alone (the CPU: 16-token tiles; CUDA: 512-key splits
 * of 32-key tiles, merged in order), never by the batch. Prefill (many
 * queries) and decode (one) are the same op. */
typedef struct {
    hpd_paged_kv_t kv;
    hpd_view_t q;   /* [tokens][n_heads][head_dim] */
    hpd_view_t out; /* [tokens][n_heads][head_dim]; may not alias q or the pool */
    uint32_t n_heads;
    float scale;
    const hpd_seq_t *seqs;
    uint32_t n_seqs;
} hpd_attention_args_t;

/* Causal depthwise conv1d (no bias) + SiLU with a conv state per sequence.
 * state is [channels][kc-1], the last kc-1 inputs, oldest first; it is read
 * as the history and replaced by the newest inputs. */
typedef struct {
    const float *x; /* [tokens][ldx], channels used */
    uint32_t ldx;
    float *y; /* [tokens][ldy]; may not alias x */
    uint32_t ldy;
    const float *w; /* [channels][kc] */
    uint32_t channels, kc;
    float *const *states; /* per sequence, distinct (sequences run in parallel) */
    const hpd_seq_t *seqs;
    uint32_t n_seqs;
} hpd_conv1d_args_t;

/* g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b) (fp32) */
typedef struct {
    const float *a, *b;
    uint32_t lda, ldb;
    const float *a_log, *dt_bias; /* [nv] */
    float *g, *beta;              /* [tokens][nv] */
    uint32_t n_tokens, nv;
} hpd_gdn_gating_args_t;

/* The gated delta rule's q and k L2 norms and its gates in one op: the
 * same as l2norm(q), l2norm(k), gdn_gating (q.n_tokens == k.n_tokens ==
 * gate.n_tokens), the same bits on a backend whether fused or not. */
typedef struct {
    hpd_l2norm_args_t q, k;
    hpd_gdn_gating_args_t gate;
} hpd_l2norm_gating_args_t;

/* The gated delta rule for every value head of a batch. State per sequence
 * [nv][dk][dv] fp32, read and updated. Value head h uses key head h / (nv/nk).
 * q must already be L2-normalised and scaled, k L2-normalised. */
typedef struct {
    hpd_view_t q, k;   /* [tokens][nk][dk] */
    hpd_view_t v;      /* [tokens][nv][dv] */
    const float *g, *beta; /* [tokens][nv] */
    hpd_view_t out;    /* [tokens][nv][dv] */
    uint32_t nk, nv, dk, dv;
    float *const *states; /* per sequence */
    const hpd_seq_t *seqs;
    uint32_t n_seqs;
} hpd_gdn_args_t;

/* A run of tokens in paged KV: token i sits at position pos + i of the block
 * tables (page tables[g][(pos + i) / B], row (pos + i) % B). */
typedef struct {
    const hpd_kv_layout_t *layout;
    void *pool;
    const uint32_t *const *tables; /* per pack group */
    uint32_t pos;
} hpd_kv_span_t;

/* Layout translation: copies every (layer, K/V, token, head) row of n_tokens
 * tokens from src to dst, which may differ in block size, pack size and
 * order but not in dtype or KV shape. Exact (bytes equal). With zero_tail,
 * the rows after the last copied token up to the end of dst's last page are
 * zeroed. A layer range restricts the copy to some layers (a sender pushing
 * one pack group as soon as its layers are computed). */
typedef struct {
    hpd_kv_span_t src, dst;
    uint32_t n_tokens;
    bool zero_tail;
    uint32_t first_layer; /* full-attention layers [first_layer, first_layer + n_layers) */
    uint32_t n_layers;    /* 0: all layers */
    /* Some of src's KV heads (tensor parallelism: the heads a prefill rank
     * holds of a decode rank's): with heads > 0, src heads [src_head,
     * src_head + heads) go to dst heads [dst_head, dst_head + heads), the
     * other heads of dst's pages untouched (zero_tail zeroes these heads'
     * rows only); 0: every head, src and dst of the same count. */
    uint32_t src_head, heads, dst_head;
} hpd_kv_translate_args_t;

/* Whether a translation's shapes fit (both backends check the same):
 * dtype, layers and head_dim equal, the heads as hpd_kv_translate_args_t
 * says, the layer range inside the layers. */
static inline bool hpd_kv_translate_fits(const hpd_kv_translate_args_t *a)
{
    const hpd_kv_layout_t *sl = a->src.layout, *dl = a->dst.layout;
    const uint32_t l0 = a->first_layer, l1 = a->n_layers ? l0 + a->n_layers : sl->n_layers;
    const bool heads_fit = a->heads == 0
                               ? a->src_head == 0 && a->dst_head == 0 &&
                                     sl->n_kv_heads == dl->n_kv_heads
                               : a->src_head < sl->n_kv_heads &&
                                     a->heads <= sl->n_kv_heads - a->src_head &&
                                     a->dst_head < dl->n_kv_heads &&
                                     a->heads <= dl->n_kv_heads - a->dst_head;
    return sl->dtype == dl->dtype && sl->n_layers == dl->n_layers &&
           sl->head_dim == dl->head_dim && heads_fit && l1 <= sl->n_layers && l0 < l1;
}

/* Copies a GDN state slot (a checkpoint save or restore). */
typedef struct {
    void *dst;
    const void *src;
    uint64_t bytes;
} hpd_slot_copy_args_t;


/* Draw one token per row: row r uses params[r] and the counter-based RNG
 * keyed by (params[r].seed, positions[r]). */
typedef struct {
    const float *logits;
    uint32_t ld;
    uint32_t n_rows, vocab;
    const hpd_sampling_t *params;
    const uint64_t *positions;
    int32_t *out; /* host memory */
} hpd_sample_args_t;

typedef struct {
    const char *name;
    /* what the arithmetic is, for nodes that must agree on it (a cluster's
     * nodes give the same tokens only with the same numerics): "fp32" (cpu,
     * cuda), "bf16-products" (cpu-bf16; "-emulated" without AVX512_BF16),
     * "bf16-tensor-cores" (cuda-bf16),
     * "cublas" (cuda-fast), "cublas-bf16-tensor-cores" (cuda-fast on a GPU
     * where BF16 weights go to tensor cores with bf16-rounded x) */
    const char *numerics;
    /* true when backend memory is host memory (the CPU backend): the host
     * may read and write it directly */
    bool host_memory;
    void (*destroy)(hpd_backend_t *backend);
    /* Ops may run asynchronously (in order); sync waits until everything
     * enqueued has finished, before the host or another device engine (a
     * NIC) reads what they wrote. NULL: ops are synchronous. */
    hpd_status_t (*sync)(hpd_backend_t *backend);
    /* The native stream the ops run on, in order (a cudaStream_t), for a
     * transport that orders its own device work after them without
     * waiting on the host (hpd_nccl_transfer). NULL: ops are synchronous. */
    void *(*stream)(hpd_backend_t *backend);
    /* A fence after the ops enqueued so far (a CUDA event recorded on the
     * stream): a transport that must not read what they write before they
     * ran waits on it instead of on the host (hpd_xfer_put_after).
     * fence_query: 1 when they ran, 0 not yet, -1 when the device failed.
     * fence_release gives it back. NULL: ops are synchronous, no fence. */
    hpd_status_t (*fence_record)(hpd_backend_t *backend, void **fence_p);
    int (*fence_query)(hpd_backend_t *backend, void *fence);
    void (*fence_release)(hpd_backend_t *backend, void *fence);
    /* Makes host memory (a transport's staging buffer) addressable by the
     * backend's ops and fast to copy (pinned). NULL: nothing to do. */
    hpd_status_t (*host_register)(hpd_backend_t *backend, void *ptr, size_t bytes);
    void (*host_unregister)(hpd_backend_t *backend, void *ptr);
    /* memory */
    hpd_status_t (*alloc)(hpd_backend_t *backend, size_t bytes, void **ptr_p);
    void (*free)(hpd_backend_t *backend, void *ptr);
    /* Memory of a pool that peers write over RDMA (the page and slot
     * pools): a device backend takes it where a NIC can register it (CUDA:
     * cudaMalloc; memory of the stream-ordered pool cannot be registered
     * for GPUDirect RDMA). Freed with free_pool. NULL: alloc and free. */
    hpd_status_t (*alloc_pool)(hpd_backend_t *backend, size_t bytes, void **ptr_p);
    void (*free_pool)(hpd_backend_t *backend, void *ptr);
    hpd_status_t (*memset)(hpd_backend_t *backend, void *ptr, int value, size_t bytes);
    hpd_status_t (*copy)(hpd_backend_t *backend, void *dst, const void *src, size_t bytes);
    hpd_status_t (*to_host)(hpd_backend_t *backend, void *host, const void *src, size_t bytes);
    hpd_status_t (*from_host)(hpd_backend_t *backend, void *dst, const void *host, size_t bytes);
    /* kernels */
    hpd_status_t (*embed)(hpd_backend_t *backend, const hpd_embed_args_t *args);
    hpd_status_t (*gemm)(hpd_backend_t *backend, const hpd_gemm_args_t *args);
    hpd_status_t (*rmsnorm)(hpd_backend_t *backend, const hpd_rmsnorm_args_t *args);
    hpd_status_t (*gated_rmsnorm)(hpd_backend_t *backend, const hpd_gated_rmsnorm_args_t *args);
    hpd_status_t (*l2norm)(hpd_backend_t *backend, const hpd_l2norm_args_t *args);
    hpd_status_t (*rope)(hpd_backend_t *backend, const hpd_rope_args_t *args);
    hpd_status_t (*silu_mul)(hpd_backend_t *backend, const hpd_silu_mul_args_t *args);
    hpd_status_t (*sigmoid_mul)(hpd_backend_t *backend, const hpd_sigmoid_mul_args_t *args);
    hpd_status_t (*kv_store)(hpd_backend_t *backend, const hpd_kv_store_args_t *args);
    hpd_status_t (*attention)(hpd_backend_t *backend, const hpd_attention_args_t *args);
    hpd_status_t (*conv1d)(hpd_backend_t *backend, const hpd_conv1d_args_t *args);
    hpd_status_t (*conv1d_step)(hpd_backend_t *backend, const hpd_conv1d_args_t *args);
    hpd_status_t (*gdn_gating)(hpd_backend_t *backend, const hpd_gdn_gating_args_t *args);
    hpd_status_t (*gdn_chunked)(hpd_backend_t *backend, const hpd_gdn_args_t *args);
    hpd_status_t (*gdn_recurrent)(hpd_backend_t *backend, const hpd_gdn_args_t *args);
    hpd_status_t (*sample)(hpd_backend_t *backend, const hpd_sample_args_t *args);
    hpd_status_t (*kv_translate)(hpd_backend_t *backend, const hpd_kv_translate_args_t *args);
    hpd_status_t (*slot_copy)(hpd_backend_t *backend, const hpd_slot_copy_args_t *args);
    hpd_status_t (*gather)(hpd_backend_t *backend, const hpd_gather_args_t *args);
    hpd_status_t (*moe_combine)(hpd_backend_t *backend, const hpd_moe_combine_args_t *args);
    hpd_status_t (*moe_route)(hpd_backend_t *backend, const hpd_moe_route_args_t *args);
    hpd_status_t (*tp_sum)(hpd_backend_t *backend, const hpd_tp_sum_args_t *args);
    /* optional: the engine calls gemm and tp_sum without it */
    hpd_status_t (*gemm_sum)(hpd_backend_t *backend, const hpd_gemm_sum_args_t *args);
    /* optional: hpd_gemm_grouped reads first to the host and calls gemm per
     * group without it */
    hpd_status_t (*gemm_grouped)(hpd_backend_t *backend, const hpd_gemm_grouped_args_t *args);
    /* optional: hpd_l2norm_gating makes the three calls without it */
    hpd_status_t (*l2norm_gating)(hpd_backend_t *backend, const hpd_l2norm_gating_args_t *args);
    /* optional: hpd_norm_rope makes the four calls without it */
    hpd_status_t (*norm_rope)(hpd_backend_t *backend, const hpd_norm_rope_args_t *args);
    /* optional: hpd_backend_hash_pieces reads the bytes back without it */
    hpd_status_t (*hash_pieces)(hpd_backend_t *backend, const hpd_hash_pieces_args_t *args);
    /* Optional: a step's ops recorded and run as graphs (CUDA: the stream
     * captured in segments of a few dozen ops, each run as a graph, kept per
     * (bucket, segment) and updated in place, while the next is recorded;
     * a segment's metadata uploaded in one copy before it). step_begin: the
     * ops until step_end are recorded; HPD_ERR_UNSUPPORTED when this
     * backend does not record now (the ops then run as they come). Between
     * the two only kernel ops and copies between backend buffers may be
     * called: nothing that waits for the device or reads its results (the
     * backend may wait itself, to grow a buffer). step_end(run): with run
     * true, the last segment runs and *ran_p is set; with run false (an op
     * failed) the last segment is discarded, and the segments before it
     * have run: the step has failed. A status other than HPD_OK is a
     * device error. */
    hpd_status_t (*step_begin)(hpd_backend_t *backend, uint32_t bucket);
    hpd_status_t (*step_end)(hpd_backend_t *backend, bool run, bool *ran_p);
} hpd_backend_ops_t;

struct hpd_backend {
    const hpd_backend_ops_t *ops;
    void *ctx;
};

typedef struct {
    /* "cpu" (the default when NULL), "cpu-bf16" (BF16 weights multiply
     * activations rounded to bf16, as llama.cpp: faster, no longer the fp32
     * result), "cuda[:N]", "cuda-bf16[:N]" (the same on tensor cores) or
     * "cuda-fast[:N]" */
    const char *device;
    uint32_t n_threads;  /* CPU threads; 0: all cores */
} hpd_backend_params_t;

/* Creates the backend named by params->device ("cpu", "cpu-bf16", "cuda[:N]",
 * "cuda-bf16[:N]", "cuda-fast[:N]"). Failures are logged: HPD_ERR_NO_DEVICE
 * only when the machine has no GPU at all (no driver, or none visible) and a
 * GPU device was named; HPD_ERR_INVALID_ARG for a misspelt device or a GPU
 * index this machine lacks; HPD_ERR_UNSUPPORTED for cuda in a build without
 * CUDA, and for cuda-bf16 on a GPU without tensor cores; any other status is
 * a device error. */
hpd_status_t hpd_backend_create(const hpd_backend_params_t *params, hpd_backend_t **backend_p);

/* Tensor parallelism's ranks: tp backends of params' device, each with a
 * share of the threads (params->n_threads, or every core when 0, over tp;
 * at least one). On failure none is left (the status is the failed one's). */
hpd_status_t hpd_backend_create_ranks(const hpd_backend_params_t *params, uint32_t tp,
                                      hpd_backend_t **backends);

/* Destroys a backend. Accepts NULL. */
void hpd_backend_destroy(hpd_backend_t *backend);

/* The CPU backend. */
hpd_status_t hpd_backend_cpu_create(const hpd_backend_params_t *params,
                                    hpd_backend_t **backend_p);

/* The CUDA backend (builds with the CUDA toolkit): device "cuda" or
 * "cuda:N" (deterministic, the default), "cuda-bf16[:N]" (deterministic,
 * BF16 weights times bf16-rounded activations on tensor cores), "cuda-fast"
 * or "cuda-fast:N" (GEMMs through cuBLAS: faster, not batch-invariant). HPD_ERR_NO_DEVICE when the
 * machine has no GPU (see hpd_backend_cuda_count). */
hpd_status_t hpd_backend_cuda_create(const hpd_backend_params_t *params,
                                     hpd_backend_t **backend_p);

/* The number of GPUs the CUDA runtime sees (> 0). HPD_ERR_NO_DEVICE when there
 * is none at all: no GPU visible, or no driver installed. Any other runtime
 * error (a driver older than the runtime needs, a broken install) is logged
 * with CUDA's message and answered HPD_ERR_INTERNAL: it is not an absence. */
hpd_status_t hpd_backend_cuda_count(int *count_p);

#define HPD_BACKEND_CALL(backend, op, ...)                                    \
    ((backend)->ops->op != NULL ? (backend)->ops->op((backend), __VA_ARGS__) \
                                : HPD_ERR_UNSUPPORTED)

static inline bool hpd_backend_host_memory(const hpd_backend_t *b)
{
    return b->ops->host_memory;
}
static inline hpd_status_t hpd_backend_sync(hpd_backend_t *b)
{
    return b->ops->sync != NULL ? b->ops->sync(b) : HPD_OK;
}
/* A fence after the ops enqueued so far; *fence_p NULL when there is
 * nothing to wait for: ops are synchronous, or the backend has no fences
 * and this waited for its ops (sync). */
static inline hpd_status_t hpd_backend_fence_record(hpd_backend_t *b, void **fence_p)
{
    *fence_p = NULL;
    return b->ops->fence_record != NULL ? b->ops->fence_record(b, fence_p)
                                        : hpd_backend_sync(b);
}
/* 1: the ops before the fence ran (always for a NULL fence); 0: not yet;
 * -1: the device failed. */
static inline int hpd_backend_fence_query(hpd_backend_t *b, void *fence)
{
    return fence == NULL || b->ops->fence_query == NULL ? 1 : b->ops->fence_query(b, fence);
}
static inline void hpd_backend_fence_release(hpd_backend_t *b, void *fence)
{
    if (fence != NULL && b->ops->fence_release != NULL)
        b->ops->fence_release(b, fence);
}
/* The backend's native stream, or NULL when its ops are synchronous. */
static inline void *hpd_backend_stream(hpd_backend_t *b)
{
    return b->ops->stream != NULL ? b->ops->stream(b) : NULL;
}
static inline hpd_status_t hpd_backend_host_register(hpd_backend_t *b, void *ptr, size_t n)
{
    return b->ops->host_register != NULL ? b->ops->host_register(b, ptr, n) : HPD_OK;
}
static inline void hpd_backend_host_unregister(hpd_backend_t *b, void *ptr)
{
    if (b->ops->host_unregister != NULL && ptr != NULL)
        b->ops->host_unregister(b, ptr);
}
static inline hpd_status_t hpd_backend_alloc(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    return HPD_BACKEND_CALL(b, alloc, bytes, ptr_p);
}
static inline void hpd_backend_free(hpd_backend_t *b, void *ptr)
{
    if (ptr != NULL)
        b->ops->free(b, ptr);
}
/* Memory for a pool that peers may write over RDMA (backend ops
 * alloc_pool); freed with hpd_backend_free_pool. */
static inline hpd_status_t hpd_backend_alloc_pool(hpd_backend_t *b, size_t bytes, void **ptr_p)
{
    return b->ops->alloc_pool != NULL ? b->ops->alloc_pool(b, bytes, ptr_p)
                                      : hpd_backend_alloc(b, bytes, ptr_p);
}
static inline void hpd_backend_free_pool(hpd_backend_t *b, void *ptr)
{
    if (ptr != NULL)
        (b->ops->free_pool != NULL ? b->ops->free_pool : b->ops->free)(b, ptr);
}
static inline hpd_status_t hpd_backend_memset(hpd_backend_t *b, void *ptr, int v, size_t n)
{
    return HPD_BACKEND_CALL(b, memset, ptr, v, n);
}
static inline hpd_status_t hpd_backend_copy(hpd_backend_t *b, void *dst, const void *src,
                                            size_t n)
{
    return HPD_BACKEND_CALL(b, copy, dst, src, n);
}
static inline hpd_status_t hpd_backend_to_host(hpd_backend_t *b, void *host, const void *src,
                                               size_t n)
{
    return HPD_BACKEND_CALL(b, to_host, host, src, n);
}
static inline hpd_status_t hpd_backend_from_host(hpd_backend_t *b, void *dst, const void *host,
                                                 size_t n)
{
    return HPD_BACKEND_CALL(b, from_host, dst, host, n);
}
static inline hpd_status_t hpd_embed(hpd_backend_t *b, const hpd_embed_args_t *a)
{
    return HPD_BACKEND_CALL(b, embed, a);
}
static inline hpd_status_t hpd_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    return HPD_BACKEND_CALL(b, gemm, a);
}
static inline hpd_status_t hpd_rmsnorm(hpd_backend_t *b, const hpd_rmsnorm_args_t *a)
{
    return HPD_BACKEND_CALL(b, rmsnorm, a);
}
static inline hpd_status_t hpd_gated_rmsnorm(hpd_backend_t *b, const hpd_gated_rmsnorm_args_t *a)
{
    return HPD_BACKEND_CALL(b, gated_rmsnorm, a);
}
static inline hpd_status_t hpd_l2norm(hpd_backend_t *b, const hpd_l2norm_args_t *a)
{
    return HPD_BACKEND_CALL(b, l2norm, a);
}
static inline hpd_status_t hpd_rope(hpd_backend_t *b, const hpd_rope_args_t *a)
{
    return HPD_BACKEND_CALL(b, rope, a);
}
static inline hpd_status_t hpd_silu_mul(hpd_backend_t *b, const hpd_silu_mul_args_t *a)
{
    return HPD_BACKEND_CALL(b, silu_mul, a);
}
static inline hpd_status_t hpd_sigmoid_mul(hpd_backend_t *b, const hpd_sigmoid_mul_args_t *a)
{
    return HPD_BACKEND_CALL(b, sigmoid_mul, a);
}
static inline hpd_status_t hpd_kv_store(hpd_backend_t *b, const hpd_kv_store_args_t *a)
{
    return HPD_BACKEND_CALL(b, kv_store, a);
}
static inline hpd_status_t hpd_attention(hpd_backend_t *b, const hpd_attention_args_t *a)
{
    return HPD_BACKEND_CALL(b, attention, a);
}
static inline hpd_status_t hpd_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a)
{
    return HPD_BACKEND_CALL(b, conv1d, a);
}
static inline hpd_status_t hpd_conv1d_step(hpd_backend_t *b, const hpd_conv1d_args_t *a)
{
    return HPD_BACKEND_CALL(b, conv1d_step, a);
}
static inline hpd_status_t hpd_gdn_gating(hpd_backend_t *b, const hpd_gdn_gating_args_t *a)
{
    return HPD_BACKEND_CALL(b, gdn_gating, a);
}
static inline hpd_status_t hpd_gdn_chunked(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    return HPD_BACKEND_CALL(b, gdn_chunked, a);
}
static inline hpd_status_t hpd_gdn_recurrent(hpd_backend_t *b, const hpd_gdn_args_t *a)
{
    return HPD_BACKEND_CALL(b, gdn_recurrent, a);
}
static inline hpd_status_t hpd_sample(hpd_backend_t *b, const hpd_sample_args_t *a)
{
    return HPD_BACKEND_CALL(b, sample, a);
}

static inline hpd_status_t hpd_kv_translate(hpd_backend_t *b, const hpd_kv_translate_args_t *a)
{
    return HPD_BACKEND_CALL(b, kv_translate, a);
}
static inline hpd_status_t hpd_slot_copy(hpd_backend_t *b, const hpd_slot_copy_args_t *a)
{
    return HPD_BACKEND_CALL(b, slot_copy, a);
}

static inline hpd_status_t hpd_gather(hpd_backend_t *b, const hpd_gather_args_t *a)
{
    return HPD_BACKEND_CALL(b, gather, a);
}

static inline hpd_status_t hpd_moe_combine(hpd_backend_t *b, const hpd_moe_combine_args_t *a)
{
    return HPD_BACKEND_CALL(b, moe_combine, a);
}

static inline hpd_status_t hpd_moe_route(hpd_backend_t *b, const hpd_moe_route_args_t *a)
{
    return HPD_BACKEND_CALL(b, moe_route, a);
}
static inline hpd_status_t hpd_tp_sum(hpd_backend_t *b, const hpd_tp_sum_args_t *a)
{
    return HPD_BACKEND_CALL(b, tp_sum, a);
}
static inline hpd_status_t hpd_gemm_sum(hpd_backend_t *b, const hpd_gemm_sum_args_t *a)
{
    return HPD_BACKEND_CALL(b, gemm_sum, a);
}
/* What every backend's moe_route takes: 1 to HPD_MAX_EXPERTS experts, 1 to
 * HPD_MAX_TOPK of them a token, rows of at least n_experts logits; else
 * HPD_ERR_INVALID_ARG, logged with the values. */
hpd_status_t hpd_moe_route_check(const hpd_moe_route_args_t *a);

/* hpd_gemm_grouped_args_t: the backend's op where it has one, else first
 * read by the host (a device backend copies it: the stream waits) and a
 * gemm per group that has rows. */
hpd_status_t hpd_gemm_grouped(hpd_backend_t *b, const hpd_gemm_grouped_args_t *a);

/* hpd_norm_rope_args_t: the backend's fused op where it has one (one launch
 * on a GPU instead of four), else rmsnorm, rmsnorm, rope, rope. */
hpd_status_t hpd_norm_rope(hpd_backend_t *b, const hpd_norm_rope_args_t *a);
/* the four calls (a backend's op falls back to them for shapes it lacks) */
hpd_status_t hpd_norm_rope_unfused(hpd_backend_t *b, const hpd_norm_rope_args_t *a);

/* hpd_l2norm_gating_args_t: the backend's fused op where it has one, else
 * l2norm, l2norm, gdn_gating. */
hpd_status_t hpd_l2norm_gating(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a);
hpd_status_t hpd_l2norm_gating_unfused(hpd_backend_t *b, const hpd_l2norm_gating_args_t *a);

/* A step recorded whole (hpd_backend_ops_t step_begin): HPD_ERR_UNSUPPORTED
 * where the backend runs ops as they come. */
static inline hpd_status_t hpd_backend_step_begin(hpd_backend_t *b, uint32_t bucket)
{
    return b->ops->step_begin != NULL ? b->ops->step_begin(b, bucket) : HPD_ERR_UNSUPPORTED;
}
static inline hpd_status_t hpd_backend_step_end(hpd_backend_t *b, bool run, bool *ran_p)
{
    *ran_p = false;
    return b->ops->step_end != NULL ? b->ops->step_end(b, run, ran_p) : HPD_OK;
}

/* The pieces' hashes of backend memory (hpd_hash_pieces_args_t): the
 * backend's own op where it has one (the GPU hashes what it holds), else the
 * bytes read to the host piece by piece and hashed there. */
hpd_status_t hpd_backend_hash_pieces(hpd_backend_t *b, const hpd_hash_pieces_args_t *a);

/* sigmoid as both backends compute it for the shared expert's gate */
static inline HPD_HOST_DEVICE float hpd_sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* The chunk length of the chunked gated delta rule; chunks sit on multiples
 * of it in absolute positions. */
#define HPD_GDN_CHUNK 64
/* Keys per attention tile. */
#define HPD_ATTN_TILE 16

#endif
