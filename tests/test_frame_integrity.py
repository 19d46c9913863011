"""Integrity of the TCP path (issue 19): every frame authenticated, handshake slots per peer
address, one hello per connection, the run's secret kept out of reprs and block workers.

A man in the middle is a real loopback TCP proxy (a thread of this test) between a worker's
``Client`` and the scheduler: it forwards the handshake unchanged and flips one bit of one
frame after it, in each direction and in every frame kind. Nothing it changes may be
believed: the tracking store's done marks are exactly the blocks that really succeeded, the
connection ends within a second, and the run completes on other connections.
"""

import hashlib
import hmac
import logging
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import integrityfns as fns  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402
import daisy_nb.runtime.local.pool as pool_mod  # noqa: E402
from daisy_nb.runtime.net import frames as net_frames  # noqa: E402
from daisy_nb.runtime.net import liveness as net_liveness
from daisy_nb.runtime.net import transport as net_transport
from daisy_nb.tracking import read_tracking  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120)]

FAST = {"DAISY_NB_HEARTBEAT_SECS": "0.3", "DAISY_NB_PEER_TIMEOUT_SECS": "3", "DAISY_NB_AUTH_TIMEOUT_SECS": "2"}
N_BLOCKS = 12
C2S_HANDSHAKE = net_transport.MAC + net_transport.NONCE  # bytes the client sends before its first frame
S2C_HANDSHAKE = len(net_transport.MAGIC) + net_transport.NONCE + net_transport.MAC


def make_task(tid, n, fn, **kw):
    kw.setdefault("tracking_path", False)
    return daisy_nb.Task(
        tid, Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn,
        read_write_conflict=False, **kw,
    )  # fmt: skip


