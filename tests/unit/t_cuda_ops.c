/* t_cuda_ops — embedding rows bit-exact, the elementwise ops, rmsnorm,
 * layernorm, gelu, rope and argmax of the CUDA backend against the CPU's. */
#include "tests/unit/t_cuda.h"

void test_embed(void)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        int n_in = 512, n_out = 50, T = 7;
        size_t rb;
        void *wd = kept(make_weight(type, n_in, n_out, &rb));
        wt w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wd };
        CHECK(gpu->ops->weight_prepare(gpu, &w) == 0);
        int32_t ids[7];
        for (int t = 0; t < T; t++) ids[t] = (int32_t)(rnd() % (uint32_t)n_out);
        float *ref = malloc((size_t)T * n_in * 4), *y = malloc((size_t)T * n_in * 4);
        for (int t = 0; t < T; t++) wt_row_f32(&w, ids[t], ref + (size_t)t * n_in);
        float *dy = gpu->ops->alloc(gpu, (size_t)T * n_in * 4);
        gpu->ops->embed(gpu, &w, ids, T, dy);
        gpu->ops->to_host(gpu, y, dy, (size_t)T * n_in * 4);
        gpu->ops->sync(gpu);
        CHECKF(memcmp(y, ref, (size_t)T * n_in * 4) == 0, "embed %s differs", qt_name(type));
        gpu->ops->free(gpu, dy);
        free(ref); free(y);
    }
}

void test_elementwise(void)
{
    int rows = 9, n = 896;
    size_t N = (size_t)rows * n;
    float *x = malloc(N * 4), *y = malloc(N * 4), *w = malloc((size_t)n * 4), *a = malloc(N * 4), *g = malloc(N * 4);
    for (size_t i = 0; i < N; i++) { x[i] = frand() * 3; y[i] = frand(); }
    for (int i = 0; i < n; i++) w[i] = frand();
    wt wv = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = w };
    CHECK(gpu->ops->weight_prepare(gpu, &wv) == 0);
    float *dx = dev_from(gpu, x, N), *dy = dev_from(gpu, y, N), *dout = gpu->ops->alloc(gpu, N * 4);

    cpu->ops->rmsnorm(cpu, x, &wv, rows, n, 1e-6f, a);
    gpu->ops->rmsnorm(gpu, dx, &wv, rows, n, 1e-6f, dout);
    gpu->ops->to_host(gpu, g, dout, N * 4);
    double e = rel_err_f(g, a, N);
    CHECKF(e < 1e-5, "rmsnorm rel err %.3g", e);

    cpu->ops->silu_mul(cpu, x, y, N, a);
    gpu->ops->silu_mul(gpu, dx, dy, N, dout);
    gpu->ops->to_host(gpu, g, dout, N * 4);
    e = rel_err_f(g, a, N);
    CHECKF(e < 1e-6, "silu_mul rel err %.3g", e);

    memcpy(a, x, N * 4);
    cpu->ops->add(cpu, a, y, N);
    gpu->ops->add(gpu, dx, dy, N);
    gpu->ops->to_host(gpu, g, dx, N * 4);
    CHECK(memcmp(a, g, N * 4) == 0);
    gpu->ops->sync(gpu);
    gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dy); gpu->ops->free(gpu, dout);
    free(x); free(y); kept(w); free(a); free(g);
}

/* rmsnorm and add_rmsnorm (out = y, in place) at row sizes one block takes
 * and sizes split over a cluster of blocks (1 and 2 values a thread), and
 * one that splits into no whole 32-value blocks: against the CPU, the
 * residual x + y bit for bit */
