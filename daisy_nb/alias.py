"""Make ``import daisy`` give daisy_nb, in this process and in every Python process it starts.

This is how an existing daisy code base runs on daisy_nb without edits
(``daisy-nb run COMMAND`` uses it). Two parts:

* a meta-path finder, :class:`DaisyAliasFinder`, placed first in ``sys.meta_path``:
  ``daisy`` resolves to the ``daisy_nb`` module and ``daisy.X`` to ``daisy_nb.X``,
  the *same* module objects (one ``Block`` class, one ``logging`` state);
* the directory :data:`SHIM_DIR`, shipped inside the package, which holds a
  one-file ``daisy`` package that installs that finder. Prepended to
  ``PYTHONPATH``, it is found before any installed daisy by every child process
  (``subprocess.run(["python", ...])``, console scripts, worker programs), and
  costs nothing in a process that never imports ``daisy``.

The alias imports nothing beyond ``import daisy_nb`` (no numba), so worker
processes stay light. Where it does not reach: a child started with an
environment without ``PYTHONPATH`` (or with ``python -E``/``-I``) gets the real
daisy, if one is installed; and a ``daisy`` package in the directory Python puts
before ``PYTHONPATH`` (the script's directory, the current one for ``-m``/``-c``)
shadows the shim, which ``daisy-nb run`` warns about.

In a test suite's ``conftest.py``::

    import daisy_nb.alias
    daisy_nb.alias.install()
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["SHIM_DIR", "DaisyAliasFinder", "child_env", "command_line", "install", "installed", "run_main"]

ALIAS = "daisy"
TARGET = "daisy_nb"

#: The directory to put first on ``PYTHONPATH``: it contains the ``daisy`` shim package.
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")

# importlib.machinery.ModuleSpec, the class of every module's spec (``sys``'s included), taken from
# one: ``import daisy_nb`` does not load importlib.machinery, so the alias does not either (an
# installed daisy_nb; setuptools' editable finder loads it at every interpreter start)
_ModuleSpec = type(sys.__spec__)


class _AliasLoader:
    """Hands out the already-imported ``daisy_nb...`` module for a ``daisy...`` name."""

    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):  # the target module is executed already
        pass


class DaisyAliasFinder:
    """Meta-path finder: ``daisy`` -> ``daisy_nb``, ``daisy.X.Y`` -> ``daisy_nb.X.Y`` (same module objects).

    A name daisy_nb does not have (``daisy._daisy``, a private part of the real
    daisy) is left to the other finders, so it fails with the usual ImportError.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS) :]
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as e:
            if e.name is not None and real != e.name and not real.startswith(e.name + "."):
                raise  # daisy_nb.X exists but needs something that is missing: say so
            return None
        return _ModuleSpec(fullname, _AliasLoader(module), is_package=hasattr(module, "__path__"))

    def invalidate_caches(self):
        pass


def _finder_installed() -> bool:
    return any(isinstance(f, DaisyAliasFinder) for f in sys.meta_path)


def installed() -> bool:
    """True if ``import daisy`` gives daisy_nb in this process."""
    mod = sys.modules.get(ALIAS)
    return _finder_installed() and (mod is None or mod is sys.modules.get(TARGET))


def child_env(env=None) -> dict:
    """A copy of ``env`` (default ``os.environ``) with :data:`SHIM_DIR` first on ``PYTHONPATH``."""
    from daisy_nb import config  # here: `import daisy` under the alias loads what `import daisy_nb` does

    env = dict(os.environ if env is None else env)
    parts = [p for p in env.get(config.PYTHONPATH.name, "").split(os.pathsep) if p and p != SHIM_DIR]
    env[config.PYTHONPATH.name] = os.pathsep.join([SHIM_DIR, *parts])
    return env


def _activate() -> None:
    """Install the finder and bind ``sys.modules['daisy']`` (called by the shim package)."""
    if not _finder_installed():
        sys.meta_path.insert(0, DaisyAliasFinder())
    sys.modules[ALIAS] = importlib.import_module(TARGET)


def install(children: bool = True) -> None:
    """Make ``import daisy`` (and ``daisy.<submodule>``) give daisy_nb from now on.

    With ``children=True`` (default) also put :data:`SHIM_DIR` first on
    ``os.environ["PYTHONPATH"]``, so Python processes started from here get the
    alias too. Raises ``RuntimeError`` if another ``daisy`` was imported already:
    call it before anything imports daisy (e.g. at the top of ``conftest.py``).
    """
    mod = sys.modules.get(ALIAS)
    if mod is not None and mod is not sys.modules.get(TARGET):
        where = getattr(mod, "__file__", None) or repr(mod)
        raise RuntimeError(
            f"daisy_nb.alias.install(): another 'daisy' is already imported (from {where}); "
            "install the alias before anything imports daisy"
        )
    _activate()
    if children:
        from daisy_nb import config

        os.environ[config.PYTHONPATH.name] = child_env()[config.PYTHONPATH.name]


