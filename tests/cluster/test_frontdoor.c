/* Front doors apart from the scheduler (coordinator/door.h), in a real
 * cluster on 127.0.0.1: a scheduler (hpd-coordinator), a prefill node, two
 * decode nodes and two front doors (hpd-coordinator --scheduler, one with
 * the HTTP API):
 * - the same requests through either door and straight to the scheduler
 *   give the same answers (tokens, text before a stop string, n choices,
 *   logprobs and the prompt's, bit for bit), and the greedy ones equal
 *   hpd-run's; the HTTP door answers a completion with that text;
 * - the tokens after the first go from the decode node to the door, not
 *   through the scheduler: a streamed answer goes on while the scheduler
 *   is stopped (SIGSTOP);
 * - a door address no decode node can reach: every decode node refuses
 *   the reservation, the request fails saying so, the nodes go on;
 * - a door killed with requests open: the scheduler cancels them on every
 *   node (the cluster goes idle);
 * - the scheduler killed (-9) and started again on its port: the door
 *   submits its open requests again and they complete with the tokens
 *   they had, none lost or repeated. */
#include "tests/cluster/harness.h"

#include "coordinator/coordinator.h"
#include "node/msg.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MODEL_ARGS "--hidden 128 --layers 4 --full-interval 2 --intermediate 256 --vocab 1024 " \
                   "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "      \
                   "--lin-k-dim 32 --lin-v-dim 32 --seed 9"
#define N_PROMPTS 6
#define MAX_TOKENS 24
#define LONG_TOKENS 600

static cl_t cl;
static cl_proc_t *doors[2];
static uint16_t door_port[2], door_http;

static hpd_client_t *client_at(uint16_t port)
{
    hpd_client_t *c;
    const hpd_client_params_t p = {.host = "127.0.0.1",
                                   .port = port,
                                   .token = CL_CLIENT_KEY,
                                   .timeout_ms = 300000};
    assert_int_equal(hpd_client_create(&p, &c), HPD_OK);
    return c;
}

static cl_proc_t *start_door(int i, bool http)
{
    char name[32], port_file[400], http_file[400], *argv[CL_MAX_ARGS];
    snprintf(name, sizeof(name), "door-%d", i);
    snprintf(port_file, sizeof(port_file), "%s/%s.port", cl.root, name);
    snprintf(http_file, sizeof(http_file), "%s/%s.http", cl.root, name);
    const char *base[] = {HPD_COORDINATOR, "--port", "0", "--port-file", port_file,
                          "--token-file", cl.token_file, "--client-keys-file", cl.keys_file,
                          "--scheduler", cl.addr, "--host", "127.0.0.1", "--model", cl.model,
                          "--log-level", "info", "--drain-timeout-ms", "5000",
                          "--metrics-port", "0"};
    const char *extra[] = {"--http-port", "0", "--http-port-file", http_file, NULL};
    cl_args(argv, base, sizeof(base) / sizeof(base[0]), http ? extra : NULL);
    cl_proc_t *p = cl_spawn(&cl, name, argv);
    door_port[i] = cl_port_file(&cl, port_file);
    if (http)
        door_http = cl_port_file(&cl, http_file);
    return p;
}

/* Waits until a door takes requests (it has heard its scheduler's limits). */
static void wait_door(uint16_t port)
{
    hpd_client_t *c = client_at(port);
    const int32_t prompt[] = {1, 2, 3};
    const double deadline = hpd_time_now() + 60;
    for (;;) {
        hpd_generate_result_t r;
        const hpd_generate_params_t g = {.prompt = prompt, .n_prompt = 3, .max_tokens = 2,
                                         .sampling = {.top_p = 1}};
        const hpd_status_t st = hpd_client_generate(c, &g, NULL, NULL, &r);
        hpd_generate_result_free(&r);
        if (st == HPD_OK)
            break;
        cl_check_alive(&cl);
        assert_true(hpd_time_now() < deadline);
        usleep(100 * 1000);
    }
    hpd_client_destroy(c);
}

/* ------------------------------------------------------------ the same answers */

