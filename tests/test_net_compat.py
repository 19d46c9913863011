"""A ``daisy_nb.Client`` program meeting what is not its run: another protocol version, a scheduler
that is gone, a hand-built context, a malformed one. Real programs (``python -c``), real sockets.

The wheel's behaviour (daisy 2.0.0, captured by running the same small programs with it):

* ``Client(context=Context(hostname="127.0.0.1", port=<nothing there>, task_id="t",
  worker_id=0))``: logs ``daisy server at 127.0.0.1:1 is not reachable; assuming the run has
  ended — this worker will exit without processing blocks``, ``connected`` is False,
  ``acquire_block()`` yields None, the program exits 0;
* ``DAISY_CONTEXT=hostname=127.0.0.1:port:task_id=t``: ``ValueError: invalid context token:
  port`` from ``Client()``, the program exits 1;
* a peer of another protocol version: "daisy protocol version mismatch ... Rebuild your workers
  against the same daisy version as the driver" (an error, not the end of the run).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from daisy_nb.runtime.context import Context
from daisy_nb.runtime.net import liveness as net_liveness
from daisy_nb.runtime.net import transport as net_transport
from daisy_nb.runtime.net import wire

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent(
    """
    import logging, os, sys
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import daisy_nb
    ctx = os.environ.get("CTX")
    client = daisy_nb.Client(None if ctx is None else daisy_nb.Context.from_env(ctx))
    print("connected", client.connected, flush=True)
    with client.acquire_block() as block:
        print("block", block, flush=True)
    print("end", flush=True)
    """
)


def run_program(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "DAISY_CONTEXT"}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, full.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], env=full, capture_output=True, text=True, timeout=timeout, check=False
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_built(port: int, **extra) -> str:
    return Context(hostname="127.0.0.1", port=port, task_id="t", worker_id=0, **extra).to_env()


def test_a_scheduler_of_another_protocol_version_is_a_loud_error_in_the_job():
    secret = os.urandom(32)
    other = wire.VERSION - 1
    listener = net_transport.Listener(
        "127.0.0.1", secret, lambda conn: conn.close(), net_liveness.liveness(), version=other
    )
    try:
        ctx = hand_built(listener.port, authkey=secret.hex())
        p = run_program({"DAISY_CONTEXT": ctx})
    finally:
        listener.close()
    assert p.returncode != 0, p  # never "the run has ended" with exit 0
    assert "end" not in p.stdout.split()
    assert "ProtocolVersionError" in p.stderr and "protocol version mismatch" in p.stderr, p.stderr
    assert f"speaks version {other}" in p.stderr and f"speaks version {wire.VERSION}" in p.stderr
    assert "Install the same daisy_nb version as the driver" in p.stderr
    assert "assuming the run has ended" not in p.stderr


def test_a_greeting_that_is_not_daisy_nb_is_another_program():
    assert wire.version_of(wire.magic(7) + b"x" * 16) == 7
    assert wire.version_of(b"HTTP/1.1 400 Bad") is None
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def answer():
        c, _ = srv.accept()
        c.sendall(b"SSH-2.0-OpenSSH_9\r\n" + b"x" * 8)
        c.close()

    import threading

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        p = run_program({"DAISY_CONTEXT": hand_built(port, authkey="00" * 32)})
    finally:
        t.join(10)
        srv.close()
    assert p.returncode == 0 and "connected False" in p.stdout and "block None" in p.stdout, p
    assert "not a daisy_nb scheduler" in p.stderr


def test_a_hand_built_context_for_a_scheduler_that_is_gone_is_the_end_of_the_run_as_in_the_wheel():
    p = run_program({"DAISY_CONTEXT": "x=1", "CTX": hand_built(free_port())})  # no authkey
    assert p.returncode == 0, p
    assert p.stdout.split("\n")[:3] == ["connected False", "block None", "end"], p.stdout
    assert "is not reachable" in p.stderr and "assuming the run has ended" in p.stderr, p.stderr
    assert "not this worker's run" not in p.stderr


def test_a_hand_built_context_without_authkey_meeting_a_live_scheduler_is_not_its_run():
    listener = net_transport.Listener("127.0.0.1", os.urandom(32), lambda conn: conn.close(), net_liveness.liveness())
    try:
        p = run_program({"DAISY_CONTEXT": hand_built(listener.port)})
    finally:
        listener.close()
    assert p.returncode == 0 and "connected False" in p.stdout and "block None" in p.stdout, p
    assert "not this worker's run (the context has no authkey)" in p.stderr


def test_a_malformed_context_token_is_named_as_the_wheel_names_it():
    with pytest.raises(ValueError, match="invalid context token: port"):
        Context.from_env_string("hostname=127.0.0.1:port:task_id=t")
    p = run_program({"DAISY_CONTEXT": "hostname=127.0.0.1:port:task_id=t"})
    assert p.returncode == 1 and "ValueError: invalid context token: port" in p.stderr, p.stderr


def test_a_failure_frame_carries_the_exceptions_type_message_and_traceback_apart():
    """Protocol 4: a failure's fields travel apart (no text to parse at the scheduler); an old
    peer cannot mistake the new layout, the greeting's version stops it first (test above).
    Protocols 5 (the hello carries the seconds a job has left) and 6 (the scheduler's DROP)
    kept this layout."""
    assert wire.VERSION == 6 and wire.MAGIC == b"DAISYNB6"
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nerrfns.DiskGone: disk 3 — gone\nline 2'
    stats = (1.5, 0.25, 1e6, 0.0, 4096.0)
    for st in (None, stats):
        msg = wire.decode_client(wire.encode_failure(12, 3, "DiskGone", "disk 3 — gone\nline 2", tb, st))
        assert msg == wire.Failure(12, 3, "DiskGone", "disk 3 — gone\nline 2", tb, st)
        assert wire.kind_name(msg) == ("F" if st is None else "E")
    huge = wire.decode_client(wire.encode_failure(1, 1, "E", "x" * (wire.MAX_MESSAGE + 10), ""))
    assert huge.message == "x" * wire.MAX_MESSAGE and huge.traceback == ""
    good = wire.encode_failure(12, 3, "DiskGone", "gone", tb)
    for bad in (good[:20], good[:24] + b"\xff" + good[25:]):  # cut short; a message length beyond the frame
        with pytest.raises(wire.WireError, match="malformed"):
            wire.decode_client(bad)
