/* t_backend — CPU backend ops: every SIMD path against its scalar reference
 * on random data (attention over paged f16/f32 caches, GQA, odd lengths),
 * and the scalar ops against direct definitions. */
#include "engine/backend/backend.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rs = 88172645463325252ull;
static float frand(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}

/* x [n] as a q8_0 cache holds it (ggml's q8_0: per 32 values d = max|x| /
 * 127 rounded to f16, x / d rounded to an integer), back in f32 */
static void q8_round(const float *x, float *y, int n)
{
    for (int b = 0; b < n; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f, dh = qt_fp16_to_fp32(qt_fp32_to_fp16(d));
        for (int i = 0; i < 32; i++) y[b + i] = d ? dh * roundf(x[b + i] / d) : 0.0f;
    }
}

static void attention_case(pool *p, int kvt, int n_head, int n_head_kv, int hd, int T, int ctx)
{
    char err[128];
    be *b;
    int kv_f16 = kvt == BE_KV_F16;
    CHECK(be_cpu_open(&b, p, kvt, err, sizeof err) == 0);
    int kvd = n_head_kv * hd, n_pages = (ctx + KV_PAGE - 1) / KV_PAGE;
    /* pages deliberately out of order */
    int32_t *pages = malloc((size_t)n_pages * sizeof *pages);
    for (int i = 0; i < n_pages; i++) pages[i] = (i * 7 + 3) % n_pages;
    int coprime = 1;
    for (int i = 0; i < n_pages && coprime; i++)
        for (int k = 0; k < i; k++) if (pages[k] == pages[i]) { coprime = 0; break; }
    if (!coprime) for (int i = 0; i < n_pages; i++) pages[i] = n_pages - 1 - i;
    void *kc = b->ops->alloc(b, be_kv_bytes(kvt, (size_t)n_pages * KV_PAGE * kvd));
    void *vc = b->ops->alloc(b, be_kv_bytes(kvt, (size_t)n_pages * KV_PAGE * kvd));
    float *k = malloc((size_t)ctx * kvd * 4), *v = malloc((size_t)ctx * kvd * 4);
    float *kr = malloc((size_t)ctx * kvd * 4), *vr = malloc((size_t)ctx * kvd * 4);   /* as cached */
    for (int i = 0; i < ctx * kvd; i++) { k[i] = frand() * 2; v[i] = frand(); }
    for (int i = 0; i < ctx * kvd; i++) {
        kr[i] = kv_f16 ? qt_fp16_to_fp32(qt_fp32_to_fp16(k[i])) : k[i];
        vr[i] = kv_f16 ? qt_fp16_to_fp32(qt_fp32_to_fp16(v[i])) : v[i];
    }
    if (kvt == BE_KV_Q8_0) { q8_round(k, kr, ctx * kvd); q8_round(v, vr, ctx * kvd); }
    int32_t *pos = malloc((size_t)ctx * sizeof *pos);
    const int32_t **pg = malloc((size_t)ctx * sizeof *pg);
    for (int i = 0; i < ctx; i++) { pos[i] = i; pg[i] = pages; }
    be_batch all = { .T = ctx, .pos = pos, .pages = pg };
    b->ops->kv_store(b, kc, vc, &all, kvd, k, v);
    /* the last T positions attend */
    float *q = malloc((size_t)T * n_head * hd * 4), *o1 = malloc((size_t)T * n_head * hd * 4),
          *o2 = malloc((size_t)T * n_head * hd * 4);
    for (int i = 0; i < T * n_head * hd; i++) q[i] = frand() * 3;
    be_batch bt = { .T = T, .pos = pos + (ctx - T), .pages = pg };
    be_cpu_scalar(b, 1);
    b->ops->attention(b, q, kc, vc, &bt, n_head, n_head_kv, hd, o1);
    be_cpu_scalar(b, 0);
    b->ops->attention(b, q, kc, vc, &bt, n_head, n_head_kv, hd, o2);
    double worst = 0;
    for (int i = 0; i < T * n_head * hd; i++) {
        double d = fabs(o1[i] - o2[i]);
        if (d > worst) worst = d;
    }
    CHECKF(worst < 2e-5, "kv %s heads %d/%d hd %d T %d ctx %d: max diff %g", be_kv_name(kvt), n_head, n_head_kv, hd, T,
           ctx, worst);
    /* and the scalar result against a direct softmax(q·k)·v in double */
    double wref = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_head; h++) {
            int kvh = h / (n_head / n_head_kv), n = pos[ctx - T + t] + 1;
            double *sc = malloc((size_t)n * sizeof *sc), mx = -1e300, sum = 0;
            const float *qq = q + ((size_t)t * n_head + h) * hd;
            for (int p2 = 0; p2 < n; p2++) {
                double d = 0;
                for (int i = 0; i < hd; i++) {
                    float qi = kv_f16 ? qt_fp16_to_fp32(qt_fp32_to_fp16(qq[i])) : qq[i];
                    d += (double)qi * kr[(size_t)p2 * kvd + kvh * hd + i];
                }
                sc[p2] = d / sqrt((double)hd);
                if (sc[p2] > mx) mx = sc[p2];
            }
            for (int p2 = 0; p2 < n; p2++) { sc[p2] = exp(sc[p2] - mx); sum += sc[p2]; }
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int p2 = 0; p2 < n; p2++) {
                    acc += sc[p2] * vr[(size_t)p2 * kvd + kvh * hd + i];
                }
                double d = fabs(acc / sum - o1[((size_t)t * n_head + h) * hd + i]);
                if (d > wref) wref = d;
            }
            free(sc);
        }
    CHECKF(wref < 1e-4, "kv %s heads %d/%d hd %d: scalar attention vs definition: %g", be_kv_name(kvt), n_head,
           n_head_kv, hd, wref);
    free(q); free(o1); free(o2); free(k); free(v); free(kr); free(vr); free(pos); free(pg); free(pages);
    b->ops->free(b, kc);
    b->ops->free(b, vc);
    b->ops->close(b);
}

