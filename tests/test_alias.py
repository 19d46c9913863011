"""``daisy-nb run`` and ``daisy_nb.alias``: ``import daisy`` gives daisy_nb in a process tree.

Every test runs real processes. A fake "real daisy" package sits on ``PYTHONPATH``
(where an installed daisy would be found) to show that the alias wins over it,
in the program and in every Python process the program starts.
"""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import daisy_nb.alias as alias

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)

REPORT = textwrap.dedent(
    """
    import json, sys
    def report(tag, extra=None):
        import daisy
        rec = {"tag": tag, "name": daisy.__name__, "file": daisy.__file__,
               "numba": "numba" in sys.modules, "fake": hasattr(daisy, "I_AM_THE_FAKE_DAISY")}
        rec.update(extra or {})
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps(rec) + "\\n")
    """
)


@pytest.fixture
def tree(tmp_path):
    """A fake installed daisy, a program that imports daisy and starts a worker program."""
    site = tmp_path / "site"
    (site / "daisy").mkdir(parents=True)
    (site / "daisy" / "__init__.py").write_text("I_AM_THE_FAKE_DAISY = True\n")
    (site / "daisy" / "block.py").write_text("FAKE_BLOCK = True\n")
    (tmp_path / "report.py").write_text(REPORT)
    (tmp_path / "main.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            from report import report
            import daisy
            report("main", {"argv": sys.argv[2:]})
            r = subprocess.run([sys.executable, "worker.py", sys.argv[1]])
            sys.exit(10 + r.returncode)
            """
        )
    )
    (tmp_path / "worker.py").write_text(
        textwrap.dedent(
            """
            import sys
            import daisy.block
            from daisy.block import Block
            import daisy.logging, daisy.v2, daisy.cl_monitor, daisy.v1_compat
            from report import report
            report("worker", {
                "block_module": daisy.block.__name__,
                "same_modules": daisy.block is sys.modules["daisy_nb.block"] and daisy.v2 is sys.modules["daisy_nb.v2"],
                "same_class": Block is __import__("daisy_nb").Block,
                "logging": daisy.logging.__name__,
            })
            """
        )
    )
    return tmp_path


def _env(site):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_without_the_alias_the_fake_daisy_is_found(tree):
    """The control: the fake daisy really is the one a plain run imports."""
    rep = tree / "rep.jsonl"
    r = subprocess.run(
        [sys.executable, "main.py", str(rep)], cwd=tree, env=_env(tree / "site"), capture_output=True, text=True
    )
    assert r.returncode == 11, r.stderr  # the worker fails: the fake daisy has no v2 etc.
    (main,) = _records(rep)
    assert main["fake"] and main["name"] == "daisy"


@pytest.mark.parametrize("launcher", ["console_script", "python_m"])
def test_daisy_nb_run_script_and_its_child_get_daisy_nb(tree, launcher):
    rep = tree / "rep.jsonl"
    if launcher == "console_script":
        exe = Path(sys.executable).with_name("daisy-nb")
        if not exe.exists():
            pytest.skip("the daisy-nb console script is not installed next to this Python")
        cmd = [str(exe), "run", "main.py", str(rep), "--flag", "x"]
    else:
        cmd = [sys.executable, "-m", "daisy_nb", "run", "--", "main.py", str(rep), "--flag", "x"]
    r = subprocess.run(cmd, cwd=tree, env=_env(tree / "site"), capture_output=True, text=True)
    assert r.returncode == 10, r.stderr  # main's exit code: 10 + the worker's 0
    main, worker = _records(rep)
    assert main["tag"] == "main" and main["argv"] == ["--flag", "x"]
    for rec in (main, worker):
        assert rec["name"] == "daisy_nb" and not rec["fake"], rec
        assert rec["file"] == str(ROOT / "daisy_nb" / "__init__.py") or rec["file"].endswith(
            os.path.join("daisy_nb", "__init__.py")
        )
        assert rec["numba"] is False  # the alias loads no more than import daisy_nb
    assert worker["block_module"] == "daisy_nb.block" and worker["logging"] == "daisy_nb.logging"
    assert worker["same_modules"] and worker["same_class"]


def test_daisy_nb_run_module_code_and_any_program(tree):
    env = _env(tree / "site")
    (tree / "pkg").mkdir()
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "__main__.py").write_text("import sys, daisy\nprint(daisy.__name__, sys.argv[1:])\nsys.exit(3)\n")
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "-m", "pkg", "a", "b"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert (r.returncode, r.stdout) == (3, "daisy_nb ['a', 'b']\n"), r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "-c", "import daisy.v2 as d; print(d.__name__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert (r.returncode, r.stdout) == (0, "daisy_nb.v2\n"), r.stderr
    # any program found on PATH, e.g. a console script with its own shebang
    bindir = tree / "bin"
    bindir.mkdir()
    prog = bindir / "my-daisy-tool"
    prog.write_text(f"#!{sys.executable}\nimport sys, daisy.block\nprint(daisy.block.__name__)\nsys.exit(7)\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    env["PATH"] = str(bindir) + os.pathsep + env["PATH"]
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "my-daisy-tool"], cwd=tree, env=env, capture_output=True, text=True
    )
    assert (r.returncode, r.stdout) == (7, "daisy_nb.block\n"), r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "no-such-program-here"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 127 and "command not found" in r.stderr
    r = subprocess.run([sys.executable, "-m", "daisy_nb", "run"], cwd=tree, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "usage: daisy-nb run" in r.stderr


WORKER_PROGRAM = textwrap.dedent(
    """
    import sys
    import daisy
    from report import report
    report("client", {"client_module": daisy.Client.__module__})
    client = daisy.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            open(sys.argv[2] + "/done_%d" % block.block_id[1], "w").close()
    """
)

DRIVER = textwrap.dedent(
    """
    import os, subprocess, sys
    import daisy
    from funlib.geometry import Roi
    from report import report
    rep, outdir = sys.argv[1], sys.argv[2]

    def spawn():  # a 0-argument worker function that starts a worker program (as with bsub/sbatch)
        subprocess.run([sys.executable, "client_prog.py", rep, outdir], check=True)

    task = daisy.Task("t", Roi((0,), (60,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=spawn,
                      read_write_conflict=False, max_workers=2)
    report("driver")
    ok = daisy.run_blockwise([task], progress=False, summary=False)
    sys.exit(0 if ok else 5)
    """
)


@pytest.mark.mp
def test_worker_programs_of_a_spawn_function_get_daisy_nb(tree):
    rep = tree / "rep.jsonl"
    outdir = tree / "blocks"
    outdir.mkdir()
    (tree / "client_prog.py").write_text(WORKER_PROGRAM)
    (tree / "driver.py").write_text(DRIVER)
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "driver.py", str(rep), str(outdir)],
        cwd=tree,
        env=_env(tree / "site"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in outdir.iterdir()) == [f"done_{i}" for i in range(6)]
    recs = _records(rep)
    clients = [x for x in recs if x["tag"] == "client"]
    assert [x["tag"] for x in recs].count("driver") == 1 and 1 <= len(clients) <= 2
    for rec in recs:
        assert rec["name"] == "daisy_nb" and not rec["fake"], rec
    for rec in clients:
        assert rec["numba"] is False and rec["client_module"] == "daisy_nb.runtime.net.client"


INSTALL_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    import daisy_nb.alias
    daisy_nb.alias.install()
    daisy_nb.alias.install()  # idempotent
    import daisy, daisy.block
    from report import report
    report("installer")
    subprocess.run([sys.executable, "worker.py", sys.argv[1]], check=True)
    """
)


def test_install_in_python_covers_this_process_and_children(tree):
    rep = tree / "rep.jsonl"
    (tree / "installer.py").write_text(INSTALL_SCRIPT)
    r = subprocess.run(
        [sys.executable, "installer.py", str(rep)], cwd=tree, env=_env(tree / "site"), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    installer, worker = _records(rep)
    for rec in (installer, worker):
        assert rec["name"] == "daisy_nb" and not rec["fake"] and rec["numba"] is False, rec
    assert worker["same_modules"]


def test_install_refuses_when_another_daisy_is_imported(tree):
    code = "import daisy, daisy_nb.alias\ntry:\n    daisy_nb.alias.install()\nexcept RuntimeError as e:\n    print('refused', e)\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, env=_env(tree / "site"), capture_output=True, text=True)
    assert r.stdout.startswith("refused") and "already imported" in r.stdout, r.stderr


def test_alias_imports_no_more_than_daisy_nb():
    """``import daisy`` under the alias loads the modules of ``import daisy_nb`` plus the alias itself.

    The interpreters start as one with daisy_nb installed from a wheel: without ``site`` (``-S``),
    this checkout and the environment's packages on ``PYTHONPATH``. A development install's
    ``.pth`` hooks (setuptools' editable finder) would otherwise load modules at every start
    (``importlib.machinery`` among them) and hide the alias's own imports of them."""
    import site

    paths = [str(ROOT), *site.getsitepackages()]
    probe = "import sys; before = set(sys.modules); import {mod}; print(sorted(set(sys.modules) - before))"
    clean = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    plain = subprocess.run(
        [sys.executable, "-S", "-c", probe.format(mod="daisy_nb")],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    )
    aliased = subprocess.run(
        [sys.executable, "-S", "-c", probe.format(mod="daisy")],
        env=alias.child_env(clean),
        capture_output=True,
        text=True,
        check=True,
    )
    extra = set(eval(aliased.stdout)) - set(eval(plain.stdout))  # noqa: S307 - our own printed list
    assert extra == {"daisy", "daisy_nb.alias"}, extra


def test_private_parts_of_the_real_daisy_are_import_errors():
    code = textwrap.dedent(
        """
        import daisy
        for name in ("daisy._daisy", "daisy._runner", "daisy.nonexistent"):
            try:
                __import__(name)
            except ModuleNotFoundError as e:
                print(e.name)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=alias.child_env(), capture_output=True, text=True)
    assert r.stdout.split() == ["daisy._daisy", "daisy._runner", "daisy.nonexistent"], r.stderr


def test_child_env_puts_the_shim_first_once():
    env = alias.child_env({"PYTHONPATH": os.pathsep.join(["/a", alias.SHIM_DIR, "/b"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [alias.SHIM_DIR, "/a", "/b"]
    assert alias.child_env({})["PYTHONPATH"] == alias.SHIM_DIR
    assert os.path.isfile(os.path.join(alias.SHIM_DIR, "daisy", "__init__.py"))
    assert alias.command_line(["--", "x.py", "-v"]) == [sys.executable, "x.py", "-v"]
    assert alias.command_line(["pytest", "-x"]) == ["pytest", "-x"]
    with pytest.raises(ValueError, match="-m needs"):
        alias.command_line(["-m"])


def test_run_warns_when_a_local_daisy_shadows_the_alias(tree):
    (tree / "daisy").mkdir()
    (tree / "daisy" / "__init__.py").write_text("I_AM_THE_FAKE_DAISY = True\n")
    (tree / "p.py").write_text("import daisy\nprint(hasattr(daisy, 'I_AM_THE_FAKE_DAISY'))\n")
    r = subprocess.run([sys.executable, "-m", "daisy_nb", "run", "p.py"], cwd=tree, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "True\n"
    assert "warning" in r.stderr and os.path.join("daisy", "__init__.py") in r.stderr
