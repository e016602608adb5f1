/* The field readers and packers every message goes through (node/proto.h),
 * on hand-written msgpack: each reader takes what is valid up to its
 * bound and refuses one past it, naming the field, what came (its type by
 * name) and what was expected; an absent optional field leaves the
 * caller's value, an absent token-id list reads as none; sampling packs
 * only what is set and reads back what was packed; an endpoint
 * "host:port" is split at its last colon, with the host's room and the
 * port's range checked at their limits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "node/proto.h"
#include "transport/rpc.h"

typedef struct {
    msgpack_zone z;
    msgpack_object o;
} obj_t;

/* raw msgpack, unpacked into o (free with obj_free) */
static const msgpack_object *obj(obj_t *o, const uint8_t *raw, size_t n)
{
    size_t off = 0;
    msgpack_zone_init(&o->z, 1024);
    assert_int_equal(msgpack_unpack((const char *)raw, n, &off, &o->z, &o->o),
                     MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, n);
    return &o->o;
}

static void obj_free(obj_t *o)
{
    msgpack_zone_destroy(&o->z);
}

/* {"x": value}, value given as raw msgpack */
#define ONE(...) ((const uint8_t[]){0x81, 0xa1, 'x', __VA_ARGS__})
#define ONE_N(...) (3 + sizeof((const uint8_t[]){__VA_ARGS__}))
#define MAP_X(o, ...) obj(o, ONE(__VA_ARGS__), ONE_N(__VA_ARGS__))

/* A float field that is not a number names the type that came. */
static void test_float_and_type_names(void **state)
{
    static const struct {
        uint8_t raw[8];
        size_t n;
        const char *type;
    } wrong[] = {
        {{0xc0}, 1, "nil"},          {{0xc3}, 1, "a boolean"}, {{0xa1, 's'}, 2, "a string"},
        {{0x91, 0x01}, 2, "an array"}, {{0x80}, 1, "a map"},     {{0xc4, 0x01, 0x00}, 3, "binary"},
    };
    hpd_proto_err_t err;
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        uint8_t raw[16] = {0x81, 0xa1, 'x'};
        memcpy(raw + 3, wrong[i].raw, wrong[i].n);
        obj_t o;
        float v = 5;
        assert_false(hpd_proto_float(obj(&o, raw, 3 + wrong[i].n), "x", true, &v, &err));
        char want[128];
        snprintf(want, sizeof(want), "field 'x' is %s (expected a number)", wrong[i].type);
        assert_string_equal(err.text, want);
        assert_true(v == 5);
        obj_free(&o);
    }
    obj_t o;
    float v = 0;
    assert_true(hpd_proto_float(MAP_X(&o, 0xfd), "x", true, &v, &err)); /* -3 */
    assert_true(v == -3.0f);
    obj_free(&o);
    assert_true(hpd_proto_float(MAP_X(&o, 0x07), "x", true, &v, &err));
    assert_true(v == 7.0f);
    obj_free(&o);
    assert_true(hpd_proto_float(MAP_X(&o, 0xca, 0x3f, 0xc0, 0, 0), "x", true, &v, &err));
    assert_true(v == 1.5f);
    obj_free(&o);
    /* +inf, and a double too large for a float */
    assert_false(hpd_proto_float(MAP_X(&o, 0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0), "x", true, &v,
                                 &err));
    assert_string_equal(err.text, "field 'x' is not a finite number");
    obj_free(&o);
    assert_false(hpd_proto_float(MAP_X(&o, 0xcb, 0x7f, 0xe0, 0, 0, 0, 0, 0, 0), "x", true, &v,
                                 &err));
    assert_string_equal(err.text, "field 'x' is not a finite number");
    obj_free(&o);
    /* absent: required refused, optional keeps the value */
    v = 9;
    assert_true(hpd_proto_float(MAP_X(&o, 0x07), "y", false, &v, &err));
    assert_true(v == 9.0f);
    assert_false(hpd_proto_float(&o.o, "y", true, &v, &err));
    obj_free(&o);
    /* params that are not a map, or none: refused whatever the field */
    assert_false(hpd_proto_float(obj(&o, (const uint8_t[]){0x91, 0x01}, 2), "x", false, &v,
                                 &err));
    assert_string_equal(err.text, "params are an array (expected a map)");
    obj_free(&o);
    memset(&err, 0, sizeof(err));
    assert_false(hpd_proto_float(NULL, "x", false, &v, &err));
    assert_string_equal(err.text, "params are missing (expected a map)");
    /* a string field given a number names it; at its capacity it is refused */
    char str[4] = "abc";
    assert_false(hpd_proto_str(MAP_X(&o, 0x07), "x", true, str, sizeof(str), &err));
    assert_string_equal(err.text, "field 'x' is a positive integer (expected a string)");
    assert_string_equal(str, "abc");
    obj_free(&o);
    assert_false(hpd_proto_str(MAP_X(&o, 0xa4, 'w', 'x', 'y', 'z'), "x", true, str, sizeof(str),
                               &err));
    assert_string_equal(err.text, "field 'x' is 4 bytes long (expected fewer than 4)");
    obj_free(&o);
    assert_true(hpd_proto_str(MAP_X(&o, 0xa3, 'x', 'y', 'z'), "x", true, str, sizeof(str), &err));
    assert_string_equal(str, "xyz");
    obj_free(&o);
}

