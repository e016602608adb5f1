#include "deploy/manifest.h"

#include <ctype.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/options.h"
#include "common/util.h"

/* ------------------------------------------------------------ errors */

typedef struct {
    yaml_document_t doc;
    const char *file;
    const char *dir;
    char *err;
    size_t errlen, used;
    uint32_t n_errors;
} ctx_t;

static void fail(ctx_t *c, const yaml_node_t *at, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(ctx_t *c, const yaml_node_t *at, const char *field, const char *fmt, ...)
{
    va_list ap;
    int n;
    c->n_errors++;
    if (c->err == NULL || c->used + 1 >= c->errlen)
        return;
    n = snprintf(c->err + c->used, c->errlen - c->used, "%s:%lu: %s: ", c->file,
                 at ? (unsigned long)at->start_mark.line + 1 : 1ul, field);
    if (n > 0 && c->used + (size_t)n < c->errlen) {
        c->used += (size_t)n;
        va_start(ap, fmt);
        n = vsnprintf(c->err + c->used, c->errlen - c->used, fmt, ap);
        va_end(ap);
        if (n > 0)
            c->used = HPD_MIN(c->used + (size_t)n, c->errlen - 2);
        c->err[c->used++] = '\n';
        c->err[c->used] = '\0';
    } else {
        c->used = c->errlen - 1;
    }
}

static const char *type_name(const yaml_node_t *n)
{
    return n->type == YAML_MAPPING_NODE ? "a mapping"
           : n->type == YAML_SEQUENCE_NODE ? "a list"
                                           : "a value";
}

static const char *scalar(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* ------------------------------------------------------------ fields */

/* the roles as the options table has them (common/options.h) */
enum { R_COORD = HPD_OPT_ROLE_COORD, R_PREFILL = HPD_OPT_ROLE_PREFILL,
       R_DECODE = HPD_OPT_ROLE_DECODE, R_NODE = R_PREFILL | R_DECODE,
       R_ALL = R_COORD | R_NODE };

typedef enum { F_STR, F_U32, F_PORT, F_BOOL, F_LEVEL, F_DEVICE, F_ORDER, F_MAP } kind_t;

/* A manifest field and the option it becomes (common/options.h): the
 * option's range and roles are the field's. A field that is a part of an
 * option's value (kv_layout.block of --kv-layout) has its own range. */
typedef struct field {
    const char *name;
    kind_t kind;
    size_t off, size; /* size: strings */
    const char *opt;  /* the option's flag name */
    uint64_t min, max, mult; /* parts only; min alone: a stricter lower bound */
    const struct field *sub; /* F_MAP: NULL-terminated */
} field_t;

#define P(f) offsetof(hpd_manifest_proc_t, f)
#define STR(n, f, o) {.name = n, .kind = F_STR, .off = P(f), .size = sizeof(((hpd_manifest_proc_t *)0)->f), .opt = o}
#define NUM(n, f, o) {.name = n, .kind = F_U32, .off = P(f), .opt = o}
#define MAP(n, o, s) {.name = n, .kind = F_MAP, .opt = o, .sub = s}

static const field_t layout_fields[] = {
    {.name = "block", .kind = F_U32, .off = P(kv_block), .opt = "kv-layout", .min = 16,
     .max = 4096, .mult = 16},
    {.name = "pack", .kind = F_U32, .off = P(kv_pack), .opt = "kv-layout", .min = 1,
     .max = 1024, .mult = 1},
    {.name = "order", .kind = F_ORDER, .off = P(kv_order), .opt = "kv-layout"},
    {.name = NULL}};

static const field_t prefix_fields[] = {
    {.name = "enabled", .kind = F_BOOL, .off = P(prefix_cache), .opt = "no-prefix-cache"},
    NUM("checkpoints", checkpoints, "checkpoints"),
    NUM("host_mb", host_cache_mb, "host-cache-mb"),
    {.name = NULL}};

static const field_t ucx_fields[] = {
    STR("tls", ucx_tls, "ucx-tls"),
    STR("dev", ucx_dev, "ucx-dev"),
    {.name = NULL}};

/* name and role are read first, by hand */
static const field_t proc_fields[] = {
    STR("host", host, "host"),
    {.name = "port", .kind = F_PORT, .off = P(port), .opt = "port"},
    /* hpdctl probes it: a known port */
    {.name = "metrics_port", .kind = F_PORT, .off = P(metrics_port), .opt = "metrics-port",
     .min = 1},
    {.name = "log_level", .kind = F_LEVEL, .off = P(log_level), .opt = "log-level"},
    NUM("drain_timeout_ms", drain_timeout_ms, "drain-timeout-ms"),
    {.name = "device", .kind = F_DEVICE, .off = P(device), .opt = "device"},
    NUM("threads", threads, "threads"),
    NUM("tp", tp, "tp"),
    MAP("kv_layout", "kv-layout", layout_fields),
    NUM("kv_pages", kv_pages, "kv-pages"),
    NUM("max_batch", max_batch, "max-batch"),
    NUM("max_context", max_context, "max-context"),
    NUM("prefill_chunk", prefill_chunk, "prefill-chunk"),
    MAP("prefix_cache", "no-prefix-cache", prefix_fields),
    NUM("staging_mb", staging_mb, "staging-mb"),
    NUM("xfer_deadline_ms", xfer_deadline_ms, "xfer-deadline-ms"),
    NUM("reserve_timeout_ms", reserve_timeout_ms, "reserve-timeout-ms"),
    MAP("ucx", "ucx-tls", ucx_fields),
    NUM("heartbeat_ms", heartbeat_ms, "heartbeat-ms"),
    NUM("lease_ms", lease_ms, "lease-ms"),
    NUM("liveness_ms", liveness_ms, "liveness-ms"),
    NUM("max_requests", max_requests, "max-requests"),
    NUM("queue_timeout_ms", queue_timeout_ms, "queue-timeout-ms"),
    NUM("max_attempts", max_attempts, "max-attempts"),
    {.name = "http_port", .kind = F_PORT, .off = P(http_port), .opt = "http-port", .min = 1},
    STR("served_model_name", served_model_name, "served-model-name"),
    {.name = NULL}};

static unsigned field_roles(const field_t *f)
{
    return hpd_opt_find(f->opt)->roles & R_ALL;
}

static const char *roles_text(unsigned roles)
{
    return roles == R_ALL ? "processes" : hpd_opt_roles_text(roles);
}

static void list_fields(const field_t *fields, unsigned roles, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (const field_t *f = fields; f->name != NULL && used + 1 < len; f++)
        if (field_roles(f) & roles)
            used += (size_t)snprintf(out + used, len - used, "%s%s", used ? ", " : "", f->name);
}

static bool set_str(ctx_t *c, const yaml_node_t *v, const char *path, char *dst, size_t size)
{
    const char *s = scalar(v);
    if (s == NULL) {
        fail(c, v, path, "%s where a string was expected", type_name(v));
        return false;
    }
    if (strlen(s) >= size || s[0] == '\0') {
        fail(c, v, path, "'%s' is invalid (expected 1 to %zu characters)", s, size - 1);
        return false;
    }
    strcpy(dst, s);
    return true;
}

static bool parse_u64(ctx_t *c, const yaml_node_t *v, const char *path, uint64_t min,
                      uint64_t max, uint64_t mult, uint64_t *out)
{
    const char *s = scalar(v);
    if (s == NULL || v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
        hpd_parse_u64(s, 0, UINT64_MAX, out) != 0) {
        fail(c, v, path, "%s%s%s is not an integer (expected %s%llu to %llu)",
             s ? "'" : "", s ? s : type_name(v), s ? "'" : "", mult > 1 ? "a multiple of " : "",
             (unsigned long long)(mult > 1 ? mult : min), (unsigned long long)max);
        return false;
    }
    if (*out < min || *out > max || (mult > 1 && *out % mult != 0)) {
        if (mult > 1)
            fail(c, v, path, "%llu is invalid (expected a multiple of %llu from %llu to %llu)",
                 (unsigned long long)*out, (unsigned long long)mult, (unsigned long long)min,
                 (unsigned long long)max);
        else
            fail(c, v, path, "%llu is out of range (expected %llu to %llu)",
                 (unsigned long long)*out, (unsigned long long)min, (unsigned long long)max);
        return false;
    }
    return true;
}

static bool parse_bool(ctx_t *c, const yaml_node_t *v, const char *path, bool *out)
{
    static const char *yes[] = {"true", "yes", "on"}, *no[] = {"false", "no", "off"};
    const char *s = scalar(v);
    for (int i = 0; s != NULL && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && i < 3; i++) {
        if (strcmp(s, yes[i]) == 0 || strcmp(s, no[i]) == 0) {
            *out = strcmp(s, yes[i]) == 0;
            return true;
        }
    }
    fail(c, v, path, "%s%s%s is not a boolean (expected true or false)", s ? "'" : "",
         s ? s : type_name(v), s ? "'" : "");
    return false;
}

static void parse_map(ctx_t *c, const yaml_node_t *map, const char *path, const field_t *fields,
                      unsigned role_bit, hpd_manifest_proc_t *p, const char *const *skip);

static void parse_field(ctx_t *c, const field_t *f, const yaml_node_t *v, const char *path,
                        unsigned role_bit, hpd_manifest_proc_t *p)
{
    char *base = (char *)p;
    uint64_t u;
    const char *s;
    switch (f->kind) {
    case F_STR:
        set_str(c, v, path, base + f->off, f->size);
        break;
    case F_U32:
    case F_PORT: {
        const hpd_opt_t *o = hpd_opt_find(f->opt);
        const bool part = f->max != 0; /* a part of the option's value */
        const uint64_t lo = part ? f->min : HPD_MAX(o->min, f->min);
        if (parse_u64(c, v, path, lo, part ? f->max : o->max, part ? f->mult : o->mult, &u)) {
            if (f->kind == F_PORT)
                *(uint16_t *)(base + f->off) = (uint16_t)u;
            else
                *(uint32_t *)(base + f->off) = (uint32_t)u;
            p->given |= 1ull << (o - hpd_options);
        }
        break;
    }
    case F_BOOL:
        parse_bool(c, v, path, (bool *)(base + f->off));
        break;
    case F_LEVEL:
        s = scalar(v);
        if (s && (!strcmp(s, "error") || !strcmp(s, "warn") || !strcmp(s, "info") ||
                  !strcmp(s, "debug")))
            strcpy(base + f->off, s);
        else
            fail(c, v, path, "%s%s%s is invalid (expected error, warn, info or debug)",
                 s ? "'" : "", s ? s : type_name(v), s ? "'" : "");
        break;
    case F_ORDER:
        s = scalar(v);
        if (s && (!strcmp(s, "nhd") || !strcmp(s, "hnd")))
            strcpy(base + f->off, s);
        else
            fail(c, v, path, "%s%s%s is invalid (expected nhd or hnd)", s ? "'" : "",
                 s ? s : type_name(v), s ? "'" : "");
        break;
    case F_DEVICE: {
        s = scalar(v);
        uint64_t gpu;
        if (s && (strcmp(s, "cpu") == 0 || strcmp(s, "cpu-bf16") == 0)) {
            strcpy(p->device, s);
            p->gpu = -1;
        } else if (s && strncmp(s, "cuda:", 5) == 0 && hpd_parse_u64(s + 5, 0, 255, &gpu) == 0) {
            snprintf(p->device, sizeof(p->device), "cuda:%u", (unsigned)gpu);
            p->gpu = (int32_t)gpu;
        } else if (s && (strncmp(s, "cuda-fast:", 10) == 0 || strncmp(s, "cuda-bf16:", 10) == 0) &&
                   hpd_parse_u64(s + 10, 0, 255, &gpu) == 0) {
            snprintf(p->device, sizeof(p->device), "%.9s:%u", s, (unsigned)gpu);
            p->gpu = (int32_t)gpu;
        } else {
            fail(c, v, path, "%s%s%s is invalid (expected cpu, cpu-bf16, cuda:N, cuda-bf16:N or "
                 "cuda-fast:N with N the GPU id)", s ? "'" : "", s ? s : type_name(v),
                 s ? "'" : "");
        }
        break;
    }
    case F_MAP:
        if (v->type != YAML_MAPPING_NODE)
            fail(c, v, path, "%s where a mapping was expected", type_name(v));
        else
            parse_map(c, v, path, f->sub, role_bit, p, NULL);
        break;
    }
}

/* Fields of one mapping; role_bit 0 (defaults) accepts every node field. */
static void parse_map(ctx_t *c, const yaml_node_t *map, const char *path, const field_t *fields,
                      unsigned role_bit, hpd_manifest_proc_t *p, const char *const *skip)
{
    char sub[160], allowed[512];
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(&c->doc, pr->key);
        const yaml_node_t *v = yaml_document_get_node(&c->doc, pr->value);
        const char *key = scalar(k);
        const field_t *f = NULL;
        bool skipped = false;
        if (key == NULL) {
            fail(c, k, path, "a key is %s (expected a field name)", type_name(k));
            continue;
        }
        for (int i = 0; skip != NULL && skip[i] != NULL; i++)
            skipped |= strcmp(skip[i], key) == 0;
        if (skipped)
            continue;
        snprintf(sub, sizeof(sub), "%s.%s", path, key);
        for (const field_t *g = fields; g->name != NULL && f == NULL; g++)
            if (strcmp(g->name, key) == 0)
                f = g;
        const unsigned scope = role_bit ? role_bit : R_NODE;
        if (f == NULL) {
            list_fields(fields, scope, allowed, sizeof(allowed));
            fail(c, k, sub, "unknown field (expected one of: %s)", allowed);
            continue;
        }
        if (!(field_roles(f) & scope)) {
            fail(c, k, sub, "applies to %s only", roles_text(field_roles(f)));
            continue;
        }
        parse_field(c, f, v, sub, role_bit, p);
    }
}

static const yaml_node_t *map_get(ctx_t *c, const yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(&c->doc, pr->key);
        if (scalar(k) != NULL && strcmp(scalar(k), key) == 0)
            return yaml_document_get_node(&c->doc, pr->value);
    }
    return NULL;
}

