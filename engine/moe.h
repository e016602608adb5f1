/* The mixture-of-experts router, as transformers' Qwen3NextTopKRouter and
 * Qwen3_5MoeTopKRouter compute it: softmax of the router logits in fp32,
 * the top_k largest probabilities (ties to the lowest expert id), divided
 * by their sum when norm (summed in the order selected, largest first).
 * The engine runs it on the host for each token; a token's routing depends
 * on its own logits alone. */
#ifndef HPD_ENGINE_MOE_H
#define HPD_ENGINE_MOE_H

#include <stdbool.h>
#include <stdint.h>

/* Routes one token: logits[n_experts] -> ids[top_k] in ascending id (the
 * order the engine sums the experts in) and weights[top_k] beside them.
 * n_experts <= HPD_MAX_EXPERTS, top_k <= n_experts. */
void hpd_moe_route(const float *logits, uint32_t n_experts, uint32_t top_k, bool norm,
                   uint32_t *ids, float *weights);

#endif
