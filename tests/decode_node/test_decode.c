/* The decode role (decode_node/decode.c) alone: a real hpd-decode, and a
 * real hpd-prefill to fill its reservations, with the test as their
 * coordinator (tests/node/roles.h):
 * - a request reserved, prefilled and started gives hpd-run's tokens, with
 *   the first token from the prefill and the rest streamed in order, greedy
 *   and sampled, across two KV layouts whose pack of full-attention layers
 *   leaves a partial last pack; stop ids, min_tokens and a replay (the
 *   tokens a client already had) are honoured;
 * - start may come before the transfer's notice;
 * - reserve, start and cancel refuse what they cannot serve, naming the
 *   value; a cancel gives the pages back; a reservation never started
 *   expires: at once when its transfer ended, else its pages stay held
 *   until the cancel (its writer may still be writing);
 * - the load in its stats counts what happened. */
#include "tests/node/roles.h"

#define MODEL_ARGS "--hidden 64 --layers 6 --full-interval 2 --intermediate 96 --vocab 300 " \
                   "--heads 2 --kv-heads 1 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "   \
                   "--lin-k-dim 16 --lin-v-dim 24 --seed 11"
#define VOCAB 300
#define MAX_NEW 12

static rn_node_t *p, *d;

/* a prefill node and a decode node of other layouts: 3 full-attention
 * layers in packs of 2 on the decode node */
static const char *const prefill_args[] = {"--kv-layout", "32,1,nhd", "--max-context", "512",
                                           NULL};
static const char *const decode_args[] = {"--kv-layout", "16,2,hnd", "--max-context", "512",
                                          "--kv-pages", "96", "--max-batch", "4",
                                          "--metrics-port", "0", "--log-level", "info", NULL};
static uint16_t d_metrics; /* d0's /metrics port */

static int group_setup(void **state)
{
    if (rn_setup("decode-role", MODEL_ARGS, 60000) != 0)
        return -1;
    p = rn_node_start("prefill", "p0", prefill_args);
    d = rn_node_start("decode", "d0", decode_args);
    d_metrics = cl_metrics_port(&rn.cl, d->proc);
    return 0;
}

static int group_teardown(void **state)
{
    return rn_teardown();
}

static void assert_stream(const rn_stream_t *s, const int32_t *want, uint32_t n,
                          const char *reason)
{
    if (s->error[0] != '\0')
        fail_msg("job %llu failed: %s", (unsigned long long)s->job, s->error);
    assert_false(s->bad_index);
    assert_int_equal(s->empty, 0); /* a notification carries news */
    for (uint32_t i = 0; i < HPD_MIN(n, s->n); i++)
        if (s->ids[i] != want[i])
            fail_msg("job %llu token %u: %d, want %d", (unsigned long long)s->job, i, s->ids[i],
                     want[i]);
    assert_int_equal(s->n, n);
    assert_string_equal(s->finish_reason, reason);
}

static void test_as_one_engine(void **state)
{
    static const uint32_t lens[] = {5, 33, 77};
    int32_t prompt[80], want[MAX_NEW];
    const uint64_t finished = rn_stat(d, "load.finished");
    for (uint32_t i = 0; i < 3; i++) {
        rn_prompt(prompt, lens[i], 100 + i, VOCAB);
        rn_reference(prompt, lens[i], MAX_NEW, "--ignore-eos", want);
        const hpd_msg_reserve_t more = {.ignore_eos = true};
        rn_stream_t *s = rn_generate(p, d, 10 + i, prompt, lens[i], MAX_NEW, &more, NULL);
        assert_stream(s, want, MAX_NEW, "length");
    }
    /* sampled: the seed and the cut travel with the reservation */
    const hpd_sampling_t samp = {.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 7};
    hpd_rpc_buf_t sb;
    hpd_rpc_buf_init(&sb);
    hpd_proto_pack_sampling(&sb.pk, &samp);
    rn_prompt(prompt, 40, 200, VOCAB);
    rn_reference(prompt, 40, MAX_NEW,
                 "--ignore-eos --temperature 0.8 --top-p 0.9 --top-k 40 --seed 7", want);
    const hpd_msg_reserve_t more = {.ignore_eos = true, .sampling_raw = sb.sb.data,
                                    .sampling_raw_len = (uint32_t)sb.sb.size};
    assert_stream(rn_generate(p, d, 20, prompt, 40, MAX_NEW, &more, NULL), want, MAX_NEW,
                  "length");
    hpd_rpc_buf_destroy(&sb);
    assert_int_equal(rn_stat(d, "load.finished"), finished + 4);
    assert_int_equal(rn_stat(d, "pages_used"), 0);
    assert_int_equal(rn_stat(d, "slots_used"), 0);
    rn.cl.passed++;
}

