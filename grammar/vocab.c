/* A tokenizer's vocabulary for the masks: every id's bytes, its special
 * tokens never text. */
#include <stdlib.h>

#include "common/log.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

#define LOG_COMPONENT "grammar"

static hpd_status_t tokenize(void *arg, const uint8_t *bytes, size_t n, int32_t **ids_p,
                             size_t *n_p)
{
    return hpd_tokenizer_encode(arg, (const char *)bytes, n, ids_p, n_p);
}

hpd_status_t hpd_vocab_from_tokenizer(const hpd_tokenizer_t *tok, hpd_vocab_t **v_p)
{
    const uint32_t n = hpd_tokenizer_size(tok);
    uint8_t **bytes = calloc(n + 1, sizeof(*bytes));
    uint32_t *lens = calloc(n + 1, sizeof(*lens));
    bool *special = calloc(n + 1, sizeof(*special)), *marker = calloc(n + 1, sizeof(*marker));
    hpd_status_t st = HPD_ERR_NO_MEMORY;
    if (bytes == NULL || lens == NULL || special == NULL || marker == NULL)
        goto out;
    for (uint32_t i = 0; i < n; i++) {
        char *b;
        size_t len;
        special[i] = hpd_tokenizer_is_special(tok, (int32_t)i);
        marker[i] = hpd_tokenizer_is_marker(tok, (int32_t)i);
        if ((st = hpd_tokenizer_token_bytes(tok, (int32_t)i, &b, &len)) != HPD_OK)
            goto out;
        bytes[i] = (uint8_t *)b;
        lens[i] = (uint32_t)len;
    }
    st = hpd_vocab_create(&(hpd_vocab_params_t){.n_tokens = n,
                                                .bytes = (const uint8_t *const *)bytes,
                                                .lens = lens,
                                                .special = special,
                                                .marker = marker,
                                                .tokenize = tokenize,
                                                .tokenize_arg = (void *)tok},
                          v_p);
out:
    for (uint32_t i = 0; bytes != NULL && i < n; i++)
        free(bytes[i]);
    free(bytes);
    free(lens);
    free(special);
    free(marker);
    return st;
}
