/* hpd-bench-tokenizer: encode throughput on one thread.
 *
 *   hpd-bench-tokenizer TOKENIZER_JSON TEXT_FILE [REPEATS]
 *
 * Loads the tokenizer, reads the text, encodes it REPEATS times (3) and
 * prints the best MB/s and the number of ids (bench/tokenizer.sh runs
 * Hugging Face tokenizers on the same file beside it). */
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv)
{
    hpd_tokenizer_t *tok;
    char *text;
    size_t len;
    uint64_t reps = 3;
    if (argc < 3 || argc > 4 || (argc == 4 && hpd_parse_u64(argv[3], 1, 1000, &reps) != 0)) {
        fprintf(stderr, "usage: hpd-bench-tokenizer TOKENIZER_JSON TEXT_FILE [REPEATS]\n");
        return 2;
    }
    if (hpd_tokenizer_load(argv[1], &tok) != HPD_OK || hpd_read_file(argv[2], &text, &len) != HPD_OK)
        return 1;
    double best = 1e30;
    size_t n = 0;
    for (uint64_t r = 0; r < reps; r++) {
        int32_t *ids;
        const double t0 = hpd_time_now();
        if (hpd_tokenizer_encode(tok, text, len, &ids, &n) != HPD_OK)
            return 1;
        const double t = hpd_time_now() - t0;
        best = t < best ? t : best;
        free(ids);
    }
    printf("hybridpd: %zu bytes -> %zu ids in %.3f s: %.2f MB/s\n", len, n, best, len / best / 1e6);
    free(text);
    hpd_tokenizer_destroy(tok);
    return 0;
}
