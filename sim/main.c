/* hpd-sim: simulated prefill and decode nodes (sim/sim.h) for a running
 * coordinator, and optionally a load on it (sim/load.h) whose every
 * answer is checked; prints one line of figures at the end. Without
 * --requests it serves until SIGINT or SIGTERM. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "sim/load.h"
#include "sim/sim.h"
#include "node/proto.h"
#include "transport/rpc.h"

static const char usage[] =
    "usage: hpd-sim --coordinator HOST:PORT [options]\n"
    "  --token-file F        the node secret (an open coordinator without)\n"
    "  --client-key K        the load's client key\n"
    "  --prefill N           simulated prefill nodes (default 2)\n"
    "  --decode N            simulated decode nodes (default 2)\n"
    "  --prefill-us-per-token T, --push-us-per-page P, --step-us S, --speed-spread X\n"
    "                        the timing model (defaults 20, 50, 20000, 0.2)\n"
    "  --slots N --pages N   each decode node's (defaults 64, 100000)\n"
    "  --vocab N             (default 1000)\n"
    "  --requests N          a load of N requests, then exit (0: serve only)\n"
    "  --rate R              arrivals per second, Poisson (0: the window's pace)\n"
    "  --window N            open requests at most (default 256)\n"
    "  --connections N       client connections (default 4)\n"
    "  --prompt-tokens N --max-tokens N --prefixes N --prefix-tokens N\n"
    "  --cache-blocks N      each prefill node's prefix cache, blocks of 64 tokens, with\n"
    "                        its summary in the heartbeats (default 4096; 0: none)\n"
    "  --seed N\n"
    "  --coordinator-pid P   report the coordinator's CPU and memory from /proc\n"
    "  --doors H:P[,H:P...]  the load's connections go to these front doors of the\n"
    "                        coordinator in turn (docs/cluster.md, \"Front doors\")\n"
    "  --door-pids P[,P...]  report the doors' CPU from /proc\n"
    "  --http H:P[,H:P...]   the load through the HTTP API at these addresses\n"
    "                        (completions with return_token_ids; --connections up to\n"
    "                        1024 keep-alive connections, a request at a time each)\n";

/* A process's CPU seconds and its resident and peak memory (KiB), from
 * /proc; false where it cannot be read. */
static bool proc_usage(long pid, double *cpu_s_p, long *rss_kib_p, long *hwm_kib_p)
{
    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long utime = 0, stime = 0;
    /* after the name: state, then fields 4 .. 13, then utime and stime */
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                            &stime) != 2)
        return false;
    *cpu_s_p = (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    if ((f = fopen(path, "r")) == NULL)
        return false;
    *rss_kib_p = *hwm_kib_p = 0;
    while (fgets(buf, sizeof(buf), f) != NULL) {
        sscanf(buf, "VmRSS: %ld", rss_kib_p);
        sscanf(buf, "VmHWM: %ld", hwm_kib_p);
    }
    fclose(f);
    return true;
}

static volatile sig_atomic_t stop;
static void on_signal(int sig) { stop = 1; }

