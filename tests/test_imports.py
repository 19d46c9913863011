"""The package's modules import each other in one direction only (no import circles).

Every ``import``/``from ... import`` of a daisy_nb module counts, also those inside
functions (lazy imports are how a circle usually hides). The package facade's
lazy names (``daisy_nb.__getattr__``, by string) are the public API, not an edge.
"""

import ast
import os

import daisy_nb

PKG_DIR = os.path.dirname(daisy_nb.__file__)


def _modules() -> dict[str, str]:
    mods = {}
    for root, _, files in os.walk(PKG_DIR):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(PKG_DIR))[:-3].replace(os.sep, ".")
                mods[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return mods


def _edges(name: str, path: str, mods: dict[str, str]) -> set[str]:
    is_pkg = path.endswith("__init__.py")
    package = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
        for t in targets:
            while t and t not in mods:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):  # own parent packages do not count
                out.add(t)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    mods = _modules()
    graph = {m: _edges(m, p, mods) for m, p in mods.items()}
    assert "daisy_nb.scheduler" in graph["daisy_nb.run"]  # the walk sees real edges
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layer_contracts_hold():
    """pyproject.toml's [tool.importlinter] contracts (also a step of .ci/run): the core imports no
    runtime or dashboard, worker-side modules no numpy/numba, observers only the runtime's snapshots."""
    import shutil
    import subprocess
    import sys

    import pytest

    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    if not os.path.exists(exe):
        pytest.skip("import-linter is not installed (pip install -e .[test])")
    root = os.path.dirname(PKG_DIR)
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run([exe, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_the_core_contract_would_catch_a_scheduler_importing_the_dashboard(tmp_path):
    """The contract is not vacuous: the same configuration on a copy where scheduler.py imports the
    dashboard again (as it did for block_id_to_grid) is reported broken."""
    import shutil
    import subprocess
    import sys

    import pytest

    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    if not os.path.exists(exe):
        pytest.skip("import-linter is not installed (pip install -e .[test])")
    root = os.path.dirname(PKG_DIR)
    shutil.copytree(PKG_DIR, tmp_path / "daisy_nb", ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(os.path.join(root, "pyproject.toml"), tmp_path / "pyproject.toml")
    sched = tmp_path / "daisy_nb" / "scheduler.py"
    sched.write_text(sched.read_text() + "\n\ndef _bad():\n    from daisy_nb.dashboard.live import Tee  # noqa\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([exe, "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "daisy_nb.scheduler is not allowed to import daisy_nb.dashboard" in r.stdout
