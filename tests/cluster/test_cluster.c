/* The cluster as separate processes on 127.0.0.1: one coordinator, two
 * prefill nodes (B=64,P=1 NHD and B=32,P=2 NHD) and two decode nodes
 * (B=16,P=4 NHD and B=16,P=1 HND) on a small generated model with four
 * full-attention layers. Every output must equal hpd-run's, under load, with
 * nodes killed (-9) mid-load, and after 200 cancels and disconnects nothing
 * may stay allocated beyond the prefix caches.
 *
 * HPD_TEST_DEVICE=cuda runs the same on the GPU (every node and hpd-run with
 * --device cuda; ctest's test_cluster_cuda, label gpu); it exits 77 without
 * a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <fcntl.h>

#include "client/client.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "node/proto.h"
#include "tests/test_device.h"
#include "tests/test_helpers.h"

#define MODEL_ARGS "--hidden 128 --layers 8 --full-interval 2 --intermediate 256 --vocab 512 " \
                   "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "     \
                   "--lin-k-dim 32 --lin-v-dim 32 --seed 5"
#define N_PROMPTS 64
#define MAX_TOKENS 20

static char root[256], model[300], token_file[300], prompts_file[300];
static char coord_addr[64];
static const char *device = "cpu"; /* HPD_TEST_DEVICE */
static const char *ucx_tls = "tcp"; /* HPD_TEST_UCX_TLS: the nodes' data plane */
static uint16_t coord_port;
static pid_t coord_pid;

typedef struct {
    const char *role, *name, *layout;
    pid_t pid;
} node_proc_t;

static node_proc_t nodes[] = {
    {"prefill", "p64", "64,1,nhd", 0},
    {"prefill", "p32", "32,2,nhd", 0},
    {"decode", "d16x4", "16,4,nhd", 0},
    {"decode", "d16hnd", "16,1,hnd", 0},
};
#define N_NODES (sizeof(nodes) / sizeof(nodes[0]))

static hpd_prompt_t prompts[N_PROMPTS];

static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static void start_node(node_proc_t *n)
{
    char log[400];
    snprintf(log, sizeof(log), "%s/%s.log", root, n->name);
    char *argv[] = {(char *)(strcmp(n->role, "prefill") == 0 ? HPD_PREFILL : HPD_DECODE),
                    "--coordinator", coord_addr, "--token-file", token_file, "--model", model,
                    "--name", (char *)n->name, "--kv-layout", (char *)n->layout,
                    "--threads", "1", "--max-batch", "16", "--max-context", "1024",
                    "--prefill-chunk", "128", "--reserve-timeout-ms", "30000",
                    "--device", (char *)device, "--ucx-tls", (char *)ucx_tls,
                    "--log-level", "warn", NULL};
    n->pid = spawn(argv, log);
}

static hpd_client_t *connect_client(void)
{
    char *token = NULL;
    hpd_client_t *c;
    assert_int_equal(hpd_rpc_read_token(token_file, &token), HPD_OK);
    hpd_client_params_t p = {"127.0.0.1", coord_port, token, 300000};
    assert_int_equal(hpd_client_create(&p, &c), HPD_OK);
    free(token);
    return c;
}

/* Status numbers of every node: sums and whether each is idle. */
typedef struct {
    uint32_t n_nodes;
    bool idle; /* nothing in use beyond the caches, no job, no open transfer */
    uint32_t active;
} cluster_state_t;

static const msgpack_object *get(const msgpack_object *m, const char *k)
{
    return hpd_rpc_map_get(m, k);
}

static uint64_t u(const msgpack_object *m, const char *k)
{
    const msgpack_object *v = m ? get(m, k) : NULL;
    return v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? v->via.u64 : 0;
}

