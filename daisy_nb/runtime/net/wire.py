"""The TCP wire of ``daisy_nb.Client`` connections, both ends: version, message kinds, messages.

Standard library only: worker programs import this (``from daisy_nb import Client``
loads neither numpy nor numba).

**Version.** The scheduler's greeting starts with ``b"DAISYNB"`` and one byte, the
protocol version (``VERSION``, as ASCII ``"0" + version``), then its handshake nonce
(:mod:`.transport`). A client that reads another version raises
:class:`ProtocolVersionError`: the job ends with a non-zero status and a message to
install the driver's daisy_nb version (a job with another release must never look like
one whose run has ended). History: 1 plain frames, 2 authenticated frames, 3 a release
asks for the next block, 4 a failure carries the exception's type, message and
traceback in fields of their own, 5 a hello carries the seconds the job has left, 6 the
scheduler may tell a client to drop a block (a backup copy of it won).

**Messages.** A frame's payload (:mod:`.frames`) starts with its kind (one byte,
:class:`Kind`); integers are little-endian ``int64``, text UTF-8. Client to scheduler:

============  ==============================================================
``HELLO``     worker id, the seconds the job has left (``float64``, NaN: not known), then
              the task id (the rest of the frame; one per connection)
``ACQUIRE``   "a block, please" (only where no release asked: the first block, after a
              failure or a give-back)
``RELEASE``   index, status (2 done, 3 failed) *and* "the next one, please";
              five float64 stats follow for a ``resource_tracking`` task
``FAILURE``   index, spatial id, the byte lengths of the exception's type and message
              (``uint32`` each), then type, message and the capped traceback (the rest);
              no request
``FAILURE_STATS`` as ``FAILURE`` with five float64 stats after the lengths (``resource_tracking``)
``GIVE_BACK`` index of a block sent ahead and never started
``GOODBYE``   the client leaves: everything it holds goes back unstarted
``PING``      heartbeat
============  ==============================================================

Scheduler to client: ``BLOCK`` (index, spatial id, ndim, then read offset and shape,
write offset and shape: ``4 * ndim`` integers), ``NO_MORE`` (no more work), ``PING``,
``DROP`` (index: another copy of that block succeeded first, ``Task(speculative=...)``;
the client stops it if it runs it, and never starts it if it has not yet).

:func:`decode_client` turns a client's payload into a typed message
(:class:`Hello`, :class:`Release`, ... ; ``ACQUIRE``/``GOODBYE``/``PING`` are the
singletons :data:`ACQUIRE`, :data:`GOODBYE`, :data:`PING`); :func:`decode_server` a
scheduler's. Both raise :class:`WireError` (a ``ValueError``) on a malformed frame.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "ACQUIRE",
    "GOODBYE",
    "MAGIC",
    "MAGIC_PREFIX",
    "NO_MORE",
    "PING",
    "VERSION",
    "BlockRow",
    "Drop",
    "Failure",
    "GiveBack",
    "Hello",
    "Kind",
    "ProtocolVersionError",
    "Release",
    "WireError",
    "decode_client",
    "decode_server",
    "encode_acquire",
    "encode_block",
    "encode_drop",
    "encode_failure",
    "encode_give_back",
    "encode_goodbye",
    "encode_hello",
    "encode_no_more",
    "encode_ping",
    "encode_release",
    "index_of_block",
    "kind_name",
    "magic",
    "version_of",
]

VERSION = 6
MAGIC_PREFIX = b"DAISYNB"


def magic(version: int = VERSION) -> bytes:
    """The 8 bytes that open a scheduler's greeting for protocol ``version``."""
    if not 0 <= version <= 207:
        raise ValueError(f"protocol version must be in 0..207, got {version}")
    return MAGIC_PREFIX + bytes([48 + version])


MAGIC = magic()


def version_of(greeting: bytes) -> int | None:
    """The protocol version of a greeting's first 8 bytes, or None if it is not daisy_nb's."""
    if len(greeting) < len(MAGIC) or greeting[: len(MAGIC_PREFIX)] != MAGIC_PREFIX:
        return None
    return greeting[len(MAGIC_PREFIX)] - 48


class ProtocolVersionError(RuntimeError):
    """The scheduler speaks another version of the protocol: another daisy_nb release."""

    def __init__(self, theirs: int, ours: int = VERSION, where: str = ""):
        from daisy_nb import __version__

        at = f" at {where}" if where else ""
        super().__init__(
            f"daisy_nb protocol version mismatch: the scheduler{at} speaks version {theirs}, this worker "
            f"(daisy_nb {__version__}) speaks version {ours}. Install the same daisy_nb version as the driver "
            "(the program that called run_blockwise) where this worker runs."
        )
        self.theirs = theirs
        self.ours = ours


class WireError(ValueError):
    """A frame that is not a message of this protocol (from an authenticated peer: a bug or another release)."""


