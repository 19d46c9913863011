"""The version of daisy_nb, in one place.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``) and ``daisy_nb.__version__``
re-exports it. Standard library only, nothing imported: worker processes may read it.
"""

__version__ = "0.1.0"
