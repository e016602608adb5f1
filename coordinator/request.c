#include "coordinator/request.h"

#include "transport/rpc.h"

hpd_req_fsm_t hpd_req_fsm_init(void)
{
    return (hpd_req_fsm_t){.state = HPD_REQ_QUEUED};
}

const char *hpd_req_state_name(hpd_req_state_t s)
{
    switch (s) {
    case HPD_REQ_QUEUED: return "queued";
    case HPD_REQ_RESERVING: return "reserving";
    case HPD_REQ_PREFILLING: return "prefilling";
    case HPD_REQ_DECODING: return "decoding";
    }
    return "?";
}

/* Undoes what the attempt holds and queues the request. */
static void abort_attempt(hpd_req_fsm_t *f, hpd_req_plan_t *p)
{
    p->unbook_decode |= f->on_decode;
    if (f->state == HPD_REQ_PREFILLING && f->on_prefill) {
        p->unbook_prefill = true;
        p->cancel_prefill = true;
        p->cancel_decode = f->on_decode; /* after the prefill node's answer */
        p->fence_writer = f->pair_failed;
    } else if (f->on_decode && f->state != HPD_REQ_QUEUED) {
        p->cancel_decode = true;
        p->fence_writer = f->state == HPD_REQ_PREFILLING && f->writer_lost;
    }
    f->state = HPD_REQ_QUEUED;
    f->on_decode = f->on_prefill = f->pair_failed = f->writer_lost = false;
}

static void retry(hpd_req_fsm_t *f, hpd_req_plan_t *p, uint32_t max_attempts)
{
    abort_attempt(f, p);
    if (++f->attempts >= max_attempts) {
        p->verdict = HPD_REQ_FAIL;
        p->code = HPD_RPC_ERR_APP;
        p->gave_up = true;
    } else {
        p->verdict = HPD_REQ_RETRY;
    }
}

hpd_req_plan_t hpd_req_fsm_event(hpd_req_fsm_t *f, hpd_req_event_t ev, uint32_t max_attempts)
{
    hpd_req_plan_t p = {.verdict = HPD_REQ_IGNORE};
    const hpd_req_state_t s = f->state;
    switch (ev) {
    case HPD_REQ_EV_PLACED:
        if (s == HPD_REQ_QUEUED) {
            f->state = HPD_REQ_RESERVING;
            f->on_decode = true;
            p.verdict = HPD_REQ_GO_ON;
        }
        break;
    case HPD_REQ_EV_RESERVED:
        if (s == HPD_REQ_RESERVING) {
            f->state = HPD_REQ_PREFILLING;
            f->on_prefill = true;
            p.verdict = HPD_REQ_GO_ON;
        }
        break;
    case HPD_REQ_EV_FULL:
        if (s == HPD_REQ_RESERVING) {
            abort_attempt(f, &p);
            p.verdict = HPD_REQ_WAIT;
        }
        break;
    case HPD_REQ_EV_REFUSED:
        if (s != HPD_REQ_DECODING) {
            abort_attempt(f, &p);
            p.verdict = HPD_REQ_FAIL;
            p.code = HPD_RPC_ERR_PARAMS;
        }
        break;
    case HPD_REQ_EV_PREFILLED:
        if (s == HPD_REQ_PREFILLING) {
            f->state = HPD_REQ_DECODING;
            f->on_prefill = false;
            p.unbook_prefill = true;
            p.verdict = HPD_REQ_GO_ON;
        }
        break;
    case HPD_REQ_EV_PAIR_FAILED:
        if (s == HPD_REQ_PREFILLING) {
            f->pair_failed = true;
            p.avoid_decode = true;
            p.pair_failure = true;
            retry(f, &p, max_attempts);
        }
        break;
    case HPD_REQ_EV_FAILED:
        if (s != HPD_REQ_QUEUED)
            retry(f, &p, max_attempts);
        break;
    case HPD_REQ_EV_PREFILL_LOST:
        /* once prefilled, the decode node has all it needs */
        if (s == HPD_REQ_PREFILLING) {
            f->on_prefill = false; /* what it held died with it */
            f->writer_lost = true;
            retry(f, &p, max_attempts);
        }
        break;
    case HPD_REQ_EV_DECODE_LOST:
        if (s != HPD_REQ_QUEUED && f->on_decode) {
            f->on_decode = false;
            retry(f, &p, max_attempts);
        }
        break;
    case HPD_REQ_EV_DECODE_ENDED:
        if (s != HPD_REQ_QUEUED && f->on_decode) {
            p.avoid_decode = true;
            if (s != HPD_REQ_PREFILLING) { /* the node freed it itself */
                f->on_decode = false;
                p.unbook_decode = true;
            } /* else its pages wait for the prefill node's answer (fence) */
            retry(f, &p, max_attempts);
        }
        break;
    case HPD_REQ_EV_DONE:
        if (s == HPD_REQ_DECODING) {
            p.unbook_decode = f->on_decode; /* the decode node freed it itself */
            f->on_decode = false;
            f->state = HPD_REQ_QUEUED;
            p.verdict = HPD_REQ_FINISH;
        }
        break;
    case HPD_REQ_EV_CANCEL:
        abort_attempt(f, &p);
        p.verdict = HPD_REQ_CANCELED;
        break;
    case HPD_REQ_EV_HEDGE_WON:
        abort_attempt(f, &p);
        p.verdict = HPD_REQ_FINISH;
        break;
    case HPD_REQ_EV_SHUTDOWN:
        abort_attempt(f, &p);
        p.verdict = HPD_REQ_FAIL;
        p.code = HPD_RPC_ERR_APP;
        break;
    case HPD_REQ_EV_TIMEOUT:
        if (s == HPD_REQ_QUEUED) {
            p.verdict = HPD_REQ_FAIL;
            p.code = HPD_RPC_ERR_OVERLOADED;
        }
        break;
    }
    return p;
}
