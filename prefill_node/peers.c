#include "prefill_node/peers.h"

#include <stdlib.h>

#include "common/util.h"

void hpd_peers_init(hpd_peers_t *t, const hpd_peers_ops_t *ops)
{
    *t = (hpd_peers_t){.ops = *ops};
}

void hpd_peers_destroy(hpd_peers_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        t->ops.disconnect(t->ops.arg, t->ents[i].peer);
    free(t->ents);
    t->ents = NULL;
    t->n = t->cap = 0;
}

static void drop(hpd_peers_t *t, size_t i)
{
    t->ops.disconnect(t->ops.arg, t->ents[i].peer);
    t->ents[i] = t->ents[--t->n];
}

hpd_status_t hpd_peers_get(hpd_peers_t *t, uint64_t node, const void *info, void **peer_p)
{
    void *peer;
    hpd_status_t st;
    for (size_t i = 0; i < t->n; i++) {
        if (t->ents[i].node != node || t->ents[i].retired)
            continue;
        if (!t->ops.failed(t->ops.arg, t->ents[i].peer)) {
            *peer_p = t->ents[i].peer;
            return HPD_OK;
        }
        /* a failed endpoint to a node we are asked to use again */
        if (t->ops.used(t->ops.arg, t->ents[i].peer))
            t->ents[i].retired = true;
        else
            drop(t, i);
        break;
    }
    if ((st = hpd_grow(&t->ents, &t->cap, t->n + 1, sizeof(*t->ents))) != HPD_OK)
        return st;
    if ((st = t->ops.connect(t->ops.arg, info, &peer)) != HPD_OK)
        return st;
    t->ents[t->n++] = (hpd_peer_ent_t){.node = node, .peer = peer};
    *peer_p = peer;
    return HPD_OK;
}

void hpd_peers_drop_unused(hpd_peers_t *t, bool all)
{
    for (size_t i = 0; i < t->n;) {
        if ((all || t->ents[i].retired) && !t->ops.used(t->ops.arg, t->ents[i].peer))
            drop(t, i);
        else
            i++;
    }
}

bool hpd_peers_any_retired(const hpd_peers_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->ents[i].retired)
            return true;
    return false;
}
