#include "coordinator/choices.h"

#include <stdlib.h>

#include "common/util.h"

hpd_status_t hpd_choices_alloc(hpd_choice_t *ch, uint32_t n, uint32_t max_tokens, bool logprobs,
                               bool out_of_order)
{
    const size_t room = HPD_MAX(max_tokens, 1u);
    for (uint32_t k = 0; k < n; k++)
        if ((ch[k].out = malloc(room * sizeof(int32_t))) == NULL ||
            (logprobs && (ch[k].lp = calloc(room, sizeof(*ch[k].lp))) == NULL) ||
            (out_of_order && (ch[k].early = calloc(room, 1)) == NULL)) {
            hpd_choices_free(ch, n);
            return HPD_ERR_NO_MEMORY;
        }
    return HPD_OK;
}

void hpd_choices_free(hpd_choice_t *ch, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        free(ch[k].out);
        free(ch[k].lp);
        free(ch[k].early);
        ch[k].out = NULL;
        ch[k].lp = NULL;
        ch[k].early = NULL;
    }
}

uint32_t hpd_choice_add(hpd_choice_t *ch, uint32_t max_tokens, uint32_t index,
                        const int32_t *ids, const hpd_token_logprobs_t *lp, uint32_t n,
                        uint32_t *bad_p, int32_t *bad_was_p, int32_t *bad_now_p)
{
    uint32_t bad = 0;
    if (ch->stopped)
        return 0; /* its sink has what it wanted */
    if (index >= max_tokens)
        return 0; /* (and index + i cannot wrap) */
    for (uint32_t i = 0; i < n && index + i < max_tokens; i++) {
        const uint32_t pos = index + i;
        if (pos < ch->n_out || (ch->early != NULL && pos < max_tokens && ch->early[pos])) {
            if (ch->out[pos] != ids[i] && bad++ == 0) {
                *bad_p = pos;
                *bad_was_p = ch->out[pos];
                *bad_now_p = ids[i];
            }
        } else if (pos < max_tokens && (pos == ch->n_out || ch->early != NULL)) {
            if (ch->lp != NULL && lp != NULL)
                ch->lp[pos] = lp[i];
            ch->out[pos] = ids[i];
            if (ch->early != NULL)
                ch->early[pos] = 1;
            else
                ch->n_out++;
        }
    }
    if (ch->early != NULL) /* what came early counts once the gap before it filled */
        while (ch->n_out < max_tokens && ch->early[ch->n_out])
            ch->n_out++;
    return bad;
}

bool hpd_choice_stream(hpd_choice_t *ch, const hpd_coord_sink_t *sink, uint32_t k,
                       uint32_t from)
{
    uint32_t keep = ch->n_out;
    if (sink->tokens == NULL || ch->stopped || from >= ch->n_out ||
        sink->tokens(sink->arg, k, ch->out, ch->lp, from, ch->n_out, &keep))
        return false;
    ch->stopped = true;
    if (keep > from && keep < ch->n_out)
        ch->n_out = keep;
    return true;
}

bool hpd_choices_over(const hpd_choice_t *ch, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (!ch[k].stopped && !ch[k].done)
            return false;
    return true;
}

bool hpd_choices_done(const hpd_choice_t *ch, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (!ch[k].done)
            return false;
    return true;
}

void hpd_choices_result(const hpd_choice_t *ch, uint32_t n, hpd_coord_choice_t *out)
{
    for (uint32_t k = 0; k < n; k++)
        out[k] = (hpd_coord_choice_t){.tokens = ch[k].out,
                                      .logprobs = ch[k].lp,
                                      .n_tokens = ch[k].n_out,
                                      .finish_reason = ch[k].finish_reason};
}
