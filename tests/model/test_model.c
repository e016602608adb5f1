/* Model loading: every naming, dtype and sharding of the same random model
 * loads into the same weights; bad model files are refused by name. */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/util.h"
#include "kernels/tp_sum.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/test_helpers.h"

#define SMALL "--hidden 64 --layers 5 --full-interval 3 --intermediate 96 --vocab 200 " \
              "--heads 2 --kv-heads 1 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "   \
              "--lin-k-dim 16 --lin-v-dim 24 --seed 5"

static char root[256];

static int setup(void **state)
{
    test_tmpdir(root, sizeof(root), "model");
    return 0;
}

static int teardown(void **state)
{
    test_rmtree(root);
    return 0;
}

static hpd_model_t *make_and_load(const char *name, const char *extra)
{
    char dir[512], args[1024];
    hpd_model_t *m = NULL;
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    snprintf(args, sizeof(args), "%s %s", SMALL, extra);
    assert_int_equal(test_mkmodel(dir, args), 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    return m;
}

/* Where a tensor's slot sits in m, for messages: its layer and its byte
 * offset in hpd_layer_weights_t, or the top level. */
static const char *tensor_where(const hpd_model_t *m, void *const *slot)
{
    static char buf[64];
    const char *p = (const char *)slot, *l0 = (const char *)&m->layers[0];
    if (p < l0 || p >= (const char *)&m->layers[HPD_MAX_LAYERS])
        return "embed, final_norm or lm_head";
    const size_t off = (size_t)(p - l0);
    snprintf(buf, sizeof(buf), "layer %zu, byte %zu of hpd_layer_weights_t",
             off / sizeof(m->layers[0]), off % sizeof(m->layers[0]));
    return buf;
}

/* Every tensor of a and b, bit for bit and in the same dtype. Walking
 * hpd_model_tensors (the list that destroy frees) means a tensor added to
 * the model is compared without touching this test. */
static void assert_same_weights(hpd_model_t *a, hpd_model_t *b)
{
    hpd_model_tensor_t ta[HPD_MODEL_MAX_TENSORS], tb[HPD_MODEL_MAX_TENSORS];
    const uint32_t n = hpd_model_tensors(a, ta);

    assert_int_equal(hpd_model_tensors(b, tb), n);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(ta[i].elements, tb[i].elements);
        assert_int_equal(ta[i].dtype, tb[i].dtype);
        assert_non_null(*ta[i].slot);
        assert_non_null(*tb[i].slot);
        if (memcmp(*ta[i].slot, *tb[i].slot, ta[i].bytes) != 0)
            fail_msg("tensor %u of %u (%s) differs", i, n, tensor_where(a, ta[i].slot));
    }
}

/* Every element of every tensor of lo (bf16 on disk) is that of f32 (the
 * same seed in f32) rounded to bf16; lo's matrices stay BF16 (no fp32
 * copy), its vectors are widened, and f32's are all F32. */
static void assert_bf16_of(hpd_model_t *lo, hpd_model_t *f32)
{
    hpd_model_tensor_t tl[HPD_MODEL_MAX_TENSORS], tf[HPD_MODEL_MAX_TENSORS];
    const uint32_t n = hpd_model_tensors(lo, tl);
    uint32_t matrices = 0;

    assert_int_equal(hpd_model_tensors(f32, tf), n);
    for (uint32_t i = 0; i < n; i++) {
        const float *f = *tf[i].slot;
        assert_int_equal(tl[i].elements, tf[i].elements);
        assert_int_equal(tf[i].dtype, HPD_DTYPE_F32);
        assert_true(tl[i].dtype == HPD_DTYPE_F32 || tl[i].dtype == HPD_DTYPE_BF16);
        matrices += tl[i].dtype == HPD_DTYPE_BF16;
        for (uint64_t e = 0; e < tl[i].elements; e++) {
            float l;
            hpd_dtype_to_f32(tl[i].dtype, (const char *)*tl[i].slot + e * hpd_dtype_size(tl[i].dtype),
                             &l, 1);
            const float want = hpd_bf16_to_f32(hpd_f32_to_bf16(f[e]));
            if (memcmp(&l, &want, sizeof(float)) != 0)
                fail_msg("tensor %u element %" PRIu64 ": %.9g, want %.9g", i, e, l, want);
        }
    }
    /* embed, lm_head, and per layer the MLP's two and the mixer's two */
    assert_int_equal(matrices, 2 + 4 * lo->config.n_layers);
    assert_true(lo->weight_bytes < f32->weight_bytes * 0.55);
}

