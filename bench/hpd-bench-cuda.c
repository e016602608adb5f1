/* hpd-bench-cuda: the kernel library on a device, each figure beside a
 * reference measured in the same run (docs/kernels.md, "Benchmarks").
 *
 *   hpd-bench-cuda [--device cuda:0] [--seqs N] [--context N] [--prefill N]
 *                  [--model DIR] [--reps N] [--copy-mib N] [--threads N]
 *
 * - copy: device-to-device copy bandwidth of --copy-mib (1024) MiB (bytes
 *   read + written per second), the reference of the memory-bound kernels;
 * - gdn_recurrent: one decode step of --seqs sequences with Qwen3-Next's GDN
 *   dims (16 key heads, 32 value heads, dk = dv = 128): state bytes read +
 *   written per second, as a fraction of the copy bandwidth;
 * - attention: one decode row for each of --seqs sequences of --context
 *   tokens (16 heads, 2 KV heads, head_dim 256, 64-token NHD pages): KV bytes
 *   read per second, as a fraction of the copy bandwidth, and the same on
 *   cuda-bf16 (tensor cores: bf16_device_of_copy); these two also as the
 *   engine's decode step runs them, 8 calls recorded in a step (on a GPU a
 *   CUDA graph, the metadata uploaded at once; steps do not overlap, so
 *   the host's recording counts): recorded_of_copy, where the backend
 *   records;
 * - gdn_chunked: prefill of --prefill tokens for 1 and 4 sequences, tokens/s,
 *   and on cuda-bf16 (its state pass on tensor cores: bf16_device_ms; with
 *   its chunk buffers forced to one and two: bf16_bufs1_ms, bf16_bufs2_ms);
 * - translate: --context tokens of 12 full-attention layers from B=64,P=1
 *   NHD to B=16,P=4 HND, against a copy of the same bytes;
 * - gemv: the GEMM of decode, BF16 weights 5120x2048 and 2048x5120 at m = 1,
 *   8, 32 (the GEMV) and 64 (the tiled kernel): weight bytes read per second,
 *   as a fraction of the copy bandwidth;
 * - gemm: the GEMM of prefill, m = --prefill rows, BF16 weights n = 5120,
 *   k = 2048: TFLOP/s, beside cuBLAS on the same shape (cublasGemmEx, BF16 x
 *   BF16 with fp32 accumulation and output) when the device is a GPU, and
 *   the same GEMM through device cuda-fast (BF16 weights on tensor cores,
 *   x rounded to bf16: tensor_cores_of_cublas) and through the deterministic
 *   cuda-bf16 (bf16_device_of_cublas), whose decode GEMM the gemv lines
 *   show too (bf16_device_of_copy); these take the tiled kernel's blocks by
 *   shape (here the wide 128 x 256), bf16_narrow_of_cublas the narrow ones
 *   (HPD_CUDA_GEMM_BN=128);
 * - checksum: the pieces' hashes of a transfer's checksum (common/hash.h)
 *   over 256 MiB of device memory in 64 KiB pages, as a receiver hashes the
 *   pages peers wrote: bytes hashed per second as a fraction of the copy
 *   bandwidth, beside the way without the backend's op (each piece read back
 *   to the host and hashed there) in the same run;
 * - sample: --seqs rows of a 151936-token vocabulary, greedy, and top-p 0.9
 *   without top-k on peaked logits (the sorted path) and nearly flat ones
 *   (the bisection), each against greedy's time;
 * - moe_layer: an MoE layer's experts with Qwen3-Next's shape (512 experts,
 *   10 a token, BF16 weights) at 1 and --seqs tokens, routed on the device
 *   (moe_route, grouped GEMMs), beside the way before (routing on the host,
 *   a GEMM per expert: speedup) and against the experts hit read once at the
 *   copy bandwidth (of_bound), on the device and on cuda-bf16;
 * - with --model (e.g. hpd-mkmodel with Qwen3-Next's dims and fewer layers):
 *   prefill tokens/s of one --prefill prompt, and decode tokens/s at batch 1
 *   and --seqs, on the device and again on cuda-bf16 (device= names each), decode beside its bound (the weights a step reads, all but an
 *   untied embedding's table, read once at the copy bandwidth, the rate
 *   the GEMV lines are measured against; it was the copy's half, and an
 *   untied table counted whole, until the first GPU run showed 1.04 of it).
 * Lines are "name key=value ..." for bench/cuda.sh, which sets them beside
 * flash-linear-attention's kernels on the same shapes. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "engine/engine.h"
#include "kernels/moe_route.h"

#ifdef HPD_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

static hpd_backend_t *be;
static int reps = 20;

#define CHECK(call)                                                                   \
    do {                                                                              \
        hpd_status_t st_ = (call);                                                    \
        if (st_ != HPD_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
                    hpd_status_str(st_));                                             \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static void *dalloc(size_t bytes)
{
    void *p;
    CHECK(hpd_backend_alloc(be, bytes, &p));
    return p;
}

/* a device buffer of n floats, scale * N(0, 1) */
static float *drand(size_t n, uint64_t seed, float scale)
{
    float *h = malloc(n * sizeof(float)), *d = dalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        hpd_philox_out_t r = hpd_philox4x32(seed, i, 0);
        const float u1 = hpd_u32_to_unit(r.v[0]) + 1e-7f, u2 = hpd_u32_to_unit(r.v[1]);
        h[i] = scale * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    }
    CHECK(hpd_backend_from_host(be, d, h, n * sizeof(float)));
    free(h);
    return d;
}

static float *dfill(size_t n, float lo, float hi, uint64_t seed)
{
    float *h = malloc(n * sizeof(float)), *d = dalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * hpd_rng_uniform(seed, i);
    CHECK(hpd_backend_from_host(be, d, h, n * sizeof(float)));
    free(h);
    return d;
}

/* Seconds per call of fn(arg): one warm-up call, then the best mean of 3
 * rounds of `reps` calls, synchronised around each round. */
static hpd_backend_t *other_be; /* cuda-fast or cuda-bf16 beside the device under test */

/* every stream the timed ops may use: the device's and the other's */
static void sync_all(void)
{
    CHECK(hpd_backend_sync(be));
    if (other_be != NULL)
        CHECK(hpd_backend_sync(other_be));
}

