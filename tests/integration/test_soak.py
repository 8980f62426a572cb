#!/usr/bin/python3
"""Load and fault soak of the real bin/aned on stories260K.

64 concurrent clients run greedy generations (and tokenize/eval/ping) in a
loop for SOAK_SECONDS (default 15; set e.g. SOAK_SECONDS=600 for the long
run). Every generation must equal the same request run alone, or be
refused with `busy`; nothing else is allowed. Meanwhile clients are killed
with SIGKILL mid-stream and connections dropped mid-generation. The
daemon's RSS and open fds must come back flat, and it must exit 0 (under
SANITIZER=address that includes LeakSanitizer). Then SIGTERM is sent in the
middle of full load: every client's request ends with its complete output
or `shutting_down`, never a silently cut stream. Last, corrupt and
truncated copies of the model must be refused at start.
Ends with "N passed, M failed"."""
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_daemon import (ANED, ANECLIENT, MODEL, Conn, Daemon, TestFailure, check, info, run,  # noqa: E402
                         wait_for)
import test_daemon  # noqa: E402

SOAK_S = float(os.environ.get("SOAK_SECONDS", "15"))
N_CLIENTS = 64
test_daemon.TIMEOUT_S = int(SOAK_S * 2 + 240)


def daemon_fds(d):
    return len(os.listdir("/proc/%d/fd" % d.proc.pid))


