#include "common/options.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_layout.h"
#include "common/log.h"
#include "common/logprobs.h"
#include "common/sampling.h"
#include "common/util.h"

#define C HPD_OPT_ROLE_COORD
#define PF HPD_OPT_ROLE_PREFILL
#define DC HPD_OPT_ROLE_DECODE
#define N HPD_OPT_ROLE_NODE
#define RUN HPD_OPT_ROLE_RUN
#define D HPD_OPT_ROLE_DAEMON

/* integers, with their manifest field */
#define INT(name_, kind_, lo, hi, mult_, def_, help_, roles_, man)                            \
    {.name = name_, .kind = HPD_OPT_##kind_, .min = lo, .max = hi, .mult = mult_,            \
     .def = def_, .arg = "N", .help = help_, .roles = roles_, .manifest = man}
#define TXT(name_, arg_, def_, help_, roles_, man)                                           \
    {.name = name_, .kind = HPD_OPT_STR, .def = def_, .arg = arg_, .help = help_,            \
     .roles = roles_, .manifest = man}

const hpd_opt_t hpd_options[] = {
    /* ---- every program */
    {.name = "log-level", .kind = HPD_OPT_LEVEL, .def = "info", .arg = "L",
     .help = "error|warn|info|debug", .roles = D | RUN, .manifest = "log_level"},
    /* ---- the daemons */
    TXT("host", "ADDR", "127.0.0.1", "address to bind (nodes: and announce)", D, "host"),
    {.name = "port", .kind = HPD_OPT_PORT, .max = 65535, .def = "0", .arg = "N",
     .help = "RPC port, 0 = any free port", .roles = D, .manifest = "port"},
    TXT("token-file", "F", NULL, "the cluster's node secret (first line)", D, NULL),
    {.name = "metrics-port", .kind = HPD_OPT_OPORT, .max = 65535, .arg = "N",
     .help = "serve /metrics and /healthz over HTTP on --host", .roles = D,
     .manifest = "metrics_port"},
    INT("drain-timeout-ms", U32, 0, UINT32_MAX, 1, "30000",
        "on SIGTERM, open requests may finish this long", D, "drain_timeout_ms"),
    /* ---- the coordinator */
    TXT("port-file", "F", NULL, "write the bound port to F once listening", C, NULL),
    TXT("client-keys-file", "F", NULL, "client API keys, one per line: KEY [TENANT]; read\n"
        "again on SIGHUP (a removed key's connections close);\nneeded with --token-file: the "
        "node secret is never a client key", C, NULL),
    INT("heartbeat-ms", U32, 10, 60000, 1, "500", "node heartbeat period", C, "heartbeat_ms"),
    INT("lease-ms", U32, 30, 600000, 1, "10000", "a node silent this long is lost; more than\n"
        "the longest engine step", C, "lease_ms"),
    INT("liveness-ms", U32, 0, 600000, 1, "500", "a node whose pinger thread is silent this\n"
        "long is suspect (no new work, its requests run\nelsewhere); lost after twice its "
        "window (at least\n4 x this); 0 = off", C, "liveness_ms"),
    INT("max-requests", U32, 1, 1u << 24, 1, "256", "requests in flight before 'overloaded'",
        C, "max_requests"),
    INT("queue-timeout-ms", U32, 1, UINT32_MAX, 1, "60000",
        "a request no node can take fails after", C, "queue_timeout_ms"),
    INT("max-attempts", U32, 1, 100, 1, "4", "attempts per request across failures", C,
        "max_attempts"),
    {.name = "http-port", .kind = HPD_OPT_OPORT, .max = 65535, .arg = "N",
     .help = "serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions,\n"
             "/v1/models, /tokenize, /detokenize) over HTTP on --host; needs --model",
     .roles = C, .manifest = "http_port"},
    TXT("http-port-file", "F", NULL, "write the HTTP API's bound port to F once listening", C,
        NULL),
    TXT("served-model-name", "NAME", NULL, "the model's name in the HTTP API (the --model\n"
        "directory's last part)", C, "served_model_name"),
    TXT("thinking", "on|off", NULL, "a chat's thinking where its request does not say\n"
        "(chat_template_kwargs.enable_thinking, generate's thinking; the model's default)", C,
        NULL),
    INT("max-connections", U32, 4, 1u << 20, 1, NULL, "open RPC connections, clients and\n"
        "nodes; half at most unauthenticated (1024, or what the fd limit allows)", C, NULL),
    TXT("etcd", "URL", NULL, "elect the cluster's coordinator through etcd at URL\n"
        "(http://HOST:PORT): a standby listens only once it leads", C, NULL),
    TXT("etcd-key", "KEY", "/hybridpd/coordinator", "the election's key in etcd (one a cluster)",
        C, NULL),
    TXT("scheduler", "HOST:PORT[,...]", NULL, "run as a front door of this scheduler (a\n"
        "coordinator, its standbys after a comma): the doors\nhere, decode nodes stream the "
        "tokens here", C, NULL),
    TXT("advertise", "HOST", NULL, "a front door: the host decode nodes reach it at\n"
        "(--host)", C, NULL),
    INT("etcd-ttl-s", U32, 2, 60, 1, "2", "the leader's lease: a standby takes over this\n"
        "long at most after the leader stops renewing it", C, NULL),
    /* ---- nodes */
    {.name = "coordinator", .kind = HPD_OPT_CUSTOM, .arg = "HOST:PORT",
     .help = "the coordinator's RPC endpoint", .roles = N},
    TXT("model", "DIR", NULL, "the model: config.json and *.safetensors (the coordinator:\n"
        "its tokenizer.json and chat template, for the HTTP API)", N | RUN | C, NULL),
    TXT("name", "NAME", NULL, "node name in status and logs (ROLE-<pid>)", N, NULL),
    TXT("device", "D", "cpu", "cpu, cpu-bf16 (BF16 weights times bf16-rounded activations,\n"
        "as llama.cpp: faster, not the fp32 result), cuda[:N] (the GPU id),\n"
        "cuda-bf16[:N] (the same on tensor cores) or cuda-fast[:N]",
        N | RUN, "device"),
    INT("threads", U32, 1, 1024, 1, NULL, "CPU threads (all cores)", N | RUN, "threads"),
    INT("tp", U32, 1, 8, 1, "1", "tensor-parallel ranks (1, 2, 4 or 8): CPU ranks,\n"
        "each with its shard and a share of --threads", N | RUN, "tp"),
    {.name = "tp-fast", .kind = HPD_OPT_ON, .roles = N | RUN,
     .help = "one GEMM a row-parallel product instead of the\ncanonical sum's 8: faster, "
             "but the bits depend on --tp"},
    {.name = "kv-layout", .kind = HPD_OPT_LAYOUT, .def = "64,1,nhd", .arg = "B,P,O",
     .help = "KV page layout: tokens per page (a multiple of 16),\npack size, nhd|hnd",
     .roles = N | RUN, .manifest = "kv_layout"},
    INT("max-batch", U32, 1, 4096, 1, "16", "requests in one batch", N | RUN, "max_batch"),
    INT("max-context", U32, 2, 1u << 20, 1, NULL, "prompt + generated tokens (4096, or the\n"
        "model's maximum when less)", N | RUN, "max_context"),
    INT("prefill-chunk", U32, 64, 1u << 16, 64, "256", "prefill tokens per step", N | RUN,
        "prefill_chunk"),
    INT("kv-pages", U32, 1, UINT32_MAX - 1, 1, NULL, "KV pages in the pool (enough for the\n"
        "batch, x2 with the prefix cache)", N | RUN, "kv_pages"),
    {.name = "no-prefix-cache", .kind = HPD_OPT_OFF, .help = "compute every prompt token",
     .roles = PF | RUN, .manifest = "prefix_cache.enabled"},
    INT("checkpoints", U32, 1, 1u << 20, 1, NULL, "device GDN checkpoint slots of the prefix\n"
        "cache (4 x batch)", PF | RUN, "prefix_cache.checkpoints"),
    INT("host-cache-mb", MB, 0, 1u << 24, 1, "512", "host tier of the prefix cache in MiB,\n"
        "0 = off", PF | RUN, "prefix_cache.host_mb"),
    INT("staging-mb", MB, 1, 1u << 20, 1, "256", "registered staging for pushes, MiB", PF,
        "staging_mb"),
    INT("xfer-deadline-ms", U32, 0, 3600000, 1, "1000", "a transfer not acknowledged this\n"
        "long after its end, plus its bytes at the link rate, fails its pair;\n0 = never", PF,
        "xfer_deadline_ms"),
    INT("reserve-timeout-ms", U32, 1, UINT32_MAX, 1, "60000",
        "an unstarted reservation expires", DC, "reserve_timeout_ms"),
    TXT("ucx-tls", "T", "tcp", "UCX transports", N, "ucx.tls"),
    TXT("ucx-dev", "D", "lo", "UCX network devices", N, "ucx.dev"),
    INT("connect-timeout-ms", U32, 0, UINT32_MAX, 1, "0",
        "give up (exit 3) when the first registration has not\nsucceeded after this long; "
        "0 = keep trying (with\nbackoff, saying why)", N, "connect_timeout_ms"),
    /* ---- hpd-run */
    TXT("prompt-ids", "1,2,3", NULL, "one prompt as token ids", RUN, NULL),
    TXT("prompts-file", "F", NULL, "prompts, one per line as token ids", RUN, NULL),
    TXT("prompt", "TEXT", NULL, "one prompt as text (the model's tokenizer.json)", RUN, NULL),
    {.name = "text", .kind = HPD_OPT_ON, .roles = RUN,
     .help = "print the generated text (special tokens left out) instead of ids"},
    INT("max-tokens", U32, 1, 1u << 20, 1, "16", "tokens to generate per prompt", RUN, NULL),
    {.name = "temperature", .kind = HPD_OPT_F32, .fmin = 0, .fmax = 1e6f, .arg = "T",
     .help = "0 is greedy (default: generation_config.json's, else 0)", .roles = RUN},
    {.name = "top-p", .kind = HPD_OPT_F32, .fmin = 0, .fmax = 1, .open_min = true, .arg = "P",
     .help = "nucleus sampling mass (default: generation_config.json's, else 1)", .roles = RUN},
    INT("top-k", U32, 0, HPD_TOP_K_UNSET - 1, 1, NULL, "keep the K most likely tokens, 0 = all\n"
        "(default: generation_config.json's, else 0)", RUN, NULL),
    {.name = "no-generation-defaults", .kind = HPD_OPT_OFF, .roles = C | RUN,
     .help = "a request that does not set temperature, top_p or top_k samples greedily\n"
             "instead of with the model's generation_config.json values"},
    INT("seed", U64, 0, UINT64_MAX, 1, "0", "sampling seed", RUN, NULL),
    INT("kv-block-size", U32, 16, 4096, 16, NULL, "tokens per KV page (overrides --kv-layout's)",
        RUN, NULL),
    INT("checkpoint-every", U32, 0, 1u << 20, 1, "16",
        "also checkpoint every N 64-token blocks", RUN, NULL),
    TXT("stop-ids", "1,2,3", NULL, "stop after any of these token ids (besides the model's\n"
        "end-of-sequence ids)", RUN, NULL),
    TXT("json-schema", "FILE", NULL, "structured output: every token the JSON Schema in FILE\n"
        "allows (docs/structured_outputs.md)", RUN, NULL),
    INT("n", U32, 1, HPD_MAX_CHOICES, 1, "1", "choices per prompt from one prefill, choice c\n"
        "seeded with --seed + c (a line of tokens each)", RUN, NULL),
    {.name = "json-object", .kind = HPD_OPT_ON, .roles = RUN,
     .help = "structured output: any JSON object"},
    {.name = "json-flexible", .kind = HPD_OPT_ON, .roles = RUN,
     .help = "with --json-schema/--json-object: any JSON whitespace inside\n"
             "the document (else none but \", \" and \": \")"},
    {.name = "ignore-eos", .kind = HPD_OPT_ON, .roles = RUN,
     .help = "do not stop at the model's end-of-sequence ids"},
    INT("min-tokens", U32, 0, 1u << 20, 1, "0", "generate at least this many tokens before a\n"
        "stop or end-of-sequence token counts", RUN, NULL),
    TXT("stats-json", "FILE", NULL, "write per-request cached tokens, finish reasons and\n"
        "cache counters", RUN, NULL),
    TXT("logits-out", "FILE", NULL, "write the logits of the last step of the first prompt\n"
        "as little-endian float32", RUN, NULL),
    INT("logprobs", U32, 0, HPD_MAX_TOP_LOGPROBS, 1, NULL, "after each prompt's tokens, a line "
        "of their log\nprobabilities and the N most likely tokens'", RUN, NULL),
    {.name = "prompt-logprobs", .kind = HPD_OPT_ON, .roles = RUN,
     .help = "before that line, one of the prompt's tokens'\n(each given the ones before it; "
             "--logprobs N's top ones)"},
};
const size_t hpd_n_options = sizeof(hpd_options) / sizeof(hpd_options[0]);

