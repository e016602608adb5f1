/* Scripted peers for an in-process coordinator (header-only; one test
 * binary includes it once, after cmocka.h and tests/transport/loop.h):
 * fake prefill and decode nodes that are RPC servers on the test's loop,
 * register with the coordinator as real nodes do (a UCX address of version
 * 0 passes its checks; nothing is ever put), and answer its calls as the
 * test scripts them: at once, later (held), or with an error. Requests go
 * in through hpd_coord_submit with a sink that records what came.
 *
 * A decode node answers reserve with a reservation and keeps the job; the
 * test sends its tokens (peer_tokens), as a decode node's tokens
 * notifications, on the coordinator's connection to it. A prefill node
 * answers prefill with first_token (or holds it: peer_answer_prefill
 * later). */
#ifndef HPD_TESTS_COORDINATOR_PEERS_H
#define HPD_TESTS_COORDINATOR_PEERS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coordinator.h"
#include "node/msg.h"
#include "transport/rpc.h"
#include "transport/rpc_codec.h"

#define PEER_MAX_JOBS 64
#define PEER_SECRET "coordinator-test-secret"

typedef enum { PEER_ANSWER, PEER_HOLD, PEER_FAIL_PARAMS, PEER_FAIL_PEER } peer_mode_t;

typedef struct {
    uint64_t job;
    hpd_rpc_conn_t *conn; /* the call held (prefill), or the coordinator's connection */
    uint32_t call;        /* its id (held prefill) */
    bool answered, started, canceled;
    uint32_t replay_n; /* reserve: the tokens the client had (a failover's, a hedge's) */
    /* prefill: its prompt (the first PEER_MAX_PROMPT ids) and its length */
#define PEER_MAX_PROMPT 256
    int32_t prompt[PEER_MAX_PROMPT];
    uint32_t prefill_n;
    /* reserve: what it carried of the request */
    uint32_t prompt_n, max_tokens, min_tokens, stop_n;
    bool ignore_eos;
    uint64_t seed;
    double temperature; /* NAN: not given */
    uint32_t n_choices; /* reserve and prefill: n (0: one) */
    int32_t first[16];  /* start: first_token, then first_tokens' others */
    uint32_t n_first;
} peer_job_t;

typedef struct {
    char name[32];
    bool prefill;
    hpd_rpc_server_t *server;
    hpd_rpc_client_t *reg; /* its registration connection to the coordinator */
    uint64_t node_id;
    bool registered;
    peer_mode_t mode; /* how reserve (decode) or prefill (prefill) is answered */
    uint64_t fail_dest;   /* prefill: jobs for this decode node fail as a cut pair (PEER) */
    bool autocomplete;    /* decode: a started job gets its last 3 tokens at once */
    peer_job_t jobs[PEER_MAX_JOBS];
    uint32_t n_jobs;
    uint32_t reserves, prefills, starts, cancels;
    hpd_rpc_conn_t *coord_conn; /* the coordinator's connection to this node */
    uint64_t alive_key;         /* its liveness pings' key (0: liveness off) */
    bool refused;               /* its registration was refused: why */
    uint32_t shutdowns;         /* "shutdown" notifications on its registration connection */
    char refusal[300];
    uint32_t pings_ok, pings_refused, heartbeats;
    char ping_error[200];       /* the last refusal */
} peer_t;

static hpd_coord_t *coord;
static char peer_dir[256], peer_token_file[300], peer_keys_file[300];
static const char *peer_client_key; /* set before coord_start: a client key of tenant "t" */
static uint8_t peer_model = 9;      /* the model fingerprint's first byte the next peer registers */
static uint32_t peer_vocab = 1000;  /* the vocabulary the next peer registers with */
static uint64_t peer_incarnation;   /* the incarnation the next peer registers with (0: none) */
static uint32_t peer_tp;            /* the TP degree the next peer registers with (0: none) */
static const int32_t *peer_map;     /* and its shard map, peer_map_n numbers (NULL: none) */
static uint32_t peer_map_n;
static bool peer_may_be_refused;    /* the next peer's refusal is the test's: kept in refusal */

