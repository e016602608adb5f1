/* hpd-prefill: runs prompts for the coordinator and pushes each request's
 * KV pages and GDN state into a decode node's reservation, layer by layer
 * as the forward pass produces them, translated into the decode node's
 * layout (docs/cluster.md).
 *
 * A job: the coordinator's `prefill` call. It waits for staging memory
 * (queued), runs in the engine with max_tokens 1 (running: pushes from the
 * layer callback), then the transfer is flushed and its completion notice
 * sent (finishing). The call is answered with the first token once the
 * notice is on the wire, or with an error; the job is freed then.
 * Who frees what: a job holds a reference on the coordinator's connection
 * until it answered; its staging extent is freed when its transfer ended. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "node/kv_push.h"
#include "node/msg.h"
#include "node/node.h"
#include "prefill_node/prefill.h"
#include "prefill_node/peers.h"
#include "prefill_node/staging.h"
#include "node/proto.h"
#include "node/tp_plan.h"

#define LOG_COMPONENT "prefill"

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_FINISHING } job_state_t;

typedef struct job {
    struct prefill *owner;
    uint64_t id; /* the coordinator's job id, also the transfer id */
    uint64_t request; /* the coordinator's request id, for logs */
    uint64_t eng_id;
    job_state_t state;
    hpd_rpc_conn_t *conn;
    uint32_t call_id;
    int32_t *prompt;
    uint32_t n_prompt;
    hpd_sampling_t sampling;
    bool logprobs;         /* the first tokens' log probabilities, with top_logprobs */
    uint32_t top_logprobs;
    uint32_t n_choices;    /* first tokens drawn from the prompt's logits (seed + c) */
    hpd_token_logprobs_t first_lp[HPD_MAX_CHOICES];
    bool prompt_logprobs;  /* the prompt's too (n_prompt - 1 of them) */
    hpd_grammar_t *grammar; /* a structured output (NULL: none) */
    uint8_t *prompt_lp;    /* in wire form (malloc'd) */
    uint32_t prompt_lp_len;
    /* destination */
    uint64_t dst_node;
    hpd_xfer_peer_t *peer;
    hpd_kv_layout_t dst_layout;
    uint32_t *dst_pages; /* [groups][dst_blocks] */
    const uint32_t *dst_tables[HPD_ENGINE_MAX_GROUPS];
    uint32_t dst_blocks;
    uint64_t dst_slot_offset;
    /* the decode node's ranks (tensor parallelism; 1 without): each rank's
     * regions, and what this node's ranks send each of them */
    uint32_t dst_tp;
    uint32_t kv_regions[HPD_TP_MAX], slot_regions[HPD_TP_MAX];
    const hpd_tp_plan_t *plan;
    /* staging, per decode rank: KV pages in its layout, then its GDN state */
    uint64_t staging_off, staging_bytes;
    uint64_t rank_bytes; /* one decode rank's part of it */
    uint32_t staging_pages; /* KV pages in a rank's part */
    uint32_t pushed[HPD_ENGINE_MAX_GROUPS]; /* destination pages sent, per group */
    bool xfer_open;
    /* outcome */
    bool failed;
    bool pair_failed; /* the transfer to the decode node failed: HPD_RPC_ERR_PEER */
    char error[200];
    int32_t first[HPD_MAX_CHOICES]; /* each choice's first token */
    uint32_t cached_tokens;
    double t_recv, t_start, t_end;
    double t_first_put, t_computed; /* transfer start, end of the prefill compute */
    /* cancel calls waiting for the transfer to end */
    hpd_rpc_conn_t *cancel_conn;
    uint32_t cancel_id;
    struct job *next;
} job_t;

typedef struct prefill {
    hpd_node_t *node;
    job_t *jobs; /* in arrival order */
    uint8_t *staging;
    uint32_t staging_region;
    uint64_t staging_bytes;
    hpd_staging_t arena;
    hpd_peers_t peers; /* endpoints to decode nodes (prefill_node/peers.h) */
    struct event *reap_ev; /* stops failed jobs outside engine steps */
    bool forget_peers;     /* at the next reap: drop_jobs ran */
    bool starting;         /* inside try_start */
    bool lease_hold;       /* try_start waits for the liveness lease */
    uint64_t lease_refusals; /* pushes not made: the liveness lease had lapsed */
    uint8_t summary[8192];
    /* what this node's ranks send a decode node at tp 1, 2, 4 or 8 (made
     * when first needed; plan_why says why a degree cannot be served) */
    hpd_tp_plan_t plans[4];
    bool planned[4];
    char plan_why[4][200];
    uint64_t jobs_done, jobs_failed, jobs_canceled;
    struct {
        hpd_metric_t *done, *failed, *canceled, *queued, *running, *finishing;
        hpd_metric_t *queue_s, *prefill_s, *push_s, *exposed_s;
    } m;
} prefill_t;


/* ------------------------------------------------------------ peers */

static bool peer_used(void *arg, const void *peer)
{
    const prefill_t *p = arg;
    for (const job_t *j = p->jobs; j != NULL; j = j->next)
        if (j->peer == peer)
            return true;
    return false;
}

static hpd_status_t peer_connect(void *arg, const void *info, void **peer_p)
{
    const prefill_t *p = arg;
    return hpd_xfer_connect(p->node->xfer, info, (hpd_xfer_peer_t **)peer_p);
}

static void peer_disconnect(void *arg, void *peer)
{
    hpd_xfer_disconnect(peer);
}

static bool peer_failed(void *arg, const void *peer)
{
    return hpd_xfer_peer_failed(peer);
}

