"""numba is bounded to the releases whose internals the kernels use, and each internal has a fallback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_installed_numba_is_inside_the_bound_and_has_every_internal():
    numba = pytest.importorskip("numba")
    from daisy_nb.kernels._numba_features import features

    spec = re.search(r'"numba>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert spec, "pyproject.toml bounds numba as numba>=A,<B"
    low, high = _version(spec.group(1)), _version(spec.group(2))
    installed = _version(numba.__version__)
    assert low <= installed < high, f"numba {numba.__version__} is outside the tested bound {spec.group(0)}"
    # inside the bound every internal is there: a numba release that drops one fails here
    assert features() == {"nrt_option": True, "cache_index": True, "compile_event": True}


def test_a_numba_without_the_nrt_option_compiles_the_kernel_with_reference_counting(monkeypatch):
    pytest.importorskip("numba")
    from daisy_nb.kernels import _jit, _numba_features

    monkeypatch.setattr(
        _numba_features, "features", lambda: {"nrt_option": False, "cache_index": False, "compile_event": False}
    )

    def add_one(x):
        return x + 1

    try:
        d = _jit._dispatcher(add_one, {"nogil": True, "_nrt": False})
        assert d(41) == 42
        assert "_nrt" not in d.targetoptions
        assert _jit.cache_is_warm([add_one]) is False  # without the cache index: assume it must compile
    finally:
        _jit._dispatchers.pop(add_one, None)
