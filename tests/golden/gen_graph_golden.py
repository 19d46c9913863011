"""Generate ``tests/data/graph_golden.json.gz`` from PyPI ``daisy==2.0.0``.

Regenerate (from the repository root; needs the daisy 2.0.0 virtualenv, which CI
does not have, so the output file is committed)::

    /work/venvs/daisy2/bin/python tests/golden/gen_graph_golden.py [--seed 20240601] [--n 400]

The output is deterministic for a given seed (and daisy version).  It contains

* ``"meta"``: generator, daisy version, seed.
* ``"cases"``: single-task ``daisy.BlockwiseDependencyGraph`` configurations
  (random ones named ``rand-NNNN`` plus the worked examples of CORE.md 3.6 and
  3.10, named ``core-3.6-*`` / ``core-3.10-*``).  Each case::

      {"name": str,
       "config": {"total_roi": [[off...],[shape...]], "read_roi": ..., "write_roi": ...,
                  "read_write_conflict": bool, "fit": "valid"|"overhang"|"shrink"},
       "num_blocks": int, "num_levels": int, "num_roots": int,
       "blocks": [[sid, [read_off], [read_shape], [write_off], [write_shape], [upstream sids]], ...],
       "roots": [sids of root_gen()],
       "downstream": [[sid, [downstream sids]], ...],
       "subgraph": [{"roi": [[off],[shape]], "read_roi": bool, "ids": [sids]}, ...]}

  ``blocks`` is exactly ``enumerate_all_dependencies()`` order, upstream and
  downstream lists are in daisy's order (not sorted).  If a call raises (e.g. a
  pyo3 ``PanicException`` for zero-level graphs), the corresponding value is
  ``null``, ``"errors"`` maps the field name to ``"<type>: <msg>"`` and
  ``"error"`` holds the first of these messages.
* ``"big"``: the four benchmark configurations of CORE.md 3.11, counts only plus
  ``"blocks_head"`` (first 50 entries of the enumeration, same format as
  ``blocks``) and ``"roots_head"`` (first 50 root ids).
* ``"block_ids"``: explicit ``daisy.Block(total_roi, read_roi, write_roi)``
  constructions: ``{"total_roi", "read_roi", "write_roi", "spatial_id"}``.
"""

import argparse
import gzip
import json
import os
import random
import sys
import time

os.environ["RUST_BACKTRACE"] = "0"  # keep panic messages short

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import daisy  # noqa: E402
from daisy import Roi  # noqa: E402
from driver import fmt_error, roi_to_json  # noqa: E402

FITS = ("valid", "overhang", "shrink")
_PASS = (KeyboardInterrupt, SystemExit, GeneratorExit)


def R(off, shape):
    return Roi(tuple(off), tuple(shape))


def jroi(off, shape):
    return [[int(v) for v in off], [int(v) for v in shape]]


def block_entry(b, ups):
    r = roi_to_json(b.read_roi)
    w = roi_to_json(b.write_roi)
    return [int(b.block_id[1]), r[0], r[1], w[0], w[1], [int(u.block_id[1]) for u in ups]]


def make_graph(cfg, task_id="t"):
    return daisy.BlockwiseDependencyGraph(
        task_id,
        R(*cfg["read_roi"]),
        R(*cfg["write_roi"]),
        cfg["read_write_conflict"],
        cfg["fit"],
        total_read_roi=R(*cfg["total_roi"]),
    )


def record_case(name, cfg, rng=None, n_sub=5, full=True, head=None):
    """Run daisy on one config and return the golden dict."""
    out = {"name": name, "config": cfg}
    errors = {}

    def attempt(field, fn):
        try:
            out[field] = fn()
        except _PASS:
            raise
        except BaseException as e:  # noqa: B036  (PanicException is a BaseException)
            out[field] = None
            errors[field] = fmt_error(e)

    try:
        g = make_graph(cfg)
    except _PASS:
        raise
    except BaseException as e:  # noqa: B036
        out["error"] = fmt_error(e)
        out["errors"] = {"construct": out["error"]}
        return out

    attempt("num_blocks", lambda: int(g.num_blocks))
    attempt("num_levels", lambda: int(g.num_levels))
    attempt("num_roots", lambda: int(g.num_roots()))

    enum = None
    try:
        enum = g.enumerate_all_dependencies()
    except _PASS:
        raise
    except BaseException as e:  # noqa: B036
        errors["blocks"] = fmt_error(e)

    if full:
        out["blocks"] = None if enum is None else [block_entry(b, ups) for b, ups in enum]
        attempt("roots", lambda: [int(b.block_id[1]) for b in g.root_gen()])
        if enum is not None:
            ds = []
            for b, _ in enum:
                try:
                    ds.append([int(b.block_id[1]), [int(d.block_id[1]) for d in g.downstream(b)]])
                except _PASS:
                    raise
                except BaseException as e:  # noqa: B036
                    ds.append([int(b.block_id[1]), None])
                    errors.setdefault("downstream", fmt_error(e))
            out["downstream"] = ds
        else:
            out["downstream"] = None
        out["subgraph"] = subgraph_queries(g, cfg, rng, n_sub, errors) if rng else []
    else:
        out["blocks_head"] = None if enum is None else [block_entry(b, ups) for b, ups in enum[:head]]
        attempt("roots_head", lambda: [int(b.block_id[1]) for b in g.root_gen()[:head]])
    del enum
    if errors:
        out["errors"] = errors
        out["error"] = next(iter(errors.values()))
    return out


