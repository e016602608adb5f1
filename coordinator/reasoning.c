/* A thinking model's answer split as it streams (coordinator/reasoning.h). */
#define _GNU_SOURCE /* memmem */
#include "coordinator/reasoning.h"

#include <string.h>

static const char open_tag[] = "<think>", close_tag[] = "</think>";

/* The longest end of s[0, n) that begins tag (and is shorter than it). */
static size_t partial_tag(const char *s, size_t n, const char *tag)
{
    const size_t t = strlen(tag);
    for (size_t k = n < t - 1 ? n : t - 1; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0)
            return k;
    return 0;
}

static void out(hpd_reasoning_emit_t emit, void *arg, bool reasoning, const char *s, size_t n)
{
    if (n > 0)
        emit(arg, reasoning, s, n);
}

void hpd_reasoning_init(hpd_reasoning_t *r, bool opened)
{
    memset(r, 0, sizeof(*r));
    r->state = opened ? HPD_REASONING_INSIDE : HPD_REASONING_START;
}

/* Text s[0, n) in the current state: at most one tag is acted on, and the
 * rest is fed again (the held bytes come first, as if they were in s). */
static void step(hpd_reasoning_t *r, const char *s, size_t n, hpd_reasoning_emit_t emit,
                 void *arg)
{
    while (n > 0) {
        if (r->state == HPD_REASONING_CONTENT) {
            out(emit, arg, false, s, n);
            return;
        }
        if (r->state == HPD_REASONING_START) {
            /* does the answer begin with <think>? */
            const size_t t = sizeof(open_tag) - 1;
            while (n > 0 && r->n_hold < t && s[0] == open_tag[r->n_hold]) {
                r->hold[r->n_hold++] = s[0];
                s++, n--;
            }
            if (r->n_hold == t) { /* it does: the tag goes */
                r->n_hold = 0;
                r->state = HPD_REASONING_INSIDE;
            } else if (n > 0) { /* it does not: what was held is content */
                r->state = HPD_REASONING_CONTENT;
                out(emit, arg, false, r->hold, r->n_hold);
                r->n_hold = 0;
            }
            continue;
        }
        /* inside: up to </think> is reasoning, the rest content */
        const char *end = memmem(s, n, close_tag, sizeof(close_tag) - 1);
        if (end != NULL) {
            out(emit, arg, true, s, (size_t)(end - s));
            r->state = HPD_REASONING_CONTENT;
            n -= (size_t)(end - s) + sizeof(close_tag) - 1;
            s = end + sizeof(close_tag) - 1;
            continue;
        }
        const size_t keep = partial_tag(s, n, close_tag);
        out(emit, arg, true, s, n - keep);
        memcpy(r->hold, s + n - keep, keep);
        r->n_hold = keep;
        return;
    }
}

void hpd_reasoning_feed(hpd_reasoning_t *r, const char *text, size_t len,
                        hpd_reasoning_emit_t emit, void *arg)
{
    if (r->state == HPD_REASONING_INSIDE && r->n_hold > 0) {
        /* the held start of </think> and the new text, read as one */
        char joined[64];
        const size_t held = r->n_hold, take = len < sizeof(joined) - held ? len : sizeof(joined) - held;
        memcpy(joined, r->hold, held);
        memcpy(joined + held, text, take);
        r->n_hold = 0;
        /* held + take >= held + 1 bytes: the tag is decided within them
         * (it is at most 8 long and held < 8) unless take is short */
        step(r, joined, held + take, emit, arg);
        if (take < len)
            hpd_reasoning_feed(r, text + take, len - take, emit, arg);
        return;
    }
    step(r, text, len, emit, arg);
}

void hpd_reasoning_finish(hpd_reasoning_t *r, hpd_reasoning_emit_t emit, void *arg)
{
    out(emit, arg, r->state == HPD_REASONING_INSIDE, r->hold, r->n_hold);
    r->n_hold = 0;
}
