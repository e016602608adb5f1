/* The prefill role (prefill_node/prefill.c) alone: a real hpd-prefill
 * pushing into real hpd-decode nodes, with the test as their coordinator
 * (tests/node/roles.h):
 * - a job's pages and GDN state land in a decode node of another layout,
 *   chunk by chunk, the last pack of full-attention layers partial or not,
 *   and the decode node then gives hpd-run's tokens; the reply carries the
 *   first token and, for a prompt seen before, the tokens the prefix cache
 *   gave;
 * - what a job cannot be is refused naming the value: token ids, prompt
 *   lengths, sampling, the destination's layout, its page tables, staging;
 *   a decode node whose UCX info cannot be reached is a pair failure
 *   (HPD_RPC_ERR_PEER), not a client's error;
 * - jobs wait for staging in arrival order; a queued job canceled ends at
 *   once, a job whose transfer is under way ends once its puts landed; the
 *   coordinator's loss fails the jobs that have not started pushing, and
 *   the load in its stats counts each state. */
#include "tests/node/roles.h"

#include "common/kv_layout.h"

#define MODEL_ARGS "--hidden 64 --layers 6 --full-interval 2 --intermediate 96 --vocab 300 " \
                   "--heads 2 --kv-heads 1 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "   \
                   "--lin-k-dim 16 --lin-v-dim 24 --seed 13"
#define VOCAB 300
#define MAX_NEW 8

static rn_node_t *p, *d2, *d3;

static int group_setup(void **state)
{
    /* 3 full-attention layers: in packs of 2 in pages of 48 on d2 (a partial last pack),
     * in one pack of 3 on d3; the prefill node's chunks of 64 tokens are
     * not a multiple of either's pages */
    static const char *const pa[] = {"--kv-layout", "32,1,nhd", "--max-context", "1024",
                                      "--prefill-chunk", "64", NULL};
    static const char *const d2a[] = {"--kv-layout", "48,2,hnd", "--max-context", "1024", NULL};
    static const char *const d3a[] = {"--kv-layout", "32,3,nhd", "--max-context", "1024", NULL};
    if (rn_setup("prefill-role", MODEL_ARGS, 60000) != 0)
        return -1;
    p = rn_node_start("prefill", "p0", pa);
    d2 = rn_node_start("decode", "d2", d2a);
    d3 = rn_node_start("decode", "d3", d3a);
    return 0;
}

static int group_teardown(void **state)
{
    return rn_teardown();
}

static void assert_tokens(const rn_stream_t *s, const int32_t *want, uint32_t n)
{
    if (s->error[0] != '\0')
        fail_msg("job %llu failed: %s", (unsigned long long)s->job, s->error);
    for (uint32_t i = 0; i < HPD_MIN(n, s->n); i++)
        if (s->ids[i] != want[i])
            fail_msg("job %llu token %u: %d, want %d", (unsigned long long)s->job, i, s->ids[i],
                     want[i]);
    assert_int_equal(s->n, n);
}

