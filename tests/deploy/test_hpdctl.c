/* hpdctl on deploy/examples/local.yaml (with the model, token and state in
 * a temporary directory and every port replaced by a free one picked at
 * random, so that two runs do not collide): up until healthy,
 * status, requests while /metrics is scraped (counters move and end equal
 * to what the client saw), logs with request ids, a graceful down with a
 * request in flight, a failing up that names the process and stops the
 * rest, up on a partly running cluster (starts only what is missing),
 * restart of one process, a 1,000-node manifest, render output
 * (systemd-analyze verify where available; the Kubernetes YAML parses and
 * names every node), and a cluster whose coordinator has a standby elected
 * through an etcd that up starts (skipped without etcd-server unless
 * HPD_REQUIRE_ETCD=1). */
#include "tests/cluster/failover.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <yaml.h>

#include "deploy/manifest.h"

#define MODEL_ARGS "--hidden 128 --layers 8 --full-interval 2 --intermediate 256 --vocab 512 " \
                   "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "     \
                   "--lin-k-dim 32 --lin-v-dim 32 --seed 5"
#define N_REQ 12

static cl_t cl; /* its directory, and waits with deadlines (no process of its own) */
static char manifest[300], token_file[300], keys_file[300], state_dir[300];
static char ha[400]; /* test_standby_through_etcd's manifest */
static char doors[400]; /* test_up_with_a_door's */
static pid_t fake_node; /* test_up_with_a_node_left's, while it runs */

/* The ports of local.yaml (176xx) and the free ones that replace them. */
static struct {
    unsigned example;
    uint16_t port;
} ports[24];
static uint32_t n_ports;

static uint16_t port_of(unsigned example)
{
    for (uint32_t i = 0; i < n_ports; i++)
        if (ports[i].example == example)
            return ports[i].port;
    fail_msg("port %u is not in local.yaml", example);
    return 0;
}

/* Binds a listening-capable socket to 127.0.0.1:port; -1 when taken. */
static int try_bind(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

/* A free port for each port of local.yaml, at random below the kernel's
 * ephemeral range (no outgoing connection takes a port there while the
 * cluster starts), each checked free by binding it; all are held until
 * every one is picked, then released for the cluster to take. */
static void pick_ports(void)
{
    char src[512], *text;
    size_t len;
    int fds[24];
    /* and the ones test_standby_through_etcd adds: etcd's two, a standby's
     * three; test_up_with_a_door's door's three */
    static const unsigned extra[] = {17630, 17631, 17700, 17701, 17702, 17640, 17641, 17642};
    unsigned ephemeral = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%u", &ephemeral) != 1 || ephemeral <= 12000)
            ephemeral = 32768;
        fclose(f);
    }
    snprintf(src, sizeof(src), "%s/deploy/examples/local.yaml", HPD_SOURCE_DIR);
    assert_int_equal(hpd_read_file(src, &text, &len), HPD_OK);
    uint64_t draw = 0;
    const uint64_t seed = (uint64_t)getpid() << 32 ^ (uint64_t)(hpd_time_now() * 1e6);
    const char *s = strstr(text, "port: 176");
    for (size_t x = 0; s != NULL || x < HPD_ARRAY_SIZE(extra);) {
        unsigned example;
        if (s != NULL) {
            example = (unsigned)atoi(s + 6);
            s = strstr(s + 1, "port: 176");
        } else {
            example = extra[x++];
        }
        bool seen = false;
        for (uint32_t i = 0; i < n_ports; i++)
            seen |= ports[i].example == example;
        if (seen)
            continue;
        assert_true(n_ports < 24);
        do {
            assert_true(draw < 1000);
            ports[n_ports].port =
                (uint16_t)(10000 + hpd_philox4x32(seed, draw++, 0).v[0] % (ephemeral - 10000));
        } while ((fds[n_ports] = try_bind(ports[n_ports].port)) < 0);
        ports[n_ports].example = example;
        n_ports++;
    }
    for (uint32_t i = 0; i < n_ports; i++)
        close(fds[i]);
    free(text);
}

/* local.yaml with its paths in the test's directory and the free ports */
static void write_manifest(const char *path, const char *decode_tls)
{
    char src[512], *text, out[16384];
    size_t len, used = 0;
    snprintf(src, sizeof(src), "%s/deploy/examples/local.yaml", HPD_SOURCE_DIR);
    assert_int_equal(hpd_read_file(src, &text, &len), HPD_OK);
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char buf[600];
        char *port = strstr(line, "port: 176");
        if (strncmp(line, "model:", 6) == 0)
            snprintf(buf, sizeof(buf), "model: %s/model", cl.root);
        else if (strncmp(line, "token_file:", 11) == 0)
            snprintf(buf, sizeof(buf), "token_file: %s", token_file);
        else if (strncmp(line, "state_dir:", 10) == 0)
            snprintf(buf, sizeof(buf), "state_dir: %s", state_dir);
        else if (port != NULL)
            snprintf(buf, sizeof(buf), "%.*sport: %u%s", (int)(port - line), line,
                     port_of((unsigned)atoi(port + 6)), port + 11);
        else
            snprintf(buf, sizeof(buf), "%s", line);
        used += (size_t)snprintf(out + used, sizeof(out) - used, "%s\n", buf);
        if (decode_tls != NULL && strstr(line, "role: decode") != NULL)
            used += (size_t)snprintf(out + used, sizeof(out) - used,
                                     "    ucx: {tls: %s, dev: lo}\n", decode_tls);
    }
    free(text);
    assert_int_equal(hpd_write_file(path, out, used), HPD_OK);
}

