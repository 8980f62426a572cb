/* t_deltanet — the Gated DeltaNet ops of the CPU backend against scalar
 * token-by-token references (double precision) on random data: the chunked
 * delta rule over runs longer than a chunk, several sequences in one batch
 * with state carried in from earlier batches, a run split over two batches,
 * state reset at position 0, and the causal conv with its state. Then
 * Qwen3.5 through the engine: concurrent greedy jobs (continuous batching)
 * give the same tokens as one job alone, and prefix reuse (from snapshots of
 * the recurrent state) gives the same tokens as recomputing. */
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/pool.h"
#include "engine/snap.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(void)   /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0) * 2 - 1);
}

static wt f32_vec(float *v, int n) { return (wt){ .type = 0, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = v }; }

/* The recurrence exactly as the transformers reference states it, one token
 * at a time, in double. S: [nv][dk][dv] of this sequence. */
static void ref_step(const float *row, float a_h[], float b_h[], const float *A, const float *dt, double *S,
                     int nk, int nv, int dk, int dv, float eps, double *out)
{
    for (int h = 0; h < nv; h++) {
        int kh = h % nk;
        const float *q = row + (size_t)kh * dk, *k = row + (size_t)(nk + kh) * dk,
                    *v = row + (size_t)2 * nk * dk + (size_t)h * dv;
        double qs = 0, ks = 0, qn[256], kn[256];
        for (int d = 0; d < dk; d++) { qs += (double)q[d] * q[d]; ks += (double)k[d] * k[d]; }
        for (int d = 0; d < dk; d++) {
            qn[d] = q[d] / sqrt(qs + eps) / sqrt((double)dk);
            kn[d] = k[d] / sqrt(ks + eps);
        }
        double x = (double)a_h[h] + dt[h];
        double g = A[h] * (x > 20 ? x : log1p(exp(x)));
        double beta = 1 / (1 + exp(-(double)b_h[h]));
        double *Sh = S + (size_t)h * dk * dv;
        for (int i = 0; i < dk * dv; i++) Sh[i] *= exp(g);
        for (int c = 0; c < dv; c++) {
            double mem = 0;
            for (int d = 0; d < dk; d++) mem += Sh[(size_t)d * dv + c] * kn[d];
            double delta = (v[c] - mem) * beta;
            for (int d = 0; d < dk; d++) Sh[(size_t)d * dv + c] += kn[d] * delta;
        }
        for (int c = 0; c < dv; c++) {
            double o = 0;
            for (int d = 0; d < dk; d++) o += Sh[(size_t)d * dv + c] * qn[d];
            out[(size_t)h * dv + c] = o;
        }
    }
}

typedef struct seqdef { int slot, pos0, n; } seqdef;

