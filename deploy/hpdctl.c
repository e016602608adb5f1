/* hpdctl: runs a cluster manifest (deploy/manifest.h) on this host.
 *
 *   hpdctl up MANIFEST       start this host's processes, wait until healthy
 *   hpdctl status MANIFEST   every process: pid, health, jobs
 *   hpdctl down MANIFEST     graceful stop: open requests finish first
 *   hpdctl logs MANIFEST NODE [-n N] [-f]
 *   hpdctl render MANIFEST --systemd --out DIR | --k8s [--out FILE]
 *   hpdctl check MANIFEST    validate only
 *
 * Processes run detached (own session) with their output in
 * STATE_DIR/NAME.log and their pid in STATE_DIR/NAME.pid; health comes from
 * each process's /healthz (docs/operations.md). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <ifaddrs.h>
#include <libgen.h>
#include <limits.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "deploy/manifest.h"
#include "deploy/render.h"
#include "engine/engine.h"
#include "model/config.h"
#include "transport/http.h"

typedef struct {
    const char *manifest;
    const char *host;      /* --host: which processes are "here" */
    const char *state_dir; /* --state-dir overrides the manifest's */
    const char *bin_dir;
    const char *out;
    bool systemd, k8s, follow;
    uint32_t timeout_s;
    uint32_t lines;
} opts_t;

static opts_t O;

/* ------------------------------------------------------------ helpers */

static const char *bin_name(hpd_proc_role_t role)
{
    return role == HPD_PROC_COORDINATOR || role == HPD_PROC_DOOR ? "hpd-coordinator"
           : role == HPD_PROC_PREFILL   ? "hpd-prefill"
                                        : "hpd-decode";
}

static const char *build_subdir(hpd_proc_role_t role)
{
    return role == HPD_PROC_COORDINATOR || role == HPD_PROC_DOOR ? "coordinator"
           : role == HPD_PROC_PREFILL   ? "prefill_node"
                                        : "decode_node";
}

/* name in a directory of PATH (out: its path, or name where none). */
static bool find_on_path(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH");
    char *copy = path ? strdup(path) : NULL, *save = NULL;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, len, "%s/%s", d, name);
        if (access(out, X_OK) == 0) {
            free(copy);
            return true;
        }
    }
    free(copy);
    snprintf(out, len, "%s", name);
    return false;
}

/* The programs: --bin-dir, else beside hpdctl (installed) or in the build
 * tree it came from (build/deploy/hpdctl -> build/<component>/), else PATH. */
static bool find_bin(hpd_proc_role_t role, char *out, size_t len)
{
    char self[PATH_MAX], dir[PATH_MAX - 128];
    const char *name = bin_name(role);
    ssize_t n;

    if (O.bin_dir != NULL) {
        snprintf(out, len, "%s/%s", O.bin_dir, name);
        return access(out, X_OK) == 0;
    }
    if ((n = readlink("/proc/self/exe", self, sizeof(self) - 1)) > 0) {
        self[n] = '\0';
        snprintf(dir, sizeof(dir), "%s", dirname(self));
        snprintf(out, len, "%s/%s", dir, name);
        if (access(out, X_OK) == 0)
            return true;
        snprintf(out, len, "%s/../%s/%s", dir, build_subdir(role), name);
        if (access(out, X_OK) == 0 && realpath(out, self) != NULL) {
            snprintf(out, len, "%s", self);
            return true;
        }
    }
    return find_on_path(name, out, len);
}

/* Is this address one of this machine's? */
static bool is_local(const char *host)
{
    struct ifaddrs *ifs, *i;
    char name[256];
    bool yes = false;

    if (O.host != NULL)
        return strcmp(O.host, host) == 0;
    if (!strcmp(host, "127.0.0.1") || !strcmp(host, "localhost") || !strcmp(host, "::1") ||
        !strcmp(host, "0.0.0.0"))
        return true;
    if (gethostname(name, sizeof(name)) == 0 && strcmp(name, host) == 0)
        return true;
    if (getifaddrs(&ifs) != 0)
        return false;
    for (i = ifs; i != NULL && !yes; i = i->ifa_next) {
        char addr[INET6_ADDRSTRLEN];
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr, sizeof(addr));
        yes = strcmp(addr, host) == 0;
    }
    freeifaddrs(ifs);
    return yes;
}

static const char *probe_host(const hpd_manifest_proc_t *p)
{
    return strcmp(p->host, "0.0.0.0") == 0 ? "127.0.0.1" : p->host;
}

static void state_path(const hpd_manifest_t *m, const hpd_manifest_proc_t *p, const char *ext,
                       char *out, size_t len)
{
    snprintf(out, len, "%s/%s.%s", O.state_dir ? O.state_dir : m->state_dir, p->name, ext);
}

static int mkdirs(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return -1;
        *s = '/';
    }
    return mkdir(buf, mode) != 0 && errno != EEXIST ? -1 : 0;
}

static bool alive(pid_t pid);

/* The pid in NAME.pid if that process is alive and is the right program. */
/* The pid in p's pid file when that process still runs p's program; 0
 * when it does not (or there is no pid file). *recorded_p (may be NULL)
 * is the pid the file holds, 0 without one: a file whose process is gone
 * belongs to a process that exited without hpdctl down. */
static pid_t pidfile_runs(const char *pidfile, const char *program, pid_t *recorded_p);

static pid_t running_pid(const hpd_manifest_t *m, const hpd_manifest_proc_t *p,
                         pid_t *recorded_p)
{
    char path[PATH_MAX];
    state_path(m, p, "pid", path, sizeof(path));
    return pidfile_runs(path, bin_name(p->role), recorded_p);
}

/* The pid in pidfile when that process still runs program (by its
 * command line's first word), else 0; *recorded_p (may be NULL): the pid
 * the file holds, 0 without one. */
static pid_t pidfile_runs(const char *pidfile, const char *program, pid_t *recorded_p)
{
    char path[PATH_MAX], *text = NULL, cmd[PATH_MAX];
    size_t len;
    uint64_t pid;
    pid_t out = 0;

    if (recorded_p != NULL)
        *recorded_p = 0;
    snprintf(path, sizeof(path), "%s", pidfile);
    if (access(path, R_OK) != 0 || hpd_read_file(path, &text, &len) != HPD_OK)
        return 0;
    text[strcspn(text, "\n")] = '\0';
    if (recorded_p != NULL && hpd_parse_u64(text, 1, INT32_MAX, &pid) == 0)
        *recorded_p = (pid_t)pid;
    if (hpd_parse_u64(text, 1, INT32_MAX, &pid) == 0 && alive((pid_t)pid)) {
        /* a reused pid runs something else */
        snprintf(path, sizeof(path), "/proc/%llu/cmdline", (unsigned long long)pid);
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            size_t n = fread(cmd, 1, sizeof(cmd) - 1, f);
            cmd[n] = '\0';
            fclose(f);
            char *base = strrchr(cmd, '/');
            if (strcmp(base ? base + 1 : cmd, program) == 0)
                out = (pid_t)pid;
        }
    }
    free(text);
    return out;
}

