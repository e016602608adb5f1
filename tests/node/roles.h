/* The node roles alone (header-only; used by tests/prefill_node/test_prefill.c
 * and tests/decode_node/test_decode.c): real hpd-prefill and hpd-decode
 * processes (tests/cluster/harness.h starts them and checks how they end)
 * with the test as their coordinator. A scripted coordinator on the test's
 * loop takes their registrations and heartbeats, and the test calls the
 * nodes' methods itself (reserve, prefill, start, cancel, stats) as the
 * coordinator would, or as a coordinator with a bug or a hostile one
 * would: what a role does with each call is seen without the coordinator's
 * policies in between. A decode node streams a job's tokens on the
 * connection that reserved it: the test's, here (rn_stream_t).
 *
 * Calls run the loop until their reply (hpd_rpc_call_sync), so the
 * scripted coordinator answers heartbeats meanwhile. */
#ifndef HPD_TESTS_NODE_ROLES_H
#define HPD_TESTS_NODE_ROLES_H

#include "tests/cluster/harness.h"

#include "node/msg.h"
#include "node/proto.h"
#include "transport/rpc.h"
/* after the headers that name a parameter "base" */
#include "tests/transport/loop.h"

#define RN_SECRET "cluster-secret" /* cl_init's token file */
#define RN_MAX_NODES 8
#define RN_MAX_STREAMS 32
#define RN_MAX_TOKENS 512

/* A node as it registered, and the test's connection to it. */
typedef struct {
    char name[64], host[64];
    uint16_t port;
    bool prefill;
    uint64_t id;
    hpd_kv_layout_t layout;
    uint32_t vocab, max_context, pages, slots;
    msgpack_sbuffer xfer; /* its UCX info, packed, as a destination carries it */
    hpd_rpc_conn_t *reg_conn;
    uint32_t registrations, heartbeats;
    bool draining; /* its last heartbeat said so */
    uint32_t summary_len; /* the prefix summary its last heartbeat carried (0: none) */
    hpd_rpc_client_t *cl;
    cl_proc_t *proc;
} rn_node_t;

/* A job's tokens as a decode node streamed them to the test. */
typedef struct {
    uint64_t job;
    int32_t ids[RN_MAX_TOKENS];
    uint32_t n;        /* tokens from index 0 (the first one, the prefill's, included) */
    uint32_t notices;  /* tokens notifications */
    uint32_t empty;    /* notifications without a token that did not end the job */
    bool done;
    bool bad_index;    /* a notification's index past the tokens so far */
    char error[160], finish_reason[8];
} rn_stream_t;

static struct {
    cl_t cl;
    hpd_rpc_server_t *server;
    rn_node_t nodes[RN_MAX_NODES];
    uint32_t n_nodes;
    uint64_t next_id;
    rn_stream_t streams[RN_MAX_STREAMS];
    uint32_t n_streams;
    uint32_t lease_ms; /* what registrations are granted */
    /* liveness pings (node/liveness.h): asked for at registration when
     * alive_ms > 0; answered while answer_alive, refused otherwise */
    uint32_t alive_ms, alive_lease_ms;
    bool answer_alive;
    uint64_t alive_pings;
    double last_alive_answer; /* hpd_time_now() of the last answered ping */
} rn;

static inline rn_node_t *rn_by_name(const char *name)
{
    for (uint32_t i = 0; i < rn.n_nodes; i++)
        if (strcmp(rn.nodes[i].name, name) == 0)
            return &rn.nodes[i];
    return NULL;
}

static inline rn_stream_t *rn_stream(uint64_t job)
{
    for (uint32_t i = 0; i < rn.n_streams; i++)
        if (rn.streams[i].job == job)
            return &rn.streams[i];
    if (rn.n_streams == RN_MAX_STREAMS)
        fail_msg("more than %d streams", RN_MAX_STREAMS);
    rn_stream_t *s = &rn.streams[rn.n_streams++];
    memset(s, 0, sizeof(*s));
    s->job = job;
    return s;
}

/* ------------------------------------------------------------ the coordinator */

