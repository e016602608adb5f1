/* A manifest as systemd units (one per process) or as Kubernetes objects
 * (a Secret with the token, a ConfigMap with each node's flags, the
 * coordinator's Deployment and Service, one StatefulSet per node role with
 * readiness probes on /healthz). docs/operations.md describes the output. */
#ifndef HPD_DEPLOY_RENDER_H
#define HPD_DEPLOY_RENDER_H

#include <stddef.h>

#include "deploy/manifest.h"

typedef struct {
    const hpd_manifest_t *manifest;
    const char *bins[HPD_PROC_DOOR + 1]; /* program paths by hpd_proc_role_t */
    const char *out;     /* systemd: a directory (required); k8s: a file, NULL = stdout */
} hpd_render_params_t;

/* Writes OUT/hybridpd-CLUSTER-NAME.service for every process. Returns 0,
 * or 1 with a message in err. */
int hpd_render_systemd(const hpd_render_params_t *params, char *err, size_t errlen);

/* Writes one YAML stream of Kubernetes objects. Returns 0, or 1 with a
 * message in err. */
int hpd_render_k8s(const hpd_render_params_t *params, char *err, size_t errlen);

#endif