/* Runs hpdctl with arguments; stdout+stderr into *out (malloc'd). */
static int hpdctl(char **out, const char *fmt, ...)
{
    char args[1024], cmd[2048], log[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(log, sizeof(log), "%s/hpdctl.out", cl.root);
    snprintf(cmd, sizeof(cmd), "%s %s > %s 2>&1", HPDCTL, args, log);
    int rc = system(cmd);
    size_t len;
    if (out != NULL && hpd_read_file(log, out, &len) != HPD_OK)
        *out = strdup("");
    if (out != NULL)
        fprintf(stderr, "$ hpdctl %s\n%s", args, *out);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int setup(void **state)
{
    char dir[300];
    test_tmpdir(cl.root, sizeof(cl.root), "hpdctl");
    snprintf(dir, sizeof(dir), "%s/model", cl.root);
    snprintf(manifest, sizeof(manifest), "%s/local.yaml", cl.root);
    snprintf(token_file, sizeof(token_file), "%s/secret/token", cl.root);
    snprintf(keys_file, sizeof(keys_file), "%s/secret/client-keys", cl.root);
    snprintf(state_dir, sizeof(state_dir), "%s/state", cl.root);
    if (test_mkmodel(dir, MODEL_ARGS) != 0)
        return -1;
    pick_ports();
    write_manifest(manifest, NULL);
    return 0;
}

static int teardown(void **state)
{
    if (fake_node > 0) { /* test_up_with_a_node_left failed */
        kill(fake_node, SIGKILL);
        waitpid(fake_node, NULL, 0);
    }
    hpdctl(NULL, "down %s --timeout-s 10", manifest); /* whatever a failure left */
    if (ha[0] != '\0')
        hpdctl(NULL, "down %s --timeout-s 10", ha);
    if (doors[0] != '\0')
        hpdctl(NULL, "down %s --timeout-s 10", doors);
    cl_finish(&cl);
    return 0;
}

typedef struct {
    uint32_t done, ok, tokens, cached, prompt, streamed;
    uint32_t n_tokens[64]; /* by handle */
    hpd_status_t status[64];
} results_t;

static void on_token(void *arg, uint64_t handle, uint32_t index, const int32_t *ids, uint32_t n)
{
    ((results_t *)arg)->streamed += n;
}

static void on_done(void *arg, uint64_t handle, hpd_generate_result_t *r)
{
    results_t *res = arg;
    res->done++;
    if (r->status == HPD_OK) {
        res->ok++;
        res->tokens += r->n_tokens;
        res->cached += r->cached_tokens;
        res->prompt += r->prompt_tokens;
    }
    if (handle < 64) {
        res->status[handle] = r->status;
        res->n_tokens[handle] = r->n_tokens;
    }
}

static void test_up_metrics_down(void **state)
{
    char *out, *token;
    results_t res = {0};
    int32_t prompts[N_REQ][200];
    uint64_t handles[N_REQ];

    assert_int_equal(hpdctl(&out, "up %s", manifest), 0);
    assert_non_null(strstr(out, "cluster 'local' is up"));
    assert_non_null(strstr(out, "decode-0         healthy"));
    free(out);
    assert_int_equal(hpdctl(&out, "status %s", manifest), 0);
    assert_non_null(strstr(out, "prefill-0"));
    assert_null(strstr(out, " down "));
    assert_non_null(strstr(out, "/v1, model 'model': ok")); /* the HTTP API */
    free(out);

    /* up wrote a client key beside the token (the node secret is none) */
    assert_int_equal(hpd_rpc_read_token(keys_file, &token), HPD_OK);
    token[strcspn(token, " ")] = '\0';
    assert_string_equal(token + 64, "");
    hpd_client_params_t cp = {.host = "127.0.0.1", .port = port_of(17600), .token = token,
                              .timeout_ms = 120000};
    hpd_client_t *c;
    assert_int_equal(hpd_client_create(&cp, &c), HPD_OK);

    /* three families of prompts sharing 128-token prefixes: one of each
     * first, then the other nine at once (they hit the prefix cache) */
    double last_ok = 0, last_gen = 0;
    uint32_t scrapes = 0, busy_scrapes = 0;
    uint64_t hb = 0;
    for (int phase = 0; phase < 2; phase++) {
        for (int i = phase ? 3 : 0; i < (phase ? N_REQ : 3); i++) {
            for (int k = 0; k < 200; k++)
                prompts[i][k] = k < 128 ? (i % 3) * 100 + k % 97 + 1 : (i * 31 + k * 7) % 500 + 1;
            hpd_generate_params_t gp = {.prompt = prompts[i],
                                        .n_prompt = 150 + i,
                                        .max_tokens = 24,
                                        .sampling = {.top_p = 1}};
            assert_int_equal(hpd_client_submit(c, &gp, on_token, on_done, &res, &handles[i]),
                             HPD_OK);
        }
        if (phase == 1) {
            int32_t bad_id = 100000; /* not in the vocabulary: outcome "invalid" */
            hpd_generate_params_t bad = {
                .prompt = &bad_id, .n_prompt = 1, .max_tokens = 4, .sampling = {.top_p = 1}};
            assert_int_equal(hpd_client_submit(c, &bad, NULL, on_done, &res, &hb), HPD_OK);
        }
        /* scrape while they run */
        const double deadline = hpd_time_now() + 300;
        while (hpd_client_pending(c) > 0) {
            if (hpd_time_now() > deadline)
                fail_msg("%u requests still open after 300 s", hpd_client_pending(c));
            hpd_client_poll(c, 5);
            char *m = cl_scrape(port_of(17601));
            const double ok = cl_sample(m, "hpd_requests_total{outcome=\"ok\"}");
            const double gen = cl_sample(m, "hpd_generated_tokens_total");
            const double running = cl_sample(m, "hpd_requests_running");
            const double queued = cl_sample(m, "hpd_requests_queued");
            assert_true(ok >= last_ok && gen >= last_gen); /* counters never go back */
            assert_true(ok <= N_REQ);
            busy_scrapes += running + queued > 0;
            last_ok = ok;
            last_gen = gen;
            scrapes++;
            free(m);
        }
    }
    fprintf(stderr, "%u scrapes, %u while requests were open\n", scrapes, busy_scrapes);
    assert_true(busy_scrapes > 0);
    assert_int_equal(res.ok, N_REQ);
    assert_int_equal(res.done, N_REQ + 1);
    assert_int_equal(res.status[hb], HPD_ERR_INVALID_ARG);
    assert_int_equal(res.streamed, res.tokens);

    /* the end state equals what the client saw */
    char *m = cl_scrape(port_of(17601));
    assert_true(cl_sample(m, "hpd_requests_total{outcome=\"ok\"}") == N_REQ);
    assert_true(cl_sample(m, "hpd_requests_total{outcome=\"invalid\"}") == 1);
    assert_true(cl_sample(m, "hpd_requests_total{outcome=\"failed\"}") == 0);
    assert_true(res.cached > 0);
    assert_true(cl_sample(m, "hpd_ttft_seconds_count") == N_REQ);
    assert_true(cl_sample(m, "hpd_ttft_seconds_bucket{le=\"+Inf\"}") == N_REQ);
    assert_true(cl_sample(m, "hpd_tpot_seconds_count") == N_REQ);
    assert_true(cl_sample(m, "hpd_generated_tokens_total") == res.tokens);
    assert_true(cl_sample(m, "hpd_prompt_tokens_total") == res.prompt);
    assert_true(cl_sample(m, "hpd_prefix_cache_hit_tokens_total") == res.cached);
    assert_true(cl_sample(m, "hpd_requests_running") == 0);
    assert_true(cl_sample(m, "hpd_nodes{role=\"decode\"}") == 1);
    assert_true(cl_sample(m, "hpd_uptime_seconds") > 0);
    free(m);
    fprintf(stderr, "client: %u tokens, %u prompt tokens, %u from the prefix cache\n",
            res.tokens, res.prompt, res.cached);
    m = cl_scrape(port_of(17611)); /* prefill */
    assert_true(cl_sample(m, "hpd_jobs_total{outcome=\"ok\"}") == N_REQ);
    assert_true(cl_sample(m, "hpd_prefix_cache_hit_tokens_total{tier=\"device\"}") +
                    cl_sample(m, "hpd_prefix_cache_hit_tokens_total{tier=\"host\"}") ==
                res.cached);
    assert_true(cl_sample(m, "hpd_engine_prefill_tokens_total") == res.prompt - res.cached);
    assert_true(cl_sample(m, "hpd_xfer_transfers_total{outcome=\"ok\"}") == N_REQ);
    assert_true(cl_sample(m, "hpd_xfer_bytes_total") > 0);
    assert_true(cl_sample(m, "hpd_xfer_push_seconds_count") == N_REQ);
    assert_true(cl_sample(m, "hpd_registered") == 1);
    free(m);
    m = cl_scrape(port_of(17621)); /* decode */
    assert_true(cl_sample(m, "hpd_jobs_total{outcome=\"ok\"}") == N_REQ);
    assert_true(cl_sample(m, "hpd_xfer_notices_total{outcome=\"ok\"}") == N_REQ);
    assert_true(cl_sample(m, "hpd_engine_decode_tokens_total") == res.tokens - N_REQ);
    assert_true(cl_sample(m, "hpd_kv_pages_used") == 0);
    assert_true(cl_sample(m, "hpd_slots_used") == 0);
    assert_true(cl_sample(m, "hpd_tpot_seconds_count") == N_REQ);
    free(m);

    /* logs: one line per event with the request id */
    assert_int_equal(hpdctl(&out, "logs %s coordinator -n 400", manifest), 0);
    assert_non_null(strstr(out, "info  coordinator req=1: accepted: 150 prompt tokens"));
    assert_non_null(strstr(out, "coordinator req=12: finished: 24 tokens (length)"));
    free(out);
    assert_int_equal(hpdctl(&out, "logs %s decode-0 -n 400", manifest), 0);
    assert_non_null(strstr(out, "decode req=3: decode-0: job"));
    free(out);
    assert_int_equal(hpdctl(&out, "logs %s nosuch", manifest), 2);
    assert_non_null(strstr(out, "no process named 'nosuch'"));
    free(out);

    /* down with a request in flight: it finishes, then everything stops */
    memset(&res, 0, sizeof(res));
    uint64_t h;
    hpd_generate_params_t gp = {
        .prompt = prompts[0], .n_prompt = 20, .max_tokens = 300, .sampling = {.top_p = 1}};
    assert_int_equal(hpd_client_submit(c, &gp, on_token, on_done, &res, &h), HPD_OK);
    for (const double deadline = hpd_time_now() + 120; res.streamed == 0;) {
        if (hpd_client_pending(c) == 0 || hpd_time_now() > deadline)
            fail_msg("the request before the down streamed nothing");
        hpd_client_poll(c, 5);
    }
    char log[400];
    snprintf(log, sizeof(log), "%s/down.out", cl.root);
    pid_t down = fork();
    if (down == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(HPDCTL, HPDCTL, "down", manifest, (char *)NULL);
        _exit(127);
    }
    cl_client_wait(&cl, c, 120, "the request in flight during the down");
    assert_int_equal(res.ok, 1);
    assert_int_equal(res.n_tokens[h], 300);
    int status;
    cl_proc_t down_proc = {.name = "hpdctl down", .pid = down};
    if (!cl_reap(&down_proc, 120, &status)) {
        kill(down, SIGKILL);
        fail_msg("hpdctl down did not end within 120 s");
    }
    hpd_read_file(log, &out, &(size_t){0});
    fprintf(stderr, "$ hpdctl down\n%s", out);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_non_null(strstr(out, "draining the coordinator"));
    assert_non_null(strstr(out, "is down on this host"));
    free(out);
    /* new requests are refused during a drain; after it nothing answers */
    int code;
    assert_int_not_equal(hpd_http_get("127.0.0.1", port_of(17601), "/healthz", 500, &code, NULL),
                         HPD_OK);
    assert_int_not_equal(hpd_http_get("127.0.0.1", port_of(17621), "/healthz", 500, &code, NULL),
                         HPD_OK);
    assert_int_equal(hpdctl(&out, "status %s", manifest), 1);
    free(out);
    char pidfile[400];
    snprintf(pidfile, sizeof(pidfile), "%s/decode-0.pid", state_dir);
    assert_int_not_equal(access(pidfile, F_OK), 0);
    /* the processes ended cleanly (no sanitizer report in sanitizer builds) */
    static const char *names[] = {"coordinator", "prefill-0", "decode-0"};
    for (int i = 0; i < 3; i++) {
        char path[400];
        snprintf(path, sizeof(path), "%s/%s.log", state_dir, names[i]);
        assert_true(cl_file_has(path, "")); /* it exists */
        cl_check_log(path);
    }
    hpd_client_destroy(c);
    free(token);
    cl.passed++;
}

static void test_up_failure(void **state)
{
    char bad[400], *out;
    hpdctl(NULL, "down %s --timeout-s 10", manifest); /* if the test before failed */
    snprintf(bad, sizeof(bad), "%s/bad.yaml", cl.root);
    write_manifest(bad, "nosuch_transport");
    assert_int_equal(hpdctl(&out, "up %s --timeout-s 60", bad), 1);
    assert_non_null(strstr(out, "hpdctl: decode-0 (decode) failed: exited with status 1"));
    assert_non_null(strstr(out, "nosuch_transport")); /* the end of its log says why */
    assert_non_null(strstr(out, "stopping the processes started"));
    free(out);
    /* the coordinator and the prefill node were stopped */
    int code;
    assert_int_not_equal(hpd_http_get("127.0.0.1", port_of(17601), "/healthz", 500, &code, NULL),
                         HPD_OK);
    assert_int_not_equal(hpd_http_get("127.0.0.1", port_of(17611), "/healthz", 500, &code, NULL),
                         HPD_OK);
    /* a bad manifest is refused before anything starts */
    snprintf(bad, sizeof(bad), "%s/bad2.yaml", cl.root);
    assert_int_equal(hpd_write_file(bad, "cluster: x\n", 11), HPD_OK);
    assert_int_equal(hpdctl(&out, "up %s", bad), 2);
    assert_non_null(strstr(out, "model: missing"));
    free(out);
    cl.passed++;
}

/* Whether the process runs as hpd-prefill (its argv[0]). */
static bool is_fake_node(cl_t *c, void *arg)
{
    char path[64], cmd[64] = "";
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)*(pid_t *)arg);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    const size_t n = fread(cmd, 1, sizeof(cmd) - 1, f);
    fclose(f);
    cmd[n] = '\0';
    return strcmp(cmd, "hpd-prefill") == 0;
}

