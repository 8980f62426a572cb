#!/usr/bin/python3
"""Reasoning apart from the answer, end to end: the real bin/aned on a model
whose greedy reply is a known thinking reply (mk_chain_model.py, qwen2-tiny's
tokenizer) under Qwen3's chat template, then bin/aned-http and bin/aneclient
in front of it. Through the protocol: `reasoning` "split" (the default for
chat) and "raw" give the same ids and logprobs, the text with or without the
<think> block; stop strings and max_tokens inside the reasoning; tools;
keep_reasoning changing the rendered prompt; bad fields named. Through
aned-http: message.reasoning_content and delta.reasoning_content chunks,
reasoning_format auto/deepseek/none, keep_reasoning, history messages with
reasoning_content, errors. Through aneclient: reasoning on standard error
when standard output is a pipe, --reasoning hide/raw, --json, and --chat's
history (the reply's content alone, its reasoning as reasoning_content).
Ends with "N passed, M failed"."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_protocol import Daemon, check, CHAT_MODEL, CLIENT  # noqa: E402
import test_protocol  # noqa: E402
from test_http import Gateway, post, stream  # noqa: E402

QWEN3 = os.path.join(ROOT, "tests/fixtures/chat/templates/Qwen-Qwen3-0.6B.jinja")
THOUGHT = "The user says hi."
ANSWER = "Hello there!"
RAW = "<think>\n%s\n</think>\n\n%s" % (THOUGHT, ANSWER)
MSGS = [{"role": "user", "content": "Hi"}]
# renders reasoning_content wherever it is given (Qwen3's own keeps it only after the last user turn)
KEEP_TPL = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}"
            "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CALL_TURN = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "reasoning_content": "The user wants the weather in Paris; I call the tool.",
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def gen(c, **kw):
    """(text, reasoning, ids, events) of one generate."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 64)
    if "prompt" not in kw and "tokens" not in kw:
        kw.setdefault("messages", MSGS)
    rid = c.request("generate", **kw)
    evs = list(c.events(rid, 60))
    toks = [e for e in evs if e["type"] == "token"]
    return ("".join(e["text"] for e in toks), "".join(e.get("reasoning", "") for e in toks),
            [e["token"] for e in toks], evs)


