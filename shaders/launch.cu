// launch.cu — the CUDA backend's debug switches (docs/cuda.md), read in
// one place: ANE_CUDA_PDL (launch.cuh) and ANE_CUDA_FUSE (the backend).
#include "shaders/kernels.h"

#include <stdlib.h>
#include <string.h>

extern "C" int ck_debug_off(const char *name)
{
    const char *e = getenv(name);
    return e && !strcmp(e, "0");
}