void test_norms(void)
{
    const int ns[] = { 896, 1000, 3584, 4096, 8192 };
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        int rows = 5, n = ns[c];
        size_t N = (size_t)rows * n;
        float *x = malloc(N * 4), *y = malloc(N * 4), *w = malloc((size_t)n * 4), *a = malloc(N * 4), *g = malloc(N * 4);
        float *ax = malloc(N * 4), *gx = malloc(N * 4);
        for (size_t i = 0; i < N; i++) { x[i] = frand() * 3; y[i] = frand(); }
        for (int i = 0; i < n; i++) w[i] = frand();
        wt wv = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = kept(w) };
        CHECK(gpu->ops->weight_prepare(gpu, &wv) == 0);
        float *dx = dev_from(gpu, x, N), *dy = dev_from(gpu, y, N), *dout = gpu->ops->alloc(gpu, N * 4);
        cpu->ops->rmsnorm(cpu, x, &wv, rows, n, 1e-6f, a);
        gpu->ops->rmsnorm(gpu, dx, &wv, rows, n, 1e-6f, dout);
        gpu->ops->to_host(gpu, g, dout, N * 4);
        gpu->ops->sync(gpu);
        double e = rel_err_f(g, a, N);
        CHECKF(e < 1e-5, "rmsnorm n=%d rel err %.3g", n, e);
        memcpy(ax, x, N * 4);
        cpu->ops->add(cpu, ax, y, N);
        cpu->ops->rmsnorm(cpu, ax, &wv, rows, n, 1e-6f, a);
        gpu->ops->add_rmsnorm(gpu, dx, dy, &wv, rows, n, 1e-6f, dy);
        gpu->ops->to_host(gpu, g, dy, N * 4);
        gpu->ops->to_host(gpu, gx, dx, N * 4);
        gpu->ops->sync(gpu);
        e = rel_err_f(g, a, N);
        CHECKF(e < 1e-5, "add_rmsnorm n=%d rel err %.3g", n, e);
        CHECKF(!memcmp(gx, ax, N * 4), "add_rmsnorm n=%d: x + y differs", n);
        gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dy); gpu->ops->free(gpu, dout);
        free(x); free(y); free(a); free(g); free(ax); free(gx);
    }
}

void test_rope(void)
{
    int T = 6, nh = 4, hd = 64;
    size_t N = (size_t)T * nh * hd;
    int32_t pos[6] = { 0, 1, 17, 300, 4095, 9000 };
    int32_t pg[1] = { 0 };
    const int32_t *pages[6] = { pg, pg, pg, pg, pg, pg };
    int32_t slot[6] = { 0 };
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
    float fd[32];
    for (int i = 0; i < 32; i++) fd[i] = 1.0f + (float)i * 0.37f;
    wt fdw = { .type = QT_F32, .n_in = 32, .n_out = 1, .row_bytes = 128, .data = fd };
    CHECK(gpu->ops->weight_prepare(gpu, &fdw) == 0);
    float *x = malloc(N * 4), *a = malloc(N * 4), *g = malloc(N * 4);
    /* with_fd 2: a YaRN table (divisors and the cos/sin factor) */
    float yt[2][33];
    wt yw[2];
    for (int r = 0; r < 2; r++) {
        rope_yarn_table(1e6, 32 * (r + 1), 32, 4096, 32, 1, 0, 1 + 0.1 * log(32), yt[r]);
        yw[r] = (wt){ .type = QT_F32, .n_in = 16 * (r + 1) + 1, .n_out = 1, .row_bytes = (size_t)(16 * (r + 1) + 1) * 4,
                      .data = yt[r] };
        CHECK(gpu->ops->weight_prepare(gpu, &yw[r]) == 0);
    }
    for (int neox = 0; neox < 2; neox++)
        for (int with_fd = 0; with_fd < 3; with_fd++)
            for (int n_rot = 32; n_rot <= 64; n_rot += 32) {
                for (size_t i = 0; i < N; i++) x[i] = frand();
                memcpy(a, x, N * 4);
                float *dx = dev_from(gpu, x, N);
                const wt *f = with_fd == 2 ? &yw[n_rot / 32 - 1] : with_fd ? &fdw : NULL;
                cpu->ops->rope(cpu, a, &bt, nh, hd, n_rot, 1e6f, neox, f);
                gpu->ops->rope(gpu, dx, &bt, nh, hd, n_rot, 1e6f, neox, f);
                gpu->ops->to_host(gpu, g, dx, N * 4);
                double e = rel_err_f(g, a, N);
                CHECKF(e < 1e-6, "rope neox=%d fd=%d n_rot=%d rel err %.3g", neox, with_fd, n_rot, e);
                gpu->ops->free(gpu, dx);
            }
    free(x); free(a); free(g);
}

