/* worker.c — the scheduler and the worker thread (engine.c's top comment
 * describes a step): fair admission, eviction, the batch, the forward pass,
 * sampling and the events of each step. */
#include "engine/engine_int.h"
#include "engine/grammar/grammar.h"

/* ---- the worker ---------------------------------------------------------- */

/* Picks the queued job to admit next: the one whose uid, then owner, has the
 * fewest active or paused jobs; oldest first among equals. Under mu. */
static job *pick_fair(eng *e, job **prev_out)
{
    job *best = NULL, *best_prev = NULL, *prev = NULL;
    int best_u = 0, best_o = 0;
    for (job *j = e->queue_head; j; prev = j, j = j->next) {
        if (atomic_load(&j->paused)) continue;   /* waits in the queue until resumed */
        int nu = 0, no = 0;
        for (int i = 0; i < e->n_active; i++) {
            nu += e->active[i]->uid == j->uid;
            no += e->active[i]->owner == j->owner;
        }
        for (const job *q = e->parked; q; q = q->next) {   /* paused jobs count in the share */
            nu += q->uid == j->uid;
            no += q->owner == j->owner;
        }
        if (!best || nu < best_u || (nu == best_u && no < best_o)) {
            best = j; best_prev = prev; best_u = nu; best_o = no;
        }
    }
    *prev_out = best_prev;
    return best;
}

static void queue_unlink(eng *e, job *j, job *prev)
{
    if (prev) prev->next = j->next; else e->queue_head = j->next;
    if (e->queue_tail == j) e->queue_tail = prev;
    j->next = NULL;
    e->n_queued--;
}

void job_error(eng *e, job *j)
{
    eng_event *ev = ev_new(ENG_EV_ERROR, j);
    if (ev) {
        ev->code = j->err_code;
        snprintf(ev->message, sizeof ev->message, "%s", j->err_msg[0] ? j->err_msg : eng_strerror(j->err_code));
    }
    ev_push(e, ev);
}

/* Pages a job holds before its next step: its known tokens and the next
 * position (a decode step queued ahead writes there), within its limit. */
static int pages_now(const job *j)
{
    int full = (j->n_prompt + j->max_gen + KV_PAGE - 1) / KV_PAGE;
    int now = (j->n_tok + 1 + KV_PAGE - 1) / KV_PAGE;
    return now < full ? now : full;
}

/* Admits queued job j (prev: its predecessor in the queue) if a slot and
 * the pages of its tokens are free (pages for what it generates are taken
 * as it goes, grow()): whole cached pages of its tokens are reused (a new
 * generate job's prompt but its last token, which is computed again for its
 * logits; an evicted job's tokens up to where it was), the rest allocated,
 * leaving a page for each running job to grow into. 1 admitted, 0 no room.
 * Under mu. */
static int admit(eng *e, job *j, job *prev)
{
    if (e->n_active >= e->max_seqs) return 0;
    int need = pages_now(j);
    int n_known = j->evicted ? j->n_fill : j->n_prompt;
    int max_reuse = j->evicted ? j->n_fill / KV_PAGE : (j->n_prompt - 1) / KV_PAGE;
    int reuse = 0, snap = -1, snap_len = 0;
    /* eval and echo need every position's logits, unless they were given
     * before an eviction; a ring of a sliding-window layer holds only its
     * own sequence's latest rows, so those models reuse nothing */
    if (((j->kind == ENG_JOB_GENERATE && !j->echo) || j->evicted) && (!e->m->recurrent || e->snaps) &&
        !e->m->swa_ring)
        reuse = kvc_match(e->kv, j->toks, n_known, max_reuse, j->pages);
    if (e->m->recurrent && reuse > 0) {
        /* recurrent layers resume only from a saved state: cut the reuse
         * back to the longest snapshot of these tokens */
        snap = snapc_find(e->snaps, j->toks, reuse * KV_PAGE, KV_PAGE, &snap_len);
        int keep = snap >= 0 ? snap_len / KV_PAGE : 0;
        kvc_release(e->kv, j->pages + keep, reuse - keep);
        reuse = keep;
    }
    if (kvc_available(e->kv) < need - reuse + e->n_active ||
        kvc_alloc(e->kv, need - reuse, j->pages + reuse)) {
        kvc_release(e->kv, j->pages, reuse);
        return 0;
    }
    queue_unlink(e, j, prev);
    j->slot = 0;
    while (e->slot_used[j->slot]) j->slot++;   /* n_active < max_seqs: one is free */
    e->slot_used[j->slot] = 1;
    fw_seq_reset(e->fw, j->slot);
    if (reuse > 0 && snap >= 0) fw_snap_load(e->fw, snap, j->slot);
    j->snap = e->snaps && j->kind == ENG_JOB_GENERATE ? snapc_take(e->snaps, j) : -1;
    j->snap2 = j->snap >= 0 ? snapc_take(e->snaps, j) : -1;
    j->n_pages = need;
    if (!j->evicted) {
        j->n_cached = reuse * KV_PAGE;
        e->st.cached_tokens += (uint64_t)j->n_cached;
        j->t_admit = now_ms();
    }
    j->n_past = reuse * KV_PAGE;
    j->n_published = reuse;
    j->evicted = 0;
    j->state = JOB_ACTIVE;
    j->admit_no = ++e->admit_seq;
    e->active[e->n_active++] = j;
    return 1;
}

