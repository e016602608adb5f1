/* The guard in front of an evhttp server (transport/http_guard.h).
 *
 * evhttp (libevent 2.1) has no hook between a request's head and its body,
 * nor a connection limit; but it lets the owner make each connection's
 * bufferevent (evhttp_set_bevcb), from its accept, for the connection being
 * accepted. The guard's bufferevent has an input callback of the guard's,
 * which runs as bytes arrive and before the bufferevent decides whether to
 * wake evhttp: with the low read watermark out of reach evhttp is never
 * woken, until the head was screened and admitted.
 *
 * Who frees what: evhttp owns its connection and frees it (at its end, or
 * when the guard asks it to with evhttp_connection_free from a timer of the
 * guard's, never from inside an evhttp callback). Its close callback, which
 * evhttp_connection_free calls first, is the guard's: it frees the guard's
 * conn_t. Until that callback is set (the connection's first turn of the
 * loop, before any of its I/O) the guard holds a reference on the
 * bufferevent, so that it stays valid. */
#define _GNU_SOURCE /* memmem */
#include "transport/http_guard.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <ctype.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "http"
#define LINGER_MS 1000 /* a rejected client's time to read its answer */
#define ACCEPT_PAUSE_MS 100
#define LISTEN_BACKLOG 4096 /* the kernel caps it at net.core.somaxconn */
/* a connection's time to send its head before a newer one may evict it:
 * a burst of connects must not evict one that had no turn to be read */
#define EVICT_GRACE_S 0.25
#define BURST 4

enum { C_HEAD, C_PASS, C_PUBLIC, C_REJECTING };

#define NO_WAKE ((size_t)1 << 62) /* a low read watermark evhttp never reaches */

typedef struct gconn {
    hpd_http_guard_t *g;
    struct bufferevent *bev;
    struct evhttp_connection *evcon; /* known from its first turn of the loop */
    struct evbuffer_cb_entry *in_cb, *out_cb;
    int state;
    bool started;  /* its first turn ran: the close callback is the guard's */
    bool unauthed; /* counted in n_unauthed */
    bool has_fd;   /* holds a descriptor of the budget */
    bool closing;  /* its close is scheduled or done */
    bool refuse;   /* no descriptor for it: answered 503 from the timer */
    bool answered; /* public or rejected: its answer went out */
    bool ready;    /* a complete head was waiting at its first turn */
    bool in_input; /* inside its input callback (which drains) */
    size_t held;   /* bytes counted in the budget */
    uint64_t credential;
    double opened; /* hpd_time_now() at its accept */
    void (*user_closecb)(struct evhttp_connection *, void *);
    void *user_closecb_arg;
    struct event *timer; /* the first turn, the head's deadline, the linger, a close */
    struct gconn *prev, *next;
} gconn_t;

struct hpd_http_guard {
    hpd_http_guard_params_t p;
    struct evhttp *http;
    hpd_conn_budget_t *budget;
    struct evconnlistener *listener;
    struct event *resume;
    gconn_t *conns; /* newest first */
    uint32_t n_unauthed, max_unauthed, head_timeout_ms;
    size_t max_head;
    double last_warn;
    hpd_http_guard_stats_t st;
    struct hpd_http_guard *next_guard;
};

/* evconnlistener's error callback gets evhttp as its argument: the guard of
 * an evhttp is found here (listeners run on the main loops only). */
static hpd_http_guard_t *guards;

/* One warning a second at most: a flood must not flood the log too. */
static bool warn_now(hpd_http_guard_t *g)
{
    const double now = hpd_time_now();
    if (now - g->last_warn < 1.0)
        return false;
    g->last_warn = now;
    return true;
}

/* Gives back its place among the unauthenticated and the bytes of its
 * head held so far (idempotent). */
static void release_unauthed(gconn_t *c)
{
    hpd_http_guard_t *g = c->g;
    if (c->unauthed) {
        c->unauthed = false;
        g->n_unauthed--;
    }
    if (c->held > 0) {
        hpd_conn_budget_unhold(g->budget, c->held);
        c->held = 0;
    }
}

/* Gives back what the connection holds of the budget (idempotent). */
static void release(gconn_t *c)
{
    hpd_http_guard_t *g = c->g;
    release_unauthed(c);
    if (c->has_fd) {
        c->has_fd = false;
        hpd_conn_budget_give(g->budget, g->p.cls);
    }
}

