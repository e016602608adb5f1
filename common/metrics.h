/* Metrics in the Prometheus text exposition format (version 0.0.4):
 * counters, gauges and histograms, each a sample of a named family with an
 * optional label set. A registry belongs to one thread (the event loop that
 * updates it also renders it); docs/operations.md lists every metric. */
#ifndef HPD_COMMON_METRICS_H
#define HPD_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_metrics hpd_metrics_t;
typedef struct hpd_metric hpd_metric_t;

typedef enum {
    HPD_METRIC_COUNTER,
    HPD_METRIC_GAUGE,
    HPD_METRIC_HISTOGRAM,
} hpd_metric_type_t;

/* Upper bounds in seconds for latency histograms: 1 ms to 60 s. */
extern const double hpd_metrics_latency_bounds[];
extern const uint32_t hpd_metrics_n_latency_bounds;
/* Upper bounds in seconds for time-per-output-token histograms: 0.5 ms to 2 s. */
extern const double hpd_metrics_tpot_bounds[];
extern const uint32_t hpd_metrics_n_tpot_bounds;

hpd_status_t hpd_metrics_create(hpd_metrics_t **metrics_p);
void hpd_metrics_destroy(hpd_metrics_t *metrics);

/* Adds a counter or gauge. name: [a-z_:][a-z0-9_:]*; labels: NULL or the
 * text between the braces, e.g. `outcome="ok"`. Samples of one name share
 * help and type (the first registration's). Returns NULL when out of
 * memory; every update function accepts NULL and does nothing. */
hpd_metric_t *hpd_metrics_add(hpd_metrics_t *metrics, hpd_metric_type_t type, const char *name,
                              const char *help, const char *labels);

/* Adds a histogram with n ascending upper bounds (+Inf is implied). */
hpd_metric_t *hpd_metrics_histogram(hpd_metrics_t *metrics, const char *name, const char *help,
                                    const char *labels, const double *bounds, uint32_t n);

void hpd_metric_inc(hpd_metric_t *metric, double by);   /* counters and gauges */
/* Gauges; also counters mirrored from a cumulative count kept elsewhere. */
void hpd_metric_set(hpd_metric_t *metric, double value);
void hpd_metric_observe(hpd_metric_t *metric, double value); /* histograms */
/* The value (counter, gauge) or the number of observations (histogram). */
double hpd_metric_value(const hpd_metric_t *metric);

/* The whole registry as exposition text (malloc'd, NUL-terminated); NULL
 * when out of memory. */
char *hpd_metrics_render(const hpd_metrics_t *metrics, size_t *len_p);

#endif
