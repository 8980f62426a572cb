/* embed.c — embed jobs' pooling (engine.h ENG_JOB_EMBED): which prompt
 * positions are output rows, their hidden states (after the final norm)
 * summed in position order, and the L2-normalised vector as one event.
 * The sum runs in double, one row at a time in position order, whatever
 * passes the rows came in: the vector does not depend on the batching. */
#include "engine/engine_int.h"

static const char *const pool_names[] = { "", "mean", "cls", "last" };

void emb_setup(eng *e)
{
    int p = e->opt.pooling, t = e->m->hp.pooling_type;
    e->info.pooling_source = "option";
    if (p < ENG_POOL_MEAN || p > ENG_POOL_LAST) {
        /* 0 none and 4 rank are no pooled vector: a decoder's last token */
        int has = t >= ENG_POOL_MEAN && t <= ENG_POOL_LAST;
        p = has ? t : ENG_POOL_LAST;
        e->info.pooling_source = has ? "model" : "default";
    }
    e->pooling = p;
    e->info.pooling = pool_names[p];
}

int emb_out_row(const eng *e, const job *j, int pos)
{
    switch (e->pooling) {
    case ENG_POOL_MEAN: return 1;
    case ENG_POOL_CLS: return pos == 0;
    default: return pos == j->n_prompt - 1;
    }
}

void emb_add(const eng *e, job *j, const float *h)
{
    int E = e->m->hp.n_embd;
    for (int i = 0; i < E; i++) j->emb_acc[i] += h[i];
    j->emb_rows++;
}

void emb_emit(eng *e, job *j)
{
    int E = e->m->hp.n_embd;
    eng_event *ev = ev_new(ENG_EV_EMBEDDING, j);
    if (!ev) return;
    ev->embd = malloc((size_t)E * sizeof *ev->embd);
    if (!ev->embd) { free(ev); return; }
    double n = j->emb_rows > 0 ? (double)j->emb_rows : 1.0, ss = 0;
    for (int i = 0; i < E; i++) {
        double v = j->emb_acc[i] / n;
        ss += v * v;
    }
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int i = 0; i < E; i++) ev->embd[i] = (float)(j->emb_acc[i] / n * inv);
    ev->n_embd = E;
    ev_push(e, ev);
}
