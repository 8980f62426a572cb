/* eng_wait.c — see eng_wait.h */
#include "tests/unit/eng_wait.h"

#include <unistd.h>

void eng_stats_idle(eng *e, eng_stats *st)
{
    for (int i = 0; i < 5000; i++) {
        eng_stats_get(e, st);
        if (st->active + st->queued == 0 && st->kv_used == 0) return;
        usleep(1000);
    }
}
