"""The public API is typed and documented.

Every export of ``daisy_nb.__all__`` that daisy_nb defines (funlib's ``Roi`` and
``Coordinate`` are funlib's), and every public method and property of the exported
classes (inherited ones included, when a daisy_nb class defines them), has:

- every parameter annotated (``self``/``cls`` aside) and, except ``__init__``, a return
  annotation;
- a docstring (a class's ``__init__`` is documented by the class docstring);
- for exported functions and constructors that take parameters: a numpydoc
  ``Parameters`` section naming each one (``**kwargs`` aside).

Items that other parts of the code base still owe are listed in ``PENDING`` with what
they lack; a test checks that each one still lacks it, so the list shrinks as they are
done (remove the entry when its test says so).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import warnings
from pathlib import Path

import pytest

import daisy_nb

# qualified name -> the area (see the project's ownership table) that still has to annotate/document it
PENDING: dict[str, str] = {}


def _defined_here(obj) -> bool:
    return getattr(obj, "__module__", "").split(".")[0] == "daisy_nb"


def _exports():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SerialServer and the 1.x aliases warn when used, not when imported
        for name in daisy_nb.__all__:
            obj = getattr(daisy_nb, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and _defined_here(obj):
                yield name, obj


def _members(cls):
    """``(qualname, member)`` of a class's public methods and properties (and ``__init__``)."""
    seen = set()
    for klass in cls.__mro__:
        if not _defined_here(klass):
            continue
        for name, v in vars(klass).items():
            if name in seen or (name.startswith("_") and name != "__init__"):
                continue
            seen.add(name)
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            if isinstance(v, property) or inspect.isfunction(v):
                if name == "__init__" and not _defined_here(v):
                    continue
                yield f"{cls.__name__}.{name}", v


def _items():
    for name, obj in _exports():
        if inspect.isclass(obj):
            yield name, obj
            yield from _members(obj)
        else:
            yield name, obj


def _params(fn) -> list[inspect.Parameter]:
    ps = list(inspect.signature(fn).parameters.values())
    if ps and ps[0].name in ("self", "cls") and "." in fn.__qualname__:
        ps = ps[1:]
    return ps


def _documented_params(doc: str) -> set[str]:
    """Names listed in a numpydoc ``Parameters`` section (``a, b : int`` lists both)."""
    m = re.search(r"^\s*Parameters\n\s*-{3,}\n(.*?)(?:^\s*[A-Z][A-Za-z ]+\n\s*-{3,}\n|\Z)", doc, re.S | re.M)
    if not m:
        return set()
    names = set()
    for line in m.group(1).splitlines():
        head = re.match(r"^(\s*)([*\w][\w, *]*?)\s*(?::|$)", line)
        if head and not head.group(1):  # a parameter line, not its indented description
            names.update(n.strip().lstrip("*") for n in head.group(2).split(","))
    return names


def problems(qualname: str, obj) -> list[str]:
    """What ``obj`` (a class, function or property, exported as ``qualname``) lacks."""
    out = []
    if inspect.isclass(obj):
        if not (obj.__doc__ or "").strip():
            out.append("a docstring")
        return out
    if isinstance(obj, property):
        fget = obj.fget
        if not (obj.__doc__ or "").strip():
            out.append("a docstring")
        if fget is None or "return" not in inspect.get_annotations(fget):
            out.append("a return annotation")
        if obj.fset is not None:
            sp = _params(obj.fset)
            if sp and sp[0].name not in inspect.get_annotations(obj.fset):
                out.append("an annotated setter")
        return out
    ann = inspect.get_annotations(obj)
    params = _params(obj)
    missing = [p.name for p in params if p.name not in ann]
    if missing:
        out.append(f"annotations of {missing}")
    is_init = obj.__name__ == "__init__"
    if not is_init and "return" not in ann:
        out.append("a return annotation")
    owner = None
    if is_init:
        owner = getattr(daisy_nb, qualname.split(".")[0], None)
    doc = inspect.cleandoc(obj.__doc__ or "")
    if is_init:
        doc = inspect.cleandoc(owner.__doc__ or "") + "\n\n" + doc
    if not doc.strip():
        out.append("a docstring")
    elif (is_init or "." not in qualname) and params:
        listed = _documented_params(doc)
        if owner is not None and dataclasses.is_dataclass(owner):  # fields: an Attributes section does
            listed |= _documented_params(doc.replace("Attributes\n", "Parameters\n"))
        named = [p.name for p in params if p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL]
        undocumented = [n for n in named if n not in listed]
        if undocumented:
            out.append(f"a numpydoc Parameters entry for {undocumented}")
    return out


