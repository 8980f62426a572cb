#include "engine/sampler.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand { int32_t id; float logit; float p; } cand;

#define SMALL_K 256   /* top-k up to this: by insertion, no sort */

struct sampler {
    int32_t n_vocab;
    cand *c;
};

int sampler_open(sampler **out, int32_t n_vocab)
{
    sampler *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    if (!s->c) { free(s); return -1; }
    *out = s;
    return 0;
}

void sampler_close(sampler *s)
{
    if (!s) return;
    free(s->c);
    free(s);
}

/* splitmix64 to spread the seed, xorshift64* for the stream */
uint64_t sampler_rng_seed(uint64_t seed)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

static double rng_next(uint64_t *st)
{
    uint64_t x = *st;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *st = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void apply_penalty(float *logits, int32_t n_vocab, const eng_sampling *p,
                          const int32_t *recent, size_t n_recent)
{
    if (p->repeat_penalty == 1.0f || n_recent == 0) return;
    size_t from = 0;
    if (p->repeat_last_n >= 0 && n_recent > (size_t)p->repeat_last_n) from = n_recent - (size_t)p->repeat_last_n;
    /* each distinct token once: mark by flipping through a small linear scan */
    for (size_t i = from; i < n_recent; i++) {
        int32_t id = recent[i];
        if (id < 0 || id >= n_vocab) continue;
        int seen = 0;
        for (size_t j = from; j < i; j++) if (recent[j] == id) { seen = 1; break; }
        if (seen) continue;
        float *l = &logits[id];
        *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
    }
}

void sampler_penalize(sampler *s, float *logits, const eng_sampling *p,
                      const int32_t *recent, size_t n_recent)
{
    apply_penalty(logits, s->n_vocab, p, recent, n_recent);
}

int32_t sampler_pick(sampler *s, float *logits, const eng_sampling *p,
                     const int32_t *recent, size_t n_recent, uint64_t *rng)
{
    apply_penalty(logits, s->n_vocab, p, recent, n_recent);
    return sampler_choose(s, logits, p, rng);
}

/* The first k (<= SMALL_K) of logits in cand_cmp's order into c, by
 * insertion in one pass over the vocabulary; NaN skipped. Returns how many. */
static size_t top_insert(const float *logits, int32_t n, size_t k, cand *c)
{
    size_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v) || (m == k && !(v > c[m - 1].logit))) continue;
        size_t j = m < k ? m++ : k - 1;
        while (j > 0 && v > c[j - 1].logit) { c[j] = c[j - 1]; j--; }
        c[j].id = i; c[j].logit = v;
    }
    return m;
}

/* top-p, min-p, temperature and the draw over candidates c[0..m), best
 * first */