static hpd_xfer_peer_t *peer_get(prefill_t *p, uint64_t node, const msgpack_object *info,
                                 hpd_proto_err_t *err)
{
    void *peer;
    const hpd_status_t st = hpd_peers_get(&p->peers, node, info, &peer);
    if (st != HPD_OK) {
        snprintf(err->text, sizeof(err->text), st == HPD_ERR_NO_MEMORY
                 ? "out of memory" : "cannot connect to decode node %llu's UCX info",
                 (unsigned long long)node);
        return NULL;
    }
    return peer;
}

/* ------------------------------------------------------------ jobs */

static job_t *job_find(prefill_t *p, uint64_t id)
{
    for (job_t *j = p->jobs; j != NULL; j = j->next)
        if (j->id == id)
            return j;
    return NULL;
}

static job_t *job_by_engine_id(prefill_t *p, uint64_t eng_id)
{
    for (job_t *j = p->jobs; j != NULL; j = j->next)
        if (j->eng_id == eng_id && j->state == JOB_RUNNING)
            return j;
    return NULL;
}

static void job_free(prefill_t *p, job_t *j)
{
    for (job_t **pp = &p->jobs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    if (j->eng_id != 0)
        hpd_engine_release(p->node->engine, j->eng_id);
    if (j->staging_bytes > 0)
        if (hpd_staging_free(&p->arena, j->staging_off, j->staging_bytes) != HPD_OK)
            HPD_LOG_WARN(LOG_COMPONENT, "%s: out of memory: %llu bytes of staging stay out "
                         "of use", p->node->o.name, (unsigned long long)j->staging_bytes);
    if (j->conn != NULL)
        hpd_rpc_conn_unref(j->conn);
    if (j->cancel_conn != NULL) {
        hpd_rpc_reply(j->cancel_conn, j->cancel_id, NULL);
        hpd_rpc_conn_unref(j->cancel_conn);
    }
    hpd_grammar_destroy(j->grammar);
    free(j->prompt);
    free(j->dst_pages);
    free(j->prompt_lp);
    free(j);
    /* a retired endpoint may have lost its last job: the reaper drops it
     * (this may run inside one of its callbacks) */
    if (hpd_peers_any_retired(&p->peers) && p->reap_ev != NULL) {
        static const struct timeval now = {0, 0};
        evtimer_add(p->reap_ev, &now);
    }
}

static void try_start(prefill_t *p);
static void on_reap(evutil_socket_t fd, short what, void *arg);

/* The first token of each of j's choices (its engine request's, all
 * finished), with their logprobs when asked: false when one failed. */
static bool first_tokens(hpd_engine_t *e, job_t *j)
{
    const uint64_t *ids;
    uint32_t n;
    if (hpd_engine_choices(e, j->eng_id, &ids, &n) != HPD_OK || n != j->n_choices)
        return false;
    for (uint32_t c = 0; c < n; c++) {
        const int32_t *toks;
        const hpd_token_logprobs_t *lp;
        uint32_t nt, n_lp;
        hpd_request_state_t rs;
        if (hpd_engine_result(e, ids[c], &toks, &nt, &rs) != HPD_OK ||
            rs != HPD_REQ_FINISHED || nt < 1)
            return false;
        j->first[c] = toks[0];
        if (j->logprobs && hpd_engine_logprobs(e, ids[c], &lp, &n_lp) == HPD_OK && n_lp > 0)
            j->first_lp[c] = lp[0];
    }
    return true;
}

/* Answers the prefill call and frees the job. */
static void job_end(prefill_t *p, job_t *j)
{
    j->t_end = hpd_time_now();
    if (j->conn != NULL) {
        if (j->cancel_conn != NULL) {
            hpd_rpc_reply_error(j->conn, j->call_id, HPD_RPC_ERR_APP, "job %llu canceled",
                                (unsigned long long)j->id);
            HPD_LOGR_INFO(LOG_COMPONENT, j->request, "%s: job %llu canceled", p->node->o.name,
                          (unsigned long long)j->id);
            p->jobs_canceled++;
        } else if (j->failed) {
            hpd_rpc_reply_error(j->conn, j->call_id,
                                j->pair_failed ? HPD_RPC_ERR_PEER : HPD_RPC_ERR_APP, "%s",
                                j->error);
            p->jobs_failed++;
        } else {
            uint8_t lp[HPD_MAX_CHOICES * (4 + 8 * HPD_MAX_TOP_LOGPROBS)];
            if (j->logprobs)
                hpd_logprobs_encode(j->first_lp, j->n_choices, j->top_logprobs, lp);
            const hpd_msg_prefilled_t m = {
                .prompt_logprobs = j->prompt_lp,
                .prompt_logprobs_len = j->prompt_lp_len,
                .logprobs = j->logprobs ? lp : NULL,
                .logprobs_len = j->logprobs ? (uint32_t)hpd_logprobs_wire_bytes(
                                                  j->n_choices, j->top_logprobs)
                                            : 0,
                .first_token = (uint32_t)j->first[0],
                .first_tokens = j->n_choices > 1 ? j->first : NULL,
                .first_tokens_n = j->n_choices > 1 ? j->n_choices : 0,
                .cached_tokens = j->cached_tokens,
                .queue_ms = (float)((j->t_start - j->t_recv) * 1e3),
                .prefill_ms = (float)((j->t_computed - j->t_start) * 1e3),
                .push_ms = (float)((j->t_end - j->t_first_put) * 1e3), /* first put to done */
                .exposed_push_ms = (float)((j->t_end - j->t_computed) * 1e3)}; /* not hidden */
            hpd_rpc_buf_t b;
            hpd_rpc_buf_init(&b);
            hpd_msg_pack(&hpd_msg_prefilled, &m, &b.pk);
            hpd_rpc_reply(j->conn, j->call_id, &b);
            hpd_rpc_buf_destroy(&b);
            p->jobs_done++;
            hpd_metric_observe(p->m.queue_s, j->t_start - j->t_recv);
            hpd_metric_observe(p->m.prefill_s, j->t_computed - j->t_start);
            hpd_metric_observe(p->m.push_s, j->t_end - j->t_first_put);
            hpd_metric_observe(p->m.exposed_s, j->t_end - j->t_computed);
            HPD_LOGR_INFO(LOG_COMPONENT, j->request, "%s: job %llu prefilled %u tokens (%u "
                          "cached) in %.1f ms, push %.1f ms (%.2f ms exposed)", p->node->o.name,
                          (unsigned long long)j->id, j->n_prompt, j->cached_tokens,
                          (j->t_computed - j->t_start) * 1e3, (j->t_end - j->t_first_put) * 1e3,
                          (j->t_end - j->t_computed) * 1e3);
        }
    }
    job_free(p, j);
    /* staging may have come free: start queued jobs from the loop (this
     * may run inside an engine step, from a UCX callback) */
    static const struct timeval now = {0, 0};
    if (p->reap_ev != NULL)
        evtimer_add(p->reap_ev, &now);
}

static void on_xfer_done(void *arg, uint64_t xfer_id, hpd_status_t st)
{
    job_t *j = arg;
    if (st != HPD_OK && !j->failed) {
        j->failed = true;
        /* neither a cancel nor this node's device failing (a fence the
         * puts waited on: HPD_ERR_INTERNAL) is the pair's fault */
        j->pair_failed = st != HPD_ERR_CANCELED && st != HPD_ERR_INTERNAL;
        snprintf(j->error, sizeof(j->error), "transfer to decode node %llu failed: %s",
                 (unsigned long long)j->dst_node, hpd_status_str(st));
    }
    job_end(j->owner, j);
}

/* Stops a job: the engine request goes; a transfer that has puts in flight
 * is flushed first (the puts land before the caller frees the decode
 * node's pages), else the job ends now. */
static void job_stop(prefill_t *p, job_t *j)
{
    if (j->state == JOB_FINISHING)
        return; /* its transfer callback ends it */
    if (j->eng_id != 0)
        hpd_engine_cancel(p->node->engine, j->eng_id);
    if (j->xfer_open && !hpd_xfer_peer_failed(j->peer)) {
        j->state = JOB_FINISHING;
        if (hpd_xfer_finish(j->peer, j->id, on_xfer_done, j, false) == HPD_OK)
            return;
    }
    job_end(p, j);
}

static void job_fail(prefill_t *p, job_t *j, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void job_fail(prefill_t *p, job_t *j, const char *fmt, ...)
{
    va_list ap;
    if (!j->failed) {
        j->failed = true;
        va_start(ap, fmt);
        vsnprintf(j->error, sizeof(j->error), fmt, ap);
        va_end(ap);
        HPD_LOGR_WARN(LOG_COMPONENT, j->request, "%s: job %llu: %s", p->node->o.name,
                      (unsigned long long)j->id, j->error);
    }
}

/* Staging for a job: per decode rank, its KV pages of the prompt in its
 * layout and its state of every GDN layer. */
static uint64_t job_staging_bytes(job_t *j, uint32_t n_gdn)
{
    const uint32_t groups = hpd_kv_layout_n_groups(&j->dst_layout);
    j->staging_pages = groups * HPD_DIV_UP(j->n_prompt, j->dst_layout.block_size);
    j->rank_bytes = (uint64_t)j->staging_pages * hpd_kv_layout_page_bytes(&j->dst_layout) +
                    (uint64_t)n_gdn * j->plan->dst_state_bytes;
    return j->dst_tp * j->rank_bytes;
}

/* What this node's ranks send a decode node at tp d; NULL, with why, when
 * the model cannot run at d (a decode node could not have loaded it). */
static const hpd_tp_plan_t *plan_for(prefill_t *p, uint32_t d, hpd_proto_err_t *err)
{
    const uint32_t i = d == 1 ? 0 : d == 2 ? 1 : d == 4 ? 2 : d == 8 ? 3 : 4;
    const hpd_model_t *m = p->node->model;
    if (i == 4) {
        snprintf(err->text, sizeof(err->text), "reservation: tp %u (expected 1, 2, 4 or 8)", d);
        return NULL;
    }
    if (!p->planned[i]) {
        if (hpd_tp_plan(&m->whole, hpd_engine_tp(p->node->engine), d, &p->plans[i],
                        p->plan_why[i], sizeof(p->plan_why[i])) != HPD_OK)
            p->plans[i].tp_d = 0; /* refused */
        p->planned[i] = true;
    }
    if (p->plans[i].tp_d == 0) {
        snprintf(err->text, sizeof(err->text), "reservation: a decode node at tp %u: %s", d,
                 p->plan_why[i]);
        return NULL;
    }
    return &p->plans[i];
}

/* Queued jobs enter the engine in arrival order while staging lasts. Not
 * reentrant: a job that ends inside it does not restart it. */
static void try_start(prefill_t *p)
{
    hpd_node_t *n = p->node;

    if (p->starting)
        return;
    if (!hpd_node_may_write(n)) {
        /* stopped past the liveness lease, perhaps declared lost: no job
         * starts (it would write into decode nodes) until a ping is
         * answered again, or the coordinator's loss drops the jobs */
        static const struct timeval later = {0, 20 * 1000};
        if (!p->lease_hold)
            HPD_LOG_WARN(LOG_COMPONENT, "%s: this node's liveness lease lapsed (was it stopped?): "
                         "no job starts until the coordinator answers it again", n->o.name);
        p->lease_hold = true;
        if (p->reap_ev != NULL)
            evtimer_add(p->reap_ev, &later);
        return;
    }
    p->lease_hold = false;
    p->starting = true;
    for (job_t *j = p->jobs; j != NULL;) {
        uint64_t off;
        if (j->state != JOB_QUEUED) {
            j = j->next;
            continue;
        }
        const uint64_t need = job_staging_bytes(j, n->model->config.n_linear_layers);
        if (!hpd_staging_alloc(&p->arena, need, &off))
            break; /* first come, first served */
        j->staging_off = off;
        j->staging_bytes = need;
        hpd_request_params_t rp = {.prompt = j->prompt,
                                   .n_prompt = j->n_prompt,
                                   .max_tokens = 1,
                                   .sampling = j->sampling,
                                   .logprobs = j->logprobs,
                                   .top_logprobs = j->top_logprobs,
                                   .prompt_logprobs = j->prompt_logprobs,
                                   .grammar = j->grammar,
                                   .n = j->n_choices};
        hpd_status_t st = hpd_engine_submit(n->engine, &rp, &j->eng_id);
        if (st != HPD_OK) {
            j->eng_id = 0;
            job_fail(p, j, "the engine refused the prompt: %s", hpd_status_str(st));
            job_end(p, j);
            j = p->jobs; /* the list changed */
            continue;
        }
        j->state = JOB_RUNNING;
        j->t_start = hpd_time_now();
        hpd_node_kick(n);
        j = j->next;
    }
    p->starting = false;
}

/* A pack group's pages, complete for tokens [from, to): translated from
 * every rank of this node that holds heads of each decode rank into that
 * rank's staging pages, put into its page pool. The ranks' page ids are
 * rank 0's (they allocate in lockstep). */
static hpd_status_t push_group(prefill_t *p, job_t *j, const hpd_engine_kv_t *kv, uint32_t g,
                               uint32_t from, uint32_t to, bool last)
{
    const hpd_engine_t *e = p->node->engine;
    hpd_kv_push_src_t srcs[HPD_TP_MAX];
    hpd_status_t st = HPD_OK;
    for (uint32_t d = 0; d < j->dst_tp && st == HPD_OK; d++) {
        uint32_t n_srcs = 0;
        for (uint32_t x = 0; x < j->plan->n_kv; x++) {
            const hpd_tp_kv_piece_t *k = &j->plan->kv[x];
            hpd_engine_memory_t m;
            if (k->dst_rank != d)
                continue;
            hpd_engine_memory(hpd_engine_rank(e, k->src_rank), &m);
            srcs[n_srcs++] = (hpd_kv_push_src_t){
                .span = {.layout = m.layout, .pool = m.kv_pool, .tables = kv->tables},
                .src_head = k->src_head,
                .heads = k->heads,
                .dst_head = k->dst_head};
        }
        const hpd_kv_push_args_t a = {
            .backend = p->node->backend,
            .srcs = srcs,
            .n_srcs = n_srcs,
            .first_token = from,
            .n_tokens = to,
            .last = last,
            .dst_layout = &j->dst_layout,
            .dst_region = j->kv_regions[d],
            .dst_tables = j->dst_tables,
            .staging = p->staging + j->staging_off + d * j->rank_bytes,
            .staging_pages = j->staging_pages,
            .group = g};
        st = hpd_kv_push(j->peer, j->id, &a);
    }
    return st;
}

/* GDN layer gi's state, final after the prompt's last chunk: each decode
 * rank's, gathered from the runs of this node's ranks' slots that hold it
 * (the value heads' recurrent rows; the q, k and v conv channels) into its
 * staging, then put into its slot. */
static hpd_status_t push_state(prefill_t *p, job_t *j, uint32_t gi)
{
    hpd_node_t *node = p->node;
    const hpd_tp_plan_t *plan = j->plan;
    hpd_status_t st = HPD_OK;
    for (uint32_t d = 0; d < j->dst_tp && st == HPD_OK; d++) {
        uint8_t *dst = p->staging + j->staging_off + d * j->rank_bytes +
                       (uint64_t)j->staging_pages * hpd_kv_layout_page_bytes(&j->dst_layout) +
                       gi * plan->dst_state_bytes;
        for (uint32_t x = 0; x < plan->n_state && st == HPD_OK; x++) {
            const hpd_tp_state_run_t *r = &plan->state[x];
            hpd_engine_kv_t kv;
            if (r->dst_rank != d)
                continue;
            if ((st = hpd_engine_request_kv(hpd_engine_rank(node->engine, r->src_rank),
                                            j->eng_id, &kv)) != HPD_OK)
                break;
            const hpd_slot_copy_args_t c = {
                .dst = dst + r->dst_off,
                .src = (uint8_t *)kv.state + gi * plan->src_state_bytes + r->src_off,
                .bytes = r->bytes};
            st = hpd_slot_copy(node->backend, &c);
        }
        const hpd_xfer_put_t put = {.local = dst,
                                    .region = j->slot_regions[d],
                                    .offset = j->dst_slot_offset + gi * plan->dst_state_bytes,
                                    .bytes = plan->dst_state_bytes};
        void *fence;
        if (st == HPD_OK && (st = hpd_backend_fence_record(node->backend, &fence)) == HPD_OK)
            st = hpd_xfer_put_after(j->peer, j->id, &put, 1, node->backend, fence);
    }
    return st;
}

/* The layerwise push: called by the engine after each layer (on rank 0's
 * thread; every rank has passed this layer's output projection, whose sum
 * meets them all, so each rank's KV and state of the layer are final and
 * no rank writes them again in this step). */
static void on_layer(void *arg, uint32_t layer, const hpd_engine_step_item_t *items, uint32_t n)
{
    prefill_t *p = arg;
    hpd_node_t *node = p->node;
    const hpd_model_config_t *cfg = &node->model->config;
    const bool may_write = hpd_node_may_write(node);

    for (uint32_t i = 0; i < n; i++) {
        job_t *j = items[i].prefill ? job_by_engine_id(p, items[i].id) : NULL;
        hpd_engine_kv_t kv;
        hpd_status_t st = HPD_OK;
        if (j == NULL || j->failed || hpd_engine_request_kv(node->engine, j->eng_id, &kv) != HPD_OK)
            continue;
        if (!may_write) {
            p->lease_refusals++;
            job_fail(p, j, "this node's liveness lease lapsed (it was stopped and may have been "
                     "declared lost): it does not write into decode node %llu",
                     (unsigned long long)j->dst_node);
            continue;
        }
        const uint32_t end = items[i].pos + items[i].n_tokens;
        const hpd_kv_layout_t *dl = &j->dst_layout;
        if (cfg->layer_full[layer]) {
            const uint32_t a = cfg->kind_index[layer], g = a / dl->pack_size;
            if (a % dl->pack_size != dl->pack_size - 1 && a != dl->n_layers - 1)
                continue; /* the group's pages are not complete yet */
            const uint32_t to = items[i].last_chunk ? end : end / dl->block_size * dl->block_size;
            const uint32_t from = j->pushed[g] * dl->block_size;
            if (to <= from)
                continue;
            st = push_group(p, j, &kv, g, from, to, items[i].last_chunk);
            j->pushed[g] = HPD_DIV_UP(to, dl->block_size);
        } else if (items[i].last_chunk) {
            st = push_state(p, j, cfg->kind_index[layer]);
        } else {
            continue;
        }
        if (!j->xfer_open)
            j->t_first_put = hpd_time_now();
        j->xfer_open = true;
        if (st != HPD_OK) {
            /* its endpoint failed (the decode node cannot be reached): the
             * pair's fault, and the request runs again elsewhere */
            j->pair_failed |= st == HPD_ERR_IO || st == HPD_ERR_TIMEOUT;
            job_fail(p, j, "push to decode node %llu failed at layer %u: %s",
                     (unsigned long long)j->dst_node, layer, hpd_status_str(st));
        }
    }
}

static void after_step(hpd_node_t *n)
{
    prefill_t *p = n->role_data;
    job_t *j = p->jobs;

    /* Ending a job or finishing its transfer may end others: a flush's
     * callback that fails every job of a lost decode node can run inside
     * it. So after each job acted on the walk starts over; such a job is no
     * longer running, which bounds the walk. */
    while (j != NULL) {
        const int32_t *toks;
        uint32_t nt;
        hpd_request_state_t rs;
        if (j->state != JOB_RUNNING ||
            hpd_engine_result(n->engine, j->eng_id, &toks, &nt, &rs) != HPD_OK) {
            j = j->next;
            continue;
        }
        if (j->failed || rs == HPD_REQ_FAILED) {
            if (!j->failed)
                job_fail(p, j, "the prefill step failed");
            job_stop(p, j);
        } else if (rs == HPD_REQ_FINISHED) {
            hpd_request_info_t info;
            j->t_computed = hpd_time_now();
            const hpd_token_logprobs_t *lp;
            uint32_t n_lp;
            if (!first_tokens(n->engine, j)) {
                job_fail(p, j, "a choice's first token could not be drawn");
                job_stop(p, j);
                j = p->jobs;
                continue;
            }
            if (j->prompt_logprobs &&
                hpd_engine_prompt_logprobs(n->engine, j->eng_id, &lp, &n_lp) == HPD_OK &&
                (j->prompt_lp = malloc(hpd_logprobs_wire_bytes(n_lp, j->top_logprobs) + 1)) !=
                    NULL) {
                hpd_logprobs_encode(lp, n_lp, j->top_logprobs, j->prompt_lp);
                j->prompt_lp_len = (uint32_t)hpd_logprobs_wire_bytes(n_lp, j->top_logprobs);
            }
            if (hpd_engine_request_info(n->engine, j->eng_id, &info) == HPD_OK)
                j->cached_tokens = info.cached_tokens;
            hpd_engine_release(n->engine, j->eng_id);
            j->eng_id = 0;
            j->state = JOB_FINISHING;
            if (hpd_xfer_finish(j->peer, j->id, on_xfer_done, j, false) != HPD_OK) {
                job_fail(p, j, "decode node %llu is gone", (unsigned long long)j->dst_node);
                j->pair_failed = true;
                job_end(p, j);
            }
        } else {
            j = j->next; /* still computing */
            continue;
        }
        j = p->jobs;
    }
}

/* ------------------------------------------------------------ methods */

/* The decode node's ranks and their regions from a reservation, and what
 * this node's ranks send them; its ranks' KV heads and state bytes, where
 * it names them, must be what this node's shard map gives such a rank. */
static bool reservation_ranks(prefill_t *p, job_t *j, const hpd_msg_reservation_t *res,
                              hpd_proto_err_t *err)
{
    j->dst_tp = res->tp > 0 ? res->tp : 1;
    if (j->dst_tp > 1 && (res->kv_regions_n != j->dst_tp || res->slot_regions_n != j->dst_tp)) {
        snprintf(err->text, sizeof(err->text), "reservation: tp %u needs %u kv_regions and "
                 "slot_regions (got %u and %u)", j->dst_tp, j->dst_tp, res->kv_regions_n,
                 res->slot_regions_n);
        return false;
    }
    for (uint32_t d = 0; d < j->dst_tp; d++) {
        j->kv_regions[d] = j->dst_tp > 1 ? (uint32_t)res->kv_regions[d] : res->kv_region;
        j->slot_regions[d] = j->dst_tp > 1 ? (uint32_t)res->slot_regions[d] : res->slot_region;
    }
    if ((j->plan = plan_for(p, j->dst_tp, err)) == NULL)
        return false;
    if ((res->kv_heads != 0 && res->kv_heads != j->plan->dst_kv_heads) ||
        (res->state_bytes != 0 && res->state_bytes != j->plan->dst_state_bytes)) {
        snprintf(err->text, sizeof(err->text), "reservation: the decode node's ranks (tp %u) "
                 "hold %u KV heads and %llu bytes of a GDN layer's state; this node's shard "
                 "map gives such a rank %u and %llu", j->dst_tp, res->kv_heads,
                 (unsigned long long)res->state_bytes, j->plan->dst_kv_heads,
                 (unsigned long long)j->plan->dst_state_bytes);
        return false;
    }
    return true;
}

static bool parse_job(prefill_t *p, job_t *j, const msgpack_object *params,
                      hpd_proto_err_t *err)
{
    hpd_node_t *n = p->node;
    const hpd_model_config_t *cfg = &n->model->config;
    const hpd_engine_params_t *ep = hpd_engine_params(n->engine);
    const msgpack_object *tables;
    hpd_engine_memory_t m;
    hpd_msg_prefill_job_t pj = {0};
    hpd_msg_destination_t dst = {0};
    hpd_msg_reservation_t res = {0};

    hpd_engine_memory(n->engine, &m);
    /* what the coordinator leaves out is the model's default (the coordinator
     * sends every field when the cluster runs without generation defaults) */
    j->sampling = cfg->gen_sampling;
    if (!hpd_msg_unpack(&hpd_msg_prefill_job, params, &pj, err))
        return false;
    j->id = pj.job;
    j->request = pj.request;
    j->logprobs = pj.logprobs;
    j->prompt_logprobs = pj.prompt_logprobs;
    j->top_logprobs = pj.logprobs || pj.prompt_logprobs ? pj.top_logprobs : 0;
    j->n_choices = pj.n > 1 ? pj.n : 1;
    j->prompt = (int32_t *)pj.prompt; /* the job owns it now */
    j->n_prompt = pj.prompt_n;
    for (uint32_t i = 0; i < j->n_prompt; i++)
        if ((uint32_t)j->prompt[i] >= cfg->vocab_size) {
            snprintf(err->text, sizeof(err->text),
                     "prefill: prompt[%u] is %d (expected a token id from 0 to %u)", i,
                     j->prompt[i], cfg->vocab_size - 1);
            return false;
        }
    if (j->n_prompt == 0 || j->n_prompt + 1 > ep->max_context) {
        snprintf(err->text, sizeof(err->text),
                 "prompt has %u tokens (expected 1 to %u, this node's max context - 1)",
                 j->n_prompt, ep->max_context - 1);
        return false;
    }
    if (pj.sampling != NULL && !hpd_proto_sampling(pj.sampling, &j->sampling, err))
        return false;
    if (!hpd_msg_unpack(&hpd_msg_destination, pj.decode, &dst, err))
        return false;
    const bool res_ok = hpd_msg_unpack(&hpd_msg_reservation, dst.reservation, &res, err) &&
                        reservation_ranks(p, j, &res, err);
    hpd_msg_free(&hpd_msg_reservation, &res);
    if (!res_ok)
        return false;
    j->dst_node = dst.node;
    j->dst_layout = res.layout;
    j->dst_slot_offset = res.slot_offset;
    /* the destination holds the same model: B, P and the order differ, and
     * with tensor parallelism its ranks' KV heads */
    j->dst_layout.n_layers = m.layout->n_layers;
    j->dst_layout.n_kv_heads = j->plan->dst_kv_heads;
    j->dst_layout.head_dim = m.layout->head_dim;
    j->dst_layout.dtype = m.layout->dtype;
    if (j->dst_layout.pack_size > HPD_MAX(m.layout->n_layers, 1)) {
        snprintf(err->text, sizeof(err->text),
                 "decode layout pack size %u exceeds the %u full-attention layers",
                 j->dst_layout.pack_size, m.layout->n_layers);
        return false;
    }
    const uint32_t groups = m.layout->n_layers ? hpd_kv_layout_n_groups(&j->dst_layout) : 0;
    j->dst_blocks = HPD_DIV_UP(j->n_prompt, j->dst_layout.block_size);
    tables = res.tables;
    if (tables->via.array.size != groups) {
        snprintf(err->text, sizeof(err->text),
                 "reservation: tables must be an array of %u page lists (one per pack group)",
                 groups);
        return false;
    }
    if (groups > 0 && (j->dst_pages = malloc((size_t)groups * j->dst_blocks * 4)) == NULL) {
        snprintf(err->text, sizeof(err->text), "out of memory");
        return false;
    }
    for (uint32_t g = 0; g < groups; g++) {
        uint32_t got, *row = j->dst_pages + (size_t)g * j->dst_blocks;
        const msgpack_object *t = &tables->via.array.ptr[g];
        char what[32];
        snprintf(what, sizeof(what), "reservation: tables[%u]", g);
        if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size < j->dst_blocks) {
            snprintf(err->text, sizeof(err->text), "%s must list at least %u pages", what,
                     j->dst_blocks);
            return false;
        }
        msgpack_object head = *t;
        head.via.array.size = j->dst_blocks; /* pages past the prompt are the decode node's */
        if (!hpd_proto_u32s(&head, what, row, j->dst_blocks, &got, err))
            return false;
        j->dst_tables[g] = row;
    }
    if (pj.grammar != NULL &&
        !hpd_node_grammar(n, pj.grammar, pj.grammar_len, "prefill", &j->grammar, err))
        return false;
    if ((j->peer = peer_get(p, j->dst_node, dst.xfer, err)) == NULL) {
        j->pair_failed = true; /* the decode node's data plane: the pair's fault, not the job's */
        return false;
    }
    return true;
}

/* A job refused before it was queued. */
static void job_discard(job_t *j)
{
    hpd_grammar_destroy(j->grammar);
    free(j->prompt);
    free(j->dst_pages);
    free(j);
}

static void m_prefill(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_node_t *n = arg;
    prefill_t *p = n->role_data;
    hpd_proto_err_t err = {{0}};
    job_t *j = calloc(1, sizeof(*j));

    if (j == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "out of memory");
        return;
    }
    j->owner = p;
    if (!parse_job(p, j, params, &err)) {
        /* the typed messages name themselves ("prefill: ", "decode: ",
         * "reservation: "); the rest gets the method's name. A decode
         * node this node cannot reach is a failed pair (the coordinator
         * runs the request again elsewhere), not a client's error */
        hpd_rpc_reply_error(conn, id, j->pair_failed ? HPD_RPC_ERR_PEER : HPD_RPC_ERR_PARAMS,
                            "%s%s", strncmp(err.text, "prefill: ", 9) == 0 ? "" : "prefill: ",
                            err.text);
        job_discard(j);
        return;
    }
    if (job_find(p, j->id) != NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "prefill: job %llu already exists",
                            (unsigned long long)j->id);
        job_discard(j);
        return;
    }
    const uint64_t need = job_staging_bytes(j, n->model->config.n_linear_layers);
    if (need > p->staging_bytes) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS,
                            "prefill: job %llu needs %llu MiB of staging, this node has %llu MiB "
                            "(--staging-mb)",
                            (unsigned long long)j->id, (unsigned long long)(need >> 20) + 1,
                            (unsigned long long)(p->staging_bytes >> 20));
        job_discard(j);
        return;
    }
    j->conn = conn;
    j->call_id = id;
    hpd_rpc_conn_ref(conn);
    j->t_recv = hpd_time_now();
    job_t **tail = &p->jobs;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = j;
    try_start(p);
}

