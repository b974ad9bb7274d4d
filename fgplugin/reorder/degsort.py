"""DegSort: nodes by descending degree."""
from __future__ import annotations

import torch

from ._graph import SymGraph


def degsort(graph: SymGraph, *, seed: int = 0) -> torch.Tensor:
    """Descending degree, ties by original id. Deterministic; ``seed`` is unused."""
    return torch.argsort(graph.degree(), descending=True, stable=True)
