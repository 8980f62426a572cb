/* anebench — in-process speed of the engine on one model.
 *
 *   anebench --model FILE [--prompt N] [--gen M] [--threads T] [--streams S]
 *            [--repeat R] [--backend cpu|cuda] [--gpus LIST] [--split heads|layers] [--gpu-layers N] [--ctx N] [--kv-type f16|q8_0|f32]
 *            [--json-schema FILE] [--deterministic] [--json]
 *
 * --deterministic: as aned's (decode rows and attention never on tensor
 * cores past the batch-invariance promise).
 *
 * Prefill: a prompt of N tokens, generate 1 token; prefill tokens/s from the
 * engine's own timing. Decode: M greedy tokens; decode tokens/s over the
 * tokens after the first. With --streams S, S greedy jobs run at once and the
 * aggregate decode rate is reported beside the single-stream one. The weight
 * bytes read per decode step over the measured time give the achieved
 * bandwidth, shown against a plain multi-threaded memory read measured in the
 * same run (once at the end: the "decode" line, mem_read_gbs, bw_fraction),
 * and against reads right after each decode repeat for as long as it took:
 * the "bandwidth" line gives the median of those per-repeat fractions
 * (rep_bw_fraction), so that one quiet or busy moment of a shared machine
 * does not decide the ratio. The "pages" line says how much of the process
 * sits in 2 MiB pages (weights included). Each figure is the median of R
 * repeats. On a shared machine the
 * wall-clock rates measure the other load as much as the engine, so the
 * single-stream rates are also given per CPU-second of the process (times the
 * thread count): the rate with the cores to itself. */
#include "engine/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- memory-read ceiling ---- */
/* Three ways to read: the plain scalar loop (the end-of-run figure, as it
 * always was), a loop over 64-byte vectors as the compiler lowers it for the
 * build's target, and the same loop with 64-byte (AVX-512) loads where the
 * CPU has them. A ceiling is the fastest of them. */
typedef uint64_t rd_v8 __attribute__((vector_size(64)));
typedef struct { const uint8_t *p; size_t n; int how; uint64_t sum; } rd_arg;

static uint64_t rd_scalar(const uint8_t *b, size_t bytes)
{
    const uint64_t *p = (const uint64_t *)(const void *)b;
    size_t n = bytes / 8;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
    return s0 + s1 + s2 + s3;
}

#define RD_VEC_BODY                                                                          \
    const rd_v8 *p = (const rd_v8 *)(const void *)b;                                         \
    size_t n = bytes / 64;                                                                   \
    rd_v8 s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };                                    \
    for (size_t i = 0; i + 4 <= n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; } \
    s0 += s1 + s2 + s3;                                                                      \
    uint64_t s = 0;                                                                          \
    for (int k = 0; k < 8; k++) s += s0[k];                                                  \
    return s;

static uint64_t rd_vec(const uint8_t *b, size_t bytes) { RD_VEC_BODY }
#if defined(__x86_64__) && defined(__GNUC__)
#define RD_HAVE_512 1
__attribute__((target("avx512f"))) static uint64_t rd_vec512(const uint8_t *b, size_t bytes) { RD_VEC_BODY }
#endif

static void *rd_main(void *a)
{
    rd_arg *r = a;
    if (r->how == 0) r->sum = rd_scalar(r->p, r->n);
    else if (r->how == 1) r->sum = rd_vec(r->p, r->n);
#ifdef RD_HAVE_512
    else r->sum = rd_vec512(r->p, r->n);
#endif
    return NULL;
}

static int rd_methods(void)
{
#ifdef RD_HAVE_512
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 3;
#endif
    return 2;
}

/* One read of buf[bytes] split over nth threads, GB/s. */
static double rd_pass(const uint8_t *buf, size_t bytes, int nth, int how)
{
    pthread_t th[64];
    rd_arg ar[64];
    int joined[64];
    if (nth > 64) nth = 64;
    size_t part = bytes / (size_t)nth / 64 * 64;
    double t0 = now_s();
    for (int i = 0; i < nth; i++) {
        ar[i] = (rd_arg){ .p = buf + part * (size_t)i, .n = part, .how = how };
        joined[i] = pthread_create(&th[i], NULL, rd_main, &ar[i]) == 0;
        if (!joined[i]) rd_main(&ar[i]);
    }
    uint64_t s = 0;
    for (int i = 0; i < nth; i++) {
        if (joined[i]) pthread_join(th[i], NULL);
        s += ar[i].sum;
    }
    double dt = now_s() - t0;
    if (s == 42) fprintf(stderr, " ");
    return dt > 0 ? (double)(part * (size_t)nth) / dt / 1e9 : 0;
}

