/* check.h — the unit-test harness: non-fatal CHECKs that report file:line,
 * and a closing "N passed, M failed" line that tests/run.sh adds up.
 * Each tests/unit/t_*.c is one program: define tests as functions and list
 * them in main with RUN(fn). */
#ifndef ANE_CHECK_H
#define ANE_CHECK_H

#include <stdio.h>
#include <string.h>
#include <math.h>

/* A program of several files defines CHECK_SHARED before including this,
 * and its main's file defines the counters once (CHECK_COUNTERS). */
#ifdef CHECK_SHARED
extern int check_pass_, check_fail_, check_cur_fail_;
#define CHECK_COUNTERS int check_pass_, check_fail_, check_cur_fail_
#else
static int check_pass_, check_fail_, check_cur_fail_;
#endif

#define CHECK(cond) do { \
    if (cond) { check_pass_++; } else { check_fail_++; check_cur_fail_++; \
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)

#define CHECKF(cond, ...) do { \
    if (cond) { check_pass_++; } else { check_fail_++; check_cur_fail_++; \
        fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

#define CHECK_EQ_INT(a, b) CHECKF((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))
#define CHECK_NEAR(a, b, tol) CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%g vs %g (tol %g)", (double)(a), (double)(b), (double)(tol))

/* A program whose main starts with CHECK_ARGS(argc, argv) runs only the
 * tests named on its command line, when any are (e.g. a sanitizer build's
 * subset). */
static int check_argc_;
static char **check_argv_;
#define CHECK_ARGS(c, v) (check_argc_ = (c), check_argv_ = (v))
static inline int check_selected_(const char *name)
{
    if (check_argc_ <= 1) return 1;
    for (int i = 1; i < check_argc_; i++)
        if (strcmp(check_argv_[i], name) == 0) return 1;
    return 0;
}

#define RUN(fn) do { if (!check_selected_(#fn)) break; check_cur_fail_ = 0; fn(); \
    fprintf(stderr, "%-40s %s\n", #fn, check_cur_fail_ ? "FAIL" : "ok"); } while (0)

#define CHECK_DONE() (printf("%d passed, %d failed\n", check_pass_, check_fail_), check_fail_ ? 1 : 0)

/* Repository-relative fixture path (tests run from the repository root). */
#define FIXTURE(p) ("tests/fixtures/" p)

#endif
