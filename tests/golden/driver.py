"""Deterministic scheduler driver shared by the golden-data generator and the tests.

``run_trace(daisy, case)`` builds a pipeline from a JSON-able case description,
creates ``daisy.Scheduler(pipeline)`` and drives it with a seeded random
acquire/release policy.  ``daisy`` is a module-like object: PyPI ``daisy==2.0.0``
when generating ``tests/data/scheduler_golden.json.gz`` (see
``gen_scheduler_golden.py``) and ``daisy_nb`` in the tests.  Only the public API
is used (``Roi``, ``Task``, ``Pipeline``, ``Scheduler``, ``BlockStatus``,
``Scheduler.acquire_block/release_block/task_states``, block ``block_id`` and
``status``), so this module imports nothing but the standard library.

Case description (all JSON types)::

    {"seed": int,
     "task_order": [task ids],            # order of the acquire passes
     "tasks": [{"id": str,
                "total_roi": [[offset...], [shape...]],
                "read_roi":  [[offset...], [shape...]],
                "write_roi": [[offset...], [shape...]],
                "read_write_conflict": bool,
                "fit": "valid" | "overhang" | "shrink",
                "max_retries": int,
                "skip": [spatial ids]      # optional: check_function returns True for these
               }, ...],
     "edges": [[upstream id, downstream id], ...],
     "fail_always": [[task id, spatial id], ...],      # every attempt fails
     "fail_first": [[task id, spatial id, n], ...],    # the first n attempts fail
     "policy": "random" | "fifo",         # optional, default "random"
     "max_trace": int}                    # optional safety valve, default 20000

Result::

    {"trace": [["A", tid, sid] | ["R", tid, sid, "S" | "F"], ...],
     "checks": [[len(trace) at call time, tid, sid, bool], ...],  # check_function calls
     "states": {tid: {"total", "ready", "processing", "completed", "skipped",
                      "failed", "orphaned", "pending", "is_done"}},
     "truncated": bool}

or, if the scheduler cannot be built or the run raises,
``{"error": "<ExceptionType>: <message>", "stage": "construct" | "run", ...}``
(for ``"run"`` the partial ``trace``/``checks`` are kept).  pyo3's
``PanicException`` derives from ``BaseException``, so everything except
``KeyboardInterrupt``/``SystemExit``/``GeneratorExit`` is caught.

Policies:

* ``"random"`` (default): each round, for each task in ``task_order`` acquire
  ``rng.randint(0, 2)`` blocks (stopping at the first None); if nothing is in
  flight, do a forced pass of one acquire per task; if still nothing, stop.
  Then release one random in-flight block (``rng.randrange``), failing it if it
  is in ``fail_always`` or has had fewer than ``n`` attempts for a
  ``fail_first`` entry.
* ``"fifo"``: each round acquire one block per task in ``task_order`` and
  release the *oldest* in-flight block (the driver of CORE.md section 4).
"""

import random
import warnings

_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)

STATE_KEYS = ("total", "ready", "processing", "completed", "skipped", "failed", "orphaned", "pending", "is_done")


def fmt_error(exc):
    """``"<type>: <message>"`` for an exception (the format used in golden files)."""
    return "%s: %s" % (type(exc).__name__, exc)


def make_roi(daisy, spec):
    """``[[offset...], [shape...]]`` -> ``daisy.Roi``."""
    return daisy.Roi(tuple(int(v) for v in spec[0]), tuple(int(v) for v in spec[1]))


def roi_to_json(roi):
    """Any Roi-like object -> ``[[offset...], [shape...]]``."""
    return [[int(v) for v in roi.offset], [int(v) for v in roi.shape]]


def _make_check(skip, task_id, checks, trace):
    def check_function(block):
        sid = block.block_id[1]
        res = sid in skip
        checks.append([len(trace), task_id, int(sid), bool(res)])
        return res

    return check_function


