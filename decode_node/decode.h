/* The decode role as a library: its methods and its per-step work on the
 * node runtime (node/node.h); hpd-decode is main.c around it. */
#ifndef HPD_DECODE_NODE_DECODE_H
#define HPD_DECODE_NODE_DECODE_H

#include "node/node.h"

extern const hpd_node_role_t hpd_decode_role;

#endif
