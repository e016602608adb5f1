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
    /* FP8 E4M3 ("F8_E4M3", torch.float8_e4m3fn: no infinities, 448 the
     * largest); weights only, with a block scale (hpd_weight_t) */
    HPD_DTYPE_F8_E4M3 = 3,
} hpd_dtype_t;

/* A weight matrix [rows][cols], row-major, in its checkpoint's dtype (the
 * kernels widen each element to fp32 exactly as they read it). An F8_E4M3
 * matrix carries its block scales expanded to rows: element (r, c) is
 * f32(p[r][c]) * scale[r * scale_ld + c / block] in fp32, one rounding, as
 * transformers dequantises a checkpoint's weight_scale_inv. */
typedef struct {
    void *p;
    hpd_dtype_t dtype;
    float *scale;      /* F8_E4M3: [rows][scale_ld]; NULL otherwise */
    uint32_t scale_ld; /* column blocks per row: ceil(cols / block) */
    uint32_t block;    /* columns per block (a multiple of 8) */
} hpd_weight_t;

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
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    float f;

    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13); /* inf, nan */
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            exp--;
        }
        u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Round to nearest even, with subnormals, overflow to inf and NaN kept. */
static inline uint16_t hpd_f32_to_f16(float f)
{
    uint32_t u, sign, mant;
    int32_t exp;

    memcpy(&u, &f, sizeof(u));
    sign = (u >> 16) & 0x8000u;
    exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    mant = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        const uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent, up to inf: still correct */
    return (uint16_t)h;
}

static inline float hpd_f8e4m3_to_f32(uint8_t b)
{
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 7u;
    uint32_t u;
    float f;
    if (exp == 0xfu && mant == 7u) {
        u = sign | 0x7fc00000u; /* the only NaN */
    } else if (exp != 0) {
        u = sign | ((exp + 120u) << 23) | (mant << 20);
    } else { /* zero and subnormals: mant / 8 * 2^-6, exact */
        f = (float)mant * 0.001953125f;
        return sign ? -f : f;
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Round to nearest even; beyond 448 saturates (NaN stays NaN). */
uint8_t hpd_f32_to_f8e4m3(float f);

/* Converts n elements of src (of dtype) to fp32. src may be unaligned. */
void hpd_dtype_to_f32(hpd_dtype_t dtype, const void *src, float *dst, size_t n);

/* Converts n fp32 values to dtype. */
void hpd_dtype_from_f32(hpd_dtype_t dtype, const float *src, void *dst, size_t n);

#endif
