/* hpd-bench-cpu: prefill and decode tokens/s of the CPU backend for the
 * models given, with the memory bandwidth of a large memcpy measured in the
 * same run, so that decode is shown against its bandwidth bound; and each
 * model's load time and resident memory against its files.
 *
 *   hpd-bench-cpu [--threads N] [--prompt N] [--decode N] [--device cpu|cpu-bf16]
 *                 [--load-only] MODEL_DIR...
 *
 * Decode streams every weight it uses once per step: its bound is
 * active_bytes / read_bandwidth per token (batch 1), where a mixture of
 * experts reads only the top-k experts of each MoE layer. Prefill is bound
 * by its matrix products: 2 flops per active matmul weight per token,
 * shown against the fp32 FMA peak of the same threads, measured here; the
 * GEMM alone on layer 0's MLP weights at the prompt's rows is shown against
 * the peak of the device's products (on cpu-bf16 VDPBF16PS's, also
 * measured here). */
#include <dirent.h>
#include <getopt.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/engine.h"
#include "kernels/cpu/simd.h"

/* memcpy of `bytes` split over the threads; returns bytes moved (read +
 * written) per second, best of a few runs. */
static double memcpy_bandwidth(size_t bytes, int threads)
{
    char *src = malloc(bytes), *dst = malloc(bytes);
    double best = 0;

    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return 0;
    }
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    for (int rep = 0; rep < 5; rep++) {
        double t0 = hpd_time_now();
#pragma omp parallel num_threads(threads)
        {
            const int n = omp_get_num_threads(), i = omp_get_thread_num();
            const size_t chunk = bytes / (size_t)n;
            memcpy(dst + i * chunk, src + i * chunk, i == n - 1 ? bytes - i * chunk : chunk);
        }
        double bw = 2.0 * (double)bytes / (hpd_time_now() - t0);
        best = bw > best ? bw : best;
    }
    free(src);
    free(dst);
    return best;
}

/* fp32 flops per second of the threads doing independent 8-lane FMAs (the
 * kernels' vector width), best of a few runs: the ceiling of any product
 * that multiplies in fp32. 12 chains per thread cover the FMA latency of
 * two pipes. */
static double fma_peak(int threads)
{
    enum { CHAINS = 12, ITERS = 1 << 22 };
    double best = 0;
    for (int rep = 0; rep < 20; rep++) { /* ~10 ms each, 20 ms apart: a shared machine's
                                           * neighbours come and go */
        usleep(20000);
        float sink = 0;
        double t0 = hpd_time_now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            const hpd_v8_t a = hpd_v8_set1(0.999999f), b = hpd_v8_set1(1e-7f);
            hpd_v8_t c0 = hpd_v8_set1(0), c1 = hpd_v8_set1(1), c2 = hpd_v8_set1(2);
            hpd_v8_t c3 = hpd_v8_set1(3), c4 = hpd_v8_set1(4), c5 = hpd_v8_set1(5);
            hpd_v8_t c6 = hpd_v8_set1(6), c7 = hpd_v8_set1(7), c8 = hpd_v8_set1(8);
            hpd_v8_t c9 = hpd_v8_set1(9), c10 = hpd_v8_set1(10), c11 = hpd_v8_set1(11);
            for (int i = 0; i < ITERS; i++) { /* named chains stay in registers */
                c0 = hpd_v8_fma(c0, a, b), c1 = hpd_v8_fma(c1, a, b), c2 = hpd_v8_fma(c2, a, b);
                c3 = hpd_v8_fma(c3, a, b), c4 = hpd_v8_fma(c4, a, b), c5 = hpd_v8_fma(c5, a, b);
                c6 = hpd_v8_fma(c6, a, b), c7 = hpd_v8_fma(c7, a, b), c8 = hpd_v8_fma(c8, a, b);
                c9 = hpd_v8_fma(c9, a, b), c10 = hpd_v8_fma(c10, a, b);
                c11 = hpd_v8_fma(c11, a, b);
            }
            sink += hpd_v8_hsum(c0) + hpd_v8_hsum(c1) + hpd_v8_hsum(c2) + hpd_v8_hsum(c3) +
                    hpd_v8_hsum(c4) + hpd_v8_hsum(c5) + hpd_v8_hsum(c6) + hpd_v8_hsum(c7) +
                    hpd_v8_hsum(c8) + hpd_v8_hsum(c9) + hpd_v8_hsum(c10) + hpd_v8_hsum(c11);
        }
        const double flops = 2.0 * 8 * CHAINS * (double)ITERS * threads;
        const double f = flops / (hpd_time_now() - t0);
        best = f > best && sink == sink ? f : best;
    }
    return best;
}