static double timed(void (*fn)(void *), void *arg)
{
    double best = INFINITY;
    fn(arg);
    sync_all();
    for (int round = 0; round < 3; round++) {
        const double t0 = hpd_time_now();
        for (int i = 0; i < reps; i++)
            fn(arg);
        sync_all();
        const double t = (hpd_time_now() - t0) / reps;
        best = t < best ? t : best;
    }
    return best;
}

/* A decode step's ops as the engine runs them (hpd_backend_step_begin: on
 * CUDA recorded into a graph, the step's metadata uploaded at once):
 * RECORD_OPS calls of fn in one step, timed as a step, per call. Steps do
 * not overlap (a step begins once the last has run), so this is the op's
 * share of a step's latency: the host's recording and the graph's update
 * and launch, then the device's work. < 0 where the backend does not
 * record */
#define RECORD_OPS 8
typedef struct {
    void (*fn)(void *);
    void *arg;
} recorded_t;

/* One step of RECORD_OPS calls; HPD_ERR_UNSUPPORTED (the calls then made
 * op by op) where the backend does not record */
static hpd_status_t record_step(const recorded_t *r, bool *ran_p)
{
    const hpd_status_t st = hpd_backend_step_begin(be, 1);
    if (st != HPD_OK && st != HPD_ERR_UNSUPPORTED)
        return st;
    for (int i = 0; i < RECORD_OPS; i++)
        r->fn(r->arg);
    return st == HPD_OK ? hpd_backend_step_end(be, true, ran_p) : st;
}

static void do_recorded(void *arg)
{
    bool ran = false;
    const hpd_status_t st = record_step(arg, &ran);
    if (st != HPD_ERR_UNSUPPORTED) /* (graphs turned off since: op by op) */
        CHECK(st);
}

static double timed_recorded(void (*fn)(void *), void *arg)
{
    const recorded_t r = {fn, arg};
    bool ran = false;
    const hpd_status_t st = hpd_backend_step_begin(be, 1); /* does it record? */
    if (st == HPD_ERR_UNSUPPORTED)
        return -1;
    CHECK(st);
    CHECK(hpd_backend_step_end(be, false, &ran)); /* (nothing recorded, nothing run) */
    CHECK(record_step(&r, &ran));
    if (!ran)
        return -1;
    return timed(do_recorded, (void *)&r) / RECORD_OPS;
}

/* ----------------------------------------------------------------- copy */

typedef struct {
    void *dst, *src;
    size_t bytes;
} copy_t;

static void do_copy(void *arg)
{
    copy_t *c = arg;
    CHECK(hpd_backend_copy(be, c->dst, c->src, c->bytes));
}

static double copy_bandwidth(size_t bytes)
{
    copy_t c = {dalloc(bytes), dalloc(bytes), bytes};
    CHECK(hpd_backend_memset(be, c.src, 1, bytes));
    const double t = timed(do_copy, &c);
    hpd_backend_free(be, c.dst);
    hpd_backend_free(be, c.src);
    return 2.0 * (double)bytes / t;
}

/* ------------------------------------------------------------------ GDN */

enum { NK = 16, NV = 32, DK = 128, DV = 128 };

typedef struct {
    hpd_gdn_args_t a;
    bool chunked;
} gdn_t;

static void do_gdn(void *arg)
{
    gdn_t *g = arg;
    CHECK(g->chunked ? hpd_gdn_chunked(be, &g->a) : hpd_gdn_recurrent(be, &g->a));
}

/* n_seqs sequences of len tokens each; rec_p: also the op recorded in a
 * step (timed_recorded), or NULL */
static double gdn_seconds(uint32_t n_seqs, uint32_t len, bool chunked, double *rec_p)
{
    const uint32_t T = n_seqs * len;
    const size_t state = (size_t)NV * DK * DV;
    float *q = drand((size_t)T * NK * DK, 1, 0.088f), *k = drand((size_t)T * NK * DK, 2, 0.088f);
    float *v = drand((size_t)T * NV * DV, 3, 1), *out = dalloc((size_t)T * NV * DV * 4);
    float *g = dfill((size_t)T * NV, -0.2f, -0.01f, 4), *beta = dfill((size_t)T * NV, 0.1f, 0.9f, 5);
    float *S = drand(state * n_seqs, 6, 0.01f);
    float **states = malloc(n_seqs * sizeof(float *));
    hpd_seq_t *seqs = malloc(n_seqs * sizeof(hpd_seq_t));
    for (uint32_t s = 0; s < n_seqs; s++) {
        states[s] = S + state * s;
        seqs[s] = (hpd_seq_t){.row = s * len, .n_tokens = len};
    }
    gdn_t run = {{{q, NK * DK, DK}, {k, NK * DK, DK}, {v, NV * DV, DV}, g, beta,
                  {out, NV * DV, DV}, NK, NV, DK, DV, states, seqs, n_seqs},
                 chunked};
    const double t = timed(do_gdn, &run);
    if (rec_p != NULL)
        *rec_p = timed_recorded(do_gdn, &run);
    float *bufs[] = {q, k, v, out, g, beta, S};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(bufs); i++)
        hpd_backend_free(be, bufs[i]);
    free(states);
    free(seqs);
    return t;
}

/* ------------------------------------------------------------ attention */

enum { NH = 16, NKV = 2, HD = 256, ALAYERS = 12 };

static void do_attention(void *arg)
{
    CHECK(hpd_attention(be, arg));
}

/* n_seqs sequences of `context` keys, each with its last `rows` tokens as
 * query rows (1: decode; context: a whole prompt); rec_p: also the op
 * recorded in a step (timed_recorded), or NULL */
