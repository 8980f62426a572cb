// attention.cu — causal attention over the paged KV cache, in 32-position
// spans merged in order, so a token's result does not depend on its batch.
#include "shaders/common.cuh"

/* A span's two cache pages (np positions of token t from p0, p0 % 32 == 0):
 * the first rows of the pages of positions p0.. and p0+16.. (rowA again
 * when np <= 16) */
__device__ __forceinline__ void att_pages(const int32_t *off, const int32_t *pages, int t, int p0, int np,
                                          size_t &rowA, size_t &rowB)
{
    rowA = (size_t)pages[off[t] + p0 / 16] * 16;
    rowB = np > 16 ? (size_t)pages[off[t] + p0 / 16 + 1] * 16 : rowA;
}

/* the row of span position j (past np: rowA's, a valid address) */
__device__ __forceinline__ size_t att_row(size_t rowA, size_t rowB, int j, int np)
{
    return j < np ? (j < 16 ? rowA + j : rowB + (j - 16)) : rowA;
}

/* ---------------- attention ----------------
 * A token's positions are taken in spans of CK_ATT_SPAN (32). A span's
 * partial (max, sum, weighted values) comes from one warp (att_span): lane
 * l ends up with the score of position start+l, the warp takes the span's
 * max and sum, then each lane accumulates its dims over the span's
 * positions in order. A token's spans are merged
 * in span order by one online step, wherever they were computed: in one
 * block (its warps take spans side by side, merged round by round), or
 * spread over G blocks for short batches (flash-decoding: partials in
 * `part`, then k_att_merge). The arithmetic of a token is therefore the
 * same whatever batch it is in and however its spans are spread (batch
 * invariance); products are rounded explicitly so no kernel contracts them
 * differently. */
#define ATT_WARPS CK_ATT_WARPS
#define ATT_DPT 2     /* dims per thread in the merges: head_dim <= 256 */

/* the online merge of a span's (m, l, a) into (M, L, A), N dims per thread */
template <int N>
__device__ __forceinline__ void att_merge_n(float &M, float &L, float (&A)[N], float m, float l, const float (&a)[N])
{
    if (!(m > -INFINITY)) return;
    float mn = fmaxf(M, m), fo = expf(M - mn), fs = expf(m - mn);
    L = __fmaf_rn(l, fs, __fmul_rn(L, fo));
#pragma unroll
    for (int i = 0; i < N; i++) A[i] = __fmaf_rn(a[i], fs, __fmul_rn(A[i], fo));
    M = mn;
}

__device__ __forceinline__ void att_merge_step(float &M, float &L, float (&A)[ATT_DPT], float m, float l,
                                               const float (&a)[ATT_DPT])
{
    att_merge_n<ATT_DPT>(M, L, A, m, l, a);
}

/* int8 byte k of w ^ 0x80808080 as a float: 2^23 + (byte ^ 0x80) less
 * 2^23 + 128, exact (an integer conversion runs at a quarter of the FMA
 * rate, and a long context's attention is FMA-bound) */
__device__ __forceinline__ float kq8_f(uint32_t wx, int k)
{
    return __int_as_float(__byte_perm(wx, 0x4B000000u, 0x7440 | k)) - 8388736.f;
}

/* value i of a q8_0 cache (F16 == CK_KV_Q8_0): its block's f16 scale
 * times its int8, as the CPU's dequantization */
__device__ __forceinline__ float kq8_ld(const void *c, size_t i)
{
    const uint8_t *b = (const uint8_t *)c + (i >> 5) * CK_KV_Q8_BLOCK;
    return __half2float(*(const __half *)b) * kq8_f(b[2 + (i & 31)] ^ 0x80u, 0);
}

/* ND consecutive cache values from element i, of which the first nv are
 * real (the rest 0); vec: i and ND even, read in pairs (else one by one,
 * since i may be odd when hd % ND != 0) */
template <int ND, int F16>
__device__ __forceinline__ void att_load(const void *c, size_t i, int nv, bool vec, float (&v)[ND])
{
    if (F16 == CK_KV_Q8_0 && vec && nv == ND) {
        /* (i % ND == 0 and ND | 32: one block's scale and ND of its int8,
         * in 2-byte loads as its 34-byte blocks allow; kq8_ld's products) */
        const uint8_t *b = (const uint8_t *)c + (i >> 5) * CK_KV_Q8_BLOCK;
        const float d = __half2float(*(const __half *)b);
        if (ND == 1) {
            v[0] = d * kq8_f(b[2 + (i & 31)] ^ 0x80u, 0);
        } else {
            const uint16_t *qp = (const uint16_t *)(b + 2 + (i & 31));
#pragma unroll
            for (int k = 0; k < ND; k += 4) {
                const uint32_t w = ((uint32_t)qp[k / 2] | (ND > 2 ? (uint32_t)qp[k / 2 + 1] << 16 : 0u)) ^ 0x80808080u;
#pragma unroll
                for (int x = 0; x < 4 && k + x < ND; x++) v[k + x] = d * kq8_f(w, x);
            }
        }
    } else if (F16 == CK_KV_Q8_0) {
#pragma unroll
        for (int k = 0; k < ND; k++) v[k] = k < nv ? kq8_ld(c, i + k) : 0.f;
    } else if (F16 && ND % 2 == 0 && vec) {
        const __half2 *p = (const __half2 *)((const __half *)c + i);
#pragma unroll
        for (int k = 0; k < ND; k += 2) {
            float2 f = __half22float2(p[k / 2]);
            v[k] = f.x; v[k + 1] = f.y;
        }
    } else if (F16) {
#pragma unroll
        for (int k = 0; k < ND; k++) v[k] = k < nv ? __half2float(((const __half *)c)[i + k]) : 0.f;
    } else {
#pragma unroll
        for (int k = 0; k < ND; k++) v[k] = k < nv ? ((const float *)c)[i + k] : 0.f;
    }
}

/* Rows j0 .. j0+15 of a span of np positions on cache pages A and B (row
 * indices rowA.., rowB..; past np, row A's as a valid address), this
 * lane's dims (from base) of each from cache c, 0 where it has none: the
 * K rows and the V rows of att_span alike. */
template <int ND, int F16>
__device__ __forceinline__ void att_rows16(const void *c, size_t rowA, size_t rowB, int j0, int np, int kvd,
                                           size_t base, int nv, bool vec, bool dl, float (&r)[16][ND])
{
#pragma unroll
    for (int j = 0; j < 16; j++) {
        size_t row = att_row(rowA, rowB, j0 + j, np);
#pragma unroll
        for (int k = 0; k < ND; k++) r[j][k] = 0.f;
        if (dl) att_load<ND, F16>(c, row * (size_t)kvd + base, nv, vec, r[j]);
    }
}

/* This lane's share of the dot products of q (its dims qv) with K rows
 * j0 .. j0+15 of a span (as att_rows16) */
template <int ND, int F16>
__device__ __forceinline__ void att_k16(const void *kc, size_t rowA, size_t rowB, int j0, int np, int kvd,
                                        size_t base, int nv, bool vec, bool dl, const float (&qv)[ND],
                                        float (&d)[16])
{
    float kv[16][ND];
    att_rows16<ND, F16>(kc, rowA, rowB, j0, np, kvd, base, nv, vec, dl, kv);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        d[j] = 0.f;
#pragma unroll
        for (int k = 0; k < ND; k++) d[j] = __fmaf_rn(qv[k], kv[j][k], d[j]);
    }
}

/* V rows j0 .. j0+15 of a span (as att_rows16) weighted by their lanes' e, into a */
template <int ND, int F16>
__device__ __forceinline__ void att_v16(const void *vc, size_t rowA, size_t rowB, int j0, int np, int kvd,
                                        size_t base, int nv, bool vec, bool dl, float e, float (&a)[ND])
{
    float vv[16][ND];
    att_rows16<ND, F16>(vc, rowA, rowB, j0, np, kvd, base, nv, vec, dl, vv);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        float ej = __shfl_sync(0xffffffffu, e, j0 + j);
        if (j0 + j < np) {
#pragma unroll
            for (int k = 0; k < ND; k++) a[k] = __fmaf_rn(ej, vv[j][k], a[k]);
        }
    }
}