static cluster_state_t cluster_state(hpd_client_t *c)
{
    cluster_state_t s = {0, true, 0};
    hpd_rpc_result_t r;
    assert_int_equal(hpd_client_status(c, &r), HPD_OK);
    const msgpack_object *ns = get(&r.result, "nodes");
    s.active = (uint32_t)u(get(&r.result, "requests"), "active");
    s.idle = s.active == 0;
    for (uint32_t i = 0; ns && i < ns->via.array.size; i++) {
        const msgpack_object *st = get(&ns->via.array.ptr[i], "stats");
        if (st == NULL || st->type != MSGPACK_OBJECT_MAP) {
            s.idle = false;
            continue;
        }
        s.n_nodes++;
        const msgpack_object *load = get(st, "load");
        if (u(st, "pages_used") != u(st, "cache_pages") || u(st, "slots_used") != 0 ||
            u(st, "audit_errors") != 0 || u(get(st, "xfer"), "open_transfers") != 0 ||
            u(load, "jobs_queued") + u(load, "jobs_running") + u(load, "jobs_finishing") +
                    u(load, "reserved") + u(load, "running") != 0 ||
            u(&ns->via.array.ptr[i], "reserved_slots") != 0 || u(&ns->via.array.ptr[i], "jobs"))
            s.idle = false;
    }
    hpd_rpc_result_destroy(&r);
    return s;
}

/* Waits (heartbeats refresh every 100 ms) until n nodes are registered and
 * idle; fails the test after 30 s. */
static void wait_idle(uint32_t n)
{
    hpd_client_t *c = connect_client();
    cluster_state_t s = {0};
    for (int i = 0; i < 300; i++) {
        s = cluster_state(c);
        if (s.n_nodes == n && s.idle)
            break;
        usleep(100 * 1000);
    }
    hpd_client_destroy(c);
    if (!(s.n_nodes == n && s.idle))
        fail_msg("cluster not idle: %u nodes registered (want %u), %u requests active, idle %d",
                 s.n_nodes, n, s.active, s.idle);
}

static int setup(void **state)
{
    char log[400], port_file[300];
    test_tmpdir(root, sizeof(root), "cluster");
    snprintf(model, sizeof(model), "%s/model", root);
    snprintf(token_file, sizeof(token_file), "%s/token", root);
    snprintf(prompts_file, sizeof(prompts_file), "%s/prompts", root);
    snprintf(port_file, sizeof(port_file), "%s/port", root);
    if (test_mkmodel(model, MODEL_ARGS) != 0 ||
        hpd_write_file(token_file, "cluster-secret\n", 15) != HPD_OK)
        return -1;
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
    snprintf(log, sizeof(log), "%s/coordinator.log", root);
    char *argv[] = {HPD_COORDINATOR, "--port", "0", "--port-file", port_file, "--token-file",
                    token_file, "--heartbeat-ms", "100", "--lease-ms", "5000", "--max-requests", "80",
                    "--log-level", "info", NULL};
    coord_pid = spawn(argv, log);
    for (int i = 0; i < 100; i++) {
        char *text;
        size_t len;
        if (access(port_file, R_OK) == 0 && hpd_read_file(port_file, &text, &len) == HPD_OK) {
            coord_port = (uint16_t)atoi(text);
            free(text);
            if (coord_port != 0)
                break;
        }
        usleep(50 * 1000);
    }
    if (coord_port == 0)
        return -1;
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", coord_port);
    for (size_t i = 0; i < N_NODES; i++)
        start_node(&nodes[i]);
    wait_idle(N_NODES);
    return 0;
}

static int teardown(void **state)
{
    int st;
    for (size_t i = 0; i < N_NODES; i++)
        if (nodes[i].pid > 0) {
            kill(nodes[i].pid, SIGTERM);
            waitpid(nodes[i].pid, &st, 0);
        }
    kill(coord_pid, SIGTERM);
    waitpid(coord_pid, &st, 0);
    for (int i = 0; i < N_PROMPTS; i++)
        free(prompts[i].ids);
    if (getenv("HPD_KEEP_TEST_DIR") == NULL)
        test_rmtree(root);
    else
        fprintf(stderr, "logs in %s\n", root);
    return 0;
}

