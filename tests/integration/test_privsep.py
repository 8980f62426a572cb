#!/usr/bin/python3
"""Privilege separation and access control of aned: the real bin/aned started
as root with --user, clients connecting as other users (fork + setuid), the
seccomp filter, per-uid quotas, systemd readiness (NOTIFY_SOCKET).

Needs root (CI runs as root). Not root: says why, counts nothing.
Ends with "N passed, M failed"; exits non-zero on any failure."""
import json
import os
import pwd
import grp
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback

import msgpack

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ANED = os.path.join(ROOT, "bin", "aned")
MODEL = os.path.join(ROOT, "tests", "fixtures", "models", "stories260K.gguf")
STARTUP_S = 30.0

# The daemon drops to DAEMON_USER; the "other" client is NOBODY.
DAEMON_USER = "daemon"
NOBODY = "nobody"
TMPDIRS = []


class TestFailure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


def mktmp():
    t = tempfile.mkdtemp(prefix="aned-p.")
    os.chmod(t, 0o755)  # other users must reach the socket
    TMPDIRS.append(t)
    return t


def private_model(tmp):
    """A copy of the model only root can read: the daemon opens it before
    dropping root."""
    m = os.path.join(tmp, "model.gguf")
    shutil.copyfile(MODEL, m)
    os.chmod(m, 0o600)
    return m


class Notify:
    """A NOTIFY_SOCKET as systemd would provide it."""

    def __init__(self, tmp):
        self.path = os.path.join(tmp, "notify")
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(self.path)
        os.chmod(self.path, 0o666)  # the daemon sends after dropping root
        self.msgs = []

    def wait_for(self, needle, timeout=STARTUP_S):
        end = time.time() + timeout
        while time.time() < end:
            if any(needle in m for m in self.msgs):
                return True
            self.s.settimeout(max(0.01, end - time.time()))
            try:
                self.msgs.append(self.s.recv(4096).decode())
            except socket.timeout:
                break
        return any(needle in m for m in self.msgs)

    def close(self):
        self.s.close()


class Daemon:
    def __init__(self, args=(), tmp=None, model=None, env=None):
        self.tmp = tmp or mktmp()
        self.sock = os.path.join(self.tmp, "aned.sock")
        self.log = os.path.join(self.tmp, "aned.log")
        self.model = model or MODEL
        self.args = list(args)
        self.env = env
        self.proc = None

    def start(self):
        self.out = open(os.path.join(self.tmp, "stderr"), "wb")
        cmd = [ANED, "--model", self.model, "--socket", self.sock, "--log", self.log,
               "--log-level", "debug", "-t", "1"] + self.args
        env = dict(os.environ)
        env.update(self.env or {})
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, env=env)
        end = time.time() + STARTUP_S
        while time.time() < end:
            if self.proc.poll() is not None:
                raise TestFailure("aned exited %s during start-up:\n%s" % (self.proc.returncode, self.log_text()))
            if "listening on" in self.log_text():
                try:
                    r = as_user(None, self.sock, [])
                    if r.get("hello", {}).get("type") == "hello":
                        return self
                except Exception:
                    pass
            time.sleep(0.05)
        raise TestFailure("aned not ready:\n" + self.log_text())

    def log_text(self):
        t = ""
        for p in (self.log + ".1", self.log, os.path.join(self.tmp, "stderr")):
            try:
                with open(p, "rb") as f:
                    t += f.read().decode("utf-8", "replace")
            except OSError:
                pass
        return t

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self.out.close()
        except Exception:
            pass
        return self.proc.returncode if self.proc else None


# A client program run as another user: connects, says hello, sends the
# given requests, prints every event it got (JSON) until the terminal one of
# each, or until the connection closed.
CLIENT = r"""
import json, socket, sys, msgpack
path, reqs = sys.argv[1], json.loads(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
out = {}
try:
    s.connect(path)
except OSError as e:
    print(json.dumps({"connect_error": str(e)})); sys.exit(0)
u = msgpack.Unpacker(raw=False, strict_map_key=False)
def recv():
    while True:
        for o in u:
            return o
        try:
            d = s.recv(65536)
        except ConnectionResetError:  # closed with our hello unread: the same as EOF
            d = b""
        if not d:
            return None
        u.feed(d)
try:
    try:
        s.sendall(msgpack.packb({"type": "hello", "id": 1, "version": 1, "client": "privtest"}))
    except OSError:
        pass  # refused at accept: the daemon may have closed already; its reason is still there
    out["hello"] = recv()
    evs = []
    for r in reqs:
        s.sendall(msgpack.packb(r))
    want = len(reqs)
    while want and out["hello"] and out["hello"].get("type") == "hello":
        e = recv()
        if e is None:
            break
        evs.append(e)
        if e["type"] in ("done", "error", "tokens", "text", "info", "pong"):
            want -= 1
    out["events"] = evs
    if out["hello"] and out["hello"].get("type") == "error":
        out["eof"] = recv() is None
except (OSError, ValueError) as e:
    out["error"] = str(e)
print(json.dumps(out))
"""


