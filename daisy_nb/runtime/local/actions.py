"""What the block workers' decision core asks its shell to do (:class:`.blocks.BlockCore`'s actions).

Apart from the core so that the parts that decide with it (:mod:`.giveback`, :mod:`.backups`)
return the same actions without importing the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Action", "Cut", "Drop", "Kill", "Quit", "Retask", "SendBatch"]


@dataclass(frozen=True)
class SendBatch:
    """Write ``blocks`` (a :class:`daisy_nb.scheduler.BlockBatch`) into batch slot ``slot`` of worker
    ``wid`` and tell it to run them."""

    wid: int
    slot: int
    blocks: Any


@dataclass(frozen=True)
class Quit:
    """Ask worker ``wid`` to leave."""

    wid: int


@dataclass(frozen=True)
class Kill:
    """End worker ``wid``'s process (a block exceeded the task's timeout, its task was abandoned, or
    it lost a race of copies)."""

    wid: int


@dataclass(frozen=True)
class Cut:
    """Lower the ``limit`` of worker ``wid``'s batch in ``slot`` to ``keep`` (its blocks from
    ``keep`` on are not to be started: :mod:`.giveback`)."""

    wid: int
    slot: int
    keep: int


@dataclass(frozen=True)
class Drop:
    """Interrupt block ``pos`` of worker ``wid``'s batch in ``slot``: its copy lost to its twin
    (:mod:`.backups`). The worker's block function is interrupted by a signal and the worker runs on,
    its ``init_fn`` state kept; sent again while the block still runs."""

    wid: int
    slot: int
    pos: int


@dataclass(frozen=True)
class Retask:
    """Worker ``wid``, idle at its task's tail, serves task ``tid`` from now on: send it that task's
    set-up (its function, ``init_fn``, log files); it answers "ready" (:mod:`.reuse`)."""

    wid: int
    tid: str


Action = SendBatch | Quit | Kill | Cut | Drop | Retask