int main(int argc, char **argv)
{
    hpd_sim_params_t sp = {.n_prefill = 2, .n_decode = 2, .prefill_us_per_token = 20,
                           .push_us_per_page = 50, .step_us = 20000, .speed_spread = 0.2,
                           .vocab = 1000, .slots = 64, .pages = 100000, .max_context = 32768,
                           .seed = 1, .cache_blocks = 4096};
    hpd_load_params_t lp = {.window = 256, .connections = 4, .prompt_tokens = 64,
                            .max_tokens = 16, .seed = 1};
    const char *coord = NULL, *token_file = NULL;
    char *token = NULL;
    long coord_pid = 0;
    hpd_endpoint_t doors[8], http[8];
    long door_pids[8];
    uint32_t n_door_pids = 0;
    static const struct option longs[] = {
        {"coordinator", 1, 0, 'c'}, {"token-file", 1, 0, 't'}, {"client-key", 1, 0, 'k'},
        {"prefill", 1, 0, 'P'}, {"decode", 1, 0, 'D'}, {"prefill-us-per-token", 1, 0, 1},
        {"push-us-per-page", 1, 0, 2}, {"step-us", 1, 0, 3}, {"speed-spread", 1, 0, 4},
        {"slots", 1, 0, 5}, {"pages", 1, 0, 6}, {"vocab", 1, 0, 7}, {"requests", 1, 0, 8},
        {"rate", 1, 0, 9}, {"window", 1, 0, 10}, {"connections", 1, 0, 11},
        {"prompt-tokens", 1, 0, 12}, {"max-tokens", 1, 0, 13}, {"prefixes", 1, 0, 14},
        {"prefix-tokens", 1, 0, 15}, {"seed", 1, 0, 16}, {"coordinator-pid", 1, 0, 17}, {"cache-blocks", 1, 0, 18},
        {"doors", 1, 0, 19}, {"door-pids", 1, 0, 20}, {"http", 1, 0, 21},
        {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (o) {
        case 'c': coord = optarg; break;
        case 't': token_file = optarg; break;
        case 'k': lp.key = optarg; break;
        case 'P': sp.n_prefill = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'D': sp.n_decode = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 1: sp.prefill_us_per_token = atof(optarg); break;
        case 2: sp.push_us_per_page = atof(optarg); break;
        case 3: sp.step_us = atof(optarg); break;
        case 4: sp.speed_spread = atof(optarg); break;
        case 5: sp.slots = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 6: sp.pages = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 7: sp.vocab = lp.vocab = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 8: lp.requests = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 9: lp.rate = atof(optarg); break;
        case 10: lp.window = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 11: lp.connections = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 12: lp.prompt_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 13: lp.max_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 14: lp.prefixes = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 15: lp.prefix_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 16: sp.seed = lp.seed = strtoull(optarg, NULL, 10); break;
        case 17: coord_pid = strtol(optarg, NULL, 10); break;
        case 18: sp.cache_blocks = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 19: {
            char why[200];
            if (!hpd_proto_parse_endpoints(optarg, doors, 8, &lp.n_doors, why, sizeof(why))) {
                fprintf(stderr, "hpd-sim: --doors: %s\n", why);
                return 2;
            }
            lp.doors = doors;
            break;
        }
        case 21: {
            char why[200];
            if (!hpd_proto_parse_endpoints(optarg, http, 8, &lp.n_http, why, sizeof(why))) {
                fprintf(stderr, "hpd-sim: --http: %s\n", why);
                return 2;
            }
            lp.http = http;
            break;
        }
        case 20:
            for (char *t = strtok(optarg, ","); t != NULL && n_door_pids < 8; t = strtok(NULL, ","))
                door_pids[n_door_pids++] = strtol(t, NULL, 10);
            break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    const char *colon = coord != NULL ? strrchr(coord, ':') : NULL;
    if (colon == NULL || lp.prompt_tokens == 0 || lp.max_tokens == 0 ||
        sp.n_prefill == 0 || sp.n_decode == 0) {
        fprintf(stderr, "hpd-sim: --coordinator HOST:PORT, at least one node of each role and "
                "prompts and answers of a token or more are needed\n%s", usage);
        return 2;
    }
    lp.vocab = sp.vocab;
    char host[256];
    snprintf(host, sizeof(host), "%.*s", (int)(colon - coord), coord);
    sp.coord_host = lp.host = host;
    sp.coord_port = lp.port = (uint16_t)atoi(colon + 1);
    if (token_file != NULL && hpd_rpc_read_token(token_file, &token) != HPD_OK) {
        fprintf(stderr, "hpd-sim: cannot read the token file %s\n", token_file);
        return 1;
    }
    sp.token = token;
    /* three descriptors a node (its server, its connection to the
     * coordinator, the coordinator's to it), and the load's */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct event_base *base = event_base_new();
    sp.base = lp.base = base;
    double cpu0 = 0, cpu1 = 0, cpu2 = 0;
    long rss0 = 0, rss1 = 0, rss2 = 0, hwm = 0;
    const bool watch = coord_pid > 0 && proc_usage(coord_pid, &cpu0, &rss0, &hwm);
    double doors_cpu1 = 0, doors_cpu2 = 0;
    hpd_sim_t *sim;
    if (hpd_sim_create(&sp, &sim) != HPD_OK) {
        fprintf(stderr, "hpd-sim: cannot start the nodes\n");
        return 1;
    }
    const double t0 = hpd_time_now();
    char why[300] = "";
    const uint32_t all = sp.n_prefill + sp.n_decode;
    while (!stop && hpd_sim_registered(sim) + hpd_sim_refused(sim, why, sizeof(why)) < all &&
           hpd_time_now() - t0 < 120)
        event_base_loop(base, EVLOOP_ONCE);
    if (hpd_sim_registered(sim) < all) {
        fprintf(stderr, "hpd-sim: %u of %u nodes registered%s%s\n", hpd_sim_registered(sim), all,
                why[0] ? "; " : "", why);
        hpd_sim_destroy(sim);
        return 1;
    }
    fprintf(stderr, "hpd-sim: %u nodes registered in %.2f s\n", all, hpd_time_now() - t0);
    double idle = 0; /* the coordinator's CPU s a second with no request */
    if (watch) { /* the registrations settle: a heartbeat round; then its idle cost */
        const double t1 = hpd_time_now();
        while (hpd_time_now() - t1 < 2.0)
            event_base_loop(base, EVLOOP_ONCE);
        proc_usage(coord_pid, &cpu1, &rss1, &hwm);
        const double t2 = hpd_time_now();
        while (hpd_time_now() - t2 < 2.0)
            event_base_loop(base, EVLOOP_ONCE);
        double c = cpu1;
        proc_usage(coord_pid, &c, &rss1, &hwm);
        idle = (c - cpu1) / (hpd_time_now() - t2);
        cpu1 = c;
    }
    for (uint32_t i = 0; i < n_door_pids; i++) {
        double c = 0;
        long rss, peak;
        if (proc_usage(door_pids[i], &c, &rss, &peak))
            doors_cpu1 += c;
    }
    int rc = 0;
    if (lp.requests > 0) {
        hpd_load_result_t r;
        lp.sim = sim;
        const hpd_status_t st = hpd_load_run(&lp, 600, &r);
        if (watch)
            proc_usage(coord_pid, &cpu2, &rss2, &hwm);
        for (uint32_t i = 0; i < n_door_pids; i++) {
            double c = 0;
            long rss, peak;
            if (proc_usage(door_pids[i], &c, &rss, &peak))
                doors_cpu2 += c;
        }
        char ttft[80] = "ttft not in the HTTP answer";
        if (lp.n_http == 0)
            snprintf(ttft, sizeof(ttft), "ttft p50 %.1f ms p99 %.1f ms", r.p50_ttft_ms,
                     r.p99_ttft_ms);
        printf("requests %llu ok %llu wrong %llu failed %llu retried %llu in %.2f s: "
               "%.0f requests/s, %.0f tokens/s; answer p50 %.1f ms p99 %.1f ms; %s; nodes %u\n",
               (unsigned long long)r.sent, (unsigned long long)r.ok,
               (unsigned long long)r.wrong, (unsigned long long)r.failed,
               (unsigned long long)r.retried, r.duration_s, r.ok / r.duration_s,
               r.tokens / r.duration_s, r.p50_ms, r.p99_ms, ttft, all);
        printf("the coordinator's delay to the first reserve: p50 %.2f ms p99 %.2f ms\n",
               r.p50_sched_ms, r.p99_sched_ms);
        /* load balance: decode jobs finished per decode node */
        double sum = 0, sq = 0, most = 0;
        for (uint32_t i = sp.n_prefill; i < all; i++) {
            const double d = (double)hpd_sim_node_done(sim, i);
            sum += d;
            sq += d * d;
            most = d > most ? d : most;
        }
        const double mean = sum / sp.n_decode;
        printf("decode jobs per decode node: mean %.1f, max %.0f (%.2fx the mean), "
               "coefficient of variation %.3f\n", mean, most, mean > 0 ? most / mean : 0,
               mean > 0 ? sqrt(HPD_MAX(0.0, sq / sp.n_decode - mean * mean)) / mean : 0);
        /* routing quality: the prefix hits against an ideal router's */
        hpd_sim_stats_t ss;
        hpd_sim_stats(sim, &ss);
        if (sp.cache_blocks > 0)
            printf("prefix cache: %llu of %llu prompt tokens cached where the prefill ran; an "
                   "ideal router (every cache known) %llu: %.3f of the ideal\n",
                   (unsigned long long)ss.cached_tokens, (unsigned long long)ss.prompt_tokens,
                   (unsigned long long)ss.ideal_cached_tokens,
                   ss.ideal_cached_tokens ? (double)ss.cached_tokens / ss.ideal_cached_tokens
                                          : 1.0);
        if (watch)
            printf("coordinator: %.2f CPU s for the load, %.0f requests per CPU second; "
                   "memory %ld KiB idle, %.1f KiB per node, peak %ld KiB (%.1f KiB per "
                   "request of the %u open at most)\n",
                   cpu2 - cpu1, r.ok / HPD_MAX(1e-9, cpu2 - cpu1), rss0,
                   (double)(rss1 - rss0) / all, hwm,
                   (double)(hwm - rss1) / HPD_MAX(1u, r.peak_open), r.peak_open);
        if (watch) {
            const double above = cpu2 - cpu1 - idle * r.duration_s;
            printf("coordinator idle (heartbeats, liveness pings, ticks): %.3f CPU s a second; "
                   "above that the load took %.2f CPU s: %.0f requests per CPU second\n",
                   idle, above, r.ok / HPD_MAX(1e-9, above));
        }
        if (n_door_pids > 0)
            printf("doors: %.2f CPU s for the load over %u of them, %.0f tokens per door CPU "
                   "second\n", doors_cpu2 - doors_cpu1, n_door_pids,
                   r.tokens / HPD_MAX(1e-9, doors_cpu2 - doors_cpu1));
        if (r.first_wrong[0])
            printf("first wrong: %s\n", r.first_wrong);
        rc = st == HPD_OK && r.ok == r.sent ? 0 : 1;
    } else {
        while (!stop)
            event_base_loop(base, EVLOOP_ONCE);
    }
    hpd_sim_destroy(sim);
    event_base_free(base);
    free(token);
    return rc;
}
