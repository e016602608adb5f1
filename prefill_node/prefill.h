/* The prefill role as a library: its methods and its per-step work on the
 * node runtime (node/node.h); hpd-prefill is main.c around it. */
#ifndef HPD_PREFILL_NODE_PREFILL_H
#define HPD_PREFILL_NODE_PREFILL_H

#include "node/node.h"

extern const hpd_node_role_t hpd_prefill_role;

#endif
