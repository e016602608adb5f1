/* Tensor parallelism through the cluster (issue 37; docs/tensor_parallel.md):
 * prefill and decode nodes at different TP degrees, each in its own KV page
 * layout, on a mixture-of-experts model with 2 KV heads (replicated from
 * TP 4), 4 GDN key heads and 8 value heads. Every output of every pairing
 * equals hpd-run at TP 1, greedy and seeded:
 * - P TP 4 -> D TP 1, P TP 4 -> D TP 2, P TP 2 -> D TP 4 and P TP 1 ->
 *   D TP 4, one pair at a time (the other nodes drained away);
 * - then all of them in one cluster under load, with a TP 4 decode node
 *   killed (-9) while it holds requests: they run again, nothing lost,
 *   nothing different.
 * A node whose numerics differ (--tp-fast: its sums depend on its degree)
 * is refused at registration, naming both sides. Every process ends with
 * exit status 0 on SIGTERM and a clean log (tests/cluster/harness.h). */
#include "tests/cluster/harness.h"

#include "kernels/backend.h"

#define MODEL_ARGS "--hidden 128 --layers 8 --full-interval 2 --intermediate 256 --vocab 512 " \
                   "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 4 --lin-v-heads 8 "     \
                   "--lin-k-dim 32 --lin-v-dim 32 --seed 11 --experts 8 --experts-per-tok 2 "  \
                   "--moe-intermediate 64 --shared-intermediate 32 --mlp-only-layers 3"
#define N_PROMPTS 16
#define MAX_TOKENS 12

static cl_t cl;
static char prompts_file[300];
static hpd_prompt_t prompts[N_PROMPTS];
typedef int32_t tokens_t[MAX_TOKENS];
static tokens_t ref_greedy[N_PROMPTS], ref_seeded[N_PROMPTS];

typedef struct {
    const char *role, *name, *tp, *layout;
    cl_proc_t *p;
} node_t;

static node_t p1 = {"prefill", "p-tp1", "1", "64,1,nhd", NULL};
static node_t p2 = {"prefill", "p-tp2", "2", "32,2,nhd", NULL};
static node_t p4 = {"prefill", "p-tp4", "4", "16,4,hnd", NULL};
static node_t d1 = {"decode", "d-tp1", "1", "16,3,nhd", NULL};
static node_t d2 = {"decode", "d-tp2", "2", "16,1,hnd", NULL};
static node_t d4 = {"decode", "d-tp4", "4", "32,2,nhd", NULL};

static void start(node_t *n)
{
    /* one thread a rank; reservations never expire here */
    const bool decode = strcmp(n->role, "decode") == 0;
    const char *args[] = {"--tp", n->tp, "--threads", n->tp, "--kv-layout", n->layout,
                          "--max-batch", "16", "--max-context", "512", "--prefill-chunk", "64",
                          decode ? "--reserve-timeout-ms" : NULL, "600000", NULL};
    n->p = cl_start_node(&cl, n->role, n->name, args);
}

/* SIGTERM: it drains (nothing is in flight) and exits 0 */
static void stop(node_t *n)
{
    cl_ending(n->p);
    assert_int_equal(kill(n->p->pid, SIGTERM), 0);
    cl_expect_end(&cl, n->p, 0, 60);
}

static int setup(void **state)
{
    if (cl_init(&cl, "cluster_tp", MODEL_ARGS) != 0)
        return -1;
    if (getenv("HPD_TEST_UCX_TLS") != NULL) /* the nodes' data plane (default tcp) */
        cl.ucx_tls = getenv("HPD_TEST_UCX_TLS");
    snprintf(prompts_file, sizeof(prompts_file), "%s/prompts", cl.root);
    /* 4 system prompts of 40..250 tokens, 4 questions each: prompts over
     * several prefill chunks, and prefix-cache hits on the prefill ranks */
    FILE *f = fopen(prompts_file, "w");
    for (int i = 0; i < N_PROMPTS; i++) {
        const int sys = i % 4, sys_len = 40 + 70 * sys, q_len = 3 + (i * 11) % 40;
        prompts[i].n = (size_t)(sys_len + q_len);
        prompts[i].ids = malloc(prompts[i].n * sizeof(int32_t));
        for (int t = 0; t < sys_len + q_len; t++) {
            prompts[i].ids[t] = t < sys_len ? (int32_t)(hpd_philox4x32(300 + sys, t, 0).v[0] % 512)
                                            : (int32_t)(hpd_philox4x32(3000 + i, t, 0).v[0] % 512);
            fprintf(f, t ? ",%d" : "%d", prompts[i].ids[t]);
        }
        fprintf(f, "\n");
    }
    fclose(f);
    cl_reference(&cl, prompts_file, N_PROMPTS, MAX_TOKENS, "--no-generation-defaults",
                 &ref_greedy[0][0]);
    cl_reference(&cl, prompts_file, N_PROMPTS, MAX_TOKENS,
                 "--temperature 0.8 --top-p 0.9 --top-k 40 --seed 7", &ref_seeded[0][0]);
    const char *args[] = {"--heartbeat-ms", "100", "--lease-ms", "120000", "--queue-timeout-ms",
                          "600000", NULL};
    cl_start_coordinator(&cl, "coordinator", args);
    return 0;
}

