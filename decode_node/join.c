#include "decode_node/join.h"

hpd_join_plan_t hpd_join_event(hpd_join_t *j, hpd_join_event_t ev)
{
    hpd_join_plan_t p = {.verdict = HPD_JOIN_IGNORE};
    switch (ev) {
    case HPD_JOIN_EV_NOTICE:
    case HPD_JOIN_EV_BAD_NOTICE:
        if (j->state == HPD_JOIN_FENCED) {
            p.verdict = HPD_JOIN_FREE; /* the writer has flushed: nothing more can land */
        } else if (j->state == HPD_JOIN_RESERVED && !j->have_notice) {
            if (ev == HPD_JOIN_EV_BAD_NOTICE) {
                p.verdict = HPD_JOIN_FAIL;
            } else {
                j->have_notice = true;
                p.verdict = j->have_start ? HPD_JOIN_RUN : HPD_JOIN_WAIT;
            }
        }
        break;
    case HPD_JOIN_EV_START:
        if (j->state != HPD_JOIN_RESERVED || j->have_start) {
            p.verdict = HPD_JOIN_REFUSE;
        } else {
            j->have_start = true;
            p.verdict = j->have_notice ? HPD_JOIN_RUN : HPD_JOIN_WAIT;
        }
        break;
    case HPD_JOIN_EV_TIMER:
        if (j->state == HPD_JOIN_FENCED) {
            p.verdict = HPD_JOIN_FREE;
            p.backstop = true;
        } else if (j->state == HPD_JOIN_RESERVED) {
            p.verdict = j->have_notice ? HPD_JOIN_EXPIRE : HPD_JOIN_FENCE;
        }
        break;
    case HPD_JOIN_EV_CANCEL:
    case HPD_JOIN_EV_CANCEL_WRITER:
        p.verdict = HPD_JOIN_FREE;
        p.close_writer = ev == HPD_JOIN_EV_CANCEL_WRITER && !j->have_notice;
        break;
    }
    if (p.verdict == HPD_JOIN_RUN)
        j->state = HPD_JOIN_RUNNING;
    else if (p.verdict == HPD_JOIN_FENCE)
        j->state = HPD_JOIN_FENCED;
    return p;
}
