"""When compiling the kernels pays: :class:`CompilePace`, the Scheduler's one decision about itself.

Compiled kernels pay off only for enough work (``kernels/_jit.py``): a block costs the
plain-Python kernels ~20 µs (batch API) to ~40 µs (per-block API; the plain twin of
``kernels.surface.step`` builds its views once) plus ~7 µs per entry of its downstream
list (measured 1-D to 3-D, 1-3 tasks), so from ~4k blocks (3-D, conflicts, two tasks)
to ~16k (1-D, one task) the scheduler compiles: 12,800 blocks handed out one by one to
Clients (~0.5 s of plain kernels) no longer pay numba's ~0.6 s. When the work is between
the price and twice it, whether compiling pays depends on how fast blocks are handed
out (``_jit.compile_pays``): decided after the first ``secs`` of hand-outs from their
rate, in plain Python until then.

Those costs were measured before the plain step became ``kernels/surface_plain.py``; since,
``benchmarks/bench_small.py --calibrate`` gives about half (batch API) to a third (per-block
API) of them, so :data:`US_BLOCK` overestimates the plain work and a run between ~16k and
~30k 1-D blocks compiles sooner than it must. Kept until recalibrated on a quiet machine:
the tests of the decision's thresholds are written against these constants.
"""

from __future__ import annotations

import time

from daisy_nb.kernels import _jit

__all__ = ["US_BLOCK", "US_PER_DOWNSTREAM", "CompilePace", "plain_work_us"]

US_BLOCK, US_PER_DOWNSTREAM = 30, 7  # plain-Python kernel cost of one block (see the module docstring)


def plain_work_us(blocks: int, entries: int) -> float:
    """Microseconds of plain-Python kernel work of a run of ``blocks`` blocks whose downstream
    lists (task edges and conflicts) hold ``entries`` entries in all: what the compile decision
    (``kernels/_jit.py``) weighs. Every release touches at least its own entry.

    The entries are counted over all blocks, not as the longest list times the blocks: one
    block reading a whole volume (a reduction, the demo's ``resolve``) has every block of the
    next task downstream, and charging that list to every block made the demo's 717 blocks
    look like 0.65 s of plain work (its 5,332 blocks at 32³ like 37 s), so it loaded numba."""
    return blocks * US_BLOCK + US_PER_DOWNSTREAM * max(blocks, entries)


class CompilePace:
    """The compile decision of one Scheduler: taken at once (``decided``) unless the work is
    between the price and twice it; then :meth:`handed_out` counts hand-outs and, ``secs`` after
    the first, tells ``_jit`` the work left and how much of it comes per second.

    ``num_blocks``: the pipeline's blocks; ``entries``: the entries of all their downstream
    lists (``PipelineGeometry.downstream_entries``).
    """

    __slots__ = ("decided", "left", "secs", "t0", "us_block", "n")

    def __init__(self, num_blocks: int, entries: int, secs: float) -> None:
        self.us_block = plain_work_us(num_blocks, entries) / max(num_blocks, 1)
        self.left = num_blocks
        self.secs = secs
        self.t0: float | None = None  # the first hand-out (monotonic)
        self.n = 0  # blocks handed out since
        work = num_blocks * self.us_block
        self.decided = not (
            _jit.mode() == "auto" and not _jit.compiled() and _jit.COMPILE_AT <= work < 2 * _jit.COMPILE_AT
        )
        if self.decided:
            _jit.need(work)

    def handed_out(self, n: int) -> bool:
        """``n`` more blocks were handed out; True once the decision is taken (stop calling)."""
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.n += n
        elapsed = now - self.t0
        if elapsed < self.secs:
            return False
        self.decided = True
        rate = self.n / elapsed  # blocks handed out per second
        left = max(0, self.left - self.n)
        _jit.need(left * self.us_block, per_sec_us=rate * self.us_block)
        return True