def t_protocol(d):
    c = d.connect()
    text, reason, ids, evs = gen(c)
    check(text == ANSWER and reason == THOUGHT and evs[-1].get("finish") == "eos",
          "messages split by default: text %r reasoning %r %r" % (text, reason, evs[-1]))
    check(all("<think>" not in e.get("text", "") for e in evs), "no marker in any text")
    check(all("reasoning" not in e or e["reasoning"] for e in evs if e["type"] == "token"),
          "reasoning only on tokens that carry some")
    rtext, rreason, rids, revs = gen(c, reasoning="raw")
    check(rtext == RAW and rreason == "" and rids == ids and revs[-1].get("finish") == "eos",
          "raw: the text as generated, the same ids: %r" % rtext)
    check(revs[-1]["usage"] == evs[-1]["usage"], "the same usage: %r vs %r" % (revs[-1]["usage"], evs[-1]["usage"]))
    stext, sreason, sids, _ = gen(c, reasoning="split")
    check((stext, sreason, sids) == (text, reason, ids), "split asked is the default")
    # logprobs: the same values either way
    _, _, _, l1 = gen(c, logprobs=3)
    _, _, _, l2 = gen(c, logprobs=3, reasoning="raw")
    lp = lambda evs: [(e["token"], e["logprob"], [t[0] for t in e["top_logprobs"]]) for e in evs if e["type"] == "token"]
    check(lp(l1) == lp(l2) and len(lp(l1)) == len(ids), "logprobs unchanged by the split")
    # a text prompt through the template splits; token ids are raw unless asked
    ptext, preason, _, _ = gen(c, prompt="Hi")
    check(ptext == ANSWER and preason == THOUGHT, "templated text prompt split: %r" % ptext)
    prompt_ids = c.tokenize("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", special=True, add_bos=False)
    ttext, _, tids, _ = gen(c, tokens=prompt_ids)
    check(ttext == RAW and tids == ids, "tokens default to raw: %r" % ttext)
    ttext, treason, _, _ = gen(c, tokens=prompt_ids, reasoning="split")
    check(ttext == ANSWER and treason == THOUGHT, "tokens with split asked: %r %r" % (ttext, treason))
    # stop strings and max_tokens act on the reply as generated
    s1 = gen(c, stop=["says"])
    s2 = gen(c, stop=["says"], reasoning="raw")
    check(s1[0] == "" and s1[1] == "The user " and s1[3][-1].get("finish") == "stop" and s1[2] == s2[2]
          and s2[0] == "<think>\nThe user ", "a stop string inside the reasoning: %r %r / %r" % (s1[0], s1[1], s2[0]))
    m1 = gen(c, max_tokens=7)
    m2 = gen(c, max_tokens=7, reasoning="raw")
    check(m1[3][-1].get("finish") == "length" and m1[0] == "" and m1[1] and m1[1] in m2[0] and m1[2] == m2[2] == ids[:7],
          "max_tokens inside the reasoning: %r %r / %r" % (m1[0], m1[1], m2[0]))
    # tools: split by default; raw leaves the block in the content
    t1 = gen(c, tools=TOOLS)
    t2 = gen(c, tools=TOOLS, reasoning="raw")
    check(t1[0] == ANSWER and t1[1] == THOUGHT and t2[0] == RAW and t2[1] == "" and t1[2] == t2[2]
          and t2[3][-1].get("finish") == "eos", "with tools: %r %r / %r" % (t1[0], t1[1], t2[0]))
    # keep_reasoning: the turn after the last user message shows its reasoning only when kept
    n = {}
    for keep in (False, True):
        _, _, _, ev = gen(c, messages=CALL_TURN, keep_reasoning=keep, max_tokens=1)
        n[keep] = ev[-1]["usage"]["prompt_tokens"]
        pos, done = c.eval(messages=CALL_TURN, keep_reasoning=keep, top=1)
        check(done["usage"]["prompt_tokens"] == n[keep], "eval renders it the same way (keep %s)" % keep)
    r_ids = c.tokenize("The user wants the weather in Paris; I call the tool.", add_bos=False)
    check(n[True] >= n[False] + len(r_ids) + 2, "keep_reasoning renders reasoning_content: %d vs %d prompt tokens" % (n[True], n[False]))
    # bad fields
    for fields, code, name in ((dict(reasoning=1), "bad_request", '"reasoning"'),
                               (dict(reasoning="think"), "invalid_value", '"reasoning"'),
                               (dict(keep_reasoning="yes"), "bad_request", '"keep_reasoning"'),
                               (dict(messages=MSGS + [{"role": "assistant", "content": "x", "reasoning_content": 5}]),
                                "bad_request", "reasoning_content")):
        fields.setdefault("messages", MSGS)
        rid = c.request("generate", **fields)
        ev = c.next_event(rid, 30)
        check(ev.get("type") == "error" and ev.get("code") == code and name in ev.get("message", ""),
              "%r: %s naming %s: %r" % (fields, code, name, ev))
    check(c.ping(), "the connection still serves")
    c.close()


