#include "deploy/render.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "common/util.h"

/* ------------------------------------------------------------ systemd */

static const char *unit_name(const hpd_manifest_t *m, const hpd_manifest_proc_t *p, char *out,
                             size_t len)
{
    snprintf(out, len, "hybridpd-%s-%s.service", m->cluster, p->name);
    return out;
}

/* systemd command-line quoting: double quotes, with \ " and % escaped
 * (% starts a specifier in unit files). */
static void put_word(FILE *f, const char *s)
{
    const bool plain = strpbrk(s, " \t\"'\\%$;") == NULL && s[0] != '\0';
    if (plain) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if (*s == '%')
            fputc('%', f);
        if (*s == '$')
            fputc('$', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* coordinator.etcd.start: one etcd member of the cluster's own (etcd-server
 * from Debian), its data under the state dir; the coordinators on its host
 * start after it. */
static int etcd_unit(const hpd_manifest_t *m, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    char path[HPD_MANIFEST_PATH_MAX + 128], data[HPD_MANIFEST_PATH_MAX + 16], **argv;
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(data, sizeof(data), "%s/etcd.data", m->state_dir);
    if (hpd_manifest_etcd_args(m, "/usr/bin/etcd", data, &argv) < 0 ||
        (f = fopen(path, "w")) == NULL) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return 1;
    }
    fprintf(f, "# hybridpd cluster %s: the coordinators' election (etcd-server from Debian) on "
               "%s (from %s)\n", m->cluster, m->etcd.host, m->path);
    fprintf(f, "[Unit]\nDescription=hybridpd %s etcd (coordinator election)\n"
               "Wants=network-online.target\nAfter=network-online.target\n"
               "\n[Service]\nType=notify\nExecStart=", m->cluster);
    for (int k = 0; argv[k] != NULL; k++) {
        if (k)
            fputc(' ', f);
        put_word(f, argv[k]);
    }
    fprintf(f, "\nRestart=on-failure\nRestartSec=2\n"
               "\n[Install]\nWantedBy=multi-user.target\n");
    hpd_manifest_args_free(argv);
    if (fclose(f) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return 1;
    }
    printf("%s  (host %s)\n", path, m->etcd.host);
    return 0;
}

int hpd_render_systemd(const hpd_render_params_t *rp, char *err, size_t errlen)
{
    const hpd_manifest_t *m = rp->manifest;
    char path[HPD_MANIFEST_PATH_MAX + 128], unit[160], co_unit[160];

    if (rp->out == NULL) {
        snprintf(err, errlen, "--systemd needs --out DIR (one unit file per process)");
        return 1;
    }
    if (mkdir(rp->out, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", rp->out, strerror(errno));
        return 1;
    }
    unit_name(m, &m->procs[0], co_unit, sizeof(co_unit));
    char etcd_name[160] = "";
    if (m->etcd.start) {
        snprintf(etcd_name, sizeof(etcd_name), "hybridpd-%s-etcd.service", m->cluster);
        if (etcd_unit(m, rp->out, etcd_name, err, errlen) != 0)
            return 1;
    }
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        char **argv;
        FILE *f;
        snprintf(path, sizeof(path), "%s/%s", rp->out, unit_name(m, p, unit, sizeof(unit)));
        if (hpd_manifest_args(m, p, rp->bins[p->role], &argv) < 0 ||
            (f = fopen(path, "w")) == NULL) {
            snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
            return 1;
        }
        const bool node = p->role != HPD_PROC_COORDINATOR;
        const bool same_host = node && strcmp(p->host, m->procs[0].host) == 0;
        /* a coordinator starts after the election's etcd on its host */
        const bool after_etcd = !node && m->etcd.start && strcmp(p->host, m->etcd.host) == 0;
        fprintf(f, "# hybridpd cluster %s: %s %s on %s (from %s)\n", m->cluster,
                hpd_proc_role_name(p->role), p->name, p->host, m->path);
        fprintf(f, "[Unit]\nDescription=hybridpd %s %s %s\n", m->cluster,
                hpd_proc_role_name(p->role), p->name);
        fprintf(f, "Documentation=https://github.com/hybridpd/hybridpd/blob/main/docs/"
                   "operations.md\n");
        fprintf(f, "Wants=network-online.target%s%s\nAfter=network-online.target%s%s\n",
                after_etcd ? " " : "", after_etcd ? etcd_name : "",
                same_host || after_etcd ? " " : "",
                same_host ? co_unit : after_etcd ? etcd_name : "");
        fprintf(f, "\n[Service]\nType=exec\nExecStart=");
        for (int k = 0; argv[k] != NULL; k++) {
            if (k)
                fputc(' ', f);
            put_word(f, argv[k]);
        }
        /* SIGTERM drains; give the drain its time before systemd kills */
        const uint32_t drain_s = (p->drain_timeout_ms ? p->drain_timeout_ms : 30000) / 1000;
        fprintf(f, "\nEnvironment=OMP_WAIT_POLICY=passive\n"
                   "KillSignal=SIGTERM\nTimeoutStopSec=%u\n"
                   "Restart=on-failure\nRestartSec=2\n"
                   "# a node exits 3 when it loses the coordinator: restart and register again\n"
                   "LimitMEMLOCK=infinity\n"
                   "\n[Install]\nWantedBy=multi-user.target\n", drain_s + 15);
        hpd_manifest_args_free(argv);
        if (fclose(f) != 0) {
            snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
            return 1;
        }
        printf("%s  (host %s)\n", path, p->host);
    }
    return 0;
}

