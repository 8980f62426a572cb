#!/usr/bin/python3
"""The official OpenAI Node SDK (openai on npm, installed into bin/node-openai)
against aned-http with tools, on a model whose greedy reply is a known tool
call (mk_chain_model.py): openai_sdk.mjs. Skipped with a notice where node is
absent. Ends with "N passed, M failed"."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import test_protocol as tp  # noqa: E402

NODE_DIR = os.path.join(ROOT, "bin", "node-openai")


def main():
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        print("node or npm is not installed: the OpenAI Node SDK test is skipped")
        print("0 passed, 0 failed")
        return 0
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")):
        os.makedirs(NODE_DIR, exist_ok=True)
        r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", NODE_DIR, "openai@4"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if r.returncode != 0:
            print(r.stdout.decode(errors="replace")[-2000:])
            print("FAIL: npm install openai")
            print("0 passed, 1 failed")
            return 1
    tmp = tempfile.mkdtemp(prefix="aned-sdk-")
    d = gw = d2 = gw2 = None
    try:
        d = tp.Daemon(tp.chain_model(tmp), "sdk")
        key = os.path.join(tmp, "key")
        with open(key, "w") as f:
            f.write("sk-test-aned-0123456789\n")
        os.chmod(key, 0o600)
        gw = subprocess.Popen([tp.GW, "--socket", d.sock, "--listen", "127.0.0.1:0", "--api-key-file", key],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = gw.stdout.readline().decode().strip()
        if not line.startswith("aned-http listening on "):
            print("FAIL: aned-http said %r: %s" % (line, gw.stderr.read().decode(errors="replace")))
            print("0 passed, 1 failed")
            return 1
        addr = line.split()[3]
        # embeddings on a model with real weights (the chain model's hidden states are zero)
        d2 = tp.Daemon(tp.CHAT_MODEL, "sdk-emb")
        gw2 = subprocess.Popen([tp.GW, "--socket", d2.sock, "--listen", "127.0.0.1:0", "--api-key-file", key],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line2 = gw2.stdout.readline().decode().strip()
        if not line2.startswith("aned-http listening on "):
            print("FAIL: aned-http said %r: %s" % (line2, gw2.stderr.read().decode(errors="replace")))
            print("0 passed, 1 failed")
            return 1
        addr2 = line2.split()[3]
        r = subprocess.run([node, os.path.join(HERE, "openai_sdk.mjs"), "http://%s/v1" % addr, "sk-test-aned-0123456789",
                            os.path.join(NODE_DIR, "node_modules"), "http://%s/v1" % addr2],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        out = r.stdout.decode(errors="replace")
        print(out, end="")
        if "passed," not in out:
            print("0 passed, 1 failed")
            return 1
        return r.returncode
    finally:
        for g in (gw, gw2):
            if g:
                g.terminate()
                g.wait(10)
        for x in (d, d2):
            if x:
                x.stop()
                x.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
