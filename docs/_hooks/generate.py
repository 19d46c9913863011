"""mkdocs hook: the generated parts of the docs (the CLI, the environment variables, performance tables).

A page asks for a generated part with a marker line ``<!-- generate: NAME -->``; the hook
replaces it with the Markdown that ``GENERATORS[NAME]()`` returns. Each generator is also
runnable on its own for a look without building the site::

    python docs/_hooks/generate.py cli|environment|performance

Nothing here imports numba or calls a kernel: the site builds in seconds and compiles nothing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generate: ([a-z_]+) -->$", re.M)


# -- the command line ------------------------------------------------------------------
def cli() -> str:
    """Every subcommand's ``--help``, from the parser ``python -m daisy_nb`` builds."""
    import argparse
    import os

    sys.path.insert(0, str(ROOT))
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; a fixed width for the page
    from daisy_nb.__main__ import _load_demo, build_parser

    demo, _ = _load_demo()  # its options too, when its dependencies are installed
    parser = build_parser(demo)
    out = ["## `python -m daisy_nb` (or `daisy-nb`)", "", "```text", parser.format_help().rstrip(), "```", ""]
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        out += [f"## `{name}`", ""]
        if name == "run":  # parsed by daisy_nb.alias.run_main itself: everything after it is the command
            from daisy_nb.alias import RUN_USAGE

            text = RUN_USAGE
        else:
            text = sub.format_help()
        out += ["```text", text.rstrip(), "```", ""]
    return "\n".join(out)


# -- environment variables -------------------------------------------------------------
# What each variable means. The names come from the code (scan_environment); a variable the
# code reads and this table lacks, or one this table has and the code no longer reads, fails
# the build. When daisy_nb has a configuration module that owns names, defaults and parsing,
# replace environment_records() by a read of that module and delete this table.
ENVIRONMENT = {
    "DAISY_CONTEXT": (
        "set by the scheduler",
        "the address, port, task id, worker id and run secret a worker or `Client` program connects with (`k=v:k=v`; daisy's variable). Put in the environment of every worker function and inherited by the programs it starts.",
    ),
    "DAISY_HOST": (
        "unset: detect",
        "the address the scheduler advertises to workers, as `run_blockwise(host=)` (daisy's variable). A loopback address keeps the scheduler private to this machine.",
    ),
    "DAISY_NB_AUTH_TIMEOUT_SECS": ("5", "seconds a connecting job has to complete its handshake."),
    "DAISY_NB_CACHE": ("1", "`0` turns numba's on-disk cache of the kernels off (every process compiles)."),
    "DAISY_NB_DASHBOARD_TOKEN": (
        "unset: random",
        "the dashboard's access token (every dashboard given none, `dashboard=True` included); `off` turns the token off (a warning). Empty counts as unset.",
    ),
    "DAISY_NB_DRY_RUN": (
        "unset",
        "non-empty and not `0`: the program's first `run_blockwise` prints its plan and exits with 0 (set by `daisy-nb run --dry-run`).",
    ),
    "DAISY_NB_EARLY_TEMPLATE": (
        "1",
        "`0` starts the worker template at the first worker instead of before the Scheduler is built.",
    ),
    "DAISY_NB_EXIT_GRACE_SECS": (
        "3",
        "seconds a `Client` program may live after its run ended before it exits with 130.",
    ),
    "DAISY_NB_EXIT_WITH_RUN": (
        "1",
        "`0`: a `Client` program is not ended with its run; its loop ends at the next `acquire_block`.",
    ),
    "DAISY_NB_HANG_FACTOR": ("10", "the hang alarm's threshold in median block times."),
    "DAISY_NB_HANG_SECS": ("60", "the hang alarm's floor in seconds; `0` turns the alarm off."),
    "DAISY_NB_HEARTBEAT_SECS": ("5", "seconds between heartbeats on `Client` connections (both ways)."),
    "DAISY_NB_JIT": (
        "auto",
        "`0`: the kernels always run as plain Python; `1`: always compiled; `auto`: plain Python until compiling pays off.",
    ),
    "DAISY_NB_PEER_TIMEOUT_SECS": (
        "30",
        "seconds of silence after which either end of a `Client` connection counts the other as gone (must exceed the heartbeat).",
    ),
    "DAISY_NB_REPORT": (
        "unset",
        "a path: every `run_blockwise` of the program writes its HTML run report there (`run-2.html` for a second run; set by `daisy-nb run --report`).",
    ),
    "DAISY_NB_TRACKING_IO": (
        "auto",
        "`mmap` or `pwrite` forces block tracking's write path; `auto` picks it from the file system. Another value is a `ValueError`.",
    ),
    "DAISY_NB_WORKER_START": (
        "fork",
        "`exec` starts every block worker as a fresh interpreter instead of forking it from the worker template.",
    ),
    "NUMBA_CACHE_DIR": (
        "numba's",
        "numba's own variable: where compiled kernels are cached. daisy_nb then leaves stale-cache cleanup to its owner.",
    ),
}
_NAME = re.compile(r"\b((?:DAISY|NUMBA)_[A-Z0-9_]*[A-Z0-9])\b")


