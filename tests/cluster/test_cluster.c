/* The cluster as separate processes on 127.0.0.1: one coordinator, two
 * prefill nodes (B=64,P=1 NHD and B=32,P=2 NHD) and two decode nodes
 * (B=16,P=4 NHD and B=16,P=1 HND) on a small generated model with four
 * full-attention layers and a mixture of experts in every layer but one
 * (8 experts, 2 per token, a shared expert), whose generation_config.json
 * sets sampling defaults. Every output must equal hpd-run's, under load, with
 * nodes killed (-9) mid-load while they hold requests (which are then
 * retried), and after 200 cancels and disconnects (each counted by the
 * coordinator) nothing may stay allocated beyond the prefix caches. Past
 * --max-requests exactly the extra requests are refused. At the end every
 * process must exit 0 on SIGTERM with no sanitizer report in its log
 * (tests/cluster/harness.h).
 *
 * HPD_TEST_DEVICE=cuda runs the same on the GPU (every node and hpd-run with
 * --device cuda; ctest's test_cluster_cuda, label gpu); it exits 77 without
 * a GPU. */
#include "tests/cluster/harness.h"

#include "kernels/backend.h"
#include "node/proto.h"
#include "tests/test_device.h"

#define MODEL_ARGS "--hidden 128 --layers 8 --full-interval 2 --intermediate 256 --vocab 512 " \
                   "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "     \
                   "--lin-k-dim 32 --lin-v-dim 32 --seed 5 --sampling 0.8,0.9,40 "             \
                   "--experts 8 --experts-per-tok 2 --moe-intermediate 48 "                     \
                   "--shared-intermediate 32 --mlp-only-layers 3" /* MoE, one dense layer */
#define N_PROMPTS 64
#define MAX_TOKENS 20

static cl_t cl;
static char prompts_file[300];
static const char *device = "cpu"; /* HPD_TEST_DEVICE */
static const char *ucx_tls = "tcp"; /* HPD_TEST_UCX_TLS: the nodes' data plane */

typedef struct {
    const char *role, *name, *layout;
    cl_proc_t *p;
} node_proc_t;

static node_proc_t nodes[] = {
    {"prefill", "p64", "64,1,nhd", NULL},
    {"prefill", "p32", "32,2,nhd", NULL},
    /* 4 full-attention layers in packs of 3: a last, partial pack of one
     * layer that the prefill nodes must push too */
    {"decode", "d16x3", "16,3,nhd", NULL},
    {"decode", "d16hnd", "16,1,hnd", NULL},
};
#define N_NODES (sizeof(nodes) / sizeof(nodes[0]))

static hpd_prompt_t prompts[N_PROMPTS];

typedef int32_t tokens_t[MAX_TOKENS];

static void start_node(node_proc_t *n)
{
    /* reservations never expire here: prefill nodes are stopped for a while */
    const bool decode = strcmp(n->role, "decode") == 0;
    const char *args[] = {"--kv-layout", n->layout, "--max-batch", "16", "--max-context", "1024",
                          "--prefill-chunk", "128", decode ? "--reserve-timeout-ms" : NULL,
                          "600000", NULL};
    n->p = cl_start_node(&cl, n->role, n->name, args);
}

/* Every node registered and idle, no request open. */
static void wait_idle(void)
{
    cl_wait_idle(&cl, N_NODES, 120);
}

static int setup(void **state)
{
    if (cl_init(&cl, "cluster", MODEL_ARGS) != 0)
        return -1;
    cl.device = device;
    cl.ucx_tls = ucx_tls;
    snprintf(prompts_file, sizeof(prompts_file), "%s/prompts", cl.root);
    /* 8 system prompts of 64..400 tokens, 8 questions each, interleaved so
     * that later requests find their prefix cached */
    FILE *f = fopen(prompts_file, "w");
    for (int i = 0; i < N_PROMPTS; i++) {
        const int sys = i % 8, sys_len = 64 + 48 * sys, q_len = 5 + (i * 7) % 60;
        prompts[i].n = (size_t)(sys_len + q_len);
        prompts[i].ids = malloc(prompts[i].n * sizeof(int32_t));
        for (int t = 0; t < sys_len + q_len; t++) {
            prompts[i].ids[t] = t < sys_len ? (int32_t)(hpd_philox4x32(100 + sys, t, 0).v[0] % 512)
                                            : (int32_t)(hpd_philox4x32(1000 + i, t, 0).v[0] % 512);
            fprintf(f, t ? ",%d" : "%d", prompts[i].ids[t]);
        }
        fprintf(f, "\n");
    }
    fclose(f);
    /* Nodes are lost here by kill -9 (their connections close at once) and
     * prefill nodes are stopped for a while: no lease may lapse and no queued
     * request time out in this test, whatever the load (test_cluster_policies
     * covers both). */
    const char *args[] = {"--heartbeat-ms", "100", "--lease-ms", "120000", "--max-requests", "80",
                          "--queue-timeout-ms", "600000", NULL};
    cl_start_coordinator(&cl, "coordinator", args);
    for (size_t i = 0; i < N_NODES; i++)
        start_node(&nodes[i]);
    wait_idle();
    return 0;
}

