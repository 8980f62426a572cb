#!/usr/bin/python3
"""bin/aned against proto/PROTOCOL.md itself. The document's own tables and
examples are parsed and checked against the daemon, so an edit of one without
the other fails here:

- §7's error codes: each is provoked (a scenario per code; a code without
  one, or a scenario whose code is not in the table, fails) and the
  connection column (closed / stays / closed if closing) is checked against
  the "closing" key and what the connection then does;
- §4's event order table: each request's event sequence matches its row;
- §5's request field tables (and §3's hello table): the fields the daemon
  reads are exactly those documented, and each documented range or size
  limit holds at its edges;
- §6's event field tables: each event carries exactly the fields listed;
- §8's limits table: every row has a check, fed with the value written there;
- §3's hello and §9's whole example session are replayed and compared.

Ends with "N passed, M failed"; exits non-zero on failure."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import anepy  # noqa: E402
import msgpack  # noqa: E402

ANED = os.path.join(ROOT, "bin/aned")
DOC = os.path.join(ROOT, "proto/PROTOCOL.md")
PROTO_C = os.path.join(ROOT, "proto/proto.c")
MODEL = os.path.join(ROOT, "tests/fixtures/models/stories260K.gguf")
CHAT_MODEL = os.path.join(ROOT, "tests/fixtures/models/qwen2-tiny.bf16.gguf")
VOCAB_ONLY = os.path.join(ROOT, "tests/fixtures/tokenizers/llama.cpp/ggml-vocab-llama-spm.gguf")

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


# ---------------------------------------------------------------- the document

def read_doc():
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def section(doc, title_re):
    """Text of the first heading (## or ###) matching title_re, up to the next
    heading of the same or a higher level."""
    lines = doc.split("\n")
    for i, ln in enumerate(lines):
        m = re.match(r"^(#{2,3}) (.*)$", ln)
        if m and re.search(title_re, m.group(2)):
            level = len(m.group(1))
            out = []
            for ln2 in lines[i + 1:]:
                m2 = re.match(r"^(#{2,3}) ", ln2)
                if m2 and len(m2.group(1)) <= level:
                    break
                out.append(ln2)
            return "\n".join(out)
    raise KeyError("PROTOCOL.md has no heading matching %r" % title_re)


def split_row(line):
    """Cells of a table row; a | inside `code` does not split."""
    cells, cur, code = [], [], False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    cells.append("".join(cur).strip())
    return cells


def tables(text):
    """Every table in text: a list of rows (the header first) of cells."""
    out, cur = [], None
    for ln in text.split("\n"):
        if ln.startswith("|"):
            if re.match(r"^\|[\s\-|]+\|?$", ln):
                continue   # the separator row
            if cur is None:
                cur = []
                out.append(cur)
            cur.append(split_row(ln))
        else:
            cur = None
    return out


def table_with(text, first_header):
    for t in tables(text):
        if t and t[0][0].lower() == first_header:
            return t
    raise KeyError("no table headed %r" % first_header)


def unquote(s):
    return s.strip().strip("`").strip()


def number(s):
    """A number as the document writes it: 131072, 2^31−1, 2^64−1, 0.5."""
    s = s.replace("−", "-").strip()
    m = re.match(r"^2\^(\d+)(?:-(\d+))?$", s)
    if m:
        return 2 ** int(m.group(1)) - int(m.group(2) or 0)
    return float(s) if "." in s else int(s)


def range_of(text):
    """(lo, hi, lo_open) of a field's range text, or None."""
    m = re.search(r"greater than (\d+), at most (\d+)", text)
    if m:
        return number(m.group(1)), number(m.group(2)), True
    m = re.search(r"(?<![\w.])(\d+(?:\.\d+)?)\.\.(2\^\d+(?:[−-]\d+)?|\d+(?:\.\d+)?)", text)
    if m:
        return number(m.group(1)), number(m.group(2)), False
    return None


# ---------------------------------------------------------------- daemons

class Daemon:
    def __init__(self, model, tag, extra=(), dir_mode=None):
        self.dir = tempfile.mkdtemp(prefix="aned-conf-")
        if dir_mode is not None:
            os.chmod(self.dir, dir_mode)
        self.sock = os.path.join(self.dir, "%s.sock" % tag)
        self.log = open(os.path.join(self.dir, "aned.log"), "w+")
        self.proc = subprocess.Popen([ANED, "--model", model, "--socket", self.sock] + list(extra),
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(self.sock):
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(self.sock)
                    s.close()
                    return
                except OSError:
                    pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("aned did not come up on %s:\n%s" % (self.sock, self.logtext()))

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def connect(self, hello=True, timeout=30.0):
        return anepy.connect(self.sock, hello=hello, timeout=timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self.log.close()
        except OSError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def events_until_terminal(c, id, timeout=60):
    out = []
    for ev in c.events(id, timeout=timeout):
        out.append(ev)
    return out


def first_error(c, id, timeout=60):
    """The error ending request id, or None when it ended otherwise."""
    evs = events_until_terminal(c, id, timeout)
    return evs[-1] if evs and evs[-1].get("type") == "error" else None


def names_field(ev, field):
    return ev is not None and ('"%s"' % field) in ev.get("message", "")


def serves(c):
    try:
        return c.ping()
    except Exception:
        return False


# ---------------------------------------------------------------- §7 error codes

def sc_fresh(env, d=None):
    return (d or env.main).connect()


def scen_malformed(env):
    c = sc_fresh(env)
    c.send_raw(b"\xc1")
    return [(c, c.next_event(0), None)]


def scen_too_large(env):
    out = []
    # a message over 1 MiB, written in full (a client still writing must not meet EPIPE)
    c = sc_fresh(env)
    big = msgpack.packb({"type": "tokenize", "id": 1, "text": "a" * (3 << 20)})
    try:
        c.send_raw(big)
        sent = True
    except OSError as e:
        sent = False
        check(False, "a 3 MiB message is read to its end, not cut off: %r" % e)
    if sent:
        out.append((c, c.next_event(0), None))
    # a field over its limit: tokens
    c = sc_fresh(env)
    id = c.request("generate", tokens=[1] * 131073)
    out.append((c, c.next_event(id), "generate"))
    # hello's client over 256 bytes: the hello's id (0), the handshake goes on
    c = env.main.connect(hello=False)
    c.send({"type": "hello", "id": 0, "version": 1, "client": "x" * 300})
    ev = c.recv()
    out.append((c, ev, "hello"))
    c.send({"type": "hello", "id": 0, "version": 1, "client": "x"})
    check(c.recv().get("type") == "hello", "a corrected hello after a refused one is answered")
    return out


def scen_too_deep(env):
    c = sc_fresh(env)
    v = 1
    for _ in range(9):
        v = [v]
    c.send({"type": "ping", "id": 1, "x": v})
    return [(c, c.next_event(0), None)]


def scen_bad_request(env):
    c = sc_fresh(env)
    id = c.request("generate", max_tokens=1)
    return [(c, c.next_event(id), "generate")]


def scen_unknown_type(env):
    c = sc_fresh(env)
    c.send({"type": "frobnicate", "id": 5})
    return [(c, c.next_event(5), None)]


def scen_version(env):
    c = env.main.connect(hello=False)
    c.send({"type": "hello", "id": 9, "version": 2})
    ev = c.recv()
    check(ev.get("id") == 9, "version error carries the hello's id: %r" % ev)
    return [(c, ev, "hello")]


def scen_handshake(env):
    c = env.main.connect(hello=False)
    c.send({"type": "ping", "id": 4})
    ev = c.recv()
    out = [(c, ev, "ping")]
    c.hello()
    c2 = env.small.connect(hello=False)
    t0 = time.monotonic()
    ev2 = c2.recv(timeout=10)
    check(time.monotonic() - t0 < 5, "the hello deadline (--hello-timeout 1) closes in time")
    out.append((c2, ev2, None))
    return out


def scen_duplicate_id(env):
    c = sc_fresh(env)
    c.request("generate", id=5, tokens=[1], raw=True, max_tokens=0, temperature=1.0)
    c.request("generate", id=5, tokens=[1], raw=True, max_tokens=1)
    ev = None
    for e in c.events(5):
        if e.get("type") == "error":
            ev = e
            break
    c.cancel(5)
    events_until_terminal(c, 5)
    return [(c, ev, "generate")]


def scen_invalid_value(env):
    c = sc_fresh(env)
    id = c.request("generate", prompt="x", temperature=-1)
    return [(c, c.next_event(id), "generate")]


def scen_invalid_token(env):
    c = sc_fresh(env)
    id = c.request("generate", tokens=[1, env.n_vocab], raw=True)
    return [(c, c.next_event(id), "generate")]


def scen_invalid_utf8(env):
    c = sc_fresh(env)
    id = c.request("generate", prompt=b"\xff")
    return [(c, c.next_event(id), "generate")]


def scen_context(env):
    c = sc_fresh(env)
    id = c.request("generate", tokens=[1] * (env.n_ctx + 1), raw=True)
    return [(c, c.next_event(id), "generate")]


def scen_busy(env):
    out = []
    c = sc_fresh(env)
    n = env.max_inflight
    ids = [c.request("generate", tokens=[1], raw=True, max_tokens=0, temperature=1.0) for _ in range(n + 1)]
    ev = None
    for e in c.events(ids[-1]):
        ev = e
    for i in ids[:-1]:
        c.cancel(i)
    for i in ids[:-1]:
        events_until_terminal(c, i)
    out.append((c, ev, "generate"))
    # --max-clients 2: a third connection
    a, b = env.small.connect(), env.small.connect()
    c3 = env.small.connect(hello=False)
    out.append((c3, c3.recv(timeout=10), None))
    a.close()
    b.close()
    time.sleep(0.3)
    # --idle-timeout 1: a ready connection with nothing in flight
    c4 = env.small.connect()
    out.append((c4, c4.recv(timeout=10), None))
    return out


def scen_denied(env):
    if os.geteuid() != 0:
        print("    (denied: not root, cannot connect as another user: skipped)")
        return []
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(env.small.sock)
            u = msgpack.Unpacker(raw=False)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            u.feed(data)
            evs = list(u)
            os.write(w, json.dumps({"events": evs, "closed": True}).encode())
        except Exception as e:
            os.write(w, json.dumps({"exception": repr(e)}).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    if not check("events" in got and got["events"], "denied peer got an event: %r" % got):
        return []
    return [(None, got["events"][0], None, got.get("closed"))]


def scen_no_model(env):
    c = env.vocab.connect()
    id = c.request("generate", prompt="hi", max_tokens=2)
    return [(c, c.next_event(id), "generate")]


def scen_model_changed(env):
    """A daemon of its own on a copy of the model, which is then rewritten in place."""
    tmp = tempfile.mkdtemp(prefix="aned-conf-model-")
    path = os.path.join(tmp, "model.gguf")
    shutil.copyfile(MODEL, path)
    d = Daemon(path, "changed")
    env.daemons.append(d)   # stopped with the others, after the checks on c
    try:
        c = d.connect()
        with open(path, "r+b") as f:   # in place, as cp over it does
            f.truncate(4096)
        id = c.request("generate", tokens=[1], raw=True, max_tokens=2)
        ev = c.next_event(id)
        check(serves(c), "ping is still answered after model_changed")
        return [(c, ev, "generate")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scen_shutting_down(env):
    """Last: stops the main daemon."""
    c = env.main.connect()
    id = c.request("generate", tokens=[1], raw=True, max_tokens=0, temperature=1.0)
    check(c.next_event(id).get("type") == "token", "generation runs before SIGTERM")
    env.main.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while os.path.exists(env.main.sock) and time.monotonic() < deadline:
        time.sleep(0.01)
    id2 = c.request("generate", prompt="x", max_tokens=2)
    ev = c.next_event(id2)
    out = [(None, ev, "generate", False)]
    evs = events_until_terminal(c, id, timeout=30)
    check(evs and evs[-1].get("type") == "done", "the running request ends with done: %r" % (evs[-1:],))
    last = c.recv(timeout=10)
    out.append((c, last, None))
    return out


SCENARIOS = {
    "malformed": scen_malformed, "too_large": scen_too_large, "too_deep": scen_too_deep,
    "bad_request": scen_bad_request, "unknown_type": scen_unknown_type, "version": scen_version,
    "handshake": scen_handshake, "duplicate_id": scen_duplicate_id, "invalid_value": scen_invalid_value,
    "invalid_token": scen_invalid_token, "invalid_utf8": scen_invalid_utf8, "context": scen_context,
    "busy": scen_busy, "denied": scen_denied, "no_model": scen_no_model, "model_changed": scen_model_changed,
    "shutting_down": scen_shutting_down,
}
# no request provokes it (out of memory, a bug)
UNPROVOKABLE = {"internal"}


def check_error_event(ev, code, type_name, what):
    ok = isinstance(ev, dict) and ev.get("type") == "error" and ev.get("code") == code
    check(ok, "%s: an error %s, got %r" % (what, code, ev))
    if not ok:
        return False
    check(isinstance(ev.get("message"), str) and ev["message"], "%s: a message" % what)
    extra = set(ev) - {"type", "id", "code", "message", "closing"}
    check(not extra, "%s: no undocumented keys: %r" % (what, extra))
    check(ev.get("closing", True) is True, "%s: closing is absent or true: %r" % (what, ev))
    if type_name and ev.get("id") != 0:
        check(ev["message"].startswith(type_name + ": "), "%s: the message starts with '%s: ': %r"
              % (what, type_name, ev["message"]))
    return True


def t_error_codes(env, doc):
    rows = table_with(section(doc, r"^7\. "), "code")
    codes = {}
    for r in rows[1:]:
        codes[unquote(r[0])] = r[2].strip().lower()
    check(len(codes) >= 17, "§7 lists the codes: %r" % sorted(codes))
    for code, conn in codes.items():
        check(conn in ("closed", "stays", "closed if closing"), "§7 %s: connection column %r" % (code, conn))
    # what proto.c can name is what §7 lists
    with open(PROTO_C) as f:
        src = f.read()
    names = set(re.findall(r'\[PROTO_E_\w+\] = "(\w+)"', src))
    check(names == set(codes), "proto.c's error names %r = §7's %r" % (sorted(names), sorted(codes)))
    order = [c for c in codes if c != "shutting_down"] + ["shutting_down"]
    for code in order:
        if code in UNPROVOKABLE:
            print("    (%s: no request provokes it: not checked)" % code)
            continue
        if not check(code in SCENARIOS, "§7 code %s has a scenario here" % code):
            continue
        try:
            results = SCENARIOS[code](env)
        except Exception:
            check(False, "scenario %s raised:\n%s" % (code, traceback.format_exc()))
            continue
        kinds = set()
        for res in results:
            c, ev, tn = res[0], res[1], res[2]
            what = "§7 %s (%s)" % (code, "closing" if isinstance(ev, dict) and ev.get("closing") else "stays")
            if not check_error_event(ev, code, tn, what):
                continue
            closing = ev.get("closing") is True
            kinds.add(closing)
            conn = codes[code]
            if conn == "closed":
                check(closing, "%s: the column says closed: closing true: %r" % (what, ev))
            elif conn == "stays":
                check(not closing, "%s: the column says stays: no closing: %r" % (what, ev))
            if len(res) > 3:
                closed = res[3]
            elif c is None:
                closed = None
            elif closing:
                closed = c.wait_closed(10)
            else:
                closed = not serves(c)
            if closed is not None:
                check(closed == closing, "%s: closed %r, as closing says" % (what, closed))
            if c is not None:
                c.close()
        if codes[code] == "closed if closing" and results:
            check(kinds == {True, False}, "§7 %s: both ways (closing and not) were seen: %r" % (code, kinds))
    for code in SCENARIOS:
        check(code in codes, "scenario %s is a code of §7" % code)


# ---------------------------------------------------------------- §4 event order

def order_regex(cell):
    alts = []
    for alt in re.split(r"\s+—\s+or\s+", cell.strip()):
        if alt.strip() == "none":
            alts.append("")
            continue
        parts = []
        for item in re.split(r"\s+then\s+", alt.strip()):
            m = re.match(r"^`(\w+)`(\*?)$", item.strip())
            if not m:
                raise ValueError("event order item %r" % item)
            parts.append("(?:%s )%s" % (m.group(1), m.group(2)))
        alts.append("".join(parts))
    return re.compile("^(?:%s)$" % "|".join(alts))


def run_seq(c, id):
    return " ".join(e["type"] for e in events_until_terminal(c, id)) + " "


def ord_generate(env, c):
    ok = run_seq(c, c.request("generate", tokens=[1], raw=True, max_tokens=3, temperature=0))
    bad = run_seq(c, c.request("generate", prompt="x", temperature=-1))
    return [ok, bad]


def ord_eval(env, c):
    return [run_seq(c, c.request("eval", tokens=[1, 403], top=2)), run_seq(c, c.request("eval", tokens=[1], top=0))]


def ord_embed(env, c):
    return [run_seq(c, c.request("embed", tokens=[1, 403])), run_seq(c, c.request("embed", tokens=[]))]


def ord_tokenize(env, c):
    return [run_seq(c, c.request("tokenize", text="Lily")), run_seq(c, c.request("tokenize", text=b"\xff"))]


def ord_detokenize(env, c):
    return [run_seq(c, c.request("detokenize", tokens=[1, 403])),
            run_seq(c, c.request("detokenize", tokens=[env.n_vocab]))]


def ord_info(env, c):
    c2 = env.main.connect(hello=False)
    c2.send({"type": "info", "id": 3})
    before = c2.recv()["type"] + " "
    c2.close()
    return [run_seq(c, c.request("info")), before]


def ord_ping(env, c):
    c.request("generate", id=77, tokens=[1], raw=True, max_tokens=0, temperature=1.0)
    c.send({"type": "ping", "id": 77})
    dup = None
    for ev in c.events(77):
        if ev["type"] == "error":
            dup = ev["type"] + " "
            break
    c.cancel(77)
    events_until_terminal(c, 77)
    return [run_seq(c, c.request("ping")), dup or "none "]


def ord_cancel(env, c):
    c.cancel(4242)
    pid = c.request("ping")
    ev = c.recv()
    return ["" if ev.get("id") == pid and ev["type"] == "pong" else ev["type"] + " "]


ORDER = {"generate": ord_generate, "eval": ord_eval, "embed": ord_embed, "tokenize": ord_tokenize, "detokenize": ord_detokenize,
         "info": ord_info, "ping": ord_ping, "cancel": ord_cancel}


def t_event_order(env, doc):
    rows = table_with(section(doc, r"^Event order"), "request")
    c = env.main.connect()
    seen = set()
    for r in rows[1:]:
        req, cell, term = r[0], r[1], r[2]
        seen.add(req)
        if not check(req in ORDER, "§4 event order row %s has a check here" % req):
            continue
        rx = order_regex(cell)
        terms = {t.strip() for t in term.split("/")} - {"—"}
        for seq in ORDER[req](env, c):
            check(rx.match(seq.rstrip() + " " if seq else ""), "§4 %s: events %r match %r" % (req, seq, cell))
            if seq.strip():
                check(seq.split()[-1] in terms, "§4 %s: terminal %r is one of %r" % (req, seq.split()[-1], terms))
    for req in ORDER:
        check(req in seen, "§4 event order table has a row for %s" % req)
    c.close()


# ---------------------------------------------------------------- §5 request fields

def doc_fields(doc):
    """{request type: {field: (type, range text)}} from §3 and §5."""
    out = {}
    hello = table_with(section(doc, r"^3\. "), "field")
    out["hello"] = {unquote(r[0]): (r[1], r[-1]) for r in hello[1:] if unquote(r[0]) != "id"}
    sec5 = section(doc, r"^5\. ")
    for req in ("generate", "eval", "tokenize", "detokenize", "cancel", "info", "ping"):
        text = section(sec5, r"^%s$" % req)
        fields = {}
        try:
            t = table_with(text, "field")
        except KeyError:
            t = None
        if t:
            for r in t[1:]:
                for name in r[0].split("/"):
                    fields[unquote(name)] = (r[1], r[-1])
        out[req] = fields
    # "as for generate" rows take generate's type and range
    for req, fields in out.items():
        for name, (ty, rng) in list(fields.items()):
            if "as for generate" in rng and name in out["generate"]:
                fields[name] = out["generate"][name]
    return out


BASE = {"generate": {"prompt": "x", "raw": True, "max_tokens": 1}, "eval": {"tokens": [1]},
        "tokenize": {"text": "x"}, "detokenize": {"tokens": [1]}, "info": {}, "ping": {}, "cancel": {}}
WRONG = {"x": 1}   # a map: the wrong type for every field


def knows(env, d, req, field, ty=None):
    """Whether the daemon reads field in req (a map there, or a string for a
    field that takes a map, is refused naming it)."""
    wrong = "x" if ty == "map" else WRONG
    if req == "hello":
        c = d.connect(hello=False)
        msg = {"type": "hello", "id": 0, "version": 1}
        msg[field] = wrong
        c.send(msg)
        ev = c.recv()
        c.close()
        return ev.get("type") == "error" and ev.get("code") == "bad_request" and names_field(ev, field)
    c = d.connect()
    try:
        msg = dict(BASE[req])
        msg[field] = wrong
        id = c.request(req, **msg)
        if req == "cancel":
            pid = c.request("ping")
            got = False
            while True:
                ev = c.recv()
                if ev.get("type") == "pong" and ev.get("id") == pid:
                    return got
                if ev.get("type") == "error" and ev.get("code") == "bad_request" and names_field(ev, field):
                    got = True
        evs = events_until_terminal(c, id)
        ev = evs[-1]
        return ev.get("type") == "error" and ev.get("code") == "bad_request" and names_field(ev, field)
    finally:
        c.close()


def accepted_field(ev, field):
    """The request went through its field's checks (an error, if any, is not about it)."""
    return ev.get("type") != "error" or not names_field(ev, field)


def try_field(d, req, field, value, base=None):
    c = d.connect()
    try:
        msg = dict(BASE[req] if base is None else base)
        if field in ("prompt", "tokens", "messages"):   # exactly one of them
            for other in ("prompt", "tokens", "messages"):
                msg.pop(other, None)
        msg[field] = value
        if req == "generate" and field not in ("max_tokens",):
            msg.setdefault("max_tokens", 1)
        id = c.request(req, **msg)
        if req in ("generate", "eval"):
            c.cancel(id)   # max_tokens 0 or 1048576 would run to the context's end
        return events_until_terminal(c, id, timeout=120)[-1]
    finally:
        c.close()


def check_range(env, d, req, field, ty, rng):
    what = "§5 %s.%s (%s)" % (req, field, rng[:60])
    ty = ty.strip()
    if field == "stop":
        m = re.search(r"at most (\d+) strings of (\d+)\.\.(\d+) bytes", rng)
        if not check(m, "%s: stop's limits parse" % what):
            return
        n, lo, hi = (int(g) for g in m.groups())
        ev = try_field(d, req, "stop", ["s"] * (n + 1))
        check(ev.get("code") == "too_large" and names_field(ev, "stop"), "%s: %d strings: %r" % (what, n + 1, ev))
        ev = try_field(d, req, "stop", ["s" * hi] * n)
        check(accepted_field(ev, "stop"), "%s: %d strings of %d bytes: %r" % (what, n, hi, ev))
        ev = try_field(d, req, "stop", ["s" * (hi + 1)])
        check(ev.get("code") == "too_large" and names_field(ev, "stop"), "%s: %d bytes: %r" % (what, hi + 1, ev))
        if lo >= 1:
            ev = try_field(d, req, "stop", [""])
            check(ev.get("code") == "invalid_value", "%s: an empty string: %r" % (what, ev))
        return
    m = re.search(r"at most (\d+) bytes", rng)
    if ty == "str" and m:
        n = int(m.group(1))
        filler = ("ab " * (n // 3 + 2))[:n]
        base = None
        if field == "system":
            base = {"prompt": "x", "max_tokens": 1}   # placed by the chat template: not raw
        ev = try_field(d, req, field, filler + "c", base)
        check(ev.get("code") == "too_large" and names_field(ev, field), "%s: %d bytes: %r" % (what, n + 1, ev))
        ev = try_field(d, req, field, filler, base)
        check(accepted_field(ev, field), "%s: %d bytes: %r" % (what, n, ev))
        return
    r = range_of(rng)
    if r is None:
        return
    lo, hi, lo_open = r
    if ty.startswith("["):   # a count of elements
        if field == "messages":
            one = {"role": "user", "content": "hi"}
            mk = lambda k: [one] * k   # noqa: E731
            base = {"max_tokens": 1}
        else:
            mk = (lambda k: ["a"] * k) if ty == "[str]" else (lambda k: [1] * k)   # noqa: E731
            base = dict(BASE[req])
            base.pop("tokens", None)
            if req == "generate":
                base = {"raw": True, "max_tokens": 1}
        ev = try_field(d, req, field, mk(hi + 1), base)
        check(ev.get("code") == "too_large" and names_field(ev, field), "%s: %d entries: %r" % (what, hi + 1, ev))
        ev = try_field(d, req, field, mk(hi), base)
        check(accepted_field(ev, field), "%s: %d entries: %r" % (what, hi, ev))
        if lo >= 1:
            ev = try_field(d, req, field, mk(lo - 1), base)
            check(ev.get("code") == "invalid_value" and names_field(ev, field),
                  "%s: %d entries: %r" % (what, lo - 1, ev))
        return
    isfloat = ty == "float"
    step = 0.01 if isfloat else 1
    over = float(hi) + step if isfloat or hi >= 2 ** 63 else hi + 1
    under = lo if lo_open else lo - step
    for v in (over, under):
        ev = try_field(d, req, field, v)
        check(ev.get("code") == "invalid_value" and names_field(ev, field), "%s: %r refused: %r" % (what, v, ev))
    for v in ((hi,) if lo_open else (lo, hi)):
        if isfloat:
            v = float(v)
        ev = try_field(d, req, field, v)
        check(accepted_field(ev, field), "%s: %r accepted: %r" % (what, v, ev))


def t_request_fields(env, doc):
    fields = doc_fields(doc)
    with open(PROTO_C) as f:
        src = f.read()
    candidates = set(re.findall(r'key_is\(k, "(\w+)"\)', src))
    for fs in fields.values():
        candidates |= set(fs)
    candidates -= {"type", "id"}
    d = env.chat   # a model with a chat template: "system" and "messages" apply
    for req, documented in fields.items():
        known = {f for f in sorted(candidates) if knows(env, d, req, f, documented.get(f, (None,))[0])}
        check(known == set(documented), "§5 %s: the daemon reads %r, the document lists %r"
              % (req, sorted(known), sorted(documented)))
    for req, documented in fields.items():
        for field, (ty, rng) in sorted(documented.items()):
            if req == "hello":
                continue   # §8's checks (client name) and §3's example cover it
            try:
                check_range(env, d, req, field, ty, rng)
            except Exception:
                check(False, "§5 %s.%s raised:\n%s" % (req, field, traceback.format_exc()))


# ---------------------------------------------------------------- §6 event fields

def t_event_fields(env, doc):
    c = env.main.connect()
    got = {}
    gid = c.request("generate", tokens=[1], raw=True, max_tokens=2, temperature=0)
    for ev in events_until_terminal(c, gid):
        got.setdefault(ev["type"], ev)
    for ev in events_until_terminal(c, c.request("eval", tokens=[1, 403], top=2)):
        got.setdefault(ev["type"], ev)
    got["info"] = c.info()
    got["error"] = first_error(c, c.request("generate", prompt=5))
    got["pong"] = c.result(c.request("ping"))
    got["tokens"] = c.result(c.request("tokenize", text="Lily"))
    got["text"] = c.result(c.request("detokenize", tokens=[1, 403]))
    c.close()
    sec6 = section(doc, r"^6\. ")
    for name in ("token", "logits", "done", "error", "info"):
        t = table_with(section(sec6, r"^%s( \(|$)" % name), "field")
        want, nested = set(), {}
        for r in t[1:]:
            for f in r[0].split(","):
                f = unquote(f)
                if "." in f:
                    top, sub = f.split(".", 1)
                    want.add(top)
                    nested.setdefault(top, set()).add(sub)
                else:
                    want.add(f)
        ev = got.get(name)
        if not check(ev is not None, "§6 %s: an event to compare" % name):
            continue
        have = set(ev) - {"type", "id"}
        if name == "error":
            want_now = want - {"closing"}   # present only before a close
            check(have == want_now, "§6 error: keys %r, documented %r (closing only when closing)"
                  % (sorted(have), sorted(want)))
        else:
            check(have == want, "§6 %s: keys %r, documented %r" % (name, sorted(have), sorted(want)))
        for top, subs in nested.items():
            check(isinstance(ev.get(top), dict) and set(ev[top]) == subs,
                  "§6 %s.%s: keys %r, documented %r" % (name, top, sorted(ev.get(top) or {}), sorted(subs)))
    for name, key in (("tokens", "tokens"), ("text", "text")):
        text = section(sec6, r"^%s \(" % name)
        check("`%s`" % key in text and set(got[name]) == {"type", "id", key},
              "§6 %s: carries %s alone: %r" % (name, key, sorted(got[name])))
    text = section(sec6, r"^pong$")
    check("No fields besides" in text and set(got["pong"]) == {"type", "id"}, "§6 pong: %r" % got["pong"])


# ---------------------------------------------------------------- §8 limits

def padded_ping(size, id=1):
    """A ping of exactly size bytes (an unknown key pads it)."""
    for pad in range(max(0, size - 64), size):
        b = msgpack.packb({"type": "ping", "id": id, "pad": "x" * pad})
        if len(b) == size:
            return b
    raise ValueError("cannot pad a ping to %d bytes" % size)


def lim_message(env, v):
    n = int(v.split()[0])
    c = env.main.connect()
    c.send_raw(padded_ping(n))
    check(c.recv().get("type") == "pong", "§8 a message of %d bytes is taken" % n)
    c.send_raw(padded_ping(n + 1))
    ev = c.recv()
    check(ev.get("code") == "too_large" and ev.get("closing") is True, "§8 %d bytes: too_large: %r" % (n + 1, ev))
    c.close()


def lim_depth(env, v):
    n = int(v)
    c = env.main.connect()
    x = 1
    for _ in range(n - 1):
        x = [x]
    c.send({"type": "ping", "id": 1, "x": x})
    check(c.recv().get("type") == "pong", "§8 nesting %d is taken" % n)
    c.send({"type": "ping", "id": 2, "x": [x]})
    ev = c.recv()
    check(ev.get("code") == "too_deep" and ev.get("closing") is True, "§8 nesting %d: too_deep: %r" % (n + 1, ev))
    c.close()


def lim_text(env, v):
    n = int(v.split()[0])
    filler = ("ab " * (n // 3 + 2))[:n]
    ev = try_field(env.main, "tokenize", "text", filler)
    check(accepted_field(ev, "text"), "§8 tokenize text of %d bytes: %r" % (n, ev))
    ev = try_field(env.main, "tokenize", "text", filler + "x")
    check(ev.get("code") == "too_large" and names_field(ev, "text"), "§8 %d bytes: %r" % (n + 1, ev))


def lim_messages(env, v):
    m = re.match(r"(\d+)\.\.(\d+) entries; role (\d+)\.\.(\d+) bytes; contents (\d+) bytes in all", v)
    if not check(m, "§8 messages row parses: %r" % v):
        return
    lo, hi, rlo, rhi, total = (int(g) for g in m.groups())
    d = env.chat
    ev = try_field(d, "generate", "messages", [{"role": "user", "content": "x"}] * (hi + 1), {"max_tokens": 1})
    check(ev.get("code") == "too_large", "§8 %d messages: %r" % (hi + 1, ev))
    ev = try_field(d, "generate", "messages", [{"role": "u" * (rhi + 1), "content": "x"}], {"max_tokens": 1})
    check(ev.get("code") == "too_large" and names_field(ev, "role"), "§8 role of %d bytes: %r" % (rhi + 1, ev))
    half = total // 2
    msgs = [{"role": "user", "content": "a " * (half // 2)}, {"role": "user", "content": "b" * (total - half + 1)}]
    ev = try_field(d, "generate", "messages", msgs, {"max_tokens": 1})
    check(ev.get("code") == "too_large" and names_field(ev, "messages"), "§8 contents of %d bytes: %r" % (total + 1, ev))


def lim_ids(env, v):
    n = int(v)
    ev = try_field(env.main, "detokenize", "tokens", [5] * (n + 1))
    check(ev.get("code") == "too_large" and names_field(ev, "tokens"), "§8 %d ids: %r" % (n + 1, ev))
    ev = try_field(env.main, "detokenize", "tokens", [5] * n)
    check(ev.get("type") == "text", "§8 %d ids: %r" % (n, ev.get("type")))


def lim_inflight(env, v):
    check(env.max_inflight == int(v), "§8 %s in flight = info's max_inflight %d" % (v, env.max_inflight))


def lim_stop(env, v):
    m = re.match(r"(\d+), each (\d+)\.\.(\d+) bytes", v)
    if check(m, "§8 stop row parses: %r" % v):
        n, lo, hi = (int(g) for g in m.groups())
        check_range(env, env.main, "generate", "stop", "[str]", "at most %d strings of %d..%d bytes" % (n, lo, hi))


def lim_top(env, v):
    lo, hi = (int(x) for x in v.split(".."))
    c = env.main.connect()
    pos, done = c.eval(tokens=[1], top=hi)
    check(len(pos[0][1]) == min(hi, env.n_vocab), "§8 eval top %d: %d entries" % (hi, len(pos[0][1])))
    for bad in (lo - 1, hi + 1):
        ev = first_error(c, c.request("eval", tokens=[1], top=bad))
        check(ev and ev.get("code") == "invalid_value" and names_field(ev, "top"), "§8 eval top %d: %r" % (bad, ev))
    c.close()


def lim_logprobs(env, v):
    lo, hi = (int(x) for x in v.split(".."))
    c = env.main.connect()
    evs = list(c.events(c.request("generate", tokens=[1], max_tokens=1, temperature=0, logprobs=hi)))
    tok = [e for e in evs if e.get("type") == "token"]
    check(len(tok) == 1 and len(tok[0].get("top_logprobs", [])) == min(hi, env.n_vocab),
          "§8 logprobs %d: %r" % (hi, tok))
    for bad in (lo - 1, hi + 1):
        ev = first_error(c, c.request("generate", tokens=[1], max_tokens=1, logprobs=bad))
        check(ev and ev.get("code") == "invalid_value" and names_field(ev, "logprobs"), "§8 logprobs %d: %r" % (bad, ev))
    c.close()


def lim_max_tokens(env, v):
    lo, hi = (int(x) for x in v.split(".."))
    check_range(env, env.main, "generate", "max_tokens", "uint", "%d..%d" % (lo, hi))


def lim_client(env, v):
    n = int(v.split()[0])
    for size, ok in ((n, True), (n + 1, False)):
        c = env.main.connect(hello=False)
        c.send({"type": "hello", "id": 0, "version": 1, "client": "c" * size})
        ev = c.recv()
        check((ev.get("type") == "hello") if ok else (ev.get("code") == "too_large" and names_field(ev, "client")),
              "§8 hello client of %d bytes: %r" % (size, ev))
        c.close()


def lim_tokenize_reply(env, v):
    n = int(v)
    c = env.main.connect()
    # "a " gives one id per repeat here (add_bos off): measure, then aim at n and n + 1
    k1, k2 = 1000, 2000
    n1 = len(c.tokenize("a " * k1, add_bos=False))
    n2 = len(c.tokenize("a " * k2, add_bos=False))
    per = (n2 - n1) / (k2 - k1)
    base = n1 - per * k1
    k = int(round((n - base) / per))
    ids = None
    for kk in (k - 1, k, k + 1):
        got = c.tokenize("a " * kk, add_bos=False)
        if len(got) == n:
            ids, k = got, kk
            break
    if check(ids is not None, "§8 a text giving exactly %d ids was found (%.3f per repeat)" % (n, per)):
        ev = first_error(c, c.request("tokenize", text="a " * (k + 1), add_bos=False))
        check(ev and ev.get("code") == "too_large", "§8 a text giving over %d ids: %r" % (n, ev))
    c.close()


def lim_detokenize_reply(env, v):
    n = int(v.split()[0])
    c = env.chat.connect()
    n_vocab = c.info()["n_vocab"]
    # each piece's length (requests sent in bursts, answered in order)
    length = {}
    for lo in range(0, n_vocab, 256):
        ids = {c.request("detokenize", tokens=[i]): i for i in range(lo, min(lo + 256, n_vocab))}
        for rid, i in ids.items():
            ev = c.next_event(rid)
            t = ev.get("text", "")
            if ev.get("type") == "text" and t and "\ufffd" not in t:
                length[i] = len(t.encode())
    best = max(length, key=lambda i: length[i])
    one = min((i for i in length if length[i] == 1), default=None)
    q, r = divmod(n, length[best])
    if not check(one is not None and q + r <= 131072,
                 "§8 a detokenize reply of %d bytes can be built (%d-byte piece)" % (n, length[best])):
        return
    ids = [best] * q + [one] * r
    ev = c.result(c.request("detokenize", tokens=ids))
    got = len(ev["text"].encode())
    check(got == n, "§8 a detokenize reply of exactly %d bytes: %d" % (n, got))
    ev = first_error(c, c.request("detokenize", tokens=ids + [one]))
    check(ev and ev.get("code") == "too_large", "§8 a detokenize reply of %d bytes: too_large: %r" % (n + 1, ev))
    c.close()


LIMITS = {
    "message size, both directions": lim_message, "nesting depth": lim_depth,
    "prompt / system / tokenize text": lim_text, "messages": lim_messages,
    "token ids in one request": lim_ids, "requests in flight per connection": lim_inflight,
    "stop strings": lim_stop, "eval top": lim_top, "logprobs alternatives": lim_logprobs,
    "max_tokens": lim_max_tokens,
    "hello client name": lim_client, "ids in one tokenize reply": lim_tokenize_reply,
    "text of one detokenize reply": lim_detokenize_reply,
}


def t_limits(env, doc):
    rows = table_with(section(doc, r"^8\. "), "limit")
    seen = set()
    for r in rows[1:]:
        name, value = r[0], r[1]
        seen.add(name)
        if not check(name in LIMITS, "§8 row %r has a check here" % name):
            continue
        try:
            LIMITS[name](env, value)
        except Exception:
            check(False, "§8 %r raised:\n%s" % (name, traceback.format_exc()))
    for name in LIMITS:
        check(name in seen, "§8 has a row %r" % name)


# ---------------------------------------------------------------- §3, §9 examples

ANY = "\u0000any"


def parse_example(text):
    """A message as the document writes it: JSON where ... stands for any value."""
    out, i, in_str = [], 0, False
    while i < len(text):
        ch = text[i]
        if in_str:
            out.append(ch)
            if ch == "\\":
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif text.startswith("{...}", i):
            out.append(json.dumps(ANY))
            i += 4
        elif text.startswith("...", i):
            out.append(json.dumps(ANY))
            i += 2
        else:
            out.append(ch)
        i += 1
    return json.loads("".join(out))


def matches(want, got, path="", tol=0.05):
    """'' when got matches the example want, else where it differs."""
    if want == ANY:
        return ""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(want) != set(got):
            return "%s: keys %r, example %r" % (path, sorted(got) if isinstance(got, dict) else got, sorted(want))
        for k in want:
            m = matches(want[k], got[k], path + "." + k, tol)
            if m:
                return m
        return ""
    if isinstance(want, list):
        if not isinstance(got, list) or len(want) != len(got):
            return "%s: %r, example %r" % (path, got, want)
        for i, (a, b) in enumerate(zip(want, got)):
            m = matches(a, b, "%s[%d]" % (path, i), tol)
            if m:
                return m
        return ""
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return "" if abs(want - got) <= tol else "%s: %r, example %r" % (path, got, want)
    if type(want) is not type(got) or want != got:
        return "%s: %r, example %r" % (path, got, want)
    return ""


def example_lines(block):
    """[(direction, message)] of an example: → and ← lines, continued by
    indented lines without an arrow."""
    out = []
    for ln in block.split("\n"):
        s = ln.strip()
        if s.startswith("→") or s.startswith("←"):
            out.append([s[0], s[1:].strip()])
        elif s and out and ln.startswith("       "):
            out[-1][1] += s
    return [(d, parse_example(m)) for d, m in out]


def t_hello_example(env, doc):
    text = section(doc, r"^3\. ")
    blocks = re.findall(r"^    (\{.*\})$", text, re.M)
    if not check(len(blocks) >= 2, "§3 has the hello and its reply"):
        return
    req, want = parse_example(blocks[0]), parse_example(blocks[1])
    c = env.main.connect(hello=False)
    c.send(req)
    got = c.recv()
    m = matches(want, got)
    check(not m, "§3 hello reply as the example: %s" % m)
    c.close()


def t_session(env, doc):
    text = section(doc, r"^9\. ")
    steps = example_lines(text)
    check(len(steps) >= 20, "§9 example parsed: %d lines" % len(steps))
    c = env.main.connect(hello=False)
    wanted = {}    # id -> [expected events in order]
    cancelled = set()
    for d, msg in steps:
        if d == "→" and msg.get("type") == "cancel" and isinstance(msg.get("id"), int) and msg["id"] > 0:
            cancelled.add(msg["id"])
    # Replay: send every → in order; before each →, take the ← written
    # above it (per id: events of different ids may come in another order).
    pending = []
    for d, msg in steps:
        if d == "←":
            pending.append(msg)
            continue
        for w in pending:
            compare_next(c, w, cancelled)
        pending = []
        c.send(msg)
    for w in pending:
        compare_next(c, w, cancelled)
    c.close()


def compare_next(c, want, cancelled):
    id = want.get("id")
    if id in cancelled and want.get("type") == "token":
        ev = c.next_event(id, 60)
        check(ev.get("type") in ("token", "done"), "§9 request %s: a token (or its done): %r" % (id, ev))
        if ev.get("type") == "done":
            c.pending.setdefault(id, deque()).appendleft(ev)
        return
    if id in cancelled and want.get("type") == "done":
        while True:
            ev = c.next_event(id, 60)
            if ev.get("type") != "token":
                break
        if ev.get("finish") != "cancelled":   # it may have ended before the cancel came
            want = dict(want, finish=ev.get("finish"))
        m = matches(want, ev)
        check(not m, "§9 request %s ends as the example: %s" % (id, m))
        return
    ev = c.next_event(id, 60)
    m = matches(want, ev)
    check(not m, "§9 %s %s as the example: %s" % (want.get("type"), id, m))


# ---------------------------------------------------------------- main

class Env:
    pass


def main():
    if not os.access(ANED, os.X_OK):
        print("bin/aned is missing: build it first (make)")
        print("0 passed, 1 failed")
        return 1
    doc = read_doc()
    env = Env()
    daemons = env.daemons = []
    try:
        env.main = Daemon(MODEL, "main")
        daemons.append(env.main)
        env.chat = Daemon(CHAT_MODEL, "chat")
        daemons.append(env.chat)
        env.vocab = Daemon(VOCAB_ONLY, "vocab")
        daemons.append(env.vocab)
        env.small = Daemon(MODEL, "small", ["--max-clients", "2", "--hello-timeout", "1", "--idle-timeout", "1",
                                            "--socket-mode", "0666"], dir_mode=0o755)
        daemons.append(env.small)
        c = env.main.connect()
        info = c.info()
        c.close()
        env.n_ctx, env.n_vocab, env.max_inflight = info["n_ctx"], info["n_vocab"], info["max_inflight"]
        # t_error_codes ends with the main daemon's shutdown: last
        for t in (t_hello_example, t_session, t_event_order, t_event_fields, t_request_fields, t_limits,
                  t_error_codes):
            f0 = failed
            try:
                t(env, doc)
            except Exception:
                check(False, "%s raised:\n%s" % (t.__name__, traceback.format_exc()))
            print("%-24s %s" % (t.__name__, "ok" if failed == f0 else "FAIL"), flush=True)
            if t is not t_error_codes and env.main.proc.poll() is not None:
                check(False, "aned died during %s:\n%s" % (t.__name__, env.main.logtext()))
                break
    finally:
        if failed:
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.sock, d.logtext()))
        for d in daemons:
            d.stop()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