def t_http(d):
    gw = Gateway(d.sock).start()
    try:
        body = {"messages": MSGS, "temperature": 0, "max_tokens": 64}
        for fmt in (None, "auto", "deepseek"):
            b = dict(body, reasoning_format=fmt) if fmt else body
            st, _, r = post(gw, "/v1/chat/completions", b)
            m = r["choices"][0]["message"] if st == 200 else {}
            check(st == 200 and m.get("content") == ANSWER and m.get("reasoning_content") == THOUGHT
                  and r["choices"][0]["finish_reason"] == "stop", "reasoning_format %s: %r" % (fmt, r))
        st, _, r = post(gw, "/v1/chat/completions", dict(body, reasoning_format="none"))
        m = r["choices"][0]["message"] if st == 200 else {}
        check(st == 200 and m.get("content") == RAW and "reasoning_content" not in m, "reasoning_format none: %r" % r)
        # streamed
        st, ct, evs = stream(gw, "/v1/chat/completions", body)
        chunks = [e for e in evs if isinstance(e, dict)]
        deltas = [ch["choices"][0]["delta"] for ch in chunks if ch.get("choices")]
        content = "".join(dl.get("content", "") for dl in deltas)
        reason = "".join(dl.get("reasoning_content", "") for dl in deltas)
        check(st == 200 and content == ANSWER and reason == THOUGHT and evs[-1] == "[DONE]",
              "stream: content %r reasoning %r" % (content, reason))
        first = next(i for i, dl in enumerate(deltas) if dl.get("reasoning_content"))
        last = max(i for i, dl in enumerate(deltas) if dl.get("reasoning_content"))
        check(deltas[0].get("role") == "assistant" and all(not dl.get("content") for dl in deltas[:last])
              and first > 0, "stream: the role, then reasoning chunks, then content")
        check(chunks[-1]["choices"][0]["finish_reason"] == "stop", "stream ends with finish_reason stop")
        st, ct, evs = stream(gw, "/v1/chat/completions", dict(body, reasoning_format="none"))
        deltas = [e["choices"][0]["delta"] for e in evs if isinstance(e, dict) and e.get("choices")]
        check("".join(dl.get("content", "") for dl in deltas) == RAW and not any("reasoning_content" in dl for dl in deltas),
              "stream with reasoning_format none: raw content")
        # history with reasoning_content; keep_reasoning changes the prompt
        n = {}
        for keep in (False, True):
            st, _, r = post(gw, "/v1/chat/completions", {"messages": CALL_TURN, "max_tokens": 1, "keep_reasoning": keep})
            check(st == 200, "history with reasoning_content accepted: %r" % r)
            n[keep] = r["usage"]["prompt_tokens"] if st == 200 else 0
        check(n[True] > n[False] + 10, "keep_reasoning through HTTP: %d vs %d prompt tokens" % (n[True], n[False]))
        # chat_template_kwargs: Qwen3's enable_thinking false writes an empty block into the prompt
        n = {}
        for kw in (None, {"enable_thinking": False}):
            st, _, r = post(gw, "/v1/chat/completions", dict(body, max_tokens=1, **({"chat_template_kwargs": kw} if kw else {})))
            n[bool(kw)] = r["usage"]["prompt_tokens"] if st == 200 else 0
        check(n[True] > n[False], "chat_template_kwargs enable_thinking false: %d vs %d prompt tokens" % (n[True], n[False]))
        for kw in ("x", [1], {"messages": []}, {"add_generation_prompt": False}):
            st, _, r = post(gw, "/v1/chat/completions", dict(body, chat_template_kwargs=kw))
            check(st == 400 and r["error"].get("param") == "chat_template_kwargs",
                  "chat_template_kwargs %r: 400 naming it: %r" % (kw, r))
        st, _, r = post(gw, "/v1/completions", {"prompt": "x", "chat_template_kwargs": {"enable_thinking": False}})
        check(st == 400 and r["error"].get("param") == "chat_template_kwargs", "chat_template_kwargs on completions: %r" % r)
        # errors
        for b, param in ((dict(body, reasoning_format="think"), "reasoning_format"),
                         (dict(body, reasoning_format=1), "reasoning_format"),
                         (dict(body, keep_reasoning="yes"), "keep_reasoning"),
                         (dict(body, messages=MSGS + [{"role": "assistant", "content": "x", "reasoning_content": ["x"]},
                                                      {"role": "user", "content": "y"}]), "messages[1].reasoning_content")):
            st, _, r = post(gw, "/v1/chat/completions", b)
            check(st == 400 and r["error"].get("param") == param, "%s: 400 naming it: %r" % (param, r))
        # completions stay raw
        st, _, r = post(gw, "/v1/completions", {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                                               "parse_special": True, "temperature": 0, "max_tokens": 64})
        check(st == 200 and r["choices"][0]["text"] == RAW, "completions are raw: %r" % r)
        st, _, r = post(gw, "/v1/completions", {"prompt": "x", "reasoning_format": "auto"})
        check(st == 400 and r["error"].get("param") == "reasoning_format", "reasoning_format on completions refused: %r" % r)
    finally:
        gw.stop()