/* A node that runs while its coordinator does not: hpdctl up leaves it
 * alone and starts the others; it never signals its own process group (it
 * once called kill(0, SIGTERM) for the coordinator it had not started,
 * which ended hpdctl and its caller). Here the "node" is sleep(1) with
 * argv[0] hpd-prefill (what hpdctl checks a pid file against), which never
 * turns healthy: up fails and stops what it started, never it. hpdctl down
 * names the processes that had exited on their own and fails. */
static void test_up_with_a_node_left(void **state)
{
    char pidfile[400], text[32], log[400], *out;
    hpdctl(NULL, "down %s --timeout-s 10", manifest); /* if the test before failed */
    pid_t node = fake_node = fork();
    if (node == 0) {
        execl("/bin/sleep", "hpd-prefill", "600", (char *)NULL);
        _exit(127);
    }
    assert_true(node > 0);
    /* until it has exec'd, it is this test by its command line */
    cl_wait(&cl, NULL, 60, is_fake_node, &node, "the fake node to exec");
    snprintf(pidfile, sizeof(pidfile), "%s/prefill-0.pid", state_dir);
    mkdir(state_dir, 0755);
    assert_int_equal(hpd_write_file(pidfile, text, (size_t)snprintf(text, sizeof(text), "%d\n",
                                                                    (int)node)), HPD_OK);

    /* hpdctl up in a process group of its own, as a script's would be */
    snprintf(log, sizeof(log), "%s/up.out", cl.root);
    pid_t up = fork();
    if (up == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(HPDCTL, HPDCTL, "up", manifest, "--timeout-s", "8", (char *)NULL);
        _exit(127);
    }
    int status;
    cl_proc_t up_proc = {.name = "hpdctl up", .pid = up};
    if (!cl_reap(&up_proc, 120, &status)) {
        kill(up, SIGKILL);
        fail_msg("hpdctl up did not end within 120 s");
    }
    hpd_read_file(log, &out, &(size_t){0});
    fprintf(stderr, "$ hpdctl up\n%s", out);
    if (WIFSIGNALED(status))
        fail_msg("hpdctl up died of signal %d", WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    snprintf(text, sizeof(text), "(pid %d, left alone)", (int)node);
    assert_non_null(strstr(out, text));
    assert_non_null(strstr(out, "coordinator      started"));
    assert_non_null(strstr(out, "prefill-0 is not healthy after 8 s"));
    assert_non_null(strstr(out, "(the ones that were running stay)"));
    free(out);
    assert_int_equal(kill(node, 0), 0); /* the node was left alone */
    assert_int_equal(waitpid(node, &status, WNOHANG), 0);
    int code;
    assert_int_not_equal(hpd_http_get("127.0.0.1", port_of(17601), "/healthz", 500, &code, NULL),
                         HPD_OK); /* what up started it stopped */

    /* the node dies without hpdctl: down names it and fails */
    kill(node, SIGKILL);
    assert_int_equal(waitpid(node, &status, 0), node);
    fake_node = 0;
    assert_int_equal(hpdctl(&out, "down %s", manifest), 1);
    assert_non_null(strstr(out, "prefill-0 (prefill"));
    assert_non_null(strstr(out, "had already exited"));
    assert_non_null(strstr(out, "prefill-0.log"));
    free(out);
    assert_int_not_equal(access(pidfile, F_OK), 0); /* forgotten */
    assert_int_equal(hpdctl(&out, "down %s", manifest), 0); /* said once */
    assert_non_null(strstr(out, "nothing of cluster"));
    free(out);
    cl.passed++;
}

/* Whether the process has ended (gone, or a zombie nobody reaped yet). */
static bool pid_gone(cl_t *c, void *arg)
{
    char path[64], st[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)*(const pid_t *)arg);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return true;
    const size_t n = fread(st, 1, sizeof(st) - 1, f);
    fclose(f);
    st[n] = '\0';
    const char *paren = strrchr(st, ')');
    return paren != NULL && paren[1] == ' ' && paren[2] == 'Z';
}

