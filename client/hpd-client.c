/* hpd-client: talks to a hpd coordinator.
 *
 *   hpd-client generate (--prompt-ids 1,2,3 | --prompts-file F) [options]
 *       prints the generated ids of each prompt as one line of space-separated
 *       integers, in prompt order (the format of hpd-run); with --stream the
 *       line of the oldest unfinished prompt grows as its tokens arrive
 *   hpd-client generate --prompt TEXT [--text] [--stop S]... [options]
 *       one prompt as text, tokenized by the coordinator; prints the ids, or
 *       with --text the answer as text (streamed with --stream)
 *   hpd-client chat --prompt TEXT [--system TEXT] [--thinking on|off] [options]
 *       one user message in the model's chat format; prints the answer
 *   hpd-client status [--json]
 *       the nodes, their load, pools and cache hit rates
 *
 * Exit status: 0 success, 2 bad input (flags, prompts, a request the
 * cluster refused as malformed), 1 any other failure. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client.h"
#include "common/log.h"
#include "common/util.h"
#include "node/proto.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hpd-client [--coordinator HOST:PORT] [--token-file F] COMMAND [options]\n"
            "commands:\n"
            "  generate (--prompt-ids 1,2,3 | --prompts-file F | --prompt TEXT)\n"
            "    --text                print the answer as text (the coordinator decodes it)\n"
            "    --stop S              stop before the text S (repeatable; implies --text)\n"
            "    --max-tokens N        tokens to generate per prompt (16)\n"
            "    --temperature T       0 is greedy\n"
            "    --top-p P             nucleus sampling mass in (0, 1]\n"
            "    --top-k K             keep the K most likely tokens, 0 = all\n"
            "                          (the three not given: the model's generation_config.json\n"
            "                          values, or greedy where it has none)\n"
            "    --seed S              sampling seed (0)\n"
            "    --stop-ids 1,2        stop after any of these token ids (and the model's\n"
            "                          end-of-sequence ids)\n"
            "    --ignore-eos          do not stop at the model's end-of-sequence ids\n"
            "    --min-tokens N        tokens before a stop token counts (0)\n"
            "    --logprobs N          after each prompt's ids, a line of their log\n"
            "                          probabilities and the N (0 to 20) most likely\n"
            "                          tokens' (as hpd-run --logprobs N)\n"
            "    --prompt-logprobs     before it, a line of the prompt's (as hpd-run's)\n"
            "    --json-schema FILE    structured output: every token the JSON Schema in\n"
            "                          FILE allows (docs/structured_outputs.md)\n"
            "    --json-object         structured output: any JSON object\n"
            "    --json-flexible       with those: any JSON whitespace inside the document\n"
            "    --n N                 N answers from one prefill (1 to 16; answer c: the\n"
            "                          seed + c), a line each, as hpd-run --n N prints them\n"
            "    --stream              print tokens as they arrive\n"
            "    --concurrency N       requests in flight at once (64)\n"
            "    --stats-json FILE     per-request TTFT, total time, cached tokens and\n"
            "                          finish reason\n"
            "  chat --prompt TEXT      a user message in the model's chat format; prints the\n"
            "                          answer (the generate options apply)\n"
            "    --system TEXT         a system message first\n"
            "    --thinking on|off     the model's thinking switch (its default)\n"
            "    --tools FILE          the tools the model may call (OpenAI's tools array);\n"
            "                          its calls print as a line 'tool_calls: [...]'\n"
            "    --tool-choice C       auto (with tools), none, required, or a function's\n"
            "                          name (a call of it); required and a name are enforced\n"
            "  status [--json]         nodes, load, pools, cache hits, request counts\n"
            "common options:\n"
            "  --coordinator HOST:PORT (127.0.0.1:7000), or a leader and its standbys,\n"
            "                          HOST:PORT,HOST:PORT,...: requests whose coordinator is\n"
            "                          lost are submitted again to the next that leads\n"
            "  --token-file F          a client key: the first word of F's first line\n"
            "                          (the coordinator's client keys file works as it is)\n"
            "  --timeout-ms N          per request (600000)\n"
            "  --log-level L           error|warn|info|debug (warn)\n");
}

typedef struct {
    hpd_prompt_t *prompts;
    size_t n;
    hpd_generate_result_t *results;
    bool *done;
    uint64_t *handles;
    size_t next_submit, n_done, printed; /* prompts whose line is complete on stdout */
    uint32_t streamed_on_line;           /* tokens printed on the current line */
    bool stream;
    size_t text_streamed; /* cmd_text: bytes of the answer printed as they came */
    int32_t **partial; /* streamed tokens per prompt */
    uint32_t *n_partial;
} gen_t;

