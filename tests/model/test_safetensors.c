/* safetensors: round trip of every dtype, sharded archives, and a clear
 * error for truncated files, malformed headers and inconsistent sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "model/safetensors.h"
#include "tests/common/capture.h"
#include "tests/test_helpers.h"

static void write_three(const char *path)
{
    float f32[6] = {1, 2, 3, 4, 5, 6};
    uint16_t bf[4], h[3];
    hpd_dtype_from_f32(HPD_DTYPE_BF16, f32, bf, 4);
    hpd_dtype_from_f32(HPD_DTYPE_F16, f32, h, 3);
    hpd_st_write_tensor_t t[3] = {
        {.name = "b.weight", .dtype = HPD_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "a.weight", .dtype = HPD_DTYPE_BF16, .ndim = 1, .shape = {4}, .data = bf},
        {.name = "c.scalar", .dtype = HPD_DTYPE_F16, .ndim = 2, .shape = {1, 3}, .data = h},
    };
    assert_int_equal(hpd_st_write(path, t, 3), HPD_OK);
}

static void test_round_trip(void **state)
{
    char dir[256], path[300];
    hpd_st_archive_t *ar;
    float back[6];

    test_tmpdir(dir, sizeof(dir), "st");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_three(path);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    assert_int_equal(hpd_st_archive_count(ar), 3);
    assert_string_equal(hpd_st_archive_get(ar, 0)->name, "a.weight"); /* name order */
    const hpd_st_tensor_t *b = hpd_st_archive_find(ar, "b.weight");
    assert_non_null(b);
    assert_int_equal(b->ndim, 2);
    assert_int_equal(b->shape[1], 3);
    hpd_dtype_to_f32(b->dtype, b->data, back, 6);
    assert_true(back[5] == 6.0f);
    const hpd_st_tensor_t *a = hpd_st_archive_find(ar, "a.weight");
    assert_int_equal(a->dtype, HPD_DTYPE_BF16);
    hpd_dtype_to_f32(a->dtype, a->data, back, 4);
    assert_true(back[3] == 4.0f);
    const hpd_st_tensor_t *c = hpd_st_archive_find(ar, "c.scalar");
    hpd_dtype_to_f32(c->dtype, c->data, back, 3);
    assert_true(back[2] == 3.0f);
    assert_null(hpd_st_archive_find(ar, "missing"));
    hpd_st_archive_destroy(ar);
    test_rmtree(dir);
}

static void write_raw(const char *path, const char *header, size_t data_bytes)
{
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++)
        fputc(0, f);
    fclose(f);
}

static void test_bad_files(void **state)
{
    char dir[256], path[300];
    hpd_st_archive_t *ar;

    test_tmpdir(dir, sizeof(dir), "stbad");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_NOT_FOUND);

    write_three(path);
    assert_int_equal(truncate(path, 20), 0); /* cut inside the header */
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);
    write_three(path);
    char *data;
    size_t len;
    assert_int_equal(hpd_read_file(path, &data, &len), HPD_OK);
    free(data);
    assert_int_equal(truncate(path, (off_t)len - 4), 0); /* cut inside the data */
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);

    assert_int_equal(truncate(path, 3), 0);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);

    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT); /* malformed JSON */
    write_raw(path, "[1, 2]", 0);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT); /* not an object */
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT); /* size != dtype x shape */
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT); /* end < begin */
    write_raw(path, "{\"x\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);
    write_raw(path, "{\"x\": {\"dtype\": 5, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);
    /* a header length beyond the file */
    FILE *f = fopen(path, "wb");
    uint64_t huge = 1ull << 40;
    fwrite(&huge, 8, 1, f);
    fclose(f);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);
    /* a header length a few bytes past the end of the file, and exactly
     * at it (the header then fills the file: an empty data section) */
    static const char hdr[] = "{\"x\": {\"dtype\": \"F32\", \"shape\": [0], "
                              "\"data_offsets\": [0, 0]}}";
    for (int extra = 8; extra >= 0; extra--) {
        f = fopen(path, "wb");
        const uint64_t claimed = sizeof(hdr) - 1 + (uint64_t)extra;
        fwrite(&claimed, 8, 1, f);
        fwrite(hdr, 1, sizeof(hdr) - 1, f);
        fclose(f);
        /* refused for its length, before a byte past the file is read */
        test_capture_t cap;
        test_capture_begin(&cap);
        const hpd_status_t st = hpd_st_archive_open(dir, &ar);
        char *said = test_capture_end(&cap, NULL);
        assert_int_equal(st, extra > 0 ? HPD_ERR_FORMAT : HPD_OK);
        if (extra > 0 && strstr(said, "does not fit the file") == NULL)
            fail_msg("a header %d bytes past the end: '%s'", extra, said);
        free(said);
        if (extra == 0)
            hpd_st_archive_destroy(ar);
    }
    /* an unknown dtype opens, flagged, for the loader to refuse by name */
    write_raw(path, "{\"x\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    assert_false(hpd_st_archive_find(ar, "x")->dtype_known);
    hpd_st_archive_destroy(ar);
    test_rmtree(dir);
}

static void test_sharded(void **state)
{
    char dir[256], path[300];
    hpd_st_archive_t *ar;
    float one[2] = {1, 2}, two[3] = {3, 4, 5};
    hpd_st_write_tensor_t t1 = {
        .name = "one", .dtype = HPD_DTYPE_F32, .ndim = 1, .shape = {2}, .data = one};
    hpd_st_write_tensor_t t2 = {
        .name = "two", .dtype = HPD_DTYPE_F32, .ndim = 1, .shape = {3}, .data = two};

    test_tmpdir(dir, sizeof(dir), "shard");
    snprintf(path, sizeof(path), "%s/a.safetensors", dir);
    assert_int_equal(hpd_st_write(path, &t1, 1), HPD_OK);
    snprintf(path, sizeof(path), "%s/b.safetensors", dir);
    assert_int_equal(hpd_st_write(path, &t2, 1), HPD_OK);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    const char *index = "{\"metadata\": {}, \"weight_map\": {\"one\": \"a.safetensors\", "
                        "\"two\": \"b.safetensors\"}}";
    assert_int_equal(hpd_write_file(path, index, strlen(index)), HPD_OK);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_OK);
    assert_int_equal(hpd_st_archive_count(ar), 2);
    assert_true(((const float *)hpd_st_archive_find(ar, "two")->data)[2] == 5.0f);
    assert_int_not_equal(hpd_st_archive_find(ar, "one")->file,
                         hpd_st_archive_find(ar, "two")->file);
    hpd_st_archive_destroy(ar);

    /* a tensor mapped twice is refused, even to the same file (JSON with a
     * key twice: which one a reader takes is its own choice) */
    const char *twice = "{\"weight_map\": {\"one\": \"a.safetensors\", \"two\": "
                        "\"b.safetensors\", \"one\": \"a.safetensors\"}}";
    assert_int_equal(hpd_write_file(path, twice, strlen(twice)), HPD_OK);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);
    /* the index names a tensor its file does not hold */
    const char *bad = "{\"weight_map\": {\"one\": \"a.safetensors\", \"three\": \"b.safetensors\"}}";
    assert_int_equal(hpd_write_file(path, bad, strlen(bad)), HPD_OK);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_FORMAT);
    const char *missing = "{\"weight_map\": {\"one\": \"nope.safetensors\"}}";
    assert_int_equal(hpd_write_file(path, missing, strlen(missing)), HPD_OK);
    assert_int_equal(hpd_st_archive_open(dir, &ar), HPD_ERR_IO);
    test_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
