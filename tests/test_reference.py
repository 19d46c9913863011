"""Tests of the pure-Python reference twins themselves.

Two kinds: the worked examples of ``/work/shared/spec/CORE.md`` (each test
names its section), and hypothesis properties of the twins (counts, unique
IDs, upstream/downstream are inverse relations, level order, scheduler runs
terminate with counters that add up). Agreement with daisy 2.0.0 itself was
checked separately, by hand, in a virtualenv with the published wheel; this
file does not import daisy.
"""

from __future__ import annotations

import random
from itertools import product

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from .reference import RefGraph, RefPipeline, RefScheduler, block_spatial_id, cantor
    from .strategies import graph_configs, pipeline_configs, ref_graph
except ImportError:
    from reference import RefGraph, RefPipeline, RefScheduler, block_spatial_id, cantor
    from strategies import graph_configs, pipeline_configs, ref_graph

# max_examples comes from the active hypothesis profile (default 100), so a larger CI profile scales these.
PROPS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ids(blocks):
    return [b.spatial_id for b in blocks]


def bench_graph(total, block, c, conflict):
    """The benchmark configs of CORE 3.11: TR = 0 + total, BR = 0 + (b + 2c), BW = c + b, valid."""
    return RefGraph(
        ((0,) * 3, (total,) * 3), ((0,) * 3, (block + 2 * c,) * 3), ((c,) * 3, (block,) * 3), conflict, "valid"
    )


def build_pipeline(config):
    tasks = {tid: ref_graph(c) for tid, c in config["tasks"].items()}
    return RefPipeline(tasks, config["edges"])


# ---------------------------------------------------------------------------
# CORE 2.2: block IDs
# ---------------------------------------------------------------------------

CANTOR_2D = [[0, 1, 3, 6], [2, 4, 7, 11], [5, 8, 12, 17], [9, 13, 18, 24]]


def test_cantor_2d_table():
    """CORE 2.2 worked 2-D table (rows x0, columns x1)."""
    for x0, x1 in product(range(4), range(4)):
        assert cantor((x0, x1)) == CANTOR_2D[x0][x1]


def test_block_spatial_id_2d_table():
    """CORE 2.2: ``Block(Roi((0,0),(40,40)), W, W)`` with 10x10 blocks gives the same table."""
    total = ((0, 0), (40, 40))
    for x0, x1 in product(range(4), range(4)):
        write = ((10 * x0, 10 * x1), (10, 10))
        assert block_spatial_id(total, write) == CANTOR_2D[x0][x1]


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        ((0, 0, 1), 1),
        ((0, 1, 0), 2),
        ((1, 0, 0), 3),
        ((0, 2, 0), 7),
        ((1, 1, 1), 14),
        ((2, 0, 1), 15),
        ((3, 2, 1), 74),
        ((1, 2, 3), 63),
    ],
)
def test_cantor_3d_examples(index, expected):
    """CORE 2.2 worked 3-D examples."""
    assert cantor(index) == expected


def test_cantor_closed_forms_and_exactness():
    """CORE 2.2 closed forms (2-D, 3-D) and exact integers beyond 2**53 (v1's float rounding is not copied)."""
    for x in product(range(7), repeat=2):
        s = x[0] + x[1]
        assert cantor(x) == s * (s + 1) // 2 + x[0]
    for x in product(range(6), repeat=3):
        s3, s2 = sum(x), x[0] + x[1]
        assert cantor(x) == s3 * (s3 + 1) * (s3 + 2) // 6 + s2 * (s2 + 1) // 2 + x[0]
    assert cantor((7,)) == 7
    s = 134217728 + 5
    assert cantor((134217728, 5)) == s * (s + 1) // 2 + 134217728
    # daisy 2.0.0 gives ...239 (exact); float arithmetic rounds to ...240. CORE 2.2 states the two
    # the other way round ("...239 in v1 versus ...240 exact"); the exact value is ...239.
    assert cantor((134217728, 5)) == 9007200127156239


