"""The median of a few numbers, as :func:`statistics.median` computes it.

The runtime takes medians of recent block times (batch sizes, backup copies, the hang alarm,
the walltime rule, job start times), a few dozen numbers at a time. Importing :mod:`statistics`
for that costs a run ~4 ms and ~0.25 MB (it loads :mod:`decimal` and :mod:`fractions`), which a
run of a few blocks notices, so the median is computed here.

Part of the core: imports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["median"]


def median(values: Iterable[float]) -> float:
    """The middle value of ``values`` (the mean of the two middle ones for an even count);
    ``ValueError`` for none."""
    s = sorted(values)
    n = len(s)
    if not n:
        raise ValueError("median of no values")
    m = n // 2
    return s[m] if n % 2 else (s[m - 1] + s[m]) / 2
