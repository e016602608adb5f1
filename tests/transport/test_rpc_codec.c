/* The msgpack-RPC codec: round trips and strict rejection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "transport/rpc.h"

static hpd_status_t parse_buf(const hpd_rpc_buf_t *b, hpd_rpc_msg_t *m, msgpack_zone *z)
{
    msgpack_object o;
    char err[160];
    return hpd_rpc_parse(b->sb.data, b->sb.size, z, &o, m, err, sizeof(err));
}

static void test_round_trips(void **state)
{
    hpd_rpc_buf_t b;
    hpd_rpc_msg_t m;
    msgpack_zone z;

    msgpack_zone_init(&z, 1024);
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 4000000000u, "generate");
    msgpack_pack_map(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, "max_tokens");
    msgpack_pack_int(&b.pk, 16);
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.type, HPD_RPC_REQUEST);
    assert_int_equal(m.id, 4000000000u);
    assert_true(hpd_rpc_str_eq(m.method, m.method_len, "generate"));
    assert_int_equal(hpd_rpc_map_get(m.params, "max_tokens")->via.u64, 16);
    assert_null(hpd_rpc_map_get(m.params, "nope"));
    hpd_rpc_buf_destroy(&b);

    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_response_ok(&b.pk, 7);
    hpd_rpc_pack_str(&b.pk, "ok");
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.type, HPD_RPC_RESPONSE);
    assert_false(m.is_error);
    assert_int_equal(m.result->type, MSGPACK_OBJECT_STR);
    hpd_rpc_buf_destroy(&b);

    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_response_error(&b.pk, 8, HPD_RPC_ERR_OVERLOADED, "overloaded: 64 queued");
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_true(m.is_error);
    assert_int_equal(m.error_code, HPD_RPC_ERR_OVERLOADED);
    assert_true(hpd_rpc_str_eq(m.error_message, m.error_message_len, "overloaded: 64 queued"));
    hpd_rpc_buf_destroy(&b);

    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_notify(&b.pk, "token");
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_int(&b.pk, 1);
    msgpack_pack_int(&b.pk, 42);
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.type, HPD_RPC_NOTIFY);
    assert_true(hpd_rpc_str_eq(m.method, m.method_len, "token"));
    hpd_rpc_buf_destroy(&b);
    msgpack_zone_destroy(&z);
}

typedef void (*builder_t)(msgpack_packer *pk);
static void b_not_array(msgpack_packer *pk) { hpd_rpc_pack_str(pk, "hello"); }
static void b_short(msgpack_packer *pk) { msgpack_pack_array(pk, 2); msgpack_pack_int(pk, 0); msgpack_pack_int(pk, 1); }
static void b_bad_type(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 9);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
}
static void b_neg_id(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 0);
    msgpack_pack_int(pk, -1);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
}
static void b_big_id(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 0);
    msgpack_pack_uint64(pk, 1ull << 33);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
}
static void b_method_int(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 0);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 5);
    msgpack_pack_nil(pk);
}
static void b_method_long(msgpack_packer *pk)
{
    char m[80];
    memset(m, 'a', 79);
    m[79] = 0;
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 0);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, m);
    msgpack_pack_nil(pk);
}
static void b_method_empty(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 0);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, "");
    msgpack_pack_nil(pk);
}
static void b_bad_error(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, "an error should be a map");
    msgpack_pack_nil(pk);
}
static void b_notify_4(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 2);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
}

static void b_request_5(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 5);
    msgpack_pack_int(pk, 0);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
}
static void b_type_str(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 3);
    hpd_rpc_pack_str(pk, "0");
    msgpack_pack_int(pk, 1);
    msgpack_pack_nil(pk);
}
static void b_type_neg(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, -1);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
}
static void b_response_3(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 1);
    msgpack_pack_nil(pk);
}
static void b_response_id_str(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, "1");
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
}
static void b_response_id_big(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 1);
    msgpack_pack_uint64(pk, 1ull << 32);
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
}
/* a response error object, with the given fields */
static void pack_error_response(msgpack_packer *pk, const char *code_key, bool code_is_str,
                                const char *msg_key, bool msg_is_int)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 1);
    msgpack_pack_map(pk, 2);
    hpd_rpc_pack_str(pk, code_key);
    if (code_is_str)
        hpd_rpc_pack_str(pk, "-32000");
    else
        msgpack_pack_int(pk, -32000);
    hpd_rpc_pack_str(pk, msg_key);
    if (msg_is_int)
        msgpack_pack_int(pk, 5);
    else
        hpd_rpc_pack_str(pk, "boom");
    msgpack_pack_nil(pk);
}
static void b_error_no_code(msgpack_packer *pk) { pack_error_response(pk, "kode", false, "message", false); }
static void b_error_no_message(msgpack_packer *pk) { pack_error_response(pk, "code", false, "msg", false); }
static void b_error_code_str(msgpack_packer *pk) { pack_error_response(pk, "code", true, "message", false); }
static void b_error_message_int(msgpack_packer *pk) { pack_error_response(pk, "code", false, "message", true); }
static void b_notify_2(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 2);
    hpd_rpc_pack_str(pk, "m");
}
static void b_notify_method_int(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, 2);
    msgpack_pack_int(pk, 7);
    msgpack_pack_nil(pk);
}
static void b_notify_method_long(msgpack_packer *pk)
{
    char m[HPD_RPC_MAX_METHOD + 2];
    memset(m, 'n', HPD_RPC_MAX_METHOD + 1);
    m[HPD_RPC_MAX_METHOD + 1] = 0;
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, 2);
    hpd_rpc_pack_str(pk, m);
    msgpack_pack_nil(pk);
}
static void b_type_3(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_int(pk, 3);
    msgpack_pack_int(pk, 1);
    hpd_rpc_pack_str(pk, "m");
    msgpack_pack_nil(pk);
}