def test_cantor_is_injective_small():
    """Cantor numbering is a bijection from N^n onto N: the first C(k+n-1, n) IDs are the tuples with sum < k."""
    for n in (1, 2, 3, 4):
        k = 6
        values = sorted(cantor(x) for x in product(range(k), repeat=n) if sum(x) < k)
        assert values == list(range(len(values)))


def test_block_id_negative_components_clamped():
    """CORE 2.2 step 2 / 8.1: ``Block(TR@(100,200), W@(85,215))`` gives 1 in daisy 2 (clamp to 0)."""
    assert block_spatial_id(((100, 200), (50, 50)), ((85, 215), (10, 10))) == 1


def test_block_id_origin_is_total_read_roi():
    """CORE 2.2 / 4: with ``cul = ws`` IDs start at 1 (B of the section-4 example has IDs 1..8)."""
    g = RefGraph(((0,), (100,)), ((0,), (30,)), ((10,), (10,)), False, "valid")
    assert ids(g.blocks()) == list(range(1, 9))


# ---------------------------------------------------------------------------
# CORE 3: one task
# ---------------------------------------------------------------------------


def graph_1d(fit):
    """CORE 3.6 example: TR = [0,65), BR = [0,20), BW = [5,15), conflict."""
    return RefGraph(((0,), (65,)), ((0,), (20,)), ((5,), (10,)), True, fit)


def test_level_offsets_examples():
    """CORE 3.3: 1-D s=20, ws=10 -> [10, 0]; 2-D s=(20,20) -> [(10,10),(10,0),(0,10),(0,0)]."""
    assert graph_1d("valid").level_offsets == [(10,), (0,)]
    g = RefGraph(((0, 0), (40, 30)), ((0, 0), (20, 20)), ((5, 5), (10, 10)), True, "valid")
    assert g.stride == (20, 20)
    assert g.level_offsets == [(10, 10), (10, 0), (0, 10), (0, 0)]
    assert g.level_conflicts[0] == []
    assert g.level_conflicts[1] == [(0, -10), (0, 10)]
    assert g.level_conflicts[2] == [(-10, -10), (-10, 10), (10, -10), (10, 10)]


def test_fit_example_1d():
    """CORE 3.6: valid 5 blocks ``1,3 | 0,2,4``; overhang adds ID 5 W[55,65) R[50,70); shrink clips it."""
    g = graph_1d("valid")
    assert g.total_write_roi == ((5,), (55,))
    assert ids(g.level_blocks(0)) == [1, 3]
    assert ids(g.level_blocks(1)) == [0, 2, 4]
    assert g.num_blocks == 5

    g = graph_1d("overhang")
    assert g.num_blocks == 6 and sorted(ids(g.blocks())) == [0, 1, 2, 3, 4, 5]
    b5 = g.block_by_id(5)
    assert b5.write == ((55,), (10,)) and b5.read == ((50,), (20,))

    g = graph_1d("shrink")
    assert g.num_blocks == 6
    b5 = g.block_by_id(5)
    assert b5.write == ((55,), (5,)) and b5.read == ((50,), (15,))


def test_upstream_downstream_example_1d():
    """CORE 3.8: upstream(0)=[1], upstream(2)=[1,3], upstream(4)=[3]; downstream(1)=[2,0], downstream(3)=[4,2]."""
    g = graph_1d("valid")
    up = {b.spatial_id: ids(g.upstream(b)) for b in g.blocks()}
    down = {b.spatial_id: ids(g.downstream(b)) for b in g.blocks()}
    assert up == {1: [], 3: [], 0: [1], 2: [1, 3], 4: [3]}
    assert down == {1: [2, 0], 3: [4, 2], 0: [], 2: [], 4: []}
    assert g.block_by_id(1).write == ((15,), (10,))
    assert g.block_by_id(3).write == ((35,), (10,))