/* The jobs are a ring of the last PEER_MAX_JOBS (a held one is never
 * that old in these tests). */
static peer_job_t *peer_job(peer_t *p, uint64_t job)
{
    for (uint32_t i = 0; i < p->n_jobs && i < PEER_MAX_JOBS; i++)
        if (p->jobs[i].job == job)
            return &p->jobs[i];
    return NULL;
}

static peer_job_t *peer_add_job(peer_t *p, uint64_t job)
{
    peer_job_t *j = &p->jobs[p->n_jobs++ % PEER_MAX_JOBS];
    assert_true(j->conn == NULL || j->answered); /* never one still held */
    *j = (peer_job_t){.job = job};
    return j;
}

static uint64_t job_of(const msgpack_object *params)
{
    const msgpack_object *j = hpd_rpc_map_get(params, "job");
    assert_non_null(j);
    return j->via.u64;
}

static void peer_tokens(peer_t *p, uint64_t job, uint32_t index, const int32_t *ids, uint32_t n,
                        bool done, const char *error);

static void m_reserve(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    peer_t *p = arg;
    p->reserves++;
    p->coord_conn = conn;
    if (p->mode == PEER_FAIL_PARAMS) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_OVERLOADED, "no room (scripted)");
        return;
    }
    peer_job_t *j = peer_add_job(p, job_of(params));
    hpd_msg_reserve_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_reserve, params, &m, &err))
        fail_msg("%s: a reserve it cannot read: %s", p->name, err.text);
    j->replay_n = m.replay_n;
    j->prompt_n = m.prompt_n;
    j->max_tokens = m.max_tokens;
    j->min_tokens = m.min_tokens;
    j->stop_n = m.stop_token_ids_n;
    j->ignore_eos = m.ignore_eos;
    j->n_choices = m.n;
    const msgpack_object *seed = m.sampling ? hpd_rpc_map_get(m.sampling, "seed") : NULL;
    const msgpack_object *t = m.sampling ? hpd_rpc_map_get(m.sampling, "temperature") : NULL;
    j->seed = seed != NULL ? seed->via.u64 : 0;
    j->temperature = t != NULL ? t->via.f64 : NAN;
    hpd_msg_free(&hpd_msg_reserve, &m);
    /* one pack group of one page, page 1 */
    static const uint8_t tables[] = {0x91, 0x91, 0x01}; /* msgpack [[1]] */
    const hpd_msg_reservation_t res = {
        .layout = {.block_size = 16, .pack_size = 1, .order = HPD_KV_NHD},
        .tables_raw = tables,
        .tables_raw_len = sizeof(tables),
        .slot_region = 1};
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_reservation, &res, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static void m_start(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    peer_t *p = arg;
    peer_job_t *j = peer_job(p, job_of(params));
    p->starts++;
    p->coord_conn = conn;
    if (j != NULL) {
        hpd_msg_start_t m = {0};
        hpd_proto_err_t err;
        if (!hpd_msg_unpack(&hpd_msg_start, params, &m, &err))
            fail_msg("%s: a start it cannot read: %s", p->name, err.text);
        j->started = true;
        j->first[0] = (int32_t)m.first_token;
        j->n_first = HPD_MAX(1u, HPD_MIN(m.first_tokens_n, 16u));
        for (uint32_t k = 1; k < j->n_first; k++)
            j->first[k] = m.first_tokens[k];
        hpd_msg_free(&hpd_msg_start, &m);
    }
    hpd_rpc_reply(conn, id, NULL);
    if (j != NULL && p->autocomplete) {
        static const int32_t rest[] = {10, 11, 12};
        peer_tokens(p, j->job, 1, rest, 3, true, NULL);
    }
}

/* A held prefill job ends: its reply went, its connection is let go. */
static void held_release(peer_job_t *j)
{
    j->answered = true;
    hpd_rpc_conn_unref(j->conn);
    j->conn = NULL;
}

