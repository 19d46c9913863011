"""``daisy_nb.Block`` and ``BlockStatus`` (CORE.md 2): IDs, identity, status, pickling, ROIs, repr."""

from __future__ import annotations

import pickle
from itertools import product

import pytest
from funlib.geometry import Roi as FunlibRoi
from hypothesis import given
from hypothesis import strategies as st

import daisy_nb
from daisy_nb import Block, BlockStatus, BlockwiseDependencyGraph, Roi
from daisy_nb.block import cantor_number, cantor_of_ints

try:
    from .reference import block_spatial_id, cantor
except ImportError:
    from reference import block_spatial_id, cantor

TOTAL = Roi((0, 0), (40, 40))
READ = Roi((10, 10), (20, 20))
WRITE = Roi((15, 15), (10, 10))


def test_geometry_is_funlib():
    assert daisy_nb.Roi is FunlibRoi
    assert Roi is FunlibRoi


def test_block_id_is_task_and_spatial_id():
    b = Block(TOTAL, READ, WRITE, task_id="t")
    assert b.block_id == ("t", 4)
    assert isinstance(b.block_id, tuple)
    assert b.task_id == "t"
    assert b.spatial_id == 4
    # a missing task id is "" (daisy 2.0), not None
    assert Block(TOTAL, READ, WRITE).block_id == ("", 4)


CANTOR_2D = [[0, 1, 3, 6], [2, 4, 7, 11], [5, 8, 12, 17], [9, 13, 18, 24]]


def test_spatial_ids_core_2_2_tables():
    """CORE 2.2 worked examples: the 2-D table (10x10 blocks in 40x40) and the 3-D values."""
    for x0, x1 in product(range(4), range(4)):
        w = Roi((10 * x0, 10 * x1), (10, 10))
        assert Block(TOTAL, w, w).spatial_id == CANTOR_2D[x0][x1]
    for x, want in [
        ((0, 0, 1), 1),
        ((0, 1, 0), 2),
        ((1, 0, 0), 3),
        ((0, 2, 0), 7),
        ((1, 1, 1), 14),
        ((2, 0, 1), 15),
        ((3, 2, 1), 74),
        ((1, 2, 3), 63),
    ]:
        w = Roi(tuple(10 * v for v in x), (10, 10, 10))
        assert Block(Roi((0, 0, 0), (100, 100, 100)), w, w).spatial_id == want
        assert cantor_number(x) == want


def test_spatial_id_uses_offset_total_own_shape_and_clamps():
    """Grid index = (write.begin - total.begin) div write.shape, negatives clamped to 0 (daisy 2.0)."""
    total = Roi((-7, 3), (100, 100))
    w = Roi((-7 + 3 * 4, 3 + 2 * 5 + 4), (4, 5))  # grid (3, 2), not on the grid in axis 1
    assert Block(total, w, w).spatial_id == cantor((3, 2))
    before = Roi((-20, 3 + 5), (4, 5))  # axis 0 before the total: clamped to 0
    assert Block(total, before, before).spatial_id == cantor((0, 1))
    assert block_spatial_id(((-7, 3), (100, 100)), ((-20, 8), (4, 5))) == cantor((0, 1))


@pytest.mark.parametrize(
    "x, exact",
    [
        ((134217728, 5), 9007200127156239),  # daisy 1.x (float) gives ...240
        ((400000, 1, 2), None),
        ((30000, 1, 2, 3), None),
        ((1000, 1000, 1000, 1000, 1000), None),
    ],
)
def test_spatial_id_exact_beyond_2_53(x, exact):
    exact = cantor(x) if exact is None else exact
    assert exact > 2**53
    one = (1,) * len(x)
    b = Block(Roi((0,) * len(x), one), Roi(x, one), Roi(x, one), task_id="t")
    assert b.block_id == ("t", exact)
    assert cantor_number(x) == exact


@given(st.lists(st.integers(0, 2**12), min_size=1, max_size=6))
def test_cantor_of_ints_matches_the_reference(x):
    """The arithmetic the plain-mode surface calls directly on its lists (no int conversion)."""
    assert cantor_of_ints(x) == cantor_number(x) == cantor(tuple(x))


def test_equality_and_hash_by_block_id():
    a = Block(TOTAL, READ, WRITE, task_id="t")
    same_id_other_rois = Block(TOTAL, Roi((11, 10), (20, 20)), Roi((16, 15), (10, 10)), task_id="t")
    assert same_id_other_rois.block_id == a.block_id
    assert a == same_id_other_rois and hash(a) == hash(same_id_other_rois)
    assert len({a, same_id_other_rois}) == 1
    other_task = Block(TOTAL, READ, WRITE, task_id="u")
    other_id = Block(TOTAL, Roi((0, 0), (20, 20)), Roi((5, 5), (10, 10)), task_id="t")
    assert a != other_task and a != other_id
    assert len({a, other_task, other_id}) == 3
    assert a != ("t", 4) and a != 4
    explicit = Block(TOTAL, READ, WRITE, block_id=99, task_id="t")
    assert explicit.block_id == ("t", 99) and explicit != a


