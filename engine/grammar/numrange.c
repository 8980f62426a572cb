/* numrange.c — GBNF for the decimal numbers (or integers) between bounds:
 * JSON Schema's minimum, maximum, exclusiveMinimum, exclusiveMaximum.
 *
 * A value is a sign, an integer part I (no leading zeros, at most 16
 * digits) and a fraction F (at most 16 digits), no exponent. Bounds are
 * exact decimals (the shortest text that reads back as the schema's
 * double). The negative and non-negative values are ranges of magnitudes;
 * a magnitude range splits into the lower bound's integer part with a
 * fraction above its fraction, the integer parts strictly between (any
 * fraction), and the upper bound's integer part with a fraction below its
 * own. Integer ranges go by digit count, then digit by digit (the way
 * llama.cpp's json-schema-to-grammar builds them); fraction comparisons are
 * left-aligned digit strings, digit by digit. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "engine/grammar/gram_int.h"

#define MAXD 16
static const int64_t INT_CAP = 9999999999999999LL;   /* 16 digits */

typedef strbuf sb;

static void add(sb *b, const char *s) { strbuf_adds(b, s); }

static void addf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(sb *b, const char *fmt, ...)
{
    char t[128];
    va_list ap; va_start(ap, fmt); vsnprintf(t, sizeof t, fmt, ap); va_end(ap);
    add(b, t);
}

/* ---- integers: [a, b], 0 <= a <= b, as decimal text ---- */

/* Same length n, x <= y (digit strings). */
static void same_len(sb *b, const char *x, const char *y, int n)
{
    if (n == 0) { add(b, "\"\""); return; }
    if (x[0] == y[0]) {
        addf(b, "\"%c\" ", x[0]);
        same_len(b, x + 1, y + 1, n - 1);
        return;
    }
    int xz = 1, y9 = 1;
    for (int i = 1; i < n; i++) { if (x[i] != '0') xz = 0; if (y[i] != '9') y9 = 0; }
    add(b, "(");
    int first = 1;
    char lo = x[0], hi = y[0];
    if (!xz) {   /* x[0] then at least x's rest */
        char nines[MAXD + 1];
        memset(nines, '9', (size_t)n - 1); nines[n - 1] = 0;
        addf(b, "\"%c\" (", x[0]);
        same_len(b, x + 1, nines, n - 1);
        add(b, ")");
        first = 0;
        lo++;
    }
    if (!y9) hi--;
    if (lo <= hi) {
        if (!first) add(b, " | ");
        addf(b, "[%c-%c]", lo, hi);
        if (n > 1) addf(b, " [0-9]{%d}", n - 1);
        first = 0;
    }
    if (!y9) {
        char zeros[MAXD + 1];
        memset(zeros, '0', (size_t)n - 1); zeros[n - 1] = 0;
        if (!first) add(b, " | ");
        addf(b, "\"%c\" (", y[0]);
        same_len(b, zeros, y + 1, n - 1);
        add(b, ")");
    }
    add(b, ")");
}

static void int_range(sb *b, int64_t a, int64_t c)
{
    char xs[24], ys[24];
    int la = snprintf(xs, sizeof xs, "%" PRId64, a), lc = snprintf(ys, sizeof ys, "%" PRId64, c);
    add(b, "(");
    for (int L = la; L <= lc; L++) {
        char x[24], y[24];
        if (L == la) strcpy(x, xs);
        else { x[0] = '1'; memset(x + 1, '0', (size_t)L - 1); x[L] = 0; }
        if (L == lc) strcpy(y, ys);
        else { memset(y, '9', (size_t)L); y[L] = 0; }
        if (L > la) add(b, " | ");
        same_len(b, x, y, L);
    }
    add(b, ")");
}

/* ---- fractions: digit strings D (0..n digits) compared left-aligned ---- */
enum { K_NONE, K_GE, K_GT, K_LE, K_LT };

static int empty_ok(int lk, const char *L, int hk, const char *H)
{
    int lo = lk == K_NONE || (lk == K_GE && !*L);
    int hi = hk == K_NONE || hk == K_LE || (hk == K_LT && *H);
    return lo && hi;
}