/* A span's softmax, lane j holding the dot product ps of position j (live:
 * j is in the span): the span's max mx of the scaled scores, this lane's
 * weight e, and their sum in an xor butterfly's order (in every lane) */
__device__ __forceinline__ void att_soft(float ps, bool live, float scale, float &mx, float &e, float &sum)
{
    float sc = live ? __fmul_rn(ps, scale) : -INFINITY;
    mx = sc;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    e = live && mx > -INFINITY ? expf(sc - mx) : 0.f;
    sum = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
}

/* One step of a warp's reduce-scatter of 32 values per lane: after the
 * step of width O a lane keeps the O sums of the half of the indices its
 * bit O selects (constant indices: the values stay in registers). */
template <int O>
__device__ __forceinline__ void att_rs(float (&ps)[32], int lane)
{
    bool up = lane & O;
#pragma unroll
    for (int i = 0; i < O; i++) {
        float keep = up ? ps[i + O] : ps[i], send = up ? ps[i] : ps[i + O];
        ps[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, O));
    }
}

/* The span [p0, p1) of token t (p0 % 32 == 0, 1..32 positions: two cache
 * pages), by the calling warp. Lane l holds dims ND*l .. ND*l+ND-1 of q,
 * of each K and V row read (a warp reads a row as one contiguous piece),
 * and of the result a; lane j ends up with the score of position p0+j, the
 * 32 lanes' shares of its dot product summed in the order of a butterfly.
 * Two forms, the same arithmetic: unrolled (32 rows' loads in flight, the
 * shares summed by a reduce-scatter of 31 shuffles), and for launches of
 * few blocks (ROLL) rolled loops of 16 rows, the shares through the warp's
 * sp ([32][33] floats of shared memory) and summed by lane j in the
 * butterfly's order: a single-token decode runs this once per SM and
 * launch, so its time is the code's fetch as much as its execution. */
/* att_span on rows rowA.. (positions 0..15) and rowB.. (16..31) of caches
 * with rows of kvd values, the head's from kvo: the cache pages, or a
 * block's copy of the span in shared memory (the same values). */
template <int ND, int F16, int ROLL>
__device__ __forceinline__ void att_span_at(const float *qs, const void *kc, const void *vc, size_t rowA,
                                            size_t rowB, size_t kvo, int kvd, int hd, float scale, int np,
                                            float (*sp)[33], float &m, float &l, float (&a)[ND])
{
    int lane = threadIdx.x & 31, d0 = ND * lane;
    bool dl = d0 < hd;
    int nv = min(ND, hd - d0);   /* dims of this lane below hd */
    bool vec = hd % ND == 0;
    float qv[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) qv[k] = dl && k < nv ? qs[d0 + k] : 0.f;
    bool live = lane < np;
    float ps;
    if (ROLL) {
#pragma unroll 1
        for (int j0 = 0; j0 < np; j0 += 16) {
            float d[16];
            att_k16<ND, F16>(kc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, qv, d);
#pragma unroll
            for (int j = 0; j < 16; j++) sp[j0 + j][lane] = d[j];
        }
        __syncwarp();
        /* the reduce-scatter's sum for row `lane`: with b[x] = lane (lane ^
         * x)'s share, each round adds b[x] + b[x + o] for x < o */
        float b[32];
#pragma unroll
        for (int x = 0; x < 32; x++) b[x] = sp[lane][lane ^ x];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int x = 0; x < o; x++) b[x] = __fadd_rn(b[x], b[x + o]);
        ps = b[0];
        __syncwarp();   /* (sp is the warp's next span's) */
    } else {
        float pr[32];
#pragma unroll
        for (int j0 = 0; j0 < 32; j0 += 16) {
            float d[16];
            att_k16<ND, F16>(kc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, qv, d);
#pragma unroll
            for (int j = 0; j < 16; j++) pr[j0 + j] = d[j];
        }
        att_rs<16>(pr, lane);
        att_rs<8>(pr, lane);
        att_rs<4>(pr, lane);
        att_rs<2>(pr, lane);
        att_rs<1>(pr, lane);
        ps = pr[0];
    }
    float mx, e, sum;
    att_soft(ps, live, scale, mx, e, sum);
#pragma unroll
    for (int k = 0; k < ND; k++) a[k] = 0.f;
    if (ROLL) {
#pragma unroll 1
        for (int j0 = 0; j0 < np; j0 += 16) att_v16<ND, F16>(vc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, e, a);
    } else {
#pragma unroll
        for (int j0 = 0; j0 < 32; j0 += 16) {
            if (j0 >= np) break;
            att_v16<ND, F16>(vc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, e, a);
        }
    }
    m = mx;
    l = sum;
}

template <int ND, int F16, int ROLL>
__device__ __forceinline__ void att_span(const float *qs, const void *kc, const void *vc, const int32_t *off,
                                         const int32_t *pages, int t, size_t kvo, int kvd, int hd, float scale,
                                         int p0, int p1, float (*sp)[33], float &m, float &l, float (&a)[ND])
{
    int np = p1 - p0;
    size_t rowA, rowB;
    att_pages(off, pages, t, p0, np, rowA, rowB);
    /* (head_dim 32 ND and a whole span, the common case: the same code
     * with the lane's dims and the rows' bounds constant; not in the
     * rolled form, whose launches are few blocks and fetch its code once
     * per SM) */
    if (!ROLL && hd == 32 * ND && np == CK_ATT_SPAN)
        att_span_at<ND, F16, ROLL>(qs, kc, vc, rowA, rowB, kvo, kvd, 32 * ND, scale, CK_ATT_SPAN, sp, m, l, a);
    else
        att_span_at<ND, F16, ROLL>(qs, kc, vc, rowA, rowB, kvo, kvd, hd, scale, np, sp, m, l, a);
}

/* Span s's partial (m, l, this lane's dims of a) of row th, for k_att_merge */
template <int ND>
__device__ __forceinline__ void att_put_part(float *part, int th, int maxs, int s, int hd, float m, float l,
                                             const float (&a)[ND])
{
    int lane = threadIdx.x & 31;
    float *pp = part + ((size_t)th * maxs + s) * (hd + 2);
    if (lane == 0) { pp[0] = m; pp[1] = l; }
#pragma unroll
    for (int k = 0; k < ND; k++)
        if (ND * lane + k < hd) pp[2 + ND * lane + k] = a[k];
}

/* Cache row `row` (hd values of eb bytes) of K and of V into L2: a
 * prefetch before the launch wait, of rows earlier launches wrote (one
 * this pass writes is only fetched early, never read stale) */
template <int F16>
__device__ __forceinline__ void att_prefetch_row(const void *kc, const void *vc, size_t row, int hd)
{
    /* (bytes from value `row` on: a q8_0 row's head share starts on a block) */
    const size_t b0 = F16 == CK_KV_Q8_0 ? (row >> 5) * CK_KV_Q8_BLOCK : row * (F16 ? 2 : 4);
    const size_t nb = F16 == CK_KV_Q8_0 ? (size_t)(hd >> 5) * CK_KV_Q8_BLOCK : (size_t)hd * (F16 ? 2 : 4);
    for (size_t o = 0; o < nb; o += 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)kc + b0 + o) : "memory");
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)vc + b0 + o) : "memory");
    }
}

/* one cache value as a float */
template <int F16>
__device__ __forceinline__ float att_ld1(const void *c, size_t i)
{
    return F16 == CK_KV_Q8_0 ? kq8_ld(c, i) : F16 ? __half2float(((const __half *)c)[i]) : ((const float *)c)[i];
}

/* k_attention with the block's ATT_WARPS warps on each span together, for
 * head_dim 32 * ATT_WARPS: warp w takes the scores of rows 8w .. 8w+7
 * (lane l's share, dims ND*l.., as att_span_at; summed over the lanes by
 * an xor butterfly, which pairs the shares as att_span_at's reduce-scatter
 * does, so the same sums), every warp the span's softmax from the 32
 * scores (as att_span_at), and thread i the weighted V sum of dim i (in
 * row order, as att_span_at's lane of that dim). So a span's (m, l, a) are
 * att_span_at's, with a chain a quarter as long; a one-token decode's
 * attention is that chain (one block per head, or per head and span). */
