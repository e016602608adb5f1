/* Manifests: the examples load; every kind of mistake is reported with its
 * line, the field's path and what is allowed; command lines follow the
 * manifest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "deploy/manifest.h"
#include "deploy/render.h"
#include "tests/test_helpers.h"

static const char base[] =
    "cluster: t\n"                                 /* 1 */
    "model: models/tiny\n"                         /* 2 */
    "token_file: /tmp/t.token\n"                   /* 3 */
    "coordinator:\n"                               /* 4 */
    "  port: 7000\n"                               /* 5 */
    "  metrics_port: 7001\n"                       /* 6 */
    "nodes:\n"                                     /* 7 */
    "  - name: p0\n"                               /* 8 */
    "    role: prefill\n"                          /* 9 */
    "    port: 7010\n"                             /* 10 */
    "    metrics_port: 7011\n"                     /* 11 */
    "    kv_layout: {block: 64, pack: 1, order: nhd}\n" /* 12 */
    "  - name: d0\n"                               /* 13 */
    "    role: decode\n"                           /* 14 */
    "    port: 7020\n"                             /* 15 */
    "    metrics_port: 7021\n"                     /* 16 */
    "    kv_layout: {block: 16, pack: 2, order: hnd}\n"; /* 17 */

/* base with line `line` (1-based) replaced by `with` (NULL: deleted) */
static char *edit(int line, const char *with)
{
    static char out[4096];
    const char *s = base;
    size_t used = 0;
    for (int l = 1; *s; l++) {
        const char *end = strchr(s, '\n');
        size_t n = (size_t)(end - s) + 1;
        if (l != line) {
            memcpy(out + used, s, n);
            used += n;
        } else if (with != NULL) {
            used += (size_t)snprintf(out + used, sizeof(out) - used, "%s\n", with);
        }
        s = end + 1;
    }
    out[used] = '\0';
    return out;
}

static void expect_error(const char *text, const char *want1, const char *want2)
{
    char err[4096];
    hpd_manifest_t *m = NULL;
    hpd_status_t st = hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                         sizeof(err));
    if (st == HPD_OK || strstr(err, want1) == NULL || (want2 && strstr(err, want2) == NULL))
        fprintf(stderr, "expected '%s' and '%s' in:\n%s", want1, want2 ? want2 : "", err);
    assert_int_equal(st, HPD_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(err, want1));
    if (want2)
        assert_non_null(strstr(err, want2));
}

