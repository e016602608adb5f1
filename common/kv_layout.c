#include "common/kv_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "kv_layout"
#define MAX_BLOCK_SIZE 4096

hpd_status_t hpd_kv_layout_validate(const hpd_kv_layout_t *l)
{
    if (l->block_size == 0 || l->block_size % 16 != 0 || l->block_size > MAX_BLOCK_SIZE) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "kv block size %u is invalid (expected a multiple of 16 from 16 to %d)",
                      l->block_size, MAX_BLOCK_SIZE);
        return HPD_ERR_INVALID_ARG;
    }
    if (l->n_layers == 0 || l->n_kv_heads == 0 || l->head_dim == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "kv layout shape %u layers x %u heads x %u is empty",
                      l->n_layers, l->n_kv_heads, l->head_dim);
        return HPD_ERR_INVALID_ARG;
    }
    if (l->pack_size == 0 || l->pack_size > l->n_layers) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "kv pack size %u is invalid (expected 1 to %u, the number of "
                      "full-attention layers)",
                      l->pack_size, l->n_layers);
        return HPD_ERR_INVALID_ARG;
    }
    if (l->order != HPD_KV_NHD && l->order != HPD_KV_HND) {
        HPD_LOG_ERROR(LOG_COMPONENT, "kv order %d is invalid (expected nhd or hnd)", l->order);
        return HPD_ERR_INVALID_ARG;
    }
    return HPD_OK;
}

hpd_status_t hpd_kv_layout_parse(const char *text, hpd_kv_layout_t *layout_p)
{
    char buf[64], *save = NULL, *tok[4];
    int n = 0;
    uint64_t b, p;

    if (strlen(text) >= sizeof(buf))
        goto bad;
    strcpy(buf, text);
    for (char *s = strtok_r(buf, ",", &save); s != NULL && n < 4; s = strtok_r(NULL, ",", &save))
        tok[n++] = s;
    if (n != 3 || hpd_parse_u64(tok[0], 1, MAX_BLOCK_SIZE, &b) != 0 ||
        hpd_parse_u64(tok[1], 1, 1024, &p) != 0)
        goto bad;
    if (strcasecmp(tok[2], "nhd") == 0)
        layout_p->order = HPD_KV_NHD;
    else if (strcasecmp(tok[2], "hnd") == 0)
        layout_p->order = HPD_KV_HND;
    else
        goto bad;
    layout_p->block_size = (uint32_t)b;
    layout_p->pack_size = (uint32_t)p;
    return HPD_OK;
bad:
    HPD_LOG_ERROR(LOG_COMPONENT, "kv layout '%s' is invalid (expected B,P,nhd|hnd, e.g. 64,1,nhd)",
                  text);
    return HPD_ERR_INVALID_ARG;
}

void hpd_kv_layout_format(const hpd_kv_layout_t *l, char *out, uint32_t len)
{
    snprintf(out, len, "B=%u P=%u %s %s", l->block_size, l->pack_size,
             l->order == HPD_KV_NHD ? "NHD" : "HND", hpd_dtype_name(l->dtype));
}