static void deltanet_case(be *b, int nk, int nv, int dk, int dv, const seqdef *seqs, int n_seq, int split,
                          int save_slot, int save_pos)
{
    const float eps = 1e-6f;
    int max_seqs = 4, stride = 2 * nk * dk + nv * dv;
    size_t head_sz = (size_t)dk * dv, slot_sz = (size_t)nv * head_sz;
    int T = 0;
    for (int s = 0; s < n_seq; s++) T += seqs[s].n;
    float *qkv = malloc((size_t)T * stride * 4), *a = malloc((size_t)T * nv * 4), *bb = malloc((size_t)T * nv * 4);
    float *out = malloc((size_t)T * nv * dv * 4), A[64], dt[64];
    float *state = malloc((size_t)max_seqs * slot_sz * 4);
    double *ref_state = malloc((size_t)max_seqs * slot_sz * 8), *ref_out = malloc((size_t)T * nv * dv * 8);
    int32_t *pos = malloc((size_t)T * 4), *slot = malloc((size_t)T * 4);
    float *saved = calloc(slot_sz, 4);
    double *ref_saved = calloc(slot_sz, 8);
    for (size_t i = 0; i < (size_t)T * stride; i++) qkv[i] = frand();
    for (size_t i = 0; i < (size_t)T * nv; i++) { a[i] = 2 * frand(); bb[i] = 3 * frand(); }
    for (int h = 0; h < nv; h++) { A[h] = -(0.05f + 4 * fabsf(frand())); dt[h] = frand(); }
    for (size_t i = 0; i < (size_t)max_seqs * slot_sz; i++) { state[i] = 0.5f * frand(); ref_state[i] = state[i]; }
    int t = 0;
    for (int s = 0; s < n_seq; s++) {
        if (seqs[s].pos0 == 0) memset(ref_state + (size_t)seqs[s].slot * slot_sz, 0, slot_sz * 8);
        for (int i = 0; i < seqs[s].n; i++, t++) {
            pos[t] = seqs[s].pos0 + i;
            slot[t] = seqs[s].slot;
            ref_step(qkv + (size_t)t * stride, a + (size_t)t * nv, bb + (size_t)t * nv, A, dt,
                     ref_state + (size_t)slot[t] * slot_sz, nk, nv, dk, dv, eps, ref_out + (size_t)t * nv * dv);
            if (slot[t] == save_slot && pos[t] + 1 == save_pos)
                memcpy(ref_saved, ref_state + (size_t)slot[t] * slot_sz, slot_sz * 8);
        }
    }
    wt Aw = f32_vec(A, nv), dtw = f32_vec(dt, nv);
    /* the batch in one call, or cut at `split` tokens into two calls */
    int cuts[3] = { 0, split > 0 && split < T ? split : T, T };
    for (int c = 0; c < 2; c++) {
        int t0 = cuts[c], n = cuts[c + 1] - cuts[c];
        if (n <= 0) continue;
        be_batch bt = { .T = n, .pos = pos + t0, .pages = NULL, .slot = slot + t0 };
        be_save sv = { save_slot, save_pos, saved };
        b->ops->deltanet(b, qkv + (size_t)t0 * stride, (size_t)stride, a + (size_t)t0 * nv, bb + (size_t)t0 * nv,
                         &Aw, &dtw, state, &bt, nk, nv, dk, dv, eps, &sv, save_pos > 0, out + (size_t)t0 * nv * dv);
    }
    double worst = 0, worst_s = 0;
    for (size_t i = 0; i < (size_t)T * nv * dv; i++) {
        double d = fabs(out[i] - ref_out[i]) / (1 + fabs(ref_out[i]));
        if (d > worst) worst = d;
    }
    for (int s = 0; s < n_seq; s++)
        for (size_t i = 0; i < slot_sz; i++) {
            size_t k = (size_t)seqs[s].slot * slot_sz + i;
            double d = fabs(state[k] - ref_state[k]) / (1 + fabs(ref_state[k]));
            if (d > worst_s) worst_s = d;
        }
    double worst_v = 0;
    for (size_t i = 0; save_pos > 0 && i < slot_sz; i++) {
        double d = fabs(saved[i] - ref_saved[i]) / (1 + fabs(ref_saved[i]));
        if (d > worst_v) worst_v = d;
    }
    CHECKF(worst_v < 2e-5, "save point %d of slot %d differs by %g", save_pos, save_slot, worst_v);
    CHECKF(worst < 2e-5, "nk %d nv %d dk %d dv %d T %d split %d: output differs by %g", nk, nv, dk, dv, T, split, worst);
    CHECKF(worst_s < 2e-5, "nk %d nv %d dk %d dv %d T %d split %d: state differs by %g", nk, nv, dk, dv, T, split, worst_s);
    fprintf(stderr, "  deltanet nk %d nv %d dk %3d dv %3d T %3d split %3d: max rel err out %.2e state %.2e\n",
            nk, nv, dk, dv, T, split, worst, worst_s);
    free(qkv); free(a); free(bb); free(out); free(state); free(ref_state); free(ref_out); free(pos); free(slot);
    free(saved); free(ref_saved);
}

static be *g_be;

static void test_deltanet_chunked(void)
{
    /* decode token with carried state, a fresh 150-token prompt (3 chunks,
     * its slot holding garbage), a continuation of 40 tokens */
    seqdef mix[] = { { 1, 5, 1 }, { 0, 0, 150 }, { 2, 10, 40 } };
    deltanet_case(g_be, 2, 4, 16, 8, mix, 3, 0, 0, 0);
    deltanet_case(g_be, 2, 4, 32, 32, mix, 3, 0, 0, 96);      /* save points: in a run, */
    deltanet_case(g_be, 1, 3, 64, 16, mix, 3, 0, 2, 50);      /* at a run's end */
    deltanet_case(g_be, 1, 3, 64, 16, mix, 3, 0, 0, 77);
    /* one sequence cut over two batches at, and off, a chunk boundary */
    seqdef one[] = { { 3, 0, 200 } };
    deltanet_case(g_be, 2, 4, 16, 16, one, 1, 0, 3, 130);
    deltanet_case(g_be, 2, 4, 16, 16, one, 1, 64, 0, 0);
    deltanet_case(g_be, 2, 4, 16, 16, one, 1, 77, 0, 0);
    /* decoding only: one token for each of four sequences */
    seqdef dec[] = { { 0, 3, 1 }, { 1, 9, 1 }, { 2, 1, 1 }, { 3, 100, 1 } };
    deltanet_case(g_be, 2, 4, 32, 32, dec, 4, 0, 3, 101);    /* and after a decode step */
}