/* Nonempty D of at most n digits within the bounds; 0 when there is none. */
static int frac_ne(sb *b, int lk, const char *L, int hk, const char *H, int n)
{
    if (n <= 0 || (hk == K_LT && !*H)) return 0;
    int lo_d = lk == K_NONE || !*L ? 0 : L[0] - '0';
    int hi_d = hk == K_NONE ? 9 : !*H ? 0 : H[0] - '0';
    if (lo_d > hi_d) return 0;
    sb t = { 0 };
    int alts = 0;
    for (int d = lo_d; d <= hi_d; d++) {
        int at_lo = d == lo_d && lk != K_NONE, at_hi = d == hi_d && hk != K_NONE;
        /* the rest's constraints */
        int rlk = K_NONE, rhk = K_NONE;
        const char *rL = "", *rH = "";
        if (at_lo) {
            if (*L) { rlk = lk; rL = L + 1; }
            else if (lk == K_GT) rlk = K_GT;     /* D was 0 so far: must turn nonzero */
        }
        if (at_hi) {
            rhk = hk;
            rH = *H ? H + 1 : "";
            if (!*H && hk == K_LT) continue;
        }
        if (rlk == K_NONE && rhk == K_NONE) {
            /* free rest: digits d..e alike */
            int e = d;
            while (e + 1 <= hi_d && !(e + 1 == hi_d && hk != K_NONE)) e++;
            if (alts++) add(&t, " | ");
            if (e > d) addf(&t, "[%d-%d]", d, e); else addf(&t, "\"%d\"", d);
            if (n > 1) addf(&t, " [0-9]{0,%d}", n - 1);
            d = e;
            continue;
        }
        sb r = { 0 };
        int has = frac_ne(&r, rlk, rL, rhk, rH, n - 1);
        int eo = empty_ok(rlk, rL, rhk, rH);
        if (!has && !eo) { free(r.p); continue; }
        if (alts++) add(&t, " | ");
        addf(&t, "\"%d\"", d);
        if (has) { add(&t, " ("); add(&t, r.p); add(&t, eo ? ")?" : ")"); }
        free(r.p);
    }
    if (alts) { add(b, "("); add(b, t.p); add(b, ")"); }
    if (t.oom) b->oom = 1;
    free(t.p);
    return alts > 0;
}

/* The fraction part ("" or "." D) within the bounds: 0 when none. */
static int fraction(sb *b, int lk, const char *L, int hk, const char *H)
{
    sb r = { 0 };
    int has = frac_ne(&r, lk, L, hk, H, MAXD), eo = empty_ok(lk, L, hk, H);
    if (has) { add(b, "(\".\" "); add(b, r.p); add(b, eo ? ")?" : ")"); }
    else if (eo) add(b, "\"\"");
    if (r.oom) b->oom = 1;
    free(r.p);
    return has || eo;
}

/* ---- bounds ---- */
typedef struct { int on, excl; int64_t I; char F[MAXD + 1]; } mag;   /* a magnitude bound */

/* Magnitudes m (>= 0) within lo..hi (hi.on 0: up to 16 integer digits). */
static int mag_range(sb *b, const mag *lo, const mag *hi, int integer)
{
    int64_t LI = lo->I, HI = hi->on ? hi->I : INT_CAP;
    if (LI > HI) return 0;
    int lk = lo->excl ? K_GT : K_GE, hk = !hi->on ? K_NONE : hi->excl ? K_LT : K_LE;
    int alts = 0;
    sb t = { 0 };
    if (integer) {
        /* integers: bounds already rounded inward and inclusive */
        if (LI <= HI) { int_range(&t, LI, HI); alts = 1; }
    } else if (LI == HI) {
        sb f = { 0 };
        if (fraction(&f, lk, lo->F, hk, hi->F)) { addf(&t, "\"%" PRId64 "\" ", LI); add(&t, f.p); alts++; }
        free(f.p);
    } else {
        sb f = { 0 };
        if (fraction(&f, lk, lo->F, K_NONE, "")) { addf(&t, "\"%" PRId64 "\" ", LI); add(&t, f.p); alts++; }
        free(f.p);
        if (LI + 1 <= HI - (hi->on ? 1 : 0)) {
            if (alts++) add(&t, " | ");
            int_range(&t, LI + 1, hi->on ? HI - 1 : HI);
            addf(&t, " (\".\" [0-9]{1,%d})?", MAXD);
        }
        if (hi->on) {
            sb g = { 0 };
            if (fraction(&g, K_NONE, "", hk, hi->F)) {
                if (alts++) add(&t, " | ");
                addf(&t, "\"%" PRId64 "\" ", HI); add(&t, g.p);
            }
            free(g.p);
        }
    }
    if (alts) { add(b, "("); add(b, t.p); add(b, ")"); }
    if (t.oom) b->oom = 1;
    free(t.p);
    return alts > 0;
}

/* v as an exact decimal: sign, integer part, fraction digits (no trailing
 * zeros), the shortest that reads back as v. -1 when it needs more than 16
 * integer or fraction digits. */
static int decimal(double v, int *neg, int64_t *I, char *F)
{
    if (!isfinite(v) || fabs(v) > (double)INT_CAP) return -1;
    char s[64];
    int k;
    for (k = 0; k <= MAXD; k++) {
        snprintf(s, sizeof s, "%.*f", k, fabs(v));
        if (strtod(s, NULL) == fabs(v)) break;
    }
    if (k > MAXD) return -1;
    *neg = v < 0;
    char *dot = strchr(s, '.');
    if (dot) *dot = 0;
    *I = strtoll(s, NULL, 10);
    snprintf(F, MAXD + 1, "%s", dot ? dot + 1 : "");
    size_t n = strlen(F);
    while (n && F[n - 1] == '0') F[--n] = 0;
    if (*I == 0 && !*F) *neg = 0;
    return 0;
}

