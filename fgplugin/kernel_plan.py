"""Device-specific kernel plans that ride along with the spmm op (its ``plan`` arguments).

The CPU kernel and the plain CUDA CSR kernel need nothing beyond the CSR, so their plan is the
empty list. The block-adaptive CUDA kernel (issue 3) builds its tile lists here, from the
``TilePlan``, cached on the adjacency.
"""
from __future__ import annotations

import torch


def kernel_plans(adj, x: torch.Tensor, with_transpose: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(plan of A, plan of A^T) for features ``x``; empty lists select the plain CSR kernels."""
    return [], []