/* ------------------------------------------------------------ kubernetes */

typedef struct {
    yaml_document_t d;
} doc_t;

static int y_str(doc_t *y, const char *s)
{
    return yaml_document_add_scalar(&y->d, NULL, (yaml_char_t *)s, -1, YAML_ANY_SCALAR_STYLE);
}

/* a string that must stay a string ("7000", "true") */
static int y_qstr(doc_t *y, const char *s)
{
    return yaml_document_add_scalar(&y->d, NULL, (yaml_char_t *)s, -1,
                                    YAML_DOUBLE_QUOTED_SCALAR_STYLE);
}

static int y_int(doc_t *y, long v)
{
    char text[24];
    snprintf(text, sizeof(text), "%ld", v);
    return yaml_document_add_scalar(&y->d, NULL, (yaml_char_t *)text, -1,
                                    YAML_PLAIN_SCALAR_STYLE);
}

static int y_map(doc_t *y)
{
    return yaml_document_add_mapping(&y->d, NULL, YAML_BLOCK_MAPPING_STYLE);
}

static int y_seq(doc_t *y)
{
    return yaml_document_add_sequence(&y->d, NULL, YAML_BLOCK_SEQUENCE_STYLE);
}

static void y_put(doc_t *y, int map, const char *key, int value)
{
    yaml_document_append_mapping_pair(&y->d, map, y_str(y, key), value);
}

static void y_add(doc_t *y, int seq, int item)
{
    yaml_document_append_sequence_item(&y->d, seq, item);
}

/* A new document: apiVersion, kind, metadata {name, namespace, labels};
 * returns the root mapping and, when meta_p is not NULL, the metadata one. */
static int y_object(doc_t *y, const hpd_manifest_t *m, const char *api, const char *kind,
                    const char *name, const char *component, int *meta_p)
{
    int root, meta, labels;
    yaml_document_initialize(&y->d, NULL, NULL, NULL, 0, 1);
    root = y_map(y);
    y_put(y, root, "apiVersion", y_str(y, api));
    y_put(y, root, "kind", y_str(y, kind));
    meta = y_map(y);
    y_put(y, root, "metadata", meta);
    y_put(y, meta, "name", y_str(y, name));
    y_put(y, meta, "namespace", y_str(y, m->k8s_namespace));
    labels = y_map(y);
    y_put(y, meta, "labels", labels);
    y_put(y, labels, "app.kubernetes.io/name", y_str(y, "hybridpd"));
    y_put(y, labels, "app.kubernetes.io/instance", y_str(y, m->cluster));
    if (component != NULL)
        y_put(y, labels, "app.kubernetes.io/component", y_str(y, component));
    if (meta_p != NULL)
        *meta_p = meta;
    return root;
}