static void m_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    peer_t *p = arg;
    peer_job_t *j = peer_job(p, job_of(params));
    p->cancels++;
    if (j != NULL) {
        j->canceled = true;
        if (p->prefill && !j->answered && j->conn != NULL) { /* a held prefill ends */
            hpd_rpc_reply_error(j->conn, j->call, HPD_RPC_ERR_APP, "canceled");
            held_release(j);
        }
    }
    hpd_rpc_reply(conn, id, NULL);
}

static void answer_prefill(peer_job_t *j, int32_t first)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_prefilled, &(hpd_msg_prefilled_t){.first_token = (uint32_t)first},
                 &b.pk);
    hpd_rpc_reply(j->conn, j->call, &b);
    hpd_rpc_buf_destroy(&b);
    j->answered = true;
}

static void m_prefill(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    peer_t *p = arg;
    p->prefills++;
    peer_job_t *j = peer_add_job(p, job_of(params));
    j->conn = conn;
    j->call = id;
    hpd_msg_prefill_job_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_prefill_job, params, &m, &err))
        fail_msg("%s: a prefill job it cannot read: %s", p->name, err.text);
    j->prefill_n = m.prompt_n;
    j->n_choices = m.n;
    memcpy(j->prompt, m.prompt, HPD_MIN(m.prompt_n, PEER_MAX_PROMPT) * sizeof(int32_t));
    hpd_msg_free(&hpd_msg_prefill_job, &m);
    const msgpack_object *dest = hpd_rpc_map_get(hpd_rpc_map_get(params, "decode"), "node");
    if (p->fail_dest != 0 && dest != NULL && dest->via.u64 == p->fail_dest) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PEER, "cannot reach decode node %llu "
                            "(scripted)", (unsigned long long)p->fail_dest);
        j->answered = true;
        return;
    }
    switch (p->mode) {
    case PEER_ANSWER: answer_prefill(j, 7); break;
    case PEER_HOLD: hpd_rpc_conn_ref(conn); break;
    case PEER_FAIL_PARAMS:
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "a bad destination (scripted)");
        j->answered = true;
        break;
    case PEER_FAIL_PEER:
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PEER, "cannot reach the decode node "
                            "(scripted)");
        j->answered = true;
        break;
    }
}

/* A prefill job the peer still holds. */
static peer_job_t *peer_held(peer_t *p, uint64_t job)
{
    peer_job_t *j = peer_job(p, job);
    assert_non_null(j);
    assert_false(j->answered);
    return j;
}

/* A held prefill job answered now with its first token. */
static inline void peer_answer_prefill(peer_t *p, uint64_t job, int32_t first)
{
    peer_job_t *j = peer_held(p, job);
    answer_prefill(j, first);
    held_release(j);
}

/* A held prefill job answered now with an error of code. */
static inline void peer_answer_error(peer_t *p, uint64_t job, int64_t code)
{
    peer_job_t *j = peer_held(p, job);
    hpd_rpc_reply_error(j->conn, j->call, code, "the job failed (scripted)");
    held_release(j);
}

/* A decode node's tokens notification for choice k of job: ids from index on. */
static void peer_choice_tokens(peer_t *p, uint64_t job, uint32_t k, uint32_t index,
                               const int32_t *ids, uint32_t n, bool done, const char *error)
{
    hpd_msg_tokens_t m = {.job = job, .index = index, .ids = ids, .ids_n = n, .done = done,
                          .choice = k};
    if (done)
        snprintf(m.finish_reason, sizeof(m.finish_reason), "length");
    if (error != NULL)
        snprintf(m.error, sizeof(m.error), "%s", error);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
    assert_non_null(p->coord_conn);
    assert_int_equal(hpd_rpc_notify(p->coord_conn, "tokens", &b), HPD_OK);
    hpd_rpc_buf_destroy(&b);
}

static void peer_tokens(peer_t *p, uint64_t job, uint32_t index, const int32_t *ids, uint32_t n,
                        bool done, const char *error)
{
    peer_choice_tokens(p, job, 0, index, ids, n, done, error);
}

static void on_peer_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    peer_t *p = arg;
    p->shutdowns += msg->method_len == 8 && memcmp(msg->method, "shutdown", 8) == 0;
}

