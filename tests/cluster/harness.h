/* Real clusters on 127.0.0.1 for the integration tests (header-only; used by
 * test_cluster.c and test_cluster_policies.c, and for its log checks and
 * temporary directory by tests/deploy/test_hpdctl.c).
 *
 * - Processes start with their output in ROOT/NAME.log and die with the
 *   test (PR_SET_PDEATHSIG).
 * - The coordinator's status is read strictly: a missing or mistyped field
 *   fails the test (cl_field, cl_u64, cl_u64_at); it never reads as 0.
 * - Every wait has a deadline and fails naming what it waited for. While it
 *   waits, a process that ended without the test ending it fails the test
 *   at once, with the end of its log.
 * - Every process ends as the test expects: exit status 0 on SIGTERM, or
 *   what the test said (killed with -9: CL_KILLED; exit 3 after its lease
 *   lapsed), and no log may hold a sanitizer report.
 * - The temporary directory is removed when every case passed; it is kept,
 *   and its path printed, when one failed or HPD_KEEP_TEST_DIR is set. */
#ifndef HPD_TESTS_CLUSTER_HARNESS_H
#define HPD_TESTS_CLUSTER_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "client/client.h"
#include "common/util.h"
#include "transport/http.h"
#include "transport/rpc_codec.h"
#include "tests/test_helpers.h"

#define CL_MAX_PROCS 96
/* the client key of every coordinator the harness starts (the node secret
 * is never a client key) */
#define CL_CLIENT_KEY "cluster-client-key-0123456789"
#define CL_MAX_ARGS 64
/* cl_expect_end: the test killed the process with -9 */
#define CL_KILLED (-SIGKILL)

typedef struct {
    char name[32];
    char log[400];
    pid_t pid;   /* > 0 while it runs */
    bool paused; /* SIGSTOP'd by the test */
    bool ending; /* the test made it end (cl_ending): cl_expect_end reaps it */
} cl_proc_t;

typedef struct {
    char root[256]; /* the temporary directory: model, token, logs */
    char model[300], token_file[300];
    char keys_file[300]; /* the coordinator's client keys: CL_CLIENT_KEY */
    const char *device;  /* --device of every node (cpu) */
    const char *ucx_tls; /* --ucx-tls of every node (tcp) */
    cl_proc_t procs[CL_MAX_PROCS];
    uint32_t n_procs;
    cl_proc_t *coord; /* the coordinator now running */
    uint16_t port;    /* its RPC port */
    char addr[64];    /* 127.0.0.1:port */
    char host[64];  /* the coordinator's address, for clients (127.0.0.1) */
    hpd_client_t *status_client; /* cl_status's connection to it */
    uint32_t cases, passed;      /* the directory stays unless every case passed */
} cl_t;

/* ------------------------------------------------------------ logs */

/* The last `bytes` of a file, on stderr. */
static inline void cl_print_tail(const char *path, size_t bytes)
{
    char *text;
    size_t len;
    if (hpd_read_file(path, &text, &len) != HPD_OK) {
        fprintf(stderr, "(no log %s)\n", path);
        return;
    }
    fprintf(stderr, "--- the end of %s:\n%s%s---\n", path, len > bytes ? "[...]" : "",
            text + (len > bytes ? len - bytes : 0));
    free(text);
}

static inline bool cl_file_has(const char *path, const char *needle)
{
    char *text;
    size_t len;
    if (hpd_read_file(path, &text, &len) != HPD_OK)
        return false;
    const bool found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

/* Fails when the log holds a sanitizer report (AddressSanitizer, LeakSanitizer,
 * UndefinedBehaviorSanitizer, ...), printing it. A missing log is clean. */
static inline void cl_check_log(const char *path)
{
    static const char *const reports[] = {"Sanitizer", "runtime error:"};
    char *text;
    size_t len;
    if (hpd_read_file(path, &text, &len) != HPD_OK)
        return;
    for (size_t i = 0; i < sizeof(reports) / sizeof(reports[0]); i++) {
        const char *hit = strstr(text, reports[i]);
        if (hit == NULL)
            continue;
        const char *from = hit - text > 400 ? hit - 400 : text;
        fprintf(stderr, "--- %s holds a sanitizer report:\n%.4000s\n---\n", path, from);
        free(text);
        fail_msg("sanitizer report in %s", path);
    }
    free(text);
}

/* "exit status N" or "killed by signal N" */
static inline const char *cl_describe(int status, char *buf, size_t len)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, len, "wait status 0x%x", status);
    return buf;
}