def build_pipeline(daisy, case, checks=None, trace=None):
    """Build ``daisy.Pipeline(tasks, edges)`` for a case.

    ``checks``/``trace`` are the lists the check functions log into (a task gets a
    check_function only if its description has a non-empty ``"skip"``)."""
    if checks is None:
        checks = []
    if trace is None:
        trace = []
    tasks = {}
    ordered = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in case["tasks"]:
            skip = t.get("skip") or []
            check = _make_check(frozenset(int(s) for s in skip), t["id"], checks, trace) if skip else None
            task = daisy.Task(
                t["id"],
                make_roi(daisy, t["total_roi"]),
                make_roi(daisy, t["read_roi"]),
                make_roi(daisy, t["write_roi"]),
                process_function=None,
                check_function=check,
                read_write_conflict=bool(t["read_write_conflict"]),
                fit=t["fit"],
                max_retries=int(t["max_retries"]),
            )
            tasks[t["id"]] = task
            ordered.append(task)
        edges = [(tasks[u], tasks[d]) for u, d in case.get("edges", [])]
        return daisy.Pipeline(ordered, edges)


def read_states(daisy, sched):
    """``sched.task_states`` -> ``{tid: {key: int|bool}}`` (keys: STATE_KEYS)."""
    out = {}
    for tid, st in sched.task_states.items():
        out[str(tid)] = {
            "total": int(st.total_block_count),
            "ready": int(st.ready_count),
            "processing": int(st.processing_count),
            "completed": int(st.completed_count),
            "skipped": int(st.skipped_count),
            "failed": int(st.failed_count),
            "orphaned": int(st.orphaned_count),
            "pending": int(st.pending_count),
            "is_done": bool(st.is_done()),
        }
    return {k: out[k] for k in sorted(out)}


def run_trace(daisy, case, on_step=None):
    """Drive ``daisy.Scheduler`` over ``case``; see the module docstring.

    ``on_step(sched, trace)``, if given, is called after every release (the
    generator uses it to watch the counters); it is not part of the result."""
    trace = []
    checks = []
    try:
        pipeline = build_pipeline(daisy, case, checks, trace)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sched = daisy.Scheduler(pipeline)
    except _PASS_THROUGH:
        raise
    except BaseException as e:  # noqa: B036 - pyo3 PanicException is a BaseException
        return {"error": fmt_error(e), "stage": "construct"}

    fail_always = set((str(t), int(s)) for t, s in case.get("fail_always", []))
    fail_first = {}
    for t, s, n in case.get("fail_first", []):
        fail_first[(str(t), int(s))] = int(n)
    order = list(case["task_order"])
    policy = case.get("policy", "random")
    max_trace = int(case.get("max_trace", 20000))
    rng = random.Random(case["seed"])
    attempts = {}
    in_flight = []
    truncated = False
    SUCCESS = daisy.BlockStatus.SUCCESS
    FAILED = daisy.BlockStatus.FAILED

    try:
        while True:
            if policy == "fifo":
                for tid in order:
                    b = sched.acquire_block(tid)
                    if b is not None:
                        trace.append(["A", tid, int(b.block_id[1])])
                        in_flight.append(b)
                if not in_flight:
                    break
                b = in_flight.pop(0)
            else:
                for tid in order:
                    for _ in range(rng.randint(0, 2)):
                        b = sched.acquire_block(tid)
                        if b is None:
                            break
                        trace.append(["A", tid, int(b.block_id[1])])
                        in_flight.append(b)
                if not in_flight:
                    # forced pass so that the loop never stops early
                    for tid in order:
                        b = sched.acquire_block(tid)
                        if b is not None:
                            trace.append(["A", tid, int(b.block_id[1])])
                            in_flight.append(b)
                    if not in_flight:
                        break
                b = in_flight.pop(rng.randrange(len(in_flight)))
            key = (str(b.block_id[0]), int(b.block_id[1]))
            n = attempts.get(key, 0)
            attempts[key] = n + 1
            fail = key in fail_always or n < fail_first.get(key, 0)
            b.status = FAILED if fail else SUCCESS
            sched.release_block(b)
            trace.append(["R", key[0], key[1], "F" if fail else "S"])
            if on_step is not None:
                on_step(sched, trace)
            if len(trace) > max_trace:
                truncated = True
                break
    except _PASS_THROUGH:
        raise
    except BaseException as e:  # noqa: B036
        return {
            "error": fmt_error(e),
            "stage": "run",
            "trace": trace,
            "checks": checks,
            "states": read_states(daisy, sched),
        }

    return {"trace": trace, "checks": checks, "states": read_states(daisy, sched), "truncated": truncated}
