// gemv.cu — matmuls of up to CK_GEMV_MAX_T tokens that read the quantized
// rows directly: f32 arithmetic for every type, int8 activations (__dp4a)
// for q4_K, q6_K, q8_0, iq4_nl, iq4_xs and mxfp4, with the same arithmetic
// per (row, token) at every batch size and tile shape.
#include "shaders/common.cuh"
#include "shaders/iq.cuh"
#include "shaders/dequant.cuh"

__device__ __forceinline__ void nib8(uint32_t lo4, uint32_t hi4, int high, float *q)
{
    /* 8 bytes (two words) -> 8 nibbles (low or high) */
#pragma unroll
    for (int k = 0; k < 4; k++) {
        q[k] = (float)(((lo4 >> (8 * k)) >> (high ? 4 : 0)) & 0xF);
        q[4 + k] = (float)(((hi4 >> (8 * k)) >> (high ? 4 : 0)) & 0xF);
    }
}


// 8 values g*8 .. g*8+7 of a row (n values; n % 8 == 0 for quantized types;
// float types mask past n). Consecutive g read consecutive bytes, so a warp
// over consecutive g reads the row coalesced.
template <int TY>
__device__ __forceinline__ void dq8(const uint8_t *__restrict__ row, int g, int n, float w[8])
{
    if (iq_type(TY)) {   /* i-quants, iq4_nl, iq4_xs, mxfp4 */
        const int per = iq_blck(TY) / 8;
        iq_dq8<TY>(row + (size_t)(g / per) * iq_bsize(TY), g % per, w);
    } else if (TY == QT_F32) {
        const float *r = (const float *)row + g * 8;
        if (g * 8 + 8 <= n && ((uintptr_t)r & 15) == 0) {
            float4 a = __ldg((const float4 *)r), b = __ldg((const float4 *)r + 1);
            w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = g * 8 + i < n ? r[i] : 0.f;
        }
    } else if (TY == QT_F16 || TY == QT_BF16) {
        const unsigned short *r = (const unsigned short *)row + g * 8;
        if (g * 8 + 8 <= n && ((uintptr_t)r & 15) == 0) {
            uint4 v = __ldg((const uint4 *)r);
            uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
            for (int k = 0; k < 4; k++) {
                unsigned short lo = (unsigned short)(u[k] & 0xffff), hi = (unsigned short)(u[k] >> 16);
                w[2 * k] = w16_to_f<TY>(lo);
                w[2 * k + 1] = w16_to_f<TY>(hi);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                unsigned short u = g * 8 + i < n ? r[i] : 0;
                w[i] = w16_to_f<TY>(u);
            }
        }
    } else if (TY == QT_Q8_0) {
        int2 v = ld8(row + g * 8);
        float d = h2f(row + n + 2 * (g >> 2));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[k] = (float)(int8_t)(v.x >> (8 * k)) * d;
            w[4 + k] = (float)(int8_t)(v.y >> (8 * k)) * d;
        }
    } else if (TY == QT_Q4_0 || TY == QT_Q4_1 || TY == QT_Q5_0 || TY == QT_Q5_1) {
        const int bs = TY == QT_Q4_0 ? 18 : TY == QT_Q4_1 ? 20 : TY == QT_Q5_0 ? 22 : 24;
        const uint8_t *b = row + (g >> 2) * bs;
        int j8 = g & 3;
        float d = h2f(b);
        {
            const int qo = TY == QT_Q4_0 ? 2 : TY == QT_Q4_1 ? 4 : TY == QT_Q5_0 ? 6 : 8;
            const uint8_t *q = b + qo + 8 * (j8 & 1);
            uint32_t a0 = TY == QT_Q4_1 || TY == QT_Q5_1 ? *(const uint32_t *)q : ld32a2(q);
            uint32_t a1 = TY == QT_Q4_1 || TY == QT_Q5_1 ? *(const uint32_t *)(q + 4) : ld32a2(q + 4);
            float v[8];
            nib8(a0, a1, j8 >> 1, v);
            if (TY == QT_Q5_0 || TY == QT_Q5_1) {
                uint32_t qh = TY == QT_Q5_0 ? ld32a2(b + 2) : *(const uint32_t *)(b + 4);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] += (float)(((qh >> (8 * j8 + k)) & 1) << 4);
            }
            if (TY == QT_Q4_0) {
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = (v[k] - 8.f) * d;
            } else if (TY == QT_Q5_0) {
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = (v[k] - 16.f) * d;
            } else {
                float m = h2f(b + 2);
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = v[k] * d + m;
            }
        }
    } else {
        /* K-quants: super-block of 256 = 32 groups; chunk c of 32, offset o */
        int gi = g & 31, c = gi >> 2, o = (gi & 3) * 8;
        if (TY == QT_Q2_K || TY == QT_Q3_K) {
            const int bs = TY == QT_Q2_K ? 84 : 110;
            const uint8_t *b = row + (g >> 5) * bs;
            int half = c >> 2, j = c & 3, shift = 2 * j, is = half * 8 + 2 * j + (o >= 16);
            const uint8_t *q = b + (TY == QT_Q2_K ? 16 : 32) + 32 * half + o;
            uint32_t a0 = ld32a2(q), a1 = ld32a2(q + 4);
            float v[8];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[k] = (float)((a0 >> (8 * k + shift)) & 3);
                v[4 + k] = (float)((a1 >> (8 * k + shift)) & 3);
            }
            if (TY == QT_Q2_K) {
                float d = h2f(b + 80), mn = h2f(b + 82);
                int sc = b[is];
                float dl = d * (float)(sc & 0xF), ml = mn * (float)(sc >> 4);
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = dl * v[k] - ml;
            } else {
                const uint8_t *s12 = b + 96;
                int lo = is < 8 ? (s12[is] & 0xF) : (s12[is - 8] >> 4);
                int hi = (s12[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
                float dl = h2f(b + 108) * (float)((lo | (hi << 4)) - 32);
                uint32_t h0 = ld32a2(b + o), h1 = ld32a2(b + o + 4);
                int mb = half * 4 + j;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    w[k] = dl * (v[k] - (((h0 >> (8 * k + mb)) & 1) ? 0.f : 4.f));
                    w[4 + k] = dl * (v[4 + k] - (((h1 >> (8 * k + mb)) & 1) ? 0.f : 4.f));
                }
            }
        } else if (TY == QT_Q4_K || TY == QT_Q5_K) {
            const int bs = TY == QT_Q4_K ? 144 : 176;
            const uint8_t *b = row + (g >> 5) * bs;
            int gg = c >> 1, hi = c & 1;
            float d = h2f(b), mn = h2f(b + 2);
            int sc, m;
            scale_min_k4(c, b + 4, sc, m);
            float d1 = d * (float)sc, m1 = mn * (float)m;
            const uint8_t *q = b + (TY == QT_Q4_K ? 16 : 48) + 32 * gg + o;
            uint2 a = *(const uint2 *)q;   /* 8-byte aligned: super-blocks are */
            float v[8];
            nib8(a.x, a.y, hi, v);
            if (TY == QT_Q5_K) {
                uint2 h = *(const uint2 *)(b + 16 + o);
                int bit = 2 * gg + hi;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[k] += (float)(((h.x >> (8 * k + bit)) & 1) << 4);
                    v[4 + k] += (float)(((h.y >> (8 * k + bit)) & 1) << 4);
                }
            }
#pragma unroll
            for (int k = 0; k < 8; k++) w[k] = d1 * v[k] - m1;
        } else if (TY == QT_Q6_K) {   /* repacked (q6_word): values v0..v0+7 of unit u */
            int nu = n >> 6, u = g >> 3, v0 = (g & 7) * 8, hh = v0 >> 5, w0 = (v0 & 31) >> 2;
            uint32_t l0 = ld32a2(row + q6_word(nu, u, w0, 8)), l1 = ld32a2(row + q6_word(nu, u, w0 + 1, 8));
            uint32_t h = ld32a2(row + n / 2 + q6_word(nu, u, w0 >> 1, 4));
            float d = h2f(row + 13 * (n / 16) + 2 * (u >> 2)) * (float)((const int8_t *)row)[3 * (n / 4) + 4 * u + (v0 >> 4)];
#pragma unroll
            for (int k = 0; k < 4; k++) {   /* (w0 even: its top bits at 0-1, word w0+1's at 4-5) */
                int v0q = (int)(((l0 >> (8 * k + 4 * hh)) & 0xF) | (((h >> (8 * k + 2 * hh)) & 3) << 4));
                int v1q = (int)(((l1 >> (8 * k + 4 * hh)) & 0xF) | (((h >> (8 * k + 4 + 2 * hh)) & 3) << 4));
                w[k] = d * (float)(v0q - 32);
                w[4 + k] = d * (float)(v1q - 32);
            }
        }
    }
}

