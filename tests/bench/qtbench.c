/* qtbench — weight-streaming speed of qt_gemm per type and ISA.
 *
 *   bin/qtbench [-t SECONDS] [-i ISA,...] [TYPE...]
 *
 * First the ceiling: a plain multi-threaded read of a buffer far larger than
 * the last-level cache (GB/s). Then, for each weight type, a 4096-wide
 * matrix with enough rows to be >= 128 MiB (so it streams from memory, not
 * cache) at nb = 1, 4, 8 (GB/s of weights read per second, and % of the
 * 2-thread ceiling), and a 4096 x 4096 matrix at nb = 64 (GFLOP/s, 2*n*rows*nb
 * per call), with 1 and 2 threads splitting rows as the forward pass does.
 * Scalar, AVX2 and AVX-512 side by side.
 *
 *   bin/qtbench -S [-b NB,...] [-t SECONDS] [-i ISA,...] [TYPE...]
 *
 * Model shapes instead: qwen2.5-0.5b's 896 -> 4864, 4864 -> 896 and
 * 896 -> 151936 matrices at each nb (default 1,2,4,8,16,128), GFLOP/s with
 * 1 thread and with 2 threads taking 16-row-multiple chunks as the CPU
 * backend does. */
#include "engine/quant/qtypes.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- memory-read ceiling ---- */

typedef struct { const uint64_t *p; size_t n; uint64_t out; } rd_job;

/* 32-byte vector loads (two SSE2 loads where AVX is not assumed) with the
 * same ~1 KiB software prefetch distance as the kernels: the fastest plain
 * read one thread can do, not a cache-friendly copy. */
typedef uint64_t rd_v4 __attribute__((vector_size(32)));

static void *rd_main(void *arg)
{
    rd_job *j = arg;
    rd_v4 a0 = { 0 }, a1 = { 0 };
    const rd_v4 *p = (const rd_v4 *)(const void *)j->p;
    const size_t nv = j->n / 4;
    for (size_t i = 0; i + 4 <= nv; i += 4) {
        __builtin_prefetch((const char *)(p + i) + 1024);
        __builtin_prefetch((const char *)(p + i) + 1088);
        a0 ^= p[i] ^ p[i + 2];
        a1 ^= p[i + 1] ^ p[i + 3];
    }
    a0 ^= a1;
    j->out = a0[0] ^ a0[1] ^ a0[2] ^ a0[3];
    return NULL;
}

static double read_gbs(const uint64_t *buf, size_t n, int nt, double tmin)
{
    double best = 0, t0 = now();
    do {
        pthread_t th[8];
        rd_job jb[8];
        double s = now();
        for (int t = 0; t < nt; t++) {
            jb[t].p = buf + n / nt * t;
            jb[t].n = n / nt;
            pthread_create(&th[t], NULL, rd_main, &jb[t]);
        }
        uint64_t x = 0;
        for (int t = 0; t < nt; t++) { pthread_join(th[t], NULL); x ^= jb[t].out; }
        double e = now() - s;
        if (x == 42) fputc(' ', stderr);
        double g = (double)n * 8 / e / 1e9;
        if (g > best) best = g;
    } while (now() - t0 < tmin);
    return best;
}

/* ---- gemm runs ---- */

typedef struct {
    uint32_t wt; int64_t n; const uint8_t *W; size_t ws; int64_t r0, r1;
    const uint8_t *A; size_t as; int nb; float *Y; int64_t ldy;
    const void *P;   /* the matrix in 8-row groups (qt_x8_*), or NULL */
} gm_job;

static void *gm_main(void *arg)
{
    gm_job *j = arg;
    if (j->P) qt_x8_gemm(j->wt, j->n, j->P, j->r0, j->r1, j->A, j->as, j->nb, j->Y, j->ldy);
    else qt_gemm(j->wt, j->n, j->W, j->ws, j->r0, j->r1, j->A, j->as, j->nb, j->Y, j->ldy);
    return NULL;
}

/* Seconds per call (best of repeated calls over at least tmin). */
static double gemm_time(uint32_t wt, int64_t n, const uint8_t *W, const void *P, int64_t rows,
                        const uint8_t *A, int nb, float *Y, int nt, double tmin)
{
    const size_t ws = qt_row_size(wt, n), as = qt_row_size(qt_act_type(wt), n);
    double best = 1e30, t0 = now();
    int it = 0;
    do {
        pthread_t th[8];
        gm_job jb[8];
        double s = now();
        for (int t = 0; t < nt; t++) {
            int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
            if (P) { r0 = r0 / 8 * 8; r1 = t == nt - 1 ? rows : r1 / 8 * 8; }   /* (whole groups) */
            jb[t] = (gm_job){ wt, n, W, ws, r0, r1, A, as, nb, Y, rows, P };
            if (nt == 1) gm_main(&jb[t]);
            else pthread_create(&th[t], NULL, gm_main, &jb[t]);
        }
        if (nt > 1)
            for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
        double e = now() - s;
        if (e < best) best = e;
        it++;
    } while (now() - t0 < tmin || it < 2);
    return best;
}

