/* Simulated nodes (sim/sim.h). Who frees what: the simulator owns its
 * nodes, a node its jobs; a job ends when its last token went, when the
 * coordinator cancels it, or with its node. A held call (a prefill
 * waiting out its time) holds a reference on its connection until it is
 * answered or its job goes. */
#include "sim/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prefix_hash.h"
#include "common/log.h"
#include "common/u64map.h"
#include "common/util.h"
#include "node/msg.h"
#include "node/proto.h"
#include "transport/rpc.h"

#define LOG_COMPONENT "sim"
#define BLOCK 16
#define SUMMARY_BYTES 8192 /* what the coordinator takes (coordinator/coord_internal.h) */
#define CALL_TIMEOUT_MS 30000
#define SERVED_MIN 1024 /* the served table's first size (a power of two) */

typedef struct sim_node node_t;

typedef struct job {
    node_t *node;
    uint64_t job, key; /* key: hpd_sim_request_key */
    int32_t *prompt;
    uint32_t n_prompt, max_tokens, n_ch, pages;
    uint64_t seed;
    /* prefill: the call answered when its time is up; cached: the prompt
     * tokens its node had */
    hpd_rpc_conn_t *conn;
    uint32_t call, cached;
    struct event *due;
    /* decode: the next index each choice streams (token 0 came from prefill) */
    bool started;
    uint32_t next;
    /* a front door's request (reserve's door): the tokens go there, the
     * coordinator hears their count with the last */
    struct sim_door *door;
    uint64_t door_request;
    struct job *next_job;
} job_t;

/* A front door the decode nodes stream to: one connection for the whole
 * simulator (a real decode node opens its own). */
typedef struct sim_door {
    char addr[72];
    hpd_rpc_client_t *client;
    bool closed; /* the next reserve naming it connects again */
    struct sim_door *next;
} sim_door_t;

/* A prefill node's prefix cache: the blocks it holds (a set) and their
 * order (a ring: the oldest goes when it is full). */
typedef struct {
    hpd_u64map_t held;      /* block_key -> 1 */
    hpd_block_hash_t *ring; /* the blocks held, oldest at at - n */
    uint32_t n, at;
    uint8_t summary[SUMMARY_BYTES];
    bool summary_stale;
} prefix_cache_t;

struct sim_node {
    hpd_sim_t *sim;
    prefix_cache_t cache;
    uint32_t index;
    bool prefill, registered, refused, stopped, dead, bad_notice;
    char name[64], why[400];
    double speed;
    hpd_rpc_server_t *server;
    hpd_rpc_client_t *reg;     /* node -> coordinator: register, heartbeat, alive */
    hpd_rpc_conn_t *coord_conn; /* coordinator -> node: its calls, the tokens notices */
    uint64_t node_id, alive_key;
    uint32_t heartbeat_ms, alive_ms;
    struct event *heartbeat, *ping, *step, *retry;
    uint32_t attempts; /* register calls made */
    bool heartbeat_out;
    job_t *jobs;
    uint32_t slots_used, pages_used, running;
    uint64_t done; /* jobs finished */
};

typedef struct {
    uint64_t key; /* hpd_sim_request_key; 0: an empty entry */
    int32_t prefill, decode;
    uint32_t jobs;
    double t_reserve; /* its first reserve */
} served_t;

struct hpd_sim {
    hpd_sim_params_t p;
    hpd_block_hash_t root;   /* the chain's h_{-1}, from the nodes' fingerprint */
    hpd_u64map_t holders;    /* a block's key -> how many prefill nodes hold it (as a
                                pointer-sized count) */
    node_t *nodes;
    uint32_t n_nodes;
    served_t *served; /* open addressing on the key */
    size_t served_cap, served_n;
    sim_door_t *doors;
    hpd_sim_stats_t st;
};

/* ------------------------------------------------------------ the answers */

static const uint8_t fp[16] = {'h', 'p', 'd', '-', 's', 'i', 'm'}; /* the model's */

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

int32_t hpd_sim_token(const int32_t *prompt, uint32_t n_prompt, uint64_t seed, uint32_t k,
                      uint32_t i, uint32_t vocab)
{
    uint64_t h = mix(0x5151, seed);
    for (uint32_t j = 0; j < n_prompt; j++)
        h = mix(h, (uint32_t)prompt[j]);
    h = mix(mix(h, k), i);
    return (int32_t)(h % (vocab > 0 ? vocab : 1));
}

/* ------------------------------------------------------------ who served */

uint64_t hpd_sim_request_key(const int32_t *prompt, uint32_t n_prompt, uint64_t seed)
{
    uint64_t h = mix(0x7e57, seed);
    for (uint32_t j = 0; j < n_prompt; j++)
        h = mix(h, (uint32_t)prompt[j]);
    return h != 0 ? h : 1;
}

static served_t *served_slot(hpd_sim_t *s, uint64_t key)
{
    size_t i = mix(0, key) & (s->served_cap - 1);
    while (s->served[i].key != 0 && s->served[i].key != key)
        i = (i + 1) & (s->served_cap - 1);
    return &s->served[i];
}

