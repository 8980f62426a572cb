#!/usr/bin/python3
"""bin/aneclient against the real bin/aned: output formats (text and --json),
every mode, stdin input, exit codes and Ctrl-C. Ends with
"N passed, M failed"; exits non-zero on failure."""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import anepy  # noqa: E402
from test_protocol import Daemon, check, MODEL, GREEDY, ANED  # noqa: E402
import test_protocol as tp  # noqa: E402

CLIENT = os.path.join(ROOT, "bin/aneclient")


def run(args, sock=None, stdin=None, env=None, timeout=60):
    cmd = [CLIENT] + (["--socket", sock] if sock else []) + args
    e = dict(os.environ)
    if env:
        e.update(env)
    r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=e, cwd=ROOT)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def jlines(out):
    try:
        return [json.loads(l) for l in out.splitlines() if l.strip()]
    except ValueError as e:
        check(False, "output is not JSON lines (%s): %r" % (e, out[:300]))
        return []


def t_generate(d):
    ref = json.load(open(GREEDY))["generated_ids"]
    rc, out, err = run(["--tokens", "1", "--raw", "-t", "0", "-n", "24", "--json"], d.sock)
    check(rc == 0, "generate --json exits 0: %d %s" % (rc, err))
    ev = jlines(out)
    toks = [e for e in ev if e.get("event") == "token"]
    done = ev[-1] if ev else {}
    check(len(toks) == 24 and done.get("event") == "done", "24 token lines then done")
    check(done.get("tokens") == ref[:24], "done.tokens is the greedy reference: %r" % done.get("tokens"))
    check([t["id"] for t in toks] == done.get("tokens"), "token lines carry the ids")
    check(done.get("text") == "".join(t["text"] for t in toks), "done.text is the streamed text")
    check(done.get("finish_reason") == "length", "finish_reason")
    check(set(done.get("usage", {})) >= {"prompt_tokens", "cached_tokens", "completion_tokens"}, "usage keys")
    check(set(done.get("timings", {})) >= {"queue_ms", "prefill_ms", "decode_ms", "prefill_tps", "decode_tps"},
          "timings keys")
    rc, plain, err = run(["--tokens", "1", "--raw", "-t", "0", "-n", "24"], d.sock)
    check(rc == 0 and plain == done.get("text"), "plain output is the text: %r" % plain)
    # the prompt from arguments and from stdin agree
    rc1, a, _ = run(["--raw", "-t", "0", "-n", "12", "Once", "upon", "a", "time"], d.sock)
    rc2, b, _ = run(["--raw", "-t", "0", "-n", "12"], d.sock, stdin=b"Once upon a time\n")
    check(rc1 == 0 and rc2 == 0 and a == b and len(a) > 0, "args and stdin prompts agree: %r / %r" % (a, b))
    # stop strings and sampling options
    rc, out, _ = run(["--raw", "-t", "0", "-n", "30", "--stop", "girl", "--json", "Once upon a time"], d.sock)
    done = jlines(out)[-1]
    check(rc == 0 and done.get("finish_reason") == "stop" and "girl" not in done.get("text", "girl"),
          "--stop: %r" % done)
    args = ["--raw", "-t", "0.9", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01", "--repeat-penalty", "1.1",
            "--repeat-last-n", "32", "--seed", "42", "-n", "20", "--json", "Once"]
    r1 = jlines(run(args, d.sock)[1])[-1].get("tokens")
    r2 = jlines(run(args, d.sock)[1])[-1].get("tokens")
    check(r1 == r2 and r1 and len(r1) == 20, "seeded sampling reproducible through the CLI")
    rc, out, _ = run(["--system", "Be kind", "-n", "4", "Hello"], d.sock)
    check(rc == 0, "chat mode with --system runs")
    rc, out, _ = run(["-n", "3", "-v", "--raw", "x"], d.sock)
    rc, out, err = run(["-n", "3", "-v", "--raw", "x"], d.sock)
    check(rc == 0 and "generated" in err, "--verbose prints figures on stderr: %r" % err)


