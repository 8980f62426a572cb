// launch.cu — the device's features the launchers follow (ck_feat, shaders/
// kernels.h) and the CUDA backend's debug switches (docs/cuda.md), read in
// one place: ANE_CUDA_PDL (launch.cuh) and ANE_CUDA_FUSE (the backend).
#include "shaders/kernels.h"
#include "shaders/launch.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" int ck_debug_off(const char *name)
{
    const char *e = getenv(name);
    return e && !strcmp(e, "0");
}

/* Until a probe: nothing beyond the portable path */
static ck_feat g_feat = { 0, 0, 0, 0, 0, 48 << 10 };

/* Which code the device runs: its __CUDA_ARCH__ / 10 and whether that code
 * holds the sm_90a instructions (wgmma) */
__global__ void k_feat_probe(int *out)
{
#if defined(__CUDA_ARCH__)
    out[0] = __CUDA_ARCH__ / 10;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    out[1] = 1;
#else
    out[1] = 0;
#endif
#endif
}

extern "C" {

int ck_feat_probe(ck_feat *f, char *err, size_t errlen)
{
    int dev = 0, ma = 0, mi = 0, optin = 0;
    memset(f, 0, sizeof *f);
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        snprintf(err, errlen, "cannot read the CUDA device's attributes: %s", cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    f->cc = 10 * ma + mi;
    f->smem_optin = optin;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, k_feat_probe) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen,
                 "this build has no CUDA code for the device (compute capability %d.%d): rebuild with "
                 "CUDA_ARCH including %d (docs/cuda.md)", ma, mi, f->cc);
        return -1;
    }
    int *d = NULL, h[2] = { 0, 0 };
    if (cudaMalloc((void **)&d, sizeof h) != cudaSuccess) {
        snprintf(err, errlen, "cannot set up the CUDA device memory: %s", cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    k_feat_probe<<<1, 1>>>(d);
    cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "the CUDA probe kernel failed on compute capability %d.%d: %s", ma, mi,
                 cudaGetErrorString(e));
        return -1;
    }
    f->code = h[0];
    f->wgmma = h[1] && ma == 9;
    f->bulk = h[0] >= 90;
    /* (code for 8.x JIT-compiled on a 9.0 device has no griddepcontrol.wait:
     * launching it with programmatic serialization would race) */
    f->pdl = ma >= 9 && h[0] >= 90;
    g_feat = *f;
    return 0;
}

void ck_feat_use(const ck_feat *f) { g_feat = *f; }

const ck_feat *ck_feat_now(void) { return &g_feat; }

}  /* extern "C" */