/* The run's original ceiling: best of 5 scalar reads of a fresh buffer. */
static double mem_read_gbs(int nth, size_t bytes)
{
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0;
    size_t n = bytes / 8;
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double gbs = rd_pass((const uint8_t *)buf, bytes, nth, 0);
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

/* The ceiling next to each decode repeat: a buffer kept for the whole run
 * (RD_BYTES, far above the last-level cache; 2 MiB pages where the kernel
 * gives them), read back to back for about as long as the repeat's decode
 * took, the methods taking turns pass by pass. One pass on this kind of
 * shared host reads anywhere between half and twice the typical rate, so a
 * best-of-a-few figure measures the luckiest moment; bytes over time of the
 * whole window, like the decode rate itself, measure what the memory gave
 * in that stretch. The ceiling is the fastest method's window rate; *peak
 * gets the fastest single pass. */
#define RD_BYTES ((size_t)512 << 20)

static uint8_t *rd_buf_new(int *huge)
{
    void *p = NULL;
    *huge = 0;
    if (posix_memalign(&p, (size_t)2 << 20, RD_BYTES)) return NULL;
#ifdef MADV_HUGEPAGE
    *huge = madvise(p, RD_BYTES, MADV_HUGEPAGE) == 0;
#endif
    uint64_t *q = p;
    for (size_t i = 0; i < RD_BYTES / 8; i++) q[i] = i;
    return p;
}

static double rd_window(const uint8_t *buf, int nth, double seconds, double *peak)
{
    int nm = rd_methods();
    double t_m[3] = { 0 }, gb_m[3] = { 0 };
    *peak = 0;
    double t_end = now_s() + seconds;
    for (int pass = 0; pass < 3 * nm || now_s() < t_end; pass++) {
        int how = pass % nm;
        double t0 = now_s();
        double gbs = rd_pass(buf, RD_BYTES, nth, how);
        t_m[how] += now_s() - t0;
        gb_m[how] += (double)RD_BYTES / 1e9;
        if (gbs > *peak) *peak = gbs;
    }
    double best = 0;
    for (int m = 0; m < nm; m++)
        if (t_m[m] > 0 && gb_m[m] / t_m[m] > best) best = gb_m[m] / t_m[m];
    return best;
}

/* kB of this process's memory in 2 MiB mappings (anonymous, file). */
static void huge_kb(long *anon_kb, long *file_kb)
{
    *anon_kb = *file_kb = -1;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return;
    char ln[256];
    while (fgets(ln, sizeof ln, f)) {
        if (!strncmp(ln, "AnonHugePages:", 14)) *anon_kb = atol(ln + 14);
        else if (!strncmp(ln, "FilePmdMapped:", 14)) *file_kb = atol(ln + 14);
    }
    fclose(f);
}

typedef struct run_res { double prefill_tps, decode_tps, wall_s; int ok; } run_res;

/* Runs S jobs at once; returns per-job medians and aggregate decode rate. */
static unsigned run_seq;   /* makes every submitted prompt distinct */
static char *schema_text;  /* --json-schema: every job's output constrained by it */
/* the engine's counters at the start and end of the all-decoding window */
static eng_stats win0, win1;

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds of the process during the last single-stream run's prefill (up
 * to its first token) and decode (the rest), and the tokens of each. */
static double cpu_pf_s, cpu_dc_s;
static int cpu_dc_tokens;