/* key's entry, made when missing (NULL: out of memory). */
static served_t *served_of(hpd_sim_t *s, uint64_t key)
{
    if (2 * (s->served_n + 1) > s->served_cap) {
        served_t *old = s->served;
        const size_t old_cap = s->served_cap;
        served_t *fresh = calloc(old_cap * 2, sizeof(*fresh));
        if (fresh == NULL)
            return NULL;
        s->served = fresh;
        s->served_cap = old_cap * 2;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key != 0)
                *served_slot(s, old[i].key) = old[i];
        free(old);
    }
    served_t *e = served_slot(s, key);
    if (e->key == 0) {
        *e = (served_t){.key = key, .prefill = -1, .decode = -1};
        s->served_n++;
    }
    return e;
}

bool hpd_sim_served(const hpd_sim_t *sim, uint64_t key, int32_t *prefill_p, int32_t *decode_p,
                    uint32_t *jobs_p)
{
    const served_t *e = served_slot((hpd_sim_t *)sim, key);
    if (e->key != key)
        return false;
    *prefill_p = e->prefill;
    *decode_p = e->decode;
    *jobs_p = e->jobs;
    return true;
}

/* ------------------------------------------------------------ jobs */

static job_t *job_find(node_t *n, uint64_t job)
{
    for (job_t *j = n->jobs; j != NULL; j = j->next_job)
        if (j->job == job)
            return j;
    return NULL;
}

static void job_free(job_t *j)
{
    node_t *n = j->node;
    for (job_t **pp = &n->jobs; *pp != NULL; pp = &(*pp)->next_job)
        if (*pp == j) {
            *pp = j->next_job;
            break;
        }
    if (!n->prefill) {
        n->slots_used -= j->n_ch;
        n->pages_used -= j->pages;
        n->running -= j->started;
        n->sim->st.running -= j->started;
    }
    if (j->due != NULL)
        event_free(j->due);
    if (j->conn != NULL)
        hpd_rpc_conn_unref(j->conn);
    free(j->prompt);
    free(j);
}

static job_t *job_new(node_t *n, uint64_t job, const int32_t *prompt,
                      uint32_t n_prompt, const msgpack_object *sampling, uint32_t n_ch)
{
    job_t *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->prompt = malloc((n_prompt ? n_prompt : 1) * sizeof(int32_t))) == NULL) {
        free(j);
        return NULL;
    }
    memcpy(j->prompt, prompt, n_prompt * sizeof(int32_t));
    const msgpack_object *seed = sampling != NULL ? hpd_rpc_map_get(sampling, "seed") : NULL;
    *j = (job_t){.node = n,
                 .job = job,
                 .prompt = j->prompt,
                 .n_prompt = n_prompt,
                 .n_ch = n_ch > 0 ? n_ch : 1,
                 .seed = seed != NULL && seed->type == MSGPACK_OBJECT_POSITIVE_INTEGER
                             ? seed->via.u64
                             : 0,
                 .next = 1,
                 .next_job = n->jobs};
    j->key = hpd_sim_request_key(j->prompt, j->n_prompt, j->seed);
    n->jobs = j;
    return j;
}

/* ------------------------------------------------------------ prefill */

static void prefill_due(evutil_socket_t fd, short what, void *arg)
{
    job_t *j = arg;
    node_t *n = j->node;
    const uint32_t vocab = n->sim->p.vocab;
    int32_t first[HPD_MAX_CHOICES];
    if (n->stopped) { /* it answers once it goes on */
        const struct timeval again = {0, 10000};
        evtimer_add(j->due, &again);
        return;
    }
    for (uint32_t k = 0; k < j->n_ch; k++)
        first[k] = hpd_sim_token(j->prompt, j->n_prompt, j->seed, k, 0, vocab);
    served_t *e = served_of(n->sim, j->key);
    if (e != NULL)
        e->prefill = (int32_t)n->index;
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_prefilled,
                 &(hpd_msg_prefilled_t){.first_token = (uint32_t)first[0],
                                        .cached_tokens = j->cached,
                                        .first_tokens = j->n_ch > 1 ? first : NULL,
                                        .first_tokens_n = j->n_ch > 1 ? j->n_ch : 0},
                 &b.pk);
    hpd_rpc_reply(j->conn, j->call, &b);
    hpd_rpc_buf_destroy(&b);
    n->done++;
    job_free(j);
}

/* A block's key in the maps (never 0: that is an empty slot). */
static uint64_t block_key(const hpd_block_hash_t *h)
{
    uint64_t a, b;
    memcpy(&a, h->bytes, 8);
    memcpy(&b, h->bytes + 8, 8);
    return (a ^ b) | 1;
}

/* Leading blocks of hashes that node n holds (n NULL: that some prefill
 * node holds). */
static uint32_t cached_blocks(const hpd_sim_t *s, const node_t *n, const uint64_t *keys,
                              uint32_t n_blocks)
{
    uint32_t b = 0;
    while (b < n_blocks && hpd_u64map_get(n != NULL ? &n->cache.held : &s->holders, keys[b]))
        b++;
    return b;
}