static void test_attention(void)
{
    pool *p;
    CHECK(pool_open(&p, 2) == 0);
    for (int f16 = 0; f16 <= 1; f16++) {
        attention_case(p, f16, 8, 4, 8, 3, 5);
        attention_case(p, f16, 14, 2, 64, 7, 77);
        attention_case(p, f16, 4, 4, 128, 1, 300);
        attention_case(p, f16, 4, 1, 24, 16, 33);
        attention_case(p, f16, 2, 2, 256, 2, 40);
    }
    /* q8_0 (head_dim a multiple of 32) */
    attention_case(p, BE_KV_Q8_0, 14, 2, 64, 7, 77);
    attention_case(p, BE_KV_Q8_0, 4, 4, 128, 1, 300);
    attention_case(p, BE_KV_Q8_0, 2, 2, 256, 2, 40);
    attention_case(p, BE_KV_Q8_0, 6, 3, 32, 5, 70);
    pool_close(p);
}

static void test_rmsnorm_rope(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 1) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    float x[2][16], w[16], out[2][16];
    for (int i = 0; i < 16; i++) { x[0][i] = frand(); x[1][i] = frand() * 5; w[i] = frand(); }
    wt wv = { .type = QT_F32, .n_in = 16, .n_out = 1, .row_bytes = 64, .data = w };
    b->ops->rmsnorm(b, &x[0][0], &wv, 2, 16, 1e-5f, &out[0][0]);
    for (int r = 0; r < 2; r++) {
        double ss = 0;
        for (int i = 0; i < 16; i++) ss += (double)x[r][i] * x[r][i];
        double sc = 1 / sqrt(ss / 16 + 1e-5);
        for (int i = 0; i < 16; i++) CHECK_NEAR(out[r][i], x[r][i] * sc * w[i], 1e-5);
    }
    /* rope: rotation keeps each pair's norm; position 0 is the identity */
    float v[2][2][8], v0[2][2][8];
    for (int i = 0; i < 32; i++) (&v[0][0][0])[i] = (&v0[0][0][0])[i] = frand();
    int32_t pos[2] = { 0, 5 };
    be_batch bt = { .T = 2, .pos = pos };
    b->ops->rope(b, &v[0][0][0], &bt, 2, 8, 8, 10000.0f, 1, NULL);
    for (int i = 0; i < 16; i++) CHECK_NEAR((&v[0][0][0])[i], (&v0[0][0][0])[i], 1e-7);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            double a = hypot(v[1][h][i], v[1][h][i + 4]), c = hypot(v0[1][h][i], v0[1][h][i + 4]);
            CHECK_NEAR(a, c, 1e-5);
        }
    /* pair 0 of head 0 at position 5 turns by 5 radians */
    double ang = 5.0, x0 = v0[1][0][0], x1 = v0[1][0][4];
    CHECK_NEAR(v[1][0][0], x0 * cos(ang) - x1 * sin(ang), 1e-5);
    CHECK_NEAR(v[1][0][4], x0 * sin(ang) + x1 * cos(ang), 1e-5);
    b->ops->close(b);
    pool_close(p);
}

