#!/usr/bin/python3
"""bin/aneclient against the real bin/aned: output formats (text and --json,
with the protocol's keys), every mode, the prompt from arguments and standard
input together, --system where no template applies, conversations
(--messages, --chat), the final newline on a terminal, exit codes, versions and
Ctrl-C. Ends with "N passed, M failed"; exits non-zero on failure."""
import json
import os
import pty
import select
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
CHAT_MODEL = os.path.join(ROOT, "tests/fixtures/models/qwen2-tiny.bf16.gguf")
GW = os.path.join(ROOT, "bin/aned-http")


def run(args, sock=None, stdin=None, env=None, timeout=60):
    """stdin: bytes to pipe in; None = /dev/null (never the test's own)."""
    cmd = [CLIENT] + (["--socket", sock] if sock else []) + args
    e = dict(os.environ)
    if env:
        e.update(env)
    kw = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=e, cwd=ROOT, **kw)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def run_pty(args, sock, interrupts=0, want=b"", timeout=30):
    """aneclient with its standard output on a terminal: (exit code, bytes
    the terminal got). With interrupts, sends that many SIGINTs (0.2 s apart)
    once want has appeared."""
    m, sl = pty.openpty()
    p = subprocess.Popen([CLIENT, "--socket", sock] + args, stdin=subprocess.DEVNULL, stdout=sl,
                         stderr=subprocess.DEVNULL, cwd=ROOT)
    os.close(sl)
    out, sent, end = b"", 0, time.time() + timeout
    try:
        while time.time() < end:
            if interrupts and sent < interrupts and want in out:
                p.send_signal(signal.SIGINT)
                sent += 1
                time.sleep(0.2)
            exited = p.poll() is not None   # (before the select: what it wrote by then is read below)
            r, _, _ = select.select([m], [], [], 0.1)
            if not r:
                if exited:
                    break
                continue
            try:
                d = os.read(m, 65536)
            except OSError:   # EIO: the terminal's other side is closed
                break
            if not d:
                break
            out += d
        if p.poll() is None:
            p.kill()
        return p.wait(10), out
    finally:
        os.close(m)


def jlines(out):
    try:
        return [json.loads(l) for l in out.splitlines() if l.strip()]
    except ValueError as e:
        check(False, "output is not JSON lines (%s): %r" % (e, out[:300]))
        return []


