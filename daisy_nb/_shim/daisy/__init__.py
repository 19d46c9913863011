# The `daisy` found first on PYTHONPATH under `daisy-nb run` (see daisy_nb.alias):
# it replaces itself in sys.modules by daisy_nb and maps daisy.X to daisy_nb.X.
try:
    import daisy_nb.alias
except ImportError as e:
    import sys

    raise ImportError(
        f"the daisy_nb alias is on PYTHONPATH, but daisy_nb cannot be imported by {sys.executable} ({e}); "
        "run this program with the Python environment daisy_nb is installed in"
    ) from e

daisy_nb.alias._activate()
