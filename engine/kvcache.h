/* kvcache.h — bookkeeping of the KV page pool (engine-internal; worker thread
 * only). The bytes live in the forward pass's cache; this module decides which
 * sequence owns which page and which pages can be shared.
 *
 * A page holds KV_PAGE consecutive tokens of one sequence. Once full, a page
 * can be published under a key that chains the hashes of every token before
 * it, so a later prompt with the same prefix finds it (prefix reuse). Pages
 * are reference counted; a published page whose last user is gone stays
 * cached until its space is needed (least recently used first). Shared pages
 * are never written: sequences only write positions past what they reused. */
#ifndef ANE_KVCACHE_H
#define ANE_KVCACHE_H

#include <stdint.h>

typedef struct kvc kvc;

int kvc_open(kvc **out, int n_pages, int page_tokens);
void kvc_close(kvc *c);

int kvc_total(const kvc *c);
int kvc_available(const kvc *c);   /* free + cached-but-unused pages */
int kvc_in_use(const kvc *c);      /* pages referenced by sequences */
int kvc_cached(const kvc *c);      /* published pages nobody uses */

/* Finds the longest published prefix of toks[0..n) in whole pages (at most
 * max_pages), takes a reference on each, writes their ids to pages[] and
 * returns how many. */
int kvc_match(kvc *c, const int32_t *toks, int n, int max_pages, int32_t *pages);

/* Takes n fresh pages, evicting cached ones when needed; -1 (nothing taken)
 * when fewer than n are available. */
int kvc_alloc(kvc *c, int n, int32_t *pages);

/* Publishes pages[idx], which holds toks[idx*P .. idx*P+P) after the pages
 * before it (which must be published already). No-op if an equal page is
 * already published. */
void kvc_publish(kvc *c, const int32_t *pages, int idx, const int32_t *toks);

/* Drops one reference on each page; unpublished pages become free. */
void kvc_release(kvc *c, const int32_t *pages, int n);

#endif
