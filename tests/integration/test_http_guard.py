#!/usr/bin/python3
"""aned-http's defences, each checked the way it once failed:

- a job's error is answered after the daemon connection holding its text is
  dropped (n > 1): run under valgrind (or the sanitizers of a SANITIZER
  build), which must report nothing;
- a generation that aned stops before its end (SIGTERM with
  --shutdown-grace 0) is an error, never a finish_reason "stop";
- connections past --max-connections get a 503 with a JSON body;
- TCP without --api-key-file is refused unless --insecure-no-key is given;
- a socket served by another user is refused unless --daemon-user names it;
- the gateway's own checks name the field (top_p, messages[i].role, sizes);
- what aned cannot do (tools, structured output, audio) is refused with a
  400 naming the parameter on both generation endpoints, never ignored;
- -v logs one line per request (method, path, status, time, tokens) and
  start-up prints no libmicrohttpd option-order warning.

Ends with "N passed, M failed"; exits non-zero on any failure."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_http import (ANED, GW, CHAT_MODEL, Daemon, Gateway, Raw, check, get, is_error, post,  # noqa: E402
                       sse_events, stream)

VALGRIND = shutil.which("valgrind")
SANITIZED = bool(os.environ.get("SANITIZER"))
FAKE = os.path.join(HERE, "fake_aned.py")


class GraceDaemon(Daemon):
    """aned that cancels running jobs at once on SIGTERM."""

    def start(self):
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen([ANED, "--model", self.model, "--socket", self.sock, "--shutdown-grace", "0"],
                                     stdin=subprocess.DEVNULL, stdout=self.logf, stderr=subprocess.STDOUT)
        end = time.time() + 30
        while time.time() < end:
            check(self.proc.poll() is None, "aned exited during start-up: %s" % self.tail())
            try:
                Raw(self.sock).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("aned not ready: %s" % self.tail())


class CheckedGateway(Gateway):
    """aned-http under valgrind (memcheck) unless this is a sanitizer build,
    whose own checks then abort it on the first bad access."""

    def __init__(self, sock, *args):
        Gateway.__init__(self, sock, *args)
        self.valgrind = VALGRIND and not SANITIZED
        if self.valgrind:
            self.args = [VALGRIND, "-q", "--error-exitcode=99", "--leak-check=no"] + self.args

    def start(self):
        Gateway.start(self)
        return self

    def verdict(self):
        """Stops it: (clean, its stderr)."""
        rc = self.stop()
        err = self.stderr()
        bad = rc != 0 or "Invalid read" in err or "Invalid write" in err or "AddressSanitizer" in err
        return not bad, "exit %r: %s" % (rc, err[-1500:])


def long_messages():
    return [{"role": "user", "content": "x " * 6000}]   # over qwen2-tiny's 4096 tokens


# ------------------------------------------------------------------ tests

def t_job_errors(env):
    """n > 1 with jobs that fail: the error is answered after the other jobs
    are cancelled by dropping the daemon connection."""
    gw = env.gw
    got = []
    for n in (2, 3):
        got.append(post(gw, "/v1/chat/completions", {"messages": long_messages(), "max_tokens": 4, "n": n}))
        got.append(stream(gw, "/v1/chat/completions", {"messages": long_messages(), "max_tokens": 4, "n": n}))
    for st, _, b in got:
        check(st == 400 and is_error(b, "context_length_exceeded") and "4096" in b["error"]["message"],
              "n > 1, a context error: %s %r" % (st, b))
        check(b["error"]["param"] == "messages", "param of a context error %r" % b)
    # the gateway still serves
    st, _, b = post(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    check(st == 200, "after errors %s %r" % (st, b))


def t_params(env):
    gw = env.gw
    for path, body in (("/v1/completions", {"prompt": "x", "top_p": 1.5}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": -0.5})):
        st, _, b = post(gw, path, body)
        check(st == 400 and is_error(b, "invalid_value") and b["error"]["param"] == "top_p", "top_p %s %r" % (st, b))
    st, _, b = post(gw, "/v1/chat/completions", {"messages": [{}] * 1024})
    check(st == 400 and is_error(b, "invalid_value") and b["error"]["param"] == "messages[0].role"
          and "role" in b["error"]["message"], "[{}]*1024: %s %r" % (st, b))
    st, _, b = post(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 2000}] * 1024})
    check(st == 400 and is_error(b) and b["error"]["param"] == "messages" and "bytes" in b["error"]["message"],
          "1024 messages of 2000 bytes: %s %r" % (st, b))
    st, _, b = post(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 1025})
    check(st == 400 and is_error(b) and b["error"]["param"] == "messages", "1025 messages: %s %r" % (st, b))
    st, _, b = post(gw, "/v1/completions", {"prompt": "a" * (1 << 20)})
    check(st == 400 and is_error(b) and b["error"]["param"] == "prompt", "1 MiB prompt: %s %r" % (st, b))
    # the daemon's own refusals get the field they name
    st, _, b = post(gw, "/detokenize", {"tokens": [999999]})
    check(st == 400 and is_error(b, "invalid_token") and b["error"]["param"] == "tokens", "detokenize %s %r" % (st, b))


def t_unsupported(env):
    """Refused the same way on /v1/completions and /v1/chat/completions."""
    gw = env.gw
    bases = (("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    refused = (("tools", [tool]), ("functions", [{"name": "f"}]), ("tool_choice", "required"),
               ("tool_choice", {"type": "function", "function": {"name": "f"}}), ("function_call", {"name": "f"}),
               ("response_format", {"type": "xml"}), ("response_format", {"type": "regex"}),
               ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"}))
    for path, base in bases:
        for key, val in refused:
            if path.endswith("chat/completions") and key in ("tools", "tool_choice"):
                continue   # chat takes tools (test_http, test_openai_sdk)
            for streaming in (False, True):
                body = dict(base, **{key: val})
                st, _, b = (stream if streaming else post)(gw, path, body)
                check(st == 400 and is_error(b, "unsupported_parameter") and b["error"]["param"] == key
                      and key in b["error"]["message"],
                      "%s %s=%r%s: %s %r" % (path, key, val, " (stream)" if streaming else "", st, b))
        # their harmless forms still pass
        for key, val in (("tools", []), ("tool_choice", "none"), ("response_format", {"type": "text"}),
                         ("modalities", ["text"]), ("audio", None)):
            st, _, b = post(gw, path, dict(base, **{key: val}))
            check(st == 200, "%s %s=%r is harmless: %s %r" % (path, key, val, st, b))
    st, _, b = post(gw, "/v1/chat/completions", dict(bases[1][1], modalities="text"))
    check(st == 400 and is_error(b) and b["error"]["param"] == "modalities", "modalities not an array: %r" % b)


def t_verbose_log(env):
    """-v: one line per request when it ends, with status, milliseconds and
    tokens; nothing about libmicrohttpd's option order at start."""
    gw = Gateway(env.daemon.sock, "-v").start()
    try:
        st, _, _ = post(gw, "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        check(st == 200, "completion %s" % st)
        st, _, ev = stream(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 2})
        check(st == 200, "stream %s" % st)
        st, _, _ = post(gw, "/v1/completions", {"prompt": "Hi", "tools": []})
        st, _, _ = post(gw, "/v1/completions", {"prompt": "Hi", "top_p": 2})
        check(st == 400, "bad top_p %s" % st)
        st, _, _ = get(gw, "/v1/nothing%0aforged%20line")
        check(st == 404, "404 %s" % st)
        time.sleep(0.3)   # the log line is written once the request has ended
    finally:
        gw.stop()
    err = gw.stderr()
    check("EXTERNAL_LOGGER" not in err and "not the first option" not in err, "start-up warning: %r" % err)
    ms = r"\d+\.\d ms"
    for pat in (r"^aned-http: POST /v1/completions 200 %s prompt \d+ completion 3 tokens$" % ms,
                r"^aned-http: POST /v1/chat/completions 200 %s prompt \d+ completion [12] tokens$" % ms,
                r"^aned-http: POST /v1/completions 400 %s$" % ms,
                r"^aned-http: GET /v1/nothing\?forged line 404 %s$" % ms):
        check(re.search(pat, err, re.M), "no log line like %r in %r" % (pat, err))
    check(not re.search(r"^forged", err, re.M), "a path cannot start a log line: %r" % err)