static int y_selector(doc_t *y, const hpd_manifest_t *m, const char *component)
{
    int sel = y_map(y);
    y_put(y, sel, "app.kubernetes.io/instance", y_str(y, m->cluster));
    y_put(y, sel, "app.kubernetes.io/component", y_str(y, component));
    return sel;
}

static int y_port(doc_t *y, const char *name, long port)
{
    int p = y_map(y);
    y_put(y, p, "name", y_str(y, name));
    y_put(y, p, "containerPort", y_int(y, port));
    return p;
}

static int y_env_field(doc_t *y, const char *name, const char *path)
{
    int e = y_map(y), from = y_map(y), ref = y_map(y);
    y_put(y, e, "name", y_str(y, name));
    y_put(y, e, "valueFrom", from);
    y_put(y, from, "fieldRef", ref);
    y_put(y, ref, "fieldPath", y_str(y, path));
    return e;
}

/* inside the image, the programs are on PATH */
static const char *bin_of(int role)
{
    return role == HPD_PROC_COORDINATOR || role == HPD_PROC_DOOR ? "hpd-coordinator"
           : role == HPD_PROC_PREFILL   ? "hpd-prefill"
                                        : "hpd-decode";
}

typedef struct {
    char name[128], component[32];
    const hpd_manifest_proc_t *first;
    uint32_t replicas;
    bool gpu;
} group_t;

/* The pod template of the coordinator (Deployment) or a node role
 * (StatefulSet): the program reads its flags from the ConfigMap entry named
 * after the pod, then the pod's own address, token and coordinator. */