static void test_conv1d(void)
{
    be *b = g_be;
    enum { C = 70, K = 4, T = 9, S = 2 };
    float x[T][C], w[C][K], out[T][C], state[S][K - 1][C], ref_state[S][K - 1][C];
    int32_t pos[T] = { 0, 1, 2, 3, 4, 7, 8, 9, 10 }, slot[T] = { 0, 0, 0, 0, 0, 1, 1, 1, 1 };
    for (int t = 0; t < T; t++) for (int c = 0; c < C; c++) x[t][c] = frand();
    for (int c = 0; c < C; c++) for (int k = 0; k < K; k++) w[c][k] = frand();
    for (int s = 0; s < S; s++) for (int p = 0; p < K - 1; p++) for (int c = 0; c < C; c++)
        state[s][p][c] = ref_state[s][p][c] = frand();
    wt ww = { .type = 0, .n_in = K, .n_out = C, .row_bytes = K * 4, .data = w };
    be_batch bt = { .T = T, .pos = pos, .pages = NULL, .slot = slot };
    float saved[K - 1][C], ref_saved[K - 1][C];
    be_save sv = { 0, 3, &saved[0][0] };   /* slot 0 after its token at position 2 */
    b->ops->conv1d_silu(b, &x[0][0], &ww, &state[0][0][0], &bt, C, K, &sv, 1, &out[0][0]);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        int s = slot[t];
        if (pos[t] == 0) memset(ref_state[s], 0, sizeof ref_state[s]);
        for (int c = 0; c < C; c++) {
            double y = w[c][K - 1] * (double)x[t][c];
            for (int p = 0; p < K - 1; p++) y += w[c][p] * (double)ref_state[s][p][c];
            for (int p = 0; p < K - 2; p++) ref_state[s][p][c] = ref_state[s][p + 1][c];
            ref_state[s][K - 2][c] = x[t][c];
            if (s == 0 && pos[t] == 2) for (int p = 0; p < K - 1; p++) ref_saved[p][c] = ref_state[s][p][c];
            double r = y / (1 + exp(-y));
            if (fabs(r - out[t][c]) > worst) worst = fabs(r - out[t][c]);
        }
    }
    CHECKF(worst < 1e-5, "conv output differs by %g", worst);
    CHECK(memcmp(state, ref_state, sizeof state) == 0);
    CHECK(memcmp(saved, ref_saved, sizeof saved) == 0);
}

/* ---- Qwen3.5 through the engine ------------------------------------------ */

typedef struct res { int32_t gen[64]; int n_gen; int done; } res;

static void test_qwen35_concurrent(void)
{
    char err[256];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = FIXTURE("models/qwen35-tiny.bf16.gguf");
    o.n_threads = 2;
    o.max_seqs = 4;
    /* prompts of different lengths (one longer than a chunk) */
    enum { N = 4, GEN = 12 };
    int32_t prompts[N][80];
    int lens[N] = { 3, 17, 80, 1 };
    for (int i = 0; i < N; i++) for (int k = 0; k < lens[i]; k++) prompts[i][k] = (int32_t)((i * 977 + k * 131) % 4000);
    res alone[N] = { 0 }, together[N] = { 0 };
    for (int pass = 0; pass < 2; pass++) {
        res *r = pass ? together : alone;
        uint64_t ids[N];
        /* a fresh engine for each pass: nothing reused, batching alone differs */
        eng_close(e);
        if (eng_open(&e, &o, err, sizeof err)) { CHECKF(0, "%s", err); return; }
        for (int i = 0; i < N; i++) {
            eng_job_desc d = { 0 };
            d.kind = ENG_JOB_GENERATE;
            d.tokens = prompts[i];
            d.n_tokens = (size_t)lens[i];
            d.max_tokens = GEN;
            eng_sampling_default(&d.sampling);
            d.sampling.temperature = 0;
            eng_err code;
            if (eng_submit(e, &d, &ids[i], &code, err, sizeof err)) { CHECKF(0, "%s", err); return; }
            /* alone: wait for each job before the next */
            for (int spins = 0; !pass && !r[i].done && spins < 200000; spins++) {
                eng_event *ev = eng_events_take(e);
                if (!ev) { usleep(200); continue; }
                while (ev) {
                    eng_event *nx = ev->next;
                    if (ev->type == ENG_EV_TOKEN && r[i].n_gen < 64) r[i].gen[r[i].n_gen++] = ev->token;
                    else if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) r[i].done = 1;
                    eng_event_free(ev);
                    ev = nx;
                }
            }
        }
        for (int spins = 0; pass && spins < 200000; spins++) {
            int all = 1;
            for (int i = 0; i < N; i++) all &= r[i].done;
            if (all) break;
            eng_event *ev = eng_events_take(e);
            if (!ev) { usleep(200); continue; }
            while (ev) {
                eng_event *nx = ev->next;
                for (int i = 0; i < N; i++)
                    if (ev->job_id == ids[i]) {
                        if (ev->type == ENG_EV_TOKEN && r[i].n_gen < 64) r[i].gen[r[i].n_gen++] = ev->token;
                        else if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) r[i].done = 1;
                    }
                eng_event_free(ev);
                ev = nx;
            }
        }
    }
    for (int i = 0; i < N; i++) {
        CHECK(alone[i].done && together[i].done);
        CHECK_EQ_INT(together[i].n_gen, alone[i].n_gen);
        CHECKF(!memcmp(alone[i].gen, together[i].gen, sizeof alone[i].gen), "job %d: tokens differ when batched", i);
    }
    eng_close(e);
}