static inline void rn_m_register(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                          void *arg)
{
    hpd_msg_register_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_register, params, &m, &err))
        fail_msg("a registration the test cannot read: %s", err.text);
    rn_node_t *n = rn_by_name(m.name);
    if (n == NULL) {
        if (rn.n_nodes == RN_MAX_NODES)
            fail_msg("more than %d nodes", RN_MAX_NODES);
        n = &rn.nodes[rn.n_nodes++];
        memset(n, 0, sizeof(*n));
        msgpack_sbuffer_init(&n->xfer);
    }
    snprintf(n->name, sizeof(n->name), "%s", m.name);
    snprintf(n->host, sizeof(n->host), "%s", m.host);
    n->port = (uint16_t)m.port;
    n->prefill = strcmp(m.role, "prefill") == 0;
    n->id = ++rn.next_id;
    n->layout = m.layout;
    n->vocab = m.vocab;
    n->max_context = m.max_context;
    n->pages = m.pages;
    n->slots = m.slots;
    msgpack_sbuffer_clear(&n->xfer);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &n->xfer, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *m.xfer);
    n->reg_conn = conn;
    n->registrations++;
    hpd_msg_free(&hpd_msg_register, &m);
    const hpd_msg_registered_t r = {.node_id = n->id,
                                    .heartbeat_ms = 100,
                                    .lease_ms = rn.lease_ms,
                                    .alive_ms = rn.alive_ms,
                                    .alive_key = rn.alive_ms > 0 ? 1000 + n->id : 0,
                                    .alive_lease_ms = rn.alive_lease_ms};
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_registered, &r, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static inline void rn_m_heartbeat(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                           void *arg)
{
    hpd_msg_stats_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_stats, params, &m, &err))
        fail_msg("a heartbeat the test cannot read: %s", err.text);
    for (uint32_t i = 0; i < rn.n_nodes; i++)
        if (rn.nodes[i].id == m.node_id) {
            rn.nodes[i].heartbeats++;
            rn.nodes[i].draining = m.draining;
            rn.nodes[i].summary_len = m.prefix_summary_len;
        }
    hpd_msg_free(&hpd_msg_stats, &m);
    hpd_rpc_reply(conn, id, NULL);
}

static inline void rn_m_alive(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                              void *arg)
{
    hpd_msg_alive_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_alive, params, &m, &err))
        fail_msg("a liveness ping the test cannot read: %s", err.text);
    if (m.key != 1000 + m.node_id)
        fail_msg("node %llu pings with key %llu", (unsigned long long)m.node_id,
                 (unsigned long long)m.key);
    rn.alive_pings++;
    if (!rn.answer_alive) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP, "not answering (scripted)");
        return;
    }
    rn.last_alive_answer = hpd_time_now();
    hpd_rpc_reply(conn, id, NULL);
}

/* The scripted coordinator, lease_ms granted to nodes: on a free port, or
 * again on the port it had (the nodes' --coordinator). */
static inline void rn_coordinator_start(uint32_t lease_ms)
{
    static const hpd_rpc_method_t methods[] = {
        {.name = "register", .fn = rn_m_register},
        {.name = "heartbeat", .fn = rn_m_heartbeat},
        {.name = "alive", .fn = rn_m_alive},
    };
    const hpd_rpc_server_params_t sp = {.base = base, .host = "127.0.0.1", .port = rn.cl.port,
                                        .token = RN_SECRET, .methods = methods, .n_methods = 3};
    rn.lease_ms = lease_ms;
    assert_int_equal(hpd_rpc_server_create(&sp, &rn.server), HPD_OK);
    rn.cl.port = hpd_rpc_server_port(rn.server);
    snprintf(rn.cl.addr, sizeof(rn.cl.addr), "127.0.0.1:%u", rn.cl.port);
}

/* Closes the scripted coordinator: the nodes lose it (and keep trying). */
static inline void rn_coordinator_stop(void)
{
    hpd_rpc_server_destroy(rn.server);
    rn.server = NULL;
}

/* ------------------------------------------------------------ nodes */

static inline void rn_on_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    if (!hpd_rpc_str_eq(msg->method, msg->method_len, "tokens"))
        fail_msg("a notification '%.*s' from a node", (int)msg->method_len, msg->method);
    hpd_msg_tokens_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_msg_unpack(&hpd_msg_tokens, msg->params, &m, &err))
        fail_msg("a tokens notification the test cannot read: %s", err.text);
    rn_stream_t *s = rn_stream(m.job);
    s->notices++;
    s->empty += m.ids_n == 0 && !m.done;
    if (m.index > s->n)
        s->bad_index = true;
    for (uint32_t i = 0; i < m.ids_n && m.index + i < RN_MAX_TOKENS; i++)
        s->ids[m.index + i] = m.ids[i];
    if (m.ids_n > 0)
        s->n = HPD_MIN(m.index + m.ids_n, (uint32_t)RN_MAX_TOKENS);
    s->done |= m.done;
    snprintf(s->error, sizeof(s->error), "%s", m.error);
    snprintf(s->finish_reason, sizeof(s->finish_reason), "%s", m.finish_reason);
    hpd_msg_free(&hpd_msg_tokens, &m);
}