static int y_pod(doc_t *y, const hpd_manifest_t *m, const group_t *g, const char *bin,
                 const char *cm_name, const char *secret_name, const char *co_addr)
{
    int tmpl = y_map(y), meta = y_map(y), labels = y_map(y), spec = y_map(y);
    int containers = y_seq(y), c = y_map(y), cmd = y_seq(y), env = y_seq(y), ports = y_seq(y);
    int probe = y_map(y), get = y_map(y), mounts = y_seq(y), vols = y_seq(y);
    char script[2048];
    const bool coord = g->first->role == HPD_PROC_COORDINATOR;
    const bool door = g->first->role == HPD_PROC_DOOR;
    const uint32_t drain_s = (g->first->drain_timeout_ms ? g->first->drain_timeout_ms : 30000) /
                             1000;

    y_put(y, tmpl, "metadata", meta);
    y_put(y, meta, "labels", labels);
    y_put(y, labels, "app.kubernetes.io/name", y_str(y, "hybridpd"));
    y_put(y, labels, "app.kubernetes.io/instance", y_str(y, m->cluster));
    y_put(y, labels, "app.kubernetes.io/component", y_str(y, g->component));
    y_put(y, tmpl, "spec", spec);
    y_put(y, spec, "terminationGracePeriodSeconds", y_int(y, drain_s + 15));
    y_put(y, spec, "containers", containers);
    y_add(y, containers, c);
    y_put(y, c, "name", y_str(y, g->component));
    y_put(y, c, "image", y_str(y, m->k8s_image));
    y_put(y, c, "command", cmd);
    y_add(y, cmd, y_str(y, "/bin/sh"));
    y_add(y, cmd, y_str(y, "-c"));
    /* the client keys, when the manifest has them, are in the Secret too
     * (the coordinator reads them again on SIGHUP) */
    const bool keys = (coord || door) && m->client_keys_file[0] != '\0';
    snprintf(script, sizeof(script),
             "exec %s $(cat /etc/hybridpd/flags/%s) --host \"$POD_IP\" --token-file "
             "/etc/hybridpd/secret/token%s%s%s",
             bin, coord || door ? hpd_proc_role_name(g->first->role) : "$(hostname)",
             coord ? "" : door ? " --scheduler " : " --coordinator ", coord ? "" : co_addr,
             keys ? " --client-keys-file /etc/hybridpd/secret/client-keys" : "");
    y_add(y, cmd, y_str(y, script));
    y_put(y, c, "env", env);
    y_add(y, env, y_env_field(y, "POD_IP", "status.podIP"));
    int omp = y_map(y);
    y_put(y, omp, "name", y_str(y, "OMP_WAIT_POLICY"));
    y_put(y, omp, "value", y_str(y, "passive"));
    y_add(y, env, omp);
    y_put(y, c, "ports", ports);
    y_add(y, ports, y_port(y, "rpc", g->first->port));
    y_add(y, ports, y_port(y, "metrics", g->first->metrics_port));
    if (g->first->http_port != 0)
        y_add(y, ports, y_port(y, "http", g->first->http_port));
    y_put(y, c, "readinessProbe", probe);
    y_put(y, probe, "httpGet", get);
    y_put(y, get, "path", y_str(y, "/healthz"));
    y_put(y, get, "port", y_str(y, "metrics"));
    y_put(y, probe, "periodSeconds", y_int(y, 2));
    y_put(y, probe, "failureThreshold", y_int(y, 3));
    if (g->gpu) {
        int res = y_map(y), lim = y_map(y);
        y_put(y, c, "resources", res);
        y_put(y, res, "limits", lim);
        y_put(y, lim, "nvidia.com/gpu", y_int(y, 1));
    }
    y_put(y, c, "volumeMounts", mounts);
    struct { const char *name, *path; bool ro; } mv[3] = {
        {"flags", "/etc/hybridpd/flags", true}, {"token", "/etc/hybridpd/secret", true},
        {"model", m->model, true}};
    /* the model: the nodes', and the HTTP API's tokenizer */
    const bool model = !(coord || door) || g->first->http_port != 0;
    for (int i = 0; i < (model ? 3 : 2); i++) {
        int mt = y_map(y);
        y_put(y, mt, "name", y_str(y, mv[i].name));
        y_put(y, mt, "mountPath", y_str(y, mv[i].path));
        y_put(y, mt, "readOnly", y_str(y, "true"));
        y_add(y, mounts, mt);
    }
    y_put(y, spec, "volumes", vols);
    int v1 = y_map(y), cm = y_map(y), v2 = y_map(y), sec = y_map(y);
    y_put(y, v1, "name", y_str(y, "flags"));
    y_put(y, v1, "configMap", cm);
    y_put(y, cm, "name", y_str(y, cm_name));
    y_add(y, vols, v1);
    y_put(y, v2, "name", y_str(y, "token"));
    y_put(y, v2, "secret", sec);
    y_put(y, sec, "secretName", y_str(y, secret_name));
    y_put(y, sec, "defaultMode", y_int(y, 0400));
    y_add(y, vols, v2);
    if (model) {
        int v3 = y_map(y), hp = y_map(y);
        y_put(y, v3, "name", y_str(y, "model"));
        y_put(y, v3, "hostPath", hp);
        y_put(y, hp, "path", y_str(y, m->model));
        y_put(y, hp, "type", y_str(y, "Directory"));
        y_add(y, vols, v3);
    }
    return tmpl;
}

/* One process's flags for the ConfigMap: what the manifest says, less
 * what the pod supplies itself (address, token, client keys, coordinator). Pods of a
 * role share one container spec, so they listen on the ports of the role's
 * first node; on a GPU the pod sees its one GPU as cuda:0. */
static void flags_text(const hpd_manifest_t *m, const hpd_manifest_proc_t *p,
                       const hpd_manifest_proc_t *first, const char *etcd_url, char *out,
                       size_t len)
{
    hpd_manifest_proc_t q = *p;
    q.port = first->port;
    q.metrics_port = first->metrics_port;
    char **argv;
    size_t used = 0;
    out[0] = '\0';
    if (q.gpu >= 0)
        snprintf(q.device, sizeof(q.device), "cuda:0");
    if (hpd_manifest_args(m, &q, "x", &argv) < 0)
        return;
    for (int k = 1; argv[k] != NULL && used + 1 < len; k++) {
        const char *a = argv[k];
        if (!strcmp(a, "--host") || !strcmp(a, "--token-file") || !strcmp(a, "--coordinator") ||
            !strcmp(a, "--client-keys-file") || !strcmp(a, "--scheduler")) {
            k++;
            continue;
        }
        if (!strcmp(a, "--etcd") && etcd_url != NULL && argv[k + 1] != NULL) {
            used += (size_t)snprintf(out + used, len - used, "%s--etcd %s", used ? " " : "",
                                     etcd_url);
            k++;
            continue;
        }
        used += (size_t)snprintf(out + used, len - used, "%s%s", used ? " " : "", a);
    }
    hpd_manifest_args_free(argv);
}

