/* t_dequant.c — reference dequantization against llama.cpp, bit for bit
 * (tests/fixtures/refs/llama-q.dequant.json), against gguf-py for the
 * i-quants, IQ4_NL, IQ4_XS and MXFP4 (refs/dequant2.json: real files;
 * refs/dequant_iq.json: random blocks), whole-tensor sums from the GGUF
 * files themselves, conversions and activation quantizers. */
#include "engine/load/gguf.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = strlen(s) / 2;
    if (n > cap) return 0;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return n;
}

/* File-type key in the json -> GGUF file name, where the file is in the
 * fixtures (only some quantizations are). */
static const char *gguf_for(const char *ftype)
{
    static const char *map[][2] = {
        { "bf16", "tests/fixtures/models/llama-q.bf16.gguf" },
        { "Q8_0", "tests/fixtures/models/llama-q.Q8_0.gguf" },
        { "Q4_0", "tests/fixtures/models/llama-q.Q4_0.gguf" },
        { "Q4_K_M", "tests/fixtures/models/llama-q.Q4_K_M.gguf" },
        { "Q6_K", "tests/fixtures/models/llama-q.Q6_K.gguf" },
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i][0], ftype)) return map[i][1];
    return NULL;
}

static int types_seen[QT_COUNT];
static int sums_checked;

static void check_tensor(const char *ftype, const char *tname, json_t *t, gguf *g)
{
    uint32_t type = (uint32_t)json_integer_value(json_object_get(t, "ggml_type"));
    const qt_traits *tr = qt_get(type);
    CHECKF(tr && tr->weight_ok, "%s %s: type %u unsupported", ftype, tname, type);
    if (!tr) return;
    types_seen[type] = 1;
    const char *hex = json_string_value(json_object_get(t, "raw_first512_hex"));
    if (!hex) hex = json_string_value(json_object_get(t, "raw_first_hex"));   /* dequant2.json */
    json_t *vals = json_object_get(t, "first512");
    CHECK(hex && json_array_size(vals) == 512);
    if (!hex || json_array_size(vals) != 512) return;

    uint8_t raw[4096];
    size_t nraw = unhex(hex, raw, sizeof raw);
    CHECK_EQ_INT(nraw, qt_row_size(type, 512));
    float got[512], want[512];
    memset(got, 0xff, sizeof got);
    qt_dequant_row(type, raw, got, 512);
    for (int i = 0; i < 512; i++) want[i] = (float)json_number_value(json_array_get(vals, (size_t)i));
    int bad = -1;
    for (int i = 0; i < 512 && bad < 0; i++)
        if (memcmp(&got[i], &want[i], 4)) bad = i;
    CHECKF(bad < 0, "%s %s (%s): value %d: got %.9g want %.9g", ftype, tname, qt_name(type),
           bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);

    if (!g) return;
    const gguf_tensor *gt = gguf_tensor_find(g, tname);
    CHECKF(gt != NULL, "%s: tensor %s not in file", ftype, tname);
    if (!gt) return;
    CHECK_EQ_INT(gt->type, type);
    int64_t ne0 = gt->ne[0], rows = gt->nbytes / qt_row_size(type, ne0);
    CHECK(memcmp(gt->data, raw, nraw) == 0);
    float *row = malloc((size_t)ne0 * sizeof *row);
    double sum = 0, sumsq = 0;
    size_t rs = qt_row_size(type, ne0);
    for (int64_t r = 0; r < rows; r++) {
        qt_dequant_row(type, (const uint8_t *)gt->data + r * rs, row, ne0);
        for (int64_t i = 0; i < ne0; i++) { sum += row[i]; sumsq += (double)row[i] * row[i]; }
    }
    free(row);
    double ws = json_number_value(json_object_get(t, "sum"));
    double wq = json_number_value(json_object_get(t, "sumsq"));
    /* The reference summed in a different order: compare to 1e-9 of the sum of squares. */
    CHECK_NEAR(sum, ws, 1e-9 * wq + 1e-9);
    CHECK_NEAR(sumsq, wq, 1e-9 * wq);
    sums_checked++;
}

