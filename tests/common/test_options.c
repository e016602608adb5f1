/* The options table (common/options.h):
 * - its entries: unique names and manifest fields, a role each, defaults
 *   that pass their own checks, at most 64 entries (the manifest's given
 *   bits);
 * - parsing: defaults (the table's and a program's own), values, ranges and
 *   multiples, an option of another role named as such, a missing required
 *   option, an unknown one, a stray argument, --help;
 * - hpd-run's and the nodes' engine defaults are the engine's own
 *   (hpd_engine_params_init), so the table and the library agree;
 * - --help lists every option bound, with its default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/options.h"
#include "common/util.h"
#include "engine/engine.h"

static int parse(unsigned role, const hpd_opt_bind_t *binds, size_t n, ...)
{
    char *argv[32] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, n);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;)
        argv[argc++] = a;
    va_end(ap);
    return hpd_opt_parse(argc, argv, "prog", role, "usage: prog", binds, n);
}

static void test_table(void **state)
{
    char err[200];
    assert_true(hpd_n_options <= 96); /* a sanity bound */
    for (size_t i = 0; i < hpd_n_options; i++) {
        const hpd_opt_t *o = &hpd_options[i];
        assert_non_null(o->help);
        assert_true(o->roles != 0);
        assert_ptr_equal(hpd_opt_find(o->name), o);
        if (o->manifest != NULL)
            assert_ptr_equal(hpd_opt_find_manifest(o->manifest), o);
        if (o->def != NULL && o->kind != HPD_OPT_CUSTOM) {
            if (!hpd_opt_value(o, o->def, NULL, err, sizeof(err)))
                fail_msg("--%s: its default fails its own check: %s", o->name, err);
        }
        if (o->kind == HPD_OPT_U32 || o->kind == HPD_OPT_MB)
            assert_true(o->min <= o->max && o->max <= UINT32_MAX);
    }
    assert_null(hpd_opt_find("frobnicate"));
    assert_string_equal(hpd_opt_roles_text(HPD_OPT_ROLE_PREFILL | HPD_OPT_ROLE_RUN),
                        "prefill nodes");
    assert_string_equal(hpd_opt_roles_text(HPD_OPT_ROLE_COORD), "the coordinator");
}

static void test_values_and_ranges(void **state)
{
    uint32_t batch = 0, chunk = 0, hb = 0;
    uint64_t staging = 0;
    uint16_t port = 0;
    int32_t metrics = 0;
    float top_p = 0.25f;
    const hpd_opt_bind_t b[] = {
        HPD_OPT_BIND("max-batch", &batch),
        HPD_OPT_BIND("prefill-chunk", &chunk),
        HPD_OPT_BIND("staging-mb", &staging),
        {.name = "port", .dst = &port, .def = "7000"},
        HPD_OPT_BIND("metrics-port", &metrics),
        HPD_OPT_BIND("top-p", &top_p),
        HPD_OPT_BIND("heartbeat-ms", &hb),
    };
    const unsigned all = HPD_OPT_ROLE_DAEMON | HPD_OPT_ROLE_RUN;
    assert_int_equal(parse(all, b, 7, NULL), 0);
    assert_int_equal(batch, 16);                   /* the table's defaults */
    assert_int_equal(chunk, 256);
    assert_int_equal(staging, 256ull << 20);       /* MiB */
    assert_int_equal(port, 7000);                  /* the program's own */
    assert_int_equal(metrics, -1);                 /* not given */
    assert_true(top_p == 0.25f);                   /* no default: the program resolves it */
    assert_int_equal(hb, 500);
    assert_int_equal(parse(all, b, 7, "--max-batch", "8", "--staging-mb", "4", "--metrics-port",
                           "0", "--top-p", "0.5", NULL), 0);
    assert_int_equal(batch, 8);
    assert_int_equal(staging, 4ull << 20);
    assert_int_equal(metrics, 0);
    assert_true(top_p == 0.5f);
    assert_int_equal(parse(all, b, 7, "--max-batch", "0", NULL), -1);       /* range */
    assert_int_equal(parse(all, b, 7, "--max-batch", "4097", NULL), -1);
    assert_int_equal(parse(all, b, 7, "--max-batch", "eight", NULL), -1);
    assert_int_equal(parse(all, b, 7, "--prefill-chunk", "100", NULL), -1); /* a multiple of 64 */
    assert_int_equal(parse(all, b, 7, "--prefill-chunk", "128", NULL), 0);
    assert_int_equal(parse(all, b, 7, "--top-p", "0", NULL), -1);           /* (0, 1] */
    assert_int_equal(parse(all, b, 7, "--top-p", "1.5", NULL), -1);
    assert_int_equal(parse(all, b, 7, "--top-p", "nan", NULL), -1);
    char err[200];
    assert_false(hpd_opt_value(hpd_opt_find("prefill-chunk"), "100", NULL, err, sizeof(err)));
    assert_string_equal(err, "--prefill-chunk: '100' is invalid (expected an integer from 64 "
                             "to 65536, a multiple of 64)");
}

