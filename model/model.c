#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"
#include "model/safetensors.h"

#define LOG_COMPONENT "model"

uint32_t hpd_model_gdn_in_rows(const hpd_model_config_t *c)
{
    return c->conv_dim + c->lin_n_v_heads * c->lin_v_dim + 2 * c->lin_n_v_heads;
}

uint32_t hpd_model_attn_qkv_rows(const hpd_model_config_t *c)
{
    return c->n_heads * 2 * c->head_dim + 2 * c->n_kv_heads * c->head_dim;
}

typedef struct {
    const hpd_st_archive_t *ar;
    const char *dir;
    const char *prefix; /* "model." or "model.language_model." */
    char name[256];
} loader_t;

static const char *tensor_name(loader_t *ld, const char *fmt, ...)
{
    va_list ap;
    size_t n = (size_t)snprintf(ld->name, sizeof(ld->name), "%s", ld->prefix);

    va_start(ap, fmt);
    vsnprintf(ld->name + n, sizeof(ld->name) - n, fmt, ap);
    va_end(ap);
    return ld->name;
}

static void shape_str(const uint64_t *shape, uint32_t ndim, char *out, size_t len)
{
    size_t n = (size_t)snprintf(out, len, "[");
    for (uint32_t d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(out + n, len - n, "%s%llu", d ? ", " : "",
                              (unsigned long long)shape[d]);
    if (n < len)
        snprintf(out + n, len - n, "]");
}

/* Finds `name`, checks its shape against (d0, d1[, d2]) (ndim from the number
 * of non-zero dims) and returns it. */
static hpd_status_t find_checked(loader_t *ld, const char *name, uint32_t ndim,
                                 const uint64_t *dims, const hpd_st_tensor_t **t_p)
{
    const hpd_st_tensor_t *t = hpd_st_archive_find(ld->ar, name);
    char want[96], got[96];
    bool ok;

    if (t == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: missing tensor '%s'", ld->dir, name);
        return HPD_ERR_NOT_FOUND;
    }
    const char *file = hpd_st_archive_path(ld->ar, t->file);
    if (!t->dtype_known) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' has dtype %s (expected F32, F16 or BF16)",
                      file, name, t->dtype_name);
        return HPD_ERR_FORMAT;
    }
    ok = t->ndim == ndim;
    for (uint32_t d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == dims[d];
    if (!ok) {
        shape_str(dims, ndim, want, sizeof(want));
        shape_str(t->shape, t->ndim, got, sizeof(got));
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' has shape %s, expected %s", file, name, got,
                      want);
        return HPD_ERR_FORMAT;
    }
    *t_p = t;
    return HPD_OK;
}

/* Converts a whole tensor of the expected shape into dst. */
static hpd_status_t load_into(loader_t *ld, const char *name, uint32_t ndim, uint64_t d0,
                              uint64_t d1, uint64_t d2, float *dst)
{
    const uint64_t dims[3] = {d0, d1, d2};
    const hpd_st_tensor_t *t;
    hpd_status_t st = find_checked(ld, name, ndim, dims, &t);

    if (st == HPD_OK)
        hpd_dtype_to_f32(t->dtype, t->data, dst, t->n_elements);
    return st;
}

static float *alloc_f32(hpd_model_t *m, size_t n)
{
    m->n_params += n;
    return malloc(n * sizeof(float));
}

/* Qwen3-Next packs q, k, v and z per key head: group g holds
 * [q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv)] and in_proj_ba holds
 * [b_g (r) | a_g (r)]. This unpacks both into the Qwen3.5 order q|k|v|z|b|a. */
