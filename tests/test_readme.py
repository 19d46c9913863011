"""The front page and the tutorials run as written (as numbagg's test_readme does).

Every ```python block of README.md, docs/tutorials/quickstart.md and docs/tutorials/pipeline.md
is executed, the blocks of one page in order in one namespace, in a temporary directory, with
the page's size line replaced by a smaller one (the substitution must match, so a renamed
variable cannot silently run the full size). The python blocks of every other docs page must at
least parse. And the front page's promises: its two set-up commands are the ones CI runs, it
stays short, the version and the licence are declared once.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)

# page -> (the line that sets its size, the smaller one the test runs)
RUNNABLE = {
    "README.md": ("size, block, context = 256, 64, 4", "size, block, context = 96, 32, 4"),
    "docs/tutorials/quickstart.md": ("size, block, context = 256, 64, 4", "size, block, context = 96, 32, 4"),
    "docs/tutorials/pipeline.md": ("size, tile = 512, 64", "size, tile = 256, 64"),
}


def python_blocks(page: str) -> list[str]:
    return BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))


@pytest.mark.mp
@pytest.mark.parametrize("page", sorted(RUNNABLE))
def test_page_runs(page, tmp_path, monkeypatch, no_leaks):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python block"
    code = "\n\n".join(blocks)
    full, small = RUNNABLE[page]
    assert code.count(full) == 1, f"{page}: the size line {full!r} is not there once"
    code = code.replace(full, small)
    monkeypatch.chdir(tmp_path)
    # __main__: functions defined here travel to the workers by value (cloudpickle), as a script's do
    namespace = {"__name__": "__main__"}
    exec(compile(code, str(ROOT / page), "exec"), namespace)
    assert (tmp_path / "tracking").is_dir()  # the pages' runs record their blocks


def test_every_docs_python_block_parses():
    pages = ["README.md", *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").rglob("*.md")))]
    n = 0
    for page in pages:
        for i, block in enumerate(python_blocks(page)):
            try:
                ast.parse(block)
            except SyntaxError as e:
                raise AssertionError(f"{page}, python block {i + 1}: {e}") from None
            n += 1
    assert n >= 10


def test_setup_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"^```bash\n(.*?)^```", readme, re.M | re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ['python -m pip install -e ".[test]"', "python -m pytest"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'python -m pip install -q -e ".[test]"' in ci
    assert re.search(r"^python -m pytest\b", ci, re.M)
    assert readme.index("```bash") < readme.index("```python"), "the set-up commands come first"


def test_front_page_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move the detail into docs/"


def test_version_and_license_declared_once():
    import daisy_nb
    from daisy_nb import _version

    assert daisy_nb.__version__ == _version.__version__
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "daisy_nb._version.__version__"}
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{_version.__version__}]" in changelog or "## [Unreleased]" in changelog
