/* qtypes.h — weight formats and the kernels that consume them (engine-internal).
 *
 * Type ids are ggml's, as stored in GGUF. Every supported type has:
 *   - a reference dequantizer, bit-exact with llama.cpp (tests compare it with
 *     tests/fixtures/refs/llama-q.dequant.json);
 *   - a matching activation format (qt_act_type): weights of quantized types
 *     are dotted with activations quantized per block (Q8_0, Q8_1 or Q8_K),
 *     float weights with f32 activations;
 *   - a scalar C gemm (the reference) and SIMD versions chosen at run time
 *     (AVX-512 VNNI / AVX2 / NEON), each tested against the scalar one.
 * Weights are never dequantized as a whole: kernels read blocks in place. */
#ifndef ANE_QTYPES_H
#define ANE_QTYPES_H

#include <stddef.h>
#include <stdint.h>

enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7,
    QT_Q8_0 = 8, QT_Q8_1 = 9, QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12,
    QT_Q5_K = 13, QT_Q6_K = 14, QT_Q8_K = 15, QT_IQ2_XXS = 16, QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18, QT_IQ1_S = 19, QT_IQ4_NL = 20, QT_IQ3_S = 21, QT_IQ2_S = 22,
    QT_IQ4_XS = 23, QT_BF16 = 30, QT_MXFP4 = 39,
    QT_COUNT = 40
};

typedef struct qt_traits {
    const char *name;     /* "q4_K", as llama.cpp names it */
    int32_t blck;         /* values per block */
    size_t type_size;     /* bytes per block */
    int weight_ok;        /* 1: supported as a weight type */
} qt_traits;

/* NULL for an id this engine does not know. */
const qt_traits *qt_get(uint32_t type);
const char *qt_name(uint32_t type);  /* unknown ids: "iq1_m (type 29)", "type 99" */
/* Bytes of a row of n values (n a multiple of blck); 0 if not. */
size_t qt_row_size(uint32_t type, int64_t n);

/* Reference dequantization of n values (n a multiple of blck). */
void qt_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Activation format to pair with weight type w, and its quantizer. */
uint32_t qt_act_type(uint32_t wtype);
void qt_quantize_row(uint32_t act_type, const float *x, void *dst, int64_t n);

/* Y[b*ldy + r] = dot(row r of W, activation row b)   for r0 <= r < r1, 0 <= b < nb.
 * W rows are w_stride bytes apart; activations (already in qt_act_type(wtype)
 * format) a_stride bytes apart; n = values per row. Dispatches to the best
 * ISA found by qt_init(). Thread-safe; no allocation (kernels use up to
 * ~64 KiB of stack). Batch-invariant: for a given ISA, Y[b*ldy + r] is
 * bit-identical whatever nb, r0/r1 and the place of row b in the batch. */
void qt_gemm(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
             int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
             float *Y, int64_t ldy);
/* The scalar reference of the same. */
void qt_gemm_ref(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
                 int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
                 float *Y, int64_t ldy);

/* Matrices in 8-row groups (x8.c says why and how they are laid out): the
 * AVX2 form of the q4_K and q8_0 kernels, and their AVX-512 VNNI forms
 * (and q6_K's) where qt_isa_get is AVX-512 or AMX. qt_x8_bytes: the
 * packed size of rows (a multiple of 8) of n values (whole blocks), 0
 * where the type has no such layout (q6_K: below AVX-512) or the shape
 * does not fit it. qt_x8_pack: rows r0..r1
 * (multiples of 8) of W into their places in dst. qt_x8_gemm: qt_gemm on
 * the packed matrix P (rows r0..r1, multiples of 8), the same bits as
 * qt_gemm_ref on the GGUF bytes; -1 where the CPU lacks AVX2 (the caller
 * then runs qt_gemm on the GGUF bytes). With AMX only the layouts that
 * have AMX prompt tiles (q8_0, q4_K) are packed: q6_K's prompts run
 * faster on the tiles from the GGUF layout. */
