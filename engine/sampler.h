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

/* Top-n (id, logit), best first; ties by lower id. */
void sampler_top(const float *logits, int32_t n_vocab, int n, int32_t *ids, float *vals);

uint64_t sampler_rng_seed(uint64_t seed);

#endif