/* Span [p0, p0 + np) of token t (its pages' first rows rowA, rowB, as
 * att_pages gives them) by every thread of the block, scores through
 * ssc (a [CK_ATT_SPAN] of shared memory the caller alternates between spans:
 * a warp writes the next one's only after every warp passed this one's
 * barrier); m, l the span's, a this thread's dim's */
/* NG > 1: the block is NG groups of ATT_WARPS warps, group threadIdx.x /
 * (32 * ATT_WARPS) on this span (its own named barrier, 1 + group). */
template <int ND, int F16, int NG = 1>
__device__ __forceinline__ void att_coop_span(const float (&qv)[ND], const void *kc, const void *vc, size_t rowA,
                                              size_t rowB, int np, size_t kvo, int kvd, float scale, float *ssc,
                                              float &m, float &l, float &a)
{
    constexpr int RW = CK_ATT_SPAN / ATT_WARPS;   /* score rows per warp */
    const int warp = (threadIdx.x >> 5) % ATT_WARPS, lane = threadIdx.x & 31, dim = threadIdx.x % (32 * ATT_WARPS);
    float kk[RW][ND], vv[CK_ATT_SPAN];
#pragma unroll
    for (int i = 0; i < RW; i++)
        att_load<ND, F16>(kc, att_row(rowA, rowB, RW * warp + i, np) * (size_t)kvd + kvo + ND * lane, ND, true,
                          kk[i]);
#pragma unroll
    for (int j = 0; j < CK_ATT_SPAN; j++) vv[j] = att_ld1<F16>(vc, att_row(rowA, rowB, j, np) * (size_t)kvd + kvo + dim);
    float sc8[RW];
#pragma unroll
    for (int i = 0; i < RW; i++) {
        float d = 0.f;
#pragma unroll
        for (int k = 0; k < ND; k++) d = __fmaf_rn(qv[k], kk[i][k], d);
        sc8[i] = d;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < RW; i++) sc8[i] = __fadd_rn(sc8[i], __shfl_xor_sync(0xffffffffu, sc8[i], o));
#pragma unroll
    for (int i = 0; i < RW; i++)
        if (lane == i) ssc[RW * warp + i] = sc8[i];
    if (NG == 1) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"r"(1 + (int)threadIdx.x / (32 * ATT_WARPS)), "r"(32 * ATT_WARPS) : "memory");
    float mx, e, sum;
    att_soft(ssc[lane], lane < np, scale, mx, e, sum);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < CK_ATT_SPAN; j++) {
        float ej = __shfl_sync(0xffffffffu, e, j);
        if (j < np) acc = __fmaf_rn(ej, vv[j], acc);
    }
    m = mx;
    l = sum;
    a = acc;
}

/* Token t's spans: G == 1 (every span here, merged in order as the direct
 * path's rounds do, per dim, and written to out) or spans y, y + G, ... to
 * part (k_att_merge merges them) */
template <int ND, int F16>
__device__ __forceinline__ void att_coop(const float *qs, const void *kc, const void *vc, const int32_t *off,
                                         const int32_t *pages, int t, int th, int len, int ns, int G, int y,
                                         int maxs, size_t kvo, int kvd, float scale, float *out, float *part,
                                         const act_forms &qx)
{
    __shared__ float ssc[2][CK_ATT_SPAN];
    const int lane = threadIdx.x & 31, dim = threadIdx.x, hd = 32 * ND;
    float qv[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) qv[k] = qs[ND * lane + k];
    float M = -INFINITY, L = 0.f, A[1] = { 0.f };
    const bool direct = G == 1 || ns == 1;
    for (int s = direct ? 0 : y, i = 0; s < ns; s += direct ? 1 : G, i++) {
        const int p0 = s * CK_ATT_SPAN, np = min(len, p0 + CK_ATT_SPAN) - p0;
        float m, l, a[1];
        size_t rowA, rowB;
        att_pages(off, pages, t, p0, np, rowA, rowB);
        att_coop_span<ND, F16>(qv, kc, vc, rowA, rowB, np, kvo, kvd, scale, ssc[i & 1], m, l, a[0]);
        if (direct) {
            att_merge_n<1>(M, L, A, m, l, a);
        } else {
            float *pp = part + ((size_t)th * maxs + s) * (hd + 2);
            if (threadIdx.x == 0) { pp[0] = m; pp[1] = l; }
            pp[2 + dim] = a[0];
        }
    }
    if (direct) att_put_out(A[0] / L, (size_t)th * hd + dim, lane, out, qx);
}

/* k_attention's direct path (G == 1: a token's spans merged in order and
 * written to out) for head_dim 32 * ATT_WARPS by NG groups of ATT_WARPS
 * warps, each group on one span together (att_coop_span), NG spans at a
 * time; group 0 merges each round's spans in order, as the direct path's
 * rounds do. So every span's (m, l, a) and every merge are k_attention's
 * (the same bits), and a token of up to NG spans is one span's chain
 * instead of one per span. A block per (token, head); the first round's
 * K and V rows prefetched into L2 before the launch wait (the cache rows
 * are written by earlier launches; a prefetch cannot read stale data). */
template <int ND, int F16, int NG>
__global__ void __launch_bounds__(NG * ATT_WARPS * 32) k_att_par(const float *q, const void *kc, const void *vc,
                                                                const int32_t *pos, const int32_t *off,
                                                                const int32_t *pages, int n_head, int n_head_kv,
                                                                float *out, act_forms qx)
{
    constexpr int hd = 32 * ND;
    static_assert(ND == ATT_WARPS, "a group's threads are the head's dims");
    const int th = blockIdx.x, t = th / n_head, h = th % n_head;
    const int grp = threadIdx.x / hd, dim = threadIdx.x % hd, lane = threadIdx.x & 31;
    const int kvh = h / (n_head / n_head_kv), kvd = n_head_kv * hd;
    const int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    const size_t kvo = (size_t)kvh * hd;
    for (int p = threadIdx.x; p < min(len, NG * CK_ATT_SPAN); p += blockDim.x)
        att_prefetch_row<F16>(kc, vc, kv_slot(off, pages, t, p) * (size_t)kvd + kvo, hd);
    /* the first round's pages (the batch block is written before the pass) */
    size_t rA = 0, rB = 0;
    if (grp < ns) att_pages(off, pages, t, grp * CK_ATT_SPAN, min(len - grp * CK_ATT_SPAN, CK_ATT_SPAN), rA, rB);
    pdl_begin();
    float qv[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) {   /* (as k_attention's qs: f16 caches take q rounded to f16) */
        float v = q[(size_t)th * hd + ND * lane + k];
        qv[k] = F16 == 1 ? __half2float(__float2half_rn(v)) : v;
    }
    __shared__ float ssc[NG][2][CK_ATT_SPAN];
    __shared__ float pm[NG], pl[NG], pa[NG][hd];
    const float scale = 1.0f / sqrtf((float)hd);
    float M = -INFINITY, L = 0.f, A[1] = { 0.f };
    for (int s0 = 0, i = 0; s0 < ns; s0 += NG, i++) {
        const int s = s0 + grp;
        if (s < ns) {
            const int p0 = s * CK_ATT_SPAN, np = min(len, p0 + CK_ATT_SPAN) - p0;
            float m, l, a;
            if (i > 0) att_pages(off, pages, t, p0, np, rA, rB);
            att_coop_span<ND, F16, NG>(qv, kc, vc, rA, rB, np, kvo, kvd, scale, ssc[grp][i & 1], m, l, a);
            if (dim == 0) { pm[grp] = m; pl[grp] = l; }
            pa[grp][dim] = a;
        }
        __syncthreads();
        if (grp == 0)
            for (int w = 0; w < NG && s0 + w < ns; w++) {
                float aw[1] = { pa[w][dim] };
                att_merge_n<1>(M, L, A, pm[w], pl[w], aw);
            }
        __syncthreads();   /* (the merges are done with pm, pl, pa) */
    }
    if (grp == 0) att_put_out(A[0] / L, (size_t)th * hd + dim, lane, out, qx);
}

/* The rope of a decode batch done by k_attention (tab NULL: none): k, v
 * the projections' output, biases or NULL, tab the pass's angles (as
 * k_rope_kv's mode 2), kc / vc the caches written. */