static void test_pushes_into_other_layouts(void **state)
{
    static const uint32_t lens[] = {1, 47, 97, 300};
    int32_t prompt[300], want[MAX_NEW];
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    const uint64_t done = rn_stat(p, "load.jobs_done");
    uint64_t job = 100;
    for (uint32_t i = 0; i < 4; i++) {
        rn_prompt(prompt, lens[i], 1000 + i, VOCAB);
        rn_reference(prompt, lens[i], MAX_NEW, "--ignore-eos", want);
        rn_node_t *dst[] = {d2, d3};
        for (int k = 0; k < 2; k++) {
            hpd_msg_prefilled_t pf;
            const double t0 = hpd_time_now();
            rn_stream_t *s = rn_generate(p, dst[k], job++, prompt, lens[i], MAX_NEW, &more, &pf);
            /* every time in the reply passed within the whole request */
            const float within = (float)((hpd_time_now() - t0) * 1e3) + 1;
            if (!(pf.queue_ms <= within && pf.prefill_ms <= within && pf.push_ms <= within))
                fail_msg("timings over the request's %g ms: queue %g prefill %g push %g ms",
                         within, pf.queue_ms, pf.prefill_ms, pf.push_ms);
            assert_tokens(s, want, MAX_NEW);
            assert_int_equal(pf.first_token, want[0]);
            if (!(pf.queue_ms >= 0 && pf.prefill_ms >= 0 && pf.push_ms >= 0 &&
                  pf.exposed_push_ms >= 0 && pf.push_ms >= pf.exposed_push_ms))
                fail_msg("timings: queue %g prefill %g push %g exposed %g ms", pf.queue_ms,
                         pf.prefill_ms, pf.push_ms, pf.exposed_push_ms);
            /* the second time, the prompt's whole blocks of 64 come from the cache */
            assert_int_equal(pf.cached_tokens, k == 0 ? 0 : (lens[i] - 1) / 64 * 64);
        }
    }
    assert_int_equal(rn_stat(p, "load.jobs_done"), done + 8);
    assert_int_equal(rn_stat(p, "load.jobs_failed"), 0);
    assert_int_equal(rn_stat(d2, "pages_used"), 0);
    assert_int_equal(rn_stat(d3, "pages_used"), 0);
    rn.cl.passed++;
}

/* Jobs that arrive together run in one batch: each layer's pages go to
 * its own job's destination (the prefill node stopped while both calls
 * arrive, so that one step takes both). */
static void test_jobs_in_one_batch(void **state)
{
    enum { N = 3 };
    static const uint32_t lens[N] = {70, 45, 130};
    int32_t prompt[N][130], want[N][MAX_NEW];
    msgpack_sbuffer res[N];
    rn_reply_t reply[N];
    hpd_rpc_result_t r;
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    rn_node_t *dst[N] = {d2, d3, d2};
    for (int i = 0; i < N; i++) {
        rn_prompt(prompt[i], lens[i], 4000 + (uint64_t)i, VOCAB);
        rn_reference(prompt[i], lens[i], MAX_NEW, "--ignore-eos", want[i]);
        rn_reserve(dst[i], 400 + (uint64_t)i, prompt[i], lens[i], MAX_NEW, &more, &r);
        rn_assert_ok(&r, "reserve");
        rn_repack(&r, &res[i]);
        hpd_rpc_result_destroy(&r);
    }
    cl_pause(p->proc);
    for (int i = 0; i < N; i++)
        rn_prefill_async(p, 400 + (uint64_t)i, prompt[i], lens[i], dst[i], &res[i], &reply[i]);
    spin(20);
    cl_resume(p->proc);
    PROGRESS_UNTIL(reply[0].done && reply[1].done && reply[2].done, cl_check_alive(&rn.cl));
    for (int i = 0; i < N; i++) {
        if (reply[i].is_error)
            fail_msg("job %d: %s", 400 + i, reply[i].message);
        assert_int_equal(reply[i].prefilled.first_token, want[i][0]);
        rn_stream_t *s = rn_stream(400 + (uint64_t)i);
        s->ids[0] = want[i][0];
        s->n = 1;
        rn_start_job(dst[i], 400 + (uint64_t)i, (uint32_t)want[i][0], &r);
        rn_assert_ok(&r, "start");
        hpd_rpc_result_destroy(&r);
        msgpack_sbuffer_destroy(&res[i]);
    }
    for (int i = 0; i < N; i++) {
        rn_stream_t *s = rn_stream(400 + (uint64_t)i);
        PROGRESS_UNTIL(s->done, cl_check_alive(&rn.cl));
        assert_tokens(s, want[i], MAX_NEW);
    }
    rn.cl.passed++;
}

/* A reservation's packed bytes: layout (block, pack), tables (groups lists
 * of n pages each, page ids from 1), slot offset 0, regions 0. */