/* The bf16-product peak of `threads` threads: 512-bit VDPBF16PS (16
 * lanes, two products each) in 8 chains per thread, what device cpu-bf16's
 * GEMM multiplies with; 0 where the CPU lacks the instruction. */
static double bf16_peak(int threads)
{
#if defined(__AVX512BF16__)
    enum { ITERS = 1 << 22 };
    double best = 0;
    for (int rep = 0; rep < 20; rep++) {
        usleep(20000);
        float sink = 0;
        double t0 = hpd_time_now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80); /* 1.0 */
            const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380); /* 2^-24 */
            __m512 c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2);
            __m512 c3 = _mm512_set1_ps(3), c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5);
            __m512 c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7);
            for (int i = 0; i < ITERS; i++) {
                c0 = _mm512_dpbf16_ps(c0, a, b), c1 = _mm512_dpbf16_ps(c1, a, b);
                c2 = _mm512_dpbf16_ps(c2, a, b), c3 = _mm512_dpbf16_ps(c3, a, b);
                c4 = _mm512_dpbf16_ps(c4, a, b), c5 = _mm512_dpbf16_ps(c5, a, b);
                c6 = _mm512_dpbf16_ps(c6, a, b), c7 = _mm512_dpbf16_ps(c7, a, b);
            }
            const __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
            sink += _mm512_reduce_add_ps(t);
        }
        const double flops = 2.0 * 32 * 8 * (double)ITERS * threads;
        const double f = flops / (hpd_time_now() - t0);
        best = f > best && sink == sink ? f : best;
    }
    return best;
#else
    (void)threads;
    return 0;
#endif
}

/* The GEMM alone on layer 0's dense MLP weights (gate|up: 2I x H, down:
 * H x I) at `rows` rows of random x, the best of 10 calls each, against the
 * peak of the device's products (fp32 FMA, or VDPBF16PS on cpu-bf16 with
 * BF16 weights). */
static void bench_gemm(hpd_backend_t *be, const hpd_model_t *m, uint32_t rows, double fma,
                       double bf16)
{
    const hpd_model_config_t *c = &m->config;
    const hpd_layer_weights_t *l = &m->layers[0];
    if (c->intermediate_size == 0 || l->mlp_gate_up.n != 1 || l->mlp_down.p == NULL)
        return; /* no dense MLP in layer 0 */
    const uint32_t H = c->hidden_size, I = c->intermediate_size, kmax = H > I ? H : I;
    float *x = malloc((size_t)rows * kmax * sizeof(float));
    float *y = malloc((size_t)rows * 2 * I * sizeof(float));
    if (x == NULL || y == NULL) {
        free(x), free(y);
        return;
    }
    for (size_t i = 0; i < (size_t)rows * kmax; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    const struct {
        const char *name;
        const hpd_weight_t *w;
        uint32_t n, k;
    } g[2] = {{"mlp gate|up", &l->mlp_gate_up.part[0], 2 * I, H},
              {"mlp down", &l->mlp_down, H, I}};
    const bool bp = strcmp(be->ops->numerics, "bf16-products") == 0;
    for (int i = 0; i < 2; i++) {
        hpd_gemm_args_t a = {.x = x, .ldx = g[i].k, .w = g[i].w->p, .w_dtype = g[i].w->dtype,
                             .w_scale = g[i].w->scale, .w_scale_ld = g[i].w->scale_ld,
                             .w_block = g[i].w->block, .y = y, .ldy = g[i].n, .m = rows,
                             .n = g[i].n, .k = g[i].k};
        double best = 1e30;
        for (int r = 0; r < 10; r++) {
            const double t0 = hpd_time_now();
            if (hpd_gemm(be, &a) != HPD_OK)
                break;
            const double t = hpd_time_now() - t0;
            best = t < best ? t : best;
        }
        const double f = 2.0 * rows * g[i].n * g[i].k / best;
        const bool vdp = bp && g[i].w->dtype == HPD_DTYPE_BF16 && bf16 > 0;
        printf("  GEMM alone, %s %u x %u x %u (%s): %.1f GFLOP/s, %.2f of the %s peak\n",
               g[i].name, rows, g[i].n, g[i].k, hpd_dtype_name(g[i].w->dtype), f / 1e9,
               f / (vdp ? bf16 : fma), vdp ? "VDPBF16PS" : "fp32 FMA");
    }
    free(x), free(y);
}

typedef struct {
    double prefill_tps, decode_tps_b1, decode_tps_b8;
} result_t;

static int run_requests(hpd_engine_t *e, uint32_t n, uint32_t prompt_len, uint32_t max_tokens,
                        uint32_t vocab)
{
    int32_t *prompt = malloc(prompt_len * sizeof(int32_t));
    uint64_t id;

    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t i = 0; i < prompt_len; i++)
            prompt[i] = (int32_t)((i * 7919u + r * 104729u + 13) % vocab);
        hpd_request_params_t rp = {.prompt = prompt,
                                   .n_prompt = prompt_len,
                                   .max_tokens = max_tokens,
                                   .sampling = {.top_p = 1}};
        if (hpd_engine_submit(e, &rp, &id) != HPD_OK) {
            free(prompt);
            return -1;
        }
    }
    free(prompt);
    return hpd_engine_run(e) == HPD_OK ? 0 : -1;
}

