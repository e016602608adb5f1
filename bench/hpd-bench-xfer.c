/* hpd-bench-xfer: bandwidth of pushing N MiB as pages of several sizes from
 * one process to another through hpd_xfer (puts, flush, checksummed notice),
 * and, in the same run, `ucx_perftest -t ucp_put_bw` with the same UCX_TLS,
 * devices and message size. Prints both and their ratio; the last line is the
 * worst ratio over pages of 256 KiB and more.
 *
 * Per page size, best of --reps each, all in the same run:
 *   hpd_xfer      N MiB of distinct pages into distinct pages, the default
 *                 path (into memory the receiver allocated through UCX, a
 *                 peer on this host with shared memory copies directly)
 *   UCX puts      the same with every put through ucp_put_nbx (.ucx_puts)
 *   1 page        N MiB as puts of one page into one page, again and again:
 *                 ucx_perftest's access pattern, cache-resident
 *   ucx_perftest  ucp_put_bw, one reused buffer
 *   memcpy        one thread copying the same N MiB in the same pages: the
 *                 ceiling of any path that copies distinct memory
 *
 *   hpd-bench-xfer [--tls tcp] [--dev lo] [--mib 256] [--sizes 65536,262144,1048576,4194304]
 *                  [--reps 3] [--perftest PATH] [--malloc]
 *
 * --malloc: the receiver's region is malloc'd memory registered with UCX
 * (hpd_xfer_register) instead of UCX-allocated (hpd_xfer_alloc, as decode
 * nodes on host memory allocate their pools). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "transport/xfer.h"

static int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w <= 0)
            return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int recv_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r <= 0)
            return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

typedef struct {
    uint64_t seen, want;
    bool bad;
} rx_t;

static void rx_notice(void *arg, const hpd_xfer_notice_t *n)
{
    rx_t *r = arg;
    r->seen++;
    r->bad |= n->status != HPD_OK;
}

/* The receiver: one region, its info over the socket, then notices until
 * told how many to expect and all have come. */
static int use_malloc;

static int receiver(int fd, const char *tls, const char *dev, size_t bytes)
{
    struct event_base *base = event_base_new();
    rx_t rx = {0, UINT64_MAX, false};
    hpd_xfer_params_t xp = {.base = base, .node_id = 2, .tls = tls, .net_devices = dev,
                            .on_notice = rx_notice, .arg = &rx};
    hpd_xfer_ctx_t *ctx;
    uint32_t region;
    void *mem = NULL;
    hpd_rpc_buf_t b;

    if (hpd_xfer_create(&xp, &ctx) != HPD_OK)
        return 1;
    if (!use_malloc ? hpd_xfer_alloc(ctx, bytes, &mem, &region) != HPD_OK
                    : ((mem = calloc(1, bytes)) == NULL ||
                       hpd_xfer_register(ctx, mem, bytes, &region) != HPD_OK))
        return 1;
    memset(mem, 0, bytes);
    hpd_rpc_buf_init(&b);
    hpd_xfer_pack_info(ctx, &b);
    uint32_t n = (uint32_t)b.sb.size;
    if (send_all(fd, &n, 4) || send_all(fd, b.sb.data, n))
        return 1;
    hpd_rpc_buf_destroy(&b);
    if (recv_all(fd, &rx.want, 8))
        return 1;
    while (rx.seen < rx.want)
        event_base_loop(base, EVLOOP_ONCE);
    hpd_xfer_destroy(ctx);
    return rx.bad ? 2 : 0;
}

typedef struct {
    bool done;
    hpd_status_t st;
} tx_t;

static void tx_done(void *arg, uint64_t id, hpd_status_t st)
{
    ((tx_t *)arg)->done = true;
    ((tx_t *)arg)->st = st;
}

typedef struct {
    bool ucx_puts;
    hpd_xfer_ctx_t *ctx;
    hpd_xfer_peer_t *peer;
} sender_t;

/* MiB/s of pushing `bytes` in puts of `size` as one transfer, best of reps:
 * distinct pages into distinct pages, or (one_page) the first page into the
 * first page again and again. -1 on a failure. */