/* Removes a test's directory when every case passed and HPD_KEEP_TEST_DIR is
 * unset; otherwise keeps it and says where it is. */
static inline void cl_dir_done(const char *root, bool all_passed)
{
    if (all_passed && getenv("HPD_KEEP_TEST_DIR") == NULL)
        test_rmtree(root);
    else
        fprintf(stderr, "test files and logs kept in %s\n", root);
}

/* ------------------------------------------------------------ processes */

/* A fresh directory with the model (hpd-mkmodel with model_args) and a token
 * (cl is zeroed, with cl->cases set by main). */
static inline int cl_init(cl_t *cl, const char *tag, const char *model_args)
{
    cl->device = "cpu";
    cl->ucx_tls = "tcp";
    test_tmpdir(cl->root, sizeof(cl->root), tag);
    snprintf(cl->model, sizeof(cl->model), "%s/model", cl->root);
    snprintf(cl->token_file, sizeof(cl->token_file), "%s/token", cl->root);
    snprintf(cl->keys_file, sizeof(cl->keys_file), "%s/harness-client-keys", cl->root);
    if (test_mkmodel(cl->model, model_args) != 0 ||
        hpd_write_file(cl->token_file, "cluster-secret\n", 15) != HPD_OK ||
        hpd_write_file(cl->keys_file, CL_CLIENT_KEY " tests\n", strlen(CL_CLIENT_KEY) + 7) !=
            HPD_OK) {
        fprintf(stderr, "cannot make the model or the token in %s\n", cl->root);
        return -1;
    }
    return 0;
}

/* The process named `name` (a new slot, or one whose process has ended). */
static inline cl_proc_t *cl_proc(cl_t *cl, const char *name)
{
    for (uint32_t i = 0; i < cl->n_procs; i++)
        if (strcmp(cl->procs[i].name, name) == 0) {
            if (cl->procs[i].pid > 0)
                fail_msg("%s is already running (pid %d)", name, (int)cl->procs[i].pid);
            return &cl->procs[i];
        }
    if (cl->n_procs == CL_MAX_PROCS)
        fail_msg("more than %d processes", CL_MAX_PROCS);
    cl_proc_t *p = &cl->procs[cl->n_procs++];
    char log[sizeof(p->log)];
    snprintf(log, sizeof(log), "%s/%s.log", cl->root, name);
    snprintf(p->name, sizeof(p->name), "%s", name);
    memcpy(p->log, log, sizeof(log));
    return p;
}

static inline cl_proc_t *cl_spawn(cl_t *cl, const char *name, char *const argv[])
{
    cl_proc_t *p = cl_proc(cl, name);
    const pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        const int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* nothing of the test's: a test that is a coordinator itself
         * (tests/node/roles.h) must be able to close its listener and
         * listen on that port again */
        syscall(SYS_close_range, 3u, ~0u, 0u);
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv(argv[0], argv);
        _exit(127);
    }
    assert_true(pid > 0);
    p->pid = pid;
    p->paused = false;
    p->ending = false;
    return p;
}

/* Fails when a process the test did not end has ended, with its log. */
static inline void cl_check_alive(cl_t *cl)
{
    for (uint32_t i = 0; i < cl->n_procs; i++) {
        cl_proc_t *p = &cl->procs[i];
        int st;
        char how[64];
        if (p->pid > 0 && !p->ending && waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            cl_print_tail(p->log, 3000);
            fail_msg("%s ended unexpectedly: %s", p->name, cl_describe(st, how, sizeof(how)));
        }
    }
}