static double attention_seconds(uint32_t n_seqs, uint32_t context, uint32_t rows,
                                uint64_t *kv_bytes_p, double *rec_p)
{
    hpd_kv_layout_t l = {.block_size = 64,
                         .pack_size = 1,
                         .order = HPD_KV_NHD,
                         .dtype = HPD_DTYPE_F32,
                         .n_layers = 1,
                         .n_kv_heads = NKV,
                         .head_dim = HD};
    const uint32_t nb = HPD_DIV_UP(context, 64), pages = nb * n_seqs;
    float *pool = drand((size_t)pages * hpd_kv_layout_page_elems(&l), 7, 1);
    const size_t qn = (size_t)n_seqs * rows * NH * HD;
    float *q = drand(qn, 8, 1), *out = dalloc(qn * 4);
    uint32_t *ids = malloc((size_t)pages * sizeof(uint32_t));
    const uint32_t **tables = malloc(n_seqs * sizeof(*tables));
    hpd_seq_t *seqs = malloc(n_seqs * sizeof(hpd_seq_t));
    for (uint32_t i = 0; i < pages; i++) /* scattered pages: a shuffled identity */
        ids[i] = i;
    for (uint32_t i = pages - 1; i > 0; i--) {
        const uint32_t j = hpd_philox4x32(9, i, 0).v[0] % (i + 1), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (uint32_t s = 0; s < n_seqs; s++) {
        tables[s] = ids + (size_t)s * nb;
        seqs[s] = (hpd_seq_t){.row = s * rows, .n_tokens = rows, .start_pos = context - rows};
    }
    hpd_attention_args_t a = {.kv = {.layout = &l, .pool = pool, .block_tables = tables},
                              .q = {.p = q, .ld = NH * HD, .hs = HD},
                              .out = {.p = out, .ld = NH * HD, .hs = HD},
                              .n_heads = NH,
                              .scale = 1.0f / 16.0f,
                              .seqs = seqs,
                              .n_seqs = n_seqs};
    const double t = timed(do_attention, &a);
    if (rec_p != NULL)
        *rec_p = timed_recorded(do_attention, &a);
    *kv_bytes_p = (uint64_t)n_seqs * context * 2 * NKV * HD * sizeof(float);
    hpd_backend_free(be, pool);
    hpd_backend_free(be, q);
    hpd_backend_free(be, out);
    free(ids);
    free(tables);
    free(seqs);
    return t;
}

/* ------------------------------------------------------------- checksum */

typedef struct {
    hpd_backend_t *b;
    hpd_hash_pieces_args_t a;
} hash_t;

static void do_hash(void *arg)
{
    hash_t *h = arg;
    CHECK(hpd_backend_hash_pieces(h->b, &h->a));
}

static void checksum_bench(double copy_bw)
{
    enum { PAGE = 64 << 10, PAGES = 4096 };
    const size_t bytes = (size_t)PAGE * PAGES;
    uint8_t *dev = dalloc(bytes);
    CHECK(hpd_backend_memset(be, dev, 7, bytes));
    hpd_hash_span_t *spans = malloc(PAGES * sizeof(*spans));
    uint64_t *out = malloc(PAGES * sizeof(*out));
    for (uint32_t i = 0; i < PAGES; i++)
        spans[i] = (hpd_hash_span_t){dev + (size_t)i * PAGE, PAGE};
    hash_t h = {be, {spans, PAGES, out}};
    const double t = timed(do_hash, &h);
    /* the reference: the same backend without its op (read back, hashed on
     * the host) */
    hpd_backend_ops_t ops = *be->ops;
    ops.hash_pieces = NULL;
    hpd_backend_t host_path = {&ops, be->ctx};
    hash_t r = {&host_path, {spans, PAGES, out}};
    const int saved = reps;
    reps = 2;
    const double th = timed(do_hash, &r);
    reps = saved;
    printf("checksum bytes=%zu pages=%u ms=%.3f GBps=%.1f of_copy=%.3f host_ms=%.3f "
           "host_GBps=%.1f of_host=%.2f\n",
           bytes, PAGES, t * 1e3, bytes / t / 1e9, bytes / t / copy_bw, th * 1e3,
           bytes / th / 1e9, th / t);
    free(spans);
    free(out);
    hpd_backend_free(be, dev);
}

/* ------------------------------------------------------------ translate */

static void do_translate(void *arg)
{
    CHECK(hpd_kv_translate(be, arg));
}

static void translate_vs_copy(uint32_t tokens)
{
    hpd_kv_layout_t sl = {.block_size = 64,
                          .pack_size = 1,
                          .order = HPD_KV_NHD,
                          .dtype = HPD_DTYPE_F32,
                          .n_layers = ALAYERS,
                          .n_kv_heads = NKV,
                          .head_dim = HD};
    hpd_kv_layout_t dl = {.block_size = 16,
                          .pack_size = 4,
                          .order = HPD_KV_HND,
                          .dtype = HPD_DTYPE_F32,
                          .n_layers = ALAYERS,
                          .n_kv_heads = NKV,
                          .head_dim = HD};
    const uint32_t sg = hpd_kv_layout_n_groups(&sl), dg = hpd_kv_layout_n_groups(&dl);
    const uint32_t snb = HPD_DIV_UP(tokens, 64), dnb = HPD_DIV_UP(tokens, 16);
    const uint64_t sbytes = (uint64_t)sg * snb * hpd_kv_layout_page_bytes(&sl);
    const uint64_t dbytes = (uint64_t)dg * dnb * hpd_kv_layout_page_bytes(&dl);
    void *src = drand(sbytes / 4, 10, 1), *dst = dalloc(dbytes);
    uint32_t *sid = malloc((size_t)sg * snb * 4), *did = malloc((size_t)dg * dnb * 4);
    const uint32_t *st[ALAYERS], *dt[ALAYERS];
    for (uint32_t i = 0; i < sg * snb; i++)
        sid[i] = i;
    for (uint32_t i = 0; i < dg * dnb; i++)
        did[i] = dg * dnb - 1 - i;
    for (uint32_t g = 0; g < sg; g++)
        st[g] = sid + (size_t)g * snb;
    for (uint32_t g = 0; g < dg; g++)
        dt[g] = did + (size_t)g * dnb;
    hpd_kv_translate_args_t a = {.src = {.layout = &sl, .pool = src, .tables = st},
                                 .dst = {.layout = &dl, .pool = dst, .tables = dt},
                                 .n_tokens = tokens,
                                 .zero_tail = true};
    const double t = timed(do_translate, &a);
    const uint64_t moved = (uint64_t)tokens * ALAYERS * 2 * NKV * HD * sizeof(float);
    copy_t c = {dst, src, moved};
    const double tc = timed(do_copy, &c);
    printf("translate tokens=%u layers=%u bytes=%llu ms=%.4f copy_ms=%.4f GBps=%.1f "
           "copy_GBps=%.1f ratio=%.3f\n",
           tokens, ALAYERS, (unsigned long long)moved, t * 1e3, tc * 1e3, 2.0 * moved / t / 1e9,
           2.0 * moved / tc / 1e9, tc / t);
    hpd_backend_free(be, src);
    hpd_backend_free(be, dst);
    free(sid);
    free(did);
}

/* ----------------------------------------------------------------- GEMM */

/* a device buffer of n BF16 values, scale * N(0, 1) */
static void *dbf16(size_t n, uint64_t seed, float scale)
{
    float *f = drand(n, seed, scale), *h = malloc(n * sizeof(float));
    uint16_t *b = malloc(n * 2);
    void *d = dalloc(n * 2);
    CHECK(hpd_backend_to_host(be, h, f, n * sizeof(float)));
    hpd_dtype_from_f32(HPD_DTYPE_BF16, h, b, n);
    CHECK(hpd_backend_from_host(be, d, b, n * 2));
    hpd_backend_free(be, f);
    free(h);
    free(b);
    return d;
}

static void do_gemm(void *arg)
{
    CHECK(hpd_gemm(be, arg));
}

/* decode's GEMM: rows of m at a time against BF16 weights [n][k] */
static void do_gemm_other(void *arg)
{
    CHECK(hpd_gemm(other_be, arg));
}

/* The device `kind` (cuda-fast, cuda-bf16) on the GPU of the device under
 * test (its ":N"), or NULL where it cannot be opened. */
static hpd_backend_t *open_sibling(const char *kind, const char *device)
{
    char name[64];
    const char *colon = strchr(device, ':');
    snprintf(name, sizeof(name), "%s%s", kind, colon != NULL ? colon : "");
    hpd_backend_params_t p = {.device = name};
    hpd_backend_t *b;
    return strncmp(device, "cuda", 4) == 0 && hpd_backend_create(&p, &b) == HPD_OK ? b : NULL;
}

static void gemv_bench(uint32_t n, uint32_t k, double copy_bw, const char *device)
{
    static const uint32_t ms[] = {1, 8, 32, 64};
    void *w = dbf16((size_t)n * k, 20, 0.02f);
    float *x = drand((size_t)64 * k, 21, 1), *y = dalloc((size_t)64 * n * sizeof(float));
    const double bytes = (double)n * k * 2;
    /* beside it, the deterministic GEMM on tensor cores (cuda-bf16) */
    other_be = open_sibling("cuda-bf16", device);
    for (size_t i = 0; i < HPD_ARRAY_SIZE(ms); i++) {
        hpd_gemm_args_t a = {.x = x, .ldx = k, .w = w, .w_dtype = HPD_DTYPE_BF16, .y = y,
                             .ldy = n, .m = ms[i], .n = n, .k = k};
        const double t = timed(do_gemm, &a);
        printf("gemv n=%u k=%u m=%u dtype=bf16 ms=%.4f GBps=%.1f of_copy=%.3f", n, k, ms[i],
               t * 1e3, bytes / t / 1e9, bytes / t / copy_bw);
        if (other_be != NULL) {
            const double tb = timed(do_gemm_other, &a);
            printf(" bf16_device_ms=%.4f bf16_device_of_copy=%.3f", tb * 1e3,
                   bytes / tb / copy_bw);
        }
        printf("\n");
    }
    if (other_be != NULL)
        hpd_backend_destroy(other_be);
    other_be = NULL;
    hpd_backend_free(be, w);
    hpd_backend_free(be, x);
    hpd_backend_free(be, y);
}

#ifdef HPD_HAVE_CUDA
/* Seconds per cuBLAS GEMM y[m][n] = x[m][k] w[n][k]^T, BF16 x BF16, fp32
 * accumulation and output, timed as timed() does; 0 where it fails. */
static double cublas_seconds(const void *x16, const void *w, float *y, uint32_t m, uint32_t n,
                             uint32_t k)
{
    cublasHandle_t h;
    const float alpha = 1.0f, beta = 0.0f;
    double best = INFINITY;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return 0;
    CHECK(hpd_backend_sync(be));
    for (int round = -1; round < 3; round++) { /* round -1: one warm-up call */
        const double t0 = hpd_time_now();
        for (int i = 0; i < (round < 0 ? 1 : reps); i++) {
            /* row-major y = x w^T is column-major y^T = w^T-as-stored x^T-as-stored */
            const cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m,
                                                   (int)k, &alpha, w, CUDA_R_16BF, (int)k, x16,
                                                   CUDA_R_16BF, (int)k, &beta, y, CUDA_R_32F,
                                                   (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (cs != CUBLAS_STATUS_SUCCESS) {
                fprintf(stderr, "cublasGemmEx %ux%ux%u failed: status %d\n", m, n, k, (int)cs);
                cublasDestroy(h);
                return 0;
            }
        }
        if (cudaDeviceSynchronize() != cudaSuccess) {
            cublasDestroy(h);
            return 0;
        }
        const double t = (hpd_time_now() - t0) / reps;
        if (round >= 0 && t < best)
            best = t;
    }
    cublasDestroy(h);
    return best;
}
#endif


/* prefill's GEMM: m rows against BF16 weights [n][k], beside cuBLAS; and
 * the same through device cuda-fast (tensor cores, x rounded to bf16) */
static double gemm_bench(uint32_t m, uint32_t n, uint32_t k, const char *device)
{
    double cublas_tflops = 0;
    void *w = dbf16((size_t)n * k, 22, 0.02f);
    float *x = drand((size_t)m * k, 23, 1), *y = dalloc((size_t)m * n * sizeof(float));
    hpd_gemm_args_t a = {.x = x, .ldx = k, .w = w, .w_dtype = HPD_DTYPE_BF16, .y = y,
                         .ldy = n, .m = m, .n = n, .k = k};
    const double flop = 2.0 * m * n * k, t = timed(do_gemm, &a);
    printf("gemm m=%u n=%u k=%u dtype=bf16 ms=%.3f TFLOPs=%.2f", m, n, k, t * 1e3,
           flop / t / 1e12);
#ifdef HPD_HAVE_CUDA
    if (!hpd_backend_host_memory(be)) {
        float *h = malloc((size_t)m * k * sizeof(float));
        uint16_t *b = malloc((size_t)m * k * 2);
        void *x16 = dalloc((size_t)m * k * 2);
        CHECK(hpd_backend_to_host(be, h, x, (size_t)m * k * sizeof(float)));
        hpd_dtype_from_f32(HPD_DTYPE_BF16, h, b, (size_t)m * k);
        CHECK(hpd_backend_from_host(be, x16, b, (size_t)m * k * 2));
        const double tc = cublas_seconds(x16, w, y, m, n, k);
        if (tc > 0) {
            cublas_tflops = flop / tc / 1e12;
            printf(" cublas_ms=%.3f cublas_TFLOPs=%.2f of_cublas=%.3f", tc * 1e3, cublas_tflops,
                   tc / t);
        }
        else
            printf(" cublas=failed");
        /* tensor cores: cuda-fast's (tiled for every m here) and the
         * deterministic cuda-bf16's, with the blocks chosen by shape (at
         * this size the wide ones) and with the narrow ones forced
         * (HPD_CUDA_GEMM_BN=128: the same bits) */
        static const char *kinds[] = {"cuda-fast", "cuda-bf16", "cuda-bf16"},
                          *keys[] = {"tensor_cores", "bf16_device", "bf16_narrow"};
        for (int i = 0; i < 3; i++) {
            if (i == 2)
                setenv("HPD_CUDA_GEMM_BN", "128", 1);
            other_be = open_sibling(kinds[i], device);
            if (i == 2)
                unsetenv("HPD_CUDA_GEMM_BN");
            if (other_be == NULL) {
                printf(" %s=failed", keys[i]);
                continue;
            }
            const double tt = timed(do_gemm_other, &a);
            printf(" %s_ms=%.3f %s_TFLOPs=%.2f", keys[i], tt * 1e3, keys[i], flop / tt / 1e12);
            if (tc > 0)
                printf(" %s_of_cublas=%.3f", keys[i], tc / tt);
            hpd_backend_destroy(other_be);
            other_be = NULL;
        }
        hpd_backend_free(be, x16);
        free(h);
        free(b);
    } else
#endif
        printf(" cublas=skipped");
    printf("\n");
    hpd_backend_free(be, w);
    hpd_backend_free(be, x);
    hpd_backend_free(be, y);    return cublas_tflops;
}

/* Attention of a whole prompt of `tokens` (causal: 2 * tokens^2 * head_dim
 * * heads FLOPs for QK^T and PV), TFLOP/s on the device and on cuda-bf16
 * (tensor cores), as a fraction of cuBLAS's BF16 GEMM measured in this run
 * (the tensor cores' practical peak) */
static void attention_prefill_bench(uint32_t tokens, double cublas_tflops, const char *device)
{
    uint64_t kv_bytes;
    const double flop = 2.0 * tokens * (double)tokens * HD * NH;
    const double t = attention_seconds(1, tokens, tokens, &kv_bytes, NULL);
    printf("attention_prefill tokens=%u heads=%d kv_heads=%d head_dim=%d ms=%.3f TFLOPs=%.2f",
           tokens, NH, NKV, HD, t * 1e3, flop / t / 1e12);
    if (cublas_tflops > 0)
        printf(" of_cublas=%.3f", flop / t / 1e12 / cublas_tflops);
    hpd_backend_t *bf16 = hpd_backend_host_memory(be) ? NULL : open_sibling("cuda-bf16", device);
    if (bf16 != NULL) {
        hpd_backend_t *under_test = be;
        be = bf16;
        const double tb = attention_seconds(1, tokens, tokens, &kv_bytes, NULL);
        be = under_test;
        hpd_backend_destroy(bf16);
        printf(" bf16_device_ms=%.3f bf16_device_TFLOPs=%.2f", tb * 1e3, flop / tb / 1e12);
        if (cublas_tflops > 0)
            printf(" bf16_device_of_cublas=%.3f", flop / tb / 1e12 / cublas_tflops);
    }
    printf("\n");
}

/* ---------------------------------------------------------------- model */

/* --------------------------------------------------------------- sample
 *
 * One decode step's sampling: --seqs rows of Qwen3-Next's vocabulary
 * (151936), logits 3 N(0, 1): greedy (one pass of the row: the floor),
 * top-p 0.9 at temperature 0.7 without top-k (its nucleus within the
 * row's 1024 largest: the sorted path), and the same on nearly flat logits
 * (0.02 N(0, 1): a nucleus of most of the row, the bisection's 32 passes);
 * each time against greedy's. The tokens come back to the host, as in a
 * step. */
typedef struct {
    hpd_sample_args_t a;
} sample_t;

static void do_sample(void *arg)
{
    CHECK(hpd_sample(be, &((sample_t *)arg)->a));
}

static void sample_bench(uint32_t rows)
{
    const uint32_t V = 151936;
    float *peaked = drand((size_t)rows * V, 70, 3), *flat = drand((size_t)rows * V, 71, 0.02f);
    hpd_sampling_t *sp = malloc(rows * sizeof(*sp));
    uint64_t *pos = malloc(rows * sizeof(*pos));
    int32_t *out = malloc(rows * sizeof(*out));
    for (uint32_t r = 0; r < rows; r++)
        pos[r] = 100 + r, sp[r] = (hpd_sampling_t){.temperature = 0.0f, .top_p = 1.0f, .seed = r};
    sample_t s = {{.logits = peaked, .ld = V, .n_rows = rows, .vocab = V, .params = sp,
                   .positions = pos, .out = out}};
    const double tg = timed(do_sample, &s);
    for (uint32_t r = 0; r < rows; r++)
        sp[r].temperature = 0.7f, sp[r].top_p = 0.9f;
    const double tp = timed(do_sample, &s);
    s.a.logits = flat;
    const double tf = timed(do_sample, &s);
    printf("sample rows=%u vocab=%u greedy_ms=%.4f top_p_ms=%.4f of_greedy=%.2f "
           "top_p_flat_ms=%.4f flat_of_greedy=%.2f\n", rows, V, tg * 1e3, tp * 1e3, tp / tg,
           tf * 1e3, tf / tg);
    free(sp), free(pos), free(out);
    hpd_backend_free(be, peaked);
    hpd_backend_free(be, flat);
}

/* ------------------------------------------------------------ MoE layer
 *
 * An MoE layer's experts with Qwen3-Next's shape (512 experts, 10 a token,
 * hidden 2048, expert intermediate 512, BF16 weights) over R tokens: the
 * ops the engine runs (moe_route, gather, grouped gate|up, silu_mul,
 * grouped down, moe_combine; the routing never leaves the device) beside
 * the way before them, in the same run: the router's logits read back,
 * routed on the host, the routing sent up, a GEMM per expert hit. The
 * bound: the experts hit read once at the copy bandwidth. */
#define ME 512
#define MK 10
#define MH 2048
#define MI 512

typedef struct {
    bool host; /* the way before: routing on the host */
    uint32_t R;
    float *logits, *h, *xe, *gu, *act, *out, *res, *w;
    void *wgu, *wd;
    uint32_t *ids, *slots, *idx, *first;
    /* the host's routing (the way before) */
    float *hl, *hw;
    uint32_t *hids, *hslots, *hidx, *hfirst;
} moe_t;

static void do_moe(void *arg)
{
    moe_t *m = arg;
    const uint32_t R = m->R, S = R * MK;
    hpd_gemm_args_t gu = {.x = m->xe, .ldx = MH, .w = m->wgu, .w_dtype = HPD_DTYPE_BF16,
                          .y = m->gu, .ldy = 2 * MI, .m = S, .n = 2 * MI, .k = MH};
    hpd_gemm_args_t down = {.x = m->act, .ldx = MI, .w = m->wd, .w_dtype = HPD_DTYPE_BF16,
                            .y = m->out, .ldy = MH, .m = S, .n = MH, .k = MI};
    if (!m->host) {
        const hpd_moe_route_args_t ra = {.logits = m->logits, .ld = ME, .n_tokens = R,
                                         .n_experts = ME, .top_k = MK, .norm = true,
                                         .ids = m->ids, .weights = m->w, .slots = m->slots,
                                         .idx = m->idx, .first = m->first};
        CHECK(hpd_moe_route(be, &ra));
    } else {
        CHECK(hpd_backend_to_host(be, m->hl, m->logits, (size_t)R * ME * sizeof(float)));
        for (uint32_t t = 0; t < R; t++)
            hpd_moe_route_token(m->hl + (size_t)t * ME, ME, MK, true, m->hids + t * MK,
                                m->hw + t * MK);
        hpd_moe_number(m->hids, R, MK, ME, m->hslots, m->hidx, m->hfirst);
        CHECK(hpd_backend_from_host(be, m->slots, m->hslots, S * 4));
        CHECK(hpd_backend_from_host(be, m->idx, m->hidx, S * 4));
        CHECK(hpd_backend_from_host(be, m->w, m->hw, S * 4));
    }
    const hpd_gather_args_t g = {.src = m->h, .ld_src = MH, .idx_dev = m->idx, .n = S,
                                 .dim = MH, .dst = m->xe, .ld_dst = MH};
    CHECK(hpd_gather(be, &g));
    const hpd_silu_mul_args_t act = {.gu = m->gu, .ldgu = 2 * MI, .out = m->act, .ldout = MI,
                                     .n_tokens = S, .inter = MI};
    if (!m->host) {
        const hpd_gemm_grouped_args_t ggu = {.g = gu, .first = m->first, .n_groups = ME,
                                             .max_rows = R};
        const hpd_gemm_grouped_args_t gd = {.g = down, .first = m->first, .n_groups = ME,
                                            .max_rows = R};
        CHECK(hpd_gemm_grouped(be, &ggu));
        CHECK(hpd_silu_mul(be, &act));
        CHECK(hpd_gemm_grouped(be, &gd));
    } else {
        for (int pass = 0; pass < 2; pass++) {
            const hpd_gemm_args_t *a = pass == 0 ? &gu : &down;
            for (uint32_t x = 0; x < ME; x++) {
                const uint32_t r0 = m->hfirst[x], n = m->hfirst[x + 1] - r0;
                if (n == 0)
                    continue;
                hpd_gemm_args_t e = *a;
                e.x += (size_t)r0 * e.ldx, e.y += (size_t)r0 * e.ldy, e.m = n;
                e.w = (const uint16_t *)e.w + (size_t)x * e.n * e.k;
                CHECK(hpd_gemm(be, &e));
            }
            if (pass == 0)
                CHECK(hpd_silu_mul(be, &act));
        }
    }
    const hpd_moe_combine_args_t c = {.x = m->res, .ldx = MH, .rows = m->out, .ld_rows = MH,
                                      .slots = m->slots, .weights = m->w, .top_k = MK,
                                      .n_tokens = R, .dim = MH};
    CHECK(hpd_moe_combine(be, &c));
}

/* The layer at R tokens on the device under test (and on its cuda-bf16
 * sibling) */
static void moe_bench(uint32_t R, double copy_bw, const char *device)
{
    const uint32_t S = R * MK;
    const size_t gu_bytes = (size_t)ME * 2 * MI * MH * 2, d_bytes = (size_t)ME * MH * MI * 2;
    moe_t m = {.R = R};
    /* the weights: one bf16 value throughout (0x3c3c, about 0.0115), set on
     * the device (3.2 GB: random values from the host would take minutes) */
    m.wgu = dalloc(gu_bytes), m.wd = dalloc(d_bytes);
    CHECK(hpd_backend_memset(be, m.wgu, 0x3c, gu_bytes));
    CHECK(hpd_backend_memset(be, m.wd, 0x3c, d_bytes));
    m.logits = drand((size_t)R * ME, 60, 2), m.h = drand((size_t)R * MH, 61, 1);
    m.res = drand((size_t)R * MH, 62, 1);
    m.xe = dalloc((size_t)S * MH * 4), m.gu = dalloc((size_t)S * 2 * MI * 4);
    m.act = dalloc((size_t)S * MI * 4), m.out = dalloc((size_t)S * MH * 4);
    m.w = dalloc(S * 4), m.ids = dalloc(S * 4), m.slots = dalloc(S * 4), m.idx = dalloc(S * 4);
    m.first = dalloc((ME + 1) * 4);
    m.hl = malloc((size_t)R * ME * 4), m.hw = malloc(S * 4), m.hids = malloc(S * 4);
    m.hslots = malloc(S * 4), m.hidx = malloc(S * 4), m.hfirst = malloc((ME + 1) * 4);
    /* the experts hit: the bound's bytes */
    CHECK(hpd_backend_to_host(be, m.hl, m.logits, (size_t)R * ME * sizeof(float)));
    for (uint32_t t = 0; t < R; t++)
        hpd_moe_route_token(m.hl + (size_t)t * ME, ME, MK, true, m.hids + t * MK, m.hw + t * MK);
    hpd_moe_number(m.hids, R, MK, ME, m.hslots, m.hidx, m.hfirst);
    uint32_t hit = 0;
    for (uint32_t x = 0; x < ME; x++)
        hit += m.hfirst[x + 1] > m.hfirst[x];
    const double bytes = (double)hit * 3 * MI * MH * 2;
    hpd_backend_t *sib = open_sibling("cuda-bf16", device), *under_test = be;
    for (int b = 0; b < 2; b++) {
        if (b == 1 && sib == NULL)
            break;
        be = b == 0 ? under_test : sib;
        m.host = false;
        const double t = timed(do_moe, &m);
        m.host = true;
        const double th = timed(do_moe, &m);
        printf("moe_layer device=%s tokens=%u experts=%u top_k=%u hidden=%u inter=%u hit=%u "
               "ms=%.4f of_bound=%.3f host_routing_ms=%.4f speedup=%.2f\n", be->ops->name, R, ME,
               MK, MH, MI, hit, t * 1e3, bytes / t / copy_bw, th * 1e3, th / t);
    }
    be = under_test;
    if (sib != NULL)
        hpd_backend_destroy(sib);
    void *dev[] = {m.wgu, m.wd, m.logits, m.h, m.res, m.xe, m.gu, m.act, m.out, m.w,
                   m.ids, m.slots, m.idx, m.first};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(dev); i++)
        hpd_backend_free(be, dev[i]);
    free(m.hl), free(m.hw), free(m.hids), free(m.hslots), free(m.hidx), free(m.hfirst);
}

static double engine_run(hpd_engine_t *e, uint32_t n, uint32_t prompt_len, uint32_t max_tokens,
                         uint32_t vocab, bool decode_only, uint64_t *tokens_p)
{
    int32_t *prompt = malloc(prompt_len * sizeof(int32_t));
    hpd_engine_stats_t s0, s1;
    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t i = 0; i < prompt_len; i++)
            prompt[i] = (int32_t)(hpd_philox4x32(77 + r, i, 0).v[0] % vocab);
        hpd_request_params_t rp = {.prompt = prompt,
                                   .n_prompt = prompt_len,
                                   .max_tokens = max_tokens,
                                   .sampling = {.top_p = 1}};
        uint64_t id;
        CHECK(hpd_engine_submit(e, &rp, &id));
    }
    hpd_engine_stats(e, &s0);
    CHECK(hpd_engine_run(e));
    hpd_engine_stats(e, &s1);
    free(prompt);
    if (decode_only) {
        *tokens_p = s1.decode_tokens - s0.decode_tokens;
        return s1.decode_seconds - s0.decode_seconds;
    }
    *tokens_p = s1.prefill_tokens - s0.prefill_tokens;
    return s1.prefill_seconds - s0.prefill_seconds;
}

