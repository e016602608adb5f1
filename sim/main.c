/* hpd-sim: simulated prefill and decode nodes (sim/sim.h) for a running
 * coordinator, and optionally a load on it (sim/load.h) whose every
 * answer is checked; prints one line of figures at the end. Without
 * --requests it serves until SIGINT or SIGTERM. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/log.h"
#include "common/util.h"
#include "sim/load.h"
#include "sim/sim.h"
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
    "  --seed N\n";

static volatile sig_atomic_t stop;
static void on_signal(int sig) { stop = 1; }

int main(int argc, char **argv)
{
    hpd_sim_params_t sp = {.n_prefill = 2, .n_decode = 2, .prefill_us_per_token = 20,
                           .push_us_per_page = 50, .step_us = 20000, .speed_spread = 0.2,
                           .vocab = 1000, .slots = 64, .pages = 100000, .max_context = 32768,
                           .seed = 1};
    hpd_load_params_t lp = {.window = 256, .connections = 4, .prompt_tokens = 64,
                            .max_tokens = 16, .seed = 1};
    const char *coord = NULL, *token_file = NULL;
    char *token = NULL;
    static const struct option longs[] = {
        {"coordinator", 1, 0, 'c'}, {"token-file", 1, 0, 't'}, {"client-key", 1, 0, 'k'},
        {"prefill", 1, 0, 'P'}, {"decode", 1, 0, 'D'}, {"prefill-us-per-token", 1, 0, 1},
        {"push-us-per-page", 1, 0, 2}, {"step-us", 1, 0, 3}, {"speed-spread", 1, 0, 4},
        {"slots", 1, 0, 5}, {"pages", 1, 0, 6}, {"vocab", 1, 0, 7}, {"requests", 1, 0, 8},
        {"rate", 1, 0, 9}, {"window", 1, 0, 10}, {"connections", 1, 0, 11},
        {"prompt-tokens", 1, 0, 12}, {"max-tokens", 1, 0, 13}, {"prefixes", 1, 0, 14},
        {"prefix-tokens", 1, 0, 15}, {"seed", 1, 0, 16}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
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
    int rc = 0;
    if (lp.requests > 0) {
        hpd_load_result_t r;
        lp.sim = sim;
        const hpd_status_t st = hpd_load_run(&lp, 600, &r);
        hpd_sim_stats_t ss;
        hpd_sim_stats(sim, &ss);
        printf("requests %llu ok %llu wrong %llu failed %llu retried %llu in %.2f s: "
               "%.0f requests/s, %.0f tokens/s; answer p50 %.1f ms p99 %.1f ms; "
               "ttft p50 %.1f ms p99 %.1f ms; nodes %u\n",
               (unsigned long long)r.sent, (unsigned long long)r.ok,
               (unsigned long long)r.wrong, (unsigned long long)r.failed,
               (unsigned long long)r.retried, r.duration_s, r.ok / r.duration_s,
               r.tokens / r.duration_s, r.p50_ms, r.p99_ms, r.p50_ttft_ms, r.p99_ttft_ms, all);
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
