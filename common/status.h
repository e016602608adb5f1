/* Status codes shared by every hybridpd component. */
#ifndef HPD_COMMON_STATUS_H
#define HPD_COMMON_STATUS_H

typedef enum {
    HPD_OK = 0,
    HPD_INPROGRESS = 1,
    HPD_ERR_INVALID_ARG = -1,   /* a caller or user passed a bad value */
    HPD_ERR_NO_MEMORY = -2,     /* host allocation failed */
    HPD_ERR_IO = -3,            /* a file or socket operation failed */
    HPD_ERR_FORMAT = -4,        /* a file or message is malformed */
    HPD_ERR_NOT_FOUND = -5,     /* a named object does not exist */
    HPD_ERR_UNSUPPORTED = -6,   /* valid, but not implemented by this build/backend */
    HPD_ERR_NO_RESOURCE = -7,   /* a pool (pages, slots, batch) is exhausted */
    HPD_ERR_BUSY = -8,          /* try again later */
    HPD_ERR_CANCELED = -9,
    HPD_ERR_TIMEOUT = -10,
    HPD_ERR_INTERNAL = -11,
} hpd_status_t;

/* Returns a static, lowercase description of a status. */
const char *hpd_status_str(hpd_status_t status);

#endif
