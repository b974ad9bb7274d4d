"""The graph-case registry and the float64 dense reference that every kernel is tested against.

Each case is a small, seeded graph that exercises one thing kernels get wrong:
empty graphs, isolated nodes, self loops, duplicate edges, hub rows, bipartite shapes, a tile
exactly at the density threshold, sizes not divisible by the tile. The same registry serves the
CPU, CUDA and reference kernels, the layers and the transforms.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .tiling import TiledAdjacency

TILE = 32


@dataclass(frozen=True)
class GraphCase:
    """One labelled test graph. ``size = (num_src, num_dst)`` for bipartite graphs (PyG order)."""

    name: str
    edge_index: torch.Tensor
    num_nodes: int | None = None
    size: tuple[int, int] | None = None
    edge_weight: torch.Tensor | None = None
    threshold: float = 0.05

    @property
    def shape(self) -> tuple[int, int]:
        """``(num_dst, num_src)``, the adjacency's shape."""
        return (self.size[1], self.size[0]) if self.size is not None else (self.num_nodes, self.num_nodes)

    @property
    def is_square(self) -> bool:
        return self.size is None

    def adjacency(self, **options) -> TiledAdjacency:
        options.setdefault("threshold", self.threshold)
        return TiledAdjacency.from_edge_index(self.edge_index, self.num_nodes, self.edge_weight, size=self.size,
                                              **options)

    def dense(self) -> torch.Tensor:
        """The adjacency as a dense float64 [num_dst, num_src] matrix (duplicates summed)."""
        weights = torch.ones(self.edge_index.shape[1], dtype=torch.float64) if self.edge_weight is None \
            else self.edge_weight.double()
        dense = torch.zeros(self.shape, dtype=torch.float64)
        return dense.index_put_((self.edge_index[1], self.edge_index[0]), weights, accumulate=True)


def dense_spmm(dense_adj: torch.Tensor, x: torch.Tensor, row_scale=None, col_scale=None, diag=None) -> torch.Tensor:
    """float64 ``diag(r) (A + diag(d)) diag(c) x`` with a dense A, on the CPU: the reference of
    every kernel."""
    cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    dense_adj, x, row_scale, col_scale, diag = map(cpu, (dense_adj, x, row_scale, col_scale, diag))
    a = dense_adj.double().clone()
    if diag is not None:
        n = diag.numel()
        a[:n, :n] += torch.diag(diag.double())
    if col_scale is not None:
        a = a * col_scale.double().unsqueeze(0)
    if row_scale is not None:
        a = a * row_scale.double().unsqueeze(1)
    return a @ x.double()


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||out - ref|| / ||ref|| (0 when both are empty or zero)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    diff = torch.linalg.vector_norm(out - ref)
    scale = torch.linalg.vector_norm(ref)
    if scale == 0:
        return float(diff)
    return float(diff / scale)


def random_edges(n_src: int, n_dst: int, num_edges: int, generator: torch.Generator) -> torch.Tensor:
    src = torch.randint(0, max(n_src, 1), (num_edges,), generator=generator)
    dst = torch.randint(0, max(n_dst, 1), (num_edges,), generator=generator)
    return torch.stack([src, dst])


def random_graph_case(seed: int, *, n_src: int | None = None, n_dst: int | None = None, avg_degree: float = 6.0,
                      weighted: bool = False, name: str = "random") -> GraphCase:
    """A fresh uniform random graph (square unless ``n_dst`` differs), for tests on new inputs."""
    g = torch.Generator().manual_seed(seed)
    n_src = n_src if n_src is not None else int(torch.randint(1, 400, (1,), generator=g))
    square = n_dst is None
    n_dst = n_src if square else n_dst
    edges = random_edges(n_src, n_dst, int(avg_degree * n_dst), g)
    weight = torch.rand(edges.shape[1], generator=g) + 0.5 if weighted else None
    return GraphCase(f"{name}-{seed}", edges, n_src if square else None, None if square else (n_src, n_dst), weight)


