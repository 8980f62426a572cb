#!/usr/bin/python3
"""Integration tests of the aned daemon: the real bin/aned on a private socket,
driven with raw msgpack sockets and the real bin/aneclient.

Every test has a deadline; every daemon started here is killed in a finally.
Ends with "N passed, M failed"; exits non-zero on any failure."""
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import msgpack

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ANED = os.path.join(ROOT, "bin", "aned")
ANECLIENT = os.path.join(ROOT, "bin", "aneclient")
FIX = os.path.join(ROOT, "tests", "fixtures")
MODEL = os.path.join(FIX, "models", "stories260K.gguf")
VOCAB_ONLY = os.path.join(FIX, "tokenizers", "llama.cpp", "ggml-vocab-llama-spm.gguf")
with open(os.path.join(FIX, "refs", "stories260K.greedy.json")) as f:
    GREEDY = json.load(f)["generated_ids"]
# Greedy text from BOS (tests/fixtures/refs/stories260K.md).
GREEDY_TEXT = "Once upon a time, there was a little girl named Lily."

PROTO_VERSION = 1
STARTUP_S = 30.0


class TestFailure(Exception):
    pass


TMPDIRS = []


def mktmp():
    """A private directory, removed when the run ends."""
    t = tempfile.mkdtemp(prefix="aned-t.")
    TMPDIRS.append(t)
    return t


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


# ------------------------------------------------------------------ daemon

