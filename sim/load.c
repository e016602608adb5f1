/* The load generator (sim/load.h). One event loop: arrivals from a timer,
 * answers from the clients' callbacks; a request's record lives until the
 * run ends. */
#include "sim/load.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "node/msg.h"
#include "transport/rpc.h"

#define LOG_COMPONENT "load"
#define MAX_CONNECTIONS 64
#define MAX_HTTP_CONNECTIONS 1024

typedef struct run run_t;

typedef struct {
    run_t *run;
    uint32_t index;
    int32_t *prompt;
    double t_sent, t_done, ttft_ms, sched_ms;
    bool done;
} lreq_t;

struct run {
    hpd_load_params_t p;
    hpd_rpc_client_t *cl[MAX_CONNECTIONS];
    uint32_t n_cl;
    /* the HTTP door's (p.http): keep-alive connections, a request at a
     * time each (evhttp queues the rest) */
    struct evhttp_connection **http;
    uint32_t n_http;
    char auth[300];
    lreq_t *reqs;
    uint32_t next, open, answered;
    struct event *arrive, *tick;
    double t0, next_at;
    uint64_t rng;
    bool stopping; /* the clients go: their calls' callbacks only count */
    hpd_load_result_t *r;
};

static double uniform(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

/* Request i's prompt: a shared prefix (one of p.prefixes) and its own rest. */
static void make_prompt(const hpd_load_params_t *p, uint32_t i, int32_t *out)
{
    uint64_t x = p->seed * 7919 + i;
    const uint32_t group = p->prefixes > 0 ? (uint32_t)(uniform(&x) * p->prefixes) : 0;
    const uint32_t shared = p->prefixes > 0 ? HPD_MIN(p->prefix_tokens, p->prompt_tokens) : 0;
    uint64_t g = p->seed * 104729 + group;
    for (uint32_t j = 0; j < shared; j++)
        out[j] = (int32_t)(uniform(&g) * p->vocab);
    for (uint32_t j = shared; j < p->prompt_tokens; j++)
        out[j] = (int32_t)(uniform(&x) * p->vocab);
}

static void wrong(run_t *k, const lreq_t *q, const char *fmt, const char *what, uint64_t a,
                  uint64_t b)
{
    if (k->r->wrong++ == 0)
        snprintf(k->r->first_wrong, sizeof(k->r->first_wrong), "request %u: %.100s %.120s (%llu, %llu)",
                 q->index, fmt, what, (unsigned long long)a, (unsigned long long)b);
}

static void try_send(run_t *k);

/* The end of request q's call (false: it is over for the load already). */
static bool answered(run_t *k, lreq_t *q)
{
    q->done = true;
    q->t_done = hpd_time_now();
    k->open--;
    k->answered++;
    if (k->stopping) {
        k->r->failed++;
        q->t_done = 0;
        return false;
    }
    return true;
}

static void failed(run_t *k, const lreq_t *q, const char *why, int len)
{
    if (k->r->failed++ == 0 && k->r->wrong == 0)
        snprintf(k->r->first_wrong, sizeof(k->r->first_wrong), "request %u failed: %.*s",
                 q->index, len, why);
}

/* Checks an answer: its tokens, and with the simulator which nodes served
 * it. */
static void check(run_t *k, lreq_t *q, const int32_t *tokens, uint32_t n, uint32_t attempts,
                  double ttft_ms)
{
    const hpd_load_params_t *p = &k->p;
    bool ok = n == p->max_tokens;
    if (!ok)
        wrong(k, q, "tokens", "count", n, p->max_tokens);
    for (uint32_t i = 0; ok && i < n; i++) {
        const int32_t want = hpd_sim_token(q->prompt, p->prompt_tokens, q->index + 1, 0, i,
                                           p->vocab);
        if (tokens[i] != want) {
            wrong(k, q, "token", "got, want", (uint64_t)tokens[i], (uint64_t)want);
            ok = false;
        }
    }
    int32_t pn, dn;
    uint32_t jobs;
    if (ok && p->sim != NULL) {
        const uint64_t key = hpd_sim_request_key(q->prompt, p->prompt_tokens, q->index + 1);
        if (!hpd_sim_served(p->sim, key, &pn, &dn, &jobs) || pn < 0 || dn < 0) {
            k->r->unserved++;
            wrong(k, q, "served by", "no node (prefill, decode)", (uint64_t)(int64_t)pn,
                  (uint64_t)(int64_t)dn);
            ok = false;
        } else if (!hpd_sim_node_prefill(p->sim, (uint32_t)pn) ||
                   hpd_sim_node_prefill(p->sim, (uint32_t)dn)) {
            wrong(k, q, "served by", "nodes of the wrong role", (uint64_t)pn, (uint64_t)dn);
            ok = false;
        }
    }
    if (p->sim != NULL) {
        const double at = hpd_sim_reserved_at(
            p->sim, hpd_sim_request_key(q->prompt, p->prompt_tokens, q->index + 1));
        q->sched_ms = at > 0 ? (at - q->t_sent) * 1e3 : -1;
    }
    k->r->ok += ok;
    k->r->retried += attempts > 1;
    k->r->tokens += n;
    q->ttft_ms = ttft_ms;
}

static void on_answer(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    lreq_t *q = arg;
    run_t *k = q->run;
    hpd_msg_generated_t g = {0};
    hpd_proto_err_t err;
    if (!answered(k, q))
        return;
    if (st != HPD_OK || reply->is_error) {
        failed(k, q, st != HPD_OK ? hpd_status_str(st) : reply->error_message,
               st != HPD_OK ? 16 : (int)reply->error_message_len);
    } else if (!hpd_msg_unpack(&hpd_msg_generated, reply->result, &g, &err)) {
        wrong(k, q, "a reply that does not read:", err.text, 0, 0);
    } else {
        check(k, q, g.tokens, g.tokens_n, g.attempts, g.ttft_ms);
        hpd_msg_free(&hpd_msg_generated, &g);
    }
    try_send(k);
}

/* An HTTP answer: a completion whose choice has the ids (return_token_ids). */
static void on_http_answer(struct evhttp_request *req, void *arg)
{
    lreq_t *q = arg;
    run_t *k = q->run;
    if (!answered(k, q))
        return;
    const int code = req != NULL ? evhttp_request_get_response_code(req) : 0;
    struct evbuffer *in = req != NULL ? evhttp_request_get_input_buffer(req) : NULL;
    const size_t len = in != NULL ? evbuffer_get_length(in) : 0;
    const char *body = len > 0 ? (const char *)evbuffer_pullup(in, -1) : "";
    json_t *j = code == 200 ? json_loadb(body, len, JSON_ALLOW_NUL, NULL) : NULL;
    const json_t *ids = json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                        "token_ids");
    if (code != 200) {
        char why[240];
        snprintf(why, sizeof(why), "HTTP %d: %.200s", code, code ? body : "no answer");
        failed(k, q, why, (int)strlen(why));
    } else if (!json_is_array(ids) || json_array_size(ids) > k->p.max_tokens + 1u) {
        wrong(k, q, "an answer without token_ids:", body, 0, 0);
    } else {
        int32_t tokens[json_array_size(ids) + 1];
        for (size_t i = 0; i < json_array_size(ids); i++)
            tokens[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        check(k, q, tokens, (uint32_t)json_array_size(ids), 1, -1);
    }
    json_decref(j);
    try_send(k);
}

/* POST /v1/completions {prompt: ids, max_tokens, seed, return_token_ids}
 * on one of the HTTP connections. */
static bool send_http(run_t *k, lreq_t *q)
{
    const hpd_load_params_t *p = &k->p;
    struct evhttp_connection *con = k->http[q->index % k->n_http];
    struct evhttp_request *req = evhttp_request_new(on_http_answer, q);
    if (req == NULL)
        return false;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    const hpd_endpoint_t *at = &p->http[q->index % k->n_http % p->n_http];
    char host[80];
    snprintf(host, sizeof(host), "%s:%u", at->host, at->port);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (k->auth[0] != '\0')
        evhttp_add_header(h, "Authorization", k->auth);
    struct evbuffer *out = evhttp_request_get_output_buffer(req);
    evbuffer_add_printf(out, "{\"prompt\": [");
    for (uint32_t i = 0; i < p->prompt_tokens; i++)
        evbuffer_add_printf(out, i ? ",%d" : "%d", q->prompt[i]);
    evbuffer_add_printf(out, "], \"max_tokens\": %u, \"seed\": %u, \"ignore_eos\": true, "
                        "\"return_token_ids\": true}", p->max_tokens, q->index + 1);
    return evhttp_make_request(con, req, EVHTTP_REQ_POST, "/v1/completions") == 0;
}

static void send_one(run_t *k)
{
    const hpd_load_params_t *p = &k->p;
    lreq_t *q = &k->reqs[k->next];
    q->run = k;
    q->index = k->next++;
    q->prompt = malloc(p->prompt_tokens * sizeof(int32_t));
    if (q->prompt == NULL) {
        q->done = true;
        k->answered++;
        k->r->failed++;
        return;
    }
    make_prompt(p, q->index, q->prompt);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_generate,
                 &(hpd_msg_generate_t){.prompt = q->prompt,
                                       .prompt_n = p->prompt_tokens,
                                       .max_tokens = p->max_tokens,
                                       .seed = q->index + 1,
                                       .tag = q->index + 1},
                 &b.pk);
    q->t_sent = hpd_time_now();
    k->r->sent++;
    k->open++;
    k->r->peak_open = HPD_MAX(k->r->peak_open, k->open);
    if (k->n_http > 0 ? !send_http(k, q)
                      : hpd_rpc_call(k->cl[q->index % k->n_cl], "generate", &b, 0, on_answer,
                                     q) != HPD_OK) {
        k->open--;
        q->done = true;
        k->answered++;
        k->r->failed++;
    }
    hpd_rpc_buf_destroy(&b);
}

