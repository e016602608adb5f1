/* The coordinator in-process (coordinator/coordinator.h) with scripted
 * peers (tests/coordinator/peers.h): fake prefill and decode nodes on the
 * test's loop, so that a policy costs milliseconds, not a cluster of real
 * processes:
 * - a request's path: reserve, prefill, start, the decode node's tokens;
 * - a decode node's tokens count only for its own jobs: another registered
 *   node cannot add tokens to, end or fail a request it does not hold;
 * - sick peers (coordinator/breaker.h): a decode node every pair fails
 *   with, and a prefill node that fails every job, are taken out of
 *   rotation, probed, and put back once a probe succeeds; every request
 *   finishes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/metrics.h"
#include "common/util.h"
#include "coordinator/chatreq.h"
#include "coordinator/coordinator.h"
#include "coordinator/text.h"
#include "tokenizer/chat.h"
#include "node/msg.h"
#include "tests/test_helpers.h"
#include "transport/rpc.h"
/* after the headers that name a parameter "base" */
#include "tests/transport/loop.h"
#include "tests/coordinator/peers.h"

/* The coordinator (opts as coord_start's) with a prefill node p0 and a
 * decode node d0 that completes each request it starts. */
static void pair_start(peer_t *p, peer_t *d, const hpd_coord_opts_t *opts)
{
    coord_start(opts);
    peer_start(p, "p0", true);
    peer_start(d, "d0", false);
    d->autocomplete = true;
}

static void pair_stop(peer_t *p, peer_t *d)
{
    peer_stop(p);
    peer_stop(d);
    coord_stop();
}

static void test_one_request(void **state)
{
    peer_t p, d;
    outcome_t o;
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    submit_request(&o, 4);
    LOOP_UNTIL(d.starts == 1);
    assert_int_equal(d.reserves, 1);
    assert_int_equal(p.prefills, 1);
    static const int32_t rest[] = {10, 11, 12};
    peer_tokens(&d, d.jobs[0].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_int_equal(o.n_tokens, 4);
    static const int32_t want[] = {7, 10, 11, 12};
    assert_memory_equal(o.tokens, want, sizeof(want));
    pair_stop(&p, &d);
}

/* Another decode node's notifications for a job it does not hold change
 * nothing: not its tokens, not its end, not an error. */
static void test_tokens_only_from_its_decode_node(void **state)
{
    peer_t p, d[2];
    outcome_t o;
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d[0], "d0", false);
    peer_start(&d[1], "d1", false);
    submit_request(&o, 4);
    LOOP_UNTIL(d[0].starts + d[1].starts == 1);
    peer_t *own = d[0].starts ? &d[0] : &d[1], *other = d[0].starts ? &d[1] : &d[0];
    const uint64_t job = own->jobs[0].job;
    /* the other node needs a connection from the coordinator to notify on:
     * a second request goes there (the first holds the other's slot) */
    outcome_t o2;
    submit_request(&o2, 4);
    LOOP_UNTIL(other->starts == 1);
    static const int32_t fake[] = {66, 66, 66};
    peer_tokens(other, job, 1, fake, 3, true, NULL);
    peer_tokens(other, job, 1, fake, 1, false, "a failure it made up");
    spin(50);
    assert_false(o.done);
    static const int32_t rest[] = {10, 11, 12};
    peer_tokens(own, job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    static const int32_t want[] = {7, 10, 11, 12};
    assert_int_equal(o.n_tokens, 4);
    assert_memory_equal(o.tokens, want, sizeof(want));
    assert_int_equal(o.attempts, 1);
    peer_tokens(other, other->jobs[0].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o2.done);
    assert_int_equal(o2.outcome, HPD_COORD_FINISHED);
    peer_stop(&p);
    peer_stop(&d[0]);
    peer_stop(&d[1]);
    coord_stop();
}

/* Runs n requests one after the other, each to its end. */
static void run_requests(uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        outcome_t o;
        submit_request(&o, 4);
        LOOP_UNTIL(o.done);
        if (o.outcome != HPD_COORD_FINISHED)
            fail_msg("request %u: %s", i, o.error);
    }
}

/* A decode node every pair fails with (its data plane cannot be reached)
 * is routed around: after two failed pairs it takes no new work (on
 * 02a8551 it kept getting every request, each failing there first); after
 * its cooldown one request probes it; while it stays bad the probes fail
 * (and it stays out, for longer); once it is reachable again a probe
 * succeeds and it is back in rotation. Every request finishes. */
static void test_sick_decode_node_routed_around(void **state)
{
    peer_t p, good, bad;
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&good, "d-good", false);
    peer_start(&bad, "d-bad", false);
    bad.autocomplete = good.autocomplete = true;
    p.fail_dest = bad.node_id;
    /* equal nodes take turns (routing.h): requests until the bad one has
     * had its two failed pairs, then more: none goes there */
    uint32_t sent = 0;
    while (bad.reserves < 2 && sent < 200) {
        run_requests(1);
        sent++;
    }
    assert_int_equal(bad.reserves, 2);
    run_requests(8);
    sent += 8;
    assert_int_equal(bad.reserves, 2); /* two failed pairs, then out */
    assert_int_equal(good.starts, sent); /* every request ended there */
    assert_int_equal(bad.starts, 0);
    /* its cooldown (1 s) over, one request probes it; still bad */
    const double t0 = hpd_time_now();
    while (bad.reserves < 3) {
        if (hpd_time_now() - t0 > 60)
            fail_msg("no probe of the sick decode node in 60 s");
        run_requests(1);
        usleep(50 * 1000);
    }
    assert_int_equal(bad.reserves, 3);
    run_requests(3); /* out again (2 s): nothing goes there */
    assert_int_equal(bad.reserves, 3);
    /* it recovers: the next probe succeeds, and it serves again */
    p.fail_dest = 0;
    const double t1 = hpd_time_now();
    while (bad.starts == 0) {
        if (hpd_time_now() - t1 > 60)
            fail_msg("the recovered decode node got no work in 60 s");
        run_requests(1);
        usleep(50 * 1000);
    }
    const uint32_t before = bad.starts;
    for (sent = 0; bad.starts == before && sent < 200; sent++)
        run_requests(1); /* back in rotation: it takes its turns */
    assert_true(bad.starts > before);
    peer_stop(&p);
    peer_stop(&good);
    peer_stop(&bad);
    coord_stop();
}

/* A probe that ends neither way (its request canceled while the probe is
 * out) lets the next request probe at once: on 706f7f3's parent the slot
 * stayed taken for 30 s (HPD_BREAKER_PROBE_S) and, with no other node, the
 * next request waited all that time. */
static void test_probe_ended_neither_way(void **state)
{
    peer_t p, d;
    outcome_t a, b;
    pair_start(&p, &d, NULL);
    p.fail_dest = d.node_id;
    const uint64_t id = submit_request(&a, 4);
    LOOP_UNTIL(p.prefills == 2); /* two failed pairs: both nodes out for 1 s */
    spin(20);
    assert_false(a.done);
    p.fail_dest = 0;
    p.mode = PEER_HOLD;
    LOOP_UNTIL(p.prefills == 3); /* after the cooldown its third attempt probes both */
    assert_true(hpd_coord_cancel(coord, id, "the client went away"));
    LOOP_UNTIL(a.done);
    assert_int_equal(a.outcome, HPD_COORD_CANCELED);
    p.mode = PEER_ANSWER;
    const double t0 = hpd_time_now();
    submit_request(&b, 4);
    LOOP_UNTIL(b.done);
    const double took = hpd_time_now() - t0;
    assert_int_equal(b.outcome, HPD_COORD_FINISHED);
    if (took > 10)
        fail_msg("the next request waited %.1f s for the canceled probe's slot", took);
    pair_stop(&p, &d);
}

/* The rendered metrics hold sample `want` (its labels and value, as
 * `name{labels} value`, or a HELP line). */
static void assert_metric(const char *text, const char *want)
{
    if (strstr(text, want) == NULL)
        fail_msg("no \"%s\" in the metrics:\n%s", want, text);
}

/* hpd_request_hedges_total now. */
static unsigned hedges_started(void)
{
    size_t len;
    char *text = hpd_metrics_render(hpd_coord_metrics(coord), &len);
    assert_non_null(text);
    const char *at = strstr(text, "\nhpd_request_hedges_total ");
    assert_non_null(at);
    const unsigned n = (unsigned)strtoul(at + strlen("\nhpd_request_hedges_total "), NULL, 10);
    free(text);
    return n;
}

/* What an operator reads: the limits of the nodes registered, the health
 * line, the metrics after one request (finished, with its time per output
 * token from its own tokens), a cancel that names one request of two. */