def t_generate(d):
    ref = json.load(open(GREEDY))["generated_ids"]
    rc, out, err = run(["--tokens", "1", "-T", "0", "-n", "24", "--json"], d.sock)
    check(rc == 0, "generate --json exits 0: %d %s" % (rc, err))
    ev = jlines(out)
    toks = [e for e in ev if e.get("type") == "token"]
    done = ev[-1] if ev else {}
    check(len(toks) == 24 and done.get("type") == "done", "24 token lines then done")
    # the protocol's keys (PROTOCOL.md §6), nothing of another naming
    check(all(set(t) == {"type", "token", "text"} for t in toks), "token lines: type, token, text: %r" % toks[:1])
    check(set(done) == {"type", "finish", "tokens", "text", "usage", "timings"}, "done keys %r" % sorted(done))
    check(done.get("tokens") == ref[:24], "done.tokens is the greedy reference: %r" % done.get("tokens"))
    check([t["token"] for t in toks] == done.get("tokens"), "token lines carry the ids")
    check(done.get("text") == "".join(t["text"] for t in toks), "done.text is the streamed text")
    check(done.get("finish") == "length", "finish")
    check(set(done.get("usage", {})) >= {"prompt_tokens", "cached_tokens", "completion_tokens"}, "usage keys")
    check(set(done.get("timings", {})) >= {"queue_ms", "prefill_ms", "decode_ms", "prefill_tps", "decode_tps"},
          "timings keys")
    rc, plain, err = run(["--tokens", "1", "--temp", "0", "-n", "24"], d.sock)
    check(rc == 0 and plain == done.get("text"), "plain output is the text: %r" % plain)
    # the prompt from arguments and from stdin agree
    rc1, a, _ = run(["--raw", "-T", "0", "-n", "12", "Once", "upon", "a", "time"], d.sock)
    rc2, b, _ = run(["--raw", "--temperature", "0", "-n", "12"], d.sock, stdin=b"Once upon a time\n")
    check(rc1 == 0 and rc2 == 0 and a == b and len(a) > 0, "args and stdin prompts agree: %r / %r" % (a, b))
    # stop strings and sampling options
    rc, out, _ = run(["--raw", "-T", "0", "-n", "30", "--stop", "girl", "--json", "Once upon a time"], d.sock)
    done = jlines(out)[-1]
    check(rc == 0 and done.get("finish") == "stop" and "girl" not in done.get("text", "girl"),
          "--stop: %r" % done)
    args = ["--raw", "-T", "0.9", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01", "--repeat-penalty", "1.1",
            "--repeat-last-n", "32", "--seed", "42", "-n", "20", "--json", "Once"]
    r1 = jlines(run(args, d.sock)[1])[-1].get("tokens")
    r2 = jlines(run(args, d.sock)[1])[-1].get("tokens")
    check(r1 == r2 and r1 and len(r1) == 20, "seeded sampling reproducible through the CLI")
    rc, out, _ = run(["-n", "3", "-v", "--raw", "x"], d.sock)
    rc, out, err = run(["-n", "3", "-v", "--raw", "x"], d.sock)
    check(rc == 0 and "generated" in err, "--verbose prints figures on stderr: %r" % err)


def t_modes(d):
    c = anepy.connect(d.sock)
    rc, out, _ = run(["--tokenize", "--json", "Lily went \"home\""], d.sock)
    j = jlines(out)
    check(rc == 0 and j and j[0] == {"type": "tokens", "tokens": c.tokenize('Lily went "home"')},
          "--tokenize --json: %r" % out)
    rc, out, _ = run(["--tokenize", "Lily"], d.sock)
    check(rc == 0 and out.split() == [str(i) for i in c.tokenize("Lily")], "--tokenize plain: %r" % out)
    rc, out, _ = run(["--tokenize", "--no-bos", "Lily"], d.sock)
    check(rc == 0 and out.split() == [str(i) for i in c.tokenize("Lily", add_bos=False)], "--no-bos")
    ids = c.tokenize("Lily said \"hi\".\nThen\tshe left.", add_bos=False)
    rc, out, _ = run(["--detokenize", "--json"] + [str(i) for i in ids], d.sock)
    j = jlines(out)
    check(rc == 0 and j and j[0] == {"type": "text", "text": c.detokenize(ids)}, "--detokenize --json escapes: %r" % out)
    rc, out, _ = run(["--detokenize"], d.sock, stdin=(" ".join(map(str, ids)) + "\n").encode())
    check(rc == 0 and out == c.detokenize(ids), "--detokenize ids from stdin: %r" % out)
    rc, out, _ = run(["--eval", "--top", "3", "--json", "--tokens", "1 403 407"], d.sock)
    j = jlines(out)
    pos = j[-1].get("positions") if j else None
    check(rc == 0 and pos and [p["pos"] for p in pos] == [0, 1, 2], "--eval --json positions: %r" % out[:200])
    # as --help describes it: one done line with the positions
    check(len(j) == 1 and set(j[0]) == {"type", "finish", "positions", "usage", "timings"}
          and j[0]["type"] == "done", "--eval --json is one done line: %r" % out[:200])
    rc, hlp, _ = run(["--help"])
    check('--eval: {"type":"done","finish":...,"positions":[{"pos":P,"top":[[ID,LOGIT]' in hlp,
          "--help describes --eval --json as it is")
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
    check(rc == 0 and info.get("type") == "info" and info.get("n_vocab") == 512 and "active" in info and "queued" in info
          and isinstance(info.get("per_client"), list), "--info --json: %r" % out[:200])
    rc, out, _ = run(["--info"], d.sock)
    check(rc == 0 and "vocab" in out, "--info plain")
    rc, out, _ = run(["--ping"], d.sock)
    check(rc == 0 and "pong" in out, "--ping")
    rc, out, _ = run(["--ping", "--json"], d.sock)
    check(rc == 0 and jlines(out)[0].get("type") == "pong", "--ping --json")
    rc, out, _ = run(["--ping"], None, env={"ANE_SOCKET": d.sock})
    check(rc == 0, "$ANE_SOCKET is honoured")
    c.close()


