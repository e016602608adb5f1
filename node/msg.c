#include "node/msg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rpc.h"

HPD_MSG_DESC(hpd_msg_register, "register", hpd_msg_register_t, HPD_MSG_REGISTER)
HPD_MSG_DESC(hpd_msg_reservation, "reservation", hpd_msg_reservation_t, HPD_MSG_RESERVATION)
HPD_MSG_DESC(hpd_msg_destination, "decode", hpd_msg_destination_t, HPD_MSG_DESTINATION)
HPD_MSG_DESC(hpd_msg_prefill_job, "prefill", hpd_msg_prefill_job_t, HPD_MSG_PREFILL_JOB)
HPD_MSG_DESC(hpd_msg_stats, "stats", hpd_msg_stats_t, HPD_MSG_STATS)
HPD_MSG_DESC(hpd_msg_engine_stats, "engine", hpd_msg_engine_stats_t, HPD_MSG_ENGINE_STATS)
HPD_MSG_DESC(hpd_msg_cache_stats, "cache", hpd_msg_cache_stats_t, HPD_MSG_CACHE_STATS)
HPD_MSG_DESC(hpd_msg_xfer_stats, "xfer", hpd_msg_xfer_stats_t, HPD_MSG_XFER_STATS)
HPD_MSG_DESC(hpd_msg_prefill_load, "load", hpd_msg_prefill_load_t, HPD_MSG_PREFILL_LOAD)
HPD_MSG_DESC(hpd_msg_decode_load, "load", hpd_msg_decode_load_t, HPD_MSG_DECODE_LOAD)
HPD_MSG_DESC(hpd_msg_registered, "register reply", hpd_msg_registered_t, HPD_MSG_REGISTERED)
HPD_MSG_DESC(hpd_msg_alive, "alive", hpd_msg_alive_t, HPD_MSG_ALIVE)
HPD_MSG_DESC(hpd_msg_tokens, "tokens", hpd_msg_tokens_t, HPD_MSG_TOKENS)
HPD_MSG_DESC(hpd_msg_cancel_job, "cancel", hpd_msg_cancel_job_t, HPD_MSG_CANCEL_JOB)
HPD_MSG_DESC(hpd_msg_start, "start", hpd_msg_start_t, HPD_MSG_START)
HPD_MSG_DESC(hpd_msg_prefilled, "prefill reply", hpd_msg_prefilled_t, HPD_MSG_PREFILLED)
HPD_MSG_DESC(hpd_msg_reserve, "reserve", hpd_msg_reserve_t, HPD_MSG_RESERVE)
HPD_MSG_DESC(hpd_msg_generate, "generate", hpd_msg_generate_t, HPD_MSG_GENERATE)
HPD_MSG_DESC(hpd_msg_generated, "generate reply", hpd_msg_generated_t, HPD_MSG_GENERATED)
HPD_MSG_DESC(hpd_msg_choice, "choice", hpd_msg_choice_t, HPD_MSG_CHOICE)
HPD_MSG_DESC(hpd_msg_stream, "tokens", hpd_msg_stream_t, HPD_MSG_STREAM)
HPD_MSG_DESC(hpd_msg_cancel_request, "cancel", hpd_msg_cancel_request_t,
             HPD_MSG_CANCEL_REQUEST)
HPD_MSG_DESC(hpd_msg_canceled, "cancel reply", hpd_msg_canceled_t, HPD_MSG_CANCELED)
HPD_MSG_DESC(hpd_msg_schedule, "schedule", hpd_msg_schedule_t, HPD_MSG_SCHEDULE)
HPD_MSG_DESC(hpd_msg_scheduled, "schedule reply", hpd_msg_scheduled_t, HPD_MSG_SCHEDULED)
HPD_MSG_DESC(hpd_msg_ended, "ended", hpd_msg_ended_t, HPD_MSG_ENDED)
HPD_MSG_DESC(hpd_msg_unschedule, "unschedule", hpd_msg_unschedule_t, HPD_MSG_UNSCHEDULE)
HPD_MSG_DESC(hpd_msg_limits, "limits reply", hpd_msg_limits_t, HPD_MSG_LIMITS)

const hpd_msg_desc_t *const hpd_msg_all[] = {&hpd_msg_register,    &hpd_msg_registered,
                                             &hpd_msg_reservation, &hpd_msg_destination,
                                             &hpd_msg_prefill_job, &hpd_msg_prefill_load, &hpd_msg_decode_load,
                                             &hpd_msg_stats,       &hpd_msg_engine_stats,
                                             &hpd_msg_cache_stats, &hpd_msg_xfer_stats,
                                             &hpd_msg_alive,
                                             &hpd_msg_tokens,     &hpd_msg_cancel_job,
                                             &hpd_msg_start,      &hpd_msg_prefilled,
                                             &hpd_msg_reserve,    &hpd_msg_generate,
                                             &hpd_msg_generated,  &hpd_msg_choice,
                                             &hpd_msg_stream,
                                             &hpd_msg_cancel_request, &hpd_msg_canceled,
                                             &hpd_msg_schedule,   &hpd_msg_scheduled,
                                             &hpd_msg_ended,      &hpd_msg_unschedule,
                                             &hpd_msg_limits};
