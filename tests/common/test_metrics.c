/* The Prometheus text format: families grouped, labels, cumulative
 * histogram buckets with +Inf, sums and counts, values; which update applies
 * to which kind; the standard bounds; each allocation failing in turn. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "tests/common/alloc_hooks.h"

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

/* Checks that bounds ascend strictly from first to last, its n-th element;
 * never reads past `last`, whatever n says. */
static void check_bounds(const double *bounds, uint32_t n, double first, double last)
{
    uint32_t i = 1;
    assert_true(n >= 2);
    assert_true(bounds[0] == first);
    for (; i < n && bounds[i - 1] < last; i++)
        assert_true(bounds[i] > bounds[i - 1]);
    assert_true(bounds[i - 1] == last);
    assert_int_equal(i, n);
}

static void test_standard_bounds(void **state)
{
    /* latency: 1 ms to 60 s; time per output token: 0.5 ms to 2 s */
    check_bounds(hpd_metrics_latency_bounds, hpd_metrics_n_latency_bounds, 0.001, 60);
    check_bounds(hpd_metrics_tpot_bounds, hpd_metrics_n_tpot_bounds, 0.0005, 2);
}

static void test_updates(void **state)
{
    /* counters and gauges: inc adds, set replaces; histograms: observe;
     * each ignores the other kind's updates; NULL ignores everything */
    hpd_metrics_t *m;
    const double bounds[] = {1};
    assert_int_equal(hpd_metrics_create(&m), HPD_OK);
    hpd_metric_t *c = hpd_metrics_add(m, HPD_METRIC_COUNTER, "t_c", "C.", NULL);
    hpd_metric_t *g = hpd_metrics_add(m, HPD_METRIC_GAUGE, "t_g", "G.", NULL);
    hpd_metric_t *h = hpd_metrics_histogram(m, "t_h", "H.", NULL, bounds, 1);
    assert_non_null(c);
    assert_non_null(g);
    assert_non_null(h);
    /* a histogram needs bounds: not through hpd_metrics_add */
    assert_null(hpd_metrics_add(m, HPD_METRIC_HISTOGRAM, "t_x", "X.", NULL));
    assert_true(hpd_metric_value(c) == 0);
    assert_true(hpd_metric_value(h) == 0);
    hpd_metric_inc(c, 2);
    hpd_metric_inc(c, 0.5);
    assert_true(hpd_metric_value(c) == 2.5);
    hpd_metric_set(c, 10);
    assert_true(hpd_metric_value(c) == 10);
    hpd_metric_set(g, 3);
    hpd_metric_inc(g, -4.5);
    assert_true(hpd_metric_value(g) == -1.5);
    hpd_metric_observe(c, 1);
    hpd_metric_observe(g, 1);
    assert_true(hpd_metric_value(c) == 10);
    assert_true(hpd_metric_value(g) == -1.5);
    hpd_metric_observe(h, 0.25);
    hpd_metric_observe(h, 4);
    hpd_metric_inc(h, 100);
    hpd_metric_set(h, 100);
    assert_true(hpd_metric_value(h) == 2);
    hpd_metric_inc(NULL, 1);
    hpd_metric_set(NULL, 1);
    hpd_metric_observe(NULL, 1);
    assert_true(hpd_metric_value(NULL) == 0);
    char *text = hpd_metrics_render(m, NULL);
    assert_non_null(text);
    assert_string_equal(text, "# HELP t_c C.\n"
                              "# TYPE t_c counter\n"
                              "t_c 10\n"
                              "# HELP t_g G.\n"
                              "# TYPE t_g gauge\n"
                              "t_g -1.5\n"
                              "# HELP t_h H.\n"
                              "# TYPE t_h histogram\n"
                              "t_h_bucket{le=\"1\"} 1\n"
                              "t_h_bucket{le=\"+Inf\"} 2\n"
                              "t_h_sum 4.25\n"
                              "t_h_count 2\n");
    free(text);
    hpd_metrics_destroy(m);
    hpd_metrics_destroy(NULL);
}

