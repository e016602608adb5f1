/* The UCX data plane between two processes on this machine: a request's KV
 * pages and GDN state pushed group by group from layout B=64,P=1,NHD into a
 * receiver's B=16,P=4,HND pages and slot, over tcp (loopback) and shared
 * memory; the receiver's bytes equal a local translation. A corrupted
 * checksum is caught; killing the receiver mid-transfer fails the sender's
 * transfer promptly and leaves nothing in flight. The mirror cases give the
 * receiver pools in "device" memory (the CPU backend posing as a device,
 * host_memory false) that UCX cannot write: peers write a host mirror, and
 * only a verified transfer reaches the pools. The direct cases register
 * such pools as they are (as where UCX writes GPU memory): the receiver
 * hashes what landed through the backend's hash_pieces op (on a GPU, its
 * kernel), never reading the pools back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/util.h"
#include "tests/test_helpers.h"
#include "node/kv_push.h"
#include "transport/xfer.h"

enum { A = 4, NKV = 2, HD = 16, TOKENS = 200, GDN_LAYERS = 3, LAYER_BYTES = 4096 };

static hpd_kv_layout_t src_layout = {.block_size = 64,
                                     .pack_size = 1,
                                     .order = HPD_KV_NHD,
                                     .dtype = HPD_DTYPE_F32,
                                     .n_layers = A,
                                     .n_kv_heads = NKV,
                                     .head_dim = HD};
static hpd_kv_layout_t dst_layout = {.block_size = 16,
                                     .pack_size = 4,
                                     .order = HPD_KV_HND,
                                     .dtype = HPD_DTYPE_F32,
                                     .n_layers = A,
                                     .n_kv_heads = NKV,
                                     .head_dim = HD};

/* ---- a length-prefixed msgpack message over a socket */

static void send_msg(int fd, const hpd_rpc_buf_t *b)
{
    uint32_t n = (uint32_t)b->sb.size;
    assert_int_equal(write(fd, &n, 4), 4);
    assert_int_equal(write(fd, b->sb.data, n), (ssize_t)n);
}

static char *recv_msg(int fd, msgpack_zone *z, msgpack_object *o)
{
    uint32_t n;
    size_t off = 0, got = 0;
    if (read(fd, &n, 4) != 4)
        return NULL;
    char *buf = malloc(n);
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0) {
            free(buf);
            return NULL;
        }
        got += (size_t)r;
    }
    msgpack_unpack(buf, n, &off, z, o);
    return buf;
}

/* ---- the sender's synthetic KV and state */

static void fill_source(float *pool, uint32_t **tables_store, const uint32_t **tables)
{
    const uint32_t blocks = (TOKENS + 63) / 64;
    static uint32_t ids[A][8];
    for (uint32_t g = 0; g < A; g++) {
        for (uint32_t j = 0; j < blocks; j++)
            ids[g][j] = (g * blocks + j) * 7 % (A * blocks); /* scrambled, distinct */
        tables[g] = ids[g];
    }
    (void)tables_store;
    test_fill(pool, (size_t)A * blocks * hpd_kv_layout_page_elems(&src_layout), 2024, 1.0f);
}

static void fill_state(uint8_t *state)
{
    for (uint32_t i = 0; i < GDN_LAYERS * LAYER_BYTES; i++)
        state[i] = (uint8_t)(hpd_philox4x32(99, i, 0).v[0]);
}

/* ---- the receiver (child) */

typedef struct {
    bool done;
    hpd_status_t status;
    bool peer_failed;
} rx_t;

static void rx_notice(void *arg, const hpd_xfer_notice_t *n)
{
    rx_t *r = arg;
    r->done = true;
    r->status = n->status;
}

static void rx_peer_error(void *arg, hpd_xfer_peer_t *peer, hpd_status_t st)
{
    ((rx_t *)arg)->peer_failed = true;
}

enum { DST_PAGES = 64, SLOTS = 4, BIG = 64 << 20 };

/* Every wait ends: a generous deadline (nothing here takes more than a few
 * seconds even on two loaded cores), after which the test fails naming what
 * it waited for. */
#define DEADLINE_S 120.0

/* Runs base (without blocking) until cond holds; `also` runs each round.
 * Fails the test at the deadline. */
