"""0-argument worker functions of ``tests/test_tail.py``: each runs ``tailprog.py`` as its job and
waits for it (as ``sbatch --wait`` or a launcher of ``daisy_nb.launch`` would)."""

import os
import subprocess
import sys

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tailprog.py")


def one_straggler():
    subprocess.run([sys.executable, PROG, "1"], check=True)


def two_stragglers():
    subprocess.run([sys.executable, PROG, "2"], check=True)
