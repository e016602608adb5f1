/* libFuzzer target for the msgpack-RPC codec (docs/protocol.md, "Fuzzing").
 *
 * Each input is parsed as one whole message; a message that decodes is
 * re-encoded and must decode to the same fields. The framing scanner is run
 * over the input in pieces, as a connection sees it, and must agree with a
 * single pass. */
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

static void check_round_trip(const hpd_rpc_msg_t *m)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_zone z;
    msgpack_object o;
    hpd_rpc_msg_t back;
    char err[160], method[HPD_RPC_MAX_METHOD + 1];

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (m->method != NULL) {
        memcpy(method, m->method, m->method_len);
        method[m->method_len] = '\0';
    }
    switch (m->type) {
    case HPD_RPC_REQUEST:
        hpd_rpc_pack_request(&pk, m->id, method);
        msgpack_pack_object(&pk, *m->params);
        break;
    case HPD_RPC_NOTIFY:
        hpd_rpc_pack_notify(&pk, method);
        msgpack_pack_object(&pk, *m->params);
        break;
    case HPD_RPC_RESPONSE:
        if (m->is_error) {
            msgpack_sbuffer_destroy(&sb);
            return; /* the message may hold NULs; nothing more to check */
        }
        hpd_rpc_pack_response_ok(&pk, m->id);
        msgpack_pack_object(&pk, *m->result);
        break;
    }
    msgpack_zone_init(&z, 1024);
    if (memchr(method, 0, m->method ? m->method_len : 0) == NULL) {
        hpd_status_t st = hpd_rpc_parse(sb.data, sb.size, &z, &o, &back, err, sizeof(err));
        CHECK(st == HPD_OK);
        CHECK(back.type == m->type);
        CHECK(back.id == m->id);
    }
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
