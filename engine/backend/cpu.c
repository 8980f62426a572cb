/* cpu.c — the CPU backend: the reference every other backend is
 * tested against, and a fast path of its own through qtypes' SIMD kernels and
 * the thread pool. Scratch buffers grow to the largest batch seen and are
 * then reused, so steady-state decoding never allocates. */
#include "engine/backend/backend.h"
#include "engine/backend/cpu_moe.h"
#include "engine/backend/cpu_ssm.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct cpu_be {
    be base;
    pool *pool;
    void *act;            /* quantized activations */
    size_t act_cap;
    int simd;             /* attention and silu through AVX2/F16C/FMA (be_cpu_scalar turns off) */
    /* rope: cos/sin per (position, pair), computed once per position and
     * reused by every head, layer and later batch; grows by doubling. */
    float *rope_tab;      /* [rope_n][half][2] */
    int rope_n, rope_half;
    float rope_base;
    const float *rope_fd;
    float rope_fdv[513];  /* the divisors (and YaRN factor) the table was made with */
    void *scratch;        /* be_cpu_scratch */
    size_t scratch_cap;
    float *att_buf;       /* the AVX2 attention's buffers, one per pool thread */
    size_t att_cap;       /* (floats) */
    long moe_ties;        /* be_cpu_moe_ties */
    int repack;           /* be_cpu_repack */
    void **own;           /* the weights' repacked copies (cpu_weight_prepare), freed at close */
    int n_own, cap_own;
    struct cpu_group *grp; int rank;   /* a tensor-parallel group (cpu_group_join), or NULL */
} cpu_be;

/* Ranks of a group meet at the barrier: each publishes its x, then sums a
 * slice of every x over the ranks in rank order and writes it back to all,
 * then they meet again so that no rank moves on while another still reads. */
typedef struct cpu_group {
    int n, refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a hand-over's box filled or emptied */
    pthread_barrier_t bar;
    const float **box;           /* [n] send's x for rank i, until its recv has copied it */
    size_t *box_n;
    float *x[];
} cpu_group;

/* Large buffers (the KV pool's layers) are anonymous mappings: zero pages
 * that take memory only once written, so a pool sized for many sequences
 * costs what they hold. A 64-byte header before each block says how it was
 * taken. */
#define CPU_MAP_MIN ((size_t)1 << 20)
#define CPU_HDR 64

/* huge: in 2 MiB pages where the kernel allows (weights read whole every
 * token; not the KV pool, where that would commit 2 MiB per page touched) */
