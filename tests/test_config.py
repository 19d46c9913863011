"""``daisy_nb.config``: every environment variable in one module, one rule for booleans.

The rule (``docs/reference/environment.md``): unset, empty or spaces is the default; a
boolean is 1/true/yes/on or 0/false/no/off in any case; a choice is one of its words; anything
else is a ``ValueError`` naming the variable. Here: the rule itself, each variable's default
and parsing, that the library reads them when they are used (through the functions that use
them), that a few still have their effect in a real program, and that no code reads the
environment outside the module (the grep the docs build runs).
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daisy_nb import config
from daisy_nb.config import FALSE_WORDS, TRUE_WORDS, parse_bool

ROOT = Path(__file__).resolve().parents[1]

BOOLEANS = {
    "DAISY_NB_CACHE": True,
    "DAISY_NB_DRY_RUN": False,
    "DAISY_NB_EARLY_TEMPLATE": True,
    "DAISY_NB_EXIT_WITH_RUN": True,
}
# name -> (default, [(value, parsed)], [bad values])
TABLE: dict[str, tuple[object, list[tuple[str, object]], list[str]]] = {
    "DAISY_NB_JIT": (
        "auto",
        [
            ("auto", "auto"),
            ("0", "python"),
            ("False", "python"),
            ("off", "python"),
            ("python", "python"),
            ("1", "numba"),
            ("YES", "numba"),
            ("on", "numba"),
            ("numba", "numba"),
            ("compiled", "numba"),
            (" Auto ", "auto"),
        ],
        ["2", "fast", "pythonic"],
    ),
    "DAISY_NB_TRACKING_IO": ("auto", [("mmap", "mmap"), ("PWRITE", "pwrite"), (" auto", "auto")], ["fast", "1"]),
    "DAISY_NB_WORKER_START": ("fork", [("exec", "exec"), ("Fork", "fork")], ["spawn", "0"]),
    "DAISY_NB_WORKER_HEAP_MIB": (64, [("0", 0), (" 16 ", 16), ("2047", 2047)], ["-1", "2048", "1.5", "lots"]),
    "DAISY_NB_REUSE_WORKERS": (
        "same",
        [("same", "same"), ("ANY", "any"), ("off", "off"), ("0", "off"), ("no", "off"), ("1", "same")],
        ["2", "never", "all"],
    ),
    "DAISY_NB_HANG_SECS": (60.0, [("0", 0.0), ("2.5", 2.5), ("inf", math.inf)], ["soon", "-1", "nan"]),
    "DAISY_NB_HANG_FACTOR": (10.0, [("0", 0.0), ("20", 20.0)], ["x", "-0.5"]),
    "DAISY_NB_AUTH_TIMEOUT_SECS": (5.0, [("0.3", 0.3), ("20", 20.0)], ["0", "-1", "inf", "nan", "soon"]),
    "DAISY_NB_HEARTBEAT_SECS": (5.0, [("0.25", 0.25)], ["0", "inf", "x"]),
    "DAISY_NB_PEER_TIMEOUT_SECS": (30.0, [("1", 1.0)], ["0", "inf", "soon"]),
    "DAISY_NB_EXIT_GRACE_SECS": (3.0, [("0", 0.0), ("0.5", 0.5)], ["-1", "inf", "nan", "later"]),
    "DAISY_HOST": (None, [("127.0.0.3", "127.0.0.3")], []),
    "DAISY_CONTEXT": (None, [("a=1:b=2", "a=1:b=2")], []),
    "DAISY_NB_REPORT": (None, [("/tmp/r.html", "/tmp/r.html")], []),
    "DAISY_NB_LOG_DIR": (None, [("/tmp/logs", "/tmp/logs"), ("logs", "logs")], []),
    "DAISY_NB_DASHBOARD_TOKEN": (None, [("off", "off"), ("tok-1", "tok-1")], []),
    "NUMBA_CACHE_DIR": (None, [("/tmp/c", "/tmp/c")], []),
    # a directory, a true word for the default one (""), a false word for none
    "DAISY_NB_IMPORT_MEMORY": ("", [("1", ""), (" On ", ""), ("0", None), ("OFF", None), ("/tmp/m", "/tmp/m")], []),
    "PYTHONPATH": (None, [("/a:/b", "/a:/b")], []),
    "SLURM_JOB_END_TIME": (None, [("1767225600", 1767225600.0), (" 1.5 ", 1.5)], ["0", "-5", "inf", "nan", "soon"]),
}
for _name, _default in BOOLEANS.items():
    TABLE[_name] = (
        _default,
        [("1", True), ("TRUE", True), ("0", False), (" no ", False), ("Off", False)],
        ["2", "maybe"],
    )


def _load_hook():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "_hooks" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


# ---------------------------------------------------------------- the boolean rule
def _cased(word: str):
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda ups: "".join(c.upper() if u else c for c, u in zip(word, ups))
    )


_SPACES = st.sampled_from(["", " ", "\t", "  "])


@given(
    st.one_of(
        st.sampled_from(TRUE_WORDS + FALSE_WORDS).flatmap(_cased),
        st.text(max_size=8),
    ),
    _SPACES,
    _SPACES,
)
def test_boolean_rule(word, before, after):
    raw = before + word + after
    key = word.strip().lower()
    if key in TRUE_WORDS:
        assert parse_bool(raw, "SOME_VAR") is True
    elif key in FALSE_WORDS:
        assert parse_bool(raw, "SOME_VAR") is False
    else:
        with pytest.raises(ValueError, match="SOME_VAR") as e:
            parse_bool(raw, "SOME_VAR")
        assert repr(raw) in str(e.value)


@pytest.mark.parametrize("raw", ["", "y", "n", "t", "f", "2", "-1", "enabled", "truee", "o n"])
def test_boolean_rule_rejects(raw):
    with pytest.raises(ValueError, match="SOME_VAR must be a boolean"):
        parse_bool(raw, "SOME_VAR")


# ---------------------------------------------------------------- every variable
def test_the_table_covers_every_variable():
    assert set(TABLE) == set(config.VARIABLES)
    for name, var in config.VARIABLES.items():
        assert var.name == name and var.meaning and var.shown_default
        assert var.owner in ("daisy_nb", "daisy", "numba", "python", "slurm")
        assert name.startswith("DAISY_NB_") == (var.owner == "daisy_nb")


@pytest.mark.parametrize("name", sorted(TABLE))
def test_default_parsing_and_bad_values(name, monkeypatch):
    var = config.VARIABLES[name]
    default, good, bad = TABLE[name]
    monkeypatch.delenv(name, raising=False)
    assert var.get() == default and var.default == default
    for empty in ("", "  "):  # empty or spaces: as unset
        monkeypatch.setenv(name, empty)
        assert var.raw() is None and var.get() == default
    for raw, want in good:
        monkeypatch.setenv(name, raw)
        assert var.get() == want, raw
    for raw in bad:
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError, match=name) as e:
            var.get()
        assert repr(raw) in str(e.value)


# ---------------------------------------------------------------- read where used, at call time
def test_call_time_reads_in_the_library(monkeypatch):
    """Each function that reads a variable sees a change made after import (tests monkeypatch)."""
    from daisy_nb import plan
    from daisy_nb.dashboard import resolve_token
    from daisy_nb.hang import resolve_hang_alarm
    from daisy_nb.runtime.local import _zygote
    from daisy_nb.runtime.net import liveness
    from daisy_nb.runtime.net.client import _exit_settings
    from daisy_nb.runtime.net.context import Context
    from daisy_nb.tracking import _io

    monkeypatch.setenv("DAISY_NB_DRY_RUN", "Yes")
    assert plan.requested() is True
    monkeypatch.setenv("DAISY_NB_DRY_RUN", "false")  # was a dry run before the one rule
    assert plan.requested() is False

    monkeypatch.setenv("DAISY_NB_HANG_SECS", "7")
    monkeypatch.setenv("DAISY_NB_HANG_FACTOR", "3")
    assert tuple(resolve_hang_alarm(None)) == (7.0, 3.0)
    monkeypatch.setenv("DAISY_NB_HANG_SECS", "0")
    assert resolve_hang_alarm(None) is None

    monkeypatch.setenv("DAISY_NB_EXIT_WITH_RUN", "OFF")
    monkeypatch.setenv("DAISY_NB_EXIT_GRACE_SECS", "0.5")
    assert _exit_settings(None) == (False, 0.5)
    assert _exit_settings(True) == (True, 0.5)  # the argument wins

    monkeypatch.setenv("DAISY_NB_HEARTBEAT_SECS", "0.5")
    monkeypatch.setenv("DAISY_NB_PEER_TIMEOUT_SECS", "2")
    monkeypatch.delenv("DAISY_NB_AUTH_TIMEOUT_SECS", raising=False)
    assert liveness.liveness() == {"auth": 5.0, "heartbeat": 0.5, "peer_timeout": 2.0}
    ctx = Context(heartbeat="1", peer_timeout="4")  # the scheduler's settings win in a job
    assert liveness.liveness(ctx) == {"auth": 5.0, "heartbeat": 1.0, "peer_timeout": 4.0}
    with pytest.raises(ValueError, match="DAISY_CONTEXT key 'heartbeat'"):
        liveness.liveness(Context(heartbeat="soon"))

    monkeypatch.setenv("DAISY_NB_TRACKING_IO", "PWrite")
    assert _io.requested_mode() == "pwrite"

    monkeypatch.setenv("DAISY_NB_WORKER_START", "exec")
    assert _zygote.available() is False
    monkeypatch.setenv("DAISY_NB_WORKER_START", "vfork")
    with pytest.raises(ValueError, match="DAISY_NB_WORKER_START"):
        _zygote.available()

    monkeypatch.setenv("DAISY_NB_DASHBOARD_TOKEN", "off")
    assert resolve_token(None) is None
    monkeypatch.setenv("DAISY_NB_DASHBOARD_TOKEN", "t0k")
    assert resolve_token(None) == "t0k"

    from daisy_nb import logging as dlog

    monkeypatch.setattr(dlog, "LOG_BASEDIR", dlog._DEFAULT_BASEDIR)  # the program chose none
    monkeypatch.setenv("DAISY_NB_LOG_DIR", "/tmp/one")
    assert dlog.get_log_basedir() == Path("/tmp/one") and Context()["logdir"] == "/tmp/one"
    monkeypatch.setenv("DAISY_NB_LOG_DIR", " ")
    assert dlog.get_log_basedir() == Path("daisy_logs")
    dlog.set_log_basedir("daisy_logs")  # chosen, even if equal to the default: it wins
    monkeypatch.setenv("DAISY_NB_LOG_DIR", "/tmp/one")
    assert dlog.get_log_basedir() == Path("daisy_logs")

    monkeypatch.setenv("DAISY_CONTEXT", "a=1:b=x")
    assert dict(Context.from_env().items()) == {"a": "1", "b": "x"}
    monkeypatch.setenv("DAISY_CONTEXT", "")
    with pytest.raises(KeyError, match="DAISY_CONTEXT"):
        Context.from_env()


def test_bad_values_stop_a_run_before_it_starts(monkeypatch, tmp_path):
    import daisy_nb as daisy
    from daisy_nb import Roi

    ran = []
    task = daisy.Task("t", Roi((0,), (4,)), Roi((0,), (1,)), Roi((0,), (1,)), process_function=ran.append)
    for name, raw in [
        ("DAISY_NB_DRY_RUN", "perhaps"),
        ("DAISY_NB_HANG_FACTOR", "-2"),
        ("DAISY_NB_EARLY_TEMPLATE", "x"),
        ("DAISY_NB_WORKER_HEAP_MIB", "64M"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(name, raw)
            with pytest.raises(ValueError, match=name):
                local = name in ("DAISY_NB_EARLY_TEMPLATE", "DAISY_NB_WORKER_HEAP_MIB")
                daisy.run_blockwise([task], multiprocessing=local, progress=False)
    assert ran == []


# ---------------------------------------------------------------- effects in a real program
def _program(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("DAISY_NB_JIT", "DAISY_NB_DRY_RUN")}
    full["PYTHONPATH"] = str(ROOT)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=full,
        timeout=300,
    )


_SMALL_RUN = """
    import sys
    import daisy_nb as daisy
    from daisy_nb import Roi
    done = []
    task = daisy.Task("s", Roi((0,), (64,)), Roi((0,), (8,)), Roi((0,), (8,)), process_function=done.append)
    ok = daisy.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
    print(ok, len(done), "numba" in sys.modules)
