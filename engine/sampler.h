/* sampler.h — token choice from logits (engine-internal).
 * Order as llama.cpp's common chain: repetition penalty → top-k → top-p →
 * min-p → temperature → draw. temperature <= 0 is greedy (argmax after the
 * penalty). The RNG is per job and seeded, so the same seed gives the same
 * text. Scratch is owned by the sampler (one per engine worker). */
#ifndef ANE_SAMPLER_H
#define ANE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct sampler sampler;

int sampler_open(sampler **out, int32_t n_vocab);
void sampler_close(sampler *s);

/* Picks a token. `recent` are the last n_recent tokens (for the penalty);
 * *rng is the job's RNG state (advanced). logits may be modified. */
int32_t sampler_pick(sampler *s, float *logits, const eng_sampling *p,
                     const int32_t *recent, size_t n_recent, uint64_t *rng);

/* The two halves of sampler_pick: the repetition penalty on logits (in
 * place), then the choice from the logits as they are. */
void sampler_penalize(sampler *s, float *logits, const eng_sampling *p,
                      const int32_t *recent, size_t n_recent);
int32_t sampler_choose(sampler *s, const float *logits, const eng_sampling *p, uint64_t *rng);

/* sampler_choose over logits a grammar masks (the tokens it refuses at
 * -inf), without making the mask: the top_k candidates are the top_k
 * likeliest tokens allow(ctx, id) accepts (1; 0 refuses; -1 stops: -2 is
 * returned), looked for among the 256 likeliest. The same choice, and the
 * same RNG step, as sampler_choose on the masked logits; -1 when fewer than
 * top_k are there (then mask and sampler_choose). Only for temperature > 0
 * and 0 < top_k <= 256 (else -1). */
int32_t sampler_choose_allowed(sampler *s, const float *logits, const eng_sampling *p, uint64_t *rng,
                               int (*allow)(void *ctx, int32_t id), void *ctx);

/* Log-softmax of logits (over the whole vocabulary, in double): returns
 * chosen's log-probability (-inf out of range) and writes the top n ids and
 * theirs, best first (ties by lower id; n <= n_vocab). A value and the same
 * token's entry among the top are the same float. */
float sampler_logprobs(const float *logits, int32_t n_vocab, int32_t chosen, int n,
                       int32_t *ids, float *vals);

/* Top-n (id, logit), best first; ties by lower id. */
void sampler_top(const float *logits, int32_t n_vocab, int n, int32_t *ids, float *vals);

uint64_t sampler_rng_seed(uint64_t seed);

#endif