def t_exit_codes(d):
    """0 ok, 1 the request failed, 2 usage (as aned), 3 no daemon, 4 refused,
    130 interrupted; --help says so."""
    for args in (["--bogus"], ["-n", "-1", "x"], ["-T", "abc", "x"], ["--top", "3", "x"], ["--tokenize", "--eval", "x"],
                 ["--top-p", "2", "x"], ["--stop", "", "x"], ["--tokens", "1 x"], ["--info", "extra"], ["-n"],
                 ["--no-bos", "x"]):
        rc, out, err = run(args, d.sock)
        check(rc == 2 and "aneclient" in err, "usage error %r exits 2: %d %r" % (args, rc, err))
    # -t is aned's --threads: aneclient's temperature is -T, and -t says so
    rc, out, err = run(["-t", "0", "x"], d.sock)
    check(rc == 2 and "-T" in err and "--temp" in err, "-t points to -T: %d %r" % (rc, err))
    rc, out, err = run(["--raw", "x"], d.sock + ".absent")
    check(rc == 3 and "cannot connect" in err, "absent daemon exits 3: %d %r" % (rc, err))
    rc, out, err = run(["--json", "--raw", "x"], d.sock + ".absent")
    j = jlines(out)
    check(rc == 3 and j and j[0].get("type") == "error", "absent daemon, --json error line: %r" % out)
    rc, out, err = run(["--detokenize", "9999"], d.sock)
    check(rc == 1 and "invalid_token" in err, "daemon error exits 1: %d %r" % (rc, err))
    rc, out, err = run(["--json", "--tokens", "1 700"], d.sock)
    j = jlines(out)
    check(rc == 1 and j and j[0] == {"type": "error", "code": "invalid_token", "message": j[0].get("message")},
          "--json error object: %r" % out)
    rc, out, err = run(["--help"])
    check(rc == 0 and "ANE_SOCKET" in out and "Exit status: 0 ok; 1 the request failed" in out
          and "2 usage error" in out and "3 aned" in out and "4 refused" in out, "--help: exit codes")
    check("-T, --temp, --temperature" in out, "--help: -T")
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
        check(rc == 4, "refused connection exits 4: %d %r" % (rc, err))
        hold.close()
    finally:
        d2.stop()
        d2.cleanup()


def t_versions(d):
    """One version, 0.1.0: aneclient, aned (--version and its hello), aned-http."""
    rc, out, err = run(["--version"])
    check(rc == 0 and out.startswith("aneclient 0.1.0 "), "aneclient --version: %r" % out)
    p = subprocess.run([ANED, "--version"], capture_output=True, timeout=10)
    check(p.returncode == 0 and p.stdout.startswith(b"aned/0.1.0 "), "aned --version: %r" % p.stdout)
    c = anepy.connect(d.sock)
    check(c.server.get("server") == "aned/0.1.0", "hello's server: %r" % c.server.get("server"))
    c.close()
    rc, out, err = run(["--info"], d.sock)
    check(rc == 0 and "aned/0.1.0" in out, "--info names aned/0.1.0: %r" % out[:80])
    p = subprocess.run([GW, "--version"], capture_output=True, timeout=10)
    check(p.returncode == 0 and p.stdout.startswith(b"aned-http 0.1.0"), "aned-http --version: %r" % p.stdout)


