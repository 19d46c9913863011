"""Every environment variable daisy_nb reads or sets: its name, default, parsing and meaning.

Each variable is one :class:`Variable` constant here (``config.JIT``, ``config.HOST``...);
the code reads it with ``config.JIT.get()`` where the value is needed, so a variable read
when a run starts is read again by the next run (tests set them with ``monkeypatch``), and
the reference table of the docs (``docs/reference/environment.md``) is generated from
:data:`VARIABLES`. The rules, the same for every variable:

* unset, empty or only spaces: the default;
* a boolean is ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``, in any
  case, spaces around ignored (:func:`parse_bool`);
* a choice is one of its words, in any case;
* anything else is a ``ValueError`` that names the variable and what it accepts.

Variables that daisy_nb sets for the processes it starts (``written=True``) are written
with ``env[config.CONTEXT.name] = ...``, and read here like the others where they are read.
A process forked from the worker template takes its whole environment with
:func:`replace_environment`.

Standard library only: worker processes and ``Client`` programs import this.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = [
    "FALSE_WORDS",
    "TRUE_WORDS",
    "VARIABLES",
    "Variable",
    "parse_bool",
    "replace_environment",
]

T = TypeVar("T")

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(raw: str, name: str) -> bool:
    """``raw`` (the value of variable ``name``) as a boolean: the one rule of every boolean variable.

    Parameters
    ----------
    raw : str
        The variable's value; case and surrounding spaces do not matter.
    name : str
        The variable's name, for the error message.

    Returns
    -------
    bool
        True for ``1``/``true``/``yes``/``on``, False for ``0``/``false``/``no``/``off``.

    Raises
    ------
    ValueError
        Any other value; the message names the variable.
    """
    v = raw.strip().lower()
    if v in TRUE_WORDS:
        return True
    if v in FALSE_WORDS:
        return False
    raise ValueError(f"{name} must be a boolean ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}), got {raw!r}")


def replace_environment(env: dict[str, str]) -> None:
    """Make ``os.environ`` (and the C library's environment) exactly ``env``, by its differences.

    A block worker forked from the worker template (``runtime/local/_zygote.py``) takes the
    environment an exec'd worker would get: the template's, plus its ``DAISY_CONTEXT``. Every
    page of the template's memory the worker writes is copied into it, so only what differs is
    written (emptying and refilling the environment rewrote every variable: ~150 pages, ~0.7 ms
    of the worker's ~4 ms start)."""
    for k in [k for k in os.environ if k not in env]:
        del os.environ[k]
    for k, v in env.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


def _text(raw: str, name: str) -> str | None:
    return raw


def _choice(*words: str, aliases: dict[str, str] | None = None) -> Callable[[str, str], str]:
    """A parser of one of ``words`` (or an alias of one), in any case."""
    table = {w: w for w in words} | (aliases or {})

    def parse(raw: str, name: str) -> str:
        v = raw.strip().lower()
        if v not in table:
            raise ValueError(f"{name} must be one of {', '.join(words)}, got {raw!r}")
        return table[v]

    return parse


def _seconds(*, zero: bool, finite: bool = True, unit: str = "seconds") -> Callable[[str, str], float]:
    """A parser of a number ``> 0`` (``>= 0`` with ``zero``), finite unless ``finite=False``."""
    bound = ">= 0" if zero else "> 0"

    def parse(raw: str, name: str) -> float:
        try:
            v = float(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number of {unit} ({bound}), got {raw!r}") from None
        if v != v or v < 0 or (v == 0 and not zero) or (finite and v == float("inf")):  # v != v: NaN
            raise ValueError(f"{name} must be a {'finite ' if finite else ''}number of {unit} {bound}, got {raw!r}")
        return v

    return parse


class Variable(Generic[T]):
    """One environment variable: its name, default, parsing and meaning.

    Parameters
    ----------
    name : str
        The variable's name.
    default : object
        The value when the variable is unset, empty or only spaces.
    parse : callable
        ``parse(raw, name)``: the value of a set variable; raises ``ValueError``
        naming the variable for a value it does not accept.
    shown_default : str
        The default as the reference table shows it.
    meaning : str
        One paragraph (Markdown) for the reference table.
    owner : str
        ``"daisy_nb"``, or whose variable it is when daisy_nb only honours it
        (``"daisy"``: daisy's own, meaning what it means there; ``"numba"``; ``"python"``).
    written : bool
        daisy_nb also sets it for the processes it starts.
    """

    __slots__ = ("default", "meaning", "name", "owner", "parse", "shown_default", "written")

    def __init__(
        self,
        name: str,
        default: T,
        parse: Callable[[str, str], T],
        shown_default: str,
        meaning: str,
        owner: str = "daisy_nb",
        written: bool = False,
    ) -> None:
        self.name = name
        self.default = default
        self.parse = parse
        self.shown_default = shown_default
        self.meaning = meaning
        self.owner = owner
        self.written = written

    def __repr__(self) -> str:
        return f"<Variable {self.name} (default {self.shown_default})>"

    def raw(self) -> str | None:
        """The variable's value now, or None when it is unset, empty or only spaces."""
        v = os.environ.get(self.name)
        return None if v is None or not v.strip() else v

    def get(self) -> T:
        """The parsed value now (read at each call), else :attr:`default`.

        Raises
        ------
        ValueError
            The variable holds a value it does not accept; the message names it.
        """
        raw = self.raw()
        return self.default if raw is None else self.parse(raw, self.name)


def _bool(name: str, default: bool, meaning: str, *, written: bool = False) -> Variable[bool]:
    return Variable(name, default, parse_bool, "1" if default else "0", meaning, written=written)


# -- the compiled kernels ---------------------------------------------------------------
JIT: Variable[str] = Variable(
    "DAISY_NB_JIT",
    "auto",
    _choice(
        "auto",
        "numba",
        "python",
        aliases={**dict.fromkeys(TRUE_WORDS, "numba"), "compiled": "numba", **dict.fromkeys(FALSE_WORDS, "python")},
    ),
    "auto",
    "how the kernels run: a false value (`0`, or `python`) always as plain Python (numba is never "
    "imported); a true value (`1`, or `numba`) always compiled; `auto`: plain Python until compiling pays "
    "off. Read when the kernels are first imported.",
)
CACHE = _bool(
    "DAISY_NB_CACHE",
    True,
    "false: numba's on-disk cache of the kernels is off (every process compiles). Read when the kernels "
    "are first imported.",
)
NUMBA_CACHE_DIR: Variable[str | None] = Variable(
    "NUMBA_CACHE_DIR",
    None,
    _text,
    "numba's",
    "numba's own variable: where compiled kernels are cached. When it is set, daisy_nb leaves the "
    "removal of stale cached kernels to its owner.",
    owner="numba",
)

# -- a run ------------------------------------------------------------------------------
HOST: Variable[str | None] = Variable(
    "DAISY_HOST",
    None,
    _text,
    "unset: detect",
    "the address the scheduler advertises to workers, as `run_blockwise(host=)` (which wins when both "
    "are given; daisy's variable). A loopback address keeps the scheduler private to this machine.",
    owner="daisy",
)
DRY_RUN = _bool(
    "DAISY_NB_DRY_RUN",
    False,
    "true: the program's first `run_blockwise` prints its plan and exits with 0 instead of running "
    "(set by `daisy-nb run --dry-run`).",
    written=True,
)
REPORT: Variable[str | None] = Variable(
    "DAISY_NB_REPORT",
    None,
    _text,
    "unset",
    "a path: every `run_blockwise` of the program writes its HTML run report there (`run-2.html` for "
    "a second run; set by `daisy-nb run --report`). `run_blockwise(report=)` wins.",
    written=True,
)
LOG_DIR: Variable[str | None] = Variable(
    "DAISY_NB_LOG_DIR",
    None,
    _text,
    "unset (`./daisy_logs`)",
    "a directory: where the worker logs go (`<dir>/<task_id>/worker_<n>.out` and `.err`) while the "
    "program has not chosen one; read when a run starts. `daisy.logging.set_log_basedir()` and "
    "`run_blockwise(log_dir=)` win.",
)
HANG_SECS: Variable[float] = Variable(
    "DAISY_NB_HANG_SECS",
    60.0,
    _seconds(zero=True, finite=False),
    "60",
    "the hang alarm's floor in seconds; `0` turns the alarm off. `run_blockwise(hang_alarm=)` wins.",
)
HANG_FACTOR: Variable[float] = Variable(
    "DAISY_NB_HANG_FACTOR",
    10.0,
    _seconds(zero=True, finite=False, unit="median block times"),
    "10",
    "the hang alarm's threshold in median block times. `run_blockwise(hang_alarm=)` wins.",
)
DASHBOARD_TOKEN: Variable[str | None] = Variable(
    "DAISY_NB_DASHBOARD_TOKEN",
    None,
    _text,
    "unset: random",
    "the access token of every dashboard given none (`dashboard=True` included); `off` turns the token "
    "off (a warning).",
)
TRACKING_IO: Variable[str] = Variable(
    "DAISY_NB_TRACKING_IO",
    "auto",
    _choice("auto", "mmap", "pwrite"),
    "auto",
    "`mmap` or `pwrite` forces block tracking's write path; `auto` picks it from the file system.",
)

# -- the pool's worker processes ----------------------------------------------------------
EARLY_TEMPLATE = _bool(
    "DAISY_NB_EARLY_TEMPLATE",
    True,
    "false: the worker template starts at the first worker instead of before the Scheduler is built.",
)


def _memory_dir(raw: str, name: str) -> str | None:
    """A directory, ``""`` for the default one (a true word), or None (a false word: off)."""
    v = raw.strip()
    if v.lower() in TRUE_WORDS:
        return ""
    if v.lower() in FALSE_WORDS:
        return None
    return os.path.expanduser(v)


IMPORT_MEMORY: Variable[str | None] = Variable(
    "DAISY_NB_IMPORT_MEMORY",
    "",
    _memory_dir,
    "1 (`~/.cache/daisy_nb/imports`)",
    "where the worker template remembers, from one run of a program to the next, which installed "
    "modules each task's workers imported, so that it loads them before forking that task's workers "
    "(`docs/explanation/pool.md#workers`): a directory, `1` for the default one, or `0`/`false`/`no`/`off` "
    "to remember nothing.",
)

WORKER_START: Variable[str] = Variable(
    "DAISY_NB_WORKER_START",
    "fork",
    _choice("fork", "exec"),
    "fork",
    "`exec` starts every block worker as a fresh interpreter instead of forking it from the worker template.",
)


def _mib(raw: str, name: str) -> int:
    """A whole number of MiB from 0 to 2047 (what glibc's ``mallopt`` takes, in bytes, as an ``int``)."""
    try:
        v = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be a whole number of MiB from 0 to 2047, got {raw!r}") from None
    if not 0 <= v <= 2047:
        raise ValueError(f"{name} must be a whole number of MiB from 0 to 2047, got {raw!r}")
    return v


WORKER_HEAP_MIB: Variable[int] = Variable(
    "DAISY_NB_WORKER_HEAP_MIB",
    64,
    _mib,
    "64",
    "MiB of freed memory a local block worker keeps at the top of its heap for its next block, instead "
    "of giving it back to the system and faulting it in again (glibc's `M_TOP_PAD`; "
    "`docs/explanation/pool.md#heap`); `0` leaves malloc as it is. Linux with glibc only.",
)
REUSE_WORKERS: Variable[str] = Variable(
    "DAISY_NB_REUSE_WORKERS",
    "same",
    _choice("same", "any", "off", aliases={w: "off" for w in FALSE_WORDS} | {w: "same" for w in TRUE_WORDS}),
    "same",
    "Which task a local block worker with nothing left in its task may serve next: `same` another task "
    "that runs the same block function (the same `requires`, dimensions and tracking); `any` any such task, "
    "whatever its function; `off` none (every task's workers are new processes, as with daisy).",
)
PYTHONPATH: Variable[str | None] = Variable(
    "PYTHONPATH",
    None,
    _text,
    "Python's",
    "Python's own variable. daisy_nb puts its own directory first in it for its worker processes, and "
    "`daisy-nb run` puts the `daisy` alias directory first for the program it runs.",
    owner="python",
    written=True,
)

# -- Client connections (read by the scheduler, sent to the jobs in DAISY_CONTEXT) ---------
CONTEXT: Variable[str | None] = Variable(
    "DAISY_CONTEXT",
    None,
    _text,
    "set by the scheduler",
    "the address, port, task id, worker id and run secret a worker or `Client` program connects with "
    "(`k=v:k=v`; daisy's variable). Put in the environment of every worker function and inherited by "
    "the programs it starts.",
    owner="daisy",
    written=True,
)
AUTH_TIMEOUT_SECS: Variable[float] = Variable(
    "DAISY_NB_AUTH_TIMEOUT_SECS",
    5.0,
    _seconds(zero=False),
    "5",
    "seconds a connecting job has to complete its handshake.",
)
HEARTBEAT_SECS: Variable[float] = Variable(
    "DAISY_NB_HEARTBEAT_SECS",
    5.0,
    _seconds(zero=False),
    "5",
    "seconds between heartbeats on `Client` connections (both ways).",
)
PEER_TIMEOUT_SECS: Variable[float] = Variable(
    "DAISY_NB_PEER_TIMEOUT_SECS",
    30.0,
    _seconds(zero=False),
    "30",
    "seconds of silence after which either end of a `Client` connection counts the other as gone "
    "(must exceed the heartbeat).",
)
EXIT_WITH_RUN = _bool(
    "DAISY_NB_EXIT_WITH_RUN",
    True,
    "false: a `Client` program is not ended with its run; its loop ends at the next `acquire_block`. "
    "`Client(exit_with_run=)` wins.",
)
EXIT_GRACE_SECS: Variable[float] = Variable(
    "DAISY_NB_EXIT_GRACE_SECS",
    3.0,
    _seconds(zero=True),
    "3",
    "seconds a `Client` program may live after its run ended before it exits with 130.",
)


# -- batch systems (read by a Client program, never set) ------------------------------------
def _epoch(raw: str, name: str) -> float:
    """A point in time as UNIX epoch seconds (a finite number > 0)."""
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a time in UNIX epoch seconds, got {raw!r}") from None
    if not 0 < v < float("inf"):  # NaN fails both
        raise ValueError(f"{name} must be a time in UNIX epoch seconds (a finite number > 0), got {raw!r}")
    return v


SLURM_JOB_END_TIME: Variable[float | None] = Variable(
    "SLURM_JOB_END_TIME",
    None,
    _epoch,
    "set by SLURM",
    "SLURM's own variable in a batch job: when the job's time limit ends (UNIX epoch seconds). A "
    "`Client` made in such a job sends it to the scheduler, which hands the job no block it is "
    "unlikely to finish before then (less than twice the task's median block time left) and tells "
    "it to end instead. `Client(end_time=)` wins.",
    owner="slurm",
)

#: Every variable, by name.
VARIABLES: dict[str, Variable] = {v.name: v for v in list(globals().values()) if isinstance(v, Variable)}