static void holders_add(hpd_sim_t *s, uint64_t key, intptr_t d)
{
    const intptr_t now = (intptr_t)hpd_u64map_get(&s->holders, key) + d;
    if (now > 0)
        hpd_u64map_put(&s->holders, key, (void *)now);
    else
        hpd_u64map_del(&s->holders, key);
}

/* The node caches the blocks it computed (the oldest go past the cap). */
static void cache_put(node_t *n, const hpd_block_hash_t *h, const uint64_t *keys,
                      uint32_t n_blocks)
{
    hpd_sim_t *s = n->sim;
    prefix_cache_t *c = &n->cache;
    if (c->ring == NULL && (c->ring = calloc(s->p.cache_blocks, sizeof(*c->ring))) == NULL)
        return;
    for (uint32_t b = 0; b < n_blocks; b++) {
        if (hpd_u64map_get(&c->held, keys[b]) != NULL)
            continue;
        if (c->n == s->p.cache_blocks) { /* the oldest goes */
            const uint64_t old = block_key(&c->ring[c->at]);
            hpd_u64map_del(&c->held, old);
            holders_add(s, old, -1);
            c->n--;
        }
        if (hpd_u64map_put(&c->held, keys[b], (void *)1) != HPD_OK)
            return;
        holders_add(s, keys[b], 1);
        c->ring[c->at] = h[b];
        c->at = (c->at + 1) % s->p.cache_blocks;
        c->n++;
        c->summary_stale = true;
    }
}

/* The prompt's cached part on node n (tokens; at least its last token is
 * computed), counting what an ideal router would have had; then n caches
 * the prompt's full blocks. */
static uint32_t prefix_hit(node_t *n, const int32_t *prompt, uint32_t n_prompt)
{
    hpd_sim_t *s = n->sim;
    const uint32_t n_blocks = n_prompt / HPD_PREFIX_BLOCK;
    if (s->p.cache_blocks == 0 || n_blocks == 0)
        return 0;
    hpd_block_hash_t *h = malloc(n_blocks * sizeof(*h));
    uint64_t *keys = malloc(n_blocks * sizeof(*keys));
    uint32_t hit = 0;
    if (h != NULL && keys != NULL) {
        hpd_prefix_hash_chain(&s->root, prompt, n_blocks, h);
        for (uint32_t b = 0; b < n_blocks; b++)
            keys[b] = block_key(&h[b]);
        const uint32_t best = cached_blocks(s, NULL, keys, n_blocks);
        hit = cached_blocks(s, n, keys, n_blocks);
        const uint32_t most = n_prompt - 1;
        s->st.cached_tokens += HPD_MIN(hit * HPD_PREFIX_BLOCK, most);
        s->st.ideal_cached_tokens += HPD_MIN(best * HPD_PREFIX_BLOCK, most);
        cache_put(n, h, keys, n_blocks);
    }
    free(h);
    free(keys);
    return HPD_MIN(hit * HPD_PREFIX_BLOCK, n_prompt - 1);
}

static void m_prefill(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    node_t *n = arg;
    hpd_sim_t *s = n->sim;
    hpd_msg_prefill_job_t m = {0};
    hpd_proto_err_t err;
    if (n->stopped)
        return; /* a stopped process answers nothing */
    if (!hpd_msg_unpack(&hpd_msg_prefill_job, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "prefill: %s", err.text);
        return;
    }
    s->st.prefills++;
    job_t *j = job_new(n, m.job, m.prompt, m.prompt_n, m.sampling, m.n);
    if (j == NULL || (j->due = evtimer_new(s->p.base, prefill_due, j)) == NULL) {
        if (j != NULL)
            job_free(j);
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "out of memory");
        hpd_msg_free(&hpd_msg_prefill_job, &m);
        return;
    }
    j->conn = conn;
    j->call = id;
    hpd_rpc_conn_ref(conn);
    s->st.prompt_tokens += m.prompt_n;
    j->cached = prefix_hit(n, m.prompt, m.prompt_n);
    const double us = ((m.prompt_n - j->cached) * s->p.prefill_us_per_token +
                       (m.prompt_n + BLOCK - 1) / BLOCK * s->p.push_us_per_page) /
                      n->speed;
    const struct timeval tv = {(time_t)(us / 1e6), (suseconds_t)fmod(us, 1e6)};
    evtimer_add(j->due, &tv);
    hpd_msg_free(&hpd_msg_prefill_job, &m);
}

/* ------------------------------------------------------------ decode */

static void arm_step(node_t *n)
{
    if (n->running == 0 || n->stopped || n->dead || evtimer_pending(n->step, NULL))
        return;
    const double us = n->sim->p.step_us / n->speed;
    const struct timeval tv = {(time_t)(us / 1e6), (suseconds_t)fmod(us, 1e6)};
    evtimer_add(n->step, &tv);
}