/* The pid of a process of the test's cluster (its pid file), 0: none. */
static pid_t pid_of(const char *name)
{
    char path[400], *text;
    size_t len;
    snprintf(path, sizeof(path), "%s/%s.pid", state_dir, name);
    if (hpd_read_file(path, &text, &len) != HPD_OK)
        return 0;
    const pid_t pid = (pid_t)atoi(text);
    free(text);
    return pid;
}

/* A request through the cluster, with the key up wrote. */
static void generate_through(const char *coordinators, int32_t ids[4]);

static void serves(void)
{
    char one[32];
    int32_t ids[4];
    snprintf(one, sizeof(one), "127.0.0.1:%u", port_of(17600));
    generate_through(one, ids);
}

/* up on a partly running cluster starts what is missing and leaves the
 * rest alone (on 02a8551 it refused: "p0 is already running; run hpdctl
 * down first"); restart NAME brings one process back, a coordinator
 * without stopping its nodes. */
static void test_up_idempotent_and_restart(void **state)
{
    char *out;
    hpdctl(NULL, "down %s --timeout-s 10", manifest); /* if the test before failed */
    assert_int_equal(hpdctl(&out, "up %s", manifest), 0);
    free(out);
    const pid_t coord = pid_of("coordinator"), prefill = pid_of("prefill-0");
    const pid_t decode = pid_of("decode-0");
    assert_true(coord > 0 && prefill > 0 && decode > 0);
    /* up again: nothing to do */
    assert_int_equal(hpdctl(&out, "up %s", manifest), 0);
    assert_non_null(strstr(out, "all 3 local processes of cluster 'local' run already"));
    free(out);
    assert_int_equal(pid_of("coordinator"), coord);

    /* the coordinator dies: up brings it back alone */
    assert_int_equal(kill(coord, SIGKILL), 0);
    cl_wait(&cl, NULL, 30, pid_gone, (void *)&coord, "the coordinator to die");
    assert_int_equal(hpdctl(&out, "up %s", manifest), 0);
    assert_non_null(strstr(out, "1 started, 2 were running"));
    assert_non_null(strstr(out, "prefill-0        running"));
    free(out);
    const pid_t coord2 = pid_of("coordinator");
    assert_true(coord2 > 0 && coord2 != coord);
    assert_int_equal(pid_of("prefill-0"), prefill);
    assert_int_equal(pid_of("decode-0"), decode);
    serves();

    /* a node dies: the same */
    assert_int_equal(kill(decode, SIGKILL), 0);
    cl_wait(&cl, NULL, 30, pid_gone, (void *)&decode, "the decode node to die");
    assert_int_equal(hpdctl(&out, "up %s", manifest), 0);
    assert_non_null(strstr(out, "1 started, 2 were running"));
    free(out);
    const pid_t decode2 = pid_of("decode-0");
    assert_true(decode2 > 0 && decode2 != decode);
    assert_int_equal(pid_of("coordinator"), coord2);
    serves();

    /* restart the coordinator: drained for a restart, its nodes stay */
    assert_int_equal(hpdctl(&out, "restart %s coordinator", manifest), 0);
    assert_non_null(strstr(out, "restarting coordinator"));
    assert_non_null(strstr(out, "1 started, 2 were running"));
    free(out);
    assert_true(pid_of("coordinator") != coord2);
    assert_int_equal(pid_of("prefill-0"), prefill);
    assert_int_equal(pid_of("decode-0"), decode2);
    serves();
    assert_int_equal(hpdctl(&out, "restart %s prefill-0", manifest), 0);
    free(out);
    assert_true(pid_of("prefill-0") != prefill);
    serves();
    assert_int_equal(hpdctl(&out, "restart %s nosuch", manifest), 2);
    assert_non_null(strstr(out, "no process named 'nosuch'"));
    free(out);
    assert_int_equal(hpdctl(&out, "down %s", manifest), 0);
    free(out);
    cl.passed++;
}