static void test_namings_dtypes_shards(void **state)
{
    hpd_model_t *next = make_and_load("next", "--arch qwen3_next --dtype bf16");
    hpd_model_t *q35 = make_and_load("q35", "--arch qwen3_5_text --dtype bf16");
    hpd_model_t *nested = make_and_load("nested", "--arch qwen3_5 --dtype bf16 --shards 3");
    hpd_model_t *interval = make_and_load("interval", "--dtype bf16 --interval-only");
    hpd_model_t *f32 = make_and_load("f32", "--dtype f32");
    hpd_model_t *f16 = make_and_load("f16", "--dtype f16 --tie");

    assert_int_equal(next->config.arch, HPD_ARCH_QWEN3_NEXT);
    assert_int_equal(nested->config.arch, HPD_ARCH_QWEN3_5);
    assert_int_equal(next->config.n_full_layers, 1);
    assert_true(next->config.layer_full[2] && !next->config.layer_full[3]);
    /* Qwen3-Next's grouped qkvz/ba unpack to the Qwen3.5 order exactly */
    assert_same_weights(next, q35);
    assert_same_weights(next, nested);
    assert_same_weights(next, interval);
    /* bf16 on disk is the f32 model rounded */
    assert_bf16_of(next, f32);
    assert_true(f16->lm_head.p == f16->embed.p); /* tied */
    assert_int_equal(f16->embed.dtype, HPD_DTYPE_F16);
    /* fingerprints tell files apart */
    assert_memory_not_equal(next->fingerprint, f32->fingerprint, 16);
    assert_memory_not_equal(next->fingerprint, q35->fingerprint, 16);
    hpd_model_t *again;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/next", root);
    assert_int_equal(hpd_model_load(dir, &again), HPD_OK);
    assert_memory_equal(next->fingerprint, again->fingerprint, 16);
    hpd_model_destroy(again);
    hpd_model_destroy(next);
    hpd_model_destroy(q35);
    hpd_model_destroy(nested);
    hpd_model_destroy(interval);
    hpd_model_destroy(f32);
    hpd_model_destroy(f16);
}

/* Rewrites dir/model.safetensors with one tensor dropped, reshaped or
 * retyped, or with tensors added. mode: 0 drop, 1 wrong shape, 2 add victim
 * (a copy of the first tensor under that name), 3 the victim's first byte
 * flipped (the same shapes and names). */
