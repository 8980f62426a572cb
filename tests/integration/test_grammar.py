#!/usr/bin/python3
"""Grammar-constrained generation through the real bin/aned (and aned-http):
under a JSON Schema, 100 of 100 outputs validate with python3-jsonschema, at
temperature 1.0 and greedy, on the qwen2 and llama3 fixture models, with the
requests of different schemas batched together; GBNF grammars; compile
errors; regex and choice constraints (protocol, aned-http, aneclient). Ends with "N passed, M failed"."""
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import anepy  # noqa: E402
from test_protocol import Daemon, check  # noqa: E402
import test_protocol  # noqa: E402

try:
    import jsonschema
except ImportError:
    jsonschema = None

MODELS = ["tests/fixtures/models/qwen2-tiny.bf16.gguf", "tests/fixtures/models/llama3-tiny.bf16.gguf"]

SCHEMA_A = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": -5, "exclusiveMaximum": 130},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "score": {"type": "number", "exclusiveMinimum": -1.5, "maximum": 2.25},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
SCHEMA_B = {
    "type": "array",
    "prefixItems": [{"const": {"kind": "point"}}, {"type": "integer"}],
    "items": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-c]{1,4}$"}]},
    "minItems": 2, "maxItems": 4,
}


def run_batch(c, temperature, n, what):
    """n generations, 25 submitted at once (schemas alternating, batched in
    the same passes; a connection may have 32 in flight); each validated."""
    good = 0
    for base in range(0, n, 25):
        good += run_wave(c, temperature, range(base, min(n, base + 25)), what)
    print("%s: %d of %d valid" % (what, good, n))
    check(good == n, "%s: %d of %d outputs valid" % (what, good, n))


def run_wave(c, temperature, idx, what):
    ids = []
    for i in idx:
        sc = SCHEMA_A if i % 2 == 0 else SCHEMA_B
        rid = c.submit_generate("Write some JSON, number %d:" % i, max_tokens=400, temperature=temperature,
                                seed=1000 + i, json_schema=json.dumps(sc))
        ids.append((rid, sc))
    good = 0
    for rid, sc in ids:
        text, fin = [], None
        for ev in c.events(rid, timeout=300):
            if ev["type"] == "token":
                text.append(ev["text"])
            elif ev["type"] == "done":
                fin = ev.get("finish")
            elif ev["type"] == "error":
                fin = "error: " + ev.get("message", "")
        out = "".join(text)
        try:
            jsonschema.validate(json.loads(out), sc)
            ok = fin == "eos"
        except Exception as e:  # noqa: BLE001
            ok = False
            print("invalid (%s, finish %s): %r: %s" % (what, fin, out[:300], str(e)[:200]))
        good += ok
    return good


def t_schema(d, model):
    c = d.connect()
    run_batch(c, 1.0, 100, "%s temperature 1.0" % os.path.basename(model))
    run_batch(c, 0.0, 100, "%s greedy" % os.path.basename(model))


def t_gbnf(d):
    c = d.connect()
    g = open(os.path.join(ROOT, "tests/fixtures/grammars/chess.gbnf")).read()
    import re
    for seed in range(5):
        text, _, done = c.generate_text("Moves:", max_tokens=120, temperature=1.0, seed=seed, grammar=g)
        # a finish before the end leaves a prefix; a whole one matches the grammar's shape
        pat = r"1\. \S+ \S+\n(\d{1,2}\. \S+ \S+\n)+"
        check(done.get("finish") == "length" or re.fullmatch(pat, text), "chess text %r (%s)" % (text, done.get("finish")))
        check(text.startswith("1. ") or len(text) < 3, "chess starts with '1. ': %r" % text)
    # compile errors: invalid_value naming the rule and position
    for bad, want in (("root ::= foo", "rule 'foo' at 1:10"), ("root ::= \"a\"\nx ::= [a-", "rule 'x' at 2:7"),
                      ("root ::= e\ne ::= e \"+\" | \"1\"", "rule 'e' at 2:1: left recursion")):
        try:
            c.generate_text("x", max_tokens=4, grammar=bad)
            check(False, "grammar %r accepted" % bad)
        except anepy.AneError as e:
            check(e.code == "invalid_value" and want in e.message, "grammar %r: %s %s" % (bad, e.code, e.message))
    try:
        c.generate_text("x", max_tokens=4, json_schema='{"type": "strin"}')
        check(False, "bad schema accepted")
    except anepy.AneError as e:
        check(e.code == "invalid_value" and "unknown type" in e.message, "schema error: %s" % e.message)
    # json_object
    text, _, done = c.generate_text("x", max_tokens=400, temperature=1.0, seed=3, json_object=True)
    if done.get("finish") == "eos":
        check(isinstance(json.loads(text), dict), "json_object output %r" % text)