/* A prompt's 4 tokens (ids) through the coordinators given, with the key
 * up wrote. */
static void generate_through(const char *coordinators, int32_t ids[4])
{
    char *key;
    hpd_client_t *c;
    hpd_generate_result_t r;
    static const int32_t prompt[] = {9, 8, 7, 6, 5};
    assert_int_equal(hpd_rpc_read_token(keys_file, &key), HPD_OK);
    key[strcspn(key, " ")] = '\0';
    const hpd_client_params_t cp = {.coordinators = coordinators, .token = key,
                                    .timeout_ms = 120000};
    assert_int_equal(hpd_client_create(&cp, &c), HPD_OK);
    const hpd_generate_params_t gp = {.prompt = prompt, .n_prompt = 5, .max_tokens = 4,
                                      .sampling = {.top_p = 1}};
    if (hpd_client_generate(c, &gp, NULL, NULL, &r) != HPD_OK)
        fail_msg("generate: %s", r.error);
    assert_int_equal(r.n_tokens, 4);
    memcpy(ids, r.tokens, 4 * sizeof(*ids));
    hpd_generate_result_free(&r);
    hpd_client_destroy(c);
    free(key);
}

/* The test's local.yaml as another cluster at path: its name, its state
 * directory, and more coordinator fields (YAML lines) after its own. */
static void another_cluster(const char *path, const char *name, const char *state,
                            const char *coord_fields)
{
    char *text, *at, out[20000], cmd[2048];
    assert_int_equal(hpd_read_file(manifest, &text, &(size_t){0}), HPD_OK);
    assert_non_null(at = strstr(text, "  drain_timeout_ms: 30000\n"));
    at += strlen("  drain_timeout_ms: 30000\n");
    snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - text), text, coord_fields, at);
    free(text);
    assert_int_equal(hpd_write_file(path, out, strlen(out)), HPD_OK);
    snprintf(cmd, sizeof(cmd), "sed -i -e 's#^cluster: local#cluster: %s#' -e "
             "'s#^state_dir:.*#state_dir: %s#' %s", name, state, path);
    assert_int_equal(system(cmd), 0);
}

static bool coordinator2_leads(cl_t *c, void *arg)
{
    int code = 0;
    return hpd_http_get("127.0.0.1", port_of(17701), "/healthz", 500, &code, NULL) == HPD_OK &&
           code == 200;
}

/* coordinator.etcd with start: up starts etcd first, then the coordinator
 * (it leads), its standby (it campaigns and does not listen) and the
 * nodes, given both; status tells the standby from a coordinator that is
 * down. kill -9 of the leader: the standby leads and serves the same
 * tokens; up brings the old one back as a standby. down stops the standby
 * first (none takes over during the drain) and etcd last. */
