/* For the tests of coordinator failover (test_standby, test_partition):
 * a real etcd (Debian's etcd-server) on loopback or in a namespace, and a
 * checked load: a client given the leader and its standbys that keeps
 * CL_LOAD_DEPTH streamed requests open and checks every answer against
 * hpd-run's tokens and every stream for gaps and repeats. */
#ifndef HPD_TESTS_CLUSTER_FAILOVER_H
#define HPD_TESTS_CLUSTER_FAILOVER_H

#include "tests/cluster/harness.h"

/* ------------------------------------------------------------ etcd */

/* Spawns the n words of base as process name, inside network namespace ns
 * (`ip netns exec NS ...`) unless ns is NULL. */
static inline cl_proc_t *cl_spawn_in(cl_t *cl, const char *name, const char *ns,
                                     const char *const *base, size_t n)
{
    const char *in_ns[] = {"/usr/sbin/ip", "netns", "exec", ns};
    const char *all[CL_MAX_ARGS];
    char *argv[CL_MAX_ARGS];
    size_t k = 0;
    assert_true(n + 4 < CL_MAX_ARGS);
    for (size_t i = 0; ns != NULL && i < 4; i++)
        all[k++] = in_ns[i];
    for (size_t i = 0; i < n; i++)
        all[k++] = base[i];
    cl_args(argv, all, k, NULL);
    return cl_spawn(cl, name, argv);
}

static inline const char *cl_etcd_binary(void)
{
    const char *e = getenv("HPD_ETCD");
    return e != NULL ? e : "/usr/bin/etcd";
}

/* Whether etcd is here; where it is not, says so and: exits 1 under
 * HPD_REQUIRE_ETCD=1 (CI installs it), or returns false (the caller
 * skips). */
static inline bool cl_etcd_present(void)
{
    if (access(cl_etcd_binary(), X_OK) == 0)
        return true;
    const char *req = getenv("HPD_REQUIRE_ETCD");
    const bool required = req != NULL && strcmp(req, "1") == 0;
    fprintf(stderr, "%s: no etcd at %s (Debian's etcd-server; HPD_ETCD names another)\n",
            required ? "failed" : "skipped", cl_etcd_binary());
    if (required)
        exit(1);
    return false;
}

static inline bool cl_etcd_ready(cl_t *c, void *log)
{
    return cl_file_has(log, "ready to serve client requests");
}

/* An etcd of one member, the process `name` (a log of its own each run),
 * listening on host's client and peer ports (ports[0], ports[1]: free ones
 * are picked where 0), its data in the test's root under data (another
 * run on the same data recovers it); ns: the namespace to run it in, or
 * NULL. url gets its client URL. */
static inline cl_proc_t *cl_start_etcd(cl_t *cl, const char *name, const char *data_name,
                                       const char *ns, const char *host, uint16_t ports[2],
                                       char *url, size_t url_len)
{
    char data[320], client[64], peer[64], cluster[96];
    for (int i = 0; i < 2; i++)
        if (ports[i] == 0)
            ports[i] = cl_free_port();
    snprintf(data, sizeof(data), "%s/%s.data", cl->root, data_name);
    snprintf(client, sizeof(client), "http://%s:%u", host, ports[0]);
    snprintf(peer, sizeof(peer), "http://%s:%u", host, ports[1]);
    snprintf(cluster, sizeof(cluster), "default=%s", peer);
    snprintf(url, url_len, "%s", client);
    const char *base[] = {cl_etcd_binary(), "--data-dir", data, "--listen-client-urls", client,
                          "--advertise-client-urls", client, "--listen-peer-urls", peer,
                          "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster};
    cl_proc_t *p = cl_spawn_in(cl, name, ns, base, sizeof(base) / sizeof(base[0]));
    cl_wait(cl, NULL, 30, cl_etcd_ready, p->log, "etcd ready");
    return p;
}

/* The end of a failover test: the leader drains and gives its lease back,
 * tells its nodes to stop, all end 0; then etcd goes. */
static inline void cl_end_election(cl_t *cl, cl_proc_t *leader, cl_proc_t *p0, cl_proc_t *d0,
                                   cl_proc_t *etcd)
{
    cl_ending(leader);
    cl_ending(p0);
    cl_ending(d0);
    assert_int_equal(kill(leader->pid, SIGTERM), 0);
    cl_expect_end(cl, leader, 0, 60);
    cl_expect_end(cl, p0, 0, 60);
    cl_expect_end(cl, d0, 0, 60);
    cl_kill9(cl, etcd);
    cl_stop_all(cl);
}

static inline bool cl_leads(cl_t *c, void *log)
{
    return cl_file_has(log, "listening on");
}

/* The time of the first line of log holding what (seconds of the day, from
 * the log's own timestamps), or -1. */
static inline double cl_log_time(const char *log, const char *what)
{
    FILE *f = fopen(log, "r");
    char line[2048];
    double t = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        int h, m;
        double s;
        if (strstr(line, what) != NULL && sscanf(line, "%*10sT%d:%d:%lfZ", &h, &m, &s) == 3) {
            t = h * 3600.0 + m * 60.0 + s;
            break;
        }
    }
    if (f != NULL)
        fclose(f);
    return t;
}