def client(sock, *args, inp=None):
    p = subprocess.run([CLIENT, "--socket", sock, "-T", "0"] + list(args), input=inp, capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def t_client(d, dk):
    rc, out, err = client(d.sock, "Hi")
    check(rc == 0 and out == ANSWER and THOUGHT in err and "\033" not in out + err,
          "a pipe gets the answer, the reasoning goes to stderr: %r / %r" % (out, err))
    rc, out, err = client(d.sock, "--reasoning", "hide", "Hi")
    check(rc == 0 and out == ANSWER and THOUGHT not in err, "--reasoning hide: %r / %r" % (out, err))
    rc, out, err = client(d.sock, "--reasoning", "raw", "Hi")
    check(rc == 0 and out == RAW and THOUGHT not in err, "--reasoning raw: %r" % out)
    rc, out, err = client(d.sock, "--json", "Hi")
    lines = [json.loads(x) for x in out.splitlines()]
    check(rc == 0 and lines[-1].get("text") == ANSWER and lines[-1].get("reasoning") == THOUGHT
          and "".join(x.get("reasoning", "") for x in lines[:-1]) == THOUGHT, "--json: %r" % lines[-1])
    counts = {}
    for tv in ((), ("--template-vars", '{"enable_thinking": false}')):
        rc, out, err = client(d.sock, "-v", *tv, "Hi")
        c2 = re.findall(r"prompt (\d+) tokens", err)
        counts[bool(tv)] = int(c2[-1]) if rc == 0 and c2 else 0
    check(counts[True] > counts[False] > 0, "--template-vars enable_thinking false: %r" % counts)
    rc, out, err = client(d.sock, "--template-vars", "[1]", "Hi")
    check(rc == 2 and "--template-vars" in err, "--template-vars [1]: usage error: %r" % err)
    rc, out, err = client(d.sock, "--template-vars", '{"tools": []}', "Hi")
    check(rc != 0 and "template_vars" in err, "--template-vars with tools: refused by aned: %r" % err)
    rc, out, err = client(d.sock, "--reasoning", "loud", "Hi")
    check(rc == 2 and "--reasoning" in err, "--reasoning loud: usage error: %r" % err)
    # --chat keeps the content; the reasoning goes back as reasoning_content (seen by a template
    # that renders it, with --keep-reasoning)
    n = {}
    for keep in ((), ("--keep-reasoning",)):
        rc, out, err = client(dk.sock, "--chat", "-v", *keep, inp=b"Hi\nAgain\n")
        counts = [int(x) for x in re.findall(r"prompt (\d+) tokens", err)]
        check(rc == 0 and out.count(ANSWER) == 2 and "<think>" not in out and len(counts) == 2,
              "--chat %r: %r / %r" % (keep, out, err))
        n[bool(keep)] = counts[-1] if len(counts) == 2 else 0
    c = dk.connect()
    want = c.tokenize("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" + ANSWER + "<|im_end|>\n"
                      "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n", special=True, add_bos=False)
    think = c.tokenize("<think>" + THOUGHT + "</think>", special=True, add_bos=False)
    c.close()
    check(n[False] == len(want), "--chat's history holds the answer alone: %d prompt tokens, want %d" % (n[False], len(want)))
    check(abs(n[True] - (len(want) + len(think))) <= 2,
          "--chat --keep-reasoning sends the reasoning as reasoning_content: %d, want about %d" % (n[True], len(want) + len(think)))


def main():
    tmp = tempfile.mkdtemp(prefix="aned-reason-")
    d = dk = None
    try:
        model = os.path.join(tmp, "think.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "mk_chain_model.py"), CHAT_MODEL, model, RAW + "<|im_end|>"],
                       check=True, stdout=subprocess.DEVNULL)
        tpl = os.path.join(tmp, "keep.jinja")
        with open(tpl, "w") as f:
            f.write(KEEP_TPL)
        d = Daemon(model, "think", ["--chat-template", QWEN3])
        dk = Daemon(model, "keep", ["--chat-template", tpl])
        for name, fn, args in (("t_protocol", t_protocol, (d,)), ("t_http", t_http, (d,)), ("t_client", t_client, (d, dk))):
            f0 = test_protocol.failed
            try:
                fn(*args)
            except Exception:
                check(False, "%s raised:\n%s" % (name, traceback.format_exc()))
            print("%-24s %s" % (name, "ok" if test_protocol.failed == f0 else "FAIL"), flush=True)
    finally:
        for x in (d, dk):
            if x:
                x.stop()
                if test_protocol.failed:
                    print(x.logtext())
                x.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (test_protocol.passed, test_protocol.failed))
    return 1 if test_protocol.failed else 0


if __name__ == "__main__":
    sys.exit(main())