/* Starts a node of `role` with flags extra (NULL-terminated), waits for its
 * registration and connects to it. */
static inline rn_node_t *rn_node_start(const char *role, const char *name, const char *const *extra)
{
    cl_proc_t *p = cl_start_node(&rn.cl, role, name, extra);
    rn_node_t *n;
    PROGRESS_UNTIL((n = rn_by_name(name)) != NULL && n->heartbeats > 0, cl_check_alive(&rn.cl));
    n->proc = p;
    const hpd_rpc_client_params_t cp = {.base = base, .host = n->host, .port = n->port,
                                        .token = RN_SECRET, .timeout_ms = 60000,
                                        .on_notify = rn_on_notify};
    assert_int_equal(hpd_rpc_client_create(&cp, &n->cl), HPD_OK);
    return n;
}

/* SIGTERM to node n, which must exit 0; it is forgotten (the last node
 * takes its place in rn.nodes: look nodes up again by name after it). */
static inline void rn_node_stop(rn_node_t *n)
{
    hpd_rpc_client_destroy(n->cl);
    n->cl = NULL;
    if (n->proc->paused)
        cl_resume(n->proc);
    cl_ending(n->proc);
    kill(n->proc->pid, SIGTERM);
    cl_expect_end(&rn.cl, n->proc, 0, 60);
    msgpack_sbuffer_destroy(&n->xfer);
    *n = rn.nodes[--rn.n_nodes];
}

/* Node n, which has exited (cl_expect_end checked how), is forgotten as by
 * rn_node_stop. */
static inline void rn_node_forget(rn_node_t *n)
{
    hpd_rpc_client_destroy(n->cl);
    msgpack_sbuffer_destroy(&n->xfer);
    *n = rn.nodes[--rn.n_nodes];
}

/* kill -9 of node n (stopped or not); it is forgotten, as by rn_node_stop. */
static inline void rn_node_kill(rn_node_t *n)
{
    hpd_rpc_client_destroy(n->cl);
    n->cl = NULL;
    cl_kill9(&rn.cl, n->proc);
    msgpack_sbuffer_destroy(&n->xfer);
    *n = rn.nodes[--rn.n_nodes];
}

/* A fresh directory with the model, the scripted coordinator and no node. */
static inline int rn_setup(const char *tag, const char *model_args, uint32_t lease_ms)
{
    if (setup(NULL) != 0 || cl_init(&rn.cl, tag, model_args) != 0)
        return -1;
    rn_coordinator_start(lease_ms);
    return 0;
}

static inline int rn_teardown(void)
{
    /* every case passed: each node must drain and exit 0; after a failure
     * (a node may be stopped or wedged) cl_finish kills them at once
     * rather than wait up to a minute for each */
    const bool all_passed = rn.cl.passed == rn.cl.cases;
    while (all_passed && rn.n_nodes > 0)
        rn_node_stop(&rn.nodes[0]);
    while (rn.n_nodes > 0) {
        hpd_rpc_client_destroy(rn.nodes[rn.n_nodes - 1].cl);
        msgpack_sbuffer_destroy(&rn.nodes[--rn.n_nodes].xfer);
    }
    rn_coordinator_stop();
    cl_finish(&rn.cl); /* the directory stays unless every case passed */
    return teardown(NULL);
}

/* ------------------------------------------------------------ calls */

/* method(params packed by desc from msg) on node n; the reply in r. */
static inline void rn_call(rn_node_t *n, const char *method, const hpd_msg_desc_t *desc, const void *msg,
                    hpd_rpc_result_t *r)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    if (desc != NULL)
        hpd_msg_pack(desc, msg, &b.pk);
    else
        msgpack_pack_map(&b.pk, 0);
    const hpd_status_t st = hpd_rpc_call_sync(n->cl, method, &b, 60000, r);
    hpd_rpc_buf_destroy(&b);
    if (st != HPD_OK)
        fail_msg("%s to %s: %s", method, n->name, hpd_status_str(st));
}

