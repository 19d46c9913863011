"""Shared test set-up: import paths, hypothesis profiles, JIT warm-up."""

import atexit
import os
import shutil
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (HERE, os.path.join(HERE, "golden"), os.path.join(HERE, "workers")):
    if p not in sys.path:
        sys.path.insert(0, p)

# runs started by the tests remember no imports in the user's cache (tests/test_import_memory.py
# points the memory at a temporary directory where it tests it)
os.environ.setdefault("DAISY_NB_IMPORT_MEMORY", "0")

# dask.distributed's workers keep their scratch space under dask's temporary directory and leave
# its lock files there when they close: the session's own (removed at its end), not
# /tmp/dask-scratch-space. Set before any test module imports dask, which reads it once.
_DASK_TMP = tempfile.mkdtemp(prefix="daisy_nb-tests-dask-")
os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", _DASK_TMP)
# removed at the session's end, and at exit when no session ran (a usage error stops pytest
# after this module was imported, before any fixture)
atexit.register(shutil.rmtree, _DASK_TMP, ignore_errors=True)

# deadline=None: the first example of a test may pay for JIT compilation
settings.register_profile("default", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


@pytest.fixture(scope="session", autouse=True)
def _warm_kernels(tmp_path_factory):
    from daisy_nb import config
    from daisy_nb import logging as dlog
    from daisy_nb.kernels import _jit
    from daisy_nb.warmup import warmup

    # Tests run the kernels compiled unless DAISY_NB_JIT says otherwise: `DAISY_NB_JIT=0`
    # runs them as plain Python (.ci/run does that for the kernel and scheduler tests);
    # the automatic choice has its own tests (tests/test_jit.py).
    if "DAISY_NB_JIT" not in os.environ:
        _jit.set_mode("numba")
    warmup()
    # worker logs of runs that do not choose a log directory go to a temp dir, not
    # ./daisy_logs in the checkout: this process's runs and those of the programs the
    # tests start (DAISY_NB_LOG_DIR, which they inherit)
    logs = tmp_path_factory.mktemp("daisy_logs")
    os.environ[config.LOG_DIR.name] = str(logs)
    dlog.set_log_basedir(logs)


@pytest.fixture(scope="session", autouse=True)
def _dask_tmp():
    yield
    shutil.rmtree(_DASK_TMP, ignore_errors=True)


@pytest.fixture
def no_leaks():
    """No child process or shared-memory segment of the test outlives it."""
    import harness

    before_c, before_s = harness.children(), harness.shm_segments()
    yield
    harness.assert_no_leaks(before_c, before_s)


@pytest.fixture
def hand_outs(monkeypatch):
    """The TCP hand-out cores (:class:`daisy_nb.runtime.net.handout.HandOut`) that the test's runs
    create, in order: what they counted (``counts``) and their state, read after a run."""
    from daisy_nb.runtime.net import server
    from daisy_nb.runtime.net.handout import HandOut

    cores: list = []

    class Seen(HandOut):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            cores.append(self)

    monkeypatch.setattr(server, "HandOut", Seen)
    return cores


@pytest.fixture
def out(tmp_path, monkeypatch):
    """The directory the block functions of ``tests/workers`` write to (``DAISY_NB_TEST_OUT``);
    worker logs go to ``tmp_path / "logs"``."""
    import daisy_nb.logging as dlog

    d = tmp_path / "out"
    d.mkdir()
    monkeypatch.setenv("DAISY_NB_TEST_OUT", str(d))
    old = dlog.get_log_basedir()
    dlog.set_log_basedir(tmp_path / "logs")
    yield d
    dlog.set_log_basedir(old)