/* n tokens' log probabilities, bit for bit (the top ones each has) */
static void same_logprobs(const hpd_token_logprobs_t *a, const hpd_token_logprobs_t *b,
                          uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        assert_memory_equal(&a[i].logprob, &b[i].logprob, sizeof(float));
        assert_int_equal(a[i].n_top, b[i].n_top);
        assert_memory_equal(a[i].top_ids, b[i].top_ids, a[i].n_top * sizeof(int32_t));
        assert_memory_equal(a[i].top_logprobs, b[i].top_logprobs, a[i].n_top * sizeof(float));
    }
}

static void same_result(const hpd_generate_result_t *a, const hpd_generate_result_t *b,
                        const char *what)
{
    if (a->status != HPD_OK || b->status != HPD_OK)
        fail_msg("%s: %s / %s", what, a->error, b->error);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t));
    assert_string_equal(a->finish_reason, b->finish_reason);
    assert_int_equal(a->prompt_tokens, b->prompt_tokens);
    assert_int_equal(a->text != NULL, b->text != NULL);
    if (a->text != NULL)
        assert_string_equal(a->text, b->text);
    assert_int_equal(a->logprobs != NULL, b->logprobs != NULL);
    if (a->logprobs != NULL)
        same_logprobs(a->logprobs, b->logprobs, a->n_tokens);
    assert_int_equal(a->prompt_logprobs != NULL, b->prompt_logprobs != NULL);
    if (a->prompt_logprobs != NULL)
        same_logprobs(a->prompt_logprobs, b->prompt_logprobs, a->prompt_tokens - 1);
    assert_int_equal(a->n_more, b->n_more);
    for (uint32_t k = 0; k < a->n_more; k++) {
        assert_int_equal(a->more[k].n_tokens, b->more[k].n_tokens);
        assert_memory_equal(a->more[k].tokens, b->more[k].tokens,
                            a->more[k].n_tokens * sizeof(int32_t));
        assert_string_equal(a->more[k].finish_reason, b->more[k].finish_reason);
        assert_int_equal(a->more[k].logprobs != NULL, b->more[k].logprobs != NULL);
        if (a->more[k].logprobs != NULL)
            same_logprobs(a->more[k].logprobs, b->more[k].logprobs, a->more[k].n_tokens);
    }
}

static void test_doors_equal_the_scheduler(void **state)
{
    int32_t prompts[N_PROMPTS][CL_PROMPT_MAX], ref[N_PROMPTS][MAX_TOKENS];
    uint32_t len[N_PROMPTS];
    char file[400];
    (void)state;
    cl_make_prompts(&cl, N_PROMPTS, 41, prompts, len, file, sizeof(file));
    cl_reference(&cl, file, N_PROMPTS, MAX_TOKENS, "--no-generation-defaults --ignore-eos",
                 &ref[0][0]);
    hpd_client_t *to[3] = {cl_client(&cl), client_at(door_port[0]), client_at(door_port[1])};
    const char *stops[] = {"e"};
    for (int i = 0; i < N_PROMPTS; i++) {
        /* greedy; text to a stop string; two seeded choices with logprobs
         * and the prompt's */
        const hpd_generate_params_t kinds[] = {
            {.max_tokens = MAX_TOKENS, .sampling = {.top_p = 1}, .ignore_eos = true},
            {.max_tokens = MAX_TOKENS, .sampling = {.top_p = 1}, .detokenize = true,
             .stops = stops, .n_stops = 1},
            {.max_tokens = MAX_TOKENS, .sampling = {.temperature = 0.8f, .top_p = 0.9f,
                                                    .seed = 7 + (uint64_t)i},
             .n = 2, .logprobs = true, .top_logprobs = 2, .prompt_logprobs = true},
        };
        for (size_t k = 0; k < HPD_ARRAY_SIZE(kinds); k++) {
            hpd_generate_params_t g = kinds[k];
            hpd_generate_result_t r[3];
            g.prompt = prompts[i];
            g.n_prompt = len[i];
            for (int d = 0; d < 3; d++)
                hpd_client_generate(to[d], &g, NULL, NULL, &r[d]);
            same_result(&r[0], &r[1], "door 0");
            same_result(&r[0], &r[2], "door 1");
            if (k == 0) /* a single engine's */
                assert_memory_equal(r[1].tokens, ref[i], MAX_TOKENS * sizeof(int32_t));
            for (int d = 0; d < 3; d++)
                hpd_generate_result_free(&r[d]);
        }
    }
    for (int d = 0; d < 3; d++)
        hpd_client_destroy(to[d]);
    /* each door counts what it answered (its /metrics), as a coordinator does */
    for (int d = 0; d < 2; d++) {
        int code = 0;
        char *body = NULL;
        assert_int_equal(hpd_http_get("127.0.0.1", cl_metrics_port(&cl, doors[d]), "/metrics",
                                      5000, &code, &body), HPD_OK);
        const char *ok = strstr(body, "hpd_requests_total{outcome=\"ok\"} ");
        assert_non_null(ok);
        assert_true(atol(ok + strlen("hpd_requests_total{outcome=\"ok\"} ")) >= 3 * N_PROMPTS);
        assert_non_null(strstr(body, "hpd_ttft_seconds_count"));
        free(body);
    }
    print_message("%d prompts x 3 kinds: both doors answer as the scheduler does, greedy as "
                  "hpd-run\n", N_PROMPTS);
    cl.passed++;
}