/* copy_rows, sigmoid_mul, rmsnorm_gated against their definitions (sizes
 * that cross the CPU backend's block boundaries) */
static void test_small_ops(void)
{
    be *b = g_be;
    enum { R = 150, N = 48 };
    static float x[R][N], z[R][N], out[R][N], y[R][2 * N], w[N];
    for (int r = 0; r < R; r++) for (int i = 0; i < N; i++) { x[r][i] = 3 * frand(); z[r][i] = 4 * frand(); }
    for (int i = 0; i < N; i++) w[i] = 1 + frand();
    for (int r = 0; r < R; r++) for (int i = 0; i < 2 * N; i++) y[r][i] = frand();
    b->ops->copy_rows(b, &out[0][0], N, &y[0][0] + N, 2 * N, R, N);
    CHECK(memcmp(out[R - 1], y[R - 1] + N, sizeof out[0]) == 0 && memcmp(out[0], y[0] + N, sizeof out[0]) == 0);
    wt ww = f32_vec(w, N);
    b->ops->rmsnorm_gated(b, &x[0][0], &z[0][0], &ww, R, N, 1e-6f, &out[0][0]);
    double worst = 0;
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < N; i++) ss += (double)x[r][i] * x[r][i];
        for (int i = 0; i < N; i++) {
            double want = x[r][i] / sqrt(ss / N + 1e-6) * w[i] * z[r][i] / (1 + exp(-(double)z[r][i]));
            if (fabs(want - out[r][i]) > worst) worst = fabs(want - out[r][i]);
        }
    }
    CHECKF(worst < 1e-5, "rmsnorm_gated differs by %g", worst);
    memcpy(out, x, sizeof out);
    b->ops->sigmoid_mul(b, &out[0][0], &z[0][0], (size_t)R * N);
    worst = 0;
    for (int r = 0; r < R; r++) for (int i = 0; i < N; i++) {
        double want = x[r][i] / (1 + exp(-(double)z[r][i]));
        if (fabs(want - out[r][i]) > worst) worst = fabs(want - out[r][i]);
    }
    CHECKF(worst < 1e-5, "sigmoid_mul differs by %g", worst);
}

static void test_snapc(void)
{
    snapc *s;
    CHECK(snapc_open(&s, 3, 64) == 0);
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++) { a[i] = i; b[i] = i < 16 ? i : 1000 + i; }
    int len, x = snapc_take(s, &a), y = snapc_take(s, &b);
    CHECK(x >= 0 && y >= 0 && x != y);
    CHECK(snapc_find(s, a, 64, 16, &len) == -1);
    snapc_set(s, x, a, 32);
    snapc_set(s, y, b, 48);
    CHECK(snapc_find(s, a, 64, 16, &len) == x && len == 32);
    CHECK(snapc_find(s, a, 31, 16, &len) == -1);                   /* too long for the limit */
    CHECK(snapc_find(s, b, 64, 16, &len) == y && len == 48);
    snapc_set(s, x, a, 20);
    CHECK(snapc_find(s, a, 64, 16, &len) == -1);                   /* not page aligned */
    int z = snapc_take(s, &len);
    CHECK(z >= 0 && z != x && z != y);
    CHECK(snapc_take(s, &len) == -1);                              /* every entry held */
    snapc_release(s, y);
    CHECK(snapc_take(s, &len) == y);                               /* reused: its snapshot dropped */
    CHECK(snapc_find(s, b, 64, 16, &len) == -1);
    snapc_close(s);
    snapc_close(NULL);
}

