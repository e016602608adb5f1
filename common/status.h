/* Status codes shared by every hybridpd component. */
#ifndef HPD_COMMON_STATUS_H
#define HPD_COMMON_STATUS_H

/* The one list of statuses: X(name, value, description).
 *   INVALID_ARG  a caller or user passed a bad value
 *   NO_MEMORY    host allocation failed
 *   IO           a file or socket operation failed
 *   FORMAT       a file or message is malformed
 *   NOT_FOUND    a named object does not exist
 *   UNSUPPORTED  valid, but not implemented by this build or backend
 *   NO_RESOURCE  a pool (pages, slots, batch) is exhausted
 *   BUSY         try again later
 *   NO_DEVICE    no GPU on this machine at all (no driver, or none visible);
 *                every other device error is a failure, not an absence */
#define HPD_STATUS_MAP(X)                                                                    \
    X(HPD_OK, 0, "success")                                                                 \
    X(HPD_INPROGRESS, 1, "in progress")                                                     \
    X(HPD_ERR_INVALID_ARG, -1, "invalid argument")                                          \
    X(HPD_ERR_NO_MEMORY, -2, "out of memory")                                               \
    X(HPD_ERR_IO, -3, "input/output error")                                                 \
    X(HPD_ERR_FORMAT, -4, "malformed data")                                                 \
    X(HPD_ERR_NOT_FOUND, -5, "not found")                                                   \
    X(HPD_ERR_UNSUPPORTED, -6, "unsupported")                                               \
    X(HPD_ERR_NO_RESOURCE, -7, "resource exhausted")                                        \
    X(HPD_ERR_BUSY, -8, "busy")                                                             \
    X(HPD_ERR_CANCELED, -9, "canceled")                                                     \
    X(HPD_ERR_TIMEOUT, -10, "timed out")                                                    \
    X(HPD_ERR_INTERNAL, -11, "internal error")                                              \
    X(HPD_ERR_NO_DEVICE, -12, "no such device")

typedef enum {
#define HPD_STATUS_ENUM(name, value, text) name = value,
    HPD_STATUS_MAP(HPD_STATUS_ENUM)
#undef HPD_STATUS_ENUM
} hpd_status_t;

/* Returns a static, lowercase description of a status. */
const char *hpd_status_str(hpd_status_t status);

#endif
