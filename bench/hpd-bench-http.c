/* hpd-bench-http: what the HTTP front door (docs/api.md) adds to the time to
 * first token, against the msgpack client on the same cluster.
 *
 * Starts a local cluster (a coordinator with --http-port, one prefill node
 * without a prefix cache, one decode node) on a model, then sends the same
 * prompts one at a time as 1-token requests, each through three paths in
 * turn (the order rotating per prompt):
 *   msgpack    hpd_client_generate with the prompt ids
 *   http-ids   POST /v1/completions with the ids (a new connection each)
 *   http-text  POST /v1/completions with the prompt as text, tokenized at
 *              the coordinator (the text is the decode of the ids)
 * A 1-token request ends with its first token, so its latency is the TTFT
 * the client sees. Prints p50 / mean of each and the ratios to msgpack.
 *
 * Then structured outputs (docs/structured_outputs.md), what a grammar
 * costs per token: the same prompts as --decode-tokens-token requests with
 * a JSON Schema (an object whose one string the model writes) and without,
 * alternating, each request's TPOT ((total - TTFT) / (tokens - 1), the
 * coordinator's times; requests of at least 8 tokens) and TTFT, p50 and
 * mean, and the ratios. */
#include <arpa/inet.h>
#include <getopt.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/spawn.h"
#include "client/client.h"
#include "common/rng.h"
#include "common/util.h"
#include "tokenizer/tokenizer.h"

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double mean(const double *v, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += v[i];
    return s / n;
}

/* One POST over a new connection; the status (0: no answer). */
static int post(uint16_t port, const char *body)
{
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        return 0;
    char head[256];
    const int n = snprintf(head, sizeof(head), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           "Connection: close\r\nContent-Length: %zu\r\n\r\n", strlen(body));
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n ||
        send(fd, body, strlen(body), MSG_NOSIGNAL) != (ssize_t)strlen(body)) {
        close(fd);
        return 0;
    }
    char buf[65536];
    size_t got = 0;
    ssize_t k;
    while ((k = recv(fd, buf + got, sizeof(buf) - 1 - got, 0)) > 0)
        got += (size_t)k;
    close(fd);
    buf[got] = '\0';
    int status = 0;
    sscanf(buf, "HTTP/1.1 %d", &status);
    return status;
}

/* TPOT and TTFT with a grammar and without, alternating per prompt */
static void structured(hpd_client_t *client, json_t **ids, uint32_t n_prompts,
                       uint32_t decode_tokens)
{
    static const char spec[] =
        "{\"json_schema\": {\"type\": \"object\", \"properties\": {\"text\": {\"type\": "
        "\"string\"}}, \"required\": [\"text\"], \"additionalProperties\": false}}";
    double *tpot[2], *ttft[2];
    uint32_t n[2] = {0, 0}, tokens[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        tpot[k] = malloc(n_prompts * sizeof(double));
        ttft[k] = malloc(n_prompts * sizeof(double));
    }
    for (uint32_t i = 0; i < n_prompts; i++) {
        const size_t n_ids = json_array_size(ids[i]);
        int32_t *p = malloc(n_ids * sizeof(int32_t));
        for (size_t t = 0; t < n_ids; t++)
            p[t] = (int32_t)json_integer_value(json_array_get(ids[i], t));
        for (int j = 0; j < 2; j++) {
            const int k = (int)((i + (uint32_t)j) % 2); /* 1: with the grammar */
            hpd_generate_params_t gp = {.prompt = p, .n_prompt = (uint32_t)n_ids,
                                        .max_tokens = decode_tokens, .ignore_eos = k == 0,
                                        .sampling = {.top_p = 1}, .grammar = k ? spec : NULL};
            hpd_generate_result_t r;
            if (hpd_client_generate(client, &gp, NULL, NULL, &r) != HPD_OK) {
                fprintf(stderr, "hpd-bench-http: structured: %s\n", r.error);
                exit(1);
            }
            if (r.n_tokens >= 8) {
                tpot[k][n[k]] = (r.total_ms - r.ttft_ms) / (r.n_tokens - 1);
                ttft[k][n[k]++] = r.ttft_ms;
                tokens[k] += r.n_tokens;
            }
            hpd_generate_result_free(&r);
        }
        free(p);
    }
    if (n[0] == 0 || n[1] == 0) {
        printf("  structured: no request of 8 tokens or more\n");
        return;
    }
    printf("hpd-bench-http: structured outputs, %u prompts, up to %u tokens each, greedy; "
           "%u and %u requests of >= 8 tokens (%.1f and %.1f tokens on average)\n", n_prompts,
           decode_tokens, n[0], n[1], (double)tokens[0] / n[0], (double)tokens[1] / n[1]);
    const double t0 = mean(tpot[0], n[0]), t1 = mean(tpot[1], n[1]);
    const double f0 = mean(ttft[0], n[0]), f1 = mean(ttft[1], n[1]);
    const double tp0 = median(tpot[0], n[0]), tp1 = median(tpot[1], n[1]);
    printf("  no grammar   TPOT p50 %7.3f ms  mean %7.3f ms   TTFT mean %7.2f ms\n", tp0, t0, f0);
    printf("  json_schema  TPOT p50 %7.3f ms  mean %7.3f ms   TTFT mean %7.2f ms\n", tp1, t1, f1);
    printf("  ratio with / without a grammar: TPOT p50 x%.3f, mean x%.3f; TTFT mean x%.3f\n",
           tp1 / tp0, t1 / t0, f1 / f0);
    for (int k = 0; k < 2; k++) {
        free(tpot[k]);
        free(ttft[k]);
    }
}

