/* The data plane's receiver (transport/xfer.h): completion notices, the
 * checksum of what landed, the destinations a receiver allows, and the
 * writers it can close. */
#include "transport/xfer_internal.h"

/* ------------------------------------------------------------ receiver */

/* Device memory peers write through a host mirror (base) */
static bool mirrored(const region_t *r)
{
    return r->device != NULL && r->device != r->base;
}

/* Pieces a backend hashes in one call: 1 GiB of data, its pieces table
 * within a staging slot, so that however large a transfer (or a peer's
 * notice) no buffer grows with it. */
#define HASH_BATCH_PIECES 16384u

/* Folds the pieces' hashes of spans of backend memory into the checksum, in
 * calls of at most HASH_BATCH_PIECES pieces (a span cut at a piece edge). */
static hpd_status_t hash_backend_spans(hpd_backend_t *be, const hpd_hash_span_t *spans,
                                       uint32_t n, XXH3_state_t *sum)
{
    hpd_hash_span_t batch[64];
    uint64_t *pieces = malloc(HASH_BATCH_PIECES * sizeof(*pieces));
    hpd_status_t st = pieces == NULL ? HPD_ERR_NO_MEMORY : HPD_OK;
    uint32_t nb = 0;
    uint64_t np = 0, done = 0; /* done: bytes of spans[i] already in a batch */

    for (uint32_t i = 0; i < n && st == HPD_OK;) {
        const uint64_t left = spans[i].bytes - done;
        const uint64_t take = HPD_MIN(left, (HASH_BATCH_PIECES - np) * HPD_HASH_PIECE_BYTES);
        if (take > 0) {
            batch[nb++] = (hpd_hash_span_t){(const uint8_t *)spans[i].ptr + done, take};
            np += hpd_hash_n_pieces(take);
            done += take;
        }
        if (done == spans[i].bytes)
            i++, done = 0;
        if (np == HASH_BATCH_PIECES || nb == HPD_ARRAY_SIZE(batch) || (i == n && nb > 0)) {
            st = hpd_backend_hash_pieces(
                be, &(hpd_hash_pieces_args_t){.spans = batch, .n_spans = nb, .out = pieces});
            for (uint64_t k = 0; k < np && st == HPD_OK; k++)
                hpd_hash_fold(sum, pieces[k]);
            nb = 0, np = 0;
        }
    }
    if (st != HPD_OK)
        HPD_LOG_ERROR(LOG_COMPONENT, "hashing %u received ranges in %s memory: %s", n,
                      be->ops->name, hpd_status_str(st));
    free(pieces);
    return st;
}

/* Adds the destinations' bytes to the checksum, piece by piece
 * (common/hash.h): host memory (a device pool's host mirror too) is hashed
 * here; device memory UCX wrote directly is hashed by its backend, on the
 * GPU where it lives, consecutive destinations of one backend together.
 * The destinations were checked against their regions. */
static hpd_status_t hash_dests(const hpd_xfer_ctx_t *c, const dest_t *d, uint32_t n,
                               XXH3_state_t *sum)
{
    hpd_hash_span_t *run = malloc((n ? n : 1) * sizeof(*run));
    hpd_backend_t *run_backend = NULL;
    uint32_t n_run = 0;
    hpd_status_t st = run == NULL ? HPD_ERR_NO_MEMORY : HPD_OK;

    for (uint32_t i = 0; i <= n && st == HPD_OK; i++) {
        dest_t e = {0};
        const region_t *r = NULL;
        bool direct = false;
        if (i < n) {
            memcpy(&e, d + i, sizeof(e));
            r = &c->regions[e.region];
            direct = r->device != NULL && !mirrored(r);
        }
        if (n_run > 0 && (i == n || !direct || r->backend != run_backend)) {
            st = hash_backend_spans(run_backend, run, n_run, sum);
            n_run = 0;
        }
        if (i == n || st != HPD_OK)
            continue;
        const uint8_t *bytes = (const uint8_t *)r->base + e.offset;
        if (direct) {
            run[n_run++] = (hpd_hash_span_t){bytes, e.bytes};
            run_backend = r->backend;
        } else {
            hpd_hash_put(sum, bytes, e.bytes);
        }
    }
    free(run);
    return st;
}

/* Forgets writer i: the endpoint UCX made for it is never touched again
 * (its sentinel, if still posted, completes when the endpoint goes, and
 * finds nothing). */
static void forget_writer(hpd_xfer_ctx_t *c, uint32_t i)
{
    c->writers[i] = c->writers[--c->n_writers];
}

/* A writer's sentinel completed: UCX cancels the receives posted on an
 * endpoint when it fails or closes, before it destroys an endpoint it made
 * (and it does, with no other word: such an endpoint is not the
 * application's), so the writer is forgotten before anything touches the
 * endpoint again. */
