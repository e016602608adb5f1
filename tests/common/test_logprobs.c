/* Log probabilities (common/logprobs.h): the log-softmax and the top ones
 * (ties to the lower id, no more than the vocabulary), the wire form
 * (bytes as documented, round trip, every malformed input refused with
 * why) and the printed line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/logprobs.h"

static void test_compute(void **state)
{
    (void)state;
    /* ties: ids 1 and 3 share the largest logit, 0 and 4 the next */
    const float logits[6] = {1.0f, 3.0f, -2.0f, 3.0f, 1.0f, -INFINITY};
    hpd_token_logprobs_t lp;
    hpd_logprobs_compute(logits, 6, 2, 4, &lp);
    double z = 0;
    for (int i = 0; i < 5; i++)
        z += exp((double)logits[i]);
    assert_true(fabs(lp.logprob - (-2.0 - log(z))) < 1e-6);
    assert_int_equal(lp.n_top, 4);
    const int32_t want[4] = {1, 3, 0, 4};
    assert_memory_equal(lp.top_ids, want, sizeof(want));
    for (int k = 0; k < 4; k++) {
        assert_true(fabs(lp.top_logprobs[k] - (logits[want[k]] - log(z))) < 1e-6);
        assert_true(k == 0 || lp.top_logprobs[k] <= lp.top_logprobs[k - 1]);
    }
    /* a ruled-out token: minus infinity; more top ones than the vocabulary */
    hpd_logprobs_compute(logits, 6, 5, 20, &lp);
    assert_true(isinf(lp.logprob) && lp.logprob < 0);
    assert_int_equal(lp.n_top, 6);
    assert_int_equal(lp.top_ids[5], 5);
    hpd_logprobs_compute(logits, 6, 0, 0, &lp);
    assert_int_equal(lp.n_top, 0);
    /* over a large vocabulary: the top one is the largest, the sum in order */
    enum { V = 5000 };
    float *big = malloc(V * sizeof(float));
    for (int i = 0; i < V; i++)
        big[i] = (float)((i * 7919) % 1000) / 97.0f;
    hpd_logprobs_compute(big, V, 17, 20, &lp);
    for (int i = 0; i < V; i++)
        assert_true(big[i] <= big[lp.top_ids[0]]);
    for (int k = 1; k < 20; k++)
        assert_true(big[lp.top_ids[k]] < big[lp.top_ids[k - 1]] ||
                    (big[lp.top_ids[k]] == big[lp.top_ids[k - 1]] &&
                     lp.top_ids[k] > lp.top_ids[k - 1]));
    free(big);
}

