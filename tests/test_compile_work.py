"""The compile decision's work estimate (``Scheduler``: ``plain_work_us``): downstream entries are
counted over all blocks, so a pipeline with one whole-volume block (the demo's ``resolve``) is not
charged that block's long list once per block, and the demo runs without loading numba."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daisy_nb import BlockStatus, Roi, Scheduler, Task
from daisy_nb.kernels import _jit
from daisy_nb.scheduling.geometry import conflict_entries
from daisy_nb.scheduling.pace import US_BLOCK as _US_BLOCK
from daisy_nb.scheduling.pace import US_PER_DOWNSTREAM as _US_PER_DOWNSTREAM
from daisy_nb.scheduling.pace import plain_work_us

ROOT = Path(__file__).resolve().parents[1]


def test_plain_work_counts_blocks_and_entries():
    assert plain_work_us(0, 0) == 0
    assert plain_work_us(100, 0) == 100 * (_US_BLOCK + _US_PER_DOWNSTREAM)  # every release touches one entry
    assert plain_work_us(100, 1000) == 100 * _US_BLOCK + 1000 * _US_PER_DOWNSTREAM
    assert plain_work_us(100, 1000) < plain_work_us(100, 1001)


def _pipeline(size: int, block: int):
    """A reduction between two blockwise tasks: like the demo, one block reads everything."""
    vol, blk = Roi((0, 0, 0), (size,) * 3), Roi((0, 0, 0), (block,) * 3)
    ctx = Roi((-1, -1, -1), (block + 2,) * 3)
    a = Task("a", Roi((-1, -1, -1), (size + 2,) * 3), ctx, Roi((1, 1, 1), (block,) * 3), read_write_conflict=True)
    b = Task("b", vol, vol, vol, read_write_conflict=False)
    c = Task("c", vol, blk, blk, read_write_conflict=False)
    return a + b + c


def test_entries_are_the_dependency_lists_summed():
    """The estimate's entries against every block's upstream list from the dependency graph: the
    edges exactly, conflicts as an upper bound that only boundary blocks undercut."""
    s = Scheduler(_pipeline(24, 4), block_tracking=False)
    g = s.dependency_graph
    blocks = []
    for tid in s.task_ids:  # every block, handed out and released in order
        while (b := s.acquire_block(tid)) is not None:
            blocks.append(b)
            b.status = BlockStatus.SUCCESS
            s.release_block(b)
    assert len(blocks) == s.num_blocks_total
    total = sum(len(g.upstream(b)) for b in blocks)
    conflicts = sum(conflict_entries(lay) for lay in s.geometry.layouts)
    edges = s.geometry.downstream_entries - conflicts
    assert edges == 216 + 216  # a -> b: every a block once; b -> c: the one b block to each c block
    assert edges <= total <= edges + conflicts
    assert total > edges  # interior a blocks have conflicts
    s.close()


@pytest.mark.parametrize("size,block", [(320, 64), (320, 32), (512, 64)])
def test_the_demo_pipeline_is_plain_work(size, block):
    """The main job's three benchmark configurations (benchmarks/bench_main_job.py): 717 to 5,332
    blocks of tens of ms; their kernels' plain work is under numba's price."""
    from daisy_nb import demo

    p = demo._params(Path("/nonexistent"), size, block, 1)
    pipeline, _ = demo.build_pipeline(p, 2)
    s = Scheduler(pipeline, block_tracking=False)
    work = plain_work_us(s.num_blocks_total, s.geometry.downstream_entries)
    assert not _jit.compile_pays(work), work
    s.close()


def test_a_big_pipeline_still_compiles():
    s = Scheduler(_pipeline(200, 4), block_tracking=False)  # 125,000 + 1 + 125,000 blocks
    assert _jit.compile_pays(plain_work_us(s.num_blocks_total, s.geometry.downstream_entries))
    s.close()


@pytest.mark.mp
@pytest.mark.timeout(300)
def test_the_demo_runs_without_numba(tmp_path):
    """A real demo run (zarr on disk, worker processes) in a fresh interpreter: numba never loads."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from daisy_nb.demo import run_demo
        r = run_demo({str(tmp_path / "demo")!r}, size=96, block=16, progress=False, summary=False, verbose=False)
        print(json.dumps({{"agrees": r["agrees"], "numba": "numba" in sys.modules}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DAISY_NB_JIT", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"agrees": True, "numba": False}
