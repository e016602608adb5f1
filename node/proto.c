#include "node/proto.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rpc_codec.h"

static const char *type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "a positive integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "binary";
    default: return "an extension";
    }
}

static bool fail(hpd_proto_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(hpd_proto_err_t *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof(err->text), fmt, ap);
    va_end(ap);
    return false;
}

/* The field, NULL when absent; *ok false when absent but required. */
static const msgpack_object *field(const msgpack_object *map, const char *key, bool required,
                                   bool *ok, hpd_proto_err_t *err)
{
    const msgpack_object *v;
    *ok = true;
    if (map == NULL || map->type != MSGPACK_OBJECT_MAP) {
        *ok = fail(err, "params are %s (expected a map)", map ? type_name(map->type) : "missing");
        return NULL;
    }
    v = hpd_rpc_map_get(map, key);
    if (v == NULL && required)
        *ok = fail(err, "field '%s' is missing", key);
    return v;
}

bool hpd_proto_u64(const msgpack_object *map, const char *key, bool required, uint64_t max,
                   uint64_t *value, hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    if (v == NULL)
        return ok;
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return fail(err, "field '%s' is %s (expected an integer from 0 to %llu)", key,
                    type_name(v->type), (unsigned long long)max);
    if (v->via.u64 > max)
        return fail(err, "field '%s' is %llu (expected at most %llu)", key,
                    (unsigned long long)v->via.u64, (unsigned long long)max);
    *value = v->via.u64;
    return true;
}

bool hpd_proto_u32(const msgpack_object *map, const char *key, bool required, uint32_t max,
                   uint32_t *value, hpd_proto_err_t *err)
{
    uint64_t v = *value;
    if (!hpd_proto_u64(map, key, required, max, &v, err))
        return false;
    *value = (uint32_t)v;
    return true;
}

bool hpd_proto_float(const msgpack_object *map, const char *key, bool required, float *value,
                     hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    if (v == NULL)
        return ok;
    if (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64)
        *value = (float)v->via.f64;
    else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        *value = (float)v->via.u64;
    else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *value = (float)v->via.i64;
    else
        return fail(err, "field '%s' is %s (expected a number)", key, type_name(v->type));
    if (!isfinite(*value))
        return fail(err, "field '%s' is not a finite number", key);
    return true;
}

bool hpd_proto_bool(const msgpack_object *map, const char *key, bool required, bool *value,
                    hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    if (v == NULL)
        return ok;
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return fail(err, "field '%s' is %s (expected a boolean)", key, type_name(v->type));
    *value = v->via.boolean;
    return true;
}

bool hpd_proto_str(const msgpack_object *map, const char *key, bool required, char *out,
                   size_t cap, hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    if (v == NULL)
        return ok;
    if (v->type != MSGPACK_OBJECT_STR)
        return fail(err, "field '%s' is %s (expected a string)", key, type_name(v->type));
    if (v->via.str.size >= cap)
        return fail(err, "field '%s' is %u bytes long (expected fewer than %zu)", key,
                    v->via.str.size, cap);
    memcpy(out, v->via.str.ptr, v->via.str.size);
    out[v->via.str.size] = '\0';
    return true;
}

bool hpd_proto_bin(const msgpack_object *map, const char *key, bool required,
                   const void **data_p, uint32_t *len_p, hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    if (v == NULL)
        return ok;
    if (v->type == MSGPACK_OBJECT_BIN) {
        *data_p = v->via.bin.ptr;
        *len_p = v->via.bin.size;
    } else if (v->type == MSGPACK_OBJECT_STR) {
        *data_p = v->via.str.ptr;
        *len_p = v->via.str.size;
    } else {
        return fail(err, "field '%s' is %s (expected binary)", key, type_name(v->type));
    }
    return true;
}

bool hpd_proto_ids(const msgpack_object *map, const char *key, bool required, uint32_t limit,
                   int32_t **ids_p, uint32_t *n_p, hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    int32_t *ids;
    if (v == NULL) {
        if (ok) {
            *ids_p = NULL;
            *n_p = 0;
        }
        return ok;
    }
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return fail(err, "field '%s' is %s (expected an array of token ids)", key,
                    type_name(v->type));
    if (v->via.array.size == 0) {
        *ids_p = NULL;
        *n_p = 0;
        return true;
    }
    if ((ids = malloc(v->via.array.size * sizeof(int32_t))) == NULL)
        return fail(err, "out of memory for %u token ids", v->via.array.size);
    for (uint32_t i = 0; i < v->via.array.size; i++) {
        const msgpack_object *e = &v->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 >= limit) {
            if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER || e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
                fail(err, "%s[%u] is %lld (expected a token id from 0 to %u)", key, i,
                     e->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (long long)e->via.u64
                                                                : (long long)e->via.i64,
                     limit - 1);
            else
                fail(err, "%s[%u] is %s (expected a token id from 0 to %u)", key, i,
                     type_name(e->type), limit - 1);
            free(ids);
            return false;
        }
        ids[i] = (int32_t)e->via.u64;
    }
    *ids_p = ids;
    *n_p = v->via.array.size;
    return true;
}

