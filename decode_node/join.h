/* A reservation's life on a decode node as a pure state machine: the
 * transfer's completion notice and the coordinator's `start` may come in
 * either order, and with both the request joins the batch (docs/cluster.md,
 * "Life of a request"). The decode node feeds it the events and carries
 * out what it answers; tests/decode_node/test_join.c scripts them.
 *
 *   reserved --notice and start--> running
 *   reserved --expiry, transfer ended--> freed ("reservation expired")
 *   reserved --expiry, transfer not ended--> fenced: the coordinator is
 *       told, the pages stay held until the writer has stopped (its notice,
 *       the coordinator's cancel, or the backstop timer)
 *
 * A cancel frees the reservation in every state; one that names a writer
 * whose transfer has not ended closes that writer's connection first, so
 * that no put of it still under way lands in pages another request gets. */
#ifndef HPD_DECODE_NODE_JOIN_H
#define HPD_DECODE_NODE_JOIN_H

#include <stdbool.h>

typedef enum {
    HPD_JOIN_RESERVED,
    HPD_JOIN_RUNNING,
    HPD_JOIN_FENCED, /* expired before its transfer ended */
} hpd_join_state_t;

typedef enum {
    HPD_JOIN_EV_NOTICE,     /* the transfer ended and its checksum and destinations hold */
    HPD_JOIN_EV_BAD_NOTICE, /* the transfer ended wrong (checksum, foreign memory) */
    HPD_JOIN_EV_START,      /* the coordinator's start, with the first token */
    HPD_JOIN_EV_TIMER,      /* the expiry (reserved) or the backstop (fenced) */
    HPD_JOIN_EV_CANCEL,     /* the coordinator's cancel */
    HPD_JOIN_EV_CANCEL_WRITER, /* ... naming the writer to fence */
} hpd_join_event_t;

typedef enum {
    HPD_JOIN_IGNORE,  /* not an event of this state */
    HPD_JOIN_WAIT,    /* wait for the other half */
    HPD_JOIN_RUN,     /* join the batch now (stop the expiry timer) */
    HPD_JOIN_REFUSE,  /* refuse the start: not reserved here (expired, canceled or started) */
    HPD_JOIN_FAIL,    /* tell the coordinator it failed, free it */
    HPD_JOIN_EXPIRE,  /* tell the coordinator "reservation expired", free it */
    HPD_JOIN_FENCE,   /* tell the coordinator "reservation expired", keep its pages, arm
                         the backstop */
    HPD_JOIN_FREE,    /* free it without a word (a cancel, or the fence is over) */
} hpd_join_verdict_t;

typedef struct {
    hpd_join_state_t state;
    bool have_notice, have_start;
} hpd_join_t;

typedef struct {
    hpd_join_verdict_t verdict;
    bool close_writer; /* close the named writer's connection before freeing */
    bool backstop;     /* the fence ended by the backstop timer (no cancel came) */
} hpd_join_plan_t;

hpd_join_plan_t hpd_join_event(hpd_join_t *j, hpd_join_event_t ev);

#endif