/* rows split over blocks (under 64 rows) and not; ties inside a block's
 * share and across shares: the first wins; a row of -inf gives 0 */
void test_argmax(void)
{
    const int nrows[2] = { 37, 100 };
    for (int c = 0; c < 2; c++) {
        int rows = nrows[c], n = 151936;
        size_t N = (size_t)rows * n;
        float *x = malloc(N * 4);
        for (size_t i = 0; i < N; i++) x[i] = frand() * 20;
        x[(size_t)3 * n + 77] = 100; x[(size_t)3 * n + 78] = 100;
        x[(size_t)5 * n + 9] = 100; x[(size_t)5 * n + n - 9] = 100;
        x[(size_t)6 * n + n - 9] = 100; x[(size_t)6 * n + 70000] = 100;
        for (int i = 0; i < n; i++) x[(size_t)7 * n + i] = -INFINITY;
        float *dx = dev_from(gpu, x, N);
        int32_t ids[100];
        CHECK(gpu->ops->argmax != NULL);
        if (gpu->ops->argmax) gpu->ops->argmax(gpu, dx, rows, n, NULL, ids);
        for (int r = 0; r < rows; r++) {
            int best = 0;
            for (int i = 1; i < n; i++) if (x[(size_t)r * n + i] > x[(size_t)r * n + best]) best = i;
            CHECKF(ids[r] == best, "argmax %d rows, row %d: %d, want %d", rows, r, ids[r], best);
        }
        /* again (the split's counters were left at zero), and queued: two
         * at once, taken in order */
        int32_t again[100], q1[100], q2[100];
        if (gpu->ops->argmax) gpu->ops->argmax(gpu, dx, rows, n, NULL, again);
        CHECKF(memcmp(again, ids, (size_t)rows * 4) == 0, "argmax %d rows: a second call differs", rows);
        CHECK(gpu->ops->argmax_queue && gpu->ops->argmax_take);
        if (gpu->ops->argmax_queue && gpu->ops->argmax_take) {
            gpu->ops->argmax_queue(gpu, dx, rows, n, NULL);
            gpu->ops->argmax_queue(gpu, dx + n, rows - 1, n, NULL);
            gpu->ops->argmax_take(gpu, q1, rows);
            gpu->ops->argmax_take(gpu, q2, rows - 1);
            CHECKF(memcmp(q1, ids, (size_t)rows * 4) == 0, "argmax_queue %d rows: ids differ", rows);
            CHECKF(memcmp(q2, ids + 1, (size_t)(rows - 1) * 4) == 0, "argmax_queue %d rows (second): ids differ",
                   rows);
        }
        gpu->ops->free(gpu, dx);
        free(x);
    }
}

/* The first argmax of row r among the tokens mask allows (0 when none). */
static int32_t masked_best(const float *x, const uint32_t *mask, int r, int n)
{
    size_t nw = ((size_t)n + 31) / 32;
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!((mask[(size_t)r * nw + (size_t)(i >> 5)] >> (i & 31)) & 1u)) continue;
        if (x[(size_t)r * n + i] == -INFINITY) continue;
        if (best < 0 || x[(size_t)r * n + i] > x[(size_t)r * n + best]) best = i;
    }
    return best < 0 ? 0 : best;
}

