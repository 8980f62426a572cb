#!/usr/bin/python3
"""Token log-probabilities end to end: generate's logprobs, echo and
prompt_only on the protocol (against eval's logits of the same tokens: the
differences of two tokens' logprobs are the differences of their logits, to
1e-4), alone and batched, bad values; aned-http's /v1/completions legacy
shape, an lm-eval loglikelihood request (token ids, max_tokens 0, echo,
logprobs 1), streamed chunks, and /v1/chat/completions' content entries.
Ends with "N passed, M failed"."""
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import anepy  # noqa: E402
import test_http as th  # noqa: E402

TOL = 1e-4
PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376]


def events(c, **req):
    rid = c.request("generate", **req)
    return list(c.events(rid))


def split(evs):
    return ([e for e in evs if e["type"] == "prompt_token"], [e for e in evs if e["type"] == "token"],
            evs[-1])


def t_protocol_shapes(env):
    with anepy.connect(env.raw.sock) as c:
        evs = events(c, tokens=PROMPT, max_tokens=6, temperature=0, logprobs=5, echo=True)
        pt, tk, done = split(evs)
        th.check(done["type"] == "done" and done["usage"]["completion_tokens"] == 6, "done %r" % done)
        th.check(len(pt) == len(PROMPT) and [e["pos"] for e in pt] == list(range(len(PROMPT))), "prompt events %r" % pt)
        th.check(evs.index(pt[-1]) < evs.index(tk[0]), "prompt events come first")
        th.check([e["token"] for e in pt] == PROMPT, "prompt ids")
        th.check("logprob" not in pt[0] and "top_logprobs" not in pt[0] and isinstance(pt[0]["bytes"], bytes),
                 "first prompt token: no logprob %r" % pt[0])
        for e in pt[1:] + tk:
            th.check(isinstance(e["logprob"], float) and e["logprob"] <= 0, "logprob %r" % e)
            th.check(len(e["top_logprobs"]) == 5 and all(len(a) == 3 and isinstance(a[2], bytes)
                                                         for a in e["top_logprobs"]), "top %r" % e)
            vals = [a[1] for a in e["top_logprobs"]]
            th.check(vals == sorted(vals, reverse=True), "best first %r" % vals)
            th.check(sum(math.exp(v) for v in vals) <= 1 + 1e-5, "probabilities add up to at most 1")
        for e in tk:   # greedy: the chosen token is the likeliest, the same value
            th.check(e["top_logprobs"][0][0] == e["token"] and e["top_logprobs"][0][1] == e["logprob"], "greedy %r" % e)
            th.check(isinstance(e["bytes"], bytes), "bytes")
        # against eval's logits of the same tokens
        ids = PROMPT + [e["token"] for e in tk]
        out, _ = c.eval(tokens=ids, top=100)
        logits = {pos: dict((a[0], a[1]) for a in top) for pos, top in out}
        worst = 0.0
        for e, pos in [(e, e["pos"] - 1) for e in pt[1:]] + [(e, len(PROMPT) - 1 + k) for k, e in enumerate(tk)]:
            lg = logits[pos]
            th.check(e["token"] in lg, "the token is among eval's top 100")
            lse = lg[e["token"]] - e["logprob"]
            m = max(lg.values())
            th.check(lse >= m + math.log(sum(math.exp(v - m) for v in lg.values())) - TOL, "normaliser below the top's")
            for a in e["top_logprobs"]:
                worst = max(worst, abs((a[1] - e["logprob"]) - (lg[a[0]] - lg[e["token"]])))
        th.check(worst < TOL, "logprob differences equal logit differences: worst %.2e" % worst)
        # logprobs: true is the chosen token's alone; without it nothing
        _, tk2, _ = split(events(c, tokens=PROMPT, max_tokens=3, temperature=0, logprobs=True))
        th.check(all(e["top_logprobs"] == [] and e["logprob"] == t["logprob"] for e, t in zip(tk2, tk)), "logprobs true %r" % tk2)
        _, tk3, _ = split(events(c, tokens=PROMPT, max_tokens=3, temperature=0))
        th.check(all("logprob" not in e and "bytes" not in e for e in tk3), "no logprobs unasked %r" % tk3)
        # echo without logprobs: the prompt's tokens and their bytes only
        pt4, _, _ = split(events(c, prompt="Once upon", raw=True, max_tokens=1, echo=True))
        th.check(pt4 and all("logprob" not in e for e in pt4) and b"".join(e["bytes"] for e in pt4).endswith(b"upon"),
                 "echo alone %r" % pt4)
        # prompt_only: the prompt's events, nothing generated; it may fill the context
        pt5, tk5, d5 = split(events(c, tokens=PROMPT, echo=True, prompt_only=True, logprobs=2))
        th.check(len(pt5) == len(PROMPT) and not tk5 and d5["usage"]["completion_tokens"] == 0, "prompt_only %r" % d5)
        th.check([e["logprob"] for e in pt5[1:]] == [e["logprob"] for e in pt[1:]], "prompt_only: the same values")
        n_ctx = c.info()["n_ctx"]
        full = [1] + [300] * (n_ctx - 1)
        pt6, _, d6 = split(events(c, tokens=full, echo=True, prompt_only=True, logprobs=0))
        th.check(d6["type"] == "done" and len(pt6) == n_ctx, "a whole context: %r" % d6)
        # sampled with a penalty: the same as the penalised distribution, whatever the temperature
        a = split(events(c, tokens=PROMPT, max_tokens=5, temperature=0.5, seed=3, repeat_penalty=1.5, logprobs=3))[1]
        b = split(events(c, tokens=PROMPT, max_tokens=5, temperature=1.5, seed=3, repeat_penalty=1.5, logprobs=3))[1]
        th.check(a[0]["top_logprobs"] == b[0]["top_logprobs"], "temperature changes no logprob: %r %r" % (a[0], b[0]))
        th.check(a[0]["token"] != b[0]["token"] or a[0]["logprob"] == b[0]["logprob"], "nor the chosen's")