size_t qt_x8_bytes(uint32_t type, int64_t n, int64_t rows);
int qt_x8_pack(uint32_t type, const void *W, size_t w_stride, int64_t n, int64_t r0, int64_t r1, void *dst);
int qt_x8_gemm(uint32_t type, int64_t n, const void *P, int64_t r0, int64_t r1, const void *A, size_t a_stride,
               int nb, float *Y, int64_t ldy);
/* (x86/amx.c) q8_0's and q4_K's packs on AMX tiles: rows [r0, r0 + 16 np),
 * r0 a multiple of 8, against nt whole 16-row tiles of activations */
void qt_gemm_amx_x8(uint32_t wtype, int64_t n, const void *P, int64_t r0, int np, const void *A, size_t a_stride,
                    int nt, float *Y, int64_t ldy);

/* Run-time ISA choice. qt_init is idempotent and thread-safe. */
/* QT_ISA_AMX: AVX-512 plus AMX int8 tiles for batches of 16 or more rows. */
typedef enum qt_isa { QT_ISA_SCALAR = 0, QT_ISA_AVX2, QT_ISA_AVX512, QT_ISA_NEON, QT_ISA_AMX } qt_isa;
void qt_init(void);
qt_isa qt_isa_get(void);
/* What the CPU has, whatever qt_isa_set or ANE_QT_ISA chose. */
qt_isa qt_isa_cpu(void);
const char *qt_isa_name(qt_isa isa);
/* Force a lower ISA (tests, benchmarks); clamps to what the CPU has. */
void qt_isa_set(qt_isa isa);

/* Scalar conversions. */
float qt_fp16_to_fp32(uint16_t h);
uint16_t qt_fp32_to_fp16(float f);
float qt_bf16_to_fp32(uint16_t h);
uint16_t qt_fp32_to_bf16(float f);  /* round to nearest even, as llama.cpp */

/* ---- Block layouts (exactly as GGML/GGUF store them) and the per-ISA
 * kernel entry points. For qtypes*.c, qt_*.c and tests. ---- */
#define QT_QK 32          /* values per block of the small-block types */
#define QT_QK_K 256       /* values per K-quant super-block */

typedef struct { uint16_t d; uint8_t qs[16]; } qt_block_q4_0;                 /* 18 */
typedef struct { uint16_t d, m; uint8_t qs[16]; } qt_block_q4_1;              /* 20 */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } qt_block_q5_0;  /* 22 */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } qt_block_q5_1; /* 24 */
typedef struct { uint16_t d; int8_t qs[32]; } qt_block_q8_0;                  /* 34 */
typedef struct { uint16_t d, s; int8_t qs[32]; } qt_block_q8_1;               /* 36: s = d * sum(qs) */
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } qt_block_q2_K;      /* 84 */
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } qt_block_q3_K; /* 110 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } qt_block_q4_K;    /* 144 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } qt_block_q5_K; /* 176 */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } qt_block_q6_K;  /* 210 */
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } qt_block_q8_K; /* 292: bsums = sums of 16 */
/* i-quants and the non-linear 4-bit types (codebooks in iq_tables.h) */
typedef struct { uint16_t d; uint16_t qs[32]; } qt_block_iq2_xxs;                   /* 66 */
typedef struct { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; } qt_block_iq2_xs; /* 74 */
typedef struct { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; } qt_block_iq2_s; /* 82: qs = 32 grid bytes, 32 sign bytes */
typedef struct { uint16_t d; uint8_t qs[96]; } qt_block_iq3_xxs;                     /* 98: 64 grid bytes, 8 scale+sign words */
typedef struct { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; } qt_block_iq3_s; /* 110 */
typedef struct { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; } qt_block_iq1_s;      /* 50 */

typedef struct { uint16_t d; uint8_t qs[16]; } qt_block_iq4_nl;                      /* 18 */
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } qt_block_iq4_xs; /* 136 */
typedef struct { uint8_t e; uint8_t qs[16]; } qt_block_mxfp4;                        /* 17: e = E8M0 exponent */

