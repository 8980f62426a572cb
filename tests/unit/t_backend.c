/* t_backend — the backends' ops on random data and awkward shapes. CPU:
 * every SIMD path against its scalar reference (attention over paged f16/f32
 * caches, GQA, odd lengths), and the scalar ops against direct definitions
 * (the matmul kernels per type: t_qgemm). CUDA builds then run every CUDA op
 * against the CPU reference (t_cuda_run: tests/unit/t_cuda_*.c).
 *
 * t_backend [NAME]: only the tests whose name holds NAME. */
#define CHECK_SHARED
#include "engine/backend/backend.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"
#ifdef ANE_CUDA
#include "tests/unit/t_cuda.h"
#endif

CHECK_COUNTERS;

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 88172645463325252ull;
static float rnd_pm1(void)
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

/* ex: NULL for plain attention, else attention_ex with its window, sinks
 * (sinks[n_head] f32 values) and scale. */
static void attention_case_ex(pool *p, int kvt, int n_head, int n_head_kv, int hd, int T, int ctx,
                              const be_attn_ex *ex)
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
    for (int i = 0; i < ctx * kvd; i++) { k[i] = rnd_pm1() * 2; v[i] = rnd_pm1(); }
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
    for (int i = 0; i < T * n_head * hd; i++) q[i] = rnd_pm1() * 3;
    be_batch bt = { .T = T, .pos = pos + (ctx - T), .pages = pg };
    be_cpu_scalar(b, 1);
    if (ex) b->ops->attention_ex(b, q, kc, vc, &bt, n_head, n_head_kv, hd, ex, o1);
    else b->ops->attention(b, q, kc, vc, &bt, n_head, n_head_kv, hd, o1);
    be_cpu_scalar(b, 0);
    if (ex) b->ops->attention_ex(b, q, kc, vc, &bt, n_head, n_head_kv, hd, ex, o2);
    else b->ops->attention(b, q, kc, vc, &bt, n_head, n_head_kv, hd, o2);
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
            int first = ex && ex->window > 0 && n - ex->window > 0 ? n - ex->window : 0;
            double *sc = malloc((size_t)n * sizeof *sc), mx = -1e300, sum = 0;
            double sink = ex && ex->sinks ? ((const float *)ex->sinks->data)[h] : -1e300;
            double scale = ex && ex->scale != 0 ? ex->scale : 1 / sqrt((double)hd);
            if (sink > mx) mx = sink;
            const float *qq = q + ((size_t)t * n_head + h) * hd;
            for (int p2 = first; p2 < n; p2++) {
                double d = 0;
                for (int i = 0; i < hd; i++) {
                    float qi = kv_f16 ? qt_fp16_to_fp32(qt_fp32_to_fp16(qq[i])) : qq[i];
                    d += (double)qi * kr[(size_t)p2 * kvd + kvh * hd + i];
                }
                sc[p2] = d * scale;
                if (sc[p2] > mx) mx = sc[p2];
            }
            if (ex && ex->sinks) sum = exp(sink - mx);
            for (int p2 = first; p2 < n; p2++) { sc[p2] = exp(sc[p2] - mx); sum += sc[p2]; }
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int p2 = first; p2 < n; p2++) {
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

static void attention_case(pool *p, int kvt, int n_head, int n_head_kv, int hd, int T, int ctx)
{
    attention_case_ex(p, kvt, n_head, n_head_kv, hd, T, ctx, NULL);
}

/* attention_ex: sliding windows (shorter and longer than the context, one
 * token), sinks (large ones that take most of the weight), an explicit
 * scale; and with nothing set, the same bytes as attention. */
static void cpu_attention_ex(void)
{
    pool *p;
    CHECK(pool_open(&p, 2) == 0);
    float sk[16];
    for (int i = 0; i < 16; i++) sk[i] = rnd_pm1() * 4 + (i == 1 ? 6 : 0);
    wt sinks = { .type = QT_F32, .n_in = 16, .n_out = 1, .row_bytes = 64, .data = sk };
    for (int f16 = 0; f16 <= 1; f16++) {
        be_attn_ex w5 = { 5, NULL, 0 }, w1 = { 1, NULL, 0 }, wbig = { 1000, NULL, 0 };
        be_attn_ex snk = { 0, &sinks, 0 }, all = { 7, &sinks, 0.0625f }, sc = { 0, NULL, 0.3f };
        attention_case_ex(p, f16, 8, 4, 8, 3, 5, &w5);
        attention_case_ex(p, f16, 14, 2, 64, 7, 77, &w5);
        attention_case_ex(p, f16, 4, 1, 24, 16, 33, &w1);
        attention_case_ex(p, f16, 4, 4, 128, 9, 300, &wbig);
        attention_case_ex(p, f16, 8, 4, 8, 3, 5, &snk);
        attention_case_ex(p, f16, 16, 2, 64, 20, 70, &snk);
        attention_case_ex(p, f16, 16, 4, 32, 33, 100, &all);
        attention_case_ex(p, f16, 2, 2, 256, 2, 40, &sc);
    }
    /* nothing set: attention's values exactly */
    char err[128];
    be *b;
    CHECK(be_cpu_open(&b, p, 0, err, sizeof err) == 0);
    int H = 4, HD = 16;
    float *kc = b->ops->alloc(b, (size_t)3 * KV_PAGE * H * HD * 4), *vc = b->ops->alloc(b, (size_t)3 * KV_PAGE * H * HD * 4);
    for (int i = 0; i < 3 * KV_PAGE * H * HD; i++) { kc[i] = rnd_pm1(); vc[i] = rnd_pm1(); }
    static const int32_t pages[3] = { 2, 0, 1 };
    int32_t pos[4] = { 3, 17, 30, 39 };
    const int32_t *pg[4] = { pages, pages, pages, pages };
    be_batch bt = { .T = 4, .pos = pos, .pages = pg };
    float q[4 * 4 * 16], o1[4 * 4 * 16], o2[4 * 4 * 16];
    for (int i = 0; i < 4 * H * HD; i++) q[i] = rnd_pm1();
    be_attn_ex zero = { 0, NULL, 0 };
    b->ops->attention(b, q, kc, vc, &bt, H, H, HD, o1);
    b->ops->attention_ex(b, q, kc, vc, &bt, H, H, HD, &zero, o2);
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
    b->ops->free(b, kc);
    b->ops->free(b, vc);
    b->ops->close(b);
    pool_close(p);
}

static void cpu_attention(void)
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

static void cpu_rmsnorm_rope(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 1) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    float x[2][16], w[16], out[2][16];
    for (int i = 0; i < 16; i++) { x[0][i] = rnd_pm1(); x[1][i] = rnd_pm1() * 5; w[i] = rnd_pm1(); }
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
    for (int i = 0; i < 32; i++) (&v[0][0][0])[i] = (&v0[0][0][0])[i] = rnd_pm1();
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
static void cpu_matmul_n(void)
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
        for (int i = 0; i < N; i++) x[t][i] = rnd_pm1();
    for (int set = 0; set < 2; set++) {
        wt w[3], bw[3];
        for (int k = 0; k < 3; k++) {
            uint32_t ty = types[set][k];
            size_t rb = qt_row_size(ty, N);
            wd[k] = malloc(rb * (size_t)rows[k]);
            uint8_t *q = wd[k];
            for (size_t i = 0; i < rb * (size_t)rows[k]; i++) q[i] = (uint8_t)(rand() & 0xff);
            if (ty == QT_F32)
                for (int i = 0; i < N * rows[k]; i++) ((float *)wd[k])[i] = rnd_pm1();
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
            for (int i = 0; i < rows[k]; i++) bias[k][i] = rnd_pm1();
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
static void cpu_rope_table(void)
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
        for (int i = 0; i < 8; i++) v[i] = v0[i] = rnd_pm1();
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

/* YaRN: rope_yarn_table's divisors and attention factor, through the rope
 * op, against transformers' formula written out here (interpolated and
 * extrapolated inverse frequencies blended over the ramp; cos and sin
 * times the attention factor 0.1 ln(factor) + 1), at the gpt-oss shape
 * and an awkward one, unrounded and rounded (truncate) ramps, neox and
 * adjacent pairs, partial rotary dims left as they are. */
static void yarn_case(be *b, int hd, int n_rot, double base, double factor, double orig, int truncate, int neox)
{
    int half = n_rot / 2, H = 3;
    double bf = 32, bs = 1, attn = 1 + 0.1 * log(factor);
    float tab[520];
    rope_yarn_table(base, n_rot, factor, orig, bf, bs, truncate, attn, tab);
    wt fd = { .type = QT_F32, .n_in = half + 1, .n_out = 1, .row_bytes = (size_t)(half + 1) * 4, .data = tab };
    double lo = n_rot * log(orig / (bf * 2 * M_PI)) / (2 * log(base));
    double hi = n_rot * log(orig / (bs * 2 * M_PI)) / (2 * log(base));
    if (truncate) { lo = floor(lo); hi = ceil(hi); }
    lo = fmax(lo, 0);
    hi = fmin(hi, n_rot - 1);
    enum { NP = 4 };
    const int32_t ps[NP] = { 0, 1, 37, 4095 };
    float *v = malloc((size_t)NP * H * hd * 4), *v0 = malloc((size_t)NP * H * hd * 4);
    for (int i = 0; i < NP * H * hd; i++) v[i] = v0[i] = rnd_pm1();
    be_batch bt = { .T = NP, .pos = ps };
    b->ops->rope(b, v, &bt, H, hd, n_rot, (float)base, neox, &fd);
    double worst = 0;
    for (int t = 0; t < NP; t++)
        for (int h = 0; h < H; h++) {
            const float *x0 = v0 + ((size_t)t * H + h) * hd, *x = v + ((size_t)t * H + h) * hd;
            for (int i = 0; i < half; i++) {
                double extrap = pow(base, -2.0 * i / n_rot), interp = extrap / factor;
                double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), e = 1 - ramp;
                double th = ps[t] * (interp * (1 - e) + extrap * e);
                int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                double c = cos(th) * attn, s = sin(th) * attn;
                double r0 = x0[i0] * c - x0[i1] * s, r1 = x0[i0] * s + x0[i1] * c;
                worst = fmax(worst, fmax(fabs(x[i0] - r0), fabs(x[i1] - r1)));
            }
            for (int d = n_rot; d < hd; d++) worst = fmax(worst, fabs(x[d] - x0[d]));
        }
    /* (position 4095 turns its fastest pair 4095 radians: float cos/sin) */
    CHECK(worst < 2e-5);
    if (worst >= 2e-5) fprintf(stderr, "  yarn hd %d rot %d trunc %d neox %d: max err %g\n", hd, n_rot, truncate, neox, worst);
    free(v);
    free(v0);
}

static void cpu_rope_yarn(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 1) == 0);
    CHECK(be_cpu_open(&b, p, 0, err, sizeof err) == 0);
    yarn_case(b, 32, 32, 150000, 32, 4096, 0, 1);    /* gpt-oss-tiny */
    yarn_case(b, 64, 64, 150000, 32, 4096, 0, 1);    /* gpt-oss-20b */
    yarn_case(b, 64, 64, 150000, 32, 4096, 1, 1);
    yarn_case(b, 40, 24, 10000, 4, 2048, 0, 0);
    yarn_case(b, 40, 24, 1e6, 8, 32768, 1, 1);
    /* the table's ends: the fast pairs, before the ramp, keep their
     * frequency (divisor 1); the slow ones past it are divided by factor */
    float tab[17];
    rope_yarn_table(150000, 32, 32, 4096, 32, 1, 0, 1.5, tab);
    CHECK_NEAR(tab[0], 1, 1e-7);
    CHECK_NEAR(tab[15], 32, 1e-5);
    CHECK_NEAR(tab[16], 1.5, 1e-7);
    CHECK(tab[6] > 1 && tab[6] < 32);
    b->ops->close(b);
    pool_close(p);
}

