/* ktrace.so — the kernel timeline of a CUDA program, for finding where a
 * decode step's time goes (graph replays and launch overlap included, which
 * ncu's serialized kernels hide). LD_PRELOAD it with KTRACE=FILE: every
 * kernel's start and end (ns, the GPU's clock), grid size, registers per
 * thread and name, one line each, written at exit from CUPTI's activity
 * records. ktrace.py splits the file into steps and prints one step.
 *   make ktrace
 *   KTRACE=/tmp/t.txt LD_PRELOAD=bin/ktrace.so bin/anebench --model M --backend cuda --gen 24
 *   python3 tests/bench/ktrace/ktrace.py /tmp/t.txt */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI buf_req(uint8_t **b, size_t *size, size_t *max_records)
{
    *b = aligned_alloc(8, (size_t)8 << 20);
    *size = *b ? (size_t)8 << 20 : 0;   /* (no buffer: CUPTI drops the records) */
    *max_records = 0;
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t stream, uint8_t *b, size_t size, size_t valid)
{
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(b, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || !out) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        fprintf(out, "%llu %llu %u %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->gridX * k->gridY * k->gridZ, k->registersPerThread, k->name);
    }
    free(b);
}

__attribute__((constructor)) static void kt_init(void)
{
    const char *f = getenv("KTRACE");
    if (!f) return;
    if (!(out = fopen(f, "w"))) { fprintf(stderr, "ktrace: cannot write %s\n", f); return; }
    if (cuptiActivityRegisterCallbacks(buf_req, buf_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
        fprintf(stderr, "ktrace: CUPTI activity tracing is not available\n");
}

__attribute__((destructor)) static void kt_fini(void)
{
    if (!out) return;
    cuptiActivityFlushAll(1);
    fclose(out);
}