static bool valid_name(const char *s)
{
    if (s[0] == '\0' || strlen(s) > HPD_MANIFEST_NAME_MAX || !isalnum((unsigned char)s[0]))
        return false;
    for (; *s; s++)
        if (!islower((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '-')
            return false;
    return true;
}

/* ------------------------------------------------------------ the manifest */

static void proc_defaults(hpd_manifest_proc_t *p)
{
    memset(p, 0, sizeof(*p));
    strcpy(p->host, "127.0.0.1");
    strcpy(p->device, "cpu");
    p->gpu = -1;
    p->kv_block = 64;
    p->kv_pack = 1;
    strcpy(p->kv_order, "nhd");
    p->prefix_cache = true;
    strcpy(p->ucx_tls, "tcp");
    strcpy(p->ucx_dev, "lo");
}

/* Removes "." and "dir/.." components of an absolute path, in place. */
static void normalize(char *path)
{
    char *out = path, *in = path;
    if (path[0] != '/')
        return;
    while (*in) {
        while (*in == '/')
            in++;
        char *end = in + strcspn(in, "/");
        const size_t n = (size_t)(end - in);
        if (n == 1 && in[0] == '.') {
            /* skip */
        } else if (n == 2 && in[0] == '.' && in[1] == '.') {
            while (out > path && *--out != '/')
                ;
        } else if (n > 0) {
            *out++ = '/';
            memmove(out, in, n);
            out += n;
        }
        in = end;
    }
    if (out == path)
        *out++ = '/';
    *out = '\0';
}

/* Relative paths are taken from the manifest's directory. */
static bool resolve(const char *dir, const char *path, char *out, size_t len)
{
    int n;
    if (path[0] == '/' || dir == NULL || dir[0] == '\0')
        n = snprintf(out, len, "%s", path);
    else
        n = snprintf(out, len, "%s/%s", dir, path);
    if (n <= 0 || (size_t)n >= len)
        return false;
    normalize(out);
    return true;
}

static bool path_field(ctx_t *c, const yaml_node_t *root, const char *key, bool required,
                       char *out, size_t len)
{
    const yaml_node_t *v = map_get(c, root, key);
    char raw[HPD_MANIFEST_PATH_MAX];
    if (v == NULL) {
        if (required)
            fail(c, root, key, "missing (expected a path%s)",
                 strcmp(key, "model") == 0 ? " to the model directory with config.json" : "");
        return false;
    }
    if (!set_str(c, v, key, raw, sizeof(raw)))
        return false;
    if (!resolve(c->dir, raw, out, len)) {
        fail(c, v, key, "the path is too long (expected at most %zu characters)", len - 1);
        return false;
    }
    return true;
}

static const char *host_key(const char *h)
{
    return strcmp(h, "localhost") == 0 || strcmp(h, "::1") == 0 ? "127.0.0.1" : h;
}

/* Ports: no two processes on one host may listen on the same port. */
static void check_ports(ctx_t *c, const hpd_manifest_t *m, const yaml_node_t *const *where)
{
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *a = &m->procs[i];
        const uint16_t pa[3] = {a->port, a->metrics_port, a->http_port};
        static const char *names[3] = {"port", "metrics_port", "http_port"};
        for (int x = 0; x < 3; x++) {
            if (pa[x] == 0)
                continue;
            for (uint32_t j = 0; j <= i; j++) {
                const hpd_manifest_proc_t *b = &m->procs[j];
                const uint16_t pb[3] = {b->port, b->metrics_port, b->http_port};
                if (strcmp(host_key(a->host), host_key(b->host)) != 0)
                    continue;
                for (int y = 0; y < (j == i ? x : 3); y++) {
                    if (pb[y] != pa[x])
                        continue;
                    char field[96];
                    snprintf(field, sizeof(field), "%s.%s", a->name, names[x]);
                    fail(c, where[i], field,
                         "port %u on host %s is already taken by %s.%s (line %u); each process "
                         "on a host needs its own ports", pa[x], a->host, b->name, names[y],
                         b->line);
                }
            }
        }
    }
}

/* "HOST:PORT" into host (cap bytes) and a port of 1 to 65535. */
static bool host_port(const char *text, char *host, size_t cap, uint16_t *port)
{
    const char *colon = strrchr(text, ':');
    uint64_t v;
    if (colon == NULL || colon == text || (size_t)(colon - text) >= cap ||
        hpd_parse_u64(colon + 1, 1, 65535, &v) != 0)
        return false;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    *port = (uint16_t)v;
    return true;
}

/* coordinator.etcd: {endpoint, key, ttl_s, start, peer_port}. */
static void parse_etcd(ctx_t *c, const yaml_node_t *v, hpd_manifest_t *m)
{
    hpd_manifest_etcd_t *e = &m->etcd;
    if (v == NULL)
        return;
    e->line = (uint32_t)v->start_mark.line + 1;
    if (v->type != YAML_MAPPING_NODE) {
        fail(c, v, "coordinator.etcd", "%s where a mapping was expected (endpoint, key, ttl_s, "
             "start, peer_port)", type_name(v));
        return;
    }
    const yaml_node_t *peer = NULL;
    bool have_endpoint = false;
    for (yaml_node_pair_t *pr = v->data.mapping.pairs.start; pr < v->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(&c->doc, pr->key);
        const yaml_node_t *x = yaml_document_get_node(&c->doc, pr->value);
        const char *key = scalar(k) ? scalar(k) : "?";
        char path[64];
        uint64_t u;
        snprintf(path, sizeof(path), "coordinator.etcd.%s", key);
        if (strcmp(key, "endpoint") == 0) {
            have_endpoint = set_str(c, x, path, e->endpoint, sizeof(e->endpoint));
            const char *hp = e->endpoint + 7;
            if (have_endpoint && (strncmp(e->endpoint, "http://", 7) != 0 ||
                                  strchr(hp, '/') != NULL ||
                                  !host_port(hp, e->host, sizeof(e->host), &e->port))) {
                fail(c, x, path, "'%s' is invalid (expected http://HOST:PORT, etcd's client URL)",
                     e->endpoint);
                have_endpoint = false;
            }
        } else if (strcmp(key, "key") == 0) {
            if (set_str(c, x, path, e->key, sizeof(e->key)) && e->key[0] != '/')
                fail(c, x, path, "'%s' is invalid (expected a key starting with '/')", e->key);
        } else if (strcmp(key, "ttl_s") == 0) {
            const hpd_opt_t *o = hpd_opt_find("etcd-ttl-s");
            if (parse_u64(c, x, path, o->min, o->max, 1, &u))
                e->ttl_s = (uint32_t)u;
        } else if (strcmp(key, "start") == 0) {
            parse_bool(c, x, path, &e->start);
        } else if (strcmp(key, "peer_port") == 0) {
            peer = x;
            if (parse_u64(c, x, path, 1, 65535, 1, &u))
                e->peer_port = (uint16_t)u;
        } else {
            fail(c, k, "coordinator.etcd", "unknown field '%s' (expected endpoint, key, ttl_s, "
                 "start or peer_port)", key);
        }
    }
    if (!have_endpoint) {
        if (map_get(c, v, "endpoint") == NULL)
            fail(c, v, "coordinator.etcd.endpoint", "missing (expected http://HOST:PORT, etcd's "
                 "client URL)");
        e->endpoint[0] = '\0';
        return;
    }
    if (e->key[0] == '\0')
        snprintf(e->key, sizeof(e->key), "/hybridpd/%s", m->cluster);
    if (e->peer_port == 0 && peer == NULL)
        e->peer_port = e->port < 65535 ? (uint16_t)(e->port + 1) : (uint16_t)(e->port - 1);
    if (e->peer_port == e->port)
        fail(c, peer != NULL ? peer : v, "coordinator.etcd.peer_port", "%u is the client "
             "port too (expected another port)", e->peer_port);
}

/* coordinator.standbys: more coordinators, each the coordinator's fields
 * with its own address (host, port, metrics_port, http_port, ...). */
static void parse_standbys(ctx_t *c, const yaml_node_t *v, hpd_manifest_t *m,
                           const yaml_node_t **where)
{
    if (v == NULL)
        return;
    if (v->type != YAML_SEQUENCE_NODE) {
        fail(c, v, "coordinator.standbys", "%s where a list of coordinators was expected",
             type_name(v));
        return;
    }
    const uint32_t n = (uint32_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > 0 && m->etcd.line == 0)
        fail(c, v, "coordinator.standbys", "%u standbys but no coordinator.etcd (expected etcd: "
             "{endpoint: http://HOST:PORT}; without an election every coordinator would lead)",
             n);
    for (uint32_t i = 0; i < n; i++) {
        const yaml_node_t *sd = yaml_document_get_node(&c->doc, v->data.sequence.items.start[i]);
        char path[48];
        snprintf(path, sizeof(path), "coordinator.standbys[%u]", i);
        if (sd->type != YAML_MAPPING_NODE) {
            fail(c, sd, path, "%s where a coordinator (a mapping) was expected", type_name(sd));
            continue;
        }
        hpd_manifest_proc_t *p = &m->procs[m->n_procs];
        *p = m->procs[0];
        snprintf(p->name, sizeof(p->name), "coordinator-%u", i + 2);
        p->line = (uint32_t)sd->start_mark.line + 1;
        where[m->n_procs] = sd;
        parse_map(c, sd, path, proc_fields, R_COORD, p, NULL);
        m->n_procs++;
    }
}

/* coordinator.doors: front doors of the coordinator, each with the
 * coordinator's fields (the HTTP API's, max_requests, ...) and its own
 * address: host, port and metrics_port (required), http_port. */
static void parse_doors(ctx_t *c, const yaml_node_t *v, hpd_manifest_t *m,
                        const yaml_node_t **where)
{
    if (v == NULL)
        return;
    if (v->type != YAML_SEQUENCE_NODE) {
        fail(c, v, "coordinator.doors", "%s where a list of front doors was expected",
             type_name(v));
        return;
    }
    const uint32_t n = (uint32_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    for (uint32_t i = 0; i < n; i++) {
        const yaml_node_t *sd = yaml_document_get_node(&c->doc, v->data.sequence.items.start[i]);
        char path[48], sub[64];
        snprintf(path, sizeof(path), "coordinator.doors[%u]", i);
        if (sd->type != YAML_MAPPING_NODE) {
            fail(c, sd, path, "%s where a front door (a mapping) was expected", type_name(sd));
            continue;
        }
        hpd_manifest_proc_t *p = &m->procs[m->n_procs];
        *p = m->procs[0];
        p->role = HPD_PROC_DOOR;
        p->port = p->metrics_port = p->http_port = 0;
        snprintf(p->name, sizeof(p->name), "door-%u", i + 1);
        p->line = (uint32_t)sd->start_mark.line + 1;
        where[m->n_procs] = sd;
        parse_map(c, sd, path, proc_fields, R_COORD, p, NULL);
        static const char *const need[] = {"port", "metrics_port"};
        for (size_t k = 0; k < HPD_ARRAY_SIZE(need); k++)
            if (map_get(c, sd, need[k]) == NULL) {
                snprintf(sub, sizeof(sub), "%s.%s", path, need[k]);
                fail(c, sd, sub, "missing (expected 1 to 65535)");
            }
        for (uint32_t j = 0; j < m->n_procs; j++)
            if (strcmp(m->procs[j].name, p->name) == 0)
                fail(c, sd, path, "its name '%s' is already the name of the node at line %u",
                     p->name, m->procs[j].line);
        m->n_procs++;
        m->n_doors++;
    }
}

/* An etcd that hpdctl starts takes two ports on its host. */
static void check_etcd_ports(ctx_t *c, const hpd_manifest_t *m, const yaml_node_t *coord)
{
    const hpd_manifest_etcd_t *e = &m->etcd;
    const yaml_node_t *at = map_get(c, coord, "etcd");
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        const uint16_t pp[3] = {p->port, p->metrics_port, p->http_port};
        static const char *names[3] = {"port", "metrics_port", "http_port"};
        if (strcmp(host_key(p->host), host_key(e->host)) != 0)
            continue;
        for (int x = 0; x < 3; x++)
            if (pp[x] != 0 && (pp[x] == e->port || pp[x] == e->peer_port))
                fail(c, at, "coordinator.etcd", "its %s port %u on host %s is already taken by "
                     "%s.%s (line %u); the etcd hpdctl starts needs its own ports",
                     pp[x] == e->port ? "client" : "peer", pp[x], e->host, p->name, names[x],
                     p->line);
    }
}

static void parse_root(ctx_t *c, const yaml_node_t *root, hpd_manifest_t *m)
{
    static const char *top[] = {"cluster",   "model",     "token_file", "client_keys_file",
                                "state_dir", "log_level", "coordinator", "defaults",
                                "nodes",     "kubernetes", NULL};
    const yaml_node_t *v, *coord, *nodes, *defs;
    hpd_manifest_proc_t tmpl;
    const yaml_node_t **where = NULL;

    if (root == NULL || root->type != YAML_MAPPING_NODE) {
        fail(c, root, "manifest", "the document is %s (expected a mapping with cluster, model, "
             "token_file, coordinator and nodes)", root ? type_name(root) : "empty");
        return;
    }
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
         pr < root->data.mapping.pairs.top; pr++) {
        const yaml_node_t *k = yaml_document_get_node(&c->doc, pr->key);
        bool known = false;
        for (int i = 0; top[i] && scalar(k); i++)
            known |= strcmp(top[i], scalar(k)) == 0;
        if (!known)
            fail(c, k, scalar(k) ? scalar(k) : "?", "unknown field (expected one of: cluster, "
                 "model, token_file, client_keys_file, state_dir, log_level, coordinator, "
                 "defaults, nodes, kubernetes)");
    }
    if ((v = map_get(c, root, "cluster")) == NULL)
        fail(c, root, "cluster", "missing (expected the cluster's name)");
    else if (set_str(c, v, "cluster", m->cluster, sizeof(m->cluster)) && !valid_name(m->cluster))
        fail(c, v, "cluster", "'%s' is invalid (expected lowercase letters, digits and '-')",
             m->cluster);
    path_field(c, root, "model", true, m->model, sizeof(m->model));
    path_field(c, root, "token_file", true, m->token_file, sizeof(m->token_file));
    /* the node secret is never a client key: clients always have a keys
     * file, beside the token unless the manifest names one (hpdctl up
     * writes either when it is missing) */
    if (!path_field(c, root, "client_keys_file", false, m->client_keys_file,
                    sizeof(m->client_keys_file)) &&
        m->token_file[0] != '\0') {
        const char *slash = strrchr(m->token_file, '/');
        const int dir = slash != NULL ? (int)(slash - m->token_file) : 1;
        if ((size_t)snprintf(m->client_keys_file, sizeof(m->client_keys_file), "%.*s/client-keys",
                             dir, slash != NULL ? m->token_file : ".") >=
            sizeof(m->client_keys_file))
            fail(c, root, "token_file", "its directory is too long for the client keys file "
                 "beside it");
    }
    if (!path_field(c, root, "state_dir", false, m->state_dir, sizeof(m->state_dir)))
        snprintf(m->state_dir, sizeof(m->state_dir), "/tmp/hybridpd-%s", m->cluster);
    strcpy(m->log_level, "info");
    if ((v = map_get(c, root, "log_level")) != NULL) {
        static const field_t f = {.name = "log_level", .kind = F_LEVEL, .off = P(log_level),
                                  .opt = "log-level"};
        hpd_manifest_proc_t tmp;
        proc_defaults(&tmp);
        strcpy(tmp.log_level, m->log_level);
        parse_field(c, &f, v, "log_level", R_ALL, &tmp);
        strcpy(m->log_level, tmp.log_level);
    }
    strcpy(m->k8s_image, "hybridpd:latest");
    strcpy(m->k8s_namespace, "default");
    if ((v = map_get(c, root, "kubernetes")) != NULL) {
        if (v->type != YAML_MAPPING_NODE) {
            fail(c, v, "kubernetes", "%s where a mapping was expected", type_name(v));
        } else {
            for (yaml_node_pair_t *pr = v->data.mapping.pairs.start;
                 pr < v->data.mapping.pairs.top; pr++) {
                const yaml_node_t *k = yaml_document_get_node(&c->doc, pr->key);
                const yaml_node_t *x = yaml_document_get_node(&c->doc, pr->value);
                const char *key = scalar(k) ? scalar(k) : "?";
                if (strcmp(key, "image") == 0)
                    set_str(c, x, "kubernetes.image", m->k8s_image, sizeof(m->k8s_image));
                else if (strcmp(key, "namespace") == 0)
                    set_str(c, x, "kubernetes.namespace", m->k8s_namespace,
                            sizeof(m->k8s_namespace));
                else
                    fail(c, k, "kubernetes", "unknown field '%s' (expected image or namespace)",
                         key);
            }
        }
    }

    /* defaults for every node */
    proc_defaults(&tmpl);
    if ((defs = map_get(c, root, "defaults")) != NULL) {
        if (defs->type != YAML_MAPPING_NODE)
            fail(c, defs, "defaults", "%s where a mapping was expected", type_name(defs));
        else
            parse_map(c, defs, "defaults", proc_fields, 0, &tmpl, NULL);
    }
    nodes = map_get(c, root, "nodes");
    coord = map_get(c, root, "coordinator");
    if (coord == NULL)
        fail(c, root, "coordinator", "missing (expected a mapping with host, port and "
             "metrics_port)");
    if (nodes == NULL)
        fail(c, root, "nodes", "missing (expected a list of prefill and decode nodes)");
    else if (nodes->type != YAML_SEQUENCE_NODE)
        fail(c, nodes, "nodes", "%s where a list of nodes was expected", type_name(nodes));
    const uint32_t n_nodes = nodes && nodes->type == YAML_SEQUENCE_NODE
        ? (uint32_t)(nodes->data.sequence.items.top - nodes->data.sequence.items.start) : 0;
    const yaml_node_t *standbys = coord && coord->type == YAML_MAPPING_NODE
                                      ? map_get(c, coord, "standbys") : NULL;
    const uint32_t n_standbys = standbys && standbys->type == YAML_SEQUENCE_NODE
        ? (uint32_t)(standbys->data.sequence.items.top - standbys->data.sequence.items.start)
        : 0;
    const yaml_node_t *doors = coord && coord->type == YAML_MAPPING_NODE
                                   ? map_get(c, coord, "doors") : NULL;
    const uint32_t n_doors = doors && doors->type == YAML_SEQUENCE_NODE
        ? (uint32_t)(doors->data.sequence.items.top - doors->data.sequence.items.start)
        : 0;
    m->procs = calloc(n_nodes + 1 + n_standbys + n_doors, sizeof(*m->procs));
    where = calloc(n_nodes + 1 + n_standbys + n_doors, sizeof(*where));
    if (m->procs == NULL || where == NULL) {
        fail(c, root, "manifest", "out of memory");
        free(where);
        return;
    }

    /* the coordinator */
    hpd_manifest_proc_t *cp = &m->procs[m->n_procs++];
    proc_defaults(cp);
    strcpy(cp->name, "coordinator");
    cp->role = HPD_PROC_COORDINATOR;
    where[0] = coord ? coord : root;
    cp->line = (uint32_t)where[0]->start_mark.line + 1;
    if (coord != NULL && coord->type != YAML_MAPPING_NODE) {
        fail(c, coord, "coordinator", "%s where a mapping was expected", type_name(coord));
    } else if (coord != NULL) {
        static const char *const own[] = {"etcd", "standbys", "doors", NULL};
        parse_map(c, coord, "coordinator", proc_fields, R_COORD, cp, own);
        if (map_get(c, coord, "port") == NULL)
            fail(c, coord, "coordinator.port", "missing (expected the RPC port, 1 to 65535)");
        else if (cp->port == 0 && c->n_errors == 0)
            fail(c, map_get(c, coord, "port"), "coordinator.port",
                 "0 is invalid (nodes and clients need a known port: 1 to 65535)");
        if (map_get(c, coord, "metrics_port") == NULL)
            fail(c, coord, "coordinator.metrics_port", "missing (expected 1 to 65535)");
        uint32_t hb = 0; /* the coordinator's default unless given */
        hpd_opt_value(hpd_opt_find("heartbeat-ms"), hpd_opt_find("heartbeat-ms")->def, &hb,
                      NULL, 0);
        if (cp->heartbeat_ms != 0)
            hb = cp->heartbeat_ms;
        if (cp->lease_ms != 0 && cp->lease_ms <= hb)
            fail(c, map_get(c, coord, "lease_ms"), "coordinator.lease_ms",
                 "%u must exceed heartbeat_ms %u", cp->lease_ms, hb);
        parse_etcd(c, map_get(c, coord, "etcd"), m);
        parse_standbys(c, standbys, m, where);
    }
    m->n_coordinators = m->n_procs;

    /* the nodes */
    uint32_t n_prefill = 0, n_decode = 0;
    for (uint32_t i = 0; i < n_nodes; i++) {
        const yaml_node_t *nd =
            yaml_document_get_node(&c->doc, nodes->data.sequence.items.start[i]);
        char path[48];
        const yaml_node_t *role, *name;
        hpd_manifest_proc_t *p = &m->procs[m->n_procs];
        snprintf(path, sizeof(path), "nodes[%u]", i);
        if (nd->type != YAML_MAPPING_NODE) {
            fail(c, nd, path, "%s where a node (a mapping) was expected", type_name(nd));
            continue;
        }
        *p = tmpl;
        p->line = (uint32_t)nd->start_mark.line + 1;
        where[m->n_procs] = nd;
        if ((role = map_get(c, nd, "role")) == NULL) {
            fail(c, nd, path, "missing field 'role' (expected prefill or decode)");
            continue;
        }
        const char *r = scalar(role);
        char rpath[64];
        snprintf(rpath, sizeof(rpath), "%s.role", path);
        if (r && strcmp(r, "prefill") == 0) {
            p->role = HPD_PROC_PREFILL;
            n_prefill++;
        } else if (r && strcmp(r, "decode") == 0) {
            p->role = HPD_PROC_DECODE;
            n_decode++;
        } else {
            fail(c, role, rpath, "%s%s%s is invalid (expected prefill or decode)", r ? "'" : "",
                 r ? r : type_name(role), r ? "'" : "");
            continue;
        }
        snprintf(rpath, sizeof(rpath), "%s.name", path);
        if ((name = map_get(c, nd, "name")) == NULL) {
            fail(c, nd, rpath, "missing (expected a unique name of lowercase letters, digits "
                 "and '-')");
        } else if (set_str(c, name, rpath, p->name, sizeof(p->name))) {
            if (!valid_name(p->name) || strcmp(p->name, "coordinator") == 0)
                fail(c, name, rpath, "'%s' is invalid (expected lowercase letters, digits and "
                     "'-', not 'coordinator')", p->name);
            for (uint32_t j = 1; j < m->n_procs; j++)
                if (strcmp(m->procs[j].name, p->name) == 0)
                    fail(c, name, rpath, "'%s' is already the name of the %s at line %u",
                         p->name, j < m->n_coordinators ? "standby coordinator" : "node",
                         m->procs[j].line);
        }
        static const char *const skip[] = {"role", "name", NULL};
        parse_map(c, nd, path, proc_fields, 1u << p->role, p, skip);
        if (map_get(c, nd, "metrics_port") == NULL) {
            snprintf(rpath, sizeof(rpath), "%s.metrics_port", path);
            fail(c, nd, rpath, "missing (expected 1 to 65535: /metrics and /healthz)");
        }
        m->n_procs++;
    }
    if (nodes != NULL && nodes->type == YAML_SEQUENCE_NODE && (n_prefill == 0 || n_decode == 0))
        fail(c, nodes, "nodes", "%u prefill and %u decode nodes (expected at least one of each)",
             n_prefill, n_decode);
    if (coord != NULL && coord->type == YAML_MAPPING_NODE)
        parse_doors(c, doors, m, where);
    if (c->n_errors == 0)
        check_ports(c, m, where);
    if (c->n_errors == 0 && m->etcd.start)
        check_etcd_ports(c, m, coord);
    free(where);
}