/* Takes j's slot and pages back (its full pages stay in the prefix cache
 * for its return, as long as nobody needs their room); it keeps its tokens
 * and will compute those it loses again before going on. The caller takes
 * it out of its list. Under mu. */
static void evict(eng *e, job *j)
{
    if (j->state == JOB_ACTIVE && e->a_on) e->a_stale = 1;   /* the queued step had it */
    if (j->n_past > j->n_fill) j->n_fill = j->n_past;
    pages_release(e, j);
    j->n_past = 0;
    j->n_published = 0;
    j->snap = j->snap2 = -1;
    j->evicted = 1;
    e->st.evictions++;
}

/* Moves active[i] to the parked jobs (evicted first, or keeping its KV).
 * Under mu. */
static void park(eng *e, int i)
{
    job *j = e->active[i];
    e->active[i] = e->active[--e->n_active];
    j->state = JOB_PARKED;
    j->next = e->parked;
    e->parked = j;
    e->n_parked++;
}

/* What a job costs its uid's share: its pages, and its slot while it holds
 * one, each as a fraction of the whole (scaled to integers). */
static uint64_t job_cost(const eng *e, int pages, int slot)
{
    return (uint64_t)pages * (uint64_t)e->max_seqs + (slot ? (uint64_t)e->n_pages_total : 0);
}

/* What the jobs of j's uid (by_owner: of j's owner) cost together. */
static uint64_t share_cost(const eng *e, const job *j, int by_owner)
{
    uint64_t c = 0;
    for (int i = 0; i < e->n_active; i++) {
        const job *q = e->active[i];
        if (by_owner ? q->owner == j->owner : q->uid == j->uid) c += job_cost(e, q->n_pages, 1);
    }
    for (const job *q = e->parked; q; q = q->next)
        if (by_owner ? q->owner == j->owner : q->uid == j->uid) c += job_cost(e, q->n_pages, 0);
    return c;
}

/* w waits for a slot or pages: takes them back from one job, 1 if it did.
 * First a paused job (any uid) holding what is short; else the youngest
 * running job of the uid that holds the most, provided that uid keeps at
 * least what w's uid will then hold (so the two never take turns
 * preempting each other); else the same between connections (owners) of
 * w's uid. Under mu. */
static int make_room(eng *e, job *w)
{
    int no_slot = e->n_active >= e->max_seqs;
    int best = -1;
    job *v = NULL;
    for (int i = 0; i < e->n_active; i++)     /* recurrent models, rings: paused jobs keep their slot */
        if (atomic_load(&e->active[i]->paused) && (best < 0 || e->active[i]->n_pages > v->n_pages)) {
            best = i;
            v = e->active[i];
        }
    if (v) {
        evict(e, v);
        park(e, best);
        return 1;
    }
    if (!no_slot)
        for (job *q = e->parked; q; q = q->next)
            if (q->n_pages > 0 && (!v || q->n_pages > v->n_pages)) v = q;
    if (v) {
        evict(e, v);                          /* stays parked until resumed */
        return 1;
    }
    uint64_t w_cost = job_cost(e, pages_now(w), 1);
    for (int by_owner = 0; by_owner < 2 && !v; by_owner++) {
        uint64_t w_after = share_cost(e, w, by_owner) + w_cost, v_share = 0;
        struct { uint64_t key, cost; } memo[16];   /* few uids/owners: each summed once */
        int n_memo = 0;
        for (int i = 0; i < e->n_active; i++) {
            job *j = e->active[i];
            if (by_owner ? j->uid != w->uid || j->owner == w->owner : j->uid == w->uid) continue;
            uint64_t key = by_owner ? j->owner : j->uid, u = 0, c = job_cost(e, j->n_pages, 1);
            int m = 0;
            while (m < n_memo && memo[m].key != key) m++;
            if (m < n_memo) u = memo[m].cost;
            else {
                u = share_cost(e, j, by_owner);
                if (n_memo < 16) { memo[n_memo].key = key; memo[n_memo].cost = u; n_memo++; }
            }
            if (u < c || u - c < w_after) continue;
            if (!v || u > v_share || (u == v_share && j->admit_no > v->admit_no)) {
                v = j;
                best = i;
                v_share = u;
            }
        }
    }
    if (!v) return 0;
    evict(e, v);
    e->active[best] = e->active[--e->n_active];
    queue_insert(e, v);
    return 1;
}

/* Gives each running job the pages of its next step. Where none are left,
 * takes pages back: from a paused job first, else from the youngest
 * running job (which may be the one growing); the job taken from keeps its
 * tokens and computes them again when admitted anew. A job never needs more
 * than the whole pool (eng_submit), so the oldest always goes on. Under mu. */
static void grow(eng *e)
{
again:
    for (int i = 0; i < e->n_active; i++) {
        job *j = e->active[i];
        int want = pages_now(j);
        if (j->n_pages >= want || atomic_load(&j->paused)) continue;
        if (!kvc_alloc(e->kv, want - j->n_pages, j->pages + j->n_pages)) {
            j->n_pages = want;
            continue;
        }
        job *v = NULL;
        int vi = -1;
        for (int k = 0; k < e->n_active; k++)   /* recurrent models, rings: paused jobs keep their slot */
            if (atomic_load(&e->active[k]->paused) && e->active[k]->n_pages > 0) { v = e->active[k]; vi = k; break; }
        if (v) {
            evict(e, v);
            park(e, vi);
            goto again;
        }
        for (job *q = e->parked; q && !v; q = q->next)
            if (q->n_pages > 0) v = q;
        if (v) {
            evict(e, v);                          /* stays parked until resumed */
            goto again;
        }
        for (int k = 0; k < e->n_active; k++)
            if (!atomic_load(&e->active[k]->paused) && (!v || e->active[k]->admit_no > v->admit_no)) {
                v = e->active[k];
                vi = k;
            }
        evict(e, v);
        e->active[vi] = e->active[--e->n_active];
        queue_insert(e, v);
        goto again;
    }
}