static int teardown(void **state)
{
    for (int i = 0; i < N_PROMPTS; i++)
        free(prompts[i].ids);
    cl_finish(&cl);
    return 0;
}

/* hpd-run's lines for the prompts file. */
static void reference(const char *sampling, tokens_t *out)
{
    cl_reference(&cl, prompts_file, N_PROMPTS, MAX_TOKENS, sampling, &out[0][0]);
}

#define SEEDED_ARGS "--temperature 0.8 --top-p 0.9 --top-k 40 --seed 7" /* = MODEL_ARGS' */

/* The references, computed once. */
static tokens_t *ref_greedy(void)
{
    static tokens_t ref[N_PROMPTS];
    static bool have;
    if (!have)
        reference("--no-generation-defaults", ref);
    have = true;
    return ref;
}

static tokens_t *ref_seeded(void)
{
    static tokens_t ref[N_PROMPTS];
    static bool have;
    if (!have)
        reference(SEEDED_ARGS, ref);
    have = true;
    return ref;
}

typedef struct {
    int32_t tokens[N_PROMPTS][MAX_TOKENS];
    uint32_t n[N_PROMPTS], attempts[N_PROMPTS];
    hpd_status_t status[N_PROMPTS];
    uint32_t streamed[N_PROMPTS]; /* tokens seen on the stream, checked in order */
    bool stream_ok[N_PROMPTS];
    uint32_t done, cached;
    uint64_t handles[N_PROMPTS];
} batch_t;

static int index_of(batch_t *b, uint64_t h)
{
    for (int i = 0; i < N_PROMPTS; i++)
        if (b->handles[i] == h)
            return i;
    return -1;
}

static void on_token(void *arg, uint64_t h, uint32_t index, const int32_t *ids, uint32_t n)
{
    batch_t *b = arg;
    const int i = index_of(b, h);
    if (i < 0)
        return;
    /* one stream: every position once, in order */
    if (index != b->streamed[i])
        b->stream_ok[i] = false;
    for (uint32_t k = 0; k < n && index + k < MAX_TOKENS; k++)
        b->tokens[i][index + k] = ids[k];
    b->streamed[i] = index + n;
}

static void on_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    batch_t *b = arg;
    const int i = index_of(b, h);
    if (i < 0)
        return;
    b->status[i] = r->status;
    b->n[i] = r->n_tokens;
    b->attempts[i] = r->attempts;
    if (r->status == HPD_OK) {
        if (memcmp(b->tokens[i], r->tokens, r->n_tokens * sizeof(int32_t)) != 0 ||
            b->streamed[i] != r->n_tokens)
            b->stream_ok[i] = false; /* the stream and the reply disagree */
        b->cached += r->cached_tokens;
    } else {
        print_message("prompt %d: %s\n", i, r->error);
    }
    b->done++;
}

typedef struct {
    batch_t *b;
    void (*during)(batch_t *);
} run_t;

static bool batch_done(cl_t *c, void *arg)
{
    run_t *run = arg;
    if (run->during != NULL)
        run->during(run->b);
    return run->b->done == N_PROMPTS;
}

/* Runs the 64 prompts at once; `during` is called between polls. */
static void run_batch(const hpd_sampling_t *s, batch_t *b, void (*during)(batch_t *))
{
    hpd_client_t *c = cl_client(&cl);
    run_t run = {b, during};
    memset(b, 0, sizeof(*b));
    for (int i = 0; i < N_PROMPTS; i++) {
        hpd_generate_params_t p = {.prompt = prompts[i].ids,
                                   .n_prompt = (uint32_t)prompts[i].n,
                                   .max_tokens = MAX_TOKENS,
                                   .sampling = *s};
        b->stream_ok[i] = true;
        b->handles[i] = 0;
        assert_int_equal(hpd_client_submit(c, &p, on_token, on_done, b, &b->handles[i]), HPD_OK);
    }
    cl_wait(&cl, c, 300, batch_done, &run, "the 64 requests");
    hpd_client_destroy(c);
}