static void conn_free(gconn_t *c)
{
    hpd_http_guard_t *g = c->g;
    release(c);
    if (c->in_cb != NULL)
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->in_cb);
    if (c->out_cb != NULL)
        evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->out_cb);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        g->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    event_free(c->timer);
    free(c);
}

/* evhttp frees the connection: the owner's close callback, then the
 * guard's conn_t. */
static void on_evcon_close(struct evhttp_connection *evcon, void *arg)
{
    gconn_t *c = arg;
    if (c->user_closecb != NULL)
        c->user_closecb(evcon, c->user_closecb_arg);
    conn_free(c);
}

static void close_now(gconn_t *c)
{
    release(c);
    c->closing = true;
    event_del(c->timer);
    if (c->evcon != NULL)
        evhttp_connection_free(c->evcon); /* on_evcon_close frees c */
}

/* A close from the loop, not from the caller's stack (which may be evhttp's). */
static void schedule_close(gconn_t *c)
{
    release(c);
    c->closing = true;
    event_del(c->timer);
    event_active(c->timer, EV_TIMEOUT, 1);
}

/* Whether a complete head waits in the socket, not read yet. */
static bool head_waiting(const gconn_t *c)
{
    char peek[2048];
    const evutil_socket_t fd = bufferevent_getfd(c->bev);
    const ssize_t n = fd >= 0 ? recv(fd, peek, sizeof(peek), MSG_PEEK | MSG_DONTWAIT) : -1;
    return n > 0 && (memmem(peek, (size_t)n, "\r\n\r\n", 4) != NULL ||
                     memmem(peek, (size_t)n, "\n\n", 2) != NULL);
}

/* Closes the oldest connection that is still waiting for its head, if it
 * had EVICT_GRACE_S to send it (with force: any that had its first turn).
 * One whose complete head waits in its socket (it comes with the next
 * read) is kept. */
static bool evict_oldest(hpd_http_guard_t *g, bool force)
{
    gconn_t *c = g->conns;
    const double now = hpd_time_now();
    while (c != NULL && c->next != NULL)
        c = c->next;
    for (; c != NULL; c = c->prev) { /* oldest first */
        if (!c->unauthed || c->closing || c->state != C_HEAD || c->ready ||
            !(force ? c->started : now - c->opened >= EVICT_GRACE_S))
            continue;
        if (c->started && head_waiting(c)) {
            c->ready = true;
            continue;
        }
        break;
    }
    gconn_t *oldest = c;
    if (oldest == NULL)
        return false;
    g->st.evicted++;
    HPD_LOG_DEBUG(LOG_COMPONENT, "%s: %u connections have not authenticated (limit %u): "
                  "closing the oldest", g->p.name, g->n_unauthed, g->max_unauthed);
    schedule_close(oldest);
    return true;
}

/* The output of a public or rejected request: once it is out, the client
 * gets the end of the stream (and closes: evhttp then frees the
 * connection) or the linger timer closes it. */
static void on_output(struct evbuffer *out, const struct evbuffer_cb_info *info, void *arg)
{
    static const struct timeval linger = {0, LINGER_MS * 1000};
    gconn_t *c = arg;
    if (info->n_added > 0 || evbuffer_get_length(out) > 0 || c->answered || c->closing ||
        (c->state != C_REJECTING && c->state != C_PUBLIC))
        return;
    c->answered = true;
    const evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd >= 0)
        shutdown(fd, SHUT_WR);
    event_del(c->timer);
    evtimer_add(c->timer, &linger);
}

static const char *reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

/* Answers with status and body, drops what else comes, closes after the
 * answer is out (on_output), or after LINGER_MS. */
static void reject(gconn_t *c, int status, const char *type, const char *body)
{
    static const struct timeval linger = {0, LINGER_MS * 1000};
    hpd_http_guard_t *g = c->g;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    char head[256];
    const size_t blen = strlen(body);
    const int n = snprintf(head, sizeof(head),
                           "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                           "Connection: close\r\n\r\n",
                           status, reason(status), type != NULL ? type : "text/plain", blen);
    release(c);
    g->st.rejected++;
    c->state = C_REJECTING;
    if (!c->in_input)
        evbuffer_drain(in, evbuffer_get_length(in));
    event_del(c->timer);
    evtimer_add(c->timer, &linger);
    /* evhttp, waiting for a request line, has the write side off */
    bufferevent_enable(c->bev, EV_WRITE);
    bufferevent_write(c->bev, head, (size_t)n);
    bufferevent_write(c->bev, body, blen);
}