/* Every malformed message is refused, and the error names what is wrong. */
static void test_strict_rejections(void **state)
{
    const struct {
        builder_t build;
        const char *err;
    } bad[] = {
        {b_not_array, "message is not an array"},
        {b_short, "message must start with a type 0, 1 or 2"},
        {b_type_str, "message must start with a type 0, 1 or 2"},
        {b_type_neg, "message must start with a type 0, 1 or 2"},
        {b_bad_type, "message type must be 0, 1 or 2"},
        {b_type_3, "message type must be 0, 1 or 2"},
        {b_request_5, "request must be [0, id, method, params]"},
        {b_neg_id, "request id must be an integer from 0 to 2^32-1"},
        {b_big_id, "request id must be an integer from 0 to 2^32-1"},
        {b_method_int, "request method must be a string of 1 to 64 bytes"},
        {b_method_long, "request method must be a string of 1 to 64 bytes"},
        {b_method_empty, "request method must be a string of 1 to 64 bytes"},
        {b_response_3, "response must be [1, id, error, result]"},
        {b_response_id_str, "response id must be an integer from 0 to 2^32-1"},
        {b_response_id_big, "response id must be an integer from 0 to 2^32-1"},
        {b_bad_error, "response error must be nil or {code: int, message: str}"},
        {b_error_no_code, "response error must be nil or {code: int, message: str}"},
        {b_error_no_message, "response error must be nil or {code: int, message: str}"},
        {b_error_code_str, "response error must be nil or {code: int, message: str}"},
        {b_error_message_int, "response error must be nil or {code: int, message: str}"},
        {b_notify_4, "notification must be [2, method, params]"},
        {b_notify_2, "message must start with a type 0, 1 or 2"},
        {b_notify_method_int, "notification method must be a string of 1 to 64 bytes"},
        {b_notify_method_long, "notification method must be a string of 1 to 64 bytes"},
    };
    msgpack_zone z;
    hpd_rpc_msg_t m;
    msgpack_object o;
    char err[160];

    msgpack_zone_init(&z, 1024);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        bad[i].build(&b.pk);
        err[0] = 0;
        assert_int_equal(hpd_rpc_parse(b.sb.data, b.sb.size, &z, &o, &m, err, sizeof(err)),
                         HPD_ERR_FORMAT);
        if (strcmp(err, bad[i].err) != 0)
            fail_msg("case %zu: error '%s', expected '%s'", i, err, bad[i].err);
        /* hpd_rpc_decode on the unpacked object says the same */
        err[0] = 0;
        assert_int_equal(hpd_rpc_decode(&o, &m, err, sizeof(err)), HPD_ERR_FORMAT);
        assert_string_equal(err, bad[i].err);
        hpd_rpc_buf_destroy(&b);
    }
    /* truncated, trailing bytes, malformed */
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 1, "ping");
    msgpack_pack_array(&b.pk, 0);
    assert_int_equal(hpd_rpc_parse(b.sb.data, b.sb.size - 1, &z, &o, &m, err, sizeof(err)),
                     HPD_ERR_FORMAT);
    assert_non_null(strstr(err, "truncated"));
    msgpack_pack_int(&b.pk, 1);
    assert_int_equal(hpd_rpc_parse(b.sb.data, b.sb.size, &z, &o, &m, err, sizeof(err)),
                     HPD_ERR_FORMAT);
    assert_non_null(strstr(err, "trailing"));
    hpd_rpc_buf_destroy(&b);
    const char junk[] = "\xc1\xc1\xc1";
    assert_int_equal(hpd_rpc_parse(junk, 3, &z, &o, &m, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "malformed msgpack (byte 0xc1)");
    assert_int_equal(hpd_rpc_parse(junk, 0, &z, &o, &m, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "truncated message");
    /* parse frames with the default limit: a string declaring 5 MiB */
    const char huge[] = "\x94\x00\x01\xa1m\xdb\x00\x50\x00\x00";
    assert_int_equal(hpd_rpc_parse(huge, sizeof(huge) - 1, &z, &o, &m, err, sizeof(err)),
                     HPD_ERR_FORMAT);
    assert_string_equal(err, "message declares 5242880 payload bytes, beyond the limit of "
                             "4194304 bytes");
    msgpack_zone_destroy(&z);
}

/* What decodes: the fields of each message type, error codes of either
 * sign, error objects with more keys than code and message, ids at both
 * ends of their range and methods of 1 and 64 bytes. */
static void test_accepted_fields(void **state)
{
    hpd_rpc_buf_t b;
    hpd_rpc_msg_t m;
    msgpack_zone z;
    char method[HPD_RPC_MAX_METHOD + 1];

    msgpack_zone_init(&z, 1024);
    memset(method, 'x', HPD_RPC_MAX_METHOD);
    method[HPD_RPC_MAX_METHOD] = 0;
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_request(&b.pk, 0, method);
    msgpack_pack_nil(&b.pk);
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.id, 0);
    assert_int_equal(m.method_len, HPD_RPC_MAX_METHOD);
    assert_memory_equal(m.method, method, HPD_RPC_MAX_METHOD);
    assert_int_equal(m.params->type, MSGPACK_OBJECT_NIL);
    assert_null(m.result);
    assert_false(m.is_error);
    hpd_rpc_buf_destroy(&b);

    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_notify(&b.pk, "n");
    msgpack_pack_int(&b.pk, 5);
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.type, HPD_RPC_NOTIFY);
    assert_int_equal(m.method_len, 1);
    assert_int_equal(m.params->via.u64, 5);
    assert_int_equal(m.id, 0);
    hpd_rpc_buf_destroy(&b);

    /* an error object with a positive code, extra keys, keys in any order */
    hpd_rpc_buf_init(&b);
    msgpack_pack_array(&b.pk, 4);
    msgpack_pack_int(&b.pk, 1);
    msgpack_pack_uint32(&b.pk, UINT32_MAX);
    msgpack_pack_map(&b.pk, 3);
    hpd_rpc_pack_str(&b.pk, "message");
    hpd_rpc_pack_str(&b.pk, "teapot");
    msgpack_pack_int(&b.pk, 1);
    msgpack_pack_int(&b.pk, 2);
    hpd_rpc_pack_str(&b.pk, "code");
    msgpack_pack_int(&b.pk, 418);
    msgpack_pack_nil(&b.pk);
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.type, HPD_RPC_RESPONSE);
    assert_int_equal(m.id, UINT32_MAX);
    assert_true(m.is_error);
    assert_int_equal(m.error_code, 418);
    assert_int_equal(m.error_message_len, 6);
    assert_memory_equal(m.error_message, "teapot", 6);
    assert_int_equal(m.result->type, MSGPACK_OBJECT_NIL);
    hpd_rpc_buf_destroy(&b);

    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_response_error(&b.pk, 3, INT64_MIN, "");
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_true(m.is_error);
    assert_true(m.error_code == INT64_MIN);
    assert_int_equal(m.error_message_len, 0);
    hpd_rpc_buf_destroy(&b);

    /* an ok response: not an error, the result as sent */
    hpd_rpc_buf_init(&b);
    hpd_rpc_pack_response_ok(&b.pk, 9);
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_int(&b.pk, 4);
    msgpack_pack_int(&b.pk, 2);
    assert_int_equal(parse_buf(&b, &m, &z), HPD_OK);
    assert_int_equal(m.id, 9);
    assert_false(m.is_error);
    assert_int_equal(m.error_code, 0);
    assert_null(m.error_message);
    assert_int_equal(m.result->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(m.result->via.array.size, 2);
    assert_null(m.method);
    assert_null(m.params);
    hpd_rpc_buf_destroy(&b);
    msgpack_zone_destroy(&z);
}

