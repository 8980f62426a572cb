"""anepy — a small Python client for aned, written from proto/PROTOCOL.md.

    import anepy
    c = anepy.connect("/tmp/aned.sock")        # connects and says hello
    for ev in c.generate("Once upon a time", max_tokens=32, temperature=0):
        if ev["type"] == "token":
            print(ev["text"], end="", flush=True)
    print(c.tokenize("Lily"), c.info()["model"])

Needs python3-msgpack (Debian) / msgpack (PyPI), version 1.0 or newer.
"""
import os
import socket
import time
from collections import deque

import msgpack

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20
TERMINAL = {"done", "error", "tokens", "text", "info", "pong", "hello"}


class AneError(Exception):
    """The daemon answered a request with an error event."""

    def __init__(self, code, message, id=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.id = id


class Closed(Exception):
    """The connection ended."""


def default_socket():
    """The default socket path (PROTOCOL.md §1)."""
    env = os.environ.get("ANE_SOCKET")
    if env:
        return env
    system = "/run/aned/aned.sock"
    try:
        import stat
        is_sock = stat.S_ISSOCK(os.stat(system).st_mode)
    except OSError:
        is_sock = False
    if os.geteuid() == 0 or is_sock:
        return system
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and xdg.startswith("/"):
        return os.path.join(xdg, "aned.sock")
    return "/tmp/aned-%d.sock" % os.getuid()


class Client:
    def __init__(self, path=None, timeout=30.0):
        self.path = path or default_socket()
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(self.path)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                         max_buffer_size=4 * MAX_FRAME)
        self.pending = {}          # id -> deque of events not yet taken
        self.other = deque()       # events read while waiting for something else
        self.next_id = 1
        self.closed = False
        self.server = None

    # -- raw level --
    def send_raw(self, data):
        """Sends bytes as they are."""
        self.sock.sendall(data)

    def send(self, msg):
        """Packs one message (a dict) and sends it."""
        self.send_raw(msgpack.packb(msg, use_bin_type=True))

    def recv(self, timeout=None):
        """The next event from the wire (a dict); raises Closed at EOF,
        socket.timeout when nothing came in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            for obj in self.unpacker:
                return obj
            if self.closed:
                raise Closed("connection closed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no event within the timeout")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.closed = True
                continue
            self.unpacker.feed(data)

    def new_id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def request(self, type, id=None, **fields):
        """Sends a request; returns its id."""
        if id is None:
            id = self.new_id()
        msg = {"type": type, "id": id}
        msg.update({k: v for k, v in fields.items() if v is not None})
        self.send(msg)
        return id

    def next_event(self, id, timeout=None):
        """The next event for request id, buffering others."""
        q = self.pending.get(id)
        if q:
            return q.popleft()
        while True:
            ev = self.recv(timeout)
            eid = ev.get("id") if isinstance(ev, dict) else None
            if eid == id:
                return ev
            if eid == 0 and ev.get("type") == "error":
                return ev   # connection-level: concerns everyone
            self.pending.setdefault(eid, deque()).append(ev)

    def events(self, id, timeout=None):
        """Iterates over the events of request id up to its terminal one."""
        while True:
            ev = self.next_event(id, timeout)
            yield ev
            if ev.get("type") in TERMINAL:
                return

    def result(self, id, timeout=None):
        """The terminal event of a request that has only one; raises AneError."""
        ev = self.next_event(id, timeout)
        if ev.get("type") == "error":
            raise AneError(ev.get("code"), ev.get("message"), ev.get("id"))
        return ev

    # -- protocol level --
    def hello(self, version=PROTOCOL_VERSION, client="anepy"):
        self.send({"type": "hello", "id": 0, "version": version, "client": client})
        ev = self.recv()
        if ev.get("type") == "error":
            raise AneError(ev.get("code"), ev.get("message"), ev.get("id"))
        if ev.get("type") != "hello":
            raise AneError("handshake", "unexpected reply %r" % (ev,))
        self.server = ev
        return ev

    def submit_generate(self, prompt=None, tokens=None, **opts):
        if tokens is not None:
            return self.request("generate", tokens=list(tokens), **opts)
        return self.request("generate", prompt=prompt, **opts)

    def generate(self, prompt=None, tokens=None, **opts):
        """Iterator over the events of one generation (token..., done|error)."""
        return self.events(self.submit_generate(prompt, tokens, **opts))

    def generate_text(self, prompt=None, tokens=None, **opts):
        """(text, ids, done event) of a whole generation; raises AneError."""
        text, ids = [], []
        for ev in self.generate(prompt, tokens, **opts):
            if ev["type"] == "token":
                text.append(ev["text"])
                ids.append(ev["token"])
            elif ev["type"] == "error":
                raise AneError(ev["code"], ev["message"], ev["id"])
            elif ev["type"] == "done":
                return "".join(text), ids, ev

    def tokenize(self, text, special=False, add_bos=True):
        return self.result(self.request("tokenize", text=text, special=special, add_bos=add_bos))["tokens"]

    def detokenize(self, tokens):
        return self.result(self.request("detokenize", tokens=list(tokens)))["text"]

    def eval(self, prompt=None, tokens=None, top=10, **opts):
        """[(pos, [[id, logit], ...]), ...], done event; raises AneError."""
        if tokens is not None:
            id = self.request("eval", tokens=list(tokens), top=top, **opts)
        else:
            id = self.request("eval", prompt=prompt, top=top, **opts)
        out = []
        for ev in self.events(id):
            if ev["type"] == "logits":
                out.append((ev["pos"], ev["top"]))
            elif ev["type"] == "error":
                raise AneError(ev["code"], ev["message"], ev["id"])
            elif ev["type"] == "done":
                return out, ev

    def embed(self, prompt=None, tokens=None, **opts):
        """(vector as a tuple of floats, done event) of one input; raises AneError."""
        import struct
        if tokens is not None:
            id = self.request("embed", tokens=list(tokens), **opts)
        else:
            id = self.request("embed", prompt=prompt, **opts)
        vec = None
        for ev in self.events(id):
            if ev["type"] == "embedding":
                b = ev["embedding"]
                vec = struct.unpack("<%df" % (len(b) // 4), b)
            elif ev["type"] == "error":
                raise AneError(ev["code"], ev["message"], ev["id"])
            elif ev["type"] == "done":
                return vec, ev

    def info(self):
        return self.result(self.request("info"))

    def ping(self):
        return self.result(self.request("ping"))["type"] == "pong"

    def cancel(self, id):
        self.send({"type": "cancel", "id": id})

    def wait_closed(self, timeout=5.0):
        """True when the daemon closes the connection within timeout (events
        still arriving are skipped)."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.recv(max(0.01, deadline - time.monotonic()))
        except Closed:
            return True
        except socket.timeout:
            return False
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def connect(path=None, hello=True, timeout=30.0, client="anepy"):
    """Opens a connection and (by default) performs the handshake."""
    c = Client(path, timeout)
    if hello:
        try:
            c.hello(client=client)
        except Exception:
            c.close()
            raise
    return c
