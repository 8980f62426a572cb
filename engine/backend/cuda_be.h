/* cuda_be.h — the CUDA backend's state, shared by its host-side files
 * (engine-internal): cuda.c (the backend, its matmuls, attention and
 * passes), cuda_ssm.c (the linear-attention ops), cuda_moe.c (the
 * mixture-of-experts op). Only the backend's files include it. */
#ifndef ANE_BACKEND_CUDA_BE_H
#define ANE_BACKEND_CUDA_BE_H

#include "engine/backend/backend.h"
#include "shaders/kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>

#define GRAPH_MAX_T 256        /* decode batches recorded as graphs */

/* an uploaded weight; dev16: its f16 copy for cuBLAS, made at first use
 * while device memory allows (no16: it did not); devb likewise, a q6_K
 * matrix in the batched kernel's layout (nob) */
typedef struct upl { const void *data; void *dev; void *dev16; int no16; void *devb; int nob; } upl;

#define CU_GROUP_MAX 8           /* GPUs of one tensor-parallel group */

typedef struct cu_be {
    be base;
    int dev;                   /* the device (be_opts.device): made current by every entry point */
    void *comm;                /* the tensor-parallel group's NCCL communicator (cuda_tp.c), or NULL */
    struct cu_comms *comms;    /* the group's communicators (cuda_tp.c) */
    int rank, n_rank;
    cudaStream_t st;
    cublasHandle_t blas;
    void *blas_ws;
    int n_sm;
    int failed;                /* a CUDA call failed: reported once */
    /* uploaded weights */
    upl *up; int n_up, cap_up;
    size_t max_w_elems;        /* largest matrix, for the f16 / f32 scratch */
    int64_t max_n_in;
    void *w16; size_t w16_cap; /* bytes */
    void *x16; size_t x16_cap;
    void *x16b;                /* a second of x16_cap (the batched gate-and-up kernel reads one, writes the other) */
    void *xq; size_t xq_cap;   /* int8 activations of the GEMV */
    void *xq2;                 /* a second of xq_cap, for a kernel that reads one form and writes another */
    /* per-step block: ids[cap_T] pos[cap_T] off[cap_T] slot[cap_T] pages[...];
     * on the host two halves of step_cap ints, taken in turn (a pass may be
     * staged while the one before it is queued), ev_step marking each
     * half's copy done */
    int32_t *h_step, *d_step;
    cudaEvent_t ev_step[2];
    int step_half, step_used[2];
    size_t step_cap;           /* int32s */
    int cap_T;
    const be_batch *cur_bt;
    const int32_t *cur_ids;
    int in_step, n_dec;        /* inside fw's pass: its decode rows */
    float *part;               /* attention partials: att_rows rows of att_maxs spans */
    size_t part_cap;           /* floats */
    int att_maxs;              /* spans per (token, head) row of part */
    int att_rows;              /* (token, head) rows of part: 2*n_sm, more for grouped decode batches */
    int att_grp;               /* grouped attention's blocks per SM (4; 0: never grouped) */
    int att_mma;               /* attention on tensor cores: 1 for decode batches past CK_GEMV_MAX_T and
                                * prompts of a block per SM (not invariant), 2 always, 0 never */
    int att_mma_bps;           /* its blocks per SM (1: a block's 4 warps hold 136 KiB of stages) */
    int invariant;             /* decode rows always by GEMV (be_opts.deterministic) */
    int no_graphs;             /* passes never recorded (be_opts.no_graphs) */
    int cache16;               /* keep f16 copies of quantized weights (unless be_opts.f16_cache_off) */
    void *mmqb_part; int *mmqb_cnt;   /* the batched kernel's split-K scratch (CK_MMQB_PART bytes, CK_MMQB_CNT counters) */
    ck_feat feat;              /* what the device and this build offer (ck_feat_probe) */
    /* be_cuda_force_set's (tests; the defaults otherwise) */
    int fuse;                  /* fused kernels, matmul inputs written ahead (debug switch ANE_CUDA_FUSE=0: off) */
    int gemv_all;              /* every matmul row by the GEMV */
    int act_int8;              /* be_opts.act_int8: int8-path matrices take every row by the GEMV */
    int glu;                   /* gate, up and silu_mul in one launch where it applies */
    int rope_att_always;       /* decode rope inside the attention after any q/k/v set, not only small ones */
    const float *xq_src;       /* xq holds the int8 form of xq_src [xq_rows][xq_n], or nothing */
    const float *x16_src;      /* x16 holds the f16 form of x16_src [x16_rows][x16_n], or nothing */
    int x16_rows, x16_n;
    int xq_rows, xq_n;
    int q_n[8], n_q_n;         /* widths (n_in) of the int8 matrices */
    int h_n[8], n_h_n;         /* widths of the quantized matrices (f16 GEMM inputs) */
    /* rope angles of the pass's tokens, computed by its first rope_kv and
     * read by the later layers' (same base, dims and divisors) */
    void *rope_tab; size_t rope_cap;   /* bytes */
    float rope_base; int rope_rot; const void *rope_fd; int rope_have;
    const float *mm_out;       /* the last matmul's output [mm_rows][mm_n] (silu_mul's rows) */
    size_t mm_bytes;           /* the weight bytes of the last matmul_n's set */
    int mm_rows, mm_n;
    /* graphs */
    cudaGraphExec_t graph[GRAPH_MAX_T + 1];
    unsigned char seen[GRAPH_MAX_T + 1];
    int capturing, cap_graph_T;
    /* host staging for logits; argmax ids */
    void *h_out; size_t h_out_cap;
    int32_t *d_ids_out, *h_ids_out;
    /* argmax_queue: up to two passes' ids on their way to the host (h_ids_q
     * halves of BE_QUEUE_ROWS), oldest at ids_head */
    int32_t *h_ids_q;
    cudaEvent_t ev_ids[2];
    int ids_head, ids_n;
    void *d_amax;              /* argmax partials: CK_ARGMAX_PART bytes */
    /* grammar masks of argmax rows: pinned halves (one per queued argmax)
     * and their device copy, mask_cap words each */
    uint32_t *h_mask, *d_mask;
    size_t mask_cap;
} cu_be;

