"""Generate ``tests/data/scheduler_golden.json.gz`` from PyPI ``daisy==2.0.0``.

Regenerate (from the repository root; needs the daisy 2.0.0 virtualenv, which CI
does not have, so the output file is committed)::

    /work/venvs/daisy2/bin/python tests/golden/gen_scheduler_golden.py [--seed 20240602] [--n 300]

Deterministic for a given seed.  Every case is driven by
``tests/golden/driver.py:run_trace`` (the same function the daisy_nb tests call
with ``daisy_nb``).  Output::

    {"meta": {"generator", "daisy_version", "seed", "n_random", "summary": {...}},
     "cases": [{"name": str,                 # "core-..." named cases, "rand-NNNN"
                "kind": str,                 # single|chain2|chain3|fanin|fanout|diamond|parallel|chain2+iso
                "case": {...},               # run_trace input (see driver.py), replayable
                "result": {...},             # run_trace output: trace/checks/states/truncated, or error
                "defect": bool,              # daisy's outcome is inconsistent (CORE.md 10)
                "defect_reasons": [codes],   # sorted, see DEFECT CODES
                "defect_details": [str],
                "mode": "same"|"mixed"|"free"}]}  # random cases only: shared total+block size /
                                                  # shared total / per-task totals

DEFECT CODES (flagged from daisy's own trace and counters, independent of daisy_nb):

* ``pending_nonzero``        some task ends with ``pending_count != 0``
* ``not_done``               ``completed + failed + orphaned != total`` for some task
* ``negative_counter``       a counter was negative after some release
* ``acquired_after_success`` a block was handed out (or skip-checked) again after it succeeded
* ``acquired_after_orphaned`` a block was handed out after a permanent failure orphaned it
  (orphan set = walk of ``Scheduler.dependency_graph.downstream`` over unsucceeded blocks)
* ``acquired_after_failed``  a permanently failed block was handed out again
* ``acquired_before_upstream_done`` a block was handed out while some block of
  ``Scheduler.dependency_graph.upstream`` had not succeeded
* ``orphan_count_mismatch``  ``orphaned_count`` differs from the number of unsucceeded,
  non-failed blocks that transitively depend (via ``dependency_graph.upstream``) on a
  permanently failed block
* ``never_ready_no_upstream`` a block of a non-root task that has no upstream block in
  another task was never handed out (CORE.md 10.3 / 8.13)
* ``never_ready_upstream_done`` a block was never handed out although all its
  ``dependency_graph.upstream`` blocks succeeded (downstream() not mirroring upstream(),
  CORE.md 10.1 / 10.5)
* ``missed_orphan``          a block depending (transitively, via ``dependency_graph.upstream``)
  on a permanently failed block was neither orphaned (by the downstream walk) nor run
* ``never_ready_other``      a block was never handed out, not orphaned, for another reason
  (blocks that merely wait for another never-ready block are not flagged)
* ``safety_valve``           the trace hit the driver's length limit (``truncated``)
* ``run_error``              ``run_trace`` returned an error with ``stage == "run"``
"""

import argparse
import collections
import copy
import gzip
import json
import os
import random
import sys
import warnings

os.environ["RUST_BACKTRACE"] = "0"  # keep panic messages short

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import daisy  # noqa: E402
from driver import build_pipeline, make_roi, run_trace  # noqa: E402

FITS = ("valid", "overhang", "shrink")
_PASS = (KeyboardInterrupt, SystemExit, GeneratorExit)

KINDS = {
    "single": (["a"], []),
    "chain2": (["a", "b"], [["a", "b"]]),
    "chain3": (["a", "b", "c"], [["a", "b"], ["b", "c"]]),
    "fanin": (["a", "b", "c"], [["a", "c"], ["b", "c"]]),
    "fanout": (["a", "b", "c"], [["a", "b"], ["a", "c"]]),
    "diamond": (["a", "b", "c"], [["a", "b"], ["a", "c"], ["b", "c"]]),
    "parallel": (["a", "b"], []),
    "chain2+iso": (["a", "b", "c"], [["a", "b"]]),
}
KIND_WEIGHTS = {
    "single": 14,
    "chain2": 20,
    "chain3": 13,
    "fanin": 13,
    "fanout": 13,
    "diamond": 13,
    "parallel": 7,
    "chain2+iso": 7,
}


