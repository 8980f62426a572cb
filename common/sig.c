/* sig.c — the stop signals (sig.h). */
#include "common/sig.h"

const int stop_sig[N_STOP_SIGS] = { SIGTERM, SIGINT, SIGHUP };

void stop_signals(sigset_t *set)
{
    sigemptyset(set);
    for (int i = 0; i < N_STOP_SIGS; i++) sigaddset(set, stop_sig[i]);
}
