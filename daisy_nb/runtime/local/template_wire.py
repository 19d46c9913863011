"""The socket between the pool and its worker template (:mod:`._zygote`): both ends, in one place.

Template side too: the standard library only.

A ``SOCK_SEQPACKET`` socket pair: one message per datagram, file descriptors ride along
with ``SCM_RIGHTS``.

* pool -> template: a :class:`ForkRequest` (pickled: the worker's environment, working
  directory, ``argv`` and the names of the descriptors sent with it, ``conn``, ``out``,
  ``err`` and for a block worker ``shm``; the worker's task id, which the template's import
  memory files what the worker imports under; the modules the worker's payload needs that the
  template loads before this fork, once (``cloudpickle`` for a function sent by value); and
  this wire's :data:`VERSION`);
* template -> pool: :data:`Kind.FORKED` + pid (:class:`Forked`), sent with a pidfd of the
  new worker; :data:`Kind.EXITED` + pid + exit code (:class:`Exited`,
  ``os.waitstatus_to_exitcode``) when the template has reaped a worker.

A template that receives a request of another version (cannot happen with the template
the pool started from this very package, see ``_zygote.worker_env``) leaves, and the pool
starts its workers by exec.
"""

from __future__ import annotations

import pickle
import struct
from typing import NamedTuple

# a worker function's SIGTERM -> SIGKILL (a launcher cancels its job meanwhile): the pool's
# (``ending``) and, for workers still alive when the pool's end closes, the template's
TERM_GRACE_SECS = 3.0

__all__ = [
    "VERSION",
    "Exited",
    "ForkRequest",
    "Forked",
    "Kind",
    "decode_report",
    "decode_request",
    "encode_request",
    "exited",
    "forked",
]

VERSION = 3


class Kind:
    """The first byte of every template -> pool message."""

    FORKED = b"P"  # a worker was forked: its pid (its pidfd rides along)
    EXITED = b"X"  # the template reaped a worker: its pid and exit code


class ForkRequest(NamedTuple):
    """Pool -> template: fork a worker with this environment and these descriptors."""

    env: dict
    cwd: str
    argv: list
    fds: list  # the names of the descriptors sent with the request, in order
    task: str = ""  # the worker's task id ("": unknown)
    imports: tuple = ()  # modules to load before this fork (the worker's payload needs them)
    version: int = VERSION


class Forked(NamedTuple):
    pid: int


class Exited(NamedTuple):
    pid: int
    code: int  # os.waitstatus_to_exitcode: negative for a signal


_PID = struct.Struct("<q")
_EXIT = struct.Struct("<qq")


def encode_request(req: ForkRequest) -> bytes:
    return pickle.dumps(tuple(req))


def decode_request(msg: bytes) -> ForkRequest:
    """A request as a :class:`ForkRequest`; ``ValueError`` for another version's."""
    fields = pickle.loads(msg)
    req = ForkRequest(*fields)
    if req.version != VERSION:
        raise ValueError(f"a fork request of template wire version {req.version!r}, this template speaks {VERSION}")
    return req


def forked(pid: int) -> bytes:
    return Kind.FORKED + _PID.pack(pid)


def exited(pid: int, code: int) -> bytes:
    return Kind.EXITED + _EXIT.pack(pid, code)


def decode_report(msg: bytes) -> Forked | Exited:
    """A template -> pool message; ``ValueError`` for an unknown kind."""
    kind = msg[:1]
    if kind == Kind.FORKED:
        return Forked(*_PID.unpack_from(msg, 1))
    if kind == Kind.EXITED:
        return Exited(*_EXIT.unpack_from(msg, 1))
    raise ValueError(f"unknown template message kind {kind!r}")