static void on_registered(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    peer_t *p = arg;
    assert_int_equal(st, HPD_OK);
    if (reply->is_error && (peer_model != 9 || peer_may_be_refused)) { /* the test's */
        snprintf(p->refusal, sizeof(p->refusal), "%.*s", (int)reply->error_message_len,
                 reply->error_message);
        p->refused = true;
        return;
    }
    if (reply->is_error)
        fail_msg("%s: registration refused: %.*s", p->name, (int)reply->error_message_len,
                 reply->error_message);
    p->node_id = hpd_rpc_map_get(reply->result, "node_id")->via.u64;
    const msgpack_object *key = hpd_rpc_map_get(reply->result, "alive_key");
    p->alive_key = key != NULL ? key->via.u64 : 0;
    p->registered = true;
}

/* p's register message into b (its xfer info into info: both the
 * caller's to destroy), from host with incarnation (0: none). */
static void peer_pack_register(const peer_t *p, const char *host, uint64_t incarnation,
                               hpd_rpc_buf_t *info, hpd_rpc_buf_t *b)
{
    const bool prefill = p->prefill;
    const char *name = p->name;
    const uint8_t fp[16] = {peer_model, 9, 9};
    uint8_t address[32], rkey[8] = {1};
    memset(address, 0x11, sizeof(address));
    address[0] = 0x00; /* a UCX address of version 0 (v1) */
    hpd_rpc_buf_init(info);
    msgpack_pack_map(&info->pk, 3);
    hpd_rpc_pack_str(&info->pk, "node");
    msgpack_pack_uint64(&info->pk, 1);
    hpd_rpc_pack_str(&info->pk, "address");
    msgpack_pack_bin(&info->pk, sizeof(address));
    msgpack_pack_bin_body(&info->pk, address, sizeof(address));
    hpd_rpc_pack_str(&info->pk, "regions");
    msgpack_pack_array(&info->pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_array(&info->pk, 3);
        msgpack_pack_uint64(&info->pk, (uint64_t)(i + 1) << 20);
        msgpack_pack_uint64(&info->pk, 1 << 20);
        msgpack_pack_bin(&info->pk, sizeof(rkey));
        msgpack_pack_bin_body(&info->pk, rkey, sizeof(rkey));
    }
    hpd_msg_register_t m = {.port = hpd_rpc_server_port(p->server),
                            .fingerprint = fp,
                            .fingerprint_len = 16,
                            .vocab = peer_vocab,
                            .max_context = 4096,
                            .layout = {.block_size = 16, .pack_size = 1, .order = HPD_KV_NHD},
                            .kv_layers = 2,
                            .pages = 100000,
                            .slots = 64,
                            .max_batch = 64,
                            .xfer_raw = info->sb.data,
                            .xfer_raw_len = (uint32_t)info->sb.size};
    snprintf(m.role, sizeof(m.role), "%s", prefill ? "prefill" : "decode");
    snprintf(m.name, sizeof(m.name), "%s", name);
    snprintf(m.host, sizeof(m.host), "%s", host);
    m.incarnation = incarnation;
    m.tp = peer_tp;
    m.shard_map = peer_map;
    m.shard_map_n = peer_map_n;
    hpd_rpc_buf_init(b);
    hpd_msg_pack(&hpd_msg_register, &m, &b->pk);
}

/* A fake node on the test's loop, registered with the coordinator (the
 * loop runs until it is). */
