/* Whether a node takes new work after failing pairs: a circuit breaker per
 * node, apart from the event loop so that tests can drive it with any clock
 * (docs/cluster.md, "Sick peers").
 *
 * A pair (a prefill node and a decode node) fails when the prefill node
 * cannot put into the decode node (it cannot reach it, a transfer missed
 * its deadline) or a prefill job fails. Each failure counts against both
 * nodes of the pair. A node whose failures within HPD_BREAKER_WINDOW_S
 * reach HPD_BREAKER_FAILURES, with at least min(2, counterparts usable)
 * distinct counterparts, is out of rotation (open): it takes no new work
 * for its cooldown (1 s at first). Then it is probed: one attempt may go
 * there (half-open); its success puts the node back (closed, the counts
 * and cooldown reset); its failure opens it again for twice the cooldown
 * (at most HPD_BREAKER_MAX_COOLDOWN_S). A probe that ends neither way (its
 * request canceled, or run again elsewhere because the other node of its
 * pair went suspect) frees the slot at once when the caller says so
 * (hpd_breaker_probe_ended), and after HPD_BREAKER_PROBE_S otherwise. So
 * one bad counterpart does not sideline a healthy node when others exist,
 * and with a single counterpart the cluster still routes around a node
 * that fails every pair. */
#ifndef HPD_COORDINATOR_BREAKER_H
#define HPD_COORDINATOR_BREAKER_H

#include <stdbool.h>
#include <stdint.h>

#define HPD_BREAKER_WINDOW_S 30.0
#define HPD_BREAKER_FAILURES 2
#define HPD_BREAKER_COOLDOWN_S 1.0
#define HPD_BREAKER_MAX_COOLDOWN_S 30.0
#define HPD_BREAKER_PROBE_S 30.0
#define HPD_BREAKER_PEERS 4

typedef struct {
    uint32_t failures;                  /* within the window */
    uint64_t peers[HPD_BREAKER_PEERS];  /* distinct counterparts of those failures */
    uint32_t n_peers;
    double window_start;
    double open_until;  /* 0: closed (in rotation) */
    double cooldown;    /* of the next opening */
    double probe_since; /* 0: no probe out */
    uint64_t openings;  /* times it went out of rotation */
} hpd_breaker_t;

typedef enum {
    HPD_BREAKER_CLOSED,    /* in rotation */
    HPD_BREAKER_OPEN,      /* out of rotation: no work */
    HPD_BREAKER_HALF_OPEN, /* one probe may go there */
    HPD_BREAKER_PROBING,   /* its probe is out: no more work until it ends */
} hpd_breaker_state_t;

hpd_breaker_state_t hpd_breaker_state(const hpd_breaker_t *b, double now);
/* Whether new work may go there now (closed or half-open). */
bool hpd_breaker_usable(const hpd_breaker_t *b, double now);
/* Work placed there: in half-open it is the probe (returns true). */
bool hpd_breaker_placed(hpd_breaker_t *b, double now);
/* The probe ended without saying whether the node works: the next
 * request may probe it. */
void hpd_breaker_probe_ended(hpd_breaker_t *b);
/* A pair with counterpart `other` failed; n_others: the usable nodes of
 * the counterpart's role. Returns true when the node went out of rotation
 * now. */
bool hpd_breaker_failure(hpd_breaker_t *b, uint64_t other, uint32_t n_others, double now);
/* A pair of it succeeded. Returns true when it came back into rotation. */
bool hpd_breaker_success(hpd_breaker_t *b);

#endif
