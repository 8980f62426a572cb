#!/usr/bin/python3
"""tool_choice "required" and a named function through the real bin/aned
and aned-http: on qwen2-tiny with its own (Hermes) template and with the
templates of the other call syntaxes (--chat-template: Llama 3.1, Mistral
Nemo's list, Mistral Small's NAME[ARGS], gpt-oss Harmony, DeepSeek V3.1 and
R1, Functionary v3.2, Qwen3), many seeds at temperature 1.0: every reply is
calls (no text), each to an allowed function, its arguments valid under the
function's schema (python3-jsonschema), finish "tool_calls"; several calls
only where parallel_tool_calls allows them. Errors: a named function not in
tools, tool_choice with json_schema, a template without call syntax. Ends
with "N passed, M failed"."""
import json
import os
import sys
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

MODEL = os.path.join(ROOT, "tests/fixtures/models/qwen2-tiny.bf16.gguf")
TPL = os.path.join(ROOT, "tests/fixtures/chat/templates")

W_SCHEMA = {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8},
                           "days": {"type": "integer", "minimum": 1, "maximum": 14},
                           "unit": {"enum": ["c", "f"]},
                           "temp": {"type": "number", "exclusiveMinimum": -50.5, "maximum": 60}},
            "required": ["city", "days"], "additionalProperties": False}