/* Ends every generate and eval job with ENG_EMODEL_CHANGED once
 * model_gone(): those waiting for the tokenizer or in its hands, queued
 * (evicted ones included), running, and paused (parked, evicted or not).
 * Tokenize requests go on (the tokenizer keeps its own copies). Under mu;
 * the worker's, as schedule(). */
static void fail_model_gone(eng *e)
{
    char msg[sizeof ((job *)0)->err_msg];
    gone_msg(e, msg, sizeof msg);
    for (job *j = e->pend_head, *prev = NULL, *nx; j; j = nx) {
        nx = j->next;
        if (j->kind == JOB_TOKENIZE || atomic_load(&j->cancel)) { prev = j; continue; }   /* (cancelled: below) */
        if (prev) prev->next = nx; else e->pend_head = nx;
        if (e->pend_tail == j) e->pend_tail = prev;
        pend_done(e, j);
        j->err_code = ENG_EMODEL_CHANGED;
        memcpy(j->err_msg, msg, sizeof msg);
        job_error(e, j);
        job_free(j);
    }
    /* the tokenizer thread drops it when it is through (as when cancelled) */
    job *tj = e->tokenizing;
    if (tj && !tj->reported && tj->kind != JOB_TOKENIZE && !atomic_load(&tj->cancel)) {
        tj->reported = 1;
        pend_done(e, tj);
        tj->err_code = ENG_EMODEL_CHANGED;
        memcpy(tj->err_msg, msg, sizeof msg);
        job_error(e, tj);
    }
    for (job *j = e->queue_head; j; j = j->next)
        if (j->err_code == ENG_OK) { j->err_code = ENG_EMODEL_CHANGED; memcpy(j->err_msg, msg, sizeof msg); }
    if (e->n_active > 0 && e->a_on) e->a_stale = 1;   /* the queued step had them */
    while (e->n_active > 0 || e->parked) {
        job *j = e->n_active > 0 ? e->active[--e->n_active] : e->parked;
        if (j == e->parked) { e->parked = j->next; e->n_parked--; }
        pages_release(e, j);
        j->err_code = ENG_EMODEL_CHANGED;
        memcpy(j->err_msg, msg, sizeof msg);
        job_error(e, j);
        e->st.jobs_done++;
        job_free(j);
    }
}

/* Retires cancelled and failed jobs and admits new ones. Under mu. */
static void schedule(eng *e)
{
    if (atomic_load(&e->model_gone)) fail_model_gone(e);
    job *prev = NULL;
    for (job *j = e->pend_head; j;) {
        job *nx = j->next;
        if (atomic_load(&j->cancel)) {
            if (prev) prev->next = nx; else e->pend_head = nx;
            if (e->pend_tail == j) e->pend_tail = prev;
            pend_done(e, j);
            job_finish(e, j, ENG_FINISH_CANCELLED);
            job_free(j);
        } else prev = j;
        j = nx;
    }
    /* the tokenizer cannot be stopped mid-prompt: the job ends now and the
     * tokenizer thread drops it when it is through */
    job *tj = e->tokenizing;
    if (tj && !tj->reported && atomic_load(&tj->cancel)) {
        tj->reported = 1;
        pend_done(e, tj);
        job_finish(e, tj, ENG_FINISH_CANCELLED);
    }
    prev = NULL;
    for (job *j = e->queue_head; j;) {
        job *nx = j->next;
        if (atomic_load(&j->cancel) || j->err_code != ENG_OK) {
            queue_unlink(e, j, prev);
            if (atomic_load(&j->cancel)) job_finish(e, j, ENG_FINISH_CANCELLED);
            else job_error(e, j);
            job_free(j);
        } else prev = j;
        j = nx;
    }
    for (int i = 0; i < e->n_active;) {
        job *j = e->active[i];
        if (atomic_load(&j->cancel)) {
            pages_release(e, j);
            job_finish(e, j, ENG_FINISH_CANCELLED);
            e->st.jobs_done++;
            job_free(j);
            e->active[i] = e->active[--e->n_active];
        } else i++;
    }
    /* paused jobs leave the batch (keeping their KV while nobody needs it)
     * so that others can run; recurrent models and sliding-window rings keep them in their slot,
     * where their state lives, until the room is needed (make_room) */
    for (int i = 0; i < e->n_active && !e->m->recurrent && !e->m->swa_ring;) {
        job *j = e->active[i];
        if (atomic_load(&j->paused)) {
            e->slot_used[j->slot] = 0;
            park(e, i);
        } else i++;
    }
    for (job **pp = &e->parked; *pp;) {
        job *j = *pp;
        if (atomic_load(&j->cancel)) {
            *pp = j->next;
            e->n_parked--;
            pages_release(e, j);
            job_finish(e, j, ENG_FINISH_CANCELLED);
            e->st.jobs_done++;
            job_free(j);
        } else if (!atomic_load(&j->paused) && j->evicted) {
            *pp = j->next;           /* its pages are gone: admitted again in turn */
            e->n_parked--;
            queue_insert(e, j);
        } else if (!atomic_load(&j->paused) && e->n_active < e->max_seqs) {
            *pp = j->next;
            e->n_parked--;
            j->next = NULL;
            j->slot = 0;
            while (e->slot_used[j->slot]) j->slot++;
            e->slot_used[j->slot] = 1;
            j->state = JOB_ACTIVE;
            e->active[e->n_active++] = j;
        } else pp = &j->next;
    }
    grow(e);
    while (e->queue_head) {
        job *p;
        job *j = pick_fair(e, &p);
        if (!j) break;
        if (admit(e, j, p)) continue;
        if (!make_room(e, j)) break;         /* wait for pages or a slot; keeps order fair */
    }
    stats_now(e);
}