/* GET /healthz: 200, 503 or 0 when nothing answers; body is its first line. */
static int health(const hpd_manifest_proc_t *p, char *body, size_t len)
{
    int code = 0;
    char *text = NULL;
    body[0] = '\0';
    if (hpd_http_get(probe_host(p), p->metrics_port, "/healthz", 1000, &code, &text) != HPD_OK)
        return 0;
    if (text != NULL) {
        text[strcspn(text, "\n")] = '\0';
        snprintf(body, len, "%s", text);
        free(text);
    }
    return code;
}

static void tail_file(const char *path, uint32_t lines, FILE *out)
{
    char *text = NULL;
    size_t len = 0;
    if (access(path, R_OK) != 0 || hpd_read_file(path, &text, &len) != HPD_OK) {
        fprintf(out, "    (no log at %s)\n", path);
        return;
    }
    size_t start = len;
    uint32_t seen = 0;
    while (start > 0 && seen <= lines)
        if (text[--start] == '\n' && start + 1 < len)
            seen++;
    if (seen > lines)
        start++;
    fwrite(text + start, 1, len - start, out);
    free(text);
}

/* A process is gone: its pid file goes too. */
static void forget(const hpd_manifest_t *m, const hpd_manifest_proc_t *p)
{
    char path[PATH_MAX];
    state_path(m, p, "pid", path, sizeof(path));
    unlink(path);
}

/* ------------------------------------------------------------ up */

/* Writes a new random secret (64 hex digits, then suffix) to path when it
 * does not exist yet (mode 0600, its directory created). */
static bool ensure_secret(const char *path, const char *field, const char *suffix,
                          const char *what)
{
    char dir[PATH_MAX], tok[65];
    unsigned char raw[32];
    struct stat st;
    if (stat(path, &st) == 0)
        return true;
    snprintf(dir, sizeof(dir), "%s", path);
    if (mkdirs(dirname(dir), 0700) != 0) {
        fprintf(stderr, "hpdctl: %s: cannot create the directory of %s: %s\n", field, path,
                strerror(errno));
        return false;
    }
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, raw, sizeof(raw)) != (ssize_t)sizeof(raw)) {
        fprintf(stderr, "hpdctl: cannot read /dev/urandom for %s\n", what);
        if (fd >= 0)
            close(fd);
        return false;
    }
    close(fd);
    for (int i = 0; i < 32; i++)
        snprintf(tok + 2 * i, 3, "%02x", raw[i]);
    const size_t slen = strlen(suffix);
    if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600)) < 0 || write(fd, tok, 64) != 64 ||
        write(fd, suffix, slen) != (ssize_t)slen) {
        fprintf(stderr, "hpdctl: %s: cannot write %s: %s\n", field, path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return false;
    }
    close(fd);
    printf("hpdctl: created %s %s (mode 0600)\n", what, path);
    return true;
}

/* The node secret and the clients' keys: apart, so that no client can
 * register as a node or read other tenants' prompts. */
static bool ensure_credentials(const hpd_manifest_t *m)
{
    return ensure_secret(m->token_file, "token_file", "\n", "the node secret") &&
           ensure_secret(m->client_keys_file, "client_keys_file", " default\n",
                         "a client key (tenant 'default') in");
}

static void stop_pids(const pid_t *pids, uint32_t n, double grace_s);
static void signal_pid(pid_t pid, int sig);