static void test_what_an_operator_reads(void **state)
{
    peer_t p, d, d1;
    outcome_t o, held[2];
    char msg[200];
    uint32_t vocab, ctx;
    coord_start(NULL);
    hpd_coord_limits(coord, &vocab, &ctx);
    assert_true(vocab == 0 && ctx == 0);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    hpd_coord_limits(coord, &vocab, &ctx);
    assert_int_equal(vocab, 1000);
    assert_int_equal(ctx, 4096);
    assert_true(hpd_coord_health(coord, msg, sizeof(msg)));
    assert_string_equal(msg, "ok: 1 prefill and 1 decode nodes, 0 open requests");
    /* node ids: the milliseconds since 2020 times 2^14 at the start, new
     * across restarts */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    const double ms = (double)wall.tv_sec * 1e3 - 1577836800000.0;
    if (!(fabs((double)(p.node_id >> 14) - ms) < 60e3))
        fail_msg("node id %llu is not from the milliseconds since 2020 (%.0f)",
                 (unsigned long long)p.node_id, ms);
    /* a node of another model is refused, saying why */
    peer_t other;
    peer_model = 8;
    peer_start(&other, "p-other", true);
    peer_model = 9;
    assert_true(other.refused);
    assert_string_equal(other.refusal, "register: node p-other serves a different model than "
                                       "the cluster (fingerprint differs)");
    peer_stop(&other);

    submit_request(&o, 4);
    LOOP_UNTIL(d.starts == 1);
    static const int32_t rest[] = {10, 11, 12};
    usleep(20 * 1000); /* the tokens after the first take 20 ms */
    peer_tokens(&d, d.jobs[0].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    peer_start(&d1, "d1", false); /* counted by role: 2 decode nodes, 1 prefill node */
    hpd_coord_collect(coord);
    size_t len;
    char *text = hpd_metrics_render(hpd_coord_metrics(coord), &len);
    assert_non_null(text);
    assert_metric(text, "hpd_requests_total{outcome=\"ok\"} 1\n");
    assert_metric(text, "hpd_requests_total{outcome=\"invalid\"} 0\n");
    assert_metric(text, "hpd_nodes{role=\"prefill\"} 1\n");
    assert_metric(text, "hpd_nodes{role=\"decode\"} 2\n");
    assert_metric(text, "# HELP hpd_request_duration_seconds Time from submit to the last "
                        "token.\n");
    assert_metric(text, "hpd_tpot_seconds_count 1\n");
    assert_metric(text, "hpd_prompt_tokens_total 5\n");
    assert_metric(text, "hpd_generated_tokens_total 4\n");
    assert_metric(text, "hpd_prefix_cache_hit_tokens_total 0\n");
    const char *sum = strstr(text, "hpd_tpot_seconds_sum ");
    assert_non_null(sum);
    const double tpot = strtod(sum + strlen("hpd_tpot_seconds_sum "), NULL);
    if (!(tpot > 0.004 && tpot < 2)) /* 20 ms over 3 tokens, on a loaded host */
        fail_msg("time per output token %g s", tpot);
    free(text);

    /* a cancel ends the request it names, not an older one */
    p.mode = PEER_HOLD;
    submit_request(&held[0], 4);
    const uint64_t second = submit_request(&held[1], 4);
    LOOP_UNTIL(p.prefills == 3);
    assert_false(hpd_coord_cancel(coord, second + 1, "no such request"));
    assert_true(hpd_coord_cancel(coord, second, "the client went away"));
    LOOP_UNTIL(held[1].done);
    assert_int_equal(held[1].outcome, HPD_COORD_CANCELED);
    spin(20);
    assert_false(held[0].done);
    peer_stop(&p);
    peer_stop(&d);
    peer_stop(&d1);
    coord_stop();
}

/* With every connection it may hold taken by nodes, a new one is turned
 * away and the health line says so, with the counts an operator needs. */
static void test_refusing_connections(void **state)
{
    peer_t p, d;
    char msg[200];
    hpd_coord_opts_t o = {.max_connections = 2};
    coord_start(&o);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    assert_true(hpd_coord_health(coord, msg, sizeof(msg)));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(hpd_coord_port(coord)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    LOOP_UNTIL(!hpd_coord_health(coord, msg, sizeof(msg)));
    const char *want = "refusing connections: 2 open (limit 2), 1 refused, the last ";
    if (strncmp(msg, want, strlen(want)) != 0 || strstr(msg, " s ago") == NULL)
        fail_msg("health: '%s'", msg);
    close(fd);
    peer_stop(&p);
    peer_stop(&d);
    coord_stop();
}

/* A node whose registration closed is lost, and the coordinator closes
 * its own connection to the node too (the reaper frees it after the
 * events of the loss), whatever else stays up. */
static void test_lost_node_is_let_go(void **state)
{
    peer_t p, d;
    hpd_rpc_server_stats_t st;
    outcome_t o;
    pair_start(&p, &d, NULL);
    submit_request(&o, 4); /* the coordinator has talked to both */
    LOOP_UNTIL(o.done);
    hpd_rpc_server_stats(d.server, &st);
    assert_true(st.open >= 1);
    hpd_rpc_client_destroy(d.reg);
    d.reg = NULL;
    LOOP_UNTIL((hpd_rpc_server_stats(d.server, &st), st.open == 0));
    char msg[200];
    hpd_coord_health(coord, msg, sizeof(msg));
    assert_string_equal(msg, "ok: 1 prefill and 0 decode nodes, 0 open requests");
    pair_stop(&p, &d);
}

/* Liveness pings every 100 ms for the peers in pinging[] (NULL: silent). */
static peer_t *pinging[4];

static void on_ping_tick(evutil_socket_t fd, short what, void *arg)
{
    for (int i = 0; i < 4; i++)
        if (pinging[i] != NULL)
            peer_ping(pinging[i], pinging[i]->alive_key);
}

static struct event *ping_tick;

/* Liveness pings every 100 ms for the peers given, from now on. */
static void pings_start(peer_t *a, peer_t *b, peer_t *c)
{
    pinging[0] = a;
    pinging[1] = b;
    pinging[2] = c;
    ping_tick = event_new(base, -1, EV_PERSIST, on_ping_tick, NULL);
    const struct timeval every = {0, 100 * 1000};
    event_add(ping_tick, &every);
}

static void pings_stop(void)
{
    event_free(ping_tick);
    ping_tick = NULL;
    memset(pinging, 0, sizeof(pinging));
}

/* With liveness on (--liveness-ms 500), pings are the nodes' own: one with
 * a key that is not its registration's is refused, saying so; a prefill
 * node whose pings stop while it holds a request is suspect within a
 * second and the request runs again on the other one. */
static void test_liveness_pings(void **state)
{
    peer_t p[2], d;
    outcome_t o;
    const hpd_coord_opts_t opts = {.liveness_ms = 500};
    coord_start(&opts);
    peer_start(&p[0], "p0", true);
    peer_start(&p[1], "p1", true);
    peer_start(&d, "d0", false);
    d.autocomplete = true;
    assert_true(p[0].alive_key != 0 && p[0].alive_key != p[1].alive_key);
    pings_start(&p[0], &p[1], &d);
    peer_ping(&p[0], p[0].alive_key ^ 1);
    LOOP_UNTIL(p[0].pings_refused == 1);
    assert_int_equal(p[0].pings_ok, 0); /* the tick's first pings come later */
    char want[120];
    snprintf(want, sizeof(want), "alive: node %llu is not registered with that key",
             (unsigned long long)p[0].node_id);
    assert_string_equal(p[0].ping_error, want);

    p[0].mode = p[1].mode = PEER_HOLD;
    submit_request(&o, 4);
    LOOP_UNTIL(p[0].prefills + p[1].prefills == 1);
    const int holder = p[0].prefills == 1 ? 0 : 1;
    LOOP_UNTIL(p[holder].pings_ok >= 3);
    assert_int_equal(p[holder].pings_refused, holder == 0); /* the wrong key's */
    pinging[holder] = NULL; /* its pinger stops: as a stopped process */
    p[1 - holder].mode = PEER_ANSWER;
    const double t0 = hpd_time_now();
    while (!o.done && hpd_time_now() - t0 < 10)
        spin(10);
    if (!o.done)
        fail_msg("the request held by the silent prefill node did not move in 10 s");
    /* moved as the node went suspect, not once it was lost (2 s) */
    char msg[200];
    hpd_coord_health(coord, msg, sizeof(msg));
    assert_string_equal(msg, "ok: 2 prefill and 1 decode nodes, 0 open requests");
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_int_equal(o.attempts, 2);
    assert_int_equal(p[1 - holder].prefills, 1);
    pings_stop();
    peer_stop(&p[0]);
    peer_stop(&p[1]);
    peer_stop(&d);
    coord_stop();
}

/* The coordinator's status, asked on p's registration connection (a
 * node's view); the entry of node `name`. */
static const msgpack_object *status_of(peer_t *p, hpd_rpc_result_t *r, const char *name)
{
    assert_int_equal(hpd_rpc_call_sync(p->reg, "status", NULL, 30000, r), HPD_OK);
    assert_false(r->is_error);
    const msgpack_object *nodes = hpd_rpc_map_get(&r->result, "nodes");
    assert_non_null(nodes);
    for (uint32_t i = 0; i < nodes->via.array.size; i++) {
        const msgpack_object *n = &nodes->via.array.ptr[i], *nm = hpd_rpc_map_get(n, "name");
        if (nm != NULL && hpd_rpc_str_eq(nm->via.str.ptr, nm->via.str.size, name))
            return n;
    }
    fail_msg("no node %s in the status", name);
    return NULL;
}

static uint64_t u64_of(const msgpack_object *m, const char *key)
{
    const msgpack_object *v = hpd_rpc_map_get(m, key);
    if (v == NULL || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        fail_msg("no number %s", key);
    return v->via.u64;
}

/* A msgpack client's generate call: its reply, or its error. */
typedef struct {
    bool done, is_error;
    char message[300];
    hpd_msg_generated_t g;
    char text[256]; /* g.text, kept */
} called_t;

static void on_generated(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    called_t *c = arg;
    hpd_proto_err_t err;
    c->done = true;
    assert_int_equal(st, HPD_OK);
    c->is_error = reply->is_error;
    if (reply->is_error)
        snprintf(c->message, sizeof(c->message), "%.*s", (int)reply->error_message_len,
                 reply->error_message);
    else if (!hpd_msg_unpack(&hpd_msg_generated, reply->result, &c->g, &err))
        fail_msg("generate's reply: %s", err.text);
    else
        snprintf(c->text, sizeof(c->text), "%.*s", (int)c->g.text_len, (const char *)c->g.text);
}

/* Calls generate with params (a packed map) and waits for the answer. */
static void generate(hpd_rpc_client_t *cl, const hpd_msg_generate_t *m, called_t *c)
{
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_generate, m, &b.pk);
    memset(c, 0, sizeof(*c));
    assert_int_equal(hpd_rpc_call(cl, "generate", &b, 30000, on_generated, c), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(c->done);
}

/* pair_start on a coordinator with a client key, and a msgpack client
 * connected with it. */
static hpd_rpc_client_t *keyed_pair_start(peer_t *p, peer_t *d, const hpd_coord_opts_t *opts)
{
    static const char key[] = "client-key-of-tenant-t-0123456789";
    hpd_rpc_client_t *cl;
    peer_client_key = key;
    pair_start(p, d, opts);
    peer_client_key = NULL;
    const hpd_rpc_client_params_t cp = {.base = base, .host = "127.0.0.1",
                                        .port = hpd_coord_port(coord), .token = key};
    assert_int_equal(hpd_rpc_client_connect(&cp, &cl), HPD_OK);
    return cl;
}

/* generate over msgpack RPC with a client key, on a coordinator without a
 * model: token ids are served (the reply holds them and why the request
 * ended); text, detokenize and a request the coordinator refuses are
 * errors that say what was wrong, and a client's key cannot ping as a
 * node. */
static void test_generate_over_rpc(void **state)
{
    peer_t p, d;
    called_t c;
    hpd_rpc_client_t *cl = keyed_pair_start(&p, &d, NULL);

    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4}, &c);
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    static const int32_t want[] = {7, 10, 11, 12};
    assert_int_equal(c.g.tokens_n, 4);
    assert_memory_equal(c.g.tokens, want, sizeof(want));
    assert_string_equal(c.g.finish_reason, "length");
    assert_true(c.g.request > 0);
    assert_int_equal(c.g.prompt_tokens, 5);
    hpd_msg_free(&hpd_msg_generated, &c.g);

    static const uint8_t text[] = "hello";
    generate(cl, &(hpd_msg_generate_t){.text = text, .text_len = 5, .max_tokens = 4}, &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: a prompt as text or messages needs the "
                                   "coordinator's model (--model): send token ids");
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                       .detokenize = true}, &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: detokenize and stop need the coordinator's "
                                   "model (--model)");
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 0, .max_tokens = 4}, &c);
    assert_true(c.is_error);
    if (strstr(c.message, "prompt") == NULL)
        fail_msg("an empty prompt refused with \"%s\"", c.message);

    /* the status: a node's view holds the nodes' addresses, a client's not */
    hpd_rpc_result_t r;
    const msgpack_object *n = status_of(&p, &r, "d0");
    assert_non_null(hpd_rpc_map_get(n, "address"));
    hpd_rpc_result_destroy(&r);
    assert_int_equal(hpd_rpc_call_sync(cl, "status", NULL, 30000, &r), HPD_OK);
    assert_false(r.is_error);
    const msgpack_object *nodes = hpd_rpc_map_get(&r.result, "nodes");
    assert_int_equal(nodes->via.array.size, 2);
    for (uint32_t i = 0; i < 2; i++)
        assert_null(hpd_rpc_map_get(&nodes->via.array.ptr[i], "address"));
    hpd_rpc_result_destroy(&r);

    /* a client's key is no node's: its ping is refused */
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_alive, &(hpd_msg_alive_t){.node_id = p.node_id, .key = 1}, &b.pk);
    memset(&c, 0, sizeof(c));
    assert_int_equal(hpd_rpc_call(cl, "alive", &b, 30000, on_generated, &c), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(c.done);
    assert_true(c.is_error);
    hpd_rpc_client_destroy(cl);
    pair_stop(&p, &d);
}