/* Waits up to timeout_s for cond(cl, arg), polling client c (or sleeping
 * when NULL) in between and checking that every process still runs. */
static inline void cl_wait(cl_t *cl, hpd_client_t *c, double timeout_s,
                           bool (*cond)(cl_t *cl, void *arg), void *arg, const char *what)
{
    const double deadline = hpd_time_now() + timeout_s;
    for (;;) {
        cl_check_alive(cl);
        if (cond(cl, arg))
            return;
        if (hpd_time_now() > deadline)
            fail_msg("waited %.0f s for %s (logs in %s)", timeout_s, what, cl->root);
        if (c != NULL)
            hpd_client_poll(c, 20);
        else
            usleep(20 * 1000);
    }
}

static inline bool cl_no_pending(cl_t *cl, void *c)
{
    return hpd_client_pending(c) == 0;
}

/* Runs client c until none of its requests is open. */
static inline void cl_client_wait(cl_t *cl, hpd_client_t *c, double timeout_s, const char *what)
{
    cl_wait(cl, c, timeout_s, cl_no_pending, c, what);
}

static inline bool cl_file_nonempty(cl_t *cl, void *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && sb.st_size > 0;
}

typedef struct {
    const cl_proc_t *p;
    const char *needle;
} cl_log_wait_t;

static inline bool cl_log_has_cond(cl_t *cl, void *arg)
{
    const cl_log_wait_t *w = arg;
    return cl_file_has(w->p->log, w->needle);
}

/* Waits until p's log holds `needle`. */
static inline void cl_wait_log(cl_t *cl, const cl_proc_t *p, const char *needle, double timeout_s)
{
    char what[720];
    cl_log_wait_t w = {.p = p, .needle = needle};
    snprintf(what, sizeof(what), "'%.300s' in %s", needle, p->log);
    cl_wait(cl, NULL, timeout_s, cl_log_has_cond, &w, what);
}

/* The port a process wrote to path (--http-port-file and the like), once
 * it is there. */
static inline uint16_t cl_port_file(cl_t *cl, const char *path)
{
    char *text;
    size_t len;
    cl_wait(cl, NULL, 30, cl_file_nonempty, (void *)path, path);
    assert_int_equal(hpd_read_file(path, &text, &len), HPD_OK);
    const int port = atoi(text);
    free(text);
    assert_true(port > 0 && port < 65536);
    return (uint16_t)port;
}

/* A coordinator's metrics and health port, from its log. */
static inline uint16_t cl_metrics_port(cl_t *cl, const cl_proc_t *coord)
{
    static const char needle[] = "metrics and health on http port ";
    char *text;
    size_t len;
    cl_wait_log(cl, coord, needle, 30);
    assert_int_equal(hpd_read_file(coord->log, &text, &len), HPD_OK);
    const int port = atoi(strstr(text, needle) + sizeof(needle) - 1);
    free(text);
    assert_true(port > 0 && port < 65536);
    return (uint16_t)port;
}

/* A port nothing listens on now on 127.0.0.1 (bound, read, released). */
static inline uint16_t cl_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* argv: base[0..n_base), then extra (NULL-terminated; later flags win). */
static inline void cl_args(char *argv[CL_MAX_ARGS], const char *const *base, size_t n_base,
                           const char *const *extra)
{
    size_t n = 0;
    for (; n < n_base; n++)
        argv[n] = (char *)base[n];
    for (; extra != NULL && *extra != NULL && n < CL_MAX_ARGS - 1; extra++)
        argv[n++] = (char *)*extra;
    argv[n] = NULL;
}

/* Starts a coordinator on a free port with extra flags (NULL-terminated;
 * later flags win) and waits until it listens. Liveness pings are off
 * unless extra turns them on (--liveness-ms): tests stop nodes (SIGSTOP)
 * to hold work where they want it. */
