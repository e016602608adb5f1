/* The msgpack-RPC codec: pure, no I/O (docs/protocol.md).
 *
 *   request       [0, id, method, params]
 *   response      [1, id, error, result]      error: nil or {code, message}
 *   notification  [2, method, params]
 *
 * Decoding is strict: the array length, every type, the id range, the method
 * length and the error object's fields are checked, and a violation is
 * answered with HPD_ERR_FORMAT and a message naming what was wrong. */
#ifndef HPD_TRANSPORT_RPC_CODEC_H
#define HPD_TRANSPORT_RPC_CODEC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HPD_RPC_MAX_METHOD 64
#define HPD_RPC_DEFAULT_MAX_MESSAGE (4u << 20)
#define HPD_RPC_MAX_DEPTH 32

typedef enum {
    HPD_RPC_REQUEST = 0,
    HPD_RPC_RESPONSE = 1,
    HPD_RPC_NOTIFY = 2,
} hpd_rpc_type_t;

/* Error codes carried in {code, message}. */
typedef enum {
    HPD_RPC_ERR_PARSE = -32700,        /* not msgpack, or not an RPC message */
    HPD_RPC_ERR_INVALID = -32600,      /* a malformed request */
    HPD_RPC_ERR_NO_METHOD = -32601,    /* unknown method */
    HPD_RPC_ERR_PARAMS = -32602,       /* bad params */
    HPD_RPC_ERR_INTERNAL = -32603,
    HPD_RPC_ERR_AUTH = -32001,         /* missing or wrong token */
    HPD_RPC_ERR_TOO_LARGE = -32002,    /* message above the size limit */
    HPD_RPC_ERR_TIMEOUT = -32003,      /* (client side) no reply in time */
    HPD_RPC_ERR_CLOSED = -32004,       /* (client side) connection closed */
    HPD_RPC_ERR_OVERLOADED = -32005,
    HPD_RPC_ERR_PEER = -32006,         /* the callee's data-plane peer failed */
    HPD_RPC_ERR_NOT_LEADER = -32007,   /* a coordinator that no longer leads: try another */
    HPD_RPC_ERR_APP = -32000,          /* an application error */
} hpd_rpc_error_code_t;

typedef struct {
    hpd_rpc_type_t type;
    uint32_t id;                  /* request, response */
    const char *method;           /* request, notify: not NUL-terminated */
    uint32_t method_len;
    const msgpack_object *params; /* request, notify */
    bool is_error;                /* response */
    int64_t error_code;
    const char *error_message; /* not NUL-terminated */
    uint32_t error_message_len;
    const msgpack_object *result; /* response (nil on error) */
} hpd_rpc_msg_t;

/* Framing without allocation: finds where one msgpack message ends while
 * checking that every declared string length and container count fits in
 * what is left of the size limit and that nesting stays within
 * HPD_RPC_MAX_DEPTH. Only a complete message that passed is handed to
 * msgpack-c, so a header announcing 2^32 elements costs nothing. Resumable:
 * bytes may come in any pieces. */
typedef struct {
    uint32_t depth;
    uint64_t remaining[HPD_RPC_MAX_DEPTH + 1]; /* elements left per open container */
    uint64_t skip;                             /* payload bytes still to pass over */
    uint8_t hdr[10];
    uint8_t hdr_len, hdr_need;
    uint64_t msg_bytes; /* bytes of the current message so far */
    int64_t error_code; /* after a failed scan: HPD_RPC_ERR_PARSE or _TOO_LARGE */
} hpd_rpc_scanner_t;

void hpd_rpc_scanner_reset(hpd_rpc_scanner_t *scanner);

/* Feeds up to n bytes. Stops right after a message ends: *used_p bytes were
 * taken and *complete_p is set (then reset the scanner for the next one).
 * HPD_ERR_FORMAT for an invalid byte (scanner->error_code then
 * HPD_RPC_ERR_PARSE), too deep a nesting, or a message that is or would be
 * larger than max (HPD_RPC_ERR_TOO_LARGE); err says which. */
hpd_status_t hpd_rpc_scan(hpd_rpc_scanner_t *scanner, const uint8_t *p, size_t n, size_t max,
                          size_t *used_p, bool *complete_p, char *err, size_t errlen);

/* Checks obj and fills msg with views into it (valid while obj lives).
 * err gets a message on failure. */
hpd_status_t hpd_rpc_decode(const msgpack_object *obj, hpd_rpc_msg_t *msg, char *err,
                            size_t errlen);

/* Decodes one whole message from a buffer: scans it (limit max_message, 0
 * for the default), unpacks exactly `len` bytes into zone (trailing bytes,
 * truncation and malformed msgpack are errors) then decodes it. */
hpd_status_t hpd_rpc_parse(const char *data, size_t len, msgpack_zone *zone, msgpack_object *obj,
                           hpd_rpc_msg_t *msg, char *err, size_t errlen);

/* Encoders write the envelope; the caller then packs exactly one object
 * (the params, or the result). */
void hpd_rpc_pack_request(msgpack_packer *pk, uint32_t id, const char *method);
void hpd_rpc_pack_notify(msgpack_packer *pk, const char *method);
void hpd_rpc_pack_response_ok(msgpack_packer *pk, uint32_t id);
/* A whole error response: [1, id, {code, message}, nil]. */
void hpd_rpc_pack_response_error(msgpack_packer *pk, uint32_t id, int64_t code,
                                 const char *message);

/* Packs a NUL-terminated string. */
void hpd_rpc_pack_str(msgpack_packer *pk, const char *s);

/* True when a msgpack string equals s. */
bool hpd_rpc_str_eq(const char *p, uint32_t len, const char *s);

/* Looks a key up in a map object; NULL when absent or obj is not a map. */
const msgpack_object *hpd_rpc_map_get(const msgpack_object *obj, const char *key);

#endif
