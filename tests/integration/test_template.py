#!/usr/bin/python3
"""bin/ane-template, the chat-template renderer users debug templates with:
every case of tests/fixtures/chat/renders.dev.json (68 real templates, six
conversations each) rendered through the program must print transformers'
exact text, or exit 3 with jinja2's message where the template raises; and
the program's interface: the template's own message alone for
raise_exception, syntax errors, bad variables, --now, a template that runs
away. Ends with "N passed, M failed"."""
import json
import lzma
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROG = os.path.join(ROOT, "bin/ane-template")
CHAT = os.path.join(ROOT, "tests/fixtures/chat")
NOW = "2026-11-26T12:00:00"   # when the references' strftime_now was fixed

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("  FAIL: " + msg, flush=True)


def run(args, stdin=b"", timeout=60):
    p = subprocess.run([PROG] + args, input=stdin, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def template(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False, encoding="utf-8")
    f.write(text)
    f.close()
    return f.name


def fixture_cases():
    with lzma.open(os.path.join(CHAT, "renders.dev.json.xz"), "rt", encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    texts = raises = 0
    for c in cases:
        path = os.path.join(CHAT, "templates", c["template"])
        rc, out, err = run(["--now", NOW, path], json.dumps(c["vars"]).encode())
        what = "%s case %d" % (c["template"], c["case"])
        if c.get("error"):
            ok = rc == 3 and c["message"] in err
            check(ok, "%s: want exit 3 and %r, got %d %r" % (what, c["message"], rc, err[:200]))
            raises += ok
        else:
            want = c["text"].encode("utf-8")
            ok = rc == 0 and out == want
            if not ok and rc == 0:
                k = next((i for i in range(min(len(out), len(want))) if out[i] != want[i]), min(len(out), len(want)))
                check(ok, "%s: differs at byte %d: want %r got %r" % (what, k, want[k:k + 60], out[k:k + 60]))
            else:
                check(ok, "%s: exit %d %s" % (what, rc, err[:200]))
            texts += ok
    print("renders.dev.json through ane-template: %d/%d texts, %d/%d raises" %
          (texts, sum(1 for c in cases if not c.get("error")), raises, sum(1 for c in cases if c.get("error"))))
    check(len(cases) == 408, "408 cases, found %d" % len(cases))


def interface():
    msgs = json.dumps({"messages": [{"role": "system", "content": "s"}]}).encode()
    t = template("{% if messages[0].role != 'user' %}{{ raise_exception('Roles must start with user!') }}{% endif %}")
    rc, out, err = run([t], msgs)
    check(rc == 3 and err == "Roles must start with user!\n" and out == b"", "raise_exception: %d %r" % (rc, err))
    os.unlink(t)

    t = template("line 1\n{{ messages[0].nope.deeper }}")
    rc, out, err = run([t], msgs)
    check(rc == 3 and "UndefinedError: 'dict object' has no attribute 'nope' (line 2)" in err, "undefined: %r" % err)
    os.unlink(t)

    t = template("{% for m in messages %}{{ m.role }")
    rc, out, err = run([t], msgs)
    check(rc == 3 and "TemplateSyntaxError: line 1:" in err, "syntax error: %d %r" % (rc, err))
    os.unlink(t)

    t = template("[{{ messages|length }}|{{ custom }}|{{ '\\x00'|length }}]")
    rc, out, err = run([t], b"")
    check(rc == 0 and out == b"[0||1]", "no variables: %d %r %r" % (rc, out, err))
    rc, out, err = run([t], b'{"messages": [1, 2], "custom": "c\\u00e9"}')
    check(rc == 0 and out == "[2|cé|1]".encode(), "extra keys: %d %r" % (rc, out))
    rc, out, err = run([t], b'{"messages": [1, 2')
    check(rc == 1 and "variables" in err, "bad JSON: %d %r" % (rc, err))
    rc, out, err = run([t], b"[1, 2]")
    check(rc == 1 and "JSON object" in err, "not an object: %d %r" % (rc, err))
    os.unlink(t)

    t = template("{{ strftime_now('%Y-%m-%d %H:%M') }}")
    rc, out, err = run(["--now", "2026-01-02T03:04", t])
    check(rc == 0 and out == b"2026-01-02 03:04", "--now: %r" % out)
    rc, out, err = run(["--now", "2030-12-31", t])
    check(rc == 0 and out == b"2030-12-31 00:00", "--now date: %r" % out)
    rc, out, err = run(["--now", "yesterday", t])
    check(rc == 1 and "--now" in err, "bad --now: %d %r" % (rc, err))
    rc, out, err = run([t])
    check(rc == 0 and out == time.strftime("%Y-%m-%d").encode() + out[10:], "default time: %r" % out)
    os.unlink(t)

    rc, out, err = run(["/nonexistent/x.jinja"])
    check(rc == 1 and "No such file" in err, "missing file: %d %r" % (rc, err))
    rc, out, err = run([])
    check(rc == 1 and "usage" in err, "no arguments: %d %r" % (rc, err))

    # a template that runs away stops at a bound, quickly
    t = template("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}")
    t0 = time.time()
    rc, out, err = run([t], timeout=120)
    check(rc == 3 and "LimitError" in err and time.time() - t0 < 60, "runaway loop: %d %r" % (rc, err))
    os.unlink(t)
    t = template("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}")
    rc, out, err = run([t])
    check(rc == 3 and "nested more than" in err, "runaway recursion: %d %r" % (rc, err))
    os.unlink(t)


def main():
    if not os.access(PROG, os.X_OK):
        print("bin/ane-template is not built")
        print("0 passed, 1 failed")
        return 1
    fixture_cases()
    interface()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