static void fill_random(uint32_t wt, uint8_t *w, size_t bytes)
{
    uint64_t s = 0x243F6A8885A308D3ull;
    for (size_t i = 0; i < bytes; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        w[i] = (uint8_t)(s >> 24);
    }
    /* float types get normal values in (-1, 1): denormals would measure
     * microcode assists, not the kernel. Quantized types: any bytes do, with
     * finite fp16 scales (speed does not depend on the values). */
    if (wt == QT_F16 || wt == QT_BF16 || wt == QT_F32) {
        const size_t es = wt == QT_F32 ? 4 : 2;
        for (size_t i = 0; i + es <= bytes; i += es) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            float f = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 23);
            if (f == 0) f = 0.5f;
            if (wt == QT_F32) memcpy(w + i, &f, 4);
            else {
                uint16_t h = wt == QT_F16 ? qt_fp32_to_fp16(f) : qt_fp32_to_bf16(f);
                memcpy(w + i, &h, 2);
            }
        }
    }
}

/* Model-shape run: 2 threads take chunks of rows in turn, as the pool does. */
typedef struct { gm_job j; int64_t chunk, rows; } sh_job;

static void *sh_main(void *arg)
{
    sh_job *s = arg;
    for (int64_t r = s->j.r0; r < s->rows; r += 2 * s->chunk) {
        const int64_t e = r + s->chunk < s->rows ? r + s->chunk : s->rows;
        qt_gemm(s->j.wt, s->j.n, s->j.W, s->j.ws, r, e, s->j.A, s->j.as, s->j.nb, s->j.Y, s->j.ldy);
    }
    return NULL;
}

static double shape_time(uint32_t wt, int64_t n, const uint8_t *W, int64_t rows, const uint8_t *A,
                         int nb, float *Y, int nt, double tmin)
{
    const size_t ws = qt_row_size(wt, n), as = qt_row_size(qt_act_type(wt), n);
    int64_t chunk = rows / (2 * 8);
    if (chunk < 16) chunk = 16;
    chunk = (chunk + 15) / 16 * 16;
    double best = 1e30, t0 = now();
    int it = 0;
    do {
        pthread_t th;
        sh_job jb[2];
        double s = now();
        for (int t = 0; t < nt; t++)
            jb[t] = (sh_job){ { wt, n, W, ws, t * chunk, 0, A, as, nb, Y, rows, NULL }, nt == 1 ? rows : chunk, rows };
        if (nt == 1) sh_main(&jb[0]);
        else {
            for (int t = 0; t < nt; t++) jb[t].chunk = chunk;
            pthread_create(&th, NULL, sh_main, &jb[1]);
            sh_main(&jb[0]);
            pthread_join(th, NULL);
        }
        double e = now() - s;
        if (e < best) best = e;
        it++;
    } while (now() - t0 < tmin || it < 2);
    return best;
}

static int run_shapes(const uint32_t *types, int ntypes, const int *want_isa, const int *nbs, int nnb,
                      double tmin)
{
    static const int64_t shapes[3][2] = { { 896, 4864 }, { 4864, 896 }, { 896, 151936 } };
    int maxnb = 1;
    for (int k = 0; k < nnb; k++) if (nbs[k] > maxnb) maxnb = nbs[k];
    const qt_isa best = qt_isa_get();
    printf("model shapes (n_in x n_out), GFLOP/s 1 thread / 2 threads\n");
    for (int ti = 0; ti < ntypes; ti++)
        for (int si = 0; si < 3; si++) {
            const uint32_t wt = types[ti], at = qt_act_type(wt);
            const int64_t n = shapes[si][0], rows = shapes[si][1];
            const size_t ws = qt_row_size(wt, n), as = qt_row_size(at, n);
            if (!ws) continue;
            uint8_t *W = malloc(ws * (size_t)rows), *A = malloc(as * (size_t)maxnb);
            float *Y = malloc(sizeof(float) * (size_t)rows * (size_t)maxnb), *x = malloc(sizeof(float) * (size_t)n);
            if (!W || !A || !Y || !x) { fprintf(stderr, "qtbench: out of memory\n"); return 1; }
            fill_random(wt, W, ws * (size_t)rows);
            uint64_t s = 1;
            for (int b = 0; b < maxnb; b++) {
                for (int64_t i = 0; i < n; i++) {
                    s = s * 6364136223846793005ull + 1442695040888963407ull;
                    x[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 23);
                }
                qt_quantize_row(at, x, A + b * as, n);
            }
            for (int isa = 1; isa <= (int)best; isa++) {
                if (!want_isa[isa]) continue;
                qt_isa_set((qt_isa)isa);
                if ((int)qt_isa_get() != isa) continue;
                printf("%-5s %-7s %5lldx%-6lld |", qt_name(wt), qt_isa_name((qt_isa)isa), (long long)n, (long long)rows);
                for (int k = 0; k < nnb; k++) {
                    const double flop = 2.0 * (double)n * (double)rows * nbs[k];
                    const double t1 = shape_time(wt, n, W, rows, A, nbs[k], Y, 1, tmin);
                    const double t2 = shape_time(wt, n, W, rows, A, nbs[k], Y, 2, tmin);
                    printf(" nb=%d %.1f/%.1f |", nbs[k], flop / t1 / 1e9, flop / t2 / 1e9);
                    fflush(stdout);
                }
                printf("\n");
            }
            free(W); free(A); free(Y); free(x);
        }
    qt_isa_set(best);
    return 0;
}