static void test_fixture(void)
{
    json_error_t jerr;
    json_t *root = json_load_file(FIXTURE("refs/llama-q.dequant.json"), 0, &jerr);
    CHECKF(root != NULL, "json: %s", jerr.text);
    if (!root) return;
    json_t *tensors = json_object_get(root, "tensors");
    const char *ftype;
    json_t *ts;
    json_object_foreach(tensors, ftype, ts) {
        gguf *g = NULL;
        const char *path = gguf_for(ftype);
        char err[256];
        if (path) {
            int rc = gguf_open(&g, path, err, sizeof err);
            CHECKF(rc == 0, "%s: %s", path, err);
        }
        const char *tname;
        json_t *t;
        json_object_foreach(ts, tname, t) check_tensor(ftype, tname, t, g);
        gguf_close(g);
    }
    json_decref(root);
    const uint32_t want[] = { QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                              QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(types_seen[want[i]], "type %s not covered", qt_name(want[i]));
    CHECKF(sums_checked >= 20, "only %d whole-tensor sums", sums_checked);
}

/* refs/dequant2.json: gguf-py on every tensor of the IQ4_XS, IQ4_NL and
 * MXFP4 files (first 512 values bit for bit, whole-tensor sums). */
static void test_fixture2(void)
{
    json_error_t jerr;
    json_t *root = json_load_file(FIXTURE("refs/dequant2.json"), 0, &jerr);
    CHECKF(root != NULL, "json: %s", jerr.text);
    if (!root) return;
    const int before = sums_checked;
    memset(types_seen, 0, sizeof types_seen);
    const char *fname;
    json_t *ts;
    json_object_foreach(json_object_get(root, "files"), fname, ts) {
        char path[256], err[256];
        snprintf(path, sizeof path, "tests/fixtures/models/%s", fname);
        gguf *g = NULL;
        int rc = gguf_open(&g, path, err, sizeof err);
        CHECKF(rc == 0, "%s: %s", path, err);
        const char *tname;
        json_t *t;
        json_object_foreach(ts, tname, t) check_tensor(fname, tname, t, g);
        gguf_close(g);
    }
    json_decref(root);
    CHECKF(types_seen[QT_IQ4_XS] && types_seen[QT_IQ4_NL] && types_seen[QT_MXFP4],
           "dequant2.json: a type not covered");
    CHECKF(sums_checked - before >= 40, "only %d whole-tensor sums", sums_checked - before);
}

/* refs/dequant_iq.json: gguf-py on seeded random blocks of every i-quant
 * (every grid index, sign pattern and scale field occurs), bit for bit. */
static void test_fixture_iq(void)
{
    json_error_t jerr;
    json_t *root = json_load_file(FIXTURE("refs/dequant_iq.json"), 0, &jerr);
    CHECKF(root != NULL, "json: %s", jerr.text);
    if (!root) return;
    const uint32_t want[] = { QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S,
                              QT_IQ4_NL, QT_IQ4_XS };
    int seen = 0;
    const char *name;
    json_t *t;
    json_object_foreach(json_object_get(root, "types"), name, t) {
        const uint32_t type = (uint32_t)json_integer_value(json_object_get(t, "ggml_type"));
        const int64_t n = json_integer_value(json_object_get(t, "n"));
        const char *rh = json_string_value(json_object_get(t, "raw_hex"));
        const char *vh = json_string_value(json_object_get(t, "f32_hex"));
        CHECKF(qt_get(type) && rh && vh && n > 0 && n <= 8192, "%s: bad entry", name);
        if (!qt_get(type) || !rh || !vh || n <= 0 || n > 8192) continue;
        static uint8_t raw[8192 * 4], vb[8192 * 4];
        static float got[8192];
        const size_t nraw = unhex(rh, raw, sizeof raw), nv = unhex(vh, vb, sizeof vb);
        CHECK_EQ_INT(nraw, qt_row_size(type, n));
        CHECK_EQ_INT(nv, (size_t)n * 4);
        memset(got, 0xff, sizeof got);
        qt_dequant_row(type, raw, got, n);
        int bad = -1;
        float want_v = 0;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (memcmp(&got[i], vb + 4 * i, 4)) { bad = (int)i; memcpy(&want_v, vb + 4 * i, 4); }
        CHECKF(bad < 0, "%s: value %d: got %.9g want %.9g", name, bad, bad >= 0 ? got[bad] : 0.0, want_v);
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) seen += want[k] == type;
    }
    json_decref(root);
    CHECK_EQ_INT(seen, (int)(sizeof want / sizeof want[0]));
}

