#!/usr/bin/python3
"""A catalogue of hostile or broken input to the real bin/aned (private
socket): every case checks the exact error code PROTOCOL.md gives and that
the daemon keeps serving other clients with correct output.

Cases already in test_daemon.py (garbage bytes, a 2 MiB frame, 5000-deep
nesting, a few bad fields, 100 idle connections, a slow reader of long
generations) are not repeated; this extends them to every field and limit.
Ends with "N passed, M failed"."""
import math
import os
import shutil
import socket
import subprocess
import struct
import sys
import threading
import time

import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_daemon import (ANED, FIX, GREEDY, MODEL, TMPDIRS, Conn, Daemon, TestFailure, check,  # noqa: E402
                         greedy_req, info, mktmp, run, wait_for)

N_VOCAB = 512      # stories260K
N_CTX = 512        # --ctx below


def pack_str_raw(b):
    """msgpack str (not bin) holding arbitrary bytes."""
    n = len(b)
    if n < 32:
        return bytes([0xa0 | n]) + b
    if n < 256:
        return b"\xd9" + bytes([n]) + b
    if n < 65536:
        return b"\xda" + struct.pack(">H", n) + b
    return b"\xdb" + struct.pack(">I", n) + b


def pk(obj):
    return msgpack.packb(obj, use_bin_type=True)


def map_raw(pairs):
    """A msgpack map from (key, already-encoded value) pairs."""
    out = bytes([0x80 | len(pairs)])
    for k, v in pairs:
        out += pk(k) + v
    return out


def expect_error(c, rid, code, what):
    m = c.recv()
    check(m is not None, "%s: connection closed instead of error %s" % (what, code))
    check(m.get("type") == "error" and m.get("code") == code and m.get("id") == rid,
          "%s: expected error %s for id %r, got %r" % (what, code, rid, m))
    check(m.get("message"), "%s: error without a message" % what)
    return m


def expect_closed(c, code, what):
    """An error with id 0 (when code is given), then EOF."""
    seen = []
    while True:
        try:
            m = c.recv()
        except (socket.timeout, TimeoutError):
            raise TestFailure("%s: connection neither answered nor closed" % what)
        if m is None:
            break
        seen.append(m)
        check(len(seen) < 5, "%s: too many replies %r" % (what, seen))
    if code:
        errs = [m for m in seen if m.get("type") == "error"]
        check(errs and errs[-1].get("code") == code and errs[-1].get("id") == 0,
              "%s: expected error %s (id 0) then close, got %r" % (what, code, seen))


def still_serving(d, n=8):
    """Another client gets the exact greedy output."""
    check(d.alive(), "daemon died")
    c = Conn(d.sock)
    try:
        c.hello()
        ids, _, last = c.generate(**greedy_req(n))
        check(last["type"] == "done" and ids == GREEDY[:n], "daemon output changed: %r %r" % (ids, last))
    finally:
        c.close()


def fresh(d):
    c = Conn(d.sock, timeout=15)
    c.hello()
    return c


def daemon_fds(d):
    return len(os.listdir("/proc/%d/fd" % d.proc.pid))


