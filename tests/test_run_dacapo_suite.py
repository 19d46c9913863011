"""benchmarks/run_dacapo_suite.py on a tiny stand-in checkout (CI has no dacapo checkout).

As in test_run_daisy_suite.py, the reference side is this very Python (no daisy
installed), where ``import daisy`` fails, so the comparison has a known answer. Here the
outcomes come from junit xml: each skipped test counts once, by its own id.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "run_dacapo_suite.py"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def checkout(tmp_path):
    tests = tmp_path / "tests" / "operations"
    tests.mkdir(parents=True)
    (tests / "test_train.py").write_text(
        textwrap.dedent(
            """
            import os
            import pytest

            @pytest.mark.parametrize("store", ["files", "mongo"])
            def test_large(store):
                if store == "mongo":
                    pytest.skip("MongoDB not available!")
                import daisy
                task = daisy.Task("predict_/data/run1/pred.zarr_prediction", daisy.Roi((0,), (4,)),
                                  daisy.Roi((0,), (2,)), daisy.Roi((0,), (2,)), process_function=lambda b: None)
                assert daisy.run_blockwise([task])
                open("wrote_here", "w").close()

            class TestGroup:
                def test_in_class(self):
                    assert os.path.exists("tests/operations/test_train.py")
            """
        )
    )
    return tmp_path


def test_compares_both_sides_by_junit_xml(checkout, tmp_path):
    logs = tmp_path / "logs"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(checkout), "--daisy-python", sys.executable, "--log-dir", str(logs)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "1 passed, 1 failed, 1 skipped, 0 error" in out  # the reference side (no daisy)
    assert "2 passed, 0 failed, 1 skipped, 0 error" in out  # daisy_nb
    assert "| tests/operations/test_train.py | 1/3 | 2/3 |" in out
    assert "tests/operations/test_train.py::test_large[files]: daisy 2.0.0 FAILED, daisy_nb PASSED" in out
    assert "tests/operations/test_train.py::TestGroup::test_in_class" not in out  # same outcome on both
    assert "passed on daisy 2.0.0 but not on daisy_nb: 0" in out
    assert (logs / "daisy_nb.xml").exists() and (logs / "daisy2.txt").exists()
    # each side ran in a scratch copy: the checkout itself got no files
    assert not (checkout / "wrote_here").exists() and not (checkout / "daisy_logs").exists()


def test_bad_checkout_path(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "no tests/ directory" in r.stderr