static void check_batch(const batch_t *b, tokens_t *ref, const char *what)
{
    int bad = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        if (b->status[i] != HPD_OK || b->n[i] != MAX_TOKENS || !b->stream_ok[i] ||
            b->attempts[i] == 0 || memcmp(b->tokens[i], ref[i], sizeof(ref[i])) != 0) {
            print_message("%s: prompt %d differs (status %s, %u tokens, stream %s, %u attempts)\n",
                          what, i, hpd_status_str(b->status[i]), b->n[i],
                          b->stream_ok[i] ? "ok" : "bad", b->attempts[i]);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

/* Over shared memory, prefill nodes copy every byte into the decode nodes'
 * pools mapped into them (UCX-allocated); over tcp, every byte is a UCX put. */
static void check_data_path(void)
{
    cl_status_t s;
    uint64_t put = 0, mapped = 0;
    cl_status(&cl, &s);
    for (uint32_t i = 0; i < s.nodes->via.array.size; i++) {
        put += cl_u64_at(&s.nodes->via.array.ptr[i], "stats.xfer.bytes_put");
        mapped += cl_u64_at(&s.nodes->via.array.ptr[i], "stats.xfer.bytes_mapped");
    }
    cl_status_free(&s);
    print_message("UCX_TLS=%s: %llu of %llu bytes sent copied into mapped pools\n", ucx_tls,
                  (unsigned long long)mapped, (unsigned long long)put);
    assert_true(put > 0);
    assert_true(mapped == (strcmp(ucx_tls, "tcp") == 0 ? 0 : put));
}

static const hpd_sampling_t greedy = {.top_p = 1};
static const hpd_sampling_t seeded = {.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 7};

static void test_bit_identical(void **state)
{
    static batch_t b;
    run_batch(&greedy, &b, NULL);
    check_batch(&b, ref_greedy(), "greedy");
    print_message("greedy: 64/64 identical to hpd-run, %u prompt tokens from prefix caches\n",
                  b.cached);
    assert_true(b.cached > 0);
    run_batch(&seeded, &b, NULL);
    check_batch(&b, ref_seeded(), "seeded");
    print_message("seeded sampling: 64/64 identical to hpd-run\n");
    /* no sampling fields: the model's generation_config.json values (the
     * model was made with SEEDED_ARGS' as its defaults), at the prefill node's
     * first token and the decode node's others */
    hpd_sampling_t unset = hpd_sampling_unset();
    unset.seed = seeded.seed;
    run_batch(&unset, &b, NULL);
    check_batch(&b, ref_seeded(), "generation defaults");
    print_message("generation defaults: 64/64 identical to hpd-run with them given\n");
    wait_idle();
    check_data_path();
    cl.passed++;
}

/* kill -9 of a prefill node and a decode node while they hold requests:
 * both are stopped first, so that what the coordinator says they hold stays
 * theirs until they die; while they hold nothing they go on, and a later
 * poll tries again. */
static uint64_t killed_holding;
static void kill_mid_load(batch_t *b)
{
    uint32_t streaming = 0;
    cl_status_t s;
    if (killed_holding > 0)
        return;
    for (int i = 0; i < N_PROMPTS; i++)
        streaming += b->streamed[i] > 1 && b->streamed[i] < MAX_TOKENS;
    if (b->done < 4 || (streaming == 0 && b->done < 48))
        return;
    cl_pause(nodes[0].p);
    cl_pause(nodes[3].p);
    cl_status(&cl, &s);
    const msgpack_object *p = cl_status_node(&s, nodes[0].name);
    const msgpack_object *d = cl_status_node(&s, nodes[3].name);
    assert_non_null(p);
    assert_non_null(d);
    const uint64_t held = cl_u64(p, "jobs") + cl_u64(d, "reserved_slots");
    cl_status_free(&s);
    if (held == 0) {
        cl_resume(nodes[0].p);
        cl_resume(nodes[3].p);
        return;
    }
    print_message("killing %s and %s, which hold %llu requests, with %u done and %u streaming\n",
                  nodes[0].name, nodes[3].name, (unsigned long long)held, b->done, streaming);
    cl_kill9(&cl, nodes[0].p);
    cl_kill9(&cl, nodes[3].p);
    killed_holding = held;
}

static void test_failover(void **state)
{
    static batch_t b;
    tokens_t *ref = ref_seeded();
    const cl_requests_t before = cl_requests(&cl);
    killed_holding = 0;
    run_batch(&seeded, &b, kill_mid_load);
    assert_true(killed_holding > 0);
    check_batch(&b, ref, "failover");
    /* what the killed nodes held ran again: every retry is one more attempt
     * of a request that then finished */
    const cl_requests_t after = cl_requests(&cl);
    uint64_t again = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        again += b.attempts[i] - 1;
    print_message("after kill -9 of a prefill and a decode node: 64/64 identical, %llu retries\n",
                  (unsigned long long)(after.retried - before.retried));
    assert_true(after.retried - before.retried >= 1);
    assert_int_equal(after.retried - before.retried, again);
    assert_int_equal(after.failed, before.failed);
    /* replacements join; the cluster is whole and idle again */
    start_node(&nodes[0]);
    start_node(&nodes[3]);
    wait_idle();
    cl.passed++;
}

/* 200 cancels and disconnects at random moments, then one more request
 * that must still be right, and nothing left allocated. */
typedef struct {
    uint32_t submitted, done, ok, canceled, by_reply, other;
    bool closing; /* hpd_client_destroy ends what is still open */
} count_t;

static void count_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    count_t *c = arg;
    c->done++;
    if (r->status == HPD_OK) {
        c->ok++;
    } else if (r->status == HPD_ERR_CANCELED) {
        c->canceled++;
        c->by_reply += !c->closing; /* the coordinator answered "canceled" */
    } else {
        print_message("a request of the cancel rounds ended with %s: %s\n",
                      hpd_status_str(r->status), r->error);
        c->other++;
    }
}

static void test_cancels_and_disconnects(void **state)
{
    tokens_t *ref = ref_greedy();
    uint32_t events = 0, round = 0;
    count_t all = {0};
    const cl_requests_t before = cl_requests(&cl);
    while (events < 200) {
        hpd_client_t *c = cl_client(&cl);
        count_t cnt = {0};
        uint64_t h[16];
        const uint32_t n = 8 + round % 8;
        for (uint32_t i = 0; i < n; i++) {
            const int k = (int)((round * 16 + i) % N_PROMPTS);
            hpd_generate_params_t p = {.prompt = prompts[k].ids,
                                       .n_prompt = (uint32_t)prompts[k].n,
                                       .max_tokens = MAX_TOKENS,
                                       .sampling = greedy};
            assert_int_equal(hpd_client_submit(c, &p, NULL, count_done, &cnt, &h[i]), HPD_OK);
            cnt.submitted++;
        }
        /* cancel about half at random moments, then drop the connection */
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t r = hpd_philox4x32(round, i, 9).v[0];
            hpd_client_poll(c, r % 40);
            if (r % 2 == 0) {
                hpd_client_cancel(c, h[i]);
                events++;
            }
        }
        hpd_client_poll(c, hpd_philox4x32(round, 99, 9).v[0] % 50);
        if (cnt.done < n)
            events++; /* a disconnect with requests in flight */
        cnt.closing = true;
        hpd_client_destroy(c);
        assert_int_equal(cnt.done, n);
        all.submitted += cnt.submitted;
        all.ok += cnt.ok;
        all.canceled += cnt.canceled;
        all.by_reply += cnt.by_reply;
        all.other += cnt.other;
        round++;
    }
    wait_idle();
    /* The coordinator ended every request one way: finished, or canceled
     * (by a cancel call or by the disconnect). What the client saw canceled
     * includes the requests finished as their connection closed. */
    const cl_requests_t after = cl_requests(&cl);
    const uint64_t finished = after.finished - before.finished;
    const uint64_t canceled = after.canceled - before.canceled;
    print_message("%u cancels and disconnects in %u rounds: %u requests; client: %u finished, "
                  "%u canceled (%u answered 'canceled'); coordinator: %llu finished, %llu "
                  "canceled\n", events, round, all.submitted, all.ok, all.canceled, all.by_reply,
                  (unsigned long long)finished, (unsigned long long)canceled);
    assert_int_equal(all.other, 0);
    assert_int_equal(after.failed, before.failed);
    assert_int_equal(after.rejected, before.rejected);
    assert_int_equal(finished + canceled, all.submitted);
    assert_true(finished >= all.ok);
    assert_true(canceled >= all.by_reply && canceled <= all.canceled);
    assert_true(all.by_reply > 0);
    /* still serving, still right */
    hpd_client_t *c = cl_client(&cl);
    hpd_generate_result_t r;
    hpd_generate_params_t p = {.prompt = prompts[5].ids,
                               .n_prompt = (uint32_t)prompts[5].n,
                               .max_tokens = MAX_TOKENS,
                               .sampling = greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    assert_int_equal(r.n_tokens, MAX_TOKENS);
    assert_memory_equal(r.tokens, ref[5], sizeof(ref[5]));
    hpd_generate_result_free(&r);
    hpd_client_destroy(c);
    cl.passed++;
}

/* Stop tokens through the cluster: the output ends at the first stop token
 * with finish reason "stop" and equals hpd-run's up to there; a stop at the
 * very first token (the prefill node's) ends at the decode node's start;
 * without stops the reason is "length". */
static void test_stop_tokens(void **state)
{
    hpd_client_t *c = cl_client(&cl);
    tokens_t *ref = ref_greedy();
    hpd_generate_result_t r;
    const int32_t stop = ref[0][4];
    uint32_t first = 0;
    while (ref[0][first] != stop)
        first++;
    hpd_generate_params_t p = {.prompt = prompts[0].ids,
                               .n_prompt = (uint32_t)prompts[0].n,
                               .max_tokens = MAX_TOKENS,
                               .sampling = greedy,
                               .stop_ids = &stop,
                               .n_stop = 1};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    assert_int_equal(r.n_tokens, first + 1);
    assert_memory_equal(r.tokens, ref[0], r.n_tokens * sizeof(int32_t));
    assert_string_equal(r.finish_reason, "stop");
    hpd_generate_result_free(&r);
    const int32_t at_first = ref[1][0];
    p.prompt = prompts[1].ids;
    p.n_prompt = (uint32_t)prompts[1].n;
    p.stop_ids = &at_first;
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    assert_int_equal(r.n_tokens, 1);
    assert_int_equal(r.tokens[0], at_first);
    assert_string_equal(r.finish_reason, "stop");
    hpd_generate_result_free(&r);
    p.min_tokens = MAX_TOKENS; /* no stop counts before the last token */
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    assert_int_equal(r.n_tokens, MAX_TOKENS);
    assert_memory_equal(r.tokens, ref[1], MAX_TOKENS * sizeof(int32_t));
    assert_string_equal(r.finish_reason, ref[1][MAX_TOKENS - 1] == at_first ? "stop" : "length");
    hpd_generate_result_free(&r);
    p.n_stop = 0;
    p.min_tokens = 0;
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    assert_string_equal(r.finish_reason, "length");
    hpd_generate_result_free(&r);
    hpd_client_destroy(c);
    wait_idle();
    cl.passed++;
}

/* Malformed requests get errors that name the problem; serving goes on. */
static void test_bad_requests(void **state)
{
    hpd_client_t *c = cl_client(&cl);
    hpd_generate_result_t r;
    int32_t bad_id[3] = {1, 512, 3}, ok[3] = {1, 2, 3};
    hpd_generate_params_t p = {
        .prompt = bad_id, .n_prompt = 3, .max_tokens = 4, .sampling = greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "prompt[1] is 512"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){.prompt = ok, .max_tokens = 4, .sampling = greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "empty"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){
        .prompt = ok, .n_prompt = 3, .max_tokens = 5000, .sampling = greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "max_tokens 5000"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){.prompt = ok,
                                .n_prompt = 3,
                                .max_tokens = 4,
                                .sampling = {.temperature = 0.5f, .top_p = 1.5f}};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "top_p"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = greedy,
                                .stop_ids = bad_id, .n_stop = 3};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "stop_token_ids[1] is 512"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = greedy,
                                .min_tokens = 5};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "min_tokens 5 exceeds max_tokens 4"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){.prompt = ok, .n_prompt = 3, .max_tokens = 4, .sampling = greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    hpd_generate_result_free(&r);
    hpd_client_destroy(c);

    /* the nodes themselves: malformed commands get errors naming the field */
    cl_status_t st;
    cl_status(&cl, &st);
    char *token = NULL;
    assert_int_equal(hpd_rpc_read_token(cl.token_file, &token), HPD_OK);
    struct event_base *base = event_base_new();
    assert_int_equal(st.nodes->via.array.size, N_NODES);
    for (uint32_t i = 0; i < st.nodes->via.array.size; i++) {
        const msgpack_object *addr = cl_field(&st.nodes->via.array.ptr[i], "address");
        char text[96], host[64];
        uint16_t port;
        snprintf(text, sizeof(text), "%.*s", (int)addr->via.str.size, addr->via.str.ptr);
        assert_true(hpd_proto_parse_endpoint(text, host, sizeof(host), &port));
        hpd_rpc_client_params_t cp = {.base = base, .host = host, .port = port, .token = token,
                                      .timeout_ms = 5000};
        hpd_rpc_client_t *rc;
        assert_int_equal(hpd_rpc_client_create(&cp, &rc), HPD_OK);
        const bool pre = cl_str_is(&st.nodes->via.array.ptr[i], "role", "prefill");
        hpd_rpc_buf_t b;
        hpd_rpc_result_t res;
        hpd_rpc_buf_init(&b);
        msgpack_pack_map(&b.pk, 2);
        hpd_proto_key(&b.pk, "job");
        msgpack_pack_uint64(&b.pk, 999999);
        hpd_proto_key(&b.pk, "prompt");
        msgpack_pack_array(&b.pk, 2);
        msgpack_pack_int(&b.pk, 3);
        msgpack_pack_int(&b.pk, -4);
        assert_int_equal(hpd_rpc_call_sync(rc, pre ? "prefill" : "reserve", &b, 0, &res), HPD_OK);
        assert_true(res.is_error);
        assert_int_equal(res.error_code, HPD_RPC_ERR_PARAMS);
        assert_non_null(strstr(res.error_message, "prompt[1] is -4"));
        hpd_rpc_result_destroy(&res);
        hpd_rpc_buf_destroy(&b);
        hpd_rpc_buf_init(&b);
        msgpack_pack_map(&b.pk, 0);
        assert_int_equal(hpd_rpc_call_sync(rc, pre ? "prefill" : "start", &b, 0, &res), HPD_OK);
        assert_true(res.is_error);
        assert_non_null(strstr(res.error_message, "field 'job' is missing"));
        hpd_rpc_result_destroy(&res);
        hpd_rpc_buf_destroy(&b);
        /* and it goes on serving */
        assert_int_equal(hpd_rpc_call_sync(rc, "stats", NULL, 0, &res), HPD_OK);
        assert_false(res.is_error);
        hpd_rpc_result_destroy(&res);
        hpd_rpc_client_destroy(rc);
    }
    event_base_free(base);
    free(token);
    cl_status_free(&st);
    cl.passed++;
}