/* A msgpack client's cancel names its request by its tag: of two open
 * requests on one connection only the tagged one ends ("canceled"), an
 * unknown tag cancels nothing, and another connection's request with the
 * same tag is not touched; a closed connection cancels its own requests
 * only. */
/* A call whose connection the test closes: only that it was answered. */
static void on_answered_or_closed(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    *(bool *)arg = true;
}

static void test_cancel_by_tag_over_rpc(void **state)
{
    peer_t p, d;
    called_t c[4]; /* the other connection's tag 2, then this one's tags 1 and 2, then 3 */
    hpd_rpc_client_t *cl = keyed_pair_start(&p, &d, NULL), *other;
    d.autocomplete = false;
    const hpd_rpc_client_params_t cp = {.base = base, .host = "127.0.0.1",
                                        .port = hpd_coord_port(coord),
                                        .token = "client-key-of-tenant-t-0123456789"};
    assert_int_equal(hpd_rpc_client_connect(&cp, &other), HPD_OK);
    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    static const uint64_t tags[] = {2, 1, 2, 3};
    for (uint32_t i = 0; i < 4; i++) {
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        hpd_msg_pack(&hpd_msg_generate,
                     &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                           .tag = tags[i]},
                     &b.pk);
        memset(&c[i], 0, sizeof(c[i]));
        if (i == 3) /* its connection closes under it */
            assert_int_equal(hpd_rpc_call(cl, "generate", &b, 30000, on_answered_or_closed,
                                          &c[i].done),
                             HPD_OK);
        else
            assert_int_equal(hpd_rpc_call(i == 0 ? other : cl, "generate", &b, 30000,
                                          on_generated, &c[i]),
                             HPD_OK);
        hpd_rpc_buf_destroy(&b);
        LOOP_UNTIL(d.starts == i + 1);
    }
    hpd_rpc_result_t r;
    for (uint64_t tag = 9; tag != 0; tag = tag == 9 ? 2 : 0) {
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        hpd_msg_pack(&hpd_msg_cancel_request, &(hpd_msg_cancel_request_t){.tag = tag}, &b.pk);
        assert_int_equal(hpd_rpc_call_sync(cl, "cancel", &b, 30000, &r), HPD_OK);
        hpd_rpc_buf_destroy(&b);
        assert_false(r.is_error);
        const msgpack_object *v = hpd_rpc_map_get(&r.result, "canceled");
        assert_non_null(v);
        assert_true(v->via.boolean == (tag == 2));
        hpd_rpc_result_destroy(&r);
    }
    LOOP_UNTIL(c[2].done);
    assert_true(c[2].is_error);
    if (strstr(c[2].message, "cancel") == NULL)
        fail_msg("the canceled request answered \"%s\"", c[2].message);
    assert_false(c[0].done || c[1].done || c[3].done);
    assert_false(d.jobs[0].canceled || d.jobs[1].canceled);
    /* tag 1 runs on */
    static const int32_t rest[] = {10, 11, 12};
    peer_tokens(&d, d.jobs[1].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(c[1].done);
    if (c[1].is_error)
        fail_msg("generate: %s", c[1].message);
    assert_int_equal(c[1].g.tokens_n, 4);
    hpd_msg_free(&hpd_msg_generated, &c[1].g);
    /* this connection closes with tag 3 open: it ends, the other's not */
    hpd_rpc_client_destroy(cl);
    LOOP_UNTIL(d.jobs[3].canceled);
    assert_false(d.jobs[0].canceled || c[0].done);
    peer_tokens(&d, d.jobs[0].job, 1, rest, 3, true, NULL);
    LOOP_UNTIL(c[0].done);
    if (c[0].is_error)
        fail_msg("generate: %s", c[0].message);
    hpd_msg_free(&hpd_msg_generated, &c[0].g);
    hpd_rpc_client_destroy(other);
    pair_stop(&p, &d);
}

/* A decode node that answers a reservation with "no room" (its frees
 * behind the coordinator's count): the request waits and asks again, with
 * no failed attempt, and runs once there is room. */
static void test_full_decode_node_waits(void **state)
{
    peer_t p, d;
    outcome_t o;
    pair_start(&p, &d, NULL);
    d.mode = PEER_FAIL_PARAMS; /* reserve: HPD_RPC_ERR_OVERLOADED */
    submit_request(&o, 4);
    LOOP_UNTIL(d.reserves >= 2);
    assert_false(o.done);
    assert_int_equal(p.prefills, 0);
    d.mode = PEER_ANSWER;
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_int_equal(o.attempts, 1);
    pair_stop(&p, &d);
}

/* The drain: new requests are refused, open ones go on and are counted;
 * at its end those still open fail saying why, and the nodes are told to
 * shut down only when asked (not for a restart of the coordinator). */
static void test_drain(void **state)
{
    peer_t p, d;
    outcome_t o[2];
    char msg[200], err[300];
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    p.mode = PEER_HOLD;
    submit_request(&o[0], 4);
    submit_request(&o[1], 4);
    LOOP_UNTIL(p.prefills == 2);
    hpd_coord_drain(coord);
    assert_true(hpd_coord_draining(coord));
    assert_int_equal(hpd_coord_open_requests(coord), 2);
    assert_false(hpd_coord_health(coord, msg, sizeof(msg)));
    assert_string_equal(msg, "draining: 1 prefill and 1 decode nodes, 2 open requests");
    static const int32_t prompt[] = {1, 2, 3};
    const hpd_coord_request_t q = {.prompt = prompt, .n_prompt = 3, .max_tokens = 4};
    const hpd_coord_sink_t sink = {.done = sink_done, .arg = &o[0]};
    uint64_t id;
    assert_true(hpd_coord_submit(coord, &q, &sink, &id, err, sizeof(err)) != 0);
    if (strstr(err, "draining") == NULL)
        fail_msg("a request while draining refused with \"%s\"", err);

    hpd_coord_end_drain(coord, false); /* a restart: the nodes stay up */
    LOOP_UNTIL(o[0].done && o[1].done);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(o[i].outcome, HPD_COORD_FAILED);
        if (strstr(o[i].error, "drain deadline passed") == NULL)
            fail_msg("request %d ended with \"%s\"", i, o[i].error);
    }
    assert_int_equal(hpd_coord_open_requests(coord), 0);
    spin(50);
    assert_int_equal(p.shutdowns + d.shutdowns, 0);
    hpd_coord_end_drain(coord, true);
    LOOP_UNTIL(p.shutdowns == 1 && d.shutdowns == 1);
    pair_stop(&p, &d);
}

/* A prefill node that fails every job (not a pair's fault: its engine) is
 * taken out of rotation too; the other prefill node serves. */
static void test_failing_prefill_node_routed_around(void **state)
{
    peer_t bad, good, d;
    coord_start(NULL);
    peer_start(&bad, "p-bad", true);
    peer_start(&good, "p-good", true);
    peer_start(&d, "d0", false);
    d.autocomplete = true;
    bad.mode = PEER_FAIL_PEER; /* every job fails */
    run_requests(8);
    assert_true(bad.prefills <= 2);
    assert_int_equal(good.prefills, 8);
    peer_stop(&bad);
    peer_stop(&good);
    peer_stop(&d);
    coord_stop();
}

/* A request that comes while no prefill or decode node is registered
 * waits in the queue (on 02a8551 it failed at once: "no prefill node is
 * registered") and runs once they register; with none for its queue
 * timeout it fails saying so. */
