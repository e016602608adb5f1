/* Who may talk to the coordinator, and as what (docs/cluster.md,
 * "Credentials"): the node secret (the token file) makes a connection a
 * node, and only a node; each client API key (the client keys file, one
 * per line with an optional tenant name) makes it a client. The node
 * secret is never a client key: whoever holds a client key can neither
 * register as a node nor see another tenant's prompts. */
#ifndef HPD_COORDINATOR_CREDENTIALS_H
#define HPD_COORDINATOR_CREDENTIALS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The roles of the coordinator's methods (hpd_rpc_method_t.roles). */
enum { HPD_ROLE_CLIENT = 1u << 0, HPD_ROLE_NODE = 1u << 1 };

typedef struct hpd_credentials hpd_credentials_t;

/* Reads the node secret from token_file (its first line) and, when
 * keys_file is not NULL, the client keys: one per line, `KEY` or
 * `KEY TENANT`, blank lines and lines starting with '#' ignored; a key has
 * 16 to 256 printable characters and appears once. A bad file is refused
 * with the line and what is wrong in err. */
hpd_status_t hpd_credentials_load(const char *token_file, const char *keys_file,
                                  hpd_credentials_t **creds_p, char *err, size_t err_len);
void hpd_credentials_destroy(hpd_credentials_t *creds);

/* The roles a presented token grants (0: none), compared in constant time
 * against every credential; who names it ("node", the tenant, or "client
 * key N" for a key without one) and *id_p identifies it (a hash of the
 * token). */
uint32_t hpd_credentials_check(const hpd_credentials_t *creds, const char *token, size_t len,
                               char *who, size_t who_len, uint64_t *id_p);

/* Whether the credential with this id still grants the role (after a
 * reload: a revoked key does not). */
bool hpd_credentials_grants(const hpd_credentials_t *creds, uint64_t id, uint32_t role);

/* How many client keys (0 without a keys file). */
size_t hpd_credentials_n_keys(const hpd_credentials_t *creds);

#endif
