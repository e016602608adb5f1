#include "coordinator/alive.h"

#include <math.h>

#include "common/util.h"

#define EWMA 0.1      /* the weight of the newest interval */
#define SIGMAS 4.0    /* suspect after the mean interval + this many deviations */
#define LOST_FACTOR 2 /* lost after this times the suspect window */
#define SUSPECT_RTOS 1 /* a ping may be late by one retransmission, */
#define LOST_RTOS 7    /* or by two (1 + 2 + 4 RTOs until a third try is late) */

void hpd_alive_start(hpd_alive_t *a, double now, double interval_s)
{
    *a = (hpd_alive_t){.last = now, .mean = interval_s, .var = 0};
}

void hpd_alive_ping(hpd_alive_t *a, double now)
{
    const double x = now - a->last;
    if (x < 0)
        return; /* the clock does not go back; a ping of before is no news */
    const double d = x - a->mean;
    a->mean += EWMA * d;
    a->var = (1 - EWMA) * (a->var + EWMA * d * d);
    a->last = now;
    a->pings++;
}

void hpd_alive_link(hpd_alive_t *a, double rto_s)
{
    if (!(rto_s > 0))
        return; /* not known (not TCP) */
    a->rto = rto_s >= a->rto ? rto_s : a->rto + 0.1 * (rto_s - a->rto);
}

double hpd_alive_suspect_after(const hpd_alive_t *a, double window_s, double max_s)
{
    const double adaptive = a->mean + SIGMAS * sqrt(a->var > 0 ? a->var : 0);
    const double resent = a->mean + SUSPECT_RTOS * a->rto;
    return HPD_MIN(HPD_MAX(HPD_MAX(window_s, adaptive), resent), max_s);
}

double hpd_alive_lost_after(const hpd_alive_t *a, double window_s, double max_s)
{
    double lost = HPD_MAX(LOST_FACTOR * hpd_alive_suspect_after(a, window_s, max_s),
                          HPD_ALIVE_LOST_WINDOWS * window_s);
    lost = HPD_MAX(lost, a->mean + LOST_RTOS * a->rto);
    return HPD_MIN(lost, max_s);
}

hpd_alive_verdict_t hpd_alive_judge(const hpd_alive_t *a, double now, double window_s,
                                    double max_s)
{
    const double silent = now - a->last;
    if (silent > hpd_alive_lost_after(a, window_s, max_s))
        return HPD_ALIVE_LOST;
    if (silent > hpd_alive_suspect_after(a, window_s, max_s))
        return HPD_ALIVE_SUSPECT;
    return HPD_ALIVE_OK;
}