static gen_t G;

static void print_ids(const int32_t *ids, uint32_t n, bool lead_space)
{
    for (uint32_t i = 0; i < n; i++)
        printf(i == 0 && !lead_space ? "%d" : " %d", ids[i]);
}

/* Prints what can be printed in order: finished lines, then the streamed
 * part of the oldest unfinished prompt. */
static void flush_output(void)
{
    while (G.printed < G.n) {
        const size_t i = G.printed;
        const int32_t *ids = G.done[i] ? G.results[i].tokens : G.partial[i];
        const uint32_t n = G.done[i] ? G.results[i].n_tokens : G.n_partial[i];
        if (n > G.streamed_on_line && (G.stream || G.done[i])) {
            print_ids(ids + G.streamed_on_line, n - G.streamed_on_line, G.streamed_on_line > 0);
            G.streamed_on_line = n;
        }
        if (!G.done[i])
            break;
        printf("\n");
        if (G.results[i].prompt_logprobs != NULL) /* the prompt's, then the answer's */
            hpd_logprobs_print(stdout, G.results[i].prompt_logprobs,
                               G.results[i].prompt_tokens - 1);
        if (G.results[i].logprobs != NULL) /* a line of them after the ids' */
            hpd_logprobs_print(stdout, G.results[i].logprobs, G.results[i].n_tokens);
        for (uint32_t k = 0; k < G.results[i].n_more; k++) { /* --n: each answer a line */
            const hpd_generate_choice_t *ch = &G.results[i].more[k];
            print_ids(ch->tokens, ch->n_tokens, false);
            printf("\n");
            if (ch->logprobs != NULL)
                hpd_logprobs_print(stdout, ch->logprobs, ch->n_tokens);
        }
        G.printed++;
        G.streamed_on_line = 0;
    }
    fflush(stdout);
}

static size_t index_of(uint64_t handle)
{
    for (size_t i = 0; i < G.next_submit; i++)
        if (G.handles[i] == handle)
            return i;
    return G.n;
}

static void on_token(void *arg, uint64_t handle, uint32_t index, const int32_t *ids, uint32_t n)
{
    const size_t i = index_of(handle);
    if (i == G.n || index != G.n_partial[i])
        return;
    int32_t *p = realloc(G.partial[i], (index + n) * sizeof(int32_t));
    if (p == NULL)
        return;
    memcpy(p + index, ids, n * sizeof(int32_t));
    G.partial[i] = p;
    G.n_partial[i] = index + n;
    flush_output();
}

static void on_done(void *arg, uint64_t handle, hpd_generate_result_t *r)
{
    const size_t i = index_of(handle);
    if (i == G.n)
        return;
    G.results[i] = *r; /* ours now */
    r->tokens = NULL;
    r->text = r->reasoning = r->tool_calls = NULL;
    r->logprobs = NULL;
    r->prompt_logprobs = NULL;
    r->more = NULL;
    G.done[i] = true;
    G.n_done++;
    if (G.results[i].status != HPD_OK)
        fprintf(stderr, "hpd-client: prompt %zu: %s\n", i + 1, G.results[i].error);
    flush_output();
}