/* ---------------- GEMV: up to 16 tokens ----------------
 * A block of 4 warps takes 4/K rows, K warps per row (split over the row for
 * long rows). Lane l of a row's warp k takes 8-value groups l + 32*k, +32*K,
 * ...: each warp reads the row's bytes and x's floats contiguously. */
/* Weights are never written, so a GEMV block may start pulling its rows
 * into L2 before pdl_begin(), while the kernel before it (whose output is
 * x) still runs: the weight stream starts early instead of after a cold
 * ramp. Every thread of the block prefetches every blockDim-th 128-byte
 * line of [p, p + n). */
__device__ __forceinline__ void l2_prefetch(const void *p, size_t n)
{
    for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o) : "memory");
}

/* Whether a GEMV launch over `bytes` of weights prefetches its rows: sets
 * of up to 5 MiB. A launch-bound small model gains; a 7b's larger sets
 * lose, their prefetch running beside latency-bound kernels. */
static int gemv_prefetches(size_t bytes)
{
    return bytes <= ((size_t)5 << 20);
}

/* The row of a one-row GEMV's warp: matrix mi of the set, row r (row 0's
 * bytes when r is past the end: live false), part of its K warps. */
struct gemv_row { int warp, lane, mi, r, part; bool live; const uint8_t *row; };

/* The start of a one-row GEMV: after the previous kernel (pdl_begin), this
 * warp's row (rows rb bytes apart), its part of it and whether it is one. */
template <int K>
__device__ __forceinline__ gemv_row gemv_begin(const mat_set &S, size_t rb)
{
    pdl_begin();
    gemv_row g;
    g.warp = threadIdx.x >> 5;
    g.lane = threadIdx.x & 31;
    const int warp = g.warp;
    g.mi = block_matrix(S);
    g.r = ((int)blockIdx.x - S.m[g.mi].blk0) * (4 / K) + warp / K;
    g.part = warp % K;
    g.live = g.r < S.m[g.mi].n_out;
    g.row = S.m[g.mi].W + (size_t)(g.live ? g.r : 0) * rb;
    return g;
}

/* End of the one-row GEMVs: each warp's lane sums to one value per token,
 * the K warps of a row are added in warp order, and lane t of the row's
 * first warp writes token t (plus bias). Every thread of the block calls it. */
template <int NT, int K>
__device__ __forceinline__ void gemv_finish(float (&acc)[NT], const gemv_row &g, int T, const set_matrix &m)
{
    const int warp = g.warp, lane = g.lane, part = g.part, r = g.r;
    const bool live = g.live;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        acc[t] = s;
    }
    if (K > 1) {
        __shared__ float red[4][NT];
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++) red[warp][t] = acc[t];
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < K; k++) v += red[warp + k][t];
            acc[t] = v;
        }
    }
    if (live && lane < T) {
        float v = 0.f;
#pragma unroll
        for (int t = 0; t < NT; t++) if (t == lane) v = acc[t];
        m.out[(size_t)lane * m.n_out + r] = v + (m.bias ? m.bias[r] : 0.f);
    }
}

template <int TY, int NT, int K>
__global__ void __launch_bounds__(128) k_gemv(const mat_set S, size_t rb, int n, const float *__restrict__ x, int T)
{
    const gemv_row g = gemv_begin<K>(S, rb);
    const uint8_t *row = g.row;
    float acc[NT] = {};
    int ng = g.live ? (n + 7) / 8 : 0;
    bool vec = (n & 7) == 0;
#pragma unroll 4
    for (int u = g.lane + 32 * g.part; u < ng; u += 32 * K) {
        float w[8];
        dq8<TY>(row, u, n, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const float *xt = x + (size_t)t * n + u * 8;
            float s;
            if (vec) {
                float4 a = __ldg((const float4 *)xt), b = __ldg((const float4 *)xt + 1);
                s = __fmul_rn(w[0], a.x);
                s = __fmaf_rn(w[1], a.y, s); s = __fmaf_rn(w[2], a.z, s); s = __fmaf_rn(w[3], a.w, s);
                s = __fmaf_rn(w[4], b.x, s); s = __fmaf_rn(w[5], b.y, s); s = __fmaf_rn(w[6], b.z, s);
                s = __fmaf_rn(w[7], b.w, s);
            } else {
                s = __fmul_rn(w[0], xt[0]);
#pragma unroll
                for (int i = 1; i < 8; i++)
                    if (u * 8 + i < n) s = __fmaf_rn(w[i], xt[i], s);
            }
            acc[t] = __fadd_rn(acc[t], s);
        }
    }
    gemv_finish<NT, K>(acc, g, T, S.m[g.mi]);
}


/* ---------------- int8 GEMV (q4_K, q8_0): x quantized per 32 values ----------------
 * xq [T][n] int8, xd [T][n/32] scale, xs [T][n/32] sum of the block's ints.
 * Dot products with __dp4a, as the CPU's q8 activations (same error class). */
/* a warp per 32-value block; rows are whole blocks: n % 32 == 0 */
__global__ void k_quant_x(const float *__restrict__ x, size_t nb_total, act_forms L)
{
    pdl_begin();
    size_t b = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (b >= nb_total) return;   /* whole warps */
    quant_block(x[b * 32 + lane], lane, b, L);
}

/* Per-unit sums of the int8 GEMVs, rounded step by step (no contraction),
 * so that every kernel and tile size gives a (row, token) the same result. */
__device__ __forceinline__ float q4k_unit(float acc, float dx0, float d0, int dot0, float mm0, int s0, float dx1,
                                          float d1, int dot1, float mm1, int s1)
{
    float a = __fsub_rn(__fmul_rn(d0, (float)dot0), __fmul_rn(mm0, (float)s0));
    float b = __fsub_rn(__fmul_rn(d1, (float)dot1), __fmul_rn(mm1, (float)s1));
    return __fadd_rn(acc, __fadd_rn(__fmul_rn(dx0, a), __fmul_rn(dx1, b)));
}

__device__ __forceinline__ float q8_unit(float acc, float dw, float dx, int dot)
{
    return __fadd_rn(acc, __fmul_rn(__fmul_rn(dw, dx), (float)dot));
}

/* The exact integer dot of one 32-value unit: int8 weights (qa, qb) by int8
 * x (xa, xb), four at a time in a fixed order. */