static void test_traits(void)
{
    CHECK(qt_get(QT_Q4_K) && qt_get(QT_Q4_K)->type_size == 144 && qt_get(QT_Q4_K)->blck == 256);
    CHECK(qt_get(QT_Q8_K) && !qt_get(QT_Q8_K)->weight_ok);
    CHECK(qt_get(29) == NULL);   /* iq1_m */
    CHECK(qt_get(34) == NULL);   /* tq1_0 */
    CHECK(qt_get(1000) == NULL);
    CHECK(!strcmp(qt_name(29), "iq1_m (type 29)"));
    CHECK(!strcmp(qt_name(99), "type 99"));
    CHECK(qt_get(QT_IQ4_XS) && qt_get(QT_IQ4_XS)->type_size == 136 && qt_get(QT_IQ4_XS)->blck == 256);
    CHECK(qt_get(QT_MXFP4) && qt_get(QT_MXFP4)->type_size == 17 && qt_get(QT_MXFP4)->blck == 32);
    CHECK_EQ_INT(qt_act_type(QT_IQ4_NL), QT_Q8_0);
    CHECK_EQ_INT(qt_act_type(QT_MXFP4), QT_Q8_0);
    CHECK_EQ_INT(qt_act_type(QT_IQ2_XXS), QT_Q8_K);
    CHECK_EQ_INT(qt_act_type(QT_IQ4_XS), QT_Q8_K);
    CHECK(!strcmp(qt_name(QT_Q6_K), "q6_K"));
    CHECK_EQ_INT(qt_row_size(QT_Q8_0, 64), 68);
    CHECK_EQ_INT(qt_row_size(QT_Q8_0, 65), 0);
    CHECK_EQ_INT(qt_row_size(QT_F16, 7), 14);
    CHECK_EQ_INT(qt_row_size(99, 32), 0);
    CHECK_EQ_INT(qt_act_type(QT_Q4_0), QT_Q8_0);
    CHECK_EQ_INT(qt_act_type(QT_Q5_1), QT_Q8_1);
    CHECK_EQ_INT(qt_act_type(QT_Q3_K), QT_Q8_K);
    CHECK_EQ_INT(qt_act_type(QT_BF16), QT_F32);
}