/* One greedy job, waited for: its tokens and the prompt tokens it reused. */
static int gen(eng *e, const int32_t *toks, int n, int max_tokens, int32_t *out, int *cached)
{
    char err[256];
    eng_err code;
    uint64_t id;
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.tokens = toks;
    d.n_tokens = (size_t)n;
    d.max_tokens = max_tokens;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    if (eng_submit(e, &d, &id, &code, err, sizeof err)) { CHECKF(0, "%s", err); return 0; }
    int n_out = 0, done = 0;
    *cached = -1;
    for (int spins = 0; !done && spins < 200000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(200); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            if (ev->type == ENG_EV_TOKEN && n_out < max_tokens) out[n_out++] = ev->token;
            else if (ev->type == ENG_EV_DONE) { done = 1; *cached = (int)ev->cached_tokens; }
            else if (ev->type == ENG_EV_ERROR) done = 1;
            eng_event_free(ev);
            ev = nx;
        }
    }
    CHECK(done);
    return n_out;
}

static eng *open_q35(void)
{
    char err[256];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = FIXTURE("models/qwen35-tiny.bf16.gguf");
    o.n_threads = 2;
    o.max_seqs = 2;
    if (eng_open(&e, &o, err, sizeof err)) { CHECKF(0, "%s", err); return NULL; }
    return e;
}

/* The same job on a fresh engine (nothing cached): the reference. */
static int gen_fresh(const int32_t *toks, int n, int max_tokens, int32_t *out)
{
    eng *e = open_q35();
    if (!e) return 0;
    int cached, k = gen(e, toks, n, max_tokens, out, &cached);
    CHECK_EQ_INT(cached, 0);
    eng_close(e);
    return k;
}

/* Prefix reuse on a recurrent model resumes from a snapshot of the
 * recurrent state at a page boundary and gives what recomputing gives. */
static void test_qwen35_prefix_reuse(void)
{
    eng *e = open_q35();
    if (!e) return;
    int32_t base[64], conv[80], other[40], out[16], ref[16];
    for (int i = 0; i < 64; i++) base[i] = (int32_t)((i * 389 + 17) % 4000);
    int cached;
    /* a first prompt: snapshots at 32 (its last page boundary) and, while
     * decoding, at 48 */
    int n = gen(e, base, 45, 8, out, &cached);
    CHECK_EQ_INT(n, 8);
    CHECK_EQ_INT(cached, 0);
    /* the conversation continues: prompt + answer + more, resumes at 48 */
    memcpy(conv, base, 45 * sizeof *conv);
    memcpy(conv + 45, out, 8 * sizeof *conv);
    for (int i = 0; i < 7; i++) conv[53 + i] = (int32_t)(100 + i * 7);
    n = gen(e, conv, 60, 8, out, &cached);
    CHECK_EQ_INT(cached, 48);
    int rn = gen_fresh(conv, 60, 8, ref);
    CHECK(n == rn && !memcmp(out, ref, (size_t)n * sizeof *out));
    /* the first prompt again: its own boundary snapshot survived decoding */
    int32_t first[16];
    memcpy(first, conv + 45, 8 * sizeof *first);
    n = gen(e, base, 45, 8, out, &cached);
    CHECK_EQ_INT(cached, 32);
    CHECK(n == 8 && !memcmp(out, first, 8 * sizeof *out));
    /* another prompt sharing 32 tokens */
    memcpy(other, base, 32 * sizeof *other);
    for (int i = 32; i < 40; i++) other[i] = (int32_t)(2000 + i);
    n = gen(e, other, 40, 8, out, &cached);
    CHECK_EQ_INT(cached, 32);
    rn = gen_fresh(other, 40, 8, ref);
    CHECK(n == rn && !memcmp(out, ref, (size_t)n * sizeof *out));
    /* shorter than a page: nothing to reuse */
    n = gen(e, base, 10, 4, out, &cached);
    CHECK_EQ_INT(cached, 0);
    eng_close(e);
}

int main(void)
{
    pool *p = NULL;
    char err[128];
    if (pool_open(&p, 2) || be_cpu_open(&g_be, p, 0, err, sizeof err)) {
        fprintf(stderr, "cannot open the CPU backend\n");
        return 1;
    }
    RUN(test_deltanet_chunked);
    RUN(test_conv1d);
    RUN(test_small_ops);
    RUN(test_snapc);
    RUN(test_qwen35_concurrent);
    RUN(test_qwen35_prefix_reuse);
    g_be->ops->close(g_be);
    pool_close(p);
    return CHECK_DONE();
}