def t_stdin_join(d):
    """A prompt argument and piped standard input make one prompt: the
    argument, a blank line, the input (its last newline dropped)."""
    c = anepy.connect(d.sock)
    notes = "Lily had a red ball.\nShe liked it.\n"
    joined = "Summarise:\n\n" + notes[:-1]
    want = c.tokenize(joined)
    rc, out, err = run(["--tokenize", "Summarise:"], d.sock, stdin=notes.encode())
    check(rc == 0 and out.split() == [str(i) for i in want], "argument + stdin tokenized together: %r" % out)
    g = ["--raw", "-T", "0", "-n", "8", "--json"]
    rc, out, err = run(g + ["Summarise:"], d.sock, stdin=notes.encode())
    got = jlines(out)[-1] if rc == 0 else {}
    text, ids, _ = c.generate_text(joined, raw=True, temperature=0, max_tokens=8)
    check(rc == 0 and got.get("tokens") == ids, "generation sees the input too: %r vs %r" % (got.get("tokens"), ids))
    alone = c.tokenize("Summarise:")
    for what, data in (("/dev/null", None), ("empty input", b""), ("a lone newline", b"\n")):
        rc, out, err = run(["--tokenize", "Summarise:"], d.sock, stdin=data)
        check(rc == 0 and out.split() == [str(i) for i in alone], "%s adds nothing: %r" % (what, out))
    rc, out, err = run(["--tokenize", "--no-stdin", "Summarise:"], d.sock, stdin=notes.encode())
    check(rc == 0 and out.split() == [str(i) for i in alone], "--no-stdin: %r" % out)
    # standard input alone is still the whole prompt
    rc, out, err = run(["--tokenize"], d.sock, stdin=notes.encode())
    check(rc == 0 and out.split() == [str(i) for i in c.tokenize(notes[:-1])], "stdin alone: %r" % out)
    # ids in both places: which ones? said, not guessed
    rc, out, err = run(["--detokenize", "400"], d.sock, stdin=b"401 402\n")
    check(rc == 2 and "not both" in err, "--detokenize ids in both places: %d %r" % (rc, err))
    rc, out, err = run(["--detokenize", "400"], d.sock, stdin=b" \n")
    check(rc == 0 and out == c.detokenize([400]), "--detokenize with blank stdin: %r" % out)
    rc, out, err = run(["--help"])
    check("--no-stdin" in out and "blank line" in out, "--help explains the joining")
    c.close()


