/* Whether the coordinator takes a generate request, apart from its event
 * loop and registry so that tests can put any cluster state before it
 * (docs/cluster.md, "Life of a request", step 1).
 *
 * Refused as overloaded (-32005, retry later): the coordinator drains, or
 * max_requests requests are open. A request that comes while no usable
 * prefill or decode node is registered is taken: it waits in the queue
 * (bounded by max_requests and its queue timeout) for one. Refused as
 * invalid (-32602, the caller must fix it): a token id not below the
 * smallest vocabulary of the usable nodes, an empty prompt, max_tokens 0,
 * prompt + max_tokens beyond the largest decode context (those two only
 * while nodes are there to tell), a
 * temperature below 0 or not a number, top_p outside (0, 1], a stop token
 * id not below the vocabulary or more than HPD_ADMIT_MAX_STOP of them,
 * min_tokens above max_tokens.
 * Then, in the queue, a request that no registered decode node could ever
 * hold, even with its pool empty, fails at once (hpd_admit_placeable)
 * instead of holding up the queue. */
#ifndef HPD_COORDINATOR_ADMISSION_H
#define HPD_COORDINATOR_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/routing.h"
#include "node/msg.h"

#define HPD_ADMIT_MAX_STOP 64 /* as the engine's HPD_MAX_STOP_IDS */

typedef struct {
    bool draining;
    uint32_t open_requests, max_requests;
} hpd_admit_state_t;

/* 0 when the request is taken; else the RPC error code (transport/rpc.h)
 * with the reason in err ("generate: ..."). */
int64_t hpd_admit(const hpd_route_node_t *nodes, size_t n, const hpd_admit_state_t *state,
                  const hpd_msg_generate_t *g, char *err, size_t len);

/* Whether a usable decode node could ever hold the request (prompt +
 * max_tokens, its choices' pages and slots: hpd_route_request_pages) were
 * its pools empty. False only when decode nodes are registered and none of
 * them could; then *need_p and *largest_p say how many pages the request
 * needs on the node whose pool comes closest (*largest_p pages), or both
 * are 0 when it is slots that no node has enough of. True while none is
 * registered (the request waits for one) and when none has the context
 * (admission refuses those). */
bool hpd_admit_placeable(const hpd_route_node_t *nodes, size_t n, const hpd_route_req_t *req,
                         uint32_t *need_p, uint32_t *largest_p);

#endif
