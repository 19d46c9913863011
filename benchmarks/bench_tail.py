"""What cluster jobs cost at a task's tail: job-seconds held per second of work, daisy_nb vs daisy 2.0.0.

    python benchmarks/bench_tail.py --daisy-python /work/venv-daisy2/bin/python [--quick] [--rounds N] \
        [--first-attempt] [--speculative]

Issue #27's cluster scenario: two chained tasks (block ``i`` of ``b`` reads what block ``i``
of ``a`` wrote), each with ``--jobs`` worker functions (8) that submit a job with ``sbatch
--wait`` (the fake of ``tests/workers/fakebatch.py`` on ``PATH``: every job in its own
session, after a queue delay of ``--queue`` seconds) and wait for it, as daisy users write
them; each job runs a ``Client`` loop. 240 blocks per task of ``time.sleep`` with durations
drawn per block from a fixed seed, lognormal (median 80 ms, sigma 0.5), 1% of them stragglers
25x longer (``--no-stragglers``: none), ``max_retries=2`` (daisy's default).

Every job program writes, when it ends, when it started and ended (``time.monotonic``: one
clock for the machine) and the seconds its blocks slept. Reported per library, medians over
the rounds (which alternate the libraries, so that load bursts hit both):

* **busy / held**: the blocks' seconds over the job-seconds held, each job from its program's
  start to its end (what a cluster bills, without the queue); 1.0 is no idle job;
* **job-seconds held** and **jobs** started;
* **makespan / bound**: ``run_blockwise``'s wall time over its lower bound, the largest of
  the longest chain (``a_i + b_i``), each task's work over its jobs, and all the work over
  every job; start-up (submitting, queueing, the job's imports) is above the bound;
* **makespan / (bound + start)**: the same over the bound plus a job's start, what no library
  can save (issue #27: "a bound of 5.6 s plus start-up"): the quickest of three jobs submitted
  through the same fake ``sbatch --wait`` before each run, from the submission to its program's
  first line (the batch command's own start, the queue delay, the job's interpreter; not the
  library's import, which is the library's to pay);
* **makespan / wave bound**: the same over a bound that also counts what this machine makes
  a start cost: each task's ``--jobs`` jobs are submitted together, and here they share the
  machine's cores as they start (the fake ``sbatch``, its runner and the job are each an
  interpreter), where a cluster starts them on their own nodes. The wave is measured like the
  start, all ``--jobs`` jobs submitted at once before each run, and reported as their mean
  start. A task's jobs do no work before each is up, so its work takes at least the least
  ``T`` at which the wave's jobs, each from its start, add up to its work (the wave's mean
  start plus its work over its jobs, when every job is up by then); the bound is the larger
  of that and the chain plus one job's start. It holds for any scheduler that starts a task's
  jobs together, and it assumes nothing of how a downstream task's jobs are started;
* daisy_nb's own account (``TaskState.job_seconds_held``/``busy``, the JSON observer's
  ``job_secs_held``/``job_secs_busy``), which counts a job from its worker function's start,
  queue included.

``--first-attempt``: the stragglers' slowness belongs to their first attempt (a slow node, a
file server under load), not to the block: a second attempt or a copy takes the block's usual
time. The bound is then that of a run without the slowness (what backups could reach), and a
job's blocks' seconds count only bodies that ran to their end (a copy interrupted because its
twin won is held time, not work). ``--speculative``: one more case, daisy_nb with
``Task(speculative=True)`` (backup copies of stragglers, ``daisy_nb/runtime/net/backups.py``).

``--quick``: 48 blocks per task, 4 jobs, one round, daisy_nb only unless ``--daisy-python``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEDIAN_SECS = 0.08
SIGMA = 0.5
STRAGGLER_SHARE = 0.01
STRAGGLER_FACTOR = 25.0


def duration(task_id: str, sid: int, stragglers: bool, first: bool = True) -> float:
    """Block ``sid`` of ``task_id``'s sleep: the same for both libraries and every round
    (``first``: its first attempt; a straggler is slow on every attempt unless ``--first-attempt``)."""
    rng = random.Random(f"{task_id}:{sid}")
    d = MEDIAN_SECS * math.exp(SIGMA * rng.gauss(0.0, 1.0))
    if rng.random() < STRAGGLER_SHARE and stragglers and first:
        d *= STRAGGLER_FACTOR
    return d


def first_attempt(out: str, task_id: str, sid: int) -> bool:
    """True for the first attempt of a block (in any job): its marker file did not exist yet."""
    try:
        os.close(os.open(os.path.join(out, f"att_{task_id}_{sid}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


# ---------------------------------------------------------------- in the children
def job(lib: str, out: str, stragglers: bool) -> None:
    """The job program: a Client loop; ``job_<pid>`` says when it ran and what its blocks slept."""
    t0 = time.monotonic()
    if lib == "daisy":
        import daisy
    else:
        import daisy_nb as daisy
    client = daisy.Client()
    slept = 0.0
    n = 0
    task_id = "-"
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            task_id, sid = block.block_id
            first = True if os.environ.get("BENCH_TAIL_FIRST_ONLY") != "1" else first_attempt(out, task_id, sid)
            d = duration(task_id, sid, stragglers, first)
            time.sleep(d)  # a dropped copy is interrupted here (BlockDropped): neither slept nor counted
            slept += d
            n += 1
    with open(os.path.join(out, f"job_{os.getpid()}"), "w") as f:
        f.write(f"{t0} {time.monotonic()} {slept} {n} {task_id if n else '-'}\n")


def job_start(env: dict, python: str, cwd: str) -> float:
    """Seconds from submitting a job through the fake ``sbatch --wait`` to its program's first line:
    the quickest of three, one after another (the bound's start-up; module docstring)."""
    return min(wave_start(env, python, cwd, 1)[0] for _ in range(3))


def wave_start(env: dict, python: str, cwd: str, jobs: int) -> list[float]:
    """Seconds from submitting ``jobs`` jobs at once (as a task's worker functions do) through the
    fake ``sbatch --wait`` to each one's program's first line, sorted: on a machine where the fake
    jobs share its cores, a wave comes up later than one job alone (module docstring)."""
    stamps = [os.path.join(cwd, f"wave_probe_{i}") for i in range(jobs)]
    procs = []
    t0 = time.monotonic()
    for stamp in stamps:
        prog = f"import time; open({stamp!r}, 'w').write(repr(time.monotonic()))"
        procs.append(
            subprocess.Popen(
                ["sbatch", "--parsable", "--wait", "--wrap", shlex.join([python, "-c", prog])],
                env=env,
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    out = []
    for p, stamp in zip(procs, stamps):
        if p.wait(timeout=60) != 0:
            raise RuntimeError(f"a wave job failed (status {p.returncode})")
        with open(stamp) as f:
            out.append(float(f.read()) - t0)
        os.unlink(stamp)
    return sorted(out)


def sbatch_wait() -> None:
    """Worker function: the job through ``sbatch --wait``, as a daisy user writes it."""
    argv = os.environ["BENCH_TAIL_JOB"].split("\n")
    subprocess.run(["sbatch", "--parsable", "--wait", "--wrap", shlex.join(argv)], check=True, stdin=subprocess.DEVNULL)


def driver(lib: str, out: str, blocks: int, jobs: int, stragglers: bool) -> None:
    sys.path.insert(0, HERE)
    import bench_tail  # the worker function must be importable by reference in the workers

    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi
    else:
        import daisy_nb as daisy
        from daisy_nb import Roi
    argv = [sys.executable, os.path.abspath(__file__), "--job", lib, out, str(int(stragglers))]
    os.environ["BENCH_TAIL_JOB"] = "\n".join(argv)

    def task(tid, upstream):
        return daisy.Task(
            tid,
            Roi((0,), (blocks,)),
            Roi((0,), (1,)),
            Roi((0,), (1,)),
            process_function=bench_tail.sbatch_wait,
            read_write_conflict=False,
            max_workers=jobs,
            max_retries=2,
            upstream_tasks=upstream,
            **({"speculative": True} if os.environ.get("BENCH_TAIL_SPECULATIVE") == "1" else {}),
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # upstream_tasks: both libraries take it
        a = task("a", None)
        b = task("b", [a])
    kw: dict = {}
    obs_path = os.path.join(out, "..", "observer.jsonl")
    if lib != "daisy":
        from daisy_nb.progress import JsonProgressObserver

        kw["progress"] = JsonProgressObserver(path=obs_path)
    else:
        kw["progress"] = False
    t0 = time.monotonic()
    ok = daisy.run_blockwise([a, b], host="127.0.0.1", **kw)
    wall = time.monotonic() - t0
    own = {}
    if lib != "daisy":
        with open(obs_path) as f:
            for line in f:
                x = json.loads(line)
                if x.get("event") == "finish":
                    own[x["task"]] = (x["job_secs_held"], x["job_secs_busy"])
    print("RESULT " + json.dumps({"ok": bool(ok), "wall": wall, "t0": t0, "own": own}), flush=True)


# ------------------------------------------------------------------ in the parent
def one(
    python: str,
    lib: str,
    blocks: int,
    jobs: int,
    stragglers: bool,
    queue: float,
    verbose: bool,
    spec: bool,
    first: bool,
) -> dict:
    import _util

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        os.mkdir(out)
        extra = {"FAKEBATCH_QUEUE_SECS": str(queue), "BENCH_TAIL_SPECULATIVE": str(int(spec))}
        env = _util.fake_batch_env(d, {**extra, "BENCH_TAIL_FIRST_ONLY": str(int(first))})
        if lib == "daisy":  # daisy 2.0.0 from its own environment, nothing of this checkout
            env.pop("PYTHONPATH", None)
        start = job_start(env, python, d)
        wave = wave_start(env, python, d, jobs)
        r = subprocess.run(
            [python, os.path.abspath(__file__), "--driver", lib, out, str(blocks), str(jobs), str(int(stragglers))],
            env=env,
            cwd=d,  # daisy's logs land in the cwd
            capture_output=True,
            text=True,
            timeout=1200,
        )
        res = None
        for line in reversed(r.stdout.splitlines()):
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                break
        if res is None or not res["ok"]:
            raise RuntimeError(f"{lib}: the run failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        held = busy = 0.0
        spans = []
        for name in os.listdir(out):
            if name.startswith("job_"):
                with open(os.path.join(out, name)) as f:
                    t0, t1, slept, n, tid = f.read().split()
                held += float(t1) - float(t0)
                busy += float(slept)
                spans.append((float(t0), float(t1), float(slept), int(n), tid))
        res.update(held=held, busy=busy, jobs=len(spans), start=start, wave=wave)
        if verbose:  # every job: when it ran (from the run's start: one monotonic clock), its blocks and seconds
            first = res["t0"]
            print(f"{lib}: makespan {res['wall']:.2f} s")
            for t0, t1, slept, n, tid in sorted(spans):
                print(f"  task {tid}: {t0 - first:6.2f} -> {t1 - first:6.2f} s, {n:3d} blocks, {slept:6.2f} s busy")
        return res


def bound(blocks: int, jobs: int, stragglers: bool) -> tuple[float, float, float, float]:
    """The work (block-seconds), the makespan's lower bound, and its two parts: the longest chain
    and the larger task's work over its jobs (module docstring; ``stragglers`` False: without
    their slowness)."""
    da = [duration("a", i, stragglers) for i in range(blocks)]
    db = [duration("b", i, stragglers) for i in range(blocks)]
    work = sum(da) + sum(db)
    chain = max(x + y for x, y in zip(da, db))
    per_task = max(sum(da), sum(db)) / jobs
    return work, max(chain, per_task, work / (2 * jobs)), chain, per_task


def wave_bound(chain: float, per_task: float, start: float, wave: list[float]) -> float:
    """The bound with the start-up this machine imposes: a task's jobs, submitted together, do no
    work before each is up, so its work (``per_task`` on each of the wave's jobs) ends no sooner
    than the least ``T`` with ``sum(max(0, T - s_k)) >= work`` (the wave's mean start plus
    ``per_task`` when every job is up by then); the chain waits for one job's start (module
    docstring)."""
    s = sorted(wave)
    work = per_task * len(s)
    t = math.inf
    for k in range(1, len(s) + 1):  # the first k jobs to come up do the work
        t = (work + sum(s[:k])) / k
        if k == len(s) or t <= s[k]:
            break
    return max(chain + start, t)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--job":
        job(sys.argv[2], sys.argv[3], bool(int(sys.argv[4])))
        return
    if len(sys.argv) == 7 and sys.argv[1] == "--driver":
        driver(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), bool(int(sys.argv[6])))
        return
    import argparse
    import statistics

    sys.path.insert(0, HERE)
    import _util

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed")
    ap.add_argument("--quick", action="store_true", help="48 blocks per task, 4 jobs, one round (smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per task (default 8; 4 with --quick)")
    ap.add_argument("--queue", type=float, default=0.2, help="the fake batch system's queue delay (s)")
    ap.add_argument("--no-stragglers", action="store_true", help="no 25x stragglers")
    ap.add_argument("--verbose", action="store_true", help="print every job's span, blocks and busy seconds")
    ap.add_argument("--first-attempt", action="store_true", help="the stragglers' slowness is their first attempt's")
    ap.add_argument("--speculative", action="store_true", help="also daisy_nb with Task(speculative=True)")
    args = ap.parse_args()
    blocks, jobs = (48, 4) if args.quick else (240, 8)
    jobs = args.jobs or jobs
    rounds = args.rounds or (1 if args.quick else 3)
    stragglers = not args.no_stragglers
    cases = [("daisy_nb", sys.executable, "daisy_nb", False)]
    if args.speculative:
        cases.append(("daisy_nb speculative", sys.executable, "daisy_nb", True))
    if args.daisy_python:
        cases.append(("daisy 2.0.0", args.daisy_python, "daisy", False))
    note = _util.as_installed()  # every job program imports daisy_nb: as installed, before any clock
    res: dict[str, list[dict]] = {c[0]: [] for c in cases}
    for _ in range(rounds):
        for name, python, lib, spec in cases:
            res[name].append(
                one(python, lib, blocks, jobs, stragglers, args.queue, args.verbose, spec, args.first_attempt)
            )
    work, lower, chain, per_task = bound(blocks, jobs, stragglers and not args.first_attempt)

    def med(vals, f="{:.3f}"):
        return f.format(statistics.median(vals)) + " (" + ", ".join(f.format(v) for v in vals) + ")"

    print(
        f"\nTwo chained tasks, {blocks} blocks each, {jobs} sbatch --wait jobs per task (queue {args.queue:g} s), "
        f"lognormal blocks (median {MEDIAN_SECS * 1e3:.0f} ms, sigma {SIGMA:g})"
        + (f", {STRAGGLER_SHARE:.0%} stragglers x{STRAGGLER_FACTOR:g}" if stragglers else ", no stragglers")
        + (" on their first attempt (bound without them)" if stragglers and args.first_attempt else "")
        + f"; {work:.1f} s of work, makespan bound {lower:.2f} s; {rounds} round(s), medians (per round)\n"
        + _util.machine_note()
        + (f"\n{note}" if note else "")
        + "\n"
    )
    rows = []
    for name, _, _, _ in cases:
        rs = res[name]
        own = "–"
        if rs[0]["own"]:
            eff = [sum(b for _, b in r["own"].values()) / max(1e-9, sum(h for h, _ in r["own"].values())) for r in rs]
            own = med(eff)
        rows.append(
            [
                name,
                med([r["busy"] / r["held"] for r in rs]),
                med([r["held"] for r in rs], "{:.1f}"),
                med([r["jobs"] for r in rs], "{:.0f}"),
                med([r["wall"] / lower for r in rs], "{:.2f}"),
                med([r["wall"] / (lower + r["start"]) for r in rs], "{:.2f}"),
                med([r["start"] for r in rs], "{:.2f}"),
                med([r["wall"] / wave_bound(chain, per_task, r["start"], r["wave"]) for r in rs], "{:.2f}"),
                med([sum(r["wave"]) / len(r["wave"]) for r in rs], "{:.2f}"),
                own,
            ]
        )
    print(
        _util.table(
            [
                "library",
                "busy / held",
                "job-seconds held",
                "jobs",
                "makespan / bound",
                "makespan / (bound + start)",
                "a job's start (s)",
                "makespan / wave bound",
                f"{jobs} jobs' mean start (s)",
                "daisy_nb's own busy / held",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