def scan_environment() -> dict[str, list[str]]:
    """``{name: [modules]}``: every ``DAISY_*``/``NUMBA_*`` name in daisy_nb's sources.

    A grep, not an import: it also finds names held in constants (``ENV_IO``,
    ``TOKEN_ENV``) and composed keys. The daisy shim is left out (it only re-exports)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "daisy_nb").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("daisy_nb/_shim/"):
            continue
        for name in _NAME.findall(path.read_text(encoding="utf-8")):
            if name.startswith("NUMBA_") and name not in ENVIRONMENT:
                continue  # numba's other variables, set for numba, not read by daisy_nb
            found.setdefault(name, set()).add(rel)
    return {k: sorted(v) for k, v in sorted(found.items())}


def environment_records() -> list[tuple[str, str, str, list[str]]]:
    """``(name, default, meaning, modules)`` per variable; raises when code and table disagree."""
    found = scan_environment()
    missing = sorted(set(found) - set(ENVIRONMENT))
    stale = sorted(set(ENVIRONMENT) - set(found))
    if missing or stale:
        raise RuntimeError(
            f"docs/_hooks/generate.py ENVIRONMENT: undocumented variables {missing}, no longer read {stale}"
        )
    return [(name, *ENVIRONMENT[name], found[name]) for name in sorted(ENVIRONMENT)]


def environment() -> str:
    rows = ["| variable | default | meaning | read in |", "|---|---|---|---|"]
    for name, default, meaning, modules in environment_records():
        where = ", ".join(f"`{m.removeprefix('daisy_nb/')}`" for m in modules)
        rows.append(f"| `{name}` | {default} | {meaning} | {where} |")
    return "\n".join(rows)


# -- performance -------------------------------------------------------------------------
def performance() -> str:
    """Every table recorded by a benchmark run (``DAISY_NB_BENCH_RECORD``) under docs/performance/."""
    out = []
    for path in sorted((ROOT / "docs" / "performance").glob("*.jsonl")):
        entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not entries:
            continue
        first = entries[0]
        cmd = " ".join(["python", f"benchmarks/{first['script']}", *first["args"]])
        out += [
            f"## `{first['script']}`",
            "",
            f"`{cmd}` on {first['date']}: {first['machine']}. Recorded in `docs/performance/{path.name}`.",
            "",
        ]
        for e in entries:
            out.append("| " + " | ".join(e["headers"]) + " |")
            out.append("|" + "|".join("---" for _ in e["headers"]) + "|")
            for r in e["rows"]:
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
            out.append("")
    return "\n".join(out) if out else "_No benchmark results are recorded yet._"


GENERATORS = {"cli": cli, "environment": environment, "performance": performance}


def on_page_markdown(markdown: str, page, config, files) -> str:  # mkdocs hook
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
