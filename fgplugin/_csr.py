"""Small CSR helpers shared by the adjacency, the reference kernels and the tests.

All of them are plain torch ops with static output shapes, so they run on any device and trace
under torch.compile without graph breaks.
"""
from __future__ import annotations

import torch

INT32_MAX = 2**31 - 1


def rows_of_edges(rowptr: torch.Tensor, nnz: int) -> torch.Tensor:
    """Row index of every non-zero of a CSR (int64), i.e. the COO rows."""
    n_rows = rowptr.numel() - 1
    counts = rowptr[1:] - rowptr[:-1]
    return torch.repeat_interleave(torch.arange(n_rows, device=rowptr.device), counts, output_size=nnz)


def rowptr_from_sorted_rows(rows: torch.Tensor, n_rows: int, dtype: torch.dtype) -> torch.Tensor:
    """CSR row pointer of non-zeros whose row indices are sorted ascending."""
    bounds = torch.arange(n_rows + 1, device=rows.device, dtype=rows.dtype)
    return torch.searchsorted(rows, bounds).to(dtype)


def index_dtype_for(nnz: int, n_rows: int, n_cols: int) -> torch.dtype:
    """int32 indices while every index and offset fits, int64 beyond (docs/design.md)."""
    return torch.int32 if max(nnz, n_rows + 1, n_cols) <= INT32_MAX else torch.int64


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[perm[i]] = i``: maps old node ids to new ones for a new -> old ``perm``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


def aux_dtype_for(x_dtype: torch.dtype) -> torch.dtype:
    """dtype of edge values and scales for features of ``x_dtype`` (the kernels' accumulation type)."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32
