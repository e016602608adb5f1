/* hpd-coordinator: the coordinator (coordinator/coordinator.h) in the
 * service shell (service/service.h): options, signals, the drain,
 * /metrics and /healthz. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator.h"
#include "service/service.h"

#define LOG_COMPONENT "coordinator"
#define NOTICE_FLUSH_MS 200

typedef struct {
    hpd_coord_opts_t c;
    const char *port_file;
    int32_t metrics_port; /* -1: no HTTP endpoint */
    uint32_t drain_timeout_ms;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hpd-coordinator [options]\n"
            "  --host ADDR            address to bind (127.0.0.1)\n"
            "  --port N               port, 0 = any free port (7000)\n"
            "  --port-file F          write the bound port to F once listening\n"
            "  --token-file F         the node secret (first line); also the client key\n"
            "                         without --client-keys-file\n"
            "  --client-keys-file F   client API keys, one per line: KEY [TENANT]; read\n"
            "                         again on SIGHUP (a removed key's connections close)\n"
            "  --heartbeat-ms N       node heartbeat period (500)\n"
            "  --lease-ms N           a node silent this long is lost; more than the\n"
            "                         longest engine step (10000)\n"
            "  --liveness-ms N        a node whose pinger thread is silent this long is\n"
            "                         lost (stopped or hung process); 0 = off (500)\n"
            "  --max-requests N       requests in flight before 'overloaded' (256)\n"
            "  --queue-timeout-ms N   a request no node can take fails after (60000)\n"
            "  --max-attempts N       attempts per request across failures (4)\n"
            "  --metrics-port N       serve /metrics and /healthz over HTTP on --host\n"
            "  --drain-timeout-ms N   on SIGTERM, open requests may finish this long (30000)\n"
            "  --max-connections N    open RPC connections, clients and nodes; half at most\n"
            "                         unauthenticated (1024, or what the fd limit allows)\n"
            "  --log-level L          error|warn|info|debug (info)\n");
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    enum { O_HOST = 256, O_PORT, O_PORTFILE, O_TOKEN, O_HB, O_LEASE, O_MAXREQ, O_QTIMEOUT,
           O_ATTEMPTS, O_LOG, O_METRICS, O_DRAIN, O_MAXCONN, O_KEYS, O_LIVENESS, O_HELP };
    static const struct option longopts[] = {
        {"host", 1, 0, O_HOST}, {"port", 1, 0, O_PORT}, {"port-file", 1, 0, O_PORTFILE},
        {"token-file", 1, 0, O_TOKEN}, {"heartbeat-ms", 1, 0, O_HB}, {"lease-ms", 1, 0, O_LEASE},
        {"max-requests", 1, 0, O_MAXREQ}, {"queue-timeout-ms", 1, 0, O_QTIMEOUT},
        {"max-attempts", 1, 0, O_ATTEMPTS}, {"log-level", 1, 0, O_LOG},
        {"metrics-port", 1, 0, O_METRICS}, {"drain-timeout-ms", 1, 0, O_DRAIN},
        {"max-connections", 1, 0, O_MAXCONN}, {"client-keys-file", 1, 0, O_KEYS},
        {"liveness-ms", 1, 0, O_LIVENESS},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    struct {
        int opt;
        const char *flag;
        uint64_t min, max;
        uint32_t *dst;
    } nums[] = {{O_HB, "--heartbeat-ms", 10, 60000, &o->c.heartbeat_ms},
                {O_LEASE, "--lease-ms", 30, 600000, &o->c.lease_ms},
                {O_LIVENESS, "--liveness-ms", 0, 600000, &o->c.liveness_ms},
                {O_MAXREQ, "--max-requests", 1, 1u << 24, &o->c.max_requests},
                {O_QTIMEOUT, "--queue-timeout-ms", 1, UINT32_MAX, &o->c.queue_timeout_ms},
                {O_ATTEMPTS, "--max-attempts", 1, 100, &o->c.max_attempts},
                {O_DRAIN, "--drain-timeout-ms", 0, UINT32_MAX, &o->drain_timeout_ms},
                {O_MAXCONN, "--max-connections", 4, 1u << 20, &o->c.max_connections}};
    uint64_t v;
    int c, lvl;

    *o = (opts_t){.c.host = "127.0.0.1",
                  .c.port = 7000,
                  .c.heartbeat_ms = 500,
                  .c.lease_ms = 10000,
                  .c.liveness_ms = 500,
                  .c.max_requests = 256,
                  .c.queue_timeout_ms = 60000,
                  .c.max_attempts = 4,
                  .metrics_port = -1,
                  .drain_timeout_ms = 30000};
    hpd_log_set_level(HPD_LOG_LEVEL_INFO);
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool done = false;
        for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
            if (nums[i].opt != c)
                continue;
            if (hpd_parse_u64(optarg, nums[i].min, nums[i].max, &v) != 0) {
                fprintf(stderr, "%s: '%s' is invalid (expected an integer from %llu to %llu)\n",
                        nums[i].flag, optarg, (unsigned long long)nums[i].min,
                        (unsigned long long)nums[i].max);
                return -1;
            }
            *nums[i].dst = (uint32_t)v;
            done = true;
        }
        if (done)
            continue;
        switch (c) {
        case O_HOST: o->c.host = optarg; break;
        case O_PORT:
            if (hpd_parse_u64(optarg, 0, 65535, &v) != 0) {
                fprintf(stderr, "--port: '%s' is invalid (expected 0 to 65535)\n", optarg);
                return -1;
            }
            o->c.port = (uint16_t)v;
            break;
        case O_METRICS:
            if (hpd_parse_u64(optarg, 0, 65535, &v) != 0) {
                fprintf(stderr, "--metrics-port: '%s' is invalid (expected 0 to 65535)\n",
                        optarg);
                return -1;
            }
            o->metrics_port = (int32_t)v;
            break;
        case O_PORTFILE: o->port_file = optarg; break;
        case O_TOKEN: o->c.token_file = optarg; break;
        case O_KEYS: o->c.client_keys_file = optarg; break;
        case O_LOG:
            if ((lvl = hpd_log_level_parse(optarg)) < 0) {
                fprintf(stderr, "--log-level: '%s' is invalid (expected error, warn, info or "
                                "debug)\n", optarg);
                return -1;
            }
            hpd_log_set_level((hpd_log_level_t)lvl);
            break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->c.client_keys_file != NULL && o->c.token_file == NULL) {
        fprintf(stderr, "--client-keys-file needs --token-file (the node secret)\n");
        return -1;
    }
    if (o->c.lease_ms <= o->c.heartbeat_ms) {
        fprintf(stderr, "--lease-ms %u must exceed --heartbeat-ms %u\n", o->c.lease_ms,
                o->c.heartbeat_ms);
        return -1;
    }
    return 0;
}


