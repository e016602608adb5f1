/* Text at the coordinator (coordinator/text.h), with Qwen3.5's
 * pre-tokenizer on the committed test tokenizer: the pieces given out as
 * ids come concatenate to the decode of the ids, cut before the first stop
 * string wherever it lies across tokens; text is held back only while it
 * may still begin a stop string; no piece ends inside a character. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/text.h"
#include "tests/test_helpers.h"

static hpd_tokenizer_t *tok;

static int setup(void **state)
{
    return hpd_tokenizer_load(HPD_TOKENIZER_DIR "/qwen3_5.tokenizer.json", &tok) == HPD_OK ? 0
                                                                                          : -1;
}

static int teardown(void **state)
{
    hpd_tokenizer_destroy(tok);
    return 0;
}

static bool utf8_complete(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const unsigned char c = (unsigned char)s[i];
        const size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (k == 0 || i + k > n)
            return false;
        i += k;
    }
    return true;
}

static const char *const *cur_stops;
static size_t cur_n_stops;

/* What o holds back begins a stop string. */
static void check_held(const hpd_text_out_t *o)
{
    const size_t held = o->len - o->sent;
    bool ok = held == 0;
    for (size_t i = 0; i < cur_n_stops && !ok; i++)
        ok = strlen(cur_stops[i]) > held && memcmp(o->buf + o->sent, cur_stops[i], held) == 0;
    if (!ok)
        fail_msg("%zu bytes held back that begin no stop string: '%.*s'", held, (int)held,
                 o->buf + o->sent);
}

typedef struct {
    char out[4096];
    size_t len;
    bool stopped;
    uint32_t n_ids, max_held; /* the most bytes held back after a feed */
} run_t;

/* Feeds text's ids one by one with the stops; what came out. */
static run_t run(const char *text, const char *const *stops, size_t n_stops)
{
    int32_t *ids;
    size_t n;
    hpd_text_out_t o;
    run_t r = {0};
    assert_int_equal(hpd_tokenizer_encode(tok, text, strlen(text), &ids, &n), HPD_OK);
    assert_true(n >= 3);
    hpd_text_out_init(&o, tok, stops, n_stops);
    cur_stops = stops;
    cur_n_stops = n_stops;
    const char *piece;
    size_t len;
    hpd_status_t st;
    for (size_t i = 0; i < n && !r.stopped; i++) {
        r.stopped = hpd_text_out_feed(&o, ids[i], &piece, &len, &st);
        assert_int_equal(st, HPD_OK);
        assert_true(utf8_complete(piece, len));
        memcpy(r.out + r.len, piece, len);
        r.len += len;
        if (!r.stopped)
            check_held(&o);
        if (o.len - o.sent > r.max_held)
            r.max_held = (uint32_t)(o.len - o.sent);
    }
    if (!r.stopped) {
        hpd_text_out_finish(&o, &piece, &len);
        memcpy(r.out + r.len, piece, len);
        r.len += len;
    }
    r.n_ids = o.n_ids;
    r.out[r.len] = '\0';
    hpd_text_out_free(&o);
    free(ids);
    return r;
}

static const char text[] = "Grüße aus München! The quick brown fox jumps over the lazy dog. "
                           "你好，世界 👩‍👩‍👧 done.";

static void test_no_stops(void **state)
{
    const run_t r = run(text, NULL, 0);
    assert_string_equal(r.out, text);
    assert_false(r.stopped);
    assert_int_equal(r.max_held, 0); /* nothing held back without stops */
}

static void test_stop_across_tokens(void **state)
{
    /* "ck brown f" spans several tokens ("quick", " brown", " fox") */
    const char *const stops[] = {"never there", "ck brown f"};
    const run_t r = run(text, stops, 2);
    assert_true(r.stopped);
    const size_t at = (size_t)(strstr(text, "ck brown f") - text);
    assert_int_equal(r.len, at);
    assert_memory_equal(r.out, text, at);
    assert_true(r.max_held > 0 && r.max_held < strlen("ck brown f"));
    /* the ids up to the one that completed it ("f" of " fox") */
    int32_t *ids;
    size_t n;
    assert_int_equal(hpd_tokenizer_encode(tok, text, at + 10, &ids, &n), HPD_OK);
    assert_int_equal(r.n_ids, n);
    free(ids);
}

/* the earliest match wins, whichever stop it is; a stop inside a character
 * sequence and one at the very start */
static void test_earliest_and_edges(void **state)
{
    const char *const stops[] = {"lazy", "brown", "München"};
    run_t r = run(text, stops, 3);
    assert_true(r.stopped);
    assert_string_equal(r.out, "Grüße aus ");
    const char *const first[] = {"Grü"};
    r = run(text, first, 1);
    assert_true(r.stopped);
    assert_int_equal(r.len, 0);
    const char *const cjk[] = {"世界"};
    r = run(text, cjk, 1);
    assert_true(r.stopped);
    assert_int_equal(r.len, (size_t)(strstr(text, "世界") - text));
    /* a stop that is a prefix of the text's end but never completes */
    const char *const tail[] = {"done.!"};
    r = run(text, tail, 1);
    assert_false(r.stopped);
    assert_string_equal(r.out, text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_stops),
        cmocka_unit_test(test_stop_across_tokens),
        cmocka_unit_test(test_earliest_and_edges),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
