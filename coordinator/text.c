/* Text at the coordinator (coordinator/text.h). */
#include "coordinator/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct hpd_text {
    hpd_tokenizer_t *tok;
    hpd_chat_format_t chat;
    bool have_chat;
    char chat_err[400]; /* why chat is refused when !have_chat */
};

hpd_status_t hpd_text_load(const char *model_dir, hpd_text_t **text_p, char *err,
                           size_t err_len)
{
    hpd_text_t *t = calloc(1, sizeof(*t));
    *text_p = NULL;
    if (t == NULL) {
        snprintf(err, err_len, "out of memory");
        return HPD_ERR_NO_MEMORY;
    }
    const hpd_status_t st = hpd_tokenizer_load(model_dir, &t->tok);
    if (st != HPD_OK) {
        snprintf(err, err_len, "%s: cannot load its tokenizer.json (%s; the log says why)",
                 model_dir, hpd_status_str(st));
        free(t);
        return st;
    }
    t->have_chat =
        hpd_chat_format_load(model_dir, &t->chat, t->chat_err, sizeof(t->chat_err)) == HPD_OK;
    *text_p = t;
    return HPD_OK;
}

void hpd_text_destroy(hpd_text_t *t)
{
    if (t == NULL)
        return;
    hpd_tokenizer_destroy(t->tok);
    free(t);
}

const hpd_tokenizer_t *hpd_text_tokenizer(const hpd_text_t *t)
{
    return t->tok;
}

hpd_status_t hpd_text_chat(const hpd_text_t *t, const hpd_chat_msg_t *msgs, size_t n,
                           int enable_thinking, int32_t **ids_p, size_t *n_p, char *err,
                           size_t err_len)
{
    return hpd_text_chat_tools(t, msgs, n, NULL, enable_thinking, ids_p, n_p, err, err_len);
}

bool hpd_text_tools_xml(const hpd_text_t *t)
{
    return t->have_chat && t->chat.qwen35;
}

hpd_status_t hpd_text_chat_tools(const hpd_text_t *t, const hpd_chat_msg_t *msgs, size_t n,
                                 const char *tools_json, int enable_thinking, int32_t **ids_p,
                                 size_t *n_p, char *err, size_t err_len)
{
    char *prompt;
    size_t len, n_lit = 0;
    hpd_text_range_t *lit = NULL;
    if (!t->have_chat) {
        snprintf(err, err_len, "%s", t->chat_err);
        return HPD_ERR_UNSUPPORTED;
    }
    hpd_status_t st = hpd_chat_render_tools(&t->chat, msgs, n, tools_json, true, enable_thinking,
                                            &prompt, &len, &lit, &n_lit, err, err_len);
    if (st != HPD_OK)
        return st;
    /* the messages' text is text: only the template's markers are special
     * tokens (a user cannot open a turn of their own) */
    st = hpd_tokenizer_encode_literal(t->tok, prompt, len, lit, n_lit, ids_p, n_p);
    free(prompt);
    free(lit);
    if (st != HPD_OK)
        snprintf(err, err_len, "cannot encode the conversation: %s", hpd_status_str(st));
    return st;
}

bool hpd_text_chat_thinks(const hpd_text_t *t)
{
    return t->have_chat && t->chat.think != HPD_CHAT_THINK_NONE;
}

bool hpd_text_chat_opens_think(const hpd_text_t *t, int enable_thinking)
{
    if (!t->have_chat)
        return false;
    return t->chat.think == HPD_CHAT_THINK_ALWAYS ||
           (t->chat.think == HPD_CHAT_THINK_DEFAULT && enable_thinking != 0);
}

/* ------------------------------------------------------------ output */

void hpd_text_out_init(hpd_text_out_t *o, const hpd_tokenizer_t *tok, const char *const *stops,
                       size_t n_stops)
{
    *o = (hpd_text_out_t){.tok = tok, .detok = {.skip_special = true}, .stops = stops,
                          .n_stops = n_stops};
    for (size_t i = 0; i < n_stops && i < HPD_TEXT_MAX_STOPS; i++) {
        o->stop_len[i] = strlen(stops[i]);
        if (o->stop_len[i] > o->max_stop)
            o->max_stop = o->stop_len[i];
    }
    if (o->n_stops > HPD_TEXT_MAX_STOPS)
        o->n_stops = HPD_TEXT_MAX_STOPS;
}

void hpd_text_out_free(hpd_text_out_t *o)
{
    free(o->buf);
    o->buf = NULL;
}

/* The earliest stop string in buf that starts at or after from; *at_p. */
static bool find_stop(const hpd_text_out_t *o, size_t from, size_t *at_p)
{
    for (size_t p = from; p < o->len; p++)
        for (size_t i = 0; i < o->n_stops; i++) {
            const size_t k = o->stop_len[i];
            if (k > 0 && k <= o->len - p && memcmp(o->buf + p, o->stops[i], k) == 0) {
                *at_p = p;
                return true;
            }
        }
    return false;
}

/* Gives out buf[sent, upto). */
static void give(hpd_text_out_t *o, size_t upto, const char **piece_p, size_t *piece_len_p)
{
    *piece_p = o->buf != NULL ? o->buf + o->sent : "";
    *piece_len_p = upto - o->sent;
    o->sent = upto;
}

/* After new text from byte `before` on: a stop string that ends in it, or
 * what can no longer be the start of one. */
static bool settle(hpd_text_out_t *o, size_t before, bool last, const char **piece_p,
                   size_t *piece_len_p)
{
    size_t at;
    const size_t from = before + 1 > o->max_stop ? before + 1 - o->max_stop : 0;
    if (o->n_stops > 0 && find_stop(o, from > o->sent ? from : o->sent, &at)) {
        o->len = at;
        o->stopped = true;
        give(o, at, piece_p, piece_len_p);
        return true;
    }
    /* held back: the longest end of the text that begins a stop string */
    size_t hold = 0;
    for (size_t k = HPD_MIN(o->len - o->sent, o->max_stop - (o->max_stop > 0)); !last && k > 0;
         k--) {
        for (size_t i = 0; i < o->n_stops && hold == 0; i++)
            if (o->stop_len[i] > k && memcmp(o->buf + o->len - k, o->stops[i], k) == 0)
                hold = k;
        if (hold > 0)
            break;
    }
    size_t safe = o->len - hold;
    while (safe > o->sent && safe < o->len && ((unsigned char)o->buf[safe] & 0xC0) == 0x80)
        safe--; /* never half a character */
    give(o, safe, piece_p, piece_len_p);
    return false;
}

bool hpd_text_out_feed(hpd_text_out_t *o, int32_t id, const char **piece_p, size_t *piece_len_p,
                       hpd_status_t *st_p)
{
    *piece_p = "";
    *piece_len_p = 0;
    *st_p = HPD_OK;
    if (o->stopped)
        return true;
    const size_t before = o->len;
    o->n_ids++;
    if ((*st_p = hpd_detok_next(o->tok, &o->detok, id, &o->buf, &o->len, &o->cap)) != HPD_OK)
        return false;
    return settle(o, before, false, piece_p, piece_len_p);
}

void hpd_text_out_finish(hpd_text_out_t *o, const char **piece_p, size_t *piece_len_p)
{
    *piece_p = "";
    *piece_len_p = 0;
    if (o->stopped)
        return;
    const size_t before = o->len;
    if (hpd_detok_finish(&o->detok, &o->buf, &o->len, &o->cap) != HPD_OK)
        o->len = before; /* out of memory: the pending bytes are lost, nothing else */
    settle(o, before, true, piece_p, piece_len_p);
}