def read_events(resp, until):
    """SSE payloads from an open response until until(events) is true."""
    ev = []
    while not until(ev):
        line = resp.readline()
        if not line:
            break
        ev += sse_events([line])
    return ev


def cut_body(seed, stream):
    return {"messages": [{"role": "user", "content": "Talk."}], "max_tokens": 100000,
            "temperature": 1.0, "seed": seed, "stream": stream}


def finished(x):
    return isinstance(x, dict) and x.get("choices") and x["choices"][0].get("finish_reason")


def t_cut_short_stream(env):
    """SIGTERM to aned mid-stream: an error chunk, then [DONE]; no chunk
    says the answer finished.  A sampled answer may end on its own before
    the signal lands; that run proves nothing and the next seed is tried."""
    for seed in range(1, 9):
        req = urllib.request.Request(env.gw.url("/v1/chat/completions"),
                                     data=json.dumps(cut_body(seed, True)).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            check(r.status == 200, "stream status %s" % r.status)
            ev = read_events(r, lambda e: sum(1 for x in e if isinstance(x, dict) and x.get("choices")
                                              and x["choices"][0]["delta"].get("content")) >= 3
                             or any(finished(x) for x in e))
            env.daemon.proc.send_signal(signal.SIGTERM)
            ev += read_events(r, lambda e: bool(e) and e[-1] == "[DONE]")
        env.daemon.stop()
        env.daemon.start()
        errs = [x for x in ev if isinstance(x, dict) and "error" in x]
        if not errs and any(finished(x) for x in ev):
            continue
        check(ev and ev[-1] == "[DONE]", "the stream ends with [DONE]: %r" % ev[-2:])
        check(len(errs) == 1 and ev[-2] is errs[0] and errs[0]["error"]["code"] == "generation_cut_short"
              and "cut short" in errs[0]["error"]["message"], "an error chunk before [DONE]: %r" % ev[-3:])
        fins = [x for x in ev if finished(x)]
        check(not fins, "no finish_reason for a cut answer: %r" % fins)
        return
    check(False, "every seed's answer ended before the signal")


def t_cut_short_plain(env):
    """The same without streaming: 503 saying it was cut short."""
    for seed in range(1, 9):
        out = {}

        def call():
            out["r"] = post(env.gw, "/v1/chat/completions", cut_body(seed, False))
        th = threading.Thread(target=call)
        th.start()
        c = Raw(env.daemon.sock)
        end = time.time() + 10
        while c.info()["active"] == 0 and th.is_alive():
            check(time.time() < end, "the job never ran")
            time.sleep(0.02)
        c.close()
        env.daemon.proc.send_signal(signal.SIGTERM)
        th.join(60)
        env.daemon.stop()
        env.daemon.start()
        st, hd, b = out.get("r", (None, {}, None))
        if st == 200:
            continue   # the answer ended on its own before the signal
        check(st == 503 and is_error(b, "generation_cut_short") and "cut short" in b["error"]["message"]
              and hd.get("Retry-After"), "cut short: %s %r" % (st, b))
        return
    check(False, "every seed's answer ended before the signal")


def t_valgrind_clean(env):
    """Everything above ran through the checked gateway: it reports nothing."""
    if not env.gw.valgrind and not SANITIZED:
        print("t_valgrind_clean: valgrind is not installed; only the answers were checked")
        return
    ok, why = env.gw.verdict()
    check(ok, "aned-http memory errors: %s" % why)


def t_conn_limit(env):
    gw = Gateway(env.daemon.sock, "--max-connections", "2").start()
    env.procs.append(gw)
    held = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(2)]
    try:
        time.sleep(0.3)   # both accepted and counted
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while True:
            x = s.recv(65536)
            if not x:
                break
            got += x
        s.close()
        head, _, body = got.partition(b"\r\n\r\n")
        check(head.startswith(b"HTTP/1.1 503"), "over the limit: %r" % got[:200])
        b = json.loads(body) if body else None
        check(is_error(b, "too_many_connections") and "--max-connections" in b["error"]["message"],
              "503 body %r" % body)
        check(b"retry-after" in head.lower(), "Retry-After %r" % head)
    finally:
        held[0].close()
    time.sleep(0.3)
    st, _, b = get(gw, "/health")
    check(st == 200, "a freed slot serves again: %s %r" % (st, b))
    held[1].close()