def t_http(d):
    """aned-http: response_format json_schema and json_object on both
    endpoints, grammar as an extension, errors as 400 naming the field."""
    if not os.path.exists(os.path.join(ROOT, "bin/aned-http")):
        print("notice: bin/aned-http not built; t_http skipped")
        return
    from test_http import Gateway, post
    gw = Gateway(d.sock).start()
    try:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON please"}]}),
                           ("/v1/completions", {"prompt": "JSON:"})):
            for seed in range(5):
                b = dict(body, max_tokens=400, temperature=1.0, seed=seed,
                         response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_A, "strict": True}})
                st, _, r = post(gw, path, b)
                ch = r["choices"][0] if st == 200 else {}
                out = ch.get("message", {}).get("content") if "message" in ch else ch.get("text")
                ok = st == 200 and ch.get("finish_reason") == "stop"
                if ok:
                    try:
                        jsonschema.validate(json.loads(out), SCHEMA_A)
                    except Exception as e:  # noqa: BLE001
                        ok = False
                        print("invalid: %r: %s" % (out, e))
                check(ok, "%s json_schema seed %d: %s %r" % (path, seed, st, r if st != 200 else out))
            b = dict(body, max_tokens=400, temperature=1.0, seed=7, response_format={"type": "json_object"})
            st, _, r = post(gw, path, b)
            ch = r["choices"][0] if st == 200 else {}
            out = ch.get("message", {}).get("content") if "message" in ch else ch.get("text")
            if st == 200 and ch.get("finish_reason") == "stop":
                check(isinstance(json.loads(out), dict), "%s json_object: %r" % (path, out))
            else:
                check(st == 200 and ch.get("finish_reason") == "length", "%s json_object: %s %r" % (path, st, r))
            b = dict(body, max_tokens=40, temperature=1.0, seed=1, grammar='root ::= "yes" | "no"')
            st, _, r = post(gw, path, b)
            ch = r["choices"][0] if st == 200 else {}
            out = ch.get("message", {}).get("content") if "message" in ch else ch.get("text")
            check(st == 200 and out in ("yes", "no"), "%s grammar: %s %r" % (path, st, r))
            st, _, r = post(gw, path, dict(body, grammar="root ::= nope"))
            check(st == 400 and "rule 'nope'" in r["error"]["message"], "%s bad grammar: %s %r" % (path, st, r))
            st, _, r = post(gw, path, dict(body, response_format={"type": "json_schema"}))
            check(st == 400 and r["error"]["param"] == "response_format", "%s json_schema without schema: %s %r" % (path, st, r))
    finally:
        gw.stop()


