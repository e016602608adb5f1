#include "common/dtype.h"

#include <strings.h>

size_t hpd_dtype_size(hpd_dtype_t dtype)
{
    return dtype == HPD_DTYPE_F32 ? 4 : 2;
}

const char *hpd_dtype_name(hpd_dtype_t dtype)
{
    switch (dtype) {
    case HPD_DTYPE_F32: return "f32";
    case HPD_DTYPE_F16: return "f16";
    case HPD_DTYPE_BF16: return "bf16";
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
    }
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
    }
}