/* Past --max-requests (80) the coordinator answers "overloaded" at once;
 * what it admitted completes. Then hpd-client prints what hpd-run prints. */
#define ADMITTED 80
#define OVER 5
#define ADMIT_TOKENS 4

typedef struct {
    uint64_t handles[ADMITTED + OVER];
    hpd_status_t status[ADMITTED + OVER];
    char error[ADMITTED + OVER][128];
    int32_t tokens[ADMITTED + OVER][ADMIT_TOKENS];
    uint32_t n[ADMITTED + OVER];
    bool done[ADMITTED + OVER];
    uint32_t n_done;
} admit_t;

static void on_admit_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    admit_t *a = arg;
    for (int i = 0; i < ADMITTED + OVER; i++) {
        if (a->handles[i] != h)
            continue;
        a->status[i] = r->status;
        snprintf(a->error[i], sizeof(a->error[i]), "%.120s", r->error);
        a->n[i] = r->n_tokens;
        if (r->tokens != NULL)
            memcpy(a->tokens[i], r->tokens, HPD_MIN(r->n_tokens, ADMIT_TOKENS) * sizeof(int32_t));
        a->done[i] = true;
        a->n_done++;
    }
}

static void admit_submit(hpd_client_t *c, admit_t *a, int from, int to)
{
    for (int i = from; i < to; i++) {
        hpd_generate_params_t p = {.prompt = prompts[i % N_PROMPTS].ids,
                                   .n_prompt = (uint32_t)prompts[i % N_PROMPTS].n,
                                   .max_tokens = ADMIT_TOKENS,
                                   .sampling = greedy};
        assert_int_equal(hpd_client_submit(c, &p, NULL, on_admit_done, a, &a->handles[i]),
                         HPD_OK);
    }
}

