"""The pipe between the pool and one of its worker processes: both ends, in one place.

Worker side too: the standard library only.

Frames are ``multiprocessing.connection``'s (4-byte big-endian length, then the bytes).
Pool -> worker: one pickled setup dict (its ``"wire"`` entry is :data:`VERSION`), the
function bytes, then :data:`Kind.RUN` + slot ("run the batch in shared-memory slot
``slot``") or :data:`Kind.QUIT`, or to a block worker with nothing to run :data:`Kind.TASK`
then a new setup and function bytes (it serves another task from then on, and says ready
again). Worker -> pool: :data:`Kind.READY`,
:data:`Kind.DONE` + slot (the statuses are in shared memory), :data:`Kind.RAISED` + slot
+ a :class:`Raised` (a block raised: its exception's type, message and capped traceback as
separate fields, so the pool records a structured ``daisy_nb.errors.WorkerError``; the
worker exits), and from a 0-argument worker function's
process only :data:`Kind.JOB` + JSON (a job its launcher submitted, ``daisy_nb.launch``).

A worker whose wire version differs from the pool's (another daisy_nb installed since the
run started) exits with :data:`VERSION_MISMATCH_EXIT` and says so on stderr.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "VERSION",
    "VERSION_MISMATCH_EXIT",
    "Kind",
    "Message",
    "Raised",
    "decode",
    "done",
    "job",
    "raised",
    "ready",
    "run",
    "version_error",
]

VERSION = 4  # 2: a raised block's fields apart; 3: a batch's limit word in shared memory (give-back); 4: TASK
VERSION_MISMATCH_EXIT = 86  # the worker's exit code when the pool speaks another version


class Kind:
    """The first byte of every frame after the setup."""

    RUN = b"R"  # pool -> worker: run the batch in slot k
    QUIT = b"Q"  # pool -> worker: leave
    TASK = b"T"  # pool -> block worker: serve another task; its setup and function bytes follow
    READY = b"I"  # worker -> pool: set up, ready for work
    DONE = b"D"  # worker -> pool: the batch in slot k is done
    RAISED = b"X"  # worker -> pool: a block of the batch in slot k raised; the worker exits
    JOB = b"J"  # worker function -> pool: its launcher's job report (JSON)


class Raised(NamedTuple):
    """A block that raised, as its worker reports it (:data:`Kind.RAISED`)."""

    type: str  # the exception's class name
    message: str  # str() of the exception (capped as the traceback is)
    traceback: str  # the formatted traceback, capped (``runtime/common/run_block.py``)
    block_id: int  # the block's spatial id

    def text(self, task_id: str) -> str:
        """The text daisy's logs and ``last_worker_error`` show: ``block (task, id) failed:`` and the traceback."""
        return f"block {(task_id, self.block_id)} failed:\n{self.traceback}"


class Message(NamedTuple):
    kind: bytes
    slot: int  # RUN, DONE, RAISED: the batch slot; else -1
    text: str  # JOB: the JSON; else ""
    error: Raised | None = None  # RAISED: what raised


_RAISED_HEAD = struct.Struct("<BqIII")  # slot, block id, then the byte lengths of type, message, traceback


_RUN = [Kind.RUN + bytes((k,)) for k in range(256)]
_DONE = [Kind.DONE + bytes((k,)) for k in range(256)]


def run(slot: int) -> bytes:
    return _RUN[slot]


def done(slot: int) -> bytes:
    return _DONE[slot]


def ready() -> bytes:
    return Kind.READY


def raised(slot: int, error: Raised) -> bytes:
    fields = [f.encode("utf-8", "replace") for f in (error.type, error.message, error.traceback)]
    return Kind.RAISED + _RAISED_HEAD.pack(slot, error.block_id, *map(len, fields)) + b"".join(fields)


def _decode_raised(msg: bytes) -> Message:
    slot, block_id, *sizes = _RAISED_HEAD.unpack_from(msg, 1)
    at, fields = 1 + _RAISED_HEAD.size, []
    for n in sizes:
        fields.append(msg[at : at + n].decode("utf-8", "replace"))
        at += n
    if at != len(msg):
        raise ValueError(f"a raised-block message of {len(msg)} bytes whose fields make {at}")
    return Message(Kind.RAISED, slot, "", Raised(fields[0], fields[1], fields[2], block_id))


def job(json_text: str) -> bytes:
    return Kind.JOB + json_text.encode()


def decode(msg: bytes) -> Message:
    """A frame as a :class:`Message`; ``ValueError`` for an unknown kind."""
    kind = msg[:1]
    if kind in (Kind.RUN, Kind.DONE):
        return Message(kind, msg[1], "")
    if kind == Kind.RAISED:
        return _decode_raised(msg)
    if kind == Kind.JOB:
        return Message(kind, -1, msg[1:].decode("utf-8", "replace"))
    if kind in (Kind.READY, Kind.QUIT):
        return Message(kind, -1, "")
    raise ValueError(f"unknown pool-worker message kind {kind!r}")


def version_error(theirs) -> str | None:
    """The error to report when the pool's setup names another wire version, else None."""
    if theirs == VERSION:
        return None
    return (
        f"daisy_nb worker: the pool speaks pipe protocol version {theirs!r}, this worker {VERSION}: "
        "the daisy_nb installed for the workers differs from the driver's; install the same daisy_nb "
        "version as the driver (and restart the run)"
    )
