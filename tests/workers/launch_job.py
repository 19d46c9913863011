"""A job program for tests/test_launch.py: ``python launch_job.py OUT BLOCK_SECS MODE``.

A ``Client`` loop whose blocks sleep ``BLOCK_SECS``. Leaves in ``OUT``: ``pid_<pid>`` at
start, ``inblock_<pid>`` when a block starts, ``interrupted_<pid>`` when a block body
gets ``KeyboardInterrupt``, ``blockdone_<pid>_<n>`` after a block, ``end_<pid>`` (blocks
run) when its loop ends. ``MODE``: ``normal``; ``stubborn`` (a block that swallows the
interrupt and sleeps on: the client's deadline must end it); ``optout``
(``Client(exit_with_run=False)``); ``oom1``/``hang1``: the first job to start dies in its
second block: of memory (its peak use in the fake batch system's ``<job id>.maxrss``, exit
137 as the OOM killer's ``SIGKILL``), or it hangs there until the test ends it
(``fakebatch.py end ID PREEMPTED``); ``died_<pid>`` marks it.
"""

import os
import sys
import time

out, block_secs, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
pid = os.getpid()


def mark(name: str, text: str = "") -> None:
    """Leave ``name`` holding ``text``; renamed into place, so a test never reads it half written."""
    with open(os.path.join(out, f".{name}.tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(out, f".{name}.tmp"), os.path.join(out, name))


import daisy_nb  # noqa: E402

mark(f"pid_{pid}")
dies = False
if mode in ("oom1", "hang1"):
    try:
        os.close(os.open(os.path.join(out, "dies"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        dies = True
    except FileExistsError:
        pass
client = daisy_nb.Client(exit_with_run=False) if mode == "optout" else daisy_nb.Client()
n = 0
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        mark(f"inblock_{pid}")
        if dies and n == 1:
            mark(f"died_{pid}")
            if mode == "oom1":
                with open(os.path.join(os.environ["FAKEBATCH_DIR"], os.environ["SLURM_JOB_ID"] + ".maxrss"), "w") as f:
                    f.write("1023000K")  # as sacct writes MaxRSS: 999 MiB of the driver's --mem=1G
                os._exit(137)
            time.sleep(3600)
        try:
            time.sleep(block_secs)
        except KeyboardInterrupt:
            mark(f"interrupted_{pid}")
            if mode != "stubborn":
                raise
            time.sleep(3600)
        n += 1
        mark(f"blockdone_{pid}_{n}")
mark(f"end_{pid}", str(n))
