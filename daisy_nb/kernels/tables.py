"""Every column, code and state slot that the kernels and the Python layer share, defined once.

Plain Python and numpy: :mod:`daisy_nb.layout` and :mod:`daisy_nb.scheduler` import
it without importing numba, and the kernels read its integers as compile-time
constants.

* ``G_*`` / ``I_*``: rows of ``TaskTables.geo`` (per-axis vectors) and columns of
  ``TaskTables.info`` (scalars), built by :func:`daisy_nb.layout.pack_layouts`.
* Block status, release codes, per-task counters (``C_*``) and settings (``F_*``).
* **The packed scheduler state.** numba unboxes every array argument on each call
  (~60 ns each) and the scheduler's state is 30 arrays, so the int64 arrays live in
  one buffer and the byte arrays in another (see ``kernels/surface.py``). The table
  :data:`PACKED_INT64` declares them (name, dimensions, group); the slot numbers
  ``P_*`` that the kernels use, the buffer's header and the Python-side views
  (:func:`pack_int64`, :func:`unpack_int64`) are all derived from it, so the two sides cannot disagree.
* The operations of ``surface.step`` (``OP_*``) and its result codes (``RC_*``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

# -- per-task geometry: rows of TaskTables.geo (each a per-axis vector, padded with 0 to max ndim)
G_TR_OFF, G_TR_SHAPE, G_RS, G_WS, G_TW_OFF, G_TW_SHAPE, G_GRID, G_PERIOD, G_IDOFF, G_TRACK = range(10)
N_GEO = 10
# -- columns of TaskTables.info
I_NDIM, I_FIT, I_NLEVELS, I_LEVEL_BASE, I_NBLOCKS, I_BLOCK_BASE, I_NROOTS = range(7)
N_INFO = 7
FIT_VALID, FIT_OVERHANG, FIT_SHRINK = range(3)

# -- block status (status byte per block)
PENDING, READY, PROCESSING, DONE, FAILED, ORPHANED = range(6)
# -- failed attempts per block: one byte (u8), so the count stops here and no task may allow more
RETRIES_MAX = 255
# -- release codes (one per released block; SUCCESS and FAILED are daisy's BlockStatus values)
R_GIVE_BACK, R_SUCCESS, R_FAILED, R_SKIPPED = 0, 2, 3, 4
# -- per-task counters and queue pointers: columns of ``cnt``
(
    C_READY,
    C_PROC,
    C_COMPLETED,
    C_SKIPPED,
    C_FAILED,
    C_ORPHANED,
    C_QHEAD,
    C_QLEN,
    C_NEXT_ROOT,
    C_ROOTS_LEFT,
    C_STARTED,
    C_GIVEN,
) = range(12)
N_CNT = 12
# -- per-task settings: columns of ``tcfg``; run states of F_STATE
F_MAX_RETRIES, F_STATE = range(2)
N_CFG = 2
RUNNING, ABANDONED = 0, 2


class Slot(NamedTuple):
    """One array of the packed int64 buffer."""

    name: str
    ndim: int
    group: str  # "T": task/edge tables (read only), "S": state, "W": scratch
    what: str


PACKED_INT64: tuple[Slot, ...] = (
    Slot("geo", 3, "T", "per task: G_* rows x axes"),
    Slot("info", 2, "T", "per task: I_* columns"),
    Slot("lvl_off", 2, "T", "per level: grid offset of the level's first block"),
    Slot("lvl_cnt", 2, "T", "per level: blocks per axis"),
    Slot("lvl_start", 1, "T", "per task, per level + 1: first row of the level"),
    Slot("conf_ptr", 1, "T", "per level: CSR pointer into conf_jump"),
    Slot("conf_jump", 2, "T", "conflict offsets as jumps of the previous level's counter"),
    Slot("e_uv", 2, "T", "per task edge: (upstream task, downstream task)"),
    Slot("e_up", 2, "T", "per edge and axis: upstream interval under each downstream position"),
    Slot("e_up_off", 2, "T", "per edge: where each axis's rows of e_up start"),
    Slot("e_dn", 2, "T", "per edge and axis: downstream interval of each upstream position (inverse of e_up)"),
    Slot("e_dn_off", 2, "T", "per edge: where each axis's rows of e_dn start"),
    Slot("t_in_ptr", 1, "T", "per task: CSR pointer into t_in_e"),
    Slot("t_in_e", 1, "T", "incoming edges of each task"),
    Slot("t_out_ptr", 1, "T", "per task: CSR pointer into t_out_e"),
    Slot("t_out_e", 1, "T", "outgoing edges of each task"),
    Slot("queue", 1, "S", "one FIFO ring buffer per task, in the task's slice of N"),
    Slot("cnt", 2, "S", "per task: C_* counters"),
    Slot("tcfg", 2, "S", "per task: F_* settings"),
    Slot("buf_t", 1, "W", "scratch: the task of each downstream block found"),
    Slot("buf_row", 1, "W", "scratch: its row"),
    Slot("buf_id", 1, "W", "scratch: its spatial id (for daisy's order)"),
    Slot("buf_lev", 1, "W", "scratch: its level"),
    Slot("buf_j", 2, "W", "scratch: its in-level counter"),
    Slot("scr", 2, "W", "scratch rows (grid positions, memo)"),
    Slot("row1", 1, "W", "one row, for the one-block release"),
)
SLOT = {s.name: k for k, s in enumerate(PACKED_INT64)}
N_PACKED = len(PACKED_INT64)
# the slot numbers, for the kernels (each checked against the table by name)
P_GEO, P_INFO, P_LVL_OFF, P_LVL_CNT, P_LVL_START = (SLOT[n] for n in ("geo", "info", "lvl_off", "lvl_cnt", "lvl_start"))
P_CONF_PTR, P_CONF_JUMP = SLOT["conf_ptr"], SLOT["conf_jump"]
P_E_UV, P_E_UP, P_E_UP_OFF, P_E_DN, P_E_DN_OFF = (SLOT[n] for n in ("e_uv", "e_up", "e_up_off", "e_dn", "e_dn_off"))
P_TIN_PTR, P_TIN_E, P_TOUT_PTR, P_TOUT_E = (SLOT[n] for n in ("t_in_ptr", "t_in_e", "t_out_ptr", "t_out_e"))
P_QUEUE, P_CNT, P_TCFG = SLOT["queue"], SLOT["cnt"], SLOT["tcfg"]
P_BUF_T, P_BUF_ROW, P_BUF_ID, P_BUF_LEV, P_BUF_J = (SLOT[n] for n in ("buf_t", "buf_row", "buf_id", "buf_lev", "buf_j"))
P_SCR, P_ROW1 = SLOT["scr"], SLOT["row1"]
# header: for slot k, b[4k], b[4k+1] = start, end; b[4k+2 : 4k+4] = trailing dimensions (unused: 1);
# then b[P_N] = N, the number of blocks of the pipeline
P_N = 4 * N_PACKED
P_HEADER = P_N + 4

# the byte buffer u8: N bytes each of status, retries, preskip, then one release code
U8_STATUS, U8_RETRIES, U8_PRESKIP, U8_CODE1 = range(4)

# -- operations of surface.step and its result codes
OP_ACQUIRE, OP_RELEASE, OP_ACQUIRE_ONE, OP_RELEASE_ONE = range(4)
RC_SCRATCH = -1  # a scratch buffer was too small (an internal error)
RC_FAILED_AT = -2  # release: rc <= RC_FAILED_AT means rows[RC_FAILED_AT - rc] failed for good


def failed_at(rc: int) -> int:
    """The position in the release's rows of the block that failed for good (``rc <= RC_FAILED_AT``)."""
    return RC_FAILED_AT - rc