struct att_rope { const float *k, *v, *bq, *bk, *bv; const float2 *tab; void *kc, *vc; int n_rot, neox; };

/* Block (token*head, y) of G, ATT_WARPS warps. G == 1 or a one-span token:
 * every span here, merged, written to out. Else warp w of block y takes
 * spans y + G*w, y + G*(w + ATT_WARPS), ... to part (maxs per row).
 * R.tab: a batch of decode tokens (one per sequence) whose rope and KV
 * store come here instead of k_rope_kv: each block ropes its q head, and
 * ropes and stores its token's K and V row; the blocks of one KV head
 * write the same bits to that row, and each reads it only after its own
 * write (so every value is k_rope_kv's, and the row read is this step's). */
template <int ND, int F16, int ROLL>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(const float *q, const void *kc, const void *vc,
                                                   const int32_t *pos, const int32_t *off, const int32_t *pages,
                                                   int n_head, int n_head_kv, int hd, float *out, float *part,
                                                   int G, int maxs, act_forms qx, const att_rope R, int coop)
{
    int th = blockIdx.x, t = th / n_head, h = th % n_head, y = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (n_head / n_head_kv), kvd = n_head_kv * hd;
    /* (the batch block was written before the pass's first kernel, the
     * cache rows by earlier kernels: read before the wait, into L2) */
    int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    if ((G == 1 || ns == 1) && y != 0) return;
    if (ROLL) {   /* (few blocks: their latency is the launch's) */
        int s = G == 1 || ns == 1 ? warp : y + G * warp, p = s * CK_ATT_SPAN + lane;
        if (s < ns && p < len)
            att_prefetch_row<F16>(kc, vc, kv_slot(off, pages, t, p) * (size_t)kvd + (size_t)kvh * hd, hd);
    }
    /* the fused rope's angles and biases: not written by the kernel before
     * (the angles by the pass's first rope_kv, two launches back at least) */
    __shared__ float2 rcs[ND * 16];
    __shared__ float rb[3][ND * 32];
    const float *bqh = R.bq ? R.bq + (size_t)h * hd : NULL, *bkh = R.bk ? R.bk + (size_t)kvh * hd : NULL;
    const float *bvh = R.bv ? R.bv + (size_t)kvh * hd : NULL;
    if (R.tab) {
        const int half = R.n_rot / 2;
        for (int i = threadIdx.x; i < half; i += blockDim.x) rcs[i] = R.tab[(size_t)t * half + i];
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            rb[0][d] = bqh ? bqh[d] : 0.f;
            rb[1][d] = bkh ? bkh[d] : 0.f;
            rb[2][d] = bvh ? bvh[d] : 0.f;
        }
    }
    pdl_begin();
    __shared__ float qs[ND * 32];
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_a[ATT_WARPS][ND * 32];
    extern __shared__ float att_sp[];   /* ROLL: att_span's row shares, [32][33] per warp (dynamic:
                                         * the unrolled form takes none, and keeps its L1) */
    float (*sp)[33] = (float (*)[33])(att_sp + (ROLL ? warp * 32 * 33 : 0));
    const float *qt = q + (size_t)th * hd;
    if (F16 != CK_KV_Q8_0 && R.tab) {   /* (never with a q8_0 cache) */
        __shared__ float ks[ND * 32];
        const int half = R.n_rot / 2;
        const float *kt = R.k + ((size_t)t * n_head_kv + kvh) * hd, *vt = R.v + ((size_t)t * n_head_kv + kvh) * hd;
        const float *sbq = bqh ? rb[0] : NULL, *sbk = bkh ? rb[1] : NULL;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) { qs[d] = qt[d]; ks[d] = kt[d]; }
        __syncthreads();
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float2 a = rcs[i];
            float o0, o1;
            int i0, i1;
            rope_pair(qs, i, half, R.neox, a.x, a.y, o0, o1, i0, i1, sbq);
            rope_pair(ks, i, half, R.neox, a.x, a.y, o0, o1, i0, i1, sbk);
        }
        for (int d = R.n_rot + threadIdx.x; d < hd; d += blockDim.x) {   /* past the rotated dims */
            if (bqh) qs[d] = __fadd_rn(qs[d], rb[0][d]);
            if (bkh) ks[d] = __fadd_rn(ks[d], rb[1][d]);
        }
        __syncthreads();
        size_t s = kv_slot(off, pages, t, pos[t]) * (size_t)kvd + (size_t)kvh * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            kv_put(R.kc, F16, s + d, ks[d]);
            kv_put(R.vc, F16, s + d, bvh ? __fadd_rn(vt[d], rb[2][d]) : vt[d]);
            if (F16 == 1) qs[d] = __half2float(__float2half_rn(qs[d]));
        }
    } else {   /* (q rounded to f16 for an f16 cache only: q8_0 keys meet q in f32, as on the CPU) */
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = qt[d];
            qs[d] = F16 == 1 ? __half2float(__float2half_rn(v)) : v;
        }
    }
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd);
    size_t kvo = (size_t)kvh * hd;
    float m, l, a[ND];
    if constexpr (ND == ATT_WARPS) {
        if (coop && hd == 32 * ND && (!(G == 1 || ns == 1) || ns <= coop)) {
            att_coop<ND, F16>(qs, kc, vc, off, pages, t, th, len, ns, G, y, maxs, kvo, kvd, scale, out, part, qx);
            return;
        }
    }
    if (G == 1 || ns == 1) {
        float M = -INFINITY, L = 0.f, A[ATT_DPT];
#pragma unroll
        for (int i = 0; i < ATT_DPT; i++) A[i] = 0.f;
        for (int s0 = 0; s0 < ns; s0 += ATT_WARPS) {
            int s = s0 + warp;
            if (s < ns) {
                att_span<ND, F16, ROLL>(qs, kc, vc, off, pages, t, kvo, kvd, hd, scale, s * CK_ATT_SPAN,
                                  min(len, (s + 1) * CK_ATT_SPAN), sp, m, l, a);
                if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
                for (int k = 0; k < ND; k++) sm_a[warp][ND * lane + k] = a[k];
            }
            __syncthreads();
            for (int w = 0; w < ATT_WARPS && s0 + w < ns; w++) {
                float aw[ATT_DPT];
#pragma unroll
                for (int i = 0; i < ATT_DPT; i++) {
                    int d = threadIdx.x + 128 * i;
                    aw[i] = d < hd ? sm_a[w][d] : 0.f;
                }
                att_merge_step(M, L, A, sm_m[w], sm_l[w], aw);
            }
            __syncthreads();   /* the merges are done with the shared arrays */
        }
#pragma unroll
        for (int i = 0; i < ATT_DPT; i++) {
            int d = threadIdx.x + 128 * i;
            /* (whole warps: hd % 32 == 0 when quantizing) */
            if (d < hd) att_put_out(A[i] / L, (size_t)th * hd + d, lane, out, qx);
        }
        return;
    }
    for (int s = y + G * warp; s < ns; s += G * ATT_WARPS) {
        att_span<ND, F16, ROLL>(qs, kc, vc, off, pages, t, kvo, kvd, hd, scale, s * CK_ATT_SPAN,
                          min(len, (s + 1) * CK_ATT_SPAN), sp, m, l, a);
        att_put_part<ND>(part, th, maxs, s, hd, m, l, a);
    }
}

/* Decode batches by KV head: block (token * n_head_kv + KV head, y) of G,
 * warp w the group's q head w. The block copies each span's K and V rows
 * (this KV head's share) into shared memory by cp.async, the next span's
 * while the warps compute this one, and every head of the group reads
 * them there: a row leaves L2 once per group (k_attention's blocks of one
 * token and head read the rows of a 32-stream 7b step 7 times over), and
 * the loads' latency is hidden (k_attention's warps wait on theirs, span
 * by span). Each warp computes a span with att_span's arithmetic on the
 * copied values. G == 1 or a one-span token: the spans merged in order
 * from the empty state, as k_attention's rounds do, and written to out;
 * else spans y, y + G, ... to part, merged in order by k_att_merge. So
 * every (token, head) has k_attention's bits. Shared memory: two stages of
 * K and V, 32 rows of hd values each (hd * elt <= 512 bytes; a q8_0
 * cache's rows as their blocks, and one f32 stage they are dequantized
 * into, head_dim <= 128). */