static void test_render_values(void **state)
{
    /* values as Prometheus reads them: whole numbers exact and without a
     * fraction, infinities and NaN spelled out */
    const struct {
        double value;
        const char *text;
    } cases[] = {
        {0, "0"},          {-3, "-3"},     {123456789012.0, "123456789012"},
        {-0.25, "-0.25"},  {1e-3, "0.001"}, {INFINITY, "+Inf"},
        {-INFINITY, "-Inf"}, {NAN, "NaN"},
    };
    hpd_metrics_t *m;
    char want[2048] = "# HELP t_v V.\n# TYPE t_v gauge\n";
    assert_int_equal(hpd_metrics_create(&m), HPD_OK);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char labels[16];
        snprintf(labels, sizeof(labels), "i=\"%zu\"", i);
        hpd_metric_set(hpd_metrics_add(m, HPD_METRIC_GAUGE, "t_v", "V.", labels), cases[i].value);
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "t_v{%s} %s\n", labels,
                 cases[i].text);
    }
    size_t len;
    char *text = hpd_metrics_render(m, &len);
    assert_non_null(text);
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    free(text);
    hpd_metrics_destroy(m);
}

static void test_histograms(void **state)
{
    /* a family of labelled histograms: `le` joins the labels; a bound is
     * inclusive; with no bounds there is only +Inf */
    hpd_metrics_t *m;
    const double bounds[] = {1, 2};
    assert_int_equal(hpd_metrics_create(&m), HPD_OK);
    hpd_metric_t *a = hpd_metrics_histogram(m, "t_s", "S.", "m=\"a\"", bounds, 2);
    hpd_metric_t *w = hpd_metrics_histogram(m, "t_w", "W.", NULL, bounds, 0);
    hpd_metric_t *b = hpd_metrics_histogram(m, "t_s", "S.", "m=\"b\"", bounds, 2);
    assert_non_null(a);
    assert_non_null(w);
    assert_non_null(b);
    hpd_metric_observe(a, 1);
    hpd_metric_observe(a, 2);
    hpd_metric_observe(a, 2.5);
    hpd_metric_observe(b, 0.5);
    hpd_metric_observe(w, 3);
    hpd_metric_observe(w, 4);
    assert_true(hpd_metric_value(w) == 2);
    char *text = hpd_metrics_render(m, NULL);
    assert_non_null(text);
    assert_string_equal(text, "# HELP t_s S.\n"
                              "# TYPE t_s histogram\n"
                              "t_s_bucket{m=\"a\",le=\"1\"} 1\n"
                              "t_s_bucket{m=\"a\",le=\"2\"} 2\n"
                              "t_s_bucket{m=\"a\",le=\"+Inf\"} 3\n"
                              "t_s_sum{m=\"a\"} 5.5\n"
                              "t_s_count{m=\"a\"} 3\n"
                              "t_s_bucket{m=\"b\",le=\"1\"} 1\n"
                              "t_s_bucket{m=\"b\",le=\"2\"} 1\n"
                              "t_s_bucket{m=\"b\",le=\"+Inf\"} 1\n"
                              "t_s_sum{m=\"b\"} 0.5\n"
                              "t_s_count{m=\"b\"} 1\n"
                              "# HELP t_w W.\n"
                              "# TYPE t_w histogram\n"
                              "t_w_bucket{le=\"+Inf\"} 2\n"
                              "t_w_sum 7\n"
                              "t_w_count 2\n");
    free(text);
    hpd_metrics_destroy(m);
}

static void test_standard_histogram(void **state)
{
    /* the latency bounds as `le` labels, each observation in its bucket */
    hpd_metrics_t *m;
    assert_int_equal(hpd_metrics_create(&m), HPD_OK);
    hpd_metric_t *h = hpd_metrics_histogram(m, "t_l", "L.", NULL, hpd_metrics_latency_bounds,
                                            hpd_metrics_n_latency_bounds);
    for (uint32_t i = 0; i < hpd_metrics_n_latency_bounds; i++)
        hpd_metric_observe(h, hpd_metrics_latency_bounds[i] * 0.99);
    char *text = hpd_metrics_render(m, NULL);
    assert_non_null(text);
    const char *les[] = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                         "0.5",   "1",      "2.5",   "5",    "10",    "30",   "60"};
    assert_int_equal(hpd_metrics_n_latency_bounds, sizeof(les) / sizeof(les[0]));
    const char *p = text;
    for (uint32_t i = 0; i < hpd_metrics_n_latency_bounds; i++) {
        char line[64];
        snprintf(line, sizeof(line), "t_l_bucket{le=\"%s\"} %u\n", les[i], i + 1);
        p = strstr(p, line);
        assert_non_null(p);
    }
    assert_non_null(strstr(p, "t_l_bucket{le=\"+Inf\"} 15\n"));
    free(text);
    hpd_metrics_destroy(m);
}