def test_status():
    assert (BlockStatus.CREATED, BlockStatus.PROCESSING, BlockStatus.SUCCESS, BlockStatus.FAILED) == (0, 1, 2, 3)
    b = Block(TOTAL, READ, WRITE, task_id="t")
    assert b.status == BlockStatus.CREATED
    for s in (BlockStatus.PROCESSING, BlockStatus.SUCCESS, BlockStatus.FAILED, BlockStatus.CREATED):
        b.status = s
        assert b.status == s
    for bad in (7, -1, 4, "SUCCESS", None, 2.5):
        with pytest.raises(ValueError, match="invalid status"):
            b.status = bad
    assert b.status == BlockStatus.CREATED


def test_pickle_round_trip():
    b = Block(Roi((-5, 3), (40, 40)), Roi((5, 13), (20, 20)), Roi((10, 18), (10, 10)), task_id="task")
    b.status = BlockStatus.SUCCESS
    c = pickle.loads(pickle.dumps(b))
    assert c == b and c.block_id == b.block_id
    assert c.read_roi == b.read_roi and c.write_roi == b.write_roi
    assert isinstance(c.read_roi, FunlibRoi)
    assert c.status == BlockStatus.SUCCESS
    assert repr(c) == repr(b)
    # graph blocks (built lazily from tuples) too
    g = BlockwiseDependencyGraph(
        "g", Roi((0,), (20,)), Roi((5,), (10,)), True, "shrink", total_read_roi=Roi((0,), (63,))
    )
    for blk in g.blocks():
        d = pickle.loads(pickle.dumps(blk, protocol=pickle.HIGHEST_PROTOCOL))
        assert d == blk and d.read_roi == blk.read_roi and d.write_roi == blk.write_roi and d.status == blk.status


def test_rois_are_funlib_rois_equal_to_inputs():
    b = Block(TOTAL, READ, WRITE, task_id="t")
    assert isinstance(b.read_roi, FunlibRoi) and isinstance(b.write_roi, FunlibRoi)
    assert b.read_roi == READ and b.write_roi == WRITE
    g = BlockwiseDependencyGraph("t", READ, WRITE, True, "valid", total_read_roi=TOTAL)
    (root,) = [blk for blk in g.root_gen() if blk.block_id == ("t", 4)]
    assert isinstance(root.read_roi, FunlibRoi) and isinstance(root.write_roi, FunlibRoi)
    assert root.read_roi == Roi((10, 10), (20, 20)) and root.write_roi == Roi((15, 15), (10, 10))
    assert root.read_roi is root.read_roi  # built once
    # setters
    b.write_roi = Roi((16, 16), (8, 8))
    assert b.write_roi == Roi((16, 16), (8, 8))
    b.read_roi = Roi((12, 12), (16, 16))
    assert b.read_roi == Roi((12, 12), (16, 16))


def test_positional_orders_v1_and_v2():
    """v1: Block(total, read, write, block_id, task_id); v2: Block(total, read, write, task_id) (a str)."""
    v1 = Block(TOTAL, READ, WRITE, 7)
    assert v1.block_id == ("", 7)
    v1_both = Block(TOTAL, READ, WRITE, 7, "t")
    assert v1_both.block_id == ("t", 7)
    v2 = Block(TOTAL, READ, WRITE, "t")
    assert v2.block_id == ("t", 4)
    assert Block(TOTAL, READ, WRITE, None, "t").block_id == ("t", 4)
    assert Block(TOTAL, READ, WRITE, task_id="t", block_id=5).block_id == ("t", 5)
    assert Block(TOTAL, READ, WRITE, block_id=("x", 6), task_id="t").block_id == ("t", 6)


def test_repr_like_daisy_2():
    """daisy 2.0.0: ``t/4 read=Roi((10, 10), (20, 20)) write=Roi((15, 15), (10, 10))``; 1-D ``Roi((-3), (20))``."""
    b = Block(TOTAL, READ, WRITE, "t")
    assert repr(b) == "t/4 read=Roi((10, 10), (20, 20)) write=Roi((15, 15), (10, 10))"
    assert str(b) == repr(b)
    one = Block(Roi((0,), (10,)), Roi((-3,), (20,)), Roi((2,), (10,)), "x")
    assert repr(one) == "x/0 read=Roi((-3), (20)) write=Roi((2), (10))"
    assert repr(Block(TOTAL, READ, WRITE)) == "/4 read=Roi((10, 10), (20, 20)) write=Roi((15, 15), (10, 10))"
    g = BlockwiseDependencyGraph(
        "t", Roi((0,), (20,)), Roi((5,), (10,)), True, "shrink", total_read_roi=Roi((0,), (63,))
    )
    assert [repr(blk) for blk in g.root_gen()] == [
        "t/1 read=Roi((10), (20)) write=Roi((15), (10))",
        "t/3 read=Roi((30), (20)) write=Roi((35), (10))",
        "t/5 read=Roi((50), (13)) write=Roi((55), (3))",
    ]


@pytest.mark.parametrize(
    "args, exc",
    [
        ((TOTAL, READ, Roi((15, 15), (0, 10))), ValueError),
        ((TOTAL, Roi((10,), (20,)), WRITE), ValueError),
        ((Roi((0, 0, 0), (1, 1, 1)), READ, WRITE), ValueError),
        ((TOTAL, READ, "write"), TypeError),
        ((TOTAL, READ, Roi((None, None), (10, 10))), ValueError),
    ],
)
def test_bad_block_input(args, exc):
    with pytest.raises(exc):
        Block(*args)
