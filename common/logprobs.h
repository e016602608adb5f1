/* Log probabilities of generated tokens (docs/api.md, "Log probabilities"):
 * the log-softmax of the logits the sampler saw (before temperature, top-k
 * and top-p), in one fixed order so that every node and tool computes the
 * same bits from the same logits: the largest logit m, the sum of
 * exp(l - m) over the vocabulary in order in double, lse = m + log(sum)
 * rounded once to float, and each token's l - lse in float. The top
 * tokens are those of the largest logits, ties to the lower id. */
#ifndef HPD_COMMON_LOGPROBS_H
#define HPD_COMMON_LOGPROBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define HPD_MAX_TOP_LOGPROBS 20

typedef struct {
    float logprob; /* the generated token's */
    uint32_t n_top;
    int32_t top_ids[HPD_MAX_TOP_LOGPROBS];
    float top_logprobs[HPD_MAX_TOP_LOGPROBS];
} hpd_token_logprobs_t;

/* token's log probability and the top (<= HPD_MAX_TOP_LOGPROBS) of the
 * vocab logits. */
void hpd_logprobs_compute(const float *logits, uint32_t vocab, int32_t token, uint32_t top,
                          hpd_token_logprobs_t *out);

/* On the wire (a msgpack bin): per token 4 + 8 * top bytes, little-endian:
 * its logprob (float), then top pairs of (id int32, logprob float). */
size_t hpd_logprobs_wire_bytes(uint32_t n, uint32_t top);
void hpd_logprobs_encode(const hpd_token_logprobs_t *lp, uint32_t n, uint32_t top, uint8_t *out);
/* n tokens' log probabilities in wire form, malloc'd, with their length in
 * *len_p; NULL (len 0) when lp is NULL, n is 0 or out of memory. */
uint8_t *hpd_logprobs_wire(const hpd_token_logprobs_t *lp, uint32_t n, uint32_t top,
                           uint32_t *len_p);
/* false (why names it) when bytes is not n tokens of top, a logprob is NaN
 * or above 0, or an id is outside [0, vocab). */
bool hpd_logprobs_decode(const uint8_t *in, size_t bytes, uint32_t n, uint32_t top,
                         uint32_t vocab, hpd_token_logprobs_t *out, char *why, size_t why_len);

/* One line for n tokens' log probabilities, as hpd-run and hpd-client print
 * them: per token, space-separated, its logprob then, with top ones,
 * "|ID=LP,ID=LP..." (%.9g: the float's exact value reads back). */
void hpd_logprobs_print(FILE *f, const hpd_token_logprobs_t *lp, uint32_t n);

#endif