static double push(sender_t *t, struct event_base *base, const uint8_t *src, size_t bytes,
                   size_t size, bool one_page, uint64_t reps, uint64_t *id)
{
    const size_t pages = bytes / size;
    hpd_xfer_put_t *puts = malloc(pages * sizeof(*puts));
    double best = 0;
    if (puts == NULL)
        return -1;
    for (size_t i = 0; i < pages; i++)
        puts[i] = (hpd_xfer_put_t){.local = src + (one_page ? 0 : i * size),
                                   .offset = one_page ? 0 : i * size,
                                   .bytes = size};
    for (uint64_t r = 0; r < reps; r++, (*id)++) {
        tx_t tx = {0};
        const double t0 = hpd_time_now();
        if (hpd_xfer_put(t->peer, *id, puts, (uint32_t)pages) != HPD_OK ||
            hpd_xfer_finish(t->peer, *id, tx_done, &tx, false) != HPD_OK)
            break;
        while (!tx.done)
            event_base_loop(base, EVLOOP_ONCE);
        const double mibps = (double)(pages * size) / (1 << 20) / (hpd_time_now() - t0);
        if (tx.st != HPD_OK)
            break;
        best = mibps > best ? mibps : best;
    }
    free(puts);
    return best > 0 ? best : -1;
}

/* MiB/s of one thread copying `bytes` of distinct memory in pages of
 * `size` (the ceiling of a put path that copies), best of reps. */
static double memcpy_mibps(const uint8_t *src, size_t bytes, size_t size, uint64_t reps)
{
    uint8_t *dst = malloc(bytes);
    double best = 0;
    if (dst == NULL)
        return -1;
    memset(dst, 0, bytes);
    for (uint64_t r = 0; r < reps; r++) {
        const double t0 = hpd_time_now();
        for (size_t off = 0; off + size <= bytes; off += size)
            memcpy(dst + off, src + off, size);
        const double v = (double)bytes / (1 << 20) / (hpd_time_now() - t0);
        best = v > best ? v : best;
    }
    free(dst);
    return best;
}

