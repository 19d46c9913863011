"""The run report: one self-contained HTML file, written at the end of a run.

``run_blockwise(..., report="run.html")`` (or ``daisy-nb run --report run.html
script.py``, through the :data:`ENV` variable) writes it when the run ends,
also after Ctrl-C, an abandoned task or an error: the summary counts, blocks/s
over time per task, the worker timeline, the block-state pictures and the
grouped errors.

It is the dashboard's own page (``static/``) with its stylesheet and script
inlined and the answers of ``/api/state``, ``/api/pictures`` and
``/api/timeline`` embedded as one JSON object (``window.DAISY_NB_REPORT``): the
page draws from that instead of polling. Nothing is fetched when it is opened
(a ``Content-Security-Policy`` forbids it), there is no framework, only the
standard DOM, canvas and ``DecompressionStream``. Its size is bounded whatever
the run's length: the pictures are at most about 50k pixels per task
(:mod:`.picture`), the rate history 240 points, the timeline at most 20,000
bars plus its aggregated buckets (:mod:`.timeline`), the error groups 50 per
task.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import resources
from pathlib import Path

from daisy_nb import config

__all__ = ["ENV", "check_report", "render_report", "write_report"]

ENV = config.REPORT.name  # daisy-nb run --report PATH sets it for the program it runs
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)
_written: dict[str, int] = {}  # path from the environment -> runs that wrote it in this process


def check_report(report) -> str | None:
    """``report=`` of ``run_blockwise``: a path (str or PathLike), or None (then :data:`ENV`, if set)."""
    if report is None:
        env = config.REPORT.get()
        if env is None:
            return None
        # one program, several runs: run.html, run-2.html, ...
        n = _written.get(env, 0) + 1
        _written[env] = n
        if n == 1:
            return env
        p = Path(env)
        return str(p.with_name(f"{p.stem}-{n}{p.suffix}"))
    if isinstance(report, bool) or not isinstance(report, (str, os.PathLike)):
        raise TypeError(f"report must be a file path (str or os.PathLike) or None, got {type(report).__name__}")
    path = os.fspath(report)
    if not path:
        raise ValueError("report must be a non-empty file path")
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise ValueError(f"report: the directory {parent} does not exist")
    return path


def _static(name: str) -> str:
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def render_report(data: dict) -> str:
    """The HTML text of a report from ``{"/api/state": ..., "/api/pictures": ..., "/api/timeline": ...}``."""
    page = _static("index.html")
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    page = page.replace(
        '<meta name="referrer" content="no-referrer">',
        f'<meta name="referrer" content="no-referrer">\n<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        1,
    )
    page = page.replace("<title>daisy_nb dashboard</title>", "<title>daisy_nb run report</title>", 1)
    page = page.replace(
        '<link rel="stylesheet" href="static/style.css">', "<style>\n" + _static("style.css") + "</style>", 1
    )
    js = _static("app.js").replace("</script", "<\\/script")
    page = page.replace(
        '<script src="static/app.js"></script>',
        f"<script>window.DAISY_NB_REPORT = {blob};</script>\n<script>\n{js}</script>",
        1,
    )
    return page


def write_report(path, source) -> Path:
    """Write the report of ``source`` (a :class:`.live.LiveSource` after ``end``) to ``path``; returns it."""
    from daisy_nb import __version__

    state = source.state()
    state["report"] = {"written": time.time(), "version": __version__}
    data = {"/api/state": state, "/api/pictures": source.pictures(), "/api/timeline": source.timeline_json(20000)}
    text = render_report(data)
    out = Path(path).expanduser()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def write_for_run(path, source) -> None:
    """The end of a run: write the report, say where (stderr); a failure is a warning, never an error."""
    try:
        out = write_report(path, source)
        print(f"daisy_nb report: {out.resolve()}", file=sys.stderr or sys.__stderr__, flush=True)
    except Exception as e:  # a report must not turn a finished run into a failed one
        import logging

        logging.getLogger("daisy").warning("daisy_nb: could not write the run report %s: %r", path, e, exc_info=True)
