"""``daisy_nb.scheduling.median.median``: the runtime's medians of block times, against the
standard library's :func:`statistics.median` (its obviously-correct twin)."""

import statistics
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daisy_nb.scheduling.median import median

_TIMES = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=80)


@given(_TIMES)
def test_the_median_is_the_standard_librarys(xs):
    assert median(xs) == statistics.median(xs)
    assert median(deque(xs)) == statistics.median(xs)  # the runtime's windows are deques
    assert median(reversed(xs)) == statistics.median(xs)  # and iterators over them


def test_no_values_have_no_median():
    with pytest.raises(ValueError, match="no values"):
        median([])
