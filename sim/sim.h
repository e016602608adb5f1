/* Simulated prefill and decode nodes (hpd-sim, docs/testing.md): many in
 * one process, on one event loop, speaking the real protocol to a real
 * coordinator (registration, heartbeats, liveness pings, reserve, prefill,
 * start, cancel, token streams) with a timing model in place of an engine.
 * Nothing is computed and nothing is transferred: a prefill node answers
 * after its prompt's time, a decode node streams one token per job per
 * step. The tokens are a function of the request alone (hpd_sim_token), so
 * that whoever drives the load can check every answer, and the simulator
 * remembers which nodes served each request (hpd_sim_served). Faults come
 * on request (hpd_sim_fault): a node stops, dies, slows down, or sends a
 * bad notice. */
#ifndef HPD_SIM_SIM_H
#define HPD_SIM_SIM_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_sim hpd_sim_t;

typedef struct {
    struct event_base *base;
    const char *coord_host;
    uint16_t coord_port;
    const char *token; /* the node secret (NULL: an open coordinator) */
    uint32_t n_prefill, n_decode;
    /* the timing model: a prefill takes prompt tokens * prefill_us_per_token
     * plus pages * push_us_per_page; a decode step step_us; each node's
     * speed a factor drawn in [1 - speed_spread, 1 + speed_spread]
     * (seeded), times divide by it */
    double prefill_us_per_token, push_us_per_page, step_us, speed_spread;
    uint32_t vocab;       /* ids the nodes make: [0, vocab) */
    uint32_t slots;       /* each decode node's */
    uint32_t pages;       /* each decode node's, of 16 tokens */
    uint32_t max_context; /* each node's */
    uint64_t seed;
    const char *name_prefix; /* "sim" -> sim-p0, sim-d0 */
    /* each prefill node's prefix cache, in blocks of 64 tokens (the keys
     * the coordinator hashes, cache/prefix_hash.h), the oldest going first
     * when full: a prefill computes only what its node has not cached, and
     * the node's heartbeats carry the Bloom summary of it, as a real
     * node's do. 0: none (no summaries). */
    uint32_t cache_blocks;
} hpd_sim_params_t;

hpd_status_t hpd_sim_create(const hpd_sim_params_t *params, hpd_sim_t **sim_p);
/* Every node's connections close (its jobs die with it). Accepts NULL. */
void hpd_sim_destroy(hpd_sim_t *sim);

/* Nodes registered so far (the caller turns the loop until all are). */
uint32_t hpd_sim_registered(const hpd_sim_t *sim);
/* Nodes the coordinator refused (a name in *why). */
uint32_t hpd_sim_refused(const hpd_sim_t *sim, char *why, size_t len);

/* Token i of choice k of the answer to prompt with seed: token 0 is what
 * a prefill node answers, the rest what a decode node streams. */
int32_t hpd_sim_token(const int32_t *prompt, uint32_t n_prompt, uint64_t seed, uint32_t k,
                      uint32_t i, uint32_t vocab);

/* A request's key as the simulator files it: its prompt and its seed
 * (what its tokens are a function of; a retry and a hedge of it share it,
 * whatever the coordinator's ids for them). */
uint64_t hpd_sim_request_key(const int32_t *prompt, uint32_t n_prompt, uint64_t seed);

/* Which nodes served the request of key: the prefill node that answered
 * its prefill last and the decode node that streamed its last token (-1:
 * none), and the decode jobs of it the nodes took (attempts, hedges).
 * False: never seen. */
bool hpd_sim_served(const hpd_sim_t *sim, uint64_t key, int32_t *prefill_p, int32_t *decode_p,
                    uint32_t *jobs_p);

/* When the first reserve of the request of key reached a decode node
 * (hpd_time_now's clock; 0: none): the load generator, in the same
 * process, takes the coordinator's scheduling delay from it. */
double hpd_sim_reserved_at(const hpd_sim_t *sim, uint64_t key);

/* A node by index: prefill nodes 0 .. n_prefill - 1, then decode nodes. */
const char *hpd_sim_node_name(const hpd_sim_t *sim, uint32_t node);
bool hpd_sim_node_prefill(const hpd_sim_t *sim, uint32_t node);
/* The jobs a node finished: prefills answered, or decode jobs streamed to
 * their end. */
uint64_t hpd_sim_node_done(const hpd_sim_t *sim, uint32_t node);

typedef enum {
    HPD_SIM_STOP,       /* stops: answers nothing, sends nothing (SIGSTOP) */
    HPD_SIM_RESUME,     /* ... and goes on */
    HPD_SIM_DIE,        /* its connections close (kill -9) */
    HPD_SIM_SLOW,       /* its times grow by factor */
    HPD_SIM_BAD_NOTICE, /* a decode node's next notices: one that does not read, one that
                           skips a token (then the right one) */
} hpd_sim_fault_t;

hpd_status_t hpd_sim_fault(hpd_sim_t *sim, uint32_t node, hpd_sim_fault_t fault,
                           double factor);

typedef struct {
    uint64_t prefills, reserves, starts, cancels, tokens, notices, heartbeats, pings;
    uint32_t running; /* decode jobs streaming now */
    /* routing quality: prompt tokens of the prefills, those the chosen
     * node had cached, and those the best node had cached when the prefill
     * came (an ideal router, which knows every cache exactly) */
    uint64_t prompt_tokens, cached_tokens, ideal_cached_tokens;
} hpd_sim_stats_t;

void hpd_sim_stats(const hpd_sim_t *sim, hpd_sim_stats_t *stats_p);

#endif
