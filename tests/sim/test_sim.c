/* The real coordinator (a process) in front of simulated nodes (sim/sim.h,
 * in this process) under a load (sim/load.h) whose every answer is
 * checked token by token and by the nodes that served it:
 * - 200 nodes register and serve 3,000 requests, every one right, every
 *   decode node used;
 * - 80 nodes serve 1,500 requests through two front doors (the decode
 *   nodes stream to the doors), every one right;
 * - 40 nodes serve 1,000 requests through the coordinator's HTTP API
 *   (return_token_ids), every one right;
 * - faults from the simulator while the load runs: a decode node dies, one
 *   stops past the liveness window, one slows down fivefold, two send a
 *   malformed tokens notice, a prefill node dies: every request is still
 *   answered right, some after a retry or a hedge;
 * - routing quality: prefill nodes with prefix caches whose Bloom
 *   summaries ride on their heartbeats; the prompt tokens cached where the
 *   prefills ran come near what an ideal router (every cache known) would
 *   have had. */
#include "tests/cluster/harness.h"

#include "sim/load.h"
#include "sim/sim.h"

static cl_t cl;
static struct event_base *base;

static int setup(void **state)
{
    test_tmpdir(cl.root, sizeof(cl.root), "sim");
    snprintf(cl.token_file, sizeof(cl.token_file), "%s/token", cl.root);
    snprintf(cl.keys_file, sizeof(cl.keys_file), "%s/client-keys", cl.root);
    if (hpd_write_file(cl.token_file, "sim-secret\n", 11) != HPD_OK ||
        hpd_write_file(cl.keys_file, CL_CLIENT_KEY " tests\n", strlen(CL_CLIENT_KEY) + 7) !=
            HPD_OK)
        return -1;
    base = event_base_new();
    return base != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    event_base_free(base);
    cl_finish(&cl);
    return 0;
}

/* A coordinator with liveness pings (400 ms), room for the load's
 * requests, and the simulated nodes registered on it. */
/* cache_blocks: each prefill node's prefix cache (0: none); heartbeat: the
 * nodes' period, in ms as text */
static hpd_sim_t *start_with(uint32_t n_prefill, uint32_t n_decode, uint32_t cache_blocks,
                             const char *heartbeat, double prefill_us_per_token)
{
    const char *const extra[] = {"--liveness-ms", "400", "--max-requests", "4096",
                                 "--heartbeat-ms", heartbeat, "--lease-ms", "10000",
                                 "--log-level", "warn", NULL};
    cl_start_coordinator(&cl, "coordinator", extra);
    const hpd_sim_params_t sp = {.base = base,
                                 .coord_host = "127.0.0.1",
                                 .coord_port = cl.port,
                                 .token = "sim-secret",
                                 .n_prefill = n_prefill,
                                 .n_decode = n_decode,
                                 .prefill_us_per_token = prefill_us_per_token,
                                 .push_us_per_page = 20,
                                 .step_us = 2000,
                                 .speed_spread = 0.3,
                                 .vocab = 5000,
                                 .slots = 32,
                                 .pages = 100000,
                                 .max_context = 8192,
                                 .seed = 7,
                                 .cache_blocks = cache_blocks};
    hpd_sim_t *sim;
    assert_int_equal(hpd_sim_create(&sp, &sim), HPD_OK);
    const double t0 = hpd_time_now();
    char why[400] = "";
    while (hpd_sim_registered(sim) < n_prefill + n_decode) {
        if (hpd_sim_refused(sim, why, sizeof(why)) > 0)
            fail_msg("a node was refused: %s", why);
        if (hpd_time_now() - t0 > 60)
            fail_msg("%u of %u nodes registered after 60 s", hpd_sim_registered(sim),
                     n_prefill + n_decode);
        event_base_loop(base, EVLOOP_ONCE);
        cl_check_alive(&cl);
    }
    return sim;
}

static hpd_sim_t *start(uint32_t n_prefill, uint32_t n_decode)
{
    return start_with(n_prefill, n_decode, 0, "500", 10);
}

static hpd_load_params_t load_of(const hpd_sim_t *sim, uint32_t requests)
{
    return (hpd_load_params_t){.base = base,
                               .host = "127.0.0.1",
                               .port = cl.port,
                               .key = CL_CLIENT_KEY,
                               .requests = requests,
                               .window = 256,
                               .connections = 4,
                               .prompt_tokens = 48,
                               .max_tokens = 8,
                               .vocab = 5000,
                               .prefixes = 16,
                               .prefix_tokens = 32,
                               .seed = 3,
                               .sim = sim};
}

