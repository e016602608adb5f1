/* hpd-coordinator: the coordinator (coordinator/coordinator.h) in the
 * service shell (service/service.h): options, signals, the drain,
 * /metrics and /healthz. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/options.h"
#include "common/util.h"
#include "coordinator/coordinator.h"
#include "coordinator/election.h"
#include "coordinator/openai.h"
#include "service/service.h"

#define LOG_COMPONENT "coordinator"
#define NOTICE_FLUSH_MS 200

typedef struct {
    hpd_coord_opts_t c;
    const char *port_file;
    int32_t metrics_port; /* -1: no HTTP endpoint */
    int32_t http_port;    /* -1: no OpenAI-compatible API */
    const char *model, *served_model_name, *http_port_file, *thinking;
    uint32_t drain_timeout_ms;
    const char *etcd, *etcd_key;
    uint32_t etcd_ttl_s;
} opts_t;

/* The coordinator's options (common/options.h has them all). Returns as
 * hpd_opt_parse. */
static int parse_opts(int argc, char **argv, opts_t *o)
{
    hpd_log_level_t level = HPD_LOG_LEVEL_INFO;
    bool gen_defaults = true;
    const hpd_opt_bind_t binds[] = {
        HPD_OPT_BIND("host", &o->c.host),
        {.name = "port", .dst = &o->c.port, .def = "7000"},
        HPD_OPT_BIND("port-file", &o->port_file),
        HPD_OPT_BIND("token-file", &o->c.token_file),
        HPD_OPT_BIND("client-keys-file", &o->c.client_keys_file),
        HPD_OPT_BIND("heartbeat-ms", &o->c.heartbeat_ms),
        HPD_OPT_BIND("lease-ms", &o->c.lease_ms),
        HPD_OPT_BIND("liveness-ms", &o->c.liveness_ms),
        HPD_OPT_BIND("max-requests", &o->c.max_requests),
        HPD_OPT_BIND("queue-timeout-ms", &o->c.queue_timeout_ms),
        HPD_OPT_BIND("max-attempts", &o->c.max_attempts),
        HPD_OPT_BIND("metrics-port", &o->metrics_port),
        HPD_OPT_BIND("http-port", &o->http_port),
        HPD_OPT_BIND("model", &o->model),
        HPD_OPT_BIND("served-model-name", &o->served_model_name),
        HPD_OPT_BIND("thinking", &o->thinking),
        HPD_OPT_BIND("http-port-file", &o->http_port_file),
        HPD_OPT_BIND("drain-timeout-ms", &o->drain_timeout_ms),
        HPD_OPT_BIND("max-connections", &o->c.max_connections),
        HPD_OPT_BIND("scheduler", &o->c.scheduler),
        HPD_OPT_BIND("advertise", &o->c.advertise),
        HPD_OPT_BIND("etcd", &o->etcd),
        HPD_OPT_BIND("etcd-key", &o->etcd_key),
        HPD_OPT_BIND("etcd-ttl-s", &o->etcd_ttl_s),
        HPD_OPT_BIND("no-generation-defaults", &gen_defaults),
        HPD_OPT_BIND("log-level", &level),
    };
    *o = (opts_t){0};
    const int rc = hpd_opt_parse(argc, argv, "hpd-coordinator", HPD_OPT_ROLE_COORD,
                                 "usage: hpd-coordinator [options]", binds,
                                 HPD_ARRAY_SIZE(binds));
    if (rc != 0)
        return rc;
    hpd_log_set_level(level);
    o->c.no_generation_defaults = !gen_defaults;
    if (o->thinking != NULL) {
        if (strcmp(o->thinking, "on") != 0 && strcmp(o->thinking, "off") != 0) {
            fprintf(stderr, "hpd-coordinator: --thinking '%s' is invalid (expected on or off)\n",
                    o->thinking);
            return -1;
        }
        o->c.default_thinking = strcmp(o->thinking, "on") == 0 ? 1 : 2;
    }
    o->c.model_dir = o->model;
    if (o->c.token_file != NULL && o->c.client_keys_file == NULL) {
        fprintf(stderr, "hpd-coordinator: --token-file needs --client-keys-file: the node secret "
                "is not a client key, so no client could connect (hpdctl up writes a keys file "
                "beside the token; docs/cluster.md, \"Credentials\")\n");
        return -1;
    }
    if (o->c.client_keys_file != NULL && o->c.token_file == NULL) {
        fprintf(stderr, "hpd-coordinator: --client-keys-file needs --token-file (the node "
                "secret)\n");
        return -1;
    }
    if (o->http_port >= 0 && o->model == NULL) {
        fprintf(stderr, "hpd-coordinator: --http-port needs --model DIR (its tokenizer.json "
                "and chat template)\n");
        return -1;
    }
    if (o->c.lease_ms <= o->c.heartbeat_ms) {
        fprintf(stderr, "hpd-coordinator: --lease-ms %u must exceed --heartbeat-ms %u\n",
                o->c.lease_ms, o->c.heartbeat_ms);
        return -1;
    }
    if (o->c.scheduler != NULL && o->etcd != NULL) {
        fprintf(stderr, "hpd-coordinator: a front door (--scheduler) is not elected: give it "
                "the scheduler and its standbys, not --etcd\n");
        return -1;
    }
    return 0;
}

