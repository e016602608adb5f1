#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "safetensors"
/* A header larger than this is refused as malformed (real ones are < 10 MiB). */
#define MAX_HEADER_BYTES (100u << 20)

typedef struct {
    char *path;
    void *map;
    size_t size;
    json_t *header; /* owns the strings tensors point to */
} st_file_t;

struct hpd_st_archive {
    st_file_t *files;
    uint32_t n_files;
    hpd_st_tensor_t *tensors;
    size_t n_tensors;
    size_t cap_tensors;
};

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const hpd_st_tensor_t *)a)->name, ((const hpd_st_tensor_t *)b)->name);
}

static hpd_status_t push_tensor(hpd_st_archive_t *ar, const hpd_st_tensor_t *t)
{
    if (hpd_grow(&ar->tensors, &ar->cap_tensors, ar->n_tensors + 1, sizeof(*t)) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    ar->tensors[ar->n_tensors++] = *t;
    return HPD_OK;
}

static hpd_status_t parse_tensor_entry(hpd_st_archive_t *ar, uint32_t file_idx,
                                       const char *name, json_t *entry, const uint8_t *data,
                                       uint64_t data_bytes)
{
    const char *path = ar->files[file_idx].path;
    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    hpd_st_tensor_t t;
    uint64_t begin, end, elem;

    memset(&t, 0, sizeof(t));
    if (!json_is_object(entry) || !json_is_string(dtype) || !json_is_array(shape) ||
        !json_is_array(offsets) || json_array_size(offsets) != 2) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: tensor '%s': malformed header entry (expected dtype, shape and "
                      "data_offsets [begin, end])",
                      path, name);
        return HPD_ERR_FORMAT;
    }
    t.name = name;
    t.dtype_name = json_string_value(dtype);
    t.dtype_known = hpd_dtype_parse(t.dtype_name, &t.dtype) == 0;
    t.ndim = (uint32_t)json_array_size(shape);
    if (t.ndim > HPD_ST_MAX_DIMS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' has %u dimensions (at most %d supported)",
                      path, name, t.ndim, HPD_ST_MAX_DIMS);
        return HPD_ERR_FORMAT;
    }
    t.n_elements = 1;
    for (uint32_t d = 0; d < t.ndim; d++) {
        json_t *dim = json_array_get(shape, d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s': shape[%u] is not a non-negative integer",
                          path, name, d);
            return HPD_ERR_FORMAT;
        }
        t.shape[d] = (uint64_t)json_integer_value(dim);
        t.n_elements *= t.shape[d];
    }
    if (!json_is_integer(json_array_get(offsets, 0)) ||
        !json_is_integer(json_array_get(offsets, 1)) ||
        json_integer_value(json_array_get(offsets, 0)) < 0 ||
        json_integer_value(json_array_get(offsets, 1)) < 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s': data_offsets must be non-negative integers",
                      path, name);
        return HPD_ERR_FORMAT;
    }
    begin = (uint64_t)json_integer_value(json_array_get(offsets, 0));
    end = (uint64_t)json_integer_value(json_array_get(offsets, 1));
    if (end < begin) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s': data_offsets end %llu < begin %llu", path,
                      name, (unsigned long long)end, (unsigned long long)begin);
        return HPD_ERR_FORMAT;
    }
    if (end > data_bytes) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: tensor '%s': data ends at byte %llu but the file holds only %llu data "
                      "bytes (truncated file?)",
                      path, name, (unsigned long long)end, (unsigned long long)data_bytes);
        return HPD_ERR_FORMAT;
    }
    elem = t.dtype_known ? hpd_dtype_size(t.dtype) : 0;
    if (t.dtype_known && end - begin != t.n_elements * elem) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: tensor '%s': %llu bytes but %s x %llu elements needs %llu", path, name,
                      (unsigned long long)(end - begin), t.dtype_name,
                      (unsigned long long)t.n_elements,
                      (unsigned long long)(t.n_elements * elem));
        return HPD_ERR_FORMAT;
    }
    t.data = data + begin;
    t.nbytes = end - begin;
    t.file = file_idx;
    return push_tensor(ar, &t);
}

