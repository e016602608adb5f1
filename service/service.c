#include "service/service.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/util.h"
#include "transport/http.h"

#define LOG_COMPONENT "service"
#define DRAIN_POLL_MS 50

struct hpd_service {
    hpd_service_params_t p;
    struct event *sig_int, *sig_term, *sig_hup, *sig_usr1, *drain_ev;
    hpd_http_t *http;
    hpd_metric_t *uptime;
    double started, drain_deadline;
    bool draining, restarting;
};

static void collect(void *arg)
{
    hpd_service_t *s = arg;
    hpd_metric_set(s->uptime, hpd_time_now() - s->started);
    if (s->p.collect != NULL)
        s->p.collect(s->p.arg);
}

static bool health(void *arg, char *msg, size_t len)
{
    hpd_service_t *s = arg;
    return s->p.health(s->p.arg, msg, len);
}

/* While draining: the end comes once nothing is in flight, or at the
 * deadline. */
static void on_drain_check(evutil_socket_t fd, short what, void *arg)
{
    hpd_service_t *s = arg;
    static const struct timeval again = {0, DRAIN_POLL_MS * 1000};
    const uint32_t left = s->p.in_flight != NULL ? s->p.in_flight(s->p.arg) : 0;
    if (left > 0 && hpd_time_now() < s->drain_deadline) {
        evtimer_add(s->drain_ev, &again);
        return;
    }
    if (left > 0)
        HPD_LOG_WARN(LOG_COMPONENT, "%s: drain deadline passed with %u jobs in flight; "
                     "stopping", s->p.name, left);
    else
        HPD_LOG_INFO(LOG_COMPONENT, "%s: drained; stopping", s->p.name);
    if (s->p.drained != NULL)
        s->p.drained(s->p.arg, left);
    else
        event_base_loopbreak(s->p.base);
}

void hpd_service_drain(hpd_service_t *s)
{
    static const struct timeval now = {0, 0};
    if (s->draining)
        return;
    s->draining = true;
    s->drain_deadline = hpd_time_now() + s->p.drain_timeout_ms / 1000.0;
    HPD_LOG_INFO(LOG_COMPONENT, "%s: draining %u open requests (deadline %u ms)", s->p.name,
                 s->p.in_flight != NULL ? s->p.in_flight(s->p.arg) : 0, s->p.drain_timeout_ms);
    evtimer_add(s->drain_ev, &now);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    hpd_service_t *s = arg;
    if (s->draining || s->p.drain == NULL || !s->p.drain(s->p.arg)) {
        HPD_LOG_INFO(LOG_COMPONENT, "%s: signal %d, stopping now", s->p.name, (int)sig);
        event_base_loopbreak(s->p.base);
        return;
    }
    s->restarting = sig == SIGUSR1;
    HPD_LOG_INFO(LOG_COMPONENT, "%s: signal %d%s", s->p.name, (int)sig,
                 s->restarting ? " (a drain for a restart)" : "");
    hpd_service_drain(s);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    hpd_service_t *s = arg;
    s->p.reload(s->p.arg);
}

hpd_status_t hpd_service_create(const hpd_service_params_t *p, hpd_service_t **svc_p)
{
    hpd_service_t *s = calloc(1, sizeof(*s));
    *svc_p = NULL;
    if (s == NULL)
        return HPD_ERR_NO_MEMORY;
    s->p = *p;
    s->started = hpd_time_now();
    s->uptime = hpd_metrics_add(p->metrics, HPD_METRIC_GAUGE, "hpd_uptime_seconds",
                                "Seconds since the process started.", NULL);
    s->sig_int = evsignal_new(p->base, SIGINT, on_signal, s);
    s->sig_term = evsignal_new(p->base, SIGTERM, on_signal, s);
    s->sig_usr1 = evsignal_new(p->base, SIGUSR1, on_signal, s);
    s->drain_ev = evtimer_new(p->base, on_drain_check, s);
    if (p->reload != NULL)
        s->sig_hup = evsignal_new(p->base, SIGHUP, on_hup, s);
    if (s->uptime == NULL || s->sig_int == NULL || s->sig_term == NULL || s->sig_usr1 == NULL ||
        s->drain_ev == NULL ||
        (p->reload != NULL && s->sig_hup == NULL)) {
        hpd_service_destroy(s);
        return HPD_ERR_NO_MEMORY;
    }
    if (p->metrics_port >= 0) {
        const hpd_http_params_t hp = {.base = p->base,
                                      .host = p->host,
                                      .port = (uint16_t)p->metrics_port,
                                      .metrics = p->metrics,
                                      .collect = collect,
                                      .health = health,
                                      .arg = s};
        const hpd_status_t st = hpd_http_create(&hp, &s->http);
        if (st != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: --metrics-port %d: cannot listen on %s",
                          p->name, p->metrics_port, p->host);
            hpd_service_destroy(s);
            return st;
        }
    }
    evsignal_add(s->sig_int, NULL);
    evsignal_add(s->sig_term, NULL);
    evsignal_add(s->sig_usr1, NULL);
    if (s->sig_hup != NULL)
        evsignal_add(s->sig_hup, NULL);
    *svc_p = s;
    return HPD_OK;
}

uint16_t hpd_service_http_port(const hpd_service_t *s)
{
    return s->http != NULL ? hpd_http_port(s->http) : 0;
}

bool hpd_service_draining(const hpd_service_t *s)
{
    return s->draining;
}

bool hpd_service_restarting(const hpd_service_t *s)
{
    return s->restarting;
}

void hpd_service_destroy(hpd_service_t *s)
{
    if (s == NULL)
        return;
    hpd_http_destroy(s->http);
    struct event *evs[] = {s->sig_int, s->sig_term, s->sig_hup, s->sig_usr1, s->drain_ev};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(evs); i++)
        if (evs[i] != NULL)
            event_free(evs[i]);
    free(s);
}