"""


@pytest.mark.parametrize("off", ["0", "false", "OFF", "python"])
def test_jit_off_keeps_numba_unloaded(tmp_path, off):
    r = _program(_SMALL_RUN, tmp_path, DAISY_NB_JIT=off)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-3:] == ["True", "8", "False"]


def test_jit_bad_value_is_an_error_naming_it(tmp_path):
    r = _program(_SMALL_RUN, tmp_path, DAISY_NB_JIT="fast")
    assert r.returncode == 1
    assert "ValueError: DAISY_NB_JIT must be one of auto, numba, python, got 'fast'" in r.stderr


@pytest.mark.parametrize(("value", "dry"), [("1", True), ("yes", True), ("On", True), ("0", False), ("no", False)])
def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, value, dry):
    r = _program(_SMALL_RUN, tmp_path, DAISY_NB_JIT="0", DAISY_NB_DRY_RUN=value)
    assert r.returncode == 0, r.stderr[-3000:]
    if dry:
        assert "to run" in r.stdout and "True 8" not in r.stdout  # the plan's table; no block ran
    else:
        assert r.stdout.split()[-3:] == ["True", "8", "False"]


_FAILING_RUNS = """
    import os
    import daisy_nb as daisy
    from daisy_nb import Roi

    def fail(block):
        raise RuntimeError(f"logged failure of block {block.block_id[1]}")

    def run(name, **kw):
        task = daisy.Task(name, Roi((0,), (2,)), Roi((0,), (1,)), Roi((0,), (1,)), process_function=fail,
                          max_retries=0)
        daisy.run_blockwise([task], progress=False, summary=False, **kw)

    run("env")  # no log directory chosen: DAISY_NB_LOG_DIR
    run("arg", log_dir="{explicit}")  # the argument wins
    os.environ["DAISY_NB_LOG_DIR"] = "{later}"
    run("again")  # after it, the variable decides again, read when the run starts