const hpd_opt_t *hpd_opt_find(const char *name)
{
    for (size_t i = 0; i < hpd_n_options; i++)
        if (strcmp(hpd_options[i].name, name) == 0)
            return &hpd_options[i];
    return NULL;
}

const hpd_opt_t *hpd_opt_find_manifest(const char *field)
{
    for (size_t i = 0; i < hpd_n_options; i++)
        if (hpd_options[i].manifest != NULL && strcmp(hpd_options[i].manifest, field) == 0)
            return &hpd_options[i];
    return NULL;
}

const char *hpd_opt_roles_text(unsigned roles)
{
    roles &= HPD_OPT_ROLE_DAEMON | HPD_OPT_ROLE_RUN;
    if ((roles & HPD_OPT_ROLE_DAEMON) == HPD_OPT_ROLE_DAEMON)
        return "every daemon";
    if ((roles & HPD_OPT_ROLE_DAEMON) == HPD_OPT_ROLE_COORD)
        return "the coordinator";
    if ((roles & HPD_OPT_ROLE_NODE) == HPD_OPT_ROLE_NODE)
        return "nodes";
    if (roles & HPD_OPT_ROLE_PREFILL)
        return "prefill nodes";
    if (roles & HPD_OPT_ROLE_DECODE)
        return "decode nodes";
    return "hpd-run";
}

