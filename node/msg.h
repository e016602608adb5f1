/* The cluster's messages as C structs (docs/cluster.md, "Messages").
 *
 * Each message is one field list, an X-macro: X(T, name, kind, required,
 * limit). From it come the struct (HPD_MSG_STRUCT), and a descriptor table
 * (HPD_MSG_DESC) that one generic packer and one generic unpacker read:
 * nobody counts map entries by hand, and a field added to the list is
 * packed, checked and fuzzed with the others.
 *
 * Kinds and their C members:
 *   U64, U32  uint64_t / uint32_t name; limit: the largest value allowed
 *   BOOL      bool name
 *   F32       float name
 *   STR       char name[limit] (NUL-terminated; longer is an error)
 *   IDS       const int32_t *name; uint32_t name_n (token ids below limit;
 *             unpacked into malloc'd memory: hpd_msg_free)
 *   BIN       const void *name; uint32_t name_len (points into the message)
 *   OBJ       const msgpack_object *name (a map, passed on as it is, e.g.
 *             a UCX info the coordinator relays without knowing it); for
 *             packing, const void *name_raw and uint32_t name_raw_len, when
 *             set, are written as they are instead (one packed map)
 *   ARR       as OBJ, an array (its elements are the reader's business)
 *   LAYOUT    hpd_kv_layout_t name ({block_size, pack_size, order}; the
 *             shape fields are left as they were)
 *
 * Packing: required fields always; an optional one only when it is set
 * (non-zero, true, non-empty, non-NULL) and never an optional number out
 * of its field's range (a NaN F32, an integer above the limit): such a
 * value means "not given" (a request's unset sampling fields). Unpacking: the message must be a
 * map; a required field must be there; every field present must have its
 * kind and range; an absent optional field keeps the value the caller put
 * there (its default); keys the list does not name are ignored, so that a
 * newer peer's extra fields do not break an older one in a rolling
 * upgrade. Errors name the message, the field and what was expected. */
#ifndef HPD_NODE_MSG_H
#define HPD_NODE_MSG_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/logprobs.h"

#include "node/proto.h"

typedef enum {
    HPD_MSG_U64,
    HPD_MSG_U32,
    HPD_MSG_BOOL,
    HPD_MSG_F32,
    HPD_MSG_STR,
    HPD_MSG_IDS,
    HPD_MSG_BIN,
    HPD_MSG_OBJ,
    HPD_MSG_LAYOUT,
    HPD_MSG_ARR,
} hpd_msg_kind_t;

typedef struct {
    const char *name;
    hpd_msg_kind_t kind;
    bool required;
    uint64_t limit;
    size_t offset; /* of the member */
    size_t aux;    /* IDS, BIN: of the count member; OBJ: of name_raw */
    size_t aux2;   /* OBJ: of name_raw_len */
} hpd_msg_field_t;

typedef struct {
    const char *name;
    const hpd_msg_field_t *fields;
    uint32_t n_fields;
} hpd_msg_desc_t;

/* ---- generation */

#define HPD_MSG_DECL_U64(name, limit) uint64_t name;
#define HPD_MSG_DECL_U32(name, limit) uint32_t name;
#define HPD_MSG_DECL_BOOL(name, limit) bool name;
#define HPD_MSG_DECL_F32(name, limit) float name;
#define HPD_MSG_DECL_STR(name, limit) char name[limit];
#define HPD_MSG_DECL_IDS(name, limit) const int32_t *name; uint32_t name##_n;
#define HPD_MSG_DECL_BIN(name, limit) const void *name; uint32_t name##_len;
#define HPD_MSG_DECL_OBJ(name, limit)                                                        \
    const msgpack_object *name;                                                             \
    const void *name##_raw;                                                                 \
    uint32_t name##_raw_len;
#define HPD_MSG_DECL_LAYOUT(name, limit) hpd_kv_layout_t name;
#define HPD_MSG_DECL_ARR(name, limit) HPD_MSG_DECL_OBJ(name, limit)
#define HPD_MSG_MEMBER(T, name, kind, req, limit) HPD_MSG_DECL_##kind(name, limit)