static void *cpu_take(size_t n, int huge)
{
    uint8_t *p;
    if (n >= CPU_MAP_MIN) {
        void *m = mmap(NULL, n + CPU_HDR, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
        if (huge) madvise(m, n + CPU_HDR, MADV_HUGEPAGE);   /* (a hint: 4 KiB pages if refused) */
#else
        (void)huge;
#endif
        p = m;
    } else {
        void *a = NULL;
        if (posix_memalign(&a, 64, n + CPU_HDR)) return NULL;
        p = a;
        memset(p, 0, n + CPU_HDR);
    }
    memcpy(p, &n, sizeof n);
    return p + CPU_HDR;
}

static void *cpu_alloc(be *b, size_t n)
{
    (void)b;
    return cpu_take(n, 0);
}

static void cpu_free(be *b, void *q)
{
    (void)b;
    if (!q) return;
    uint8_t *p = (uint8_t *)q - CPU_HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    if (n >= CPU_MAP_MIN) munmap(p, n + CPU_HDR);
    else free(p);
}
/* a weight's rows packed on the pool, PACK_ROWS an item */
#define PACK_ROWS 256
typedef struct pack_job { const wt *w; void *dst; } pack_job;

static void pack_rows(void *arg, int i, int ith)
{
    (void)ith;
    const pack_job *j = arg;
    int64_t r0 = (int64_t)i * PACK_ROWS, r1 = r0 + PACK_ROWS < j->w->n_out ? r0 + PACK_ROWS : j->w->n_out;
    qt_x8_pack(j->w->type, j->w->data, j->w->row_bytes, j->w->n_in, r0, r1, j->dst);
}

/* Matrices in 8-row groups (quant/x8.c) where they beat the GGUF-layout
 * kernels (docs/benchmarks.md): q4_K and q8_0 on AVX2, AVX-512 (its VNNI
 * tiles) and AMX (whose prompt tiles read the layout), q6_K on AVX-512
 * (qt_x8_bytes says which). A copy at
 * w->pack, in 2 MiB pages where allowed, that mm_rows reads instead of the
 * file's bytes, counted in own_bytes.
 * Without memory for it the matrix keeps the GGUF layout. */
static int cpu_weight_prepare(be *b, wt *w)
{
    cpu_be *c = (cpu_be *)b;
    size_t n = 0;
    const qt_isa isa = qt_isa_get();
    if (c->repack && w->n_mat <= 1 && !w->lookup && (isa == QT_ISA_AVX2 || isa == QT_ISA_AVX512 || isa == QT_ISA_AMX))
        n = qt_x8_bytes(w->type, w->n_in, w->n_out);
    if (!n) return 0;
    if (c->n_own == c->cap_own) {
        int cap = c->cap_own ? 2 * c->cap_own : 64;
        void **o = realloc(c->own, (size_t)cap * sizeof *o);
        if (!o) return 0;
        c->own = o;
        c->cap_own = cap;
    }
    void *p = cpu_take(n, 1);
    if (!p) return 0;
    pack_job j = { w, p };
    pool_run(c->pool, pack_rows, &j, (int)((w->n_out + PACK_ROWS - 1) / PACK_ROWS));
    c->own[c->n_own++] = p;
    c->base.own_bytes += n;
    w->pack = p;
    return 0;
}
static void cpu_copy(be *b, void *dst, const void *src, size_t n) { (void)b; memcpy(dst, src, n); }
static void cpu_sync(be *b) { (void)b; }

static void cpu_close(be *b)
{
    cpu_be *c = (cpu_be *)b;
    if (!c) return;
    free(c->act);
    free(c->rope_tab);
    free(c->scratch);
    free(c->att_buf);
    for (int i = 0; i < c->n_own; i++) cpu_free(b, c->own[i]);
    free(c->own);
    if (c->grp) {
        cpu_group *g = c->grp;
        pthread_mutex_lock(&g->mu);
        int last = --g->refs == 0;
        pthread_mutex_unlock(&g->mu);
        if (last) {
            pthread_barrier_destroy(&g->bar);
            pthread_cond_destroy(&g->cv);
            pthread_mutex_destroy(&g->mu);
            free(g->box);
            free(g->box_n);
            free(g);
        }
    }
    free(c);
}

static int cpu_group_join(be *const *bs, int n, char *err, size_t errlen)
{
    cpu_group *g = calloc(1, sizeof *g + (size_t)n * sizeof g->x[0]);
    if (g) {
        g->box = calloc((size_t)n, sizeof *g->box);
        g->box_n = calloc((size_t)n, sizeof *g->box_n);
    }
    if (!g || !g->box || !g->box_n || pthread_barrier_init(&g->bar, NULL, (unsigned)n)) {
        if (g) { free(g->box); free(g->box_n); }
        free(g);
        snprintf(err, errlen, "cannot set up a group of %d CPU backends", n);
        return -1;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->n = g->refs = n;
    for (int r = 0; r < n; r++) {
        ((cpu_be *)bs[r])->grp = g;
        ((cpu_be *)bs[r])->rank = r;
    }
    return 0;
}

/* A hand-over waits until the receiver has copied x (x stays the
 * sender's), as the CPU's ops finish before they return. */
static void cpu_send(be *b, const float *x, size_t n, int to)
{
    cpu_group *g = ((cpu_be *)b)->grp;
    if (!g || to < 0 || to >= g->n) return;
    pthread_mutex_lock(&g->mu);
    while (g->box[to]) pthread_cond_wait(&g->cv, &g->mu);
    g->box[to] = x;
    g->box_n[to] = n;
    pthread_cond_broadcast(&g->cv);
    while (g->box[to] == x) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void cpu_recv(be *b, float *x, size_t n, int from)
{
    cpu_be *c = (cpu_be *)b;
    cpu_group *g = c->grp;
    (void)from;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    while (!g->box[c->rank]) pthread_cond_wait(&g->cv, &g->mu);
    memcpy(x, g->box[c->rank], (n < g->box_n[c->rank] ? n : g->box_n[c->rank]) * sizeof *x);
    g->box[c->rank] = NULL;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void cpu_allreduce(be *b, float *x, size_t n)
{
    cpu_be *c = (cpu_be *)b;
    cpu_group *g = c->grp;
    if (!g) return;
    g->x[c->rank] = x;
    pthread_barrier_wait(&g->bar);
    size_t i0 = n * (size_t)c->rank / (size_t)g->n, i1 = n * (size_t)(c->rank + 1) / (size_t)g->n;
    for (size_t i = i0; i < i1; i++) {
        float s = g->x[0][i];
        for (int r = 1; r < g->n; r++) s += g->x[r][i];
        for (int r = 0; r < g->n; r++) g->x[r][i] = s;
    }
    pthread_barrier_wait(&g->bar);
}

static void cpu_embed(be *b, const wt *emb, const int32_t *ids, int T, float *out)
{
    (void)b;
    for (int t = 0; t < T; t++) wt_row_f32(emb, ids[t], out + (size_t)t * emb->n_in);
}

/* Row-wise ops of a prompt batch (norms, rope, KV stores) on the pool, rows
 * of about ROW_ELEMS values an item: a row's result is the same whichever
 * thread makes it, and on many cores these ops, run by one thread, were a
 * serial part of every layer. */
#define ROW_ELEMS 4096
typedef struct row_job {
    void (*row)(const void *ctx, int r);
    const void *ctx;   /* the op's own arguments */
    int rows, per;
} row_job;

static void rows_part(void *arg, int it, int ith)
{
    (void)ith;
    const row_job *j = arg;
    const int r1 = (it + 1) * j->per < j->rows ? (it + 1) * j->per : j->rows;
    for (int r = it * j->per; r < r1; r++) j->row(j->ctx, r);
}

/* rows of n values each */
static void rows_run(be *b, void (*row)(const void *, int), const void *ctx, int rows, int n)
{
    row_job j = { row, ctx, rows, n >= ROW_ELEMS || n <= 0 ? 1 : ROW_ELEMS / n };
    pool_run(((cpu_be *)b)->pool, rows_part, &j, (j.rows + j.per - 1) / j.per);
}

typedef struct norm_ctx {
    const float *x, *w, *bias;
    float *out;
    int n;
    float eps;
} norm_ctx;

static void rms_row(const void *ctx, int r)
{
    const norm_ctx *j = ctx;
    const int n = j->n;
    const float *xr = j->x + (size_t)r * n;
    float *o = j->out + (size_t)r * n;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
    float scale = (float)(1.0 / sqrt(ss / n + j->eps));
    for (int i = 0; i < n; i++) o[i] = xr[i] * scale * j->w[i];
}

static void cpu_rmsnorm(be *b, const float *x, const wt *wv, int rows, int n, float eps, float *out)
{
    norm_ctx j = { .x = x, .w = wv->data, .out = out, .n = n, .eps = eps };
    rows_run(b, rms_row, &j, rows, n);
}

/* matmul: activations are quantized once (per row, in parallel), then row
 * chunks of W are dotted against every activation row. Several weights that
 * read the same input (Q/K/V, gate/up) share the quantized activations and
 * one pool_run: their chunks form one list of work items. */
#define MM_MAXW 4

typedef struct mm_job {
    int nw;
    const wt *w[MM_MAXW];
    const float *bias[MM_MAXW];
    float *out[MM_MAXW];
    int64_t chunk[MM_MAXW];
    int first[MM_MAXW + 1];   /* first work item of each weight */
    const float *x;
    int T;
    int64_t n_in;
    void *act;
    size_t act_stride;
    uint32_t act_type;
} mm_job;

static void mm_quant(void *arg, int t, int ith)
{
    (void)ith;
    mm_job *j = arg;
    qt_quantize_row(j->act_type, j->x + (size_t)t * j->n_in, (char *)j->act + (size_t)t * j->act_stride, j->n_in);
}

static void mm_rows(void *arg, int i, int ith)
{
    (void)ith;
    mm_job *j = arg;
    int k = 0;
    while (i >= j->first[k + 1]) k++;
    const wt *w = j->w[k];
    int64_t r0 = (int64_t)(i - j->first[k]) * j->chunk[k], r1 = r0 + j->chunk[k];
    if (r1 > w->n_out) r1 = w->n_out;
    float *out = j->out[k];
    int done = -1;
    if (w->pack) done = qt_x8_gemm(w->type, w->n_in, w->pack, r0, r1, j->act, j->act_stride, j->T, out, w->n_out);
    if (done)
        qt_gemm(w->type, w->n_in, w->data, w->row_bytes, r0, r1, j->act, j->act_stride, j->T, out, w->n_out);
    if (j->bias[k])
        for (int t = 0; t < j->T; t++) {
            float *o = out + (size_t)t * w->n_out;
            for (int64_t r = r0; r < r1; r++) o[r] += j->bias[k][r];
        }
}

static void cpu_matmul_n(be *b, int n, const wt *const *w, const wt *const *bias, const float *x, int T,
                         float *const *out)
{
    cpu_be *c = (cpu_be *)b;
    if (n > 1) {
        /* one shared pass needs one activation format */
        int same = n <= MM_MAXW;
        for (int k = 1; k < n && same; k++)
            same = w[k]->n_in == w[0]->n_in && qt_act_type(w[k]->type) == qt_act_type(w[0]->type);
        if (!same) {
            for (int k = 0; k < n; k++) cpu_matmul_n(b, 1, &w[k], &bias[k], x, T, &out[k]);
            return;
        }
    }
    mm_job j = { .nw = n, .x = x, .T = T, .n_in = w[0]->n_in };
    j.act_type = qt_act_type(w[0]->type);
    j.act_stride = qt_row_size(j.act_type, w[0]->n_in);
    size_t need = j.act_stride * (size_t)T;
    if (need > c->act_cap) {
        free(c->act);
        c->act = NULL;
        if (posix_memalign(&c->act, 64, need)) { c->act = NULL; c->act_cap = 0; abort(); }
        c->act_cap = need;
    }
    j.act = c->act;
    pool_run(c->pool, mm_quant, &j, T);
    /* chunks: enough for balance across threads, rows a multiple of 16;
     * fewer, larger ones for batches (each chunk prepares the activation
     * rows' scales once, a cost that grows with the batch) */
    int nth = pool_size(c->pool), per = T >= 4 ? 1 : 8;
    j.first[0] = 0;
    for (int k = 0; k < n; k++) {
        j.w[k] = w[k];
        j.bias[k] = bias && bias[k] ? bias[k]->data : NULL;
        j.out[k] = out[k];
        int64_t chunk = w[k]->n_out / (nth * per);
        if (chunk < 16) chunk = 16;
        chunk = (chunk + 15) / 16 * 16;
        j.chunk[k] = chunk;
        j.first[k + 1] = j.first[k] + (int)((w[k]->n_out + chunk - 1) / chunk);
    }
    pool_run(c->pool, mm_rows, &j, j.first[n]);
}

static void cpu_matmul(be *b, const wt *w, const wt *bias, const float *x, int T, float *out)
{
    cpu_matmul_n(b, 1, &w, &bias, x, T, &out);
}

static void cpu_add(be *b, float *x, const float *y, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

typedef struct silu_job { const float *g, *u; float *out; size_t n; } silu_job;
#define SILU_CHUNK 8192

static void silu_part(void *arg, int k, int ith)
{
    (void)ith;
    silu_job *j = arg;
    size_t i0 = (size_t)k * SILU_CHUNK, i1 = i0 + SILU_CHUNK < j->n ? i0 + SILU_CHUNK : j->n;
    const float *g = j->g, *u = j->u;
    float *out = j->out;
    for (size_t i = i0; i < i1; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#if defined(__x86_64__)
#include <immintrin.h>

/* expf on 8 lanes: x = n ln2 + r, |r| <= ln2 / 2, e^r by Cephes' expf
 * polynomial, 2^n into the exponent; within 2 ulp of libm's expf for
 * |x| < 87 (past that the input is clamped: e^x stays finite and tiny or
 * huge, which silu turns into x or -0 as before). */
__attribute__((target("avx2,fma")))
static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n in two factors: n reaches 128 at the top of the range */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i h = _mm256_srai_epi32(ni, 1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

__attribute__((target("avx2,fma")))
static inline __m256 silu_mul8(__m256 g, __m256 u)
{
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* The same on 8 lanes; the tail goes through the same lanes (padded), so a
 * value's result does not depend on its place (batch invariance). */
__attribute__((target("avx2,fma")))
static void silu_part_avx2(void *arg, int k, int ith)
{
    (void)ith;
    silu_job *j = arg;
    size_t i0 = (size_t)k * SILU_CHUNK, i1 = i0 + SILU_CHUNK < j->n ? i0 + SILU_CHUNK : j->n;
    size_t i = i0;
    for (; i + 8 <= i1; i += 8)
        _mm256_storeu_ps(j->out + i, silu_mul8(_mm256_loadu_ps(j->g + i), _mm256_loadu_ps(j->u + i)));
    if (i < i1) {
        float g[8] = { 0 }, u[8] = { 0 }, o[8];
        memcpy(g, j->g + i, (i1 - i) * 4);
        memcpy(u, j->u + i, (i1 - i) * 4);
        _mm256_storeu_ps(o, silu_mul8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        memcpy(j->out + i, o, (i1 - i) * 4);
    }
}
#endif

/* split over the pool in prefill (expf dominates); one chunk runs inline */
static void cpu_silu_mul(be *b, const float *g, const float *u, size_t n, float *out)
{
    cpu_be *c = (cpu_be *)b;
    silu_job j = { g, u, out, n };
    pool_fn fn = silu_part;
#if defined(__x86_64__)
    if (c->simd) fn = silu_part_avx2;
#endif
    pool_run(c->pool, fn, &j, (int)((n + SILU_CHUNK - 1) / SILU_CHUNK));
}

/* gelu with the tanh approximation, as GPT-2 and Gemma define it */
static inline float gelu_tanh(float x)
{
    const float c = 0.7978845608028654f;   /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static void gelu_part(void *arg, int k, int ith)
{
    (void)ith;
    silu_job *j = arg;
    size_t i0 = (size_t)k * SILU_CHUNK, i1 = i0 + SILU_CHUNK < j->n ? i0 + SILU_CHUNK : j->n;
    for (size_t i = i0; i < i1; i++) j->out[i] = j->u ? gelu_tanh(j->g[i]) * j->u[i] : gelu_tanh(j->g[i]);
}

static void cpu_gelu_mul(be *b, const float *x, const float *up, size_t n, float *out)
{
    cpu_be *c = (cpu_be *)b;
    silu_job j = { x, up, out, n };
    pool_run(c->pool, gelu_part, &j, (int)((n + SILU_CHUNK - 1) / SILU_CHUNK));
}

static void ln_row(const void *ctx, int r)
{
    const norm_ctx *j = ctx;
    const int n = j->n;
    const float *xr = j->x + (size_t)r * n;
    float *o = j->out + (size_t)r * n;
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += xr[i];
    double mean = s / n;
    for (int i = 0; i < n; i++) ss += (xr[i] - mean) * (xr[i] - mean);
    float inv = (float)(1.0 / sqrt(ss / n + j->eps)), mf = (float)mean;
    for (int i = 0; i < n; i++) o[i] = (xr[i] - mf) * inv * j->w[i] + (j->bias ? j->bias[i] : 0.0f);
}

static void cpu_layernorm(be *b, const float *x, const wt *wv, const wt *bv, int rows, int n, float eps, float *out)
{
    norm_ctx j = { .x = x, .w = wv->data, .bias = bv && bv->data ? bv->data : NULL, .out = out, .n = n, .eps = eps };
    rows_run(b, ln_row, &j, rows, n);
}

static void cpu_scale(be *b, float *x, size_t n, float s)
{
    (void)b;
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_add_pos(be *b, float *x, const wt *table, const be_batch *bt, int n)
{
    float *row = be_cpu_scratch(b, (size_t)n * 4);
    for (int t = 0; t < bt->T; t++) {
        wt_row_f32(table, bt->pos[t], row);
        float *xt = x + (size_t)t * n;
        for (int i = 0; i < n; i++) xt[i] += row[i];
    }
}

typedef struct rope_ctx {
    float *x;
    const float *tab;   /* cos, sin by position and pair */
    const be_batch *bt;
    int n_heads, head_dim, half, neox;
} rope_ctx;

static void rope_row(const void *ctx, int t)
{
    const rope_ctx *j = ctx;
    const int half = j->half;
    const float *cs = j->tab + (size_t)j->bt->pos[t] * half * 2;
    for (int h = 0; h < j->n_heads; h++) {
        float *v = j->x + ((size_t)t * j->n_heads + h) * j->head_dim;
        if (j->neox) {
            for (int i = 0; i < half; i++) {
                float a = v[i], d = v[i + half];
                v[i] = a * cs[2 * i] - d * cs[2 * i + 1];
                v[i + half] = a * cs[2 * i + 1] + d * cs[2 * i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                float a = v[2 * i], d = v[2 * i + 1];
                v[2 * i] = a * cs[2 * i] - d * cs[2 * i + 1];
                v[2 * i + 1] = a * cs[2 * i + 1] + d * cs[2 * i];
            }
        }
    }
}

static void cpu_rope(be *b, float *x, const be_batch *bt, int n_heads, int head_dim, int n_rot,
                     float base, int neox, const wt *fd)
{
    cpu_be *c = (cpu_be *)b;
    const float *freq_div = fd ? fd->data : NULL;
    int half = n_rot / 2;
    /* YaRN: a divisor table one longer, its last value the cos/sin scale */
    double ms = freq_div && fd->n_in > half ? freq_div[half] : 1.0;
    int maxp = 0;
    for (int t = 0; t < bt->T; t++)
        if (bt->pos[t] > maxp) maxp = bt->pos[t];
    int n_fd = freq_div ? (fd->n_in > half ? half + 1 : half) : 0;
    if (n_fd > 513) abort();   /* (head sizes are at most 1024) */
    if (c->rope_half != half || c->rope_base != base || c->rope_fd != freq_div ||
        (n_fd && memcmp(c->rope_fdv, freq_div, (size_t)n_fd * 4)))
        c->rope_n = 0;
    if (maxp >= c->rope_n) {
        int n = c->rope_n ? c->rope_n : 256;
        while (n <= maxp) n *= 2;
        float *tab = realloc(c->rope_tab, (size_t)n * half * 2 * sizeof *tab);
        if (!tab) abort();
        /* same expression as before the table: results are unchanged */
        for (int p = c->rope_n; p < n; p++)
            for (int i = 0; i < half; i++) {
                double theta = (double)p * pow((double)base, -2.0 * i / n_rot);
                if (freq_div) theta /= freq_div[i];
                tab[((size_t)p * half + i) * 2] = (float)(cos(theta) * ms);
                tab[((size_t)p * half + i) * 2 + 1] = (float)(sin(theta) * ms);
            }
        c->rope_tab = tab;
        c->rope_n = n;
        c->rope_half = half;
        c->rope_base = base;
        c->rope_fd = freq_div;
        if (n_fd) memcpy(c->rope_fdv, freq_div, (size_t)n_fd * 4);
    }
    rope_ctx j = { .x = x, .tab = c->rope_tab, .bt = bt, .n_heads = n_heads, .head_dim = head_dim, .half = half,
                   .neox = neox };
    rows_run(b, rope_row, &j, bt->T, n_heads * head_dim);
}

static inline size_t kv_slot(const be_batch *bt, int t, int pos)
{
    if (bt->ring) return (size_t)bt->slot[t] * (size_t)bt->ring + (size_t)(pos % bt->ring);
    return (size_t)bt->pages[t][pos / KV_PAGE] * KV_PAGE + (size_t)(pos % KV_PAGE);
}

/* A q8_0 cache's head kvh of (token t, position pos): hd / 32 blocks */
static inline const void *kv_q8_at(const void *c, const be_batch *bt, int t, int pos, int kvd, int kvh, int hd)
{
    return (const uint8_t *)c + kv_slot(bt, t, pos) * be_kv_bytes(BE_KV_Q8_0, (size_t)kvd) +
           be_kv_bytes(BE_KV_Q8_0, (size_t)kvh * hd);
}

typedef struct kv_ctx {
    void *kc, *vc;
    const float *k, *v;
    const be_batch *bt;
    int kv_dim, kv_type;
} kv_ctx;

static void kv_row(const void *ctx, int t)
{
    const kv_ctx *j = ctx;
    const int kv_dim = j->kv_dim;
    size_t s = kv_slot(j->bt, t, j->bt->pos[t]) * (size_t)kv_dim;
    const float *kt = j->k + (size_t)t * kv_dim, *vt = j->v + (size_t)t * kv_dim;
    if (j->kv_type == BE_KV_Q8_0) {   /* ggml's q8_0 blocks (the reference quantizer) */
        size_t o = be_kv_bytes(BE_KV_Q8_0, s);
        qt_quantize_row_ref(QT_Q8_0, kt, (uint8_t *)j->kc + o, kv_dim);
        qt_quantize_row_ref(QT_Q8_0, vt, (uint8_t *)j->vc + o, kv_dim);
    } else if (j->kv_type == BE_KV_F16) {
        uint16_t *kd = (uint16_t *)j->kc + s, *vd = (uint16_t *)j->vc + s;
        for (int i = 0; i < kv_dim; i++) { kd[i] = qt_fp32_to_fp16(kt[i]); vd[i] = qt_fp32_to_fp16(vt[i]); }
    } else {
        memcpy((float *)j->kc + s, kt, (size_t)kv_dim * 4);
        memcpy((float *)j->vc + s, vt, (size_t)kv_dim * 4);
    }
}

static void cpu_kv_store(be *b, void *kc, void *vc, const be_batch *bt, int kv_dim, const float *k, const float *v)
{
    kv_ctx j = { .kc = kc, .vc = vc, .k = k, .v = v, .bt = bt, .kv_dim = kv_dim, .kv_type = b->kv_type };
    rows_run(b, kv_row, &j, bt->T, kv_dim);
}

typedef struct att_job {
    const be *b;
    const float *q;
    const void *kc, *vc;
    const be_batch *bt;
    int n_head, n_head_kv, head_dim;
    float *out;
    int simd;                 /* use the AVX2 version */
    int grouped;              /* its items: (token, KV head) */
    int window;               /* be_attn_ex's */
    const float *sinks;       /* [n_head], or NULL */
    float scale;
    float *buf;               /* the AVX2 version's buffers: stride floats per pool thread */
    size_t stride;
} att_job;

/* The first position token t sees, and the softmax's starting max and sum:
 * a sink is a logit with no value, so the sum starts at exp(sink - sink). */
static inline int att_first(const att_job *j, int t)
{
    int p = j->bt->pos[t];
    return j->window > 0 && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
}

/* One (token, head): online softmax over the sequence's cached keys, in
 * chunks of ATT_CHUNK keys (scores of a chunk first, then one rescale). This
 * scalar version is the reference for the SIMD one below. */
#define ATT_CHUNK 32

/* How many keys from position p0 on the chunk takes (up to token t's own;
 * 0 or less: none left). */
static inline int att_chunk(const att_job *j, int t, int p0)
{
    int n = j->bt->pos[t] + 1 - p0;
    return n < ATT_CHUNK ? n : ATT_CHUNK;
}

static void att_one_ref(att_job *j, int t, int h)
{
    int hd = j->head_dim, kvd = j->n_head_kv * hd;
    int kvh = h / (j->n_head / j->n_head_kv);
    const float *q0 = j->q + ((size_t)t * j->n_head + h) * hd;
    float *o = j->out + ((size_t)t * j->n_head + h) * hd;
    float acc[1024], qr[1024], sc[ATT_CHUNK], kq[1024];
    int f16 = j->b->kv_type == BE_KV_F16, q8 = j->b->kv_type == BE_KV_Q8_0;
    /* with an f16 cache, q·k is an f16 dot product (q rounded like the keys),
     * as in llama.cpp; it keeps quantized models within hundredths of it */
    for (int d = 0; d < hd; d++) {
        qr[d] = f16 ? qt_fp16_to_fp32(qt_fp32_to_fp16(q0[d])) : q0[d];
        acc[d] = 0;
    }
    float mx = j->sinks ? j->sinks[h] : -INFINITY, sum = j->sinks ? 1 : 0, scale = j->scale;
    for (int p0 = att_first(j, t), m; (m = att_chunk(j, t, p0)) > 0; p0 += m) {
        float cmx = -INFINITY;
        for (int i = 0; i < m; i++) {
            size_t s = kv_slot(j->bt, t, p0 + i) * (size_t)kvd + (size_t)kvh * hd;
            float dot = 0;
            if (q8) {   /* (q stays f32: the keys' blocks dequantized) */
                qt_dequant_row(QT_Q8_0, kv_q8_at(j->kc, j->bt, t, p0 + i, kvd, kvh, hd), kq, hd);
                for (int d = 0; d < hd; d++) dot += qr[d] * kq[d];
            } else if (f16) {
                const uint16_t *k = (const uint16_t *)j->kc + s;
                for (int d = 0; d < hd; d++) dot += qr[d] * qt_fp16_to_fp32(k[d]);
            } else {
                const float *k = (const float *)j->kc + s;
                for (int d = 0; d < hd; d++) dot += qr[d] * k[d];
            }
            sc[i] = dot * scale;
            if (sc[i] > cmx) cmx = sc[i];
        }
        if (cmx > mx) {
            float r = expf(mx - cmx);
            for (int d = 0; d < hd; d++) acc[d] *= r;
            sum *= r;
            mx = cmx;
        }
        for (int i = 0; i < m; i++) {
            size_t s = kv_slot(j->bt, t, p0 + i) * (size_t)kvd + (size_t)kvh * hd;
            float e = expf(sc[i] - mx);
            sum += e;
            if (q8) {
                qt_dequant_row(QT_Q8_0, kv_q8_at(j->vc, j->bt, t, p0 + i, kvd, kvh, hd), kq, hd);
                for (int d = 0; d < hd; d++) acc[d] += e * kq[d];
            } else if (f16) {
                const uint16_t *v = (const uint16_t *)j->vc + s;
                for (int d = 0; d < hd; d++) acc[d] += e * qt_fp16_to_fp32(v[d]);
            } else {
                const float *v = (const float *)j->vc + s;
                for (int d = 0; d < hd; d++) acc[d] += e * v[d];
            }
        }
    }
    for (int d = 0; d < hd; d++) o[d] = acc[d] / sum;
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,fma,f16c")))
static inline float hsum256(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* A chunk's m scaled scores into sc (-inf past m, to a multiple of 8):
 * 8 positions at a time (f32 rows kr), their dot products summed across
 * lanes by one transpose; returns the lanes' max */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline __m256 att_scores8(const float *qr, const float *const *kr, int m, int hd, float scale, float *sc)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmx = ninf;
    for (int i0 = 0; i0 < m; i0 += 8) {
        const float *r8[8];
        for (int k = 0; k < 8; k++) r8[k] = kr[i0 + k < m ? i0 + k : i0];
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int d = 0; d < hd; d += 8) {
            const __m256 q = _mm256_load_ps(qr + d);
            a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[0] + d), a0);
            a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[1] + d), a1);
            a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[2] + d), a2);
            a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[3] + d), a3);
            a4 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[4] + d), a4);
            a5 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[5] + d), a5);
            a6 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[6] + d), a6);
            a7 = _mm256_fmadd_ps(q, _mm256_loadu_ps(r8[7] + d), a7);
        }
        /* lane k: position i0 + k's dot product */
        __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
        __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
        __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
        __m256 dot = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
        __m256 s8 = _mm256_mul_ps(dot, _mm256_set1_ps(scale));
        if (m - i0 < 8) {   /* past the chunk: -inf */
            const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            s8 = _mm256_blendv_ps(ninf, s8, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(m - i0), idx)));
        }
        _mm256_store_ps(sc + i0, s8);
        vmx = _mm256_max_ps(vmx, s8);
    }
    return vmx;
}

