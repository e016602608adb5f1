/* hpd-bench-prefix: the prefix cache on a shared-prefix workload.
 *
 * R requests over S system prompts of L1..L2 tokens, each followed by its own
 * user turn of 32..256 tokens, arriving in a random order. For every request
 * it reports the hit against the ideal (the longest common prefix with any
 * earlier prompt, limited to that prompt's full 64-token blocks and to
 * prompt[:-1], rounded down to 64), the same under vLLM's align-mode rule
 * (state only at the ends of blocks of 528 or 2096 tokens), and runs the
 * workload on the engine with the cache off and on to measure the prefill
 * time saved (tokens must be identical).
 *
 *   hpd-bench-prefix --model DIR [--requests 200] [--systems 20] [--min 1024]
 *                    [--max 4096] [--batch 1] [--seed 1]
 *
 * The rule figures assume requests arrive one after another; --batch 1 runs
 * the engine that way too, so the figures compare. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "engine/engine.h"

typedef struct {
    int32_t *tok;
    uint32_t len;
} prompt_t;

static uint32_t rnd(uint64_t seed, uint64_t i, uint32_t n)
{
    return hpd_philox4x32(seed, i, 77).v[0] % n;
}

static uint32_t lcp(const prompt_t *a, const prompt_t *b)
{
    uint32_t n = HPD_MIN(a->len, b->len), i = 0;
    while (i < n && a->tok[i] == b->tok[i])
        i++;
    return i;
}

/* Best hit under "state at the end of every full block of `block` tokens of
 * an earlier prompt": the ideal for block 64, vLLM's align mode for 528/2096. */
static uint64_t rule_hits(const prompt_t *p, uint32_t n, uint32_t block)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t best = 0;
        for (uint32_t j = 0; j < i; j++) {
            uint32_t l = HPD_MIN(lcp(&p[i], &p[j]), p[j].len / block * block);
            l = HPD_MIN(l, p[i].len - 1) / block * block;
            best = HPD_MAX(best, l);
        }
        total += best;
    }
    return total;
}

typedef struct {
    double prefill_s, wall_s;
    uint64_t prefill_tokens, cached;
    int32_t *out; /* [n][8] */
} run_t;

