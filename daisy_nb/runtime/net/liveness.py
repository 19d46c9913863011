"""Liveness settings of ``daisy_nb.Client`` connections: handshake, heartbeat and peer timeouts.

``liveness(context)`` gives ``{"auth", "heartbeat", "peer_timeout"}`` in seconds: the
scheduler reads the environment (``DAISY_NB_AUTH_TIMEOUT_SECS=5``,
``DAISY_NB_HEARTBEAT_SECS=5``, ``DAISY_NB_PEER_TIMEOUT_SECS=30`` by default) and puts them
in every worker function's ``DAISY_CONTEXT``; a ``Client`` reads them from there. Each side
treats ``peer_timeout`` seconds of silence as the end of the other (see :mod:`.transport`).
Standard library only: worker programs import this.
"""

from __future__ import annotations

from daisy_nb import config

__all__ = ["DEFAULTS", "liveness"]

_VARIABLES = {
    "auth": config.AUTH_TIMEOUT_SECS,
    "heartbeat": config.HEARTBEAT_SECS,
    "peer_timeout": config.PEER_TIMEOUT_SECS,
}
DEFAULTS = {key: var.default for key, var in _VARIABLES.items()}


def liveness(context=None) -> dict[str, float]:
    """``{"auth", "heartbeat", "peer_timeout"}`` in seconds: context keys, else env, else defaults."""
    out = {}
    for key, var in _VARIABLES.items():
        raw = None if context is None else context.get(key)
        if raw in (None, ""):
            out[key] = var.get()
        else:  # the scheduler's setting, parsed by the same rule
            out[key] = var.parse(raw, f"{config.CONTEXT.name} key {key!r}")
    if out["heartbeat"] >= out["peer_timeout"]:
        raise ValueError(
            f"{config.HEARTBEAT_SECS.name} ({out['heartbeat']:g}) must be smaller than {config.PEER_TIMEOUT_SECS.name} "
            f"({out['peer_timeout']:g}): a peer is declared gone after that much silence"
        )
    return out
