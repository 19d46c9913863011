"""Run dacapo-ml's own test suite on daisy 2.0.0 and on daisy_nb, and compare test by test.

    python benchmarks/run_dacapo_suite.py /path/to/dacapo_ml-0.3.5 \\
        --daisy-python /work/venv-dacapo-wheel/bin/python --nb-python /work/venv-dacapo-nb/bin/python
    python benchmarks/run_dacapo_suite.py CHECKOUT --nb-python ... -- -k test_train   # pytest arguments after --

``CHECKOUT`` is dacapo's sdist unpacked (it ships ``tests/``) or a checkout of
janelia-cellmap/dacapo. Each side needs its own virtual environment with dacapo-ml and
its ``test`` extra: the reference with PyPI ``daisy==2.0.0``; the daisy_nb one with
daisy_nb too (``pip install --no-deps -e .``: dacapo's fibsem-tools pins zarr<3, which only
daisy_nb's optional array paths use). The daisy_nb side runs the suite unchanged through
``python -m daisy_nb run -m pytest``. Each side writes its own copy of the checkout's
working files (``daisy_logs/``) in a scratch copy, so the two runs do not share one.

Outcomes come from each side's ``--junitxml`` file (one per test). Prints the counts
and every test whose outcome differs; exit code as run_daisy_suite.py's.
This project does not copy dacapo's tests; it only runs a checkout given to it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_daisy_suite import parse_suite_args, report, run_suite


def main(argv=None) -> int:
    parsed = parse_suite_args(
        argv,
        __doc__.split("\n\n")[0],
        checkout="dacapo-ml's unpacked sdist or a checkout (with tests/)",
        daisy="a Python with dacapo-ml and PyPI daisy==2.0.0 (the reference side)",
        nb="a Python with dacapo-ml and daisy_nb",
        timeout=900,
        log_dir="keep each side's pytest output and junit xml in this directory",
    )
    if parsed is None:
        return 2
    args, extra, root = parsed
    out = args.log_dir or tempfile.mkdtemp(prefix="dacapo_suite_")
    os.makedirs(out, exist_ok=True)
    pa = ["tests", "-rA", "-q", "-p", "no:cacheprovider", "--timeout", str(args.timeout), *extra]
    print(f"dacapo suite: {root}/tests; outputs in {out}; load {os.getloadavg()[0]:.2f}")

    runs = []
    if args.daisy_python:
        runs.append(("daisy 2.0.0", "daisy2", [args.daisy_python, "-m", "pytest"]))
    runs.append(("daisy_nb", "daisy_nb", [args.nb_python, "-m", "daisy_nb", "run", "-m", "pytest"]))
    sides = {}
    for name, tag, cmd in runs:
        with tempfile.TemporaryDirectory(prefix=f"dacapo_{tag}_") as scratch:
            copy = shutil.copytree(root, os.path.join(scratch, "checkout"))
            junit = os.path.join(out, f"{tag}.xml")
            sides[name] = run_suite([*cmd, *pa, f"--junitxml={junit}"], copy, os.path.join(out, f"{tag}.txt"), junit)
    return report(sides)


if __name__ == "__main__":
    sys.exit(main())
