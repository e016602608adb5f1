/* A cluster manifest: one YAML file (libyaml) that names the model, the
 * token file, the coordinator and every node with its host, ports, device,
 * KV layout, pools, prefix cache and UCX transports (docs/operations.md has
 * every field). Loading validates everything it can without touching the
 * hosts: each mistake is reported with its line, the field's path and what
 * is allowed. hpdctl turns a manifest into processes, systemd units or
 * Kubernetes objects. */
#ifndef HPD_DEPLOY_MANIFEST_H
#define HPD_DEPLOY_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HPD_MANIFEST_NAME_MAX 48
#define HPD_MANIFEST_PATH_MAX 1024

typedef enum {
    HPD_PROC_COORDINATOR,
    HPD_PROC_PREFILL,
    HPD_PROC_DECODE,
    /* a front door of the coordinator (hpd-coordinator --scheduler,
     * docs/cluster.md "Front doors") */
    HPD_PROC_DOOR,
} hpd_proc_role_t;

/* One process. A numeric field the manifest did not give (given) is left
 * to the program's default. */
typedef struct {
    char name[HPD_MANIFEST_NAME_MAX + 1];
    hpd_proc_role_t role;
    uint32_t line;      /* where it is declared */
    char host[128];     /* the address it binds and announces */
    uint16_t port;      /* RPC; 0 for a node: any free port */
    uint16_t metrics_port;
    char log_level[8];
    uint32_t drain_timeout_ms;
    /* nodes */
    char device[16];    /* "cpu", "cpu-bf16", "cuda:N", "cuda-bf16:N" or "cuda-fast:N" */
    int32_t gpu;        /* N of cuda:N, cuda-bf16:N or cuda-fast:N, -1 for cpu */
    uint32_t threads;
    uint32_t tp;        /* tensor-parallel ranks (1, 2, 4 or 8) */
    uint32_t kv_block, kv_pack;
    char kv_order[4];   /* "nhd" or "hnd" */
    uint32_t kv_pages, max_batch, max_context, prefill_chunk;
    bool prefix_cache;
    uint32_t checkpoints, host_cache_mb, staging_mb, reserve_timeout_ms;
    uint32_t xfer_deadline_ms;
    char ucx_tls[64], ucx_dev[64];
    /* coordinator */
    uint32_t heartbeat_ms, lease_ms, max_requests, queue_timeout_ms, max_attempts;
    uint32_t liveness_ms;
    uint16_t http_port;            /* the OpenAI-compatible API; 0: none */
    char served_model_name[128];   /* "": the model directory's last part */
    /* bit i: the manifest gave the field of hpd_options[i] (a number's 0
     * may be a value: liveness_ms 0 turns the pings off) */
    uint64_t given;
} hpd_manifest_proc_t;

/* coordinator.etcd: the coordinators campaign for leadership through it
 * (docs/operations.md, "A standby coordinator"). */
typedef struct {
    char endpoint[160];  /* http://HOST:PORT; "": no election */
    char key[160];       /* default /hybridpd/<cluster> */
    uint32_t ttl_s;      /* 0: the coordinator's default */
    bool start;          /* hpdctl up starts it (etcd-server) where its host is this one;
                            render writes its unit or its StatefulSet */
    char host[128];      /* the endpoint's */
    uint16_t port;       /* the endpoint's: clients */
    uint16_t peer_port;  /* peer_port, default port + 1 */
    uint32_t line;
} hpd_manifest_etcd_t;

typedef struct {
    char path[HPD_MANIFEST_PATH_MAX];   /* the file as given */
    char cluster[HPD_MANIFEST_NAME_MAX + 1];
    /* paths are resolved against the manifest's directory */
    char model[HPD_MANIFEST_PATH_MAX];
    char token_file[HPD_MANIFEST_PATH_MAX];        /* the node secret */
    char client_keys_file[HPD_MANIFEST_PATH_MAX];  /* default: client-keys beside the token */
    char state_dir[HPD_MANIFEST_PATH_MAX]; /* default /tmp/hybridpd-<cluster> */
    char log_level[8];
    char k8s_image[256];     /* kubernetes.image (hybridpd:latest) */
    char k8s_namespace[64];  /* kubernetes.namespace (default) */
    hpd_manifest_etcd_t etcd;
    /* [0] is the coordinator, then its standbys (coordinator.standbys:
     * n_coordinators - 1 of them, named coordinator-2, ...), then the
     * nodes in order, then the front doors (coordinator.doors: n_doors of
     * them, named door-1, ...) */
    hpd_manifest_proc_t *procs;
    uint32_t n_procs, n_coordinators, n_doors;
} hpd_manifest_t;

/* Reads and validates a manifest. On a mistake returns HPD_ERR_INVALID_ARG
 * (HPD_ERR_IO: unreadable) with one line per problem in err, each
 * "FILE:LINE: FIELD: what is wrong (what is allowed)". */
hpd_status_t hpd_manifest_load(const char *path, hpd_manifest_t **manifest_p, char *err,
                               size_t errlen);

/* The same from text; relative paths resolve against dir. */
hpd_status_t hpd_manifest_parse(const char *text, size_t len, const char *name, const char *dir,
                                hpd_manifest_t **manifest_p, char *err, size_t errlen);

void hpd_manifest_destroy(hpd_manifest_t *manifest);

const hpd_manifest_proc_t *hpd_manifest_find(const hpd_manifest_t *manifest, const char *name);

const char *hpd_proc_role_name(hpd_proc_role_t role);

/* The command line of a process: bin then its flags, NULL-terminated.
 * Returns the argument count, or -1 when out of memory. Free with
 * hpd_manifest_args_free. */
int hpd_manifest_args(const hpd_manifest_t *manifest, const hpd_manifest_proc_t *proc,
                      const char *bin, char ***argv_p);
void hpd_manifest_args_free(char **argv);

/* The command line of the etcd that coordinator.etcd.start asks for (one
 * member named after the cluster, its data in data_dir), as
 * hpd_manifest_args. */
int hpd_manifest_etcd_args(const hpd_manifest_t *manifest, const char *bin, const char *data_dir,
                           char ***argv_p);

#endif