bool hpd_proto_u32s(const msgpack_object *v, const char *what, uint32_t *out, uint32_t max,
                    uint32_t *n_p, hpd_proto_err_t *err)
{
    if (v == NULL || v->type != MSGPACK_OBJECT_ARRAY)
        return fail(err, "%s is %s (expected an array)", what, v ? type_name(v->type) : "missing");
    if (v->via.array.size > max)
        return fail(err, "%s has %u elements (expected at most %u)", what, v->via.array.size, max);
    for (uint32_t i = 0; i < v->via.array.size; i++) {
        const msgpack_object *e = &v->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > UINT32_MAX)
            return fail(err, "%s[%u] is %s (expected a 32-bit unsigned integer)", what, i,
                        type_name(e->type));
        out[i] = (uint32_t)e->via.u64;
    }
    *n_p = v->via.array.size;
    return true;
}

const msgpack_object *hpd_proto_map(const msgpack_object *map, const char *key, bool required,
                                    hpd_proto_err_t *err)
{
    bool ok;
    const msgpack_object *v = field(map, key, required, &ok, err);
    if (v != NULL && v->type != MSGPACK_OBJECT_MAP) {
        fail(err, "field '%s' is %s (expected a map)", key, type_name(v->type));
        return NULL;
    }
    return v;
}

bool hpd_proto_sampling(const msgpack_object *map, hpd_sampling_t *s, hpd_proto_err_t *err)
{
    if (!hpd_proto_float(map, "temperature", false, &s->temperature, err) ||
        !hpd_proto_float(map, "top_p", false, &s->top_p, err) ||
        !hpd_proto_u32(map, "top_k", false, UINT32_MAX, &s->top_k, err) ||
        !hpd_proto_u64(map, "seed", false, UINT64_MAX, &s->seed, err))
        return false;
    /* what is given must be usable: refused here, naming the value, not
     * by the engine after the job was taken */
    if (hpd_rpc_map_get(map, "temperature") != NULL && !(s->temperature >= 0))
        return fail(err, "field 'temperature' is %g (expected a number >= 0; 0 is greedy)",
                    (double)s->temperature);
    if (hpd_rpc_map_get(map, "top_p") != NULL && !(s->top_p > 0 && s->top_p <= 1))
        return fail(err, "field 'top_p' is %g (expected a number in (0, 1])", (double)s->top_p);
    return true;
}

void hpd_proto_key(msgpack_packer *pk, const char *key)
{
    hpd_rpc_pack_str(pk, key);
}

void hpd_proto_kv_u64(msgpack_packer *pk, const char *key, uint64_t value)
{
    hpd_rpc_pack_str(pk, key);
    msgpack_pack_uint64(pk, value);
}

void hpd_proto_pack_sampling(msgpack_packer *pk, const hpd_sampling_t *s)
{
    const bool t = !isnan(s->temperature), p = !isnan(s->top_p), k = s->top_k != HPD_TOP_K_UNSET;
    msgpack_pack_map(pk, 1 + t + p + k);
    if (t) {
        hpd_proto_key(pk, "temperature");
        msgpack_pack_float(pk, s->temperature);
    }
    if (p) {
        hpd_proto_key(pk, "top_p");
        msgpack_pack_float(pk, s->top_p);
    }
    if (k) {
        hpd_proto_key(pk, "top_k");
        msgpack_pack_uint32(pk, s->top_k);
    }
    hpd_proto_key(pk, "seed");
    msgpack_pack_uint64(pk, s->seed);
}

bool hpd_proto_layout(const msgpack_object *map, const char *key, hpd_kv_layout_t *l,
                      hpd_proto_err_t *err)
{
    char order[8];
    const msgpack_object *m = hpd_proto_map(map, key, true, err);
    if (m == NULL)
        return false;
    if (!hpd_proto_u32(m, "block_size", true, 1u << 16, &l->block_size, err) ||
        !hpd_proto_u32(m, "pack_size", true, 1u << 10, &l->pack_size, err) ||
        !hpd_proto_str(m, "order", true, order, sizeof(order), err))
        return false;
    if (strcmp(order, "nhd") == 0)
        l->order = HPD_KV_NHD;
    else if (strcmp(order, "hnd") == 0)
        l->order = HPD_KV_HND;
    else
        return fail(err, "%s.order is '%s' (expected nhd or hnd)", key, order);
    if (l->block_size == 0 || l->block_size % 16 != 0 || l->pack_size == 0)
        return fail(err, "%s is B=%u, P=%u (expected B a multiple of 16 and P >= 1)", key,
                    l->block_size, l->pack_size);
    return true;
}