def t_protocol_batched(env):
    """The same values alone and beside other streams."""
    with anepy.connect(env.raw.sock) as c:
        alone = events(c, tokens=PROMPT, max_tokens=12, temperature=0, logprobs=4, echo=True)
        others = [c.request("generate", tokens=[1, 298 + k], max_tokens=40, temperature=0, logprobs=2) for k in range(3)]
        rid = c.request("generate", tokens=PROMPT, max_tokens=12, temperature=0, logprobs=4, echo=True)
        batched = list(c.events(rid))
        for o in others:
            list(c.events(o))

        def strip(evs):
            return [(e["type"], e.get("token"), e.get("logprob"), e.get("top_logprobs")) for e in evs if e["type"] != "done"]
        th.check(strip(alone) == strip(batched), "batched values differ from alone")


def t_protocol_bad(env):
    with anepy.connect(env.raw.sock) as c:
        for req, code, field in [({"logprobs": 21}, "invalid_value", "logprobs"),
                                 ({"logprobs": -1}, "invalid_value", "logprobs"),
                                 ({"logprobs": "3"}, "bad_request", "logprobs"),
                                 ({"echo": 1}, "bad_request", "echo"),
                                 ({"prompt_only": True}, "invalid_value", "prompt_only"),
                                 ({"prompt_only": "x", "echo": True}, "bad_request", "prompt_only")]:
            rid = c.request("generate", tokens=[1, 403], max_tokens=2, **req)
            ev = c.next_event(rid)
            th.check(ev["type"] == "error" and ev["code"] == code and ('"%s"' % field) in ev["message"],
                     "%r: %r" % (req, ev))
        th.check(c.ping() is not None, "the connection goes on")


