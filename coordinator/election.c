/* Leadership through etcd (coordinator/election.h). The thread owns its
 * curl handle; the shared state (state, deadline, why) is under mu. Keys
 * and values go to etcd's JSON gateway in base64, its int64s come back as
 * strings. */
#include "coordinator/election.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "election"
#define HTTP_TIMEOUT_MS 1000
#define CAMPAIGN_EVERY_MS 100

typedef enum { CAMPAIGN, LEADER, LOST, STOPPED } state_t;

struct hpd_election {
    hpd_election_params_t p;
    char *endpoint, *key, *name;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    state_t state;
    bool stop;
    int64_t lease;   /* 0: none */
    double deadline; /* monotonic: the lease is surely valid until then */
    char why[320];
    int pipe[2];
    CURL *curl; /* the thread's */
};

static double mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ etcd's gateway */

static char *b64(const char *s)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t n = strlen(s);
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)(unsigned char)s[i] << 16 |
                           (i + 1 < n ? (uint32_t)(unsigned char)s[i + 1] << 8 : 0) |
                           (i + 2 < n ? (uint32_t)(unsigned char)s[i + 2] : 0);
        *o++ = tab[v >> 18 & 63];
        *o++ = tab[v >> 12 & 63];
        *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

typedef struct {
    char *data;
    size_t len;
} body_t;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *arg)
{
    body_t *b = arg;
    const size_t n = size * nmemb;
    char *grown = realloc(b->data, b->len + n + 1);
    if (grown == NULL)
        return 0;
    memcpy(grown + b->len, ptr, n);
    b->data = grown;
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

/* POSTs req (stolen) to path; the reply's JSON, NULL on any failure (why
 * in err). */
static json_t *call(CURL *curl, const char *endpoint, const char *path, json_t *req, char *err,
                    size_t err_len)
{
    char url[512];
    body_t body = {0};
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (text == NULL) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    snprintf(url, sizeof(url), "%s%s", endpoint, path);
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)HTTP_TIMEOUT_MS);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)HTTP_TIMEOUT_MS);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    free(text);
    json_t *reply = NULL;
    if (rc != CURLE_OK)
        snprintf(err, err_len, "etcd at %s: %s", endpoint, curl_easy_strerror(rc));
    else if (status != 200)
        snprintf(err, err_len, "etcd at %s: %s answered HTTP %ld: %.120s", endpoint, path, status,
                 body.data != NULL ? body.data : "");
    else if ((reply = json_loads(body.data != NULL ? body.data : "", 0, NULL)) == NULL)
        snprintf(err, err_len, "etcd at %s: %s answered what is not JSON", endpoint, path);
    free(body.data);
    return reply;
}

/* An int64 of etcd's JSON (a string), 0 when absent. */
static int64_t i64(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10)
                             : json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

static json_t *i64_json(int64_t v)
{
    char s[24];
    snprintf(s, sizeof(s), "%lld", (long long)v);
    return json_string(s);
}

/* A lease of ttl; 0 on failure. */
static int64_t grant(hpd_election_t *e, char *err, size_t len)
{
    json_t *r = call(e->curl, e->endpoint, "/v3/lease/grant",
                     json_pack("{s:I}", "TTL", (json_int_t)e->p.ttl_s), err, len);
    const int64_t id = r != NULL ? i64(r, "ID") : 0;
    json_decref(r);
    return id;
}

/* Renews the lease: its TTL (0: gone, or no answer). */
static int64_t keepalive(hpd_election_t *e, int64_t lease, char *err, size_t len)
{
    json_t *r = call(e->curl, e->endpoint, "/v3/lease/keepalive",
                     json_pack("{s:o}", "ID", i64_json(lease)), err, len);
    const int64_t ttl = r != NULL ? i64(json_object_get(r, "result"), "TTL") : 0;
    if (r != NULL && ttl <= 0)
        snprintf(err, len, "etcd says lease %lld is gone", (long long)lease);
    json_decref(r);
    return ttl;
}

static void lease_revoke(CURL *curl, const char *endpoint, int64_t lease)
{
    char err[300];
    json_decref(call(curl, endpoint, "/v3/lease/revoke",
                     json_pack("{s:o}", "ID", i64_json(lease)), err, sizeof(err)));
}

/* The transaction: if the key does not exist (create), or holds this
 * lease (!create), put value there with the lease. Returns whether it
 * succeeded; -1: no answer. */