def daemon_rss_kb(d):
    with open("/proc/%d/status" % d.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ------------------------------------------------------------------ framing

def test_truncated_frames(d):
    # every proper prefix of a valid request: nothing is answered, the
    # connection waits; completing it later gets the answer.
    full = pk({"type": "generate", "id": 9, **greedy_req(4)})
    c = fresh(d)
    try:
        c.s.settimeout(0.3)
        for cut in (1, 2, len(full) // 2, len(full) - 1):
            c.send_raw(full[:cut])
            try:
                m = c.recv()
                raise TestFailure("answer to a %d-byte prefix: %r" % (cut, m))
            except (socket.timeout, TimeoutError):
                pass
            c.s.settimeout(15)
            c.send_raw(full[cut:])
            ids, _, last = _rest(c, 9)
            check(ids == GREEDY[:4] and last["type"] == "done", "after completing a prefix: %r" % ids)
            c.s.settimeout(0.3)
    finally:
        c.close()
    # a header promising more than is ever sent, then the peer leaves
    for data in (b"\x81\xa4type\xdb\x00\x00\x10\x00ab", b"\xdf\x00\x00\x00\x02", b"\x82\xa4type\xa8generate\xa6tokens\xdd\x00\x00\x00\x05\x01"):
        c = fresh(d)
        c.send_raw(data)
        c.close()
    still_serving(d)


def _rest(c, rid):
    ids = []
    while True:
        m = c.recv()
        check(m is not None, "closed mid-generation")
        check(m.get("id") == rid, "message for another id: %r" % m)
        if m["type"] == "token":
            ids.append(m["token"])
        else:
            return ids, "", m


def test_frame_limits(d):
    # a length header over 1 MiB is refused before its bytes arrive
    for name, data in (("str32 of 2 GiB", b"\x81\xa4type\xdb\x7f\xff\xff\xff"),
                       ("bin32 of 4 GiB", b"\x81\xa3pad\xc6\xff\xff\xff\xff"),
                       ("array32 of 4G", b"\x81\xa3pad\xdd\xff\xff\xff\xff"),
                       ("map32 of 4G", b"\xdf\xff\xff\xff\xff")):
        c = fresh(d)
        try:
            c.send_raw(data)
            expect_closed(c, "too_large", name)
        finally:
            c.close()
    # exactly at the limit is fine as a frame; just over it is not
    base = {"type": "ping", "id": 3, "pad": b""}
    over = len(pk(base))
    c = fresh(d)
    try:
        pad = (1 << 20) - over - 4   # bin32 header grows the pad's encoding
        msg = pk({"type": "ping", "id": 3, "pad": b"x" * pad})
        check(len(msg) <= 1 << 20, "test frame too big: %d" % len(msg))
        c.send_raw(msg)
        m = c.recv()
        check(m and m["type"] == "pong" and m["id"] == 3, "1 MiB frame: %r" % m)
        msg = pk({"type": "ping", "id": 4, "pad": b"x" * (pad + (1 << 20) - len(msg) + 1)})
        check(len(msg) == (1 << 20) + 1, "over-limit frame size %d" % len(msg))
        try:
            c.send_raw(msg)
        except (BrokenPipeError, ConnectionResetError):
            pass   # refused on the header, before all of it was sent
        expect_closed(c, "too_large", "1 MiB + 1 frame")
    finally:
        c.close()
    still_serving(d)


def test_nesting_limit(d):
    # the top-level map is level 1: 7 arrays inside it make 8 levels (ok),
    # 8 arrays make 9 (too_deep, closed)
    def nested(k):
        return b"\x83\xa4type\xa4ping\xa2id\x07\xa3pad" + b"\x91" * k + b"\xc0"
    c = fresh(d)
    try:
        c.send_raw(nested(7))
        m = c.recv()
        check(m and m["type"] == "pong", "8 levels: %r" % m)
        c.send_raw(nested(8))
        expect_closed(c, "too_deep", "9 levels")
    finally:
        c.close()
    # maps nest too
    c = fresh(d)
    try:
        c.send_raw(b"\x83\xa4type\xa4ping\xa2id\x07\xa3pad" + b"\x81\xa1k" * 9 + b"\xc0")
        expect_closed(c, "too_deep", "10 levels of maps")
    finally:
        c.close()
    still_serving(d)


def test_not_a_map(d):
    for name, data in (("top-level array", pk([1, 2])), ("top-level int", pk(7)), ("top-level str", pk("hello")),
                       ("ext type", b"\x81\xa3pad\xd4\x01\x00"), ("0xc1", b"\x81\xa3pad\xc1")):
        c = fresh(d)
        try:
            c.send_raw(data)
            expect_closed(c, "malformed", name)
        finally:
            c.close()
    still_serving(d)


# ------------------------------------------------------------------ fields

# (nil is the same as leaving a key out: see test_nil_is_absent. A float
# where an integer is due is a number of the right kind: a
# non-integral one is invalid_value / invalid_token, see test_numeric_ranges.)
WRONG = {"str": [5, 1.5, True, [1], {"a": 1}],
         "int": ["5", True, [5], {"a": 1}],
         "float": ["0.5", True, [0.5], {"a": 1}],
         "bool": ["true", [1], {"a": 1}, 2.5],
         "ids": ["1 2", 5, {"a": 1}, [1, "2"], [1, [2]], [1, None], [1, True]],
         "strs": ["stop", 5, [1], ["a", 2], ["a", None], {"a": 1}]}
FIELDS = {
    "hello": {"version": "int", "client": "str"},
    "generate": {"prompt": "str", "tokens": "ids", "system": "str", "raw": "bool", "special": "bool",
                 "max_tokens": "int", "temperature": "float", "top_k": "int", "top_p": "float",
                 "min_p": "float", "repeat_penalty": "float", "repeat_last_n": "int", "seed": "int",
                 "stop": "strs"},
    "eval": {"prompt": "str", "tokens": "ids", "system": "str", "raw": "bool", "top": "int"},
    "tokenize": {"text": "str", "special": "bool", "add_bos": "bool"},
    "detokenize": {"tokens": "ids"},
}
BASE = {"generate": {"tokens": [1], "raw": True, "max_tokens": 2, "temperature": 0.0},
        "eval": {"tokens": [1, 2], "raw": True},
        "tokenize": {"text": "hi"},
        "detokenize": {"tokens": [1, 2]}}


def test_wrong_types_every_field(d):
    c = fresh(d)
    n = 0
    try:
        for typ, fields in FIELDS.items():
            for field, kind in fields.items():
                for bad in WRONG[kind]:
                    if typ == "hello":
                        # a second hello is bad_request whatever its fields
                        continue
                    msg = dict(BASE[typ])
                    if field == "prompt":
                        msg.pop("tokens", None)
                    msg[field] = bad
                    rid = 1000 + n
                    n += 1
                    c.send(dict(type=typ, id=rid, **msg))
                    expect_error(c, rid, "bad_request", "%s.%s = %r" % (typ, field, bad))
        # the id itself
        for bad, code in (("7", "bad_request"), ([1], "bad_request"), ({"a": 1}, "bad_request"),
                          (True, "bad_request"), (-1, "invalid_value"), (1.5, "invalid_value")):
            c.send({"type": "ping", "id": bad})
            m = c.recv()
            check(m and m["type"] == "error" and m["code"] == code and m["id"] == 0, "id %r: %r" % (bad, m))
        for bad in (5, None, b"ping", ["ping"]):
            c.send({"type": bad, "id": 5})
            m = c.recv()
            check(m and m["type"] == "error" and m["code"] in ("bad_request",), "type %r: %r" % (bad, m))
        c.send({"id": 5})
        m = c.recv()
        check(m and m["type"] == "error" and m["code"] == "bad_request", "no type: %r" % m)
        # missing required fields; both prompt and tokens
        for typ, msg in (("generate", {}), ("eval", {}), ("tokenize", {}), ("detokenize", {}),
                         ("generate", {"prompt": "a", "tokens": [1]}), ("eval", {"prompt": "a", "tokens": [1]})):
            rid = 5000 + n
            n += 1
            c.send(dict(type=typ, id=rid, **msg))
            expect_error(c, rid, "bad_request", "%s %r" % (typ, msg))
        # still a good connection
        ids, _, last = c.generate(**greedy_req(6))
        check(ids == GREEDY[:6], "after %d bad requests: %r" % (n, ids))
    finally:
        c.close()
    # wrong types in hello: the handshake fails with bad_request
    for field, bad in (("version", "1"), ("version", None), ("client", 5), ("client", [1])):
        c = Conn(d.sock, timeout=15)
        try:
            c.send({"type": "hello", "id": 0, "version": 1, "client": "t", field: bad})
            m = c.recv()
            check(m is not None and m.get("type") == "error" and m.get("code") in ("bad_request", "version"),
                  "hello.%s = %r: %r" % (field, bad, m))
        finally:
            c.close()
    still_serving(d)


def test_nil_is_absent(d):
    # nil fields take their defaults; a nil prompt and nil tokens is "missing"
    c = fresh(d)
    try:
        ids, _, last = c.generate(**dict(greedy_req(6), system=None, stop=None, seed=None, top_k=None,
                                         special=None, prompt=None))
        check(ids == GREEDY[:6], "nil optional fields: %r" % ids)
        c.send(dict(type="generate", id=9, prompt=None, tokens=None))
        expect_error(c, 9, "bad_request", "nil prompt and tokens")
    finally:
        c.close()


def test_numeric_ranges(d):
    c = fresh(d)
    nan, inf = float("nan"), float("inf")
    cases = [("max_tokens", PROTO_MAX_GEN + 1), ("max_tokens", 1 << 40), ("max_tokens", -1),
             ("max_tokens", 2 ** 64 - 1),
             ("temperature", nan), ("temperature", -0.001), ("temperature", -inf), ("temperature", inf),
             ("temperature", 100.5),
             ("top_p", nan), ("top_p", -0.1), ("top_p", 1.01), ("min_p", nan), ("min_p", -1.0), ("min_p", 2.0),
             ("repeat_penalty", 0.0), ("repeat_penalty", -1.0), ("repeat_penalty", nan), ("repeat_penalty", 100.5),
             ("repeat_penalty", inf),
             ("top_k", -1), ("top_k", 1 << 31), ("repeat_last_n", -5), ("repeat_last_n", 131073),
             ("seed", -1), ("max_tokens", 1.5), ("top_k", 2.5), ("max_tokens", float("nan"))]
    try:
        for i, (field, val) in enumerate(cases):
            rid = 100 + i
            c.send(dict(type="generate", id=rid, **dict(greedy_req(2), **{field: val})))
            expect_error(c, rid, "invalid_value", "generate %s=%r" % (field, val))
        for i, top in enumerate((0, 101, -1, 1 << 33)):
            c.send(dict(type="eval", id=300 + i, tokens=[1, 2], raw=True, top=top))
            expect_error(c, 300 + i, "invalid_value", "eval top=%r" % top)
        c.send(dict(type="generate", id=399, tokens=[1, 2.5], raw=True))
        expect_error(c, 399, "invalid_token", "token id 2.5")
        # empty token list for generate/eval; empty stop string
        c.send(dict(type="generate", id=400, tokens=[], raw=True))
        expect_error(c, 400, "invalid_value", "empty tokens")
        c.send(dict(type="generate", id=401, **dict(greedy_req(2), stop=[""])))
        expect_error(c, 401, "invalid_value", "empty stop string")
        # float values with integral value are accepted for int fields
        c.send(dict(type="generate", id=402, **dict(greedy_req(2), max_tokens=3.0)))
        ids, _, last = _rest(c, 402)
        check(ids == GREEDY[:3], "max_tokens 3.0: %r" % ids)
        # the extremes that are allowed work
        c.send(dict(type="generate", id=403, **dict(greedy_req(2), top_k=2 ** 31 - 1, top_p=1.0, min_p=0.0,
                                                     repeat_penalty=100.0, repeat_last_n=131072,
                                                     seed=2 ** 64 - 1)))
        ids, _, last = _rest(c, 403)
        check(last["type"] == "done" and len(ids) == 2, "extreme-but-valid values: %r" % last)
        # a huge max_tokens that is allowed ends at the context, not in a hang or crash
        c.send(dict(type="generate", id=404, tokens=[1], raw=True, temperature=0.0, max_tokens=PROTO_MAX_GEN))
        ids, _, last = _rest(c, 404)
        check(last["type"] == "done" and last.get("finish") == "length" and 0 < len(ids) < N_CTX,
              "max_tokens 1048576 on a %d context: %d tokens, %r" % (N_CTX, len(ids), last))
    finally:
        c.close()
    still_serving(d)


PROTO_MAX_GEN = 1048576


def test_tokens_out_of_range(d):
    c = fresh(d)
    try:
        for i, bad in enumerate((N_VOCAB, N_VOCAB + 1, 2 ** 31 - 1, 2 ** 32 + 1, 2 ** 63)):
            c.send(dict(type="generate", id=10 + i, tokens=[1, bad], raw=True, max_tokens=2))
            expect_error(c, 10 + i, "invalid_token", "generate token %d" % bad)
            c.send(dict(type="eval", id=20 + i, tokens=[1, bad], raw=True))
            expect_error(c, 20 + i, "invalid_token", "eval token %d" % bad)
            c.send(dict(type="detokenize", id=30 + i, tokens=[bad]))
            expect_error(c, 30 + i, "invalid_token", "detokenize token %d" % bad)
        for i, bad in enumerate((-1, -(2 ** 31), -(2 ** 63))):
            c.send(dict(type="generate", id=40 + i, tokens=[1, bad], raw=True, max_tokens=2))
            m = c.recv()
            check(m and m["type"] == "error" and m["code"] in ("invalid_token", "invalid_value") and m["id"] == 40 + i,
                  "negative token %d: %r" % (bad, m))
        # the last valid id is fine
        c.send(dict(type="detokenize", id=50, tokens=[N_VOCAB - 1]))
        m = c.recv()
        check(m and m["type"] == "text", "last id: %r" % m)
        # over the per-request id limit (still under 1 MiB)
        c.send(dict(type="detokenize", id=51, tokens=[5] * 131073))
        expect_error(c, 51, "too_large", "131073 ids")
    finally:
        c.close()
    still_serving(d)


def test_context_overflow(d):
    c = fresh(d)
    try:
        c.send(dict(type="generate", id=1, tokens=[1] * (N_CTX + 1), raw=True, max_tokens=1))
        expect_error(c, 1, "context", "tokens over the context")
        c.send(dict(type="eval", id=2, tokens=[1] * (N_CTX + 1), raw=True))
        expect_error(c, 2, "context", "eval over the context")
        c.send(dict(type="generate", id=3, prompt="Once upon a time " * 400, raw=True, max_tokens=1))
        expect_error(c, 3, "context", "text prompt over the context")
        # exactly filling the context is allowed: it ends at once with "length"
        c.send(dict(type="generate", id=5, tokens=[1] * (N_CTX - 1), raw=True, max_tokens=8, temperature=0.0))
        ids, _, last = _rest(c, 5)
        check(last["type"] == "done" and len(ids) <= 1, "prompt filling the context: %d tokens %r" % (len(ids), last))
        # a prompt over the text limit
        c.send_raw(map_raw([("type", pk("tokenize")), ("id", pk(6)), ("text", pack_str_raw(b"a" * 1044481))]))
        expect_error(c, 6, "too_large", "tokenize text over 1044480 bytes")
    finally:
        c.close()
    still_serving(d)


def test_limits_of_lists_and_names(d):
    c = fresh(d)
    try:
        c.send(dict(type="generate", id=1, **dict(greedy_req(2), stop=["a"] * 17)))
        expect_error(c, 1, "too_large", "17 stop strings")
        c.send(dict(type="generate", id=2, **dict(greedy_req(2), stop=["x" * 257])))
        expect_error(c, 2, "too_large", "257-byte stop string")
        c.send(dict(type="generate", id=3, **dict(greedy_req(2), stop=["a"] * 16, unknown_field={"x": [1]})))
        ids, _, last = _rest(c, 3)
        check(last["type"] == "done", "16 stop strings and an unknown field: %r" % last)
    finally:
        c.close()
    c = Conn(d.sock, timeout=15)
    try:
        c.send(dict(type="hello", id=0, version=1, client="n" * 257))
        m = c.recv()
        check(m and m["type"] == "error" and m["code"] == "too_large", "257-byte client name: %r" % m)
    finally:
        c.close()
    still_serving(d)


def test_invalid_utf8(d):
    bad_texts = [b"\xff", b"abc\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\xe2\x82"]
    c = fresh(d)
    n = 0
    try:
        for b in bad_texts:
            for typ, field, rest in (("generate", "prompt", [("raw", pk(True)), ("max_tokens", pk(2))]),
                                     ("generate", "system", [("prompt", pk("hi")), ("max_tokens", pk(2))]),
                                     ("eval", "prompt", [("raw", pk(True))]),
                                     ("tokenize", "text", [])):
                rid = 70 + n
                n += 1
                c.send_raw(map_raw([("type", pk(typ)), ("id", pk(rid)), (field, pack_str_raw(b))] + rest))
                expect_error(c, rid, "invalid_utf8", "%s.%s = %r" % (typ, field, b))
            rid = 70 + n
            n += 1
            c.send_raw(map_raw([("type", pk("generate")), ("id", pk(rid)), ("tokens", pk([1])),
                                ("max_tokens", pk(2)), ("stop", b"\x91" + pack_str_raw(b))]))
            expect_error(c, rid, "invalid_utf8", "stop = %r" % b)
            # bin in place of str must hold UTF-8 too
            rid = 70 + n
            n += 1
            c.send(dict(type="tokenize", id=rid, text=b"x" + b))
            expect_error(c, rid, "invalid_utf8", "bin text %r" % b)
        # U+0000 and 4-byte characters are valid
        c.send_raw(map_raw([("type", pk("tokenize")), ("id", pk(1)), ("text", pack_str_raw("a\0b\U0001F600".encode()))]))
        m = c.recv()
        check(m and m["type"] == "tokens", "valid UTF-8 with NUL: %r" % m)
        # a generated text event is always valid UTF-8, even for byte tokens (<0x..>)
        c.send(dict(type="generate", id=2, tokens=[1] + list(range(3, 259)), raw=True, max_tokens=4, temperature=0.0))
        while True:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] != "token":
                break
            check(isinstance(m.get("text", ""), str), "token text not a str: %r" % m)
        check(m["type"] == "done", "byte-token prompt: %r" % m)
        c.send(dict(type="detokenize", id=3, tokens=list(range(3, 259))))
        m = c.recv()
        check(m and m["type"] == "text" and isinstance(m["text"], str), "detokenize byte tokens: %r" % m)
    finally:
        c.close()
    c = Conn(d.sock, timeout=15)
    try:
        c.send_raw(map_raw([("type", pk("hello")), ("id", pk(0)), ("version", pk(1)), ("client", pack_str_raw(b"\xff"))]))
        m = c.recv()
        check(m and m["type"] == "error" and m["code"] == "invalid_utf8", "hello client name invalid: %r" % m)
    finally:
        c.close()
    still_serving(d)


def test_requests_after_cancel(d):
    c = fresh(d)
    try:
        # cancel a running job, then reuse its id at once: the old one ends
        # cancelled, the new one runs in full
        c.request("generate", id=5, **greedy_req(1500))
        m = c.recv()
        check(m and m["type"] == "token", "first token: %r" % m)
        c.request("cancel", id=5)
        c.request("cancel", id=5)          # twice: ignored
        while True:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] != "token":
                break
        check(m["type"] == "done" and m.get("finish") == "cancelled" and m["id"] == 5, "cancelled: %r" % m)
        ids, _, last = c.generate(id=5, **greedy_req(16))
        check(ids == GREEDY[:16] and last["type"] == "done", "same id after cancel: %r" % ids)
        c.request("cancel", id=5)          # finished: ignored
        # cancel sent before the request it names: ignored, the request runs
        c.request("cancel", id=6)
        ids, _, last = c.generate(id=6, **greedy_req(8))
        check(ids == GREEDY[:8], "request after an early cancel: %r" % ids)
        # cancel a queued job among many; every other job still completes
        for i in range(10):
            c.request("generate", id=100 + i, **greedy_req(40))
        for i in range(0, 10, 3):
            c.request("cancel", id=100 + i)
        ends = {}
        toks = {}
        while len(ends) < 10:
            m = c.recv()
            check(m is not None, "closed")
            if m["type"] == "token":
                toks.setdefault(m["id"], []).append(m["token"])
            else:
                ends[m["id"]] = m
        for i in range(10):
            e = ends[100 + i]
            check(e["type"] == "done", "job %d: %r" % (i, e))
            if i % 3:
                check(toks.get(100 + i) == GREEDY[:40] and e["finish"] == "length", "job %d output %r" % (i, toks.get(100 + i)))
            else:
                check(e["finish"] in ("cancelled", "length"), "cancelled job %d: %r" % (i, e))
        check(c.call("ping")["type"] == "pong", "ping after cancels")
    finally:
        c.close()
    # cancel then disconnect at once
    c = fresh(d)
    c.request("generate", id=1, **greedy_req(1500))
    c.request("cancel", id=1)
    c.close()
    wait_for(lambda: info(d.sock).get("active") == 0, 10, "the cancelled job to leave")
    still_serving(d)