static int write_stats(const char *path)
{
    json_t *root = json_object(), *reqs = json_array();
    for (size_t i = 0; i < G.n; i++) {
        const hpd_generate_result_t *r = &G.results[i];
        const double ttft = r->client_ttft_ms > 0 ? r->client_ttft_ms : r->ttft_ms;
        /* mean time per output token after the first */
        const double tpot = r->n_tokens > 1 ? (r->client_total_ms - ttft) / (r->n_tokens - 1)
                                            : 0;
        json_array_append_new(
            reqs, json_pack("{s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:s}", "prompt_tokens",
                            (json_int_t)G.prompts[i].n, "generated", (json_int_t)r->n_tokens,
                            "cached_tokens", (json_int_t)r->cached_tokens, "ttft_ms", ttft,
                            "tpot_ms", tpot, "total_ms", r->client_total_ms, "server_ttft_ms",
                            r->ttft_ms, "attempts", (json_int_t)r->attempts, "finish_reason",
                            r->finish_reason));
    }
    json_object_set_new(root, "requests", reqs);
    const int rc = json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
    if (rc != 0)
        fprintf(stderr, "hpd-client: cannot write %s\n", path);
    return rc;
}

static void on_text(void *arg, uint64_t handle, const char *piece, size_t len)
{
    G.text_streamed += len;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
}

/* One request given as text or as a chat: the answer as text (or ids). */
static int cmd_text(hpd_client_t *c, hpd_generate_params_t *p, bool print_text)
{
    hpd_generate_result_t r;
    p->detokenize = print_text;
    p->on_text = print_text && G.stream ? on_text : NULL;
    const hpd_status_t st = hpd_client_generate(c, p, NULL, NULL, &r);
    if (st != HPD_OK) {
        fprintf(stderr, "hpd-client: %s\n", r.error);
        hpd_generate_result_free(&r);
        return st == HPD_ERR_INVALID_ARG ? 2 : 1;
    }
    if (print_text && r.text == NULL) {
        fprintf(stderr, "hpd-client: the answer's text is missing (out of memory)\n");
        hpd_generate_result_free(&r);
        return 1;
    }
    if (print_text && r.reasoning != NULL) /* a thinking model's: on stderr */
        fprintf(stderr, "[reasoning] %s\n", r.reasoning);
    if (r.tool_calls != NULL) /* a chat with tools: its calls, a line before the content */
        printf("tool_calls: %s\n", r.tool_calls);
    if (print_text && G.stream) { /* the streamed pieces may stop short of the whole */
        if (r.text_len > G.text_streamed)
            fwrite(r.text + G.text_streamed, 1, r.text_len - G.text_streamed, stdout);
    } else if (print_text) {
        fwrite(r.text, 1, r.text_len, stdout);
    } else {
        for (uint32_t i = 0; i < r.n_tokens; i++)
            printf(i ? " %d" : "%d", r.tokens[i]);
    }
    printf("\n");
    for (uint32_t k = 0; k < r.n_more; k++) { /* --n: the other answers, each its own */
        const hpd_generate_choice_t *ch = &r.more[k];
        if (print_text && ch->reasoning != NULL)
            fprintf(stderr, "[reasoning %u] %s\n", k + 1, ch->reasoning);
        if (ch->tool_calls != NULL)
            printf("tool_calls: %s\n", ch->tool_calls);
        if (print_text && ch->text != NULL)
            fwrite(ch->text, 1, ch->text_len, stdout);
        for (uint32_t i = 0; !print_text && i < ch->n_tokens; i++)
            printf(i ? " %d" : "%d", ch->tokens[i]);
        printf("\n");
    }
    hpd_generate_result_free(&r);
    return 0;
}