def t_tcp_needs_key(env):
    def run(*args):
        p = subprocess.Popen([GW, "--socket", env.daemon.sock] + list(args), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            out, err = p.communicate(timeout=5)
            return p.returncode, out.decode(), err.decode()
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return None, out.decode(), err.decode()
    for args in ([], ["--listen", "127.0.0.1:0"], ["--listen", "[::1]:0"]):
        rc, out, err = run(*args)
        check(rc == 2 and "--api-key-file" in err and "--insecure-no-key" in err and "listening" not in out,
              "TCP without a key refused %r: %r %r" % (args, rc, err))
    kf = os.path.join(env.tmp, "key")
    with open(kf, "w") as f:
        f.write("sk-guard\n")
    os.chmod(kf, 0o600)
    for args in (["--listen", "127.0.0.1:0", "--api-key-file", kf], ["--listen", "127.0.0.1:0", "--insecure-no-key"],
                 ["--listen", "unix:" + os.path.join(env.tmp, "g.sock")]):
        gw = Gateway(env.daemon.sock, *args).start()
        env.procs.append(gw)
        check(gw.stop() == 0, "starts with %r" % args)
    rc, _, err = run("--listen", "unix:" + os.path.join(env.tmp, "g2.sock"), "--insecure-no-key")
    check(rc == 2 and "--insecure-no-key" in err, "--insecure-no-key on a Unix socket: %r %r" % (rc, err))


def t_daemon_user(env):
    """aned-http, like aneclient, refuses a daemon socket served by another
    user unless --daemon-user names it."""
    if os.geteuid() != 0:
        print("t_daemon_user: not root, skipped (needs another uid)")
        return
    tmp = tempfile.mkdtemp(prefix="aned-http-trust.")
    os.chmod(tmp, 0o1777)
    sock, log = os.path.join(tmp, "fake.sock"), os.path.join(tmp, "fake.log")

    def as_nobody():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    fake = subprocess.Popen([sys.executable, FAKE, sock, log], stdout=subprocess.PIPE, preexec_fn=as_nobody)
    try:
        check(fake.stdout.readline() == b"ready\n", "fake daemon started")
        gw = Gateway(sock).start()
        env.procs.append(gw)
        st, _, b = get(gw, "/health")
        check(st == 503 and "uid 65534" in b.get("error", ""), "refused: %s %r" % (st, b))
        st, _, b = post(gw, "/v1/completions", {"prompt": "a secret prompt", "max_tokens": 2})
        check(st == 503 and is_error(b, "daemon_unavailable") and "uid 65534" in b["error"]["message"],
              "no prompt sent: %s %r" % (st, b))
        time.sleep(0.2)
        with open(log) as f:
            sent = [int(l.split()[1]) for l in f]
        check(sent and all(n == 0 for n in sent), "nothing reached the impostor: %r" % sent)
        gw.stop()
        gw = Gateway(sock, "--daemon-user", "nobody").start()
        env.procs.append(gw)
        st, _, b = get(gw, "/health")
        check(st == 200, "named with --daemon-user: %s %r" % (st, b))
        gw.stop()
        p = subprocess.run([GW, "--socket", sock, "--daemon-user", "no-such-user-x", "--listen", "unix:" + sock + ".x"],
                           capture_output=True, timeout=10)
        check(p.returncode == 2 and b"no-such-user-x" in p.stderr, "unknown user %r" % p.stderr)
    finally:
        fake.kill()
        fake.wait()
        shutil.rmtree(tmp, ignore_errors=True)


TESTS = [t_job_errors, t_params, t_unsupported, t_verbose_log, t_cut_short_stream, t_cut_short_plain,
         t_valgrind_clean, t_conn_limit, t_tcp_needs_key, t_daemon_user]


class Env:
    pass


def main():
    for p in (ANED, GW):
        if not os.access(p, os.X_OK):
            print("missing %s (run make)" % p)
            print("0 passed, 1 failed")
            return 1
    env = Env()
    env.tmp = tempfile.mkdtemp(prefix="aned-http-g.")
    env.procs = []
    passed = failed = 0
    try:
        env.daemon = GraceDaemon(env.tmp, CHAT_MODEL, "chat").start()
        env.procs.append(env.daemon)
        env.gw = CheckedGateway(env.daemon.sock).start()
        env.procs.append(env.gw)
        for t in TESTS:
            t0 = time.time()
            try:
                t(env)
                passed += 1
                print("%-28s ok (%.2f s)" % (t.__name__, time.time() - t0), flush=True)
            except Exception:   # noqa: BLE001 — every failure is reported
                failed += 1
                print("%-28s FAIL" % t.__name__)
                traceback.print_exc(file=sys.stdout)
                print("    aned-http stderr: %s" % env.gw.stderr()[-1500:], flush=True)
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
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