#define PROGRESS_UNTIL(base, cond, also)                                                    \
    do {                                                                                    \
        const double t0_ = hpd_time_now();                                                  \
        while (!(cond)) {                                                                   \
            if (hpd_time_now() - t0_ > DEADLINE_S)                                          \
                fail_msg("no '%s' after %.0f s", #cond, DEADLINE_S);                        \
            event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);                           \
            also;                                                                           \
            usleep(500);                                                                    \
        }                                                                                   \
    } while (0)

static bool mirrored;  /* the receiver's pools sit behind a host mirror */
static bool direct;    /* the receiver's "device" pools are written directly */
static bool ucx_pools; /* the receiver's regions are allocated through UCX */
static bool ucx_puts;  /* the sender puts through UCX even into mapped regions */

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

/* The posing device's hash_pieces op: each piece's XXH3-64, the spans
 * counted. */
static uint64_t spans_hashed;
static hpd_status_t posing_hash_pieces(hpd_backend_t *b, const hpd_hash_pieces_args_t *a)
{
    (void)b;
    uint64_t k = 0;
    for (uint32_t i = 0; i < a->n_spans; i++, spans_hashed++)
        for (uint64_t off = 0; off < a->spans[i].bytes; off += 65536)
            a->out[k++] = XXH3_64bits((const uint8_t *)a->spans[i].ptr + off,
                                      HPD_MIN(65536, a->spans[i].bytes - off));
    return HPD_OK;
}