"""


def test_log_dir_variable_routes_worker_logs(tmp_path, monkeypatch):
    """Worker logs of a program that chooses no directory go to DAISY_NB_LOG_DIR, not ./daisy_logs;
    ``run_blockwise(log_dir=)`` wins for its run only; the commands' default ``--logs`` is that
    directory (``daisy-nb status`` reading it: tests/test_errors.py)."""
    cwd, env_dir, explicit, later = (tmp_path / d for d in ("cwd", "env_logs", "explicit", "later"))
    cwd.mkdir()
    code = _FAILING_RUNS.replace("{explicit}", str(explicit)).replace("{later}", str(later))
    r = _program(code, cwd, DAISY_NB_LOG_DIR=str(env_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [[p.name for p in d.iterdir()] for d in (env_dir, explicit, later)] == [["env"], ["arg"], ["again"]]
    for logs, task in ((env_dir, "env"), (explicit, "arg"), (later, "again")):
        err = "".join(p.read_text() for p in (logs / task).glob("worker_*.err"))
        assert "logged failure of block 0" in err and "logged failure of block 1" in err, (task, err)
    assert list(cwd.iterdir()) == []  # no ./daisy_logs

    from daisy_nb import logging as dlog

    monkeypatch.setattr(dlog, "LOG_BASEDIR", dlog._DEFAULT_BASEDIR)
    monkeypatch.setenv("DAISY_NB_LOG_DIR", str(env_dir))
    assert dlog.existing_log_basedir() == str(env_dir)  # the commands' default --logs
    monkeypatch.setenv("DAISY_NB_LOG_DIR", str(tmp_path / "missing"))
    assert dlog.existing_log_basedir() is None


def test_config_imports_only_the_standard_library(tmp_path):
    r = _program(
        "import sys, daisy_nb.config; print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'numba'}))",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ---------------------------------------------------------------- no read outside the module
def test_no_environment_read_outside_the_module():
    used, problems = _load_hook().scan_environment()
    assert problems == []
    assert set(used) == {k for k, v in vars(config).items() if isinstance(v, config.Variable)}


def test_the_grep_finds_reads_outside_the_module(tmp_path):
    """The check fails on the reads it exists for, and lets the allowed forms through."""
    pkg = tmp_path / "daisy_nb"
    pkg.mkdir()
    (pkg / "ok.py").write_text(
        "import os\nfrom daisy_nb import config\n"
        + "".join(f"x = config.{c}.get()\n" for c, v in vars(config).items() if isinstance(v, config.Variable))
        + "env = dict(os.environ)\nchild = {**os.environ, 'A': '1'}\n"
        "os.environ[config.PYTHONPATH.name] = '/x'\n"
        '"""A copy of ``os.environ`` for a child."""\n'
    )
    gen = _load_hook()
    assert gen.scan_environment(tmp_path)[1] == []
    (pkg / "bad.py").write_text(
        "import os\n"
        "a = os.environ.get('HOME')\n"
        "b = os.getenv('DAISY_NB_SOMETHING_NEW')\n"
        "c = os.environ['PATH']\n"
        "if os.environ[config.JIT.name] == '1': pass\n"
    )
    problems = gen.scan_environment(tmp_path)[1]
    reads = [p.split(":")[1] for p in problems if "reads the environment" in p]
    assert reads == ["2", "3", "4", "5"]
    assert any("DAISY_NB_SOMETHING_NEW is not declared" in p for p in problems)
    assert not any("written" in p for p in problems)
    (pkg / "bad.py").write_text("env = {}\nenv[config.HANG_SECS.name] = '5'\n")  # a write it does not declare
    assert gen.scan_environment(tmp_path)[1] == [
        "daisy_nb/bad.py: sets DAISY_NB_HANG_SECS, which daisy_nb/config.py does not declare written"
    ]
