/* t_cuda_attn — kv_store and paged attention (f16 and f32 caches, GQA,
 * several sequences, prefill and split decode, grouped decode batches,
 * windows and sinks) against the CPU backend, and the fused rope_kv,
 * rope_attention and qkv_rope bit for bit against the plain ops. */
#include "tests/unit/t_cuda.h"

/* Random q [T][n_head*hd], k and v [T][kvd] (host, freed by the caller)
 * and their projections' biases, prepared on g */
static void qkv_rand(be *g, int T, int n_head, int kvd, int hd, float **q, float **k, float **v, wt bw[3])
{
    size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
    *q = malloc(nq * 4); *k = malloc(nk * 4); *v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++) (*q)[i] = frand() * 2;
    for (size_t i = 0; i < nk; i++) { (*k)[i] = frand() * 2; (*v)[i] = frand() * 2; }
    float *bq = kept(malloc((size_t)n_head * hd * 4)), *bk = kept(malloc((size_t)kvd * 4)), *bv = kept(malloc((size_t)kvd * 4));
    for (int i = 0; i < n_head * hd; i++) bq[i] = frand();
    for (int i = 0; i < kvd; i++) { bk[i] = frand(); bv[i] = frand(); }
    bw[0] = (wt){ .type = QT_F32, .n_in = n_head * hd, .n_out = 1, .row_bytes = (size_t)n_head * hd * 4, .data = bq };
    bw[1] = (wt){ .type = QT_F32, .n_in = kvd, .n_out = 1, .row_bytes = (size_t)kvd * 4, .data = bk };
    bw[2] = (wt){ .type = QT_F32, .n_in = kvd, .n_out = 1, .row_bytes = (size_t)kvd * 4, .data = bv };
    for (int i = 0; i < 3; i++) CHECK(g->ops->weight_prepare(g, &bw[i]) == 0);
}

/* rope_kv equals rope, rope, kv_store bit for bit (q, k and both caches);
 * with_bias: rope_kv given the q, k, v biases equals the plain ops on
 * q + bq, k + bk, v + bv */
