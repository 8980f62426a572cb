// moe.cu — the mixture-of-experts op (engine/backend/cuda.c, cu_moe; the
// contract in backend.h, be_moe): routing, the (token, rank) pairs grouped
// by expert, each expert's rows run over its own tokens only, the
// activation, and the weighted sum in rank order.
//
// The experts' matmuls go by tiles: a tile is up to CK_MOE_TT pair slots of
// one expert (the grouping kernel lists them, on the device, so a pass
// launches the same grid whatever the routing and may be recorded as a
// graph); a block takes a tile and CK_MOE_RT rows, dequantizes the rows'
// 32-value chunks (dq32, every weight type), four at a time, and each
// thread sums its (slot, row) outputs over the values in order. A decode step's pairs are
// a tile each: only the chosen experts' weights are read. A prompt's
// tokens of one expert share a tile: its weights are read once per tile.
// A (slot, row) output's arithmetic does not depend on the other slots of
// its tile, so a token's result does not depend on its batch.
#include "shaders/moe.cuh"

#include <limits.h>

/* Token t's routing by one warp: the K best logits (ties: the lower
 * index), then the weights as cpu_moe.c's route computes them; each id
 * then the expert's index among the nh held from e0 on, -1 where held by
 * another rank (expert parallelism; e0 0, nh X: all). */
__device__ __forceinline__ void moe_route_tok(const float *lg, int t, int lane, int X, int K, int gating, int norm,
                                              float scale, int e0, int nh, int32_t *ids, float *wts)
{
    const float *l = lg + (size_t)t * X;
    int32_t *id = ids + (size_t)t * K;
    float *w = wts + (size_t)t * K;
    uint32_t taken = 0;   /* bit q: expert lane + 32 q chosen (X <= 1024) */
    for (int j = 0; j < K; j++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int e = lane, q = 0; e < X; e += 32, q++)
            if (!((taken >> q) & 1) && (bi == INT_MAX || l[e] > bv)) { bv = l[e]; bi = e; }
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
        }
        if (bi % 32 == lane) taken |= 1u << (bi / 32);
        if (lane == 0) id[j] = bi;
    }
    __syncwarp();
    float all = 0, mx = l[id[0]];
    if (gating == 0) {   /* BE_MOE_SOFTMAX: the sum over every expert */
        for (int e = lane; e < X; e += 32) all += expf(l[e] - mx);
#pragma unroll
        for (int o = 16; o; o >>= 1) all += __shfl_xor_sync(0xffffffffu, all, o);
    }
    if (lane) return;
    float sum = 0;
    for (int j = 0; j < K; j++) {
        float v = l[id[j]];
        v = gating == 2 ? 1.0f / (1.0f + expf(-v)) : expf(v - mx);
        if (gating == 0) v /= all;
        w[j] = v;
        sum += v;
    }
    for (int j = 0; j < K; j++) {
        if (norm || gating == 1) w[j] /= sum;
        if (scale != 0 && scale != 1) w[j] *= scale;
        id[j] = id[j] >= e0 && id[j] < e0 + nh ? id[j] - e0 : -1;
    }
}

/* one warp per token */
__global__ void k_moe_route(const float *lg, int T, int X, int K, int gating, int norm, float scale, int e0, int nh,
                            int32_t *ids, float *wts)
{
    pdl_begin();
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t < T) moe_route_tok(lg, t, threadIdx.x & 31, X, K, gating, norm, scale, e0, nh, ids, wts);
}

/* Inclusive prefix sums of a[0..X) and b[0..X) (X <= 1024) in shared
 * memory, by the whole block (32-entry segments by warps, then the
 * segments' offsets by warp 0). */
