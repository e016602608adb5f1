#include "transport/rpc_codec.h"

#include <stdio.h>
#include <string.h>

static hpd_status_t fail(char *err, size_t errlen, const char *what)
{
    snprintf(err, errlen, "%s", what);
    return HPD_ERR_FORMAT;
}

static bool get_id(const msgpack_object *o, uint32_t *id)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return false;
    *id = (uint32_t)o->via.u64;
    return true;
}

static bool get_method(const msgpack_object *o, hpd_rpc_msg_t *msg)
{
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 ||
        o->via.str.size > HPD_RPC_MAX_METHOD)
        return false;
    msg->method = o->via.str.ptr;
    msg->method_len = o->via.str.size;
    return true;
}

hpd_status_t hpd_rpc_decode(const msgpack_object *obj, hpd_rpc_msg_t *msg, char *err,
                            size_t errlen)
{
    const msgpack_object *a;
    uint32_t n;

    memset(msg, 0, sizeof(*msg));
    if (obj->type != MSGPACK_OBJECT_ARRAY)
        return fail(err, errlen, "message is not an array");
    a = obj->via.array.ptr;
    n = obj->via.array.size;
    if (n < 3 || a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return fail(err, errlen, "message must start with a type 0, 1 or 2");
    switch (a[0].via.u64) {
    case HPD_RPC_REQUEST:
        msg->type = HPD_RPC_REQUEST;
        if (n != 4)
            return fail(err, errlen, "request must be [0, id, method, params]");
        if (!get_id(&a[1], &msg->id))
            return fail(err, errlen, "request id must be an integer from 0 to 2^32-1");
        if (!get_method(&a[2], msg))
            return fail(err, errlen, "request method must be a string of 1 to 64 bytes");
        msg->params = &a[3];
        return HPD_OK;
    case HPD_RPC_RESPONSE:
        msg->type = HPD_RPC_RESPONSE;
        if (n != 4)
            return fail(err, errlen, "response must be [1, id, error, result]");
        if (!get_id(&a[1], &msg->id))
            return fail(err, errlen, "response id must be an integer from 0 to 2^32-1");
        msg->result = &a[3];
        if (a[2].type == MSGPACK_OBJECT_NIL)
            return HPD_OK;
        {
            const msgpack_object *code = hpd_rpc_map_get(&a[2], "code");
            const msgpack_object *m = hpd_rpc_map_get(&a[2], "message");
            if (code == NULL || m == NULL ||
                (code->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
                 code->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) ||
                m->type != MSGPACK_OBJECT_STR)
                return fail(err, errlen, "response error must be nil or {code: int, message: str}");
            msg->is_error = true;
            msg->error_code = code->via.i64;
            msg->error_message = m->via.str.ptr;
            msg->error_message_len = m->via.str.size;
        }
        return HPD_OK;
    case HPD_RPC_NOTIFY:
        msg->type = HPD_RPC_NOTIFY;
        if (n != 3)
            return fail(err, errlen, "notification must be [2, method, params]");
        if (!get_method(&a[1], msg))
            return fail(err, errlen, "notification method must be a string of 1 to 64 bytes");
        msg->params = &a[2];
        return HPD_OK;
    }
    return fail(err, errlen, "message type must be 0, 1 or 2");
}

void hpd_rpc_scanner_reset(hpd_rpc_scanner_t *s)
{
    memset(s, 0, sizeof(*s));
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Header bytes (the first included) a value starting with byte b needs. */
static int header_size(uint8_t b)
{
    if (b <= 0xbf || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return 1;
    switch (b) {
    case 0xc4: case 0xd9: case 0xcc: case 0xd0: return 2;
    case 0xc5: case 0xda: case 0xcd: case 0xd1: case 0xdc: case 0xde: return 3;
    case 0xc6: case 0xdb: case 0xce: case 0xd2: case 0xca: case 0xdd: case 0xdf: return 5;
    case 0xcf: case 0xd3: case 0xcb: return 9;
    case 0xc7: return 3;  /* len8, type */
    case 0xc8: return 4;  /* len16, type */
    case 0xc9: return 6;  /* len32, type */
    case 0xd4: return 3;  /* fixext1: type + 1 */
    case 0xd5: return 4;
    case 0xd6: return 6;
    case 0xd7: return 10;
    case 0xd8: return 2;  /* fixext16: type, then 16 bytes skipped */
    }
    return 0; /* 0xc1: never used */
}

/* A value is done: count it against the open containers. */
static bool value_done(hpd_rpc_scanner_t *s)
{
    while (s->depth > 0) {
        if (--s->remaining[s->depth - 1] > 0)
            return false;
        s->depth--;
    }
    return true; /* the top-level value: the message */
}

hpd_status_t hpd_rpc_scan(hpd_rpc_scanner_t *s, const uint8_t *p, size_t n, size_t max,
                          size_t *used_p, bool *complete_p, char *err, size_t errlen)
{
    size_t i = 0;

    *complete_p = false;
    s->error_code = HPD_RPC_ERR_TOO_LARGE; /* what a failure below is, but for one */
    while (i < n) {
        if (s->skip > 0) {
            const size_t k = s->skip < n - i ? (size_t)s->skip : n - i;
            s->skip -= k;
            s->msg_bytes += k;
            i += k;
            if (s->skip == 0 && value_done(s)) {
                *complete_p = true;
                break;
            }
            continue;
        }
        s->hdr[s->hdr_len++] = p[i++];
        s->msg_bytes++;
        if (s->msg_bytes > max) {
            snprintf(err, errlen, "message exceeds the limit of %zu bytes", max);
            return HPD_ERR_FORMAT;
        }
        if (s->hdr_len == 1 && (s->hdr_need = (uint8_t)header_size(s->hdr[0])) == 0) {
            snprintf(err, errlen, "malformed msgpack (byte 0xc1)");
            s->error_code = HPD_RPC_ERR_PARSE;
            return HPD_ERR_FORMAT;
        }
        if (s->hdr_len < s->hdr_need)
            continue;
        const uint8_t b = s->hdr[0];
        uint64_t count = 0, payload = 0;
        bool container = false;
        if (b >= 0x80 && b <= 0x8f)
            container = true, count = 2ull * (b & 0x0f);
        else if (b >= 0x90 && b <= 0x9f)
            container = true, count = b & 0x0f;
        else if (b >= 0xa0 && b <= 0xbf)
            payload = b & 0x1f;
        else if (b == 0xc4 || b == 0xd9 || b == 0xc7)
            payload = be(s->hdr + 1, 1);
        else if (b == 0xc5 || b == 0xda || b == 0xc8)
            payload = be(s->hdr + 1, 2);
        else if (b == 0xc6 || b == 0xdb || b == 0xc9)
            payload = be(s->hdr + 1, 4);
        else if (b == 0xd8)
            payload = 16;
        else if (b == 0xdc)
            container = true, count = be(s->hdr + 1, 2);
        else if (b == 0xdd)
            container = true, count = be(s->hdr + 1, 4);
        else if (b == 0xde)
            container = true, count = 2 * be(s->hdr + 1, 2);
        else if (b == 0xdf)
            container = true, count = 2 * be(s->hdr + 1, 4);
        s->hdr_len = 0;
        /* every element takes at least a byte, a payload its length */
        if (count + payload > max - s->msg_bytes) {
            snprintf(err, errlen, "message declares %llu %s, beyond the limit of %zu bytes",
                     (unsigned long long)(container ? count : payload),
                     container ? "elements" : "payload bytes", max);
            return HPD_ERR_FORMAT;
        }
        if (container && count > 0) {
            if (s->depth == HPD_RPC_MAX_DEPTH) {
                snprintf(err, errlen, "message nests deeper than %d levels", HPD_RPC_MAX_DEPTH);
                return HPD_ERR_FORMAT;
            }
            s->remaining[s->depth++] = count;
            continue;
        }
        if (payload > 0) {
            s->skip = payload;
            continue;
        }
        if (value_done(s)) {
            *complete_p = true;
            break;
        }
    }
    *used_p = i;
    return HPD_OK;
}

hpd_status_t hpd_rpc_parse(const char *data, size_t len, msgpack_zone *zone, msgpack_object *obj,
                           hpd_rpc_msg_t *msg, char *err, size_t errlen)
{
    hpd_rpc_scanner_t sc;
    size_t off = 0, used;
    bool complete;

    hpd_rpc_scanner_reset(&sc);
    if (hpd_rpc_scan(&sc, (const uint8_t *)data, len, HPD_RPC_DEFAULT_MAX_MESSAGE, &used,
                     &complete, err, errlen) != HPD_OK)
        return HPD_ERR_FORMAT;
    if (!complete)
        return fail(err, errlen, "truncated message");
    if (used != len)
        return fail(err, errlen, "trailing bytes after the message");
    switch (msgpack_unpack(data, len, &off, zone, obj)) {
    case MSGPACK_UNPACK_SUCCESS:
        break;
    case MSGPACK_UNPACK_EXTRA_BYTES:
        return fail(err, errlen, "trailing bytes after the message");
    case MSGPACK_UNPACK_CONTINUE:
        return fail(err, errlen, "truncated message");
    case MSGPACK_UNPACK_NOMEM_ERROR:
        return fail(err, errlen, "message too large to unpack");
    default:
        return fail(err, errlen, "malformed msgpack");
    }
    return hpd_rpc_decode(obj, msg, err, errlen);
}

void hpd_rpc_pack_str(msgpack_packer *pk, const char *s)
{
    const size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void hpd_rpc_pack_request(msgpack_packer *pk, uint32_t id, const char *method)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, HPD_RPC_REQUEST);
    msgpack_pack_uint32(pk, id);
    hpd_rpc_pack_str(pk, method);
}

void hpd_rpc_pack_notify(msgpack_packer *pk, const char *method)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, HPD_RPC_NOTIFY);
    hpd_rpc_pack_str(pk, method);
}

void hpd_rpc_pack_response_ok(msgpack_packer *pk, uint32_t id)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, HPD_RPC_RESPONSE);
    msgpack_pack_uint32(pk, id);
    msgpack_pack_nil(pk);
}

void hpd_rpc_pack_response_error(msgpack_packer *pk, uint32_t id, int64_t code,
                                 const char *message)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, HPD_RPC_RESPONSE);
    msgpack_pack_uint32(pk, id);
    msgpack_pack_map(pk, 2);
    hpd_rpc_pack_str(pk, "code");
    msgpack_pack_int64(pk, code);
    hpd_rpc_pack_str(pk, "message");
    hpd_rpc_pack_str(pk, message);
    msgpack_pack_nil(pk);
}

bool hpd_rpc_str_eq(const char *p, uint32_t len, const char *s)
{
    return strlen(s) == len && memcmp(p, s, len) == 0;
}

const msgpack_object *hpd_rpc_map_get(const msgpack_object *obj, const char *key)
{
    if (obj == NULL || obj->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < obj->via.map.size; i++) {
        const msgpack_object_kv *kv = &obj->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR &&
            hpd_rpc_str_eq(kv->key.via.str.ptr, kv->key.via.str.size, key))
            return &kv->val;
    }
    return NULL;
}