/* The connection to the front door at addr ("HOST:PORT"), opened on first
 * use; NULL: not an address, or it cannot start. */
static void on_door_close(void *arg, hpd_status_t why)
{
    (void)why;
    ((sim_door_t *)arg)->closed = true;
}

static sim_door_t *door_of(hpd_sim_t *s, const char *addr)
{
    for (sim_door_t *d = s->doors; d != NULL; d = d->next)
        if (strcmp(d->addr, addr) == 0 && !d->closed)
            return d;
    hpd_endpoint_t ep;
    uint32_t n_ep;
    char why[160];
    sim_door_t *d;
    if (!hpd_proto_parse_endpoints(addr, &ep, 1, &n_ep, why, sizeof(why)) || n_ep != 1 ||
        (d = calloc(1, sizeof(*d))) == NULL)
        return NULL;
    snprintf(d->addr, sizeof(d->addr), "%s", addr);
    const hpd_rpc_client_params_t cp = {.base = s->p.base, .host = ep.host, .port = ep.port,
                                        .token = s->p.token, .timeout_ms = 1000,
                                        .on_close = on_door_close, .arg = d};
    if (hpd_rpc_client_connect(&cp, &d->client) != HPD_OK) {
        free(d);
        return NULL;
    }
    d->next = s->doors;
    s->doors = d;
    return d;
}

static void m_reserve(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    node_t *n = arg;
    hpd_sim_t *s = n->sim;
    hpd_msg_reserve_t m = {0};
    hpd_proto_err_t err;
    if (n->stopped)
        return;
    n->coord_conn = conn;
    if (!hpd_msg_unpack(&hpd_msg_reserve, params, &m, &err)) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "reserve: %s", err.text);
        return;
    }
    s->st.reserves++;
    const uint32_t n_ch = m.n > 0 ? m.n : 1;
    const uint32_t pages = n_ch * ((m.prompt_n + m.max_tokens + BLOCK - 1) / BLOCK);
    if (n->slots_used + n_ch > s->p.slots || n->pages_used + pages > s->p.pages) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_OVERLOADED, "no room: %u of %u slots, %u of "
                            "%u pages in use", n->slots_used, s->p.slots, n->pages_used,
                            s->p.pages);
        hpd_msg_free(&hpd_msg_reserve, &m);
        return;
    }
    job_t *j = job_new(n, m.job, m.prompt, m.prompt_n, m.sampling, m.n);
    if (j == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_INTERNAL, "out of memory");
        hpd_msg_free(&hpd_msg_reserve, &m);
        return;
    }
    if (m.door[0] != '\0' && (j->door = door_of(s, m.door)) == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_PARAMS, "reserve: door %s: not a front door "
                            "this node can reach", m.door);
        job_free(j);
        hpd_msg_free(&hpd_msg_reserve, &m);
        return;
    }
    j->door_request = m.door_request;
    j->max_tokens = m.max_tokens;
    j->pages = pages;
    n->slots_used += n_ch;
    n->pages_used += pages;
    served_t *e = served_of(s, j->key);
    if (e != NULL && e->jobs++ == 0)
        e->t_reserve = hpd_time_now();
    hpd_msg_free(&hpd_msg_reserve, &m);
    /* one pack group of one page: nothing is ever written there */
    static const uint8_t tables[] = {0x91, 0x91, 0x01}; /* msgpack [[1]] */
    const hpd_msg_reservation_t res = {
        .layout = {.block_size = BLOCK, .pack_size = 1, .order = HPD_KV_NHD},
        .tables_raw = tables,
        .tables_raw_len = sizeof(tables),
        .slot_region = 1};
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_reservation, &res, &b.pk);
    hpd_rpc_reply(conn, id, &b);
    hpd_rpc_buf_destroy(&b);
}

static void m_start(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    node_t *n = arg;
    if (n->stopped)
        return;
    n->coord_conn = conn;
    const msgpack_object *jo = hpd_rpc_map_get(params, "job");
    job_t *j = jo != NULL && jo->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? job_find(n, jo->via.u64)
                                                                          : NULL;
    if (j == NULL) {
        hpd_rpc_reply_error(conn, id, HPD_RPC_ERR_APP, "start: no such job");
        return;
    }
    n->sim->st.starts++;
    if (!j->started) {
        j->started = true;
        n->running++;
        n->sim->st.running++;
    }
    hpd_rpc_reply(conn, id, NULL);
    arm_step(n);
}

static void m_cancel(hpd_rpc_conn_t *conn, uint32_t id, const msgpack_object *params, void *arg)
{
    node_t *n = arg;
    if (n->stopped)
        return;
    const msgpack_object *jo = hpd_rpc_map_get(params, "job");
    job_t *j = jo != NULL && jo->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? job_find(n, jo->via.u64)
                                                                          : NULL;
    n->sim->st.cancels++;
    if (j != NULL) {
        if (j->conn != NULL) /* a prefill still out */
            hpd_rpc_reply_error(j->conn, j->call, HPD_RPC_ERR_APP, "canceled");
        job_free(j);
    }
    hpd_rpc_reply(conn, id, NULL);
}