static const uint32_t all_types[] = { QT_Q8_0, QT_Q4_K, QT_Q6_K, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                      QT_Q2_K, QT_Q3_K, QT_Q5_K, QT_F16, QT_BF16, QT_F32 };

int main(int argc, char **argv)
{
    double tmin = 0.3;
    int want_isa[5] = { 1, 1, 1, 1, 1 };
    uint32_t types[32];
    int ntypes = 0, cached = 0, shapes = 0, nnb = 6;
    int nbs_s[16] = { 1, 2, 4, 8, 16, 128 };
    int64_t ncols = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) tmin = atof(argv[++i]);
        else if (!strcmp(argv[i], "-c")) cached = 1;
        else if (!strcmp(argv[i], "-S")) shapes = 1;
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) {
            nnb = 0;
            for (char *p = argv[++i]; *p && nnb < 16;) {
                const long v = strtol(p, &p, 10);
                if (v >= 1 && v <= 4096) nbs_s[nnb++] = (int)v;
                while (*p == ',') p++;
                if (*p && (*p < '0' || *p > '9')) break;
            }
            if (!nnb) { fprintf(stderr, "qtbench: bad -b list\n"); return 2; }
        }
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) ncols = atoll(argv[++i]);
        else if (!strcmp(argv[i], "-i") && i + 1 < argc) {
            const char *l = argv[++i];
            for (int k = 0; k < 5; k++) want_isa[k] = strstr(l, qt_isa_name((qt_isa)k)) != NULL;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: qtbench [-c] [-n COLS] [-t SECONDS] [-i scalar,avx2,avx512,amx] [TYPE...]\n"
                   "       qtbench -S [-b NB,...] [-t SECONDS] [-i avx2,avx512] [TYPE...]\n"
                   "  -c  cache-resident matrices (1 MiB): kernel speed without memory\n"
                   "  -S  qwen2.5-0.5b matrix shapes at each nb of -b (default 1,2,4,8,16,128)\n");
            return 0;
        } else {
            int found = 0;
            for (uint32_t t = 0; t < QT_COUNT && ntypes < 32; t++)
                if (qt_get(t) && qt_get(t)->weight_ok && !strcmp(qt_name(t), argv[i])) {
                    types[ntypes++] = t;
                    found = 1;
                }
            if (!found) { fprintf(stderr, "qtbench: unknown type %s\n", argv[i]); return 2; }
        }
    }
    if (!ntypes && shapes) {
        types[0] = QT_Q4_0; types[1] = QT_Q8_0; ntypes = 2;
    }
    if (!ntypes) {
        ntypes = (int)(sizeof all_types / sizeof all_types[0]);
        memcpy(types, all_types, sizeof all_types);
    }
    qt_init();
    const qt_isa best = qt_isa_get();
    printf("qtbench: best ISA %s\n", qt_isa_name(best));
    if (shapes) {
        return run_shapes(types, ntypes, want_isa, nbs_s, nnb, tmin);
    }

    const size_t rbytes = (size_t)512 << 20;
    uint64_t *rbuf = malloc(rbytes);
    if (!rbuf) { fprintf(stderr, "qtbench: out of memory\n"); return 1; }
    memset(rbuf, 1, rbytes);
    const double ceil1 = read_gbs(rbuf, rbytes / 8, 1, tmin), ceil2 = read_gbs(rbuf, rbytes / 8, 2, tmin);
    free(rbuf);
    printf("memory read ceiling (512 MiB buffer): 1 thread %.1f GB/s, 2 threads %.1f GB/s\n\n", ceil1, ceil2);

    const int64_t n = ncols;
    const size_t big = cached ? (size_t)1 << 20 : (size_t)128 << 20;
    if (cached)
        printf("weights: n=%lld, cache-resident: 1 MiB matrix (nb=1,4,8) / 1/16 of it (nb=64)\n", (long long)n);
    else
        printf("weights: n=%lld, rows so that the matrix is >= 128 MiB (decode) / 4096 rows (nb=64)\n",
               (long long)n);
    printf("%-5s %-7s | %-15s | %-15s | %-15s | %-17s\n", "type", "isa", "nb=1 GB/s 1t/2t",
           "nb=4 GB/s 1t/2t", "nb=8 GB/s 1t/2t", "nb=64 GFLOP/s 1t/2t");
    for (int ti = 0; ti < ntypes; ti++) {
        const uint32_t wt = types[ti], at = qt_act_type(wt);
        const size_t ws = qt_row_size(wt, n), as = qt_row_size(at, n);
        if (!ws) { printf("%-5s n=%lld is not a multiple of its block\n", qt_name(wt), (long long)n); continue; }
        int64_t rows = (int64_t)((big + ws - 1) / ws + 7) / 8 * 8;
        if (!cached && rows < 4096) rows = 4096;
        uint8_t *W = malloc(ws * (size_t)rows);
        uint8_t *A = malloc(as * 64);
        float *Y = malloc(sizeof(float) * (size_t)rows * 64);
        float *x = malloc(sizeof(float) * (size_t)n);
        if (!W || !A || !Y || !x) { fprintf(stderr, "qtbench: out of memory\n"); return 1; }
        fill_random(wt, W, ws * (size_t)rows);
        uint64_t s = 1;
        for (int b = 0; b < 64; b++) {
            for (int64_t i = 0; i < n; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 23);
            }
            qt_quantize_row(at, x, A + b * as, n);
        }
        /* where AVX2 is there, a last row "x8": the same matrix in 8-row
         * groups (the CPU backend's copy where AVX2 is the kernels' ISA) */
        void *P = NULL;
        const size_t pb = best >= QT_ISA_AVX2 && best != QT_ISA_NEON ? qt_x8_bytes(wt, n, rows) : 0;
        if (pb && (P = aligned_alloc(64, (pb + 63) / 64 * 64)) && qt_x8_pack(wt, W, ws, n, 0, rows, P)) {
            free(P);
            P = NULL;
        }
        /* then the packed rows: "x8" its AVX2 tiles, "x8vnni" the VNNI ones */
        const int n_x8 = !P ? 0 : best >= QT_ISA_AVX512 && best != QT_ISA_NEON ? 2 : 1;
        for (int isa = 0; isa <= (int)best + n_x8; isa++) {
            const int x8 = isa > (int)best ? isa - (int)best : 0;
            if (x8) {
                if (!want_isa[x8 == 1 ? QT_ISA_AVX2 : QT_ISA_AVX512]) continue;
                qt_isa_set(x8 == 1 ? QT_ISA_AVX2 : QT_ISA_AVX512);
                if (!qt_x8_bytes(wt, n, rows)) continue;   /* (q6_K: no AVX2 tile) */
            } else {
                if (!want_isa[isa]) continue;
                qt_isa_set((qt_isa)isa);
                if ((int)qt_isa_get() != isa) continue;
            }
            const void *Px = x8 ? P : NULL;
            /* the scalar reference is slow: time it on fewer rows */
            const int64_t drows = isa == QT_ISA_SCALAR ? rows / 16 : rows;
            int64_t crows = isa == QT_ISA_SCALAR ? 256 : 4096;
            if (cached) crows = rows / 16 > 16 ? rows / 16 / 8 * 8 : 16;
            const double bytes = (double)ws * (double)drows;
            printf("%-5s %-7s |", qt_name(wt), x8 ? (x8 == 1 ? "x8" : "x8vnni") : qt_isa_name((qt_isa)isa));
            const int nbs[3] = { 1, 4, 8 };
            for (int k = 0; k < 3; k++) {
                double t1 = gemm_time(wt, n, W, Px, drows, A, nbs[k], Y, 1, tmin);
                double t2 = gemm_time(wt, n, W, Px, drows, A, nbs[k], Y, 2, tmin);
                printf(" %6.2f %6.2f  |", bytes / t1 / 1e9, bytes / t2 / 1e9);
            }
            double flop = 2.0 * (double)n * (double)crows * 64;
            double t1 = gemm_time(wt, n, W, Px, crows, A, 64, Y, 1, tmin);
            double t2 = gemm_time(wt, n, W, Px, crows, A, 64, Y, 2, tmin);
            printf(" %7.1f %7.1f\n", flop / t1 / 1e9, flop / t2 / 1e9);
            fflush(stdout);
        }
        free(P); free(W); free(A); free(Y); free(x);
    }
    qt_isa_set(best);
    return 0;
}
