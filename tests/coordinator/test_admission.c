/* The coordinator's admission (coordinator/admission.h) on cluster states
 * set up by hand:
 * - overloaded (-32005): draining, max_requests open; without a usable
 *   prefill or decode node (a draining one does not count) the request is
 *   taken, to wait for one;
 * - invalid (-32602): a token id (prompt or stop) at the smallest usable
 *   vocabulary, min_tokens above max_tokens, an empty prompt, max_tokens 0, prompt + max_tokens beyond the largest
 *   decode context (a prefill node's context does not count), a negative or
 *   NaN temperature, top_p 0 or above 1; each message names the value;
 * - placeable: a pool too small for the request says how many pages it
 *   needs and the largest pool; none registered, or none with the context,
 *   is left to wait or to admission. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "coordinator/admission.h"
#include "transport/rpc.h"

static const int32_t prompt[] = {1, 2, 99};

static hpd_route_node_t node(bool prefill, uint32_t vocab, uint32_t ctx)
{
    return (hpd_route_node_t){.id = 1,
                              .prefill = prefill,
                              .usable = true,
                              .max_context = ctx,
                              .vocab = vocab,
                              .slots = 4,
                              .pages = 64,
                              .layout = {.block_size = 16, .pack_size = 1, .n_layers = 2}};
}

static int64_t admit(const hpd_route_node_t *v, size_t n, const hpd_admit_state_t *s,
                     hpd_msg_generate_t g, char *err)
{
    return hpd_admit(v, n, s, &g, err, 256);
}

static void test_overloaded(void **state)
{
    char err[256];
    hpd_route_node_t v[3] = {node(true, 100, 4096), node(false, 100, 4096),
                             node(false, 100, 4096)};
    const hpd_msg_generate_t g = {.prompt = prompt, .prompt_n = 3, .max_tokens = 4, .top_p = 1};
    hpd_admit_state_t s = {.max_requests = 2};
    assert_int_equal(admit(v, 3, &s, g, err), 0);
    s.draining = true;
    assert_int_equal(admit(v, 3, &s, g, err), HPD_RPC_ERR_OVERLOADED);
    assert_non_null(strstr(err, "shutting down (draining)"));
    s.draining = false;
    s.open_requests = 2;
    assert_int_equal(admit(v, 3, &s, g, err), HPD_RPC_ERR_OVERLOADED);
    assert_non_null(strstr(err, "2 requests in flight (limit 2)"));
    s.open_requests = 0;
    /* no usable prefill or decode node: taken, to wait in the queue (on
     * 02a8551 refused at once), within max_requests still */
    v[0].usable = false; /* the only prefill node drains */
    assert_int_equal(admit(v, 3, &s, g, err), 0);
    v[0].usable = true;
    v[1].usable = v[2].usable = false;
    assert_int_equal(admit(v, 3, &s, g, err), 0);
    assert_int_equal(admit(v, 0, &s, g, err), 0);
    s.open_requests = 2;
    assert_int_equal(admit(v, 0, &s, g, err), HPD_RPC_ERR_OVERLOADED);
    s.open_requests = 0;
    /* what needs no node is still checked; the vocabulary and the
     * context wait for the nodes */
    hpd_msg_generate_t bad = g;
    bad.max_tokens = 0;
    assert_int_equal(admit(v, 0, &s, bad, err), HPD_RPC_ERR_PARAMS);
    bad = g;
    bad.max_tokens = 1u << 30;
    assert_int_equal(admit(v, 0, &s, bad, err), 0);
}

