"""Check that daisy 2.0.0 and daisy_nb share tracking stores, grown volumes included.

Run with the daisy 2.0.0 virtualenv; daisy_nb runs in its own interpreter:

    /work/venv-daisy2/bin/python tests/golden/check_tracking_grow_interop.py \\
        --nb-python /work/venv-nb/bin/python --nb-root .

1. daisy_nb writes a store (with its layout record) on a small volume, one block failing;
   daisy 2.0.0 resumes it on the same volume: it accepts it, skips what daisy_nb did and
   keeps the record.
2. daisy_nb resumes it on a grown volume (migrating it); daisy 2.0.0 resumes the migrated
   store on the grown volume: nothing left to do.
3. daisy 2.0.0 writes a store on the small volume; ``daisy-nb track migrate --to-roi``
   migrates it; daisy 2.0.0 resumes it on the grown volume and skips exactly the blocks
   daisy_nb kept.

Prints one line per check; exit code 1 if one fails. Not part of the test suite (it
needs the wheel); its output is quoted in docs/tracking-growth.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import daisy
from funlib.geometry import Roi

SMALL = ((0, 0), (65, 47))
GROWN = ((-10, 0), (95, 60))
READ = ((0, 0), (20, 20))
WRITE = ((5, 5), (10, 10))
FIT = "shrink"

NB_RUN = """
import sys
sys.path.insert(0, {root!r})
import daisy_nb
from funlib.geometry import Roi
def process(block):
    if [int(v) for v in block.write_roi.begin] == {fail!r}:
        block.status = 3
t = daisy_nb.Task("t", Roi(*{total!r}), Roi(*{read!r}), Roi(*{write!r}), process_function=process, fit={fit!r},
                  max_retries=0, tracking_path={path!r})
st = daisy_nb.run_blockwise([t], multiprocessing=False, progress=False, summary=False, return_states=True)["t"]
print(st.completed_count, st.skipped_count, st.failed_count, st.orphaned_count)
"""


def nb_run(args, path, total, fail=None):
    code = NB_RUN.format(
        root=str(Path(args.nb_root).resolve()), fail=fail, total=total, read=READ, write=WRITE, fit=FIT, path=str(path)
    )
    env = {**os.environ, "PYTHONPATH": str(Path(args.nb_root).resolve())}
    r = subprocess.run([args.nb_python, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"daisy_nb run failed:\n{r.stderr}")
    return [int(v) for v in r.stdout.split()[-4:]]


def d2_run(path, total):
    ran = []

    def process(block):
        ran.append([int(v) for v in block.write_roi.begin])

    t = daisy.Task(
        "t",
        Roi(*total),
        Roi(*READ),
        Roi(*WRITE),
        process_function=process,
        fit=FIT,
        max_retries=0,
        tracking_path=str(path),
    )
    st = daisy.run_blockwise([t], multiprocessing=False, return_states=True)["t"]
    return [int(st.completed_count), int(st.skipped_count), int(st.failed_count), int(st.orphaned_count)], ran


def attrs(path):
    return json.loads((Path(path) / "zarr.json").read_text())["attributes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nb-python", required=True)
    ap.add_argument("--nb-root", default=".")
    args = ap.parse_args()
    args.nb_root = str(Path(args.nb_root).resolve())  # before the chdir below
    ok = True

    def check(what, cond):
        nonlocal ok
        ok &= bool(cond)
        print(f"{'ok  ' if cond else 'FAIL'} {what}")

    with tempfile.TemporaryDirectory() as td:
        os.chdir(td)
        a = Path(td) / "a"
        c1 = nb_run(args, a, SMALL, fail=[25, 15])
        check(
            f"daisy_nb writes a store on the small volume (completed, skipped, failed, orphaned = {c1})",
            "daisy_nb_layout" in attrs(a),
        )
        c2, ran = d2_run(a, SMALL)
        check(
            f"daisy 2.0.0 resumes it: {c2}, ran {len(ran)} blocks; skipped = daisy_nb's completed",
            c2[1] == c1[0] and c2[2] == 0,
        )
        check("daisy 2.0.0 kept daisy_nb's layout record", "daisy_nb_layout" in attrs(a))
        c3 = nb_run(args, a, GROWN)
        check(f"daisy_nb resumes it grown (migrating it): {c3}", c3[2] == 0 and c3[1] > 0)
        c4, ran = d2_run(a, GROWN)
        check(f"daisy 2.0.0 resumes the migrated store grown: {c4}, ran {len(ran)}", len(ran) == 0 and c4[1] == c3[0])

        b = Path(td) / "b"
        c5, _ = d2_run(b, SMALL)
        roi = lambda r: ",".join(map(str, r[0])) + ":" + ",".join(map(str, r[1]))  # noqa: E731
        r = subprocess.run(
            [
                args.nb_python,
                "-m",
                "daisy_nb",
                "track",
                "migrate",
                str(b),
                f"--from-roi={roi(SMALL)}",
                f"--read-roi={roi(READ)}",
                f"--write-roi={roi(WRITE)}",
                f"--fit={FIT}",
                f"--to-roi={roi(GROWN)}",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(args.nb_root).resolve())},
        )
        check(f"daisy-nb track migrate --to-roi on daisy 2.0.0's store: {r.stdout.strip()}", r.returncode == 0)
        c6, ran = d2_run(b, GROWN)
        kept = int(r.stdout.split("migrated to total_roi")[1].split(":")[1].split("of")[0].replace(",", ""))
        check(f"daisy 2.0.0 resumes it grown: {c6}; skipped {c6[1]} = kept {kept}", c6[1] == kept and c6[2] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