static void rewrite(const char *dir, const char *victim, int mode)
{
    char path[600];
    hpd_st_archive_t *ar;
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    size_t n = hpd_st_archive_count(ar), k = 0;
    hpd_st_write_tensor_t *t = calloc(n, sizeof(*t));
    void **copies = calloc(n, sizeof(void *));
    for (size_t i = 0; i < n; i++) {
        const hpd_st_tensor_t *s = hpd_st_archive_get(ar, i);
        if (strcmp(s->name, victim) == 0 && mode == 0)
            continue;
        char scale_name[300];
        snprintf(scale_name, sizeof(scale_name), "%s_scale_inv", victim);
        if (mode == 4 && strcmp(s->name, scale_name) == 0)
            continue;
        copies[k] = malloc(s->nbytes + 1);
        memcpy(copies[k], s->data, s->nbytes);
        t[k].name = s->name;
        t[k].dtype = s->dtype;
        t[k].ndim = s->ndim;
        memcpy(t[k].shape, s->shape, sizeof(s->shape));
        t[k].data = copies[k];
        if (strcmp(s->name, victim) == 0 && mode == 1) { /* same bytes, transposed shape */
            t[k].shape[0] = s->shape[1];
            t[k].shape[1] = s->shape[0];
        }
        if (strcmp(s->name, victim) == 0 && mode == 3)
            ((uint8_t *)copies[k])[0] ^= 0x40;
        if (strcmp(s->name, victim) == 0 && mode == 4) { /* FP8 2-D, dequantised to BF16 */
            const hpd_st_tensor_t *g = hpd_st_archive_find(ar, scale_name);
            const uint64_t rows = s->shape[0], cols = s->shape[1], gc = g->shape[1];
            const uint64_t br = (rows + g->shape[0] - 1) / g->shape[0], bc = (cols + gc - 1) / gc;
            uint16_t *bf = malloc(rows * cols * sizeof(uint16_t));
            for (uint64_t r = 0; r < rows; r++)
                for (uint64_t c = 0; c < cols; c++) {
                    float q, sc;
                    hpd_dtype_to_f32(HPD_DTYPE_F8_E4M3, (const uint8_t *)s->data + r * cols + c,
                                     &q, 1);
                    memcpy(&sc, (const char *)g->data + ((r / br) * gc + c / bc) * sizeof(float),
                           sizeof(float));
                    bf[r * cols + c] = hpd_f32_to_bf16(q * sc);
                }
            free(copies[k]);
            copies[k] = bf;
            t[k].data = bf;
            t[k].dtype = HPD_DTYPE_BF16;
        }
        k++;
    }
    if (mode == 2) {
        t = realloc(t, (k + 1) * sizeof(*t));
        t[k] = t[0];
        t[k].name = victim;
        k++;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.new", dir);
    assert_int_equal(hpd_st_write(path, t, k), HPD_OK);
    hpd_st_archive_destroy(ar);
    char final[600];
    snprintf(final, sizeof(final), "%s/model.safetensors", dir);
    assert_int_equal(rename(path, final), 0);
    for (size_t i = 0; i < k - (mode == 2); i++)
        free(copies[i]);
    free(copies);
    free(t);
}

/* A checkpoint's vision tower and MTP head (Qwen3.5 releases ship both)
 * are skipped and counted; the language model loads as without them. */
static void test_skips_vision_and_mtp(void **state)
{
    char dir[512], plain_dir[512];
    hpd_model_t *m = NULL, *plain = NULL;
    snprintf(dir, sizeof(dir), "%s/with-vision", root);
    snprintf(plain_dir, sizeof(plain_dir), "%s/without-vision", root);
    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    assert_int_equal(test_mkmodel(plain_dir, SMALL), 0);
    rewrite(dir, "model.visual.blocks.0.norm1.weight", 2);
    rewrite(dir, "model.visual.merger.mlp.0.weight", 2);
    rewrite(dir, "mtp.fc.weight", 2);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    assert_int_equal(hpd_model_load(plain_dir, &plain), HPD_OK);
    assert_int_equal(m->skipped_visual, 2);
    assert_int_equal(m->skipped_mtp, 1);
    assert_int_equal(plain->skipped_visual + plain->skipped_mtp, 0);
    assert_same_weights(m, plain);
    hpd_model_destroy(m);
    hpd_model_destroy(plain);
}

/* generation_config.json's eos_token_id, when present, is the one used and
 * is part of the fingerprint; a malformed one refuses the model. */
static void test_generation_config(void **state)
{
    char dir[512], path[600];
    hpd_model_t *m = NULL;
    snprintf(dir, sizeof(dir), "%s/gen", root);
    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    uint8_t without[16];
    memcpy(without, m->fingerprint, 16);
    hpd_model_destroy(m);
    static const char gen[] = "{\"eos_token_id\": [5, 9], \"temperature\": 0.7}";
    assert_int_equal(hpd_write_file(path, gen, sizeof(gen) - 1), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    /* nodes that would stop differently are different models to a cluster */
    assert_memory_not_equal(m->fingerprint, without, 16);
    assert_int_equal(m->config.n_eos, 2);
    assert_int_equal(m->config.eos_ids[0], 5);
    assert_int_equal(m->config.eos_ids[1], 9);
    hpd_model_destroy(m);
    /* the sampling defaults: top_p in (0, 1], top_k >= 0 (0: off) */
    static const char sampling[] = "{\"temperature\": 0.6, \"top_p\": 0.8, \"top_k\": 20}";
    assert_int_equal(hpd_write_file(path, sampling, sizeof(sampling) - 1), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    assert_true(m->config.gen_sampling.temperature == 0.6f);
    assert_true(m->config.gen_sampling.top_p == 0.8f);
    assert_int_equal(m->config.gen_sampling.top_k, 20);
    hpd_model_destroy(m);
    /* do_sample false: greedy, whatever the temperature */
    static const char greedy[] = "{\"do_sample\": false, \"temperature\": 0.6}";
    assert_int_equal(hpd_write_file(path, greedy, sizeof(greedy) - 1), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    assert_true(m->config.gen_sampling.temperature == 0.0f);
    hpd_model_destroy(m);
    static const char edges[] = "{\"top_p\": 1, \"top_k\": 0}";
    assert_int_equal(hpd_write_file(path, edges, sizeof(edges) - 1), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    assert_true(m->config.gen_sampling.top_p == 1.0f);
    assert_int_equal(m->config.gen_sampling.top_k, 0);
    hpd_model_destroy(m);
    static const char *const refused[] = {"{\"top_p\": 0}", "{\"top_p\": 1.5}",
                                          "{\"top_p\": \"0.5\"}", "{\"top_k\": -1}",
                                          "{\"top_k\": 2.5}", "{\"temperature\": -0.1}"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        assert_int_equal(hpd_write_file(path, refused[i], strlen(refused[i])), HPD_OK);
        if (hpd_model_load(dir, &m) != HPD_ERR_FORMAT)
            fail_msg("generation_config.json %s was not refused", refused[i]);
    }
    static const char bad[] = "{\"eos_token_id\": \"five\"}";
    assert_int_equal(hpd_write_file(path, bad, sizeof(bad) - 1), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_FORMAT);
    static const char broken[] = "{\"eos_token_id\": [5";
    assert_int_equal(hpd_write_file(path, broken, sizeof(broken) - 1), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_FORMAT);
}

/* The tensor list (what destroy frees and the GPU backend uploads) holds
 * every tensor the load allocated: its bytes add up to weight_bytes and
 * its elements, scales left out, to n_params, for dense and MoE, BF16 and
 * FP8, Qwen3-Next and Qwen3.5 alike; every slot is loaded. */
static void test_tensor_list_accounts(void **state)
{
    static const struct {
        const char *name, *args;
    } models[] = {
        {"acct-dense", ""},
        {"acct-moe", "--experts 6 --experts-per-tok 2 --mlp-only-layers 1"},
        {"acct-fp8", "--experts 6 --experts-per-tok 2 --fp8 16 --mlp-only-layers 1"},
        {"acct-q35", "--arch qwen3_5_moe --experts 6 --experts-per-tok 2 --fused-experts"},
    };
    static hpd_model_tensor_t t[HPD_MODEL_MAX_TENSORS];
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
        hpd_model_t *m = make_and_load(models[i].name, models[i].args);
        const uint32_t n = hpd_model_tensors(m, t);
        uint64_t bytes = 0, params = 0;
        for (uint32_t k = 0; k < n; k++) {
            if (*t[k].slot == NULL)
                fail_msg("%s: tensor %u (%s) not loaded", models[i].name, k,
                         tensor_where(m, t[k].slot));
            bytes += t[k].bytes;
            params += t[k].is_scale ? 0 : t[k].elements;
        }
        if (bytes != m->weight_bytes || params != m->n_params)
            fail_msg("%s: the list holds %llu bytes and %llu parameters; the load counted "
                     "%llu and %llu", models[i].name, (unsigned long long)bytes,
                     (unsigned long long)params, (unsigned long long)m->weight_bytes,
                     (unsigned long long)m->n_params);
        hpd_model_destroy(m);
    }
}

/* The fingerprint covers every weight's bytes: one byte of one tensor
 * changed makes another model to the cluster. */
static void test_fingerprint_covers_weights(void **state)
{
    char dir[512];
    hpd_model_t *m = NULL;
    snprintf(dir, sizeof(dir), "%s/fp-bytes", root);
    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    uint8_t before[16];
    memcpy(before, m->fingerprint, 16);
    hpd_model_destroy(m);
    rewrite(dir, "model.norm.weight", 3);
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    assert_memory_not_equal(m->fingerprint, before, 16);
    /* its hex form: two lower-case digits a byte */
    char hex[33], want[33];
    hpd_model_fingerprint_hex(m, hex);
    for (int i = 0; i < 16; i++)
        snprintf(want + 2 * i, 3, "%02x", m->fingerprint[i]);
    assert_string_equal(hex, want);
    assert_int_equal(strlen(hex), 32);
    /* the fused attention input holds what its row count says: per head
     * q and gate, then k and v */
    const hpd_model_config_t *c = &m->config;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (!c->layer_full[l])
            continue;
        uint32_t rows = 0;
        for (uint32_t p = 0; p < m->layers[l].attn_qkv.n; p++)
            rows += m->layers[l].attn_qkv.rows[p];
        assert_int_equal(rows, hpd_model_attn_qkv_rows(c));
        assert_int_equal(rows, c->n_heads * 2 * c->head_dim + 2 * c->n_kv_heads * c->head_dim);
    }
    hpd_model_destroy(m);
}

/* MoE checkpoints: per-expert and fused 3-D expert tensors, Qwen3-Next and
 * Qwen3.5-MoE (nested, sharded) load into the same weights; the layers
 * transformers keeps dense stay dense; a missing expert is named. */
static void test_moe_namings(void **state)
{
    hpd_model_t *per = make_and_load("moe-per", "--experts 6 --experts-per-tok 2");
    hpd_model_t *fused = make_and_load("moe-fused", "--experts 6 --experts-per-tok 2 "
                                                    "--fused-experts");
    hpd_model_t *q35 = make_and_load("moe-q35", "--arch qwen3_5_moe --experts 6 "
                                                "--experts-per-tok 2 --shards 3 --fused-experts");
    hpd_model_t *mixed = make_and_load("moe-mixed", "--experts 6 --experts-per-tok 2 "
                                                    "--mlp-only-layers 1,4");
    assert_int_equal(per->config.n_moe_layers, per->config.n_layers);
    assert_true(q35->config.moe_family);
    assert_same_weights(per, fused);
    assert_same_weights(per, q35);
    assert_int_equal(mixed->config.n_moe_layers, mixed->config.n_layers - 2);
    assert_false(mixed->config.layer_moe[1] || mixed->config.layer_moe[4]);
    assert_non_null(mixed->layers[1].mlp_gate_up.part[0].p);
    assert_int_equal(mixed->layers[1].moe_in.n, 0);
    assert_non_null(mixed->layers[0].moe_gate_up.p);
    hpd_model_destroy(per);
    hpd_model_destroy(fused);
    hpd_model_destroy(q35);
    hpd_model_destroy(mixed);

    char dir[512];
    hpd_model_t *m = NULL;
    snprintf(dir, sizeof(dir), "%s/moe-per", root);
    rewrite(dir, "model.layers.2.mlp.experts.5.up_proj.weight", 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_NOT_FOUND);
    assert_null(m);
}

/* FP8 releases: projections stay F8_E4M3 with their block scales (no fp32
 * copy: resident weights within 1.05x the files' tensor bytes), per-expert
 * and fused 3-D expert tensors load alike; a missing scale is named, and
 * FP8 tensors without quantization_config are refused. */
static void test_fp8(void **state)
{
    char dir[512], path[600];
    hpd_model_t *per = make_and_load("fp8-per", "--experts 6 --experts-per-tok 2 --fp8 16 "
                                                "--mlp-only-layers 1");
    hpd_model_t *fused = make_and_load("fp8-fused", "--experts 6 --experts-per-tok 2 --fp8 16 "
                                                    "--mlp-only-layers 1 --fused-experts");
    assert_int_equal(per->config.fp8_block_rows, 16);
    assert_int_equal(per->layers[0].moe_gate_up.dtype, HPD_DTYPE_F8_E4M3);
    /* the router and the shared expert's gate stay BF16, its gate|up rows FP8: two parts */
    assert_int_equal(per->layers[0].moe_in.n, 2);
    assert_int_equal(per->layers[0].moe_in.part[0].dtype, HPD_DTYPE_BF16);
    assert_int_equal(per->layers[0].moe_in.rows[0], 7);
    assert_int_equal(per->layers[0].moe_in.part[1].dtype, HPD_DTYPE_F8_E4M3);
    assert_int_equal(per->layers[1].mlp_down.dtype, HPD_DTYPE_F8_E4M3);
    /* a row-parallel matrix: each of the 8 groups of the canonical sum
     * with scales per block of 16 columns, or of a divisor of 16 where the
     * group starts inside a block; the groups cover the columns */
    assert_int_equal(per->layers[1].mlp_down.block, 16);
    uint32_t covered = 0;
    for (uint32_t g = 0; g < HPD_TP_GROUPS; g++) {
        uint32_t col, k;
        const hpd_weight_t v = hpd_model_group(&per->layers[1].mlp_down, per->config.hidden_size,
                                               per->config.intermediate_size, &per->shard, g, &col,
                                               &k);
        assert_int_equal(col, covered);
        assert_int_equal(16 % v.block, 0);
        assert_true(v.scale_ld * v.block >= k);
        covered += k;
    }
    assert_int_equal(covered, per->config.intermediate_size);
    assert_int_equal(per->layers[0].gdn_in.n, 1);
    assert_int_equal(per->layers[0].gdn_in.part[0].dtype, HPD_DTYPE_F8_E4M3);
    assert_int_equal(per->embed.dtype, HPD_DTYPE_BF16);
    assert_non_null(per->layers[0].gdn_out.scale);
    assert_same_weights(per, fused);
    hpd_model_destroy(per);
    hpd_model_destroy(fused);

    /* the releases' 128x128 blocks: scales expanded to rows cost 4 bytes per
     * 128 FP8 bytes; with the vectors widened, within 1.05x the files */
    hpd_model_t *big = make_and_load("fp8-big", "--hidden 512 --intermediate 1024 --vocab 1024 "
                                                "--experts 4 --moe-intermediate 256 "
                                                "--shared-intermediate 256 --fp8 128 "
                                                "--lin-k-dim 128 --lin-v-dim 128 --head-dim 128");
    hpd_st_archive_t *ar;
    uint64_t tensor_bytes = 0;
    snprintf(dir, sizeof(dir), "%s/fp8-big", root);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    for (size_t i = 0; i < hpd_st_archive_count(ar); i++)
        tensor_bytes += hpd_st_archive_get(ar, i)->nbytes;
    hpd_st_archive_destroy(ar);
    print_message("FP8 model: checkpoint tensors %llu bytes, weights %llu bytes (%.3fx)\n",
                  (unsigned long long)tensor_bytes, (unsigned long long)big->weight_bytes,
                  (double)big->weight_bytes / (double)tensor_bytes);
    assert_true(big->weight_bytes <= tensor_bytes * 1.05);
    hpd_model_destroy(big);
    snprintf(dir, sizeof(dir), "%s/fp8-per", root);

    hpd_model_t *m = NULL;
    rewrite(dir, "model.layers.2.mlp.experts.4.down_proj.weight_scale_inv", 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_NOT_FOUND);
    assert_int_equal(test_mkmodel(dir, SMALL " --fp8 16"), 0);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *text;
    size_t len;
    assert_int_equal(hpd_read_file(path, &text, &len), HPD_OK);
    char *q = strstr(text, "\"quantization_config\"");
    assert_non_null(q);
    memcpy(q + 1, "quantization_conf_x", 19); /* no longer read */
    assert_int_equal(hpd_write_file(path, text, len), HPD_OK);
    free(text);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_FORMAT);
    assert_null(m);
}

/* Rows [row0, row0 + n) of the FP8 matrix w (cols wide), dequantised as the
 * model holds them (q * its per-row block scale), against the checkpoint's
 * tensor t and its NAME_scale_inv grid read here: dst row row0 + i is row
 * t_row0 + i of t counted over all its matrices, matrix m = row / rows_per,
 * scale grid[m][(row % rows_per) / block][col / block]. */
/* A row-parallel matrix's element (r, c) as the model holds it at TP 1:
 * in its group (model.h), q times its group's scale. With rows 0: a plain
 * matrix of cols columns. */
static float held(const hpd_weight_t *w, uint64_t rows, uint64_t cols, uint64_t r, uint64_t c)
{
    const hpd_shard_t one = {.tp = 1, .sum_groups = HPD_TP_GROUPS};
    hpd_weight_t v = *w;
    uint64_t k = cols;
    for (uint32_t g = 0; rows > 0 && g < HPD_TP_GROUPS; g++) {
        uint32_t col, kg;
        const hpd_weight_t gv = hpd_model_group(w, rows, (uint32_t)cols, &one, g, &col, &kg);
        if (c >= col && c < col + kg) {
            v = gv;
            k = kg;
            c -= col;
            break;
        }
    }
    float q;
    hpd_dtype_to_f32(HPD_DTYPE_F8_E4M3, (const uint8_t *)v.p + r * k + c, &q, 1);
    return q * v.scale[r * v.scale_ld + c / v.block];
}

#define assert_fp8_rows(w, cols, row0, n, ar, name, t_row0, block)                          \
    assert_fp8_rows_in(w, 0, cols, row0, n, ar, name, t_row0, block)

static void assert_fp8_rows_in(const hpd_weight_t *w, uint64_t w_rows, uint64_t cols,
                               uint64_t row0, uint64_t n, const hpd_st_archive_t *ar,
                               const char *name, uint64_t t_row0, uint64_t block)
{
    char sname[300];
    snprintf(sname, sizeof(sname), "%s_scale_inv", name);
    const hpd_st_tensor_t *t = hpd_st_archive_find(ar, name), *g = hpd_st_archive_find(ar, sname);
    assert_non_null(t);
    assert_non_null(g);
    assert_int_equal(t->dtype, HPD_DTYPE_F8_E4M3);
    assert_int_equal(g->dtype, HPD_DTYPE_F32);
    assert_int_equal(w->dtype, HPD_DTYPE_F8_E4M3);
    assert_int_equal(t->shape[t->ndim - 1], cols);
    const uint64_t rows_per = t->shape[t->ndim - 2];
    const uint64_t grid_r = g->shape[g->ndim - 2], grid_c = g->shape[g->ndim - 1];
    assert_int_equal(grid_r, (rows_per + block - 1) / block);
    assert_int_equal(grid_c, (cols + block - 1) / block);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t tr = t_row0 + i, mat = tr / rows_per, r = tr % rows_per;
        for (uint64_t c = 0; c < cols; c++) {
            float q, scale, want;
            hpd_dtype_to_f32(HPD_DTYPE_F8_E4M3, (const uint8_t *)t->data + tr * cols + c, &q, 1);
            memcpy(&scale, (const char *)g->data +
                               ((mat * grid_r + r / block) * grid_c + c / block) * sizeof(float),
                   sizeof(float));
            want = q * scale;
            const float got = held(w, w_rows, cols, row0 + i, c);
            if (!(got == want)) /* NaN fails too */
                fail_msg("%s row %" PRIu64 " col %" PRIu64 ": %.9g, want %.9g", name, tr, c,
                         (double)got, (double)want);
        }
    }
}

/* The dequantised FP8 weights against the checkpoint's own values and
 * scales, with a block that divides neither the rows nor the columns (the
 * partial last blocks), rectangular grids (a row/column swap shows) and
 * 3-D expert tensors (the grid's row count per matrix shows). */
static void test_fp8_against_the_checkpoint(void **state)
{
    char dir[512];
    const char *fp8 = "--experts 3 --experts-per-tok 2 --moe-intermediate 56 --fp8 21 "
                      "--mlp-only-layers 1";
    for (int fused = 0; fused < 2; fused++) {
        char name[160], extra[200];
        snprintf(name, sizeof(name), "fp8-odd-%d", fused);
        snprintf(extra, sizeof(extra), "%s%s", fp8, fused ? " --fused-experts" : "");
        hpd_model_t *m = make_and_load(name, extra);
        hpd_st_archive_t *ar;
        snprintf(dir, sizeof(dir), "%s/%s", root, name);
        assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
        const uint64_t H = m->config.hidden_size, I = m->config.intermediate_size,
                       Im = m->config.moe_inter, E = m->config.n_experts;
        const hpd_layer_weights_t *l0 = &m->layers[0];

        assert_fp8_rows_in(&m->layers[1].mlp_down, H, I, 0, H, ar,
                           "model.layers.1.mlp.down_proj.weight", 0, 21);
        assert_fp8_rows_in(&l0->shared_down, H, m->config.shared_inter, 0, H, ar,
                           "model.layers.0.mlp.shared_expert.down_proj.weight", 0, 21);
        if (fused) {
            assert_fp8_rows(&l0->moe_gate_up, H, 0, E * 2 * Im, ar,
                            "model.layers.0.mlp.experts.gate_up_proj", 0, 21);
            assert_fp8_rows_in(&l0->moe_down, E * H, Im, 0, E * H, ar,
                               "model.layers.0.mlp.experts.down_proj", 0, 21);
        }
        for (uint64_t x = 0; !fused && x < E; x++) {
            char t[128];
            snprintf(t, sizeof(t), "model.layers.0.mlp.experts.%" PRIu64 ".gate_proj.weight", x);
            assert_fp8_rows(&l0->moe_gate_up, H, 2 * Im * x, Im, ar, t, 0, 21);
            snprintf(t, sizeof(t), "model.layers.0.mlp.experts.%" PRIu64 ".up_proj.weight", x);
            assert_fp8_rows(&l0->moe_gate_up, H, 2 * Im * x + Im, Im, ar, t, 0, 21);
            snprintf(t, sizeof(t), "model.layers.0.mlp.experts.%" PRIu64 ".down_proj.weight", x);
            assert_fp8_rows_in(&l0->moe_down, E * H, Im, H * x, H, ar, t, 0, 21);
        }
        hpd_st_archive_destroy(ar);
        hpd_model_destroy(m);
    }

    /* expert 1's up_proj in BF16 among FP8 experts: the fused gate|up
     * matrix is F32, each row widened from its own source */
    snprintf(dir, sizeof(dir), "%s/fp8-odd-0", root);
    rewrite(dir, "model.layers.0.mlp.experts.1.up_proj.weight", 4);
    hpd_model_t *m = NULL;
    hpd_st_archive_t *ar;
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    const hpd_weight_t *gu = &m->layers[0].moe_gate_up;
    const uint64_t H = m->config.hidden_size, Im = m->config.moe_inter;
    assert_int_equal(gu->dtype, HPD_DTYPE_F32);
    assert_null(gu->scale);
    for (uint64_t x = 0; x < m->config.n_experts; x++)
        for (int part = 0; part < 2; part++) {
            char name[128], sname[160];
            snprintf(name, sizeof(name), "model.layers.0.mlp.experts.%" PRIu64 ".%s.weight", x,
                     part ? "up_proj" : "gate_proj");
            snprintf(sname, sizeof(sname), "%s_scale_inv", name);
            const hpd_st_tensor_t *t = hpd_st_archive_find(ar, name),
                                  *g = hpd_st_archive_find(ar, sname);
            assert_non_null(t);
            assert_int_equal(t->dtype, x == 1 && part == 1 ? HPD_DTYPE_BF16 : HPD_DTYPE_F8_E4M3);
            for (uint64_t r = 0; r < Im; r++)
                for (uint64_t c = 0; c < H; c++) {
                    float want;
                    if (t->dtype == HPD_DTYPE_BF16) {
                        hpd_dtype_to_f32(HPD_DTYPE_BF16, (const uint16_t *)t->data + r * H + c,
                                         &want, 1);
                    } else {
                        float q, sc;
                        hpd_dtype_to_f32(HPD_DTYPE_F8_E4M3, (const uint8_t *)t->data + r * H + c,
                                         &q, 1);
                        memcpy(&sc, (const char *)g->data +
                                        ((r / 21) * g->shape[1] + c / 21) * sizeof(float),
                               sizeof(float));
                        want = q * sc;
                    }
                    const float got = ((const float *)gu->p)[(2 * Im * x + part * Im + r) * H + c];
                    if (!(got == want))
                        fail_msg("%s row %" PRIu64 " col %" PRIu64 ": %.9g, want %.9g", name, r,
                                 c, (double)got, (double)want);
                }
        }
    hpd_st_archive_destroy(ar);
    hpd_model_destroy(m);
}

static void test_bad_models(void **state)
{
    char dir[512], path[600];
    hpd_model_t *m = NULL;

    snprintf(dir, sizeof(dir), "%s/bad", root);
    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    rewrite(dir, "model.layers.0.linear_attn.in_proj_ba.weight", 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_NOT_FOUND);

    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    rewrite(dir, "model.layers.2.mlp.down_proj.weight", 1);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_FORMAT);

    /* an unsupported dtype: BF16 -> BOOL keeps the header length */
    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    char *data;
    size_t len;
    assert_int_equal(hpd_read_file(path, &data, &len), HPD_OK);
    char *hit = strstr(data + 8, "\"BF16\"");
    assert_non_null(hit);
    memcpy(hit, "\"BOOL\"", 6);
    assert_int_equal(hpd_write_file(path, data, len), HPD_OK);
    free(data);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_FORMAT);

    /* truncated weights */
    assert_int_equal(test_mkmodel(dir, SMALL), 0);
    assert_int_equal(truncate(path, 4096), 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_FORMAT);

    /* no config.json, then one of another architecture */
    snprintf(path, sizeof(path), "%s/config.json", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_IO);
    const char *llama = "{\"model_type\": \"llama\", \"num_experts\": 64}";
    assert_int_equal(hpd_write_file(path, llama, strlen(llama)), HPD_OK);
    assert_int_equal(hpd_model_load(dir, &m), HPD_ERR_UNSUPPORTED);
    assert_null(m);
}

