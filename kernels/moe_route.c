#include "kernels/moe_route.h"

#include <math.h>
#include <stddef.h>

void hpd_moe_route_token(const float *logits, uint32_t n_experts, uint32_t top_k, bool norm,
                   uint32_t *ids, float *weights)
{
    float p[HPD_MAX_EXPERTS], max = -INFINITY, sum = 0.0f;
    bool taken[HPD_MAX_EXPERTS] = {false};

    for (uint32_t i = 0; i < n_experts; i++)
        max = logits[i] > max ? logits[i] : max;
    for (uint32_t i = 0; i < n_experts; i++) {
        p[i] = expf(logits[i] - max);
        sum += p[i];
    }
    for (uint32_t i = 0; i < n_experts; i++)
        p[i] = p[i] / sum;
    /* selection, largest first; a strict > keeps the lowest id of a tie */
    for (uint32_t j = 0; j < top_k; j++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < n_experts; i++)
            if (!taken[i] && (best == UINT32_MAX || p[i] > p[best]))
                best = i;
        taken[best] = true;
        ids[j] = best;
        weights[j] = p[best];
    }
    if (norm) {
        float s = 0.0f;
        for (uint32_t j = 0; j < top_k; j++)
            s += weights[j];
        for (uint32_t j = 0; j < top_k; j++)
            weights[j] = weights[j] / s;
    }
    /* ascending ids (insertion sort: top_k is small) */
    for (uint32_t j = 1; j < top_k; j++) {
        const uint32_t id = ids[j];
        const float w = weights[j];
        uint32_t i = j;
        for (; i > 0 && ids[i - 1] > id; i--) {
            ids[i] = ids[i - 1];
            weights[i] = weights[i - 1];
        }
        ids[i] = id;
        weights[i] = w;
    }
}

void hpd_moe_number(const uint32_t *ids, uint32_t n_tokens, uint32_t top_k, uint32_t n_experts,
                    uint32_t *slots, uint32_t *idx, uint32_t *first)
{
    for (uint32_t x = 0; x <= n_experts; x++)
        first[x] = 0;
    for (uint64_t i = 0; i < (uint64_t)n_tokens * top_k; i++)
        first[ids[i] + 1]++;
    for (uint32_t x = 0; x < n_experts; x++)
        first[x + 1] += first[x];
    /* first[x] walks expert x's slots, then steps back to its first */
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t j = 0; j < top_k; j++) {
            const uint32_t slot = first[ids[(size_t)t * top_k + j]]++;
            slots[(size_t)t * top_k + j] = slot;
            idx[slot] = t;
        }
    for (uint32_t x = n_experts; x > 0; x--)
        first[x] = first[x - 1];
    first[0] = 0;
}
