#!/usr/bin/python3
"""Integration tests of aned-http, the OpenAI-compatible gateway: real bin/aned
daemons on private sockets (qwen2-tiny with its ChatML template for chat,
stories260K for raw completions) and bin/aned-http on free loopback ports,
driven with curl and with Python's standard library as an OpenAI-style client.

Every process started here is killed in a finally. Ends with
"N passed, M failed"; exits non-zero on any failure."""
import http.client
import json
import os
import select
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
import urllib.error
import urllib.parse
import urllib.request

import msgpack

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ANED = os.path.join(ROOT, "bin", "aned")
GW = os.path.join(ROOT, "bin", "aned-http")
FIX = os.path.join(ROOT, "tests", "fixtures", "models")
CHAT_MODEL = os.path.join(FIX, "qwen2-tiny.bf16.gguf")
RAW_MODEL = os.path.join(FIX, "stories260K.gguf")
# Greedy text from BOS (tests/fixtures/refs/stories260K.md).
GREEDY_TEXT = "Once upon a time, there was a little girl named Lily."
CURL = shutil.which("curl")


class TestFailure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


# ------------------------------------------------------------------ processes

class Daemon:
    def __init__(self, tmp, model, name):
        self.sock = os.path.join(tmp, name + ".sock")
        self.log = os.path.join(tmp, name + ".log")
        self.model = model
        self.proc = None

    def start(self):
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen([ANED, "--model", self.model, "--socket", self.sock],
                                     stdin=subprocess.DEVNULL, stdout=self.logf, stderr=subprocess.STDOUT)
        end = time.time() + 30
        while time.time() < end:
            check(self.proc.poll() is None, "aned exited during start-up: %s" % self.tail())
            try:
                c = Raw(self.sock)
                c.close()
                return self
            except OSError:
                time.sleep(0.05)
        raise TestFailure("aned not ready: %s" % self.tail())

    def tail(self):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self.logf.close()
        except Exception:
            pass


