"""Input checks with errors that say what was wrong, what was expected and how to fix it.

They run once when an adjacency is built (O(E), one host sync each), never in the training step,
except :func:`check_autograd_history`, which runs only for edge values or scales that carry an
autograd history.
"""
from __future__ import annotations

import torch

from .tile_density import check_threshold


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    # PyG's EdgeIndex and other Tensor subclasses: the checks need only the data.
    return tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor


def check_edge_index(edge_index) -> torch.Tensor:
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"edge_index must be a torch.Tensor of shape [2, E], got {type(edge_index).__name__}")
    edge_index = _plain(edge_index)
    if edge_index.is_sparse or edge_index.layout != torch.strided:
        raise TypeError("edge_index must be a dense [2, E] tensor; for a sparse adjacency use "
                        "TiledAdjacency.from_csr or from_scipy")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integer node ids (int64 or int32), got {edge_index.dtype}; "
                        "convert with edge_index.long()")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        hint = " (it looks like [E, 2]: pass edge_index.t())" if edge_index.dim() == 2 and edge_index.shape[1] == 2 else ""
        raise ValueError(f"edge_index must have shape [2, E] (row 0 = source, row 1 = target), got "
                         f"{list(edge_index.shape)}{hint}")
    edge_index = edge_index.long()
    if edge_index.numel() and int(edge_index.min()) < 0:
        where = int((edge_index < 0).any(dim=0).nonzero()[0])
        raise ValueError(f"edge_index holds a negative node id ({int(edge_index.min())}, first at edge {where}); "
                         "node ids must be in [0, num_nodes)")
    return edge_index


def check_edge_values(values, num_edges: int, name: str, device: torch.device, check_finite: bool = True) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a floating-point torch.Tensor of shape [{num_edges}], got {type(values).__name__}")
    values = _plain(values)
    if not values.dtype.is_floating_point:
        raise TypeError(f"{name} must be floating point (float32 or float64), got {values.dtype}; use {name}.float()")
    if values.dim() != 1 or values.numel() != num_edges:
        raise ValueError(f"{name} must be 1-D with one entry per edge ({num_edges}), got shape {list(values.shape)}")
    if values.device != device:
        raise ValueError(f"{name} is on {values.device} but the edges are on {device}; move it with .to({str(device)!r})")
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()  # weights are kept in the accumulation precision
    if not check_finite:
        return values
    finite = torch.isfinite(values.detach())
    if not bool(finite.all()):
        bad = int((~finite).sum())
        first = int((~finite).nonzero()[0])
        raise ValueError(f"{name} has {bad} NaN or infinite entries (first at edge {first}); clean them, e.g. "
                         f"with torch.nan_to_num, before building the adjacency")
    return values


def check_csr(rowptr, col, shape):
    for name, t in (("rowptr", rowptr), ("col", col)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be a 1-D int32 or int64 tensor")
    rowptr, col = _plain(rowptr).long(), _plain(col).long()
    if rowptr.device != col.device:
        raise ValueError(f"rowptr is on {rowptr.device} but col is on {col.device}")
    if rowptr.numel() == 0 or int(rowptr[0]) != 0 or int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr must start at 0 and end at nnz={col.numel()} (n_rows + 1 entries)")
    if bool((rowptr[1:] < rowptr[:-1]).any()):
        raise ValueError("rowptr must be non-decreasing")
    n_rows = rowptr.numel() - 1
    if shape is None:
        shape = (n_rows, n_rows)
    shape = (int(shape[0]), int(shape[1]))
    if shape[0] != n_rows:
        raise ValueError(f"shape[0]={shape[0]} does not match rowptr, which describes {n_rows} rows")
    if col.numel() and (int(col.min()) < 0 or int(col.max()) >= shape[1]):
        raise ValueError(f"col holds ids outside [0, {shape[1]}): min {int(col.min())}, max {int(col.max())}; "
                         "pass shape=(n_rows, n_cols) large enough")
    return rowptr, col, shape


def check_perm(perm, n: int, device: torch.device, what: str = "perm") -> torch.Tensor:
    """``perm`` as int64 on ``device`` if it is a permutation of 0..n-1 (``what`` names it in errors)."""
    meaning = "new -> old node ids" if what == "perm" else "positions"
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.numel() != n or perm.dtype.is_floating_point:
        raise ValueError(f"{what} must be a 1-D integer tensor of length {n} ({meaning})")
    perm = _plain(perm).to(device=device, dtype=torch.long)
    seen = torch.zeros(n, dtype=torch.bool, device=device)
    if n and (int(perm.min()) < 0 or int(perm.max()) >= n or not bool(seen.index_fill_(0, perm, True).all())):
        raise ValueError(f"{what} must be a permutation of 0..{n - 1}; it has repeated or out-of-range ids")
    return perm


def check_tile_options(tile_size, threshold) -> None:
    if not isinstance(tile_size, int) or isinstance(tile_size, bool) or tile_size < 1:
        raise ValueError(f"tile_size must be a positive int (32 is the default and what the CUDA kernel tiles), got {tile_size!r}")
    check_threshold(threshold)


_RAW_SAVED: dict[type, tuple[str, ...]] = {}  # autograd node type -> its saved values' raw accessors
_HISTORY_NODES = 8  # how far back a history is looked at: what the adjacency's own build recorded and a little more


def check_autograd_history(tensor: torch.Tensor, what: str, name: str) -> None:
    """Raises a ValueError where ``tensor`` (an adjacency's edge values or a scale computed from them)
    was computed by ops whose saved values a backward pass has freed: the next backward through
    it would fail with torch's "backward through the graph a second time" and no hint. That is an
    adjacency built once from edge weights that need a gradient and reused across steps. Reads the
    saved values' raw accessors of the last few nodes of its history (no unpack hook runs)."""
    nodes, looked = [tensor.grad_fn], 0
    while nodes and looked < _HISTORY_NODES:
        node = nodes.pop()
        if node is None:
            continue
        looked += 1
        names = _RAW_SAVED.get(type(node))
        if names is None:
            names = _RAW_SAVED[type(node)] = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
        try:
            for attr in names:
                getattr(node, attr)
        except RuntimeError:
            raise ValueError(
                f"{name}: the {what} were computed from tensors that need a gradient, and a "
                "backward pass has freed that computation, so no gradient can flow through it again (an "
                "adjacency built once from learnable weights serves one backward pass). Build the structure "
                "once without weights and give it the weights inside each step: adj = "
                "TiledAdjacency.from_edge_index(edge_index, num_nodes), then adj.with_values(edge_weight) and "
                "its .norm(...) in the step") from None
        nodes.extend(next_node for next_node, _ in node.next_functions)