def test_hello_flood(d):
    # many hellos on one connection: the first is answered, every other one
    # is bad_request, and the connection keeps working
    c = Conn(d.sock, timeout=30)
    try:
        n = 2000
        c.send_raw(b"".join(pk({"type": "hello", "id": i, "version": 1, "client": "flood"}) for i in range(n)))
        m = c.recv()
        check(m and m["type"] == "hello", "first hello: %r" % m)
        for i in range(1, n):
            m = c.recv()
            check(m and m["type"] == "error" and m["code"] == "bad_request" and m["id"] == i,
                  "hello #%d: %r" % (i, m))
        ids, _, last = c.generate(**greedy_req(8))
        check(ids == GREEDY[:8], "after a hello flood: %r" % ids)
    finally:
        c.close()
    # many connections each sending hello and leaving without reading
    for _ in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        s.sendall(pk({"type": "hello", "id": 0, "version": 1}) + pk({"type": "generate", "id": 1, **greedy_req(50)}))
        s.close()
    wait_for(lambda: info(d.sock).get("clients") == 1 and info(d.sock).get("active") == 0 and
             info(d.sock).get("queued") == 0, 30, "200 dropped connections to be reaped")
    still_serving(d)


def test_thousand_connections(d):
    base_fds = daemon_fds(d)
    conns = []
    try:
        for i in range(1000):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            end = time.time() + 10
            while True:
                try:
                    s.connect(d.sock)
                    break
                except BlockingIOError:   # the listen backlog is full: retry as a client would
                    if time.time() > end:
                        raise
                    time.sleep(0.01)
            conns.append(s)
            if i % 4 == 0:   # a quarter say hello (unread reply), some ask for work
                try:
                    s.sendall(pk({"type": "hello", "id": 0, "version": 1}))
                    if i % 8 == 0:
                        s.sendall(pk({"type": "generate", "id": 1, **greedy_req(20)}))
                except OSError:
                    pass   # over --max-clients: refused and closed by the daemon
    except OSError as e:
        raise TestFailure("connection %d refused: %s" % (len(conns), e))
    finally:
        # dropped in a random-ish order, some with a reset (SO_LINGER 0)
        for i, s in enumerate(conns):
            if i % 3 == 0:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
    wait_for(lambda: info(d.sock).get("clients") == 1 and info(d.sock).get("active") == 0 and
             info(d.sock).get("queued") == 0, 60, "1000 connections to be reaped")
    wait_for(lambda: daemon_fds(d) <= base_fds, 10, "the daemon's fds to return to %d (now %d)" % (base_fds, daemon_fds(d)))
    still_serving(d)


