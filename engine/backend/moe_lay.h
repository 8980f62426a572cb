/* moe_lay.h — the scratch of a backend's mixture-of-experts op
 * (engine-internal): the parts every backend carves the same way, sized
 * from the be_moe and the batch, then each backend's own after them. */
#ifndef ANE_MOE_LAY_H
#define ANE_MOE_LAY_H

#include <stddef.h>

#include "engine/backend/backend.h"

/* Byte offsets of the shared parts for T tokens, N = T * n_used (token,
 * rank) pairs, X experts: router logits lg [T][X], the chosen ids and
 * weights [N], first [X+1] (each expert's first slot), slot [N] (of pair
 * t*K+k) and pair [N] (of each slot), the expert activations hg, hu [N][F]
 * and outputs y [N][E]; `end`: where the backend's own parts begin. */
typedef struct moe_lay {
    size_t lg, ids, wts, first, slot, pair, hg, hu, y, end;
    size_t T, N, X, F, E;
} moe_lay;

/* The shared parts for batches of up to max_T tokens, each aligned to
 * `align` bytes (a power of two). */
void moe_lay_of(const be_moe *m, int max_T, size_t align, moe_lay *L);
/* A further part of n bytes at L->end (aligned), returned; L->end moves on. */
size_t moe_lay_part(moe_lay *L, size_t n, size_t align);

#endif