static void m_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    hpd_node_t *n = arg;
    prefill_t *p = n->role_data;
    hpd_proto_err_t err;
    hpd_msg_cancel_job_t m = {0};
    job_t *j;

    if (!hpd_msg_unpack(&hpd_msg_cancel_job, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "%s", err.text);
        return;
    }
    if ((j = job_find(p, m.job)) == NULL || j->cancel_conn != NULL) {
        hpd_rpc_reply(conn, id, NULL); /* unknown, finished, or already being canceled */
        return;
    }
    /* answered when the job is gone (after its puts landed) */
    j->cancel_conn = conn;
    j->cancel_id = id;
    hpd_rpc_conn_ref(conn);
    job_stop(p, j);
}

static const hpd_rpc_method_t methods[] = {
    {.name = "prefill", .fn = m_prefill},
    {.name = "cancel", .fn = m_cancel},
};

/* ------------------------------------------------------------ role */

static void metrics_init(prefill_t *p, hpd_metrics_t *r)
{
    static const char jobs[] = "Prefill jobs answered, by outcome.";
    static const char state[] = "Prefill jobs by state.";
    const double *lat = hpd_metrics_latency_bounds;
    const uint32_t nl = hpd_metrics_n_latency_bounds;
    p->m.done = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs, "outcome=\"ok\"");
    p->m.failed = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs,
                                  "outcome=\"failed\"");
    p->m.canceled = hpd_metrics_add(r, HPD_METRIC_COUNTER, "hpd_jobs_total", jobs,
                                    "outcome=\"canceled\"");
    p->m.queued = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_jobs", state, "state=\"queued\"");
    p->m.running = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_jobs", state, "state=\"running\"");
    p->m.finishing = hpd_metrics_add(r, HPD_METRIC_GAUGE, "hpd_jobs", state,
                                     "state=\"finishing\"");
    p->m.queue_s = hpd_metrics_histogram(r, "hpd_prefill_queue_seconds",
                                         "Time a job waited for staging memory.", NULL, lat, nl);
    p->m.prefill_s = hpd_metrics_histogram(r, "hpd_prefill_seconds",
                                           "Prefill compute time per job.", NULL, lat, nl);
    p->m.push_s = hpd_metrics_histogram(r, "hpd_xfer_push_seconds",
                                        "Transfer time per job, first put to completion.", NULL,
                                        lat, nl);
    p->m.exposed_s = hpd_metrics_histogram(r, "hpd_xfer_exposed_seconds",
                                           "Transfer time per job after the compute ended.",
                                           NULL, lat, nl);
}

