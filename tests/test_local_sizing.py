"""Batch sizes of the local pool (``daisy_nb.runtime.local.sizing.BatchSizing``) on heavy-tailed blocks.

The size follows the typical time per block (the median of the last batches), so one batch
that held a straggler does not shrink the next ones to single blocks, while a lasting change
of speed is followed within a few batches.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from daisy_nb.runtime.common.batching import MAX_GROWTH
from daisy_nb.runtime.local.sizing import TYPICAL_OF, BatchSizing

MS = 1_000_000  # ns
TARGET = 0.1  # seconds per batch


def sizing():
    s = BatchSizing(target_secs=TARGET, capacity=4096, workers_total=lambda: 2)
    s.add_task("t")
    return s


def run(s, per_block_ms, batches):
    """``batches`` batches of the current size, every block taking ``per_block_ms``; the sizes used."""
    sizes = []
    for _ in range(batches):
        k = s.tasks["t"].batch_k
        sizes.append(k)
        s.measured("t", int(per_block_ms * MS * k), k)
    return sizes


def test_steady_blocks_reach_the_target():
    s = sizing()
    run(s, 10, 8)
    assert s.tasks["t"].batch_k == 10  # 10 blocks of 10 ms: a batch of 100 ms


def test_one_batch_with_a_straggler_does_not_shrink_the_next():
    s = sizing()
    run(s, 10, 8)
    s.measured("t", 10 * 10 * MS + 2_000 * MS, 10)  # one of its 10 blocks took 2 s
    assert s.tasks["t"].batch_k == 10


def test_a_lasting_slowdown_is_followed_within_a_few_batches():
    s = sizing()
    run(s, 10, 8)
    sizes = run(s, 100, TYPICAL_OF)  # every block 10x slower from now on
    assert s.tasks["t"].batch_k == 1 and sizes[-1] == 1
    assert sizes.index(1) <= TYPICAL_OF // 2 + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5_000), st.integers(1, 64)), min_size=1, max_size=40))
def test_sizes_stay_in_bounds_and_grow_at_most_fourfold(batches):
    """Any sequence of batches (``(ms per block, blocks)``): sizes between 1 and the capacity,
    growing at most MAX_GROWTH times per batch, and never above what the typical block allows."""
    s = sizing()
    for ms, n in batches:
        before = s.tasks["t"].batch_k
        s.measured("t", ms * MS * n, n)
        s.validate()
        k = s.tasks["t"].batch_k
        assert 1 <= k <= min(4096, before * MAX_GROWTH)
        per_block = s.tasks["t"].per_block
        if per_block:
            assert k <= max(1, TARGET / per_block)
