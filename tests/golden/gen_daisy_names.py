"""Generate ``tests/data/daisy_names.json``: the public names of PyPI ``daisy==2.0.0``.

Regenerate (from the repository root; needs the daisy 2.0.0 virtualenv, which CI
does not have, so the output file is committed)::

    /work/venv-daisy2/bin/python tests/golden/gen_daisy_names.py

For the package and each public submodule (found with ``pkgutil``, names not
starting with ``_``) it records ``__all__`` and every name of ``dir(module)``
that does not start with ``_`` (plus ``__version__``), with what the name is:
``kind`` (module, class, function, other) and ``origin`` (the module that defines
it, ``__name__`` for modules). For each class a module exports (its ``__all__``, else what it defines) it also
records the class's public attributes, and for each function and public method
(where ``inspect.signature`` can read it) its parameters: ``[name, kind]``.
``tests/test_daisy_surface.py`` checks daisy_nb against this file.
"""

import importlib
import inspect
import json
import os
import pkgutil
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "daisy_names.json")


def describe(obj) -> dict:
    if inspect.ismodule(obj):
        return {"kind": "module", "origin": obj.__name__}
    if inspect.isclass(obj):
        return {"kind": "class", "origin": obj.__module__}
    if callable(obj):
        return {"kind": "function", "origin": getattr(obj, "__module__", None) or type(obj).__module__}
    return {"kind": "other", "origin": type(obj).__module__}


def public(names):
    return sorted(n for n in names if not n.startswith("_") or n == "__version__")


def parameters(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name] for p in sig.parameters.values()]


def main() -> None:
    import daisy

    modules = {"daisy": daisy}
    for info in pkgutil.iter_modules(daisy.__path__):
        if not info.name.startswith("_"):
            modules[f"daisy.{info.name}"] = importlib.import_module(f"daisy.{info.name}")
    out = {
        "generator": "tests/golden/gen_daisy_names.py",
        "daisy_version": daisy.__version__,
        "python": sys.version.split()[0],
        "modules": {},
    }
    for name, mod in sorted(modules.items()):
        entry = {"all": list(getattr(mod, "__all__", [])), "names": {}, "classes": {}, "signatures": {}}
        for attr in public(dir(mod)):
            entry["names"][attr] = describe(getattr(mod, attr))
        # what the module exports: its __all__, else the names it defines itself
        exported = entry["all"] or [n for n, info in entry["names"].items() if info["origin"] == name]
        for attr in exported:
            obj = getattr(mod, attr)
            targets = [(attr, obj)]
            if inspect.isclass(obj):
                entry["classes"][attr] = public(dir(obj))
                targets += [
                    (f"{attr}.{m}", getattr(obj, m)) for m in public(dir(obj)) if callable(getattr(obj, m, None))
                ]
            for key, target in targets:
                if callable(target) and parameters(target) is not None:
                    entry["signatures"][key] = parameters(target)
        out["modules"][name] = entry
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(out['modules'])} modules")


if __name__ == "__main__":
    main()
