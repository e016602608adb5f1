/* Token sampling on the CPU: greedy, or temperature with top-k / top-p, each
 * draw from the counter-based RNG keyed by (seed, position). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/cpu/cpu_ops.h"

typedef struct {
    union {
        float logit;
        uint32_t key; /* while sorted: desc_key(logit) */
    };
    uint32_t id;
} cand_t;

/* The candidates' order: descending logit, ties by ascending id (-0 and
 * +0 equal), a total order, so the result does not depend on the sort
 * algorithm. A stable LSD radix sort of the logits' order-preserving keys,
 * complemented for descending order, four passes of a byte (the ids enter
 * ascending and stay so among equal keys): O(vocab), where qsort took some
 * 20 ms a row at 151936 ids. Each logit is keyed once, in place, and
 * turned back after (-0 comes back +0: the same probability). tmp: room
 * for n candidates. */
static uint32_t desc_key(float f)
{
    uint32_t b;
    f = f + 0.0f; /* -0 -> +0 (NaNs keep their bits) */
    memcpy(&b, &f, sizeof(b));
    return ~((b & 0x80000000u) ? ~b : b | 0x80000000u);
}

static float from_desc_key(uint32_t key)
{
    const uint32_t k = ~key, b = (k & 0x80000000u) ? k & 0x7fffffffu : ~k;
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

static void sort_desc(cand_t *cand, cand_t *tmp, uint32_t n)
{
    uint32_t count[4][256] = {{0}};
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t k = cand[i].key = desc_key(cand[i].logit);
        for (int d = 0; d < 4; d++)
            count[d][(k >> (8 * d)) & 255u]++;
    }
    cand_t *src = cand, *dst = tmp;
    for (int d = 0; d < 4; d++) {
        uint32_t at = 0;
        for (uint32_t b = 0; b < 256; b++) {
            const uint32_t c = count[d][b];
            count[d][b] = at;
            at += c;
        }
        for (uint32_t i = 0; i < n; i++)
            dst[count[d][(src[i].key >> (8 * d)) & 255u]++] = src[i];
        cand_t *t = src;
        src = dst, dst = t;
    }
    /* four passes: the sorted run is back in cand */
    for (uint32_t i = 0; i < n; i++)
        cand[i].logit = from_desc_key(cand[i].key);
}

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

static hpd_status_t sample_row(const float *logits, uint32_t vocab, const hpd_sampling_t *p,
                               uint64_t position, cand_t *cand, cand_t *tmp, int32_t *out)
{
    const float inv_t = 1.0f / p->temperature;
    const float u = hpd_rng_uniform(p->seed, position);
    const bool filter = (p->top_k > 0 && p->top_k < vocab) || p->top_p < 1.0f;
    uint32_t n = vocab;
    float max = -INFINITY, total = 0.0f, target, cum = 0.0f;

    for (uint32_t i = 0; i < vocab; i++) {
        cand[i].logit = logits[i] * inv_t;
        cand[i].id = i;
    }
    if (filter) {
        sort_desc(cand, tmp, vocab);
        if (p->top_k > 0 && p->top_k < n)
            n = p->top_k;
    }
    for (uint32_t i = 0; i < n; i++)
        max = fmaxf(max, cand[i].logit);
    for (uint32_t i = 0; i < n; i++) {
        cand[i].logit = expf(cand[i].logit - max); /* now an unnormalised probability */
        total += cand[i].logit;
    }
    if (p->top_p < 1.0f) {
        /* smallest prefix (in sorted order) whose mass reaches top_p */
        float kept = 0.0f;
        uint32_t keep = 0;
        while (keep < n && (keep == 0 || kept < p->top_p * total))
            kept += cand[keep++].logit;
        n = keep;
        total = kept;
    }
    target = u * total;
    for (uint32_t i = 0; i < n; i++) {
        cum += cand[i].logit;
        if (target < cum) {
            *out = (int32_t)cand[i].id;
            return HPD_OK;
        }
    }
    *out = (int32_t)cand[n - 1].id; /* rounding left u*total at the very end */
    return HPD_OK;
}

hpd_status_t hpd_cpu_sample(hpd_backend_t *b, const hpd_sample_args_t *a)
{
    cand_t *cand = NULL;
    hpd_status_t st = HPD_OK;

    for (uint32_t r = 0; r < a->n_rows && st == HPD_OK; r++) {
        const float *logits = a->logits + (size_t)r * a->ld;
        const hpd_sampling_t *p = &a->params[r];

        if (p->temperature <= 0.0f) {
            a->out[r] = argmax(logits, a->vocab);
            continue;
        }
        if (cand == NULL && (cand = malloc(2 * (size_t)a->vocab * sizeof(*cand))) == NULL)
            return HPD_ERR_NO_MEMORY;
        st = sample_row(logits, a->vocab, p, a->positions[r], cand, cand + a->vocab,
                        &a->out[r]);
    }
    free(cand);
    return st;
}
