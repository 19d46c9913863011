"""``RetryBackoff``: a slow, obviously-correct twin of ``daisy_nb.scheduling.backoff.RetryBackoff``.

Written from the rule in that module's docstring: a list of (time, arrival, task, row) entries,
searched and sorted on every call. No heap, no index, no counts kept: each answer is computed
from the list.
"""

from __future__ import annotations


def retry_delay(base, attempt, u):
    """``min(base * 2**(attempt-1), base * 32) * (0.5 + u)``, written out."""
    nominal = base
    for _ in range(attempt - 1):
        nominal = nominal * 2
    nominal = min(nominal, base * 32)
    return nominal * (0.5 + u)


class RetryBackoff:
    """Same methods and results as the fast one, on a plain list."""

    def __init__(self, bases, rng):
        self.bases = list(bases)
        self.rng = rng
        self.entries = []  # (at, arrival, task, row)
        self.arrivals = 0

    def on(self, t):
        return self.bases[t] > 0

    def held(self, t):
        return len([e for e in self.entries if e[2] == t])

    def __len__(self):
        return len(self.entries)

    def next_at(self):
        return min(e[0] for e in self.entries) if self.entries else None

    def failed(self, t, row, attempt, now):
        assert self.bases[t] > 0 and attempt >= 1
        assert all((e[2], e[3]) != (t, row) for e in self.entries)
        at = now + retry_delay(self.bases[t], attempt, self.rng())
        self.entries.append((at, self.arrivals, t, row))
        self.arrivals += 1
        return (t, row, at)

    def due(self, now):
        ripe = sorted(e for e in self.entries if e[0] <= now)
        self.entries = [e for e in self.entries if e[0] > now]
        return [(e[2], e[3]) for e in ripe]

    def drop_task(self, t):
        rows = [e[3] for e in sorted(self.entries) if e[2] == t]
        self.entries = [e for e in self.entries if e[2] != t]
        return rows
