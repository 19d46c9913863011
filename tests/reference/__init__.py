"""Slow, obviously-correct pure-Python twins of daisy's core algorithms.

Written from ``/work/shared/spec/CORE.md`` (sections 0-6 and 8-10), stdlib only:
ROIs are plain tuples ``((offset...), (shape...))`` of Python ints. The fast
Numba kernels are tested against these. They are meant for small cases
(a few hundred blocks); nothing here is optimised.

Modules
-------
block_id
    Cantor numbering and spatial block IDs (CORE 2.2).
graph
    ``RefGraph``: the blocks, levels and intra-task dependencies of one task,
    plus ``get_subgraph_blocks`` (CORE 3).
pipeline
    ``RefPipeline``: inter-task dependencies with daisy's defects fixed
    (CORE 4, 10.1, 10.5).
scheduler
    ``RefScheduler``: a set-based model of daisy's Scheduler with its orphan
    and root defects fixed (CORE 5, 6, 10.2, 10.3, 10.7).
"""

from .block_id import block_spatial_id, cantor
from .graph import RefBlock, RefGraph
from .pipeline import RefPipeline
from .scheduler import RefScheduler

__all__ = ["RefBlock", "RefGraph", "RefPipeline", "RefScheduler", "block_spatial_id", "cantor"]