/* Exit status: 0 bytes verified, 3 checksum mismatch seen, 1 anything else. */
static int receiver(int fd, const char *tls, const char *dev)
{
    struct event_base *base = event_base_new();
    rx_t rx = {0};
    hpd_xfer_params_t xp = {.base = base, .node_id = 2, .tls = tls, .net_devices = dev,
                            .direct_pools = direct, .on_notice = rx_notice, .on_peer_error = rx_peer_error, .arg = &rx};
    hpd_xfer_ctx_t *ctx;
    uint32_t pool_region, slot_region, big_region;
    const uint64_t page_bytes = hpd_kv_layout_page_bytes(&dst_layout);
    const uint64_t slot_bytes = GDN_LAYERS * LAYER_BYTES;
    uint8_t *pool, *slots, *big;

    /* the pools' backend: the CPU's, or the CPU's posing as a device */
    hpd_backend_t *cpu, posing;
    hpd_backend_params_t cp = {.device = "cpu", .n_threads = 1};
    hpd_backend_ops_t dev_ops;
    if (hpd_backend_cpu_create(&cp, &cpu) != HPD_OK)
        return 1;
    dev_ops = *cpu->ops;
    dev_ops.name = "posing-device";
    dev_ops.host_memory = !mirrored && !direct;
    if (direct) { /* the pools are hashed where they are, never read back */
        dev_ops.hash_pieces = posing_hash_pieces;
        dev_ops.to_host = NULL;
    }
    posing = (hpd_backend_t){&dev_ops, cpu->ctx};
    if (hpd_xfer_create(&xp, &ctx) != HPD_OK)
        return 1;
    if (ucx_pools) {
        if (hpd_xfer_alloc(ctx, DST_PAGES * page_bytes, (void **)&pool, &pool_region) != HPD_OK ||
            hpd_xfer_alloc(ctx, SLOTS * slot_bytes, (void **)&slots, &slot_region) != HPD_OK ||
            hpd_xfer_alloc(ctx, BIG, (void **)&big, &big_region) != HPD_OK)
            return 1;
        memset(pool, 0, DST_PAGES * page_bytes);
        memset(slots, 0, SLOTS * slot_bytes);
    } else if ((pool = calloc(DST_PAGES, page_bytes)) == NULL ||
               (slots = calloc(SLOTS, slot_bytes)) == NULL || (big = calloc(1, BIG)) == NULL ||
               hpd_xfer_register_pool(ctx, &posing, pool, DST_PAGES * page_bytes,
                                      &pool_region) != HPD_OK ||
               hpd_xfer_register_pool(ctx, &posing, slots, SLOTS * slot_bytes, &slot_region) !=
                   HPD_OK ||
               hpd_xfer_register(ctx, big, BIG, &big_region) != HPD_OK)
        return 1;
    /* the reservation: scrambled page ids per group, slot 2 */
    const uint32_t groups = hpd_kv_layout_n_groups(&dst_layout);
    const uint32_t k = (TOKENS + 15) / 16;
    uint32_t ids[4][64];
    for (uint32_t g = 0; g < groups; g++)
        for (uint32_t j = 0; j < k; j++)
            ids[g][j] = DST_PAGES - 1 - (j * groups + g);
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    msgpack_pack_map(&b.pk, 3);
    hpd_rpc_pack_str(&b.pk, "info");
    hpd_xfer_pack_info(ctx, &b);
    hpd_rpc_pack_str(&b.pk, "pages");
    msgpack_pack_array(&b.pk, groups * k);
    for (uint32_t g = 0; g < groups; g++)
        for (uint32_t j = 0; j < k; j++)
            msgpack_pack_uint32(&b.pk, ids[g][j]);
    hpd_rpc_pack_str(&b.pk, "slot");
    msgpack_pack_uint32(&b.pk, 2);
    send_msg(fd, &b);
    hpd_rpc_buf_destroy(&b);
    /* the sender's info, to watch it too */
    msgpack_zone z;
    msgpack_object o;
    msgpack_zone_init(&z, 1024);
    char *raw = recv_msg(fd, &z, &o);
    hpd_xfer_peer_t *back;
    if (raw == NULL || hpd_xfer_connect(ctx, &o, &back) != HPD_OK)
        return 1;
    /* (a forked child: no cmocka here, a timeout is exit status 1) */
    for (const double t0 = hpd_time_now(); !rx.done && !rx.peer_failed;) {
        if (hpd_time_now() - t0 > DEADLINE_S)
            return 1;
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(500);
    }
    if (!rx.done)
        return 1;
    if (rx.status == HPD_ERR_FORMAT)
        /* behind a mirror, nothing of a bad transfer reaches the pools */
        return !mirrored || (all_zero(pool, DST_PAGES * page_bytes) &&
                             all_zero(slots, SLOTS * slot_bytes)) ? 3 : 1;
    if (rx.status != HPD_OK)
        return 1;

    /* what a local translation gives */
    const uint32_t src_blocks = (TOKENS + 63) / 64;
    float *src = malloc((size_t)A * src_blocks * hpd_kv_layout_page_bytes(&src_layout));
    const uint32_t *src_tables[A], *dst_tables[4];
    fill_source(src, NULL, src_tables);
    uint8_t *expect = calloc(DST_PAGES, page_bytes);
    memcpy(expect, pool, DST_PAGES * page_bytes); /* untouched pages compare equal */
    for (uint32_t g = 0; g < groups; g++)
        dst_tables[g] = ids[g];
    hpd_backend_t *be;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_cpu_create(&bp, &be);
    hpd_kv_translate_args_t t = {
        .src = {.layout = &src_layout, .pool = src, .tables = src_tables},
        .dst = {.layout = &dst_layout, .pool = expect, .tables = dst_tables},
        .n_tokens = TOKENS,
        .zero_tail = true};
    if (hpd_kv_translate(be, &t) != HPD_OK || memcmp(expect, pool, DST_PAGES * page_bytes) != 0)
        return 1;
    uint8_t state[GDN_LAYERS * LAYER_BYTES];
    fill_state(state);
    if (memcmp(slots + 2 * slot_bytes, state, slot_bytes) != 0)
        return 1;
    hpd_backend_destroy(be);
    hpd_xfer_destroy(ctx);
    hpd_backend_destroy(cpu);
    /* direct: every destination hashed by the backend (a run per notice) */
    return direct && spans_hashed != (uint64_t)groups * k + GDN_LAYERS ? 1 : 0;
}

/* ---- the sender (this process) */

typedef struct {
    bool done;
    hpd_status_t status;
} tx_t;

static void tx_done(void *arg, uint64_t id, hpd_status_t st)
{
    tx_t *t = arg;
    t->done = true;
    t->status = st;
}

typedef enum { RUN_OK, RUN_CORRUPT, RUN_KILL, RUN_KILL_EARLY } mode_t_;

/* On transports that cannot tell that a peer died (shared memory), a node
 * learns it from the control plane (in the cluster: the RPC connection or the
 * lease); here the receiver's exit status plays that part, and the sender
 * disconnects the peer, which fails its transfers. */
typedef struct {
    hpd_xfer_peer_t *peer;
    pid_t pid;
    bool lost;
    int status;
} link_t;

static bool link_check(link_t *l)
{
    if (!l->lost && waitpid(l->pid, &l->status, WNOHANG) == l->pid) {
        l->lost = true;
        hpd_xfer_disconnect(l->peer);
    }
    return l->lost;
}

