/* hpd-bench-cluster: the overhead of the disaggregated path at low load.
 *
 * Runs the same prompts, one at a time, through the monolithic engine in
 * this process, through a local cluster (a coordinator, one prefill and
 * one decode node, started here on 127.0.0.1 with the same thread count per
 * node) and through a front door of that cluster (hpd-coordinator
 * --scheduler: the decode node streams the tokens to it, not through the
 * coordinator), and prints TTFT and TPOT p50/p99 of each with their ratio
 * to the engine's, and the share of the KV/state transfer time hidden
 * behind prefill compute by the layerwise push (1 - exposed / total
 * transfer time). The tokens of all must be identical. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/spawn.h"
#include "client/client.h"
#include "common/rng.h"
#include "common/util.h"
#include "engine/engine.h"

typedef struct {
    double ttft, tpot;
} lat_t;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

typedef struct {
    double t_submit, t_first, t_last;
} stream_t;

static void on_token(void *arg, uint64_t h, uint32_t index, const int32_t *ids, uint32_t n)
{
    stream_t *s = arg;
    const double now = hpd_time_now();
    if (s->t_first == 0)
        s->t_first = now;
    s->t_last = now;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *players = "64,1,nhd", *dlayout = "16,2,nhd";
    uint32_t n_prompts = 16, len = 512, max_tokens = 32, threads = 1;
    static const struct option longopts[] = {
        {"model", 1, 0, 'm'},          {"prompts", 1, 0, 'n'}, {"prompt-len", 1, 0, 'l'},
        {"max-tokens", 1, 0, 't'},     {"threads", 1, 0, 'j'}, {"prefill-layout", 1, 0, 'p'},
        {"decode-layout", 1, 0, 'd'},  {0, 0, 0, 0}};
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'n': if (hpd_parse_u64(optarg, 2, 10000, &v)) goto usage; n_prompts = (uint32_t)v; break;
        case 'l': if (hpd_parse_u64(optarg, 1, 100000, &v)) goto usage; len = (uint32_t)v; break;
        case 't': if (hpd_parse_u64(optarg, 2, 10000, &v)) goto usage; max_tokens = (uint32_t)v; break;
        case 'j': if (hpd_parse_u64(optarg, 1, 1024, &v)) goto usage; threads = (uint32_t)v; break;
        case 'p': players = optarg; break;
        case 'd': dlayout = optarg; break;
        default: goto usage;
        }
    }
    if (model_dir == NULL)
        goto usage;
    signal(SIGPIPE, SIG_IGN);

    int32_t *prompts = malloc((size_t)n_prompts * len * sizeof(int32_t));
    int32_t *ref = malloc((size_t)n_prompts * max_tokens * sizeof(int32_t));
    double *ttft[3], *tpot[3];
    for (int k = 0; k < 3; k++) {
        ttft[k] = malloc(n_prompts * sizeof(double));
        tpot[k] = malloc(n_prompts * sizeof(double));
    }
    hpd_model_t *model;
    if (hpd_model_load(model_dir, &model) != HPD_OK)
        return 1;
    for (uint32_t i = 0; i < n_prompts * len; i++)
        prompts[i] = (int32_t)(hpd_philox4x32(77, i, 0).v[0] % model->config.vocab_size);

    /* the monolithic engine, one request at a time (no prefix hits: distinct prompts) */
    hpd_backend_t *be;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = threads};
    hpd_engine_params_t ep;
    hpd_engine_t *e;
    hpd_backend_create(&bp, &be);
    hpd_engine_params_init(&ep);
    ep.model = model;
    ep.backend = be;
    ep.max_context = len + max_tokens + 64;
    if (hpd_engine_create(&ep, &e) != HPD_OK)
        return 1;
    for (uint32_t i = 0; i < n_prompts; i++) {
        hpd_request_params_t rp = {.prompt = prompts + (size_t)i * len,
                                   .n_prompt = len,
                                   .max_tokens = max_tokens,
                                   .sampling = {.top_p = 1}};
        uint64_t id;
        const int32_t *toks;
        uint32_t n = 0;
        hpd_request_state_t st = HPD_REQ_WAITING;
        const double t0 = hpd_time_now();
        double t_first = 0;
        hpd_engine_submit(e, &rp, &id);
        while (st != HPD_REQ_FINISHED && st != HPD_REQ_FAILED) {
            hpd_engine_step(e, NULL);
            hpd_engine_result(e, id, &toks, &n, &st);
            if (n > 0 && t_first == 0)
                t_first = hpd_time_now();
        }
        ttft[0][i] = (t_first - t0) * 1e3;
        tpot[0][i] = (hpd_time_now() - t_first) * 1e3 / (max_tokens - 1);
        memcpy(ref + (size_t)i * max_tokens, toks, max_tokens * sizeof(int32_t));
        hpd_engine_release(e, id);
    }
    hpd_engine_destroy(e);
    hpd_backend_destroy(be);

    /* the cluster */
    char dir[] = "/tmp/hpd-bench-cluster-XXXXXX", port_file[128], log[160], addr[64], th[16],
         ctx[16];
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(port_file, sizeof(port_file), "%s/port", dir);
    snprintf(th, sizeof(th), "%u", threads);
    snprintf(ctx, sizeof(ctx), "%u", len + max_tokens + 64);
    snprintf(log, sizeof(log), "%s/coordinator.log", dir);
    char *cargv[] = {HPD_COORDINATOR, "--port", "0", "--port-file", port_file,
                     "--heartbeat-ms", "100", "--lease-ms", "30000", NULL};
    pid_t pids[4];
    pids[0] = hpd_bench_spawn(cargv, log);
    const uint16_t port = hpd_bench_read_port(port_file);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    char *pargv[] = {HPD_PREFILL, "--coordinator", addr, "--model", (char *)model_dir,
                     "--threads", th, "--kv-layout", (char *)players, "--max-context", ctx,
                     "--no-prefix-cache", "--log-level", "warn", NULL};
    char *dargv[] = {HPD_DECODE, "--coordinator", addr, "--model", (char *)model_dir,
                     "--threads", th, "--kv-layout", (char *)dlayout, "--max-context", ctx,
                     "--log-level", "warn", NULL};
    snprintf(log, sizeof(log), "%s/prefill.log", dir);
    pids[1] = hpd_bench_spawn(pargv, log);
    snprintf(log, sizeof(log), "%s/decode.log", dir);
    pids[2] = hpd_bench_spawn(dargv, log);

    /* a front door of it */
    char door_port_file[128], sched[80];
    snprintf(door_port_file, sizeof(door_port_file), "%s/door.port", dir);
    snprintf(sched, sizeof(sched), "%s", addr);
    char *fargv[] = {HPD_COORDINATOR, "--port", "0", "--port-file", door_port_file,
                     "--scheduler", sched, "--log-level", "warn", NULL};
    snprintf(log, sizeof(log), "%s/door.log", dir);
    pids[3] = hpd_bench_spawn(fargv, log);
    const uint16_t door_port = hpd_bench_read_port(door_port_file);

    double push = 0, exposed = 0, prefill = 0;
    uint32_t identical = 0;
    for (int k = 1; k < 3; k++) { /* straight to the coordinator, then through the door */
        hpd_client_t *client = hpd_bench_client(k == 1 ? port : door_port);
        if (client == NULL) {
            fprintf(stderr, "hpd-bench-cluster: the %s did not come up (logs in %s)\n",
                    k == 1 ? "coordinator" : "front door", dir);
            return 1;
        }
        for (uint32_t i = 0; i < n_prompts; i++) {
            hpd_generate_params_t gp = {.prompt = prompts + (size_t)i * len,
                                        .n_prompt = len,
                                        .max_tokens = max_tokens,
                                        .sampling = {.top_p = 1}};
            hpd_generate_result_t r;
            stream_t s = {hpd_time_now(), 0, 0};
            hpd_status_t st;
            /* nodes register within a moment of the coordinator (and a door
             * hears of them within a second) */
            int tries = 0;
            while ((st = hpd_client_generate(client, &gp, on_token, &s, &r)) ==
                       HPD_ERR_NO_RESOURCE &&
                   i == 0 && ++tries < 100) {
                hpd_generate_result_free(&r);
                usleep(100000);
                s = (stream_t){hpd_time_now(), 0, 0};
            }
            if (st != HPD_OK) {
                fprintf(stderr, "hpd-bench-cluster: request %u failed: %s (logs in %s)\n", i,
                        r.error, dir);
                return 1;
            }
            ttft[k][i] = (s.t_first - s.t_submit) * 1e3;
            tpot[k][i] = (s.t_last - s.t_first) * 1e3 / (max_tokens - 1);
            if (k == 1) {
                push += r.push_ms;
                exposed += r.exposed_push_ms;
                prefill += r.prefill_ms;
            }
            identical += r.n_tokens == max_tokens &&
                         memcmp(r.tokens, ref + (size_t)i * max_tokens, max_tokens * 4) == 0;
            hpd_generate_result_free(&r);
        }
        hpd_client_destroy(client);
    }
    for (int i = 3; i >= 0; i--) {
        int st;
        kill(pids[i], SIGTERM);
        waitpid(pids[i], &st, 0);
    }
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);

    const char *names[3] = {"hpd-run engine", "cluster", "through a door"};
    double q[3][4];
    printf("model %s: %u prompts of %u tokens, %u new tokens each, one at a time, %u thread(s) "
           "per process; prefill %s -> decode %s over UCX tcp/lo\n",
           model_dir, n_prompts, len, max_tokens, threads, players, dlayout);
    for (int k = 0; k < 3; k++) {
        q[k][0] = pct(ttft[k], (int)n_prompts, 0.5);
        q[k][1] = pct(ttft[k], (int)n_prompts, 0.99);
        q[k][2] = pct(tpot[k], (int)n_prompts, 0.5);
        q[k][3] = pct(tpot[k], (int)n_prompts, 0.99);
        printf("%-15s TTFT p50 %8.2f ms  p99 %8.2f ms   TPOT p50 %7.3f ms  p99 %7.3f ms\n",
               names[k], q[k][0], q[k][1], q[k][2], q[k][3]);
    }
    printf("tokens identical: %u/%u\n", identical, 2 * n_prompts);
    printf("transfer: %.2f ms per request on average, %.2f ms of it after the prefill compute "
           "(%.2f ms): %.1f%% hidden by the layerwise push\n",
           push / n_prompts, exposed / n_prompts, prefill / n_prompts,
           push > 0 ? 100.0 * (1.0 - exposed / push) : 0.0);
    for (int k = 1; k < 3; k++)
        printf("%s / engine: TTFT p50 %.3f  p99 %.3f   TPOT p50 %.3f  p99 %.3f\n",
               k == 1 ? "cluster" : "through a door", q[k][0] / q[0][0], q[k][1] / q[0][1],
               q[k][2] / q[0][2], q[k][3] / q[0][3]);
    hpd_model_destroy(model);
    return identical == 2 * n_prompts ? 0 : 1;
usage:
    fprintf(stderr, "usage: hpd-bench-cluster --model DIR [--prompts N (16)] [--prompt-len L "
                    "(512)] [--max-tokens T (32)] [--threads N (1)] [--prefill-layout B,P,O "
                    "(64,1,nhd)] [--decode-layout B,P,O (16,2,nhd)]\n");
    return 2;
}