/* ---- mixture of experts: the op against a direct float64 definition ---- */

/* A weight of type ty from the values v [rows][n]: f32, bf16, q8_0 exactly
 * from v; q4_K from random blocks (the reference reads it back). */
static wt moe_w(uint32_t ty, const float *v, int n, int rows, void **keep)
{
    size_t rb = qt_row_size(ty, n);
    uint8_t *d = malloc(rb * (size_t)rows);
    *keep = d;
    for (int r = 0; r < rows; r++) {
        uint8_t *q = d + (size_t)r * rb;
        const float *vr = v + (size_t)r * n;
        if (ty == QT_F32) memcpy(q, vr, (size_t)n * 4);
        else if (ty == QT_BF16)
            for (int i = 0; i < n; i++) ((uint16_t *)q)[i] = qt_fp32_to_bf16(vr[i]);
        else if (ty == QT_Q8_0) qt_quantize_row(QT_Q8_0, vr, q, n);
        else {
            for (size_t i = 0; i < rb; i++) q[i] = (uint8_t)(rand() & 0xff);
            for (size_t bk = 0; bk < rb / 144; bk++) {
                uint16_t h = qt_fp32_to_fp16(0.004f), mn = qt_fp32_to_fp16(0.002f);
                memcpy(q + bk * 144, &h, 2);
                memcpy(q + bk * 144 + 2, &mn, 2);
            }
        }
    }
    return (wt){ .type = ty, .n_in = n, .n_out = rows, .row_bytes = rb, .data = d };
}

