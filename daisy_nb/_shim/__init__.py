"""Holds the ``daisy`` shim package; this directory goes first on ``PYTHONPATH`` (see daisy_nb.alias)."""
