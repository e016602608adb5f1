/* The ranks of a tensor-parallel engine (engine/tp.h). */
#include "engine/tp.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "model/shard.h"

struct hpd_tp_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t n, arrived;
    _Atomic uint64_t generation; /* read without the lock while spinning */
    _Atomic bool aborted;
    const void *ptrs[HPD_TP_MAX];
};

hpd_status_t hpd_tp_group_create(uint32_t n, hpd_tp_group_t **group_p)
{
    hpd_tp_group_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return HPD_ERR_NO_MEMORY;
    if (n < 1 || n > HPD_TP_MAX) {
        free(g);
        return HPD_ERR_INVALID_ARG;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->n = n;
    *group_p = g;
    return HPD_OK;
}

void hpd_tp_group_destroy(hpd_tp_group_t *g)
{
    if (g == NULL)
        return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

/* How many times a rank waiting at a barrier yields its core before it
 * sleeps: the others usually arrive within microseconds (a decode step
 * meets some 30 times), where waking from a condition variable takes tens;
 * a rank without a core of its own lets the others run meanwhile. */
#define SPIN_YIELDS 200

hpd_status_t hpd_tp_group_barrier(hpd_tp_group_t *g)
{
    pthread_mutex_lock(&g->mu);
    const uint64_t gen = g->generation;
    if (!g->aborted && ++g->arrived == g->n) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < SPIN_YIELDS && !g->aborted && g->generation == gen; i++)
        sched_yield();
    pthread_mutex_lock(&g->mu);
    while (!g->aborted && g->generation == gen)
        pthread_cond_wait(&g->cv, &g->mu);
    const bool aborted = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return aborted ? HPD_ERR_INTERNAL : HPD_OK;
}

void hpd_tp_group_abort(hpd_tp_group_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void hpd_tp_group_reset(hpd_tp_group_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->aborted = false;
    g->arrived = 0;
    pthread_mutex_unlock(&g->mu);
}

hpd_status_t hpd_tp_group_share(hpd_tp_group_t *g, uint32_t rank, const void *mine, const void **all)
{
    hpd_status_t st;
    pthread_mutex_lock(&g->mu);
    g->ptrs[rank] = mine;
    pthread_mutex_unlock(&g->mu);
    if ((st = hpd_tp_group_barrier(g)) != HPD_OK)
        return st;
    pthread_mutex_lock(&g->mu);
    for (uint32_t r = 0; r < g->n; r++)
        all[r] = g->ptrs[r];
    pthread_mutex_unlock(&g->mu);
    return HPD_OK;
}

struct hpd_tp_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hpd_status_t (*fn)(void *arg);
    void *arg;
    bool posted, done, quit;
    hpd_status_t status;
};

static void *worker_main(void *arg)
{
    hpd_tp_worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->posted && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit)
            break;
        w->posted = false;
        pthread_mutex_unlock(&w->mu);
        const hpd_status_t st = w->fn(w->arg);
        pthread_mutex_lock(&w->mu);
        w->status = st;
        w->done = true;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

hpd_status_t hpd_tp_worker_create(hpd_tp_worker_t **worker_p)
{
    hpd_tp_worker_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return HPD_ERR_NO_MEMORY;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return HPD_ERR_NO_RESOURCE;
    }
    *worker_p = w;
    return HPD_OK;
}

void hpd_tp_worker_destroy(hpd_tp_worker_t *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

void hpd_tp_worker_post(hpd_tp_worker_t *w, hpd_status_t (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&w->mu);
    w->fn = fn;
    w->arg = arg;
    w->done = false;
    w->posted = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

hpd_status_t hpd_tp_worker_wait(hpd_tp_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    const hpd_status_t st = w->status;
    pthread_mutex_unlock(&w->mu);
    return st;
}