static void test_standby_through_etcd(void **state)
{
    char sd[400], both[64], *out;
    int32_t before[4], after[4];
    if (!cl_etcd_present())
        skip();
    snprintf(ha, sizeof(ha), "%s/ha.yaml", cl.root);
    snprintf(sd, sizeof(sd), "%s/ha-state", cl.root);
    snprintf(both, sizeof(both), "127.0.0.1:%u,127.0.0.1:%u", port_of(17600), port_of(17700));
    /* the test's local.yaml, another cluster, with etcd and a standby */
    char coord_fields[400];
    snprintf(coord_fields, sizeof(coord_fields),
             "  etcd: {endpoint: \"http://127.0.0.1:%u\", peer_port: %u, start: true}\n"
             "  standbys:\n    - {port: %u, metrics_port: %u, http_port: %u}\n",
             port_of(17630), port_of(17631), port_of(17700), port_of(17701), port_of(17702));
    another_cluster(ha, "ha", sd, coord_fields);
    char *text;
    hpdctl(NULL, "down %s --timeout-s 10", manifest); /* if a test before failed */

    assert_int_equal(hpdctl(&out, "up %s", ha), 0);
    assert_non_null(strstr(out, "etcd             healthy"));
    assert_non_null(strstr(out, "coordinator      healthy"));
    assert_non_null(strstr(out, "coordinator-2    standby  (campaigning through"));
    assert_non_null(strstr(out, "leading: coordinator,"));
    free(out);
    assert_int_equal(hpdctl(&out, "status %s", ha), 0);
    assert_non_null(strstr(out, "the coordinators' election"));
    assert_non_null(strstr(out, " standby  campaigning"));
    free(out);
    generate_through(both, before);

    /* the leader dies: the standby leads and serves the same tokens */
    char pidfile[450];
    snprintf(pidfile, sizeof(pidfile), "%s/coordinator.pid", sd);
    assert_int_equal(hpd_read_file(pidfile, &text, &(size_t){0}), HPD_OK);
    const pid_t leader = (pid_t)atoi(text);
    free(text);
    assert_int_equal(kill(leader, SIGKILL), 0);
    cl_wait(&cl, NULL, 30, coordinator2_leads, NULL, "coordinator-2 leading");
    generate_through(both, after);
    assert_memory_equal(before, after, sizeof(before));
    assert_int_equal(hpdctl(&out, "status %s", ha), 1); /* the old leader is down */
    assert_non_null(strstr(out, "  -        down     (no answer on /healthz)"));
    assert_non_null(strstr(out, "model 'model': ok")); /* the leader's HTTP API */
    free(out);

    /* up: the old leader comes back as a standby */
    assert_int_equal(hpdctl(&out, "up %s", ha), 0);
    assert_non_null(strstr(out, "coordinator      standby"));
    assert_non_null(strstr(out, "leading: coordinator-2,"));
    assert_non_null(strstr(out, "1 started, 3 were running"));
    free(out);
    assert_int_equal(hpdctl(&out, "status %s", ha), 0);
    free(out);

    /* down: the standby first, the leader drains, etcd last */
    assert_int_equal(hpdctl(&out, "down %s", ha), 0);
    const char *standby = strstr(out, "coordinator      stopped  (a standby)");
    const char *drain = strstr(out, "draining the coordinator");
    const char *etcd = strstr(out, "etcd             stopped");
    assert_true(standby != NULL && drain != NULL && etcd != NULL);
    assert_true(standby < drain && drain < etcd);
    free(out);
    snprintf(pidfile, sizeof(pidfile), "%s/etcd.pid", sd);
    assert_int_not_equal(access(pidfile, F_OK), 0);
    int code;
    assert_int_not_equal(
        hpd_http_get("127.0.0.1", port_of(17630), "/health", 500, &code, NULL), HPD_OK);
    cl.passed++;
}

/* coordinator.doors: up starts the front door after the nodes and waits
 * until it is healthy (its scheduler has decode nodes); a request through
 * it gives the coordinator's tokens; status shows it and its HTTP API;
 * down stops it first, then drains the coordinator. */
static void test_up_with_a_door(void **state)
{
    char sd[400], door[64], coord[64], *out;
    int32_t direct[4], through[4];
    snprintf(doors, sizeof(doors), "%s/doors.yaml", cl.root);
    snprintf(sd, sizeof(sd), "%s/doors-state", cl.root);
    snprintf(door, sizeof(door), "127.0.0.1:%u", port_of(17640));
    snprintf(coord, sizeof(coord), "127.0.0.1:%u", port_of(17600));
    char coord_fields[200];
    snprintf(coord_fields, sizeof(coord_fields),
             "  doors:\n    - {port: %u, metrics_port: %u, http_port: %u}\n", port_of(17640),
             port_of(17641), port_of(17642));
    another_cluster(doors, "doors", sd, coord_fields);
    hpdctl(NULL, "down %s --timeout-s 10", manifest); /* if a test before failed */

    assert_int_equal(hpdctl(&out, "up %s", doors), 0);
    const char *nodes = strstr(out, "decode-0         started");
    const char *started = strstr(out, "door-1           started  (door,");
    assert_true(nodes != NULL && started != NULL && nodes < started);
    assert_non_null(strstr(out, "door-1           healthy  (ok: front door of scheduler"));
    free(out);
    generate_through(coord, direct);
    generate_through(door, through);
    assert_memory_equal(direct, through, sizeof(direct));
    assert_int_equal(hpdctl(&out, "status %s", doors), 0);
    assert_non_null(strstr(out, "door-1             door "));
    assert_non_null(strstr(out, "HTTP API of door-1: "));
    free(out);
    assert_int_equal(hpdctl(&out, "down %s", doors), 0);
    const char *first = strstr(out, "door-1           stopped  (a front door)");
    const char *drain = strstr(out, "draining the coordinator");
    assert_true(first != NULL && drain != NULL && first < drain);
    free(out);
    cl.passed++;
}

/* A manifest of 1,000 local nodes: parsed, checked, rendered, and up fails
 * with a message (its programs here are stand-ins that exit), never a
 * stack overflow (02a8551 kept local processes in arrays of 256). */
static void test_thousand_nodes(void **state)
{
    enum { N = 1000 };
    char big[400], bins[400], path[500], *out;
    snprintf(big, sizeof(big), "%s/big.yaml", cl.root);
    snprintf(bins, sizeof(bins), "%s/fake-bin", cl.root);
    FILE *f = fopen(big, "w");
    assert_non_null(f);
    fprintf(f, "cluster: big\nmodel: %s/model\ntoken_file: %s\nstate_dir: %s/big-state\n"
            "coordinator: {host: 127.0.0.1, port: 21000, metrics_port: 21001}\n"
            "defaults: {host: 127.0.0.1, device: cpu, ucx: {tls: tcp, dev: lo}}\nnodes:\n",
            cl.root, token_file, cl.root);
    for (int i = 0; i < N; i++)
        fprintf(f, "  - {name: n-%d, role: %s, port: %d, metrics_port: %d}\n", i,
                i % 2 ? "decode" : "prefill", 22000 + 2 * i, 22001 + 2 * i);
    fclose(f);
    assert_int_equal(mkdir(bins, 0755), 0);
    static const char *names[] = {"hpd-coordinator", "hpd-prefill", "hpd-decode"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", bins, names[i]);
        assert_int_equal(hpd_write_file(path, "#!/bin/sh\necho stand-in; exit 3\n", 31), HPD_OK);
        assert_int_equal(chmod(path, 0755), 0);
    }
    assert_int_equal(hpdctl(&out, "check %s", big), 0);
    assert_non_null(strstr(out, "1001 processes"));
    free(out);
    snprintf(path, sizeof(path), "%s/units", cl.root);
    assert_int_equal(hpdctl(&out, "render %s --systemd --out %s", big, path), 0);
    free(out);
    assert_int_equal(hpdctl(&out, "up %s --bin-dir %s --timeout-s 30", big, bins), 1);
    assert_non_null(strstr(out, "coordinator (coordinator) failed: exited with status 3"));
    free(out);
    assert_int_equal(hpdctl(&out, "status %s", big), 1);
    free(out);
    assert_int_equal(hpdctl(&out, "down %s", big), 0);
    assert_non_null(strstr(out, "nothing of cluster 'big'"));
    free(out);
    cl.passed++;
}