class Raw:
    """A raw protocol connection to aned, to look at its state."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5)
        self.s.connect(path)
        self.u = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.s.sendall(msgpack.packb({"type": "hello", "id": 0, "version": 1, "client": "test_http"}))
        check(self.next()["type"] == "hello", "hello")

    def next(self):
        while True:
            for m in self.u:
                return m
            d = self.s.recv(65536)
            if not d:
                raise OSError("closed")
            self.u.feed(d)

    def info(self):
        self.s.sendall(msgpack.packb({"type": "info", "id": 1}))
        while True:
            m = self.next()
            if m.get("id") == 1:
                return m

    def call(self, **req):
        """Sends one request (id 9); returns its events up to the terminal one."""
        self.s.sendall(msgpack.packb(dict(req, id=9)))
        out = []
        while True:
            m = self.next()
            if m.get("id") != 9:
                continue
            out.append(m)
            if m["type"] in ("done", "error", "tokens", "text", "info", "pong"):
                return out

    def close(self):
        self.s.close()


class Gateway:
    def __init__(self, sock, *args):
        self.args = [GW, "--socket", sock] + list(args)
        if not any(a == "--listen" for a in args):
            self.args += ["--listen", "127.0.0.1:0"]
        listen = self.args[self.args.index("--listen") + 1]
        # TCP without a key must be asked for (test_http_guard.py checks the refusal)
        if not listen.startswith("unix:") and "--api-key-file" not in args:
            self.args.append("--insecure-no-key")
        self.proc = None
        self.port = None
        self.err = tempfile.TemporaryFile()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.err)
        r, _, _ = select.select([self.proc.stdout], [], [], 10)
        check(r, "aned-http printed nothing")
        line = self.proc.stdout.readline().decode()
        check(line.startswith("aned-http listening on "), "aned-http said %r (%s)" % (line, self.stderr()))
        where = line.split()[3]
        if not where.startswith("unix:"):
            self.port = int(where.rsplit(":", 1)[1])
        return self

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")[-2000:]

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return None


# ------------------------------------------------------------------ HTTP helpers

def post(gw, path, body, headers=None, timeout=60):
    """(status, headers, parsed JSON or raw bytes)."""
    data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(gw.url(path), data=data, headers=h, method="POST")
    return _do(req, timeout)


def get(gw, path, headers=None, timeout=30, method="GET"):
    req = urllib.request.Request(gw.url(path), headers=headers or {}, method=method)
    return _do(req, timeout)


def _do(req, timeout):
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            st, hd = r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, st, hd = e.read(), e.code, e.headers
    try:
        return st, hd, json.loads(raw) if raw else None
    except ValueError:
        return st, hd, raw


def sse_events(lines):
    """Data payloads of an SSE stream (an iterable of byte lines)."""
    out = []
    for line in lines:
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data: "):
            p = line[6:]
            out.append(p.decode() if p == b"[DONE]" else json.loads(p))
    return out


def stream(gw, path, body, headers=None, timeout=60):
    """An OpenAI-style streaming client: (status, content-type, events)."""
    body = dict(body, stream=True)
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    h.update(headers or {})
    req = urllib.request.Request(gw.url(path), data=json.dumps(body).encode(), headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type"), sse_events(r)
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), json.loads(e.read())


def curl(*args, data=None):
    cmd = [CURL, "-sS", "--max-time", "60"] + list(args)
    r = subprocess.run(cmd, input=data, capture_output=True, timeout=90)
    return r.returncode, r.stdout, r.stderr


def is_error(body, code=None):
    ok = isinstance(body, dict) and isinstance(body.get("error"), dict) \
        and isinstance(body["error"].get("message"), str) and isinstance(body["error"].get("type"), str) \
        and "param" in body["error"] and "code" in body["error"]
    return ok and (code is None or body["error"]["code"] == code)


def wait_idle(daemon, timeout=10):
    """Waits until the daemon runs and queues nothing; returns its info."""
    c = Raw(daemon.sock)
    try:
        end = time.time() + timeout
        while True:
            i = c.info()
            if i["active"] == 0 and i["queued"] == 0:
                return i
            if time.time() > end:
                raise TestFailure("daemon still busy: active %d queued %d" % (i["active"], i["queued"]))
            time.sleep(0.05)
    finally:
        c.close()


# ------------------------------------------------------------------ tests

def t_health_models(env):
    st, _, b = get(env.gw_chat, "/health")
    check(st == 200 and b == {"status": "ok"}, "health %s %r" % (st, b))
    st, _, b = get(env.gw_chat, "/v1/models")
    check(st == 200 and b["object"] == "list" and len(b["data"]) == 1, "models %s %r" % (st, b))
    m = b["data"][0]
    check(m["object"] == "model" and isinstance(m["id"], str) and m["id"] and isinstance(m["created"], int)
          and m["owned_by"] == "aned", "model %r" % m)
    check(m["meta"]["chat_template"] == "tokenizer.chat_template" and m["meta"]["n_ctx"] > 0, "meta %r" % m)
    st, _, one = get(env.gw_chat, "/v1/models/" + urllib.parse.quote(m["id"]))
    check(st == 200 and one["id"] == m["id"], "model by id %s %r" % (st, one))
    st, _, b = get(env.gw_chat, "/v1/models/gpt-nothing")
    check(st == 404 and is_error(b, "model_not_found"), "unknown model %s %r" % (st, b))
    env.chat_model = m["id"]


def t_completions_curl(env):
    body = json.dumps({"model": "anything", "prompt": [1], "max_tokens": 12, "temperature": 0})
    rc, out, err = curl("-H", "Content-Type: application/json", "-d", body, env.gw_raw.url("/v1/completions"))
    check(rc == 0, "curl: %s" % err)
    b = json.loads(out)
    check(b["object"] == "text_completion" and b["id"].startswith("cmpl-") and isinstance(b["created"], int),
          "shape %r" % b)
    check(len(b["choices"]) == 1, "choices %r" % b)
    c = b["choices"][0]
    check(c["index"] == 0 and c["finish_reason"] == "length" and c["logprobs"] is None, "choice %r" % c)
    check(GREEDY_TEXT.startswith(c["text"]) and len(c["text"]) > 20, "greedy text %r" % c["text"])
    u = b["usage"]
    check(u["prompt_tokens"] == 1 and u["completion_tokens"] == 12 and u["total_tokens"] == 13, "usage %r" % u)
    # The same request streamed with curl -N gives the same text.
    body = json.dumps({"prompt": [1], "max_tokens": 12, "temperature": 0, "stream": True})
    rc, out, err = curl("-N", "-d", body, env.gw_raw.url("/v1/completions"))
    check(rc == 0, "curl stream: %s" % err)
    ev = sse_events(out.splitlines(True))
    check(ev and ev[-1] == "[DONE]", "stream ends with [DONE]: %r" % ev[-2:])
    chunks = ev[:-1]
    check(all(x["object"] == "text_completion" and x["id"] == chunks[0]["id"] for x in chunks), "chunk ids")
    text = "".join(x["choices"][0]["text"] for x in chunks)
    check(text == c["text"], "streamed %r vs %r" % (text, c["text"]))
    check(chunks[-1]["choices"][0]["finish_reason"] == "length", "last chunk %r" % chunks[-1])
    check(all(x["choices"][0]["finish_reason"] is None for x in chunks[:-1]), "finish only at the end")
    # Without a Content-Type (curl -d sends a form type): still JSON.
    rc, out, _ = curl("-d", '{"prompt":"Once upon a time","max_tokens":4}', env.gw_raw.url("/v1/completions"))
    check(rc == 0 and json.loads(out)["usage"]["completion_tokens"] == 4, "form type %r" % out)


def t_completions_python(env):
    gw = env.gw_raw
    req = {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}
    st, _, b = post(gw, "/v1/completions", req)
    check(st == 200, "status %s %r" % (st, b))
    text = b["choices"][0]["text"]
    st, ct, ev = stream(gw, "/v1/completions", dict(req, stream_options={"include_usage": True}))
    check(st == 200 and ct.startswith("text/event-stream"), "stream %s %s" % (st, ct))
    check(ev[-1] == "[DONE]", "done marker")
    usage = ev[-2]
    check(usage["choices"] == [] and usage["usage"]["completion_tokens"] == b["usage"]["completion_tokens"],
          "usage chunk %r" % usage)
    s = "".join(x["choices"][0]["text"] for x in ev[:-2])
    check(s == text, "stream %r vs %r" % (s, text))
    # stop strings: the text ends before the stop, finish_reason "stop".
    st, _, b = post(gw, "/v1/completions", {"prompt": [1], "max_tokens": 40, "temperature": 0, "stop": "girl"})
    c = b["choices"][0]
    check(st == 200 and c["finish_reason"] == "stop" and c["text"] == "Once upon a time, there was a little ",
          "stop %r" % c)
    st, _, b = post(gw, "/v1/completions", {"prompt": [1], "max_tokens": 40, "temperature": 0, "stop": ["zzz", "little"]})
    check(b["choices"][0]["text"].endswith("a "), "stop list %r" % b)
    # echo
    st, _, b = post(gw, "/v1/completions", {"prompt": "Once upon", "max_tokens": 3, "temperature": 0, "echo": True})
    check(st == 200 and b["choices"][0]["text"].startswith("Once upon"), "echo %r" % b)
    # n and several prompts: one choice each, in order.
    st, _, b = post(gw, "/v1/completions", {"prompt": "Lily", "max_tokens": 5, "n": 3, "seed": 7, "temperature": 1.0})
    check(st == 200 and [c["index"] for c in b["choices"]] == [0, 1, 2], "n=3 %r" % b)
    check(b["usage"]["completion_tokens"] == 15, "n=3 usage %r" % b["usage"])
    st, _, b2 = post(gw, "/v1/completions", {"prompt": "Lily", "max_tokens": 5, "n": 3, "seed": 7, "temperature": 1.0})
    check([c["text"] for c in b["choices"]] == [c["text"] for c in b2["choices"]], "seeded choices repeat")
    st, _, b = post(gw, "/v1/completions", {"prompt": ["Once", "Lily"], "max_tokens": 3, "temperature": 0})
    check(st == 200 and len(b["choices"]) == 2, "two prompts %r" % b)
    st, _, one = post(gw, "/v1/completions", {"prompt": "Lily", "max_tokens": 3, "temperature": 0})
    check(b["choices"][1]["text"] == one["choices"][0]["text"], "prompt order %r %r" % (b, one))
    st, ct, ev = stream(gw, "/v1/completions", {"prompt": "Lily", "max_tokens": 4, "n": 2, "seed": 1})
    check(st == 200 and {x["choices"][0]["index"] for x in ev[:-1]} == {0, 1}, "stream n=2 %r" % ev)
    # the default max_tokens of /v1/completions is OpenAI's 16
    st, _, b = post(gw, "/v1/completions", {"prompt": "Lily"})
    check(st == 200 and b["usage"]["completion_tokens"] <= 16, "default max_tokens %r" % b["usage"])


def t_chat(env):
    gw = env.gw_chat
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello, who are you?"},
            {"role": "assistant", "content": "A model."},
            {"role": "user", "content": "Tell me more."}]
    req = {"model": env.chat_model, "messages": msgs, "max_tokens": 10, "temperature": 0}
    st, _, b = post(gw, "/v1/chat/completions", req)
    check(st == 200, "chat %s %r" % (st, b))
    check(b["object"] == "chat.completion" and b["id"].startswith("chatcmpl-") and b["model"] == env.chat_model,
          "shape %r" % b)
    c = b["choices"][0]
    check(c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str), "message %r" % c)
    check(c["finish_reason"] in ("length", "stop"), "finish %r" % c)
    # The prompt is the whole conversation through the template: more tokens
    # than its text alone.
    st, _, tk = post(gw, "/tokenize", {"content": "".join(m["content"] for m in msgs)})
    check(b["usage"]["prompt_tokens"] > len(tk["tokens"]) + 8, "templated prompt %r vs %d" % (b["usage"], len(tk["tokens"])))
    # Streaming: role first, then content deltas, then finish, usage, [DONE].
    st, ct, ev = stream(gw, "/v1/chat/completions", dict(req, stream_options={"include_usage": True}))
    check(st == 200 and ev[-1] == "[DONE]", "chat stream %s %r" % (st, ev[-1:]))
    check(ev[0]["object"] == "chat.completion.chunk" and ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""},
          "first chunk %r" % ev[0])
    text = "".join(x["choices"][0]["delta"].get("content", "") for x in ev[:-2] if x["choices"])
    check(text == c["message"]["content"], "stream %r vs %r" % (text, c["message"]["content"]))
    check(ev[-3]["choices"][0]["finish_reason"] == c["finish_reason"] and ev[-3]["choices"][0]["delta"] == {},
          "finish chunk %r" % ev[-3])
    check(ev[-2]["usage"] == b["usage"] or ev[-2]["usage"]["completion_tokens"] == b["usage"]["completion_tokens"],
          "usage %r" % ev[-2])
    # Content as text parts; "developer" is a system message.
    parts = [{"role": "developer", "content": "You are terse."},
             {"role": "user", "content": [{"type": "text", "text": "Hello,"}, {"type": "text", "text": "who?"}]}]
    same = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello,\nwho?"}]
    st, _, b1 = post(gw, "/v1/chat/completions", {"messages": parts, "max_tokens": 6, "temperature": 0})
    st2, _, b2 = post(gw, "/v1/chat/completions", {"messages": same, "max_tokens": 6, "temperature": 0})
    check(st == 200 and st2 == 200 and b1["choices"][0]["message"] == b2["choices"][0]["message"]
          and b1["usage"]["prompt_tokens"] == b2["usage"]["prompt_tokens"], "parts %r vs %r" % (b1, b2))
    # max_completion_tokens is the newer name.
    st, _, b = post(gw, "/v1/chat/completions", {"messages": same, "max_completion_tokens": 3, "temperature": 0})
    check(st == 200 and b["usage"]["completion_tokens"] <= 3, "max_completion_tokens %r" % b)
    # Refused clearly.
    for bad, code in [({"messages": []}, "invalid_value"),
                      ({"messages": "hi"}, "invalid_value"),
                      ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_value"),
                      ({"messages": same, "tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
                       "invalid_value"),
                      ({"messages": same, "tools": [1]}, "invalid_value"),
                      ({"messages": same, "tool_choice": "auto"}, "invalid_value"),
                      ({"messages": same + [{"role": "assistant", "tool_calls": [{"function": {"name": 1}}]}]}, "invalid_value"),
                      ({"messages": same, "functions": [{"name": "f"}]}, "unsupported_parameter"),
                      ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                       "unsupported_content"),
                      ({"messages": same, "logprobs": 1}, "invalid_value"),
                      ({"messages": same, "response_format": {"type": "xml"}}, "unsupported_parameter")]:
        st, _, b = post(gw, "/v1/chat/completions", bad)
        check(st == 400 and is_error(b, code), "refused %r: %s %r" % (bad, st, b))
    # Tools reach the template (a longer prompt); a tool conversation is taken.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    st, _, bt = post(gw, "/v1/chat/completions", {"messages": same, "tools": tools, "max_tokens": 2, "temperature": 0})
    check(st == 200 and bt["usage"]["prompt_tokens"] > b2["usage"]["prompt_tokens"], "tools %s %r" % (st, bt))
    conv = same + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    st, _, bt = post(gw, "/v1/chat/completions", {"messages": conv, "tools": tools, "max_tokens": 2, "temperature": 0})
    check(st == 200 and bt["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls"), "tool conversation %s %r" % (st, bt))
    # The protocol's "messages" straight to aned: the same prompt as over HTTP.
    c = Raw(env.chat.sock)
    try:
        ev = c.call(type="generate", messages=same, max_tokens=6, temperature=0.0)
        check(ev[-1]["type"] == "done" and ev[-1]["usage"]["prompt_tokens"] == b2["usage"]["prompt_tokens"],
              "protocol messages %r" % ev[-1])
        check("".join(e["text"] for e in ev[:-1]) == b2["choices"][0]["message"]["content"], "protocol text")
        ev = c.call(type="generate", messages=same, system="x")
        check(ev[-1]["type"] == "error" and ev[-1]["code"] == "bad_request", "messages + system %r" % ev)
        ev = c.call(type="generate", messages=[{"role": "robot", "content": "x"}])
        check(ev[-1]["type"] == "error" and ev[-1]["code"] == "invalid_value", "unknown role %r" % ev)
        ev = c.call(type="eval", messages=same, top=2)
        check(ev[-1]["type"] == "done" and ev[-1]["usage"]["prompt_tokens"] == len(ev) - 1, "eval messages %r" % ev[-1])
    finally:
        c.close()
    # A model without a chat template cannot take messages.
    st, _, b = post(env.gw_raw, "/v1/chat/completions", {"messages": same, "max_tokens": 3})
    check(st == 400 and is_error(b) and "template" in b["error"]["message"], "no template %s %r" % (st, b))


def t_tokenize(env):
    st, _, b = post(env.gw_raw, "/tokenize", {"content": "Once upon a time"})
    check(st == 200 and isinstance(b["tokens"], list) and b["tokens"] and 1 not in b["tokens"], "tokenize %r" % b)
    st, _, b2 = post(env.gw_raw, "/tokenize", {"content": "Once upon a time", "add_special": True})
    check(b2["tokens"] == [1] + b["tokens"], "add_special %r" % b2)
    st, _, d = post(env.gw_raw, "/detokenize", {"tokens": b["tokens"]})
    check(st == 200 and d["content"].strip() == "Once upon a time", "detokenize %r" % d)
    st, _, d = post(env.gw_raw, "/detokenize", {"tokens": [99999999]})
    check(st == 400 and is_error(d, "invalid_token"), "bad token %s %r" % (st, d))
    st, _, d = post(env.gw_raw, "/tokenize", {"nope": 1})
    check(st == 400 and is_error(d), "no content %s %r" % (st, d))


def t_http_errors(env):
    gw = env.gw_raw
    for body, what in [(b"{", "truncated"), (b"[1,2]", "not an object"), (b"", "empty"),
                       (b"\xff\xfe", "not UTF-8"), (b"[" * 60000, "deep"), (b'{"prompt": "a"} x', "trailing")]:
        st, hd, b = post(gw, "/v1/completions", body)
        check(st == 400 and is_error(b) and hd.get("Content-Type") == "application/json",
              "%s: %s %r" % (what, st, b))
    st, _, b = get(gw, "/v2/nothing")
    check(st == 404 and is_error(b, "not_found"), "404 %s %r" % (st, b))
    st, hd, b = get(gw, "/v1/completions")
    check(st == 405 and hd.get("Allow") == "POST" and is_error(b), "405 %s %r" % (st, b))
    st, hd, b = post(gw, "/v1/models", {})
    check(st == 405 and "GET" in hd.get("Allow", ""), "405 on GET route %s" % st)
    # Body over the limit (this gateway: --max-body 65536), with and without Content-Length.
    st, _, b = post(gw, "/v1/completions", b'{"prompt":"' + b"a" * 70000 + b'"}')
    check(st == 413 and is_error(b, "body_too_large"), "413 %s %r" % (st, b))
    rc, out, err = curl("-H", "Transfer-Encoding: chunked", "--data-binary", "@-", gw.url("/v1/completions"),
                        data=b'{"prompt":"' + b"a" * 70000 + b'"}')
    check(rc == 0 and json.loads(out)["error"]["code"] == "body_too_large", "chunked 413 %r %r" % (out[:200], err))
    # Headers over the limit.
    rc, out, _ = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "X-Big: " + "a" * 60000, gw.url("/health"))
    check(out in (b"431", b"413", b"400"), "big header %r" % out)
    # Sampling values out of range, declined options, wrong types.
    for bad, code in [({"prompt": "x", "temperature": -1}, "invalid_value"),
                      ({"prompt": "x", "top_p": 2}, "invalid_value"),
                      ({"prompt": "x", "max_tokens": "ten"}, "invalid_value"),
                      ({"prompt": "x", "max_tokens": 0}, "invalid_value"),
                      ({"prompt": "x", "n": 100}, "invalid_value"),
                      ({"prompt": "x", "stop": 5}, "invalid_value"),
                      ({"prompt": "x", "stream": "yes"}, "invalid_value"),
                      ({"prompt": 5}, "invalid_value"),
                      ({"max_tokens": 3}, "invalid_value"),
                      ({"prompt": "x", "logprobs": 21}, "invalid_value"),
                      ({"prompt": "x", "presence_penalty": 0.5}, "unsupported_parameter"),
                      ({"prompt": "x", "logit_bias": {"5": 1}}, "unsupported_parameter"),
                      ({"prompt": "x", "suffix": "y"}, "unsupported_parameter"),
                      ({"prompt": "x", "model": 5}, "invalid_value"),
                      ({"prompt": "x", "max_tokens": 1e300}, "invalid_value"),
                      ({"prompt": [1, 100000]}, "invalid_token")]:
        st, _, b = post(gw, "/v1/completions", bad)
        check(st == 400 and is_error(b, code), "%r: %s %r" % (bad, st, b))
    # Zero penalties, null logprobs and unknown fields are fine.
    st, _, b = post(gw, "/v1/completions", {"prompt": "x", "max_tokens": 2, "presence_penalty": 0,
                                            "frequency_penalty": 0.0, "logprobs": None, "user": "u", "whatever": [1]})
    check(st == 200, "accepted fields %s %r" % (st, b))
    # A prompt longer than the context: 400 context_length_exceeded, streamed or not.
    long_prompt = [1] + [300] * 5000
    st, _, b = post(gw, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
    check(st == 400 and is_error(b, "context_length_exceeded"), "context %s %r" % (st, b))
    st, _, b = stream(gw, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
    check(st == 400 and is_error(b, "context_length_exceeded"), "context stream %s %r" % (st, b))
    # Browsers: foreign Host names (DNS rebinding) and foreign origins are refused.
    st, _, b = post(gw, "/v1/completions", {"prompt": "x"}, headers={"Host": "evil.example:8080"})
    check(st == 403 and is_error(b, "host_not_allowed"), "host %s %r" % (st, b))
    st, hd, b = post(gw, "/v1/completions", {"prompt": "x"}, headers={"Origin": "http://evil.example"})
    check(st == 403 and is_error(b, "origin_not_allowed"), "origin %s %r" % (st, b))
    st, hd, _ = get(gw, "/health", headers={"Host": "localhost:1234"})
    check(st == 200 and "Access-Control-Allow-Origin" not in hd, "localhost host %s" % st)


def t_auth_cors(env):
    gw = env.gw_auth
    st, hd, b = post(gw, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(st == 401 and is_error(b, "invalid_api_key") and hd.get("WWW-Authenticate") == "Bearer", "no key %s %r" % (st, b))
    st, _, b = post(gw, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer wrong"})
    check(st == 401, "wrong key %s" % st)
    st, _, b = post(gw, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer " + env.key})
    check(st == 200, "right key %s %r" % (st, b))
    st, _, b = get(gw, "/v1/models", headers={"Authorization": "Bearer " + env.key + "x"})
    check(st == 401, "models need the key %s" % st)
    st, _, b = get(gw, "/health")
    check(st == 200, "health needs no key %s" % st)
    # CORS for the one allowed origin: echoed exactly, never a wildcard.
    origin = "http://localhost:3000"
    st, hd, _ = get(gw, "/v1/models", method="OPTIONS",
                    headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    check(st == 204 and hd.get("Access-Control-Allow-Origin") == origin
          and "Authorization" in hd.get("Access-Control-Allow-Headers", ""), "preflight %s %r" % (st, dict(hd)))
    st, hd, _ = get(gw, "/v1/models", headers={"Origin": origin, "Authorization": "Bearer " + env.key})
    check(st == 200 and hd.get("Access-Control-Allow-Origin") == origin, "cors get %s" % st)
    st, hd, _ = get(gw, "/v1/models", method="OPTIONS", headers={"Origin": "http://localhost:3001"})
    check(st == 403 and "Access-Control-Allow-Origin" not in hd, "other origin %s" % st)
    # A wildcard is refused at start-up.
    p = subprocess.run([GW, "--socket", env.raw.sock, "--listen", "127.0.0.1:0", "--allow-origin", "*"],
                       capture_output=True, timeout=10)
    check(p.returncode == 2 and b"\"*\"" in p.stderr, "wildcard %r" % p.stderr)


def t_cancel_on_disconnect(env):
    # Seed 2 samples a long answer (over 3,000 tokens) from this model, so
    # the answer cannot end on its own before the hang-up.
    d = env.chat
    wait_idle(d)
    # Streaming: read the first chunk, then hang up.
    body = json.dumps({"messages": [{"role": "user", "content": "Talk."}], "max_tokens": 100000,
                       "temperature": 1.0, "seed": 2, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", env.gw_chat.port), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"content" not in got or got.count(b"data: ") < 3:
        x = s.recv(65536)
        check(x, "stream closed early: %r" % got)
        got += x
    check(b"200 OK" in got.split(b"\r\n")[0], "status line %r" % got[:40])
    c = Raw(d.sock)
    check(c.info()["active"] >= 1, "the job runs")
    c.close()
    t0 = time.time()
    s.close()
    i = wait_idle(d, timeout=5)
    env.note("stream cancel took %.0f ms" % ((time.time() - t0) * 1000))
    # Non-streaming: hang up while it generates.
    body = json.dumps({"messages": [{"role": "user", "content": "Talk."}], "max_tokens": 100000,
                       "temperature": 1.0, "seed": 2}).encode()
    s = socket.create_connection(("127.0.0.1", env.gw_chat.port), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    c = Raw(d.sock)
    end = time.time() + 5
    while c.info()["active"] == 0:
        check(time.time() < end, "the job never ran")
        time.sleep(0.02)
    c.close()
    s.close()
    wait_idle(d, timeout=5)
    # The gateway serves on.
    st, _, b = post(env.gw_chat, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    check(st == 200, "after cancels %s %r" % (st, b))


def t_keepalive_concurrency(env):
    gw = env.gw_raw
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        for i in range(5):
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 3, "temperature": 0}),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            b = json.loads(r.read())
            check(r.status == 200 and b["choices"][0]["text"] == "Once upon a", "keep-alive %d %r" % (i, b))
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 3, "stream": True}))
            r = conn.getresponse()
            ev = sse_events(r.read().splitlines(True))
            check(r.status == 200 and ev[-1] == "[DONE]", "keep-alive stream %d" % i)
    finally:
        conn.close()
    # HTTP/1.0: no chunked encoding, the stream ends with the connection.
    body = json.dumps({"prompt": [1], "max_tokens": 3, "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while True:
        x = s.recv(65536)
        if not x:
            break
        got += x
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0] and b"chunked" not in head.lower(),
          "HTTP/1.0 head %r" % head)
    ev = sse_events(rest.splitlines(True))
    check(ev[-1] == "[DONE]" and "".join(x["choices"][0]["text"] for x in ev[:-1]) == "Once upon a",
          "HTTP/1.0 stream %r" % ev)
    st, hd, b = get(gw, "/health", method="HEAD")
    check(st == 200 and not b, "HEAD %s %r" % (st, b))
    errs = []

    def worker(k):
        try:
            for _ in range(3):
                st, _, b = post(gw, "/v1/completions", {"prompt": "Lily", "max_tokens": 8, "seed": k})
                if st != 200:
                    errs.append((st, b))
                st, _, ev = stream(gw, "/v1/completions", {"prompt": "Lily", "max_tokens": 8, "seed": k})
                if st != 200 or ev[-1] != "[DONE]":
                    errs.append((st, ev))
        except Exception as e:   # noqa: BLE001 — reported below
            errs.append(repr(e))
    th = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in th:
        t.start()
    for t in th:
        t.join(60)
    check(not errs, "concurrent: %r" % errs[:3])


def t_daemon_down(env):
    tmp = env.tmp
    gw = Gateway(os.path.join(tmp, "nobody.sock")).start()
    env.procs.append(gw)
    st, hd, b = get(gw, "/health")
    check(st == 503 and b["status"] == "unavailable", "health %s %r" % (st, b))
    st, hd, b = post(gw, "/v1/completions", {"prompt": "x"})
    check(st == 503 and is_error(b, "daemon_unavailable") and hd.get("Retry-After"), "503 %s %r" % (st, b))
    st, _, b = stream(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    check(st == 503 and is_error(b), "503 stream %s %r" % (st, b))
    # The daemon restarts under a kept-alive HTTP connection: the gateway reconnects.
    d = Daemon(tmp, RAW_MODEL, "restart").start()
    env.procs.append(d)
    gw2 = Gateway(d.sock).start()
    env.procs.append(gw2)
    conn = http.client.HTTPConnection("127.0.0.1", gw2.port, timeout=30)
    try:
        for i in range(2):
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 3, "temperature": 0}))
            r = conn.getresponse()
            b = json.loads(r.read())
            check(r.status == 200, "before/after restart %d: %s %r" % (i, r.status, b))
            if i == 0:
                d.stop()
                d.start()
    finally:
        conn.close()
    check(gw2.stop() == 0, "clean exit on SIGTERM")


def t_unix_listen(env):
    path = os.path.join(env.tmp, "gw.sock")
    gw = Gateway(env.raw.sock, "--listen", "unix:" + path).start()
    env.procs.append(gw)
    check(stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o600,
          "socket mode %o" % os.stat(path).st_mode)
    rc, out, err = curl("--unix-socket", path, "-d", '{"prompt":[1],"max_tokens":3,"temperature":0}',
                        "http://localhost/v1/completions")
    check(rc == 0 and json.loads(out)["choices"][0]["text"] == "Once upon a", "unix %r %r" % (out, err))
    # A second gateway on a live socket is refused; after a clean stop the path is gone.
    p = subprocess.run([GW, "--socket", env.raw.sock, "--listen", "unix:" + path], capture_output=True, timeout=10)
    check(p.returncode == 1 and b"in use" in p.stderr, "second gateway %r" % p.stderr)
    check(gw.stop() == 0 and not os.path.exists(path), "socket removed on exit")


TESTS = [t_health_models, t_completions_curl, t_completions_python, t_chat, t_tokenize, t_http_errors,
         t_auth_cors, t_cancel_on_disconnect, t_keepalive_concurrency, t_daemon_down, t_unix_listen]


class Env:
    pass


def main():
    for p in (ANED, GW):
        if not os.access(p, os.X_OK):
            print("missing %s (run make)" % p)
            print("0 passed, 1 failed")
            return 1
    if not CURL:
        print("curl is missing")
        print("0 passed, 1 failed")
        return 1
    env = Env()
    env.tmp = tempfile.mkdtemp(prefix="aned-http-t.")
    env.procs = []
    env.notes = []
    env.note = env.notes.append
    passed = failed = 0
    try:
        env.chat = Daemon(env.tmp, CHAT_MODEL, "chat").start()
        env.procs.append(env.chat)
        env.raw = Daemon(env.tmp, RAW_MODEL, "raw").start()
        env.procs.append(env.raw)
        env.gw_chat = Gateway(env.chat.sock).start()
        env.procs.append(env.gw_chat)
        env.gw_raw = Gateway(env.raw.sock, "--max-body", "65536", "--max-header", "16384").start()
        env.procs.append(env.gw_raw)
        env.key = "sk-test-" + os.urandom(8).hex()
        kf = os.path.join(env.tmp, "key")
        with open(kf, "w") as f:
            f.write(env.key + "\n")
        os.chmod(kf, 0o600)
        env.gw_auth = Gateway(env.raw.sock, "--api-key-file", kf, "--allow-origin", "http://localhost:3000").start()
        env.procs.append(env.gw_auth)
        env.chat_model = None
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
                for p in env.procs:
                    if isinstance(p, Gateway):
                        print("    aned-http stderr: %s" % p.stderr()[-600:])
    except Exception:   # noqa: BLE001
        failed += 1
        traceback.print_exc(file=sys.stdout)
    finally:
        for p in reversed(env.procs):
            try:
                p.stop()
            except Exception:   # noqa: BLE001
                pass
        shutil.rmtree(env.tmp, ignore_errors=True)
    for n in env.notes:
        print("note:", n)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