/* A request whose params hold one value of every msgpack format, the
 * longer forms written by hand with short lengths (msgpack-c packs the
 * shortest). Every payload byte is 0xc1, which is never a valid header: a
 * scanner that took a payload byte for a header would refuse the message,
 * and one that skipped a header byte would end elsewhere. */
static const uint8_t every_format[] = {
    0x94, 0x00, 0x01, 0xa1, 'm', /* [0, 1, "m", params] */
    0xdc, 0x00, 44,              /* params: array16 of 44 values */
    0xc0, 0xc2, 0xc3,            /* nil false true */
    0x05, 0xe0,                  /* fixints */
    0xcc, 0x01, 0xcd, 0x01, 0x02, 0xce, 0x00, 0x00, 0x00, 0x01,
    0xcf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, /* uint8 .. uint64 */
    0xd0, 0xff, 0xd1, 0xff, 0xfe, 0xd2, 0xff, 0xff, 0xff, 0xfe,
    0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, /* int8 .. int64 */
    0xca, 0x3f, 0x80, 0x00, 0x00,                         /* float32 1.0 */
    0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* float64 1.0 */
    0xa3, 0xc1, 0xc1, 0xc1,                               /* fixstr */
    0xd9, 0x03, 0xc1, 0xc1, 0xc1,                         /* str8 */
    0xda, 0x00, 0x03, 0xc1, 0xc1, 0xc1,                   /* str16 */
    0xdb, 0x00, 0x00, 0x00, 0x03, 0xc1, 0xc1, 0xc1,       /* str32 */
    0xc4, 0x02, 0xc1, 0xc1,                               /* bin8 */
    0xc5, 0x00, 0x02, 0xc1, 0xc1,                         /* bin16 */
    0xc6, 0x00, 0x00, 0x00, 0x02, 0xc1, 0xc1,             /* bin32 */
    0x92, 0x01, 0x02,                                     /* fixarray */
    0xdc, 0x00, 0x02, 0x01, 0x02,                         /* array16 */
    0xdd, 0x00, 0x00, 0x00, 0x02, 0x01, 0x02,             /* array32 */
    0x81, 0xa1, 'k', 0x01,                                /* fixmap */
    0xde, 0x00, 0x01, 0xa1, 'k', 0x01,                    /* map16 */
    0xdf, 0x00, 0x00, 0x00, 0x01, 0xa1, 'k', 0x01,        /* map32 */
    0xd4, 0x05, 0xc1,                                     /* fixext1, type 5 */
    0xd5, 0x05, 0xc1, 0xc1,                               /* fixext2 */
    0xd6, 0x05, 0xc1, 0xc1, 0xc1, 0xc1,                   /* fixext4 */
    0xd7, 0x05, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, /* fixext8 */
    0xd8, 0x05, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1,
    0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1,       /* fixext16 */
    0xc7, 0x03, 0x05, 0xc1, 0xc1, 0xc1,                   /* ext8 */
    0xc8, 0x00, 0x03, 0x05, 0xc1, 0xc1, 0xc1,             /* ext16 */
    0xc9, 0x00, 0x00, 0x00, 0x03, 0x05, 0xc1, 0xc1, 0xc1, /* ext32 */
    0x90, 0x80,                                           /* [] {} */
    0xc4, 0x00, 0xa0,                                     /* empty bin and str */
    0x91, 0x90,                                           /* [[]] */
    0xd9, 0x00, 0xc5, 0x00, 0x00, 0xc6, 0x00, 0x00, 0x00, 0x00, /* empty str8, bin16, bin32 */
};