/* acc += the chunk's m value rows (f32) weighted by e, 64 dims at a time
 * in registers */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void att_values8(float *acc, const float *const *vr, const float *e, int m, int hd)
{
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) {
        __m256 v0 = _mm256_load_ps(acc + d0), v1 = _mm256_load_ps(acc + d0 + 8);
        __m256 v2 = _mm256_load_ps(acc + d0 + 16), v3 = _mm256_load_ps(acc + d0 + 24);
        __m256 v4 = _mm256_load_ps(acc + d0 + 32), v5 = _mm256_load_ps(acc + d0 + 40);
        __m256 v6 = _mm256_load_ps(acc + d0 + 48), v7 = _mm256_load_ps(acc + d0 + 56);
        for (int i = 0; i < m; i++) {
            const __m256 w = _mm256_set1_ps(e[i]);
            const float *r = vr[i];
            v0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0), v0);
            v1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 8), v1);
            v2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 16), v2);
            v3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 24), v3);
            v4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 32), v4);
            v5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 40), v5);
            v6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 48), v6);
            v7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + d0 + 56), v7);
        }
        _mm256_store_ps(acc + d0, v0); _mm256_store_ps(acc + d0 + 8, v1);
        _mm256_store_ps(acc + d0 + 16, v2); _mm256_store_ps(acc + d0 + 24, v3);
        _mm256_store_ps(acc + d0 + 32, v4); _mm256_store_ps(acc + d0 + 40, v5);
        _mm256_store_ps(acc + d0 + 48, v6); _mm256_store_ps(acc + d0 + 56, v7);
    }
    for (; d0 < hd; d0 += 8) {   /* (the rest of head_dims not a multiple of 64) */
        __m256 v = _mm256_load_ps(acc + d0);
        for (int i = 0; i < m; i++) v = _mm256_fmadd_ps(_mm256_set1_ps(e[i]), _mm256_loadu_ps(vr[i] + d0), v);
        _mm256_store_ps(acc + d0, v);
    }
}

