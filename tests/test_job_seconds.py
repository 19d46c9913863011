"""Worker-seconds held and busy per task (``daisy_nb.scheduling.job_seconds.JobSeconds``): the record against a
slow twin with a fake clock, then what real runs report through the JSON observer.

Held is each worker's life as the scheduler process sees it; busy is the time blocks ran. The
bounds asserted hold on a busy machine: busy is at least the blocks' sleeps, held at least busy
(each block runs inside a worker's life) and at most the run's wall time per worker started.
"""

import json
import sys
import time
from pathlib import Path

import pytest
from funlib.geometry import Roi
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import blockfns  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.progress import JsonProgressObserver  # noqa: E402
from daisy_nb.scheduling.job_seconds import JobSeconds  # noqa: E402

# ------------------------------------------------------------------ the record, with a fake clock

# an event: (worker key 0-3, "start" | "end" | "ran", seconds since the previous event)
_events = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["start", "end", "ran"]), st.floats(0, 10)), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(_events, st.floats(0, 10))
def test_held_and_busy_match_a_list_of_intervals(events, tail):
    """``held(now)`` is the summed length of every worker's intervals up to ``now`` (a start of a
    worker already held restarts its interval, as a new worker under the same key would; an end
    of a worker not held is nothing); ``busy`` the summed ``ran``."""
    js = JobSeconds()
    intervals: list[list[float]] = []  # [start, end or None]
    open_at: dict[int, int] = {}  # key -> index of its open interval
    busy = 0.0
    now = 0.0
    for key, what, dt in events:
        now += dt
        if what == "start":
            js.started(key, now)
            if key in open_at:  # the twin: the earlier interval is forgotten, as the record forgets it
                intervals[open_at[key]] = [0.0, 0.0]
            open_at[key] = len(intervals)
            intervals.append([now, None])
        elif what == "end":
            js.ended(key, now)
            if key in open_at:
                intervals[open_at.pop(key)][1] = now
        else:
            js.ran(dt)
            busy += dt
    now += tail
    expect = sum((now if end is None else end) - start for start, end in intervals)
    assert js.held(now) == pytest.approx(expect, abs=1e-9)
    assert js.busy == pytest.approx(busy, abs=1e-9)


def test_a_worker_ended_twice_counts_once():
    js = JobSeconds()
    js.started("w", 1.0)
    js.ended("w", 3.0)
    js.ended("w", 10.0)
    assert js.held(20.0) == 2.0


# ------------------------------------------------------------------ real runs

N = 8
SLEEP = 0.05  # blockfns.slow_mark's block


def task(fn, **kw):
    return daisy_nb.Task(
        "t",
        Roi((0,), (10 * N,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        tracking_path=False,
        **kw,
    )


def finish_line(path):
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    fin = [x for x in lines if x.get("event") == "finish" and x.get("task") == "t"]
    assert len(fin) == 1, lines
    return fin[0]


@pytest.mark.mp
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("how", ["pool", "worker function"])
def test_a_run_reports_its_workers_held_and_busy_seconds(out, tmp_path, how):
    """Local block workers (held: each process's life) and a 0-argument worker function running a
    ``Client`` loop (held: the function's life; busy: its Client's blocks) report both measures."""
    path = tmp_path / "p.jsonl"
    fn = blockfns.slow_mark if how == "pool" else blockfns.client_loop_slow
    t0 = time.monotonic()
    states = daisy_nb.Server().run_blockwise(
        [task(fn, max_workers=2)], progress=JsonProgressObserver(path=str(path)), summary=False
    )
    wall = time.monotonic() - t0
    st_ = states["t"]
    line = finish_line(path)
    assert line["completed"] == N
    assert line["job_secs_busy"] >= N * SLEEP * 0.99
    assert line["job_secs_held"] >= line["job_secs_busy"]
    assert line["job_secs_held"] <= st_.worker_start_count * wall + 1e-3
    # the JSON line is the task state's, rounded
    assert line["job_secs_held"] == pytest.approx(st_.job_seconds_held, abs=1e-3)
    assert line["job_secs_busy"] == pytest.approx(st_.job_seconds_busy, abs=1e-3)


def test_a_serial_run_reports_busy_seconds_and_holds_no_worker(out, tmp_path):
    """A serial run starts no worker: nothing is held; its blocks' time is busy."""
    path = tmp_path / "p.jsonl"
    daisy_nb.run_blockwise(
        [task(blockfns.slow_mark)], multiprocessing=False, progress=JsonProgressObserver(path=str(path)), summary=False
    )
    line = finish_line(path)
    assert line["job_secs_busy"] >= N * SLEEP * 0.99
    assert line["job_secs_held"] == 0.0