def t_system(d):
    """--system is never dropped unsaid: refused where no template applies,
    and the daemon's refusal is shown."""
    for args, word in ((["--raw", "--system", "Be brief.", "Hi"], "--raw"),
                       (["--tokens", "1 403", "--system", "Be brief."], "--tokens"),
                       (["--tokenize", "--system", "Be brief.", "Hi"], "--system"),
                       (["--messages", "-", "--system", "Be brief."], "--messages")):
        rc, out, err = run(args, d.sock, stdin=b'[{"role": "user", "content": "x"}]')
        check(rc == 2 and word in err and out == "", "--system with %s is a usage error: %d %r" % (args[0], rc, err))
    # stories260K has no chat template: aned decides; an error it answers is shown
    rc, out, err = run(["--system", "Be kind", "-n", "4", "Hello"], d.sock)
    check(rc == 0 or (rc == 1 and err.startswith("aneclient: ") and "system" in err),
          "--system on a model without a template: ok or aned's error shown: %d %r" % (rc, err))
    rc, out, err = run(["--help"])
    check("Refused with --raw, --tokens and --messages" in out, "--help says where --system is refused")
    import tempfile
    tmp = tempfile.mkdtemp(prefix="aneclient-sys.")
    fake = None
    try:
        fake = Fake(tmp, 0, "err", "error")
        rc, out, err = run(["--system", "Be brief.", "Hi"], fake.sock)
        check(rc == 1 and "aneclient: invalid_value: generate: \"system\" needs a chat template" in err,
              "the daemon's error about --system is shown: %d %r" % (rc, err))
    finally:
        if fake:
            fake.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def t_tty_newline(d):
    """On a terminal the reply ends with a newline, whichever way aneclient
    ends; into a pipe it is byte for byte."""
    rc, out, err = run(["--raw", "-T", "0", "-n", "8", "--json", "Once upon"], d.sock)
    text = jlines(out)[-1].get("text", "")
    check(rc == 0 and text and not text.endswith("\n"), "the reference text has no newline: %r" % text)
    rc, piped, err = run(["--raw", "-T", "0", "-n", "8", "Once upon"], d.sock)
    check(rc == 0 and piped == text, "piped output is the text exactly: %r" % piped)
    rc, tty = run_pty(["--raw", "-T", "0", "-n", "8", "Once upon"], d.sock)
    check(rc == 0 and tty == text.encode() + b"\r\n", "terminal output ends with a newline: %r" % tty)
    ids = anepy.connect(d.sock).tokenize("Lily", add_bos=False)
    rc, tty = run_pty(["--detokenize"] + [str(i) for i in ids], d.sock)
    check(rc == 0 and tty == b"Lily\r\n", "--detokenize on a terminal: %r" % tty)
    rc, piped, err = run(["--detokenize"] + [str(i) for i in ids], d.sock)
    check(rc == 0 and piped == "Lily", "--detokenize into a pipe: %r" % piped)
    # a daemon that never confirms the cancel: Ctrl-C after 2 s, or at once
    # with a second Ctrl-C, still leaves the terminal on a fresh line
    import tempfile
    tmp = tempfile.mkdtemp(prefix="aneclient-tty.")
    fake = None
    try:
        fake = Fake(tmp, 0, "stall", "stall")
        for n in (1, 2):
            rc, tty = run_pty(["-n", "5", "Hi"], fake.sock, interrupts=n, want=b"partial")
            check(rc == 130 and tty == b"partial\r\n", "%d Ctrl-C on a stalled answer: %d %r" % (n, rc, tty))
    finally:
        if fake:
            fake.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def t_messages(d):
    """--messages: a whole conversation through the protocol's messages; the
    prompt, if given, is its last user message."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="aneclient-msg.")
    dc = Daemon(CHAT_MODEL, "chat")
    try:
        conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}]
        f = os.path.join(tmp, "conv.json")
        with open(f, "w") as fh:
            json.dump(conv, fh)
        c = anepy.connect(dc.sock)

        def reply(msgs):
            ids, text = [], ""
            for ev in c.events(c.request("generate", messages=msgs, temperature=0, max_tokens=12)):
                if ev["type"] == "token":
                    ids.append(ev["token"])
                    text += ev["text"]
                check(ev["type"] != "error", "anepy messages: %r" % ev)
            return ids, text

        want_ids, want_text = reply(conv)
        g = ["-T", "0", "-n", "12"]
        rc, out, err = run(g + ["--json", "--messages", f], dc.sock)
        done = jlines(out)[-1] if rc == 0 else {}
        check(rc == 0 and done.get("tokens") == want_ids, "--messages FILE: %d %r %r" % (rc, done, err))
        rc, out, err = run(g + ["--messages", "-"], dc.sock, stdin=json.dumps(conv).encode())
        check(rc == 0 and out == want_text, "--messages - (stdin): %r vs %r" % (out, want_text))
        # the argument is the next user turn
        ids2, text2 = reply(conv + [{"role": "assistant", "content": want_text}, {"role": "user", "content": "Why?"}])
        with open(f, "w") as fh:
            json.dump(conv + [{"role": "assistant", "content": want_text}], fh)
        rc, out, err = run(g + ["--messages", f, "Why?"], dc.sock)
        check(rc == 0 and out == text2, "--messages FILE PROMPT continues: %r vs %r" % (out, text2))
        c.close()
        # mistakes name the file and the entry
        with open(f, "w") as fh:
            fh.write('[{"role": "user", "content": "x"}, {"content": "y"}]')
        rc, out, err = run(["--messages", f], dc.sock)
        check(rc == 2 and f in err and "entry 1" in err and "role" in err, "a bad entry: %d %r" % (rc, err))
        with open(f, "w") as fh:
            fh.write('[{"role": "narrator", "content": "x"}]')
        rc, out, err = run(["--messages", f], dc.sock)
        check(rc == 2 and "entry 0" in err and "role" in err, "an unknown role: %d %r" % (rc, err))
        rc, out, err = run(["--messages", os.path.join(tmp, "absent.json")], dc.sock)
        check(rc == 2 and "absent.json" in err, "a missing file: %d %r" % (rc, err))
        for extra in (["--raw"], ["--special"], ["--tokens", "1"], ["--tokenize"]):
            rc, out, err = run(["--messages", "-"] + extra, dc.sock, stdin=b'[{"role":"user","content":"x"}]')
            check(rc == 2, "--messages with %s: %d %r" % (extra, rc, err))
        # a model without a chat template: aned's refusal is shown
        rc, out, err = run(["--messages", "-"], d.sock, stdin=b'[{"role":"user","content":"x"}]')
        check(rc == 1 and "template" in err, "--messages on stories260K: %d %r" % (rc, err))
        rc, out, err = run(["--help"])
        check("Conversations:" in out and "--messages FILE" in out, "--help says how to hold a conversation")
    finally:
        dc.stop()
        dc.cleanup()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def t_chat(d):
    """--chat: lines from a pipe are user turns sent with the whole history
    (what the daemon got, read from a fake daemon's log), the commands, a
    scripted start from --messages, failed turns, and a conversation with the
    real daemon equal to the same conversation sent message by message."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="aneclient-chat.")
    fakes = []

    def reqs(fake, want):
        end = time.time() + 5
        while True:
            try:
                with open(fake.log) as f:
                    got = [json.loads(l[4:]) for l in f if l.startswith("req ")]
            except OSError:
                got = []
            if len(got) >= want or time.time() > end:
                return got
            time.sleep(0.02)

    def U(c):
        return {"role": "user", "content": c}

    def A(c):
        return {"role": "assistant", "content": c}

    def S(c):
        return {"role": "system", "content": c}

    try:
        f = Fake(tmp, 0, "chat", "chat")
        fakes.append(f)
        lines = "Hello\nHow are you?\n/system Be brief.\nThird \u00e9\n/reset\nFourth\n  \n//slash\n/bogus\n/quit\nnot sent\n"
        rc, out, err = run(["--chat"], f.sock, stdin=lines.encode())
        check(rc == 0 and out == "Reply 1.\nReply 2.\nReply 3.\nReply 4.\nReply 5.\n",
              "--chat replies: %d %r %r" % (rc, out, err))
        check("unknown command /bogus" in err and "(conversation cleared)" in err and "(system message set)" in err,
              "--chat commands answered on stderr: %r" % err)
        got = [r["messages"] for r in reqs(f, 5)]
        want = [[U("Hello")],
                [U("Hello"), A("Reply 1."), U("How are you?")],
                [S("Be brief."), U("Hello"), A("Reply 1."), U("How are you?"), A("Reply 2."), U("Third \u00e9")],
                [S("Be brief."), U("Fourth")],
                [S("Be brief."), U("Fourth"), A("Reply 4."), U("/slash")]]
        check(got == want, "--chat sends the history with each turn:\n%r\nwant\n%r" % (got, want))
        check(all(r["prompt"] is None and r["system"] is None for r in reqs(f, 5)), "--chat sends messages alone")
        # /system alone removes it; end of input ends the conversation
        f2 = Fake(tmp, 0, "chat2", "chat")
        fakes.append(f2)
        rc, out, err = run(["--chat", "--system", "Sys", "-n", "5"], f2.sock, stdin=b"a\n/system\nb")
        got = [r["messages"] for r in reqs(f2, 2)]
        check(rc == 0 and got == [[S("Sys"), U("a")], [U("a"), A("Reply 1."), U("b")]],
              "--chat --system, /system alone: %d %r %r" % (rc, got, err))
        # a scripted start: answered at once when it ends with a user turn; the PROMPT is the next line
        conv = [S("Script."), U("q1"), A("a1"), U("q2")]
        cf = os.path.join(tmp, "conv.json")
        with open(cf, "w") as fh:
            json.dump(conv, fh)
        f3 = Fake(tmp, 0, "chat3", "chat")
        fakes.append(f3)
        rc, out, err = run(["--chat", "--messages", cf, "next", "one"], f3.sock, stdin=b"last\n")
        got = [r["messages"] for r in reqs(f3, 3)]
        check(rc == 0 and out == "Reply 1.\nReply 2.\nReply 3.\n" and got == [
            conv, conv + [A("Reply 1."), U("next one")], conv + [A("Reply 1."), U("next one"), A("Reply 2."), U("last")]],
            "--chat --messages FILE PROMPT: %d %r %r %r" % (rc, out, got, err))
        # a failed turn is said, and its message is not kept
        f4 = Fake(tmp, 0, "chat4", "error")
        fakes.append(f4)
        rc, out, err = run(["--chat"], f4.sock, stdin=b"a\nb\n")
        got = [r["messages"] for r in reqs(f4, 2)]
        check(rc == 1 and "invalid_value" in err and got == [[U("a")], [U("b")]],
              "--chat failed turns: %d %r %r" % (rc, got, err))
        # what does not go with --chat
        for extra in (["--json"], ["--raw"], ["--special"], ["--tokens", "1"], ["--eval"], ["--no-stdin"],
                      ["--messages", "-"], ["--messages", cf, "--system", "x"]):
            rc, out, err = run(["--chat"] + extra, f.sock, stdin=b"x\n")
            check(rc == 2 and ("--chat" in err or "--system" in err), "--chat with %s: %d %r" % (extra, rc, err))
        # on a terminal: a prompt, and (with libedit) the up arrow recalls a line
        f5 = Fake(tmp, 0, "chat5", "chat")
        fakes.append(f5)
        m, sl = pty.openpty()
        p = subprocess.Popen([CLIENT, "--socket", f5.sock, "--chat"], stdin=sl, stdout=sl, stderr=sl, cwd=ROOT)
        os.close(sl)
        tout = b""

        def pump(until):
            nonlocal tout
            end = time.time() + 10
            while time.time() < end and until not in tout:
                r, _, _ = select.select([m], [], [], 0.1)
                if r:
                    try:
                        tout += os.read(m, 4096)
                    except OSError:
                        return
        pump(b"> ")
        os.write(m, b"Hello\r")
        pump(b"Reply 1.\r\n> ")   # the second prompt, not the first one again
        edit = b"libedit" in subprocess.run(["ldd", CLIENT], capture_output=True).stdout
        os.write(m, b"\x1b[A\r" if edit else b"Hello\r")
        pump(b"Reply 2.\r\n")
        os.write(m, b"/quit\r")
        rc = p.wait(10)
        os.close(m)
        got = [r["messages"] for r in reqs(f5, 2)]
        check(rc == 0 and tout.startswith(b"> ") and b"Reply 2.\r\n" in tout and
              got == [[U("Hello")], [U("Hello"), A("Reply 1."), U("Hello")]],
              "--chat on a terminal (libedit %s): %d %r %r" % (edit, rc, tout, got))
        rc, out, err = run(["--help"])
        check("--chat" in out and "/reset" in out and "/system TEXT" in out, "--help tells --chat's commands")
    finally:
        for x in fakes:
            x.stop()

    # the real daemon: the same replies as the conversation sent message by message
    dc = Daemon(CHAT_MODEL, "chat")
    try:
        c = anepy.connect(dc.sock)

        def reply(msgs):
            text = ""
            for ev in c.events(c.request("generate", messages=msgs, temperature=0, max_tokens=10)):
                if ev["type"] == "token":
                    text += ev["text"]
                check(ev["type"] != "error", "anepy messages: %r" % ev)
            return text

        r1 = reply([S("Be brief."), U("Hi")])
        r2 = reply([S("Be brief."), U("Hi"), A(r1), U("Why?")])
        c.close()
        want = "".join(r + ("\n" if r and not r.endswith("\n") else "") for r in (r1, r2))
        rc, out, err = run(["--chat", "-T", "0", "-n", "10", "--system", "Be brief."], dc.sock, stdin=b"Hi\nWhy?\n")
        check(rc == 0 and out == want, "--chat on %s: %d %r vs %r %r" % (os.path.basename(CHAT_MODEL), rc, out, want, err))
    finally:
        dc.stop()
        dc.cleanup()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def t_interrupt(d):
    p = subprocess.Popen([CLIENT, "--socket", d.sock, "--raw", "-n", "0", "--json", "Once"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    line = p.stdout.readline()   # generation is under way
    check(b'"type":"token"' in line, "streaming before Ctrl-C: %r" % line)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    check(p.returncode == 130, "Ctrl-C exits 130: %r %r" % (p.returncode, err))
    last = out.decode().splitlines()[-1] if out else ""
    check('"finish":"cancelled"' in last, "the request was cancelled: %r" % last[-200:])
    c = anepy.connect(d.sock)
    info = c.info()
    check(info.get("active") == 0 or info.get("active") is None, "nothing left running: %r" % info.get("active"))
    c.close()
    # a daemon that never answers hello (a model still loading): Ctrl-C leaves at once
    import tempfile
    import socket as so
    tmp = tempfile.mkdtemp(prefix="aneclient-int.")
    path = os.path.join(tmp, "mute.sock")
    mute = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    try:
        mute.bind(path)
        mute.listen(4)
        p = subprocess.Popen([CLIENT, "--socket", path, "--ping"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        time.sleep(0.5)
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        took = time.time() - t0
        check(p.returncode == 130 and took < 2, "Ctrl-C while connecting: exit %r after %.1f s" % (p.returncode, took))
    finally:
        mute.close()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


FAKE = os.path.join(HERE, "fake_aned.py")


class Fake:
    """fake_aned.py run as uid in a world-writable directory (as /tmp is)."""

    def __init__(self, tmp, uid, tag, mode=""):
        self.sock = os.path.join(tmp, tag + ".sock")
        self.log = os.path.join(tmp, tag + ".log")
        self.p = subprocess.Popen([sys.executable, FAKE, self.sock, self.log, mode], stdout=subprocess.PIPE,
                                  preexec_fn=(lambda: as_user(uid)) if uid else None)
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
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30, preexec_fn=lambda: as_user(65533))
        err = p.stderr.decode("utf-8", "replace")
        check(p.returncode == 3 and "uid 65534" in err and "refusing" in err and "--daemon-user" in err,
              "a daemon of another user is refused: %d %r" % (p.returncode, err))
        check(b"FORGED" not in p.stdout, "no forged answer printed: %r" % p.stdout)
        check(other.conns(1) == [0], "nothing was sent to it: %r" % other.conns(1))
        # root calling it: refused as well
        rc, out, err = run(["--ping"], other.sock)
        check(rc == 3 and "uid 65534" in err, "root refuses it too: %d %r" % (rc, err))
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
        check(rc == 2 and "no-such-user-x" in err, "unknown --daemon-user is a usage error: %d %r" % (rc, err))
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
        for t in (t_generate, t_modes, t_exit_codes, t_versions, t_stdin_join, t_system, t_tty_newline, t_messages,
                  t_chat, t_interrupt, t_daemon_user):
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