# ---------------------------------------------------------------------------
# geometry helpers


def graph_for(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return daisy.BlockwiseDependencyGraph(
            t["id"],
            make_roi(daisy, t["read_roi"]),
            make_roi(daisy, t["write_roi"]),
            bool(t["read_write_conflict"]),
            t["fit"],
            total_read_roi=make_roi(daisy, t["total_roi"]),
        )


def task_blocks(t):
    """sid -> daisy Block (as enumerated, i.e. as the scheduler hands it out)."""
    return {int(b.block_id[1]): b for b, _ in graph_for(t).enumerate_all_dependencies()}


def num_blocks(t):
    try:
        return int(graph_for(t).num_blocks)
    except _PASS:
        raise
    except BaseException:  # noqa: B036
        return -1


def rand_context(rng, ws, asym_p):
    if rng.random() < 0.3:
        return 0, 0
    if rng.random() < asym_p:
        return rng.randint(0, ws + 2), rng.randint(0, ws + 2)
    c = rng.randint(0, ws + 1)
    return c, c


def make_task(rng, tid, nd, ws, total_off, total_shape, asym_p, fit=None, conflict=None):
    cul, clr = [], []
    for d in range(nd):
        a, b = rand_context(rng, ws[d], asym_p)
        cul.append(a)
        clr.append(b)
    roff = [rng.randint(-5, 5) for _ in range(nd)]
    woff = [roff[d] + cul[d] for d in range(nd)]
    rshape = [cul[d] + ws[d] + clr[d] for d in range(nd)]
    return {
        "id": tid,
        "total_roi": [list(total_off), list(total_shape)],
        "read_roi": [roff, rshape],
        "write_roi": [woff, list(ws)],
        "read_write_conflict": (rng.random() < 0.6) if conflict is None else conflict,
        "fit": fit or rng.choice(FITS),
        "max_retries": rng.randint(0, 2),
    }


def rand_ws(rng, nd):
    return [rng.randint(1, 8 if nd == 1 else (5 if nd == 2 else 3)) for _ in range(nd)]


def rand_grid(rng, nd):
    """Target number of write blocks per axis (product 4..~60)."""
    while True:
        if nd == 1:
            k = [rng.randint(4, 60)]
        elif nd == 2:
            k = [rng.randint(2, 8), rng.randint(2, 8)]
        else:
            k = [rng.randint(1, 4) for _ in range(3)]
        p = 1
        for v in k:
            p *= v
        if 4 <= p <= 60:
            return k


def random_case(rng, mode):
    """mode: 'same' (shared total & block size), 'mixed' (shared total, per-task
    block sizes/contexts), 'free' (per-task totals too; often rejected by daisy)."""
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    ids, edges = KINDS[kind]
    nd = rng.choices([1, 2, 3], weights=[25, 40, 35])[0]
    asym_p = 0.3
    ws0 = rand_ws(rng, nd)
    k0 = rand_grid(rng, nd)
    toff = [rng.randint(-20, 20) for _ in range(nd)]
    ctx_pad = [rng.randint(0, 2 * ws0[d] + 2) for d in range(nd)]
    tshape = [
        k0[d] * ws0[d] + ctx_pad[d] + (rng.randint(0, ws0[d] - 1) if rng.random() < 0.4 else 0) for d in range(nd)
    ]
    tasks = []
    for tid in ids:
        if mode == "same":
            tasks.append(make_task(rng, tid, nd, ws0, toff, tshape, asym_p))
        elif mode == "mixed":
            ws = ws0 if rng.random() < 0.4 else rand_ws(rng, nd)
            tasks.append(make_task(rng, tid, nd, ws, toff, tshape, asym_p))
        else:
            ws = ws0 if rng.random() < 0.5 else rand_ws(rng, nd)
            off = [toff[d] + rng.randint(-2 * ws0[d], 2 * ws0[d]) for d in range(nd)]
            shp = [max(1, tshape[d] + rng.randint(-3 * ws0[d], 3 * ws0[d])) for d in range(nd)]
            tasks.append(make_task(rng, tid, nd, ws, off, shp, asym_p))
    # shuffle the pipeline's task list (the driver's task_order is shuffled independently)
    rng.shuffle(tasks)
    order = list(ids)
    rng.shuffle(order)
    return kind, {"seed": rng.randrange(2**31), "task_order": order, "tasks": tasks, "edges": [list(e) for e in edges]}


def add_failures_and_skips(rng, case):
    sids = {}
    for t in case["tasks"]:
        sids[t["id"]] = sorted(task_blocks(t))
    pool = [(tid, s) for tid in sorted(sids) for s in sids[tid]]
    n_always = rng.choices([0, 1, 2, 3], weights=[40, 30, 20, 10])[0]
    n_first = rng.choices([0, 1, 2, 3], weights=[40, 30, 20, 10])[0]
    picks = rng.sample(pool, min(len(pool), n_always + n_first))
    case["fail_always"] = [[t, s] for t, s in picks[:n_always]]
    case["fail_first"] = [[t, s, rng.randint(1, 3)] for t, s in picks[n_always:]]
    if rng.random() < 0.2:
        for t in case["tasks"]:
            if rng.random() < 0.6 and sids[t["id"]]:
                ss = sids[t["id"]]
                k = max(1, int(len(ss) * rng.uniform(0.1, 0.5)))
                t["skip"] = sorted(rng.sample(ss, k))
        if not any(t.get("skip") for t in case["tasks"]):
            t = case["tasks"][0]
            if sids[t["id"]]:
                t["skip"] = [sids[t["id"]][0]]


# ---------------------------------------------------------------------------
# defect analysis


def analyse(case, result, min_counters):
    """Return (reasons, details) for a run_trace result from daisy."""
    reasons, details = set(), []

    def flag(code, msg):
        reasons.add(code)
        if len(details) < 12:
            details.append("%s: %s" % (code, msg))

    if "error" in result:
        if result.get("stage") == "run":
            flag("run_error", result["error"])
        return reasons, details

    for tid, st in result["states"].items():
        if st["pending"] != 0:
            flag("pending_nonzero", "%s pending=%d" % (tid, st["pending"]))
        if st["completed"] + st["failed"] + st["orphaned"] != st["total"]:
            flag(
                "not_done",
                "%s completed+failed+orphaned=%d total=%d"
                % (tid, st["completed"] + st["failed"] + st["orphaned"], st["total"]),
            )
    for tid, (k, v) in min_counters.items():
        if v < 0:
            flag("negative_counter", "%s %s reached %d" % (tid, k, v))
    if result.get("truncated"):
        flag("safety_valve", "trace length %d" % len(result["trace"]))

    # dependency relation as daisy's scheduler sees it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = daisy.Scheduler(build_pipeline(daisy, case))
    dg = sched.dependency_graph
    blocks = {}
    for t in case["tasks"]:
        for sid, b in task_blocks(t).items():
            blocks[(t["id"], sid)] = b
    up_cache, down_cache = {}, {}

    def up(key):
        if key not in up_cache:
            up_cache[key] = [(str(u.block_id[0]), int(u.block_id[1])) for u in dg.upstream(blocks[key])]
        return up_cache[key]

    def down(key):
        if key not in down_cache:
            down_cache[key] = [(str(u.block_id[0]), int(u.block_id[1])) for u in dg.downstream(blocks[key])]
        return down_cache[key]

    max_retries = {t["id"]: int(t["max_retries"]) for t in case["tasks"]}
    succeeded, failed, orphaned = set(), set(), set()
    fail_counts = collections.Counter()
    checks_at = collections.defaultdict(list)
    for pos, tid, sid, res in result["checks"]:
        if res:
            checks_at[pos].append((tid, sid))

    def on_acquire(key, how):
        if key not in blocks:
            flag("unknown_block", "%s/%d %s" % (key[0], key[1], how))
            return
        if key in succeeded:
            flag("acquired_after_success", "%s/%d (%s)" % (key[0], key[1], how))
        if key in orphaned:
            flag("acquired_after_orphaned", "%s/%d (%s)" % (key[0], key[1], how))
        if key in failed:
            flag("acquired_after_failed", "%s/%d (%s)" % (key[0], key[1], how))
        missing = [u for u in up(key) if u not in succeeded]
        if missing:
            flag(
                "acquired_before_upstream_done",
                "%s/%d (%s) while %s not done" % (key[0], key[1], how, ",".join("%s/%d" % u for u in missing[:4])),
            )

    trace = result["trace"]
    for i in range(len(trace) + 1):
        for key in checks_at.get(i, []):
            on_acquire(key, "skip-check")
            succeeded.add(key)
        if i == len(trace):
            break
        ev = trace[i]
        key = (ev[1], ev[2])
        if ev[0] == "A":
            on_acquire(key, "acquire")
        elif ev[3] == "S":
            succeeded.add(key)
        else:
            fail_counts[key] += 1
            if fail_counts[key] == max_retries[key[0]] + 1:
                failed.add(key)
                stack = list(down(key))
                seen = set()
                while stack:
                    d = stack.pop()
                    if d in seen or d in succeeded or d in failed:
                        continue
                    seen.add(d)
                    orphaned.add(d)
                    stack.extend(down(d))

    # expected orphans: unsucceeded, non-failed blocks transitively depending on a failed one
    bad = set(failed)
    changed = True
    while changed:
        changed = False
        for key in blocks:
            if key in bad or key in succeeded:
                continue
            if any(u in bad for u in up(key)):
                bad.add(key)
                changed = True

    # blocks that never got anywhere: classify why (CORE.md 10.1/10.3/10.5)
    roots = set(t["id"] for t in case["tasks"]) - set(d for _, d in case.get("edges", []))
    touched = set(succeeded) | failed | orphaned
    touched.update((ev[1], ev[2]) for ev in trace)
    untouched = set(blocks) - touched
    for key in sorted(untouched):
        ups = up(key)
        if key in bad:
            if not any(u in untouched and u in bad for u in ups):
                flag("missed_orphan", "%s/%d depends on a failed block but was neither orphaned nor run" % key)
            continue
        if any(u in untouched for u in ups):
            continue  # waits for another never-ready block (cascade)
        if key[0] not in roots and not any(u[0] != key[0] for u in ups):
            flag("never_ready_no_upstream", "%s/%d has no upstream block in another task" % key)
        elif all(u in succeeded for u in ups):
            flag("never_ready_upstream_done", "%s/%d: all %d upstream blocks succeeded" % (key[0], key[1], len(ups)))
        else:
            flag("never_ready_other", "%s/%d" % key)

    for tid, st in result["states"].items():
        exp = sum(1 for k in bad - failed if k[0] == tid)
        if st["orphaned"] != exp:
            flag("orphan_count_mismatch", "%s orphaned=%d expected=%d" % (tid, st["orphaned"], exp))
    return reasons, details


def run_case(name, kind, case):
    mins = {}

    def on_step(sched, trace):
        for tid, st in sched.task_states.items():
            for k in (
                "ready_count",
                "processing_count",
                "completed_count",
                "skipped_count",
                "failed_count",
                "orphaned_count",
                "pending_count",
            ):
                v = int(getattr(st, k))
                if v < mins.get(tid, (k, 0))[1]:
                    mins[tid] = (k, v)

    result = run_trace(daisy, case, on_step=on_step)
    reasons, details = analyse(case, result, mins)
    return {
        "name": name,
        "kind": kind,
        "case": case,
        "result": result,
        "defect": bool(reasons),
        "defect_reasons": sorted(reasons),
        "defect_details": details,
    }


# ---------------------------------------------------------------------------
# named cases (CORE.md worked examples)


def R1(o, s):
    return [[o], [s]]


def T(tid, total, read, write, conflict=True, fit="valid", max_retries=2, **kw):
    t = {
        "id": tid,
        "total_roi": total,
        "read_roi": read,
        "write_roi": write,
        "read_write_conflict": conflict,
        "fit": fit,
        "max_retries": max_retries,
    }
    t.update(kw)
    return t


def named_cases():
    out = []
    grid2d = dict(total=[[0, 0], [50, 50]], read=[[0, 0], [20, 20]], write=[[5, 5], [10, 10]])
    # CORE.md 4: release order A0 A1 A2 A3 B1 A4 B2 A5 A6 B3 A7 A8 B4 A9 B5 B6 B7 B8
    ex4 = {
        "seed": 0,
        "policy": "fifo",
        "task_order": ["A", "B"],
        "tasks": [
            T("A", R1(0, 100), R1(0, 10), R1(0, 10), conflict=False),
            T("B", R1(0, 100), R1(0, 30), R1(10, 10), conflict=False),
        ],
        "edges": [["A", "B"]],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-4-release-order", "chain2", ex4))
    ex4c = copy.deepcopy(ex4)
    for t in ex4c["tasks"]:
        t["read_write_conflict"] = True
    out.append(("core-4-release-order-conflict", "chain2", ex4c))
    ex4r = copy.deepcopy(ex4)
    ex4r["policy"] = "random"
    ex4r["seed"] = 4
    out.append(("core-4-random", "chain2", ex4r))
    # CORE.md 6.5: 4, 11, 13, 24, 2, 7, 9, 18, 1, 6, 8, 17, 0, 3, 5, 12
    ex65 = {
        "seed": 0,
        "policy": "fifo",
        "task_order": ["a"],
        "tasks": [T("a", grid2d["total"], grid2d["read"], grid2d["write"])],
        "edges": [],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-6.5-order", "single", ex65))
    # CORE.md 6.4: max_retries=1, a permanently failing block orphans its downstream
    ex64 = copy.deepcopy(ex65)
    ex64["tasks"][0]["max_retries"] = 1
    ex64["fail_always"] = [["a", 4]]
    out.append(("core-6.4-retries-orphans", "single", ex64))
    ex64b = copy.deepcopy(ex64)
    ex64b["fail_always"] = [["a", 2]]
    out.append(("core-6.4-retries-orphans-level1", "single", ex64b))
    # transient failures: retried at the back of the queue
    ex64c = copy.deepcopy(ex65)
    ex64c["fail_first"] = [["a", 11, 2], ["a", 7, 1]]
    out.append(("core-6.4-transient", "single", ex64c))
    # CORE.md 6.3: check_function skips (counted as skipped and completed)
    exsk = copy.deepcopy(ex65)
    exsk["tasks"][0]["skip"] = [4, 11, 2, 0]
    out.append(("core-6.3-skip", "single", exsk))
    # CORE.md 10.1: asymmetric downstream context -> B never starts
    ex101 = {
        "seed": 0,
        "policy": "fifo",
        "task_order": ["A", "B"],
        "tasks": [T("A", R1(0, 60), R1(0, 10), R1(0, 10)), T("B", R1(0, 60), R1(0, 20), R1(0, 10))],
        "edges": [["A", "B"]],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-10.1-asymmetric", "chain2", ex101))
    # CORE.md 9: 0-level task (TW smaller than a block, valid, conflict) -> Scheduler panics
    ex9 = {
        "seed": 0,
        "task_order": ["a"],
        "tasks": [T("a", R1(0, 15), R1(0, 20), R1(5, 10))],
        "edges": [],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-9-zero-levels", "single", ex9))
    # CORE.md 9: TW smaller than a block, no conflict -> 0 blocks, done at once
    ex9b = copy.deepcopy(ex9)
    ex9b["tasks"][0]["read_write_conflict"] = False
    out.append(("core-9-zero-blocks", "single", ex9b))
    # CORE.md 8.7 / 9: cycle, and 8.13: downstream reading nothing upstream writes
    excy = {
        "seed": 0,
        "task_order": ["a", "b"],
        "tasks": [T("a", R1(0, 40), R1(0, 10), R1(0, 10)), T("b", R1(0, 40), R1(0, 10), R1(0, 10))],
        "edges": [["a", "b"], ["b", "a"]],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-8.7-cycle", "cycle", excy))
    ex813 = {
        "seed": 0,
        "task_order": ["a", "b"],
        "tasks": [T("a", R1(0, 40), R1(0, 10), R1(0, 10)), T("b", R1(100, 40), R1(0, 10), R1(0, 10))],
        "edges": [["a", "b"]],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-8.13-reads-nothing", "chain2", ex813))
    # CORE.md 8.13: passes the check although b's last block reads nothing of a
    ex813b = {
        "seed": 0,
        "policy": "fifo",
        "task_order": ["a", "b"],
        "tasks": [T("a", R1(0, 100), R1(0, 10), R1(0, 10)), T("b", R1(0, 110), R1(0, 10), R1(0, 10))],
        "edges": [["a", "b"]],
        "fail_always": [],
        "fail_first": [],
    }
    out.append(("core-8.13-missed", "chain2", ex813b))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20240602)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument(
        "--error-share",
        type=float,
        default=0.10,
        help="max share of random cases that daisy rejects at Scheduler construction",
    )
    ap.add_argument("--out", default=os.path.join(HERE, "..", "data", "scheduler_golden.json.gz"))
    args = ap.parse_args(argv)
    assert daisy.__version__ == "2.0.0", daisy.__version__
    assert daisy.get_tracking_basedir() is None, "block tracking must be off"

    rng = random.Random(args.seed)
    entries = [run_case(name, kind, c) for name, kind, c in named_cases()]
    max_err = int(round(args.error_share * args.n))
    n_err = 0
    rejected = collections.Counter()
    i = 0
    while i < args.n:
        mode = rng.choices(["same", "mixed", "free"], weights=[65, 20, 15])[0]
        kind, case = random_case(rng, mode)
        counts = [num_blocks(t) for t in case["tasks"]]
        if not all(4 <= n <= 60 for n in counts):
            rejected["block_count"] += 1
            continue
        add_failures_and_skips(rng, case)
        e = run_case("rand-%04d" % i, kind, case)
        e["mode"] = mode
        if "error" in e["result"] and e["result"].get("stage") == "construct":
            if n_err >= max_err:
                rejected["error_quota"] += 1
                continue
            n_err += 1
        entries.append(e)
        i += 1

    summary = {
        "kinds": dict(collections.Counter(e["kind"] for e in entries)),
        "errors": dict(
            collections.Counter(e["result"]["error"].split(" (")[0][:90] for e in entries if "error" in e["result"])
        ),
        "defects": sum(1 for e in entries if e["defect"]),
        "defect_reasons": dict(collections.Counter(r for e in entries for r in e["defect_reasons"])),
        "resampled": dict(rejected),
    }
    data = {
        "meta": {
            "generator": "tests/golden/gen_scheduler_golden.py",
            "daisy_version": daisy.__version__,
            "seed": args.seed,
            "n_random": args.n,
            "summary": summary,
        },
        "cases": entries,
    }
    out = os.path.normpath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as f:
        f.write(json.dumps(data, separators=(",", ":")).encode())
    print(json.dumps(summary, indent=1), file=sys.stderr)
    print("wrote %s: %d cases, %.2f MB" % (out, len(entries), os.path.getsize(out) / 1e6), file=sys.stderr)


if __name__ == "__main__":
    main()