static int run_jobs(eng *e, int n_prompt, int n_gen, int streams, double *prefill_tps, double *decode_tps,
                    double *agg_tps, double *steady_tps)
{
    int32_t nv = eng_model(e)->n_vocab;
    int32_t *toks = malloc((size_t)n_prompt * sizeof *toks);
    uint64_t ids[256];
    double pf[256], dc[256];
    /* steady state: the window in which every stream is past its prompt and
     * none has finished, i.e. S sequences decoding in each pass (the figure
     * a batched-decode benchmark reports) */
    double t_first[256] = { 0 }, t_all = 0, t_end = 0;
    int n_started = 0, in_window = 0;
    int done = 0;
    char err[256];
    eng_err code;
    for (int i = 0; i < n_prompt; i++) toks[i] = (int32_t)((i * 7919 + 13) % (nv > 3 ? nv - 3 : 1)) + 3;
    double t0 = now_s(), c0 = cpu_s(), c1 = 0;
    for (int s = 0; s < streams; s++) {
        eng_job_desc d = { 0 };
        d.kind = ENG_JOB_GENERATE;
        toks[0] = eng_model(e)->bos >= 0 ? eng_model(e)->bos : toks[0];
        /* distinct prompts, across streams and across calls: a prompt seen
         * before would be served from the prefix cache and not measure prefill */
        toks[n_prompt > 1 ? 1 : 0] = 3 + (int32_t)((run_seq++ % 4093) % (nv > 3 ? nv - 3 : 1));
        d.tokens = toks;
        d.n_tokens = (size_t)n_prompt;
        d.max_tokens = n_gen;
        eng_sampling_default(&d.sampling);
        d.sampling.temperature = 0;
        d.owner = (uint64_t)s;
        if (schema_text) { d.json_schema = schema_text; d.json_schema_len = strlen(schema_text); }
        if (eng_submit(e, &d, &ids[s], &code, err, sizeof err)) {
            fprintf(stderr, "anebench: submit: %s\n", err);
            free(toks);
            return -1;
        }
    }
    int gen_total = 0;
    double first_tok = 0;
    while (done < streams) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(200); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            if (ev->type == ENG_EV_TOKEN) {
                gen_total++;
                int s = 0;
                while (s < streams && ids[s] != ev->job_id) s++;
                if (s < streams && t_first[s] == 0) {
                    t_first[s] = now_s();
                    if (++n_started == streams) { t_all = t_first[s]; eng_stats_get(e, &win0); }
                } else if (t_all > 0 && t_end == 0) {
                    in_window++;
                }
                if (!first_tok && gen_total >= streams) first_tok = now_s();
                if (gen_total == 1) c1 = cpu_s();
            }
            if (ev->type == ENG_EV_DONE) {
                if (t_end == 0) { t_end = now_s(); eng_stats_get(e, &win1); }
                pf[done] = ev->prefill_ms > 0 ? n_prompt / (ev->prefill_ms / 1e3) : 0;
                dc[done] = ev->decode_ms > 0 ? (ev->completion_tokens - 1) / (ev->decode_ms / 1e3) : 0;
                if (streams == 1 && c1 > 0) {
                    cpu_pf_s = c1 - c0;
                    cpu_dc_s = cpu_s() - c1;
                    cpu_dc_tokens = (int)ev->completion_tokens - 1;
                }
                done++;
            }
            if (ev->type == ENG_EV_ERROR) {
                fprintf(stderr, "anebench: job error: %s\n", ev->message);
                done++;
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
    double t1 = now_s();
    free(toks);
    *prefill_tps = median(pf, streams);
    *decode_tps = median(dc, streams);
    *agg_tps = first_tok && t1 > first_tok ? (gen_total - streams) / (t1 - first_tok) : 0;
    if (steady_tps) *steady_tps = t_all > 0 && t_end > t_all && in_window >= streams ? in_window / (t_end - t_all) : 0;
    (void)t0;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: anebench --model FILE [--prompt N] [--gen M] [--threads T] [--streams S]\n"
                    "                [--repeat R] [--backend cpu|cuda] [--gpus LIST] [--split heads|layers] [--gpu-layers N] [--ctx N] [--kv-type f16|q8_0|f32]\n"
                    "                [--json-schema FILE] [--deterministic] [--json]\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *backend = NULL, *gpus = NULL;
    int split_layers = 0, gpu_layers = 0, n_prompt = 128, n_gen = 64, threads = 0, streams = 1, repeat = 3, json = 0, ctx = 0, kv_type = ENG_KV_F16;
    int deterministic = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--deterministic")) { deterministic = 1; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        if (!v) { usage(); return 1; }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompt")) n_prompt = atoi(v);
        else if (!strcmp(a, "--gen")) n_gen = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--streams")) streams = atoi(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--gpus")) gpus = v;
        else if (!strcmp(a, "--split")) {
            if (strcmp(v, "heads") && strcmp(v, "layers")) { usage(); return 1; }
            split_layers = !strcmp(v, "layers");
        }
        else if (!strcmp(a, "--gpu-layers")) gpu_layers = atoi(v);
        else if (!strcmp(a, "--ctx")) ctx = atoi(v);
        else if (!strcmp(a, "--kv-type")) {
            for (kv_type = 0; eng_kv_types[kv_type] && strcmp(v, eng_kv_types[kv_type]); kv_type++) {}
            if (!eng_kv_types[kv_type]) { usage(); return 1; }
        }
        else if (!strcmp(a, "--json-schema")) {
            FILE *f = fopen(v, "rb");
            if (!f) { fprintf(stderr, "anebench: cannot open %s\n", v); return 1; }
            static char buf[1 << 16];
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            schema_text = buf;
        }
        else { usage(); return 1; }
        i++;
    }
    if (!model || n_prompt < 1 || n_gen < 2 || streams < 1 || streams > 256 || repeat < 1) { usage(); return 1; }
    char err[512];
    eng *e;
    eng_opts o = { 0 };
    o.model_path = model;
    o.n_threads = threads;
    o.backend = backend;
    o.gpus = gpus;
    o.split_layers = split_layers;
    o.gpu_layers = gpu_layers;
    o.max_seqs = streams > 16 ? streams : 16;
    o.n_ctx = ctx ? ctx : n_prompt + n_gen + 16;
    o.kv_type = kv_type;
    o.deterministic = deterministic;
    double t0 = now_s();
    if (eng_open(&e, &o, err, sizeof err)) { fprintf(stderr, "anebench: %s\n", err); return 1; }
    double load_s = now_s() - t0;
    const eng_model_info *mi = eng_model(e);
    if (mi->tokenizer_only) { fprintf(stderr, "anebench: %s has no weights\n", model); return 1; }

    double pf[64], dc[64], ag[64], st[64], pfs[64], dcs[64], pfc[64], dcc[64], rc[64], rf[64], rp[64];
    if (repeat > 64) repeat = 64;
    int nth = mi->n_threads, rd_huge = 0;
    /* (the host's read ceiling says nothing of a GPU: measured on the CPU only) */
    int on_cpu = !mi->backend || !strcmp(mi->backend, "cpu");
    uint8_t *rdb = on_cpu ? rd_buf_new(&rd_huge) : NULL;
    if (on_cpu && !rdb) { fprintf(stderr, "anebench: out of memory\n"); return 1; }
    /* warm-up: one prompt of the measured length, so the weights are touched
     * and what a first prompt pass builds once per model (the CUDA backend's
     * f16 weight copies for its GEMMs) is in place before anything is timed,
     * as in a daemon that has served a prompt */
    double w0, w1, w2;
    if (run_jobs(e, n_prompt, 2, 1, &w0, &w1, &w2, NULL)) return 1;
    for (int r = 0; r < repeat; r++) {
        if (run_jobs(e, n_prompt, n_gen, 1, &pf[r], &dc[r], &ag[r], NULL)) return 1;
        pfc[r] = cpu_pf_s > 0 ? n_prompt / cpu_pf_s : 0;
        dcc[r] = cpu_dc_s > 0 ? cpu_dc_tokens / cpu_dc_s : 0;
        /* the ceiling right after this repeat's decode, so that the ratio
         * compares the two at (nearly) the same moment of the machine */
        double dsec = dc[r] > 0 ? (n_gen - 1) / dc[r] : 1;
        rc[r] = rp[r] = 0;
        if (on_cpu) rc[r] = rd_window(rdb, nth, dsec < 0.5 ? 0.5 : dsec > 3 ? 3 : dsec, &rp[r]);
        rf[r] = rc[r] > 0 ? dc[r] * (double)mi->active_bytes / 1e9 / rc[r] : 0;
        if (streams > 1 && run_jobs(e, n_prompt, n_gen, streams, &pfs[r], &dcs[r], &ag[r], &st[r])) return 1;
    }
    double prefill = median(pf, repeat), decode = median(dc, repeat);
    double agg = streams > 1 ? median(ag, repeat) : decode;
    double steady = streams > 1 ? median(st, repeat) : decode;
    free(rdb);
    double rf_min = rf[0], rf_max = rf[0];
    for (int r = 1; r < repeat; r++) {
        if (rf[r] < rf_min) rf_min = rf[r];
        if (rf[r] > rf_max) rf_max = rf[r];
    }
    double rep_frac = median(rf, repeat), rep_ceil = median(rc, repeat), rep_peak = median(rp, repeat);
    long huge_anon_kb, huge_file_kb;
    huge_kb(&huge_anon_kb, &huge_file_kb);
    /* tokens per CPU-second times the threads: what the run would give with
     * the cores to itself (time descheduled by other load is not counted;
     * the pool's spinning is, as it would be on an idle machine) */
    double prefill_cpu = median(pfc, repeat) * nth, decode_cpu = median(dcc, repeat) * nth;
    double ceil_gbs = on_cpu ? mem_read_gbs(nth, (size_t)1 << 30) : 0;
    double wgbs = decode * (double)mi->active_bytes / 1e9;   /* (a token's weights: its experts only) */
    if (json) {
        printf("{\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"prompt\":%d,\"gen\":%d,\"streams\":%d,"
               "\"load_s\":%.3f,\"weight_bytes\":%llu,\"prefill_tps\":%.2f,\"decode_tps\":%.2f,"
               "\"aggregate_decode_tps\":%.2f,\"steady_decode_tps\":%.2f,\"weight_gbs\":%.2f,\"mem_read_gbs\":%.2f,\"bw_fraction\":%.3f,\"prefill_cpu_tps\":%.2f,\"decode_cpu_tps\":%.2f,"
               "\"rep_mem_read_gbs\":%.2f,\"rep_bw_fraction\":%.3f,\"rep_bw_fraction_min\":%.3f,"
               "\"rep_bw_fraction_max\":%.3f,\"rep_read_peak_gbs\":%.2f,\"anon_huge_kb\":%ld,\"file_pmd_kb\":%ld}\n",
               model, mi->backend, nth, n_prompt, n_gen, streams, load_s, (unsigned long long)mi->weight_bytes,
               prefill, decode, agg, steady, wgbs, ceil_gbs, ceil_gbs > 0 ? wgbs / ceil_gbs : 0, prefill_cpu, decode_cpu,
               rep_ceil, rep_frac, rf_min, rf_max, rep_peak, huge_anon_kb, huge_file_kb);
    } else {
        printf("model      %s (%s, %.1f MB of weights, %.1f MB a token, loaded in %.2f s)\n", model, mi->arch,
               mi->weight_bytes / 1e6, mi->active_bytes / 1e6, load_s);
        printf("backend    %s, %d threads, KV cache %s\n", mi->backend, nth, mi->kv_type ? mi->kv_type : "?");
        if (mi->device && mi->device[0]) printf("device     %s\n", mi->device);
        printf("prefill    %8.2f tokens/s  (%d-token prompt)\n", prefill, n_prompt);
        if (!on_cpu) {
            printf("decode     %8.2f tokens/s  (%d tokens)  %.2f GB/s of weights\n", decode, n_gen, wgbs);
        } else {
            printf("decode     %8.2f tokens/s  (%d tokens)  %.2f GB/s of weights, %.0f%% of the %.2f GB/s read ceiling\n",
                   decode, n_gen, wgbs, ceil_gbs > 0 ? 100 * wgbs / ceil_gbs : 0, ceil_gbs);
            printf("bandwidth  %.0f%% of the read ceiling: median over %d repeats of each decode's weight rate\n"
                   "           against reads for as long right after it (%.0f-%.0f%%; those ceilings: median %.2f GB/s,\n"
                   "           fastest single %d MiB read %.2f GB/s%s)\n",
                   100 * rep_frac, repeat, 100 * rf_min, 100 * rf_max, rep_ceil, (int)(RD_BYTES >> 20), rep_peak,
                   rd_huge ? ", 2 MiB pages" : "");
            printf("pages      %ld kB of the process in 2 MiB anonymous pages, %ld kB of files mapped in 2 MiB pages\n",
                   huge_anon_kb, huge_file_kb);
            printf("cpu-time   prefill %.2f, decode %.2f tokens/s with the cores to itself (tokens per CPU-second\n"
                   "           x %d threads: time lost to other load not counted)\n", prefill_cpu, decode_cpu, nth);
        }
        if (streams > 1)
        {
            printf("aggregate  %8.2f tokens/s  over %d concurrent streams (%.2fx one stream), prompts included\n",
                   agg, streams, decode > 0 ? agg / decode : 0);
            printf("batched    %8.2f tokens/s  while all %d streams decode (%.2fx one stream)\n", steady, streams,
                   decode > 0 ? steady / decode : 0);
            uint64_t ns = win1.steps - win0.steps;
            if (ns > 0 && win1.step_ms > win0.step_ms)
                printf("steps      %.3f ms each in that window (last repeat), %.1f%% of it inside forward passes\n"
                       "           (device time included; the rest is host work between passes)\n",
                       (win1.step_ms - win0.step_ms) / (double)ns,
                       100 * (win1.pass_ms - win0.pass_ms) / (win1.step_ms - win0.step_ms));
        }
    }
    eng_close(e);
    return 0;
}