/* stop ids end the answer at the first of them, min_tokens first; a
 * replay's tokens are not streamed again */
static void test_stops_and_replay(void **state)
{
    int32_t prompt[40], want[MAX_NEW];
    rn_prompt(prompt, 40, 300, VOCAB);
    rn_reference(prompt, 40, MAX_NEW, "--ignore-eos", want);
    /* the 4th token as a stop id: the answer ends there ("stop") */
    const int32_t stop[] = {want[3]};
    uint32_t at = 0;
    while (want[at] != stop[0])
        at++;
    hpd_msg_reserve_t more = {.ignore_eos = true, .stop_token_ids = stop, .stop_token_ids_n = 1};
    assert_stream(rn_generate(p, d, 30, prompt, 40, MAX_NEW, &more, NULL), want, at + 1, "stop");
    /* with min_tokens past it, the next occurrence or the length */
    more.min_tokens = at + 2;
    uint32_t next = at + 1;
    while (next < MAX_NEW && want[next] != stop[0])
        next++;
    assert_stream(rn_generate(p, d, 31, prompt, 40, MAX_NEW, &more, NULL), want,
                  next < MAX_NEW ? next + 1 : MAX_NEW, next < MAX_NEW ? "stop" : "length");

    /* a replay of 5 tokens: streamed from index 5 on */
    const hpd_msg_reserve_t replay = {.ignore_eos = true, .replay = want, .replay_n = 5};
    rn_stream_t *s = rn_stream(32);
    memcpy(s->ids, want, 5 * sizeof(int32_t));
    s->n = 5;
    assert_stream(rn_generate(p, d, 32, prompt, 40, MAX_NEW, &replay, NULL), want, MAX_NEW,
                  "length");
    /* a replay the prefill's first token does not continue fails the job */
    const uint64_t failed = rn_stat(d, "load.failed");
    int32_t wrong[2] = {(want[0] + 1) % VOCAB, want[1]};
    const hpd_msg_reserve_t bad = {.ignore_eos = true, .replay = wrong, .replay_n = 2};
    s = rn_stream(33);
    hpd_rpc_result_t r;
    msgpack_sbuffer res;
    rn_reserve(d, 33, prompt, 40, MAX_NEW, &bad, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_prefill(p, 33, prompt, 40, d, &res, NULL, 0, &r);
    msgpack_sbuffer_destroy(&res);
    rn_assert_ok(&r, "prefill");
    hpd_rpc_result_destroy(&r);
    rn_start_job(d, 33, (uint32_t)want[0], &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(s->done, cl_check_alive(&rn.cl));
    assert_string_equal(s->error, "the first token does not continue the replayed tokens");
    assert_int_equal(rn_stat(d, "load.failed"), failed + 1);
    assert_int_equal(rn_stat(d, "pages_used"), 0);
    rn.cl.passed++;
}

/* start first, the transfer's notice after: the request runs once both came */
static void test_start_before_the_notice(void **state)
{
    int32_t prompt[50], want[MAX_NEW];
    hpd_rpc_result_t r;
    msgpack_sbuffer res;
    rn_prompt(prompt, 50, 400, VOCAB);
    rn_reference(prompt, 50, MAX_NEW, "--ignore-eos", want);
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    rn_reserve(d, 40, prompt, 50, MAX_NEW, &more, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_start_job(d, 40, (uint32_t)want[0], &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    spin(50);
    rn_stream_t *s = rn_stream(40);
    assert_int_equal(s->notices, 0); /* nothing runs without the KV */
    /* started twice: refused */
    rn_start_job(d, 40, (uint32_t)want[0], &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "start: job 40 is not reserved here (expired, canceled or started)");
    /* the first token is the stream's before the prefill: the decode node
     * (started already) streams while the test waits for the prefill's
     * reply */
    s->ids[0] = want[0];
    s->n = 1;
    rn_prefill(p, 40, prompt, 50, d, &res, NULL, 0, &r);
    msgpack_sbuffer_destroy(&res);
    rn_assert_ok(&r, "prefill");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(s->done, cl_check_alive(&rn.cl));
    assert_stream(s, want, MAX_NEW, "length");
    rn.cl.passed++;
}

/* What reserve, start and cancel refuse, and a cancel's pages. */
static void test_refusals(void **state)
{
    int32_t prompt[600];
    hpd_rpc_result_t r;
    rn_prompt(prompt, 600, 500, VOCAB);
    const uint64_t canceled = rn_stat(d, "load.canceled");

    prompt[7] = VOCAB;
    rn_reserve(d, 50, prompt, 20, 4, NULL, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "reserve: prompt[7] is 300 (expected a token id from 0 to 299)");
    prompt[7] = 1;
    const int32_t replay[] = {5, VOCAB};
    const hpd_msg_reserve_t bad_replay = {.replay = replay, .replay_n = 2};
    rn_reserve(d, 50, prompt, 20, 4, &bad_replay, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "reserve: replay[1] is 300 (expected a token id from 0 to 299)");
    /* over the context: refused, not a lack of room */
    rn_reserve(d, 50, prompt, 500, 13, NULL, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "reserve: request refused (500 prompt tokens, 13 new, max context 512)");
    /* 96 pages of 16 tokens for 3 layers in packs of 2 (2 groups): 48
     * pages of each group, 768 tokens; two of 400 do not fit */
    rn_reserve(d, 51, prompt, 400, 8, NULL, &r);
    rn_assert_ok(&r, "reserve");
    /* the reply: the layout, one page list per pack group, the prompt's pages */
    const msgpack_object *tables = cl_field(&r.result, "tables");
    assert_int_equal(tables->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(tables->via.array.size, 2);
    for (uint32_t g = 0; g < 2; g++)
        assert_int_equal(tables->via.array.ptr[g].via.array.size, 25);
    hpd_rpc_result_destroy(&r);
    rn_reserve(d, 53, prompt, 20, 8, NULL, &r);
    rn_assert_ok(&r, "reserve");
    hpd_rpc_result_destroy(&r);
    assert_int_equal(rn_stat(d, "load.reserved"), 2);
    rn_cancel(d, 53, 0);
    assert_int_equal(rn_stat(d, "load.reserved"), 1);
    /* the node's gauges say the same as its stats */
    char *text = cl_scrape(d_metrics);
    assert_true(cl_sample(text, "hpd_kv_pages_used") == (double)rn_stat(d, "pages_used"));
    assert_true(cl_sample(text, "hpd_kv_pages_used") == 52); /* 408 tokens: 26 pages x 2 */
    assert_true(cl_sample(text, "hpd_kv_pages_total") == 96);
    assert_true(cl_sample(text, "hpd_slots_used") == 1);
    assert_true(cl_sample(text, "hpd_slots_total") == (double)rn_stat(d, "slots_total"));
    assert_true(cl_sample(text, "hpd_registered") == 1);
    assert_true(cl_sample(text, "hpd_draining") == 0);
    assert_non_null(strstr(text, "# HELP hpd_slots_used GDN state slots in use.\n"));
    free(text);
    int code = 0;
    char want[100];
    assert_int_equal(hpd_http_get("127.0.0.1", d_metrics, "/healthz", 10000, &code, &text),
                     HPD_OK);
    assert_int_equal(code, 200);
    snprintf(want, sizeof(want), "ok: decode node d0, id %llu, 1 jobs in flight",
             (unsigned long long)d->id);
    if (strncmp(text, want, strlen(want)) != 0)
        fail_msg("/healthz: %s", text);
    free(text);
    rn_reserve(d, 51, prompt, 20, 8, NULL, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS, "reserve: job 51 already exists");
    rn_reserve(d, 52, prompt + 100, 400, 8, NULL, &r);
    rn_assert_error(&r, HPD_RPC_ERR_OVERLOADED,
                    "reserve: no room for 400 + 8 tokens (3 of 4 slots and 44 of 96 pages free)");

    rn_start_job(d, 51, VOCAB, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "start: first_token 300 is not a token id (vocabulary 300)");
    hpd_rpc_buf_t nofirst;
    hpd_rpc_buf_init(&nofirst);
    msgpack_pack_map(&nofirst.pk, 1);
    hpd_proto_kv_u64(&nofirst.pk, "job", 51);
    assert_int_equal(hpd_rpc_call_sync(d->cl, "start", &nofirst, 60000, &r), HPD_OK);
    hpd_rpc_buf_destroy(&nofirst);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS, "start: field 'first_token' is missing");
    rn_start_job(d, 999, 1, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "start: job 999 is not reserved here (expired, canceled or started)");
    rn_cancel(d, 999, 0); /* unknown: answered all the same */
    /* the refused starts left job 51 unstarted: a start is taken (it waits
     * for the transfer's notice) */
    rn_start_job(d, 51, 1, &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    assert_true(rn_stat(d, "pages_used") >= 50);
    rn_cancel(d, 51, 0);
    assert_int_equal(rn_stat(d, "pages_used"), 0);
    assert_int_equal(rn_stat(d, "slots_used"), 0);
    assert_int_equal(rn_stat(d, "load.reserved"), 0);
    assert_int_equal(rn_stat(d, "load.canceled"), canceled + 2);
    rn_start_job(d, 51, 1, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "start: job 51 is not reserved here (expired, canceled or started)");
    rn.cl.passed++;
}

/* A reservation not started in time expires; without its transfer's
 * notice its pages stay held (fenced) until the cancel. */
static void test_expiry(void **state)
{
    static const char *const args[] = {"--kv-layout", "16,2,hnd", "--max-context", "512",
                                       "--reserve-timeout-ms", "400", NULL};
    rn_node_t *e = rn_node_start("decode", "d-expiry", args);
    int32_t prompt[40];
    hpd_rpc_result_t r;
    msgpack_sbuffer res;
    rn_prompt(prompt, 40, 600, VOCAB);

    const double t0 = hpd_time_now();
    rn_reserve(e, 60, prompt, 40, 4, NULL, &r); /* never written */
    rn_assert_ok(&r, "reserve");
    hpd_rpc_result_destroy(&r);
    rn_reserve(e, 61, prompt, 40, 4, NULL, &r); /* written, never started */
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_prefill(p, 61, prompt, 40, e, &res, NULL, 0, &r);
    msgpack_sbuffer_destroy(&res);
    rn_assert_ok(&r, "prefill");
    hpd_rpc_result_destroy(&r);
    rn_stream_t *s60 = rn_stream(60), *s61 = rn_stream(61);
    PROGRESS_UNTIL(s60->done && s61->done, cl_check_alive(&rn.cl));
    /* a timer does not fire early (libevent's cached clock: by a
     * millisecond or so): not before its 400 ms */
    if (!(hpd_time_now() - t0 >= 0.39))
        fail_msg("expired %.3f s after the reserve", hpd_time_now() - t0);
    assert_string_equal(s60->error, "reservation expired");
    assert_string_equal(s61->error, "reservation expired");
    assert_int_equal(rn_stat(e, "load.expired"), 2);
    /* job 60's pages and slot stay until its cancel; job 61's went at its
     * expiry, or (on a host so loaded that the 400 ms passed before its
     * notice) when the notice came */
    PROGRESS_UNTIL(rn_stat(e, "load.fenced") == 1 && rn_stat(e, "slots_used") == 1,
                   cl_check_alive(&rn.cl));
    rn_cancel(e, 60, 0);
    assert_int_equal(rn_stat(e, "load.fenced"), 0);
    assert_int_equal(rn_stat(e, "pages_used"), 0);
    assert_int_equal(rn_stat(e, "slots_used"), 0);
    rn_start_job(e, 61, 1, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "start: job 61 is not reserved here (expired, canceled or started)");

    /* fenced, then its writer's transfer ends: its pages go without a cancel */
    rn_reserve(e, 62, prompt, 40, 4, NULL, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_stream_t *s62 = rn_stream(62);
    PROGRESS_UNTIL(s62->done, cl_check_alive(&rn.cl));
    assert_int_equal(rn_stat(e, "load.fenced"), 1);
    rn_prefill(p, 62, prompt, 40, e, &res, NULL, 0, &r);
    rn_assert_ok(&r, "prefill");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(rn_stat(e, "load.fenced") == 0, cl_check_alive(&rn.cl));
    assert_int_equal(rn_stat(e, "pages_used"), 0);
    assert_int_equal(rn_stat(e, "slots_used"), 0);
    msgpack_sbuffer_destroy(&res);

    /* a canceled reservation's expiry timer goes with it: past its 400 ms
     * the node still runs */
    rn_reserve(e, 66, prompt, 40, 4, NULL, &r);
    rn_assert_ok(&r, "reserve");
    hpd_rpc_result_destroy(&r);
    rn_cancel(e, 66, 0);
    usleep(600 * 1000);
    assert_int_equal(rn_stat(e, "pages_used"), 0);
    rn_node_stop(e);
    rn.cl.passed++;
}

/* Transfers a reservation does not allow: one that names no reservation
 * here, one that wrote into another job's pages. */
static void test_foreign_transfers(void **state)
{
    int32_t prompt[40];
    hpd_rpc_result_t r;
    rn_prompt(prompt, 40, 900, VOCAB);
    const uint64_t foreign = rn_stat(d, "load.foreign_writes"),
                   bad = rn_stat(d, "load.bad_transfers");
    /* a transfer that names no reservation here (job 63 into job 64's
     * pages) is refused and counted (the notice is one-way: the prefill
     * node's job ends as sent), and job 64 is not started by it */
    msgpack_sbuffer res64;
    rn_reserve(d, 64, prompt, 40, 4, NULL, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res64);
    hpd_rpc_result_destroy(&r);
    rn_prefill(p, 63, prompt, 40, d, &res64, NULL, 0, &r);
    rn_assert_ok(&r, "prefill");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(rn_stat(d, "load.foreign_writes") == foreign + 1, cl_check_alive(&rn.cl));
    rn_start_job(d, 64, 1, &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    spin(50);
    assert_int_equal(rn_stat(d, "load.running"), 0); /* still waits for its own notice */

    /* job 65's transfer into job 64's pages: it wrote outside its own
     * reservation, so job 65 fails and is counted */
    rn_reserve(d, 65, prompt, 40, 4, NULL, &r);
    rn_assert_ok(&r, "reserve");
    hpd_rpc_result_destroy(&r);
    rn_prefill(p, 65, prompt, 40, d, &res64, NULL, 0, &r);
    rn_assert_ok(&r, "prefill");
    hpd_rpc_result_destroy(&r);
    rn_stream_t *s65 = rn_stream(65);
    PROGRESS_UNTIL(s65->done, cl_check_alive(&rn.cl));
    assert_string_equal(s65->error, "transfer wrote outside its reservation");
    assert_int_equal(rn_stat(d, "load.bad_transfers"), bad + 1);
    msgpack_sbuffer_destroy(&res64);

    rn_cancel(d, 64, 0);
    assert_int_equal(rn_stat(d, "pages_used"), 0);
    rn.cl.passed++;
}

/* A node that cannot start says why and exits as documented: 2 for a
 * model directory it cannot read (a bad option), 1 for a port it cannot
 * listen on. */
static void test_start_failures(void **state)
{
    char port[16], missing[400], want[64];
    snprintf(port, sizeof(port), "%u", d->port);
    snprintf(missing, sizeof(missing), "%s/no-such-model", rn.cl.root);
    const char *const no_model[] = {"--model", missing, NULL};
    cl_proc_t *pr = cl_start_node(&rn.cl, "decode", "d-nomodel", no_model);
    cl_ending(pr);
    cl_expect_end(&rn.cl, pr, 2, 60);
    assert_true(cl_file_has(pr->log, missing));
    const char *const taken[] = {"--port", port, NULL};
    pr = cl_start_node(&rn.cl, "decode", "d-taken", taken);
    cl_ending(pr);
    cl_expect_end(&rn.cl, pr, 1, 60);
    snprintf(want, sizeof(want), "127.0.0.1:%u", d->port);
    assert_true(cl_file_has(pr->log, want));
    rn.cl.passed++;
}

/* SIGTERM drains: the node says so in its heartbeats, finishes the
 * request it runs, keeps a reservation until it is canceled, and exits 0
 * once nothing is left (not at the end of its 60 s drain timeout). */
static void test_drain(void **state)
{
    static const char *const args[] = {"--kv-layout", "16,2,hnd", "--max-context", "512",
                                       "--drain-timeout-ms", "60000", NULL};
    rn_node_t *e = rn_node_start("decode", "d-drain", args);
    int32_t prompt[20];
    hpd_rpc_result_t r;
    msgpack_sbuffer res;
    hpd_msg_prefilled_t pf;
    hpd_proto_err_t err;
    rn_prompt(prompt, 20, 800, VOCAB);
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    rn_reserve(e, 81, prompt, 20, 4, &more, &r); /* never started */
    rn_assert_ok(&r, "reserve");
    hpd_rpc_result_destroy(&r);
    rn_reserve(e, 80, prompt, 20, 480, &more, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_prefill(p, 80, prompt, 20, e, &res, NULL, 0, &r);
    msgpack_sbuffer_destroy(&res);
    rn_assert_ok(&r, "prefill");
    assert_true(hpd_msg_unpack(&hpd_msg_prefilled, &r.result, &pf, &err));
    hpd_rpc_result_destroy(&r);
    rn_start_job(e, 80, pf.first_token, &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    /* at once: the job runs for a while (480 tokens) */
    cl_ending(e->proc);
    assert_int_equal(kill(e->proc->pid, SIGTERM), 0);
    rn_stream_t *s = rn_stream(80);
    /* a node that stopped with the job unfinished closes the connection */
    PROGRESS_UNTIL(s->done || !hpd_rpc_client_is_open(e->cl), (void)0);
    if (!s->done)
        fail_msg("the draining node stopped after %u of 480 tokens", s->n);
    assert_string_equal(s->error, "");
    assert_int_equal(s->n, 480);
    PROGRESS_UNTIL(e->draining, (void)0);
    assert_int_equal(rn_stat(e, "load.reserved"), 1); /* still up: job 81 holds it */
    rn_cancel(e, 81, 0);
    /* well before the drain timeout: it stops when its last job ended */
    cl_expect_end(&rn.cl, e->proc, 0, 30);
    rn_node_forget(e);
    rn.cl.passed++;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_as_one_engine),
        cmocka_unit_test(test_stops_and_replay),
        cmocka_unit_test(test_start_before_the_notice),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_foreign_transfers),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_start_failures),
    };
    rn.cl.cases = sizeof(tests) / sizeof(tests[0]);
    if (getenv("HPD_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("HPD_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
