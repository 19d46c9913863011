"""``Context``: the string key/value bag a worker receives in ``DAISY_CONTEXT``.

Encoded as ``k=v:k=v`` with ``%``, ``:`` and ``=`` percent-encoded inside keys and
values (the wheel encodes ``:``; we also encode ``=`` so any value round-trips).
``repr``/``str`` never show the run's secret (``authkey=<hidden>``); ``to_env`` does
(it is how a ``Client`` program gets it).
"""

from __future__ import annotations

from collections.abc import ItemsView, KeysView, ValuesView
from typing import TypeVar, overload

from daisy_nb import config

__all__ = ["Context"]

_T = TypeVar("_T")


def _enc(s: str) -> str:
    return s.replace("%", "%25").replace(":", "%3A").replace("=", "%3D")


def _dec(s: str) -> str:
    return s.replace("%3D", "=").replace("%3A", ":").replace("%25", "%")


class Context:
    """Dict-like store of string keys and string values (values coerced with ``str``)."""

    ENV_VARIABLE = config.CONTEXT.name

    def __init__(self, **kwargs: object) -> None:
        self._d: dict[str, str] = {}
        if "logdir" not in kwargs:
            from daisy_nb.logging import get_log_basedir

            base = get_log_basedir()
            self._d["logdir"] = "" if base is None else str(base)
        for k, v in kwargs.items():
            self[k] = v

    def __setitem__(self, key, value):
        self._d[str(key)] = str(value)

    def __getitem__(self, key):
        return self._d[key]

    def __delitem__(self, key):
        del self._d[key]

    def __contains__(self, key):
        return key in self._d

    def __len__(self):
        return len(self._d)

    def __iter__(self):
        return iter(self._d)

    def __eq__(self, other):
        return isinstance(other, Context) and self._d == other._d

    def keys(self) -> KeysView[str]:
        """The keys, as a dict's."""
        return self._d.keys()

    def values(self) -> ValuesView[str]:
        """The values (strings), as a dict's."""
        return self._d.values()

    def items(self) -> ItemsView[str, str]:
        """The ``(key, value)`` pairs, as a dict's."""
        return self._d.items()

    @overload
    def get(self, key: str) -> str | None: ...
    @overload
    def get(self, key: str, default: _T) -> str | _T: ...
    def get(self, key: str, default: object = None) -> object:
        """The value of ``key``, else ``default``."""
        return self._d.get(key, default)

    def copy(self) -> Context:
        """A copy (changing it leaves this one as it is)."""
        c = Context.__new__(Context)
        c._d = dict(self._d)
        return c

    def to_env(self) -> str:
        """Encode as ``k=v:k=v``."""
        return ":".join(f"{_enc(k)}={_enc(v)}" for k, v in self._d.items())

    @staticmethod
    def from_env(value: str | None = None) -> Context:
        """Parse ``DAISY_CONTEXT`` (``KeyError`` if unset or empty, ``ValueError`` if malformed)."""
        if value is None:
            value = config.CONTEXT.get()
            if value is None:
                raise KeyError(Context.ENV_VARIABLE)
        return Context.from_env_string(value)

    @staticmethod
    def from_env_string(env: str) -> Context:
        """Parse a ``k=v:k=v`` string (the :meth:`to_env` form) without reading the environment."""
        if not isinstance(env, str):
            raise TypeError(f"env must be a str, got {type(env).__name__}")
        c = Context.__new__(Context)
        c._d = {}
        if env:
            for item in env.split(":"):
                if not item:  # "a=1::b=2": an empty token carries nothing (as in daisy)
                    continue
                if "=" not in item:
                    # daisy 2.0.0's words (its tests match them); the variable named for the reader
                    raise ValueError(f"invalid context token: {item} (in {Context.ENV_VARIABLE}: key=value:key=value)")
                k, v = item.split("=", 1)
                c._d[_dec(k)] = _dec(v)
        return c

    def __repr__(self):
        """As ``to_env()``, with the run's secret shown as ``authkey=<hidden>`` (reprs end up in logs)."""
        shown = (f"{_enc(k)}=" + ("<hidden>" if k == "authkey" else _enc(v)) for k, v in self._d.items())
        return "Context(" + ":".join(shown) + ")"