/* The grammar's mask on a job's logits: tokens it refuses get -inf; the
 * end-of-generation tokens pass only where the grammar may end (and alone
 * where nothing may follow). 0, or -1 when the grammar failed (the job got
 * its error event). */
static void grammar_fail(job *j, const char *msg)
{
    j->err_code = ENG_EINVAL;
    snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
    j->finished = 1;
}

static int grammar_mask(eng *e, job *j, float *lg)
{
    int32_t nv = e->m->hp.n_vocab;
    char gerr[160];
    int can_end = gram_match_can_end(j->gm);
    int64_t n = 0;
    if (gram_match_must_end(j->gm)) memset(e->gmask, 0, ((size_t)nv + 31) / 32 * sizeof *e->gmask);
    else n = gram_match_mask(j->gm, e->gvocab, e->gmask, gerr, sizeof gerr);
    if (n < 0) { grammar_fail(j, gerr); return -1; }
    if (n == 0 && !can_end) { grammar_fail(j, "grammar: no token of the vocabulary can continue the text"); return -1; }
    for (int32_t w = 0; w < (nv + 31) / 32; w++) {
        uint32_t bits = e->gmask[w];
        if (bits == 0xFFFFFFFFu) continue;
        for (int32_t i = w * 32; i < nv && i < w * 32 + 32; i++)
            if (!((bits >> (i & 31)) & 1) && !(can_end && e->eog[i])) lg[i] = -INFINITY;
    }
    return 0;
}

/* Whether j's grammar allows token id next, as its mask would (1, 0; -1
 * when it passed a bound: the job failed). */
static int grammar_allows(eng *e, job *j, int32_t id)
{
    const tok *t = e->m->tok;
    char gerr[160];
    size_t l = 0;
    int r;
    if (id < 0 || id >= tok_n_vocab(t)) return 0;
    if (e->eog[id]) return gram_match_can_end(j->gm);
    if (gram_match_must_end(j->gm)) return 0;
    if (tok_is_control(t, id)) r = gram_match_check_token(j->gm, id, gerr, sizeof gerr);
    else {
        const char *pc = tok_piece(t, id, &l);
        if (!pc || !l || l > GRAM_MAX_PIECE) return 0;
        r = gram_match_check(j->gm, pc, l, gerr, sizeof gerr);
    }
    if (r < 0) grammar_fail(j, gerr);
    return r;
}

typedef struct { eng *e; job *j; } allow_ctx;

static int allow_cb(void *ctx, int32_t id)
{
    allow_ctx *a = ctx;
    return grammar_allows(a->e, a->j, id);
}

/* The grammar masks of the n_out output rows of a greedy pass, for the
 * backend's argmax: the tokens each row's grammar allows, and the
 * end-of-generation tokens where it may end: what grammar_mask leaves
 * finite. Rows without a grammar, and those only leaves out (when not
 * NULL), allow every token. A row whose grammar fails is marked in
 * e->b_gfail (its job got its error). NULL when out of memory (every
 * grammar row failed). */
static const uint32_t *masks_fill(eng *e, int n_out, const uint8_t *only)
{
    int32_t nv = e->m->hp.n_vocab;
    size_t nw = ((size_t)nv + 31) / 32, need = (size_t)n_out * nw;
    if (!e->eog_bits && (e->eog_bits = calloc(nw, 4)))
        for (int32_t i = 0; i < nv; i++)
            if (e->eog[i]) e->eog_bits[i >> 5] |= 1u << (i & 31);
    if (need > e->gm_cap) {
        free(e->gm_rows);
        e->gm_rows = malloc(need * 4);
        e->gm_cap = e->gm_rows ? need : 0;
    }
    for (int o = 0; o < n_out; o++) {
        job *j = e->b_job_of_out[o];
        if (!j->gm || (only && !only[o])) {
            if (e->gm_rows) memset(e->gm_rows + (size_t)o * nw, 0xFF, nw * 4);
            continue;
        }
        e->b_gfail[o] = 0;
        if (!e->gm_rows || !e->eog_bits) {
            grammar_fail(j, "grammar: out of memory");
            e->b_gfail[o] = 1;
            continue;
        }
        uint32_t *row = e->gm_rows + (size_t)o * nw;
        char gerr[160];
        int can_end = gram_match_can_end(j->gm);
        int64_t n = 0;
        if (gram_match_must_end(j->gm)) memset(row, 0, nw * 4);
        else n = gram_match_mask(j->gm, e->gvocab, row, gerr, sizeof gerr);
        if (n < 0 || (n == 0 && !can_end)) {
            grammar_fail(j, n < 0 ? gerr : "grammar: no token of the vocabulary can continue the text");
            e->b_gfail[o] = 1;
            continue;
        }
        if (can_end)
            for (size_t w = 0; w < nw; w++) row[w] |= e->eog_bits[w];
    }
    return e->gm_rows && e->eog_bits ? e->gm_rows : NULL;
}