def test_worked_example_2d():
    """CORE 3.10 2-D: (ID, write begin, upstream) per level."""
    g = RefGraph(((0, 0), (40, 30)), ((0, 0), (20, 20)), ((5, 5), (10, 10)), True, "valid")
    assert g.total_write_roi == ((5, 5), (30, 20))
    assert g.num_levels == 4
    got = [[(b.spatial_id, b.write[0], ids(g.upstream(b))) for b in g.level_blocks(i)] for i in range(4)]
    assert got == [
        [(4, (15, 15), [])],
        [(2, (15, 5), [4])],
        [(1, (5, 15), [2]), (8, (25, 15), [2])],
        [(0, (5, 5), [1]), (5, (25, 5), [8])],
    ]
    assert [b.level for b in g.blocks()] == [0, 1, 2, 2, 3, 3]


def test_worked_example_3d():
    """CORE 3.10 3-D: 8 levels of one block, order 14, 8, 6, 3, 5, 2, 1, 0, each depending on the previous."""
    g = RefGraph(((0,) * 3, (30,) * 3), ((0,) * 3, (20,) * 3), ((5,) * 3, (10,) * 3), True, "valid")
    blocks = g.blocks()
    assert ids(blocks) == [14, 8, 6, 3, 5, 2, 1, 0]
    assert [b.write[0] for b in blocks] == [
        (15, 15, 15),
        (15, 15, 5),
        (15, 5, 15),
        (15, 5, 5),
        (5, 15, 15),
        (5, 15, 5),
        (5, 5, 15),
        (5, 5, 5),
    ]
    assert [ids(g.upstream(b)) for b in blocks] == [[]] + [[b.spatial_id] for b in blocks[:-1]]
    assert [ids(g.downstream(b)) for b in blocks] == [[b.spatial_id] for b in blocks[1:]] + [[]]


def test_worked_example_3d_50():
    """CORE 3.10: TR = 50^3 gives 64 blocks, 8 levels, 8 roots, order 14, 39, 46, 95, 48, 97, 108, 189, 8, 24, ..."""
    g = RefGraph(((0,) * 3, (50,) * 3), ((0,) * 3, (20,) * 3), ((5,) * 3, (10,) * 3), True, "valid")
    assert (g.num_blocks, g.num_levels, g.num_roots) == (64, 8, 8)
    assert ids(g.blocks())[:10] == [14, 39, 46, 95, 48, 97, 108, 189, 8, 24]
    assert len(g.blocks()) == 64


@pytest.mark.parametrize(
    ("total", "block", "c", "conflict", "expected"),
    [
        (1000, 10, 0, False, (1_000_000, 1, 1_000_000)),
        (1000, 10, 2, True, (970_299, 8, 117_649)),
        (200, 4, 0, False, (125_000, 1, 125_000)),
        (500, 5, 1, True, (970_299, 8, 117_649)),
    ],
)
def test_benchmark_counts(total, block, c, conflict, expected):
    """CORE 3.11: analytic counts of the four benchmark configs (not enumerated)."""
    g = bench_graph(total, block, c, conflict)
    assert (g.num_blocks, g.num_levels, g.num_roots) == expected


def test_benchmark_level_counts():
    """CORE 3.11: with c = 2, level 0 has 49^3 blocks and the levels add up to (49 + 50)^3."""
    g = bench_graph(1000, 10, 2, True)
    assert g.stride == (20, 20, 20)
    assert g.grid_shape == (99, 99, 99)
    counts = [g.num_level_blocks(i) for i in range(g.num_levels)]
    assert counts[0] == 49**3 and counts[-1] == 50**3 and sum(counts) == 99**3


