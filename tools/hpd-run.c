/* hpd-run: generates tokens from a model in one process.
 *
 * Prints the generated ids of each prompt as one line of space-separated
 * integers on stdout; diagnostics go to stderr. Exit status: 0 success,
 * 2 bad input (flags, prompt, ids), 1 any other failure. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "model/model.h"

typedef hpd_prompt_t prompt_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hpd-run --model DIR (--prompt-ids 1,2,3 | --prompts-file F) [options]\n"
            "  --max-tokens N        tokens to generate per prompt (16)\n"
            "  --temperature T       0 is greedy (0)\n"
            "  --top-p P             nucleus sampling mass in (0, 1] (1)\n"
            "  --top-k K             keep the K most likely tokens, 0 = all (0)\n"
            "  --seed S              sampling seed (0)\n"
            "  --kv-block-size B     tokens per KV page, a multiple of 16 (64)\n"
            "  --kv-layout B,P,O     KV page layout, e.g. 64,1,nhd or 16,2,hnd\n"
            "  --max-context N       prompt + generated tokens allowed (4096)\n"
            "  --max-batch N         requests run together (16)\n"
            "  --prefill-chunk N     prefill tokens per step, a multiple of 64 (256)\n"
            "  --threads N           CPU threads (all cores)\n"
            "  --device D            cpu, cuda[:N] or cuda-fast[:N] (cpu)\n"
            "  --no-prefix-cache     compute every prompt token\n"
            "  --checkpoints N       device GDN checkpoint slots of the prefix cache (4 x batch)\n"
            "  --checkpoint-every N  also checkpoint every N 64-token blocks (16)\n"
            "  --host-cache-mb N     host tier of the prefix cache in MiB, 0 = off (512)\n"
            "  --kv-pages N          KV pages in the pool (enough for the batch, x2 with cache)\n"
            "  --stats-json FILE     write per-request cached tokens and cache counters\n"
            "  --logits-out FILE     write the logits of the last step of the first prompt\n"
            "                        as little-endian float32\n"
            "  --log-level L         error|warn|info|debug (warn)\n");
}

typedef struct {
    FILE *f;
    uint64_t want_id;
    float *last;
    uint32_t vocab;
} logits_sink_t;

static void keep_logits(void *arg, uint64_t id, uint32_t position, const float *logits,
                        uint32_t vocab)
{
    logits_sink_t *s = arg;
    if (id != s->want_id)
        return;
    if (s->last == NULL)
        s->last = malloc(vocab * sizeof(float));
    if (s->last != NULL) {
        memcpy(s->last, logits, vocab * sizeof(float));
        s->vocab = vocab;
    }
}


/* Per-request cached tokens, the prefix cache's counters and the engine's. */
static int write_stats(const char *path, const hpd_engine_t *engine, const uint64_t *ids,
                       size_t n)
{
    json_t *root = json_object(), *reqs = json_array();
    hpd_prefix_cache_stats_t cs;
    hpd_engine_stats_t es;
    int rc;

    for (size_t i = 0; i < n; i++) {
        hpd_request_info_t info;
        hpd_engine_request_info(engine, ids[i], &info);
        json_array_append_new(reqs, json_pack("{s:I, s:I, s:I}", "prompt_tokens",
                                              (json_int_t)info.prompt_tokens, "cached_tokens",
                                              (json_int_t)info.cached_tokens, "cached_host_tokens",
                                              (json_int_t)info.cached_host_tokens));
    }
    json_object_set_new(root, "requests", reqs);
    if (hpd_engine_cache_stats(engine, &cs) == HPD_OK) {
        json_t *c = json_object();
        const struct {
            const char *name;
            uint64_t v;
        } f[] = {
            {"lookups", cs.lookups},
            {"lookup_tokens", cs.lookup_tokens},
            {"hit_tokens_device", cs.hit_tokens_device},
            {"hit_tokens_host", cs.hit_tokens_host},
            {"inserted_blocks", cs.inserted_blocks},
            {"evicted_to_host", cs.evicted_to_host},
            {"evicted_dropped", cs.evicted_dropped},
            {"host_dropped", cs.host_dropped},
            {"promotions", cs.promotions},
            {"checkpoints_created", cs.checkpoints_created},
            {"checkpoint_bytes", cs.checkpoint_bytes},
            {"host_checkpoint_bytes", cs.host_checkpoint_bytes},
            {"host_bytes", cs.host_bytes},
            {"device_entries", cs.device_entries},
            {"host_entries", cs.host_entries},
            {"device_checkpoints", cs.device_checkpoints},
            {"pages_held", cs.pages_held},
        };
        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
            json_object_set_new(c, f[i].name, json_integer((json_int_t)f[i].v));
        json_object_set_new(root, "prefix_cache", c);
    } else {
        json_object_set_new(root, "prefix_cache", json_null());
    }
    hpd_engine_stats(engine, &es);
    json_object_set_new(root, "engine",
                        json_pack("{s:I, s:I, s:I, s:f, s:f}", "steps", (json_int_t)es.steps,
                                  "prefill_tokens", (json_int_t)es.prefill_tokens,
                                  "decode_tokens", (json_int_t)es.decode_tokens,
                                  "prefill_seconds", es.prefill_seconds, "decode_seconds",
                                  es.decode_seconds));
    rc = json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
    if (rc != 0)
        fprintf(stderr, "hpd-run: cannot write %s\n", path);
    return rc;
}