/* Whether some grammar row's mask is not at hand (a state not seen
 * before: its walk over the vocabulary may take longer than a pass). */
static int masks_cold(eng *e, int n_out)
{
    for (int o = 0; o < n_out; o++) {
        const job *j = e->b_job_of_out[o];
        if (j->gm && !gram_match_mask_cached(j->gm, e->gvocab)) return 1;
    }
    return 0;
}

/* A running mean (ms), the last sample weighing a quarter. */
static void ema(double *m, double v) { *m = *m > 0 ? 0.75 * *m + 0.25 * v : v; }

/* After an unconstrained argmax into e->b_ids: the rows whose grammar
 * refuses their id get their masks and the argmax again, on the same
 * logits (nothing was queued behind them). Where the grammar allows the
 * unconstrained choice it is the constrained one too (the first of the
 * largest among all tokens is the first among those allowed). Returns
 * whether it made masks. */
static int greedy_recheck(eng *e, int n_out)
{
    int any = 0;
    for (int o = 0; o < n_out; o++) {
        job *j = e->b_job_of_out[o];
        e->b_gfail[o] = 0;
        e->b_gneed[o] = 0;
        if (!j->gm) continue;
        int ok = grammar_allows(e, j, e->b_ids[o]);
        if (ok < 0) e->b_gfail[o] = 1;
        else if (!ok) e->b_gneed[o] = any = 1;
    }
    if (!any) return 0;
    const uint32_t *mk = masks_fill(e, n_out, e->b_gneed);
    if (!mk) return 1;   /* (those rows failed) */
    fw_argmax_queue(e->fw, n_out, mk);
    fw_greedy_take(e->fw, e->b_ids, n_out);
    return 1;
}

/* The log-probabilities an event carries (logprobs): chosen's and the
 * job's n_lp likeliest, from lg as given. */
static void ev_logprobs(eng *e, job *j, eng_event *ev, const float *lg, int32_t chosen)
{
    int32_t nv = e->m->hp.n_vocab, n = j->n_lp < nv ? j->n_lp : nv;
    if (n > 0) {
        ev->lp_ids = malloc((size_t)n * sizeof *ev->lp_ids);
        ev->lp_vals = malloc((size_t)n * sizeof *ev->lp_vals);
        if (!ev->lp_ids || !ev->lp_vals) n = 0;
    }
    ev->logprob = sampler_logprobs(lg, nv, chosen, n, ev->lp_ids, ev->lp_vals);
    ev->n_lp = n;
    ev->has_logprob = 1;
}

/* echo: the prompt token at pos; lg (NULL for the first token) are the
 * logits of the position before it. */
static void emit_prompt_token(eng *e, job *j, int pos, const float *lg)
{
    eng_event *ev = ev_new(ENG_EV_PROMPT_TOKEN, j);
    if (!ev) return;
    ev->pos = pos;
    ev->token = j->toks[pos];
    if (lg && j->lp) ev_logprobs(e, j, ev, lg, ev->token);
    ev_push(e, ev);
}

static void emit_token(eng *e, job *j, int32_t id, const float *lg, int *finished, eng_finish *why)
{
    const tok *t = e->m->tok;
    j->toks[j->n_tok++] = id;
    j->n_gen++;
    *finished = 0;
    int eog = e->eog[id];
    size_t plen = 0;
    const char *piece = "";
    /* control tokens have no text, but for the parser, whose markers may be
     * control tokens (gpt-oss's <|channel|>, [THINK], ...) */
    if (!eog && (!tok_is_control(t, id) ||
                 (j->tc && (j->tc_ctl || id == e->think_tok[0] || id == e->think_tok[1])))) {
        piece = tok_piece(t, id, &plen);
        /* SentencePiece drops the space prefix of the first piece after BOS */
        int32_t prev = j->toks[j->n_tok - 2];
        if (e->m->spm && prev == tok_bos(t) && plen && piece[0] == ' ') { piece++; plen--; }
    }
    int final = eog || j->n_gen >= j->max_gen || j->n_tok >= e->n_ctx;
    int stopped = 0;
    size_t out_len = 0;
    char *text = job_text(j, piece, plen, final, &stopped, &out_len);
    int calls = 0, tc_err = 0;
    if (j->tc && text) {
        char *content = NULL;
        size_t cl = 0;
        tc_err = job_tools(j, text, out_len, final || stopped, &content, &cl);
        free(text);
        text = content;
        out_len = cl;
        calls = j->n_calls;
        /* enough calls: the reply ends here, what the parser holds resolved
         * (a forced call's grammar ends the reply itself, closing markers
         * included) */
        if (!tc_err && !final && !stopped && j->max_calls && calls >= j->max_calls && !j->force_tools) {
            free(text);
            text = NULL;
            tc_err = job_tools(j, "", 0, 1, &content, &cl);
            text = content;
            out_len = cl;
            final = 1;
        }
    }
    eng_event *ev = ev_new(ENG_EV_TOKEN, j);
    if (ev) {
        ev->token = id;
        if (j->lp) ev_logprobs(e, j, ev, lg, id);
        ev->text = text ? text : calloc(1, 1);
        ev->text_len = text ? out_len : 0;
        if (j->tc && j->tc_reason_len) {
            ev->reasoning = malloc(j->tc_reason_len + 1);
            if (ev->reasoning) {
                memcpy(ev->reasoning, j->tc_reason, j->tc_reason_len + 1);
                ev->reasoning_len = j->tc_reason_len;
            }
        }
        ev_push(e, ev);
    } else free(text);
    if (j->tc) {
        j->tc_reason_len = 0;
        for (eng_event *c = j->tc_calls; c;) { eng_event *n = c->next; c->next = NULL; ev_push(e, c); c = n; }
        j->tc_calls = NULL;
        j->tc_calls_tail = NULL;
    }
    if (tc_err) {
        /* out of memory in the parser: the reply cannot be told apart; it ends here */
        *finished = 1;
        *why = ENG_FINISH_LENGTH;
        return;
    }
    if (stopped) { *finished = 1; *why = ENG_FINISH_STOP; }
    else if (eog) { *finished = 1; *why = ENG_FINISH_EOS; }
    else if (final) { *finished = 1; *why = ENG_FINISH_LENGTH; }
    if (*finished && calls > 0 && *why != ENG_FINISH_LENGTH) *why = ENG_FINISH_TOOL_CALLS;
    if (*finished && calls > 0 && j->max_calls && calls >= j->max_calls) *why = ENG_FINISH_TOOL_CALLS;
}