static inline cl_proc_t *cl_start_coordinator(cl_t *cl, const char *name,
                                              const char *const *extra)
{
    char port_file[400], *argv[CL_MAX_ARGS];
    snprintf(port_file, sizeof(port_file), "%s/%s.port", cl->root, name);
    unlink(port_file);
    const char *base[] = {HPD_COORDINATOR, "--port", "0", "--port-file", port_file,
                          "--token-file", cl->token_file, "--client-keys-file",
                          cl->keys_file, "--log-level", "info", "--liveness-ms", "0"};
    cl_args(argv, base, sizeof(base) / sizeof(base[0]), extra);
    cl->coord = cl_spawn(cl, name, argv);
    cl_wait(cl, NULL, 30, cl_file_nonempty, port_file, "the coordinator's port file");
    char *text;
    size_t len;
    assert_int_equal(hpd_read_file(port_file, &text, &len), HPD_OK);
    cl->port = (uint16_t)atoi(text);
    free(text);
    assert_int_not_equal(cl->port, 0);
    snprintf(cl->addr, sizeof(cl->addr), "127.0.0.1:%u", cl->port);
    snprintf(cl->host, sizeof(cl->host), "127.0.0.1");
    return cl->coord;
}

/* Starts a prefill or decode node of the running coordinator: one thread,
 * the cluster's model, token, device and UCX transports, log level warn,
 * then the extra flags (NULL-terminated; later flags win). Does not wait. */
static inline cl_proc_t *cl_start_node(cl_t *cl, const char *role, const char *name,
                                       const char *const *extra)
{
    char *argv[CL_MAX_ARGS];
    const char *base[] = {strcmp(role, "prefill") == 0 ? HPD_PREFILL : HPD_DECODE,
                          "--coordinator", cl->addr, "--token-file", cl->token_file,
                          "--model", cl->model, "--name", name, "--threads", "1",
                          "--device", cl->device, "--ucx-tls", cl->ucx_tls,
                          "--log-level", "warn"};
    cl_args(argv, base, sizeof(base) / sizeof(base[0]), extra);
    return cl_spawn(cl, name, argv);
}

/* One generate call's outcome, filled by cl_on_done (its first
 * CL_REQ_TOKENS tokens are kept). */
#define CL_REQ_TOKENS 64
typedef struct {
    bool done;
    hpd_status_t status;
    char error[256];
    int32_t tokens[CL_REQ_TOKENS];
    uint32_t n, attempts;
} cl_req_t;

static inline void cl_on_done(void *arg, uint64_t h, hpd_generate_result_t *r)
{
    cl_req_t *q = arg;
    (void)h;
    q->done = true;
    q->status = r->status;
    snprintf(q->error, sizeof(q->error), "%s", r->error);
    q->n = r->n_tokens;
    q->attempts = r->attempts;
    if (r->tokens != NULL)
        memcpy(q->tokens, r->tokens, HPD_MIN(r->n_tokens, CL_REQ_TOKENS) * sizeof(int32_t));
}

/* A client of the running coordinator with the cluster's token. */
static inline hpd_client_t *cl_client(const cl_t *cl)
{
    hpd_client_t *c;
    hpd_client_params_t p = {.host = cl->host[0] != '\0' ? cl->host : "127.0.0.1",
                             .port = cl->port,
                             .token = CL_CLIENT_KEY,
                             .timeout_ms = 300000};
    assert_int_equal(hpd_client_create(&p, &c), HPD_OK);
    return c;
}

static inline void cl_pause(cl_proc_t *p)
{
    assert_true(p->pid > 0);
    assert_int_equal(kill(p->pid, SIGSTOP), 0);
    p->paused = true;
}

static inline void cl_resume(cl_proc_t *p)
{
    assert_true(p->pid > 0);
    assert_int_equal(kill(p->pid, SIGCONT), 0);
    p->paused = false;
}

/* The test is making p end (a signal, a drain, a refused registration):
 * waits no longer fail when it does; cl_expect_end checks how it ended. */
static inline void cl_ending(cl_proc_t *p)
{
    p->ending = true;
}