def run(task, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("summary", False)
    return daisy_nb.run_blockwise(task, return_states=True, **kw)


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def fast(monkeypatch):
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


# ------------------------------------------------------------------ the proxy
def _kind(payload: bytes) -> str:
    """A frame's kind: its first byte (``G``, ``E`` too); for a release, ``R`` and its status (2
    success, 3 failed: after the index, before the stats of a ``resource_tracking`` release)."""
    k = payload[:1].decode("latin-1")
    if k == "R":
        return f"R{int.from_bytes(payload[9:17], 'little', signed=True)}"
    return k


class FlipProxy:
    """Forwards connections on its port to the scheduler's (``upstream``, set once known); flips
    one bit of the first frame of ``kind`` going ``direction`` (``c2s``/``s2c``) after the
    handshake, at ``where``: in the payload (``payload``), its length, its header tag or its
    tag. Records when it flipped and when that connection ended (either end closed it)."""

    PAYLOAD_BIT = {  # (offset in the payload, bit): a change the old protocol would have believed
        "R2": (9, 0),  # status 2 -> 3
        "R3": (9, 0),  # status 3 -> 2: a failed block recorded done
        "B": (1, 0),  # the block's index: the worker runs one block, releases another
        "H": (1, 0),  # the worker id
        # the index of the block given back: another block (or none, if not held) would go back,
        # and the one really given back would stay with the connection, never to be run or
        # failed: the run would never end (the test times out)
        "G": (1, 0),
        # the failed block's index: the failure charged to another block (one done, or the one
        # sent ahead), the failed one held by the connection for ever: the run would never end
        "E": (1, 0),
    }

    def __init__(self, direction: str, kind: str, where: str = "payload"):
        self.direction, self.kind, self.where = direction, kind, where
        self.upstream: int | None = None
        self.flipped_at: float | None = None
        self.closed_at: float | None = None
        self.connections = 0
        self._lock = threading.Lock()
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self._lsock.getsockname()[1]
        self._stop = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self._lsock.accept()
            except OSError:
                return
            if self._stop or self.upstream is None:
                c.close()
                continue
            u = socket.create_connection(("127.0.0.1", self.upstream))
            self.connections += 1
            conn = {"flipped": False, "closed": False, "socks": (c, u)}
            for src, dst, d, skip in ((c, u, "c2s", C2S_HANDSHAKE), (u, c, "s2c", S2C_HANDSHAKE)):
                t = threading.Thread(target=self._pump, args=(src, dst, d, skip, conn), daemon=True)
                t.start()
                self._threads.append(t)

    def _target(self, frame: bytearray, d: str) -> int | None:
        """The bit to flip in this frame (an index into its bits), or None."""
        if d != self.direction or self.flipped_at is not None:
            return None
        payload = bytes(frame[net_frames.HEADER : len(frame) - net_frames.TAG])
        if _kind(payload) != self.kind:
            return None
        if self.where == "len":
            return 4  # the length's bit 4: 16 bytes more or less
        if self.where == "htag":
            return 8 * 5
        if self.where == "tag":
            return 8 * (len(frame) - 1) + 7
        off, bit = self.PAYLOAD_BIT.get(self.kind, (0, 0))  # else the kind byte: P <-> Q, F -> G, A -> @, ...
        return 8 * (net_frames.HEADER + off) + bit

    def _pump(self, src, dst, d, skip, conn):
        buf = bytearray()
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                out = bytearray()
                if skip:  # the handshake goes through unchanged
                    take = min(skip, len(buf))
                    out += buf[:take]
                    del buf[:take]
                    skip -= take
                while not skip and len(buf) >= net_frames.HEADER:
                    n = int.from_bytes(buf[:4], "little")
                    size = net_frames.HEADER + n + net_frames.TAG
                    if len(buf) < size:
                        break
                    frame = buf[:size]
                    del buf[:size]
                    with self._lock:
                        bit = self._target(frame, d)
                        if bit is not None:
                            frame[bit // 8] ^= 1 << (bit % 8)
                            self.flipped_at = time.monotonic()
                            conn["flipped"] = True
                    out += frame
                dst.sendall(out)
        except OSError:
            pass
        finally:
            with self._lock:
                if conn["flipped"] and self.closed_at is None:
                    self.closed_at = time.monotonic()
                if not conn["closed"]:
                    conn["closed"] = True
                    for s in conn["socks"]:
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

    def close(self):
        self._stop = True
        self._lsock.close()
        for t in self._threads[1:]:
            t.join(10)


CASES = [
    ("c2s", "H", "payload"),
    ("c2s", "A", "payload"),
    ("c2s", "R2", "payload"),
    ("c2s", "R3", "payload"),
    ("c2s", "F", "payload"),
    ("c2s", "P", "payload"),
    ("c2s", "Q", "payload"),
    ("c2s", "G", "payload"),
    ("c2s", "E", "payload"),
    ("c2s", "R2", "len"),
    ("c2s", "R3", "tag"),
    ("c2s", "G", "tag"),
    ("c2s", "E", "tag"),
    ("s2c", "B", "payload"),
    ("s2c", "N", "payload"),
    ("s2c", "P", "payload"),
    ("s2c", "B", "len"),
    ("s2c", "B", "htag"),
]
# what makes a kind occur in the run: (the worker's environment, task options); the others occur
# in every run (F: ALWAYS_RAISES; P: while SLOW runs; Q: at the end; A: each connection's first
# request, and after a failure)
SCENARIOS = {
    # a pause of more than GIVE_BACK_SECS after block PAUSE_AFTER: the blocks sent ahead go back
    "G": ({"INTEGRITY_PAUSE": "1"}, {}),
    # the failure of ALWAYS_RAISES carries its stats: E instead of F
    "E": ({}, {"resource_tracking": True}),
}


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize(("direction", "kind", "where"), CASES, ids=["-".join(c) for c in CASES])
def test_a_flipped_bit_is_never_believed(out, fast, tmp_path, monkeypatch, caplog, direction, kind, where):
    proxy = FlipProxy(direction, kind, where)
    orig = pool_mod._Pool._start_listener

    def patched(self):
        orig(self)
        proxy.upstream = self.port

    monkeypatch.setattr(pool_mod._Pool, "_start_listener", patched)
    monkeypatch.setenv("INTEGRITY_PROXY_PORT", str(proxy.port))
    monkeypatch.setenv("DAISY_NB_EXIT_GRACE_SECS", "0.5")
    env, task_kw = SCENARIOS.get(kind, ({}, {}))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    trk = tmp_path / "trk"
    task = make_task(
        "mitm", N_BLOCKS, fns.proxied_loop, tracking_path=trk, max_workers=1, max_retries=1, max_worker_restarts=5,
        **task_kw,
    )  # fmt: skip
    try:
        st = run(task, host="127.0.0.1")["mitm"]
    finally:
        proxy.close()
    assert proxy.flipped_at is not None, "the proxy never saw that frame"
    succeeded = {int(p.name.split("_")[1]) for p in out.glob("ok_*")}
    done = set(np.flatnonzero(np.asarray(read_tracking(trk)["done"])).tolist())
    assert done == succeeded  # never a wrong record
    assert done == set(range(N_BLOCKS)) - {fns.ALWAYS_STATUS, fns.ALWAYS_RAISES}  # the run completed
    assert st.completed_count == N_BLOCKS - 2 and st.failed_count == 2
    assert proxy.closed_at is not None and proxy.closed_at - proxy.flipped_at < 1.0, (
        "the connection was not dropped within a second of the flip"
    )
    assert proxy.connections >= 2 or (direction, kind) in (("c2s", "Q"), ("s2c", "N"))  # went on elsewhere
    if direction == "c2s":
        assert "failed its integrity check" in caplog.text
    else:
        logs = "".join(p.read_text() for p in (tmp_path / "logs" / "mitm").glob("worker_*.err"))
        assert "failed its integrity check" in logs


# ------------------------------------------------------------------ the codec itself
def test_frames_are_bound_to_their_direction_order_and_connection():
    secret, ns, nc = os.urandom(32), os.urandom(16), os.urandom(16)
    client, server = net_frames.FrameCodec.client(secret, ns, nc), net_frames.FrameCodec.server(secret, ns, nc)
    frames = [client.seal(p) for p in (b"A", b"R" + bytes(16), b"P")]
    buf = bytearray(b"".join(frames))
    assert server.open(buf) == [b"A", b"R" + bytes(16), b"P"] and not buf
    back = bytearray(server.seal(b"N"))
    assert client.open(back) == [b"N"]
    with pytest.raises(net_frames.FrameError, match="integrity"):
        server.open(bytearray(frames[0]))  # a replay
    for bad in (
        frames[1],  # out of order (sequence number 1 first)
        net_frames.FrameCodec.server(secret, ns, nc).seal(b"A"),  # the other direction's key
        net_frames.FrameCodec.client(secret, ns, os.urandom(16)).seal(b"A"),  # another connection's
        net_frames.FrameCodec.client(os.urandom(32), ns, nc).seal(b"A"),  # another run's
    ):
        with pytest.raises(net_frames.FrameError, match="integrity"):
            net_frames.FrameCodec.server(secret, ns, nc).open(bytearray(bad))
    # a frame cut in two arrives in two reads; a changed length is refused before its body is in
    whole = client.seal(b"B" + bytes(100))
    buf = bytearray(whole[:7])
    assert server.open(buf) == [] and len(buf) == 7
    buf += whole[7:]
    assert server.open(buf) == [b"B" + bytes(100)]
    head = bytearray(client.seal(b"F" + bytes(50))[: net_frames.HEADER])
    head[2] ^= 1  # 65 KiB more: never waited for
    with pytest.raises(net_frames.FrameError, match=r"integrity check \(header\)"):
        server.open(head)
    # the frames verified before a bad one are kept (they are authentic)
    c2, s2 = net_frames.FrameCodec.client(secret, ns, nc), net_frames.FrameCodec.server(secret, ns, nc)
    good, bad = c2.seal(b"R" + bytes(16)), bytearray(c2.seal(b"P"))
    bad[-1] ^= 0x80
    with pytest.raises(net_frames.FrameError) as e:
        s2.open(bytearray(good + bad))
    assert e.value.frames == [b"R" + bytes(16)]


# ------------------------------------------------------------------ handshake slots
def _answer(secret, greeting):
    ns = greeting[len(net_transport.MAGIC) :]
    nc = secrets.token_bytes(net_transport.NONCE)
    return ns, nc, hmac.new(secret, b"daisy_nb client" + ns, hashlib.sha256).digest() + nc


def test_a_flood_from_one_address_does_not_evict_another_addresses_handshake():
    """More silent handshakes from 127.0.0.2 than the old global cap (64) while one from
    127.0.0.1 is half-way: it completes; the flood only evicts its own."""
    secret = os.urandom(32)
    got = []
    tmo = {"auth": 20.0, "heartbeat": 1.0, "peer_timeout": 3.0}
    lst = net_transport.Listener("127.0.0.1", secret, got.append, tmo)
    flood = []
    try:
        real = socket.create_connection(("127.0.0.1", lst.port), timeout=10)
        greeting = recv_exact(real, len(net_transport.MAGIC) + net_transport.NONCE)
        for _ in range(3 * net_transport.MAX_PENDING_PER_PEER):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", lst.port))
            flood.append(s)
        for s in flood:  # every flood connection was accepted and greeted
            assert (
                recv_exact(s, len(net_transport.MAGIC) + net_transport.NONCE)[: len(net_transport.MAGIC)]
                == net_transport.MAGIC
            )
        ns, nc, answer = _answer(secret, greeting)
        real.sendall(answer)
        proof = recv_exact(real, net_transport.MAC)
        assert proof == hmac.new(secret, b"daisy_nb server" + ns + nc, hashlib.sha256).digest()
        wait_for(lambda: got, 5, "the authenticated connection")
        sess = net_frames.Session(real, net_frames.FrameCodec.client(secret, ns, nc))
        net_frames.send_frame(sess, b"Hhello")
        wait_for(lambda: got[0].recv_frames() == [b"Hhello"], 5, "a frame")

        def evicted(s):
            s.settimeout(0.01)
            try:
                return s.recv(1) == b""
            except TimeoutError:
                return False

        wait_for(
            lambda: sum(map(evicted, flood)) >= len(flood) - net_transport.MAX_PENDING_PER_PEER, 10, "the flood evicted"
        )
        got[0].close()
    finally:
        for s in flood:
            s.close()
        lst.close()


class Flooder:
    """Keeps ``n`` silent handshakes open from 127.0.0.2 to ``port``, replacing each one the
    listener drops, until stopped."""

    def __init__(self, port: int, n: int):
        self.port, self.n, self.opened = port, n, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        socks: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                for s in [s for s in socks if self._dropped(s)]:
                    socks.remove(s)
                    s.close()
                while len(socks) < self.n and not self.stop.is_set():
                    s = socket.socket()
                    s.bind(("127.0.0.2", 0))
                    try:
                        s.connect(("127.0.0.1", self.port))
                    except OSError:
                        s.close()
                        break
                    s.setblocking(False)
                    socks.append(s)
                    self.opened += 1
                self.stop.wait(0.01)
        finally:
            for s in socks:
                s.close()

    @staticmethod
    def _dropped(s) -> bool:
        try:
            while True:
                data = s.recv(4096)
                if not data:
                    return True
        except BlockingIOError:
            return False
        except OSError:
            return True


@pytest.mark.usefixtures("no_leaks")
def test_a_worker_gets_in_during_a_handshake_flood_from_another_address(out, fast, monkeypatch):
    flooders = []
    orig = pool_mod._Pool._start_listener

    listeners = []

    def patched(self):
        orig(self)
        listeners.append(self.listener)
        f = Flooder(self.port, 3 * net_transport.MAX_PENDING_PER_PEER)
        flooders.append(f)
        wait_for(lambda: f.opened >= 2 * net_transport.MAX_PENDING_PER_PEER, 20, "the flood")

    monkeypatch.setattr(pool_mod._Pool, "_start_listener", patched)
    monkeypatch.setenv("DAISY_NB_AUTH_TIMEOUT_SECS", "20")  # the flood's handshakes never time out on their own
    try:
        st = run(make_task("fl", 10, fns.client_loop, max_workers=2, max_worker_restarts=0), host="127.0.0.1")["fl"]
    finally:
        for f in flooders:
            f.stop.set()
            f.thread.join(10)
    assert st.completed_count == 10 and st.worker_failure_count == 0
    assert {int(p.name.split("_")[1]) for p in out.glob("ok_*")} == set(range(10))
    assert listeners[0].rejected > 0  # the flood went on during the run: the listener evicted its own


def test_a_dropped_handshake_is_tried_once_more():
    """A listener that closes the first handshake (as one under a flood would) and completes the
    second: the client gets in instead of concluding "another run"."""
    secret = os.urandom(32)
    srv = socket.create_server(("127.0.0.1", 0))
    seen = []

    def serve():
        for attempt in range(2):
            c, _ = srv.accept()
            with c:
                ns = os.urandom(net_transport.NONCE)
                c.sendall(net_transport.MAGIC + ns)
                seen.append(attempt)
                if attempt == 0:
                    continue  # dropped
                data = recv_exact(c, net_transport.MAC + net_transport.NONCE)
                c.sendall(
                    hmac.new(secret, b"daisy_nb server" + ns + data[net_transport.MAC :], hashlib.sha256).digest()
                )
                codec = net_frames.FrameCodec.server(secret, ns, data[net_transport.MAC :])
                buf = bytearray()
                while not (frames := codec.open(buf)):
                    buf += c.recv(100)
                c.sendall(codec.seal(frames[0][::-1]))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        sess = net_transport.connect("127.0.0.1", srv.getsockname()[1], secret, net_liveness.liveness())
        net_frames.send_frame(sess, b"PA")
        assert net_frames.recv_frame(sess) == b"AP"
        sess.close()
    finally:
        t.join(10)
        srv.close()
    assert seen == [0, 1]


# ------------------------------------------------------------------ hello
@pytest.mark.usefixtures("no_leaks")
def test_a_second_hello_drops_the_connection_and_its_block_runs_again(out, fast):
    tid = "two\nlines: a=b"  # a task id with a newline travels in the (length-delimited) hello
    st = run(make_task(tid, 6, fns.double_hello, max_workers=1, max_retries=1))[tid]
    index, end, secs = (out / "double_hello").read_text().split()
    assert end == "closed" and float(secs) < 1.0
    assert st.completed_count == 6 and st.failed_count == 0
    assert int(index) in {int(p.name.split("_")[1]) for p in out.glob("ok_*")}  # handed out again


# ------------------------------------------------------------------ the secret
def test_context_repr_never_shows_the_secret():
    key = secrets.token_hex(32)
    ctx = daisy_nb.Context(hostname="h", port=1, task_id="t", worker_id=0, authkey=key)
    for text in (repr(ctx), str(ctx), f"{ctx}", repr([ctx])):
        assert key not in text and "authkey=<hidden>" in text and "task_id=t" in text
    assert daisy_nb.Context.from_env_string(ctx.to_env())["authkey"] == key  # what a Client program reads


@pytest.mark.usefixtures("no_leaks")
def test_block_function_workers_do_not_get_the_secret(out, caplog):
    caplog.set_level(logging.INFO, logger="daisy")
    st = run(make_task("bf", 4, fns.record_env, max_workers=2))["bf"]
    assert st.completed_count == 4
    envs = [daisy_nb.Context.from_env_string(p.read_text()) for p in out.glob("env_*")]
    assert envs and all("authkey" not in e and e["task_id"] == "bf" for e in envs)