/* Runs argv detached, its output appended to log, its pid into pidfile. */
static pid_t spawn_argv(char **argv, const char *log, const char *pidfile)
{
    char text[24];
    pid_t pid;
    const char *bin = argv[0];
    fflush(stdout);
    if ((pid = fork()) == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int null = open("/dev/null", O_RDONLY);
        setsid(); /* outlives hpdctl and its terminal */
        if (null >= 0)
            dup2(null, 0);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setenv("OMP_WAIT_POLICY", "passive", 0); /* processes share the cores */
        execv(bin, argv);
        fprintf(stderr, "hpdctl: cannot run %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    if (pid > 0) {
        int len = snprintf(text, sizeof(text), "%d\n", (int)pid);
        hpd_write_file(pidfile, text, (size_t)len);
    }
    return pid;
}

static pid_t spawn(const hpd_manifest_t *m, const hpd_manifest_proc_t *p, const char *bin)
{
    char log[PATH_MAX], pidfile[PATH_MAX];
    char **argv;
    if (hpd_manifest_args(m, p, bin, &argv) < 0)
        return -1;
    state_path(m, p, "log", log, sizeof(log));
    state_path(m, p, "pid", pidfile, sizeof(pidfile));
    const pid_t pid = spawn_argv(argv, log, pidfile);
    hpd_manifest_args_free(argv);
    return pid;
}

/* ------------------------------------------------------------ etcd */

/* coordinator.etcd.start, and its host is this one: up starts it first
 * and down stops it last; its pid, log and data are in the state dir. */
static bool etcd_here(const hpd_manifest_t *m)
{
    return m->etcd.start && is_local(m->etcd.host);
}

static void etcd_path(const hpd_manifest_t *m, const char *ext, char *out, size_t len)
{
    snprintf(out, len, "%s/etcd.%s", O.state_dir ? O.state_dir : m->state_dir, ext);
}

/* HPD_ETCD, else Debian's /usr/bin/etcd, else etcd on PATH. */
static bool find_etcd(char *out, size_t len)
{
    const char *e = getenv("HPD_ETCD");
    if (e != NULL) {
        snprintf(out, len, "%s", e);
        return access(out, X_OK) == 0;
    }
    snprintf(out, len, "/usr/bin/etcd");
    if (access(out, X_OK) == 0 || find_on_path("etcd", out, len))
        return true;
    snprintf(out, len, "/usr/bin/etcd");
    return false;
}

/* The pid in etcd.pid when that process still runs etcd, else 0
 * (*recorded_p: the pid the file holds, 0 without one). */
static pid_t etcd_pid(const hpd_manifest_t *m, pid_t *recorded_p)
{
    char path[PATH_MAX];
    etcd_path(m, "pid", path, sizeof(path));
    return pidfile_runs(path, "etcd", recorded_p);
}

/* etcd's GET /health: it answers {"health":"true"} once it serves. */
static bool etcd_healthy(const hpd_manifest_t *m)
{
    int code = 0;
    char *body = NULL;
    const char *host = strcmp(m->etcd.host, "0.0.0.0") == 0 ? "127.0.0.1" : m->etcd.host;
    const bool ok = hpd_http_get(host, m->etcd.port, "/health", 1000, &code, &body) == HPD_OK &&
                    code == 200 && body != NULL && strstr(body, "\"true\"") != NULL;
    free(body);
    return ok;
}

/* Starts the manifest's etcd unless it runs, and waits until it serves.
 * *started_p: its pid when this call started it. Returns 0, or 1 having
 * said why. */
static int etcd_up(const hpd_manifest_t *m, double t0, pid_t *started_p)
{
    char bin[PATH_MAX], log[PATH_MAX], pidfile[PATH_MAX], data[PATH_MAX];
    char **argv;
    pid_t recorded, pid = etcd_pid(m, &recorded);
    *started_p = 0;
    if (pid > 0) {
        printf("  [%5.1fs] %-16s running  (pid %d, left alone)\n", hpd_time_now() - t0, "etcd",
               (int)pid);
    } else {
        if (!find_etcd(bin, sizeof(bin))) {
            fprintf(stderr, "hpdctl: coordinator.etcd.start (line %u): no etcd at %s (expected "
                    "Debian's etcd-server installed, or HPD_ETCD naming the program)\n",
                    m->etcd.line, bin);
            return 1;
        }
        etcd_path(m, "log", log, sizeof(log));
        etcd_path(m, "pid", pidfile, sizeof(pidfile));
        etcd_path(m, "data", data, sizeof(data));
        if (hpd_manifest_etcd_args(m, bin, data, &argv) < 0)
            return 1;
        pid = spawn_argv(argv, log, pidfile);
        hpd_manifest_args_free(argv);
        if (pid <= 0) {
            fprintf(stderr, "hpdctl: cannot start etcd: %s\n", strerror(errno));
            return 1;
        }
        *started_p = pid;
        printf("  [%5.1fs] %-16s started  (etcd, pid %d, %s, data in %s)\n",
               hpd_time_now() - t0, "etcd", (int)pid, m->etcd.endpoint, data);
    }
    const double deadline = t0 + O.timeout_s;
    while (!etcd_healthy(m)) {
        int status;
        const bool ended = *started_p > 0 ? waitpid(pid, &status, WNOHANG) == pid : !alive(pid);
        if (ended || hpd_time_now() > deadline) {
            etcd_path(m, "log", log, sizeof(log));
            fprintf(stderr, "hpdctl: etcd %s; the end of %s:\n",
                    ended ? "exited" : "does not answer /health in time", log);
            tail_file(log, 15, stderr);
            return 1;
        }
        usleep(100 * 1000);
    }
    printf("  [%5.1fs] %-16s healthy  (%s)\n", hpd_time_now() - t0, "etcd", m->etcd.endpoint);
    return 0;
}

/* Stops the local etcd last, after the coordinators gave their leases
 * back. */
static void etcd_down(const hpd_manifest_t *m, double t0)
{
    pid_t recorded, pid = etcd_pid(m, &recorded);
    char path[PATH_MAX];
    if (pid > 0) {
        stop_pids(&pid, 1, 10);
        printf("  [%5.1fs] %-16s stopped\n", hpd_time_now() - t0, "etcd");
    }
    etcd_path(m, "pid", path, sizeof(path));
    if (pid > 0 || recorded > 0)
        unlink(path);
}

typedef struct {
    const hpd_manifest_proc_t *p;
    pid_t pid;
    bool healthy, exited;
    bool kept; /* it was running already: waited for, never stopped by up */
    bool standby; /* a coordinator campaigning while another leads (counts as healthy) */
    off_t log_from; /* its log's size when up started it */
    char last[160];
} up_t;

/* Whether the log holds text after its first `from` bytes. */
static bool log_has_since(const char *path, off_t from, const char *text)
{
    char *all = NULL;
    size_t len = 0;
    bool yes = false;
    if (hpd_read_file(path, &all, &len) == HPD_OK && (size_t)from <= len)
        yes = strstr(all + from, text) != NULL;
    free(all);
    return yes;
}

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* The coordinator that answers /healthz (the leader where there is an
 * election), or NULL. */
static const hpd_manifest_proc_t *leader(const hpd_manifest_t *m)
{
    char body[160];
    for (uint32_t i = 0; i < m->n_coordinators; i++)
        if (health(&m->procs[i], body, sizeof(body)) == 200)
            return &m->procs[i];
    return NULL;
}

/* A coordinator under an election that does not answer because another
 * leads: it campaigns (its log says so since up started it, or up found it
 * running) and does not listen until it leads. */
static bool is_standby(const hpd_manifest_t *m, const up_t *u)
{
    char log[PATH_MAX];
    if (u->p->role != HPD_PROC_COORDINATOR || m->etcd.endpoint[0] == '\0')
        return false;
    state_path(m, u->p, "log", log, sizeof(log));
    const hpd_manifest_proc_t *l = leader(m);
    return l != NULL && l != u->p &&
           (u->kept || log_has_since(log, u->log_from, "campaigning for"));
}

/* Waits until every process of u answers /healthz with 200. */
static int wait_healthy(const hpd_manifest_t *m, up_t *u, uint32_t n, double t0)
{
    const double deadline = t0 + O.timeout_s;
    uint32_t healthy = 0;
    for (uint32_t i = 0; i < n; i++)
        healthy += u[i].healthy;
    while (healthy < n) {
        for (uint32_t i = 0; i < n; i++) {
            char body[160], log[PATH_MAX];
            int status, code;
            if (u[i].healthy)
                continue;
            if ((!u[i].kept && waitpid(u[i].pid, &status, WNOHANG) == u[i].pid) ||
                (u[i].kept && !alive(u[i].pid))) {
                state_path(m, u[i].p, "log", log, sizeof(log));
                if (u[i].kept)
                    fprintf(stderr, "hpdctl: %s (%s) exited; the end of %s:\n", u[i].p->name,
                            hpd_proc_role_name(u[i].p->role), log);
                else
                    fprintf(stderr, "hpdctl: %s (%s) failed: %s %d; the end of %s:\n",
                            u[i].p->name, hpd_proc_role_name(u[i].p->role),
                            WIFEXITED(status) ? "exited with status" : "killed by signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), log);
                tail_file(log, 15, stderr);
                u[i].exited = true;
                return -1;
            }
            code = health(u[i].p, body, sizeof(body));
            if (code == 200) {
                u[i].healthy = true;
                healthy++;
                printf("  [%5.1fs] %-16s healthy  (%s)\n", hpd_time_now() - t0, u[i].p->name, body);
                fflush(stdout);
            } else if (code == 0 && is_standby(m, &u[i])) {
                u[i].healthy = u[i].standby = true;
                healthy++;
                printf("  [%5.1fs] %-16s standby  (campaigning through %s; %s leads)\n",
                       hpd_time_now() - t0, u[i].p->name, m->etcd.endpoint, leader(m)->name);
                fflush(stdout);
            } else if (strcmp(body, u[i].last) != 0 && body[0]) {
                snprintf(u[i].last, sizeof(u[i].last), "%s", body);
                printf("  [%5.1fs] %-16s %s\n", hpd_time_now() - t0, u[i].p->name, body);
                fflush(stdout);
            }
        }
        if (healthy == n)
            break;
        if (hpd_time_now() > deadline) {
            for (uint32_t i = 0; i < n; i++)
                if (!u[i].healthy) {
                    char log[PATH_MAX];
                    state_path(m, u[i].p, "log", log, sizeof(log));
                    fprintf(stderr, "hpdctl: %s is not healthy after %u s (last health: %s%s); "
                            "the end of %s:\n", u[i].p->name, O.timeout_s,
                            u[i].last[0] ? u[i].last : "no answer",
                            u[i].p->role == HPD_PROC_COORDINATOR && m->etcd.endpoint[0] &&
                                    leader(m) == NULL
                                ? "; no coordinator leads"
                                : "",
                            log);
                    tail_file(log, 15, stderr);
                }
            return -1;
        }
        usleep(100 * 1000);
    }
    return 0;
}

/* What up needs before it starts anything: the model (for nodes), the
 * binaries, the state directory and the credentials. */
static int up_prepare(const hpd_manifest_t *m, char bins[HPD_PROC_DOOR + 1][PATH_MAX])
{
    char dir[PATH_MAX];
    struct stat st;
    uint32_t nodes = 0;
    snprintf(dir, sizeof(dir), "%s/config.json", m->model);
    for (uint32_t i = 0; i < m->n_procs; i++)
        nodes += is_local(m->procs[i].host) && m->procs[i].role != HPD_PROC_COORDINATOR;
    if (nodes > 0 && stat(dir, &st) != 0) {
        fprintf(stderr, "hpdctl: model: %s has no config.json (expected a model directory; "
                "build/tools/hpd-mkmodel --out DIR writes a small one)\n", m->model);
        return 2;
    }
    for (int r = 0; r <= HPD_PROC_DOOR; r++)
        if (!find_bin((hpd_proc_role_t)r, bins[r], PATH_MAX)) {
            fprintf(stderr, "hpdctl: cannot find %s (expected beside hpdctl, in its build tree "
                    "or on PATH; or give --bin-dir)\n", bins[r]);
            return 2;
        }
    const char *sd = O.state_dir ? O.state_dir : m->state_dir;
    if (mkdirs(sd, 0755) != 0) {
        fprintf(stderr, "hpdctl: state_dir: cannot create %s: %s\n", sd, strerror(errno));
        return 2;
    }
    return ensure_credentials(m) ? 0 : 2;
}

/* Starts the local processes that do not run (all of them on a fresh host;
 * on a partly running cluster the missing ones: a crashed coordinator, a
 * dead node), leaves the running ones alone, and waits until every local
 * process is healthy. On a failure it stops only what it started. */
static int cmd_up(const hpd_manifest_t *m)
{
    char bins[HPD_PROC_DOOR + 1][PATH_MAX];
    const double t0 = hpd_time_now();
    int rc = up_prepare(m, bins);
    if (rc != 0)
        return rc;
    up_t *u = calloc(m->n_procs, sizeof(*u));
    pid_t *pids = calloc(m->n_procs, sizeof(*pids));
    uint32_t n = 0, kept = 0, started = 0;
    if (u == NULL || pids == NULL) {
        fprintf(stderr, "hpdctl: out of memory for %u processes\n", m->n_procs);
        rc = 2;
        goto out;
    }
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        if (!is_local(p->host))
            continue;
        const pid_t pid = running_pid(m, p, NULL);
        u[n++] = (up_t){.p = p, .pid = pid > 0 ? pid : 0, .kept = pid > 0};
        kept += pid > 0;
    }
    if (n == 0) {
        fprintf(stderr, "hpdctl: no process of %s runs on this host (hosts are matched against "
                "this machine's addresses and name; --host picks one)\n", m->path);
        rc = 2;
        goto out;
    }
    const char *sd = O.state_dir ? O.state_dir : m->state_dir;
    if (kept == n)
        printf("hpdctl: all %u local processes of cluster '%s' run already\n", n, m->cluster);
    else
        printf("hpdctl: starting %u processes of cluster '%s' (logs in %s)%s\n", n - kept,
               m->cluster, sd, kept ? "; the running ones are left alone" : "");
    /* the election's etcd first, where up starts it */
    pid_t etcd_started = 0;
    if (etcd_here(m) && etcd_up(m, t0, &etcd_started) != 0)
        goto fail;
    /* the coordinators first (m->procs[0], then its standbys: each leads or
     * campaigns before the next starts), so that nodes register at once */
    for (uint32_t i = 0; i < n; i++) {
        if (u[i].kept) {
            printf("  [%5.1fs] %-16s running  (pid %d, left alone)\n", hpd_time_now() - t0,
                   u[i].p->name, (int)u[i].pid);
            continue;
        }
        char log[PATH_MAX];
        state_path(m, u[i].p, "log", log, sizeof(log));
        u[i].log_from = file_size(log);
        u[i].pid = spawn(m, u[i].p, bins[u[i].p->role]);
        if (u[i].pid < 0) {
            fprintf(stderr, "hpdctl: cannot start %s: %s\n", u[i].p->name, strerror(errno));
            u[i].pid = 0;
            goto fail;
        }
        started++;
        printf("  [%5.1fs] %-16s started  (%s, pid %d, %s:%u, metrics %u)\n", hpd_time_now() - t0,
               u[i].p->name, hpd_proc_role_name(u[i].p->role), (int)u[i].pid, u[i].p->host,
               u[i].p->port, u[i].p->metrics_port);
        if (u[i].p->role == HPD_PROC_COORDINATOR && wait_healthy(m, &u[i], 1, t0) != 0)
            goto fail;
    }
    if (wait_healthy(m, u, n, t0) != 0)
        goto fail;
    const hpd_manifest_proc_t *lead = leader(m), *co = lead != NULL ? lead : &m->procs[0];
    uint32_t standbys = 0;
    for (uint32_t i = 0; i < n; i++)
        standbys += u[i].standby;
    printf("hpdctl: cluster '%s' is up in %.1f s: coordinator %s:%u%s%s, %u local processes "
           "healthy (%u started, %u were running%s)\n", m->cluster, hpd_time_now() - t0,
           co->host, co->port, m->n_coordinators > 1 ? " leading: " : "",
           m->n_coordinators > 1 ? co->name : "", n, started, kept,
           standbys ? "; standbys counted healthy" : "");
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "hpdctl: stopping the processes started%s\n",
            kept ? " (the ones that were running stay)" : "");
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!u[i].kept && u[i].pid > 0 && !u[i].exited)
            pids[k++] = u[i].pid;
    stop_pids(pids, k, 10);
    for (uint32_t i = 0; i < n; i++)
        if (!u[i].kept && u[i].pid > 0)
            forget(m, u[i].p);
    if (etcd_started > 0) {
        char path[PATH_MAX];
        stop_pids(&etcd_started, 1, 10);
        etcd_path(m, "pid", path, sizeof(path));
        unlink(path);
    }
    rc = 1;
