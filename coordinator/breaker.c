#include "coordinator/breaker.h"

#include "common/util.h"

hpd_breaker_state_t hpd_breaker_state(const hpd_breaker_t *b, double now)
{
    if (b->open_until == 0)
        return HPD_BREAKER_CLOSED;
    if (now < b->open_until)
        return HPD_BREAKER_OPEN;
    if (b->probe_since > 0 && now - b->probe_since < HPD_BREAKER_PROBE_S)
        return HPD_BREAKER_PROBING;
    return HPD_BREAKER_HALF_OPEN;
}

bool hpd_breaker_usable(const hpd_breaker_t *b, double now)
{
    const hpd_breaker_state_t s = hpd_breaker_state(b, now);
    return s == HPD_BREAKER_CLOSED || s == HPD_BREAKER_HALF_OPEN;
}

bool hpd_breaker_placed(hpd_breaker_t *b, double now)
{
    if (hpd_breaker_state(b, now) != HPD_BREAKER_HALF_OPEN)
        return false;
    b->probe_since = now;
    return true;
}

void hpd_breaker_probe_ended(hpd_breaker_t *b)
{
    b->probe_since = 0;
}

static void open_for(hpd_breaker_t *b, double seconds, double now)
{
    b->open_until = now + seconds;
    b->probe_since = 0;
    b->openings++;
}

bool hpd_breaker_failure(hpd_breaker_t *b, uint64_t other, uint32_t n_others, double now)
{
    const hpd_breaker_state_t s = hpd_breaker_state(b, now);
    if (b->cooldown == 0)
        b->cooldown = HPD_BREAKER_COOLDOWN_S;
    if (s == HPD_BREAKER_OPEN)
        return false; /* an attempt of before it went out */
    if (s == HPD_BREAKER_PROBING || s == HPD_BREAKER_HALF_OPEN) {
        /* the probe failed: out again, for longer */
        b->cooldown = HPD_MIN(b->cooldown * 2, HPD_BREAKER_MAX_COOLDOWN_S);
        open_for(b, b->cooldown, now);
        return true;
    }
    if (b->failures == 0 || now - b->window_start > HPD_BREAKER_WINDOW_S) {
        b->failures = 0;
        b->n_peers = 0;
        b->window_start = now;
    }
    b->failures++;
    bool known = false;
    for (uint32_t i = 0; i < b->n_peers; i++)
        known |= b->peers[i] == other;
    if (!known && b->n_peers < HPD_BREAKER_PEERS)
        b->peers[b->n_peers++] = other;
    const uint32_t need = HPD_MAX(1u, HPD_MIN(2u, n_others));
    if (b->failures < HPD_BREAKER_FAILURES || b->n_peers < need)
        return false;
    open_for(b, b->cooldown, now);
    return true;
}

bool hpd_breaker_success(hpd_breaker_t *b)
{
    const bool was_out = b->open_until != 0;
    *b = (hpd_breaker_t){.openings = b->openings};
    return was_out;
}