/* A copy of the test's manifest with one text replaced. */
static void manifest_with(const char *path, const char *from, const char *to)
{
    char *text, out[16384];
    size_t len;
    assert_int_equal(hpd_read_file(manifest, &text, &len), HPD_OK);
    const char *at = strstr(text, from);
    assert_non_null(at);
    const int n = snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - text), text, to,
                           at + strlen(from));
    assert_int_equal(hpd_write_file(path, out, (size_t)n), HPD_OK);
    free(text);
}

/* check plans each node's pools against the model: ok with their sizes;
 * a pack size above the model's full-attention layers, or pools this host
 * cannot hold (max_context 1000000 x max_batch 1024), are refused with the
 * line, the node
 * and what to change (check once accepted both; the nodes then failed or
 * allocated 65 GB). */
static void test_check(void **state)
{
    char bad[400], *out;
    assert_int_equal(hpdctl(&out, "check %s", manifest), 0);
    assert_non_null(strstr(out, "decode-0         decode   2048 KV pages"));
    assert_non_null(strstr(out, ": ok (cluster local: 3 processes)"));
    free(out);
    snprintf(bad, sizeof(bad), "%s/packed.yaml", cl.root);
    manifest_with(bad, "{block: 16, pack: 2, order: hnd}", "{block: 16, pack: 9, order: hnd}");
    assert_int_equal(hpdctl(&out, "check %s", bad), 2);
    assert_non_null(strstr(out, "decode-0: kv pack size 9 is above the model's 4 full-attention "
                                "layers"));
    free(out);
    snprintf(bad, sizeof(bad), "%s/huge.yaml", cl.root);
    /* about 4 TiB of pools: more than any host this runs on */
    manifest_with(bad, "max_context: 4096", "max_context: 1000000\n  max_batch: 1024");
    {
        char *t;
        size_t l;
        assert_int_equal(hpd_read_file(bad, &t, &l), HPD_OK);
        char *dup = strstr(t, "  max_batch: 16\n");
        assert_non_null(dup);
        memmove(dup, dup + 15, strlen(dup + 15) + 1);
        assert_int_equal(hpd_write_file(bad, t, strlen(t)), HPD_OK);
        free(t);
    }
    assert_int_equal(hpdctl(&out, "check %s", bad), 2);
    assert_non_null(strstr(out, "prefill-0: its pools need"));
    assert_non_null(strstr(out, "lower max_context, max_batch or kv_pages"));
    free(out);
    /* tensor parallelism: each rank's pools, and a degree the model's 2
     * GDN key heads do not allow */
    snprintf(bad, sizeof(bad), "%s/tp.yaml", cl.root);
    manifest_with(bad, "{block: 16, pack: 2, order: hnd}", "{block: 16, pack: 2, order: hnd}\n"
                                                           "    tp: 2");
    assert_int_equal(hpdctl(&out, "check %s", bad), 0);
    assert_non_null(strstr(out, "decode-0         decode   2048 KV pages, 16 state slots, 0 "
                                "checkpoints a rank, ranks: 2"));
    free(out);
    manifest_with(bad, "{block: 16, pack: 2, order: hnd}", "{block: 16, pack: 2, order: hnd}\n"
                                                           "    tp: 4");
    assert_int_equal(hpdctl(&out, "check %s", bad), 2);
    assert_non_null(strstr(out, "decode-0: tp 4: "));
    assert_non_null(strstr(out, "GDN layers' key heads"));
    free(out);
    cl.passed++;
}

/* every scalar of every document, joined; the kinds seen */
static void read_k8s(const char *path, char *all, size_t len, char *kinds, size_t klen)
{
    FILE *f = fopen(path, "r");
    yaml_parser_t p;
    yaml_document_t d;
    size_t used = 0, kused = 0;
    int docs = 0;
    assert_non_null(f);
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    for (;;) {
        assert_true(yaml_parser_load(&p, &d)); /* parses */
        yaml_node_t *rootn = yaml_document_get_root_node(&d);
        if (rootn == NULL) {
            yaml_document_delete(&d);
            break;
        }
        docs++;
        for (yaml_node_t *n = d.nodes.start; n < d.nodes.top; n++)
            if (n->type == YAML_SCALAR_NODE && used + n->data.scalar.length + 2 < len) {
                memcpy(all + used, n->data.scalar.value, n->data.scalar.length);
                used += n->data.scalar.length;
                all[used++] = '\n';
            }
        for (yaml_node_pair_t *pr = rootn->data.mapping.pairs.start;
             pr < rootn->data.mapping.pairs.top; pr++)
            if (!strcmp((char *)yaml_document_get_node(&d, pr->key)->data.scalar.value, "kind"))
                kused += (size_t)snprintf(kinds + kused, klen - kused, "%s ",
                                          yaml_document_get_node(&d, pr->value)->data.scalar.value);
        yaml_document_delete(&d);
    }
    all[used] = '\0';
    yaml_parser_delete(&p);
    fclose(f);
    assert_true(docs >= 7);
}