/* ------------------------------------------------------------ the HTTP door */

static char *http_post(uint16_t port, const char *path, const char *body)
{
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const struct timeval limit = {.tv_sec = 120};
    assert_true(fd >= 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char head[512];
    const int n = snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Connection: close\r\nContent-Type: application/json\r\n"
                           "Authorization: Bearer %s\r\nContent-Length: %zu\r\n\r\n", path,
                           CL_CLIENT_KEY, strlen(body));
    assert_int_equal(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    assert_int_equal(send(fd, body, strlen(body), MSG_NOSIGNAL), (ssize_t)strlen(body));
    size_t len = 0, cap = 1 << 16;
    char *out = malloc(cap);
    assert_non_null(out);
    for (ssize_t k; len + 1 < cap && (k = recv(fd, out + len, cap - 1 - len, 0)) > 0;)
        len += (size_t)k;
    close(fd);
    out[len] = '\0';
    return out;
}

static void test_http_door(void **state)
{
    const int32_t prompt[] = {11, 22, 33, 44, 55, 66, 77};
    (void)state;
    hpd_client_t *c = cl_client(&cl);
    hpd_generate_result_t r;
    const hpd_generate_params_t g = {.prompt = prompt, .n_prompt = 7, .max_tokens = 12,
                                     .sampling = {.top_p = 1}, .ignore_eos = true,
                                     .detokenize = true};
    assert_int_equal(hpd_client_generate(c, &g, NULL, NULL, &r), HPD_OK);
    char *resp = http_post(door_http, "/v1/completions",
                           "{\"model\": \"model\", \"prompt\": [11, 22, 33, 44, 55, 66, 77], "
                           "\"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}");
    assert_non_null(strstr(resp, "200 OK"));
    json_t *j = json_loads(strstr(resp, "\r\n\r\n") + 4, 0, NULL);
    assert_non_null(j);
    const char *text = json_string_value(json_object_get(
        json_array_get(json_object_get(j, "choices"), 0), "text"));
    assert_non_null(text);
    assert_string_equal(text, r.text);
    json_decref(j);
    free(resp);
    hpd_generate_result_free(&r);
    hpd_client_destroy(c);
    cl.passed++;
}

/* ------------------------------------------------------------ tokens past the scheduler */

typedef struct {
    uint32_t streamed;
    cl_req_t end;
} stream_t;

static void on_token(void *arg, uint64_t h, uint32_t index, const int32_t *ids, uint32_t n)
{
    stream_t *s = arg;
    (void)h;
    (void)ids;
    s->streamed = HPD_MAX(s->streamed, index + n);
}

static void on_stream_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    cl_on_done(&((stream_t *)arg)->end, h, r);
}

typedef struct {
    stream_t *s;
    uint32_t at_least;
} streamed_t;

static bool streamed(cl_t *c, void *arg)
{
    const streamed_t *w = arg;
    (void)c;
    return w->s->streamed >= w->at_least || w->s->end.done;
}

static void submit_long(hpd_client_t *c, int32_t first, stream_t *s)
{
    const int32_t prompt[] = {first, 5, 9, 14, 20, 27, 35, 44};
    const hpd_generate_params_t g = {.prompt = prompt, .n_prompt = 8,
                                     .max_tokens = LONG_TOKENS, .sampling = {.top_p = 1},
                                     .ignore_eos = true};
    uint64_t h;
    assert_int_equal(hpd_client_submit(c, &g, on_token, on_stream_done, s, &h), HPD_OK);
}