/* An exclusive bound moved by half a unit in the last place of v, toward
 * the values allowed (dir +1: up, -1: down), rounded outward to 16
 * fraction digits: decimals that read back as v itself (1.1000000000000001
 * is the double 1.1) are then left out too. */
static void nudge(double v, int dir, int *neg, int64_t *I, char *F)
{
    double a = fabs(v);
    long double gap = (long double)nextafter(a, INFINITY) - a;
    if (a > 0) { long double g2 = (long double)a - nextafter(a, 0); if (g2 > gap) gap = g2; }
    long double units = ceill(gap / 2 * 1e16L);
    char f16[MAXD + 1];
    snprintf(f16, sizeof f16, "%-16s", F);
    for (int i = 0; i < MAXD; i++) if (f16[i] == ' ') f16[i] = '0';
    __int128 x = (__int128)*I * 10000000000000000LL + strtoll(f16, NULL, 10);
    if (*neg) x = -x;
    x += dir * (__int128)units;
    *neg = x < 0;
    if (x < 0) x = -x;
    *I = (int64_t)(x / 10000000000000000LL);
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%016llu", (unsigned long long)(x % 10000000000000000LL));
    memcpy(F, tmp, MAXD);
    F[MAXD] = 0;
    size_t n = strlen(F);
    while (n && F[n - 1] == '0') F[--n] = 0;
    if (*I == 0 && !*F) *neg = 0;
}

char *numrange_gbnf(const gram_bound *lo, const gram_bound *hi, int integer, char *err, size_t errlen)
{
    int lneg = 0, hneg = 0;
    int64_t lI = 0, hI = 0;
    char lF[MAXD + 1] = "", hF[MAXD + 1] = "";
    if (lo->on && decimal(lo->v, &lneg, &lI, lF)) { snprintf(err, errlen, "the lower bound %g needs more than 16 digits", lo->v); return NULL; }
    if (hi->on && decimal(hi->v, &hneg, &hI, hF)) { snprintf(err, errlen, "the upper bound %g needs more than 16 digits", hi->v); return NULL; }
    int lex = lo->excl, hex = hi->excl;
    if (!integer && lo->on && lex) nudge(lo->v, +1, &lneg, &lI, lF);
    if (!integer && hi->on && hex) nudge(hi->v, -1, &hneg, &hI, hF);
    if (lI > INT_CAP || hI > INT_CAP) { snprintf(err, errlen, "a bound needs more than 16 digits"); return NULL; }
    if (integer) {
        /* round inward to integers, inclusive */
        if (lo->on) {
            double c = lex ? floor(lo->v) + 1 : ceil(lo->v);
            decimal(c, &lneg, &lI, lF); lex = 0;
        }
        if (hi->on) {
            double c = hex ? ceil(hi->v) - 1 : floor(hi->v);
            decimal(c, &hneg, &hI, hF); hex = 0;
        }
    }
    sb b = { 0 };
    int alts = 0;
    add(&b, "(");
    /* non-negative values: where the upper bound allows some */
    int nonneg_ok = !hi->on || !hneg;
    if (nonneg_ok) {
        mag mlo = { 1, 0, 0, "" }, mhi = { hi->on, hex, hI, "" };
        snprintf(mhi.F, sizeof mhi.F, "%s", hF);
        if (lo->on && !lneg) { mlo.excl = lex; mlo.I = lI; snprintf(mlo.F, sizeof mlo.F, "%s", lF); }
        sb t = { 0 };
        if (mag_range(&t, &mlo, &mhi, integer)) { add(&b, t.p); alts++; }
        free(t.p);
    }
    /* negative values: "-" and a magnitude above 0 (or above -hi) */
    if (!lo->on || lneg) {
        mag mlo = { 1, 1, 0, "" }, mhi = { lo->on, lex, lI, "" };
        snprintf(mhi.F, sizeof mhi.F, "%s", lF);
        if (hi->on && hneg) { mlo.excl = hex; mlo.I = hI; snprintf(mlo.F, sizeof mlo.F, "%s", hF); }
        if (integer && mlo.excl && !*mlo.F) { mlo.I++; mlo.excl = 0; }   /* m > k is m >= k+1 */
        sb t = { 0 };
        if (mag_range(&t, &mlo, &mhi, integer)) {
            if (alts++) add(&b, " | ");
            add(&b, "\"-\" "); add(&b, t.p);
        }
        free(t.p);
    }
    add(&b, ")");
    if (integer) addf(&b, " (\".\" \"0\"{1,%d})?", MAXD);
    if (!alts) { free(b.p); b.p = NULL; b.n = 0; b.cap = 0; add(&b, "[^\\x00-\\U0010FFFF]"); }
    if (b.oom) { free(b.p); snprintf(err, errlen, "out of memory"); return NULL; }
    return b.p;
}