def pack_int64(tables: dict, shapes: dict, n_blocks: int) -> tuple[np.ndarray, dict]:
    """One zeroed int64 buffer holding every slot of :data:`PACKED_INT64`, and a view per slot.

    ``shapes[name]`` is each slot's shape (its dimensions as the table says);
    ``tables[name]``, where given, is copied in; the rest start at zero.
    """
    import numpy as np

    if set(shapes) != set(SLOT):
        raise ValueError(
            f"pack_int64: shapes for {sorted(set(SLOT) - set(shapes))} missing, "
            f"{sorted(set(shapes) - set(SLOT))} unknown"
        )
    sizes = []
    for s in PACKED_INT64:
        sh = tuple(shapes[s.name])
        if len(sh) != s.ndim or any(d <= 0 for d in sh[1:]):
            raise ValueError(
                f"pack_int64: slot {s.name!r} needs {s.ndim} dimensions, the trailing ones "
                f"positive (the kernels reshape with -1), got {sh}"
            )
        sizes.append(int(np.prod(sh)))
    offsets = np.cumsum([P_HEADER, *sizes])
    b = np.zeros(int(offsets[-1]), dtype=np.int64)  # calloc: untouched pages cost nothing
    views = {}
    for k, s in enumerate(PACKED_INT64):
        sh = tuple(shapes[s.name])
        o = int(offsets[k])
        b[4 * k] = o
        b[4 * k + 1] = o + sizes[k]
        b[4 * k + 2 : 4 * k + 4] = 1
        b[4 * k + 2 : 4 * k + 1 + len(sh)] = sh[1:]
        v = b[o : o + sizes[k]].reshape(sh)
        if s.name in tables:
            v[...] = tables[s.name]
        views[s.name] = v
    b[P_N] = n_blocks
    return b, views


def unpack_int64(b: np.ndarray) -> dict:
    """A view per slot of a buffer :func:`pack_int64` made, read back from its header.

    For code that keeps only the buffer (plain mode's ``surface_plain.PlainSurface``);
    ``surface.step`` reads the same header inside the kernel.
    """
    views = {}
    for k, s in enumerate(PACKED_INT64):
        v = b[b[4 * k] : b[4 * k + 1]]
        if s.ndim > 1:
            v = v.reshape((-1, *(int(d) for d in b[4 * k + 2 : 4 * k + 1 + s.ndim])))
        views[s.name] = v
    return views


def pack_u8(n_blocks: int) -> np.ndarray:
    """The zeroed byte buffer of the ``U8_*`` layout: ``n_blocks`` bytes per array, then one release code."""
    import numpy as np

    return np.zeros(U8_CODE1 * n_blocks + 1, dtype=np.uint8)


def groups(views: dict, u8: np.ndarray, n_met: np.ndarray, n_blocks: int) -> tuple[tuple, tuple, tuple]:
    """The kernels' ``(T, S, W)`` argument tuples from the Python-side views.

    The same tuples ``surface.step`` rebuilds from the buffers itself: T the tables,
    S = (status, n_met, retries, preskip, queue, cnt, tcfg), W the scratch.
    """
    N = n_blocks
    T = tuple(views[s.name] for s in PACKED_INT64 if s.group == "T")
    S = (
        u8[U8_STATUS * N : (U8_STATUS + 1) * N],
        n_met,
        u8[U8_RETRIES * N : (U8_RETRIES + 1) * N],
        u8[U8_PRESKIP * N : (U8_PRESKIP + 1) * N],
        views["queue"],
        views["cnt"],
        views["tcfg"],
    )
    W = tuple(views[n] for n in ("scr", "buf_t", "buf_row", "buf_id", "buf_lev", "buf_j"))
    return T, S, W
