// common.cuh — what the kernels of shaders/*.cu share: the weight formats'
// loads and decoders, the matrix sets of the GEMV and batched kernels, the
// int8 form of activations and its quantizer, the rope and KV-cache
// helpers, the cp.async and tensor-core wrappers, and the launch helpers.
#pragma once

#include "shaders/kernels.h"

extern "C" {
#include "engine/quant/qtypes.h"   /* the weight type ids (QT_*) */
}

#include <cuda_fp16.h>
#include "shaders/launch.cuh"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

__device__ __forceinline__ float h2f(const uint8_t *p)
{
    unsigned short u = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(u));
}

/* A 16-bit weight (QT_F16 or QT_BF16) as float */
template <int TY> __device__ __forceinline__ float w16_to_f(unsigned short u)
{
    return TY == QT_F16 ? __half2float(__ushort_as_half(u)) : __uint_as_float((uint32_t)u << 16);
}

/* A warp's per-lane sum met by the fixed butterfly (every lane gets it) */
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* f32 -> f16 for the GEMMs' inputs, saturated at the f16 range (one
 * expression for every kernel that writes an f16 copy of an activation) */
__device__ __forceinline__ __half f2h_sat(float v)
{
    return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f));
}

__device__ __forceinline__ uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

__device__ __forceinline__ uint32_t ld32a2(const uint8_t *p)   /* 2-byte aligned */
{
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

__device__ __forceinline__ int2 ld8(const uint8_t *p)   /* 2-byte aligned at least */
{
    if (((uintptr_t)p & 7) == 0) return *(const int2 *)p;
    return make_int2((int)ld32a2(p), (int)ld32a2(p + 4));
}

/* Weight loads of the decode GEMVs: each byte is read once per token, so
 * marked first to leave L2 (and not kept in L1). A token streams gigabytes
 * of weights through the 50 MB L2; without the hint they push out what the
 * small kernels between the GEMVs reuse: their code, the activations, the
 * KV rows. */
__device__ __forceinline__ uint64_t wpol()   /* the L2 policy of weight loads */
{
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
#define WLD "ld.global.nc.L1::no_allocate.L2::cache_hint"
__device__ __forceinline__ uint4 wld16(const void *p, uint64_t pol)
{
    uint4 v;
    asm(WLD ".v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ uint2 wld8(const void *p, uint64_t pol)
{
    uint2 v;
    asm(WLD ".v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ uint32_t wld4(const void *p, uint64_t pol)
{
    uint32_t v;
    asm(WLD ".u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ unsigned short wld2(const void *p, uint64_t pol)
{
    unsigned short v;
    asm(WLD ".u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(pol));
    return v;
}

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int &d, int &m)
{
    if (j < 4) {
        d = q[j] & 63; m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* q4_K / q5_K: chunk c's 32-value sub-block of super-block b: its pair g
 * of sub-blocks, which nibble (hi), its scale d1 and min m1. */
__device__ __forceinline__ void k4_sub(const uint8_t *b, int c, int &g, int &hi, float &d1, float &m1)
{
    const int sub = c & 7;
    g = sub >> 1;
    hi = sub & 1;
    float d = h2f(b), mn = h2f(b + 2);
    int sc, m;
    scale_min_k4(sub, b + 4, sc, m);
    d1 = d * (float)sc;
    m1 = mn * (float)m;
}

/* q6_K lives on the device repacked at upload (k_repack_q6_K; same bytes
 * per row) so that the int8 GEMV reads it in aligned words. A row of n
 * values is nu = n/64 units of 64 values: QL [n/2] (8 words per unit), QH
 * [n/4] (4 words per unit), SC [n/16] (a unit's 4 sub-block scales, one
 * word), D [n/256] (f16 per super-block). QL and QH words are interleaved
 * over groups of 32 units (word w of the group's units side by side), so
 * lanes on consecutive units read one contiguous piece per word. In unit u
 * (values 64u..): QL word w byte j has value 4w+j in its low nibble and
 * 32+4w+j in its high one; QH word k byte j holds the top two bits of values
 * 8k+j, 32+8k+j, 8k+4+j, 32+8k+4+j (bits 0-1, 2-3, 4-5, 6-7); SC byte s
 * scales values 16s..16s+15. */
__device__ __forceinline__ int q6_word(int nu, int u, int w, int wpu)   /* byte offset of word w in QL / QH */
{
    int g0 = u & ~31, gs = min(32, nu - g0);
    return (g0 * wpu + w * gs + (u - g0)) * 4;
}

/* value l (0..31) of half hh of a unit: 6-bit q from its QL word l / 4 and QH word l / 8 */
__device__ __forceinline__ int q6_bits(uint32_t qlw, uint32_t qhw, int hh, int l)
{
    int w = l >> 2, j = l & 3;
    return (int)(((qlw >> (8 * j + 4 * hh)) & 0xF) | (((qhw >> (8 * j + 4 * (w & 1) + 2 * hh)) & 3) << 4));
}
/* ... from all of the unit's words */
__device__ __forceinline__ int q6_val(const uint32_t (&ql)[8], const uint32_t (&qh)[4], int hh, int l)
{
    return q6_bits(ql[l >> 2], qh[l >> 3], hh, l);
}

/* One matrix of a launch's set: its first block blk0; sp, per, pb, cb:
 * the batched kernels' K split (mmqb_launch) */
struct set_matrix { const uint8_t *W; const float *bias; float *out; int n_out, blk0, sp, per, pb, cb; };
struct mat_set {   /* matrices of one type and n_in, one launch; pf: gemv_prefetches() */
    set_matrix m[CK_MULTI_MAX];
    int nm, pf;
    const uint8_t *glu_u;   /* the batched q4_K kernels' gate-and-up form (ck_mmq_glu_try): the up matrix */
    __half *glu_h;          /* ... and out's f16 form */
};

/* The set of nm matrices for one launch (blk0 and the split fields 0),
 * their outputs from token t0 on */
static inline mat_set mat_set_fill(int nm, const void *const *W, const int *n_out, const float *const *bias,
                                   float *const *out, int t0)
{
    mat_set S;
    memset(&S, 0, sizeof S);
    S.nm = nm;
    for (int i = 0; i < nm; i++) {
        S.m[i].W = (const uint8_t *)W[i];
        S.m[i].bias = bias[i];
        S.m[i].out = out[i] + (size_t)t0 * n_out[i];
        S.m[i].n_out = n_out[i];
    }
    return S;
}

/* the matrix of S this block works on (blocks blk0.. of matrix i) */
__device__ __forceinline__ int block_matrix(const mat_set &S)
{
    int mi = 0;
#pragma unroll
    for (int i = 1; i < CK_MULTI_MAX; i++) if (i < S.nm && (int)blockIdx.x >= S.m[i].blk0) mi = i;
    return mi;
}

/* The forms of an activation x [T][n] beside its f32 values: int8 per 32
 * values for the GEMVs (q [T][n], then the blocks' scales d and sums s
 * [T][n/32], in a scratch of CK_XQ_BYTES(T, n)), f16 for cuBLAS and the
 * batched kernels (h [T][n]); NULL: not written */
struct act_forms { int8_t *q; float *d; int *s; __half *h; };

static inline act_forms act_int8_at(void *scratch, int T, int n)
{
    act_forms L;
    size_t nbt = (size_t)T * (n / 32);
    L.q = (int8_t *)scratch;
    L.d = (float *)(L.q + (size_t)T * n);
    L.s = (int *)(L.d + nbt);
    L.h = NULL;
    return L;
}

/* Block b (of the flattened [T][n/32]) of x quantized by one warp, lane l
 * holding value l. The only quantizer of GEMV input: k_quant_x and the
 * producers that quantize their own output (rmsnorm, add_rmsnorm,
 * silu_mul) give the same bits. Every lane of the warp must call it.
 * quant_blocks: N blocks at once (v[k]: this lane's value of block b[k];
 * their shuffles interleaved), the first nlive of them stored. */
template <int N>
__device__ __forceinline__ void quant_blocks(const float (&v)[N], int lane, const size_t (&b)[N], int nlive,
                                             const act_forms &L)
{
    float a[N];
#pragma unroll
    for (int k = 0; k < N; k++) a[k] = fabsf(v[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) a[k] = fmaxf(a[k], __shfl_xor_sync(0xffffffffu, a[k], o));
    float d[N];
    int q[N], sum[N];
#pragma unroll
    for (int k = 0; k < N; k++) {
        float amax = fmaxf(0.f, a[k]);   /* (all NaN: 0, as a running max from 0) */
        d[k] = amax / 127.f;
        float id = d[k] > 0.f ? 1.f / d[k] : 0.f;
        q[k] = __float2int_rn(v[k] * id);
        sum[k] = q[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], o);
#pragma unroll
    for (int k = 0; k < N; k++) {
        if (k >= nlive) break;
        L.q[b[k] * 32 + lane] = (int8_t)q[k];
        if (lane == 0) {
            L.d[b[k]] = d[k];
            L.s[b[k]] = sum[k];
        }
    }
}

__device__ __forceinline__ void quant_block(float v, int lane, size_t b, const act_forms &L)
{
    const float vv[1] = { v };
    const size_t bb[1] = { b };
    quant_blocks<1>(vv, lane, bb, 1, L);
}

/* A (token, head) row's output value i (of out [T*n_head][hd]) and its
 * int8 / f16 forms; lane: the caller's lane, whose warp holds i's 32-value block */
__device__ __forceinline__ void att_put_out(float o, size_t i, int lane, float *out, const act_forms &qx)
{
    out[i] = o;
    if (qx.q) quant_block(o, lane, i >> 5, qx);
    if (qx.h) qx.h[i] = f2h_sat(o);
}

__device__ __forceinline__ int byte_of3(uint4 h, int k)   /* byte k (0..11) of h.y, h.z, h.w */
{
    uint32_t w = k < 4 ? h.y : k < 8 ? h.z : h.w;
    return (int)((w >> (8 * (k & 3))) & 0xFF);
}

/* k4_sub from the super-block's first 16 bytes h (d, dmin, the 12 scale
 * bytes): the same expressions */
__device__ __forceinline__ void k4_sub_h(uint4 h, int sub, float &d1, float &m1)
{
    int sc, m;
    if (sub < 4) {
        sc = byte_of3(h, sub) & 63; m = byte_of3(h, sub + 4) & 63;
    } else {
        sc = (byte_of3(h, sub + 4) & 0xF) | ((byte_of3(h, sub - 4) >> 6) << 4);
        m = (byte_of3(h, sub + 4) >> 4) | ((byte_of3(h, sub) >> 6) << 4);
    }
    const float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffff)));
    const float mn = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
    d1 = d * (float)sc;
    m1 = mn * (float)m;
}

/* 32 bytes at p (16-byte aligned) as 8 words */
__device__ __forceinline__ void ld16x2(const uint8_t *p, uint32_t (&w)[8])
{
    const uint4 a = __ldg((const uint4 *)p), b = __ldg((const uint4 *)(p + 16));
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

/* q4_K scales of pair j (0..3) of a super-block with header h, as q4k_unit takes them */
__device__ __forceinline__ void q4k_scales(uint4 h, int j, float &d0, float &d1, float &mm0, float &mm1)
{
    int c0 = 2 * j, c1 = 2 * j + 1, sc0, m0, sc1, m1;
    float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffff)));
    float dm = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
    if (j < 2) {
        sc0 = byte_of3(h, c0) & 63; m0 = byte_of3(h, c0 + 4) & 63;
        sc1 = byte_of3(h, c1) & 63; m1 = byte_of3(h, c1 + 4) & 63;
    } else {
        sc0 = (byte_of3(h, c0 + 4) & 0xF) | ((byte_of3(h, c0 - 4) >> 6) << 4);
        m0 = (byte_of3(h, c0 + 4) >> 4) | ((byte_of3(h, c0) >> 6) << 4);
        sc1 = (byte_of3(h, c1 + 4) & 0xF) | ((byte_of3(h, c1 - 4) >> 6) << 4);
        m1 = (byte_of3(h, c1 + 4) >> 4) | ((byte_of3(h, c1) >> 6) << 4);
    }
    d0 = d * (float)sc0; d1 = d * (float)sc1; mm0 = dm * (float)m0; mm1 = dm * (float)m1;
}

__device__ __forceinline__ float silu_mul1(float a, float u) { return a / (1.0f + expf(-a)) * u; }

__device__ __forceinline__ void cp_async16(void *smem, const void *g, int bytes)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(bytes) : "memory");
}
/* N (4 or 8) bytes, through L1 (cp.async.cg takes 16 only) */
template <int N> __device__ __forceinline__ void cp_async_ca(void *smem, const void *g, int bytes)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(a), "l"(g), "n"(N), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *(__half2 *)&u; }

/* One online-softmax step of a tensor-core attention on a warp's S
 * fragments c (four m16n8 tiles: rows g and g + 8 of the 16, scaled, -inf
 * where masked): each row's max over its 4 lanes joins the running max
 * m_r, c becomes the weights exp(s - max), their sums join l_r, and the
 * accumulators o are rescaled. A row without a position yet keeps weight
 * 0 everywhere (no NaN). */
template <int DT>
__device__ __forceinline__ void mma_soft_step(float (&c)[4][4], float (&m_r)[2], float (&l_r)[2], float (&o)[DT][4])
{
    const float LOG2E = 1.4426950408889634f;
    float mx[2] = { -INFINITY, -INFINITY }, base[2], corr[2], rs[2] = { 0.f, 0.f };
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], c[n][e]);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m_r[r], mx[r]);
        base[r] = mn == -INFINITY ? 0.f : mn;
        corr[r] = exp2f((m_r[r] - base[r]) * LOG2E);
        m_r[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = exp2f((c[n][e] - base[e >> 1]) * LOG2E);
            c[n][e] = p;
            rs[e >> 1] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 1);
        rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 2);
        l_r[r] = l_r[r] * corr[r] + rs[r];
    }
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[dt][e] *= corr[e >> 1];
}

