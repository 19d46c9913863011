"""Regenerate tests/data/tracking_daisy2/ with the published daisy 2.0.0.

Run with the daisy 2.0.0 virtualenv (CI does not have it; the output is
committed):

    /work/venvs/daisy2/bin/python tests/golden/gen_tracking_fixture.py

It runs two small pipelines serially with ``tracking_path=`` set and a process
function that marks a few blocks FAILED (without raising), then copies the
tracking groups daisy wrote and records in ``expected.json``:

* the task parameters, daisy's stored hash, the grid shape and the
  ``done``/``failures`` arrays as read back from the chunk files;
* the blocks daisy processed (write begin + final status) and the run counts;
* ``hash_cases``: hashes daisy stores for a few more layouts (negative and huge
  offsets, 1-D/3-D, every fit), used to check ``task_hash`` without shipping
  those stores.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import daisy
import numpy as np
from funlib.geometry import Roi

assert daisy.__version__ == "2.0.0", daisy.__version__

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "data" / "tracking_daisy2"


def roi_json(roi):
    return {"offset": [int(v) for v in roi.offset], "shape": [int(v) for v in roi.shape]}


def read_arr(group: Path, name: str, dtype: str):
    meta = json.loads((group / name / "zarr.json").read_text())
    shape = meta["shape"]
    chunk = group / name / "c" / Path(*["0"] * len(shape))
    return np.fromfile(chunk, dtype=dtype).reshape(shape)


def run_case(workdir: Path, name, total, read, write, fit, fail, runs, max_retries=1):
    """Run a task `runs` times against the same tracking store; return its record."""
    path = workdir / name
    log = []

    def process(block):
        wb = [int(v) for v in block.write_roi.begin]
        if fail(wb):
            block.status = daisy.BlockStatus.FAILED
            log.append({"write_begin": wb, "status": "failed"})
        else:
            log.append({"write_begin": wb, "status": "success"})

    results = []
    for run in range(runs):
        log.clear()
        task = daisy.Task(
            name,
            total,
            read,
            write,
            process_function=process,
            fit=fit,
            max_retries=max_retries,
            tracking_path=str(path),
        )
        states = daisy.run_blockwise([task], multiprocessing=False, return_states=True)
        st = states[name]
        results.append(
            {
                "calls": list(log),
                "completed": int(st.completed_count),
                "skipped": int(st.skipped_count),
                "failed": int(st.failed_count),
                "orphaned": int(st.orphaned_count),
                "total": int(st.total_block_count),
            }
        )
    failed_blocks = sorted([int(v) for v in b.write_roi.begin] for b in task.failed_blocks())
    group_meta = json.loads((path / "zarr.json").read_text())
    done = read_arr(path, "done", "u1")
    failures = read_arr(path, "failures", "<u4")
    return {
        "dir": name,
        "total_roi": roi_json(total),
        "read_roi": roi_json(read),
        "write_roi": roi_json(write),
        "fit": fit,
        "max_retries": max_retries,
        "hash": group_meta["attributes"]["daisy_task_hash"],
        "grid_shape": list(done.shape),
        "block_grid_shape": list(task.block_grid_shape),
        "done": done.tolist(),
        "failures": failures.tolist(),
        "failed_blocks_write_begin": failed_blocks,
        "runs": results,
    }


def hash_only(workdir: Path, name, total, read, write, fit):
    path = workdir / name
    task = daisy.Task(
        name,
        total,
        read,
        write,
        process_function=lambda b: None,
        fit=fit,
        tracking_path=str(path),
        read_write_conflict=False,
    )
    daisy.run_blockwise([task], multiprocessing=False)
    meta = json.loads((path / "zarr.json").read_text())
    done_meta = json.loads((path / "done" / "zarr.json").read_text())
    return {
        "total_roi": roi_json(total),
        "read_roi": roi_json(read),
        "write_roi": roi_json(write),
        "fit": fit,
        "hash": meta["attributes"]["daisy_task_hash"],
        "grid_shape": done_meta["shape"],
    }


def main():
    with tempfile.TemporaryDirectory() as td:
        work = Path(td)
        os.chdir(work)  # daisy writes ./daisy_logs
        stores = work / "stores"
        stores.mkdir()
        cases = [
            # 2-D: grid [5,3] for a 4x2 block grid (context 5); two blocks fail
            run_case(
                stores,
                "t2d",
                Roi((0, 0), (50, 30)),
                Roi((0, 0), (20, 20)),
                Roi((5, 5), (10, 10)),
                "valid",
                fail=lambda wb: wb in ([15, 5], [25, 15]),
                runs=1,
            ),
            # 3-D, negative offset, overhang, two runs (failures accumulate)
            run_case(
                stores,
                "t3d",
                Roi((-4, 0, 2), (13, 9, 8)),
                Roi((0, 0, 0), (6, 5, 4)),
                Roi((1, 1, 0), (4, 3, 4)),
                "overhang",
                fail=lambda wb: wb == [5, 4, 2],
                runs=2,
            ),
        ]
        hash_cases = [
            hash_only(stores, "h1", Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), "valid"),
            hash_only(stores, "h2", Roi((-7, 3), (31, 17)), Roi((-2, -2), (9, 8)), Roi((0, 0), (5, 4)), "shrink"),
            hash_only(
                stores,
                "h3",
                Roi((10**12, -(10**12)), (40, 40)),
                Roi((0, 0), (20, 20)),
                Roi((5, 5), (10, 10)),
                "overhang",
            ),
            hash_only(
                stores, "h4", Roi((0, 0, 0), (7, 7, 7)), Roi((0, 0, 0), (3, 3, 3)), Roi((0, 0, 0), (3, 3, 3)), "valid"
            ),
        ]
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        for c in cases:
            shutil.copytree(stores / c["dir"], OUT / c["dir"])
        expected = {
            "generator": "tests/golden/gen_tracking_fixture.py",
            "daisy_version": daisy.__version__,
            "cases": cases,
            "hash_cases": hash_cases,
        }
        (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