/* Token ids: from 0 to limit - 1; absent or empty reads as none (the
 * caller's pointer and count set, never left as they were). */
static void test_ids(void **state)
{
    hpd_proto_err_t err;
    obj_t o;
    int32_t *ids = (int32_t *)&err, *none = ids;
    uint32_t n = 99;
    assert_true(hpd_proto_ids(MAP_X(&o, 0x07), "y", false, 10, &ids, &n, &err));
    assert_null(ids);
    assert_int_equal(n, 0);
    obj_free(&o);
    ids = none;
    n = 99;
    assert_true(hpd_proto_ids(MAP_X(&o, 0x90), "x", true, 10, &ids, &n, &err));
    assert_null(ids);
    assert_int_equal(n, 0);
    obj_free(&o);
    assert_true(hpd_proto_ids(MAP_X(&o, 0x92, 0x00, 0x09), "x", true, 10, &ids, &n, &err));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 9);
    free(ids);
    obj_free(&o);
    /* an element that is not an integer, whatever its bits */
    assert_false(hpd_proto_ids(MAP_X(&o, 0x92, 0x01, 0xc3), "x", true, 10, &ids, &n, &err));
    assert_string_equal(err.text, "x[1] is a boolean (expected a token id from 0 to 9)");
    obj_free(&o);
    assert_false(hpd_proto_ids(MAP_X(&o, 0x92, 0x00, 0x0a), "x", true, 10, &ids, &n, &err));
    assert_string_equal(err.text, "x[1] is 10 (expected a token id from 0 to 9)");
    obj_free(&o);
    assert_false(hpd_proto_ids(MAP_X(&o, 0x91, 0xff), "x", true, 10, &ids, &n, &err));
    assert_string_equal(err.text, "x[0] is -1 (expected a token id from 0 to 9)");
    obj_free(&o);
    assert_false(hpd_proto_ids(MAP_X(&o, 0x91, 0xc0), "x", true, 10, &ids, &n, &err));
    assert_string_equal(err.text, "x[0] is nil (expected a token id from 0 to 9)");
    obj_free(&o);
    assert_false(hpd_proto_ids(MAP_X(&o, 0x80), "x", true, 10, &ids, &n, &err));
    assert_string_equal(err.text, "field 'x' is a map (expected an array of token ids)");
    obj_free(&o);
    assert_false(hpd_proto_ids(MAP_X(&o, 0xa2, 'a', 'b'), "x", true, 10, &ids, &n, &err));
    assert_string_equal(err.text, "field 'x' is a string (expected an array of token ids)");
    obj_free(&o);
}

/* 32-bit arrays: UINT32_MAX is taken, one more is not; at most max
 * elements. */