static void test_conversions(void)
{
    /* every half round-trips; fp32->fp16 rounds to nearest even */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qt_fp16_to_fp32((uint16_t)h);
        if (f != f) continue;
        if (qt_fp32_to_fp16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(qt_fp16_to_fp32(0x3c00), 1);
    CHECK(qt_fp16_to_fp32(0x0001) == 0x1p-24f);
    CHECK_EQ_INT(qt_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);          /* tie to even */
    CHECK_EQ_INT(qt_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    CHECK_EQ_INT(qt_fp32_to_fp16(70000.f), 0x7c00);
    CHECK_EQ_INT(qt_fp32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(qt_fp32_to_bf16(1.00390625f), 0x3f80);              /* tie to even */
    CHECK_EQ_INT(qt_fp32_to_bf16(1.01171875f), 0x3f82);
    CHECK(qt_bf16_to_fp32(0x3f81) == 1.0078125f);
}

static void test_quantizers(void)
{
    float x[512];
    uint32_t s = 12345;
    for (int i = 0; i < 512; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    }
    x[3] = 2.5f;
    /* q8_0: d = amax/127, roundf (half away from zero) */
    qt_block_q8_0 q0[16];
    qt_quantize_row(QT_Q8_0, x, q0, 512);
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    CHECK_EQ_INT(q0[0].d, qt_fp32_to_fp16(amax / 127.f));
    CHECK_EQ_INT(q0[0].qs[3], (int)roundf(x[3] * (127.f / amax)));
    float y[512];
    qt_dequant_row(QT_Q8_0, q0, y, 512);
    double err = 0;
    for (int i = 0; i < 512; i++) err = fmax(err, fabs(y[i] - x[i]));
    CHECK(err < 2.1 / 127 * 0.6);
    /* q8_1: s = d * sum(qs) */
    qt_block_q8_1 q1[16];
    qt_quantize_row(QT_Q8_1, x, q1, 512);
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += q1[1].qs[j];
    CHECK_EQ_INT(q1[1].s, qt_fp32_to_fp16((float)sum * qt_fp16_to_fp32(q1[1].d)));
    /* q8_K: largest-magnitude value maps to -127 * sign, bsums */
    qt_block_q8_K qk[2];
    qt_quantize_row(QT_Q8_K, x, qk, 512);
    int ok = 1;
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 16; k++) {
            int bs = 0;
            for (int l = 0; l < 16; l++) bs += qk[b].qs[16 * k + l];
            ok &= bs == qk[b].bsums[k];
        }
    CHECK(ok);
    qt_dequant_row(QT_Q8_K, qk, y, 512);
    err = 0;
    for (int i = 0; i < 512; i++) err = fmax(err, fabs(y[i] - x[i]));
    CHECK(err < 2.1 / 127 * 0.6);
    /* all-zero block */
    float z[256] = { 0 };
    qt_quantize_row(QT_Q8_K, z, qk, 256);
    CHECK(qk[0].d == 0 && qk[0].qs[7] == 0 && qk[0].bsums[3] == 0);
}

/* SIMD quantizers (used by qt_quantize_row) vs the scalar references,
 * byte for byte, including exact ties of the two rounding rules. */
static void test_quantizers_simd(void)
{
    enum { N = 2048 };
    static float x[N];
    static uint8_t a[N / 256 * 292 + 64], b[N / 256 * 292 + 64];
    const uint32_t acts[] = { QT_Q8_0, QT_Q8_1, QT_Q8_K };
    uint32_t s = 777;
    int bad = 0;
    for (int rep = 0; rep < 200; rep++) {
        const float scale = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.0f : 300.0f;
        for (int i = 0; i < N; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * scale;
        }
        if (rep % 4 == 0) {
            /* amax 127 -> scale exactly 1: halves are ties for roundf and for
             * round-half-even alike */
            for (int i = 0; i < N; i++) x[i] = (float)((int)((s >> (i % 7)) % 254u) - 127) * 0.5f;
            for (int blk = 0; blk < N / 32; blk++) x[blk * 32 + 5] = -127.0f;
        }
        if (rep == 1) memset(x, 0, 256 * sizeof x[0]);     /* an all-zero block */
        for (size_t t = 0; t < 3; t++) {
            const size_t sz = qt_row_size(acts[t], N);
            memset(a, 0x5a, sizeof a);
            memset(b, 0x5a, sizeof b);
            qt_quantize_row(acts[t], x, a, N);
            qt_quantize_row_ref(acts[t], x, b, N);
            if (memcmp(a, b, sz + 64)) bad++;
        }
    }
    CHECKF(bad == 0, "%d rows differ (isa %s)", bad, qt_isa_name(qt_isa_get()));
}

int main(void)
{
    RUN(test_traits);
    RUN(test_conversions);
    RUN(test_quantizers);
    RUN(test_quantizers_simd);
    RUN(test_fixture);
    RUN(test_fixture2);
    RUN(test_fixture_iq);
    return CHECK_DONE();
}
