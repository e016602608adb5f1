/* hpd-bench-tp: tensor parallelism on the CPU (issue 37), on the same
 * cores in one run:
 *   - TP 2 with one rank a thread against TP 1 with all the threads:
 *     prefill and decode tokens/s, and the share of the step rank 0 spends
 *     at the ranks' meetings (the cross-rank sums and gathers, waiting for
 *     the other rank included);
 *   - the canonical sum (8 GEMMs a row-parallel product, the tree) against
 *     one GEMM a product (--tp-fast's layout), at TP 1 and TP 2: the price
 *     of getting TP 1's bits at every degree.
 *
 *   hpd-bench-tp [--threads N (2)] [--prompt N (512)] [--decode N (64)]
 *                [--batch B (1)] [--repeat R (3)] [--device cpu|cpu-bf16] MODEL_DIR
 *
 * Each configuration runs R times, interleaved with the others, and the
 * best of each figure is printed (the machine is shared). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "model/model.h"

typedef struct {
    uint32_t tp;
    bool fast;
    const char *name;
    double prefill, decode, meet_prefill, meet_decode; /* best tokens/s; meeting share */
} config_t;

typedef struct {
    uint32_t threads, prompt, decode, batch;
    const char *device;
} opts_t;

static int submit_run(hpd_engine_t *e, uint32_t n, uint32_t len, uint32_t max_tokens,
                      uint32_t vocab, uint32_t salt)
{
    int32_t *p = malloc(len * sizeof(int32_t));
    uint64_t id;
    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t i = 0; i < len; i++)
            p[i] = (int32_t)((i * 7919u + (r + salt) * 104729u + 13) % vocab);
        hpd_request_params_t rp = {.prompt = p,
                                   .n_prompt = len,
                                   .max_tokens = max_tokens,
                                   .sampling = {.top_p = 1},
                                   .ignore_eos = true};
        if (hpd_engine_submit(e, &rp, &id) != HPD_OK) {
            free(p);
            return -1;
        }
    }
    free(p);
    return hpd_engine_run(e) == HPD_OK ? 0 : -1;
}