static int txn(CURL *curl, const char *endpoint, const char *key, const char *value,
               int64_t lease, bool create, char *err, size_t len)
{
    char *k = b64(key), *v = b64(value);
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return -1;
    }
    json_t *cmp = create ? json_pack("{s:s, s:s, s:s, s:s}", "key", k, "result", "EQUAL",
                                     "target", "CREATE", "create_revision", "0")
                         : json_pack("{s:s, s:s, s:s, s:o}", "key", k, "result", "EQUAL",
                                     "target", "LEASE", "lease", i64_json(lease));
    json_t *req = json_pack("{s:[o], s:[{s:{s:s, s:s, s:o}}]}", "compare", cmp, "success",
                            "requestPut", "key", k, "value", v, "lease", i64_json(lease));
    free(k);
    free(v);
    json_t *r = call(curl, endpoint, "/v3/kv/txn", req, err, len);
    const int won = r == NULL ? -1 : json_is_true(json_object_get(r, "succeeded"));
    json_decref(r);
    return won;
}

/* ------------------------------------------------------------ the thread */

static void set_lost(hpd_election_t *e, const char *why)
{
    pthread_mutex_lock(&e->mu);
    if (e->state == LEADER) {
        e->state = LOST;
        snprintf(e->why, sizeof(e->why), "%.300s", why);
        const char byte = 1;
        if (write(e->pipe[1], &byte, 1) < 0) { /* the pipe is the loop's: never full */
        }
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Sleeps ms, or less when told to stop; true when told to stop. */
static bool nap(hpd_election_t *e, double s)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const double t = until.tv_sec + until.tv_nsec * 1e-9 + s;
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&e->mu);
    while (!e->stop && pthread_cond_timedwait(&e->cv, &e->mu, &until) != ETIMEDOUT)
        ;
    const bool stop = e->stop;
    pthread_mutex_unlock(&e->mu);
    return stop;
}

static void *run(void *arg)
{
    hpd_election_t *e = arg;
    char err[300] = "";
    const double margin = HPD_MAX(0.5, e->p.ttl_s / 4.0);
    int64_t lease = 0;
    double lease_sent = 0; /* the send time of the lease's grant or last renewal */
    bool warned = false;
    /* campaign: a lease kept alive, and the transaction tried again */
    while (!nap(e, 0)) {
        const double t = mono();
        if (lease != 0 && keepalive(e, lease, err, sizeof(err)) > 0)
            lease_sent = t;
        else if ((lease = grant(e, err, sizeof(err))) != 0)
            lease_sent = t;
        const int won = lease != 0 ? txn(e->curl, e->endpoint, e->key, "", lease, true, err,
                                         sizeof(err))
                                   : -1;
        if (won == 1 && mono() < lease_sent + e->p.ttl_s - margin) {
            pthread_mutex_lock(&e->mu);
            e->state = LEADER;
            e->lease = lease;
            e->deadline = lease_sent + e->p.ttl_s - margin;
            pthread_cond_broadcast(&e->cv);
            pthread_mutex_unlock(&e->mu);
            HPD_LOG_INFO(LOG_COMPONENT, "%s leads (key %s, lease %lld of %u s)", e->name, e->key,
                         (long long)lease, e->p.ttl_s);
            break;
        }
        if (won < 0 && !warned) {
            HPD_LOG_WARN(LOG_COMPONENT, "%s: campaign: %s; trying again", e->name, err);
            warned = true;
        }
        if (nap(e, CAMPAIGN_EVERY_MS / 1e3))
            goto out;
    }
    /* lead: renew at a third of the TTL; step down before the lease can
     * have ended at etcd */
    while (!nap(e, e->p.ttl_s / 3.0)) {
        const double t = mono();
        const int64_t ttl = keepalive(e, lease, err, sizeof(err));
        const double now = mono();
        pthread_mutex_lock(&e->mu);
        if (ttl > 0 && now < t + ttl - margin)
            e->deadline = t + (double)ttl - margin;
        const bool late = now >= e->deadline;
        pthread_mutex_unlock(&e->mu);
        if (ttl <= 0 || late) {
            char why[300];
            snprintf(why, sizeof(why), "%s", ttl <= 0 ? err : "its lease renewal came too late");
            HPD_LOG_ERROR(LOG_COMPONENT, "%s steps down: %s", e->name, why);
            set_lost(e, why);
            lease = 0;
            break;
        }
    }
out:
    pthread_mutex_lock(&e->mu);
    if (e->state == CAMPAIGN)
        e->state = STOPPED;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (lease != 0) /* stopped: the key goes now, not at the TTL's end */
        lease_revoke(e->curl, e->endpoint, lease);
    return NULL;
}

