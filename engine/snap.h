/* snap.h — bookkeeping of recurrent-state snapshots (engine-internal; worker
 * thread only). Models with per-sequence recurrent state (qwen35) can reuse a
 * cached KV prefix only together with the recurrent state at its end; the
 * forward pass keeps n snapshot buffers (fw_snap_*), and this module records
 * which token prefix each holds, so a new prompt resumes from the longest
 * matching one. Matching compares the tokens themselves, never a hash. */
#ifndef ANE_SNAP_H
#define ANE_SNAP_H

#include <stdint.h>

typedef struct snapc snapc;

/* n entries holding prefixes of at most max_len tokens. */
int snapc_open(snapc **out, int n, int max_len);
void snapc_close(snapc *s);

/* The entry holding the longest prefix of toks whose length is a positive
 * multiple of `align` and at most max_len; its length in *len; -1 if none.
 * Marks the entry used. */
int snapc_find(snapc *s, const int32_t *toks, int max_len, int align, int *len);

/* An entry for `owner` to write its snapshots to: a free one, else the least
 * recently used one no other owner holds (its snapshot is dropped); -1 if
 * every entry is held. */
int snapc_take(snapc *s, const void *owner);
/* Records that entry i now holds the state after toks[0..len). */
void snapc_set(snapc *s, int i, const int32_t *toks, int len);
int snapc_len(const snapc *s, int i);
/* The owner is done with entry i; its snapshot stays findable. */
void snapc_release(snapc *s, int i);

#endif
