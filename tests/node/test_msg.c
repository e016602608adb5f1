/* The typed messages (node/msg.h): every message of hpd_msg_all packs and
 * unpacks field for field; the packer counts its own map entries (required
 * fields always, optional ones when set); the unpacker refuses a non-map,
 * a missing required field and a field of the wrong kind or range, with
 * an error naming the message and the field, keeps the caller's defaults
 * for absent optional fields, and ignores keys it does not know. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "node/msg.h"
#include "tests/test_helpers.h"
#include "transport/rpc.h"

typedef struct {
    hpd_rpc_buf_t b;
    msgpack_zone z;
    msgpack_object o;
} packed_t;

static const msgpack_object *unpack_buf(packed_t *p)
{
    size_t off = 0;
    msgpack_zone_init(&p->z, 4096);
    assert_int_equal(msgpack_unpack(p->b.sb.data, p->b.sb.size, &off, &p->z, &p->o),
                     MSGPACK_UNPACK_SUCCESS);
    return &p->o;
}

static const msgpack_object *pack(packed_t *p, const hpd_msg_desc_t *d, const void *msg)
{
    hpd_rpc_buf_init(&p->b);
    hpd_msg_pack(d, msg, &p->b.pk);
    return unpack_buf(p);
}

static void packed_free(packed_t *p)
{
    msgpack_zone_destroy(&p->z);
    hpd_rpc_buf_destroy(&p->b);
}

static void test_round_trip(void **state)
{
    static const int32_t ids[] = {5, 0, 511};
    packed_t p;
    hpd_proto_err_t err;

    const hpd_msg_tokens_t t = {.job = 1ull << 60, .index = 7, .ids = ids, .ids_n = 3,
                                .done = true, .error = "reservation expired"};
    hpd_msg_tokens_t t2 = {0};
    const msgpack_object *o = pack(&p, &hpd_msg_tokens, &t);
    assert_int_equal(o->via.map.size, 5);
    assert_true(hpd_msg_unpack(&hpd_msg_tokens, o, &t2, &err));
    assert_true(t2.job == t.job && t2.index == 7 && t2.done && t2.ids_n == 3);
    assert_memory_equal(t2.ids, ids, sizeof(ids));
    assert_string_equal(t2.error, "reservation expired");
    hpd_msg_free(&hpd_msg_tokens, &t2);
    assert_null(t2.ids);
    assert_int_equal(t2.ids_n, 0);
    packed_free(&p);

    const hpd_msg_prefilled_t f = {.first_token = 17, .cached_tokens = 64, .queue_ms = 0.5f,
                                   .prefill_ms = 12.25f, .push_ms = 3.0f,
                                   .exposed_push_ms = 0.125f};
    hpd_msg_prefilled_t f2 = {0};
    o = pack(&p, &hpd_msg_prefilled, &f);
    assert_int_equal(o->via.map.size, 6);
    assert_true(hpd_msg_unpack(&hpd_msg_prefilled, o, &f2, &err));
    assert_memory_equal(&f, &f2, sizeof(f));
    packed_free(&p);

    const hpd_msg_registered_t r = {.node_id = UINT64_MAX, .heartbeat_ms = 100,
                                    .lease_ms = 6000, .alive_ms = 100,
                                    .alive_key = 0x8000000000000001ull};
    hpd_msg_registered_t r2 = {0};
    o = pack(&p, &hpd_msg_registered, &r);
    assert_true(hpd_msg_unpack(&hpd_msg_registered, o, &r2, &err));
    assert_true(r2.node_id == r.node_id && r2.heartbeat_ms == 100 && r2.lease_ms == 6000 &&
                r2.alive_ms == 100 && r2.alive_key == r.alive_key);
    packed_free(&p);
}

/* Unset optional fields are not packed; absent ones keep the defaults. */
static void test_optional_fields(void **state)
{
    packed_t p;
    hpd_proto_err_t err;
    const msgpack_object *o = pack(&p, &hpd_msg_registered, &(hpd_msg_registered_t){.node_id = 3});
    assert_int_equal(o->via.map.size, 1);
    hpd_msg_registered_t r = {.heartbeat_ms = 500, .lease_ms = 42};
    assert_true(hpd_msg_unpack(&hpd_msg_registered, o, &r, &err));
    assert_int_equal(r.node_id, 3);
    assert_int_equal(r.heartbeat_ms, 500);
    assert_int_equal(r.lease_ms, 42);
    packed_free(&p);

    /* a required field is packed even when zero */
    o = pack(&p, &hpd_msg_tokens, &(hpd_msg_tokens_t){0});
    assert_int_equal(o->via.map.size, 4);
    hpd_msg_tokens_t t = {0};
    assert_true(hpd_msg_unpack(&hpd_msg_tokens, o, &t, &err));
    assert_false(t.done);
    assert_int_equal(t.ids_n, 0);
    packed_free(&p);

    /* hpd_msg_pack_all: every number, flag, string and id list is packed,
     * zeros too (a client's max_tokens 0 reaches the coordinator's check
     * instead of reading as the default 16); absent OBJ/ARR/BIN still not */
    hpd_rpc_buf_init(&p.b);
    hpd_msg_pack_all(&hpd_msg_generate, &(hpd_msg_generate_t){0}, &p.b.pk);
    o = unpack_buf(&p);
    assert_int_equal(o->via.map.size, hpd_msg_generate.n_fields - 6); /* no text, messages,
                                                         stop, grammar, tools, tool_choice */
    hpd_msg_generate_t g = {.max_tokens = 16, .top_p = 1, .stream = true};
    assert_true(hpd_msg_unpack(&hpd_msg_generate, o, &g, &err));
    assert_int_equal(g.max_tokens, 0);
    assert_true(g.top_p == 0.0f);
    assert_false(g.stream);
    hpd_msg_free(&hpd_msg_generate, &g);
    packed_free(&p);
    hpd_rpc_buf_init(&p.b);
    hpd_msg_pack_all(&hpd_msg_reserve, &(hpd_msg_reserve_t){0}, &p.b.pk);
    o = unpack_buf(&p);
    assert_int_equal(o->via.map.size, hpd_msg_reserve.n_fields - 2); /* no sampling, grammar */
    packed_free(&p);

    /* a number out of its field's range means "not given", even with
     * pack_all: a client's unset sampling fields (hpd_sampling_unset) */
    hpd_rpc_buf_init(&p.b);
    hpd_msg_pack_all(&hpd_msg_generate,
                     &(hpd_msg_generate_t){.temperature = NAN, .top_p = 0.5f,
                                           .top_k = HPD_TOP_K_UNSET},
                     &p.b.pk);
    o = unpack_buf(&p);
    assert_int_equal(o->via.map.size, hpd_msg_generate.n_fields - 2 - 6); /* and no text,
                                    messages, stop, grammar, tools, tool_choice */
    assert_null(hpd_rpc_map_get(o, "temperature"));
    assert_null(hpd_rpc_map_get(o, "top_k"));
    assert_non_null(hpd_rpc_map_get(o, "top_p"));
    packed_free(&p);
    /* and the sampling map of reserve and prefill leaves unset fields out */
    hpd_rpc_buf_init(&p.b);
    hpd_sampling_t s = hpd_sampling_unset();
    s.top_k = 3;
    hpd_proto_pack_sampling(&p.b.pk, &s);
    o = unpack_buf(&p);
    assert_int_equal(o->via.map.size, 2); /* top_k, seed */
    hpd_sampling_t back = {.temperature = 0.7f, .top_p = 0.9f};
    assert_true(hpd_proto_sampling(o, &back, &err));
    assert_true(back.temperature == 0.7f && back.top_p == 0.9f && back.top_k == 3);
    packed_free(&p);
}