static void test_tokens_bypass_the_scheduler(void **state)
{
    stream_t s = {0};
    (void)state;
    hpd_client_t *c = client_at(door_port[0]);
    submit_long(c, 3, &s);
    streamed_t w = {&s, 8};
    cl_wait(&cl, c, 120, streamed, &w, "the first streamed tokens");
    assert_false(s.end.done);
    cl_pause(cl.coord);
    const uint32_t before = s.streamed;
    w.at_least = before + 100;
    cl_wait(&cl, c, 120, streamed, &w, "tokens while the scheduler is stopped");
    cl_resume(cl.coord);
    assert_true(s.streamed >= before + 100);
    cl_client_wait(&cl, c, 300, "the long answer");
    assert_int_equal(s.end.status, HPD_OK);
    assert_int_equal(s.end.n, LONG_TOKENS);
    print_message("%u tokens streamed while the scheduler was stopped\n",
                  s.streamed - before);
    hpd_client_destroy(c);
    cl.passed++;
}

/* ------------------------------------------------------------ failures */

static void test_killed_door_frees_its_requests(void **state)
{
    stream_t s[4] = {{0}};
    (void)state;
    hpd_client_t *c = client_at(door_port[1]);
    const cl_requests_t before = cl_requests(&cl);
    for (int i = 0; i < 4; i++)
        submit_long(c, 100 + i, &s[i]);
    streamed_t w = {&s[3], 4};
    cl_wait(&cl, c, 120, streamed, &w, "streamed tokens through door 1");
    cl_kill9(&cl, doors[1]);
    cl_client_wait(&cl, c, 60, "the requests of the killed door");
    for (int i = 0; i < 4; i++)
        assert_int_equal(s[i].end.status, HPD_ERR_IO);
    cl_wait_idle(&cl, 3, 120); /* every node let go of them */
    const cl_requests_t after = cl_requests(&cl);
    assert_int_equal(after.canceled - before.canceled, 4); /* not run to their ends */
    assert_int_equal(after.finished, before.finished);
    hpd_client_destroy(c);
    cl.passed++;
}

static void test_scheduler_restart_door_resubmits(void **state)
{
    stream_t s[3] = {{0}}, ref[3] = {{0}};
    int32_t tokens[3][CL_REQ_TOKENS];
    (void)state;
    hpd_client_t *c = client_at(door_port[0]);
    for (int i = 0; i < 3; i++)
        submit_long(c, 200 + i, &s[i]);
    streamed_t w = {&s[2], 4};
    cl_wait(&cl, c, 120, streamed, &w, "streamed tokens through door 0");
    cl_kill9(&cl, cl.coord);
    char port[16];
    snprintf(port, sizeof(port), "%u", cl.port);
    const char *args[] = {"--lease-ms", "120000", "--model", cl.model, "--port", port, NULL};
    cl_start_coordinator(&cl, "scheduler", args);
    cl_client_wait(&cl, c, 300, "the resubmitted requests");
    char log[400];
    snprintf(log, sizeof(log), "%s", doors[0]->log);
    assert_true(cl_file_has(log, "3 open request(s) wait for the next"));
    for (int i = 0; i < 3; i++) {
        if (s[i].end.status != HPD_OK)
            fail_msg("request %d: %s", i, s[i].end.error);
        assert_int_equal(s[i].end.n, LONG_TOKENS);
        memcpy(tokens[i], s[i].end.tokens, sizeof(tokens[i]));
    }
    /* the same requests again, undisturbed */
    for (int i = 0; i < 3; i++)
        submit_long(c, 200 + i, &ref[i]);
    cl_client_wait(&cl, c, 300, "the reference answers");
    for (int i = 0; i < 3; i++)
        assert_memory_equal(tokens[i], ref[i].end.tokens, sizeof(tokens[i]));
    hpd_client_destroy(c);
    cl.passed++;
}

/* A door address no decode node can reach (a peer's mistake, or a door
 * gone): each decode node refuses the reservation as a failed peer, the
 * scheduler tries the others and then fails the request, saying why, and
 * the nodes serve the next request at once. */
typedef struct {
    bool ended;
    uint32_t outcome;
    char error[400];
} ended_t;

