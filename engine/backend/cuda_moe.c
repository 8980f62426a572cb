/* cuda_moe.c — the CUDA backend's mixture-of-experts op (host side;
 * kernels in shaders/moe.cu): the router by cu_matmul, then routing,
 * grouping by expert, the experts' matmuls and the weighted sum on the
 * device, in one scratch laid out by cmoe_layout. */
#ifdef ANE_CUDA

#include "engine/backend/cuda_be.h"
#include "engine/backend/moe_lay.h"

/* The scratch of cu_moe for max_T tokens: the shared parts (moe_lay.h),
 * then the (expert, slots) tiles and their count, and the int8 forms of x
 * [T][E] and hg [N][F] (ck_moe_int8 types), 256-byte aligned. */
typedef struct cmoe_lay { moe_lay p; size_t tiles, nt, xq, hq; } cmoe_lay;

static size_t cmoe_layout(const be_moe *m, int max_T, cmoe_lay *L)
{
    moe_lay_of(m, max_T, 256, &L->p);
    L->tiles = moe_lay_part(&L->p, (size_t)ck_moe_max_tiles(L->p.N, L->p.X) * 3 * 4, 256);
    L->nt = moe_lay_part(&L->p, 4, 256);
    L->xq = moe_lay_part(&L->p, CK_XQ_BYTES(L->p.T, m->gate->n_in), 256);
    L->hq = moe_lay_part(&L->p, CK_XQ_BYTES(L->p.N, L->p.F), 256);
    return L->p.end;
}

size_t cu_moe_scratch(be *b, const be_moe *m, int max_T)
{
    cmoe_lay L;
    return cmoe_layout(m, max_T, &L);
}

static const float *dev_or_null(const wt *w) { return w && w->data ? w->dev : NULL; }