void hpd_proto_pack_layout(msgpack_packer *pk, const hpd_kv_layout_t *l)
{
    msgpack_pack_map(pk, 3);
    hpd_proto_key(pk, "block_size");
    msgpack_pack_uint32(pk, l->block_size);
    hpd_proto_key(pk, "pack_size");
    msgpack_pack_uint32(pk, l->pack_size);
    hpd_proto_key(pk, "order");
    hpd_rpc_pack_str(pk, l->order == HPD_KV_HND ? "hnd" : "nhd");
}

void hpd_proto_pack_ids(msgpack_packer *pk, const int32_t *ids, uint32_t n)
{
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_int32(pk, ids[i]);
}

void hpd_proto_pack_bin(msgpack_packer *pk, const void *data, size_t len)
{
    msgpack_pack_bin(pk, len);
    msgpack_pack_bin_body(pk, data, len);
}

bool hpd_proto_parse_endpoint(const char *text, char *host, size_t cap, uint16_t *port)
{
    const char *colon = strrchr(text, ':');
    char *end;
    unsigned long p;
    if (colon == NULL || (size_t)(colon - text) >= cap || colon == text)
        return false;
    p = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || end == colon + 1 || p > 65535)
        return false;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    *port = (uint16_t)p;
    return true;
}

bool hpd_proto_parse_endpoints(const char *text, hpd_endpoint_t *out, uint32_t cap,
                               uint32_t *n, char *err, size_t err_len)
{
    char one[128];
    *n = 0;
    for (const char *p = text; *p != '\0';) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (*n == cap || len >= sizeof(one)) {
            snprintf(err, err_len, "expected at most %u coordinators, HOST:PORT each", cap);
            return false;
        }
        memcpy(one, p, len);
        one[len] = '\0';
        if (!hpd_proto_parse_endpoint(one, out[*n].host, sizeof(out[*n].host), &out[*n].port)) {
            if (strchr(text, ',') == NULL)
                snprintf(err, err_len, "expected HOST:PORT");
            else
                snprintf(err, err_len, "expected HOST:PORT,HOST:PORT,...: '%s' is none", one);
            return false;
        }
        (*n)++;
        p += len + (comma != NULL);
    }
    if (*n == 0) {
        snprintf(err, err_len, "expected HOST:PORT");
        return false;
    }
    return true;
}

bool hpd_proto_shard_map(const int32_t *map, uint32_t n, uint32_t tp, uint32_t heads[3],
                         hpd_proto_err_t *err)
{
    static const char *const what[3] = {"KV heads", "GDN key heads", "GDN value heads"};
    if (tp < 1 || n != 6 * tp) {
        snprintf(err->text, sizeof(err->text), "shard_map has %u numbers (expected 6 a rank, "
                 "%u at tp %u)", n, 6 * tp, tp);
        return false;
    }
    for (uint32_t k = 0; k < 3; k++) {
        const uint32_t total = (uint32_t)map[6 * (tp - 1) + 2 * k + 1]; /* the last rank's end */
        heads[k] = total;
        for (uint32_t r = 0; r < tp; r++) {
            /* even ranges; KV heads fewer than the ranks: one each, in groups */
            const bool replicated = k == 0 && tp > total && total > 0;
            uint32_t b = (uint32_t)((uint64_t)r * total / tp);
            uint32_t e = replicated ? b + 1 : (uint32_t)((uint64_t)(r + 1) * total / tp);
            const bool divides = replicated ? tp % total == 0 : total % tp == 0;
            if (!divides || (uint32_t)map[6 * r + 2 * k] != b ||
                (uint32_t)map[6 * r + 2 * k + 1] != e) {
                snprintf(err->text, sizeof(err->text), "shard_map: rank %u's %s are [%d, %d) "
                         "(expected [%u, %u) of %u at tp %u%s)", r, what[k], map[6 * r + 2 * k],
                         map[6 * r + 2 * k + 1], b, e, total, tp,
                         divides ? "" : ", which does not divide them");
                return false;
            }
        }
    }
    return true;
}
