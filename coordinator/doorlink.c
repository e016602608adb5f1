/* The scheduler's end of remote front doors (coordinator/door.h): a
 * door's `schedule` becomes a request of the core (hpd_coord_submit with
 * the door's address, which the decode node streams to), owned by the
 * door's connection; the sink forwards what still comes here (the
 * prefill's first tokens, the end) to the door. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coord_internal.h"
#include "node/msg.h"
#include "node/proto.h"

/* One door request's sink. */
typedef struct {
    hpd_coord_t *coord;
    hpd_rpc_conn_t *conn; /* the door's, a reference held until the end */
    uint64_t tag;         /* the door's id */
    uint64_t request;     /* ours */
    uint32_t n_prompt, top_logprobs;
    bool sent_plp;        /* the prompt's logprobs went with the first tokens */
} link_t;

static bool link_tokens(void *arg, uint32_t k, const int32_t *tokens,
                        const hpd_token_logprobs_t *lp, uint32_t from, uint32_t n,
                        uint32_t *keep_p)
{
    link_t *l = arg;
    *keep_p = n;
    hpd_msg_tokens_t m = {.job = l->tag, .index = from, .ids = tokens + from,
                          .ids_n = n - from, .choice = k};
    uint8_t *wire = hpd_logprobs_wire(lp != NULL ? lp + from : NULL, n - from, l->top_logprobs,
                                      &m.logprobs_len);
    m.logprobs = wire;
    /* the prompt's, with the first tokens (once) */
    const hpd_token_logprobs_t *plp =
        l->sent_plp || l->n_prompt < 2 ? NULL : hpd_coord_prompt_logprobs(l->coord, l->request);
    uint8_t *pwire = hpd_logprobs_wire(plp, l->n_prompt - 1, l->top_logprobs,
                                       &m.prompt_logprobs_len);
    m.prompt_logprobs = pwire;
    l->sent_plp |= pwire != NULL;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
    (void)hpd_rpc_notify(l->conn, "tokens", &b);
    hpd_rpc_buf_destroy(&b);
    free(wire);
    free(pwire);
    return true; /* the door stops a choice itself (unschedule) */
}

static void link_done(void *arg, const hpd_coord_result_t *res)
{
    link_t *l = arg;
    hpd_msg_ended_t m = {.tag = l->tag,
                         .outcome = (uint32_t)res->outcome,
                         .code = res->code < 0 ? (uint32_t)-res->code : 0,
                         .prompt_tokens = res->prompt_tokens,
                         .cached_tokens = res->cached_tokens,
                         .attempts = res->attempts,
                         .ttft_ms = res->ttft_ms,
                         .prefill_ms = res->prefill_ms,
                         .push_ms = res->push_ms,
                         .exposed_push_ms = res->exposed_push_ms};
    if (res->error != NULL)
        snprintf(m.error, sizeof(m.error), "%s", res->error);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_ended, &m, &b.pk);
    (void)hpd_rpc_notify(l->conn, "ended", &b);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_conn_unref(l->conn);
    free(l);
}

void hpd_link_schedule(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                       void *arg)
{
    hpd_coord_t *c = arg;
    hpd_msg_schedule_t m = {0};
    hpd_proto_err_t err;
    hpd_sampling_t sampling = hpd_sampling_unset();
    char why[512];
    link_t *l = NULL;

    if (!hpd_msg_unpack(&hpd_msg_schedule, params, &m, &err) ||
        (m.sampling != NULL && !hpd_proto_sampling(m.sampling, &sampling, &err))) {
        hpd_coord_count_invalid(c);
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        goto out;
    }
    if ((l = calloc(1, sizeof(*l))) == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "schedule: out of memory");
        goto out;
    }
    *l = (link_t){.coord = c,
                  .conn = conn,
                  .tag = m.tag,
                  .n_prompt = m.prompt_n,
                  .top_logprobs = m.top_logprobs};
    const hpd_coord_request_t q = {.prompt = m.prompt,
                                   .n_prompt = m.prompt_n,
                                   .max_tokens = m.max_tokens,
                                   .sampling = sampling,
                                   .stop_ids = m.stop_token_ids,
                                   .n_stop = m.stop_token_ids_n,
                                   .min_tokens = m.min_tokens,
                                   .ignore_eos = m.ignore_eos,
                                   .who = m.who[0] != '\0' ? m.who : NULL,
                                   .stream = m.stream,
                                   .owner = conn,
                                   .tag = m.tag,
                                   .logprobs = m.logprobs,
                                   .top_logprobs = m.top_logprobs,
                                   .prompt_logprobs = m.prompt_logprobs,
                                   .grammar = m.grammar,
                                   .grammar_len = m.grammar_len,
                                   .grammar_after_think = m.grammar_after_think,
                                   .n = m.n,
                                   .door = m.door};
    const hpd_coord_sink_t sink = {.tokens = link_tokens, .done = link_done, .arg = l};
    const int64_t code = hpd_coord_submit(c, &q, &sink, &l->request, why, sizeof(why));
    if (code != 0) {
        free(l);
        hpd_rpc_reply_error(conn, id, code, "%s", why);
        goto out;
    }
    hpd_rpc_conn_ref(conn);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_scheduled, &(hpd_msg_scheduled_t){.request = l->request}, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
out:
    hpd_msg_free(&hpd_msg_schedule, &m);
}

void hpd_link_unschedule(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                         void *arg)
{
    hpd_coord_t *c = arg;
    hpd_msg_unschedule_t m = {0};
    hpd_proto_err_t err;
    (void)id;
    if (!hpd_msg_unpack(&hpd_msg_unschedule, params, &m, &err)) {
        HPD_LOG_WARN(LOG_COMPONENT, "bad unschedule from a front door: %s", err.text);
        return;
    }
    if (m.stop)
        hpd_coord_stop_tagged(c, conn, m.tag, m.choice);
    else
        hpd_coord_cancel_tagged(c, conn, m.tag, "its front door canceled it");
}

void hpd_link_limits(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params,
                     void *arg)
{
    hpd_coord_t *c = arg;
    hpd_msg_limits_t m = {.draining = c->draining};
    (void)params;
    hpd_coord_limits(c, &m.vocab, &m.max_context);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_limits, &m, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}