static int cmd_generate(hpd_client_t *c, const hpd_generate_params_t *base, uint32_t concurrency,
                        const char *stats_json)
{
    int rc = 0;
    G.results = calloc(G.n, sizeof(*G.results));
    G.done = calloc(G.n, sizeof(bool));
    G.handles = calloc(G.n, sizeof(uint64_t));
    G.partial = calloc(G.n, sizeof(int32_t *));
    G.n_partial = calloc(G.n, sizeof(uint32_t));
    if (!G.results || !G.done || !G.handles || !G.partial || !G.n_partial)
        return 1;
    while (G.n_done < G.n) {
        while (G.next_submit < G.n && G.next_submit - G.n_done < concurrency) {
            hpd_generate_params_t p = *base;
            const size_t i = G.next_submit;
            p.prompt = G.prompts[i].ids;
            p.n_prompt = (uint32_t)G.prompts[i].n;
            if (hpd_client_submit(c, &p, G.stream ? on_token : NULL, on_done, NULL,
                                  &G.handles[i]) != HPD_OK) {
                fprintf(stderr, "hpd-client: lost the connection to the coordinator\n");
                return 1;
            }
            G.next_submit++;
        }
        hpd_client_poll(c, 1000);
    }
    for (size_t i = 0; i < G.n; i++) {
        if (G.results[i].status == HPD_ERR_INVALID_ARG)
            rc = rc ? rc : 2;
        else if (G.results[i].status != HPD_OK)
            rc = 1;
    }
    if (stats_json != NULL && write_stats(stats_json) != 0 && rc == 0)
        rc = 1;
    for (size_t i = 0; i < G.n; i++) {
        hpd_generate_result_free(&G.results[i]);
        free(G.partial[i]);
    }
    free(G.results);
    free(G.done);
    free(G.handles);
    free(G.partial);
    free(G.n_partial);
    return rc;
}

/* msgpack -> jansson, for --json and for reading fields. */
static json_t *to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return json_null();
    case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR: return json_stringn(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++)
            json_array_append_new(a, to_json(&o->via.array.ptr[i]));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            char key[128];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                continue;
            snprintf(key, sizeof(key), "%.*s", (int)kv->key.via.str.size, kv->key.via.str.ptr);
            json_object_set_new(m, key, to_json(&kv->val));
        }
        return m;
    }
    default: return json_null();
    }
}

static json_int_t jint(json_t *o, const char *path)
{
    char buf[128], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k != NULL && o != NULL; k = strtok_r(NULL, ".", &save))
        o = json_object_get(o, k);
    return o != NULL && json_is_integer(o) ? json_integer_value(o) : 0;
}

static int cmd_status(hpd_client_t *c, bool as_json)
{
    hpd_rpc_result_t r;
    if (hpd_client_status(c, &r) != HPD_OK || r.is_error) {
        fprintf(stderr, "hpd-client: status failed: %s\n",
                r.is_error ? r.error_message : hpd_status_str(r.status));
        hpd_rpc_result_destroy(&r);
        return 1;
    }
    json_t *s = to_json(&r.result);
    hpd_rpc_result_destroy(&r);
    if (as_json) {
        char *text = json_dumps(s, JSON_INDENT(2));
        printf("%s\n", text);
        free(text);
        json_decref(s);
        return 0;
    }
    json_t *nodes = json_object_get(s, "nodes"), *n;
    size_t i;
    printf("%-4s %-8s %-16s %-22s %-10s %5s %13s %11s %9s %8s\n", "id", "role", "name",
           "address", "layout", "load", "pages", "slots", "cache", "hit");
    json_array_foreach(nodes, i, n) {
        json_t *lay = json_object_get(n, "layout"), *st = json_object_get(n, "stats");
        char layout[32], pages[32], slots[32], cache[32], hit[16], load[16];
        snprintf(layout, sizeof(layout), "%lld,%lld,%s", (long long)jint(lay, "block_size"),
                 (long long)jint(lay, "pack_size"),
                 json_string_value(json_object_get(lay, "order")));
        snprintf(pages, sizeof(pages), "%lld/%lld", (long long)jint(st, "pages_used"),
                 (long long)jint(st, "pages_total"));
        snprintf(slots, sizeof(slots), "%lld/%lld", (long long)jint(st, "slots_used"),
                 (long long)jint(st, "slots_total"));
        snprintf(cache, sizeof(cache), "%lld", (long long)jint(st, "cache_pages"));
        const double look = (double)jint(st, "cache.lookup_tokens");
        const double hits = (double)(jint(st, "cache.hit_tokens_device") +
                                     jint(st, "cache.hit_tokens_host"));
        if (look > 0)
            snprintf(hit, sizeof(hit), "%.1f%%", 100.0 * hits / look);
        else
            snprintf(hit, sizeof(hit), "-");
        const bool pre = strcmp(json_string_value(json_object_get(n, "role")), "prefill") == 0;
        snprintf(load, sizeof(load), "%lld",
                 (long long)(pre ? jint(st, "load.jobs_queued") + jint(st, "load.jobs_running")
                                 : jint(st, "load.running")));
        printf("%-4lld %-8s %-16s %-22s %-10s %5s %13s %11s %9s %8s\n",
               (long long)jint(n, "id"), json_string_value(json_object_get(n, "role")),
               json_string_value(json_object_get(n, "name")),
               json_object_get(n, "address") != NULL
                   ? json_string_value(json_object_get(n, "address"))
                   : "-", /* shown to node credentials only */
               layout, load, pages, slots,
               cache, hit);
    }
    printf("requests: %lld active, %lld queued, %lld finished, %lld failed, %lld canceled, "
           "%lld retried, %lld hedged, %lld rejected\n",
           (long long)jint(s, "requests.active"), (long long)jint(s, "requests.queued"),
           (long long)jint(s, "requests.finished"), (long long)jint(s, "requests.failed"),
           (long long)jint(s, "requests.canceled"), (long long)jint(s, "requests.retried"),
           (long long)jint(s, "requests.hedged"), (long long)jint(s, "requests.rejected"));
    json_decref(s);
    return 0;
}