def test_never_reads_requests(d):
    """A client that floods requests and never reads: the daemon stops
    reading it (back-pressure) instead of buffering without bound, others are
    served, and its memory is returned once it goes."""
    rss0 = daemon_rss_kb(d)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    s.connect(d.sock)
    s.sendall(pk({"type": "hello", "id": 0, "version": 1}))
    sent = [0]
    stop = [False]
    ping = b"".join(pk({"type": "ping", "id": i, "pad": "p" * 200}) for i in range(64))

    def flood():
        s.settimeout(0.5)
        while not stop[0] and sent[0] < (200 << 20):
            try:
                s.sendall(ping)
                sent[0] += len(ping)
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return

    t = threading.Thread(target=flood)
    t.start()
    try:
        time.sleep(3)
        for _ in range(3):
            c = fresh(d)
            try:
                ids, _, last = c.generate(**greedy_req(16))
                check(ids == GREEDY[:16], "served beside a flooding non-reader: %r" % ids)
            finally:
                c.close()
        grown = daemon_rss_kb(d) - rss0
        check(grown < 64 * 1024, "daemon grew %d KiB for a non-reader (%d bytes sent)" % (grown, sent[0]))
        check(sent[0] < (200 << 20), "the daemon read 200 MiB from a client that never reads")
    finally:
        stop[0] = True
        t.join(10)
        s.close()
    wait_for(lambda: info(d.sock).get("clients") == 1, 15, "the flooding client to be reaped")
    still_serving(d)