static void test_u32s(void **state)
{
    hpd_proto_err_t err;
    obj_t o;
    uint32_t out[2], n = 0;
    obj(&o, (const uint8_t[]){0x92, 0xce, 0xff, 0xff, 0xff, 0xff, 0x00}, 7);
    assert_true(hpd_proto_u32s(&o.o, "t", out, 2, &n, &err));
    assert_int_equal(n, 2);
    assert_int_equal(out[0], UINT32_MAX);
    assert_false(hpd_proto_u32s(&o.o, "t", out, 1, &n, &err));
    assert_string_equal(err.text, "t has 2 elements (expected at most 1)");
    obj_free(&o);
    obj(&o, (const uint8_t[]){0x91, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, 10);
    assert_false(hpd_proto_u32s(&o.o, "t", out, 2, &n, &err));
    assert_string_equal(err.text, "t[0] is a positive integer (expected a 32-bit unsigned "
                                  "integer)");
    obj_free(&o);
    obj(&o, (const uint8_t[]){0x91, 0xff}, 2);
    assert_false(hpd_proto_u32s(&o.o, "t", out, 2, &n, &err));
    assert_string_equal(err.text, "t[0] is a negative integer (expected a 32-bit unsigned "
                                  "integer)");
    obj_free(&o);
    obj(&o, (const uint8_t[]){0x80}, 1);
    assert_false(hpd_proto_u32s(&o.o, "t", out, 2, &n, &err));
    assert_string_equal(err.text, "t is a map (expected an array)");
    assert_false(hpd_proto_u32s(NULL, "t", out, 2, &n, &err));
    assert_string_equal(err.text, "t is missing (expected an array)");
    obj_free(&o);
}

/* Sampling packs what is set (the seed always) and reads it all back; an
 * unset field keeps the reader's value. */
static void test_sampling_round_trip(void **state)
{
    const hpd_sampling_t cases[] = {
        {.temperature = NAN, .top_p = NAN, .top_k = HPD_TOP_K_UNSET, .seed = 1},
        {.temperature = 0.5f, .top_p = NAN, .top_k = HPD_TOP_K_UNSET, .seed = 2},
        {.temperature = 0.5f, .top_p = 0.25f, .top_k = HPD_TOP_K_UNSET, .seed = 3},
        {.temperature = NAN, .top_p = 0.75f, .top_k = 40, .seed = UINT64_MAX},
    };
    const uint32_t entries[] = {1, 2, 3, 3};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hpd_rpc_buf_t b;
        obj_t o;
        hpd_proto_err_t err;
        hpd_rpc_buf_init(&b);
        hpd_proto_pack_sampling(&b.pk, &cases[i]);
        obj(&o, (const uint8_t *)b.sb.data, b.sb.size);
        assert_int_equal(o.o.via.map.size, entries[i]);
        hpd_sampling_t s = {.temperature = -7, .top_p = -7, .top_k = 7, .seed = 7};
        assert_true(hpd_proto_sampling(&o.o, &s, &err));
        assert_true(isnan(cases[i].temperature) ? s.temperature == -7
                                                : s.temperature == cases[i].temperature);
        assert_true(isnan(cases[i].top_p) ? s.top_p == -7 : s.top_p == cases[i].top_p);
        assert_int_equal(s.top_k, cases[i].top_k == HPD_TOP_K_UNSET ? 7 : cases[i].top_k);
        assert_int_equal(s.seed, cases[i].seed);
        obj_free(&o);
        hpd_rpc_buf_destroy(&b);
    }
    obj_t o;
    hpd_proto_err_t err;
    hpd_sampling_t s;
    obj(&o, (const uint8_t[]){0x81, 0xa5, 't', 'o', 'p', '_', 'p', 0xc3}, 8);
    assert_false(hpd_proto_sampling(&o.o, &s, &err));
    assert_string_equal(err.text, "field 'top_p' is a boolean (expected a number)");
    obj_free(&o);
    /* the ranges, at their bounds on both sides */
    const struct {
        float temperature, top_p;
        const char *want; /* NULL: taken */
    } bounds[] = {
        {0.0f, 1.0f, NULL},
        {-0.0f, 1e-30f, NULL},
        {-1e-30f, NAN, "field 'temperature' is -1e-30 (expected a number >= 0; 0 is greedy)"},
        {INFINITY, NAN, "field 'temperature' is not a finite number"},
        {NAN, 0.0f, "field 'top_p' is 0 (expected a number in (0, 1])"},
        {NAN, 1.0000001f, "field 'top_p' is 1 (expected a number in (0, 1])"},
        {NAN, -0.5f, "field 'top_p' is -0.5 (expected a number in (0, 1])"},
    };
    for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++) {
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        const bool t = !isnan(bounds[i].temperature), p = !isnan(bounds[i].top_p);
        msgpack_pack_map(&b.pk, (uint32_t)t + (uint32_t)p);
        if (t) {
            hpd_proto_key(&b.pk, "temperature");
            msgpack_pack_float(&b.pk, bounds[i].temperature);
        }
        if (p) {
            hpd_proto_key(&b.pk, "top_p");
            msgpack_pack_float(&b.pk, bounds[i].top_p);
        }
        obj(&o, (const uint8_t *)b.sb.data, b.sb.size);
        s = (hpd_sampling_t){.temperature = NAN, .top_p = NAN};
        memset(&err, 0, sizeof(err));
        const bool ok = hpd_proto_sampling(&o.o, &s, &err);
        if (ok != (bounds[i].want == NULL) ||
            (bounds[i].want != NULL && strcmp(err.text, bounds[i].want) != 0))
            fail_msg("temperature %g top_p %.9g: %s", (double)bounds[i].temperature,
                     (double)bounds[i].top_p, ok ? "taken" : err.text);
        obj_free(&o);
        hpd_rpc_buf_destroy(&b);
    }
    /* an unset value is not checked: the node resolves it from its model */
    obj(&o, (const uint8_t[]){0x81, 0xa4, 's', 'e', 'e', 'd', 0x05}, 7);
    s = (hpd_sampling_t){.temperature = NAN, .top_p = NAN};
    assert_true(hpd_proto_sampling(&o.o, &s, &err));
    assert_true(isnan(s.temperature) && isnan(s.top_p));
    obj_free(&o);
}

