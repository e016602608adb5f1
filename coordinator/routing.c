#include "coordinator/routing.h"

#include "common/util.h"

uint32_t hpd_route_pages(const hpd_kv_layout_t *l, uint32_t tokens)
{
    if (l->n_layers == 0)
        return 0;
    return hpd_kv_layout_n_groups(l) * HPD_DIV_UP(tokens, l->block_size);
}

uint32_t hpd_route_request_pages(const hpd_kv_layout_t *l, const hpd_route_req_t *r)
{
    const uint32_t all = hpd_route_pages(l, r->n_prompt + r->max_tokens);
    const uint32_t shared = l->block_size > 0
                                ? hpd_route_pages(l, r->n_prompt / l->block_size * l->block_size)
                                : 0;
    return all + (r->n_choices > 1 ? r->n_choices - 1 : 0) * (all - shared);
}

/* A node's rank among its equals for this request: a mix of the request's
 * start and the node's id, so that equal nodes take turns wherever they
 * stand in the registry. */
static uint64_t tiebreak(const hpd_route_req_t *r, const hpd_route_node_t *x)
{
    uint64_t z = r->start * 0x9e3779b97f4a7c15ull ^ x->id;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int hpd_route_prefill(const hpd_route_node_t *nodes, size_t n, const hpd_route_req_t *r)
{
    int best = -1;
    uint64_t best_cost = UINT64_MAX;
    uint64_t best_tie = 0;
    for (size_t i = 0; i < n; i++) {
        const hpd_route_node_t *p = &nodes[i];
        if (!p->usable || !p->prefill || p->max_context < r->n_prompt + 1)
            continue;
        uint64_t hit = 0;
        if (p->summary != NULL)
            hit = (uint64_t)hpd_prefix_summary_match(p->summary, p->summary_bytes, r->hashes,
                                                      r->n_prompt) * HPD_PREFIX_BLOCK;
        const uint64_t cost = (r->n_prompt - hit) + p->queued_tokens, tie = tiebreak(r, p);
        if (cost < best_cost || (cost == best_cost && tie < best_tie)) {
            best = (int)i;
            best_cost = cost;
            best_tie = tie;
        }
    }
    return best;
}

int hpd_route_decode(const hpd_route_node_t *nodes, size_t n, const hpd_route_req_t *r,
                     uint32_t *pages_p)
{
    int best = -1;
    uint32_t best_free = 0;
    bool others = false;
    for (size_t i = 0; i < n && r->avoid_decode != 0; i++)
        others |= nodes[i].usable && !nodes[i].prefill && nodes[i].id != r->avoid_decode;
    uint64_t best_tie = 0;
    for (size_t i = 0; i < n; i++) {
        const hpd_route_node_t *d = &nodes[i];
        if (!d->usable || d->prefill || d->max_context < r->n_prompt + r->max_tokens ||
            (others && d->id == r->avoid_decode))
            continue;
        const uint32_t need = hpd_route_request_pages(&d->layout, r);
        const uint32_t free_slots = d->slots - d->slots_reserved;
        if (free_slots < HPD_MAX(1u, r->n_choices) || d->pages - d->pages_reserved < need)
            continue;
        const uint64_t tie = tiebreak(r, d);
        if (free_slots > best_free || (free_slots == best_free && tie < best_tie)) {
            best = (int)i;
            best_free = free_slots;
            best_tie = tie;
            *pages_p = need;
        }
    }
    return best;
}