/* Floats of att_heads_avx2's buffer for nh heads: per head q (rounded to
 * f16 with an f16 cache), the sums, max and sum; then the chunk's K and V
 * rows as f32 (whole 32-byte units, so that each thread's stays aligned) */
static size_t att_buf_floats(int nh, int hd)
{
    return ((size_t)2 * nh * hd + (size_t)2 * ATT_CHUNK * hd + 2 * (size_t)nh + 7) / 8 * 8;
}

/* AVX2/F16C version of att_one_ref for head_dim % 8 == 0 (f16, f32 or
 * q8_0 cache), for heads h0 .. h0 + nh - 1 of token t, all of one KV head.
 * Per chunk of positions: the rows as f32 (an f16 cache's converted, a
 * q8_0 cache's dequantized as the reference does, once for the nh heads;
 * an f32 cache's read in place), then for each head the scores of 8
 * positions at a time (att_scores8), their exponentials 8 at a time
 * (exp8, 0 past the chunk) and the weighted values in registers
 * (att_values8), in this pool thread's buffer (att_buf_floats). Another
 * summation order than the reference's, within 2e-5 of it (t_backend). A
 * head's arithmetic is the same whatever nh is, so a token's result does
 * not depend on its batch. The per-position form this replaced (a
 * horizontal sum and expf a position, the sums through memory) spent ~100
 * cycles a position and head: 70% of a 2,048-token prompt on a 0.5b. */
