/* A standby coordinator elected through a real etcd on loopback
 * (coordinator/election.h; etcd-server from Debian, skipped where it is
 * missing unless HPD_REQUIRE_ETCD=1):
 * - two coordinators campaign; the first leads and listens, the other
 *   waits without listening (and ends with exit 0 when told to stop);
 *   nodes given both register with the leader;
 * - kill -9 of the leader under load: the standby leads within the lease
 *   (2 s) and a little, the nodes register with it, and every request of a
 *   client given both coordinators ends with the tokens hpd-run gives,
 *   streamed once each: those in flight at the kill are submitted again by
 *   the client library;
 * - the leader stopped (SIGSTOP) past its lease: the standby (a restarted
 *   one) takes over, and the old leader, once it runs again, ends (exit
 *   3) without serving: it never leads beside the new one;
 * - etcd stops answering: the leader steps down (exit 3) before its lease
 *   could have ended; once etcd answers again the standby leads;
 * - etcd killed (-9) and started again under load: whoever leads after
 *   it, every request ends right. */
#include "tests/cluster/failover.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MODEL_ARGS "--hidden 128 --layers 8 --full-interval 2 --intermediate 256 --vocab 512 " \
                   "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "     \
                   "--lin-k-dim 32 --lin-v-dim 32 --seed 5"
#define N 4
#define MAX_TOKENS 12

static cl_t cl;
static int32_t prompts[N][CL_PROMPT_MAX];
static uint32_t prompt_len[N];
static int32_t ref[N][MAX_TOKENS];
static char etcd_url[64];
static uint16_t etcd_ports[2]; /* client, peer */
static uint16_t ports[2];
static char both[64]; /* the coordinators, as the nodes are given them */

static cl_load_t load;

static int setup(void **state)
{
    char path[400];
    if (!cl_etcd_present())
        exit(77);
    if (cl_init(&cl, "standby", MODEL_ARGS) != 0)
        return -1;
    cl_make_prompts(&cl, N, 31, prompts, prompt_len, path, sizeof(path));
    cl_reference(&cl, path, N, MAX_TOKENS, "", &ref[0][0]);
    load = (cl_load_t){.prompts = prompts, .prompt_len = prompt_len, .ref = &ref[0][0], .n = N,
                       .max_tokens = MAX_TOKENS};
    return 0;
}

static int teardown(void **state)
{
    cl_finish(&cl);
    return 0;
}

/* etcd on loopback; again: on the ports and data of the one before */
static cl_proc_t *start_etcd(bool again)
{
    return cl_start_etcd(&cl, again ? "etcd2" : "etcd", "etcd", NULL, "127.0.0.1", etcd_ports,
                         etcd_url, sizeof(etcd_url));
}

/* A coordinator named name on port i (0 or 1), campaigning. */
static cl_proc_t *start_coordinator(int i, const char *name)
{
    char port[8], port_file[400], *argv[CL_MAX_ARGS];
    snprintf(port, sizeof(port), "%u", ports[i]);
    snprintf(port_file, sizeof(port_file), "%s/%s.port", cl.root, name);
    unlink(port_file);
    const char *base[] = {HPD_COORDINATOR, "--host", "127.0.0.1", "--port", port,
                          "--port-file", port_file, "--token-file", cl.token_file,
                          "--client-keys-file", cl.keys_file, "--log-level", "info",
                          "--liveness-ms", "0", "--heartbeat-ms", "200", "--lease-ms", "3000",
                          "--etcd", etcd_url, "--etcd-ttl-s", "2"};
    cl_args(argv, base, sizeof(base) / sizeof(base[0]), NULL);
    return cl_spawn(&cl, name, argv);
}

/* The leader is coordinator i: the harness's status and clients go there. */
static void follow(int i, cl_proc_t *p)
{
    hpd_client_destroy(cl.status_client);
    cl.status_client = NULL;
    cl.coord = p;
    cl.port = ports[i];
    snprintf(cl.addr, sizeof(cl.addr), "127.0.0.1:%u", cl.port);
    snprintf(cl.host, sizeof(cl.host), "127.0.0.1");
}