/* Sends what is due: arrivals whose time came, within the window. */
static void try_send(run_t *k)
{
    const double now = hpd_time_now();
    while (k->next < k->p.requests && k->open < k->p.window &&
           (k->p.rate <= 0 || k->next_at <= now)) {
        send_one(k);
        if (k->p.rate > 0)
            k->next_at += -log(uniform(&k->rng)) / k->p.rate;
    }
    if (k->next < k->p.requests && k->p.rate > 0 && !evtimer_pending(k->arrive, NULL)) {
        const double wait = HPD_MAX(0.0, k->next_at - now);
        const struct timeval tv = {(time_t)wait, (suseconds_t)(fmod(wait, 1.0) * 1e6)};
        evtimer_add(k->arrive, &tv);
    }
    if (k->answered == k->p.requests)
        event_base_loopbreak(k->p.base);
}

static void on_arrive(evutil_socket_t fd, short what, void *arg)
{
    try_send(arg);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    run_t *k = arg;
    if (k->p.tick != NULL)
        k->p.tick(k->p.arg, hpd_time_now() - k->t0, k->answered);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double q)
{
    return n == 0 ? 0 : v[HPD_MIN(n - 1, (size_t)(q * (double)n))];
}

hpd_status_t hpd_load_run(const hpd_load_params_t *params, double timeout_s,
                          hpd_load_result_t *result_p)
{
    run_t k = {.p = *params, .r = result_p};
    hpd_status_t st = HPD_OK;
    memset(result_p, 0, sizeof(*result_p));
    if (k.p.window == 0)
        k.p.window = 64;
    k.p.connections = HPD_MAX(1u, HPD_MIN(k.p.connections, (uint32_t)MAX_CONNECTIONS));
    k.rng = params->seed ^ 0xa5a5;
    if ((k.reqs = calloc(k.p.requests ? k.p.requests : 1, sizeof(*k.reqs))) == NULL)
        return HPD_ERR_NO_MEMORY;
    if (k.p.n_http > 0) { /* the HTTP door instead */
        const uint32_t n = HPD_MAX(1u, HPD_MIN(params->connections, MAX_HTTP_CONNECTIONS));
        if ((k.http = calloc(n, sizeof(*k.http))) == NULL) {
            st = HPD_ERR_NO_MEMORY;
            goto out;
        }
        if (k.p.key != NULL)
            snprintf(k.auth, sizeof(k.auth), "Bearer %s", k.p.key);
        for (uint32_t i = 0; i < n; i++) {
            const hpd_endpoint_t *at = &k.p.http[i % k.p.n_http];
            if ((k.http[i] = evhttp_connection_base_new(k.p.base, NULL, at->host, at->port)) ==
                NULL) {
                st = HPD_ERR_NO_MEMORY;
                goto out;
            }
            evhttp_connection_set_timeout(k.http[i], (int)timeout_s);
            k.n_http++;
        }
    }
    for (uint32_t i = 0; k.p.n_http == 0 && i < k.p.connections; i++) {
        const hpd_endpoint_t *door = k.p.n_doors > 0 ? &k.p.doors[i % k.p.n_doors] : NULL;
        const hpd_rpc_client_params_t cp = {.base = k.p.base,
                                            .host = door != NULL ? door->host : k.p.host,
                                            .port = door != NULL ? door->port : k.p.port,
                                            .token = k.p.key,
                                            .timeout_ms = (uint32_t)(timeout_s * 1000)};
        if ((st = hpd_rpc_client_create(&cp, &k.cl[i])) != HPD_OK)
            goto out;
        k.n_cl++;
    }
    k.arrive = evtimer_new(k.p.base, on_arrive, &k);
    k.tick = event_new(k.p.base, -1, EV_PERSIST, on_tick, &k);
    if (k.arrive == NULL || k.tick == NULL) {
        st = HPD_ERR_NO_MEMORY;
        goto out;
    }
    static const struct timeval second = {1, 0};
    event_add(k.tick, &second);
    k.t0 = k.next_at = hpd_time_now();
    try_send(&k);
    while (k.answered < k.p.requests && hpd_time_now() - k.t0 < timeout_s)
        event_base_loop(k.p.base, EVLOOP_ONCE);
    if (k.answered < k.p.requests) {
        st = HPD_ERR_TIMEOUT;
        result_p->failed += k.p.requests - k.answered;
    }
    result_p->duration_s = hpd_time_now() - k.t0;
    double *lat = malloc((k.p.requests + 1) * sizeof(double));
    double *ttft = malloc((k.p.requests + 1) * sizeof(double));
    double *sched = malloc((k.p.requests + 1) * sizeof(double));
    size_t n = 0, n_sched = 0, n_ttft = 0;
    for (uint32_t i = 0; lat != NULL && ttft != NULL && sched != NULL && i < k.next; i++)
        if (k.reqs[i].done && k.reqs[i].t_done > 0) {
            lat[n++] = (k.reqs[i].t_done - k.reqs[i].t_sent) * 1e3;
            if (k.reqs[i].ttft_ms >= 0) /* (the HTTP door's answer has none) */
                ttft[n_ttft++] = k.reqs[i].ttft_ms;
            if (k.reqs[i].sched_ms >= 0 && k.p.sim != NULL)
                sched[n_sched++] = k.reqs[i].sched_ms;
        }
    if (lat != NULL && ttft != NULL && sched != NULL) {
        qsort(lat, n, sizeof(double), cmp_double);
        qsort(ttft, n_ttft, sizeof(double), cmp_double);
        qsort(sched, n_sched, sizeof(double), cmp_double);
        result_p->p50_ms = pct(lat, n, 0.5);
        result_p->p99_ms = pct(lat, n, 0.99);
        result_p->p50_ttft_ms = pct(ttft, n_ttft, 0.5);
        result_p->p99_ttft_ms = pct(ttft, n_ttft, 0.99);
        result_p->p50_sched_ms = pct(sched, n_sched, 0.5);
        result_p->p99_sched_ms = pct(sched, n_sched, 0.99);
    }
    free(lat);
    free(ttft);
    free(sched);
out:
    /* the clients first: their pending calls' callbacks still see the records */
    k.stopping = true;
    for (uint32_t i = 0; i < k.n_cl; i++)
        hpd_rpc_client_destroy(k.cl[i]);
    for (uint32_t i = 0; i < k.n_http; i++)
        evhttp_connection_free(k.http[i]); /* its requests' callbacks: req NULL */
    free(k.http);
    if (k.arrive != NULL)
        event_free(k.arrive);
    if (k.tick != NULL)
        event_free(k.tick);
    for (uint32_t i = 0; i < k.next; i++)
        free(k.reqs[i].prompt);
    free(k.reqs);
    return st;
}