/* matmul_n (Q/K/V, gate/up in one pass) gives the same bits as one matmul per
 * weight, with biases, uneven row counts, and mixed types (which fall back). */
static void test_matmul_n(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 2) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    if (!b->ops->matmul_n) { b->ops->close(b); pool_close(p); return; }
    enum { N = 256, T = 5 };
    const int rows[3] = { 96, 32, 48 };
    const uint32_t types[2][3] = { { QT_Q8_0, QT_Q8_0, QT_Q8_0 }, { QT_Q8_0, QT_Q4_K, QT_F32 } };
    void *wd[3];
    float bias[3][96], x[T][N], y1[3][T * 96], yn[3][T * 96];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) x[t][i] = frand();
    for (int set = 0; set < 2; set++) {
        wt w[3], bw[3];
        for (int k = 0; k < 3; k++) {
            uint32_t ty = types[set][k];
            size_t rb = qt_row_size(ty, N);
            wd[k] = malloc(rb * (size_t)rows[k]);
            uint8_t *q = wd[k];
            for (size_t i = 0; i < rb * (size_t)rows[k]; i++) q[i] = (uint8_t)(rand() & 0xff);
            if (ty == QT_F32)
                for (int i = 0; i < N * rows[k]; i++) ((float *)wd[k])[i] = frand();
            else if (ty == QT_Q8_0)
                for (int r = 0; r < rows[k] * N / 32; r++) {
                    uint16_t h = qt_fp32_to_fp16(0.01f + 0.001f * (float)(r % 7));
                    memcpy(q + (size_t)r * 34, &h, 2);
                }
            else
                for (int r = 0; r < rows[k] * N / 256; r++) {
                    uint16_t h = qt_fp32_to_fp16(0.001f), m = qt_fp32_to_fp16(0.0005f);
                    memcpy(q + (size_t)r * 144, &h, 2);
                    memcpy(q + (size_t)r * 144 + 2, &m, 2);
                }
            w[k] = (wt){ .type = ty, .n_in = N, .n_out = rows[k], .row_bytes = rb, .data = wd[k] };
            for (int i = 0; i < rows[k]; i++) bias[k][i] = frand();
            bw[k] = (wt){ .type = QT_F32, .n_in = rows[k], .n_out = 1, .row_bytes = (size_t)rows[k] * 4,
                          .data = k == 1 ? NULL : bias[k] };
        }
        for (int k = 0; k < 3; k++) b->ops->matmul(b, &w[k], &bw[k], &x[0][0], T, y1[k]);
        const wt *ws[3] = { &w[0], &w[1], &w[2] }, *bs[3] = { &bw[0], &bw[1], &bw[2] };
        float *outs[3] = { yn[0], yn[1], yn[2] };
        b->ops->matmul_n(b, 3, ws, bs, &x[0][0], T, outs);
        int bad = 0;
        for (int k = 0; k < 3; k++) bad += memcmp(y1[k], yn[k], (size_t)T * rows[k] * 4) != 0;
        CHECKF(bad == 0, "set %d: %d of 3 outputs differ from separate matmuls", set, bad);
        for (int k = 0; k < 3; k++) free(wd[k]);
    }
    b->ops->close(b);
    pool_close(p);
}

/* rope's cos/sin table is rebuilt when the base changes, and grows with positions */
static void test_rope_table(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 1) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    const float bases[3] = { 10000.0f, 1000000.0f, 10000.0f };
    const int32_t poss[3] = { 3, 3, 5000 };
    for (int c = 0; c < 3; c++) {
        float v[8], v0[8];
        for (int i = 0; i < 8; i++) v[i] = v0[i] = frand();
        int32_t pos[1] = { poss[c] };
        be_batch bt = { .T = 1, .pos = pos };
        b->ops->rope(b, v, &bt, 1, 8, 8, bases[c], 1, NULL);
        for (int i = 0; i < 4; i++) {
            double th = poss[c] * pow(bases[c], -2.0 * i / 8);
            CHECK_NEAR(v[i], v0[i] * cos(th) - v0[i + 4] * sin(th), 1e-4);
            CHECK_NEAR(v[i + 4], v0[i] * sin(th) + v0[i + 4] * cos(th), 1e-4);
        }
    }
    b->ops->close(b);
    pool_close(p);
}

int main(void)
{
    qt_init();
    RUN(test_attention);
    RUN(test_rmsnorm_rope);
    RUN(test_matmul_n);
    RUN(test_rope_table);
    return CHECK_DONE();
}
