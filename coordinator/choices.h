/* A request's answers as a front door assembles them: n choices, each its
 * tokens in order with their log probabilities, however many attempts
 * (a retry, a hedge) report them and in whatever pieces. The coordinator's
 * core (coord.c) keeps them for the clients of its own doors; a front
 * door of its own process (door.c) for the requests whose tokens decode
 * nodes stream to it. */
#ifndef HPD_COORDINATOR_CHOICES_H
#define HPD_COORDINATOR_CHOICES_H

#include <stdbool.h>
#include <stdint.h>

#include "common/logprobs.h"
#include "common/status.h"
#include "coordinator/coordinator.h"

typedef struct {
    int32_t *out; /* [max_tokens] */
    uint32_t n_out;
    hpd_token_logprobs_t *lp; /* [max_tokens]; NULL: not asked for */
    bool stopped;             /* its sink ended it (a stop string) */
    bool done;                /* its last tokens came */
    char finish_reason[8];    /* from the decode node's last tokens notice */
    /* tokens a decode node reported streaming to a front door (only their
     * count comes here) */
    uint32_t n_elsewhere;
    /* out of order (a front door: the first token comes from the
     * scheduler, the rest from the decode node, on two connections): the
     * positions at or after n_out that came early ([max_tokens]; NULL: in
     * order, a later position than n_out is dropped) */
    uint8_t *early;
    uint32_t end_at; /* out of order: the position after the last, once known (0: not) */
} hpd_choice_t;

/* Room for n choices of max_tokens each (their logprobs with logprobs;
 * out of order: tokens may come before those ahead of them). */
hpd_status_t hpd_choices_alloc(hpd_choice_t *ch, uint32_t n, uint32_t max_tokens, bool logprobs,
                               bool out_of_order);
void hpd_choices_free(hpd_choice_t *ch, uint32_t n);

/* Takes choice ch's tokens ids[0, n) reported from position index on (lp:
 * theirs, or NULL): new positions are appended up to max_tokens, earlier
 * ones (replayed, or computed again after a failover) must match what is
 * there. Returns the number of positions that did not (the first of them
 * in *bad_p, its two values in bad_was_p / bad_now_p). A stopped choice
 * takes nothing. */
uint32_t hpd_choice_add(hpd_choice_t *ch, uint32_t max_tokens, uint32_t index,
                        const int32_t *ids, const hpd_token_logprobs_t *lp, uint32_t n,
                        uint32_t *bad_p, int32_t *bad_was_p, int32_t *bad_now_p);

/* Gives sink choice k's tokens [from, n_out); the sink may stop the choice
 * there, keeping the tokens up to the one that ended it. True: it did. */
bool hpd_choice_stream(hpd_choice_t *ch, const hpd_coord_sink_t *sink, uint32_t k,
                       uint32_t from);

/* Whether every one of n choices has ended (its last tokens came, or its
 * sink stopped it) / has come to its end on the node. */
bool hpd_choices_over(const hpd_choice_t *ch, uint32_t n);
bool hpd_choices_done(const hpd_choice_t *ch, uint32_t n);

/* The choices as a sink gets them at the end (out[n]). */
void hpd_choices_result(const hpd_choice_t *ch, uint32_t n, hpd_coord_choice_t *out);

#endif