__attribute__((target("avx2,fma,f16c")))
static void att_heads_avx2(att_job *j, float *buf, int t, int h0, int nh)
{
    int hd = j->head_dim, kvd = j->n_head_kv * hd;
    int kvh = h0 / (j->n_head / j->n_head_kv);
    int f16 = j->b->kv_type == BE_KV_F16, q8 = j->b->kv_type == BE_KV_Q8_0;
    float *qr = buf, *acc = qr + (size_t)nh * hd, *kf = acc + (size_t)nh * hd, *vf = kf + (size_t)ATT_CHUNK * hd;
    float *mx = vf + (size_t)ATT_CHUNK * hd, *sum = mx + nh;
    float sc[ATT_CHUNK] __attribute__((aligned(32)));
    const float *kr[ATT_CHUNK], *vr[ATT_CHUNK];
    const float scale = j->scale;
    for (int h = 0; h < nh; h++) {
        const float *q0 = j->q + ((size_t)t * j->n_head + h0 + h) * hd;
        for (int d = 0; d < hd; d += 8) {
            __m256 q = _mm256_loadu_ps(q0 + d);
            if (f16) q = _mm256_cvtph_ps(_mm256_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT));
            _mm256_store_ps(qr + (size_t)h * hd + d, q);
            _mm256_store_ps(acc + (size_t)h * hd + d, _mm256_setzero_ps());
        }
        mx[h] = j->sinks ? j->sinks[h0 + h] : -INFINITY;
        sum[h] = j->sinks ? 1 : 0;
    }
    for (int p0 = att_first(j, t), m; (m = att_chunk(j, t, p0)) > 0; p0 += m) {
        for (int i = 0; i < m; i++) {
            float *kd = kf + (size_t)i * hd, *vd = vf + (size_t)i * hd;
            if (q8) {
                qt_dequant_row(QT_Q8_0, kv_q8_at(j->kc, j->bt, t, p0 + i, kvd, kvh, hd), kd, hd);
                qt_dequant_row(QT_Q8_0, kv_q8_at(j->vc, j->bt, t, p0 + i, kvd, kvh, hd), vd, hd);
            } else if (f16) {
                size_t s = kv_slot(j->bt, t, p0 + i) * (size_t)kvd + (size_t)kvh * hd;
                const uint16_t *k = (const uint16_t *)j->kc + s, *v = (const uint16_t *)j->vc + s;
                for (int d = 0; d < hd; d += 8) {
                    _mm256_store_ps(kd + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d))));
                    _mm256_store_ps(vd + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + d))));
                }
            } else {
                size_t s = kv_slot(j->bt, t, p0 + i) * (size_t)kvd + (size_t)kvh * hd;
                kd = (float *)j->kc + s;
                vd = (float *)j->vc + s;
            }
            kr[i] = kd;
            vr[i] = vd;
        }
        for (int h = 0; h < nh; h++) {
            float *ah = acc + (size_t)h * hd;
            const __m256 vmx = att_scores8(qr + (size_t)h * hd, kr, m, hd, scale, sc);
            __m128 x = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
            x = _mm_max_ps(x, _mm_movehl_ps(x, x));
            x = _mm_max_ss(x, _mm_movehdup_ps(x));
            const float cmx = _mm_cvtss_f32(x);
            if (cmx > mx[h]) {
                const float r = expf(mx[h] - cmx);
                const __m256 rv = _mm256_set1_ps(r);
                for (int d = 0; d < hd; d += 8) _mm256_store_ps(ah + d, _mm256_mul_ps(_mm256_load_ps(ah + d), rv));
                sum[h] *= r;
                mx[h] = cmx;
            }
            __m256 es = _mm256_setzero_ps();
            for (int i0 = 0; i0 < m; i0 += 8) {
                const __m256 z = _mm256_sub_ps(_mm256_load_ps(sc + i0), _mm256_set1_ps(mx[h]));
                const __m256 e = _mm256_and_ps(exp8(z), _mm256_cmp_ps(z, _mm256_set1_ps(-INFINITY), _CMP_GT_OQ));
                _mm256_store_ps(sc + i0, e);
                es = _mm256_add_ps(es, e);
            }
            sum[h] += hsum256(es);
            att_values8(ah, vr, sc, m, hd);
        }
    }
    for (int h = 0; h < nh; h++) {
        float *o = j->out + ((size_t)t * j->n_head + h0 + h) * hd;
        const __m256 inv = _mm256_set1_ps(1.0f / sum[h]);
        for (int d = 0; d < hd; d += 8)
            _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_load_ps(acc + (size_t)h * hd + d), inv));
    }
}
#endif