typedef struct {
    hpd_coord_t *coord;
    hpd_openai_t *api;
    hpd_service_t *svc;
    struct event_base *base;
    hpd_election_t *election; /* NULL: no --etcd */
    struct event *lost, *check;
} app_t;

/* A standby holds nothing: asked to stop while it waits to lead, it ends
 * at once, as a drained coordinator does (exit 0). */
static void on_standby_signal(int sig)
{
    (void)sig;
    _exit(0);
}

static bool leading(void *arg)
{
    return hpd_election_leads(arg);
}

/* Leadership lost (its lease could not be renewed in time): the process
 * ends at once, serving nothing more; a standby leads (docs/cluster.md). */
static void on_lost(evutil_socket_t fd, short what, void *arg)
{
    app_t *a = arg;
    if (hpd_election_leads(a->election))
        return;
    HPD_LOG_ERROR(LOG_COMPONENT, "no longer the leader (%s): stopping now",
                  hpd_election_why(a->election)[0] ? hpd_election_why(a->election)
                                                   : "its lease ran out");
    _exit(3);
}

static void collect(void *arg)
{
    app_t *a = arg;
    hpd_coord_collect(a->coord);
    if (a->api != NULL)
        hpd_openai_collect(a->api);
}

static bool health(void *arg, char *msg, size_t len)
{
    return hpd_coord_health(((app_t *)arg)->coord, msg, len);
}

static bool drain(void *arg)
{
    hpd_coord_drain(((app_t *)arg)->coord);
    return true;
}

static uint32_t in_flight(void *arg)
{
    return hpd_coord_open_requests(((app_t *)arg)->coord);
}

/* The end of a drain: nodes are told to stop (they exit 0), then the loop
 * ends once those notices are flushed. */
static void drained(void *arg, uint32_t left)
{
    app_t *a = arg;
    static const struct timeval flush = {0, NOTICE_FLUSH_MS * 1000};
    hpd_coord_end_drain(a->coord, !hpd_service_restarting(a->svc)); /* SIGUSR1: a restart */
    event_base_loopexit(a->base, &flush);
}

static void reload(void *arg)
{
    app_t *a = arg;
    hpd_coord_reload(a->coord);
    if (a->api != NULL) {
        const uint32_t n = hpd_openai_reload(a->api);
        HPD_LOG_INFO(LOG_COMPONENT, "SIGHUP: %u HTTP connections of revoked keys closed", n);
    }
}