static void peer_start(peer_t *p, const char *name, bool prefill)
{
    static const hpd_rpc_method_t prefill_methods[] = {{.name = "prefill", .fn = m_prefill},
                                                       {.name = "cancel", .fn = m_cancel}};
    static const hpd_rpc_method_t decode_methods[] = {{.name = "reserve", .fn = m_reserve},
                                                      {.name = "start", .fn = m_start},
                                                      {.name = "cancel", .fn = m_cancel}};
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->prefill = prefill;
    const hpd_rpc_server_params_t sp = {.base = base,
                                        .host = "127.0.0.1",
                                        .token = PEER_SECRET,
                                        .methods = prefill ? prefill_methods : decode_methods,
                                        .n_methods = prefill ? 2 : 3,
                                        .arg = p};
    assert_int_equal(hpd_rpc_server_create(&sp, &p->server), HPD_OK);
    const hpd_rpc_client_params_t cp = {.base = base, .host = "127.0.0.1",
                                        .port = hpd_coord_port(coord), .token = PEER_SECRET,
                                        .timeout_ms = 30000, .on_notify = on_peer_notify,
                                        .arg = p};
    assert_int_equal(hpd_rpc_client_connect(&cp, &p->reg), HPD_OK);
    hpd_rpc_buf_t info, b;
    peer_pack_register(p, "127.0.0.1", peer_incarnation, &info, &b);
    assert_int_equal(hpd_rpc_call(p->reg, "register", &b, 30000, on_registered, p), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_buf_destroy(&info);
    LOOP_UNTIL(p->registered || p->refused);
}

static void on_pinged(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    peer_t *p = arg;
    if (st == HPD_OK && !reply->is_error) {
        p->pings_ok++;
        return;
    }
    p->pings_refused++;
    if (st == HPD_OK)
        snprintf(p->ping_error, sizeof(p->ping_error), "%.*s", (int)reply->error_message_len,
                 reply->error_message);
}

/* One liveness ping as the node's pinger sends it (node/liveness.h),
 * with key (the registration's, or another). */
static void peer_ping(peer_t *p, uint64_t key)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_alive, &(hpd_msg_alive_t){.node_id = p->node_id, .key = key}, &b.pk);
    assert_int_equal(hpd_rpc_call(p->reg, "alive", &b, 30000, on_pinged, p), HPD_OK);
    hpd_rpc_buf_destroy(&b);
}

static void on_heartbeat_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    peer_t *p = arg;
    assert_int_equal(st, HPD_OK);
    if (reply->is_error)
        fail_msg("%s: heartbeat refused: %.*s", p->name, (int)reply->error_message_len,
                 reply->error_message);
    p->heartbeats++;
}

/* A heartbeat as a node's loop sends it, on its registration connection:
 * its stats (slots_used as given) and a prefix summary of 8192 bytes. */
static void peer_heartbeat(peer_t *p, bool draining, uint32_t slots_used)
{
    static const uint8_t empty_map[] = {0x80}, summary[8192];
    hpd_msg_stats_t m = {.node_id = p->node_id,
                         .draining = draining,
                         .uptime_s = 1,
                         .pages_total = 100000,
                         .slots_used = slots_used,
                         .slots_total = 64,
                         .engine_raw = empty_map,
                         .engine_raw_len = 1,
                         .cache_raw = empty_map,
                         .cache_raw_len = 1,
                         .xfer_raw = empty_map,
                         .xfer_raw_len = 1,
                         .load_raw = empty_map,
                         .load_raw_len = 1,
                         .prefix_summary = summary,
                         .prefix_summary_len = sizeof(summary)};
    snprintf(m.role, sizeof(m.role), "%s", p->prefill ? "prefill" : "decode");
    snprintf(m.name, sizeof(m.name), "%s", p->name);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_stats, &m, &b.pk);
    const uint32_t before = p->heartbeats;
    assert_int_equal(hpd_rpc_call(p->reg, "heartbeat", &b, 30000, on_heartbeat_reply, p),
                     HPD_OK);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(p->heartbeats > before);
}

/* The node dies: its connections close. */
static void peer_stop(peer_t *p)
{
    for (uint32_t i = 0; i < p->n_jobs && i < PEER_MAX_JOBS; i++)
        if (p->jobs[i].conn != NULL && !p->jobs[i].answered)
            hpd_rpc_conn_unref(p->jobs[i].conn);
    hpd_rpc_client_destroy(p->reg);
    hpd_rpc_server_destroy(p->server);
    p->reg = NULL;
    p->server = NULL;
}

/* ------------------------------------------------------------ requests */

