"""0-argument worker functions of ``tests/test_client_backups.py``: each runs ``backupprog.py`` as its
job and waits for it (as ``sbatch --wait`` would); a job that exits non-zero fails its worker function."""

import os
import subprocess
import sys

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backupprog.py")


def first_hangs():
    subprocess.run([sys.executable, PROG, "first-hangs"], check=True)


def copy_hangs():
    subprocess.run([sys.executable, PROG, "copy-hangs"], check=True)
