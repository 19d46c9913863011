"""The layout record of a tracking store: what layout a store was written for.

A store written by daisy_nb records, beside daisy 2.0.0's ``daisy_task_hash``, the layout it
was made for (group attribute :data:`LAYOUT_ATTRIBUTE`: the ROIs as given, ``fit``,
``read_write_conflict`` and the derived grid origin, write stride and context). daisy 2.0.0
keeps unknown attributes and reads only the hash, so the store stays readable and writable by
it exactly as before. Every open writes or checks the record; only a store whose hash differs
from its task's needs the rest, :mod:`._grow` (whether the volume grew, and the remap), which
a run loads only then.
"""

from __future__ import annotations

from ._files import HASH_ATTRIBUTE
from ._grid import _fit_name, _roi_parts, task_hash

__all__ = ["LAYOUT_ATTRIBUTE", "LAYOUT_VERSION", "MIGRATED_FROM", "layout_record", "record_hash", "stored_record"]

#: group attribute holding the layout a store was written for
LAYOUT_ATTRIBUTE = "daisy_nb_layout"
#: in a store built by a migration: the hash of the store it was migrated from
MIGRATED_FROM = "daisy_nb_migrated_from"
LAYOUT_VERSION = 1


def _roi_doc(roi, name: str) -> dict:
    off, shp = _roi_parts(roi, name)
    return {"offset": list(off), "shape": list(shp)}


def layout_record(total_roi, read_roi, write_roi, fit="valid", read_write_conflict=None) -> dict:
    """The layout document stored in a tracking group (JSON-ready).

    The ROIs as given (the hash's input) plus what they mean for the grid: the
    grid origin (the total write ROI's begin, where blocks start), the write stride
    and the read/write context. ``read_write_conflict`` is None when unknown.
    """
    t, r, w = _roi_doc(total_roi, "total_roi"), _roi_doc(read_roi, "read_roi"), _roi_doc(write_roi, "write_roi")
    if not len(t["offset"]) == len(r["offset"]) == len(w["offset"]):
        raise ValueError("total_roi, read_roi and write_roi have different dimensions")
    cul = [wo - ro for wo, ro in zip(w["offset"], r["offset"])]
    clr = [(ro + rs) - (wo + ws) for ro, rs, wo, ws in zip(r["offset"], r["shape"], w["offset"], w["shape"])]
    return {
        "version": LAYOUT_VERSION,
        "total_roi": t,
        "read_roi": r,
        "write_roi": w,
        "fit": _fit_name(fit).lower(),
        "read_write_conflict": None if read_write_conflict is None else bool(read_write_conflict),
        "grid_origin": [o + c for o, c in zip(t["offset"], cul)],
        "write_stride": list(w["shape"]),
        "context": {"lower": cul, "upper": clr},
    }


def record_hash(rec: dict) -> str:
    """daisy 2.0.0's hash of the layout a record describes."""
    t, r, w = (rec[k] for k in ("total_roi", "read_roi", "write_roi"))
    return task_hash(
        (t["offset"], t["shape"]), (r["offset"], r["shape"]), (w["offset"], w["shape"]), rec.get("fit", "valid")
    )


def stored_record(group_meta: dict) -> dict | None:
    """The layout record of a group document, if it holds a valid one matching its hash."""
    attrs = group_meta.get("attributes") or {}
    rec = attrs.get(LAYOUT_ATTRIBUTE)
    if not isinstance(rec, dict):
        return None
    try:
        if int(rec.get("version", 0)) != LAYOUT_VERSION or record_hash(rec) != attrs.get(HASH_ATTRIBUTE):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return rec