const uint32_t hpd_msg_n_all = sizeof(hpd_msg_all) / sizeof(hpd_msg_all[0]);

#define AT(msg, off, type) ((type *)((char *)(msg) + (off)))
#define AT_C(msg, off, type) ((type const *)((const char *)(msg) + (off)))

/* Whether an optional field is set (packed). */
static bool is_set(const hpd_msg_field_t *f, const void *msg)
{
    switch (f->kind) {
    case HPD_MSG_U64: return *AT_C(msg, f->offset, uint64_t) != 0;
    case HPD_MSG_U32: return *AT_C(msg, f->offset, uint32_t) != 0;
    case HPD_MSG_BOOL: return *AT_C(msg, f->offset, bool);
    case HPD_MSG_F32: return *AT_C(msg, f->offset, float) != 0;
    case HPD_MSG_STR: return AT_C(msg, f->offset, char)[0] != '\0';
    case HPD_MSG_IDS: return *AT_C(msg, f->aux, uint32_t) != 0;
    case HPD_MSG_BIN: return *AT_C(msg, f->aux, uint32_t) != 0;
    case HPD_MSG_OBJ:
    case HPD_MSG_ARR:
        return *AT_C(msg, f->offset, const msgpack_object *) != NULL ||
               *AT_C(msg, f->aux, const void *) != NULL;
    case HPD_MSG_LAYOUT: return true;
    }
    return false;
}

/* Whether a field is packed: required ones, set ones, and with `all` the
 * values (numbers, flags, strings, ids) even when zero. */
static bool packed(const hpd_msg_field_t *f, const void *msg, bool all)
{
    const bool value = f->kind != HPD_MSG_OBJ && f->kind != HPD_MSG_ARR && f->kind != HPD_MSG_BIN;
    if (f->required)
        return true;
    if ((f->kind == HPD_MSG_F32 && isnan(*AT_C(msg, f->offset, float))) ||
        (f->kind == HPD_MSG_U32 && *AT_C(msg, f->offset, uint32_t) > f->limit) ||
        (f->kind == HPD_MSG_U64 && *AT_C(msg, f->offset, uint64_t) > f->limit))
        return false; /* out of range: not given */
    return (all && value) || is_set(f, msg);
}

static void pack(const hpd_msg_desc_t *d, const void *msg, msgpack_packer *pk, bool all)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->n_fields; i++)
        n += packed(&d->fields[i], msg, all);
    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < d->n_fields; i++) {
        const hpd_msg_field_t *f = &d->fields[i];
        if (!packed(f, msg, all))
            continue;
        hpd_proto_key(pk, f->name);
        switch (f->kind) {
        case HPD_MSG_U64: msgpack_pack_uint64(pk, *AT_C(msg, f->offset, uint64_t)); break;
        case HPD_MSG_U32: msgpack_pack_uint32(pk, *AT_C(msg, f->offset, uint32_t)); break;
        case HPD_MSG_BOOL:
            if (*AT_C(msg, f->offset, bool))
                msgpack_pack_true(pk);
            else
                msgpack_pack_false(pk);
            break;
        case HPD_MSG_F32: msgpack_pack_float(pk, *AT_C(msg, f->offset, float)); break;
        case HPD_MSG_STR: hpd_rpc_pack_str(pk, AT_C(msg, f->offset, char)); break;
        case HPD_MSG_IDS:
            hpd_proto_pack_ids(pk, *AT_C(msg, f->offset, const int32_t *),
                               *AT_C(msg, f->aux, uint32_t));
            break;
        case HPD_MSG_BIN:
            hpd_proto_pack_bin(pk, *AT_C(msg, f->offset, const void *),
                               *AT_C(msg, f->aux, uint32_t));
            break;
        case HPD_MSG_OBJ:
        case HPD_MSG_ARR: {
            const msgpack_object *o = *AT_C(msg, f->offset, const msgpack_object *);
            const void *raw = *AT_C(msg, f->aux, const void *);
            const uint32_t raw_len = *AT_C(msg, f->aux2, uint32_t);
            if (raw != NULL)
                pk->callback(pk->data, raw, raw_len);
            else if (o != NULL)
                msgpack_pack_object(pk, *o);
            else
                msgpack_pack_nil(pk);
            break;
        }
        case HPD_MSG_LAYOUT: hpd_proto_pack_layout(pk, AT_C(msg, f->offset, hpd_kv_layout_t)); break;
        }
    }
}