static int emit(yaml_emitter_t *e, doc_t *y)
{
    return yaml_emitter_dump(e, &y->d) ? 0 : -1; /* dump deletes the document */
}

/* coordinator.etcd.start: a headless Service and a StatefulSet of one etcd
 * member (the image's etcd, on PATH). The election's state is soft: on an
 * emptyDir, a new pod starts empty, the leader's lease is gone, it steps
 * down and the coordinators elect again. */
static int y_etcd(yaml_emitter_t *e, doc_t *y, const hpd_manifest_t *m, const char *name,
                  const char *client_url)
{
    char peer_url[400], cluster[480], script[2048];
    int rc = 0;
    snprintf(peer_url, sizeof(peer_url), "http://%s-0.%s.%s.svc:%u", name, name,
             m->k8s_namespace, m->etcd.peer_port);
    snprintf(cluster, sizeof(cluster), "%s=%s", m->cluster, peer_url);
    int root = y_object(y, m, "v1", "Service", name, "etcd", NULL), spec = y_map(y);
    y_put(y, root, "spec", spec);
    y_put(y, spec, "clusterIP", y_str(y, "None"));
    y_put(y, spec, "publishNotReadyAddresses", y_str(y, "true"));
    y_put(y, spec, "selector", y_selector(y, m, "etcd"));
    int ports = y_seq(y);
    y_put(y, spec, "ports", ports);
    y_add(y, ports, y_port(y, "client", m->etcd.port));
    y_add(y, ports, y_port(y, "peer", m->etcd.peer_port));
    rc |= emit(e, y);

    root = y_object(y, m, "apps/v1", "StatefulSet", name, "etcd", NULL);
    spec = y_map(y);
    int sel = y_map(y), tmpl = y_map(y), meta = y_map(y), labels = y_map(y), pspec = y_map(y);
    int containers = y_seq(y), c = y_map(y), cmd = y_seq(y), cports = y_seq(y);
    int probe = y_map(y), get = y_map(y), mounts = y_seq(y), mt = y_map(y), vols = y_seq(y);
    int vol = y_map(y), empty = y_map(y);
    y_put(y, root, "spec", spec);
    y_put(y, spec, "serviceName", y_str(y, name));
    y_put(y, spec, "replicas", y_int(y, 1));
    y_put(y, spec, "selector", sel);
    y_put(y, sel, "matchLabels", y_selector(y, m, "etcd"));
    y_put(y, spec, "template", tmpl);
    y_put(y, tmpl, "metadata", meta);
    y_put(y, meta, "labels", labels);
    y_put(y, labels, "app.kubernetes.io/name", y_str(y, "hybridpd"));
    y_put(y, labels, "app.kubernetes.io/instance", y_str(y, m->cluster));
    y_put(y, labels, "app.kubernetes.io/component", y_str(y, "etcd"));
    y_put(y, tmpl, "spec", pspec);
    y_put(y, pspec, "containers", containers);
    y_add(y, containers, c);
    y_put(y, c, "name", y_str(y, "etcd"));
    y_put(y, c, "image", y_str(y, m->k8s_image));
    y_put(y, c, "command", cmd);
    y_add(y, cmd, y_str(y, "/bin/sh"));
    y_add(y, cmd, y_str(y, "-c"));
    snprintf(script, sizeof(script),
             "exec etcd --name %s --data-dir /var/lib/etcd --listen-client-urls http://0.0.0.0:%u "
             "--advertise-client-urls %s --listen-peer-urls http://0.0.0.0:%u "
             "--initial-advertise-peer-urls %s --initial-cluster %s",
             m->cluster, m->etcd.port, client_url, m->etcd.peer_port, peer_url, cluster);
    y_add(y, cmd, y_str(y, script));
    y_put(y, c, "ports", cports);
    y_add(y, cports, y_port(y, "client", m->etcd.port));
    y_add(y, cports, y_port(y, "peer", m->etcd.peer_port));
    y_put(y, c, "readinessProbe", probe);
    y_put(y, probe, "httpGet", get);
    y_put(y, get, "path", y_str(y, "/health"));
    y_put(y, get, "port", y_str(y, "client"));
    y_put(y, probe, "periodSeconds", y_int(y, 2));
    y_put(y, c, "volumeMounts", mounts);
    y_put(y, mt, "name", y_str(y, "data"));
    y_put(y, mt, "mountPath", y_str(y, "/var/lib/etcd"));
    y_add(y, mounts, mt);
    y_put(y, pspec, "volumes", vols);
    y_put(y, vol, "name", y_str(y, "data"));
    y_put(y, vol, "emptyDir", empty);
    y_add(y, vols, vol);
    rc |= emit(e, y);
    return rc;
}