/* ldmatrix of four 8x8 b16 matrices (and transposed), rows from shared memory */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
/* (x, y) as f16 high parts, and what they leave as low parts */
__device__ __forceinline__ void h2_split(float x, float y, uint32_t &hi, uint32_t &lo)
{
    __half2 h = __floats2half2_rn(x, y);
    float2 f = __half22float2(h);
    hi = h2u(h);
    lo = h2u(__floats2half2_rn(x - f.x, y - f.y));
}


/* Rope: the angle of pair i at position p (double, as the CPU reference),
 * and the rotation of one pair, rounded step by step: every rope kernel
 * gives the same bits. */
/* mode: bit 0 neox (halves) or adjacent pairs; bit 1: fd[n_rot/2] scales
 * cos and sin (YaRN's attention factor), as the CPU's table does. */
__device__ __forceinline__ void rope_cs(int p, int i, int n_rot, float base, const float *fd, int mode, float &cs,
                                        float &sn)
{
    double theta = (double)p * pow((double)base, -2.0 * i / n_rot);
    double ms = fd && (mode & 2) ? (double)fd[n_rot / 2] : 1.0;
    if (fd) theta /= fd[i];
    cs = (float)(cos(theta) * ms);
    sn = (float)(sin(theta) * ms);
}

/* bias (or NULL): added to v's pair first (v + bias, as the matmul would) */
__device__ __forceinline__ void rope_pair(float *v, int i, int half, int neox, float cs, float sn, float &o0,
                                          float &o1, int &i0, int &i1, const float *bias = NULL)
{
    i0 = (neox & 1) ? i : 2 * i; i1 = (neox & 1) ? i + half : 2 * i + 1;
    float a = v[i0], c = v[i1];
    if (bias) { a = __fadd_rn(a, bias[i0]); c = __fadd_rn(c, bias[i1]); }
    o0 = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(c, sn));
    o1 = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(c, cs));
    v[i0] = o0;
    v[i1] = o1;
}

