/* iq.h — the i-quants, IQ4_NL, IQ4_XS and MXFP4 (engine-internal; block
 * layouts in qtypes.h, codebooks in iq_tables.h). */
#ifndef ANE_IQ_H
#define ANE_IQ_H

#include "engine/quant/qtypes.h"

/* MXFP4 block scale: 2^(e-128), half the E8M0 value, as the value table is doubled. */
float qt_e8m0_half(uint8_t e);

/* An i-quant super-block (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s,
 * iq4_xs) in the integer form its dot products use: signed values q[256],
 * a scale s[k] per 16 values, a factor fd and (iq1_s, else 0) a shift sign
 * g[j] = +-1 per 32 values:
 *   w[16k + l] = fd * s[k] * (q[16k + l] + 0.125 * g[k / 2])
 * Dot with q8_K activations (isum = sum_k s[k] * dot_k(q, a), msum =
 * sum_j g[j] * s[2j] * bsum32_j(a)):  (fd * da) * ((float)isum + 0.125f * (float)msum). */
void qt_iq_unpack(uint32_t type, const void *b, int8_t q[256], int16_t s[16], int8_t g[8], float *fd);

/* Reference dequantization of nb blocks of type (gguf-py's expressions). */
void qt_iq_dequant(uint32_t type, const void *src, float *dst, int64_t nb);
/* Reference dot of an i-quant or iq4_xs row with a q8_K row (the formula above). */
float qt_iq_dot_ref(uint32_t type, int64_t n, const void *w, const void *a);
/* The 16 signed levels of IQ4_NL/IQ4_XS, and of MXFP4 (E2M1 values doubled). */
const int8_t *qt_iq4nl_values(void);
const int8_t *qt_mxfp4_values(void);

#endif