def daemon_rss_kb(d):
    with open("/proc/%d/status" % d.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def make_cases():
    """Prompts of different lengths and lengths of output; greedy."""
    rng = random.Random(5)
    cases = []
    for i in range(24):
        n_prompt = rng.choice([1, 2, 5, 17, 60])
        toks = [1] + [rng.randrange(3, 512) for _ in range(n_prompt - 1)]
        cases.append(dict(tokens=toks, raw=True, temperature=0.0, max_tokens=rng.choice([8, 24, 64, 120])))
    cases.append(dict(prompt="Once upon a time", raw=True, temperature=0.0, max_tokens=40))
    cases.append(dict(prompt="The cat sat", raw=True, temperature=0.0, max_tokens=40, stop=["."]))
    # seeded sampling is deterministic too
    cases.append(dict(tokens=[1], raw=True, temperature=0.9, top_k=20, seed=1234, max_tokens=50))
    return cases


def gen(c, rid, req):
    """(ids, terminal message)."""
    c.request("generate", id=rid, **req)
    ids = []
    while True:
        m = c.recv()
        if m is None:
            return ids, None
        if m.get("id") == 0 and m.get("type") == "error":
            return ids, m   # connection-level (e.g. shutting_down): the caller judges
        check(m.get("id") == rid, "message for another id: %r" % m)
        if m["type"] == "token":
            ids.append(m["token"])
        else:
            return ids, m


def solo_refs(d, cases):
    c = Conn(d.sock, timeout=60)
    try:
        c.hello()
        refs = []
        for i, req in enumerate(cases):
            ids, last = gen(c, i + 1, req)
            check(last and last["type"] == "done", "solo case %d: %r" % (i, last))
            refs.append((ids, last["finish"]))
        return refs
    finally:
        c.close()


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.done = self.busy = self.other = 0
        self.errors = []

    def add(self, what, detail=None):
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            if detail and len(self.errors) < 10:
                self.errors.append(detail)


def load_client(d, k, cases, refs, deadline, st, stop_evt):
    rng = random.Random(1000 + k)
    rid = 0
    while time.time() < deadline and not stop_evt.is_set():
        try:
            c = Conn(d.sock, timeout=120)
        except OSError as e:
            st.add("other", "client %d connect: %s" % (k, e))
            return
        try:
            c.hello()
            for _ in range(rng.randrange(1, 6)):
                if time.time() >= deadline or stop_evt.is_set():
                    break
                rid += 1
                r = rng.random()
                if r < 0.08:
                    m = c.call("tokenize", id=rid, text="Once upon a time")
                    ok = m["type"] == "tokens" and m["tokens"][:1] == [1]
                    st.add("done" if ok else "other", None if ok else "tokenize %r" % m)
                    continue
                if r < 0.12:
                    m = c.call("ping", id=rid)
                    st.add("done" if m["type"] == "pong" else "other")
                    continue
                i = rng.randrange(len(cases))
                if r < 0.15:   # drop the connection mid-generation
                    c.request("generate", id=rid, **dict(cases[i], max_tokens=400))
                    c.recv()
                    break
                ids, last = gen(c, rid, cases[i])
                if last is None:
                    st.add("other", "client %d: connection closed mid-generation" % k)
                elif last["type"] == "error" and last.get("code") == "busy":
                    st.add("busy")
                    time.sleep(0.05)
                elif last["type"] == "done" and (ids, last["finish"]) == refs[i]:
                    st.add("done")
                else:
                    st.add("other", "client %d case %d: %r / %r, want %r" % (k, i, ids[:12], last, refs[i][0][:12]))
        except (TestFailure, OSError) as e:
            st.add("other", "client %d: %s" % (k, e))
        finally:
            c.close()


def killer(d, deadline, st, stop_evt):
    """aneclient processes SIGKILLed mid-stream."""
    n = 0
    while time.time() < deadline and not stop_evt.is_set():
        p = subprocess.Popen([ANECLIENT, "--socket", d.sock, "-n", "1500", "--raw", "Once upon a time"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            p.stdout.read(20)
        finally:
            p.kill()
            p.wait()
            p.stdout.close()
        n += 1
        time.sleep(0.2)
    st.killed = n


def test_load_and_faults():
    d = Daemon(args=["--max-seqs", "16", "--max-queued", "40"])
    try:
        d.start()
        cases = make_cases()
        refs = solo_refs(d, cases)
        # warm up: every client shape once, then take the baseline
        st = Stats()
        stop_evt = threading.Event()
        warm = threading.Thread(target=load_client, args=(d, 999, cases, refs, time.time() + 3, st, stop_evt))
        warm.start()
        warm.join()
        wait_for(lambda: info(d.sock).get("clients") == 0 or info(d.sock).get("active") == 0, 20, "warm-up to end")
        fds0, rss0 = daemon_fds(d), daemon_rss_kb(d)

        st = Stats()
        st.killed = 0
        deadline = time.time() + SOAK_S
        ts = [threading.Thread(target=load_client, args=(d, k, cases, refs, deadline, st, stop_evt))
              for k in range(N_CLIENTS)]
        if os.access(ANECLIENT, os.X_OK):
            ts.append(threading.Thread(target=killer, args=(d, deadline, st, stop_evt)))
        rss_mid = []
        for t in ts:
            t.start()
        while time.time() < deadline:
            time.sleep(min(2, max(0.1, deadline - time.time())))
            check(d.alive(), "daemon died under load:\n%s" % d.log_text())
            rss_mid.append(daemon_rss_kb(d))
        for t in ts:
            t.join(180)
        check(not any(t.is_alive() for t in ts), "clients hung")
        print("    %d clients, %.0f s: %d completed, %d busy, %d aneclient killed mid-stream, %d other"
              % (N_CLIENTS, SOAK_S, st.done, st.busy, st.killed, st.other), flush=True)
        check(st.other == 0, "unexpected results: %s" % "\n".join(st.errors))
        check(st.done > N_CLIENTS, "too little work done: %d" % st.done)
        wait_for(lambda: info(d.sock).get("active") == 0 and info(d.sock).get("queued") == 0
                 and info(d.sock).get("clients") == 1, 30, "every job and connection to end")
        wait_for(lambda: daemon_fds(d) <= fds0, 10, "fds back to %d (now %d)" % (fds0, daemon_fds(d)))
        rss1 = daemon_rss_kb(d)
        print("    RSS %d KiB after warm-up, peak %d under load, %d after; fds %d -> %d"
              % (rss0, max(rss_mid or [0]), rss1, fds0, daemon_fds(d)), flush=True)
        # a second round must not grow the resident set further (no leak per job)
        st2 = Stats()
        dl2 = time.time() + min(10, SOAK_S / 3)
        ts = [threading.Thread(target=load_client, args=(d, k, cases, refs, dl2, st2, stop_evt)) for k in range(N_CLIENTS)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        check(st2.other == 0, "second round: %s" % "\n".join(st2.errors))
        wait_for(lambda: info(d.sock).get("active") == 0 and info(d.sock).get("clients") == 1, 30, "second round to end")
        rss2 = daemon_rss_kb(d)
        print("    RSS %d KiB after a second round" % rss2, flush=True)
        # (AddressSanitizer's quarantine holds freed memory, so RSS says
        # nothing there; LeakSanitizer's check at exit stands in for it)
        if not os.environ.get("SANITIZER"):
            check(rss2 - rss1 < max(8192, rss1 // 20), "RSS grew from %d to %d KiB over a second round" % (rss1, rss2))
        wait_for(lambda: daemon_fds(d) <= fds0, 10, "fds back to %d after a second round (now %d)" % (fds0, daemon_fds(d)))
        rc = d.stop(timeout=60)
        check(rc == 0, "daemon exit status %r after the soak (leaks?):\n%s" % (rc, d.log_text()))
    finally:
        d.kill()


def test_sigterm_under_load():
    d = Daemon(args=["--max-seqs", "16", "--max-queued", "64", "--shutdown-grace", "2"])
    try:
        d.start()
        cases = make_cases()
        refs = solo_refs(d, cases)
        results = [None] * N_CLIENTS
        started = threading.Barrier(N_CLIENTS + 1)

        def client(k):
            rng = random.Random(k)
            c = Conn(d.sock, timeout=60)
            try:
                c.hello()
                started.wait(30)
                outs = []
                for j in range(100):
                    i = rng.randrange(len(cases))
                    try:
                        long = j % 3 == 2
                        ids, last = gen(c, j + 1, dict(cases[i], max_tokens=300) if long else cases[i])
                    except (BrokenPipeError, ConnectionResetError):
                        break   # sent after the daemon closed: never accepted
                    if not ids and (last is None or last.get("id") == 0):
                        break   # closed before this request was read: never accepted
                    outs.append((-1 if long else i, ids, last))
                    if last is None or last["type"] == "error":
                        break
                results[k] = outs
            except Exception as e:
                results[k] = e
            finally:
                c.close()

        ts = [threading.Thread(target=client, args=(k,)) for k in range(N_CLIENTS)]
        for t in ts:
            t.start()
        started.wait(30)
        time.sleep(3)
        d.proc.send_signal(signal.SIGTERM)
        for t in ts:
            t.join(60)
        rc = d.proc.wait(30)
        check(rc == 0, "exit status %r after SIGTERM under load:\n%s" % (rc, d.log_text()))
        check(not os.path.exists(d.sock), "socket left behind")
        n_done = n_shut = 0
        for k, r in enumerate(results):
            check(isinstance(r, list), "client %d: %r" % (k, r))
            for i, ids, last in r:
                check(last is not None, "client %d: stream cut without a terminal event (%d tokens)" % (k, len(ids)))
                if last["type"] == "done" and last.get("finish") in ("length", "stop", "eos"):
                    if i >= 0:
                        check((ids, last["finish"]) == refs[i], "client %d: output changed around shutdown" % k)
                    n_done += 1
                elif last["type"] == "done" and last.get("finish") == "cancelled":
                    n_shut += 1
                else:
                    check(last.get("id") != 0, "client %d: a request with %d tokens out ended without its own "
                          "terminal event: %r" % (k, len(ids), last))
                    check(last["type"] == "error" and last.get("code") in ("shutting_down", "busy"),
                          "client %d: unexpected end %r" % (k, last))
                    n_shut += 1
        print("    SIGTERM under load: %d jobs completed, %d ended by the shutdown, exit 0" % (n_done, n_shut), flush=True)
        check(n_shut > 0 or n_done > 0, "nothing ran")
    finally:
        d.kill()


def test_bad_model_files():
    with open(MODEL, "rb") as f:
        data = f.read()
    tmp = Daemon().tmp
    rng = random.Random(3)
    variants = [("empty", b""), ("magic only", b"GGUF"), ("header cut", data[:100]),
                ("tensor table cut", data[:11000]), ("data cut by one byte", data[:-1])]
    for k in range(6):
        b = bytearray(data)
        for _ in range(4):
            b[rng.randrange(24, 11000)] = rng.randrange(256)
        variants.append(("flipped header bytes #%d" % k, bytes(b)))
    for vi, (name, blob) in enumerate(variants):
        path = os.path.join(tmp, "bad.gguf")
        with open(path, "wb") as f:
            f.write(blob)
        sock = os.path.join(tmp, "bad%d.sock" % vi)
        p = subprocess.Popen([ANED, "--model", path, "--socket", sock], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            # either refused with a message naming the file, or (a harmless
            # flip, e.g. in a token's text) serving normally
            end = time.time() + 30
            c = None
            while time.time() < end and p.poll() is None:
                try:
                    c = Conn(sock)
                    c.hello()
                    break
                except (OSError, TestFailure):
                    if c:
                        c.close()
                    c = None
                    time.sleep(0.05)
            if p.poll() is None:
                check(c is not None, "%s: neither served nor refused" % name)
                r = c.call("generate", tokens=[1], raw=True, max_tokens=4, temperature=0.0)
                check(r["type"] in ("token", "done", "error"), "%s: %r" % (name, r))
                c.close()
                p.send_signal(signal.SIGTERM)
                rc = p.wait(30)
                check(rc == 0, "%s: served, then exit %r" % (name, rc))
            else:
                err = p.stderr.read().decode("utf-8", "replace")
                check(p.returncode == 1 or p.returncode == 2, "%s: exit status %r: %s" % (name, p.returncode, err))
                check(path in err, "%s: message does not name the file: %r" % (name, err))
                check(-p.returncode not in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS), "%s: crashed" % name)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()


def main():
    if not os.access(ANED, os.X_OK):
        print("bin/aned is missing (run make)")
        print("0 passed, 1 failed")
        return 1
    passed = failed = 0
    only = set(sys.argv[1:])
    for t in (test_load_and_faults, test_sigterm_under_load, test_bad_model_files):
        if only and t.__name__ not in only:
            continue
        if run(t):
            passed += 1
        else:
            failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