out:
    free(u);
    free(pids);
    return rc;
}

/* Stops one local process (a coordinator drains for a restart: its open
 * requests finish and its nodes stay up, to register again with the new
 * one; a node drains its jobs), then up starts it again. */
static int cmd_restart(const hpd_manifest_t *m, const char *name)
{
    const hpd_manifest_proc_t *p = NULL;
    for (uint32_t i = 0; i < m->n_procs && p == NULL; i++)
        if (strcmp(m->procs[i].name, name) == 0)
            p = &m->procs[i];
    if (p == NULL) {
        fprintf(stderr, "hpdctl: restart: no process named '%s' in %s\n", name, m->path);
        return 2;
    }
    if (!is_local(p->host)) {
        fprintf(stderr, "hpdctl: restart: %s runs on %s, not on this host\n", name, p->host);
        return 2;
    }
    const pid_t pid = running_pid(m, p, NULL);
    if (pid > 0) {
        const double t0 = hpd_time_now();
        const double grace = p->drain_timeout_ms / 1000.0 + 10;
        printf("hpdctl: restarting %s (pid %d): draining it first\n", name, (int)pid);
        signal_pid(pid, p->role == HPD_PROC_COORDINATOR ? SIGUSR1 : SIGTERM);
        while (alive(pid) && hpd_time_now() - t0 < grace)
            usleep(50 * 1000);
        if (alive(pid)) {
            fprintf(stderr, "hpdctl: %s did not stop in %.0f s; killing it\n", name, grace);
            signal_pid(pid, SIGKILL);
            while (alive(pid))
                usleep(10 * 1000);
        }
        printf("  [%5.1fs] %-16s stopped\n", hpd_time_now() - t0, name);
        forget(m, p);
    }
    return cmd_up(m);
}

