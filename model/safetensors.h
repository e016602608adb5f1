/* Reading (mmap) and writing of safetensors files, single or sharded. */
#ifndef HPD_MODEL_SAFETENSORS_H
#define HPD_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

#define HPD_ST_MAX_DIMS 8

typedef struct {
    const char *name;
    const char *dtype_name; /* as written in the header, e.g. "BF16" */
    bool dtype_known;       /* dtype is F32, F16, BF16 or F8_E4M3 */
    hpd_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[HPD_ST_MAX_DIMS];
    uint64_t n_elements;
    const void *data; /* inside the mmap'ed file, possibly unaligned */
    uint64_t nbytes;
    uint32_t file; /* index of the file that holds it */
} hpd_st_tensor_t;

typedef struct hpd_st_archive hpd_st_archive_t;

/* Opens DIR/model.safetensors.index.json (sharded) if present, else
 * DIR/model.safetensors. Every file is mmap'ed read-only and its header fully
 * validated: a truncated file, a malformed header, offsets outside the file or
 * a size that does not match dtype x shape are logged with the file and tensor
 * name, and return HPD_ERR_FORMAT (HPD_ERR_IO when a file cannot be opened). */
hpd_status_t hpd_st_archive_open(const char *model_dir, hpd_st_archive_t **archive_p);

/* Unmaps every file. Accepts NULL. */
void hpd_st_archive_destroy(hpd_st_archive_t *archive);

/* Drops the pages of tensor t (NULL: of every file) from the process's
 * resident memory: a loader that has copied them out keeps its peak near
 * the bytes it keeps. The data stays readable (it is read from the file
 * again on the next access). */
void hpd_st_archive_release(const hpd_st_archive_t *archive, const hpd_st_tensor_t *t);
/* The same for the whole pages of n bytes at p inside a mapped file. */
void hpd_st_release_bytes(const void *p, size_t n);

/* Returns the tensor of that name, or NULL. */
const hpd_st_tensor_t *hpd_st_archive_find(const hpd_st_archive_t *archive, const char *name);

/* Tensors in name order, for iteration. */
size_t hpd_st_archive_count(const hpd_st_archive_t *archive);
const hpd_st_tensor_t *hpd_st_archive_get(const hpd_st_archive_t *archive, size_t i);

/* Path of file index `file`. */
const char *hpd_st_archive_path(const hpd_st_archive_t *archive, uint32_t file);

/* A tensor to write: data holds n_elements values of dtype. */
typedef struct {
    const char *name;
    hpd_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[HPD_ST_MAX_DIMS];
    const void *data;
} hpd_st_write_tensor_t;

/* Writes one safetensors file with the tensors in the given order, the header
 * padded to 8 bytes and a {"format": "pt"} metadata entry. */
hpd_status_t hpd_st_write(const char *path, const hpd_st_write_tensor_t *tensors, size_t n);

#endif