__device__ __forceinline__ int dot32(const int (&q)[8], int4 xa, int4 xb)
{
    int dot = __dp4a(q[0], xa.x, 0);
    dot = __dp4a(q[1], xa.y, dot); dot = __dp4a(q[2], xa.z, dot); dot = __dp4a(q[3], xa.w, dot);
    dot = __dp4a(q[4], xb.x, dot); dot = __dp4a(q[5], xb.y, dot); dot = __dp4a(q[6], xb.z, dot);
    return __dp4a(q[7], xb.w, dot);
}
__device__ __forceinline__ int dot32(int4 qa, int4 qb, int4 xa, int4 xb)
{
    const int q[8] = { qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w };
    return dot32(q, xa, xb);
}

/* Unit c of a row (its weights q as int8 words, its scale dw) into the sums
 * acc[t] of the T tokens of x (int8 xq [T][n], scales xd [T][n/32]). */
template <int NT>
__device__ __forceinline__ void q8_tokens(float (&acc)[NT], const int (&q)[8], float dw, const int8_t *xq,
                                          const float *xd, int n, int c, int T)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= T) break;
        const int4 *xv = (const int4 *)(xq + (size_t)t * n + 32 * c);
        int4 xa = xv[0], xb = xv[1];
        const int dot = dot32(q, xa, xb);
        acc[t] = q8_unit(acc[t], dw, __ldg(xd + (size_t)t * (n / 32) + c), dot);
    }
}

/* Warps per row (K) of every int8 GEMV: a function of the units per row
 * only, since the lane -> unit split and the reduction depend on it. A
 * one-token GEMV's time is its loads' latency, a round per unit a lane
 * takes, so K grows early (docs/benchmarks-cuda.md). */
static inline int gemv_warps(int nu) { return nu >= 128 ? 4 : nu > 32 ? 2 : 1; }

/* q4_K: lane takes one 64-value pair of a super-block (16-byte header and
 * 32 bytes of nibbles in three 16-byte loads); x as int8. */
template <int NT, int K>
__global__ void __launch_bounds__(128) k_gemv_q4k(const mat_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                  const float *__restrict__ xd, const int *__restrict__ xs, int T)
{
    const gemv_row g = gemv_begin<K>(S, rb);
    const uint8_t *row = g.row;
    float acc[NT] = {};
    int np = g.live ? n / 64 : 0, nbx = n / 32;
#pragma unroll 2
    for (int p = g.lane + 32 * g.part; p < np; p += 32 * K) {
        const uint8_t *b = row + (p >> 2) * 144;
        int j = p & 3;
        uint4 h = *(const uint4 *)b;
        uint4 q0 = *(const uint4 *)(b + 16 + 32 * j), q1 = *(const uint4 *)(b + 32 + 32 * j);
        float d0, d1, mm0, mm1;
        q4k_scales(h, j, d0, d1, mm0, mm1);
        uint32_t qw[8] = { q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w };
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const int4 *xv = (const int4 *)(xq + (size_t)t * n + 64 * p);
            int4 xa = xv[0], xb = xv[1], xc = xv[2], xe = xv[3];
            int xl[8] = { xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w };
            int xh[8] = { xc.x, xc.y, xc.z, xc.w, xe.x, xe.y, xe.z, xe.w };
            int dot0 = 0, dot1 = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                dot0 = __dp4a((int)(qw[k] & 0x0F0F0F0Fu), xl[k], dot0);
                dot1 = __dp4a((int)((qw[k] >> 4) & 0x0F0F0F0Fu), xh[k], dot1);
            }
            size_t xb0 = (size_t)t * nbx + 2 * p;
            float dx0 = __ldg(xd + xb0), dx1 = __ldg(xd + xb0 + 1);
            int s0 = __ldg(xs + xb0), s1 = __ldg(xs + xb0 + 1);
            acc[t] = q4k_unit(acc[t], dx0, d0, dot0, mm0, s0, dx1, d1, dot1, mm1, s1);
        }
    }
    gemv_finish<NT, K>(acc, g, T, S.m[g.mi]);
}

/* q8_0 (repacked): lane takes one 32-value block: 32 quant bytes, one scale */
template <int NT, int K>
__global__ void __launch_bounds__(128) k_gemv_q8(const mat_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                 const float *__restrict__ xd, int T)
{
    const gemv_row g = gemv_begin<K>(S, rb);
    const uint8_t *row = g.row;
    bool a16 = ((uintptr_t)row & 15) == 0;
    float acc[NT] = {};
    int nb = g.live ? n / 32 : 0;
#pragma unroll 2
    for (int c = g.lane + 32 * g.part; c < nb; c += 32 * K) {
        int q[8];
        if (a16) {
            int4 u = *(const int4 *)(row + 32 * c), v = *(const int4 *)(row + 32 * c + 16);
            q[0] = u.x; q[1] = u.y; q[2] = u.z; q[3] = u.w; q[4] = v.x; q[5] = v.y; q[6] = v.z; q[7] = v.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) { int2 u = ld8(row + 32 * c + 8 * i); q[2 * i] = u.x; q[2 * i + 1] = u.y; }
        }
        float dw = h2f(row + n + 2 * c);
        q8_tokens<NT>(acc, q, dw, xq, xd, n, c, T);
    }
    gemv_finish<NT, K>(acc, g, T, S.m[g.mi]);
}

/* iq4_nl, iq4_xs, mxfp4: lane takes one 32-value block (iq4_xs: one
 * 32-value chunk of a super-block, its 6-bit scale folded into the block
 * scale as the reference dequantizer does); the nibbles become int8 levels
 * by byte permutes (iq_lookup4); x as int8; the per-block sum of k_gemv_q8. */
template <int TY, int NT, int K>
__global__ void __launch_bounds__(128) k_gemv_nl(const mat_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                 const float *__restrict__ xd, int T)
{
    const gemv_row g = gemv_begin<K>(S, rb);
    const uint8_t *row = g.row;
    float acc[NT] = {};
    int nb = g.live ? n / 32 : 0;
#pragma unroll 2
    for (int c = g.lane + 32 * g.part; c < nb; c += 32 * K) {
        int q[8];
        float dw, d1, m;
        dq32i<TY>(row, c, n, q, dw, d1, m);
        q8_tokens<NT>(acc, q, dw, xq, xd, n, c, T);
    }
    gemv_finish<NT, K>(acc, g, T, S.m[g.mi]);
}

/* per-unit sum of the q6_K GEMV: i0, i1 the exact integer dots of the
 * unit's two x blocks (their scales and -32 offsets applied) */
__device__ __forceinline__ float q6k_unit(float acc, float d, float dx0, int i0, float dx1, int i1)
{
    return __fadd_rn(acc, __fadd_rn(__fmul_rn(__fmul_rn(d, dx0), (float)i0), __fmul_rn(__fmul_rn(d, dx1), (float)i1)));
}

/* x's int8 values 64u .. 64u+63 of token t (l the first 32, h the
 * second, as words) and their two blocks' scales */
struct xunit { int l[8], h[8]; float d0, d1; };
__device__ __forceinline__ xunit x_unit64(const int8_t *xq, const float *xd, int n, int t, int u)
{
    const int4 *xv = (const int4 *)(xq + (size_t)t * n + 64 * u);
    int4 xa = __ldg(xv), xb = __ldg(xv + 1), xc = __ldg(xv + 2), xe = __ldg(xv + 3);
    xunit x;
    x.l[0] = xa.x; x.l[1] = xa.y; x.l[2] = xa.z; x.l[3] = xa.w; x.l[4] = xb.x; x.l[5] = xb.y; x.l[6] = xb.z; x.l[7] = xb.w;
    x.h[0] = xc.x; x.h[1] = xc.y; x.h[2] = xc.z; x.h[3] = xc.w; x.h[4] = xe.x; x.h[5] = xe.y; x.h[6] = xe.z; x.h[7] = xe.w;
    size_t xb0 = (size_t)t * (n / 32) + 2 * u;
    x.d0 = __ldg(xd + xb0);
    x.d1 = __ldg(xd + xb0 + 1);
    return x;
}

