// launch.cuh — how the backend's kernels are launched (shared by the
// .cu files of shaders/; not part of any interface).
//
// Every kernel starts with pdl_begin() and is launched by lk(), on devices
// of compute capability 9.0 and later with programmatic stream
// serialization (Hopper's programmatic dependent launch): the next kernel's blocks may be scheduled while this one
// finishes, and wait in pdl_begin() until it has completed and its writes
// are visible. A decode step is hundreds of small dependent kernels, so
// this hides most of each launch's latency. The order of work is unchanged:
// nothing is read or written before the wait. The debug switch
// ANE_CUDA_PDL=0 turns it off.
#pragma once

#include <cuda_runtime.h>

#include "shaders/kernels.h"

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

/* On devices of compute capability 9.0 and later (ck_feat.pdl, which the
 * portable path turns off), unless ANE_CUDA_PDL=0 */
static inline int pdl_on()
{
    static int dbg = -1;
    if (dbg < 0) dbg = ck_debug_off("ANE_CUDA_PDL");
    return !dbg && ck_feat_now()->pdl;
}

/* True the first time it is asked on the calling thread's current device
 * (per flag): settings such as cudaFuncSetAttribute hold for one device,
 * and a backend of each device of a tensor-parallel group asks once. */
static inline bool ck_first_on_device(unsigned *done)
{
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) d = 0;
    unsigned bit = 1u << (d & 31);
    return !(__atomic_fetch_or(done, bit, __ATOMIC_RELAXED) & bit);
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
