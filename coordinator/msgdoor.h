/* The msgpack front door: a client's generate and cancel calls on the
 * coordinator's RPC port (docs/api.md), answered through coordinator.h
 * like the HTTP door (openai.h): token ids or text, stop strings, chats
 * with tools, n choices, streamed or answered at the end. */
#ifndef HPD_MSGDOOR_H
#define HPD_MSGDOOR_H

#include <stdint.h>

#include "transport/rpc.h"

/* RPC methods; arg is the hpd_coord_t. */
void hpd_msgdoor_generate(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                          void *arg);
void hpd_msgdoor_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                        void *arg);

#endif