/* One notice: choice k's token at index (the last one: done); bad ones
 * when the node was told to send them (the index is not advanced: the
 * next step sends it right). */
static bool send_tokens(node_t *n, job_t *j, uint32_t k, uint32_t index, bool done)
{
    hpd_sim_t *s = n->sim;
    int32_t id = hpd_sim_token(j->prompt, j->n_prompt, j->seed, k, index, s->p.vocab);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    if (n->bad_notice) {
        /* one that does not read (no job, no index), and one that skips a
         * token: the next token at index + 1 */
        n->bad_notice = false;
        msgpack_pack_map(&b.pk, 1);
        hpd_proto_kv_u64(&b.pk, "ids", (uint64_t)id);
        hpd_rpc_notify(n->coord_conn, "tokens", &b);
        hpd_rpc_buf_destroy(&b);
        int32_t ahead = hpd_sim_token(j->prompt, j->n_prompt, j->seed, k, index + 1, s->p.vocab);
        hpd_rpc_buf_init(&b);
        hpd_msg_pack(&hpd_msg_tokens,
                     &(hpd_msg_tokens_t){.job = j->job, .index = index + 1, .ids = &ahead,
                                         .ids_n = index + 1 < j->max_tokens ? 1 : 0,
                                         .choice = k},
                     &b.pk);
        hpd_rpc_notify(n->coord_conn, "tokens", &b);
        hpd_rpc_buf_destroy(&b);
        return false;
    }
    hpd_msg_tokens_t m = {.job = j->job,
                          .index = index,
                          .ids = &id,
                          .ids_n = index < j->max_tokens ? 1 : 0,
                          .done = done,
                          .choice = k};
    if (done)
        snprintf(m.finish_reason, sizeof(m.finish_reason), "length");
    const uint32_t sent = m.ids_n;
    if (j->door != NULL) { /* the ids to the door, their count to the coordinator */
        m.job = j->door_request;
        hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
        (void)hpd_rpc_client_notify(j->door->client, "tokens", &b);
        hpd_rpc_buf_destroy(&b);
        hpd_rpc_buf_init(&b);
        m.job = j->job;
        m.index += m.ids_n;
        m.ids = NULL;
        m.ids_n = 0;
    }
    if (j->door == NULL || done) {
        hpd_msg_pack(&hpd_msg_tokens, &m, &b.pk);
        hpd_rpc_notify(n->coord_conn, "tokens", &b);
    }
    hpd_rpc_buf_destroy(&b);
    s->st.notices++;
    s->st.tokens += sent;
    return true;
}

static void on_step(evutil_socket_t fd, short what, void *arg)
{
    node_t *n = arg;
    if (n->stopped || n->dead || n->coord_conn == NULL)
        return;
    for (job_t *j = n->jobs, *next; j != NULL; j = next) {
        next = j->next_job;
        if (!j->started)
            continue;
        /* token index j->next of every choice; the last one ends it */
        const bool done = j->next + 1 >= j->max_tokens;
        bool sent = true;
        for (uint32_t k = 0; k < j->n_ch && sent; k++)
            sent = send_tokens(n, j, k, j->next, done);
        if (!sent)
            continue;
        j->next++;
        if (done) {
            served_t *e = served_of(n->sim, j->key);
            if (e != NULL)
                e->decode = (int32_t)n->index;
            n->done++;
            job_free(j);
        }
    }
    arm_step(n);
}

/* ------------------------------------------------------------ registration */

static void send_heartbeat(node_t *n);

static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    node_t *n = arg;
    if (!n->stopped && !n->dead)
        send_heartbeat(n);
    const struct timeval tv = {n->heartbeat_ms / 1000, (n->heartbeat_ms % 1000) * 1000};
    evtimer_add(n->heartbeat, &tv);
}

static void on_heartbeat_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    node_t *n = arg;
    n->heartbeat_out = false;
    if (st == HPD_OK && reply->is_error)
        HPD_LOG_WARN(LOG_COMPONENT, "%s: heartbeat refused: %.*s", n->name,
                     (int)reply->error_message_len, reply->error_message);
}

