#!/usr/bin/python3
"""Embeddings end to end on qwen2-tiny: the protocol's embed request
(PROTOCOL.md), aned --pooling and info, POST /v1/embeddings through
bin/aned-http, aneclient --embed, and bad input of each. Vectors are
compared bit for bit across the three ways in, alone and batched with other
requests. Ends with "N passed, M failed"."""
import base64
import http.client
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import anepy  # noqa: E402
import test_protocol as tp  # noqa: E402

MODEL = tp.CHAT_MODEL   # qwen2-tiny: n_embd 64
TEXTS = ["The capital of France is Paris.", "A quick brown fox jumps over the lazy dog.", "hello",
         "Embeddings map text to vectors.", "1 2 3 4 5", "Rain falls on the hills.", "x", "Why?",
         "She sells sea shells.", "Good morning!", "The end.", "Water boils at 100 C.", "ok ok ok",
         "Once upon a time", "Tokens, tokens, tokens.", "Quantum computers use qubits."]

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s" % what, flush=True)
    return cond


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def f32(v):
    return struct.unpack("<%df" % len(v), struct.pack("<%df" % len(v), *v))


def t_protocol(d):
    c = d.connect()
    info = c.info()
    check(info.get("pooling") == "last" and info.get("pooling_source") == "default",
          "info pooling: %r %r" % (info.get("pooling"), info.get("pooling_source")))
    n = info["n_embd"]
    v, done = c.embed(TEXTS[0])
    check(v is not None and len(v) == n, "one vector of n_embd floats")
    check(abs(dot(v, v) - 1) < 1e-5, "unit length: %r" % dot(v, v))
    check(done["finish"] == "length" and done["usage"]["completion_tokens"] == 0, "done: %r" % done)
    ids = c.tokenize(TEXTS[0])
    check(done["usage"]["prompt_tokens"] == len(ids), "prompt_tokens = the text's tokens")
    vt, _ = c.embed(tokens=ids)
    check(vt == v, "the same input as tokens: the same vector")
    w, _ = c.embed(TEXTS[1])
    check(dot(v, w) < 0.9999, "two texts: cosine below 1 (%r)" % dot(v, w))
    # alone, then 16 pipelined on one connection beside generate requests on
    # another: bit for bit the same
    alone = [c.embed(t)[0] for t in TEXTS]
    g = d.connect()
    gids = [g.submit_generate(t, max_tokens=24, temperature=0.7, seed=i) for i, t in enumerate(TEXTS[:4])]
    order = [(i * 7 + 3) % 16 for i in range(16)]
    rids = [c.request("embed", prompt=TEXTS[k]) for k in order]
    same = 0
    for rid, k in zip(rids, order):
        vec = None
        for ev in c.events(rid):
            if ev["type"] == "embedding":
                vec = struct.unpack("<%df" % (len(ev["embedding"]) // 4), ev["embedding"])
        same += vec == alone[k]
    check(same == 16, "%d of 16 vectors bit-identical alone and batched" % same)
    for gid in gids:
        evs = list(g.events(gid))
        check(evs[-1]["type"] == "done", "a generate beside them ended: %r" % evs[-1])
    g.close()
    # cancel: done cancelled (or its vector and done length when it was quicker)
    rid = c.request("embed", prompt=TEXTS[5] * 20)
    c.cancel(rid)
    evs = list(c.events(rid))
    kinds = [e["type"] for e in evs]
    check(kinds in (["done"], ["embedding", "done"]) and
          (evs[-1]["finish"] == "cancelled") == (kinds == ["done"]), "cancelled embed: %r" % kinds)
    c.close()
    return alone


def expect_err(c, fields, code, what, needle=None):
    rid = c.request("embed", **fields)
    ev = c.next_event(rid)
    ok = ev.get("type") == "error" and ev.get("code") == code
    if needle:
        ok = ok and needle in ev.get("message", "")
    check(ok, "%s: wanted %s, got %r" % (what, code, ev))


def t_protocol_errors(d):
    c = d.connect()
    expect_err(c, {}, "bad_request", "no input", '"prompt"')
    expect_err(c, {"prompt": "a", "tokens": [1]}, "bad_request", "prompt and tokens")
    expect_err(c, {"tokens": []}, "invalid_value", "empty tokens", '"tokens"')
    expect_err(c, {"tokens": [1, 99999999]}, "invalid_token", "token outside the vocabulary", '"tokens"[1]')
    expect_err(c, {"tokens": [1, -2]}, "invalid_value", "negative token", '"tokens"[1]')
    expect_err(c, {"prompt": 5}, "bad_request", "prompt not a string", '"prompt"')
    expect_err(c, {"special": "yes", "prompt": "a"}, "bad_request", "special not a bool", '"special"')
    expect_err(c, {"prompt": "word " * 5000}, "context", "over the context", "context of 4096")
    expect_err(c, {"tokens": [5] * 4097}, "context", "tokens over the context", "4097 tokens")
    c.send_raw(b"\x83\xa4type\xa5embed\xa2id\x0e\xa6prompt\xc4\x02\xff\xfe")   # bin prompt, not UTF-8
    ev = c.next_event(14)
    check(ev.get("code") == "invalid_utf8", "invalid UTF-8: %r" % ev)
    # the context exactly: fits (nothing is generated)
    v, done = c.embed(tokens=[5] * 4096)
    check(v is not None and done["usage"]["prompt_tokens"] == 4096, "the whole context fits")
    v, _ = c.embed("still serving")
    check(v is not None, "still serving")
    c.close()


def t_pooling_option(alone):
    d = tp.Daemon(MODEL, "mean", ["--pooling", "mean"])
    try:
        c = d.connect()
        info = c.info()
        check(info.get("pooling") == "mean" and info.get("pooling_source") == "option", "--pooling mean in info")
        v, _ = c.embed(TEXTS[0])
        check(abs(dot(v, v) - 1) < 1e-5 and v != alone[0], "mean pooling: unit length, not the last token's")
        c.close()
    finally:
        d.stop()
        d.cleanup()
    r = subprocess.run([tp.ANED, "--model", MODEL, "--pooling", "max"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=30)
    check(r.returncode == 2 and b"--pooling" in r.stderr and b"mean, cls or last" in r.stderr,
          "--pooling max refused: %r" % r.stderr)


def with_pooling_type(src, dst, value):
    """A copy of GGUF src with <arch>.pooling_type = value (uint32) added."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
    import synth_gguf as sg
    with open(src, "rb") as f:
        magic, ver, nt, nkv = sg.rd(f, "4sIQQ")
        kv = []
        for _ in range(nkv):
            k = sg.rd_str(f).decode()
            (t,) = sg.rd(f, "I")
            kv.append((k, t, sg.rd_val(f, t)))
        infos = []
        for _ in range(nt):
            name = sg.rd_str(f)
            (nd,) = sg.rd(f, "I")
            dims = sg.rd(f, "Q" * nd)
            typ, off = sg.rd(f, "IQ")
            infos.append((name, dims, typ, off))
        align = dict((k, v) for k, _, v in kv).get("general.alignment", 32)
        data_at = (f.tell() + align - 1) // align * align
        f.seek(data_at)
        data = f.read()
    arch = dict((k, v) for k, _, v in kv)["general.architecture"].decode()
    kv.append((arch + ".pooling_type", 4, value))
    h = bytearray(struct.pack("<4sIQQ", b"GGUF", ver, nt, len(kv)))
    for k, t, v in kv:
        h += sg.w_str(k) + struct.pack("<I", t) + sg.w_val(t, v)
    for name, dims, typ, off in infos:
        h += sg.w_str(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", typ, off)
    h += b"\0" * ((-len(h)) % align)
    with open(dst, "wb") as f:
        f.write(h)
        f.write(data)


def t_gguf_pooling(alone, tmp):
    """The model's own pooling_type: mean (1) taken, as --pooling mean gives;
    0 (none) the default; out of range refused at start naming the key."""
    d0 = tp.Daemon(MODEL, "opt-mean", ["--pooling", "mean"])
    try:
        c = d0.connect()
        want = c.embed(TEXTS[0])[0]
        c.close()
    finally:
        d0.stop()
        d0.cleanup()
    for value, pooling, source in ((1, "mean", "model"), (2, "cls", "model"), (0, "last", "default")):
        path = os.path.join(tmp, "pool%d.gguf" % value)
        with_pooling_type(MODEL, path, value)
        d = tp.Daemon(path, "pool%d" % value)
        try:
            c = d.connect()
            info = c.info()
            check(info.get("pooling") == pooling and info.get("pooling_source") == source,
                  "pooling_type %d: info %r %r" % (value, info.get("pooling"), info.get("pooling_source")))
            v = c.embed(TEXTS[0])[0]
            if value == 1:
                check(v == want, "the model's mean pooling = --pooling mean, bit for bit")
            if value == 0:
                check(v == alone[0], "pooling_type 0 (none): the last token, as with no key")
            c.close()
        finally:
            d.stop()
            d.cleanup()
    path = os.path.join(tmp, "pool9.gguf")
    with_pooling_type(MODEL, path, 9)
    r = subprocess.run([tp.ANED, "--model", path, "--socket", os.path.join(tmp, "p9.sock")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = r.stdout.decode(errors="replace")
    check(r.returncode != 0 and "qwen2.pooling_type" in out and "[0, 4]" in out, "pooling_type 9 refused: %r" % out[-300:])


def http_post(port, body):
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h.request("POST", "/v1/embeddings", body=json.dumps(body) if not isinstance(body, bytes) else body,
              headers={"Content-Type": "application/json", "Authorization": "Bearer sk-embed-test-0123"})
    r = h.getresponse()
    data = r.read()
    h.close()
    return r.status, json.loads(data)


def t_http(d, alone, tmp):
    key = os.path.join(tmp, "key")
    with open(key, "w") as f:
        f.write("sk-embed-test-0123\n")
    os.chmod(key, 0o600)
    gw = subprocess.Popen([tp.GW, "--socket", d.sock, "--listen", "127.0.0.1:0", "--api-key-file", key],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = gw.stdout.readline().decode().strip()
        if not check(line.startswith("aned-http listening on "), "aned-http started: %r" % line):
            return
        port = int(line.split()[3].rsplit(":", 1)[1])
        st, r = http_post(port, {"input": TEXTS[0], "model": "anything", "user": "u1"})
        check(st == 200 and r["object"] == "list" and len(r["data"]) == 1, "one string: %r" % (st,))
        if st == 200:
            e = r["data"][0]
            check(e["object"] == "embedding" and e["index"] == 0, "data entry shape")
            check(f32(e["embedding"]) == alone[0], "HTTP float = the protocol's vector, bit for bit")
            check(r["usage"]["prompt_tokens"] == r["usage"]["total_tokens"] > 0, "usage: %r" % r["usage"])
            check(isinstance(r["model"], str) and r["model"], "model named")
        st, r = http_post(port, {"input": TEXTS, "encoding_format": "base64"})
        ok = st == 200 and len(r["data"]) == 16
        if check(ok, "16 strings base64: %r" % st):
            same = 0
            for i, e in enumerate(r["data"]):
                b = base64.b64decode(e["embedding"])
                same += e["index"] == i and struct.unpack("<%df" % (len(b) // 4), b) == alone[i]
            check(same == 16, "base64 batch of 16 = each alone, in order (%d)" % same)
        # token ids: one input, and a batch
        c = d.connect()
        ids = [c.tokenize(t) for t in TEXTS[:3]]
        c.close()
        st, r = http_post(port, {"input": ids[0]})
        check(st == 200 and f32(r["data"][0]["embedding"]) == alone[0], "token ids as one input")
        st, r = http_post(port, {"input": ids})
        check(st == 200 and [f32(e["embedding"]) for e in r["data"]] == alone[:3], "arrays of token ids")
        # dimensions: the first d, scaled back to unit length
        st, r = http_post(port, {"input": TEXTS[0], "dimensions": 8})
        if check(st == 200, "dimensions 8: %r" % (r,)):
            v = r["data"][0]["embedding"]
            s = math.sqrt(sum(x * x for x in alone[0][:8]))
            check(len(v) == 8 and all(abs(a - b / s) < 1e-6 for a, b in zip(v, alone[0][:8])),
                  "dimensions: truncated and renormalised")
            check(abs(sum(x * x for x in v) - 1) < 1e-5, "dimensions: unit length")
        st, r = http_post(port, {"input": TEXTS[0], "dimensions": 64})
        check(st == 200 and f32(r["data"][0]["embedding"]) == alone[0], "dimensions = n_embd: as is")
        # bad input: 400 naming the field
        bad = [({"input": "a", "dimensions": 65}, "dimensions"), ({"input": "a", "dimensions": 0}, "dimensions"),
               ({"input": "a", "dimensions": "8"}, "dimensions"), ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
               ({}, "input"), ({"input": []}, "input"), ({"input": ""}, "input"), ({"input": ["a", 1]}, "input"),
               ({"input": [[1], "a"]}, "input"), ({"input": [1, "a"]}, "input"), ({"input": [[]]}, "input"),
               ({"input": {"a": 1}}, "input"), ({"input": [-1]}, "input"), ({"input": "a", "model": 5}, "model"),
               ({"input": "a", "user": 5}, "user"), ({"input": [[1, 99999999]]}, "input"),
               ({"input": "word " * 5000}, "input"), ({"input": ["a"] * 2049}, "input")]
        for body, param in bad:
            st, r = http_post(port, body)
            err = r.get("error", {}) if isinstance(r, dict) else {}
            check(st == 400 and err.get("param") == param and err.get("message"),
                  "bad %s: %r -> %r %r" % (param, json.dumps(body)[:60], st, err))
        st, r = http_post(port, {"input": ["a", "word " * 5000]})
        check(st == 400 and "input[1]" in r["error"]["message"] and r["error"]["code"] == "context_length_exceeded",
              "the failing input is named: %r" % r)
        st, r = http_post(port, b"{not json")
        check(st == 400, "not JSON")
        st, r = http_post(port, {"input": TEXTS[1]})
        check(st == 200 and f32(r["data"][0]["embedding"]) == alone[1], "still serving after bad input")
    finally:
        gw.terminate()
        gw.wait(10)


def t_aneclient(d, alone):
    base = [tp.CLIENT, "--socket", d.sock, "--embed"]
    r = subprocess.run(base + [TEXTS[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    check(r.returncode == 0, "aneclient --embed: %r" % r.stderr)
    if r.returncode == 0:
        v = json.loads(r.stdout)
        check(f32(v) == alone[0], "aneclient --embed prints the vector (float32 round trip)")
    r = subprocess.run(base, input=TEXTS[2].encode() + b"\n", stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    check(r.returncode == 0 and f32(json.loads(r.stdout)) == alone[2], "aneclient --embed from stdin")
    r = subprocess.run(base + ["--json", TEXTS[3]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    o = json.loads(r.stdout) if r.returncode == 0 else {}
    check(o.get("type") == "done" and f32(o.get("embedding", [])) == alone[3] and o["usage"]["prompt_tokens"] > 0,
          "aneclient --embed --json: %r" % r.stdout[:200])
    c = d.connect()
    ids = c.tokenize(TEXTS[4])
    c.close()
    r = subprocess.run(base + ["--tokens", " ".join(map(str, ids))], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=60)
    check(r.returncode == 0 and f32(json.loads(r.stdout)) == alone[4], "aneclient --embed --tokens")
    for extra, what in ((["--system", "s"], "--system"), (["--raw"], "--raw"), (["--eval"], "--eval"),
                        (["--messages", "/dev/null"], "--messages")):
        r = subprocess.run(base + extra + ["x"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        check(r.returncode == 2, "aneclient --embed %s: usage error, got %r %r" % (what, r.returncode, r.stderr))
    r = subprocess.run(base + ["--tokens", "1 99999999"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    check(r.returncode == 1 and b"invalid_token" in r.stderr, "aneclient --embed bad token: %r" % r.stderr)
    r = subprocess.run([tp.CLIENT, "--socket", d.sock, "--info", "--json"], stdout=subprocess.PIPE, timeout=30)
    o = json.loads(r.stdout)
    check(o.get("pooling") == "last" and o.get("pooling_source") == "default", "aneclient --info --json: pooling")
    r = subprocess.run([tp.CLIENT, "--socket", d.sock, "--info"], stdout=subprocess.PIPE, timeout=30)
    check(b"last pooling (default)" in r.stdout, "aneclient --info: pooling")
    r = subprocess.run([tp.CLIENT, "--help"], stdout=subprocess.PIPE, timeout=30)
    check(b"--embed" in r.stdout, "--help names --embed")


def main():
    tmp = tempfile.mkdtemp(prefix="aned-embed-")
    d = tp.Daemon(MODEL, "embed")
    alone = None
    try:
        for name, fn in (("t_protocol", lambda: t_protocol(d)), ("t_protocol_errors", lambda: t_protocol_errors(d)),
                         ("t_pooling_option", lambda: t_pooling_option(alone)),
                         ("t_gguf_pooling", lambda: t_gguf_pooling(alone, tmp)), ("t_http", lambda: t_http(d, alone, tmp)),
                         ("t_aneclient", lambda: t_aneclient(d, alone))):
            f0 = failed
            try:
                r = fn()
                if name == "t_protocol":
                    alone = r
            except Exception:
                check(False, "%s raised:\n%s" % (name, traceback.format_exc()))
            print("%-24s %s" % (name, "ok" if failed == f0 else "FAIL"), flush=True)
            if d.proc.poll() is not None:
                check(False, "aned died during %s:\n%s" % (name, d.logtext()))
                break
            if alone is None:
                break
    finally:
        d.stop()
        if failed:
            print("--- aned log (tail) ---\n" + d.logtext())
        d.cleanup()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