static void on_sentinel(void *request, ucs_status_t status, size_t length, void *user_data)
{
    hpd_xfer_ctx_t *c = user_data;
    for (uint32_t i = 0; i < c->n_writers; i++)
        if (c->writers[i].sentinel == request) {
            HPD_LOG_INFO(LOG_COMPONENT, "the connection of node %llu, which wrote here, "
                         "ended (%s)", (unsigned long long)c->writers[i].node,
                         ucs_status_string(status));
            forget_writer(c, i);
            break;
        }
    ucp_request_free(request);
}

/* Posts writer i's sentinel: a stream receive on its endpoint that nothing
 * ever completes but the endpoint's end. Without one (UCX refused it) the
 * writer cannot be watched and is not kept. */
static void watch_writer(hpd_xfer_ctx_t *c, uint32_t i)
{
    size_t len = 0;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_stream = on_sentinel,
                              .user_data = c};
    c->writers[i].sentinel = NULL;
    ucs_status_ptr_t r = ucp_stream_recv_nbx(c->writers[i].ep, &c->sentinel_byte, 1, &len, &rp);
    if (r == NULL || UCS_PTR_IS_ERR(r)) {
        HPD_LOG_WARN(LOG_COMPONENT, "node %llu's connection cannot be watched (%s): it "
                     "cannot be closed from this side", (unsigned long long)c->writers[i].node,
                     r == NULL ? "stream data arrived" : ucs_status_string(UCS_PTR_STATUS(r)));
        forget_writer(c, i);
        return;
    }
    c->writers[i].sentinel = r;
}

/* Remembers the endpoint UCX made here for a sender (the latest one per
 * sender: a sender that connected again writes from the new one), watched
 * by a sentinel. */
static void note_writer(hpd_xfer_ctx_t *c, uint64_t sender, const ucp_am_recv_param_t *param)
{
    uint32_t i = 0;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL)
        return;
    while (i < c->n_writers && c->writers[i].node != sender)
        i++;
    if (i < c->n_writers && c->writers[i].ep == param->reply_ep)
        return; /* known and watched */
    if (i == HPD_ARRAY_SIZE(c->writers)) {
        HPD_LOG_WARN(LOG_COMPONENT, "more than %zu senders write here: node %llu's "
                     "connection cannot be closed from this side", HPD_ARRAY_SIZE(c->writers),
                     (unsigned long long)sender);
        return;
    }
    /* an older endpoint's sentinel stays posted: it completes with that
     * endpoint, and finds nothing */
    c->writers[i].node = sender;
    c->writers[i].ep = param->reply_ep;
    c->n_writers += i == c->n_writers;
    watch_writer(c, i);
}

/* The sender of a hello or a bye (magic) that came eagerly with UCX's
 * endpoint back to it; false for anything else. */
static bool read_marker(const void *header, size_t header_length,
                        const ucp_am_recv_param_t *param, uint64_t magic, uint64_t *sender_p)
{
    hello_hdr_t h;
    if (header_length != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL)
        return false;
    memcpy(&h, header, sizeof(h));
    *sender_p = h.sender;
    return h.magic == magic;
}

ucs_status_t hpd_xfer_on_hello(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    uint64_t sender;
    if (read_marker(header, header_length, param, HELLO_MAGIC, &sender))
        note_writer(arg, sender, param);
    return UCS_OK;
}

/* A sender closes its endpoint to here: the endpoint UCX made here for it
 * goes with it (UCX destroys an endpoint it made when its peer closes or
 * fails, UCX 1.22 at once), so it is forgotten now, before the close
 * arrives, and hpd_xfer_close_writer never touches it. A bye from an
 * older endpoint of a sender that connected again leaves the newer one. */
ucs_status_t hpd_xfer_on_bye(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param)
{
    hpd_xfer_ctx_t *c = arg;
    uint64_t sender;
    if (!read_marker(header, header_length, param, BYE_MAGIC, &sender))
        return UCS_OK;
    for (uint32_t i = 0; i < c->n_writers; i++)
        if (c->writers[i].node == sender && c->writers[i].ep == param->reply_ep) {
            forget_writer(c, i);
            break;
        }
    return UCS_OK;
}