/* Whether the queued step is the batch just built (T decode rows, every
 * row out, the same sequences at the same positions: its tokens are then
 * the ids the step before computed, as the device took them). */
static int ahead_is(const eng *e, int T, int n_out)
{
    if (!e->a_on || e->a_stale || e->a_T != T || n_out != T) return 0;
    for (int t = 0; t < T; t++)
        if (e->b_job[t] != e->a_job[t] || e->b_pos[t] != e->a_pos[t] || e->b_out[t] != t) return 0;
    return 1;
}

/* Whether to queue the next step now: a greedy batch of decode rows only,
 * none of which ends by length with this step's token, and nobody waiting
 * to join (a sequence that ends by EOS or a stop string, or one that
 * joins, makes the queued step a waste: its ids are dropped; its KV rows
 * at the next position are rewritten by whatever runs there next). */
static int ahead_ok(eng *e, int T, int n_decode, int n_out)
{
    if (n_decode != T || n_out != T || T > BE_QUEUE_ROWS) return 0;
    for (int t = 0; t < T; t++) {
        const job *j = e->b_job[t];
        if (e->b_out[t] != t || j->n_gen + 1 >= j->max_gen || j->n_tok + 1 >= e->n_ctx) return 0;
    }
    pthread_mutex_lock(&e->mu);
    int idle = !e->queue_head && !e->parked;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

/* The queued step, dropped: the ids of its argmax (when queued) are taken
 * and forgotten. */
static void ahead_drop(eng *e)
{
    if (e->a_on && !e->a_noarg) fw_greedy_take(e->fw, e->a_ids, e->a_T);
    e->a_on = 0;
}

/* The greedy pass of the batch in e->b_*: queued unless the step before
 * queued it already; under grammars (masked) its masks computed while it
 * runs, then its argmax queued; the next step's pass queued behind it when
 * ahead_ok (with its argmax unless masked: its masks need this step's
 * ids); then this step's ids taken into e->b_ids. Under grammars whose
 * masks are not at hand and have lately taken longer than half a pass to
 * make, the unconstrained argmax first, the masks only where a grammar
 * refuses its choice (greedy_recheck), nothing queued behind. (Either way
 * the same tokens.) */
static void run_greedy(eng *e, const be_batch *bt, int n_decode, int n_out, int masked)
{
    int T = bt->T;
    int have = ahead_is(e, T, n_out) && (masked ? e->a_noarg : 1);
    int argq = have && !e->a_noarg;   /* its argmax is queued too */
    if (!have) {
        ahead_drop(e);
        if (fw_pass_queue(e->fw, e->b_tok, bt, e->b_out, n_out) != 0) {
            const uint32_t *mk = masked ? masks_fill(e, n_out, NULL) : NULL;
            fw_run_greedy(e->fw, e->b_tok, bt, e->b_out, n_out, mk, e->b_ids);
            return;
        }
    }
    e->a_on = 0;
    int cold = masked && masks_cold(e, n_out);
    if (cold && e->gm_cold_ms > 0.5 * e->gm_pass_ms) {
        fw_argmax_queue(e->fw, n_out, NULL);
        fw_greedy_take(e->fw, e->b_ids, n_out);
        double t0 = now_ms();
        if (greedy_recheck(e, n_out)) ema(&e->gm_cold_ms, now_ms() - t0);
        return;
    }
    const uint32_t *mk = NULL;
    if (masked) {
        double t0 = now_ms();
        mk = masks_fill(e, n_out, NULL);
        if (cold) ema(&e->gm_cold_ms, now_ms() - t0);
    }
    if (!argq) fw_argmax_queue(e->fw, n_out, mk);
    if (ahead_ok(e, T, n_decode, n_out)) {
        for (int t = 0; t < T; t++) {
            e->a_pos[t] = e->b_pos[t] + 1;
            e->a_job[t] = e->b_job[t];
            e->a_out[t] = t;
        }
        be_batch ab = *bt;
        ab.pos = e->a_pos;
        ab.ids_dev = 1;
        if (fw_pass_queue(e->fw, NULL, &ab, e->a_out, n_out) == 0) {
            if (!masked) fw_argmax_queue(e->fw, n_out, NULL);
            e->a_on = 1;
            e->a_noarg = masked;
            e->a_stale = 0;
            e->a_T = T;
        }
    }
    fw_greedy_take(e->fw, e->b_ids, n_out);
}

/* One scheduler step: one forward pass over the batch. */
static void step(eng *e)
{
    int T = 0, n_out = 0;
    /* decode tokens first (one per generating sequence), then prefill chunks */
    for (int i = 0; i < e->n_active; i++) {
        job *j = e->active[i];
        if (atomic_load_explicit(&j->paused, memory_order_relaxed)) continue;
        if (j->n_past < j->n_tok && j->n_past >= j->n_prompt && j->n_past >= j->n_fill) {
            e->b_tok[T] = j->toks[j->n_past];
            e->b_pos[T] = j->n_past;
            e->b_pages[T] = j->pages;
            e->b_slot[T] = j->slot;
            e->b_job[T] = j;
            e->b_out[n_out] = T;
            e->b_job_of_out[n_out] = j;
            e->b_out_pos[n_out] = j->n_past;
            n_out++; T++;
        }
    }
    int n_decode = T;
    int max_out = EVAL_ROWS > e->max_seqs ? EVAL_ROWS : e->max_seqs;   /* (as eng_open sized them) */
    int budget = n_decode ? n_decode + e->prefill_shared : BATCH_TOKENS;
    for (int i = 0; i < e->n_active && T < budget; i++) {
        job *j = e->active[i];
        /* the prompt, or what an evicted job computes again (no outputs) */
        int end = j->n_prompt > j->n_fill ? j->n_prompt : j->n_fill;
        if (j->n_past >= end || atomic_load_explicit(&j->paused, memory_order_relaxed)) continue;
        int take = end - j->n_past;
        if (take > budget - T) take = budget - T;
        int every = j->kind == ENG_JOB_EVAL || j->echo || (j->kind == ENG_JOB_EMBED && e->pooling == ENG_POOL_MEAN);
        if (every && take > EVAL_ROWS - n_out) take = EVAL_ROWS - n_out;
        if (!every && n_out >= max_out) {
            /* its one output row would not fit the logits rows: it waits there */
            int p1 = j->kind == ENG_JOB_EMBED && e->pooling == ENG_POOL_CLS ? 0 : j->n_prompt - 1;
            if (p1 >= j->n_past && p1 < j->n_past + take) take = p1 - j->n_past;
        }
        if (take <= 0) continue;
        int mark = (j->n_prompt - 1) / KV_PAGE * KV_PAGE;
        if (j->snap >= 0 && j->n_past < mark && j->n_past + take >= mark) {
            /* the state at the prompt's last page boundary, saved in this pass */
            fw_snap_at(e->fw, j->slot, mark, j->snap);
            snapc_set(e->snaps, j->snap, j->toks, mark);
        }
        for (int k = 0; k < take; k++) {
            int p = j->n_past + k;
            e->b_tok[T] = j->toks[p];
            e->b_pos[T] = p;
            e->b_pages[T] = j->pages;
            e->b_slot[T] = j->slot;
            e->b_job[T] = j;
            int out = j->kind == ENG_JOB_EVAL || j->echo ? 1 : j->kind == ENG_JOB_EMBED ? emb_out_row(e, j, p)
                                                                                      : p == j->n_prompt - 1;
            if (out && p >= j->n_fill) {
                e->b_out[n_out] = T;
                e->b_job_of_out[n_out] = j;
                e->b_out_pos[n_out] = p;
                n_out++;
            }
            T++;
        }
    }
    if (T == 0) return;
    be_batch bt = { .T = T, .pos = e->b_pos, .pages = e->b_pages, .slot = e->b_slot, .n_dec = n_decode };
    /* when every output row is greedy without penalties, only the argmax ids
     * are needed: backends that can (CUDA) compute them and skip the logits */
    int greedy = n_out > 0 && fw_greedy_ok(e->fw), embed = 0, masked = 0;
    for (int o = 0; o < n_out; o++) {
        const job *j = e->b_job_of_out[o];
        embed |= j->kind == ENG_JOB_EMBED;
        masked |= j->gm != NULL;
        if (j->kind != ENG_JOB_GENERATE || j->s.temperature > 0.0f || j->s.repeat_penalty != 1.0f || j->lp ||
            j->echo)
            greedy = 0;
    }
    double t_pass = now_ms();
    if (greedy) {
        run_greedy(e, &bt, n_decode, n_out, masked);
        if (masked) ema(&e->gm_pass_ms, now_ms() - t_pass);
    } else {
        ahead_drop(e);
        fw_run(e->fw, e->b_tok, &bt, e->b_out, n_out, e->logits);
        if (embed) fw_hidden(e->fw, e->hidden, n_out);
    }
    t_pass = now_ms() - t_pass;
    if (model_gone(e, 1)) {   /* this pass read other weights: its jobs end (schedule) */
        ahead_drop(e);
        return;
    }

    for (int t = 0; t < T; t++) e->b_job[t]->n_past++;
    for (int i = 0; i < e->n_active; i++) pages_publish(e, e->active[i]);
    uint64_t gen = 0;
    int32_t nv = e->m->hp.n_vocab;
    for (int o = 0; o < n_out; o++) {
        job *j = e->b_job_of_out[o];
        float *lg = e->logits + (size_t)o * nv;
        if (j->kind == ENG_JOB_EMBED) {
            emb_add(e, j, e->hidden + (size_t)o * e->m->hp.n_embd);
            continue;
        }
        if (j->kind == ENG_JOB_EVAL) {
            eng_event *ev = ev_new(ENG_EV_LOGITS, j);
            if (ev) {
                ev->pos = e->b_out_pos[o];
                ev->n_top = j->top_n;
                ev->top_ids = malloc((size_t)j->top_n * sizeof *ev->top_ids);
                ev->top_logits = malloc((size_t)j->top_n * sizeof *ev->top_logits);
                if (ev->top_ids && ev->top_logits) sampler_top(lg, nv, j->top_n, ev->top_ids, ev->top_logits);
                else ev->n_top = 0;
                ev_push(e, ev);
            }
            continue;
        }
        int p = e->b_out_pos[o];
        if (j->echo && p < j->n_prompt) {
            if (p == 0) emit_prompt_token(e, j, 0, NULL);
            if (p + 1 < j->n_prompt) { emit_prompt_token(e, j, p + 1, lg); continue; }
            if (j->prompt_only) continue;   /* the last prompt position: nothing to generate */
        }
        if (!j->t_first) j->t_first = now_ms();
        int32_t id;
        if (greedy) {
            if (j->gm && e->b_gfail[o]) continue;   /* (failed) */
            id = e->b_ids[o];
        } else if (j->gm && !j->lp && (j->s.temperature <= 0.0f || !gram_match_mask_cached(j->gm, e->gvocab))) {
            /* the choice without the grammar's mask where it can be exact:
             * greedy, the unconstrained choice where the grammar allows it
             * (then it is the constrained one: greedy_recheck); sampling,
             * the top_k candidates checked one by one (the same choice and
             * RNG step). The mask only where that does not settle it. */
            sampler_penalize(e->smp, lg, &j->s, j->toks, (size_t)j->n_tok);
            if (j->s.temperature <= 0.0f) {
                id = sampler_choose(e->smp, lg, &j->s, &j->rng);
                int ok = grammar_allows(e, j, id);
                id = ok > 0 ? id : ok < 0 ? -2 : -1;
            } else {
                allow_ctx ac = { e, j };
                id = sampler_choose_allowed(e->smp, lg, &j->s, &j->rng, allow_cb, &ac);
            }
            if (id == -2) continue;   /* (failed) */
            if (id < 0) {
                if (grammar_mask(e, j, lg)) continue;
                id = sampler_choose(e->smp, lg, &j->s, &j->rng);
            }
        } else {
            if (j->gm && grammar_mask(e, j, lg)) continue;   /* (failed) */
            if (j->lp) {
                /* the logprobs come from the logits the choice is made from */
                sampler_penalize(e->smp, lg, &j->s, j->toks, (size_t)j->n_tok);
                id = sampler_choose(e->smp, lg, &j->s, &j->rng);
            } else id = sampler_pick(e->smp, lg, &j->s, j->toks, (size_t)j->n_tok, &j->rng);
        }
        if (j->gm && !e->eog[id]) {
            size_t l;
            const char *pc = tok_piece(e->m->tok, id, &l);
            char gerr[160];
            int ok = tok_is_control(e->m->tok, id) ? gram_match_accept_token(j->gm, id, gerr, sizeof gerr)
                                                   : gram_match_accept(j->gm, pc, l, gerr, sizeof gerr);
            if (ok != 1) { grammar_fail(j, gerr); continue; }
        }
        emit_token(e, j, id, lg, &j->finished, &j->why);
        gen++;
    }
    /* retire finished jobs */
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_active;) {
        job *j = e->active[i];
        if ((j->kind != ENG_JOB_GENERATE || j->prompt_only) && j->n_past >= j->n_prompt && !j->finished) {
            if (j->kind == ENG_JOB_EMBED) emb_emit(e, j);
            j->finished = 1;
            j->why = ENG_FINISH_LENGTH;
        }
        if (j->finished) {
            pages_release(e, j);
            if (j->err_code != ENG_OK) job_error(e, j);   /* the grammar failed */
            else job_finish(e, j, j->why);
            e->st.jobs_done++;
            job_free(j);
            e->active[i] = e->active[--e->n_active];
        } else i++;
    }
    e->st.gen_tokens += gen;
    e->st.prompt_tokens += (uint64_t)(T - n_decode);
    e->st.steps++;
    e->st.pass_ms += t_pass;
    pthread_mutex_unlock(&e->mu);
}

/* Whether a forward pass has anything to do. Under mu. */
static int runnable(eng *e)
{
    for (int i = 0; i < e->n_active; i++)
        if (!atomic_load(&e->active[i]->paused)) return 1;
    if (e->n_active < e->max_seqs)
        for (job *j = e->parked; j; j = j->next)
            if (!atomic_load(&j->paused) || atomic_load(&j->cancel)) return 1;
    return 0;
}

void *worker_main(void *arg)
{
    eng *e = arg;
    double done = 0;   /* the last step's time, added under the next lock */
    for (;;) {
        double t0 = now_ms();
        pthread_mutex_lock(&e->mu);
        e->st.step_ms += done;
        done = 0;
        schedule(e);
        while (!e->stop && !runnable(e)) {
            notify(e);  /* schedule() may have retired jobs (their DONE events) */
            pthread_cond_wait(&e->cv, &e->mu);
            schedule(e);
            t0 = now_ms();   /* (idle time is no step's) */
        }
        int stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        notify(e);  /* cancellations/admissions may have produced events */
        step(e);
        notify(e);
        done = now_ms() - t0;
    }
    ahead_drop(e);
    return NULL;
}

