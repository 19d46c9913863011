"""Regenerate tests/data/tracking_grow_daisy2/ with the published daisy 2.0.0.

Run with the daisy 2.0.0 virtualenv (CI does not have it; the output is committed):

    /work/venv-daisy2/bin/python tests/golden/gen_tracking_grow_fixture.py

It runs a 2-D task (context 5, ragged far edges) on a small volume with daisy 2.0.0,
serially, one block marked FAILED, and keeps the tracking group daisy wrote (no
layout record: daisy 2.0.0 stores only the hash). Then it runs the same task on a
grown ``total_roi`` against that store and records daisy's answer (it refuses: a
different layout hash). ``expected.json`` holds, per fit: the ROIs, the stored hash,
the ``done``/``failures`` arrays, the blocks daisy processed (write begins and
status) and daisy's error on the grown volume. ``tests/test_tracking_grow_daisy2.py``
adopts the stores with ``daisy-nb track migrate`` and resumes them grown.
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
OUT = HERE.parent / "data" / "tracking_grow_daisy2"

SMALL = Roi((0, 0), (65, 47))
GROWN = Roi((-10, 0), (95, 60))
READ = Roi((0, 0), (20, 20))
WRITE = Roi((5, 5), (10, 10))
FAIL = [25, 15]


def roi_json(roi):
    return {"offset": [int(v) for v in roi.offset], "shape": [int(v) for v in roi.shape]}


def read_arr(group: Path, name: str, dtype: str):
    meta = json.loads((group / name / "zarr.json").read_text())
    shape = meta["shape"]
    chunk = group / name / "c" / Path(*["0"] * len(shape))
    return np.fromfile(chunk, dtype=dtype).reshape(shape)


def run(path: Path, name: str, total, fit, log):
    def process(block):
        wb = [int(v) for v in block.write_roi.begin]
        if wb == FAIL:
            block.status = daisy.BlockStatus.FAILED
            log.append({"write_begin": wb, "status": "failed"})
        else:
            log.append({"write_begin": wb, "status": "success"})

    task = daisy.Task(
        name,
        total,
        READ,
        WRITE,
        process_function=process,
        fit=fit,
        read_write_conflict=True,
        max_retries=0,
        tracking_path=str(path),
    )
    st = daisy.run_blockwise([task], multiprocessing=False, return_states=True)[name]
    return {"completed": int(st.completed_count), "failed": int(st.failed_count), "orphaned": int(st.orphaned_count)}


def case(work: Path, fit: str):
    name = f"grow_{fit}"
    path = work / name
    log: list = []
    counts = run(path, name, SMALL, fit, log)
    meta = json.loads((path / "zarr.json").read_text())
    done = read_arr(path, "done", "u1")
    failures = read_arr(path, "failures", "<u4")
    copy = work / "copies" / name
    shutil.copytree(path, copy)
    try:
        run(path, name, GROWN, fit, [])
        grown_error = None
    except Exception as e:  # daisy 2.0.0 refuses the grown volume
        grown_error = f"{type(e).__name__}: {e}"
    return {
        "dir": name,
        "total_roi": roi_json(SMALL),
        "grown_total_roi": roi_json(GROWN),
        "read_roi": roi_json(READ),
        "write_roi": roi_json(WRITE),
        "fit": fit,
        "read_write_conflict": True,
        "hash": meta["attributes"]["daisy_task_hash"],
        "attributes": sorted(meta["attributes"]),
        "grid_shape": list(done.shape),
        "done": done.tolist(),
        "failures": failures.tolist(),
        "calls": log,
        "counts": counts,
        "daisy_on_grown_volume": grown_error,
    }


def main():
    with tempfile.TemporaryDirectory() as td:
        work = Path(td)
        os.chdir(work)  # daisy writes ./daisy_logs
        cases = [case(work, fit) for fit in ("valid", "shrink", "overhang")]
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        for c in cases:
            shutil.copytree(work / "copies" / c["dir"], OUT / c["dir"])
        expected = {
            "generator": "tests/golden/gen_tracking_grow_fixture.py",
            "daisy_version": daisy.__version__,
            "cases": cases,
        }
        (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