static void test_base_loads(void **state)
{
    char err[1024];
    hpd_manifest_t *m = NULL;
    assert_int_equal(hpd_manifest_parse(base, strlen(base), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    assert_int_equal(m->n_procs, 3);
    assert_string_equal(m->model, "/srv/models/tiny"); /* relative to the manifest */
    assert_string_equal(m->token_file, "/tmp/t.token");
    assert_string_equal(m->state_dir, "/tmp/hybridpd-t");
    assert_int_equal(m->procs[0].role, HPD_PROC_COORDINATOR);
    assert_int_equal(m->procs[0].port, 7000);
    const hpd_manifest_proc_t *d = hpd_manifest_find(m, "d0");
    assert_non_null(d);
    assert_int_equal(d->role, HPD_PROC_DECODE);
    assert_int_equal(d->line, 13);
    assert_int_equal(d->kv_block, 16);
    assert_int_equal(d->kv_pack, 2);
    assert_string_equal(d->kv_order, "hnd");
    assert_string_equal(d->ucx_tls, "tcp");
    assert_int_equal(d->gpu, -1);

    /* the decode node's command line */
    char **argv;
    int argc = hpd_manifest_args(m, d, "/bin/hpd-decode", &argv);
    assert_true(argc > 10);
    char joined[2048] = "";
    for (int i = 0; i < argc; i++) {
        strcat(joined, argv[i]);
        strcat(joined, " ");
    }
    assert_non_null(strstr(joined, "/bin/hpd-decode --host 127.0.0.1 --port 7020 "
                                   "--metrics-port 7021 --token-file /tmp/t.token"));
    assert_non_null(strstr(joined, "--coordinator 127.0.0.1:7000 --model /srv/models/tiny "
                                   "--name d0 --device cpu --kv-layout 16,2,hnd"));
    assert_null(strstr(joined, "--staging-mb")); /* a prefill flag */
    hpd_manifest_args_free(argv);
    hpd_manifest_destroy(m);
}

/* client_keys_file goes to the coordinator only, resolved against the
 * manifest's directory. */
static void test_client_keys_file(void **state)
{
    char text[4096], err[4096], **argv, joined[2048] = "";
    hpd_manifest_t *m;
    snprintf(text, sizeof(text), "%sclient_keys_file: keys/clients\n", base);
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    assert_string_equal(m->client_keys_file, "/srv/keys/clients");
    int argc = hpd_manifest_args(m, &m->procs[0], "/bin/hpd-coordinator", &argv);
    for (int i = 0; i < argc; i++) {
        strcat(joined, argv[i]);
        strcat(joined, " ");
    }
    assert_non_null(strstr(joined, "--client-keys-file /srv/keys/clients"));
    hpd_manifest_args_free(argv);
    joined[0] = '\0';
    argc = hpd_manifest_args(m, &m->procs[1], "/bin/hpd-prefill", &argv);
    for (int i = 0; i < argc; i++) {
        strcat(joined, argv[i]);
        strcat(joined, " ");
    }
    assert_null(strstr(joined, "--client-keys-file"));
    hpd_manifest_args_free(argv);
    hpd_manifest_destroy(m);
}

static void joined_args(const hpd_manifest_t *m, const hpd_manifest_proc_t *p, char *out,
                        size_t len)
{
    char **argv;
    const int argc = hpd_manifest_args(m, p, "/bin/x", &argv);
    out[0] = '\0';
    for (int i = 0; i < argc; i++)
        snprintf(out + strlen(out), len - strlen(out), "%s ", argv[i]);
    hpd_manifest_args_free(argv);
}

/* Fields take their ranges and roles from the options table
 * (common/options.h); a zero the manifest gives is passed on (liveness_ms
 * 0 turns the pings off), a field it does not give is left to the
 * program. */
static void test_fields_follow_the_options_table(void **state)
{
    char text[4096], err[4096], args[2048];
    hpd_manifest_t *m;
    snprintf(text, sizeof(text), "%s", edit(5, "  port: 7000\n  liveness_ms: 0\n"
                                               "  drain_timeout_ms: 0"));
    snprintf(text + strlen(text), sizeof(text) - strlen(text),
             "defaults:\n  xfer_deadline_ms: 0\n  reserve_timeout_ms: 900\n");
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    joined_args(m, &m->procs[0], args, sizeof(args));
    assert_non_null(strstr(args, "--liveness-ms 0 "));
    assert_non_null(strstr(args, "--drain-timeout-ms 0 "));
    assert_null(strstr(args, "--lease-ms")); /* not given: the coordinator's default */
    joined_args(m, hpd_manifest_find(m, "p0"), args, sizeof(args));
    assert_non_null(strstr(args, "--xfer-deadline-ms 0 "));
    assert_null(strstr(args, "--reserve-timeout-ms")); /* a decode option, from defaults */
    joined_args(m, hpd_manifest_find(m, "d0"), args, sizeof(args));
    assert_non_null(strstr(args, "--reserve-timeout-ms 900 "));
    assert_null(strstr(args, "--xfer-deadline-ms"));
    hpd_manifest_destroy(m);
    /* the CPU's bf16 products, a device like the others */
    snprintf(text, sizeof(text), "%s", edit(11, "    metrics_port: 7011\n    device: cpu-bf16"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    joined_args(m, &m->procs[1], args, sizeof(args));
    assert_non_null(strstr(args, "--device cpu-bf16 "));
    hpd_manifest_destroy(m);
    /* the GPU's devices keep their kind and index */
    for (int i = 0; i < 3; i++) {
        static const char *dev[] = {"cuda:1", "cuda-bf16:2", "cuda-fast:3"};
        char line[64], want[64];
        snprintf(line, sizeof(line), "    metrics_port: 7011\n    device: %s", dev[i]);
        snprintf(text, sizeof(text), "%s", edit(11, line));
        assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                            sizeof(err)), HPD_OK);
        joined_args(m, &m->procs[1], args, sizeof(args));
        snprintf(want, sizeof(want), "--device %s ", dev[i]);
        assert_non_null(strstr(args, want));
        assert_int_equal(m->procs[1].gpu, i + 1);
        hpd_manifest_destroy(m);
    }
    expect_error(edit(11, "    metrics_port: 7011\n    device: cuda-bf16"),
                 "m.yaml:12: nodes[0].device: 'cuda-bf16' is invalid", NULL);
    /* tensor parallelism per node: given where given, 1 to 8 */
    snprintf(text, sizeof(text), "%s", edit(16, "    metrics_port: 7021\n    tp: 4"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    joined_args(m, &m->procs[2], args, sizeof(args));
    assert_non_null(strstr(args, "--tp 4 "));
    joined_args(m, &m->procs[1], args, sizeof(args));
    assert_null(strstr(args, "--tp"));
    hpd_manifest_destroy(m);
    expect_error(edit(16, "    metrics_port: 7021\n    tp: 9"), "m.yaml:17: nodes[1].tp", NULL);
    /* the table's range and multiple */
    expect_error(edit(12, "    max_batch: 5000"), "m.yaml:12: nodes[0].max_batch",
                 "5000 is out of range (expected 1 to 4096)");
    expect_error(edit(12, "    prefill_chunk: 100"), "nodes[0].prefill_chunk",
                 "expected a multiple of 64 from 64 to 65536");
    /* and its roles */
    expect_error(edit(17, "    staging_mb: 8"), "m.yaml:17: nodes[1].staging_mb",
                 "applies to prefill nodes only");
    expect_error(edit(6, "  metrics_port: 7001\n  max_batch: 4"), "coordinator.max_batch",
                 "applies to nodes only");
}

static void test_examples_load(void **state)
{
    static const char *files[] = {"local.yaml", "multi-host.yaml"};
    for (size_t i = 0; i < 2; i++) {
        char path[1024], err[4096];
        hpd_manifest_t *m = NULL;
        snprintf(path, sizeof(path), "%s/deploy/examples/%s", HPD_SOURCE_DIR, files[i]);
        hpd_status_t st = hpd_manifest_load(path, &m, err, sizeof(err));
        if (st != HPD_OK)
            fprintf(stderr, "%s", err);
        assert_int_equal(st, HPD_OK);
        assert_true(m->n_procs >= 3);
        if (i == 1) {
            const hpd_manifest_proc_t *p = hpd_manifest_find(m, "gpu-b3-decode");
            assert_non_null(p);
            assert_int_equal(p->gpu, 3);
            assert_string_equal(p->host, "10.0.0.12");
            assert_string_equal(p->ucx_tls, "rc,cuda_copy,cuda_ipc"); /* from defaults */
            assert_int_equal(p->max_batch, 64);
            assert_string_equal(m->k8s_namespace, "inference");
        }
        hpd_manifest_destroy(m);
    }
}

static void test_unknown_field(void **state)
{
    expect_error(edit(15, "    prot: 7020"), "m.yaml:15: nodes[1].prot: unknown field",
                 "expected one of: host, port");
    expect_error(edit(1, "clusterr: t"), "m.yaml:1: clusterr: unknown field", NULL);
    expect_error(edit(12, "    kv_layout: {block: 64, pack: 1, ordr: nhd}"),
                 "m.yaml:12: nodes[0].kv_layout.ordr: unknown field", "block, pack, order");
    /* a field of another role */
    expect_error(edit(16, "    metrics_port: 7021\n    staging_mb: 64"),
                 "m.yaml:17: nodes[1].staging_mb: applies to prefill nodes only", NULL);
}

/* A key given twice in one mapping is refused (libyaml keeps both; "last
 * wins" silently dropped the first). */
static void test_duplicate_key(void **state)
{
    expect_error(edit(10, "    port: 7010\n    port: 7012"),
                 "m.yaml:11: port: appears again in the same mapping (first at line 10)",
                 "a key may appear once");
    expect_error(edit(12, "    kv_layout: {block: 64, pack: 1, pack: 2}"),
                 "m.yaml:12: pack: appears again in the same mapping (first at line 12)", NULL);
    expect_error(edit(1, "cluster: t\ncluster: u"),
                 "m.yaml:2: cluster: appears again in the same mapping (first at line 1)", NULL);
    /* the same key in two mappings is fine */
    char err[4096];
    hpd_manifest_t *m;
    assert_int_equal(hpd_manifest_parse(base, strlen(base), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    hpd_manifest_destroy(m);
}

static void test_wrong_type(void **state)
{
    expect_error(edit(10, "    port: seven"), "m.yaml:10: nodes[0].port: 'seven' is not an "
                 "integer", "expected 0 to 65535");
    expect_error(edit(10, "    port: \"7010\""), "nodes[0].port: '7010' is not an integer",
                 NULL);
    expect_error(edit(10, "    port: [7010]"), "nodes[0].port: a list is not an integer", NULL);
    expect_error(edit(12, "    kv_layout: 64"), "m.yaml:12: nodes[0].kv_layout: a value where "
                 "a mapping was expected", NULL);
    expect_error("cluster: t\nmodel: m\ntoken_file: t\ncoordinator: {port: 1, metrics_port: 2}\n"
                 "nodes: {a: 1}\n", "m.yaml:5: nodes: a mapping where a list of nodes", NULL);
    expect_error(edit(11, "    metrics_port: 7011\n    prefix_cache: {enabled: maybe}"),
                 "nodes[0].prefix_cache.enabled: 'maybe' is not a boolean", NULL);
    expect_error(edit(11, "    metrics_port: 7011\n    device: gpu0"),
                 "m.yaml:12: nodes[0].device: 'gpu0' is invalid (expected cpu, cpu-bf16, cuda:N, cuda-bf16:N or cuda-fast:N", NULL);
    expect_error(edit(5, "  port: 70000"), "m.yaml:5: coordinator.port: 70000 is out of range "
                 "(expected 0 to 65535)", NULL);
}

/* Mutation survivors (scripts/mutation.sh deploy): a string past its
 * field's size, relative paths with no manifest directory, the defaults'
 * and the coordinator's section named in their errors, the prefill node's
 * --no-prefix-cache. */
static void test_edges(void **state)
{
    char text[8192], err[4096], joined[4096];
    hpd_manifest_t *m;
    /* a node name of 200 characters */
    char longname[220];
    memset(longname, 'n', 200);
    longname[200] = '\0';
    snprintf(text, sizeof(text), "  - name: %s", longname);
    char want[300];
    snprintf(want, sizeof(want), "nodes[1].name: '%s' is invalid (expected 1 to", longname);
    expect_error(edit(13, text), "m.yaml:13:", want);
    /* no room for a message: nothing is written, the status still says it */
    assert_int_equal(hpd_manifest_parse(base, strlen(base), "m.yaml", "/srv", &m, NULL, 0),
                     HPD_OK);
    hpd_manifest_destroy(m);
    assert_int_equal(hpd_manifest_parse("cluster: [", 10, "m.yaml", "/srv", &m, NULL, 0),
                     HPD_ERR_INVALID_ARG);
    /* no manifest directory: a relative model path stays relative */
    assert_int_equal(hpd_manifest_parse(base, strlen(base), "m.yaml", "", &m, err, sizeof(err)),
                     HPD_OK);
    assert_string_equal(m->model, "models/tiny");
    hpd_manifest_destroy(m);
    /* errors inside defaults and coordinator name their section */
    snprintf(text, sizeof(text), "%sdefaults:\n  port: seven\n", base);
    expect_error(text, "defaults.port: 'seven' is not an integer", NULL);
    expect_error("cluster: t\nmodel: m\ntoken_file: t\ncoordinator: [1, 2]\nnodes: []\n",
                 "m.yaml:4: coordinator: a list where a mapping was expected", NULL);
    /* prefix_cache off on a prefill node: --no-prefix-cache */
    assert_int_equal(hpd_manifest_parse(base, strlen(base), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    joined_args(m, &m->procs[1], joined, sizeof(joined));
    assert_null(strstr(joined, "--no-prefix-cache"));
    hpd_manifest_destroy(m);
    snprintf(text, sizeof(text), "%s", edit(11, "    metrics_port: 7011\n"
                                                "    prefix_cache: {enabled: false}"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    joined_args(m, &m->procs[1], joined, sizeof(joined));
    assert_non_null(strstr(joined, " --no-prefix-cache "));
    hpd_manifest_destroy(m);
}

/* systemd units quote what a unit file would expand: '%' doubled (a
 * specifier), '$' doubled (a variable), quotes and backslashes escaped. */
static void test_systemd_quoting(void **state)
{
    char text[8192], err[4096], dir[256], path[600], *unit;
    size_t len;
    hpd_manifest_t *m;
    snprintf(text, sizeof(text), "%s", base);
    char *model = strstr(text, "models/tiny");
    assert_non_null(model);
    snprintf(text + (model - text), sizeof(text) - (size_t)(model - text), "%s%s",
             "\"models/50%x$HOME\"", strstr(base, "models/tiny") + strlen("models/tiny"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    assert_string_equal(m->model, "/srv/models/50%x$HOME");
    test_tmpdir(dir, sizeof(dir), "units");
    const hpd_render_params_t rp = {.manifest = m,
                                    .bins = {"/bin/c", "/bin/p", "/bin/d"},
                                    .out = dir};
    assert_int_equal(hpd_render_systemd(&rp, err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/hybridpd-t-d0.service", dir);
    assert_int_equal(hpd_read_file(path, &unit, &len), HPD_OK);
    if (strstr(unit, "--model \"/srv/models/50%%x$$HOME\"") == NULL)
        fail_msg("the model path is not quoted for systemd in:\n%s", unit);
    free(unit);
    hpd_manifest_destroy(m);
    test_rmtree(dir);
}

static void test_missing_role(void **state)
{
    expect_error(edit(14, NULL), "m.yaml:13: nodes[1]: missing field 'role' (expected prefill "
                 "or decode)", NULL);
    expect_error(edit(14, "    role: decoder"), "m.yaml:14: nodes[1].role: 'decoder' is invalid "
                 "(expected prefill or decode)", NULL);
    /* no decode node at all */
    expect_error(edit(14, "    role: prefill"), "nodes: 2 prefill and 0 decode nodes (expected "
                 "at least one of each)", NULL);
}

static void test_port_clash(void **state)
{
    expect_error(edit(16, "    metrics_port: 7011"), "m.yaml:13: d0.metrics_port: port 7011 on "
                 "host 127.0.0.1 is already taken by p0.metrics_port (line 8)", NULL);
    expect_error(edit(10, "    port: 7001"), "p0.port: port 7001 on host 127.0.0.1 is already "
                 "taken by coordinator.metrics_port", NULL);
    /* the same port on another host is fine */
    const char *other = edit(15, "    port: 7010\n    host: 10.0.0.2");
    char err[1024];
    hpd_manifest_t *m = NULL;
    assert_int_equal(hpd_manifest_parse(other, strlen(other), "m.yaml", "/", &m, err,
                                        sizeof(err)), HPD_OK);
    hpd_manifest_destroy(m);
}

/* http_port: the coordinator serves the HTTP API with the manifest's model
 * (and its served name); a node may not take it; its port clashes as any */
static void test_http_port(void **state)
{
    char err[4096], **argv, joined[2048] = "";
    hpd_manifest_t *m;
    const char *text = edit(6, "  metrics_port: 7001\n  http_port: 7002\n"
                               "  served_model_name: qwen-tiny");
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    const int argc = hpd_manifest_args(m, &m->procs[0], "/bin/hpd-coordinator", &argv);
    for (int i = 0; i < argc; i++) {
        strcat(joined, argv[i]);
        strcat(joined, " ");
    }
    assert_non_null(strstr(joined, "--http-port 7002 --model /srv/models/tiny "
                                   "--served-model-name qwen-tiny "));
    hpd_manifest_args_free(argv);
    hpd_manifest_destroy(m);
    expect_error(edit(11, "    metrics_port: 7011\n    http_port: 7012"), "nodes[0].http_port",
                 "applies to the coordinator only");
    expect_error(edit(6, "  metrics_port: 7001\n  http_port: 7010"), "p0.port: port 7010 on "
                 "host 127.0.0.1 is already taken by coordinator.http_port", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  http_port: 0"), "coordinator.http_port", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  http_port: 7001"), "coordinator.http_port: "
                 "port 7001 on host 127.0.0.1 is already taken by coordinator.metrics_port",
                 NULL);
}

static void test_bad_layout(void **state)
{
    expect_error(edit(12, "    kv_layout: {block: 24, pack: 1, order: nhd}"),
                 "m.yaml:12: nodes[0].kv_layout.block: 24 is invalid (expected a multiple of 16 "
                 "from 16 to 4096)", NULL);
    expect_error(edit(12, "    kv_layout: {block: 64, pack: 1, order: nch}"),
                 "nodes[0].kv_layout.order: 'nch' is invalid (expected nhd or hnd)", NULL);
    expect_error(edit(11, "    metrics_port: 7011\n    prefill_chunk: 100"),
                 "nodes[0].prefill_chunk: 100 is invalid (expected a multiple of 64", NULL);
}

static void test_missing_model(void **state)
{
    expect_error(edit(2, NULL), "m.yaml:1: model: missing (expected a path to the model "
                 "directory with config.json)", NULL);
    expect_error(edit(3, NULL), "token_file: missing", NULL);
    expect_error(edit(6, NULL), "coordinator.metrics_port: missing", NULL);
    expect_error(edit(11, NULL), "m.yaml:8: nodes[0].metrics_port: missing", NULL);
}

/* coordinator.etcd and coordinator.standbys: the standbys are coordinators
 * (procs[1..]) with the coordinator's fields and their own address; every
 * coordinator campaigns through etcd and every node is given them all;
 * the etcd hpdctl starts gets its command line and its ports checked;
 * mistakes are named. */
static void test_standbys_and_etcd(void **state)
{
    char text[4096], err[4096], args[2048], **argv;
    hpd_manifest_t *m;
    snprintf(text, sizeof(text), "%s",
             edit(6, "  metrics_port: 7001\n  heartbeat_ms: 300\n"
                     "  etcd: {endpoint: \"http://10.0.0.5:2379\", start: true, ttl_s: 3}\n"
                     "  standbys:\n    - {host: 10.0.0.6}\n"
                     "    - {port: 7100, metrics_port: 7101}"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    assert_int_equal(m->n_coordinators, 3);
    assert_int_equal(m->n_procs, 5);
    assert_string_equal(m->procs[1].name, "coordinator-2");
    assert_string_equal(m->procs[1].host, "10.0.0.6");
    assert_int_equal(m->procs[1].port, 7000); /* the coordinator's, on its own host */
    assert_int_equal(m->procs[2].port, 7100);
    assert_int_equal(m->procs[2].role, HPD_PROC_COORDINATOR);
    assert_string_equal(m->procs[3].name, "p0");
    assert_string_equal(m->etcd.host, "10.0.0.5");
    assert_int_equal(m->etcd.port, 2379);
    assert_int_equal(m->etcd.peer_port, 2380);
    assert_string_equal(m->etcd.key, "/hybridpd/t");
    for (uint32_t i = 0; i < 3; i++) {
        joined_args(m, &m->procs[i], args, sizeof(args));
        assert_non_null(strstr(args, "--etcd http://10.0.0.5:2379 --etcd-key /hybridpd/t "
                                     "--etcd-ttl-s 3"));
        assert_non_null(strstr(args, "--heartbeat-ms 300")); /* the coordinator's fields */
    }
    joined_args(m, &m->procs[4], args, sizeof(args));
    assert_non_null(strstr(args, "--coordinator 127.0.0.1:7000,10.0.0.6:7000,127.0.0.1:7100 "));
    assert_null(strstr(args, "--etcd"));
    assert_true(hpd_manifest_etcd_args(m, "/usr/bin/etcd", "/var/etcd", &argv) > 0);
    args[0] = '\0';
    for (int i = 0; argv[i] != NULL; i++)
        snprintf(args + strlen(args), sizeof(args) - strlen(args), "%s ", argv[i]);
    hpd_manifest_args_free(argv);
    assert_string_equal(args, "/usr/bin/etcd --name t --data-dir /var/etcd --listen-client-urls "
                              "http://10.0.0.5:2379 --advertise-client-urls http://10.0.0.5:2379 "
                              "--listen-peer-urls http://10.0.0.5:2380 "
                              "--initial-advertise-peer-urls http://10.0.0.5:2380 "
                              "--initial-cluster t=http://10.0.0.5:2380 ");
    hpd_manifest_destroy(m);

    /* mistakes */
    expect_error(edit(6, "  metrics_port: 7001\n  standbys:\n    - {port: 7100, metrics_port: "
                         "7101}"),
                 "coordinator.standbys: 1 standbys but no coordinator.etcd", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"https://e:2379\"}"),
                 "coordinator.etcd.endpoint: 'https://e:2379' is invalid (expected "
                 "http://HOST:PORT", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://e\"}"),
                 "coordinator.etcd.endpoint: 'http://e' is invalid", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {start: true}"),
                 "coordinator.etcd.endpoint: missing", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://e:1\", lease: 2}"),
                 "unknown field 'lease' (expected endpoint, key, ttl_s, start or peer_port)", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://e:1\", ttl_s: 1}"),
                 "coordinator.etcd.ttl_s: 1 is out of range (expected 2 to 60)", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://e:1\", key: k}"),
                 "coordinator.etcd.key: 'k' is invalid (expected a key starting with '/')", NULL);
    /* a standby on the coordinator's host needs ports of its own */
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://e:1\"}\n"
                         "  standbys:\n    - {metrics_port: 7101}"),
                 "coordinator-2.port: port 7000 on host 127.0.0.1 is already taken by "
                 "coordinator.port", NULL);
    /* the etcd hpdctl starts takes its two ports */
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://127.0.0.1:7010\", "
                         "start: true}"),
                 "coordinator.etcd: its client port 7010 on host 127.0.0.1 is already taken by "
                 "p0.port", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://127.0.0.1:7020\", "
                         "peer_port: 7021, start: true}"),
                 "its client port 7020", "its peer port 7021");
    expect_error(edit(6, "  metrics_port: 7001\n  etcd: {endpoint: \"http://e:1\"}\n"
                         "  standbys: {port: 1}"),
                 "coordinator.standbys: a mapping where a list of coordinators was expected",
                 NULL);
}

/* m rendered for Kubernetes in a new directory (dir): its objects' text
 * (the Secret needs a token file: one there; no client keys). */
static char *render_k8s(hpd_manifest_t *m, hpd_render_params_t *rp, char *dir, size_t dir_len)
{
    char path[600], err[4096], *all;
    test_tmpdir(dir, dir_len, "k8s");
    snprintf(path, sizeof(path), "%s/token", dir);
    assert_int_equal(hpd_write_file(path, "secret\n", 7), HPD_OK);
    snprintf(m->token_file, sizeof(m->token_file), "%s", path);
    m->client_keys_file[0] = '\0';
    snprintf(path, sizeof(path), "%s/all.yaml", dir);
    rp->out = path;
    assert_int_equal(hpd_render_k8s(rp, err, sizeof(err)), 0);
    assert_int_equal(hpd_read_file(path, &all, &(size_t){0}), HPD_OK);
    rp->out = NULL;
    return all;
}

/* Rendered, a cluster with a standby and the etcd it starts: systemd gets
 * an etcd unit the coordinators on its host follow and a unit per
 * coordinator; Kubernetes a Deployment of both coordinators (one flags
 * entry, etcd at its in-cluster Service) and etcd's Service and
 * StatefulSet. */
static void test_render_standbys(void **state)
{
    char text[4096], err[4096], dir[256], path[600], *unit, *all;
    hpd_manifest_t *m;
    snprintf(text, sizeof(text), "%s",
             edit(6, "  metrics_port: 7001\n"
                     "  etcd: {endpoint: \"http://127.0.0.1:7030\", start: true}\n"
                     "  standbys:\n    - {port: 7100, metrics_port: 7101}"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    test_tmpdir(dir, sizeof(dir), "units");
    hpd_render_params_t rp = {.manifest = m, .bins = {"/bin/c", "/bin/p", "/bin/d", "/bin/c"}, .out = dir};
    assert_int_equal(hpd_render_systemd(&rp, err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/hybridpd-t-etcd.service", dir);
    assert_int_equal(hpd_read_file(path, &unit, &(size_t){0}), HPD_OK);
    assert_non_null(strstr(unit, "ExecStart=/usr/bin/etcd --name t --data-dir "
                                 "/tmp/hybridpd-t/etcd.data --listen-client-urls "
                                 "http://127.0.0.1:7030"));
    free(unit);
    const char *coords[] = {"coordinator", "coordinator-2"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/hybridpd-t-%s.service", dir, coords[i]);
        assert_int_equal(hpd_read_file(path, &unit, &(size_t){0}), HPD_OK);
        assert_non_null(strstr(unit, "After=network-online.target hybridpd-t-etcd.service\n"));
        assert_non_null(strstr(unit, "--etcd http://127.0.0.1:7030"));
        free(unit);
    }
    snprintf(path, sizeof(path), "%s/hybridpd-t-d0.service", dir);
    assert_int_equal(hpd_read_file(path, &unit, &(size_t){0}), HPD_OK);
    assert_non_null(strstr(unit, "--coordinator 127.0.0.1:7000,127.0.0.1:7100 "));
    free(unit);
    test_rmtree(dir);

    /* Kubernetes */
    all = render_k8s(m, &rp, dir, sizeof(dir));
    const char *deploy = strstr(all, "kind: Deployment");
    assert_non_null(deploy);
    assert_non_null(strstr(deploy, "replicas: 2"));
    assert_non_null(strstr(all, "kind: StatefulSet\nmetadata:\n  name: t-etcd"));
    /* (the emitter folds long lines) */
    assert_non_null(strstr(all, "--etcd http://t-etcd.default.svc:7030"));
    assert_non_null(strstr(all, "--etcd-key /hybridpd/t"));
    assert_null(strstr(all, "--etcd http://127.0.0.1")); /* the host's address is not the pod's */
    assert_non_null(strstr(all, "exec etcd --name t"));
    const char *first = strstr(all, "\n  coordinator: ");
    assert_non_null(first);
    assert_null(strstr(first + 1, "\n  coordinator: ")); /* one flags entry */
    free(all);
    test_rmtree(dir);
    hpd_manifest_destroy(m);
}

/* coordinator.doors: front doors after the nodes, each the coordinator's
 * fields with its own ports, started with --scheduler naming the
 * coordinator and its standbys (never --etcd); rendered, each its unit
 * after the coordinator's, and in Kubernetes a Deployment of them behind
 * a Service, their pods given the coordinator's Service as scheduler and
 * the model for the HTTP API. */
static void test_doors(void **state)
{
    char text[4096], err[4096], args[2048], dir[256], path[600], *unit, *all;
    hpd_manifest_t *m;
    snprintf(text, sizeof(text), "%s",
             edit(6, "  metrics_port: 7001\n  max_requests: 900\n"
                     "  etcd: {endpoint: \"http://10.0.0.5:2379\"}\n"
                     "  standbys:\n    - {port: 7100, metrics_port: 7101}\n"
                     "  doors:\n    - {port: 7200, metrics_port: 7201, http_port: 7202}\n"
                     "    - {host: 10.0.0.7, port: 7200, metrics_port: 7201}"));
    assert_int_equal(hpd_manifest_parse(text, strlen(text), "m.yaml", "/srv", &m, err,
                                        sizeof(err)), HPD_OK);
    assert_int_equal(m->n_coordinators, 2);
    assert_int_equal(m->n_doors, 2);
    assert_int_equal(m->n_procs, 6);
    const hpd_manifest_proc_t *d = &m->procs[4];
    assert_string_equal(d->name, "door-1");
    assert_int_equal(d->role, HPD_PROC_DOOR);
    assert_string_equal(hpd_proc_role_name(d->role), "door");
    assert_int_equal(d->http_port, 7202);
    assert_int_equal(m->procs[5].http_port, 0); /* not the first door's */
    assert_string_equal(m->procs[5].host, "10.0.0.7");
    joined_args(m, d, args, sizeof(args));
    assert_non_null(strstr(args, "--port 7200 --metrics-port 7201 "));
    assert_non_null(strstr(args, "--http-port 7202 --model "));
    assert_non_null(strstr(args, "--max-requests 900"));
    assert_non_null(strstr(args, "--scheduler 127.0.0.1:7000,127.0.0.1:7100"));
    assert_null(strstr(args, "--etcd"));
    joined_args(m, &m->procs[3], args, sizeof(args)); /* a node registers with coordinators */
    assert_non_null(strstr(args, "--coordinator 127.0.0.1:7000,127.0.0.1:7100 "));

    test_tmpdir(dir, sizeof(dir), "units");
    hpd_render_params_t rp = {.manifest = m, .bins = {"/bin/c", "/bin/p", "/bin/d", "/bin/c"},
                              .out = dir};
    assert_int_equal(hpd_render_systemd(&rp, err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/hybridpd-t-door-1.service", dir);
    assert_int_equal(hpd_read_file(path, &unit, &(size_t){0}), HPD_OK);
    assert_non_null(strstr(unit, "After=network-online.target hybridpd-t-coordinator.service"));
    assert_non_null(strstr(unit, "ExecStart=/bin/c --host 127.0.0.1 --port 7200 "));
    free(unit);
    test_rmtree(dir);
    all = render_k8s(m, &rp, dir, sizeof(dir));
    const char *deploy = strstr(all, "kind: Deployment\nmetadata:\n  name: t-door");
    assert_non_null(deploy);
    assert_non_null(strstr(deploy, "replicas: 2"));
    assert_non_null(strstr(deploy, "flags/door)"));
    assert_non_null(strstr(deploy, "--scheduler t-coordinator.default.svc:7000"));
    assert_non_null(strstr(deploy, "name: model"));       /* the HTTP API's tokenizer */
    assert_non_null(strstr(deploy, "containerPort: 7202"));
    assert_non_null(strstr(all, "kind: Service\nmetadata:\n  name: t-door"));
    const char *flags = strstr(all, "\n  door: ");
    assert_non_null(flags);
    assert_null(strstr(flags + 1, "\n  door: ")); /* one flags entry */
    assert_null(strstr(flags, "--scheduler 127.0.0.1")); /* the host's address is not the pod's */
    free(all);
    test_rmtree(dir);
    hpd_manifest_destroy(m);

    /* mistakes */
    expect_error(edit(6, "  metrics_port: 7001\n  doors:\n    - {port: 7200}"),
                 "coordinator.doors[0].metrics_port: missing", NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  doors:\n    - {port: 7000, metrics_port: 7201}"),
                 "door-1.port: port 7000 on host 127.0.0.1 is already taken by coordinator.port",
                 NULL);
    expect_error(edit(6, "  metrics_port: 7001\n  doors: {port: 1}"),
                 "coordinator.doors: a mapping where a list of front doors was expected", NULL);
}

static void test_several_errors_and_syntax(void **state)
{
    /* every mistake is listed, not just the first */
    const char *two = edit(12, "    kv_layout: {block: 24, pack: 1, order: nhd}\n    foo: 1");
    expect_error(two, "nodes[0].kv_layout.block: 24", "m.yaml:13: nodes[0].foo: unknown field");
    expect_error("cluster: [unclosed\n", "m.yaml:", "yaml:");
    expect_error("", "manifest: the document is empty", NULL);
    expect_error(edit(8, "  - name: P_0"), "nodes[0].name: 'P_0' is invalid", NULL);
    expect_error(edit(13, "  - name: p0"), "nodes[1].name: 'p0' is already the name of the node "
                 "at line 8", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_loads),
        cmocka_unit_test(test_examples_load),
        cmocka_unit_test(test_client_keys_file),
        cmocka_unit_test(test_fields_follow_the_options_table),
        cmocka_unit_test(test_unknown_field),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_wrong_type),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_systemd_quoting),
        cmocka_unit_test(test_missing_role),
        cmocka_unit_test(test_port_clash),
        cmocka_unit_test(test_http_port),
        cmocka_unit_test(test_bad_layout),
        cmocka_unit_test(test_missing_model),
        cmocka_unit_test(test_several_errors_and_syntax),
        cmocka_unit_test(test_standbys_and_etcd),
        cmocka_unit_test(test_render_standbys),
        cmocka_unit_test(test_doors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