/* ------------------------------------------------------------ the API */

static void curl_init(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

hpd_status_t hpd_election_create(const hpd_election_params_t *params, hpd_election_t **e_p,
                                 char *err, size_t err_len)
{
    *e_p = NULL;
    if (params->endpoint == NULL || strncmp(params->endpoint, "http://", 7) != 0) {
        snprintf(err, err_len, "--etcd '%s' is not an http:// URL of etcd's client port",
                 params->endpoint ? params->endpoint : "");
        return HPD_ERR_INVALID_ARG;
    }
    if (params->key == NULL || params->key[0] == '\0' || params->ttl_s < 2) {
        snprintf(err, err_len, "the election needs a key and a TTL of 2 s or more (got %u)",
                 params->ttl_s);
        return HPD_ERR_INVALID_ARG;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_init);
    hpd_election_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return HPD_ERR_NO_MEMORY;
    e->p = *params;
    e->pipe[0] = e->pipe[1] = -1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->endpoint = strdup(params->endpoint);
    e->key = strdup(params->key);
    e->name = strdup(params->name != NULL ? params->name : "coordinator");
    if (e->endpoint == NULL || e->key == NULL || e->name == NULL || pipe(e->pipe) != 0 ||
        (e->curl = curl_easy_init()) == NULL) {
        hpd_election_destroy(e);
        snprintf(err, err_len, "out of memory");
        return HPD_ERR_NO_MEMORY;
    }
    const size_t n = strlen(e->endpoint); /* "http://h:p/" and "http://h:p" alike */
    if (n > 0 && e->endpoint[n - 1] == '/')
        e->endpoint[n - 1] = '\0';
    if (pthread_create(&e->thread, NULL, run, e) != 0) {
        hpd_election_destroy(e);
        snprintf(err, err_len, "cannot start the election's thread");
        return HPD_ERR_NO_MEMORY;
    }
    e->started = true;
    *e_p = e;
    return HPD_OK;
}

bool hpd_election_wait(hpd_election_t *e)
{
    pthread_mutex_lock(&e->mu);
    while (e->state == CAMPAIGN && !e->stop)
        pthread_cond_wait(&e->cv, &e->mu);
    const bool leads = e->state == LEADER;
    pthread_mutex_unlock(&e->mu);
    return leads;
}

hpd_status_t hpd_election_publish(hpd_election_t *e, const char *value)
{
    char err[300];
    pthread_mutex_lock(&e->mu);
    const int64_t lease = e->state == LEADER ? e->lease : 0;
    pthread_mutex_unlock(&e->mu);
    if (lease == 0)
        return HPD_ERR_INVALID_ARG;
    CURL *curl = curl_easy_init(); /* this thread's own */
    if (curl == NULL)
        return HPD_ERR_NO_MEMORY;
    const int ok = txn(curl, e->endpoint, e->key, value, lease, false, err, sizeof(err));
    curl_easy_cleanup(curl);
    if (ok != 1) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: cannot publish its address: %s", e->name,
                      ok < 0 ? err : "the key holds another lease");
        return HPD_ERR_IO;
    }
    return HPD_OK;
}

bool hpd_election_leads(hpd_election_t *e)
{
    pthread_mutex_lock(&e->mu);
    const bool leads = e->state == LEADER && mono() < e->deadline;
    pthread_mutex_unlock(&e->mu);
    return leads;
}

int hpd_election_fd(const hpd_election_t *e)
{
    return e->pipe[0];
}

const char *hpd_election_why(hpd_election_t *e)
{
    return e->why;
}

void hpd_election_destroy(hpd_election_t *e)
{
    if (e == NULL)
        return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    if (e->curl != NULL)
        curl_easy_cleanup(e->curl);
    for (int i = 0; i < 2; i++)
        if (e->pipe[i] >= 0)
            close(e->pipe[i]);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e->endpoint);
    free(e->key);
    free(e->name);
    free(e);
}