/* ------------------------------------------------------------ down */

static bool alive(pid_t pid)
{
    char path[64], stat[256];
    int status;
    if (pid <= 0)
        return false;
    if (waitpid(pid, &status, WNOHANG) == pid) /* our child (hpdctl up failing) */
        return false;
    if (kill(pid, 0) != 0)
        return false;
    /* an exited process nobody reaped yet (a zombie) has stopped too */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    const size_t n = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *end = strrchr(stat, ')'); /* "pid (comm) S ..." */
    return !(end != NULL && end[1] == ' ' && end[2] == 'Z');
}

/* kill(2) for one process: pid 0 or below would signal a process group
 * (ours with 0, every process we may signal with -1), never meant here. */
static void signal_pid(pid_t pid, int sig)
{
    if (pid > 0)
        kill(pid, sig);
}

/* SIGTERM (a drain), then SIGKILL after grace_s. */
static void stop_pids(const pid_t *pids, uint32_t n, double grace_s)
{
    const double deadline = hpd_time_now() + grace_s;
    bool any = true;
    for (uint32_t i = 0; i < n; i++)
        signal_pid(pids[i], SIGTERM);
    while (any && hpd_time_now() < deadline) {
        any = false;
        for (uint32_t i = 0; i < n; i++)
            any |= alive(pids[i]);
        if (any)
            usleep(50 * 1000);
    }
    for (uint32_t i = 0; i < n; i++)
        if (alive(pids[i]))
            signal_pid(pids[i], SIGKILL);
}