void cu_moe(be *b, const be_moe *m, const float *x, int T, void *scratch, float *out)
{
    cu_be *c = (cu_be *)b;
    if (T <= 0) return;
    cmoe_lay L;
    cmoe_layout(m, T, &L);
    char *s = scratch;
    float *lg = (float *)(s + L.p.lg), *wts = (float *)(s + L.p.wts), *hg = (float *)(s + L.p.hg),
          *hu = (float *)(s + L.p.hu), *y = (float *)(s + L.p.y);
    int32_t *ids = (int32_t *)(s + L.p.ids), *first = (int32_t *)(s + L.p.first), *slot = (int32_t *)(s + L.p.slot),
            *pair = (int32_t *)(s + L.p.pair), *tiles = (int32_t *)(s + L.tiles), *nt = (int32_t *)(s + L.nt);
    int X = m->n_expert, XH = be_moe_held(m), K = m->n_used, N = T * K, F = m->n_ff, E = (int)(m->down->n_out / XH);
    int E_in = (int)m->gate->n_in, down8 = ck_moe_int8(m->down->type, F);
    int glu8 = ck_moe_gluq_ok(m->gate->type, m->gate->row_bytes, m->up->type, m->up->row_bytes, E_in, F);
    /* Prompt batches of int8 experts go by tensor-core tiles of an expert's
     * tokens (another order of the sums: not for deterministic daemons,
     * which keep the per-row kernels' bits at every batch size). */
    int tc = glu8 && down8 && tc_batch(c, T);
    int tt = tc ? CK_MOE_TC_TT : CK_MOE_TT, mt = ck_moe_tiles_max(N, X, tt);
    /* Experts of int8 types take int8 activations at every batch size (as
     * the CPU's do, so that the next layers' routers choose alike); the
     * others decode-sized batches (and every batch when deterministic) by
     * the warp-per-row kernel, as the dense matmuls take the GEMV up to
     * CK_GEMV_MAX_T tokens, so that a token's bits are the same alone or
     * in any such batch. A grid needs no more tiles than slots. */
    int mv = T <= CK_GEMV_MAX_T || c->invariant, mvt = N < mt ? N : mt;
    cu_matmul(b, m->router, m->router_b, x, T, lg);
    /* x's int8 form, where the norm before (or the router) left it */
    const void *xq = tag_is(c, x, T, E_in) ? c->xq : NULL;
    tag_clear(c);
    if (T <= CK_MOE_RG_MAX_T) {
        ck_moe_route_group(c->st, lg, T, X, K, m->gating, m->norm, m->scale, m->expert0, XH, ids, wts, first, slot,
                           pair, tiles, nt);
    } else {
        ck_moe_route(c->st, lg, T, X, K, m->gating, m->norm, m->scale, m->expert0, XH, ids, wts);
        ck_moe_group(c->st, ids, N, XH, tt, first, slot, pair, tiles, nt);
    }
    void *hq = s + L.hq;
    /* x's int8 form once, for whichever int8 kernels take it */
    if (!xq && (glu8 || ck_moe_int8(m->gate->type, E_in) || ck_moe_int8(m->up->type, E_in)))
        ck_quant_x(c->st, x, T, E_in, (void *)(xq = s + L.xq));
    if (tc) {
        ck_moe_tc_glu(c->st, m->gate->type, m->gate->dev, m->up->dev, m->gate->row_bytes, E_in, F, xq, T, K, pair,
                      tiles, nt, mvt, dev_or_null(m->gate_b), dev_or_null(m->up_b), m->act, m->alpha, m->limit, hq,
                      N);
        ck_moe_tc_mm(c->st, m->down->type, m->down->dev, m->down->row_bytes, F, E, hq, N, 0, K, pair, tiles, nt,
                     mvt, dev_or_null(m->down_b), y);
        ck_moe_combine(c->st, y, slot, wts, T, K, E, out);
        tag_clear(c);
        return;
    }
    if (glu8) {
        ck_moe_gluq(c->st, m->gate->type, m->gate->dev, m->up->dev, m->gate->row_bytes, E_in, F, xq, T, K, pair,
                    tiles, nt, mvt, dev_or_null(m->gate_b), dev_or_null(m->up_b), m->act, m->alpha, m->limit,
                    down8 ? NULL : hg, down8 ? hq : NULL, N);
    } else {
        const wt *gu[2] = { m->gate, m->up }, *gub[2] = { m->gate_b, m->up_b };
        float *guo[2] = { hg, hu };
        for (int i = 0; i < 2; i++) {
            const wt *w = gu[i];
            if (ck_moe_int8(w->type, E_in)) {
                ck_moe_mmq(c->st, w->type, w->dev, w->row_bytes, E_in, F, xq, T, 1, K, pair, tiles, nt, mvt,
                           dev_or_null(gub[i]), guo[i]);
            } else {
                ck_moe_mm(c->st, w->type, w->dev, w->row_bytes, E_in, F, x, 1, K, pair, tiles, nt, mvt,
                          dev_or_null(gub[i]), guo[i], mv);
            }
        }
        ck_moe_act(c->st, hg, hu, (size_t)N * F, m->act, m->alpha, m->limit);
        if (down8) ck_quant_x(c->st, hg, N, F, hq);
    }
    /* A few tokens (no more pairs than experts, so that few share one):
     * the down products and the weighted sum in one launch, each pair's
     * expert rows read by its token's warps. */
    if (down8 && N <= X && ck_moe_downq_ok(m->down->type, F, K)) {
        ck_moe_downq(c->st, m->down->type, m->down->dev, m->down->row_bytes, F, E, hq, N, T, K, ids, slot, wts,
                     dev_or_null(m->down_b), out);
    } else {
        if (down8)
            ck_moe_mmq(c->st, m->down->type, m->down->dev, m->down->row_bytes, F, E, hq, N, 0, K, pair, tiles, nt,
                       mvt, dev_or_null(m->down_b), y);
        else
            ck_moe_mm(c->st, m->down->type, m->down->dev, m->down->row_bytes, F, E, hg, 0, K, pair, tiles, nt,
                      mvt, dev_or_null(m->down_b), y, mv);
        ck_moe_combine(c->st, y, slot, wts, T, K, E, out);
    }
    tag_clear(c);
}

#else
typedef int backend_cuda_moe_unused;   /* CPU-only builds: nothing here */
#endif