@pytest.mark.parametrize(
    ("total", "fit", "conflict", "levels", "blocks"),
    [
        (((0,), (15,)), "valid", True, 0, 0),  # TW = [5,10) smaller than one block
        (((0,), (15,)), "valid", False, 1, 0),
        (((0,), (15,)), "overhang", True, 1, 1),
        (((0,), (8,)), "valid", True, 0, 0),  # total smaller than the context
        (((0,), (8,)), "overhang", False, 1, 0),
        (((0,), (-5,)), "shrink", True, 0, 0),  # negative total shape
    ],
)
def test_edge_cases_section_9(total, fit, conflict, levels, blocks):
    """CORE 9: zero-level and zero-block graphs fall out of the formulas."""
    g = RefGraph(total, ((0,), (20,)), ((5,), (10,)), conflict, fit)
    assert (g.num_levels, g.num_blocks, len(g.blocks())) == (levels, blocks, blocks)
    if blocks == 0:
        assert g.subgraph(total) == [] and g.grid_shape == (0,)


def test_subgraph_never_failing_intersection():
    """CORE 3.9 with daisy 2's intersection: an empty query off the grid still returns the cell containing it."""
    g = graph_1d("valid")
    assert ids(g.subgraph(((16,), (0,)))) == [1]
    assert ids(g.subgraph(((15,), (0,)))) == []
    assert ids(g.subgraph(((100,), (10,)))) == []
    assert ids(g.subgraph(((0,), (100,)))) == [0, 1, 2, 3, 4]
    # read_roi=True grows by this graph's (cul, clr) = (5, 5): [20,21) -> [15,26) meets cells 1 and 2.
    assert ids(g.subgraph(((20,), (1,)), read_roi=True)) == [1, 2]


# ---------------------------------------------------------------------------
# CORE 4: pipeline
# ---------------------------------------------------------------------------


def section4_pipeline():
    """CORE 4 worked example: A TR=[0,100) r=w=10; B TR=[0,100), BR=[0,30), BW=[10,20); no conflict."""
    a = RefGraph(((0,), (100,)), ((0,), (10,)), ((0,), (10,)), False, "valid")
    b = RefGraph(((0,), (100,)), ((0,), (30,)), ((10,), (10,)), False, "valid")
    return RefPipeline({"A": a, "B": b}, [("A", "B"), ("A", "B")])


def test_pipeline_example_section4():
    """CORE 4: upstream(B/4 @W[40,50)) = A 3,4,5; downstream(A/4) = B 3,4,5; duplicate edges collapse."""
    p = section4_pipeline()
    assert p.edges == [("A", "B")]
    b4 = p.block("B", 4)
    assert b4.write == ((40,), (10,))
    assert [(t, b.spatial_id) for t, b in p.upstream("B", b4)] == [("A", 3), ("A", 4), ("A", 5)]
    assert [(t, b.spatial_id) for t, b in p.downstream("A", p.block("A", 4))] == [("B", 3), ("B", 4), ("B", 5)]
    assert p.task_order == ["A", "B"]


def test_release_order_section4():
    """CORE 4: the 2-task driver releases ``A0 A1 A2 A3 B1 A4 B2 A5 A6 B3 A7 A8 B4 A9 B5 B6 B7 B8``."""
    s = RefScheduler(section4_pipeline(), {"A": 2, "B": 2})
    released, in_flight = [], []
    while True:
        for t in "AB":
            sid = s.acquire_block(t)
            if sid is not None:
                in_flight.append((t, sid))
        if not in_flight:
            break
        t, sid = in_flight.pop(0)
        s.release_block(t, sid, True)
        released.append(f"{t}{sid}")
    assert " ".join(released) == "A0 A1 A2 A3 B1 A4 B2 A5 A6 B3 A7 A8 B4 A9 B5 B6 B7 B8"
    assert s.is_done()
    assert s.states()["B"] == {
        "total": 8,
        "ready": 0,
        "processing": 0,
        "completed": 8,
        "skipped": 0,
        "failed": 0,
        "orphaned": 0,
        "pending": 0,
        "is_done": True,
    }


