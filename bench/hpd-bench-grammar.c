/* Structured outputs' masks against llguidance (bench/grammar.sh): reads
 * what bench/grammar_llg.py wrote (the tokenizer, the cases with their
 * token ids and llguidance's times, llguidance's masks), compiles every
 * schema, computes the mask at every position of every document, compares
 * it bit for bit with llguidance's and prints the times of both.
 *   hpd-bench-grammar DIR [REPEATS] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n == 0 ? 0 : v[(size_t)(p * (double)(n - 1))];
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [REPEATS]\n", argv[0]);
        return 2;
    }
    const int repeats = argc > 2 ? atoi(argv[2]) : 3;
    char path[4096];
    snprintf(path, sizeof(path), "%s/cases.json", argv[1]);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) {
        fprintf(stderr, "%s: %s\n", path, je.text);
        return 1;
    }
    snprintf(path, sizeof(path), "%s/masks.bin", argv[1]);
    FILE *mf = fopen(path, "rb");
    snprintf(path, sizeof(path), "%s/tokenizer.json", argv[1]);
    hpd_tokenizer_t *tok;
    hpd_vocab_t *v;
    if (mf == NULL || hpd_tokenizer_load(path, &tok) != HPD_OK) {
        fprintf(stderr, "%s: cannot read the masks or the tokenizer\n", argv[1]);
        return 1;
    }
    double t0 = now_us();
    if (hpd_vocab_from_tokenizer(tok, &v) != HPD_OK)
        return 1;
    const double vocab_s = (now_us() - t0) / 1e6;
    const uint32_t n_vocab = hpd_vocab_size(v);
    const uint32_t words = (uint32_t)json_integer_value(json_object_get(root, "words"));
    const int32_t eos = (int32_t)json_integer_value(json_object_get(root, "eos"));
    if (words != (n_vocab + 31) / 32) {
        fprintf(stderr, "vocabulary of %u tokens, llguidance's masks have %u words\n", n_vocab, words);
        return 1;
    }
    json_t *cases = json_object_get(root, "cases");
    size_t n_pos = 0, n_cases = json_array_size(cases);
    for (size_t i = 0; i < n_cases; i++)
        n_pos += json_array_size(json_object_get(json_array_get(cases, i), "mask_us"));
    double *ours = calloc(n_pos, sizeof(double)), *theirs = calloc(n_pos, sizeof(double));
    double *c_ours = calloc(n_cases, sizeof(double)), *c_theirs = calloc(n_cases, sizeof(double));
    uint32_t *mask = calloc(words, 4), *want = calloc(words, 4);
    size_t pos = 0, differ = 0, shown = 0;
    double sum_ours = 0, sum_theirs = 0;
    for (size_t i = 0; i < n_cases; i++) {
        json_t *c = json_array_get(cases, i), *ids = json_object_get(c, "ids");
        hpd_grammar_format_t fmt = hpd_grammar_format_default();
        fmt.whitespace_flexible =
            strcmp(json_string_value(json_object_get(c, "format")), "flexible") == 0;
        char *schema = json_dumps(json_object_get(c, "schema"), JSON_ENCODE_ANY);
        hpd_grammar_t *g = NULL;
        double best = 1e30;
        char err[256];
        for (int r = 0; r < repeats; r++) {
            hpd_grammar_destroy(g);
            t0 = now_us();
            if (hpd_grammar_from_schema(schema, strlen(schema), &fmt, &g, err, sizeof(err)) != HPD_OK) {
                fprintf(stderr, "%s: %s\n", schema, err);
                return 1;
            }
            const double us = now_us() - t0;
            best = us < best ? us : best;
        }
        c_ours[i] = best;
        c_theirs[i] = json_real_value(json_object_get(c, "compile_us"));
        /* each position: llguidance's mask compared, ours timed (best of
         * repeats, each on a fresh matcher walked to it) */
        const size_t n = json_array_size(ids) + 1;
        double *best_pos = malloc(n * sizeof(double));
        for (size_t k = 0; k < n; k++)
            best_pos[k] = 1e30;
        for (int r = 0; r < repeats; r++) {
            hpd_matcher_t *m;
            hpd_matcher_create(g, &m);
            for (size_t k = 0; k < n; k++) {
                t0 = now_us();
                hpd_matcher_mask(m, v, &eos, 1, mask);
                const double us = now_us() - t0;
                best_pos[k] = us < best_pos[k] ? us : best_pos[k];
                if (r == 0) {
                    if (fread(want, 4, words, mf) != words) {
                        fprintf(stderr, "masks.bin is short\n");
                        return 1;
                    }
                    if (memcmp(mask, want, words * 4) != 0) {
                        differ++;
                        for (uint32_t w = 0; w < words && shown < 10; w++)
                            if (mask[w] != want[w]) {
                                const uint32_t id = w * 32 + (uint32_t)__builtin_ctz(mask[w] ^ want[w]);
                                char *b;
                                size_t len;
                                hpd_tokenizer_token_bytes(tok, (int32_t)id, &b, &len);
                                printf("differs: %s (%s) %.60s position %zu: token %u '%.*s' %s by us only\n",
                                       schema, json_string_value(json_object_get(c, "format")),
                                       json_string_value(json_object_get(c, "doc")), k, id, (int)len,
                                       b, mask[w] >> (id % 32) & 1 ? "allowed" : "refused");
                                free(b);
                                shown++;
                                break;
                            }
                    }
                }
                if (k + 1 < n) {
                    const int32_t id = (int32_t)json_integer_value(json_array_get(ids, k));
                    if (hpd_matcher_accept_token(m, v, id, &eos, 1) != HPD_OK) {
                        fprintf(stderr, "%s: token %d refused at %zu\n", schema, id, k);
                        return 1;
                    }
                }
            }
            hpd_matcher_destroy(m);
        }
        json_t *lt = json_object_get(c, "mask_us");
        const double slow = getenv("HPD_BENCH_SLOW_US") ? atof(getenv("HPD_BENCH_SLOW_US")) : 0;
        for (size_t k = 0; k < n && slow > 0; k++)
            if (best_pos[k] > slow)
                printf("slow: %.0f us (llguidance %.0f) %s (%s) %.40s position %zu\n", best_pos[k],
                       json_real_value(json_array_get(lt, k)), schema,
                       json_string_value(json_object_get(c, "format")),
                       json_string_value(json_object_get(c, "doc")), k);
        for (size_t k = 0; k < n; k++) {
            ours[pos] = best_pos[k];
            theirs[pos] = json_real_value(json_array_get(lt, k));
            sum_ours += ours[pos];
            sum_theirs += theirs[pos];
            pos++;
        }
        free(best_pos);
        free(schema);
        hpd_grammar_destroy(g);
    }
    printf("vocabulary: %u tokens (%.2f s to index; llguidance's tokenizer %.2f s)\n", n_vocab,
           vocab_s, json_real_value(json_object_get(root, "tokenizer_s")));
    printf("masks: %zu positions of %zu documents, %zu differ from llguidance %s\n", pos, n_cases,
           differ, json_string_value(json_object_get(root, "llguidance")));
    const double mo = sum_ours / (double)pos, mt = sum_theirs / (double)pos;
    printf("mask time per token (us): hybridpd mean %.1f p50 %.1f p99 %.1f max %.1f\n", mo,
           pct(ours, pos, 0.5), pct(ours, pos, 0.99), pct(ours, pos, 1.0));
    printf("                          llguidance mean %.1f p50 %.1f p99 %.1f max %.1f\n", mt,
           pct(theirs, pos, 0.5), pct(theirs, pos, 0.99), pct(theirs, pos, 1.0));
    printf("ratio hybridpd / llguidance, mean mask time: %.2f\n", mo / mt);
    double so = 0, st = 0;
    for (size_t i = 0; i < n_cases; i++) {
        so += c_ours[i];
        st += c_theirs[i];
    }
    printf("compile per schema (us): hybridpd mean %.1f, llguidance mean %.1f (ratio %.2f)\n",
           so / (double)n_cases, st / (double)n_cases, so / st);
    hpd_vocab_destroy(v);
    hpd_tokenizer_destroy(tok);
    json_decref(root);
    fclose(mf);
    return differ == 0 ? 0 : 1;
}
