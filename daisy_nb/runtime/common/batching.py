"""Batch sizing: how many blocks go into the next batch of a task (pool and dask)."""

from __future__ import annotations

__all__ = ["MAX_GROWTH", "grow_batch", "next_batch"]

MAX_GROWTH = 4


def grow_batch(k: int, elapsed_ns: int, n: int, target_secs: float, cap: int) -> int:
    """The next batch size after a batch of ``n`` blocks took ``elapsed_ns``.

    A batch carries about ``target_secs`` of work, growing at most ``MAX_GROWTH`` times
    per batch, never above ``cap``. Blocks measured at 0 ns (faster than the clock) grow
    the batch by ``MAX_GROWTH``.
    """
    return next_batch(k, elapsed_ns / n / 1e9 if n else 0.0, target_secs, cap)


def next_batch(k: int, per_block_secs: float, target_secs: float, cap: int) -> int:
    """The next batch size after batches of ``k`` blocks of ``per_block_secs`` each (the rule of
    :func:`grow_batch`, from a time per block the caller measured its own way)."""
    want = int(target_secs / per_block_secs) if per_block_secs > 0 else cap
    return max(1, min(want, k * MAX_GROWTH, cap))