static int teardown(void **state)
{
    for (int i = 0; i < N_PROMPTS; i++)
        free(prompts[i].ids);
    cl_finish(&cl);
    return 0;
}

typedef struct {
    cl_req_t q[N_PROMPTS];
    uint32_t done;
    void (*during)(void);
} batch_t;

static bool batch_done(cl_t *c, void *arg)
{
    batch_t *b = arg;
    if (b->during != NULL)
        b->during();
    b->done = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        b->done += b->q[i].done;
    return b->done == N_PROMPTS;
}

/* The prompts at once, greedy or seeded; every output must be hpd-run's. */
static uint32_t run_batch(bool seeded, void (*during)(void), const char *what)
{
    static const hpd_sampling_t greedy = {.top_p = 1};
    static const hpd_sampling_t sampled = {
        .temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 7};
    static batch_t b;
    hpd_client_t *c = cl_client(&cl);
    memset(&b, 0, sizeof(b));
    b.during = during;
    for (int i = 0; i < N_PROMPTS; i++) {
        hpd_generate_params_t p = {.prompt = prompts[i].ids,
                                   .n_prompt = (uint32_t)prompts[i].n,
                                   .max_tokens = MAX_TOKENS,
                                   .sampling = seeded ? sampled : greedy};
        uint64_t h;
        assert_int_equal(hpd_client_submit(c, &p, NULL, cl_on_done, &b.q[i], &h), HPD_OK);
    }
    cl_wait(&cl, c, 300, batch_done, &b, what);
    hpd_client_destroy(c);
    tokens_t *ref = seeded ? ref_seeded : ref_greedy;
    uint32_t bad = 0, retried = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        const cl_req_t *q = &b.q[i];
        retried += q->attempts > 1;
        if (q->status != HPD_OK || q->n != MAX_TOKENS ||
            memcmp(q->tokens, ref[i], sizeof(ref[i])) != 0) {
            print_message("%s: prompt %d differs from hpd-run (%s, %u tokens%s%s)\n", what, i,
                          hpd_status_str(q->status), q->n, q->error[0] ? ": " : "", q->error);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    return retried;
}

/* One prefill node and one decode node: both batches through that pair. */
static void pair(node_t *p, node_t *d)
{
    char what[96];
    cl_wait_idle(&cl, 2, 120);
    snprintf(what, sizeof(what), "P TP %s -> D TP %s greedy", p->tp, d->tp);
    run_batch(false, NULL, what);
    snprintf(what, sizeof(what), "P TP %s -> D TP %s seeded", p->tp, d->tp);
    run_batch(true, NULL, what);
    print_message("P TP %s (%s) -> D TP %s (%s): %d/%d greedy and seeded identical to "
                  "hpd-run\n", p->tp, p->layout, d->tp, d->layout, N_PROMPTS, N_PROMPTS);
}

static void test_pairs(void **state)
{
    (void)state;
    start(&p4);
    start(&d1);
    pair(&p4, &d1); /* replicated KV heads gathered into whole pages */
    start(&d2);
    stop(&d1);
    pair(&p4, &d2);
    start(&d4);
    stop(&d2);
    start(&p2);
    stop(&p4);
    pair(&p2, &d4);
    start(&p1);
    stop(&p2);
    pair(&p1, &d4); /* each KV head written into two decode ranks */
    cl.passed++;
}

/* kill -9 of the TP 4 decode node while it holds requests (stopped first,
 * so that what the coordinator says it holds stays its until it dies) */
static bool killed;
static void kill_d4(void)
{
    cl_status_t s;
    if (killed)
        return;
    cl_pause(d4.p);
    cl_status(&cl, &s);
    const msgpack_object *n = cl_status_node(&s, d4.name);
    assert_non_null(n);
    const uint64_t held = cl_u64(n, "reserved_slots");
    cl_status_free(&s);
    if (held < 2) {
        cl_resume(d4.p);
        return;
    }
    print_message("killing %s (tp 4), which holds %llu requests\n", d4.name,
                  (unsigned long long)held);
    cl_kill9(&cl, d4.p);
    killed = true;
}

static void test_mixed_and_failover(void **state)
{
    (void)state;
    start(&p2);
    start(&p4);
    start(&d1);
    start(&d2);
    cl_wait_idle(&cl, 6, 120); /* p1, d4 still up from test_pairs */
    run_batch(false, NULL, "every degree in one cluster, greedy");
    killed = false;
    const uint32_t retried = run_batch(true, kill_d4, "kill -9 of the TP 4 decode node");
    assert_true(killed);
    assert_true(retried >= 1);
    print_message("6 nodes of TP 1, 2 and 4: %d/%d identical; after kill -9 of the TP 4 "
                  "decode node %d/%d identical, %u retried\n", N_PROMPTS, N_PROMPTS, N_PROMPTS,
                  N_PROMPTS, retried);
    start(&d4);
    cl_wait_idle(&cl, 6, 120);
    cl.passed++;
}

/* Log probabilities through the cluster (here P TP 1 -> D TP 4): every
 * token's, and its 5 most likely tokens', printed as hpd-run --logprobs 5
 * prints them (%.9g: the floats' bits), equal hpd-run at TP 1's, greedy
 * and seeded (seeded: the prompt's too, --prompt-logprobs); the first
 * token's and the prompt's come from the prefill node, the others from
 * the decode node. */
static void test_logprobs(void **state)
{
    (void)state;
    static const char *const modes[2] = {"--no-generation-defaults",
                                         "--temperature 0.8 --top-p 0.9 --top-k 40 --seed 7"};
    for (int seeded = 0; seeded < 2; seeded++) {
        char cmd[2048], line[65536];
        snprintf(cmd, sizeof(cmd), "OMP_WAIT_POLICY=passive timeout 300 %s --model %s "
                 "--prompts-file %s --max-tokens %d --threads 2 --logprobs 5 %s%s", HPD_RUN,
                 cl.model, prompts_file, MAX_TOKENS, modes[seeded],
                 seeded ? " --prompt-logprobs" : "");
        FILE *ref = popen(cmd, "r");
        assert_non_null(ref);
        hpd_client_t *c = cl_client(&cl);
        for (int i = 0; i < N_PROMPTS; i++) {
            hpd_generate_params_t p = {.prompt = prompts[i].ids,
                                       .n_prompt = (uint32_t)prompts[i].n,
                                       .max_tokens = MAX_TOKENS,
                                       .sampling = {.top_p = 1},
                                       .logprobs = true,
                                       .top_logprobs = 5,
                                       .prompt_logprobs = seeded};
            if (seeded)
                p.sampling = (hpd_sampling_t){
                    .temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 7};
            hpd_generate_result_t r;
            assert_int_equal(hpd_client_generate(c, &p, NULL, NULL, &r), HPD_OK);
            assert_non_null(r.logprobs);
            char *got = NULL;
            size_t got_len = 0;
            FILE *m = open_memstream(&got, &got_len);
            if (seeded) { /* the prompt's line first */
                assert_non_null(r.prompt_logprobs);
                hpd_logprobs_print(m, r.prompt_logprobs, r.prompt_tokens - 1);
            }
            hpd_logprobs_print(m, r.logprobs, r.n_tokens);
            fclose(m);
            assert_non_null(fgets(line, sizeof(line), ref)); /* the ids */
            assert_non_null(fgets(line, sizeof(line), ref)); /* their logprobs */
            if (seeded) { /* and the prompt's before them */
                const size_t n = strlen(line);
                assert_non_null(fgets(line + n, (int)(sizeof(line) - n), ref));
            }
            if (strcmp(got, line) != 0)
                fail_msg("%s: prompt %d's logprobs differ from hpd-run's:\n got %s want %s",
                         seeded ? "seeded" : "greedy", i, got, line);
            free(got);
            hpd_generate_result_free(&r);
        }
        hpd_client_destroy(c);
        assert_int_equal(pclose(ref), 0);
    }
    print_message("logprobs (5 top ones): %d/%d prompts greedy and seeded (with the "
                  "prompt's) as hpd-run's, bit for bit\n", N_PROMPTS, N_PROMPTS);
    cl.passed++;
}

/* --tp-fast sums in an order that depends on the degree: such a node's
 * tokens differ from the cluster's, and it is refused, naming both. */
static void test_fast_refused(void **state)
{
    (void)state;
    const char *args[] = {"--tp", "2", "--tp-fast", NULL};
    cl_proc_t *odd = cl_start_node(&cl, "decode", "fast-d", args);
    cl_ending(odd);
    cl_expect_end(&cl, odd, 1, 60);
    assert_true(cl_file_has(odd->log, "computes with fp32+tp2-fast where the cluster uses "
                                      "fp32"));
    run_batch(false, NULL, "after the refusal");
    cl_stop_all(&cl);
    cl.passed++;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairs),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_mixed_and_failover),
        cmocka_unit_test(test_fast_refused),
    };
    cl.cases = 4;
    return cmocka_run_group_tests(tests, setup, teardown);
}