static double moe_ref_act(const be_moe *m, double g, double u)
{
    if (m->act == BE_MOE_GELU) return 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * u;
    if (m->act == BE_MOE_SWIGLU_OAI) {
        g = fmin(g, m->limit);
        u = fmax(-m->limit, fmin(u, m->limit));
        return g / (1 + exp(-m->alpha * g)) * (u + 1);
    }
    return g / (1 + exp(-g)) * u;
}

/* out [E] for one token x [E], all in double over the dequantized weights. */
static void moe_ref(const be_moe *m, const float *x, int E, double *out)
{
    int X = m->n_expert, K = m->n_used, F = m->n_ff;
    double lg[64], p[64];
    float row[1024];
    for (int e = 0; e < X; e++) {
        wt_row_f32(m->router, e, row);
        double s = m->router_b && m->router_b->data ? ((const float *)m->router_b->data)[e] : 0;
        for (int i = 0; i < E; i++) s += (double)row[i] * x[i];
        lg[e] = s;
    }
    double mx = lg[0], sum = 0;
    for (int e = 1; e < X; e++) mx = fmax(mx, lg[e]);
    for (int e = 0; e < X; e++)
        p[e] = m->gating == BE_MOE_SIGMOID ? 1 / (1 + exp(-lg[e])) : m->gating == BE_MOE_SOFTMAX ? exp(lg[e] - mx) : lg[e];
    if (m->gating == BE_MOE_SOFTMAX) {
        for (int e = 0; e < X; e++) sum += p[e];
        for (int e = 0; e < X; e++) p[e] /= sum;
    }
    int ids[64], used[64] = { 0 };
    double w[64], ws = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < X; e++)
            if (!used[e] && (best < 0 || p[e] > p[best])) best = e;
        used[best] = 1;
        ids[k] = best;
    }
    for (int k = 0; k < K; k++) ws += w[k] = m->gating == BE_MOE_TOPK_SOFTMAX ? exp(lg[ids[k]] - lg[ids[0]]) : p[ids[k]];
    for (int k = 0; k < K; k++) {
        if (m->gating == BE_MOE_TOPK_SOFTMAX || m->norm) w[k] /= ws;
        if (m->scale != 0) w[k] *= m->scale;
    }
    for (int i = 0; i < E; i++) out[i] = 0;
    double h[1024];
    for (int k = 0; k < K; k++) {
        int e = ids[k];
        for (int r = 0; r < F; r++) {
            double g = 0, u = 0;
            wt_row_f32(m->gate, (int64_t)e * F + r, row);
            for (int i = 0; i < E; i++) g += (double)row[i] * x[i];
            wt_row_f32(m->up, (int64_t)e * F + r, row);
            for (int i = 0; i < E; i++) u += (double)row[i] * x[i];
            if (m->gate_b) g += ((const float *)m->gate_b->data)[e * F + r];
            if (m->up_b) u += ((const float *)m->up_b->data)[e * F + r];
            h[r] = moe_ref_act(m, g, u);
        }
        for (int r = 0; r < E; r++) {
            double y = m->down_b ? ((const float *)m->down_b->data)[e * E + r] : 0;
            wt_row_f32(m->down, (int64_t)e * E + r, row);
            for (int i = 0; i < F; i++) y += (double)row[i] * h[i];
            out[r] += w[k] * y;
        }
    }
}

