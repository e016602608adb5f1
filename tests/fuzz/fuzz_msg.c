/* Fuzz target of the typed messages' unpacker (node/msg.h). The first byte
 * picks the message, the rest is one msgpack value. Whatever it is, the
 * unpacker must not crash, leak or read past it; what it accepts must pack
 * again into a value it accepts again, with the same fields (the two packs
 * are byte-equal). */
#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node/msg.h"
#include "transport/rpc_codec.h"

/* room for any message struct */
typedef union {
    hpd_msg_register_t reg;
    hpd_msg_reservation_t reservation;
    hpd_msg_destination_t destination;
    hpd_msg_prefill_job_t prefill_job;
    hpd_msg_decode_load_t decode_load;
    hpd_msg_prefill_load_t prefill_load;
    hpd_msg_stats_t stats;
    hpd_msg_xfer_stats_t xfer_stats;
    hpd_msg_registered_t registered;
    hpd_msg_alive_t alive;
    hpd_msg_tokens_t tokens;
    hpd_msg_cancel_job_t cancel;
    hpd_msg_start_t start;
    hpd_msg_prefilled_t prefilled;
    hpd_msg_reserve_t reserve;
    hpd_msg_generate_t generate;
    hpd_msg_generated_t generated;
    hpd_msg_stream_t stream;
    hpd_msg_cancel_request_t cancel_request;
    hpd_msg_canceled_t canceled;
} any_msg_t;

static void repack(const hpd_msg_desc_t *d, const any_msg_t *m, msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    hpd_msg_pack(d, m, &pk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const hpd_msg_desc_t *d = hpd_msg_all[data[0] % hpd_msg_n_all];
    /* what a connection hands on: one whole value that passed the codec's
     * scanner (size and nesting bounded before msgpack-c allocates) */
    hpd_rpc_scanner_t sc;
    size_t used = 0;
    bool complete = false;
    char why[128];
    hpd_rpc_scanner_reset(&sc);
    if (hpd_rpc_scan(&sc, data + 1, size - 1, 1 << 20, &used, &complete, why, sizeof(why)) !=
            HPD_OK ||
        !complete)
        return 0;
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, (const char *)data + 1, size - 1, &off) !=
        MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&u);
        return 0;
    }
    any_msg_t m, m2;
    hpd_proto_err_t err;
    memset(&m, 0, sizeof(m));
    if (hpd_msg_unpack(d, &u.data, &m, &err)) {
        msgpack_sbuffer a, b;
        msgpack_unpacked u2;
        size_t off2 = 0;
        repack(d, &m, &a);
        msgpack_unpacked_init(&u2);
        if (msgpack_unpack_next(&u2, a.data, a.size, &off2) != MSGPACK_UNPACK_SUCCESS)
            abort();
        memset(&m2, 0, sizeof(m2));
        if (!hpd_msg_unpack(d, &u2.data, &m2, &err))
            abort(); /* it packed what it refuses */
        repack(d, &m2, &b);
        if (a.size != b.size || memcmp(a.data, b.data, a.size) != 0)
            abort(); /* a field did not survive the round trip */
        hpd_msg_free(d, &m2);
        msgpack_sbuffer_destroy(&a);
        msgpack_sbuffer_destroy(&b);
        msgpack_unpacked_destroy(&u2);
        hpd_msg_free(d, &m);
    } else if (err.text[0] == '\0') {
        abort(); /* a refusal says why */
    }
    msgpack_unpacked_destroy(&u);
    return 0;
}