template <int ND, int F16>
__global__ void __launch_bounds__(256) k_att_grp(const float *q, const void *kc, const void *vc, const int32_t *pos,
                                                 const int32_t *off, const int32_t *pages, int n_head,
                                                 int n_head_kv, int hd, float *out, float *part, int G, int maxs,
                                                 act_forms qx)
{
    const int t = blockIdx.x / n_head_kv, kvh = blockIdx.x % n_head_kv, y = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int th = t * n_head + kvh * (n_head / n_head_kv) + warp, kvd = n_head_kv * hd;
    const int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    const bool direct = G == 1 || ns == 1;
    if (direct && y != 0) return;
    pdl_begin();
    /* a row's head share: hd values, or for a q8_0 cache its hd / 32
     * blocks as they are (read by att_load's q8_0 form, the same values),
     * copied in pieces of pb bytes (a q8_0 share starts on a multiple of
     * 34 hd / 32 bytes: 4-byte aligned for hd 64, 8 for 128 and 256) */
    constexpr int EB = F16 == 1 ? 2 : 4;
    extern __shared__ __align__(16) unsigned char ag_raw[];
    const int rowb = F16 == CK_KV_Q8_0 ? hd / 32 * CK_KV_Q8_BLOCK : hd * EB;
    const int pb = F16 == CK_KV_Q8_0 ? (hd % 128 ? 4 : 8) : 16, pr = rowb / pb;
    auto stage = [&](int b, int v) { return ag_raw + (size_t)(2 * b + v) * 32 * rowb; };
    __shared__ float qs[8][ND * 32];
    const float *qt = q + (size_t)th * hd;
    for (int d = lane; d < hd; d += 32) {
        float v = qt[d];
        qs[warp][d] = F16 == 1 ? __half2float(__float2half_rn(v)) : v;
    }
    const int s0 = direct ? 0 : y, ds = direct ? 1 : G;
    /* span s's rows (zeros past the token's length) into stage b */
    auto load = [&](int s, int b) {
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        for (int e = threadIdx.x; e < 2 * 32 * pr; e += blockDim.x) {
            int v = e / (32 * pr), j = (e / pr) % 32, pc = e % pr;
            const char *src = (const char *)(v ? vc : kc);
            size_t r = kv_slot(off, pages, t, p0 + (j < np ? j : 0)) * kvd + (size_t)kvh * hd;
            unsigned char *dst = stage(b, v) + (size_t)j * rowb + pb * pc;
            if (F16 != CK_KV_Q8_0) cp_async16(dst, src + r * EB + 16 * pc, j < np ? 16 : 0);
            else if (pb == 8) cp_async_ca<8>(dst, src + (r >> 5) * CK_KV_Q8_BLOCK + 8 * pc, j < np ? 8 : 0);
            else cp_async_ca<4>(dst, src + (r >> 5) * CK_KV_Q8_BLOCK + 4 * pc, j < np ? 4 : 0);
        }
    };
    const float scale = 1.0f / sqrtf((float)hd);
    float M = -INFINITY, L = 0.f, A[ND], m, l, a[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) A[k] = 0.f;
    load(s0, 0);
    cp_commit();
    for (int s = s0, i = 0; s < ns; s += ds, i++) {
        if (s + ds < ns) load(s + ds, (i + 1) & 1);
        cp_commit();
        cp_wait<1>();      /* span s is in ... */
        __syncthreads();   /* ... for every thread */
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        /* (head_dim 32 ND and whole spans, the common case, with constant
         * row offsets and no bounds: the same code, folded) */
        const void *sk = stage(i & 1, 0), *sv = stage(i & 1, 1);
        /* a q8_0 span dequantized once for the group's heads into f32
         * (the values att_load gives: exact products, so the same bits) */
        constexpr int SF = F16 == CK_KV_Q8_0 ? 0 : F16;
        if constexpr (F16 == CK_KV_Q8_0) {
            float *fk = (float *)(ag_raw + (size_t)4 * 32 * rowb), *fv = fk + 32 * hd;
            for (int e = threadIdx.x; e < 2 * 32 * (hd / 4); e += blockDim.x) {
                int v = e / (32 * (hd / 4)), j = (e / (hd / 4)) % 32, pc = e % (hd / 4);
                float x[4];
                att_load<4, CK_KV_Q8_0>(v ? sv : sk, (size_t)j * hd + 4 * pc, 4, true, x);
                *(float4 *)((v ? fv : fk) + (size_t)j * hd + 4 * pc) = make_float4(x[0], x[1], x[2], x[3]);
            }
            __syncthreads();
            sk = fk;
            sv = fv;
        }
        if (hd == 32 * ND && np == CK_ATT_SPAN)
            att_span_at<ND, SF, 0>(qs[warp], sk, sv, 0, 16, 0, 32 * ND, 32 * ND, scale, CK_ATT_SPAN, NULL, m, l, a);
        else
            att_span_at<ND, SF, 0>(qs[warp], sk, sv, 0, 16, 0, hd, hd, scale, np, NULL, m, l, a);
        if (direct) att_merge_n<ND>(M, L, A, m, l, a);
        else att_put_part<ND>(part, th, maxs, s, hd, m, l, a);
        __syncthreads();   /* stage i & 1 is free for span s + 2 ds */
    }
    cp_wait<0>();
    if (!direct) return;
    float *ob = qs[warp];   /* (q is done with) */
#pragma unroll
    for (int k = 0; k < ND; k++)
        if (ND * lane + k < hd) ob[ND * lane + k] = A[k] / L;
    __syncwarp();
    for (int d = lane; d < hd; d += 32)   /* (whole warps: hd % 32 == 0 when quantizing) */
        att_put_out(ob[d], (size_t)th * hd + d, lane, out, qx);
}

/* Grouped attention on tensor cores, for decode batches that are outside
 * the batch-invariance promise (more than CK_GEMV_MAX_T streams, as the
 * batched matmuls; f16 caches, head_dim 64 or 128, up to 16 q heads per KV
 * head). k_att_grp's blocks (token, KV head, y of G) and partials, but one
 * warp takes a whole span for all the group's heads: S = Q K^T by
 * mma.m16n8k16 (the heads as the 16 rows; q rounded to f16 as k_attention
 * rounds it; f32 sums), the online softmax on S's fragments, and O += P V
 * with P split into f16 high and low parts (two MMAs: P carries ~2^-22 of
 * rounding, so the result is f32-accurate) and V's fragments by
 * ldmatrix.trans. A block's warps take its spans side by side, each span's
 * K and V rows copied by the warp into its own shared memory by cp.async,
 * the next span's while it computes this one (two stages per warp). G == 1
 * or a one-span token: the warps' states merged in warp order and written
 * to out; else each span's partial to part, merged by k_att_merge. */
#define ATT_MMA_WARPS 4
template <int HD> struct att_mma_stage {
    __half k[32][HD + 8], v[32][HD + 8];   /* (+8: ldmatrix's 8 rows hit 8 bank groups) */
};
#define ATT_MMA_SMEM(HD) (ATT_MMA_WARPS * 2 * sizeof(att_mma_stage<HD>))