static void test_roles_required_unknown(void **state)
{
    uint64_t staging = 0;
    uint32_t reserve = 0;
    const char *model = NULL;
    const hpd_opt_bind_t decode[] = {
        HPD_OPT_BIND("reserve-timeout-ms", &reserve),
        {.name = "model", .dst = &model, .required = true},
    };
    (void)staging;
    /* an option of the other role, of the coordinator, of no one */
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, "--model", "m", "--staging-mb",
                           "4", NULL), -1);
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, "--model", "m", "--lease-ms",
                           "400", NULL), -1);
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, "--model", "m", "--frobnicate",
                           NULL), -1);
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, "--model", "m", "stray", NULL), -1);
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, NULL), -1); /* --model required */
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, "--model", "m",
                           "--reserve-timeout-ms", "5", NULL), 0);
    assert_string_equal(model, "m");
    assert_int_equal(reserve, 5);
    assert_int_equal(parse(HPD_OPT_ROLE_DECODE, decode, 2, "--help", NULL), 1);
}

/* The defaults the table gives hpd-run and the nodes for the engine are
 * the engine's own. */
static void test_engine_defaults_agree(void **state)
{
    hpd_engine_params_t lib, cli;
    hpd_engine_params_init(&lib);
    hpd_engine_params_init(&cli);
    memset(&cli.kv_layout, 0, sizeof(cli.kv_layout));
    cli.max_batch = cli.prefill_chunk = cli.checkpoint_every = 0;
    cli.host_cache_bytes = 0;
    const hpd_opt_bind_t b[] = {
        HPD_OPT_BIND("kv-layout", &cli.kv_layout),
        HPD_OPT_BIND("max-batch", &cli.max_batch),
        HPD_OPT_BIND("max-context", &cli.max_context),
        HPD_OPT_BIND("prefill-chunk", &cli.prefill_chunk),
        HPD_OPT_BIND("kv-pages", &cli.n_pages),
        HPD_OPT_BIND("checkpoints", &cli.n_checkpoints),
        HPD_OPT_BIND("checkpoint-every", &cli.checkpoint_every),
        HPD_OPT_BIND("host-cache-mb", &cli.host_cache_bytes),
        HPD_OPT_BIND("no-prefix-cache", &cli.prefix_cache),
    };
    assert_int_equal(parse(HPD_OPT_ROLE_RUN, b, HPD_ARRAY_SIZE(b), NULL), 0);
    assert_memory_equal(&cli, &lib, sizeof(cli));
    assert_int_equal(parse(HPD_OPT_ROLE_RUN, b, HPD_ARRAY_SIZE(b), "--no-prefix-cache",
                           "--kv-layout", "16,2,hnd", NULL), 0);
    assert_false(cli.prefix_cache);
    assert_int_equal(cli.kv_layout.block_size, 16);
    assert_int_equal(cli.kv_layout.pack_size, 2);
    assert_int_equal(cli.kv_layout.order, HPD_KV_HND);
}

static void test_help(void **state)
{
    uint32_t lease = 0;
    hpd_log_level_t level;
    const hpd_opt_bind_t b[] = {HPD_OPT_BIND("lease-ms", &lease),
                                {.name = "log-level", .dst = &level, .def = "warn"}};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    hpd_opt_usage(f, "usage: x", b, 2);
    fclose(f);
    assert_non_null(strstr(text, "usage: x\n"));
    assert_non_null(strstr(text, "--lease-ms N"));
    assert_non_null(strstr(text, "the longest engine step (10000)"));
    assert_non_null(strstr(text, "error|warn|info|debug (warn)"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_values_and_ranges),
        cmocka_unit_test(test_roles_required_unknown),
        cmocka_unit_test(test_engine_defaults_agree),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