/* A page layout: block a multiple of 16 and pack at least 1, each bound
 * on both sides; what it packs reads back. */
static void test_layout(void **state)
{
    static const struct {
        uint32_t block, pack;
        bool ok;
    } cases[] = {{16, 1, true}, {0, 1, false}, {8, 1, false}, {16, 0, false}, {64, 3, true}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hpd_rpc_buf_t b;
        obj_t o;
        hpd_proto_err_t err = {{0}};
        hpd_kv_layout_t l = {0};
        const hpd_kv_layout_t in = {.block_size = cases[i].block, .pack_size = cases[i].pack,
                                    .order = HPD_KV_HND};
        hpd_rpc_buf_init(&b);
        msgpack_pack_map(&b.pk, 1);
        hpd_proto_key(&b.pk, "layout");
        hpd_proto_pack_layout(&b.pk, &in);
        obj(&o, (const uint8_t *)b.sb.data, b.sb.size);
        const bool ok = hpd_proto_layout(&o.o, "layout", &l, &err);
        if (ok != cases[i].ok)
            fail_msg("B=%u P=%u: %s", cases[i].block, cases[i].pack, ok ? "taken" : err.text);
        if (ok) {
            assert_int_equal(l.block_size, in.block_size);
            assert_int_equal(l.pack_size, in.pack_size);
            assert_int_equal(l.order, HPD_KV_HND);
        } else {
            char want[100];
            snprintf(want, sizeof(want),
                     "layout is B=%u, P=%u (expected B a multiple of 16 and P >= 1)",
                     cases[i].block, cases[i].pack);
            assert_string_equal(err.text, want);
        }
        obj_free(&o);
        hpd_rpc_buf_destroy(&b);
    }
}

/* host:port, split at the last colon; the host must fit in cap with its
 * NUL, the port be 0 to 65535 and all digits. */
static void test_endpoint(void **state)
{
    char host[8];
    uint16_t port = 0;
    assert_true(hpd_proto_parse_endpoint("1234567:65535", host, sizeof(host), &port));
    assert_string_equal(host, "1234567");
    assert_int_equal(port, 65535);
    assert_true(hpd_proto_parse_endpoint("[::1]:80", host, sizeof(host), &port));
    assert_string_equal(host, "[::1]");
    assert_int_equal(port, 80);
    static const char *const bad[] = {"12345678:1", "host", ":80", "h:", "h:65536",
                                      "h:12x",      "h:-1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        port = 7;
        if (hpd_proto_parse_endpoint(bad[i], host, sizeof(host), &port))
            fail_msg("\"%s\" taken as an endpoint", bad[i]);
        assert_int_equal(port, 7);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_and_type_names),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_u32s),
        cmocka_unit_test(test_sampling_round_trip),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