/* ------------------------------------------------------------ a checked load */

#define CL_LOAD_MAX 4096
#define CL_LOAD_DEPTH 6
#define CL_LOAD_TOKENS 16

typedef struct {
    int prompt;
    int32_t streamed[CL_LOAD_TOKENS];
    uint32_t n_streamed;
    bool stream_bad, after_mark;
} cl_load_req_t;

typedef struct {
    /* what is asked: n prompts, each answered ref[i] (max_tokens of them) */
    const int32_t (*prompts)[CL_PROMPT_MAX];
    const uint32_t *prompt_len;
    const int32_t *ref; /* n rows of max_tokens */
    uint32_t n, max_tokens;
    hpd_client_t *c;
    bool submitting;
    uint32_t submitted, done, right, retried, failed, wrong;
    double t_mark, back; /* back: from the mark to the first answer of a new leader */
    char first_error[300];
    cl_load_req_t q[CL_LOAD_MAX];
} cl_load_t;

static inline void cl_load_token(void *arg, uint64_t h, uint32_t index, const int32_t *ids,
                                 uint32_t n)
{
    cl_load_req_t *q = arg;
    if (index != q->n_streamed || q->n_streamed + n > CL_LOAD_TOKENS) {
        q->stream_bad = true; /* a gap, a repeat or too many */
        return;
    }
    memcpy(q->streamed + q->n_streamed, ids, n * sizeof(*ids));
    q->n_streamed += n;
}

/* (the load's requests point into it: one load at a time) */
static cl_load_t *cl_load_running;

static inline void cl_load_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    cl_load_t *L = cl_load_running;
    cl_load_req_t *q = arg;
    const int32_t *want = L->ref + (size_t)q->prompt * L->max_tokens;
    L->done++;
    L->retried += r->resubmits > 0;
    if (r->status != HPD_OK) {
        if (L->failed++ == 0)
            snprintf(L->first_error, sizeof(L->first_error), "%s: %.250s",
                     hpd_status_str(r->status), r->error);
        return;
    }
    if (r->n_tokens != L->max_tokens || memcmp(r->tokens, want, L->max_tokens * 4) != 0 ||
        q->stream_bad || q->n_streamed != r->n_tokens ||
        memcmp(q->streamed, r->tokens, r->n_tokens * 4) != 0) {
        L->wrong++;
        return;
    }
    L->right++;
    /* (a reply read after the fault may have left the old leader before it) */
    if (L->t_mark > 0 && L->back == 0 && (r->resubmits > 0 || q->after_mark))
        L->back = hpd_time_now() - L->t_mark;
}

/* Starts the load on L (its prompts, ref, n and max_tokens set) with a
 * client given coordinators ("HOST:PORT,HOST:PORT"). */