__device__ void moe_scan2(int *a, int *b, int X, int *wa, int *wb)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5, nseg = (X + 31) / 32;
    for (int g = w; g < nseg; g += nw) {
        int i = g * 32 + lane, va = i < X ? a[i] : 0, vb = i < X ? b[i] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int ta = __shfl_up_sync(0xffffffffu, va, o), tb = __shfl_up_sync(0xffffffffu, vb, o);
            if (lane >= o) { va += ta; vb += tb; }
        }
        if (i < X) { a[i] = va; b[i] = vb; }
        if (lane == 31) { wa[g] = va; wb[g] = vb; }
    }
    __syncthreads();
    if (w == 0) {
        int va = lane < nseg ? wa[lane] : 0, vb = lane < nseg ? wb[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int ta = __shfl_up_sync(0xffffffffu, va, o), tb = __shfl_up_sync(0xffffffffu, vb, o);
            if (lane >= o) { va += ta; vb += tb; }
        }
        int ea = __shfl_up_sync(0xffffffffu, va, 1), eb = __shfl_up_sync(0xffffffffu, vb, 1);
        if (lane < nseg) { wa[lane] = lane ? ea : 0; wb[lane] = lane ? eb : 0; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < X; i += blockDim.x) { a[i] += wa[i / 32]; b[i] += wb[i / 32]; }
    __syncthreads();
}

#define MOE_GROUP_SID 6144
/* By the whole block: the pairs' slots, expert by expert, tokens in order
 * within one; the tiles (expert, first slot, slots) of up to tt. Counts
 * and their prefix sums in shared memory, each expert's tiles by its
 * thread; then warp 0 walks the pairs 32 at a time, each lane's slot its
 * expert's next free one plus its rank among the lanes of that expert.
 * A pair of id -1 (another rank's expert) gets slot -1 and no tile. */