static int cmd_down(const hpd_manifest_t *m)
{
    pid_t *pids = calloc(m->n_procs, sizeof(*pids));
    const hpd_manifest_proc_t **procs = calloc(m->n_procs, sizeof(*procs));
    uint32_t n = 0, drain_s = 30, n_gone = 0;
    const double t0 = hpd_time_now();
    pid_t coord = 0;
    int rc = 0;

    if (pids == NULL || procs == NULL) {
        fprintf(stderr, "hpdctl: out of memory for %u processes\n", m->n_procs);
        rc = 2;
        goto out;
    }

    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        pid_t pid, recorded;
        if (p->drain_timeout_ms / 1000 + 1 > drain_s)
            drain_s = p->drain_timeout_ms / 1000 + 1;
        if (!is_local(p->host))
            continue;
        if ((pid = running_pid(m, p, &recorded)) <= 0) {
            if (recorded > 0) {
                char log[PATH_MAX];
                state_path(m, p, "log", log, sizeof(log));
                fprintf(stderr, "hpdctl: %s (%s, pid %d) had already exited, not stopped by "
                        "hpdctl: it crashed or was killed (its log: %s)\n", p->name,
                        hpd_proc_role_name(p->role), (int)recorded, log);
                forget(m, p);
                n_gone++;
            }
            continue;
        }
        char body[160];
        /* under an election the local coordinator that answers leads; the
         * others are standbys */
        if (p->role == HPD_PROC_COORDINATOR &&
            (m->etcd.endpoint[0] == '\0' || health(p, body, sizeof(body)) == 200))
            coord = pid;
        procs[n] = p;
        pids[n++] = pid;
    }
    /* the front doors first: their open requests finish while the
     * coordinator still serves them */
    pid_t *door_pids = calloc(n + 1, sizeof(*door_pids));
    uint32_t n_doors = 0;
    for (uint32_t i = 0; door_pids != NULL && i < n; i++)
        if (procs[i]->role == HPD_PROC_DOOR)
            door_pids[n_doors++] = pids[i];
    stop_pids(door_pids, n_doors, drain_s);
    free(door_pids);
    for (uint32_t i = 0; n_doors > 0 && i < n; i++) {
        if (procs[i]->role != HPD_PROC_DOOR)
            continue;
        printf("  [%5.1fs] %-16s stopped  (a front door)\n", hpd_time_now() - t0,
               procs[i]->name);
        forget(m, procs[i]);
        pids[i] = 0;
    }
    /* standbys next: none must take over while the leader drains */
    for (uint32_t i = 0; i < n; i++) {
        if (procs[i]->role != HPD_PROC_COORDINATOR || pids[i] == coord)
            continue;
        stop_pids(&pids[i], 1, 10);
        printf("  [%5.1fs] %-16s stopped  (a standby)\n", hpd_time_now() - t0, procs[i]->name);
        forget(m, procs[i]);
        pids[i] = 0;
    }
    const double deadline = t0 + (O.timeout_s ? O.timeout_s : drain_s + 10);
    uint32_t running = 0;
    for (uint32_t i = 0; i < n; i++)
        running += pids[i] != 0;
    if (running == 0) {
        if (etcd_here(m))
            etcd_down(m, t0);
        printf("hpdctl: nothing of cluster '%s' runs on this host\n", m->cluster);
        rc = n_gone > 0 ? 1 : 0;
        goto out;
    }
    /* The coordinator drains (refuses new requests, lets open ones finish)
     * and then tells the nodes to stop; without a local coordinator the
     * nodes drain themselves. */
    if (coord > 0) {
        printf("hpdctl: draining the coordinator (pid %d): open requests finish first\n",
               (int)coord);
        signal_pid(coord, SIGTERM);
    } else {
        for (uint32_t i = 0; i < n; i++)
            signal_pid(pids[i], SIGTERM);
    }
    bool termed = coord <= 0;
    double coord_gone = 0; /* when the local coordinator stopped */
    bool any = true;
    while (any && hpd_time_now() < deadline) {
        any = false;
        for (uint32_t i = 0; i < n; i++) {
            if (pids[i] == 0)
                continue;
            if (!alive(pids[i])) {
                printf("  [%5.1fs] %-16s stopped\n", hpd_time_now() - t0, procs[i]->name);
                forget(m, procs[i]);
                if (pids[i] == coord) {
                    coord = 0;
                    coord_gone = hpd_time_now();
                }
                pids[i] = 0;
                continue;
            }
            any = true;
        }
        /* nodes still up 2 s after the coordinator (its shutdown notice did
         * not reach them): drain them directly */
        if (any && !termed && coord == 0 && hpd_time_now() - coord_gone > 2.0) {
            for (uint32_t i = 0; i < n; i++)
                if (pids[i] != 0)
                    signal_pid(pids[i], SIGTERM);
            termed = true;
        }
        if (any)
            usleep(50 * 1000);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (pids[i] != 0 && alive(pids[i])) {
            fprintf(stderr, "hpdctl: %s (pid %d) did not stop in time; killing it\n",
                    procs[i]->name, (int)pids[i]);
            signal_pid(pids[i], SIGKILL);
            forget(m, procs[i]);
            rc = 1;
        }
    }
    if (etcd_here(m)) /* the election's etcd last: the leases went back */
        etcd_down(m, t0);
    printf("hpdctl: cluster '%s' is down on this host (%.1f s)\n", m->cluster, hpd_time_now() - t0);
    if (n_gone > 0)
        fprintf(stderr, "hpdctl: %u process%s had exited before the down (named above)\n",
                n_gone, n_gone == 1 ? "" : "es");
    rc = n_gone > 0 ? 1 : rc;
out:
    free(pids);
    free(procs);
    return rc;
}

/* ------------------------------------------------------------ status, logs */

static int cmd_status(const hpd_manifest_t *m)
{
    int rc = 0;
    printf("cluster %s (%s)\n%-18s %-12s %-22s %-8s %-8s %s\n", m->cluster, m->path, "NAME",
           "ROLE", "ADDRESS", "PID", "HEALTH", "DETAIL");
    if (m->etcd.endpoint[0] != '\0') {
        char addr[160], pid_text[16] = "-";
        pid_t recorded, pid = etcd_here(m) ? etcd_pid(m, &recorded) : 0;
        const bool ok = etcd_healthy(m);
        if (pid > 0)
            snprintf(pid_text, sizeof(pid_text), "%d", (int)pid);
        else if (!etcd_here(m))
            snprintf(pid_text, sizeof(pid_text), m->etcd.start ? "remote" : "external");
        snprintf(addr, sizeof(addr), "%s:%u", m->etcd.host, m->etcd.port);
        printf("%-18s %-12s %-22s %-8s %-8s %s\n", "etcd", "etcd", addr, pid_text,
               ok ? "ok" : "down", ok ? "the coordinators' election" : "(no answer on /health)");
        rc |= !ok;
    }
    const hpd_manifest_proc_t *lead = leader(m);
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        char addr[160], body[160], pid_text[16] = "-";
        pid_t pid = is_local(p->host) ? running_pid(m, p, NULL) : 0;
        int code = health(p, body, sizeof(body));
        if (pid > 0)
            snprintf(pid_text, sizeof(pid_text), "%d", (int)pid);
        else if (!is_local(p->host))
            snprintf(pid_text, sizeof(pid_text), "remote");
        snprintf(addr, sizeof(addr), "%s:%u", p->host, p->port);
        /* a coordinator that campaigns while another leads does not listen */
        const bool standby = p->role == HPD_PROC_COORDINATOR && m->etcd.endpoint[0] != '\0' &&
                             code == 0 && lead != NULL && (pid > 0 || !is_local(p->host));
        if (standby)
            snprintf(body, sizeof(body), "campaigning; listens once it leads (%s leads)",
                     lead->name);
        printf("%-18s %-12s %-22s %-8s %-8s %s\n", p->name, hpd_proc_role_name(p->role), addr,
               pid_text, code == 200 ? "ok" : standby ? "standby" : code ? "unready" : "down",
               body[0] ? body : "(no answer on /healthz)");
        rc |= code != 200 && !standby;
    }
    const hpd_manifest_proc_t *co = lead != NULL ? lead : &m->procs[0];
    if (co->http_port != 0) { /* the leader's OpenAI-compatible API (docs/api.md) */
        int code = 0;
        char *body = NULL;
        const char *name = co->served_model_name, *slash = strrchr(m->model, '/');
        if (name[0] == '\0')
            name = slash != NULL ? slash + 1 : m->model;
        const hpd_status_t st =
            hpd_http_get(probe_host(co), co->http_port, "/health", 1000, &code, &body);
        free(body);
        printf("HTTP API: http://%s:%u/v1, model '%s': %s\n", co->host, co->http_port, name,
               st != HPD_OK ? "down" : code == 200 ? "ok" : "draining");
        rc |= st != HPD_OK || code != 200;
    }
    for (uint32_t i = 0; i < m->n_procs; i++) { /* the front doors' */
        const hpd_manifest_proc_t *d = &m->procs[i];
        int code = 0;
        char *body = NULL;
        if (d->role != HPD_PROC_DOOR || d->http_port == 0)
            continue;
        const hpd_status_t st =
            hpd_http_get(probe_host(d), d->http_port, "/health", 1000, &code, &body);
        free(body);
        printf("HTTP API of %s: http://%s:%u/v1: %s\n", d->name, d->host, d->http_port,
               st != HPD_OK ? "down" : code == 200 ? "ok" : "draining");
        rc |= st != HPD_OK || code != 200;
    }
    return rc ? 1 : 0;
}

