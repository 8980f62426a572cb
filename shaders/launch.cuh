// launch.cuh — how the backend's kernels are launched (shared by the
// .cu files of shaders/; not part of any interface).
//
// Every kernel starts with pdl_begin() and is launched by lk() with
// programmatic stream serialization (Hopper's programmatic dependent
// launch): the next kernel's blocks may be scheduled while this one
// finishes, and wait in pdl_begin() until it has completed and its writes
// are visible. A decode step is hundreds of small dependent kernels, so
// this hides most of each launch's latency. The order of work is unchanged:
// nothing is read or written before the wait. The debug switch
// ANE_CUDA_PDL=0 turns it off.
#pragma once

#include <cuda_runtime.h>

extern "C" int ck_debug_off(const char *name);   /* (shaders/kernels.h) */

__device__ __forceinline__ void pdl_begin()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The next launch scheduled now, before this kernel's wait (early != 0):
 * for small kernels whose successor should load its weights while this
 * kernel's own predecessor still runs. Whatever any kernel reads before
 * its wait is never written by a kernel of the pass, so this is safe. */
__device__ __forceinline__ void pdl_early(int early)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

static inline int pdl_on()
{
    static int v = -1;
    if (v < 0) {
        int dev = 0, major = 0;
        v = !ck_debug_off("ANE_CUDA_PDL") && cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
    }
    return v;
}

template <typename... KA, typename... AA>
static inline void lk(void (*k)(KA...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, AA &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl_on() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, static_cast<AA &&>(args)...);
}