def t_http_completions(env):
    gw = env.gw_raw
    st, _, b = th.post(gw, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 3})
    th.check(st == 200, "%s %r" % (st, b))
    lp = b["choices"][0]["logprobs"]
    th.check(sorted(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"], "keys %r" % lp)
    th.check(len(lp["tokens"]) == 5 and len(lp["token_logprobs"]) == 5 and len(lp["top_logprobs"]) == 5
             and len(lp["text_offset"]) == 5, "lengths %r" % lp)
    th.check("".join(lp["tokens"]) == b["choices"][0]["text"], "tokens make the text")
    th.check(lp["text_offset"][0] == 0 and all(lp["text_offset"][i + 1] == lp["text_offset"][i] + len(lp["tokens"][i])
                                               for i in range(4)), "offsets %r" % lp["text_offset"])
    with anepy.connect(env.raw.sock) as c:
        _, tk, _ = split(events(c, tokens=PROMPT, max_tokens=5, temperature=0, logprobs=3))
    th.check(all(abs(x - e["logprob"]) < 1e-6 for x, e in zip(lp["token_logprobs"], tk)), "the protocol's values")
    th.check(all(len(t) <= 3 and max(t.values()) == v for t, v in zip(lp["top_logprobs"], lp["token_logprobs"])),
             "greedy: the chosen is the top %r" % lp["top_logprobs"])
    # lm-eval's loglikelihood request: ids, max_tokens 0, echo, logprobs 1
    ctx, cont = PROMPT[:6], PROMPT[6:]
    st, _, b = th.post(gw, "/v1/completions", {"prompt": ctx + cont, "max_tokens": 0, "echo": True, "logprobs": 1,
                                               "temperature": 0, "seed": 1234})
    th.check(st == 200, "loglikelihood %s %r" % (st, b))
    ch = b["choices"][0]
    lp = ch["logprobs"]
    th.check(len(lp["token_logprobs"]) == len(PROMPT) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
             "one entry per prompt token, the first null %r" % lp)
    th.check(b["usage"]["completion_tokens"] == 0 and ch["finish_reason"] == "length", "nothing generated %r" % b)
    with anepy.connect(env.raw.sock) as c:
        pt, _, _ = split(events(c, tokens=PROMPT, echo=True, prompt_only=True, logprobs=1))
    th.check(all(abs(x - e["logprob"]) < 1e-6 for x, e in zip(lp["token_logprobs"][1:], pt[1:])), "prompt values")
    # lm-eval's parse: the continuation's sum and whether it is greedy
    conts = lp["token_logprobs"][len(ctx):]
    tops = lp["top_logprobs"][len(ctx):]
    th.check(isinstance(sum(conts), float), "sum")
    greedy = all(v == max(t.values()) for v, t in zip(conts, tops))
    th.check(isinstance(greedy, bool), "is_greedy computable")
    # lm-eval's own payload: a batch of id prompts, max_tokens 1, its parse slices [ctxlen:-1]
    st, _, b = th.post(gw, "/v1/completions", {"prompt": [PROMPT, PROMPT[:7]], "max_tokens": 1, "echo": True,
                                               "logprobs": 1, "temperature": 0, "seed": 1234})
    th.check(st == 200 and len(b["choices"]) == 2, "batch %s %r" % (st, b))
    for ch, n in zip(sorted(b["choices"], key=lambda c: c["index"]), (len(PROMPT), 7)):
        v = ch["logprobs"]["token_logprobs"]
        th.check(len(v) == n + 1 and v[0] is None, "prompt and one token %r" % v)
        th.check(all(abs(x - e["logprob"]) < 1e-6 for x, e in zip(v[1:n], pt[1:n])), "the prompt's values, batched")
    # an id prompt cut inside a character: U+FFFD in the text, the token's bytes spelled out
    st, _, b = th.post(gw, "/v1/completions", {"prompt": [1, 3 + 0xE2, 403], "max_tokens": 0, "echo": True, "logprobs": 0})
    th.check(st == 200 and "\ufffd" in b["choices"][0]["text"] and b["choices"][0]["logprobs"]["tokens"][1] == "bytes:\\xe2",
             "a cut character %s %r" % (st, b))
    # a text prompt with echo: the text starts with the prompt, logprobs cover prompt and completion
    st, _, b = th.post(gw, "/v1/completions", {"prompt": "Once upon a", "max_tokens": 3, "echo": True, "logprobs": 2,
                                               "temperature": 0})
    ch = b["choices"][0]
    th.check(st == 200 and ch["text"].startswith("Once upon a") and ch["logprobs"]["token_logprobs"][0] is None
             and len(ch["logprobs"]["tokens"]) == b["usage"]["prompt_tokens"] + 3, "echo text %r" % b)
    # streamed: the chunks' entries are the whole answer's
    st, ct, evs = th.stream(gw, "/v1/completions", {"prompt": "Once upon a", "max_tokens": 3, "echo": True, "logprobs": 2,
                                                     "temperature": 0})
    th.check(st == 200 and evs[-1] == "[DONE]", "stream %s %r" % (st, evs))
    parts = [e["choices"][0] for e in evs[:-1] if e["choices"]]
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in parts:
        for k in joined:
            joined[k] += (p["logprobs"] or {}).get(k, [])
    th.check(joined == ch["logprobs"], "streamed entries %r vs %r" % (joined, ch["logprobs"]))
    th.check("".join(p["text"] for p in parts) == ch["text"], "streamed text")
    # bad values
    for bad, param in [({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"), ({"logprobs": True}, "logprobs"),
                       ({"top_logprobs": 2}, "top_logprobs"), ({"max_tokens": 0}, "max_tokens")]:
        st, _, b = th.post(gw, "/v1/completions", dict({"prompt": "x"}, **bad))
        th.check(st == 400 and th.is_error(b, "invalid_value") and b["error"]["param"] == param, "%r: %s %r" % (bad, st, b))


def t_http_chat(env):
    gw = env.gw_chat
    msgs = [{"role": "user", "content": "Say something"}]
    st, _, b = th.post(gw, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0, "logprobs": True,
                                                    "top_logprobs": 3})
    th.check(st == 200, "%s %r" % (st, b))
    content = b["choices"][0]["logprobs"]["content"]
    th.check(len(content) == b["usage"]["completion_tokens"], "one entry per token %r" % content)
    for e in content:
        th.check(sorted(e) == ["bytes", "logprob", "token", "top_logprobs"] and len(e["top_logprobs"]) == 3, "entry %r" % e)
        th.check(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] or e["token"].startswith("bytes:"), "bytes")
        th.check(all(sorted(a) == ["bytes", "logprob", "token"] for a in e["top_logprobs"]), "alternatives %r" % e)
        th.check(e["top_logprobs"][0]["logprob"] == e["logprob"], "greedy: the chosen first")
    st, _, b0 = th.post(gw, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0})
    th.check(b0["choices"][0]["logprobs"] is None, "no logprobs unasked")
    st, _, evs = th.stream(gw, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                         "logprobs": True, "top_logprobs": 3})
    got = []
    for e in evs[:-1]:
        if e["choices"] and e["choices"][0].get("logprobs"):
            got += e["choices"][0]["logprobs"]["content"]
    th.check(got == content, "streamed entries %r" % got)
    for bad, param in [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                       ({"logprobs": 2}, "logprobs")]:
        st, _, b = th.post(gw, "/v1/chat/completions", dict({"messages": msgs}, **bad))
        th.check(st == 400 and th.is_error(b, "invalid_value") and b["error"]["param"] == param, "%r: %s %r" % (bad, st, b))