static int cmd_logs(const hpd_manifest_t *m, const char *name)
{
    const hpd_manifest_proc_t *p = hpd_manifest_find(m, name);
    char path[PATH_MAX];
    const bool etcd = p == NULL && strcmp(name, "etcd") == 0 && m->etcd.start;
    if (p == NULL && !etcd) {
        fprintf(stderr, "hpdctl logs: no process named '%s' in %s (expected coordinator%s or "
                "one of the nodes)\n", name, m->path, m->etcd.start ? ", etcd" : "");
        return 2;
    }
    if (etcd)
        etcd_path(m, "log", path, sizeof(path));
    else
        state_path(m, p, "log", path, sizeof(path));
    if (!O.follow) {
        tail_file(path, O.lines, stdout);
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "hpdctl logs: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    tail_file(path, O.lines, stdout);
    fseek(f, 0, SEEK_END);
    for (;;) {
        char buf[4096];
        size_t k = fread(buf, 1, sizeof(buf), f);
        if (k > 0) {
            fwrite(buf, 1, k, stdout);
            fflush(stdout);
        } else {
            clearerr(f);
            usleep(200 * 1000);
        }
    }
}

/* ------------------------------------------------------------ check */

/* Beyond the manifest itself: each node's pools against the model (a pack
 * size above its full-attention layers is refused) and, for a node on this
 * host with its memory on the host (cpu), against the memory available. */
static int cmd_check(const hpd_manifest_t *m, const char *path)
{
    hpd_model_config_t cfg;
    const uint64_t avail = hpd_mem_available();
    int rc = 0;

    if (hpd_model_config_load(m->model, &cfg) != HPD_OK) {
        fprintf(stderr, "%s: model: cannot read %s/config.json (the nodes' pools are checked "
                "against it)\n", path, m->model);
        return 2;
    }
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        hpd_engine_params_t ep;
        hpd_engine_plan_t plan;
        char why[300];
        if (p->role == HPD_PROC_COORDINATOR || p->role == HPD_PROC_DOOR)
            continue;
        /* a zero field is the node's default, as on its command line */
        hpd_engine_params_init(&ep);
        if (p->kv_block)
            ep.kv_layout.block_size = p->kv_block;
        if (p->kv_pack)
            ep.kv_layout.pack_size = p->kv_pack;
        ep.kv_layout.order = strcmp(p->kv_order, "hnd") == 0 ? HPD_KV_HND : HPD_KV_NHD;
        ep.n_pages = p->kv_pages;
        if (p->max_batch)
            ep.max_batch = p->max_batch;
        ep.max_context = p->max_context;
        if (p->prefill_chunk)
            ep.prefill_chunk = p->prefill_chunk;
        ep.prefix_cache = p->role == HPD_PROC_PREFILL && p->prefix_cache;
        ep.n_checkpoints = p->checkpoints;
        /* at tensor parallelism each rank has pools of its shard's heads */
        const uint32_t tp = p->tp > 0 ? p->tp : 1;
        hpd_model_config_t rank_cfg = cfg;
        hpd_shard_t shard;
        if (tp > 1) {
            if (hpd_shard_plan(&cfg, tp, 0, &shard, why, sizeof(why)) != HPD_OK) {
                fprintf(stderr, "%s:%u: %s: tp %u: %s\n", path, p->line, p->name, tp, why);
                rc = 2;
                continue;
            }
            hpd_shard_config(&cfg, &shard, &rank_cfg);
        }
        if (hpd_engine_plan(&ep, &rank_cfg, &plan, why, sizeof(why)) != HPD_OK) {
            fprintf(stderr, "%s:%u: %s: %s\n", path, p->line, p->name, why);
            rc = 2;
            continue;
        }
        plan.device_bytes *= tp;
        const double gib = plan.device_bytes / 1073741824.0;
        char ranks[32] = "";
        if (tp > 1)
            snprintf(ranks, sizeof(ranks), " a rank, ranks: %u", tp);
        printf("  %-16s %-8s %u KV pages, %u state slots, %u checkpoints%s: %.2f GiB of pools\n",
               p->name, hpd_proc_role_name(p->role), plan.n_pages, plan.n_slots,
               plan.n_checkpoints, ranks, gib);
        if (p->gpu < 0 && is_local(p->host) && avail > 0 && plan.device_bytes > avail) {
            fprintf(stderr, "%s:%u: %s: its pools need %.2f GiB (max context %u) and this host "
                    "has %.2f GiB available: lower max_context, max_batch or kv_pages\n", path,
                    p->line, p->name, gib, plan.max_context, avail / 1073741824.0);
            rc = 2;
        }
    }
    if (rc == 0)
        printf("%s: ok (cluster %s: %u processes)\n", path, m->cluster, m->n_procs);
    return rc;
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hpdctl COMMAND MANIFEST [options]\n"
            "  up MANIFEST             start this host's processes that do not run (a\n"
            "                          crashed coordinator, a dead node; the running ones\n"
            "                          are left alone); returns once all are registered and\n"
            "                          healthy, or stops what it started and says why\n"
            "  restart MANIFEST NAME   drain and stop one process, then up (a coordinator's\n"
            "                          nodes stay up and register again)\n"
            "  status MANIFEST         each process: pid, /healthz, jobs in flight\n"
            "  down MANIFEST           graceful stop: in-flight requests finish first\n"
            "  logs MANIFEST NODE      a process's log (-n N last lines, -f follow)\n"
            "  render MANIFEST --systemd --out DIR | --k8s [--out FILE]\n"
            "  check MANIFEST          validate the manifest\n"
            "options:\n"
            "  --host ADDR       treat processes with this host as local (default: any of\n"
            "                    this machine's addresses, its name and 127.0.0.1)\n"
            "  --state-dir DIR   pid files and logs (the manifest's state_dir)\n"
            "  --bin-dir DIR     where hpd-coordinator, hpd-prefill and hpd-decode are\n"
            "  --timeout-s N     up: wait for health (120); down: wait for the drain\n");
}