static int parse_u32(const char *flag, const char *v, uint64_t min, uint64_t max, uint32_t *out)
{
    uint64_t x;
    if (hpd_parse_u64(v, min, max, &x) != 0) {
        fprintf(stderr, "hpd-run: %s '%s' must be an integer from %llu to %llu\n", flag, v,
                (unsigned long long)min, (unsigned long long)max);
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", 1, 0, 'm'}, {"prompt-ids", 1, 0, 'p'}, {"prompts-file", 1, 0, 'f'},
        {"max-tokens", 1, 0, 'n'}, {"temperature", 1, 0, 't'}, {"top-p", 1, 0, 'P'},
        {"top-k", 1, 0, 'k'}, {"seed", 1, 0, 's'}, {"kv-block-size", 1, 0, 'b'},
        {"kv-layout", 1, 0, 'L'}, {"max-context", 1, 0, 'c'}, {"max-batch", 1, 0, 'B'},
        {"prefill-chunk", 1, 0, 'C'}, {"threads", 1, 0, 'T'}, {"device", 1, 0, 'd'},
        {"logits-out", 1, 0, 'o'}, {"log-level", 1, 0, 'l'}, {"help", 0, 0, 'h'},
        {"no-prefix-cache", 0, 0, 1}, {"checkpoints", 1, 0, 2}, {"checkpoint-every", 1, 0, 3},
        {"host-cache-mb", 1, 0, 4}, {"kv-pages", 1, 0, 5}, {"stats-json", 1, 0, 6},
        {0, 0, 0, 0}};
    const char *model_dir = NULL, *prompt_ids = NULL, *prompts_file = NULL, *logits_out = NULL;
    const char *stats_json = NULL;
    uint32_t host_mb = 512;
    hpd_engine_params_t ep;
    hpd_backend_params_t bp = {"cpu", 0};
    hpd_sampling_t samp = {0.0f, 1.0f, 0, 0};
    uint32_t max_tokens = 16, block_size = 0;
    const char *layout_text = NULL;
    prompt_t *prompts = NULL;
    size_t n_prompts = 0;
    hpd_model_t *model = NULL;
    hpd_backend_t *backend = NULL;
    hpd_engine_t *engine = NULL;
    uint64_t *ids = NULL;
    logits_sink_t sink = {0};
    int rc = 2, c, lvl;
    char err[160];

    hpd_engine_params_init(&ep);
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt_ids = optarg; break;
        case 'f': prompts_file = optarg; break;
        case 'n':
            if (parse_u32("--max-tokens", optarg, 1, 1u << 20, &max_tokens))
                return 2;
            break;
        case 't':
            if (hpd_parse_float(optarg, &samp.temperature) != 0 || samp.temperature < 0) {
                fprintf(stderr, "hpd-run: --temperature '%s' must be a number >= 0\n", optarg);
                return 2;
            }
            break;
        case 'P':
            if (hpd_parse_float(optarg, &samp.top_p) != 0 || samp.top_p <= 0 ||
                samp.top_p > 1) {
                fprintf(stderr, "hpd-run: --top-p '%s' must be in (0, 1]\n", optarg);
                return 2;
            }
            break;
        case 'k':
            if (parse_u32("--top-k", optarg, 0, UINT32_MAX, &samp.top_k))
                return 2;
            break;
        case 's':
            if (hpd_parse_u64(optarg, 0, UINT64_MAX, &samp.seed) != 0) {
                fprintf(stderr, "hpd-run: --seed '%s' must be a non-negative integer\n", optarg);
                return 2;
            }
            break;
        case 'b':
            if (parse_u32("--kv-block-size", optarg, 16, 4096, &block_size))
                return 2;
            break;
        case 'L': layout_text = optarg; break;
        case 'c':
            if (parse_u32("--max-context", optarg, 1, 1u << 24, &ep.max_context))
                return 2;
            break;
        case 'B':
            if (parse_u32("--max-batch", optarg, 1, 4096, &ep.max_batch))
                return 2;
            break;
        case 'C':
            if (parse_u32("--prefill-chunk", optarg, 64, 1u << 16, &ep.prefill_chunk))
                return 2;
            break;
        case 'T':
            if (parse_u32("--threads", optarg, 1, 1024, &bp.n_threads))
                return 2;
            break;
        case 'd': bp.device = optarg; break;
        case 'o': logits_out = optarg; break;
        case 'l':
            if ((lvl = hpd_log_level_parse(optarg)) < 0) {
                fprintf(stderr, "hpd-run: --log-level '%s' (expected error|warn|info|debug)\n",
                        optarg);
                return 2;
            }
            hpd_log_set_level((hpd_log_level_t)lvl);
            break;
        case 1: ep.prefix_cache = false; break;
        case 2:
            if (parse_u32("--checkpoints", optarg, 1, 1u << 20, &ep.n_checkpoints))
                return 2;
            break;
        case 3:
            if (parse_u32("--checkpoint-every", optarg, 0, 1u << 20, &ep.checkpoint_every))
                return 2;
            break;
        case 4:
            if (parse_u32("--host-cache-mb", optarg, 0, 1u << 24, &host_mb))
                return 2;
            break;
        case 5:
            if (parse_u32("--kv-pages", optarg, 1, 1u << 30, &ep.n_pages))
                return 2;
            break;
        case 6: stats_json = optarg; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "hpd-run: see --help for the flags\n");
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "hpd-run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (model_dir == NULL || (prompt_ids == NULL) == (prompts_file == NULL)) {
        fprintf(stderr, "hpd-run: --model and one of --prompt-ids or --prompts-file are needed\n");
        usage(stderr);
        return 2;
    }
    if (layout_text != NULL && hpd_kv_layout_parse(layout_text, &ep.kv_layout) != HPD_OK)
        return 2;
    if (block_size != 0)
        ep.kv_layout.block_size = block_size;
    if (ep.prefill_chunk % 64 != 0) {
        fprintf(stderr, "hpd-run: --prefill-chunk %u must be a multiple of 64\n",
                ep.prefill_chunk);
        return 2;
    }
    if (prompt_ids != NULL) {
        prompts = calloc(1, sizeof(*prompts));
        if (prompts == NULL)
            return 1;
        if (hpd_parse_id_list(prompt_ids, &prompts[0].ids, &prompts[0].n, err, sizeof(err)) !=
            HPD_OK) {
            fprintf(stderr, "hpd-run: --prompt-ids: %s\n", err);
            free(prompts);
            return 2;
        }
        n_prompts = 1;
    } else if (hpd_read_prompts("hpd-run", prompts_file, &prompts, &n_prompts) != HPD_OK) {
        return 2;
    }

    rc = 1;
    if (hpd_model_load(model_dir, &model) != HPD_OK)
        goto out;
    ep.kv_layout.n_layers = model->config.n_full_layers;
    ep.kv_layout.n_kv_heads = model->config.n_kv_heads;
    ep.kv_layout.head_dim = model->config.head_dim;
    if (model->config.n_full_layers > 0 && hpd_kv_layout_validate(&ep.kv_layout) != HPD_OK) {
        rc = 2;
        goto out;
    }
    if (hpd_backend_create(&bp, &backend) != HPD_OK)
        goto out;
    ep.model = model;
    ep.backend = backend;
    ep.host_cache_bytes = (uint64_t)host_mb << 20;
    if (logits_out != NULL) {
        ep.logits_cb = keep_logits;
        ep.logits_cb_arg = &sink;
    }
    if (hpd_engine_create(&ep, &engine) != HPD_OK)
        goto out;
    ids = calloc(n_prompts, sizeof(*ids));
    if (ids == NULL)
        goto out;
    for (size_t i = 0; i < n_prompts; i++) {
        hpd_request_params_t rp = {prompts[i].ids, (uint32_t)prompts[i].n, max_tokens, samp,
                                   NULL, 0};
        if (hpd_engine_submit(engine, &rp, &ids[i]) != HPD_OK) {
            if (n_prompts > 1)
                fprintf(stderr, "hpd-run: prompt %zu was refused\n", i + 1);
            rc = 2;
            goto out;
        }
    }
    sink.want_id = ids[0];
    if (hpd_engine_run(engine) != HPD_OK)
        goto out;
    for (size_t i = 0; i < n_prompts; i++) {
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t state;

        hpd_engine_result(engine, ids[i], &toks, &n, &state);
        if (state != HPD_REQ_FINISHED) {
            fprintf(stderr, "hpd-run: prompt %zu failed\n", i + 1);
            goto out;
        }
        for (uint32_t t = 0; t < n; t++)
            printf(t ? " %d" : "%d", toks[t]);
        printf("\n");
    }
    fflush(stdout);
    if (logits_out != NULL) {
        if (sink.last == NULL ||
            hpd_write_file(logits_out, sink.last, sink.vocab * sizeof(float)) != HPD_OK)
            goto out;
    }
    if (stats_json != NULL && write_stats(stats_json, engine, ids, n_prompts) != 0)
        goto out;
    rc = 0;
out:
    hpd_engine_destroy(engine);
    hpd_backend_destroy(backend);
    hpd_model_destroy(model);
    for (size_t i = 0; i < n_prompts; i++)
        free(prompts[i].ids);
    free(prompts);
    free(ids);
    free(sink.last);
    return rc;
}