/* Overall bandwidth in MiB/s from ucx_perftest's "Final:" line, or -1. */
static double perftest(const char *bin, const char *tls, const char *dev, size_t size,
                       uint64_t iters, int port)
{
    char env[256], cmd[1024], line[512];
    double bw = -1;
    snprintf(env, sizeof(env), "UCX_TLS=%s%s%s", tls, dev ? " UCX_NET_DEVICES=" : "",
             dev ? dev : "");
    snprintf(cmd, sizeof(cmd), "%s %s -t ucp_put_bw -s %zu -n %llu -p %d > /dev/null 2>&1 &",
             env, bin, size, (unsigned long long)iters, port);
    if (system(cmd) != 0)
        return -1;
    usleep(500000);
    snprintf(cmd, sizeof(cmd), "%s %s 127.0.0.1 -t ucp_put_bw -s %zu -n %llu -p %d 2>&1", env,
             bin, size, (unsigned long long)iters, port);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    while (fgets(line, sizeof(line), p) != NULL) {
        double f[8];
        if (strncmp(line, "Final:", 6) == 0 &&
            sscanf(line + 6, "%lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3],
                   &f[4], &f[5], &f[6], &f[7]) == 8)
            bw = f[5]; /* overall bandwidth, MB/s with MB = 2^20 bytes */
    }
    pclose(p);
    return bw;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"tls", 1, 0, 't'},  {"dev", 1, 0, 'd'},      {"mib", 1, 0, 'm'},
        {"sizes", 1, 0, 's'}, {"reps", 1, 0, 'r'}, {"perftest", 1, 0, 'p'},
        {"malloc", 0, 0, 'u'}, {0, 0, 0, 0}};
    const char *tls = "tcp", *dev = "lo", *sizes_text = "65536,262144,1048576,4194304";
    const char *perftest_bin = "ucx_perftest";
    uint64_t mib = 256, reps = 3;
    int c;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 't': tls = optarg; break;
        case 'd': dev = strcmp(optarg, "none") == 0 ? NULL : optarg; break;
        case 's': sizes_text = optarg; break;
        case 'p': perftest_bin = optarg; break;
        case 'u': use_malloc = 1; break;
        case 'm':
        case 'r':
            if (hpd_parse_u64(optarg, 1, 1u << 16, c == 'm' ? &mib : &reps) != 0)
                return 2;
            break;
        default:
            fprintf(stderr, "see the comment at the top of bench/hpd-bench-xfer.c\n");
            return 2;
        }
    }
    int32_t *sizes;
    size_t n_sizes;
    char err[128];
    if (hpd_parse_id_list(sizes_text, &sizes, &n_sizes, err, sizeof(err)) != HPD_OK) {
        fprintf(stderr, "--sizes: %s\n", err);
        return 2;
    }
    const size_t bytes = (size_t)mib << 20;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(sv[0]);
        _exit(receiver(sv[1], tls, dev, bytes));
    }
    close(sv[1]);

    /* two senders: the default path and UCX puts only */
    struct event_base *base = event_base_new();
    sender_t tx[2] = {{.ucx_puts = false}, {.ucx_puts = true}};
    uint32_t n;
    if (recv_all(sv[0], &n, 4))
        return 1;
    char *info = malloc(n);
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    msgpack_zone_init(&z, 1024);
    if (recv_all(sv[0], info, n) || msgpack_unpack(info, n, &off, &z, &o) != MSGPACK_UNPACK_SUCCESS)
        return 1;
    uint8_t *src = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 24);
    for (int k = 0; k < 2; k++) {
        hpd_xfer_params_t xp = {.base = base, .node_id = 1 + (uint64_t)k, .tls = tls,
                                .net_devices = dev, .ucx_puts = tx[k].ucx_puts};
        uint32_t region;
        if (hpd_xfer_create(&xp, &tx[k].ctx) != HPD_OK ||
            hpd_xfer_connect(tx[k].ctx, &o, &tx[k].peer) != HPD_OK ||
            hpd_xfer_register(tx[k].ctx, src, bytes, &region) != HPD_OK)
            return 1;
    }
    uint64_t total = (uint64_t)n_sizes * reps * 3;
    if (send_all(sv[0], &total, 8))
        return 1;

    double ours[64], via_ucx[64], one_page[64];
    uint64_t id = 1;
    for (size_t s = 0; s < n_sizes; s++) {
        const size_t size = (size_t)sizes[s];
        ours[s] = push(&tx[0], base, src, bytes, size, false, reps, &id);
        via_ucx[s] = push(&tx[1], base, src, bytes, size, false, reps, &id);
        one_page[s] = push(&tx[0], base, src, bytes, size, true, reps, &id);
        if (ours[s] < 0 || via_ucx[s] < 0 || one_page[s] < 0)
            return 1;
    }
    hpd_xfer_stats_t st;
    hpd_xfer_stats(tx[0].ctx, &st);
    int status;
    waitpid(pid, &status, 0);
    for (int k = 0; k < 2; k++)
        hpd_xfer_destroy(tx[k].ctx);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "hpd-bench-xfer: the receiver failed (checksums?)\n");
        return 1;
    }

    printf("UCX_TLS=%s%s%s, %llu MiB per run, best of %llu, receiver memory %s; receiver "
           "verified every checksum\n",
           tls, dev ? " UCX_NET_DEVICES=" : "", dev ? dev : "", (unsigned long long)mib,
           (unsigned long long)reps, use_malloc ? "malloc" : "allocated by UCX");
    printf("hpd_xfer: %.0f%% of its bytes copied into the receiver's memory mapped here, the "
           "rest put through UCX\n",
           st.bytes_put ? 100.0 * (double)st.bytes_mapped / (double)st.bytes_put : 0.0);
    printf("%8s %9s %9s %9s %12s %6s %6s %9s %6s\n", "page", "hpd_xfer", "UCX puts", "1 page",
           "ucx_perftest", "ratio", "1 page", "memcpy", "ratio");
    printf("%8s %9s %9s %9s %12s %6s %6s %9s %6s\n", "bytes", "MiB/s", "MiB/s", "MiB/s", "MiB/s",
           "", "ratio", "MiB/s", "");
    double worst = 1e30;
    for (size_t s = 0; s < n_sizes; s++) {
        const size_t size = (size_t)sizes[s];
        double ref = -1;
        for (uint64_t r = 0; r < reps; r++) {
            double v = perftest(perftest_bin, tls, dev, size, bytes / size, 13400 + (int)(s * 8 + r));
            ref = v > ref ? v : ref;
        }
        const double ratio = ref > 0 ? ours[s] / ref : 0;
        const double copy = memcpy_mibps(src, bytes, size, reps);
        printf("%8zu %9.1f %9.1f %9.1f %12.1f %6.3f %6.3f %9.1f %6.3f\n", size, ours[s],
               via_ucx[s], one_page[s], ref, ratio, ref > 0 ? one_page[s] / ref : 0, copy,
               copy > 0 ? ours[s] / copy : 0);
        if (size >= 262144 && ratio < worst)
            worst = ratio;
    }
    printf("worst ratio for pages >= 256 KiB: %.3f\n", worst);
    free(sizes);
    free(src);
    free(info);
    msgpack_zone_destroy(&z);
    event_base_free(base);
    return 0;
}