typedef struct {
    bool done;
    hpd_coord_outcome_t outcome;
    int64_t code;
    char error[300];
    int32_t tokens[256];
    uint32_t n_tokens, attempts;
    int32_t streamed[256]; /* what the sink's tokens callback was given, in order */
    uint32_t n_streamed;
    bool streamed_wrong;   /* a call that did not continue where the last ended */
    int32_t stop_at;       /* the sink ends the request at this token (a stop string; 0: none) */
    char finish_reason[8];
} outcome_t;

static bool sink_tokens(void *arg, uint32_t k, const int32_t *tokens,
                        const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                        uint32_t *keep_p)
{
    outcome_t *o = arg;
    if (k != 0 || from != o->n_streamed || n <= from || n > 256)
        o->streamed_wrong = true;
    for (uint32_t i = from; i < n && o->n_streamed < 256; i++) {
        o->streamed[o->n_streamed++] = tokens[i];
        if (o->stop_at != 0 && tokens[i] == o->stop_at) {
            *keep_p = i + 1;
            return false;
        }
    }
    return true;
}

static void sink_done(void *arg, const hpd_coord_result_t *res)
{
    outcome_t *o = arg;
    o->done = true;
    o->outcome = res->outcome;
    o->code = res->code;
    o->attempts = res->attempts;
    snprintf(o->error, sizeof(o->error), "%s", res->error != NULL ? res->error : "");
    snprintf(o->finish_reason, sizeof(o->finish_reason), "%s",
             res->finish_reason != NULL ? res->finish_reason : "");
    o->n_tokens = res->n_tokens < 256 ? res->n_tokens : 256;
    memcpy(o->tokens, res->tokens, o->n_tokens * sizeof(int32_t));
}

/* Submits a request of a few tokens; its outcome lands in o. */
static uint64_t submit_request(outcome_t *o, uint32_t max_tokens)
{
    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    const hpd_coord_request_t q = {.prompt = prompt,
                                   .n_prompt = 5,
                                   .max_tokens = max_tokens,
                                   .sampling = {.temperature = 0, .top_p = 1}};
    const hpd_coord_sink_t sink = {.tokens = sink_tokens, .done = sink_done, .arg = o};
    uint64_t id = 0;
    char err[300];
    memset(o, 0, sizeof(*o));
    const int64_t code = hpd_coord_submit(coord, &q, &sink, &id, err, sizeof(err));
    if (code != 0)
        fail_msg("submit: %s", err);
    return id;
}

/* The coordinator in-process: a secret, no client keys (requests come in
 * through hpd_coord_submit), liveness off unless opts say otherwise. */
static void coord_start(const hpd_coord_opts_t *extra)
{
    char err[400];
    test_tmpdir(peer_dir, sizeof(peer_dir), "coord");
    snprintf(peer_token_file, sizeof(peer_token_file), "%s/token", peer_dir);
    assert_int_equal(hpd_write_file(peer_token_file, PEER_SECRET "\n", strlen(PEER_SECRET) + 1),
                     HPD_OK);
    hpd_coord_opts_t o = extra != NULL ? *extra : (hpd_coord_opts_t){0};
    o.host = "127.0.0.1";
    o.token_file = peer_token_file;
    if (peer_client_key != NULL) {
        char line[200];
        snprintf(peer_keys_file, sizeof(peer_keys_file), "%s/client-keys", peer_dir);
        snprintf(line, sizeof(line), "%s t\n", peer_client_key);
        assert_int_equal(hpd_write_file(peer_keys_file, line, strlen(line)), HPD_OK);
        o.client_keys_file = peer_keys_file;
    }
    if (o.heartbeat_ms == 0)
        o.heartbeat_ms = 100;
    if (o.lease_ms == 0)
        o.lease_ms = 600000;
    if (o.max_requests == 0)
        o.max_requests = 64;
    if (o.queue_timeout_ms == 0)
        o.queue_timeout_ms = 60000;
    if (o.max_attempts == 0)
        o.max_attempts = 3;
    if (hpd_coord_create(base, &o, &coord, err, sizeof(err)) != HPD_OK)
        fail_msg("coordinator: %s", err);
}

static void coord_stop(void)
{
    hpd_coord_destroy(coord);
    coord = NULL;
    spin(20);
    test_rmtree(peer_dir);
}

#endif
