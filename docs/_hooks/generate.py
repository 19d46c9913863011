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
# Names, defaults and meanings come from daisy_nb.config (standard library only: importing it
# compiles nothing). The sources are grepped so that the build fails when the code reads a
# variable some other way: a DAISY_* name the module does not declare, or an os.environ /
# getenv read outside daisy_nb/config.py. What may remain outside it: copies of the whole
# environment for a child (dict(os.environ), {**os.environ}), the worker template taking
# over a worker's environment (os.environ.clear()/update()), and writes of a declared
# variable, os.environ[config.X.name] = ..., and ``os.environ`` named in a docstring.
_NAME = re.compile(r"\bDAISY_[A-Z0-9_]*[A-Z0-9]\b")
_ENVIRON = re.compile(r"\bos\.environ\b|\bos\.getenv\b|\bos\.putenv\b|\bos\.unsetenv\b|\bos\.environb\b")
_ALLOWED = re.compile(
    r"dict\(os\.environ\b|\{\*\*os\.environ\b|os\.environ\.(?:clear|update)\("
    r"|os\.environ\[config\.[A-Z][A-Z0-9_]*\.name\]\s*=(?!=)"
    r"|``os\.environ[^`]*``"  # named in a docstring
)
_USE = re.compile(r"\bconfig\.([A-Z][A-Z0-9_]*)\b")
_WRITE = re.compile(r"\[config\.([A-Z][A-Z0-9_]*)\.name\]\s*=(?!=)")  # env[config.X.name] = ... (for a child)


def _config():
    sys.path.insert(0, str(ROOT))
    from daisy_nb import config

    return config


def scan_environment(root: Path = ROOT) -> tuple[dict[str, list[str]], list[str]]:
    """``({config constant: [modules using it]}, [problems])`` over ``root/daisy_nb``.

    A problem is a ``DAISY_*`` name that :mod:`daisy_nb.config` does not declare, an
    ``os.environ`` use outside ``daisy_nb/config.py`` that is not one of the allowed forms
    (a read), or a write of a variable not declared ``written``. The daisy shim is left
    out (it only re-exports)."""
    config = _config()
    declared = set(config.VARIABLES)
    constants = {k for k, v in vars(config).items() if isinstance(v, config.Variable)}
    used: dict[str, set[str]] = {}
    problems = []
    for path in sorted((root / "daisy_nb").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("daisy_nb/_shim/") or rel == "daisy_nb/config.py":
            continue
        text = path.read_text(encoding="utf-8")
        for name in sorted(set(_NAME.findall(text)) - declared):
            problems.append(f"{rel}: {name} is not declared in daisy_nb/config.py")
        for n, line in enumerate(text.splitlines(), 1):
            for m in _ENVIRON.finditer(line):
                if not any(a.start() <= m.start() < a.end() for a in _ALLOWED.finditer(line)):
                    problems.append(f"{rel}:{n}: reads the environment outside daisy_nb/config.py: {line.strip()}")
        for const in _USE.findall(text):
            if const in constants:
                used.setdefault(const, set()).add(rel)
        for const in sorted(set(_WRITE.findall(text))):
            if const in constants and not getattr(config, const).written:
                problems.append(
                    f"{rel}: sets {getattr(config, const).name}, which daisy_nb/config.py does not declare written"
                )
    problems += [f"daisy_nb/config.py: {c} is used nowhere" for c in sorted(constants - set(used))]
    return {k: sorted(v) for k, v in sorted(used.items())}, problems


def environment_records() -> list[tuple[str, str, str, list[str]]]:
    """``(name, default, meaning, modules)`` per variable; raises when the code reads one undeclared."""
    config = _config()
    used, problems = scan_environment()
    if problems:
        raise RuntimeError("environment variables outside daisy_nb/config.py:\n" + "\n".join(problems))
    by_name = {getattr(config, c).name: modules for c, modules in used.items()}
    return [(v.name, v.shown_default, v.meaning, by_name[v.name]) for _, v in sorted(config.VARIABLES.items())]


def environment() -> str:
    rows = ["| variable | default | meaning | used in |", "|---|---|---|---|"]
    for name, default, meaning, modules in environment_records():
        where = ", ".join(f"`{m.removeprefix('daisy_nb/')}`" for m in modules)
        rows.append(f"| `{name}` | {default} | {meaning} | {where} |")
    written = [f"`{v.name}`" for _, v in sorted(_config().VARIABLES.items()) if v.written]
    rows += ["", f"daisy_nb also sets {', '.join(written[:-1])} and {written[-1]} for the processes it starts."]
    return "\n".join(rows)


# -- performance -------------------------------------------------------------------------
def performance() -> str:
    """Every table recorded by a benchmark run (``DAISY_NB_BENCH_RECORD``) under docs/performance/."""
    out = []
    for path in sorted((ROOT / "docs" / "performance").glob("*.jsonl")):
        entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not entries:
            continue
        out += [
            f"## `{entries[0]['script']}`",
            "",
            f"Recorded in `docs/performance/{path.name}`, oldest run first.",
            "",
        ]
        run = None
        for e in entries:
            if (e["date"], e["args"]) != run:  # the tables of one run share its command line and date
                run = (e["date"], e["args"])
                cmd = " ".join(["python", f"benchmarks/{e['script']}", *e["args"]])
                out += [f"`{cmd}` on {e['date']}: {e['machine']}.", ""]
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