/* ------------------------------------------------------------ the head */

/* The value of header `name` in the head's lines, trimmed, into buf;
 * false when absent. */
static bool header(const char *head, size_t len, const char *name, char *buf, size_t cap)
{
    const size_t nlen = strlen(name);
    const char *p = memchr(head, '\n', len), *end = head + len;
    while (p != NULL && p + 1 < end) {
        const char *line = p + 1;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL)
            eol = end;
        if ((size_t)(eol - line) > nlen && line[nlen] == ':' &&
            strncasecmp(line, name, nlen) == 0) {
            const char *v = line + nlen + 1, *e = eol;
            while (v < e && (*v == ' ' || *v == '\t'))
                v++;
            while (e > v && isspace((unsigned char)e[-1]))
                e--;
            const size_t n = HPD_MIN((size_t)(e - v), cap - 1);
            memcpy(buf, v, n);
            buf[n] = '\0';
            return true;
        }
        p = eol < end ? eol : NULL;
    }
    return false;
}

/* Parses the head's request line and the headers the screen needs; false
 * when the request line or the Content-Length is malformed. */
static bool parse_head(const char *head, size_t len, char *method, size_t mcap, char *path,
                       size_t pcap, char *auth, size_t acap, hpd_http_head_t *h)
{
    const char *eol = memchr(head, '\n', len);
    const size_t llen = eol != NULL ? (size_t)(eol - head) : len;
    const char *sp = memchr(head, ' ', llen);
    if (sp == NULL || sp == head || (size_t)(sp - head) >= mcap)
        return false;
    memcpy(method, head, (size_t)(sp - head));
    method[sp - head] = '\0';
    const char *t = sp + 1, *tend = t;
    while ((size_t)(tend - head) < llen && *tend != ' ' && *tend != '?' && *tend != '\r')
        tend++;
    if (tend == t)
        return false;
    const size_t n = HPD_MIN((size_t)(tend - t), pcap - 1);
    memcpy(path, t, n);
    path[n] = '\0';
    char v[64];
    bool body = false;
    if (header(head, len, "Content-Length", v, sizeof(v))) {
        char *e;
        if (!isdigit((unsigned char)v[0]))
            return false; /* evhttp refuses it too (400) */
        body = strtoull(v, &e, 10) > 0 || *e != '\0';
    }
    if (header(head, len, "Transfer-Encoding", v, sizeof(v)))
        body = true;
    *h = (hpd_http_head_t){.method = method,
                           .path = path,
                           .authorization = header(head, len, "Authorization", auth, acap)
                                                ? auth
                                                : NULL,
                           .has_body = body};
    return true;
}

/* Whether the request line, once it is there, can begin a request: a
 * method of capital letters, a space, a target (the rest is evhttp's to
 * judge). Garbage is answered at once instead of waiting for a head that
 * may never end. */
static bool line_plausible(struct evbuffer *buf)
{
    struct evbuffer_ptr nl = evbuffer_search(buf, "\n", 1, NULL);
    if (nl.pos < 0)
        return true;
    const size_t n = HPD_MIN((size_t)nl.pos, (size_t)64);
    char line[64];
    evbuffer_copyout(buf, line, n);
    size_t m = 0;
    while (m < n && line[m] >= 'A' && line[m] <= 'Z')
        m++;
    return m > 0 && m < 16 && m + 1 < n && line[m] == ' ' && line[m + 1] != ' ';
}

/* Where the head in buf ends (after its blank line); 0: not complete. */
static size_t head_end(struct evbuffer *buf)
{
    struct evbuffer_ptr a = evbuffer_search(buf, "\r\n\r\n", 4, NULL);
    struct evbuffer_ptr b = evbuffer_search(buf, "\n\n", 2, NULL);
    size_t end = 0;
    if (a.pos >= 0)
        end = (size_t)a.pos + 4;
    if (b.pos >= 0 && (end == 0 || (size_t)b.pos + 2 < end))
        end = (size_t)b.pos + 2;
    return end;
}