/* The layouts are the GGUF files' bytes. */
#ifndef __cplusplus
_Static_assert(sizeof(qt_block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(qt_block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(qt_block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(qt_block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(qt_block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(qt_block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(qt_block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(qt_block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(qt_block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(qt_block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(qt_block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(qt_block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(qt_block_iq2_xxs) == 66, "iq2_xxs");
_Static_assert(sizeof(qt_block_iq2_xs) == 74, "iq2_xs");
_Static_assert(sizeof(qt_block_iq2_s) == 82, "iq2_s");
_Static_assert(sizeof(qt_block_iq3_xxs) == 98, "iq3_xxs");
_Static_assert(sizeof(qt_block_iq3_s) == 110, "iq3_s");
_Static_assert(sizeof(qt_block_iq1_s) == 50, "iq1_s");
_Static_assert(sizeof(qt_block_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(qt_block_iq4_xs) == 136, "iq4_xs");
_Static_assert(sizeof(qt_block_mxfp4) == 17, "mxfp4");
#endif

/* Bytes of one block of a quantized type the gemm kernels take (0: none
 * such), a compile-time constant once inlined (qt_get's type_size is not). */
static inline __attribute__((always_inline)) size_t qt_block_bytes(uint32_t type)
{
    switch (type) {
    case QT_Q4_0: return sizeof(qt_block_q4_0);
    case QT_Q4_1: return sizeof(qt_block_q4_1);
    case QT_Q5_0: return sizeof(qt_block_q5_0);
    case QT_Q5_1: return sizeof(qt_block_q5_1);
    case QT_Q8_0: return sizeof(qt_block_q8_0);
    case QT_Q2_K: return sizeof(qt_block_q2_K);
    case QT_Q3_K: return sizeof(qt_block_q3_K);
    case QT_Q4_K: return sizeof(qt_block_q4_K);
    case QT_Q5_K: return sizeof(qt_block_q5_K);
    case QT_Q6_K: return sizeof(qt_block_q6_K);
    case QT_IQ4_NL: return sizeof(qt_block_iq4_nl);
    case QT_MXFP4: return sizeof(qt_block_mxfp4);
    case QT_IQ4_XS: return sizeof(qt_block_iq4_xs);
    case QT_IQ2_XXS: return sizeof(qt_block_iq2_xxs);
    case QT_IQ2_XS: return sizeof(qt_block_iq2_xs);
    case QT_IQ2_S: return sizeof(qt_block_iq2_s);
    case QT_IQ3_XXS: return sizeof(qt_block_iq3_xxs);
    case QT_IQ3_S: return sizeof(qt_block_iq3_s);
    case QT_IQ1_S: return sizeof(qt_block_iq1_s);
    default: return 0;
    }
}

/* q[0..32) = kv[nibble] of the 16 bytes qs: the low nibbles, then the high
 * (iq4_nl, mxfp4: 4-bit indices into a table of int8 levels). */
static inline void qt_nibbles_i8(const int8_t *kv, const uint8_t *qs, int8_t *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = kv[qs[j] & 15];
        q[j + 16] = kv[qs[j] >> 4];
    }
}


/* Dot of two rows in the reference arithmetic (w row of wtype, a row of
 * qt_act_type(wtype)). */
float qt_vec_dot_ref(uint32_t wtype, int64_t n, const void *w, const void *a);

/* qt_quantize_row in plain C. qt_quantize_row itself uses SIMD versions
 * (qt_quantize_avx2: 0 done, -1 not handled) whose output is identical
 * byte for byte for finite input. */
void qt_quantize_row_ref(uint32_t act_type, const float *x, void *dst, int64_t n);
int qt_quantize_avx2(uint32_t act_type, const float *x, void *dst, int64_t n);

/* SIMD kernels (same arguments as qt_gemm): 0 done, -1 type not handled
 * there (the caller falls back to a lower ISA). Defined only where built
 * (quant/gemm_entry.h). */
typedef int qt_gemm_kernel(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
                           int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
                           float *Y, int64_t ldy);
qt_gemm_kernel qt_gemm_avx2, qt_gemm_avx512, qt_gemm_amx, qt_gemm_neon;

#endif
