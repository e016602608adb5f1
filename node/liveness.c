#include "node/liveness.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "node/msg.h"
#include "transport/rpc.h"

#define LOG_COMPONENT "liveness"
#define TICK_MS 10
#define CALL_TIMEOUT_MS 2000
#define BACKOFF_MIN_S 0.05
#define BACKOFF_MAX_S 1.0

struct hpd_liveness {
    char host[256], name[64];
    char *token;
    uint16_t port;
    pthread_t thread;
    bool started;
    /* set by any thread, read by the pinger */
    pthread_mutex_t mu;
    uint64_t node_id, key;
    uint32_t period_ms, lease_ms;
    double ok_sent; /* send time of the last answered ping (0: none yet) */
    atomic_bool stop;
    atomic_uint_fast64_t answered;
    /* the pinger's own */
    struct event_base *base;
    struct event *tick;
    hpd_rpc_client_t *client;
    bool pending;
    double sent_at; /* of the pending ping */
    uint64_t pending_id;
    double next_ping, next_connect, backoff;
};

static void on_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    hpd_liveness_t *l = arg;
    l->pending = false;
    if (st == HPD_OK && !reply->is_error) {
        atomic_fetch_add(&l->answered, 1);
        l->backoff = 0;
        pthread_mutex_lock(&l->mu);
        if (l->node_id == l->pending_id && l->sent_at > l->ok_sent)
            l->ok_sent = l->sent_at; /* for this registration only */
        pthread_mutex_unlock(&l->mu);
    }
    else if (st == HPD_OK)
        /* the coordinator does not know this registration (any more): the
         * node's heartbeat finds out too and registers again */
        HPD_LOG_DEBUG(LOG_COMPONENT, "%s: alive refused: %.*s", l->name,
                      (int)reply->error_message_len, reply->error_message);
}

static void on_close(void *arg, hpd_status_t why)
{
    (void)arg;
    (void)why; /* the tick notices and reconnects */
}

/* (Re)connects with backoff while the connection is down. */
static bool connected(hpd_liveness_t *l, double now)
{
    if (l->client != NULL && hpd_rpc_client_is_open(l->client))
        return true;
    if (now < l->next_connect)
        return false;
    hpd_rpc_client_destroy(l->client); /* its pending call fails: on_reply */
    l->client = NULL;
    l->pending = false;
    hpd_rpc_client_params_t cp = {.base = l->base,
                                  .host = l->host,
                                  .port = l->port,
                                  .token = l->token,
                                  .timeout_ms = CALL_TIMEOUT_MS,
                                  .on_close = on_close,
                                  .arg = l};
    /* the next attempt waits longer each time, until a ping is answered
     * (a refused secret closes the connection after it was made) */
    l->backoff = l->backoff < BACKOFF_MIN_S ? BACKOFF_MIN_S : l->backoff * 2;
    if (l->backoff > BACKOFF_MAX_S)
        l->backoff = BACKOFF_MAX_S;
    l->next_connect = now + l->backoff;
    if (hpd_rpc_client_connect(&cp, &l->client) != HPD_OK) {
        l->client = NULL;
        return false;
    }
    return true;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    hpd_liveness_t *l = arg;
    const double now = hpd_time_now();
    uint64_t id, key;
    uint32_t period;

    if (atomic_load(&l->stop)) {
        event_base_loopbreak(l->base);
        return;
    }
    pthread_mutex_lock(&l->mu);
    id = l->node_id;
    key = l->key;
    period = l->period_ms;
    pthread_mutex_unlock(&l->mu);
    if (id == 0 || period == 0 || now < l->next_ping || !connected(l, now) || l->pending)
        return;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_alive, &(hpd_msg_alive_t){.node_id = id, .key = key}, &b.pk);
    if (hpd_rpc_call(l->client, "alive", &b, CALL_TIMEOUT_MS, on_reply, l) == HPD_OK) {
        l->pending = true;
        l->sent_at = now;
        l->pending_id = id;
    }
    hpd_rpc_buf_destroy(&b);
    l->next_ping = now + period / 1000.0;
}

static void *run(void *arg)
{
    hpd_liveness_t *l = arg;
    event_base_dispatch(l->base);
    hpd_rpc_client_destroy(l->client);
    l->client = NULL;
    return NULL;
}

hpd_status_t hpd_liveness_start(const hpd_liveness_params_t *p, hpd_liveness_t **l_p)
{
    hpd_liveness_t *l = calloc(1, sizeof(*l));
    const struct timeval tick = {0, TICK_MS * 1000};

    *l_p = NULL;
    if (l == NULL)
        return HPD_ERR_NO_MEMORY;
    snprintf(l->host, sizeof(l->host), "%s", p->host);
    snprintf(l->name, sizeof(l->name), "%s", p->name != NULL ? p->name : "node");
    l->port = p->port;
    pthread_mutex_init(&l->mu, NULL);
    atomic_init(&l->stop, false);
    atomic_init(&l->answered, 0);
    if ((p->token != NULL && (l->token = strdup(p->token)) == NULL) ||
        (l->base = event_base_new()) == NULL ||
        (l->tick = event_new(l->base, -1, EV_PERSIST, on_tick, l)) == NULL ||
        event_add(l->tick, &tick) != 0) {
        hpd_liveness_stop(l);
        return HPD_ERR_NO_MEMORY;
    }
    if (pthread_create(&l->thread, NULL, run, l) != 0) {
        hpd_liveness_stop(l);
        return HPD_ERR_NO_RESOURCE;
    }
    l->started = true;
    *l_p = l;
    return HPD_OK;
}

void hpd_liveness_set(hpd_liveness_t *l, uint64_t node_id, uint64_t key, uint32_t period_ms,
                      uint32_t lease_ms)
{
    if (l == NULL)
        return;
    pthread_mutex_lock(&l->mu);
    if (node_id != l->node_id)
        l->ok_sent = 0; /* a new registration is answered anew */
    l->node_id = node_id;
    l->key = key;
    l->period_ms = period_ms;
    l->lease_ms = lease_ms;
    pthread_mutex_unlock(&l->mu);
}

double hpd_liveness_valid_until(hpd_liveness_t *l)
{
    pthread_mutex_lock(&l->mu);
    const double t = l->ok_sent > 0 ? l->ok_sent + l->lease_ms / 1000.0 : 0;
    pthread_mutex_unlock(&l->mu);
    return t;
}

uint64_t hpd_liveness_answered(hpd_liveness_t *l)
{
    return atomic_load(&l->answered);
}

void hpd_liveness_stop(hpd_liveness_t *l)
{
    if (l == NULL)
        return;
    if (l->started) {
        atomic_store(&l->stop, true);
        pthread_join(l->thread, NULL);
    }
    if (l->tick != NULL)
        event_free(l->tick);
    if (l->base != NULL)
        event_base_free(l->base);
    pthread_mutex_destroy(&l->mu);
    free(l->token);
    free(l);
}