/* A reply that must be an error with this code and message. */
static inline void rn_assert_error(hpd_rpc_result_t *r, int64_t code, const char *message)
{
    if (!r->is_error)
        fail_msg("no error where '%s' was expected", message);
    if (r->error_code != code || strcmp(r->error_message, message) != 0)
        fail_msg("error %lld '%s', expected %lld '%s'", (long long)r->error_code,
                 r->error_message, (long long)code, message);
    hpd_rpc_result_destroy(r);
}

/* A reply that must not be an error. */
static inline void rn_assert_ok(hpd_rpc_result_t *r, const char *what)
{
    if (r->is_error)
        fail_msg("%s: error %lld: %s", what, (long long)r->error_code, r->error_message);
}

/* The reply packed again (a reservation, relayed as it is). */
static inline void rn_repack(const hpd_rpc_result_t *r, msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, r->result);
}

/* reserve on decode node d: a job of prompt (n tokens) and max_tokens, the
 * rest of the reserve message from more (NULL: none). */
static inline void rn_reserve(rn_node_t *d, uint64_t job, const int32_t *prompt, uint32_t n,
                       uint32_t max_tokens, const hpd_msg_reserve_t *more, hpd_rpc_result_t *r)
{
    hpd_msg_reserve_t m = more != NULL ? *more : (hpd_msg_reserve_t){0};
    m.job = job;
    m.request = job;
    m.prompt = prompt;
    m.prompt_n = n;
    m.max_tokens = max_tokens;
    rn_stream(job);
    rn_call(d, "reserve", &hpd_msg_reserve, &m, r);
}

/* The prefill call's params: a job of prompt (n tokens) whose destination
 * is decode node d with reservation res (a reserve reply, packed), with
 * sampling raw (NULL: none), into b. */
static inline void rn_pack_prefill(hpd_rpc_buf_t *b, uint64_t job, const int32_t *prompt, uint32_t n,
                            const rn_node_t *d, const msgpack_sbuffer *res,
                            const void *sampling_raw, uint32_t sampling_len)
{
    hpd_rpc_buf_t dest;
    hpd_rpc_buf_init(&dest);
    const hpd_msg_destination_t dm = {.node = d->id,
                                      .xfer_raw = d->xfer.data,
                                      .xfer_raw_len = (uint32_t)d->xfer.size,
                                      .reservation_raw = res->data,
                                      .reservation_raw_len = (uint32_t)res->size};
    hpd_msg_pack(&hpd_msg_destination, &dm, &dest.pk);
    const hpd_msg_prefill_job_t m = {.job = job,
                                     .request = job,
                                     .prompt = prompt,
                                     .prompt_n = n,
                                     .sampling_raw = sampling_raw,
                                     .sampling_raw_len = sampling_len,
                                     .decode_raw = dest.sb.data,
                                     .decode_raw_len = (uint32_t)dest.sb.size};
    hpd_rpc_buf_init(b);
    hpd_msg_pack(&hpd_msg_prefill_job, &m, &b->pk);
    hpd_rpc_buf_destroy(&dest);
}

/* prefill on prefill node p (rn_pack_prefill's job), waiting for its reply */
static inline void rn_prefill(rn_node_t *p, uint64_t job, const int32_t *prompt, uint32_t n,
                       const rn_node_t *d, const msgpack_sbuffer *res, const void *sampling_raw,
                       uint32_t sampling_len, hpd_rpc_result_t *r)
{
    hpd_rpc_buf_t b;
    rn_pack_prefill(&b, job, prompt, n, d, res, sampling_raw, sampling_len);
    const hpd_status_t st = hpd_rpc_call_sync(p->cl, "prefill", &b, 60000, r);
    hpd_rpc_buf_destroy(&b);
    if (st != HPD_OK)
        fail_msg("prefill to %s: %s", p->name, hpd_status_str(st));
}

/* A reply that comes later (rn_prefill_async). */
typedef struct {
    bool done;
    hpd_status_t status;
    bool is_error;
    int64_t code;
    char message[256];
    hpd_msg_prefilled_t prefilled; /* a prefill's, when not an error */
} rn_reply_t;

static inline void rn_on_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    rn_reply_t *r = arg;
    hpd_proto_err_t err;
    r->done = true;
    r->status = st;
    if (st != HPD_OK)
        return;
    r->is_error = reply->is_error;
    if (reply->is_error) {
        r->code = reply->error_code;
        snprintf(r->message, sizeof(r->message), "%.*s", (int)reply->error_message_len,
                 reply->error_message);
    } else if (!hpd_msg_unpack(&hpd_msg_prefilled, reply->result, &r->prefilled, &err)) {
        fail_msg("prefill's reply: %s", err.text);
    }
}

