/* logprobs.h — token log-probabilities in OpenAI's shapes (logprobs.c). */
#ifndef ANE_HTTP_LOGPROBS_H
#define ANE_HTTP_LOGPROBS_H

#include "http/gw_int.h"

/* The request's logprobs fields into q: chat "logprobs" (bool) and
 * "top_logprobs" (0..20); completions "logprobs" (0..20). -1 with *e. */
int lp_parse(json_t *o, proto_req *q, int chat, perr *e);
/* The job reports logprobs; prompt (NULL for ids) places its text_offset. */
void lp_start(job *j, const char *prompt, size_t prompt_len);
/* One token or prompt_token event's entry. */
void lp_add(gw_req *rq, job *j, const proto_ev *ev);
/* Entries waiting to be written. */
int lp_pending(const job *j);
/* "logprobs": the entries so far (then dropped), or null without logprobs. */
void lp_json(gw_req *rq, job *j, sbuf *b);
void lp_free(job *j);
/* Bytes that are not whole UTF-8 become U+FFFD (an echoed token prompt's text). */
void lp_fix_utf8(sbuf *b);

#endif
