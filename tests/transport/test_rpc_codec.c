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

static void test_strict_rejections(void **state)
{
    const builder_t bad[] = {b_not_array, b_short,     b_bad_type,     b_neg_id,    b_big_id,
                             b_method_int, b_method_long, b_method_empty, b_bad_error, b_notify_4};
    msgpack_zone z;
    hpd_rpc_msg_t m;
    msgpack_object o;
    char err[160];

    msgpack_zone_init(&z, 1024);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        bad[i](&b.pk);
        err[0] = 0;
        assert_int_equal(parse_buf(&b, &m, &z), HPD_ERR_FORMAT);
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
    msgpack_zone_destroy(&z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_strict_rejections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