static void expect_all_right(const hpd_load_result_t *r, uint32_t requests)
{
    print_message("%llu requests: %llu right, %llu wrong, %llu failed, %llu retried in %.2f s "
                  "(answer p50 %.1f ms, p99 %.1f ms)\n",
                  (unsigned long long)r->sent, (unsigned long long)r->ok,
                  (unsigned long long)r->wrong, (unsigned long long)r->failed,
                  (unsigned long long)r->retried, r->duration_s, r->p50_ms, r->p99_ms);
    if (r->wrong > 0 || r->failed > 0 || r->ok != requests)
        fail_msg("%llu of %u right: %s", (unsigned long long)r->ok, requests, r->first_wrong);
}

static void stop(hpd_sim_t *sim)
{
    hpd_sim_destroy(sim);
    cl_stop_all(&cl);
    cl.passed++;
}

static void test_two_hundred_nodes(void **state)
{
    cl.cases++;
    hpd_sim_t *sim = start(60, 140);
    hpd_load_params_t lp = load_of(sim, 3000);
    hpd_load_result_t r;
    assert_int_equal(hpd_load_run(&lp, 120, &r), HPD_OK);
    expect_all_right(&r, 3000);
    /* every decode node took a share */
    uint32_t idle = 0;
    for (uint32_t i = 60; i < 200; i++)
        idle += hpd_sim_node_done(sim, i) == 0;
    if (idle > 0)
        fail_msg("%u of 140 decode nodes served nothing", idle);
    stop(sim);
}

/* The load through two front doors of the coordinator (coordinator/door.h):
 * the simulated decode nodes stream to the doors, every answer is still
 * right and served by the nodes the simulator saw. */
static void test_through_front_doors(void **state)
{
    cl.cases++;
    hpd_sim_t *sim = start(20, 60);
    hpd_endpoint_t doors[2];
    for (int i = 0; i < 2; i++) {
        char name[16], port_file[400], sched[32], *argv[CL_MAX_ARGS];
        snprintf(name, sizeof(name), "door-%d", i);
        snprintf(port_file, sizeof(port_file), "%s/%s.port", cl.root, name);
        snprintf(sched, sizeof(sched), "127.0.0.1:%u", cl.port);
        const char *args[] = {HPD_COORDINATOR, "--port", "0", "--port-file", port_file,
                              "--token-file", cl.token_file, "--client-keys-file",
                              cl.keys_file, "--scheduler", sched, "--host", "127.0.0.1",
                              "--max-requests", "4096", "--log-level", "info"};
        cl_args(argv, args, sizeof(args) / sizeof(args[0]), NULL);
        cl_proc_t *p = cl_spawn(&cl, name, argv);
        snprintf(doors[i].host, sizeof(doors[i].host), "127.0.0.1");
        doors[i].port = cl_port_file(&cl, port_file);
        cl_wait_log(&cl, p, "answers", 60); /* it heard the scheduler's decode nodes */
    }
    hpd_load_params_t lp = load_of(sim, 1500);
    lp.max_tokens = 32;
    lp.doors = doors;
    lp.n_doors = 2;
    hpd_load_result_t r;
    assert_int_equal(hpd_load_run(&lp, 120, &r), HPD_OK);
    expect_all_right(&r, 1500);
    stop(sim);
}

/* The load through the coordinator's HTTP API (completions of ids with
 * return_token_ids; the coordinator given a model for its tokenizer, the
 * nodes' ids within its vocabulary): every answer right. */
static void test_through_the_http_api(void **state)
{
    char model[400], http_file[400];
    cl.cases++;
    snprintf(model, sizeof(model), "%s/model", cl.root);
    snprintf(http_file, sizeof(http_file), "%s/http.port", cl.root);
    assert_int_equal(test_mkmodel(model, "--vocab 1024 --seed 3"), 0);
    const char *const extra[] = {"--liveness-ms", "400", "--max-requests", "4096",
                                 "--log-level", "warn", "--model", model, "--http-port", "0",
                                 "--http-port-file", http_file, NULL};
    cl_start_coordinator(&cl, "coordinator", extra);
    hpd_endpoint_t http = {.host = "127.0.0.1", .port = cl_port_file(&cl, http_file)};
    const hpd_sim_params_t sp = {.base = base,
                                 .coord_host = "127.0.0.1",
                                 .coord_port = cl.port,
                                 .token = "sim-secret",
                                 .n_prefill = 10,
                                 .n_decode = 30,
                                 .prefill_us_per_token = 10,
                                 .push_us_per_page = 20,
                                 .step_us = 2000,
                                 .speed_spread = 0.3,
                                 .vocab = 1024,
                                 .slots = 32,
                                 .pages = 100000,
                                 .max_context = 8192,
                                 .seed = 7};
    hpd_sim_t *sim;
    assert_int_equal(hpd_sim_create(&sp, &sim), HPD_OK);
    while (hpd_sim_registered(sim) < 40) {
        assert_int_equal(hpd_sim_refused(sim, NULL, 0), 0);
        event_base_loop(base, EVLOOP_ONCE);
        cl_check_alive(&cl);
    }
    hpd_load_params_t lp = load_of(sim, 1000);
    lp.vocab = 1024;
    lp.connections = 64; /* the HTTP guard takes 64 new connections at once (more: the oldest go) */
    lp.http = &http;
    lp.n_http = 1;
    hpd_load_result_t r;
    assert_int_equal(hpd_load_run(&lp, 120, &r), HPD_OK);
    expect_all_right(&r, 1000);
    stop(sim);
}