int main(int argc, char **argv)
{
    opts_t o;
    app_t a = {0};
    hpd_service_t *svc = NULL;
    char err[400];
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    const int prc = parse_opts(argc, argv, &o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    if ((a.base = event_base_new()) == NULL)
        return 1;
    if (o.etcd != NULL) {
        /* a standby: nothing listens until this process leads */
        const hpd_election_params_t ep = {.endpoint = o.etcd,
                                          .key = o.etcd_key,
                                          .ttl_s = o.etcd_ttl_s,
                                          .name = "coordinator"};
        if (hpd_election_create(&ep, &a.election, err, sizeof(err)) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s", err);
            rc = 2;
            goto out;
        }
        HPD_LOG_INFO(LOG_COMPONENT, "campaigning for %s at %s (lease %u s)", o.etcd_key, o.etcd,
                     o.etcd_ttl_s);
        struct sigaction sa = {.sa_handler = on_standby_signal}, term_was, int_was;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, &term_was);
        sigaction(SIGINT, &sa, &int_was);
        const bool leads = hpd_election_wait(a.election);
        sigaction(SIGTERM, &term_was, NULL); /* the service shell's own come later */
        sigaction(SIGINT, &int_was, NULL);
        if (!leads)
            goto out;
        o.c.leading = leading;
        o.c.leading_arg = a.election;
        /* checked often: a leader stopped (SIGSTOP) past its lease ends on
         * its first turn of the loop after it runs again */
        static const struct timeval often = {0, 20000};
        if ((a.lost = event_new(a.base, hpd_election_fd(a.election), EV_READ | EV_PERSIST,
                                on_lost, &a)) == NULL ||
            event_add(a.lost, NULL) != 0) {
            rc = 2;
            goto out;
        }
        if ((a.check = event_new(a.base, -1, EV_PERSIST, on_lost, &a)) == NULL ||
            event_add(a.check, &often) != 0) {
            rc = 2;
            goto out;
        }
    }
    if (hpd_coord_create(a.base, &o.c, &a.coord, err, sizeof(err)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s", err);
        rc = 2;
        goto out;
    }
    if (o.http_port >= 0) {
        const hpd_openai_params_t ap = {.base = a.base,
                                        .coord = a.coord,
                                        .host = o.c.host,
                                        .port = (uint16_t)o.http_port,
                                        .model_dir = o.model,
                                        .model_name = o.served_model_name};
        if (hpd_openai_create(&ap, &a.api, err, sizeof(err)) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s", err);
            rc = 2;
            goto out;
        }
        HPD_LOG_INFO(LOG_COMPONENT, "OpenAI-compatible API on http://%s:%u/v1, model '%s'",
                     o.c.host, hpd_openai_port(a.api), hpd_openai_model(a.api));
        char text[16];
        const int len = snprintf(text, sizeof(text), "%u\n", hpd_openai_port(a.api));
        if (o.http_port_file != NULL &&
            hpd_write_file(o.http_port_file, text, (size_t)len) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "cannot write the port file %s", o.http_port_file);
            goto out;
        }
    }
    if (a.election != NULL) { /* where the nodes and clients find the leader */
        char addr[128];
        snprintf(addr, sizeof(addr), "%s:%u", o.c.host != NULL ? o.c.host : "127.0.0.1",
                 hpd_coord_port(a.coord));
        if (hpd_election_publish(a.election, addr) != HPD_OK) {
            rc = 3;
            goto out;
        }
    }
    if (o.port_file != NULL) {
        char text[16];
        const int len = snprintf(text, sizeof(text), "%u\n", hpd_coord_port(a.coord));
        if (hpd_write_file(o.port_file, text, (size_t)len) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "cannot write the port file %s", o.port_file);
            goto out;
        }
    }
    const hpd_service_params_t sp = {.base = a.base,
                                     .name = "coordinator",
                                     .host = o.c.host,
                                     .metrics_port = o.metrics_port,
                                     .metrics = hpd_coord_metrics(a.coord),
                                     .drain_timeout_ms = o.drain_timeout_ms,
                                     .arg = &a,
                                     .collect = collect,
                                     .health = health,
                                     .drain = drain,
                                     .in_flight = in_flight,
                                     .drained = drained,
                                     .reload = reload};
    if (hpd_service_create(&sp, &svc) != HPD_OK) {
        rc = 2;
        goto out;
    }
    a.svc = svc;
    if (o.metrics_port >= 0)
        HPD_LOG_INFO(LOG_COMPONENT, "listening on %s:%u, metrics and health on http port %u",
                     o.c.host, hpd_coord_port(a.coord), hpd_service_http_port(svc));
    else
        HPD_LOG_INFO(LOG_COMPONENT, "listening on %s:%u", o.c.host, hpd_coord_port(a.coord));
    event_base_dispatch(a.base);
    rc = 0;
out:
    hpd_service_destroy(svc);
    hpd_coord_destroy(a.coord); /* ends every request, HTTP ones too */
    hpd_openai_destroy(a.api);
    hpd_election_destroy(a.election); /* the lease goes back: a standby leads now */
    if (a.lost != NULL)
        event_free(a.lost);
    if (a.check != NULL)
        event_free(a.check);
    event_base_free(a.base);
    return rc;
}
