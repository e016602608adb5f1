/* The OpenAI-compatible HTTP API of the coordinator (docs/api.md), on
 * libevent's evhttp in the coordinator's loop:
 *
 *   GET  /v1/models, /v1/models/NAME
 *   POST /v1/completions        prompt as text or token ids
 *   POST /v1/chat/completions   messages in the model's chat format
 *   POST /tokenize, /detokenize as vLLM's
 *
 * Text is tokenized here, once (coordinator/text.h); the request then goes
 * through hpd_coord_submit like a msgpack client's. `stream: true` answers
 * with server-sent events ending in `data: [DONE]`. Keys are the
 * coordinator's client keys (`Authorization: Bearer KEY`), checked from a
 * request's head before its body is read (transport/http_guard.h); a client that
 * disconnects cancels its request on every node. Errors have OpenAI's shape
 * ({"error": {"message", "type", "param", "code"}}) and status: 400 invalid,
 * 401 bad key, 404 unknown model or path, 413 too large, 429 overloaded or no
 * node yet, 503 draining. */
#ifndef HPD_COORDINATOR_OPENAI_H
#define HPD_COORDINATOR_OPENAI_H

#include <event2/event.h>
#include <stdint.h>

#include "common/status.h"
#include "coordinator/coordinator.h"
#include "transport/budget.h"

typedef struct hpd_openai hpd_openai_t;

typedef struct {
    struct event_base *base;
    hpd_coord_t *coord;
    const char *host;
    uint16_t port;          /* 0: any free port */
    const char *model_dir;  /* the coordinator's (hpd_coord_opts_t.model_dir) */
    const char *model_name; /* the served name; NULL: the directory's last part */
    hpd_conn_budget_t *budget; /* NULL: the process's (transport/budget.h) */
} hpd_openai_params_t;

/* A request body beyond this is refused (413). */
#define HPD_OPENAI_MAX_BODY (8u << 20)

/* Loads the tokenizer and listens. err says what failed (the tokenizer,
 * the port). */
hpd_status_t hpd_openai_create(const hpd_openai_params_t *p, hpd_openai_t **api_p, char *err,
                               size_t err_len);
uint16_t hpd_openai_port(const hpd_openai_t *api);
const char *hpd_openai_model(const hpd_openai_t *api);
/* After the coordinator read its credentials again (SIGHUP): closes the
 * connections of client keys that no longer grant the client role,
 * streams too (their requests are canceled as at a disconnect). Returns
 * how many. */
uint32_t hpd_openai_reload(hpd_openai_t *api);
/* Refreshes its gauges (hpd_http_connections{state},
 * hpd_http_connections_closed_total{reason}) before a scrape. */
void hpd_openai_collect(hpd_openai_t *api);
/* Call after hpd_coord_destroy (which ends every request it holds). */
void hpd_openai_destroy(hpd_openai_t *api);

#endif