static void test_invalid(void **state)
{
    char err[256];
    hpd_route_node_t v[4] = {node(true, 100, 1u << 20), node(false, 200, 64),
                             node(false, 100, 32), node(false, 50, 1000)};
    v[3].usable = false; /* its vocabulary and context do not count */
    const hpd_admit_state_t s = {.max_requests = 8};
    hpd_msg_generate_t g = {.prompt = prompt, .prompt_n = 3, .max_tokens = 61, .top_p = 1};
    assert_int_equal(admit(v, 4, &s, g, err), 0); /* 3 + 61 = the largest decode context */
    g.max_tokens = 62;
    assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
    assert_non_null(strstr(err, "must be at most 64"));
    g.max_tokens = 0;
    assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
    g.max_tokens = 4;
    const int32_t at_vocab[] = {1, 100};
    g.prompt = at_vocab;
    g.prompt_n = 2;
    assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
    assert_non_null(strstr(err, "prompt[1] is 100 (expected a token id from 0 to 99)"));
    g.prompt_n = 0;
    assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
    assert_non_null(strstr(err, "prompt is empty"));
    g.prompt = prompt;
    g.prompt_n = 3;
    const float bad_t[] = {-0.5f, NAN}, bad_p[] = {0.0f, 1.5f, NAN};
    for (size_t i = 0; i < 2; i++) {
        g.temperature = bad_t[i];
        assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
        assert_non_null(strstr(err, "temperature"));
    }
    g.temperature = 0.7f;
    for (size_t i = 0; i < 3; i++) {
        g.top_p = bad_p[i];
        assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
        assert_non_null(strstr(err, "top_p"));
    }
    g.top_p = 1;
    assert_int_equal(admit(v, 4, &s, g, err), 0);
    g.stop_token_ids = at_vocab; /* [1, 100]: 100 is not below the vocabulary */
    g.stop_token_ids_n = 2;
    assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
    assert_non_null(strstr(err, "stop_token_ids[1] is 100"));
    g.stop_token_ids_n = 1;
    assert_int_equal(admit(v, 4, &s, g, err), 0);
    g.min_tokens = 5; /* max_tokens 4 */
    assert_int_equal(admit(v, 4, &s, g, err), HPD_RPC_ERR_PARAMS);
    assert_non_null(strstr(err, "min_tokens 5 exceeds max_tokens 4"));
    g.min_tokens = 4;
    assert_int_equal(admit(v, 4, &s, g, err), 0);
}

static void test_placeable(void **state)
{
    uint32_t need, largest;
    hpd_route_req_t rq = {.n_prompt = 100, .max_tokens = 28};
    hpd_route_node_t v[3] = {node(true, 100, 4096), node(false, 100, 4096),
                             node(false, 100, 4096)};
    v[1].pages = 8;  /* 16-token pages, 2 layers: 128 tokens need 16 pages */
    v[2].pages = 12;
    assert_false(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    assert_int_equal(need, 16);
    assert_int_equal(largest, 12);
    v[2].pages = 16;
    assert_true(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    v[2].slots = 0; /* no slot at all: it can never take one */
    assert_false(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    v[2].slots = 4;
    v[2].usable = false; /* draining: not counted */
    assert_false(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    assert_int_equal(largest, 8);
    /* choices: each past the first adds the blocks past the prompt's 6 full
     * ones (2 a group: 4 pages) and a slot */
    v[2].usable = true;
    rq.n_choices = 2;
    assert_int_equal(hpd_route_request_pages(&v[2].layout, &rq), 20);
    assert_false(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    assert_int_equal(need, 20);
    v[2].pages = 20;
    assert_true(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    rq.n_choices = 5; /* more than any node's 4 slots */
    v[2].pages = 100;
    assert_false(hpd_admit_placeable(v, 3, &rq, &need, &largest));
    assert_int_equal(need, 0);
    rq.n_choices = 1;
    v[2].pages = 16;
    v[2].usable = false;
    /* none registered: the request waits for one */
    assert_true(hpd_admit_placeable(v, 1, &rq, &need, &largest));
    /* none with the context: admission refuses those, by context */
    v[1].max_context = 64;
    assert_true(hpd_admit_placeable(v, 3, &rq, &need, &largest));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overloaded),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_placeable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