static void run(const char *tls, const char *dev, mode_t_ mode)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        close(sv[0]);
        _exit(receiver(sv[1], tls, dev));
    }
    close(sv[1]);

    struct event_base *base = event_base_new();
    hpd_xfer_params_t xp = {.base = base, .node_id = 1, .tls = tls, .net_devices = dev,
                            .ucx_puts = ucx_puts};
    hpd_xfer_ctx_t *ctx;
    hpd_xfer_peer_t *peer;
    msgpack_zone z;
    msgpack_object o;
    uint32_t staging_region, src_region, state_region;

    assert_int_equal(hpd_xfer_create(&xp, &ctx), HPD_OK);
    msgpack_zone_init(&z, 4096);
    char *raw = recv_msg(sv[0], &z, &o);
    assert_non_null(raw);
    assert_int_equal(hpd_xfer_connect(ctx, hpd_rpc_map_get(&o, "info"), &peer), HPD_OK);
    if (mode == RUN_KILL_EARLY) {
        /* the receiver dies before it ever progressed UCX: the sender's
         * lanes are still being wired up, and its hello and then its bye
         * wait in them; UCX fails them when the connection breaks, and the
         * bye's flush completing closes the endpoint (UCX 1.13 read freed
         * memory where that close ran inside its callback) */
        int status;
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        hpd_xfer_disconnect(peer);
        hpd_xfer_stats_t s;
        hpd_xfer_stats(ctx, &s);
        PROGRESS_UNTIL(base, s.inflight == 0, (hpd_xfer_progress(ctx), hpd_xfer_stats(ctx, &s)));
        hpd_xfer_destroy(ctx);
        event_base_free(base);
        msgpack_zone_destroy(&z);
        free(raw);
        close(sv[0]);
        return;
    }
    hpd_rpc_buf_t b;
    hpd_rpc_buf_init(&b);
    hpd_xfer_pack_info(ctx, &b);
    send_msg(sv[0], &b);
    hpd_rpc_buf_destroy(&b);

    const msgpack_object *pages = hpd_rpc_map_get(&o, "pages");
    const uint32_t groups = hpd_kv_layout_n_groups(&dst_layout), k = (TOKENS + 15) / 16;
    assert_int_equal(pages->via.array.size, groups * k);
    uint32_t ids[4][64];
    const uint32_t *dst_tables[4];
    for (uint32_t g = 0; g < groups; g++) {
        for (uint32_t j = 0; j < k; j++)
            ids[g][j] = (uint32_t)pages->via.array.ptr[g * k + j].via.u64;
        dst_tables[g] = ids[g];
    }
    const uint32_t slot = (uint32_t)hpd_rpc_map_get(&o, "slot")->via.u64;

    /* the sender's own KV and state, registered */
    const uint32_t src_blocks = (TOKENS + 63) / 64;
    const size_t src_bytes = (size_t)A * src_blocks * hpd_kv_layout_page_bytes(&src_layout);
    float *src = malloc(src_bytes);
    const uint32_t *src_tables[A];
    fill_source(src, NULL, src_tables);
    uint8_t state[GDN_LAYERS * LAYER_BYTES];
    fill_state(state);
    const size_t staging_bytes = (size_t)groups * k * hpd_kv_layout_page_bytes(&dst_layout);
    void *staging = malloc(staging_bytes);
    assert_int_equal(hpd_xfer_register(ctx, src, src_bytes, &src_region), HPD_OK);
    assert_int_equal(hpd_xfer_register(ctx, staging, staging_bytes, &staging_region), HPD_OK);
    assert_int_equal(hpd_xfer_register(ctx, state, sizeof(state), &state_region), HPD_OK);

    hpd_backend_t *be;
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 1};
    hpd_backend_cpu_create(&bp, &be);
    tx_t tx = {0};
    const double t0 = hpd_time_now();

    if (mode == RUN_KILL) {
        /* a long transfer into the receiver's big region, killed midway */
        const size_t chunk = 256 << 10;
        uint8_t *buf = calloc(1, chunk);
        link_t link = {peer, pid, false, 0};
        for (int i = 0; i < 256 && !hpd_xfer_peer_failed(peer) && !link_check(&link); i++) {
            hpd_xfer_put_t u = {
                .local = buf, .region = 2, .offset = (uint64_t)(i % 256) * chunk, .bytes = chunk};
            if (hpd_xfer_put(peer, 9, &u, 1) != HPD_OK)
                break;
            if (i == 8)
                kill(pid, SIGKILL);
            event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        }
        if (link.lost || hpd_xfer_finish(peer, 9, tx_done, &tx, false) != HPD_OK)
            tx.done = true, tx.status = HPD_ERR_IO;
        /* the transfer fails (the transport has no timeout of its own: it
         * learns of the death from the endpoint or from the link) */
        PROGRESS_UNTIL(base, tx.done, link_check(&link));
        print_message("%s: receiver killed, transfer failed after %.2f s: %s\n", tls,
                      hpd_time_now() - t0, hpd_status_str(tx.status));
        assert_int_not_equal(tx.status, HPD_OK);
        /* every transfer has ended; on tcp UCX also gave back every request
         * (a dead shared-memory peer's stay in UCX until the context goes) */
        if (!link.lost)
            hpd_xfer_disconnect(peer);
        const bool tcp = strcmp(tls, "tcp") == 0;
        hpd_xfer_stats_t s;
        hpd_xfer_stats(ctx, &s);
        PROGRESS_UNTIL(base, s.open_transfers == 0 && (!tcp || s.inflight == 0),
                       (hpd_xfer_progress(ctx), hpd_xfer_stats(ctx, &s)));
        free(buf);
    } else {
        /* layerwise: one destination pack group at a time, whole pages of
         * a first chunk then the rest (as prefill chunks complete), then
         * each GDN layer */
        const uint32_t split = TOKENS / 2 / dst_layout.block_size * dst_layout.block_size;
        for (uint32_t g = 0; g < groups; g++) {
            const hpd_kv_push_src_t one = {
                .span = {.layout = &src_layout, .pool = src, .tables = src_tables}};
            hpd_kv_push_args_t kv = {
                .backend = be,
                .srcs = &one,
                .n_srcs = 1,
                .first_token = 0,
                .n_tokens = split,
                .last = false,
                .dst_layout = &dst_layout,
                .dst_region = 0,
                .dst_tables = dst_tables,
                .staging = staging,
                .staging_pages = groups * k,
                .group = g};
            assert_int_equal(hpd_kv_push(peer, 5, &kv), HPD_OK);
            kv.first_token = split;
            kv.n_tokens = TOKENS;
            kv.last = true;
            assert_int_equal(hpd_kv_push(peer, 5, &kv), HPD_OK);
            /* a chunk that does not end on a page, or starts inside one, is refused */
            kv.first_token = 0;
            kv.n_tokens = split + 1;
            kv.last = false;
            assert_int_equal(hpd_kv_push(peer, 6, &kv), HPD_ERR_INVALID_ARG);
            kv.first_token = 1;
            assert_int_equal(hpd_kv_push(peer, 6, &kv), HPD_ERR_INVALID_ARG);
        }
        for (uint32_t l = 0; l < GDN_LAYERS; l++) {
            hpd_xfer_put_t u = {.local = state + l * LAYER_BYTES,
                                .region = 1,
                                .offset = (uint64_t)slot * sizeof(state) + l * LAYER_BYTES,
                                .bytes = LAYER_BYTES};
            assert_int_equal(hpd_xfer_put(peer, 5, &u, 1), HPD_OK);
        }
        /* a put outside the receiver's region is refused */
        hpd_xfer_put_t bad = {.local = state, .region = 1, .offset = 1ull << 40, .bytes = 16};
        assert_int_equal(hpd_xfer_put(peer, 6, &bad, 1), HPD_ERR_INVALID_ARG);
        assert_int_equal(hpd_xfer_finish(peer, 5, tx_done, &tx, mode == RUN_CORRUPT), HPD_OK);
        PROGRESS_UNTIL(base, tx.done, (void)0);
        assert_int_equal(tx.status, HPD_OK);
        /* UCX-allocated memory of a peer on this host is mapped here and
         * written directly; anything else goes through UCX puts */
        hpd_xfer_stats_t s;
        hpd_xfer_stats(ctx, &s);
        const bool shm = strcmp(tls, "tcp") != 0;
        print_message("%s: %llu of %llu bytes copied into mapped memory\n", tls,
                      (unsigned long long)s.bytes_mapped, (unsigned long long)s.bytes_put);
        assert_true(s.bytes_put > 0);
        assert_int_equal(s.bytes_mapped,
                         shm && (ucx_pools || mirrored) && !ucx_puts ? s.bytes_put : 0);
    }
    int status = 0;
    /* let the receiver check what landed; keep progressing meanwhile */
    if (mode != RUN_KILL)
        PROGRESS_UNTIL(base, waitpid(pid, &status, WNOHANG) == pid, (void)0);
    if (mode == RUN_OK) {
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    } else if (mode == RUN_CORRUPT) {
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 3);
    }
    hpd_backend_destroy(be);
    hpd_xfer_destroy(ctx);
    event_base_free(base);
    msgpack_zone_destroy(&z);
    free(raw);
    free(src);
    free(staging);
    close(sv[0]);
}

