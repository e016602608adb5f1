/* A request's life in the coordinator as a pure state machine: events in,
 * a plan of what to do out (docs/cluster.md, "Life of a request"). The
 * coordinator carries out the plan (bookings, cancels, replies); the
 * machine decides it, apart from the event loop and the registry, so that
 * tests can script replies, timeouts and node losses in any order.
 *
 *   queued --placed--> reserving --reserved--> prefilling --prefilled-->
 *   decoding --done--> finished
 *
 * Any failure of the attempt (a call that failed, a node lost, a pair that
 * failed, the decode node ending it) aborts the attempt and queues the
 * request again, until max_attempts attempts have failed. Aborting undoes
 * what the attempt holds: the prefill node is told to stop first and the
 * decode node's cancel follows its answer (a decode node never reuses
 * memory a prefill node may still write); where the prefill node can no
 * longer answer (lost while it pushed) or its pair failed, the decode node
 * closes that writer's connection before it frees the pages (the fence).
 * Events that do not belong to the current state (a late reply of an older
 * attempt, a prefill node lost after its job was done) are ignored. */
#ifndef HPD_COORDINATOR_REQUEST_H
#define HPD_COORDINATOR_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    HPD_REQ_QUEUED,
    HPD_REQ_RESERVING,  /* the decode node is reserving a slot and pages */
    HPD_REQ_PREFILLING, /* the prefill node computes and pushes */
    HPD_REQ_DECODING,   /* the decode node streams tokens */
} hpd_req_state_t;

typedef enum {
    HPD_REQ_EV_PLACED,       /* booked on a decode node, reserve sent */
    HPD_REQ_EV_RESERVED,     /* the reservation came, the prefill job was sent */
    HPD_REQ_EV_FULL,         /* the decode node had no room after all: wait */
    HPD_REQ_EV_REFUSED,      /* a node refused the request, or no node could ever hold it */
    HPD_REQ_EV_PREFILLED,    /* the prefill job's answer: the first token */
    HPD_REQ_EV_PAIR_FAILED,  /* the data path prefill -> decode failed */
    HPD_REQ_EV_FAILED,       /* a call of this attempt failed */
    HPD_REQ_EV_PREFILL_LOST, /* the attempt's prefill node was lost */
    HPD_REQ_EV_DECODE_LOST,  /* the attempt's decode node was lost */
    HPD_REQ_EV_DECODE_ENDED, /* the decode node ended the attempt (expiry, bad transfer) */
    HPD_REQ_EV_DONE,         /* the last token came */
    HPD_REQ_EV_CANCEL,       /* the client canceled or went away */
    HPD_REQ_EV_TIMEOUT,      /* waited in the queue too long */
    HPD_REQ_EV_SHUTDOWN,     /* the coordinator stops (its drain's deadline passed) */
    HPD_REQ_EV_HEDGE_WON,    /* its hedge (a copy racing it) finished first: this attempt
                                stops and the request finishes with the hedge's tokens */
} hpd_req_event_t;

typedef enum {
    HPD_REQ_IGNORE,   /* not an event of this state: nothing changed */
    HPD_REQ_GO_ON,    /* the attempt goes on */
    HPD_REQ_RETRY,    /* queued again (a failed attempt counted) */
    HPD_REQ_WAIT,     /* queued again, no attempt counted: schedule a little later */
    HPD_REQ_FAIL,     /* answer the client with plan.code and forget the request */
    HPD_REQ_FINISH,   /* answer the client with the tokens and forget it */
    HPD_REQ_CANCELED, /* answer "canceled" and forget it */
} hpd_req_verdict_t;

typedef struct {
    hpd_req_state_t state;
    uint32_t attempts; /* failed attempts so far */
    bool on_decode;    /* a decode node holds this attempt's slot and pages (booked) */
    bool on_prefill;   /* a prefill node holds this attempt's job (booked) */
    bool pair_failed;  /* this attempt's pair failed: fence its writer */
    bool writer_lost;  /* this attempt's prefill node was lost while it pushed */
} hpd_req_fsm_t;

typedef struct {
    hpd_req_verdict_t verdict;
    int64_t code;          /* FAIL: the RPC error code (transport/rpc.h) */
    bool gave_up;          /* FAIL after max_attempts failed attempts */
    bool unbook_decode;    /* give back the slot and pages booked on the decode node */
    bool unbook_prefill;   /* give back the job booked on the prefill node */
    bool cancel_prefill;   /* tell the prefill node to stop ... */
    bool cancel_decode;    /* ... and the decode node to free the reservation: after the
                              prefill node's answer where both are set */
    bool fence_writer;     /* the decode node closes the writer's connection first (the
                              prefill node of the pair, or the one lost) */
    bool avoid_decode;     /* later attempts avoid this attempt's decode node */
    bool pair_failure;     /* count a failed pair */
} hpd_req_plan_t;

/* A new request: queued, nothing held. */
hpd_req_fsm_t hpd_req_fsm_init(void);

/* Applies an event to f and returns what to do. max_attempts >= 1. */
hpd_req_plan_t hpd_req_fsm_event(hpd_req_fsm_t *f, hpd_req_event_t ev, uint32_t max_attempts);

const char *hpd_req_state_name(hpd_req_state_t s);

#endif
