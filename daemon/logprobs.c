/* logprobs.c — the log-probabilities of a token or prompt_token event
 * (proto/PROTOCOL.md "logprobs"): the engine's ids and values, with each
 * token's bytes as the tokenizer has them. */
#include "daemon/server_int.h"

void ev_put_logprobs(eng *e, const eng_event *ev, int with_bytes, proto_ev *out, proto_lp *buf)
{
    if (with_bytes) out->bytes = eng_token_piece(e, ev->token, &out->bytes_len);
    if (!ev->has_logprob) return;
    out->has_logprob = 1;
    out->logprob = ev->logprob;
    int32_t n = ev->n_lp < 0 ? 0 : ev->n_lp > PROTO_MAX_LOGPROBS ? PROTO_MAX_LOGPROBS : ev->n_lp;
    for (int32_t i = 0; i < n; i++) {
        buf[i].id = ev->lp_ids[i];
        buf[i].logprob = ev->lp_vals[i];
        buf[i].bytes = eng_token_piece(e, ev->lp_ids[i], &buf[i].bytes_len);
    }
    out->lps = buf;
    out->n_lps = (size_t)n;
}