bool hpd_opt_value(const hpd_opt_t *o, const char *text, void *dst, char *err, size_t len)
{
    uint64_t v;
    float f;
    switch (o->kind) {
    case HPD_OPT_U32:
    case HPD_OPT_U64:
    case HPD_OPT_MB:
    case HPD_OPT_PORT:
    case HPD_OPT_OPORT:
        if (hpd_parse_u64(text, o->min, o->max, &v) != 0 || (o->mult > 1 && v % o->mult != 0)) {
            char mult[48] = "";
            if (o->mult > 1)
                snprintf(mult, sizeof(mult), ", a multiple of %llu",
                         (unsigned long long)o->mult);
            snprintf(err, len, "--%s: '%s' is invalid (expected an integer from %llu to %llu%s)",
                     o->name, text, (unsigned long long)o->min, (unsigned long long)o->max,
                     mult);
            return false;
        }
        if (dst == NULL)
            return true;
        if (o->kind == HPD_OPT_U32)
            *(uint32_t *)dst = (uint32_t)v;
        else if (o->kind == HPD_OPT_U64)
            *(uint64_t *)dst = v;
        else if (o->kind == HPD_OPT_MB)
            *(uint64_t *)dst = v << 20;
        else if (o->kind == HPD_OPT_PORT)
            *(uint16_t *)dst = (uint16_t)v;
        else
            *(int32_t *)dst = (int32_t)v;
        return true;
    case HPD_OPT_F32:
        if (hpd_parse_float(text, &f) != 0 || !(f >= o->fmin && f <= o->fmax) ||
            (o->open_min && f == o->fmin)) {
            snprintf(err, len, "--%s: '%s' is invalid (expected a number in %c%g, %g])", o->name,
                     text, o->open_min ? '(' : '[', o->fmin, o->fmax);
            return false;
        }
        if (dst != NULL)
            *(float *)dst = f;
        return true;
    case HPD_OPT_STR:
        if (dst != NULL)
            *(const char **)dst = text;
        return true;
    case HPD_OPT_OFF:
    case HPD_OPT_ON:
        if (dst != NULL)
            *(bool *)dst = o->kind == HPD_OPT_ON;
        return true;
    case HPD_OPT_LEVEL: {
        const int lvl = hpd_log_level_parse(text);
        if (lvl < 0) {
            snprintf(err, len, "--%s: '%s' is invalid (expected error, warn, info or debug)",
                     o->name, text);
            return false;
        }
        if (dst != NULL)
            *(hpd_log_level_t *)dst = (hpd_log_level_t)lvl;
        return true;
    }
    case HPD_OPT_LAYOUT: {
        hpd_kv_layout_t l = {0};
        if (hpd_kv_layout_parse(text, &l) != HPD_OK) {
            snprintf(err, len, "--%s: '%s' is invalid (expected B,P,nhd|hnd with B a multiple "
                     "of 16, the KV page layout)", o->name, text);
            return false;
        }
        if (dst != NULL) {
            hpd_kv_layout_t *d = dst;
            d->block_size = l.block_size;
            d->pack_size = l.pack_size;
            d->order = l.order;
        }
        return true;
    }
    case HPD_OPT_CUSTOM: break;
    }
    snprintf(err, len, "--%s: no reader for it", o->name);
    return false;
}