/* Builds a map from key/value pairs written by fn. */
static const msgpack_object *build(packed_t *p, void (*fn)(msgpack_packer *))
{
    hpd_rpc_buf_init(&p->b);
    fn(&p->b.pk);
    return unpack_buf(p);
}

static void start_extra_key(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 3);
    hpd_proto_kv_u64(pk, "future_field", 1);
    hpd_proto_kv_u64(pk, "job", 9);
    hpd_proto_kv_u64(pk, "first_token", 4);
}

static void start_no_job(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    hpd_proto_kv_u64(pk, "first_token", 4);
}

static void start_token_str(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    hpd_proto_kv_u64(pk, "job", 9);
    hpd_proto_key(pk, "first_token");
    hpd_rpc_pack_str(pk, "4");
}

static void start_token_big(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    hpd_proto_kv_u64(pk, "job", 9);
    hpd_proto_kv_u64(pk, "first_token", 1ull << 31);
}

static void tokens_bad_id(msgpack_packer *pk)
{
    static const int32_t ids[] = {1, 2};
    msgpack_pack_map(pk, 4);
    hpd_proto_kv_u64(pk, "job", 9);
    hpd_proto_kv_u64(pk, "index", 0);
    hpd_proto_key(pk, "ids");
    msgpack_pack_array(pk, 3);
    msgpack_pack_int32(pk, ids[0]);
    msgpack_pack_int32(pk, ids[1]);
    msgpack_pack_int32(pk, -1);
    hpd_proto_key(pk, "done");
    msgpack_pack_true(pk);
}