static inline void cl_forget_coordinator(cl_t *cl, const cl_proc_t *p)
{
    if (p != cl->coord)
        return;
    hpd_client_destroy(cl->status_client);
    cl->status_client = NULL;
    cl->coord = NULL;
}

/* Waits up to timeout_s for p to end; false if it still runs. */
static inline bool cl_reap(cl_proc_t *p, double timeout_s, int *status_p)
{
    const double deadline = hpd_time_now() + timeout_s;
    for (;;) {
        const pid_t r = waitpid(p->pid, status_p, WNOHANG);
        if (r == p->pid) {
            p->pid = 0;
            return true;
        }
        if (r < 0 && errno != EINTR)
            fail_msg("waitpid of %s (pid %d): %s", p->name, (int)p->pid, strerror(errno));
        if (hpd_time_now() > deadline)
            return false;
        usleep(10 * 1000);
    }
}

/* Expects p to end within timeout_s with exit status `expect` (>= 0) or of
 * SIGKILL (CL_KILLED), and its log to hold no sanitizer report. */
static inline void cl_expect_end(cl_t *cl, cl_proc_t *p, int expect, double timeout_s)
{
    char how[64];
    int st = 0;
    assert_true(p->pid > 0);
    const pid_t pid = p->pid;
    const bool ended = cl_reap(p, timeout_s, &st);
    p->ending = false;
    cl_forget_coordinator(cl, p);
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        p->pid = 0;
        cl_print_tail(p->log, 3000);
        fail_msg("%s did not end within %.0f s", p->name, timeout_s);
    }
    const bool ok = expect == CL_KILLED ? WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL
                                        : WIFEXITED(st) && WEXITSTATUS(st) == expect;
    if (!ok) {
        cl_print_tail(p->log, 3000);
        fail_msg("%s: %s (expected %s %d)", p->name, cl_describe(st, how, sizeof(how)),
                 expect == CL_KILLED ? "death by signal" : "exit status",
                 expect == CL_KILLED ? SIGKILL : expect);
    }
    cl_check_log(p->log);
}

/* kill -9, and it is gone. */
static inline void cl_kill9(cl_t *cl, cl_proc_t *p)
{
    cl_ending(p);
    assert_int_equal(kill(p->pid, SIGKILL), 0);
    cl_expect_end(cl, p, CL_KILLED, 30);
}

/* SIGTERM to every process still running, the nodes first (each drains and
 * exits 0), then the coordinator (it drains and exits 0); each must exit 0
 * with a clean log (cl_expect_end; what ended before was checked then). */
static inline void cl_stop_all(cl_t *cl)
{
    for (int coord = 0; coord < 2; coord++) {
        for (uint32_t i = 0; i < cl->n_procs; i++) {
            cl_proc_t *p = &cl->procs[i];
            if (p->pid > 0 && (p == cl->coord) == coord) {
                if (p->paused)
                    cl_resume(p);
                cl_ending(p);
                kill(p->pid, SIGTERM);
            }
        }
        for (uint32_t i = 0; i < cl->n_procs; i++) {
            cl_proc_t *p = &cl->procs[i];
            if (p->pid > 0 && (p == cl->coord) == coord)
                cl_expect_end(cl, p, 0, 60);
        }
    }
}

/* After a failed case: every process still running is killed (no checks). */
static inline void cl_kill_all(cl_t *cl)
{
    for (uint32_t i = 0; i < cl->n_procs; i++) {
        cl_proc_t *p = &cl->procs[i];
        if (p->pid > 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, NULL, 0);
            p->pid = 0;
        }
    }
    hpd_client_destroy(cl->status_client);
    cl->status_client = NULL;
    cl->coord = NULL;
}

/* The end of the test: what still runs is killed; the directory goes when
 * every case passed (cl->passed == cl->cases). */
static inline void cl_finish(cl_t *cl)
{
    cl_kill_all(cl);
    cl_dir_done(cl->root, cl->cases > 0 && cl->passed == cl->cases);
}

/* ------------------------------------------------------------ status */