static int run_config(const char *dir, const opts_t *o, config_t *c, uint32_t salt)
{
    hpd_model_t *models[HPD_TP_MAX] = {0};
    hpd_backend_t *backends[HPD_TP_MAX] = {0};
    hpd_engine_t *e = NULL;
    hpd_engine_params_t ep;
    hpd_engine_stats_t s0, s1, s2;
    int rc = -1;

    if (hpd_model_load_tp(dir, c->tp, c->fast, models) != HPD_OK)
        return -1;
    hpd_backend_params_t bp = {.device = o->device,
                               .n_threads = HPD_MAX(o->threads / c->tp, 1u)};
    for (uint32_t r = 0; r < c->tp; r++)
        if (hpd_backend_create(&bp, &backends[r]) != HPD_OK)
            goto out;
    hpd_engine_params_init(&ep);
    ep.model = models[0];
    ep.backend = backends[0];
    ep.tp_models = (const hpd_model_t *const *)models;
    ep.tp_backends = backends;
    ep.prefix_cache = false;
    ep.max_batch = HPD_MAX(o->batch, 1u);
    ep.max_context = o->prompt + o->decode + 64;
    if (hpd_engine_create(&ep, &e) != HPD_OK)
        goto out;
    const uint32_t V = models[0]->config.vocab_size;
    /* warm up, then a prompt alone (its prefill), then a batch's decode */
    if (submit_run(e, 1, 64, 2, V, salt + 1000) != 0)
        goto out;
    hpd_engine_stats(e, &s0);
    if (submit_run(e, 1, o->prompt, 1, V, salt) != 0)
        goto out;
    hpd_engine_stats(e, &s1);
    if (submit_run(e, o->batch, 16, o->decode, V, salt + 1) != 0)
        goto out;
    hpd_engine_stats(e, &s2);
    const double ps = s1.prefill_seconds - s0.prefill_seconds;
    const double ds = s2.decode_seconds - s1.decode_seconds;
    const double pt = (double)(s1.prefill_tokens - s0.prefill_tokens);
    const double dt = (double)(s2.decode_tokens - s1.decode_tokens);
    const double pr = ps > 0 ? pt / ps : 0, dr = ds > 0 ? dt / ds : 0;
    if (pr > c->prefill) {
        c->prefill = pr;
        c->meet_prefill = (s1.tp_prefill_seconds - s0.tp_prefill_seconds) / ps;
    }
    if (dr > c->decode) {
        c->decode = dr;
        c->meet_decode = (s2.tp_decode_seconds - s1.tp_decode_seconds) / ds;
    }
    rc = 0;
out:
    hpd_engine_destroy(e);
    for (uint32_t r = 0; r < c->tp; r++) {
        hpd_backend_destroy(backends[r]);
        hpd_model_destroy(models[r]);
    }
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o = {.threads = 2, .prompt = 512, .decode = 64, .batch = 1, .device = "cpu"};
    uint32_t repeat = 3;
    static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                             {"prompt", required_argument, NULL, 'p'},
                                             {"decode", required_argument, NULL, 'd'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"repeat", required_argument, NULL, 'r'},
                                             {"device", required_argument, NULL, 'D'},
                                             {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (ch == 'D') {
            o.device = optarg;
            continue;
        }
        const long v = optarg != NULL ? strtol(optarg, NULL, 10) : 0;
        if (v <= 0 || v > 1000000) {
            fprintf(stderr, "hpd-bench-tp: a positive number expected\n");
            return 2;
        }
        switch (ch) {
        case 't': o.threads = (uint32_t)v; break;
        case 'p': o.prompt = (uint32_t)v; break;
        case 'd': o.decode = (uint32_t)v; break;
        case 'b': o.batch = (uint32_t)v; break;
        case 'r': repeat = (uint32_t)v; break;
        default: return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: hpd-bench-tp [--threads N] [--prompt N] [--decode N] "
                        "[--batch B] [--repeat R] MODEL_DIR\n");
        return 2;
    }
    hpd_log_set_level(HPD_LOG_LEVEL_WARN);
    config_t cs[] = {{.tp = 1, .name = "tp 1 canonical"},
                     {.tp = 1, .fast = true, .name = "tp 1 fast"},
                     {.tp = 2, .name = "tp 2 canonical"},
                     {.tp = 2, .fast = true, .name = "tp 2 fast"}};
    const uint32_t n = sizeof(cs) / sizeof(cs[0]);
    for (uint32_t k = 0; k < repeat; k++)
        for (uint32_t i = 0; i < n; i++)
            if (run_config(argv[optind], &o, &cs[i], k) != 0) {
                fprintf(stderr, "hpd-bench-tp: %s failed\n", cs[i].name);
                return 1;
            }
    printf("model %s, device %s, %u threads in all, prompt %u, decode %u tokens x batch %u, "
           "best of %u\n", argv[optind], o.device, o.threads, o.prompt, o.decode, o.batch, repeat);
    printf("%-16s %12s %12s %14s %14s\n", "", "prefill t/s", "decode t/s", "meet prefill",
           "meet decode");
    for (uint32_t i = 0; i < n; i++)
        printf("%-16s %12.1f %12.2f %13.1f%% %13.1f%%\n", cs[i].name, cs[i].prefill,
               cs[i].decode, 100 * cs[i].meet_prefill, 100 * cs[i].meet_decode);
    printf("tp 2 / tp 1 (canonical): prefill %.3f, decode %.3f (goal >= 0.9)\n",
           cs[2].prefill / cs[0].prefill, cs[2].decode / cs[0].decode);
    printf("canonical / fast, tp 1: prefill %.3f, decode %.3f (a decode step costs %.1f%% more; "
           "goal <= 5%%)\n", cs[0].prefill / cs[1].prefill, cs[0].decode / cs[1].decode,
           100 * (cs[1].decode / cs[0].decode - 1));
    printf("canonical / fast, tp 2: prefill %.3f, decode %.3f\n", cs[2].prefill / cs[3].prefill,
           cs[2].decode / cs[3].decode);
    return 0;
}
