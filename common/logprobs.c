/* Log probabilities of generated tokens (common/logprobs.h). */
#include "common/logprobs.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

void hpd_logprobs_compute(const float *logits, uint32_t vocab, int32_t token, uint32_t top,
                          hpd_token_logprobs_t *out)
{
    float m = -INFINITY;
    for (uint32_t i = 0; i < vocab; i++)
        m = logits[i] > m ? logits[i] : m;
    double sum = 0.0;
    for (uint32_t i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - (double)m);
    const float lse = (float)((double)m + log(sum));
    out->logprob = logits[token] - lse;
    out->n_top = top < vocab ? (top < HPD_MAX_TOP_LOGPROBS ? top : HPD_MAX_TOP_LOGPROBS) : vocab;
    /* the top by insertion: a logit enters only above the last kept (ties
     * keep the lower id, met first) */
    uint32_t n = 0;
    for (uint32_t i = 0; i < vocab && out->n_top > 0; i++) {
        const float l = logits[i];
        if (n == out->n_top && !(l > logits[out->top_ids[n - 1]]))
            continue;
        uint32_t at = n < out->n_top ? n++ : n - 1;
        while (at > 0 && l > logits[out->top_ids[at - 1]]) {
            out->top_ids[at] = out->top_ids[at - 1];
            at--;
        }
        out->top_ids[at] = (int32_t)i;
    }
    for (uint32_t k = 0; k < out->n_top; k++)
        out->top_logprobs[k] = logits[out->top_ids[k]] - lse;
}

size_t hpd_logprobs_wire_bytes(uint32_t n, uint32_t top)
{
    return (size_t)n * (4 + 8 * (size_t)top);
}

uint8_t *hpd_logprobs_wire(const hpd_token_logprobs_t *lp, uint32_t n, uint32_t top,
                           uint32_t *len_p)
{
    uint8_t *wire = lp != NULL && n > 0 ? malloc(hpd_logprobs_wire_bytes(n, top)) : NULL;
    *len_p = 0;
    if (wire != NULL) {
        hpd_logprobs_encode(lp, n, top, wire);
        *len_p = (uint32_t)hpd_logprobs_wire_bytes(n, top);
    }
    return wire;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void putf(uint8_t *p, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    put32(p, v);
}

static float getf(const uint8_t *p)
{
    const uint32_t v = get32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

void hpd_logprobs_encode(const hpd_token_logprobs_t *lp, uint32_t n, uint32_t top, uint8_t *out)
{
    for (uint32_t t = 0; t < n; t++) {
        putf(out, lp[t].logprob);
        out += 4;
        for (uint32_t k = 0; k < top; k++, out += 8) {
            const bool have = k < lp[t].n_top;
            put32(out, have ? (uint32_t)lp[t].top_ids[k] : 0);
            putf(out + 4, have ? lp[t].top_logprobs[k] : -INFINITY);
        }
    }
}

static bool valid_lp(float f)
{
    return !isnan(f) && f <= 0.0f;
}

bool hpd_logprobs_decode(const uint8_t *in, size_t bytes, uint32_t n, uint32_t top,
                         uint32_t vocab, hpd_token_logprobs_t *out, char *why, size_t why_len)
{
    if (top > HPD_MAX_TOP_LOGPROBS || bytes != hpd_logprobs_wire_bytes(n, top)) {
        snprintf(why, why_len, "logprobs: %zu bytes (expected %zu: %u tokens of %u top "
                 "logprobs, at most %d)", bytes, hpd_logprobs_wire_bytes(n, top), n, top,
                 HPD_MAX_TOP_LOGPROBS);
        return false;
    }
    for (uint32_t t = 0; t < n; t++) {
        out[t].logprob = getf(in);
        out[t].n_top = top < vocab ? top : vocab;
        in += 4;
        if (!valid_lp(out[t].logprob)) {
            snprintf(why, why_len, "logprobs: token %u's logprob is %g (expected <= 0)", t,
                     out[t].logprob);
            return false;
        }
        for (uint32_t k = 0; k < top; k++, in += 8) {
            const uint32_t id = get32(in);
            const float f = getf(in + 4);
            if (k >= out[t].n_top)
                continue;
            if (id >= vocab || !valid_lp(f)) {
                snprintf(why, why_len, "logprobs: token %u's top %u is id %u, logprob %g "
                         "(expected an id below %u and a logprob <= 0)", t, k, id, f, vocab);
                return false;
            }
            out[t].top_ids[k] = (int32_t)id;
            out[t].top_logprobs[k] = f;
        }
    }
    return true;
}

void hpd_logprobs_print(FILE *f, const hpd_token_logprobs_t *lp, uint32_t n)
{
    for (uint32_t t = 0; t < n; t++) {
        fprintf(f, t ? " %.9g" : "%.9g", lp[t].logprob);
        for (uint32_t k = 0; k < lp[t].n_top; k++)
            fprintf(f, "%c%d=%.9g", k ? ',' : '|', lp[t].top_ids[k], lp[t].top_logprobs[k]);
    }
    fprintf(f, "\n");
}
