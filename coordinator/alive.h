/* Whether a node's pinger is alive, judged from its liveness pings with a
 * window that adapts to the intervals seen (in the spirit of phi-accrual
 * failure detectors), apart from the event loop so that tests can drive it
 * with any clock (docs/cluster.md, "Failure detection").
 *
 * A node whose pings stop for suspect_after (at least the configured
 * liveness window; longer when its pings come irregularly: mean + 4
 * standard deviations of the intervals) is suspect: it gets no new work
 * and its requests run again elsewhere; a ping clears it. Only silence of
 * lost_after (twice suspect_after, and at least four configured windows)
 * declares it lost. So a node
 * that a loaded host starves of CPU now and then, or that pings over a
 * slow, lossy link, widens its own windows and is not declared lost,
 * while a stopped node is suspect within the configured window. Liveness
 * counts from the registration, not from the first ping: a node that
 * hangs right after registering is judged too.
 *
 * Pings travel over TCP: one whose segment was lost arrives a
 * retransmission timeout (RTO) late, one lost twice 1 + 2 = 3 RTOs late,
 * and a slow link's RTO is long (about 0.6 to 1 s at 400 ms round trips;
 * the floor, 200 ms, on a LAN). So with the link's RTO known
 * (hpd_alive_link), suspect_after allows one retransmission (the mean
 * interval + 1 RTO) and lost_after two (+ 7 RTOs: the third try's
 * backoff included); on a LAN neither moves past the configured windows. */
#ifndef HPD_COORDINATOR_ALIVE_H
#define HPD_COORDINATOR_ALIVE_H

#include <stdbool.h>
#include <stdint.h>

/* lost_after is never below this many configured windows: a node fences
 * itself (writes nothing) that long after its last answered ping, before
 * the coordinator can declare it lost and hand out what it held */
#define HPD_ALIVE_LOST_WINDOWS 4

typedef struct {
    double last;     /* the last ping, or the registration */
    double mean;     /* of the intervals between pings (EWMA) */
    double var;      /* their variance (EWMA of the squared deviation) */
    double rto;      /* the link's retransmission timeout, recently at most; 0: unknown */
    uint32_t pings;
} hpd_alive_t;

typedef enum { HPD_ALIVE_OK, HPD_ALIVE_SUSPECT, HPD_ALIVE_LOST } hpd_alive_verdict_t;

/* At registration: pings are expected every interval_s. */
void hpd_alive_start(hpd_alive_t *a, double now, double interval_s);
void hpd_alive_ping(hpd_alive_t *a, double now);
/* The link's RTO as the kernel has it now (TCP_INFO of the connection the
 * pings come on), in seconds; 0: not known. Taken at once when larger,
 * forgotten slowly (a tenth of the way down per sample) when smaller. */
void hpd_alive_link(hpd_alive_t *a, double rto_s);
/* The silences after which the node is suspect and lost; window_s is the
 * configured liveness window (the least suspect_after), max_s caps both
 * (the heartbeat lease judges beyond it). */
double hpd_alive_suspect_after(const hpd_alive_t *a, double window_s, double max_s);
double hpd_alive_lost_after(const hpd_alive_t *a, double window_s, double max_s);
hpd_alive_verdict_t hpd_alive_judge(const hpd_alive_t *a, double now, double window_s,
                                    double max_s);

#endif
