/* Reading and writing the cluster's msgpack messages (docs/cluster.md):
 * typed field access with errors that name the field and what was expected,
 * and packers for the shared shapes (token ids, sampling, KV layout). */
#ifndef HPD_NODE_PROTO_H
#define HPD_NODE_PROTO_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/kv_layout.h"
#include "common/sampling.h"

/* An error message under construction, sent back as the error's text. */
typedef struct {
    char text[256];
} hpd_proto_err_t;

/* Field readers: false (with err filled) when a required field is missing
 * or any field has the wrong type or range; an absent optional field leaves
 * *value unchanged. */
bool hpd_proto_u64(const msgpack_object *map, const char *key, bool required, uint64_t max,
                   uint64_t *value, hpd_proto_err_t *err);
bool hpd_proto_u32(const msgpack_object *map, const char *key, bool required, uint32_t max,
                   uint32_t *value, hpd_proto_err_t *err);
bool hpd_proto_float(const msgpack_object *map, const char *key, bool required, float *value,
                     hpd_proto_err_t *err);
bool hpd_proto_bool(const msgpack_object *map, const char *key, bool required, bool *value,
                    hpd_proto_err_t *err);
/* Copies a string (NUL-terminated, truncated to cap - 1 is an error). */
bool hpd_proto_str(const msgpack_object *map, const char *key, bool required, char *out,
                   size_t cap, hpd_proto_err_t *err);
/* A binary (or string) field; *data_p points into the message. */
bool hpd_proto_bin(const msgpack_object *map, const char *key, bool required,
                   const void **data_p, uint32_t *len_p, hpd_proto_err_t *err);
/* An array of token ids (non-negative, below limit) into a malloc'd array
 * (*ids_p NULL and *n_p 0 for an empty or absent optional array). */
bool hpd_proto_ids(const msgpack_object *map, const char *key, bool required, uint32_t limit,
                   int32_t **ids_p, uint32_t *n_p, hpd_proto_err_t *err);
/* An array of u32 into out[0..max) */
bool hpd_proto_u32s(const msgpack_object *obj, const char *what, uint32_t *out, uint32_t max,
                    uint32_t *n_p, hpd_proto_err_t *err);
/* A map field, NULL when absent (err set when required or not a map). */
const msgpack_object *hpd_proto_map(const msgpack_object *map, const char *key, bool required,
                                    hpd_proto_err_t *err);

/* {temperature, top_p, top_k, seed}: absent fields keep their value, a
 * given temperature must be finite and >= 0 and a given top_p in (0, 1]; the
 * packer leaves unset fields out (hpd_sampling_unset), so the node resolves
 * them from its model (hpd_sampling_resolve). */
bool hpd_proto_sampling(const msgpack_object *map, hpd_sampling_t *s, hpd_proto_err_t *err);
void hpd_proto_pack_sampling(msgpack_packer *pk, const hpd_sampling_t *s);

/* {block_size, pack_size, order: "nhd"|"hnd"}: the shape fields are left. */
bool hpd_proto_layout(const msgpack_object *map, const char *key, hpd_kv_layout_t *layout,
                      hpd_proto_err_t *err);
void hpd_proto_pack_layout(msgpack_packer *pk, const hpd_kv_layout_t *layout);

void hpd_proto_pack_ids(msgpack_packer *pk, const int32_t *ids, uint32_t n);
/* Packs a key string then leaves the value to the caller. */
void hpd_proto_key(msgpack_packer *pk, const char *key);
/* Packs a key and an unsigned integer (msgpack's smallest encoding). */
void hpd_proto_kv_u64(msgpack_packer *pk, const char *key, uint64_t value);
void hpd_proto_pack_bin(msgpack_packer *pk, const void *data, size_t len);

/* A node's shard map (register's shard_map: per rank its KV heads, GDN key
 * heads and value heads as [begin, end), six numbers a rank) at degree tp:
 * true when it is the one every node computes (model/shard.h: heads split
 * in tp even ranges; KV heads replicated in groups, rank r holding head
 * r * kv / tp, when tp exceeds them), with the whole model's KV, key and
 * value heads in heads[3]; else false, err naming the rank and the range
 * expected. */
bool hpd_proto_shard_map(const int32_t *map, uint32_t n, uint32_t tp, uint32_t heads[3],
                         hpd_proto_err_t *err);

/* "host:port" into host (cap bytes) and port. */
bool hpd_proto_parse_endpoint(const char *text, char *host, size_t cap, uint16_t *port);

/* A coordinator's address, one of a list (a leader and its standbys). */
typedef struct {
    char host[64];
    uint16_t port;
} hpd_endpoint_t;

/* "HOST:PORT" or "HOST:PORT,HOST:PORT,..." into out (at most cap of
 * them) and *n; false with why in err (naming the part that is none). */
bool hpd_proto_parse_endpoints(const char *text, hpd_endpoint_t *out, uint32_t cap,
                               uint32_t *n, char *err, size_t err_len);

#endif