def clustered_case(seed: int, n_src: int | None = None, n_dst: int | None = None, weighted: bool = False,
                   comm: int = 24, max_hub_edges: int = 5000) -> GraphCase:
    """Dense communities (dense tiles without reordering) + uniform noise + a hub row with many
    in-edges + empty last rows: every path of the block-adaptive kernel in one graph."""
    g = torch.Generator().manual_seed(seed)
    n_src = n_src or int(torch.randint(40, 300, (1,), generator=g))
    n_dst = n_dst or n_src
    parts = []
    for start in range(0, min(n_src, n_dst) - comm, comm * 2):
        k = comm * comm // 3
        parts.append(torch.stack([start + torch.randint(0, comm, (k,), generator=g),
                                  start + torch.randint(0, comm, (k,), generator=g)]))
    parts.append(torch.stack([torch.randint(0, n_src, (4 * n_dst,), generator=g),
                              torch.randint(0, n_dst, (4 * n_dst,), generator=g)]))
    hub = torch.randint(0, n_src, (min(3 * n_src, max_hub_edges),), generator=g)
    parts.append(torch.stack([hub, torch.full_like(hub, n_dst // 2)]))
    edges = torch.cat(parts, dim=1)
    edges = edges[:, edges[1] < n_dst - 3]
    weight = torch.rand(edges.shape[1], generator=g) + 0.25 if weighted else None
    square = n_src == n_dst
    return GraphCase(f"clustered-{seed}{'-w' if weighted else ''}{'' if square else '-rect'}", edges,
                     n_src if square else None, None if square else (n_src, n_dst), weight)


def _hub(g: torch.Generator) -> GraphCase:
    n = 300
    spokes = torch.arange(1, n)
    hub_in = torch.stack([spokes, torch.zeros_like(spokes)])  # node 0 receives from everyone
    hub_out = torch.stack([torch.zeros(40, dtype=torch.long), torch.arange(1, 41)])
    return GraphCase("hub_row", torch.cat([hub_in, hub_out, random_edges(n, n, 600, g)], dim=1), n)


def _tile_at_threshold() -> GraphCase:
    # Threshold 52/1024: tile (0, 0) holds exactly 52 non-zeros (not dense: density must exceed
    # the threshold), tile (1, 1) holds 53 (dense). 70 nodes: the last panel is partial.
    def block(rows, cols, count, offset):
        pairs = [(r, c) for r in range(rows) for c in range(cols)][:count]
        return torch.tensor([[c + offset for _, c in pairs], [r + offset for r, _ in pairs]])

    edges = torch.cat([block(32, 32, 52, 0), block(32, 32, 53, 32), torch.tensor([[69, 5], [0, 68]])], dim=1)
    return GraphCase("tile_at_threshold", edges, 70, threshold=52 / 1024)


def graph_cases() -> list[GraphCase]:
    """The registry, rebuilt (seeded, so identical) on each call."""
    g = torch.Generator().manual_seed(0)
    loops = torch.arange(0, 40, 3)
    dup = random_edges(60, 60, 150, g)
    dense_block = torch.stack(torch.meshgrid(torch.arange(32, 64), torch.arange(32, 64), indexing="ij")).reshape(2, -1)
    cases = [
        GraphCase("empty", torch.zeros(2, 0, dtype=torch.long), 0),
        GraphCase("no_edges", torch.zeros(2, 0, dtype=torch.long), 7),
        GraphCase("isolated_nodes", random_edges(20, 20, 80, g), 50),
        GraphCase("self_loops", torch.cat([random_edges(40, 40, 120, g), torch.stack([loops, loops])], dim=1), 40),
        GraphCase("duplicate_edges", torch.cat([dup, dup[:, :50], dup[:, :10]], dim=1), 60),
        _hub(g),
        GraphCase("bipartite", random_edges(40, 25, 160, g), size=(40, 25)),
        GraphCase("bipartite_wide_signed_weights", random_edges(25, 70, 200, g), size=(25, 70),
                  edge_weight=torch.rand(200, generator=g) * 2 - 1),
        _tile_at_threshold(),
        GraphCase("not_divisible_weighted", random_edges(70, 70, 400, g), 70,
                  edge_weight=torch.rand(400, generator=g) + 0.1),
        GraphCase("dense_block", torch.cat([dense_block, random_edges(100, 100, 300, g)], dim=1), 100),
        GraphCase("single_node_loop", torch.tensor([[0], [0]]), 1),
    ]
    return cases


GRAPH_CASE_NAMES = tuple(case.name for case in graph_cases())


def record_spmm_widths(monkeypatch) -> list[int]:
    """Makes every product of fgplugin's spmm op append the column count of the ``x`` it
    multiplies (after any padding) to the returned list, for the rest of a test (``monkeypatch``:
    pytest's fixture). Repeated calls are then not kept: a kept call runs the op from C++, past
    this hook on :func:`fgplugin.ops.run_spmm`."""
    from . import ops, repeated_calls

    widths, run_spmm = [], ops.run_spmm
    monkeypatch.setattr(repeated_calls, "context_allows", lambda x: False)
    monkeypatch.setattr(ops, "run_spmm", lambda args, *more: widths.append(args.x.shape[1]) or run_spmm(args, *more))
    return widths