static void test_waits_for_nodes(void **state)
{
    peer_t p, d;
    outcome_t o, late;
    const hpd_coord_opts_t opts = {.queue_timeout_ms = 1500};
    coord_start(&opts);
    submit_request(&o, 4);
    spin(50);
    assert_false(o.done);
    peer_start(&p, "p0", true); /* a prefill node alone is not enough */
    spin(50);
    assert_false(o.done);
    peer_start(&d, "d0", false);
    d.autocomplete = true;
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    /* the decode node goes: a new request waits, and its timeout ends it */
    peer_stop(&d);
    spin(50);
    submit_request(&late, 4);
    LOOP_UNTIL(late.done);
    assert_int_equal(late.outcome, HPD_COORD_FAILED);
    assert_int_equal(late.code, HPD_RPC_ERR_OVERLOADED);
    assert_string_equal(late.error, "no node could take the request within 1500 ms (no room "
                                    "or no nodes)");
    hpd_coord_collect(coord);
    size_t len;
    char *text = hpd_metrics_render(hpd_coord_metrics(coord), &len);
    assert_non_null(text);
    assert_metric(text, "hpd_node_losses_total 1\n");
    assert_metric(text, "hpd_requests_total{outcome=\"overloaded\"} 1\n");
    free(text);
    peer_stop(&p);
    coord_stop();
}


/* A request streaming from a decode node that goes silent after two
 * tokens: it is suspect, and the request is raced by a copy started on
 * the other decode node (its reserve replays the two tokens). Returns
 * which node held it. */
static int decoding_then_silent(peer_t *p, peer_t d[2], outcome_t *o, int32_t stop_at)
{
    const hpd_coord_opts_t opts = {.liveness_ms = 500};
    coord_start(&opts);
    peer_start(p, "p0", true);
    peer_start(&d[0], "d0", false);
    peer_start(&d[1], "d1", false);
    pings_start(p, &d[0], &d[1]);
    submit_request(o, 6);
    o->stop_at = stop_at;
    LOOP_UNTIL(d[0].starts + d[1].starts == 1);
    const int h = d[0].starts ? 0 : 1;
    static const int32_t second[] = {10};
    peer_tokens(&d[h], d[h].jobs[0].job, 1, second, 1, false, NULL);
    LOOP_UNTIL(o->n_streamed == 2);
    pinging[1 + h] = NULL; /* d[h]'s pinger stops */
    LOOP_UNTIL(d[1 - h].starts == 1);
    assert_int_equal(d[1 - h].jobs[0].replay_n, 2);
    assert_false(o->done);
    assert_false(d[h].jobs[0].canceled); /* raced, not canceled */
    return h;
}

/* Hedging: the copy finishes first and answers; the silent node's
 * attempt is canceled, its late tokens change nothing, and the client saw
 * each token once, in order. (Before hedging the attempt was canceled and
 * run again at once: the same answer, with the silent node's work thrown
 * away even where it came back first.) */