static inline int ok(cu_be *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 1;
    if (!c->failed) fprintf(stderr, "cuda backend: %s: %s\n", what, cudaGetErrorString(e));
    c->failed = 1;
    return 0;
}

/* Tags say which activations the int8 (xq) and f16 (x16) scratches hold,
 * so that matmuls on the same input convert it once; every op that writes
 * device memory clears them (or checks the overlap: tag_written). */
static inline void tag_set(cu_be *c, const float *x, int rows, int n) { c->xq_src = x; c->xq_rows = rows; c->xq_n = n; }
static inline void tag16_set(cu_be *c, const float *x, int rows, int n) { c->x16_src = x; c->x16_rows = rows; c->x16_n = n; }

static inline int tag_is(const cu_be *c, const float *x, int rows, int n)
{
    return c->xq_src && c->xq_src == x && c->xq_rows == rows && c->xq_n == n;
}

/* Whether a batch of T rows takes the int8 tensor-core kernels
 * (ck_moe_tc_*, ck_tc_matmul): prompts past the batches that route and
 * group in one block, never in a deterministic daemon (their sums are in
 * another order than the per-row kernels'). */
static inline int tc_batch(const cu_be *c, int T) { return T > CK_MOE_RG_MAX_T && !c->invariant; }

static inline void tag_clear(cu_be *c)
{
    tag_set(c, NULL, 0, 0);
    tag16_set(c, NULL, 0, 0);
}

static inline int overlaps(const float *a, size_t na, const float *b, size_t nb)
{
    return a && b < a + na && a < b + nb;
}

/* out [n] floats were written: a tag on memory overlapping them goes */
static inline void tag_written(cu_be *c, const float *out, size_t n)
{
    if (overlaps(c->xq_src, (size_t)c->xq_rows * c->xq_n, out, n)) tag_set(c, NULL, 0, 0);
    if (overlaps(c->x16_src, (size_t)c->x16_rows * c->x16_n, out, n)) tag16_set(c, NULL, 0, 0);
}

/* The backend's device current on the calling thread: the host calls of
 * one backend may come from several threads (the engine's, a rank's), and
 * those of several backends from one. */
static inline void cu_dev(const cu_be *c) { cudaSetDevice(c->dev); }

/* the per-step block's positions and sequence slots (cu_step_begin) */
static inline const int32_t *d_pos(cu_be *c) { return c->d_step + c->cap_T; }
static inline const int32_t *d_slot(cu_be *c) { return c->d_step + 3 * c->cap_T; }

/* cuda.c: makes bt current (outside a step: uploads it now); a matmul */
void cu_use_batch(cu_be *c, const be_batch *bt);
void cu_matmul(be *b, const wt *w, const wt *bias, const float *x, int T, float *out);

/* cuda_ssm.c */
be_copy_rows_fn cu_copy_rows;
be_sigmoid_mul_fn cu_sigmoid_mul;
be_rmsnorm_gated_fn cu_rmsnorm_gated;
be_conv1d_silu_fn cu_conv1d_silu;
be_deltanet_fn cu_deltanet;

/* cuda_tp.c: be_ops.group and allreduce; the communicator's end (cu_close) */
int cu_group(be *const *bs, int n, char *err, size_t errlen);
void cu_allreduce(be *b, float *x, size_t n);
void cu_send(be *b, const float *x, size_t n, int to);
void cu_recv(be *b, float *x, size_t n, int from);
void cu_group_leave(cu_be *c);

/* cuda_moe.c */
size_t cu_moe_scratch(be *b, const be_moe *m, int max_T);
void cu_moe(be *b, const be_moe *m, const float *x, int T, void *scratch, float *out);

#endif