/* YAML leaves a key that appears twice in one mapping to the application
 * (libyaml keeps both pairs): refused, since either reading of it could be
 * what the author meant. */
static void check_duplicate_keys(ctx_t *c)
{
    for (yaml_node_t *n = c->doc.nodes.start; n < c->doc.nodes.top; n++) {
        if (n->type != YAML_MAPPING_NODE)
            continue;
        for (yaml_node_pair_t *a = n->data.mapping.pairs.start; a < n->data.mapping.pairs.top;
             a++) {
            const yaml_node_t *ka = yaml_document_get_node(&c->doc, a->key);
            if (scalar(ka) == NULL)
                continue;
            for (yaml_node_pair_t *b = n->data.mapping.pairs.start; b < a; b++) {
                const yaml_node_t *kb = yaml_document_get_node(&c->doc, b->key);
                if (scalar(kb) != NULL && strcmp(scalar(ka), scalar(kb)) == 0) {
                    fail(c, ka, scalar(ka), "appears again in the same mapping (first at line "
                         "%lu); a key may appear once", (unsigned long)kb->start_mark.line + 1);
                    break;
                }
            }
        }
    }
}

hpd_status_t hpd_manifest_parse(const char *text, size_t len, const char *name, const char *dir,
                                hpd_manifest_t **manifest_p, char *err, size_t errlen)
{
    yaml_parser_t parser;
    ctx_t c = {.file = name, .dir = dir, .err = err, .errlen = errlen};
    hpd_manifest_t *m;

    if (errlen > 0)
        err[0] = '\0';
    if ((m = calloc(1, sizeof(*m))) == NULL)
        return HPD_ERR_NO_MEMORY;
    snprintf(m->path, sizeof(m->path), "%s", name);
    if (!yaml_parser_initialize(&parser)) {
        free(m);
        return HPD_ERR_NO_MEMORY;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &c.doc)) {
        snprintf(err, errlen, "%s:%lu: yaml: %s%s%s\n", name,
                 (unsigned long)parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "syntax error",
                 parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        free(m);
        return HPD_ERR_INVALID_ARG;
    }
    check_duplicate_keys(&c);
    parse_root(&c, yaml_document_get_root_node(&c.doc), m);
    yaml_document_delete(&c.doc);
    yaml_parser_delete(&parser);
    if (c.n_errors > 0) {
        hpd_manifest_destroy(m);
        return HPD_ERR_INVALID_ARG;
    }
    *manifest_p = m;
    return HPD_OK;
}

