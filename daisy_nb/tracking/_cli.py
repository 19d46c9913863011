"""``daisy-nb track migrate PATH --from-roi ...``: adopt a daisy 2.0.0 store for a grown volume.

daisy 2.0.0 stores only a hash of the layout, so daisy_nb cannot tell from such a
store whether a new ``total_roi`` only extends its grid (``docs/tracking-growth.md``).
This command takes the layout the store was written for, checks it against the
stored hash (the store is left alone if it does not match), and records it in the
group (the attribute daisy_nb writes in its own stores; daisy 2.0.0 keeps and
ignores it). The next run on the grown volume then migrates the store by itself;
``--to-roi`` migrates it at once.

Exit codes: 0 done, 2 bad input (no store, a layout that does not match its hash,
a ``--to-roi`` that is not a growth).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._files import HASH_ATTRIBUTE, _read_json, _write_json
from ._grid import task_hash
from ._grow import compare, mismatch_message, recover
from ._layout import LAYOUT_ATTRIBUTE, layout_record, stored_record

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..status_cli import _parse_roi

    sub = parser.add_subparsers(dest="track_command", metavar="ACTION")
    m = sub.add_parser(
        "migrate",
        help="record the layout of a store written by daisy 2.0.0, so that a grown volume keeps its marks",
        description=(
            "Checks the ROIs a daisy 2.0.0 tracking store was written for against its stored hash and "
            "records them in the store (daisy 2.0.0 keeps reading and writing it as before). A run on a "
            "grown total_roi of the same grid then keeps the done marks of the blocks that did not change; "
            "--to-roi migrates the store now. The store is left alone if the ROIs do not match its hash. "
            "ROIs as OFFSET:SHAPE, e.g. 0,0:100,100 (write --from-roi=-8,0:16,16 for a negative offset)."
        ),
    )
    m.add_argument("path", metavar="PATH", help="the task's tracking directory")
    m.add_argument("--from-roi", type=_parse_roi, required=True, metavar="ROI", help="the total_roi it was written for")
    m.add_argument("--read-roi", type=_parse_roi, required=True, metavar="ROI", help="the task's read_roi")
    m.add_argument("--write-roi", type=_parse_roi, required=True, metavar="ROI", help="the task's write_roi")
    m.add_argument("--fit", default="valid", choices=["valid", "overhang", "shrink"])
    m.add_argument(
        "--conflict",
        choices=["yes", "no"],
        default=None,
        help="the task's read_write_conflict (recorded for information; not part of the layout check)",
    )
    m.add_argument("--to-roi", type=_parse_roi, metavar="ROI", help="migrate now to this grown total_roi")
    m.add_argument("--no-fsync", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if getattr(args, "track_command", None) != "migrate":
        print("daisy_nb track: error: expected an action (migrate)", file=sys.stderr)
        return 2
    try:
        print(migrate_cli(args))
    except (ValueError, RuntimeError, OSError) as e:
        print(f"daisy_nb track migrate: error: {e}", file=sys.stderr)
        return 2
    return 0


def migrate_cli(args: argparse.Namespace) -> str:
    p = Path(os.fspath(args.path))
    conflict = None if args.conflict is None else args.conflict == "yes"
    rec = layout_record(args.from_roi, args.read_roi, args.write_roi, args.fit, conflict)
    recover(p, None)
    try:
        meta = _read_json(p / "zarr.json")
    except FileNotFoundError:
        raise ValueError(f"no block tracking at {p} (missing {p / 'zarr.json'})") from None
    if meta.get("node_type") != "group":
        raise ValueError(f"{p} is not a block-tracking group (node_type = {meta.get('node_type')!r})")
    attrs = dict(meta.get("attributes") or {})
    stored = attrs.get(HASH_ATTRIBUTE)
    h = task_hash(args.from_roi, args.read_roi, args.write_roi, args.fit)
    lines = []
    have = stored_record(meta)
    if have is not None and stored == h:
        lines.append(f"{p}: the store already records this layout")
    elif stored != h:
        if have is not None and args.to_roi is not None and record_matches_target(have, args):
            lines.append(f"{p}: already migrated to --to-roi")
            return "\n".join(lines)
        raise ValueError(
            f"the store at {p} was not written for these ROIs (stored hash = {stored}, these ROIs give "
            f"{h}); it is left as it is. Give the ROIs exactly as the task that wrote it had them "
            "(offsets included) and its fit."
        )
    else:
        attrs[LAYOUT_ATTRIBUTE] = rec
        doc = dict(meta)
        doc["attributes"] = attrs
        _write_json(p / "zarr.json", doc)
        lines.append(
            f"{p}: recognised as written for total_roi {list(args.from_roi[0])}+{list(args.from_roi[1])} "
            f"(hash {h[:12]}...); recorded its layout. A run on a grown volume of the same grid now keeps "
            "the done marks of the blocks that did not change."
        )
    if args.to_roi is not None:
        new = layout_record(args.to_roi, args.read_roi, args.write_roi, args.fit, conflict)
        growth = compare(rec, new)
        if isinstance(growth, str):
            raise ValueError(
                mismatch_message(p, h, task_hash(args.to_roi, args.read_roi, args.write_roi, args.fit), growth)
            )
        from ._store import TrackingStore

        with TrackingStore.open(
            p,
            args.to_roi,
            args.read_roi,
            args.write_roi,
            args.fit,
            read_write_conflict=conflict,
            durable=not args.no_fsync,
        ) as store:
            info = store.grown_from
        if info is not None:
            lines.append(
                f"{p}: migrated to total_roi {list(args.to_roi[0])}+{list(args.to_roi[1])}: "
                f"{info['kept']:,} of {growth.new_blocks:,} blocks done ({info['had'] - info['kept']:,} done "
                "marks at the old far edge not kept: those blocks changed)"
            )
    return "\n".join(lines)


def record_matches_target(have: dict, args) -> bool:
    rec = layout_record(args.to_roi, args.read_roi, args.write_roi, args.fit)
    return all(have.get(k) == rec[k] for k in ("total_roi", "read_roi", "write_roi", "fit"))
