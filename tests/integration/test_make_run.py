#!/usr/bin/python3
"""`make run` (tests/run_demo.sh) as a new user meets it: the story on
standard output with no daemon log in it (the log goes to a file whose path
is printed), the daemon stopped afterwards, also when the output is cut short
(make run | head -c 20) and when the model cannot be loaded; a missing MODEL
is a clear error; Ctrl-C while the model loads stops the daemon too; a model
with a chat template is chatted with. Ends with
"N passed, M failed"; exits non-zero on failure."""
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHAT_MODEL = "tests/fixtures/models/qwen2-tiny.bf16.gguf"
LOG_LINE = re.compile(r"aned\[\d+\]|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("  FAIL: " + msg, flush=True)
    return cond


def make_env():
    e = dict(os.environ)
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):   # not a sub-make of make test
        e.pop(k, None)
    return e


def make_run(*args, shell=None, timeout=180):
    """(exit status, stdout, stderr) of make -s run ARGS, or of a shell line."""
    cmd = ["sh", "-c", shell] if shell else ["make", "-s", "run"] + list(args)
    r = subprocess.run(cmd, cwd=ROOT, env=make_env(), stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def daemon_pid(err):
    m = re.search(r"aned \(pid (\d+)\)", err)
    return int(m.group(1)) if m else None


def gone(pid, wait=3.0):
    """True when process pid is no aned any more (within wait seconds)."""
    end = time.time() + wait
    while True:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                alive = b"aned" in f.read()
        except OSError:
            alive = False
        if not alive or time.time() > end:
            return not alive
        time.sleep(0.05)


def t_story():
    rc, out, err = make_run()
    check(rc == 0, "make run exits 0: %d %r" % (rc, err[-500:]))
    check(out.startswith("Once upon a time") and len(out) > 60, "the story is printed: %r" % out[:100])
    check(not LOG_LINE.search(out), "no daemon log in the story: %r" % out[:300])
    check(not LOG_LINE.search(err), "no daemon log on standard error either: %r" % err[:300])
    check("bin/aned-run.log" in err, "the log's path is printed: %r" % err)
    try:
        with open(os.path.join(ROOT, "bin/aned-run.log")) as f:
            log = f.read()
    except OSError:
        log = ""
    check("listening on" in log, "the log file holds aned's log: %r" % log[:200])
    pid = daemon_pid(err)
    check(pid is not None and gone(pid), "the daemon (pid %r) is stopped afterwards" % pid)


def t_head():
    rc, out, err = make_run(shell="make -s run | head -c 20", timeout=60)
    check(len(out) == 20 and out.startswith("Once upon a time"), "make run | head -c 20: %r" % out)
    check("Error" not in err and "kill" not in err, "no make or kill errors: %r" % err)
    pid = daemon_pid(err)
    check(pid is not None and gone(pid), "make run | head leaves no daemon (pid %r)" % pid)


def t_no_model():
    rc, out, err = make_run("MODEL=tests/fixtures/models/absent.gguf")
    check(rc != 0, "a missing MODEL fails: %d" % rc)
    check("MODEL=tests/fixtures/models/absent.gguf" in err and "no such file" in err,
          "a missing MODEL is named: %r" % err)
    check(out == "" and daemon_pid(err) is None, "nothing started or printed: %r %r" % (out, err))
    rc, out, err = make_run("MODEL=")
    check(rc != 0 and "MODEL is empty" in err, "an empty MODEL: %d %r" % (rc, err))


def t_bad_model():
    rc, out, err = make_run("MODEL=README.md")
    check(rc != 0, "a model that cannot load fails: %d" % rc)
    check("No such process" not in err and "kill:" not in err, "no kill errors: %r" % err)
    check("aned stopped during start-up" in err and "not a GGUF file" in err,
          "the reason, from aned's log, is shown: %r" % err)
    check(out == "", "no story text: %r" % out)
    pid = daemon_pid(err)
    check(pid is not None and gone(pid), "no daemon left (pid %r)" % pid)


def t_interrupt():
    """Ctrl-C (SIGINT to make's process group) while aned is still loading:
    the daemon is stopped too. A FIFO as the model keeps aned loading."""
    import signal
    import tempfile
    tmp = tempfile.mkdtemp(prefix="make-run.")
    fifo = os.path.join(tmp, "model.gguf")
    os.mkfifo(fifo)
    try:
        p = subprocess.Popen(["make", "-s", "run", "MODEL=" + fifo], cwd=ROOT, env=make_env(),
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        err = b""
        end = time.time() + 60
        while b"its log" not in err and time.time() < end:   # aned started
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            err += chunk
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, rest = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, rest = p.communicate()
        err = (err + rest).decode("utf-8", "replace")
        check(p.returncode != 0, "interrupted make run fails: %r" % p.returncode)
        pid = daemon_pid(err)
        check(pid is not None and gone(pid), "Ctrl-C while loading leaves no daemon (pid %r): %r" % (pid, err))
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def t_chat_model():
    rc, out, err = make_run("MODEL=" + CHAT_MODEL, "PROMPT=Zebra quartz umbrella")
    check(rc == 0, "make run on an instruct model: %d %r" % (rc, err[-500:]))
    check("chat template" in err, "it says it chats: %r" % err)
    check(not out.startswith("Zebra quartz umbrella") and out.strip(), "an answer, not a continuation: %r" % out[:100])
    check(not LOG_LINE.search(out), "no daemon log in the answer: %r" % out[:300])
    pid = daemon_pid(err)
    check(pid is not None and gone(pid), "the daemon (pid %r) is stopped afterwards" % pid)


def main():
    if not os.access(os.path.join(ROOT, "bin/aned"), os.X_OK):
        print("bin/aned is missing: build first (make)")
        print("0 passed, 1 failed")
        return 1
    for t in (t_story, t_head, t_no_model, t_bad_model, t_interrupt, t_chat_model):
        f0 = failed
        try:
            t()
        except Exception:   # noqa: BLE001 — every failure is reported
            import traceback
            check(False, "%s raised:\n%s" % (t.__name__, traceback.format_exc()))
        print("%-24s %s" % (t.__name__, "ok" if failed == f0 else "FAIL"), flush=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