hpd_status_t hpd_manifest_load(const char *path, hpd_manifest_t **manifest_p, char *err,
                               size_t errlen)
{
    char *text = NULL, dir[PATH_MAX];
    size_t len = 0;
    hpd_status_t st;

    if (hpd_read_file(path, &text, &len) != HPD_OK) {
        snprintf(err, errlen, "%s: cannot read the manifest\n", path);
        return HPD_ERR_IO;
    }
    /* absolute, so that units and processes started elsewhere find the files */
    char *copy = strdup(path);
    if (copy == NULL || realpath(dirname(copy), dir) == NULL)
        snprintf(dir, sizeof(dir), ".");
    free(copy);
    st = hpd_manifest_parse(text, len, path, dir, manifest_p, err, errlen);
    free(text);
    return st;
}

void hpd_manifest_destroy(hpd_manifest_t *m)
{
    if (m == NULL)
        return;
    free(m->procs);
    free(m);
}

const hpd_manifest_proc_t *hpd_manifest_find(const hpd_manifest_t *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_procs; i++)
        if (strcmp(m->procs[i].name, name) == 0)
            return &m->procs[i];
    return NULL;
}

const char *hpd_proc_role_name(hpd_proc_role_t role)
{
    return role == HPD_PROC_COORDINATOR ? "coordinator"
           : role == HPD_PROC_PREFILL   ? "prefill"
           : role == HPD_PROC_DECODE    ? "decode"
                                        : "door";
}