enum { GEMV_Q8_0 = 0, GEMV_Q4_K = 1, GEMV_Q6_K = 2 };   /* k_gemv_mr's weight kinds */

/* ---------------- int8 GEMV for decode batches (up to 16 tokens): several rows per group ----------------
 * A block of 4 warps holds 4/K groups of K warps; a group takes R rows. Each
 * thread loads its x units once per token and reuses them for the R rows, so
 * x traffic and the reduction are amortized over R rows and every thread has
 * R independent 16-byte weight loads in flight. KD (GV_*): q4_K, unit =
 * 64-value pair of a super-block (as k_gemv_q4k); q8_0 repacked, unit =
 * 32-value block; q6_K repacked, unit = 64 values (q6_word). */
/* GLU (one token, K 1, R 4; 512 threads): the set is (gate, up) of n_out
 * rows each, n_out % 32 == 0; block b takes outputs 32b .. 32b+31, warp w
 * the gate and up rows of outputs 32b+2w, +1 (each row's arithmetic is the
 * same as in any other launch), and the block writes silu(gate) * up of
 * its 32 outputs to the gate's out, with their int8 block (and f16 form)
 * by qo: the arithmetic of k_silu_mul, without its launch. */
/* ROPE (one token, R 1, K 2; the set q, k, v of a layer; rp): the rope
 * and KV store of k_rope_kv in the epilogue. A q or k block's two groups
 * take the two rows of one rope pair (neox: dims j and j + hd/2 of a
 * head, else 2j and 2j + 1, the plain mapping), so one thread holds both
 * sums; it adds the biases, ropes the pair (the table's angles, or
 * rope_cs's, read or computed before the launch wait), writes q or k, and
 * k's cache row; a v block writes v and its cache row plus bias. Every
 * value is k_gemv_mr's then k_rope_kv's (the same bits). */
template <int NT, int R, int K, int KD, int GLU, int PRE = 1, int ROPE = 0>
__global__ void __launch_bounds__(GLU ? 512 : 128) k_gemv_mr(const mat_set S, size_t rb, int n,
                                                             const int8_t *__restrict__ xq,
                                                             const float *__restrict__ xd,
                                                             const int *__restrict__ xs, int T, const act_forms qo,
                                                             const ck_qkv_rope rp)
{
    static_assert(!ROPE || (NT == 1 && R == 1 && K == 2 && !GLU), "the rope epilogue: one pair a block");
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int mi = GLU ? 0 : block_matrix(S);
    const uint8_t *W = S.m[mi].W;
    int n_out = S.m[mi].n_out;
    int row0 = GLU ? 32 * (int)blockIdx.x : ((int)blockIdx.x - S.m[mi].blk0) * (4 / K) * R;   /* the block's first row */
    if (S.pf) {
        if (GLU) {
            l2_prefetch(W + (size_t)row0 * rb, 32 * rb);
            l2_prefetch(S.m[1].W + (size_t)row0 * rb, 32 * rb);
        } else {
            l2_prefetch(W + (size_t)row0 * rb, (size_t)min(4 / K * R, n_out - row0) * rb);
        }
    }
    const uint64_t pol = wpol();
    int r0 = row0 + warp / K * R, part = warp % K;
    /* the rope's inputs: angle, biases, cache slot (none written by the
     * kernels of this pass before it: the batch block and angle table come
     * first, biases are weights) */
    float rcs = 0.f, rsn = 0.f, rbA = 0.f, rbB = 0.f;
    size_t rslot = 0;
    if constexpr (ROPE != 0) {
        const int half = rp.head_dim / 2, pr = (int)blockIdx.x - S.m[mi].blk0;
        if (mi < 2 && (rp.neox & 1)) r0 = pr / half * rp.head_dim + pr % half + (warp / K) * half;
        if (lane == 0 && part == 0) {
            const int p = rp.pos[0];
            rslot = kv_slot(rp.off, rp.pages, 0, p) * (size_t)(rp.n_head_kv * rp.head_dim);
            const float *bm = mi == 0 ? rp.bq : mi == 1 ? rp.bk : rp.bv;
            if (mi < 2 && warp == 0) {
                if (rp.tab) {
                    float2 a = ((const float2 *)rp.tab)[pr % half];
                    rcs = a.x; rsn = a.y;
                } else {
                    rope_cs(p, pr % half, rp.n_rot, rp.base, rp.fd, rp.neox, rcs, rsn);
                }
                if (bm) { rbA = bm[r0]; rbB = bm[(rp.neox & 1) ? r0 + half : r0 + 1]; }
            } else if (mi == 2 && bm) {
                rbA = bm[min(r0, S.m[mi].n_out - 1)];
            }
        }
    }
    const uint8_t *rows[R];
    if (GLU) {
        r0 = row0 + 2 * warp;
#pragma unroll
        for (int r = 0; r < R; r++) rows[r] = (r < 2 ? W : S.m[1].W) + (size_t)(r0 + (r & 1)) * rb;
    } else {
#pragma unroll
        for (int r = 0; r < R; r++) rows[r] = W + (size_t)min(r0 + r, n_out - 1) * rb;
    }
    const bool Q4K = KD == GEMV_Q4_K;
    int nu = KD == GEMV_Q8_0 ? n / 32 : n / 64, nbx = n / 32;
    /* the weights of a lane's unit u for the R rows (never written: q8_0's
     * first unit is loaded before the launch wait, off the path that waits
     * for x) */
    auto ld_q4k = [&](int u, uint4 (&h)[R], uint4 (&q0)[R], uint4 (&q1)[R]) {
        const int j = u & 3;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *b = rows[r] + (u >> 2) * 144;
            h[r] = wld16(b, pol);
            q0[r] = wld16(b + 16 + 32 * j, pol);
            q1[r] = wld16(b + 32 + 32 * j, pol);
        }
    };
    auto ld_q8 = [&](int u, int (&q)[R][8], float (&dw)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *p = rows[r] + 32 * u;
            if (((uintptr_t)rows[r] & 15) == 0) {
                uint4 a = wld16(p, pol), c = wld16(p + 16, pol);
                q[r][0] = a.x; q[r][1] = a.y; q[r][2] = a.z; q[r][3] = a.w;
                q[r][4] = c.x; q[r][5] = c.y; q[r][6] = c.z; q[r][7] = c.w;
            } else if (((uintptr_t)rows[r] & 7) == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) { uint2 v = wld8(p + 8 * i, pol); q[r][2 * i] = v.x; q[r][2 * i + 1] = v.y; }
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) { int2 v = ld8(p + 8 * i); q[r][2 * i] = v.x; q[r][2 * i + 1] = v.y; }
            }
            dw[r] = __half2float(__ushort_as_half(wld2(rows[r] + n + 2 * u, pol)));
        }
    };
    /* q8_0: a unit's dot products for the R rows and every token */
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    auto dot_q8 = [&](int u, const int (&q)[R][8], const float (&dw)[R]) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const int4 *xv = (const int4 *)(xq + (size_t)t * n + 32 * u);
            int4 xa = __ldg(xv), xb = __ldg(xv + 1);
            float dx = __ldg(xd + (size_t)t * nbx + u);