static uint64_t rss_bytes(void)
{
    unsigned long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%llu %llu", &size, &resident), 2);
    fclose(f);
    return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Weights stay in the checkpoint's dtype: loading a BF16 model of ~50 MB
 * grows the resident set by at most 1.05x the checkpoint's tensor bytes
 * (an fp32 copy would double it), and no more than weight_bytes says. */
static void test_resident_memory(void **state)
{
    char dir[512];
    hpd_st_archive_t *ar;
    hpd_model_t *m = NULL;
    uint64_t tensor_bytes = 0;
    snprintf(dir, sizeof(dir), "%s/resident", root);
    assert_int_equal(test_mkmodel(dir, "--hidden 512 --layers 8 --full-interval 4 "
                                       "--intermediate 1536 --vocab 8192 --dtype bf16"),
                     0);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    for (size_t i = 0; i < hpd_st_archive_count(ar); i++)
        tensor_bytes += hpd_st_archive_get(ar, i)->nbytes;
    hpd_st_archive_destroy(ar);

    const uint64_t before = rss_bytes();
    assert_int_equal(hpd_model_load(dir, &m), HPD_OK);
    const uint64_t grown = rss_bytes() - before;
    print_message("checkpoint tensors %.1f MiB, weights %.1f MiB, resident set grew %.1f MiB "
                  "(%.3fx)\n",
                  tensor_bytes / 1048576.0, m->weight_bytes / 1048576.0, grown / 1048576.0,
                  (double)grown / (double)tensor_bytes);
    assert_true(tensor_bytes > 40u << 20);
    assert_true(m->weight_bytes <= tensor_bytes * 1.05);
    assert_true(grown <= tensor_bytes * 1.05);
    hpd_model_destroy(m);
}

/* the process's peak resident set (VmHWM), in bytes */
static uint64_t peak_bytes(void)
{
    char line[256];
    unsigned long long kib = 0;
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return kib * 1024;
}

/* Loading keeps the peak near the bytes kept: the file's pages go as each
 * layer is copied out (and as the fingerprint hashes them), so the file
 * map and the copy are not resident at once. The peak resident set while
 * loading the same model at TP 1 and as two TP 2 shards stays within 1.15x
 * the weights kept (the goal is 1.1x; it was 2x with the whole map
 * resident). The peak is reset first (/proc/self/clear_refs 5). */
static void test_peak_while_loading(void **state)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/resident", root); /* test_resident_memory's */
    for (uint32_t tp = 1; tp <= 2; tp *= 2) {
        hpd_model_t *m[2] = {0};
        FILE *f = fopen("/proc/self/clear_refs", "w");
        if (f == NULL || fputs("5", f) < 0 || fclose(f) != 0)
            fail_msg("cannot reset the peak resident set (/proc/self/clear_refs)");
        const uint64_t before = rss_bytes();
        assert_int_equal(hpd_model_load_tp(dir, tp, false, m), HPD_OK);
        const uint64_t peak = peak_bytes() - before;
        uint64_t kept = 0;
        for (uint32_t r = 0; r < tp; r++)
            kept += m[r]->weight_bytes;
        print_message("tp %u: weights kept %.1f MiB, peak resident set while loading +%.1f MiB "
                      "(%.3fx)\n", tp, kept / 1048576.0, peak / 1048576.0,
                      (double)peak / (double)kept);
        assert_true(kept > 40u << 20);
        assert_true(peak <= kept * 1.15);
        for (uint32_t r = 0; r < tp; r++)
            hpd_model_destroy(m[r]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident_memory), /* first: the heap is fresh */
        cmocka_unit_test(test_peak_while_loading),
        cmocka_unit_test(test_namings_dtypes_shards),
        cmocka_unit_test(test_skips_vision_and_mtp),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_fingerprint_covers_weights),
        cmocka_unit_test(test_tensor_list_accounts),
        cmocka_unit_test(test_moe_namings),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_fp8_against_the_checkpoint),
        cmocka_unit_test(test_bad_models),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