def t_modes(d):
    c = anepy.connect(d.sock)
    rc, out, _ = run(["--tokenize", "--json", "Lily went \"home\""], d.sock)
    j = jlines(out)
    check(rc == 0 and j and j[0].get("tokens") == c.tokenize('Lily went "home"'), "--tokenize --json: %r" % out)
    rc, out, _ = run(["--tokenize", "Lily"], d.sock)
    check(rc == 0 and out.split() == [str(i) for i in c.tokenize("Lily")], "--tokenize plain: %r" % out)
    rc, out, _ = run(["--tokenize", "--no-bos", "Lily"], d.sock)
    check(rc == 0 and out.split() == [str(i) for i in c.tokenize("Lily", add_bos=False)], "--no-bos")
    ids = c.tokenize("Lily said \"hi\".\nThen\tshe left.", add_bos=False)
    rc, out, _ = run(["--detokenize", "--json"] + [str(i) for i in ids], d.sock)
    j = jlines(out)
    check(rc == 0 and j and j[0].get("text") == c.detokenize(ids), "--detokenize --json escapes: %r" % out)
    rc, out, _ = run(["--detokenize"], d.sock, stdin=(" ".join(map(str, ids)) + "\n").encode())
    check(rc == 0 and out == c.detokenize(ids), "--detokenize ids from stdin: %r" % out)
    rc, out, _ = run(["--eval", "--top", "3", "--json", "--tokens", "1 403 407"], d.sock)
    j = jlines(out)
    pos = j[-1].get("positions") if j else None
    check(rc == 0 and pos and [p["pos"] for p in pos] == [0, 1, 2], "--eval --json positions: %r" % out[:200])
    check(pos and all(len(p["top"]) == 3 and all(len(x) == 2 for x in p["top"]) for p in pos), "--eval top 3 pairs")
    ref, _ = c.eval(tokens=[1, 403, 407], top=3)
    check(pos and all(abs(p["top"][k][1] - ref[i][1][k][1]) < 1e-5 and p["top"][k][0] == ref[i][1][k][0]
                      for i, p in enumerate(pos) for k in range(3)), "--eval logits printed with full precision")
    rc, out, _ = run(["--eval", "--top", "2", "--raw", "Once upon"], d.sock)
    lines = out.splitlines()
    check(rc == 0 and len(lines) >= 2 and all(len(l.split("\t")[1].split()) == 2 for l in lines), "--eval plain")
    rc, out, _ = run(["--info", "--json"], d.sock)
    j = jlines(out)
    info = j[0] if j else {}
    check(rc == 0 and info.get("n_vocab") == 512 and "active" in info and "queued" in info
          and isinstance(info.get("per_client"), list), "--info --json: %r" % out[:200])
    rc, out, _ = run(["--info"], d.sock)
    check(rc == 0 and "vocab" in out, "--info plain")
    rc, out, _ = run(["--ping"], d.sock)
    check(rc == 0 and "pong" in out, "--ping")
    rc, out, _ = run(["--ping", "--json"], d.sock)
    check(rc == 0 and jlines(out)[0].get("event") == "pong", "--ping --json")
    rc, out, _ = run(["--ping"], None, env={"ANE_SOCKET": d.sock})
    check(rc == 0, "$ANE_SOCKET is honoured")
    c.close()


def t_exit_codes(d):
    for args in (["--bogus"], ["-n", "-1", "x"], ["-t", "abc", "x"], ["--top", "3", "x"], ["--tokenize", "--eval", "x"],
                 ["--top-p", "2", "x"], ["--stop", "", "x"], ["--tokens", "1 x"], ["--info", "extra"]):
        rc, out, err = run(args, d.sock)
        check(rc == 1 and "aneclient" in err, "usage error %r exits 1: %d %r" % (args, rc, err))
    rc, out, err = run(["--raw", "x"], d.sock + ".absent")
    check(rc == 2 and "cannot connect" in err, "absent daemon exits 2: %d %r" % (rc, err))
    rc, out, err = run(["--json", "--raw", "x"], d.sock + ".absent")
    j = jlines(out)
    check(rc == 2 and j and j[0].get("event") == "error", "absent daemon, --json error line: %r" % out)
    rc, out, err = run(["--detokenize", "9999"], d.sock)
    check(rc == 4 and "invalid_token" in err, "daemon error exits 4: %d %r" % (rc, err))
    rc, out, err = run(["--json", "--tokens", "1 700"], d.sock)
    j = jlines(out)
    check(rc == 4 and j and j[0] == {"event": "error", "code": "invalid_token", "message": j[0].get("message")},
          "--json error object: %r" % out)
    rc, out, err = run(["--help"])
    check(rc == 0 and "ANE_SOCKET" in out and "Exit status" in out, "--help")
    rc, out, err = run(["--version"])
    check(rc == 0 and "aneclient" in out, "--version")
    # refused: a daemon with room for one connection, which we hold
    d2 = Daemon(MODEL, "one", ["--max-clients", "1"])
    try:
        hold = None
        for _ in range(100):   # the start-up probe may still be counted for a moment
            try:
                hold = anepy.connect(d2.sock)
                break
            except (anepy.AneError, OSError):   # refused while the probe is counted
                time.sleep(0.05)
        rc, out, err = run(["--ping"], d2.sock)
        check(rc == 3, "refused connection exits 3: %d %r" % (rc, err))
        hold.close()
    finally:
        d2.stop()
        d2.cleanup()