def subgraph_queries(g, cfg, rng, n, errors):
    toff, tshape = cfg["total_roi"]
    nd = len(toff)
    (roff, rshape), (woff, wshape) = cfg["read_roi"], cfg["write_roi"]
    cul = [woff[d] - roff[d] for d in range(nd)]
    clr = [roff[d] + rshape[d] - woff[d] - wshape[d] for d in range(nd)]
    # total write ROI: where the blocks are
    twoff = [toff[d] + cul[d] for d in range(nd)]
    twshape = [tshape[d] - cul[d] - clr[d] for d in range(nd)]
    res = []
    kinds = ["inside", "overlap", "overlap", "disjoint", "random"]
    rng.shuffle(kinds)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        edge_axis = rng.randrange(nd)
        off, shape = [], []
        for d in range(nd):
            if kind in ("inside", "overlap"):
                b, s = twoff[d], max(twshape[d], 0)
            else:
                b, s = toff[d], max(tshape[d], 0)
            if kind == "inside" or (kind == "overlap" and d != edge_axis):
                o = b + rng.randint(0, max(s - 1, 0))
                sh = rng.randint(1, max(1, b + s - o))
            elif kind == "overlap":
                o = b + rng.randint(-8, max(s, 0) + 2)
                sh = rng.randint(1, max(2, s // 2 + 8))
            elif kind == "disjoint":
                o = b + rng.randint(-8, max(s, 0) + 2)
                sh = rng.randint(0, max(2, s // 2 + 4))
            else:
                o = b + rng.randint(-6, max(s, 0) + 6)
                sh = rng.randint(0, max(1, s + 4))
            off.append(o)
            shape.append(sh)
        if kind == "disjoint":
            # push one axis fully outside the total ROI (before or after)
            d = rng.randrange(nd)
            if rng.random() < 0.5:
                off[d] = toff[d] - shape[d] - rng.randint(0, 6)
            else:
                off[d] = toff[d] + max(tshape[d], 0) + rng.randint(0, 6)
        flag = rng.random() < 0.5
        entry = {"roi": jroi(off, shape), "read_roi": flag}
        try:
            entry["ids"] = [int(b.block_id[1]) for b in g.get_subgraph_blocks(R(off, shape), read_roi=flag)]
        except _PASS:
            raise
        except BaseException as e:  # noqa: B036
            entry["ids"] = None
            entry["error"] = fmt_error(e)
            errors.setdefault("subgraph", entry["error"])
        res.append(entry)
    return res


def random_config(rng):
    nd = rng.choices([1, 2, 3, 4], weights=[3, 4, 3, 1])[0]
    maxws = 4 if nd == 4 else 6
    ws = [rng.randint(1, maxws) for _ in range(nd)]
    mode = rng.random()
    cul, clr = [], []
    for d in range(nd):
        if mode < 0.25:
            c0 = c1 = 0
        elif mode < 0.45:
            c0 = c1 = rng.randint(0, ws[d] + 2)  # symmetric, sometimes >= ws
        else:
            c0 = rng.randint(0, ws[d] + 3)  # asymmetric
            c1 = rng.randint(0, ws[d] + 3)
        cul.append(c0)
        clr.append(c1)
    roff = [rng.randint(-15, 15) for _ in range(nd)]
    woff = [roff[d] + cul[d] for d in range(nd)]
    rshape = [cul[d] + ws[d] + clr[d] for d in range(nd)]
    toff = [rng.randint(-30, 30) for _ in range(nd)]

    kmax = {1: 80, 2: 20, 3: 8, 4: 4}[nd]
    if nd == 1 and rng.random() < 0.2:
        kmax = 500
    tkind = rng.random()
    tshape = []
    for d in range(nd):
        ctx = cul[d] + clr[d]
        if tkind < 0.08 and d == 0:
            tw = rng.randint(0, ws[d] - 1) if ws[d] > 1 else 0  # TW smaller than a block
        elif tkind < 0.13 and d == 0:
            tw = -rng.randint(1, ctx) if ctx > 0 else 0  # total smaller than the context
        else:
            k = rng.randint(1, kmax)
            tw = k * ws[d] + (rng.randint(0, ws[d] - 1) if rng.random() < 0.6 else 0)
        tshape.append(ctx + tw)
    return {
        "total_roi": jroi(toff, tshape),
        "read_roi": jroi(roff, rshape),
        "write_roi": jroi(woff, ws),
        "read_write_conflict": rng.random() < 0.65,
        "fit": rng.choice(FITS),
    }


def cfg(total, read, write, conflict, fit):
    return {
        "total_roi": jroi(*total),
        "read_roi": jroi(*read),
        "write_roi": jroi(*write),
        "read_write_conflict": conflict,
        "fit": fit,
    }


def worked_examples(rng):
    out = []
    for fit in FITS:
        out.append(record_case("core-3.6-%s" % fit, cfg(((0,), (65,)), ((0,), (20,)), ((5,), (10,)), True, fit), rng))
    out.append(
        record_case("core-3.10-2d", cfg(((0, 0), (40, 30)), ((0, 0), (20, 20)), ((5, 5), (10, 10)), True, "valid"), rng)
    )
    out.append(
        record_case(
            "core-3.10-3d-30",
            cfg(((0,) * 3, (30,) * 3), ((0,) * 3, (20,) * 3), ((5,) * 3, (10,) * 3), True, "valid"),
            rng,
        )
    )
    out.append(
        record_case(
            "core-3.10-3d-50",
            cfg(((0,) * 3, (50,) * 3), ((0,) * 3, (20,) * 3), ((5,) * 3, (10,) * 3), True, "valid"),
            rng,
        )
    )
    # CORE.md 2.2: cul = ws gives ids 1..n; 4 (task B of the 2-task example)
    out.append(record_case("core-4-taskB", cfg(((0,), (100,)), ((0,), (30,)), ((10,), (10,)), True, "valid"), rng))
    return out


def big_configs():
    specs = [
        ("bench-1M-no-conflict", 1000, 10, 0, False),
        ("bench-1M-conflict", 1000, 10, 2, True),
        ("bench-125K-small", 200, 4, 0, False),
        ("bench-1M-small-context", 500, 5, 1, True),
    ]
    out = []
    for name, total, b, c, conflict in specs:
        t0 = time.time()
        c3 = cfg(((0,) * 3, (total,) * 3), ((0,) * 3, (b + 2 * c,) * 3), ((c,) * 3, (b,) * 3), conflict, "valid")
        out.append(record_case(name, c3, full=False, head=50))
        print("  %s: %d blocks, %.1fs" % (name, out[-1]["num_blocks"], time.time() - t0), file=sys.stderr)
    return out


def block_id_cases(rng, n):
    out = []
    for i in range(n):
        nd = rng.choices([1, 2, 3, 4], weights=[2, 3, 3, 2])[0]
        toff = [rng.randint(-50, 50) for _ in range(nd)]
        tshape = [rng.randint(1, 200) for _ in range(nd)]
        ws = [rng.randint(1, 6) for _ in range(nd)]
        big = i % 20 == 19
        woff = []
        for d in range(nd):
            if big:
                # large grid index, kept so that the id stays below 2**63
                lim = {1: 10**12, 2: 10**6, 3: 10**4, 4: 2000}[nd]
                woff.append(toff[d] + rng.randint(0, lim) * ws[d] + rng.randint(0, ws[d] - 1))
            else:
                woff.append(toff[d] + rng.randint(-3 * ws[d], 20 * ws[d]))  # may start before total
        cul = [rng.randint(0, 4) for _ in range(nd)]
        clr = [rng.randint(0, 4) for _ in range(nd)]
        roff = [woff[d] - cul[d] for d in range(nd)]
        rshape = [cul[d] + ws[d] + clr[d] for d in range(nd)]
        entry = {"total_roi": jroi(toff, tshape), "read_roi": jroi(roff, rshape), "write_roi": jroi(woff, ws)}
        try:
            blk = daisy.Block(R(toff, tshape), R(roff, rshape), R(woff, ws))
            entry["spatial_id"] = int(blk.block_id[1])
        except _PASS:
            raise
        except BaseException as e:  # noqa: B036
            entry["spatial_id"] = None
            entry["error"] = fmt_error(e)
        out.append(entry)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--n-block-ids", type=int, default=200)
    ap.add_argument("--no-big", action="store_true", help="skip the 1M-block benchmark configs (fast dry runs)")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "data", "graph_golden.json.gz"))
    args = ap.parse_args(argv)

    assert daisy.__version__ == "2.0.0", daisy.__version__
    rng = random.Random(args.seed)
    cases = worked_examples(rng)
    i = 0
    while i < args.n:
        c = random_config(rng)
        try:
            if make_graph(c).num_blocks > 650:
                continue
        except _PASS:
            raise
        except BaseException:  # noqa: B036  - keep: recorded as an error case
            pass
        cases.append(record_case("rand-%04d" % i, c, rng))
        i += 1
    big = [] if args.no_big else big_configs()
    data = {
        "meta": {
            "generator": "tests/golden/gen_graph_golden.py",
            "daisy_version": daisy.__version__,
            "seed": args.seed,
            "n_random": args.n,
        },
        "cases": cases,
        "big": big,
        "block_ids": block_id_cases(rng, args.n_block_ids),
    }
    out = os.path.normpath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    raw = json.dumps(data, separators=(",", ":"), sort_keys=False).encode()
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as f:
        f.write(raw)
    n_err = sum(1 for c in cases if "error" in c)
    print(
        "wrote %s: %d cases (%d with errors), %d big, %d block_ids, %.2f MB"
        % (out, len(cases), n_err, len(big), len(data["block_ids"]), os.path.getsize(out) / 1e6),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