static void send_heartbeat(node_t *n)
{
    static const uint8_t empty_map[] = {0x80};
    if (n->heartbeat_out || n->reg == NULL)
        return;
    hpd_msg_stats_t m = {.node_id = n->node_id,
                         .uptime_s = 1,
                         .pages_used = n->pages_used,
                         .pages_total = n->sim->p.pages,
                         .slots_used = n->slots_used,
                         .slots_total = n->sim->p.slots,
                         .engine_raw = empty_map,
                         .engine_raw_len = 1,
                         .cache_raw = empty_map,
                         .cache_raw_len = 1,
                         .xfer_raw = empty_map,
                         .xfer_raw_len = 1,
                         .load_raw = empty_map,
                         .load_raw_len = 1};
    snprintf(m.role, sizeof(m.role), "%s", n->prefill ? "prefill" : "decode");
    snprintf(m.name, sizeof(m.name), "%s", n->name);
    prefix_cache_t *c = &n->cache;
    if (n->prefill && n->sim->p.cache_blocks > 0) { /* the Bloom summary of its blocks */
        if (c->summary_stale) {
            const uint32_t cap = n->sim->p.cache_blocks;
            memset(c->summary, 0, sizeof(c->summary));
            for (uint32_t i = 0; i < c->n; i++)
                hpd_prefix_summary_add(c->summary, sizeof(c->summary),
                                       &c->ring[(c->at + cap - c->n + i) % cap]);
            c->summary_stale = false;
        }
        m.prefix_summary = c->summary;
        m.prefix_summary_len = sizeof(c->summary);
    }
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_msg_pack(&hpd_msg_stats, &m, &b.pk);
    if (hpd_rpc_call(n->reg, "heartbeat", &b, CALL_TIMEOUT_MS, on_heartbeat_reply, n) == HPD_OK) {
        n->heartbeat_out = true;
        n->sim->st.heartbeats++;
    }
    hpd_rpc_buf_destroy(&b);
}

static void ignore_reply(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply) {}

static void on_ping(evutil_socket_t fd, short what, void *arg)
{
    node_t *n = arg;
    if (!n->stopped && !n->dead && n->reg != NULL) {
        hpd_rpc_buf_t b;
        hpd_rpc_buf_init(&b);
        hpd_msg_pack(&hpd_msg_alive, &(hpd_msg_alive_t){.node_id = n->node_id,
                                                         .key = n->alive_key},
                     &b.pk);
        if (hpd_rpc_call(n->reg, "alive", &b, CALL_TIMEOUT_MS, ignore_reply, n) == HPD_OK)
            n->sim->st.pings++;
        hpd_rpc_buf_destroy(&b);
    }
    const struct timeval tv = {n->alive_ms / 1000, (n->alive_ms % 1000) * 1000};
    evtimer_add(n->ping, &tv);
}

static void on_registered(void *arg, hpd_status_t st, const hpd_rpc_msg_t *reply)
{
    node_t *n = arg;
    hpd_msg_registered_t m = {0};
    hpd_proto_err_t err;
    if (st != HPD_OK && !n->dead) {
        /* no answer (its connection was turned away: a coordinator keeps
         * few unauthenticated ones while hundreds of nodes register at
         * once): again on a new connection after a random wait, as a real
         * node does */
        uint64_t x = n->sim->p.seed * 131 + n->index * 7 + n->attempts;
        x = mix(x, n->attempts);
        const double wait_ms = 20.0 * (1u << HPD_MIN(n->attempts, 5u)) * (1.0 + (x % 1000) / 1000.0);
        const struct timeval tv = {(time_t)(wait_ms / 1000), (suseconds_t)fmod(wait_ms * 1000, 1e6)};
        evtimer_add(n->retry, &tv);
        return;
    }
    if (st != HPD_OK || reply->is_error) {
        n->refused = true;
        snprintf(n->why, sizeof(n->why), "%s: %.*s", n->name,
                 st != HPD_OK ? 20 : (int)reply->error_message_len,
                 st != HPD_OK ? hpd_status_str(st) : reply->error_message);
        return;
    }
    if (!hpd_msg_unpack(&hpd_msg_registered, reply->result, &m, &err)) {
        n->refused = true;
        snprintf(n->why, sizeof(n->why), "%s: registered: %s", n->name, err.text);
        return;
    }
    n->node_id = m.node_id;
    n->alive_key = m.alive_key;
    n->heartbeat_ms = m.heartbeat_ms > 0 ? m.heartbeat_ms : 1000;
    n->alive_ms = m.alive_ms > 0 ? m.alive_ms : 100;
    n->registered = true;
    on_heartbeat(-1, 0, n);
    if (n->alive_key != 0)
        on_ping(-1, 0, n);
}

static void on_reg_notify(void *arg, const hpd_rpc_msg_t *msg) {}

/* What a node registers: its RPC port, the model's fingerprint (the same
 * for every simulated node), a UCX address of version 0 (it passes the
 * coordinator's checks; nothing is ever put to it) and two regions. */
