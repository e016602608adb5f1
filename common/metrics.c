#include "common/metrics.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

const double hpd_metrics_latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0, 60.0};
const uint32_t hpd_metrics_n_latency_bounds =
    sizeof(hpd_metrics_latency_bounds) / sizeof(hpd_metrics_latency_bounds[0]);
const double hpd_metrics_tpot_bounds[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                          0.05,   0.1,   0.2,   0.5,   1.0,  2.0};
const uint32_t hpd_metrics_n_tpot_bounds =
    sizeof(hpd_metrics_tpot_bounds) / sizeof(hpd_metrics_tpot_bounds[0]);

struct hpd_metric {
    hpd_metric_type_t type;
    char *name, *help, *labels;
    double value;      /* counter, gauge; histogram: the sum */
    uint64_t count;    /* histogram */
    double *bounds;
    uint64_t *buckets; /* per bound, not cumulative */
    uint32_t n_bounds;
};

struct hpd_metrics {
    hpd_metric_t **items;
    size_t n, cap;
};

hpd_status_t hpd_metrics_create(hpd_metrics_t **metrics_p)
{
    hpd_metrics_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return HPD_ERR_NO_MEMORY;
    *metrics_p = m;
    return HPD_OK;
}

static void metric_free(hpd_metric_t *x)
{
    free(x->name);
    free(x->help);
    free(x->labels);
    free(x->bounds);
    free(x->buckets);
    free(x);
}

void hpd_metrics_destroy(hpd_metrics_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n; i++)
        metric_free(m->items[i]);
    free(m->items);
    free(m);
}

static hpd_metric_t *add(hpd_metrics_t *m, hpd_metric_type_t type, const char *name,
                         const char *help, const char *labels)
{
    hpd_metric_t *x;
    if (m->n == m->cap && hpd_grow((void **)&m->items, &m->cap, m->n + 1, sizeof(*m->items)) != 0)
        return NULL;
    if ((x = calloc(1, sizeof(*x))) == NULL)
        return NULL;
    x->type = type;
    x->name = strdup(name);
    x->help = strdup(help);
    x->labels = strdup(labels != NULL ? labels : "");
    if (!x->name || !x->help || !x->labels) {
        metric_free(x);
        return NULL;
    }
    m->items[m->n++] = x;
    return x;
}

hpd_metric_t *hpd_metrics_add(hpd_metrics_t *m, hpd_metric_type_t type, const char *name,
                              const char *help, const char *labels)
{
    return type == HPD_METRIC_HISTOGRAM ? NULL : add(m, type, name, help, labels);
}

hpd_metric_t *hpd_metrics_histogram(hpd_metrics_t *m, const char *name, const char *help,
                                    const char *labels, const double *bounds, uint32_t n)
{
    hpd_metric_t *x = add(m, HPD_METRIC_HISTOGRAM, name, help, labels);
    if (x == NULL)
        return NULL;
    x->bounds = malloc((n ? n : 1) * sizeof(*x->bounds));
    x->buckets = calloc(n ? n : 1, sizeof(*x->buckets));
    if (!x->bounds || !x->buckets) {
        m->n--;
        metric_free(x);
        return NULL;
    }
    memcpy(x->bounds, bounds, n * sizeof(*bounds));
    x->n_bounds = n;
    return x;
}

void hpd_metric_inc(hpd_metric_t *x, double by)
{
    if (x != NULL && x->type != HPD_METRIC_HISTOGRAM)
        x->value += by;
}

void hpd_metric_set(hpd_metric_t *x, double value)
{
    if (x != NULL && x->type != HPD_METRIC_HISTOGRAM)
        x->value = value;
}

void hpd_metric_observe(hpd_metric_t *x, double v)
{
    if (x == NULL || x->type != HPD_METRIC_HISTOGRAM)
        return;
    for (uint32_t i = 0; i < x->n_bounds; i++)
        if (v <= x->bounds[i]) {
            x->buckets[i]++;
            break;
        }
    x->value += v;
    x->count++;
}

double hpd_metric_value(const hpd_metric_t *x)
{
    if (x == NULL)
        return 0;
    return x->type == HPD_METRIC_HISTOGRAM ? (double)x->count : x->value;
}

/* Prometheus floats: integers without a fraction, +Inf/-Inf/NaN spelled out. */
static void put_value(FILE *f, double v)
{
    if (isnan(v))
        fputs("NaN", f);
    else if (isinf(v))
        fputs(v > 0 ? "+Inf" : "-Inf", f);
    else if (v == floor(v) && fabs(v) < 1e15)
        fprintf(f, "%.0f", v);
    else
        fprintf(f, "%.9g", v);
}

static void put_sample(FILE *f, const char *name, const char *suffix, const char *labels,
                       const char *le, double v)
{
    const bool braces = labels[0] != '\0' || le != NULL;
    fprintf(f, "%s%s", name, suffix);
    if (braces) {
        fprintf(f, "{%s", labels);
        if (le != NULL)
            fprintf(f, "%sle=\"%s\"", labels[0] ? "," : "", le);
        fputc('}', f);
    }
    fputc(' ', f);
    put_value(f, v);
    fputc('\n', f);
}

static void put_metric(FILE *f, const hpd_metric_t *x)
{
    char le[32];
    uint64_t cum = 0;
    if (x->type != HPD_METRIC_HISTOGRAM) {
        put_sample(f, x->name, "", x->labels, NULL, x->value);
        return;
    }
    for (uint32_t i = 0; i < x->n_bounds; i++) {
        cum += x->buckets[i];
        snprintf(le, sizeof(le), "%g", x->bounds[i]);
        put_sample(f, x->name, "_bucket", x->labels, le, (double)cum);
    }
    put_sample(f, x->name, "_bucket", x->labels, "+Inf", (double)x->count);
    put_sample(f, x->name, "_sum", x->labels, NULL, x->value);
    put_sample(f, x->name, "_count", x->labels, NULL, (double)x->count);
}

char *hpd_metrics_render(const hpd_metrics_t *m, size_t *len_p)
{
    static const char *types[] = {"counter", "gauge", "histogram"};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return NULL;
    /* a family's samples together, in the order families first appear */
    for (size_t i = 0; i < m->n; i++) {
        const hpd_metric_t *x = m->items[i];
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(m->items[j]->name, x->name) == 0;
        if (seen)
            continue;
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help, x->name, types[x->type]);
        for (size_t j = i; j < m->n; j++)
            if (strcmp(m->items[j]->name, x->name) == 0)
                put_metric(f, m->items[j]);
    }
    /* text is NULL when the stream's last allocation failed in fclose */
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        return NULL;
    }
    if (len_p != NULL)
        *len_p = len;
    return text;
}