static void test_render(void **state)
{
    char dir[400], cmd[1024], *out, *all = malloc(1 << 20), kinds[512], yml[400], multi[400];
    hpd_manifest_t *m;
    char err[4096];

    /* systemd: a unit per process */
    snprintf(dir, sizeof(dir), "%s/units", cl.root);
    assert_int_equal(hpdctl(&out, "render %s --systemd --out %s", manifest, dir), 0);
    free(out);
    const char *units[] = {"coordinator", "prefill-0", "decode-0"};
    const unsigned metrics[] = {17601, 17611, 17621};
    for (int i = 0; i < 3; i++) {
        char path[512], want[64];
        snprintf(path, sizeof(path), "%s/hybridpd-local-%s.service", dir, units[i]);
        snprintf(want, sizeof(want), "--metrics-port %u", port_of(metrics[i]));
        assert_int_equal(hpd_read_file(path, &out, &(size_t){0}), HPD_OK);
        assert_non_null(strstr(out, "ExecStart=/"));
        assert_non_null(strstr(out, want));
        free(out);
    }
    if (system("command -v systemd-analyze > /dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof(cmd), "systemd-analyze verify %s/*.service", dir);
        int rc = system(cmd);
        assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
        fprintf(stderr, "systemd-analyze verify: ok\n");
    } else {
        fprintf(stderr, "systemd-analyze not installed: unit verification skipped\n");
    }
    assert_int_equal(hpdctl(&out, "render %s --systemd", manifest), 2); /* needs --out */
    free(out);

    /* Kubernetes: the local example, then the multi-host one */
    snprintf(yml, sizeof(yml), "%s/k8s.yaml", cl.root);
    assert_int_equal(hpdctl(&out, "render %s --k8s --out %s", manifest, yml), 0);
    free(out);
    read_k8s(yml, all, 1 << 20, kinds, sizeof(kinds));
    assert_non_null(strstr(kinds, "Secret ConfigMap Deployment Service Service StatefulSet "
                                  "Service StatefulSet"));
    assert_non_null(strstr(all, "--name prefill-0"));
    assert_non_null(strstr(all, "--name decode-0"));
    assert_non_null(strstr(all, "/healthz"));

    snprintf(multi, sizeof(multi), "%s/multi.yaml", cl.root);
    snprintf(cmd, sizeof(cmd), "sed 's#^token_file:.*#token_file: %s#' %s/deploy/examples/"
             "multi-host.yaml > %s", token_file, HPD_SOURCE_DIR, multi);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(hpdctl(&out, "render %s --k8s --out %s", multi, yml), 0);
    free(out);
    read_k8s(yml, all, 1 << 20, kinds, sizeof(kinds));
    assert_int_equal(hpd_manifest_load(multi, &m, err, sizeof(err)), HPD_OK);
    for (uint32_t i = 1; i < m->n_procs; i++) {
        char want[128];
        snprintf(want, sizeof(want), "--name %s ", m->procs[i].name);
        if (strstr(all, want) == NULL)
            fprintf(stderr, "node %s is not in the Kubernetes output\n", m->procs[i].name);
        assert_non_null(strstr(all, want));
        assert_non_null(strstr(all, m->procs[i].name)); /* and in the role's annotation */
    }
    /* pod N of a role's StatefulSet (its host name <cluster>-<role>-N)
     * reads the flags of the role's N-th node in the manifest */
    uint32_t ordinal[3] = {0, 0, 0};
    for (uint32_t i = 1; i < m->n_procs; i++) {
        char key[160], want[160];
        const hpd_manifest_proc_t *p = &m->procs[i];
        snprintf(key, sizeof(key), "\n%s-%s-%u\n", m->cluster,
                 p->role == HPD_PROC_PREFILL ? "prefill" : "decode", ordinal[p->role]++);
        const char *at = strstr(all, key);
        if (at == NULL)
            fail_msg("no flags for pod %.*s", (int)strlen(key) - 2, key + 1);
        const char *end = strchr(at + strlen(key), '\n');
        snprintf(want, sizeof(want), "--name %s ", p->name);
        const char *name = strstr(at + strlen(key), want);
        if (name == NULL || name > end)
            fail_msg("pod %.*s does not run node %s", (int)strlen(key) - 2, key + 1, p->name);
    }
    assert_true(ordinal[HPD_PROC_PREFILL] > 1 && ordinal[HPD_PROC_DECODE] > 1);
    /* each StatefulSet's annotation names its role's nodes, in order */
    for (int r = HPD_PROC_PREFILL; r <= HPD_PROC_DECODE; r++) {
        char names[1024] = "\n";
        for (uint32_t i = 1; i < m->n_procs; i++)
            if (m->procs[i].role == (hpd_proc_role_t)r)
                snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                         names[1] != '\0' ? "," : "", m->procs[i].name);
        strcat(names, "\n");
        if (strstr(all, names) == NULL)
            fail_msg("no annotation names the nodes%s", names);
    }
    assert_non_null(strstr(all, "nvidia.com/gpu"));
    assert_non_null(strstr(all, "qwen3-next-coordinator.inference.svc:7000"));
    /* none named in this manifest: the default beside the token, in the
     * Secret (the node secret is never a client key) */
    assert_non_null(strstr(all, "client-keys"));
    hpd_manifest_destroy(m);

    /* client keys: in the Secret, and the coordinator reads them there (the
     * manifest's path is of the host that renders, not of the pod) */
    char keys[400];
    snprintf(keys, sizeof(keys), "%s/render-keys", cl.root);
    static const char key_lines[] = "key-one team-a\nkey-two\n";
    assert_int_equal(hpd_write_file(keys, key_lines, strlen(key_lines)), HPD_OK);
    snprintf(cmd, sizeof(cmd), "sed -i 's#^token_file:.*#&\\nclient_keys_file: %s#' %s", keys,
             multi);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(hpdctl(&out, "render %s --k8s --out %s", multi, yml), 0);
    free(out);
    read_k8s(yml, all, 1 << 20, kinds, sizeof(kinds));
    /* the Secret's entry parses back to the file, byte for byte */
    assert_non_null(strstr(all, "client-keys\nkey-one team-a\nkey-two\n\n"));
    assert_non_null(strstr(all, "--client-keys-file /etc/hybridpd/secret/client-keys"));
    assert_null(strstr(all, keys)); /* the host's path is nowhere */
    unlink(keys);
    assert_int_equal(hpdctl(&out, "render %s --k8s --out %s", multi, yml), 1);
    assert_non_null(strstr(out, "client_keys_file: cannot read"));
    free(out);
    free(all);
    cl.passed++;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_up_metrics_down),
        cmocka_unit_test(test_up_failure),
        cmocka_unit_test(test_up_with_a_node_left),
        cmocka_unit_test(test_up_idempotent_and_restart),
        cmocka_unit_test(test_standby_through_etcd),
        cmocka_unit_test(test_up_with_a_door),
        cmocka_unit_test(test_thousand_nodes),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_render),
    };
    cl.cases = sizeof(tests) / sizeof(tests[0]);
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup, teardown);
}