#pragma unroll
            for (int r = 0; r < R; r++) {
                acc[r][t] = q8_unit(acc[r][t], dw[r], dx, dot32(q[r], xa, xb));
            }
        }
    };
    /* q8_0: a lane's first PRE units are loaded before the wait (off the
     * path that waits for x), then used in order (the same sums): two or
     * more in a loop of their own ahead of the main loop, one by the main
     * loop's first trip; for q4_K the registers held across the wait cost
     * more than they gain (docs/benchmarks-cuda.md) */
    const int u0 = lane + 32 * part;
    constexpr int PQ = KD == GEMV_Q8_0 ? PRE : 1;
    int pq[PQ][R][8];
    float pdw[PQ][R];
    if constexpr (KD == GEMV_Q8_0) {
#pragma unroll
        for (int i = 0; i < PQ; i++)
            if (u0 + 32 * K * i < nu) ld_q8(u0 + 32 * K * i, pq[i], pdw[i]);
    }
    pdl_begin();
    int u = u0;
    if constexpr (KD == GEMV_Q8_0 && PQ > 1) {
#pragma unroll
        for (int i = 0; i < PQ; i++, u += 32 * K)
            if (u < nu) dot_q8(u, pq[i], pdw[i]);
    }
    for (; u < nu; u += 32 * K) {
        if (KD == GEMV_Q6_K) {
            /* 14 aligned words per row (8 QL, 4 QH, the scales, d's half); the
             * -32 offset as 32 times x's sum per 16 values (once per token) */
            uint32_t ql[R][8], qh[R][4], sw[R];
            float dd[R];
            int oq[8], oh[4];
#pragma unroll
            for (int k = 0; k < 8; k++) oq[k] = q6_word(nu, u, k, 8);
#pragma unroll
            for (int k = 0; k < 4; k++) oh[k] = n / 2 + q6_word(nu, u, k, 4);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) ql[r][k] = wld4(rows[r] + oq[k], pol);
#pragma unroll
                for (int k = 0; k < 4; k++) qh[r][k] = wld4(rows[r] + oh[k], pol);
                sw[r] = wld4(rows[r] + 3 * (n / 4) + 4 * u, pol);
                dd[r] = __half2float(__ushort_as_half(wld2(rows[r] + 13 * (n / 16) + 2 * (u >> 2), pol)));
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= T) break;
                const xunit x = x_unit64(xq, xd, n, t, u);
                int s16[4] = { 0, 0, 0, 0 };
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    s16[k >> 2] = __dp4a(x.l[k], 0x01010101, s16[k >> 2]);
                    s16[2 + (k >> 2)] = __dp4a(x.h[k], 0x01010101, s16[2 + (k >> 2)]);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int a[4] = { 0, 0, 0, 0 };
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        uint32_t hb = qh[r][k >> 1] >> (4 * (k & 1));
                        int lo = (int)((ql[r][k] & 0x0F0F0F0Fu) | ((hb & 0x03030303u) << 4));
                        int hi = (int)(((ql[r][k] >> 4) & 0x0F0F0F0Fu) | (((hb >> 2) & 0x03030303u) << 4));
                        a[k >> 2] = __dp4a(lo, x.l[k], a[k >> 2]);
                        a[2 + (k >> 2)] = __dp4a(hi, x.h[k], a[2 + (k >> 2)]);
                    }
                    int s = (int)sw[r];
                    int i0 = (int)(int8_t)s * (a[0] - 32 * s16[0]) + (int)(int8_t)(s >> 8) * (a[1] - 32 * s16[1]);
                    int i1 = (int)(int8_t)(s >> 16) * (a[2] - 32 * s16[2]) + (int)(int8_t)(s >> 24) * (a[3] - 32 * s16[3]);
                    acc[r][t] = q6k_unit(acc[r][t], dd[r], x.d0, i0, x.d1, i1);
                }
            }
        } else if (Q4K && NT <= 2) {
            /* one or two tokens: x loaded with the weights, before any of them is used */
            const int j = u & 3;
            uint4 h[R], q0[R], q1[R];
            ld_q4k(u, h, q0, q1);
            xunit x[NT];
            int s0[NT], s1[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                x[t] = x_unit64(xq, xd, n, t, u);
                size_t xb0 = (size_t)t * nbx + 2 * u;
                s0[t] = __ldg(xs + xb0); s1[t] = __ldg(xs + xb0 + 1);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float d0, d1, mm0, mm1;
                q4k_scales(h[r], j, d0, d1, mm0, mm1);
                uint32_t qw[8] = { q0[r].x, q0[r].y, q0[r].z, q0[r].w, q1[r].x, q1[r].y, q1[r].z, q1[r].w };
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int dot0 = 0, dot1 = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        dot0 = __dp4a((int)(qw[k] & 0x0F0F0F0Fu), x[t].l[k], dot0);
                        dot1 = __dp4a((int)((qw[k] >> 4) & 0x0F0F0F0Fu), x[t].h[k], dot1);
                    }
                    acc[r][t] = q4k_unit(acc[r][t], x[t].d0, d0, dot0, mm0, s0[t], x[t].d1, d1, dot1, mm1, s1[t]);
                }
            }
        } else if (Q4K) {
            const int j = u & 3;
            float d0[R], d1[R], mm0[R], mm1[R];
            uint32_t qw[R][8];
            uint4 h[R], q0[R], q1[R];
            ld_q4k(u, h, q0, q1);
#pragma unroll
            for (int r = 0; r < R; r++) {
                q4k_scales(h[r], j, d0[r], d1[r], mm0[r], mm1[r]);
                qw[r][0] = q0[r].x; qw[r][1] = q0[r].y; qw[r][2] = q0[r].z; qw[r][3] = q0[r].w;
                qw[r][4] = q1[r].x; qw[r][5] = q1[r].y; qw[r][6] = q1[r].z; qw[r][7] = q1[r].w;
            }
            /* token by token: x is loaded once per unit and used for the R rows */
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= T) break;
                const xunit x = x_unit64(xq, xd, n, t, u);
                size_t xb0 = (size_t)t * nbx + 2 * u;
                int s0 = __ldg(xs + xb0), s1 = __ldg(xs + xb0 + 1);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int dot0 = 0, dot1 = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        dot0 = __dp4a((int)(qw[r][k] & 0x0F0F0F0Fu), x.l[k], dot0);
                        dot1 = __dp4a((int)((qw[r][k] >> 4) & 0x0F0F0F0Fu), x.h[k], dot1);
                    }
                    acc[r][t] = q4k_unit(acc[r][t], x.d0, d0[r], dot0, mm0[r], s0, x.d1, d1[r], dot1, mm1[r], s1);
                }
            }
        } else {
            int q[R][8];
            float dw[R];
            if (PQ == 1 && u == u0) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    dw[r] = pdw[0][r];
#pragma unroll
                    for (int k = 0; k < 8; k++) q[r][k] = pq[0][r][k];
                }
            } else {
                ld_q8(u, q, dw);
            }
            dot_q8(u, q, dw);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = acc[r][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            acc[r][t] = s;
        }
    /* (after the butterfly every lane holds every sum; lane l writes the
     * values l, l+32, ... of the R*NT) */
    const float *bias = S.m[mi].bias;
    float *out = S.m[mi].out;
    if constexpr (GLU) {
        __shared__ float hs[32];
        const float *bu = S.m[1].bias;
        if (lane < 2) {
            int r = r0 + lane;
            float g = (lane ? acc[1][0] : acc[0][0]) + (bias ? bias[r] : 0.f);
            float u = (lane ? acc[3][0] : acc[2][0]) + (bu ? bu[r] : 0.f);
            hs[2 * warp + lane] = silu_mul1(g, u);
        }
        __syncthreads();
        if (warp == 0) {
            float v = hs[lane];
            out[row0 + lane] = v;
            if (qo.q) quant_block(v, lane, (size_t)blockIdx.x, qo);
            if (qo.h) qo.h[row0 + lane] = f2h_sat(v);
        }
        return;
    }
    if (K > 1) {
        __shared__ float red[4][R * NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) if ((r * NT + t) % 32 == lane) red[warp][r * NT + t] = acc[r][t];
        __syncthreads();
        if (part != 0) return;
        if constexpr (ROPE != 0) {
            if (lane != 0) return;
            /* each row's sum as below (no bias there: + 0), then k_rope_kv's steps */
            float a = 0.f, c = 0.f;
#pragma unroll
            for (int k = 0; k < K; k++) a += red[warp + k][0];
            a = __fadd_rn(a, 0.f);
            if (mi == 2) {
                if (r0 < n_out) {
                    out[r0] = a;
                    kv_put(rp.vc, rp.f16, rslot + r0, rp.bv ? __fadd_rn(a, rbA) : a);
                }
                return;
            }
            if (warp != 0) return;
#pragma unroll
            for (int k = 0; k < K; k++) c += red[K + k][0];
            c = __fadd_rn(c, 0.f);
            const float *bm = mi == 0 ? rp.bq : rp.bk;
            if (bm) { a = __fadd_rn(a, rbA); c = __fadd_rn(c, rbB); }
            const int rB = (rp.neox & 1) ? r0 + rp.head_dim / 2 : r0 + 1;
            float o0 = __fsub_rn(__fmul_rn(a, rcs), __fmul_rn(c, rsn));
            float o1 = __fadd_rn(__fmul_rn(a, rsn), __fmul_rn(c, rcs));
            out[r0] = o0;
            out[rB] = o1;
            if (mi == 1) {
                kv_put(rp.kc, rp.f16, rslot + r0, o0);
                kv_put(rp.kc, rp.f16, rslot + rB, o1);
            }
        } else {
            for (int i = lane; i < R * NT; i += 32) {
                float v = 0.f;
#pragma unroll
                for (int k = 0; k < K; k++) v += red[warp + k][i];
                int r = r0 + i / NT, t = i % NT;
                if (r < n_out && t < T) out[(size_t)t * n_out + r] = v + (bias ? bias[r] : 0.f);
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                if ((r * NT + t) % 32 == lane && r0 + r < n_out && t < T)
                    out[(size_t)t * n_out + r0 + r] = acc[r][t] + (bias ? bias[r0 + r] : 0.f);
    }
}

/* ---------------- one-token q8_0 GEMV of long rows by bulk copies ----------------
 * k_gemv_mr's one-token launch for rows of four warps (K 4, R 1: a block a
 * row; the 7b down projection's 592 units), with the row's bytes (quants,
 * then scales) brought into shared memory by one bulk copy that the block
 * issues before the launch wait, and x of all of a lane's units (at most
 * BULK_UNITS) loaded at once after it. A lane's units, their order, the dot
 * products and the reduction are k_gemv_mr's, so every sum is the same;
 * only the loads differ: a block has its whole row in flight at once
 * instead of two units a lane ahead, so the launch's last, partial wave
 * still fills the memory pipe. Needs rb % 16 == 0 (n % 256 == 0). */
#define BULK_UNITS 5
/* (sm_90 PTX: code for older devices has them empty and never runs
 * k_gemv_q8bulk, gemv_bulk says so) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define CK_NO_BULK 1
#endif
__device__ __forceinline__ void mbar_init(uint64_t *mb, unsigned count)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(mb);
#ifndef CK_NO_BULK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    (void)a; (void)count;
#endif
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *mb, uint64_t pol)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst), m = (unsigned)__cvta_generic_to_shared(mb);
#ifndef CK_NO_BULK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(d), "l"(src), "r"(bytes), "r"(m), "l"(pol) : "memory");
#else
    (void)d; (void)src; (void)bytes; (void)m; (void)pol;
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *mb, unsigned bytes)
{
    unsigned m = (unsigned)__cvta_generic_to_shared(mb);
#ifndef CK_NO_BULK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(m), "r"(bytes) : "memory");
#else
    (void)m; (void)bytes;
#endif
}
__device__ __forceinline__ void mbar_wait0(uint64_t *mb)   /* phase 0 */
{
    unsigned m = (unsigned)__cvta_generic_to_shared(mb);
#ifndef CK_NO_BULK
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(m) : "memory");
#else
    (void)m;
#endif
}