static inline void cl_load_start(cl_load_t *L, const char *coordinators)
{
    assert_true(L->max_tokens <= CL_LOAD_TOKENS);
    L->submitted = L->done = L->right = L->retried = L->failed = L->wrong = 0;
    L->t_mark = L->back = 0;
    L->first_error[0] = '\0';
    hpd_client_params_t p = {.coordinators = coordinators,
                             .token = CL_CLIENT_KEY,
                             .timeout_ms = 300000};
    assert_int_equal(hpd_client_create(&p, &L->c), HPD_OK);
    L->submitting = true;
    cl_load_running = L;
}

/* When to stop pumping: stop(arg). */
typedef struct {
    bool (*stop)(void *arg);
    void *arg;
} cl_load_stop_t;

/* Keeps CL_LOAD_DEPTH requests open (a cl_wait condition, with a
 * cl_load_stop_t). */
static inline bool cl_load_pump(cl_t *cl, void *arg)
{
    const cl_load_stop_t *until = arg;
    cl_load_t *L = cl_load_running;
    while (L->submitting && L->submitted - L->done < CL_LOAD_DEPTH &&
           L->submitted < CL_LOAD_MAX) {
        cl_load_req_t *q = &L->q[L->submitted];
        memset(q, 0, sizeof(*q));
        q->prompt = (int)(L->submitted % L->n);
        q->after_mark = L->t_mark > 0;
        hpd_generate_params_t g = {.prompt = L->prompts[q->prompt],
                                   .n_prompt = L->prompt_len[q->prompt],
                                   .max_tokens = L->max_tokens,
                                   .sampling = {.top_p = 1}};
        const hpd_status_t st = hpd_client_submit(L->c, &g, cl_load_token, cl_load_done, q, NULL);
        if (st != HPD_OK)
            fail_msg("load: submit %u: %s", L->submitted, hpd_status_str(st));
        L->submitted++;
    }
    return until->stop(until->arg);
}

/* Runs the load until until->stop(until->arg), at most timeout_s. */
static inline void cl_load_until(cl_t *cl, const cl_load_stop_t *until, double timeout_s,
                                 const char *what)
{
    cl_wait(cl, cl_load_running->c, timeout_s, cl_load_pump, (void *)until, what);
}

static inline bool cl_load_time_up(void *until)
{
    return hpd_time_now() >= *(double *)until;
}

static inline void cl_load_for(cl_t *cl, double seconds)
{
    double until = hpd_time_now() + seconds;
    cl_load_until(cl, &(cl_load_stop_t){cl_load_time_up, &until}, seconds + 30,
                  "the load's time");
}

static inline bool cl_load_log_leads(void *log)
{
    return cl_file_has(log, "listening on");
}

static inline bool cl_load_is_back(void *more)
{
    return cl_load_running->back > 0 && cl_load_running->right >= *(uint32_t *)more;
}

/* Runs the load until the coordinator logging to log leads, then until it
 * answered `more` requests right. */
static inline void cl_load_until_back(cl_t *cl, const char *log, uint32_t more, const char *what)
{
    cl_load_until(cl, &(cl_load_stop_t){cl_load_log_leads, (void *)log}, 30, what);
    uint32_t wanted = cl_load_running->right + more;
    cl_load_until(cl, &(cl_load_stop_t){cl_load_is_back, &wanted}, 60, what);
}

/* Stops submitting, waits for every open request and checks them all:
 * every one right, none failed. */
static inline void cl_load_end(cl_t *cl, cl_load_t *L, const char *what, double timeout_s)
{
    L->submitting = false;
    cl_client_wait(cl, L->c, timeout_s, what);
    print_message("%s: %u requests: %u right (%u submitted again by the client), %u failed, "
                  "%u wrong; service back %.2f s after the fault\n", what, L->submitted,
                  L->right, L->retried, L->failed, L->wrong, L->back);
    if (L->failed > 0)
        fail_msg("%s: %u requests failed, the first: %s", what, L->failed, L->first_error);
    assert_int_equal(L->wrong, 0);
    assert_int_equal(L->right, L->submitted);
    hpd_client_destroy(L->c);
    L->c = NULL;
    cl_load_running = NULL;
}

#endif