typedef struct {
    uint32_t queued, running, finishing;
    uint64_t queued_tokens; /* prompt tokens of jobs not yet finishing */
} job_counts_t;

static job_counts_t count_jobs(const prefill_t *p)
{
    job_counts_t c = {0, 0, 0, 0};
    for (const job_t *j = p != NULL ? p->jobs : NULL; j != NULL; j = j->next) {
        c.queued += j->state == JOB_QUEUED;
        c.running += j->state == JOB_RUNNING;
        c.finishing += j->state == JOB_FINISHING;
        if (j->state != JOB_FINISHING)
            c.queued_tokens += j->n_prompt;
    }
    return c;
}

static void collect(hpd_node_t *n)
{
    prefill_t *p = n->role_data;
    const job_counts_t c = count_jobs(p);
    hpd_metric_set(p->m.done, (double)p->jobs_done);
    hpd_metric_set(p->m.failed, (double)p->jobs_failed);
    hpd_metric_set(p->m.canceled, (double)p->jobs_canceled);
    hpd_metric_set(p->m.queued, c.queued);
    hpd_metric_set(p->m.running, c.running);
    hpd_metric_set(p->m.finishing, c.finishing);
}

static uint32_t in_flight(hpd_node_t *n)
{
    const job_counts_t c = count_jobs(n->role_data);
    return c.queued + c.running + c.finishing;
}