static bool all_admitted(cl_t *c, void *arg)
{
    return cl_requests(c).active == ADMITTED;
}

static bool over_answered(cl_t *c, void *arg)
{
    return ((admit_t *)arg)->n_done >= OVER;
}

static void test_admission_and_cli(void **state)
{
    static admit_t a;
    tokens_t *ref = ref_greedy();
    const cl_requests_t before = cl_requests(&cl);
    hpd_client_t *c = cl_client(&cl);
    assert_int_equal(before.active, 0);
    /* Admission must not race completion: with the prefill nodes stopped,
     * nothing admitted can finish until all 80 are in, then 5 more come. */
    memset(&a, 0, sizeof(a));
    cl_pause(nodes[0].p);
    cl_pause(nodes[1].p);
    admit_submit(c, &a, 0, ADMITTED);
    cl_wait(&cl, c, 120, all_admitted, NULL, "80 requests admitted");
    admit_submit(c, &a, ADMITTED, ADMITTED + OVER);
    cl_wait(&cl, c, 60, over_answered, &a, "answers to the 5 requests past the limit");
    for (int i = 0; i < ADMITTED + OVER; i++) {
        if (i < ADMITTED && a.done[i])
            fail_msg("request %d ended while nothing could finish: %s (%s)", i,
                     hpd_status_str(a.status[i]), a.error[i]);
        if (i >= ADMITTED && (!a.done[i] || a.status[i] != HPD_ERR_NO_RESOURCE ||
                              strstr(a.error[i], "overloaded") == NULL))
            fail_msg("request %d past the limit: %s (%s)", i,
                     a.done[i] ? hpd_status_str(a.status[i]) : "open", a.error[i]);
    }
    assert_int_equal(cl_requests(&cl).rejected - before.rejected, OVER);
    cl_resume(nodes[0].p);
    cl_resume(nodes[1].p);
    cl_client_wait(&cl, c, 300, "the 80 admitted requests");
    for (int i = 0; i < ADMITTED; i++) {
        if (a.status[i] != HPD_OK || a.n[i] != ADMIT_TOKENS ||
            memcmp(a.tokens[i], ref[i % N_PROMPTS], sizeof(a.tokens[i])) != 0)
            fail_msg("admitted request %d: %s (%s), %u tokens", i, hpd_status_str(a.status[i]),
                     a.error[i], a.n[i]);
    }
    print_message("85 requests with --max-requests 80: the 80 admitted completed, identical to "
                  "hpd-run; 5 overloaded\n");
    hpd_client_destroy(c);
    wait_idle();

    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "timeout 300 %s --model %s --prompts-file %s --max-tokens 8 --threads 2 "
             "--device %s > %s/run.out && "
             "timeout 300 %s --coordinator %s --token-file %s generate --prompts-file %s "
             "--max-tokens 8 --stream > %s/client.out && cmp %s/run.out %s/client.out",
             HPD_RUN, cl.model, prompts_file, device, cl.root, HPD_CLIENT, cl.addr, cl.keys_file,
             prompts_file, cl.root, cl.root, cl.root);
    assert_int_equal(system(cmd), 0);
    cl.passed++;
}