/* argmax under a grammar's mask: rows with a sparse mask, a dense one,
 * one token, none, the best token refused, ties among the allowed; split
 * and unsplit rows; synchronous and two queued at once with different
 * masks (each queued mask is its own copy); odd vocabulary sizes. */
void test_argmax_mask(void)
{
    const int nrows[3] = { 5, 37, 100 }, ns[3] = { 151936, 32001, 4099 };
    for (int c = 0; c < 3; c++) {
        int rows = nrows[c], n = ns[c];
        size_t N = (size_t)rows * n, nw = ((size_t)n + 31) / 32;
        float *x = malloc(N * 4);
        uint32_t *m1 = calloc((size_t)rows * nw, 4), *m2 = calloc((size_t)rows * nw, 4);
        for (size_t i = 0; i < N; i++) x[i] = frand() * 20;
        for (int r = 0; r < rows; r++) {
            uint32_t *w1 = m1 + (size_t)r * nw, *w2 = m2 + (size_t)r * nw;
            int kind = r % 5;
            for (int i = 0; i < n; i++) {
                int a = kind == 0 ? frand() < 0.01 : kind == 1 ? frand() < 0.9 : kind == 2 ? i == n - 1 : 0;
                if (kind == 4) a = i % 7 == 3;
                if (a) w1[i >> 5] |= 1u << (i & 31);
                if (frand() < 0.5) w2[i >> 5] |= 1u << (i & 31);
            }
        }
        /* the best token refused, two allowed equal maxima */
        int b0 = 123 % n;
        x[b0] = 1000;
        m1[b0 >> 5] &= ~(1u << (b0 & 31));
        if (rows > 4) {
            size_t o = (size_t)4 * n;
            x[o + 3] = 500; x[o + 10] = 500;   /* both allowed (i % 7 == 3) */
        }
        float *dx = dev_from(gpu, x, N);
        int32_t *ids = malloc((size_t)rows * 4), *q1 = malloc((size_t)rows * 4), *q2 = malloc((size_t)rows * 4);
        if (gpu->ops->argmax && gpu->ops->argmax_queue && gpu->ops->argmax_take) {
            gpu->ops->argmax(gpu, dx, rows, n, m1, ids);
            for (int r = 0; r < rows; r++)
                CHECKF(ids[r] == masked_best(x, m1, r, n), "masked argmax n %d %d rows, row %d: %d, want %d", n,
                       rows, r, ids[r], masked_best(x, m1, r, n));
            gpu->ops->argmax_queue(gpu, dx, rows, n, m1);
            gpu->ops->argmax_queue(gpu, dx, rows, n, m2);
            memset(m1, 0, (size_t)rows * nw * 4);   /* (already copied) */
            gpu->ops->argmax_take(gpu, q1, rows);
            gpu->ops->argmax_take(gpu, q2, rows);
            CHECKF(memcmp(q1, ids, (size_t)rows * 4) == 0, "masked argmax_queue n %d %d rows: ids differ", n, rows);
            for (int r = 0; r < rows; r++)
                CHECKF(q2[r] == masked_best(x, m2, r, n), "masked argmax_queue (second) n %d row %d: %d, want %d", n,
                       r, q2[r], masked_best(x, m2, r, n));
        } else CHECK(0);
        gpu->ops->free(gpu, dx);
        free(x); free(m1); free(m2); free(ids); free(q1); free(q2);
    }
}

/* gelu_mul (with and without up), scale, layernorm (with and without bias,
 * in place, rows of odd widths and past a block), add_pos (f32, f16, bf16
 * tables) against the CPU's. */