# ------------------------------------------------------------------ model files
# Each case starts its own daemon on a copy of the model, then changes the
# copy as users do (cp other.gguf model.gguf truncates the file in place,
# then writes). The daemon must not die (a read past a truncated end is a
# SIGBUS): requests get model_changed, ping and info go on, one log line.

OTHER_MODEL = os.path.join(FIX, "models", "qwen2-tiny.bf16.gguf")


def _truncate(path):
    os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))


def _cp_other(path):
    with open(OTHER_MODEL, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:      # O_TRUNC, then the other file's bytes
        f.write(data)


def _same_size(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for i in range(len(data) // 2, len(data)):
        data[i] ^= 0x5a
    fd = os.open(path, os.O_WRONLY)  # in place, no truncation
    os.pwrite(fd, bytes(data), 0)
    os.close(fd)


def _on_copy():
    tmp = mktmp()
    path = os.path.join(tmp, "model.gguf")
    shutil.copyfile(MODEL, path)
    return Daemon(model=path, args=["--ctx", str(N_CTX)], tmp=tmp).start(), path


def _confined(d):
    """The daemon runs under its seccomp filter and Landlock, as by default
    (the SIGBUS handler and the file checks must work there), unless this
    is a sanitizer build, which leaves both off."""
    log = d.log_text(1 << 20)
    if "sanitizer build: seccomp filter off" in log:
        return
    check("seccomp filter installed (enforce)" in log, "seccomp filter not on: %s" % log[-2000:])
    check("landlock (ABI" in log or "landlock not available" in log, "landlock not on: %s" % log[-2000:])


def _after_change(d, c, path):
    """model_changed for a new request; ping, info, tokenize answered; logged once."""
    _confined(d)
    rid = c.request("generate", **greedy_req(8))
    m = expect_error(c, rid, "model_changed", "generate after the model file changed")
    check(path in m.get("message", ""), "message does not name the file: %r" % m)
    rid = c.request("eval", tokens=[1, 2, 3], top=3)
    expect_error(c, rid, "model_changed", "eval after the model file changed")
    check(c.call("ping").get("type") == "pong", "ping after the change")
    r = c.call("info")
    check(r.get("type") == "info" and r.get("n_vocab") == N_VOCAB, "info after the change: %r" % r)
    r = c.call("tokenize", text="Once upon a time")
    check(r.get("type") == "tokens" and len(r.get("tokens", [])) > 2, "tokenize after the change: %r" % r)
    check(d.alive(), "daemon died")
    wait_for(lambda: "changed on disk after load" in d.log_text(1 << 20), 5, "the log line")
    log = d.log_text(1 << 20)
    check(log.count("until then requests fail with model_changed") == 1 and path in log,
          "one error line expected; log: %s" % log[-2000:])


def _model_change_case(mutate):
    d, path = _on_copy()
    try:
        c = fresh(d)
        ids, _, last = c.generate(**greedy_req(8))
        check(last["type"] == "done" and ids == GREEDY[:8], "before the change: %r %r" % (ids, last))
        time.sleep(0.05)   # past the file system's timestamp granularity
        mutate(path)
        _after_change(d, c, path)
        c.close()
        rc = d.stop()
        check(rc == 0, "exit status %r after a model change\n%s" % (rc, d.log_text()))
    finally:
        d.kill()


def test_model_truncated():
    _model_change_case(_truncate)


def test_model_cp_other():
    _model_change_case(_cp_other)


def test_model_same_size_rewrite():
    _model_change_case(_same_size)


def test_model_truncated_mid_generation():
    """Truncated while 6 streams generate: the pass that reads past the end
    finds zero pages; every stream ends with model_changed; the daemon lives."""
    d, path = _on_copy()
    try:
        c = fresh(d)
        rids = [c.request("generate", tokens=[1], raw=True, temperature=1.0, seed=i + 1, max_tokens=400)
                for i in range(6)]
        first = c.recv()
        check(first is not None and first.get("type") == "token", "first event: %r" % (first,))
        _truncate(path)
        ended, changed = set(), 0
        while len(ended) < len(rids):
            m = c.recv()
            check(m is not None, "connection closed mid-generation")
            if m["type"] in ("done", "error"):
                ended.add(m["id"])
                if m["type"] == "error":
                    check(m.get("code") == "model_changed", "stream ended with %r" % m)
                    changed += 1
        check(changed > 0, "no stream ended with model_changed")
        _after_change(d, c, path)
        c.close()
        check(d.stop() == 0, "exit status after a model change\n%s" % d.log_text())
    finally:
        d.kill()


def test_model_renamed_over():
    """A rename over the path leaves the loaded file whole: served on, warned."""
    d, path = _on_copy()
    try:
        shutil.copyfile(OTHER_MODEL, path + ".new")
        os.rename(path + ".new", path)
        c = fresh(d)
        ids, _, last = c.generate(**greedy_req(8))
        check(last["type"] == "done" and ids == GREEDY[:8], "after a rename over it: %r %r" % (ids, last))
        c.close()
        wait_for(lambda: "was replaced on disk" in d.log_text(1 << 20), 5, "the warning")
        check(d.stop() == 0, "exit status\n%s" % d.log_text())
    finally:
        d.kill()


def _start_refused(model, needles):
    """aned on this model exits at once (no hang) with a message holding needles."""
    tmp = mktmp()
    sock = os.path.join(tmp, "s.sock")
    try:
        p = subprocess.run([ANED, "--model", model, "--socket", sock], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    except subprocess.TimeoutExpired:
        raise TestFailure("aned --model %s did not exit within 20 s (blocked, or serving it)" % model)
    out = p.stdout.decode("utf-8", "replace")
    check(p.returncode != 0, "aned started on %s" % model)
    for n in needles:
        check(n in out, "message lacks %r: %r" % (n, out))


def test_model_fifo():
    tmp = mktmp()
    fifo = os.path.join(tmp, "model.gguf")
    os.mkfifo(fifo)
    _start_refused(fifo, [fifo, "FIFO"])
    hf = os.path.join(tmp, "hf")
    shutil.copytree(os.path.join(FIX, "hf", "qwen2-tiny"), hf)
    for name in ("config.json", "tokenizer.json"):
        p = os.path.join(hf, name)
        keep = p + ".keep"
        os.rename(p, keep)
        os.mkfifo(p)
        _start_refused(hf, [p, "FIFO"])
        os.unlink(p)
        os.rename(keep, p)


def test_model_bad_metadata():
    """A config.json field of the wrong JSON type: refused naming file and field."""
    tmp = mktmp()
    hf = os.path.join(tmp, "hf")
    shutil.copytree(os.path.join(FIX, "hf", "qwen2-tiny"), hf)
    import json
    cfgp = os.path.join(hf, "config.json")
    with open(cfgp) as f:
        cfg = json.load(f)
    cfg["hidden_size"] = [64, 1]
    with open(cfgp, "w") as f:
        json.dump(cfg, f)
    _start_refused(hf, [cfgp, "hidden_size", "expected an integer"])


OWN_TESTS = [test_model_truncated, test_model_cp_other, test_model_same_size_rewrite,
             test_model_truncated_mid_generation, test_model_renamed_over, test_model_fifo, test_model_bad_metadata]


# ------------------------------------------------------------------ runner

TESTS = [test_truncated_frames, test_frame_limits, test_nesting_limit, test_not_a_map,
         test_wrong_types_every_field, test_nil_is_absent, test_numeric_ranges, test_tokens_out_of_range, test_context_overflow,
         test_limits_of_lists_and_names, test_invalid_utf8, test_requests_after_cancel, test_hello_flood,
         test_thousand_connections, test_never_reads_requests]


def main():
    only = set(sys.argv[1:])
    if not os.access(ANED, os.X_OK):
        print("bin/aned is missing (run make)")
        print("0 passed, 1 failed")
        return 1
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    except (ValueError, OSError):
        pass
    passed = failed = 0
    d = Daemon(args=["--max-seqs", "8", "--ctx", str(N_CTX)])
    try:
        d.start()
        for t in TESTS:
            if only and t.__name__ not in only:
                continue
            if not d.alive():
                print("%-40s FAIL (daemon gone)\n%s" % (t.__name__, d.log_text()))
                failed += 1
                continue
            if run(t, d):
                passed += 1
            else:
                failed += 1
        rc = d.stop()
        if rc != 0:
            print("daemon exit status %r\n%s" % (rc, d.log_text()))
            failed += 1
    except Exception as e:
        print("daemon: %s" % e)
        failed += 1
    finally:
        d.kill()
    for t in OWN_TESTS:
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