def test_asymmetric_context_downstream_fixed():
    """CORE 10.1 reproduction: A TR=[0,60) r=w=10; B BR=[0,20), BW=[0,10). daisy hangs; the twin completes B."""
    a = RefGraph(((0,), (60,)), ((0,), (10,)), ((0,), (10,)), False, "valid")
    b = RefGraph(((0,), (60,)), ((0,), (20,)), ((0,), (10,)), False, "valid")
    p = RefPipeline({"A": a, "B": b}, [("A", "B")])
    # daisy grows A/3's write ROI [30,40) by B's (cul, clr) = (0, 10) and finds B 3, 4; but B/2 reads
    # [20,40) and B/4 reads [40,60): the correct growth is (clr, cul) = (10, 0).
    assert ids(b.subgraph(p.block("A", 3).write, read_roi=True)) == [3, 4]
    assert [x.spatial_id for _, x in p.downstream("A", p.block("A", 3))] == [2, 3]
    s = RefScheduler(p, {"A": 0, "B": 0})
    run_serial(s, random.Random(0), fail_prob=0.0)
    assert s.states()["B"]["completed"] == 5


# ---------------------------------------------------------------------------
# CORE 6: scheduler
# ---------------------------------------------------------------------------


def graph_2d_16():
    """The 16-block 2-D conflict example of CORE 6.4/6.5: TR = 50^2, BR = 20^2, BW = 5 + 10^2."""
    return RefGraph(((0, 0), (50, 50)), ((0, 0), (20, 20)), ((5, 5), (10, 10)), True, "valid")


def test_scheduler_order_section_6_5():
    """CORE 6.5: acquire/release one at a time gives ``4, 11, 13, 24, 2, 7, 9, 18, 1, 6, 8, 17, 0, 3, 5, 12``."""
    s = RefScheduler(RefPipeline({"t": graph_2d_16()}, []), {"t": 2})
    order = []
    while (sid := s.acquire_block("t")) is not None:
        order.append(sid)
        s.release_block("t", sid, True)
    assert order == [4, 11, 13, 24, 2, 7, 9, 18, 1, 6, 8, 17, 0, 3, 5, 12]
    assert s.is_done()


def test_scheduler_retries_and_orphans_section_6_4():
    """CORE 6.4: max_retries=1 tries a failing block twice; failing block 4 orphans its 10 transitive downstream blocks."""
    s = RefScheduler(RefPipeline({"t": graph_2d_16()}, []), {"t": 1})
    attempts = 0
    while (sid := s.acquire_block("t")) is not None:
        if sid == 4:
            attempts += 1
        s.release_block("t", sid, sid != 4)
    st_ = s.states()["t"]
    assert attempts == 2
    assert (st_["failed"], st_["orphaned"], st_["completed"]) == (1, 10, 5)
    assert st_["is_done"] and st_["pending"] == 0


def test_scheduler_skip_counts_as_completed():
    """CORE 6.3: a precheck skip is counted as skipped and completed, and unlocks its downstream blocks."""
    s = RefScheduler(RefPipeline({"t": graph_2d_16()}, []), {"t": 0}, skip={"t": {4, 11, 13, 24}})
    first = s.acquire_block("t")
    assert first == 2  # the four roots were skipped; 2 was unlocked by 4 first
    st_ = s.states()["t"]
    assert (st_["skipped"], st_["completed"], st_["processing"], st_["ready"]) == (4, 4, 1, 3)


def test_roots_of_downstream_task_without_upstream_run():
    """CORE 10.3 fixed: a downstream block that reads nothing upstream is a root and runs."""
    a = RefGraph(((0,), (100,)), ((0,), (10,)), ((0,), (10,)), False, "valid")
    b = RefGraph(((0,), (110,)), ((0,), (10,)), ((0,), (10,)), False, "valid")
    p = RefPipeline({"A": a, "B": b}, [("A", "B")])
    s = RefScheduler(p, {"A": 0, "B": 0})
    assert list(s.queues["B"].roots) == [10]
    assert s.acquire_block("B") == 10
    s.release_block("B", 10, True)
    run_serial(s, random.Random(1), fail_prob=0.0)
    assert s.is_done() and s.states()["B"]["completed"] == 11