static hpd_status_t init(hpd_node_t *n)
{
    prefill_t *p = calloc(1, sizeof(*p));
    hpd_status_t st;

    if (p == NULL)
        return HPD_ERR_NO_MEMORY;
    p->node = n;
    n->role_data = p;
    const hpd_peers_ops_t peer_ops = {.connect = peer_connect,
                                      .disconnect = peer_disconnect,
                                      .failed = peer_failed,
                                      .used = peer_used,
                                      .arg = p};
    hpd_peers_init(&p->peers, &peer_ops);
    p->staging_bytes = n->o.staging_bytes;
    if ((st = hpd_xfer_alloc_pinned(n->xfer, n->backend, p->staging_bytes, (void **)&p->staging,
                                    &p->staging_region)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: cannot map %llu MiB of staging: %s", n->o.name,
                      (unsigned long long)(p->staging_bytes >> 20), hpd_status_str(st));
        return st;
    }
    if ((st = hpd_staging_init(&p->arena, p->staging_bytes)) != HPD_OK)
        return st;
    if ((p->reap_ev = evtimer_new(n->base, on_reap, p)) == NULL)
        return HPD_ERR_NO_MEMORY;
    /* the engine was created before the role: hook the layer callback now */
    hpd_engine_set_layer_cb(n->engine, on_layer, p);
    metrics_init(p, n->metrics);
    return HPD_OK;
}