/* TPOT and TTFT of a chat with tools whose answer must be a call
 * (tool_choice "required": the tool-call grammar) against the same chat,
 * the same tools rendered, with tool_choice "none" (no grammar): the same
 * prompt, alternating per request. */
static void tool_calls(hpd_client_t *client, uint32_t n_requests, uint32_t decode_tokens)
{
    static const char tools[] =
        "[{\"type\": \"function\", \"function\": {\"name\": \"set_alarm\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"hour\": {\"type\": \"integer\"}, \"day\": "
        "{\"enum\": [\"mon\", \"tue\"]}}, \"required\": [\"hour\", \"day\"]}}}, {\"type\": "
        "\"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 24}}, "
        "\"required\": [\"city\"]}}}]";
    double *tpot[2], *ttft[2];
    uint32_t n[2] = {0, 0}, tokens[2] = {0, 0}, calls = 0;
    for (int k = 0; k < 2; k++) {
        tpot[k] = malloc(n_requests * sizeof(double));
        ttft[k] = malloc(n_requests * sizeof(double));
    }
    for (uint32_t i = 0; i < n_requests; i++) {
        char question[64];
        snprintf(question, sizeof(question), "Request %u: wake me, or tell me the weather.", i);
        const char *roles[] = {"user"}, *contents[] = {question};
        for (int j = 0; j < 2; j++) {
            const int k = (int)((i + (uint32_t)j) % 2); /* 1: a call required */
            hpd_generate_params_t gp = {.roles = roles, .contents = contents, .n_messages = 1,
                                        .thinking = 2, .max_tokens = decode_tokens,
                                        .ignore_eos = k == 0,
                                        .sampling = {.temperature = 1, .top_p = 1, .seed = i},
                                        .tools = tools,
                                        .tool_choice = k ? "\"required\"" : "\"none\""};
            hpd_generate_result_t r;
            if (hpd_client_generate(client, &gp, NULL, NULL, &r) != HPD_OK) {
                fprintf(stderr, "hpd-bench-http: tool calls: %s\n", r.error);
                exit(1);
            }
            calls += k == 1 && strcmp(r.finish_reason, "tool_calls") == 0;
            if (r.n_tokens >= 8) {
                tpot[k][n[k]] = (r.total_ms - r.ttft_ms) / (r.n_tokens - 1);
                ttft[k][n[k]++] = r.ttft_ms;
                tokens[k] += r.n_tokens;
            }
            hpd_generate_result_free(&r);
        }
    }
    if (n[0] == 0 || n[1] == 0) {
        printf("  tool calls: no request of 8 tokens or more\n");
        return;
    }
    printf("hpd-bench-http: tool calls, %u chats with 2 tools, up to %u tokens, seeded; %u of %u "
           "required answers ended in a call; %u and %u requests of >= 8 tokens (%.1f and %.1f "
           "tokens on average)\n", n_requests, decode_tokens, calls, n_requests, n[0], n[1],
           (double)tokens[0] / n[0], (double)tokens[1] / n[1]);
    const double t0 = mean(tpot[0], n[0]), t1 = mean(tpot[1], n[1]);
    const double f0 = mean(ttft[0], n[0]), f1 = mean(ttft[1], n[1]);
    const double tp0 = median(tpot[0], n[0]), tp1 = median(tpot[1], n[1]);
    printf("  tool_choice none      TPOT p50 %7.3f ms  mean %7.3f ms   TTFT mean %7.2f ms\n", tp0,
           t0, f0);
    printf("  tool_choice required  TPOT p50 %7.3f ms  mean %7.3f ms   TTFT mean %7.2f ms\n", tp1,
           t1, f1);
    printf("  ratio required / none: TPOT p50 x%.3f, mean x%.3f; TTFT mean x%.3f\n", tp1 / tp0,
           t1 / t0, f1 / f0);
    for (int k = 0; k < 2; k++) {
        free(tpot[k]);
        free(ttft[k]);
    }
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL;
    uint32_t n_prompts = 40, len = 256, threads = 1, decode_tokens = 64;
    static const struct option longopts[] = {{"model", 1, 0, 'm'},
                                             {"prompts", 1, 0, 'n'},
                                             {"prompt-len", 1, 0, 'l'},
                                             {"threads", 1, 0, 'j'},
                                             {"decode-tokens", 1, 0, 'd'},
                                             {0, 0, 0, 0}};
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'n':
            if (hpd_parse_u64(optarg, 3, 100000, &v))
                goto usage;
            n_prompts = (uint32_t)v;
            break;
        case 'l':
            if (hpd_parse_u64(optarg, 1, 100000, &v))
                goto usage;
            len = (uint32_t)v;
            break;
        case 'j':
            if (hpd_parse_u64(optarg, 1, 1024, &v))
                goto usage;
            threads = (uint32_t)v;
            break;
        case 'd':
            if (hpd_parse_u64(optarg, 8, 4096, &v))
                goto usage;
            decode_tokens = (uint32_t)v;
            break;
        default: goto usage;
        }
    }
    if (model_dir == NULL)
        goto usage;
    signal(SIGPIPE, SIG_IGN);

    hpd_tokenizer_t *tok;
    if (hpd_tokenizer_load(model_dir, &tok) != HPD_OK) {
        fprintf(stderr, "hpd-bench-http: %s has no tokenizer.json (hpd-mkmodel writes one)\n",
                model_dir);
        return 1;
    }
    /* prompts: text of `len` tokens (random ids below the byte-level range
     * decode to text; its tokenization is what the coordinator sends) */
    char **texts = calloc(n_prompts, sizeof(char *));
    json_t **ids = calloc(n_prompts, sizeof(json_t *));
    const uint32_t vocab = hpd_tokenizer_size(tok) - 8; /* not the special tokens */
    for (uint32_t i = 0; i < n_prompts; i++) {
        int32_t *p = malloc(len * sizeof(int32_t)), *again;
        size_t tl, n_again;
        for (uint32_t t = 0; t < len; t++)
            p[t] = (int32_t)(hpd_philox4x32(31 + i, t, 0).v[0] % vocab);
        if (hpd_tokenizer_decode(tok, p, len, true, &texts[i], &tl) != HPD_OK ||
            hpd_tokenizer_encode(tok, texts[i], tl, &again, &n_again) != HPD_OK)
            return 1;
        ids[i] = json_array(); /* the ids the text gives, for http-ids and msgpack */
        for (size_t t = 0; t < n_again; t++)
            json_array_append_new(ids[i], json_integer(again[t]));
        free(p);
        free(again);
    }

    char dir[] = "/tmp/hpd-bench-http-XXXXXX", port_file[128], http_file[128], log[160],
         addr[64], th[16], ctx[16];
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(port_file, sizeof(port_file), "%s/port", dir);
    snprintf(http_file, sizeof(http_file), "%s/http", dir);
    snprintf(th, sizeof(th), "%u", threads);
    /* (a chat with the tool-call run's two tools is ~1,100 tokens) */
    snprintf(ctx, sizeof(ctx), "%u", HPD_MAX(2 * len + 64, 1536u) + decode_tokens);
    snprintf(log, sizeof(log), "%s/coordinator.log", dir);
    char *cargv[] = {HPD_COORDINATOR, "--port", "0", "--port-file", port_file, "--http-port",
                     "0", "--http-port-file", http_file, "--model", (char *)model_dir,
                     "--heartbeat-ms", "100", "--lease-ms", "30000", "--log-level", "warn",
                     NULL};
    pid_t pids[3];
    pids[0] = hpd_bench_spawn(cargv, log);
    const uint16_t port = hpd_bench_read_port(port_file);
    const uint16_t http_port = hpd_bench_read_port(http_file);
    if (port == 0 || http_port == 0) {
        fprintf(stderr, "hpd-bench-http: the coordinator did not come up (logs in %s)\n", dir);
        return 1;
    }
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    char *pargv[] = {HPD_PREFILL, "--coordinator", addr, "--model", (char *)model_dir,
                     "--threads", th, "--max-context", ctx, "--no-prefix-cache", "--log-level",
                     "warn", NULL};
    char *dargv[] = {HPD_DECODE, "--coordinator", addr, "--model", (char *)model_dir,
                     "--threads", th, "--max-context", ctx, "--log-level", "warn", NULL};
    snprintf(log, sizeof(log), "%s/prefill.log", dir);
    pids[1] = hpd_bench_spawn(pargv, log);
    snprintf(log, sizeof(log), "%s/decode.log", dir);
    pids[2] = hpd_bench_spawn(dargv, log);
    hpd_client_t *client = hpd_bench_client(port);
    if (client == NULL)
        return 1;
    /* warm up until both nodes serve */
    for (int i = 0; i < 200; i++) {
        hpd_generate_result_t r;
        const int32_t one = 1;
        hpd_generate_params_t gp = {.prompt = &one, .n_prompt = 1, .max_tokens = 1,
                                    .sampling = {.top_p = 1}};
        const hpd_status_t st = hpd_client_generate(client, &gp, NULL, NULL, &r);
        hpd_generate_result_free(&r);
        if (st == HPD_OK)
            break;
        usleep(100000);
    }

    static const char *const names[3] = {"msgpack", "http-ids", "http-text"};
    double *ms[3];
    for (int k = 0; k < 3; k++)
        ms[k] = malloc(n_prompts * sizeof(double));
    for (uint32_t i = 0; i < n_prompts; i++) {
        char *ids_text = json_dumps(ids[i], JSON_COMPACT);
        json_t *bi = json_pack("{s:O, s:i, s:i}", "prompt", ids[i], "max_tokens", 1,
                               "temperature", 0);
        json_t *bt = json_pack("{s:s, s:i, s:i}", "prompt", texts[i], "max_tokens", 1,
                               "temperature", 0);
        char *body_ids = json_dumps(bi, JSON_COMPACT), *body_text = json_dumps(bt, JSON_COMPACT);
        const size_t n_ids = json_array_size(ids[i]);
        int32_t *p = malloc(n_ids * sizeof(int32_t));
        for (size_t t = 0; t < n_ids; t++)
            p[t] = (int32_t)json_integer_value(json_array_get(ids[i], t));
        for (int j = 0; j < 3; j++) {
            const int k = (int)((i + (uint32_t)j) % 3);
            const double t0 = hpd_time_now();
            if (k == 0) {
                hpd_generate_params_t gp = {.prompt = p, .n_prompt = (uint32_t)n_ids,
                                            .max_tokens = 1, .sampling = {.top_p = 1}};
                hpd_generate_result_t r;
                if (hpd_client_generate(client, &gp, NULL, NULL, &r) != HPD_OK) {
                    fprintf(stderr, "hpd-bench-http: msgpack: %s\n", r.error);
                    return 1;
                }
                hpd_generate_result_free(&r);
            } else {
                const int status = post(http_port, k == 1 ? body_ids : body_text);
                if (status != 200) {
                    fprintf(stderr, "hpd-bench-http: %s: status %d\n", names[k], status);
                    return 1;
                }
            }
            ms[k][i] = (hpd_time_now() - t0) * 1e3;
        }
        free(p);
        free(ids_text);
        free(body_ids);
        free(body_text);
        json_decref(bi);
        json_decref(bt);
    }
    printf("hpd-bench-http: %u prompts of %u tokens, 1-token requests one at a time, %u "
           "thread(s) per node (%s)\n", n_prompts, len, threads, model_dir);
    const double base_mean = mean(ms[0], n_prompts);
    double base_p50 = 0;
    for (int k = 0; k < 3; k++) {
        const double m = mean(ms[k], n_prompts), p50 = median(ms[k], n_prompts);
        if (k == 0)
            base_p50 = p50;
        printf("  %-10s TTFT p50 %8.2f ms  mean %8.2f ms", names[k], p50, m);
        if (k > 0)
            printf("   vs msgpack: p50 %+6.2f ms (x%.3f), mean %+6.2f ms (x%.3f)", p50 - base_p50,
                   p50 / base_p50, m - base_mean, m / base_mean);
        printf("\n");
    }
    structured(client, ids, n_prompts, decode_tokens);
    tool_calls(client, n_prompts, HPD_MAX(decode_tokens, 160u)); /* room for whole calls */
    hpd_client_destroy(client);
    for (int i = 0; i < 3; i++) {
        kill(pids[i], SIGTERM);
        waitpid(pids[i], NULL, 0);
    }
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "hpd-bench-http: cannot remove %s\n", dir);
    hpd_tokenizer_destroy(tok);
    return 0;
usage:
    fprintf(stderr, "usage: hpd-bench-http --model DIR [--prompts N (40)] [--prompt-len T "
                    "(256)] [--threads N (1)] [--decode-tokens N (64)]\n");
    return 2;
}