void hpd_msg_pack(const hpd_msg_desc_t *d, const void *msg, msgpack_packer *pk)
{
    pack(d, msg, pk, false);
}

void hpd_msg_pack_all(const hpd_msg_desc_t *d, const void *msg, msgpack_packer *pk)
{
    pack(d, msg, pk, true);
}

static bool unpack_field(const hpd_msg_field_t *f, const msgpack_object *obj, void *msg,
                         hpd_proto_err_t *err)
{
    switch (f->kind) {
    case HPD_MSG_U64:
        return hpd_proto_u64(obj, f->name, f->required, f->limit, AT(msg, f->offset, uint64_t),
                             err);
    case HPD_MSG_U32:
        return hpd_proto_u32(obj, f->name, f->required, (uint32_t)f->limit,
                             AT(msg, f->offset, uint32_t), err);
    case HPD_MSG_BOOL:
        return hpd_proto_bool(obj, f->name, f->required, AT(msg, f->offset, bool), err);
    case HPD_MSG_F32:
        return hpd_proto_float(obj, f->name, f->required, AT(msg, f->offset, float), err);
    case HPD_MSG_STR:
        return hpd_proto_str(obj, f->name, f->required, AT(msg, f->offset, char),
                             (size_t)f->limit, err);
    case HPD_MSG_IDS: {
        int32_t *ids = NULL;
        uint32_t n = 0;
        if (!hpd_proto_ids(obj, f->name, f->required, (uint32_t)f->limit, &ids, &n, err))
            return false;
        if (hpd_rpc_map_get(obj, f->name) != NULL) {
            *AT(msg, f->offset, const int32_t *) = ids;
            *AT(msg, f->aux, uint32_t) = n;
        }
        return true;
    }
    case HPD_MSG_BIN:
        return hpd_proto_bin(obj, f->name, f->required, AT(msg, f->offset, const void *),
                             AT(msg, f->aux, uint32_t), err);
    case HPD_MSG_OBJ: {
        const msgpack_object *m = hpd_proto_map(obj, f->name, f->required, err);
        if (m == NULL && (f->required || hpd_rpc_map_get(obj, f->name) != NULL))
            return false;
        if (m != NULL)
            *AT(msg, f->offset, const msgpack_object *) = m;
        return true;
    }
    case HPD_MSG_LAYOUT:
        return hpd_proto_layout(obj, f->name, AT(msg, f->offset, hpd_kv_layout_t), err);
    case HPD_MSG_ARR: {
        const msgpack_object *a = hpd_rpc_map_get(obj, f->name);
        if (a == NULL && f->required) {
            snprintf(err->text, sizeof(err->text), "field '%s' is missing", f->name);
            return false;
        }
        if (a != NULL && a->type != MSGPACK_OBJECT_ARRAY) {
            snprintf(err->text, sizeof(err->text), "field '%s' is not an array", f->name);
            return false;
        }
        if (a != NULL)
            *AT(msg, f->offset, const msgpack_object *) = a;
        return true;
    }
    }
    return false;
}

bool hpd_msg_unpack(const hpd_msg_desc_t *d, const msgpack_object *obj, void *msg,
                    hpd_proto_err_t *err)
{
    hpd_proto_err_t e = {{0}};
    if (obj == NULL || obj->type != MSGPACK_OBJECT_MAP) {
        snprintf(err->text, sizeof(err->text), "%s: not a map", d->name);
        return false;
    }
    for (uint32_t i = 0; i < d->n_fields; i++)
        if (!unpack_field(&d->fields[i], obj, msg, &e)) {
            hpd_msg_free(d, msg);
            snprintf(err->text, sizeof(err->text), "%s: %s", d->name, e.text);
            return false;
        }
    return true;
}

void hpd_msg_free(const hpd_msg_desc_t *d, void *msg)
{
    for (uint32_t i = 0; i < d->n_fields; i++)
        if (d->fields[i].kind == HPD_MSG_IDS) {
            free((void *)*AT(msg, d->fields[i].offset, const int32_t *));
            *AT(msg, d->fields[i].offset, const int32_t *) = NULL;
            *AT(msg, d->fields[i].aux, uint32_t) = 0;
        }
}

bool hpd_msg_ids_below(const int32_t *ids, uint32_t n, uint32_t vocab, const char *what,
                       hpd_proto_err_t *err)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) {
            snprintf(err->text, sizeof(err->text), "%s[%u] is %d (expected a token id from 0 "
                     "to %u)", what, i, ids[i], vocab - 1);
            return false;
        }
    return true;
}
