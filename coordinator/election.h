/* A coordinator's leadership, elected through etcd (docs/cluster.md, "A
 * standby"): coordinators started with --etcd campaign for one key of the
 * cluster with a lease (etcd's v3 JSON gateway over HTTP: libcurl and
 * jansson); the one whose transaction creates the key leads, publishes
 * its address there and keeps the lease alive; the others wait and try
 * again. A standby does not listen: nodes and clients given several
 * coordinators reach the leader only.
 *
 * The leader steps down, before its lease can have ended at etcd, when it
 * cannot renew the lease (etcd unreachable, the lease gone): its own
 * deadline is the send time of its last renewal that succeeded plus the
 * lease's TTL less a margin, and hpd_election_leads() is false from then.
 * So a leader cut off from etcd, or stopped (SIGSTOP) past its lease,
 * never serves while another leads: the process watching
 * hpd_election_fd() ends.
 *
 * The campaign runs on a thread of its own with blocking HTTP calls (each
 * bounded by a timeout), so the coordinator's loop never waits on etcd. */
#ifndef HPD_COORDINATOR_ELECTION_H
#define HPD_COORDINATOR_ELECTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hpd_election hpd_election_t;

typedef struct {
    const char *endpoint; /* etcd's client URL: http://HOST:PORT */
    const char *key;      /* the cluster's leader key */
    uint32_t ttl_s;       /* the lease's TTL, 2 or more */
    const char *name;     /* this coordinator, for the logs */
} hpd_election_params_t;

/* Starts the campaign. HPD_ERR_INVALID_ARG: a bad parameter (err says). */
hpd_status_t hpd_election_create(const hpd_election_params_t *params, hpd_election_t **e_p,
                                 char *err, size_t err_len);

/* Blocks until this process leads (true), or until its campaign cannot go
 * on (false: the thread ended, hpd_election_destroy). */
bool hpd_election_wait(hpd_election_t *e);

/* Writes value (the leader's address) under the key, only while the key
 * holds this leader's lease. */
hpd_status_t hpd_election_publish(hpd_election_t *e, const char *value);

/* Whether this process leads with a lease that is still valid now. */
bool hpd_election_leads(hpd_election_t *e);

/* A descriptor that becomes readable when leadership is lost. */
int hpd_election_fd(const hpd_election_t *e);

/* Why leadership was lost (empty while it holds). */
const char *hpd_election_why(hpd_election_t *e);

/* Ends the campaign; a leader gives its lease back (the key goes at once,
 * a standby takes over without waiting out the TTL). Accepts NULL. */
void hpd_election_destroy(hpd_election_t *e);

#endif