static void test_hedge_wins(void **state)
{
    peer_t p, d[2];
    outcome_t o;
    const int h = decoding_then_silent(&p, d, &o, 0);
    const uint64_t job = d[h].jobs[0].job;
    static const int32_t rest[] = {11, 12, 13, 14};
    peer_tokens(&d[1 - h], d[1 - h].jobs[0].job, 2, rest, 4, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_string_equal(o.finish_reason, "length");
    static const int32_t all[] = {7, 10, 11, 12, 13, 14};
    assert_int_equal(o.n_tokens, 6);
    assert_memory_equal(o.tokens, all, sizeof(all));
    assert_int_equal(o.n_streamed, 6);
    assert_memory_equal(o.streamed, all, sizeof(all));
    assert_false(o.streamed_wrong);
    assert_int_equal(o.attempts, 2);
    LOOP_UNTIL(d[h].jobs[0].canceled);
    static const int32_t late[] = {66, 66};
    peer_tokens(&d[h], job, 2, late, 2, true, NULL);
    spin(50);
    assert_int_equal(o.n_streamed, 6);
    assert_int_equal(hpd_coord_open_requests(coord), 0);
    hpd_coord_collect(coord);
    size_t len;
    char *text = hpd_metrics_render(hpd_coord_metrics(coord), &len);
    assert_non_null(text);
    assert_metric(text, "hpd_requests_total{outcome=\"ok\"} 1\n");
    assert_metric(text, "hpd_request_hedges_total 1\n");
    assert_metric(text, "hpd_request_hedge_wins_total 1\n");
    assert_metric(text, "hpd_request_retries_total 0\n");
    free(text);
    char msg[200];
    hpd_coord_health(coord, msg, sizeof(msg));
    assert_string_equal(msg, "ok: 1 prefill and 2 decode nodes, 0 open requests");
    pings_stop();
    peer_stop(&d[0]);
    pair_stop(&p, &d[1]);
}

/* A stop string in what the hedge streams ends the request ("stop", the
 * tokens up to it) and both attempts. */
static void test_stop_string_from_a_hedge(void **state)
{
    peer_t p, d[2];
    outcome_t o;
    const int h = decoding_then_silent(&p, d, &o, 12);
    static const int32_t rest[] = {11, 12};
    peer_tokens(&d[1 - h], d[1 - h].jobs[0].job, 2, rest, 2, false, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_string_equal(o.finish_reason, "stop");
    static const int32_t all[] = {7, 10, 11, 12};
    assert_int_equal(o.n_tokens, 4);
    assert_memory_equal(o.tokens, all, sizeof(all));
    LOOP_UNTIL(d[h].jobs[0].canceled && d[1 - h].jobs[0].canceled);
    pings_stop();
    peer_stop(&d[0]);
    pair_stop(&p, &d[1]);
}

/* The raced attempt finishes first: a prefill node that went silent
 * while it held a prompt pings again and answers; the request finishes
 * from it, and its hedge (held on the other prefill node, with a decode
 * slot of its own) is canceled on both of its nodes. A client's cancel
 * by id cannot name a hedge. */
static void test_raced_attempt_wins(void **state)
{
    peer_t p[2], d;
    outcome_t o;
    const hpd_coord_opts_t opts = {.liveness_ms = 500};
    coord_start(&opts);
    peer_start(&p[0], "p0", true);
    peer_start(&p[1], "p1", true);
    peer_start(&d, "d0", false);
    d.autocomplete = true;
    p[0].mode = p[1].mode = PEER_HOLD;
    pings_start(&p[0], &p[1], &d);
    const uint64_t id = submit_request(&o, 4);
    LOOP_UNTIL(p[0].prefills + p[1].prefills == 1);
    const int h = p[0].prefills ? 0 : 1;
    pinging[h] = NULL;
    LOOP_UNTIL(p[1 - h].prefills == 1); /* the hedge, held there */
    assert_int_equal(d.reserves, 2);
    assert_false(hpd_coord_cancel(coord, id + 1, "not a client's request"));
    pinging[h] = &p[h]; /* it comes back, and answers first */
    LOOP_UNTIL(p[h].pings_ok >= 5);
    peer_answer_prefill(&p[h], p[h].jobs[0].job, 7);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    static const int32_t all[] = {7, 10, 11, 12};
    assert_int_equal(o.n_tokens, 4);
    assert_memory_equal(o.tokens, all, sizeof(all));
    assert_false(o.streamed_wrong);
    assert_int_equal(o.attempts, 2);
    /* the hedge is canceled: its prefill job, then its reservation */
    LOOP_UNTIL(p[1 - h].jobs[0].canceled);
    peer_job_t *hj = peer_job(&d, p[1 - h].jobs[0].job);
    assert_non_null(hj);
    LOOP_UNTIL(hj->canceled);
    assert_false(peer_job(&d, p[h].jobs[0].job)->canceled);
    hpd_coord_collect(coord);
    size_t len;
    char *text = hpd_metrics_render(hpd_coord_metrics(coord), &len);
    assert_non_null(text);
    assert_metric(text, "hpd_request_hedges_total 1\n");
    assert_metric(text, "hpd_request_hedge_wins_total 0\n");
    free(text);
    /* everything was given back: the next request runs */
    p[0].mode = p[1].mode = PEER_ANSWER;
    run_requests(2);
    pings_stop();
    peer_stop(&p[0]);
    peer_stop(&p[1]);
    peer_stop(&d);
    coord_stop();
}

/* A request held by a prefill node that goes silent is hedged on the
 * other one (held there too); then the silent node is lost, which fails
 * the request's own attempt (with --max-attempts 1, its last). Returns
 * which node held it. */
static int hedged_then_lost(peer_t p[2], peer_t *d, outcome_t *o, uint32_t max_attempts)
{
    const hpd_coord_opts_t opts = {.liveness_ms = 500, .max_attempts = max_attempts,
                                   .queue_timeout_ms = 1000};
    coord_start(&opts);
    peer_start(&p[0], "p0", true);
    peer_start(&p[1], "p1", true);
    peer_start(d, "d0", false);
    d->autocomplete = true;
    p[0].mode = p[1].mode = PEER_HOLD;
    pings_start(&p[0], &p[1], d);
    submit_request(o, 4);
    LOOP_UNTIL(p[0].prefills + p[1].prefills == 1);
    const int h = p[0].prefills ? 0 : 1;
    pinging[h] = NULL;
    LOOP_UNTIL(p[1 - h].prefills == 1);
    peer_stop(&p[h]); /* lost: the request's only attempt failed */
    spin(100);
    assert_false(o->done); /* it waits for its hedge, and is not placed again */
    assert_int_equal(p[1 - h].prefills, 1);
    assert_int_equal(d->reserves, 2);
    return h;
}

/* ... and the hedge answers: the request finishes, after 2 attempts
 * (its own, failed, and the hedge), whether or not it had attempts left. */
static void test_hedge_is_the_last_attempt(void **state)
{
    for (uint32_t max_attempts = 1; max_attempts <= 3; max_attempts += 2) {
        peer_t p[2], d;
        outcome_t o;
        const int h = hedged_then_lost(p, &d, &o, max_attempts);
        peer_answer_prefill(&p[1 - h], p[1 - h].jobs[0].job, 7);
        LOOP_UNTIL(o.done);
        if (o.outcome != HPD_COORD_FINISHED)
            fail_msg("the request ended with \"%s\" while its hedge ran", o.error);
        static const int32_t all[] = {7, 10, 11, 12};
        assert_memory_equal(o.tokens, all, sizeof(all));
        assert_int_equal(o.attempts, 2);
        pings_stop();
        pair_stop(&p[1 - h], &d);
    }
}

/* ... and the hedge fails too: with no attempts left the request gives
 * up, saying after how many; with attempts left it runs again, though it
 * waited for the hedge longer than its queue timeout. */
static void test_hedge_fails_too(void **state)
{
    for (uint32_t max_attempts = 1; max_attempts <= 3; max_attempts += 2) {
        peer_t p[2], d;
        outcome_t o;
        const int h = hedged_then_lost(p, &d, &o, max_attempts);
        if (max_attempts > 1)
            spin(1500);
        p[1 - h].mode = PEER_ANSWER;
        peer_answer_error(&p[1 - h], p[1 - h].jobs[0].job, HPD_RPC_ERR_PARAMS);
        LOOP_UNTIL(o.done);
        if (max_attempts == 1) {
            assert_int_equal(o.outcome, HPD_COORD_FAILED);
            if (strstr(o.error, "gave up after 2 attempts") == NULL)
                fail_msg("the request failed with \"%s\"", o.error);
            assert_int_equal(o.attempts, 2);
        } else {
            if (o.outcome != HPD_COORD_FINISHED)
                fail_msg("the request ended with \"%s\" after its hedge failed", o.error);
            assert_int_equal(o.attempts, 3);
        }
        pings_stop();
        pair_stop(&p[1 - h], &d);
    }
}

/* A node's heartbeats: its stats are kept for the status, less the prefix
 * summary (kept apart); what a finished request booked is given back; a
 * heartbeat saying the node drains takes it out of rotation (a request
 * waits) until one says it serves again. */
static void test_heartbeats_and_status(void **state)
{
    peer_t p, d;
    outcome_t o;
    pair_start(&p, &d, NULL);
    run_requests(3);
    peer_heartbeat(&d, false, 5);
    hpd_rpc_result_t r;
    const msgpack_object *n = status_of(&p, &r, "d0");
    assert_int_equal(u64_of(n, "reserved_slots"), 0);
    const msgpack_object *stats = hpd_rpc_map_get(n, "stats");
    assert_non_null(stats);
    assert_int_equal(stats->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(u64_of(stats, "slots_used"), 5);
    assert_int_equal(u64_of(stats, "node_id"), d.node_id);
    assert_null(hpd_rpc_map_get(stats, "prefix_summary"));
    assert_int_equal(stats->via.map.size, 15); /* all but the summary */
    const msgpack_object *req = hpd_rpc_map_get(&r.result, "requests");
    assert_int_equal(u64_of(req, "finished"), 3);
    assert_int_equal(u64_of(req, "active"), 0);
    hpd_rpc_result_destroy(&r);
    n = status_of(&p, &r, "p0");
    assert_int_equal(u64_of(n, "jobs"), 0);
    hpd_rpc_result_destroy(&r);

    peer_heartbeat(&d, true, 0); /* it drains */
    submit_request(&o, 4);
    spin(100);
    assert_false(o.done);
    assert_int_equal(d.reserves, 3);
    peer_heartbeat(&d, false, 0);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    pair_stop(&p, &d);
}

/* A stop string that ends in the middle of a batch of tokens keeps the
 * tokens up to it, and the request finishes as "stop". */
static void test_stop_inside_a_batch(void **state)
{
    peer_t p, d;
    outcome_t o;
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    submit_request(&o, 6);
    o.stop_at = 11;
    LOOP_UNTIL(d.starts == 1);
    static const int32_t rest[] = {10, 11, 12, 13};
    peer_tokens(&d, d.jobs[0].job, 1, rest, 4, false, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_string_equal(o.finish_reason, "stop");
    static const int32_t want[] = {7, 10, 11};
    assert_int_equal(o.n_tokens, 3);
    assert_memory_equal(o.tokens, want, sizeof(want));
    LOOP_UNTIL(d.jobs[0].canceled);
    pair_stop(&p, &d);
}

/* A request of n choices: the sink's end hears each. */
typedef struct {
    bool done;
    hpd_coord_outcome_t outcome;
    char error[300];
    uint32_t n_choices;
    int32_t tokens[4][8];
    uint32_t n[4];
    char finish[4][8];
    int32_t stop_at[4]; /* the sink ends choice k at this token (0: never) */
    uint32_t streamed[4];
    bool streamed_wrong;
} choices_t;

static bool choices_tokens(void *arg, uint32_t k, const int32_t *tokens,
                           const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                           uint32_t *keep_p)
{
    choices_t *o = arg;
    if (k >= 4 || from != o->streamed[k] || n <= from) {
        o->streamed_wrong = true;
        return true;
    }
    for (uint32_t i = from; i < n; i++) {
        o->streamed[k] = i + 1;
        if (o->stop_at[k] != 0 && tokens[i] == o->stop_at[k]) {
            *keep_p = i + 1;
            return false;
        }
    }
    return true;
}

static void choices_done(void *arg, const hpd_coord_result_t *res)
{
    choices_t *o = arg;
    o->done = true;
    o->outcome = res->outcome;
    snprintf(o->error, sizeof(o->error), "%s", res->error != NULL ? res->error : "");
    o->n_choices = res->n_choices;
    for (uint32_t k = 0; k < res->n_choices && k < 4; k++) {
        o->n[k] = HPD_MIN(res->choices[k].n_tokens, 8u);
        memcpy(o->tokens[k], res->choices[k].tokens, o->n[k] * sizeof(int32_t));
        snprintf(o->finish[k], sizeof(o->finish[k]), "%s",
                 res->choices[k].finish_reason != NULL ? res->choices[k].finish_reason : "");
    }
}

/* The prefill node's answer with each choice's first token. */
static void answer_choices(peer_t *p, uint64_t job, const int32_t *first, uint32_t n)
{
    peer_job_t *j = peer_held(p, job);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_prefilled,
                 &(hpd_msg_prefilled_t){.first_token = (uint32_t)first[0],
                                        .first_tokens = first,
                                        .first_tokens_n = n},
                 &b.pk);
    hpd_rpc_reply(j->conn, j->call, &b);
    hpd_rpc_buf_destroy(&b);
    held_release(j);
}

/* n choices: reserve and prefill carry n; a prefill answer without a first
 * token per choice fails the attempt (it runs again); the start carries
 * each choice's first token; each choice streams and ends apart (one the
 * sink stopped ends as "stop" while the others go on; tokens of a choice
 * the request lacks change nothing), and once every choice has ended the
 * request finishes and the decode node is told to let go; n above 16 is
 * refused. */
static void test_choices(void **state)
{
    peer_t p, d;
    choices_t o = {.stop_at = {0, 11, 0}};
    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_start(&d, "d0", false);
    p.mode = PEER_HOLD;
    hpd_coord_request_t q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 4,
                             .sampling = {.temperature = 1, .top_p = 1, .seed = 3}, .n = 17};
    const hpd_coord_sink_t sink = {.tokens = choices_tokens, .done = choices_done, .arg = &o};
    uint64_t id;
    char err[300];
    assert_int_equal(hpd_coord_submit(coord, &q, &sink, &id, err, sizeof(err)),
                     HPD_RPC_ERR_PARAMS);
    assert_string_equal(err, "generate: n is 17 (expected 1 to 16 choices)");
    q.n = 3;
    assert_int_equal(hpd_coord_submit(coord, &q, &sink, &id, err, sizeof(err)), 0);
    LOOP_UNTIL(p.prefills == 1);
    assert_int_equal(d.jobs[0].n_choices, 3);
    assert_int_equal(p.jobs[0].n_choices, 3);
    static const int32_t first[] = {7, 8, 9};
    answer_choices(&p, p.jobs[0].job, first, 2); /* one short: the attempt fails */
    LOOP_UNTIL(p.prefills == 2);
    assert_int_equal(d.starts, 0);
    answer_choices(&p, p.jobs[1].job, first, 3);
    LOOP_UNTIL(d.starts == 1);
    peer_job_t *j = peer_job(&d, p.jobs[1].job);
    assert_non_null(j);
    assert_int_equal(j->n_first, 3);
    assert_memory_equal(j->first, first, sizeof(first));
    static const int32_t a[] = {10, 11, 12}, b[] = {20, 21, 22};
    peer_choice_tokens(&d, j->job, 5, 1, a, 3, true, NULL); /* no such choice */
    peer_choice_tokens(&d, j->job, 1, 1, a, 3, false, NULL); /* stopped at 11 */
    peer_choice_tokens(&d, j->job, 0, 1, a, 3, true, NULL);
    peer_choice_tokens(&d, j->job, 2, 1, b, 2, false, NULL);
    peer_choice_tokens(&d, j->job, 2, 3, b + 2, 1, true, NULL);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_false(o.streamed_wrong);
    assert_int_equal(o.n_choices, 3);
    static const int32_t want0[] = {7, 10, 11, 12}, want1[] = {8, 10, 11},
                         want2[] = {9, 20, 21, 22};
    assert_int_equal(o.n[0], 4);
    assert_memory_equal(o.tokens[0], want0, sizeof(want0));
    assert_int_equal(o.n[1], 3);
    assert_memory_equal(o.tokens[1], want1, sizeof(want1));
    assert_int_equal(o.n[2], 4);
    assert_memory_equal(o.tokens[2], want2, sizeof(want2));
    assert_string_equal(o.finish[0], "length");
    assert_string_equal(o.finish[1], "stop");
    assert_string_equal(o.finish[2], "length");
    LOOP_UNTIL(j->canceled); /* choice 1 never ended there: the node lets go */
    pair_stop(&p, &d);
}

/* generate with detokenize and stop strings, on a coordinator that has
 * the model's tokenizer: the answer's text ends before the stop string,
 * with the tokens up to the one that completed it ("stop"); stop strings
 * that are not 1 to 256 bytes of text, or more than 16 of them, are
 * refused saying which. */
static void test_stop_strings_over_rpc(void **state)
{
    peer_t p, d;
    called_t c;
    const hpd_coord_opts_t opts = {.model_dir = HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json"};
    /* d0 completes with 7 10 11 12: "#&'(" in this vocabulary */
    hpd_rpc_client_t *cl = keyed_pair_start(&p, &d, &opts);
    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                       .detokenize = true}, &c);
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    assert_string_equal(c.text, "#&'(");
    hpd_msg_free(&hpd_msg_generated, &c.g);

    static const uint8_t quote[] = {0x91, 0xa1, '\''}; /* ["'"] */
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                       .stop_raw = quote, .stop_raw_len = sizeof(quote)}, &c);
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    assert_string_equal(c.text, "#&");
    assert_string_equal(c.g.finish_reason, "stop");
    static const int32_t upto[] = {7, 10, 11};
    assert_int_equal(c.g.tokens_n, 3);
    assert_memory_equal(c.g.tokens, upto, sizeof(upto));
    hpd_msg_free(&hpd_msg_generated, &c.g);

    const struct {
        const uint8_t *raw;
        uint32_t len;
        const char *want;
    } bad[] = {
        {(const uint8_t[]){0xa1, ','}, 2, "generate: field 'stop' is not an array"},
        {(const uint8_t[]){0x92, 0xa1, ',', 0xa0}, 4,
         "generate: stop[1]: expected a string of 1 to 256 bytes"},
        {(const uint8_t[]){0x91, 0x07}, 2,
         "generate: stop[0]: expected a string of 1 to 256 bytes"},
        {(const uint8_t[]){0x91, 0xa3, 'a', 0, 'b'}, 5,
         "generate: stop[0]: expected a string of 1 to 256 bytes"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                           .stop_raw = bad[i].raw, .stop_raw_len = bad[i].len},
                 &c);
        assert_true(c.is_error);
        assert_string_equal(c.message, bad[i].want);
    }
    uint8_t many[3 + 17 * 2], longest[1 + 3 + 257];
    uint32_t n = 0;
    many[n++] = 0xdc; /* an array of 17 (array 16) */
    many[n++] = 0;
    many[n++] = 17;
    for (int i = 0; i < 17; i++) {
        many[n++] = 0xa1;
        many[n++] = 'x';
    }
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                       .stop_raw = many, .stop_raw_len = n}, &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: stop: expected at most 16 strings");
    longest[0] = 0x91; /* [a string of 257 bytes (str 16)] */
    longest[1] = 0xda;
    longest[2] = 0x01;
    longest[3] = 0x01;
    memset(longest + 4, 'y', 257);
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                       .stop_raw = longest, .stop_raw_len = sizeof(longest)},
             &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: stop[0]: expected a string of 1 to 256 bytes");
    longest[3] = 0x00; /* 256 bytes: taken */
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 5, .max_tokens = 4,
                                       .stop_raw = longest, .stop_raw_len = sizeof(longest) - 1},
             &c);
    if (c.is_error)
        fail_msg("a stop string of 256 bytes refused: %s", c.message);
    hpd_msg_free(&hpd_msg_generated, &c.g);
    hpd_rpc_client_destroy(cl);
    pair_stop(&p, &d);
}