static void moe_case(be *b, uint32_t tg, uint32_t tu, uint32_t td, int gating, int norm, int act, int biases,
                     int X, int K)
{
    enum { E = 256, F = 64, T = 9 };
    float *v = malloc(sizeof(float) * (size_t)X * F * E), *rv = malloc(sizeof(float) * (size_t)X * E);
    float rb[64], gb[64 * F], ub[64 * F], db[64 * E];
    void *keep[4];
    for (int i = 0; i < X * E; i++) rv[i] = rnd_pm1() * 0.2f;
    for (int i = 0; i < X; i++) rb[i] = rnd_pm1() * 0.5f;
    for (int i = 0; i < X * F; i++) { gb[i] = rnd_pm1() * 0.3f; ub[i] = rnd_pm1() * 0.3f; }
    for (int i = 0; i < X * E; i++) db[i] = rnd_pm1() * 0.1f;
    wt router = moe_w(QT_F32, rv, E, X, &keep[0]);
    for (int i = 0; i < X * F * E; i++) v[i] = rnd_pm1() * 0.15f;
    wt gate = moe_w(tg, v, E, X * F, &keep[1]);
    for (int i = 0; i < X * F * E; i++) v[i] = rnd_pm1() * 0.15f;
    wt up = moe_w(tu, v, E, X * F, &keep[2]);
    for (int i = 0; i < X * F * E; i++) v[i] = rnd_pm1() * 0.15f;
    wt down = moe_w(td, v, F, X * E, &keep[3]);
    wt rbw = { .type = QT_F32, .n_in = X, .n_out = 1, .row_bytes = (size_t)X * 4, .data = rb };
    wt gbw = { .type = QT_F32, .n_in = F, .n_out = X, .row_bytes = F * 4, .data = gb };
    wt ubw = { .type = QT_F32, .n_in = F, .n_out = X, .row_bytes = F * 4, .data = ub };
    wt dbw = { .type = QT_F32, .n_in = E, .n_out = X, .row_bytes = E * 4, .data = db };
    be_moe m = { .n_expert = X, .n_used = K, .n_ff = F, .gating = gating, .norm = norm, .act = act,
                 .alpha = 1.702f, .limit = 7.0f, .router = &router, .router_b = biases ? &rbw : NULL,
                 .gate = &gate, .up = &up, .down = &down, .gate_b = biases ? &gbw : NULL,
                 .up_b = biases ? &ubw : NULL, .down_b = biases ? &dbw : NULL };
    if (act == BE_MOE_SWIGLU_OAI) m.limit = 0.3f;   /* so that the clamps act on these values */
    static float x[T][E], out[T][E], one[E], inpl[T][E];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < E; i++) inpl[t][i] = x[t][i] = rnd_pm1() * (act == BE_MOE_SWIGLU_OAI ? 8.0f : 1.0f);
    size_t sz = b->ops->moe_scratch(b, &m, T);
    void *scr = b->ops->alloc(b, sz);
    be_cpu_moe_ties(b);
    b->ops->moe(b, &m, &x[0][0], T, scr, &out[0][0]);
    long ties = be_cpu_moe_ties(b);
    /* float weights: the op's only rounding is f32 arithmetic; quantized
     * ones see activations quantized to 8 bits */
    int exact = tg == QT_F32 && tu == QT_F32 && td == QT_F32;
    double worst = 0, scale = 0;
    for (int t = 0; t < T; t++) {
        double r[E];
        moe_ref(&m, x[t], E, r);
        for (int i = 0; i < E; i++) {
            worst = fmax(worst, fabs(r[i] - out[t][i]));
            scale = fmax(scale, fabs(r[i]));
        }
    }
    CHECKF(ties == 0 && worst <= (exact ? 1e-5 : 0.03) * scale,
           "types %s/%s/%s gating %d norm %d act %d biases %d: off by %g of %g (%ld near-ties)", qt_name(tg),
           qt_name(tu), qt_name(td), gating, norm, act, biases, worst, scale, ties);
    /* each token alone gives the same bits; in place (out == x) too */
    int same = 1;
    for (int t = 0; t < T; t++) {
        b->ops->moe(b, &m, x[t], 1, scr, one);
        same &= memcmp(one, out[t], sizeof one) == 0;
    }
    CHECKF(same, "a token's output depends on its batch (types %s, gating %d)", qt_name(tg), gating);
    b->ops->moe(b, &m, &inpl[0][0], T, scr, &inpl[0][0]);
    CHECK(memcmp(inpl, out, sizeof out) == 0);
    b->ops->free(b, scr);
    for (int i = 0; i < 4; i++) free(keep[i]);
    free(v);
    free(rv);
}

