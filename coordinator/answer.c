/* One answer's text through its stages (coordinator/answer.h). */
#include "coordinator/answer.h"

#include <string.h>

static void tc_content(void *arg, const char *text, size_t len)
{
    const hpd_answer_t *a = arg;
    if (len > 0)
        a->p.ops->content(a->p.arg, text, len);
}

static void tc_call(void *arg, uint32_t index, const char *name, const char *arguments)
{
    const hpd_answer_t *a = arg;
    a->p.ops->call(a->p.arg, index, name, arguments);
}

/* A piece of the split: content goes through the tool-call parser when
 * the chat has tools; reasoning does not. */
static void split_piece(void *arg, bool reasoning, const char *piece, size_t len)
{
    hpd_answer_t *a = arg;
    if (len == 0)
        return;
    if (reasoning)
        a->p.ops->reasoning(a->p.arg, piece, len);
    else if (a->p.parse_calls)
        hpd_toolcall_feed(&a->tc, piece, len, tc_content, tc_call, a);
    else
        a->p.ops->content(a->p.arg, piece, len);
}

static void text_piece(hpd_answer_t *a, const char *piece, size_t len)
{
    if (len == 0)
        return;
    if (a->p.split)
        hpd_reasoning_feed(&a->rs, piece, len, split_piece, a);
    else
        split_piece(a, false, piece, len);
}

void hpd_answer_init(hpd_answer_t *a, const hpd_answer_params_t *params)
{
    memset(a, 0, sizeof(*a));
    a->p = *params;
    hpd_text_out_init(&a->out, hpd_text_tokenizer(params->text), params->stops, params->n_stops);
    hpd_reasoning_init(&a->rs, params->opens_think);
    if (params->parse_calls)
        hpd_toolcall_init(&a->tc, params->format, params->tools);
}

void hpd_answer_free(hpd_answer_t *a)
{
    hpd_text_out_free(&a->out);
    if (a->p.parse_calls)
        hpd_toolcall_free(&a->tc);
}

bool hpd_answer_feed(hpd_answer_t *a, int32_t id, hpd_status_t *st_p)
{
    const char *piece;
    size_t len;
    const bool stop = hpd_text_out_feed(&a->out, id, &piece, &len, st_p);
    if (*st_p != HPD_OK)
        return stop;
    text_piece(a, piece, len);
    return stop;
}

void hpd_answer_finish(hpd_answer_t *a)
{
    const char *piece;
    size_t len;
    hpd_text_out_finish(&a->out, &piece, &len);
    text_piece(a, piece, len);
    if (a->p.split)
        hpd_reasoning_finish(&a->rs, split_piece, a);
    if (a->p.parse_calls)
        hpd_toolcall_finish(&a->tc, tc_content, tc_call, a);
}