/* A complete head at the front of in: screened. */
static void screen_head(gconn_t *c, struct evbuffer *in, size_t end)
{
    hpd_http_guard_t *g = c->g;
    char method[16], path[1024], auth[1024];
    hpd_http_head_t h;
    hpd_http_answer_t a = {.status = 403};
    const char *head = (const char *)evbuffer_pullup(in, (ev_ssize_t)end);
    if (head == NULL || !parse_head(head, end, method, sizeof(method), path, sizeof(path), auth,
                                    sizeof(auth), &h)) {
        reject(c, 400, NULL, "malformed request line or Content-Length\n");
        return;
    }
    switch (g->p.screen(g->p.arg, &h, &a)) {
    case HPD_HTTP_ADMIT:
        /* authenticated: it keeps its descriptor, not its place among the
         * unauthenticated nor its held bytes; evhttp reads it from now on */
        release_unauthed(c);
        c->credential = a.credential;
        c->state = C_PASS;
        g->st.admitted++;
        event_del(c->timer);
        bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
        return;
    case HPD_HTTP_PUBLIC:
        if (h.has_body) {
            reject(c, 413, NULL, "a request with a body needs an API key\n");
            return;
        }
        if (evbuffer_get_length(in) > end) {
            reject(c, 400, NULL, "pipelined requests need an API key\n");
            return;
        }
        hpd_conn_budget_unhold(g->budget, c->held);
        c->held = 0;
        /* evhttp reads this head; whatever follows it is dropped, and the
         * connection ends after the answer (on_output) */
        g->st.public_requests++;
        c->state = C_PUBLIC;
        bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
        return;
    case HPD_HTTP_REJECT:
    default:
        reject(c, a.status, a.content_type, a.body);
        return;
    }
}

/* Bytes came (or went): runs inside the bufferevent's read, before it
 * decides whether to wake evhttp (the low watermark). */
static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
    gconn_t *c = arg;
    hpd_http_guard_t *g = c->g;
    if (info->n_added == 0 || c->in_input || c->state == C_PASS)
        return;
    c->in_input = true;
    const size_t len = evbuffer_get_length(in);
    if (c->state != C_HEAD || c->closing) {
        /* rejected or closing; or public, its head read by evhttp in the
         * read that completed it: what comes after it is dropped */
        evbuffer_drain(in, len);
    } else {
        const size_t end = head_end(in);
        if (end > g->max_head || (end == 0 && len > g->max_head)) {
            reject(c, 431, NULL, "the request's head is too large\n");
        } else if (!line_plausible(in)) {
            reject(c, 400, NULL, "malformed request line\n");
        } else if (end == 0) {
            /* held until the head is complete: counted across the process */
            if (len > c->held && !hpd_conn_budget_hold(g->budget, len - c->held)) {
                if (warn_now(g))
                    HPD_LOG_WARN(LOG_COMPONENT, "%s: refusing a request: the bytes held "
                                 "before authentication reached the process's cap", g->p.name);
                reject(c, 503, NULL, "the server is busy\n");
            } else {
                if (len < c->held)
                    hpd_conn_budget_unhold(g->budget, c->held - len);
                c->held = len;
            }
        } else {
            screen_head(c, in, end);
        }
        if (c->state == C_REJECTING) /* reject leaves the input to its caller here */
            evbuffer_drain(in, evbuffer_get_length(in));
    }
    c->in_input = false;
}

