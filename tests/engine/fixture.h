/* The engine tests' fixture (header-only): a model generated into a fresh
 * temporary directory, loaded, and a 2-thread CPU backend; root, model and
 * be are the test file's. */
#ifndef HPD_TESTS_ENGINE_FIXTURE_H
#define HPD_TESTS_ENGINE_FIXTURE_H

#include "engine/engine.h"
#include "tests/test_helpers.h"

/* a small hybrid model: 6 layers, every third one full attention */
#define ENGINE_TEST_SMALL                                                                  \
    "--hidden 128 --layers 6 --full-interval 3 --intermediate 256 --vocab 512 "            \
    "--heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "                \
    "--lin-k-dim 32 --lin-v-dim 48 --seed 11"

static char root[256];
static hpd_model_t *model;
static hpd_backend_t *be;

/* hpd-mkmodel model_args into root/model (root from tag), loaded */
static inline int engine_fixture_setup(const char *tag, const char *model_args)
{
    char dir[512];
    hpd_backend_params_t bp = {.device = "cpu", .n_threads = 2};
    test_tmpdir(root, sizeof(root), tag);
    snprintf(dir, sizeof(dir), "%s/model", root);
    if (test_mkmodel(dir, model_args) != 0 || hpd_model_load(dir, &model) != HPD_OK)
        return -1;
    return hpd_backend_cpu_create(&bp, &be) == HPD_OK ? 0 : -1;
}

static inline int engine_fixture_teardown(void)
{
    hpd_model_destroy(model);
    hpd_backend_destroy(be);
    test_rmtree(root);
    return 0;
}

#endif