static const msgpack_object_type every_type[44] = {
    MSGPACK_OBJECT_NIL, MSGPACK_OBJECT_BOOLEAN, MSGPACK_OBJECT_BOOLEAN,
    MSGPACK_OBJECT_POSITIVE_INTEGER, MSGPACK_OBJECT_NEGATIVE_INTEGER,
    MSGPACK_OBJECT_POSITIVE_INTEGER, MSGPACK_OBJECT_POSITIVE_INTEGER,
    MSGPACK_OBJECT_POSITIVE_INTEGER, MSGPACK_OBJECT_POSITIVE_INTEGER,
    MSGPACK_OBJECT_NEGATIVE_INTEGER, MSGPACK_OBJECT_NEGATIVE_INTEGER,
    MSGPACK_OBJECT_NEGATIVE_INTEGER, MSGPACK_OBJECT_NEGATIVE_INTEGER,
    MSGPACK_OBJECT_FLOAT32, MSGPACK_OBJECT_FLOAT64,
    MSGPACK_OBJECT_STR, MSGPACK_OBJECT_STR, MSGPACK_OBJECT_STR, MSGPACK_OBJECT_STR,
    MSGPACK_OBJECT_BIN, MSGPACK_OBJECT_BIN, MSGPACK_OBJECT_BIN,
    MSGPACK_OBJECT_ARRAY, MSGPACK_OBJECT_ARRAY, MSGPACK_OBJECT_ARRAY,
    MSGPACK_OBJECT_MAP, MSGPACK_OBJECT_MAP, MSGPACK_OBJECT_MAP,
    MSGPACK_OBJECT_EXT, MSGPACK_OBJECT_EXT, MSGPACK_OBJECT_EXT, MSGPACK_OBJECT_EXT,
    MSGPACK_OBJECT_EXT, MSGPACK_OBJECT_EXT, MSGPACK_OBJECT_EXT, MSGPACK_OBJECT_EXT,
    MSGPACK_OBJECT_ARRAY, MSGPACK_OBJECT_MAP, MSGPACK_OBJECT_BIN, MSGPACK_OBJECT_STR,
    MSGPACK_OBJECT_ARRAY, MSGPACK_OBJECT_STR, MSGPACK_OBJECT_BIN, MSGPACK_OBJECT_BIN,
};