def t_aneclient(env):
    import subprocess
    cl = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bin/aneclient")
    r = subprocess.run([cl, "--socket", env.raw.sock, "--raw", "-T", "0", "-n", "4", "--logprobs", "3", "--no-stdin",
                        "Once upon a"], capture_output=True, timeout=60)
    th.check(r.returncode == 0, "aneclient %r" % (r,))
    lines = r.stdout.decode().splitlines()
    th.check(len(lines) == 4, "a line per token %r" % lines)
    with anepy.connect(env.raw.sock) as c:
        _, tk, _ = split(events(c, prompt="Once upon a", raw=True, max_tokens=4, temperature=0, logprobs=3))
    for line, e in zip(lines, tk):
        tok, lp, alts = line.split("\t")
        th.check(tok == '"%s"' % e["bytes"].decode() and abs(float(lp) - e["logprob"]) < 1e-6, "%r vs %r" % (line, e))
        th.check(alts.startswith("| ") and alts.count('"') == 6, "alternatives %r" % alts)
    r = subprocess.run([cl, "--socket", env.raw.sock, "--logprobs", "21", "x"], capture_output=True, timeout=60)
    th.check(r.returncode == 2 and b"--logprobs" in r.stderr, "bad --logprobs %r" % (r,))
    r = subprocess.run([cl, "--socket", env.raw.sock, "--raw", "-T", "0", "-n", "2", "--logprobs", "1", "--json",
                        "--no-stdin", "Once"], capture_output=True, timeout=60)
    import json
    evs = [json.loads(x) for x in r.stdout.decode().splitlines()]
    th.check(len(evs) == 3 and all("logprob" in e and len(e["top_logprobs"]) == 1 for e in evs[:2]), "--json %r" % evs)


TESTS = [t_protocol_shapes, t_protocol_batched, t_protocol_bad, t_http_completions, t_http_chat, t_aneclient]


class Env:
    pass


def main():
    env = Env()
    env.tmp = tempfile.mkdtemp(prefix="aned-lp-")
    procs = []
    passed = failed = 0
    try:
        env.raw = th.Daemon(env.tmp, th.RAW_MODEL, "raw").start()
        procs.append(env.raw)
        env.chat = th.Daemon(env.tmp, th.CHAT_MODEL, "chat").start()
        procs.append(env.chat)
        env.gw_raw = th.Gateway(env.raw.sock).start()
        procs.append(env.gw_raw)
        env.gw_chat = th.Gateway(env.chat.sock).start()
        procs.append(env.gw_chat)
        for t in TESTS:
            t0 = time.time()
            try:
                t(env)
                passed += 1
                print("%-28s ok (%.2f s)" % (t.__name__, time.time() - t0))
            except Exception:   # noqa: BLE001 — every failure is reported
                failed += 1
                print("%-28s FAIL" % t.__name__)
                traceback.print_exc(file=sys.stdout)
    except Exception:   # noqa: BLE001
        failed += 1
        traceback.print_exc(file=sys.stdout)
    finally:
        for p in reversed(procs):
            try:
                p.stop()
            except Exception:   # noqa: BLE001
                pass
        shutil.rmtree(env.tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
