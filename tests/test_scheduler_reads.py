"""The Scheduler's public reads (what the dashboard, the hang alarm and tools use instead of its
private tables) and the runtime's snapshot types."""

import numpy as np
import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.block import BlockStatus
from daisy_nb.runtime.snapshot import RunningBlock, WorkerSnapshot
from daisy_nb.scheduler import Scheduler


def _sched():
    a = daisy_nb.Task("a", Roi((0, 0), (12, 8)), Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), tracking_path=False)
    b = daisy_nb.Task("b", Roi((0, 0), (12, 8)), Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), tracking_path=False)
    return Scheduler(a + b)


def test_describe_matches_the_blocks_handed_out():
    s = _sched()
    batch = s.acquire_blocks("a", 5)
    d = s.describe("a", batch.index)
    for i, blk in enumerate(batch.blocks()):
        assert int(d.block_id[i]) == blk.block_id[1]
        assert tuple(d.read_offset[i]) == tuple(blk.read_roi.offset)
        assert tuple(d.read_shape[i]) == tuple(blk.read_roi.shape)
        assert tuple(d.write_offset[i]) == tuple(blk.write_roi.offset)
        assert tuple(d.write_shape[i]) == tuple(blk.write_roi.shape)


def test_row_of_inverts_describe_and_rejects_other_ids():
    s = _sched()
    n = s.tasks["a"].layout.num_blocks
    ids = s.describe("a", np.arange(n)).block_id
    for row, bid in enumerate(ids.tolist()):
        assert s.row_of("a", bid) == row
    assert s.row_of("a", 10**9) is None
    with pytest.raises(KeyError, match="no task 'zz'"):
        s.row_of("zz", 0)
    with pytest.raises(ValueError, match="rows of task 'a' are 0.."):
        s.describe("a", [n])


def test_counts_follow_the_run_and_agree_with_task_states():
    s = _sched()
    c0 = s.counts("a")
    assert c0.total == s.tasks["a"].layout.num_blocks and c0.processing == 0
    blk = s.acquire_block("a")
    assert s.counts("a").processing == 1
    blk.status = BlockStatus.SUCCESS
    s.release_block(blk)
    c = s.counts("a")
    st = s.task_states["a"]
    assert (c.ready, c.processing, c.completed, c.failed, c.orphaned) == (
        st.ready_count, st.processing_count, st.completed_count, st.failed_count, st.orphaned_count
    )  # fmt: skip
    assert c.completed == 1


def test_block_states_are_read_only_views_that_follow_the_run():
    s = _sched()
    blk = s.acquire_block("b") or s.acquire_block("a")
    bs = s.block_states(blk.task_id)
    assert len(bs.status) == s.tasks[blk.task_id].layout.num_blocks
    with pytest.raises(ValueError):
        bs.status[0] = 0
    before = int(bs.status[blk.index])
    blk.status = BlockStatus.FAILED
    s.release_block(blk)
    assert int(bs.status[blk.index]) != before or int(bs.retries[blk.index]) == 1  # the view sees the release
    assert int(s.block_states(blk.task_id).retries[blk.index]) == 1


def test_rows_in_grid_box_clips_to_the_grid():
    s = _sched()
    shape = tuple(int(v) for v in s.tasks["a"].layout.grid_shape)
    rows, ids = s.rows_in_grid_box("a", (0, 0), (100, 100))
    assert len(rows) == int(np.prod(shape)) == len(set(rows.tolist()))
    assert s.describe("a", rows).block_id.tolist() == ids.tolist()
    rows, _ = s.rows_in_grid_box("a", (1, 1), (2, 2))
    assert len(rows) == 1
    assert len(s.rows_in_grid_box("a", (3, 3), (3, 5))[0]) == 0


def test_running_block_reads_the_older_tuples_and_is_frozen():
    r = RunningBlock.of(("a", np.array([4, 5]), "worker 2", 123, 10.5))
    assert r == RunningBlock("a", (4, 5), "worker 2", 123, 10.5)
    assert RunningBlock.of(r) is r
    with pytest.raises(AttributeError):
        r.pid = 1  # type: ignore[misc]


def test_worker_snapshot_states_are_named():
    WorkerSnapshot(1, "a", "busy", 10, 3, 1.0, 0.5)
    with pytest.raises(ValueError, match="state must be one of"):
        WorkerSnapshot(1, "a", "BUSY", 10, 3, 1.0, 0.5)