/* m[key]; fails when m is not a map or has no such field. */
static inline const msgpack_object *cl_field(const msgpack_object *m, const char *key)
{
    if (m == NULL || m->type != MSGPACK_OBJECT_MAP)
        fail_msg("status: '%s' asked of something that is not a map", key);
    const msgpack_object *v = hpd_rpc_map_get(m, key);
    if (v == NULL)
        fail_msg("status: field '%s' is missing", key);
    return v;
}

static inline uint64_t cl_u64(const msgpack_object *m, const char *key)
{
    const msgpack_object *v = cl_field(m, key);
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        fail_msg("status: field '%s' is not an unsigned integer (msgpack type %d)", key,
                 (int)v->type);
    return v->via.u64;
}

/* A dotted path of fields: "stats.load.expired". */
static inline uint64_t cl_u64_at(const msgpack_object *m, const char *path)
{
    char key[64];
    for (;;) {
        const char *dot = strchr(path, '.');
        if (dot == NULL)
            return cl_u64(m, path);
        snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
        m = cl_field(m, key);
        path = dot + 1;
    }
}

static inline bool cl_str_is(const msgpack_object *m, const char *key, const char *want)
{
    const msgpack_object *v = cl_field(m, key);
    if (v->type != MSGPACK_OBJECT_STR)
        fail_msg("status: field '%s' is not a string", key);
    return hpd_rpc_str_eq(v->via.str.ptr, v->via.str.size, want);
}

/* The coordinator's request counts. */
typedef struct {
    uint64_t active, queued, finished, failed, canceled, retried, hedged, rejected;
} cl_requests_t;

typedef struct {
    hpd_rpc_result_t r;
    const msgpack_object *nodes; /* array of node entries */
    cl_requests_t req;
} cl_status_t;

/* The coordinator's status (free with cl_status_free). */
/* The coordinator's status as an operator sees it: with the node secret
 * (a node's view holds the nodes' addresses; a client's does not). */
static inline void cl_status(cl_t *cl, cl_status_t *s)
{
    if (cl->status_client == NULL) {
        char *token = NULL;
        assert_int_equal(hpd_rpc_read_token(cl->token_file, &token), HPD_OK);
        const hpd_client_params_t p = {.host = cl->host[0] != '\0' ? cl->host : "127.0.0.1",
                                       .port = cl->port,
                                       .token = token,
                                       .timeout_ms = 300000};
        assert_int_equal(hpd_client_create(&p, &cl->status_client), HPD_OK);
        free(token);
    }
    memset(s, 0, sizeof(*s));
    assert_int_equal(hpd_client_status(cl->status_client, &s->r), HPD_OK);
    assert_false(s->r.is_error);
    s->nodes = cl_field(&s->r.result, "nodes");
    if (s->nodes->type != MSGPACK_OBJECT_ARRAY)
        fail_msg("status: 'nodes' is not an array");
    const msgpack_object *q = cl_field(&s->r.result, "requests");
    s->req = (cl_requests_t){.active = cl_u64(q, "active"),
                             .queued = cl_u64(q, "queued"),
                             .finished = cl_u64(q, "finished"),
                             .failed = cl_u64(q, "failed"),
                             .canceled = cl_u64(q, "canceled"),
                             .retried = cl_u64(q, "retried"),
                             .hedged = cl_u64(q, "hedged"),
                             .rejected = cl_u64(q, "rejected")};
}

static inline void cl_status_free(cl_status_t *s)
{
    hpd_rpc_result_destroy(&s->r);
}

static inline cl_requests_t cl_requests(cl_t *cl)
{
    cl_status_t s;
    cl_status(cl, &s);
    const cl_requests_t q = s.req;
    cl_status_free(&s);
    return q;
}

/* The entry of the registered node `name`, NULL when it is not registered. */
static inline const msgpack_object *cl_status_node(const cl_status_t *s, const char *name)
{
    for (uint32_t i = 0; i < s->nodes->via.array.size; i++)
        if (cl_str_is(&s->nodes->via.array.ptr[i], "name", name))
            return &s->nodes->via.array.ptr[i];
    return NULL;
}