class Kind:
    """The first byte of every payload."""

    HELLO = b"H"
    ACQUIRE = b"A"
    RELEASE = b"R"
    FAILURE = b"F"
    FAILURE_STATS = b"E"
    GIVE_BACK = b"G"
    GOODBYE = b"Q"
    PING = b"P"
    BLOCK = b"B"
    NO_MORE = b"N"
    DROP = b"D"


_new = tuple.__new__
_I64 = struct.Struct("<q")
_RELEASE = struct.Struct("<qq")  # index, status
_STATS = struct.Struct("<5d")  # wall s, cpu s, peak RSS, IO read, IO write (resource_tracking)
_BLOCK_HDR = struct.Struct("<qqq")  # index, spatial id, ndim
_FAILURE = struct.Struct("<qqII")  # index, spatial id, bytes of the type, bytes of the message
_HELLO = struct.Struct("<qd")  # worker id, seconds left (NaN: not known)
MAX_MESSAGE = 8192  # characters of an exception's message sent (its traceback is capped alike)
STATS_SIZE = _STATS.size


# ------------------------------------------------------------------ typed messages
class Hello(NamedTuple):
    """A client says who it is: its worker id, its task, and how long its job has left.

    ``secs_left`` is measured by the client when it sends the hello (its job's end time minus
    its clock), so that the scheduler needs no clock that agrees with the job's machine:
    it adds the seconds to its own clock on receipt. None: the job's end is not known."""

    worker_id: int
    task_id: str
    secs_left: float | None = None


class Release(NamedTuple):
    """A block ended (status 2 done, 3 failed) and the client asks for the next one."""

    block: int  # the block's index (the scheduler's row)
    status: int
    stats: tuple[float, ...] | None


class Failure(NamedTuple):
    """A block raised (status 3, no request): the exception as its class name, ``str()`` and
    capped traceback (``daisy_nb.errors.WorkerError``'s fields)."""

    block: int  # the block's index (the scheduler's row)
    spatial_id: int
    type: str
    message: str
    traceback: str
    stats: tuple[float, ...] | None


class GiveBack(NamedTuple):
    block: int  # the block's index (the scheduler's row)


class _Bare(NamedTuple):
    kind: bytes


ACQUIRE = _Bare(Kind.ACQUIRE)
GOODBYE = _Bare(Kind.GOODBYE)
PING = _Bare(Kind.PING)
NO_MORE = _Bare(Kind.NO_MORE)


class BlockRow(NamedTuple):
    """A block as the scheduler sends it (a row of ``ListedCalls.acquire``, ``scheduling/listed.py``)."""

    block: int  # the block's index (the scheduler's row)
    spatial_id: int
    read: tuple[tuple[int, ...], tuple[int, ...]]  # offset, shape
    write: tuple[tuple[int, ...], tuple[int, ...]]


class Drop(NamedTuple):
    """Stop block ``block`` (or never start it): a backup copy of it succeeded first."""

    block: int  # the block's index (the scheduler's row)


ClientMessage = Hello | Release | Failure | GiveBack | _Bare
ServerMessage = BlockRow | Drop | _Bare


_NAMES: dict[type, str] = {Hello: "H", Release: "R", GiveBack: "G", BlockRow: "B", Drop: "D"}


def kind_name(msg: ClientMessage | ServerMessage) -> str:
    """The kind letter of a typed message (``"R"``, ``"F"``, ``"E"``: a failure with stats, ...)."""
    name = _NAMES.get(type(msg))
    if name is not None:
        return name
    if isinstance(msg, _Bare):
        return msg.kind.decode()
    if isinstance(msg, Failure):
        return "F" if msg.stats is None else "E"
    raise TypeError(f"not a message: {msg!r}")


# ------------------------------------------------------------------ client -> scheduler
def encode_hello(task_id: str, worker_id: int, secs_left: float | None = None) -> bytes:
    """A ``HELLO`` frame; ``secs_left``: the seconds the job has left now (None: not known)."""
    left = float("nan") if secs_left is None else secs_left
    return Kind.HELLO + _HELLO.pack(worker_id, left) + task_id.encode("utf-8", "surrogatepass")


def encode_acquire() -> bytes:
    return Kind.ACQUIRE


def encode_release(index: int, status: int, stats: tuple[float, ...] | None = None) -> bytes:
    tail = b"" if stats is None else _STATS.pack(*stats)
    return Kind.RELEASE + _RELEASE.pack(index, status) + tail