static void rope_kv_case(be *g, int n_head, int n_head_kv, int hd, int n_rot, int neox, int with_fd, int with_bias)
{
    enum { NS = 3, MAXP = 32 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(g->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    int32_t pos[64], slot[64];
    const int32_t *pages[64];
    int T = 0;
    const int from[NS] = { 0, 200, 37 }, cnt[NS] = { 20, 1, 3 };
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < cnt[s]; i++) { pos[T] = from[s] + i; pages[T] = perm + s * MAXP; slot[T] = s; T++; }
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
    /* with_fd 2: a YaRN table, n_rot/2 divisors and the cos/sin factor */
    int n_fd = n_rot / 2 + (with_fd == 2);
    float *fd = kept(malloc((size_t)n_fd * 4));
    for (int i = 0; i < n_rot / 2; i++) fd[i] = 1.0f + (float)i * 0.37f;
    if (with_fd == 2) rope_yarn_table(1e6, n_rot, 32, 4096, 32, 1, 0, 1.35, fd);
    wt fdw = { .type = QT_F32, .n_in = n_fd, .n_out = 1, .row_bytes = (size_t)n_fd * 4, .data = fd };
    CHECK(g->ops->weight_prepare(g, &fdw) == 0);
    size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
    float *q, *k, *v;
    wt bw[3];
    qkv_rand(g, T, n_head, kvd, hd, &q, &k, &v, bw);
    const wt *bias[3] = { &bw[0], &bw[1], &bw[2] };
    float *dq[2], *dk[2], *dv[2];
    void *kc[2], *vc[2];
    for (int r = 0; r < 2; r++) {
        if (r == 0 && with_bias) {   /* the reference: the biases added on the host */
            float *q2 = malloc(nq * 4), *k2 = malloc(nk * 4), *v2 = malloc(nk * 4);
            const float *bq = bw[0].data, *bk = bw[1].data, *bv = bw[2].data;
            for (size_t i = 0; i < nq; i++) q2[i] = q[i] + bq[i % ((size_t)n_head * hd)];
            for (size_t i = 0; i < nk; i++) { k2[i] = k[i] + bk[i % (size_t)kvd]; v2[i] = v[i] + bv[i % (size_t)kvd]; }
            dq[r] = dev_from(g, q2, nq); dk[r] = dev_from(g, k2, nk); dv[r] = dev_from(g, v2, nk);
            free(q2); free(k2); free(v2);
        } else {
            dq[r] = dev_from(g, q, nq); dk[r] = dev_from(g, k, nk); dv[r] = dev_from(g, v, nk);
        }
        kc[r] = g->ops->alloc(g, cache); vc[r] = g->ops->alloc(g, cache);
    }
    const wt *f = with_fd ? &fdw : NULL;
    g->ops->rope(g, dq[0], &bt, n_head, hd, n_rot, 1e6f, neox, f);
    g->ops->rope(g, dk[0], &bt, n_head_kv, hd, n_rot, 1e6f, neox, f);
    g->ops->kv_store(g, kc[0], vc[0], &bt, kvd, dk[0], dv[0]);
    g->ops->rope_kv(g, dq[1], dk[1], dv[1], kc[1], vc[1], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox, f,
                    with_bias ? bias : NULL);
    size_t big = cache > nq * 4 ? cache : nq * 4;
    char *a = malloc(big), *b = malloc(big);
    const char *what[4] = { "q", "k", "k cache", "v cache" };
    const void *src[4][2] = { { dq[0], dq[1] }, { dk[0], dk[1] }, { kc[0], kc[1] }, { vc[0], vc[1] } };
    size_t len[4] = { nq * 4, nk * 4, cache, cache };
    for (int i = 0; i < 4; i++) {
        g->ops->to_host(g, a, src[i][0], len[i]);
        g->ops->to_host(g, b, src[i][1], len[i]);
        CHECKF(memcmp(a, b, len[i]) == 0, "rope_kv kv %s heads %d/%d hd %d n_rot %d neox %d fd %d bias %d: %s differs",
               be_kv_name(g->kv_type), n_head, n_head_kv, hd, n_rot, neox, with_fd, with_bias, what[i]);
    }
    g->ops->sync(g);
    for (int r = 0; r < 2; r++) {
        g->ops->free(g, dq[r]); g->ops->free(g, dk[r]); g->ops->free(g, dv[r]);
        g->ops->free(g, kc[r]); g->ops->free(g, vc[r]);
    }
    free(q); free(k); free(v); free(a); free(b);
}

void test_rope_kv(void)
{
    CHECK(gpu->ops->rope_kv != NULL);
    if (!gpu->ops->rope_kv) return;
    be *gs[2] = { gpu, gpu32 };
    for (int i = 0; i < 2; i++) {
        rope_kv_case(gs[i], 14, 2, 64, 64, 1, 0, 0);    /* qwen2.5-0.5b */
        rope_kv_case(gs[i], 8, 2, 128, 128, 0, 1, 0);
        rope_kv_case(gs[i], 4, 2, 64, 32, 1, 0, 0);     /* partial rotary */
        rope_kv_case(gs[i], 6, 3, 48, 32, 0, 1, 0);
        rope_kv_case(gs[i], 16, 8, 256, 64, 1, 0, 0);
        rope_kv_case(gs[i], 14, 2, 64, 64, 1, 0, 1);    /* qwen2.5: q, k, v biases */
        rope_kv_case(gs[i], 4, 2, 64, 32, 1, 1, 1);
        rope_kv_case(gs[i], 6, 3, 48, 32, 0, 0, 1);
        rope_kv_case(gs[i], 64, 8, 64, 64, 1, 2, 1);   /* gpt-oss-20b: YaRN, q, k, v biases */
        rope_kv_case(gs[i], 6, 3, 48, 32, 0, 2, 0);
    }
    /* a q8_0 cache: the fused kernel's blocks are the plain store's bytes
     * (head_dim a multiple of 32) */
    be *q8 = NULL;
    char err[256];
    int bad = gpu_open(&q8, BE_KV_Q8_0, NULL, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (!bad) {
        rope_kv_case(q8, 14, 2, 64, 64, 1, 0, 0);
        rope_kv_case(q8, 8, 2, 128, 128, 0, 1, 0);
        rope_kv_case(q8, 28, 4, 128, 128, 1, 0, 1);   /* qwen2.5-7b: q, k, v biases */
        rope_kv_case(q8, 4, 2, 64, 32, 1, 1, 1);      /* partial rotary */
        rope_kv_case(q8, 16, 8, 256, 64, 1, 0, 0);
        rope_kv_case(q8, 64, 8, 64, 64, 1, 2, 1);
        rope_kv_case(q8, 6, 3, 32, 32, 0, 0, 1);      /* (a warp a block) */
        q8->ops->close(q8);
    }
    /* and with fusion off (the plain ops, biases added first) */
    be *plain = NULL;
    bad = gpu_open(&plain, 1, &(be_cuda_force){ .unfused = 1 }, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (!bad) {
        rope_kv_case(plain, 14, 2, 64, 64, 1, 0, 1);
        rope_kv_case(plain, 4, 2, 64, 32, 1, 1, 1);
        plain->ops->close(plain);
    }
}

/* rope_attention on a decode batch inside a pass (the rope done by the
 * attention kernel, from the angles the pass's first rope_kv wrote)
 * equals rope_kv then attention bit for bit: the output and both caches.
 * q left as given shows that the fused kernel ran (rope_kv ropes q in
 * place). T tokens, one per sequence, at positions 3 + 37 t (1 to many
 * spans); enough of them for the attention's unrolled form too. */
static void rope_att_case(be *g, int T, int n_head, int n_head_kv, int hd, int n_rot, int neox, int with_bias)
{
    enum { MAXP = 64 };
    int kvd = n_head_kv * hd, n_pages = T * MAXP;
    size_t cache = be_kv_bytes(g->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t *perm = malloc((size_t)n_pages * 4), *pos = malloc((size_t)T * 4), *slot = malloc((size_t)T * 4);
    int32_t *ids = calloc((size_t)T, 4);
    const int32_t **pages = malloc((size_t)T * sizeof *pages);
    page_perm(perm, n_pages);
    for (int t = 0; t < T; t++) { pos[t] = 3 + 37 * t % 900; pages[t] = perm + t * MAXP; slot[t] = t; }
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot, .n_dec = T };
    size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
    float *q, *k, *v;
    wt bw[3];
    qkv_rand(g, T, n_head, kvd, hd, &q, &k, &v, bw);
    const wt *bias[3] = { &bw[0], &bw[1], &bw[2] }, *const *bs = with_bias ? bias : NULL;
    /* the earlier positions, the same in both caches */
    void *kc[3], *vc[3];
    for (int r = 0; r < 3; r++) { kc[r] = g->ops->alloc(g, cache); vc[r] = g->ops->alloc(g, cache); }
    for (int t = 0; t < T; t++) {
        int n = pos[t];
        int32_t *fp = malloc((size_t)n * 4), *fs = malloc((size_t)n * 4);
        const int32_t **fpg = malloc((size_t)n * sizeof *fpg);
        for (int i = 0; i < n; i++) { fp[i] = i; fpg[i] = pages[t]; fs[i] = t; }
        be_batch fb = { .T = n, .pos = fp, .pages = fpg, .slot = fs };
        float *fk = malloc((size_t)n * kvd * 4), *fv = malloc((size_t)n * kvd * 4);
        for (size_t i = 0; i < (size_t)n * kvd; i++) { fk[i] = frand(); fv[i] = frand(); }
        float *dk = dev_from(g, fk, (size_t)n * kvd), *dv = dev_from(g, fv, (size_t)n * kvd);
        for (int r = 1; r < 3; r++) g->ops->kv_store(g, kc[r], vc[r], &fb, kvd, dk, dv);
        g->ops->sync(g);
        g->ops->free(g, dk); g->ops->free(g, dv);
        free(fk); free(fv); free(fp); free(fs); free(fpg);
    }
    float *dq[3], *dk[3], *dv[3], *out[3];
    for (int r = 0; r < 3; r++) {
        dq[r] = dev_from(g, q, nq); dk[r] = dev_from(g, k, nk); dv[r] = dev_from(g, v, nk);
        out[r] = g->ops->alloc(g, nq * 4);
    }
    CHECK(g->ops->step_begin(g, ids, &bt, NULL, 0) == 0);
    /* the pass's first rope_kv (writes the angles), then each way */
    g->ops->rope_kv(g, dq[0], dk[0], dv[0], kc[0], vc[0], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox, NULL, bs);
    g->ops->rope_kv(g, dq[1], dk[1], dv[1], kc[1], vc[1], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox, NULL, bs);
    g->ops->attention(g, dq[1], kc[1], vc[1], &bt, n_head, n_head_kv, hd, out[1]);
    g->ops->rope_attention(g, dq[2], dk[2], dv[2], kc[2], vc[2], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox,
                           NULL, bs, out[2]);
    g->ops->step_end(g);
    size_t big = cache > nq * 4 ? cache : nq * 4;
    char *a = malloc(big), *b = malloc(big);
    const char *what[3] = { "out", "k cache", "v cache" };
    const void *src[3][2] = { { out[1], out[2] }, { kc[1], kc[2] }, { vc[1], vc[2] } };
    size_t len[3] = { nq * 4, cache, cache };
    for (int i = 0; i < 3; i++) {
        g->ops->to_host(g, a, src[i][0], len[i]);
        g->ops->to_host(g, b, src[i][1], len[i]);
        CHECKF(memcmp(a, b, len[i]) == 0, "rope_attention kv%s T %d heads %d/%d hd %d n_rot %d neox %d bias %d: %s "
               "differs", g->kv_type == BE_KV_F16 ? "16" : "32", T, n_head, n_head_kv, hd, n_rot, neox, with_bias, what[i]);
    }
    g->ops->to_host(g, a, dq[2], nq * 4);
    CHECKF(memcmp(a, q, nq * 4) == 0, "rope_attention T %d: q was roped in place (not the fused kernel)", T);
    g->ops->sync(g);
    for (int r = 0; r < 3; r++) {
        g->ops->free(g, dq[r]); g->ops->free(g, dk[r]); g->ops->free(g, dv[r]); g->ops->free(g, out[r]);
        g->ops->free(g, kc[r]); g->ops->free(g, vc[r]);
    }
    free(q); free(k); free(v); free(a); free(b);
    free(perm); free(pos); free(slot); free(ids); free(pages);
}

/* qkv_rope (the q/k/v matmuls with the rope and KV store in their
 * epilogue) inside a pass, after the pass's first rope_kv wrote the
 * angles, against matmul_n then rope_kv: q, k, v and both caches bit for
 * bit. One token at position p; q8_0 rows of 2048 values (two warps a row,
 * the shape the fused launch takes). */
static void qkv_rope_case(int kv_f16, int n_head, int n_head_kv, int neox, int with_bias, int p)
{
    enum { NIN = 2048, MAXP = 64 };
    char err[256];
    be *g = NULL;
    CHECKF(!gpu_open(&g, kv_f16, NULL, err, sizeof err), "%s", err);
    if (!g) return;
    int hd = 128, kvd = n_head_kv * hd, nq = n_head * hd;
    size_t cache = be_kv_bytes(g->kv_type, (size_t)MAXP * KV_PAGE * kvd);
    int32_t perm[MAXP], pos = p, slot = 0, id = 0;
    page_perm(perm, MAXP);
    const int32_t *pages = perm;
    be_batch bt = { .T = 1, .pos = &pos, .pages = &pages, .slot = &slot, .n_dec = 1 };
    wt w[3];
    int no[3] = { nq, kvd, kvd };
    for (int i = 0; i < 3; i++) {
        size_t rb;
        w[i] = (wt){ .type = QT_Q8_0, .n_in = NIN, .n_out = (uint32_t)no[i] };
        w[i].data = kept(make_weight(QT_Q8_0, NIN, no[i], &rb));
        w[i].row_bytes = rb;
        CHECK(g->ops->weight_prepare(g, &w[i]) == 0);
    }
    float *q, *k, *v, *x = malloc(NIN * 4);
    wt bw[3];
    qkv_rand(g, 1, n_head, kvd, hd, &q, &k, &v, bw);
    for (int i = 0; i < NIN; i++) x[i] = frand();
    const wt *ws[3] = { &w[0], &w[1], &w[2] }, *bias[3] = { &bw[0], &bw[1], &bw[2] };
    const wt *none[3] = { NULL, NULL, NULL }, *const *bs = with_bias ? bias : none;
    char *zero = calloc(1, cache);
    void *kc[3], *vc[3];
    float *o[2][3];
    for (int r = 0; r < 3; r++) {
        kc[r] = g->ops->alloc(g, cache); vc[r] = g->ops->alloc(g, cache);
        g->ops->to_dev(g, kc[r], zero, cache); g->ops->to_dev(g, vc[r], zero, cache);
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) o[r][i] = g->ops->alloc(g, (size_t)no[i] * 4);
    float *dx = dev_from(g, x, NIN), *dq = dev_from(g, q, nq), *dk = dev_from(g, k, kvd), *dv = dev_from(g, v, kvd);
    CHECK(g->ops->step_begin(g, &id, &bt, NULL, 0) == 0);
    /* the pass's first rope_kv writes the angles */
    g->ops->rope_kv(g, dq, dk, dv, kc[2], vc[2], &bt, n_head, n_head_kv, hd, hd, 1e6f, neox, NULL, bs);
    g->ops->matmul_n(g, 3, ws, none, dx, 1, o[1]);   /* (x's int8 form, as a norm would leave it) */
    int fused = g->ops->qkv_rope(g, ws, bs, dx, o[1][0], o[1][1], o[1][2], kc[1], vc[1], &bt, n_head, n_head_kv,
                                 hd, hd, 1e6f, neox, NULL);
    CHECKF(fused, "qkv_rope heads %d/%d neox %d: not fused", n_head, n_head_kv, neox);
    g->ops->matmul_n(g, 3, ws, none, dx, 1, o[0]);
    g->ops->rope_kv(g, o[0][0], o[0][1], o[0][2], kc[0], vc[0], &bt, n_head, n_head_kv, hd, hd, 1e6f, neox, NULL,
                    bs);
    g->ops->step_end(g);
    size_t big = cache > (size_t)nq * 4 ? cache : (size_t)nq * 4;
    char *a = malloc(big), *b2 = malloc(big);
    const char *what[5] = { "q", "k", "v", "k cache", "v cache" };
    for (int i = 0; i < 5; i++) {
        const void *s0 = i < 3 ? (const void *)o[0][i] : i == 3 ? kc[0] : vc[0];
        const void *s1 = i < 3 ? (const void *)o[1][i] : i == 3 ? kc[1] : vc[1];
        size_t len = i < 3 ? (size_t)no[i] * 4 : cache;
        g->ops->to_host(g, a, s0, len);
        g->ops->to_host(g, b2, s1, len);
        CHECKF(memcmp(a, b2, len) == 0, "qkv_rope kv%s heads %d/%d neox %d bias %d pos %d: %s differs",
               kv_f16 ? "16" : "32", n_head, n_head_kv, neox, with_bias, p, what[i]);
    }
    g->ops->sync(g);
    for (int r = 0; r < 3; r++) { g->ops->free(g, kc[r]); g->ops->free(g, vc[r]); }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) g->ops->free(g, o[r][i]);
    g->ops->free(g, dx); g->ops->free(g, dq); g->ops->free(g, dk); g->ops->free(g, dv);
    g->ops->close(g);
    free(q); free(k); free(v); free(x); free(zero); free(a); free(b2);
}

void test_qkv_rope(void)
{
    CHECK(gpu->ops->qkv_rope != NULL);
    if (!gpu->ops->qkv_rope) return;
    qkv_rope_case(1, 4, 2, 1, 1, 37);    /* qwen2-style: neox pairs, biases, f16 cache */
    qkv_rope_case(1, 4, 2, 1, 0, 0);     /* no biases, the first position */
    qkv_rope_case(1, 6, 2, 0, 1, 700);   /* interleaved pairs (llama-style), a later page */
    qkv_rope_case(0, 4, 4, 1, 1, 130);   /* f32 cache */
    /* a 7b's heads: more blocks than a wave at a pair a block, two pairs a block */
    qkv_rope_case(1, 28, 4, 1, 1, 37);
    qkv_rope_case(0, 28, 4, 0, 1, 700);
}

void test_rope_attention(void)
{
    CHECK(gpu->ops->rope_attention != NULL && gpu->ops->step_begin != NULL);
    if (!gpu->ops->rope_attention || !gpu->ops->step_begin) return;
    /* (fused whatever the q/k/v set before: none here; the unfused side
     * without the tensor-core attention, whose other bits a 24-stream
     * batch would take: outside the promise) */
    char err[256];
    be *gs[2] = { NULL, NULL };
    const be_cuda_force f = { .rope_att = 1, .att_mma = -1 };
    int bad = gpu_open(&gs[0], 1, &f, err, sizeof err) || gpu_open(&gs[1], 0, &f, err, sizeof err);
    CHECKF(!bad, "%s", err);
    for (int i = 0; i < 2 && !bad; i++) {
        rope_att_case(gs[i], 4, 14, 2, 64, 64, 1, 1);     /* qwen2.5-0.5b: few blocks (rolled) */
        rope_att_case(gs[i], 24, 14, 2, 64, 64, 1, 1);    /* many (unrolled) */
        rope_att_case(gs[i], 3, 28, 4, 128, 128, 1, 0);   /* qwen2.5-7b shape, no biases */
        rope_att_case(gs[i], 5, 8, 2, 128, 64, 0, 1);     /* partial rotary, interleaved pairs */
        rope_att_case(gs[i], 2, 6, 3, 48, 32, 1, 1);      /* head_dim not a multiple of 32 */
    }
    for (int i = 0; i < 2; i++)
        if (gs[i]) gs[i]->ops->close(gs[i]);
}

/* The same random K and V rows at positions from .. from+n-1 of sequence
 * `slot` (page table pg) in the GPU caches and the CPU's */
static void kv_fill(be *gb, void *gkc, void *gvc, be *cb, void *ckc, void *cvc, int kvd, const int32_t *pg,
                    int slot, int from, int n)
{
    if (n <= 0) return;
    int32_t *fp = malloc((size_t)n * 4), *fs = malloc((size_t)n * 4);
    const int32_t **fpg = malloc((size_t)n * sizeof *fpg);
    for (int i = 0; i < n; i++) { fp[i] = from + i; fpg[i] = pg; fs[i] = slot; }
    be_batch fb = { .T = n, .pos = fp, .pages = fpg, .slot = fs };
    float *fk = malloc((size_t)n * kvd * 4), *fv = malloc((size_t)n * kvd * 4);
    for (size_t i = 0; i < (size_t)n * kvd; i++) { fk[i] = frand(); fv[i] = frand(); }
    float *dk = dev_from(gb, fk, (size_t)n * kvd), *dv = dev_from(gb, fv, (size_t)n * kvd);
    cb->ops->kv_store(cb, ckc, cvc, &fb, kvd, fk, fv);
    gb->ops->kv_store(gb, gkc, gvc, &fb, kvd, dk, dv);
    gb->ops->sync(gb);
    gb->ops->free(gb, dk); gb->ops->free(gb, dv);
    free(fk); free(fv); free(fp); free(fs); free(fpg);
}

/* Three sequences with scrambled page tables: a prefill batch of all their
 * tokens, then decode steps at longer contexts (split attention). */
static void attn_case(be *gb, be *cb, int n_head, int n_head_kv, int hd)
{
    enum { NS = 3, MAXP = 64 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(gb->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    int32_t *tbl[NS];
    for (int s = 0; s < NS; s++) tbl[s] = perm + s * MAXP;
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gb->ops->alloc(gb, cache), *gvc = gb->ops->alloc(gb, cache);
    int lens[NS] = { 37, 5, 300 };
    /* an output projection after the attention: the attention's own int8
     * form of its output (when it writes one) gives the same result */
    int nq_in = n_head * hd, wo_n = 40;
    size_t wo_rb;
    wt wo = { .type = QT_Q8_0, .n_in = nq_in, .n_out = wo_n };
    if (nq_in % 32 == 0) {
        wo.data = kept(make_weight(QT_Q8_0, nq_in, wo_n, &wo_rb));
        wo.row_bytes = wo_rb;
        CHECK(gb->ops->weight_prepare(gb, &wo) == 0);
    }
    for (int step = 0; step < 4; step++) {
        /* step 0: prefill lens[s] tokens each; later: one token each at a longer position */
        int T = 0;
        int32_t pos[400], slot[400];
        const int32_t *pages[400];
        for (int s = 0; s < NS; s++) {
            int from = step == 0 ? 0 : lens[s] + 200 * step - 1, to = step == 0 ? lens[s] : from + 1;
            for (int p = from; p < to; p++) { pos[T] = p; pages[T] = tbl[s]; slot[T] = s; T++; }
        }
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4), *g = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) q[i] = frand();
        for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
        if (step > 0) {
            /* fill the positions skipped since the last step with the same keys on both sides */
            for (int s = 0; s < NS; s++) {
                int from = step == 1 ? lens[s] : lens[s] + 200 * (step - 1), to = lens[s] + 200 * step - 1;
                kv_fill(gb, gkc, gvc, cb, ckc, cvc, kvd, tbl[s], s, from, to - from);
            }
        }
        float *dq = dev_from(gb, q, nq), *dk = dev_from(gb, k, nk), *dv = dev_from(gb, v, nk);
        float *dout = gb->ops->alloc(gb, nq * 4);
        cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
        cb->ops->attention(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, a);
        gb->ops->kv_store(gb, gkc, gvc, &bt, kvd, dk, dv);
        gb->ops->attention(gb, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dout);
        if (wo.data) {
            size_t no = (size_t)T * wo_n;
            float *p1 = gb->ops->alloc(gb, no * 4), *p2 = gb->ops->alloc(gb, no * 4);
            float *h1 = calloc(no, 4), *h2 = calloc(no, 4);
            gb->ops->matmul(gb, &wo, NULL, dout, T, p1);
            gb->ops->to_dev(gb, p2, h1, 4);   /* any write: xq is the matmul's own again */
            gb->ops->matmul(gb, &wo, NULL, dout, T, p2);
            gb->ops->to_host(gb, h1, p1, no * 4);
            gb->ops->to_host(gb, h2, p2, no * 4);
            CHECKF(memcmp(h1, h2, no * 4) == 0, "attention kv%s heads %d/%d hd %d step %d: projection of the "
                   "attention's int8 output differs", be_kv_name(gb->kv_type), n_head, n_head_kv, hd, step);
            gb->ops->free(gb, p1); gb->ops->free(gb, p2);
            free(h1); free(h2);
        }
        gb->ops->to_host(gb, g, dout, nq * 4);
        gb->ops->sync(gb);
        double e = rel_err_f(g, a, nq);
        CHECKF(e < 1e-4, "attention kv%s heads %d/%d hd %d step %d (T=%d): rel err %.3g",
               be_kv_name(gb->kv_type), n_head, n_head_kv, hd, step, T, e);
        /* batch invariance: each token alone gives the very same bits */
        for (int t = 0; t < T; t += step == 0 ? 61 : 1) {
            be_batch one = { .T = 1, .pos = pos + t, .pages = pages + t, .slot = slot + t };
            size_t row = (size_t)n_head * hd;
            float *dq1 = dev_from(gb, q + t * row, row), *do1 = gb->ops->alloc(gb, row * 4), *g1 = malloc(row * 4);
            gb->ops->attention(gb, dq1, gkc, gvc, &one, n_head, n_head_kv, hd, do1);
            gb->ops->to_host(gb, g1, do1, row * 4);
            gb->ops->sync(gb);
            CHECKF(!memcmp(g1, g + t * row, row * 4), "attention kv%s heads %d/%d step %d: token %d (pos %d) "
                   "alone differs from the batch of %d", be_kv_name(gb->kv_type), n_head, n_head_kv, step, t,
                   pos[t], T);
            gb->ops->free(gb, dq1); gb->ops->free(gb, do1); free(g1);
        }
        gb->ops->free(gb, dq); gb->ops->free(gb, dk); gb->ops->free(gb, dv); gb->ops->free(gb, dout);
        free(q); free(k); free(v); free(a); free(g);
    }
    /* the caches hold the same values */
    void *back = malloc(cache);
    gb->ops->to_host(gb, back, gkc, cache);
    CHECK(memcmp(back, ckc, cache) == 0);
    free(back);
    gb->ops->free(gb, gkc); gb->ops->free(gb, gvc);
    free(ckc); free(cvc);
}

/* A decode batch of many sequences (one token each, contexts of 1 to 700
 * positions, and some of 1,100 to 2,600: k_att_merge's chunks of 32 spans
 * and a part of one): the grouped kernel (a block per token and KV head; gb's
 * spans split over blocks, gd's all in one block) against the CPU, bit for
 * bit against the ungrouped kernel (gn: att_grp -1) and against
 * each token alone (split over blocks). gm[0..1]: the tensor-core form
 * (att_mma 1; spans split over blocks, and all in one block) against the CPU as
 * closely, or where it does not apply (f32 caches, head_dim 48) the
 * grouped kernel's bits. */
static void attn_group_case(be *gb, be *gd, be *gn, be *const *gm, be *cb, int n_head, int n_head_kv, int hd)
{
    enum { NS = 40, MAXP = 164 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(gb->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    static int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gb->ops->alloc(gb, cache), *gvc = gb->ops->alloc(gb, cache);
    int32_t pos[NS], slot[NS];
    const int32_t *pages[NS];
    for (int s = 0; s < NS; s++) {
        /* one-span tokens among them, and long ones */
        pos[s] = s % 5 == 0 ? (int)(rnd() % 32) : s % 7 == 3 ? 1100 + (int)(rnd() % 1500) : (int)(rnd() % 700);
        pages[s] = perm + s * MAXP;
        slot[s] = s;
    }
    /* the positions before each token: the same keys and values on both sides */
    for (int s = 0; s < NS; s++) kv_fill(gb, gkc, gvc, cb, ckc, cvc, kvd, pages[s], s, 0, pos[s]);
    be_batch bt = { .T = NS, .pos = pos, .pages = pages, .slot = slot };
    size_t row = (size_t)n_head * hd, nq = NS * row, nk = (size_t)NS * kvd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4);
    float *g = malloc(nq * 4), *h = malloc(nq * 4), *g1 = malloc(row * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand();
    for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
    float *dq = dev_from(gb, q, nq), *dk = dev_from(gb, k, nk), *dv = dev_from(gb, v, nk);
    float *dout = gb->ops->alloc(gb, nq * 4), *dn = gn->ops->alloc(gn, nq * 4);
    cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
    cb->ops->attention(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, a);
    gb->ops->kv_store(gb, gkc, gvc, &bt, kvd, dk, dv);
    gb->ops->attention(gb, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dout);
    gb->ops->to_host(gb, g, dout, nq * 4);
    gb->ops->sync(gb);
    const char *kv = be_kv_name(gb->kv_type);
    double e = rel_err_f(g, a, nq);
    CHECKF(e < 1e-4, "grouped attention kv%s heads %d/%d hd %d: rel err %.3g", kv, n_head, n_head_kv, hd, e);
    for (int o = 0; o < 2; o++) {
        be *ob = o ? gd : gn;
        ob->ops->attention(ob, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dn);
        ob->ops->to_host(ob, h, dn, nq * 4);
        ob->ops->sync(ob);
        CHECKF(!memcmp(g, h, nq * 4), "grouped attention kv%s heads %d/%d hd %d: differs from the %s kernel", kv,
               n_head, n_head_kv, hd, o ? "one-block grouped" : "ungrouped");
    }
    int mma = gb->kv_type == BE_KV_F16 && (hd == 64 || hd == 128);
    for (int o = 0; o < 2; o++) {
        gm[o]->ops->attention(gm[o], dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dn);
        gm[o]->ops->to_host(gm[o], h, dn, nq * 4);
        gm[o]->ops->sync(gm[o]);
        double em = rel_err_f(h, a, nq);
        CHECKF(em < 1e-4, "tensor-core attention (%s) kv%s heads %d/%d hd %d: rel err %.3g",
               o ? "one block" : "split", kv, n_head, n_head_kv, hd, em);
        if (!mma)
            CHECKF(!memcmp(g, h, nq * 4), "attention kv%s heads %d/%d hd %d: the tensor-core form changed bits",
                   kv, n_head, n_head_kv, hd);
    }
    for (int t = 0; t < NS; t++) {
        be_batch one = { .T = 1, .pos = pos + t, .pages = pages + t, .slot = slot + t };
        float *dq1 = dev_from(gb, q + t * row, row), *do1 = gb->ops->alloc(gb, row * 4);
        gb->ops->attention(gb, dq1, gkc, gvc, &one, n_head, n_head_kv, hd, do1);
        gb->ops->to_host(gb, g1, do1, row * 4);
        gb->ops->sync(gb);
        CHECKF(!memcmp(g1, g + t * row, row * 4), "grouped attention kv%s heads %d/%d: token %d (pos %d) alone "
               "differs from the batch of %d", kv, n_head, n_head_kv, t, pos[t], NS);
        gb->ops->free(gb, dq1); gb->ops->free(gb, do1);
    }
    gb->ops->free(gb, dq); gb->ops->free(gb, dk); gb->ops->free(gb, dv); gb->ops->free(gb, dout);
    gn->ops->free(gn, dn);
    gb->ops->free(gb, gkc); gb->ops->free(gb, gvc);
    free(q); free(k); free(v); free(a); free(g); free(h); free(g1); free(ckc); free(cvc);
}

void test_att_group(void)
{
    char err[256];
    be *gn = NULL, *gn32 = NULL, *gd = NULL, *gd32 = NULL, *gm[2] = { NULL, NULL }, *gm32[2] = { NULL, NULL };
    const be_cuda_force ungrouped = { .att_grp = -1 }, one = { .att_grp = 1 };
    const be_cuda_force mma_split = { .att_mma = 1, .att_grp = 4 }, mma_one = { .att_mma = 1, .att_grp = 1 };
    int bad = gpu_open(&gn, 1, &ungrouped, err, sizeof err) || gpu_open(&gn32, 0, &ungrouped, err, sizeof err) ||
              gpu_open(&gd, 1, &one, err, sizeof err) || gpu_open(&gd32, 0, &one, err, sizeof err) ||
              gpu_open(&gm[0], 1, &mma_split, err, sizeof err) || gpu_open(&gm[1], 1, &mma_one, err, sizeof err) ||
              gpu_open(&gm32[0], 0, &mma_split, err, sizeof err) || gpu_open(&gm32[1], 0, &mma_one, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (!bad) {
        attn_group_case(gpu, gd, gn, gm, cpu, 14, 2, 64);
        attn_group_case(gpu, gd, gn, gm, cpu, 28, 4, 128);
        attn_group_case(gpu, gd, gn, gm, cpu, 8, 2, 48);
        attn_group_case(gpu32, gd32, gn32, gm32, cpu32, 28, 4, 128);
    }
    be *all[8] = { gn, gn32, gd, gd32, gm[0], gm[1], gm32[0], gm32[1] };
    for (int i = 0; i < 8; i++)
        if (all[i]) all[i]->ops->close(all[i]);
    /* q8_0 caches: rows staged as f32 (the tensor-core form does not
     * apply: asking for it keeps the grouped kernel's bits) */
    be *q8[6] = { NULL };
    be *cq8 = NULL;
    bad = gpu_open(&q8[0], BE_KV_Q8_0, NULL, err, sizeof err) ||
          gpu_open(&q8[1], BE_KV_Q8_0, &one, err, sizeof err) ||
          gpu_open(&q8[2], BE_KV_Q8_0, &ungrouped, err, sizeof err) ||
          gpu_open(&q8[3], BE_KV_Q8_0, &mma_split, err, sizeof err) ||
          gpu_open(&q8[4], BE_KV_Q8_0, &mma_one, err, sizeof err) ||
          be_open(&cq8, "cpu", pl, BE_KV_Q8_0, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (!bad) {
        attn_group_case(q8[0], q8[1], q8[2], q8 + 3, cq8, 28, 4, 128);
        attn_group_case(q8[0], q8[1], q8[2], q8 + 3, cq8, 14, 2, 64);
        attn_group_case(q8[0], q8[1], q8[2], q8 + 3, cq8, 16, 8, 32);
    }
    for (int i = 0; i < 5; i++)
        if (q8[i]) q8[i]->ops->close(q8[i]);
    if (cq8) cq8->ops->close(cq8);
}

void test_attention(void)
{
    attn_case(gpu, cpu, 8, 2, 64);
    attn_case(gpu, cpu, 14, 2, 64);
    attn_case(gpu, cpu, 4, 4, 128);
    attn_case(gpu, cpu, 6, 3, 48);
    attn_case(gpu32, cpu32, 8, 2, 64);
    attn_case(gpu32, cpu32, 4, 1, 128);
    /* q8_0 caches: the same blocks as the CPU's, attention within 1e-4 */
    be *gq8 = NULL, *cq8 = NULL;
    char err[256];
    CHECKF(!gpu_open(&gq8, BE_KV_Q8_0, NULL, err, sizeof err), "%s", err);
    CHECKF(!be_open(&cq8, "cpu", pl, BE_KV_Q8_0, err, sizeof err), "%s", err);
    if (gq8 && cq8) {
        attn_case(gq8, cq8, 8, 2, 64);
        attn_case(gq8, cq8, 4, 4, 128);
        attn_case(gq8, cq8, 14, 2, 64);
        attn_case(gq8, cq8, 6, 3, 32);
        attn_case(gq8, cq8, 4, 2, 256);
    }
    if (gq8) gq8->ops->close(gq8);
    if (cq8) cq8->ops->close(cq8);
}

/* Random sinks, one per head (some large), prepared on g */
static wt sinks_rand(be *g, int n_head)
{
    float *sk = kept(malloc((size_t)n_head * 4));
    for (int h = 0; h < n_head; h++) sk[h] = frand() * 3 + (h % 3 == 0 ? 4 : 0);
    wt sinks = { .type = QT_F32, .n_in = n_head, .n_out = 1, .row_bytes = (size_t)n_head * 4, .data = sk };
    CHECK(g->ops->weight_prepare(g, &sinks) == 0);
    return sinks;
}

/* attention_ex against the CPU's: a prefill of two sequences (scrambled
 * pages) then a decode step each, with a window, sinks and a scale. */
static void attn_ex_case(be *gb, be *cb, int n_head, int n_head_kv, int hd, int window, int with_sinks, float scale)
{
    enum { NS = 2, MAXP = 24 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(gb->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gb->ops->alloc(gb, cache), *gvc = gb->ops->alloc(gb, cache);
    wt sinks = sinks_rand(gb, n_head);
    be_attn_ex ex = { window, with_sinks ? &sinks : NULL, scale };
    int lens[NS] = { 300, 41 };
    for (int step = 0; step < 2; step++) {
        int T = 0;
        int32_t pos[400], slot[400];
        const int32_t *pages[400];
        for (int s = 0; s < NS; s++) {
            int from = step == 0 ? 0 : lens[s], to = step == 0 ? lens[s] : lens[s] + 1;
            for (int p = from; p < to; p++) { pos[T] = p; pages[T] = perm + s * MAXP; slot[T] = s; T++; }
        }
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4), *g = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) q[i] = frand() * 2;
        for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
        float *dq = dev_from(gb, q, nq), *dk = dev_from(gb, k, nk), *dv = dev_from(gb, v, nk);
        float *dout = gb->ops->alloc(gb, nq * 4);
        cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
        cb->ops->attention_ex(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, &ex, a);
        gb->ops->kv_store(gb, gkc, gvc, &bt, kvd, dk, dv);
        gb->ops->attention_ex(gb, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, &ex, dout);
        gb->ops->to_host(gb, g, dout, nq * 4);
        gb->ops->sync(gb);
        double e = rel_err_f(g, a, nq);
        CHECKF(e < 1e-4, "attention_ex kv %s heads %d/%d hd %d window %d sinks %d scale %g step %d: rel err %.3g",
               be_kv_name(gb->kv_type), n_head, n_head_kv, hd, window, with_sinks, scale, step, e);
        gb->ops->free(gb, dq); gb->ops->free(gb, dk); gb->ops->free(gb, dv); gb->ops->free(gb, dout);
        free(q); free(k); free(v); free(a); free(g);
    }
    gb->ops->free(gb, gkc); gb->ops->free(gb, gvc);
    free(ckc); free(cvc);
}

void test_attention_ex(void)
{
    attn_ex_case(gpu, cpu, 8, 2, 64, 0, 1, 0);
    attn_ex_case(gpu, cpu, 8, 2, 64, 37, 0, 0);
    attn_ex_case(gpu, cpu, 4, 1, 256, 512, 0, 0.0625f);
    attn_ex_case(gpu, cpu, 6, 3, 48, 16, 1, 0.2f);
    attn_ex_case(gpu32, cpu32, 8, 8, 128, 1, 1, 0);
    attn_ex_case(gpu32, cpu32, 4, 2, 32, 100, 1, 0);
    be *gq8 = NULL, *cq8 = NULL;
    char err[256];
    CHECKF(!gpu_open(&gq8, BE_KV_Q8_0, NULL, err, sizeof err), "%s", err);
    CHECKF(!be_open(&cq8, "cpu", pl, BE_KV_Q8_0, err, sizeof err), "%s", err);
    if (gq8 && cq8) {
        attn_ex_case(gq8, cq8, 8, 2, 64, 0, 1, 0);
        attn_ex_case(gq8, cq8, 8, 2, 64, 37, 0, 0);
        attn_ex_case(gq8, cq8, 4, 1, 256, 512, 0, 0.0625f);
        attn_ex_case(gq8, cq8, 4, 2, 32, 100, 1, 0);
    }
    if (gq8) gq8->ops->close(gq8);
    if (cq8) cq8->ops->close(cq8);
}

/* A batch of two decode rows (sequences D, E) then prompts of three
 * sequences (A from position 0, B after 700 cached positions, C of 3
 * tokens): with tensor cores forced (gf), the prompt rows go to
 * ck_att_prompt, within 1e-4 of the CPU (attention, or attention_ex with
 * a window, sinks and a scale when ex), and the decode rows keep the bits
 * they have in a batch of their own. */
static void attn_prompt_case(be *gf, be *cb, int n_head, int n_head_kv, int hd, int ex, int window, int with_sinks,
                             float scale)
{
    enum { NS = 5, MAXP = 64 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(gf->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gf->ops->alloc(gf, cache), *gvc = gf->ops->alloc(gf, cache);
    wt sinks = sinks_rand(gf, n_head);
    be_attn_ex aex = { window, with_sinks ? &sinks : NULL, scale };
    /* sequences D, E, A, B, C: cached positions before the batch, rows in it */
    const int from[NS] = { 200, 90, 0, 700, 0 }, cnt[NS] = { 1, 1, 300, 45, 3 };
    int T = 0;
    int32_t pos[400], slot[400];
    const int32_t *pages[400];
    for (int s = 0; s < NS; s++) {
        kv_fill(gf, gkc, gvc, cb, ckc, cvc, kvd, perm + s * MAXP, s, 0, from[s]);
        for (int i = 0; i < cnt[s]; i++) { pos[T] = from[s] + i; pages[T] = perm + s * MAXP; slot[T] = s; T++; }
    }
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot, .n_dec = 2 };
    size_t row = (size_t)n_head * hd, nq = (size_t)T * row, nk = (size_t)T * kvd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4), *g = malloc(nq * 4);
    float *g2 = malloc(2 * row * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand() * 2;
    for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
    float *dq = dev_from(gf, q, nq), *dk = dev_from(gf, k, nk), *dv = dev_from(gf, v, nk);
    float *dout = gf->ops->alloc(gf, nq * 4);
    cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
    gf->ops->kv_store(gf, gkc, gvc, &bt, kvd, dk, dv);
    for (int pass = 0; pass < 2; pass++) {
        be_batch dec = { .T = 2, .pos = pos, .pages = pages, .slot = slot, .n_dec = 2 };
        const be_batch *b = pass ? &dec : &bt;
        if (ex) gf->ops->attention_ex(gf, dq, gkc, gvc, b, n_head, n_head_kv, hd, &aex, dout);
        else gf->ops->attention(gf, dq, gkc, gvc, b, n_head, n_head_kv, hd, dout);
        gf->ops->to_host(gf, pass ? g2 : g, dout, (pass ? 2 * row : nq) * 4);
        gf->ops->sync(gf);
    }
    if (ex) cb->ops->attention_ex(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, &aex, a);
    else cb->ops->attention(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, a);
    /* (a q8_0 cache: q rounded to f16, where the CPU keeps it in f32) */
    double e = rel_err_f(g + 2 * row, a + 2 * row, nq - 2 * row), tol = gf->kv_type == BE_KV_Q8_0 ? 1e-3 : 1e-4;
    CHECKF(e < tol, "prompt attention%s kv %s heads %d/%d hd %d window %d sinks %d: rel err %.3g", ex ? "_ex" : "",
           be_kv_name(gf->kv_type), n_head, n_head_kv, hd, window, with_sinks, e);
    CHECKF(!memcmp(g, g2, 2 * row * 4), "prompt attention%s heads %d/%d hd %d: the decode rows differ from a batch "
           "of their own", ex ? "_ex" : "", n_head, n_head_kv, hd);
    gf->ops->free(gf, dq); gf->ops->free(gf, dk); gf->ops->free(gf, dv); gf->ops->free(gf, dout);
    gf->ops->free(gf, gkc); gf->ops->free(gf, gvc);
    free(q); free(k); free(v); free(a); free(g); free(g2); free(ckc); free(cvc);
}

void test_attention_prompt(void)
{
    const be_cuda_force mma = { .att_mma = 1 };
    be *gf = NULL;
    char err[256];
    CHECKF(!gpu_open(&gf, 1, &mma, err, sizeof err), "%s", err);
    if (!gf) return;
    attn_prompt_case(gf, cpu, 8, 2, 64, 0, 0, 0, 0);
    attn_prompt_case(gf, cpu, 28, 4, 128, 0, 0, 0, 0);
    attn_prompt_case(gf, cpu, 32, 4, 128, 0, 0, 0, 0);
    attn_prompt_case(gf, cpu, 16, 16, 64, 0, 0, 0, 0);
    attn_prompt_case(gf, cpu, 12, 1, 128, 0, 0, 0, 0);
    attn_prompt_case(gf, cpu, 10, 2, 128, 0, 0, 0, 0);
    attn_prompt_case(gf, cpu, 64, 8, 64, 1, 128, 1, 0);
    attn_prompt_case(gf, cpu, 32, 4, 128, 1, 37, 0, 0);
    attn_prompt_case(gf, cpu, 8, 2, 64, 1, 0, 1, 0.2f);
    attn_prompt_case(gf, cpu, 6, 3, 128, 1, 100, 1, 0.0625f);
    gf->ops->close(gf);
    be *cq8 = NULL;
    gf = NULL;
    CHECKF(!gpu_open(&gf, BE_KV_Q8_0, &mma, err, sizeof err), "%s", err);
    CHECKF(!be_open(&cq8, "cpu", pl, BE_KV_Q8_0, err, sizeof err), "%s", err);
    if (gf && cq8) {
        attn_prompt_case(gf, cq8, 8, 2, 64, 0, 0, 0, 0);
        attn_prompt_case(gf, cq8, 28, 4, 128, 0, 0, 0, 0);
        attn_prompt_case(gf, cq8, 16, 16, 64, 0, 0, 0, 0);
        attn_prompt_case(gf, cq8, 64, 8, 64, 1, 128, 1, 0);
        attn_prompt_case(gf, cq8, 6, 3, 128, 1, 100, 1, 0.0625f);
    }
    if (gf) gf->ops->close(gf);
    if (cq8) cq8->ops->close(cq8);
}
