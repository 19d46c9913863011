"""Block functions for the give-back tests (imported by worker processes: keep light).

Every block that finishes creates ``$DAISY_NB_TEST_OUT/done/<spatial id>.<pid>.<n>``, ``n``
counting its runs in that process, so that a block run twice shows as two files. Block
``STRAGGLER`` of ``N`` waits until every other block is done (polling, with a deadline): it
finishes only if the blocks its worker held behind it were given back and run elsewhere.
The others take ``WORK_SECS`` each (modelled work, so that batches hold several blocks);
the ``_SLOW`` variant's take longer than a batch is meant to (one block per batch, one sent
ahead).
"""

import os
import time

N = 300
STRAGGLER = 150
WORK_SECS = 0.001
# the same with blocks slower than the pool's batch target: batches of one, one block sent ahead
N_SLOW = 40
STRAGGLER_SLOW = 20
WORK_SECS_SLOW = 0.03
DEADLINE_SECS = 60.0

_runs: dict[int, int] = {}


def _done(block) -> None:
    d = os.path.join(os.environ["DAISY_NB_TEST_OUT"], "done")
    os.makedirs(d, exist_ok=True)
    k = _runs[block.spatial_id] = _runs.get(block.spatial_id, 0) + 1
    open(os.path.join(d, f"{block.spatial_id}.{os.getpid()}.{k}"), "x").close()


def straggler_waits_for_the_rest(block) -> None:
    _straggler_waits(block, N, STRAGGLER, WORK_SECS)


def slow_straggler_waits_for_the_rest(block) -> None:
    _straggler_waits(block, N_SLOW, STRAGGLER_SLOW, WORK_SECS_SLOW)


def _straggler_waits(block, n: int, straggler: int, work: float) -> None:
    if block.spatial_id == straggler:
        d = os.path.join(os.environ["DAISY_NB_TEST_OUT"], "done")
        deadline = time.monotonic() + DEADLINE_SECS
        while not os.path.isdir(d) or len(os.listdir(d)) < n - 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the blocks behind the straggler never ran")
            time.sleep(0.005)
    else:
        time.sleep(work)
    _done(block)


SLOW = 3 * N // 4  # past half of the task: a block whose first attempt hangs (a slow node)


def first_attempt_hangs(block) -> None:
    """Block ``SLOW``'s first attempt waits (until a deadline, then raises): only a backup copy
    of it, which finds the first attempt's marker and runs as fast as the others, lets the run
    end in time. The other blocks take ``WORK_SECS``."""
    if block.spatial_id == SLOW:
        marker = os.path.join(os.environ["DAISY_NB_TEST_OUT"], "slow_started")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass  # the backup copy
        else:
            deadline = time.monotonic() + DEADLINE_SECS
            while time.monotonic() < deadline:
                time.sleep(0.005)
            raise RuntimeError("no backup copy of the hanging block came")
    time.sleep(WORK_SECS)
    _done(block)


def init_once() -> int:
    """A worker's ``init_fn`` (a model loaded on a GPU, say): leaves ``init/<pid>`` behind, and
    fails if it runs twice in one process."""
    d = os.path.join(os.environ["DAISY_NB_TEST_OUT"], "init")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, str(os.getpid())), "x").close()
    return os.getpid()


def first_attempt_hangs_unstoppable(block) -> None:
    """As :func:`first_attempt_hangs`, but the hanging attempt blocks the pool's drop signal (as C
    code that never returns to Python would): only killing its worker stops it."""
    if block.spatial_id == SLOW and not os.path.exists(os.path.join(os.environ["DAISY_NB_TEST_OUT"], "slow_started")):
        import signal

        from daisy_nb.runtime.net.drops import DROP_SIGNAL

        signal.pthread_sigmask(signal.SIG_BLOCK, {DROP_SIGNAL})
    first_attempt_hangs(block)


TAIL_N = 12  # blocks of TAIL_WORK_SECS; the last one's first attempt sleeps TAIL_SLOW_SECS
TAIL_WORK_SECS = 0.05
TAIL_SLOW_SECS = 60.0


def last_first_attempt_sleeps(block) -> None:
    """Every block sleeps ``TAIL_WORK_SECS``, but the first attempt of the last one sleeps
    ``TAIL_SLOW_SECS`` (a slow node): it runs at the task's tail, and only a copy (interrupting it)
    ends the run in time. Each attempt leaves ``start_<id>_<first|copy>`` holding when it started
    (``time.monotonic``) and each block that ran to its end ``done/<id>.<pid>.<n>``."""
    out = os.environ["DAISY_NB_TEST_OUT"]
    secs = TAIL_WORK_SECS
    kind = "copy"
    if block.spatial_id == TAIL_N - 1:
        try:
            os.close(os.open(os.path.join(out, "slow_started"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            secs, kind = TAIL_SLOW_SECS, "first"
        except FileExistsError:
            pass
    with open(os.path.join(out, f"start_{block.spatial_id}_{kind}"), "w") as f:
        f.write(repr(time.monotonic()))
    time.sleep(secs)
    _done(block)


def sleeps_by_id(block) -> None:
    """Block ``i`` sleeps ``SPREAD_SECS[i % 4]``: blocks of one batch take different times."""
    time.sleep(SPREAD_SECS[block.spatial_id % 4])


SPREAD_SECS = (0.002, 0.004, 0.008, 0.03)
