/* A front door apart from the scheduler (docs/cluster.md, "Front doors"):
 * an hpd-coordinator started with --scheduler runs its doors (the msgpack
 * door and the HTTP API: authentication, tokenization, detokenization,
 * stop strings, streaming) and no registry. Each request goes to the
 * scheduler as token ids (`schedule`, with this door's address); the
 * scheduler places it and forwards the prefill's first tokens and the
 * end (`ended`), and the decode node streams the tokens after the first
 * here (`tokens`), not through the scheduler: its cost per request does
 * not grow with the answer, and doors added scale the tokens streamed.
 *
 * The tokens of a request are assembled here (coordinator/choices.h) by
 * position, whichever attempt reports them (a retry computes them again:
 * they must match). The request ends for its client once the scheduler
 * said so and, when it finished, every choice's last tokens came here.
 * This is coordinator.h's request API for such a process: coord.c hands
 * its calls here. */
#ifndef HPD_COORDINATOR_DOOR_H
#define HPD_COORDINATOR_DOOR_H

#include <event2/event.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator/coordinator.h"

typedef struct hpd_door hpd_door_t;

typedef struct {
    struct event_base *base;
    const char *schedulers; /* "HOST:PORT[,HOST:PORT...]": a leader and its standbys */
    const char *token;      /* the node secret, presented to the scheduler (NULL: none) */
    const char *address;    /* "HOST:PORT": where decode nodes reach this door */
    /* optional: each request's end, after its sink's (the door's metrics) */
    void (*ended)(void *arg, const hpd_coord_result_t *res);
    void *arg;
} hpd_door_params_t;

/* Connects to the first scheduler (the others in turn when it is lost). */
hpd_status_t hpd_door_create(const hpd_door_params_t *p, hpd_door_t **door_p, char *err,
                             size_t err_len);
/* Open requests end ("front door shutting down"). Accepts NULL. */
void hpd_door_destroy(hpd_door_t *d);

/* As hpd_coord_submit: the scheduler's refusal comes to the sink's done
 * (FAILED with its code). */
int64_t hpd_door_submit(hpd_door_t *d, const hpd_coord_request_t *q, const hpd_coord_sink_t *sink,
                        uint64_t *id_p, char *err, size_t err_len);
bool hpd_door_cancel(hpd_door_t *d, uint64_t id, const char *why);
bool hpd_door_cancel_tagged(hpd_door_t *d, const void *owner, uint64_t tag, const char *why);
void hpd_door_cancel_owned(hpd_door_t *d, const void *owner, const char *why);
const hpd_token_logprobs_t *hpd_door_prompt_logprobs(const hpd_door_t *d, uint64_t id);
/* The scheduler's limits (hpd_coord_limits), asked every second. */
void hpd_door_limits(const hpd_door_t *d, uint32_t *vocab_p, uint32_t *max_context_p);
uint32_t hpd_door_open_requests(const hpd_door_t *d);
/* Whether a scheduler is connected; msg says which, and the open requests. */
bool hpd_door_health(const hpd_door_t *d, char *msg, size_t len);
/* Every open request fails with why. */
void hpd_door_end_all(hpd_door_t *d, const char *why);
/* A decode node's tokens notification (hpd_msg_tokens, job: this door's
 * id of the request). */
void hpd_door_tokens(hpd_door_t *d, const msgpack_object *params);

#endif
