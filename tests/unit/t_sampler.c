/* t_sampler — the token choice: sampling under a grammar without its mask
 * (sampler_choose_allowed) against sampler_choose on the masked logits,
 * choice and RNG step alike, over random logits, allowed sets, ties and
 * settings; greedy choice, first of equals. */
#include "engine/sampler.h"
#include "tests/check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

typedef struct { const uint8_t *ok; int calls, stop_at; } allow_ctx;

static const float *sort_lg;
static int by_logit(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float u = sort_lg[x], v = sort_lg[y];
    if (isnan(u) != isnan(v)) return isnan(u) ? 1 : -1;
    if (u > v) return -1;
    if (u < v) return 1;
    return x < y ? -1 : x > y;
}

/* How many of the 256 likeliest (first of equals first, NaN last) ok allows. */
static int allowed_in_top(const float *lg, const uint8_t *ok, int32_t n, int32_t *idx)
{
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    sort_lg = lg;
    qsort(idx, (size_t)n, sizeof *idx, by_logit);
    int k = 0;
    for (int i = 0; i < 256 && i < n; i++) k += !isnan(lg[idx[i]]) && ok[idx[i]];
    return k;
}

static int allow_cb(void *ctx, int32_t id)
{
    allow_ctx *a = ctx;
    if (a->stop_at && ++a->calls >= a->stop_at) return -1;
    return a->ok[id];
}

/* Random logits (coarse values: many ties) and allowed sets from nearly
 * all to a handful; for each, the choice without the mask equals the one
 * from the masked logits with the same RNG state, or is -1 (too few
 * allowed among the likeliest), and then the RNG was not stepped. */
static void test_allowed_equals_masked(void)
{
    const int32_t n = 5003;
    sampler *s = NULL;
    CHECK(sampler_open(&s, n) == 0);
    float *lg = malloc((size_t)n * 4), *mk = malloc((size_t)n * 4);
    uint8_t *ok = malloc((size_t)n);
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    int same = 0, fell = 0;
    for (int c = 0; c < 3000; c++) {
        int coarse = c % 3 == 0;
        for (int32_t i = 0; i < n; i++) lg[i] = coarse ? (float)(rnd() % 16) : (float)(rnd() % 100000) / 5000.0f;
        if (c % 50 == 7) lg[rnd() % n] = NAN;
        uint32_t dens = c % 5 == 0 ? 2 : c % 5 == 1 ? 50 : c % 5 == 2 ? 97 : c % 5 == 3 ? 100 : 10;
        for (int32_t i = 0; i < n; i++) ok[i] = rnd() % 100 < dens;
        for (int32_t i = 0; i < n; i++) mk[i] = ok[i] ? lg[i] : -INFINITY;
        eng_sampling p;
        eng_sampling_default(&p);
        int32_t ks[6] = { 1, 5, 40, 100, 256, 257 };
        p.top_k = ks[c % 6];
        p.temperature = c % 4 == 0 ? 1.5f : 0.7f;
        p.top_p = c % 7 == 0 ? 1.0f : c % 7 == 1 ? 0.0f : 0.9f;
        p.min_p = c % 3 == 0 ? 0.0f : 0.05f;
        uint64_t r1 = sampler_rng_seed((uint64_t)c), r2 = r1;
        allow_ctx a = { ok, 0, 0 };
        int32_t got = sampler_choose_allowed(s, lg, &p, &r1, allow_cb, &a);
        if (got == -1) {
            fell++;
            CHECKF(r1 == sampler_rng_seed((uint64_t)c), "case %d: the RNG stepped without a choice", c);
            CHECKF(p.top_k > 256 || allowed_in_top(lg, ok, n, idx) < p.top_k,
                   "case %d: fell back with %u%% allowed, top_k %d", c, dens, p.top_k);
            continue;
        }
        int32_t want = sampler_choose(s, mk, &p, &r2);
        CHECKF(got == want && r1 == r2, "case %d (top_k %d, %u%% allowed): %d, masked %d", c, p.top_k, dens, got, want);
        CHECKF(got >= 0 && got < n && ok[got], "case %d: %d not allowed", c, got);
        same += got == want;
    }
    printf("  %d choices equal to the masked ones, %d left to the mask\n", same, fell);
    CHECK(same > 1500 && fell > 100);
    /* an allow that stops (a grammar past its bounds): -2 */
    for (int32_t i = 0; i < n; i++) { lg[i] = (float)i; ok[i] = 0; }
    eng_sampling p;
    eng_sampling_default(&p);
    uint64_t r = 1;
    allow_ctx a = { ok, 0, 3 };
    CHECK_EQ_INT(sampler_choose_allowed(s, lg, &p, &r, allow_cb, &a), -2);
    /* greedy and top_k 0 are not its work */
    p.temperature = 0;
    a.stop_at = 0;
    CHECK_EQ_INT(sampler_choose_allowed(s, lg, &p, &r, allow_cb, &a), -1);
    p.temperature = 1; p.top_k = 0;
    CHECK_EQ_INT(sampler_choose_allowed(s, lg, &p, &r, allow_cb, &a), -1);
    free(lg); free(mk); free(ok); free(idx);
    sampler_close(s);
}

/* Greedy: the first of equal maxima, NaN skipped. */
static void test_greedy_first(void)
{
    sampler *s = NULL;
    CHECK(sampler_open(&s, 37) == 0);
    float lg[37];
    for (int i = 0; i < 37; i++) lg[i] = (float)(i % 5);
    lg[0] = NAN;
    eng_sampling p;
    eng_sampling_default(&p);
    p.temperature = 0;
    uint64_t r = 1;
    CHECK_EQ_INT(sampler_choose(s, lg, &p, &r), 4);
    sampler_close(s);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_allowed_equals_masked);
    RUN(test_greedy_first);
    return CHECK_DONE();
}
