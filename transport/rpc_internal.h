/* Shared between the files of transport/ (not a public header). */
#ifndef HPD_TRANSPORT_RPC_INTERNAL_H
#define HPD_TRANSPORT_RPC_INTERNAL_H

#include "transport/rpc.h"

/* Answers a message that is msgpack but not valid RPC: an error reply when it
 * is a request with a readable id, else an error notification and a close.
 * obj is the whole message as unpacked; NULL for a valid message of a type
 * the receiver does not take (always a close). */
void hpd_rpc_conn_invalid(hpd_rpc_conn_t *conn, const msgpack_object *obj, const char *why);

/* Changes the size limit of the messages conn takes from now on (0: the
 * default): the server keeps it small until a connection authenticates. */
void hpd_rpc_conn_set_max_message(hpd_rpc_conn_t *conn, size_t max_message);

#endif
