"""benchmarks/run_daisy_suite.py on a tiny stand-in checkout (CI has no daisy checkout).

The stand-in's tests import ``daisy`` inside the test bodies: under ``daisy-nb run``
that is daisy_nb; with plain pytest (the "reference" side here, this very Python,
where no daisy is installed) the import fails. So the comparison has a known answer.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "run_daisy_suite.py"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def checkout(tmp_path):
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "test_surface.py").write_text(
        textwrap.dedent(
            """
            def test_is_daisy_nb():
                import daisy
                assert daisy.__name__ == "daisy_nb"

            def test_server_exists():
                import daisy
                assert daisy.Server().port is None

            def test_always_fails():
                assert False
            """
        )
    )
    (tests / "sub" / "test_more.py").write_text("def test_plain():\n    pass\n")
    # a private-internals file: left out on both sides (it would not even import)
    (tests / "test_done_marker.py").write_text("import daisy._runner\n")
    return tmp_path


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_compares_both_sides_test_by_test(checkout):
    r = _run(str(checkout), "--daisy-python", sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr  # nothing passes on the reference that fails on daisy_nb
    out = r.stdout
    assert "| tests/test_surface.py | 0/3 | 2/3 |" in out
    assert "| tests/sub/test_more.py | 1/1 | 1/1 |" in out
    assert "| **total passed** | 1 | 3 |" in out
    assert "tests whose outcome differs: 2" in out
    assert "tests/test_surface.py::test_is_daisy_nb: daisy 2.0.0 FAILED, daisy_nb PASSED" in out
    assert "passed on daisy 2.0.0 but not on daisy_nb: 0" in out
    assert "test_done_marker" not in out.split("\n", 1)[1]


def test_daisy_nb_side_alone_and_pytest_arguments(checkout):
    r = _run(str(checkout / "tests"), "--", "-k", "not always_fails")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "daisy_nb: 0 failed or errored" in r.stdout and "| **total passed** | 3 |" in r.stdout
    r = _run(str(checkout))
    assert r.returncode == 1 and "tests/test_surface.py::test_always_fails" in r.stdout


def test_bad_checkout_path(tmp_path):
    r = _run(str(tmp_path))
    assert r.returncode == 2 and "no tests/ directory" in r.stderr