static void pack_load(hpd_node_t *n, msgpack_packer *pk)
{
    prefill_t *p = n->role_data;
    const job_counts_t c = count_jobs(p);
    const hpd_msg_prefill_load_t load = {.jobs_queued = c.queued,
                                         .jobs_running = c.running,
                                         .jobs_finishing = c.finishing,
                                         .queued_tokens = c.queued_tokens,
                                         .jobs_done = p->jobs_done,
                                         .jobs_failed = p->jobs_failed,
                                         .jobs_canceled = p->jobs_canceled,
                                         .lease_refusals = p->lease_refusals};
    hpd_msg_pack(&hpd_msg_prefill_load, &load, pk);
}

/* The prefix summary rides on heartbeats for prefix-aware routing. */
static void summary(hpd_node_t *n, const void **data_p, uint32_t *len_p)
{
    prefill_t *p = n->role_data;
    if (!hpd_engine_params(n->engine)->prefix_cache)
        return;
    hpd_engine_prefix_summary(n->engine, p->summary, sizeof(p->summary));
    *data_p = p->summary;
    *len_p = sizeof(p->summary);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    prefill_t *p = arg;
    for (job_t *j = p->jobs, *next; j != NULL; j = next) {
        next = j->next;
        if (j->failed && j->state != JOB_FINISHING) {
            job_stop(p, j);
            next = p->jobs; /* the list may have changed */
        }
    }
    /* the retired endpoints, or after the loss of the coordinator every
     * one: they are named by its node ids, which a new coordinator does not
     * hand out again */
    hpd_peers_drop_unused(&p->peers, p->forget_peers);
    p->forget_peers = false;
    try_start(p);
}