def encode_failure(
    index: int,
    spatial_id: int,
    etype: str,
    message: str,
    traceback: str,
    stats: tuple[float, ...] | None = None,
) -> bytes:
    """A ``FAILURE`` (``FAILURE_STATS`` with ``stats``) frame; the message is cut to ``MAX_MESSAGE``
    characters (the traceback is capped by the sender)."""
    t = etype.encode("utf-8", "replace")
    m = message[:MAX_MESSAGE].encode("utf-8", "replace")
    head = _FAILURE.pack(index, spatial_id, len(t), len(m))
    tb = traceback.encode("utf-8", "replace")
    if stats is None:
        return Kind.FAILURE + head + t + m + tb
    return Kind.FAILURE_STATS + head + _STATS.pack(*stats) + t + m + tb


def _decode_failure(msg: bytes, stats_follow: bool) -> Failure:
    index, spatial, nt, nm = _FAILURE.unpack_from(msg, 1)
    pos = 1 + _FAILURE.size
    stats = None
    if stats_follow:
        stats = _STATS.unpack_from(msg, pos)
        pos += _STATS.size
    if pos + nt + nm > len(msg):
        raise WireError(f"malformed {msg[:1]!r} frame: {nt} + {nm} bytes of text announced, {len(msg) - pos} sent")
    etype = msg[pos : pos + nt].decode("utf-8", "replace")
    message = msg[pos + nt : pos + nt + nm].decode("utf-8", "replace")
    return Failure(index, spatial, etype, message, msg[pos + nt + nm :].decode("utf-8", "replace"), stats)


def encode_give_back(index: int) -> bytes:
    return Kind.GIVE_BACK + _I64.pack(index)


def encode_goodbye() -> bytes:
    return Kind.GOODBYE


def encode_ping() -> bytes:
    return Kind.PING


def decode_client(msg: bytes) -> ClientMessage:
    """The typed message of a client's payload (:class:`WireError` if malformed)."""
    kind = msg[:1]
    try:
        if kind == Kind.RELEASE:
            index, status = _RELEASE.unpack_from(msg, 1)
            stats = None
            if len(msg) >= 1 + _RELEASE.size + _STATS.size:  # a tracked release carries its stats
                stats = _STATS.unpack_from(msg, 1 + _RELEASE.size)
            # anything but done is a failure; tuple.__new__: a NamedTuple's own __new__ is Python code (per block)
            return _new(Release, (index, 2 if status == 2 else 3, stats))
        if kind == Kind.PING:
            return PING
        if kind == Kind.ACQUIRE:
            return ACQUIRE
        if kind == Kind.GIVE_BACK:
            return GiveBack(_I64.unpack_from(msg, 1)[0])
        if kind == Kind.FAILURE or kind == Kind.FAILURE_STATS:
            return _decode_failure(msg, kind == Kind.FAILURE_STATS)
        if kind == Kind.HELLO:
            wid, left = _HELLO.unpack_from(msg, 1)
            tid = msg[1 + _HELLO.size :].decode("utf-8", "surrogatepass")
            return Hello(wid, tid, None if left != left else left)  # left != left: NaN, not known
        if kind == Kind.GOODBYE:
            return GOODBYE
    except (struct.error, UnicodeDecodeError) as e:
        raise WireError(f"malformed {kind!r} frame: {e}") from None
    raise WireError(f"unknown message kind {kind!r}")


# ------------------------------------------------------------------ scheduler -> client
def encode_block(row: list[int]) -> bytes:
    """A ``BLOCK`` frame of a flat ``[index, spatial id, *ro, *rs, *wo, *ws]`` (``ListedCalls.acquire``)."""
    nd = (len(row) - 2) // 4
    return Kind.BLOCK + struct.pack(f"<{3 + 4 * nd}q", row[0], row[1], nd, *row[2:])


def encode_no_more() -> bytes:
    return Kind.NO_MORE


def encode_drop(index: int) -> bytes:
    return Kind.DROP + _I64.pack(index)


def decode_server(msg: bytes) -> ServerMessage:
    """The typed message of a scheduler's payload (:class:`WireError` if malformed)."""
    kind = msg[:1]
    try:
        if kind == Kind.BLOCK:
            index, spatial, nd = _BLOCK_HDR.unpack_from(msg, 1)
            if not 0 <= nd <= 64:
                raise WireError(f"block frame with {nd} dimensions")
            v = struct.unpack_from(f"<{4 * nd}q", msg, 1 + _BLOCK_HDR.size)
            return BlockRow(index, spatial, (v[0:nd], v[nd : 2 * nd]), (v[2 * nd : 3 * nd], v[3 * nd :]))
        if kind == Kind.NO_MORE:
            return NO_MORE
        if kind == Kind.PING:
            return PING
        if kind == Kind.DROP:
            return Drop(_I64.unpack_from(msg, 1)[0])
    except struct.error as e:
        raise WireError(f"malformed {kind!r} frame: {e}") from None
    raise WireError(f"unknown message kind {kind!r}")


def index_of_block(msg: bytes) -> int:
    """The index of a ``BLOCK`` frame (to give it back without decoding the rest)."""
    return _I64.unpack_from(msg, 1)[0]
