"""Worker errors grouped by exception type and message shape.

With 10^6 blocks, 3,000 failures are usually two distinct errors. Every failure
a runtime records (:func:`daisy_nb.runtime.common.failures.record_error` for a text,
``record_worker_error`` for a :class:`WorkerError`: a block that raised in a pool
worker, a ``Client`` or a dask batch, a worker that exited or was lost) goes into the task's
:class:`ErrorGroups` (``TaskState.error_groups``). A group is keyed by the
exception type and the *shape* of its message: numbers, hex values, paths and
quoted strings are replaced by placeholders (:func:`message_shape`), so
``IndexError: index 1234 is out of bounds for axis 0 with size 1000`` of block
7 and of block 91 are one group.

A group keeps its count, its first and last block (id; the ROI is looked up on
demand from the scheduler's geometry by ``roi_of``), the first traceback, when
it was first and last seen, and the worker's log path. Memory is bounded: at
most :data:`MAX_GROUPS` groups per task; later new shapes count in one
``(other errors)`` group.

A back-end that knows the exception sends it structured, a :class:`WorkerError`
(type, message, traceback, block id): it is grouped by those fields, no parsing
(a ``Client``'s failure frame, ``runtime/net/wire.py``; a dask batch's result,
``runtime/dask/worker.py``). The text path (:func:`split_error`, regular expressions) stays for back-ends that send
only a text and for worker logs read back (``groups_from_logs``).

Only failures with a text are grouped: a block function that sets
``block.status = FAILED`` without raising counts as failed but has no message.
Dask batches report their first and last error only, so a dask group counts
those (the failed counts are exact in the summary's table).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MAX_GROUPS", "ErrorGroups", "WorkerError", "format_groups", "groups_from_logs", "message_shape", "split_error",
]  # fmt: skip

MAX_GROUPS = 50
MAX_TB = 8192  # characters of a group's first traceback kept

# "block 7 failed:" or, with daisy's tuple block ids, "block ('task', 7) failed:"
BLOCK_RE = re.compile(r"""^block (?:\((?:'[^'\n]*'|"[^"\n]*"), )?(\d+)\)? failed""", re.MULTILINE)
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout)\w*)(?::\s?(.*))?$")
_SUBS = [
    (re.compile(r"""(['"])(?:(?!\1).){0,200}\1"""), "'…'"),  # quoted strings
    (re.compile(r"(?:[A-Za-z]:)?(?:[~.]?/[^\s'\",:;()\[\]]+)+"), "<path>"),  # /abs/paths, ./rel, ~/x
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<hex>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
]


@dataclass(frozen=True)
class WorkerError:
    """One failure as a back-end knows it, structured (what :meth:`ErrorGroups.add` groups without parsing).

    ``type``: the exception's class name (``type(e).__name__``), or ``"worker error"`` for a
    worker that exited, was killed or went silent; ``message``: ``str(e)`` (or the worker's
    message); ``traceback``: the capped traceback (``runtime/common/run_block.py``
    ``cap_traceback``), empty if there is none; ``block_id``: the spatial block id, when a
    block raised. For :meth:`text` only: ``task_id``, the block's task (the block is then
    named as ``Block.block_id`` prints, ``('task', 7)``), and ``where``, what follows
    ``failed`` in the first line (``" on dask worker ... (pid ...)"``).
    """

    type: str
    message: str
    traceback: str = ""
    block_id: int | None = None
    task_id: str | None = None
    where: str = ""

    def text(self) -> str:
        """The text form the back-ends record (``TaskState.last_worker_error``): ``block <id> failed<where>:``
        and the traceback (or ``type: message`` without one); a worker's message as it is."""
        body = self.traceback or (f"{self.type}: {self.message}" if self.type != "worker error" else self.message)
        if self.block_id is None:
            return body
        bid = self.block_id if self.task_id is None else (self.task_id, self.block_id)
        return f"block {bid} failed{self.where}:\n{body}"

    @classmethod
    def from_exception(
        cls,
        e: BaseException,
        traceback: str = "",
        block_id: int | None = None,
        task_id: str | None = None,
        where: str = "",
    ) -> WorkerError:
        """``e``'s class name and ``str(e)``, the other fields as given."""
        return cls(type(e).__name__, str(e), traceback, block_id, task_id, where)


def message_shape(msg: str) -> str:
    """``msg`` with numbers, hex, uuids, paths and quoted strings replaced by placeholders."""
    s = msg.strip()[:500]
    for rx, rep in _SUBS:
        s = rx.sub(rep, s)
    return re.sub(r"\s+", " ", s)


def split_error(text: str) -> tuple[str, str, int | None]:
    """``(exception type, message, block id or None)`` of one recorded failure text.

    The exception is the last ``Name: message`` line of a traceback (``Name`` ending in
    Error/Exception/...). Other texts (a worker that exited, was killed or went silent,
    a dask future that erred) are of type ``worker error`` with their first line as the
    message: their stderr tail may quote a block's traceback, counted already.
    """
    m = BLOCK_RE.match(text)
    bid = int(m.group(1)) if m else None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if bid is None and not text.startswith("Traceback"):  # a worker's message (maybe quoting its stderr)
        return "worker error", lines[0].strip() if lines else "", None
    for ln in reversed(lines):
        e = _EXC_LINE.match(ln.strip())
        if e:
            return e.group(1).rsplit(".", 1)[-1], (e.group(2) or "").strip(), bid
    first = lines[0] if lines else ""
    if bid is not None and len(lines) > 1:  # "block N failed:" then an untyped last line
        return "error", lines[-1].strip(), bid
    return "worker error", first.strip(), bid