/* Writes a model directory with the test vocabulary's tokenizer.json and
 * Qwen3.5's chat template into dir. */
static void chat_model_dir(char *dir, size_t len)
{
    char path[600], *text;
    size_t n;
    test_tmpdir(dir, len, "chat-model");
    assert_int_equal(hpd_read_file(HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json", &text, &n),
                     HPD_OK);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(hpd_write_file(path, text, n), HPD_OK);
    free(text);
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    assert_int_equal(hpd_write_file(path, hpd_chat_template_qwen35,
                                    strlen(hpd_chat_template_qwen35)), HPD_OK);
}

/* keyed_pair_start on a coordinator with a chat model (chat_model_dir:
 * dir, removed by the caller). */
static hpd_rpc_client_t *chat_pair_start(peer_t *p, peer_t *d, char *dir, size_t len)
{
    chat_model_dir(dir, len);
    const hpd_coord_opts_t opts = {.model_dir = dir};
    peer_vocab = 1179; /* the tokenizer's */
    hpd_rpc_client_t *cl = keyed_pair_start(p, d, &opts);
    peer_vocab = 1000;
    return cl;
}

/* msgpack [{role, content[, reasoning_content]} ...] of n messages (at
 * most 4, each string under 32 bytes) into buf; NULL fields left out. */
static uint32_t pack_messages(uint8_t *buf, const char *const (*msgs)[3], uint32_t n)
{
    static const char *const keys[] = {"role", "content", "reasoning_content"};
    uint32_t at = 0;
    buf[at++] = (uint8_t)(0x90 | n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t fields = 0;
        for (int k = 0; k < 3; k++)
            fields += msgs[i][k] != NULL;
        buf[at++] = (uint8_t)(0x80 | fields);
        for (int k = 0; k < 3; k++) {
            if (msgs[i][k] == NULL)
                continue;
            const size_t kl = strlen(keys[k]), vl = strlen(msgs[i][k]);
            buf[at++] = (uint8_t)(0xa0 | kl);
            memcpy(buf + at, keys[k], kl);
            at += (uint32_t)kl;
            buf[at++] = (uint8_t)(0xa0 | vl);
            memcpy(buf + at, msgs[i][k], vl);
            at += (uint32_t)vl;
        }
    }
    return at;
}

/* msgpack [{role, content?, tool_calls?, tool_call_id?} ...] (tool_calls:
 * a JSON array's text, as bin) into b. */
static void pack_tool_chat(hpd_rpc_buf_t *b, const char *const (*msgs)[4], uint32_t n)
{
    static const char *const keys[] = {"role", "content", "tool_calls", "tool_call_id"};
    msgpack_pack_array(&b->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t fields = 0;
        for (int k = 0; k < 4; k++)
            fields += msgs[i][k] != NULL;
        msgpack_pack_map(&b->pk, fields);
        for (int k = 0; k < 4; k++) {
            if (msgs[i][k] == NULL)
                continue;
            hpd_rpc_pack_str(&b->pk, keys[k]);
            if (k == 2)
                hpd_proto_pack_bin(&b->pk, msgs[i][k], strlen(msgs[i][k]));
            else
                hpd_rpc_pack_str(&b->pk, msgs[i][k]);
        }
    }
}

/* The prompt of a chat with tools as the model's format renders it
 * (hpd_text_chat_tools), thinking off. */
static void chat_ids(const char *dir, const hpd_chat_msg_t *mv, size_t n, const char *tools_json,
                     int32_t **ids_p, size_t *n_p)
{
    hpd_text_t *text;
    char err[300];
    assert_int_equal(hpd_text_load(dir, &text, err, sizeof(err)), HPD_OK);
    if (hpd_text_chat_tools(text, mv, n, tools_json, 0, ids_p, n_p, err, sizeof(err)) != HPD_OK)
        fail_msg("chat: %s", err);
    hpd_text_destroy(text);
}

/* generate of a one-message chat (thinking 1 on, 2 off) with tools (NULL:
 * none; tool_choice JSON text or NULL), whose decode node d answers with
 * ids after the first token, ending with "stop"; the reply in *c. */
static void chat_answered(hpd_rpc_client_t *cl, peer_t *d, const char *const (*chat)[4],
                          uint32_t thinking, const char *tools, const char *choice,
                          const int32_t *ids, uint32_t n, called_t *c)
{
    hpd_rpc_buf_t msgs, b;
    const uint32_t starts = d->starts;
    hpd_rpc_buf_init(&msgs);
    pack_tool_chat(&msgs, chat, 1);
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_generate,
                 &(hpd_msg_generate_t){.messages_raw = msgs.sb.data,
                                       .messages_raw_len = (uint32_t)msgs.sb.size,
                                       .max_tokens = 64, .thinking = thinking,
                                       .detokenize = true, .tools = tools,
                                       .tools_len = tools ? (uint32_t)strlen(tools) : 0,
                                       .tool_choice = choice,
                                       .tool_choice_len = choice ? (uint32_t)strlen(choice) : 0},
                 &b.pk);
    memset(c, 0, sizeof(*c));
    assert_int_equal(hpd_rpc_call(cl, "generate", &b, 30000, on_generated, c), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_buf_destroy(&msgs);
    LOOP_UNTIL(d->starts == starts + 1);
    hpd_msg_tokens_t m = {.job = d->jobs[(d->n_jobs - 1) % PEER_MAX_JOBS].job, .index = 1,
                          .ids = ids, .ids_n = n, .done = true};
    snprintf(m.finish_reason, sizeof(m.finish_reason), "stop");
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
    assert_int_equal(hpd_rpc_notify(d->coord_conn, "tokens", &b), HPD_OK);
    hpd_rpc_buf_destroy(&b);
    LOOP_UNTIL(c->done);
}

/* A thinking chat whose model closes its reasoning with the </think>
 * special token (Qwen3.5's tokenizer marks it special): its text is kept
 * for the split, so the answer has its reasoning and its content apart. */
static void test_reasoning_marker_over_rpc(void **state)
{
    peer_t p, d;
    called_t c;
    char dir[256], err[300];
    hpd_rpc_client_t *cl = chat_pair_start(&p, &d, dir, sizeof(dir));
    hpd_text_t *text;
    assert_int_equal(hpd_text_load(dir, &text, err, sizeof(err)), HPD_OK);
    const hpd_tokenizer_t *tok = hpd_text_tokenizer(text);
    const int32_t close = hpd_tokenizer_id(tok, "</think>");
    assert_true(hpd_tokenizer_is_special(tok, close));
    int32_t *a, *b, ids[64];
    size_t na, nb;
    assert_int_equal(hpd_tokenizer_encode(tok, "I think", 7, &a, &na), HPD_OK);
    assert_int_equal(hpd_tokenizer_encode(tok, "\n\nHello", 7, &b, &nb), HPD_OK);
    assert_true(na + nb + 1 <= 64);
    memcpy(ids, a, na * sizeof(int32_t));
    ids[na] = close;
    memcpy(ids + na + 1, b, nb * sizeof(int32_t));
    free(a);
    free(b);
    hpd_text_destroy(text);
    d.autocomplete = false;
    static const char *const chat1[1][4] = {{"user", "Hi", NULL, NULL}};
    chat_answered(cl, &d, chat1, 1, NULL, NULL, ids, (uint32_t)(na + nb + 1), &c);
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    char reasoning[256];
    snprintf(reasoning, sizeof(reasoning), "%.*s", (int)c.g.reasoning_len,
             c.g.reasoning != NULL ? (const char *)c.g.reasoning : "");
    if (strstr(reasoning, "I think") == NULL || strstr(reasoning, "Hello") != NULL ||
        strstr(c.text, "Hello") == NULL || strstr(c.text, "think") != NULL)
        fail_msg("reasoning [%s], content [%s]: not split at </think>", reasoning, c.text);
    hpd_msg_free(&hpd_msg_generated, &c.g);
    hpd_rpc_client_destroy(cl);
    pair_stop(&p, &d);
    test_rmtree(dir);
}

/* A chat with tools over msgpack: the tools are rendered into the prompt
 * as the HTTP door renders them (chatreq.c), an answer that calls one
 * comes back in tool_calls (an id, the name, the arguments as JSON with
 * the parameter's type) with its text apart and finish_reason tool_calls;
 * an assistant's tool_calls and a tool message are rendered back; a tool
 * message whose tool_call_id no call has, tools without messages and a
 * tool_choice naming no tool are refused naming the field. */
static void test_tools_over_rpc(void **state)
{
    peer_t p, d;
    called_t c;
    char dir[256], err[300];
    hpd_rpc_client_t *cl = chat_pair_start(&p, &d, dir, sizeof(dir));
    static const char tools[] = "[{\"type\": \"function\", \"function\": {\"name\": \"set_alarm\", "
                                "\"parameters\": {\"type\": \"object\", \"properties\": {\"hour\": "
                                "{\"type\": \"integer\"}}}}}]";
    int32_t *want, *call;
    size_t want_n, call_n;
    const hpd_chat_msg_t wake = {.role = "user", .content = "Wake me."};
    chat_ids(dir, &wake, 1, tools, &want, &want_n);
    hpd_text_t *text;
    assert_int_equal(hpd_text_load(dir, &text, err, sizeof(err)), HPD_OK);
    static const char call_text[] = "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n"
                                    "</parameter>\n</function>\n</tool_call>";
    assert_int_equal(hpd_tokenizer_encode(hpd_text_tokenizer(text), call_text,
                                          strlen(call_text), &call, &call_n), HPD_OK);
    hpd_text_destroy(text);

    d.autocomplete = false;
    static const char *const chat1[1][4] = {{"user", "Wake me.", NULL, NULL}};
    hpd_rpc_buf_t msgs;
    chat_answered(cl, &d, chat1, 2, tools, NULL, call, (uint32_t)call_n, &c);
    const peer_job_t *pj = &p.jobs[(p.n_jobs - 1) % PEER_MAX_JOBS];
    assert_int_equal(pj->prefill_n, want_n); /* the tools are in the prompt */
    assert_memory_equal(pj->prompt, want, HPD_MIN(want_n, PEER_MAX_PROMPT) * sizeof(int32_t));
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    assert_string_equal(c.g.finish_reason, "tool_calls");
    assert_null(strstr(c.text, "<tool_call>"));
    json_t *calls = json_loadb(c.g.tool_calls, c.g.tool_calls_len, 0, NULL);
    assert_non_null(calls);
    assert_int_equal(json_array_size(calls), 1);
    const json_t *f = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(f, "name")), "set_alarm");
    assert_string_equal(json_string_value(json_object_get(f, "arguments")), "{\"hour\": 7}");
    assert_true(strncmp(json_string_value(json_object_get(json_array_get(calls, 0), "id")),
                        "call_", 5) == 0);
    json_decref(calls);
    hpd_msg_free(&hpd_msg_generated, &c.g);
    /* tool_choice none: the tools are in the prompt, the answer is content */
    chat_answered(cl, &d, chat1, 2, tools, "\"none\"", call, (uint32_t)call_n, &c);
    pj = &p.jobs[(p.n_jobs - 1) % PEER_MAX_JOBS];
    assert_int_equal(pj->prefill_n, want_n);
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    assert_null(c.g.tool_calls);
    assert_string_equal(c.g.finish_reason, "stop");
    assert_non_null(strstr(c.text, "<tool_call>"));
    hpd_msg_free(&hpd_msg_generated, &c.g);
    free(want);
    free(call);

    /* the call and its answer rendered back; a wrong tool_call_id refused */
    d.autocomplete = true;
    static const char calls_json[] = "[{\"id\": \"call_a\", \"type\": \"function\", \"function\": "
                                     "{\"name\": \"set_alarm\", \"arguments\": \"{\\\"hour\\\": 7}\"}}]";
    const hpd_chat_call_t set = {.name = "set_alarm", .arguments = "{\"hour\": 7}"};
    const hpd_chat_msg_t conv[3] = {{.role = "user", .content = "Wake me."},
                                    {.role = "assistant", .content = "", .calls = &set,
                                     .n_calls = 1},
                                    {.role = "tool", .content = "set"}};
    chat_ids(dir, conv, 3, tools, &want, &want_n);
    for (int wrong = 0; wrong < 2; wrong++) {
        const char *const chat3[3][4] = {{"user", "Wake me.", NULL, NULL},
                                         {"assistant", NULL, calls_json, NULL},
                                         {"tool", "set", NULL, wrong ? "call_b" : "call_a"}};
        hpd_rpc_buf_init(&msgs);
        pack_tool_chat(&msgs, chat3, 3);
        generate(cl, &(hpd_msg_generate_t){.messages_raw = msgs.sb.data,
                                           .messages_raw_len = (uint32_t)msgs.sb.size,
                                           .max_tokens = 4, .thinking = 2, .tools = tools,
                                           .tools_len = (uint32_t)strlen(tools)},
                 &c);
        hpd_rpc_buf_destroy(&msgs);
        if (wrong) {
            assert_true(c.is_error);
            assert_string_equal(c.message, "generate: messages[2].tool_call_id: no earlier tool "
                                           "call has the id 'call_b'");
        } else {
            if (c.is_error)
                fail_msg("generate: %s", c.message);
            hpd_msg_free(&hpd_msg_generated, &c.g);
            const peer_job_t *j = &p.jobs[(p.n_jobs - 1) % PEER_MAX_JOBS];
            assert_int_equal(j->prefill_n, want_n);
            assert_memory_equal(j->prompt, want, HPD_MIN(want_n, PEER_MAX_PROMPT) *
                                                     sizeof(int32_t));
        }
    }
    free(want);
    /* refused by name */
    static const int32_t prompt[] = {1, 2, 3};
    generate(cl, &(hpd_msg_generate_t){.prompt = prompt, .prompt_n = 3, .max_tokens = 4,
                                       .tools = tools, .tools_len = (uint32_t)strlen(tools)},
             &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: tools: only with messages (a chat)");
    static const char named[] = "{\"type\": \"function\", \"function\": {\"name\": \"nope\"}}";
    hpd_rpc_buf_init(&msgs);
    pack_tool_chat(&msgs, chat1, 1);
    generate(cl, &(hpd_msg_generate_t){.messages_raw = msgs.sb.data,
                                       .messages_raw_len = (uint32_t)msgs.sb.size,
                                       .max_tokens = 4, .tools = tools,
                                       .tools_len = (uint32_t)strlen(tools),
                                       .tool_choice = named,
                                       .tool_choice_len = (uint32_t)strlen(named)},
             &c);
    hpd_rpc_buf_destroy(&msgs);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: tool_choice.function.name: no tool is named "
                                   "'nope'");
    const struct {
        const char *tools, *choice, *want;
    } bad[] = {
        {tools, "\"sometimes\"", "generate: tool_choice: expected \"none\", \"auto\", "
                                "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                                "...}}"},
        {"[{\"type\": \"retrieval\", \"function\": {\"name\": \"f\"}}]", NULL,
         "generate: tools[0].type: only \"function\" is supported"},
        {"[]", "\"required\"", "generate: tool_choice: required without tools"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hpd_rpc_buf_init(&msgs);
        pack_tool_chat(&msgs, chat1, 1);
        generate(cl, &(hpd_msg_generate_t){.messages_raw = msgs.sb.data,
                                           .messages_raw_len = (uint32_t)msgs.sb.size,
                                           .max_tokens = 4, .tools = bad[i].tools,
                                           .tools_len = (uint32_t)strlen(bad[i].tools),
                                           .tool_choice = bad[i].choice,
                                           .tool_choice_len = bad[i].choice != NULL
                                                                  ? (uint32_t)strlen(bad[i].choice)
                                                                  : 0},
                 &c);
        hpd_rpc_buf_destroy(&msgs);
        assert_true(c.is_error);
        assert_string_equal(c.message, bad[i].want);
    }
    hpd_rpc_client_destroy(cl);
    pair_stop(&p, &d);
    test_rmtree(dir);
}