ITEMS = list(_items())


def test_the_check_covers_the_public_api():
    names = {q for q, _ in ITEMS}
    for expected in ("Task.__init__", "Task.total_roi", "run_blockwise", "Block.read_roi", "Pipeline.tasks"):
        assert expected in names
    assert "Roi" not in names and "Coordinate" not in names  # funlib's
    assert len(ITEMS) > 130


@pytest.mark.parametrize("qualname,obj", [(q, o) for q, o in ITEMS if q not in PENDING], ids=lambda x: x)
def test_public_item_is_annotated_and_documented(qualname, obj):
    assert problems(qualname, obj) == [], f"{qualname} lacks: {', '.join(problems(qualname, obj))}"


@pytest.mark.parametrize("qualname", sorted(PENDING))
def test_pending_entries_are_still_pending(qualname):
    """An entry of PENDING that passes the check is stale: remove it (it is then checked)."""
    found = dict(ITEMS)
    assert qualname in found, f"{qualname} is no longer exported: remove it from PENDING"
    assert problems(qualname, found[qualname]), f"{qualname} is annotated and documented now: remove it from PENDING"


def test_the_check_fails_on_what_it_must_catch():
    """The checker itself: it reports a missing annotation, return type, docstring and Parameters entry."""

    def bare(a, b: int):
        return a

    def documented(a: int, b: int) -> int:
        """Add.

        Parameters
        ----------
        a : int
            First.
        """
        return a + b

    class C:
        """A class.

        Parameters
        ----------
        x : int
        """

        def __init__(self, x: int, y) -> None:
            pass

        @property
        def p(self):
            return 1

    assert problems("bare", bare) == ["annotations of ['a']", "a return annotation", "a docstring"]
    assert problems("documented", documented) == ["a numpydoc Parameters entry for ['b']"]
    daisy_nb.C = C  # problems() finds a constructor's class docstring on daisy_nb
    try:
        assert problems("C.__init__", C.__init__) == [
            "annotations of ['y']",
            "a numpydoc Parameters entry for ['y']",
        ]
    finally:
        del daisy_nb.C
    assert problems("C.p", C.p) == ["a docstring", "a return annotation"]


def test_type_checkers_see_every_lazy_export():
    """``daisy_nb.__init__`` loads most names lazily; its TYPE_CHECKING imports must name the same
    objects, or type checkers and IDEs see ``Any`` for them."""
    src = Path(daisy_nb.__file__).read_text()
    tree = ast.parse(src)
    seen = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    for alias in imp.names:
                        seen[alias.asname or alias.name] = f"daisy_nb{imp.module and '.' + imp.module}"
    assert seen == {name: mod for name, mod in daisy_nb._LAZY.items()}


def test_declared_python_versions_agree():
    """requires-python, the tools' targets and the interpreters .ci/versions tests say the same."""
    import tomllib

    root = Path(daisy_nb.__file__).parent.parent
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    lowest = re.fullmatch(r">=\s*3\.(\d+)", cfg["project"]["requires-python"]).group(1)
    assert cfg["tool"]["ruff"]["target-version"] == f"py3{lowest}"
    assert cfg["tool"]["mypy"]["python_version"] == f"3.{lowest}"
    versions = root / ".ci" / "versions"
    if versions.exists():  # not in an installed copy
        declared = re.search(r"^DECLARED=\(([^)]*)\)", versions.read_text(), re.M).group(1).split()
        assert declared[0] == f"3.{lowest}"
        assert declared == [f"3.{int(lowest) + i}" for i in range(len(declared))]