/* ------------------------------------------------------------ command lines */

typedef struct {
    char **v;
    size_t n, cap;
    bool oom;
} argv_t;

static void arg(argv_t *a, const char *s)
{
    if (a->oom || hpd_grow(&a->v, &a->cap, a->n + 2, sizeof(char *)) != HPD_OK ||
        (a->v[a->n] = strdup(s)) == NULL) {
        a->oom = true;
        return;
    }
    a->v[++a->n] = NULL;
}

static void arg_u(argv_t *a, const char *flag, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof(text), "%llu", (unsigned long long)v);
    arg(a, flag);
    arg(a, text);
}

/* Whether the manifest gave the option's field for p (or its defaults). */
static bool given(const hpd_manifest_proc_t *p, const char *opt)
{
    return (p->given >> (hpd_opt_find(opt) - hpd_options)) & 1;
}

static void arg_opt(argv_t *a, const char *opt, uint64_t v)
{
    char flag[48];
    snprintf(flag, sizeof(flag), "--%s", opt);
    arg_u(a, flag, v);
}

/* "HOST:PORT,HOST:PORT,...": the coordinator and its standbys. */
static const char *coordinators_text(const hpd_manifest_t *m, char *text, size_t len)
{
    size_t used = 0;
    text[0] = '\0';
    for (uint32_t i = 0; i < m->n_coordinators && used < len; i++)
        used += (size_t)snprintf(text + used, len - used, "%s%s:%u", i ? "," : "",
                                 m->procs[i].host, m->procs[i].port);
    return text;
}

