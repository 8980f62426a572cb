/* cuda_tp.c — the CUDA backend's tensor-parallel group: one NCCL
 * communicator per rank, made for the ranks' devices at once, and the
 * all-reduce on the rank's stream (recorded into its CUDA graphs like any
 * other launch).
 *
 * NCCL is loaded when a group is made, not linked: a build without it, or a
 * machine without libnccl.so.2, runs on one GPU and says why a group
 * cannot be made. The header is the build's (make finds the toolkit's, the
 * system's or a pip-installed NCCL, docs/cuda.md). */
#ifdef ANE_CUDA

#include "engine/backend/cuda_be.h"

#include <stdio.h>
#include <string.h>

#ifdef ANE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>

static struct {
    void *lib;
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*error)(ncclResult_t);
    ncclResult_t (*version)(int *);
} nc;

/* libnccl.so.2 from the loader's search path, else where the build found it */
static int nccl_load(char *err, size_t errlen)
{
    if (nc.lib) return 0;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef ANE_NCCL_LIB
    if (!h) h = dlopen(ANE_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) {
        snprintf(err, errlen, "NCCL is not installed (libnccl.so.2: %s)", dlerror());
        return -1;
    }
    *(void **)&nc.init_all = dlsym(h, "ncclCommInitAll");
    *(void **)&nc.all_reduce = dlsym(h, "ncclAllReduce");
    *(void **)&nc.error = dlsym(h, "ncclGetErrorString");
    *(void **)&nc.version = dlsym(h, "ncclGetVersion");
    *(void **)&nc.abort = dlsym(h, "ncclCommAbort");
    *(void **)&nc.send = dlsym(h, "ncclSend");
    *(void **)&nc.recv = dlsym(h, "ncclRecv");
    if (!nc.init_all || !nc.all_reduce || !nc.error || !nc.version || !nc.abort || !nc.send || !nc.recv) {
        snprintf(err, errlen, "libnccl.so.2 lacks the NCCL functions this build needs");
        dlclose(h);
        memset(&nc, 0, sizeof nc);
        return -1;
    }
    nc.lib = h;
    return 0;
}

/* The ranks' communicators, shared. Ending one is collective (finalize,
 * or destroy without it, waits for the other ranks to end theirs, and
 * finalizing them together from one thread spun in ncclGroupEnd on an
 * H200 pair), so the last rank to leave waits for every rank's device to
 * be idle and then aborts them all, which is local. */
struct cu_comms {
    int n, refs;
    int dev[CU_GROUP_MAX];
    pthread_mutex_t mu;
    ncclComm_t c[CU_GROUP_MAX];
};
#endif

int cu_group(be *const *bs, int n, char *err, size_t errlen)
{
#ifndef ANE_NCCL
    (void)bs; (void)n;
    snprintf(err, errlen, "this build has no NCCL (rebuild with it installed: docs/cuda.md)");
    return -1;
#else
    if (n < 2 || n > CU_GROUP_MAX) {
        snprintf(err, errlen, "a group of %d GPUs (expected 2 to %d)", n, CU_GROUP_MAX);
        return -1;
    }
    int devs[CU_GROUP_MAX];
    for (int r = 0; r < n; r++) {
        const cu_be *c = (const cu_be *)bs[r];
        devs[r] = c->dev;
        if (c->feat.cc != ((const cu_be *)bs[0])->feat.cc || c->feat.code != ((const cu_be *)bs[0])->feat.code) {
            snprintf(err, errlen, "GPUs %d and %d differ (compute capability %d.%d and %d.%d): a group takes one "
                     "kind", devs[0], devs[r], ((const cu_be *)bs[0])->feat.cc / 10,
                     ((const cu_be *)bs[0])->feat.cc % 10, c->feat.cc / 10, c->feat.cc % 10);
            return -1;
        }
    }
    if (nccl_load(err, errlen)) return -1;
    struct cu_comms *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "out of memory"); return -1; }
    ncclResult_t r = nc.init_all(g->c, n, devs);
    if (r != ncclSuccess) {
        snprintf(err, errlen, "NCCL could not join GPUs %d..%d: %s", devs[0], devs[n - 1], nc.error(r));
        free(g);
        return -1;
    }
    g->n = g->refs = n;
    memcpy(g->dev, devs, sizeof devs[0] * (size_t)n);
    pthread_mutex_init(&g->mu, NULL);
    int v = 0;
    nc.version(&v);
    for (int i = 0; i < n; i++) {
        cu_be *c = (cu_be *)bs[i];
        c->comm = g->c[i];
        c->comms = g;
        c->rank = i;
        c->n_rank = n;
        size_t len = strlen(c->base.device);
        snprintf(c->base.device + len, sizeof c->base.device - len, "; GPU %d, rank %d of %d over NCCL %d.%d", devs[i], i, n,
                 v / 10000, v / 100 % 100);
    }
    return 0;
#endif
}

#ifdef ANE_NCCL
/* a queued collective's result: a failure reported once, the backend failed */
static void nccl_ok(cu_be *c, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess || c->failed) return;
    fprintf(stderr, "cuda backend: %s: %s\n", what, nc.error(r));
    c->failed = 1;
}
#endif

void cu_allreduce(be *b, float *x, size_t n)
{
    cu_be *c = (cu_be *)b;
    if (!c->comm || n == 0) return;
#ifdef ANE_NCCL
    nccl_ok(c, nc.all_reduce(x, x, n, ncclFloat32, ncclSum, (ncclComm_t)c->comm, c->st), "all-reduce");
#endif
    tag_written(c, x, n);
}

/* (a point-to-point pair on the two ranks' streams; NVLink or PCIe) */
void cu_send(be *b, const float *x, size_t n, int to)
{
    cu_be *c = (cu_be *)b;
    if (!c->comm || n == 0) return;
#ifdef ANE_NCCL
    nccl_ok(c, nc.send(x, n, ncclFloat32, to, (ncclComm_t)c->comm, c->st), "send");
#else
    (void)x; (void)to;
#endif
}

void cu_recv(be *b, float *x, size_t n, int from)
{
    cu_be *c = (cu_be *)b;
    if (!c->comm || n == 0) return;
#ifdef ANE_NCCL
    nccl_ok(c, nc.recv(x, n, ncclFloat32, from, (ncclComm_t)c->comm, c->st), "recv");
#else
    (void)from;
#endif
    tag_written(c, x, n);
}

void cu_group_leave(cu_be *c)
{
#ifdef ANE_NCCL
    struct cu_comms *g = c->comms;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        for (int i = 0; i < g->n; i++) {
            cudaSetDevice(g->dev[i]);
            cudaDeviceSynchronize();
        }
        for (int i = 0; i < g->n; i++) nc.abort(g->c[i]);
        cu_dev(c);
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
#endif
    c->comm = NULL;
    c->comms = NULL;
}

#else
typedef int backend_cuda_tp_unused;   /* CPU-only builds: nothing here */
#endif
