#!/usr/bin/python3
"""A stand-in for aned that anyone could run: it listens on SOCKET, answers
hello, ping and generate (with a forged answer), and appends one line per
connection to LOG: "bytes N" (what the client sent). The trust tests run it
as another user to check that clients refuse it before sending anything.

usage: fake_aned.py SOCKET LOG [MODE]      (prints "ready" once listening)

Every generate request is also logged, as "req JSON" (its messages, prompt
and system). MODE "chat": generate is answered "Reply N." (N counting the
connection's requests from 1) in two tokens. MODE "stall": generate gets one token ("partial", no newline) and then
nothing, cancel included, as from a daemon that hangs mid-answer. MODE
"error": generate gets an error event (invalid_value) as its only answer."""
import json
import os
import socket
import sys

import msgpack


def serve(conn, log, mode):
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    got = 0
    n_gen = 0
    conn.settimeout(10)
    try:
        while True:
            d = conn.recv(65536)
            if not d:
                break
            got += len(d)
            u.feed(d)
            for m in u:
                if not isinstance(m, dict):
                    continue
                t, i = m.get("type"), m.get("id", 0)
                if t == "generate":
                    n_gen += 1
                    with open(log, "a") as f:
                        f.write("req %s\n" % json.dumps({k: m.get(k) for k in ("messages", "prompt", "system")}))
                if t == "hello":
                    out = [{"type": "hello", "id": 0, "version": 1, "server": "fake", "model": "forged"}]
                elif t == "ping":
                    out = [{"type": "pong", "id": i}]
                elif t == "generate" and mode == "chat":
                    out = [{"type": "token", "id": i, "token": 5, "text": "Reply"},
                           {"type": "token", "id": i, "token": 6, "text": " %d." % n_gen},
                           {"type": "done", "id": i, "finish": "stop",
                            "usage": {"prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 2},
                            "timings": {"queue_ms": 0.0, "prefill_ms": 0.0, "decode_ms": 0.0,
                                        "prefill_tps": 0.0, "decode_tps": 0.0}}]
                elif t == "generate" and mode == "stall":
                    out = [{"type": "token", "id": i, "token": 5, "text": "partial"}]
                elif t == "generate" and mode == "error":
                    out = [{"type": "error", "id": i, "code": "invalid_value",
                            "message": "generate: \"system\" needs a chat template; this model has none"}]
                elif t == "cancel":
                    out = []
                elif t == "generate":
                    out = [{"type": "token", "id": i, "token": 5, "text": "FORGED"},
                           {"type": "done", "id": i, "finish": "length",
                            "usage": {"prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1},
                            "timings": {"queue_ms": 0.0, "prefill_ms": 0.0, "decode_ms": 0.0,
                                        "prefill_tps": 0.0, "decode_tps": 0.0}}]
                else:
                    out = [{"type": "error", "id": i, "code": "bad_request", "message": "fake"}]
                conn.sendall(b"".join(msgpack.packb(x) for x in out))
    except OSError:
        pass
    finally:
        conn.close()
        with open(log, "a") as f:
            f.write("bytes %d\n" % got)


def main():
    path, log = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    try:
        os.unlink(path)
    except OSError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o666)
    s.listen(8)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        serve(c, log, mode)


if __name__ == "__main__":
    main()