static void cpu_moe(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 2) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    CHECK(b->ops->moe && b->ops->moe_scratch);
    for (int g = BE_MOE_SOFTMAX; g <= BE_MOE_SIGMOID; g++)
        for (int a = BE_MOE_SILU; a <= BE_MOE_SWIGLU_OAI; a++)
            for (int bias = 0; bias < 2; bias++) moe_case(b, QT_F32, QT_F32, QT_F32, g, bias, a, bias, 8, 3);
    moe_case(b, QT_F32, QT_F32, QT_F32, BE_MOE_SOFTMAX, 1, BE_MOE_SILU, 0, 8, 8);     /* every expert */
    moe_case(b, QT_F32, QT_F32, QT_F32, BE_MOE_SOFTMAX, 0, BE_MOE_SILU, 0, 5, 1);     /* one */
    moe_case(b, QT_BF16, QT_BF16, QT_BF16, BE_MOE_SOFTMAX, 1, BE_MOE_SILU, 0, 16, 4);
    moe_case(b, QT_Q8_0, QT_Q8_0, QT_Q8_0, BE_MOE_TOPK_SOFTMAX, 0, BE_MOE_SWIGLU_OAI, 1, 8, 2);
    /* gate and up with different activation formats (q8_K, q8_0) */
    moe_case(b, QT_Q4_K, QT_Q8_0, QT_Q8_0, BE_MOE_SOFTMAX, 1, BE_MOE_SILU, 0, 8, 2);
    b->ops->close(b);
    pool_close(p);
}

