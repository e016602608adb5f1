/* libFuzzer target for the msgpack-RPC codec (docs/protocol.md, "Fuzzing").
 *
 * Each input is parsed as one whole message; a message that decodes is
 * re-encoded and must decode to the same fields. The framing scanner is run
 * over the input in pieces, as a connection sees it, and must agree with a
 * single pass. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rpc_codec.h"

/* Not CHECK(): the replay test runs in release builds too. */
#define CHECK(cond) \
    do { \
        if (!(cond)) \
            abort(); \
    } while (0)

/* The bytes msgpack gives for an object: objects compare equal when these
 * do (msgpack_object_equal would call a NaN unequal to itself). */
static bool same_object(const msgpack_object *a, const msgpack_object *b)
{
    msgpack_sbuffer sa, sb;
    msgpack_packer pa, pb;
    msgpack_sbuffer_init(&sa);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pa, &sa, msgpack_sbuffer_write);
    msgpack_packer_init(&pb, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pa, *a);
    msgpack_pack_object(&pb, *b);
    const bool same = sa.size == sb.size && memcmp(sa.data, sb.data, sa.size) == 0;
    msgpack_sbuffer_destroy(&sa);
    msgpack_sbuffer_destroy(&sb);
    return same;
}

static bool same_str(const char *a, uint32_t alen, const char *b, uint32_t blen)
{
    return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* A decoded message, re-encoded with the codec's encoders, decodes to the
 * same message: every field (type, id, method, params, error code and
 * message, result). Strings with a NUL cannot go through the encoders'
 * C strings and are skipped. */
static void check_round_trip(const hpd_rpc_msg_t *m)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_zone z;
    msgpack_object o;
    hpd_rpc_msg_t back;
    char err[160], text[HPD_RPC_MAX_METHOD + 1], *message = NULL;
    const char *name = m->is_error ? m->error_message : m->method;
    const uint32_t name_len = m->is_error ? m->error_message_len : m->method_len;

    if (name != NULL && memchr(name, 0, name_len) != NULL)
        return;
    if (m->method != NULL) {
        memcpy(text, m->method, m->method_len);
        text[m->method_len] = '\0';
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    switch (m->type) {
    case HPD_RPC_REQUEST:
        hpd_rpc_pack_request(&pk, m->id, text);
        msgpack_pack_object(&pk, *m->params);
        break;
    case HPD_RPC_NOTIFY:
        hpd_rpc_pack_notify(&pk, text);
        msgpack_pack_object(&pk, *m->params);
        break;
    case HPD_RPC_RESPONSE:
        if (m->is_error) {
            CHECK((message = malloc(m->error_message_len + 1)) != NULL);
            memcpy(message, m->error_message, m->error_message_len);
            message[m->error_message_len] = '\0';
            hpd_rpc_pack_response_error(&pk, m->id, m->error_code, message);
        } else {
            hpd_rpc_pack_response_ok(&pk, m->id);
            msgpack_pack_object(&pk, *m->result);
        }
        break;
    }
    msgpack_zone_init(&z, 1024);
    CHECK(hpd_rpc_parse(sb.data, sb.size, &z, &o, &back, err, sizeof(err)) == HPD_OK);
    CHECK(back.type == m->type);
    if (m->type != HPD_RPC_NOTIFY)
        CHECK(back.id == m->id);
    if (m->type == HPD_RPC_RESPONSE) {
        CHECK(back.is_error == m->is_error);
        if (m->is_error) {
            CHECK(back.error_code == m->error_code);
            CHECK(same_str(back.error_message, back.error_message_len, m->error_message,
                           m->error_message_len));
        } else {
            CHECK(same_object(back.result, m->result));
        }
    } else {
        CHECK(same_str(back.method, back.method_len, m->method, m->method_len));
        CHECK(same_object(back.params, m->params));
    }
    free(message);
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_zone z;
    msgpack_object o;
    hpd_rpc_msg_t m;
    char err[160];

    msgpack_zone_init(&z, 1024);
    if (hpd_rpc_parse((const char *)data, size, &z, &o, &m, err, sizeof(err)) == HPD_OK)
        check_round_trip(&m);
    msgpack_zone_destroy(&z);

    /* framing in pieces, as a connection sees it, agrees with one pass */
    hpd_rpc_scanner_t whole, parts;
    size_t used_whole = 0, used = 0, total = 0;
    bool done_whole = false, done = false;
    hpd_status_t st_whole, st = HPD_OK;
    hpd_rpc_scanner_reset(&whole);
    hpd_rpc_scanner_reset(&parts);
    st_whole = hpd_rpc_scan(&whole, data, size, 1u << 16, &used_whole, &done_whole, err,
                            sizeof(err));
    const size_t cut = size / 3;
    for (int piece = 0; piece < 2 && !done && st == HPD_OK; piece++) {
        const size_t off = piece ? cut : 0, n = piece ? size - cut : cut;
        st = hpd_rpc_scan(&parts, data + off, n, 1u << 16, &used, &done, err, sizeof(err));
        total += used;
    }
    CHECK(st == st_whole);
    if (st == HPD_OK) {
        CHECK(done == done_whole);
        CHECK(!done || total == used_whole);
    }
    if (st == HPD_OK && done) { /* a framed message unpacks within bounded memory */
        msgpack_zone_init(&z, 1024);
        size_t off = 0;
        if (msgpack_unpack((const char *)data, used_whole, &off, &z, &o) ==
            MSGPACK_UNPACK_SUCCESS)
            hpd_rpc_decode(&o, &m, err, sizeof(err));
        msgpack_zone_destroy(&z);
    }
    return 0;
}
