/* hpd-tokenize: a model's tokenizer on the command line.
 *
 *   hpd-tokenize --model DIR encode   text on stdin -> ids, one line, space-separated
 *   hpd-tokenize --model DIR decode   ids on stdin (spaces, commas or newlines) -> text
 *
 * DIR holds tokenizer.json (or give the file). Exit 2 on bad usage or
 * input, 1 when the tokenizer does not load. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tokenizer.h"

static int usage(void)
{
    fprintf(stderr, "usage: hpd-tokenize --model DIR (encode | decode) [--skip-special]\n"
                    "  encode: text on stdin, ids on stdout\n"
                    "  decode: ids on stdin, text on stdout\n");
    return 2;
}

/* All of stdin. */
static char *read_stdin(size_t *len_p)
{
    size_t len = 0, cap = 4096, n;
    char *buf = malloc(cap);
    while (buf != NULL && (n = fread(buf + len, 1, cap - len, stdin)) > 0) {
        len += n;
        if (len == cap) {
            char *p = realloc(buf, cap *= 2);
            if (p == NULL) {
                free(buf);
                return NULL;
            }
            buf = p;
        }
    }
    *len_p = len;
    return buf;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *cmd = NULL;
    bool skip_special = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--skip-special") == 0)
            skip_special = true;
        else if (cmd == NULL && (strcmp(argv[i], "encode") == 0 || strcmp(argv[i], "decode") == 0))
            cmd = argv[i];
        else
            return usage();
    }
    if (model == NULL || cmd == NULL)
        return usage();
    hpd_tokenizer_t *tok;
    if (hpd_tokenizer_load(model, &tok) != HPD_OK)
        return 1;
    size_t len;
    char *in = read_stdin(&len);
    int rc = 0;
    if (in == NULL) {
        hpd_tokenizer_destroy(tok);
        return 1;
    }
    if (strcmp(cmd, "encode") == 0) {
        int32_t *ids;
        size_t n;
        if (hpd_tokenizer_encode(tok, in, len, &ids, &n) != HPD_OK) {
            rc = 1;
        } else {
            for (size_t i = 0; i < n; i++)
                printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
            free(ids);
        }
    } else {
        size_t w = 0; /* any run of separators becomes one comma */
        for (size_t i = 0; i < len; i++) {
            const bool sep = in[i] == ' ' || in[i] == '\n' || in[i] == '\r' || in[i] == '\t' ||
                             in[i] == ',';
            if (!sep)
                in[w++] = in[i];
            else if (w > 0 && in[w - 1] != ',')
                in[w++] = ',';
        }
        len = w;
        size_t a = 0, b = len;
        while (a < b && in[a] == ',')
            a++;
        while (b > a && in[b - 1] == ',')
            b--;
        in[b] = '\0';
        int32_t *ids = NULL;
        size_t n = 0;
        char err[160], *text;
        size_t tl;
        if (b > a && hpd_parse_id_list(in + a, &ids, &n, err, sizeof(err)) != HPD_OK) {
            fprintf(stderr, "hpd-tokenize: decode: %s\n", err);
            rc = 2;
        } else if (hpd_tokenizer_decode(tok, ids, n, skip_special, &text, &tl) != HPD_OK) {
            rc = 2;
        } else {
            fwrite(text, 1, tl, stdout);
            free(text);
        }
        free(ids);
    }
    free(in);
    hpd_tokenizer_destroy(tok);
    return rc;
}