/* silu_mul: the SIMD path against the definition g / (1 + expf(-g)) * u
 * (libm), on random values, the range ends and every tail length; a value's
 * result is the same at any place in the array (batch invariance). */
static void cpu_silu_mul(void)
{
    pool *p;
    char err[128];
    be *b;
    CHECK(pool_open(&p, 2) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    enum { N = 8192 * 2 + 37 };
    float *g = malloc(N * 4), *u = malloc(N * 4), *o = malloc(N * 4), *o2 = malloc(N * 4);
    static const float ends[] = { 0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.5f, -88.5f, 100.0f, -100.0f,
                                  1e4f, -1e4f, 20.0f, -20.0f, 0.6931472f, -0.6931472f };
    for (int i = 0; i < N; i++) {
        g[i] = i < 16 ? ends[i] : rnd_pm1() * (i % 3 == 0 ? 30.0f : 4.0f);
        u[i] = rnd_pm1() * 2;
    }
    b->ops->silu_mul(b, g, u, N, o);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        const double e = fabs(o[i] - ref), tol = 4e-7 * fabs(ref) + 1e-30;   /* e^x past 88 is clamped: -0 comes out as about -1e-37 */
        if (!(e <= tol)) bad++;
        if (fabs(ref) > 1e-30 && e / fabs(ref) > worst) worst = e / fabs(ref);
    }
    CHECKF(bad == 0, "silu_mul: %d of %d beyond 4e-7 relative (worst %.3g)", bad, N, worst);
    /* every length 1..40 from every offset 0..7: the same bits as the whole */
    bad = 0;
    for (int off = 0; off < 8; off++)
        for (int n = 1; n <= 40; n++) {
            b->ops->silu_mul(b, g + off, u + off, (size_t)n, o2);
            if (memcmp(o2, o + off, (size_t)n * 4)) bad++;
        }
    CHECKF(bad == 0, "silu_mul: %d (offset, length) pairs differ from the whole array", bad);
    free(g); free(u); free(o); free(o2);
    b->ops->close(b);
    pool_close(p);
}

#define RUN_SOME(fn) do { if (!only || strstr(#fn, only)) RUN(fn); } while (0)

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    qt_init();
    RUN_SOME(cpu_attention);
    RUN_SOME(cpu_attention_ex);
    RUN_SOME(cpu_rmsnorm_rope);
    RUN_SOME(cpu_matmul_n);
    RUN_SOME(cpu_rope_table);
    RUN_SOME(cpu_rope_yarn);
    RUN_SOME(cpu_moe);
    RUN_SOME(cpu_silu_mul);
#ifdef ANE_CUDA
    if (t_cuda_run(only) < 0) return 1;
#endif
    return CHECK_DONE();
}