class Daemon:
    """One bin/aned on a socket in a private temp dir."""

    def __init__(self, model=MODEL, args=(), sock=None, tmp=None, preexec=None):
        self.preexec = preexec
        self.tmp = tmp or mktmp()
        self.sock = sock or os.path.join(self.tmp, "aned.sock")
        self.log = os.path.join(self.tmp, "aned.%d.log" % random.randrange(1 << 30))
        self.model = model
        self.args = list(args)
        self.proc = None

    def start(self, wait=True):
        self.logf = open(self.log, "wb")
        cmd = [ANED, "--model", self.model, "--socket", self.sock, "--log-level", "debug"] + self.args
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT, preexec_fn=self.preexec)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=STARTUP_S):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise TestFailure("aned exited %s during start-up:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(1)
                s.connect(self.sock)
                s.close()
                # connectable: make sure the model is loaded (hello answered)
                c = Conn(self.sock)
                c.hello()
                c.close()
                return
            except (OSError, TestFailure):
                time.sleep(0.05)
        raise TestFailure("aned not ready after %.0f s:\n%s" % (timeout, self.log_text()))

    def log_text(self, tail=4000):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")[-tail:]
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=15):
        """SIGTERM; returns the exit status (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            self.logf.close()
        except Exception:
            pass


class Conn:
    """A raw protocol connection."""

    def __init__(self, path, timeout=20):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.u = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.next_id = 1
        self.stash = []  # messages for other ids met while waiting in call()

    def send(self, msg):
        self.s.sendall(msgpack.packb(msg, use_bin_type=True))

    def send_raw(self, data):
        self.s.sendall(data)

    def recv(self):
        """Next message; None at EOF."""
        if self.stash:
            return self.stash.pop(0)
        while True:
            for m in self.u:
                return m
            try:
                data = self.s.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.u.feed(data)

    def request(self, typ, **fields):
        rid = fields.pop("id", None)
        if rid is None:
            rid = self.next_id
            self.next_id += 1
        m = {"type": typ, "id": rid}
        m.update(fields)
        self.send(m)
        return rid

    def hello(self):
        self.request("hello", version=PROTO_VERSION, client="test_daemon")
        r = self.recv()
        check(r is not None and r.get("type") == "hello", "hello reply: %r" % (r,))
        return r

    def call(self, typ, **fields):
        """One request and its reply; events of other requests are kept for recv()."""
        rid = self.request(typ, **fields)
        held = []
        while True:
            r = self._recv_wire()
            check(r is not None, "connection closed waiting for a reply to %s" % typ)
            if r.get("id") == rid or r.get("id") == 0:
                self.stash = self.stash + held
                return r
            held.append(r)

    def _recv_wire(self):
        while True:
            for m in self.u:
                return m
            try:
                data = self.s.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.u.feed(data)

    def generate(self, **fields):
        """Runs one generate to its end: (token ids, text, last message)."""
        rid = self.request("generate", **fields)
        ids, text = [], b""
        while True:
            m = self.recv()
            check(m is not None, "connection closed mid-generation")
            check(m.get("id") == rid, "message for another id: %r" % (m,))
            if m["type"] == "token":
                ids.append(m["token"])
                t = m.get("text", "")
                text += t.encode() if isinstance(t, str) else t
            else:
                return ids, text.decode("utf-8", "replace"), m

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def greedy_req(n=48, **kw):
    d = dict(tokens=[1], raw=True, temperature=0.0, max_tokens=n)
    d.update(kw)
    return d


def info(path):
    c = Conn(path)
    try:
        c.hello()
        return c.call("info")
    finally:
        c.close()


def _idle(path):
    r = info(path)
    return r.get("active") == 0 and r.get("queued") == 0


def wait_for(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise TestFailure("timed out waiting for " + what)


def have_client():
    return os.access(ANECLIENT, os.X_OK)


def run_client(d, args, timeout=60, input=None):
    env = dict(os.environ)
    env["ANE_SOCKET"] = d.sock
    return subprocess.run([ANECLIENT, "--socket", d.sock] + args, input=input, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)


# ------------------------------------------------------------------ tests

def test_help():
    p = subprocess.run([ANED, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(p.returncode == 0, "--help exit %d" % p.returncode)
    out = p.stdout.decode()
    for opt in ("--model", "--socket", "--daemonize", "--threads", "--ctx", "--max-seqs", "--backend", "--log"):
        check(opt in out, "--help does not mention %s" % opt)
    p = subprocess.run([ANED, "--bogus"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(p.returncode != 0, "unknown option accepted")
    p = subprocess.run([ANED, "--socket", "/tmp/x.sock"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(p.returncode != 0 and b"--model" in p.stderr, "missing --model not reported")


def _start_fails(model, needle):
    tmp = mktmp()
    sock = os.path.join(tmp, "s.sock")
    p = subprocess.run([ANED, "--model", model, "--socket", sock], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=30)
    err = p.stderr.decode("utf-8", "replace")
    check(p.returncode != 0, "aned started on a bad model (%s)" % model)
    check(needle in err, "message does not name the file %r: %r" % (needle, err))
    check(not os.path.exists(sock), "socket left behind after a failed start")
    check(not os.path.exists(sock + ".lock"), "lock file left behind after a failed start")


def test_missing_model():
    _start_fails("/nonexistent/dir/model.gguf", "/nonexistent/dir/model.gguf")


def test_corrupt_model():
    tmp = mktmp()
    bad = os.path.join(tmp, "corrupt.gguf")
    with open(bad, "wb") as f:
        f.write(b"GGUF" + bytes(random.Random(1).randrange(256) for _ in range(4000)))
    _start_fails(bad, bad)
    with open(bad, "wb") as f:
        f.write(b"this is not a model at all\n")
    _start_fails(bad, bad)
    # a truncated copy of the real model
    with open(MODEL, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 3])
    _start_fails(bad, bad)


def test_kv_type():
    """--kv-type: f32 reported by info; q8_0 refused on the bundled model
    (head_dim 8) with a message that says why; a bad value exits 2."""
    p = subprocess.run([ANED, "--model", MODEL, "--socket", "/tmp/x.sock", "--kv-type", "q4"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(p.returncode == 2 and b"--kv-type" in p.stderr, "bad --kv-type: %d %r" % (p.returncode, p.stderr))
    tmp = mktmp()
    sock = os.path.join(tmp, "s.sock")
    p = subprocess.run([ANED, "--model", MODEL, "--socket", sock, "--kv-type", "q8_0"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=30)
    err = p.stderr.decode("utf-8", "replace")
    check(p.returncode != 0, "q8_0 KV accepted for head_dim 8")
    check("q8_0" in err and "head_dim" in err and MODEL in err, "q8_0 refusal: %r" % err)
    d = Daemon(args=["--kv-type", "f32"]).start()
    try:
        c = Conn(d.sock)
        c.hello()
        r = c.call("info")
        check(r.get("kv_type") == "f32", "info kv_type %r" % r.get("kv_type"))
        c.close()
    finally:
        d.stop()


def test_gpus_bad():
    """--gpus: a list that is not GPU numbers, a GPU named twice, or GPUs
    with --backend cpu are start-up errors naming --gpus, a --split other
    than heads or layers one naming --split; in a build without CUDA, GPUs
    are refused naming the backend."""
    tmp = mktmp()
    sock = os.path.join(tmp, "s.sock")
    cases = [(["--gpus", "0,x"], ["--gpus", "expected up to 8 GPU numbers"]),
             (["--gpus", "1,1"], ["--gpus", "named twice"]),
             (["--gpus", "0,1", "--backend", "cpu"], ["--gpus", "not --backend cpu"]),
             (["--gpus", "0,1", "--split", "rows"], ["--split", "heads or layers"])]
    for args, wants in cases:
        p = subprocess.run([ANED, "--model", MODEL, "--socket", sock] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        err = p.stderr.decode("utf-8", "replace")
        check(p.returncode != 0 and all(w in err for w in wants), "%r: %d %r" % (args, p.returncode, err))
    if shutil.which("nvidia-smi"):
        return   # (on a GPU machine two GPUs may be there: the split's own tests cover it)
    p = subprocess.run([ANED, "--model", MODEL, "--socket", sock, "--gpus", "0,1"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=30)
    err = p.stderr.decode("utf-8", "replace")
    check(p.returncode != 0 and "cuda" in err, "--gpus 0,1 without a GPU: %d %r" % (p.returncode, err))


def test_cpu_repack():
    """--cpu-repack: on a q4_K model the CPU backend's copy is reported
    (cpu_repack, repacked_bytes > 0 where AVX2 or AVX-512 is the kernels' ISA) and
    named in the log; with off there is none; both give the same greedy
    tokens and the same logits to the bit (the packed kernels give the
    reference's bits). A bad value exits 2."""
    p = subprocess.run([ANED, "--model", MODEL, "--socket", "/tmp/x.sock", "--cpu-repack", "on"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(p.returncode == 2 and b"--cpu-repack" in p.stderr, "bad --cpu-repack: %d %r" % (p.returncode, p.stderr))
    q4k = os.path.join(ROOT, "tests/fixtures/models/llama-q.Q4_K_M.gguf")
    got = {}
    for mode in ("auto", "off"):
        d = Daemon(model=q4k, args=["--cpu-repack", mode]).start()
        try:
            c = Conn(d.sock)
            c.hello()
            r = c.call("info")
            packed = r.get("repacked_bytes", -1)
            check(r.get("cpu_repack") == mode, "info cpu_repack %r" % r.get("cpu_repack"))
            if mode == "off":
                check(packed == 0, "--cpu-repack off: repacked_bytes %r" % packed)
            elif r.get("backend") == "cpu" and r.get("device", "").endswith((" avx2 kernels", " avx512 kernels")):
                check(packed > 0 and "matrices held in 8-row groups" in d.log_text(),
                      "auto on AVX2 / AVX-512: repacked_bytes %r" % packed)
            ids, _, last = c.generate(**greedy_req(32, tokens=[1, 50, 60]))
            rid = c.request("eval", tokens=[1, 50, 60, 70, 80, 90, 100, 110], top=5)
            tops = []
            while True:
                m = c.recv()
                check(m is not None and m.get("id") == rid, "eval: %r" % (m,))
                if m is None or m["type"] != "logits":
                    break
                tops.append(m["top"])
            got[mode] = (ids, last.get("finish"), tops)
            c.close()
        finally:
            d.stop()
    check(got["auto"][0] == got["off"][0] and len(got["off"][0]) == 32, "greedy tokens differ: %r" % (got,))
    check(len(got["off"][2]) == 8 and got["auto"][2] == got["off"][2],
          "eval logits differ between --cpu-repack auto and off: %r" % (got,))


def test_kv_pool_info():
    """info: n_ctx is the model's trained context by default, kv_tokens the
    pool's tokens (at least one context), swa_ring the sliding-window
    layers' ring on a gemma3 model (0 with --swa-full or without such
    layers); --help names --swa-full."""
    p = subprocess.run([ANED, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(b"--swa-full" in p.stdout and b"--kv-budget" in p.stdout, "--help: %r" % p.stdout[-400:])
    gemma = os.path.join(ROOT, "tests/fixtures/models/gemma3-tiny.bf16.gguf")
    for model, args, ring in ((MODEL, [], False), (gemma, [], True), (gemma, ["--swa-full"], False)):
        d = Daemon(model=model, args=args).start()
        try:
            c = Conn(d.sock)
            c.hello()
            r = c.call("info")
            check(r.get("n_ctx") in (2048, 4096), "%s: n_ctx %r (the trained context)" % (model, r.get("n_ctx")))
            check(r.get("kv_tokens", 0) >= r["n_ctx"] and r.get("kv_total", 0) > 0, "%s: kv_tokens %r kv_total %r"
                  % (model, r.get("kv_tokens"), r.get("kv_total")))
            check((r.get("swa_ring", -1) > 0) == ring and r.get("swa_ring", 1 << 30) < r["n_ctx"],
                  "%s %s: swa_ring %r" % (model, args, r.get("swa_ring")))
            c.close()
        finally:
            d.stop()


def test_hello_ping_info(d):
    c = Conn(d.sock)
    try:
        h = c.hello()
        check(h.get("server") == "aned/0.1.0", "server name %r" % h.get("server"))
        check(h.get("model"), "hello carries no model name")
        r = c.call("ping")
        check(r["type"] == "pong", "ping: %r" % r)
        r = c.call("info")
        check(r["type"] == "info", "info: %r" % r)
        check(r.get("clients", 0) >= 1, "info clients %r" % r.get("clients"))
        for k in ("active", "queued", "tokens_served", "uptime_s", "per_client", "n_vocab", "n_ctx",
                  "arch", "backend", "jobs_done", "kv_total", "weight_bytes"):
            check(k in r, "info lacks %s: %r" % (k, sorted(r)))
        check(r["n_vocab"] == 512 and r["arch"] == "llama", "model facts %r" % r)
        check(r.get("kv_type") == "f16", "info kv_type %r" % r.get("kv_type"))
        check(r.get("device", "") != "" and (r["backend"] != "cpu" or re.search(r", \d+ threads?, (scalar|avx2|avx512|amx|neon) kernels$", r["device"])),
              "info device %r" % r.get("device"))
        check(r.get("model_path", "").endswith("stories260K.gguf"), "model_path %r" % r.get("model_path"))
        served = r["tokens_served"]
        # a job in flight shows up under this process
        rid = c.request("generate", **greedy_req(1800))
        m = c.recv()
        check(m and m["type"] == "token", "generate: %r" % m)
        r = c.call("info")
        me = [p for p in r["per_client"] if p.get("pid") == os.getpid()]
        check(me and me[0].get("uid") == os.getuid() and me[0].get("active", 0) + me[0].get("queued", 0) == 1,
              "per_client lacks this process: %r" % r["per_client"])
        c.request("cancel", id=rid)
        while True:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] != "token":
                break
        check(m["type"] == "done" and m["finish"] == "cancelled", "cancel: %r" % m)
        r = c.call("info")
        check(r["tokens_served"] > served, "tokens_served did not grow: %r" % r["tokens_served"])
    finally:
        c.close()


def test_handshake_required(d):
    c = Conn(d.sock)
    try:
        r = c.call("generate", **greedy_req(4))
        check(r["type"] == "error" and r.get("code") == "handshake", "request before hello: %r" % r)
        c.hello()  # the connection stays: hello may still come
        ids, _, last = c.generate(**greedy_req(4))
        check(last["type"] == "done" and ids == GREEDY[:4], "after a late hello: %r" % last)
    finally:
        c.close()
    c = Conn(d.sock)
    try:
        c.hello()
        r = c.call("hello", version=PROTO_VERSION)
        check(r["type"] == "error" and r.get("code") == "bad_request", "second hello: %r" % r)
        ids, _, last = c.generate(**greedy_req(4))
        check(last["type"] == "done" and ids == GREEDY[:4], "after hello: %r" % last)
    finally:
        c.close()
    c = Conn(d.sock)
    try:
        c.request("hello", version=99, client="future")
        r = c.recv()
        check(r and r["type"] == "error" and r.get("code") == "version", "version 99: %r" % r)
        check(c.recv() is None, "connection stays open after a version mismatch")
    finally:
        c.close()


def test_greedy_reference(d):
    c = Conn(d.sock)
    try:
        c.hello()
        ids, text, last = c.generate(**greedy_req(48))
        check(last["type"] == "done", "last message %r" % last)
        check(ids == GREEDY[:48], "greedy ids differ:\n got %r\nwant %r" % (ids, GREEDY[:48]))
        check(text.lstrip().startswith(GREEDY_TEXT), "greedy text %r" % text)
        check(last.get("finish") == "length", "finish %r" % last.get("finish"))
        # detokenize agrees with the streamed text
        r = c.call("detokenize", tokens=ids)
        check(r["type"] == "text" and r["text"] == text, "detokenize %r vs %r" % (r.get("text"), text))
    finally:
        c.close()


def test_aneclient_story(d):
    if not have_client():
        raise TestFailure("bin/aneclient is missing")
    p = run_client(d, ["Once upon a time"])
    out = p.stdout.decode("utf-8", "replace")
    check(p.returncode == 0, "aneclient exit %d: %s" % (p.returncode, p.stderr.decode(errors="replace")))
    check(len(out.strip()) > 20, "aneclient printed no story: %r" % out)


def test_aneclient_greedy(d):
    if not have_client():
        raise TestFailure("bin/aneclient is missing")
    p = run_client(d, ["--tokens", "1", "--temperature", "0", "-n", "48", "--json"])
    check(p.returncode == 0, "aneclient exit %d: %s" % (p.returncode, p.stderr.decode(errors="replace")))
    out = p.stdout.decode("utf-8", "replace")
    ids, text = _ids_from_json_output(out)
    check(ids == GREEDY[:48], "aneclient greedy ids %r" % ids)
    check(GREEDY_TEXT in text, "aneclient greedy text %r" % text)


def _ids_from_json_output(out):
    """Token ids and text from aneclient --json: JSON lines (one per event) or one document."""
    ids, text = [], ""
    docs = []
    try:
        docs = [json.loads(out)]
    except ValueError:
        for line in out.splitlines():
            line = line.strip()
            if line:
                try:
                    docs.append(json.loads(line))
                except ValueError:
                    pass
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("type") == "token":
            ids.append(doc.get("token"))
            text += doc.get("text", "")
        for k in ("tokens", "ids", "token_ids", "completion_tokens_ids"):
            if isinstance(doc.get(k), list):
                ids = list(doc[k])
        if isinstance(doc.get("text"), str) and doc.get("type") != "token":
            text = doc["text"]
    return ids, text


GARBAGE = [
    ("random", bytes(random.Random(7).randrange(256) for _ in range(5000)), "malformed"),
    ("not a map", msgpack.packb(12345), "malformed"),
    ("array", msgpack.packb([1, 2, 3]), "malformed"),
    ("ext type", b"\x82\xa4type\xa4ping\xa2id\xd4\x01\x02", "malformed"),
    ("oversized str32", b"\x81\xa4type\xdb\x7f\xff\xff\xff" + b"x" * 100, "too_large"),
    ("oversized map32", b"\xdf\x7f\xff\xff\xff", "too_large"),
    ("oversized frame", msgpack.packb({"type": "ping", "id": 1, "pad": "x" * (2 << 20)}), "too_large"),
    ("deep nesting", b"\x81\xa1a" + b"\x91" * 5000 + b"\xc0", "too_deep"),
    ("reserved byte", b"\xc1\xc1\xc1\xc1", "malformed"),
]


def test_garbage(d):
    for name, data, code in GARBAGE:
        c = Conn(d.sock, timeout=10)
        try:
            if name != "random":
                c.hello()
            try:
                c.send_raw(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
            # an error (id 0) may come, then the connection must close
            seen = []
            while True:
                try:
                    m = c.recv()
                except (socket.timeout, TimeoutError):
                    raise TestFailure("%s: connection neither answered nor closed" % name)
                except msgpack.exceptions.ExtraData:
                    m = None
                if m is None:
                    break
                seen.append(m)
                check(len(seen) < 10, "%s: too many replies %r" % (name, seen))
            errs = [m for m in seen if m.get("type") == "error"]
            check(errs and errs[-1].get("code") == code and errs[-1].get("id") == 0,
                  "%s: want error %s with id 0 before the close, got %r" % (name, code, seen))
        finally:
            c.close()
        check(d.alive(), "daemon died on %s" % name)
        # a second client still works
        c = Conn(d.sock)
        try:
            c.hello()
            ids, _, last = c.generate(**greedy_req(8))
            check(last["type"] == "done" and ids == GREEDY[:8], "after %s: %r %r" % (name, ids, last))
        finally:
            c.close()
    # a valid request before the garbage is still answered
    c = Conn(d.sock)
    try:
        c.hello()
        c.send_raw(msgpack.packb({"type": "ping", "id": 9}) + b"\xc1")
        m1, m2, m3 = c.recv(), c.recv(), c.recv()
        check(m1 and m1["type"] == "pong" and m2 and m2.get("code") == "malformed" and m3 is None,
              "ping then garbage: %r %r %r" % (m1, m2, m3))
    finally:
        c.close()
    # truncated message, then the peer goes away
    c = Conn(d.sock)
    c.hello()
    c.send_raw(msgpack.packb({"type": "generate", "id": 5, "prompt": "hello"})[:-3])
    c.close()
    check(info(d.sock)["type"] == "info" and d.alive(), "daemon unwell after a truncated message")


def test_mutated_requests(d):
    """Valid requests with random byte flips, cuts and splices: the daemon survives all."""
    rng = random.Random(1234)
    seeds = [
        dict(type="generate", id=3, tokens=[1, 403], raw=True, max_tokens=4, temperature=0.5,
             stop=["x"], seed=7),
        dict(type="generate", id=4, prompt="Once upon", raw=True, max_tokens=3),
        dict(type="eval", id=5, tokens=[1, 403, 407], top=3),
        dict(type="tokenize", id=6, text="Lily was sad", add_bos=True),
        dict(type="detokenize", id=7, tokens=[403, 407, 261]),
        dict(type="cancel", id=3),
        dict(type="info", id=8),
        dict(type="ping", id=9),
    ]
    for i in range(80):
        data = bytearray(msgpack.packb(rng.choice(seeds)))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3)
            pos = rng.randrange(len(data))
            if op == 0:
                data[pos] ^= 1 << rng.randrange(8)
            elif op == 1:
                data[pos] = rng.randrange(256)
            else:
                data = data[:pos] + data[pos + rng.randrange(1, 4):]
        c = Conn(d.sock, timeout=3)
        try:
            c.hello()
            c.send_raw(bytes(data))
            c.s.shutdown(socket.SHUT_WR)
            while c.recv() is not None:
                pass
        except (OSError, TestFailure, msgpack.exceptions.ExtraData, ValueError):
            pass  # a reply the mutation made odd, or a long generation cut short: fine
        finally:
            c.close()
        check(d.alive(), "daemon died on mutation %d: %r" % (i, bytes(data)))
    wait_for(lambda: _idle(d.sock), 20, "mutated jobs to end")
    c = Conn(d.sock)
    try:
        c.hello()
        ids, _, _ = c.generate(**greedy_req(16))
        check(ids == GREEDY[:16], "after mutations: %r" % ids)
    finally:
        c.close()


def test_bad_requests_keep_connection(d):
    c = Conn(d.sock)
    try:
        c.hello()
        r = c.call("frobnicate")
        check(r["type"] == "error" and r.get("code") == "unknown_type", "unknown type: %r" % r)
        r = c.call("generate", tokens="not a list")
        check(r["type"] == "error" and r.get("code") == "bad_request", "wrong type: %r" % r)
        r = c.call("generate", tokens=[1, 100000], raw=True, max_tokens=4)
        check(r["type"] == "error" and r.get("code") == "invalid_token", "bad token id: %r" % r)
        r = c.call("generate", tokens=[1] + [300] * 5000, raw=True, max_tokens=4)
        check(r["type"] == "error" and r.get("code") == "context", "over context: %r" % r)
        r = c.call("generate", prompt="hi", temperature=-3.0, raw=True)
        check(r["type"] == "error" and r.get("code") == "invalid_value", "negative temperature: %r" % r)
        c.request("cancel", id=424242)  # unknown id: ignored
        r = c.call("ping")
        check(r["type"] == "pong", "connection unusable after bad requests: %r" % r)
        # duplicate id in flight
        rid = c.request("generate", id=77, **greedy_req(400))
        c.request("generate", id=77, **greedy_req(4))
        got_dup = False
        while True:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] == "error" and m.get("code") == "duplicate_id":
                got_dup = True
                c.request("cancel", id=77)
            if m["type"] in ("done", "error") and m.get("code") != "duplicate_id":
                break
        check(got_dup, "no duplicate_id error")
        check(m["type"] == "done", "first request ended with %r" % m)
        ids, _, last = c.generate(**greedy_req(8))
        check(ids == GREEDY[:8], "after duplicate: %r" % ids)
    finally:
        c.close()


def test_inflight_limit(d):
    c = Conn(d.sock)
    try:
        c.hello()
        batch = b"".join(msgpack.packb(dict(type="generate", id=i + 1, **greedy_req(1500)))
                         for i in range(33))
        c.send_raw(batch)
        busy = None
        done = set()
        while len(done) < 33:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] == "error" and m.get("code") == "busy":
                busy = m["id"]
                done.add(m["id"])
                for i in range(32):
                    c.request("cancel", id=i + 1)
            elif m["type"] in ("done", "error"):
                done.add(m["id"])
        check(busy == 33, "33rd request not refused with busy (got %r)" % busy)
    finally:
        c.close()


def test_concurrent(d, n=8):
    results = [None] * n

    def worker(i):
        try:
            c = Conn(d.sock, timeout=60)
            try:
                c.hello()
                results[i] = c.generate(**greedy_req(48))
            finally:
                c.close()
        except Exception as e:
            results[i] = e

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    for i, r in enumerate(results):
        check(not isinstance(r, Exception) and r is not None, "client %d: %r" % (i, r))
        ids, text, last = r
        check(last["type"] == "done" and ids == GREEDY[:48], "client %d got %r" % (i, ids))
    if have_client():
        procs = [subprocess.Popen([ANECLIENT, "--socket", d.sock, "-n", "32", "Once upon a time"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(n)]
        for p in procs:
            out, err = p.communicate(timeout=90)
            check(p.returncode == 0 and out.strip(), "concurrent aneclient: %d %r" % (p.returncode, err))


def test_disconnect_mid_generation(d):
    a = Conn(d.sock)
    b = Conn(d.sock)
    try:
        a.hello()
        b.hello()
        a.request("generate", **greedy_req(1800))
        for _ in range(5):
            m = a.recv()
            check(m and m["type"] == "token", "a: %r" % m)
        a.close()
        ids, _, last = b.generate(**greedy_req(48))
        check(last["type"] == "done" and ids == GREEDY[:48], "b disturbed: %r" % ids)
        wait_for(lambda: _idle(d.sock), 10, "the dropped client's job to be freed")
        check("closed connection ended: cancelled" in d.log_text(tail=1 << 30),
              "the dropped client's job was not cancelled")
    finally:
        a.close()
        b.close()


def test_cancel(d):
    c = Conn(d.sock)
    try:
        c.hello()
        rid = c.request("generate", **greedy_req(1800))
        n = 0
        while True:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] == "token":
                n += 1
                if n == 3:
                    c.request("cancel", id=rid)
                continue
            break
        check(m["type"] == "done" and m.get("finish") == "cancelled", "after cancel: %r" % m)
        check(n < 1800, "cancel had no effect")
    finally:
        c.close()


def test_half_close(d):
    c = Conn(d.sock)
    try:
        c.send(dict(type="hello", id=1, version=PROTO_VERSION))
        c.send(dict(type="generate", id=2, **greedy_req(16)))
        c.s.shutdown(socket.SHUT_WR)
        msgs = []
        while True:
            m = c.recv()
            if m is None:
                break
            msgs.append(m)
        check(msgs and msgs[0]["type"] == "hello", "half-closed: %r" % msgs[:2])
        ids = [m["token"] for m in msgs if m["type"] == "token"]
        check(ids == GREEDY[:16] and msgs[-1]["type"] == "done", "half-closed peer lost replies: %r" % ids)
    finally:
        c.close()


def test_slow_reader(d):
    slow = Conn(d.sock)
    try:
        slow.hello()
        slow.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for i in range(4):  # fewer than --max-seqs: the other client is admitted at once
            slow.request("generate", **greedy_req(400))
        # never reads; others must not notice
        t0 = time.time()
        c = Conn(d.sock)
        try:
            c.hello()
            for _ in range(3):
                ids, _, last = c.generate(**greedy_req(32))
                check(ids == GREEDY[:32], "other client disturbed by a slow reader")
        finally:
            c.close()
        check(time.time() - t0 < 30, "other client slowed down")
    finally:
        slow.close()
    wait_for(lambda: _idle(d.sock), 15, "the slow reader's jobs to end")


def test_eval(d):
    c = Conn(d.sock)
    try:
        c.hello()
        prompt = [1] + GREEDY[:5]
        rid = c.request("eval", tokens=prompt, raw=True, top=5)
        pos = []
        while True:
            m = c.recv()
            check(m is not None and m["id"] == rid, "eval: %r" % m)
            if m["type"] != "logits":
                break
            check(len(m["top"]) == 5, "top size %r" % m)
            # greedy continuation: the best entry at position p is the next greedy id
            check(m["top"][0][0] == GREEDY[m["pos"]], "eval pos %d best %r" % (m["pos"], m["top"][0]))
            pos.append(m["pos"])
        check(m["type"] == "done", "eval end: %r" % m)
        check(pos == list(range(len(prompt))), "positions %r" % pos)
    finally:
        c.close()


def test_tokenize(d):
    c = Conn(d.sock)
    try:
        c.hello()
        r = c.call("tokenize", text="Once upon a time")
        check(r["type"] == "tokens" and r["tokens"] and r["tokens"][0] == 1, "tokenize: %r" % r)
        r2 = c.call("detokenize", tokens=r["tokens"])
        check(r2["type"] == "text" and r2["text"].strip() == "Once upon a time", "detokenize: %r" % r2)
        r = c.call("detokenize", tokens=[5, 99999])
        check(r["type"] == "error" and r.get("code") == "invalid_token", "detokenize bad id: %r" % r)
    finally:
        c.close()


def test_tokenizer_only():
    d = Daemon(model=VOCAB_ONLY).start()
    try:
        c = Conn(d.sock)
        try:
            c.hello()
            r = c.call("tokenize", text="Hello world", add_bos=False)
            check(r["type"] == "tokens" and r["tokens"], "tokenize: %r" % r)
            r2 = c.call("detokenize", tokens=r["tokens"])
            check(r2["type"] == "text" and r2["text"].strip() == "Hello world", "round trip: %r" % r2)
            r = c.call("generate", prompt="Hello", raw=True, max_tokens=4)
            check(r["type"] == "error" and r.get("code") == "no_model", "generate: %r" % r)
            r = c.call("eval", tokens=[1, 15043], top=2)
            check(r["type"] == "error" and r.get("code") == "no_model", "eval: %r" % r)
            # llama.cpp's own test vectors for this vocabulary, through the daemon
            base = VOCAB_ONLY
            with open(base + ".inp", encoding="utf-8") as f:
                texts = f.read().split("\n__ggml_vocab_test__\n")[:-1]
            with open(base + ".out") as f:
                want = [[int(x) for x in line.split()] for line in f.read().split("\n")]
            n_ok = 0
            for text, ids in list(zip(texts, want))[:30]:
                r = c.call("tokenize", text=text, add_bos=False)
                check(r["type"] == "tokens", "tokenize %r: %r" % (text, r))
                check(r["tokens"] == ids, "tokenize %r: %r, llama.cpp %r" % (text, r["tokens"], ids))
                n_ok += 1
            check(n_ok >= 20, "only %d vectors" % n_ok)
            r = c.call("info")
            check(r.get("tokenizer_only") in (True, 1), "info tokenizer_only %r" % r.get("tokenizer_only"))
        finally:
            c.close()
        check(d.stop() == 0, "exit status")
    finally:
        d.kill()


def test_sigterm_mid_generation():
    # the grace must be well under the job's remaining time: the tiny model
    # generates its whole context (2047 tokens) in about 0.5 s on a quiet machine
    d = Daemon(args=["--shutdown-grace", "0.05"]).start()
    try:
        c = Conn(d.sock)
        c.hello()
        c.request("generate", **greedy_req(0))
        m = c.recv()
        check(m and m["type"] == "token", "no token before SIGTERM: %r" % m)
        msgs = []

        def drain():
            try:
                while True:
                    m = c.recv()
                    if m is None:
                        break
                    msgs.append(m)
            except OSError:
                pass

        reader = threading.Thread(target=drain)
        reader.start()
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(15)
        dt = time.time() - t0
        reader.join(10)
        check(rc == 0, "exit status %r after SIGTERM" % rc)
        check(dt < 5, "shutdown took %.1f s" % dt)
        check(not os.path.exists(d.sock), "socket not removed")
        ends = [m for m in msgs if m["type"] != "token"]
        check(ends and ends[0]["type"] == "done" and ends[0].get("finish") == "cancelled"
              and ends[0]["id"] == 2, "the job's end at shutdown: %r" % (ends[:1],))
        check(ends[-1]["id"] == 0 and ends[-1].get("code") == "shutting_down",
              "no connection-level shutting_down before close: %r" % (ends[-1:],))
        c.close()
        check("exiting" in d.log_text(), "no shutdown log line")
        if os.environ.get("ANED_TEST_VERBOSE"): print(d.log_text())
    finally:
        d.kill()


def test_sigint_idle():
    d = Daemon().start()
    try:
        d.proc.send_signal(signal.SIGINT)
        check(d.proc.wait(10) == 0, "exit status after SIGINT")
        check(not os.path.exists(d.sock), "socket not removed")
    finally:
        d.kill()


def test_sigterm_during_startup():
    """A SIGTERM at any moment of start-up never leaves a socket or lock behind."""
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.05):
        d = Daemon()
        try:
            d.start(wait=False)
            time.sleep(delay)
            d.proc.send_signal(signal.SIGTERM)
            rc = d.proc.wait(15)
            check(rc in (0, -signal.SIGTERM), "exit status %r (delay %g)" % (rc, delay))
            check(not os.path.exists(d.sock), "socket left behind (delay %g)" % delay)
            check(not os.path.exists(d.sock + ".lock"), "lock file left behind (delay %g)" % delay)
        finally:
            d.kill()


def test_hello_timeout():
    d = Daemon(args=["--hello-timeout", "0.5"]).start()
    try:
        c = Conn(d.sock, timeout=10)
        t0 = time.time()
        m = c.recv()
        check(m and m.get("code") == "handshake" and m["id"] == 0, "silent connection: %r" % m)
        check(c.recv() is None and time.time() - t0 < 5, "silent connection not closed in time")
        c.close()
        check(_hello_ok(d.sock), "daemon unwell")
    finally:
        d.stop()
        d.kill()


def test_shutdown_grace():
    """Within --shutdown-grace a running job finishes normally; a second SIGTERM cancels at once."""
    d = Daemon(args=["--shutdown-grace", "30"]).start()
    try:
        c = Conn(d.sock)
        c.hello()
        c.request("generate", **greedy_req(64))
        check(c.recv()["type"] == "token", "no token")
        d.proc.send_signal(signal.SIGTERM)
        ends = []
        while True:
            m = c.recv()
            if m is None:
                break
            if m["type"] != "token":
                ends.append(m)
        check(ends and ends[0]["type"] == "done" and ends[0]["finish"] == "length", "job end: %r" % ends)
        check(d.proc.wait(10) == 0, "exit status")
        check(not os.path.exists(d.sock), "socket left behind")
    finally:
        d.kill()
    d = Daemon(args=["--shutdown-grace", "30"]).start()
    try:
        c = Conn(d.sock)
        c.hello()
        c.request("generate", **greedy_req(0))
        check(c.recv()["type"] == "token", "no token")
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)   # (the whole job takes ~0.5 s on a quiet machine)
        check(d.alive(), "daemon did not wait for its job")
        d.proc.send_signal(signal.SIGTERM)
        msgs = []

        def drain():
            try:
                while True:
                    m = c.recv()
                    if m is None:
                        break
                    msgs.append(m)
            except OSError:
                pass

        t = threading.Thread(target=drain)
        t.start()
        check(d.proc.wait(10) == 0, "exit status")
        t.join(10)
        check(time.time() - t0 < 5, "second SIGTERM did not cancel at once")
        ends = [m for m in msgs if m["type"] != "token"]
        check(ends and ends[0].get("finish") == "cancelled", "job end: %r" % ends[:1])
    finally:
        d.kill()


def test_sighup_reopens_log():
    tmp = mktmp()
    logf = os.path.join(tmp, "aned.log")
    d = Daemon(args=["--log", logf], tmp=tmp).start()
    try:
        os.rename(logf, logf + ".1")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: os.path.exists(logf), 5, "the log file to be reopened")
        check(info(d.sock)["type"] == "info", "daemon unwell after SIGHUP")
        check(d.stop() == 0, "exit status")
        with open(logf) as f:
            text = f.read()
        check("reopened" in text and "exiting" in text, "new log file: %r" % text)
        with open(logf + ".1") as f:
            check("listening" in f.read(), "old log file lost its lines")
    finally:
        d.kill()


def test_stale_socket():
    tmp = mktmp()
    path = os.path.join(tmp, "aned.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # leaves a socket file nobody listens on
    check(os.path.exists(path), "setup: no stale socket")
    d = Daemon(sock=path, tmp=tmp).start()
    try:
        check(info(path)["type"] == "info", "daemon on a replaced stale socket")
        check("stale" in d.log_text(tail=1 << 30), "stale socket removal not logged")
    finally:
        d.stop()
        d.kill()


def test_second_daemon_refuses():
    d = Daemon().start()
    try:
        p = subprocess.run([ANED, "--model", MODEL, "--socket", d.sock], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        check(p.returncode != 0, "a second aned started on a live socket")
        err = p.stderr.decode("utf-8", "replace")
        check("already" in err and d.sock in err, "unclear refusal: %r" % err)
        check(os.path.exists(d.sock) and info(d.sock)["type"] == "info", "first daemon disturbed")
        # a live non-aned listener is refused too, and never unlinked
        tmp = mktmp()
        other = os.path.join(tmp, "other.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(other)
        s.listen(1)
        try:
            p = subprocess.run([ANED, "--model", MODEL, "--socket", other], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=30)
            check(p.returncode != 0 and os.path.exists(other), "took over another server's socket")
        finally:
            s.close()
        # a regular file is never replaced
        reg = os.path.join(tmp, "file.sock")
        with open(reg, "w") as f:
            f.write("keep me")
        p = subprocess.run([ANED, "--model", MODEL, "--socket", reg], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        check(p.returncode != 0 and b"not a socket" in p.stderr, "regular file: %r" % p.stderr)
        with open(reg) as f:
            check(f.read() == "keep me", "regular file modified")
        # a path too long for sun_path
        p = subprocess.run([ANED, "--model", MODEL, "--socket", "/tmp/" + "x" * 200], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        check(p.returncode != 0 and b"too long" in p.stderr, "long path: %r" % p.stderr)
    finally:
        d.stop()
        d.kill()


def test_socket_mode():
    d = Daemon().start()
    try:
        mode = stat.S_IMODE(os.stat(d.sock).st_mode)
        check(mode == 0o660, "default mode %o" % mode)
    finally:
        d.stop()
        d.kill()
    d = Daemon(args=["--socket-mode", "0600"]).start()
    try:
        mode = stat.S_IMODE(os.stat(d.sock).st_mode)
        check(mode == 0o600, "--socket-mode 0600 gave %o" % mode)
    finally:
        d.stop()
        d.kill()
    if os.geteuid() == 0:  # only root may give a file to any group
        d = Daemon(args=["--socket-group", "12345"]).start()
        try:
            check(os.stat(d.sock).st_gid == 12345, "--socket-group gave gid %d" % os.stat(d.sock).st_gid)
        finally:
            d.stop()
            d.kill()
    p = subprocess.run([ANED, "--model", MODEL, "--socket-group", "no-such-group-x"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=10)
    check(p.returncode == 2 and b"no-such-group-x" in p.stderr, "unknown group: %r" % p.stderr)


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[-1].startswith("Z")  # exited, not yet reaped
    except OSError:
        return True


def test_daemonize():
    tmp = mktmp()
    sock = os.path.join(tmp, "d.sock")
    pidf = os.path.join(tmp, "aned.pid")
    logf = os.path.join(tmp, "aned.log")
    pid = None
    try:
        p = subprocess.run([ANED, "--model", MODEL, "--socket", sock, "--daemonize", "--pidfile", pidf,
                            "--log", logf], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        check(p.returncode == 0, "--daemonize exit %d: %r" % (p.returncode, p.stderr))
        with open(pidf) as f:
            pid = int(f.read().strip())
        check(os.path.exists(sock), "not ready when the parent returned")
        check(info(sock)["type"] == "info", "daemon does not answer")
        with open(logf) as f:
            check("listening" in f.read(), "log file lacks the start-up line")
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not os.path.exists(pidf), 10, "the daemon to remove its pidfile")
        wait_for(lambda: _gone(pid), 10, "the daemon to exit")
        pid = None
        check(not os.path.exists(sock) and not os.path.exists(pidf), "socket or pidfile left behind")
        # a failing start reports through the parent's exit status
        p = subprocess.run([ANED, "--model", "/nonexistent.gguf", "--socket", sock, "--daemonize"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        check(p.returncode != 0 and b"/nonexistent.gguf" in p.stderr, "daemonized bad start: %r" % p.stderr)
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_backlog_cap():
    """A client that never reads has its jobs paused, then cancelled (busy) after --stall-timeout."""
    d = Daemon(args=["--max-backlog", "64", "--stall-timeout", "1"]).start()
    try:
        slow = Conn(d.sock)
        slow.hello()
        for i in range(8):
            slow.request("generate", **greedy_req(1500))
        wait_for(lambda: "output backlog" in d.log_text(), 30, "the slow reader's jobs to be cancelled")
        wait_for(lambda: _idle(d.sock), 10, "the cancelled jobs to be freed")
        check("jobs paused" in d.log_text(tail=1 << 30), "pause not logged")
        ends = {}
        while len(ends) < 8:
            m = slow.recv()
            check(m is not None, "closed before every request ended (%d)" % len(ends))
            if m["type"] != "token":
                ends[m["id"]] = m
        busy = [m for m in ends.values() if m["type"] == "error" and m.get("code") == "busy"]
        check(busy, "no request ended with busy: %r" % list(ends.values())[:2])
        ids, _, last = slow.generate(**greedy_req(8))
        check(ids == GREEDY[:8], "the connection is not usable afterwards")
        slow.close()
        check(d.stop() == 0, "exit status")
    finally:
        d.kill()


def test_socket_activation():
    """A socket passed by systemd (LISTEN_FDS) is served, and left in place at exit."""
    sa = shutil.which("systemd-socket-activate")
    if not sa:
        print("    (systemd-socket-activate not installed: skipped)")
        return
    tmp = mktmp()
    sock = os.path.join(tmp, "act.sock")
    logf = os.path.join(tmp, "act.log")
    with open(logf, "wb") as lf:
        p = subprocess.Popen([sa, "-l", sock, ANED, "--model", MODEL, "--socket", "/nonexistent/ignored.sock"],
                             stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: os.path.exists(sock), 10, "the activation socket")
        c = Conn(sock)
        try:
            c.hello()  # the first connection starts aned
            ids, _, last = c.generate(**greedy_req(8))
            check(ids == GREEDY[:8], "activated daemon: %r" % ids)
        finally:
            c.close()
        p.send_signal(signal.SIGTERM)
        check(p.wait(10) == 0, "exit status")
        with open(logf) as f:
            check("systemd socket" in f.read(), "did not use the passed socket")
        check(os.path.exists(sock), "removed a socket it does not own")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_max_clients():
    d = Daemon(args=["--max-clients", "2"]).start()
    try:
        wait_for(lambda: info(d.sock).get("clients") == 1, 5, "start-up probes to be reaped")
        time.sleep(0.1)
        a, b = Conn(d.sock), Conn(d.sock)
        a.hello()
        b.hello()
        c = Conn(d.sock)
        m = c.recv()
        check(m and m["type"] == "error" and m.get("code") == "busy" and m["id"] == 0, "third: %r" % m)
        check(c.recv() is None, "refused connection left open")
        c.close()
        a.close()
        wait_for(lambda: _hello_ok(d.sock), 5, "a slot to free up")
        b.close()
        check(d.stop() == 0, "exit status")
    finally:
        d.kill()


def _hello_ok(path):
    c = Conn(path)
    try:
        c.hello()
        return True
    except (TestFailure, OSError):
        # (still full: the daemon answers "busy" and closes, which a hello
        # sent after the close meets as a broken pipe or a reset)
        return False
    finally:
        c.close()


def _cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().split(") ")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_fd_exhaustion():
    """Out of descriptors, accept errors pause accepting instead of spinning; service resumes."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))

    d = Daemon(preexec=limit).start()
    conns = []
    try:
        for _ in range(40):
            c = Conn(d.sock, timeout=5)
            conns.append(c)
        time.sleep(0.3)
        t0 = _cpu_s(d.proc.pid)
        time.sleep(1.0)
        used = _cpu_s(d.proc.pid) - t0
        check(used < 0.3, "daemon burned %.2f s CPU in 1 s while out of descriptors" % used)
        check("pausing new connections" in d.log_text(tail=1 << 30), "accept failure not logged")
        for c in conns:
            c.close()
        conns = []
        wait_for(lambda: _hello_ok(d.sock), 10, "service to resume")
        check(d.stop() == 0, "exit status")
    finally:
        for c in conns:
            c.close()
        d.kill()


def test_many_connections(d):
    conns = []
    try:
        for _ in range(100):
            c = Conn(d.sock)
            conns.append(c)
        for c in conns[:10]:
            c.hello()
        r = info(d.sock)
        check(r.get("clients", 0) >= 101, "clients %r" % r.get("clients"))
    finally:
        for c in conns:
            c.close()
    wait_for(lambda: info(d.sock).get("clients") == 1, 10, "closed connections to be reaped")


# ------------------------------------------------------------------ runner

def test_big_prompt_while_streaming(d):
    """Prompts of ~1 MB from one client do not hold up another client's
    stream: they are tokenized off the daemon's loop (and off the engine's
    forward passes). Their 'context' errors still come as the requests' only
    events. A liveness check, not a benchmark: the bound is loose."""
    n_big = 4
    big_text = ("Once upon a time there was a little girl named Lily. " * 20000)[:1040000]
    frames = [msgpack.packb(dict(type="generate", id=i + 1, prompt=big_text, max_tokens=8), use_bin_type=True)
              for i in range(n_big)]
    window = {}
    big_res = {}
    stop = threading.Event()
    streams = []   # (token count, largest gap in s, last message)
    during = [0]

    def stream():
        c = Conn(d.sock, timeout=60)
        try:
            c.hello()
            while True:
                rid = c.request("generate", **greedy_req(2000))
                n, gap, last_t = 0, 0.0, None
                while True:
                    m = c.recv()
                    check(m is not None and m.get("id") == rid, "stream: %r" % (m,))
                    t = time.monotonic()
                    if m["type"] != "token":
                        break
                    if last_t is not None:
                        gap = max(gap, t - last_t)
                    last_t = t
                    n += 1
                    if "start" in window and "end" not in window:
                        during[0] += 1
                streams.append((n, gap, m))
                if stop.is_set():
                    return
        finally:
            c.close()

    def big():
        c = Conn(d.sock, timeout=60)
        try:
            c.hello()
            window["start"] = time.monotonic()
            for f in frames:
                c.send_raw(f)
            while len(big_res) < n_big:
                m = c.recv()
                check(m is not None, "big-prompt client: connection closed")
                big_res[m["id"]] = m
            window["end"] = time.monotonic()
        finally:
            c.close()

    st = threading.Thread(target=stream)
    st.start()
    time.sleep(0.05)
    try:
        big()
    finally:
        stop.set()
        st.join(90)
    check(not st.is_alive(), "the stream never ended")
    for i in range(1, n_big + 1):
        m = big_res.get(i)
        check(m is not None and m["type"] == "error" and m.get("code") == "context",
              "1 MB prompt %d: %r" % (i, None if m is None else {k: m[k] for k in m if k != "text"}))
    check(streams, "no stream ended")
    worst = max(g for _, g, _ in streams)
    for n, _, last in streams:
        check(last["type"] == "done" and n == 2000, "stream ended with %r after %d tokens" % (last, n))
    print("    %d MB of prompts in %.2f s; stream: %d tokens during, largest gap %.1f ms"
          % (n_big, window["end"] - window["start"], during[0], worst * 1e3), flush=True)
    check(during[0] > 0, "no stream token arrived while the big prompts were handled")
    check(worst < 1.0, "a stream waited %.2f s between two tokens" % worst)


SHARED = [
    test_hello_ping_info, test_handshake_required, test_greedy_reference, test_eval, test_tokenize,
    test_aneclient_story, test_aneclient_greedy, test_garbage, test_mutated_requests,
    test_bad_requests_keep_connection,
    test_inflight_limit, test_concurrent, test_disconnect_mid_generation, test_cancel,
    test_half_close, test_slow_reader, test_many_connections, test_big_prompt_while_streaming,
]
OWN = [
    test_help, test_missing_model, test_corrupt_model, test_kv_type, test_gpus_bad, test_cpu_repack, test_kv_pool_info, test_tokenizer_only, test_sigterm_mid_generation,
    test_sigint_idle, test_sigterm_during_startup, test_hello_timeout, test_shutdown_grace,
    test_sighup_reopens_log, test_backlog_cap, test_max_clients, test_fd_exhaustion, test_socket_activation, test_stale_socket, test_second_daemon_refuses, test_socket_mode, test_daemonize,
]
TIMEOUT_S = 120


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout("test took longer than %d s" % TIMEOUT_S)


def run(fn, *args):
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    t0 = time.time()
    try:
        fn(*args)
        ok, msg = True, ""
    except Exception as e:
        ok = False
        msg = "%s: %s" % (type(e).__name__, e)
        if not isinstance(e, (TestFailure, Timeout)):
            msg += "\n" + traceback.format_exc()
    finally:
        signal.alarm(0)
    print("%-40s %s (%.2f s)%s" % (fn.__name__, "ok" if ok else "FAIL", time.time() - t0,
                                  "" if ok else "\n    " + msg.replace("\n", "\n    ")), flush=True)
    return ok


def main():
    only = set(sys.argv[1:])
    if not os.access(ANED, os.X_OK):
        print("bin/aned is missing (run make)")
        print("0 passed, 1 failed")
        return 1
    passed = failed = 0
    shared = [t for t in SHARED if not only or t.__name__ in only]
    if shared:
        d = Daemon(args=["--max-seqs", "8"])
        try:
            d.start()
            for t in shared:
                if not d.alive():
                    print("%-40s FAIL (daemon gone)" % t.__name__)
                    failed += 1
                    continue
                if run(t, d):
                    passed += 1
                else:
                    failed += 1
            rc = d.stop()
            if rc != 0:
                print("shared daemon exit status %r\n%s" % (rc, d.log_text()))
                failed += 1
        except Exception as e:
            print("shared daemon: %s" % e)
            failed += 1
        finally:
            d.kill()
    for t in OWN:
        if only and t.__name__ not in only:
            continue
        if run(t):
            passed += 1
        else:
            failed += 1
    for t in TMPDIRS:
        shutil.rmtree(t, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