class ErrorGroups:
    """The grouped failures of one task (see the module docstring). Written by the runtime's
    thread only; readers take :meth:`as_list` (a copy)."""

    def __init__(self, task_id: str = ""):
        self.task_id = task_id
        self.groups: dict[tuple[str, str], dict] = {}
        self.total = 0
        # block id -> {"read_roi": ..., "write_roi": ...} or None: the scheduler's, optional
        self.roi_of: Callable[[int], dict | None] | None = None
        self._rois: dict = {}  # block id -> ROI, looked up once

    def add(self, error: str | WorkerError, log: str | None = None, t: float | None = None) -> None:
        """Count one failure: a :class:`WorkerError`, or a ``text`` (a traceback or a worker message,
        parsed by :func:`split_error`); ``log``: the worker's log path."""
        if isinstance(error, WorkerError):
            etype, msg, bid = error.type, error.message.strip(), error.block_id
            text = error.text()
        else:
            text = error
            if not text:
                return
            etype, msg, bid = split_error(text)
        key = (etype, message_shape(msg))
        g = self.groups.get(key)
        if g is None:
            if len(self.groups) >= MAX_GROUPS:
                key = ("(other errors)", f"more than {MAX_GROUPS} distinct error shapes")
                g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = {
                    "type": key[0],
                    "shape": key[1],
                    "message": msg[:500],
                    "count": 0,
                    "first_block": bid,
                    "last_block": bid,
                    "traceback": text[:MAX_TB],
                    "log": log,
                    "first_t": t or time.time(),
                    "last_t": t or time.time(),
                }
        g["count"] += 1
        self.total += 1
        if bid is not None:
            if g["first_block"] is None:
                g["first_block"] = bid
            g["last_block"] = bid
        g["last_t"] = t or time.time()
        if g["log"] is None and log:
            g["log"] = log

    def __len__(self) -> int:
        return len(self.groups)

    def as_list(self) -> list[dict]:
        """The groups, most frequent first, each a dict (``task``, ``type``, ``shape``, ``message``,
        ``count``, ``first_block``/``last_block`` with ``first_roi``/``last_roi`` when known,
        ``traceback``, ``log``, ``first_t``/``last_t`` as Unix times)."""
        out = []
        for g in sorted(list(self.groups.values()), key=lambda g: (-g["count"], g["first_t"])):
            d = dict(g, task=self.task_id)
            for k in ("first", "last"):
                bid = d[k + "_block"]
                d[k + "_roi"] = None
                if bid is not None and self.roi_of is not None:
                    if bid not in self._rois:
                        if len(self._rois) > 4 * MAX_GROUPS:
                            self._rois.clear()
                        try:
                            self._rois[bid] = self.roi_of(bid)
                        except (KeyError, ValueError, IndexError, OverflowError):  # an id of no block here
                            self._rois[bid] = None
                    d[k + "_roi"] = self._rois[bid]
            out.append(d)
        return out


def _roi_text(r) -> str:
    if not r:
        return ""
    w = r.get("write_roi") or {}
    return f" write ROI offset ({', '.join(map(str, w.get('offset', [])))}), shape ({', '.join(map(str, w.get('shape', [])))})"


def format_groups(groups: list[dict], indent: str = "    ", traceback_lines: int = 12) -> list[str]:
    """Lines describing grouped errors (the end-of-run summary and ``daisy-nb status``)."""
    lines = []
    for i, g in enumerate(groups, 1):
        lines.append(f"{indent}[{i}] {g['count']:,} × {g['type']}: {g['message'][:160]}")
        if g["shape"] != g["message"][:500] and g["count"] > 1:
            lines.append(f"{indent}    shape: {g['shape'][:160]}")
        if g.get("first_block") is not None:
            lines.append(f"{indent}    first block {g['first_block']}{_roi_text(g.get('first_roi'))}")
            if g.get("last_block") != g.get("first_block") and g.get("last_block") is not None:
                lines.append(f"{indent}    last block  {g['last_block']}{_roi_text(g.get('last_roi'))}")
        if g.get("log"):
            lines.append(f"{indent}    log: {g['log']}")
        tb = [ln for ln in str(g.get("traceback") or "").splitlines() if ln.strip()]
        if traceback_lines and len(tb) > 1:
            shown = tb[-traceback_lines:]
            if len(tb) > traceback_lines:
                lines.append(f"{indent}    … ({len(tb) - traceback_lines} lines above)")
            lines.extend(f"{indent}    | {ln}" for ln in shown)
    return lines


def groups_from_logs(log_dir, task_id: str, max_bytes: int = 64 << 20) -> ErrorGroups:
    """The ``block <id> failed:`` entries of a task's worker logs (``<log_dir>/<task_id>/worker_*.err``,
    the last ``max_bytes`` of each), grouped: what ``daisy-nb status`` shows, since block tracking
    records failure counts but no tracebacks. A log holds the runs appended to it (``daisy_nb.logging``):
    a block that failed in an earlier run and succeeded since is still counted here."""
    from pathlib import Path

    groups = ErrorGroups(task_id)
    d = Path(log_dir) / task_id
    try:
        files = sorted(d.glob("worker_*.err"))
    except OSError:
        return groups
    for p in files:
        try:
            with open(p, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                text = f.read().decode("utf-8", "replace")
            t = p.stat().st_mtime
        except OSError:
            continue
        starts = [m.start() for m in BLOCK_RE.finditer(text)]
        for i, a in enumerate(starts):
            b = starts[i + 1] if i + 1 < len(starts) else len(text)
            body = text[a:b]
            cut = body.find("\n=== daisy run ")
            if cut > 0:
                body = body[:cut]
            body = "\n".join(body.rstrip().splitlines()[:80])
            groups.add(body, log=str(p), t=t)
    return groups