/* Every prompt through the leader: the tokens hpd-run gives. */
static void expect_right(const char *when)
{
    hpd_client_t *c = cl_client(&cl);
    cl_req_t q[N];
    memset(q, 0, sizeof(q));
    for (int i = 0; i < N; i++) {
        hpd_generate_params_t p = {.prompt = prompts[i],
                                   .n_prompt = prompt_len[i],
                                   .max_tokens = MAX_TOKENS,
                                   .sampling = {.top_p = 1}};
        assert_int_equal(hpd_client_submit(c, &p, NULL, cl_on_done, &q[i], NULL), HPD_OK);
    }
    cl_client_wait(&cl, c, 120, when);
    for (int i = 0; i < N; i++) {
        if (q[i].status != HPD_OK)
            fail_msg("%s: request %d: %s: %s", when, i, hpd_status_str(q[i].status), q[i].error);
        assert_int_equal(q[i].n, MAX_TOKENS);
        assert_memory_equal(q[i].tokens, ref[i], sizeof(ref[i]));
    }
    hpd_client_destroy(c);
}

static void test_failover(void **state)
{
    cl_proc_t *etcd = start_etcd(false);
    ports[0] = cl_free_port();
    ports[1] = cl_free_port();
    snprintf(both, sizeof(both), "127.0.0.1:%u,127.0.0.1:%u", ports[0], ports[1]);
    cl_proc_t *a = start_coordinator(0, "a");
    cl_wait(&cl, NULL, 30, cl_leads, a->log, "a leading");
    /* a standby asked to stop ends as a drained coordinator does */
    cl_proc_t *s = start_coordinator(1, "s");
    cl_wait_log(&cl, s, "campaigning for", 30);
    cl_ending(s);
    assert_int_equal(kill(s->pid, SIGTERM), 0);
    cl_expect_end(&cl, s, 0, 30);
    cl_proc_t *b = start_coordinator(1, "b");
    cl_wait_log(&cl, b, "campaigning for", 30);
    follow(0, a);
    /* the nodes are given both; the standby does not listen */
    snprintf(cl.addr, sizeof(cl.addr), "%.63s", both);
    cl_proc_t *p0 = cl_start_node(&cl, "prefill", "p0", NULL);
    cl_proc_t *d0 = cl_start_node(&cl, "decode", "d0", NULL);
    follow(0, a);
    cl_wait_idle(&cl, 2, 120);
    assert_false(cl_file_has(b->log, "listening on"));
    expect_right("through the first leader");

    /* the leader dies under load: the standby leads after the lease, the
     * nodes follow, and the client submits what was open again */
    cl_load_start(&load, both);
    cl_load_for(&cl, 1.0);
    assert_true(load.right > 0);
    const double t0 = hpd_time_now();
    load.t_mark = t0;
    cl_kill9(&cl, a);
    cl_load_until(&cl, &(cl_load_stop_t){cl_load_log_leads, b->log}, 30,
                  "b leading after a's kill -9");
    const double t_lead = hpd_time_now() - t0;
    cl_load_until_back(&cl, b->log, 2 * CL_LOAD_DEPTH, "service through the standby");
    cl_load_for(&cl, 0.5);
    cl_load_end(&cl, &load, "kill -9 of the leader under load", 120);
    assert_true(load.retried > 0); /* requests were open at the kill */
    follow(1, b);
    cl_wait_idle(&cl, 2, 120);
    const double t_nodes = hpd_time_now() - t0;
    expect_right("through the standby, leading");
    print_message("kill -9 of the leader: the standby led after %.2f s, both nodes registered "
                  "with it after %.2f s\n", t_lead, t_nodes);
    assert_true(t_lead < 6.0); /* the lease (2 s), the campaign's turn, a loaded machine */

    /* the leader stops past its lease: a standby leads, and the old leader
     * ends when it runs again, without serving */
    a = start_coordinator(0, "a2");
    cl_wait_log(&cl, a, "campaigning for", 30);
    cl_pause(b);
    cl_wait(&cl, NULL, 30, cl_leads, a->log, "a2 leading while b is stopped");
    follow(0, a);
    cl_ending(b); /* it ends by itself once it runs */
    cl_resume(b);
    cl_expect_end(&cl, b, 3, 30);
    assert_true(cl_file_has(b->log, "no longer the leader"));
    cl_wait_idle(&cl, 2, 120);
    expect_right("through the leader after the stopped one ended");

    /* etcd stops answering: the leader cannot know whether its lease
     * still holds, and steps down before it could have ended; once etcd
     * answers again the standby leads and the nodes follow */
    cl_proc_t *b2 = start_coordinator(1, "b2");
    cl_wait_log(&cl, b2, "campaigning for", 30);
    cl_ending(a);
    const double t1 = hpd_time_now();
    cl_pause(etcd);
    cl_expect_end(&cl, a, 3, 30);
    const double t_down = hpd_time_now() - t1;
    assert_true(cl_file_has(a->log, "no longer the leader"));
    cl_resume(etcd);
    cl_wait(&cl, NULL, 30, cl_leads, b2->log, "b2 leading once etcd answers again");
    follow(1, b2);
    cl_wait_idle(&cl, 2, 120);
    print_message("etcd stopped: the leader stepped down after %.2f s (its lease: 2 s)\n",
                  t_down);
    assert_true(t_down < 2.0); /* before the lease could have ended at etcd */
    expect_right("through the leader elected after etcd's pause");
    a = b2;

    /* etcd dies (-9) and starts again under load: the leader keeps leading
     * where its renewals resume before its deadline, or steps down and the
     * standby leads once the lease ends; either way every request ends
     * with the right tokens */
    cl_proc_t *s3 = start_coordinator(0, "a3");
    cl_wait_log(&cl, s3, "campaigning for", 30);
    cl_load_start(&load, both);
    cl_load_for(&cl, 0.5);
    cl_ending(a); /* it may step down */
    load.t_mark = hpd_time_now();
    cl_kill9(&cl, etcd);
    etcd = start_etcd(true);
    cl_load_for(&cl, 3.0); /* past the old lease, whichever way it went */
    const bool stepped_down = cl_file_has(a->log, "no longer the leader");
    if (stepped_down) {
        cl_expect_end(&cl, a, 3, 30);
        cl_load_until_back(&cl, s3->log, 2 * CL_LOAD_DEPTH, "service through a3 after etcd's "
                           "restart");
    } else {
        uint32_t more = load.right + 2 * CL_LOAD_DEPTH;
        cl_load_until(&cl, &(cl_load_stop_t){cl_load_is_back, &more}, 60,
                      "service through the same leader after etcd's restart");
    }
    cl_load_end(&cl, &load, "etcd killed and started again under load", 120);
    print_message("etcd restarted: %s\n", stepped_down ? "the leader stepped down, a3 leads"
                                                      : "the leader kept its lease");
    if (stepped_down) {
        follow(0, s3);
        a = s3;
    } else {
        a->ending = false;
        cl_ending(s3); /* a standby told to stop ends 0 */
        assert_int_equal(kill(s3->pid, SIGTERM), 0);
        cl_expect_end(&cl, s3, 0, 30);
    }
    cl_wait_idle(&cl, 2, 120);
    expect_right("through the leader after etcd's restart");

    /* the leader drains and gives its lease back; it tells its nodes to
     * stop, and all end 0; then etcd goes */
    cl_end_election(&cl, a, p0, d0, etcd);
    cl.passed++;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover),
    };
    cl.cases = sizeof(tests) / sizeof(tests[0]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
