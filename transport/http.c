#include "transport/http.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "transport/http_guard.h"

#define LOG_COMPONENT "http"

struct hpd_http {
    hpd_http_params_t p;
    struct evhttp *http;
    hpd_http_guard_t *guard;
    uint16_t port;
};

static void reply_text(struct evhttp_request *req, int code, const char *reason,
                       const char *type, const char *text, size_t len)
{
    struct evbuffer *out = evbuffer_new();
    if (out == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
    evbuffer_add(out, text, len);
    evhttp_send_reply(req, code, reason, out);
    evbuffer_free(out);
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
    hpd_http_t *h = arg;
    size_t len = 0;
    char *text;
    if (h->p.collect != NULL)
        h->p.collect(h->p.arg);
    if ((text = hpd_metrics_render(h->p.metrics, &len)) == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
        return;
    }
    reply_text(req, HTTP_OK, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static void on_health(struct evhttp_request *req, void *arg)
{
    hpd_http_t *h = arg;
    char msg[256] = "ok";
    bool ok = true;
    if (h->p.health != NULL)
        ok = h->p.health(h->p.arg, msg, sizeof(msg) - 1);
    size_t len = strnlen(msg, sizeof(msg) - 1);
    msg[len++] = '\n';
    reply_text(req, ok ? HTTP_OK : 503, ok ? "OK" : "Service Unavailable",
               "text/plain; charset=utf-8", msg, len);
}

/* Every GET without a body passes (nothing here needs a key); the rest is
 * answered before evhttp reads it. */
static hpd_http_verdict_t screen(void *arg, const hpd_http_head_t *head, hpd_http_answer_t *a)
{
    if (strcmp(head->method, "GET") == 0 && !head->has_body)
        return HPD_HTTP_PUBLIC;
    a->status = strcmp(head->method, "GET") != 0 ? 405 : 413;
    snprintf(a->body, sizeof(a->body), "%s %s: only GET /metrics and /healthz, without a body\n",
             head->method, head->path);
    return HPD_HTTP_REJECT;
}

hpd_status_t hpd_http_create(const hpd_http_params_t *params, hpd_http_t **http_p)
{
    hpd_http_t *h = calloc(1, sizeof(*h));

    if (h == NULL)
        return HPD_ERR_NO_MEMORY;
    h->p = *params;
    if ((h->http = evhttp_new(params->base)) == NULL)
        goto err_free;
    /* only GET (libevent answers any other method itself, 501); requests
     * are small, so a peer cannot make it buffer more than these bounds */
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET);
    evhttp_set_max_headers_size(h->http, HPD_HTTP_MAX_HEADERS);
    evhttp_set_max_body_size(h->http, HPD_HTTP_MAX_BODY);
    evhttp_set_timeout(h->http, 10);
    evhttp_set_cb(h->http, "/metrics", on_metrics, h);
    evhttp_set_cb(h->http, "/healthz", on_health, h);
    /* the operator's way in: its own small reserve of the process's
     * descriptors, a few unauthenticated connections, 5 s for a request */
    const hpd_http_guard_params_t gp = {.base = params->base,
                                        .budget = params->budget,
                                        .cls = HPD_CONN_OPERATOR,
                                        .name = "metrics",
                                        .max_unauthed = 16,
                                        .max_head = HPD_HTTP_MAX_HEADERS,
                                        .screen = screen};
    if (hpd_http_guard_create(h->http, &gp, &h->guard) != HPD_OK) {
        evhttp_free(h->http);
        goto err_free;
    }
    if (hpd_http_guard_bind(h->guard, params->host, params->port, &h->port) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot serve http on %s:%u (address in use or invalid)",
                      params->host, params->port);
        evhttp_free(h->http);
        hpd_http_guard_destroy(h->guard);
        free(h);
        return HPD_ERR_IO;
    }
    *http_p = h;
    return HPD_OK;
err_free:
    free(h);
    return HPD_ERR_NO_MEMORY;
}

uint16_t hpd_http_port(const hpd_http_t *h)
{
    return h->port;
}

void hpd_http_destroy(hpd_http_t *h)
{
    if (h == NULL)
        return;
    evhttp_free(h->http);
    hpd_http_guard_destroy(h->guard);
    free(h);
}

/* ------------------------------------------------------------ GET */

typedef struct {
    struct event_base *base;
    bool done;
    int code;
    char *body;
} get_ctx_t;

static void on_get_done(struct evhttp_request *req, void *arg)
{
    get_ctx_t *g = arg;
    g->done = true;
    if (req == NULL || evhttp_request_get_response_code(req) == 0) {
        g->code = 0; /* no connection or no answer */
    } else {
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t len = evbuffer_get_length(in);
        g->code = evhttp_request_get_response_code(req);
        if ((g->body = malloc(len + 1)) != NULL) {
            evbuffer_remove(in, g->body, len);
            g->body[len] = '\0';
        }
    }
    event_base_loopbreak(g->base);
}

hpd_status_t hpd_http_get(const char *host, uint16_t port, const char *path, uint32_t timeout_ms,
                          int *code_p, char **body_p)
{
    get_ctx_t g = {0};
    struct evhttp_connection *conn = NULL;
    struct evhttp_request *req;
    hpd_status_t st = HPD_ERR_IO;
    const struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};

    if ((g.base = event_base_new()) == NULL)
        return HPD_ERR_NO_MEMORY;
    if ((conn = evhttp_connection_base_new(g.base, NULL, host, port)) == NULL)
        goto out;
    evhttp_connection_set_timeout_tv(conn, &tv);
    evhttp_connection_set_retries(conn, 0);
    if ((req = evhttp_request_new(on_get_done, &g)) == NULL)
        goto out;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
    if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, path) != 0)
        goto out; /* the request was freed */
    event_base_loopexit(g.base, &tv);
    event_base_dispatch(g.base);
    if (!g.done) {
        st = HPD_ERR_TIMEOUT;
    } else if (g.code != 0) {
        st = HPD_OK;
        *code_p = g.code;
        if (body_p != NULL) {
            *body_p = g.body;
            g.body = NULL;
        }
    }
out:
    free(g.body);
    if (conn != NULL)
        evhttp_connection_free(conn); /* frees a request still pending */
    event_base_free(g.base);
    return st;
}