/* prefill on p without waiting: its reply lands in *r */
static inline void rn_prefill_async(rn_node_t *p, uint64_t job, const int32_t *prompt, uint32_t n,
                             const rn_node_t *d, const msgpack_sbuffer *res, rn_reply_t *r)
{
    hpd_rpc_buf_t b;
    memset(r, 0, sizeof(*r));
    rn_pack_prefill(&b, job, prompt, n, d, res, NULL, 0);
    assert_int_equal(hpd_rpc_call(p->cl, "prefill", &b, 120000, rn_on_reply, r), HPD_OK);
    hpd_rpc_buf_destroy(&b);
}

static inline void rn_start_job(rn_node_t *d, uint64_t job, uint32_t first_token, hpd_rpc_result_t *r)
{
    const hpd_msg_start_t m = {.job = job, .first_token = first_token};
    rn_call(d, "start", &hpd_msg_start, &m, r);
}

static inline void rn_cancel(rn_node_t *n, uint64_t job, uint64_t writer)
{
    hpd_rpc_result_t r;
    const hpd_msg_cancel_job_t m = {.job = job, .writer = writer};
    rn_call(n, "cancel", &hpd_msg_cancel_job, &m, &r);
    rn_assert_ok(&r, "cancel");
    assert_int_equal(r.result.type, MSGPACK_OBJECT_NIL);
    hpd_rpc_result_destroy(&r);
}

/* A number at path ("load.jobs_done") in node n's stats. */
static inline uint64_t rn_stat(rn_node_t *n, const char *path)
{
    hpd_rpc_result_t r;
    rn_call(n, "stats", NULL, NULL, &r);
    rn_assert_ok(&r, "stats");
    const uint64_t v = cl_u64_at(&r.result, path);
    hpd_rpc_result_destroy(&r);
    return v;
}

/* The whole request, as the coordinator runs it: reserve on d, prefill on
 * p, start on d with the first token; waits for the last token. The
 * stream's ids are the answer (the first token included). */
static inline rn_stream_t *rn_generate(rn_node_t *p, rn_node_t *d, uint64_t job, const int32_t *prompt,
                                uint32_t n, uint32_t max_tokens, const hpd_msg_reserve_t *more,
                                hpd_msg_prefilled_t *prefilled)
{
    hpd_rpc_result_t r;
    msgpack_sbuffer res;
    hpd_proto_err_t err;
    rn_reserve(d, job, prompt, n, max_tokens, more, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_prefill(p, job, prompt, n, d, &res, more != NULL ? more->sampling_raw : NULL,
               more != NULL ? more->sampling_raw_len : 0, &r);
    msgpack_sbuffer_destroy(&res);
    rn_assert_ok(&r, "prefill");
    hpd_msg_prefilled_t pf = {0};
    if (!hpd_msg_unpack(&hpd_msg_prefilled, &r.result, &pf, &err))
        fail_msg("prefill's reply: %s", err.text);
    hpd_rpc_result_destroy(&r);
    /* the first token is the stream's before start is sent: the decode
     * node's first notification (index 1) may be read in the same turn of
     * the loop as start's reply, before rn_start_job returns */
    rn_stream_t *s = rn_stream(job);
    s->ids[0] = (int32_t)pf.first_token;
    s->n = HPD_MAX(s->n, 1u);
    rn_start_job(d, job, pf.first_token, &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(s->done, cl_check_alive(&rn.cl));
    if (prefilled != NULL)
        *prefilled = pf;
    return s;
}

/* hpd-run's max_tokens tokens for one prompt, with its flags. */
static inline void rn_reference(const int32_t *prompt, uint32_t n, int max_tokens, const char *flags,
                         int32_t *out)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/ref-prompt", rn.cl.root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (uint32_t t = 0; t < n; t++)
        fprintf(f, t ? ",%d" : "%d", prompt[t]);
    fprintf(f, "\n");
    fclose(f);
    cl_reference(&rn.cl, path, 1, max_tokens, flags, out);
}

/* n tokens below vocab from philox(seed) */
static inline void rn_prompt(int32_t *out, uint32_t n, uint64_t seed, uint32_t vocab)
{
    for (uint32_t t = 0; t < n; t++)
        out[t] = (int32_t)(hpd_philox4x32(seed, t, 0).v[0] % vocab);
}

#endif