static void fake_reservation(msgpack_sbuffer *sb, uint32_t block, uint32_t pack, uint32_t groups,
                             uint32_t n)
{
    hpd_rpc_buf_t t;
    hpd_rpc_buf_init(&t);
    msgpack_pack_array(&t.pk, groups);
    for (uint32_t g = 0; g < groups; g++) {
        msgpack_pack_array(&t.pk, n);
        for (uint32_t i = 0; i < n; i++)
            msgpack_pack_uint32(&t.pk, 1 + i);
    }
    const hpd_msg_reservation_t res = {
        .layout = {.block_size = block, .pack_size = pack, .order = HPD_KV_NHD},
        .tables_raw = t.sb.data,
        .tables_raw_len = (uint32_t)t.sb.size};
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_reservation, &res, &b.pk);
    msgpack_sbuffer_init(sb);
    msgpack_sbuffer_write(sb, b.sb.data, b.sb.size);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_buf_destroy(&t);
}

/* prefill of job (n tokens of prompt) to d with a made-up reservation;
 * the reply must be the error code and message given */
static void refused(uint64_t job, const int32_t *prompt, uint32_t n, const rn_node_t *d,
                    const msgpack_sbuffer *res, const void *sampling, uint32_t sampling_len,
                    int64_t code, const char *message)
{
    hpd_rpc_result_t r;
    rn_prefill(p, job, prompt, n, d, res, sampling, sampling_len, &r);
    rn_assert_error(&r, code, message);
}