static void pack_register(node_t *n, hpd_rpc_buf_t *info, hpd_rpc_buf_t *b)
{
    const hpd_sim_params_t *p = &n->sim->p;
    uint8_t address[32], rkey[8] = {1};
    memset(address, 0x11, sizeof(address));
    address[0] = 0x00;
    hpd_rpc_buf_init(info);
    msgpack_pack_map(&info->pk, 3);
    hpd_proto_kv_u64(&info->pk, "node", (uint64_t)n->index + 1);
    hpd_rpc_pack_str(&info->pk, "address");
    msgpack_pack_bin(&info->pk, sizeof(address));
    msgpack_pack_bin_body(&info->pk, address, sizeof(address));
    hpd_rpc_pack_str(&info->pk, "regions");
    msgpack_pack_array(&info->pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_array(&info->pk, 3);
        msgpack_pack_uint64(&info->pk, (uint64_t)(i + 1) << 20);
        msgpack_pack_uint64(&info->pk, 1 << 20);
        msgpack_pack_bin(&info->pk, sizeof(rkey));
        msgpack_pack_bin_body(&info->pk, rkey, sizeof(rkey));
    }
    hpd_msg_register_t m = {.port = hpd_rpc_server_port(n->server),
                            .fingerprint = fp,
                            .fingerprint_len = 16,
                            .vocab = p->vocab,
                            .max_context = p->max_context,
                            .layout = {.block_size = BLOCK, .pack_size = 1, .order = HPD_KV_NHD},
                            .kv_layers = 2,
                            .pages = p->pages,
                            .slots = p->slots,
                            .max_batch = p->slots,
                            .xfer_raw = info->sb.data,
                            .xfer_raw_len = (uint32_t)info->sb.size};
    snprintf(m.role, sizeof(m.role), "%s", n->prefill ? "prefill" : "decode");
    snprintf(m.name, sizeof(m.name), "%s", n->name);
    snprintf(m.host, sizeof(m.host), "127.0.0.1");
    hpd_rpc_buf_init(b);
    hpd_msg_pack(&hpd_msg_register, &m, &b->pk);
}

static hpd_status_t register_now(node_t *n);
static void on_retry(evutil_socket_t fd, short what, void *arg);

static hpd_status_t node_start(node_t *n)
{
    static const hpd_rpc_method_t prefill_methods[] = {{.name = "prefill", .fn = m_prefill},
                                                       {.name = "cancel", .fn = m_cancel}};
    static const hpd_rpc_method_t decode_methods[] = {{.name = "reserve", .fn = m_reserve},
                                                      {.name = "start", .fn = m_start},
                                                      {.name = "cancel", .fn = m_cancel}};
    const hpd_sim_params_t *p = &n->sim->p;
    hpd_status_t st;
    const hpd_rpc_server_params_t sp = {
        .base = p->base,
        .host = "127.0.0.1",
        .token = p->token,
        .methods = n->prefill ? prefill_methods : decode_methods,
        .n_methods = n->prefill ? HPD_ARRAY_SIZE(prefill_methods) : HPD_ARRAY_SIZE(decode_methods),
        .arg = n};
    if ((st = hpd_rpc_server_create(&sp, &n->server)) != HPD_OK)
        return st;
    n->heartbeat = evtimer_new(p->base, on_heartbeat, n);
    n->ping = evtimer_new(p->base, on_ping, n);
    n->step = evtimer_new(p->base, on_step, n);
    n->retry = evtimer_new(p->base, on_retry, n);
    if (n->heartbeat == NULL || n->ping == NULL || n->step == NULL || n->retry == NULL)
        return HPD_ERR_NO_MEMORY;
    return register_now(n);
}

/* A new connection to the coordinator and its register call. */
static hpd_status_t register_now(node_t *n)
{
    const hpd_sim_params_t *p = &n->sim->p;
    hpd_status_t st;
    hpd_rpc_client_destroy(n->reg);
    n->reg = NULL;
    const hpd_rpc_client_params_t cp = {.base = p->base, .host = p->coord_host,
                                        .port = p->coord_port, .token = p->token,
                                        .timeout_ms = CALL_TIMEOUT_MS,
                                        .on_notify = on_reg_notify, .arg = n};
    if ((st = hpd_rpc_client_connect(&cp, &n->reg)) != HPD_OK)
        return st;
    n->attempts++;
    hpd_rpc_buf_t info, b;
    pack_register(n, &info, &b);
    st = hpd_rpc_call(n->reg, "register", &b, CALL_TIMEOUT_MS, on_registered, n);
    hpd_rpc_buf_destroy(&b);
    hpd_rpc_buf_destroy(&info);
    return st;
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    node_t *n = arg;
    if (!n->dead && register_now(n) != HPD_OK) {
        n->refused = true;
        snprintf(n->why, sizeof(n->why), "%s: cannot connect to the coordinator", n->name);
    }
}

/* The node's process ends: its connections close, its jobs go. */
static void node_die(node_t *n)
{
    n->dead = true; /* before its client goes: its failed calls see it */
    /* its cache is gone: an ideal router no longer counts it */
    const uint32_t cap = n->sim->p.cache_blocks;
    for (uint32_t i = 0; i < n->cache.n; i++)
        holders_add(n->sim, block_key(&n->cache.ring[(n->cache.at + cap - n->cache.n + i) % cap]),
                    -1);
    n->cache.n = 0;
    hpd_u64map_free(&n->cache.held);
    while (n->jobs != NULL)
        job_free(n->jobs);
    struct event *evs[] = {n->heartbeat, n->ping, n->step, n->retry};
    for (size_t i = 0; i < HPD_ARRAY_SIZE(evs); i++)
        if (evs[i] != NULL)
            event_free(evs[i]);
    n->heartbeat = n->ping = n->step = n->retry = NULL;
    hpd_rpc_client_destroy(n->reg);
    hpd_rpc_server_destroy(n->server);
    n->reg = NULL;
    n->server = NULL;
    n->coord_conn = NULL;
    n->dead = true;
}