def t_regex_choice(d):
    """regex and choice constraints: through the protocol (sampled, several
    at once), aned-http's guided_regex / guided_choice on both endpoints and
    aneclient --regex / --choice; each output matched whole (re.fullmatch);
    errors named."""
    import re
    import subprocess
    c = d.connect()
    rx = r"[A-Z][a-z]{2,8} (is|was) \d{1,3}(\.\d)?!"
    labels = ["positive", "negative", "neutral"]
    ids = [(c.submit_generate("Say something:", max_tokens=60, temperature=1.0, seed=s, regex=rx), "re", s) for s in range(8)]
    ids += [(c.submit_generate("Sentiment:", max_tokens=20, temperature=1.0, seed=s, choice=labels), "ch", s) for s in range(8)]
    for rid, kind, s in ids:
        text, fin = [], None
        for ev in c.events(rid, timeout=120):
            if ev["type"] == "token":
                text.append(ev["text"])
            elif ev["type"] in ("done", "error"):
                fin = ev.get("finish") or ev.get("message")
        out = "".join(text)
        ok = re.fullmatch(rx, out) if kind == "re" else out in labels
        check(ok and fin == "eos", "%s seed %d: %r (%s)" % (kind, s, out, fin))
    for kw, code, want in ((dict(regex="(?=x)y"), "invalid_value", "offset 0"),
                           (dict(regex="a", choice=["a"]), "invalid_value", "exclude each other"),
                           (dict(choice=["a", ""]), "invalid_value", "\"choice\"[1] is empty"),
                           (dict(choice=[]), "invalid_value", "\"choice\" is empty"),
                           (dict(choice="a"), "bad_request", "\"choice\" must be an array"),
                           (dict(regex=""), "invalid_value", "\"regex\" is empty")):
        try:
            c.generate_text("x", max_tokens=4, **kw)
            check(False, "%r accepted" % kw)
        except anepy.AneError as e:
            check(e.code == code and want in e.message, "%r: %s %s" % (kw, e.code, e.message))
    c.close()
    if os.path.exists(os.path.join(ROOT, "bin/aned-http")):
        from test_http import Gateway, post
        gw = Gateway(d.sock).start()
        try:
            for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Sentiment?"}]}),
                               ("/v1/completions", {"prompt": "Sentiment:"})):
                for key, val, ok in (("guided_choice", labels, lambda o: o in labels),
                                     ("guided_regex", rx, lambda o: re.fullmatch(rx, o))):
                    st, _, r = post(gw, path, dict(body, max_tokens=60, temperature=1.0, seed=3, **{key: val}))
                    ch = r["choices"][0] if st == 200 else {}
                    out = ch.get("message", {}).get("content") if "message" in ch else ch.get("text")
                    check(st == 200 and ok(out or "") and ch.get("finish_reason") == "stop", "%s %s: %s %r" % (path, key, st, r))
                for b, param in ((dict(body, guided_regex=5), "guided_regex"), (dict(body, guided_choice=[]), "guided_choice"),
                                 (dict(body, guided_choice=["a", 1]), "guided_choice"),
                                 (dict(body, guided_regex="a", guided_choice=["a"]), "guided_regex")):
                    st, _, r = post(gw, path, b)
                    check(st == 400 and r["error"].get("param") == param, "%s %r: %s %r" % (path, b, st, r))
                st, _, r = post(gw, path, dict(body, guided_regex="a\\b"))
                check(st == 400 and "offset 1" in r["error"]["message"], "%s unsupported regex: %s %r" % (path, st, r))
        finally:
            gw.stop()
    cl = os.path.join(ROOT, "bin/aneclient")
    p = subprocess.run([cl, "--socket", d.sock, "-T", "1", "--seed", "5", "-n", "20", "--choice", "yes", "--choice", "no",
                        "Well?"], capture_output=True, timeout=60)
    check(p.returncode == 0 and p.stdout.decode().strip() in ("yes", "no"), "aneclient --choice: %r %r" % (p.stdout, p.stderr))
    p = subprocess.run([cl, "--socket", d.sock, "-T", "1", "--seed", "5", "-n", "60", "--regex", rx, "Say:"],
                       capture_output=True, timeout=60)
    check(p.returncode == 0 and re.fullmatch(rx, p.stdout.decode().rstrip("\n")), "aneclient --regex: %r %r" % (p.stdout, p.stderr))


def main():
    if jsonschema is None:
        print("notice: python3-jsonschema missing; test_grammar skipped")
        print("0 passed, 0 failed")
        return 0
    for model in MODELS:
        d = Daemon(os.path.join(ROOT, model), "grammar", ["--max-seqs", "16"])
        try:
            for t in (t_schema, t_gbnf, t_http, t_regex_choice):
                f0 = test_protocol.failed
                try:
                    t(d, model) if t is t_schema else t(d)
                except Exception:
                    check(False, "%s raised:\n%s" % (t.__name__, traceback.format_exc()))
                print("%-24s %s %s" % (t.__name__, os.path.basename(model), "ok" if test_protocol.failed == f0 else "FAIL"), flush=True)
        finally:
            d.stop()
            if test_protocol.failed:
                print("--- aned log (tail) ---\n" + d.logtext())
            d.cleanup()
    print("%d passed, %d failed" % (test_protocol.passed, test_protocol.failed))
    return 1 if test_protocol.failed else 0


if __name__ == "__main__":
    sys.exit(main())
