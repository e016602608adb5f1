#include "common/status.h"

const char *hpd_status_str(hpd_status_t status)
{
    switch (status) {
    case HPD_OK: return "success";
    case HPD_INPROGRESS: return "in progress";
    case HPD_ERR_INVALID_ARG: return "invalid argument";
    case HPD_ERR_NO_MEMORY: return "out of memory";
    case HPD_ERR_IO: return "input/output error";
    case HPD_ERR_FORMAT: return "malformed data";
    case HPD_ERR_NOT_FOUND: return "not found";
    case HPD_ERR_UNSUPPORTED: return "unsupported";
    case HPD_ERR_NO_RESOURCE: return "resource exhausted";
    case HPD_ERR_BUSY: return "busy";
    case HPD_ERR_CANCELED: return "canceled";
    case HPD_ERR_TIMEOUT: return "timed out";
    case HPD_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