static uint64_t rss_bytes(void)
{
    unsigned long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL || fscanf(f, "%llu %llu", &size, &resident) != 2)
        resident = 0;
    if (f != NULL)
        fclose(f);
    return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Bytes of the directory's *.safetensors files. */
static uint64_t file_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint64_t total = 0;
    char path[4096];
    struct stat st;
    while (d != NULL && (de = readdir(d)) != NULL) {
        const size_t n = strlen(de->d_name);
        if (n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            if (stat(path, &st) == 0)
                total += (uint64_t)st.st_size;
        }
    }
    if (d != NULL)
        closedir(d);
    return total;
}

/* The bytes one token's decode step reads: every weight but the experts a
 * token does not route to. */
static double active_bytes(const hpd_model_t *m)
{
    const hpd_model_config_t *c = &m->config;
    double b = (double)m->weight_bytes;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (!c->layer_moe[l])
            continue;
        const hpd_layer_weights_t *w = &m->layers[l];
        const double gu = (double)2 * c->moe_inter * c->hidden_size, dn = (double)c->hidden_size *
                                                                            c->moe_inter;
        double per = gu * hpd_dtype_size(w->moe_gate_up.dtype) +
                     dn * hpd_dtype_size(w->moe_down.dtype);
        per += (w->moe_gate_up.scale ? 2.0 * c->moe_inter * w->moe_gate_up.scale_ld * 4 : 0) +
               (w->moe_down.scale ? (double)c->hidden_size * w->moe_down.scale_ld * 4 : 0);
        b -= (double)(c->n_experts - c->top_k) * per;
    }
    return b;
}

/* The matmul weights one token multiplies (2 flops each): every weight but
 * the embedding, the head (once per prompt, not per token) and the experts
 * a token does not route to; norms and convolutions are negligible. */
static double active_matmul_params(const hpd_model_t *m)
{
    const hpd_model_config_t *c = &m->config;
    const double vh = (double)c->vocab_size * c->hidden_size;
    double p = (double)m->n_params - (m->lm_head.p == m->embed.p ? vh : 2 * vh);
    for (uint32_t l = 0; l < c->n_layers; l++)
        if (c->layer_moe[l])
            p -= (double)(c->n_experts - c->top_k) * 3 * c->moe_inter * c->hidden_size;
    return p;
}