static void model_bench(const char *dir, uint32_t prefill, uint32_t seqs, double copy_bw)
{
    hpd_model_t *m;
    hpd_engine_t *e;
    hpd_engine_params_t ep;
    uint64_t toks;
    CHECK(hpd_model_load(dir, &m));
    hpd_engine_params_init(&ep);
    ep.model = m;
    ep.backend = be;
    ep.max_batch = seqs;
    ep.max_context = prefill + 128;
    ep.prefill_chunk = 512;
    ep.prefix_cache = false;
    CHECK(hpd_engine_create(&ep, &e));
    const double weight_bytes = (double)m->weight_bytes;
    engine_run(e, 1, 128, 2, m->config.vocab_size, false, &toks); /* warm-up */
    double t = engine_run(e, 1, prefill, 1, m->config.vocab_size, false, &toks);
    printf("model_prefill device=%s layers=%u params=%llu tokens=%llu tok_per_s=%.0f\n",
           be->ops->name, m->config.n_layers, (unsigned long long)m->n_params,
           (unsigned long long)toks, toks / t);
    t = engine_run(e, 1, 64, 65, m->config.vocab_size, true, &toks);
    /* a step reads every weight once, but of an untied embedding only the
     * rows of its tokens; the copy bandwidth (bytes read and written per
     * second) is the rate a stream of reads can reach, as for the GEMV */
    const double embed_bytes =
        m->lm_head.p == m->embed.p
            ? 0.0
            : (double)m->config.vocab_size * m->config.hidden_size *
                  hpd_dtype_size(m->embed.dtype);
    const double read_bytes = weight_bytes - embed_bytes;
    const double bound = copy_bw / read_bytes; /* steps/s */
    printf("model_decode device=%s batch=1 tok_per_s=%.1f read_bytes=%.0f bound_tok_per_s=%.1f "
           "of_bound=%.3f\n", be->ops->name, toks / t, read_bytes, bound, toks / t / bound);
    const double t1 = t, toks_1 = (double)toks;
    t = engine_run(e, seqs, 64, 65, m->config.vocab_size, true, &toks);
    const double tn = t, toks_n = (double)toks;
    hpd_engine_stats_t es;
    hpd_engine_stats(e, &es);
    printf("model_decode device=%s batch=%u tok_per_s=%.1f graph_steps=%llu decode_steps=%llu\n",
           be->ops->name, seqs, toks / t, (unsigned long long)es.graph_steps,
           (unsigned long long)es.decode_steps);
    hpd_engine_destroy(e);
    /* the same decode with every op launched on its own (no CUDA graph, a
     * metadata upload per op): what the recorded steps gain */
    if (es.graph_steps > 0) {
        ep.step_graphs = false;
        CHECK(hpd_engine_create(&ep, &e));
        engine_run(e, 1, 128, 2, m->config.vocab_size, false, &toks); /* warm-up */
        t = engine_run(e, 1, 64, 65, m->config.vocab_size, true, &toks);
        printf("model_decode_ops device=%s batch=1 tok_per_s=%.1f graphs_speedup=%.3f\n",
               be->ops->name, toks / t, (t / toks) / (t1 / toks_1));
        t = engine_run(e, seqs, 64, 65, m->config.vocab_size, true, &toks);
        printf("model_decode_ops device=%s batch=%u tok_per_s=%.1f graphs_speedup=%.3f\n",
               be->ops->name, seqs, toks / t, (t / toks) / (tn / toks_n));
        hpd_engine_destroy(e);
    }
    hpd_model_destroy(m);
}