/* ------------------------------------------------------------ connections */

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    gconn_t *c = arg;
    hpd_http_guard_t *g = c->g;
    if (!c->started) {
        /* the connection's first turn, before any of its I/O: evhttp made
         * it (its callbacks are set); the guard's close callback goes on
         * it, and the reference that kept it valid until now goes */
        bufferevent_event_cb eventcb = NULL;
        void *evcon = NULL;
        c->started = true;
        bufferevent_getcb(c->bev, NULL, NULL, &eventcb, &evcon);
        if (eventcb == NULL || evcon == NULL) { /* evhttp dropped it at once */
            struct bufferevent *bev = c->bev;
            conn_free(c);
            bufferevent_decref(bev);
            return;
        }
        c->evcon = evcon;
        evhttp_connection_set_closecb(c->evcon, on_evcon_close, c);
        bufferevent_decref(c->bev);
        /* a burst (one accept takes a whole backlog) may pass the limit,
         * so that a client in it is read at all: past BURST times it, the
         * oldest that has no complete head waiting goes */
        c->ready = head_waiting(c);
        while (g->n_unauthed > BURST * g->max_unauthed && evict_oldest(g, true))
            ;
        if (c->refuse) {
            reject(c, 503, NULL, "too many connections\n");
            return;
        }
        if (!c->closing) {
            const struct timeval tv = {g->head_timeout_ms / 1000,
                                       (g->head_timeout_ms % 1000) * 1000};
            evtimer_add(c->timer, &tv);
            return;
        }
    }
    if (c->closing) {
        close_now(c);
    } else if (c->state == C_HEAD) {
        g->st.head_timeouts++;
        HPD_LOG_DEBUG(LOG_COMPONENT, "%s: closing a connection that sent no complete request "
                      "head in %u ms", g->p.name, g->head_timeout_ms);
        close_now(c);
    } else if (c->state == C_REJECTING || c->state == C_PUBLIC) {
        close_now(c); /* the linger is over (or a public answer took too long) */
    }
}

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
    hpd_http_guard_t *g = arg;
    gconn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->g = g;
    if ((c->timer = evtimer_new(base, on_timer, c)) == NULL ||
        (c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE)) == NULL ||
        (c->in_cb = evbuffer_add_cb(bufferevent_get_input(c->bev), on_input, c)) == NULL ||
        (c->out_cb = evbuffer_add_cb(bufferevent_get_output(c->bev), on_output, c)) == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: out of memory for a connection", g->p.name);
        if (c->bev != NULL)
            bufferevent_free(c->bev);
        if (c->timer != NULL)
            event_free(c->timer);
        free(c);
        return NULL; /* evhttp makes a bufferevent of its own */
    }
    /* evhttp is not woken before the head is screened; the head has at
     * most max_head bytes */
    bufferevent_setwatermark(c->bev, EV_READ, NO_WAKE, g->max_head + 1);
    bufferevent_incref(c->bev); /* until its first turn (on_timer) */
    c->next = g->conns;
    if (g->conns != NULL)
        g->conns->prev = c;
    g->conns = c;
    /* room first from the connections that have not authenticated, the
     * oldest first once they had their grace; a burst of newer ones may
     * go past the limit up to BURST times it (one accept takes a whole
     * backlog: a client in it must get its turn to be read) */
    c->opened = hpd_time_now();
    while (g->n_unauthed >= g->max_unauthed && evict_oldest(g, false))
        ;
    c->has_fd = hpd_conn_budget_take(g->budget, g->p.cls);
    if (!c->has_fd && evict_oldest(g, true))
        c->has_fd = hpd_conn_budget_take(g->budget, g->p.cls);
    c->unauthed = true;
    g->n_unauthed++;
    if (!c->has_fd) {
        g->st.refused++;
        g->st.last_refused = hpd_time_now();
        if (warn_now(g))
            HPD_LOG_WARN(LOG_COMPONENT, "%s: refusing connections: the process's connection "
                         "budget is used up (%llu refused so far)", g->p.name,
                         (unsigned long long)g->st.refused);
        c->refuse = true;
    }
    event_active(c->timer, EV_TIMEOUT, 1);
    return c->bev;
}
/* ------------------------------------------------------------ listener */

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    hpd_http_guard_t *g = arg;
    if (g->listener != NULL)
        evconnlistener_enable(g->listener);
}