/* Whether a node entry shows nothing in use beyond its prefix cache, no job,
 * no open transfer (false before its first heartbeat); why not in `why`. */
static inline bool cl_node_idle(const msgpack_object *node, char *why, size_t len)
{
    const msgpack_object *st = cl_field(node, "stats");
    if (st->type == MSGPACK_OBJECT_NIL) {
        snprintf(why, len, "no heartbeat yet");
        return false;
    }
    const msgpack_object *load = cl_field(st, "load");
    const bool prefill = cl_str_is(st, "role", "prefill");
    const uint64_t busy = prefill ? cl_u64(load, "jobs_queued") + cl_u64(load, "jobs_running") +
                                        cl_u64(load, "jobs_finishing")
                                  : cl_u64(load, "reserved") + cl_u64(load, "running");
    const uint64_t pages = cl_u64(st, "pages_used"), cached = cl_u64(st, "cache_pages");
    const uint64_t slots = cl_u64(st, "slots_used"), audit = cl_u64(st, "audit_errors");
    const uint64_t open = cl_u64_at(st, "xfer.open_transfers");
    const uint64_t reserved = cl_u64(node, "reserved_slots"), jobs = cl_u64(node, "jobs");
    snprintf(why, len, "%llu pages used (%llu cached), %llu slots, %llu audit errors, %llu "
             "open transfers, %llu jobs (node), coordinator: %llu reserved slots, %llu jobs",
             (unsigned long long)pages, (unsigned long long)cached, (unsigned long long)slots,
             (unsigned long long)audit, (unsigned long long)open, (unsigned long long)busy,
             (unsigned long long)reserved, (unsigned long long)jobs);
    return pages == cached && slots == 0 && audit == 0 && open == 0 && busy == 0 &&
           reserved == 0 && jobs == 0;
}

typedef struct {
    uint32_t n_nodes;
    char why[512];
} cl_idle_t;

static inline bool cl_idle_cond(cl_t *cl, void *arg)
{
    cl_idle_t *w = arg;
    cl_status_t s;
    bool idle;
    cl_status(cl, &s);
    idle = s.nodes->via.array.size == w->n_nodes && s.req.active == 0;
    snprintf(w->why, sizeof(w->why), "%u nodes registered (want %u), %llu requests active",
             s.nodes->via.array.size, w->n_nodes, (unsigned long long)s.req.active);
    for (uint32_t i = 0; i < s.nodes->via.array.size && idle; i++) {
        char why[400];
        if (!cl_node_idle(&s.nodes->via.array.ptr[i], why, sizeof(why))) {
            const msgpack_object *name = cl_field(&s.nodes->via.array.ptr[i], "name");
            snprintf(w->why, sizeof(w->why), "node %.*s: %s", (int)name->via.str.size,
                     name->via.str.ptr, why);
            idle = false;
        }
    }
    cl_status_free(&s);
    return idle;
}

/* Waits until exactly n nodes are registered, every one idle, and no
 * request is open. */
static inline void cl_wait_idle(cl_t *cl, uint32_t n_nodes, double timeout_s)
{
    cl_idle_t w = {.n_nodes = n_nodes, .why = ""};
    const double deadline = hpd_time_now() + timeout_s;
    while (!cl_idle_cond(cl, &w)) {
        cl_check_alive(cl);
        if (hpd_time_now() > deadline)
            fail_msg("cluster not idle after %.0f s: %s (logs in %s)", timeout_s, w.why,
                     cl->root);
        usleep(50 * 1000);
    }
}

typedef struct {
    const char *node, *path; /* path NULL: the node is not registered */
    uint64_t value;
} cl_node_value_t;

static inline bool cl_node_value_cond(cl_t *cl, void *arg)
{
    const cl_node_value_t *w = arg;
    cl_status_t s;
    cl_status(cl, &s);
    const msgpack_object *n = cl_status_node(&s, w->node);
    bool ok;
    if (w->path == NULL)
        ok = n == NULL;
    else if (n == NULL || (strncmp(w->path, "stats.", 6) == 0 &&
                           cl_field(n, "stats")->type == MSGPACK_OBJECT_NIL))
        ok = false; /* not registered yet, or no heartbeat yet */
    else
        ok = cl_u64_at(n, w->path) == w->value;
    cl_status_free(&s);
    return ok;
}