/* hpd-run's lines for the prompts file. */
static void reference(const char *sampling, int32_t out[][MAX_TOKENS])
{
    char cmd[2048], line[8192];
    snprintf(cmd, sizeof(cmd),
             "OMP_WAIT_POLICY=passive %s --model %s --prompts-file %s --max-tokens %d "
             "--threads 2 --device %s %s",
             HPD_RUN, model, prompts_file, MAX_TOKENS, device, sampling);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_non_null(fgets(line, sizeof(line), p));
        char *s = line, *end;
        for (int t = 0; t < MAX_TOKENS; t++) {
            out[i][t] = (int32_t)strtol(s, &end, 10);
            assert_true(end != s);
            s = end;
        }
    }
    assert_int_equal(pclose(p), 0);
}

typedef struct {
    int32_t tokens[N_PROMPTS][MAX_TOKENS];
    uint32_t n[N_PROMPTS];
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

/* Runs the 64 prompts at once; `during` is called between polls. */
static void run_batch(const hpd_sampling_t *s, batch_t *b, void (*during)(batch_t *))
{
    hpd_client_t *c = connect_client();
    memset(b, 0, sizeof(*b));
    for (int i = 0; i < N_PROMPTS; i++) {
        hpd_generate_params_t p = {prompts[i].ids, (uint32_t)prompts[i].n, MAX_TOKENS, *s};
        b->stream_ok[i] = true;
        b->handles[i] = 0;
        assert_int_equal(hpd_client_submit(c, &p, on_token, on_done, b, &b->handles[i]), HPD_OK);
    }
    while (b->done < N_PROMPTS) {
        hpd_client_poll(c, 100);
        if (during != NULL)
            during(b);
    }
    hpd_client_destroy(c);
}

static void check_batch(const batch_t *b, int32_t ref[][MAX_TOKENS], const char *what)
{
    int bad = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        if (b->status[i] != HPD_OK || b->n[i] != MAX_TOKENS || !b->stream_ok[i] ||
            memcmp(b->tokens[i], ref[i], sizeof(ref[i])) != 0) {
            print_message("%s: prompt %d differs (status %s, %u tokens, stream %s)\n", what, i,
                          hpd_status_str(b->status[i]), b->n[i], b->stream_ok[i] ? "ok" : "bad");
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

/* Over shared memory, prefill nodes copy every byte into the decode nodes'
 * pools mapped into them (UCX-allocated); over tcp, every byte is a UCX put. */
static void check_data_path(void)
{
    hpd_client_t *c = connect_client();
    hpd_rpc_result_t r;
    uint64_t put = 0, mapped = 0;
    assert_int_equal(hpd_client_status(c, &r), HPD_OK);
    const msgpack_object *ns = get(&r.result, "nodes");
    for (uint32_t i = 0; ns && i < ns->via.array.size; i++) {
        const msgpack_object *xfer = get(get(&ns->via.array.ptr[i], "stats"), "xfer");
        put += u(xfer, "bytes_put");
        mapped += u(xfer, "bytes_mapped");
    }
    hpd_rpc_result_destroy(&r);
    hpd_client_destroy(c);
    print_message("UCX_TLS=%s: %llu of %llu bytes sent copied into mapped pools\n", ucx_tls,
                  (unsigned long long)mapped, (unsigned long long)put);
    assert_true(put > 0);
    assert_true(mapped == (strcmp(ucx_tls, "tcp") == 0 ? 0 : put));
}

static const hpd_sampling_t greedy = {0, 1, 0, 0};
static const hpd_sampling_t seeded = {0.8f, 0.9f, 40, 7};

static void test_bit_identical(void **state)
{
    static int32_t ref_g[N_PROMPTS][MAX_TOKENS], ref_s[N_PROMPTS][MAX_TOKENS];
    static batch_t b;
    reference("", ref_g);
    reference("--temperature 0.8 --top-p 0.9 --top-k 40 --seed 7", ref_s);
    run_batch(&greedy, &b, NULL);
    check_batch(&b, ref_g, "greedy");
    print_message("greedy: 64/64 identical to hpd-run, %u prompt tokens from prefix caches\n",
                  b.cached);
    assert_true(b.cached > 0);
    run_batch(&seeded, &b, NULL);
    check_batch(&b, ref_s, "seeded");
    print_message("seeded sampling: 64/64 identical to hpd-run\n");
    wait_idle(N_NODES);
    check_data_path();
}

/* kill -9 of a prefill node and of a decode node while requests run */
static int killed;
static void kill_mid_load(batch_t *b)
{
    uint32_t streaming = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        streaming += b->streamed[i] > 1 && b->streamed[i] < MAX_TOKENS;
    if (killed == 0 && b->done >= 4 && (streaming > 0 || b->done >= 48)) {
        print_message("killing %s and %s with %u requests done, %u streaming\n", nodes[0].name,
                      nodes[3].name, b->done, streaming);
        kill(nodes[0].pid, SIGKILL);
        kill(nodes[3].pid, SIGKILL);
        killed = 1;
    }
}

static void test_failover(void **state)
{
    static int32_t ref[N_PROMPTS][MAX_TOKENS];
    static batch_t b;
    int st;
    reference("--temperature 0.8 --top-p 0.9 --top-k 40 --seed 7", ref);
    killed = 0;
    run_batch(&seeded, &b, kill_mid_load);
    assert_int_equal(killed, 1);
    check_batch(&b, ref, "failover");
    print_message("after kill -9 of a prefill and a decode node: 64/64 identical\n");
    waitpid(nodes[0].pid, &st, 0);
    waitpid(nodes[3].pid, &st, 0);
    /* replacements join; the cluster is whole and idle again */
    start_node(&nodes[0]);
    start_node(&nodes[3]);
    wait_idle(N_NODES);
}

/* 200 cancels and disconnects at random moments, then one more request
 * that must still be right, and nothing left allocated. */
typedef struct {
    uint32_t done;
} count_t;

static void count_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    ((count_t *)arg)->done++;
}

static void count_outcome(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    if (r->status == HPD_ERR_NO_RESOURCE && strstr(r->error, "overloaded") != NULL)
        (*(uint32_t *)arg)++;
    else
        assert_int_equal(r->status, HPD_OK);
}

static void test_cancels_and_disconnects(void **state)
{
    static int32_t ref[N_PROMPTS][MAX_TOKENS];
    uint32_t events = 0, round = 0;
    reference("", ref);
    while (events < 200) {
        hpd_client_t *c = connect_client();
        count_t cnt = {0};
        uint64_t h[16];
        const uint32_t n = 8 + round % 8;
        for (uint32_t i = 0; i < n; i++) {
            const int k = (int)((round * 16 + i) % N_PROMPTS);
            hpd_generate_params_t p = {prompts[k].ids, (uint32_t)prompts[k].n, MAX_TOKENS,
                                       greedy};
            assert_int_equal(hpd_client_submit(c, &p, NULL, count_done, &cnt, &h[i]), HPD_OK);
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
        hpd_client_destroy(c);
        round++;
    }
    print_message("%u cancels and disconnects in %u rounds\n", events, round);
    wait_idle(N_NODES);
    /* still serving, still right */
    hpd_client_t *c = connect_client();
    hpd_generate_result_t r;
    hpd_generate_params_t p = {prompts[5].ids, (uint32_t)prompts[5].n, MAX_TOKENS, greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    assert_int_equal(r.n_tokens, MAX_TOKENS);
    assert_memory_equal(r.tokens, ref[5], sizeof(ref[5]));
    hpd_generate_result_free(&r);
    hpd_client_destroy(c);
}

/* Malformed requests get errors that name the problem; serving goes on. */
static void test_bad_requests(void **state)
{
    hpd_client_t *c = connect_client();
    hpd_generate_result_t r;
    int32_t bad_id[3] = {1, 512, 3}, ok[3] = {1, 2, 3};
    hpd_generate_params_t p = {bad_id, 3, 4, greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "prompt[1] is 512"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){ok, 0, 4, greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "empty"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){ok, 3, 5000, greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "max_tokens 5000"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){ok, 3, 4, {0.5f, 1.5f, 0, 0}};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_ERR_INVALID_ARG);
    assert_non_null(strstr(r.error, "top_p"));
    hpd_generate_result_free(&r);
    p = (hpd_generate_params_t){ok, 3, 4, greedy};
    assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
    hpd_generate_result_free(&r);

    /* the nodes themselves: malformed commands get errors naming the field */
    hpd_rpc_result_t st;
    assert_int_equal(hpd_client_status(c, &st), HPD_OK);
    const msgpack_object *ns = get(&st.result, "nodes");
    char *token = NULL;
    assert_int_equal(hpd_rpc_read_token(token_file, &token), HPD_OK);
    struct event_base *base = event_base_new();
    for (uint32_t i = 0; i < ns->via.array.size; i++) {
        const msgpack_object *addr = get(&ns->via.array.ptr[i], "address");
        const msgpack_object *role = get(&ns->via.array.ptr[i], "role");
        char text[96], host[64];
        uint16_t port;
        snprintf(text, sizeof(text), "%.*s", (int)addr->via.str.size, addr->via.str.ptr);
        assert_true(hpd_proto_parse_endpoint(text, host, sizeof(host), &port));
        hpd_rpc_client_params_t cp = {base, host, port, token, 5000, 0, NULL, NULL, NULL};
        hpd_rpc_client_t *rc;
        assert_int_equal(hpd_rpc_client_create(&cp, &rc), HPD_OK);
        const bool pre = hpd_rpc_str_eq(role->via.str.ptr, role->via.str.size, "prefill");
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
    hpd_rpc_result_destroy(&st);
    hpd_client_destroy(c);
}

/* Past --max-requests (80) the coordinator answers "overloaded" at once;
 * what it admitted completes. Then hpd-client prints what hpd-run prints. */
static void test_admission_and_cli(void **state)
{
    hpd_client_t *c;
    uint32_t over = 0, ok = 0;
    /* 85 at once: the 5 past the limit are refused at once, the rest complete */
    c = connect_client();
    for (int i = 0; i < 85; i++) {
        hpd_generate_params_t p = {prompts[i % N_PROMPTS].ids, (uint32_t)prompts[i % N_PROMPTS].n,
                                   4, greedy};
        uint64_t h;
        assert_int_equal(hpd_client_submit(c, &p, NULL, count_outcome, &over, &h), HPD_OK);
    }
    while (hpd_client_pending(c) > 0)
        hpd_client_poll(c, 100);
    ok = 85 - over;
    print_message("85 requests at once with --max-requests 80: %u admitted, %u overloaded\n", ok,
                  over);
    assert_int_equal(over, 5);
    hpd_client_destroy(c);
    wait_idle(N_NODES);

    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s --model %s --prompts-file %s --max-tokens 8 --threads 2 --device %s "
             "> %s/run.out && "
             "%s --coordinator %s --token-file %s generate --prompts-file %s --max-tokens 8 "
             "--stream > %s/client.out && cmp %s/run.out %s/client.out",
             HPD_RUN, model, prompts_file, device, root, HPD_CLIENT, coord_addr, token_file,
             prompts_file, root, root, root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_cancels_and_disconnects),
        cmocka_unit_test(test_admission_and_cli),
    };
    signal(SIGPIPE, SIG_IGN);
    if (getenv("HPD_TEST_UCX_TLS") != NULL)
        ucx_tls = getenv("HPD_TEST_UCX_TLS");
    /* skips only where HPD_TEST_DEVICE names a GPU and the machine has none */
    hpd_backend_destroy(test_open_device("cpu", 1, &device));
    return cmocka_run_group_tests(tests, setup, teardown);
}