__global__ void __launch_bounds__(128) k_gemv_q8bulk(const mat_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                    const float *__restrict__ xd)
{
    extern __shared__ __align__(16) uint8_t wrow[];
    __shared__ uint64_t mb;
    __shared__ float red[4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int mi = block_matrix(S);
    const int r = (int)blockIdx.x - S.m[mi].blk0;
    if (threadIdx.x == 0) {
        mbar_init(&mb, 1);
        mbar_expect_tx(&mb, (unsigned)rb);
        bulk_g2s(wrow, S.m[mi].W + (size_t)r * rb, (unsigned)rb, &mb, wpol());
    }
    __syncthreads();   /* (the barrier's init, for the other threads' waits) */
    pdl_begin();
    const int nu = n / 32, u0 = lane + 32 * warp;
    int4 xa[BULK_UNITS], xb[BULK_UNITS];
    float dx[BULK_UNITS];
#pragma unroll
    for (int i = 0; i < BULK_UNITS; i++) {   /* x while the row arrives */
        const int u = u0 + 128 * i;
        if (u < nu) {
            const int4 *xv = (const int4 *)(xq + 32 * u);
            xa[i] = __ldg(xv); xb[i] = __ldg(xv + 1);
            dx[i] = __ldg(xd + u);
        }
    }
    mbar_wait0(&mb);
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < BULK_UNITS; i++) {
        const int u = u0 + 128 * i;
        if (u >= nu) break;
        const int4 qa = *(const int4 *)(wrow + 32 * u), qb = *(const int4 *)(wrow + 32 * u + 16);
        const float dw = __half2float(*(const __half *)(wrow + n + 2 * u));
        acc = q8_unit(acc, dw, dx[i], dot32(qa, qb, xa[i], xb[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.f;   /* (k_gemv_mr's K > 1 sum) */
#pragma unroll
        for (int k = 0; k < 4; k++) v += red[k];
        const float *bias = S.m[mi].bias;
        S.m[mi].out[r] = v + (bias ? bias[r] : 0.f);
    }
}

/* The launch of the one-row-a-group GEMVs (k_gemv, k_gemv_q4k, k_gemv_q8,
 * k_gemv_nl): K warps a row, 4/K rows a block, each matrix's first block
 * set in S; f(k, nt, g) launches the kernel of K k and token tile nt (the
 * least of 1, 2, 4, 8, 16 that holds T) on g blocks. */
template <int K, class F>
static void gemv_shape_k(mat_set &S, int T, F f)
{
    using k = std::integral_constant<int, K>;
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, 4 / K); }
    switch (T) {
    case 1: f(k(), std::integral_constant<int, 1>(), g); break;
    case 2: f(k(), std::integral_constant<int, 2>(), g); break;
    case 3: case 4: f(k(), std::integral_constant<int, 4>(), g); break;
    case 5: case 6: case 7: case 8: f(k(), std::integral_constant<int, 8>(), g); break;
    default: f(k(), std::integral_constant<int, 16>(), g); break;
    }
}

template <class F>
static void gemv_shape(mat_set &S, int K, int T, F f)
{
    if (K == 4) gemv_shape_k<4>(S, T, f);
    else if (K == 2) gemv_shape_k<2>(S, T, f);
    else gemv_shape_k<1>(S, T, f);
}

template <int TY>
static void gemv_nlt(cudaStream_t st, mat_set S, size_t rb, int n, const int8_t *xq, const float *xd, int T)
{
    gemv_shape(S, gemv_warps(n / 32), T, [&](auto k, auto nt, unsigned g) {
        lk(k_gemv_nl<TY, decltype(nt)::value, decltype(k)::value>, g, 128, 0, st, S, rb, n, xq, xd, T);
    });
}

/* the 4-bit level types with an int8 GEMV (k_gemv_nl) */
static inline bool gemv_nl_type(uint32_t type, int n)
{
    return ((type == QT_IQ4_NL || type == QT_MXFP4) && n % 32 == 0) || (type == QT_IQ4_XS && n % 256 == 0);
}

static void gemv_q8t(cudaStream_t st, mat_set S, size_t rb, int n, const int8_t *xq, const float *xd, int T)
{
    gemv_shape(S, gemv_warps(n / 32), T, [&](auto k, auto nt, unsigned g) {
        lk(k_gemv_q8<decltype(nt)::value, decltype(k)::value>, g, 128, 0, st, S, rb, n, xq, xd, T);
    });
}

static void gemv_qt(cudaStream_t st, mat_set S, size_t rb, int n, const int8_t *xq, const float *xd, const int *xs,
                    int T)
{
    gemv_shape(S, gemv_warps(n / 64), T, [&](auto k, auto nt, unsigned g) {
        lk(k_gemv_q4k<decltype(nt)::value, decltype(k)::value>, g, 128, 0, st, S, rb, n, xq, xd, xs, T);
    });
}

/* Batches of 3..16 tokens: R rows per group for rows of 2048 values and
 * more, where re-reading x per row costs most (7b 1.3-1.5x), one row per
 * warp (k_gemv_q4k, k_gemv_q8) for shorter rows (0.5b 8% faster). Both give
 * the same bits. */
static int gemv_bt(int n)
{
    return n >= 2048;
}

/* decode: rows per group R, K warps per group by the units per row */
template <int NT, int R, int KD, int PRE = 1>
static void gemv_mr_k(cudaStream_t st, mat_set S, size_t rb, int n, const int8_t *xq, const float *xd, const int *xs,
                      int T)
{
    int K = gemv_warps(KD == GEMV_Q8_0 ? n / 32 : n / 64);
    unsigned g = 0;
    size_t bytes = 0;
    for (int i = 0; i < S.nm; i++) {
        S.m[i].blk0 = (int)g;
        g += nblk(S.m[i].n_out, (unsigned)(4 / K * R));
        bytes += (size_t)S.m[i].n_out * rb;
    }
    S.pf = gemv_prefetches(bytes);
    act_forms none;
    memset(&none, 0, sizeof none);
    ck_qkv_rope nr;
    memset(&nr, 0, sizeof nr);
    if (K == 4) lk(k_gemv_mr<NT, R, 4, KD, 0, PRE>, g, 128, 0, st, S, rb, n, xq, xd, xs, T, none, nr);
    else if (K == 2) lk(k_gemv_mr<NT, R, 2, KD, 0, PRE>, g, 128, 0, st, S, rb, n, xq, xd, xs, T, none, nr);
    else lk(k_gemv_mr<NT, R, 1, KD, 0, PRE>, g, 128, 0, st, S, rb, n, xq, xd, xs, T, none, nr);
}

/* One-token q8_0 rows of four warps by k_gemv_q8bulk (the same sums):
 * rows of up to BULK_UNITS units a lane, in whole 16-byte pieces, on
 * devices running code for 9.0 and later (ck_feat.bulk). */
static int gemv_bulk(int n, size_t rb)
{
    return ck_feat_now()->bulk && n % 32 == 0 && gemv_warps(n / 32) == 4 && n / 32 <= 128 * BULK_UNITS &&
           rb % 16 == 0;
}

static void gemv_q8bulk(cudaStream_t st, mat_set S, size_t rb, int n, const int8_t *xq, const float *xd)
{
    static unsigned carve = 0;
    if (ck_first_on_device(&carve)) {   /* as many rows in flight per SM as shared memory holds */
        cudaFuncSetAttribute(k_gemv_q8bulk, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    }
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += (unsigned)S.m[i].n_out; }
    lk(k_gemv_q8bulk, g, 128, rb, st, S, rb, n, xq, xd);
}

/* One-token q8_0 sets of rows of two warps whose launch at a row per
 * group would leave a second wave of at most a quarter of the first (a
 * 7b's o projection: 1,792 blocks on 1,584 places) take two rows a group
 * (the same sums; one wave). */
static int gemv_r2(const mat_set &S, int n)
{
    static int on = -1, slots = 0;
    if (on < 0) {
        on = 1;
        int dev = 0, sm = 0, per = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, dev) ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_gemv_mr<1, 1, 2, GEMV_Q8_0, 0, 2>, 128, 0) != cudaSuccess)
            on = 0;
        slots = sm * per;
    }
    if (!on || gemv_warps(n / 32) != 2 || slots <= 0) return 0;
    long blocks = 0;
    for (int i = 0; i < S.nm; i++) blocks += (S.m[i].n_out + 1) / 2;
    return blocks > slots && blocks - slots <= slots / 4;
}