/* generate with messages on a coordinator with a chat template: the
 * prefill node gets the chat put in the model's format and tokenized
 * (the same ids as hpd_text_chat gives for those messages, in their
 * order); a message without a role or with a content that is not a
 * string is refused, saying which. */
static void test_chat_over_rpc(void **state)
{
    peer_t p, d;
    called_t c;
    char dir[256], err[300];
    hpd_rpc_client_t *cl = chat_pair_start(&p, &d, dir, sizeof(dir));
    static const char *const chat[3][3] = {
        {"system", "Be brief.", NULL},
        {"user", "Hi there", NULL},
        {"assistant", "Hello!", "greet"},
    };
    uint8_t raw[512];
    const uint32_t raw_len = pack_messages(raw, chat, 3);
    generate(cl, &(hpd_msg_generate_t){.messages_raw = raw, .messages_raw_len = raw_len,
                                       .max_tokens = 4, .thinking = 2},
             &c);
    if (c.is_error)
        fail_msg("generate: %s", c.message);
    hpd_msg_free(&hpd_msg_generated, &c.g);

    hpd_text_t *text;
    int32_t *want;
    size_t want_n;
    const hpd_chat_msg_t mv[3] = {{.role = "system", .content = "Be brief."},
                                  {.role = "user", .content = "Hi there"},
                                  {.role = "assistant", .content = "Hello!", .reasoning = "greet"}};
    assert_int_equal(hpd_text_load(dir, &text, err, sizeof(err)), HPD_OK);
    assert_int_equal(hpd_text_chat(text, mv, 3, 0, &want, &want_n, err, sizeof(err)), HPD_OK);
    assert_true(want_n > 10 && want_n <= PEER_MAX_PROMPT);
    assert_int_equal(p.jobs[0].prefill_n, want_n);
    assert_memory_equal(p.jobs[0].prompt, want, want_n * sizeof(int32_t));
    free(want);
    hpd_text_destroy(text);

    static const char *const no_role[2][3] = {{"user", "a", NULL}, {NULL, "b", NULL}};
    const uint32_t n1 = pack_messages(raw, no_role, 2);
    generate(cl, &(hpd_msg_generate_t){.messages_raw = raw, .messages_raw_len = n1,
                                       .max_tokens = 4}, &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: messages[1].role: missing");
    static const char *const fine[2][3] = {{"user", "a", NULL}, {"user", "b", NULL}};
    uint32_t n2 = pack_messages(raw, fine, 2);
    raw[n2 - 2] = 0x07; /* messages[1].content "b" becomes 7 */
    n2--;
    generate(cl, &(hpd_msg_generate_t){.messages_raw = raw, .messages_raw_len = n2,
                                       .max_tokens = 4}, &c);
    assert_true(c.is_error);
    assert_string_equal(c.message, "generate: messages[1].content: expected a string");
    hpd_rpc_client_destroy(cl);
    pair_stop(&p, &d);
    test_rmtree(dir);
}

/* What a request asked for reaches the decode node's reserve: the
 * prompt, max_tokens, min_tokens, its stop token ids, ignore_eos and its
 * sampling (temperature, seed). */
static void test_reserve_carries_the_request(void **state)
{
    peer_t p, d;
    outcome_t o;
    pair_start(&p, &d, NULL);
    static const int32_t prompt[] = {1, 2, 3, 4, 5, 6}, stops[] = {3, 4, 5};
    const hpd_coord_request_t q = {.prompt = prompt,
                                   .n_prompt = 6,
                                   .max_tokens = 9,
                                   .min_tokens = 2,
                                   .stop_ids = stops,
                                   .n_stop = 3,
                                   .ignore_eos = true,
                                   .sampling = {.temperature = 0.5f, .top_p = 1, .seed = 42,
                                                .top_k = HPD_TOP_K_UNSET}};
    const hpd_coord_sink_t sink = {.tokens = sink_tokens, .done = sink_done, .arg = &o};
    uint64_t id;
    char err[300];
    memset(&o, 0, sizeof(o));
    assert_int_equal(hpd_coord_submit(coord, &q, &sink, &id, err, sizeof(err)), 0);
    LOOP_UNTIL(d.reserves == 1);
    const peer_job_t *j = &d.jobs[0];
    assert_int_equal(j->prompt_n, 6);
    assert_int_equal(j->max_tokens, 9);
    assert_int_equal(j->min_tokens, 2);
    assert_int_equal(j->stop_n, 3);
    assert_true(j->ignore_eos);
    assert_int_equal(j->seed, 42);
    assert_true(fabs(j->temperature - 0.5) < 1e-6);
    assert_int_equal(j->replay_n, 0);
    pair_stop(&p, &d);
}

/* Decode nodes are lost and registered while others stay: the registry
 * unlinks the lost one only (a node registered later may sit where a lost
 * one was in memory), and the others serve. */
static void test_node_lost_leaves_the_others(void **state)
{
    peer_t p, d[4];
    char msg[200];
    coord_start(NULL);
    peer_start(&p, "p0", true);
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "d%d", i);
        if (i == 3) { /* after d0 is lost and freed */
            peer_stop(&d[0]);
            spin(50);
            hpd_coord_health(coord, msg, sizeof(msg));
            assert_string_equal(msg, "ok: 1 prefill and 2 decode nodes, 0 open requests");
        }
        peer_start(&d[i], name, false);
        d[i].autocomplete = true;
    }
    peer_stop(&d[2]);
    spin(50);
    hpd_coord_health(coord, msg, sizeof(msg));
    assert_string_equal(msg, "ok: 1 prefill and 2 decode nodes, 0 open requests");
    run_requests(4);
    assert_int_equal(d[1].reserves + d[3].reserves, 4);
    peer_stop(&p);
    peer_stop(&d[1]);
    peer_stop(&d[3]);
    coord_stop();
}