int main(int argc, char **argv)
{
    const char *device = "cuda:0", *model = NULL;
    uint32_t seqs = 32, context = 4096, prefill = 4096, copy_mib = 1024, threads = 0;
    static const struct option opts[] = {{"device", 1, 0, 'd'}, {"seqs", 1, 0, 's'},
                                         {"context", 1, 0, 'c'}, {"prefill", 1, 0, 'p'},
                                         {"model", 1, 0, 'm'},   {"reps", 1, 0, 'r'},
                                         {"copy-mib", 1, 0, 'b'}, {"threads", 1, 0, 't'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'd': device = optarg; break;
        case 's': seqs = (uint32_t)atoi(optarg); break;
        case 'c': context = (uint32_t)atoi(optarg); break;
        case 'p': prefill = (uint32_t)atoi(optarg); break;
        case 'm': model = optarg; break;
        case 'r': reps = atoi(optarg); break;
        case 'b': copy_mib = (uint32_t)atoi(optarg); break;
        case 't': threads = (uint32_t)atoi(optarg); break;
        default:
            fprintf(stderr, "usage: hpd-bench-cuda [--device cuda:0] [--seqs N] [--context N] "
                            "[--prefill N] [--model DIR] [--reps N] [--copy-mib N] [--threads N]\n");
            return 2;
        }
    }
    if (seqs == 0 || context == 0 || prefill == 0 || reps <= 0 || copy_mib == 0) {
        fprintf(stderr, "hpd-bench-cuda: --seqs, --context, --prefill, --reps and --copy-mib "
                        "must be > 0\n");
        return 2;
    }
    hpd_backend_params_t bp = {.device = device,
                               .n_threads = threads}; /* threads: the CPU backend's */
    if (hpd_backend_create(&bp, &be) != HPD_OK) {
        fprintf(stderr, "hpd-bench-cuda: device %s is not available\n", device);
        return 77;
    }
    printf("device %s\n", be->ops->name);
    const size_t copy_bytes = (size_t)copy_mib << 20;
    const double bw = copy_bandwidth(copy_bytes);
    printf("copy bytes=%zu GBps=%.1f\n", copy_bytes, bw / 1e9);

    const double state_bytes = (double)NV * DK * DV * 4;
    double t = 0;
    /* batch 1 and the batch: the goals are 0.3 and 0.7 of the bound */
    /* each also recorded as in a decode step (recorded_*: on a GPU a graph,
     * no host work per op), where the backend records */
    double rec = -1;
    for (uint32_t n = 1;; n = seqs) {
        t = gdn_seconds(n, 1, false, &rec);
        printf("gdn_recurrent seqs=%u nk=%d nv=%d dk=%d dv=%d ms=%.4f GBps=%.1f of_copy=%.3f",
               n, NK, NV, DK, DV, t * 1e3, 2 * state_bytes * n / t / 1e9,
               2 * state_bytes * n / t / bw);
        if (rec > 0)
            printf(" recorded_ms=%.4f recorded_of_copy=%.3f", rec * 1e3,
                   2 * state_bytes * n / rec / bw);
        printf("\n");
        if (n == seqs)
            break;
    }
    uint64_t kv_bytes;
    t = attention_seconds(seqs, context, 1, &kv_bytes, &rec);
    printf("attention seqs=%u context=%u heads=%d kv_heads=%d head_dim=%d ms=%.4f GBps=%.1f "
           "of_copy=%.3f", seqs, context, NH, NKV, HD, t * 1e3, kv_bytes / t / 1e9,
           kv_bytes / t / bw);
    if (rec > 0)
        printf(" recorded_ms=%.4f recorded_of_copy=%.3f", rec * 1e3, kv_bytes / rec / bw);
    /* beside it, cuda-bf16's (tensor cores), the same shape on the same GPU */
    hpd_backend_t *bf16 = open_sibling("cuda-bf16", device);
    if (bf16 != NULL) {
        hpd_backend_t *under_test = be;
        be = bf16;
        const double tb = attention_seconds(seqs, context, 1, &kv_bytes, &rec);
        be = under_test;
        hpd_backend_destroy(bf16);
        printf(" bf16_device_ms=%.4f bf16_device_of_copy=%.3f", tb * 1e3, kv_bytes / tb / bw);
        if (rec > 0)
            printf(" bf16_device_recorded_of_copy=%.3f", kv_bytes / rec / bw);
    }
    printf("\n");
    /* chunked GDN, and beside it cuda-bf16's (its state pass on tensor
     * cores), the same shape on the same GPU: with its chunk buffers as
     * chosen, then forced to one and to two (HPD_CUDA_GDN_BUFFERS) */
    hpd_backend_t *bfs[3] = {open_sibling("cuda-bf16", device)};
    for (int nb = 1; nb <= 2 && bfs[0] != NULL; nb++) {
        setenv("HPD_CUDA_GDN_BUFFERS", nb == 1 ? "1" : "2", 1);
        bfs[nb] = open_sibling("cuda-bf16", device);
        unsetenv("HPD_CUDA_GDN_BUFFERS");
    }
    for (uint32_t n = 1; n <= 4; n *= 4) {
        t = gdn_seconds(n, prefill, true, NULL);
        printf("gdn_chunked seqs=%u tokens=%u nk=%d nv=%d dk=%d dv=%d ms=%.4f tok_per_s=%.0f", n,
               prefill, NK, NV, DK, DV, t * 1e3, n * prefill / t);
        static const char *tag[] = {"bf16_device", "bf16_bufs1", "bf16_bufs2"};
        for (int i = 0; i < 3; i++) {
            if (bfs[i] == NULL)
                continue;
            hpd_backend_t *under_test = be;
            be = bfs[i];
            const double tb = gdn_seconds(n, prefill, true, NULL);
            be = under_test;
            printf(" %s_ms=%.4f", tag[i], tb * 1e3);
            if (i == 0)
                printf(" %s_tok_per_s=%.0f", tag[i], n * prefill / tb);
        }
        printf("\n");
    }
    for (int i = 0; i < 3; i++)
        if (bfs[i] != NULL)
            hpd_backend_destroy(bfs[i]);
    translate_vs_copy(context);
    checksum_bench(bw);
    sample_bench(seqs);
    gemv_bench(5120, 2048, bw, device);
    gemv_bench(2048, 5120, bw, device);
    const double cublas_tflops = gemm_bench(prefill, 5120, 2048, device);
    attention_prefill_bench(2 * prefill, cublas_tflops, device); /* 8192 at --prefill 4096 */
    moe_bench(1, bw, device);
    moe_bench(seqs, bw, device);
    if (model != NULL) {
        model_bench(model, prefill, seqs, bw);
        /* and on cuda-bf16 (tensor cores), the same model and GPU */
        hpd_backend_t *tc = open_sibling("cuda-bf16", device), *under_test = be;
        if (tc != NULL) {
            be = tc;
            model_bench(model, prefill, seqs, bw);
            be = under_test;
            hpd_backend_destroy(tc);
        }
    }
    hpd_backend_destroy(be);
    return 0;
}
