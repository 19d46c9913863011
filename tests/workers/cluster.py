"""Cluster-style 0-argument worker functions: each submits a detached worker program and waits.

Like ``bsub -K`` / ``sbatch --wait``: the program runs in its own session with an
environment of nothing but ``PATH`` and ``DAISY_CONTEXT`` and connects back over TCP.
Records ``job_<pid>`` (for the tests' clean-up) and ``rc_<pid>`` (its exit code).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(HERE, "cluster_prog.py")


def _submit(mode, block_secs):
    out = os.environ["DAISY_NB_TEST_OUT"]
    env = {"PATH": os.environ.get("PATH", ""), "DAISY_CONTEXT": os.environ["DAISY_CONTEXT"]}
    with open(os.path.join(out, f"prog_{os.getpid()}.err"), "ab") as err:
        p = subprocess.Popen(
            [sys.executable, PROG, out, mode, str(block_secs)],
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    with open(os.path.join(out, f"job_{p.pid}"), "w"):
        pass
    rc = p.wait()
    with open(os.path.join(out, f"rc_{p.pid}"), "w") as f:
        f.write(str(rc))
    if rc:
        raise SystemExit(f"worker program exited with {rc}")


def submit():
    _submit("plain", 0.0)


def submit_slow():
    _submit("plain", 0.05)


def submit_stop_on_3():
    """The program stops itself (SIGSTOP) while it holds block 3 the first time."""
    _submit("stop_on_3", 0.02)