static int write_handler(void *data, unsigned char *buffer, size_t size)
{
    return fwrite(buffer, 1, size, (FILE *)data) == size;
}

int hpd_render_k8s(const hpd_render_params_t *rp, char *err, size_t errlen)
{
    const hpd_manifest_t *m = rp->manifest;
    yaml_emitter_t e;
    doc_t y;
    FILE *f = stdout;
    char secret[128], cm[128], co_name[128], co_addr[256], *token = NULL, flags[4096];
    char *keys = NULL;
    size_t tlen = 0, klen = 0;
    group_t groups[HPD_PROC_DOOR + 1];
    int rc = 0;

    snprintf(secret, sizeof(secret), "%s-token", m->cluster);
    snprintf(cm, sizeof(cm), "%s-flags", m->cluster);
    snprintf(co_name, sizeof(co_name), "%s-coordinator", m->cluster);
    snprintf(co_addr, sizeof(co_addr), "%s.%s.svc:%u", co_name, m->k8s_namespace,
             m->procs[0].port);
    char etcd_name[128], etcd_url[300];
    snprintf(etcd_name, sizeof(etcd_name), "%s-etcd", m->cluster);
    snprintf(etcd_url, sizeof(etcd_url), "http://%s.%s.svc:%u", etcd_name, m->k8s_namespace,
             m->etcd.port);
    if (hpd_read_file(m->token_file, &token, &tlen) != HPD_OK) {
        snprintf(err, errlen, "token_file: cannot read %s (the Secret carries it; hpdctl up "
                 "creates one, or write a random line there)", m->token_file);
        return 1;
    }
    token[strcspn(token, "\r\n")] = '\0';
    if (m->client_keys_file[0] != '\0' &&
        hpd_read_file(m->client_keys_file, &keys, &klen) != HPD_OK) {
        snprintf(err, errlen, "client_keys_file: cannot read %s (the Secret carries it)",
                 m->client_keys_file);
        free(token);
        return 1;
    }
    if (rp->out != NULL && (f = fopen(rp->out, "w")) == NULL) {
        snprintf(err, errlen, "cannot write %s: %s", rp->out, strerror(errno));
        free(token);
        free(keys);
        return 1;
    }
    memset(groups, 0, sizeof(groups));
    for (uint32_t i = 0; i < m->n_procs; i++) {
        group_t *g = &groups[m->procs[i].role];
        if (g->replicas++ == 0) {
            g->first = &m->procs[i];
            snprintf(g->component, sizeof(g->component), "%s",
                     hpd_proc_role_name(m->procs[i].role));
            snprintf(g->name, sizeof(g->name), "%s-%s", m->cluster,
                     hpd_proc_role_name(m->procs[i].role));
        }
        g->gpu |= m->procs[i].gpu >= 0 && m->procs[i].role != HPD_PROC_COORDINATOR &&
                  m->procs[i].role != HPD_PROC_DOOR;
    }
    yaml_emitter_initialize(&e);
    yaml_emitter_set_output(&e, write_handler, f);
    yaml_emitter_set_unicode(&e, 1);
    yaml_emitter_set_width(&e, 100);
    yaml_emitter_open(&e);

    /* the token */
    int root = y_object(&y, m, "v1", "Secret", secret, NULL, NULL), data = y_map(&y);
    y_put(&y, root, "type", y_str(&y, "Opaque"));
    y_put(&y, root, "stringData", data);
    y_put(&y, data, "token", y_qstr(&y, token));
    if (keys != NULL)
        y_put(&y, data, "client-keys", y_qstr(&y, keys));
    rc |= emit(&e, &y);

    /* every process's flags, keyed by the pod that runs it */
    root = y_object(&y, m, "v1", "ConfigMap", cm, NULL, NULL);
    data = y_map(&y);
    y_put(&y, root, "data", data);
    uint32_t ordinal[HPD_PROC_DOOR + 1] = {0};
    for (uint32_t i = 0; i < m->n_procs; i++) {
        const hpd_manifest_proc_t *p = &m->procs[i];
        char key[160];
        if ((p->role == HPD_PROC_COORDINATOR && i > 0) ||
            (p->role == HPD_PROC_DOOR && p != groups[HPD_PROC_DOOR].first))
            continue; /* the replicas share the first one's flags */
        if (p->role == HPD_PROC_COORDINATOR || p->role == HPD_PROC_DOOR)
            snprintf(key, sizeof(key), "%s", hpd_proc_role_name(p->role));
        else
            snprintf(key, sizeof(key), "%s-%u", groups[p->role].name, ordinal[p->role]++);
        flags_text(m, p, groups[p->role].first, m->etcd.start ? etcd_url : NULL, flags,
                   sizeof(flags));
        y_put(&y, data, key, y_str(&y, flags));
    }
    rc |= emit(&e, &y);

    /* the election's etcd, where the manifest starts one */
    if (m->etcd.start)
        rc |= y_etcd(&e, &y, m, etcd_name, etcd_url);

    /* the coordinator: a Deployment of one, or of the leader and its
     * standbys (they campaign through etcd; only the leader listens and
     * is ready, so the Service sends nodes and clients to it), and its
     * Service */
    root = y_object(&y, m, "apps/v1", "Deployment", co_name, "coordinator", NULL);
    int spec = y_map(&y), sel = y_map(&y);
    y_put(&y, root, "spec", spec);
    y_put(&y, spec, "replicas", y_int(&y, m->n_coordinators));
    y_put(&y, spec, "selector", sel);
    y_put(&y, sel, "matchLabels", y_selector(&y, m, "coordinator"));
    y_put(&y, spec, "template", y_pod(&y, m, &groups[HPD_PROC_COORDINATOR], "hpd-coordinator",
                                      cm, secret, co_addr));
    rc |= emit(&e, &y);
    root = y_object(&y, m, "v1", "Service", co_name, "coordinator", NULL);
    spec = y_map(&y);
    y_put(&y, root, "spec", spec);
    y_put(&y, spec, "selector", y_selector(&y, m, "coordinator"));
    int ports = y_seq(&y);
    y_put(&y, spec, "ports", ports);
    const char *pn[2] = {"rpc", "metrics"};
    const long pv[2] = {m->procs[0].port, m->procs[0].metrics_port};
    for (int i = 0; i < 2; i++) {
        int p = y_map(&y);
        y_put(&y, p, "name", y_str(&y, pn[i]));
        y_put(&y, p, "port", y_int(&y, pv[i]));
        y_put(&y, p, "targetPort", y_str(&y, pn[i]));
        y_add(&y, ports, p);
    }
    rc |= emit(&e, &y);

    /* the front doors: a Deployment of them (they share the first one's
     * flags) and the Service clients use */
    if (m->n_doors > 0) {
        const group_t *g = &groups[HPD_PROC_DOOR];
        root = y_object(&y, m, "apps/v1", "Deployment", g->name, g->component, NULL);
        spec = y_map(&y);
        sel = y_map(&y);
        y_put(&y, root, "spec", spec);
        y_put(&y, spec, "replicas", y_int(&y, m->n_doors));
        y_put(&y, spec, "selector", sel);
        y_put(&y, sel, "matchLabels", y_selector(&y, m, g->component));
        y_put(&y, spec, "template", y_pod(&y, m, g, "hpd-coordinator", cm, secret, co_addr));
        rc |= emit(&e, &y);
        root = y_object(&y, m, "v1", "Service", g->name, g->component, NULL);
        spec = y_map(&y);
        y_put(&y, root, "spec", spec);
        y_put(&y, spec, "selector", y_selector(&y, m, g->component));
        ports = y_seq(&y);
        y_put(&y, spec, "ports", ports);
        const char *dn[3] = {"rpc", "metrics", "http"};
        const long dv[3] = {g->first->port, g->first->metrics_port, g->first->http_port};
        for (int i = 0; i < 3; i++) {
            if (dv[i] == 0)
                continue;
            int p = y_map(&y);
            y_put(&y, p, "name", y_str(&y, dn[i]));
            y_put(&y, p, "port", y_int(&y, dv[i]));
            y_put(&y, p, "targetPort", y_str(&y, dn[i]));
            y_add(&y, ports, p);
        }
        rc |= emit(&e, &y);
    }

    /* each node role: a headless Service and a StatefulSet; pod N runs the
     * role's N-th node of the manifest (annotation hybridpd.io/nodes) */
    for (int r = HPD_PROC_PREFILL; r <= HPD_PROC_DECODE; r++) {
        group_t *g = &groups[r];
        char names[4096];
        size_t used = 0;
        names[0] = '\0';
        for (uint32_t i = 0; i < m->n_procs && used + 1 < sizeof(names); i++)
            if (m->procs[i].role == (hpd_proc_role_t)r)
                used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                         used ? "," : "", m->procs[i].name);
        root = y_object(&y, m, "v1", "Service", g->name, g->component, NULL);
        spec = y_map(&y);
        y_put(&y, root, "spec", spec);
        y_put(&y, spec, "clusterIP", y_str(&y, "None"));
        y_put(&y, spec, "selector", y_selector(&y, m, g->component));
        ports = y_seq(&y);
        y_put(&y, spec, "ports", ports);
        int p = y_map(&y);
        y_put(&y, p, "name", y_str(&y, "metrics"));
        y_put(&y, p, "port", y_int(&y, g->first->metrics_port));
        y_add(&y, ports, p);
        rc |= emit(&e, &y);

        int meta;
        root = y_object(&y, m, "apps/v1", "StatefulSet", g->name, g->component, &meta);
        int ann = y_map(&y);
        y_put(&y, meta, "annotations", ann);
        y_put(&y, ann, "hybridpd.io/nodes", y_str(&y, names));
        y_put(&y, ann, "hybridpd.io/manifest", y_str(&y, m->path));
        spec = y_map(&y);
        sel = y_map(&y);
        y_put(&y, root, "spec", spec);
        y_put(&y, spec, "serviceName", y_str(&y, g->name));
        y_put(&y, spec, "replicas", y_int(&y, g->replicas));
        y_put(&y, spec, "podManagementPolicy", y_str(&y, "Parallel"));
        y_put(&y, spec, "selector", sel);
        y_put(&y, sel, "matchLabels", y_selector(&y, m, g->component));
        y_put(&y, spec, "template", y_pod(&y, m, g, bin_of(r), cm, secret, co_addr));
        rc |= emit(&e, &y);
    }
    yaml_emitter_close(&e);
    yaml_emitter_flush(&e);
    yaml_emitter_delete(&e);
    free(token);
    free(keys);
    if (f != stdout && fclose(f) != 0)
        rc = -1;
    if (rc != 0)
        snprintf(err, errlen, "cannot write the YAML%s%s", rp->out ? " to " : "",
                 rp->out ? rp->out : "");
    return rc ? 1 : 0;
}
