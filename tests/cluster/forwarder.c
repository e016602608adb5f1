/* A user-space forwarder between two network interfaces, for tests of a
 * slow or lossy link where the kernel has no `tc netem`:
 *
 *   hpd-test-forwarder IF_A IF_B DELAY_MS LOSS_PER_MILLE SEED
 *
 * Every Ethernet frame that arrives on one interface leaves on the other
 * DELAY_MS later, unless it is dropped (LOSS_PER_MILLE of them, drawn from
 * SEED). Frames keep their virtio-net header (PACKET_VNET_HDR), so that a
 * TCP segment the sender's stack left for offload is segmented and
 * checksummed by the kernel on the way out, as a NIC would. Runs until
 * SIGTERM; prints the frames it forwarded and dropped on exit. Root only;
 * a test attaches it to a veth of its own between a node's namespace and
 * the bridge. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME (65536 + sizeof(struct virtio_net_hdr))
#define QUEUE 4096 /* frames in flight per direction */

typedef struct {
    double due;
    size_t len;
    uint8_t *data;
} frame_t;

typedef struct {
    int in, out;
    frame_t q[QUEUE];
    unsigned head, n;
    unsigned long forwarded, dropped, overflow;
} dir_t;

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A raw socket on ifname, in promiscuous mode, with virtio-net headers. */
static int open_if(const char *ifname)
{
    const int s = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    const int on = 1;
    if (s < 0) {
        perror("socket(AF_PACKET)");
        return -1;
    }
    const unsigned idx = if_nametoindex(ifname);
    if (idx == 0) {
        fprintf(stderr, "forwarder: no interface '%s'\n", ifname);
        return -1;
    }
    if (setsockopt(s, SOL_PACKET, PACKET_VNET_HDR, &on, sizeof(on)) != 0) {
        perror("PACKET_VNET_HDR");
        return -1;
    }
    struct sockaddr_ll sa = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                             .sll_ifindex = (int)idx};
    if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        perror("bind");
        return -1;
    }
    struct packet_mreq mr = {.mr_ifindex = (int)idx, .mr_type = PACKET_MR_PROMISC};
    if (setsockopt(s, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof(mr)) != 0) {
        perror("PACKET_MR_PROMISC");
        return -1;
    }
    return s;
}

/* Reads what waits on d->in: each frame is queued or dropped. */
static void take(dir_t *d, double delay, unsigned loss, unsigned *seed)
{
    static uint8_t buf[MAX_FRAME];
    for (;;) {
        struct sockaddr_ll from;
        socklen_t fl = sizeof(from);
        const ssize_t n = recvfrom(d->in, buf, sizeof(buf), MSG_DONTWAIT,
                                   (struct sockaddr *)&from, &fl);
        if (n <= 0)
            return;
        if (from.sll_pkttype == PACKET_OUTGOING)
            continue; /* what this forwarder sent out of this interface */
        if ((unsigned)(rand_r(seed) % 1000) < loss) {
            d->dropped++;
            continue;
        }
        if (d->n == QUEUE) {
            d->overflow++;
            continue;
        }
        frame_t *f = &d->q[(d->head + d->n) % QUEUE];
        if ((f->data = malloc((size_t)n)) == NULL)
            continue;
        memcpy(f->data, buf, (size_t)n);
        f->len = (size_t)n;
        f->due = now_s() + delay;
        d->n++;
    }
}

/* Sends the frames that are due; returns seconds until the next one (or
 * a large value). */
static double give(dir_t *d)
{
    const double t = now_s();
    while (d->n > 0 && d->q[d->head].due <= t) {
        frame_t *f = &d->q[d->head];
        if (send(d->out, f->data, f->len, 0) >= 0)
            d->forwarded++;
        free(f->data);
        d->head = (d->head + 1) % QUEUE;
        d->n--;
    }
    return d->n > 0 ? d->q[d->head].due - t : 1.0;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s IF_A IF_B DELAY_MS LOSS_PER_MILLE SEED\n", argv[0]);
        return 2;
    }
    const double delay = atof(argv[3]) / 1000.0;
    const unsigned loss = (unsigned)atoi(argv[4]);
    unsigned seed = (unsigned)atoi(argv[5]);
    static dir_t ab, ba;
    const int a = open_if(argv[1]), b = open_if(argv[2]);
    if (a < 0 || b < 0)
        return 1;
    ab.in = ba.out = a;
    ab.out = ba.in = b;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    fprintf(stderr, "forwarder: %s <-> %s, %.0f ms each way, %u per mille lost\n", argv[1],
            argv[2], delay * 1e3, loss);
    while (!stop) {
        const double w1 = give(&ab), w2 = give(&ba);
        const double w = w1 < w2 ? w1 : w2;
        struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
        int ms = (int)(w * 1000);
        if (ms < 0)
            ms = 0;
        if (poll(p, 2, ms) < 0 && errno != EINTR)
            break;
        if (p[0].revents & POLLIN)
            take(&ab, delay, loss, &seed);
        if (p[1].revents & POLLIN)
            take(&ba, delay, loss, &seed);
    }
    fprintf(stderr, "forwarder: forwarded %lu + %lu frames, dropped %lu + %lu, overflow %lu\n",
            ab.forwarded, ba.forwarded, ab.dropped, ba.dropped, ab.overflow + ba.overflow);
    return 0;
}
