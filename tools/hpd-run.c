/* hpd-run: generates tokens from a model in one process.
 *
 * Prints the generated ids of each prompt as one line of space-separated
 * integers on stdout; diagnostics go to stderr. Exit status: 0 success,
 * 2 bad input (flags, prompt, ids), 1 any other failure. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/options.h"
#include "common/util.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "tokenizer/tokenizer.h"
#include "model/model.h"

typedef hpd_prompt_t prompt_t;

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
        json_array_append_new(
            reqs, json_pack("{s:I, s:I, s:I, s:s}", "prompt_tokens", (json_int_t)info.prompt_tokens,
                            "cached_tokens", (json_int_t)info.cached_tokens, "cached_host_tokens",
                            (json_int_t)info.cached_host_tokens, "finish_reason",
                            hpd_finish_reason_name(info.finish_reason)));
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

/* The grammar of --json-schema FILE, or of any object (path NULL). */
static hpd_status_t load_grammar(const char *path, bool flexible, hpd_grammar_t **g_p)
{
    hpd_grammar_format_t fmt = hpd_grammar_format_default();
    fmt.whitespace_flexible = flexible;
    if (path == NULL)
        return hpd_grammar_json_object(&fmt, g_p);
    char *text;
    size_t len;
    char err[512];
    hpd_status_t st = hpd_read_file(path, &text, &len);
    if (st != HPD_OK) {
        fprintf(stderr, "hpd-run: --json-schema: cannot read %s\n", path);
        return st;
    }
    st = hpd_grammar_from_schema(text, len, &fmt, g_p, err, sizeof(err));
    if (st != HPD_OK)
        fprintf(stderr, "hpd-run: --json-schema %s: %s\n", path, err);
    free(text);
    return st;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_ids = NULL, *prompts_file = NULL, *logits_out = NULL;
    const char *prompt_text = NULL;
    bool as_text = false;
    hpd_tokenizer_t *tok = NULL;
    const char *stats_json = NULL;
    hpd_engine_params_t ep;
    hpd_backend_params_t bp = {.device = "cpu"};
    hpd_sampling_t samp = hpd_sampling_unset();
    bool gen_defaults = true;
    uint32_t max_tokens = 16, block_size = 0, min_tokens = 0, n_stop = 0;
    const char *stop_text = NULL;
    int32_t *stop_ids = NULL;
    bool ignore_eos = false;
    prompt_t *prompts = NULL;
    size_t n_prompts = 0;
    hpd_model_t *model = NULL, *models[HPD_TP_MAX] = {0};
    hpd_backend_t *backend = NULL, *backends[HPD_TP_MAX] = {0};
    uint32_t tp = 1;
    uint32_t logprobs = UINT32_MAX; /* not given */
    bool prompt_logprobs = false;
    bool tp_fast = false;
    const char *json_schema = NULL;
    bool json_object = false, json_flexible = false;
    uint32_t n_choices = 1;
    hpd_grammar_t *grammar = NULL;
    hpd_vocab_t *vocab = NULL;
    hpd_engine_t *engine = NULL;
    uint64_t *ids = NULL;
    logits_sink_t sink = {0};
    int rc = 2;
    hpd_log_level_t level;
    char err[160];

    hpd_engine_params_init(&ep);
    const hpd_opt_bind_t binds[] = {
        HPD_OPT_BIND("model", &model_dir),
        HPD_OPT_BIND("prompt-ids", &prompt_ids),
        HPD_OPT_BIND("prompts-file", &prompts_file),
        HPD_OPT_BIND("prompt", &prompt_text),
        HPD_OPT_BIND("text", &as_text),
        HPD_OPT_BIND("max-tokens", &max_tokens),
        HPD_OPT_BIND("temperature", &samp.temperature),
        HPD_OPT_BIND("top-p", &samp.top_p),
        HPD_OPT_BIND("top-k", &samp.top_k),
        HPD_OPT_BIND("seed", &samp.seed),
        HPD_OPT_BIND("no-generation-defaults", &gen_defaults),
        HPD_OPT_BIND("kv-block-size", &block_size),
        HPD_OPT_BIND("kv-layout", &ep.kv_layout),
        HPD_OPT_BIND("max-context", &ep.max_context),
        HPD_OPT_BIND("max-batch", &ep.max_batch),
        HPD_OPT_BIND("prefill-chunk", &ep.prefill_chunk),
        HPD_OPT_BIND("threads", &bp.n_threads),
        HPD_OPT_BIND("tp", &tp),
        HPD_OPT_BIND("tp-fast", &tp_fast),
        HPD_OPT_BIND("device", &bp.device),
        HPD_OPT_BIND("no-prefix-cache", &ep.prefix_cache),
        HPD_OPT_BIND("checkpoints", &ep.n_checkpoints),
        HPD_OPT_BIND("checkpoint-every", &ep.checkpoint_every),
        HPD_OPT_BIND("host-cache-mb", &ep.host_cache_bytes),
        HPD_OPT_BIND("kv-pages", &ep.n_pages),
        HPD_OPT_BIND("stats-json", &stats_json),
        HPD_OPT_BIND("stop-ids", &stop_text),
        HPD_OPT_BIND("ignore-eos", &ignore_eos),
        HPD_OPT_BIND("min-tokens", &min_tokens),
        HPD_OPT_BIND("logits-out", &logits_out),
        HPD_OPT_BIND("logprobs", &logprobs),
        HPD_OPT_BIND("prompt-logprobs", &prompt_logprobs),
        HPD_OPT_BIND("json-schema", &json_schema),
        HPD_OPT_BIND("json-object", &json_object),
        HPD_OPT_BIND("json-flexible", &json_flexible),
        HPD_OPT_BIND("n", &n_choices),
        {.name = "log-level", .dst = &level, .def = "warn"},
    };
    const int prc = hpd_opt_parse(argc, argv, "hpd-run", HPD_OPT_ROLE_RUN,
                                  "usage: hpd-run --model DIR (--prompt-ids 1,2,3 | "
                                  "--prompts-file F) [options]",
                                  binds, HPD_ARRAY_SIZE(binds));
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    hpd_log_set_level(level);
    if (model_dir == NULL ||
        (prompt_ids != NULL) + (prompts_file != NULL) + (prompt_text != NULL) != 1) {
        fprintf(stderr, "hpd-run: --model and one of --prompt-ids, --prompts-file or --prompt "
                "are needed (see --help)\n");
        return 2;
    }
    if (block_size != 0)
        ep.kv_layout.block_size = block_size;
    if (stop_text != NULL) {
        size_t n;
        if (hpd_parse_id_list(stop_text, &stop_ids, &n, err, sizeof(err)) != HPD_OK) {
            fprintf(stderr, "hpd-run: --stop-ids: %s\n", err);
            return 2;
        }
        n_stop = (uint32_t)n;
    }
    const bool structured = json_schema != NULL || json_object;
    if ((prompt_text != NULL || as_text || structured) &&
        hpd_tokenizer_load(model_dir, &tok) != HPD_OK) {
        fprintf(stderr, "hpd-run: --prompt, --text, --json-schema and --json-object need the "
                "model's tokenizer.json\n");
        return 1;
    }
    if (structured && load_grammar(json_schema, json_flexible, &grammar) != HPD_OK) {
        hpd_tokenizer_destroy(tok);
        return 2;
    }
    if (structured && hpd_vocab_from_tokenizer(tok, &vocab) != HPD_OK) {
        hpd_grammar_destroy(grammar);
        hpd_tokenizer_destroy(tok);
        return 1;
    }
    if (prompt_text != NULL) {
        size_t n;
        if ((prompts = calloc(1, sizeof(*prompts))) == NULL ||
            hpd_tokenizer_encode(tok, prompt_text, strlen(prompt_text), &prompts[0].ids, &n) !=
                HPD_OK) {
            free(prompts);
            hpd_tokenizer_destroy(tok);
            return 1;
        }
        prompts[0].n = n;
        n_prompts = 1;
        if (n == 0) {
            fprintf(stderr, "hpd-run: --prompt is empty\n");
            free(prompts[0].ids);
            free(prompts);
            hpd_tokenizer_destroy(tok);
            return 2;
        }
    } else if (prompt_ids != NULL) {
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
    const hpd_status_t lst = hpd_model_load_tp(model_dir, tp, tp_fast, models);
    if (lst != HPD_OK) {
        rc = lst == HPD_ERR_INVALID_ARG ? 2 : 1; /* a degree the model cannot run at */
        goto out;
    }
    model = models[0];
    hpd_sampling_resolve(&samp, gen_defaults ? &model->config.gen_sampling : NULL);
    ep.kv_layout.n_layers = model->config.n_full_layers;
    ep.kv_layout.n_kv_heads = model->config.n_kv_heads;
    ep.kv_layout.head_dim = model->config.head_dim;
    if (model->config.n_full_layers > 0 && hpd_kv_layout_validate(&ep.kv_layout) != HPD_OK) {
        rc = 2;
        goto out;
    }
    if (hpd_backend_create_ranks(&bp, tp, backends) != HPD_OK) /* a share of the threads each */
        goto out;
    backend = backends[0];
    ep.model = model;
    ep.backend = backend;
    ep.tp_models = (const hpd_model_t *const *)models;
    ep.tp_backends = backends;
    ep.vocab = vocab;
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
        hpd_request_params_t rp = {.prompt = prompts[i].ids,
                                   .n_prompt = (uint32_t)prompts[i].n,
                                   .max_tokens = max_tokens,
                                   .sampling = samp,
                                   .stop_ids = stop_ids,
                                   .n_stop = n_stop,
                                   .ignore_eos = ignore_eos,
                                   .min_tokens = min_tokens,
                                   .logprobs = logprobs != UINT32_MAX,
                                   .top_logprobs = logprobs != UINT32_MAX ? logprobs : 0,
                                   .prompt_logprobs = prompt_logprobs,
                                   .grammar = grammar,
                                   .n = n_choices};
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
        const uint64_t *choices;
        uint32_t n_ch = 1;
        hpd_engine_choices(engine, ids[i], &choices, &n_ch);
        for (uint32_t ch = 0; ch < n_ch; ch++) { /* each choice a line (--n) */
        const uint64_t cid = choices[ch];
        const int32_t *toks;
        uint32_t n;
        hpd_request_state_t state;

        hpd_engine_result(engine, cid, &toks, &n, &state);
        if (state != HPD_REQ_FINISHED) {
            fprintf(stderr, "hpd-run: prompt %zu failed\n", i + 1);
            goto out;
        }
        if (as_text) {
            char *text;
            size_t tl;
            if (hpd_tokenizer_decode(tok, toks, n, true, &text, &tl) != HPD_OK)
                goto out;
            fwrite(text, 1, tl, stdout);
            free(text);
        } else {
            for (uint32_t t = 0; t < n; t++)
                printf(t ? " %d" : "%d", toks[t]);
        }
        printf("\n");
        const hpd_token_logprobs_t *lp;
        uint32_t n_lp;
        if (prompt_logprobs && ch == 0 &&
            hpd_engine_prompt_logprobs(engine, ids[i], &lp, &n_lp) == HPD_OK)
            hpd_logprobs_print(stdout, lp, n_lp);
        if (logprobs != UINT32_MAX && hpd_engine_logprobs(engine, cid, &lp, &n_lp) == HPD_OK)
            hpd_logprobs_print(stdout, lp, n_lp);
        }
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
    for (uint32_t r = 0; r < tp; r++) {
        hpd_backend_destroy(backends[r]);
        hpd_model_destroy(models[r]);
    }
    hpd_grammar_destroy(grammar);
    hpd_vocab_destroy(vocab);
    hpd_tokenizer_destroy(tok);
    for (size_t i = 0; i < n_prompts; i++)
        free(prompts[i].ids);
    free(prompts);
    free(ids);
    free(sink.last);
    free(stop_ids);
    return rc;
}
