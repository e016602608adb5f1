#include "common/status.h"

const char *hpd_status_str(hpd_status_t status)
{
    switch (status) {
#define HPD_STATUS_CASE(name, value, text) \
    case name: return text;
        HPD_STATUS_MAP(HPD_STATUS_CASE)
#undef HPD_STATUS_CASE
    }
    return "unknown status";
}