RUN_USAGE = """usage: daisy-nb run [--dry-run] [--report FILE.html] [--] COMMAND [ARGS...]
       daisy-nb run script.py [ARGS...]      (runs it with this Python)
       daisy-nb run -m MODULE [ARGS...]       (python -m MODULE)
       daisy-nb run -c CODE [ARGS...]         (python -c CODE)

Runs COMMAND with daisy_nb standing in for daisy: `import daisy` and
`import daisy.<submodule>` give daisy_nb in COMMAND and in every Python process it
starts (the alias directory goes first on PYTHONPATH), even where daisy is installed.
The exit code is COMMAND's.

--dry-run: the program's first run_blockwise / Server.run_blockwise call prints
what the run would do (blocks, levels, done by tracking, skipped by skip_mask,
to run, memory, workers) and ends the program with exit code 0; nothing runs.

--report FILE.html   every run_blockwise of COMMAND writes a self-contained HTML
                     report there when it ends (a second run: FILE-2.html, ...)

examples:
  daisy-nb run my_pipeline.py --config c.yaml
  daisy-nb run --report run.html my_pipeline.py
  daisy-nb run pytest -x tests/
  daisy-nb run -- some-console-script --flag
  daisy-nb run --dry-run my_pipeline.py
"""


def command_line(args) -> list[str]:
    """The argv that ``daisy-nb run ARGS`` executes (``ValueError`` if there is none)."""
    args = list(args)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise ValueError("daisy-nb run: missing COMMAND")
    if args[0] in ("-m", "-c"):
        if len(args) < 2:
            raise ValueError(f"daisy-nb run: {args[0]} needs an argument")
        return [sys.executable, *args]
    if args[0].endswith((".py", ".pyw")):
        return [sys.executable, *args]
    return args


def _shadowing_daisy(cmd) -> str | None:
    """A ``daisy`` package or module in the directory Python puts before PYTHONPATH, if any."""
    if cmd[0] != sys.executable:
        return None  # another program: its sys.path is its own business
    first = cmd[1]
    where = os.getcwd() if first in ("-m", "-c") else os.path.dirname(os.path.abspath(first))
    for cand in (os.path.join(where, "daisy", "__init__.py"), os.path.join(where, "daisy.py")):
        if os.path.isfile(cand):
            return cand
    return None


def _run_options(argv: list) -> tuple[dict, list]:
    """``daisy-nb run``'s own options before COMMAND: ``({env var: value}, the rest)``."""
    from daisy_nb import config

    env = {}
    while argv and (argv[0] in ("--report", "--dry-run") or argv[0].startswith("--report=")):
        if argv[0] == "--dry-run":
            env[config.DRY_RUN.name], argv = "1", argv[1:]
            continue
        if argv[0] == "--report":
            if len(argv) < 2:
                raise ValueError("daisy-nb run: --report needs a file name")
            path, argv = argv[1], argv[2:]
        else:
            path, argv = argv[0].split("=", 1)[1], argv[1:]
        if not path:
            raise ValueError("daisy-nb run: --report needs a file name")
        env[config.REPORT.name] = os.path.abspath(path)
    return env, argv


def run_main(argv) -> int:
    """``daisy-nb run ...``: replace this process by the command (so signals and the exit code are its own)."""
    argv = list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(RUN_USAGE, end="")
        return 0
    try:  # daisy-nb run's own options come before the command
        extra_env, argv = _run_options(argv)
    except ValueError as e:
        print(f"{e}\n\n{RUN_USAGE}", end="", file=sys.stderr)
        return 2
    try:
        cmd = command_line(argv)
    except ValueError as e:
        print(f"{e}\n\n{RUN_USAGE}", end="", file=sys.stderr)
        return 2
    shadow = _shadowing_daisy(cmd)
    if shadow:
        print(
            f"daisy-nb run: warning: {shadow} comes first on sys.path of {cmd[1] if len(cmd) > 1 else cmd[0]}, "
            "so `import daisy` there finds it, not daisy_nb",
            file=sys.stderr,
        )
    env = child_env()
    env.update(extra_env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        print(f"daisy-nb run: {cmd[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"daisy-nb run: {cmd[0]}: permission denied", file=sys.stderr)
        return 126
    except OSError as e:  # e.g. exec format error
        print(f"daisy-nb run: {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return 126
    return 0  # not reached: execvpe does not return