/* The sizes of the str/bin/ext payloads and container counts above, in order. */
static uint32_t payload_size(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_STR: return o->via.str.size;
    case MSGPACK_OBJECT_BIN: return o->via.bin.size;
    case MSGPACK_OBJECT_EXT: return o->via.ext.size;
    case MSGPACK_OBJECT_ARRAY: return o->via.array.size;
    case MSGPACK_OBJECT_MAP: return o->via.map.size;
    default: return 0;
    }
}

static void test_every_format(void **state)
{
    const size_t len = sizeof(every_format);
    msgpack_zone z;
    msgpack_object o;
    hpd_rpc_msg_t m;
    char err[160];

    /* msgpack-c reads it as the table says */
    msgpack_zone_init(&z, 4096);
    assert_int_equal(hpd_rpc_parse((const char *)every_format, len, &z, &o, &m, err, sizeof(err)),
                     HPD_OK);
    assert_int_equal(m.type, HPD_RPC_REQUEST);
    assert_int_equal(m.params->type, MSGPACK_OBJECT_ARRAY);
    const uint32_t n = m.params->via.array.size;
    assert_int_equal(n, 44);
    static const uint32_t sizes[44] = {[15] = 3, [16] = 3, [17] = 3, [18] = 3, [19] = 2,
                                       [20] = 2, [21] = 2, [22] = 2, [23] = 2, [24] = 2,
                                       [25] = 1, [26] = 1, [27] = 1, [28] = 1, [29] = 2,
                                       [30] = 4, [31] = 8, [32] = 16, [33] = 3, [34] = 3,
                                       [35] = 3, [40] = 1};
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *e = &m.params->via.array.ptr[i];
        if (e->type != every_type[i] || payload_size(e) != sizes[i])
            fail_msg("value %u: type %d size %u, expected type %d size %u", i, e->type,
                     payload_size(e), every_type[i], sizes[i]);
    }
    msgpack_zone_destroy(&z);

    /* the scanner ends it at its last byte: in one piece, byte by byte,
     * and with the next message behind it */
    hpd_rpc_scanner_t s;
    size_t used = 0;
    bool complete = false;
    hpd_rpc_scanner_reset(&s);
    assert_int_equal(hpd_rpc_scan(&s, every_format, len, len, &used, &complete, err, sizeof(err)),
                     HPD_OK);
    assert_true(complete);
    assert_int_equal(used, len);
    hpd_rpc_scanner_reset(&s);
    for (size_t i = 0; i < len; i++) {
        assert_int_equal(hpd_rpc_scan(&s, every_format + i, 1, len, &used, &complete, err,
                                      sizeof(err)),
                         HPD_OK);
        assert_int_equal(used, 1);
        if (complete != (i == len - 1))
            fail_msg("byte by byte: complete=%d after byte %zu of %zu", complete, i + 1, len);
    }
    uint8_t two[2 * sizeof(every_format)];
    memcpy(two, every_format, len);
    memcpy(two + len, every_format, len);
    hpd_rpc_scanner_reset(&s);
    assert_int_equal(hpd_rpc_scan(&s, two, sizeof(two), len, &used, &complete, err, sizeof(err)),
                     HPD_OK);
    assert_true(complete);
    assert_int_equal(used, len);
    /* one byte short of the limit: refused */
    hpd_rpc_scanner_reset(&s);
    assert_int_equal(hpd_rpc_scan(&s, every_format, len, len - 1, &used, &complete, err,
                                  sizeof(err)),
                     HPD_ERR_FORMAT);
    assert_false(complete);
}