T_SCHEMA = {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": W_SCHEMA}},
         {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": T_SCHEMA}}]
SCHEMAS = {"get_weather": W_SCHEMA, "get_time": T_SCHEMA}
MSGS = [{"role": "user", "content": "What is the weather in Paris, and the time?"}]

# (template file or None for the model's own, info tool_format, parallel calls possible)
FORMATS = [(None, "hermes", True),
           ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3", True),
           ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", True),
           ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral", True),
           ("openai-gpt-oss-120b.jinja", "harmony", False),
           ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek", True),
           ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek", True),
           ("meetkai-functionary-medium-v3.2.jinja", "functionary", True),
           ("Qwen-Qwen3-0.6B.jinja", "hermes", True)]


def one(c, seed, what, choice, parallel, only=None):
    """A generation; 1 when it is valid calls alone (one unless parallel)."""
    rid = c.request("generate", messages=MSGS, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                    max_tokens=2000 if parallel else 600, temperature=1.0, seed=seed)
    evs = list(c.events(rid, 120))
    calls = [e for e in evs if e["type"] == "tool_call"]
    text = "".join(e.get("text", "") for e in evs if e["type"] == "token")
    done = evs[-1]
    why = []
    if done.get("type") != "done":
        why.append("ended %r" % done)
    elif done.get("finish") != "tool_calls":
        why.append("finish %s" % done.get("finish"))
    if text.strip():
        why.append("text %r" % text[:200])
    if not calls:
        why.append("no call")
    if not parallel and len(calls) > 1:
        why.append("%d calls without parallel_tool_calls" % len(calls))
    for cl in calls:
        if cl["name"] not in SCHEMAS or (only and cl["name"] != only):
            why.append("call to %r" % cl["name"])
            continue
        try:
            jsonschema.validate(json.loads(cl["arguments"]), SCHEMAS[cl["name"]])
        except Exception as e:  # noqa: BLE001
            why.append("%s(%s): %s" % (cl["name"], cl["arguments"], str(e)[:160]))
    if why:
        print("%s seed %d: %s" % (what, seed, "; ".join(why)))
    return (0 if why else 1), len(calls)


def t_format(tpl, fmt, parallel_ok, n):
    extra = ["--max-seqs", "16"] + (["--chat-template", os.path.join(TPL, tpl)] if tpl else [])
    d = Daemon(MODEL, "tc", extra)
    name = tpl or "qwen2-tiny's own"
    try:
        c = d.connect()
        info = c.info()
        check(info.get("tool_format") == fmt, "%s: tool_format %r" % (name, info.get("tool_format")))
        good, multi, total = 0, 0, 0
        for i in range(n):
            choice = "required" if i % 3 else {"type": "function", "function": {"name": "get_time"}}
            only = None if i % 3 else "get_time"
            parallel = i % 2 == 1
            ok, k = one(c, 100 + i, name, choice, parallel, only)
            good += ok
            total += 1
            multi += k > 1
        print("%s: %d of %d replies are valid calls (%d with several)" % (name, good, total, multi))
        check(good == total, "%s: %d of %d replies valid calls" % (name, good, total))
        if not parallel_ok:
            check(multi == 0, "%s: one call per reply" % name)
        c.close()
    finally:
        d.stop()
        if test_protocol.failed:
            print(d.logtext())
        d.cleanup()


def t_errors_and_http():
    d = Daemon(MODEL, "tcerr")
    try:
        c = d.connect()
        for fields, code, words in (
                (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "invalid_value", ['"nope"', "tools"]),
                (dict(tool_choice="required", json_schema='{"type": "object"}'), "invalid_value", ["tool_choice", "json_schema"]),
                (dict(tool_choice="required", grammar='root ::= "x"'), "invalid_value", ["tool_choice", "grammar"])):
            rid = c.request("generate", messages=MSGS, tools=TOOLS, max_tokens=8, **fields)
            ev = c.next_event(rid, 30)
            check(ev.get("type") == "error" and ev.get("code") == code and all(w in ev.get("message", "") for w in words),
                  "%r: %s naming %r: %r" % (fields, code, words, ev))
        bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}]
        rid = c.request("generate", messages=MSGS, tools=bad, tool_choice="required", max_tokens=8)
        ev = c.next_event(rid, 30)
        check(ev.get("code") == "invalid_value" and '"tools"[0].function.parameters' in ev.get("message", ""),
              "bad parameters schema: %r" % ev)
        c.close()
        if not os.path.exists(os.path.join(ROOT, "bin/aned-http")):
            print("notice: bin/aned-http not built; HTTP part skipped")
            return
        from test_http import Gateway, post
        gw = Gateway(d.sock).start()
        try:
            good = 0
            for seed in range(12):
                choice = "required" if seed % 2 else {"type": "function", "function": {"name": "get_weather"}}
                st, _, r = post(gw, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "tool_choice": choice,
                                                             "max_tokens": 400, "temperature": 1.0, "seed": seed})
                ch = r["choices"][0] if st == 200 else {}
                msg = ch.get("message", {})
                ok = st == 200 and ch.get("finish_reason") == "tool_calls" and msg.get("tool_calls") and not msg.get("content")
                for tc in msg.get("tool_calls") or []:
                    f = tc.get("function", {})
                    try:
                        ok = ok and tc.get("type") == "function" and f["name"] in SCHEMAS
                        ok = ok and (seed % 2 or f["name"] == "get_weather")
                        jsonschema.validate(json.loads(f["arguments"]), SCHEMAS[f["name"]])
                    except Exception as e:  # noqa: BLE001
                        ok = False
                        print("http seed %d: %s" % (seed, e))
                if not ok:
                    print("http seed %d: %s %r" % (seed, st, r))
                good += bool(ok)
            check(good == 12, "aned-http: %d of 12 replies are valid tool_calls" % good)
            st, _, r = post(gw, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "tool_choice": "required",
                                                         "response_format": {"type": "json_object"}})
            check(st == 400 and "tool_choice" in r.get("error", {}).get("message", ""), "http tool_choice + response_format: %s %r" % (st, r))
            # a streamed forced call: tool_calls deltas, finish_reason tool_calls
            st, _, raw = post(gw, "/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "tool_choice": "required",
                                                           "max_tokens": 400, "temperature": 1.0, "seed": 5, "stream": True})
            body = raw.decode() if isinstance(raw, (bytes, bytearray)) else json.dumps(raw)
            check(st == 200 and '"tool_calls"' in body and '"finish_reason":"tool_calls"' in body.replace(" ", ""),
                  "http stream: %s %s" % (st, body[-400:]))
        finally:
            gw.stop()
    finally:
        d.stop()
        if test_protocol.failed:
            print(d.logtext())
        d.cleanup()
    # a template with no call syntax: tool_choice required is refused, naming it
    d = Daemon(os.path.join(ROOT, "tests/fixtures/models/llama3-tiny.bf16.gguf"), "tcplain")
    try:
        c = d.connect()
        rid = c.request("generate", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=8)
        ev = c.next_event(rid, 30)
        check(ev.get("code") == "invalid_value" and "tool_choice" in ev.get("message", ""), "plain template: %r" % ev)
        c.close()
    finally:
        d.stop()
        d.cleanup()


def main():
    if jsonschema is None:
        print("notice: python3-jsonschema missing; test_toolchoice skipped")
        print("0 passed, 0 failed")
        return 0
    n = 24
    tests = [(lambda f=f: t_format(f[0], f[1], f[2], n), f[0] or "hermes") for f in FORMATS]
    tests.append((t_errors_and_http, "errors and http"))
    for fn, name in tests:
        f0 = test_protocol.failed
        try:
            fn()
        except Exception:
            check(False, "%s raised:\n%s" % (name, traceback.format_exc()))
        print("%-48s %s" % (name, "ok" if test_protocol.failed == f0 else "FAIL"), flush=True)
    print("%d passed, %d failed" % (test_protocol.passed, test_protocol.failed))
    return 1 if test_protocol.failed else 0


if __name__ == "__main__":
    sys.exit(main())