static void att_one(void *arg, int i, int ith)
{
    att_job *j = arg;
#if defined(__x86_64__)
    if (j->simd) {   /* item i: a (token, KV head)'s heads, or a (token, head) */
        int g = j->n_head / j->n_head_kv;
        float *buf = j->buf + (size_t)ith * j->stride;
        if (j->grouped) att_heads_avx2(j, buf, i / j->n_head_kv, (i % j->n_head_kv) * g, g);
        else att_heads_avx2(j, buf, i / j->n_head, i % j->n_head, 1);
        return;
    }
#else
    (void)ith;
#endif
    att_one_ref(j, i / j->n_head, i % j->n_head);
}

/* The pool's items: (token, KV head) where they are at least 4 a thread
 * (each chunk's rows converted once for the group's heads), else (token,
 * head) (a decode step's few tokens spread over the threads); the same
 * bits either way */
static void att_run(cpu_be *c, att_job *j)
{
    j->simd = c->simd && j->head_dim % 8 == 0;
    j->grouped = j->simd && j->bt->T * j->n_head_kv >= 4 * pool_size(c->pool);
#if defined(__x86_64__)
    if (j->simd) {   /* (a buffer per thread, kept: grown here, never in the items) */
        j->stride = att_buf_floats(j->grouped ? j->n_head / j->n_head_kv : 1, j->head_dim);
        size_t need = j->stride * (size_t)pool_size(c->pool);
        if (need > c->att_cap) {
            free(c->att_buf);
            c->att_cap = 0;
            c->att_buf = aligned_alloc(32, need * 4);
            if (c->att_buf) c->att_cap = need;
        }
        j->buf = c->att_buf;
        j->simd = j->buf != NULL;
        if (!j->simd) j->grouped = 0;
    }
#endif
    pool_run(c->pool, att_one, j, j->bt->T * (j->grouped ? j->n_head_kv : j->n_head));
}