static void test_wire(void **state)
{
    (void)state;
    hpd_token_logprobs_t in[3] = {{.logprob = -0.5f, .n_top = 2, .top_ids = {7, 9},
                                   .top_logprobs = {-0.25f, -1.5f}},
                                  {.logprob = -INFINITY, .n_top = 2, .top_ids = {1, 2},
                                   .top_logprobs = {-0.75f, -2.0f}},
                                  {.logprob = 0.0f, .n_top = 1, .top_ids = {3},
                                   .top_logprobs = {0.0f}}};
    const size_t bytes = hpd_logprobs_wire_bytes(3, 2);
    assert_int_equal(bytes, 3 * (4 + 16));
    uint8_t wire[60];
    hpd_logprobs_encode(in, 3, 2, wire);
    /* the first token: -0.5f, then (7, -0.25f), little-endian */
    const uint8_t head[12] = {0x00, 0x00, 0x00, 0xbf, 7, 0, 0, 0, 0x00, 0x00, 0x80, 0xbe};
    assert_memory_equal(wire, head, sizeof(head));
    hpd_token_logprobs_t out[3];
    char why[200];
    assert_true(hpd_logprobs_decode(wire, bytes, 3, 2, 100, out, why, sizeof(why)));
    for (int t = 0; t < 3; t++) {
        assert_memory_equal(&out[t].logprob, &in[t].logprob, 4);
        assert_int_equal(out[t].n_top, 2);
        for (uint32_t k = 0; k < in[t].n_top; k++) {
            assert_int_equal(out[t].top_ids[k], in[t].top_ids[k]);
            assert_memory_equal(&out[t].top_logprobs[k], &in[t].top_logprobs[k], 4);
        }
    }
    /* a vocabulary smaller than the top ones: only that many are read */
    assert_true(hpd_logprobs_decode(wire, bytes, 3, 2, 1, out, why, sizeof(why)) == false);
    assert_non_null(strstr(why, "expected an id below 1"));
    /* refused: the length, a positive or NaN logprob, an id past the
     * vocabulary, more than 20 top ones */
    assert_false(hpd_logprobs_decode(wire, bytes - 1, 3, 2, 100, out, why, sizeof(why)));
    assert_non_null(strstr(why, "59 bytes (expected 60"));
    assert_false(hpd_logprobs_decode(wire, bytes, 2, 2, 100, out, why, sizeof(why)));
    uint8_t bad[60];
    memcpy(bad, wire, sizeof(bad));
    bad[3] = 0x3f; /* +0.5f */
    assert_false(hpd_logprobs_decode(bad, bytes, 3, 2, 100, out, why, sizeof(why)));
    assert_non_null(strstr(why, "token 0's logprob is 0.5"));
    memcpy(bad, wire, sizeof(bad));
    bad[0] = 0x01, bad[2] = 0xc0, bad[3] = 0x7f; /* NaN */
    assert_false(hpd_logprobs_decode(bad, bytes, 3, 2, 100, out, why, sizeof(why)));
    memcpy(bad, wire, sizeof(bad));
    bad[4 + 20] = 200; /* token 1's first top id */
    assert_false(hpd_logprobs_decode(bad, bytes, 3, 2, 100, out, why, sizeof(why)));
    assert_non_null(strstr(why, "token 1's top 0 is id 200"));
    memcpy(bad, wire, sizeof(bad));
    bad[4 + 20 + 4 + 3] = 0x40; /* token 1's first top logprob: positive */
    assert_false(hpd_logprobs_decode(bad, bytes, 3, 2, 100, out, why, sizeof(why)));
    assert_false(hpd_logprobs_decode(wire, bytes, 3, 21, 100, out, why, sizeof(why)));
    assert_true(hpd_logprobs_decode(NULL, 0, 0, 5, 100, out, why, sizeof(why)));
    assert_false(hpd_logprobs_decode(NULL, 0, 0, 21, 100, out, why, sizeof(why)));
    /* top ones past the vocabulary (3 of a vocabulary of 1) are not read,
     * whatever they hold */
    const hpd_token_logprobs_t one = {.logprob = -0.1f, .n_top = 1, .top_ids = {0},
                                      .top_logprobs = {-0.1f}};
    uint8_t w1[28];
    hpd_logprobs_encode(&one, 1, 3, w1);
    w1[4 + 16] = 5; /* the third top id: past the vocabulary */
    assert_true(hpd_logprobs_decode(w1, sizeof(w1), 1, 3, 1, out, why, sizeof(why)));
    assert_int_equal(out[0].n_top, 1);
    assert_int_equal(out[0].top_ids[0], 0);
}

static void test_print(void **state)
{
    (void)state;
    const hpd_token_logprobs_t lp[2] = {
        {.logprob = -0.5f, .n_top = 2, .top_ids = {7, 9}, .top_logprobs = {-0.25f, -1.5f}},
        {.logprob = -3.0f}};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    hpd_logprobs_print(f, lp, 2);
    hpd_logprobs_print(f, lp, 0);
    fclose(f);
    assert_string_equal(text, "-0.5|7=-0.25,9=-1.5 -3\n\n");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compute),
        cmocka_unit_test(test_wire),
        cmocka_unit_test(test_print),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
