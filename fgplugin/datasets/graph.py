"""The `GraphData` container shared by the npz loader and the synthetic generator."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class GraphData:
    r"""One node-classification graph, framework-neutral (plain torch tensors).

    Args:
        name: graph name (npz file stem or synthetic preset name).
        edge_index: ``int64 [2, E]``; row 0 = source, row 1 = target, sorted by (source, target).
            Undirected graphs store both directions, so ``E`` counts directed entries.
        num_nodes: ``N``; isolated nodes may exist, so never infer it from ``edge_index``.
        x: node features, dense ``float32 [N, F]`` or a ``torch.sparse_csr`` ``float32`` tensor;
            ``None`` when the graph has none (or they were not asked for).
        y: ``int64 [N]`` class index, ``-1`` = unlabelled (leave those out of loss and metrics).
        train_mask, val_mask, test_mask: ``bool [N]`` fixed split, or ``None``.
        num_classes: ``C`` (``y.max() + 1``), or ``None`` without labels.
        community: synthetic graphs only: the generator's ground-truth community id per node,
            kept solely as the "ideal order" reference for benchmarks. Reorderings and models must
            never read it (nor ``y``): they see only the graph.
        meta: provenance (``meta["source"]`` for npz files) or generator parameters.
    """

    name: str
    edge_index: torch.Tensor
    num_nodes: int
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    train_mask: torch.Tensor | None = None
    val_mask: torch.Tensor | None = None
    test_mask: torch.Tensor | None = None
    num_classes: int | None = None
    community: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        """Directed entries in ``edge_index``."""
        return self.edge_index.shape[1]

    @property
    def num_features(self) -> int:
        return 0 if self.x is None else self.x.shape[1]

    def to(self, device: torch.device | str) -> GraphData:
        """A copy with every tensor on ``device`` (tensors already there are shared, not copied)."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    def __repr__(self) -> str:
        if self.x is None:
            feat = "None"
        else:
            layout = ", sparse_csr" if self.x.layout == torch.sparse_csr else ""
            feat = f"[{', '.join(map(str, self.x.shape))}{layout}]"
        return (
            f"GraphData(name={self.name!r}, num_nodes={self.num_nodes:,}, "
            f"num_edges={self.num_edges:,}, x={feat}, num_classes={self.num_classes}, "
            f"device={self.edge_index.device})"
        )