template <int KD>
static void gemv_mr_q(cudaStream_t st, const mat_set &S, size_t rb, int n, const int8_t *xq, const float *xd,
                      const int *xs, int T)
{
    /* one token: rows of 2048 values and more (a 7b's) at 1 row per group
     * for q8_0 (two units a lane loaded before the launch wait; a down
     * projection's rows of four warps by bulk copies), 2 for the K-quants;
     * shorter ones (a 0.5b's, launch-bound) 4 (docs/benchmarks-cuda.md) */
    if (T > 8) gemv_mr_k<16, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (T > 4) gemv_mr_k<8, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (T > 2) gemv_mr_k<4, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (T == 2) gemv_mr_k<2, 2, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (n < 2048) gemv_mr_k<1, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if constexpr (KD != GEMV_Q8_0) gemv_mr_k<1, 2, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (gemv_bulk(n, rb)) gemv_q8bulk(st, S, rb, n, xq, xd);
    else if (gemv_r2(S, n)) gemv_mr_k<1, 2, KD, 2>(st, S, rb, n, xq, xd, xs, T);
    else gemv_mr_k<1, 1, KD, 2>(st, S, rb, n, xq, xd, xs, T);
}

static void gemv_mr(cudaStream_t st, const mat_set &S, uint32_t type, size_t rb, int n, const int8_t *xq,
                    const float *xd, const int *xs, int T)
{
    if (type == QT_Q4_K) gemv_mr_q<GEMV_Q4_K>(st, S, rb, n, xq, xd, xs, T);
    else if (type == QT_Q6_K) gemv_mr_q<GEMV_Q6_K>(st, S, rb, n, xq, xd, xs, T);
    else gemv_mr_q<GEMV_Q8_0>(st, S, rb, n, xq, xd, xs, T);
}

template <int TY>
static void gemv_t(cudaStream_t st, mat_set S, size_t rb, int n, const float *x, int T)
{
    gemv_shape(S, n >= 4096 ? 4 : n >= 1024 ? 2 : 1, T, [&](auto k, auto nt, unsigned g) {
        lk(k_gemv<TY, decltype(nt)::value, decltype(k)::value>, g, 128, 0, st, S, rb, n, x, T);
    });
}