def t_interrupt(d):
    p = subprocess.Popen([CLIENT, "--socket", d.sock, "--raw", "-n", "0", "--json", "Once"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    line = p.stdout.readline()   # generation is under way
    check(b'"event":"token"' in line, "streaming before Ctrl-C: %r" % line)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    check(p.returncode == 130, "Ctrl-C exits 130: %r %r" % (p.returncode, err))
    last = out.decode().splitlines()[-1] if out else ""
    check('"finish_reason":"cancelled"' in last, "the request was cancelled: %r" % last[-200:])
    c = anepy.connect(d.sock)
    info = c.info()
    check(info.get("active") == 0 or info.get("active") is None, "nothing left running: %r" % info.get("active"))
    c.close()


FAKE = os.path.join(HERE, "fake_aned.py")


class Fake:
    """fake_aned.py run as uid in a world-writable directory (as /tmp is)."""

    def __init__(self, tmp, uid, tag):
        self.sock = os.path.join(tmp, tag + ".sock")
        self.log = os.path.join(tmp, tag + ".log")
        self.p = subprocess.Popen([sys.executable, FAKE, self.sock, self.log], stdout=subprocess.PIPE,
                                  preexec_fn=lambda: as_user(uid))
        line = self.p.stdout.readline()
        check(line == b"ready\n", "fake daemon as uid %d started: %r" % (uid, line))

    def conns(self, want):
        """Bytes each connection sent, once want connections have ended."""
        end = time.time() + 5
        while True:
            try:
                with open(self.log) as f:
                    got = [int(l.split()[1]) for l in f if l.startswith("bytes ")]
            except OSError:
                got = []
            if len(got) >= want or time.time() > end:
                return got
            time.sleep(0.02)

    def stop(self):
        self.p.kill()
        self.p.wait()


def as_user(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def t_daemon_user(d):
    """A socket anyone could have made is refused unless its owner is root,
    the caller, or named with --daemon-user; nothing is sent to it."""
    if os.geteuid() != 0:
        print("t_daemon_user: not root, skipped (needs other uids)")
        return
    import tempfile
    tmp = tempfile.mkdtemp(prefix="aneclient-trust.")
    os.chmod(tmp, 0o1777)
    fakes = []
    try:
        other = Fake(tmp, 65534, "nobody")
        fakes.append(other)
        # another user (65533) runs aneclient: the prompt must not reach 65534's socket
        p = subprocess.run([CLIENT, "--socket", other.sock, "--raw", "-n", "3", "a secret prompt"],
                           capture_output=True, timeout=30, preexec_fn=lambda: as_user(65533))
        err = p.stderr.decode("utf-8", "replace")
        check(p.returncode == 2 and "uid 65534" in err and "refusing" in err and "--daemon-user" in err,
              "a daemon of another user is refused: %d %r" % (p.returncode, err))
        check(b"FORGED" not in p.stdout, "no forged answer printed: %r" % p.stdout)
        check(other.conns(1) == [0], "nothing was sent to it: %r" % other.conns(1))
        # root calling it: refused as well
        rc, out, err = run(["--ping"], other.sock)
        check(rc == 2 and "uid 65534" in err, "root refuses it too: %d %r" % (rc, err))
        check(other.conns(2) == [0, 0], "nothing sent by root: %r" % other.conns(2))
        # named, by name or number: used
        for who in ("nobody", "65534"):
            p = subprocess.run([CLIENT, "--socket", other.sock, "--daemon-user", who, "--ping"],
                               capture_output=True, timeout=30, preexec_fn=lambda: as_user(65533))
            check(p.returncode == 0 and b"pong" in p.stdout,
                  "--daemon-user %s accepts it: %d %r" % (who, p.returncode, p.stderr))
        check(len(other.conns(4)) == 4 and all(n > 0 for n in other.conns(4)[2:]), "the named daemon was talked to")
        # the caller's own daemon needs no naming
        own = Fake(tmp, 65533, "own")
        fakes.append(own)
        p = subprocess.run([CLIENT, "--socket", own.sock, "--ping"], capture_output=True, timeout=30,
                           preexec_fn=lambda: as_user(65533))
        check(p.returncode == 0 and b"pong" in p.stdout, "own daemon: %d %r" % (p.returncode, p.stderr))
        # root's daemon (the real aned, run as root here) serves anyone the socket lets in
        rc, out, err = run(["--ping"], d.sock)
        check(rc == 0 and "pong" in out, "root's daemon: %d %r" % (rc, err))
        rc, out, err = run(["--daemon-user", "no-such-user-x", "--ping"], d.sock)
        check(rc == 1 and "no-such-user-x" in err, "unknown --daemon-user is a usage error: %d %r" % (rc, err))
    finally:
        for f in fakes:
            f.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if not (os.access(ANED, os.X_OK) and os.access(CLIENT, os.X_OK)):
        print("bin/aned or bin/aneclient is missing: build first (make)")
        print("0 passed, 1 failed")
        return 1
    d = Daemon(MODEL, "cli")
    try:
        for t in (t_generate, t_modes, t_exit_codes, t_interrupt, t_daemon_user):
            f0 = tp.failed
            try:
                t(d)
            except Exception:
                import traceback
                check(False, "%s raised:\n%s" % (t.__name__, traceback.format_exc()))
            print("%-24s %s" % (t.__name__, "ok" if tp.failed == f0 else "FAIL"), flush=True)
    finally:
        d.stop()
        if tp.failed:
            print("--- aned log (tail) ---\n" + d.logtext())
        d.cleanup()
    print("%d passed, %d failed" % (tp.passed, tp.failed))
    return 1 if tp.failed else 0


if __name__ == "__main__":
    sys.exit(main())
