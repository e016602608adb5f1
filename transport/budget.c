#include "transport/budget.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "common/util.h"

struct hpd_conn_budget {
    pthread_mutex_t lock;
    uint32_t fd_limit, listeners, operator_fds;
    uint32_t used, operator_used;
    size_t held, max_held;
    uint64_t refused, held_refused;
};

hpd_status_t hpd_conn_budget_create(const hpd_conn_budget_params_t *p, hpd_conn_budget_t **b_p)
{
    hpd_conn_budget_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return HPD_ERR_NO_MEMORY;
    uint32_t limit = p->fd_limit;
    if (limit == 0) {
        struct rlimit rl;
        limit = 1024;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
            limit = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 65536 ? 65536
                                                                         : (uint32_t)rl.rlim_cur;
    }
    uint32_t keep = p->keep_fds ? p->keep_fds : HPD_MAX(64u, limit / 8);
    keep = HPD_MIN(keep, limit / 2);
    b->fd_limit = limit;
    b->listeners = limit - keep;
    b->operator_fds = HPD_MIN(p->operator_fds ? p->operator_fds : 8u, b->listeners / 2);
    b->max_held = p->max_held_bytes ? p->max_held_bytes : (size_t)16 << 20;
    pthread_mutex_init(&b->lock, NULL);
    *b_p = b;
    return HPD_OK;
}

void hpd_conn_budget_destroy(hpd_conn_budget_t *b)
{
    if (b == NULL)
        return;
    pthread_mutex_destroy(&b->lock);
    free(b);
}

static hpd_conn_budget_t *process_budget;
static pthread_once_t process_once = PTHREAD_ONCE_INIT;

static void make_process_budget(void)
{
    const hpd_conn_budget_params_t p = {0};
    if (hpd_conn_budget_create(&p, &process_budget) != HPD_OK)
        process_budget = NULL;
}

hpd_conn_budget_t *hpd_conn_budget_process(void)
{
    pthread_once(&process_once, make_process_budget);
    return process_budget;
}

bool hpd_conn_budget_take(hpd_conn_budget_t *b, hpd_conn_class_t cls)
{
    pthread_mutex_lock(&b->lock);
    const uint32_t room = cls == HPD_CONN_OPERATOR ? b->listeners : b->listeners - b->operator_fds;
    const bool ok = b->used < room;
    if (ok) {
        b->used++;
        if (cls == HPD_CONN_OPERATOR)
            b->operator_used++;
    } else {
        b->refused++;
    }
    pthread_mutex_unlock(&b->lock);
    return ok;
}

void hpd_conn_budget_give(hpd_conn_budget_t *b, hpd_conn_class_t cls)
{
    pthread_mutex_lock(&b->lock);
    if (b->used > 0)
        b->used--;
    if (cls == HPD_CONN_OPERATOR && b->operator_used > 0)
        b->operator_used--;
    pthread_mutex_unlock(&b->lock);
}

bool hpd_conn_budget_hold(hpd_conn_budget_t *b, size_t bytes)
{
    pthread_mutex_lock(&b->lock);
    const bool ok = bytes <= b->max_held - b->held;
    if (ok)
        b->held += bytes;
    else
        b->held_refused++;
    pthread_mutex_unlock(&b->lock);
    return ok;
}

void hpd_conn_budget_unhold(hpd_conn_budget_t *b, size_t bytes)
{
    pthread_mutex_lock(&b->lock);
    b->held -= HPD_MIN(bytes, b->held);
    pthread_mutex_unlock(&b->lock);
}

void hpd_conn_budget_stats(hpd_conn_budget_t *b, hpd_conn_budget_stats_t *st)
{
    pthread_mutex_lock(&b->lock);
    *st = (hpd_conn_budget_stats_t){.fd_limit = b->fd_limit,
                                    .listeners = b->listeners,
                                    .used = b->used,
                                    .operator_used = b->operator_used,
                                    .held = b->held,
                                    .max_held = b->max_held,
                                    .refused = b->refused,
                                    .held_refused = b->held_refused};
    pthread_mutex_unlock(&b->lock);
}
