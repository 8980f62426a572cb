/* sampling.h — the sampling defaults: the engine's (eng_sampling_default) and
 * the protocol's for a request that leaves a field out are one set. */
#ifndef ANE_COMMON_SAMPLING_H
#define ANE_COMMON_SAMPLING_H

/* Designated initialisers for a struct with these fields (seed is left 0). */
#define SAMPLING_DEFAULTS \
    .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64

#endif