def as_user(user, sock, reqs, groups=None, gid=None):
    """Runs CLIENT as user (None: as we are); returns its JSON."""
    def drop():
        if user is None:
            return
        pw = pwd.getpwnam(user)
        os.setgroups(groups if groups is not None else [])
        os.setgid(gid if gid is not None else pw.pw_gid)
        os.setuid(pw.pw_uid)
    p = subprocess.run([sys.executable, "-c", CLIENT, sock, json.dumps(reqs)], preexec_fn=drop,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if p.returncode != 0:
        raise TestFailure("client as %s failed: %s" % (user, p.stderr.decode()[-2000:]))
    return json.loads(p.stdout.decode())


def gen(id, n=8):
    return {"type": "generate", "id": id, "prompt": "Once upon a time", "max_tokens": n,
            "temperature": 0, "raw": True}


def thread_status(pid):
    """{tid: {field: value}} for every thread of pid."""
    res = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        d = {}
        with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
            for line in f:
                k, _, v = line.partition(":")
                d[k] = v.split()
        res[tid] = d
    return res


# ------------------------------------------------------------------ tests

def test_drop_and_confine():
    """--user: every thread has the user's ids (real, effective, saved, fs),
    no_new_privs, the seccomp filter, non-dumpable; the model file only root
    can read is served; systemd readiness is sent."""
    tmp = mktmp()
    n = Notify(tmp)
    pw = pwd.getpwnam(DAEMON_USER)
    # the default (auto) is enforce on the cpu backend; sanitizer builds say they leave it off
    d = Daemon(["--user", DAEMON_USER], tmp=tmp, model=private_model(tmp),
               env={"NOTIFY_SOCKET": n.path})
    try:
        d.start()
        check(n.wait_for("READY=1"), "no READY=1 on NOTIFY_SOCKET: %r" % n.msgs)
        check(any("MAINPID=%d" % d.proc.pid in m for m in n.msgs), "no MAINPID in %r" % n.msgs)
        ts = thread_status(d.proc.pid)
        want_seccomp = ["0"] if "sanitizer build: seccomp filter off" in d.log_text() else ["2"]
        check(len(ts) >= 2, "expected the engine's threads too, got %d thread(s)" % len(ts))
        for tid, st in ts.items():
            check(st["Uid"] == [str(pw.pw_uid)] * 4, "thread %s Uid %s" % (tid, st["Uid"]))
            check(st["Gid"] == [str(pw.pw_gid)] * 4, "thread %s Gid %s" % (tid, st["Gid"]))
            check(st["NoNewPrivs"] == ["1"], "thread %s NoNewPrivs %s" % (tid, st["NoNewPrivs"]))
            check(st["Seccomp"] == want_seccomp, "thread %s Seccomp %s" % (tid, st["Seccomp"]))
            check(st["CapEff"] == ["0000000000000000"], "thread %s CapEff %s" % (tid, st["CapEff"]))
            check(st["Groups"] == [str(g) for g in sorted(os.getgrouplist(DAEMON_USER, pw.pw_gid))]
                  or sorted(st["Groups"]) == sorted(str(g) for g in os.getgrouplist(DAEMON_USER, pw.pw_gid)),
                  "thread %s Groups %s" % (tid, st["Groups"]))
        # non-dumpable: its /proc files stay root's although it runs as DAEMON_USER
        if "sanitizer build: staying dumpable" not in d.log_text():
            check(os.stat("/proc/%d/status" % d.proc.pid).st_uid == 0, "process is dumpable")
        # the model is not readable by the daemon's user, yet it is served
        r = subprocess.run(["setpriv", "--reuid", DAEMON_USER, "--regid", DAEMON_USER, "--clear-groups",
                            "cat", d.model], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        check(r.returncode != 0, "the model file is readable by %s" % DAEMON_USER)
        out = as_user(None, d.sock, [gen(2), {"type": "info", "id": 3}, {"type": "tokenize", "id": 4, "text": "Lily"}])
        types = [e["type"] for e in out["events"]]
        check("done" in types and "info" in types and "tokens" in types, "events %s" % types)
        toks = [e for e in out["events"] if e["type"] == "token"]
        check(len(toks) == 8, "expected 8 tokens, got %d" % len(toks))
        # SIGHUP: the log is reopened after the drop (the file was given to the user)
        os.rename(d.log, d.log + ".1")
        os.chown(tmp, pw.pw_uid, -1)  # the user may create the new file here
        os.kill(d.proc.pid, signal.SIGHUP)
        end = time.time() + 5
        while time.time() < end and not (os.path.exists(d.log) and "reopened" in d.log_text()):
            time.sleep(0.05)
        check(os.path.exists(d.log) and "log file reopened" in d.log_text(),
              "log not reopened after SIGHUP:\n" + d.log_text()[-2000:])
        check(d.stop() == 0, "exit status %s" % d.proc.returncode)
        check(n.wait_for("STOPPING=1", 5), "no STOPPING=1: %r" % n.msgs)
        check("running as %s" % DAEMON_USER in d.log_text(), "no drop logged")
        check(any(w in d.log_text() for w in ("landlock (ABI", "landlock not available", "sanitizer build")),
              "landlock neither applied nor reported unavailable")
    finally:
        d.stop()
        n.close()


def test_denied_by_default():
    """By default only root and the daemon's own user may connect; another
    user gets `denied` (id 0) and the connection is closed."""
    d = Daemon(["--user", DAEMON_USER, "--socket-mode", "0666"]).start()
    try:
        out = as_user(NOBODY, d.sock, [])
        h = out.get("hello")
        check(h and h["type"] == "error" and h["code"] == "denied" and h["id"] == 0,
              "nobody got %r" % out)
        check(out.get("events") in (None, []) and out.get("eof"), "events after denied: %r" % out)
        uid = pwd.getpwnam(NOBODY).pw_uid
        check("denied connection from uid %d" % uid in d.log_text(), "denial not logged")
        # the daemon's own user is allowed
        out = as_user(DAEMON_USER, d.sock, [gen(2, 2)])
        check(out["hello"]["type"] == "hello", "daemon's own user refused: %r" % out)
    finally:
        d.stop()


def test_allow_user():
    uid = pwd.getpwnam(NOBODY).pw_uid
    for spec in (NOBODY, str(uid)):
        d = Daemon(["--user", DAEMON_USER, "--socket-mode", "0666", "--allow-user", spec]).start()
        try:
            out = as_user(NOBODY, d.sock, [gen(2, 4)])
            check(out["hello"]["type"] == "hello", "--allow-user %s: nobody refused: %r" % (spec, out))
            check(sum(e["type"] == "token" for e in out["events"]) == 4, "tokens: %r" % out)
            # root still allowed
            check(as_user(None, d.sock, [])["hello"]["type"] == "hello", "root refused")
        finally:
            d.stop()


def test_allow_group():
    """--allow-group matches the peer's primary group or any supplementary
    group (SO_PEERGROUPS); other groups stay refused."""
    ng = grp.getgrgid(pwd.getpwnam(NOBODY).pw_gid).gr_name
    d = Daemon(["--user", DAEMON_USER, "--socket-mode", "0666", "--allow-group", ng,
                "--allow-group", "4242"]).start()
    try:
        out = as_user(NOBODY, d.sock, [])
        check(out["hello"]["type"] == "hello", "primary group %s refused: %r" % (ng, out))
        # supplementary group 4242, primary group something else (users, 100)
        out = as_user(NOBODY, d.sock, [], groups=[4242], gid=100)
        check(out["hello"]["type"] == "hello", "supplementary group 4242 refused: %r" % out)
        out = as_user(NOBODY, d.sock, [], groups=[4343], gid=100)
        check(out["hello"]["type"] == "error" and out["hello"]["code"] == "denied",
              "unlisted groups admitted: %r" % out)
    finally:
        d.stop()


def test_quota_jobs_per_uid():
    """--max-jobs-per-uid counts in-flight + queued jobs of a uid across all
    its connections; past it `busy`, other users unaffected."""
    d = Daemon(["--user", DAEMON_USER, "--socket-mode", "0666", "--allow-user", NOBODY,
                "--max-jobs-per-uid", "2"]).start()
    try:
        a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        a.settimeout(20)
        a.connect(d.sock)
        ua = msgpack.Unpacker(raw=False)

        def recv_a():
            while True:
                for o in ua:
                    return o
                ua.feed(a.recv(65536))
        a.sendall(msgpack.packb({"type": "hello", "id": 1, "version": 1}))
        check(recv_a()["type"] == "hello", "hello")
        for i in (2, 3):  # long jobs: the whole context
            a.sendall(msgpack.packb(gen(i, 0)))
        # a third job from root on another connection: busy
        out = as_user(None, d.sock, [gen(9, 2)])
        errs = [e for e in out["events"] if e["type"] == "error"]
        check(errs and errs[0]["code"] == "busy" and errs[0]["id"] == 9, "third job of uid 0: %r" % out)
        # another user is not affected
        out = as_user(NOBODY, d.sock, [gen(5, 2)])
        check(any(e["type"] == "done" for e in out["events"]), "nobody's job: %r" % out)
        # the quota frees as jobs end
        a.sendall(msgpack.packb({"type": "cancel", "id": 2}))
        a.sendall(msgpack.packb({"type": "cancel", "id": 3}))
        ended = 0
        end = time.time() + 20
        while ended < 2 and time.time() < end:
            e = recv_a()
            if e["type"] in ("done", "error"):
                ended += 1
        check(ended == 2, "cancelled jobs did not end")
        out = as_user(None, d.sock, [gen(9, 2)])
        check(any(e["type"] == "done" for e in out["events"]), "after cancel: %r" % out)
        a.close()
    finally:
        d.stop()


def test_quota_clients_per_uid():
    """--max-clients-per-uid: past it a new connection gets `busy` (id 0) and
    is closed; a slot frees when a connection closes."""
    d = Daemon(["--user", DAEMON_USER, "--max-clients-per-uid", "2"]).start()
    try:
        held = []
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)
            held.append(s)
        time.sleep(0.2)
        out = as_user(None, d.sock, [])
        check(out["hello"] and out["hello"]["type"] == "error" and out["hello"]["code"] == "busy"
              and out["hello"]["id"] == 0, "third connection: %r" % out)
        held.pop().close()
        time.sleep(0.3)
        out = as_user(None, d.sock, [])
        check(out["hello"]["type"] == "hello", "after a close: %r" % out)
        for s in held:
            s.close()
    finally:
        d.stop()


def test_socket_mode_group():
    d = Daemon(["--user", DAEMON_USER, "--socket-mode", "0640", "--socket-group", "users"]).start()
    try:
        st = os.stat(d.sock)
        check(stat.S_IMODE(st.st_mode) == 0o640, "mode %o" % stat.S_IMODE(st.st_mode))
        check(st.st_gid == grp.getgrnam("users").gr_gid, "group %d" % st.st_gid)
        # nobody (not in group users) cannot even connect: the mode keeps it out
        out = as_user(NOBODY, d.sock, [])
        check("connect_error" in out, "nobody connected to a 0640 socket: %r" % out)
    finally:
        d.stop()


def test_bad_options():
    for args, needle in ((["--user", "root"], "root"), (["--user", "no-such-user-x"], "no user"),
                         (["--group", "users"], "--group needs --user"),
                         (["--allow-user", "no-such-user-x"], "no user"),
                         (["--allow-group", "no-such-group-x"], "no group"),
                         (["--seccomp", "maybe"], "--seccomp")):
        p = subprocess.run([ANED, "--model", MODEL, "--socket", "/tmp/aned-p-never.sock"] + args,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        check(p.returncode == 2 and needle in p.stdout.decode(),
              "%s: exit %d, %r" % (args, p.returncode, p.stdout.decode()))


def test_seccomp_log_and_off():
    """The filter modes start and serve; off leaves Seccomp 0."""
    for mode, want in (("log", "2"), ("off", "0")):
        d = Daemon(["--user", DAEMON_USER, "--seccomp", mode]).start()
        try:
            st = thread_status(d.proc.pid)
            check(all(s["Seccomp"] == [want] for s in st.values()), "%s: Seccomp %r" % (mode, st))
            check(all(s["NoNewPrivs"] == ["1"] for s in st.values()), "%s: NoNewPrivs" % mode)
            out = as_user(None, d.sock, [gen(2, 3)])
            check(any(e["type"] == "done" for e in out["events"]), "%s: %r" % (mode, out))
        finally:
            d.stop()


TESTS = [test_drop_and_confine, test_denied_by_default, test_allow_user, test_allow_group,
         test_quota_jobs_per_uid, test_quota_clients_per_uid, test_socket_mode_group,
         test_bad_options, test_seccomp_log_and_off]


def main():
    if os.geteuid() != 0:
        print("test_privsep: skipped: needs root (starts aned as root and connects as other users)")
        print("0 passed, 0 failed")
        return 0
    for u in (DAEMON_USER, NOBODY):
        try:
            pwd.getpwnam(u)
        except KeyError:
            print("test_privsep: skipped: no user %s on this system" % u)
            print("0 passed, 0 failed")
            return 0
    passed = failed = 0
    only = sys.argv[1:]
    for t in TESTS:
        if only and t.__name__ not in only:
            continue
        t0 = time.time()
        try:
            t()
            passed += 1
            print("%-40s ok (%.2f s)" % (t.__name__, time.time() - t0))
        except Exception:
            failed += 1
            print("%-40s FAIL" % t.__name__)
            traceback.print_exc()
        sys.stdout.flush()
    for t in TMPDIRS:
        shutil.rmtree(t, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
