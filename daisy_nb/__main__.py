"""Command line: ``python -m daisy_nb`` / ``daisy-nb``.

Subcommands:

* ``status PATH [PATH...]``: counts of done / failed / never-finished blocks from
  block tracking (:mod:`daisy_nb.status`), optionally ``--png FILE``;
* ``warmup``: compile every numba kernel into the on-disk cache, once after
  installing (:mod:`daisy_nb.warmup`);
* ``dashboard PATH [PATH...]``: the live dashboard's page, read-only, from block
  tracking (:mod:`daisy_nb.dashboard.offline`);
* ``demo``: the demo in :mod:`daisy_nb.demo`, imported only when asked for (it
  brings its own options and optional dependencies);
* ``track migrate PATH --from-roi ROI --read-roi ROI --write-roi ROI``: record the
  layout of a block-tracking store written by daisy 2.0.0, so that a run on a grown
  volume keeps its done marks (:mod:`daisy_nb.tracking._cli`);
* ``run [--] COMMAND [ARGS...]``: run a program with ``import daisy`` giving
  daisy_nb in it and its child processes (:mod:`daisy_nb.alias`); the exit code
  is the program's.

Exit codes: 0 success (``status``: every block done), 1 not complete, 2 bad
input or a missing optional part.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def _load_demo():
    """The demo module, or an error message if it cannot be imported."""
    try:
        from . import demo
    except ModuleNotFoundError as e:
        if e.name in ("daisy_nb.demo", f"{__package__}.demo"):
            return None, "the demo is not available in this version of daisy_nb (no module daisy_nb.demo)"
        return None, (f"the demo needs {e.name!r}, which is not installed: pip install 'daisy_nb[demo]'")
    if not (hasattr(demo, "add_arguments") and hasattr(demo, "main")):
        return None, "daisy_nb.demo does not provide add_arguments(parser) and main(args)"
    return demo, None


def _run_status(args: argparse.Namespace) -> int:
    from .status_cli import main as status_main

    return status_main(args)


def _run_warmup(args: argparse.Namespace) -> int:
    from .warmup import main as warmup_main

    return warmup_main(args)


def _run_dashboard(args: argparse.Namespace) -> int:
    from .dashboard.offline import main as dashboard_main

    return dashboard_main(args)


def _run_track(args: argparse.Namespace) -> int:
    from .tracking._cli import main as track_main

    return track_main(args)


def _status_arguments(p: argparse.ArgumentParser) -> None:
    from .status_cli import add_arguments

    add_arguments(p)


def _warmup_arguments(p: argparse.ArgumentParser) -> None:
    from .warmup import add_arguments

    add_arguments(p)


def _track_arguments(p: argparse.ArgumentParser) -> None:
    from .tracking._cli import add_arguments

    add_arguments(p)


def _dashboard_arguments(p: argparse.ArgumentParser) -> None:
    from .dashboard.offline import add_arguments

    add_arguments(p)


# name -> (help, description, the function adding its options, the function running it); ``run`` and
# ``demo`` are added apart (``run`` parses its own arguments, ``demo`` comes with its module)
_COMMANDS = {
    "status": (
        "show done / failed / never-finished blocks from block tracking",
        "Per task: grid shape, blocks done, blocks with failures and not done, blocks never "
        "finished, percent done and the recorded failure counts. Reads stores written by "
        "daisy_nb or daisy 2.0.0. Exit code 0 only if every block of every task is done, "
        "1 otherwise, 2 for a bad path. Without the task layout options, every cell of the "
        "tracking grid (ceil(total_roi / write_roi)) is counted as a block.",
        _status_arguments,
        _run_status,
    ),
    "warmup": (
        "compile the numba kernels once (the first large run would, ~15 s)",
        "Compiles every kernel into numba's on-disk cache, so that no run has "
        "to. Small runs never need numba; the first large run after installing would "
        "otherwise compile for ~15 s. Exit code 0 when the cache is current.",
        _warmup_arguments,
        _run_warmup,
    ),
    "track": (
        "block-tracking stores: 'migrate' adopts a daisy 2.0.0 store for a grown volume",
        "Maintenance of block-tracking stores (see docs/tracking-growth.md).",
        _track_arguments,
        _run_track,
    ),
    "dashboard": (
        "serve the dashboard page (read-only) from block tracking",
        "Serves the live dashboard's page from block-tracking directories (a finished run, or one "
        "still running elsewhere: the stores are re-read every second) on 127.0.0.1 until Ctrl-C.",
        _dashboard_arguments,
        _run_dashboard,
    ),
}


_RUN_HELP = "run a program (script.py, -m module, any command) with daisy_nb as daisy"


def build_parser(demo_module=None, only: str | None = "") -> argparse.ArgumentParser:
    """The argument parser; the ``demo`` options are added only if ``demo_module`` is given.

    ``only``: the command about to run; only its options are added, so a command imports the
    modules that define the others' options (the dashboard's, the status report's) only when it
    is one of them. The default, ``""``, adds every command's options (the docs list them all).
    """
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="python -m daisy_nb",
        description="daisy_nb: a daisy-compatible blockwise task scheduler with Numba kernels.",
    )
    parser.add_argument("--version", action="version", version=f"daisy_nb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in ("status", "warmup", "track", "run", "dashboard"):  # the order ``--help`` lists them in
        if name == "run":
            sub.add_parser(name, help=_RUN_HELP, add_help=False)
            continue
        help_, description, add_arguments, func = _COMMANDS[name]
        p = sub.add_parser(name, help=help_, description=description)
        if only in ("", name):
            add_arguments(p)
        p.set_defaults(func=func)
    p_demo = sub.add_parser(
        "demo", help="run the daisy_nb demo (daisy_nb[demo] extra)", add_help=demo_module is not None
    )
    if demo_module is not None:
        demo_module.add_arguments(p_demo)
        p_demo.set_defaults(func=demo_module.main)
    else:
        p_demo.add_argument("demo_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p_demo.set_defaults(func=None)
    return parser


def main(argv=None) -> int:
    """Entry point of ``python -m daisy_nb`` and the ``daisy-nb`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":  # everything after "run" belongs to the command
        from .alias import run_main

        return run_main(argv[1:])
    demo_module = None
    if argv and argv[0] == "demo":
        demo_module, err = _load_demo()
        if err:
            print(f"daisy_nb demo: {err}", file=sys.stderr)
            return 2
    # only the options of the command that runs: the others' modules stay unloaded (``demo``'s run
    # would otherwise carry the dashboard's and the status report's code through its whole run)
    parser = build_parser(demo_module, only=argv[0] if argv and argv[0] in _COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None or args.func is None:
        parser.print_help(sys.stderr)
        return 2
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
