#include "coordinator/admission.h"

#include <stdio.h>

#include "common/util.h"
#include "transport/rpc.h"

int64_t hpd_admit(const hpd_route_node_t *nodes, size_t n, const hpd_admit_state_t *state,
                  const hpd_msg_generate_t *g, char *err, size_t len)
{
    uint32_t vocab = UINT32_MAX, max_ctx = 0;
    bool have_p = false, have_d = false;
    hpd_proto_err_t e;

    if (state->draining) {
        snprintf(err, len, "generate: the coordinator is shutting down (draining)");
        return HPD_RPC_ERR_OVERLOADED;
    }
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].usable)
            continue;
        vocab = HPD_MIN(vocab, nodes[i].vocab);
        if (!nodes[i].prefill)
            max_ctx = HPD_MAX(max_ctx, nodes[i].max_context);
        have_p |= nodes[i].prefill;
        have_d |= !nodes[i].prefill;
    }
    if (state->open_requests >= state->max_requests) {
        snprintf(err, len, "generate: overloaded: %u requests in flight (limit %u)",
                 state->open_requests, state->max_requests);
        return HPD_RPC_ERR_OVERLOADED;
    }
    /* without a usable prefill or decode node (none registered yet, a
     * restart, all draining or out of rotation) the request waits in the
     * queue, bounded by max_requests and its timeout; what only the nodes
     * can tell (the vocabulary, the context) is checked where it runs */
    if (!have_p || !have_d)
        vocab = UINT32_MAX, max_ctx = UINT32_MAX;
    if (!hpd_msg_ids_below(g->prompt, g->prompt_n, vocab, "prompt", &e) ||
        !hpd_msg_ids_below(g->stop_token_ids, g->stop_token_ids_n, vocab, "stop_token_ids", &e)) {
        snprintf(err, len, "generate: %s", e.text);
        return HPD_RPC_ERR_PARAMS;
    }
    if (g->stop_token_ids_n > HPD_ADMIT_MAX_STOP) {
        snprintf(err, len, "generate: %u stop_token_ids (expected at most %d)",
                 g->stop_token_ids_n, HPD_ADMIT_MAX_STOP);
        return HPD_RPC_ERR_PARAMS;
    }
    if (g->prompt_n == 0) {
        snprintf(err, len, "generate: prompt is empty (expected at least one token id)");
        return HPD_RPC_ERR_PARAMS;
    }
    if (g->max_tokens == 0 || (uint64_t)g->prompt_n + g->max_tokens > max_ctx) {
        snprintf(err, len, "generate: prompt of %u tokens + max_tokens %u must be at most %u "
                 "(the largest decode context) with max_tokens >= 1", g->prompt_n,
                 g->max_tokens, max_ctx);
        return HPD_RPC_ERR_PARAMS;
    }
    if (g->min_tokens > g->max_tokens) {
        snprintf(err, len, "generate: min_tokens %u exceeds max_tokens %u", g->min_tokens,
                 g->max_tokens);
        return HPD_RPC_ERR_PARAMS;
    }
    if (!(g->temperature >= 0) || !(g->top_p > 0 && g->top_p <= 1)) {
        snprintf(err, len, "generate: temperature %g / top_p %g invalid (expected temperature "
                 ">= 0, top_p in (0, 1])", g->temperature, g->top_p);
        return HPD_RPC_ERR_PARAMS;
    }
    return 0;
}

bool hpd_admit_placeable(const hpd_route_node_t *nodes, size_t n, const hpd_route_req_t *req,
                         uint32_t *need_p, uint32_t *largest_p)
{
    const uint32_t tokens = req->n_prompt + req->max_tokens;
    const uint32_t slots = HPD_MAX(1u, req->n_choices);
    bool any = false, context = false;
    *need_p = *largest_p = 0;
    for (size_t i = 0; i < n; i++) {
        const hpd_route_node_t *d = &nodes[i];
        if (!d->usable || d->prefill)
            continue;
        any = true;
        const uint32_t need = hpd_route_request_pages(&d->layout, req);
        context |= d->max_context >= tokens;
        if (d->slots >= slots && d->max_context >= tokens && need <= d->pages)
            return true;
        if (d->max_context >= tokens && d->slots >= slots && d->pages >= *largest_p)
            *need_p = need, *largest_p = d->pages;
    }
    return !any || !context;
}