/* p registers again on a new connection, from host with incarnation;
 * returns the refusal ("" when it was registered). */
static void register_again(const peer_t *p, const char *host, uint64_t incarnation,
                           char *refusal, size_t len)
{
    hpd_rpc_client_t *cl;
    const hpd_rpc_client_params_t cp = {.base = base, .host = "127.0.0.1",
                                        .port = hpd_coord_port(coord), .token = PEER_SECRET,
                                        .timeout_ms = 30000};
    assert_int_equal(hpd_rpc_client_connect(&cp, &cl), HPD_OK);
    hpd_rpc_buf_t info, b;
    hpd_rpc_result_t r;
    peer_pack_register(p, host, incarnation, &info, &b);
    assert_int_equal(hpd_rpc_call_sync(cl, "register", &b, 30000, &r), HPD_OK);
    snprintf(refusal, len, "%s", r.is_error ? r.error_message : "");
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_buf_destroy(&info);
    hpd_rpc_client_destroy(cl);
    spin(20);
}

/* A registration carries the node's shard map: one that is not the one its
 * degree gives, or that covers other heads than the cluster's nodes',
 * is refused naming the rank, or both nodes; nodes of any degrees whose
 * maps agree are served. */
static void test_shard_maps(void **state)
{
    /* 2 KV heads, 4 GDN key heads, 8 value heads: at tp 2, and at tp 4
     * (the KV heads replicated: 0, 0, 1, 1) */
    static const int32_t tp2[] = {0, 1, 0, 2, 0, 4, 1, 2, 2, 4, 4, 8};
    static const int32_t tp4[] = {0, 1, 0, 1, 0, 2, 0, 1, 1, 2, 2, 4,
                                  1, 2, 2, 3, 4, 6, 1, 2, 3, 4, 6, 8};
    /* rank 1's KV head modulo 2 (0, 1, 0, 1): not the map of tp 4 */
    static const int32_t modulo[] = {0, 1, 0, 1, 0, 2, 1, 2, 1, 2, 2, 4,
                                     0, 1, 2, 3, 4, 6, 1, 2, 3, 4, 6, 8};
    /* 4 KV heads at tp 2 */
    static const int32_t other[] = {0, 2, 0, 2, 0, 4, 2, 4, 2, 4, 4, 8};
    peer_t p, d, bad;
    coord_start(NULL);
    peer_tp = 2, peer_map = tp2, peer_map_n = 12;
    peer_start(&p, "p0", true);
    assert_false(p.refused);
    peer_tp = 4, peer_map = tp4, peer_map_n = 24;
    peer_start(&d, "d0", false);
    assert_false(d.refused);
    peer_map = modulo;
    peer_may_be_refused = true;
    peer_start(&bad, "d1", false);
    assert_true(bad.refused);
    assert_non_null(strstr(bad.refusal, "register: node d1's shard_map: rank 1's KV heads are "
                                        "[1, 2) (expected [0, 1) of 2 at tp 4)"));
    peer_stop(&bad);
    peer_tp = 2, peer_map = other, peer_map_n = 12;
    peer_start(&bad, "d2", false);
    assert_true(bad.refused);
    assert_non_null(strstr(bad.refusal, "node d2's shard map (tp 2) covers 4 KV heads, 4 GDN "
                                        "key heads and 8 value heads where node"));
    assert_non_null(strstr(bad.refusal, "covers 2, 4 and 8: their ranks cannot be paired"));
    peer_stop(&bad);
    peer_map_n = 11; /* not six numbers a rank */
    peer_start(&bad, "d3", false);
    assert_true(bad.refused);
    assert_non_null(strstr(bad.refusal, "shard_map has 11 numbers (expected 6 a rank, 12 at "
                                        "tp 2)"));
    peer_stop(&bad);
    peer_tp = 0, peer_map = NULL, peer_map_n = 0, peer_may_be_refused = false;
    peer_stop(&p);
    peer_stop(&d);
    coord_stop();
}

/* A registration carries the node's incarnation: a late attempt of the
 * same node (name, host and port) with an incarnation not above the one
 * registered is refused as stale, saying both; a newer one is served; so
 * is one of another node (another host name) whatever its incarnation. */
static void test_stale_registration_refused(void **state)
{
    peer_t p, d;
    char why[300];
    coord_start(NULL);
    peer_start(&p, "p0", true);
    peer_incarnation = 5;
    peer_start(&d, "d0", false);
    peer_incarnation = 0;
    register_again(&d, "127.0.0.1", 4, why, sizeof(why));
    assert_string_equal(why, "register: a stale attempt of node d0 (incarnation 4; 5 is "
                             "registered)");
    register_again(&d, "127.0.0.1", 5, why, sizeof(why));
    assert_string_equal(why, "register: a stale attempt of node d0 (incarnation 5; 5 is "
                             "registered)");
    register_again(&d, "localhost", 1, why, sizeof(why));
    assert_string_equal(why, "");
    register_again(&d, "127.0.0.1", 6, why, sizeof(why));
    assert_string_equal(why, "");
    pair_stop(&p, &d);
}

/* A hedge that no node could take yet (the only prefill node is the
 * suspect one) is called off when that node pings again: it is never
 * placed, the request finishes from its own attempt, and its attempts do
 * not count the hedge. */
static void test_hedge_called_off(void **state)
{
    peer_t p, d;
    outcome_t o;
    const hpd_coord_opts_t opts = {.liveness_ms = 500};
    pair_start(&p, &d, &opts);
    p.mode = PEER_HOLD;
    pings_start(&p, &d, NULL);
    submit_request(&o, 4);
    LOOP_UNTIL(p.prefills == 1);
    pinging[0] = NULL;
    LOOP_UNTIL(hedges_started() == 1);
    spin(100);
    pinging[0] = &p; /* back */
    LOOP_UNTIL(p.pings_ok >= 5);
    spin(200);
    assert_int_equal(d.reserves, 1); /* the hedge was never placed */
    assert_int_equal(p.prefills, 1);
    peer_answer_prefill(&p, p.jobs[0].job, 7);
    LOOP_UNTIL(o.done);
    assert_int_equal(o.outcome, HPD_COORD_FINISHED);
    assert_int_equal(o.attempts, 1);
    assert_int_equal(d.reserves, 1);
    pings_stop();
    pair_stop(&p, &d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_only_from_its_decode_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sick_decode_node_routed_around, setup, teardown),
        cmocka_unit_test_setup_teardown(test_waits_for_nodes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_ended_neither_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_what_an_operator_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusing_connections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_node_is_let_go, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chat_over_rpc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_liveness_pings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_generate_over_rpc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_by_tag_over_rpc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_decode_node_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_prefill_node_routed_around, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hedge_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_string_from_a_hedge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raced_attempt_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hedge_is_the_last_attempt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hedge_fails_too, setup, teardown),
        cmocka_unit_test_setup_teardown(test_heartbeats_and_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_inside_a_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_choices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tools_over_rpc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reasoning_marker_over_rpc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_strings_over_rpc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_carries_the_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_lost_leaves_the_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_registration_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_maps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hedge_called_off, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