/* Last: every process exits 0 on SIGTERM (the nodes drain, then the
 * coordinator drains and stops), and no log holds a sanitizer report. */
/* n choices from one prefill: 16 prompts of 4 seeded choices each through
 * both prefill and both decode layouts equal hpd-run --n 4's lines (choice
 * c is the request with seed + c); choice 0 streams as a single answer
 * does. Then again with the decode node that holds some of them killed
 * (-9) mid-stream: they run again elsewhere, computed again (a request of
 * several choices replays nothing) and still right. Nothing stays held. */
#define CH_PROMPTS 16
#define CH_N 4
typedef struct {
    int32_t tokens[CH_PROMPTS][CH_N][MAX_TOKENS];
    uint32_t n[CH_PROMPTS][CH_N], streamed[CH_PROMPTS], attempts[CH_PROMPTS];
    hpd_status_t status[CH_PROMPTS];
    uint64_t handles[CH_PROMPTS];
    uint32_t done;
    bool stream_ok[CH_PROMPTS];
    cl_proc_t *victim; /* killed once it holds requests mid-stream (NULL: none) */
    bool killed;
} ch_batch_t;

static int ch_index(const ch_batch_t *b, uint64_t h)
{
    for (int i = 0; i < CH_PROMPTS; i++)
        if (b->handles[i] == h)
            return i;
    return -1;
}