/* The grammar field of --json-schema FILE / --json-object (the
 * coordinator checks the schema). */
/* chat --tools FILE (OpenAI's tools array) and --tool-choice MODE|NAME
 * ("auto", "none", "required", or a function's name) as JSON texts. */
static hpd_status_t make_tools(bool chat, const char *file, const char *mode, char **tools_p,
                               char **choice_p)
{
    size_t len;
    if (!chat) {
        fprintf(stderr, "hpd-client: --tools and --tool-choice: only with chat\n");
        return HPD_ERR_INVALID_ARG;
    }
    if (file != NULL && hpd_read_file(file, tools_p, &len) != HPD_OK) {
        fprintf(stderr, "hpd-client: --tools: cannot read %s\n", file);
        return HPD_ERR_IO;
    }
    if (mode == NULL)
        return HPD_OK;
    if (strchr(mode, '"') != NULL || strchr(mode, '\\') != NULL) {
        fprintf(stderr, "hpd-client: --tool-choice '%s': expected auto, none, required or a "
                "function's name\n", mode);
        return HPD_ERR_INVALID_ARG;
    }
    const bool plain = strcmp(mode, "auto") == 0 || strcmp(mode, "none") == 0 ||
                       strcmp(mode, "required") == 0;
    const size_t cap = strlen(mode) + 64;
    if ((*choice_p = malloc(cap)) == NULL)
        return HPD_ERR_NO_MEMORY;
    if (plain)
        snprintf(*choice_p, cap, "\"%s\"", mode);
    else
        snprintf(*choice_p, cap, "{\"type\": \"function\", \"function\": {\"name\": \"%s\"}}",
                 mode);
    return HPD_OK;
}

static hpd_status_t make_grammar(const char *schema_file, bool object, bool flexible, char **spec_p)
{
    char *schema = NULL;
    size_t len = 0;
    if ((schema_file != NULL) == object) {
        fprintf(stderr, "hpd-client: one of --json-schema FILE and --json-object (and "
                "--json-flexible only with one)\n");
        return HPD_ERR_INVALID_ARG;
    }
    if (schema_file != NULL && hpd_read_file(schema_file, &schema, &len) != HPD_OK) {
        fprintf(stderr, "hpd-client: --json-schema: cannot read %s\n", schema_file);
        return HPD_ERR_IO;
    }
    const char *flex = flexible ? ", \"whitespace_flexible\": true" : "";
    const size_t cap = len + 64;
    char *spec = malloc(cap);
    if (spec == NULL) {
        free(schema);
        return HPD_ERR_NO_MEMORY;
    }
    if (schema != NULL)
        snprintf(spec, cap, "{\"json_schema\": %.*s%s}", (int)len, schema, flex);
    else
        snprintf(spec, cap, "{\"json_object\": true%s}", flex);
    free(schema);
    *spec_p = spec;
    return HPD_OK;
}