extern "C" {

void ck_quant_x(cudaStream_t st, const float *x, int rows, int n, void *xq)
{
    size_t nbt = (size_t)rows * (n / 32);
    lk(k_quant_x, nblk(nbt * 32, 128), 128, 0, st, x, nbt, act_int8_at(xq, rows, n));
}

int ck_gemv_int8(uint32_t type, int n_in)
{
    /* (q6_K: rows of an even number of super-blocks are 4-byte aligned) */
    return (type == QT_Q4_K && n_in % 256 == 0) || (type == QT_Q8_0 && n_in % 32 == 0) ||
           (type == QT_Q6_K && n_in % 512 == 0) || gemv_nl_type(type, n_in);
}

/* x [T][n] already quantized into xq_scratch (pre) or not yet */
static void gemv_multi(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n,
                       const int *n_out, const float *const *bias, const float *x, int T, float *const *out,
                       void *xq_scratch, bool pre)
{
    if (xq_scratch && ck_gemv_int8(type, n)) {
        act_forms L = act_int8_at(xq_scratch, T, n);
        if (!pre) ck_quant_x(st, x, T, n, xq_scratch);
        int8_t *xq = L.q;
        float *xd = L.d;
        int *xs = L.s;
        for (int t0 = 0; t0 < T; t0 += CK_GEMV_MAX_T) {
            int tn = T - t0 < CK_GEMV_MAX_T ? T - t0 : CK_GEMV_MAX_T;
            mat_set S = mat_set_fill(nm, W, n_out, bias, out, t0);
            const int8_t *q = xq + (size_t)t0 * n;
            const float *d = xd + (size_t)t0 * (n / 32);
            const int *sx = xs + (size_t)t0 * (n / 32);
            /* (q6_K: the R-row kernel only; the 4-bit level types: k_gemv_nl) */
            if (type == QT_IQ4_NL) gemv_nlt<QT_IQ4_NL>(st, S, rb, n, q, d, tn);
            else if (type == QT_IQ4_XS) gemv_nlt<QT_IQ4_XS>(st, S, rb, n, q, d, tn);
            else if (type == QT_MXFP4) gemv_nlt<QT_MXFP4>(st, S, rb, n, q, d, tn);
            else if (type == QT_Q6_K || tn <= 2 || gemv_bt(n)) gemv_mr(st, S, type, rb, n, q, d, sx, tn);
            else if (type == QT_Q8_0) gemv_q8t(st, S, rb, n, q, d, tn);
            else gemv_qt(st, S, rb, n, q, d, sx, tn);
        }
        return;
    }
    for (int t0 = 0; t0 < T; t0 += CK_GEMV_MAX_T) {
        int tn = T - t0 < CK_GEMV_MAX_T ? T - t0 : CK_GEMV_MAX_T;
        mat_set S = mat_set_fill(nm, W, n_out, bias, out, t0);
        const float *xt = x + (size_t)t0 * n;
#define L_GEMV(TY) gemv_t<TY>(st, S, rb, n, xt, tn)
        TYPE_SWITCH(type, L_GEMV)
    }
}

void ck_gemv_multi(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n,
                   const int *n_out, const float *const *bias, const float *x, int T, float *const *out,
                   void *xq_scratch)
{
    gemv_multi(st, type, nm, W, rb, n, n_out, bias, x, T, out, xq_scratch, false);
}

int ck_gemv_qkv_rope_try(cudaStream_t st, uint32_t type, const void *const *W, size_t rb, int n, const int *n_out,
                     const void *xq, float *const *out, const ck_qkv_rope *r)
{
    /* the one-token launch gemv_mr_q makes for these rows (R 1, K 2, two
     * preloaded units), so the sums are its; a pair a block */
    if (type != QT_Q8_0 || n < 2048 || n % 32 || gemv_warps(n / 32) != 2) return 0;
    if (r->n_rot != r->head_dim || r->head_dim % 2 || n_out[1] != n_out[2] || n_out[1] != r->n_head_kv * r->head_dim ||
        n_out[0] % r->head_dim)
        return 0;
    const float *nob[3] = { NULL, NULL, NULL };
    mat_set S = mat_set_fill(3, W, n_out, nob, out, 0);
    unsigned g = 0;
    for (int i = 0; i < 3; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, 2); }
    S.pf = 0;
    act_forms L = act_int8_at((void *)xq, 1, n), none;
    memset(&none, 0, sizeof none);
    lk(k_gemv_mr<1, 1, 2, GEMV_Q8_0, 0, 2, 1>, g, 128, 0, st, S, rb, n, L.q, L.d, L.s, 1, none, *r);
    return 1;
}

void ck_gemv_multi_q(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n,
                     const int *n_out, const float *const *bias, int T, float *const *out, void *xq)
{
    if (ck_gemv_int8(type, n)) gemv_multi(st, type, nm, W, rb, n, n_out, bias, NULL, T, out, xq, true);
}

/* Blocks of the GLU kernel resident per SM (its registers decide) */
static int glu_per_sm(uint32_t type)
{
    static int per[3] = { -1, -1, -1 };
    int i = type == QT_Q4_K ? 1 : type == QT_Q6_K ? 2 : 0;
    if (per[i] < 0) {
        int nb = 0;
        cudaError_t e = i == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_gemv_mr<1, 4, 1, GEMV_Q4_K, 1>, 512, 0)
                      : i == 2 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_gemv_mr<1, 4, 1, GEMV_Q6_K, 1>, 512, 0)
                               : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_gemv_mr<1, 4, 1, GEMV_Q8_0, 1>, 512, 0);
        per[i] = e == cudaSuccess ? nb : 0;
    }
    return per[i];
}

/* One token, one warp per row (K 1), and a launch that fits in one wave:
 * its 512-thread blocks, 32 outputs each, are 4x coarser than the GEMV's,
 * and a second wave of them costs more than the launch saves. */
int ck_glu_ok(uint32_t type, int n_in, int n_out, int T, int n_sm)
{
    if (T != 1 || !ck_gemv_int8(type, n_in) || gemv_nl_type(type, n_in) || n_out % 32) return 0;
    if (gemv_warps(type == QT_Q8_0 ? n_in / 32 : n_in / 64) != 1) return 0;
    return n_out / 32 <= glu_per_sm(type) * n_sm;
}

int ck_small_set(size_t bytes) { return gemv_prefetches(bytes); }

void ck_gemv_glu(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int n_out,
                 const void *xq, float *out, void *xq_next, void *x16_next)
{
    const void *W[2] = { Wg, Wu };
    const int no[2] = { n_out, n_out };
    const float *bias[2] = { NULL, NULL };
    float *outs[2] = { out, out };
    mat_set S = mat_set_fill(2, W, no, bias, outs, 0);
    S.pf = gemv_prefetches((size_t)2 * n_out * rb);
    act_forms L = act_int8_at((void *)xq, 1, n), O = act_forms_for(xq_next, x16_next, 1, n_out);
    unsigned g = (unsigned)(n_out / 32);
    ck_qkv_rope nr;
    memset(&nr, 0, sizeof nr);
    if (type == QT_Q4_K) lk(k_gemv_mr<1, 4, 1, GEMV_Q4_K, 1>, g, 512, 0, st, S, rb, n, L.q, L.d, L.s, 1, O, nr);
    else if (type == QT_Q6_K) lk(k_gemv_mr<1, 4, 1, GEMV_Q6_K, 1>, g, 512, 0, st, S, rb, n, L.q, L.d, L.s, 1, O, nr);
    else lk(k_gemv_mr<1, 4, 1, GEMV_Q8_0, 1>, g, 512, 0, st, S, rb, n, L.q, L.d, L.s, 1, O, nr);
}

void ck_gemv(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int n_out, const float *bias,
             const float *x, int T, float *out, void *xq_scratch)
{
    ck_gemv_multi(st, type, 1, &W, rb, n, &n_out, &bias, x, T, &out, xq_scratch);
}

}  /* extern "C" */