/* Maps one file and appends its tensors. */
static hpd_status_t open_file(hpd_st_archive_t *ar, const char *path)
{
    st_file_t *f;
    struct stat sb;
    uint64_t header_len;
    json_error_t jerr;
    const char *key;
    json_t *value;
    int fd;
    hpd_status_t st;

    f = &ar->files[ar->n_files];
    memset(f, 0, sizeof(*f));
    f->path = strdup(path);
    if (f->path == NULL)
        return HPD_ERR_NO_MEMORY;
    ar->n_files++;

    fd = open(path, O_RDONLY);
    if (fd < 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot open %s: %s", path, strerror(errno));
        return HPD_ERR_IO;
    }
    if (fstat(fd, &sb) != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return HPD_ERR_IO;
    }
    if (sb.st_size < 8) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: file of %lld bytes is too short for a header (truncated?)",
                      path, (long long)sb.st_size);
        close(fd);
        return HPD_ERR_FORMAT;
    }
    f->size = (size_t)sb.st_size;
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot mmap %s: %s", path, strerror(errno));
        return HPD_ERR_IO;
    }
    memcpy(&header_len, f->map, 8); /* little-endian on every supported host */
    if (header_len > MAX_HEADER_BYTES || header_len > f->size - 8) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: header length %llu does not fit the file of %zu bytes (truncated or "
                      "not a safetensors file)",
                      path, (unsigned long long)header_len, f->size);
        return HPD_ERR_FORMAT;
    }
    f->header = json_loadb((const char *)f->map + 8, header_len, 0, &jerr);
    if (f->header == NULL || !json_is_object(f->header)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: malformed JSON header: %s", path,
                      f->header ? "not an object" : jerr.text);
        return HPD_ERR_FORMAT;
    }
    json_object_foreach(f->header, key, value) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        st = parse_tensor_entry(ar, ar->n_files - 1, key, value,
                                (const uint8_t *)f->map + 8 + header_len,
                                f->size - 8 - header_len);
        if (st != HPD_OK)
            return st;
    }
    return HPD_OK;
}

static hpd_status_t open_sharded(hpd_st_archive_t *ar, const char *dir, const char *index_path)
{
    json_error_t jerr;
    /* a name mapped twice is ambiguous: refused, not the last one taken */
    json_t *index = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    json_t *map, *value;
    const char *key;
    const char **names = NULL;
    size_t n_names = 0;
    hpd_status_t st = HPD_ERR_FORMAT;
    char path[4096];

    if (index == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: line %d: malformed JSON: %s", index_path, jerr.line,
                      jerr.text);
        return HPD_ERR_FORMAT;
    }
    map = json_object_get(index, "weight_map");
    if (!json_is_object(map)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: missing object 'weight_map'", index_path);
        goto out;
    }
    names = calloc(json_object_size(map) + 1, sizeof(*names));
    ar->files = calloc(json_object_size(map) + 1, sizeof(*ar->files));
    if (names == NULL || ar->files == NULL) {
        st = HPD_ERR_NO_MEMORY;
        goto out;
    }
    json_object_foreach(map, key, value) {
        const char *file = json_string_value(value);
        bool seen = false;

        if (file == NULL || strchr(file, '/') != NULL) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: weight_map['%s'] must be a file name in %s",
                          index_path, key, dir);
            goto out;
        }
        for (size_t i = 0; i < n_names && !seen; i++)
            seen = strcmp(names[i], file) == 0;
        if (!seen) {
            names[n_names++] = file;
            snprintf(path, sizeof(path), "%s/%s", dir, file);
            if ((st = open_file(ar, path)) != HPD_OK)
                goto out;
        }
    }
    /* sort now so that the index check below can use the lookup */
    qsort(ar->tensors, ar->n_tensors, sizeof(*ar->tensors), tensor_cmp);
    json_object_foreach(map, key, value) {
        const hpd_st_tensor_t *t = hpd_st_archive_find(ar, key);
        const char *file = json_string_value(value);

        if (t == NULL || strcmp(strrchr(ar->files[t->file].path, '/') + 1, file) != 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' is listed in %s but not found there",
                          index_path, key, file);
            st = HPD_ERR_FORMAT;
            goto out;
        }
    }
    st = HPD_OK;
out:
    free(names);
    json_decref(index);
    return st;
}

hpd_status_t hpd_st_archive_open(const char *model_dir, hpd_st_archive_t **archive_p)
{
    hpd_st_archive_t *ar = calloc(1, sizeof(*ar));
    char path[4096];
    hpd_status_t st;

    if (ar == NULL)
        return HPD_ERR_NO_MEMORY;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", model_dir);
    if (access(path, F_OK) == 0) {
        st = open_sharded(ar, model_dir, path);
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", model_dir);
        if (access(path, F_OK) != 0) {
            HPD_LOG_ERROR(LOG_COMPONENT,
                          "%s: no model.safetensors or model.safetensors.index.json found",
                          model_dir);
            st = HPD_ERR_NOT_FOUND;
        } else if ((ar->files = calloc(1, sizeof(*ar->files))) == NULL) {
            st = HPD_ERR_NO_MEMORY;
        } else {
            st = open_file(ar, path);
        }
    }
    if (st != HPD_OK) {
        hpd_st_archive_destroy(ar);
        return st;
    }
    qsort(ar->tensors, ar->n_tensors, sizeof(*ar->tensors), tensor_cmp);
    for (size_t i = 1; i < ar->n_tensors; i++) {
        if (strcmp(ar->tensors[i - 1].name, ar->tensors[i].name) == 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' appears twice", model_dir,
                          ar->tensors[i].name);
            hpd_st_archive_destroy(ar);
            return HPD_ERR_FORMAT;
        }
    }
    *archive_p = ar;
    return HPD_OK;
}