# ---------------------------------------------------------------------------
# Hypothesis properties: one task
# ---------------------------------------------------------------------------


@PROPS
@given(graph_configs())
def test_prop_enumeration(config):
    """Enumerated count == analytic num_blocks == prod(grid_shape); IDs unique; per-level counts; roots = level 0."""
    g = ref_graph(config)
    blocks = g.blocks()
    assert len(blocks) == g.num_blocks
    n = 1
    for x in g.grid_shape:
        n *= x
    assert n == g.num_blocks
    assert len(set(ids(blocks))) == len(blocks)
    assert len({b.grid for b in blocks}) == len(blocks)
    for i in range(g.num_levels):
        assert len(g.level_blocks(i)) == g.num_level_blocks(i)
    assert g.root_blocks() == [b for b in blocks if b.level == 0]
    assert len(g.root_blocks()) == g.num_roots
    if g.num_levels:
        assert g.level_offsets[0] == tuple(s - w for s, w in zip(g.stride, g.ws))
        assert g.level_offsets[-1] == (0,) * g.ndim


@PROPS
@given(graph_configs())
def test_prop_block_geometry(config):
    """Every block: ID from its grid index (CORE 2.2), level_of, block_at_grid, fit rules (CORE 3.6)."""
    g = ref_graph(config)
    tr, tw = g.total_roi, g.total_write_roi
    shift = tuple(c // w for c, w in zip(g.cul, g.ws))
    for b in g.blocks():
        assert g.level_of(b) == b.level
        assert g.block_at_grid(b.grid) == b
        assert b.spatial_id == cantor(tuple(k + s for k, s in zip(b.grid, shift)))
        wb = tuple(t + k * w for t, k, w in zip(tw[0], b.grid, g.ws))
        rb = tuple(t + k * w for t, k, w in zip(tr[0], b.grid, g.ws))
        assert b.write[0] == wb and b.read[0] == rb
        tw_end = tuple(o + s for o, s in zip(*tw))
        w_end = tuple(o + s for o, s in zip(*b.write))
        if g.fit == "valid":
            assert b.write[1] == g.ws and all(e <= te for e, te in zip(w_end, tw_end))
        elif g.fit == "overhang":
            assert b.write[1] == g.ws and b.read[1] == g.read_shape
        else:
            assert all(e == min(te, wb_ + w) for e, te, wb_, w in zip(w_end, tw_end, wb, g.ws))
    for grid in product(*[range(-1, n + 1) for n in g.grid_shape]):
        inside = all(0 <= x < n for x, n in zip(grid, g.grid_shape))
        assert (g.block_at_grid(grid) is not None) == inside


@PROPS
@given(graph_configs())
def test_prop_level_order_rightmost_fastest(config):
    """Within a level, blocks are in lexicographic grid order (rightmost axis fastest); levels come in order."""
    g = ref_graph(config)
    blocks = g.blocks()
    assert [b.level for b in blocks] == sorted(b.level for b in blocks)
    for i in range(g.num_levels):
        grids = [b.grid for b in g.level_blocks(i)]
        assert grids == sorted(grids)


@PROPS
@given(graph_configs())
def test_prop_intra_task_inverse(config):
    """Intra-task downstream is the exact inverse of upstream; level > 0 blocks have upstream blocks in the previous level."""
    g = ref_graph(config)
    blocks = g.blocks()
    up = {(u.spatial_id, b.spatial_id) for b in blocks for u in g.upstream(b)}
    down = {(b.spatial_id, d.spatial_id) for b in blocks for d in g.downstream(b)}
    assert up == down
    for b in blocks:
        ups = g.upstream(b)
        assert len(set(ids(ups))) == len(ups)
        if b.level > 0:
            assert ups, b
            assert all(u.level == b.level - 1 for u in ups)
        else:
            assert ups == []
        if not g.read_write_conflict:
            assert ups == [] and g.downstream(b) == []


@PROPS
@given(graph_configs(), st.data())
def test_prop_subgraph_matches_bruteforce(config, data):
    """CORE 3.9 step 7: for a non-empty query, the blocks whose unshrunk write cell meets ``sub ∩ TW``, in grid order."""
    g = ref_graph(config)
    tr = g.total_roi
    off = tuple(data.draw(st.integers(o - 10, o + max(s, 0) + 10)) for o, s in zip(*tr))
    shape = tuple(data.draw(st.integers(1, 20)) for _ in tr[0])
    grow = data.draw(st.booleans())
    sub = (off, shape)
    got = g.subgraph(sub, read_roi=grow)
    q = sub
    if grow:
        q = (tuple(o - c for o, c in zip(off, g.cul)), tuple(s + a + b for s, a, b in zip(shape, g.cul, g.clr)))
    tw = g.total_write_roi
    qb = tuple(max(a, b) for a, b in zip(q[0], tw[0]))
    qe = tuple(min(a + s, b + t) for a, s, b, t in zip(q[0], q[1], tw[0], tw[1]))
    if all(b < e for b, e in zip(qb, qe)):
        expected = []
        for b in g.blocks():
            wb = b.write[0]
            if all(w < e and w + s > bb for w, s, e, bb in zip(wb, g.ws, qe, qb)):
                expected.append(b)
        assert sorted(got, key=lambda b: b.grid) == sorted(expected, key=lambda b: b.grid)
        assert [b.grid for b in got] == sorted(b.grid for b in got)
    for b in got:
        assert g.block_by_id(b.spatial_id) == b


# ---------------------------------------------------------------------------
# Hypothesis properties: pipelines and the scheduler
# ---------------------------------------------------------------------------


@PROPS
@given(pipeline_configs())
def test_prop_pipeline_inverse(config):
    """Pipeline downstream is the exact inverse of upstream (intra and inter task), both sorted by spatial ID."""
    p = build_pipeline(config)
    up, down = set(), set()
    for t, b in p.blocks():
        ups = p.upstream(t, b)
        downs = p.downstream(t, b)
        assert [x.spatial_id for _, x in ups] == sorted(x.spatial_id for _, x in ups)
        assert [x.spatial_id for _, x in downs] == sorted(x.spatial_id for _, x in downs)
        assert len({(u, x.spatial_id) for u, x in ups}) == len(ups)
        up |= {((u, x.spatial_id), (t, b.spatial_id)) for u, x in ups}
        down |= {((t, b.spatial_id), (d, x.spatial_id)) for d, x in downs}
        # intra-task part is the graph's own relation
        assert [x for u, x in ups if u == t] == sorted(p.tasks[t].upstream(b), key=lambda x: x.spatial_id)
        assert sorted(ids(x for d, x in downs if d == t)) == sorted(ids(p.tasks[t].downstream(b)))
        for u, x in ups:
            assert u == t or u in p.upstream_tasks(t)
            assert p.block(u, x.spatial_id) == x
    assert up == down


def run_serial(s, rng, fail_prob):
    """Drive a RefScheduler with a random driver and return its ``(event, task, id)`` list.

    Each step either acquires from a random task or releases a random in-flight
    block (failing it with probability ``fail_prob``); when nothing is in
    flight, every task is asked once and the run ends if none has a block.
    The counters are checked after every step.
    """
    events = []
    in_flight = []
    tasks = list(s.pipeline.task_order)
    for _ in range(100_000):
        if not in_flight or rng.random() < 0.5:
            asked = [rng.choice(tasks)] if in_flight else tasks
            got = [(t, s.acquire_block(t)) for t in asked]
            got = [(t, x) for t, x in got if x is not None]
            if not got and not in_flight:
                return events
            in_flight.extend(got)
            events.extend(("acquire", t, x) for t, x in got)
        else:
            t, sid = in_flight.pop(rng.randrange(len(in_flight)))
            ok = rng.random() >= fail_prob
            s.release_block(t, sid, ok)
            events.append(("release" if ok else "fail", t, sid))
        check_counters(s)
    raise AssertionError("scheduler did not terminate")


def check_counters(s):
    for t, c in s.states().items():
        assert min(c[k] for k in ("ready", "processing", "completed", "skipped", "failed", "orphaned", "pending")) >= 0
        assert c["skipped"] <= c["completed"]
        assert c["ready"] + c["processing"] + c["completed"] + c["failed"] + c["orphaned"] + c["pending"] == c["total"]
        assert c["ready"] == len(s.queues[t].roots) + len(s.queues[t].ready)
        assert c["processing"] == len(s.queues[t].processing)


@PROPS
@given(pipeline_configs(), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.1, 0.3]), st.booleans())
def test_prop_scheduler_terminates(config, seed, fail_prob, with_skips):
    """Random drivers always terminate with every task done and counters that add up (CORE 6.6, fixed 10.2/10.3)."""
    p = build_pipeline(config)
    rng = random.Random(seed)
    skip = None
    if with_skips:
        skip = {t: {b.spatial_id for b in g.blocks() if rng.random() < 0.3} for t, g in p.tasks.items()}
    max_retries = {t: c["max_retries"] for t, c in config["tasks"].items()}
    s = RefScheduler(p, max_retries, skip)
    # roots: exactly the blocks without upstream; level 0 for source tasks
    for t in p.source_tasks():
        assert list(s.queues[t].roots) == ids(p.tasks[t].root_blocks())
    events = run_serial(s, rng, fail_prob)
    assert s.is_done()
    states = s.states()
    for t, c in states.items():
        assert c["ready"] == c["processing"] == c["pending"] == 0
        assert c["completed"] + c["failed"] + c["orphaned"] == c["total"]
    # every block ran (or was skipped) at most max_retries + 1 times, and only after its upstream succeeded
    skipped_ok = {(t, sid) for t, ids_ in (skip or {}).items() for sid in ids_ if s.status.get((t, sid)) == "success"}
    done = set(skipped_ok)
    attempts: dict = {}
    for ev, t, sid in events:
        if ev == "acquire":
            attempts[(t, sid)] = attempts.get((t, sid), 0) + 1
            assert attempts[(t, sid)] <= max_retries[t] + 1
            assert all((u, x.spatial_id) in done for u, x in p.upstream(t, p.block(t, sid)))
        elif ev == "release":
            done.add((t, sid))
    if fail_prob == 0.0:
        assert all(c["completed"] == c["total"] for c in states.values())
    # orphans are exactly the not-succeeded descendants of failed blocks
    failed = {k for k, v in s.status.items() if v == "failed"}
    reach = set()
    todo = [k for k in failed]
    while todo:
        t, sid = todo.pop()
        for d, x in p.downstream(t, p.block(t, sid)):
            if (d, x.spatial_id) not in reach:
                reach.add((d, x.spatial_id))
                todo.append((d, x.spatial_id))
    assert {k for k, v in s.status.items() if v == "orphaned"} == reach - failed


@pytest.mark.slow
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(graph_configs(max_blocks=600))
def test_prop_single_task_scheduler_full_run(config):
    """A whole single-task run with no failures completes every block in a dependency-respecting order."""
    g = ref_graph(config)
    s = RefScheduler(RefPipeline({"t": g}, []), {"t": 0})
    order = []
    while (sid := s.acquire_block("t")) is not None:
        order.append(sid)
        s.release_block("t", sid, True)
    assert sorted(order) == sorted(ids(g.blocks()))
    pos = {sid: i for i, sid in enumerate(order)}
    for b in g.blocks():
        assert all(pos[u.spatial_id] < pos[b.spatial_id] for u in g.upstream(b))
    assert s.is_done()