__device__ __forceinline__ size_t kv_slot(const int32_t *off, const int32_t *pages, int t, int p)
{
    return (size_t)pages[off[t] + p / 16] * 16 + (size_t)(p % 16);
}

__device__ __forceinline__ void kv_put(void *c, int f16, size_t s, float v)
{
    if (f16) ((__half *)c)[s] = __float2half_rn(v);
    else ((float *)c)[s] = v;
}

/* One q8_0 cache block b of 32 values, lane i of a whole warp holding x_i
 * (ggml's q8_0 with the CPU's arithmetic: d = max|x| / 127, x * (1 / d)
 * rounded half away from zero, d kept in f16) */
__device__ __forceinline__ void kv_put_q8(uint8_t *b, float x, int lane)
{
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f, id = d != 0.f ? 1.0f / d : 0.0f;
    b[2 + lane] = (uint8_t)(int8_t)roundf(x * id);
    if (lane == 0) *(__half *)b = __float2half_rn(d);
}

/* ---------------- launchers ---------------- */

#define TYPE_SWITCH(type, FN)         \
    switch (type) {                   \
    case QT_F32: FN(QT_F32); break;   \
    case QT_F16: FN(QT_F16); break;   \
    case QT_BF16: FN(QT_BF16); break; \
    case QT_Q4_0: FN(QT_Q4_0); break; \
    case QT_Q4_1: FN(QT_Q4_1); break; \
    case QT_Q5_0: FN(QT_Q5_0); break; \
    case QT_Q5_1: FN(QT_Q5_1); break; \
    case QT_Q8_0: FN(QT_Q8_0); break; \
    case QT_Q2_K: FN(QT_Q2_K); break; \
    case QT_Q3_K: FN(QT_Q3_K); break; \
    case QT_Q4_K: FN(QT_Q4_K); break; \
    case QT_Q5_K: FN(QT_Q5_K); break; \
    case QT_Q6_K: FN(QT_Q6_K); break; \
    case QT_IQ2_XXS: FN(QT_IQ2_XXS); break; \
    case QT_IQ2_XS: FN(QT_IQ2_XS); break; \
    case QT_IQ2_S: FN(QT_IQ2_S); break; \
    case QT_IQ3_XXS: FN(QT_IQ3_XXS); break; \
    case QT_IQ3_S: FN(QT_IQ3_S); break; \
    case QT_IQ1_S: FN(QT_IQ1_S); break; \
    case QT_IQ4_NL: FN(QT_IQ4_NL); break; \
    case QT_IQ4_XS: FN(QT_IQ4_XS); break; \
    case QT_MXFP4: FN(QT_MXFP4); break; \
    default: break;                   \
    }

static inline unsigned nblk(size_t n, unsigned bs) { return (unsigned)((n + bs - 1) / bs); }

/* The forms a producer writes beside its output [T][n]: int8 (xq, n % 32
 * == 0) and/or f16 (x16) */
static inline act_forms act_forms_for(void *xq, void *x16, int T, int n)
{
    act_forms L;
    if (xq && n % 32 == 0) L = act_int8_at(xq, T, n);
    else memset(&L, 0, sizeof L);
    L.h = (__half *)x16;
    return L;
}
