#!/usr/bin/python3
"""The model-families correctness bar end to end: every reference case of
tests/fixtures/refs through the real bin/aned and bin/aneclient
(`--eval --top 10 --json` and greedy `--json` generation), for every
architecture, weight format and the Hugging Face directory. Cases that carry
their source text are also tokenized by aned (special tokens parsed) and must
give the reference's ids.

Tolerances: transformers float64 references 0.05, llama.cpp references for
quantized files 0.15 — logits within the tolerance, top-1 equal where the
reference's top-2 margin exceeds it, greedy ids equal until the first step
whose margin is below it. Ends with "N passed, M failed"."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ANED = os.path.join(ROOT, "bin/aned")
CLIENT = os.path.join(ROOT, "bin/aneclient")
FIX = os.path.join(ROOT, "tests/fixtures")

PAIRS = [
    ("models/qwen2-tiny.bf16.gguf", "refs/qwen2-tiny.dev.json", 0.05),
    ("models/qwen3-tiny.bf16.gguf", "refs/qwen3-tiny.dev.json", 0.05),
    ("models/llama3-tiny.bf16.gguf", "refs/llama3-tiny.dev.json", 0.05),
    ("models/llama-q.bf16.gguf", "refs/llama-q.dev.json", 0.05),
    ("models/qwen35-tiny.bf16.gguf", "refs/qwen35-tiny.dev.json", 0.05),
    ("hf/qwen2-tiny", "refs/qwen2-tiny.dev.json", 0.05),
    ("models/qwen2-tiny.Q8_0.gguf", "refs/qwen2-tiny.Q8_0.llamacpp.dev.json", 0.15),
    ("models/llama-q.Q8_0.gguf", "refs/llama-q.Q8_0.llamacpp.dev.json", 0.15),
    ("models/llama-q.Q4_0.gguf", "refs/llama-q.Q4_0.llamacpp.dev.json", 0.15),
    ("models/llama-q.Q4_K_M.gguf", "refs/llama-q.Q4_K_M.llamacpp.dev.json", 0.15),
    ("models/llama-q.Q6_K.gguf", "refs/llama-q.Q6_K.llamacpp.dev.json", 0.15),
]

passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("  FAIL: " + msg, flush=True)


def client(sock, args, stdin=None):
    r = subprocess.run([CLIENT, "--socket", sock] + args, input=stdin, capture_output=True, timeout=120)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def compare_eval(name, ci, positions, ref_top, tol):
    check(len(positions) == len(ref_top), "%s case %d: %d positions, reference %d" %
          (name, ci, len(positions), len(ref_top)))
    worst = 0.0
    for p, (got, ref) in enumerate(zip(positions, ref_top)):
        gm = {int(i): v for i, v in got["top"]}
        for tid, rv in ref:
            if tid in gm:
                worst = max(worst, abs(gm[tid] - rv))
        if ref[0][1] - ref[1][1] > tol:
            check(got["top"][0][0] == ref[0][0], "%s case %d pos %d: top-1 %s, reference %s" %
                  (name, ci, p, got["top"][0], ref[0]))
    check(worst <= tol, "%s case %d: max |dlogit| %.4f over tolerance %.2f" % (name, ci, worst, tol))
    return worst


def run_pair(model, ref, tol):
    path = os.path.join(FIX, model)
    cases = json.load(open(os.path.join(FIX, ref)))["cases"]
    tmp = tempfile.mkdtemp(prefix="anemodels.")
    sock = os.path.join(tmp, "s")
    d = subprocess.Popen([ANED, "--model", path, "--socket", sock, "--threads", "2"],
                         stderr=subprocess.DEVNULL)
    worst = 0.0
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        check(os.path.exists(sock), "%s: aned started" % model)
        for ci, c in enumerate(cases):
            ids = " ".join(str(t) for t in c["tokens"])
            rc, out, err = client(sock, ["--eval", "--top", "10", "--json", "--tokens", ids])
            check(rc == 0, "%s case %d: --eval exits 0 (%s)" % (model, ci, err.strip()))
            if rc != 0:
                continue
            worst = max(worst, compare_eval(model, ci, json.loads(out)["positions"], c["top10"], tol))
            if c.get("text") is not None:
                # the case's source text through aned's tokenizer (special tokens
                # parsed, no BOS: the references were tokenized that way)
                rc, out, err = client(sock, ["--tokenize", "--special", "--no-bos", "--json", "--", c["text"]])
                toks = json.loads(out)["tokens"] if rc == 0 else None
                check(toks == c["tokens"], "%s case %d: text tokenizes to %s, reference %s" %
                      (model, ci, toks, c["tokens"]))
            n = len(c["greedy"])
            rc, out, err = client(sock, ["--tokens", ids, "--temperature", "0", "-n", str(n), "--json"])
            done = [json.loads(l) for l in out.splitlines() if l.strip()][-1] if rc == 0 else {}
            got = done.get("tokens", [])
            for i, want in enumerate(c["greedy"]):
                if c["greedy_margin"][i] < tol:
                    break
                if i >= len(got) or got[i] != want:
                    check(False, "%s case %d: greedy step %d gave %s, reference %d" %
                          (model, ci, i, got[i] if i < len(got) else None, want))
                    break
            else:
                check(True, "")
    finally:
        d.terminate()
        d.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%-34s %2d cases, max |dlogit| %.4f (tolerance %.2f)" % (model, len(cases), worst, tol), flush=True)


def main():
    for model, ref, tol in PAIRS:
        run_pair(model, ref, tol)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