/* Waits until node's field at path (in its status entry: "jobs",
 * "stats.load.expired") equals value; path NULL: until the node is no longer
 * registered. Polls client c (may be NULL) meanwhile. */
static inline void cl_wait_node(cl_t *cl, hpd_client_t *c, const char *node, const char *path,
                                uint64_t value, double timeout_s)
{
    char what[200];
    cl_node_value_t w = {.node = node, .path = path, .value = value};
    if (path != NULL)
        snprintf(what, sizeof(what), "%s of node %s to be %llu", path, node,
                 (unsigned long long)value);
    else
        snprintf(what, sizeof(what), "node %s to be gone from the coordinator's status", node);
    cl_wait(cl, c, timeout_s, cl_node_value_cond, &w, what);
}

/* ------------------------------------------------------------ metrics */

/* GET /metrics on a local HTTP port (200 expected); the body, malloc'd. */
static inline char *cl_scrape(uint16_t port)
{
    int code = 0;
    char *body = NULL;
    assert_int_equal(hpd_http_get("127.0.0.1", port, "/metrics", 10000, &code, &body), HPD_OK);
    assert_int_equal(code, 200);
    return body;
}

/* The value of one sample ("name" or "name{labels}") in exposition text;
 * -1 when it is not there. */
static inline double cl_sample(const char *text, const char *name)
{
    const size_t n = strlen(name);
    for (const char *s = text; s != NULL && *s; s = strchr(s, '\n') ? strchr(s, '\n') + 1 : NULL)
        if (strncmp(s, name, n) == 0 && s[n] == ' ')
            return strtod(s + n + 1, NULL);
    return -1;
}

/* ------------------------------------------------------------ reference */

/* hpd-run's tokens for the n prompts of prompts_file: out[i * max_tokens + t]
 * (hpd-run gets 300 s). */
/* n prompts of 90, 92, ... tokens below 512, prompt i drawn from
 * philox(seed + i); written one per line to ROOT/prompts, whose path goes
 * to path (for cl_reference). */
enum { CL_PROMPT_MAX = 100 };
static inline void cl_make_prompts(const cl_t *cl, int n, uint64_t seed,
                                   int32_t (*prompts)[CL_PROMPT_MAX], uint32_t *len, char *path,
                                   size_t path_len)
{
    snprintf(path, path_len, "%s/prompts", cl->root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        len[i] = 90 + 2 * (uint32_t)i;
        assert_true(len[i] <= CL_PROMPT_MAX);
        for (uint32_t t = 0; t < len[i]; t++) {
            prompts[i][t] = (int32_t)(hpd_philox4x32(seed + (uint64_t)i, t, 0).v[0] % 512);
            fprintf(f, t ? ",%d" : "%d", prompts[i][t]);
        }
        fprintf(f, "\n");
    }
    fclose(f);
}

static inline void cl_reference(const cl_t *cl, const char *prompts_file, int n, int max_tokens,
                                const char *sampling, int32_t *out)
{
    char cmd[2048], line[16384];
    snprintf(cmd, sizeof(cmd),
             "OMP_WAIT_POLICY=passive timeout 300 %s --model %s --prompts-file %s "
             "--max-tokens %d --threads 2 --device %s %s",
             HPD_RUN, cl->model, prompts_file, max_tokens, cl->device, sampling);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    for (int i = 0; i < n; i++) {
        assert_non_null(fgets(line, sizeof(line), p));
        char *s = line, *end;
        for (int t = 0; t < max_tokens; t++) {
            out[i * max_tokens + t] = (int32_t)strtol(s, &end, 10);
            assert_true(end != s);
            s = end;
        }
    }
    assert_int_equal(pclose(p), 0);
}

#endif
