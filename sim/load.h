/* A load generator for a coordinator in front of simulated nodes
 * (sim/sim.h): generate calls on the msgpack door with Poisson arrivals
 * and a shared-prefix mix, every answer checked against hpd_sim_token and,
 * with the simulator in the same process, against the nodes that served
 * it. */
#ifndef HPD_SIM_LOAD_H
#define HPD_SIM_LOAD_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "node/proto.h"
#include "sim/sim.h"

typedef struct {
    struct event_base *base;
    const char *host;
    uint16_t port;
    const char *key; /* a client key (NULL: an open coordinator) */
    /* front doors of that coordinator (docs/cluster.md): the connections
     * go to them in turn instead (NULL or 0: none) */
    const hpd_endpoint_t *doors;
    uint32_t n_doors;
    /* the HTTP API (docs/api.md) at these addresses instead of msgpack:
     * completions of the prompt's ids with return_token_ids, `connections`
     * keep-alive connections (up to 1024) over them in turn (NULL or 0:
     * msgpack) */
    const hpd_endpoint_t *http;
    uint32_t n_http;
    uint32_t requests;
    double rate;          /* arrivals per second, Poisson (0: as fast as the window allows) */
    uint32_t window;      /* requests open at once, at most */
    uint32_t connections; /* client connections the requests are spread over */
    uint32_t prompt_tokens, max_tokens, vocab;
    uint32_t prefixes;      /* shared prefixes the prompts draw from (0: none shared) */
    uint32_t prefix_tokens; /* ... of this many tokens */
    uint32_t n;             /* choices per request (0 or 1: one) */
    uint64_t seed;
    const hpd_sim_t *sim; /* checks who served each request (NULL: not) */
    /* called once a second while running (NULL: not): a fault schedule */
    void (*tick)(void *arg, double t_s, uint32_t answered);
    void *arg;
} hpd_load_params_t;

typedef struct {
    uint64_t sent, ok, wrong, failed, retried, unserved;
    char first_wrong[300]; /* what was wrong with the first bad answer */
    double duration_s;
    double p50_ms, p99_ms;       /* a request's time to its answer */
    double p50_ttft_ms, p99_ttft_ms;
    /* with the simulator: from the request's send to its first reserve at
     * a decode node, the coordinator's part of the first token's time */
    double p50_sched_ms, p99_sched_ms;
    uint64_t tokens;
    uint32_t peak_open; /* requests open at once, at most */
} hpd_load_result_t;

/* Runs the load until every request was answered (or timeout_s passed:
 * HPD_ERR_TIMEOUT, the rest counted failed). */
hpd_status_t hpd_load_run(const hpd_load_params_t *params, double timeout_s,
                          hpd_load_result_t *result_p);

#endif
