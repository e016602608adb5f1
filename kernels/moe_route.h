/* The mixture-of-experts router, as transformers' Qwen3NextTopKRouter and
 * Qwen3_5MoeTopKRouter compute it: softmax of the router logits in fp32,
 * the top_k largest probabilities (ties to the lowest expert id), divided
 * by their sum when norm (summed in the order selected, largest first).
 * A token's routing depends on its own logits alone. The CPU backend's
 * moe_route op runs it for each token; the CUDA backend's runs the same
 * steps on the device (kernels/cuda/moe.cu). */
#ifndef HPD_KERNELS_MOE_ROUTE_H
#define HPD_KERNELS_MOE_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#define HPD_MAX_EXPERTS 1024 /* the routing kernels' bound: a thread per expert */
#define HPD_MAX_TOPK 32      /* experts per token */

/* Routes one token: logits[n_experts] -> ids[top_k] in ascending id (the
 * order the engine sums the experts in) and weights[top_k] beside them.
 * n_experts <= HPD_MAX_EXPERTS, top_k <= n_experts. */
void hpd_moe_route_token(const float *logits, uint32_t n_experts, uint32_t top_k, bool norm,
                   uint32_t *ids, float *weights);

/* Numbers a batch's slots (token, expert) expert by expert, tokens in
 * order, from each token's top_k ids (ascending): first[x] is expert x's
 * first slot (first[n_experts] = n_tokens * top_k), idx[slot] its token,
 * slots[t * top_k + j] the slot of (t, ids[t * top_k + j]). */
void hpd_moe_number(const uint32_t *ids, uint32_t n_tokens, uint32_t top_k, uint32_t n_experts,
                    uint32_t *slots, uint32_t *idx, uint32_t *first);

#endif