static bool set(const hpd_opt_t *o, const hpd_opt_bind_t *b, const char *text, char *err,
                size_t len)
{
    if (o->kind == HPD_OPT_CUSTOM) {
        char why[200] = "";
        if (b->parse(text, b->dst, why, sizeof(why)))
            return true;
        snprintf(err, len, "--%s: '%s' is invalid (%s)", o->name, text, why);
        return false;
    }
    return hpd_opt_value(o, text, b->dst, err, len);
}

void hpd_opt_usage(FILE *f, const char *intro, const hpd_opt_bind_t *binds, size_t n)
{
    fprintf(f, "%s\n", intro);
    for (size_t i = 0; i < n; i++) {
        const hpd_opt_t *o = hpd_opt_find(binds[i].name);
        char flag[64];
        const char *def = binds[i].def != NULL ? binds[i].def : o->def;
        if (o->kind == HPD_OPT_OFF || o->kind == HPD_OPT_ON)
            snprintf(flag, sizeof(flag), "--%s", o->name);
        else
            snprintf(flag, sizeof(flag), "--%s %s", o->name, o->arg ? o->arg : "V");
        const char *h = o->help;
        bool first = true;
        while (h != NULL && *h != '\0') {
            const char *nl = strchr(h, '\n');
            const int w = nl != NULL ? (int)(nl - h) : (int)strlen(h);
            fprintf(f, "  %-24s %.*s", first ? flag : "", w, h);
            h = nl != NULL ? nl + 1 : NULL;
            if (h == NULL && def != NULL && o->kind != HPD_OPT_OFF && o->kind != HPD_OPT_ON)
                fprintf(f, " (%s)", def);
            if (h == NULL && binds[i].required)
                fprintf(f, " (required)");
            fputc('\n', f);
            first = false;
        }
    }
}