int hpd_manifest_args(const hpd_manifest_t *m, const hpd_manifest_proc_t *p, const char *bin,
                      char ***argv_p)
{
    argv_t a = {0};
    char text[HPD_MANIFEST_PATH_MAX + 160];

    arg(&a, bin);
    arg(&a, "--host");
    arg(&a, p->host);
    arg_u(&a, "--port", p->port);
    arg_u(&a, "--metrics-port", p->metrics_port);
    arg(&a, "--token-file");
    arg(&a, m->token_file);
    arg(&a, "--log-level");
    arg(&a, p->log_level[0] ? p->log_level : m->log_level);
    if (given(p, "drain-timeout-ms"))
        arg_opt(&a, "drain-timeout-ms", p->drain_timeout_ms);
    if (p->role == HPD_PROC_COORDINATOR || p->role == HPD_PROC_DOOR) {
        if (m->client_keys_file[0] != '\0') {
            arg(&a, "--client-keys-file");
            arg(&a, m->client_keys_file);
        }
        if (p->http_port != 0) { /* the HTTP API tokenizes with the model's files */
            arg_u(&a, "--http-port", p->http_port);
            arg(&a, "--model");
            arg(&a, m->model);
            if (p->served_model_name[0] != '\0') {
                arg(&a, "--served-model-name");
                arg(&a, p->served_model_name);
            }
        }
        const struct { const char *flag; uint32_t v; } nums[] = {
            {"heartbeat-ms", p->heartbeat_ms}, {"lease-ms", p->lease_ms},
            {"liveness-ms", p->liveness_ms},
            {"max-requests", p->max_requests}, {"queue-timeout-ms", p->queue_timeout_ms},
            {"max-attempts", p->max_attempts}};
        for (size_t i = 0; i < HPD_ARRAY_SIZE(nums); i++)
            if (given(p, nums[i].flag))
                arg_opt(&a, nums[i].flag, nums[i].v);
        if (p->role == HPD_PROC_DOOR) { /* its scheduler: the coordinator and its standbys */
            arg(&a, "--scheduler");
            arg(&a, coordinators_text(m, text, sizeof(text)));
        } else if (m->etcd.endpoint[0] != '\0') {
            arg(&a, "--etcd");
            arg(&a, m->etcd.endpoint);
            arg(&a, "--etcd-key");
            arg(&a, m->etcd.key);
            if (m->etcd.ttl_s != 0)
                arg_u(&a, "--etcd-ttl-s", m->etcd.ttl_s);
        }
    } else {
        /* the coordinator and its standbys: the node registers with the one
         * that leads */
        arg(&a, "--coordinator");
        arg(&a, coordinators_text(m, text, sizeof(text)));
        arg(&a, "--model");
        arg(&a, m->model);
        arg(&a, "--name");
        arg(&a, p->name);
        arg(&a, "--device");
        arg(&a, p->device);
        snprintf(text, sizeof(text), "%u,%u,%s", p->kv_block, p->kv_pack, p->kv_order);
        arg(&a, "--kv-layout");
        arg(&a, text);
        arg(&a, "--ucx-tls");
        arg(&a, p->ucx_tls);
        arg(&a, "--ucx-dev");
        arg(&a, p->ucx_dev);
        const struct { const char *flag; uint32_t v; } nums[] = {
            {"threads", p->threads},
            {"tp", p->tp},
            {"kv-pages", p->kv_pages},
            {"max-batch", p->max_batch},
            {"max-context", p->max_context},
            {"prefill-chunk", p->prefill_chunk},
            {"checkpoints", p->checkpoints},
            {"staging-mb", p->staging_mb},
            {"xfer-deadline-ms", p->xfer_deadline_ms},
            {"reserve-timeout-ms", p->reserve_timeout_ms}};
        /* what the manifest gave, where the node's role takes it (defaults
         * may name options of the other role) */
        for (size_t i = 0; i < HPD_ARRAY_SIZE(nums); i++)
            if (given(p, nums[i].flag) &&
                (hpd_opt_find(nums[i].flag)->roles & (1u << p->role)) != 0)
                arg_opt(&a, nums[i].flag, nums[i].v);
        if (p->role == HPD_PROC_PREFILL) {
            if (!p->prefix_cache)
                arg(&a, "--no-prefix-cache");
            arg_u(&a, "--host-cache-mb", p->host_cache_mb);
        }
    }
    if (a.oom) {
        hpd_manifest_args_free(a.v);
        return -1;
    }
    *argv_p = a.v;
    return (int)a.n;
}

int hpd_manifest_etcd_args(const hpd_manifest_t *m, const char *bin, const char *data_dir,
                           char ***argv_p)
{
    argv_t a = {0};
    char client[200], peer[200], cluster[260];
    const hpd_manifest_etcd_t *e = &m->etcd;
    snprintf(client, sizeof(client), "http://%s:%u", e->host, e->port);
    snprintf(peer, sizeof(peer), "http://%s:%u", e->host, e->peer_port);
    snprintf(cluster, sizeof(cluster), "%s=%s", m->cluster, peer);
    const char *words[] = {bin, "--name", m->cluster, "--data-dir", data_dir,
                           "--listen-client-urls", client, "--advertise-client-urls", client,
                           "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                           "--initial-cluster", cluster};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(words); i++)
        arg(&a, words[i]);
    if (a.oom) {
        hpd_manifest_args_free(a.v);
        return -1;
    }
    *argv_p = a.v;
    return (int)a.n;
}

void hpd_manifest_args_free(char **argv)
{
    for (size_t i = 0; argv != NULL && argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
}