#define HPD_MSG_AUX_U64(T, name) 0
#define HPD_MSG_AUX_U32(T, name) 0
#define HPD_MSG_AUX_BOOL(T, name) 0
#define HPD_MSG_AUX_F32(T, name) 0
#define HPD_MSG_AUX_STR(T, name) 0
#define HPD_MSG_AUX_IDS(T, name) offsetof(T, name##_n)
#define HPD_MSG_AUX_BIN(T, name) offsetof(T, name##_len)
#define HPD_MSG_AUX_OBJ(T, name) offsetof(T, name##_raw)
#define HPD_MSG_AUX_LAYOUT(T, name) 0
#define HPD_MSG_AUX_ARR(T, name) offsetof(T, name##_raw)
#define HPD_MSG_AUX2_ARR(T, name) offsetof(T, name##_raw_len)
#define HPD_MSG_AUX2_OBJ(T, name) offsetof(T, name##_raw_len)
#define HPD_MSG_AUX2_U64(T, name) 0
#define HPD_MSG_AUX2_U32(T, name) 0
#define HPD_MSG_AUX2_BOOL(T, name) 0
#define HPD_MSG_AUX2_F32(T, name) 0
#define HPD_MSG_AUX2_STR(T, name) 0
#define HPD_MSG_AUX2_IDS(T, name) 0
#define HPD_MSG_AUX2_BIN(T, name) 0
#define HPD_MSG_AUX2_LAYOUT(T, name) 0
#define HPD_MSG_ENTRY(T, n_, k_, req_, lim_)                                                 \
    {.name = #n_, .kind = HPD_MSG_##k_, .required = (req_), .limit = (lim_),                 \
     .offset = offsetof(T, n_), .aux = HPD_MSG_AUX_##k_(T, n_),                             \
     .aux2 = HPD_MSG_AUX2_##k_(T, n_)},

/* typedef struct { ...members... } T; */
#define HPD_MSG_STRUCT(T, LIST) typedef struct { LIST(T, HPD_MSG_MEMBER) } T;
/* const hpd_msg_desc_t var = {.name = "wire name", .fields = ..., .n_fields = n}; */
#define HPD_MSG_DESC(var, wire, T, LIST)                                                           \
    static const hpd_msg_field_t var##_fields[] = {LIST(T, HPD_MSG_ENTRY)};                        \
    const hpd_msg_desc_t var = {.name = wire,                                                      \
                                .fields = var##_fields,                                            \
                                .n_fields = sizeof(var##_fields) / sizeof(var##_fields[0])};

/* ---- the messages (docs/cluster.md has their meaning) */

#define HPD_REQ 1
#define HPD_OPT 0

/* register (a node -> the coordinator). tp: its tensor-parallel degree
 * (1 when absent); shard_map: per rank its KV heads, GDN key heads and
 * value heads as [begin, end) of the whole model's, six numbers a rank
 * (model/shard.h), which the coordinator checks against the cluster's */
#define HPD_MSG_REGISTER(T, X)                                                              \
    X(T, role, STR, HPD_REQ, 16)                                                             \
    X(T, name, STR, HPD_REQ, 64)                                                             \
    X(T, host, STR, HPD_REQ, 64)                                                             \
    X(T, port, U32, HPD_REQ, 65535)                                                          \
    X(T, fingerprint, BIN, HPD_REQ, 0)                                                       \
    X(T, vocab, U32, HPD_REQ, UINT32_MAX)                                                    \
    X(T, max_context, U32, HPD_REQ, UINT32_MAX)                                              \
    X(T, layout, LAYOUT, HPD_REQ, 0)                                                         \
    X(T, kv_layers, U32, HPD_REQ, 4096)                                                      \
    X(T, pages, U32, HPD_REQ, UINT32_MAX)                                                    \
    X(T, slots, U32, HPD_REQ, UINT32_MAX)                                                    \
    X(T, max_batch, U32, HPD_REQ, UINT32_MAX)                                                \
    X(T, xfer, OBJ, HPD_REQ, 0)                                                              \
    X(T, numerics, STR, HPD_OPT, 32)                                                         \
    X(T, incarnation, U64, HPD_OPT, UINT64_MAX)                                              \
    X(T, tp, U32, HPD_OPT, 8)                                                                \
    X(T, shard_map, IDS, HPD_OPT, 65536)
HPD_MSG_STRUCT(hpd_msg_register_t, HPD_MSG_REGISTER)

/* reserve's reply: where a prefill node writes on the decode node (its
 * pages per pack group for the prompt, its GDN slot); the coordinator
 * relays it to the prefill node as it is, inside destination. A decode
 * node at tensor parallelism (tp > 1) names every rank's page and slot
 * regions (kv_regions, slot_regions: tp each; kv_region and slot_region
 * are rank 0's), the page ids and slot offset being every rank's; kv_heads
 * and state_bytes are a rank's KV heads and GDN layer state, which the
 * prefill node checks against its own shard map */
#define HPD_MSG_RESERVATION(T, X)                                                           \
    X(T, layout, LAYOUT, HPD_REQ, 0)                                                         \
    X(T, tables, ARR, HPD_REQ, 0)                                                            \
    X(T, slot_offset, U64, HPD_REQ, UINT64_MAX)                                              \
    X(T, kv_region, U32, HPD_REQ, 15)                                                        \
    X(T, slot_region, U32, HPD_REQ, 15)                                                      \
    X(T, tp, U32, HPD_OPT, 8)                                                                \
    X(T, kv_regions, IDS, HPD_OPT, 64)                                                       \
    X(T, slot_regions, IDS, HPD_OPT, 64)                                                     \
    X(T, kv_heads, U32, HPD_OPT, 65536)                                                      \
    X(T, state_bytes, U64, HPD_OPT, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_reservation_t, HPD_MSG_RESERVATION)

/* a prefill job's destination: the decode node, its UCX info (from its
 * registration) and its reservation (from its reserve reply) */
#define HPD_MSG_DESTINATION(T, X)                                                           \
    X(T, node, U64, HPD_REQ, UINT64_MAX)                                                     \
    X(T, xfer, OBJ, HPD_REQ, 0)                                                              \
    X(T, reservation, OBJ, HPD_REQ, 0)
HPD_MSG_STRUCT(hpd_msg_destination_t, HPD_MSG_DESTINATION)

/* prefill (the coordinator -> a prefill node) */
#define HPD_MSG_PREFILL_JOB(T, X)                                                           \
    X(T, job, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, request, U64, HPD_OPT, UINT64_MAX)                                                  \
    X(T, prompt, IDS, HPD_REQ, INT32_MAX)                                                    \
    X(T, sampling, OBJ, HPD_OPT, 0)                                                          \
    X(T, decode, OBJ, HPD_REQ, 0)                                                            \
    X(T, logprobs, BOOL, HPD_OPT, 0)                                                         \
    X(T, top_logprobs, U32, HPD_OPT, HPD_MAX_TOP_LOGPROBS)                                   \
    X(T, prompt_logprobs, BOOL, HPD_OPT, 0)                                                  \
    X(T, grammar, BIN, HPD_OPT, 0)                                                           \
    X(T, n, U32, HPD_OPT, HPD_MAX_CHOICES)
HPD_MSG_STRUCT(hpd_msg_prefill_job_t, HPD_MSG_PREFILL_JOB)

/* a node's stats map: the stats method's reply, and its heartbeat's
 * params (with prefix_summary on prefill nodes with a prefix cache) */
#define HPD_MSG_STATS(T, X)                                                                 \
    X(T, node_id, U64, HPD_REQ, UINT64_MAX)                                                  \
    X(T, draining, BOOL, HPD_REQ, 0)                                                         \
    X(T, role, STR, HPD_REQ, 16)                                                             \
    X(T, name, STR, HPD_REQ, 64)                                                             \
    X(T, uptime_s, F32, HPD_REQ, 0)                                                          \
    X(T, pages_used, U32, HPD_REQ, UINT32_MAX)                                               \
    X(T, pages_total, U32, HPD_REQ, UINT32_MAX)                                              \
    X(T, slots_used, U32, HPD_REQ, UINT32_MAX)                                               \
    X(T, slots_total, U32, HPD_REQ, UINT32_MAX)                                              \
    X(T, cache_pages, U32, HPD_REQ, UINT32_MAX)                                              \
    X(T, audit_errors, U64, HPD_REQ, UINT64_MAX)                                             \
    X(T, engine, OBJ, HPD_REQ, 0)                                                            \
    X(T, cache, OBJ, HPD_REQ, 0)                                                             \
    X(T, xfer, OBJ, HPD_REQ, 0)                                                              \
    X(T, load, OBJ, HPD_REQ, 0)                                                              \
    X(T, prefix_summary, BIN, HPD_OPT, 0)
HPD_MSG_STRUCT(hpd_msg_stats_t, HPD_MSG_STATS)

#define HPD_MSG_ENGINE_STATS(T, X)                                                          \
    X(T, steps, U64, HPD_REQ, UINT64_MAX)                                                    \
    X(T, prefill_tokens, U64, HPD_REQ, UINT64_MAX)                                           \
    X(T, decode_tokens, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_engine_stats_t, HPD_MSG_ENGINE_STATS)

#define HPD_MSG_CACHE_STATS(T, X)                                                           \
    X(T, lookup_tokens, U64, HPD_REQ, UINT64_MAX)                                            \
    X(T, hit_tokens_device, U64, HPD_REQ, UINT64_MAX)                                        \
    X(T, hit_tokens_host, U64, HPD_REQ, UINT64_MAX)                                          \
    X(T, entries, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_cache_stats_t, HPD_MSG_CACHE_STATS)

#define HPD_MSG_XFER_STATS(T, X)                                                            \
    X(T, bytes_put, U64, HPD_REQ, UINT64_MAX)                                                \
    X(T, bytes_mapped, U64, HPD_REQ, UINT64_MAX)                                             \
    X(T, transfers_finished, U64, HPD_REQ, UINT64_MAX)                                       \
    X(T, transfers_failed, U64, HPD_REQ, UINT64_MAX)                                         \
    X(T, notices_ok, U64, HPD_REQ, UINT64_MAX)                                               \
    X(T, notices_bad, U64, HPD_REQ, UINT64_MAX)                                              \
    X(T, open_transfers, U32, HPD_REQ, UINT32_MAX)                                           \
    X(T, deadlines_missed, U64, HPD_REQ, UINT64_MAX)                                         \
    X(T, writers_closed, U64, HPD_REQ, UINT64_MAX)                                           \
    X(T, link_rate, F32, HPD_OPT, 0)
HPD_MSG_STRUCT(hpd_msg_xfer_stats_t, HPD_MSG_XFER_STATS)

/* a prefill node's load, in its heartbeats and stats */
#define HPD_MSG_PREFILL_LOAD(T, X)                                                          \
    X(T, jobs_queued, U32, HPD_REQ, UINT32_MAX)                                              \
    X(T, jobs_running, U32, HPD_REQ, UINT32_MAX)                                             \
    X(T, jobs_finishing, U32, HPD_REQ, UINT32_MAX)                                           \
    X(T, queued_tokens, U64, HPD_REQ, UINT64_MAX)                                            \
    X(T, jobs_done, U64, HPD_REQ, UINT64_MAX)                                                \
    X(T, jobs_failed, U64, HPD_REQ, UINT64_MAX)                                              \
    X(T, jobs_canceled, U64, HPD_REQ, UINT64_MAX)                                            \
    X(T, lease_refusals, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_prefill_load_t, HPD_MSG_PREFILL_LOAD)

/* a decode node's load, in its heartbeats and stats (docs/cluster.md,
 * "The stats map") */
#define HPD_MSG_DECODE_LOAD(T, X)                                                           \
    X(T, reserved, U32, HPD_REQ, UINT32_MAX)                                                 \
    X(T, fenced, U32, HPD_REQ, UINT32_MAX)                                                   \
    X(T, fence_backstops, U64, HPD_REQ, UINT64_MAX)                                          \
    X(T, writers_fenced, U64, HPD_REQ, UINT64_MAX)                                           \
    X(T, running, U32, HPD_REQ, UINT32_MAX)                                                  \
    X(T, started, U64, HPD_REQ, UINT64_MAX)                                                  \
    X(T, finished, U64, HPD_REQ, UINT64_MAX)                                                 \
    X(T, failed, U64, HPD_REQ, UINT64_MAX)                                                   \
    X(T, canceled, U64, HPD_REQ, UINT64_MAX)                                                 \
    X(T, expired, U64, HPD_REQ, UINT64_MAX)                                                  \
    X(T, bad_transfers, U64, HPD_REQ, UINT64_MAX)                                            \
    X(T, foreign_writes, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_decode_load_t, HPD_MSG_DECODE_LOAD)

/* register's reply */
#define HPD_MSG_REGISTERED(T, X)                                                            \
    X(T, node_id, U64, HPD_REQ, UINT64_MAX)                                                  \
    X(T, heartbeat_ms, U32, HPD_OPT, 60000)                                                  \
    X(T, lease_ms, U32, HPD_OPT, UINT32_MAX)                                                 \
    X(T, alive_ms, U32, HPD_OPT, 60000)                                                      \
    X(T, alive_key, U64, HPD_OPT, UINT64_MAX)                                                \
    X(T, alive_lease_ms, U32, HPD_OPT, 600000)
HPD_MSG_STRUCT(hpd_msg_registered_t, HPD_MSG_REGISTERED)

/* alive: a liveness ping (node/liveness.h) */
#define HPD_MSG_ALIVE(T, X)                                                                 \
    X(T, node_id, U64, HPD_REQ, UINT64_MAX)                                                  \
    X(T, key, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_alive_t, HPD_MSG_ALIVE)

/* tokens: a decode node's notification of a job's tokens, its end, or why
 * it failed; logprobs (a job that asked): the ids' log probabilities in
 * common/logprobs.h's wire form, of the reserve's top_logprobs */
#define HPD_MSG_TOKENS(T, X)                                                                \
    X(T, job, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, index, U32, HPD_REQ, UINT32_MAX)                                                    \
    X(T, ids, IDS, HPD_REQ, INT32_MAX)                                                       \
    X(T, done, BOOL, HPD_REQ, 0)                                                             \
    X(T, error, STR, HPD_OPT, 160)                                                           \
    X(T, finish_reason, STR, HPD_OPT, 8)                                                     \
    X(T, logprobs, BIN, HPD_OPT, 0)                                                          \
    X(T, choice, U32, HPD_OPT, HPD_MAX_CHOICES - 1)                                          \
    X(T, prompt_logprobs, BIN, HPD_OPT, 0) /* scheduler -> door: with the first tokens */
HPD_MSG_STRUCT(hpd_msg_tokens_t, HPD_MSG_TOKENS)

/* cancel (coordinator -> a node: a job). To a decode node, writer names
 * the prefill node whose connection must be closed before the job's
 * memory is reused: it failed or was lost while it wrote there */
#define HPD_MSG_CANCEL_JOB(T, X)                                                            \
    X(T, job, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, writer, U64, HPD_OPT, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_cancel_job_t, HPD_MSG_CANCEL_JOB)

/* start (coordinator -> decode node: the prefill's first token) */
#define HPD_MSG_START(T, X)                                                                 \
    X(T, job, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, first_token, U32, HPD_REQ, INT32_MAX)                                               \
    X(T, first_tokens, IDS, HPD_OPT, INT32_MAX) /* n choices: each one's, in order */
HPD_MSG_STRUCT(hpd_msg_start_t, HPD_MSG_START)

/* the prefill call's reply; logprobs (a job that asked): the first
 * token's, in common/logprobs.h's wire form; prompt_logprobs: prompt
 * tokens 1 .. n - 1's */
#define HPD_MSG_PREFILLED(T, X)                                                             \
    X(T, first_token, U32, HPD_REQ, INT32_MAX)                                               \
    X(T, cached_tokens, U32, HPD_OPT, UINT32_MAX)                                            \
    X(T, queue_ms, F32, HPD_OPT, 0)                                                          \
    X(T, prefill_ms, F32, HPD_OPT, 0)                                                        \
    X(T, push_ms, F32, HPD_OPT, 0)                                                           \
    X(T, exposed_push_ms, F32, HPD_OPT, 0)                                                   \
    X(T, logprobs, BIN, HPD_OPT, 0)                                                          \
    X(T, prompt_logprobs, BIN, HPD_OPT, 0)                                                   \
    X(T, first_tokens, IDS, HPD_OPT, INT32_MAX) /* n choices: each one's, in order */
HPD_MSG_STRUCT(hpd_msg_prefilled_t, HPD_MSG_PREFILLED)

/* reserve (coordinator -> decode node): a slot and pages for a request;
 * replay: the tokens the client already has (after a failover); grammar:
 * a structured output (hpd_grammar_from_spec's JSON), the same as the
 * prefill job's */
#define HPD_MSG_RESERVE(T, X)                                                               \
    X(T, job, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, request, U64, HPD_OPT, UINT64_MAX)                                                  \
    X(T, prompt, IDS, HPD_REQ, INT32_MAX)                                                    \
    X(T, max_tokens, U32, HPD_REQ, UINT32_MAX)                                               \
    X(T, sampling, OBJ, HPD_OPT, 0)                                                          \
    X(T, replay, IDS, HPD_OPT, INT32_MAX)                                                    \
    X(T, stop_token_ids, IDS, HPD_OPT, INT32_MAX)                                            \
    X(T, ignore_eos, BOOL, HPD_OPT, 0)                                                       \
    X(T, min_tokens, U32, HPD_OPT, UINT32_MAX)                                               \
    X(T, logprobs, BOOL, HPD_OPT, 0)                                                         \
    X(T, top_logprobs, U32, HPD_OPT, HPD_MAX_TOP_LOGPROBS)                                   \
    X(T, grammar, BIN, HPD_OPT, 0)                                                           \
    X(T, n, U32, HPD_OPT, HPD_MAX_CHOICES)                                                   \
    X(T, door, STR, HPD_OPT, 72) /* "HOST:PORT": the front door the tokens go to */         \
    X(T, door_request, U64, HPD_OPT, UINT64_MAX) /* the door's id of the request */
HPD_MSG_STRUCT(hpd_msg_reserve_t, HPD_MSG_RESERVE)

/* ---- the client's messages (docs/protocol.md) */

/* generate (client -> coordinator); the sampling fields are at the top
 * level (hpd_sampling_t; absent: greedy); stop_token_ids, ignore_eos and
 * min_tokens as hpd_request_params_t's. The prompt is one of: token ids
 * (prompt), text (text) or a chat (messages: [{role, content,
 * reasoning_content?}], put in the model's chat format; thinking 0: the
 * model's default, 1 on, 2 off), the last two tokenized by the coordinator
 * (docs/api.md). detokenize: the tokens notifications and the reply carry
 * the text too; stop: stop strings (matched on that text). */
#define HPD_MSG_GENERATE(T, X)                                                              \
    X(T, prompt, IDS, HPD_OPT, INT32_MAX)                                                    \
    X(T, text, BIN, HPD_OPT, 0)                                                              \
    X(T, messages, ARR, HPD_OPT, 0)                                                          \
    X(T, thinking, U32, HPD_OPT, 2)                                                          \
    X(T, detokenize, BOOL, HPD_OPT, 0)                                                       \
    X(T, stop, ARR, HPD_OPT, 0)                                                              \
    X(T, max_tokens, U32, HPD_OPT, UINT32_MAX)                                               \
    X(T, temperature, F32, HPD_OPT, 0)                                                       \
    X(T, top_p, F32, HPD_OPT, 0)                                                             \
    X(T, top_k, U32, HPD_OPT, HPD_TOP_K_UNSET - 1)                                           \
    X(T, seed, U64, HPD_OPT, UINT64_MAX)                                                     \
    X(T, stream, BOOL, HPD_OPT, 0)                                                           \
    X(T, tag, U64, HPD_OPT, UINT64_MAX)                                                      \
    X(T, stop_token_ids, IDS, HPD_OPT, INT32_MAX)                                            \
    X(T, ignore_eos, BOOL, HPD_OPT, 0)                                                       \
    X(T, min_tokens, U32, HPD_OPT, UINT32_MAX)                                               \
    X(T, logprobs, BOOL, HPD_OPT, 0)                                                         \
    X(T, top_logprobs, U32, HPD_OPT, HPD_MAX_TOP_LOGPROBS)                                   \
    X(T, prompt_logprobs, BOOL, HPD_OPT, 0)                                                  \
    X(T, grammar, BIN, HPD_OPT, 0)                                                           \
    X(T, n, U32, HPD_OPT, UINT32_MAX)                                                        \
    X(T, tools, BIN, HPD_OPT, 0)            /* a chat's tools: OpenAI's JSON array, as text */ \
    X(T, tool_choice, BIN, HPD_OPT, 0)      /* OpenAI's tool_choice, as JSON text */        \
    X(T, single_tool_call, BOOL, HPD_OPT, 0) /* parallel_tool_calls false */
HPD_MSG_STRUCT(hpd_msg_generate_t, HPD_MSG_GENERATE)

/* generate's reply */
#define HPD_MSG_GENERATED(T, X)                                                             \
    X(T, request, U64, HPD_REQ, UINT64_MAX)                                                  \
    X(T, tokens, IDS, HPD_REQ, INT32_MAX)                                                    \
    X(T, prompt_tokens, U32, HPD_OPT, UINT32_MAX)                                            \
    X(T, cached_tokens, U32, HPD_OPT, UINT32_MAX)                                            \
    X(T, attempts, U32, HPD_OPT, UINT32_MAX)                                                 \
    X(T, ttft_ms, F32, HPD_OPT, 0)                                                           \
    X(T, total_ms, F32, HPD_OPT, 0)                                                          \
    X(T, prefill_ms, F32, HPD_OPT, 0)                                                        \
    X(T, push_ms, F32, HPD_OPT, 0)                                                           \
    X(T, exposed_push_ms, F32, HPD_OPT, 0)                                                   \
    X(T, finish_reason, STR, HPD_OPT, 16)                                                    \
    X(T, text, BIN, HPD_OPT, 0) /* detokenize: the answer (before a stop string) */          \
    X(T, reasoning, BIN, HPD_OPT, 0) /* a thinking model's chat: its reasoning apart */       \
    X(T, logprobs, BIN, HPD_OPT, 0)                                                          \
    X(T, top_logprobs, U32, HPD_OPT, HPD_MAX_TOP_LOGPROBS)                                   \
    X(T, prompt_logprobs, BIN, HPD_OPT, 0)                                                   \
    X(T, choices, ARR, HPD_OPT, 0) /* n > 1: a choice map each (hpd_msg_choice) */          \
    X(T, tool_calls, BIN, HPD_OPT, 0) /* tools: the calls (OpenAI's JSON array, as text) */
HPD_MSG_STRUCT(hpd_msg_generated_t, HPD_MSG_GENERATED)

/* one of generate's choices (n > 1; the reply's own fields are choice 0's) */
#define HPD_MSG_CHOICE(T, X)                                                                \
    X(T, index, U32, HPD_REQ, HPD_MAX_CHOICES - 1)                                           \
    X(T, tokens, IDS, HPD_REQ, INT32_MAX)                                                    \
    X(T, finish_reason, STR, HPD_OPT, 16)                                                    \
    X(T, text, BIN, HPD_OPT, 0)                                                              \
    X(T, reasoning, BIN, HPD_OPT, 0)                                                         \
    X(T, logprobs, BIN, HPD_OPT, 0)                                                          \
    X(T, tool_calls, BIN, HPD_OPT, 0)
HPD_MSG_STRUCT(hpd_msg_choice_t, HPD_MSG_CHOICE)

/* tokens (coordinator -> a streaming client): ids from index on; with
 * detokenize, the text they complete (text held back for a possible stop
 * string comes later; the reply has the whole answer) */
#define HPD_MSG_STREAM(T, X)                                                                \
    X(T, tag, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, index, U32, HPD_REQ, UINT32_MAX)                                                    \
    X(T, ids, IDS, HPD_REQ, INT32_MAX)                                                       \
    X(T, text, BIN, HPD_OPT, 0)                                                              \
    X(T, reasoning, BIN, HPD_OPT, 0)                                                         \
    X(T, logprobs, BIN, HPD_OPT, 0)                                                          \
    X(T, choice, U32, HPD_OPT, HPD_MAX_CHOICES - 1)                                          \
    X(T, tool_calls, BIN, HPD_OPT, 0) /* the calls these ids completed (JSON array text) */
HPD_MSG_STRUCT(hpd_msg_stream_t, HPD_MSG_STREAM)

/* cancel (client -> coordinator: the client's request of that tag) and
 * its reply */
#define HPD_MSG_CANCEL_REQUEST(T, X) X(T, tag, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_cancel_request_t, HPD_MSG_CANCEL_REQUEST)
#define HPD_MSG_CANCELED(T, X) X(T, canceled, BOOL, HPD_REQ, 0)
HPD_MSG_STRUCT(hpd_msg_canceled_t, HPD_MSG_CANCELED)

/* ---- a front door and its scheduler (docs/cluster.md, "Front doors") */

/* schedule (door -> scheduler): a request in token ids, as
 * hpd_coord_request_t has it; door: the address decode nodes stream its
 * tokens to, tag its id there. The reply: {request} */
#define HPD_MSG_SCHEDULE(T, X)                                                              \
    X(T, tag, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, door, STR, HPD_REQ, 72)                                                             \
    X(T, prompt, IDS, HPD_REQ, INT32_MAX)                                                    \
    X(T, max_tokens, U32, HPD_REQ, UINT32_MAX)                                               \
    X(T, sampling, OBJ, HPD_OPT, 0)                                                          \
    X(T, stop_token_ids, IDS, HPD_OPT, INT32_MAX)                                            \
    X(T, ignore_eos, BOOL, HPD_OPT, 0)                                                       \
    X(T, min_tokens, U32, HPD_OPT, UINT32_MAX)                                               \
    X(T, logprobs, BOOL, HPD_OPT, 0)                                                         \
    X(T, top_logprobs, U32, HPD_OPT, UINT32_MAX)                                             \
    X(T, prompt_logprobs, BOOL, HPD_OPT, 0)                                                  \
    X(T, grammar, BIN, HPD_OPT, 0)                                                           \
    X(T, grammar_after_think, BOOL, HPD_OPT, 0)                                              \
    X(T, n, U32, HPD_OPT, UINT32_MAX)                                                        \
    X(T, who, STR, HPD_OPT, 96)                                                              \
    X(T, stream, BOOL, HPD_OPT, 0)
HPD_MSG_STRUCT(hpd_msg_schedule_t, HPD_MSG_SCHEDULE)

/* schedule's reply */
#define HPD_MSG_SCHEDULED(T, X) X(T, request, U64, HPD_REQ, UINT64_MAX)
HPD_MSG_STRUCT(hpd_msg_scheduled_t, HPD_MSG_SCHEDULED)

/* ended (scheduler -> door): the end of the door's request tag. outcome:
 * hpd_coord_outcome_t; code: a failure's RPC error code, negated (they
 * are negative); the tokens are the door's already */
#define HPD_MSG_ENDED(T, X)                                                                 \
    X(T, tag, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, outcome, U32, HPD_REQ, 2)                                                           \
    X(T, code, U32, HPD_OPT, UINT32_MAX)                                                     \
    X(T, error, STR, HPD_OPT, 320)                                                           \
    X(T, prompt_tokens, U32, HPD_OPT, UINT32_MAX)                                            \
    X(T, cached_tokens, U32, HPD_OPT, UINT32_MAX)                                            \
    X(T, attempts, U32, HPD_OPT, UINT32_MAX)                                                 \
    X(T, ttft_ms, F32, HPD_OPT, 0)                                                           \
    X(T, prefill_ms, F32, HPD_OPT, 0)                                                        \
    X(T, push_ms, F32, HPD_OPT, 0)                                                           \
    X(T, exposed_push_ms, F32, HPD_OPT, 0)
HPD_MSG_STRUCT(hpd_msg_ended_t, HPD_MSG_ENDED)

/* unschedule (door -> scheduler, a notification): the door's request tag
 * is canceled (its client went away), or with stop its choice ended at a
 * stop string (the request finishes once every choice has) */
#define HPD_MSG_UNSCHEDULE(T, X)                                                            \
    X(T, tag, U64, HPD_REQ, UINT64_MAX)                                                      \
    X(T, stop, BOOL, HPD_OPT, 0)                                                             \
    X(T, choice, U32, HPD_OPT, HPD_MAX_CHOICES - 1)
HPD_MSG_STRUCT(hpd_msg_unschedule_t, HPD_MSG_UNSCHEDULE)

/* limits' reply (scheduler -> door): what hpd_coord_limits says */
#define HPD_MSG_LIMITS(T, X)                                                                \
    X(T, vocab, U32, HPD_OPT, UINT32_MAX)                                                    \
    X(T, max_context, U32, HPD_OPT, UINT32_MAX)                                              \
    X(T, draining, BOOL, HPD_OPT, 0)
HPD_MSG_STRUCT(hpd_msg_limits_t, HPD_MSG_LIMITS)

/* Every message's descriptor, for the fuzzer and the tests. */
extern const hpd_msg_desc_t hpd_msg_register, hpd_msg_registered, hpd_msg_reservation,
    hpd_msg_destination, hpd_msg_prefill_job, hpd_msg_prefill_load, hpd_msg_decode_load,
    hpd_msg_stats, hpd_msg_engine_stats, hpd_msg_cache_stats, hpd_msg_xfer_stats, hpd_msg_alive, hpd_msg_tokens,
    hpd_msg_cancel_job, hpd_msg_start, hpd_msg_prefilled, hpd_msg_reserve, hpd_msg_generate,
    hpd_msg_generated, hpd_msg_choice, hpd_msg_stream, hpd_msg_cancel_request, hpd_msg_canceled,
    hpd_msg_schedule, hpd_msg_scheduled, hpd_msg_ended, hpd_msg_unschedule, hpd_msg_limits;
extern const hpd_msg_desc_t *const hpd_msg_all[];
extern const uint32_t hpd_msg_n_all;

/* Packs msg (a struct of desc's list) as one map. */
void hpd_msg_pack(const hpd_msg_desc_t *desc, const void *msg, msgpack_packer *pk);
/* As hpd_msg_pack, with the optional numbers, flags, strings and ids packed
 * even when zero or empty: for a sender whose zero is a value the receiver
 * must see (a client's max_tokens 0 is an error, not the default). */
void hpd_msg_pack_all(const hpd_msg_desc_t *desc, const void *msg, msgpack_packer *pk);

/* Unpacks obj into msg (see the rules above). On false, err says why and
 * nothing needs freeing. */
bool hpd_msg_unpack(const hpd_msg_desc_t *desc, const msgpack_object *obj, void *msg,
                    hpd_proto_err_t *err);

/* Whether every id is below vocab; else err names the first that is not
 * (field `what`). */
bool hpd_msg_ids_below(const int32_t *ids, uint32_t n, uint32_t vocab, const char *what,
                       hpd_proto_err_t *err);

/* Frees what unpacking allocated (IDS) and clears those members. */
void hpd_msg_free(const hpd_msg_desc_t *desc, void *msg);

#endif