__device__ void moe_group_block(const int32_t *ids, int N, int X, int tt, int32_t *first, int32_t *slot,
                                int32_t *pair, int32_t *tiles, int32_t *n_tiles)
{
    __shared__ int cnt[1024], tof[1024], run[1024], wa[32], wb[32], sid[MOE_GROUP_SID];
    /* the ids in shared memory where they fit (the walk's reads) */
    const bool sh = N <= MOE_GROUP_SID;
    for (int i = threadIdx.x; sh && i < N; i += blockDim.x) sid[i] = ids[i];
    for (int e = threadIdx.x; e < X; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const int32_t *id = sh ? sid : ids;
    for (int i = threadIdx.x; i < N; i += blockDim.x)
        if (id[i] >= 0) atomicAdd(&cnt[id[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < X; e += blockDim.x) tof[e] = (cnt[e] + tt - 1) / tt;
    __syncthreads();
    moe_scan2(cnt, tof, X, wa, wb);   /* cnt[e], tof[e]: slots and tiles of experts 0..e */
    for (int e = threadIdx.x; e < X; e += blockDim.x) {
        int end = cnt[e], f = e ? cnt[e - 1] : 0, t = e ? tof[e - 1] : 0;
        first[e] = f;
        run[e] = f;
        for (int s = f; s < end; s += tt, t++) {
            tiles[3 * t] = e;
            tiles[3 * t + 1] = s;
            tiles[3 * t + 2] = end - s < tt ? end - s : tt;
        }
    }
    if (threadIdx.x == 0) {
        first[X] = cnt[X - 1];
        *n_tiles = tof[X - 1];
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    const unsigned below = (1u << lane) - 1;
    for (int i0 = 0; i0 < N; i0 += 32) {
        const int i = i0 + lane;
        const bool live = i < N && id[i] >= 0;
        const int e = live ? id[i] : -1 - lane;   /* (a dead lane matches no other) */
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        if (i < N && !live) slot[i] = -1;
        if (live) {
            const int k = run[e] + __popc(peers & below);
            slot[i] = k;
            pair[k] = i;
        }
        __syncwarp();
        if (live && !(peers & below)) run[e] += __popc(peers);
        __syncwarp();
    }
}

__global__ void k_moe_group(const int32_t *ids, int N, int X, int tt, int32_t *first, int32_t *slot, int32_t *pair,
                            int32_t *tiles, int32_t *n_tiles)
{
    pdl_begin();
    moe_group_block(ids, N, X, tt, first, slot, pair, tiles, n_tiles);
}

/* Routing and grouping of a small batch in one block (a warp per token
 * in turn, then the grouping): one launch fewer per layer in decode. */
__global__ void k_moe_route_group(const float *lg, int T, int X, int K, int gating, int norm, float scale, int e0,
                                  int nh, int32_t *ids, float *wts, int32_t *first, int32_t *slot, int32_t *pair,
                                  int32_t *tiles, int32_t *n_tiles)
{
    pdl_begin();
    for (int t = threadIdx.x >> 5; t < T; t += blockDim.x >> 5)
        moe_route_tok(lg, t, threadIdx.x & 31, X, K, gating, norm, scale, e0, nh, ids, wts);
    __syncthreads();
    moe_group_block(ids, T * K, nh, CK_MOE_TT, first, slot, pair, tiles, n_tiles);
}

/* The warp-per-row kernels' (tile, row) of this warp: false past the
 * tiles or the rows; else its expert e, slots s0.., lane and row r. */
__device__ __forceinline__ bool moe_warp(const int32_t *tiles, const int32_t *n_tiles, int rows, int &e, int &s0,
                                         int &ns, int &lane, int &r)
{
    if (!moe_tile(tiles, n_tiles, e, s0, ns)) return false;
    lane = threadIdx.x & 31;
    r = blockIdx.y * 8 + (threadIdx.x >> 5);
    return r < rows;
}

/* The warp's sums of its slots met by a fixed butterfly, lane 0 storing
 * y[slot][r] (+ the expert's bias) */
__device__ __forceinline__ void moe_warp_store(const float (&acc)[CK_MOE_TT], int ns, int s0, int e, int r,
                                               int rows, int lane, const float *bias, float *y)
{
#pragma unroll
    for (int s = 0; s < CK_MOE_TT; s++) {
        if (s >= ns) break;
        float v = warp_sum(acc[s]);
        if (lane == 0) y[(size_t)(s0 + s) * rows + r] = bias ? v + bias[(size_t)e * rows + r] : v;
    }
}

/* y[s][r] = dot(row r of expert e, x of slot s) (+ bias[e][r]) for the
 * slots of tile blockIdx.x and rows blockIdx.y * CK_MOE_RT ...; x rows by
 * token (pair / K) when by_token, else by slot. Each step takes MOE_KC
 * chunks of 32 values: every thread dequantizes one (row, chunk), then
 * sums its (slot, row) products over the step's values in order. */
#define MOE_KC 4
template <int TY>
__global__ void __launch_bounds__(256) k_moe_mm(const uint8_t *W, size_t rb, int n, int rows, const float *x,
                                               int by_token, int K, const int32_t *pair, const int32_t *tiles,
                                               const int32_t *n_tiles, const float *bias, float *y)
{
    int e, s0, ns;
    if (!moe_tile(tiles, n_tiles, e, s0, ns)) return;
    int r0 = blockIdx.y * CK_MOE_RT, tid = threadIdx.x;
    __shared__ float ws[CK_MOE_RT][32 * MOE_KC + 1], xs[CK_MOE_TT][32 * MOE_KC + 1];
    __shared__ int src[CK_MOE_TT];
    if (tid < CK_MOE_TT) src[tid] = tid < ns ? (by_token ? pair[s0 + tid] / K : s0 + tid) : -1;
    int r = tid % CK_MOE_RT, sg = tid / CK_MOE_RT;   /* this thread: row r, slots sg + 4j; chunk sg of a step */
    float acc[CK_MOE_TT / 4] = { 0 };
    const uint8_t *We = W + (size_t)e * rows * rb;
    int nc = (n + 31) / 32;
    for (int c0 = 0; c0 < nc; c0 += MOE_KC) {
        __syncthreads();
        {
            float w[32];
            int c = c0 + sg;
            if (r0 + r < rows && c < nc) {
                dq32<TY>(We + (size_t)(r0 + r) * rb, c, n, w);
            } else {
#pragma unroll
                for (int k = 0; k < 32; k++) w[k] = 0.f;
            }
#pragma unroll
            for (int k = 0; k < 32; k++) ws[r][32 * sg + k] = w[k];
        }
        for (int i = tid; i < CK_MOE_TT * 32 * MOE_KC; i += blockDim.x) {
            int s = i / (32 * MOE_KC), k = i % (32 * MOE_KC), sr = src[s], v = c0 * 32 + k;
            xs[s][k] = sr >= 0 && v < n ? x[(size_t)sr * n + v] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < CK_MOE_TT / 4; j++) {
            float a = acc[j];
#pragma unroll 8
            for (int k = 0; k < 32 * MOE_KC; k++) a = fmaf(ws[r][k], xs[sg + 4 * j][k], a);
            acc[j] = a;
        }
    }
    if (r0 + r >= rows) return;
#pragma unroll
    for (int j = 0; j < CK_MOE_TT / 4; j++) {
        int s = sg + 4 * j;
        if (s >= ns) continue;
        float v = acc[j];
        if (bias) v += bias[(size_t)e * rows + r0 + r];
        y[(size_t)(s0 + s) * rows + r0 + r] = v;
    }
}

/* The same products for decode-sized batches, bandwidth-bound: a warp per
 * (tile, row); each lane dequantizes chunks lane, lane+32, ... of the row
 * once and dots them with every slot of the tile, then the lanes' sums
 * meet by a fixed butterfly. What a (slot, row) gets depends only on its
 * own x and row, not on the tile's other slots. */
template <int TY>
__global__ void __launch_bounds__(256) k_moe_mv(const uint8_t *W, size_t rb, int n, int rows, const float *x,
                                               int by_token, int K, const int32_t *pair, const int32_t *tiles,
                                               const int32_t *n_tiles, const float *bias, float *y)
{
    int e, s0, ns, lane, r;
    if (!moe_warp(tiles, n_tiles, rows, e, s0, ns, lane, r)) return;
    const uint8_t *row = W + ((size_t)e * rows + r) * rb;
    const float *xs[CK_MOE_TT];
#pragma unroll
    for (int s = 0; s < CK_MOE_TT; s++) xs[s] = s < ns ? x + moe_src(by_token, pair, K, s0, s) * n : NULL;
    float acc[CK_MOE_TT];
#pragma unroll
    for (int s = 0; s < CK_MOE_TT; s++) acc[s] = 0.f;
    int nc = (n + 31) / 32;
    for (int c = lane; c < nc; c += 32) {
        float w[32];
        dq32<TY>(row, c, n, w);
        int lim = n - c * 32 < 32 ? n - c * 32 : 32;
#pragma unroll
        for (int s = 0; s < CK_MOE_TT; s++) {
            if (s >= ns) break;
            const float *xv = xs[s] + c * 32;
            float a = acc[s];
            for (int k = 0; k < lim; k++) a = fmaf(w[k], xv[k], a);
            acc[s] = a;
        }
    }
    moe_warp_store(acc, ns, s0, e, r, rows, lane, bias, y);
}

/* One (row chunk, x block) product of the int8 experts: the unit dq32i
 * gave (q, d0, d1, m) against x's block bi (int8 values, scale xd, sum
 * xs), exact integer dots, then added to acc. Every int8 expert kernel
 * takes its products through this, so a (slot, row) output has the same
 * bits whichever kernel and batch computed it. */
template <int TY>
__device__ __forceinline__ float mvq_unit(float acc, const int (&q)[8], float d0, float d1, float m,
                                          const int8_t *xq, const float *xd, const int *xs, size_t bi)
{
    const bool two = TY == QT_Q3_K || TY == QT_Q6_K,
               min = TY == QT_Q4_1 || TY == QT_Q5_1 || TY == QT_Q4_K || TY == QT_Q5_K;
    const int4 *xv = (const int4 *)(xq + bi * 32);
    const int4 xa = xv[0], xb = xv[1];
    int lo = __dp4a(q[0], xa.x, 0);
    lo = __dp4a(q[1], xa.y, lo); lo = __dp4a(q[2], xa.z, lo); lo = __dp4a(q[3], xa.w, lo);
    int hi = __dp4a(q[4], xb.x, 0);
    hi = __dp4a(q[5], xb.y, hi); hi = __dp4a(q[6], xb.z, hi); hi = __dp4a(q[7], xb.w, hi);
    /* (rounding spelled out: the same bits in every kernel that inlines it) */
    float v = two ? __fmaf_rn(d0, (float)lo, __fmul_rn(d1, (float)hi)) : __fmul_rn(d0, (float)(lo + hi));
    if (min) v = __fmaf_rn(-m, (float)xs[bi], v);
    return __fmaf_rn(xd[bi], v, acc);
}

/* k_moe_mv for the types with an int8 form (dq32i), x quantized per 32
 * values as the GEMV's (xq [rows][n], scales xd and sums xs [rows][n/32]):
 * the CPU's kind of arithmetic (int8 activations, exact integer dots), so
 * that both route alike. For every batch size: a weight row is read once
 * per tile of up to CK_MOE_TT slots, and each unit costs eight __dp4a per
 * slot. A (slot, row) output depends only on its own x and row. */
template <int TY>
__global__ void __launch_bounds__(256) k_moe_mvq(const uint8_t *W, size_t rb, int n, int rows, const int8_t *xq,
                                                const float *xd, const int *xs, int by_token, int K,
                                                const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                                                const float *bias, float *y)
{
    int e, s0, ns, lane, r;
    if (!moe_warp(tiles, n_tiles, rows, e, s0, ns, lane, r)) return;
    const uint8_t *row = W + ((size_t)e * rows + r) * rb;
    const int nc = n / 32;
    size_t src[CK_MOE_TT];
#pragma unroll
    for (int s = 0; s < CK_MOE_TT; s++) src[s] = s < ns ? moe_src(by_token, pair, K, s0, s) * nc : 0;
    float acc[CK_MOE_TT];
#pragma unroll
    for (int s = 0; s < CK_MOE_TT; s++) acc[s] = 0.f;
    for (int c = lane; c < nc; c += 32) {
        int q[8];
        float d0, d1, m;
        dq32i<TY>(row, c, n, q, d0, d1, m);
#pragma unroll
        for (int s = 0; s < CK_MOE_TT; s++) {
            if (s >= ns) break;
            acc[s] = mvq_unit<TY>(acc[s], q, d0, d1, m, xq, xd, xs, src[s] + c);
        }
    }
    moe_warp_store(acc, ns, s0, e, r, rows, lane, bias, y);
}

/* R rows (r, r+1, ..) of gate and up for the tile's slots (up to NS), the
 * lanes' chunks outer so that the R rows' loads are in flight together:
 * each (slot, row) sums its units in chunk order, as k_moe_mvq does; the
 * rows' act values (+ biases) into hv[slot][rr..]. */
template <int TY, int NS, int R>
__device__ __forceinline__ void glu_rows(const uint8_t *Wg, const uint8_t *Wu, size_t rb, int n, int rows, int e,
                                         int r, int rr, int ns, const size_t (&src)[NS], const int8_t *xq,
                                         const float *xd, const int *xs, const float *bg, const float *bu, int act,
                                         float alpha, float limit, int lane, float (*hv)[33])
{
    const int nc = n / 32;
    float ag[R][NS], au[R][NS];
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int s = 0; s < NS; s++) ag[j][s] = au[j][s] = 0.f;
    for (int c = lane; c < nc; c += 32) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            const size_t ro = ((size_t)e * rows + r + j) * rb;
            int qg[8], qu[8];
            float g0, g1, gm, u0, u1, um;
            dq32i<TY>(Wg + ro, c, n, qg, g0, g1, gm);
            dq32i<TY>(Wu + ro, c, n, qu, u0, u1, um);
#pragma unroll
            for (int s = 0; s < NS; s++) {
                if (s >= ns) break;
                ag[j][s] = mvq_unit<TY>(ag[j][s], qg, g0, g1, gm, xq, xd, xs, src[s] + c);
                au[j][s] = mvq_unit<TY>(au[j][s], qu, u0, u1, um, xq, xd, xs, src[s] + c);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int s = 0; s < NS; s++) {
            if (s >= ns) break;
            float g = warp_sum(ag[j][s]), u = warp_sum(au[j][s]);
            if (bg) g = g + bg[(size_t)e * rows + r + j];
            if (bu) u = u + bu[(size_t)e * rows + r + j];
            if (lane == 0) hv[s][rr + j] = moe_act1(g, u, act, alpha, limit);
        }
}

/* The gate and up products of the int8 experts, their activation and its
 * int8 form in one launch: a block takes a tile (blockIdx.x) and 32 rows
 * (blockIdx.y; a warp 4 of them), each (slot, row) product as k_moe_mvq
 * computes it (+ bias), act of the pair into shared memory, then a warp
 * per slot writes the 32 values (hg, f32, when given) and quantizes them
 * as k_quant_x would (into hq's act_forms). rows % 32 == 0. NS: the most
 * slots a tile has (a tile has at most one slot per token): with a few,
 * a warp's four rows are read together. */
template <int TY, int NS>
__global__ void __launch_bounds__(256) k_moe_gluq(const uint8_t *Wg, const uint8_t *Wu, size_t rb, int n, int rows,
                                                 const int8_t *xq, const float *xd, const int *xs, int K,
                                                 const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                                                 const float *bg, const float *bu, int act, float alpha, float limit,
                                                 float *hg, act_forms hq)
{
    int e, s0, ns;
    if (!moe_tile(tiles, n_tiles, e, s0, ns)) return;
    __shared__ float hv[NS][33];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, r0 = blockIdx.y * 32, nc = n / 32;
    size_t src[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) src[s] = s < ns ? moe_src(1, pair, K, s0, s) * nc : 0;
    if constexpr (NS <= 4) {
        glu_rows<TY, NS, 4>(Wg, Wu, rb, n, rows, e, r0 + wp * 4, wp * 4, ns, src, xq, xd, xs, bg, bu, act, alpha,
                            limit, lane, hv);
    } else {
        for (int j = 0; j < 4; j++)
            glu_rows<TY, NS, 1>(Wg, Wu, rb, n, rows, e, r0 + wp * 4 + j, wp * 4 + j, ns, src, xq, xd, xs, bg, bu,
                                act, alpha, limit, lane, hv);
    }
    __syncthreads();
    for (int s = wp; s < ns; s += 8) {
        float v = hv[s][lane];
        if (hg) hg[(size_t)(s0 + s) * rows + r0 + lane] = v;
        if (hq.q) quant_block(v, lane, (size_t)(s0 + s) * (rows / 32) + r0 / 32, hq);
    }
}

/* The down products of a few tokens with the weighted sum (ck_moe_combine)
 * in one launch: a warp per (token blockIdx.y, row), its K <= CK_MOE_KTOK
 * pairs' experts' rows against their slots' int8 activations (each (slot,
 * row) product as k_moe_mvq's, + bias), then out = sum over k of w * y in
 * rank order, as k_moe_combine sums. Each lane's chunks of the K rows are
 * read together: a decode step's K expert rows in flight at once. */
#define CK_MOE_KTOK 8
/* (three blocks an SM: each lane's K rows' loads hoisted ahead took up to
 * 157 registers, one block an SM, and a layer's rows a third wave; q5_K and
 * q6_K, whose units need more, two) */
template <int TY>
__global__ void __launch_bounds__(256, TY == QT_Q5_K || TY == QT_Q6_K ? 2 : 3)
k_moe_downq(const uint8_t *W, size_t rb, int n, int rows, const int8_t *xq, const float *xd, const int *xs, int K,
            const int32_t *ids, const int32_t *slot, const float *wts, const float *bias, float *out)
{
    pdl_begin();
    const int t = blockIdx.y, lane = threadIdx.x & 31, r = blockIdx.x * 8 + (threadIdx.x >> 5), nc = n / 32;
    if (r >= rows) return;
    const uint8_t *row[CK_MOE_KTOK];
    size_t src[CK_MOE_KTOK];
    float acc[CK_MOE_KTOK];
    unsigned held = 0;   /* bit k: pair k's expert is held here */
#pragma unroll
    for (int k = 0; k < CK_MOE_KTOK; k++) {
        int p = t * K + (k < K ? k : 0), e = ids[p];
        held |= (unsigned)(k < K && e >= 0) << k;
        row[k] = W + ((size_t)(e < 0 ? 0 : e) * rows + r) * rb;
        src[k] = (size_t)(e < 0 ? 0 : slot[p]) * nc;
        acc[k] = 0.f;
    }
    for (int c = lane; c < nc; c += 32) {
#pragma unroll
        for (int k = 0; k < CK_MOE_KTOK; k++) {
            if (k >= K) break;
            if (!((held >> k) & 1)) continue;
            int q[8];
            float d0, d1, m;
            dq32i<TY>(row[k], c, n, q, d0, d1, m);
            acc[k] = mvq_unit<TY>(acc[k], q, d0, d1, m, xq, xd, xs, src[k] + c);
        }
    }
    const float *w = wts + (size_t)t * K;
    float o = 0.f;
    bool any = false;
#pragma unroll
    for (int k = 0; k < CK_MOE_KTOK; k++) {
        if (k >= K) break;
        if (!((held >> k) & 1)) continue;
        float v = warp_sum(acc[k]);
        if (bias) v = v + bias[(size_t)ids[t * K + k] * rows + r];
        o = any ? __fmaf_rn(w[k], v, o) : __fmul_rn(w[k], v);
        any = true;
    }
    if (lane == 0) out[(size_t)t * rows + r] = o;
}

/* g = act(g, u) over n values */
__global__ void k_moe_act(float *g, const float *u, size_t n, int act, float alpha, float limit)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = moe_act1(g[i], u[i], act, alpha, limit);
}

/* out[t] = sum over k of w[t][k] * y[slot[t][k]], k in order, over the
 * pairs held here (slot -1: another rank's expert; none: 0) */
__global__ void k_moe_combine(const float *y, const int32_t *slot, const float *w, int K, int E, float *out)
{
    pdl_begin();
    int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= E) return;
    const int32_t *sl = slot + (size_t)t * K;
    const float *wt = w + (size_t)t * K;
    float o = 0.f;   /* (k_moe_downq's sum) */
    bool any = false;
    for (int k = 0; k < K; k++) {
        if (sl[k] < 0) continue;
        o = any ? __fmaf_rn(wt[k], y[(size_t)sl[k] * E + i], o) : __fmul_rn(wt[k], y[(size_t)sl[k] * E + i]);
        any = true;
    }
    out[(size_t)t * E + i] = o;
}

/* k_moe_mvq for the types with an int8 form (none for the others) */
template <int TY>
static void mvq_launch(cudaStream_t st, dim3 g, const uint8_t *W, size_t rb, int n, int rows, act_forms L,
                       int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                       const float *bias, float *y)
{
    if constexpr (dq32i_type(TY))
        lk(k_moe_mvq<TY>, g, 256, 0, st, W, rb, n, rows, (const int8_t *)L.q, (const float *)L.d, (const int *)L.s,
           by_token, K, pair, tiles, n_tiles, bias, y);
}

template <int TY>
static void gluq_launch(cudaStream_t st, dim3 g, int T, const void *Wg, const void *Wu, size_t rb, int n, int F,
                        act_forms L, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                        const float *bg, const float *bu, int act, float alpha, float limit, float *hg, act_forms H)
{
    if constexpr (dq32i_type(TY))
        lk(T <= 4 ? k_moe_gluq<TY, 4> : k_moe_gluq<TY, CK_MOE_TT>, g, 256, 0, st, (const uint8_t *)Wg,
           (const uint8_t *)Wu, rb, n, F, (const int8_t *)L.q, (const float *)L.d, (const int *)L.s, K, pair, tiles,
           n_tiles, bg, bu, act, alpha, limit, hg, H);
}

template <int TY>
static void downq_launch(cudaStream_t st, dim3 g, const void *W, size_t rb, int F, int E, act_forms L, int K,
                         const int32_t *ids, const int32_t *slot, const float *wts, const float *bias, float *out)
{
    if constexpr (dq32i_type(TY))
        lk(k_moe_downq<TY>, g, 256, 0, st, (const uint8_t *)W, rb, F, E, (const int8_t *)L.q, (const float *)L.d,
           (const int *)L.s, K, ids, slot, wts, bias, out);
}

extern "C" {

void ck_moe_route(cudaStream_t st, const float *lg, int T, int X, int K, int gating, int norm, float scale, int e0,
                  int nh, int32_t *ids, float *wts)
{
    lk(k_moe_route, nblk((size_t)T, 4), 128, 0, st, lg, T, X, K, gating, norm, scale, e0, nh, ids, wts);
}

void ck_moe_route_group(cudaStream_t st, const float *lg, int T, int X, int K, int gating, int norm, float scale,
                        int e0, int nh, int32_t *ids, float *wts, int32_t *first, int32_t *slot, int32_t *pair,
                        int32_t *tiles, int32_t *n_tiles)
{
    lk(k_moe_route_group, 1, 512, 0, st, lg, T, X, K, gating, norm, scale, e0, nh, ids, wts, first, slot, pair,
       tiles, n_tiles);
}

void ck_moe_group(cudaStream_t st, const int32_t *ids, int N, int X, int tt, int32_t *first, int32_t *slot,
                  int32_t *pair, int32_t *tiles, int32_t *n_tiles)
{
    lk(k_moe_group, 1, 512, 0, st, ids, N, X, tt, first, slot, pair, tiles, n_tiles);
}

void ck_moe_mm(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const float *x,
               int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
               const float *bias, float *y, int mv)
{
    if (mv) {
        dim3 gv((unsigned)max_tiles, nblk((size_t)rows, 8));
#define L_MV(TY) lk(k_moe_mv<TY>, gv, 256, 0, st, (const uint8_t *)W, rb, n, rows, x, by_token, K, pair, tiles, \
                    n_tiles, bias, y)
        TYPE_SWITCH(type, L_MV)
        return;
    }
    dim3 g((unsigned)max_tiles, nblk((size_t)rows, CK_MOE_RT));
#define L_MOE(TY) lk(k_moe_mm<TY>, g, 256, 0, st, (const uint8_t *)W, rb, n, rows, x, by_token, K, pair, tiles, \
                      n_tiles, bias, y)
    TYPE_SWITCH(type, L_MOE)
}

