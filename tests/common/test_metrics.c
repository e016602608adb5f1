/* The Prometheus text format: families grouped, labels, cumulative
 * histogram buckets with +Inf, sums and counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"

static void test_render(void **state)
{
    hpd_metrics_t *m;
    assert_int_equal(hpd_metrics_create(&m), HPD_OK);
    hpd_metric_t *ok = hpd_metrics_add(m, HPD_METRIC_COUNTER, "t_requests_total", "Requests.",
                                       "outcome=\"ok\"");
    hpd_metric_t *up = hpd_metrics_add(m, HPD_METRIC_GAUGE, "t_up", "Up.", NULL);
    hpd_metric_t *bad = hpd_metrics_add(m, HPD_METRIC_COUNTER, "t_requests_total", "Requests.",
                                        "outcome=\"failed\"");
    const double bounds[] = {0.1, 1};
    hpd_metric_t *lat = hpd_metrics_histogram(m, "t_latency_seconds", "Latency.", NULL, bounds, 2);
    hpd_metric_inc(ok, 3);
    hpd_metric_inc(bad, 1);
    hpd_metric_set(up, 0.5);
    hpd_metric_observe(lat, 0.05);
    hpd_metric_observe(lat, 0.5);
    hpd_metric_observe(lat, 5);
    hpd_metric_observe(NULL, 1); /* a failed registration is a no-op */
    assert_true(hpd_metric_value(lat) == 3);
    size_t len;
    char *text = hpd_metrics_render(m, &len);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    const char *want =
        "# HELP t_requests_total Requests.\n"
        "# TYPE t_requests_total counter\n"
        "t_requests_total{outcome=\"ok\"} 3\n"
        "t_requests_total{outcome=\"failed\"} 1\n"
        "# HELP t_up Up.\n"
        "# TYPE t_up gauge\n"
        "t_up 0.5\n"
        "# HELP t_latency_seconds Latency.\n"
        "# TYPE t_latency_seconds histogram\n"
        "t_latency_seconds_bucket{le=\"0.1\"} 1\n"
        "t_latency_seconds_bucket{le=\"1\"} 2\n"
        "t_latency_seconds_bucket{le=\"+Inf\"} 3\n"
        "t_latency_seconds_sum 5.55\n"
        "t_latency_seconds_count 3\n";
    assert_string_equal(text, want);
    free(text);
    hpd_metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_render)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