typedef struct {
    hpd_sim_t *sim;
    bool done;
} faults_t;

/* At the first tick (1 s into the load) the faults come. Decode nodes
 * are 20 .. 59 (20 prefill nodes first). */
static void faults(void *arg, double t_s, uint32_t answered)
{
    faults_t *f = arg;
    if (f->done)
        return;
    f->done = true;
    assert_int_equal(hpd_sim_fault(f->sim, 20, HPD_SIM_DIE, 0), HPD_OK);
    assert_int_equal(hpd_sim_fault(f->sim, 21, HPD_SIM_STOP, 0), HPD_OK);
    assert_int_equal(hpd_sim_fault(f->sim, 22, HPD_SIM_SLOW, 5), HPD_OK);
    assert_int_equal(hpd_sim_fault(f->sim, 23, HPD_SIM_BAD_NOTICE, 0), HPD_OK);
    assert_int_equal(hpd_sim_fault(f->sim, 24, HPD_SIM_BAD_NOTICE, 0), HPD_OK);
    assert_int_equal(hpd_sim_fault(f->sim, 0, HPD_SIM_DIE, 0), HPD_OK);
    assert_int_equal(hpd_sim_fault(f->sim, 0, HPD_SIM_DIE, 0), HPD_ERR_INVALID_ARG);
}

static void test_faults_under_load(void **state)
{
    cl.cases++;
    hpd_sim_t *sim = start(20, 40);
    faults_t f = {.sim = sim};
    hpd_load_params_t lp = load_of(sim, 2400);
    lp.rate = 1200; /* two seconds of arrivals: the faults land midway */
    lp.max_tokens = 24;
    lp.tick = faults;
    lp.arg = &f;
    hpd_load_result_t r;
    assert_int_equal(hpd_load_run(&lp, 120, &r), HPD_OK);
    assert_true(f.done);
    expect_all_right(&r, 2400);
    /* the dead and the stopped decode nodes' requests ran again elsewhere */
    if (r.retried == 0)
        fail_msg("no request was retried or hedged");
    assert_int_equal(hpd_sim_fault(sim, 21, HPD_SIM_RESUME, 0), HPD_OK);
    stop(sim);
}

/* 64 prefixes of two blocks drawn at random by 480 requests over 4 s, on
 * 4 prefill nodes (200 us a prompt token: some 4 prefills run at once)
 * that each cache up to 1,024 blocks and send their summaries every
 * 100 ms: a prefix's first prompt misses everywhere (the ideal's too);
 * later ones go where it is cached. A router blind to the summaries
 * spreads them by load and finds the node that holds a prefix by
 * chance. */
static void test_prefix_routing(void **state)
{
    cl.cases++;
    hpd_sim_t *sim = start_with(8, 8, 1024, "100", 400);
    hpd_load_params_t lp = load_of(sim, 360);
    lp.rate = 60;
    lp.prompt_tokens = 192;
    lp.prefixes = 32;
    lp.prefix_tokens = 128;
    hpd_load_result_t r;
    assert_int_equal(hpd_load_run(&lp, 120, &r), HPD_OK);
    expect_all_right(&r, 360);
    hpd_sim_stats_t ss;
    hpd_sim_stats(sim, &ss);
    const double quality = (double)ss.cached_tokens / HPD_MAX(1.0, (double)ss.ideal_cached_tokens);
    print_message("prefix cache: %llu of %llu prompt tokens cached where the prefills ran, an "
                  "ideal router %llu: %.3f of the ideal\n", (unsigned long long)ss.cached_tokens,
                  (unsigned long long)ss.prompt_tokens,
                  (unsigned long long)ss.ideal_cached_tokens, quality);
    assert_true(ss.ideal_cached_tokens > ss.prompt_tokens / 4); /* prefixes came again */
    assert_true(ss.cached_tokens <= ss.ideal_cached_tokens);
    assert_true(quality >= 0.75); /* blind to the summaries: 0.60 here */
    stop(sim);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_hundred_nodes),
        cmocka_unit_test(test_through_front_doors),
        cmocka_unit_test(test_through_the_http_api),
        cmocka_unit_test(test_faults_under_load),
        cmocka_unit_test(test_prefix_routing),
    };
    const int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed;
}
