/* moe_lay.c — the shared parts of the mixture-of-experts scratch (moe_lay.h). */
#include "engine/backend/moe_lay.h"

size_t moe_lay_part(moe_lay *L, size_t n, size_t align)
{
    size_t at = L->end;
    L->end += (n + align - 1) & ~(align - 1);
    return at;
}

void moe_lay_of(const be_moe *m, int max_T, size_t align, moe_lay *L)
{
    L->T = (size_t)(max_T > 0 ? max_T : 1);
    L->N = L->T * (size_t)m->n_used;
    L->X = (size_t)m->n_expert;
    L->F = (size_t)m->n_ff;
    L->E = (size_t)(m->down->n_out / be_moe_held(m));
    L->end = 0;
    L->lg = moe_lay_part(L, L->T * L->X * 4, align);
    L->ids = moe_lay_part(L, L->N * 4, align);
    L->wts = moe_lay_part(L, L->N * 4, align);
    L->first = moe_lay_part(L, (L->X + 1) * 4, align);
    L->slot = moe_lay_part(L, L->N * 4, align);
    L->pair = moe_lay_part(L, L->N * 4, align);
    L->hg = moe_lay_part(L, L->N * L->F * 4, align);
    L->hu = moe_lay_part(L, L->N * L->F * 4, align);
    L->y = moe_lay_part(L, L->N * L->E * 4, align);
}