static void ch_token(void *arg, uint64_t h, uint32_t index, const int32_t *ids, uint32_t n)
{
    ch_batch_t *b = arg;
    const int i = ch_index(b, h);
    if (i < 0)
        return;
    if (index != b->streamed[i])
        b->stream_ok[i] = false;
    for (uint32_t k = 0; k < n && index + k < MAX_TOKENS; k++)
        b->tokens[i][0][index + k] = ids[k];
    b->streamed[i] = index + n;
}

static void ch_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    ch_batch_t *b = arg;
    const int i = ch_index(b, h);
    if (i < 0)
        return;
    b->status[i] = r->status;
    b->attempts[i] = r->attempts;
    b->done++;
    if (r->status != HPD_OK) {
        print_message("choices of prompt %d: %s\n", i, r->error);
        return;
    }
    if (r->n_more != CH_N - 1 || b->streamed[i] != r->n_tokens ||
        memcmp(b->tokens[i][0], r->tokens, r->n_tokens * sizeof(int32_t)) != 0)
        b->stream_ok[i] = false;
    b->n[i][0] = r->n_tokens;
    for (uint32_t k = 0; k < r->n_more && k + 1 < CH_N; k++) {
        b->n[i][k + 1] = r->more[k].n_tokens;
        memcpy(b->tokens[i][k + 1], r->more[k].tokens,
               HPD_MIN(r->more[k].n_tokens, MAX_TOKENS) * sizeof(int32_t));
    }
}

