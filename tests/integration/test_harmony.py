#!/usr/bin/python3
"""gpt-oss's Harmony end-of-turn rule through the real bin/aned, on a model
with Harmony's special tokens and gpt-oss's chat template
(mk_harmony_model.py; uniform logits, so a grammar decides what may come):
<|end|> closes a message and generation goes on (an analysis message, then
the final one), <|return|> and <|call|> end the reply; a forced tool call
is written with the special tokens themselves (<|channel|>, <|constrain|>,
<|message|>), then ends; without tools the analysis message is reasoning
apart from the final one's text (or all text, raw). Ends with "N passed, M failed"."""
import json
import os
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_protocol import Daemon, check  # noqa: E402
import test_protocol  # noqa: E402

try:
    import jsonschema
except ImportError:
    jsonschema = None

FIXTURE = os.path.join(ROOT, "tests/fixtures/models/qwen2-tiny.bf16.gguf")
TEMPLATE = os.path.join(ROOT, "tests/fixtures/chat/templates/openai-gpt-oss-120b.jinja")
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
          "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]


def run(c, **kw):
    rid = c.request("generate", messages=MSGS, temperature=1.0, **kw)
    return list(c.events(rid, 60))


def t_harmony(d, ids):
    c = d.connect()
    check(c.info().get("tool_format") == "harmony", "tool_format harmony: %r" % c.info().get("tool_format"))
    END, START, CH, MSG, RET, CALL, CON = (ids[n] for n in ("<|end|>", "<|start|>", "<|channel|>", "<|message|>",
                                                           "<|return|>", "<|call|>", "<|constrain|>"))
    # 1. the rule, drawn at random: <|end|> may come anywhere and never ends the reply;
    # every reply that ends by itself ends at an end-of-generation token other than <|end|>
    g = "root ::= <[%d]> <[%d]> ( <[%d]> | <[%d]> | \"ab\" )*" % (END, START, END, START)
    ends, mid_end = {}, 0
    for seed in range(60):
        evs = run(c, grammar=g, max_tokens=64, seed=seed)
        toks = [e["token"] for e in evs if e["type"] == "token"]
        done = evs[-1]
        check(done.get("type") == "done" and done.get("finish") in ("eos", "length"), "seed %d: %r" % (seed, done))
        if done.get("finish") == "eos":
            check(toks and toks[-1] != END, "seed %d: ended at <|end|>: %r" % (seed, toks))
            ends[toks[-1]] = ends.get(toks[-1], 0) + 1
        mid_end += END in toks[:-1]
    print("harmony rule: replies ended at %r; %d went on past <|end|>" % (ends, mid_end))
    check(mid_end == 60, "<|end|> came first and the reply went on (%d of 60 replies)" % mid_end)
    check(ends.get(RET, 0) > 0 and ends.get(CALL, 0) > 0, "<|return|> and <|call|> end replies: %r" % ends)
    # 2. analysis, <|end|>, then the final message: one reply, reasoning apart from content
    g2 = ('root ::= <[%d]> "analysis" <[%d]> "Think." <[%d]> <[%d]> "assistant" <[%d]> "final" <[%d]> "Hi."'
          % (CH, MSG, END, START, CH, MSG))
    for seed in range(5):
        evs = run(c, grammar=g2, tools=TOOLS, max_tokens=64, seed=seed)
        text = "".join(e.get("text", "") for e in evs if e["type"] == "token")
        reason = "".join(e.get("reasoning", "") for e in evs if e["type"] == "token")
        toks = [e["token"] for e in evs if e["type"] == "token"]
        check(evs[-1].get("finish") == "eos" and text == "Hi." and reason == "Think." and END in toks
              and toks[-1] in (RET, CALL) + tuple(t for t in toks[-1:] if t not in ids.values()),
              "analysis then final: text %r reasoning %r finish %r toks %r" % (text, reason, evs[-1], toks[-6:]))
    # 2b. the same without tools: split by default (analysis = reasoning, final = text, the reply
    # still ends at <|return|>); raw: the tokens' text as generated (control tokens have none)
    for seed in range(3):
        evs = run(c, grammar=g2, max_tokens=64, seed=seed)
        raw = run(c, grammar=g2, max_tokens=64, seed=seed, reasoning="raw")
        text = "".join(e.get("text", "") for e in evs if e["type"] == "token")
        reason = "".join(e.get("reasoning", "") for e in evs if e["type"] == "token")
        toks = [e["token"] for e in evs if e["type"] == "token"]
        rtext = "".join(e.get("text", "") for e in raw if e["type"] == "token")
        check(evs[-1].get("finish") == "eos" and text == "Hi." and reason == "Think." and END in toks
              and toks == [e["token"] for e in raw if e["type"] == "token"] and rtext == "analysisThink.assistantfinalHi."
              and not any("reasoning" in e for e in raw),
              "no tools: text %r reasoning %r finish %r; raw %r" % (text, reason, evs[-1], rtext))
    # 3. a forced call: written with the special tokens, then the reply ends
    good = 0
    for seed in range(20):
        evs = run(c, tools=TOOLS, tool_choice="required", max_tokens=200, seed=seed)
        toks = [e["token"] for e in evs if e["type"] == "token"]
        calls = [e for e in evs if e["type"] == "tool_call"]
        text = "".join(e.get("text", "") for e in evs if e["type"] == "token")
        ok = (evs[-1].get("finish") == "tool_calls" and len(calls) == 1 and calls[0]["name"] == "get_weather"
              and toks[:1] == [CH] and CON in toks and MSG in toks and not text.strip())
        if ok and jsonschema:
            try:
                jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMA)
            except Exception as e:  # noqa: BLE001
                ok = False
                print("seed %d: %s" % (seed, e))
        if not ok:
            print("forced call seed %d: %r" % (seed, evs[-4:]))
        good += ok
    check(good == 20, "forced Harmony calls: %d of 20 valid, written with the special tokens" % good)
    c.close()


def main():
    tmp = tempfile.mkdtemp(prefix="aned-harmony-")
    path = os.path.join(tmp, "harmony.gguf")
    out = subprocess.run([sys.executable, os.path.join(HERE, "mk_harmony_model.py"), FIXTURE, TEMPLATE, path],
                         check=True, stdout=subprocess.PIPE).stdout.decode()
    ids = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in out.split()}
    d = Daemon(path, "harmony")
    try:
        f0 = test_protocol.failed
        try:
            t_harmony(d, ids)
        except Exception:
            check(False, "t_harmony raised:\n%s" % traceback.format_exc())
        print("%-24s %s" % ("t_harmony", "ok" if test_protocol.failed == f0 else "FAIL"), flush=True)
    finally:
        d.stop()
        if test_protocol.failed:
            print(d.logtext())
        d.cleanup()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (test_protocol.passed, test_protocol.failed))
    return 1 if test_protocol.failed else 0


if __name__ == "__main__":
    sys.exit(main())
