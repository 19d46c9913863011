"""Opening a tracking group: whose is it, and what to do about it.

:func:`load_group` decides whether the group at a path belongs to the task being opened
(its ``daisy_task_hash`` and layout record, :mod:`._layout`): fresh (created, arrays first and
the group document last), the same task (its layout record added or completed), a smaller
volume on the same grid (migrated, keeping the marks of the blocks that did not change),
a caller-provided store without a hash (accepted as daisy 2.0.0 does), or another task
(``RuntimeError`` saying what changed). The arrays themselves are the store's
(:class:`._store.TrackingStore`): it passes the function that maps them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from ._files import HASH_ATTRIBUTE, _group_metadata, _read_json, _write_json
from ._io import side_paths
from ._layout import LAYOUT_ATTRIBUTE, stored_record


def load_group(
    p: Path, h: str, layout: dict | None, require_hash: bool, durable: bool, load_arrays: Callable[[], None]
) -> dict | None:
    """Check (or create) the group at ``p`` for the task of hash ``h`` and layout record
    ``layout`` (its unknown ``read_write_conflict`` is completed from the stored record),
    then ``load_arrays()``. Returns what a migration kept (the store's ``grown_from``), or None.
    """
    group_json = p / "zarr.json"
    if any(d.exists() for d in side_paths(p.parent, p.name)):  # a migration a crash interrupted
        from . import _grow  # (only a grown store needs it: ~0.1 MB a run otherwise never loads)

        _grow.recover(p, h)  # finished or rolled back
    if not group_json.exists():
        if p.exists() and not p.is_dir():
            raise RuntimeError(f"cannot open block tracking at {p}: not a directory")
        p.mkdir(parents=True, exist_ok=True)
        # arrays first, group document last: a directory without the group
        # document is treated as fresh on the next open
        load_arrays()
        _write_json(group_json, _group_metadata(h, {LAYOUT_ATTRIBUTE: layout}))
        return None
    try:
        meta = _read_json(group_json)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"cannot open block tracking at {p}: {e}") from e
    if meta.get("node_type") != "group":
        raise RuntimeError(
            f"tracking path {p} exists but is not a zarr group (node_type = "
            f"{meta.get('node_type')!r}). A caller-provided tracking store must be a "
            "zarr v3 group containing a `done` array of the task's block-grid shape; "
            "either build it that way or delete the path so daisy can create it."
        )
    grown_from = None
    attrs = meta.get("attributes") or {}
    stored = attrs.get(HASH_ATTRIBUTE)
    if stored != h and (stored is not None or require_hash):
        from . import _grow

        rec = stored_record(meta) if stored is not None else None
        if rec is None:
            raise RuntimeError(_grow.mismatch_message(p, stored, h, None))
        growth = _grow.compare(rec, layout)
        if isinstance(growth, str):
            raise RuntimeError(_grow.mismatch_message(p, stored, h, growth))
        grown_from = _grow.migrate(p, growth, durable)
        grown_from["growth"] = growth
    elif stored is not None:
        old = stored_record(meta)
        if old is not None and layout is not None and layout["read_write_conflict"] is None:
            layout["read_write_conflict"] = old.get("read_write_conflict")  # keep what is known
        if attrs.get(LAYOUT_ATTRIBUTE) != layout:
            _record_layout(group_json, meta, layout)
    load_arrays()
    return grown_from


def _record_layout(group_json: Path, meta: dict, layout: dict | None) -> None:
    """Add (or update) the layout record of a store whose hash matches (daisy 2.0.0's,
    an older daisy_nb's); best effort: a read-only store stays as it is."""
    doc = dict(meta)
    attrs = dict(doc.get("attributes") or {})
    attrs[LAYOUT_ATTRIBUTE] = layout
    doc["attributes"] = attrs
    with contextlib.suppress(OSError):
        _write_json(group_json, doc)
