"""Reference twin of daisy's pipeline-level ``DependencyGraph`` (CORE section 4).

Differences from daisy 2.0.0, all deliberate (CORE section 10):

* ``downstream`` is computed as the **exact inverse** of ``upstream`` by brute
  force over every block of the task and of its downstream tasks, instead of
  daisy's ``get_subgraph_blocks(write_roi, read_roi=True)``, which grows by the
  wrong side's context (10.1) and does not mirror ``upstream`` at the far edge
  of overhang/shrink tasks (10.5).
* Duplicate edges are collapsed (daisy 2.0 lists the upstream blocks twice).
* Ties between equal spatial IDs of different tasks are ordered by
  :attr:`RefPipeline.task_order` (daisy leaves that order unspecified; it never
  matters for scheduling because each task has its own queue).

Blocks are identified by ``(task_id, spatial_id)``; IDs are unique within a
task for the non-negative contexts used in the tests.
"""

from __future__ import annotations

import heapq

from .graph import RefBlock, RefGraph

__all__ = ["RefPipeline"]

TaskBlock = tuple[str, RefBlock]


class RefPipeline:
    """Inter-task block dependencies of a DAG of tasks (CORE 4, with 10.1/10.5 fixed).

    Parameters
    ----------
    tasks : dict[str, RefGraph]
        One graph per task id.
    edges : list[tuple[str, str]]
        ``(upstream_task, downstream_task)`` pairs. Duplicates are collapsed;
        unknown task ids, self-edges and cycles raise ValueError.
    """

    def __init__(self, tasks: dict[str, RefGraph], edges: list[tuple[str, str]]):
        """Store the task graphs and the deduplicated task DAG (CORE 4; 9 for the errors)."""
        self.tasks: dict[str, RefGraph] = dict(tasks)
        self.edges: list[tuple[str, str]] = []
        for up, down in edges:
            if up not in self.tasks or down not in self.tasks:
                raise ValueError(f"edge {(up, down)} names a task that is not in the pipeline")
            if (up, down) not in self.edges:
                self.edges.append((up, down))
        self.task_order: list[str] = self._topological_order()
        self._downstream_map: dict[tuple[str, int], list[TaskBlock]] | None = None

    def _topological_order(self) -> list[str]:
        """Kahn's algorithm over the task DAG (CORE 4); ties go to the smallest task id; a cycle raises (CORE 9)."""
        indegree = {t: 0 for t in self.tasks}
        for _, down in self.edges:
            indegree[down] += 1
        heap = [t for t, d in indegree.items() if d == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            t = heapq.heappop(heap)
            order.append(t)
            for down in sorted({d for u, d in self.edges if u == t}):
                indegree[down] -= 1
                if indegree[down] == 0:
                    heapq.heappush(heap, down)
        if len(order) != len(self.tasks):
            raise ValueError("pipeline contains a cycle")
        return order

    # ------------------------------------------------------------------
    # Task DAG (CORE 4, first bullet)
    # ------------------------------------------------------------------

    def upstream_tasks(self, task_id: str) -> list[str]:
        """One-hop upstream task ids (CORE 4, ``upstream_task_ids``), in task order."""
        ups = {u for u, d in self.edges if d == task_id}
        return [t for t in self.task_order if t in ups]

    def downstream_tasks(self, task_id: str) -> list[str]:
        """One-hop downstream task ids (CORE 4, ``downstream_task_ids``), in task order."""
        downs = {d for u, d in self.edges if u == task_id}
        return [t for t in self.task_order if t in downs]

    def source_tasks(self) -> list[str]:
        """Tasks with no incoming edge (daisy's "root tasks", CORE 4), in task order."""
        return [t for t in self.task_order if not self.upstream_tasks(t)]

    # ------------------------------------------------------------------
    # Block dependencies
    # ------------------------------------------------------------------

    def upstream(self, task_id: str, block: RefBlock) -> list[TaskBlock]:
        """Upstream blocks of ``block`` of task ``task_id`` (CORE 4, ``upstream(b)``).

        1. The intra-task upstream list (CORE 3.8);
        2. for each upstream task ``U``: ``U.subgraph(block.read,
           read_roi=False)``, i.e. the ``U`` blocks whose write cell meets the
           (fitted, possibly shrunk) read ROI of ``block`` clipped to ``U.TW``;
        3. a stable sort by spatial ID only.
        """
        out: list[TaskBlock] = [(task_id, b) for b in self.tasks[task_id].upstream(block)]
        for up in self.upstream_tasks(task_id):
            out.extend((up, b) for b in self.tasks[up].subgraph(block.read, read_roi=False))
        return sorted(out, key=lambda tb: tb[1].spatial_id)

    def _build_downstream_map(self) -> dict[tuple[str, int], list[TaskBlock]]:
        """Invert :meth:`upstream` over every block of every task by brute force (fixes CORE 10.1, 10.5)."""
        inverse: dict[tuple[str, int], list[TaskBlock]] = {}
        for t in self.task_order:
            for b in self.tasks[t].blocks():
                for u_task, u in self.upstream(t, b):
                    inverse.setdefault((u_task, u.spatial_id), []).append((t, b))
        for key, lst in inverse.items():
            inverse[key] = sorted(lst, key=lambda tb: tb[1].spatial_id)
        return inverse

    def downstream(self, task_id: str, block: RefBlock) -> list[TaskBlock]:
        """Downstream blocks of ``block``: exactly the blocks whose :meth:`upstream` lists it.

        Sorted stably by spatial ID (ties between tasks in task order). This
        replaces daisy's ``get_subgraph_blocks(write_roi, read_roi=True)``
        construction (CORE 4, ``downstream(b)``) and so fixes CORE 10.1 and 10.5.
        """
        if self._downstream_map is None:
            self._downstream_map = self._build_downstream_map()
        return list(self._downstream_map.get((task_id, block.spatial_id), []))

    def blocks(self) -> list[TaskBlock]:
        """Every block of every task, tasks in :attr:`task_order`, each in enumeration order (CORE 3.5)."""
        return [(t, b) for t in self.task_order for b in self.tasks[t].blocks()]

    def block(self, task_id: str, spatial_id: int) -> RefBlock:
        """Look a block up by its block ID ``(task_id, spatial_id)`` (CORE 2.1); KeyError if absent."""
        return self.tasks[task_id].block_by_id(spatial_id)
