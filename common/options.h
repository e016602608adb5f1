/* The one options table of the programs (docs/operations.md, "Options"):
 * every option of hpd-coordinator, hpd-prefill, hpd-decode and hpd-run,
 * with its type, range, default, help and the roles that take it. The
 * daemons and hpd-run parse their command lines from it, their --help is
 * printed from it, and the manifest (deploy/manifest.c) checks its fields
 * against it, so a range or a role is stated once. An option of another
 * role is an error everywhere ("--staging-mb is an option of prefill
 * nodes, not of decode nodes").
 *
 * A program binds the options it takes to its own storage (hpd_opt_bind_t)
 * and calls hpd_opt_parse: defaults are applied first (the table's, or the
 * bind's own), then the command line, each value checked. */
#ifndef HPD_COMMON_OPTIONS_H
#define HPD_COMMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    HPD_OPT_ROLE_COORD = 1u << 0,
    HPD_OPT_ROLE_PREFILL = 1u << 1,
    HPD_OPT_ROLE_DECODE = 1u << 2,
    HPD_OPT_ROLE_RUN = 1u << 3, /* hpd-run */
} hpd_opt_role_t;

#define HPD_OPT_ROLE_NODE (HPD_OPT_ROLE_PREFILL | HPD_OPT_ROLE_DECODE)
#define HPD_OPT_ROLE_DAEMON (HPD_OPT_ROLE_COORD | HPD_OPT_ROLE_NODE)

typedef enum {
    HPD_OPT_U32,    /* uint32_t, an integer in [min, max], a multiple of mult */
    HPD_OPT_U64,    /* uint64_t, as U32 */
    HPD_OPT_MB,     /* uint64_t bytes, given in MiB in [min, max] */
    HPD_OPT_F32,    /* float in [min, max] (fmin/fmax), an open lower bound with open_min */
    HPD_OPT_PORT,   /* uint16_t */
    HPD_OPT_OPORT,  /* int32_t: a port, -1 when not given (optional endpoint) */
    HPD_OPT_STR,    /* const char * (points into argv or the table) */
    HPD_OPT_OFF,    /* bool, set false when given (a --no-... switch, no value) */
    HPD_OPT_ON,     /* bool, set true when given (a switch, no value) */
    HPD_OPT_LEVEL,  /* hpd_log_level_t (the program sets it: hpd_log_set_level) */
    HPD_OPT_LAYOUT, /* hpd_kv_layout_t: B,P,nhd|hnd (block size, pack size, order) */
    HPD_OPT_CUSTOM, /* the bind's parse function reads it */
} hpd_opt_kind_t;

typedef struct {
    const char *name;     /* the flag without "--" */
    hpd_opt_kind_t kind;
    uint64_t min, max, mult; /* integers; mult 0 or 1: any */
    float fmin, fmax;
    bool open_min;        /* F32: min itself is not allowed */
    const char *def;      /* applied before parsing; NULL: none (the program resolves it) */
    const char *arg;      /* the value's placeholder in --help ("N", "ADDR") */
    const char *help;     /* one line or more ('\n' separated) */
    unsigned roles;       /* hpd_opt_role_t bits */
    const char *manifest; /* its manifest field ("kv_pages", "prefix_cache.checkpoints");
                             NULL: none */
} hpd_opt_t;

extern const hpd_opt_t hpd_options[];
extern const size_t hpd_n_options;

/* The table's entry for a flag name (without "--"), NULL for none. */
const hpd_opt_t *hpd_opt_find(const char *name);
/* The entry of a manifest field, NULL for none. */
const hpd_opt_t *hpd_opt_find_manifest(const char *field);
/* "prefill nodes", "the coordinator", "nodes", ... */
const char *hpd_opt_roles_text(unsigned roles);

typedef struct {
    const char *name; /* an option of the table */
    void *dst;        /* its storage, of the kind's type */
    const char *def;  /* optional: this program's default instead of the table's */
    bool required;
    /* CUSTOM: reads text into dst; false with err filled when it is invalid */
    bool (*parse)(const char *text, void *dst, char *err, size_t len);
} hpd_opt_bind_t;

/* A bind of an option to its storage. */
#define HPD_OPT_BIND(name_, dst_) {.name = (name_), .dst = (dst_)}

/* Checks text as opt's value and stores it in dst (NULL: check only). On
 * false err says "--NAME: 'TEXT' is invalid (expected ...)". */
bool hpd_opt_value(const hpd_opt_t *opt, const char *text, void *dst, char *err, size_t len);

/* Parses argv for a program of `role` (its name for messages: prog) with
 * its binds. Returns 0 when all is well, 1 after printing --help to
 * stdout (the caller exits 0), -1 after printing what is wrong to stderr
 * (an option of another role, a bad value, a missing required option, an
 * unknown one, a stray argument). intro is the usage line. */
int hpd_opt_parse(int argc, char **argv, const char *prog, unsigned role, const char *intro,
                  const hpd_opt_bind_t *binds, size_t n_binds);

/* The help of the options bound, as hpd_opt_parse prints it. */
void hpd_opt_usage(FILE *f, const char *intro, const hpd_opt_bind_t *binds, size_t n_binds);

#endif