template <int HD>
__global__ void __launch_bounds__(ATT_MMA_WARPS * 32) k_att_mma(const float *q, const __half *kc, const __half *vc,
                                                        const int32_t *pos, const int32_t *off,
                                                        const int32_t *pages, int n_head, int n_head_kv,
                                                        float *out, float *part, int G, int maxs, act_forms qx)
{
    constexpr int KS = HD / 16, DT = HD / 8, PR = HD * 2 / 16;
    const int t = blockIdx.x / n_head_kv, kvh = blockIdx.x % n_head_kv, y = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    const int gh = n_head / n_head_kv, h0 = t * n_head + kvh * gh, kvd = n_head_kv * HD;
    const int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    const bool direct = G == 1 || ns == 1;
    if (direct && y != 0) return;
    pdl_begin();
    extern __shared__ __align__(16) unsigned char att_mma_raw[];
    att_mma_stage<HD> *sbs = (att_mma_stage<HD> *)att_mma_raw + 2 * warp;
    __shared__ float att_mma_ml[ATT_MMA_WARPS][2][16];
    /* the group's q rows g and g + 8 (zero past gh) as A fragments */
    uint32_t qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = g + 8 * (i & 1), d = 16 * kk + 2 * qd + 8 * (i >> 1);
            float2 v = r < gh ? *(const float2 *)(q + (size_t)(h0 + r) * HD + d) : make_float2(0.f, 0.f);
            qa[kk][i] = h2u(__floats2half2_rn(v.x, v.y));
        }
    const float scale = 1.0f / sqrtf((float)HD);
    float m_r[2], l_r[2], o[DT][4];
    auto reset = [&]() {
        m_r[0] = m_r[1] = -INFINITY;
        l_r[0] = l_r[1] = 0.f;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    };
    reset();
    const int s_first = direct ? warp : y + G * warp, s_step = direct ? ATT_MMA_WARPS : G * ATT_MMA_WARPS;
    /* span s's K and V rows (zeros past the token's length) into stage b */
    auto load = [&](int s, int b) {
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        const int slot = (int)kv_slot(off, pages, t, p0 + min(lane, np - 1));
        for (int e = lane; e < 2 * 32 * PR; e += 32) {
            int v = e / (32 * PR), j = (e / PR) % 32, pc = e % PR;
            int r = __shfl_sync(0xffffffffu, slot, j);
            const __half *src = (v ? vc : kc) + (size_t)r * kvd + (size_t)kvh * HD + 8 * pc;
            cp_async16(v ? &sbs[b].v[j][8 * pc] : &sbs[b].k[j][8 * pc], src, j < np ? 16 : 0);
        }
    };
    if (s_first < ns) load(s_first, 0);
    cp_commit();
    for (int s = s_first, i = 0; s < ns; s += s_step, i++) {
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        if (s + s_step < ns) load(s + s_step, (i + 1) & 1);
        cp_commit();
        cp_wait<1>();   /* span s is in ... */
        __syncwarp();   /* ... for every lane */
        att_mma_stage<HD> &sb = sbs[i & 1];
        /* S: rows (heads) g, g + 8; columns (positions) 8 nt + 2 qd, + 1 */
        float c[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk += 2) {
                uint32_t b[4];
                ldsm_x4(b, &sb.k[8 * nt + (lane & 7)][16 * kk + 8 * ((lane >> 3) & 1) + 16 * (lane >> 4)]);
                mma_f16(c[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
                mma_f16(c[nt], qa[kk + 1][0], qa[kk + 1][1], qa[kk + 1][2], qa[kk + 1][3], b[2], b[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) c[nt][i] = 8 * nt + 2 * qd + (i & 1) < np ? c[nt][i] * scale : -INFINITY;
        mma_soft_step<DT>(c, m_r, l_r, o);
        /* O += P V, positions 16 ks .. 16 ks + 15 a k-step */
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            uint32_t ah[4], al[4];
            h2_split(c[2 * ks][0], c[2 * ks][1], ah[0], al[0]);
            h2_split(c[2 * ks][2], c[2 * ks][3], ah[1], al[1]);
            h2_split(c[2 * ks + 1][0], c[2 * ks + 1][1], ah[2], al[2]);
            h2_split(c[2 * ks + 1][2], c[2 * ks + 1][3], ah[3], al[3]);
#pragma unroll
            for (int dt = 0; dt < DT; dt += 2) {
                uint32_t b[4];
                ldsm_x4_t(b, &sb.v[16 * ks + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * dt + 8 * (lane >> 4)]);
                mma_f16(o[dt], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
                mma_f16(o[dt], al[0], al[1], al[2], al[3], b[0], b[1]);
                mma_f16(o[dt + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
                mma_f16(o[dt + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
            }
        }
        if (!direct) {   /* the span's partial, rows g and g + 8 */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int hr = g + 8 * r;
                if (hr >= gh) continue;
                float *pp = part + ((size_t)(h0 + hr) * maxs + s) * (HD + 2);
                if (qd == 0) { pp[0] = m_r[r]; pp[1] = l_r[r]; }
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    pp[2 + 8 * dt + 2 * qd] = o[dt][2 * r];
                    pp[3 + 8 * dt + 2 * qd] = o[dt][2 * r + 1];
                }
            }
            reset();
        }
        __syncwarp();   /* stage i & 1 is free for span s + 2 s_step */
    }
    cp_wait<0>();
    if (!direct) return;
    /* the warps' states through shared memory (each warp's stages), merged in warp order */
    __syncwarp();
    float *fo = (float *)sbs;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        fo[g * HD + 8 * dt + 2 * qd] = o[dt][0];
        fo[g * HD + 8 * dt + 2 * qd + 1] = o[dt][1];
        fo[(g + 8) * HD + 8 * dt + 2 * qd] = o[dt][2];
        fo[(g + 8) * HD + 8 * dt + 2 * qd + 1] = o[dt][3];
    }
    if (qd == 0) {
        att_mma_ml[warp][0][g] = m_r[0]; att_mma_ml[warp][0][g + 8] = m_r[1];
        att_mma_ml[warp][1][g] = l_r[0]; att_mma_ml[warp][1][g + 8] = l_r[1];
    }
    __syncthreads();
    for (int r = warp; r < gh; r += ATT_MMA_WARPS) {
        float M = -INFINITY, L = 0.f, A[HD / 32];
#pragma unroll
        for (int k = 0; k < HD / 32; k++) A[k] = 0.f;
        for (int w = 0; w < ATT_MMA_WARPS; w++) {
            const float *fw = (const float *)((att_mma_stage<HD> *)att_mma_raw + 2 * w);
            float a[HD / 32];
#pragma unroll
            for (int k = 0; k < HD / 32; k++) a[k] = fw[r * HD + lane + 32 * k];
            att_merge_n<HD / 32>(M, L, A, att_mma_ml[w][0][r], att_mma_ml[w][1][r], a);
        }
#pragma unroll
        for (int k = 0; k < HD / 32; k++) att_put_out(A[k] / L, (size_t)(h0 + r) * HD + lane + 32 * k, lane, out, qx);
    }
}

/* Tokens of more than one span, after a split over blocks (G > 1): a
 * (token, head)'s span partials merged in span order with att_merge_n's
 * arithmetic, so the same bits as a merge in one block. A block per (token,
 * head), a thread per dim (hd rounded up to whole warps). The merge's one
 * serial part is each dim's chain A = a fs + A fo: the running max and the
 * factors fo, fs of 32 spans at a time come from a warp's prefix max (the
 * max is exact: the values of the one-by-one merge), and the next 32 spans'
 * values load while these are merged (a 32k token's 1,000 spans had been a
 * chain of loads and exponentials, 150 us a layer). */
__global__ void __launch_bounds__(256) k_att_merge(const float *part, const int32_t *pos, int n_head, int hd,
                                                   int maxs, float *out, act_forms qx)
{
    pdl_begin();
    const int th = blockIdx.x, t = th / n_head, d = threadIdx.x, lane = d & 31, warp = d >> 5;
    const int ns = (pos[t] + CK_ATT_SPAN) / CK_ATT_SPAN;
    if (ns <= 1) return;
    const size_t rs = (size_t)hd + 2;
    const float *pb = part + (size_t)th * maxs * rs;
    const int dd = 2 + min(d, hd - 1);   /* (a lane past hd merges a copy of the last dim) */
    __shared__ float4 fac[8][32];        /* a warp's factors of its chunk: fo (-1: skipped), fs, l */
    float M = -INFINITY, L = 0.f, A = 0.f, cm, cl, ca[32], nm = -INFINITY, nl = 0.f, na[32];
    auto load = [&](int c0, float &m, float &l, float (&a)[32]) {
        const size_t s = (size_t)min(c0 + lane, ns - 1) * rs;
        m = c0 + lane < ns ? pb[s] : -INFINITY;
        l = pb[s + 1];
#pragma unroll
        for (int j = 0; j < 32; j++) a[j] = pb[(size_t)min(c0 + j, ns - 1) * rs + dd];
    };
    load(0, cm, cl, ca);
    for (int c0 = 0; c0 < ns; c0 += 32) {
        if (c0 + 32 < ns) load(c0 + 32, nm, nl, na);
        /* span c0 + lane: att_merge_n skips it unless its max is above -inf;
         * else mn = max(M, m), fo = exp(M - mn), fs = exp(m - mn) */
        const bool live = cm > -INFINITY;
        float x = live ? cm : -INFINITY;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x = fmaxf(x, y);
        }
        const float before = __shfl_up_sync(0xffffffffu, x, 1);
        const float mp = lane ? fmaxf(M, before) : M, mn = fmaxf(mp, x);
        fac[warp][lane] = make_float4(live ? expf(mp - mn) : -1.f, live ? expf(cm - mn) : 0.f, cl, 0.f);
        M = fmaxf(M, __shfl_sync(0xffffffffu, x, 31));
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const float4 f = fac[warp][j];
            if (c0 + j < ns && f.x != -1.f) {
                L = __fmaf_rn(f.z, f.y, __fmul_rn(L, f.x));
                A = __fmaf_rn(ca[j], f.y, __fmul_rn(A, f.x));
            }
        }
        __syncwarp();   /* (fac is the next chunk's) */
        cm = nm; cl = nl;
#pragma unroll
        for (int j = 0; j < 32; j++) ca[j] = na[j];
    }
    if (d < hd) att_put_out(A / L, (size_t)th * hd + d, lane, out, qx);
}

/* ---------------- attention_ex ----------------
 * Attention with a sliding window, sinks and a given scale (be_attn_ex): a
 * block of ATT_EX_WARPS warps per (token, head), so that a decode step's
 * few blocks still spread a long context over many warps. Warp w takes
 * the spans of 32 positions w, w + ATT_EX_WARPS, ..: lane j scores
 * position p0+j alone (its K row in 16-byte loads, q from shared memory),
 * then one online softmax step per span and V rows read whole (lanes hold
 * dims lane, lane+32, ..). The warps' (max, sum, accumulator) are merged
 * in warp order. A sink starts warp 0's running (max, sum) at (sink, 1).
 * q is rounded to f16 with an f16 cache, as the CPU does. head_dim <=
 * 32*ND. A token's result depends on its own positions only. */
#define ATT_EX_WARPS 16
template <int ND, int F16>
__global__ void __launch_bounds__(ATT_EX_WARPS * 32)
    k_att_ex(const float *q, const void *kc, const void *vc, const int32_t *pos, const int32_t *off,
             const int32_t *pages, int T, int n_head, int n_head_kv, int hd, int window, const float *sinks,
             float scale, float *out)
{
    pdl_begin();
    const int th = blockIdx.x, wp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = th / n_head, h = th % n_head, kvh = h / (n_head / n_head_kv);
    const size_t kvd = (size_t)n_head_kv * hd, kvo = (size_t)kvh * hd;
    const float *qt = q + (size_t)th * hd;
    __shared__ __align__(16) float qs[32 * ND];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = qt[d];
        qs[d] = F16 == 1 ? __half2float(__float2half_rn(v)) : v;
    }
    float acc[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) acc[i] = 0.f;
    __syncthreads();
    /* a lane's K row in 16-byte loads (all in flight at once), where rows
     * are 16-byte aligned */
    const int vec = hd % (F16 ? 8 : 4) == 0;
    float M = sinks && wp == 0 ? sinks[h] : -INFINITY, L = sinks && wp == 0 ? 1.f : 0.f;
    const int p = pos[t], first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    for (int p0 = first + 32 * wp; p0 <= p; p0 += 32 * ATT_EX_WARPS) {
        const int n = p - p0 + 1 < 32 ? p - p0 + 1 : 32;
        /* lane j: the cache row of position p0 + j, its score, and the row
         * for the value loop */
        const size_t row = lane < n ? kv_slot(off, pages, t, p0 + lane) * kvd + kvo : 0;
        float sc = -INFINITY;
        if (lane < n) {
            float dot = 0.f;
            if (F16 == CK_KV_Q8_0) {   /* (hd % 32 == 0: whole blocks, in 8-value pieces) */
#pragma unroll 4
                for (int c = 0; c < hd / 8; c++) {
                    float x[8];
                    att_load<8, CK_KV_Q8_0>(kc, row + 8 * c, 8, true, x);
#pragma unroll
                    for (int k = 0; k < 8; k++) dot = __fmaf_rn(qs[8 * c + k], x[k], dot);
                }
            } else if (F16 && vec) {
                const uint4 *kr = (const uint4 *)((const __half *)kc + row);
#pragma unroll 4
                for (int c = 0; c < hd / 8; c++) {
                    const uint4 u = kr[c];
                    const uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float2 f = __half22float2(u2h(w[k]));
                        dot = __fmaf_rn(qs[8 * c + 2 * k], f.x, dot);
                        dot = __fmaf_rn(qs[8 * c + 2 * k + 1], f.y, dot);
                    }
                }
            } else if (F16 == 0 && vec) {
                const float4 *kr = (const float4 *)((const float *)kc + row);
#pragma unroll 4
                for (int c = 0; c < hd / 4; c++) {
                    const float4 f = kr[c];
                    dot = __fmaf_rn(qs[4 * c], f.x, dot);
                    dot = __fmaf_rn(qs[4 * c + 1], f.y, dot);
                    dot = __fmaf_rn(qs[4 * c + 2], f.z, dot);
                    dot = __fmaf_rn(qs[4 * c + 3], f.w, dot);
                }
            } else {
                for (int d = 0; d < hd; d++) {
                    dot = __fmaf_rn(qs[d], att_ld1<F16>(kc, row + d), dot);
                }
            }
            sc = dot * scale;
        }
        float m = sc;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float mn = fmaxf(M, m), fo = expf(M - mn);
        const float e = lane < n ? expf(sc - mn) : 0.f;
        float l = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        L = L * fo + l;
#pragma unroll
        for (int i = 0; i < ND; i++) acc[i] *= fo;
#pragma unroll 8
        for (int j = 0; j < n; j++) {
            const float ej = __shfl_sync(0xffffffffu, e, j);
            const size_t base = __shfl_sync(0xffffffffu, row, j);
#pragma unroll
            for (int i = 0; i < ND; i++) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] = __fmaf_rn(ej, att_ld1<F16>(vc, base + d), acc[i]);
            }
        }
        M = mn;
    }
    __shared__ float sm_m[ATT_EX_WARPS], sm_l[ATT_EX_WARPS], sm_a[ATT_EX_WARPS][32 * ND];
    if (lane == 0) { sm_m[wp] = M; sm_l[wp] = L; }
