#include "coordinator/credentials.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/util.h"
#include "transport/rpc.h"

enum { KEY_MIN = 16, KEY_MAX = 256, TENANT_MAX = 48 };

typedef struct {
    char *key;
    size_t len;
    char tenant[TENANT_MAX + 1];
    uint64_t id;
    uint32_t line;
} client_key_t;

struct hpd_credentials {
    char *secret; /* the node secret */
    size_t secret_len;
    uint64_t secret_id;
    bool keys_file; /* client keys apart from the node secret */
    client_key_t *keys;
    size_t n_keys;
};

/* Constant time in the presented length and the credential's. */
static bool same(const char *want, size_t want_len, const char *got, size_t got_len)
{
    unsigned char diff = (unsigned char)(want_len != got_len);
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned char)(want[i] ^ (i < got_len ? got[i] : 0));
    return diff == 0;
}

static hpd_status_t fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hpd_status_t fail(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return HPD_ERR_INVALID_ARG;
}

static hpd_status_t load_keys(hpd_credentials_t *c, const char *path, char *err, size_t len)
{
    char *text;
    size_t n;
    if (hpd_read_file(path, &text, &n) != HPD_OK)
        return fail(err, len, "%s: cannot read the client keys file", path);
    hpd_status_t st = HPD_OK;
    size_t cap = 0;
    uint32_t line_no = 0;
    for (char *line = text, *next; line != NULL && st == HPD_OK; line = next) {
        line_no++;
        next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        char *k = line;
        while (isspace((unsigned char)*k))
            k++;
        if (*k == '\0' || *k == '#')
            continue;
        char *end = k;
        while (*end != '\0' && !isspace((unsigned char)*end))
            end++;
        const size_t klen = (size_t)(end - k);
        char *tenant = end;
        while (isspace((unsigned char)*tenant))
            tenant++;
        char *tend = tenant + strlen(tenant);
        while (tend > tenant && isspace((unsigned char)tend[-1]))
            *--tend = '\0';
        if (klen < KEY_MIN || klen > KEY_MAX) {
            st = fail(err, len, "%s:%u: a key of %zu characters (expected %d to %d)", path,
                      line_no, klen, KEY_MIN, KEY_MAX);
            break;
        }
        if (strlen(tenant) > TENANT_MAX || strpbrk(tenant, " \t") != NULL) {
            st = fail(err, len, "%s:%u: tenant '%s' (expected one word of at most %d "
                      "characters)", path, line_no, tenant, TENANT_MAX);
            break;
        }
        for (size_t i = 0; i < c->n_keys && st == HPD_OK; i++)
            if (c->keys[i].len == klen && memcmp(c->keys[i].key, k, klen) == 0)
                st = fail(err, len, "%s:%u: the key of line %u again (a key appears once)",
                          path, line_no, c->keys[i].line);
        if (st != HPD_OK)
            break;
        if (hpd_grow(&c->keys, &cap, c->n_keys + 1, sizeof(*c->keys)) != HPD_OK ||
            (c->keys[c->n_keys].key = malloc(klen)) == NULL) {
            st = HPD_ERR_NO_MEMORY;
            snprintf(err, len, "%s: out of memory", path);
            break;
        }
        client_key_t *e = &c->keys[c->n_keys++];
        memcpy(e->key, k, klen);
        e->len = klen;
        snprintf(e->tenant, sizeof(e->tenant), "%s", tenant);
        e->id = XXH3_64bits(k, klen);
        e->line = line_no;
    }
    free(text);
    if (st == HPD_OK && c->n_keys == 0)
        st = fail(err, len, "%s: no client key (one per line: KEY [TENANT])", path);
    return st;
}

hpd_status_t hpd_credentials_load(const char *token_file, const char *keys_file,
                                  hpd_credentials_t **creds_p, char *err, size_t err_len)
{
    hpd_credentials_t *c = calloc(1, sizeof(*c));
    hpd_status_t st;
    if (c == NULL)
        return HPD_ERR_NO_MEMORY;
    if ((st = hpd_rpc_read_token(token_file, &c->secret)) != HPD_OK) {
        snprintf(err, err_len, "%s: cannot read the token file (the node secret)", token_file);
        free(c);
        return st;
    }
    c->secret_len = strlen(c->secret);
    c->secret_id = XXH3_64bits(c->secret, c->secret_len);
    if (keys_file != NULL) {
        c->keys_file = true;
        if ((st = load_keys(c, keys_file, err, err_len)) != HPD_OK) {
            hpd_credentials_destroy(c);
            return st;
        }
        for (size_t i = 0; i < c->n_keys; i++)
            if (c->keys[i].id == c->secret_id) {
                snprintf(err, err_len, "%s: a client key equals the node secret", keys_file);
                hpd_credentials_destroy(c);
                return HPD_ERR_INVALID_ARG;
            }
    }
    *creds_p = c;
    return HPD_OK;
}

void hpd_credentials_destroy(hpd_credentials_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_keys; i++)
        free(c->keys[i].key);
    free(c->keys);
    free(c->secret);
    free(c);
}

uint32_t hpd_credentials_check(const hpd_credentials_t *c, const char *token, size_t len,
                               char *who, size_t who_len, uint64_t *id_p)
{
    uint32_t roles = 0;
    /* every credential is compared, whichever matches */
    if (same(c->secret, c->secret_len, token, len)) {
        roles = HPD_ROLE_NODE; /* never a client: whoever holds it could read every prompt */
        snprintf(who, who_len, "node");
        *id_p = c->secret_id;
    }
    for (size_t i = 0; i < c->n_keys; i++)
        if (same(c->keys[i].key, c->keys[i].len, token, len)) {
            roles = HPD_ROLE_CLIENT;
            if (c->keys[i].tenant[0] != '\0')
                snprintf(who, who_len, "tenant %s", c->keys[i].tenant);
            else
                snprintf(who, who_len, "client key %zu", i + 1);
            *id_p = c->keys[i].id;
        }
    return roles;
}

bool hpd_credentials_grants(const hpd_credentials_t *c, uint64_t id, uint32_t role)
{
    if (id == c->secret_id)
        return (role & HPD_ROLE_NODE) != 0;
    for (size_t i = 0; i < c->n_keys; i++)
        if (c->keys[i].id == id)
            return (role & HPD_ROLE_CLIENT) != 0;
    return false;
}

size_t hpd_credentials_n_keys(const hpd_credentials_t *c)
{
    return c->n_keys;
}