int hpd_opt_parse(int argc, char **argv, const char *prog, unsigned role, const char *intro,
                  const hpd_opt_bind_t *binds, size_t n_binds)
{
    char err[400];
    bool *given = calloc(n_binds + 1, sizeof(bool));
    struct option *lo = calloc(hpd_n_options + 2, sizeof(*lo));
    int rc = -1, c;
    if (given == NULL || lo == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        goto out;
    }
    /* the defaults, checked as values are */
    for (size_t i = 0; i < n_binds; i++) {
        const hpd_opt_t *o = hpd_opt_find(binds[i].name);
        const char *def = binds[i].def != NULL ? binds[i].def : o->def;
        if (o->kind == HPD_OPT_OPORT)
            *(int32_t *)binds[i].dst = -1;
        if (def != NULL && o->kind != HPD_OPT_OFF && o->kind != HPD_OPT_ON &&
            !set(o, &binds[i], def, err, sizeof(err))) {
            fprintf(stderr, "%s: default %s\n", prog, err);
            goto out;
        }
    }
    /* every option of the table is known (one of another role is named as
     * such), --help too */
    for (size_t i = 0; i < hpd_n_options; i++)
        lo[i] = (struct option){hpd_options[i].name,
                                hpd_options[i].kind == HPD_OPT_OFF ||
                                        hpd_options[i].kind == HPD_OPT_ON
                                    ? no_argument
                                    : required_argument,
                                NULL, 256 + (int)i};
    lo[hpd_n_options] = (struct option){"help", no_argument, NULL, 'h'};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'h') {
            hpd_opt_usage(stdout, intro, binds, n_binds);
            rc = 1;
            goto out;
        }
        if (c < 256) {
            fprintf(stderr, "%s: see --help for the options\n", prog);
            goto out;
        }
        const hpd_opt_t *o = &hpd_options[c - 256];
        size_t b = 0;
        while (b < n_binds && strcmp(binds[b].name, o->name) != 0)
            b++;
        if (b == n_binds || !(o->roles & role)) {
            fprintf(stderr, "%s: --%s is an option of %s, not of %s\n", prog, o->name,
                    hpd_opt_roles_text(o->roles), hpd_opt_roles_text(role));
            goto out;
        }
        if (!set(o, &binds[b], optarg, err, sizeof(err))) {
            fprintf(stderr, "%s: %s\n", prog, err);
            goto out;
        }
        given[b] = true;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        goto out;
    }
    for (size_t i = 0; i < n_binds; i++)
        if (binds[i].required && !given[i]) {
            fprintf(stderr, "%s: --%s is required\n", prog, binds[i].name);
            hpd_opt_usage(stderr, intro, binds, n_binds);
            goto out;
        }
    rc = 0;
out:
    free(given);
    free(lo);
    return rc;
}
