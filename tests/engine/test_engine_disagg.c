/* The disaggregated path inside one process: a prefill engine (prefix cache
 * on, B=64,P=1 NHD) hands each request's KV and GDN state, layer by layer
 * from its layer callback, to a decode engine's reservation in another
 * layout; the decode engine continues from the first token. The tokens must
 * equal a monolithic engine's, with and without replayed tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "engine/engine.h"
#include "tests/engine/fixture.h"

static int setup(void **state)
{
    return engine_fixture_setup("disagg", ENGINE_TEST_SMALL " --arch qwen3_next");
}

static int teardown(void **state) { return engine_fixture_teardown(); }

typedef struct {
    uint32_t len, max_tokens, n_replay;
    hpd_sampling_t s;
} req_t;

static const req_t reqs[] = {
    {5, 20, 0, {0, 1, 0, 0}},     {64, 12, 0, {0.9f, 0.95f, 0, 3}}, {130, 16, 5, {0, 1, 0, 0}},
    {1, 25, 0, {1.2f, 1, 40, 8}}, {200, 8, 3, {0.7f, 0.8f, 10, 9}}, {200, 10, 0, {0, 1, 0, 0}},
    {77, 1, 0, {0, 1, 0, 0}},
};
#define N_REQS (sizeof(reqs) / sizeof(reqs[0]))

static void prompt_of(int32_t *p, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)(hpd_philox4x32(seed, i, 1).v[0] % 512);
    if (seed == 105) /* shares its first 192 tokens with request 4: a prefix hit */
        prompt_of(p, 192, 104);
}

static hpd_engine_t *engine_with(hpd_engine_params_t *ep)
{
    hpd_engine_t *e;
    ep->model = model;
    ep->backend = be;
    assert_int_equal(hpd_engine_create(ep, &e), HPD_OK);
    return e;
}