static int run_up(const hpd_manifest_t *m, const char *arg)
{
    return cmd_up(m);
}

static int run_restart(const hpd_manifest_t *m, const char *name)
{
    return cmd_restart(m, name);
}

static int run_down(const hpd_manifest_t *m, const char *arg)
{
    return cmd_down(m);
}

static int run_status(const hpd_manifest_t *m, const char *arg)
{
    return cmd_status(m);
}

static int run_render(const hpd_manifest_t *m, const char *arg)
{
    char bins[HPD_PROC_DOOR + 1][PATH_MAX], err[8192];
    if (O.systemd == O.k8s) {
        fprintf(stderr, "hpdctl render: give exactly one of --systemd and --k8s\n");
        return 2;
    }
    if (O.systemd && O.out == NULL) {
        fprintf(stderr, "hpdctl render: --systemd needs --out DIR (one unit file per "
                "process)\n");
        return 2;
    }
    for (int r = 0; r <= HPD_PROC_DOOR; r++)
        find_bin((hpd_proc_role_t)r, bins[r], sizeof(bins[r]));
    hpd_render_params_t rp = {.manifest = m, .bins = {bins[0], bins[1], bins[2], bins[3]}, .out = O.out};
    const int rc = O.systemd ? hpd_render_systemd(&rp, err, sizeof(err))
                             : hpd_render_k8s(&rp, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "hpdctl render: %s\n", err);
    return rc;
}

/* The commands: each takes the manifest and, where takes_name, a
 * process's name (else the manifest's path). */
typedef struct {
    const char *name;
    bool takes_name, up; /* up: --timeout-s defaults to 120 */
    int (*fn)(const hpd_manifest_t *m, const char *arg);
} command_t;

static const command_t commands[] = {
    {.name = "up", .up = true, .fn = run_up},
    {.name = "restart", .takes_name = true, .up = true, .fn = run_restart},
    {.name = "down", .fn = run_down},
    {.name = "status", .fn = run_status},
    {.name = "logs", .takes_name = true, .fn = cmd_logs},
    {.name = "render", .fn = run_render},
    {.name = "check", .fn = cmd_check},
};

int main(int argc, char **argv)
{
    enum { O_HOST = 256, O_STATE, O_BIN, O_OUT, O_SYSTEMD, O_K8S, O_TIMEOUT, O_HELP };
    static const struct option longopts[] = {
        {"host", 1, 0, O_HOST}, {"state-dir", 1, 0, O_STATE}, {"bin-dir", 1, 0, O_BIN},
        {"out", 1, 0, O_OUT}, {"systemd", 0, 0, O_SYSTEMD}, {"k8s", 0, 0, O_K8S},
        {"timeout-s", 1, 0, O_TIMEOUT}, {"follow", 0, 0, 'f'}, {"lines", 1, 0, 'n'},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    char err[8192];
    hpd_manifest_t *m = NULL;
    uint64_t v;
    int c, rc;

    signal(SIGPIPE, SIG_IGN);
    O.lines = 100;
    while ((c = getopt_long(argc, argv, "fn:", longopts, NULL)) != -1) {
        switch (c) {
        case O_HOST: O.host = optarg; break;
        case O_STATE: O.state_dir = optarg; break;
        case O_BIN: O.bin_dir = optarg; break;
        case O_OUT: O.out = optarg; break;
        case O_SYSTEMD: O.systemd = true; break;
        case O_K8S: O.k8s = true; break;
        case 'f': O.follow = true; break;
        case 'n':
        case O_TIMEOUT:
            if (hpd_parse_u64(optarg, 1, 1u << 20, &v) != 0) {
                fprintf(stderr, "hpdctl: %s: '%s' is invalid (expected a positive integer)\n",
                        c == 'n' ? "-n" : "--timeout-s", optarg);
                return 2;
            }
            if (c == 'n')
                O.lines = (uint32_t)v;
            else
                O.timeout_s = (uint32_t)v;
            break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[optind], *path = argv[optind + 1];
    const command_t *cmd = NULL;
    for (size_t i = 0; i < HPD_ARRAY_SIZE(commands) && cmd == NULL; i++)
        if (strcmp(commands[i].name, name) == 0)
            cmd = &commands[i];
    if (cmd == NULL) {
        fprintf(stderr, "hpdctl: unknown command '%s' (expected up, restart, down, status, logs, "
                "render or check)\n", name);
        return 2;
    }
    if (argc - optind != 2 + (cmd->takes_name ? 1 : 0)) {
        fprintf(stderr, "hpdctl %s: %s\n", name,
                cmd->takes_name && argc - optind == 2 ? "which process? (a name of the manifest)"
                                                     : "unexpected arguments");
        usage(stderr);
        return 2;
    }
    if (hpd_manifest_load(path, &m, err, sizeof(err)) != HPD_OK) {
        fprintf(stderr, "%s", err);
        return 2;
    }
    if (cmd->up && O.timeout_s == 0)
        O.timeout_s = 120;
    rc = cmd->fn(m, cmd->takes_name ? argv[optind + 2] : path);
    hpd_manifest_destroy(m);
    return rc;
}