/* accept() failed (out of descriptors, most likely): accepting again at
 * once would spin, the pending connection staying. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    hpd_http_guard_t *g = guards;
    static const struct timeval pause = {0, ACCEPT_PAUSE_MS * 1000};
    const int err = EVUTIL_SOCKET_ERROR();
    while (g != NULL && g->http != arg)
        g = g->next_guard;
    if (g == NULL) {
        evconnlistener_disable(l);
        return;
    }
    g->st.accept_errors++;
    g->st.last_refused = hpd_time_now();
    if (warn_now(g))
        HPD_LOG_WARN(LOG_COMPONENT, "%s: accept failed: %s; pausing new connections for %d ms "
                     "(%llu failures so far)", g->p.name, evutil_socket_error_to_string(err),
                     ACCEPT_PAUSE_MS, (unsigned long long)g->st.accept_errors);
    evconnlistener_disable(l);
    evtimer_add(g->resume, &pause);
}

hpd_status_t hpd_http_guard_create(struct evhttp *http, const hpd_http_guard_params_t *p,
                                   hpd_http_guard_t **g_p)
{
    hpd_http_guard_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return HPD_ERR_NO_MEMORY;
    g->p = *p;
    if (g->p.name == NULL)
        g->p.name = "http";
    g->http = http;
    g->budget = p->budget != NULL ? p->budget : hpd_conn_budget_process();
    g->max_unauthed = p->max_unauthed ? p->max_unauthed : 64;
    g->head_timeout_ms = p->head_timeout_ms ? p->head_timeout_ms : 5000;
    g->max_head = p->max_head ? p->max_head : (size_t)16 << 10;
    if (g->budget == NULL || (g->resume = evtimer_new(p->base, on_resume, g)) == NULL) {
        free(g);
        return HPD_ERR_NO_MEMORY;
    }
    evhttp_set_bevcb(http, make_bev, g);
    g->next_guard = guards;
    guards = g;
    *g_p = g;
    return HPD_OK;
}

hpd_status_t hpd_http_guard_bind(hpd_http_guard_t *g, const char *host, uint16_t port,
                                 uint16_t *port_p)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    socklen_t sl = sizeof(sin);
    if (inet_pton(AF_INET, host != NULL ? host : "127.0.0.1", &sin.sin_addr) != 1) {
        /* a name ("localhost"): its first IPv4 address */
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
        if (getaddrinfo(host, NULL, &hints, &ai) != 0)
            return HPD_ERR_IO;
        sin.sin_addr = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        freeaddrinfo(ai);
    }
    /* a deep backlog (evhttp's own is 128): a burst of connects waits in
     * the kernel for the guard to sort it, instead of being dropped and
     * retried a second later, the operator's with it */
    struct evconnlistener *l = evconnlistener_new_bind(
        g->p.base, NULL, NULL,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, LISTEN_BACKLOG,
        (struct sockaddr *)&sin, sizeof(sin));
    if (l == NULL)
        return HPD_ERR_IO;
    if (evhttp_bind_listener(g->http, l) == NULL) {
        evconnlistener_free(l);
        return HPD_ERR_IO;
    }
    g->listener = l;
    evconnlistener_set_error_cb(l, on_accept_error);
    if (getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&sin, &sl) != 0)
        return HPD_ERR_IO;
    *port_p = ntohs(sin.sin_port);
    return HPD_OK;
}

void hpd_http_guard_set_closecb(hpd_http_guard_t *g, struct evhttp_connection *evcon,
                                void (*cb)(struct evhttp_connection *evcon, void *arg),
                                void *arg)
{
    for (gconn_t *c = g->conns; c != NULL; c = c->next) {
        if (c->evcon == evcon) {
            c->user_closecb = cb;
            c->user_closecb_arg = arg;
            return;
        }
    }
    evhttp_connection_set_closecb(evcon, cb, arg); /* not a guarded connection */
}

uint32_t hpd_http_guard_close_if(hpd_http_guard_t *g,
                                 bool (*pred)(uint64_t credential, void *arg), void *arg)
{
    uint32_t n = 0;
    for (gconn_t *c = g->conns; c != NULL; c = c->next) {
        if (c->state == C_PASS && !c->closing && pred(c->credential, arg)) {
            schedule_close(c);
            g->st.revoked++;
            n++;
        }
    }
    return n;
}

void hpd_http_guard_stats(const hpd_http_guard_t *g, hpd_http_guard_stats_t *st)
{
    *st = g->st;
    st->unauthenticated = g->n_unauthed;
    st->open = 0;
    for (const gconn_t *c = g->conns; c != NULL; c = c->next)
        st->open += !c->closing;
}

void hpd_http_guard_destroy(hpd_http_guard_t *g)
{
    if (g == NULL)
        return;
    for (hpd_http_guard_t **pp = &guards; *pp != NULL; pp = &(*pp)->next_guard) {
        if (*pp == g) {
            *pp = g->next_guard;
            break;
        }
    }
    /* evhttp_free closed every connection that had its first turn; what
     * is left never had one (its reference is the guard's to drop) */
    while (g->conns != NULL) {
        gconn_t *c = g->conns;
        struct bufferevent *bev = c->started ? NULL : c->bev;
        conn_free(c);
        if (bev != NULL)
            bufferevent_decref(bev);
    }
    if (g->resume != NULL)
        event_free(g->resume);
    free(g);
}