static hpd_status_t load_gdn_next(loader_t *ld, const hpd_model_config_t *c, uint32_t l,
                                  float *gdn_in)
{
    const uint64_t H = c->hidden_size, nk = c->lin_n_k_heads, dk = c->lin_k_dim;
    const uint64_t r = c->lin_n_v_heads / c->lin_n_k_heads, dv = c->lin_v_dim;
    const uint64_t nv = c->lin_n_v_heads, group = 2 * dk + 2 * r * dv;
    const uint64_t v_base = 2 * nk * dk, z_base = c->conv_dim;
    const uint64_t b_base = z_base + nv * dv, a_base = b_base + nv;
    float *tmp = malloc(nk * group * H * sizeof(float));
    hpd_status_t st;

    if (tmp == NULL)
        return HPD_ERR_NO_MEMORY;
    st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_qkvz.weight", l), 2,
                   nk * group, H, 0, tmp);
    if (st != HPD_OK)
        goto out;
    for (uint64_t g = 0; g < nk; g++) {
        const float *src = tmp + g * group * H;
        memcpy(gdn_in + (g * dk) * H, src, dk * H * sizeof(float));
        memcpy(gdn_in + (nk * dk + g * dk) * H, src + dk * H, dk * H * sizeof(float));
        memcpy(gdn_in + (v_base + g * r * dv) * H, src + 2 * dk * H, r * dv * H * sizeof(float));
        memcpy(gdn_in + (z_base + g * r * dv) * H, src + (2 * dk + r * dv) * H,
               r * dv * H * sizeof(float));
    }
    st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_ba.weight", l), 2,
                   nk * 2 * r, H, 0, tmp);
    if (st != HPD_OK)
        goto out;
    for (uint64_t g = 0; g < nk; g++) {
        memcpy(gdn_in + (b_base + g * r) * H, tmp + (g * 2 * r) * H, r * H * sizeof(float));
        memcpy(gdn_in + (a_base + g * r) * H, tmp + (g * 2 * r + r) * H, r * H * sizeof(float));
    }
out:
    free(tmp);
    return st;
}

static hpd_status_t load_gdn_35(loader_t *ld, const hpd_model_config_t *c, uint32_t l,
                                float *gdn_in)
{
    const uint64_t H = c->hidden_size, nv = c->lin_n_v_heads, dv = c->lin_v_dim;
    hpd_status_t st;

    st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_qkv.weight", l), 2,
                   c->conv_dim, H, 0, gdn_in);
    if (st == HPD_OK)
        st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_z.weight", l), 2,
                       nv * dv, H, 0, gdn_in + (uint64_t)c->conv_dim * H);
    if (st == HPD_OK)
        st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_b.weight", l), 2, nv,
                       H, 0, gdn_in + ((uint64_t)c->conv_dim + nv * dv) * H);
    if (st == HPD_OK)
        st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_a.weight", l), 2, nv,
                       H, 0, gdn_in + ((uint64_t)c->conv_dim + nv * dv + nv) * H);
    return st;
}

static hpd_status_t load_layer(loader_t *ld, hpd_model_t *m, uint32_t l)
{
    const hpd_model_config_t *c = &m->config;
    hpd_layer_weights_t *w = &m->layers[l];
    const uint64_t H = c->hidden_size, I = c->intermediate_size;
    hpd_status_t st;

    w->input_norm = alloc_f32(m, H);
    w->post_norm = alloc_f32(m, H);
    w->mlp_gate_up = alloc_f32(m, 2 * I * H);
    w->mlp_down = alloc_f32(m, H * I);
    if (!w->input_norm || !w->post_norm || !w->mlp_gate_up || !w->mlp_down)
        return HPD_ERR_NO_MEMORY;
    if ((st = load_into(ld, tensor_name(ld, "layers.%u.input_layernorm.weight", l), 1, H, 0, 0,
                        w->input_norm)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.post_attention_layernorm.weight", l), 1,
                        H, 0, 0, w->post_norm)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.mlp.gate_proj.weight", l), 2, I, H, 0,
                        w->mlp_gate_up)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.mlp.up_proj.weight", l), 2, I, H, 0,
                        w->mlp_gate_up + I * H)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.mlp.down_proj.weight", l), 2, H, I, 0,
                        w->mlp_down)) != HPD_OK)
        return st;

    if (c->layer_full[l]) {
        const uint64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
        w->attn_qkv = alloc_f32(m, (uint64_t)hpd_model_attn_qkv_rows(c) * H);
        w->attn_o = alloc_f32(m, H * nh * hd);
        w->q_norm = alloc_f32(m, hd);
        w->k_norm = alloc_f32(m, hd);
        if (!w->attn_qkv || !w->attn_o || !w->q_norm || !w->k_norm)
            return HPD_ERR_NO_MEMORY;
        if ((st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.q_proj.weight", l), 2,
                            nh * 2 * hd, H, 0, w->attn_qkv)) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.k_proj.weight", l), 2,
                            nkv * hd, H, 0, w->attn_qkv + nh * 2 * hd * H)) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.v_proj.weight", l), 2,
                            nkv * hd, H, 0, w->attn_qkv + (nh * 2 + nkv) * hd * H)) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.o_proj.weight", l), 2, H,
                            nh * hd, 0, w->attn_o)) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.q_norm.weight", l), 1, hd, 0,
                            0, w->q_norm)) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.k_norm.weight", l), 1, hd, 0,
                            0, w->k_norm)) != HPD_OK)
            return st;
        return HPD_OK;
    }

    const uint64_t nv = c->lin_n_v_heads, dv = c->lin_v_dim;
    w->gdn_in = alloc_f32(m, (uint64_t)hpd_model_gdn_in_rows(c) * H);
    w->gdn_conv = alloc_f32(m, (uint64_t)c->conv_dim * c->conv_kernel);
    w->gdn_a_log = alloc_f32(m, nv);
    w->gdn_dt_bias = alloc_f32(m, nv);
    w->gdn_norm = alloc_f32(m, dv);
    w->gdn_out = alloc_f32(m, H * nv * dv);
    if (!w->gdn_in || !w->gdn_conv || !w->gdn_a_log || !w->gdn_dt_bias || !w->gdn_norm ||
        !w->gdn_out)
        return HPD_ERR_NO_MEMORY;
    st = c->arch == HPD_ARCH_QWEN3_NEXT ? load_gdn_next(ld, c, l, w->gdn_in)
                                        : load_gdn_35(ld, c, l, w->gdn_in);
    if (st != HPD_OK)
        return st;
    if ((st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.conv1d.weight", l), 3,
                        c->conv_dim, 1, c->conv_kernel, w->gdn_conv)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.A_log", l), 1, nv, 0, 0,
                        w->gdn_a_log)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.dt_bias", l), 1, nv, 0, 0,
                        w->gdn_dt_bias)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.norm.weight", l), 1, dv, 0, 0,
                        w->gdn_norm)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.out_proj.weight", l), 2, H,
                        nv * dv, 0, w->gdn_out)) != HPD_OK)
        return st;
    return HPD_OK;
}