static hpd_status_t scan_all(const void *p, size_t n, size_t max, size_t *used, bool *complete,
                             char *err, size_t errlen)
{
    hpd_rpc_scanner_t s;
    hpd_rpc_scanner_reset(&s);
    err[0] = 0;
    return hpd_rpc_scan(&s, p, n, max, used, complete, err, errlen);
}

/* The framing limits, each refused with a message that names it. */
static void test_scan_limits(void **state)
{
    uint8_t buf[256];
    size_t used, n;
    bool complete;
    char err[160];

    /* headers alone can pass the limit: 20 uint32s in an array take 103 bytes */
    n = 0;
    buf[n++] = 0xdc, buf[n++] = 0, buf[n++] = 20;
    for (int i = 0; i < 20; i++)
        buf[n++] = 0xce, buf[n++] = 0, buf[n++] = 0, buf[n++] = 0, buf[n++] = 1;
    assert_int_equal(scan_all(buf, n, n, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_true(complete);
    assert_int_equal(scan_all(buf, n, 64, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "message exceeds the limit of 64 bytes");
    assert_false(complete);

    /* a declared payload beyond what the limit leaves */
    const uint8_t str8[] = {0xd9, 200};
    assert_int_equal(scan_all(str8, 2, 64, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "message declares 200 payload bytes, beyond the limit of 64 bytes");
    /* exactly what the limit leaves passes (incomplete so far) */
    assert_int_equal(scan_all(str8, 2, 202, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_false(complete);
    assert_int_equal(used, 2);
    assert_int_equal(scan_all(str8, 2, 201, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);

    /* element counts: an array's count, a map's twice its count */
    const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(scan_all(arr32, 5, 1u << 20, &used, &complete, err, sizeof(err)),
                     HPD_ERR_FORMAT);
    assert_string_equal(err, "message declares 4294967295 elements, beyond the limit of "
                             "1048576 bytes");
    const uint8_t map16[] = {0xde, 0x00, 40};
    assert_int_equal(scan_all(map16, 3, 83, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_int_equal(scan_all(map16, 3, 82, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "message declares 80 elements, beyond the limit of 82 bytes");
    const uint8_t map32[] = {0xdf, 0x00, 0x00, 0x00, 40};
    assert_int_equal(scan_all(map32, 5, 84, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "message declares 80 elements, beyond the limit of 84 bytes");
    const uint8_t fixmap[] = {0x8f};
    assert_int_equal(scan_all(fixmap, 1, 30, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "message declares 30 elements, beyond the limit of 30 bytes");
    assert_int_equal(scan_all(fixmap, 1, 31, &used, &complete, err, sizeof(err)), HPD_OK);

    /* nesting: 32 levels pass, 33 do not */
    memset(buf, 0x91, 33);
    buf[33] = 0x01;
    assert_int_equal(scan_all(buf + 1, 33, 1024, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_true(complete);
    assert_int_equal(used, 33);
    assert_int_equal(scan_all(buf, 34, 1024, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "message nests deeper than 32 levels");
    /* empty containers open no level */
    memset(buf, 0x91, 32);
    buf[32] = 0x90;
    assert_int_equal(scan_all(buf, 33, 1024, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_true(complete);

    /* byte 0xc1, at the start or inside */
    const uint8_t c1[] = {0x92, 0x01, 0xc1};
    assert_int_equal(scan_all(c1, 3, 1024, &used, &complete, err, sizeof(err)), HPD_ERR_FORMAT);
    assert_string_equal(err, "malformed msgpack (byte 0xc1)");

    /* scalars are whole messages; a partial header is not */
    const uint8_t u64[] = {0xcf, 0, 0, 0, 0, 0, 0, 0, 1, 0xc0};
    assert_int_equal(scan_all(u64, 8, 1024, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_false(complete);
    assert_int_equal(used, 8);
    assert_int_equal(scan_all(u64, 10, 1024, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_true(complete);
    assert_int_equal(used, 9);
    assert_int_equal(scan_all(u64 + 9, 1, 1024, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_true(complete);
    assert_int_equal(used, 1);
    assert_int_equal(scan_all(u64, 0, 1024, &used, &complete, err, sizeof(err)), HPD_OK);
    assert_false(complete);
    assert_int_equal(used, 0);
}

static void test_map_get_and_str_eq(void **state)
{
    hpd_rpc_buf_t b;
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;

    assert_true(hpd_rpc_str_eq("abc", 3, "abc"));
    assert_false(hpd_rpc_str_eq("abc", 2, "abc"));
    assert_false(hpd_rpc_str_eq("abcd", 4, "abc"));
    assert_false(hpd_rpc_str_eq("abd", 3, "abc"));
    assert_true(hpd_rpc_str_eq("", 0, ""));

    /* {1: "int key", "node": 7, "nodes": 8}: only string keys match, whole */
    msgpack_zone_init(&z, 1024);
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 3);
    msgpack_pack_int(&b.pk, 1);
    hpd_rpc_pack_str(&b.pk, "int key");
    hpd_rpc_pack_str(&b.pk, "nodes");
    msgpack_pack_int(&b.pk, 8);
    hpd_rpc_pack_str(&b.pk, "node");
    msgpack_pack_int(&b.pk, 7);
    assert_int_equal(msgpack_unpack(b.sb.data, b.sb.size, &off, &z, &o), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(hpd_rpc_map_get(&o, "node")->via.u64, 7);
    assert_int_equal(hpd_rpc_map_get(&o, "nodes")->via.u64, 8);
    assert_null(hpd_rpc_map_get(&o, "nod"));
    assert_null(hpd_rpc_map_get(&o, ""));
    assert_null(hpd_rpc_map_get(NULL, "node"));
    hpd_rpc_buf_destroy(&b);

    /* not a map: an array laid out as keys and values, and a string */
    hpd_rpc_buf_init(&b);
    msgpack_pack_array(&b.pk, 2);
    hpd_rpc_pack_str(&b.pk, "node");
    msgpack_pack_int(&b.pk, 7);
    off = 0;
    assert_int_equal(msgpack_unpack(b.sb.data, b.sb.size, &off, &z, &o), MSGPACK_UNPACK_SUCCESS);
    assert_null(hpd_rpc_map_get(&o, "node"));
    hpd_rpc_buf_destroy(&b);
    msgpack_zone_destroy(&z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_strict_rejections),
        cmocka_unit_test(test_accepted_fields),
        cmocka_unit_test(test_every_format),
        cmocka_unit_test(test_scan_limits),
        cmocka_unit_test(test_map_get_and_str_eq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