static void on_sched_notify(void *arg, const hpd_rpc_msg_t *msg)
{
    ended_t *e = arg;
    hpd_msg_ended_t m = {0};
    hpd_proto_err_t err;
    if (!hpd_rpc_str_eq(msg->method, msg->method_len, "ended") ||
        !hpd_msg_unpack(&hpd_msg_ended, msg->params, &m, &err))
        return;
    e->ended = true;
    e->outcome = m.outcome;
    snprintf(e->error, sizeof(e->error), "%s", m.error);
}

static void test_unreachable_door(void **state)
{
    (void)state;
    char *token;
    assert_int_equal(hpd_rpc_read_token(cl.token_file, &token), HPD_OK);
    struct event_base *base = event_base_new();
    ended_t e = {0};
    hpd_rpc_client_t *sched;
    const hpd_rpc_client_params_t cp = {.base = base, .host = "127.0.0.1", .port = cl.port,
                                        .token = token, .on_notify = on_sched_notify,
                                        .arg = &e};
    assert_int_equal(hpd_rpc_client_create(&cp, &sched), HPD_OK);
    const int32_t prompt[] = {4, 8, 15, 16, 23, 42};
    hpd_msg_schedule_t m = {.tag = 7, .prompt = prompt, .prompt_n = 6, .max_tokens = 8};
    snprintf(m.door, sizeof(m.door), "127.0.0.1:1"); /* nothing listens there */
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_schedule, &m, &b.pk);
    hpd_rpc_result_t r;
    assert_int_equal(hpd_rpc_call_sync(sched, "schedule", &b, 10000, &r), HPD_OK);
    assert_false(r.is_error);
    hpd_rpc_result_destroy(&r);
    hpd_rpc_buf_destroy(&b);
    const double t0 = hpd_time_now();
    while (!e.ended && hpd_time_now() - t0 < 60)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(10000);
    assert_true(e.ended);
    assert_int_equal(e.outcome, HPD_COORD_FAILED);
    /* tried on the other decode node too, not refused as the request's fault */
    if (strstr(e.error, "cannot connect to the front door 127.0.0.1:1") == NULL ||
        strstr(e.error, "gave up after") == NULL)
        fail_msg("ended with: %s", e.error);
    print_message("an unreachable door: failed in %.2f s: %s\n", hpd_time_now() - t0, e.error);
    hpd_rpc_client_destroy(sched);
    event_base_free(base);
    free(token);
    /* the nodes serve the next request at once */
    hpd_client_t *c = client_at(door_port[0]);
    const int32_t p2[] = {1, 2, 3};
    hpd_generate_result_t g;
    const hpd_generate_params_t gp = {.prompt = p2, .n_prompt = 3, .max_tokens = 4,
                                      .sampling = {.top_p = 1}};
    assert_int_equal(hpd_client_generate(c, &gp, NULL, NULL, &g), HPD_OK);
    hpd_generate_result_free(&g);
    hpd_client_destroy(c);
    cl.passed++;
}

static int setup(void **state)
{
    (void)state;
    if (cl_init(&cl, "frontdoor", MODEL_ARGS) != 0)
        return -1;
    cl.cases = 6;
    /* its model: the same requests straight to it, as text */
    const char *args[] = {"--lease-ms", "120000", "--model", cl.model, NULL};
    cl_start_coordinator(&cl, "scheduler", args);
    const char *pa[] = {"--kv-layout", "64,1,nhd", "--max-context", "4096", NULL};
    const char *da[] = {"--kv-layout", "16,2,hnd", "--max-context", "4096", NULL};
    cl_start_node(&cl, "prefill", "prefill-0", pa);
    cl_start_node(&cl, "decode", "decode-0", da);
    cl_start_node(&cl, "decode", "decode-1", pa);
    cl_wait_idle(&cl, 3, 120);
    doors[0] = start_door(0, true);
    doors[1] = start_door(1, false);
    wait_door(door_port[0]);
    wait_door(door_port[1]);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (cl.passed == cl.cases)
        cl_stop_all(&cl);
    cl_finish(&cl);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doors_equal_the_scheduler),
        cmocka_unit_test(test_http_door),
        cmocka_unit_test(test_tokens_bypass_the_scheduler),
        cmocka_unit_test(test_unreachable_door),
        cmocka_unit_test(test_killed_door_frees_its_requests),
        cmocka_unit_test(test_scheduler_restart_door_resubmits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