/* ------------------------------------------------------------ the simulator */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

hpd_status_t hpd_sim_create(const hpd_sim_params_t *params, hpd_sim_t **sim_p)
{
    hpd_status_t st = HPD_ERR_NO_MEMORY;
    hpd_sim_t *s = calloc(1, sizeof(*s));
    *sim_p = NULL;
    if (s == NULL)
        return HPD_ERR_NO_MEMORY;
    s->p = *params;
    if (s->p.name_prefix == NULL)
        s->p.name_prefix = "sim";
    s->n_nodes = params->n_prefill + params->n_decode;
    s->served_cap = SERVED_MIN;
    hpd_prefix_hash_root(fp, &s->root);
    hpd_u64map_init(&s->holders);
    if ((s->nodes = calloc(s->n_nodes ? s->n_nodes : 1, sizeof(*s->nodes))) == NULL ||
        (s->served = calloc(s->served_cap, sizeof(*s->served))) == NULL)
        goto err;
    uint64_t rng = params->seed;
    for (uint32_t i = 0; i < s->n_nodes; i++) {
        node_t *n = &s->nodes[i];
        n->sim = s;
        n->index = i;
        n->prefill = i < params->n_prefill;
        const double u = (double)(splitmix(&rng) >> 11) / 9007199254740992.0;
        n->speed = 1.0 + params->speed_spread * (2 * u - 1);
        snprintf(n->name, sizeof(n->name), "%s-%c%u", s->p.name_prefix, n->prefill ? 'p' : 'd',
                 n->prefill ? i : i - params->n_prefill);
        if ((st = node_start(n)) != HPD_OK) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: cannot start: %s", n->name, hpd_status_str(st));
            goto err;
        }
    }
    *sim_p = s;
    return HPD_OK;
err:
    hpd_sim_destroy(s);
    return st;
}

void hpd_sim_destroy(hpd_sim_t *sim)
{
    if (sim == NULL)
        return;
    for (uint32_t i = 0; sim->nodes != NULL && i < sim->n_nodes; i++)
        if (!sim->nodes[i].dead)
            node_die(&sim->nodes[i]);
    for (uint32_t i = 0; sim->nodes != NULL && i < sim->n_nodes; i++) {
        hpd_u64map_free(&sim->nodes[i].cache.held);
        free(sim->nodes[i].cache.ring);
    }
    hpd_u64map_free(&sim->holders);
    while (sim->doors != NULL) {
        sim_door_t *d = sim->doors;
        sim->doors = d->next;
        hpd_rpc_client_destroy(d->client);
        free(d);
    }
    free(sim->nodes);
    free(sim->served);
    free(sim);
}

uint32_t hpd_sim_registered(const hpd_sim_t *sim)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < sim->n_nodes; i++)
        k += sim->nodes[i].registered;
    return k;
}

uint32_t hpd_sim_refused(const hpd_sim_t *sim, char *why, size_t len)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < sim->n_nodes; i++)
        if (sim->nodes[i].refused && k++ == 0)
            snprintf(why, len, "%s", sim->nodes[i].why);
    return k;
}

const char *hpd_sim_node_name(const hpd_sim_t *sim, uint32_t node)
{
    return node < sim->n_nodes ? sim->nodes[node].name : "";
}

double hpd_sim_reserved_at(const hpd_sim_t *sim, uint64_t key)
{
    const served_t *e = served_slot((hpd_sim_t *)sim, key);
    return e->key == key ? e->t_reserve : 0;
}

uint64_t hpd_sim_node_done(const hpd_sim_t *sim, uint32_t node)
{
    return node < sim->n_nodes ? sim->nodes[node].done : 0;
}

bool hpd_sim_node_prefill(const hpd_sim_t *sim, uint32_t node)
{
    return node < sim->n_nodes && sim->nodes[node].prefill;
}

hpd_status_t hpd_sim_fault(hpd_sim_t *sim, uint32_t node, hpd_sim_fault_t fault, double factor)
{
    if (node >= sim->n_nodes || sim->nodes[node].dead)
        return HPD_ERR_INVALID_ARG;
    node_t *n = &sim->nodes[node];
    HPD_LOG_INFO(LOG_COMPONENT, "%s: fault %d", n->name, (int)fault);
    switch (fault) {
    case HPD_SIM_STOP: n->stopped = true; break;
    case HPD_SIM_RESUME:
        n->stopped = false;
        arm_step(n);
        break;
    case HPD_SIM_DIE: node_die(n); break;
    case HPD_SIM_SLOW:
        if (!(factor > 0))
            return HPD_ERR_INVALID_ARG;
        n->speed /= factor;
        break;
    case HPD_SIM_BAD_NOTICE: n->bad_notice = true; break;
    default: return HPD_ERR_INVALID_ARG;
    }
    return HPD_OK;
}

void hpd_sim_stats(const hpd_sim_t *sim, hpd_sim_stats_t *stats_p)
{
    *stats_p = sim->st;
}