/* The coordinator is gone: every job fails (those pushing flush first, so
 * that their puts land before anyone reuses the pages) and is stopped from
 * the loop; then the endpoints go. */
static void drop_jobs(hpd_node_t *n, const char *why)
{
    prefill_t *p = n->role_data;
    static const struct timeval now = {0, 0};
    for (job_t *j = p->jobs; j != NULL; j = j->next)
        if (j->state != JOB_FINISHING)
            job_fail(p, j, "the coordinator was lost: %s", why);
    p->forget_peers = true;
    if (p->reap_ev != NULL)
        evtimer_add(p->reap_ev, &now);
}

/* UCX may report this from inside an engine step (a put progresses the
 * worker): mark the jobs and stop them from the loop, after the step. */
static void on_peer_error(hpd_node_t *n, hpd_xfer_peer_t *peer, hpd_status_t status)
{
    prefill_t *p = n->role_data;
    static const struct timeval now = {0, 0};
    for (job_t *j = p->jobs; j != NULL; j = j->next)
        if (j->peer == peer && j->state != JOB_FINISHING) {
            job_fail(p, j, "decode node %llu failed: %s", (unsigned long long)j->dst_node,
                     hpd_status_str(status));
            j->pair_failed = true;
        }
    if (p->reap_ev != NULL)
        evtimer_add(p->reap_ev, &now);
}