static bool ch_over(cl_t *c, void *arg)
{
    ch_batch_t *b = arg;
    uint32_t streaming = 0;
    for (int i = 0; i < CH_PROMPTS; i++)
        streaming += b->streamed[i] > 1 && b->streamed[i] < MAX_TOKENS;
    if (b->victim != NULL && !b->killed && streaming > 0) {
        cl_status_t s;
        cl_pause(b->victim);
        cl_status(&cl, &s);
        const msgpack_object *d = cl_status_node(&s, b->victim->name);
        const uint64_t held = d != NULL ? cl_u64(d, "reserved_slots") : 0;
        cl_status_free(&s);
        if (held >= CH_N) {
            print_message("killing %s, which holds %llu slots of choices, with %u requests "
                          "done\n", b->victim->name, (unsigned long long)held, b->done);
            cl_kill9(&cl, b->victim);
            b->killed = true;
        } else {
            cl_resume(b->victim);
        }
    }
    return b->done == CH_PROMPTS;
}

static void run_choices(ch_batch_t *b, const int32_t (*ref)[MAX_TOKENS], const char *what)
{
    hpd_client_t *c = cl_client(&cl);
    for (int i = 0; i < CH_PROMPTS; i++) {
        hpd_generate_params_t p = {.prompt = prompts[i].ids,
                                   .n_prompt = (uint32_t)prompts[i].n,
                                   .max_tokens = MAX_TOKENS,
                                   .sampling = seeded,
                                   .n = CH_N};
        b->stream_ok[i] = true;
        assert_int_equal(hpd_client_submit(c, &p, ch_token, ch_done, b, &b->handles[i]), HPD_OK);
    }
    cl_wait(&cl, c, 300, ch_over, b, "the requests of choices");
    hpd_client_destroy(c);
    int bad = 0;
    for (int i = 0; i < CH_PROMPTS; i++)
        for (int k = 0; k < CH_N; k++)
            if (b->status[i] != HPD_OK || !b->stream_ok[i] || b->n[i][k] != MAX_TOKENS ||
                memcmp(b->tokens[i][k], ref[i * CH_N + k], sizeof(ref[0])) != 0) {
                print_message("%s: prompt %d choice %d differs from hpd-run --n %d's (status "
                              "%s, %u tokens, stream %s)\n", what, i, k, CH_N,
                              hpd_status_str(b->status[i]), b->n[i][k],
                              b->stream_ok[i] ? "ok" : "bad");
                bad++;
            }
    assert_int_equal(bad, 0);
}

static void test_choices(void **state)
{
    static int32_t ref[CH_PROMPTS * CH_N][MAX_TOKENS];
    static ch_batch_t b;
    char file[320];
    snprintf(file, sizeof(file), "%s/prompts-choices", cl.root);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    for (int i = 0; i < CH_PROMPTS; i++)
        for (size_t t = 0; t < prompts[i].n; t++)
            fprintf(f, t + 1 < prompts[i].n ? "%d," : "%d\n", prompts[i].ids[t]);
    fclose(f);
    cl_reference(&cl, file, CH_PROMPTS * CH_N, MAX_TOKENS, "--n 4 " SEEDED_ARGS, &ref[0][0]);
    memset(&b, 0, sizeof(b));
    run_choices(&b, (const int32_t(*)[MAX_TOKENS])ref, "choices");
    print_message("choices: %d prompts x %d choices identical to hpd-run --n %d\n", CH_PROMPTS,
                  CH_N, CH_N);
    wait_idle();
    const cl_requests_t before = cl_requests(&cl);
    memset(&b, 0, sizeof(b));
    b.victim = nodes[3].p;
    run_choices(&b, (const int32_t(*)[MAX_TOKENS])ref, "choices after a kill");
    assert_true(b.killed);
    const cl_requests_t after = cl_requests(&cl);
    print_message("choices after kill -9 of %s: identical, %llu retries\n", nodes[3].name,
                  (unsigned long long)(after.retried - before.retried));
    assert_true(after.retried > before.retried);
    assert_int_equal(after.failed, before.failed);
    start_node(&nodes[3]);
    wait_idle();
    cl.passed++;
}

static void test_clean_exit(void **state)
{
    cl_stop_all(&cl);
    cl.passed++;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_stop_tokens),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_choices),
        cmocka_unit_test(test_cancels_and_disconnects),
        cmocka_unit_test(test_admission_and_cli),
        cmocka_unit_test(test_clean_exit), /* last: stops the cluster */
    };
    cl.cases = sizeof(tests) / sizeof(tests[0]);
    signal(SIGPIPE, SIG_IGN);
    if (getenv("HPD_TEST_UCX_TLS") != NULL)
        ucx_tls = getenv("HPD_TEST_UCX_TLS");
    /* skips only where HPD_TEST_DEVICE names a GPU and the machine has none */
    hpd_backend_destroy(test_open_device("cpu", 1, &device));
    return cmocka_run_group_tests(tests, setup, teardown);
}
