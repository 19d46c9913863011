"""A Scheduler's hand-out and release as lists: :class:`ListedCalls`, what the TCP path calls.

The TCP runtime (``runtime/net/handout.py``) hands out and takes back a few blocks per task
and pass, and builds its frames from plain ints: the batch API's arrays
(:meth:`~daisy_nb.scheduler.Scheduler.acquire_blocks`) cost more to build and read back
than the kernel call itself. Here blocks go out and come back as lists: one block is one
kernel call into a preallocated row; several blocks are one batch call, or, in plain mode
(kernels not compiled, ``kernels/surface_plain.py``), lists the plain surface gives and
takes as they are, no array built.

Decides nothing: the order, the prechecks, retries, failures and the count of hand-outs the
compile decision watches are the Scheduler's, reached through its hand-out and release steps.
Not here: the per-block and batch APIs (the Scheduler's), connections (the runtime's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daisy_nb.kernels import surface as ks
from daisy_nb.kernels import tables as kt

if TYPE_CHECKING:
    from daisy_nb.scheduler import Scheduler

__all__ = ["ListedCalls"]


def _as_lists(b) -> list[list[int]]:
    """A :class:`~daisy_nb.scheduler.BlockBatch` as flat lists, one per block (what a ``BLOCK`` frame carries)."""
    cols = (b.index, b.spatial_id, b.read_offset, b.read_shape, b.write_offset, b.write_shape)
    return [[i, sid, *ro, *rs, *wo, *ws] for i, sid, ro, rs, wo, ws in zip(*(c.tolist() for c in cols))]


# what ks.step is in plain mode (kernels/surface_plain.py): calls of several blocks then take lists
# from the plain surface; one-block calls go through ks.step in both modes. Compared on every call:
# switching to compiled kernels (kernels/_jit.py) rebinds ks.step, also in the middle of a run.
_PLAIN_STEP = ks.PLAIN_STEP[0]
_STATUSES = (kt.R_GIVE_BACK, kt.R_SUCCESS, kt.R_FAILED)  # 0, 2, 3: what release_blocks accepts


class ListedCalls:
    """A :class:`~daisy_nb.scheduler.Scheduler`'s hand-out and release, blocks as lists of ints.

    A runtime makes one from its scheduler and holds it. It keeps nothing of the run: only the
    tasks' numbers and which tasks have no ``check_function`` (both fixed once the Scheduler is
    made). Of the Scheduler it calls the batch API and the steps ``_acquire_one``,
    ``_handed_out``, ``_plain_surface``, ``_release_one``, ``_hold_failures``, ``_released``,
    ``_record`` and ``wake_retries``.

    Parameters
    ----------
    scheduler : Scheduler
        The scheduler whose blocks these calls hand out and take back.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler
        self._tindex = {tid: t for t, tid in enumerate(scheduler.task_ids)}
        # tasks whose blocks go out unchecked: the one-block and plain-mode shortcuts are theirs
        self._unchecked = {tid for tid in scheduler.task_ids if scheduler.tasks[tid].check_function is None}

    def acquire(self, task_id: str, max_n: int) -> list[list[int]]:
        """Up to ``max_n`` ready blocks of ``task_id``, in the batch API's order and with its prechecks.

        Each block is a flat list ``[index, spatial id, *read offset, *read shape, *write offset,
        *write shape]`` (``index``: its row in the task; offsets and shapes: ``ndim`` ints each),
        what a ``BLOCK`` frame carries (``runtime/net/wire.py``). One block is one kernel call
        into a preallocated row, no arrays built. An unknown task or ``max_n <= 0``: ``[]``.
        """
        t = self._tindex.get(task_id)
        if t is None or max_n <= 0:
            return []
        s = self._s
        if s._backoff is not None:  # failed blocks whose retry time came go back first (Task(retry_backoff=...))
            s.wake_retries()
        if task_id in self._unchecked:
            if max_n == 1:
                row = s._acquire_one(t)
                return [] if row is None else [row]
            if ks.step is _PLAIN_STEP:  # plain mode: described as lists, no arrays built
                rows = s._plain_surface().acquire_described(t, max_n)
                if rows:
                    s._handed_out(len(rows))
                return rows
        return _as_lists(s.acquire_blocks(task_id, max_n))

    def describe(self, task_id: str, rows: list[int]) -> list[list[int]]:
        """Blocks of ``task_id`` by row, as :meth:`acquire` gives them, without acquiring them (a
        backup copy of a block in flight, ``runtime/net/backups.py``)."""
        return _as_lists(self._s.describe_blocks(task_id, rows))

    def release(self, task_id: str, index: list[int], status: list[int]) -> None:
        """Take back blocks of ``task_id`` as ``Scheduler.release_blocks`` does, from the lists a runtime built.

        ``index[i]`` (a row, as :meth:`acquire` gave it) is released with ``status[i]``: SUCCESS (2),
        FAILED (3), or CREATED (0: never started, given back to the front of the queue uncounted).
        One block is one kernel call (its status not checked: the runtime writes only these);
        several are one ``release_blocks`` call, or in plain mode the lists as they are.

        Raises
        ------
        KeyError
            An unknown task (one block, or plain mode).
        ValueError
            Several blocks with a status other than 0, 2, 3, or an unknown task (``release_blocks``).
        """
        s = self._s
        if len(index) == 1:
            s._release_one(self._tindex[task_id], index[0], status[0])
        elif ks.step is _PLAIN_STEP:  # plain mode: the lists as they are
            bad = [c for c in status if c not in _STATUSES]
            if bad:  # as release_blocks, which the compiled path calls
                raise ValueError(f"unexpected status for released blocks: {sorted(set(bad))}")
            self._release_plain(self._tindex[task_id], index, status)
        else:
            s.release_blocks(task_id, index, status)

    def _release_plain(self, t: int, rows: list[int], codes: list[int]) -> None:
        """Plain mode: the Scheduler's release and tracking record, on lists, through the plain surface."""
        s = self._s
        p = s._plain_surface()
        kept, kept_codes = s._hold_failures(t, rows, codes)  # failures waiting for a retry (retry_backoff)
        s._released(t, kept, lambda start: p.release(t, kept, kept_codes, start))
        s._record(t, rows, codes)