static int32_t draw(cand *c, size_t m, const eng_sampling *p, uint64_t *rng)
{
    if (m == 0) return 0;
    /* softmax at temperature 1 for top-p / min-p (as llama.cpp's chain) */
    double mx = c[0].logit, sum = 0;
    for (size_t i = 0; i < m; i++) { c[i].p = (float)exp(c[i].logit - mx); sum += c[i].p; }
    for (size_t i = 0; i < m; i++) c[i].p = (float)(c[i].p / sum);
    if (p->top_p <= 0.0f) {
        m = 1;   /* top_p 0: only the most likely candidate (as llama.cpp, OpenAI) */
    } else if (p->top_p < 1.0f) {
        double cum = 0;
        size_t keep = m;
        for (size_t i = 0; i < m; i++) {
            cum += c[i].p;
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
        m = keep;
    }
    if (p->min_p > 0.0f) {
        float thr = c[0].p * p->min_p;
        size_t keep = 1;
        while (keep < m && c[keep].p >= thr) keep++;
        m = keep;
    }
    /* temperature, then draw */
    mx = c[0].logit / p->temperature;
    sum = 0;
    for (size_t i = 0; i < m; i++) { c[i].p = (float)exp(c[i].logit / p->temperature - mx); sum += c[i].p; }
    double r = rng_next(rng) * sum, acc = 0;
    for (size_t i = 0; i < m; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[m - 1].id;
}


int32_t sampler_choose(sampler *s, const float *logits, const eng_sampling *p, uint64_t *rng)
{
    int32_t n = s->n_vocab;
    if (p->temperature <= 0.0f) {
        /* the largest value with 8 independent running maxima (no branch on
         * the data, no chain through one register), then its first index */
        float m[8];
        int32_t i = 0;
        for (int k = 0; k < 8; k++) m[k] = -INFINITY;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) m[k] = logits[i + k] > m[k] ? logits[i + k] : m[k];
        float best = -INFINITY;
        for (int k = 0; k < 8; k++) best = m[k] > best ? m[k] : best;
        for (; i < n; i++) best = logits[i] > best ? logits[i] : best;
        for (i = 0; i < n; i++) if (logits[i] == best) return i;
        return 0;   /* all NaN */
    }
    cand *c = s->c;
    size_t m = 0;
    size_t k = p->top_k > 0 ? (size_t)p->top_k : (size_t)n;
    if (k <= SMALL_K) {
        m = top_insert(logits, n, k, c);   /* small k: one pass */
    } else {
        for (int32_t i = 0; i < n; i++)
            if (!isnan(logits[i])) { c[m].id = i; c[m].logit = logits[i]; m++; }
        qsort(c, m, sizeof *c, cand_cmp);
        if (k < m) m = k;
    }
    return draw(c, m, p, rng);
}

int32_t sampler_choose_allowed(sampler *s, const float *logits, const eng_sampling *p, uint64_t *rng,
                               int (*allow)(void *ctx, int32_t id), void *ctx)
{
    if (p->temperature <= 0.0f || p->top_k <= 0 || p->top_k > SMALL_K) return -1;
    size_t want = (size_t)p->top_k;
    /* the top_k first (inside a string usually all allowed), then SMALL_K */
    for (size_t K = want;; K = SMALL_K) {
        size_t m = top_insert(logits, s->n_vocab, K, s->c), got = 0;
        for (size_t i = 0; i < m && got < want; i++) {
            int a = allow(ctx, s->c[i].id);
            if (a < 0) return -2;
            if (a) s->c[got++] = s->c[i];
        }
        if (got == want) return draw(s->c, want, p, rng);
        if (K == SMALL_K || m < K) return -1;
    }
}

void sampler_top(const float *logits, int32_t n_vocab, int n, int32_t *ids, float *vals)
{
    int cnt = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (cnt == n && !(v > vals[n - 1])) continue;
        int j = cnt < n ? cnt++ : n - 1;
        while (j > 0 && v > vals[j - 1]) { vals[j] = vals[j - 1]; ids[j] = ids[j - 1]; j--; }
        vals[j] = v; ids[j] = i;
    }
}

/* log(sum(exp(l))) in double, from the largest finite value: -inf entries
 * (masked) add nothing; NaN entries are skipped. */
static double log_sum_exp(const float *l, int32_t n)
{
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < n; i++) if (l[i] > mx) mx = l[i];
    if (mx == -INFINITY) return -INFINITY;
    for (int32_t i = 0; i < n; i++) if (l[i] > -INFINITY) sum += exp((double)l[i] - mx);
    return mx + log(sum);
}

float sampler_logprobs(const float *logits, int32_t n_vocab, int32_t chosen, int n,
                       int32_t *ids, float *vals)
{
    double lse = log_sum_exp(logits, n_vocab);
    if (n > n_vocab) n = n_vocab;
    if (n > 0) {
        sampler_top(logits, n_vocab, n, ids, vals);
        for (int i = 0; i < n; i++) vals[i] = (float)((double)vals[i] - lse);
    }
    return chosen >= 0 && chosen < n_vocab ? (float)((double)logits[chosen] - lse) : -INFINITY;
}