static void test_many(void **state)
{
    /* more metrics than the first allocation holds; an empty registry */
    hpd_metrics_t *m;
    size_t len = 99;
    assert_int_equal(hpd_metrics_create(&m), HPD_OK);
    char *text = hpd_metrics_render(m, &len);
    assert_non_null(text);
    assert_string_equal(text, "");
    assert_int_equal(len, 0);
    free(text);
    for (int i = 0; i < 40; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t_%d", i);
        hpd_metric_set(hpd_metrics_add(m, HPD_METRIC_GAUGE, name, "N.", NULL), i);
    }
    text = hpd_metrics_render(m, NULL);
    assert_non_null(text);
    const char *p = text;
    for (int i = 0; i < 40; i++) {
        char want[64];
        snprintf(want, sizeof(want), "# TYPE t_%d gauge\nt_%d %d\n", i, i, i);
        p = strstr(p, want);
        assert_non_null(p);
    }
    free(text);
    hpd_metrics_destroy(m);
}

static void test_out_of_memory(void **state)
{
    /* each allocation in turn fails: the call answers NULL (create:
     * HPD_ERR_NO_MEMORY) and adds nothing, and the registry goes on
     * working; destroy then frees everything, whatever failed before */
#ifndef TEST_ALLOC_HOOKS
    skip();
#else
    const double bounds[] = {0.5, 1};
    const long live0 = test_alloc_live;
    hpd_metrics_t *m = NULL;

    for (long k = 0;; k++) {
        hpd_metrics_t *got = NULL;
        test_alloc_fail_after(k);
        const hpd_status_t st = hpd_metrics_create(&got);
        if (!test_alloc_stop()) {
            assert_int_equal(st, HPD_OK);
            m = got;
            break;
        }
        assert_int_equal(st, HPD_ERR_NO_MEMORY);
        assert_null(got);
        assert_int_equal(test_alloc_live, live0);
    }
    /* counters, gauges and histograms (with and without bounds, labels),
     * past the first allocation of the registry's array */
    for (int i = 0; i < 24; i++) {
        char name[32], labels[32];
        snprintf(name, sizeof(name), "t_m%d", i);
        snprintf(labels, sizeof(labels), "i=\"%d\"", i);
        for (long k = 0;; k++) {
            hpd_metric_t *x;
            test_alloc_fail_after(k);
            switch (i % 4) {
            case 0: x = hpd_metrics_add(m, HPD_METRIC_COUNTER, name, "C.", labels); break;
            case 1: x = hpd_metrics_add(m, HPD_METRIC_GAUGE, name, "G.", NULL); break;
            case 2: x = hpd_metrics_histogram(m, name, "H.", labels, bounds, 2); break;
            default: x = hpd_metrics_histogram(m, name, "H.", NULL, bounds, 0); break;
            }
            if (!test_alloc_stop()) {
                assert_non_null(x);
                hpd_metric_inc(x, i);
                hpd_metric_observe(x, 0.75);
                break;
            }
            assert_null(x); /* what it allocated is freed: see the end */
        }
    }
    char *want = hpd_metrics_render(m, NULL);
    assert_non_null(want);
    /* every metric once: a failed registration left nothing behind */
    const char *p = want;
    for (int i = 0; i < 24; i++) {
        char line[64];
        if (i % 4 == 0)
            snprintf(line, sizeof(line), "\nt_m%d{i=\"%d\"} %d\n", i, i, i);
        else if (i % 4 == 1)
            snprintf(line, sizeof(line), "\nt_m%d %d\n", i, i);
        else if (i % 4 == 2)
            snprintf(line, sizeof(line), "\nt_m%d_bucket{i=\"%d\",le=\"1\"} 1\n", i, i);
        else
            snprintf(line, sizeof(line), "\nt_m%d_bucket{le=\"+Inf\"} 1\n", i);
        p = strstr(p, line);
        assert_non_null(p);
        assert_null(strstr(p + 1, line));
    }
    /* rendering: the whole text, or NULL and *len_p untouched */
    for (long k = 0;; k++) {
        const long live = test_alloc_live;
        size_t len = 7;
        test_alloc_fail_after(k);
        char *text = hpd_metrics_render(m, &len);
        const bool failed = test_alloc_stop();
        if (text != NULL) {
            assert_string_equal(text, want);
            assert_int_equal(len, strlen(want));
            free(text);
        } else {
            assert_true(failed);
            assert_int_equal(len, 7);
        }
        assert_int_equal(test_alloc_live, live);
        if (!failed)
            break;
    }
    free(want);
    hpd_metrics_destroy(m);
    assert_int_equal(test_alloc_live, live0);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_standard_bounds),
        cmocka_unit_test(test_updates),
        cmocka_unit_test(test_render_values),
        cmocka_unit_test(test_histograms),
        cmocka_unit_test(test_standard_histogram),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