ucs_status_t hpd_xfer_on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    hpd_xfer_ctx_t *c = arg;
    notice_hdr_t h;
    hpd_xfer_notice_t n;
    XXH3_state_t *state;
    const dest_t *d = data;

    if (header_length != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "completion notice of %zu header bytes dropped",
                      header_length);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if (h.magic == NOTICE_MAGIC)
        note_writer(c, h.sender, param);
    else if (h.magic == NOTICE_MAGIC_V1)
        HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu refused: its notice has the "
                      "checksum of an older release (one XXH3 over the bytes; this node expects "
                      "XXH3 of 64 KiB pieces): run one release across the cluster",
                      (unsigned long long)h.xfer_id, (unsigned long long)h.sender);
    n.sender = h.sender;
    n.xfer_id = h.xfer_id;
    n.bytes = h.bytes;
    n.status = HPD_OK;
    if (h.magic != NOTICE_MAGIC || length != (size_t)h.n_dests * sizeof(dest_t) ||
        (state = XXH3_createState()) == NULL) {
        n.status = HPD_ERR_FORMAT;
    } else {
        uint64_t total = 0, room = 0;
        XXH3_64bits_reset(state);
        for (uint32_t i = 0; i < c->n_regions; i++)
            room += c->regions[i].len;
        for (uint32_t i = 0; i < h.n_dests && n.status == HPD_OK; i++) {
            dest_t e;
            memcpy(&e, d + i, sizeof(e));
            if (e.region >= c->n_regions || e.offset > c->regions[e.region].len ||
                e.bytes > c->regions[e.region].len - e.offset)
                n.status = HPD_ERR_FORMAT;
            total += e.bytes;
            /* a transfer writes each byte once: more than every region
             * holds (destinations repeated to make the receiver hash
             * without end) is refused before anything is read */
            if (n.status == HPD_OK && total > room) {
                HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu refused: its "
                              "destinations add up to more than the %llu bytes of this node's "
                              "regions", (unsigned long long)h.xfer_id,
                              (unsigned long long)h.sender, (unsigned long long)room);
                n.status = HPD_ERR_FORMAT;
            }
        }
        if (n.status == HPD_OK && total == h.bytes && hash_dests(c, d, h.n_dests, state) != HPD_OK)
            n.status = HPD_ERR_IO;
        if (n.status == HPD_OK && (total != h.bytes || XXH3_64bits_digest(state) != h.checksum))
            n.status = HPD_ERR_FORMAT;
        XXH3_freeState(state);
        if (n.status == HPD_OK && c->p.check_dests != NULL) {
            hpd_xfer_dest_t *dests = malloc((h.n_dests ? h.n_dests : 1) * sizeof(*dests));
            if (dests == NULL) {
                n.status = HPD_ERR_NO_MEMORY;
            } else {
                for (uint32_t i = 0; i < h.n_dests; i++) {
                    dest_t e;
                    memcpy(&e, d + i, sizeof(e));
                    dests[i] =
                        (hpd_xfer_dest_t){.region = e.region, .offset = e.offset, .bytes = e.bytes};
                }
                if (!c->p.check_dests(c->p.arg, &n, dests, h.n_dests)) {
                    n.status = HPD_ERR_INVALID_ARG;
                    HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu wrote where it "
                                  "was not allowed to", (unsigned long long)h.xfer_id,
                                  (unsigned long long)h.sender);
                }
                free(dests);
            }
        }
        /* mirrored device pools: the verified bytes move to the device now */
        for (uint32_t i = 0; i < h.n_dests && n.status == HPD_OK; i++) {
            dest_t e;
            memcpy(&e, d + i, sizeof(e));
            const region_t *r = &c->regions[e.region];
            if (mirrored(r) &&
                hpd_backend_from_host(r->backend, (uint8_t *)r->device + e.offset,
                                      (const uint8_t *)r->base + e.offset, e.bytes) != HPD_OK)
                n.status = HPD_ERR_IO;
        }
    }
    if (n.status == HPD_OK)
        c->st.notices_ok++;
    else {
        c->st.notices_bad++;
        if (n.status != HPD_ERR_INVALID_ARG)
            HPD_LOG_ERROR(LOG_COMPONENT, "transfer %llu from node %llu failed its checks: %s",
                          (unsigned long long)h.xfer_id, (unsigned long long)h.sender,
                          hpd_status_str(n.status));
    }
    if (c->p.on_notice != NULL)
        c->p.on_notice(c->p.arg, &n);
    return UCS_OK;
}

static void on_writer_closed(void *request, ucs_status_t status, void *user_data)
{
    hpd_xfer_ctx_t *c = user_data;
    if (request != NULL)
        ucp_request_free(request);
    c->st.inflight--;
}

hpd_status_t hpd_xfer_close_writer(hpd_xfer_ctx_t *c, uint64_t node)
{
    for (uint32_t i = 0; i < c->n_writers; i++) {
        if (c->writers[i].node != node)
            continue;
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                  UCP_OP_ATTR_FIELD_USER_DATA |
                                                  UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE,
                                  .cb.send = on_writer_closed,
                                  .user_data = c};
        HPD_LOG_INFO(LOG_COMPONENT, "closing the connection of node %llu, which wrote here: "
                     "nothing it still sends lands", (unsigned long long)node);
        /* forgotten first: the close completes its sentinel, maybe at once */
        const ucp_ep_h ep = c->writers[i].ep;
        forget_writer(c, i);
        ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
        if (r != NULL && !UCS_PTR_IS_ERR(r))
            c->st.inflight++;
        c->st.writers_closed++;
        return HPD_OK;
    }
    return HPD_ERR_NOT_FOUND;
}
