// moe.cuh — what the expert kernels (moe.cu, moe_tc.cu) share: a block's
// tile, a slot's activation row, and the activation of a gate/up pair.
#pragma once

#include "shaders/dequant.cuh"

/* The tile of this block (blockIdx.x): its expert e, first slot s0 and
 * slots ns; false past the tiles the grouping made. */
__device__ __forceinline__ bool moe_tile(const int32_t *tiles, const int32_t *n_tiles, int &e, int &s0, int &ns)
{
    pdl_begin();
    int ti = blockIdx.x;
    if (ti >= *n_tiles) return false;
    e = tiles[3 * ti]; s0 = tiles[3 * ti + 1]; ns = tiles[3 * ti + 2];
    return true;
}

/* x's row of slot s0 + s: by token (pair / K) or by slot */
__device__ __forceinline__ size_t moe_src(int by_token, const int32_t *pair, int K, int s0, int s)
{
    return (size_t)(by_token ? pair[s0 + s] / K : s0 + s);
}

/* act(g, u) of one value (cpu_moe.c's moe_act) */
__device__ __forceinline__ float moe_act1(float a, float b, int act, float alpha, float limit)
{
    if (act == 1) {
        a = 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))) * b;
    } else if (act == 2) {
        a = a < limit ? a : limit;
        b = b < -limit ? -limit : b > limit ? limit : b;
        a = a / (1.0f + expf(-alpha * a)) * (b + 1.0f);
    } else {
        a = a / (1.0f + expf(-a)) * b;
    }
    return a;
}
