/* sig.h — the signals that stop a program (SIGTERM, SIGINT, SIGHUP), one set
 * for aned and aned-http: blocked in every thread and taken by one place
 * (signalfd, sigwait or the event loop). */
#ifndef ANE_COMMON_SIG_H
#define ANE_COMMON_SIG_H

#include <signal.h>

#define N_STOP_SIGS 3
extern const int stop_sig[N_STOP_SIGS];

/* Fills *set with exactly the stop signals. */
void stop_signals(sigset_t *set);

#endif