int ck_moe_int8(uint32_t type, int n) { return n % 32 == 0 && dq32i_type((int)type); }

void ck_moe_mmq(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const void *xq,
                int x_rows, int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                int max_tiles, const float *bias, float *y)
{
    act_forms L = act_int8_at((void *)xq, x_rows, n);
    dim3 g((unsigned)max_tiles, nblk((size_t)rows, 8));
#define L_MVQ(TY) mvq_launch<TY>(st, g, (const uint8_t *)W, rb, n, rows, L, by_token, K, pair, tiles, n_tiles, bias, y)
    TYPE_SWITCH(type, L_MVQ)
}

int ck_moe_gluq_ok(uint32_t gate_type, size_t gate_rb, uint32_t up_type, size_t up_rb, int n, int F)
{
    return gate_type == up_type && gate_rb == up_rb && ck_moe_int8(gate_type, n) && F % 32 == 0;
}

void ck_moe_gluq(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int F,
                 const void *xq, int x_rows, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                 int max_tiles, const float *bg, const float *bu, int act, float alpha, float limit, float *hg,
                 void *hq, int N)
{
    act_forms L = act_int8_at((void *)xq, x_rows, n), H;
    if (hq) H = act_int8_at(hq, N, F);
    else memset(&H, 0, sizeof H);
    dim3 g((unsigned)max_tiles, (unsigned)(F / 32));
#define L_GLU(TY) \
    gluq_launch<TY>(st, g, x_rows, Wg, Wu, rb, n, F, L, K, pair, tiles, n_tiles, bg, bu, act, alpha, limit, hg, H)
    TYPE_SWITCH(type, L_GLU)
}