static void run_monolithic(int32_t out[][32])
{
    int32_t prompt[256];
    uint64_t ids[N_REQS];
    hpd_engine_params_t ep;
    hpd_engine_params_init(&ep);
    hpd_engine_t *e = engine_with(&ep);

    for (size_t i = 0; i < N_REQS; i++) {
        prompt_of(prompt, reqs[i].len, 100 + i);
        hpd_request_params_t rp = {.prompt = prompt,
                                   .n_prompt = reqs[i].len,
                                   .max_tokens = reqs[i].max_tokens,
                                   .sampling = reqs[i].s};
        assert_int_equal(hpd_engine_submit(e, &rp, &ids[i]), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(e), HPD_OK);
    for (size_t i = 0; i < N_REQS; i++) {
        const int32_t *t;
        uint32_t n;
        hpd_engine_result(e, ids[i], &t, &n, NULL);
        assert_int_equal(n, reqs[i].max_tokens);
        memcpy(out[i], t, n * sizeof(int32_t));
    }
    hpd_engine_destroy(e);
}

/* The hand-over done by the layer callback. */
typedef struct {
    hpd_engine_t *pre, *dec;
    uint64_t pre_id[N_REQS], dec_id[N_REQS];
    uint32_t pushed[N_REQS][HPD_ENGINE_MAX_GROUPS]; /* dst pages already copied, per group */
    const hpd_model_config_t *cfg;
    uint32_t callbacks, kv_copies, state_copies;
} handover_t;

static void on_layer(void *arg, uint32_t layer, const hpd_engine_step_item_t *items, uint32_t n)
{
    handover_t *h = arg;
    hpd_engine_memory_t src_mem, dst_mem;
    hpd_engine_memory(h->pre, &src_mem);
    hpd_engine_memory(h->dec, &dst_mem);
    const hpd_kv_layout_t *dl = dst_mem.layout;

    h->callbacks++;
    for (uint32_t i = 0; i < n; i++) {
        size_t r = 0;
        hpd_engine_kv_t skv, dkv;
        while (r < N_REQS && h->pre_id[r] != items[i].id)
            r++;
        if (r == N_REQS || !items[i].prefill)
            continue;
        assert_int_equal(hpd_engine_request_kv(h->pre, h->pre_id[r], &skv), HPD_OK);
        assert_int_equal(hpd_engine_request_kv(h->dec, h->dec_id[r], &dkv), HPD_OK);
        const uint32_t end = items[i].pos + items[i].n_tokens;
        if (h->cfg->layer_full[layer]) {
            const uint32_t a = h->cfg->kind_index[layer], g = a / dl->pack_size;
            if (a % dl->pack_size != dl->pack_size - 1 && a != dl->n_layers - 1)
                continue; /* the destination page is not complete yet */
            /* whole destination pages, or everything at the end of the prompt */
            const uint32_t to = items[i].last_chunk ? end : end / dl->block_size * dl->block_size;
            const uint32_t from = h->pushed[r][g] * dl->block_size;
            if (to <= from)
                continue;
            hpd_kv_translate_args_t t = {
                .src = {.layout = src_mem.layout,
                        .pool = src_mem.kv_pool,
                        .tables = skv.tables,
                        .pos = from},
                .dst = {.layout = dl, .pool = dst_mem.kv_pool, .tables = dkv.tables, .pos = from},
                .n_tokens = to - from,
                .zero_tail = items[i].last_chunk,
                .first_layer = g * dl->pack_size,
                .n_layers = HPD_MIN(dl->pack_size, dl->n_layers - g * dl->pack_size)};
            assert_int_equal(hpd_kv_translate(be, &t), HPD_OK);
            h->pushed[r][g] = to / dl->block_size;
            h->kv_copies++;
        } else if (items[i].last_chunk) {
            const uint64_t off = h->cfg->kind_index[layer] * src_mem.layer_state_bytes;
            hpd_slot_copy_args_t c = {.dst = (uint8_t *)dkv.state + off,
                                      .src = (uint8_t *)skv.state + off,
                                      .bytes = src_mem.layer_state_bytes};
            assert_int_equal(hpd_slot_copy(be, &c), HPD_OK);
            h->state_copies++;
        }
    }
}

/* Every page and slot of the decode engine came back, both engines'
 * books balance; then both go. */
static void handover_end(handover_t *h)
{
    uint32_t used, slots;
    hpd_engine_usage(h->dec, &used, NULL, &slots, NULL);
    assert_int_equal(used, 0);
    assert_int_equal(slots, 0);
    assert_int_equal(hpd_engine_audit(h->dec), 0);
    assert_int_equal(hpd_engine_audit(h->pre), 0);
    hpd_engine_destroy(h->pre);
    hpd_engine_destroy(h->dec);
}

static void run_disaggregated(const char *dst_layout, int32_t ref[][32])
{
    static handover_t h;
    int32_t prompt[256], first[N_REQS];
    hpd_engine_params_t pp, dp;

    memset(&h, 0, sizeof(h));
    h.cfg = &model->config;
    hpd_engine_params_init(&pp);
    pp.prefill_chunk = 128;
    pp.layer_cb = on_layer;
    pp.layer_cb_arg = &h;
    h.pre = engine_with(&pp);
    hpd_engine_params_init(&dp);
    dp.prefix_cache = false;
    assert_int_equal(hpd_kv_layout_parse(dst_layout, &dp.kv_layout), HPD_OK);
    h.dec = engine_with(&dp);

    /* all at once (batched prefill), except request 5 that comes after
     * request 4 has filled the cache */
    for (size_t k = 0; k < N_REQS; k++) {
        const size_t i = k < 5 ? k : (k == N_REQS - 1 ? 5 : k + 1);
        prompt_of(prompt, reqs[i].len, 100 + i);
        hpd_request_params_t dr = {.prompt = prompt,
                                   .n_prompt = reqs[i].len,
                                   .max_tokens = reqs[i].max_tokens,
                                   .sampling = reqs[i].s,
                                   .replay = ref[i],
                                   .n_replay = reqs[i].n_replay};
        hpd_request_params_t pr = {
            .prompt = prompt, .n_prompt = reqs[i].len, .max_tokens = 1, .sampling = reqs[i].s};
        assert_int_equal(hpd_engine_reserve(h.dec, &dr, &h.dec_id[i]), HPD_OK);
        if (i == 5)
            assert_int_equal(hpd_engine_run(h.pre), HPD_OK);
        assert_int_equal(hpd_engine_submit(h.pre, &pr, &h.pre_id[i]), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(h.pre), HPD_OK);
    assert_true(h.kv_copies >= N_REQS);
    assert_int_equal(h.state_copies, N_REQS * model->config.n_linear_layers);
    for (size_t i = 0; i < N_REQS; i++) {
        const int32_t *t;
        uint32_t n;
        hpd_request_state_t st;
        hpd_engine_result(h.pre, h.pre_id[i], &t, &n, &st);
        assert_int_equal(st, HPD_REQ_FINISHED);
        assert_int_equal(n, 1);
        first[i] = t[0];
        assert_int_equal(first[i], ref[i][0]);
        assert_int_equal(hpd_engine_start(h.dec, h.dec_id[i], first[i]), HPD_OK);
    }
    /* the request that shares a prefix was served partly from the cache */
    hpd_request_info_t info;
    assert_int_equal(hpd_engine_request_info(h.pre, h.pre_id[5], &info), HPD_OK);
    assert_int_equal(info.cached_tokens, 192);

    assert_int_equal(hpd_engine_run(h.dec), HPD_OK);
    for (size_t i = 0; i < N_REQS; i++) {
        const int32_t *t;
        uint32_t n;
        hpd_request_state_t st;
        hpd_engine_result(h.dec, h.dec_id[i], &t, &n, &st);
        assert_int_equal(st, HPD_REQ_FINISHED);
        assert_int_equal(n, reqs[i].max_tokens);
        assert_memory_equal(t, ref[i], n * sizeof(int32_t));
        hpd_engine_release(h.dec, h.dec_id[i]);
    }
    handover_end(&h);
}

static void test_handover_across_layouts(void **state)
{
    int32_t ref[N_REQS][32];
    run_monolithic(ref);
    run_disaggregated("16,2,hnd", ref);
    run_disaggregated("16,1,hnd", ref);
    run_disaggregated("128,2,nhd", ref);
}

static void test_reservations(void **state)
{
    int32_t prompt[100];
    hpd_engine_params_t dp;
    uint64_t ids[4], extra;
    uint32_t used, slots;

    hpd_engine_params_init(&dp);
    dp.prefix_cache = false;
    dp.max_batch = 3;
    hpd_engine_t *e = engine_with(&dp);
    prompt_of(prompt, 100, 1);
    hpd_request_params_t rp = {
        .prompt = prompt, .n_prompt = 100, .max_tokens = 10, .sampling = {.top_p = 1}};
    for (int i = 0; i < 3; i++)
        assert_int_equal(hpd_engine_reserve(e, &rp, &ids[i]), HPD_OK);
    /* three slots: the fourth reservation is refused and holds nothing */
    assert_int_equal(hpd_engine_reserve(e, &rp, &extra), HPD_ERR_NO_RESOURCE);
    hpd_engine_usage(e, &used, NULL, &slots, NULL);
    assert_int_equal(slots, 3);
    assert_int_equal(hpd_engine_audit(e), 0);
    /* a bad first token is refused; the reservation stays */
    assert_int_equal(hpd_engine_start(e, ids[0], 512), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_engine_start(e, ids[0], 7), HPD_OK);
    assert_int_equal(hpd_engine_start(e, ids[0], 7), HPD_ERR_NOT_FOUND);
    /* a reservation is freed by cancel */
    assert_int_equal(hpd_engine_cancel(e, ids[1]), HPD_OK);
    assert_int_equal(hpd_engine_reserve(e, &rp, &ids[3]), HPD_OK);
    /* a bad request is refused with nothing held */
    hpd_request_params_t bad = {.prompt = prompt, .n_prompt = 100, .sampling = {.top_p = 1}};
    assert_int_equal(hpd_engine_reserve(e, &bad, &extra), HPD_ERR_INVALID_ARG);
    assert_int_equal(hpd_engine_run(e), HPD_OK); /* runs only the started one */
    const int32_t *t;
    uint32_t n;
    hpd_request_state_t st;
    hpd_engine_result(e, ids[0], &t, &n, &st);
    assert_int_equal(st, HPD_REQ_FINISHED);
    assert_int_equal(n, 10);
    hpd_engine_result(e, ids[2], &t, &n, &st);
    assert_int_equal(st, HPD_REQ_RESERVED);
    hpd_engine_release(e, ids[2]);
    hpd_engine_release(e, ids[3]);
    hpd_engine_usage(e, &used, NULL, &slots, NULL);
    assert_int_equal(used, 0);
    assert_int_equal(slots, 0);
    assert_int_equal(hpd_engine_audit(e), 0);
    hpd_engine_destroy(e);
}

/* n choices handed over: the prefill engine draws the n first tokens from
 * the prompt's logits (its choices, at max_tokens 1, take no pages or
 * slots), the decode engine reserves the choices' own pages and slots at
 * once and forks them at the start; each choice equals the monolithic
 * engine's (choice c: seed + c), whether the prompt ends inside a
 * destination block or on its edge; a reservation of choices the pools
 * cannot hold is refused whole, and cancel frees every choice's pages. */
/* Choice c of request id (of n_ch choices), finished: its tokens. */
static const int32_t *finished_choice(hpd_engine_t *e, uint64_t id, uint32_t n_ch, uint32_t c,
                                      uint32_t *n_p)
{
    const uint64_t *cids;
    const int32_t *t;
    uint32_t nc;
    hpd_request_state_t st;
    assert_int_equal(hpd_engine_choices(e, id, &cids, &nc), HPD_OK);
    assert_int_equal(nc, n_ch);
    assert_int_equal(hpd_engine_result(e, cids[c], &t, n_p, &st), HPD_OK);
    assert_int_equal(st, HPD_REQ_FINISHED);
    return t;
}

static void test_choices_handover(void **state)
{
    static handover_t h;
    static const uint32_t lens[] = {16, 77, 130};
    const uint32_t n_ch = 3, max_tokens = 9;
    int32_t prompt[256], ref[3][HPD_MAX_CHOICES][16];
    uint32_t ref_n[3][HPD_MAX_CHOICES];
    hpd_engine_params_t mp, pp, dp;
    const hpd_sampling_t samp = {0.9f, 0.95f, 0, 11};
    uint32_t used, slots, used0, slots0;

    hpd_engine_params_init(&mp);
    hpd_engine_t *mono = engine_with(&mp);
    for (size_t i = 0; i < 3; i++) {
        prompt_of(prompt, lens[i], 300 + i);
        hpd_request_params_t rp = {.prompt = prompt, .n_prompt = lens[i],
                                   .max_tokens = max_tokens, .sampling = samp, .n = n_ch};
        uint64_t id;
        assert_int_equal(hpd_engine_submit(mono, &rp, &id), HPD_OK);
        assert_int_equal(hpd_engine_run(mono), HPD_OK);
        for (uint32_t c = 0; c < n_ch; c++) {
            const int32_t *t = finished_choice(mono, id, n_ch, c, &ref_n[i][c]);
            memcpy(ref[i][c], t, ref_n[i][c] * sizeof(int32_t));
        }
    }
    hpd_engine_destroy(mono);

    memset(&h, 0, sizeof(h));
    h.cfg = &model->config;
    hpd_engine_params_init(&pp);
    pp.layer_cb = on_layer;
    pp.layer_cb_arg = &h;
    h.pre = engine_with(&pp);
    hpd_engine_params_init(&dp);
    dp.prefix_cache = false;
    assert_int_equal(hpd_kv_layout_parse("16,2,hnd", &dp.kv_layout), HPD_OK);
    h.dec = engine_with(&dp);
    hpd_engine_usage(h.pre, &used0, NULL, &slots0, NULL);
    for (size_t i = 0; i < 3; i++) {
        prompt_of(prompt, lens[i], 300 + i);
        hpd_request_params_t dr = {.prompt = prompt, .n_prompt = lens[i],
                                   .max_tokens = max_tokens, .sampling = samp, .n = n_ch};
        hpd_request_params_t pr = dr;
        pr.max_tokens = 1;
        assert_int_equal(hpd_engine_reserve(h.dec, &dr, &h.dec_id[i]), HPD_OK);
        assert_int_equal(hpd_engine_submit(h.pre, &pr, &h.pre_id[i]), HPD_OK);
    }
    hpd_engine_usage(h.dec, &used, NULL, &slots, NULL);
    assert_int_equal(slots, 3 * n_ch);
    assert_int_equal(hpd_engine_audit(h.dec), 0);
    assert_int_equal(hpd_engine_run(h.pre), HPD_OK);
    hpd_engine_usage(h.pre, &used, NULL, &slots, NULL);
    assert_int_equal(slots, slots0); /* the choices took no slot */
    for (size_t i = 0; i < 3; i++) {
        int32_t first[HPD_MAX_CHOICES];
        for (uint32_t c = 0; c < n_ch; c++) {
            uint32_t n;
            first[c] = finished_choice(h.pre, h.pre_id[i], n_ch, c, &n)[0];
            assert_int_equal(n, 1);
        }
        assert_int_equal(hpd_engine_start_choices(h.dec, h.dec_id[i], first, n_ch - 1),
                         HPD_ERR_INVALID_ARG);
        assert_int_equal(hpd_engine_start_choices(h.dec, h.dec_id[i], first, n_ch), HPD_OK);
    }
    assert_int_equal(hpd_engine_run(h.dec), HPD_OK);
    for (size_t i = 0; i < 3; i++) {
        for (uint32_t c = 0; c < n_ch; c++) {
            uint32_t n;
            const int32_t *t = finished_choice(h.dec, h.dec_id[i], n_ch, c, &n);
            if (n != ref_n[i][c] || memcmp(t, ref[i][c], n * sizeof(int32_t)) != 0)
                fail_msg("prompt %u: choice %u differs from the monolithic engine's", lens[i],
                         c);
        }
        hpd_engine_release(h.dec, h.dec_id[i]);
    }
    handover_end(&h);

    /* four slots: three choices fit once, not twice; refused whole */
    hpd_engine_params_init(&dp);
    dp.prefix_cache = false;
    dp.max_batch = 4;
    hpd_engine_t *e = engine_with(&dp);
    uint64_t a, b;
    prompt_of(prompt, 40, 9);
    hpd_request_params_t rp = {.prompt = prompt, .n_prompt = 40, .max_tokens = 8,
                               .sampling = samp, .n = n_ch};
    assert_int_equal(hpd_engine_reserve(e, &rp, &a), HPD_OK);
    assert_int_equal(hpd_engine_reserve(e, &rp, &b), HPD_ERR_NO_RESOURCE);
    hpd_engine_usage(e, &used, NULL, &slots, NULL);
    assert_int_equal(slots, n_ch);
    assert_int_equal(hpd_engine_audit(e), 0);
    assert_int_equal(hpd_engine_cancel(e, a), HPD_OK); /* its choices with it */
    hpd_engine_usage(e, &used, NULL, &slots, NULL);
    assert_int_equal(used, 0);
    assert_int_equal(slots, 0);
    assert_int_equal(hpd_engine_reserve(e, &rp, &b), HPD_OK);
    assert_int_equal(b, a + n_ch); /* the refused one's ids were given back */
    hpd_engine_release(e, a);
    hpd_engine_release(e, b);
    assert_int_equal(hpd_engine_audit(e), 0);
    hpd_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handover_across_layouts),
        cmocka_unit_test(test_reservations),
        cmocka_unit_test(test_choices_handover),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
