#include "kernels/backend.h"

#include <string.h>

#include "common/log.h"

hpd_status_t hpd_backend_create(const hpd_backend_params_t *params, hpd_backend_t **backend_p)
{
    const char *device = params->device ? params->device : "cpu";

    if (strcmp(device, "cpu") == 0 || strcmp(device, "cpu-bf16") == 0)
        return hpd_backend_cpu_create(params, backend_p);
    if (strncmp(device, "cuda", 4) == 0) {
#ifdef HPD_HAVE_CUDA
        return hpd_backend_cuda_create(params, backend_p);
#else
        HPD_LOG_ERROR("backend", "device '%s': this build has no CUDA backend", device);
        return HPD_ERR_UNSUPPORTED;
#endif
    }
    HPD_LOG_ERROR("backend", "device '%s' is unknown (expected cpu, cpu-bf16, cuda[:N] or "
                  "cuda-fast[:N])",
                  device);
    return HPD_ERR_INVALID_ARG;
}

void hpd_backend_destroy(hpd_backend_t *backend)
{
    if (backend != NULL)
        backend->ops->destroy(backend);
}