void hpd_st_archive_destroy(hpd_st_archive_t *ar)
{
    if (ar == NULL)
        return;
    for (uint32_t i = 0; i < ar->n_files; i++) {
        if (ar->files[i].map != NULL)
            munmap(ar->files[i].map, ar->files[i].size);
        json_decref(ar->files[i].header);
        free(ar->files[i].path);
    }
    free(ar->files);
    free(ar->tensors);
    free(ar);
}

const hpd_st_tensor_t *hpd_st_archive_find(const hpd_st_archive_t *ar, const char *name)
{
    hpd_st_tensor_t key;

    key.name = name;
    return bsearch(&key, ar->tensors, ar->n_tensors, sizeof(*ar->tensors), tensor_cmp);
}

size_t hpd_st_archive_count(const hpd_st_archive_t *ar)
{
    return ar->n_tensors;
}

const hpd_st_tensor_t *hpd_st_archive_get(const hpd_st_archive_t *ar, size_t i)
{
    return i < ar->n_tensors ? &ar->tensors[i] : NULL;
}

const char *hpd_st_archive_path(const hpd_st_archive_t *ar, uint32_t file)
{
    return file < ar->n_files ? ar->files[file].path : NULL;
}

static const char *st_dtype_name(hpd_dtype_t dtype)
{
    switch (dtype) {
    case HPD_DTYPE_F32: return "F32";
    case HPD_DTYPE_F16: return "F16";
    case HPD_DTYPE_BF16: return "BF16";
    case HPD_DTYPE_F8_E4M3: return "F8_E4M3";
    }
    return "?";
}

hpd_status_t hpd_st_write(const char *path, const hpd_st_write_tensor_t *tensors, size_t n)
{
    json_t *header = json_object();
    uint64_t offset = 0;
    char *text = NULL;
    size_t text_len, padded;
    FILE *f = NULL;
    hpd_status_t st = HPD_ERR_NO_MEMORY;
    uint64_t header_len;

    if (header == NULL)
        return HPD_ERR_NO_MEMORY;
    json_object_set_new(header, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (size_t i = 0; i < n; i++) {
        const hpd_st_write_tensor_t *t = &tensors[i];
        json_t *shape = json_array();
        uint64_t count = 1, bytes;

        for (uint32_t d = 0; d < t->ndim; d++) {
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
            count *= t->shape[d];
        }
        bytes = count * hpd_dtype_size(t->dtype);
        json_object_set_new(header, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(t->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)offset,
                                      (json_int_t)(offset + bytes)));
        offset += bytes;
    }
    text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL)
        goto out;
    text_len = strlen(text);
    padded = (text_len + 7) & ~(size_t)7;
    f = fopen(path, "wb");
    if (f == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot create %s: %s", path, strerror(errno));
        st = HPD_ERR_IO;
        goto out;
    }
    header_len = padded;
    st = HPD_ERR_IO;
    if (fwrite(&header_len, 8, 1, f) != 1 || fwrite(text, 1, text_len, f) != text_len)
        goto out;
    for (size_t i = text_len; i < padded; i++)
        if (fputc(' ', f) == EOF)
            goto out;
    for (size_t i = 0; i < n; i++) {
        uint64_t count = 1;
        for (uint32_t d = 0; d < tensors[i].ndim; d++)
            count *= tensors[i].shape[d];
        if (count > 0 &&
            fwrite(tensors[i].data, hpd_dtype_size(tensors[i].dtype), count, f) != count)
            goto out;
    }
    st = HPD_OK;
out:
    if (f != NULL && fclose(f) != 0 && st == HPD_OK)
        st = HPD_ERR_IO;
    if (st == HPD_ERR_IO)
        HPD_LOG_ERROR(LOG_COMPONENT, "cannot write %s: %s", path, strerror(errno));
    free(text);
    json_decref(header);
    return st;
}

void hpd_st_archive_release(const hpd_st_archive_t *ar, const hpd_st_tensor_t *t)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint32_t i = 0; i < ar->n_files; i++) {
        const st_file_t *f = &ar->files[i];
        if (f->map == NULL || (t != NULL && t->file != i))
            continue;
        uintptr_t begin = (uintptr_t)f->map, end = begin + f->size;
        if (t != NULL) { /* the whole pages inside the tensor's bytes and around them */
            begin = (uintptr_t)t->data & ~(page - 1);
            end = (uintptr_t)t->data + t->nbytes;
        }
        end = (end + page - 1) & ~(page - 1);
        /* advice only: a failure leaves the pages resident, nothing else */
        (void)madvise((void *)begin, end - begin, MADV_DONTNEED);
    }
}

void hpd_st_release_bytes(const void *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1);
    const uintptr_t end = ((uintptr_t)p + n) & ~(page - 1);
    if (end > begin) /* advice only, as above */
        (void)madvise((void *)begin, end - begin, MADV_DONTNEED);
}