static void cpu_attention(be *b, const float *q, const void *kc, const void *vc, const be_batch *bt,
                          int n_head, int n_head_kv, int head_dim, float *out)
{
    cpu_be *c = (cpu_be *)b;
    att_job j = { b, q, kc, vc, bt, n_head, n_head_kv, head_dim, out, 0, 0, 0, NULL, 1.0f / sqrtf((float)head_dim), NULL, 0 };
    att_run(c, &j);
}

static void cpu_attention_ex(be *b, const float *q, const void *kc, const void *vc, const be_batch *bt,
                             int n_head, int n_head_kv, int head_dim, const be_attn_ex *ex, float *out)
{
    cpu_be *c = (cpu_be *)b;
    att_job j = { b, q, kc, vc, bt, n_head, n_head_kv, head_dim, out, 0, 0, 0, NULL, 1.0f / sqrtf((float)head_dim), NULL, 0 };
    if (ex) {
        j.window = ex->window > 0 ? ex->window : 0;
        j.sinks = ex->sinks && ex->sinks->data ? ex->sinks->data : NULL;
        if (ex->scale != 0) j.scale = ex->scale;
    }
    att_run(c, &j);
}

pool *be_cpu_pool(be *b) { return ((cpu_be *)b)->pool; }

void *be_cpu_scratch(be *b, size_t bytes)
{
    cpu_be *c = (cpu_be *)b;
    if (bytes > c->scratch_cap) {
        free(c->scratch);
        c->scratch = NULL;
        if (posix_memalign(&c->scratch, 64, bytes)) { c->scratch = NULL; c->scratch_cap = 0; abort(); }
        c->scratch_cap = bytes;
    }
    return c->scratch;
}