int main(int argc, char **argv)
{
    enum { O_COORD = 256, O_TOKEN, O_TIMEOUT, O_LOG, O_IDS, O_FILE, O_MAXTOK, O_TEMP, O_TOPP,
           O_TOPK, O_SEED, O_STREAM, O_CONC, O_STATS, O_JSON, O_STOP, O_NOEOS, O_MINTOK,
           O_HELP, O_PROMPT, O_TEXT, O_STOPSTR, O_SYSTEM, O_THINK, O_LOGPROBS, O_PLOGPROBS,
           O_SCHEMA, O_JOBJECT, O_JFLEX, O_N, O_TOOLS, O_TOOLCHOICE };
    static const struct option longopts[] = {
        {"coordinator", 1, 0, O_COORD}, {"token-file", 1, 0, O_TOKEN},
        {"timeout-ms", 1, 0, O_TIMEOUT}, {"log-level", 1, 0, O_LOG},
        {"prompt-ids", 1, 0, O_IDS}, {"prompts-file", 1, 0, O_FILE},
        {"max-tokens", 1, 0, O_MAXTOK}, {"temperature", 1, 0, O_TEMP},
        {"top-p", 1, 0, O_TOPP}, {"top-k", 1, 0, O_TOPK}, {"seed", 1, 0, O_SEED},
        {"stream", 0, 0, O_STREAM}, {"concurrency", 1, 0, O_CONC},
        {"stats-json", 1, 0, O_STATS}, {"json", 0, 0, O_JSON}, {"help", 0, 0, O_HELP},
        {"stop-ids", 1, 0, O_STOP}, {"ignore-eos", 0, 0, O_NOEOS},
        {"min-tokens", 1, 0, O_MINTOK}, {"prompt", 1, 0, O_PROMPT}, {"text", 0, 0, O_TEXT},
        {"stop", 1, 0, O_STOPSTR}, {"system", 1, 0, O_SYSTEM}, {"thinking", 1, 0, O_THINK},
        {"logprobs", 1, 0, O_LOGPROBS}, {"prompt-logprobs", 0, 0, O_PLOGPROBS},
        {"json-schema", 1, 0, O_SCHEMA}, {"json-object", 0, 0, O_JOBJECT},
        {"json-flexible", 0, 0, O_JFLEX}, {"n", 1, 0, O_N}, {"tools", 1, 0, O_TOOLS},
        {"tool-choice", 1, 0, O_TOOLCHOICE},
        {0, 0, 0, 0}};
    const char *schema_file = NULL, *tools_file = NULL, *tool_choice = NULL;
    bool json_object = false, json_flexible = false;
    const char *prompt = NULL, *system = NULL, *stops[16];
    bool print_text = false;
    hpd_client_params_t cp = {.host = "127.0.0.1", .port = 7000};
    hpd_generate_params_t gp = {.max_tokens = 16, .sampling = hpd_sampling_unset()};
    char err[160];
    const char *token_file = NULL, *ids = NULL, *file = NULL, *stats = NULL;
    uint32_t concurrency = 64;
    int32_t *stop_ids = NULL;
    bool as_json = false;
    uint64_t v;
    int c, lvl;

    hpd_log_set_level(HPD_LOG_LEVEL_WARN);
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case O_COORD: {
            hpd_endpoint_t e[8];
            uint32_t n;
            if (!hpd_proto_parse_endpoints(optarg, e, 8, &n, err, sizeof(err))) {
                fprintf(stderr, "hpd-client: --coordinator '%s' is invalid (%s)\n", optarg, err);
                return 2;
            }
            cp.coordinators = optarg;
            break;
        }
        case O_TOKEN: token_file = optarg; break;
        case O_TIMEOUT:
            if (hpd_parse_u64(optarg, 1, UINT32_MAX, &v) != 0)
                goto bad_number;
            cp.timeout_ms = (uint32_t)v;
            break;
        case O_LOG:
            if ((lvl = hpd_log_level_parse(optarg)) < 0) {
                fprintf(stderr, "hpd-client: --log-level '%s' is invalid\n", optarg);
                return 2;
            }
            hpd_log_set_level((hpd_log_level_t)lvl);
            break;
        case O_IDS: ids = optarg; break;
        case O_FILE: file = optarg; break;
        case O_MAXTOK:
            if (hpd_parse_u64(optarg, 1, 1u << 20, &v) != 0)
                goto bad_number;
            gp.max_tokens = (uint32_t)v;
            break;
        case O_TEMP:
            if (hpd_parse_float(optarg, &gp.sampling.temperature) != 0 ||
                gp.sampling.temperature < 0)
                goto bad_number;
            break;
        case O_TOPP:
            if (hpd_parse_float(optarg, &gp.sampling.top_p) != 0 || !(gp.sampling.top_p > 0) ||
                gp.sampling.top_p > 1)
                goto bad_number;
            break;
        case O_TOPK:
            if (hpd_parse_u64(optarg, 0, HPD_TOP_K_UNSET - 1, &v) != 0)
                goto bad_number;
            gp.sampling.top_k = (uint32_t)v;
            break;
        case O_SEED:
            if (hpd_parse_u64(optarg, 0, UINT64_MAX, &gp.sampling.seed) != 0)
                goto bad_number;
            break;
        case O_STREAM: G.stream = true; break;
        case O_CONC:
            if (hpd_parse_u64(optarg, 1, 1u << 16, &v) != 0)
                goto bad_number;
            concurrency = (uint32_t)v;
            break;
        case O_STATS: stats = optarg; break;
        case O_STOP: {
            size_t n;
            free(stop_ids);
            if (hpd_parse_id_list(optarg, &stop_ids, &n, err, sizeof(err)) != HPD_OK) {
                fprintf(stderr, "hpd-client: --stop-ids: %s\n", err);
                return 2;
            }
            gp.stop_ids = stop_ids;
            gp.n_stop = (uint32_t)n;
            break;
        }
        case O_NOEOS: gp.ignore_eos = true; break;
        case O_MINTOK:
            if (hpd_parse_u64(optarg, 0, 1u << 20, &v) != 0)
                goto bad_number;
            gp.min_tokens = (uint32_t)v;
            break;
        case O_JSON: as_json = true; break;
        case O_LOGPROBS: /* N top ones (0: the token's alone) */
            if (hpd_parse_u64(optarg, 0, HPD_MAX_TOP_LOGPROBS, &v) != 0)
                goto bad_number;
            gp.logprobs = true;
            gp.top_logprobs = (uint32_t)v;
            break;
        case O_PLOGPROBS: gp.prompt_logprobs = true; break;
        case O_SCHEMA: schema_file = optarg; break;
        case O_JOBJECT: json_object = true; break;
        case O_JFLEX: json_flexible = true; break;
        case O_TOOLS: tools_file = optarg; break;
        case O_TOOLCHOICE: tool_choice = optarg; break;
        case O_N: /* choices per prompt */
            if (hpd_parse_u64(optarg, 1, HPD_MAX_CHOICES, &v) != 0)
                goto bad_number;
            gp.n = (uint32_t)v;
            break;
        case O_PROMPT: prompt = optarg; break;
        case O_TEXT: print_text = true; break;
        case O_SYSTEM: system = optarg; break;
        case O_STOPSTR:
            if (gp.n_stops == 16 || optarg[0] == '\0') {
                fprintf(stderr, "hpd-client: --stop: at most 16, each not empty\n");
                return 2;
            }
            stops[gp.n_stops++] = optarg;
            gp.stops = stops;
            print_text = true;
            break;
        case O_THINK:
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0) {
                fprintf(stderr, "hpd-client: --thinking '%s' is invalid (expected on or off)\n",
                        optarg);
                return 2;
            }
            gp.thinking = strcmp(optarg, "on") == 0 ? 1 : 2;
            break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        continue;
    bad_number:
        fprintf(stderr, "hpd-client: %s '%s' is invalid\n", argv[optind - 2 >= 0 ? optind - 2 : 0],
                optarg);
        return 2;
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[optind];
    const bool gen = strcmp(cmd, "generate") == 0, chat = strcmp(cmd, "chat") == 0;
    if (!gen && !chat && strcmp(cmd, "status") != 0) {
        fprintf(stderr, "hpd-client: unknown command '%s' (expected generate, chat or status)\n",
                cmd);
        return 2;
    }
    const char *roles[2], *contents[2];
    if (chat) {
        if (prompt == NULL || ids != NULL || file != NULL) {
            fprintf(stderr, "hpd-client: chat takes --prompt TEXT (the user's message)\n");
            return 2;
        }
        if (system != NULL) {
            roles[gp.n_messages] = "system";
            contents[gp.n_messages++] = system;
        }
        roles[gp.n_messages] = "user";
        contents[gp.n_messages++] = prompt;
        gp.roles = roles;
        gp.contents = contents;
        print_text = true;
    } else if (gen && prompt != NULL) {
        if (ids != NULL || file != NULL) {
            fprintf(stderr, "hpd-client: generate takes one of --prompt-ids, --prompts-file "
                    "and --prompt\n");
            return 2;
        }
        gp.text = prompt;
    } else if (gen) {
        if ((ids == NULL) == (file == NULL)) {
            fprintf(stderr, "hpd-client: generate takes one of --prompt-ids and --prompts-file\n");
            return 2;
        }
        if (ids != NULL) {
            G.prompts = calloc(1, sizeof(*G.prompts));
            G.n = 1;
            if (G.prompts == NULL ||
                hpd_parse_id_list(ids, &G.prompts[0].ids, &G.prompts[0].n, err, sizeof(err)) !=
                    HPD_OK) {
                fprintf(stderr, "hpd-client: --prompt-ids: %s\n", err);
                return 2;
            }
        } else if (hpd_read_prompts("hpd-client", file, &G.prompts, &G.n) != HPD_OK) {
            return 2;
        }
    }
    char *grammar = NULL;
    if ((schema_file != NULL || json_object || json_flexible) &&
        make_grammar(schema_file, json_object, json_flexible, &grammar) != HPD_OK)
        return 2;
    gp.grammar = grammar;
    char *tools = NULL, *choice = NULL;
    if ((tools_file != NULL || tool_choice != NULL) &&
        make_tools(chat, tools_file, tool_choice, &tools, &choice) != HPD_OK) {
        free(grammar);
        return 2;
    }
    gp.tools = tools;
    gp.tool_choice = choice;
    char *token = NULL;
    if (token_file != NULL && hpd_rpc_read_token(token_file, &token) != HPD_OK) {
        fprintf(stderr, "hpd-client: cannot read the key file %s\n", token_file);
        return 2;
    }
    if (token != NULL)
        token[strcspn(token, " \t")] = '\0'; /* a keys file's "KEY TENANT" line */
    cp.token = token;
    hpd_client_t *client;
    hpd_status_t st = hpd_client_create(&cp, &client);
    if (st != HPD_OK) {
        fprintf(stderr, "hpd-client: cannot reach the coordinator at %s: %s\n",
                cp.coordinators != NULL ? cp.coordinators : "127.0.0.1:7000",
                st == HPD_ERR_INVALID_ARG ? "token refused" : hpd_status_str(st));
        free(token);
        free(grammar);
        free(tools);
        free(choice);
        return 1;
    }
    const int rc = chat || gp.text != NULL ? cmd_text(client, &gp, print_text)
                   : gen                   ? cmd_generate(client, &gp, concurrency, stats)
                                           : cmd_status(client, as_json);
    hpd_client_destroy(client);
    hpd_prompts_free(G.prompts, G.n);
    free(token);
    free(grammar);
    free(tools);
    free(choice);
    free(stop_ids);
    return rc;
}