static int run(const hpd_model_t *m, hpd_backend_t *be, const prompt_t *p, uint32_t n,
               uint32_t batch, bool cache, run_t *r)
{
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    hpd_engine_stats_t s;
    uint64_t *ids = malloc(n * sizeof(uint64_t));
    uint32_t max_len = 0;

    for (uint32_t i = 0; i < n; i++)
        max_len = HPD_MAX(max_len, p[i].len);
    hpd_engine_params_init(&ep);
    ep.model = m;
    ep.backend = be;
    ep.max_batch = batch;
    ep.max_context = max_len + 8;
    ep.prefill_chunk = 512;
    ep.prefix_cache = cache;
    ep.n_checkpoints = 512;
    ep.n_pages = (uint32_t)(2ull * m->config.n_full_layers * 60000 / 64 + 1024);
    if (hpd_engine_create(&ep, &e) != HPD_OK)
        return -1;
    r->out = calloc((size_t)n * 8, sizeof(int32_t));
    const double t0 = hpd_time_now();
    for (uint32_t i = 0; i < n; i++) {
        hpd_request_params_t rp = {
            .prompt = p[i].tok, .n_prompt = p[i].len, .max_tokens = 8, .sampling = {.top_p = 1}};
        if (hpd_engine_submit(e, &rp, &ids[i]) != HPD_OK)
            return -1;
    }
    if (hpd_engine_run(e) != HPD_OK)
        return -1;
    r->wall_s = hpd_time_now() - t0;
    r->cached = 0;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t *t;
        uint32_t k;
        hpd_request_info_t info;
        hpd_engine_result(e, ids[i], &t, &k, NULL);
        memcpy(r->out + (size_t)i * 8, t, k * sizeof(int32_t));
        hpd_engine_request_info(e, ids[i], &info);
        r->cached += info.cached_tokens;
    }
    hpd_engine_stats(e, &s);
    r->prefill_s = s.prefill_seconds;
    r->prefill_tokens = s.prefill_tokens;
    hpd_engine_destroy(e);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", 1, 0, 'm'}, {"requests", 1, 0, 'r'}, {"systems", 1, 0, 's'},
        {"min", 1, 0, 'a'},   {"max", 1, 0, 'b'},      {"batch", 1, 0, 'B'},
        {"seed", 1, 0, 'S'},  {0, 0, 0, 0}};
    const char *dir = NULL;
    uint64_t n_req = 200, n_sys = 20, lo = 1024, hi = 4096, batch = 1, seed = 1, v;
    int c;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'm') {
            dir = optarg;
            continue;
        }
        if (hpd_parse_u64(optarg, 1, 1u << 20, &v) != 0) {
            fprintf(stderr, "hpd-bench-prefix: bad value '%s'\n", optarg);
            return 2;
        }
        *(c == 'r' ? &n_req : c == 's' ? &n_sys : c == 'a' ? &lo : c == 'b' ? &hi
                                                  : c == 'B' ? &batch : &seed) = v;
    }
    if (dir == NULL || lo > hi) {
        fprintf(stderr, "usage: hpd-bench-prefix --model DIR [--requests N] [--systems N] "
                        "[--min L] [--max L] [--batch N] [--seed S]\n");
        return 2;
    }
    hpd_model_t *m;
    hpd_backend_t *be;
    hpd_backend_params_t bp = {.device = "cpu"};
    if (hpd_model_load(dir, &m) != HPD_OK || hpd_backend_create(&bp, &be) != HPD_OK)
        return 1;
    const uint32_t V = m->config.vocab_size;

    /* system prompts, then requests: a system prompt and a fresh user turn */
    prompt_t *sys = calloc(n_sys, sizeof(prompt_t)), *p = calloc(n_req, sizeof(prompt_t));
    uint64_t total_tokens = 0;
    for (uint32_t s = 0; s < n_sys; s++) {
        sys[s].len = (uint32_t)lo + rnd(seed, s, (uint32_t)(hi - lo + 1));
        sys[s].tok = malloc(sys[s].len * sizeof(int32_t));
        for (uint32_t i = 0; i < sys[s].len; i++)
            sys[s].tok[i] = (int32_t)rnd(seed + 1000 + s, i, V);
    }
    for (uint32_t r = 0; r < n_req; r++) {
        const prompt_t *sp = &sys[rnd(seed + 1, r, (uint32_t)n_sys)];
        const uint32_t user = 32 + rnd(seed + 2, r, 225);
        p[r].len = sp->len + user;
        p[r].tok = malloc(p[r].len * sizeof(int32_t));
        memcpy(p[r].tok, sp->tok, sp->len * sizeof(int32_t));
        for (uint32_t i = 0; i < user; i++)
            p[r].tok[sp->len + i] = (int32_t)rnd(seed + 5000 + r, i, V);
        total_tokens += p[r].len;
    }

    const uint64_t ideal = rule_hits(p, (uint32_t)n_req, 64);
    const uint64_t vllm528 = rule_hits(p, (uint32_t)n_req, 528);
    const uint64_t vllm2096 = rule_hits(p, (uint32_t)n_req, 2096);
    run_t off, on;
    if (run(m, be, p, (uint32_t)n_req, (uint32_t)batch, false, &off) != 0 ||
        run(m, be, p, (uint32_t)n_req, (uint32_t)batch, true, &on) != 0) {
        fprintf(stderr, "hpd-bench-prefix: engine run failed\n");
        return 1;
    }
    const bool same = memcmp(off.out, on.out, n_req * 8 * sizeof(int32_t)) == 0;

    printf("workload: %llu requests over %llu system prompts of %llu..%llu tokens, user turns "
           "32..256, batch %llu; %llu prompt tokens\n",
           (unsigned long long)n_req, (unsigned long long)n_sys, (unsigned long long)lo,
           (unsigned long long)hi, (unsigned long long)batch, (unsigned long long)total_tokens);
    printf("ideal hit tokens (LCP rounded down to 64):  %10llu\n", (unsigned long long)ideal);
    printf("hybridpd prefix cache hit tokens:           %10llu  (%.3f of ideal)\n",
           (unsigned long long)on.cached, (double)on.cached / (double)ideal);
    printf("vLLM align-mode rule, blocks of 528:        %10llu  (%.3f of ideal)\n",
           (unsigned long long)vllm528, (double)vllm528 / (double)ideal);
    printf("vLLM align-mode rule, blocks of 2096:       %10llu  (%.3f of ideal)\n",
           (unsigned long long)vllm2096, (double)vllm2096 / (double)ideal);
    printf("prefill: cache off %llu tokens in %.2f s, cache on %llu tokens in %.2f s\n",
           (unsigned long long)off.prefill_tokens, off.prefill_s,
           (unsigned long long)on.prefill_tokens, on.prefill_s);
    printf("tokens identical with the cache on and off: %s\n", same ? "yes" : "NO");
    printf("prefill time saved: %.1f%% (%.2f s -> %.2f s; wall %.2f s -> %.2f s)\n",
           100.0 * (1.0 - on.prefill_s / off.prefill_s), off.prefill_s, on.prefill_s,
           off.wall_s, on.wall_s);
    hpd_backend_destroy(be);
    hpd_model_destroy(m);
    return same ? 0 : 1;
}