int ck_moe_downq_ok(uint32_t type, int F, int K) { return ck_moe_int8(type, F) && K >= 1 && K <= CK_MOE_KTOK; }

void ck_moe_downq(cudaStream_t st, uint32_t type, const void *W, size_t rb, int F, int E, const void *hq, int N, int T,
                  int K, const int32_t *ids, const int32_t *slot, const float *wts, const float *bias, float *out)
{
    act_forms L = act_int8_at((void *)hq, N, F);
    dim3 g(nblk((size_t)E, 8), (unsigned)T);
#define L_DOWN(TY) downq_launch<TY>(st, g, W, rb, F, E, L, K, ids, slot, wts, bias, out)
    TYPE_SWITCH(type, L_DOWN)
}

void ck_moe_act(cudaStream_t st, float *g, const float *u, size_t n, int act, float alpha, float limit)
{
    lk(k_moe_act, nblk(n, 256), 256, 0, st, g, u, n, act, alpha, limit);
}

void ck_moe_combine(cudaStream_t st, const float *y, const int32_t *slot, const float *w, int T, int K, int E,
                    float *out)
{
    dim3 g(nblk((size_t)E, 256), (unsigned)T);
    lk(k_moe_combine, g, 256, 0, st, y, slot, w, K, E, out);
}

}  /* extern "C" */