static const be_ops cpu_ops = {
    .name = "cpu",
    .close = cpu_close,
    .kv_ring = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .weight_prepare = cpu_weight_prepare,
    .to_host = cpu_copy,
    .to_dev = cpu_copy,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add = cpu_add,
    .silu_mul = cpu_silu_mul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .attention_ex = cpu_attention_ex,
    .matmul_n = cpu_matmul_n,
    .sync = cpu_sync,
    .gelu_mul = cpu_gelu_mul,
    .layernorm = cpu_layernorm,
    .scale = cpu_scale,
    .add_pos = cpu_add_pos,
    .copy_rows = cpu_copy_rows,
    .sigmoid_mul = cpu_sigmoid_mul,
    .rmsnorm_gated = cpu_rmsnorm_gated,
    .conv1d_silu = cpu_conv1d_silu,
    .deltanet = cpu_deltanet,
    .moe_scratch = cpu_moe_scratch,
    .moe = cpu_moe,
    .group = cpu_group_join,
    .allreduce = cpu_allreduce,
    .send = cpu_send,
    .recv = cpu_recv,
};

long *be_cpu_moe_tie_count(be *b) { return &((cpu_be *)b)->moe_ties; }

long be_cpu_moe_ties(be *b)
{
    long n = ((cpu_be *)b)->moe_ties;
    ((cpu_be *)b)->moe_ties = 0;
    return n;
}

static int x86_simd(void)
{
    const qt_isa i = qt_isa_get();
    return i == QT_ISA_AVX2 || i == QT_ISA_AVX512 || i == QT_ISA_AMX;
}

void be_cpu_scalar(be *b, int on)
{
    ((cpu_be *)b)->simd = !on && x86_simd();
}

/* info's device on the CPU: the processor, the threads and the kernels'
 * instruction set, e.g. "AMD EPYC 7B13, 2 threads, avx2 kernels" */
static void cpu_describe(char *out, size_t n, int threads)
{
    char name[128] = "";
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f) {
        char line[256];
        while (!name[0] && fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10)) continue;
            const char *v = strchr(line, ':');
            if (!v) continue;
            v += strspn(v + 1, " \t") + 1;
            snprintf(name, sizeof name, "%.*s", (int)strcspn(v, "\n"), v);
        }
        fclose(f);
    }
    snprintf(out, n, "%s, %d thread%s, %s kernels", name[0] ? name : "CPU", threads, threads == 1 ? "" : "s",
             qt_isa_name(qt_isa_get()));
}

int be_cpu_open(be **out, pool *p, int kv_type, char *err, size_t errlen)
{
    cpu_be *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return -1; }
    c->base.ops = &cpu_ops;
    c->base.kv_type = kv_type;
    c->pool = p;
    qt_init();
    c->simd = x86_simd();
    c->repack = 1;
    cpu_describe(c->base.device, sizeof c->base.device, pool_size(p));
    *out = &c->base;
    return 0;
}

void be_cpu_repack(be *b, int on) { ((cpu_be *)b)->repack = on; }
