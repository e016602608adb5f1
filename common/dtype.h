/* Element types of tensors on disk and in caches, and conversions to fp32. */
#ifndef HPD_COMMON_DTYPE_H
#define HPD_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    HPD_DTYPE_F32 = 0,
    HPD_DTYPE_F16 = 1,
    HPD_DTYPE_BF16 = 2,
} hpd_dtype_t;

/* Size of one element in bytes. */
size_t hpd_dtype_size(hpd_dtype_t dtype);

/* Lowercase name ("f32", "f16", "bf16"). */
const char *hpd_dtype_name(hpd_dtype_t dtype);

/* Parses "f32"/"f16"/"bf16" (case-insensitive, also safetensors' "F32", "BF16");
 * returns 0 on success, -1 on an unknown name. */
int hpd_dtype_parse(const char *name, hpd_dtype_t *dtype_p);

static inline float hpd_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t hpd_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float hpd_f16_to_f32(uint16_t h)
{
    _Float16 v;
    memcpy(&v, &h, sizeof(v));
    return (float)v;
}

static inline uint16_t hpd_f32_to_f16(float f)
{
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, sizeof(h));
    return h;
}

/* Converts n elements of src (of dtype) to fp32. src may be unaligned. */
void hpd_dtype_to_f32(hpd_dtype_t dtype, const void *src, float *dst, size_t n);

/* Converts n fp32 values to dtype. */
void hpd_dtype_from_f32(hpd_dtype_t dtype, const float *src, void *dst, size_t n);

#endif