static void fini(hpd_node_t *n)
{
    prefill_t *p = n->role_data;
    if (p == NULL)
        return;
    for (job_t *j = p->jobs; j != NULL; j = j->next)
        if (!j->failed) {
            j->failed = true;
            snprintf(j->error, sizeof(j->error), "prefill node shutting down");
        }
    /* the endpoints close first: a job whose transfer is finishing ends
     * through its callback, while the job is still there */
    hpd_peers_destroy(&p->peers);
    while (p->jobs != NULL) {
        job_t *j = p->jobs;
        j->state = JOB_FINISHING; /* no flush now: the context goes */
        job_end(p, j);
    }
    if (p->reap_ev)
        event_free(p->reap_ev);
    p->reap_ev = NULL;
    hpd_staging_destroy(&p->arena);
    /* p itself goes with the node (node_destroy): callbacks of what the
     * node tears down after this find it empty */
}

const hpd_node_role_t hpd_prefill_role = {
    .name = "prefill",
    .methods = methods,
    .n_methods = sizeof(methods) / sizeof(methods[0]),
    .init = init,
    .pack_load = pack_load,
    .summary = summary,
    .after_step = after_step,
    .on_peer_error = on_peer_error,
    .drop_jobs = drop_jobs,
    .fini = fini,
    .in_flight = in_flight,
    .collect = collect,
};