#pragma unroll
    for (int i = 0; i < ND; i++) sm_a[wp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (wp) return;
    float mx = sm_m[0];
    for (int w = 1; w < ATT_EX_WARPS; w++) mx = fmaxf(mx, sm_m[w]);
    float lt = 0.f, at[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) at[i] = 0.f;
    for (int w = 0; w < ATT_EX_WARPS; w++) {
        const float f = sm_m[w] == -INFINITY ? 0.f : expf(sm_m[w] - mx);
        lt = __fmaf_rn(sm_l[w], f, lt);
#pragma unroll
        for (int i = 0; i < ND; i++) at[i] = __fmaf_rn(sm_a[w][lane + 32 * i], f, at[i]);
    }
    float *o = out + (size_t)th * hd;
#pragma unroll
    for (int i = 0; i < ND; i++)
        if (lane + 32 * i < hd) o[lane + 32 * i] = at[i] / lt;
}

extern "C" {

int ck_att_grp_ok(int f16, int n_head, int n_head_kv, int hd)
{
    const int eb = f16 == 1 ? 2 : 4;
    if (n_head_kv < 1 || n_head % n_head_kv || n_head / n_head_kv < 2 || n_head / n_head_kv > 8) return 0;
    if (f16 == CK_KV_Q8_0 ? hd % 64 || hd > 128 : hd > 256 || hd * eb > 512 || (hd * eb) % 16) return 0;
    static unsigned attr = 0;   /* (64 KiB of dynamic shared memory at most, once a device) */
    if (ck_first_on_device(&attr)) {
        int b = 64 << 10;
        cudaFuncSetAttribute(k_att_grp<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<2, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<4, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<8, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<2, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<4, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<8, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<1, CK_KV_Q8_0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<2, CK_KV_Q8_0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<4, CK_KV_Q8_0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<8, CK_KV_Q8_0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        if ((int)ATT_MMA_SMEM(64) <= ck_feat_now()->smem_optin)
            cudaFuncSetAttribute(k_att_mma<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ATT_MMA_SMEM(64));
        if ((int)ATT_MMA_SMEM(128) <= ck_feat_now()->smem_optin)
            cudaFuncSetAttribute(k_att_mma<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ATT_MMA_SMEM(128));
    }
    return 1;
}

int ck_att_mma_ok(int f16, int n_head, int n_head_kv, int hd)
{
    /* (head_dim 128's stages need 136 KiB of shared memory: 8.0 and 9.0
     * devices have it, 8.6, 8.9 and 12.x not) */
    return f16 == 1 && (hd == 64 || hd == 128) && (int)(hd == 64 ? ATT_MMA_SMEM(64) : ATT_MMA_SMEM(128)) <= ck_feat_now()->smem_optin &&
           ck_att_grp_ok(f16, n_head, n_head_kv, hd);
}

/* The block's warps on each span together (att_coop): for head_dim 32 *
 * ATT_WARPS, in the direct path for tokens of up to 4 spans (one round of
 * the warps' spans) and in every split */
int ck_att_coop(int hd)
{
    return hd == 32 * ATT_WARPS ? 4 : 0;
}

/* Groups of a k_att_par block (spans at a time) */
#define ATT_PAR_G 4

/* Tokens of up to this many spans, in launches of at most one block per
 * SM, go through k_att_par without a split over blocks */
int ck_att_par(int hd)
{
    return hd == 32 * ATT_WARPS ? 8 : 0;
}

/* A launch macro M(F) or M(ND, F) for the cache type f16 (F: 0 f32, 1
 * f16, CK_KV_Q8_0) and, with ATT_LAUNCH, nd values of head_dim a lane (ND
 * 1, 2, 4 or 8): each kernel is instantiated for these */
#define ATT_KV(M, f16)                                    \
    do {                                                  \
        if ((f16) == CK_KV_Q8_0) M(CK_KV_Q8_0);           \
        else if (f16) M(1);                               \
        else M(0);                                        \
    } while (0)
#define ATT_KV_ND(M, ND, f16)                             \
    do {                                                  \
        if ((f16) == CK_KV_Q8_0) M(ND, CK_KV_Q8_0);       \
        else if (f16) M(ND, 1);                           \
        else M(ND, 0);                                    \
    } while (0)
#define ATT_LAUNCH(M, nd, f16)                            \
    do {                                                  \
        if ((nd) <= 1) ATT_KV_ND(M, 1, f16);              \
        else if ((nd) <= 2) ATT_KV_ND(M, 2, f16);         \
        else if ((nd) <= 4) ATT_KV_ND(M, 4, f16);         \
        else ATT_KV_ND(M, 8, f16);                        \
    } while (0)

void ck_attention(cudaStream_t st, const float *q, const void *kc, const void *vc, int f16, const int32_t *pos,
                  const int32_t *off, const int32_t *pages, int T, int T_all, int n_head, int n_head_kv, int hd,
                  float *out, float *part, int G, int maxs, void *xq, void *x16, int n_sm, const ck_rope_in *rp,
                  int grp, int mma)
{
    if (G < 1 || maxs < 1) G = 1;
    int nd = (hd + 31) / 32;
    if (grp > 0 && !rp && ck_att_grp_ok(f16, n_head, n_head_kv, hd)) {
        act_forms L = act_forms_for(hd % 32 == 0 ? xq : NULL, x16, T_all, n_head * hd);
        dim3 g(T * n_head_kv, grp);
        if (mma && ck_att_mma_ok(f16, n_head, n_head_kv, hd)) {
            const __half *k16 = (const __half *)kc, *v16 = (const __half *)vc;
            if (hd == 64)
                lk(k_att_mma<64>, g, ATT_MMA_WARPS * 32, ATT_MMA_SMEM(64), st, q, k16, v16, pos, off, pages, n_head, n_head_kv,
                   out, part, grp, maxs, L);
            else
                lk(k_att_mma<128>, g, ATT_MMA_WARPS * 32, ATT_MMA_SMEM(128), st, q, k16, v16, pos, off, pages, n_head,
                   n_head_kv, out, part, grp, maxs, L);
            if (grp > 1) lk(k_att_merge, T * n_head, (hd + 31) & ~31, 0, st, part, pos, n_head, hd, maxs, out, L);
            return;
        }
        int bs = n_head / n_head_kv * 32;
        /* (q8_0: the blocks' two stages, then one f32 stage they are dequantized into) */
        size_t sm = f16 == CK_KV_Q8_0 ? (size_t)4 * 32 * (hd / 32 * CK_KV_Q8_BLOCK) + (size_t)2 * 32 * hd * 4
                                      : (size_t)4 * 32 * hd * (f16 ? 2 : 4);
#define L_GRP2(ND, F)                                                                                          \
    lk(k_att_grp<ND, F>, g, bs, sm, st, q, kc, vc, pos, off, pages, n_head, n_head_kv, hd, out, part, grp,     \
       maxs, L)
        ATT_LAUNCH(L_GRP2, nd, f16);
#undef L_GRP2
        if (grp > 1) lk(k_att_merge, T * n_head, (hd + 31) & ~31, 0, st, part, pos, n_head, hd, maxs, out, L);
        return;
    }
    att_rope R;
    memset(&R, 0, sizeof R);
    if (rp) {
        R.k = rp->k; R.v = rp->v; R.bq = rp->bq; R.bk = rp->bk; R.bv = rp->bv;
        R.tab = (const float2 *)rp->tab; R.kc = (void *)kc; R.vc = (void *)vc; R.n_rot = rp->n_rot; R.neox = rp->neox;
    }
    act_forms L = act_forms_for(hd % 32 == 0 ? xq : NULL, x16, T_all, n_head * hd);
    dim3 g(T * n_head, G);
    /* rolled span loops for launches of fewer blocks than SMs */
    bool roll = (int)(g.x * g.y) < n_sm;
    int coop = ck_att_coop(hd);
    if (G == 1 && !rp && ck_att_par(hd) && T * n_head <= n_sm) {
#define L_PAR(F)                                                                                               \
    lk(k_att_par<ATT_WARPS, F, ATT_PAR_G>, g, ATT_PAR_G * ATT_WARPS * 32, 0, st, q, kc, vc, pos, off, pages,  \
       n_head, n_head_kv, out, L)
        ATT_KV(L_PAR, f16);
#undef L_PAR
        return;
    }
#define L_ATT2(ND, F16)                                                                                        \
    do {                                                                                                       \
        if (roll) lk(k_attention<ND, F16, 1>, g, ATT_WARPS * 32, ATT_WARPS * 32 * 33 * 4, st, q, kc, vc, pos,   \
                     off, pages, n_head, n_head_kv, hd, out, part, G, maxs, L, R, coop);                       \
        else lk(k_attention<ND, F16, 0>, g, ATT_WARPS * 32, 0, st, q, kc, vc, pos, off, pages, n_head,         \
                n_head_kv, hd, out, part, G, maxs, L, R, coop);                                                \
    } while (0)
    ATT_LAUNCH(L_ATT2, nd, f16);
#undef L_ATT2
    if (G > 1) lk(k_att_merge, T * n_head, (hd + 31) & ~31, 0, st, part, pos, n_head, hd, maxs, out, L);
}

void ck_attention_ex(cudaStream_t st, const float *q, const void *kc, const void *vc, int f16, const int32_t *pos,
                     const int32_t *off, const int32_t *pages, int T, int n_head, int n_head_kv, int hd, int window,
                     const float *sinks, float scale, float *out)
{
    unsigned g = (unsigned)(T * n_head);
#define L_EX2(ND, F)                                                                                           \
    lk(k_att_ex<ND, F>, g, ATT_EX_WARPS * 32, 0, st, q, kc, vc, pos, off, pages, T, n_head, n_head_kv, hd,    \
       window, sinks, scale, out)
    ATT_LAUNCH(L_EX2, (hd + 31) / 32, f16);
#undef L_EX2
}

}  /* extern "C" */
