/* eng_wait.h — for the engine tests (tests/unit/eng_wait.c) */
#ifndef ANE_TESTS_ENG_WAIT_H
#define ANE_TESTS_ENG_WAIT_H

#include "engine/engine.h"

/* eng_stats once no job is active or queued and no KV is in use, or as
 * they are after 5 s. The worker updates them when it next schedules, a
 * moment after the last job's done event: a test that reads them on that
 * event may see the pages it is about to release. */
void eng_stats_idle(eng *e, eng_stats *st);

#endif