static void not_a_map(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 0);
}

static void test_refusals(void **state)
{
    packed_t p;
    hpd_proto_err_t err;
    hpd_msg_start_t s = {0};

    assert_true(hpd_msg_unpack(&hpd_msg_start, build(&p, start_extra_key), &s, &err));
    assert_int_equal(s.job, 9);
    assert_int_equal(s.first_token, 4);
    packed_free(&p);

    static const struct {
        void (*fn)(msgpack_packer *);
        const hpd_msg_desc_t *d;
        const char *says;
    } bad[] = {
        {start_no_job, &hpd_msg_start, "start: "},
        {start_token_str, &hpd_msg_start, "first_token"},
        {start_token_big, &hpd_msg_start, "first_token"},
        {tokens_bad_id, &hpd_msg_tokens, "ids[2]"},
        {not_a_map, &hpd_msg_alive, "alive: not a map"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hpd_msg_tokens_t any = {0}; /* the largest of the structs used here */
        memset(&err, 0, sizeof(err));
        assert_false(hpd_msg_unpack(bad[i].d, build(&p, bad[i].fn), &any, &err));
        if (strstr(err.text, bad[i].says) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err.text, bad[i].says);
        assert_null(any.ids); /* nothing left to free */
        packed_free(&p);
    }
}

/* A value for a field that is valid whatever its limit. */
static void pack_valid(msgpack_packer *pk, const hpd_msg_field_t *f)
{
    switch (f->kind) {
    case HPD_MSG_BOOL: msgpack_pack_true(pk); break;
    case HPD_MSG_F32: msgpack_pack_float(pk, 1); break;
    case HPD_MSG_STR: hpd_rpc_pack_str(pk, "x"); break;
    case HPD_MSG_IDS: msgpack_pack_array(pk, 0); break;
    case HPD_MSG_BIN: hpd_proto_pack_bin(pk, "x", 1); break;
    case HPD_MSG_OBJ: msgpack_pack_map(pk, 0); break;
    case HPD_MSG_ARR: msgpack_pack_array(pk, 0); break;
    case HPD_MSG_LAYOUT: {
        const hpd_kv_layout_t l = {.block_size = 16, .pack_size = 1};
        hpd_proto_pack_layout(pk, &l);
        break;
    }
    default: msgpack_pack_uint32(pk, 1); break;
    }
}

/* For every message and every required field: a map with all the others
 * and without it is refused, naming it. */
static void test_every_required_field(void **state)
{
    for (uint32_t m = 0; m < hpd_msg_n_all; m++) {
        const hpd_msg_desc_t *d = hpd_msg_all[m];
        for (uint32_t i = 0; i < d->n_fields; i++) {
            if (!d->fields[i].required)
                continue;
            packed_t p;
            hpd_proto_err_t err = {{0}};
            _Alignas(16) uint8_t msg[1024] = {0}; /* room for any message struct */
            _Static_assert(sizeof(hpd_msg_register_t) <= 1024 && sizeof(hpd_msg_stats_t) <= 1024,
                           "a message outgrew the test");
            hpd_rpc_buf_init(&p.b);
            uint32_t n = 0;
            for (uint32_t j = 0; j < d->n_fields; j++)
                n += d->fields[j].required && j != i;
            msgpack_pack_map(&p.b.pk, n);
            for (uint32_t j = 0; j < d->n_fields; j++) {
                if (!d->fields[j].required || j == i)
                    continue;
                hpd_proto_key(&p.b.pk, d->fields[j].name);
                pack_valid(&p.b.pk, &d->fields[j]);
            }
            assert_false(hpd_msg_unpack(d, unpack_buf(&p), msg, &err));
            if (strstr(err.text, d->fields[i].name) == NULL ||
                strncmp(err.text, d->name, strlen(d->name)) != 0)
                fail_msg("%s without %s: '%s'", d->name, d->fields[i].name, err.text);
            packed_free(&p);
        }
    }
}

/* Field i of d at its limit (past: one beyond it), the required others
 * valid: unpacked into msg; the caller frees it when it returns true. */
static bool unpack_at_limit(const hpd_msg_desc_t *d, uint32_t i, bool past, void *msg,
                            hpd_proto_err_t *err)
{
    const hpd_msg_field_t *f = &d->fields[i];
    packed_t p;
    hpd_rpc_buf_init(&p.b);
    uint32_t n = 1;
    for (uint32_t j = 0; j < d->n_fields; j++)
        n += d->fields[j].required && j != i;
    msgpack_pack_map(&p.b.pk, n);
    for (uint32_t j = 0; j < d->n_fields; j++) {
        if (!d->fields[j].required || j == i)
            continue;
        hpd_proto_key(&p.b.pk, d->fields[j].name);
        pack_valid(&p.b.pk, &d->fields[j]);
    }
    hpd_proto_key(&p.b.pk, f->name);
    char text[1024];
    switch (f->kind) {
    case HPD_MSG_STR: /* limit: the buffer, its terminator included */
        memset(text, 'a', sizeof(text));
        msgpack_pack_str(&p.b.pk, (size_t)f->limit - (past ? 0 : 1));
        msgpack_pack_str_body(&p.b.pk, text, (size_t)f->limit - (past ? 0 : 1));
        break;
    case HPD_MSG_IDS: /* limit: the first id refused */
        msgpack_pack_array(&p.b.pk, 1);
        msgpack_pack_uint64(&p.b.pk, f->limit - (past ? 0 : 1));
        break;
    default: /* numbers: the largest accepted */
        msgpack_pack_uint64(&p.b.pk, f->limit + (past ? 1 : 0));
        break;
    }
    const bool ok = hpd_msg_unpack(d, unpack_buf(&p), msg, err);
    packed_free(&p);
    return ok;
}

/* Every bound on a peer's input at exactly its limit, on both sides: a
 * string of the buffer's size less its terminator is taken whole, one
 * byte more is refused; an id just below a limit is taken, the limit
 * refused; a number at its limit is taken, one more refused, each naming
 * the field. (A bound moved by one survived the suite once: the
 * terminator then lands past the buffer.) */
static void test_every_bound(void **state)
{
    uint32_t checked = 0;
    for (uint32_t m = 0; m < hpd_msg_n_all; m++) {
        const hpd_msg_desc_t *d = hpd_msg_all[m];
        for (uint32_t i = 0; i < d->n_fields; i++) {
            const hpd_msg_field_t *f = &d->fields[i];
            const bool bounded =
                f->kind == HPD_MSG_STR || (f->kind == HPD_MSG_IDS && f->limit > 0) ||
                (f->kind == HPD_MSG_U32 && f->limit < UINT32_MAX) ||
                (f->kind == HPD_MSG_U64 && f->limit < UINT64_MAX);
            if (!bounded)
                continue;
            hpd_proto_err_t err = {{0}};
            _Alignas(16) uint8_t msg[1024] = {0};
            if (!unpack_at_limit(d, i, false, msg, &err))
                fail_msg("%s.%s at its limit %llu refused: %s", d->name, f->name,
                         (unsigned long long)f->limit, err.text);
            const void *at = msg + f->offset;
            switch (f->kind) {
            case HPD_MSG_STR: assert_int_equal(strlen(at), f->limit - 1); break;
            case HPD_MSG_IDS:
                assert_int_equal(*(const uint32_t *)(msg + f->aux), 1);
                assert_int_equal((*(const int32_t *const *)at)[0], (int32_t)(f->limit - 1));
                break;
            case HPD_MSG_U32: assert_int_equal(*(const uint32_t *)at, f->limit); break;
            default: assert_true(*(const uint64_t *)at == f->limit); break;
            }
            hpd_msg_free(d, msg);
            memset(msg, 0, sizeof(msg));
            if (unpack_at_limit(d, i, true, msg, &err))
                fail_msg("%s.%s past its limit %llu taken", d->name, f->name,
                         (unsigned long long)f->limit);
            if (strstr(err.text, f->name) == NULL)
                fail_msg("%s.%s past its limit: '%s' does not name it", d->name, f->name,
                         err.text);
            checked++;
        }
    }
    fprintf(stderr, "%u bounded fields checked at their limits\n", checked);
    assert_true(checked > 20);
}

/* A message of every kind, all optional: the generic code for each kind. */
#define TEST_ALL(T, X)                                                                      \
    X(T, u, U64, HPD_OPT, 100)                                                               \
    X(T, w, U32, HPD_OPT, 100)                                                               \
    X(T, b, BOOL, HPD_OPT, 0)                                                                \
    X(T, f, F32, HPD_OPT, 0)                                                                 \
    X(T, s, STR, HPD_OPT, 8)                                                                 \
    X(T, ids, IDS, HPD_OPT, 1000)                                                            \
    X(T, bin, BIN, HPD_OPT, 0)                                                               \
    X(T, obj, OBJ, HPD_OPT, 0)                                                               \
    X(T, arr, ARR, HPD_OPT, 0)
HPD_MSG_STRUCT(test_all_t, TEST_ALL)
HPD_MSG_DESC(test_all, "all", test_all_t, TEST_ALL)

static void test_every_kind(void **state)
{
    packed_t p, inner, arr;
    hpd_proto_err_t err;
    static const int32_t ids[] = {999, 0};

    /* nothing set: nothing packed, every default kept */
    const msgpack_object *o = pack(&p, &test_all, &(test_all_t){0});
    assert_int_equal(o->via.map.size, 0);
    test_all_t d = {.u = 7, .w = 8, .b = true, .f = 0.5f, .s = "dflt"};
    assert_true(hpd_msg_unpack(&test_all, o, &d, &err));
    assert_true(d.u == 7 && d.w == 8 && d.b && d.f == 0.5f && strcmp(d.s, "dflt") == 0);
    assert_true(d.ids == NULL && d.bin == NULL && d.obj == NULL && d.arr == NULL);
    packed_free(&p);

    /* everything set: the object as an object, the array as packed bytes */
    hpd_rpc_buf_init(&inner.b);
    msgpack_pack_map(&inner.b.pk, 1);
    hpd_proto_kv_u64(&inner.b.pk, "k", 3);
    const msgpack_object *io = unpack_buf(&inner);
    hpd_rpc_buf_init(&arr.b);
    msgpack_pack_array(&arr.b.pk, 2);
    msgpack_pack_true(&arr.b.pk);
    msgpack_pack_nil(&arr.b.pk);
    const test_all_t all = {.u = 100, .w = 1, .b = true, .f = 2.5f, .s = "seven", .ids = ids,
                            .ids_n = 2, .bin = "xy", .bin_len = 2, .obj = io,
                            .arr_raw = arr.b.sb.data, .arr_raw_len = (uint32_t)arr.b.sb.size};
    o = pack(&p, &test_all, &all);
    assert_int_equal(o->via.map.size, 9);
    test_all_t g = {0};
    assert_true(hpd_msg_unpack(&test_all, o, &g, &err));
    assert_true(g.u == 100 && g.w == 1 && g.b && g.f == 2.5f && strcmp(g.s, "seven") == 0);
    assert_int_equal(g.ids_n, 2);
    assert_memory_equal(g.ids, ids, sizeof(ids));
    assert_int_equal(g.bin_len, 2);
    assert_memory_equal(g.bin, "xy", 2);
    assert_int_equal(g.obj->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(hpd_rpc_map_get(g.obj, "k")->via.u64, 3);
    assert_int_equal(g.arr->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(g.arr->via.array.size, 2);
    hpd_msg_free(&test_all, &g);
    packed_free(&p);
    hpd_rpc_buf_destroy(&arr.b);

    /* an object where an array belongs, and the other way round */
    const test_all_t swapped = {.obj_raw = NULL, .arr = io};
    o = pack(&p, &test_all, &swapped);
    test_all_t x = {0};
    assert_false(hpd_msg_unpack(&test_all, o, &x, &err));
    assert_non_null(strstr(err.text, "field 'arr' is not an array"));
    packed_free(&p);
    packed_free(&inner);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_optional_fields),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_every_required_field),
        cmocka_unit_test(test_every_bound),
        cmocka_unit_test(test_every_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
