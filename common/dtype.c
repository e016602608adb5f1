#include "common/dtype.h"

#include <math.h>
#include <strings.h>

size_t hpd_dtype_size(hpd_dtype_t dtype)
{
    return dtype == HPD_DTYPE_F32 ? 4 : dtype == HPD_DTYPE_F8_E4M3 ? 1 : 2;
}

const char *hpd_dtype_name(hpd_dtype_t dtype)
{
    switch (dtype) {
    case HPD_DTYPE_F32: return "f32";
    case HPD_DTYPE_F16: return "f16";
    case HPD_DTYPE_BF16: return "bf16";
    case HPD_DTYPE_F8_E4M3: return "f8_e4m3";
    }
    return "?";
}

int hpd_dtype_parse(const char *name, hpd_dtype_t *dtype_p)
{
    if (strcasecmp(name, "f32") == 0 || strcasecmp(name, "float32") == 0)
        *dtype_p = HPD_DTYPE_F32;
    else if (strcasecmp(name, "f16") == 0 || strcasecmp(name, "float16") == 0)
        *dtype_p = HPD_DTYPE_F16;
    else if (strcasecmp(name, "bf16") == 0 || strcasecmp(name, "bfloat16") == 0)
        *dtype_p = HPD_DTYPE_BF16;
    else if (strcasecmp(name, "f8_e4m3") == 0 || strcasecmp(name, "float8_e4m3fn") == 0)
        *dtype_p = HPD_DTYPE_F8_E4M3;
    else
        return -1;
    return 0;
}

void hpd_dtype_to_f32(hpd_dtype_t dtype, const void *src, float *dst, size_t n)
{
    const unsigned char *s = src;
    uint16_t h;

    switch (dtype) {
    case HPD_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case HPD_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, s + 2 * i, 2);
            dst[i] = hpd_f16_to_f32(h);
        }
        break;
    case HPD_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, s + 2 * i, 2);
            dst[i] = hpd_bf16_to_f32(h);
        }
        break;
    case HPD_DTYPE_F8_E4M3: /* the raw values: a weight's block scale is the caller's */
        for (size_t i = 0; i < n; i++)
            dst[i] = hpd_f8e4m3_to_f32(s[i]);
        break;
    }
}

uint8_t hpd_f32_to_f8e4m3(float f)
{
    const uint8_t sign = signbit(f) ? 0x80u : 0;
    const float a = fabsf(f);
    int x;
    if (isnan(f))
        return 0x7fu;
    if (a >= 448.0f)
        return sign | 0x7eu;
    if (a < 0.015625f) /* below 2^-6: steps of 2^-9; 8 steps is code 8, 2^-6 */
        return sign | (uint8_t)rintf(a * 512.0f);
    frexpf(a, &x); /* a = m 2^x, m in [0.5, 1): exponent x - 1 */
    const int e = x - 1;
    float q = rintf(ldexpf(a, 3 - e)); /* 8..16 eighths, to nearest even */
    int ee = e;
    if (q >= 16.0f) {
        q = 8.0f;
        ee++;
    }
    return sign | (uint8_t)(((ee + 7) << 3) | ((int)q - 8));
}

void hpd_dtype_from_f32(hpd_dtype_t dtype, const float *src, void *dst, size_t n)
{
    unsigned char *d = dst;
    uint16_t h;

    switch (dtype) {
    case HPD_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case HPD_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            h = hpd_f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case HPD_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            h = hpd_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case HPD_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            d[i] = hpd_f32_to_f8e4m3(src[i]);
        break;
    }
}