static int bench_model(const char *dir, hpd_backend_t *be, uint32_t prompt_len,
                       uint32_t decode_len, double copy_bw, double peak, double bf16,
                       bool load_only)
{
    hpd_model_t *m;
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    hpd_engine_stats_t s;
    result_t r;

    const uint64_t rss0 = rss_bytes();
    const double t0 = hpd_time_now();
    if (hpd_model_load(dir, &m) != HPD_OK)
        return -1;
    const double load_s = hpd_time_now() - t0;
    const uint64_t rss = rss_bytes() - rss0, files = file_bytes(dir);
    const hpd_model_config_t *c = &m->config;
    const double weight_bytes = (double)m->weight_bytes, active = active_bytes(m);
    printf("model %s: hidden %u, %u layers (%u GDN, %u attention, %u MoE of %u experts, top %u), "
           "vocab %u, %.1f M params, weights %s\n",
           dir, c->hidden_size, c->n_layers, c->n_linear_layers, c->n_full_layers,
           c->n_moe_layers, c->n_experts, c->top_k, c->vocab_size, m->n_params / 1e6,
           hpd_dtype_name(m->layers[0].attn_o.p ? m->layers[0].attn_o.dtype
                                                : m->layers[0].gdn_out.dtype));
    printf("  load: %.2f s for %.1f MiB of files (%.2f GB/s); resident +%.1f MiB = %.3f of the "
           "files\n",
           load_s, files / 1048576.0, files / load_s / 1e9, rss / 1048576.0,
           (double)rss / (double)files);
    if (load_only) {
        hpd_model_destroy(m);
        return 0;
    }
    hpd_engine_params_init(&ep);
    ep.model = m;
    ep.backend = be;
    ep.max_batch = 8;
    ep.prefill_chunk = 512;
    ep.max_context = prompt_len + decode_len + 64;

    /* prefill: one prompt, one token */
    if (hpd_engine_create(&ep, &e) != HPD_OK || run_requests(e, 1, prompt_len, 1, c->vocab_size))
        return -1;
    hpd_engine_stats(e, &s);
    r.prefill_tps = (double)s.prefill_tokens / s.prefill_seconds;
    hpd_engine_destroy(e);
    /* decode, batch 1 and batch 8, after a 64-token prompt */
    for (int b = 0; b < 2; b++) {
        const uint32_t n = b == 0 ? 1 : 8;
        if (hpd_engine_create(&ep, &e) != HPD_OK ||
            run_requests(e, n, 64, decode_len + 1, c->vocab_size))
            return -1;
        hpd_engine_stats(e, &s);
        double tps = (double)s.decode_tokens / s.decode_seconds;
        *(b == 0 ? &r.decode_tps_b1 : &r.decode_tps_b8) = tps;
        hpd_engine_destroy(e);
    }
    const double b1_bw = r.decode_tps_b1 * active;
    const double flops_per_token = 2 * active_matmul_params(m);
    printf("  matmul flops per prompt token %.3f G\n", flops_per_token / 1e9);
    printf("  weights %.1f MiB, read per decode step %.1f MiB\n", weight_bytes / 1048576.0,
           active / 1048576.0);
    printf("  prefill (%u-token prompt):   %10.1f tokens/s  (matmuls %.1f GFLOP/s, %.2f of the fp32 "
           "FMA peak)\n",
           prompt_len, r.prefill_tps, r.prefill_tps * flops_per_token / 1e9,
           r.prefill_tps * flops_per_token / peak);
    printf("  decode batch 1:              %10.1f tokens/s  (weights read %.2f GB/s)\n",
           r.decode_tps_b1, b1_bw / 1e9);
    printf("  decode batch 8:              %10.1f tokens/s\n", r.decode_tps_b8);
    printf("  decode batch 1 vs memcpy:    %.2f of the memcpy bandwidth (%.2f GB/s read+write)\n",
           b1_bw / copy_bw, copy_bw / 1e9);
    bench_gemm(be, m, prompt_len, peak, bf16);
    hpd_model_destroy(m);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {{"threads", 1, 0, 't'}, {"prompt", 1, 0, 'p'},
                                             {"decode", 1, 0, 'd'}, {"load-only", 0, 0, 'l'},
                                             {"device", 1, 0, 'D'}, {0, 0, 0, 0}};
    bool load_only = false;
    uint64_t threads = 0, prompt = 512, decode = 64;
    hpd_backend_params_t bp = {.device = "cpu"};
    hpd_backend_t *be;
    int c;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'l' || c == 'D') {
            load_only = load_only || c == 'l';
            bp.device = c == 'D' ? optarg : bp.device;
            continue;
        }
        uint64_t *dst = c == 't' ? &threads : c == 'p' ? &prompt : c == 'd' ? &decode : NULL;
        if (dst == NULL || hpd_parse_u64(optarg, 1, 1u << 20, dst) != 0) {
            fprintf(stderr, "usage: hpd-bench-cpu [--threads N] [--prompt N] [--decode N] "
                            "[--device cpu|cpu-bf16] [--load-only] MODEL_DIR...\n");
            return 2;
        }
    }
    if (optind == argc) {
        fprintf(stderr, "hpd-bench-cpu: give at least one model directory\n");
        return 2;
    }
    bp.n_threads = (uint32_t)threads;
    if (hpd_backend_create(&bp, &be) != HPD_OK)
        return 1;
    const int nt = threads ? (int)threads : omp_get_num_procs();
    const double bw = memcpy_bandwidth((size_t)512 << 20, nt);
    printf("memcpy 512 MiB on %d threads: %.2f GB/s (read + write)\n", nt, bw / 1e9);
    const double peak = fma_peak(nt);
    printf("fp32 FMA peak on %d threads: %.1f GFLOP/s (8 lanes)\n", nt, peak / 1e9);
    const double bf16 = strcmp(be->ops->numerics, "bf16-products") == 0 ? bf16_peak(nt) : 0;
    if (bf16 > 0)
        printf("VDPBF16PS peak on %d threads: %.1f GFLOP/s (16 lanes, 2 products each)\n", nt,
               bf16 / 1e9);
    printf("device %s (numerics %s)\n", be->ops->name, be->ops->numerics);
    for (int i = optind; i < argc; i++)
        if (bench_model(argv[i], be, (uint32_t)prompt, (uint32_t)decode, bw, peak, bf16,
                        load_only) != 0) {
            fprintf(stderr, "hpd-bench-cpu: %s failed\n", argv[i]);
            hpd_backend_destroy(be);
            return 1;
        }
    hpd_backend_destroy(be);
    return 0;
}
