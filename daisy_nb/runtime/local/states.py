"""A block worker's states: what the block workers' decision core (:mod:`.blocks`) and the parts that
decide with it (:mod:`.reuse`) set, and what the shell's records (:mod:`.records`) show."""

from __future__ import annotations

import enum

__all__ = ["WorkerState"]


class WorkerState(enum.IntEnum):
    STARTING = 0  # its process starts (or it moved to another task); not ready for work yet
    IDLE = 1  # ready, nothing sent (transient: dispatch follows at once)
    BUSY = 2  # runs a batch (and maybe holds a second one)
    PARKED = 3  # waits for blocks to become ready
    QUITTING = 4  # told to quit (or a block raised): it exits
    DEAD = 5  # its process ended