static void test_refusals(void **state)
{
    int32_t prompt[1100];
    msgpack_sbuffer res, res4, res_short, res1;
    rn_prompt(prompt, 1100, 2000, VOCAB);
    fake_reservation(&res, 16, 2, 2, 64);  /* two pack groups */
    fake_reservation(&res4, 16, 4, 1, 64); /* a pack of 4 of the 3 layers */
    fake_reservation(&res_short, 16, 2, 2, 2);
    fake_reservation(&res1, 16, 2, 1, 64);

    prompt[3] = VOCAB;
    refused(200, prompt, 20, d2, &res, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: prompt[3] is 300 (expected a token id from 0 to 299)");
    prompt[3] = 4;
    prompt[19] = 1000; /* the last one, far above */
    refused(200, prompt, 20, d2, &res, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: prompt[19] is 1000 (expected a token id from 0 to 299)");
    prompt[19] = 4;
    refused(200, prompt, 0, d2, &res, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: prompt has 0 tokens (expected 1 to 1023, this node's max context - 1)");
    refused(200, prompt, 1024, d2, &res, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: prompt has 1024 tokens (expected 1 to 1023, this node's max context - 1)");
    const hpd_sampling_t bad_samp = {.temperature = 1.0f, .top_p = 1.5f};
    hpd_rpc_buf_t sb;
    hpd_rpc_buf_init(&sb);
    hpd_proto_pack_sampling(&sb.pk, &bad_samp);
    hpd_rpc_result_t r;
    rn_prefill(p, 200, prompt, 20, d2, &res, sb.sb.data, (uint32_t)sb.sb.size, &r);
    hpd_rpc_buf_destroy(&sb);
    if (!r.is_error || r.error_code != HPD_RPC_ERR_PARAMS || strstr(r.error_message, "top_p") == NULL)
        fail_msg("a top_p of 1.5: %s", r.is_error ? r.error_message : "taken");
    hpd_rpc_result_destroy(&r);
    refused(200, prompt, 20, d2, &res4, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: decode layout pack size 4 exceeds the 3 full-attention layers");
    refused(200, prompt, 20, d2, &res1, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: reservation: tables must be an array of 2 page lists (one per pack group)");
    /* 33 tokens in pages of 16: 3 pages per group, at exactly 3 taken */
    refused(200, prompt, 33, d2, &res_short, NULL, 0, HPD_RPC_ERR_PARAMS,
            "prefill: reservation: tables[0] must list at least 3 pages");
    /* a decode node this node cannot reach: the pair's failure */
    rn_node_t ghost = *d2;
    msgpack_sbuffer_init(&ghost.xfer);
    hpd_rpc_buf_t junk;
    hpd_rpc_buf_init(&junk);
    msgpack_pack_map(&junk.pk, 1);
    msgpack_pack_str_with_body(&junk.pk, "address", 7);
    msgpack_pack_bin_with_body(&junk.pk, "not an address", 14);
    msgpack_sbuffer_write(&ghost.xfer, junk.sb.data, junk.sb.size);
    hpd_rpc_buf_destroy(&junk);
    ghost.id = 4242;
    rn_prefill(p, 200, prompt, 20, &ghost, &res, NULL, 0, &r);
    if (!r.is_error || r.error_code != HPD_RPC_ERR_PEER)
        fail_msg("junk UCX info: %s (code %lld)", r.is_error ? r.error_message : "taken",
                 (long long)r.error_code);
    hpd_rpc_result_destroy(&r);
    msgpack_sbuffer_destroy(&ghost.xfer);

    hpd_rpc_buf_t nojob;
    hpd_rpc_buf_init(&nojob);
    msgpack_pack_map(&nojob.pk, 0);
    assert_int_equal(hpd_rpc_call_sync(p->cl, "cancel", &nojob, 60000, &r), HPD_OK);
    hpd_rpc_buf_destroy(&nojob);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS, "cancel: field 'job' is missing");
    /* the prefix summary rides on the heartbeats */
    PROGRESS_UNTIL(rn_by_name("p0")->summary_len == 8192, cl_check_alive(&rn.cl));
    /* none of these took staging or became a job */
    assert_int_equal(rn_stat(p, "load.jobs_queued"), 0);
    assert_int_equal(rn_stat(p, "load.jobs_running"), 0);
    msgpack_sbuffer_destroy(&res);
    msgpack_sbuffer_destroy(&res4);
    msgpack_sbuffer_destroy(&res_short);
    msgpack_sbuffer_destroy(&res1);
    rn.cl.passed++;
}

/* Staging: jobs wait for it in order; a queued job canceled ends at once;
 * the coordinator's loss fails the queued ones; a job whose puts are under
 * way ends when they landed, and its tokens are right. */
static void test_staging_queue_cancel_and_loss(void **state)
{
    /* 1 MiB of staging: a job of 700 tokens into 32-token pages of 3
     * layers takes more than half of it */
    static const char *const qa[] = {"--kv-layout", "32,1,nhd", "--max-context", "1024",
                                      "--staging-mb", "1", "--xfer-deadline-ms", "0",
                                      "--metrics-port", "0", "--log-level", "info", NULL};
    rn_node_t *q = rn_node_start("prefill", "p-small", qa);
    const uint16_t metrics = cl_metrics_port(&rn.cl, q->proc);
    int32_t prompt[700], want[MAX_NEW];
    hpd_rpc_result_t r;
    msgpack_sbuffer res[3];
    rn_reply_t reply[3];
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    rn_prompt(prompt, 700, 3000, VOCAB);
    rn_reference(prompt, 700, MAX_NEW, "--ignore-eos", want);
    for (int i = 0; i < 3; i++) {
        rn_reserve(d3, 300 + (uint64_t)i, prompt, 700, MAX_NEW, &more, &r);
        rn_assert_ok(&r, "reserve");
        rn_repack(&r, &res[i]);
        hpd_rpc_result_destroy(&r);
    }
    /* one job's staging: the pages in d3's layout and the GDN states */
    hpd_msg_reservation_t lay = {0};
    msgpack_unpacked u;
    hpd_proto_err_t err;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, res[0].data, res[0].size, NULL),
                     MSGPACK_UNPACK_SUCCESS);
    assert_true(hpd_msg_unpack(&hpd_msg_reservation, &u.data, &lay, &err));
    lay.layout.n_layers = 3;
    lay.layout.n_kv_heads = 1;
    lay.layout.head_dim = 32;
    lay.layout.dtype = d3->layout.dtype;
    const uint64_t kv = HPD_DIV_UP(700, 32) * hpd_kv_layout_page_bytes(&lay.layout);
    msgpack_unpacked_destroy(&u);
    if (!(kv > (1u << 19) && kv < (1u << 20)))
        fail_msg("a job's pages take %llu bytes: not between half and all of 1 MiB",
                 (unsigned long long)kv);

    /* d3 stopped: the first job's puts cannot land, it holds its staging */
    cl_pause(d3->proc);
    rn_prefill_async(q, 300, prompt, 700, d3, &res[0], &reply[0]);
    PROGRESS_UNTIL(rn_stat(q, "load.jobs_finishing") == 1, cl_check_alive(&rn.cl));
    rn_prefill_async(q, 301, prompt, 700, d3, &res[1], &reply[1]);
    rn_prefill_async(q, 302, prompt, 700, d3, &res[2], &reply[2]);
    PROGRESS_UNTIL(rn_stat(q, "load.jobs_queued") == 2, cl_check_alive(&rn.cl));
    rn_prefill(q, 302, prompt, 700, d3, &res[2], NULL, 0, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS, "prefill: job 302 already exists");
    assert_int_equal(rn_stat(q, "load.queued_tokens"), 1400); /* not the finishing one's */
    assert_int_equal(rn_stat(q, "load.jobs_running"), 0);
    assert_false(reply[0].done || reply[1].done || reply[2].done);
    char *text = cl_scrape(metrics);
    assert_true(cl_sample(text, "hpd_jobs{state=\"queued\"}") == 2);
    assert_true(cl_sample(text, "hpd_jobs{state=\"running\"}") == 0);
    assert_true(cl_sample(text, "hpd_jobs{state=\"finishing\"}") == 1);
    free(text);

    /* the second canceled while it waits: it ends now, saying so */
    const uint64_t canceled = rn_stat(q, "load.jobs_canceled");
    rn_cancel(q, 301, 0);
    PROGRESS_UNTIL(reply[1].done, cl_check_alive(&rn.cl));
    assert_true(reply[1].is_error);
    assert_int_equal(reply[1].code, HPD_RPC_ERR_APP);
    assert_string_equal(reply[1].message, "job 301 canceled");
    assert_int_equal(rn_stat(q, "load.jobs_canceled"), canceled + 1);
    rn_cancel(q, 301, 0); /* gone: answered all the same */

    /* the coordinator lost: the queued job fails, the one pushing does not */
    const uint32_t regs = rn_by_name("p-small")->registrations;
    rn_coordinator_stop();
    PROGRESS_UNTIL(reply[2].done, cl_check_alive(&rn.cl));
    assert_true(reply[2].is_error);
    assert_int_equal(reply[2].code, HPD_RPC_ERR_APP);
    if (strncmp(reply[2].message, "the coordinator was lost: ", 26) != 0)
        fail_msg("a queued job at the coordinator's loss: %s", reply[2].message);
    assert_false(reply[0].done);
    /* its /healthz says what it is doing and why it is not there yet */
    static const char lost[] = "registering: prefill node p-small lost the coordinator ";
    int code = 0;
    char *body = NULL;
    for (;;) {
        cl_check_alive(&rn.cl);
        assert_int_equal(hpd_http_get("127.0.0.1", metrics, "/healthz", 10000, &code, &body),
                         HPD_OK);
        if (strstr(body, "; the last: no connection (") != NULL)
            break;
        free(body);
        spin(100);
    }
    assert_int_equal(code, 503);
    if (strncmp(body, lost, strlen(lost)) != 0)
        fail_msg("/healthz: %s", body);
    free(body);
    rn_coordinator_start(60000);
    PROGRESS_UNTIL(rn_by_name("p-small")->registrations > regs, cl_check_alive(&rn.cl));

    /* d3 back: the first job's puts land, and its tokens are right */
    cl_resume(d3->proc);
    PROGRESS_UNTIL(reply[0].done, cl_check_alive(&rn.cl));
    if (reply[0].is_error)
        fail_msg("the first job: %s", reply[0].message);
    assert_int_equal(reply[0].prefilled.first_token, want[0]);
    /* d3 lost the coordinator too: its reservations went with it */
    PROGRESS_UNTIL(rn_by_name("d3")->registrations > 1, cl_check_alive(&rn.cl));
    rn_start_job(d3, 300, (uint32_t)want[0], &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "start: job 300 is not reserved here (expired, canceled or started)");
    assert_int_equal(rn_stat(q, "load.jobs_done"), 1);
    assert_int_equal(rn_stat(q, "load.jobs_failed"), 1);
    text = cl_scrape(metrics);
    assert_true(cl_sample(text, "hpd_jobs_total{outcome=\"ok\"}") == 1);
    assert_true(cl_sample(text, "hpd_jobs_total{outcome=\"failed\"}") == 1);
    assert_true(cl_sample(text, "hpd_jobs_total{outcome=\"canceled\"}") == 1);
    assert_true(cl_sample(text, "hpd_jobs{state=\"finishing\"}") == 0);
    /* the one job served: its queue, compute and push times observed */
    assert_true(cl_sample(text, "hpd_prefill_queue_seconds_count") == 1);
    assert_true(cl_sample(text, "hpd_prefill_seconds_count") == 1);
    assert_true(cl_sample(text, "hpd_xfer_push_seconds_count") == 1);
    assert_true(cl_sample(text, "hpd_xfer_exposed_seconds_count") == 1);
    assert_true(cl_sample(text, "hpd_xfer_transfers_total{outcome=\"ok\"}") == 1);
    free(text);
    for (int i = 0; i < 3; i++)
        msgpack_sbuffer_destroy(&res[i]);
    rn_node_stop(rn_by_name("p-small"));

    /* served again after all this, the same tokens */
    d3 = rn_by_name("d3");
    d2 = rn_by_name("d2");
    p = rn_by_name("p0");
    assert_tokens(rn_generate(p, d3, 310, prompt, 700, MAX_NEW, &more, NULL), want, MAX_NEW);
    rn.cl.passed++;
}

/* A job larger than all the staging is refused, saying both sizes. A
 * decode node lost while a job's puts are under way fails that job as
 * the pair's (HPD_RPC_ERR_PEER), so that it runs again elsewhere, and
 * the jobs queued for it with it; a job queued behind them for another
 * decode node then runs, and is right. */
static void test_staging_limit_and_a_lost_decode_node(void **state)
{
    static const char *const qa[] = {"--kv-layout", "32,1,nhd", "--max-context", "1024",
                                      "--staging-mb", "1", "--xfer-deadline-ms", "0", NULL};
    static const char *const da[] = {"--kv-layout", "32,3,nhd", "--max-context", "1024", NULL};
    rn_node_t *q = rn_node_start("prefill", "p-limit", qa);
    rn_node_t *k = rn_node_start("decode", "d-killed", da);
    int32_t prompt[1023], want[MAX_NEW];
    hpd_rpc_result_t r;
    msgpack_sbuffer res, res_c;
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    rn_prompt(prompt, 1023, 5000, VOCAB);
    /* 2 groups of 64 pages of 16 tokens, 8 KiB each, and the GDN states:
     * just over 1 MiB */
    fake_reservation(&res, 16, 2, 2, 64);
    rn_prefill(q, 500, prompt, 1023, k, &res, NULL, 0, &r);
    rn_assert_error(&r, HPD_RPC_ERR_PARAMS,
                    "prefill: job 500 needs 2 MiB of staging, this node has 1 MiB (--staging-mb)");
    msgpack_sbuffer_destroy(&res);

    /* 700 tokens in d's layout take more than half the staging: one job
     * at a time */
    rn_reference(prompt, 700, MAX_NEW, "--ignore-eos", want);
    rn_reserve(k, 501, prompt, 700, MAX_NEW, NULL, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);
    rn_reserve(d3, 503, prompt, 700, MAX_NEW, &more, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res_c);
    hpd_rpc_result_destroy(&r);
    rn_reply_t reply[3];
    cl_pause(k->proc);
    rn_prefill_async(q, 501, prompt, 700, k, &res, &reply[0]);
    PROGRESS_UNTIL(rn_stat(q, "load.jobs_finishing") == 1, cl_check_alive(&rn.cl));
    rn_prefill_async(q, 502, prompt, 700, k, &res, &reply[1]); /* its pages: never written */
    rn_prefill_async(q, 503, prompt, 700, d3, &res_c, &reply[2]);
    PROGRESS_UNTIL(rn_stat(q, "load.jobs_queued") == 2, cl_check_alive(&rn.cl));
    msgpack_sbuffer_destroy(&res);
    msgpack_sbuffer_destroy(&res_c);
    const uint64_t k_id = k->id;
    rn_node_kill(k);
    PROGRESS_UNTIL(reply[0].done && reply[1].done && reply[2].done, cl_check_alive(&rn.cl));
    for (int i = 0; i < 2; i++)
        if (!reply[i].is_error || reply[i].code != HPD_RPC_ERR_PEER ||
            strstr(reply[i].message, "decode node") == NULL)
            fail_msg("job %d, whose decode node died: %s (code %lld)", 501 + i,
                     reply[i].is_error ? reply[i].message : "served", (long long)reply[i].code);
    char failed[64];
    snprintf(failed, sizeof(failed), "decode node %llu failed: ", (unsigned long long)k_id);
    if (strncmp(reply[1].message, failed, strlen(failed)) != 0)
        fail_msg("the queued job: %s", reply[1].message);
    if (reply[2].is_error)
        fail_msg("the job for another decode node: %s", reply[2].message);
    assert_int_equal(reply[2].prefilled.first_token, want[0]);
    rn_stream_t *s = rn_stream(503);
    s->ids[0] = want[0];
    s->n = 1;
    rn_start_job(d3, 503, (uint32_t)want[0], &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(s->done, cl_check_alive(&rn.cl));
    assert_tokens(s, want, MAX_NEW);
    assert_int_equal(rn_stat(q, "load.jobs_failed"), 2);
    assert_int_equal(rn_stat(q, "load.jobs_done"), 1);
    assert_int_equal(rn_stat(q, "load.jobs_finishing"), 0);
    rn_node_stop(rn_by_name("p-limit"));
    d3 = rn_by_name("d3");
    d2 = rn_by_name("d2");
    p = rn_by_name("p0");
    rn.cl.passed++;
}

/* With liveness pings, a node whose pings the coordinator stopped
 * answering for longer than the liveness lease (it may have been declared
 * lost) starts no job: it would write into decode nodes. Once a ping is
 * answered again, the job runs and its tokens are right. */
static void test_no_job_starts_past_the_liveness_lease(void **state)
{
    static const char *const la[] = {"--kv-layout", "32,1,nhd", "--max-context", "1024",
                                      "--log-level", "info", NULL};
    rn.alive_ms = 50;
    rn.alive_lease_ms = 300;
    rn.answer_alive = true;
    rn_node_t *l = rn_node_start("prefill", "p-live", la);
    rn.alive_ms = 0;
    PROGRESS_UNTIL(rn.last_alive_answer > 0, cl_check_alive(&rn.cl));
    int32_t prompt[90], want[MAX_NEW];
    hpd_rpc_result_t r;
    msgpack_sbuffer res;
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    rn_prompt(prompt, 90, 6000, VOCAB);
    rn_reference(prompt, 90, MAX_NEW, "--ignore-eos", want);
    rn_reserve(d2, 600, prompt, 90, MAX_NEW, &more, &r);
    rn_assert_ok(&r, "reserve");
    rn_repack(&r, &res);
    hpd_rpc_result_destroy(&r);

    /* the node's lease: the send time of the last answered ping (before
     * its answer) plus 300 ms; past that by this clock it has lapsed */
    rn.answer_alive = false;
    const double lapsed = rn.last_alive_answer + 0.3;
    PROGRESS_UNTIL(hpd_time_now() > lapsed + 0.05, cl_check_alive(&rn.cl));
    rn_reply_t reply;
    rn_prefill_async(l, 600, prompt, 90, d2, &res, &reply);
    msgpack_sbuffer_destroy(&res);
    const uint64_t pings = rn.alive_pings;
    PROGRESS_UNTIL(rn.alive_pings > pings + 3, cl_check_alive(&rn.cl));
    assert_false(reply.done);
    assert_int_equal(rn_stat(l, "load.jobs_queued"), 1);
    cl_wait_log(&rn.cl, l->proc, "liveness lease lapsed", 30);

    rn.answer_alive = true;
    PROGRESS_UNTIL(reply.done, cl_check_alive(&rn.cl));
    if (reply.is_error)
        fail_msg("the held job: %s", reply.message);
    assert_int_equal(reply.prefilled.first_token, want[0]);
    rn_stream_t *s = rn_stream(600);
    s->ids[0] = want[0];
    s->n = 1;
    rn_start_job(d2, 600, (uint32_t)want[0], &r);
    rn_assert_ok(&r, "start");
    hpd_rpc_result_destroy(&r);
    PROGRESS_UNTIL(s->done, cl_check_alive(&rn.cl));
    assert_tokens(s, want, MAX_NEW);
    rn_node_stop(l);
    d3 = rn_by_name("d3");
    d2 = rn_by_name("d2");
    p = rn_by_name("p0");
    rn.cl.passed++;
}

/* A model of GDN layers only: no KV pages at all, only the states move
 * (the reservation's tables are an empty list). */
static void test_a_model_without_full_attention(void **state)
{
    char dir[sizeof(rn.cl.model)], saved[sizeof(rn.cl.model)];
    assert_true((size_t)snprintf(dir, sizeof(dir), "%s/gdn-only", rn.cl.root) < sizeof(dir));
    assert_int_equal(test_mkmodel(dir, "--hidden 64 --layers 3 --full-interval 4 "
                                       "--intermediate 96 --vocab 300 --heads 2 --kv-heads 1 "
                                       "--head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "
                                       "--lin-k-dim 16 --lin-v-dim 24 --seed 17"),
                     0);
    static const char *pa[] = {"--model", NULL, NULL};
    pa[1] = dir;
    rn_node_t *gp = rn_node_start("prefill", "p-gdn", pa);
    rn_node_t *gd = rn_node_start("decode", "d-gdn", pa);
    memcpy(saved, rn.cl.model, sizeof(saved));
    memcpy(rn.cl.model, dir, sizeof(dir));
    const hpd_msg_reserve_t more = {.ignore_eos = true};
    int32_t prompt[150], want[MAX_NEW];
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t n = i == 0 ? 9 : 150;
        rn_prompt(prompt, n, 7000 + i, VOCAB);
        rn_reference(prompt, n, MAX_NEW, "--ignore-eos", want);
        assert_tokens(rn_generate(gp, gd, 700 + i, prompt, n, MAX_NEW, &more, NULL), want,
                      MAX_NEW);
    }
    memcpy(rn.cl.model, saved, sizeof(saved));
    assert_int_equal(rn_stat(gd, "pages_used"), 0);
    rn_node_stop(rn_by_name("p-gdn"));
    rn_node_stop(rn_by_name("d-gdn"));
    d3 = rn_by_name("d3");
    d2 = rn_by_name("d2");
    p = rn_by_name("p0");
    rn.cl.passed++;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pushes_into_other_layouts),
        cmocka_unit_test(test_jobs_in_one_batch),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_staging_queue_cancel_and_loss),
        cmocka_unit_test(test_staging_limit_and_a_lost_decode_node),
        cmocka_unit_test(test_no_job_starts_past_the_liveness_lease),
        cmocka_unit_test(test_a_model_without_full_attention),
    };
    rn.cl.cases = sizeof(tests) / sizeof(tests[0]);
    if (getenv("HPD_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("HPD_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