typedef struct {
    hpd_coord_t *coord;
    struct event_base *base;
} app_t;

static void collect(void *arg)
{
    hpd_coord_collect(((app_t *)arg)->coord);
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
    hpd_coord_end_drain(a->coord);
    event_base_loopexit(a->base, &flush);
}

static void reload(void *arg)
{
    hpd_coord_reload(((app_t *)arg)->coord);
}

int main(int argc, char **argv)
{
    opts_t o;
    app_t a = {0};
    hpd_service_t *svc = NULL;
    char err[400];
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    if (parse_opts(argc, argv, &o) != 0)
        return 2;
    if ((a.base = event_base_new()) == NULL)
        return 1;
    if (hpd_coord_create(a.base, &o.c, &a.coord, err, sizeof(err)) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s", err);
        rc = 2;
        goto out;
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
    if (o.metrics_port >= 0)
        HPD_LOG_INFO(LOG_COMPONENT, "listening on %s:%u, metrics and health on http port %u",
                     o.c.host, hpd_coord_port(a.coord), hpd_service_http_port(svc));
    else
        HPD_LOG_INFO(LOG_COMPONENT, "listening on %s:%u", o.c.host, hpd_coord_port(a.coord));
    event_base_dispatch(a.base);
    rc = 0;
out:
    hpd_service_destroy(svc);
    hpd_coord_destroy(a.coord);
    event_base_free(a.base);
    return rc;
}