void test_gelu_layernorm(void)
{
    static const int widths[] = { 1, 37, 64, 1000, 1536, 5000 };
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int n = widths[wi], rows = 7;
        size_t N = (size_t)rows * n;
        float *x = malloc(N * 4), *u = malloc(N * 4), *a = malloc(N * 4), *g = malloc(N * 4);
        float *w = kept(malloc((size_t)n * 4)), *bb = kept(malloc((size_t)n * 4));
        for (size_t i = 0; i < N; i++) { x[i] = frand() * 4 + 0.5f; u[i] = frand(); }
        for (int i = 0; i < n; i++) { w[i] = frand() + 1; bb[i] = frand(); }
        wt ww = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = w };
        wt wb = ww;
        wb.data = bb;
        CHECK(gpu->ops->weight_prepare(gpu, &ww) == 0 && gpu->ops->weight_prepare(gpu, &wb) == 0);
        float *dx = dev_from(gpu, x, N), *du = dev_from(gpu, u, N), *dout = gpu->ops->alloc(gpu, N * 4);
        for (int form = 0; form < 5; form++) {
            const char *what[] = { "gelu_mul", "gelu", "layernorm+bias", "layernorm in place", "scale" };
            float *dx2 = dev_from(gpu, x, N);
            memcpy(a, x, N * 4);
            switch (form) {
            case 0: cpu->ops->gelu_mul(cpu, x, u, N, a); gpu->ops->gelu_mul(gpu, dx, du, N, dout); break;
            case 1: cpu->ops->gelu_mul(cpu, x, NULL, N, a); gpu->ops->gelu_mul(gpu, dx, NULL, N, dout); break;
            case 2: cpu->ops->layernorm(cpu, x, &ww, &wb, rows, n, 1e-5f, a);
                    gpu->ops->layernorm(gpu, dx, &ww, &wb, rows, n, 1e-5f, dout); break;
            case 3: cpu->ops->layernorm(cpu, a, &ww, NULL, rows, n, 1e-5f, a);
                    gpu->ops->layernorm(gpu, dx2, &ww, NULL, rows, n, 1e-5f, dx2); break;
            case 4: cpu->ops->scale(cpu, a, N, 0.37f); gpu->ops->scale(gpu, dx2, N, 0.37f); break;
            }
            gpu->ops->to_host(gpu, g, form >= 3 ? dx2 : dout, N * 4);
            gpu->ops->sync(gpu);
            double e = rel_err_f(g, a, N);
            CHECKF(e < 1e-5, "%s n %d: rel err %.3g", what[form], n, e);
            gpu->ops->free(gpu, dx2);
        }
        gpu->ops->free(gpu, dx); gpu->ops->free(gpu, du); gpu->ops->free(gpu, dout);
        free(x); free(u); free(a); free(g);
    }
    /* learned positions */
    static const uint32_t types[] = { QT_F32, QT_F16, QT_BF16 };
    for (size_t ti = 0; ti < 3; ti++) {
        int n = 96, n_pos = 50, T = 9;
        size_t rb;
        wt tab = { .type = types[ti], .n_in = n, .n_out = n_pos };
        tab.data = kept(make_weight(types[ti], n, n_pos, &rb));
        tab.row_bytes = rb;
        CHECK(gpu->ops->weight_prepare(gpu, &tab) == 0);
        int32_t pos[9] = { 0, 1, 2, 49, 17, 18, 19, 3, 48 }, slot[9] = { 0 };
        static const int32_t pg[4] = { 0, 1, 2, 3 };
        const int32_t *pages[9];
        for (int t = 0; t < T; t++) pages[t] = pg;
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        float *x = malloc((size_t)T * n * 4), *g = malloc((size_t)T * n * 4);
        for (int i = 0; i < T * n; i++) x[i] = frand();
        float *dx = dev_from(gpu, x, (size_t)T * n);
        cpu->ops->add_pos(cpu, x, &tab, &bt, n);
        gpu->ops->add_pos(gpu, dx, &tab, &bt, n);
        gpu->ops->to_host(gpu, g, dx, (size_t)T * n * 4);
        gpu->ops->sync(gpu);
        CHECKF(memcmp(g, x, (size_t)T * n * 4) == 0, "add_pos type %u differs", types[ti]);
        gpu->ops->free(gpu, dx);
        free(x); free(g);
    }
}
