"""When compiling the kernels pays: :class:`CompilePace`, the Scheduler's one decision about itself.

Compiled kernels pay off only for enough work (``kernels/_jit.py``): what they save per
block is the plain-Python kernels' cost (``kernels/surface_plain.py``) minus the compiled
kernels' own, about 7 µs plus 2 µs per entry of the block's downstream list
(``benchmarks/bench_small.py --calibrate``, batch API: a 1-D task 11.7 µs plain against
~2.7 compiled; two 3-D tasks with conflicts, ~27 entries a block, 73 µs against ~12). So
a 1-D task compiles from ~67k blocks (from ~133k when its blocks come slowly), two 3-D
tasks with conflicts from ~10k; 12,800 blocks handed out one by one to Clients never pay
numba's ~0.6 s. When the work is between the price and twice it, whether compiling pays
depends on how fast blocks are handed out (``_jit.compile_pays``): decided after the first
``secs`` of hand-outs from their rate, in plain Python until then. (Before the plain
kernels became ``surface_plain.py`` the weights were 30 and 7 µs, the plain cost of the
older twin: a 100k-block 1-D run then loaded numba and took 1.94 s against 1.75 s plain.)
"""

from __future__ import annotations

import time

from daisy_nb.kernels import _jit

__all__ = ["US_BLOCK", "US_PER_DOWNSTREAM", "CompilePace", "plain_work_us"]

US_BLOCK, US_PER_DOWNSTREAM = 7, 2  # what compiling saves per block, and per downstream entry (module docstring)


def plain_work_us(blocks: int, entries: int) -> float:
    """Microseconds that compiled kernels would save on a run of ``blocks`` blocks whose downstream
    lists (task edges and conflicts) hold ``entries`` entries in all: the plain-Python work the
    compile decision (``kernels/_jit.py``) weighs against numba's price. Every release touches
    at least its own entry.

    The entries are counted over all blocks, not as the longest list times the blocks: one
    block reading a whole volume (a reduction, the demo's ``resolve``) has every block of the
    next task downstream, and charging that list to every block made the demo's 717 blocks
    look like 0.65 s of plain work (its 5,332 blocks at 32³ like 37 s, with the older weights), so it
    loaded numba."""
    return blocks * US_BLOCK + US_PER_DOWNSTREAM * max(blocks, entries)


class CompilePace:
    """The compile decision of one Scheduler: taken at once (``decided``) unless the work is
    between the price and twice it; then :meth:`handed_out` counts hand-outs and, ``secs`` after
    the first, tells ``_jit`` the work left and how much of it comes per second. Once compiling
    is decided, numba loads in the background (``_jit.need(..., spread=True)``) and
    :meth:`handed_out` is where the Scheduler switches to the compiled kernels (``_jit.poll``),
    between two calls; ``decided`` stays False until then.

    ``num_blocks``: the pipeline's blocks; ``entries``: the entries of all their downstream
    lists (``PipelineGeometry.downstream_entries``).
    """

    __slots__ = ("decided", "left", "secs", "t0", "us_block", "n", "asked")

    def __init__(self, num_blocks: int, entries: int, secs: float) -> None:
        self.us_block = plain_work_us(num_blocks, entries) / max(num_blocks, 1)
        self.left = num_blocks
        self.secs = secs
        self.t0: float | None = None  # the first hand-out (monotonic)
        self.n = 0  # blocks handed out since
        work = num_blocks * self.us_block
        self.asked = not (
            _jit.mode() == "auto" and not _jit.compiled() and _jit.COMPILE_AT <= work < 2 * _jit.COMPILE_AT
        )
        if self.asked:
            _jit.need(work, spread=True)
        self.decided = self.asked and _jit.poll()

    def handed_out(self, n: int) -> bool:
        """``n`` more blocks were handed out; True once the decision is taken and, if it was to
        compile, the compiled kernels are in place (stop calling)."""
        if self.asked:  # numba loads in the background: switch once it is done
            return _jit.poll()
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.n += n
        elapsed = now - self.t0
        if elapsed < self.secs:
            return False
        self.asked = True
        rate = self.n / elapsed  # blocks handed out per second
        left = max(0, self.left - self.n)
        _jit.need(left * self.us_block, per_sec_us=rate * self.us_block, spread=True)
        self.decided = _jit.poll()
        return self.decided