/* Every test sets all three knobs (an assertion leaves run() midway). */
typedef enum { MEM_MALLOC, MEM_MIRROR, MEM_DIRECT, MEM_UCX } rx_mem_t;
static void run_with(rx_mem_t mem, bool puts, const char *tls, const char *dev, mode_t_ mode)
{
    mirrored = mem == MEM_MIRROR;
    direct = mem == MEM_DIRECT;
    ucx_pools = mem == MEM_UCX;
    ucx_puts = puts;
    run(tls, dev, mode);
}

static void test_tcp(void **state) { run_with(MEM_MALLOC, false, "tcp", "lo", RUN_OK); }
static void test_shm(void **state) { run_with(MEM_MALLOC, false, "sm,self", NULL, RUN_OK); }
static void test_corrupt(void **state) { run_with(MEM_MALLOC, false, "tcp", "lo", RUN_CORRUPT); }
static void test_kill_receiver_tcp(void **state)
{
    run_with(MEM_MALLOC, false, "tcp", "lo", RUN_KILL);
}
static void test_kill_receiver_shm(void **state)
{
    run_with(MEM_MALLOC, false, "sm,self", NULL, RUN_KILL);
}
static void test_kill_receiver_early_tcp(void **state)
{
    run_with(MEM_MALLOC, false, "tcp", "lo", RUN_KILL_EARLY);
}
static void test_mirror_tcp(void **state) { run_with(MEM_MIRROR, false, "tcp", "lo", RUN_OK); }
static void test_mirror_shm(void **state) { run_with(MEM_MIRROR, false, "sm,self", NULL, RUN_OK); }
static void test_mirror_corrupt(void **state)
{
    run_with(MEM_MIRROR, false, "tcp", "lo", RUN_CORRUPT);
}
static void test_direct_tcp(void **state) { run_with(MEM_DIRECT, false, "tcp", "lo", RUN_OK); }
static void test_direct_corrupt(void **state)
{
    run_with(MEM_DIRECT, false, "tcp", "lo", RUN_CORRUPT);
}
static void test_mapped_shm(void **state) { run_with(MEM_UCX, false, "sm,self", NULL, RUN_OK); }
static void test_mapped_shm_ucx_puts(void **state)
{
    run_with(MEM_UCX, true, "sm,self", NULL, RUN_OK);
}
static void test_mapped_tcp(void **state) { run_with(MEM_UCX, false, "tcp", "lo", RUN_OK); }
static void test_mapped_corrupt(void **state)
{
    run_with(MEM_UCX, false, "sm,self", NULL, RUN_CORRUPT);
}
static void test_mapped_kill_receiver(void **state)
{
    run_with(MEM_UCX, false, "sm,self", NULL, RUN_KILL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp),
        cmocka_unit_test(test_shm),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_kill_receiver_tcp),
        cmocka_unit_test(test_kill_receiver_shm),
        cmocka_unit_test(test_kill_receiver_early_tcp),
        cmocka_unit_test(test_mirror_tcp),
        cmocka_unit_test(test_mirror_shm),
        cmocka_unit_test(test_mirror_corrupt),
        cmocka_unit_test(test_direct_tcp),
        cmocka_unit_test(test_direct_corrupt),
        cmocka_unit_test(test_mapped_shm),
        cmocka_unit_test(test_mapped_shm_ucx_puts),
        cmocka_unit_test(test_mapped_tcp),
        cmocka_unit_test(test_mapped_corrupt),
        cmocka_unit_test(test_mapped_kill_receiver),
    };
    if (getenv("HPD_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("HPD_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
