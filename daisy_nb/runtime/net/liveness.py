"""Liveness settings of ``daisy_nb.Client`` connections: handshake, heartbeat and peer timeouts.

``liveness(context)`` gives ``{"auth", "heartbeat", "peer_timeout"}`` in seconds: the
scheduler reads the environment (``DAISY_NB_AUTH_TIMEOUT_SECS=5``,
``DAISY_NB_HEARTBEAT_SECS=5``, ``DAISY_NB_PEER_TIMEOUT_SECS=30`` by default) and puts them
in every worker function's ``DAISY_CONTEXT``; a ``Client`` reads them from there. Each side
treats ``peer_timeout`` seconds of silence as the end of the other (see :mod:`.transport`).
Standard library only: worker programs import this.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULTS", "liveness"]

DEFAULTS = {"auth": 5.0, "heartbeat": 5.0, "peer_timeout": 30.0}
_ENV = {
    "auth": "DAISY_NB_AUTH_TIMEOUT_SECS",
    "heartbeat": "DAISY_NB_HEARTBEAT_SECS",
    "peer_timeout": "DAISY_NB_PEER_TIMEOUT_SECS",
}


def liveness(context=None) -> dict[str, float]:
    """``{"auth", "heartbeat", "peer_timeout"}`` in seconds: context keys, else env, else defaults."""
    out = {}
    for key, default in DEFAULTS.items():
        raw = None if context is None else context.get(key)
        name = f"DAISY_CONTEXT key {key!r}"
        if raw in (None, ""):
            raw, name = os.environ.get(_ENV[key], ""), _ENV[key]
        if raw in (None, ""):
            out[key] = default
            continue
        try:
            v = float(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
        if not v > 0 or v == float("inf"):
            raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
        out[key] = v
    if out["heartbeat"] >= out["peer_timeout"]:
        raise ValueError(
            f"{_ENV['heartbeat']} ({out['heartbeat']:g}) must be smaller than {_ENV['peer_timeout']} "
            f"({out['peer_timeout']:g}): a peer is declared gone after that much silence"
        )
    return out
