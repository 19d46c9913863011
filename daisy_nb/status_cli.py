"""``python -m daisy_nb status``: the command line over :mod:`daisy_nb.status` and :mod:`daisy_nb.plot`.

Kept apart from :mod:`daisy_nb.status` (reading and counting tracking stores) so
that :mod:`daisy_nb.plot`, which draws what status reads, and the command, which
uses both, import in one direction only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .status import StatusError, TrackingTarget, _geometry_target, find_tracking_stores, format_status, task_status

__all__ = ["add_arguments", "add_target_arguments", "main", "targets_from_args"]


def _parse_roi(text: str):
    """``"OFFSET:SHAPE"`` with comma-separated ints, e.g. ``"-4,0,2:13,9,8"``."""
    try:
        off, shp = text.split(":")
        offset = tuple(int(v) for v in off.split(","))
        shape = tuple(int(v) for v in shp.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad ROI {text!r}: expected OFFSET:SHAPE, e.g. 0,0:100,100 (write --total-roi=-4,0:8,8 "
            "for a negative offset)"
        ) from None
    if len(offset) != len(shape):
        raise argparse.ArgumentTypeError(f"bad ROI {text!r}: offset and shape differ in dimensions")
    return offset, shape


def add_target_arguments(parser: argparse.ArgumentParser, layout_help: str) -> None:
    """The ``PATH...`` argument and the task layout options (``--total-roi/--read-roi/--write-roi/--fit``).

    Shared by ``status`` and ``dashboard``; read them back with :func:`targets_from_args`.
    ``layout_help`` describes the option group.
    """
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a task's tracking directory, or a basedir holding <task_id>/ directories",
    )
    geo = parser.add_argument_group("task layout (optional)", layout_help)
    geo.add_argument("--total-roi", type=_parse_roi, metavar="ROI")
    geo.add_argument("--read-roi", type=_parse_roi, metavar="ROI")
    geo.add_argument("--write-roi", type=_parse_roi, metavar="ROI")
    geo.add_argument("--fit", default="valid", choices=["valid", "overhang", "shrink"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m daisy_nb status``."""
    parser.add_argument(
        "--png",
        metavar="FILE",
        help="write a picture of the block states (needs matplotlib: pip install "
        "'daisy_nb[plot]'); with several tasks, FILE gets a _<task> suffix per task",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the counts as JSON (a list with one object per task)"
    )
    parser.add_argument(
        "--logs",
        metavar="DIR",
        default=None,
        help="the run's worker log directory (daisy_logs, with <task_id>/worker_*.err): the failures "
        "found there are grouped by exception type and message; default $DAISY_NB_LOG_DIR, else ./daisy_logs, "
        "if it exists",
    )
    add_target_arguments(
        parser,
        "the ROIs of the task (as given to daisy.Task) to count only real blocks instead of the whole "
        "tracking grid; checked against the stored layout hash. Format OFFSET:SHAPE, e.g. 0,0:100,100",
    )


class _Roi:
    def __init__(self, t):
        self.offset, self.shape = t


def _geometry_from_args(args):
    rois = (args.total_roi, args.read_roi, args.write_roi)
    if all(r is None for r in rois):
        return None
    if any(r is None for r in rois):
        raise StatusError("--total-roi, --read-roi and --write-roi go together")
    from .layout import BlockLayout

    try:
        return BlockLayout(*(_Roi(r) for r in rois), fit=args.fit)
    except (TypeError, ValueError) as e:
        raise StatusError(f"bad task layout: {e}") from None


def targets_from_args(args) -> tuple[list[TrackingTarget], Any]:
    """``(targets, geometry)`` of :func:`add_target_arguments`' options: one target per store found.

    ``geometry`` is the task's :class:`~daisy_nb.layout.BlockLayout` (None without the ROI options).
    Raises :class:`~daisy_nb.status.StatusError` on bad input.
    """
    geometry = _geometry_from_args(args)
    targets: list[TrackingTarget] = []
    for path in args.paths:
        for p in find_tracking_stores(path):
            targets.append(_geometry_target(p, geometry) if geometry else TrackingTarget(p.name, p))
    return targets, geometry


def _png_name(png: str, task: str, several: bool) -> str:
    if not several:
        return png
    root, ext = os.path.splitext(png)
    return f"{root}_{task}{ext or '.png'}"


def main(args: argparse.Namespace) -> int:
    """Run ``status``; 0 if every block of every task is done, 1 if not, 2 on bad input."""
    out = sys.stdout
    try:
        targets, _ = targets_from_args(args)
        statuses = [task_status(t) for t in targets]
    except StatusError as e:
        print(f"daisy_nb status: error: {e}", file=sys.stderr)
        return 2
    logs = getattr(args, "logs", None)
    if logs is None:
        from .logging import existing_log_basedir

        logs = existing_log_basedir()
    elif logs is not None and not os.path.isdir(logs):
        print(f"daisy_nb status: error: --logs {logs}: no such directory", file=sys.stderr)
        return 2
    groups = {}
    if logs is not None:
        from .errors import groups_from_logs

        for s in statuses:  # tracking records failure counts, the worker logs the tracebacks
            groups[s["task"]] = groups_from_logs(logs, s["task"]).as_list()
            s["error_groups"] = groups[s["task"]]
    if args.json:
        json.dump(statuses, out, indent=1, default=str)  # always a list, one entry per task
        out.write("\n")
    else:
        from .errors import format_groups

        texts = []
        for s in statuses:
            text = format_status(s)
            g = groups.get(s["task"])
            if g:
                n = sum(x["count"] for x in g)
                text += f"\n  errors in the logs  {n} block failure(s) of {len(g)} kind(s) (under {logs}):\n"
                text += "\n".join(format_groups(g, indent="    ", traceback_lines=4))
            texts.append(text)
        out.write("\n\n".join(texts) + "\n")
    if args.png:
        from .plot import MissingMatplotlib, plot_block_states

        several = len(targets) > 1
        for t in targets:
            fname = _png_name(args.png, t.name, several)
            try:
                plot_block_states(t, file=fname)
            except MissingMatplotlib as e:
                print(f"daisy_nb status: error: {e}", file=sys.stderr)
                return 2
            except StatusError as e:  # pragma: no cover - the store was just read
                print(f"daisy_nb status: error: {e}", file=sys.stderr)
                return 2
            if not args.json:
                out.write(f"wrote {fname}\n")
    out.flush()
    return 0 if all(s["complete"] for s in statuses) else 1