static hpd_status_t fingerprint(hpd_model_t *m, const char *model_dir,
                                const hpd_st_archive_t *ar)
{
    XXH3_state_t *state = XXH3_createState();
    char path[4096];
    char *text;
    size_t len;
    hpd_status_t st;
    XXH128_hash_t h;
    XXH128_canonical_t canon;

    if (state == NULL)
        return HPD_ERR_NO_MEMORY;
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    if ((st = hpd_read_file(path, &text, &len)) != HPD_OK) {
        XXH3_freeState(state);
        return st;
    }
    XXH3_128bits_reset(state);
    XXH3_128bits_update(state, text, len);
    free(text);
    /* tensors are iterated in name order, so sharding does not matter */
    for (size_t i = 0; i < hpd_st_archive_count(ar); i++) {
        const hpd_st_tensor_t *t = hpd_st_archive_get(ar, i);
        XXH3_128bits_update(state, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(state, t->dtype_name, strlen(t->dtype_name) + 1);
        XXH3_128bits_update(state, t->shape, t->ndim * sizeof(t->shape[0]));
        XXH3_128bits_update(state, t->data, t->nbytes);
    }
    /* the end-of-sequence ids, wherever they came from (generation_config.json
     * is not hashed whole): nodes that would stop differently differ */
    XXH3_128bits_update(state, &m->config.n_eos, sizeof(m->config.n_eos));
    XXH3_128bits_update(state, m->config.eos_ids, m->config.n_eos * sizeof(int32_t));
    /* and the sampling defaults, so every node resolves a request alike */
    const float gen[2] = {m->config.gen_sampling.temperature, m->config.gen_sampling.top_p};
    XXH3_128bits_update(state, gen, sizeof(gen));
    XXH3_128bits_update(state, &m->config.gen_sampling.top_k, sizeof(uint32_t));
    h = XXH3_128bits_digest(state);
    XXH3_freeState(state);
    XXH128_canonicalFromHash(&canon, h);
    memcpy(m->fingerprint, canon.digest, 16);
    return HPD_OK;
}

hpd_status_t hpd_model_load(const char *model_dir, hpd_model_t **model_p)
{
    hpd_model_t *m = calloc(1, sizeof(*m));
    hpd_st_archive_t *ar = NULL;
    loader_t ld;
    hpd_status_t st;
    uint64_t V, H;

    if (m == NULL)
        return HPD_ERR_NO_MEMORY;
    if ((st = hpd_model_config_load(model_dir, &m->config)) != HPD_OK)
        goto err;
    if ((st = hpd_st_archive_open(model_dir, &ar)) != HPD_OK)
        goto err;
    ld.ar = ar;
    ld.dir = model_dir;
    for (size_t i = 0; i < hpd_st_archive_count(ar); i++) {
        const char *name = hpd_st_archive_get(ar, i)->name;
        m->skipped_visual += strncmp(name, "model.visual.", 13) == 0;
        m->skipped_mtp += strncmp(name, "mtp.", 4) == 0;
    }
    if (m->skipped_visual + m->skipped_mtp > 0)
        HPD_LOG_INFO(LOG_COMPONENT, "%s: skipping %u tensors of the vision tower (model.visual.*) "
                     "and %u of the MTP head (mtp.*): text generation does not use them",
                     model_dir, m->skipped_visual, m->skipped_mtp);
    ld.prefix = hpd_st_archive_find(ar, "model.language_model.embed_tokens.weight") != NULL
                    ? "model.language_model."
                    : "model.";
    V = m->config.vocab_size;
    H = m->config.hidden_size;
    m->embed = alloc_f32(m, V * H);
    m->final_norm = alloc_f32(m, H);
    if (m->embed == NULL || m->final_norm == NULL) {
        st = HPD_ERR_NO_MEMORY;
        goto err;
    }
    if ((st = load_into(&ld, tensor_name(&ld, "embed_tokens.weight"), 2, V, H, 0, m->embed)) !=
            HPD_OK ||
        (st = load_into(&ld, tensor_name(&ld, "norm.weight"), 1, H, 0, 0, m->final_norm)) !=
            HPD_OK)
        goto err;
    if (m->config.tie_word_embeddings) {
        m->lm_head = m->embed;
    } else {
        m->lm_head = alloc_f32(m, V * H);
        if (m->lm_head == NULL) {
            st = HPD_ERR_NO_MEMORY;
            goto err;
        }
        if ((st = load_into(&ld, "lm_head.weight", 2, V, H, 0, m->lm_head)) != HPD_OK)
            goto err;
    }
    for (uint32_t l = 0; l < m->config.n_layers; l++)
        if ((st = load_layer(&ld, m, l)) != HPD_OK)
            goto err;
    if ((st = fingerprint(m, model_dir, ar)) != HPD_OK)
        goto err;
    hpd_st_archive_destroy(ar);
    *model_p = m;
    return HPD_OK;

err:
    if (st == HPD_ERR_NO_MEMORY)
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: out of memory while loading weights", model_dir);
    hpd_st_archive_destroy(ar);
    hpd_model_destroy(m);
    return st;
}

uint32_t hpd_model_tensors(hpd_model_t *m, hpd_model_tensor_t *out)
{
    const hpd_model_config_t *c = &m->config;
    const uint64_t V = c->vocab_size, H = c->hidden_size, I = c->intermediate_size;
    const uint64_t nh = c->n_heads, hd = c->head_dim;
    const uint64_t nv = c->lin_n_v_heads, dv = c->lin_v_dim;
    uint32_t n = 0;

#define T(ptr, count) out[n++] = (hpd_model_tensor_t){.slot = &(ptr), .floats = (count)}
    T(m->embed, V * H);
    T(m->final_norm, H);
    if (!c->tie_word_embeddings)
        T(m->lm_head, V * H);
    for (uint32_t l = 0; l < c->n_layers && l < HPD_MAX_LAYERS; l++) {
        hpd_layer_weights_t *w = &m->layers[l];
        T(w->input_norm, H);
        T(w->post_norm, H);
        T(w->mlp_gate_up, 2 * I * H);
        T(w->mlp_down, H * I);
        if (c->layer_full[l]) {
            T(w->attn_qkv, (uint64_t)hpd_model_attn_qkv_rows(c) * H);
            T(w->attn_o, H * nh * hd);
            T(w->q_norm, hd);
            T(w->k_norm, hd);
        } else {
            T(w->gdn_in, (uint64_t)hpd_model_gdn_in_rows(c) * H);
            T(w->gdn_conv, (uint64_t)c->conv_dim * c->conv_kernel);
            T(w->gdn_a_log, nv);
            T(w->gdn_dt_bias, nv);
            T(w->gdn_norm, dv);
            T(w->gdn_out, H * nv * dv);
        }
    }
#undef T
    return n;
}

void hpd_model_destroy(hpd_model_t *m)
{
    hpd_model_tensor_t t[HPD_MODEL_MAX_TENSORS];
    if (m == NULL)
        return;
    /* a config that failed to load lists no layers: free what was loaded */
    const uint32_t n = hpd_model_tensors(m, t);
    for (uint32_t i = 0; i < n; i++)
        free(*t[i].slot);
    free(m);
}

void hpd_model_fingerprint_hex(const hpd_model_t *m, char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", m->fingerprint[i]);
}
